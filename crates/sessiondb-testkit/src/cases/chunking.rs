//! Messages larger than one row: split on character boundaries, byte-exact on read.

use serde_json::json;
use sessiondb::{AppendOptions, Db, FeedFilter, HistoryOptions, Message, Source, Store};

use crate::*;

const SLICE: usize = 1_572_864;

fn big(id: &str, text: String) -> Message {
    Message::text("assistant", text).with_id(id)
}

pub async fn two_mib_message_round_trips<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let body = "x".repeat(2 * 1024 * 1024);
    let stored = s
        .append(big("m", body.clone()), AppendOptions::default())
        .await
        .unwrap()
        .message;
    let read = s.message("m").await.unwrap().unwrap();
    assert_eq!(read, stored);
    assert_eq!(read.to_value()["parts"][0]["text"].as_str().unwrap(), body);
    assert!(s.row_stats(None).await.unwrap()[0].bytes > SLICE as u64);
}

pub async fn five_million_chars_and_tool_output_round_trip<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let body = "abcdefghij".repeat(500_000);
    s.append(big("t", body.clone()), AppendOptions::default())
        .await
        .unwrap();
    let tool = Message::from_value(json!({"id": "tool", "role": "assistant", "parts": [
        {"type": "tool-run", "toolCallId": "c", "input": {}, "output": "o".repeat(3_000_000)}]}))
    .unwrap();
    s.append(tool.clone(), AppendOptions::default())
        .await
        .unwrap();
    let history = s.full_history(HistoryOptions::default()).await.unwrap();
    assert_eq!(
        history[0].to_value()["parts"][0]["text"].as_str().unwrap(),
        body
    );
    assert_eq!(history[1].to_message(), tool);
}

pub async fn multibyte_text_over_the_budget_round_trips<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let body: String = "😀漢字é".repeat(200_000);
    s.append(big("u", body.clone()), AppendOptions::default())
        .await
        .unwrap();
    let read = s.message("u").await.unwrap().unwrap();
    let text = read.to_value()["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(text.chars().count(), body.chars().count());
    assert_eq!(text, body);
}

pub async fn shrinking_updates_drop_surplus_slices<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(big("m", "a".repeat(5_000_000)), AppendOptions::default())
        .await
        .unwrap();
    for size in [2_000_000, 4, 3_500_000] {
        let body = "b".repeat(size);
        s.update(big("m", body.clone()), Source::Server)
            .await
            .unwrap()
            .unwrap();
        let read = s.message("m").await.unwrap().unwrap();
        assert_eq!(read.to_value()["parts"][0]["text"].as_str().unwrap(), body);
        assert_eq!(
            s.row_stats(None).await.unwrap()[0].bytes,
            read.body().len() as u64
        );
    }
}

pub async fn unchanged_large_update_is_detected_on_the_whole_body<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let body = "z".repeat(3_000_000);
    s.append(big("m", body.clone()), AppendOptions::default())
        .await
        .unwrap();
    let mut sub = db.subscribe(FeedFilter::All);
    s.update(big("m", body.clone()), Source::Server)
        .await
        .unwrap();
    assert!(drain(&mut sub).is_empty());
    let mut changed = body;
    changed.replace_range(2_999_999.., "!");
    s.update(big("m", changed.clone()), Source::Server)
        .await
        .unwrap();
    assert_eq!(event_names(&drain(&mut sub)), ["update"]);
    let read = s.message("m").await.unwrap().unwrap();
    assert_eq!(
        read.to_value()["parts"][0]["text"].as_str().unwrap(),
        changed
    );
}

pub async fn deleting_a_chunked_message_keeps_the_others<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let first = "1".repeat(2_000_000);
    s.append(big("a", first.clone()), AppendOptions::default())
        .await
        .unwrap();
    s.append(big("b", "2".repeat(2_000_000)), AppendOptions::default())
        .await
        .unwrap();
    s.delete(&["b".into()]).await.unwrap();
    assert_eq!(history_ids(&s, None).await, ["a"]);
    let a = s.message("a").await.unwrap().unwrap();
    assert_eq!(a.to_value()["parts"][0]["text"].as_str().unwrap(), first);
}

pub async fn import_of_an_oversized_message_round_trips<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let body = "i".repeat(4_000_000);
    s.import(big("imp", body.clone()), imported(None, 7))
        .await
        .unwrap();
    let read = s.message("imp").await.unwrap().unwrap();
    assert_eq!(read.to_value()["parts"][0]["text"].as_str().unwrap(), body);
}

pub async fn recent_history_budgets_whole_chunked_rows<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    s.append(big("h1", "a".repeat(2_000_000)), AppendOptions::default())
        .await
        .unwrap();
    s.append(big("h2", "b".to_owned()), AppendOptions::default())
        .await
        .unwrap();
    let rows = s.row_stats(None).await.unwrap();
    assert!(rows[0].bytes > SLICE as u64);
    let total = rows[0].bytes + rows[1].bytes;
    let full = s.recent_history(total, None).await.unwrap();
    assert_eq!(ids(&full.messages), ["h1", "h2"]);
    let part = s.recent_history(SLICE as u64, None).await.unwrap();
    assert_eq!(ids(&part.messages), ["h2"]);
    assert!(part.truncated);
}

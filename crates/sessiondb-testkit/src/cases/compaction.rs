//! Compaction runs (plan, summarizer, iterative extension, auto-compaction) and the
//! SessionManager operations fork and split.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, Change, CompactionPhase, CompactionStatus, Db, Error, FeedFilter, FeedItem,
    HistoryOptions, Message, Options, SPLIT_PREFIX, SessionPatch, Source, Store, SummarizeError,
    Summarizer, SummaryRequest,
};

use crate::*;

/// Answers every request with a fixed text and remembers the requests.
#[derive(Debug, Default)]
pub struct FixedSummarizer {
    pub text: String,
    pub requests: std::sync::Mutex<Vec<SummaryRequest>>,
}

impl Summarizer for FixedSummarizer {
    fn summarize<'a>(
        &'a self,
        request: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>> {
        self.requests.lock().unwrap().push(request.clone());
        let text = self.text.clone();
        Box::pin(async move { Ok(text) })
    }
}

/// The same store with `summarizer` and a 1-token recent budget, so every plan keeps the
/// minimum tail of two messages.
fn compacting<S: Store>(db: &Db<S>, summarizer: Option<Arc<dyn Summarizer>>) -> Db<S> {
    let mut options = Options {
        summarizer,
        ..db.options().clone()
    };
    options.compaction.keep_recent_tokens = 1;
    db.reconfigured(options)
}

fn fixed(text: &str) -> Arc<FixedSummarizer> {
    Arc::new(FixedSummarizer {
        text: text.to_owned(),
        ..Default::default()
    })
}

fn turn_ids(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

async fn turns<S: Store>(session: &Session<S>, range: std::ops::Range<usize>) {
    let ids = turn_ids(range);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    chain(session, &ids).await;
}

fn settings(value: Value) -> SessionPatch {
    SessionPatch {
        settings: Some(value.as_object().unwrap().clone()),
        ..Default::default()
    }
}

pub async fn compact_replaces_the_middle_and_extends_iteratively<S: Store>(db: Db<S>) {
    let summarizer = fixed("first summary");
    let db = compacting(&db, Some(summarizer.clone()));
    let s = db_session(&db, "s");
    turns(&s, 0..12).await;
    let mut feed = db.subscribe(FeedFilter::All);
    let first = s.compact(None).await.unwrap().unwrap();
    assert_eq!(
        (first.from_message_id.as_str(), first.to_message_id.as_str()),
        ("m3", "m9")
    );
    assert_eq!(
        event_names(&drain(&mut feed)),
        ["status", "compact", "status"]
    );
    let history = history_ids(&s, None).await;
    let summary_id = format!("compaction_{}", first.id);
    assert_eq!(history, ["m0", "m1", "m2", &summary_id, "m10", "m11"]);
    assert!(
        summarizer.requests.lock().unwrap()[0]
            .previous_summary
            .is_none()
    );

    turns(&s, 12..20).await;
    let second = s.compact(None).await.unwrap().unwrap();
    // The overlay grows from its start; the previous summary is passed for an update.
    assert_eq!(
        (
            second.from_message_id.as_str(),
            second.to_message_id.as_str()
        ),
        ("m3", "m17")
    );
    let update = summarizer.requests.lock().unwrap()[1].clone();
    assert_eq!(update.previous_summary.as_deref(), Some("first summary"));
    let middle: Vec<&str> = update
        .messages
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(middle, turn_ids(10..18));
    let history = history_ids(&s, None).await;
    assert_eq!(
        history,
        [
            "m0",
            "m1",
            "m2",
            &format!("compaction_{}", second.id),
            "m18",
            "m19"
        ]
    );
    // Nothing was deleted: every original message is still readable by id.
    for id in turn_ids(0..20) {
        assert!(s.message(&id).await.unwrap().is_some(), "{id}");
    }
    assert_eq!(s.compactions().await.unwrap().len(), 2);
    assert_eq!(s.stats().await.unwrap().message_count, 20);
}

pub async fn compaction_is_branch_local<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("summary")));
    let s = db_session(&db, "s");
    turns(&s, 0..10).await;
    // A sibling branch off m1: b2..b9.
    s.append(text("b2", "user", "branch"), under("m1"))
        .await
        .unwrap();
    chain(&s, &["b3", "b4", "b5", "b6", "b7", "b8", "b9"]).await;
    let on_branch = s.compact(None).await.unwrap().unwrap();
    assert_eq!(on_branch.from_message_id, "b3");
    // The main line compacts on its own: the branch's overlay is not visible there.
    let main = s.compact(Some("m9")).await.unwrap().unwrap();
    assert_eq!(main.from_message_id, "m3");
    let main_history = history_ids(&s, Some("m9")).await;
    assert_eq!(main_history[3], format!("compaction_{}", main.id));
    let branch_history = history_ids(&s, Some("b9")).await;
    assert_eq!(branch_history[..3], ["m0", "m1", "b2"]);
    assert_eq!(branch_history[3], format!("compaction_{}", on_branch.id));
}

pub async fn compact_reports_nothing_to_do_blank_summaries_and_no_summarizer<S: Store>(db: Db<S>) {
    let s = db_session(&compacting(&db, Some(fixed("x"))), "short");
    turns(&s, 0..5).await;
    assert!(s.compact(None).await.unwrap().is_none(), "too short");

    let blank = db_session(&compacting(&db, Some(fixed(" \n\t "))), "blank");
    turns(&blank, 0..12).await;
    assert!(blank.compact(None).await.unwrap().is_none());
    assert!(blank.compactions().await.unwrap().is_empty());

    let none = db_session(&compacting(&db, None), "none");
    turns(&none, 0..12).await;
    assert!(matches!(none.compact(None).await, Err(Error::NoSummarizer)));
    assert!(none.compactions().await.unwrap().is_empty());

    // The default summarizer needs no model.
    let default = db_session(&compacting(&db, db.options().summarizer.clone()), "default");
    turns(&default, 0..12).await;
    let compaction = default.compact(None).await.unwrap().unwrap();
    assert!(
        compaction.summary.starts_with("## Topic\n"),
        "{}",
        compaction.summary
    );
}

/// Calls and results in both stored shapes stay together on each side of the span.
pub async fn compaction_never_separates_a_tool_call_from_its_result<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("summary")));
    let s = db_session(&db, "s");
    let messages = vec![
        json!({"id": "u0", "role": "user", "content": "weather?"}),
        json!({"id": "a1", "role": "assistant", "content": "checking"}),
        json!({"id": "c2", "role": "assistant", "content": "", "tool_calls": [
            {"id": "t2", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}),
        json!({"id": "r3", "role": "tool", "tool_call_id": "t2", "content": "sunny"}),
        json!({"id": "u4", "role": "user", "content": "and tomorrow?"}),
        json!({"id": "a5", "role": "assistant", "parts": [
            {"type": "tool-forecast", "toolCallId": "t5", "state": "output-available", "input": {}, "output": "rain"}]}),
        json!({"id": "c6", "role": "assistant", "content": "", "tool_calls": [
            {"id": "t6", "type": "function", "function": {"name": "alerts", "arguments": "{}"}}]}),
        json!({"id": "r7", "role": "tool", "tool_call_id": "t6", "content": "none"}),
    ];
    for m in messages {
        s.append(Message::from_value(m).unwrap(), AppendOptions::default())
            .await
            .unwrap();
    }
    let compaction = s.compact(None).await.unwrap().unwrap();
    // The head ends after c2, so its result r3 comes along; the tail keeps r7 with c6.
    assert_eq!(
        (
            compaction.from_message_id.as_str(),
            compaction.to_message_id.as_str()
        ),
        ("u4", "a5")
    );
}

pub async fn auto_compaction_fires_only_above_the_threshold<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("auto summary")));
    let s = db_session(&db, "s");
    let mut feed = db.subscribe(FeedFilter::All);
    turns(&s, 0..12).await;
    assert!(
        s.compactions().await.unwrap().is_empty(),
        "no threshold, no compaction"
    );

    let threshold = s.stats().await.unwrap().token_estimate + 100;
    s.patch(settings(json!({"compactAfter": threshold})))
        .await
        .unwrap();
    s.append(text("small", "user", "short"), AppendOptions::default())
        .await
        .unwrap();
    assert!(
        s.compactions().await.unwrap().is_empty(),
        "below the threshold"
    );
    drain(&mut feed);

    // About 120 tokens: over the threshold in total, not alone.
    let big = "word ".repeat(92);
    s.append(text("big", "user", &big), AppendOptions::default())
        .await
        .unwrap();
    let compactions = s.compactions().await.unwrap();
    assert_eq!(compactions.len(), 1, "above the threshold: once");
    assert_eq!(
        event_names(&drain(&mut feed)),
        ["append", "status", "compact", "status"]
    );
    let history = history_ids(&s, None).await;
    assert_eq!(history[3], format!("compaction_{}", compactions[0].id));
    assert_eq!(history[4..], ["small", "big"]);
    let info = s.info().await.unwrap().unwrap();
    assert!(info.stats.token_estimate <= threshold, "{info:?}");

    // Under the threshold again: the next append compacts nothing.
    s.append(text("after", "user", "fine"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(s.compactions().await.unwrap().len(), 1);

    // Without a summarizer the threshold is inert (and nothing fails).
    let plain = compacting(&db, None);
    let p = db_session(&plain, "plain");
    turns(&p, 0..8).await;
    p.patch(settings(json!({"compactAfter": 1}))).await.unwrap();
    p.append(text("x", "user", &big), AppendOptions::default())
        .await
        .unwrap();
    assert!(p.compactions().await.unwrap().is_empty());
    assert_eq!(plain.compaction_failures(), 0);
}

/// The estimate follows updates of counted rows and is re-derived for a new branch.
pub async fn auto_compaction_estimate_tracks_updates_and_branches<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("summary")));
    let s = db_session(&db, "s");
    turns(&s, 0..12).await;
    s.compact(None).await.unwrap().unwrap();
    let overlaid = s.info().await.unwrap().unwrap().stats.token_estimate;
    s.patch(settings(json!({"compactAfter": overlaid + 60})))
        .await
        .unwrap();
    s.append(text("m12", "user", "next"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(s.compactions().await.unwrap().len(), 1);

    // A branch off m1 is short: no compaction there, though the main line is long.
    s.append(text("b2", "user", "branch"), under("m1"))
        .await
        .unwrap();
    assert_eq!(s.compactions().await.unwrap().len(), 1);

    // Back on the main line, a grown row (kept in the tail) pushes the next append over.
    s.append(text("m13", "user", "more"), under("m12"))
        .await
        .unwrap();
    s.update(
        text("m12", "user", &"grown ".repeat(80)),
        Default::default(),
    )
    .await
    .unwrap();
    s.append(text("m14", "user", "over"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(s.compactions().await.unwrap().len(), 2);
}

pub async fn fork_copies_the_path_with_fresh_ids<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    turns(&s, 0..5).await;
    s.patch(SessionPatch {
        model: Some("m-1".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    s.append(text("x3", "user", "side"), under("m2"))
        .await
        .unwrap();
    s.add_compaction("sum".into(), "m0".into(), "m1".into())
        .await
        .unwrap();
    let mut feed = db.subscribe(FeedFilter::All);
    // Timestamps are milliseconds: the fork must come at a later one to be listed as newer.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let fork = s
        .fork("m3", Some("copy".into()), Some("forked".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fork.id, "copy");
    assert_eq!(fork.record.parent_session_id.as_deref(), Some("s"));
    assert_eq!(fork.record.name.as_deref(), Some("forked"));
    assert_eq!(fork.record.model.as_deref(), Some("m-1"));
    assert_eq!(fork.stats.message_count, 4);
    let copy = db_session(&db, "copy");
    let copied = copy.full_history(Default::default()).await.unwrap();
    let texts: Vec<String> = copied
        .iter()
        .map(|m| {
            m.to_value()["parts"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        texts,
        ["message m0", "message m1", "message m2", "message m3"]
    );
    assert!(copied.iter().all(|m| m.id.starts_with("msg_")), "fresh ids");
    assert!(
        copy.compactions().await.unwrap().is_empty(),
        "overlays are not copied"
    );
    assert!(copied[0].parent_id.is_none());
    // One atomic write: the events all come after the fork is readable.
    assert!(
        event_names(&drain(&mut feed))
            .iter()
            .all(|e| *e == "append" || *e == "session")
    );

    assert!(s.fork("nope", None, None).await.unwrap().is_none());
    assert!(matches!(
        s.fork("m3", Some("copy".into()), None).await,
        Err(Error::SessionExists { .. })
    ));
    // Listed first by updatedAt.
    let newest_first = sessiondb::SessionListing {
        page: sessiondb::PageRequest {
            descending: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let listed = db.list_sessions("", &newest_first).await.unwrap().items;
    assert_eq!(listed[0].id, "copy");
}

pub async fn split_ends_the_session_and_continues_from_the_summary<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    turns(&s, 0..4).await;
    s.patch(SessionPatch {
        name: Some("support".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let next = s.split("We fixed the login.", None).await.unwrap().unwrap();
    assert_ne!(next.id, "s");
    assert_eq!(next.record.parent_session_id.as_deref(), Some("s"));
    assert_eq!(next.record.name.as_deref(), Some("support"));
    assert_eq!(next.stats.message_count, 1);
    let opening = db_session(&db, &next.id)
        .full_history(Default::default())
        .await
        .unwrap();
    assert_eq!(opening[0].role, "assistant");
    assert_eq!(
        opening[0].to_value()["parts"][0]["text"],
        format!("{SPLIT_PREFIX}We fixed the login.")
    );
    let old = s.info().await.unwrap().unwrap();
    assert_eq!(old.record.end_reason.as_deref(), Some("compaction"));
    assert_eq!(
        old.stats.message_count, 4,
        "the old session keeps its messages"
    );
    assert!(
        db_session(&db, "missing")
            .split("x", None)
            .await
            .unwrap()
            .is_none()
    );
}

fn statuses(items: &[FeedItem]) -> Vec<CompactionStatus> {
    items
        .iter()
        .filter_map(|item| match item {
            FeedItem::Event(e) => match &e.change {
                Change::Status { status } => Some(*status),
                _ => None,
            },
            FeedItem::Lagged { .. } => None,
        })
        .collect()
}

/// The reference's check 103: a run that asks the summarizer is announced as `compacting` with
/// the session's estimate, and ends `idle` with the estimate after it and, when a summary was
/// stored, the estimate before it; the threshold is the session's `compactAfter`. A run that
/// fails or stores nothing still ends `idle`; one with nothing to summarise announces nothing.
pub async fn compaction_runs_announce_their_status<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("the summary")));
    let s = db_session(&db, "s");
    turns(&s, 0..12).await;
    let before: u64 = s
        .full_history(HistoryOptions::default())
        .await
        .unwrap()
        .iter()
        .map(|m| m.token_estimate)
        .sum();
    assert!(before > 0);
    let mut feed = db.subscribe(FeedFilter::All);
    s.compact(None).await.unwrap().unwrap();
    let items = drain(&mut feed);
    assert_eq!(event_names(&items), ["status", "compact", "status"]);
    let [started, idle] = statuses(&items)[..] else {
        panic!("two statuses: {items:?}")
    };
    assert_eq!(started.phase, CompactionPhase::Compacting);
    assert_eq!(started.token_threshold, None);
    assert_eq!(started.compacted_tokens_before, None);
    assert_eq!(started.token_estimate, before);
    assert_eq!(idle.phase, CompactionPhase::Idle);
    assert_eq!(idle.compacted_tokens_before, Some(before));
    let after = s.info().await.unwrap().unwrap().stats.token_estimate;
    assert!(after < before, "{after} < {before}");
    assert_eq!(idle.token_estimate, after);

    // Auto-compaction: the same pair, with the threshold.
    let t = db_session(&db, "t");
    turns(&t, 0..12).await;
    let threshold = t.stats().await.unwrap().token_estimate;
    t.patch(settings(json!({ "compactAfter": threshold })))
        .await
        .unwrap();
    drain(&mut feed);
    t.append(text("m12", "user", "over it"), AppendOptions::default())
        .await
        .unwrap();
    let items = drain(&mut feed);
    assert_eq!(
        event_names(&items),
        ["append", "status", "compact", "status"]
    );
    let announced = statuses(&items);
    assert!(
        announced
            .iter()
            .all(|s| s.token_threshold == Some(threshold))
    );
    assert!(announced[0].token_estimate > threshold);
    assert_eq!(
        announced[1].compacted_tokens_before,
        Some(announced[0].token_estimate)
    );
    assert!(announced[1].token_estimate <= threshold);

    // A blank summary stores nothing and a failing summarizer fails the call: both end idle
    // without `compacted`.
    for (summarizer, fails) in [
        (fixed("  ") as Arc<dyn Summarizer>, false),
        (Arc::new(Unreachable), true),
    ] {
        let db = compacting(&db, Some(summarizer));
        let u = db_session(&db, if fails { "failing" } else { "blank" });
        turns(&u, 0..12).await;
        let mut feed = db.subscribe(FeedFilter::All);
        assert_eq!(u.compact(None).await.is_err(), fails);
        let items = drain(&mut feed);
        assert_eq!(event_names(&items), ["status", "status"]);
        let announced = statuses(&items);
        assert_eq!(announced[1].phase, CompactionPhase::Idle);
        assert_eq!(announced[1].compacted_tokens_before, None);
        assert_eq!(announced[1].token_estimate, announced[0].token_estimate);
    }

    // Nothing to summarise: no run, no status.
    let short = db_session(&db, "short");
    turns(&short, 0..2).await;
    drain(&mut feed);
    assert!(short.compact(None).await.unwrap().is_none());
    assert!(event_names(&drain(&mut feed)).is_empty());
}

/// A summarizer whose model cannot be reached.
#[derive(Debug)]
struct Unreachable;

impl Summarizer for Unreachable {
    fn summarize<'a>(
        &'a self,
        _: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>> {
        Box::pin(async { Err(SummarizeError::Transport("unreachable".into())) })
    }
}

/// A failed auto-compaction publishes an `error` event and is counted; the append stands.
pub async fn failed_auto_compaction_is_reported_not_raised<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(Arc::new(Unreachable)));
    let s = db_session(&db, "s");
    turns(&s, 0..10).await;
    s.patch(settings(json!({"compactAfter": 10})))
        .await
        .unwrap();
    let mut feed = db.subscribe(FeedFilter::All);
    let result = s
        .append(text("m10", "user", "one more"), AppendOptions::default())
        .await
        .unwrap();
    assert!(result.inserted);
    assert_eq!(db.compaction_failures(), 1);
    let errors: Vec<String> = drain(&mut feed)
        .into_iter()
        .filter_map(|item| match item {
            FeedItem::Event(e) => match &e.change {
                Change::Error { message } => Some(message.clone()),
                _ => None,
            },
            FeedItem::Lagged { .. } => None,
        })
        .collect();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("unreachable"));
    assert_eq!(s.stats().await.unwrap().message_count, 11);
}

/// Reference check 24: the estimate is judged on the capped path (10,001 rows), so a
/// threshold of 10,001 rows' worth is never exceeded however many rows follow.
pub async fn auto_compaction_estimate_is_capped_with_the_path<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    fill_range(&s, 0..10_000, 1).await;
    let per_row = s.message("m0").await.unwrap().unwrap().token_estimate;
    s.patch(settings(json!({"compactAfter": per_row * 10_001})))
        .await
        .unwrap();
    fill_range(&s, 10_000..10_003, 1).await;
    for i in 10_003..10_006 {
        s.append(
            Message::text("user", format!("{i:05} x")),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    }
    assert!(s.compactions().await.unwrap().is_empty());
    assert_eq!(s.stats().await.unwrap().token_estimate, per_row * 10_001);
}

/// Reference check 16: a hidden echo of the session's own summary counts towards the path cap
/// but not towards the estimate, so 9,999 rows + the hidden row + 1 stay at 10,000 rows' worth.
pub async fn hidden_rows_count_for_the_cap_not_the_estimate<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    fill_range(&s, 0..9_999, 1).await;
    // An overlay whose ends are nowhere: it never applies, but its echo is hidden.
    let c = s
        .add_compaction("elsewhere".into(), "nowhere-a".into(), "nowhere-b".into())
        .await
        .unwrap();
    let echo = Message::text("user", "99999 x").with_id(format!("compaction_{}", c.id));
    s.import(echo, imported(Some("m9998"), 1)).await.unwrap();
    fill_range(&s, 10_000..10_001, 1).await;
    let per_row = s.message("m0").await.unwrap().unwrap().token_estimate;
    s.patch(settings(json!({"compactAfter": per_row * 10_000})))
        .await
        .unwrap();
    fill_range(&s, 10_001..10_002, 1).await;
    fill_range(&s, 10_002..10_003, 1).await;
    assert_eq!(s.compactions().await.unwrap().len(), 1, "no compaction ran");
    assert_eq!(s.row_stats(None).await.unwrap().len(), 10_000);
}

/// The overlaid token estimate (`info`) and recent history (its total and the suffix that fits)
/// agree with the path a read shows, as interior updates, deletes, branches and further
/// compactions change the rows under the overlays.
pub async fn overlaid_sizes_follow_the_shown_path<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    for i in 0..30 {
        let body = "word ".repeat(1 + i % 7);
        s.append(
            text(&format!("m{i}"), "user", &body),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    }
    s.add_compaction("summary of the start".into(), "m2".into(), "m9".into())
        .await
        .unwrap();
    sizes_agree(&s, None).await;
    s.update(text("m15", "user", &"grown ".repeat(40)), Source::Server)
        .await
        .unwrap();
    sizes_agree(&s, None).await;
    s.delete(&["m20".into()]).await.unwrap();
    sizes_agree(&s, None).await;
    s.append(text("b1", "user", "a branch"), under("m25"))
        .await
        .unwrap();
    sizes_agree(&s, None).await;
    sizes_agree(&s, Some("m29")).await;
    s.add_compaction("summary of the middle".into(), "m12".into(), "m18".into())
        .await
        .unwrap();
    s.update(
        text("m5", "user", "under the first summary"),
        Source::Server,
    )
    .await
    .unwrap();
    sizes_agree(&s, None).await;
    sizes_agree(&s, Some("m29")).await;
}

/// Checks `info` (active path only) and `recent_history` at several budgets against the
/// messages `full_history` shows for `leaf`.
async fn sizes_agree<S: Store>(s: &Session<S>, leaf: Option<&str>) {
    let options = HistoryOptions {
        leaf: leaf.map(str::to_owned),
        newest_first: false,
    };
    let shown = s.full_history(options).await.unwrap();
    if leaf.is_none() {
        let tokens: u64 = shown.iter().map(|m| m.token_estimate).sum();
        let info = s.info().await.unwrap().unwrap();
        assert_eq!(info.stats.token_estimate, tokens, "overlaid estimate");
    }
    let total: u64 = shown.iter().map(|m| m.bytes).sum();
    let last_bytes = shown.last().unwrap().bytes;
    for budget in [
        0,
        1,
        last_bytes,
        500,
        total / 3,
        total / 2,
        total - 1,
        total,
        u64::MAX,
    ] {
        let (mut used, mut fitting) = (0u64, 0usize);
        for m in shown.iter().rev() {
            if fitting > 0 && used + m.bytes > budget {
                break;
            }
            used += m.bytes;
            fitting += 1;
        }
        let recent = s.recent_history(budget, leaf).await.unwrap();
        assert_eq!(
            ids(&recent.messages),
            ids(&shown[shown.len() - fitting..]),
            "budget {budget}, leaf {leaf:?}"
        );
        assert_eq!(recent.total_bytes, total, "budget {budget}, leaf {leaf:?}");
        assert_eq!(recent.truncated, fitting < shown.len(), "budget {budget}");
    }
}

pub async fn the_frozen_prompt_counts_towards_auto_compaction<S: Store>(db: Db<S>) {
    let db = compacting(&db, Some(fixed("auto summary")));
    let long = "word ".repeat(40);
    let mut sessions = Vec::new();
    for name in ["frozen", "unfrozen"] {
        let s = db_session(&db, name);
        for i in 0..12 {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            s.append(
                text(&format!("m{i}"), role, &long),
                AppendOptions::default(),
            )
            .await
            .unwrap();
        }
        // About 200 tokens of readonly text: over the margin left below the threshold, and
        // well under the threshold itself.
        let brief = sessiondb::BlockSpec {
            kind: sessiondb::BlockKind::Readonly,
            description: None,
            max_tokens: None,
            content: "word ".repeat(150),
        };
        s.context().define("brief", brief).await.unwrap();
        let threshold = s.stats().await.unwrap().token_estimate + 100;
        s.patch(settings(json!({"compactAfter": threshold})))
            .await
            .unwrap();
        sessions.push(s);
    }
    let [frozen, unfrozen] = &sessions[..] else {
        unreachable!()
    };
    frozen.context().prompt().await.unwrap();
    for s in [frozen, unfrozen] {
        s.append(text("q", "user", "short"), AppendOptions::default())
            .await
            .unwrap();
    }
    // The frozen prompt goes to the model with the history, so it counts; a session that never
    // froze one has sent none, and the check freezes nothing.
    assert_eq!(frozen.compactions().await.unwrap().len(), 1);
    assert!(unfrozen.compactions().await.unwrap().is_empty());
    assert!(db.store().prompt(unfrozen.key()).await.unwrap().is_none());
    // The run kept few enough recent messages that history and prompt are back under the
    // threshold: the next append compacts nothing.
    frozen
        .append(text("r", "user", "fine"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(frozen.compactions().await.unwrap().len(), 1);

    // A prompt that alone reaches the threshold cannot be compacted away: no run at all.
    frozen
        .patch(settings(json!({"compactAfter": 10})))
        .await
        .unwrap();
    frozen
        .append(text("s", "user", "more"), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(frozen.compactions().await.unwrap().len(), 1);
    assert_eq!(db.compaction_failures(), 0);
}

//! Attachments: media leaves the message row, is stored once per namespace, comes back
//! byte-exact on every read path, and goes when its last reference goes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::TryStreamExt;
use serde_json::{Value, json};
use sessiondb::{
    AppendOptions, Db, FeedFilter, HistoryOptions, Message, PageRequest, Session, Source, Store,
    StoredMessage,
};

use crate::*;

/// `len` bytes that do not compress into a pattern base64 would hide.
pub fn bytes(len: usize, seed: u8) -> Vec<u8> {
    let mut state = u32::from(seed).wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

fn data_url(media_type: &str, payload: &[u8]) -> String {
    format!("data:{media_type};base64,{}", STANDARD.encode(payload))
}

fn image_message(id: &str, payload: &[u8]) -> Message {
    Message::from_value(json!({"id": id, "role": "user", "parts": [
        {"type": "text", "text": format!("picture {id}")},
        {"type": "file", "mediaType": "image/png", "url": data_url("image/png", payload)}
    ]}))
    .unwrap()
}

fn hash_of(payload: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How many payloads the namespace holds among these.
async fn held<S: Store>(db: &Db<S>, payloads: &[&[u8]]) -> usize {
    let hashes: Vec<String> = payloads.iter().map(|p| hash_of(p)).collect();
    db.store()
        .attachment_sizes("", &hashes)
        .await
        .unwrap()
        .len()
}

async fn pointer_json<S: Store>(session: &Session<S>, id: &str) -> String {
    session
        .with_attachment_pointers()
        .message(id)
        .await
        .unwrap()
        .unwrap()
        .json()
        .to_owned()
}

/// The message as a client wrote it: its JSON without the store's timestamps.
fn body(message: &StoredMessage) -> Value {
    let mut value = message.to_value();
    let fields = value.as_object_mut().unwrap();
    fields.remove("createdAt");
    fields.remove("updatedAt");
    value
}

/// Every read path returns `expected` for message `id` (the only message, or the leaf).
async fn every_read_returns<S: Store>(session: &Session<S>, id: &str, expected: &Value) {
    let single = session.message(id).await.unwrap().unwrap();
    assert_eq!(&body(&single), expected, "message");
    let forward = session
        .full_history(HistoryOptions::default())
        .await
        .unwrap();
    let found = forward.iter().find(|m| m.id == id).unwrap();
    assert_eq!(&body(found), expected, "history");
    let newest = first(
        session,
        HistoryOptions {
            newest_first: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(&body(&newest), expected, "newest first");
    let recent = session.recent_history(u64::MAX, None).await.unwrap();
    assert_eq!(&body(recent.messages.last().unwrap()), expected, "recent");
    let page = session
        .list_messages(&PageRequest {
            limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    let listed = page.items.iter().find(|m| m.id == id).unwrap();
    assert_eq!(&body(listed), expected, "list");
    let leaf = session.latest_leaf().await.unwrap().unwrap();
    assert_eq!(&body(&leaf), expected, "latest leaf");
    let exported: Vec<String> = session.export().try_collect().await.unwrap();
    let line = exported
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["message"]["id"] == id)
        .unwrap();
    let mut exported_message = line["message"].clone();
    let fields = exported_message.as_object_mut().unwrap();
    fields.remove("createdAt");
    fields.remove("updatedAt");
    assert_eq!(&exported_message, expected, "export");
}

/// Reference checks 56 and 62: a 300,000-byte PNG leaves a row under 1,000 bytes, one stored
/// payload, and reads back equal on every path; its row stat charges it at base64 size.
pub async fn images_leave_the_row_and_come_back_exactly<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let png = bytes(300_000, 1);
    let message = image_message("img", &png);
    let expected = message.clone().into_value();
    s.append(message, AppendOptions::default()).await.unwrap();
    let stored = pointer_json(&s, "img").await;
    assert!(stored.len() < 1_000, "{} bytes: {stored}", stored.len());
    assert!(stored.contains(&format!("attachment:sha256:{}", hash_of(&png))));
    assert_eq!(held(&db, &[&png]).await, 1);
    every_read_returns(&s, "img", &expected).await;
    let row = &s.row_stats(None).await.unwrap()[0];
    assert!(row.bytes > 400_000, "charged at base64 size: {}", row.bytes);
    assert!(
        row.token_estimate >= 1_600 && row.token_estimate < 1_700,
        "{}",
        row.token_estimate
    );

    let big = db_session(&db, "big");
    big.append(
        image_message("x", &bytes(600_000, 2)),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    assert!(big.row_stats(None).await.unwrap()[0].bytes > 700_000);
}

/// Reference checks 57 and 58: text of any size, and `text/*` data URLs, stay inline.
pub async fn text_is_never_extracted<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let long = "lorem ipsum ".repeat(200_000);
    s.append(text("long", "user", &long), AppendOptions::default())
        .await
        .unwrap();
    let csv = data_url("text/plain", &vec![b'a'; 40_000]);
    let inline = Message::from_value(json!({"id": "csv", "role": "user", "parts": [
        {"type": "file", "mediaType": "text/plain", "url": csv}]}))
    .unwrap();
    s.append(inline, AppendOptions::default()).await.unwrap();
    for id in ["long", "csv"] {
        assert!(
            !pointer_json(&s, id).await.contains("attachment:sha256:"),
            "{id}"
        );
    }
    let long_back = s.message("long").await.unwrap().unwrap();
    assert_eq!(long_back.to_value()["parts"][0]["text"], long);
}

/// Reference checks 59 and 67: one payload for two messages; it goes with its last reference.
pub async fn shared_payloads_are_stored_once_and_collected_at_the_last_reference<S: Store>(
    db: Db<S>,
) {
    let s = db_session(&db, "s");
    let other = db_session(&db, "other");
    let png = bytes(50_000, 3);
    s.append(image_message("a", &png), AppendOptions::default())
        .await
        .unwrap();
    other
        .append(image_message("b", &png), AppendOptions::default())
        .await
        .unwrap();
    assert_eq!(held(&db, &[&png]).await, 1);
    assert_eq!(s.delete(&["a".into()]).await.unwrap(), 1);
    assert_eq!(
        held(&db, &[&png]).await,
        1,
        "still referenced from another session"
    );
    let back = other.message("b").await.unwrap().unwrap();
    assert_eq!(
        back.to_value()["parts"][1]["url"],
        data_url("image/png", &png)
    );
    assert_eq!(other.delete(&["b".into()]).await.unwrap(), 1);
    assert_eq!(held(&db, &[&png]).await, 0, "gone with the last reference");
}

/// Reference check 60: a payload over one storage chunk splits and reassembles.
pub async fn payloads_larger_than_a_chunk_round_trip<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let payload = bytes(1_572_864 + 500_000, 4);
    let message = image_message("big", &payload);
    let expected = message.clone().into_value();
    s.append(message, AppendOptions::default()).await.unwrap();
    assert!(pointer_json(&s, "big").await.len() < 1_000);
    every_read_returns(&s, "big", &expected).await;
}

/// Reference checks 61 and 65: media nested in tool output comes back as bare base64, and a
/// pointer nested deeper keeps its own payload alive.
pub async fn nested_media_is_extracted_and_restored<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let pdf = bytes(200_000, 5);
    let message = Message::from_value(json!({"id": "tool", "role": "assistant", "parts": [
        {"type": "tool-scan", "toolCallId": "t1", "state": "output-available", "input": {},
         "output": {"type": "content", "value": [
            {"type": "text", "text": "scanned"},
            {"type": "media", "mediaType": "application/pdf", "data": STANDARD.encode(&pdf)}]}}]}))
    .unwrap();
    let expected = message.clone().into_value();
    s.append(message, AppendOptions::default()).await.unwrap();
    let stored = pointer_json(&s, "tool").await;
    assert!(stored.len() < 1_000, "{stored}");
    every_read_returns(&s, "tool", &expected).await;

    // A pointer three levels inside another part holds its own reference.
    let pointer = format!("attachment:sha256:{}", hash_of(&pdf));
    let nested = Message::from_value(json!({"id": "nested", "role": "user", "parts": [
        {"type": "data-archive", "data": {"inner": {"files": [
            {"mediaType": "application/pdf", "data": pointer}]}}}]}))
    .unwrap();
    s.append(nested, AppendOptions::default()).await.unwrap();
    s.delete(&["tool".into()]).await.unwrap();
    assert_eq!(held(&db, &[&pdf]).await, 1, "the nested pointer keeps it");
    let back = s.message("nested").await.unwrap().unwrap();
    assert_eq!(
        back.to_value()["parts"][0]["data"]["inner"]["files"][0]["data"],
        STANDARD.encode(&pdf)
    );
}

/// Reference check 63: eight 400,000-byte images under a 1,500,000-byte budget.
pub async fn recent_windows_charge_media_at_base64_size<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    for i in 0..8 {
        s.append(
            image_message(&format!("i{i}"), &bytes(400_000, 10 + i as u8)),
            AppendOptions::default(),
        )
        .await
        .unwrap();
    }
    let recent = s.recent_history(1_500_000, None).await.unwrap();
    assert!(recent.messages.len() <= 3, "{}", recent.messages.len());
    assert!(recent.truncated);
    let hydrated: usize = recent.messages.iter().map(|m| m.json().len()).sum();
    assert!(hydrated < 1_650_000, "{hydrated}");
    assert!(recent.total_bytes > 8 * 500_000);
}

/// Reference check 64: writing the pointer form back keeps the reference and the bytes; a
/// pointer-form copy under a new id takes its own reference.
pub async fn pointer_form_writes_keep_their_references<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let png = bytes(30_000, 6);
    s.append(image_message("orig", &png), AppendOptions::default())
        .await
        .unwrap();
    let mut pointer_form: Value = serde_json::from_str(&pointer_json(&s, "orig").await).unwrap();
    pointer_form["parts"][0]["text"] = json!("edited caption");
    s.update(
        Message::from_value(pointer_form.clone()).unwrap(),
        Source::Server,
    )
    .await
    .unwrap()
    .unwrap();
    let edited = s.message("orig").await.unwrap().unwrap();
    assert_eq!(edited.to_value()["parts"][0]["text"], "edited caption");
    assert_eq!(
        edited.to_value()["parts"][1]["url"],
        data_url("image/png", &png)
    );

    pointer_form["id"] = json!("copy");
    s.append(
        Message::from_value(pointer_form).unwrap(),
        AppendOptions::default(),
    )
    .await
    .unwrap();
    let copy_row = s
        .row_stats(None)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.id == "copy")
        .unwrap();
    assert!(copy_row.bytes > 40_000, "the copy is charged for its media");
    s.delete(&["orig".into()]).await.unwrap();
    assert_eq!(held(&db, &[&png]).await, 1);
    let copy = s.message("copy").await.unwrap().unwrap();
    assert_eq!(
        copy.to_value()["parts"][1]["url"],
        data_url("image/png", &png)
    );

    // A fork copies the pointer and takes its own reference: the media outlives the original.
    let fork = s
        .fork("copy", Some("fork".into()), None)
        .await
        .unwrap()
        .unwrap();
    s.delete_session().await.unwrap();
    assert_eq!(held(&db, &[&png]).await, 1);
    let forked = db_session(&db, &fork.id)
        .full_history(HistoryOptions::default())
        .await
        .unwrap();
    let last = forked.last().unwrap().to_value();
    assert!(last["parts"][1]["url"] == data_url("image/png", &png));
    db_session(&db, &fork.id).delete_session().await.unwrap();
    assert_eq!(held(&db, &[&png]).await, 0);
}

/// Reference checks 66, 68, 69 and 70.
pub async fn updates_clears_and_deletes_manage_payloads<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let png = bytes(20_000, 7);
    // Updating a message that does not exist stores no payload.
    assert!(
        s.update(image_message("ghost", &png), Source::Server)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(held(&db, &[&png]).await, 0);

    s.append(image_message("m", &png), AppendOptions::default())
        .await
        .unwrap();
    // Re-sending the identical image is an unchanged update: no event, one payload.
    let mut feed = db.subscribe(FeedFilter::All);
    s.update(image_message("m", &png), Source::Server)
        .await
        .unwrap()
        .unwrap();
    assert!(event_names(&drain(&mut feed)).is_empty());
    assert_eq!(held(&db, &[&png]).await, 1);
    // An update that drops the file part drops the payload.
    s.update(text("m", "user", "no picture"), Source::Server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held(&db, &[&png]).await, 0);

    // Clearing a session, or deleting it, removes its payloads.
    let (p1, p2) = (bytes(10_000, 8), bytes(10_000, 9));
    s.append(image_message("p1", &p1), AppendOptions::default())
        .await
        .unwrap();
    s.clear().await.unwrap();
    assert_eq!(held(&db, &[&p1]).await, 0);
    let t = db_session(&db, "t");
    t.append(image_message("p2", &p2), AppendOptions::default())
        .await
        .unwrap();
    t.delete_session().await.unwrap();
    assert_eq!(held(&db, &[&p2]).await, 0);
}

/// Broken base64 and lying headers are ordinary inline text; deep nesting is left alone;
/// a pointer the store does not hold reads back as it is.
pub async fn malformed_media_stays_inline_and_nothing_breaks<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let broken = Message::from_value(json!({"id": "broken", "role": "user", "parts": [
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,@@not base64@@"},
        {"type": "file", "url": "data:image/png;base64,abcde"},
        {"type": "file", "mediaType": "text/html", "url": "data:image/png;base64,aGk="},
        // Not a media type (and a NUL that PostgreSQL's text could not store).
        {"type": "file", "mediaType": "image/png\u{0}", "url": "data:image/png;base64,aGk="},
        {"type": "file", "url": "data:image/p\u{0}ng;base64,aGk="},
        {"type": "media", "mediaType": "image/\u{1}png", "data": "aGk="}]}))
    .unwrap();
    let expected = broken.clone().into_value();
    s.append(broken, AppendOptions::default()).await.unwrap();
    assert!(
        !pointer_json(&s, "broken")
            .await
            .contains("attachment:sha256:")
    );
    assert_eq!(body(&s.message("broken").await.unwrap().unwrap()), expected);

    let mut deep =
        json!({"type": "media", "mediaType": "image/png", "data": STANDARD.encode(b"deep")});
    for _ in 0..100 {
        deep = json!({"nest": deep});
    }
    let deep = Message::from_value(
        json!({"id": "deep", "role": "user", "parts": [{"type": "data-x", "data": deep}]}),
    )
    .unwrap();
    s.append(deep, AppendOptions::default()).await.unwrap();
    assert!(
        !pointer_json(&s, "deep")
            .await
            .contains("attachment:sha256:")
    );

    let dangling = format!("attachment:sha256:{}", "0".repeat(64));
    let orphan = Message::from_value(json!({"id": "orphan", "role": "user", "parts": [
        {"type": "file", "mediaType": "image/png", "url": dangling}]}))
    .unwrap();
    s.append(orphan, AppendOptions::default()).await.unwrap();
    let back = s.message("orphan").await.unwrap().unwrap();
    assert_eq!(back.to_value()["parts"][0]["url"], dangling);
}

/// Where a generated payload sits in its message.
#[derive(Debug, Clone, Copy)]
enum Placement {
    FilePart,
    ToolMedia,
    ContentImageUrl,
}

/// How a generated message is written.
#[derive(Debug, Clone, Copy)]
enum WritePath {
    Append,
    Update,
    Import,
}

fn generated(id: &str, payload: &[u8], media_type: &str, placement: Placement) -> Value {
    match placement {
        Placement::FilePart => json!({"id": id, "role": "user", "parts": [
            {"type": "file", "mediaType": media_type, "url": data_url(media_type, payload)}]}),
        Placement::ToolMedia => json!({"id": id, "role": "assistant", "parts": [
            {"type": "tool-fetch", "toolCallId": "t", "state": "output-available", "input": {},
             "output": [{"type": "media", "mediaType": media_type, "data": STANDARD.encode(payload)}]}]}),
        Placement::ContentImageUrl => json!({"id": id, "role": "user", "content": [
            {"type": "image_url", "image_url": {"mediaType": media_type, "url": data_url(media_type, payload)}}]}),
    }
}

/// Property test: random binary payloads and media types round-trip byte-exact through
/// append, update and import, and every read path, each case on a fresh store from `open`.
pub fn check_round_trips<S: Store, G>(open: impl Fn() -> (Db<S>, G), cases: u32) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let media_types = prop::sample::select(vec![
        "image/png",
        "image/jpeg",
        "application/pdf",
        "audio/wav",
        "video/mp4",
        "application/octet-stream",
    ]);
    let placement = prop::sample::select(vec![
        Placement::FilePart,
        Placement::ToolMedia,
        Placement::ContentImageUrl,
    ]);
    let path = prop::sample::select(vec![
        WritePath::Append,
        WritePath::Update,
        WritePath::Import,
    ]);
    let strategy = (
        prop::collection::vec(any::<u8>(), 0..6_000),
        media_types,
        placement,
        path,
    );
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    runner
        .run(&strategy, |(payload, media_type, placement, path)| {
            let (db, _guard) = open();
            let s = db_session(&db, "s");
            let expected = generated("m", &payload, media_type, placement);
            let message = Message::from_value(expected.clone()).unwrap();
            block_on(async {
                match path {
                    WritePath::Append => {
                        s.append(message, AppendOptions::default()).await.unwrap();
                    }
                    WritePath::Update => {
                        s.append(text("m", "user", "placeholder"), AppendOptions::default())
                            .await
                            .unwrap();
                        s.update(message, Source::Server).await.unwrap().unwrap();
                    }
                    WritePath::Import => {
                        s.import(message, imported(None, 1)).await.unwrap().unwrap();
                    }
                }
                every_read_returns(&s, "m", &expected).await;
                let stored = pointer_json(&s, "m").await;
                prop_assert!(stored.contains("attachment:sha256:"), "{}", stored);
                prop_assert_eq!(held(&db, &[&payload]).await, 1);
                Ok(())
            })
        })
        .unwrap();
}

/// A patch of a message that holds media, and of one larger than a row, applies at once: the
/// message it writes against is the one it read, whatever form the backend keeps it in.
pub async fn patches_of_media_and_chunked_messages_apply<S: Store>(db: Db<S>) {
    use sessiondb::MessagePatch;
    let png = bytes(300_000, 3);
    let long = Message::text("assistant", "y".repeat(2 * 1024 * 1024)).with_id("long");
    let metadata = json!({"rating": "good"});
    for (sid, message) in [("media", image_message("img", &png)), ("chunked", long)] {
        let s = db_session(&db, sid);
        let id = message.id().unwrap().to_owned();
        let mut expected = message.clone().into_value();
        s.append(message, AppendOptions::default()).await.unwrap();
        let patch = MessagePatch {
            metadata: Some(metadata.clone()),
            ..Default::default()
        };
        let patched = s.patch_message(&id, patch, Source::Server).await;
        assert!(patched.unwrap().is_some(), "{id}");
        expected["metadata"] = metadata.clone();
        let read = body(&s.message(&id).await.unwrap().unwrap());
        assert!(
            read == expected,
            "{id}: the patch applied and nothing else changed"
        );
        every_read_returns(&s, &id, &expected).await;
    }
    assert_eq!(held(&db, &[&png]).await, 1, "the payload stays stored once");
}

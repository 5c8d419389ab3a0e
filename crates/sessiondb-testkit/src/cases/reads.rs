//! Read paths: history both ways, batches, recent windows, row stats, branches, the path cap.

use futures::{StreamExt, TryStreamExt};
use sessiondb::{AppendOptions, Db, HistoryOptions, MAX_PATH_ROWS, Message, Store};

use crate::*;

fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("n{i}")).collect()
}

async fn chain_n<S: Store>(s: &sessiondb::Session<S>, n: usize) -> Vec<String> {
    let names = numbered(n);
    let messages = names
        .iter()
        .map(|id| text(id, "user", &format!("body of {id}")))
        .collect();
    s.append_all(messages, AppendOptions::default())
        .await
        .unwrap();
    names
}

pub async fn empty_and_unknown_reads_are_empty<S: Store>(db: Db<S>) {
    let s = db_session(&db, "never-written");
    assert!(history_ids(&s, None).await.is_empty());
    assert!(newest_first_ids(&s, None).await.is_empty());
    assert!(s.latest_leaf().await.unwrap().is_none());
    assert!(s.row_stats(None).await.unwrap().is_empty());
    assert!(s.branches("x").await.unwrap().is_empty());
    assert_eq!(s.path_length(None).await.unwrap(), 0);
    let recent = s.recent_history(100, None).await.unwrap();
    assert_eq!(
        (recent.messages.len(), recent.truncated, recent.total_bytes),
        (0, false, 0)
    );
    chain(&s, &["a"]).await;
    assert!(history_ids(&s, Some("ghost")).await.is_empty());
    assert!(newest_first_ids(&s, Some("ghost")).await.is_empty());
}

/// A session's reads return its own rows and no other's, whatever seqs a caller names: ranges
/// to `i64::MAX` or from `i64::MIN`, seqs no row has, with sessions written after it beside it.
/// (An update first, so no read is answered from a backend's row cache.)
pub async fn reads_of_any_seq_range_stay_within_the_session<S: Store>(db: Db<S>) {
    let sessions: Vec<_> = ["first", "second", "third"]
        .into_iter()
        .map(|id| db_session(&db, id))
        .collect();
    for s in &sessions {
        chain(s, &["a", "b", "c"]).await;
    }
    let first = &sessions[0];
    first
        .update(text("b", "user", "changed"), sessiondb::Source::Server)
        .await
        .unwrap();
    let store = db.store();
    let key = first.key();
    let own = ["a", "b", "c"];
    let whole = store
        .fetch_range(key, 1, i64::MAX, 100, u64::MAX)
        .await
        .unwrap();
    assert_eq!(ids(&whole), own);
    let newest = store
        .fetch_range_newest(key, i64::MIN, i64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(ids(&newest), ["c", "b", "a"]);
    let seqs: Vec<i64> = whole.iter().map(|m| m.seq).collect();
    let named = [seqs.clone(), vec![i64::MAX]].concat();
    assert_eq!(ids(&store.fetch(key, &named).await.unwrap()), own);
    assert!(
        store
            .fetch(key, &[i64::MIN, -1, 0])
            .await
            .unwrap()
            .is_empty()
    );
    let (low, high) = (seqs[0], seqs[2]);
    let totals = store
        .range_totals(
            key,
            &[(low, high), (i64::MIN, i64::MAX), (high + 1, i64::MAX)],
        )
        .await
        .unwrap();
    assert_eq!(
        totals[1], totals[0],
        "the whole range is the session's three rows"
    );
    assert_eq!((totals[2].tokens, totals[2].bytes), (0, 0));
    let exported: Vec<String> = first.export().try_collect().await.unwrap();
    let messages = exported
        .iter()
        .filter(|l| l.starts_with("{\"message\""))
        .count();
    assert_eq!(messages, 3, "{exported:?}");
    let ghost = db_session(&db, "never-written");
    let nothing = store
        .fetch_range(ghost.key(), i64::MIN, i64::MAX, 100, u64::MAX)
        .await
        .unwrap();
    assert!(nothing.is_empty());
}

pub async fn newest_first_is_the_exact_reverse<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let names = chain_n(&s, 150).await;
    s.append(text("side", "user", "x"), under("n40"))
        .await
        .unwrap();
    let mut forward = history_ids(&s, Some("n149")).await;
    forward.reverse();
    assert_eq!(newest_first_ids(&s, Some("n149")).await, forward);
    assert_eq!(forward.len(), names.len());
    let side = newest_first_ids(&s, None).await;
    assert_eq!(side.first().map(String::as_str), Some("side"));
    assert_eq!(side.last().map(String::as_str), Some("n0"));
    assert_eq!(side.len(), 42);
}

pub async fn newest_first_stops_when_the_consumer_does<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain_n(&s, 20).await;
    let leaf = first(
        &s,
        HistoryOptions {
            leaf: None,
            newest_first: true,
        },
    )
    .await
    .unwrap();
    assert_eq!(leaf.id, "n19");
    let three: Vec<_> = s
        .history(HistoryOptions {
            leaf: None,
            newest_first: true,
        })
        .take(3)
        .map(|m| m.unwrap().id.clone())
        .collect()
        .await;
    assert_eq!(three, ["n19", "n18", "n17"]);
}

pub async fn windows_of_fifty_lose_nothing<S: Store>(db: Db<S>) {
    for n in [49, 50, 51, 101] {
        let s = db_session(&db, &format!("s{n}"));
        let names = chain_n(&s, n).await;
        assert_eq!(history_ids(&s, None).await, names, "path of {n}");
    }
}

pub async fn history_batches_by_count_and_bytes<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain_n(&s, 5).await;
    let sizes: Vec<usize> = s
        .history_batches(HistoryOptions::default(), 2, 4 * 1024 * 1024)
        .map_ok(|b| b.len())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(sizes, [2, 2, 1]);
    let one = s.message("n0").await.unwrap().unwrap().json().len() as u64;
    let batches: Vec<Vec<_>> = s
        .history_batches(HistoryOptions::default(), 50, one + 1)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(batches.len(), 5);
    assert_eq!(batches.concat().len(), 5);
}

pub async fn recent_history_is_the_longest_fitting_suffix<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain_n(&s, 6).await;
    let rows = s.row_stats(None).await.unwrap();
    let row = rows[0].bytes;
    let total: u64 = rows.iter().map(|r| r.bytes).sum();
    let two = s.recent_history(2 * row + 10, None).await.unwrap();
    assert_eq!(ids(&two.messages), ["n4", "n5"]);
    assert!(two.truncated);
    assert_eq!(two.total_bytes, total);
    let leaf_only = s.recent_history(1, None).await.unwrap();
    assert_eq!(ids(&leaf_only.messages), ["n5"]);
    assert!(leaf_only.truncated);
    let all = s.recent_history(total, None).await.unwrap();
    assert_eq!(all.messages.len(), 6);
    assert!(!all.truncated);
    let on_branch = s.recent_history(total, Some("n2")).await.unwrap();
    assert_eq!(ids(&on_branch.messages), ["n0", "n1", "n2"]);
}

pub async fn row_stats_describe_rows_without_content<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b"]).await;
    let rows = s.row_stats(None).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.role.as_str()).collect::<Vec<_>>(),
        ["user", "assistant"]
    );
    let b = s.message("b").await.unwrap().unwrap();
    assert_eq!(rows[1].bytes, b.body().len() as u64);
    assert_eq!(rows[1].token_estimate, b.token_estimate);
    assert_eq!(s.row_stats(Some("a")).await.unwrap().len(), 1);
}

pub async fn path_length_follows_the_chosen_leaf<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    s.append(text("d", "user", "x"), under("a")).await.unwrap();
    assert_eq!(s.path_length(None).await.unwrap(), 2);
    assert_eq!(s.path_length(Some("c")).await.unwrap(), 3);
    assert_eq!(s.path_length(Some("zzz")).await.unwrap(), 0);
}

pub async fn branches_list_children_oldest_first<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["p"]).await;
    for id in ["c3", "c1", "c2"] {
        s.append(text(id, "assistant", id), under("p"))
            .await
            .unwrap();
    }
    assert_eq!(ids(&s.branches("p").await.unwrap()), ["c3", "c1", "c2"]);
    s.append(text("r2", "user", "second tree"), root())
        .await
        .unwrap();
    s.import(text("o", "user", "orphan"), imported(Some("gone"), 1))
        .await
        .unwrap();
    assert_eq!(ids(&s.roots().await.unwrap()), ["p", "r2", "o"]);
    assert!(s.branches("c1").await.unwrap().is_empty());
}

pub async fn paths_are_capped_at_ten_thousand_and_one_rows<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    let names = chain_n(&s, MAX_PATH_ROWS).await;
    let full = s.recent_history(u64::MAX, None).await.unwrap();
    assert_eq!(full.messages.len(), MAX_PATH_ROWS);
    assert!(!full.truncated);
    chain(&s, &["over"]).await;
    let capped = s.recent_history(u64::MAX, None).await.unwrap();
    assert_eq!(capped.messages.len(), MAX_PATH_ROWS);
    assert!(capped.truncated);
    assert_eq!(capped.messages[0].id, names[1]);
    assert_eq!(history_ids(&s, None).await.len(), MAX_PATH_ROWS);
    assert_eq!(newest_first_ids(&s, None).await.len(), MAX_PATH_ROWS);
    assert_eq!(
        s.stats().await.unwrap().message_count as usize,
        MAX_PATH_ROWS
    );

    // Runs of a capped path, and of a branch off it, are the walked paths' seqs.
    s.append(text("fork", "user", "fork"), under(&names[5000]))
        .await
        .unwrap();
    let store = db.store();
    for leaf in [Some("over"), Some("fork")] {
        let walked = store.path(s.key(), leaf).await.unwrap();
        let runs = store.path_runs(s.key(), leaf, &[]).await.unwrap();
        assert_eq!(runs.runs, crate::runs_of(&walked.rows));
        assert_eq!(runs.capped, walked.capped);
    }
    assert_eq!(
        store
            .path_runs(s.key(), Some("fork"), &[])
            .await
            .unwrap()
            .runs
            .len(),
        2
    );

    // An overlay on the capped path: planned and read from the runs, both ways.
    let c = s
        .add_compaction("early".into(), names[2].clone(), names[10].clone())
        .await
        .unwrap();
    let mut expected = vec![names[1].clone(), format!("compaction_{}", c.id)];
    expected.extend(names[11..].iter().cloned());
    expected.push("over".into());
    assert_eq!(history_ids(&s, Some("over")).await, expected);
    expected.reverse();
    assert_eq!(newest_first_ids(&s, Some("over")).await, expected);
}

pub async fn imported_rows_move_the_leaf_even_off_branch<S: Store>(db: Db<S>) {
    let s = db_session(&db, "s");
    chain(&s, &["a", "b", "c"]).await;
    s.import(
        Message::text("user", "old").with_id("i"),
        imported(Some("a"), 1),
    )
    .await
    .unwrap();
    assert_eq!(s.latest_leaf().await.unwrap().unwrap().id, "i");
    assert_eq!(history_ids(&s, None).await, ["a", "i"]);
}

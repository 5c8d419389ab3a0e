//! The stated costs, tested: an append (at the leaf or under an old message) and an update of
//! an old message (on a linear or a branched path) are a fixed number of statements; the
//! session's record with its statistics (what the auto-compaction check reads), a read of the
//! last 50 and a search cost the same whatever the session's length; a whole-path read costs in
//! proportion to the path; a page of the session listing costs the same among 30 sessions as
//! among 3,000. Measured in what SQLite does, not in time: every connection a test opens counts
//! the statements it finishes and the steps of SQLite's virtual machine they take (one per
//! opcode run, so a scan shows as steps per row while a seek is a handful).

use std::cell::Cell;
use std::collections::HashMap;

use rusqlite::trace::{TraceEvent, TraceEventCodes};
use rusqlite::{Connection, StatementStatus};

/// Work done by SQLite on this thread's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    pub statements: u64,
    pub vm_steps: u64,
}

thread_local! {
    static SPENT: Cell<Cost> = const { Cell::new(Cost { statements: 0, vm_steps: 0 }) };
}

/// Counts what `conn` runs, on the thread that runs it. A statement's step counter adds up over
/// its runs, so each run is charged the difference between its end and its start.
pub(crate) fn meter(conn: &mut Connection) {
    let mut started: HashMap<String, i32> = HashMap::new();
    let codes = TraceEventCodes::SQLITE_TRACE_STMT | TraceEventCodes::SQLITE_TRACE_PROFILE;
    conn.trace_v2(
        codes,
        Some(move |event: TraceEvent<'_>| match event {
            // Also sent at the start of each trigger program: the first one marks the start.
            TraceEvent::Stmt(stmt, _) => {
                let steps = stmt.get_status(StatementStatus::VmStep);
                started.entry(stmt.sql().into_owned()).or_insert(steps);
            }
            TraceEvent::Profile(stmt, _) => {
                let steps = stmt.get_status(StatementStatus::VmStep);
                let start = started.remove(stmt.sql().as_ref()).unwrap_or(0);
                SPENT.with(|spent| {
                    let mut cost = spent.get();
                    cost.statements += 1;
                    cost.vm_steps += (steps - start).max(0) as u64;
                    spent.set(cost);
                });
            }
            _ => {}
        }),
    )
    .expect("installing the cost meter");
}

/// What `f` made SQLite do on this thread.
pub(crate) fn measure<T>(f: impl FnOnce() -> T) -> (T, Cost) {
    let before = SPENT.with(Cell::get);
    let value = f();
    let after = SPENT.with(Cell::get);
    let cost = Cost {
        statements: after.statements - before.statements,
        vm_steps: after.vm_steps - before.vm_steps,
    };
    (value, cost)
}

mod tests {
    use futures::executor::block_on;
    use sessiondb_core::tokens::HeuristicCounter;
    use sessiondb_core::{
        Message, Parent, SearchFilter, SessionCursor, SessionKey, SessionQuery, SessionSort, Store,
        WriteOp, WriteRequest,
    };

    use super::*;
    use crate::{SqliteConfig, SqliteStore, Synchronous};

    /// A store whose reads all come from the database (no row cache), so they show their cost.
    fn store(dir: &std::path::Path) -> SqliteStore {
        let config = SqliteConfig {
            synchronous: Synchronous::Normal,
            row_cache_bytes: 0,
            ..SqliteConfig::default()
        };
        SqliteStore::open_with(dir, config).unwrap()
    }

    /// Appends of messages numbered `ids`, at the time of the first (so each request's writes
    /// move the session's times, as an agent's do).
    fn append_request(key: &SessionKey, ids: std::ops::Range<usize>) -> WriteRequest {
        let now_ms = ids.start as i64;
        let ops = ids
            .map(|n| WriteOp::Append {
                message: Message::text("user", format!("message {n} about the weather"))
                    .with_id(format!("{}-{n}", key.session_id))
                    .prepare(&HeuristicCounter),
                parent: Parent::ActiveLeaf,
            })
            .collect();
        WriteRequest {
            key: key.clone(),
            now_ms,
            ops,
            max_messages: None,
            condition: None,
        }
    }

    /// A session of `len` messages; the last one holds the word `needle`.
    fn session(store: &SqliteStore, name: &str, len: usize) -> SessionKey {
        let key = SessionKey::new("", name).unwrap();
        for start in (0..len - 1).step_by(500) {
            let end = (start + 500).min(len - 1);
            block_on(store.write(append_request(&key, start..end))).unwrap();
        }
        let mut last = append_request(&key, len..len + 1);
        last.ops = vec![WriteOp::Append {
            message: Message::text("user", "the needle")
                .with_id(format!("{name}-needle"))
                .prepare(&HeuristicCounter),
            parent: Parent::ActiveLeaf,
        }];
        block_on(store.write(last)).unwrap();
        key
    }

    fn append_cost(store: &SqliteStore, key: &SessionKey, n: usize) -> Cost {
        measure(|| block_on(store.write(append_request(key, n..n + 1))).unwrap()).1
    }

    /// The same statements, their steps within a quarter of each other (a seek is one step
    /// however deep the B-tree, so they mostly match exactly; a cost that grew with the
    /// session would be many times larger).
    fn assert_alike(short: Cost, long: Cost, what: &str) {
        assert_eq!(
            short.statements, long.statements,
            "{what}: {short:?} vs {long:?}"
        );
        let (a, b) = (short.vm_steps as f64, long.vm_steps as f64);
        assert!(a.max(b) <= 1.25 * a.min(b), "{what}: {short:?} vs {long:?}");
    }

    #[test]
    fn appends_branches_and_reads_cost_the_same_in_short_and_long_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let short = session(&store, "short", 60);
        let long = session(&store, "long", 5_000);

        // Later appends run the statements a first append to a session prepared.
        append_cost(&store, &short, 10_000);
        append_cost(&store, &long, 10_000);
        let (on_short, on_long) = (
            append_cost(&store, &short, 10_001),
            append_cost(&store, &long, 10_001),
        );
        assert_alike(on_short, on_long, "an append");
        assert!(on_long.statements <= 12, "an append: {on_long:?}");

        // The session's record with its statistics: what the auto-compaction check reads
        // after an append.
        let info = |key: &SessionKey| measure(|| block_on(store.session(key)).unwrap()).1;
        info(&long);
        assert_alike(info(&short), info(&long), "the session's record");

        let last_50 = |key: &SessionKey| {
            let leaf = block_on(store.stats(key)).unwrap().linear_range.unwrap().1;
            let (rows, cost) =
                measure(|| block_on(store.fetch_range_newest(key, 1, leaf, 50)).unwrap());
            assert_eq!(rows.len(), 50);
            cost
        };
        last_50(&long);
        assert_alike(last_50(&short), last_50(&long), "the last 50");

        let search = |key: &SessionKey| {
            let words = vec!["needle".to_owned()];
            let (hits, cost) = measure(|| {
                block_on(store.search(key, &words, &SearchFilter::default(), 20)).unwrap()
            });
            assert_eq!(hits.len(), 1);
            cost
        };
        search(&short); // builds the index
        assert_alike(search(&short), search(&long), "a search");

        // A branch a quarter of the way in takes its path's totals from its parent's row.
        let branch = |key: &SessionKey, parent: usize, n: usize| {
            let mut request = append_request(key, n..n + 1);
            if let WriteOp::Append { parent: under, .. } = &mut request.ops[0] {
                *under = Parent::Id(format!("{}-{parent}", key.session_id));
            }
            measure(|| block_on(store.write(request)).unwrap()).1
        };
        let branches = (branch(&short, 15, 20_000), branch(&long, 1_250, 20_000));
        assert_alike(branches.0, branches.1, "a branch append");

        // Rewriting an earlier message adjusts the session's totals in place (and marks the
        // stored totals below the row stale instead of rewriting them). The branch above is the
        // active leaf now, so whether a row counts in the totals takes the path's runs: one
        // seek per branch point on it, not a walk of its rows.
        let update = |key: &SessionKey, n: usize| {
            let message = Message::text("user", "rewritten")
                .with_id(format!("{}-{n}", key.session_id))
                .prepare(&HeuristicCounter);
            let mut request = append_request(key, 30_000..30_001);
            request.ops = vec![WriteOp::Update { message }];
            measure(|| block_on(store.write(request)).unwrap()).1
        };
        update(&short, 10);
        update(&long, 1_000);
        assert_alike(
            update(&short, 11),
            update(&long, 1_001),
            "an update on a branched path",
        );
        assert_alike(
            update(&short, 40),
            update(&long, 4_000),
            "an update off the active path",
        );

        // On a linear path the session row alone tells. Sessions of their own: an edit below
        // the head moves the session's path epoch, after which a branch under an older row
        // walks its path once.
        let (short, long) = (
            session(&store, "short-edited", 60),
            session(&store, "long-edited", 5_000),
        );
        update(&short, 21);
        update(&long, 2_001);
        assert_alike(update(&short, 20), update(&long, 2_000), "an update");

        // After the edit, the first branch under an older row walks its path and leaves the
        // totals on it: a second branch there (a regeneration) does not walk again.
        branch(&short, 15, 20_000);
        branch(&long, 1_250, 20_000);
        let regenerations = (branch(&short, 15, 20_001), branch(&long, 1_250, 20_001));
        assert_alike(
            regenerations.0,
            regenerations.1,
            "a regeneration after an edit",
        );
    }

    #[test]
    fn a_page_of_sessions_costs_the_same_among_few_and_many() {
        let page = |sessions: usize| {
            let dir = tempfile::tempdir().unwrap();
            let store = store(dir.path());
            for n in 0..sessions {
                let key = SessionKey::new("", format!("s{n:05}")).unwrap();
                let request = append_request(&key, n..n + 1);
                block_on(store.write(request)).unwrap();
            }
            let mut query = SessionQuery {
                sort: SessionSort::LastMessageAt,
                descending: true,
                after: None,
                user_id: None,
                limit: 20,
            };
            let list = |query: &SessionQuery| {
                let (found, cost) = measure(|| block_on(store.list_sessions("", query)).unwrap());
                assert_eq!(found.len(), 20);
                (found, cost)
            };
            list(&query);
            let (first, first_cost) = list(&query);
            let tenth = &first[9];
            query.after = Some(SessionCursor {
                value: query.sort.value_of(tenth),
                id: tenth.id.clone(),
            });
            list(&query);
            (first_cost, list(&query).1)
        };
        let (few, many) = (page(30), page(3_000));
        assert_alike(few.0, many.0, "the first page");
        assert_alike(few.1, many.1, "a page after a cursor");
    }

    #[test]
    fn a_whole_path_read_costs_in_proportion_to_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let short = session(&store, "short", 500);
        let long = session(&store, "long", 5_000);
        let read_all = |key: &SessionKey| {
            let leaf = block_on(store.stats(key)).unwrap().linear_range.unwrap().1;
            let mut cost = Cost::default();
            let mut from = 1;
            while from <= leaf {
                let (rows, spent) =
                    measure(|| block_on(store.fetch_range(key, from, leaf, 50, 4 << 20)).unwrap());
                from = rows.last().unwrap().seq + 1;
                cost.statements += spent.statements;
                cost.vm_steps += spent.vm_steps;
            }
            cost
        };
        read_all(&short);
        let (short_cost, long_cost) = (read_all(&short), read_all(&long));
        let per_row = |cost: Cost, rows: f64| cost.vm_steps as f64 / rows;
        let (a, b) = (per_row(short_cost, 500.0), per_row(long_cost, 5_000.0));
        assert!(
            a.max(b) <= 1.25 * a.min(b),
            "steps per row: {a:.1} (500 rows) vs {b:.1} (5,000 rows)"
        );
    }
}

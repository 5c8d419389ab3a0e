//! The pool of read connections: `query_only` snapshots on the caller's thread, opened on
//! demand and returned when a checkout drops (also when a read panics).

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use rusqlite::{Connection, OpenFlags};
use sessiondb_core::StoreError;

use crate::{Synchronous, backend_error, metered, schema};

/// A read-only connection (`synchronous` only matters for the checkpoints it may run).
pub(crate) fn open_reader(path: &Path, synchronous: Synchronous) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        schema::VFS,
    )
    .map(metered)
    .map_err(backend_error)?;
    schema::configure(&conn, synchronous, true)?;
    Ok(conn)
}

/// A checked-out reader, returned to its pool on drop (also when a read panics).
pub(crate) struct Checkout<'a> {
    pool: &'a ReaderPool,
    conn: Option<Connection>,
}

impl Checkout<'_> {
    pub(crate) fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("held until drop")
    }
}

/// Runs `f` in one snapshot of `conn`: every query of `f` sees the same committed state (a path
/// and its totals, a message and its continuation slices).
pub(crate) fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let run = |sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([]).map(drop))
            .map_err(backend_error)
    };
    run("BEGIN")?;
    let result = f(conn);
    run("COMMIT")?;
    result
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // A read that panicked left its snapshot open; the next one must start afresh.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            self.pool.checkin(conn);
        }
    }
}

/// Read connections, opened on demand up to `max` and reused.
#[derive(Debug)]
pub(crate) struct ReaderPool {
    path: PathBuf,
    synchronous: Synchronous,
    max: usize,
    /// Idle connections and how many are open in all.
    state: Mutex<(Vec<Connection>, usize)>,
    returned: Condvar,
}

impl ReaderPool {
    /// A pool of up to `max` connections to `path`, `first` among them.
    pub(crate) fn new(
        path: PathBuf,
        synchronous: Synchronous,
        max: usize,
        first: Connection,
    ) -> Self {
        Self {
            path,
            synchronous,
            max: max.max(1),
            state: Mutex::new((vec![first], 1)),
            returned: Condvar::new(),
        }
    }

    /// A connection, back in the pool when the checkout drops.
    pub(crate) fn lend(&self) -> Result<Checkout<'_>, StoreError> {
        Ok(Checkout {
            pool: self,
            conn: Some(self.checkout()?),
        })
    }

    fn checkout(&self) -> Result<Connection, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = state.0.pop() {
                return Ok(conn);
            }
            if state.1 < self.max {
                state.1 += 1;
                drop(state);
                return self.open().inspect_err(|_| {
                    self.state.lock().unwrap_or_else(|p| p.into_inner()).1 -= 1;
                });
            }
            state = self.returned.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn checkin(&self, conn: Connection) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push(conn);
        self.returned.notify_one();
    }

    fn open(&self) -> Result<Connection, StoreError> {
        open_reader(&self.path, self.synchronous)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A pool of up to `max` readers of a new WAL database holding one row, and its directory.
    fn pool(max: usize) -> (tempfile::TempDir, Arc<ReaderPool>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readers.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);",
            )
            .unwrap();
        drop(writer);
        let first = open_reader(&path, Synchronous::Normal).unwrap();
        let pool = ReaderPool::new(path, Synchronous::Normal, max, first);
        (dir, Arc::new(pool))
    }

    fn rows(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// Runs `f` on a thread of its own; its result, or `None` when it has not come within `wait`.
    fn within<T: Send + 'static>(
        wait: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (sent, received) = mpsc::channel();
        std::thread::spawn(move || sent.send(f()));
        received.recv_timeout(wait).ok()
    }

    #[test]
    fn a_reader_past_the_limit_waits_for_one_to_come_back() {
        let (_dir, pool) = pool(1);
        let held = pool.lend().unwrap();
        let (lent, waited) = mpsc::channel();
        let waiting = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let checkout = pool.lend().unwrap();
                lent.send(rows(checkout.conn())).unwrap();
            })
        };
        assert!(
            waited.recv_timeout(Duration::from_millis(200)).is_err(),
            "lent past the limit"
        );
        drop(held);
        assert_eq!(waited.recv_timeout(Duration::from_secs(10)), Ok(1));
        waiting.join().unwrap();
        assert_eq!(
            pool.state.lock().unwrap().1,
            1,
            "no second connection was opened"
        );
    }

    #[test]
    fn a_read_that_panicked_in_its_snapshot_leaves_a_reader_that_sees_later_commits() {
        let (dir, pool) = pool(1);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let checkout = pool.lend().unwrap();
            in_snapshot(checkout.conn(), |conn| -> Result<(), StoreError> {
                assert_eq!(rows(conn), 1);
                panic!("a read fails half way");
            })
        }));
        assert!(panicked.is_err());
        Connection::open(dir.path().join("readers.db"))
            .unwrap()
            .execute("INSERT INTO t VALUES (2)", [])
            .unwrap();
        let checkout = pool.lend().unwrap();
        assert!(
            checkout.conn().is_autocommit(),
            "the snapshot was left open"
        );
        assert_eq!(rows(checkout.conn()), 2);
    }

    #[test]
    fn a_reader_that_failed_to_open_gives_its_place_back() {
        let (dir, pool) = pool(2);
        let held = pool.lend().unwrap();
        // New connections fail from now on (a reader never creates the file).
        std::fs::remove_file(dir.path().join("readers.db")).unwrap();
        for attempt in 0..3 {
            let pool = pool.clone();
            let lent = within(Duration::from_secs(10), move || pool.lend().map(drop));
            assert!(matches!(lent, Some(Err(_))), "attempt {attempt}: {lent:?}");
        }
        drop(held);
        let state = pool.state.lock().unwrap();
        assert_eq!(
            (state.0.len(), state.1),
            (1, 1),
            "idle readers, and readers open"
        );
    }
}

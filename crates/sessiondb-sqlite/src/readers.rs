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

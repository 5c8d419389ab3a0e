//! WAL checkpoints on a thread of their own.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses the threshold, so the writer
//! (and every caller waiting on its group) would stall for the copy and its two syncs. Here the
//! writer never checkpoints (`wal_autocheckpoint = 0`); this thread runs a PASSIVE checkpoint
//! after every few commits or a short while, concurrently with the writer (PASSIVE takes no
//! lock a writer needs, and copies only frames no reader still uses).

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use sessiondb_core::StoreError;

use crate::{Synchronous, backend_error, schema};

/// Commits after which a checkpoint runs without waiting for the timer.
const COMMITS_PER_CHECKPOINT: u64 = 64;
/// A quiet store is checkpointed this long after its last commits.
const IDLE_CHECKPOINT: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
struct State {
    commits: u64,
    stop: bool,
}

#[derive(Debug)]
pub(crate) struct Checkpointer {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(crate) fn start(path: &Path, synchronous: Synchronous) -> Result<Self, StoreError> {
        let conn = Connection::open(path).map_err(backend_error)?;
        schema::configure(&conn, synchronous, false)?;
        let shared: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sessiondb-checkpoint".into())
            .spawn(move || run(&conn, &worker))
            .map_err(|e| StoreError::Backend(format!("starting the checkpoint thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Counts a commit; wakes the thread when enough have accumulated.
    pub(crate) fn committed(&self) {
        let (state, wake) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.commits += 1;
        if state.commits >= COMMITS_PER_CHECKPOINT {
            wake.notify_one();
        }
    }
}

fn run(conn: &Connection, shared: &(Mutex<State>, Condvar)) {
    let (state, wake) = shared;
    loop {
        let stop = {
            let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
            if guard.commits < COMMITS_PER_CHECKPOINT && !guard.stop {
                guard = wake
                    .wait_timeout(guard, IDLE_CHECKPOINT)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if guard.commits == 0 && !guard.stop {
                continue;
            }
            guard.commits = 0;
            guard.stop
        };
        // A failed (or partial) checkpoint leaves the WAL longer, nothing worse; the next one
        // retries.
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        if stop {
            return;
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (state, wake) = &*self.shared;
        state.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

//! Making committed groups durable, then publishing their events and answering their callers,
//! in commit order.
//!
//! Groups enter `pending` while the writer is held, so in commit order. A leader that finds no
//! more work flushes inline after letting the writer go (an uncontended write never changes
//! threads); a leader with more work waiting hands the flush to this module's thread and goes on
//! applying, so the writer does not wait for the disk. Either way one WAL sync covers every group
//! pending at that moment. A leader with only a few requests waits for a sync in flight before
//! committing ([`Durability::wait_for_flush`]), so small groups merge into one. A committed group
//! is visible to readers before its sync; it is acknowledged (and published) only after it.
//!
//! A failed sync halts the store's writes until it is reopened ([`StoreError::Halted`]): after
//! a failed `fsync` the kernel may have dropped the pages it could not write and a later sync
//! would report success without them, so no later acknowledgement could be trusted.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

use sessiondb_core::{Change, ChangeFeed, SessionKey, StoreError, Written};

use crate::{Reply, lock};

/// A committed group whose callers wait for it to become durable.
pub(crate) struct Committed {
    pub(crate) events: Vec<(SessionKey, Change)>,
    pub(crate) replies: Vec<Answer>,
}

/// A caller's reply channel and what it will be told once the group is durable.
pub(crate) enum Answer {
    One(Reply<Written>, Result<Written, StoreError>),
    Together(Reply<Vec<Written>>, Result<Vec<Written>, StoreError>),
}

impl Answer {
    fn send(self) {
        match self {
            Answer::One(reply, outcome) => drop(reply.send(outcome)),
            Answer::Together(reply, outcome) => drop(reply.send(outcome)),
        }
    }

    /// Tells the caller the sync failed instead.
    fn halted(self, reason: &str) {
        let halted = || StoreError::Halted(reason.to_owned());
        match self {
            Answer::One(reply, _) => drop(reply.send(Err(halted()))),
            Answer::Together(reply, _) => drop(reply.send(Err(halted()))),
        }
    }
}

#[derive(Default)]
struct Pending {
    groups: VecDeque<Committed>,
    stop: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Signals the flush thread: groups were handed off, or the store is closing.
    handed_off: Condvar,
    /// The WAL file, opened on first use; the lock also serialises flushes.
    wal: Mutex<Option<File>>,
    wal_path: PathBuf,
    /// `Full` mode: sync before acknowledging. `Normal`: acknowledge once committed.
    fsync: bool,
    feed: ChangeFeed,
    /// Why a sync failed; once set, every group is answered with [`StoreError::Halted`].
    halted: OnceLock<String>,
}

pub(crate) struct Durability {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durability")
            .field("fsync", &self.shared.fsync)
            .finish_non_exhaustive()
    }
}

impl Durability {
    pub(crate) fn start(
        wal_path: PathBuf,
        fsync: bool,
        feed: ChangeFeed,
    ) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            handed_off: Condvar::new(),
            wal: Mutex::new(None),
            wal_path,
            fsync,
            feed,
            halted: OnceLock::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sessiondb-flush".into())
            .spawn(move || worker.run())
            .map_err(|e| StoreError::Backend(format!("starting the flush thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Adds a committed group; called with the writer held, so in commit order.
    pub(crate) fn push(&self, group: Committed) {
        lock(&self.shared.pending).groups.push_back(group);
    }

    /// Lets the flush thread make the pending groups durable.
    pub(crate) fn hand_off(&self) {
        self.shared.handed_off.notify_one();
    }

    /// Makes every pending group durable on this thread.
    pub(crate) fn flush(&self) {
        self.shared.flush();
    }

    /// The error every write gets once a sync has failed.
    pub(crate) fn halted(&self) -> Option<StoreError> {
        self.shared.halted.get().cloned().map(StoreError::Halted)
    }

    /// Returns once no flush is in progress. A group committed while a sync runs cannot become
    /// durable before the next sync anyway, so a leader that waits here commits everything that
    /// queued meanwhile as one group instead of several small ones.
    pub(crate) fn wait_for_flush(&self) {
        drop(lock(&self.shared.wal));
    }
}

impl Shared {
    fn run(&self) {
        loop {
            {
                let mut pending = lock(&self.pending);
                while pending.groups.is_empty() && !pending.stop {
                    pending = self
                        .handed_off
                        .wait(pending)
                        .unwrap_or_else(|p| p.into_inner());
                }
                if pending.groups.is_empty() {
                    return;
                }
            }
            self.flush();
        }
    }

    fn flush(&self) {
        let mut wal = lock(&self.wal);
        let groups: Vec<Committed> = lock(&self.pending).groups.drain(..).collect();
        if groups.is_empty() {
            return;
        }
        let synced = match self.halted.get() {
            Some(reason) => Err(reason.clone()),
            None if self.fsync => self.sync(&mut wal).inspect_err(|reason| {
                let _ = self.halted.set(reason.clone());
            }),
            None => Ok(()),
        };
        for group in groups {
            match &synced {
                Ok(()) => {
                    self.feed.publish(group.events);
                    group.replies.into_iter().for_each(Answer::send);
                }
                Err(reason) => {
                    for answer in group.replies {
                        answer.halted(reason);
                    }
                }
            }
        }
    }

    fn sync(&self, wal: &mut Option<File>) -> Result<(), String> {
        let file = match wal {
            Some(file) => file,
            None => wal.insert(
                File::open(&self.wal_path)
                    .map_err(|e| format!("opening {}: {e}", self.wal_path.display()))?,
            ),
        };
        file.sync_data()
            .map_err(|e| format!("syncing {}: {e}", self.wal_path.display()))
    }
}

impl Drop for Durability {
    fn drop(&mut self) {
        lock(&self.shared.pending).stop = true;
        self.shared.handed_off.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

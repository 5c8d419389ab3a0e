//! Decoded rows of recently used sessions, so that reading a hot conversation again (an agent
//! reads its context every turn) skips SQLite's per-row stepping and decoding.
//!
//! The cache holds, per session, runs of consecutive seqs whose rows are known to exist with
//! exactly the cached content; a read is answered from it only when one run covers everything
//! the database would return, and goes to the database otherwise. It stays coherent because this
//! process is the database's only writer (the directory lock):
//! - an inserted append is cached as it commits (write-through): it extends the run that ends
//!   right before its seq, or starts one, so a conversation this process writes is read back
//!   from memory (appends never change stored rows: adopting orphans sets `parent_seq`, which
//!   messages do not carry);
//! - every other write that may change a session's rows (update, import, delete, clear, session
//!   delete) drops the session's runs right after its commit, before it is acknowledged;
//! - a read fills the cache only if no such write committed since the read took its
//!   [`RowCache::generation`], which it does before its snapshot begins.
//!
//! Memory is bounded by `max_bytes` (JSON, ids and a fixed overhead per row): one session holds
//! at most a quarter of it (reads fill it while it has room, appends keep its newest rows); the
//! least recently used sessions go first.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use sessiondb_core::{SessionKey, StoredMessage, UpdateOutcome, WriteOutcome};

use crate::lock;

/// Bytes charged per cached row besides its strings.
const ROW_OVERHEAD: usize = 128;

#[derive(Debug)]
pub(crate) struct RowCache {
    max_bytes: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<SessionKey, SessionRows>,
    bytes: usize,
    /// Bumped by every write that may change stored rows.
    generation: u64,
    /// Use counter for least-recently-used eviction.
    clock: u64,
}

#[derive(Debug, Default)]
struct SessionRows {
    /// Rows with consecutive seqs, by the first seq; runs never touch or overlap.
    runs: BTreeMap<i64, VecDeque<StoredMessage>>,
    bytes: usize,
    used: u64,
}

fn charge(message: &StoredMessage) -> usize {
    message.json().len()
        + message.id.len()
        + message.parent_id.as_ref().map_or(0, |id| id.len())
        + ROW_OVERHEAD
}

impl SessionRows {
    /// The run holding `seq`, as (first seq, rows).
    fn containing(&self, seq: i64) -> Option<(i64, &VecDeque<StoredMessage>)> {
        let (&first, rows) = self.runs.range(..=seq).next_back()?;
        (seq < first + rows.len() as i64).then_some((first, rows))
    }

    /// The first seq after the run starting at `start`.
    fn end_of(&self, start: i64) -> i64 {
        start + self.runs[&start].len() as i64
    }

    /// Adds rows with consecutive seqs `first..`, merging with the runs they touch or overlap
    /// (a row read now replaces the cached one of its seq).
    fn insert(&mut self, first: i64, rows: Vec<StoredMessage>) {
        let last = first + rows.len() as i64 - 1;
        let before = self.runs.range(..first).next_back().map(|(&s, _)| s);
        let touches_before = before.is_some_and(|s| self.end_of(s) >= first);
        let inside = self.runs.range(first..=last).next().is_some();
        let after = self.runs.contains_key(&(last + 1));
        // Windows read in order extend a run in place at either end.
        if !inside {
            if let Some(start) = before.filter(|&s| self.end_of(s) == first)
                && !after
            {
                self.bytes += rows.iter().map(charge).sum::<usize>();
                self.runs.get_mut(&start).expect("found").extend(rows);
                return;
            }
            if after && !touches_before {
                self.bytes += rows.iter().map(charge).sum::<usize>();
                let mut run = self.runs.remove(&(last + 1)).expect("found");
                for row in rows.into_iter().rev() {
                    run.push_front(row);
                }
                self.runs.insert(first, run);
                return;
            }
        }
        // Otherwise rebuild the span from every run it touches.
        let touching: Vec<i64> = self
            .runs
            .range(..=last + 1)
            .map(|(&start, _)| start)
            .filter(|&start| self.end_of(start) >= first)
            .collect();
        let mut merged: BTreeMap<i64, StoredMessage> = BTreeMap::new();
        for start in touching {
            let run = self.runs.remove(&start).expect("listed above");
            merged.extend((start..).zip(run));
        }
        for (seq, row) in (first..).zip(rows) {
            self.bytes += charge(&row);
            if let Some(old) = merged.insert(seq, row) {
                self.bytes -= charge(&old);
            }
        }
        let start = *merged.keys().next().expect("rows are not empty");
        self.runs.insert(start, merged.into_values().collect());
    }
}

impl RowCache {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            state: Mutex::new(State::default()),
        }
    }

    /// Most bytes one session may hold: a quarter of the cache, so a few hot conversations fit
    /// at once.
    fn session_max(&self) -> usize {
        self.max_bytes / 4
    }

    /// Taken by a read before its snapshot begins, and handed back to [`RowCache::fill`].
    pub(crate) fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    /// Rows `from..=last` in seq order, at most `max_rows` and `max_bytes` stored bytes (a
    /// larger first row alone), exactly as the database would return them; `None` when the
    /// cache cannot tell.
    pub(crate) fn range(
        &self,
        key: &SessionKey,
        from: i64,
        last: i64,
        max_rows: usize,
        max_bytes: u64,
    ) -> Option<Vec<StoredMessage>> {
        self.answered(key, |session| {
            let (first, run) = session.containing(from)?;
            let mut hits = Vec::with_capacity(max_rows.min(64));
            let mut used = 0u64;
            for row in run.range((from - first) as usize..) {
                if row.seq > last {
                    return Some(hits);
                }
                if hits.len() == max_rows || (!hits.is_empty() && used + row.bytes > max_bytes) {
                    return Some(hits);
                }
                used += row.bytes;
                hits.push(row.clone());
            }
            // The run ended first: what follows it is unknown, unless nothing more was wanted.
            (hits.len() == max_rows || first + run.len() as i64 > last).then_some(hits)
        })
    }

    /// Rows `first..=last` newest first, at most `max_rows`; `None` when the cache cannot tell.
    pub(crate) fn range_newest(
        &self,
        key: &SessionKey,
        first: i64,
        last: i64,
        max_rows: usize,
    ) -> Option<Vec<StoredMessage>> {
        self.answered(key, |session| {
            let (start, run) = session.containing(last)?;
            let take = ((last - first + 1).max(0) as usize).min(max_rows);
            let end = (last - start) as usize;
            (end + 1 >= take).then(|| (0..take).map(|i| run[end - i].clone()).collect())
        })
    }

    /// Runs `find` on the session's cached rows; when it answers, marks the session used and
    /// hands back copies (made after the lock is released: only handles are cloned under it).
    fn answered(
        &self,
        key: &SessionKey,
        find: impl FnOnce(&SessionRows) -> Option<Vec<StoredMessage>>,
    ) -> Option<Vec<StoredMessage>> {
        let hits = {
            let mut state = lock(&self.state);
            state.clock += 1;
            let clock = state.clock;
            let session = state.sessions.get_mut(key)?;
            let hits = find(session)?;
            session.used = clock;
            hits
        };
        Some(hits.iter().map(StoredMessage::clone).collect())
    }

    /// Adds rows a read returned (in any order) if no row-changing write committed since the
    /// read took `generation`.
    pub(crate) fn fill(&self, key: &SessionKey, generation: u64, rows: &[StoredMessage]) {
        if rows.is_empty() || self.max_bytes == 0 {
            return;
        }
        let mut sorted: Vec<&StoredMessage> = rows.iter().collect();
        sorted.sort_unstable_by_key(|r| r.seq);
        let mut state = lock(&self.state);
        if state.generation != generation {
            return;
        }
        // Reads fill a session only while it has room: a stream through a long session would
        // otherwise churn (copy in, push out) on every window for nothing.
        let mut room = self
            .session_max()
            .saturating_sub(state.sessions.get(key).map_or(0, |s| s.bytes));
        let mut start = 0;
        for end in 1..=sorted.len() {
            if end == sorted.len() || sorted[end].seq != sorted[end - 1].seq + 1 {
                let run = &sorted[start..end];
                let (first, last) = (run[0].seq, run[run.len() - 1].seq);
                // Cached rows are the stored rows: a read of rows the cache already holds
                // (part of what it asked for was cached) adds nothing, and re-inserting them
                // would rebuild the whole run they sit in.
                let held = state.sessions.get(key).and_then(|s| s.containing(first));
                if held.is_some_and(|(at, rows)| at + rows.len() as i64 > last) {
                    start = end;
                    continue;
                }
                let bytes: usize = run.iter().map(|r| charge(r)).sum();
                if bytes > room {
                    break;
                }
                room -= bytes;
                let run = run.iter().copied().cloned().collect();
                state.insert(key, sorted[start].seq, run, self.session_max());
                start = end;
            }
        }
        state.evict(self.max_bytes);
    }

    /// Applies a committed request's outcomes: inserted appends join their session's runs,
    /// anything that may have changed stored rows drops them.
    pub(crate) fn committed(&self, key: &SessionKey, outcomes: &[WriteOutcome]) {
        let mut state = lock(&self.state);
        for outcome in outcomes {
            match outcome {
                WriteOutcome::Appended {
                    message,
                    inserted: true,
                } => {
                    let session_max = self.session_max();
                    state.insert(key, message.seq, vec![message.clone()], session_max);
                }
                WriteOutcome::Appended {
                    inserted: false, ..
                }
                | WriteOutcome::Updated(UpdateOutcome::Unchanged(_) | UpdateOutcome::Missing)
                | WriteOutcome::Imported(None)
                | WriteOutcome::Deleted { count: 0 }
                | WriteOutcome::SessionCreated { .. }
                | WriteOutcome::CompactionAdded
                | WriteOutcome::StatePut
                | WriteOutcome::BlockWritten(_)
                | WriteOutcome::EntryPut
                | WriteOutcome::Prompt(_) => {}
                _ => {
                    state.generation += 1;
                    if let Some(dropped) = state.sessions.remove(key) {
                        state.bytes -= dropped.bytes;
                    }
                }
            }
        }
        state.evict(self.max_bytes);
    }
}

impl State {
    /// Adds a run to a session; past `session_max` bytes (appends to a long conversation) the
    /// session keeps its newest rows, where reads go most.
    fn insert(
        &mut self,
        key: &SessionKey,
        first: i64,
        rows: Vec<StoredMessage>,
        session_max: usize,
    ) {
        self.clock += 1;
        let clock = self.clock;
        // Every append lands here: the key is copied only for a session not cached yet.
        if !self.sessions.contains_key(key) {
            self.sessions.insert(key.clone(), SessionRows::default());
        }
        let session = self.sessions.get_mut(key).expect("inserted above");
        let before = session.bytes;
        session.insert(first, rows);
        session.used = clock;
        while session.bytes > session_max {
            let Some((_, mut oldest)) = session.runs.pop_first() else {
                break;
            };
            while session.bytes > session_max
                && let Some(row) = oldest.pop_front()
            {
                session.bytes -= charge(&row);
            }
            if let Some(seq) = oldest.front().map(|row| row.seq) {
                session.runs.insert(seq, oldest);
            }
        }
        self.bytes = self.bytes - before + session.bytes;
    }

    /// Once the cache outgrows `max_bytes`, drops least recently used sessions until it is a
    /// tenth below: one pass over the sessions frees room for many fills, so a cache of many
    /// small sessions does not scan them all on every fill.
    fn evict(&mut self, max_bytes: usize) {
        if self.bytes <= max_bytes {
            return;
        }
        let target = max_bytes - max_bytes / 10;
        // Appends fill the cache from the writer's commit path, so no key is copied here: find
        // the use-clock at or below which sessions go, then drop them in one pass.
        let mut by_age: Vec<(u64, usize)> =
            self.sessions.values().map(|s| (s.used, s.bytes)).collect();
        by_age.sort_unstable_by_key(|&(used, _)| used);
        let mut bytes = self.bytes;
        let mut cutoff = None;
        for (used, session_bytes) in by_age {
            if bytes <= target {
                break;
            }
            bytes -= session_bytes;
            cutoff = Some(used);
        }
        let Some(cutoff) = cutoff else {
            return;
        };
        self.sessions.retain(|_, s| s.used > cutoff);
        self.bytes = bytes;
    }
}

#[cfg(test)]
mod tests {
    use sessiondb_core::Message;
    use sessiondb_core::tokens::HeuristicCounter;

    use super::*;

    fn key(session: &str) -> SessionKey {
        SessionKey::new("", session).unwrap()
    }

    fn row(seq: i64) -> StoredMessage {
        Message::text("user", format!("row {seq}"))
            .with_id(format!("m{seq}"))
            .prepare(&HeuristicCounter)
            .stored(seq, None, 1, None)
    }

    fn rows(seqs: impl IntoIterator<Item = i64>) -> Vec<StoredMessage> {
        seqs.into_iter().map(row).collect()
    }

    fn seqs(rows: &[StoredMessage]) -> Vec<i64> {
        rows.iter().map(|r| r.seq).collect()
    }

    /// The session's runs as (first seq, rows).
    fn runs_of(cache: &RowCache, k: &SessionKey) -> Vec<(i64, usize)> {
        lock(&cache.state).sessions[k]
            .runs
            .iter()
            .map(|(&first, run)| (first, run.len()))
            .collect()
    }

    fn cached_bytes(cache: &RowCache) -> usize {
        let state = lock(&cache.state);
        let held: usize = state
            .sessions
            .values()
            .flat_map(|s| s.runs.values().flatten())
            .map(charge)
            .sum();
        assert_eq!(
            state.bytes,
            state.sessions.values().map(|s| s.bytes).sum::<usize>()
        );
        held
    }

    #[test]
    fn windows_read_in_either_direction_join_into_one_run() {
        let cache = RowCache::new(usize::MAX);
        let k = key("s");
        let g = cache.generation();
        cache.fill(&k, g, &rows(1..=50));
        cache.fill(&k, g, &rows(51..=100));
        cache.fill(&k, g, &rows((197..=200).rev()));
        cache.fill(&k, g, &rows((151..=196).rev()));
        assert_eq!(runs_of(&cache, &k), [(1, 100), (151, 50)]);
        assert_eq!(cached_bytes(&cache), lock(&cache.state).bytes);
    }

    #[test]
    fn rows_already_held_are_not_filled_again_and_overlaps_still_join() {
        let cache = RowCache::new(usize::MAX);
        let k = key("s");
        let g = cache.generation();
        cache.fill(&k, g, &rows(1..=100));
        let held = |cache: &RowCache| {
            let state = lock(&cache.state);
            let run = &state.sessions[&k].runs[&1];
            (run.len(), std::ptr::from_ref(&*run[49]))
        };
        let before = held(&cache);
        // A walk's read: a held stretch and a row beyond the run.
        cache.fill(&k, g, &rows((40..=60).chain([102])));
        assert_eq!(runs_of(&cache, &k), [(1, 100), (102, 1)]);
        assert_eq!(held(&cache), before, "the held rows stay as they were");
        // A stretch that reaches past the run still joins it.
        cache.fill(&k, g, &rows(95..=101));
        assert_eq!(runs_of(&cache, &k), [(1, 102)]);
        assert_eq!(cached_bytes(&cache), lock(&cache.state).bytes);
    }

    #[test]
    fn a_range_is_answered_only_when_one_run_covers_what_the_database_would_return() {
        let cache = RowCache::new(usize::MAX);
        let k = key("s");
        cache.fill(&k, cache.generation(), &rows(10..=20));
        let all = |from, last, max_rows| cache.range(&k, from, last, max_rows, u64::MAX);
        assert_eq!(
            seqs(&all(10, 20, 50).unwrap()),
            (10..=20).collect::<Vec<_>>()
        );
        assert_eq!(seqs(&all(12, 14, 50).unwrap()), [12, 13, 14]);
        // The rows after 20 are unknown, unless the limit stops the read inside the run.
        assert!(all(15, 30, 50).is_none());
        assert_eq!(seqs(&all(15, 30, 3).unwrap()), [15, 16, 17]);
        assert!(all(5, 20, 50).is_none());
        // The byte budget stops as the database's read does, never before the first row.
        let one = row(10).bytes;
        assert_eq!(cache.range(&k, 10, 20, 50, one * 2).unwrap().len(), 2);
        assert_eq!(cache.range(&k, 10, 20, 50, 1).unwrap().len(), 1);

        let newest = |first, last, max_rows| cache.range_newest(&k, first, last, max_rows);
        assert_eq!(seqs(&newest(1, 20, 4).unwrap()), [20, 19, 18, 17]);
        assert_eq!(seqs(&newest(18, 20, 50).unwrap()), [20, 19, 18]);
        assert!(newest(1, 20, 50).is_none());
        assert!(newest(1, 25, 2).is_none());
        assert_eq!(newest(10, 20, 50).unwrap(), rows((10..=20).rev()));
    }

    #[test]
    fn appends_extend_runs_and_other_writes_drop_the_session() {
        let cache = RowCache::new(usize::MAX);
        let (k, other) = (key("s"), key("t"));
        cache.fill(&k, cache.generation(), &rows(1..=3));
        cache.fill(&other, cache.generation(), &rows(1..=3));
        let appended = |seq| WriteOutcome::Appended {
            message: row(seq),
            inserted: true,
        };
        cache.committed(&k, &[appended(4)]);
        assert_eq!(
            seqs(&cache.range(&k, 1, 4, 50, u64::MAX).unwrap()),
            [1, 2, 3, 4]
        );
        // A seq after a gap starts a run of its own: what lies between is unknown.
        cache.committed(&k, &[appended(6)]);
        assert_eq!(seqs(&cache.range(&k, 6, 6, 50, u64::MAX).unwrap()), [6]);
        assert!(cache.range(&k, 1, 6, 50, u64::MAX).is_none());
        // A session nothing was read from is cached from its first append on.
        let fresh = key("u");
        cache.committed(&fresh, &[appended(1), appended(2)]);
        assert_eq!(
            seqs(&cache.range(&fresh, 1, 2, 50, u64::MAX).unwrap()),
            [1, 2]
        );

        let before = cache.generation();
        cache.committed(&k, &[WriteOutcome::Updated(UpdateOutcome::Changed(row(2)))]);
        assert!(cache.range(&k, 1, 4, 50, u64::MAX).is_none());
        assert!(cache.range(&other, 1, 3, 50, u64::MAX).is_some());
        // A read whose snapshot may predate that write fills nothing.
        cache.fill(&k, before, &rows(1..=4));
        assert!(cache.range(&k, 1, 4, 50, u64::MAX).is_none());
        cache.fill(&k, cache.generation(), &rows(1..=4));
        assert!(cache.range(&k, 1, 4, 50, u64::MAX).is_some());
        // Writes that leave stored rows as they are keep the cache.
        cache.committed(&k, &[WriteOutcome::StatePut, WriteOutcome::CompactionAdded]);
        assert!(cache.range(&k, 1, 4, 50, u64::MAX).is_some());
        for dropping in [
            WriteOutcome::Deleted { count: 1 },
            WriteOutcome::Cleared,
            WriteOutcome::Imported(Some(row(9))),
            WriteOutcome::Existed(true),
        ] {
            cache.fill(&k, cache.generation(), &rows(1..=4));
            cache.committed(&k, &[dropping]);
            assert!(cache.range(&k, 1, 4, 50, u64::MAX).is_none());
        }
        assert_eq!(cached_bytes(&cache), lock(&cache.state).bytes);
    }

    #[test]
    fn overlapping_reads_merge_and_the_least_recently_used_session_goes_first() {
        let charged = |seqs: &[std::ops::RangeInclusive<i64>]| -> usize {
            seqs.iter()
                .flat_map(|r| rows(r.clone()))
                .map(|r| charge(&r))
                .sum()
        };
        // Room for 4 × 24 rows, each session for 24.
        let cache = RowCache::new(charged(&[1..=24]) * 4);
        let sessions: Vec<SessionKey> = (0..6).map(|i| key(&format!("s{i}"))).collect();
        cache.fill(&sessions[0], cache.generation(), &rows(1..=10));
        cache.fill(&sessions[0], cache.generation(), &rows(5..=14));
        // Out of order and with a gap: two runs.
        cache.fill(&sessions[1], cache.generation(), &rows([3, 1, 2, 7]));
        assert_eq!(cached_bytes(&cache), charged(&[1..=14, 1..=3, 7..=7]));
        assert_eq!(
            seqs(&cache.range(&sessions[1], 1, 3, 50, u64::MAX).unwrap()),
            [1, 2, 3]
        );
        assert!(cache.range(&sessions[1], 1, 7, 50, u64::MAX).is_none());
        for session in &sessions[2..] {
            cache.fill(session, cache.generation(), &rows(1..=20));
        }
        // Session 0 was used least recently: the others' rows pushed it out.
        assert!(cache.range(&sessions[0], 1, 14, 50, u64::MAX).is_none());
        assert!(cache.range(&sessions[1], 1, 3, 50, u64::MAX).is_some());
        assert_eq!(
            cached_bytes(&cache),
            charged(&[1..=3, 7..=7]) + 4 * charged(&[1..=20])
        );
    }

    #[test]
    fn reads_fill_a_session_up_to_its_share_and_appends_keep_its_newest_rows() {
        let share = (1..=24).map(|seq| charge(&row(seq))).sum::<usize>();
        let cache = RowCache::new(share * 4);
        let k = key("s");
        for window in 0..4 {
            let first = 1 + window * 10;
            cache.fill(&k, cache.generation(), &rows(first..=first + 9));
        }
        let cached = |cache: &RowCache| -> Vec<i64> {
            let state = lock(&cache.state);
            state.sessions[&k]
                .runs
                .values()
                .flatten()
                .map(|r| r.seq)
                .collect()
        };
        // The third window no longer fitted: the stream stopped filling there.
        assert_eq!(cached(&cache), (1..=20).collect::<Vec<_>>());
        for seq in 21..=40 {
            let appended = WriteOutcome::Appended {
                message: row(seq),
                inserted: true,
            };
            cache.committed(&k, &[appended]);
        }
        let kept = cached(&cache);
        assert_eq!(kept.last(), Some(&40));
        assert!(kept.len() > 15 && kept.len() <= 24, "kept {kept:?}");
        assert!(kept.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(cached_bytes(&cache) <= share);
    }
}

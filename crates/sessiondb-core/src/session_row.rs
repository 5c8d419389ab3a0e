//! The session row as a write request keeps it: loaded once per request, changed by each op,
//! saved once at its end. Its rules (how the active leaf, the counts and the aggregates of the
//! active path follow appends, updates, deletes and clears) are the same for every backend;
//! a backend only loads and saves the row and fetches what a rule needs from its tables.

use crate::plan::PathTotals;
use crate::{MAX_PATH_ROWS, SessionRecord, StoreError};

/// A session's row, with what this request has changed.
#[derive(Debug, Clone)]
pub struct SessionRow {
    /// The row exists in the store (false until a request creates it).
    pub stored: bool,
    /// This request changed the row: it is saved at the end.
    pub dirty: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_message_at: Option<i64>,
    /// The seq the next new row takes; seqs are never reused.
    pub next_seq: i64,
    pub leaf_id: Option<String>,
    pub leaf_seq: Option<i64>,
    /// Aggregates of the active (capped) path.
    pub path: PathTotals,
    /// Moves whenever a write may change the path totals of rows below another (interior
    /// updates, deletes, adopted orphans). A backend that stores each row's path totals with the
    /// epoch they were computed in knows them valid while the two match; one that keeps no
    /// per-row totals need not store it.
    pub path_epoch: i64,
    pub stored_messages: u64,
    /// Moves with every saved change of the row ([`SessionRow::next_version`]); 0 in a row
    /// stored before versions existed until its next change. An absent row holds the floor its
    /// first version starts above ([`SessionRow::absent`]).
    pub version: i64,
    /// The path aggregates no longer describe the active leaf: the backend recomputes them
    /// once before saving.
    pub totals_stale: bool,
    /// The registry record, loaded only by requests that change it; saved when `Some`.
    pub record: Option<SessionRecord>,
}

/// How the active path takes a new row ([`SessionRow::extend_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathGrowth {
    /// The row extends the active path, whose aggregates now count it.
    Extended,
    /// The row extends a full active path: its head must drop out ([`PathTotals::slide`]).
    Full,
    /// The row starts a branch or a new root.
    Elsewhere,
}

impl SessionRow {
    /// A session that has no row (yet). `deleted_version` is the highest version a deleted
    /// session of its namespace had (0 when none was deleted): the backend keeps it for the
    /// namespace ([`crate::write_rules::WriteTx::delete_session`]), and the row's first version
    /// starts above it, so a session deleted and created again never repeats a version its
    /// earlier self had, whatever the clock did in between.
    pub fn absent(now: i64, deleted_version: i64) -> Self {
        SessionRow {
            stored: false,
            dirty: false,
            created_at: now,
            updated_at: now,
            last_message_at: None,
            next_seq: 1,
            leaf_id: None,
            leaf_seq: None,
            path: PathTotals::EMPTY,
            path_epoch: 0,
            stored_messages: 0,
            version: deleted_version,
            totals_stale: false,
            record: None,
        }
    }

    /// The version a change of the row saved at `now` gives it: one more than before (for a new
    /// row, than its namespace's deletion floor: [`SessionRow::absent`]), and at least `now` ×
    /// 1,000 (the time in microseconds, to the millisecond). Versions thus grow with every change
    /// of one session, and a version names one state of a session, so a reader that kept what it
    /// read at a version may keep using it while the version holds. The time floor keeps
    /// versions of unrelated sessions apart; they stay below 2^53, exact as JSON numbers in
    /// every language, until the year 2255.
    pub fn next_version(&self, now: i64) -> i64 {
        (self.version + 1).max(now.max(0).saturating_mul(1000))
    }

    /// True when the session has a row or this request creates one.
    pub fn exists(&self) -> bool {
        self.stored || self.dirty
    }

    pub fn touch(&mut self, now: i64) {
        self.dirty = true;
        self.updated_at = self.updated_at.max(now);
    }

    /// Refuses a new row once the session holds `max_messages`.
    pub fn check_quota(&self, max_messages: Option<u64>) -> Result<(), StoreError> {
        match max_messages {
            Some(limit) if self.stored_messages >= limit => {
                Err(StoreError::QuotaExceeded { limit })
            }
            _ => Ok(()),
        }
    }

    /// First step of adding a row (seq `next_seq`, of `size` tokens and bytes) under
    /// `parent_seq`: counts it in the active path's aggregates when it extends that path and the
    /// path has room. Then [`SessionRow::add_leaf`].
    pub fn extend_path(
        &mut self,
        parent_seq: Option<i64>,
        (tokens, bytes): (u64, u64),
    ) -> PathGrowth {
        if parent_seq != self.leaf_seq || self.totals_stale {
            return PathGrowth::Elsewhere;
        }
        if self.path.extend(self.next_seq, tokens, bytes) {
            PathGrowth::Extended
        } else {
            PathGrowth::Full
        }
    }

    /// Records the new row `id` (seq `next_seq`) as the active leaf. `grown`: the active path's
    /// aggregates already count it (extended, or slid past a dropped head). Otherwise `totals`
    /// are those of the row's own path when the backend knows them; unknown (or past the cap)
    /// they are recomputed before saving.
    pub fn add_leaf(&mut self, id: &str, grown: bool, totals: Option<PathTotals>, now: i64) {
        if !grown {
            match totals.filter(|t| t.len as usize <= MAX_PATH_ROWS) {
                Some(totals) => (self.path, self.totals_stale) = (totals, false),
                None => self.totals_stale = true,
            }
        }
        self.leaf_id = Some(id.to_owned());
        self.leaf_seq = Some(self.next_seq);
        self.next_seq += 1;
        self.stored_messages += 1;
        self.touch(now);
    }

    /// Whether the row at `seq` counts in the active path's aggregates, when the row alone tells:
    /// it is the leaf, or the path is dense (exactly the rows from its head's seq on, as a
    /// linear conversation's is). `None` on a branched path, where the path's runs tell
    /// ([`crate::PathRuns::position`]), and when the aggregates are stale anyway.
    pub fn counts_row(&self, seq: i64) -> Option<bool> {
        if self.totals_stale {
            None
        } else if self.leaf_seq == Some(seq) {
            Some(true)
        } else if self.path.dense {
            let from_head = self.path.head_seq.is_some_and(|head| head <= seq);
            Some(from_head && self.leaf_seq.is_some_and(|leaf| seq <= leaf))
        } else {
            None
        }
    }

    /// A row was rewritten, `tokens` and `bytes` larger (or smaller); `counted`: whether it
    /// counts in the active path's aggregates ([`SessionRow::counts_row`]), which are adjusted in
    /// place. Unknown (`None`), they are recomputed before saving.
    pub fn row_changed(&mut self, counted: Option<bool>, (tokens, bytes): (i64, i64), now: i64) {
        match counted {
            Some(true) => {
                self.path.tokens = self.path.tokens.saturating_add_signed(tokens);
                self.path.bytes = self.path.bytes.saturating_add_signed(bytes);
            }
            Some(false) => {}
            None => self.totals_stale = true,
        }
        self.touch(now);
    }

    /// `count` rows were deleted, their children spliced onto surviving ancestors (so paths
    /// below them are shorter). When the active leaf was among them, `newest` is the newest
    /// remaining row (id and seq), the new active leaf.
    pub fn rows_deleted(&mut self, count: usize, newest: Option<Option<(String, i64)>>, now: i64) {
        self.stored_messages = self.stored_messages.saturating_sub(count as u64);
        self.path_epoch += 1;
        if let Some(newest) = newest {
            self.leaf_seq = newest.as_ref().map(|(_, seq)| *seq);
            self.leaf_id = newest.map(|(id, _)| id);
        }
        self.totals_stale = true;
        self.touch(now);
    }

    /// Every message was deleted; the session itself stays.
    pub fn cleared(&mut self, now: i64) {
        if !self.stored {
            return;
        }
        self.leaf_id = None;
        self.leaf_seq = None;
        self.path = PathTotals::EMPTY;
        self.stored_messages = 0;
        self.totals_stale = false;
        self.touch(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_leaf(rows: u64) -> SessionRow {
        let mut row = SessionRow::absent(1, 0);
        for n in 0..rows {
            let parent = row.leaf_seq;
            let grown = row.extend_path(parent, (10, 100)) == PathGrowth::Extended;
            let root = PathTotals::lone_root(row.next_seq, 10, 100);
            row.add_leaf(&format!("m{n}"), grown, Some(root), 1);
        }
        row
    }

    #[test]
    fn appends_at_the_leaf_count_in_the_active_path() {
        let row = with_leaf(3);
        assert_eq!(
            (row.path.len, row.path.tokens, row.path.bytes),
            (3, 30, 300)
        );
        assert_eq!(
            (row.leaf_id.as_deref(), row.leaf_seq),
            (Some("m2"), Some(3))
        );
        assert_eq!((row.next_seq, row.stored_messages), (4, 3));
        assert_eq!(row.path.head_seq, Some(1));
        assert!(!row.totals_stale && row.dirty && !row.stored);
    }

    #[test]
    fn a_branch_takes_known_totals_or_goes_stale() {
        let mut row = with_leaf(3);
        assert_eq!(row.extend_path(Some(1), (5, 50)), PathGrowth::Elsewhere);
        let branch = PathTotals {
            len: 2,
            tokens: 15,
            bytes: 150,
            ..PathTotals::EMPTY
        };
        row.add_leaf("b", false, Some(branch), 2);
        assert_eq!(row.path, branch);
        assert_eq!(row.leaf_seq, Some(4));
        row.add_leaf("c", false, None, 2);
        assert!(row.totals_stale);
        // A stale path takes nothing at its leaf: it is recomputed whole.
        assert_eq!(row.extend_path(Some(5), (1, 1)), PathGrowth::Elsewhere);
    }

    #[test]
    fn a_full_path_asks_for_its_head_to_slide() {
        let mut row = with_leaf(1);
        row.path.len = MAX_PATH_ROWS as u64;
        assert_eq!(row.extend_path(row.leaf_seq, (1, 1)), PathGrowth::Full);
        assert_eq!(row.path.len, MAX_PATH_ROWS as u64);
    }

    #[test]
    fn updates_adjust_the_leaf_and_a_linear_path_and_stale_a_branched_one() {
        let mut row = with_leaf(3);
        assert_eq!(row.counts_row(3), Some(true));
        row.row_changed(Some(true), (-5, 20), 7);
        assert_eq!((row.path.tokens, row.path.bytes), (25, 320));
        assert_eq!(row.updated_at, 7);
        // A linear path is every row from its head on: an interior row counts in it.
        row.path.dense = true;
        assert_eq!(row.counts_row(1), Some(true));
        row.row_changed(Some(true), (1, 1), 8);
        assert_eq!((row.path.tokens, row.path.bytes), (26, 321));
        // A row before a capped path's head does not.
        row.path.head_seq = Some(2);
        assert_eq!(row.counts_row(1), Some(false));
        row.row_changed(Some(false), (1, 1), 8);
        assert_eq!(
            (row.path.tokens, row.path.bytes, row.totals_stale),
            (26, 321, false)
        );
        // On a branched path the row alone cannot tell; unknown, the totals go stale.
        row.path.dense = false;
        assert_eq!(row.counts_row(2), None);
        row.row_changed(None, (1, 1), 9);
        assert!(row.totals_stale);
        assert_eq!(row.counts_row(3), None);
    }

    #[test]
    fn deletes_move_the_epoch_and_the_leaf() {
        let mut row = with_leaf(3);
        row.rows_deleted(1, None, 2);
        assert_eq!((row.stored_messages, row.path_epoch), (2, 1));
        assert_eq!(row.leaf_seq, Some(3));
        row.rows_deleted(1, Some(Some(("m0".into(), 1))), 2);
        assert_eq!(
            (row.leaf_id.as_deref(), row.leaf_seq),
            (Some("m0"), Some(1))
        );
        row.rows_deleted(1, Some(None), 2);
        assert_eq!(
            (row.leaf_id, row.leaf_seq, row.stored_messages),
            (None, None, 0)
        );
        assert!(row.totals_stale);
    }

    #[test]
    fn clearing_keeps_the_session_and_its_seqs() {
        let mut row = with_leaf(2);
        row.stored = true;
        row.cleared(9);
        assert_eq!(
            (row.leaf_id, row.path, row.stored_messages),
            (None, PathTotals::EMPTY, 0)
        );
        assert_eq!((row.next_seq, row.updated_at), (3, 9));
        let mut absent = SessionRow::absent(1, 0);
        absent.cleared(9);
        assert!(!absent.dirty);
    }

    #[test]
    fn the_quota_counts_stored_rows() {
        let row = with_leaf(2);
        assert!(row.check_quota(None).is_ok() && row.check_quota(Some(3)).is_ok());
        assert!(matches!(
            row.check_quota(Some(2)),
            Err(StoreError::QuotaExceeded { limit: 2 })
        ));
    }
}

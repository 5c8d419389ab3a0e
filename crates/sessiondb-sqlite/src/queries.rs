//! Read queries, shared by the reader pool and the writer (which reads inside its transaction).
//!
//! Messages are keyed by `k`, the session's number times 2^32 plus the row's seq (schema 13), so
//! a session's rows are one range of keys in seq order ([`SessionRange`]). A path is found by
//! scanning that range downwards from the leaf's seq and following `parent_seq` (the row's
//! columns are read, its content is skipped): parents always have lower seqs except for
//! out-of-order imports, so a linear conversation is one range scan and a branch point costs at
//! most one extra seek.

use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, Row, params};
use sessiondb_core::message::{MessageId, StoredRow, role_of};
pub(crate) use sessiondb_core::plan::PathTotals;
use sessiondb_core::plan::{SuffixBudget, linear_range};
pub(crate) use sessiondb_core::write_rules::Location;
use sessiondb_core::{
    MAX_PATH_ROWS, PathPlan, PathRows, PathRuns, PathSuffix, PlanRow, RangeTotals, RowStat,
    RunsFromLeaf, SearchFilter, SearchHit, SessionKey, SessionStats, StoreError, StoredMessage,
    search,
};

use crate::backend_error;

type Result<T> = std::result::Result<T, StoreError>;

/// The highest seq a row can have: the low 32 bits of its key.
pub(crate) const MAX_SEQ: i64 = (1 << 32) - 1;

/// A session's rows in `messages`: the keys `first..=first + MAX_SEQ`, where `first` is the
/// session's number (`sessions.number`) times 2^32. A session without a `sessions` row has the
/// number 0, whose range holds no rows, so every query of it finds nothing.
///
/// Seqs start at 1, so the range's first key never holds a row. The keys of a caller's seqs are
/// computed here, never in SQL: a seq (say `i64::MAX` for "to the end") is clamped to the range,
/// where SQL arithmetic would overflow into a float past the session's last key. (Statements over
/// many sessions compute each range from its stored number, which cannot overflow.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionRange<'k> {
    pub key: &'k SessionKey,
    pub first: i64,
}

impl<'k> SessionRange<'k> {
    /// The rows of the session numbered `number`.
    pub fn numbered(key: &'k SessionKey, number: i64) -> Self {
        Self {
            key,
            first: number << 32,
        }
    }

    /// Looks up the session's number.
    pub fn of(conn: &Connection, key: &'k SessionKey) -> Result<Self> {
        let number: Option<i64> = conn
            .prepare_cached("SELECT number FROM sessions WHERE namespace = ?1 AND id = ?2")
            .and_then(|mut stmt| {
                stmt.query_row(params![key.namespace, key.session_id], |r| r.get(0))
                    .optional()
            })
            .map_err(backend_error)?;
        Ok(Self::numbered(key, number.unwrap_or(0)))
    }

    pub fn number(&self) -> i64 {
        self.first >> 32
    }

    pub fn last(&self) -> i64 {
        self.first + MAX_SEQ
    }

    /// The key of the row with `seq`; a seq no row can have gives the range's first key, which
    /// holds no row.
    pub fn k(&self, seq: i64) -> i64 {
        if (1..=MAX_SEQ).contains(&seq) {
            self.first + seq
        } else {
            self.first
        }
    }

    /// The keys from the row with seq `first` to the row with seq `last`, both clamped to the
    /// session's range (`lo > hi` when no seq is in both).
    pub fn keys(&self, first: i64, last: i64) -> (i64, i64) {
        if first > last || last < 1 || first > MAX_SEQ {
            return (self.first + 1, self.first);
        }
        (
            self.first + first.clamp(1, MAX_SEQ),
            self.first + last.clamp(1, MAX_SEQ),
        )
    }
}

/// Every column a [`StoredMessage`] needs, in the order `read_message` reads them.
macro_rules! message_columns {
    () => {
        "id, role, parent_id, seq, created_at, updated_at, token_estimate, content, content_chunks,
         bytes"
    };
}

/// `SELECT` of every column a [`StoredMessage`] needs, as a literal so statements built from it
/// are `&'static str` (no formatting on the read path).
macro_rules! select_messages {
    ($condition:literal) => {
        select_messages!("messages", $condition)
    };
    // `$from` may name an index: without statistics SQLite prefers scanning the whole session
    // in seq order over a parent_id look-up followed by a sort.
    ($from:literal, $condition:expr) => {
        concat!(
            "SELECT ",
            message_columns!(),
            " FROM ",
            $from,
            " WHERE ",
            $condition
        )
    };
}

/// Rows a path walk skips (other branches) before it seeks straight to the wanted seq.
const MAX_SKIPPED_ROWS: usize = 32;

fn row_fields(row: &Row<'_>) -> rusqlite::Result<(StoredRow, i64, u64)> {
    Ok((
        StoredRow {
            id: row.get_ref(0)?.as_str()?.into(),
            role: role_of(row.get_ref(1)?.as_str()?),
            parent_id: row.get_ref(2)?.as_str_or_null()?.map(MessageId::from),
            seq: row.get(3)?,
            created_at: row.get(4)?,
            updated_at: row.get(5)?,
            token_estimate: row.get::<_, i64>(6)? as u64,
        },
        row.get(8)?,
        row.get::<_, i64>(9)? as u64,
    ))
}

/// Builds the message of a row: the stored text is already the message's JSON.
fn read_message(conn: &Connection, key: &SessionKey, row: &Row<'_>) -> Result<StoredMessage> {
    let (fields, chunks, bytes) = row_fields(row).map_err(backend_error)?;
    let slice0 = row
        .get_ref(7)
        .and_then(|v| v.as_str().map_err(Into::into))
        .map_err(backend_error)?;
    if chunks == 0 {
        // The one copy of the text, straight into the message's shared buffer.
        return Ok(StoredMessage::from_stored(fields, slice0, bytes));
    }
    let json = reassemble(conn, key, &fields.id, slice0.to_owned(), chunks)?;
    Ok(StoredMessage::from_stored(fields, json, bytes))
}

/// The text the full-text index holds for a stored message ([`search::search_text`]), from its
/// slice 0 and continuation count.
pub(crate) fn indexed_text(
    conn: &Connection,
    key: &SessionKey,
    id: &str,
    slice0: String,
    chunks: i64,
) -> Result<String> {
    let body = reassemble(conn, key, id, slice0, chunks)?;
    search::search_text_of_json(&body)
        .map_err(|e| StoreError::Corrupt(format!("message `{id}`: {e}")))
}

/// Appends the continuation slices of a chunked message to its slice 0.
pub(crate) fn reassemble(
    conn: &Connection,
    key: &SessionKey,
    id: &str,
    mut body: String,
    chunks: i64,
) -> Result<String> {
    if chunks == 0 {
        return Ok(body);
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT content FROM message_chunks
              WHERE namespace = ?1 AND session_id = ?2 AND id = ?3 ORDER BY idx",
        )
        .map_err(backend_error)?;
    let mut rows = stmt
        .query(params![key.namespace, key.session_id, id])
        .map_err(backend_error)?;
    let mut found = 0;
    while let Some(row) = rows.next().map_err(backend_error)? {
        let slice: String = row.get(0).map_err(backend_error)?;
        body.push_str(&slice);
        found += 1;
    }
    if found != chunks {
        return Err(StoreError::Corrupt(format!(
            "message `{id}` has {found} of its {chunks} continuation slices"
        )));
    }
    Ok(body)
}

/// Messages of the session selected by `sql` (from `select_messages!`), whose extra
/// placeholders start at `?3`.
fn messages_where(
    conn: &Connection,
    session: &SessionRange<'_>,
    sql: &'static str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<StoredMessage>> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend_error)?;
    let (first, last) = (session.first, session.last());
    let mut all: Vec<&dyn rusqlite::ToSql> = vec![&first, &last];
    all.extend_from_slice(args);
    let mut rows = stmt.query(all.as_slice()).map_err(backend_error)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(backend_error)? {
        out.push(read_message(conn, session.key, row)?);
    }
    Ok(out)
}

/// The row of message `?3` among the session's rows (`?1..=?2`), as a `WHERE` condition over
/// `messages INDEXED BY messages_by_id`. Ids are unique within a session, and the id index's
/// entries carry the key to check the session by.
macro_rules! by_id {
    () => {
        "id = ?3 AND k BETWEEN ?1 AND ?2"
    };
}
pub(crate) use by_id;

pub(crate) fn message(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<Option<StoredMessage>> {
    Ok(messages_where(
        conn,
        session,
        select_messages!("messages INDEXED BY messages_by_id", by_id!()),
        &[&id],
    )?
    .pop())
}

/// The children of message `?3`, as two disjoint parts: the row right after it when that row is
/// its child, and the "detached" children that `messages_by_parent` holds (schema 6). The
/// condition repeats the index's own, so SQLite can use the partial index.
macro_rules! children_of {
    ($columns:expr) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM messages
              WHERE k = (SELECT k + 1 FROM messages INDEXED BY messages_by_id WHERE ",
            by_id!(),
            ")
                AND parent_seq = seq - 1
             UNION ALL
             SELECT ",
            $columns,
            " FROM messages INDEXED BY messages_by_parent
              WHERE parent_id = ?3 AND k BETWEEN ?1 AND ?2
                AND (parent_seq IS NULL OR parent_seq <> seq - 1)"
        )
    };
}

pub(crate) fn children(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<Vec<StoredMessage>> {
    messages_where(
        conn,
        session,
        concat!(children_of!(message_columns!()), " ORDER BY seq"),
        &[&id],
    )
}

pub(crate) fn roots(conn: &Connection, session: &SessionRange<'_>) -> Result<Vec<StoredMessage>> {
    // Roots, and imports whose parent never arrived.
    messages_where(
        conn,
        session,
        select_messages!(
            "messages INDEXED BY messages_roots",
            "k BETWEEN ?1 AND ?2 AND parent_seq IS NULL ORDER BY k"
        ),
        &[],
    )
}

pub(crate) fn locate(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<Option<Location>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT seq, parent_id, parent_seq FROM messages INDEXED BY messages_by_id WHERE ",
            by_id!()
        ))
        .map_err(backend_error)?;
    stmt.query_row(params![session.first, session.last(), id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
    .optional()
    .map_err(backend_error)
}

/// `(id, seq)` of the children of `id`.
pub(crate) fn child_links(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<Vec<(String, i64)>> {
    let mut stmt = conn
        .prepare_cached(children_of!("id, seq"))
        .map_err(backend_error)?;
    stmt.query_map(params![session.first, session.last(), id], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .map_err(backend_error)?
    .collect::<rusqlite::Result<Vec<_>>>()
    .map_err(backend_error)
}

/// Whether a message with `id` exists, and whether rows wait for `id` as their missing parent.
pub(crate) fn id_status(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<(bool, bool)> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT EXISTS (SELECT 1 FROM messages INDEXED BY messages_by_id WHERE ",
            by_id!(),
            "),
                    EXISTS (SELECT 1 FROM messages INDEXED BY messages_by_parent
                             WHERE parent_id = ?3 AND k BETWEEN ?1 AND ?2
                               AND parent_seq IS NULL)"
        ))
        .map_err(backend_error)?;
    stmt.query_row(params![session.first, session.last(), id], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .map_err(backend_error)
}

pub(crate) fn has_children(
    conn: &Connection,
    session: &SessionRange<'_>,
    id: &str,
) -> Result<bool> {
    let mut stmt = conn
        .prepare_cached(concat!(children_of!("1"), " LIMIT 1"))
        .map_err(backend_error)?;
    stmt.exists(params![session.first, session.last(), id])
        .map_err(backend_error)
}

/// `(id, seq)` of the session's newest row.
pub(crate) fn newest(
    conn: &Connection,
    session: &SessionRange<'_>,
) -> Result<Option<(String, i64)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, seq FROM messages WHERE k BETWEEN ?1 AND ?2 ORDER BY k DESC LIMIT 1",
        )
        .map_err(backend_error)?;
    stmt.query_row(params![session.first, session.last()], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .optional()
    .map_err(backend_error)
}

/// The session's active leaf seq with the aggregates of its path.
pub(crate) struct ActiveLeaf {
    pub id: String,
    pub seq: i64,
    pub total_bytes: u64,
    pub capped: bool,
    /// Set when the active path is exactly the rows from this seq on.
    pub dense_from: Option<i64>,
}

pub(crate) fn has_compactions(conn: &Connection, key: &SessionKey) -> Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM compactions WHERE namespace = ?1 AND session_id = ?2)",
    )
    .and_then(|mut stmt| stmt.query_row(params![key.namespace, key.session_id], |r| r.get(0)))
    .map_err(backend_error)
}

pub(crate) fn active_leaf(conn: &Connection, key: &SessionKey) -> Result<Option<ActiveLeaf>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT leaf_id, leaf_seq, path_bytes, path_capped, path_head_seq, path_dense
               FROM sessions WHERE namespace = ?1 AND id = ?2 AND leaf_seq IS NOT NULL",
        )
        .map_err(backend_error)?;
    stmt.query_row(params![key.namespace, key.session_id], |r| {
        let (head, dense): (Option<i64>, bool) = (r.get(4)?, r.get(5)?);
        Ok(ActiveLeaf {
            id: r.get(0)?,
            seq: r.get(1)?,
            total_bytes: r.get::<_, i64>(2)? as u64,
            capped: r.get(3)?,
            dense_from: head.filter(|_| dense),
        })
    })
    .optional()
    .map_err(backend_error)
}

/// One row met by a path walk. Its id and role are read only when asked for.
pub(crate) struct WalkRow<'r> {
    pub seq: i64,
    pub parent_seq: Option<i64>,
    pub bytes: u64,
    pub token_estimate: u64,
    row: &'r Row<'r>,
}

impl WalkRow<'_> {
    pub fn stat(&self) -> Result<RowStat> {
        Ok(RowStat {
            seq: self.seq,
            id: self.row.get(2).map_err(backend_error)?,
            role: self.row.get(3).map_err(backend_error)?,
            bytes: self.bytes,
            token_estimate: self.token_estimate,
        })
    }
}

/// Visits the path from the row with seq `start` towards the root, leaf first, until `visit`
/// returns false, the root is reached, or [`MAX_PATH_ROWS`] rows were visited. Returns whether
/// the last visited row still has a parent (the walk was cut short).
pub(crate) fn walk(
    conn: &Connection,
    session: &SessionRange<'_>,
    start: i64,
    mut visit: impl FnMut(&WalkRow<'_>) -> Result<bool>,
) -> Result<bool> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, parent_seq, id, role, bytes, token_estimate FROM messages
              WHERE k BETWEEN ?1 AND ?2 ORDER BY k DESC",
        )
        .map_err(backend_error)?;
    let mut wanted = start;
    let mut visited = 0;
    'seek: loop {
        let mut rows = stmt.query(session.keys(1, wanted)).map_err(backend_error)?;
        let mut skipped = 0;
        while let Some(row) = rows.next().map_err(backend_error)? {
            let seq: i64 = row.get(0).map_err(backend_error)?;
            if seq > wanted {
                skipped += 1;
                if skipped > MAX_SKIPPED_ROWS {
                    continue 'seek;
                }
                continue;
            }
            if seq < wanted {
                return Ok(false); // the wanted row does not exist
            }
            let parent_seq: Option<i64> = row.get(1).map_err(backend_error)?;
            let walk_row = WalkRow {
                seq,
                parent_seq,
                bytes: row.get::<_, i64>(4).map_err(backend_error)? as u64,
                token_estimate: row.get::<_, i64>(5).map_err(backend_error)? as u64,
                row,
            };
            visited += 1;
            if !visit(&walk_row)? || visited == MAX_PATH_ROWS {
                return Ok(parent_seq.is_some());
            }
            match parent_seq {
                None => return Ok(false),
                Some(parent) => {
                    wanted = parent;
                    skipped = 0;
                    if parent > seq {
                        continue 'seek; // an out-of-order import: seek back up
                    }
                }
            }
        }
        return Ok(false);
    }
}

/// The seq of `leaf`, or of the active leaf when `None`.
pub(crate) fn leaf_seq(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: Option<&str>,
) -> Result<Option<i64>> {
    match leaf {
        Some(id) => Ok(locate(conn, session, id)?.map(|(seq, _, _)| seq)),
        None => Ok(active_leaf(conn, session.key)?.map(|a| a.seq)),
    }
}

pub(crate) fn path(conn: &Connection, session: &SessionRange<'_>, leaf: i64) -> Result<PathRows> {
    let mut rows = Vec::new();
    let capped = walk(conn, session, leaf, |r| {
        rows.push(r.stat()?);
        Ok(true)
    })?;
    rows.reverse();
    Ok(PathRows { rows, capped })
}

/// The path ending at `leaf` as runs of consecutive seqs (see [`PathRuns`]), found with one seek
/// of `messages_detached` per run: every row between a detached row and the next one continues
/// the row before it.
pub(crate) fn path_runs(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: Option<&str>,
    ids: &[String],
) -> Result<PathRuns> {
    let located = ids
        .iter()
        .map(|id| Ok(locate(conn, session, id)?.map(|(seq, _, _)| seq)))
        .collect::<Result<_>>()?;
    // No shortcut through the session row's dense range: it may hold gaps left by deletes,
    // while runs are consecutive seqs (positions count rows).
    Ok(runs_from(conn, session, leaf_seq(conn, session, leaf)?)?.finish(located))
}

/// The runs of the path ending at the row `leaf` (none for `None`).
pub(crate) fn runs_from(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: Option<i64>,
) -> Result<RunsFromLeaf> {
    let mut runs = RunsFromLeaf::default();
    let mut next = leaf;
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, parent_seq FROM messages INDEXED BY messages_detached
              WHERE k BETWEEN ?1 AND ?2
                AND (parent_seq IS NULL OR parent_seq <> seq - 1)
              ORDER BY k DESC LIMIT 1",
        )
        .map_err(backend_error)?;
    while let Some(top) = next {
        let (head, parent): (i64, Option<i64>) = stmt
            .query_row(session.keys(1, top), |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(backend_error)?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("no row starts the path run ending at seq {top}"))
            })?;
        next = runs.push(top, head, parent);
    }
    Ok(runs)
}

/// How to read the path ending at `leaf` (the active leaf when `None`) forward.
pub(crate) fn path_plan(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: Option<&str>,
) -> Result<PathPlan> {
    if has_compactions(conn, session.key)? {
        return Ok(PathPlan::Overlaid);
    }
    let active = active_leaf(conn, session.key)?;
    if let Some(a) = &active
        && let Some(first) = a.dense_from
        && leaf.is_none_or(|l| l == a.id)
    {
        return Ok(PathPlan::Range { first, last: a.seq });
    }
    let start = match leaf {
        None => active.map(|a| a.seq),
        Some(id) => locate(conn, session, id)?.map(|(seq, _, _)| seq),
    };
    Ok(PathPlan::Rows(match start {
        Some(seq) => path_rows_plan(conn, session, seq)?,
        None => Vec::new(),
    }))
}

fn path_rows_plan(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: i64,
) -> Result<Vec<PlanRow>> {
    let mut rows = Vec::new();
    walk(conn, session, leaf, |r| {
        rows.push(PlanRow {
            seq: r.seq,
            bytes: r.bytes,
        });
        Ok(true)
    })?;
    rows.reverse();
    Ok(rows)
}

/// Totals of the path ending at `leaf`, which must be the session's newest row for `dense` to
/// mean anything.
pub(crate) fn path_totals(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: i64,
) -> Result<PathTotals> {
    let mut totals = PathTotals::default();
    let mut ascending = true;
    totals.capped = walk(conn, session, leaf, |r| {
        totals.len += 1;
        totals.tokens += r.token_estimate;
        totals.bytes += r.bytes;
        totals.head_seq = Some(r.seq);
        ascending &= r.parent_seq.is_none_or(|p| p < r.seq);
        Ok(true)
    })?;
    if let (true, Some(head)) = (ascending, totals.head_seq) {
        let mut stmt = conn
            .prepare_cached("SELECT count(*) FROM messages WHERE k BETWEEN ?1 AND ?2")
            .map_err(backend_error)?;
        let rows: i64 = stmt
            .query_row(session.keys(head, MAX_SEQ), |r| r.get(0))
            .map_err(backend_error)?;
        totals.dense = rows as u64 == totals.len;
    }
    Ok(totals)
}

/// The stored totals of the path ending at the row with `seq`, with the epoch they belong to.
pub(crate) fn stored_path_totals(
    conn: &Connection,
    session: &SessionRange<'_>,
    seq: i64,
) -> Result<Option<(PathTotals, i64)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT path_len, path_tokens, path_bytes, path_epoch FROM messages
              WHERE k = ?1 AND path_epoch IS NOT NULL",
        )
        .map_err(backend_error)?;
    stmt.query_row(params![session.k(seq)], |r| {
        Ok((
            PathTotals {
                len: r.get::<_, i64>(0)? as u64,
                tokens: r.get::<_, i64>(1)? as u64,
                bytes: r.get::<_, i64>(2)? as u64,
                capped: false,
                head_seq: None,
                dense: false,
            },
            r.get(3)?,
        ))
    })
    .optional()
    .map_err(backend_error)
}

/// Token estimates and bytes summed over each seq range (each within one run of a path). A
/// range whose end rows still carry the session's path epoch is answered from the root → row
/// totals stored on them (two look-ups however long it is); any other range sums its rows.
pub(crate) fn range_totals(
    conn: &Connection,
    session: &SessionRange<'_>,
    ranges: &[(i64, i64)],
) -> Result<Vec<RangeTotals>> {
    let epoch: Option<i64> = conn
        .prepare_cached("SELECT path_epoch FROM sessions WHERE namespace = ?1 AND id = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(
                params![session.key.namespace, session.key.session_id],
                |r| r.get(0),
            )
            .optional()
        })
        .map_err(backend_error)?;
    let mut running = conn
        .prepare_cached(
            "SELECT path_tokens, path_bytes, token_estimate, bytes FROM messages
              WHERE k = ?1 AND path_epoch = ?2",
        )
        .map_err(backend_error)?;
    // (root → row totals, the row's own size) of a row whose stored totals are current.
    let mut current = |seq: i64, epoch: i64| -> Result<Option<(RangeTotals, RangeTotals)>> {
        running
            .query_row(params![session.k(seq), epoch], |r| {
                Ok((totals_at(r, 0)?, totals_at(r, 2)?))
            })
            .optional()
            .map_err(backend_error)
    };
    let mut summed = conn
        .prepare_cached(
            "SELECT coalesce(sum(token_estimate), 0), coalesce(sum(bytes), 0) FROM messages
              WHERE k BETWEEN ?1 AND ?2",
        )
        .map_err(backend_error)?;
    let mut totals = Vec::with_capacity(ranges.len());
    for &(first, last) in ranges {
        let running = match epoch {
            Some(epoch) if first <= last => match (current(first, epoch)?, current(last, epoch)?) {
                // The range is what the path gains from before its first row to its last.
                (Some((to_first, first_row)), Some((to_last, _))) => {
                    let gained = |to_last: u64, own: u64, to_first: u64| {
                        (to_last + own).checked_sub(to_first)
                    };
                    gained(to_last.tokens, first_row.tokens, to_first.tokens)
                        .zip(gained(to_last.bytes, first_row.bytes, to_first.bytes))
                        .map(|(tokens, bytes)| RangeTotals { tokens, bytes })
                }
                _ => None,
            },
            _ => None,
        };
        totals.push(match running {
            Some(found) => found,
            None => summed
                .query_row(session.keys(first, last), |r| totals_at(r, 0))
                .map_err(backend_error)?,
        });
    }
    Ok(totals)
}

/// Tokens and bytes from the columns `column` and `column + 1` of `row`.
fn totals_at(row: &rusqlite::Row<'_>, column: usize) -> rusqlite::Result<RangeTotals> {
    Ok(RangeTotals {
        tokens: row.get::<_, i64>(column)? as u64,
        bytes: row.get::<_, i64>(column + 1)? as u64,
    })
}

/// How far `message_search` runs ahead of the full-text index, in rowids (rows written since the
/// last search, give or take deleted ones).
pub(crate) fn search_backlog(conn: &Connection) -> Result<i64> {
    conn.prepare_cached(concat!(
        "SELECT coalesce((SELECT max(rowid) FROM message_search), 0) - ",
        crate::schema::search_indexed_mark!()
    ))
    .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
    .map_err(backend_error)
}

/// `(id, token_estimate, bytes)` of the row with `seq`.
pub(crate) fn row_size(
    conn: &Connection,
    session: &SessionRange<'_>,
    seq: i64,
) -> Result<Option<(String, u64, u64)>> {
    let mut stmt = conn
        .prepare_cached("SELECT id, token_estimate, bytes FROM messages WHERE k = ?1")
        .map_err(backend_error)?;
    stmt.query_row(params![session.k(seq)], |r| {
        Ok((
            r.get(0)?,
            r.get::<_, i64>(1)? as u64,
            r.get::<_, i64>(2)? as u64,
        ))
    })
    .optional()
    .map_err(backend_error)
}

pub(crate) fn path_suffix(
    conn: &Connection,
    session: &SessionRange<'_>,
    leaf: Option<&str>,
    max_bytes: u64,
) -> Result<PathSuffix> {
    if has_compactions(conn, session.key)? {
        return Ok(PathSuffix {
            overlaid: true,
            ..PathSuffix::default()
        });
    }
    let active = active_leaf(conn, session.key)?;
    let (start, known) = match (leaf, &active) {
        (None, Some(a)) => (a.seq, Some((a.total_bytes, a.capped))),
        (None, None) => return Ok(PathSuffix::default()),
        (Some(id), _) => match locate(conn, session, id)? {
            Some((seq, _, _)) if Some(seq) == active.as_ref().map(|a| a.seq) => {
                (seq, active.as_ref().map(|a| (a.total_bytes, a.capped)))
            }
            Some((seq, _, _)) => (seq, None),
            None => return Ok(PathSuffix::default()),
        },
    };
    let mut budget = SuffixBudget::new(max_bytes);
    let mut rows = Vec::new();
    let mut walked_bytes = 0;
    let mut over_budget = false;
    let more = walk(conn, session, start, |r| {
        walked_bytes += r.bytes;
        if !over_budget && budget.admit(r.bytes) {
            rows.push(PlanRow {
                seq: r.seq,
                bytes: r.bytes,
            });
            return Ok(true);
        }
        over_budget = true;
        // Past the budget, keep walking only to total the path when nothing else knows it.
        Ok(known.is_none())
    })?;
    rows.reverse();
    let (total_bytes, capped) = known.unwrap_or((walked_bytes, more));
    Ok(PathSuffix {
        rows,
        truncated: over_budget || capped || more,
        total_bytes,
        overlaid: false,
    })
}

/// Content of the rows with `seqs`, in that order. An ascending, dense window is read with one
/// range scan; anything else with point reads.
pub(crate) fn fetch(
    conn: &Connection,
    session: &SessionRange<'_>,
    seqs: &[i64],
) -> Result<Vec<StoredMessage>> {
    let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
        return Ok(Vec::new());
    };
    let ascending = seqs.windows(2).all(|w| w[0] < w[1]);
    if ascending && i128::from(last) - i128::from(first) < 2 * seqs.len() as i128 {
        let mut stmt = conn
            .prepare_cached(select_messages!("k BETWEEN ?1 AND ?2 ORDER BY k"))
            .map_err(backend_error)?;
        let mut wanted = seqs.iter().peekable();
        let mut out = Vec::with_capacity(seqs.len());
        let mut rows = stmt
            .query(session.keys(first, last))
            .map_err(backend_error)?;
        while let Some(row) = rows.next().map_err(backend_error)? {
            let seq: i64 = row.get(3).map_err(backend_error)?;
            while wanted.next_if(|&&w| w < seq).is_some() {}
            if wanted.next_if_eq(&&seq).is_some() {
                out.push(read_message(conn, session.key, row)?);
            }
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(seqs.len());
    for seq in seqs {
        out.extend(messages_where(
            conn,
            session,
            select_messages!("k = ?3"),
            &[&session.k(*seq)],
        )?);
    }
    Ok(out)
}

/// One window of a dense path: rows `from..=last` in seq order, at most `max_rows` and
/// `max_bytes` stored bytes (a larger first row alone).
pub(crate) fn fetch_range(
    conn: &Connection,
    session: &SessionRange<'_>,
    from: i64,
    last: i64,
    max_rows: usize,
    max_bytes: u64,
) -> Result<Vec<StoredMessage>> {
    let mut stmt = conn
        .prepare_cached(select_messages!("k BETWEEN ?1 AND ?2 ORDER BY k LIMIT ?3"))
        .map_err(backend_error)?;
    let (first_key, last_key) = session.keys(from, last);
    let mut rows = stmt
        .query(params![first_key, last_key, max_rows as i64])
        .map_err(backend_error)?;
    let mut out = Vec::with_capacity(max_rows.min(64));
    let mut used = 0u64;
    while let Some(row) = rows.next().map_err(backend_error)? {
        let bytes = row.get::<_, i64>(9).map_err(backend_error)? as u64;
        if !out.is_empty() && used + bytes > max_bytes {
            break;
        }
        used += bytes;
        out.push(read_message(conn, session.key, row)?);
    }
    Ok(out)
}

/// Rows `first..=last` newest first, at most `max_rows`.
pub(crate) fn fetch_range_newest(
    conn: &Connection,
    session: &SessionRange<'_>,
    first: i64,
    last: i64,
    max_rows: usize,
) -> Result<Vec<StoredMessage>> {
    let (first_key, last_key) = session.keys(first, last);
    messages_where(
        conn,
        session,
        select_messages!("k BETWEEN ?3 AND ?4 ORDER BY k DESC LIMIT ?5"),
        &[&first_key, &last_key, &(max_rows as i64)],
    )
}

/// The seqs of `from` and its ancestors (at most `limit`), oldest first.
pub(crate) fn ancestor_seqs(
    conn: &Connection,
    session: &SessionRange<'_>,
    from: &str,
    limit: usize,
) -> Result<Vec<i64>> {
    let Some((start, _, _)) = locate(conn, session, from)? else {
        return Ok(Vec::new());
    };
    let mut seqs = Vec::with_capacity(limit.min(256));
    walk(conn, session, start, |r| {
        seqs.push(r.seq);
        Ok(seqs.len() < limit)
    })?;
    seqs.reverse();
    Ok(seqs)
}

pub(crate) fn stats(conn: &Connection, key: &SessionKey) -> Result<SessionStats> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT leaf_id, path_len, path_tokens, path_bytes, stored_messages,
                    EXISTS (SELECT 1 FROM compactions
                             WHERE namespace = ?1 AND session_id = ?2),
                    leaf_seq, path_head_seq, path_dense, version
               FROM sessions WHERE namespace = ?1 AND id = ?2",
        )
        .map_err(backend_error)?;
    Ok(stmt
        .query_row(params![key.namespace, key.session_id], |r| {
            Ok(SessionStats {
                leaf_id: r.get(0)?,
                message_count: r.get::<_, i64>(1)? as u64,
                token_estimate: r.get::<_, i64>(2)? as u64,
                content_bytes: r.get::<_, i64>(3)? as u64,
                stored_messages: r.get::<_, i64>(4)? as u64,
                has_compactions: r.get(5)?,
                linear_range: linear_range(r.get(6)?, r.get(7)?, r.get(8)?),
                version: r.get(9)?,
            })
        })
        .optional()
        .map_err(backend_error)?
        .unwrap_or_default())
}

/// Every word must match (implicit AND), or with `any` one of them (OR). Each word is an FTS5
/// string literal, so nothing in it is syntax; words come from
/// `sessiondb_core::search::query_words` and hold no quotes anyway.
pub(crate) fn match_expression(words: &[String], any: bool) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(if any { " OR " } else { " " })
}

/// The conditions of a [`SearchFilter`] on `s` (`message_search`) and `m` (`messages`), its
/// role, since and until bound as parameters `first`, `first + 1` and `first + 2` (each
/// condition holds when its value is null).
pub(crate) fn search_filter(first: usize) -> String {
    let (role, since, until) = (first, first + 1, first + 2);
    format!(
        "(?{role} IS NULL OR s.role = ?{role}) AND (?{since} IS NULL OR m.created_at >= ?{since})
            AND (?{until} IS NULL OR m.created_at < ?{until})"
    )
}

pub(crate) fn search(
    conn: &Connection,
    session: &SessionRange<'_>,
    words: &[String],
    filter: &SearchFilter,
    limit: usize,
) -> Result<Vec<SearchHit>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT s.message_id, s.role, s.session_id, m.content, m.content_chunks, m.created_at
               FROM message_fts
               JOIN message_search s ON s.rowid = message_fts.rowid
               JOIN messages m INDEXED BY messages_by_id
                 ON m.id = s.message_id AND m.k BETWEEN ?5 AND ?6
              WHERE message_fts MATCH ?1 AND s.namespace = ?2 AND s.session_id = ?3
                AND {}
              ORDER BY bm25(message_fts), m.k
              LIMIT ?4",
            search_filter(7)
        )
    });
    let mut stmt = conn.prepare_cached(&SQL).map_err(backend_error)?;
    search_hits(
        conn,
        &session.key.namespace,
        &mut stmt,
        params![
            match_expression(words, filter.match_any),
            session.key.namespace,
            session.key.session_id,
            limit as i64,
            session.first,
            session.last(),
            filter.role,
            filter.since_ms,
            filter.until_ms,
        ],
    )
}

/// The hits of a full-text query in `namespace` whose rows are (message id, role, session id,
/// slice 0, continuation count, created at), each with its text decoded from its message (the
/// index keeps no copy).
pub(crate) fn search_hits(
    conn: &Connection,
    namespace: &str,
    stmt: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<SearchHit>> {
    let rows: Vec<(String, String, String, String, i64, i64)> = stmt
        .query_map(params, |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .and_then(|rows| rows.collect())
        .map_err(backend_error)?;
    rows.into_iter()
        .map(|(id, role, session_id, slice0, chunks, created_at)| {
            let key = SessionKey {
                namespace: namespace.to_owned(),
                session_id,
            };
            Ok(SearchHit {
                content: indexed_text(conn, &key, &id, slice0, chunks)?,
                id,
                role,
                session_id: key.session_id,
                created_at,
            })
        })
        .collect()
}

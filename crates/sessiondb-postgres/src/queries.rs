//! Read queries, shared by reads on a pooled connection and by writes (inside their
//! transaction).
//!
//! A path is walked with one recursive query from the leaf along `parent_seq` (each step a
//! primary-key look-up), capped at [`MAX_PATH_ROWS`] rows; a dense active path (a linear
//! conversation, recorded on the session row) is read as a seq range with no walk at all.

use deadpool_postgres::GenericClient;
pub(crate) use sessiondb_core::plan::PathTotals;
use sessiondb_core::plan::{SuffixBudget, linear_range};
pub(crate) use sessiondb_core::write_rules::Location;
use sessiondb_core::{
    MAX_PATH_ROWS, PathPlan, PathRows, PathRuns, PathSuffix, PlanRow, RangeTotals, RowStat,
    RunsFromLeaf, SearchFilter, SearchHit, SessionKey, SessionStats, StoreError, StoredMessage,
};

use crate::sql::{
    Result, exec, get, lookup, messages, pairs, row, rows, search_filter, search_query,
    search_words,
};

/// `SELECT` of the columns [`crate::sql::message_from_row`] reads, from the session's messages,
/// and a condition.
macro_rules! select_messages {
    ($condition:literal) => {
        concat!(
            "SELECT id, role, parent_id, seq, created_at, updated_at, token_estimate, content,
                    content_chunks, bytes,
                    CASE WHEN content_chunks > 0 THEN ARRAY(
                        SELECT c.content FROM message_chunks c
                         WHERE c.namespace = m.namespace AND c.session_id = m.session_id
                           AND c.id = m.id
                         ORDER BY c.idx)
                    END
               FROM messages m WHERE namespace = $1 AND session_id = $2 AND ",
            $condition
        )
    };
}

pub(crate) async fn message<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    id: &str,
) -> Result<Option<StoredMessage>> {
    let sql = select_messages!("id = $3");
    Ok(messages(c, sql, &[&key.namespace, &key.session_id, &id])
        .await?
        .pop())
}

pub(crate) async fn children<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    id: &str,
) -> Result<Vec<StoredMessage>> {
    let sql = select_messages!("parent_id = $3 ORDER BY seq");
    messages(c, sql, &[&key.namespace, &key.session_id, &id]).await
}

/// Roots, and imports whose parent never arrived, oldest first.
pub(crate) async fn roots<C: GenericClient>(c: &C, key: &SessionKey) -> Result<Vec<StoredMessage>> {
    let sql = select_messages!("parent_seq IS NULL ORDER BY seq");
    messages(c, sql, &[&key.namespace, &key.session_id]).await
}

pub(crate) async fn locate<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    id: &str,
) -> Result<Option<Location>> {
    let found = row(
        c,
        "SELECT seq, parent_id, parent_seq FROM messages
          WHERE namespace = $1 AND session_id = $2 AND id = $3",
        &[&key.namespace, &key.session_id, &lookup(id)],
    )
    .await?;
    found
        .map(|r| Ok((get(&r, 0)?, get(&r, 1)?, get(&r, 2)?)))
        .transpose()
}

/// `(id, seq)` of the children of `id`.
pub(crate) async fn child_links<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    id: &str,
) -> Result<Vec<(String, i64)>> {
    rows(
        c,
        "SELECT id, seq FROM messages WHERE namespace = $1 AND session_id = $2 AND parent_id = $3",
        &[&key.namespace, &key.session_id, &id],
    )
    .await
    .and_then(|found| pairs(&found))
}

/// Whether a message with `id` exists, and whether rows name `id` as their parent.
pub(crate) async fn id_status<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    id: &str,
) -> Result<(bool, bool)> {
    let r = row(
        c,
        "SELECT EXISTS (SELECT 1 FROM messages
                         WHERE namespace = $1 AND session_id = $2 AND id = $3),
                EXISTS (SELECT 1 FROM messages
                         WHERE namespace = $1 AND session_id = $2 AND parent_id = $3)",
        &[&key.namespace, &key.session_id, &id],
    )
    .await?
    .expect("a SELECT without FROM returns one row");
    Ok((get(&r, 0)?, get(&r, 1)?))
}

/// `(id, seq)` of the session's newest row.
pub(crate) async fn newest<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Option<(String, i64)>> {
    row(
        c,
        "SELECT id, seq FROM messages WHERE namespace = $1 AND session_id = $2
          ORDER BY seq DESC LIMIT 1",
        &[&key.namespace, &key.session_id],
    )
    .await?
    .map(|r| Ok((get(&r, 0)?, get(&r, 1)?)))
    .transpose()
}

pub(crate) async fn has_compactions<C: GenericClient>(c: &C, key: &SessionKey) -> Result<bool> {
    Ok(row(
        c,
        "SELECT 1 FROM compactions WHERE namespace = $1 AND session_id = $2 LIMIT 1",
        &[&key.namespace, &key.session_id],
    )
    .await?
    .is_some())
}

/// The session's active leaf with the aggregates of its path.
pub(crate) struct ActiveLeaf {
    pub id: String,
    pub seq: i64,
    /// Set when the active path is exactly the rows from this seq on.
    pub dense_from: Option<i64>,
}

pub(crate) async fn active_leaf<C: GenericClient>(
    c: &C,
    key: &SessionKey,
) -> Result<Option<ActiveLeaf>> {
    let found = row(
        c,
        "SELECT leaf_id, leaf_seq, path_head_seq, path_dense
           FROM sessions WHERE namespace = $1 AND id = $2 AND leaf_seq IS NOT NULL",
        &[&key.namespace, &key.session_id],
    )
    .await?;
    found
        .map(|r| {
            let (head, dense): (Option<i64>, bool) = (get(&r, 2)?, get(&r, 3)?);
            Ok(ActiveLeaf {
                id: get(&r, 0)?,
                seq: get(&r, 1)?,
                dense_from: head.filter(|_| dense),
            })
        })
        .transpose()
}

/// One row of a path walk.
#[derive(Debug, Clone)]
pub(crate) struct WalkRow {
    pub seq: i64,
    pub parent_seq: Option<i64>,
    pub id: String,
    pub role: String,
    pub bytes: u64,
    pub token_estimate: u64,
}

impl WalkRow {
    fn stat(self) -> RowStat {
        RowStat {
            id: self.id,
            seq: self.seq,
            role: self.role,
            bytes: self.bytes,
            token_estimate: self.token_estimate,
        }
    }

    fn plan(&self) -> PlanRow {
        PlanRow {
            seq: self.seq,
            bytes: self.bytes,
        }
    }
}

/// The path from the row with seq `start` towards the root, leaf first, at most `limit` rows
/// (empty when the row does not exist). Each step is a lateral primary-key look-up: as a plain
/// join, a planner without statistics may hash the whole session at every step.
pub(crate) async fn walk<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    start: i64,
    limit: usize,
) -> Result<Vec<WalkRow>> {
    let limit = limit.min(MAX_PATH_ROWS) as i64;
    rows(
        c,
        "WITH RECURSIVE path (seq, parent_seq, id, role, bytes, token_estimate, depth) AS (
             SELECT seq, parent_seq, id, role, bytes, token_estimate, 1::BIGINT FROM messages
              WHERE namespace = $1 AND session_id = $2 AND seq = $3
           UNION ALL
             SELECT m.seq, m.parent_seq, m.id, m.role, m.bytes, m.token_estimate, p.depth + 1
               FROM path p
               CROSS JOIN LATERAL (
                   SELECT seq, parent_seq, id, role, bytes, token_estimate FROM messages
                    WHERE namespace = $1 AND session_id = $2 AND seq = p.parent_seq
               ) m
              WHERE p.depth < $4
         )
         SELECT seq, parent_seq, id, role, bytes, token_estimate FROM path ORDER BY depth",
        &[&key.namespace, &key.session_id, &start, &limit],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(WalkRow {
            seq: get(r, 0)?,
            parent_seq: get(r, 1)?,
            id: get(r, 2)?,
            role: get(r, 3)?,
            bytes: get::<i64>(r, 4)? as u64,
            token_estimate: get::<i64>(r, 5)? as u64,
        })
    })
    .collect()
}

/// Token estimates and bytes summed over each seq range, in one statement.
pub(crate) async fn range_totals<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    ranges: &[(i64, i64)],
) -> Result<Vec<RangeTotals>> {
    let (firsts, lasts): (Vec<i64>, Vec<i64>) = ranges.iter().copied().unzip();
    rows(
        c,
        "SELECT coalesce(sum(m.token_estimate), 0)::BIGINT, coalesce(sum(m.bytes), 0)::BIGINT
           FROM unnest($3::BIGINT[], $4::BIGINT[]) WITH ORDINALITY AS r (first, last, i)
           LEFT JOIN messages m
             ON m.namespace = $1 AND m.session_id = $2 AND m.seq BETWEEN r.first AND r.last
          GROUP BY r.i ORDER BY r.i",
        &[&key.namespace, &key.session_id, &firsts, &lasts],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(RangeTotals {
            tokens: get::<i64>(r, 0)? as u64,
            bytes: get::<i64>(r, 1)? as u64,
        })
    })
    .collect()
}

/// The path ending at `leaf` as runs of consecutive seqs, and the seqs of `ids` (one look-up
/// for all): one recursive statement steps from branch point to branch point
/// (`messages_detached`), so a linear conversation costs one index probe however long it is.
pub(crate) async fn path_runs<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
    ids: &[String],
) -> Result<PathRuns> {
    let found: std::collections::HashMap<String, i64> = rows(
        c,
        "SELECT id, seq FROM messages WHERE namespace = $1 AND session_id = $2 AND id = ANY($3)",
        &[&key.namespace, &key.session_id, &ids],
    )
    .await?
    .iter()
    .map(|r| Ok((get(r, 0)?, get(r, 1)?)))
    .collect::<Result<_>>()?;
    let located = ids.iter().map(|id| found.get(id).copied()).collect();
    Ok(runs_from(c, key, leaf_seq(c, key, leaf).await?)
        .await?
        .finish(located))
}

/// The runs of the path ending at the row `leaf` (none for `None`).
pub(crate) async fn runs_from<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<i64>,
) -> Result<RunsFromLeaf> {
    let mut runs = RunsFromLeaf::default();
    let Some(start) = leaf else {
        return Ok(runs);
    };
    let heads = rows(
        c,
        "WITH RECURSIVE runs (top, head, parent, path_rows) AS (
             SELECT $3::BIGINT, d.seq, d.parent_seq, $3 - d.seq + 1
               FROM (SELECT seq, parent_seq FROM messages
                      WHERE namespace = $1 AND session_id = $2 AND seq <= $3
                        AND (parent_seq IS NULL OR parent_seq <> seq - 1)
                      ORDER BY seq DESC LIMIT 1) d
           UNION ALL
             SELECT r.parent, d.seq, d.parent_seq, r.path_rows + r.parent - d.seq + 1
               FROM runs r
               CROSS JOIN LATERAL (
                   SELECT seq, parent_seq FROM messages
                    WHERE namespace = $1 AND session_id = $2 AND seq <= r.parent
                      AND (parent_seq IS NULL OR parent_seq <> seq - 1)
                    ORDER BY seq DESC LIMIT 1
               ) d
              WHERE r.path_rows < $4
         )
         SELECT top, head, parent FROM runs ORDER BY path_rows",
        &[
            &key.namespace,
            &key.session_id,
            &start,
            &(MAX_PATH_ROWS as i64),
        ],
    )
    .await?;
    let mut expected = Some(start);
    for r in &heads {
        let (top, head, parent): (i64, i64, Option<i64>) = (get(r, 0)?, get(r, 1)?, get(r, 2)?);
        if expected != Some(top) {
            break;
        }
        expected = runs.push(top, head, parent);
    }
    if let Some(top) = expected {
        return Err(StoreError::Corrupt(format!(
            "no row starts the path run ending at seq {top}"
        )));
    }
    Ok(runs)
}

/// Whether a full-length walk stopped while its oldest row still had a parent.
fn walk_capped(walked: &[WalkRow]) -> bool {
    walked.len() == MAX_PATH_ROWS && walked.last().is_some_and(|r| r.parent_seq.is_some())
}

/// The seq of `leaf`, or of the active leaf when `None`.
pub(crate) async fn leaf_seq<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
) -> Result<Option<i64>> {
    match leaf {
        Some(id) => Ok(locate(c, key, id).await?.map(|(seq, _, _)| seq)),
        None => Ok(active_leaf(c, key).await?.map(|a| a.seq)),
    }
}

pub(crate) async fn path<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
) -> Result<PathRows> {
    let Some(start) = leaf_seq(c, key, leaf).await? else {
        return Ok(PathRows::default());
    };
    let walked = walk(c, key, start, MAX_PATH_ROWS).await?;
    let capped = walk_capped(&walked);
    let rows = walked.into_iter().rev().map(WalkRow::stat).collect();
    Ok(PathRows { rows, capped })
}

pub(crate) async fn path_plan<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
) -> Result<PathPlan> {
    if has_compactions(c, key).await? {
        return Ok(PathPlan::Overlaid);
    }
    let active = active_leaf(c, key).await?;
    if let Some(a) = &active
        && let Some(first) = a.dense_from
        && leaf.is_none_or(|l| l == a.id)
    {
        return Ok(PathPlan::Range { first, last: a.seq });
    }
    let start = match leaf {
        None => active.map(|a| a.seq),
        Some(id) => locate(c, key, id).await?.map(|(seq, _, _)| seq),
    };
    let rows = match start {
        Some(seq) => walk(c, key, seq, MAX_PATH_ROWS)
            .await?
            .iter()
            .rev()
            .map(WalkRow::plan)
            .collect(),
        None => Vec::new(),
    };
    Ok(PathPlan::Rows(rows))
}

/// The plan of a read that needs no walk, from one statement: the session has compactions, or
/// the path is the active one and dense, or there is no active path. `None` when a walk is needed.
pub(crate) async fn plan_without_walk<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
) -> Result<Option<PathPlan>> {
    let r = row(
        c,
        "SELECT EXISTS (SELECT 1 FROM compactions WHERE namespace = $1 AND session_id = $2),
                s.leaf_id, s.leaf_seq, s.path_head_seq, s.path_dense
           FROM (SELECT 1) one
           LEFT JOIN sessions s ON s.namespace = $1 AND s.id = $2",
        &[&key.namespace, &key.session_id],
    )
    .await?
    .expect("a SELECT without a filter returns one row");
    if get::<bool>(&r, 0)? {
        return Ok(Some(PathPlan::Overlaid));
    }
    let (leaf_id, leaf_seq): (Option<String>, Option<i64>) = (get(&r, 1)?, get(&r, 2)?);
    let dense_from = get::<Option<i64>>(&r, 3)?.filter(|_| get(&r, 4).unwrap_or(false));
    Ok(match (leaf, leaf_seq) {
        (None, None) => Some(PathPlan::Rows(Vec::new())),
        (Some(wanted), _) if leaf_id.as_deref() != Some(wanted) => None,
        (_, Some(last)) => dense_from.map(|first| PathPlan::Range { first, last }),
        _ => None,
    })
}

/// Totals of the path ending at `leaf`, which must be the session's newest row for `dense` to
/// mean anything.
pub(crate) async fn path_totals<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: i64,
) -> Result<PathTotals> {
    let walked = walk(c, key, leaf, MAX_PATH_ROWS).await?;
    let mut totals = PathTotals {
        len: walked.len() as u64,
        tokens: walked.iter().map(|r| r.token_estimate).sum(),
        bytes: walked.iter().map(|r| r.bytes).sum(),
        capped: walk_capped(&walked),
        head_seq: walked.last().map(|r| r.seq),
        dense: false,
    };
    let ascending = walked
        .iter()
        .all(|r| r.parent_seq.is_none_or(|p| p < r.seq));
    if let (true, Some(head)) = (ascending, totals.head_seq) {
        let count: i64 = get(
            &row(
                c,
                "SELECT count(*) FROM messages
                  WHERE namespace = $1 AND session_id = $2 AND seq >= $3",
                &[&key.namespace, &key.session_id, &head],
            )
            .await?
            .expect("count returns one row"),
            0,
        )?;
        totals.dense = count as u64 == totals.len;
    }
    Ok(totals)
}

/// `(id, token_estimate, bytes)` of the row with `seq`.
pub(crate) async fn row_size<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    seq: i64,
) -> Result<Option<(String, u64, u64)>> {
    row(
        c,
        "SELECT id, token_estimate, bytes FROM messages
          WHERE namespace = $1 AND session_id = $2 AND seq = $3",
        &[&key.namespace, &key.session_id, &seq],
    )
    .await?
    .map(|r| {
        Ok((
            get(&r, 0)?,
            get::<i64>(&r, 1)? as u64,
            get::<i64>(&r, 2)? as u64,
        ))
    })
    .transpose()
}

pub(crate) async fn path_suffix<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    leaf: Option<&str>,
    max_bytes: u64,
) -> Result<PathSuffix> {
    if has_compactions(c, key).await? {
        return Ok(PathSuffix {
            overlaid: true,
            ..PathSuffix::default()
        });
    }
    let Some(start) = leaf_seq(c, key, leaf).await? else {
        return Ok(PathSuffix::default());
    };
    let walked = walk(c, key, start, MAX_PATH_ROWS).await?;
    let mut budget = SuffixBudget::new(max_bytes);
    let mut rows: Vec<PlanRow> = walked
        .iter()
        .take_while(|r| budget.admit(r.bytes))
        .map(WalkRow::plan)
        .collect();
    let over_budget = rows.len() < walked.len();
    rows.reverse();
    Ok(PathSuffix {
        rows,
        truncated: over_budget || walk_capped(&walked),
        total_bytes: walked.iter().map(|r| r.bytes).sum(),
        overlaid: false,
    })
}

/// Content of the rows with `seqs`, in that order; missing rows are skipped.
pub(crate) async fn fetch<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    seqs: &[i64],
) -> Result<Vec<StoredMessage>> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let wanted = seqs.to_vec();
    let sql = select_messages!("seq = ANY($3)");
    let mut found = messages(c, sql, &[&key.namespace, &key.session_id, &wanted]).await?;
    found.sort_unstable_by_key(|m| m.seq);
    let mut out = Vec::with_capacity(seqs.len());
    for seq in seqs {
        if let Ok(i) = found.binary_search_by_key(seq, |m| m.seq) {
            out.push(found[i].clone());
        }
    }
    Ok(out)
}

/// One window of a dense path: rows `from..=last` in seq order, at most `max_rows` and
/// `max_bytes` stored bytes (a larger first row alone).
pub(crate) async fn fetch_range<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    from: i64,
    last: i64,
    max_rows: usize,
    max_bytes: u64,
) -> Result<Vec<StoredMessage>> {
    // Rows past the byte budget are cut by the query, so their content is never transferred;
    // the first row always comes.
    let (limit, budget) = (max_rows as i64, max_bytes.min(i64::MAX as u64) as i64);
    let sql = concat!(
        "SELECT * FROM (
             SELECT limited.*, (sum(limited.bytes) OVER (ORDER BY limited.seq))::BIGINT AS running FROM (",
        select_messages!("seq BETWEEN $3 AND $4 ORDER BY seq LIMIT $5"),
        ") limited) window_rows WHERE running = bytes OR running <= $6 ORDER BY seq"
    );
    messages(
        c,
        sql,
        &[
            &key.namespace,
            &key.session_id,
            &from,
            &last,
            &limit,
            &budget,
        ],
    )
    .await
}

/// Rows `first..=last` newest first, at most `max_rows`.
pub(crate) async fn fetch_range_newest<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    first: i64,
    last: i64,
    max_rows: usize,
) -> Result<Vec<StoredMessage>> {
    let limit = max_rows as i64;
    let sql = select_messages!("seq BETWEEN $3 AND $4 ORDER BY seq DESC LIMIT $5");
    messages(
        c,
        sql,
        &[&key.namespace, &key.session_id, &first, &last, &limit],
    )
    .await
}

/// `from` and its ancestors, at most `limit` messages.
pub(crate) async fn ancestors<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    from: &str,
    limit: usize,
) -> Result<Vec<StoredMessage>> {
    let Some((start, _, _)) = locate(c, key, from).await? else {
        return Ok(Vec::new());
    };
    let seqs: Vec<i64> = walk(c, key, start, limit)
        .await?
        .iter()
        .map(|r| r.seq)
        .collect();
    fetch(c, key, &seqs).await
}

pub(crate) async fn stats<C: GenericClient>(c: &C, key: &SessionKey) -> Result<SessionStats> {
    let found = row(
        c,
        "SELECT leaf_id, path_len, path_tokens, path_bytes, stored_messages,
                EXISTS (SELECT 1 FROM compactions WHERE namespace = $1 AND session_id = $2),
                leaf_seq, path_head_seq, path_dense, version
           FROM sessions WHERE namespace = $1 AND id = $2",
        &[&key.namespace, &key.session_id],
    )
    .await?;
    let Some(r) = found else {
        return Ok(SessionStats::default());
    };
    Ok(SessionStats {
        leaf_id: get(&r, 0)?,
        message_count: get::<i64>(&r, 1)? as u64,
        token_estimate: get::<i64>(&r, 2)? as u64,
        content_bytes: get::<i64>(&r, 3)? as u64,
        stored_messages: get::<i64>(&r, 4)? as u64,
        has_compactions: get(&r, 5)?,
        linear_range: linear_range(get(&r, 6)?, get(&r, 7)?, get(&r, 8)?),
        version: get(&r, 9)?,
    })
}

pub(crate) async fn search<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    words: &[String],
    filter: &SearchFilter,
    limit: usize,
) -> Result<Vec<SearchHit>> {
    let (query, limit) = (search_words(words), limit as i64);
    rows(
        c,
        concat!(
            "SELECT m.id, m.role, m.search_text, m.created_at
               FROM messages m, ",
            search_query!("$3"),
            "
              WHERE m.namespace = $1 AND m.session_id = $2 AND m.search_vector @@ query AND ",
            search_filter!(),
            " ORDER BY ts_rank(m.search_vector, query) DESC, m.seq
              LIMIT $4"
        ),
        &[
            &key.namespace,
            &key.session_id,
            &query,
            &limit,
            &filter.role,
            &filter.since_ms,
            &filter.until_ms,
            &filter.match_any,
        ],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(SearchHit {
            id: get(r, 0)?,
            role: get(r, 1)?,
            content: get(r, 2)?,
            session_id: key.session_id.clone(),
            created_at: get(r, 3)?,
        })
    })
    .collect()
}

/// Deletes rows of `tables` (each keyed by `namespace, session_id`) of one session.
pub(crate) async fn delete_session_rows<C: GenericClient>(
    c: &C,
    key: &SessionKey,
    statements: &[&str],
) -> Result<()> {
    for sql in statements {
        exec(c, sql, &[&key.namespace, &key.session_id]).await?;
    }
    Ok(())
}

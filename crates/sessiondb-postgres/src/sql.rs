//! Statement helpers shared by reads and writes: every statement is prepared once per
//! connection (deadpool's statement cache) and runs on a pooled client or inside a transaction.

use deadpool_postgres::GenericClient;
use sessiondb_core::message::{MessageId, StoredRow, role_of};
use sessiondb_core::{SearchFilter, StoreError, StoredMessage};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

pub(crate) type Result<T> = std::result::Result<T, StoreError>;
pub(crate) type Param<'a> = &'a (dyn ToSql + Sync);

pub(crate) fn backend_error(e: tokio_postgres::Error) -> StoreError {
    let message = format!("postgres: {}", describe(&e));
    if unreachable(&e) {
        return StoreError::Unavailable(message);
    }
    match e.code() {
        Some(&tokio_postgres::error::SqlState::DISK_FULL) => StoreError::StorageFull(message),
        _ => StoreError::Backend(message),
    }
}

/// Whether `e` says the server could not be reached or went away, not that a statement failed:
/// a closed connection, a socket error, or the SQLSTATEs of lost connections (class 08), of a
/// server shutting down, crashed or still starting (57P01–57P03) and of one out of connections
/// (53300).
pub(crate) fn unreachable(e: &tokio_postgres::Error) -> bool {
    use std::io::ErrorKind;
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300");
    }
    std::error::Error::source(e)
        .and_then(|cause| cause.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::NotConnected
                    | ErrorKind::BrokenPipe
                    | ErrorKind::TimedOut
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            )
        })
}

/// An error and its causes on one line, each said once: the pool's message repeats the driver's,
/// and the driver's names only its kind ("error connecting to server") and leaves the reason
/// ("Connection refused") to its source.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// A string a look-up binds. PostgreSQL's `text` cannot hold U+0000, and no stored id, key or
/// user contains a control character (the core refuses them), so a look-up with a NUL names
/// nothing: as U+0001 it still names nothing, where the NUL would fail the statement.
pub(crate) fn lookup(text: &str) -> String {
    text.replace('\0', "\u{1}")
}

/// The conditions of a [`SearchFilter`] on `messages m`, its role, since and until bound as
/// `$5`, `$6` and `$7` (each condition holds when its value is null).
macro_rules! search_filter {
    () => {
        "($5::text IS NULL OR m.role = $5) AND ($6::bigint IS NULL OR m.created_at >= $6)
            AND ($7::bigint IS NULL OR m.created_at < $7)"
    };
}
pub(crate) use search_filter;

/// The `tsquery` of a message search, as a `FROM` item named `query`: the words (parameter
/// `$words`, joined by spaces) all of them, or any of them when `$8` is true. Each word goes
/// through `plainto_tsquery` on its own for the latter, so nothing in one is query syntax either;
/// a word that leaves no lexeme is left out (and with none left, nothing matches).
macro_rules! search_query {
    ($words:literal) => {
        concat!(
            "(SELECT CASE WHEN $8 THEN
                (SELECT string_agg('(' || plainto_tsquery('sessiondb_search', w)::text || ')', ' | ')::tsquery
                   FROM regexp_split_to_table(", $words, ", ' ') w
                  WHERE numnode(plainto_tsquery('sessiondb_search', w)) > 0)
              ELSE plainto_tsquery('sessiondb_search', ", $words, ") END AS query) query"
        )
    };
}
pub(crate) use search_query;

/// `filter` with its role bound as a [`lookup`].
pub(crate) fn looked_up(filter: &SearchFilter) -> SearchFilter {
    SearchFilter {
        role: filter.role.as_deref().map(lookup),
        ..filter.clone()
    }
}

pub(crate) async fn rows<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>> {
    let statement = client.prepare_cached(sql).await.map_err(backend_error)?;
    client
        .query(&statement, params)
        .await
        .map_err(backend_error)
}

pub(crate) async fn row<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Option<Row>> {
    let statement = client.prepare_cached(sql).await.map_err(backend_error)?;
    client
        .query_opt(&statement, params)
        .await
        .map_err(backend_error)
}

pub(crate) async fn exec<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[Param<'_>],
) -> Result<u64> {
    let statement = client.prepare_cached(sql).await.map_err(backend_error)?;
    client
        .execute(&statement, params)
        .await
        .map_err(backend_error)
}

/// The first two columns of each row.
pub(crate) fn pairs<A, B>(rows: &[Row]) -> Result<Vec<(A, B)>>
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
{
    rows.iter().map(|r| Ok((get(r, 0)?, get(r, 1)?))).collect()
}

/// Reads column `idx` of a row, as a typed error when it does not convert.
pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    idx: usize,
) -> Result<T> {
    row.try_get(idx).map_err(backend_error)
}

/// The message of a row selected by `select_messages!` (id, role, parent_id, seq, created_at,
/// updated_at, token_estimate, content, content_chunks, bytes, and the continuation slices).
pub(crate) fn message_from_row(row: &Row) -> Result<StoredMessage> {
    let fields = StoredRow {
        id: get::<&str>(row, 0)?.into(),
        role: role_of(get::<&str>(row, 1)?),
        parent_id: get::<Option<&str>>(row, 2)?.map(MessageId::from),
        seq: get(row, 3)?,
        created_at: get(row, 4)?,
        updated_at: get(row, 5)?,
        token_estimate: get::<i64>(row, 6)? as u64,
    };
    let chunks: i32 = get(row, 8)?;
    let mut json: String = get(row, 7)?;
    if chunks > 0 {
        let slices: Vec<&str> = get(row, 10)?;
        if slices.len() != chunks as usize {
            return Err(StoreError::Corrupt(format!(
                "message `{}` has {} of its {chunks} continuation slices",
                fields.id,
                slices.len()
            )));
        }
        slices.iter().for_each(|slice| json.push_str(slice));
    }
    Ok(StoredMessage::from_stored(
        fields,
        json,
        get::<i64>(row, 9)? as u64,
    ))
}

/// Messages selected by `sql` (from `select_messages!`), in row order. One statement reads each
/// message whole, so a read needs no transaction to see a consistent message.
pub(crate) async fn messages<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<StoredMessage>> {
    rows(client, sql, params)
        .await?
        .iter()
        .map(message_from_row)
        .collect()
}

/// One `tsquery` matching every word: the words are passed as plain text, so nothing in them is
/// query syntax.
pub(crate) fn search_words(words: &[String]) -> String {
    words.join(" ")
}

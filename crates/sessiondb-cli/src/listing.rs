//! `sessiondb sessions`: the namespace's sessions as NDJSON, from the embedded store or from a
//! server with `--url`, page after page.

use std::io::Write;

use anyhow::bail;
use serde_json::Value;
use sessiondb::{Db, MAX_PAGE_SIZE, PageRequest, SessionListing, SessionSort, SqliteStore};

use crate::remote::{Remote, segment};

/// `--sort`: an order under its API name.
pub fn parse_sort(name: &str) -> Result<SessionSort, String> {
    SessionSort::from_name(name)
        .ok_or_else(|| "must be updatedAt, lastMessageAt or createdAt".to_owned())
}

/// Which sessions to print.
pub struct Wanted {
    pub user_id: Option<String>,
    pub sort: SessionSort,
    /// All when `None`.
    pub limit: Option<usize>,
}

/// Prints the sessions `wanted` names, most recent first, one JSON object per line (the objects
/// `GET /v1/sessions` returns), until the listing or the limit ends.
pub async fn print(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    wanted: &Wanted,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    each_page(db, remote, namespace, wanted, |items| {
        for item in items {
            writeln!(out, "{item}")?;
        }
        Ok(())
    })
    .await
}

/// The ids of the sessions `wanted` names, most recent first.
pub async fn ids(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    wanted: &Wanted,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    each_page(db, remote, namespace, wanted, |items| {
        for item in items {
            match item["id"].as_str() {
                Some(id) => ids.push(id.to_owned()),
                None => bail!("a listed session without an id: {item}"),
            }
        }
        Ok(())
    })
    .await?;
    Ok(ids)
}

/// Hands `take` each page of the listing until it or the limit ends.
async fn each_page(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    wanted: &Wanted,
    mut take: impl FnMut(Vec<Value>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut left = wanted.limit.unwrap_or(usize::MAX);
    let mut after = None;
    while left > 0 {
        let limit = left.min(MAX_PAGE_SIZE);
        let (items, next) = match (db, remote) {
            (Some(db), None) => local_page(db, namespace, wanted, limit, after).await?,
            (_, Some(remote)) => remote_page(remote, wanted, limit, after).await?,
            (None, None) => bail!("no store to list"),
        };
        left = left.saturating_sub(items.len());
        take(items)?;
        match next {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    Ok(())
}

type Listed = (Vec<Value>, Option<String>);

async fn local_page(
    db: &Db<SqliteStore>,
    namespace: &str,
    wanted: &Wanted,
    limit: usize,
    after: Option<String>,
) -> anyhow::Result<Listed> {
    let listing = SessionListing {
        page: PageRequest {
            limit: Some(limit),
            descending: true,
            after,
            before: None,
        },
        sort: wanted.sort,
        user_id: wanted.user_id.clone(),
    };
    let page = db.list_sessions(namespace, &listing).await?;
    let items = page
        .items
        .iter()
        .map(sessiondb_server::wire::session)
        .collect();
    Ok((items, page.next_cursor))
}

async fn remote_page(
    remote: &Remote,
    wanted: &Wanted,
    limit: usize,
    after: Option<String>,
) -> anyhow::Result<Listed> {
    let mut url = remote.url(&format!(
        "/v1/sessions?limit={limit}&sort={}",
        wanted.sort.name()
    ));
    if let Some(user) = &wanted.user_id {
        url.push_str(&format!("&userId={}", segment(user)));
    }
    remote.page(&url, after.as_deref()).await
}

//! `sessiondb search`: full-text search in a session, across the namespace or across one user's
//! sessions, on the embedded store or through a server (`--url`), each hit printed as its
//! snippet with the matched words in `**`.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::Value;
use sessiondb::{Db, Highlighter, SearchFilter, SearchHit, SqliteStore};

use crate::remote::{Remote, segment};

/// Where to search.
pub enum Scope {
    Session(String),
    /// The namespace's sessions, or one user's.
    Namespace {
        user_id: Option<String>,
    },
}

/// One search.
pub struct Wanted {
    pub scope: Scope,
    pub query: String,
    pub filter: SearchFilter,
    pub limit: usize,
    pub snippet_words: usize,
}

/// A hit as printed.
struct Shown {
    session_id: String,
    id: String,
    role: String,
    snippet: Vec<String>,
}

/// Prints the hits best first, one per line: `id [role] snippet`, after the session's id when
/// the search went across sessions.
pub async fn print(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    wanted: &Wanted,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let hits = match (db, remote) {
        (_, Some(remote)) => remote_hits(remote, wanted).await?,
        (Some(db), None) => local_hits(db, namespace, wanted).await?,
        (None, None) => bail!("no store to search"),
    };
    for hit in hits {
        if let Scope::Namespace { .. } = wanted.scope {
            write!(out, "{} ", hit.session_id)?;
        }
        let marked: String = (hit.snippet.iter().enumerate())
            .map(|(i, piece)| match i % 2 {
                1 => format!("**{piece}**"),
                _ => piece.clone(),
            })
            .collect();
        writeln!(out, "{} [{}] {marked}", hit.id, hit.role)?;
    }
    Ok(())
}

async fn local_hits(
    db: &Db<SqliteStore>,
    namespace: &str,
    wanted: &Wanted,
) -> anyhow::Result<Vec<Shown>> {
    let (query, filter, limit) = (&wanted.query, &wanted.filter, wanted.limit);
    let hits: Vec<SearchHit> = match &wanted.scope {
        Scope::Session(session) => {
            let session = db.session_in(namespace, session)?;
            session.search_filtered(query, filter, limit).await?
        }
        Scope::Namespace { user_id } => {
            let user_id = user_id.as_deref();
            (db.search_all_filtered(namespace, user_id, query, filter, limit)).await?
        }
    };
    let highlighter = Highlighter::new(query);
    Ok(hits
        .into_iter()
        .map(|hit| Shown {
            snippet: highlighter.snippet(&hit.content, wanted.snippet_words),
            session_id: hit.session_id,
            id: hit.id,
            role: hit.role,
        })
        .collect())
}

async fn remote_hits(remote: &Remote, wanted: &Wanted) -> anyhow::Result<Vec<Shown>> {
    let mut query = format!(
        "q={}&limit={}&snippetWords={}",
        segment(&wanted.query),
        wanted.limit,
        wanted.snippet_words
    );
    let SearchFilter {
        match_any,
        role,
        since_ms,
        until_ms,
    } = &wanted.filter;
    if *match_any {
        query += "&match=any";
    }
    if let Some(role) = role {
        query += &format!("&role={}", segment(role));
    }
    for (name, time) in [("since", since_ms), ("until", until_ms)] {
        if let Some(time) = time {
            query += &format!("&{name}={time}");
        }
    }
    let url = match &wanted.scope {
        Scope::Session(session) => remote.session_url(session, &format!("/search?{query}")),
        Scope::Namespace { user_id } => {
            if let Some(user_id) = user_id {
                query += &format!("&userId={}", segment(user_id));
            }
            remote.url(&format!("/v1/search?{query}"))
        }
    };
    let Value::Array(hits) = remote.get_json(&url).await? else {
        bail!("the server's search answer is not a list");
    };
    hits.into_iter()
        .map(|hit| {
            let text = |field: &str| hit[field].as_str().unwrap_or_default().to_owned();
            Ok(Shown {
                session_id: text("sessionId"),
                id: text("id"),
                role: text("role"),
                snippet: serde_json::from_value(hit["snippet"].clone())
                    .context("the server's search hit has no snippet")?,
            })
        })
        .collect()
}

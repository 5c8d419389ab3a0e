//! The commands on one session (`append`, `history`, `tree`, `search`, `stats`, `delete`), on
//! the embedded store or through a server (`--url`: a running server holds its store, and a
//! PostgreSQL deployment has no other way in). Both print the same lines; `stats` through a
//! server leaves out `storedMessages`, which the API's session object does not carry.

use std::collections::HashSet;
use std::io::Write;

use anyhow::{Context, bail};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use sessiondb::convert::ModelFormat;
use sessiondb::{AppendOptions, HistoryOptions, Message, Parent, Session, SqliteStore};

use crate::remote::{Remote, segment};
use crate::tree::{self, Node};

/// The session a command works on.
pub enum Target<'a> {
    Embedded(Session<SqliteStore>),
    Server { remote: &'a Remote, session: String },
}

impl Target<'_> {
    fn id(&self) -> &str {
        match self {
            Target::Embedded(session) => session.id(),
            Target::Server { session, .. } => session,
        }
    }

    /// Appends `message` under `parent` and prints it as stored (the one already stored under
    /// its id, with a note on standard error, when it exists).
    pub async fn append(
        &self,
        message: Message,
        parent: Parent,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let (inserted, stored) = match self {
            Target::Embedded(session) => {
                let options = AppendOptions {
                    parent,
                    ..Default::default()
                };
                let result = session.append(message, options).await?;
                (result.inserted, result.message.json().to_owned())
            }
            Target::Server { remote, session } => {
                let query = match &parent {
                    Parent::ActiveLeaf => String::new(),
                    Parent::Root => "?parent=".to_owned(),
                    Parent::Id(id) => format!("?parent={}", segment(id)),
                };
                let url = remote.session_url(session, &format!("/messages{query}"));
                let request = remote
                    .request(Method::POST, &url)
                    .json(&message.into_value());
                let answer: Value = remote.send(request).await?.json().await?;
                (
                    answer["inserted"] == json!(true),
                    answer["message"].to_string(),
                )
            }
        };
        if !inserted {
            let stored: Value = serde_json::from_str(&stored)?;
            let id = stored["id"].as_str().unwrap_or_default();
            eprintln!("a message with id {id} already exists; nothing written");
        }
        writeln!(out, "{stored}")?;
        Ok(())
    }

    /// Prints the path root → leaf (or leaf first) as NDJSON.
    /// The path as NDJSON, or with `format` as one JSON document of that model API.
    pub async fn history(
        &self,
        options: HistoryOptions,
        format: Option<ModelFormat>,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        match (self, format) {
            (Target::Embedded(session), Some(format)) => {
                let path = session.full_history(options).await?;
                let messages: Vec<Value> = path.iter().map(|m| m.to_value()).collect();
                writeln!(out, "{}", format.convert(&messages))?;
            }
            (Target::Embedded(session), None) => {
                let mut history = std::pin::pin!(session.history(options));
                while let Some(message) = history.next().await {
                    writeln!(out, "{}", message?.json())?;
                }
            }
            (Target::Server { remote, session }, format) => {
                let mut query = Vec::new();
                if let Some(leaf) = &options.leaf {
                    query.push(format!("leaf={}", segment(leaf)));
                }
                if options.newest_first {
                    query.push("order=newest".to_owned());
                }
                if let Some(format) = format {
                    query.push(format!("format={}", format.name()));
                }
                let rest = format!("/history?{}", query.join("&"));
                let url = remote.session_url(session, &rest);
                let response = remote.send(remote.request(Method::GET, &url)).await?;
                let mut body = response.bytes_stream();
                while let Some(chunk) = body.next().await {
                    out.write_all(&chunk?)?;
                }
                // A converted path is one JSON document, sent without a line end.
                if format.is_some() {
                    writeln!(out)?;
                }
            }
        }
        out.flush()?;
        Ok(())
    }

    /// Draws every branch of the session; `*` marks the active path.
    pub async fn tree(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let mut nodes = Vec::new();
        let active: HashSet<String> = match self {
            Target::Embedded(session) => {
                // An existing session's export starts with its session line: none, no session.
                let mut lines = std::pin::pin!(session.export());
                let mut found = false;
                while let Some(line) = lines.next().await {
                    nodes.extend(Node::of_export_line(&line?)?);
                    found = true;
                }
                if !found {
                    bail!("no session `{}`", session.id());
                }
                let path = session.row_stats(None).await?;
                path.into_iter().map(|row| row.id).collect()
            }
            Target::Server { remote, session } => {
                let url = remote.session_url(session, "/export");
                let response = remote.send(remote.request(Method::GET, &url)).await?;
                let mut body = response.bytes_stream();
                let mut pending = Vec::new();
                while let Some(chunk) = body.next().await {
                    pending.extend_from_slice(&chunk?);
                    while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=end).collect();
                        let line = std::str::from_utf8(&line).context("an export line")?;
                        nodes.extend(Node::of_export_line(line)?);
                    }
                }
                let path = remote
                    .get_json(&remote.session_url(session, "/rows"))
                    .await?;
                rows_ids(path)?
            }
        };
        tree::draw(&nodes, &active, out)
    }

    /// Prints the numbers of the session's active path as JSON.
    pub async fn stats(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let numbers = match self {
            Target::Embedded(session) => {
                let stats = session.stats().await?;
                if stats.stored_messages == 0 && stats.leaf_id.is_none() {
                    bail!("session {} has no messages", session.id());
                }
                json!({
                    "sessionId": session.id(),
                    "messageCount": stats.message_count,
                    "storedMessages": stats.stored_messages,
                    "leafId": stats.leaf_id,
                    "tokenEstimate": stats.token_estimate,
                    "contentBytes": stats.content_bytes,
                })
            }
            Target::Server { remote, session } => {
                let found = remote.get_json(&remote.session_url(session, "")).await?;
                json!({
                    "sessionId": found["id"],
                    "messageCount": found["messageCount"],
                    "leafId": found["leafId"],
                    "tokenEstimate": found["tokenEstimate"],
                    "contentBytes": found["contentBytes"],
                })
            }
        };
        writeln!(out, "{numbers}")?;
        Ok(())
    }

    /// Deletes the session with everything it holds.
    pub async fn delete(&self, out: &mut impl Write) -> anyhow::Result<()> {
        match self {
            Target::Embedded(session) => {
                if !session.delete_session().await? {
                    bail!("no session {}", session.id());
                }
            }
            Target::Server { remote, session } => {
                let url = remote.session_url(session, "");
                remote.send(remote.request(Method::DELETE, &url)).await?;
            }
        }
        writeln!(out, "deleted {}", self.id())?;
        Ok(())
    }
}

/// The ids of a `GET …/rows` answer.
fn rows_ids(rows: Value) -> anyhow::Result<HashSet<String>> {
    let Value::Array(rows) = rows else {
        bail!("the server's rows answer is not a list: {rows}");
    };
    Ok(rows
        .iter()
        .filter_map(|row| row["id"].as_str().map(str::to_owned))
        .collect())
}

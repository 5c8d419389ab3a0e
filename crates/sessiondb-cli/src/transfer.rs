//! `sessiondb import` and `sessiondb export`: on the embedded store, or against a server with
//! `--url`. A progress line is drawn on standard error only when it is a terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use sessiondb::{Db, ImportLine, SessionSort, SqliteStore};

use crate::listing;
use crate::remote::Remote;

/// A one-line progress display, redrawn at most ten times a second; silent when standard error
/// is not a terminal.
struct Progress {
    enabled: bool,
    label: &'static str,
    total: Option<u64>,
    done: u64,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(label: &'static str, total: Option<u64>) -> Self {
        Self {
            enabled: std::io::stderr().is_terminal(),
            label,
            total,
            done: 0,
            drawn: None,
        }
    }

    /// Counts without drawing (a part of a larger job that draws its own).
    fn silent() -> Self {
        Self {
            enabled: false,
            ..Self::new("", None)
        }
    }

    fn advance(&mut self, by: u64) {
        self.done += by;
        if self.enabled
            && self
                .drawn
                .is_none_or(|t| t.elapsed() > Duration::from_millis(100))
        {
            self.draw();
        }
    }

    fn draw(&mut self) {
        self.drawn = Some(Instant::now());
        let line = match self.total {
            Some(total) if total > 0 => {
                let pct = (self.done.min(total) * 100) / total;
                let filled = (pct / 5) as usize;
                format!(
                    "{} [{}{}] {}/{} ({pct}%)",
                    self.label,
                    "#".repeat(filled),
                    " ".repeat(20 - filled),
                    self.done,
                    total
                )
            }
            _ => format!("{} {}", self.label, self.done),
        };
        eprint!("\r{line}");
    }

    fn finish(mut self) {
        if self.enabled {
            self.draw();
            eprintln!();
        }
    }
}

/// Which sessions an import or export is for.
pub enum Scope<'a> {
    One(&'a str),
    /// Every session: an export writes the namespace's sessions one after another, each
    /// starting with its session line; an import puts each part into the session its session
    /// line names.
    All,
}

/// Imports `file`: all of it into one session, or with [`Scope::All`] each session's part
/// into that session, read and written one part at a time. Each part is checked whole, then
/// written all or nothing; a bad line or a failed part stops the import (the parts before it
/// stay, and a second run skips what they wrote). Prints each part's counts.
pub async fn import(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    scope: Scope<'_>,
    file: &Path,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let reading = || format!("reading {}", file.display());
    let opened = std::fs::File::open(file).with_context(reading)?;
    let size = opened.metadata().with_context(reading)?.len();
    let mut progress = Progress::new("importing", Some(size));
    let all = matches!(scope, Scope::All);
    let mut part = match scope {
        Scope::One(session) => Some(Part::new(session)),
        Scope::All => None,
    };
    for (n, line) in std::io::BufReader::new(opened).lines().enumerate() {
        let line = line.with_context(reading)?;
        progress.advance(line.len() as u64 + 1);
        if line.trim().is_empty() {
            continue;
        }
        let parsed = sessiondb::parse_import_line(n, &line)?;
        if all && matches!(parsed, ImportLine::Session { .. }) {
            let value: Value = serde_json::from_str(&line)?;
            let Some(id) = value["session"]["id"].as_str() else {
                bail!("line {}: a session line without an `id`", n + 1);
            };
            if let Some(done) = part.replace(Part::new(id)) {
                done.import(db, remote, namespace, all, out).await?;
            }
        }
        let Some(current) = part.as_mut() else {
            bail!(
                "line {}: with --all, each session's lines start with its session line (as \
                 `export --all` writes them)",
                n + 1
            );
        };
        // A server checks and parses the text again; the embedded store takes the lines parsed.
        if remote.is_some() {
            current.text.push_str(&line);
            current.text.push('\n');
        } else {
            current.lines.push(parsed);
        }
    }
    if let Some(done) = part {
        done.import(db, remote, namespace, all, out).await?;
    }
    progress.finish();
    Ok(())
}

/// One session's lines of an import: their text for a server, or the lines parsed for the
/// embedded store.
struct Part {
    session: String,
    text: String,
    lines: Vec<ImportLine>,
}

impl Part {
    fn new(session: &str) -> Self {
        Part {
            session: session.to_owned(),
            text: String::new(),
            lines: Vec::new(),
        }
    }

    /// Writes the part and prints its counts (named by session when `all`).
    async fn import(
        self,
        db: Option<&Db<SqliteStore>>,
        remote: Option<&Remote>,
        namespace: &str,
        all: bool,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let session = self.session;
        let summary: Value = match (db, remote) {
            (Some(db), None) => {
                let summary = db
                    .session_in(namespace, &session)?
                    .import_lines(self.lines)
                    .await
                    .with_context(|| format!("importing session `{session}`"))?;
                json!({"imported": summary.imported, "skipped": summary.skipped})
            }
            (_, Some(remote)) => {
                let url = remote.session_url(&session, "/import");
                let request = remote
                    .request(reqwest::Method::POST, &url)
                    .header("content-type", "application/x-ndjson")
                    .body(self.text);
                remote.send(request).await?.json().await?
            }
            (None, None) => bail!("nothing to import into"),
        };
        if all {
            let named = json!({"session": session, "imported": summary["imported"],
                               "skipped": summary["skipped"]});
            writeln!(out, "{named}")?;
        } else {
            writeln!(out, "{summary}")?;
        }
        Ok(())
    }
}

/// Writes one session's export, or every session's one after another.
pub async fn export(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    scope: Scope<'_>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match scope {
        Scope::One(session) => {
            let mut progress = Progress::new("exporting lines", None);
            if !export_one(db, remote, namespace, session, &mut progress, out).await? {
                bail!("no session `{session}`");
            }
            progress.finish();
        }
        Scope::All => {
            let every = listing::Wanted {
                user_id: None,
                sort: SessionSort::CreatedAt,
                limit: None,
            };
            let ids = listing::ids(db, remote, namespace, &every).await?;
            let mut progress = Progress::new("exporting sessions", Some(ids.len() as u64));
            for id in &ids {
                // A session deleted since it was listed is not part of the store any more.
                export_one(db, remote, namespace, id, &mut Progress::silent(), out).await?;
                progress.advance(1);
            }
            progress.finish();
        }
    }
    out.flush()?;
    Ok(())
}

/// Writes one session's export lines, counting them on `progress`; false when the session does
/// not exist.
async fn export_one(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    session: &str,
    progress: &mut Progress,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    match (db, remote) {
        (Some(db), None) => {
            // An existing session's export starts with its session line: none, no session.
            let mut lines = std::pin::pin!(db.session_in(namespace, session)?.export());
            let mut found = false;
            while let Some(line) = lines.next().await {
                out.write_all(line?.as_bytes())?;
                progress.advance(1);
                found = true;
            }
            return Ok(found);
        }
        (_, Some(remote)) => {
            let url = remote.session_url(session, "/export");
            let request = remote.request(reqwest::Method::GET, &url);
            let Some(response) = remote.send_if_found(request).await? else {
                return Ok(false);
            };
            let mut body = response.bytes_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                out.write_all(&chunk)?;
                progress.advance(chunk.iter().filter(|b| **b == b'\n').count() as u64);
            }
        }
        (None, None) => bail!("nothing to export from"),
    }
    Ok(true)
}

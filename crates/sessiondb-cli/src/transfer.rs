//! `sessiondb import` and `sessiondb export`: on the embedded store, or against a server with
//! `--url`. A progress line is drawn on standard error only when it is a terminal.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use sessiondb::{Db, SqliteStore};

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

pub async fn import(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    session: &str,
    file: &Path,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut progress = Progress::new("checking", Some(text.len() as u64));
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        progress.advance(line.len() as u64 + 1);
        if !line.trim().is_empty() {
            lines.push(sessiondb::parse_import_line(n, line)?);
        }
    }
    progress.finish();
    let summary = match (db, remote) {
        (Some(db), None) => {
            let summary = db
                .session_in(namespace, session)?
                .import_lines(lines)
                .await?;
            serde_json::json!({"imported": summary.imported, "skipped": summary.skipped})
        }
        (_, Some(remote)) => {
            let url = remote.session_url(session, "/import");
            let request = remote
                .request(reqwest::Method::POST, &url)
                .header("content-type", "application/x-ndjson")
                .body(text);
            remote.send(request).await?.json().await?
        }
        (None, None) => bail!("nothing to import into"),
    };
    writeln!(out, "{summary}")?;
    Ok(())
}

pub async fn export(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    session: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match (db, remote) {
        (Some(db), None) => {
            let handle = db.session_in(namespace, session)?;
            let Some(info) = handle.info().await? else {
                bail!("no session `{session}`");
            };
            let mut progress = Progress::new("exporting", Some(info.stats.stored_messages));
            let mut lines = std::pin::pin!(handle.export());
            while let Some(line) = lines.next().await {
                let line = line?;
                out.write_all(line.as_bytes())?;
                if line.starts_with("{\"message\"") {
                    progress.advance(1);
                }
            }
            progress.finish();
        }
        (_, Some(remote)) => {
            let url = remote.session_url(session, "/export");
            let response = remote
                .send(remote.request(reqwest::Method::GET, &url))
                .await?;
            let mut body = response.bytes_stream();
            let mut progress = Progress::new("exporting lines", None);
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                out.write_all(&chunk)?;
                progress.advance(chunk.iter().filter(|b| **b == b'\n').count() as u64);
            }
            progress.finish();
        }
        (None, None) => bail!("nothing to export from"),
    }
    out.flush()?;
    Ok(())
}

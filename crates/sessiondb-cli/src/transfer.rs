//! `sessiondb import` and `sessiondb export`: on the embedded store, or against a server with
//! `--url`. A progress line is drawn on standard error only when it is a terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sessiondb::{BlockKind, ContextEntry, Db, ImportLine, ImportLines, SessionSort, SqliteStore};

use crate::listing;
use crate::remote::{Refused, Remote, segment};

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
    /// Every session and the namespace's context templates: an export writes the templates'
    /// part (when there are templates), then the sessions one after another, each starting
    /// with its session line; an import puts each session's part into the session its session
    /// line names, and the templates' part into the templates.
    All,
}

/// Imports `file`: all of it into one session, or with [`Scope::All`] each session's part
/// into that session, read and written one part at a time. Each part is checked whole, then
/// written all or nothing (to a server that refuses it as too large, in halves: see
/// [`post_import`]); a bad line or a failed part stops the import (the parts before it stay,
/// and a second run skips what they wrote). Prints each part's counts.
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
        Scope::One(session) => Some(Part::new(Target::Session(session.to_owned()), 0)),
        Scope::All => None,
    };
    for (n, line) in std::io::BufReader::new(opened).lines().enumerate() {
        let line = line.with_context(reading)?;
        progress.advance(line.len() as u64 + 1);
        if line.trim().is_empty() {
            // Kept in a server's text, whose errors number the part's lines from its first.
            if let Some(current) = part.as_mut().filter(|_| remote.is_some()) {
                current.text.push('\n');
            }
            continue;
        }
        let parsed = sessiondb::parse_import_line(n, &line)?;
        let opens = match &parsed {
            ImportLine::Session { id, .. } if all => {
                let Some(id) = id else {
                    bail!("lines[{n}]: a session line without an `id`");
                };
                Some(Target::Session(id.clone()))
            }
            ImportLine::Templates if all => Some(Target::Templates),
            _ => None,
        };
        if let Some(target) = opens
            && let Some(done) = part.replace(Part::new(target, n))
        {
            done.import(db, remote, namespace, all, out).await?;
        }
        let Some(current) = part.as_mut() else {
            bail!(
                "lines[{n}]: with --all, each session's lines start with its session line, and \
                 the namespace templates' with a `templates` line (as `export --all` writes them)"
            );
        };
        // A server checks and parses the part's text again; the embedded store takes the lines
        // parsed.
        if remote.is_some() {
            current.text.push_str(&line);
            current.text.push('\n');
        } else {
            current.lines.push(n, parsed);
        }
    }
    if let Some(done) = part {
        done.import(db, remote, namespace, all, out).await?;
    }
    progress.finish();
    Ok(())
}

/// Where a part of an import goes.
enum Target {
    Session(String),
    /// The namespace's context templates.
    Templates,
}

/// One part of an import: its lines as text for a server, else the lines parsed (numbered as
/// the file's lines).
struct Part {
    target: Target,
    /// The file's line (0-based) where the part starts.
    first_line: usize,
    text: String,
    lines: ImportLines,
}

impl Part {
    fn new(target: Target, first_line: usize) -> Self {
        Part {
            target,
            first_line,
            text: String::new(),
            lines: ImportLines::default(),
        }
    }

    /// Writes the part and prints its counts (named by session, or as the templates', when
    /// `all`).
    async fn import(
        self,
        db: Option<&Db<SqliteStore>>,
        remote: Option<&Remote>,
        namespace: &str,
        all: bool,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let what = match &self.target {
            Target::Session(session) => format!("session `{session}`"),
            Target::Templates => "the namespace's context templates".to_owned(),
        };
        let summary: Value = match (db, remote) {
            (Some(db), None) => {
                let written = match &self.target {
                    Target::Session(session) => {
                        let session = db.session_in(namespace, session)?;
                        session.import_lines(self.lines).await
                    }
                    Target::Templates => db.import_templates(namespace, self.lines).await,
                };
                let summary = written.with_context(|| format!("importing {what}"))?;
                json!({"imported": summary.imported, "skipped": summary.skipped})
            }
            (_, Some(remote)) => {
                let url = match &self.target {
                    Target::Session(session) => remote.session_url(session, "/import"),
                    Target::Templates => remote.url("/v1/context"),
                };
                // The templates go whole: a `templates` line speaks for the lines after it.
                let splits = matches!(self.target, Target::Session(_));
                post_import(remote, &url, &self.text, self.first_line, &what, splits).await?
            }
            (None, None) => bail!("nothing to import into"),
        };
        let counts = (&summary["imported"], &summary["skipped"]);
        let line = match &self.target {
            Target::Templates => {
                json!({"templates": true, "imported": counts.0, "skipped": counts.1})
            }
            Target::Session(session) if all => {
                json!({"session": session, "imported": counts.0, "skipped": counts.1})
            }
            Target::Session(_) => summary,
        };
        writeln!(out, "{line}")?;
        Ok(())
    }
}

/// POSTs an import's `text` (its first line the file's `first_line`) to `url`: as one request,
/// or, when the server refuses it as too large (`--max-body-bytes`) and it `splits`, in two
/// halves split at a line, each halved again while it is refused, sent in their order: the
/// messages of each part name their parents in the parts before, which are stored by then.
/// Each part is all or nothing; an import cut short is finished by running it again (what is
/// stored is skipped). The counts of every part, summed.
async fn post_import(
    remote: &Remote,
    url: &str,
    text: &str,
    first_line: usize,
    what: &str,
    splits: bool,
) -> anyhow::Result<Value> {
    let (mut imported, mut skipped) = (0, 0);
    // Parts still to send, the next one last.
    let mut parts = vec![(first_line, text)];
    while let Some((first_line, part)) = parts.pop() {
        let request = remote
            .request(reqwest::Method::POST, url)
            .header("content-type", "application/x-ndjson")
            .body(part.to_owned());
        let answer = match remote.send(request).await {
            Ok(answer) => answer,
            Err(error) => {
                let too_large = splits
                    && error
                        .downcast_ref::<Refused>()
                        .is_some_and(|refused| refused.status == StatusCode::PAYLOAD_TOO_LARGE);
                if let Some((head, tail)) = too_large.then(|| halves(part)).flatten() {
                    let tail_line = first_line + head.matches('\n').count();
                    parts.extend([(tail_line, tail), (first_line, head)]);
                    continue;
                }
                // The server numbers the lines it was sent, which start at the part's first.
                return Err(error).with_context(|| {
                    format!("importing {what} (its lines[0] is the file's lines[{first_line}])")
                });
            }
        };
        let counts: Value = answer.json().await?;
        imported += counts["imported"].as_u64().unwrap_or(0);
        skipped += counts["skipped"].as_u64().unwrap_or(0);
    }
    Ok(json!({"imported": imported, "skipped": skipped}))
}

/// `text` split at the first line end after its middle (else the last before it) into two
/// parts that each hold a line that is not blank; `None` when it holds fewer than two such
/// lines.
fn halves(text: &str) -> Option<(&str, &str)> {
    let holds_a_line = |part: &str| part.lines().any(|line| !line.trim().is_empty());
    // Searched as bytes: the middle may fall inside a character, a newline never does.
    let (bytes, middle) = (text.as_bytes(), text.len() / 2);
    let after = bytes[middle..].iter().position(|&b| b == b'\n');
    let after = after.map(|i| middle + i);
    let before = bytes[..middle].iter().rposition(|&b| b == b'\n');
    [after, before]
        .into_iter()
        .flatten()
        .map(|end| text.split_at(end + 1))
        .find(|(head, tail)| holds_a_line(head) && holds_a_line(tail))
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
            export_templates(db, remote, namespace, out).await?;
            export_sessions(db, remote, namespace, None, out).await?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Writes every session of `user_id`, newest first, as [`Scope::All`] writes each session but
/// without the namespace's templates, which are no user's: what a user asking for their data
/// is given (and what `import --all` takes back).
pub async fn export_user(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    user_id: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    export_sessions(db, remote, namespace, Some(user_id), out).await?;
    out.flush()?;
    Ok(())
}

/// Writes the namespace's sessions (only `user_id`'s when given), newest created first.
async fn export_sessions(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    user_id: Option<&str>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let wanted = listing::Wanted {
        user_id: user_id.map(str::to_owned),
        sort: SessionSort::CreatedAt,
        limit: None,
    };
    let ids = listing::ids(db, remote, namespace, &wanted).await?;
    let mut progress = Progress::new("exporting sessions", Some(ids.len() as u64));
    for id in &ids {
        // A session deleted since it was listed is not part of the store any more.
        export_one(db, remote, namespace, id, &mut Progress::silent(), out).await?;
        progress.advance(1);
    }
    progress.finish();
    Ok(())
}

/// Writes the namespace templates' part of an export (nothing when it has no template): on the
/// embedded store as the store words it, through a server the same lines from its blocks and
/// their entries.
async fn export_templates(
    db: Option<&Db<SqliteStore>>,
    remote: Option<&Remote>,
    namespace: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let lines = match (db, remote) {
        (Some(db), None) => db.export_templates(namespace).await?,
        (_, Some(remote)) => {
            let blocks = remote.get_json(&remote.url("/v1/context")).await?;
            let blocks = blocks.as_array().context("GET /v1/context: not a list")?;
            let mut lines = Vec::new();
            let mut keyed = Vec::new();
            for block in blocks {
                let text = |name: &str| block[name].as_str();
                let label = text("label").context("a template block without a label")?;
                let kind = text("kind").and_then(BlockKind::parse);
                let kind = kind.with_context(|| format!("template `{label}`: an unknown kind"))?;
                let max_tokens = block["maxTokens"].as_u64();
                let content = text("content").unwrap_or_default();
                lines.push(sessiondb::block_line(
                    label,
                    kind,
                    text("description"),
                    max_tokens,
                    content,
                ));
                if kind.is_keyed() {
                    keyed.push(label);
                }
            }
            for label in keyed {
                let url = remote.url(&format!("/v1/context/{}/entries?limit=100", segment(label)));
                let mut after: Option<String> = None;
                loop {
                    let (items, next) = remote.page(&url, after.as_deref()).await?;
                    for item in &items {
                        let entry = entry_of(item)
                            .with_context(|| format!("GET {url}: not an entry: {item}"))?;
                        lines.push(sessiondb::entry_line(label, &entry));
                    }
                    match next {
                        Some(cursor) => after = Some(cursor),
                        None => break,
                    }
                }
            }
            if !lines.is_empty() {
                lines.insert(0, sessiondb::TEMPLATES_LINE.to_owned());
            }
            lines
        }
        (None, None) => bail!("nothing to export from"),
    };
    for line in lines {
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// The entries of a `GET …/entries` answer.
fn entry_of(item: &Value) -> Option<ContextEntry> {
    Some(ContextEntry {
        key: item["key"].as_str()?.to_owned(),
        content: item["content"].as_str()?.to_owned(),
        description: item["description"].as_str().map(str::to_owned),
    })
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

//! The `sessiondb` command: a thin wrapper over the library on the embedded store, or over the
//! HTTP API of a server (`--url`), and the server itself (`sessiondb serve`).
#![forbid(unsafe_code)]

mod backups;
mod listing;
mod remote;
mod retention;
mod search;
mod serve;
mod session_commands;
mod signals;
mod transfer;
mod tree;
mod vacuums;

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use sessiondb::convert::ModelFormat;
use sessiondb::{Db, HistoryOptions, Message, Parent, SearchFilter, SessionSort, SqliteStore};

use crate::remote::{Remote, segment};
use crate::session_commands::Target;
use crate::transfer::Scope;

/// Where the embedded database lives unless `--data` says otherwise.
pub const DEFAULT_DATA: &str = "./sessiondb-data";

#[derive(Debug, Parser)]
#[command(
    name = "sessiondb",
    version,
    about = "A durable session store for AI agents"
)]
struct Cli {
    /// Directory of the embedded database [default: ./sessiondb-data].
    #[arg(long, global = true, env = "SESSIONDB_DATA")]
    data: Option<PathBuf>,
    /// Namespace (tenant) of the sessions; empty by default.
    #[arg(long, global = true, env = "SESSIONDB_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Append a message: `--text` with `--role`, or one JSON message on standard input.
    Append {
        session: String,
        /// Message text; without it a JSON message is read from standard input.
        #[arg(long)]
        text: Option<String>,
        #[arg(long, default_value = "user")]
        role: String,
        /// Message id (generated when absent).
        #[arg(long)]
        id: Option<String>,
        /// Attach under this message instead of the active leaf.
        #[arg(long, conflicts_with = "root")]
        parent: Option<String>,
        /// Start a new root.
        #[arg(long)]
        root: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Print the path root → leaf as NDJSON (one message per line).
    History {
        session: String,
        /// Read the path ending at this message instead of the active leaf.
        #[arg(long)]
        leaf: Option<String>,
        /// Leaf first.
        #[arg(long)]
        newest_first: bool,
        /// The path as one JSON document of a model API, as it would be sent: openai (Chat
        /// Completions messages), openai-responses (Responses input items) or anthropic
        /// (`{system, messages}`) [default: NDJSON, a stored message per line].
        #[arg(long, conflicts_with = "newest_first")]
        format: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Draw every branch of a session; `*` marks the active path.
    Tree {
        session: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Full-text search in a session, or across the namespace (`--all`) or one user's sessions
    /// (`--user`), best first: a line per hit, `id [role] snippet` (after the session's id across
    /// sessions), the matched words in `**`.
    Search {
        /// The session to search in; with `--all` or `--user`, the words to search for.
        session: String,
        /// The words to search for (plain words, stemmed), after a session.
        #[arg(required_unless_present_any = ["all", "user"])]
        query: Option<String>,
        /// Search every session of the namespace.
        #[arg(long, conflicts_with = "user")]
        all: bool,
        /// Search the sessions of this user (`userId`).
        #[arg(long)]
        user: Option<String>,
        /// Messages holding any of the words rather than all of them (a question in natural
        /// language), best first.
        #[arg(long)]
        any: bool,
        /// Only messages of this role (`user`, `assistant`, …).
        #[arg(long)]
        role: Option<String>,
        /// Only messages created at or after this time (epoch milliseconds).
        #[arg(long)]
        since: Option<i64>,
        /// Only messages created before this time (epoch milliseconds).
        #[arg(long)]
        until: Option<i64>,
        /// Most hits (1 to 100).
        #[arg(long, default_value_t = sessiondb::DEFAULT_PAGE_SIZE as u64,
              value_parser = clap::value_parser!(u64).range(1..=sessiondb::MAX_PAGE_SIZE as u64))]
        limit: u64,
        /// Most words of each hit's snippet (1 to 100).
        #[arg(long, default_value_t = sessiondb::DEFAULT_SNIPPET_WORDS as u64,
              value_parser = clap::value_parser!(u64).range(1..=sessiondb::MAX_SNIPPET_WORDS as u64))]
        words: u64,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Numbers of the active path, as JSON (`storedMessages`, every message of the tree, on the
    /// embedded store only).
    Stats {
        session: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Copy the whole store into a new directory, which then opens as a store of its own (a
    /// consistent snapshot; the directory must not hold a database yet).
    Backup { destination: PathBuf },
    /// Give the room of deleted sessions and messages back to the file system (SQLite's
    /// `VACUUM`; needs free space of about the database's size). Prints the sizes before and
    /// after, as JSON.
    Vacuum,
    /// Check the embedded store: SQLite's integrity check of every page, then the store's own
    /// invariants (every message has its session, parent links, each session's counts and
    /// leaf, attachments); with --database, those invariants of a PostgreSQL store. Prints
    /// `{"problems": [...]}`; fails when there is one.
    Check {
        /// PostgreSQL connection string: check this shared database instead (servers may go on
        /// serving from it; the check reads one snapshot).
        #[arg(long, env = "SESSIONDB_DATABASE", hide_env_values = true)]
        database: Option<String>,
    },
    /// Delete a session with its messages, compactions, state and context (there is no undo);
    /// with `--idle-for` instead, every session of the namespace not written for that long;
    /// with `--user`, every session of that user.
    Delete {
        #[arg(
            required_unless_present_any = ["idle_for", "user"],
            conflicts_with_all = ["idle_for", "user"]
        )]
        session: Option<String>,
        /// Every session created for this user (`userId`): erasing what a user left.
        #[arg(long, conflicts_with = "idle_for")]
        user: Option<String>,
        /// Not written (`updatedAt`) for this long: a number and s, m, h or d, as in `30d`. On
        /// the embedded store only: a server deletes idle sessions itself
        /// (`serve --delete-idle-after`).
        #[arg(long, value_parser = backups::parse_interval, conflicts_with = "url")]
        idle_for: Option<std::time::Duration>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// List the namespace's sessions as NDJSON, most recent first (the objects
    /// `GET /v1/sessions` pages through).
    Sessions {
        /// Only the sessions created for this user.
        #[arg(long)]
        user: Option<String>,
        /// Order by the last update, the last message or the creation (updatedAt,
        /// lastMessageAt or createdAt).
        #[arg(long, default_value = "updatedAt", value_parser = listing::parse_sort)]
        sort: SessionSort,
        /// At most this many (all when absent).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Run the HTTP server (SQLite in --data, 127.0.0.1:8787 by default; --database for
    /// PostgreSQL). SIGHUP puts the API keys, CORS origins and TLS certificate of the
    /// configuration (read again) in force; on the embedded store SIGUSR1 takes a backup (with --backup-dir) and
    /// SIGUSR2 vacuums the file.
    Serve(Box<serve::ServeArgs>),
    /// Bring a PostgreSQL database to this build's schema (servers also do this as they start).
    Migrate {
        /// PostgreSQL connection string (`postgres://user@host:port/db`).
        #[arg(long, env = "SESSIONDB_DATABASE", hide_env_values = true)]
        database: String,
    },
    /// Import an NDJSON export (or `{message, parentId, createdAt}` lines) into a session, all or
    /// nothing; with `--all`, an `export --all` into the sessions it holds, each all or nothing,
    /// and its templates' part into the namespace's context templates. With `--url`, a session a
    /// server refuses as one request too large goes in halves, each all or nothing.
    Import {
        file: PathBuf,
        /// The session to import into.
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        session: Option<String>,
        /// Each session's lines into the session its session line names (the templates' part
        /// into the namespace's context templates).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a session (its record, every message of its tree, compactions, state, context) as
    /// NDJSON to stdout; with `--all`, the namespace's context templates, then every session of
    /// the namespace, one after another; with `--user`, every session of that user.
    Export {
        #[arg(
            required_unless_present_any = ["all", "user"],
            conflicts_with_all = ["all", "user"]
        )]
        session: Option<String>,
        /// Every session, after the context templates (to move a store: `export --all`, then
        /// `import --all` elsewhere).
        #[arg(long, conflicts_with = "user")]
        all: bool,
        /// Every session created for this user (`userId`), without the templates: what a user
        /// asking for their data is given (`import --all` takes it back).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

impl Command {
    /// The server the command works through, when `--url` names one.
    fn remote(&self) -> anyhow::Result<Option<Remote>> {
        let args = match self {
            Command::Append { remote, .. }
            | Command::History { remote, .. }
            | Command::Tree { remote, .. }
            | Command::Search { remote, .. }
            | Command::Stats { remote, .. }
            | Command::Delete { remote, .. }
            | Command::Sessions { remote, .. }
            | Command::Import { remote, .. }
            | Command::Export { remote, .. } => remote,
            Command::Backup { .. }
            | Command::Vacuum
            | Command::Check { .. }
            | Command::Serve(_)
            | Command::Migrate { .. } => return Ok(None),
        };
        let Some(url) = args.url.as_deref() else {
            return Ok(None);
        };
        Remote::new(url, args.api_key.as_deref(), args.ca_cert.as_deref()).map(Some)
    }
}

#[derive(Debug, clap::Args)]
struct RemoteArgs {
    /// Work through this server (e.g. http://127.0.0.1:8787) instead of the embedded database;
    /// the namespace is then the one of the API key.
    #[arg(long, env = "SESSIONDB_URL")]
    url: Option<String>,
    /// Bearer key for --url.
    #[arg(long, env = "SESSIONDB_API_KEY", requires = "url")]
    api_key: Option<String>,
    /// PEM certificates an https --url is also trusted by (a private CA, a self-signed
    /// server), beside the system's.
    #[arg(long, env = "SESSIONDB_CA_CERT", requires = "url")]
    ca_cert: Option<PathBuf>,
}

/// Runs one PostgreSQL call of a command on a runtime of its own.
fn on_runtime<T>(work: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    Ok(runtime.block_on(work))
}

fn migrate(url: &str) -> anyhow::Result<()> {
    let (found, now) = on_runtime(sessiondb_postgres::migrate_database(url))?
        .context("migrating the PostgreSQL database")?;
    if found == now {
        println!("schema version {now}: up to date");
    } else {
        println!("schema version {found} -> {now}");
    }
    Ok(())
}

fn check_postgres(url: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let problems = on_runtime(sessiondb_postgres::check_database(url))?
        .context("checking the PostgreSQL database")?;
    report_problems(problems, out)
}

/// Prints `{"problems": [...]}`; fails when there is one.
fn report_problems(problems: Vec<String>, out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(out, "{}", serde_json::json!({ "problems": problems }))?;
    if !problems.is_empty() {
        bail!("the store has {} problems", problems.len());
    }
    Ok(())
}

fn open(data: &Option<PathBuf>) -> anyhow::Result<Db<SqliteStore>> {
    let dir = data.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DATA));
    Db::open(&dir).with_context(|| format!("opening {}", dir.display()))
}

/// Prints a failure as its chain of causes on one line and exits with status 1. anyhow's own
/// report adds a stack trace whenever `RUST_BACKTRACE` is set, which a user of the tool does not
/// need to read about a missing session.
fn main() -> std::process::ExitCode {
    match run_command(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_command(cli: Cli) -> anyhow::Result<()> {
    if let Command::Serve(args) = cli.command {
        return serve::run(*args, cli.data);
    }
    match &cli.command {
        Command::Migrate { database } => return migrate(database),
        Command::Check {
            database: Some(database),
        } => return check_postgres(database, &mut std::io::stdout()),
        _ => {}
    }
    let remote = cli.command.remote()?;
    if remote.is_some() && !cli.namespace.is_empty() {
        bail!(
            "--namespace names a namespace of the embedded store; through a server (--url) the \
             namespace is the API key's"
        );
    }
    let db = match remote {
        Some(_) => None,
        None => Some(open(&cli.data).map_err(|error| {
            let locked = matches!(
                error.downcast_ref::<sessiondb::Error>(),
                Some(sessiondb::Error::Store(
                    sessiondb::StoreError::Locked { .. }
                ))
            );
            match &cli.command {
                _ if !locked => error,
                Command::Backup { .. } => error.context(
                    "a running server holds this store: it backs itself up when started with \
                     --backup-dir DIR, at once on SIGUSR1 (`kill -USR1 <pid>`)",
                ),
                Command::Vacuum => error.context(
                    "a running server holds this store: send it SIGUSR2 (`kill -USR2 <pid>`) \
                     to vacuum it while it serves",
                ),
                Command::Check { .. } => error.context(
                    "a running server holds this store: check a backup of it (SIGUSR1), or \
                     stop it first",
                ),
                Command::Delete {
                    session: None,
                    user: None,
                    ..
                } => error.context(
                    "a running server holds this store: it deletes idle sessions itself when \
                     started with --delete-idle-after",
                ),
                _ => error.context(
                    "a running server holds this store: work through it with --url (e.g. \
                     --url http://127.0.0.1:8787)",
                ),
            }
        })?),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(db, remote, cli.namespace, cli.command))
}

async fn run(
    db: Option<Db<SqliteStore>>,
    remote: Option<Remote>,
    namespace: String,
    command: Command,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let target = |session: String| -> anyhow::Result<Target<'_>> {
        Ok(match &remote {
            Some(remote) => Target::Server { remote, session },
            None => Target::Embedded(
                db.as_ref()
                    .context("no database open")?
                    .session_in(&namespace, &session)?,
            ),
        })
    };
    match command {
        Command::Import { file, session, .. } => {
            let sessions = session.as_deref().map_or(Scope::All, Scope::One);
            transfer::import(
                db.as_ref(),
                remote.as_ref(),
                &namespace,
                sessions,
                &file,
                &mut out,
            )
            .await
        }
        Command::Export {
            user: Some(user), ..
        } => transfer::export_user(db.as_ref(), remote.as_ref(), &namespace, &user, &mut out).await,
        Command::Export { session, .. } => {
            let sessions = session.as_deref().map_or(Scope::All, Scope::One);
            transfer::export(db.as_ref(), remote.as_ref(), &namespace, sessions, &mut out).await
        }
        Command::Sessions {
            user, sort, limit, ..
        } => {
            let wanted = listing::Wanted {
                user_id: user,
                sort,
                limit,
            };
            listing::print(db.as_ref(), remote.as_ref(), &namespace, &wanted, &mut out).await
        }
        Command::Append {
            session,
            text,
            role,
            id,
            parent,
            root,
            ..
        } => {
            let mut message = match text {
                Some(text) => Message::text(role, text),
                None => {
                    let mut input = String::new();
                    std::io::stdin().read_to_string(&mut input)?;
                    Message::parse(input.trim()).context("reading a JSON message from stdin")?
                }
            };
            if let Some(id) = id {
                message = message.with_id(id);
            }
            let parent = match (parent, root) {
                (Some(p), _) => Parent::Id(p),
                (None, true) => Parent::Root,
                (None, false) => Parent::ActiveLeaf,
            };
            target(session)?.append(message, parent, &mut out).await
        }
        Command::History {
            session,
            leaf,
            newest_first,
            format,
            ..
        } => {
            let format = match format.as_deref() {
                None | Some("ndjson") => None,
                Some(name) => Some(ModelFormat::parse(name).with_context(|| {
                    format!(
                        "--format: one of ndjson, {}; not `{name}`",
                        ModelFormat::NAMES
                    )
                })?),
            };
            let options = HistoryOptions { leaf, newest_first };
            target(session)?.history(options, format, &mut out).await
        }
        Command::Tree { session, .. } => target(session)?.tree(&mut out).await,
        Command::Search {
            session,
            query,
            all,
            user,
            any,
            role,
            since,
            until,
            limit,
            words,
            ..
        } => {
            let (scope, query) = match query {
                _ if all || user.is_some() => {
                    if let Some(extra) = query {
                        bail!("--all and --user take the words alone, not `{extra}` after them");
                    }
                    (search::Scope::Namespace { user_id: user }, session)
                }
                Some(query) => (search::Scope::Session(session), query),
                None => bail!("the words to search for are missing after the session"),
            };
            let filter = SearchFilter {
                match_any: any,
                role,
                since_ms: since,
                until_ms: until,
            };
            if let Some(problem) = filter.problem() {
                bail!("{problem}");
            }
            let wanted = search::Wanted {
                scope,
                query,
                filter,
                limit: limit as usize,
                snippet_words: words as usize,
            };
            search::print(db.as_ref(), remote.as_ref(), &namespace, &wanted, &mut out).await
        }
        Command::Stats { session, .. } => target(session)?.stats(&mut out).await,
        Command::Delete {
            session: Some(session),
            ..
        } => target(session)?.delete(&mut out).await,
        Command::Delete {
            session: None,
            user: Some(user),
            ..
        } => {
            let deleted = match &remote {
                Some(remote) => {
                    let url = remote.url(&format!("/v1/sessions?userId={}", segment(&user)));
                    let request = remote.request(reqwest::Method::DELETE, &url);
                    let answer: serde_json::Value = remote.send(request).await?.json().await?;
                    answer["deleted"]
                        .as_u64()
                        .with_context(|| format!("the server answered {answer}"))?
                }
                None => {
                    let db = db.context("no database open")?;
                    db.delete_user_sessions(&namespace, &user).await?
                }
            };
            writeln!(out, "deleted {deleted} sessions of user {user}")?;
            Ok(())
        }
        Command::Delete {
            session: None,
            idle_for,
            ..
        } => {
            let db = db.context("no database open")?;
            let idle_for = idle_for.context("a session or --idle-for")?;
            let cutoff = retention::cutoff_ms(idle_for);
            let deleted = db
                .delete_sessions_updated_before(&namespace, cutoff)
                .await?;
            writeln!(out, "deleted {deleted} idle sessions")?;
            Ok(())
        }
        Command::Backup { destination } => {
            let db = db.context("no database open")?;
            let copy = db.store().backup(&destination)?;
            writeln!(out, "{}", copy.display())?;
            Ok(())
        }
        Command::Vacuum => {
            let db = db.context("no database open")?;
            let vacuumed = db.store().vacuum()?;
            let sizes = serde_json::json!({
                "bytesBefore": vacuumed.bytes_before,
                "bytesAfter": vacuumed.bytes_after,
            });
            writeln!(out, "{sizes}")?;
            Ok(())
        }
        Command::Check { .. } => {
            let db = db.context("no database open")?;
            report_problems(db.store().check()?, &mut out)
        }
        Command::Serve(_) | Command::Migrate { .. } => unreachable!("handled above"),
    }
}

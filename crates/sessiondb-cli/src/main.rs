//! The `sessiondb` command: a thin wrapper over the library on the embedded store, and the
//! server (`sessiondb serve`).
#![forbid(unsafe_code)]

mod backups;
mod listing;
mod retention;
mod serve;
mod transfer;
mod tree;

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use sessiondb::{
    AppendOptions, Db, HistoryOptions, Message, Parent, Session, SessionSort, SqliteStore,
};

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
    },
    /// Draw every branch of a session; `*` marks the active path.
    Tree { session: String },
    /// Full-text search within a session.
    Search {
        session: String,
        query: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Numbers of the active path, as JSON.
    Stats { session: String },
    /// Copy the whole store into a new directory, which then opens as a store of its own (a
    /// consistent snapshot; the directory must not hold a database yet).
    Backup { destination: PathBuf },
    /// Delete a session with its messages, compactions, state and context (there is no undo);
    /// with `--idle-for` instead, every session of the namespace not written for that long.
    Delete {
        #[arg(required_unless_present = "idle_for", conflicts_with = "idle_for")]
        session: Option<String>,
        /// Not written (`updatedAt`) for this long: a number and s, m, h or d, as in `30d`.
        #[arg(long, value_parser = backups::parse_interval)]
        idle_for: Option<std::time::Duration>,
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
    /// PostgreSQL).
    Serve(Box<serve::ServeArgs>),
    /// Bring a PostgreSQL database to this build's schema (servers also do this as they start).
    Migrate {
        /// PostgreSQL connection string (`postgres://user@host:port/db`).
        #[arg(long, env = "SESSIONDB_DATABASE", hide_env_values = true)]
        database: String,
    },
    /// Import an NDJSON export (or `{message, parentId, createdAt}` lines) into a session, all or
    /// nothing.
    Import {
        file: PathBuf,
        /// The session to import into.
        #[arg(long)]
        session: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a session (every message of its tree, compactions, state) as NDJSON to stdout.
    Export {
        session: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

#[derive(Debug, clap::Args)]
struct RemoteArgs {
    /// Work against this server (e.g. http://127.0.0.1:8787) instead of the embedded database.
    #[arg(long, env = "SESSIONDB_URL")]
    url: Option<String>,
    /// Bearer key for --url.
    #[arg(long, env = "SESSIONDB_API_KEY", requires = "url")]
    api_key: Option<String>,
}

impl RemoteArgs {
    fn remote(&self) -> Option<transfer::Remote<'_>> {
        self.url.as_deref().map(|url| transfer::Remote {
            url,
            api_key: self.api_key.as_deref(),
        })
    }
}

fn migrate(url: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (found, now) = runtime
        .block_on(sessiondb_postgres::migrate_database(url))
        .context("migrating the PostgreSQL database")?;
    if found == now {
        println!("schema version {now}: up to date");
    } else {
        println!("schema version {found} -> {now}");
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
        return serve::run(serve::resolve(*args, cli.data)?);
    }
    if let Command::Migrate { database } = &cli.command {
        return migrate(database);
    }
    let remote = match &cli.command {
        Command::Import { remote, .. }
        | Command::Export { remote, .. }
        | Command::Sessions { remote, .. } => remote.url.is_some(),
        _ => false,
    };
    let db = if remote {
        None
    } else {
        Some(open(&cli.data).map_err(|error| {
            let locked = matches!(
                error.downcast_ref::<sessiondb::Error>(),
                Some(sessiondb::Error::Store(
                    sessiondb::StoreError::Locked { .. }
                ))
            );
            match &cli.command {
                Command::Backup { .. } if locked => error.context(
                    "a running server holds this store: it backs itself up when started with \
                     --backup-dir DIR, at once on SIGUSR1 (`kill -USR1 <pid>`)",
                ),
                _ => error,
            }
        })?)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(db, cli.namespace, cli.command))
}

async fn run(
    db: Option<Db<SqliteStore>>,
    namespace: String,
    command: Command,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if let Command::Import {
        file,
        session,
        remote,
    } = &command
    {
        return transfer::import(
            db.as_ref(),
            remote.remote(),
            &namespace,
            session,
            file,
            &mut out,
        )
        .await;
    }
    if let Command::Export { session, remote } = &command {
        return transfer::export(db.as_ref(), remote.remote(), &namespace, session, &mut out).await;
    }
    if let Command::Sessions {
        user,
        sort,
        limit,
        remote,
    } = &command
    {
        let wanted = listing::Wanted {
            user_id: user.clone(),
            sort: *sort,
            limit: *limit,
        };
        return listing::print(db.as_ref(), remote.remote(), &namespace, &wanted, &mut out).await;
    }
    let db = db.context("no database open")?;
    let session = |id: &str| db.session_in(&namespace, id);
    match command {
        Command::Append {
            session: sid,
            text,
            role,
            id,
            parent,
            root,
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
            let options = AppendOptions {
                parent,
                ..Default::default()
            };
            let result = session(&sid)?.append(message, options).await?;
            if !result.inserted {
                eprintln!(
                    "a message with id {} already exists; nothing written",
                    result.message.id
                );
            }
            writeln!(out, "{}", result.message.json())?;
        }
        Command::History {
            session: sid,
            leaf,
            newest_first,
        } => {
            let options = HistoryOptions { leaf, newest_first };
            let mut history = std::pin::pin!(session(&sid)?.history(options));
            while let Some(message) = history.next().await {
                writeln!(out, "{}", message?.json())?;
            }
        }
        Command::Tree { session: sid } => tree::draw(&session(&sid)?, &mut out).await?,
        Command::Search {
            session: sid,
            query,
            limit,
        } => {
            for hit in session(&sid)?.search(&query, limit).await? {
                writeln!(out, "{} [{}] {}", hit.id, hit.role, hit.content)?;
            }
        }
        Command::Stats { session: sid } => stats(&session(&sid)?, &mut out).await?,
        Command::Backup { destination } => {
            let copy = db.store().backup(&destination)?;
            writeln!(out, "{}", copy.display())?;
        }
        Command::Delete {
            session: Some(sid), ..
        } => {
            if !session(&sid)?.delete_session().await? {
                bail!("no session {sid}");
            }
            writeln!(out, "deleted {sid}")?;
        }
        Command::Delete {
            session: None,
            idle_for,
        } => {
            let idle_for = idle_for.context("a session or --idle-for")?;
            let cutoff = retention::cutoff_ms(idle_for);
            let deleted = db
                .delete_sessions_updated_before(&namespace, cutoff)
                .await?;
            writeln!(out, "deleted {deleted} idle sessions")?;
        }
        Command::Serve(_)
        | Command::Migrate { .. }
        | Command::Import { .. }
        | Command::Export { .. }
        | Command::Sessions { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

async fn stats(session: &Session<SqliteStore>, out: &mut impl Write) -> anyhow::Result<()> {
    let stats = session.stats().await?;
    if stats.stored_messages == 0 && stats.leaf_id.is_none() {
        bail!("session {} has no messages", session.id());
    }
    let json = serde_json::json!({
        "sessionId": session.id(),
        "messageCount": stats.message_count,
        "storedMessages": stats.stored_messages,
        "leafId": stats.leaf_id,
        "tokenEstimate": stats.token_estimate,
        "contentBytes": stats.content_bytes,
    });
    writeln!(out, "{json}")?;
    Ok(())
}

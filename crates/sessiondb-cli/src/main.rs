//! The `sessiondb` command: a thin wrapper over the library on the embedded store.
#![forbid(unsafe_code)]

mod tree;

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use futures::executor::block_on;
use sessiondb::{AppendOptions, Db, HistoryOptions, Message, Parent, Session, SqliteStore};

#[derive(Debug, Parser)]
#[command(
    name = "sessiondb",
    version,
    about = "A durable session store for AI agents"
)]
struct Cli {
    /// Directory of the embedded database.
    #[arg(
        long,
        global = true,
        env = "SESSIONDB_DATA",
        default_value = "./sessiondb-data"
    )]
    data: PathBuf,
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let db = Db::open(&cli.data).with_context(|| format!("opening {}", cli.data.display()))?;
    block_on(run(db, cli.namespace, cli.command))
}

async fn run(db: Db<SqliteStore>, namespace: String, command: Command) -> anyhow::Result<()> {
    let session = |id: &str| db.session_in(&namespace, id);
    let mut out = std::io::stdout().lock();
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

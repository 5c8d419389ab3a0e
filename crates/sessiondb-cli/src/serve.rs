//! `sessiondb serve`: configuration from flags, `SESSIONDB_*` variables and an optional TOML
//! file (in that order of precedence), then the HTTP server until SIGTERM or Ctrl-C.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;
use std::sync::Arc;

use sessiondb::{
    BATCH_BUCKETS, Db, ExtractiveSummarizer, Options, SqliteConfig, SqliteStore, Summarizer,
    Synchronous,
};
use sessiondb_postgres::{PgConfig, PgStore};
use sessiondb_server::{App, Limits, Metrics, Reloadable, ServerConfig, Tls};
use sessiondb_summarizers::{AnthropicSummarizer, ModelConfig, OpenAiSummarizer};

use crate::backups::{self, BackupPlan, BackupStats};
use crate::retention::{self, RetentionPlan, RetentionStats};
use crate::signals::Requests;
use crate::vacuums::{self, VacuumStats};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// TOML configuration file (keys as the flags below, in snake_case; API keys in a `[keys]`
    /// table mapping key to namespace, limits in a `[limits]` table).
    #[arg(long, env = "SESSIONDB_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8787].
    #[arg(long, env = "SESSIONDB_LISTEN")]
    listen: Option<SocketAddr>,
    /// PostgreSQL connection string (`postgres://user@host:port/db`): serve from this shared
    /// database, migrating it first, instead of the embedded one in --data. Several servers may
    /// share one database.
    #[arg(long, env = "SESSIONDB_DATABASE", hide_env_values = true)]
    database: Option<String>,
    /// Most PostgreSQL connections this server opens [default: 16].
    #[arg(long, env = "SESSIONDB_DATABASE_POOL")]
    database_pool: Option<usize>,
    /// API key and the namespace it acts in, as KEY=NAMESPACE; repeat for more keys (the
    /// variable takes a comma-separated list). Without keys, requests are anonymous in the
    /// empty namespace and the server only listens on loopback.
    #[arg(long = "api-key", env = "SESSIONDB_API_KEYS", value_delimiter = ',')]
    api_keys: Vec<String>,
    /// Allow anonymous access on a non-loopback address.
    #[arg(long, env = "SESSIONDB_INSECURE")]
    insecure: bool,
    /// Serve HTTPS with this PEM certificate chain (the server's certificate first); needs
    /// --tls-key. SIGHUP reads both files again, so a renewed certificate needs no restart.
    #[arg(long, env = "SESSIONDB_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, in PKCS#8 PEM (`BEGIN PRIVATE KEY`).
    #[arg(long, env = "SESSIONDB_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Largest request body in bytes [default: 67108864].
    #[arg(long, env = "SESSIONDB_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Largest message, serialised, in bytes [default: 50000000].
    #[arg(long, env = "SESSIONDB_MAX_MESSAGE_BYTES")]
    max_message_bytes: Option<usize>,
    /// Most messages per session [default: 10000].
    #[arg(long, env = "SESSIONDB_MAX_MESSAGES_PER_SESSION")]
    max_messages_per_session: Option<u64>,
    /// How long a connection may take to send a request's head (a number and s, m, h or d),
    /// counted from when it opens or its last answer ends; then it is closed: kept connections
    /// idle that long (HTTP/2: with no request open), and clients too slow to send a request
    /// [default: 60s].
    #[arg(long, env = "SESSIONDB_REQUEST_HEAD_TIMEOUT")]
    request_head_timeout: Option<String>,
    /// How long a request's body may send nothing, after its head or between its bytes; then
    /// the request is answered 408 and its connection closed (a body that keeps coming is never
    /// cut) [default: 60s].
    #[arg(long, env = "SESSIONDB_REQUEST_BODY_TIMEOUT")]
    request_body_timeout: Option<String>,
    /// An origin whose web pages may call the API from a browser (`https://app.example.com`,
    /// as browsers send it; `*` for every origin); repeat for more (the variable takes a
    /// comma-separated list) [default: none].
    #[arg(long, env = "SESSIONDB_CORS_ORIGINS", value_delimiter = ',')]
    cors_origin: Vec<String>,
    /// `full` (an acknowledged write survives power loss) or `normal` (survives a crash of the
    /// process, may lose the last writes on power loss) [default: full].
    #[arg(long, env = "SESSIONDB_SYNCHRONOUS")]
    synchronous: Option<String>,
    /// Memory in MiB for decoded rows of recently used sessions, so that re-reading a hot
    /// conversation skips the database; 0 turns it off (embedded store only) [default: 32].
    #[arg(long, env = "SESSIONDB_ROW_CACHE_MIB")]
    row_cache_mib: Option<usize>,
    /// Newest change events kept for subscribers that resume with `Last-Event-ID`, counted over
    /// every namespace; on PostgreSQL a starting server loads them from the database, which
    /// keeps the newest 100,000 [default: 4096].
    #[arg(long, env = "SESSIONDB_FEED_RETAIN")]
    feed_retain: Option<usize>,
    /// Largest size of the database file in MiB; a write that needs more fails with a clear
    /// error and stores nothing, as on a full disk (embedded store only) [default: no limit].
    #[arg(long, env = "SESSIONDB_MAX_DATABASE_MIB")]
    max_database_mib: Option<u64>,
    /// Directory for backups of the embedded store while it serves: one every --backup-every
    /// and one on SIGUSR1, each in a new subdirectory named for its UTC start time, which opens
    /// as a store of its own [default: no backups].
    #[arg(long, env = "SESSIONDB_BACKUP_DIR")]
    backup_dir: Option<PathBuf>,
    /// Time between backups: a number and s, m, h or d [default: 1d].
    #[arg(long, env = "SESSIONDB_BACKUP_EVERY")]
    backup_every: Option<String>,
    /// How many complete backups to keep; older ones are removed after each backup
    /// [default: 7].
    #[arg(long, env = "SESSIONDB_BACKUP_KEEP")]
    backup_keep: Option<usize>,
    /// Delete sessions not written for this long (a number and s, m, h or d, as in `30d`),
    /// with everything in them, in every namespace of the keys; NAMESPACE=TIME sets one
    /// namespace's own time (repeat for more; the variable takes a comma-separated list).
    /// Looked for at start and then every tenth of the shortest time (1 s to 1 h) [default:
    /// sessions are kept].
    #[arg(long, env = "SESSIONDB_DELETE_IDLE_AFTER", value_delimiter = ',')]
    delete_idle_after: Vec<String>,
    /// Log filter: a level (`info`) or `target=level` pairs [default: info].
    #[arg(long, env = "SESSIONDB_LOG")]
    log: Option<String>,
    /// Log lines as `text` (for people) or `json` (one object per line, for log collectors;
    /// the address announcement at start is one too) [default: text].
    #[arg(long, env = "SESSIONDB_LOG_FORMAT")]
    log_format: Option<String>,
    /// Who writes compaction summaries: `extractive` (no model), `openai` (any
    /// OpenAI-compatible chat-completions server), `anthropic`, or `none` (compaction off)
    /// [default: extractive].
    #[arg(long, env = "SESSIONDB_SUMMARIZER")]
    summarizer: Option<String>,
    /// Base URL of the summarizer's model API [default: https://api.openai.com/v1 for openai,
    /// https://api.anthropic.com for anthropic].
    #[arg(long, env = "SESSIONDB_SUMMARIZER_URL")]
    summarizer_url: Option<String>,
    /// Model name for the summarizer (required for openai and anthropic).
    #[arg(long, env = "SESSIONDB_SUMMARIZER_MODEL")]
    summarizer_model: Option<String>,
    /// API key of the summarizer's model API.
    #[arg(long, env = "SESSIONDB_SUMMARIZER_API_KEY", hide_env_values = true)]
    summarizer_api_key: Option<String>,
    /// Seconds one summarizer request may take (retried twice on timeouts and 5xx) [default: 60].
    #[arg(long, env = "SESSIONDB_SUMMARIZER_TIMEOUT")]
    summarizer_timeout: Option<u64>,
}

/// The TOML file's shape; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    data: Option<PathBuf>,
    database: Option<String>,
    database_pool: Option<usize>,
    insecure: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    synchronous: Option<String>,
    row_cache_mib: Option<usize>,
    feed_retain: Option<usize>,
    request_head_timeout: Option<String>,
    request_body_timeout: Option<String>,
    #[serde(default)]
    cors_origins: Vec<String>,
    max_database_mib: Option<u64>,
    backup_dir: Option<PathBuf>,
    backup_every: Option<String>,
    backup_keep: Option<usize>,
    delete_idle_after: Option<String>,
    /// Namespace → its own idle time.
    #[serde(default)]
    delete_idle_after_by_namespace: BTreeMap<String, String>,
    log: Option<String>,
    log_format: Option<String>,
    #[serde(default)]
    keys: HashMap<String, String>,
    #[serde(default)]
    limits: FileLimits,
    #[serde(default)]
    summarizer: FileSummarizer,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSummarizer {
    kind: Option<String>,
    url: Option<String>,
    model: Option<String>,
    api_key: Option<String>,
    timeout: Option<u64>,
}

/// Which summarizer compaction uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SummarizerChoice {
    None,
    Extractive,
    OpenAi(ModelConfig),
    Anthropic(ModelConfig),
}

impl SummarizerChoice {
    fn build(&self) -> Option<Arc<dyn Summarizer>> {
        match self {
            SummarizerChoice::None => None,
            SummarizerChoice::Extractive => Some(Arc::new(ExtractiveSummarizer)),
            SummarizerChoice::OpenAi(config) => {
                Some(Arc::new(OpenAiSummarizer::new(config.clone())))
            }
            SummarizerChoice::Anthropic(config) => {
                Some(Arc::new(AnthropicSummarizer::new(config.clone())))
            }
        }
    }
}

fn summarizer_choice(args: &ServeArgs, file: FileSummarizer) -> anyhow::Result<SummarizerChoice> {
    let kind = args.summarizer.clone().or(file.kind);
    let model_config = |default_url: &str| -> anyhow::Result<ModelConfig> {
        let model = args
            .summarizer_model
            .clone()
            .or(file.model.clone())
            .context("the summarizer needs a model (--summarizer-model)")?;
        let url = args
            .summarizer_url
            .clone()
            .or(file.url.clone())
            .unwrap_or_else(|| default_url.to_owned());
        let mut config = ModelConfig::new(url, model);
        config.api_key = args.summarizer_api_key.clone().or(file.api_key.clone());
        if let Some(seconds) = args.summarizer_timeout.or(file.timeout) {
            config.timeout = std::time::Duration::from_secs(seconds);
        }
        Ok(config)
    };
    Ok(match kind.as_deref().unwrap_or("extractive") {
        "none" => SummarizerChoice::None,
        "extractive" => SummarizerChoice::Extractive,
        "openai" => SummarizerChoice::OpenAi(model_config("https://api.openai.com/v1")?),
        "anthropic" => SummarizerChoice::Anthropic(model_config("https://api.anthropic.com")?),
        other => {
            bail!("summarizer must be extractive, openai, anthropic or none, not `{other}`")
        }
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_body_bytes: Option<usize>,
    max_message_bytes: Option<usize>,
    max_messages_per_session: Option<u64>,
}

/// Where the server keeps its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite database in this directory.
    Embedded { data: PathBuf },
    /// A shared PostgreSQL database.
    Postgres { url: String, pool: usize },
}

/// The PEM files HTTPS is served with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    fn read(&self) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    fn load(&self) -> anyhow::Result<Tls> {
        let (cert, key) = self.read()?;
        Ok(Tls::from_pem(&cert, &key)?)
    }
}

/// Everything `serve` needs, resolved.
#[derive(Debug)]
pub struct Resolved {
    pub listen: SocketAddr,
    pub backend: Backend,
    pub insecure: bool,
    /// HTTPS instead of HTTP.
    pub tls: Option<TlsFiles>,
    pub synchronous: Synchronous,
    pub row_cache_bytes: usize,
    /// Change events kept for resumption.
    pub feed_retain: usize,
    pub max_database_bytes: Option<u64>,
    pub backups: Option<BackupPlan>,
    /// Which idle sessions are deleted.
    pub retention: RetentionPlan,
    pub log: String,
    pub log_format: LogFormat,
    pub server: ServerConfig,
    pub summarizer: SummarizerChoice,
}

pub fn resolve(args: ServeArgs, data: Option<PathBuf>) -> anyhow::Result<Resolved> {
    let mut file: FileConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let mut api_keys = std::mem::take(&mut file.keys);
    for pair in args.api_keys.iter().filter(|p| !p.is_empty()) {
        let Some((key, namespace)) = pair.split_once('=') else {
            bail!("--api-key takes KEY=NAMESPACE, got `{pair}`");
        };
        api_keys.insert(key.to_owned(), namespace.to_owned());
    }
    for (key, namespace) in &api_keys {
        if key.is_empty() {
            bail!("an API key must not be empty");
        }
        sessiondb::SessionKey::new(namespace.as_str(), "probe")
            .with_context(|| format!("namespace `{namespace}` of an API key"))?;
    }
    let summarizer = summarizer_choice(&args, std::mem::take(&mut file.summarizer))?;
    let backups = backup_plan(&args, &file)?;
    let mut retention = RetentionPlan::default();
    let from_file = file.delete_idle_after.iter().cloned().chain(
        std::mem::take(&mut file.delete_idle_after_by_namespace)
            .into_iter()
            .map(|(namespace, time)| format!("{namespace}={time}")),
    );
    for text in from_file.chain(args.delete_idle_after.iter().cloned()) {
        retention.add(&text).context("--delete-idle-after")?;
    }
    let defaults = Limits::default();
    let limits = Limits {
        max_body_bytes: args
            .max_body_bytes
            .or(file.limits.max_body_bytes)
            .unwrap_or(defaults.max_body_bytes),
        max_message_bytes: args
            .max_message_bytes
            .or(file.limits.max_message_bytes)
            .unwrap_or(defaults.max_message_bytes),
        max_messages_per_session: args
            .max_messages_per_session
            .or(file.limits.max_messages_per_session)
            .unwrap_or(defaults.max_messages_per_session),
    };
    let timeout = |flag: &Option<String>, in_file: &Option<String>, name, default| match flag
        .as_ref()
        .or(in_file.as_ref())
    {
        Some(text) => backups::parse_interval(text).context(name),
        None => Ok(default),
    };
    let request_head_timeout = timeout(
        &args.request_head_timeout,
        &file.request_head_timeout,
        "--request-head-timeout",
        ServerConfig::DEFAULT_REQUEST_HEAD_TIMEOUT,
    )?;
    let request_body_timeout = timeout(
        &args.request_body_timeout,
        &file.request_body_timeout,
        "--request-body-timeout",
        ServerConfig::DEFAULT_REQUEST_BODY_TIMEOUT,
    )?;
    let synchronous = match args
        .synchronous
        .or(file.synchronous)
        .as_deref()
        .unwrap_or("full")
    {
        "full" => Synchronous::Full,
        "normal" => Synchronous::Normal,
        other => bail!("synchronous must be `full` or `normal`, not `{other}`"),
    };
    // Flags replace the file's list rather than adding to it, as for every other setting.
    let cors_origins = if args.cors_origin.is_empty() {
        file.cors_origins
    } else {
        args.cors_origin
    };
    for origin in &cors_origins {
        check_origin(origin)?;
    }
    let log_format = match args.log_format.or(file.log_format).as_deref() {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => bail!("the log format must be `text` or `json`, not `{other}`"),
    };
    Ok(Resolved {
        listen: args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default address")),
        backend: match args.database.or(file.database) {
            Some(_) if backups.is_some() => bail!(
                "--backup-dir backs up the embedded store; back a PostgreSQL database up with \
                 its own tools (pg_dump, or the cluster's continuous archiving)"
            ),
            Some(url) => Backend::Postgres {
                url,
                pool: args
                    .database_pool
                    .or(file.database_pool)
                    .unwrap_or(sessiondb_postgres::PgConfig::default().max_connections),
            },
            None => Backend::Embedded {
                data: data
                    .or(file.data)
                    .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_DATA)),
            },
        },
        insecure: args.insecure || file.insecure.unwrap_or(false),
        tls: match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        },
        synchronous,
        row_cache_bytes: args
            .row_cache_mib
            .or(file.row_cache_mib)
            .map_or(SqliteConfig::default().row_cache_bytes, |mib| mib << 20),
        feed_retain: args
            .feed_retain
            .or(file.feed_retain)
            .unwrap_or(SqliteConfig::default().feed_retain),
        max_database_bytes: args
            .max_database_mib
            .or(file.max_database_mib)
            .map(|mib| mib.saturating_mul(1 << 20)),
        backups,
        retention,
        log: args.log.or(file.log).unwrap_or_else(|| "info".into()),
        log_format,
        server: ServerConfig {
            api_keys,
            limits,
            request_head_timeout,
            request_body_timeout,
            cors_origins,
        },
        summarizer,
    })
}

fn backup_plan(args: &ServeArgs, file: &FileConfig) -> anyhow::Result<Option<BackupPlan>> {
    let every = args.backup_every.as_ref().or(file.backup_every.as_ref());
    let keep = args.backup_keep.or(file.backup_keep);
    let Some(dir) = args.backup_dir.as_ref().or(file.backup_dir.as_ref()) else {
        if every.is_some() || keep.is_some() {
            bail!("--backup-every and --backup-keep need --backup-dir");
        }
        return Ok(None);
    };
    let every = every.map_or(backups::DEFAULT_EVERY, String::as_str);
    let every = backups::parse_interval(every).context("--backup-every")?;
    let keep = keep.unwrap_or(backups::DEFAULT_KEEP);
    if keep == 0 {
        bail!("--backup-keep must keep at least one backup");
    }
    Ok(Some(BackupPlan {
        dir: dir.clone(),
        every,
        keep,
    }))
}

/// An origin as a browser sends it in `Origin` (`scheme://host[:port]`, nothing after), or `*`:
/// anything else could never match and is a mistake in the configuration.
fn check_origin(origin: &str) -> anyhow::Result<()> {
    if origin == sessiondb_server::cors::ANY_ORIGIN {
        return Ok(());
    }
    let host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    match host {
        Some(host) if !host.is_empty() && !host.contains(['/', '?', '#', ' ']) => Ok(()),
        _ => bail!(
            "the CORS origin `{origin}` is not an origin: `https://host` or \
             `http://host:port` with nothing after, or `*`"
        ),
    }
}

/// How log lines are written (on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with `message`), and
    /// `span` for a request's lines (`id`, `method`, `route`).
    Json,
}

/// The target of the address announcement, which every log filter lets through: scripts and
/// supervisors read it to learn the port.
const ANNOUNCEMENT: &str = "sessiondb::listening";

fn init_logging(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let targets: tracing_subscriber::filter::Targets = filter
        .parse()
        .with_context(|| format!("log filter `{filter}`"))?;
    let targets = targets.with_target(ANNOUNCEMENT, tracing::Level::INFO);
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => lines.json().with_span_list(false).boxed(),
    };
    tracing_subscriber::registry()
        .with(lines)
        .with(targets)
        .try_init()
        .context("installing the logger")
}

/// Group-commit numbers and the room the database takes of the embedded store, its vacuums, and
/// its backups and idle-session deletes when they are on, for `/metrics`.
fn sqlite_metrics(
    store: &SqliteStore,
    vacuums: Arc<VacuumStats>,
    backups: Option<Arc<BackupStats>>,
    retention: Option<Arc<RetentionStats>>,
) -> sessiondb_server::BackendMetrics {
    let stats = store.write_stats();
    let storage = store.storage_probe();
    Box::new(move |out: &mut String| {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let _ = writeln!(
            out,
            "# HELP sessiondb_commits_total Write transactions committed (one fsync each).\n\
             # TYPE sessiondb_commits_total counter\n\
             sessiondb_commits_total {}\n\
             # HELP sessiondb_write_requests_total Write requests committed.\n\
             # TYPE sessiondb_write_requests_total counter\n\
             sessiondb_write_requests_total {}\n\
             # HELP sessiondb_commit_batch_size Write requests per group commit.\n\
             # TYPE sessiondb_commit_batch_size histogram",
            stats.commits.load(Relaxed),
            stats.requests.load(Relaxed)
        );
        let mut cumulative = 0;
        for (i, bucket) in stats.batch_sizes.iter().enumerate() {
            cumulative += bucket.load(Relaxed);
            let le = if i + 1 == BATCH_BUCKETS {
                "+Inf".to_owned()
            } else {
                (1u64 << i).to_string()
            };
            let _ = writeln!(
                out,
                "sessiondb_commit_batch_size_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "sessiondb_commit_batch_size_sum {}\nsessiondb_commit_batch_size_count {}",
            stats.requests.load(Relaxed),
            stats.commits.load(Relaxed)
        );
        match storage.read() {
            Ok(room) => {
                let _ = writeln!(
                    out,
                    "# HELP sessiondb_database_bytes The database's pages, free ones included \
                     (what --max-database-mib limits).\n\
                     # TYPE sessiondb_database_bytes gauge\n\
                     sessiondb_database_bytes {}\n\
                     # HELP sessiondb_database_free_bytes Free pages in the database: reused by \
                     later writes, given back by `sessiondb vacuum`.\n\
                     # TYPE sessiondb_database_free_bytes gauge\n\
                     sessiondb_database_free_bytes {}\n\
                     # HELP sessiondb_wal_bytes The write-ahead log beside the database.\n\
                     # TYPE sessiondb_wal_bytes gauge\n\
                     sessiondb_wal_bytes {}",
                    room.database_bytes, room.free_bytes, room.wal_bytes
                );
                if let Some(limit) = room.limit_bytes {
                    let _ = writeln!(
                        out,
                        "# HELP sessiondb_database_limit_bytes --max-database-mib, in whole \
                         pages: writes that need room past it fail.\n\
                         # TYPE sessiondb_database_limit_bytes gauge\n\
                         sessiondb_database_limit_bytes {limit}"
                    );
                }
            }
            Err(error) => tracing::warn!("metrics: reading the database's size: {error}"),
        }
        vacuums.write_metrics(out);
        if let Some(backups) = &backups {
            let _ = writeln!(
                out,
                "# HELP sessiondb_backups_total Backups written while serving.\n\
                 # TYPE sessiondb_backups_total counter\n\
                 sessiondb_backups_total {}\n\
                 # HELP sessiondb_backup_failures_total Backups that failed (serving went on).\n\
                 # TYPE sessiondb_backup_failures_total counter\n\
                 sessiondb_backup_failures_total {}\n\
                 # HELP sessiondb_last_backup_timestamp_seconds When the newest backup written \
                 began (Unix time; 0 before the first).\n\
                 # TYPE sessiondb_last_backup_timestamp_seconds gauge\n\
                 sessiondb_last_backup_timestamp_seconds {}",
                backups.written.load(Relaxed),
                backups.failed.load(Relaxed),
                backups.last_written_unix.load(Relaxed)
            );
        }
        if let Some(retention) = &retention {
            retention.write_metrics(out);
        }
    })
}

/// Resolves when SIGTERM or Ctrl-C arrives.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Serves as `args` (and the file they name) say until SIGTERM or Ctrl-C; SIGHUP resolves them
/// again and puts the API keys, CORS origins and TLS certificate they give in force.
pub fn run(args: ServeArgs, data: Option<PathBuf>) -> anyhow::Result<()> {
    let config = resolve(args.clone(), data.clone())?;
    let resolve_again = move || resolve(args.clone(), data.clone());
    init_logging(&config.log, config.log_format)?;
    sessiondb_server::check_bind(config.listen, &config.server, config.insecure)?;
    let tls = config.tls.as_ref().map(TlsFiles::load).transpose()?;
    if tls.is_none() && !config.server.api_keys.is_empty() && !config.listen.ip().is_loopback() {
        tracing::warn!(
            "API keys cross the network in clear text on {}: serve HTTPS (--tls-cert, \
             --tls-key) or behind a TLS proxy",
            config.listen
        );
    }
    #[cfg(unix)]
    raise_open_files_limit();
    let options = Options {
        summarizer: config.summarizer.build(),
        ..Options::default()
    };
    // Embedded store calls run on the worker threads (its reads are short and synchronous), so
    // give the runtime more workers than cores: one blocked on a commit never stalls the rest.
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get() * 4);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let backup_requests = Requests::backups()?;
        let vacuum_requests = Requests::vacuums()?;
        let reloads = Reloads {
            requests: Requests::reloads()?,
            resolve: Box::new(resolve_again),
            tls: tls.clone(),
        };
        let retention_stats = config
            .retention
            .is_on()
            .then(Arc::<RetentionStats>::default);
        match &config.backend {
            Backend::Embedded { data } => {
                let store = open_store(data, &config)?;
                let scheduled = config
                    .backups
                    .map(|plan| (plan, Arc::<BackupStats>::default()));
                let stats = scheduled.as_ref().map(|(_, stats)| stats.clone());
                let vacuum_stats = Arc::<VacuumStats>::default();
                let metrics = Metrics::with_backend(sqlite_metrics(
                    &store,
                    vacuum_stats.clone(),
                    stats,
                    retention_stats.clone(),
                ));
                let app = App::new(Db::with_options(store, options), config.server, metrics);
                retention::start(&app, &config.retention, retention_stats.as_ref());
                tokio::spawn(vacuums::on_request(
                    vacuum_requests,
                    app.clone(),
                    vacuum_stats,
                ));
                match scheduled {
                    Some((plan, stats)) => {
                        tracing::info!(dir = %plan.dir.display(), "backups on");
                        let schedule = backups::Schedule {
                            plan,
                            stats,
                            requests: backup_requests,
                        };
                        tokio::spawn(schedule.run(app.clone()));
                    }
                    None => {
                        tokio::spawn(backup_requests.refuse("this server has no --backup-dir"));
                    }
                }
                let storage = data.display().to_string();
                listen(config.listen, app, &storage, reloads, config.log_format).await
            }
            Backend::Postgres { url, pool } => {
                let pg = PgConfig {
                    max_connections: *pool,
                    feed_retain: config.feed_retain,
                    ..PgConfig::default()
                };
                tokio::spawn(
                    backup_requests
                        .refuse("a PostgreSQL database is backed up with its own tools (pg_dump)"),
                );
                tokio::spawn(
                    vacuum_requests.refuse("PostgreSQL gives free room back itself (autovacuum)"),
                );
                let store = PgStore::connect_with(url, pg)
                    .await
                    .context("connecting to PostgreSQL")?;
                let metrics = match retention_stats.clone() {
                    Some(stats) => Metrics::with_backend(Box::new(move |out: &mut String| {
                        stats.write_metrics(out);
                    })),
                    None => Metrics::default(),
                };
                let app = App::new(Db::with_options(store, options), config.server, metrics);
                retention::start(&app, &config.retention, retention_stats.as_ref());
                listen(config.listen, app, "postgres", reloads, config.log_format).await
            }
        }
    })
}

/// Raises the soft limit of open files to the hard one: every connection holds a file, and
/// service managers start processes with a soft limit of 1,024 (systemd's default) while
/// allowing far more, which would refuse connections long before the machine runs short.
#[cfg(unix)]
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    // No soft limit, or no finite hard one to raise it to (the kernel refuses an unlimited
    // soft one), leaves it as it is.
    let (Some(soft), Some(hard)) = (limit.current, limit.maximum) else {
        return;
    };
    if soft >= hard {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(from = soft, to = hard, "raised the limit of open files"),
        Err(error) => tracing::warn!(soft, hard, "the limit of open files stays: {error}"),
    }
}

/// Serves `app` on `addr` until SIGTERM or Ctrl-C, then drains in-flight requests.
async fn listen<S: sessiondb::Store>(
    addr: SocketAddr,
    app: Arc<App<S>>,
    storage: &str,
    reloads: Reloads,
    log_format: LogFormat,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let addr = listener.local_addr()?;
    let tls = reloads.tls.clone();
    tokio::spawn(reloads.run(app.clone(), addr));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    // Tests and scripts read this line to find the port.
    match log_format {
        LogFormat::Text => {
            tracing::info!(%addr, storage, scheme, "sessiondb listening");
            eprintln!("sessiondb listening on {url}");
        }
        LogFormat::Json => {
            tracing::info!(target: ANNOUNCEMENT, url, storage, "sessiondb listening on {url}")
        }
    }
    match tls {
        Some(tls) => sessiondb_server::serve_tls(listener, tls, app, shutdown_signal()).await?,
        None => sessiondb_server::serve(listener, app, shutdown_signal()).await?,
    }
    tracing::info!("stopped; every acknowledged write is durable");
    Ok(())
}

/// Reloads on SIGHUP: the configuration is resolved again (the file is read again; flags and
/// the environment are the process's own), then its TLS certificate and key are read again and
/// its API keys and CORS origins put in force. A configuration that fails, keys that may not
/// serve the address the server listens on (none on a public address without `insecure`), an
/// unusable certificate, or TLS turned on or off, change nothing. Other settings take a
/// restart.
struct Reloads {
    requests: Requests,
    resolve: Box<dyn Fn() -> anyhow::Result<Resolved> + Send>,
    /// The certificate being served, when the server serves HTTPS.
    tls: Option<Tls>,
}

impl Reloads {
    async fn run<S: sessiondb::Store>(mut self, app: Arc<App<S>>, listening: SocketAddr) {
        loop {
            self.requests.next().await;
            match self.reload(listening) {
                Ok(settings) => {
                    let keys = settings.api_keys.len();
                    let cors_origins = settings.cors_origins.len();
                    app.put_in_force(settings);
                    app.metrics.record_reload(true);
                    tracing::info!(keys, cors_origins, "configuration reloaded");
                }
                Err(error) => {
                    app.metrics.record_reload(false);
                    tracing::error!(
                        "the keys, CORS origins and certificate in force stay: {error:#}"
                    );
                }
            }
        }
    }

    /// Puts the new certificate in force and answers the new keys and CORS origins, or changes
    /// nothing.
    fn reload(&self, listening: SocketAddr) -> anyhow::Result<Reloadable> {
        let resolved = (self.resolve)()?;
        sessiondb_server::check_bind(listening, &resolved.server, resolved.insecure)?;
        match (&self.tls, &resolved.tls) {
            (Some(tls), Some(files)) => {
                let (cert, key) = files.read()?;
                tls.replace_pem(&cert, &key)?;
            }
            (None, None) => {}
            (Some(_), None) => bail!("turning HTTPS off takes a restart"),
            (None, Some(_)) => bail!("turning HTTPS on takes a restart"),
        }
        Ok(Reloadable::from(&resolved.server))
    }
}

fn open_store(data: &Path, resolved: &Resolved) -> anyhow::Result<SqliteStore> {
    let config = SqliteConfig {
        synchronous: resolved.synchronous,
        row_cache_bytes: resolved.row_cache_bytes,
        feed_retain: resolved.feed_retain,
        max_database_bytes: resolved.max_database_bytes,
        ..SqliteConfig::default()
    };
    SqliteStore::open_with(data, config).with_context(|| format!("opening {}", data.display()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn resolved(args: &[&str], data: Option<PathBuf>) -> anyhow::Result<Resolved> {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(args);
        resolve(Serve::try_parse_from(argv)?.args, data)
    }

    /// A configuration file holding `toml`, in a directory that lives as long as the guard.
    fn config_file(toml: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, toml).unwrap();
        (dir, file)
    }

    #[test]
    fn no_flags_means_loopback_8787_over_the_local_data_directory() {
        let r = resolved(&[], None).unwrap();
        assert_eq!(r.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(
            r.backend,
            Backend::Embedded {
                data: PathBuf::from(crate::DEFAULT_DATA)
            }
        );
        assert_eq!(r.server.limits, Limits::default());
        assert!(r.server.api_keys.is_empty() && !r.insecure);
        assert_eq!(r.synchronous, Synchronous::Full);
        assert_eq!(r.row_cache_bytes, SqliteConfig::default().row_cache_bytes);
        assert_eq!(r.feed_retain, 4096);
        assert_eq!(r.max_database_bytes, None);
        assert_eq!(r.server.request_head_timeout, Duration::from_secs(60));
        assert_eq!(r.server.request_body_timeout, Duration::from_secs(60));
        assert!(r.server.cors_origins.is_empty());
    }

    #[test]
    fn flags_win_over_the_file_and_bad_values_are_refused() {
        let (_dir, file) = config_file(
            "data = \"/from/file\"\nsynchronous = \"normal\"\nrow_cache_mib = 3\nfeed_retain = 9\nrequest_head_timeout = \"2m\"\nrequest_body_timeout = \"3m\"\ncors_origins = [\"https://app.example\"]\nmax_database_mib = 7\n[limits]\nmax_body_bytes = 10\nmax_message_bytes = 5\n",
        );
        let path = file.to_str().unwrap();
        let r = resolved(&["--config", path, "--max-body-bytes", "20"], None).unwrap();
        assert_eq!(r.server.limits.max_body_bytes, 20);
        assert_eq!(r.server.limits.max_message_bytes, 5);
        assert_eq!(
            r.backend,
            Backend::Embedded {
                data: PathBuf::from("/from/file")
            }
        );
        assert_eq!(r.synchronous, Synchronous::Normal);
        assert_eq!(r.row_cache_bytes, 3 << 20);
        assert_eq!(r.feed_retain, 9);
        assert_eq!(r.server.request_head_timeout, Duration::from_secs(120));
        assert_eq!(r.server.request_body_timeout, Duration::from_secs(180));
        assert_eq!(r.server.cors_origins, ["https://app.example"]);
        assert_eq!(r.max_database_bytes, Some(7 << 20));
        let r = resolved(
            &[
                "--config",
                path,
                "--row-cache-mib",
                "0",
                "--max-database-mib",
                "2",
                "--feed-retain",
                "0",
                "--request-head-timeout",
                "5s",
                "--request-body-timeout",
                "7s",
            ],
            None,
        )
        .unwrap();
        assert_eq!(r.server.request_head_timeout, Duration::from_secs(5));
        assert_eq!(r.server.request_body_timeout, Duration::from_secs(7));
        assert_eq!(r.row_cache_bytes, 0);
        assert_eq!(r.feed_retain, 0);
        assert_eq!(r.max_database_bytes, Some(2 << 20));
        let r = resolved(&["--config", path], Some(PathBuf::from("/flag"))).unwrap();
        assert_eq!(
            r.backend,
            Backend::Embedded {
                data: PathBuf::from("/flag")
            }
        );
        std::fs::write(&file, "database = \"postgres://db/x\"\ndatabase_pool = 3\n").unwrap();
        let r = resolved(&["--config", path], None).unwrap();
        assert_eq!(
            r.backend,
            Backend::Postgres {
                url: "postgres://db/x".into(),
                pool: 3
            }
        );
        let r = resolved(&["--config", path, "--database", "postgres://flag/y"], None).unwrap();
        assert_eq!(
            r.backend,
            Backend::Postgres {
                url: "postgres://flag/y".into(),
                pool: 3
            }
        );
        assert!(resolved(&["--api-key", "no-namespace"], None).is_err());
        assert!(resolved(&["--synchronous", "sometimes"], None).is_err());
        assert!(resolved(&["--request-head-timeout", "0s"], None).is_err());
        assert!(resolved(&["--request-body-timeout", "soon"], None).is_err());
        for origin in [
            "localhost:5173",
            "http://localhost:5173/",
            "https://",
            "ftp://x",
        ] {
            assert!(
                resolved(&["--cors-origin", origin], None).is_err(),
                "{origin}"
            );
        }
        let r = resolved(
            &[
                "--cors-origin",
                "http://localhost:5173",
                "--cors-origin",
                "*",
            ],
            None,
        )
        .unwrap();
        assert_eq!(r.server.cors_origins, ["http://localhost:5173", "*"]);
        assert!(resolved(&["--tls-cert", "cert.pem"], None).is_err());
        let r = resolved(&["--tls-cert", "cert.pem", "--tls-key", "key.pem"], None).unwrap();
        assert_eq!(
            r.tls,
            Some(TlsFiles {
                cert: "cert.pem".into(),
                key: "key.pem".into()
            })
        );
        std::fs::write(&file, "unknown = 1\n").unwrap();
        assert!(resolved(&["--config", path], None).is_err());
    }

    #[test]
    fn idle_sessions_are_kept_unless_a_time_is_configured_by_flag_or_file() {
        let days = |d: u64| Duration::from_secs(d * 86_400);
        assert_eq!(
            resolved(&[], None).unwrap().retention,
            RetentionPlan::default()
        );
        assert!(!RetentionPlan::default().is_on());
        let r = resolved(&["--delete-idle-after", "30d"], None).unwrap();
        assert_eq!(r.retention.everywhere, Some(days(30)));
        assert!(r.retention.is_on());
        let (_dir, file) = config_file(
            "delete_idle_after = \"12h\"\n[delete_idle_after_by_namespace]\n\"free\" = \"7d\"\n\"paid\" = \"90d\"\n",
        );
        let path = file.to_str().unwrap();
        let r = resolved(&["--config", path], None).unwrap();
        assert_eq!(
            r.retention.everywhere,
            Some(Duration::from_secs(12 * 3_600))
        );
        let by_namespace = |pairs: &[(&str, Duration)]| -> BTreeMap<String, Duration> {
            pairs.iter().map(|(n, d)| (n.to_string(), *d)).collect()
        };
        assert_eq!(
            r.retention.by_namespace,
            by_namespace(&[("free", days(7)), ("paid", days(90))])
        );
        // Flags win per namespace; all before the last `=` names the namespace.
        let args = [
            "--config",
            path,
            "--delete-idle-after",
            "90s",
            "--delete-idle-after",
            "paid=1d",
        ];
        let r = resolved(&args, None).unwrap();
        assert_eq!(r.retention.everywhere, Some(Duration::from_secs(90)));
        assert_eq!(
            r.retention.by_namespace,
            by_namespace(&[("free", days(7)), ("paid", days(1))])
        );
        let r = resolved(&["--delete-idle-after", "a=b=2d,=1d"], None).unwrap();
        assert_eq!(r.retention.everywhere, None);
        assert_eq!(
            r.retention.by_namespace,
            by_namespace(&[("", days(1)), ("a=b", days(2))])
        );
        for refused in ["0d", "30", "soon", "-1h", "ns=", "ns=0s", "bad\u{1}ns=1d"] {
            assert!(
                resolved(&["--delete-idle-after", refused], None).is_err(),
                "{refused} was accepted"
            );
        }
        // A tenth of the time, between a second and an hour.
        let every = |seconds| retention::sweep_every(Duration::from_secs(seconds)).as_secs();
        assert_eq!([every(2), every(600), every(30 * 86_400)], [1, 60, 3_600]);
    }

    #[test]
    fn backups_are_configured_by_flag_or_file_for_the_embedded_store_only() {
        assert_eq!(resolved(&[], None).unwrap().backups, None);
        let r = resolved(&["--backup-dir", "/b"], None).unwrap();
        assert_eq!(
            r.backups,
            Some(BackupPlan {
                dir: PathBuf::from("/b"),
                every: Duration::from_secs(86_400),
                keep: 7
            })
        );
        let (_dir, file) =
            config_file("backup_dir = \"/f\"\nbackup_every = \"6h\"\nbackup_keep = 3\n");
        let path = file.to_str().unwrap();
        let r = resolved(&["--config", path, "--backup-keep", "2"], None).unwrap();
        assert_eq!(
            r.backups,
            Some(BackupPlan {
                dir: PathBuf::from("/f"),
                every: Duration::from_secs(6 * 3_600),
                keep: 2
            })
        );
        for refused in [
            &["--backup-every", "1h"][..],
            &["--backup-keep", "3"],
            &["--backup-dir", "/b", "--backup-keep", "0"],
            &["--backup-dir", "/b", "--backup-every", "soon"],
            &["--backup-dir", "/b", "--database", "postgres://db/x"],
        ] {
            assert!(resolved(refused, None).is_err(), "{refused:?} was accepted");
        }
    }

    #[test]
    fn the_summarizer_is_configured_by_flag_or_file() {
        assert_eq!(
            resolved(&[], None).unwrap().summarizer,
            SummarizerChoice::Extractive
        );
        assert_eq!(
            resolved(&["--summarizer", "none"], None)
                .unwrap()
                .summarizer,
            SummarizerChoice::None
        );
        let r = resolved(
            &[
                "--summarizer",
                "openai",
                "--summarizer-model",
                "gpt-x",
                "--summarizer-timeout",
                "5",
            ],
            None,
        )
        .unwrap();
        let SummarizerChoice::OpenAi(config) = r.summarizer else {
            panic!("{:?}", r.summarizer)
        };
        assert_eq!(config.base_url, "https://api.openai.com/v1");
        assert_eq!(
            (config.model.as_str(), config.timeout.as_secs()),
            ("gpt-x", 5)
        );
        assert!(
            resolved(&["--summarizer", "openai"], None).is_err(),
            "a model is required"
        );
        assert!(resolved(&["--summarizer", "oracle"], None).is_err());

        let (_dir, file) = config_file(
            "[summarizer]\nkind = \"anthropic\"\nmodel = \"claude-x\"\napi_key = \"k\"\nurl = \"http://127.0.0.1:9\"\n",
        );
        let r = resolved(&["--config", file.to_str().unwrap()], None).unwrap();
        let SummarizerChoice::Anthropic(config) = r.summarizer else {
            panic!("{:?}", r.summarizer)
        };
        assert_eq!(config.base_url, "http://127.0.0.1:9");
        assert_eq!(config.api_key.as_deref(), Some("k"));
    }
}

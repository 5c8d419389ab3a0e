//! A throw-away PostgreSQL cluster for tests and benchmarks: a copy of an `initdb` template in a
//! temporary directory, `pg_ctl start` on a free loopback port, stopped and deleted on drop.
//!
//! The binaries come from `SESSIONDB_PG_BINDIR`, else `pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root, so as root the cluster runs
//! as the `postgres` user (created by the distribution's package) through `runuser`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Why a cluster could not start. The message says how to fix a missing installation.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "PostgreSQL is not installed (no initdb found via SESSIONDB_PG_BINDIR, pg_config or \
         /usr/lib/postgresql/*/bin): install it, e.g. `apt-get install postgresql`"
    )]
    NotInstalled,
    #[error("running as root needs the `postgres` user to own the cluster: {0}")]
    NoUser(String),
    #[error("`{command}` failed: {output}")]
    Command { command: String, output: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A running cluster; stopped (immediately) and removed when dropped.
#[derive(Debug)]
pub struct TempCluster {
    bindir: PathBuf,
    data: tempfile::TempDir,
    port: u16,
    /// The user the server runs as, when this process is root.
    run_as: Option<String>,
    /// Server settings beyond the defaults, as `-c name=value` options.
    settings: Vec<(String, String)>,
}

fn find_bindir() -> Option<PathBuf> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Some(dir) = std::env::var_os("SESSIONDB_PG_BINDIR").map(PathBuf::from) {
        return has_initdb(&dir).then_some(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Some(dir);
        }
    }
    let mut installed: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let entry = e.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_initdb(&bin).then_some((version, bin))
        })
        .collect();
    installed.sort();
    installed.pop().map(|(_, bin)| bin)
}

fn run(mut command: Command) -> Result<Output, ClusterError> {
    let shown = format!("{command:?}");
    let output = command.output()?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(ClusterError::Command {
            command: shown,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// FNV-1a, to name the template after the binaries that made it.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> Result<u16, ClusterError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl TempCluster {
    /// Starts a cluster (a fraction of a second: its files are copied from a template that the
    /// first cluster of this installation initialises); `trust` authentication on 127.0.0.1
    /// for the user `postgres`.
    pub fn start() -> Result<Self, ClusterError> {
        Self::start_with(&[])
    }

    /// Starts a cluster whose server runs with these settings (`name`, `value`), e.g.
    /// `shared_preload_libraries`.
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self, ClusterError> {
        let bindir = find_bindir().ok_or(ClusterError::NotInstalled)?;
        let data = tempfile::Builder::new().prefix("sessiondb-pg-").tempdir()?;
        let run_as = if is_root() {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:postgres"]).arg(data.path());
            run(chown).map_err(|e| ClusterError::NoUser(e.to_string()))?;
            Some("postgres".to_owned())
        } else {
            None
        };
        let cluster = Self {
            bindir,
            data,
            port: free_port()?,
            run_as,
            settings: settings
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
        };
        let template = cluster.template()?;
        let mut copy = Command::new("cp");
        copy.arg("-a").arg(&template).arg(cluster.pgdata());
        run(copy)?;
        cluster.resume()?;
        Ok(cluster)
    }

    /// Stops the server at once (as a crash would), keeping its data; [`TempCluster::resume`]
    /// starts it again on the same port.
    pub fn halt(&self) -> Result<(), ClusterError> {
        let mut stop = self.command("pg_ctl");
        stop.args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.pgdata());
        run(stop).map(drop)
    }

    /// Starts the server on this cluster's port and data.
    pub fn resume(&self) -> Result<(), ClusterError> {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=on",
            self.port,
            self.data.path().display()
        );
        for (name, value) in &self.settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let mut start = self.command("pg_ctl");
        start
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(self.pgdata())
            .arg("-l")
            .arg(self.data.path().join("server.log"))
            .args(["-o", &options]);
        run(start).map(drop)
    }

    /// A freshly initialised, never started data directory for these binaries, made once (under
    /// a file lock, so concurrent test processes share it) in the system's temporary directory.
    fn template(&self) -> Result<PathBuf, ClusterError> {
        let tag = fnv1a(self.bindir.to_string_lossy().as_bytes());
        let owner = self.run_as.as_deref().unwrap_or("self");
        let root = std::env::temp_dir();
        let template = root.join(format!("sessiondb-pg-template-{owner}-{tag:x}"));
        let lock = std::fs::File::create(root.join(format!("sessiondb-pg-template-{tag:x}.lock")))?;
        lock.lock()?;
        if template.join("PG_VERSION").is_file() {
            return Ok(template);
        }
        let building = root.join(format!(
            "sessiondb-pg-template-{tag:x}.{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&building)?;
        if let Some(user) = &self.run_as {
            let mut chown = Command::new("chown");
            chown.arg(format!("{user}:{user}")).arg(&building);
            run(chown).map_err(|e| ClusterError::NoUser(e.to_string()))?;
        }
        let mut initdb = self.command("initdb");
        initdb
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&building);
        run(initdb)?;
        std::fs::rename(&building, &template)?;
        Ok(template)
    }

    fn pgdata(&self) -> PathBuf {
        self.data.path().join("pgdata")
    }

    fn command(&self, program: &str) -> Command {
        let binary = self.bindir.join(program);
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(binary);
                command
            }
            None => Command::new(binary),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection string for the `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a database as a copy of `template` (e.g. `template1`, empty) and returns its
    /// connection string: many stores on one cluster, each with a database of its own.
    pub fn create_database(&self, name: &str, template: &str) -> Result<String, ClusterError> {
        let mut createdb = self.command("createdb");
        createdb
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-T", template])
            .arg(name);
        run(createdb)?;
        Ok(format!(
            "postgres://postgres@127.0.0.1:{}/{name}",
            self.port
        ))
    }

    /// The server's log so far (for failing tests).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

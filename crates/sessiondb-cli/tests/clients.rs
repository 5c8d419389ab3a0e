//! The Python and TypeScript clients and their framework adapters (`clients/`): each client's
//! suite runs against the `sessiondb` binary cargo built, with the OpenAI Agents SDK, the Claude
//! Agent SDK and LangGraph from PyPI (into a virtualenv cached under cargo's target directory)
//! and from npm (`npm ci` into the package's `node_modules`, again only when its lock file
//! changed), including LangGraph's own checkpointer conformance suites. Each suite runs a second
//! time with its servers on PostgreSQL. Without `python3` (and its `venv` module) or
//! `node` and `npm` the tests fail: `.ci/run` installs them.

mod common;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::Served;
use sessiondb_postgres::cluster::TempCluster;

#[test]
fn python_client_suite_passes_against_the_server() {
    python_suite(&[]);
}

/// The same suite with every server it starts on a PostgreSQL database of its own (room to
/// spare: a server that finds none left fails its tests).
#[test]
fn python_client_suite_passes_on_postgresql() {
    let (_cluster, databases) = postgres_databases(48);
    python_suite(&[("SESSIONDB_TEST_DATABASES", &databases)]);
}

fn python_suite(env: &[(&str, &str)]) {
    let clients = clients_dir().join("python");
    let run = run_suite(
        python_in(&clients).args(["-m", "unittest", "discover", "-s", "tests", "-v"]),
        &clients,
        env,
    );
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the Python suite failed:\n{report}");
    // unittest prints its count last: a suite that found no tests must not pass for one that ran.
    assert!(report.contains("\nOK"), "{report}");
    assert!(!report.contains("Ran 0 tests"), "{report}");
}

/// Both runs in one test: they share the package's `node_modules`, which two test processes
/// must not install at once.
#[test]
fn typescript_client_suite_passes_on_both_backends() {
    let package = clients_dir().join("typescript");
    install_node_modules(&package);
    must_run(
        Command::new("node_modules/.bin/tsc")
            .args(["-p", "."])
            .current_dir(&package),
    );
    typescript_suite(&package, &[]);
    // Every client on `fetch`, the transport of browsers, workers and edge functions.
    node_suites(&package, &[], &["--import", "./test/fetch-transport.mjs"]);
    both_clients_read_what_the_other_wrote(&package);

    // A database per server the suites start, with room to spare.
    let (_cluster, databases) = postgres_databases(32);
    let claims = tempfile::tempdir().unwrap();
    typescript_suite(
        &package,
        &[
            ("SESSIONDB_TEST_DATABASES", &databases),
            ("SESSIONDB_TEST_CLAIMS", claims.path().to_str().unwrap()),
        ],
    );
}

fn typescript_suite(package: &Path, env: &[(&str, &str)]) {
    node_suites(package, env, &[]);

    // LangGraph.js's checkpointer specification is written for vitest.
    let spec = run_suite(
        Command::new("node_modules/.bin/vitest")
            .args(["run", "--globals", "test/langgraph.spec.mjs"])
            .env("NO_COLOR", "1"),
        package,
        env,
    );
    let report = String::from_utf8_lossy(&spec.stdout);
    assert!(
        spec.status.success(),
        "LangGraph's specification failed:\n{report}"
    );
    let summary = report
        .lines()
        .find(|l| l.trim_start().starts_with("Tests"))
        .unwrap_or("");
    assert!(
        summary.contains(" passed (") && !summary.contains("failed"),
        "{report}"
    );
}

/// The `*.test.mjs` suites under `node --test`, with `node_args` (a module to preload) before.
fn node_suites(package: &Path, env: &[(&str, &str)], node_args: &[&str]) {
    let mut suites: Vec<PathBuf> = std::fs::read_dir(package.join("test"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    suites.sort();
    assert!(suites.len() >= 3, "{suites:?}");
    let run = run_suite(
        Command::new("node")
            .args(node_args)
            .arg("--test")
            .args(&suites),
        package,
        env,
    );
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the TypeScript suite {node_args:?} failed:\n{report}"
    );
    assert!(report.contains("\n# fail 0"), "{report}");
    assert!(!report.contains("\n# pass 0"), "{report}");
}

/// What one client stores the other reads as it was written: a Claude transcript, a session
/// binding, LangGraph store items, a LangChain history and an ADK session go from Python to
/// TypeScript and back through one server.
fn both_clients_read_what_the_other_wrote(package: &Path) {
    let python = clients_dir().join("python");
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(&dir.path().join("data"), &["--listen", "127.0.0.1:0"], &[]);
    let (from_python, from_typescript) = (dir.path().join("py.json"), dir.path().join("ts.json"));
    must_run(
        python_in(&python)
            .args(["tests/interop.py", "write", &served.base])
            .arg(&from_python),
    );
    must_run(
        Command::new("node")
            .args(["test/interop.mjs", &served.base])
            .args([&from_python, &from_typescript])
            .current_dir(package),
    );
    must_run(
        python_in(&python)
            .args(["tests/interop.py", "check", &served.base])
            .arg(&from_typescript),
    );
}

/// The clients' virtualenv's Python, run in the Python client's directory with it importable.
fn python_in(clients: &Path) -> Command {
    let mut python = Command::new(virtualenv(&clients.join("tests/requirements.txt")));
    python
        .current_dir(clients)
        .env("PYTHONPATH", clients)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    python
}

/// Runs a client suite's test runner in `dir` against the binary cargo built, with `env` (the
/// PostgreSQL settings, when any) on top; the whole output, for the caller to judge.
fn run_suite(runner: &mut Command, dir: &Path, env: &[(&str, &str)]) -> Output {
    runner
        .current_dir(dir)
        .env("SESSIONDB_BIN", env!("CARGO_BIN_EXE_sessiondb"))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{runner:?}: {e}"))
}

/// A throw-away cluster with `count` empty databases, their connection strings comma-separated
/// (as the suites' server helpers read them); the cluster stops when dropped.
fn postgres_databases(count: usize) -> (TempCluster, String) {
    let cluster = TempCluster::start()
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"));
    let databases: Vec<String> = (0..count)
        .map(|i| cluster.create_database(&format!("clients_{i}"), "template1"))
        .collect::<Result<_, _>>()
        .unwrap();
    (cluster, databases.join(","))
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// `npm ci` unless `node_modules` was installed from this very lock file. Optional packages
/// come too (vitest needs its platform's native bundler; the Claude SDK's optional Claude Code
/// binary, 400 MB, comes along unused).
fn install_node_modules(package: &Path) {
    const NPM_CI: [&str; 3] = ["ci", "--no-audit", "--no-fund"];
    // The stamp names the command too: the same lock installed another way is not the same tree.
    let mut installed_from = std::fs::read(package.join("package-lock.json")).unwrap();
    installed_from.extend_from_slice(NPM_CI.join(" ").as_bytes());
    let stamp = package.join("node_modules/.installed-from-lock");
    if std::fs::read(&stamp).is_ok_and(|installed| installed == installed_from) {
        return;
    }
    must_run(Command::new("npm").args(NPM_CI).current_dir(package));
    std::fs::write(stamp, installed_from).unwrap();
}

/// The Python of a virtualenv holding `requirements`, made once per content of that file. It is
/// built under a temporary name and renamed when complete, so a failed install is never reused.
fn virtualenv(requirements: &Path) -> PathBuf {
    let pinned = std::fs::read(requirements).unwrap();
    let mut hasher = DefaultHasher::new();
    pinned.hash(&mut hasher);
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let ready = root.join(format!("python-clients-{:016x}", hasher.finish()));
    if !ready.exists() {
        let building = root.join(format!("python-clients-building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&building);
        must_run(Command::new("python3").arg("-m").arg("venv").arg(&building));
        must_run(
            Command::new(building.join("bin/python"))
                .args(["-m", "pip", "install", "-q", "-r"])
                .arg(requirements),
        );
        if std::fs::rename(&building, &ready).is_err() {
            // Another run finished first; its environment is as good as this one.
            std::fs::remove_dir_all(&building).unwrap();
        }
        // Environments of earlier requirements are not used again (the SDKs take about half a
        // gigabyte); builds in progress (another test process's) are left alone.
        for entry in std::fs::read_dir(root).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = name.starts_with("python-clients-") && !name.contains("-building-");
            if stale && entry.path() != ready {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    ready.join("bin/python")
}

fn must_run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

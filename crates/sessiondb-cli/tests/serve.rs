//! `sessiondb serve`, `import` and `export` as real processes on real sockets.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Served, metric};
use futures::StreamExt;
use serde_json::{Value, json};
use sessiondb::Db;

fn free_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Whether `check` holds within 5 s (asked every 20 ms): for what a signal makes the server do.
async fn eventually(mut check: impl AsyncFnMut() -> bool) -> bool {
    for _ in 0..250 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_keeps_every_acknowledged_write() {
    let dir = free_dir();
    let served = Served::start(dir.path(), &["--listen", "127.0.0.1:0"], &[]);
    let client = reqwest::Client::new();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (client, base) = (client.clone(), served.base.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0.. {
                let id = format!("w{w}-{i}");
                let body = json!({"id": id, "role": "user", "content": "x"});
                match client
                    .post(format!("{base}/v1/sessions/s/messages"))
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 201 => acknowledged.push(id),
                    _ => break,
                }
            }
            acknowledged
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = tokio::task::spawn_blocking(move || served.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    assert!(acknowledged.len() > 8, "writes happened before the signal");
    let db = Db::open(dir.path()).unwrap();
    let session = db.session("s").unwrap();
    for id in &acknowledged {
        assert!(
            session.message(id).await.unwrap().is_some(),
            "{id} was acknowledged but lost"
        );
    }
}

/// Each connection holds a file: a server started with a low soft limit of open files (as
/// service managers start processes) raises it to the hard limit.
#[test]
fn serving_raises_the_soft_limit_of_open_files_to_the_hard_one() {
    let dir = free_dir();
    let served = Served::start_under_ulimit(dir.path(), &["--listen", "127.0.0.1:0"], "-S -n 64");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", served.pid())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_ne!(open_files[0], "64", "{limits}");
    assert_eq!(open_files[0], open_files[1], "{limits}");
}

/// A server out of file descriptors keeps the connections it has and takes new ones once
/// some close: it neither exits nor spins on the failing accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_file_descriptors_recovers_when_connections_close() {
    let dir = free_dir();
    let served = Served::start_under_ulimit(dir.path(), &["--listen", "127.0.0.1:0"], "-n 64");
    let address = served.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fds = std::fs::read_dir(format!("/proc/{}/fd", served.pid()))
        .unwrap()
        .count();
    assert!(fds >= 60, "the server holds {fds} files: it ran out");
    drop(held);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let health = client
        .get(format!("{}/healthz", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    append_one(&served.base, "after").await;
}

/// SIGHUP puts the configuration file's keys in force without a restart; a file that no longer
/// parses, or keys that would leave a public address open to anonymous requests, leave the
/// keys in force as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_api_keys_from_the_file() {
    let dir = free_dir();
    let config = dir.path().join("sessiondb.toml");
    let keys = |key: &str| format!("[keys]\n\"{key}\" = \"team\"\n");
    std::fs::write(&config, keys("old-key")).unwrap();
    let served = Served::start(
        &dir.path().join("data"),
        &[
            "--listen",
            "0.0.0.0:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let client = reqwest::Client::new();
    let status = async |key: &str| {
        let url = format!("{}/v1/sessions/s", served.base);
        let response = client.get(url).bearer_auth(key).send().await.unwrap();
        response.status().as_u16()
    };
    let append = client
        .post(format!("{}/v1/sessions/s/messages", served.base))
        .bearer_auth("old-key")
        .json(&json!({"id": "m1", "role": "user", "content": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(append.status(), 201);
    assert_eq!(status("new-key").await, 401);
    let metric = async |name: &str| {
        let text = client
            .get(format!("{}/metrics", served.base))
            .bearer_auth("new-key")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")));
        line.unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };

    std::fs::write(&config, keys("new-key")).unwrap();
    served.signal("HUP");
    assert!(
        eventually(async || status("new-key").await == 200).await,
        "the new key is in force"
    );
    assert_eq!(status("old-key").await, 401);
    assert_eq!(metric("sessiondb_reloads_total").await, 1);

    for broken in ["[keys\n", "listen = \"0.0.0.0:0\"\n"] {
        let failures = metric("sessiondb_reload_failures_total").await;
        std::fs::write(&config, broken).unwrap();
        served.signal("HUP");
        let failed = async || metric("sessiondb_reload_failures_total").await > failures;
        assert!(eventually(failed).await, "{broken}");
        assert_eq!(
            metric("sessiondb_reload_failures_total").await,
            failures + 1
        );
        assert_eq!(status("new-key").await, 200, "{broken}");
    }
    assert_eq!(metric("sessiondb_reloads_total").await, 1);
}

/// SIGHUP puts the configuration file's CORS origins in force, so a new web front end needs no
/// restart; a listed origin that is not one leaves the origins in force as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_cors_origins_from_the_file() {
    let dir = free_dir();
    let config = dir.path().join("sessiondb.toml");
    let origins = |origin: &str| format!("cors_origins = [\"{origin}\"]\n");
    std::fs::write(&config, origins("https://old.example")).unwrap();
    let served = Served::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        &[],
    );
    let client = reqwest::Client::new();
    let allowed = async |origin: &str| {
        let response = client
            .get(format!("{}/v1/sessions", served.base))
            .header("origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let header = response.headers().get("access-control-allow-origin");
        header.map(|value| value.to_str().unwrap().to_owned())
    };
    assert_eq!(
        allowed("https://old.example").await.as_deref(),
        Some("https://old.example")
    );
    assert_eq!(allowed("https://new.example").await, None);

    std::fs::write(&config, origins("https://new.example")).unwrap();
    served.signal("HUP");
    assert!(
        eventually(async || allowed("https://new.example").await.is_some()).await,
        "the new origin is in force"
    );
    assert_eq!(allowed("https://old.example").await, None);

    let failures = metric(&served.base, "sessiondb_reload_failures_total").await;
    std::fs::write(&config, origins("https://other.example/app")).unwrap();
    served.signal("HUP");
    let failed = async || metric(&served.base, "sessiondb_reload_failures_total").await > failures;
    assert!(eventually(failed).await, "a path is not part of an origin");
    assert_eq!(
        allowed("https://new.example").await.as_deref(),
        Some("https://new.example")
    );
    assert_eq!(allowed("https://other.example").await, None);
}

/// `--tls-cert` and `--tls-key` serve HTTPS; SIGHUP reads the two files again, so a renewed
/// certificate is offered to new connections without a restart, and files that are not a
/// usable certificate leave the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_certificate_renewed_on_sighup() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sessiondb-server/tests/tls");
    let fixture = |name: &str| std::fs::read(fixtures.join(name)).unwrap();
    let dir = free_dir();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, fixture("first-cert.pem")).unwrap();
    std::fs::write(&key, fixture("first-key.pem")).unwrap();
    let served = Served::start(
        &dir.path().join("data"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        served.base.starts_with("https://127.0.0.1:"),
        "{}",
        served.base
    );
    let trusting = |cert: &str| {
        let root = reqwest::Certificate::from_pem(&fixture(cert)).unwrap();
        reqwest::Client::builder()
            .tls_certs_only([root])
            .build()
            .unwrap()
    };
    let healthy = async |client: &reqwest::Client| {
        let url = format!("{}/healthz", served.base);
        client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    };
    let first = trusting("first-cert.pem");
    let appended = first
        .post(format!("{}/v1/sessions/s/messages", served.base))
        .json(&json!({"role": "user", "content": "over TLS"}))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 201);
    assert!(!healthy(&trusting("second-cert.pem")).await);
    // The command line trusts what it is given beside the system's store.
    let cli_append = |extra: &[&str]| {
        let mut args = vec![
            "append",
            "--url",
            &served.base,
            "--text",
            "from the CLI",
            "s",
        ];
        args.extend_from_slice(extra);
        common::sessiondb(&args, None)
    };
    let refused = cli_append(&[]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("certificate"));
    let first_cert = fixtures.join("first-cert.pem");
    let trusted = cli_append(&["--ca-cert", first_cert.to_str().unwrap()]);
    assert!(trusted.status.success(), "{trusted:?}");
    let no_certificate = cli_append(&["--ca-cert", key.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&no_certificate.stderr).contains("holds no PEM certificate"),
        "{no_certificate:?}"
    );

    std::fs::write(&cert, fixture("second-cert.pem")).unwrap();
    std::fs::write(&key, fixture("second-key.pem")).unwrap();
    served.signal("HUP");
    let renewed = async || healthy(&trusting("second-cert.pem")).await;
    assert!(
        eventually(renewed).await,
        "the renewed certificate is offered"
    );
    assert!(!healthy(&trusting("first-cert.pem")).await);

    std::fs::write(&key, b"not a key").unwrap();
    served.signal("HUP");
    let second = trusting("second-cert.pem");
    let failures = async || {
        let text = second
            .get(format!("{}/metrics", served.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.contains("\nsessiondb_reload_failures_total 1\n")
    };
    assert!(
        eventually(failures).await,
        "an unusable key is a failed reload"
    );
    assert!(healthy(&trusting("second-cert.pem")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_from_file_environment_and_flags() {
    let dir = free_dir();
    let config = dir.path().join("sessiondb.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:1\"\n[keys]\n\"file-key\" = \"from-file\"\n[limits]\nmax_messages_per_session = 1\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    // The flag's listen address wins over the file's; keys merge from file and environment.
    let served = Served::start(
        &data,
        &[
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("SESSIONDB_API_KEYS", "env-key=from-env")],
    );
    let client = reqwest::Client::new();
    let url = format!("{}/v1/sessions/s/messages", served.base);
    let body = json!({"role": "user", "content": "x"});
    let anonymous = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    for key in ["file-key", "env-key"] {
        let first = client
            .post(&url)
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 201, "{key}");
        // The file's limit of one message per session applies.
        let second = client
            .post(&url)
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(second.status(), 409);
    }
    drop(served);

    let bad = Command::new(env!("CARGO_BIN_EXE_sessiondb"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .arg("--data")
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("loopback"));
    let help = Command::new(env!("CARGO_BIN_EXE_sessiondb"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for documented in [
        "SESSIONDB_LISTEN",
        "SESSIONDB_API_KEYS",
        "SESSIONDB_CONFIG",
        "SESSIONDB_MAX_BODY_BYTES",
        "SESSIONDB_MAX_DATABASE_MIB",
        "--insecure",
    ] {
        assert!(
            help.contains(documented),
            "{documented} missing from --help"
        );
    }
}

/// Waits until the counter `name` reaches `count`, while `unchanged` stays 0.
async fn wait_for_count(base: &str, name: &str, count: u64, unchanged: &str) {
    for _ in 0..600 {
        assert_eq!(metric(base, unchanged).await, 0, "{unchanged}");
        if metric(base, name).await >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} did not reach {count} within 30 s");
}

async fn wait_for_backups(base: &str, count: u64) {
    let failures = "sessiondb_backup_failures_total";
    wait_for_count(base, "sessiondb_backups_total", count, failures).await;
}

async fn append_one(base: &str, id: &str) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/sessions/s/messages"))
        .json(&json!({"id": id, "role": "user", "content": "x".repeat(300)}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
}

/// The backup directories under `dir`, oldest first.
fn backups_in(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    found
}

/// A server on a free port over `dir/data`, backing up into `backups`, with `extra` flags.
fn serve_backing_up(dir: &Path, backups: &Path, extra: &[&str]) -> Served {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--backup-dir",
        backups.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Served::start(&dir.join("data"), &args, &[])
}

async fn ids_in(store: &Path, session: &str) -> Vec<String> {
    let db = Db::open(store).unwrap();
    let session = db.session(session).unwrap();
    let history = session.full_history(Default::default()).await.unwrap();
    history.iter().map(|m| m.id.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_idle_longer_than_their_namespace_allows_are_deleted() {
    let dir = free_dir();
    let served = Served::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "ka=a",
            "--api-key",
            "kb=b",
            "--delete-idle-after",
            "2s",
            "--delete-idle-after",
            "b=1h",
        ],
        &[],
    );
    let client = reqwest::Client::new();
    let base = served.base.clone();
    let append = |key: &'static str, session: &str, id: String| {
        client
            .post(format!("{base}/v1/sessions/{session}/messages"))
            .bearer_auth(key)
            .json(&json!({"id": id, "role": "user", "content": "x"}))
            .send()
    };
    let status = |key: &'static str, session: &str| {
        let request = client
            .get(format!("{base}/v1/sessions/{session}"))
            .bearer_auth(key)
            .send();
        async move { request.await.unwrap().status().as_u16() }
    };
    let before_idle_writes = std::time::Instant::now();
    for key in ["ka", "kb"] {
        assert_eq!(append(key, "idle", "m".into()).await.unwrap().status(), 201);
    }
    // `busy` is written every 200 ms, far more often than every 2 s; sweeps run every second.
    // Namespace `b` keeps its sessions for an hour.
    let mut written = 0;
    while status("ka", "idle").await == 200 {
        assert!(written < 100, "the idle sessions outlived 100 turns");
        let response = append("ka", "busy", format!("b{written}")).await.unwrap();
        assert_eq!(response.status(), 201);
        written += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A lower bound only: a slow machine makes the wait longer, never shorter.
    let waited = before_idle_writes.elapsed();
    // Idle from now on, the busy session would go 2 s later, while the rest is read (a loaded
    // machine can take that long): kept from here, it stays. Setting it is a write, as the
    // appends were.
    let keep = client
        .patch(format!("{base}/v1/sessions/busy"))
        .bearer_auth("ka")
        .json(&json!({"settings": {"keepWhenIdle": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(keep.status(), 200);
    assert!(
        waited >= Duration::from_secs(2),
        "deleted after {waited:?}, before its 2 s were up"
    );
    let busy = client
        .get(format!("{base}/v1/sessions/busy"))
        .bearer_auth("ka")
        .send()
        .await
        .unwrap();
    let busy: Value = busy.json().await.unwrap();
    assert_eq!(busy["messageCount"], written);
    assert_eq!(status("kb", "idle").await, 200);
    assert_eq!(
        metric(&base, "sessiondb_idle_sessions_deleted_total").await,
        1
    );
    assert_eq!(
        metric(&base, "sessiondb_idle_sweep_failures_total").await,
        0
    );
    assert!(served.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_while_serving_on_request_keep_the_newest_and_hold_what_was_acknowledged() {
    let dir = free_dir();
    let backups = dir.path().join("backups");
    let served = serve_backing_up(dir.path(), &backups, &["--backup-keep", "2"]);
    let mut acknowledged = Vec::new();
    for round in 1..=3u64 {
        for i in 0..10 {
            let id = format!("r{round}-{i}");
            append_one(&served.base, &id).await;
            acknowledged.push(id);
        }
        served.signal("USR1");
        wait_for_backups(&served.base, round).await;
    }
    assert!(metric(&served.base, "sessiondb_last_backup_timestamp_seconds").await > 0);
    // Unrelated entries of the directory are left alone by the pruning.
    std::fs::write(backups.join("notes.txt"), "mine").unwrap();
    append_one(&served.base, "r4").await;
    served.signal("USR1");
    wait_for_backups(&served.base, 4).await;
    let kept = backups_in(&backups);
    assert_eq!(kept.len(), 3, "two backups and the notes: {kept:?}");
    assert_eq!(kept[2], backups.join("notes.txt"));
    // Each backup opens as a store and holds what was acknowledged before its signal, while
    // the server goes on serving from its own directory.
    assert_eq!(ids_in(&kept[0], "s").await, acknowledged);
    acknowledged.push("r4".into());
    assert_eq!(ids_in(&kept[1], "s").await, acknowledged);
    append_one(&served.base, "after").await;
    assert!(served.terminate().success());
    assert_eq!(ids_in(&dir.path().join("data"), "s").await.len(), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_backup_is_counted_and_the_server_goes_on() {
    let dir = free_dir();
    // A file where the backups' directory should be: every backup fails.
    let blocked = dir.path().join("backups");
    std::fs::write(&blocked, "not a directory").unwrap();
    let served = serve_backing_up(dir.path(), &blocked, &[]);
    append_one(&served.base, "m").await;
    served.signal("USR1");
    let failures = "sessiondb_backup_failures_total";
    wait_for_count(&served.base, failures, 1, "sessiondb_backups_total").await;
    append_one(&served.base, "n").await;
    assert_eq!(std::fs::read(&blocked).unwrap(), b"not a directory");
    assert!(served.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_run_on_the_timer_and_none_without_a_backup_dir() {
    let dir = free_dir();
    let backups = dir.path().join("backups");
    let served = serve_backing_up(dir.path(), &backups, &["--backup-every", "1s"]);
    append_one(&served.base, "m").await;
    wait_for_backups(&served.base, 2).await;
    let written = backups_in(&backups);
    assert!(written.len() >= 2, "{written:?}");
    assert_eq!(ids_in(written.last().unwrap(), "s").await, ["m"]);
    drop(served);

    // Without a backup directory, SIGUSR1 is logged and the server goes on; `sessiondb
    // backup` cannot open the store it holds and says how to back it up.
    let plain = Served::start(&dir.path().join("plain"), &["--listen", "127.0.0.1:0"], &[]);
    let refused = Command::new(env!("CARGO_BIN_EXE_sessiondb"))
        .arg("--data")
        .arg(dir.path().join("plain"))
        .arg("backup")
        .arg(dir.path().join("copy"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        said.contains("--backup-dir") && said.contains("already open"),
        "{said}"
    );
    plain.signal("USR1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = common::get_text(&format!("{}/metrics", plain.base)).await;
    assert!(!text.contains("sessiondb_backups_total"), "{text}");
    assert!(plain.terminate().success());
}

/// SIGUSR2 vacuums the store a server holds: the room of deleted sessions goes back to the
/// disk, what is left reads the same, and writes sent meanwhile are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_vacuums_a_serving_store() {
    let dir = free_dir();
    let data = dir.path().join("data");
    let served = Served::start(&data, &["--listen", "127.0.0.1:0"], &[]);
    let client = reqwest::Client::new();
    let base = served.base.clone();
    let batch = |session: String, first: usize| {
        let messages: Vec<Value> = (first..first + 50)
            .map(|i| {
                json!({"id": format!("m{i}"), "role": "user",
                            "content": format!("{i} {}", "room to give back ".repeat(200))})
            })
            .collect();
        client
            .post(format!("{base}/v1/sessions/{session}/messages/batch"))
            .json(&json!({"messages": messages}))
            .send()
    };
    for session in 0..8 {
        let answer = batch(format!("gone-{session}"), 0).await.unwrap();
        assert_eq!(answer.status(), 201);
    }
    assert_eq!(batch("kept".into(), 0).await.unwrap().status(), 201);
    for session in 0..8 {
        let deleted = client
            .delete(format!("{base}/v1/sessions/gone-{session}"))
            .send()
            .await
            .unwrap();
        assert_eq!(deleted.status(), 204);
    }
    let before = metric(&base, "sessiondb_database_bytes").await;
    assert!(metric(&base, "sessiondb_database_free_bytes").await > before / 2);

    served.signal("USR2");
    let during = batch("kept".into(), 50).await.unwrap();
    assert_eq!(during.status(), 201);
    wait_for_count(
        &base,
        "sessiondb_vacuums_total",
        1,
        "sessiondb_vacuum_failures_total",
    )
    .await;
    let after = metric(&base, "sessiondb_database_bytes").await;
    assert!(after < before / 2, "{before} → {after}");
    let kept = common::get_text(&format!("{base}/v1/sessions/kept")).await;
    let kept: Value = serde_json::from_str(&kept).unwrap();
    assert_eq!(kept["messageCount"], 100);
    let hits = common::get_text(&format!("{base}/v1/sessions/kept/search?q=99")).await;
    let hits: Value = serde_json::from_str(&hits).unwrap();
    assert_eq!(hits[0]["id"], "m99");
    assert!(served.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_refuses_writes_and_keeps_serving_reads() {
    let dir = free_dir();
    let served = Served::start(&dir.path().join("data"), &["--max-database-mib", "1"], &[]);
    let client = reqwest::Client::new();
    let url = format!("{}/v1/sessions/s/messages", served.base);
    let mut stored = 0;
    let refusal = loop {
        let text = format!("{stored} {}", "filler text ".repeat(2_000));
        let body = json!({"id": format!("m{stored}"), "role": "user", "content": text});
        let answer = client.post(&url).json(&body).send().await.unwrap();
        if answer.status() != 201 {
            break answer;
        }
        stored += 1;
        assert!(stored < 200, "a 1 MiB database never filled up");
    };
    assert_eq!(refusal.status(), 500);
    let error: serde_json::Value = refusal.json().await.unwrap();
    assert_eq!(error["error"]["code"], "internal");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("storage is full, nothing of the write was stored"),
        "{message}"
    );
    let ready = client
        .get(format!("{}/readyz", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "a full store still answers reads");
    let history = client
        .get(format!("{}/v1/sessions/s/history", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(count_lines(history).await, stored);

    // `/metrics` tells how close the store is to its limit, and what a delete frees.
    let base = &served.base;
    assert_eq!(
        metric(base, "sessiondb_database_limit_bytes").await,
        1 << 20
    );
    let full = metric(base, "sessiondb_database_bytes").await;
    assert!(full > 900 * 1024 && full <= 1 << 20, "{full}");
    let free = metric(base, "sessiondb_database_free_bytes").await;
    let deleted = client
        .delete(format!("{base}/v1/sessions/s"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(metric(base, "sessiondb_database_bytes").await, full);
    let freed = metric(base, "sessiondb_database_free_bytes").await;
    assert!(freed > free + 512 * 1024, "{free} → {freed}");
}

/// Fills session `big` with `count` messages of about `size` bytes, in the embedded store.
async fn fill(data: &Path, count: usize, size: usize) {
    let db = Db::open(data).unwrap();
    sessiondb_testkit::fill(&db.session("big").unwrap(), count, size).await;
}

/// Reads an NDJSON response line by line, keeping nothing; returns the line count.
async fn count_lines(response: reqwest::Response) -> usize {
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut lines = 0;
    while let Some(chunk) = body.next().await {
        lines += chunk.unwrap().iter().filter(|b| **b == b'\n').count();
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_a_100k_message_session_keeps_server_memory_bounded() {
    const MESSAGES: usize = 100_000;
    const SIZE: usize = 1200;
    let dir = free_dir();
    fill(dir.path(), MESSAGES, SIZE).await;
    let served = Served::start(dir.path(), &["--listen", "127.0.0.1:0"], &[]);
    let client = reqwest::Client::new();
    let baseline = served.peak_rss();

    let export = client
        .get(format!("{}/v1/sessions/big/export", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        count_lines(export).await,
        1 + MESSAGES,
        "the session line, then messages"
    );
    let history = client
        .get(format!("{}/v1/sessions/big/history", served.base))
        .send()
        .await
        .unwrap();
    // History reads the path from the leaf up to its 10,001-row cap.
    assert_eq!(count_lines(history).await, sessiondb::MAX_PATH_ROWS);

    let streamed = (MESSAGES * SIZE) as u64;
    let peak = served.peak_rss();
    // The export alone is over 120 MB; the server's peak stays a fraction of it (SQLite's
    // page caches and one read window, not the session).
    const CEILING: u64 = 64 * 1024 * 1024;
    eprintln!("baseline RSS {baseline} B, peak RSS {peak} B, streamed {streamed} B");
    assert!(
        peak < CEILING,
        "peak RSS {peak} B over the {CEILING} B ceiling"
    );
    assert!(streamed > CEILING);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_export_embedded_and_remote() {
    let dir = free_dir();
    let data = dir.path().join("data");
    let file = dir.path().join("in.ndjson");
    std::fs::write(
        &file,
        "{\"message\": {\"id\": \"a\", \"role\": \"user\", \"content\": \"hi\"}, \"parentId\": null, \"createdAt\": 1}\n\
         {\"message\": {\"id\": \"b\", \"role\": \"assistant\", \"content\": \"yo\"}, \"parentId\": \"a\", \"createdAt\": 2}\n\
         {\"state\": {\"key\": \"k\", \"value\": [1]}}\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sessiondb"))
            .arg("--data")
            .arg(&data)
            .args(args)
            .output()
            .unwrap()
    };
    let imported = run(&["import", file.to_str().unwrap(), "--session", "s"]);
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let summary: Value = serde_json::from_slice(&imported.stdout).unwrap();
    assert_eq!(summary, json!({"imported": 3, "skipped": 0}));
    assert!(
        imported.stderr.is_empty(),
        "no progress bar without a terminal"
    );
    let exported = run(&["export", "s"]);
    let text = String::from_utf8(exported.stdout).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert!(text.starts_with(r#"{"session":{"id":"s","#));
    assert!(text.contains("\"createdAt\":2"));
    let missing = run(&["export", "nope"]);
    assert!(!missing.status.success());

    // The same through a server.
    let served = Served::start(
        &dir.path().join("remote"),
        &["--listen", "127.0.0.1:0"],
        &[],
    );
    let remote_file = dir.path().join("export.ndjson");
    std::fs::write(&remote_file, &text).unwrap();
    let remote = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sessiondb"))
            .args(args)
            .args(["--url", &served.base])
            .output()
            .unwrap()
    };
    let pushed = remote(&["import", remote_file.to_str().unwrap(), "--session", "copy"]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&pushed.stdout).unwrap(),
        json!({"imported": 3, "skipped": 0})
    );
    // The server numbers a part's lines from its first (blank ones too); the error says where
    // that is in the file.
    let parts_file = dir.path().join("parts.ndjson");
    let parts = "{\"session\": {\"id\": \"x1\"}}\n{\"state\": {\"key\": \"k\", \"value\": 1}}\n\
                 {\"session\": {\"id\": \"x2\"}}\n\n{\"compaction\": {\"id\": \"c\", \"summary\": \"\\u0000\", \
                 \"fromMessageId\": \"m\", \"toMessageId\": \"m\", \"createdAt\": 1}}\n";
    std::fs::write(&parts_file, parts).unwrap();
    let stopped = remote(&["import", parts_file.to_str().unwrap(), "--all"]);
    assert!(!stopped.status.success());
    let error = String::from_utf8_lossy(&stopped.stderr);
    assert!(
        error.starts_with("error: importing session `x2` (its lines[0] is the file's lines[2])")
            && error.contains("invalid `lines[2].compaction.summary`"),
        "{error}"
    );
    assert_eq!(
        String::from_utf8_lossy(&stopped.stdout),
        "{\"session\":\"x1\",\"imported\":1,\"skipped\":0}\n"
    );
    assert!(remote(&["delete", "x1"]).status.success());
    let pulled = remote(&["export", "copy"]);
    assert!(pulled.status.success());
    let pulled = String::from_utf8(pulled.stdout).unwrap();
    assert_eq!(pulled.replacen(r#""id":"copy""#, r#""id":"s""#, 1), text);
    let refused = remote(&["export", "nope"]);
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "error: no session `nope`\n",
        "as on the embedded store"
    );

    // The server's sessions, listed page after page as the embedded store lists its own.
    for i in 0..120 {
        let created = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--json"])
            .arg(json!({"id": format!("s{i:03}")}).to_string())
            .arg(format!("{}/v1/sessions", served.base))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&created.stdout), "201");
    }
    let listed = remote(&["sessions"]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let ids: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 121, "every page: {ids:?}");
    assert_eq!(ids[..2], ["s119", "s118"]);
    assert!(ids.contains(&"copy".to_owned()));
    let first = remote(&["sessions", "--sort", "createdAt", "--limit", "1"]);
    let first: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["id"], "s119");
}

#[test]
fn readme_server_examples_answer_as_documented() {
    let block = common::readme_block("<!-- server-walkthrough -->");
    let dir = free_dir();
    let served = Served::start(dir.path(), &["--listen", "127.0.0.1:0"], &[]);
    let host = served.base.trim_start_matches("http://").to_owned();
    let mut ran = 0;
    for line in block.lines().filter(|l| l.starts_with("curl ")) {
        let (command, expected) = line
            .rsplit_once("# ")
            .expect("each command names its status");
        let command = command.trim().replace("127.0.0.1:8787", &host);
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!("{command} -s -o /dev/null -w '%{{http_code}}'"))
            .output()
            .unwrap();
        let status = String::from_utf8_lossy(&output.stdout);
        assert_eq!(status.trim(), expected.trim(), "{command}");
        ran += 1;
    }
    assert!(ran >= 20, "only {ran} commands found");
}

/// The first `n` events of a server-sent event stream, as (event name, id).
async fn sse_events(response: reqwest::Response, n: usize) -> Vec<(String, String)> {
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let (mut text, mut events) = (String::new(), Vec::new());
    while events.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap().unwrap()));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let field = |name: &str| {
                let lines = block.lines();
                let mut values = lines.filter_map(|l| l.strip_prefix(name));
                values.next().map_or(String::new(), |v| v.trim().to_owned())
            };
            if !field("event:").is_empty() {
                events.push((field("event:"), field("id:")));
            }
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_retain_sets_how_far_back_a_subscriber_resumes() {
    let dir = free_dir();
    let served = Served::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--feed-retain", "2"],
        &[],
    );
    let client = reqwest::Client::new();
    let events = format!("{}/v1/events", served.base);
    let live = client.get(&events).send().await.unwrap();
    for text in ["one", "two", "three", "four"] {
        let appended = client
            .post(format!("{}/v1/sessions/s/messages", served.base))
            .json(&json!({"role": "user", "content": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(appended.status(), 201);
    }
    let ids: Vec<String> = sse_events(live, 4).await.into_iter().map(|e| e.1).collect();
    let resume = |id: &str| client.get(&events).header("Last-Event-ID", id).send();
    // After the second event: the two kept (the third and fourth) replay.
    let replayed = sse_events(resume(&ids[1]).await.unwrap(), 2).await;
    assert_eq!(
        replayed,
        [
            ("append".into(), ids[2].clone()),
            ("append".into(), ids[3].clone())
        ]
    );
    // After the first: the second is no longer kept, so the stream says to start over.
    let refused = sse_events(resume(&ids[0]).await.unwrap(), 1).await;
    assert_eq!(refused[0].0, "reset");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let dir = free_dir();
    // The announcement of the address gets through a filter that would hold it back.
    let served = Served::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--log",
            "warn,sessiondb_server=info",
        ],
        &[],
    );
    let answer = reqwest::Client::new()
        .get(format!("{}/healthz", served.base))
        .header("x-request-id", "log-me")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(
        eventually(async || served.logged().iter().any(|l| l.contains("log-me"))).await,
        "{:?}",
        served.logged()
    );
    let lines: Vec<Value> = served
        .logged()
        .iter()
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect();
    let answered = lines.iter().find(|l| l["span"]["id"] == "log-me").unwrap();
    assert_eq!(answered["level"], "INFO");
    assert_eq!(answered["fields"]["message"], "answered");
    assert_eq!(answered["fields"]["status"], 200);
    assert_eq!(answered["fields"]["version"], "HTTP/1.1");
    assert_eq!(answered["span"]["route"], "/healthz");
    assert!(answered["timestamp"].is_string());

    let refused = common::sessiondb(&["--data", "unused", "serve", "--log-format", "yaml"], None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("`text` or `json`"));
}

//! A `sessiondb serve` process for the tests. Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// `sessiondb` run with `args`, `stdin` written to it.
pub fn sessiondb(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sessiondb"))
        .args(args)
        // Set as many developers have it: errors must still read as one line.
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// The standard output of `sessiondb` run with `args`, which must succeed.
pub fn sessiondb_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = sessiondb(args, stdin);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A running `sessiondb serve`; killed when dropped.
pub struct Served {
    child: Child,
    pub base: String,
    /// The lines the server wrote on stderr after its address.
    logged: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    pub fn start(data: &Path, args: &[&str], env: &[(&str, &str)]) -> Served {
        Self::start_in(
            Command::new(env!("CARGO_BIN_EXE_sessiondb")),
            data,
            args,
            env,
        )
    }

    /// Started by `sh`, which first runs `ulimit {limit}` (`-S -n 64`: a soft limit of 64 open
    /// files; `-n 64`: soft and hard).
    pub fn start_under_ulimit(data: &Path, args: &[&str], limit: &str) -> Served {
        let mut shell = Command::new("sh");
        shell.args([
            "-c",
            &format!("ulimit {limit} && exec \"$0\" \"$@\""),
            env!("CARGO_BIN_EXE_sessiondb"),
        ]);
        Self::start_in(shell, data, args, &[])
    }

    fn start_in(mut command: Command, data: &Path, args: &[&str], env: &[(&str, &str)]) -> Served {
        let mut child = command
            .arg("--data")
            .arg(data)
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .env("SESSIONDB_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Lines are read on a thread of their own, so a server that never announces its
        // address fails the test after a while instead of holding it for ever, and stderr is
        // drained so the server never blocks on a full pipe.
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (lines, received) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let base = loop {
            let line = received
                .recv_timeout(Duration::from_secs(60))
                .expect("the server announces its address within a minute, and does not exit");
            if let Some(url) = line.trim().strip_prefix("sessiondb listening on ") {
                break url.to_owned();
            }
            // With `--log-format json` the announcement is a log line of its own.
            if let Ok(logged) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(url) = logged["fields"]["url"].as_str()
            {
                break url.to_owned();
            }
        };
        let logged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = logged.clone();
        std::thread::spawn(move || {
            for line in received {
                kept.lock().unwrap().push(line);
            }
        });
        Served {
            child,
            base,
            logged,
        }
    }

    /// What the server has logged since its address.
    pub fn logged(&self) -> Vec<String> {
        self.logged.lock().unwrap().clone()
    }

    /// Kills the server at once (SIGKILL): nothing is flushed or drained.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the server process so far, in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    }

    /// Sends a signal by name (`TERM`, `USR1`).
    pub fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{name}");
    }

    pub fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not stop within 10 s of SIGTERM");
    }
}

/// The `sh` block that follows `marker` (an HTML comment) in the repository's README.
pub fn readme_block(marker: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    readme
        .split(marker)
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("the README's block after {marker}"))
        .to_owned()
}

/// The body of a GET of `url`, as text.
pub async fn get_text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The value of an unlabelled metric in the server's `/metrics`.
pub async fn metric(base: &str, name: &str) -> u64 {
    let text = get_text(&format!("{base}/metrics")).await;
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from /metrics"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

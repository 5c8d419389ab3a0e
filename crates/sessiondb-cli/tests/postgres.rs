//! Several `sessiondb serve` processes on one throw-away PostgreSQL database: concurrent appends
//! across instances, change feeds that agree, an instance killed mid-load, and a database outage.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Served, metric};
use futures::StreamExt;
use serde_json::{Value, json};
use sessiondb_postgres::cluster::TempCluster;

fn cluster() -> TempCluster {
    TempCluster::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e}"))
}

fn serve(dir: &tempfile::TempDir, url: &str) -> Served {
    Served::start(
        dir.path(),
        &["--database", url, "--listen", "127.0.0.1:0"],
        &[],
    )
}

/// One server-sent event: its id, name and data.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

/// Follows `GET {base}/v1/events` in the background; returns once subscribed.
async fn subscribe(base: &str) -> Arc<Mutex<Vec<Sse>>> {
    let response = reqwest::get(format!("{base}/v1/events")).await.unwrap();
    assert_eq!(response.status(), 200);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut body = response.bytes_stream();
        let mut buffer = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buffer.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(|v| v.trim_start().to_owned())
                };
                if let (Some(id), Some(event), Some(data)) =
                    (field("id:"), field("event:"), field("data:"))
                {
                    let data = serde_json::from_str(&data).unwrap();
                    sink.lock().unwrap().push(Sse { id, event, data });
                }
            }
        }
    });
    seen
}

/// The ids of the append events seen, in order.
fn appended(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.event == "append")
        .map(|e| e.data["message"]["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn wait_for_appends(seen: &Mutex<Vec<Sse>>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while appended(&seen.lock().unwrap()).len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Appends `message` (with an id) to `session`; true when the server acknowledged it (201).
async fn append(http: &reqwest::Client, base: &str, session: &str, id: &str) -> bool {
    let sent = http
        .post(format!("{base}/v1/sessions/{session}/messages"))
        .json(&json!({"id": id, "role": "user", "parts": [{"type": "text", "text": id}]}))
        .send()
        .await;
    matches!(sent, Ok(r) if r.status() == 201)
}

/// `(id, seq, parent_seq)` of a session's rows in seq order, read from the database itself.
async fn stored_rows(url: &str, session: &str) -> Vec<(String, i64, Option<i64>)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query(
            "SELECT id, seq, parent_seq FROM messages
              WHERE namespace = '' AND session_id = $1 ORDER BY seq",
            &[&session],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The session's history (root → leaf) through the server, as ids.
async fn history(base: &str, session: &str) -> Vec<String> {
    let text = common::get_text(&format!("{base}/v1/sessions/{session}/history")).await;
    text.lines()
        .map(|l| {
            let m: Value = serde_json::from_str(l).unwrap();
            m["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Acknowledged `(session, id)` pairs, grouped by session.
fn by_session(acked: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut sessions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (session, id) in acked {
        sessions
            .entry(session.clone())
            .or_default()
            .insert(id.clone());
    }
    sessions
}

/// Every acknowledged append is stored exactly once, as one linear chain in seq order (each
/// append went under the leaf of its moment), and the history reads it back in that order.
async fn assert_chain(url: &str, base: &str, session: &str, acknowledged: &BTreeSet<String>) {
    let rows = stored_rows(url, session).await;
    let ids: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "{session}: a message is stored twice"
    );
    assert!(
        acknowledged.is_subset(&unique),
        "{session}: acknowledged appends are missing: {:?}",
        acknowledged.difference(&unique).collect::<Vec<_>>()
    );
    assert!(rows.windows(2).all(|w| w[0].1 < w[1].1), "{session}: seqs");
    for pair in rows.windows(2) {
        assert_eq!(pair[1].2, Some(pair[0].1), "{session}: the chain breaks");
    }
    assert_eq!(rows.first().map(|r| r.2), Some(None), "{session}: one root");
    assert_eq!(history(base, session).await, ids, "{session}: history");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_sessions_and_feeds() {
    let cluster = cluster();
    let url = cluster.url();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (serve(&dir_a, &url), serve(&dir_b, &url));
    let bases = [a.base.clone(), b.base.clone()];
    let feeds = [subscribe(&bases[0]).await, subscribe(&bases[1]).await];

    // 16 clients, half on each instance: each appends to the shared session and to its own.
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 15;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let base = bases[client % 2].clone();
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acked = Vec::new();
            for round in 0..ROUNDS {
                for (session, id) in [
                    ("shared".to_owned(), format!("c{client}-shared-{round}")),
                    (format!("own-{client}"), format!("c{client}-own-{round}")),
                ] {
                    assert!(append(&http, &base, &session, &id).await, "{id} refused");
                    acked.push((session, id));
                }
            }
            acked
        }));
    }
    let mut acked: Vec<(String, String)> = Vec::new();
    for client in clients {
        acked.extend(client.await.unwrap());
    }
    assert_eq!(acked.len(), CLIENTS * ROUNDS * 2);

    let sessions = by_session(&acked);
    for (session, ids) in &sessions {
        assert_chain(&url, &bases[0], session, ids).await;
        assert_eq!(history(&bases[1], session).await.len(), ids.len());
    }

    // Each instance's subscriber saw every append once, in the same (commit) order, with
    // increasing positions.
    let mut orders = Vec::new();
    for feed in &feeds {
        wait_for_appends(feed, acked.len()).await;
        let events = feed.lock().unwrap().clone();
        let order = appended(&events);
        let unique: HashSet<&String> = order.iter().collect();
        assert_eq!(order.len(), acked.len(), "every append, once");
        assert_eq!(unique.len(), order.len(), "no append twice");
        let positions: Vec<u64> = events
            .iter()
            .map(|e| e.id.split_once('-').unwrap().1.parse().unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions rise");
        orders.push(order);
    }
    assert_eq!(orders[0], orders[1], "both instances saw one order");
    // That order is each session's commit (seq) order.
    for session in sessions.keys() {
        let stored: Vec<String> = stored_rows(&url, session)
            .await
            .into_iter()
            .map(|r| r.0)
            .collect();
        let seen: Vec<String> = orders[0]
            .iter()
            .filter(|id| stored.contains(id))
            .cloned()
            .collect();
        assert_eq!(seen, stored, "{session}: events in commit order");
    }
    // A position read on one instance resumes on the other.
    let first = feeds[0].lock().unwrap()[0].id.clone();
    let resumed = reqwest::Client::new()
        .get(format!("{}/v1/events", bases[1]))
        .header("Last-Event-ID", &first)
        .send()
        .await
        .unwrap();
    let mut body = resumed.bytes_stream();
    let chunk = body.next().await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&chunk);
    assert!(text.contains("append"), "{text}");
    assert!(!text.contains("no longer retained"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_no_acknowledged_write() {
    let cluster = cluster();
    let url = cluster.url();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (serve(&dir_a, &url), serve(&dir_b, &url));
    let bases = [a.base.clone(), b.base.clone()];
    let feed_b = subscribe(&bases[1]).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // 8 clients append without pause, half through each instance, to one shared session and
    // their own; a client of the killed instance stops at its first refused append.
    let mut clients = Vec::new();
    for client in 0..8 {
        let (base, stop) = (bases[client % 2].clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acked = Vec::new();
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let session = if round % 2 == 0 {
                    "shared".to_owned()
                } else {
                    format!("own-{client}")
                };
                let id = format!("c{client}-{round}");
                if !append(&http, &base, &session, &id).await {
                    return (client, acked, false);
                }
                acked.push((session, id));
                round += 1;
            }
            (client, acked, true)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.kill();
    // The survivor keeps serving while the killed instance's clients fail.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked: Vec<(String, String)> = Vec::new();
    let mut on_survivor = 0;
    for client in clients {
        let (client, ids, finished) = client.await.unwrap();
        if client % 2 == 1 {
            assert!(
                finished,
                "client {client} of the surviving instance was refused"
            );
            on_survivor += ids.len();
        } else {
            assert!(
                !finished,
                "client {client} kept writing through a killed instance"
            );
        }
        acked.extend(ids);
    }
    assert!(on_survivor > 0);
    assert!(append(&reqwest::Client::new(), &bases[1], "after", "after-kill").await);

    for (session, ids) in &by_session(&acked) {
        // Stored rows may include an append the killed instance committed but never answered.
        assert_chain(&url, &bases[1], session, ids).await;
    }
    // The survivor's subscriber saw every acknowledged append.
    wait_for_appends(&feed_b, acked.len() + 1).await;
    let seen: HashSet<String> = appended(&feed_b.lock().unwrap()).into_iter().collect();
    let missing: Vec<&String> = acked
        .iter()
        .map(|(_, id)| id)
        .filter(|id| !seen.contains(*id))
        .collect();
    assert!(missing.is_empty(), "events missing: {missing:?}");
    drop(b);
}

/// A server whose database goes down answers 503 `unavailable` with `Retry-After` (a fault of the
/// moment, which clients retry) and is not ready; once the database is back it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_answers_503_until_it_passes() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir, &cluster.url());
    let http = reqwest::Client::new();
    let post = |text: &'static str| {
        http.post(format!("{}/v1/sessions/s/messages", served.base))
            .json(&json!({"role": "user", "content": text}))
            .send()
    };
    // A backup or vacuum request is PostgreSQL's own business: logged, and the server goes on.
    served.signal("USR1");
    served.signal("USR2");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(post("before").await.unwrap().status(), 201);

    cluster.halt().unwrap();
    let refused = post("during").await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let ready = http
        .get(format!("{}/readyz", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);

    cluster.resume().unwrap();
    assert_eq!(post("after").await.unwrap().status(), 201);
    let page: Value = http
        .get(format!("{}/v1/sessions/s/messages", served.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let texts: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["before", "after"]);
}

/// Two instances delete idle sessions from one database side by side: each idle session goes
/// once (the two counters add up to the sessions deleted), and a session kept busy stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sweeping_one_database_delete_each_idle_session_once() {
    let cluster = cluster();
    let url = cluster.url();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let sweeping = |dir: &tempfile::TempDir| {
        let args = [
            "--database",
            &url,
            "--listen",
            "127.0.0.1:0",
            "--delete-idle-after",
            "1s",
        ];
        Served::start(dir.path(), &args, &[])
    };
    let (a, b) = (sweeping(&dirs[0]), sweeping(&dirs[1]));
    let http = reqwest::Client::new();
    for session in ["idle1", "idle2", "idle3"] {
        assert!(append(&http, &a.base, session, "m").await);
    }
    let gone = |session: &'static str| {
        let request = http.get(format!("{}/v1/sessions/{session}", b.base)).send();
        async move { request.await.unwrap().status() == 404 }
    };
    let mut turns = 0;
    while !(gone("idle1").await && gone("idle2").await && gone("idle3").await) {
        assert!(turns < 100, "the idle sessions outlived 20 s");
        assert!(append(&http, &b.base, "busy", &format!("b{turns}")).await);
        turns += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Idle from now on, the busy session would go a second later, while the counters are read
    // (a loaded machine can take that long): kept from here, it stays. Setting it is a write,
    // as the appends were.
    let keep = http
        .patch(format!("{}/v1/sessions/busy", b.base))
        .json(&json!({"settings": {"keepWhenIdle": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(keep.status(), 200);
    assert_eq!(history(&a.base, "busy").await.len(), turns);
    let mut deleted = 0;
    for base in [&a.base, &b.base] {
        assert_eq!(metric(base, "sessiondb_idle_sweep_failures_total").await, 0);
        deleted += metric(base, "sessiondb_idle_sessions_deleted_total").await;
    }
    assert_eq!(deleted, 3);
}

/// Random path segments, query values and bodies on every route of the OpenAPI document, sent
/// to a server on PostgreSQL (whose errors, limits and text rules are its own): 2xx, or a 4xx
/// with a typed JSON error, never a 5xx, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_on_every_route_gets_typed_answers_on_postgresql() {
    use sessiondb_testkit::http_fuzz::{Rng, SEGMENTS, VALUES, documented_routes, is_typed_error};

    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&dir, &cluster.url());
    let base = &server.base;
    let http = reqwest::Client::new();
    assert!(append(&http, base, "s", "m1").await);
    let document: Value = reqwest::get(format!("{base}/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let routes = documented_routes(&document);
    assert!(routes.len() > 40, "{routes:?}");
    let mut rng = Rng(0x9057_6E55);
    let mut statuses = BTreeMap::<u16, usize>::new();
    for round in 0..10 {
        for route in &routes {
            let target = rng.target(route, &SEGMENTS, &VALUES);
            let method = reqwest::Method::from_bytes(route.method.as_bytes()).unwrap();
            let mut request = http.request(method, format!("{base}{target}"));
            if route.takes_body() {
                let body = match round % 3 {
                    0 => String::from_utf8_lossy(&rng.bytes()).into_owned(),
                    _ => rng.value(0).to_string(),
                };
                request = request
                    .header("content-type", "application/json")
                    .body(body);
            }
            let answer = request.send().await.unwrap();
            let status = answer.status();
            let text = answer.text().await.unwrap();
            *statuses.entry(status.as_u16()).or_default() += 1;
            assert!(
                !status.is_server_error(),
                "{} {target} answered {status}: {text}",
                route.method
            );
            let typed = serde_json::from_str(&text).is_ok_and(|body| is_typed_error(&body));
            assert!(
                !status.is_client_error() || typed,
                "{} {target} answered {status} without a typed error: {text}",
                route.method
            );
        }
    }
    assert!(statuses.keys().any(|s| *s < 300), "{statuses:?}");
    assert!(append(&http, base, "s", "after").await, "still serving");
}

fn cli(args: &[&str]) -> String {
    common::sessiondb_ok(args, None)
}

/// A store moves from SQLite to PostgreSQL with two commands, `export --all` from the embedded
/// store and `import --all` through a server on PostgreSQL: every session arrives with its
/// record (users, metadata, settings, usage, creation time), tree, compactions and state, and
/// exports the same bytes there. A second import skips everything; a dump whose first line is
/// not a session line is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_from_sqlite_to_postgresql_session_by_session() {
    let source = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    {
        let embedded = Served::start(source.path(), &["--listen", "127.0.0.1:0"], &[]);
        let base = &embedded.base;
        let post = |path: &str, body: Value| {
            let request = http.post(format!("{base}{path}")).json(&body);
            async move { assert!(request.send().await.unwrap().status().is_success()) }
        };
        post(
            "/v1/sessions",
            json!({"id": "support", "name": "Support", "userId": "u1", "model": "m",
                   "metadata": {"plan": "pro"}}),
        )
        .await;
        post(
            "/v1/sessions/support/usage",
            json!({"inputTokens": 5, "outputTokens": 7, "cost": 0.5}),
        )
        .await;
        for (id, parent) in [("q", ""), ("a1", "q"), ("a2", "q"), ("f", "a2")] {
            let path = format!("/v1/sessions/support/messages?parent={parent}");
            post(
                &path,
                json!({"id": id, "role": "user", "content": format!("text {id}")}),
            )
            .await;
        }
        post(
            "/v1/sessions/support/compactions",
            json!({"summary": "asked", "fromMessageId": "q", "toMessageId": "a2"}),
        )
        .await;
        let state = http
            .put(format!("{base}/v1/sessions/support/state/step"))
            .json(&json!(3));
        assert!(state.send().await.unwrap().status().is_success());
        post("/v1/sessions", json!({"id": "empty", "userId": "u2"})).await;
        // The namespace's context templates, one of each kind, with entries.
        for (path, body) in [
            (
                "/v1/context/soul",
                json!({"kind": "readonly", "description": "Who", "maxTokens": 40,
                       "content": "Be brief."}),
            ),
            ("/v1/context/skills", json!({"kind": "skill"})),
            ("/v1/context/kb", json!({"kind": "search"})),
            (
                "/v1/context/skills/entries/review",
                json!({"content": "Read twice.", "description": "reviews"}),
            ),
            (
                "/v1/context/kb/entries/door",
                json!({"content": "the blue door"}),
            ),
        ] {
            let request = http.put(format!("{base}{path}")).json(&body);
            assert!(request.send().await.unwrap().status().is_success());
        }
        post(
            "/v1/sessions/bare/messages",
            json!({"role": "user", "content": "hi"}),
        )
        .await;
    }
    let data = source.path().to_str().unwrap();
    let dump = cli(&["--data", data, "export", "--all"]);
    assert!(dump.starts_with(sessiondb::TEMPLATES_LINE), "{dump}");
    assert_eq!(
        dump.lines()
            .filter(|l| l.starts_with(r#"{"session""#))
            .count(),
        3
    );
    let file = source.path().join("dump.ndjson");
    std::fs::write(&file, &dump).unwrap();

    let cluster = cluster();
    let target_dir = tempfile::tempdir().unwrap();
    let target = serve(&target_dir, &cluster.url());
    let file = file.to_str().unwrap();
    let imported = cli(&["import", file, "--all", "--url", &target.base]);
    let counts: Vec<Value> = imported
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(counts.len(), 4, "{imported}");
    assert_eq!(
        counts[0],
        json!({"templates": true, "imported": 5, "skipped": 0})
    );
    assert!(counts.contains(&json!({"session": "support", "imported": 6, "skipped": 0})));
    assert_eq!(
        cli(&["export", "--all", "--url", &target.base]),
        dump,
        "the same templates, sessions, records, trees and lines"
    );
    for listing in [
        "/v1/sessions?userId=u1",
        "/v1/sessions?userId=u2&sort=createdAt",
    ] {
        let read = |base: String| {
            let request = http.get(format!("{base}{listing}"));
            async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
        };
        let moved = read(target.base.clone()).await;
        assert_eq!(moved["items"].as_array().unwrap().len(), 1, "{listing}");
    }
    let history = cli(&["history", "support", "--url", &target.base]);
    let ids: Vec<&str> = history
        .lines()
        .map(|l| &l[..l.find(r#"","role""#).unwrap()])
        .collect();
    assert_eq!(
        history.lines().count(),
        2,
        "the summary of q → a2, then f: {history}"
    );
    assert!(
        ids[0].starts_with(r#"{"id":"compaction_"#) && ids[1] == r#"{"id":"f"#,
        "{ids:?}"
    );
    let again = cli(&["import", file, "--all", "--url", &target.base]);
    assert!(
        again.contains(r#"{"session":"support","imported":1,"skipped":5}"#),
        "{again}"
    );
    // Both stores check sound, the moved one beside its running server.
    let database = cluster.url();
    for args in [
        ["--data", data, "check"],
        ["check", "--database", &database],
    ] {
        assert_eq!(cli(&args), "{\"problems\":[]}\n", "{args:?}");
    }

    let headless = source.path().join("headless.ndjson");
    std::fs::write(
        &headless,
        dump.lines().skip(1).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let refused = common::sessiondb(
        &[
            "import",
            headless.to_str().unwrap(),
            "--all",
            "--url",
            &target.base,
        ],
        None,
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("lines[0]: with --all"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

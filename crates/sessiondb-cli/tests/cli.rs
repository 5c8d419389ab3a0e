//! The `sessiondb` binary end to end on a real data directory.

mod common;

use std::process::{Command, Output};

/// `sessiondb --data data` with `args`.
fn with_data<'a>(data: &'a std::path::Path, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--data", data.to_str().unwrap()];
    all.extend_from_slice(args);
    all
}

fn run(data: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    common::sessiondb(&with_data(data, args), stdin)
}

fn ok(data: &std::path::Path, args: &[&str], stdin: Option<&str>) -> String {
    common::sessiondb_ok(&with_data(data, args), stdin)
}

/// The session commands, run by `ok` (the embedded store or a server); `stored` says whether
/// `stats` counts every stored message (the embedded store) or leaves that out (a server).
fn append_history_tree_search_and_stats(
    ok: impl Fn(&[&str], Option<&str>) -> String,
    stored: bool,
) {
    ok(
        &[
            "append",
            "chat",
            "--id",
            "q1",
            "--text",
            "What is a B-tree?",
        ],
        None,
    );
    ok(
        &[
            "append",
            "chat",
            "--id",
            "a1",
            "--role",
            "assistant",
            "--text",
            "A balanced tree.",
        ],
        None,
    );
    ok(
        &[
            "append",
            "chat",
            "--id",
            "a2",
            "--role",
            "assistant",
            "--parent",
            "q1",
            "--text",
            "Wide nodes for databases",
        ],
        None,
    );
    let stdin = r#"{"id":"f","role":"user","parts":[{"type":"text","text":"follow up"}]}"#;
    let appended = ok(&["append", "chat"], Some(stdin));
    assert!(appended.starts_with(r#"{"id":"f","role":"user""#));

    let history: Vec<serde_json::Value> = ok(&["history", "chat"], None)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = history.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["q1", "a2", "f"]);
    let newest = ok(&["history", "chat", "--newest-first", "--leaf", "a1"], None);
    assert_eq!(newest.lines().count(), 2);
    assert!(newest.lines().next().unwrap().contains(r#""id":"a1""#));
    // The path as a model API would be sent it: one JSON document.
    let anthropic = ok(&["history", "chat", "--format", "anthropic"], None);
    assert_eq!(
        anthropic,
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\
         \"What is a B-tree?\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\
         \"text\":\"Wide nodes for databases\"}]},{\"role\":\"user\",\"content\":[{\"type\":\
         \"text\",\"text\":\"follow up\"}]}]}\n"
    );
    let openai: serde_json::Value = serde_json::from_str(&ok(
        &["history", "chat", "--format", "openai", "--leaf", "a1"],
        None,
    ))
    .unwrap();
    assert_eq!(
        openai,
        serde_json::json!([{"role": "user", "content": "What is a B-tree?"},
                           {"role": "assistant", "content": "A balanced tree."}])
    );

    let tree = ok(&["tree", "chat"], None);
    assert_eq!(
        tree,
        "q1 [user] What is a B-tree? *\n\
         ├─ a1 [assistant] A balanced tree.\n\
         └─ a2 [assistant] Wide nodes for databases *\n   \
            └─ f [user] follow up *\n"
    );
    assert_eq!(
        ok(&["search", "chat", "database"], None),
        "a2 [assistant] Wide nodes for **databases**\n"
    );
    // Across sessions: the namespace's, one user's, one role's; snippets as short as asked.
    let owned = concat!(
        r#"{"session": {"userId": "ada"}}"#,
        "\n",
        r#"{"message": {"id": "o1", "role": "user", "content": "Ada asks which databases use B-trees"}, "parentId": null}"#,
    );
    ok(&["import", "/dev/stdin", "--session", "owned"], Some(owned));
    let mut across: Vec<String> = ok(&["search", "--all", "databases"], None)
        .lines()
        .map(str::to_owned)
        .collect();
    across.sort();
    assert_eq!(
        across,
        [
            "chat a2 [assistant] Wide nodes for **databases**",
            "owned o1 [user] Ada asks which **databases** use B-trees"
        ]
    );
    assert_eq!(
        ok(
            &["search", "--user", "ada", "database", "--words", "2"],
            None
        ),
        "owned o1 [user] …**databases** use…\n"
    );
    assert_eq!(
        ok(
            &["search", "--all", "databases", "--role", "assistant"],
            None
        ),
        "chat a2 [assistant] Wide nodes for **databases**\n"
    );
    assert_eq!(
        ok(&["search", "chat", "which databases", "--any"], None),
        "a2 [assistant] Wide nodes for **databases**\n"
    );
    ok(&["delete", "owned"], None);
    let stats: serde_json::Value = serde_json::from_str(&ok(&["stats", "chat"], None)).unwrap();
    assert_eq!(
        (
            stats["messageCount"].as_u64(),
            stats["storedMessages"].as_u64(),
            stats["leafId"].as_str()
        ),
        (Some(3), stored.then_some(4), Some("f"))
    );
    assert_eq!(ok(&["delete", "chat"], None), "deleted chat\n");
    assert_eq!(ok(&["history", "chat"], None), "");
}

#[test]
fn session_commands_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    append_history_tree_search_and_stats(|args, stdin| ok(dir.path(), args, stdin), true);
}

/// With `--url`, the session commands work through a server and print what they print on the
/// embedded store; the embedded store a server holds names `--url` in its refusal.
#[test]
fn session_commands_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("served");
    let served = common::Served::start(&data, &["--listen", "127.0.0.1:0"], &[]);
    let url = ["--url", served.base.as_str()];
    let through =
        |args: &[&str], stdin: Option<&str>| run(dir.path(), &[args, &url].concat(), stdin);
    append_history_tree_search_and_stats(
        |args, stdin| ok(dir.path(), &[args, &url].concat(), stdin),
        false,
    );
    let missing = through(&["delete", "chat"], None);
    assert!(!missing.status.success());
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(
        error.starts_with("error: DELETE ") && error.contains("404") && error.contains("not_found"),
        "{error}"
    );
    for refused in [
        &["append", "s", "--text", "x", "--namespace", "other"][..],
        &["delete", "--idle-for", "1s"],
    ] {
        let out = through(refused, None);
        assert!(!out.status.success(), "{refused:?}");
    }
    let held = run(&data, &["history", "chat"], None);
    assert!(!held.status.success());
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("work through it with --url"),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    let listed = through(&["sessions"], None);
    assert_eq!(String::from_utf8(listed.stdout).unwrap(), "");
}

#[test]
fn bad_input_fails_with_a_message_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &["append", "chat"],
        Some(r#"{"role": 5, "content": "x"}"#),
    );
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: reading a JSON message from stdin: invalid `role`: must be a string\n"
    );
    for (args, said) in [
        (&["search", "chat"][..], "<QUERY>"),
        (
            &["search", "--all", "chat", "words"],
            "--all and --user take the words alone",
        ),
        (
            &["search", "--all", "x", "--since", "5", "--until", "5"],
            "`since` must be before `until`",
        ),
    ] {
        let out = run(dir.path(), args, None);
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && error.contains(said),
            "{args:?}: {error}"
        );
    }
    let missing = run(dir.path(), &["stats", "chat"], None);
    assert!(!missing.status.success());
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "error: session chat has no messages\n"
    );
    assert!(ok(dir.path(), &["history", "chat"], None).is_empty());
}

/// `sessions` lists every session of the namespace, most recent first, across pages, as the
/// objects `GET /v1/sessions` returns; `--user`, `--sort` and `--limit` narrow it.
#[test]
fn sessions_lists_the_namespace_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    {
        let db = sessiondb::Db::open(data).unwrap();
        futures::executor::block_on(async {
            for i in 0..120 {
                let record = sessiondb::SessionRecord {
                    user_id: (i % 2 == 0).then(|| "ada".to_owned()),
                    ..Default::default()
                };
                db.create_session("", Some(format!("s{i:03}")), record)
                    .await
                    .unwrap();
            }
        });
    }
    // Touched last: first by update, still last by creation.
    ok(data, &["append", "s000", "--text", "hello"], None);
    let ids = |args: &[&str]| -> Vec<String> {
        ok(data, args, None)
            .lines()
            .map(|line| {
                let session: serde_json::Value = serde_json::from_str(line).unwrap();
                session["id"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let all = ids(&["sessions"]);
    assert_eq!(all.len(), 120, "every page");
    assert_eq!(all[0], "s000");
    assert_eq!(all[1..3], ["s119", "s118"]);
    let created = ids(&["sessions", "--sort", "createdAt", "--limit", "3"]);
    assert_eq!(created, ["s119", "s118", "s117"]);
    let ada = ids(&["sessions", "--user", "ada"]);
    assert_eq!(ada.len(), 60);
    assert!(
        ada.iter()
            .all(|id| id[1..].parse::<u32>().unwrap() % 2 == 0)
    );
    assert!(ids(&["sessions", "--namespace", "other"]).is_empty());
    let first = ok(data, &["sessions", "--limit", "1"], None);
    let session: serde_json::Value = serde_json::from_str(first.trim()).unwrap();
    assert_eq!(session["messageCount"], 1);
    let refused = run(data, &["sessions", "--sort", "name"], None);
    assert!(!refused.status.success());
}

/// `delete` removes a session with everything in it; a session that does not exist is an
/// error that writes nothing.
#[test]
fn delete_removes_a_session_and_refuses_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    ok(data, &["append", "chat", "--text", "hello"], None);
    ok(data, &["append", "other", "--text", "stays"], None);
    assert_eq!(ok(data, &["delete", "chat"], None), "deleted chat\n");
    let listed = ok(data, &["sessions"], None);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("\"other\""));
    assert_eq!(ok(data, &["history", "chat"], None), "");
    let missing = run(data, &["delete", "chat"], None);
    assert!(!missing.status.success());
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "error: no session chat\n"
    );
}

/// `delete --idle-for` removes the namespace's sessions not written for that long and keeps
/// the rest; it takes a session or the option, not both.
#[test]
fn delete_idle_for_removes_only_sessions_not_written_for_that_long() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    ok(data, &["append", "old", "--text", "hello"], None);
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    ok(data, &["append", "new", "--text", "hello"], None);
    let deleted = ok(data, &["delete", "--idle-for", "1s"], None);
    assert_eq!(deleted, "deleted 1 idle sessions\n");
    let listed = ok(data, &["sessions"], None);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("\"new\""));
    assert_eq!(ok(data, &["history", "old"], None), "");
    for refused in [
        &["delete"][..],
        &["delete", "new", "--idle-for", "1s"],
        &["delete", "--idle-for", "0s"],
    ] {
        assert!(!run(data, refused, None).status.success(), "{refused:?}");
    }
    assert_eq!(ok(data, &["history", "new"], None).lines().count(), 1);
}

/// `export --user` writes every session of that user (which `import --all` takes back) and
/// `delete --user` removes them and keeps the rest, on the embedded store and through a
/// server; each takes a user or a session, not both.
#[test]
fn export_and_delete_user_cover_that_users_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = dir.path().join("embedded");
    let served_data = dir.path().join("served");
    let sessions = [("a", "u1"), ("b", "u1"), ("c", "u 2")];
    {
        let db = sessiondb::Db::open(&embedded).unwrap();
        futures::executor::block_on(async {
            for (id, user) in sessions {
                let record = sessiondb::SessionRecord {
                    user_id: Some(user.to_owned()),
                    ..Default::default()
                };
                db.create_session("", Some(id.to_owned()), record)
                    .await
                    .unwrap();
            }
        });
    }
    let served = common::Served::start(&served_data, &["--listen", "127.0.0.1:0"], &[]);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = reqwest::Client::new();
        for (id, user) in sessions {
            let created = client
                .post(format!("{}/v1/sessions", served.base))
                .json(&serde_json::json!({"id": id, "userId": user}))
                .send()
                .await
                .unwrap();
            assert_eq!(created.status(), 201);
        }
    });
    let url = ["--url", served.base.as_str()];
    for through in [&[][..], &url[..]] {
        let with = |args: &[&'static str]| [args, through].concat();
        let exported = ok(&embedded, &with(&["export", "--user", "u1"]), None);
        let mut session_lines: Vec<String> = exported
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter_map(|line| line["session"]["id"].as_str().map(str::to_owned))
            .collect();
        session_lines.sort_unstable();
        assert_eq!(session_lines, ["a", "b"], "{exported}");
        let copy = tempfile::tempdir().unwrap();
        let file = copy.path().join("u1.ndjson");
        std::fs::write(&file, &exported).unwrap();
        ok(
            copy.path(),
            &["import", file.to_str().unwrap(), "--all"],
            None,
        );
        let imported = ok(copy.path(), &["sessions", "--user", "u1"], None);
        assert_eq!(imported.lines().count(), 2, "{imported}");
        assert_eq!(
            ok(&embedded, &with(&["delete", "--user", "u1"]), None),
            "deleted 2 sessions of user u1\n"
        );
        assert_eq!(
            ok(&embedded, &with(&["delete", "--user", "u 2"]), None),
            "deleted 1 sessions of user u 2\n"
        );
        assert_eq!(ok(&embedded, &with(&["sessions"]), None), "");
        assert_eq!(
            ok(&embedded, &with(&["delete", "--user", "u1"]), None),
            "deleted 0 sessions of user u1\n"
        );
    }
    for refused in [
        &["delete", "a", "--user", "u1"][..],
        &["delete", "--user", "u1", "--idle-for", "1s"],
        &["export", "a", "--user", "u1"],
        &["export", "--all", "--user", "u1"],
    ] {
        assert!(
            !run(&embedded, refused, None).status.success(),
            "{refused:?}"
        );
    }
}

/// The README's command-line examples run as written, one after another on one data
/// directory; then the ones through a server (`--url`) against a server of that directory,
/// whose key `KEY` acts in the same (empty) namespace.
#[test]
fn readme_command_line_examples_run() {
    let block = common::readme_block("<!-- cli-walkthrough -->");
    let dir = tempfile::tempdir().unwrap();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_sessiondb"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sh = |line: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("SESSIONDB_DATA")
            .env_remove("SESSIONDB_NAMESPACE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let (remote, embedded): (Vec<&str>, Vec<&str>) =
        block.lines().partition(|l| l.contains("--url"));
    assert!(embedded.len() >= 14, "{} commands", embedded.len());
    for line in embedded {
        sh(line);
    }
    let data = dir.path().join("sessiondb-data");
    let listed = ok(&data, &["sessions"], None);
    assert_eq!(listed.lines().count(), 1, "the copy was deleted: {listed}");
    let served = common::Served::start(
        &data,
        &["--listen", "127.0.0.1:0", "--api-key", "KEY="],
        &[],
    );
    assert!(remote.len() >= 2, "{remote:?}");
    for line in remote {
        let printed = sh(&line.replace("http://127.0.0.1:8787", &served.base));
        assert!(printed.contains("\"id\":\"q1\""), "{line}: {printed}");
    }
}

/// `backup` writes a store that reads back the same, and refuses a destination that holds one.
#[test]
fn backup_copies_the_store_into_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let copy = dir.path().join("copy");
    ok(
        &data,
        &["append", "chat", "--id", "q1", "--text", "hello"],
        None,
    );
    ok(
        &data,
        &["append", "chat", "--id", "a1", "--text", "hi there"],
        None,
    );
    let printed = ok(&data, &["backup", copy.to_str().unwrap()], None);
    assert_eq!(
        printed.trim(),
        copy.join("sessiondb.sqlite3").display().to_string()
    );
    assert_eq!(
        ok(&copy, &["history", "chat"], None),
        ok(&data, &["history", "chat"], None)
    );
    let again = run(&data, &["backup", copy.to_str().unwrap()], None);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds a database"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// `vacuum` rewrites the file without the room deleted sessions left, printing both sizes; with
/// a server holding the store it is refused, saying what to do instead.
#[test]
fn vacuum_gives_the_room_of_deleted_sessions_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let text = "x".repeat(3_000);
    for i in 0..40 {
        ok(data, &["append", &format!("s{i}"), "--text", &text], None);
    }
    for i in 1..40 {
        ok(data, &["delete", &format!("s{i}")], None);
    }
    let sizes: serde_json::Value = serde_json::from_str(&ok(data, &["vacuum"], None)).unwrap();
    let (before, after) = (
        sizes["bytesBefore"].as_u64().unwrap(),
        sizes["bytesAfter"].as_u64().unwrap(),
    );
    assert!(after < before, "{sizes}");
    assert!(ok(data, &["history", "s0"], None).contains(&text));
    assert_eq!(ok(data, &["check"], None), "{\"problems\":[]}\n");

    let served = common::Served::start(data, &["--listen", "127.0.0.1:0"], &[]);
    let held = run(data, &["vacuum"], None);
    assert!(!held.status.success());
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("kill -USR2"),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    drop(served);
}

/// `import --all` writes part by part: a bad line stops it where it is, the sessions before it
/// stay, and a second run over the mended file skips them and writes the rest.
#[test]
fn export_and_import_all_carry_the_namespace_templates() {
    use sessiondb::{BlockKind, ContextEntry};
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    ok(
        &source,
        &["append", "s", "--id", "m1", "--text", "hi"],
        None,
    );
    let sessions = ok(&source, &["export", "--all"], None);
    assert!(
        sessions.starts_with(r#"{"session""#),
        "no templates, no part: {sessions}"
    );
    let entry = ContextEntry {
        key: "review".into(),
        content: "Read twice.".into(),
        description: Some("reviews".into()),
    };
    let templates = [
        sessiondb::TEMPLATES_LINE.to_owned(),
        sessiondb::block_line(
            "soul",
            BlockKind::Readonly,
            Some("Who"),
            Some(40),
            "Be brief.",
        ),
        sessiondb::block_line("skills", BlockKind::Skill, None, None, ""),
    ]
    .concat();
    // More entries than a server's page holds, so an export through one reads several pages.
    let mut templates = templates;
    for i in 0..150 {
        let numbered = ContextEntry {
            key: format!("k{i:03}"),
            content: format!("step {i}"),
            description: None,
        };
        templates.push_str(&sessiondb::entry_line("skills", &numbered));
    }
    templates.push_str(&sessiondb::entry_line("skills", &entry));
    let dump = format!("{templates}{sessions}");
    let file = dir.path().join("dump.ndjson");
    std::fs::write(&file, &dump).unwrap();
    let file_arg = file.to_str().unwrap();

    // The embedded store takes the templates' part whole, then the session's; it exports the
    // same bytes, and so does a server in front of it.
    let target = dir.path().join("target");
    let printed = ok(&target, &["import", file_arg, "--all"], None);
    assert_eq!(
        printed.lines().next(),
        Some(r#"{"templates":true,"imported":153,"skipped":0}"#),
        "{printed}"
    );
    assert_eq!(ok(&target, &["export", "--all"], None), dump);
    {
        let served = common::Served::start(&target, &["--listen", "127.0.0.1:0"], &[]);
        let exported = common::sessiondb_ok(&["export", "--all", "--url", &served.base], None);
        assert_eq!(exported, dump);
    }

    // A templates' part that cannot be written whole writes nothing: an entry of a block
    // nothing defines, or a line that is not a block or entry, on the embedded store and
    // through a server alike.
    let orphan = r#"{"entry":{"label":"nowhere","key":"k","content":"x"}}"#;
    let broken = format!("{templates}{orphan}\n");
    std::fs::write(&file, &broken).unwrap();
    let other = dir.path().join("other");
    let refused = run(&other, &["import", file_arg, "--all"], None);
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        error.contains("context templates") && error.contains("lines[154]"),
        "{error}"
    );
    assert_eq!(ok(&other, &["export", "--all"], None), "");
    let served = common::Served::start(&other, &["--listen", "127.0.0.1:0"], &[]);
    let url = ["--url", served.base.as_str()];
    let message = r#"{"message":{"id":"m","role":"user","content":"x"}}"#;
    for (bad, expected) in [(orphan, "lines[154].entry.label"), (message, "lines[154]")] {
        std::fs::write(&file, format!("{templates}{bad}\n")).unwrap();
        let import = [&["import", file_arg, "--all"][..], &url].concat();
        let refused = common::sessiondb(&import, None);
        assert!(!refused.status.success());
        let error = String::from_utf8_lossy(&refused.stderr);
        assert!(
            error.contains("invalid_request") && error.contains(expected),
            "{error}"
        );
        let exported = common::sessiondb_ok(&[&["export", "--all"][..], &url].concat(), None);
        assert_eq!(exported, "");
    }
    // Through a server too, the part goes in whole.
    std::fs::write(&file, &dump).unwrap();
    let import = [&["import", file_arg, "--all"][..], &url].concat();
    let printed = common::sessiondb_ok(&import, None);
    assert_eq!(
        printed.lines().next(),
        Some(r#"{"templates":true,"imported":153,"skipped":0}"#),
        "{printed}"
    );
    let exported = common::sessiondb_ok(&[&["export", "--all"][..], &url].concat(), None);
    assert_eq!(exported, dump);
}

#[test]
fn import_all_stops_at_a_bad_part_and_a_second_run_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    for s in ["a", "b", "c"] {
        ok(
            &source,
            &["append", s, "--id", "m1", "--text", "hello"],
            None,
        );
        ok(
            &source,
            &["append", s, "--id", "m2", "--text", "again"],
            None,
        );
    }
    let dump = ok(&source, &["export", "--all"], None);
    let second = dump
        .lines()
        .filter(|l| l.starts_with(r#"{"session""#))
        .nth(1)
        .unwrap()
        .to_owned();
    let broken = dump.replacen(
        &second,
        &format!("{second}\n{{\"message\": {{\"role\": \"user\"}}}}"),
        1,
    );
    let file = dir.path().join("dump.ndjson");
    std::fs::write(&file, &broken).unwrap();
    let target = dir.path().join("target");
    let file_arg = file.to_str().unwrap();
    let stopped = run(&target, &["import", file_arg, "--all"], None);
    assert!(!stopped.status.success());
    let error = String::from_utf8(stopped.stderr).unwrap();
    assert!(
        error.contains("invalid `lines[4].message"),
        "the file's line: {error}"
    );
    let printed = String::from_utf8(stopped.stdout).unwrap();
    assert_eq!(printed.lines().count(), 1, "{printed}");
    let first: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(
        (first["imported"].as_u64(), first["skipped"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(ok(&target, &["sessions"], None).lines().count(), 1);

    std::fs::write(&file, &dump).unwrap();
    let finished = ok(&target, &["import", file_arg, "--all"], None);
    let counts: Vec<(u64, u64)> = finished
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["imported"].as_u64().unwrap(),
                v["skipped"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(0, 2), (2, 0), (2, 0)]);
    assert_eq!(ok(&target, &["export", "--all"], None), dump);
}

#[test]
fn import_to_a_server_goes_in_parts_where_one_request_is_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let served = common::Served::start(
        &dir.path().join("served"),
        &["--listen", "127.0.0.1:0", "--max-body-bytes", "65536"],
        &[],
    );
    let url = ["--url", served.base.as_str()];
    // About 400 KB: six times the server's limit.
    let mut dump = String::from("{\"session\":{\"name\":\"long\"}}\n");
    for i in 0..200 {
        let parent = if i == 0 {
            "null".to_owned()
        } else {
            format!("\"m{}\"", i - 1)
        };
        dump += &format!(
            "{{\"message\":{{\"id\":\"m{i}\",\"role\":\"user\",\"content\":\"{i} {}\"}},\"parentId\":{parent}}}\n",
            "é".repeat(1000)
        );
    }
    let file = dir.path().join("dump.ndjson");
    std::fs::write(&file, &dump).unwrap();
    let file_arg = file.to_str().unwrap();
    let import = [&["import", file_arg, "--session", "long"][..], &url].concat();
    let printed = common::sessiondb_ok(&import, None);
    assert_eq!(printed.trim(), r#"{"imported":200,"skipped":0}"#);
    let exported = common::sessiondb_ok(&[&["export", "long"][..], &url].concat(), None);
    let ids: Vec<String> = exported
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| Some(l["message"]["id"].as_str()?.to_owned()))
        .collect();
    assert_eq!(ids, (0..200).map(|i| format!("m{i}")).collect::<Vec<_>>());
    assert!(
        exported.starts_with(r#"{"session":{"id":"long","name":"long""#),
        "{exported}"
    );
    let again = common::sessiondb_ok(&import, None);
    assert_eq!(again.trim(), r#"{"imported":0,"skipped":200}"#);

    // A line over the limit alone is refused, named as the file's line, after the parts before.
    let big = format!(
        "{{\"message\":{{\"id\":\"a\",\"role\":\"user\",\"content\":\"a\"}}}}\n\
         {{\"message\":{{\"id\":\"b\",\"role\":\"user\",\"content\":\"{}\"}}}}\n",
        "x".repeat(70_000)
    );
    std::fs::write(&file, big).unwrap();
    let import = [&["import", file_arg, "--session", "one"][..], &url].concat();
    let refused = common::sessiondb(&import, None);
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(
        error.contains("payload_too_large") && error.contains("the file's lines[1]"),
        "{error}"
    );
}

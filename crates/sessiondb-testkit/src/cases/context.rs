//! Context blocks, the frozen system prompt and the AI tools (reference §7, checks 90–97 and
//! 122–129): rendering, `maxTokens`, keyed entries, skills across a cold start, search blocks,
//! namespace templates and custom providers.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use sessiondb::{
    BlockKind, BlockSpec, Context, ContextError, CustomBlock, Db, Error, PageRequest, Provider,
    ProviderResult, ReadonlyProvider, SECTION_RULE, SearchProvider, SkillProvider, Store,
    ValidationErrorKind, WritableProvider,
};

use crate::*;

fn spec(kind: BlockKind, description: Option<&str>, max: Option<u64>, content: &str) -> BlockSpec {
    BlockSpec {
        kind,
        description: description.map(str::to_owned),
        max_tokens: max,
        content: content.to_owned(),
    }
}

fn writable(content: &str) -> BlockSpec {
    spec(BlockKind::Writable, None, None, content)
}

async fn define<S: Store>(context: &Context<S>, label: &str, spec: BlockSpec) {
    context.define(label, spec).await.unwrap();
}

/// The blocks of `sessiondb-core/tests/golden/prompt.txt`, stored.
async fn golden_blocks<S: Store>(context: &Context<S>) {
    let soul = "You are a careful research assistant. Cite sources; never invent them.";
    define(
        context,
        "soul",
        spec(BlockKind::Readonly, Some("Identity"), None, soul),
    )
    .await;
    let memory =
        "The user prefers metric units.\nThe user lives in Lisbon and works on tide models.";
    let learned = spec(
        BlockKind::Writable,
        Some("Learned facts"),
        Some(200),
        memory,
    );
    define(context, "memory", learned).await;
    define(
        context,
        "scratch",
        spec(BlockKind::Readonly, None, None, ""),
    )
    .await;
    define(
        context,
        "skills",
        spec(BlockKind::Skill, Some("Playbooks"), None, ""),
    )
    .await;
    define(context, "docs", spec(BlockKind::Search, None, Some(8), "")).await;
    define(
        context,
        "notes",
        spec(BlockKind::Writable, None, Some(100), ""),
    )
    .await;
    let review = "Read the diff twice.";
    let put = |label: &'static str, key: &'static str, content: &'static str, d| async move {
        context.put_entry(label, key, content, d).await.unwrap()
    };
    put("skills", "pirate-style", "Speak like a pirate.", None).await;
    put(
        "skills",
        "code-review",
        review,
        Some("How to review a pull request"),
    )
    .await;
    put("docs", "tides", "Tides follow the moon.", None).await;
    put("docs", "units", "Lisbon uses metric units.", None).await;
    put("docs", "moon", "The moon orbits the earth.", None).await;
}

const GOLDEN_PROMPT: &str = include_str!("../../../sessiondb-core/tests/golden/prompt.txt");

pub async fn stored_blocks_render_the_golden_prompt<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    golden_blocks(&context).await;
    assert_eq!(context.render().await.unwrap(), GOLDEN_PROMPT);
    let frozen = context.prompt().await.unwrap();
    assert_eq!(frozen.prompt, GOLDEN_PROMPT);
    let kinds: Vec<(String, BlockKind, u64)> = context
        .blocks()
        .await
        .unwrap()
        .into_iter()
        .map(|b| (b.label, b.kind, b.tokens))
        .collect();
    assert_eq!(kinds[1], ("memory".into(), BlockKind::Writable, 21));
    assert_eq!(kinds.len(), 6);
}

pub async fn prompt_is_frozen_until_refreshed<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    // An empty prompt is frozen like any other and stays a value (check 97).
    let empty = context.prompt().await.unwrap();
    assert_eq!(empty.prompt, "");
    define(&context, "memory", writable("likes tea")).await;
    assert_eq!(context.prompt().await.unwrap(), empty);
    let refreshed = context.refresh_prompt().await.unwrap();
    assert!(refreshed.prompt.contains("MEMORY [writable]\n"));
    assert!(refreshed.prompt.ends_with("\nlikes tea"));
    // Writes change the block, never the frozen prompt (checks 90, 91).
    context.set_block("memory", "likes coffee").await.unwrap();
    assert_eq!(context.prompt().await.unwrap(), refreshed);
    assert_eq!(
        context.block("memory").await.unwrap().unwrap().content,
        "likes coffee"
    );
    // Another handle (another process) reads the stored prompt.
    let again = db_session(&db, "s").context().prompt().await.unwrap();
    assert_eq!(again, refreshed);
    let newer = context.refresh_prompt().await.unwrap();
    assert!(newer.prompt.ends_with("\nlikes coffee"));
    assert!(newer.frozen_at >= refreshed.frozen_at);
    // Prompts are per session.
    assert_eq!(
        db_session(&db, "other")
            .context()
            .prompt()
            .await
            .unwrap()
            .prompt,
        ""
    );
}

pub async fn readonly_blocks_and_max_tokens_refuse_writes<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    define(
        &context,
        "soul",
        spec(BlockKind::Readonly, None, None, "fixed"),
    )
    .await;
    define(
        &context,
        "memory",
        spec(BlockKind::Writable, None, Some(10), "start"),
    )
    .await;
    define(&context, "skills", spec(BlockKind::Skill, None, None, "")).await;
    let refused = context.set_block("soul", "changed").await.unwrap_err();
    assert!(matches!(refused, Error::Context(ContextError::Readonly(_))));
    assert!(refused.to_string().contains("readonly"));
    let fifty_words = vec!["word"; 50].join(" ");
    let refused = context.set_block("memory", &fifty_words).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "Block \"memory\" exceeds maxTokens: 65 > 10"
    );
    // An append past the limit is refused whole: no silent truncation.
    let refused = context.append_to_block("memory", &fifty_words).await;
    assert!(matches!(
        refused,
        Err(Error::Context(ContextError::TooLarge { .. }))
    ));
    assert_eq!(
        context.block("memory").await.unwrap().unwrap().content,
        "start"
    );
    let appended = context.append_to_block("memory", "more").await.unwrap();
    assert_eq!(appended.content, "start\nmore");
    let keyed = context.set_block("skills", "x").await.unwrap_err();
    assert!(matches!(keyed, Error::Context(ContextError::Keyed(_))));
    let missing = context.append_to_block("nope", "x").await.unwrap_err();
    assert_eq!(missing.to_string(), "Block \"nope\" not found");
    // Definitions are checked too, and nothing is stored when they fail.
    let over = spec(BlockKind::Writable, None, Some(10), &fifty_words);
    assert!(matches!(
        context.define("big", over).await,
        Err(Error::Context(_))
    ));
    let keyed_text = spec(BlockKind::Search, None, None, "text");
    assert!(matches!(
        context.define("kb", keyed_text).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        context.define("", writable("x")).await,
        Err(Error::Invalid(_))
    ));
    let labels: Vec<String> = context
        .blocks()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.label)
        .collect();
    assert_eq!(labels, ["soul", "memory", "skills"]);
}

pub async fn set_context_writes_through_and_reports_usage<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    assert!(context.tools(false).await.unwrap().is_empty());
    define(
        &context,
        "soul",
        spec(BlockKind::Readonly, None, None, "fixed"),
    )
    .await;
    // Only readonly blocks: no tools (check 95).
    assert!(context.tools(false).await.unwrap().is_empty());
    define(
        &context,
        "memory",
        spec(BlockKind::Writable, Some("Facts"), Some(100), ""),
    )
    .await;
    define(&context, "log", writable("")).await;
    let tools = context.tools(false).await.unwrap();
    assert_eq!(tools.len(), 1);
    let enum_labels = &tools[0].parameters["properties"]["label"]["enum"];
    assert_eq!(enum_labels, &json!(["memory", "log"]));
    assert!(tools[0].parameters["properties"].get("metadata").is_none());

    let set = |args: Value| {
        let context = context.clone();
        async move { context.execute("set_context", &args).await }
    };
    let written = set(json!({"label": "memory", "content": "likes tea"})).await;
    assert_eq!(written, "Written to memory. Usage: 3% (3/100 tokens)");
    let appended =
        set(json!({"label": "memory", "content": "lives in Lisbon", "action": "append"})).await;
    assert!(
        appended.starts_with("Written to memory. Usage: "),
        "{appended}"
    );
    assert_eq!(
        context.block("memory").await.unwrap().unwrap().content,
        "likes tea\nlives in Lisbon"
    );
    assert_eq!(
        set(json!({"label": "log", "content": "one two"})).await,
        "Written to log. Usage: 3 tokens"
    );
    let readonly = set(json!({"label": "soul", "content": "x"})).await;
    assert_eq!(readonly, "Error: Block \"soul\" is readonly");
    assert_eq!(
        set(json!({"label": "nope", "content": "x"})).await,
        "Error: block \"nope\" not found"
    );
    let over =
        set(json!({"label": "memory", "content": vec!["w"; 200].join(" "), "action": "append"}))
            .await;
    assert!(
        over.starts_with("Error: Block \"memory\" exceeds maxTokens: "),
        "{over}"
    );
    assert_eq!(
        context.block("memory").await.unwrap().unwrap().content,
        "likes tea\nlives in Lisbon"
    );
    // Bad arguments and unknown tools are error strings, never panics or faults.
    assert!(set(json!({"label": "memory"})).await.starts_with("Error: "));
    assert!(set(json!("not json")).await.starts_with("Error: "));
    assert!(
        context
            .execute("rm_rf", &json!({}))
            .await
            .starts_with("Error: ")
    );
}

pub async fn keyed_entries_take_derived_keys<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    define(&context, "skills", spec(BlockKind::Skill, None, None, "")).await;
    define(&context, "kb", spec(BlockKind::Search, None, None, "")).await;
    let tools = context.tools(false).await.unwrap();
    let set = &tools[0];
    assert!(
        set.description
            .contains("- \"skills\" (skill collection, keyed entries): no description")
    );
    assert!(
        set.description
            .contains("- \"kb\" (searchable, keyed entries): no description")
    );
    assert!(set.description.contains("metadata: { title, description }"));
    assert_eq!(set.parameters["properties"]["metadata"]["type"], "object");

    let set = |args: Value| {
        let context = context.clone();
        async move { context.execute("set_context", &args).await }
    };
    let titled = set(json!({"label": "skills", "content": "Arr, matey.",
                            "metadata": {"title": "Pirate style", "description": "Talk like a pirate"}}))
    .await;
    assert_eq!(titled, "Indexed \"pirate-style\" in skills.");
    let untitled = set(json!({"label": "skills", "content": "No key here"})).await;
    assert!(untitled.starts_with("Indexed \"no-key-here-"), "{untitled}");
    let foreign = set(json!({"label": "skills", "content": "日本語のスキル"})).await;
    assert!(foreign.starts_with("Indexed \"entry-"), "{foreign}");
    let listing = context.block("skills").await.unwrap().unwrap().content;
    assert!(
        listing.contains("- pirate-style: Talk like a pirate"),
        "{listing}"
    );
    assert_eq!(listing.lines().count(), 3);
    // The same title updates in place.
    set(json!({"label": "skills", "content": "Yo ho.", "metadata": {"title": "Pirate style"}}))
        .await;
    let entry = context
        .entry("skills", "pirate-style")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (entry.content.as_str(), entry.description.as_deref()),
        ("Yo ho.", Some("Pirate style"))
    );
    assert_eq!(
        context
            .block("skills")
            .await
            .unwrap()
            .unwrap()
            .content
            .lines()
            .count(),
        3
    );

    assert_eq!(context.block("kb").await.unwrap().unwrap().content, "");
    let indexed = set(json!({"label": "kb", "content": "Tides follow the moon."})).await;
    assert!(
        indexed.starts_with("Indexed \"tides-follow-the-moon-"),
        "{indexed}"
    );
    assert_eq!(
        context.block("kb").await.unwrap().unwrap().content,
        "1 entries indexed."
    );
    assert!(context.render().await.unwrap().contains("KB [searchable]"));
}

/// An assistant message whose `tool-<name>` part has the given input and output.
fn tool_message(id: &str, tool: &str, key: &str, output: &str) -> sessiondb::Message {
    let part = json!({"type": format!("tool-{tool}"), "toolCallId": format!("call-{id}"),
                      "state": "output-available", "input": {"label": "skills", "key": key},
                      "output": output});
    sessiondb::Message::from_value(json!({"id": id, "role": "assistant", "parts": [part]})).unwrap()
}

pub async fn skills_load_unload_and_rebuild_from_history<S: Store>(db: Db<S>) {
    let session = db_session(&db, "s");
    let context = session.context();
    define(&context, "skills", spec(BlockKind::Skill, None, None, "")).await;
    define(&context, "memory", writable("")).await;
    context
        .put_entry("skills", "review", "Read the diff twice.", Some("Reviews"))
        .await
        .unwrap();
    context
        .put_entry("skills", "deploy", "Ship on Tuesdays.", None)
        .await
        .unwrap();
    assert!(
        context
            .render()
            .await
            .unwrap()
            .contains("SKILLS [loadable]\n")
    );

    let run = |name: &'static str, key: &str| {
        let (context, args) = (context.clone(), json!({"label": "skills", "key": key}));
        async move { context.execute(name, &args).await }
    };
    assert_eq!(run("load_context", "review").await, "Read the diff twice.");
    assert_eq!(run("load_context", "nope").await, "Not found: nope");
    let wrong = context
        .execute("load_context", &json!({"label": "memory", "key": "x"}))
        .await;
    assert_eq!(
        wrong,
        "Error: \"memory\" is not a skill block. Skill blocks: skills"
    );
    let unload = context.tools(false).await.unwrap();
    let unload = unload.iter().find(|t| t.name == "unload_context").unwrap();
    assert!(
        unload
            .description
            .ends_with(" Currently loaded: skills:review.")
    );
    assert_eq!(
        run("unload_context", "deploy").await,
        "Skill \"deploy\" is not currently loaded in \"skills\"."
    );

    // The model's turns hold the loading results; the newest one is rewritten on unload.
    session
        .append(
            tool_message("a1", "load_context", "review", "Read the diff twice."),
            Default::default(),
        )
        .await
        .unwrap();
    session
        .append(
            tool_message("a2", "load_context", "review", "Read the diff twice."),
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        run("unload_context", "review").await,
        "Unloaded \"review\" from skills. Context reclaimed."
    );
    let output = |id: &'static str| {
        let session = session.clone();
        async move {
            session.message(id).await.unwrap().unwrap().to_value()["parts"][0]["output"].clone()
        }
    };
    assert_eq!(output("a2").await, "[skill unloaded: review]");
    assert_eq!(output("a1").await, "Read the diff twice.");
    assert!(context.loaded_skills().await.unwrap().is_empty());
    // Reloading is allowed.
    assert_eq!(run("load_context", "review").await, "Read the diff twice.");

    // A session never touched by these tools rebuilds its state from history (a cold start):
    // loads count unless rewritten, unloads remove.
    let cold = db_session(&db, "cold");
    let cold_context = cold.context();
    define(
        &cold_context,
        "skills",
        spec(BlockKind::Skill, None, None, ""),
    )
    .await;
    cold.append(
        tool_message("c1", "load_context", "a", "A"),
        Default::default(),
    )
    .await
    .unwrap();
    cold.append(
        tool_message("c2", "load_context", "b", "[skill unloaded: b]"),
        Default::default(),
    )
    .await
    .unwrap();
    cold.append(
        tool_message("c3", "load_context", "c", "C"),
        Default::default(),
    )
    .await
    .unwrap();
    cold.append(
        tool_message("c4", "unload_context", "c", "Unloaded"),
        Default::default(),
    )
    .await
    .unwrap();
    let chat_call = json!({"id": "c5", "role": "assistant", "content": "", "tool_calls": [
        {"id": "t1", "type": "function",
         "function": {"name": "load_context", "arguments": "{\"label\":\"skills\",\"key\":\"d\"}"}}]});
    cold.append(
        sessiondb::Message::from_value(chat_call).unwrap(),
        Default::default(),
    )
    .await
    .unwrap();
    let chat_result = json!({"id": "c6", "role": "tool", "tool_call_id": "t1", "content": "D"});
    cold.append(
        sessiondb::Message::from_value(chat_result).unwrap(),
        Default::default(),
    )
    .await
    .unwrap();
    let loaded: Vec<String> = cold_context
        .loaded_skills()
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(loaded, ["skills:a", "skills:d"]);
    // Unloading a chat-completions load rewrites its tool message.
    cold_context
        .put_entry("skills", "d", "D", None)
        .await
        .unwrap();
    let unloaded = cold_context
        .execute("unload_context", &json!({"label": "skills", "key": "d"}))
        .await;
    assert!(unloaded.starts_with("Unloaded \"d\""), "{unloaded}");
    let rewritten = cold.message("c6").await.unwrap().unwrap().to_value();
    assert_eq!(rewritten["content"], "[skill unloaded: d]");
    // Clearing the conversation resets skill state.
    cold.clear().await.unwrap();
    assert!(cold_context.loaded_skills().await.unwrap().is_empty());
}

pub async fn search_blocks_search_their_own_entries<S: Store>(db: Db<S>) {
    let context = db_session(&db, "s").context();
    define(
        &context,
        "kb",
        spec(BlockKind::Search, Some("Knowledge"), None, ""),
    )
    .await;
    define(&context, "faq", spec(BlockKind::Search, None, None, "")).await;
    define(&context, "memory", writable("")).await;
    context
        .put_entry("kb", "tides", "Tides follow the moon.", None)
        .await
        .unwrap();
    context
        .put_entry("kb", "sun", "The sun rises in the east.", None)
        .await
        .unwrap();
    context
        .put_entry("faq", "moon", "The moon is not cheese.", None)
        .await
        .unwrap();
    db_session(&db, "other")
        .context()
        .define("kb", spec(BlockKind::Search, None, None, ""))
        .await
        .unwrap();
    db_session(&db, "other")
        .context()
        .put_entry("kb", "m", "moon elsewhere", None)
        .await
        .unwrap();

    let search = |label: &str, query: &str| {
        let (context, args) = (context.clone(), json!({"label": label, "query": query}));
        async move { context.execute("search_context", &args).await }
    };
    assert_eq!(
        search("kb", "moon").await,
        "[tides]\nTides follow the moon."
    );
    assert_eq!(search("kb", "cheese").await, "No results found.");
    context
        .put_entry("faq", "dessert", "Crème brûlée needs a torch.", None)
        .await
        .unwrap();
    assert_eq!(
        search("faq", "creme brulee").await,
        "[dessert]\nCrème brûlée needs a torch.",
        "accents fold"
    );
    assert_eq!(
        search("memory", "moon").await,
        "Error: \"memory\" is not searchable. Searchable blocks: kb, faq"
    );
    for hostile in [
        "\"",
        "moon*",
        "NEAR(moon sun)",
        "-moon",
        "kb:moon",
        "(",
        "\0",
        "",
    ] {
        let answer = search("kb", hostile).await;
        assert!(!answer.starts_with("Error"), "{hostile:?}: {answer}");
    }
    // Replacing an entry replaces what its key is found by.
    context
        .put_entry("kb", "tides", "Tides follow gravity.", None)
        .await
        .unwrap();
    assert_eq!(search("kb", "moon").await, "No results found.");
    assert_eq!(
        search("kb", "gravity").await,
        "[tides]\nTides follow gravity."
    );
    assert_eq!(
        context.block("kb").await.unwrap().unwrap().content,
        "2 entries indexed."
    );
    // Entries need a keyed block.
    let refused = context
        .put_entry("memory", "k", "x", None)
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Context(ContextError::NotKeyed(_))));
    let missing = context.put_entry("nope", "k", "x", None).await.unwrap_err();
    assert!(matches!(missing, Error::Context(ContextError::NotFound(_))));
}

pub async fn templates_apply_to_every_session_and_writes_stay_per_session<S: Store>(db: Db<S>) {
    let templates = db.context_templates("").unwrap();
    define(
        &templates,
        "soul",
        spec(BlockKind::Readonly, None, None, "Be brief."),
    )
    .await;
    define(
        &templates,
        "memory",
        spec(BlockKind::Writable, None, Some(50), "shared start"),
    )
    .await;
    define(&templates, "skills", spec(BlockKind::Skill, None, None, "")).await;
    templates
        .put_entry("skills", "review", "Read twice.", None)
        .await
        .unwrap();

    let a = db_session(&db, "a").context();
    let b = db_session(&db, "b").context();
    define(&a, "notes", writable("a's notes")).await;
    let labels = |blocks: Vec<sessiondb::BlockView>| -> Vec<String> {
        blocks.into_iter().map(|b| b.label).collect()
    };
    assert_eq!(
        labels(a.blocks().await.unwrap()),
        ["soul", "memory", "skills", "notes"]
    );
    // A session's write to a template block is its own copy, limit included.
    let written = a
        .execute(
            "set_context",
            &json!({"label": "memory", "content": "a only", "action": "append"}),
        )
        .await;
    assert!(
        written.starts_with("Written to memory. Usage: "),
        "{written}"
    );
    assert_eq!(
        a.block("memory").await.unwrap().unwrap().content,
        "shared start\na only"
    );
    assert_eq!(
        b.block("memory").await.unwrap().unwrap().content,
        "shared start"
    );
    assert_eq!(
        templates.block("memory").await.unwrap().unwrap().content,
        "shared start"
    );
    // Template entries are visible; a session's own entry of the same key shadows them.
    assert_eq!(
        a.execute("load_context", &json!({"label": "skills", "key": "review"}))
            .await,
        "Read twice."
    );
    b.put_entry("skills", "review", "b's way", None)
        .await
        .unwrap();
    assert_eq!(
        b.entry("skills", "review").await.unwrap().unwrap().content,
        "b's way"
    );
    assert_eq!(
        a.entry("skills", "review").await.unwrap().unwrap().content,
        "Read twice."
    );
    assert_eq!(
        b.block("skills").await.unwrap().unwrap().content,
        "- review"
    );
    // Deleting the session's copy shows the template again; templates stay after sessions go.
    assert!(a.delete_block("memory").await.unwrap());
    assert_eq!(
        a.block("memory").await.unwrap().unwrap().content,
        "shared start"
    );
    assert!(db_session(&db, "b").delete_session().await.unwrap());
    assert_eq!(
        labels(templates.blocks().await.unwrap()),
        ["soul", "memory", "skills"]
    );
    assert_eq!(
        b.entry("skills", "review").await.unwrap().unwrap().content,
        "Read twice."
    );
    // Templates are per namespace.
    let elsewhere = db.session_in("tenant", "a").unwrap().context();
    assert!(elsewhere.blocks().await.unwrap().is_empty());
}

/// Appends to one block made at once each keep their line, in a session's block and in a
/// namespace template's: each appends to the text as stored when it is written.
pub async fn concurrent_appends_to_a_block_keep_every_line<S: Store>(db: Db<S>) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 12;
    let templates = db.context_templates("").unwrap();
    define(&templates, "shared", writable("")).await;
    let session = db_session(&db, "s").context();
    define(&session, "notes", writable("")).await;
    let appender = |task: usize| {
        let (templates, session) = (&templates, &session);
        async move {
            for round in 0..ROUNDS {
                let line = format!("line {task}.{round}");
                session.append_to_block("notes", &line).await.unwrap();
                templates.append_to_block("shared", &line).await.unwrap();
            }
        }
    };
    futures::future::join_all((0..TASKS).map(appender)).await;

    for (context, label) in [(&session, "notes"), (&templates, "shared")] {
        let content = context.block(label).await.unwrap().unwrap().content;
        let mut lines: Vec<&str> = content.lines().collect();
        lines.sort_unstable();
        let mut expected: Vec<String> = (0..TASKS)
            .flat_map(|task| (0..ROUNDS).map(move |round| format!("line {task}.{round}")))
            .collect();
        expected.sort_unstable();
        assert_eq!(lines, expected, "{label}");
    }
}

pub async fn context_is_isolated_and_deleted_with_its_session<S: Store>(db: Db<S>) {
    let session = db_session(&db, "s");
    let context = session.context();
    define(&context, "memory", writable("mine")).await;
    define(&context, "kb", spec(BlockKind::Search, None, None, "")).await;
    context
        .put_entry("kb", "k", "secret tides", None)
        .await
        .unwrap();
    context.prompt().await.unwrap();
    let other_namespace = db.session_in("tenant", "s").unwrap().context();
    assert!(other_namespace.blocks().await.unwrap().is_empty());
    assert_eq!(other_namespace.search("kb", "tides").await.unwrap(), None);
    assert!(
        db_session(&db, "t")
            .context()
            .blocks()
            .await
            .unwrap()
            .is_empty()
    );
    // Context writes register the session, as state writes do.
    assert!(session.info().await.unwrap().is_some());
    assert!(session.delete_session().await.unwrap());
    assert!(context.blocks().await.unwrap().is_empty());
    assert_eq!(context.search("kb", "tides").await.unwrap(), None);
    assert_eq!(context.prompt().await.unwrap().prompt, "");
}

pub async fn session_search_tool_spans_sessions<S: Store>(db: Db<S>) {
    db_session(&db, "a")
        .append(
            text("m1", "user", "the tide tables for Lisbon"),
            Default::default(),
        )
        .await
        .unwrap();
    db_session(&db, "b")
        .append(
            text("m2", "assistant", "high tide at noon"),
            Default::default(),
        )
        .await
        .unwrap();
    db.session_in("tenant", "c")
        .unwrap()
        .append(text("m3", "user", "tide elsewhere"), Default::default())
        .await
        .unwrap();
    let context = db_session(&db, "b").context();
    let tools = context.tools(true).await.unwrap();
    assert_eq!(tools.last().unwrap().name, "session_search");
    let found = context
        .execute("session_search", &json!({"query": "tide"}))
        .await;
    let mut hits: Vec<&str> = found.split("\n---\n").collect();
    hits.sort_unstable();
    assert_eq!(
        hits,
        [
            "[assistant] high tide at noon",
            "[user] the tide tables for Lisbon"
        ]
    );
    assert_eq!(
        context
            .execute("session_search", &json!({"query": "absent"}))
            .await,
        "No results found."
    );
}

struct Text(Mutex<Option<String>>);

impl ReadonlyProvider for Text {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>> {
        let text = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(text) })
    }
}

impl WritableProvider for Text {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>> {
        ReadonlyProvider::get(self)
    }
    fn set<'a>(&'a self, content: &'a str) -> BoxFuture<'a, ProviderResult<()>> {
        *self.0.lock().unwrap() = Some(content.to_owned());
        Box::pin(async { Ok(()) })
    }
}

struct Library;

impl SkillProvider for Library {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>> {
        Box::pin(async { Ok(Some("- haiku: Write in 5-7-5".to_owned())) })
    }
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ProviderResult<Option<String>>> {
        Box::pin(async move { Ok((key == "haiku").then(|| "Count syllables.".to_owned())) })
    }
}

struct Broken;

impl SearchProvider for Broken {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>> {
        Box::pin(async { Ok(None) })
    }
    fn search<'a>(&'a self, _query: &'a str) -> BoxFuture<'a, ProviderResult<Option<String>>> {
        Box::pin(async { Err("index offline".into()) })
    }
}

pub async fn custom_providers_back_blocks<S: Store>(db: Db<S>) {
    let notes = Arc::new(Text(Mutex::new(None)));
    let custom = |label: &str, provider| CustomBlock {
        label: label.to_owned(),
        description: None,
        max_tokens: Some(20),
        provider,
    };
    let context = db_session(&db, "s")
        .context()
        .with_block(custom(
            "clock",
            Provider::Readonly(Arc::new(Text(Mutex::new(Some("noon".into()))))),
        ))
        .with_block(custom("notes", Provider::Writable(notes.clone())))
        .with_block(custom("poems", Provider::Skill(Arc::new(Library))))
        .with_block(custom("web", Provider::Search(Arc::new(Broken))));
    let prompt = context.render().await.unwrap();
    assert!(
        prompt.contains("CLOCK [10% — 2/20 tokens] [readonly]\n"),
        "{prompt}"
    );
    assert!(
        prompt.contains("NOTES [0% — 0/20 tokens] [writable]\n"),
        "{prompt}"
    );
    let poems =
        format!("POEMS [35% — 7/20 tokens] [loadable]\n{SECTION_RULE}\n- haiku: Write in 5-7-5");
    assert!(prompt.contains(&poems), "{prompt}");
    assert!(
        prompt.contains("WEB [0% — 0/20 tokens] [searchable]\n"),
        "{prompt}"
    );
    let names: Vec<String> = context
        .tools(false)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(
        names,
        [
            "set_context",
            "load_context",
            "unload_context",
            "search_context"
        ]
    );
    let written = context
        .execute(
            "set_context",
            &json!({"label": "notes", "content": "buy milk"}),
        )
        .await;
    assert_eq!(written, "Written to notes. Usage: 15% (3/20 tokens)");
    assert_eq!(notes.0.lock().unwrap().as_deref(), Some("buy milk"));
    let over = context
        .execute(
            "set_context",
            &json!({"label": "notes", "content": vec!["w"; 30].join(" ")}),
        )
        .await;
    assert!(
        over.starts_with("Error: Block \"notes\" exceeds maxTokens"),
        "{over}"
    );
    assert_eq!(notes.0.lock().unwrap().as_deref(), Some("buy milk"));
    let load = json!({"label": "poems", "key": "haiku"});
    assert_eq!(
        context.execute("load_context", &load).await,
        "Count syllables."
    );
    let failed = context
        .execute("search_context", &json!({"label": "web", "query": "x"}))
        .await;
    assert_eq!(failed, "Error: index offline");
    let readonly = context
        .execute("set_context", &json!({"label": "clock", "content": "x"}))
        .await;
    assert_eq!(readonly, "Error: Block \"clock\" is readonly");
    // A provider's entries are its own: there is nothing stored to list.
    let unlisted = context.entries("poems").await.unwrap_err();
    assert!(
        matches!(&unlisted, Error::Context(ContextError::Unlisted(l)) if l == "poems"),
        "{unlisted:?}"
    );

    // A provider's text is the application's, so it may hold a NUL: it renders, but the frozen
    // prompt is stored free text and refuses it, storing nothing.
    let ticking = Arc::new(Text(Mutex::new(Some("tick\u{0}tock".into()))));
    let context = db_session(&db, "nul")
        .context()
        .with_block(custom("clock", Provider::Readonly(ticking.clone())));
    assert!(context.render().await.unwrap().contains("tick\u{0}tock"));
    match context.prompt().await {
        Err(Error::Invalid(e)) => assert_eq!(
            (e.field.as_str(), &e.kind),
            ("prompt", &ValidationErrorKind::NulCharacter)
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
    *ticking.0.lock().unwrap() = Some("tick tock".into());
    let frozen = context.prompt().await.unwrap();
    assert!(frozen.prompt.contains("tick tock"), "{}", frozen.prompt);
}

pub async fn export_carries_the_sessions_own_context<S: Store>(db: Db<S>) {
    use futures::TryStreamExt;
    let templates = db.context_templates("").unwrap();
    define(
        &templates,
        "soul",
        spec(BlockKind::Readonly, None, None, "Be brief."),
    )
    .await;
    define(&templates, "skills", spec(BlockKind::Skill, None, None, "")).await;
    templates
        .put_entry("skills", "review", "Read twice.", None)
        .await
        .unwrap();

    let session = db_session(&db, "s");
    chain(&session, &["a"]).await;
    let context = session.context();
    let rules = spec(
        BlockKind::Readonly,
        Some("House rules"),
        Some(40),
        "No spoilers.",
    );
    define(&context, "rules", rules).await;
    define(&context, "memory", writable("likes tea")).await;
    define(&context, "notes", spec(BlockKind::Search, None, None, "")).await;
    context
        .put_entry("notes", "n1", "the blue door", Some("a door"))
        .await
        .unwrap();
    context
        .put_entry("notes", "n2", "the red car", None)
        .await
        .unwrap();
    // An entry of its own in a template's block goes along; one equal to the template's adds
    // nothing and stays out.
    context
        .put_entry("skills", "deploy", "Ship on Fridays.", Some("deploys"))
        .await
        .unwrap();
    context
        .put_entry("skills", "review", "Read twice.", None)
        .await
        .unwrap();
    let prompt = context.prompt().await.unwrap().prompt;

    let lines: Vec<String> = session.export().try_collect().await.unwrap();
    let kinds: Vec<&str> = lines
        .iter()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap();
            ["session", "message", "block", "entry", "prompt"]
                .into_iter()
                .find(|kind| value.get(kind).is_some())
                .unwrap()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "session", "message", "block", "block", "block", "entry", "entry", "entry", "prompt"
        ]
    );

    let copy = db_session(&db, "copy");
    let document = lines.concat();
    let summary = copy
        .import_lines(sessiondb::parse_import(&document).unwrap())
        .await
        .unwrap();
    assert_eq!((summary.imported, summary.skipped), (8, 0));
    let copied = copy.context();
    assert_eq!(
        copied.blocks().await.unwrap(),
        context.blocks().await.unwrap()
    );
    for (label, key) in [("notes", "n1"), ("notes", "n2"), ("skills", "deploy")] {
        assert_eq!(
            copied.entry(label, key).await.unwrap(),
            context.entry(label, key).await.unwrap(),
            "{label}/{key}"
        );
    }
    assert_eq!(
        copied.search("notes", "door").await.unwrap(),
        context.search("notes", "door").await.unwrap()
    );
    assert_eq!(copied.prompt().await.unwrap().prompt, prompt);

    // An entry whose block neither the session nor an earlier line defines fails the import
    // whole, naming its line.
    let orphan_entry = concat!(
        r#"{"message": {"id": "m", "role": "user", "content": "hi"}, "parentId": null}"#,
        "\n",
        r#"{"entry": {"label": "nowhere", "key": "k", "content": "x"}}"#,
    );
    let empty = db_session(&db, "empty");
    let parsed = sessiondb::parse_import(orphan_entry).unwrap();
    let err = empty.import_lines(parsed).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid(v) if v.field == "lines[1].entry.label"),
        "{err:?}"
    );
    assert!(empty.message("m").await.unwrap().is_none());
    // Lines are checked as the context API checks its calls.
    let bad_kind = r#"{"block": {"label": "x", "kind": "sticky"}}"#;
    let err = sessiondb::parse_import(bad_kind).unwrap_err();
    assert_eq!(err.field, "lines[0].block.kind");
    let keyed_text = r#"{"block": {"label": "x", "kind": "skill", "content": "text"}}"#;
    let parsed = sessiondb::parse_import(keyed_text).unwrap();
    let err = empty.import_lines(parsed).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid(v) if v.field == "lines[0].block.content"),
        "{err:?}"
    );
    assert!(
        empty
            .context()
            .blocks()
            .await
            .unwrap()
            .iter()
            .all(|b| b.label != "x")
    );
}

pub async fn templates_list_export_and_move_to_another_namespace<S: Store>(db: Db<S>) {
    let templates = db.context_templates("").unwrap();
    assert!(db.export_templates("").await.unwrap().is_empty());
    let soul = spec(
        BlockKind::Readonly,
        Some("Who you are"),
        Some(30),
        "Be brief.",
    );
    define(&templates, "soul", soul).await;
    define(&templates, "skills", spec(BlockKind::Skill, None, None, "")).await;
    define(&templates, "kb", spec(BlockKind::Search, None, None, "")).await;
    let entries = [
        ("skills", "review", "Read twice.", Some("reviews")),
        ("skills", "deploy", "Ship on Fridays.", None),
        ("kb", "door", "the blue door", None),
    ];
    for (label, key, content, description) in entries {
        templates
            .put_entry(label, key, content, description)
            .await
            .unwrap();
    }
    let context = db_session(&db, "s").context();
    context
        .put_entry("skills", "review", "My way.", None)
        .await
        .unwrap();

    // A listing is by key; a session's own entry stands in for its template's.
    let keys_and_contents = |entries: Vec<sessiondb::ContextEntry>| -> Vec<(String, String)> {
        entries.into_iter().map(|e| (e.key, e.content)).collect()
    };
    let pair = |k: &str, c: &str| (k.to_owned(), c.to_owned());
    assert_eq!(
        keys_and_contents(context.entries("skills").await.unwrap()),
        [
            pair("deploy", "Ship on Fridays."),
            pair("review", "My way.")
        ]
    );
    assert_eq!(
        keys_and_contents(templates.entries("skills").await.unwrap()),
        [
            pair("deploy", "Ship on Fridays."),
            pair("review", "Read twice.")
        ]
    );
    let not_keyed = templates.entries("soul").await.unwrap_err();
    assert!(
        matches!(&not_keyed, Error::Context(ContextError::NotKeyed(l)) if l == "soul"),
        "{not_keyed:?}"
    );
    let missing = context.entries("nowhere").await.unwrap_err();
    assert!(
        matches!(&missing, Error::Context(ContextError::NotFound(l)) if l == "nowhere"),
        "{missing:?}"
    );

    // The templates' part: its line, the blocks in prompt order, then the keyed blocks' entries
    // (the session's own entry is the session's, not the namespace's).
    let lines = db.export_templates("").await.unwrap();
    assert_eq!(lines[0], sessiondb::TEMPLATES_LINE);
    let values: Vec<Value> = lines[1..]
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(
        values,
        [
            json!({"block": {"label": "soul", "kind": "readonly", "description": "Who you are",
                             "maxTokens": 30, "content": "Be brief."}}),
            json!({"block": {"label": "skills", "kind": "skill"}}),
            json!({"block": {"label": "kb", "kind": "search"}}),
            json!({"entry": {"label": "skills", "key": "deploy", "content": "Ship on Fridays."}}),
            json!({"entry": {"label": "skills", "key": "review", "content": "Read twice.",
                             "description": "reviews"}}),
            json!({"entry": {"label": "kb", "key": "door", "content": "the blue door"}}),
        ]
    );

    // It moves to another namespace whole, and again without change.
    let document = lines.concat();
    for _ in 0..2 {
        let parsed = sessiondb::parse_import(&document).unwrap();
        let summary = db.import_templates("tenant", parsed).await.unwrap();
        assert_eq!((summary.imported, summary.skipped), (6, 0));
        assert_eq!(db.export_templates("tenant").await.unwrap(), lines);
    }
    let moved = db.session_in("tenant", "t").unwrap().context();
    let fresh = db_session(&db, "fresh").context();
    assert_eq!(moved.render().await.unwrap(), fresh.render().await.unwrap());
    assert_eq!(
        moved.search("kb", "blue").await.unwrap(),
        fresh.search("kb", "blue").await.unwrap()
    );

    // A templates part holds blocks and entries only, and a session takes no templates line:
    // either is refused whole, naming the line.
    let with_message = format!(
        "{document}{}\n",
        r#"{"message": {"id": "m", "role": "user", "content": "hi"}}"#
    );
    let parsed = sessiondb::parse_import(&with_message).unwrap();
    let err = db.import_templates("other", parsed).await.unwrap_err();
    assert!(
        matches!(&err, Error::Invalid(v) if v.field == "lines[7]"),
        "{err:?}"
    );
    assert!(db.export_templates("other").await.unwrap().is_empty());
    let session = db_session(&db, "plain");
    let err = session
        .import_lines(sessiondb::parse_import(&document).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Invalid(v) if v.field == "lines[0]"),
        "{err:?}"
    );
    assert!(session.info().await.unwrap().is_none());
}

pub async fn entries_are_deleted_one_at_a_time<S: Store>(db: Db<S>) {
    let templates = db.context_templates("").unwrap();
    define(&templates, "kb", spec(BlockKind::Search, None, None, "")).await;
    for (key, content) in [("door", "the blue door"), ("car", "the red car")] {
        templates.put_entry("kb", key, content, None).await.unwrap();
    }
    let context = db_session(&db, "s").context();
    context
        .put_entry("kb", "door", "the green door", None)
        .await
        .unwrap();
    assert!(context.search("kb", "green").await.unwrap().is_some());

    // The session's own entry goes; its template's shows again, found by search as before.
    assert!(context.delete_entry("kb", "door").await.unwrap());
    assert!(!context.delete_entry("kb", "door").await.unwrap());
    assert_eq!(
        context.entry("kb", "door").await.unwrap().unwrap().content,
        "the blue door"
    );
    assert_eq!(context.search("kb", "green").await.unwrap(), None);
    assert!(context.search("kb", "blue").await.unwrap().is_some());
    // A template's entry goes for every session; the index forgets it.
    assert!(templates.delete_entry("kb", "car").await.unwrap());
    assert_eq!(context.search("kb", "red").await.unwrap(), None);
    let keys: Vec<String> = context
        .entries("kb")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["door"]);
    assert!(!context.delete_entry("nowhere", "k").await.unwrap());
    let invalid = context.delete_entry("kb", "").await.unwrap_err();
    assert!(matches!(invalid, Error::Invalid(_)), "{invalid:?}");
}

pub async fn entries_page_forward_by_key<S: Store>(db: Db<S>) {
    let templates = db.context_templates("").unwrap();
    define(&templates, "kb", spec(BlockKind::Search, None, None, "")).await;
    for i in 0..10 {
        let content = format!("template {i}");
        templates
            .put_entry("kb", &format!("k{i:02}"), &content, None)
            .await
            .unwrap();
    }
    let context = db_session(&db, "s").context();
    // Own entries shadow templates' at k03 and k04 (two rows each, straddling a page edge at
    // size 3 and 4) and add k10.
    for key in ["k03", "k04", "k10"] {
        context.put_entry("kb", key, "own", None).await.unwrap();
    }
    let everything: Vec<(String, String)> = context
        .entries("kb")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.content))
        .collect();
    assert_eq!(everything.len(), 11);
    assert_eq!(everything[3], ("k03".to_owned(), "own".to_owned()));
    assert_eq!(everything[10], ("k10".to_owned(), "own".to_owned()));

    for limit in [1, 2, 3, 4, 11, 100] {
        let mut read = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let request = PageRequest {
                limit: Some(limit),
                after: after.clone(),
                ..PageRequest::default()
            };
            let page = context.entry_page("kb", &request).await.unwrap();
            assert!(page.items.len() <= limit, "limit {limit}");
            assert_eq!(page.previous_cursor, None);
            read.extend(page.items.into_iter().map(|e| (e.key, e.content)));
            match page.next_cursor {
                Some(next) => {
                    assert_eq!(Some(&next), read.last().map(|(k, _)| k), "limit {limit}");
                    after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(read, everything, "limit {limit}");
    }

    // A cursor is a key, present or not; the templates' layer pages alone.
    let request = |after: &str, limit: usize| PageRequest {
        limit: Some(limit),
        after: Some(after.to_owned()),
        ..PageRequest::default()
    };
    let page = context.entry_page("kb", &request("k035", 2)).await.unwrap();
    let keys: Vec<&str> = page.items.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        (keys, page.next_cursor.as_deref()),
        (vec!["k04", "k05"], Some("k05"))
    );
    assert_eq!(page.items[0].content, "own");
    let tail = templates
        .entry_page("kb", &request("k08", 5))
        .await
        .unwrap();
    let keys: Vec<&str> = tail.items.iter().map(|e| e.key.as_str()).collect();
    assert_eq!((keys, tail.next_cursor), (vec!["k09"], None));

    // Bad pages are typed errors naming their field.
    let field = |err: Error| match err {
        Error::Invalid(v) => v.field,
        other => panic!("{other:?}"),
    };
    for (bad, name) in [
        (request("", 2), "after"),
        (request("a\u{1}b", 2), "after"),
        (request("k00", 0), "limit"),
        (request("k00", 101), "limit"),
        (
            PageRequest {
                before: Some("k05".into()),
                ..PageRequest::default()
            },
            "before",
        ),
        (
            PageRequest {
                descending: true,
                ..PageRequest::default()
            },
            "order",
        ),
    ] {
        let err = context.entry_page("kb", &bad).await.unwrap_err();
        assert_eq!(field(err), name);
    }
    let missing = context
        .entry_page("nowhere", &PageRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&missing, Error::Context(ContextError::NotFound(l)) if l == "nowhere"),
        "{missing:?}"
    );
}

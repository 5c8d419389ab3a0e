//! The rendered system prompt byte for byte (`golden/prompt.txt` is written by hand from the
//! reference format, never blessed), and the generated tool definitions checked by a real
//! JSON-Schema validator against sample arguments.

use serde_json::{Value, json};
use sessiondb_core::context::{BlockKind, BlockView, render_prompt, tool_definitions};

/// The blocks of the golden prompt: all four kinds, descriptions, percentages (two of them
/// rounding a half up), an empty readonly block that is left out and an empty writable one that
/// is not.
fn golden_blocks() -> Vec<BlockView> {
    let block = |label: &str, kind, description: Option<&str>, max, content: &str, writable| {
        BlockView::new(
            label.into(),
            kind,
            description.map(str::to_owned),
            max,
            content.into(),
            writable,
        )
    };
    vec![
        block(
            "soul",
            BlockKind::Readonly,
            Some("Identity"),
            None,
            "You are a careful research assistant. Cite sources; never invent them.",
            false,
        ),
        block(
            "memory",
            BlockKind::Writable,
            Some("Learned facts"),
            Some(200),
            "The user prefers metric units.\nThe user lives in Lisbon and works on tide models.",
            true,
        ),
        block("scratch", BlockKind::Readonly, None, None, "", false),
        block(
            "skills",
            BlockKind::Skill,
            Some("Playbooks"),
            None,
            "- code-review: How to review a pull request\n- pirate-style",
            true,
        ),
        block(
            "docs",
            BlockKind::Search,
            None,
            Some(8),
            "3 entries indexed.",
            false,
        ),
        block("notes", BlockKind::Writable, None, Some(100), "", true),
    ]
}

#[test]
fn prompt_matches_the_reference_format_byte_for_byte() {
    let expected = include_str!("golden/prompt.txt");
    let rendered = render_prompt(&golden_blocks());
    assert_eq!(rendered, expected);
    assert_eq!(rendered.matches(&"═".repeat(46)).count(), 10);
}

fn validator(schema: &Value) -> jsonschema::Validator {
    assert!(
        jsonschema::meta::is_valid(schema),
        "not a valid schema: {schema}"
    );
    jsonschema::validator_for(schema).unwrap()
}

#[test]
fn tool_schemas_validate_sample_arguments() {
    let loaded = vec!["skills:code-review".to_owned()];
    let tools = tool_definitions(&golden_blocks(), &loaded, true);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "set_context",
            "load_context",
            "unload_context",
            "search_context",
            "session_search"
        ]
    );
    let samples: [(&str, Value, bool); 14] = [
        (
            "set_context",
            json!({"label": "memory", "content": "x"}),
            true,
        ),
        (
            "set_context",
            json!({"label": "skills", "content": "x", "action": "append",
                               "metadata": {"title": "T", "description": "D"}}),
            true,
        ),
        (
            "set_context",
            json!({"label": "soul", "content": "x"}),
            false,
        ),
        (
            "set_context",
            json!({"label": "docs", "content": "x"}),
            false,
        ),
        (
            "set_context",
            json!({"label": "memory", "content": "x", "action": "merge"}),
            false,
        ),
        ("set_context", json!({"label": "memory"}), false),
        (
            "set_context",
            json!({"label": "memory", "content": "x", "metadata": {"title": 3}}),
            false,
        ),
        (
            "load_context",
            json!({"label": "skills", "key": "code-review"}),
            true,
        ),
        ("load_context", json!({"label": "docs", "key": "k"}), false),
        (
            "unload_context",
            json!({"label": "skills", "key": "code-review"}),
            true,
        ),
        (
            "search_context",
            json!({"label": "docs", "query": "tides"}),
            true,
        ),
        (
            "search_context",
            json!({"label": "memory", "query": "tides"}),
            false,
        ),
        ("session_search", json!({"query": "tides"}), true),
        ("session_search", json!({}), false),
    ];
    for (name, arguments, valid) in samples {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        let validator = validator(&tool.parameters);
        assert_eq!(validator.is_valid(&arguments), valid, "{name} {arguments}");
        // The exported formats carry the same schema.
        assert_eq!(tool.openai()["function"]["parameters"], tool.parameters);
        assert_eq!(tool.anthropic()["input_schema"], tool.parameters);
    }
    let unload = tools.iter().find(|t| t.name == "unload_context").unwrap();
    assert!(
        unload
            .description
            .ends_with(" Currently loaded: skills:code-review.")
    );
    let set = &tools[0];
    assert!(
        set.description
            .contains("- \"skills\" (skill collection, keyed entries): Playbooks")
    );
    assert!(
        set.description
            .contains("- \"memory\" (writable): Learned facts")
    );
    assert!(
        set.description
            .contains("- \"notes\" (writable): no description")
    );
    assert!(set.description.contains("metadata: { title, description }"));
    assert!(!set.description.contains("\"soul\""));
}

#[test]
fn only_readonly_blocks_make_no_tools() {
    let readonly: Vec<BlockView> = golden_blocks()
        .into_iter()
        .filter(|b| b.kind == BlockKind::Readonly)
        .collect();
    assert!(tool_definitions(&readonly, &[], false).is_empty());
    let names: Vec<String> = tool_definitions(&readonly, &[], true)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["session_search"]);
}

//! Context blocks: the labelled sections a system prompt is assembled from, the prompt's exact
//! text, the AI tools generated from the blocks present, their result strings, and the
//! loaded-skill state a conversation's history implies.
//!
//! A block is one of four kinds: `readonly` and `writable` blocks hold text; `skill` blocks hold
//! keyed entries the model loads on demand (the block's text is their listing); `search` blocks
//! hold keyed entries in a full-text index (the block's text is their count). Everything here is
//! pure: the facade reads blocks from the store or a custom provider and calls in.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::message::{ValidationError, validate_id};
use crate::store::ScopedBlock;
use crate::tokens::estimate_string_tokens;

/// 46 × `═` (U+2550): opens and closes every section header of the prompt.
pub const SECTION_RULE: &str = "══════════════════════════════════════════════";

/// What a loading result is rewritten to when its skill is unloaded starts with this.
pub const UNLOADED_PREFIX: &str = "[skill unloaded:";

/// Results `search_context` and `session_search` return at most.
pub const SEARCH_LIMIT: usize = 10;

pub const SET_CONTEXT: &str = "set_context";
pub const LOAD_CONTEXT: &str = "load_context";
pub const UNLOAD_CONTEXT: &str = "unload_context";
pub const SEARCH_CONTEXT: &str = "search_context";
pub const SESSION_SEARCH: &str = "session_search";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockKind {
    Readonly,
    Writable,
    Skill,
    Search,
}

impl BlockKind {
    pub const ALL: [BlockKind; 4] = [Self::Readonly, Self::Writable, Self::Skill, Self::Search];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Readonly => "readonly",
            Self::Writable => "writable",
            Self::Skill => "skill",
            Self::Search => "search",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// Skill and search blocks hold keyed entries rather than text of their own.
    pub fn is_keyed(self) -> bool {
        matches!(self, Self::Skill | Self::Search)
    }
}

/// A block as stored: its definition and, for readonly and writable blocks, its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDef {
    pub label: String,
    pub kind: BlockKind,
    pub description: Option<String>,
    /// Hard limit on the block's token estimate; writes beyond it fail.
    pub max_tokens: Option<u64>,
    /// Empty for skill and search blocks (their entries live apart).
    pub content: String,
}

/// A block as the prompt and the tools see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockView {
    pub label: String,
    pub kind: BlockKind,
    pub description: Option<String>,
    pub max_tokens: Option<u64>,
    /// The text rendered: a text block's content, a skill block's listing, a search block's count.
    pub content: String,
    pub tokens: u64,
    /// Text blocks: writable kind. Keyed blocks: their source takes new entries.
    pub writable: bool,
}

impl BlockView {
    pub fn new(
        label: String,
        kind: BlockKind,
        description: Option<String>,
        max_tokens: Option<u64>,
        content: String,
        writable: bool,
    ) -> Self {
        let tokens = estimate_string_tokens(&content);
        Self {
            label,
            kind,
            description,
            max_tokens,
            content,
            tokens,
            writable,
        }
    }
}

/// The blocks a session sees, in prompt order: its namespace's templates in their order, each
/// replaced by the session's own block of the same label, then the session's other blocks.
pub fn merge_layers(blocks: Vec<ScopedBlock>) -> Vec<BlockDef> {
    let (templates, own): (Vec<_>, Vec<_>) = blocks.into_iter().partition(|b| b.template);
    let mut own: Vec<Option<BlockDef>> = own.into_iter().map(|b| Some(b.block)).collect();
    let mut merged = Vec::with_capacity(templates.len() + own.len());
    for template in templates {
        let shadow = own
            .iter_mut()
            .find(|b| b.as_ref().is_some_and(|b| b.label == template.block.label));
        merged.push(shadow.and_then(Option::take).unwrap_or(template.block));
    }
    merged.extend(own.into_iter().flatten());
    merged
}

/// Labels are identifiers: 1..=256 characters, no control characters.
pub fn validate_label(label: &str) -> Result<(), ValidationError> {
    validate_id("label", label)
}

/// Entry keys follow the same rule as labels.
pub fn validate_entry_key(key: &str) -> Result<(), ValidationError> {
    validate_id("key", key)
}

/// Why a block write was refused. The messages are the reference's, so a tool result built from
/// one (`Error: …`) reads the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    #[error("Block \"{0}\" not found")]
    NotFound(String),
    #[error("Block \"{0}\" is readonly")]
    Readonly(String),
    #[error("Block \"{0}\" is a keyed provider. Use put_entry() instead.")]
    Keyed(String),
    #[error("Block \"{0}\" is not a skill or search block")]
    NotKeyed(String),
    #[error("Block \"{label}\" exceeds maxTokens: {tokens} > {max}")]
    TooLarge {
        label: String,
        tokens: u64,
        max: u64,
    },
    #[error("Block \"{0}\" does not support writes")]
    NoWrites(String),
    /// A custom block's entries are its provider's, which has no listing.
    #[error("Block \"{0}\" keeps its entries in its provider, which cannot list them")]
    Unlisted(String),
    /// A custom provider failed; its message.
    #[error("{0}")]
    Provider(String),
}

/// How `set_context` (and the library's write) changes a text block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    #[default]
    Replace,
    Append,
}

/// `old` then `new`, with a line break between them when `old` is not empty and `new` does not
/// start with one.
pub fn appended(old: &str, new: &str) -> String {
    let separator = if !old.is_empty() && !new.starts_with('\n') {
        "\n"
    } else {
        ""
    };
    format!("{old}{separator}{new}")
}

/// Refuses content whose estimate exceeds `max_tokens`; returns the estimate otherwise.
pub fn check_fits(
    label: &str,
    max_tokens: Option<u64>,
    content: &str,
) -> Result<u64, ContextError> {
    let tokens = estimate_string_tokens(content);
    match max_tokens {
        Some(max) if tokens > max => Err(ContextError::TooLarge {
            label: label.to_owned(),
            tokens,
            max,
        }),
        _ => Ok(tokens),
    }
}

/// The content a write leaves in a stored text block, or why the block refuses it. Backends call
/// this inside the transaction that reads the current content, so the limit holds atomically.
pub fn written_content(
    block: &BlockDef,
    text: &str,
    mode: WriteMode,
) -> Result<String, ContextError> {
    match block.kind {
        BlockKind::Readonly => return Err(ContextError::Readonly(block.label.clone())),
        BlockKind::Skill | BlockKind::Search => {
            return Err(ContextError::Keyed(block.label.clone()));
        }
        BlockKind::Writable => {}
    }
    let content = match mode {
        WriteMode::Replace => text.to_owned(),
        WriteMode::Append => appended(&block.content, text),
    };
    check_fits(&block.label, block.max_tokens, &content)?;
    Ok(content)
}

/// The text a skill block shows: one line per entry, `- key: description` or `- key`.
pub fn skill_listing<'a>(entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> String {
    entries
        .into_iter()
        .map(
            |(key, description)| match description.filter(|d| !d.is_empty()) {
                Some(description) => format!("- {key}: {description}"),
                None => format!("- {key}"),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text a search block shows: `<n> entries indexed.`, empty when it has none.
pub fn search_summary(entries: u64) -> String {
    if entries == 0 {
        String::new()
    } else {
        format!("{entries} entries indexed.")
    }
}

/// Search hits as `[key]\ncontent`, separated by blank lines; `None` when there are none.
pub fn search_results<'a>(hits: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let sections: Vec<String> = hits
        .into_iter()
        .map(|(key, content)| format!("[{key}]\n{content}"))
        .collect();
    (!sections.is_empty()).then(|| sections.join("\n\n"))
}

// ---------------------------------------------------------------------------------------------
// The system prompt

/// Empty readonly text blocks are left out; writable, skill and search blocks always render so
/// the model knows the tools can address them.
fn renders(block: &BlockView) -> bool {
    !block.content.is_empty() || block.writable || block.kind.is_keyed()
}

/// `LABEL (description) [pct% — tokens/max tokens] [marker]`.
pub fn header(block: &BlockView) -> String {
    let mut header = block.label.to_uppercase();
    if let Some(description) = block.description.as_deref().filter(|d| !d.is_empty()) {
        header.push_str(&format!(" ({description})"));
    }
    if let Some(max) = block.max_tokens.filter(|max| *max > 0) {
        let pct = (block.tokens as f64 / max as f64 * 100.0).round();
        header.push_str(&format!(" [{pct}% — {}/{max} tokens]", block.tokens));
    }
    header.push_str(match block.kind {
        BlockKind::Search => " [searchable]",
        BlockKind::Skill => " [loadable]",
        _ if !block.writable => " [readonly]",
        _ => " [writable]",
    });
    header
}

/// The system prompt: one section per rendered block, in order, separated by blank lines.
pub fn render_prompt(blocks: &[BlockView]) -> String {
    blocks
        .iter()
        .filter(|b| renders(b))
        .map(|b| {
            format!(
                "{SECTION_RULE}\n{}\n{SECTION_RULE}\n{}",
                header(b),
                b.content
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

// ---------------------------------------------------------------------------------------------
// Entry keys

/// The first 60 UTF-16 units, lower-cased, runs of anything but `[a-z0-9]` as one `-`, without a
/// leading or trailing `-`. A character cut in half by the 60-unit limit counts as a separator.
fn slug(text: &str) -> String {
    let mut units = 0;
    let mut head = String::new();
    for c in text.chars() {
        if units >= 60 {
            break;
        }
        units += c.len_utf16();
        head.push(if units > 60 { '\u{FFFD}' } else { c });
    }
    let mut slug = String::new();
    for c in head.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_owned()
}

/// 32-bit FNV-1a over UTF-16 units, in base 36.
fn stable_hash(text: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for unit in text.encode_utf16() {
        hash ^= u32::from(unit);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    base36(hash)
}

fn base36(mut n: u32) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    loop {
        digits.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ASCII digits")
}

/// The key `set_context` files a keyed entry under: the slug of a non-blank title (or
/// `entry-<hash>` when that slug is empty), else `<slug of the content or "entry">-<hash>`.
pub fn entry_key(title: Option<&str>, content: &str) -> String {
    match title.filter(|t| !t.trim().is_empty()) {
        Some(title) => {
            let slug = slug(title);
            if slug.is_empty() {
                format!("entry-{}", stable_hash(title))
            } else {
                slug
            }
        }
        None => {
            let slug = slug(content);
            let slug = if slug.is_empty() {
                "entry".into()
            } else {
                slug
            };
            format!("{slug}-{}", stable_hash(content))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tool definitions

/// One tool: a name, a description for the model, and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

impl ToolDefinition {
    /// OpenAI function calling: `{type: "function", function: {name, description, parameters}}`.
    pub fn openai(&self) -> Value {
        json!({"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}})
    }

    /// Anthropic tool use: `{name, description, input_schema}`.
    pub fn anthropic(&self) -> Value {
        json!({"name": self.name, "description": self.description,
               "input_schema": self.parameters})
    }
}

fn quoted_list(labels: &[&str]) -> String {
    labels
        .iter()
        .map(|l| format!("\"{l}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn set_context_tool(writable: &[&BlockView]) -> ToolDefinition {
    let lines: Vec<String> = writable
        .iter()
        .map(|b| {
            let kind = match b.kind {
                BlockKind::Skill => "skill collection, keyed entries",
                BlockKind::Search => "searchable, keyed entries",
                _ => "writable",
            };
            let description = b.description.as_deref().unwrap_or("no description");
            format!("- \"{}\" ({kind}): {description}", b.label)
        })
        .collect();
    let keyed: Vec<&str> = writable
        .iter()
        .filter(|b| b.kind.is_keyed())
        .map(|b| b.label.as_str())
        .collect();
    let labels: Vec<&str> = writable.iter().map(|b| b.label.as_str()).collect();
    let mut properties = json!({
        "label": {"type": "string", "enum": labels, "description": "Block label to write to"},
        "content": {"type": "string", "description": "The main content to write to the block."},
        "action": {"type": "string", "enum": ["replace", "append"],
                   "description": "replace (default) or append"},
    });
    let mut description = format!(
        "Write to a context block. Available blocks:\n{}\n\nWrites are durable and persist across sessions.",
        lines.join("\n")
    );
    if !keyed.is_empty() {
        properties["metadata"] = json!({
            "type": "object",
            "description": format!(
                "Optional metadata for keyed entries (skill and searchable blocks: {}). A title keeps updates stable; a description helps the model pick the right entry.",
                quoted_list(&keyed)),
            "properties": {
                "title": {"type": "string", "description": "Short title. Used as a stable identifier — entries with the same title are updated in place, different titles create new entries."},
                "description": {"type": "string", "description": "One-line summary shown alongside the title in the system prompt so the model can decide when to load the entry."},
            },
        });
        description.push_str("\n\nFor skill and searchable blocks, pass `metadata: { title, description }` — title stabilises updates, description helps the model pick entries. Metadata is optional.");
    }
    ToolDefinition {
        name: SET_CONTEXT.into(),
        description,
        parameters: json!({"type": "object", "properties": properties,
                           "required": ["label", "content"]}),
    }
}

fn label_key_schema(labels: &[&str], label_text: &str, key_text: &str) -> Value {
    json!({"type": "object",
           "properties": {
               "label": {"type": "string", "enum": labels, "description": label_text},
               "key": {"type": "string", "description": key_text}},
           "required": ["label", "key"]})
}

/// The tools the blocks call for, in a fixed order: `set_context` (any writable block),
/// `load_context` and `unload_context` (any skill block), `search_context` (any search block),
/// then `session_search` when the caller offers cross-session search. `loaded` lists the loaded
/// skills as `label:key`, shown in `unload_context`'s description.
pub fn tool_definitions(
    blocks: &[BlockView],
    loaded: &[String],
    session_search: bool,
) -> Vec<ToolDefinition> {
    let mut tools = Vec::new();
    let writable: Vec<&BlockView> = blocks.iter().filter(|b| b.writable).collect();
    if !writable.is_empty() {
        tools.push(set_context_tool(&writable));
    }
    let skills = labels_of(blocks, BlockKind::Skill);
    if !skills.is_empty() {
        tools.push(ToolDefinition {
            name: LOAD_CONTEXT.into(),
            description: format!(
                "Load a skill's full content into the conversation. The skill blocks of the system prompt list the available keys. Skill blocks: {}.",
                quoted_list(&skills)
            ),
            parameters: label_key_schema(&skills, "Skill block label", "Skill key to load"),
        });
        let currently = if loaded.is_empty() {
            " No skills currently loaded.".to_owned()
        } else {
            format!(" Currently loaded: {}.", loaded.join(", "))
        };
        tools.push(ToolDefinition {
            name: UNLOAD_CONTEXT.into(),
            description: format!(
                "Unload a previously loaded skill to reclaim context space. Its loading result in the conversation is replaced by a marker.{currently}"
            ),
            parameters: label_key_schema(&skills, "Skill block label", "Skill key to unload"),
        });
    }
    let searchable = labels_of(blocks, BlockKind::Search);
    if !searchable.is_empty() {
        tools.push(ToolDefinition {
            name: SEARCH_CONTEXT.into(),
            description: format!(
                "Search for information in a searchable context block. ONLY these blocks are searchable: {}. Other blocks cannot be searched.",
                quoted_list(&searchable)
            ),
            parameters: json!({"type": "object",
                "properties": {
                    "label": {"type": "string", "enum": searchable, "description": "Searchable block label"},
                    "query": {"type": "string", "description": "Search query"}},
                "required": ["label", "query"]}),
        });
    }
    if session_search {
        tools.push(ToolDefinition {
            name: SESSION_SEARCH.into(),
            description:
                "Search past conversations for relevant context. Searches across all sessions."
                    .into(),
            parameters: json!({"type": "object",
                "properties": {"query": {"type": "string", "description": "Search query"}},
                "required": ["query"]}),
        });
    }
    tools
}

fn labels_of(blocks: &[BlockView], kind: BlockKind) -> Vec<&str> {
    blocks
        .iter()
        .filter(|b| b.kind == kind)
        .map(|b| b.label.as_str())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Tool calls and their results

/// A tool call with its arguments checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    SetContext {
        label: String,
        content: String,
        mode: WriteMode,
        title: Option<String>,
        description: Option<String>,
    },
    LoadContext {
        label: String,
        key: String,
    },
    UnloadContext {
        label: String,
        key: String,
    },
    SearchContext {
        label: String,
        query: String,
    },
    SessionSearch {
        query: String,
    },
}

fn string_arg(args: &Value, name: &str) -> Result<String, String> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(format!("missing argument `{name}`")),
        Some(_) => Err(format!("argument `{name}` must be a string")),
    }
}

fn optional_string_arg(args: &Value, name: &str) -> Result<Option<String>, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("argument `{name}` must be a string")),
    }
}

impl ToolCall {
    /// Checks a call's arguments (a JSON object, or a JSON text of one as OpenAI sends them).
    /// The error is the message after `Error: `.
    pub fn parse(name: &str, arguments: &Value) -> Result<Self, String> {
        let parsed;
        let args = match arguments {
            Value::String(text) => {
                parsed = serde_json::from_str::<Value>(text)
                    .map_err(|e| format!("arguments are not JSON: {e}"))?;
                &parsed
            }
            other => other,
        };
        if !args.is_object() {
            return Err("arguments must be a JSON object".into());
        }
        Ok(match name {
            SET_CONTEXT => {
                let mode = match optional_string_arg(args, "action")?.as_deref() {
                    None | Some("replace") => WriteMode::Replace,
                    Some("append") => WriteMode::Append,
                    Some(other) => {
                        return Err(format!(
                            "action must be \"replace\" or \"append\", not \"{other}\""
                        ));
                    }
                };
                let metadata = args.get("metadata").filter(|m| !m.is_null());
                let (title, description) = match metadata {
                    None => (None, None),
                    Some(m) if m.is_object() => (
                        optional_string_arg(m, "title")?,
                        optional_string_arg(m, "description")?,
                    ),
                    Some(_) => return Err("argument `metadata` must be an object".into()),
                };
                Self::SetContext {
                    label: string_arg(args, "label")?,
                    content: string_arg(args, "content")?,
                    mode,
                    title,
                    description,
                }
            }
            LOAD_CONTEXT => Self::LoadContext {
                label: string_arg(args, "label")?,
                key: string_arg(args, "key")?,
            },
            UNLOAD_CONTEXT => Self::UnloadContext {
                label: string_arg(args, "label")?,
                key: string_arg(args, "key")?,
            },
            SEARCH_CONTEXT => Self::SearchContext {
                label: string_arg(args, "label")?,
                query: string_arg(args, "query")?,
            },
            SESSION_SEARCH => Self::SessionSearch {
                query: string_arg(args, "query")?,
            },
            other => return Err(format!("unknown tool \"{other}\"")),
        })
    }
}

/// The result strings of the tools, as the reference words them.
pub mod results {
    use super::BlockView;

    pub const NO_RESULTS: &str = "No results found.";

    pub fn error(message: impl std::fmt::Display) -> String {
        format!("Error: {message}")
    }

    pub fn written(block: &BlockView) -> String {
        match block.max_tokens.filter(|max| *max > 0) {
            Some(max) => {
                let pct = (block.tokens as f64 / max as f64 * 100.0).round();
                format!(
                    "Written to {}. Usage: {pct}% ({}/{max} tokens)",
                    block.label, block.tokens
                )
            }
            None => format!("Written to {}. Usage: {} tokens", block.label, block.tokens),
        }
    }

    pub fn indexed(key: &str, label: &str) -> String {
        format!("Indexed \"{key}\" in {label}.")
    }

    pub fn block_not_found(label: &str) -> String {
        error(format!("block \"{label}\" not found"))
    }

    pub fn not_found(key: &str) -> String {
        format!("Not found: {key}")
    }

    pub fn not_skill(label: &str, skills: &[&str]) -> String {
        error(format!(
            "\"{label}\" is not a skill block. Skill blocks: {}",
            skills.join(", ")
        ))
    }

    pub fn not_searchable(label: &str, searchable: &[&str]) -> String {
        error(format!(
            "\"{label}\" is not searchable. Searchable blocks: {}",
            searchable.join(", ")
        ))
    }

    pub fn unloaded(key: &str, label: &str) -> String {
        format!("Unloaded \"{key}\" from {label}. Context reclaimed.")
    }

    pub fn not_loaded(key: &str, label: &str) -> String {
        format!("Skill \"{key}\" is not currently loaded in \"{label}\".")
    }

    /// `session_search` hits as `[role] content`, separated by `\n---\n`.
    pub fn session_hits<'a>(hits: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
        let lines: Vec<String> = hits
            .into_iter()
            .map(|(role, content)| format!("[{role}] {content}"))
            .collect();
        if lines.is_empty() {
            NO_RESULTS.into()
        } else {
            lines.join("\n---\n")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loaded skills

/// How a loaded skill is named in tool descriptions and state: `label:key`.
pub fn skill_id(label: &str, key: &str) -> String {
    format!("{label}:{key}")
}

/// The output a loading result is rewritten to when its skill is unloaded.
pub fn unloaded_marker(key: &str) -> String {
    format!("{UNLOADED_PREFIX} {key}]")
}

fn is_unloaded(output: Option<&Value>) -> bool {
    output
        .and_then(Value::as_str)
        .is_some_and(|o| o.starts_with(UNLOADED_PREFIX))
}

fn label_and_key(input: &Value) -> Option<(&str, &str)> {
    Some((input.get("label")?.as_str()?, input.get("key")?.as_str()?))
}

fn tool_part_name(part: &Value) -> Option<&str> {
    let kind = part.get("type")?.as_str()?;
    if kind == "dynamic-tool" {
        part.get("toolName")?.as_str()
    } else {
        kind.strip_prefix("tool-")
    }
}

/// Loading and unloading results, in the message shapes a conversation stores them:
/// `parts` tool parts (`tool-load_context` or `dynamic-tool`, state `output-available`) and
/// chat-completions `tool_calls` answered by `tool` messages.
#[derive(Debug, Default, Clone)]
pub struct SkillTracker {
    loaded: BTreeSet<String>,
    /// Chat-completions calls awaiting their `tool` message: call id → (tool, label:key).
    pending: HashMap<String, (String, String)>,
}

impl SkillTracker {
    /// Takes in one message of the history, oldest first.
    pub fn observe(&mut self, message: &Value) {
        if let Some(parts) = message.get("parts").and_then(Value::as_array) {
            for part in parts {
                let Some(tool) = tool_part_name(part) else {
                    continue;
                };
                if part.get("state").and_then(Value::as_str) != Some("output-available") {
                    continue;
                }
                let Some((label, key)) = part.get("input").and_then(label_and_key) else {
                    continue;
                };
                self.record(tool, skill_id(label, key), part.get("output"));
            }
        }
        for call in chat_skill_calls(message) {
            self.pending.insert(
                call.id.to_owned(),
                (call.tool.to_owned(), skill_id(&call.label, &call.key)),
            );
        }
        if message.get("role").and_then(Value::as_str) == Some("tool") {
            let call = message.get("tool_call_id").and_then(Value::as_str);
            if let Some((tool, id)) = call.and_then(|c| self.pending.remove(c)) {
                self.record(&tool, id, message.get("content"));
            }
        }
    }

    fn record(&mut self, tool: &str, id: String, output: Option<&Value>) {
        match tool {
            LOAD_CONTEXT if !is_unloaded(output) => {
                self.loaded.insert(id);
            }
            UNLOAD_CONTEXT => {
                self.loaded.remove(&id);
            }
            _ => {}
        }
    }

    pub fn into_loaded(self) -> BTreeSet<String> {
        self.loaded
    }
}

/// A chat-completions `tool_calls` entry of `load_context` or `unload_context`.
struct ChatSkillCall<'a> {
    id: &'a str,
    tool: &'a str,
    label: String,
    key: String,
}

/// The message's chat-completions calls of the skill tools, in order, with their arguments
/// (a JSON text) parsed; calls without an id or a label and key are skipped.
fn chat_skill_calls(message: &Value) -> Vec<ChatSkillCall<'_>> {
    let Some(calls) = message.get("tool_calls").and_then(Value::as_array) else {
        return Vec::new();
    };
    calls
        .iter()
        .filter_map(|call| {
            let function = call.get("function")?;
            let tool = function.get("name")?.as_str()?;
            if tool != LOAD_CONTEXT && tool != UNLOAD_CONTEXT {
                return None;
            }
            let args: Value = serde_json::from_str(function.get("arguments")?.as_str()?).ok()?;
            let (label, key) = label_and_key(&args)?;
            Some(ChatSkillCall {
                id: call.get("id")?.as_str()?,
                tool,
                label: label.to_owned(),
                key: key.to_owned(),
            })
        })
        .collect()
}

/// The id of the newest chat-completions call in `message` that loaded `label`/`key` (its `tool`
/// message is what [`rewrite_loading_result`] rewrites).
pub fn loading_call<'a>(message: &'a Value, label: &str, key: &str) -> Option<&'a str> {
    chat_skill_calls(message)
        .into_iter()
        .rev()
        .find(|c| c.tool == LOAD_CONTEXT && c.label == label && c.key == key)
        .map(|c| c.id)
}

/// Rewrites the newest `output-available` `load_context` part for `label`/`key` in a `parts`
/// message to the unloaded marker; false when the message has none.
pub fn rewrite_loading_part(message: &mut Value, label: &str, key: &str) -> bool {
    let Some(parts) = message.get_mut("parts").and_then(Value::as_array_mut) else {
        return false;
    };
    for part in parts.iter_mut().rev() {
        let matches = tool_part_name(part) == Some(LOAD_CONTEXT)
            && part.get("state").and_then(Value::as_str) == Some("output-available")
            && part.get("input").and_then(label_and_key) == Some((label, key))
            && !is_unloaded(part.get("output"));
        if matches {
            part["output"] = Value::String(unloaded_marker(key));
            return true;
        }
    }
    false
}

/// Rewrites a `tool` message answering `call_id` to the unloaded marker; false otherwise.
pub fn rewrite_loading_result(message: &mut Value, call_id: &str, key: &str) -> bool {
    let answers = message.get("role").and_then(Value::as_str) == Some("tool")
        && message.get("tool_call_id").and_then(Value::as_str) == Some(call_id)
        && !is_unloaded(message.get("content"));
    if answers {
        message["content"] = Value::String(unloaded_marker(key));
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(label: &str, kind: BlockKind, content: &str, writable: bool) -> BlockView {
        BlockView::new(label.into(), kind, None, None, content.into(), writable)
    }

    #[test]
    fn keys_follow_the_reference_derivation() {
        assert_eq!(entry_key(Some("Pirate style"), "Arr"), "pirate-style");
        let untitled = entry_key(None, "No key here");
        assert!(untitled.starts_with("no-key-here-"), "{untitled}");
        assert_eq!(entry_key(Some("   "), "x"), entry_key(None, "x"));
        assert!(entry_key(None, "日本語のテキスト").starts_with("entry-"));
        assert!(entry_key(Some("日本語"), "x").starts_with("entry-"));
        let a = format!("{}{}", "a".repeat(60), "one");
        let b = format!("{}{}", "a".repeat(60), "two");
        assert_ne!(entry_key(None, &a), entry_key(None, &b));
        assert_eq!(slug("--Hello,  World!--"), "hello-world");
        // FNV-1a of the empty string is the offset basis.
        assert_eq!(stable_hash(""), base36(0x811c_9dc5));
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
    }

    #[test]
    fn fnv_runs_over_utf16_units() {
        // "a" = 0x61: (0x811c9dc5 ^ 0x61) * 0x01000193 mod 2^32 = 0xe40c292c.
        assert_eq!(stable_hash("a"), base36(0xe40c_292c));
        // An astral character is two units, not one code point.
        let mut hash: u32 = 0x811c_9dc5;
        for unit in [0xD83Du32, 0xDE00] {
            hash = (hash ^ unit).wrapping_mul(0x0100_0193);
        }
        assert_eq!(stable_hash("😀"), base36(hash));
    }

    #[test]
    fn empty_readonly_blocks_are_skipped_and_others_render() {
        let blocks = [
            view("soul", BlockKind::Readonly, "", false),
            view("notes", BlockKind::Writable, "", true),
            view("skills", BlockKind::Skill, "", true),
            view("docs", BlockKind::Search, "", false),
        ];
        let prompt = render_prompt(&blocks);
        assert!(!prompt.contains("SOUL"));
        assert!(prompt.contains("NOTES [writable]"));
        assert!(prompt.contains("SKILLS [loadable]"));
        assert!(prompt.contains("DOCS [searchable]"));
        assert!(!prompt.contains('<'));
    }

    #[test]
    fn session_blocks_take_their_template_place() {
        let def = |label: &str, content: &str| BlockDef {
            label: label.into(),
            kind: BlockKind::Writable,
            description: None,
            max_tokens: None,
            content: content.into(),
        };
        let scoped = |template, label, content| ScopedBlock {
            template,
            block: def(label, content),
        };
        let merged = merge_layers(vec![
            scoped(true, "soul", "t"),
            scoped(true, "memory", "t"),
            scoped(false, "notes", "s"),
            scoped(false, "memory", "s"),
        ]);
        let seen: Vec<(&str, &str)> = merged
            .iter()
            .map(|b| (b.label.as_str(), b.content.as_str()))
            .collect();
        assert_eq!(seen, [("soul", "t"), ("memory", "s"), ("notes", "s")]);
    }

    #[test]
    fn appends_join_with_one_line_break() {
        assert_eq!(appended("", "a"), "a");
        assert_eq!(appended("a", "b"), "a\nb");
        assert_eq!(appended("a", "\nb"), "a\nb");
    }

    #[test]
    fn tracker_follows_loads_unloads_and_markers_in_both_shapes() {
        let part = |tool: &str, key: &str, output: &str| {
            json!({"role": "assistant", "parts": [{"type": format!("tool-{tool}"), "toolCallId": "c",
                "state": "output-available", "input": {"label": "skills", "key": key}, "output": output}]})
        };
        let mut tracker = SkillTracker::default();
        tracker.observe(&part(LOAD_CONTEXT, "a", "A"));
        tracker.observe(&part(LOAD_CONTEXT, "b", "[skill unloaded: b]"));
        tracker.observe(&part(LOAD_CONTEXT, "c", "C"));
        tracker.observe(&part(UNLOAD_CONTEXT, "c", "Unloaded"));
        tracker.observe(
            &json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "load_context",
             "arguments": "{\"label\":\"skills\",\"key\":\"d\"}"}}]}),
        );
        tracker.observe(&json!({"role": "tool", "tool_call_id": "t1", "content": "D"}));
        let loaded: Vec<String> = tracker.into_loaded().into_iter().collect();
        assert_eq!(loaded, ["skills:a", "skills:d"]);
    }

    #[test]
    fn rewrites_touch_only_the_matching_load() {
        let mut message = json!({"role": "assistant", "parts": [
            {"type": "tool-load_context", "state": "output-available",
             "input": {"label": "skills", "key": "a"}, "output": "A"},
            {"type": "tool-load_context", "state": "output-available",
             "input": {"label": "skills", "key": "b"}, "output": "B"}]});
        assert!(rewrite_loading_part(&mut message, "skills", "b"));
        assert_eq!(message["parts"][0]["output"], "A");
        assert_eq!(message["parts"][1]["output"], "[skill unloaded: b]");
        assert!(!rewrite_loading_part(&mut message, "other", "a"));
    }

    #[test]
    fn tool_arguments_are_checked() {
        let call = ToolCall::parse(
            SET_CONTEXT,
            &json!({"label": "m", "content": "x", "action": "append"}),
        );
        assert!(matches!(
            call,
            Ok(ToolCall::SetContext {
                mode: WriteMode::Append,
                ..
            })
        ));
        let text = Value::String("{\"query\": \"q\"}".into());
        assert_eq!(
            ToolCall::parse(SESSION_SEARCH, &text),
            Ok(ToolCall::SessionSearch { query: "q".into() })
        );
        assert!(ToolCall::parse(SET_CONTEXT, &json!({"label": "m"})).is_err());
        assert!(ToolCall::parse(SET_CONTEXT, &json!([1])).is_err());
        assert!(ToolCall::parse("nope", &json!({})).is_err());
        assert!(ToolCall::parse(LOAD_CONTEXT, &json!({"label": 1, "key": "k"})).is_err());
    }
}

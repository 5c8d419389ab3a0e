//! Converters from stored messages to the message formats of model APIs: OpenAI Chat
//! Completions, OpenAI Responses input items, and Anthropic Messages.
//!
//! Messages arrive in either stored shape: `parts` (AI SDK UIMessage: `text`, `reasoning`,
//! `file`, `tool-<name>` / `dynamic-tool` with `state`, `tool-call`, `tool-result`,
//! `tool-invocation`) or `content` (chat-completions: string, array of content parts, or object,
//! with assistant `tool_calls` and `tool` messages carrying `tool_call_id`; Anthropic-style
//! blocks inside `content` are understood too). A message with non-empty `parts` is read from
//! them, otherwise from `content`.
//!
//! Each message is first normalised into a `Turn` of `Block`s; each target then renders the
//! turns. The rules every target keeps:
//! - no tool result is dropped, and a result is emitted after the call it answers: an assistant
//!   message holding both (the parts shape) is split into the call message, the results, and a
//!   continuation for what follows them;
//! - a tool call whose input is still streaming (`state: input-streaming`) is left out: it has
//!   no input yet and no result;
//! - media a target cannot take (Anthropic: anything but images and PDFs) becomes a short text
//!   naming it;
//! - reasoning reaches only Anthropic, and only with its signature (the API refuses unsigned
//!   thinking); OpenAI formats have no input form for foreign reasoning, so it is left out;
//! - roles other than system, user, assistant and tool (e.g. `developer` maps to system) are
//!   treated as user turns; UI-only parts (`step-start`, `source-*`, `data-*`) are skipped;
//!   a content part of an unknown type is kept as its JSON text.

use serde_json::{Map, Value, json};

/// Who speaks a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaker {
    System,
    User,
    Assistant,
}

/// Where a media payload is.
#[derive(Debug, Clone, PartialEq)]
enum MediaSource {
    Url(String),
    Base64(String),
}

/// One piece of model-facing content.
#[derive(Debug, Clone, PartialEq)]
enum Block {
    Text(String),
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    Media {
        media_type: Option<String>,
        source: MediaSource,
        filename: Option<String>,
    },
    ToolCall {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        id: String,
        output: Value,
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Turn {
    speaker: Speaker,
    blocks: Vec<Block>,
}

fn str_field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

fn owned(map: &Map<String, Value>, key: &str) -> String {
    str_field(map, key).unwrap_or_default().to_owned()
}

/// `data:<type>;base64,<payload>` as base64 media, any other text as a URL. A declared
/// `media_type` wins over the data URL's.
fn media_from_url(url: &str, media_type: Option<&str>, filename: Option<&str>) -> Block {
    let (embedded_type, source) = match url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
    {
        Some((mt, data)) => (
            Some(mt).filter(|m| !m.is_empty()),
            MediaSource::Base64(data.to_owned()),
        ),
        None => (None, MediaSource::Url(url.to_owned())),
    };
    Block::Media {
        media_type: media_type.or(embedded_type).map(str::to_owned),
        source,
        filename: filename.map(str::to_owned),
    }
}

/// Anthropic `source` objects: `{type: base64, media_type, data}` or `{type: url, url}`.
fn media_from_source(source: &Map<String, Value>) -> Option<Block> {
    match str_field(source, "type")? {
        "base64" => Some(Block::Media {
            media_type: str_field(source, "media_type").map(str::to_owned),
            source: MediaSource::Base64(owned(source, "data")),
            filename: None,
        }),
        "url" => Some(Block::Media {
            media_type: None,
            source: MediaSource::Url(owned(source, "url")),
            filename: None,
        }),
        "text" => Some(Block::Text(owned(source, "data"))),
        _ => None,
    }
}

/// Parses a chat-completions `arguments` string; text that is not JSON stays a string.
fn parse_arguments(arguments: &Value) -> Value {
    match arguments {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| arguments.clone()),
        other => other.clone(),
    }
}

/// One content-shape item (string or object) as blocks.
fn content_item_blocks(item: &Value, out: &mut Vec<Block>) {
    let Value::Object(map) = item else {
        if let Value::String(text) = item {
            out.push(Block::Text(text.clone()));
        } else if !item.is_null() {
            out.push(Block::Text(item.to_string()));
        }
        return;
    };
    let block = match str_field(map, "type").unwrap_or_default() {
        "text" | "input_text" | "output_text" => Some(Block::Text(owned(map, "text"))),
        "refusal" => Some(Block::Text(owned(map, "refusal"))),
        "image_url" | "input_image" => {
            let url = match map.get("image_url") {
                Some(Value::Object(inner)) => str_field(inner, "url"),
                Some(Value::String(url)) => Some(url.as_str()),
                _ => None,
            };
            url.map(|u| media_from_url(u, None, None).assumed_image())
        }
        "input_audio" => match map.get("input_audio") {
            Some(Value::Object(audio)) => Some(Block::Media {
                media_type: Some(format!(
                    "audio/{}",
                    str_field(audio, "format").unwrap_or("wav")
                )),
                source: MediaSource::Base64(owned(audio, "data")),
                filename: None,
            }),
            _ => None,
        },
        "file" | "input_file" => {
            let file = match map.get("file") {
                Some(Value::Object(inner)) => inner,
                _ => map,
            };
            let filename = str_field(file, "filename");
            str_field(file, "file_data")
                .or_else(|| str_field(file, "file_url"))
                .map(|data| media_from_url(data, None, filename))
        }
        "image" | "document" => match map.get("source") {
            Some(Value::Object(source)) => media_from_source(source),
            _ => None,
        },
        "thinking" => Some(Block::Reasoning {
            text: owned(map, "thinking"),
            signature: str_field(map, "signature").map(str::to_owned),
        }),
        "redacted_thinking" => None,
        "tool_use" => Some(Block::ToolCall {
            id: owned(map, "id"),
            name: owned(map, "name"),
            input: map.get("input").cloned().unwrap_or(json!({})),
        }),
        "tool_result" => Some(Block::ToolResult {
            id: owned(map, "tool_use_id"),
            output: map.get("content").cloned().unwrap_or(Value::Null),
            is_error: map.get("is_error").and_then(Value::as_bool) == Some(true),
        }),
        _ => Some(Block::Text(item.to_string())),
    };
    out.extend(block);
}

impl Block {
    /// `image_url` parts say by their name that they hold an image, whatever the URL shows.
    fn assumed_image(self) -> Self {
        match self {
            Block::Media {
                media_type,
                source,
                filename,
            } => Block::Media {
                media_type: media_type
                    .filter(|m| m.starts_with("image/"))
                    .or_else(|| Some("image/*".to_owned())),
                source,
                filename,
            },
            other => other,
        }
    }
}

fn content_blocks(content: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    match content {
        Value::Array(items) => items.iter().for_each(|i| content_item_blocks(i, &mut out)),
        Value::Object(map) if !map.contains_key("type") => {
            out.push(Block::Text(content.to_string()))
        }
        other => content_item_blocks(other, &mut out),
    }
    out
}

/// A `tool-*` / `dynamic-tool` UI part: the call, then its result once there is one.
fn tool_part_blocks(part: &Map<String, Value>, kind: &str, out: &mut Vec<Block>) {
    let id = owned(part, "toolCallId");
    let name = str_field(part, "toolName")
        .map(str::to_owned)
        .or_else(|| kind.strip_prefix("tool-").map(str::to_owned))
        .unwrap_or_default();
    let state = str_field(part, "state").unwrap_or_default();
    if state == "input-streaming" {
        return;
    }
    let input = part
        .get("input")
        .or_else(|| part.get("args"))
        .cloned()
        .unwrap_or(json!({}));
    out.push(Block::ToolCall {
        id: id.clone(),
        name,
        input,
    });
    if state == "output-error" {
        out.push(Block::ToolResult {
            id,
            output: Value::String(owned(part, "errorText")),
            is_error: true,
        });
    } else if let Some(output) = part.get("output").or_else(|| part.get("result")) {
        out.push(Block::ToolResult {
            id,
            output: output.clone(),
            is_error: false,
        });
    }
}

fn part_blocks(part: &Value, out: &mut Vec<Block>) {
    let Value::Object(part) = part else {
        return;
    };
    let kind = str_field(part, "type").unwrap_or_default();
    match kind {
        "text" => out.push(Block::Text(owned(part, "text"))),
        "reasoning" => out.push(Block::Reasoning {
            text: str_field(part, "text")
                .or_else(|| str_field(part, "reasoning"))
                .unwrap_or_default()
                .to_owned(),
            signature: part
                .get("providerMetadata")
                .and_then(|m| m.pointer("/anthropic/signature"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        }),
        "file" => {
            if let Some(url) = str_field(part, "url").or_else(|| str_field(part, "data")) {
                out.push(media_from_url(
                    url,
                    str_field(part, "mediaType"),
                    str_field(part, "filename"),
                ));
            }
        }
        "tool-call" => out.push(Block::ToolCall {
            id: owned(part, "toolCallId"),
            name: owned(part, "toolName"),
            input: part
                .get("input")
                .or_else(|| part.get("args"))
                .cloned()
                .unwrap_or(json!({})),
        }),
        "tool-result" => out.push(Block::ToolResult {
            id: owned(part, "toolCallId"),
            output: part
                .get("output")
                .or_else(|| part.get("result"))
                .cloned()
                .unwrap_or(Value::Null),
            is_error: part.get("isError").and_then(Value::as_bool) == Some(true),
        }),
        "tool-invocation" => {
            if let Some(Value::Object(invocation)) = part.get("toolInvocation") {
                let mut call = invocation.clone();
                if str_field(invocation, "state") == Some("partial-call") {
                    call.insert("state".into(), json!("input-streaming"));
                }
                tool_part_blocks(&call, kind, out);
            }
        }
        "dynamic-tool" => tool_part_blocks(part, kind, out),
        k if k.starts_with("tool-") => tool_part_blocks(part, kind, out),
        k if k == "step-start" || k.starts_with("source-") || k.starts_with("data-") => {}
        _ => {
            if let Some(text) = str_field(part, "text") {
                out.push(Block::Text(text.to_owned()));
            }
        }
    }
}

fn turn_of(message: &Value) -> Option<Turn> {
    let Value::Object(map) = message else {
        return None;
    };
    let role = str_field(map, "role").unwrap_or_default();
    let speaker = match role {
        "system" | "developer" => Speaker::System,
        "assistant" => Speaker::Assistant,
        _ => Speaker::User,
    };
    let mut blocks = Vec::new();
    match map.get("parts") {
        Some(Value::Array(parts)) if !parts.is_empty() => {
            parts.iter().for_each(|p| part_blocks(p, &mut blocks));
        }
        _ => {
            let content = map.get("content").unwrap_or(&Value::Null);
            if role == "tool" {
                blocks.push(Block::ToolResult {
                    id: owned(map, "tool_call_id"),
                    output: content.clone(),
                    is_error: false,
                });
            } else {
                blocks = content_blocks(content);
            }
            if let Some(Value::Array(calls)) = map.get("tool_calls") {
                for call in calls.iter().filter_map(Value::as_object) {
                    let function = call.get("function").and_then(Value::as_object);
                    blocks.push(Block::ToolCall {
                        id: owned(call, "id"),
                        name: function.map(|f| owned(f, "name")).unwrap_or_default(),
                        input: function
                            .and_then(|f| f.get("arguments"))
                            .map(parse_arguments)
                            .unwrap_or(json!({})),
                    });
                }
            }
        }
    }
    Some(Turn { speaker, blocks })
}

fn turns(messages: &[Value]) -> Vec<Turn> {
    messages.iter().filter_map(turn_of).collect()
}

/// A tool output as text: strings as they are, text blocks joined, anything else as JSON.
fn output_text(output: &Value) -> String {
    match output {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        Value::Array(items)
            if items.iter().all(|i| {
                i.is_string() || i.get("type").and_then(Value::as_str) == Some("text")
            }) =>
        {
            items
                .iter()
                .map(|i| {
                    i.as_str()
                        .or_else(|| i.get("text").and_then(Value::as_str))
                        .unwrap_or("")
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        other => other.to_string(),
    }
}

fn data_url(media_type: Option<&str>, data: &str) -> String {
    format!(
        "data:{};base64,{data}",
        media_type.unwrap_or("application/octet-stream")
    )
}

fn is_image(media_type: Option<&str>) -> bool {
    media_type.is_some_and(|m| m.starts_with("image/"))
}

/// Splits an assistant turn where results interrupt it: results wait until the next content
/// that is not a call, so calls of one step stay one message and every result comes after its
/// call; what follows the results continues in a new segment. Yields `(assistant blocks,
/// results)`.
fn assistant_segments(blocks: Vec<Block>) -> Vec<(Vec<Block>, Vec<Block>)> {
    let mut segments = Vec::new();
    let mut said: Vec<Block> = Vec::new();
    let mut results: Vec<Block> = Vec::new();
    for block in blocks {
        match block {
            Block::ToolResult { .. } => results.push(block),
            Block::ToolCall { .. } => said.push(block),
            other => {
                if !results.is_empty() {
                    segments.push((std::mem::take(&mut said), std::mem::take(&mut results)));
                }
                said.push(other);
            }
        }
    }
    if !said.is_empty() || !results.is_empty() {
        segments.push((said, results));
    }
    segments
}

/// OpenAI Chat Completions messages.
pub fn to_openai_chat(messages: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for turn in turns(messages) {
        match turn.speaker {
            Speaker::System => {
                let text = joined_text(&turn.blocks);
                out.push(json!({"role": "system", "content": text}));
            }
            Speaker::User => {
                let (results, rest): (Vec<Block>, Vec<Block>) = turn
                    .blocks
                    .into_iter()
                    .partition(|b| matches!(b, Block::ToolResult { .. }));
                out.extend(results.iter().filter_map(openai_tool_message));
                if let Some(content) = openai_user_content(&rest) {
                    out.push(json!({"role": "user", "content": content}));
                }
            }
            Speaker::Assistant => {
                for (said, results) in assistant_segments(turn.blocks) {
                    let text = joined_text(&said);
                    let calls: Vec<Value> = said
                        .iter()
                        .filter_map(|b| match b {
                            Block::ToolCall { id, name, input } => Some(json!({
                                "id": id,
                                "type": "function",
                                "function": {"name": name, "arguments": arguments_text(input)},
                            })),
                            _ => None,
                        })
                        .collect();
                    if !text.is_empty() || !calls.is_empty() {
                        let mut message = json!({"role": "assistant", "content": text});
                        if text.is_empty() {
                            message["content"] = Value::Null;
                        }
                        if !calls.is_empty() {
                            message["tool_calls"] = Value::Array(calls);
                        }
                        out.push(message);
                    }
                    out.extend(results.iter().filter_map(openai_tool_message));
                }
            }
        }
    }
    out
}

/// Tool input as the JSON text OpenAI formats carry.
fn arguments_text(input: &Value) -> String {
    match input {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn openai_tool_message(block: &Block) -> Option<Value> {
    match block {
        Block::ToolResult { id, output, .. } => Some(json!({
            "role": "tool",
            "tool_call_id": id,
            "content": output_text(output),
        })),
        _ => None,
    }
}

/// Texts of the blocks, joined by newlines.
fn joined_text(blocks: &[Block]) -> String {
    blocks
        .iter()
        .filter_map(|b| match b {
            Block::Text(t) if !t.is_empty() => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A plain string for text alone; content parts once media is present; `None` when empty.
fn openai_user_content(blocks: &[Block]) -> Option<Value> {
    if blocks.iter().all(|b| matches!(b, Block::Text(_))) {
        let text = joined_text(blocks);
        return (!text.is_empty()).then_some(Value::String(text));
    }
    let parts: Vec<Value> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Text(t) if !t.is_empty() => Some(json!({"type": "text", "text": t})),
            Block::Media {
                media_type,
                source,
                filename,
            } => Some(match (source, is_image(media_type.as_deref())) {
                (MediaSource::Url(url), true) => {
                    json!({"type": "image_url", "image_url": {"url": url}})
                }
                (MediaSource::Base64(data), true) => json!({
                    "type": "image_url",
                    "image_url": {"url": data_url(media_type.as_deref(), data)},
                }),
                (MediaSource::Base64(data), false)
                    if media_type.as_deref().is_some_and(|m| {
                        m == "audio/wav" || m == "audio/mp3" || m == "audio/mpeg"
                    }) =>
                {
                    let format = if media_type.as_deref() == Some("audio/wav") {
                        "wav"
                    } else {
                        "mp3"
                    };
                    json!({"type": "input_audio", "input_audio": {"data": data, "format": format}})
                }
                (MediaSource::Base64(data), false) => {
                    let mut file = json!({"file_data": data_url(media_type.as_deref(), data)});
                    if let Some(name) = filename {
                        file["filename"] = json!(name);
                    }
                    json!({"type": "file", "file": file})
                }
                (MediaSource::Url(url), false) => json!({"type": "text", "text": url}),
            }),
            _ => None,
        })
        .collect();
    (!parts.is_empty()).then_some(Value::Array(parts))
}

/// OpenAI Responses input items: messages, `function_call` and `function_call_output`.
pub fn to_openai_responses(messages: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for turn in turns(messages) {
        let role = match turn.speaker {
            Speaker::System => "system",
            Speaker::User => "user",
            Speaker::Assistant => "assistant",
        };
        let mut pending: Vec<Value> = Vec::new();
        let flush = |pending: &mut Vec<Value>, out: &mut Vec<Value>| {
            if pending.is_empty() {
                return;
            }
            let content = match pending.as_slice() {
                [only] if only["type"] == "input_text" || only["type"] == "output_text" => {
                    only["text"].clone()
                }
                _ => Value::Array(std::mem::take(pending)),
            };
            pending.clear();
            out.push(json!({"role": role, "content": content}));
        };
        for block in turn.blocks {
            match block {
                Block::Text(text) if !text.is_empty() => {
                    let kind = if role == "assistant" {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    pending.push(json!({"type": kind, "text": text}));
                }
                Block::Media {
                    media_type,
                    source,
                    filename,
                } if role == "user" => {
                    pending.push(match (source, is_image(media_type.as_deref())) {
                        (MediaSource::Url(url), true) => {
                            json!({"type": "input_image", "image_url": url})
                        }
                        (MediaSource::Base64(data), true) => json!({
                            "type": "input_image",
                            "image_url": data_url(media_type.as_deref(), &data),
                        }),
                        (MediaSource::Base64(data), false) => {
                            let mut file = json!({
                                "type": "input_file",
                                "file_data": data_url(media_type.as_deref(), &data),
                            });
                            if let Some(name) = filename {
                                file["filename"] = json!(name);
                            }
                            file
                        }
                        (MediaSource::Url(url), false) => {
                            json!({"type": "input_file", "file_url": url})
                        }
                    });
                }
                Block::ToolCall { id, name, input } => {
                    flush(&mut pending, &mut out);
                    out.push(json!({
                        "type": "function_call",
                        "call_id": id,
                        "name": name,
                        "arguments": arguments_text(&input),
                    }));
                }
                Block::ToolResult { id, output, .. } => {
                    flush(&mut pending, &mut out);
                    out.push(json!({
                        "type": "function_call_output",
                        "call_id": id,
                        "output": output_text(&output),
                    }));
                }
                _ => {}
            }
        }
        flush(&mut pending, &mut out);
    }
    out
}

/// A model API's format a path converts to, by the name reads take (`?format=`, `--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// `openai`: Chat Completions messages.
    OpenAiChat,
    /// `openai-responses`: Responses input items.
    OpenAiResponses,
    /// `anthropic`: `{system?, messages}`.
    Anthropic,
}

impl ModelFormat {
    /// The names, for messages that list them.
    pub const NAMES: &'static str = "openai, openai-responses, anthropic";

    pub fn parse(name: &str) -> Option<Self> {
        [Self::OpenAiChat, Self::OpenAiResponses, Self::Anthropic]
            .into_iter()
            .find(|format| format.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAiChat => "openai",
            Self::OpenAiResponses => "openai-responses",
            Self::Anthropic => "anthropic",
        }
    }

    /// Stored messages (JSON, oldest first) as one JSON document of this API.
    pub fn convert(self, messages: &[Value]) -> Value {
        match self {
            Self::OpenAiChat => Value::Array(to_openai_chat(messages)),
            Self::OpenAiResponses => Value::Array(to_openai_responses(messages)),
            Self::Anthropic => to_anthropic(messages).to_value(),
        }
    }
}

/// An Anthropic Messages request body's conversation: the lifted system text and alternating
/// user/assistant messages.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicMessages {
    /// System messages' text, joined by blank lines; `None` when there is none.
    pub system: Option<String>,
    pub messages: Vec<Value>,
}

impl AnthropicMessages {
    /// `{system?, messages}`.
    pub fn to_value(&self) -> Value {
        let mut value = json!({"messages": self.messages});
        if let Some(system) = &self.system {
            value["system"] = json!(system);
        }
        value
    }
}

/// Anthropic Messages: system text lifted out, `tool_use` / `tool_result` blocks, base64 or URL
/// images and documents, and consecutive same-role turns merged so roles alternate.
pub fn to_anthropic(messages: &[Value]) -> AnthropicMessages {
    let mut system = Vec::new();
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => out.push((role, blocks)),
        }
    };
    for turn in turns(messages) {
        match turn.speaker {
            Speaker::System => {
                let text = joined_text(&turn.blocks);
                if !text.is_empty() {
                    system.push(text);
                }
            }
            Speaker::User => {
                // Results answer the previous assistant turn, so they lead the user message.
                let (results, rest): (Vec<Block>, Vec<Block>) = turn
                    .blocks
                    .into_iter()
                    .partition(|b| matches!(b, Block::ToolResult { .. }));
                let mut blocks: Vec<Value> = results.iter().filter_map(anthropic_block).collect();
                blocks.extend(rest.iter().filter_map(anthropic_block));
                push("user", blocks);
            }
            Speaker::Assistant => {
                for (said, results) in assistant_segments(turn.blocks) {
                    push(
                        "assistant",
                        said.iter()
                            .filter(|b| !matches!(b, Block::Media { .. }))
                            .filter_map(anthropic_block)
                            .collect(),
                    );
                    push("user", results.iter().filter_map(anthropic_block).collect());
                }
            }
        }
    }
    AnthropicMessages {
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages: out
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect(),
    }
}

fn anthropic_block(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text(text) if text.is_empty() => return None,
        Block::Text(text) => json!({"type": "text", "text": text}),
        Block::Reasoning { text, signature } => {
            json!({"type": "thinking", "thinking": text, "signature": signature.as_ref()?})
        }
        Block::Media {
            media_type, source, ..
        } => {
            let kind = match media_type.as_deref() {
                m if is_image(m) => "image",
                Some("application/pdf") => "document",
                // The API takes images and PDFs only; anything else is named, not sent.
                other => {
                    let text = format!(
                        "[attachment of type {} omitted: not supported by this API]",
                        other.unwrap_or("unknown")
                    );
                    return Some(json!({"type": "text", "text": text}));
                }
            };
            let source = match source {
                MediaSource::Url(url) => json!({"type": "url", "url": url}),
                MediaSource::Base64(data) => json!({
                    "type": "base64",
                    "media_type": media_type.as_deref().unwrap_or("application/octet-stream"),
                    "data": data,
                }),
            };
            json!({"type": kind, "source": source})
        }
        Block::ToolCall { id, name, input } => {
            let input = match input {
                Value::Object(_) => input.clone(),
                other => json!({"input": other}),
            };
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Block::ToolResult {
            id,
            output,
            is_error,
        } => {
            let mut result = json!({
                "type": "tool_result",
                "tool_use_id": id,
                "content": output_text(output),
            });
            if *is_error {
                result["is_error"] = json!(true);
            }
            result
        }
    })
}

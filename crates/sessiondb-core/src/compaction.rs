//! Compaction planning: which span of a branch a summary replaces, the prompt that asks a model
//! for the summary, and a deterministic extractive summary for when no model is configured.
//!
//! The algorithm is the reference's: protect the first messages, keep a token budget of recent
//! messages (and at least a minimum number), move both cut points so a tool call and its result
//! are never split, and pass the previous summary (the first overlay message in the branch) for
//! an iterative update. Messages are JSON objects in either stored shape (`parts` or `content`).

use serde_json::Value;

use crate::message::JsonMap;
use crate::registry::Compaction;
use crate::tokens::TokenCounter;
use crate::{COMPACTION_PREFIX, overlay, search};

/// Where the compacted span may start and how much recent history stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactOptions {
    /// The first messages of the branch, never compacted.
    pub protect_head: usize,
    /// Tokens of recent messages kept as they are...
    pub keep_recent_tokens: u64,
    /// ...and at least this many recent messages.
    pub min_tail_messages: usize,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            protect_head: 3,
            keep_recent_tokens: 20_000,
            min_tail_messages: 2,
        }
    }
}

/// What to summarise.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan<'a> {
    /// The messages the summary replaces (overlay messages left out), oldest first.
    pub middle: Vec<&'a Value>,
    pub from_message_id: String,
    pub to_message_id: String,
    /// The text of the branch's first overlay message, for an iterative update.
    pub previous_summary: Option<String>,
    /// About 20% of the middle's tokens, at least 100.
    pub budget_tokens: u64,
}

fn object(message: &Value) -> Option<&JsonMap> {
    message.as_object()
}

fn id_of(message: &Value) -> &str {
    message.get("id").and_then(Value::as_str).unwrap_or("")
}

fn role_of(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

fn is_overlay(message: &Value) -> bool {
    id_of(message).starts_with(COMPACTION_PREFIX)
}

fn parts(message: &Value) -> &[Value] {
    message
        .get("parts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn is_tool_part(part: &Value) -> bool {
    part.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("tool-") || t == "dynamic-tool")
}

/// Ids of the tool calls an assistant message makes: `toolCallId`s of its tool parts, or the
/// `id`s of its chat-completions `tool_calls`.
fn call_ids(message: &Value) -> Vec<&str> {
    if role_of(message) != "assistant" {
        return Vec::new();
    }
    let from_parts = parts(message)
        .iter()
        .filter(|p| is_tool_part(p))
        .filter_map(|p| p.get("toolCallId").and_then(Value::as_str));
    let from_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|c| c.get("id").and_then(Value::as_str));
    from_parts.chain(from_calls).collect()
}

/// True when the message carries a result (or a call part) for one of `ids`.
fn is_result_for(message: &Value, ids: &[&str]) -> bool {
    let in_parts = parts(message).iter().any(|p| {
        is_tool_part(p)
            && p.get("toolCallId")
                .and_then(Value::as_str)
                .is_some_and(|id| ids.contains(&id))
    });
    let tool_message = role_of(message) == "tool"
        && message
            .get("tool_call_id")
            .and_then(Value::as_str)
            .is_some_and(|id| ids.contains(&id));
    in_parts || tool_message
}

/// Moves a start index past results of the calls just before it.
fn align_forward(messages: &[Value], mut index: usize) -> usize {
    if index == 0 || index >= messages.len() {
        return index;
    }
    let calls = call_ids(&messages[index - 1]);
    if calls.is_empty() {
        return index;
    }
    while index < messages.len() && is_result_for(&messages[index], &calls) {
        index += 1;
    }
    index
}

/// Moves an end index back so the results at it stay with their call.
fn align_backward(messages: &[Value], mut index: usize) -> usize {
    while index > 0 && index < messages.len() {
        if !call_ids(&messages[index]).is_empty() {
            break;
        }
        let calls = call_ids(&messages[index - 1]);
        if !calls.is_empty() && is_result_for(&messages[index], &calls) {
            index -= 1;
        } else {
            break;
        }
    }
    index
}

fn count(counter: &dyn TokenCounter, message: &Value) -> u64 {
    object(message).map_or(0, |m| counter.count_message(m))
}

/// Where the kept tail starts: recent messages within the token budget (at least one), at least
/// `min_tail` of them, aligned so results stay with their calls.
fn tail_cut(
    messages: &[Value],
    start: usize,
    options: &CompactOptions,
    counter: &dyn TokenCounter,
) -> usize {
    let n = messages.len();
    let mut kept_tokens = 0u64;
    let mut token_cut = n;
    for i in (start..n).rev() {
        let tokens = count(counter, &messages[i]);
        if kept_tokens + tokens > options.keep_recent_tokens && token_cut < n {
            break;
        }
        kept_tokens += tokens;
        token_cut = i;
    }
    let min_cut = n.saturating_sub(options.min_tail_messages);
    let cut = if min_cut >= start {
        token_cut.min(min_cut)
    } else {
        token_cut
    };
    align_backward(messages, cut)
}

/// Plans a compaction of `messages` (a branch root first, overlays applied); `None` when there is
/// nothing to compact.
pub fn plan<'a>(
    messages: &'a [Value],
    options: &CompactOptions,
    counter: &dyn TokenCounter,
) -> Option<CompactionPlan<'a>> {
    if messages.len() <= options.protect_head + options.min_tail_messages {
        return None;
    }
    let start = align_forward(messages, options.protect_head);
    let end = tail_cut(messages, start, options, counter);
    if end <= start {
        return None;
    }
    let middle: Vec<&Value> = messages[start..end]
        .iter()
        .filter(|m| !is_overlay(m))
        .collect();
    let (first, last) = (middle.first()?, middle.last()?);
    let previous_summary = messages.iter().find(|m| is_overlay(m)).map(text_of);
    let middle_tokens: u64 = middle.iter().map(|m| count(counter, m)).sum();
    Some(CompactionPlan {
        from_message_id: id_of(first).to_owned(),
        to_message_id: id_of(last).to_owned(),
        previous_summary,
        budget_tokens: (middle_tokens / 5).max(100),
        middle,
    })
}

/// Where a new overlay on this branch starts: the `from` of the first stored compaction that is
/// visible on it (its summary is in `history_ids`, or both its ends are), so each branch keeps one
/// growing overlay; else `planned_from`.
pub fn extended_from(
    compactions: &[Compaction],
    history_ids: &[&str],
    planned_from: &str,
) -> String {
    compactions
        .iter()
        .find(|c| {
            history_ids.contains(&overlay::summary_message_id(c).as_str())
                || (history_ids.contains(&c.from_message_id.as_str())
                    && history_ids.contains(&c.to_message_id.as_str()))
        })
        .map_or_else(|| planned_from.to_owned(), |c| c.from_message_id.clone())
}

/// The text of a message (its search text), one piece per line. A tool message's string
/// content is its output, which the transcript shows in the tool's block instead.
pub fn text_of(message: &Value) -> String {
    let Some(map) = object(message) else {
        return String::new();
    };
    let mut pieces = search::text_pieces(map);
    if role_of(message) == "tool"
        && let Some(Value::String(output)) = map.get("content")
    {
        pieces.retain(|piece| !std::ptr::eq(*piece, output.as_str()));
    }
    pieces.join("\n")
}

const TOOL_FIELD_CHARS: usize = 500;

fn truncated(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// JSON text of a tool input or output; strings as they are.
fn tool_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn is_present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        _ => true,
    })
}

/// `[Tool: name]` blocks with truncated input and output, for every tool call of a message.
fn tool_blocks(message: &Value) -> Vec<String> {
    let block = |name: &str, input: Option<&Value>, output: Option<&Value>| {
        let mut lines = vec![format!("[Tool: {name}]")];
        if let Some(input) = is_present(input) {
            lines.push(format!(
                "Input: {}",
                truncated(&tool_value(input), TOOL_FIELD_CHARS)
            ));
        }
        if let Some(output) = is_present(output) {
            lines.push(format!(
                "Output: {}",
                truncated(&tool_value(output), TOOL_FIELD_CHARS)
            ));
        }
        lines.join("\n")
    };
    let mut blocks: Vec<String> = parts(message)
        .iter()
        .filter(|p| is_tool_part(p))
        .map(|p| {
            let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
            let name = p
                .get("toolName")
                .and_then(Value::as_str)
                .or_else(|| kind.strip_prefix("tool-").filter(|n| *n != "result"))
                .unwrap_or("unknown");
            let output = p
                .get("output")
                .or_else(|| p.get("result"))
                .or_else(|| p.get("errorText"));
            block(name, p.get("input").or_else(|| p.get("args")), output)
        })
        .collect();
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        blocks.push(block(name, function.and_then(|f| f.get("arguments")), None));
    }
    if role_of(message) == "tool" {
        let name = message
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        blocks.push(block(name, None, message.get("content")));
    }
    blocks
}

/// The transcript a summary prompt embeds: `[role]`, the text, then the tool blocks; messages
/// separated by `---`.
pub fn transcript(messages: &[&Value]) -> String {
    messages
        .iter()
        .map(|m| {
            let mut text = format!("[{}]\n{}", role_of(m), text_of(m));
            let tools = tool_blocks(m);
            if !tools.is_empty() {
                text.push('\n');
                text.push_str(&tools.join("\n"));
            }
            text
        })
        .collect::<Vec<_>>()
        .join("\n\n---\n\n")
}

const SECTIONS: &str = "Use this structure:
## Topic
[one line: what the conversation is about]
## Key Points
[the facts, decisions and results that matter, as bullets]
## Current State
[where the work stands now]
## Open Items
[unanswered questions and next steps]";

/// The prompt that asks a model for the summary (a first summary, or an update of `previous`).
pub fn summary_prompt(middle: &[&Value], previous: Option<&str>, budget_tokens: u64) -> String {
    let transcript = transcript(middle);
    let closing = format!(
        "Target ~{budget_tokens} tokens. Be factual: do not invent paths, commands or details \
         that are not in the conversation. Write only the summary body."
    );
    match previous {
        None => format!(
            "Create a concise summary of the conversation below that keeps everything needed \
             to continue it.\n\nCONVERSATION TO SUMMARIZE:\n{transcript}\n\n{SECTIONS}\n\n{closing}"
        ),
        Some(previous) => format!(
            "A summary of the earlier conversation exists. Update it with the new turns.\n\n\
             PREVIOUS SUMMARY:\n{previous}\n\nNEW TURNS TO INCORPORATE:\n{transcript}\n\n\
             PRESERVE what is still relevant from the previous summary, ADD the new \
             information, and remove only what is clearly obsolete.\n\n{SECTIONS}\n\n{closing}"
        ),
    }
}

/// The first sentence of a text (up to `max` characters), on one line.
fn first_sentence(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = line
        .char_indices()
        .find(|&(i, c)| matches!(c, '.' | '!' | '?') && line[i + c.len_utf8()..].starts_with(' '))
        .map_or(line.len(), |(i, c)| i + c.len_utf8());
    truncated(&line[..end], max)
}

/// The lines of one section of an earlier extractive or model summary.
fn section<'a>(summary: &'a str, heading: &str) -> Vec<&'a str> {
    summary
        .lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// A deterministic summary built from the messages themselves (no model): the topic, one line
/// per turn (tool calls named), the last turn as the current state and the last user question
/// as the open item, in the prompt's four sections, within about `budget_tokens` × 4
/// characters. A previous summary's topic is kept and its key points come before the new
/// ones; when they do not all fit, the oldest points give way.
pub fn extractive_summary(middle: &[&Value], previous: Option<&str>, budget_tokens: u64) -> String {
    let budget_chars = (budget_tokens as usize).saturating_mul(4);
    let previous_topic = previous.and_then(|p| section(p, "## Topic").first().copied());
    let topic = previous_topic.map(str::to_owned).unwrap_or_else(|| {
        middle
            .iter()
            .find(|m| role_of(m) == "user" && !text_of(m).trim().is_empty())
            .map_or_else(
                || "(no user text)".to_owned(),
                |m| first_sentence(&text_of(m), 160),
            )
    });
    let mut points: Vec<String> = previous
        .map(|p| {
            section(p, "## Key Points")
                .into_iter()
                .filter(|line| !line.starts_with("- … "))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    for m in middle {
        let text = first_sentence(&text_of(m), 160);
        let tools: Vec<String> = tool_blocks(m)
            .iter()
            .filter_map(|b| b.lines().next())
            .map(|l| {
                l.trim_start_matches("[Tool: ")
                    .trim_end_matches(']')
                    .to_owned()
            })
            .collect();
        let mut line = format!("- [{}]", role_of(m));
        if !text.is_empty() {
            line.push(' ');
            line.push_str(&text);
        }
        if !tools.is_empty() {
            line.push_str(&format!(" (tools: {})", tools.join(", ")));
        }
        if text.is_empty() && tools.is_empty() {
            continue;
        }
        points.push(line);
    }
    let state = middle
        .iter()
        .rev()
        .map(|m| first_sentence(&text_of(m), 200))
        .find(|t| !t.is_empty())
        .unwrap_or_else(|| "(nothing said yet)".to_owned());
    let open = middle
        .iter()
        .rev()
        .take_while(|m| role_of(m) != "assistant")
        .filter(|m| role_of(m) == "user")
        .map(|m| first_sentence(&text_of(m), 200))
        .find(|t| t.ends_with('?'))
        .unwrap_or_else(|| "none noted".to_owned());

    let head = format!("## Topic\n{topic}\n## Key Points\n");
    let tail = format!("## Current State\n{state}\n## Open Items\n- {open}");
    // The newest points that fit; older ones are counted, not kept.
    let mut room = budget_chars.saturating_sub(head.len() + tail.len() + 40);
    let mut kept = Vec::new();
    for point in points.iter().rev() {
        if point.len() + 1 > room {
            break;
        }
        room -= point.len() + 1;
        kept.push(point.as_str());
    }
    let omitted = points.len() - kept.len();
    let mut lines = Vec::with_capacity(kept.len() + 1);
    let note = format!("- … {omitted} earlier turns not listed");
    if omitted > 0 {
        lines.push(note.as_str());
    }
    lines.extend(kept.into_iter().rev());
    format!("{head}{}\n{tail}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::HeuristicCounter;
    use serde_json::json;

    fn text(id: &str, role: &str, body: &str) -> Value {
        json!({"id": id, "role": role, "parts": [{"type": "text", "text": body}]})
    }

    fn turns(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                text(
                    &format!("m{i}"),
                    role,
                    &format!("turn {i} about the weather"),
                )
            })
            .collect()
    }

    fn ids(plan: &CompactionPlan<'_>) -> Vec<String> {
        plan.middle.iter().map(|m| id_of(m).to_owned()).collect()
    }

    #[test]
    fn five_messages_are_too_few() {
        let tight = CompactOptions {
            keep_recent_tokens: 1,
            ..Default::default()
        };
        assert!(plan(&turns(5), &tight, &HeuristicCounter).is_none());
        assert_eq!(
            plan(&turns(6), &tight, &HeuristicCounter)
                .unwrap()
                .from_message_id,
            "m3"
        );
        // Within the default recent budget, short turns stay as they are.
        assert!(plan(&turns(6), &CompactOptions::default(), &HeuristicCounter).is_none());
    }

    /// Reference check 85: with a 1-token tail budget the span starts at m3 and never ends at
    /// the last message; the prompt has turn 3 but not turn 11.
    #[test]
    fn span_starts_after_the_head_and_keeps_the_tail() {
        let messages = turns(12);
        let options = CompactOptions {
            keep_recent_tokens: 1,
            ..Default::default()
        };
        let plan = plan(&messages, &options, &HeuristicCounter).unwrap();
        assert_eq!(plan.from_message_id, "m3");
        assert_eq!(plan.to_message_id, "m9");
        let prompt = summary_prompt(&plan.middle, None, plan.budget_tokens);
        assert!(prompt.contains("turn 3 about"));
        assert!(!prompt.contains("turn 11 about"));
        assert_eq!(plan.budget_tokens, 100);
    }

    /// Reference check 86: an overlay is never an end of the span, and its text is the previous
    /// summary.
    #[test]
    fn overlays_are_never_endpoints_and_feed_the_previous_summary() {
        let mut messages = turns(12);
        messages[3] = text("compaction_abc", "assistant", "Earlier: weather talk.");
        let options = CompactOptions {
            keep_recent_tokens: 1,
            ..Default::default()
        };
        let plan = plan(&messages, &options, &HeuristicCounter).unwrap();
        assert_eq!(plan.from_message_id, "m4");
        assert!(!ids(&plan).iter().any(|id| id.starts_with("compaction_")));
        assert_eq!(
            plan.previous_summary.as_deref(),
            Some("Earlier: weather talk.")
        );
        let prompt = summary_prompt(&plan.middle, plan.previous_summary.as_deref(), 100);
        assert!(prompt.contains("PREVIOUS SUMMARY:\nEarlier: weather talk."));
    }

    /// A call and its result are never split: the start moves past results, the end back to
    /// the call.
    #[test]
    fn cuts_never_separate_a_call_from_its_result() {
        let call = |id: &str, call_id: &str| {
            json!({"id": id, "role": "assistant", "content": null,
                   "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
        };
        let result = |id: &str, call_id: &str| json!({"id": id, "role": "tool", "tool_call_id": call_id, "content": "ok"});
        let messages = vec![
            text("u0", "user", "start"),
            text("a1", "assistant", "sure"),
            call("c2", "t2"),
            result("r3", "t2"),
            result("r4", "t2"),
            text("u5", "user", "more"),
            call("c6", "t6"),
            result("r7", "t6"),
            text("a8", "assistant", "done"),
        ];
        let options = CompactOptions {
            keep_recent_tokens: 1,
            ..Default::default()
        };
        let plan = plan(&messages, &options, &HeuristicCounter).unwrap();
        // Head of 3 ends after the call c2: its results r3, r4 are not cut from it.
        assert_eq!(plan.from_message_id, "u5");
        // The tail keeps r7 with its call c6.
        assert_eq!(ids(&plan), ["u5"]);
    }

    #[test]
    fn tool_outputs_render_as_json_in_the_prompt() {
        let message = json!({"id": "a", "role": "assistant", "parts": [
            {"type": "tool-invoice", "toolCallId": "t", "state": "output-available",
             "input": {"id": 7}, "output": {"customer": "ACME", "amount": 1200}}]});
        let rendered = transcript(&[&message]);
        assert!(rendered.contains("[Tool: invoice]"));
        assert!(rendered.contains(r#"Input: {"id":7}"#));
        assert!(rendered.contains(r#"Output: {"customer":"ACME","amount":1200}"#));
        assert!(!rendered.contains("[object Object]"));
    }

    #[test]
    fn visible_overlays_extend_from_their_start() {
        let c = |id: &str, from: &str, to: &str| Compaction {
            id: id.into(),
            summary: "s".into(),
            from_message_id: from.into(),
            to_message_id: to.into(),
            created_at: 0,
        };
        let stored = [c("x", "b1", "b2"), c("y", "m3", "m5")];
        // Summary of y on the path: extend from m3.
        assert_eq!(
            extended_from(&stored, &["m0", "compaction_y", "m6"], "m6"),
            "m3"
        );
        // Nothing visible (x lives on another branch): the planned start.
        assert_eq!(extended_from(&stored, &["m0", "m1", "m6"], "m1"), "m1");
    }

    #[test]
    fn extractive_summary_is_deterministic_sectioned_and_bounded() {
        let mut messages = turns(40);
        messages.push(text("q", "user", "Will it rain tomorrow? Thanks."));
        let middle: Vec<&Value> = messages.iter().collect();
        let summary = extractive_summary(&middle, None, 100);
        assert_eq!(summary, extractive_summary(&middle, None, 100));
        for heading in [
            "## Topic",
            "## Key Points",
            "## Current State",
            "## Open Items",
        ] {
            assert!(summary.contains(heading), "{summary}");
        }
        assert!(summary.len() <= 100 * 4 + 40, "{}", summary.len());
        assert!(summary.contains("earlier turns not listed"));
        assert!(
            summary.contains("turn 39 about"),
            "the newest points are kept"
        );
        assert!(summary.contains("- Will it rain tomorrow?"));
        // An update keeps the earlier topic and points first.
        let next = extractive_summary(&middle[..2], Some(&summary), 10_000);
        assert!(next.starts_with("## Topic\nturn 0 about the weather"));
        assert!(next.contains("- [user] turn 0 about"));
    }
}

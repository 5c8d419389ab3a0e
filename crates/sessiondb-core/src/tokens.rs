//! Token estimates. Every stored row is stamped with an estimate at write time so that aggregate
//! checks never re-read content. The default is the reference heuristic; an exact tokenizer (or
//! anything else) plugs in through [`TokenCounter`].

use serde_json::Value;

use crate::message::JsonMap;

const CHARS_PER_TOKEN: f64 = 4.0;
const WORDS_TOKEN_MULTIPLIER: f64 = 1.3;
const TOKENS_PER_MESSAGE: u64 = 4;

/// Counts the tokens of one message (the whole JSON object as the client wrote it).
///
/// Implementations must be deterministic: the count is stamped on the row and compared later.
pub trait TokenCounter: Send + Sync + std::fmt::Debug {
    fn count_message(&self, message: &JsonMap) -> u64;
}

/// The reference heuristic: `max(chars / 4, words × 1.3)` per string plus 4 per message, with
/// fixed costs for inline attachments. It under-counts tool-heavy histories; plug in an exact
/// counter where that matters.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeuristicCounter;

impl TokenCounter for HeuristicCounter {
    fn count_message(&self, message: &JsonMap) -> u64 {
        estimate_message_tokens(message)
    }
}

/// `ceil(max(utf16_len / 4, words × 1.3))`, 0 for the empty string. Lengths are UTF-16 code units
/// (as the reference measures them), words are runs of non-whitespace.
pub fn estimate_string_tokens(text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    let utf16_len: usize = text.chars().map(char::len_utf16).sum();
    let words = text.split_whitespace().count();
    let estimate = (utf16_len as f64 / CHARS_PER_TOKEN).max(words as f64 * WORDS_TOKEN_MULTIPLIER);
    estimate.ceil() as u64
}

/// Tokens of one string, by some measure.
pub type Measure<'a> = &'a dyn Fn(&str) -> u64;

/// Strings count as themselves; any other non-null value by its compact JSON text.
pub fn estimate_value_tokens(value: &Value) -> u64 {
    value_tokens(value, &estimate_string_tokens)
}

fn value_tokens(value: &Value, measure: Measure<'_>) -> u64 {
    match value {
        Value::Null => 0,
        Value::String(s) => measure(s),
        other => measure(&other.to_string()),
    }
}

fn part_tokens(part: &Value, measure: Measure<'_>) -> u64 {
    let estimate_value_tokens = |v: &Value| value_tokens(v, measure);
    let Some(part) = part.as_object() else {
        return 0;
    };
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    let field = |name: &str| part.get(name).unwrap_or(&Value::Null);
    match kind {
        "text" | "reasoning" => {
            let text = part.get("text").or_else(|| part.get("reasoning"));
            text.map_or(0, estimate_value_tokens)
        }
        k if k.starts_with("tool-") || k == "dynamic-tool" => {
            let output = part.get("output").or_else(|| part.get("result"));
            estimate_value_tokens(field("input")) + output.map_or(0, estimate_value_tokens)
        }
        _ => {
            if let Some(text) = part.get("text") {
                estimate_value_tokens(text)
            } else {
                part.get("result").map_or(0, estimate_value_tokens)
            }
        }
    }
}

/// Inline `file` parts with a `data:` URL cost a fixed amount for images and their size for
/// anything else (capped), estimated from the URL before attachments leave the row.
fn attachment_tokens(part: &Value) -> u64 {
    let Some(part) = part.as_object() else {
        return 0;
    };
    if part.get("type").and_then(Value::as_str) != Some("file") {
        return 0;
    }
    let Some(url) = part.get("url").and_then(Value::as_str) else {
        return 0;
    };
    let Some(rest) = url.strip_prefix("data:") else {
        return 0;
    };
    let media_type = part
        .get("mediaType")
        .and_then(Value::as_str)
        .unwrap_or("application/octet-stream");
    let (header, payload) = rest.split_once(',').unwrap_or((rest, ""));
    let bytes = if header.ends_with(";base64") {
        (payload.len() as u64) * 3 / 4
    } else {
        payload.len() as u64
    };
    crate::attachments::media_tokens(media_type, bytes)
}

/// Chat-completions `content`: a string, an array of strings or `{type: "text", text}` items, or
/// any other JSON (counted by its text).
fn content_tokens(content: &Value, measure: Measure<'_>) -> u64 {
    let estimate_value_tokens = |v: &Value| value_tokens(v, measure);
    match content {
        Value::Array(items) => items
            .iter()
            .map(|item| match item.get("text") {
                Some(text) if item.get("type").and_then(Value::as_str) == Some("text") => {
                    estimate_value_tokens(text)
                }
                _ => estimate_value_tokens(item),
            })
            .sum(),
        other => estimate_value_tokens(other),
    }
}

/// The stamped row estimate of one message: 4 + its parts + its `content` + inline attachments.
pub fn estimate_message_tokens(message: &JsonMap) -> u64 {
    count_message_with(message, &estimate_string_tokens)
}

/// The reference's message structure (4 per message, text and reasoning, tool inputs and
/// outputs, `content`, inline attachments at fixed costs) with strings measured by `measure`.
pub fn count_message_with(message: &JsonMap, measure: Measure<'_>) -> u64 {
    let mut total = TOKENS_PER_MESSAGE;
    if let Some(Value::Array(parts)) = message.get("parts") {
        total += parts
            .iter()
            .map(|p| part_tokens(p, measure) + attachment_tokens(p))
            .sum::<u64>();
    }
    if let Some(content) = message.get("content") {
        total += content_tokens(content, measure);
    }
    total
}

/// The output tokens a model reported for an assistant message, in its metadata's `usage`
/// (`outputTokens`, `output_tokens` or `completion_tokens`). They replace any estimate: the
/// model counted them.
pub fn reported_tokens(message: &JsonMap) -> Option<u64> {
    if message.get("role").and_then(Value::as_str) != Some("assistant") {
        return None;
    }
    let usage = message.get("metadata")?.get("usage")?;
    ["outputTokens", "output_tokens", "completion_tokens"]
        .iter()
        .find_map(|key| usage.get(key).and_then(Value::as_u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> JsonMap {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn string_estimate_takes_the_larger_of_chars_and_words() {
        assert_eq!(estimate_string_tokens(""), 0);
        // One word is at least 1.3 tokens.
        assert_eq!(estimate_string_tokens("abcd"), 2);
        assert_eq!(estimate_string_tokens(&"a".repeat(40)), 10);
        // 5 one-letter words: 9 chars / 4 = 2.25 < 5 × 1.3 = 6.5
        assert_eq!(estimate_string_tokens("a b c d e"), 7);
        // An emoji is two UTF-16 units.
        assert_eq!(estimate_string_tokens(&"😀".repeat(10)), 5);
    }

    #[test]
    fn reported_output_tokens_are_read_from_assistant_usage() {
        let reported = map(json!({"role": "assistant", "content": "hi",
            "metadata": {"usage": {"inputTokens": 900, "outputTokens": 321}}}));
        assert_eq!(reported_tokens(&reported), Some(321));
        let openai = map(json!({"role": "assistant", "content": "hi",
            "metadata": {"usage": {"completion_tokens": 12}}}));
        assert_eq!(reported_tokens(&openai), Some(12));
        let user = map(json!({"role": "user", "content": "hi",
            "metadata": {"usage": {"outputTokens": 5}}}));
        assert_eq!(reported_tokens(&user), None);
        assert_eq!(
            reported_tokens(&map(json!({"role": "assistant", "content": "x"}))),
            None
        );
    }

    #[test]
    fn message_estimate_counts_parts_tools_and_content() {
        let text = map(json!({"role": "user", "parts": [{"type": "text", "text": "abcdefgh"}]}));
        assert_eq!(estimate_message_tokens(&text), 4 + 2);
        let tool = map(json!({"role": "assistant", "parts": [
            {"type": "tool-search", "input": "abcd", "output": {"a": 1}}]}));
        assert_eq!(estimate_message_tokens(&tool), 4 + 2 + 2);
        let content = map(json!({"role": "user", "content": "abcdefgh"}));
        assert_eq!(estimate_message_tokens(&content), 4 + 2);
        let bytes = |s: &str| s.len() as u64;
        assert_eq!(count_message_with(&content, &bytes), 4 + 8);
        let image = map(json!({"role": "user", "parts": [
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}]}));
        assert_eq!(estimate_message_tokens(&image), 4 + 1600);
    }
}

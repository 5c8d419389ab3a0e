//! What a message contributes to the full-text index, and how a user's query becomes words.
//!
//! A query is never passed to a search engine as syntax: it is cut into words (runs of letters
//! and digits) and each backend matches those words literally. So quotes, `*`, `NEAR`, `-`, `:`,
//! parentheses or NUL bytes can never raise a syntax error or widen a search.

use serde_json::Value;

use crate::message::JsonMap;

/// The indexed text: `text` parts (non-empty) and string `content` (or its text items), joined by
/// single spaces. Reasoning, tool payloads and files are not indexed.
pub fn search_text(message: &JsonMap) -> String {
    text_pieces(message).join(" ")
}

/// The non-empty texts of a message, in order: its `text` parts, then its string `content` or
/// the strings and `text` items of its `content` array.
pub fn text_pieces(message: &JsonMap) -> Vec<&str> {
    let mut pieces: Vec<&str> = Vec::new();
    if let Some(Value::Array(parts)) = message.get("parts") {
        for part in parts {
            if part.get("type").and_then(Value::as_str) == Some("text")
                && let Some(text) = part.get("text").and_then(Value::as_str)
                && !text.is_empty()
            {
                pieces.push(text);
            }
        }
    }
    match message.get("content") {
        Some(Value::String(text)) if !text.is_empty() => pieces.push(text),
        Some(Value::Array(items)) => {
            for item in items {
                let text = match item {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                        o.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                };
                if let Some(text) = text.filter(|t| !t.is_empty()) {
                    pieces.push(text);
                }
            }
        }
        _ => {}
    }
    pieces
}

/// Longest word kept from a query, in characters; longer runs are cut (a word of that length
/// matches nothing real, and it keeps index look-ups bounded).
const MAX_WORD_CHARS: usize = 128;
/// Most words kept from one query.
const MAX_QUERY_WORDS: usize = 32;

/// The words of a user query: maximal runs of alphanumeric characters, in order, deduplicated.
/// An empty result means "matches nothing".
pub fn query_words(query: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let word: String = word.chars().take(MAX_WORD_CHARS).collect();
        if !words.contains(&word) {
            words.push(word);
        }
        if words.len() == MAX_QUERY_WORDS {
            break;
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn indexes_text_parts_and_string_content_only() {
        let m = json!({"role": "user", "parts": [
            {"type": "text", "text": "quick brown"},
            {"type": "reasoning", "text": "hidden"},
            {"type": "text", "text": ""},
            {"type": "tool-x", "input": "no"}],
            "content": [{"type": "text", "text": "fox"}, "jumps", {"type": "image_url"}]});
        assert_eq!(search_text(m.as_object().unwrap()), "quick brown fox jumps");
    }

    #[test]
    fn query_syntax_becomes_plain_words() {
        assert_eq!(
            query_words("\"a\" NEAR(b* -c:d)"),
            ["a", "NEAR", "b", "c", "d"]
        );
        assert!(query_words("\0 ** () \"").is_empty());
        assert!(query_words("").is_empty());
        assert_eq!(query_words("café café"), ["café"]);
    }
}

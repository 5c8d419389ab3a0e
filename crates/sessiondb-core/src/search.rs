//! What a message contributes to the full-text index, and how a user's query becomes words.
//!
//! A query is never passed to a search engine as syntax: it is cut into words (runs of letters
//! and digits) and each backend matches those words literally. So quotes, `*`, `NEAR`, `-`, `:`,
//! parentheses or NUL bytes can never raise a syntax error or widen a search.

use serde::Deserialize;
use serde_json::Value;

use crate::message::JsonMap;

/// The indexed text: `text` parts (non-empty) and string `content` (or its text items), joined by
/// single spaces. Reasoning, tool payloads and files are not indexed.
pub fn search_text(message: &JsonMap) -> String {
    let text = text_pieces(message).join(" ");
    // A NUL separates words as a space does, and PostgreSQL's `text` cannot hold it.
    if text.contains('\0') {
        return text.replace('\0', " ");
    }
    text
}

/// [`search_text`] of a message's JSON text. Only `parts` and `content` are decoded (the rest
/// of the message is skipped), which is most of the cost of building the index over stored
/// messages; a repeated key, which the short reading refuses, is read the full way.
pub fn search_text_of_json(json: &str) -> Result<String, serde_json::Error> {
    let fields = match serde_json::from_str::<Indexed>(json) {
        Ok(indexed) => indexed.into_fields(),
        Err(_) => serde_json::from_str(json)?,
    };
    Ok(search_text(&fields))
}

/// The fields of a message [`search_text`] reads.
#[derive(Deserialize)]
struct Indexed {
    parts: Option<Value>,
    content: Option<Value>,
}

impl Indexed {
    fn into_fields(self) -> JsonMap {
        [("parts", self.parts), ("content", self.content)]
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_owned(), value?)))
            .collect()
    }
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

/// The words of a user query (maximal runs of letters and digits), in order, deduplicated. An
/// empty result means "matches nothing".
pub fn query_words(query: &str) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for (start, end) in words(query) {
        let word: String = query[start..end].chars().take(MAX_WORD_CHARS).collect();
        if !kept.contains(&word) {
            kept.push(word);
        }
        if kept.len() == MAX_QUERY_WORDS {
            break;
        }
    }
    kept
}

/// The byte ranges of `text`'s words: maximal runs of letters and digits (what a query is cut
/// into, and what a snippet counts and marks).
pub(crate) fn words(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    // Whether the character at byte `at` is a letter or digit, and where the next one starts
    // (ASCII without decoding, which is most text).
    let at_word = |at: usize| match text.as_bytes()[at] {
        byte if byte.is_ascii() => (byte.is_ascii_alphanumeric(), at + 1),
        _ => text[at..].chars().next().map_or((false, text.len()), |c| {
            (c.is_alphanumeric(), at + c.len_utf8())
        }),
    };
    let mut at = 0;
    std::iter::from_fn(move || {
        let start = loop {
            if at == text.len() {
                return None;
            }
            let (in_word, next) = at_word(at);
            if in_word {
                break at;
            }
            at = next;
        };
        while at < text.len() {
            let (in_word, next) = at_word(at);
            if !in_word {
                break;
            }
            at = next;
        }
        Some((start, at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
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

    /// Message JSON of many shapes, including the ones the fast reading hands to the full one.
    fn message_json() -> impl Strategy<Value = String> {
        let text = prop_oneof![
            Just(json!("")),
            Just(json!("plain words")),
            Just(json!("esc\"aped \n line é")),
            Just(json!(7)),
            Just(json!(null)),
        ];
        let kind = prop_oneof![
            Just(json!("text")),
            Just(json!("reasoning")),
            Just(json!(3)),
        ];
        let part = (kind, text.clone(), any::<bool>()).prop_map(|(kind, text, extra)| {
            let mut part = json!({"type": kind, "text": text});
            if extra {
                part["input"] = json!({"nested": ["x", 1]});
            }
            part
        });
        let item = prop_oneof![
            text.clone(),
            part.clone(),
            Just(json!({"type": "image_url", "image_url": {"url": "u"}})),
        ];
        let content = prop_oneof![
            text,
            prop::collection::vec(item, 0..4).prop_map(Value::from),
            Just(json!({"type": "text", "text": "object content"})),
        ];
        let parts = prop_oneof![
            prop::collection::vec(part, 0..4).prop_map(Value::from),
            Just(json!("not a list")),
            Just(json!([1, "x"])),
        ];
        (
            proptest::option::of(parts),
            proptest::option::of(content),
            any::<bool>(),
        )
            .prop_map(|(parts, content, duplicate)| {
                let mut m = json!({"id": "m", "role": "user", "metadata": {"parts": "no"}});
                if let Some(parts) = parts {
                    m["parts"] = parts;
                }
                if let Some(content) = content {
                    m["content"] = content;
                }
                let json = m.to_string();
                if duplicate {
                    // A repeated key: the last one counts, as in the full parse.
                    format!(r#"{}, "content": "again"}}"#, &json[..json.len() - 1])
                } else {
                    json
                }
            })
    }

    proptest! {
        #[test]
        fn the_fast_reading_of_stored_json_indexes_what_the_full_one_does(json in message_json()) {
            let fields: JsonMap = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(search_text_of_json(&json).unwrap(), search_text(&fields));
        }
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

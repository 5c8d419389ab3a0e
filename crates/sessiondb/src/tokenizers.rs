//! Token counters a session chooses with its `tokenizer` setting: the reference heuristic, or
//! exact o200k / cl100k counts (feature `tiktoken`). Model-reported output tokens on assistant
//! messages take precedence over either (see `sessiondb_core::tokens::reported_tokens`).

use std::sync::Arc;

use serde_json::Value;
use sessiondb_core::message::JsonMap;
use sessiondb_core::tokens::{HeuristicCounter, TokenCounter};
use sessiondb_core::{ValidationError, ValidationErrorKind};

/// An OpenAI BPE vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GPT-4o and later.
    O200k,
    /// GPT-4 and GPT-3.5.
    Cl100k,
}

/// Exact counts with an OpenAI vocabulary, over the same message structure as the heuristic.
/// The vocabulary is built once per process, on first use (about 0.3 s for o200k).
#[cfg(feature = "tiktoken")]
#[derive(Debug, Clone, Copy)]
pub struct TiktokenCounter {
    pub encoding: Encoding,
}

#[cfg(feature = "tiktoken")]
impl TokenCounter for TiktokenCounter {
    fn count_message(&self, message: &JsonMap) -> u64 {
        let bpe = match self.encoding {
            Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        };
        sessiondb_core::tokens::count_message_with(message, &|text| {
            bpe.encode_ordinary(text).len() as u64
        })
    }
}

/// The counter a session's `tokenizer` setting names; `None` when it names none (the store's
/// default counter applies).
pub(crate) fn chosen(settings: &JsonMap) -> Result<Option<Arc<dyn TokenCounter>>, ValidationError> {
    let encoding = match settings.get("tokenizer").and_then(Value::as_str) {
        None => return Ok(None),
        Some("heuristic") => return Ok(Some(Arc::new(HeuristicCounter))),
        Some("o200k") => Encoding::O200k,
        Some("cl100k") => Encoding::Cl100k,
        Some(_) => {
            return Err(ValidationError::new(
                "settings.tokenizer",
                ValidationErrorKind::WrongType {
                    expected: "one of heuristic, o200k, cl100k",
                },
            ));
        }
    };
    exact(encoding)
}

#[cfg(feature = "tiktoken")]
fn exact(encoding: Encoding) -> Result<Option<Arc<dyn TokenCounter>>, ValidationError> {
    Ok(Some(Arc::new(TiktokenCounter { encoding })))
}

#[cfg(not(feature = "tiktoken"))]
fn exact(_: Encoding) -> Result<Option<Arc<dyn TokenCounter>>, ValidationError> {
    Err(ValidationError::new(
        "settings.tokenizer",
        ValidationErrorKind::WrongType {
            expected: "heuristic (this build has no tiktoken feature)",
        },
    ))
}

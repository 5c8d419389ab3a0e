//! What a store keeps about a session besides its messages: the registry record (name, owner,
//! metadata, usage counters), compaction overlays, and per-session JSON state.
//!
//! Patches are applied here, inside the backend's write transaction, so a metadata merge never
//! races another writer.

use serde_json::Value;

use crate::message::{JsonMap, ValidationError, ValidationErrorKind, validate_id, validate_texts};
use crate::store::SessionStats;

/// The registry fields of a session. Everything is optional: a session created by its first
/// append has an empty record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionRecord {
    pub name: Option<String>,
    pub parent_session_id: Option<String>,
    pub model: Option<String>,
    pub source: Option<String>,
    pub user_id: Option<String>,
    pub metadata: JsonMap,
    /// `{compactAfter?, keepRecentTokens?}`; see [`validate_settings`].
    pub settings: JsonMap,
    /// Why the session ended (e.g. `compaction` after a split); `None` while it is live.
    pub end_reason: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
}

/// A session as reads return it: the record, its timestamps and the O(1) path aggregates.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub id: String,
    pub record: SessionRecord,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_message_at: Option<i64>,
    pub stats: SessionStats,
}

/// Setting keys a session accepts.
pub const SETTING_KEYS: [&str; 4] = [
    "compactAfter",
    "keepRecentTokens",
    "tokenizer",
    "keepWhenIdle",
];

/// Token counters a session can choose with its `tokenizer` setting.
pub const TOKENIZERS: [&str; 3] = ["heuristic", "o200k", "cl100k"];

/// Settings are `{compactAfter?, keepRecentTokens?, tokenizer?, keepWhenIdle?}`: two
/// non-negative integers, one of [`TOKENIZERS`] and a boolean; `null` values are allowed in
/// patches (they delete the key).
pub fn validate_settings(settings: &JsonMap) -> Result<(), ValidationError> {
    for (key, value) in settings {
        let field = format!("settings.{key}");
        let expected = match key.as_str() {
            "compactAfter" | "keepRecentTokens" if !(value.is_null() || value.is_u64()) => {
                "a non-negative integer"
            }
            "tokenizer"
                if !(value.is_null()
                    || value.as_str().is_some_and(|t| TOKENIZERS.contains(&t))) =>
            {
                "one of heuristic, o200k, cl100k"
            }
            "keepWhenIdle" if !(value.is_null() || value.is_boolean()) => "true, false or null",
            k if !SETTING_KEYS.contains(&k) => {
                "one of compactAfter, keepRecentTokens, tokenizer, keepWhenIdle"
            }
            _ => continue,
        };
        return Err(ValidationError::new(
            field,
            ValidationErrorKind::WrongType { expected },
        ));
    }
    Ok(())
}

/// Whether the session's settings exempt it from idle deletion (`keepWhenIdle: true`).
pub fn keeps_when_idle(settings: &JsonMap) -> bool {
    settings.get("keepWhenIdle").and_then(Value::as_bool) == Some(true)
}

/// Usage reported by a model, added to a session's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
}

/// A change to a session's record. Given fields replace; `metadata` and `settings` merge
/// shallowly, a `null` value deleting its key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionPatch {
    pub name: Option<String>,
    pub model: Option<String>,
    pub metadata: Option<JsonMap>,
    pub settings: Option<JsonMap>,
    pub end_reason: Option<String>,
    pub usage: Option<Usage>,
    /// Records the session in this user's index.
    pub user_id: Option<String>,
}

impl SessionPatch {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(settings) = &self.settings {
            validate_settings(settings)?;
        }
        if let Some(user) = &self.user_id {
            validate_id("userId", user)?;
        }
        validate_texts([
            ("name", self.name.as_deref()),
            ("model", self.model.as_deref()),
            ("endReason", self.end_reason.as_deref()),
        ])?;
        if let Some(usage) = &self.usage
            && !(usage.cost.is_finite() && usage.cost >= 0.0)
        {
            return Err(ValidationError::new(
                "cost",
                ValidationErrorKind::WrongType {
                    expected: "a finite non-negative number",
                },
            ));
        }
        Ok(())
    }

    pub fn apply(&self, record: &mut SessionRecord) {
        if let Some(name) = &self.name {
            record.name = Some(name.clone());
        }
        if let Some(model) = &self.model {
            record.model = Some(model.clone());
        }
        if let Some(metadata) = &self.metadata {
            merge(&mut record.metadata, metadata);
        }
        if let Some(settings) = &self.settings {
            merge(&mut record.settings, settings);
        }
        if let Some(user) = &self.user_id {
            record.user_id = Some(user.clone());
        }
        if let Some(reason) = &self.end_reason {
            record.end_reason = Some(reason.clone());
        }
        if let Some(usage) = self.usage {
            record.input_tokens = add_to_counter(record.input_tokens, usage.input_tokens);
            record.output_tokens = add_to_counter(record.output_tokens, usage.output_tokens);
            // A sum past f64::MAX would be infinite, which JSON cannot carry.
            record.cost = (record.cost + usage.cost).min(f64::MAX);
        }
    }
}

/// The largest token count a session keeps: both backends store counters as signed 64-bit
/// integers, so they saturate there instead of wrapping to negative numbers.
const MAX_TOKEN_COUNTER: u64 = i64::MAX as u64;

fn add_to_counter(counter: u64, added: u64) -> u64 {
    counter.saturating_add(added).min(MAX_TOKEN_COUNTER)
}

/// Shallow merge: each key of `changes` overwrites, `null` deletes.
fn merge(target: &mut JsonMap, changes: &JsonMap) {
    for (key, value) in changes {
        if value.is_null() {
            target.remove(key);
        } else {
            target.insert(key.clone(), value.clone());
        }
    }
}

/// A stored compaction overlay: reads show `summary` in place of the path rows from
/// `from_message_id` to `to_message_id`. Rows are never deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    pub id: String,
    pub summary: String,
    pub from_message_id: String,
    pub to_message_id: String,
    pub created_at: i64,
}

/// Order of a session listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionSort {
    #[default]
    UpdatedAt,
    /// Sessions without messages sort by their creation time.
    LastMessageAt,
    CreatedAt,
}

impl SessionSort {
    pub const ALL: [SessionSort; 3] = [
        SessionSort::UpdatedAt,
        SessionSort::LastMessageAt,
        SessionSort::CreatedAt,
    ];

    /// The name of this order in the API (`GET /v1/sessions?sort=`).
    pub fn name(self) -> &'static str {
        match self {
            SessionSort::UpdatedAt => "updatedAt",
            SessionSort::LastMessageAt => "lastMessageAt",
            SessionSort::CreatedAt => "createdAt",
        }
    }

    /// The order an API name stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|sort| sort.name() == name)
    }

    /// The value a session sorts by.
    pub fn value_of(self, info: &SessionInfo) -> i64 {
        match self {
            SessionSort::UpdatedAt => info.updated_at,
            SessionSort::LastMessageAt => info.last_message_at.unwrap_or(info.created_at),
            SessionSort::CreatedAt => info.created_at,
        }
    }
}

/// A position in a session listing: sessions sort by `(value, id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionCursor {
    pub value: i64,
    pub id: String,
}

/// One page request to a backend: up to `limit` sessions of a namespace strictly past `after`
/// in the given direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionQuery {
    pub sort: SessionSort,
    pub descending: bool,
    pub after: Option<SessionCursor>,
    pub user_id: Option<String>,
    pub limit: usize,
}

/// Checks a state key: 1..=256 characters, no control characters.
pub fn validate_state_key(key: &str) -> Result<(), ValidationError> {
    validate_id("key", key)
}

/// A state value as stored: compact JSON text. Parsed JSON never holds NaN or infinities, so
/// every value that reaches here is serialisable.
pub fn state_text(value: &Value) -> String {
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> JsonMap {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn metadata_merges_shallowly_and_null_deletes() {
        let mut record = SessionRecord {
            metadata: map(json!({"a": 1, "b": {"x": 1}, "c": 3})),
            ..Default::default()
        };
        SessionPatch {
            metadata: Some(map(json!({"a": 2, "b": {"y": 2}, "c": null}))),
            usage: Some(Usage {
                input_tokens: 3,
                output_tokens: 4,
                cost: 0.5,
            }),
            ..Default::default()
        }
        .apply(&mut record);
        assert_eq!(
            Value::Object(record.metadata),
            json!({"a": 2, "b": {"y": 2}})
        );
        assert_eq!((record.input_tokens, record.output_tokens), (3, 4));
        assert_eq!(record.cost, 0.5);
    }

    #[test]
    fn settings_accept_only_known_integer_keys() {
        assert!(
            validate_settings(&map(json!({"compactAfter": 100, "keepRecentTokens": null}))).is_ok()
        );
        let err = validate_settings(&map(json!({"compactAfter": -1}))).unwrap_err();
        assert_eq!(err.field, "settings.compactAfter");
        assert!(validate_settings(&map(json!({"other": 1}))).is_err());
    }
}

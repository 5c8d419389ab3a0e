//! The message model.
//!
//! A message is a JSON object `{id?, role, parts?, content?, metadata?, …}`: `parts` in the AI SDK
//! UIMessage shape, `content` in the chat-completions shape, unknown fields kept. Writes validate
//! it ([`Message::from_value`]), sanitise it and turn it into a [`PreparedMessage`]: the compact
//! JSON body that is stored, hashed and measured once. Reads return a [`StoredMessage`] whose JSON
//! is that body with the store-owned `createdAt` (and `updatedAt`) added.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::attachments::{self, Payload, Reference};
use crate::tokens::TokenCounter;
use crate::{COMPACTION_PREFIX, MAX_ID_CHARS, search};

pub type JsonMap = serde_json::Map<String, Value>;

/// Fields the store owns; a client's values for them are dropped on write.
const STORE_OWNED_FIELDS: [&str; 2] = ["createdAt", "updatedAt"];

/// Why a message (or identifier) was refused. `field` is a JSON path such as `parts[2].type`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {kind}")]
pub struct ValidationError {
    pub field: String,
    pub kind: ValidationErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationErrorKind {
    #[error("is required")]
    Missing,
    #[error("must be {expected}")]
    WrongType { expected: &'static str },
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {max} characters")]
    TooLong { max: usize },
    #[error("must not contain control characters")]
    ControlCharacter,
    #[error("must not contain NUL characters (U+0000)")]
    NulCharacter,
    #[error("is not valid JSON: {reason}")]
    NotJson { reason: String },
    #[error("needs `parts` or `content`")]
    NoBody,
    #[error("must be from {min} to {max}")]
    OutOfRange { min: u64, max: u64 },
    /// Serialised, the value is larger than a configured limit.
    #[error("is {bytes} bytes serialised; the limit is {max}")]
    TooLarge { bytes: u64, max: u64 },
}

impl ValidationError {
    pub fn new(field: impl Into<String>, kind: ValidationErrorKind) -> Self {
        Self {
            field: field.into(),
            kind,
        }
    }
}

/// Checks an identifier (session id, message id, namespace label): 1..=256 characters, no
/// control characters. `field` names it in the error.
pub fn validate_id(field: &str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() {
        return Err(ValidationError::new(field, ValidationErrorKind::Empty));
    }
    if id.chars().count() > MAX_ID_CHARS {
        return Err(ValidationError::new(
            field,
            ValidationErrorKind::TooLong { max: MAX_ID_CHARS },
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            ValidationErrorKind::ControlCharacter,
        ));
    }
    Ok(())
}

/// The latest time a client may give (epoch milliseconds): JavaScript's last `Date`, in the year
/// 275760. Every JSON client reads such a number exactly (it is below 2^53), every date library
/// can show it, and a session's listing times stay within it.
pub const MAX_TIME_MS: i64 = 8_640_000_000_000_000;

/// Checks a time a client gives (an imported `createdAt`): `0..=MAX_TIME_MS`.
pub fn validate_time(field: &str, ms: i64) -> Result<(), ValidationError> {
    if (0..=MAX_TIME_MS).contains(&ms) {
        return Ok(());
    }
    Err(ValidationError::new(
        field,
        ValidationErrorKind::OutOfRange {
            min: 0,
            max: MAX_TIME_MS as u64,
        },
    ))
}

/// Checks free text that is stored as it is (names, summaries, context text): no NUL
/// characters, which PostgreSQL's `text` cannot hold, so that no backend takes what another
/// refuses. Message bodies are stored as JSON, where U+0000 is an escape, and may hold it.
pub fn validate_text(field: &str, text: &str) -> Result<(), ValidationError> {
    if text.contains('\0') {
        return Err(ValidationError::new(
            field,
            ValidationErrorKind::NulCharacter,
        ));
    }
    Ok(())
}

/// [`validate_text`] of each field that is given.
pub fn validate_texts<'a>(
    fields: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<(), ValidationError> {
    fields
        .into_iter()
        .filter_map(|(field, text)| Some((field, text?)))
        .try_for_each(|(field, text)| validate_text(field, text))
}

/// A validated message as a client writes it. Construct with [`Message::from_value`],
/// [`Message::parse`], or the builder ([`Message::new`] + `with_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    fields: JsonMap,
}

impl Message {
    /// A message with a role and nothing else yet; add `parts` or `content` before writing.
    pub fn new(role: impl Into<String>) -> Self {
        let mut fields = JsonMap::new();
        fields.insert("role".into(), Value::String(role.into()));
        Self { fields }
    }

    /// A `{role, parts: [{type: "text", text}]}` message.
    pub fn text(role: impl Into<String>, text: impl Into<String>) -> Self {
        Self::new(role).with_part(serde_json::json!({"type": "text", "text": text.into()}))
    }

    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.fields
            .shift_insert(0, "id".into(), Value::String(id.into()));
        self
    }

    pub fn with_part(mut self, part: Value) -> Self {
        match self.fields.get_mut("parts") {
            Some(Value::Array(parts)) => parts.push(part),
            _ => {
                self.fields.insert("parts".into(), Value::Array(vec![part]));
            }
        }
        self
    }

    pub fn with_content(mut self, content: Value) -> Self {
        self.fields.insert("content".into(), content);
        self
    }

    pub fn with_metadata(mut self, metadata: JsonMap) -> Self {
        self.fields
            .insert("metadata".into(), Value::Object(metadata));
        self
    }

    /// Parses and validates JSON text.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            ValidationError::new(
                "message",
                ValidationErrorKind::NotJson {
                    reason: e.to_string(),
                },
            )
        })?;
        Self::from_value(value)
    }

    /// Validates a JSON value: an object with an optional string `id` (1..=256 chars), a
    /// non-empty string `role`, an optional `parts` array of objects with a string `type`, an
    /// optional `content` (string, array or object), an optional `metadata` object, and at least
    /// one of `parts` / `content`. Unknown fields are kept.
    pub fn from_value(value: Value) -> Result<Self, ValidationError> {
        let Value::Object(fields) = value else {
            return Err(wrong_type("message", "an object"));
        };
        let message = Self { fields };
        message.validate()?;
        Ok(message)
    }

    fn validate(&self) -> Result<(), ValidationError> {
        match self.fields.get("id") {
            None => {}
            Some(Value::String(id)) => validate_id("id", id)?,
            Some(_) => return Err(wrong_type("id", "a string")),
        }
        match self.fields.get("role") {
            None => return Err(ValidationError::new("role", ValidationErrorKind::Missing)),
            Some(Value::String(role)) => validate_id("role", role)?,
            Some(_) => return Err(wrong_type("role", "a string")),
        }
        let has_parts = match self.fields.get("parts") {
            None => false,
            Some(Value::Array(parts)) => {
                for (i, part) in parts.iter().enumerate() {
                    let Value::Object(part) = part else {
                        return Err(wrong_type(format!("parts[{i}]"), "an object"));
                    };
                    match part.get("type") {
                        Some(Value::String(_)) => {}
                        None => {
                            return Err(ValidationError::new(
                                format!("parts[{i}].type"),
                                ValidationErrorKind::Missing,
                            ));
                        }
                        Some(_) => return Err(wrong_type(format!("parts[{i}].type"), "a string")),
                    }
                }
                true
            }
            Some(_) => return Err(wrong_type("parts", "an array")),
        };
        let has_content = match self.fields.get("content") {
            None => false,
            Some(Value::String(_) | Value::Array(_) | Value::Object(_)) => true,
            Some(_) => return Err(wrong_type("content", "a string, an array or an object")),
        };
        match self.fields.get("metadata") {
            None | Some(Value::Object(_)) => {}
            Some(_) => return Err(wrong_type("metadata", "an object")),
        }
        if !has_parts && !has_content {
            return Err(ValidationError::new("message", ValidationErrorKind::NoBody));
        }
        Ok(())
    }

    pub fn id(&self) -> Option<&str> {
        self.fields.get("id").and_then(Value::as_str)
    }

    pub fn role(&self) -> &str {
        self.fields
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    pub fn as_map(&self) -> &JsonMap {
        &self.fields
    }

    pub fn into_value(self) -> Value {
        Value::Object(self.fields)
    }

    /// True for ids of synthetic compaction overlays, which writes refuse to store.
    pub fn is_compaction_overlay(&self) -> bool {
        self.id()
            .is_some_and(|id| id.starts_with(COMPACTION_PREFIX))
    }

    /// Gives the message an id when it has none (the id goes first in the stored JSON).
    pub fn ensure_id(&mut self, generate: impl FnOnce() -> String) {
        if self.id().is_none() {
            self.fields
                .shift_insert(0, "id".into(), Value::String(generate()));
        }
    }

    /// Applies the write-side hygiene every client or server append/update gets (imports skip
    /// it): drops store-owned fields, strips OpenAI item ids and encrypted reasoning from provider
    /// metadata, drops blank reasoning parts, and for client-sourced writes removes the reserved
    /// metadata keys.
    pub fn sanitize(&mut self, source: Source, reserved_metadata_keys: &[String]) {
        self.drop_store_owned_fields();
        if let Some(Value::Array(parts)) = self.fields.get_mut("parts") {
            parts.retain_mut(|part| {
                let Value::Object(part) = part else {
                    return true;
                };
                for key in ["providerMetadata", "callProviderMetadata"] {
                    sanitize_provider_metadata(part, key);
                }
                !is_blank_reasoning(part)
            });
        }
        if source == Source::Client && !reserved_metadata_keys.is_empty() {
            let now_empty = match self.fields.get_mut("metadata") {
                Some(Value::Object(meta)) => {
                    for key in reserved_metadata_keys {
                        meta.shift_remove(key);
                    }
                    meta.is_empty()
                }
                _ => false,
            };
            if now_empty {
                self.fields.shift_remove("metadata");
            }
        }
    }

    /// Drops `createdAt` / `updatedAt`: the store stamps them.
    pub fn drop_store_owned_fields(&mut self) {
        for key in STORE_OWNED_FIELDS {
            self.fields.shift_remove(key);
        }
    }

    /// Computes everything a backend stores for this message: inline media moves out into
    /// payloads (the body keeps pointers), then the body is hashed, measured and indexed in
    /// that pointer form. The message must have an id. Pointers the message already held are
    /// charged once their sizes are known ([`PreparedMessage::charge_existing`]).
    pub fn prepare(&self, counter: &dyn TokenCounter) -> PreparedMessage {
        let id = self.id().unwrap_or_default().to_owned();
        let mut body = serde_json::to_string(&self.fields).expect("a JSON map always serialises");
        let mut media = None;
        if attachments::may_hold_media(&body) {
            let mut fields = self.fields.clone();
            let extraction = attachments::extract(&mut fields);
            if !extraction.references.is_empty() {
                body = serde_json::to_string(&fields).expect("a JSON map always serialises");
                media = Some((fields, extraction));
            }
        }
        let fields = media.as_ref().map_or(&self.fields, |(fields, _)| fields);
        let reported = crate::tokens::reported_tokens(fields);
        let mut prepared = PreparedMessage {
            fresh_id: false,
            content_hash: ContentHash::of(body.as_bytes()),
            token_estimate: reported.unwrap_or_else(|| counter.count_message(fields)),
            tokens_reported: reported.is_some(),
            search_text: search::search_text(fields),
            role: self.role().to_owned(),
            id,
            body,
            payloads: Vec::new(),
            references: Vec::new(),
            attachment_bytes: 0,
        };
        if let Some((_, extraction)) = media {
            for payload in &extraction.payloads {
                prepared.charge(&payload.media_type, payload.bytes.len() as u64);
            }
            prepared.payloads = extraction.payloads;
            prepared.references = extraction.references;
        }
        prepared
    }
}

fn wrong_type(field: impl Into<String>, expected: &'static str) -> ValidationError {
    ValidationError::new(field, ValidationErrorKind::WrongType { expected })
}

fn sanitize_provider_metadata(part: &mut JsonMap, key: &str) {
    let Some(Value::Object(meta)) = part.get_mut(key) else {
        return;
    };
    let openai_empty = match meta.get_mut("openai") {
        Some(Value::Object(openai)) => {
            openai.shift_remove("itemId");
            openai.shift_remove("reasoningEncryptedContent");
            openai.is_empty()
        }
        _ => false,
    };
    if openai_empty {
        meta.shift_remove("openai");
    }
    if meta.is_empty() {
        part.shift_remove(key);
    }
}

fn is_blank_reasoning(part: &JsonMap) -> bool {
    if part.get("type").and_then(Value::as_str) != Some("reasoning") {
        return false;
    }
    let blank_text = match part.get("text") {
        Some(Value::String(text)) => text.trim().is_empty(),
        _ => true,
    };
    let has_provider_metadata =
        matches!(part.get("providerMetadata"), Some(Value::Object(m)) if !m.is_empty());
    blank_text && !has_provider_metadata
}

/// Who wrote a message. Reserved metadata keys are stripped only from client writes, so a server
/// can keep keys (billing, moderation flags) that clients must not forge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    #[default]
    Server,
    Client,
}

/// SHA-256 of a message's stored body. Equal hashes mean an update would change nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    pub fn to_hex(&self) -> String {
        use fmt::Write;
        self.0.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", self.to_hex())
    }
}

/// A message ready to store: the compact JSON body (without store-owned timestamps) and what is
/// derived from it once, before any transaction starts.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedMessage {
    pub id: String,
    /// The id was generated for this write: no stored message has it and none names it as its
    /// parent, so a backend need not look.
    pub fresh_id: bool,
    pub role: String,
    /// Compact JSON with media replaced by pointers.
    pub body: String,
    pub content_hash: ContentHash,
    pub token_estimate: u64,
    /// The estimate is the model's own count; media charges leave it alone.
    pub tokens_reported: bool,
    pub search_text: String,
    /// Media taken out of this message, to store (once per hash and namespace) with it.
    pub payloads: Vec<Payload>,
    /// Every pointer the body holds: the message's attachment references.
    pub references: Vec<Reference>,
    /// The base64 size of the referenced media whose size is known.
    pub attachment_bytes: u64,
}

impl PreparedMessage {
    /// Bytes this message is charged in budgets and totals: its body plus its media at base64
    /// size (what a read returns).
    pub fn bytes(&self) -> u64 {
        self.body.len() as u64 + self.attachment_bytes
    }

    fn charge(&mut self, media_type: &str, bytes: u64) {
        self.attachment_bytes += attachments::base64_len(bytes);
        if !self.tokens_reported {
            self.token_estimate += attachments::media_tokens(media_type, bytes);
        }
    }

    /// References to media stored earlier (a message written back in pointer form), which
    /// extraction could not size.
    pub fn unmeasured_references(&self) -> Vec<&Reference> {
        self.references
            .iter()
            .filter(|r| !self.payloads.iter().any(|p| p.hash == r.hash))
            .collect()
    }

    /// Charges earlier-stored media by its decoded size (`(hash, bytes)` as the store holds
    /// them); pointers the store does not hold cost nothing.
    pub fn charge_existing(&mut self, sizes: &[(String, u64)]) {
        let charges: Vec<(String, u64)> = self
            .unmeasured_references()
            .into_iter()
            .filter_map(|r| {
                let (_, bytes) = sizes.iter().find(|(hash, _)| *hash == r.hash)?;
                Some((r.media_type.clone(), *bytes))
            })
            .collect();
        for (media_type, bytes) in charges {
            self.charge(&media_type, bytes);
        }
    }

    /// The read form of this message at a position in a session.
    pub fn stored(
        &self,
        seq: i64,
        parent_id: Option<MessageId>,
        created_at: i64,
        updated_at: Option<i64>,
    ) -> StoredMessage {
        let row = StoredRow {
            id: MessageId::from(&self.id),
            role: role_of(&self.role),
            parent_id,
            seq,
            created_at,
            updated_at,
            token_estimate: self.token_estimate,
        };
        let json = with_timestamps(&self.body, row.created_at, row.updated_at);
        StoredMessage::from_stored(row, json, self.bytes())
    }
}

/// A stored message's id. Shared text: copies of a message (a cached row and every read it
/// answers) share one allocation. Reads as a `&str` (it derefs to one) and compares with strings.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(Arc<str>);

impl MessageId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for MessageId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for MessageId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> Self {
        Self(id.into())
    }
}

impl From<String> for MessageId {
    fn from(id: String) -> Self {
        Self(id.into())
    }
}

impl From<&String> for MessageId {
    fn from(id: &String) -> Self {
        Self(id.as_str().into())
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> Self {
        id.0.to_string()
    }
}

impl PartialEq<str> for MessageId {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for MessageId {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for MessageId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<MessageId> for str {
    fn eq(&self, other: &MessageId) -> bool {
        *self == *other.0
    }
}

impl PartialEq<MessageId> for &str {
    fn eq(&self, other: &MessageId) -> bool {
        **self == *other.0
    }
}

impl PartialEq<MessageId> for String {
    fn eq(&self, other: &MessageId) -> bool {
        **self == *other.0
    }
}

/// Serialises as the plain string.
impl serde::Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// A message's JSON text.
#[derive(Clone)]
enum Text {
    /// A row as stored: copies of a message (a cached row and the reads it answers) hold one text.
    Shared(Arc<str>),
    /// A read's own rewrite (media put back): megabytes not worth copying into a shared buffer.
    Owned(String),
}

impl Text {
    fn as_str(&self) -> &str {
        match self {
            Text::Shared(text) => text,
            Text::Owned(text) => text,
        }
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A message as reads return it: a shared handle, so a copy (a cached row and every read it
/// answers) costs one reference count, not one per text it holds. Its fields read through
/// [`StoredFields`].
#[derive(Debug, Clone)]
pub struct StoredMessage(Arc<StoredFields>);

/// The fields of a [`StoredMessage`].
#[derive(Debug, Clone)]
pub struct StoredFields {
    pub id: MessageId,
    /// Common roles are shared static strings: a long read allocates nothing for them.
    pub role: Role,
    pub parent_id: Option<MessageId>,
    /// Insertion order within the session; strictly increasing, never reused.
    pub seq: i64,
    /// Epoch milliseconds.
    pub created_at: i64,
    pub updated_at: Option<i64>,
    pub token_estimate: u64,
    /// Bytes the message is charged: its stored body (without the store-owned timestamps)
    /// plus its referenced media at base64 size.
    pub bytes: u64,
    json: Text,
    /// Whether `json` may hold attachment pointers, decided once per text: a copy of a cached
    /// row is not scanned again on every read.
    may_hold_pointers: bool,
}

impl std::ops::Deref for StoredMessage {
    type Target = StoredFields;
    fn deref(&self) -> &StoredFields {
        &self.0
    }
}

/// Equal messages have equal fields and text (`may_hold_pointers` is derived from the text).
impl PartialEq for StoredMessage {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.role == other.role
            && self.parent_id == other.parent_id
            && self.seq == other.seq
            && self.created_at == other.created_at
            && self.updated_at == other.updated_at
            && self.token_estimate == other.token_estimate
            && self.bytes == other.bytes
            && self.json == other.json
    }
}

impl Eq for StoredMessage {}

/// A message role: the common ones are static, others owned.
pub type Role = std::borrow::Cow<'static, str>;

/// The role for `text`, without allocating for `user`, `assistant`, `system` and `tool`.
pub fn role_of(text: &str) -> Role {
    match text {
        "user" => Role::Borrowed("user"),
        "assistant" => Role::Borrowed("assistant"),
        "system" => Role::Borrowed("system"),
        "tool" => Role::Borrowed("tool"),
        other => Role::Owned(other.to_owned()),
    }
}

/// Row fields of a stored message, as a backend reads them.
#[derive(Debug, Clone)]
pub struct StoredRow {
    pub id: MessageId,
    pub role: Role,
    pub parent_id: Option<MessageId>,
    pub seq: i64,
    pub created_at: i64,
    pub updated_at: Option<i64>,
    pub token_estimate: u64,
}

impl StoredMessage {
    /// Builds the read form from a row and its body (the stored text is this form's JSON).
    pub fn from_row(row: StoredRow, body: &str) -> Self {
        let json = with_timestamps(body, row.created_at, row.updated_at);
        Self::from_stored(row, json, body.len() as u64)
    }

    /// A row as stored: `json` already carries the timestamps (backends store exactly what
    /// [`StoredMessage::json`] returns, so a read copies nothing more); `bytes` is the body size.
    pub fn from_stored(row: StoredRow, json: impl Into<Arc<str>>, bytes: u64) -> Self {
        let json: Arc<str> = json.into();
        Self(Arc::new(StoredFields {
            may_hold_pointers: attachments::may_hold_pointers(&json),
            json: Text::Shared(json),
            bytes,
            id: row.id,
            role: row.role,
            parent_id: row.parent_id,
            seq: row.seq,
            created_at: row.created_at,
            updated_at: row.updated_at,
            token_estimate: row.token_estimate,
        }))
    }

    /// Replaces the JSON text (e.g. media put back in place of pointers); `bytes` stays the
    /// stored charge. The new text, which may be megabytes of media, is not scanned: the
    /// message counts as one that may hold pointers.
    pub fn set_json(&mut self, json: String) {
        let fields = Arc::make_mut(&mut self.0);
        fields.may_hold_pointers = true;
        fields.json = Text::Owned(json);
    }

    /// False when the JSON text holds no attachment pointer (true may be a false alarm).
    pub fn may_hold_pointers(&self) -> bool {
        self.may_hold_pointers
    }

    /// The message as compact JSON text, `createdAt` (and `updatedAt`) included.
    pub fn json(&self) -> &str {
        self.json.as_str()
    }

    pub fn into_json(self) -> String {
        match Arc::unwrap_or_clone(self.0).json {
            Text::Shared(text) => text.to_string(),
            Text::Owned(text) => text,
        }
    }

    /// The message as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.json()).expect("stored JSON is valid by construction")
    }

    /// The body as stored (without the store-owned timestamps).
    pub fn body(&self) -> String {
        let mut value = self.to_value();
        if let Value::Object(map) = &mut value {
            for key in STORE_OWNED_FIELDS {
                map.shift_remove(key);
            }
        }
        value.to_string()
    }

    /// The message back as a writable [`Message`] (store-owned fields dropped).
    pub fn to_message(&self) -> Message {
        let Value::Object(fields) = self.to_value() else {
            unreachable!("stored JSON is an object by construction")
        };
        let mut message = Message { fields };
        message.drop_store_owned_fields();
        message
    }
}

/// Appends the store-owned timestamps to a body. A body is always a non-empty compact JSON
/// object (it has at least `id` and `role`), so it ends with `}` and is never `{}`.
fn with_timestamps(body: &str, created_at: i64, updated_at: Option<i64>) -> String {
    use fmt::Write;
    let open = body.strip_suffix('}').unwrap_or(body);
    let mut json = String::with_capacity(body.len() + 48);
    json.push_str(open);
    // Writing into a String cannot fail.
    let _ = write!(json, ",\"createdAt\":{created_at}");
    if let Some(updated_at) = updated_at {
        let _ = write!(json, ",\"updatedAt\":{updated_at}");
    }
    json.push('}');
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::HeuristicCounter;
    use serde_json::json;

    fn invalid(v: Value) -> ValidationError {
        Message::from_value(v).unwrap_err()
    }

    #[test]
    fn message_ids_are_shared_and_read_as_plain_strings() {
        let id = MessageId::from("m-1");
        let copy = id.clone();
        assert!(
            std::ptr::eq(id.as_str(), copy.as_str()),
            "a copy shares the text"
        );
        let owned = String::from("m-1");
        assert_eq!(id, "m-1");
        assert_eq!(*"m-1", id);
        assert_eq!(id, owned);
        assert_ne!(id, "m-2");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""m-1""#);
        assert_eq!(format!("{id} {id:?}"), r#"m-1 "m-1""#);
        assert_eq!(String::from(id), "m-1");
    }

    #[test]
    fn validation_names_the_offending_field() {
        assert_eq!(invalid(json!([])).field, "message");
        assert_eq!(invalid(json!({"parts": []})).field, "role");
        assert_eq!(invalid(json!({"role": 1, "parts": []})).field, "role");
        assert_eq!(invalid(json!({"role": "", "parts": []})).field, "role");
        assert_eq!(
            invalid(json!({"id": 5, "role": "u", "parts": []})).field,
            "id"
        );
        assert_eq!(
            invalid(json!({"id": "", "role": "u", "parts": []})).field,
            "id"
        );
        let long = "x".repeat(257);
        assert_eq!(
            invalid(json!({"id": long, "role": "u", "parts": []})).kind,
            ValidationErrorKind::TooLong { max: 256 }
        );
        assert_eq!(invalid(json!({"role": "u", "parts": {}})).field, "parts");
        assert_eq!(
            invalid(json!({"role": "u", "parts": [1]})).field,
            "parts[0]"
        );
        assert_eq!(
            invalid(json!({"role": "u", "parts": [{"type": "text"}, {"text": "x"}]})).field,
            "parts[1].type"
        );
        assert_eq!(invalid(json!({"role": "u", "content": 3})).field, "content");
        assert_eq!(
            invalid(json!({"role": "u", "content": "x", "metadata": []})).field,
            "metadata"
        );
        assert_eq!(
            invalid(json!({"role": "u"})).kind,
            ValidationErrorKind::NoBody
        );
        assert!(Message::parse("{").is_err());
    }

    #[test]
    fn sanitize_strips_provider_ids_blank_reasoning_and_reserved_keys() {
        let mut m = Message::from_value(json!({
            "id": "a", "role": "assistant", "createdAt": 5,
            "parts": [
                {"type": "text", "text": "hi", "providerMetadata": {"openai": {"itemId": "x"}}},
                {"type": "reasoning", "text": "  "},
                {"type": "reasoning", "text": "", "providerMetadata": {"anthropic": {"sig": "s"}}},
                {"type": "text", "text": "b", "callProviderMetadata": {"openai": {"itemId": "y", "keep": 1}}}
            ],
            "metadata": {"secret": 1, "ok": 2}
        }))
        .unwrap();
        m.sanitize(Source::Client, &["secret".to_owned()]);
        assert_eq!(
            m.clone().into_value(),
            json!({"id": "a", "role": "assistant", "parts": [
                {"type": "text", "text": "hi"},
                {"type": "reasoning", "text": "", "providerMetadata": {"anthropic": {"sig": "s"}}},
                {"type": "text", "text": "b", "callProviderMetadata": {"openai": {"keep": 1}}}
            ], "metadata": {"ok": 2}})
        );
        let mut server =
            Message::from_value(json!({"role": "u", "content": "x", "metadata": {"secret": 1}}))
                .unwrap();
        server.sanitize(Source::Server, &["secret".to_owned()]);
        assert_eq!(server.as_map()["metadata"], json!({"secret": 1}));
        let mut only_reserved =
            Message::from_value(json!({"role": "u", "content": "x", "metadata": {"secret": 1}}))
                .unwrap();
        only_reserved.sanitize(Source::Client, &["secret".to_owned()]);
        assert!(only_reserved.as_map().get("metadata").is_none());
    }

    fn arbitrary_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
            prop_oneof![
                Just("id"),
                Just("role"),
                Just("parts"),
                Just("content"),
                Just("type"),
                Just("text"),
                Just("metadata"),
                Just("createdAt"),
                Just("providerMetadata"),
                Just("openai"),
                Just("itemId")
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop_oneof![
                Just("id".to_owned()),
                Just("role".to_owned()),
                Just("parts".to_owned()),
                Just("content".to_owned()),
                Just("type".to_owned()),
                Just("text".to_owned()),
                Just("metadata".to_owned()),
                Just("createdAt".to_owned()),
                Just("providerMetadata".to_owned()),
                Just("openai".to_owned()),
                Just("itemId".to_owned()),
                ".{0,6}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((keys, inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Mostly valid messages with arbitrary extra JSON inside, so the accepting path is exercised.
    fn message_like_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let part = (
            prop_oneof![Just("text"), Just("reasoning"), Just("tool-x"), Just("file")],
            arbitrary_json(),
            arbitrary_json(),
        )
            .prop_map(|(kind, text, meta)| {
                serde_json::json!({"type": kind, "text": text, "providerMetadata": meta})
            });
        (
            prop_oneof![Just("user"), Just("assistant"), Just("")],
            proptest::collection::vec(part, 0..4),
            arbitrary_json(),
        )
            .prop_map(|(role, parts, extra)| {
                serde_json::json!({"role": role, "parts": parts, "metadata": {"itemId": 1, "x": extra}, "createdAt": 9})
            })
    }

    proptest::proptest! {
        /// Any JSON is either refused with a field-naming error or prepared; sanitising twice
        /// changes nothing more, and the stored form always reads back as the same message.
        #[test]
        fn any_json_is_refused_cleanly_or_round_trips(
            value in proptest::prop_oneof![arbitrary_json(), message_like_json()]
        ) {
            match Message::from_value(value) {
                Err(e) => proptest::prop_assert!(!e.field.is_empty()),
                Ok(mut m) => {
                    m.ensure_id(|| "generated".into());
                    m.sanitize(Source::Client, &["itemId".to_owned()]);
                    let once = m.clone();
                    m.sanitize(Source::Client, &["itemId".to_owned()]);
                    proptest::prop_assert_eq!(&m, &once);
                    let p = m.prepare(&HeuristicCounter);
                    let stored = p.stored(1, None, 3, None);
                    proptest::prop_assert_eq!(stored.to_message().prepare(&HeuristicCounter), p);
                }
            }
        }
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let text = r#"{"id":"n","role":"user","content":"x","metadata":{"big":123456789012345678901234567890,"f":1.0,"e":1e-7,"p":0.1}}"#;
        let p = Message::parse(text).unwrap().prepare(&HeuristicCounter);
        assert_eq!(p.body, text);
    }

    #[test]
    fn stored_json_adds_timestamps_to_the_body() {
        let mut m = Message::text("user", "hi");
        m.ensure_id(|| "m1".into());
        let p = m.prepare(&HeuristicCounter);
        assert_eq!(
            p.body,
            r#"{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"}]}"#
        );
        let s = p.stored(1, None, 7, Some(9));
        assert_eq!(s.to_value()["createdAt"], 7);
        assert_eq!(s.to_value()["updatedAt"], 9);
        assert_eq!(s.body(), p.body);
        assert_eq!(
            s.to_message().prepare(&HeuristicCounter).content_hash,
            p.content_hash
        );
        assert_eq!(p.content_hash.to_hex().len(), 64);
    }
}

//! Attachments: inline media (base64 `data:` URLs, `{mediaType, data}` records) moves out of a
//! message into a content-addressed store, leaving an `attachment:sha256:<hex>` pointer in place;
//! reads put the media back.
//!
//! The rule is by type, never by size: a record is media when its payload is valid base64 and
//! its media type is not `text/*`. Text of any size stays inline (and chunks). The walk covers
//! `parts` and `content`, at most [`MAX_DEPTH`] levels deep; anything malformed is left as it is.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::message::JsonMap;

/// The prefix of a pointer; the rest is 64 lowercase hex digits.
pub const POINTER_PREFIX: &str = "attachment:sha256:";
/// Payloads are stored in chunks of this many bytes.
pub const ATTACHMENT_CHUNK_BYTES: usize = 1_572_864;
/// How deep the walk goes below `parts` / `content`.
pub const MAX_DEPTH: usize = 8;
/// Token charge of an image, whatever its size.
pub const IMAGE_TOKENS: u64 = 1_600;
/// Most tokens any other media is charged.
pub const MAX_MEDIA_TOKENS: u64 = 20_000;

/// Lenient on padding and trailing bits (as browsers' `atob` is); reads write canonical base64.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Decoded media taken out of a message.
#[derive(Clone, PartialEq, Eq)]
pub struct Payload {
    /// SHA-256 of `bytes`, lowercase hex.
    pub hash: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

impl Payload {
    /// A payload read back from its stored chunks: [`crate::StoreError::Corrupt`] unless all `size`
    /// bytes the store recorded came back.
    pub fn reassembled(
        hash: &str,
        media_type: String,
        bytes: Vec<u8>,
        size: i64,
    ) -> Result<Self, crate::StoreError> {
        if bytes.len() as i64 != size {
            return Err(crate::StoreError::Corrupt(format!(
                "attachment {hash} has {} of its {size} bytes",
                bytes.len()
            )));
        }
        Ok(Payload {
            hash: hash.to_owned(),
            media_type,
            bytes,
        })
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("hash", &self.hash)
            .field("media_type", &self.media_type)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// A pointer found in a message, with the media type its record declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub hash: String,
    pub media_type: String,
}

/// What [`extract`] took out and what the message now points to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extraction {
    /// New payloads, one per hash, in first-encounter order.
    pub payloads: Vec<Payload>,
    /// Every distinct pointer in the message (new ones and those it already held).
    pub references: Vec<Reference>,
}

/// The base64 length of `bytes` decoded bytes: what reads and budgets charge for a payload.
pub fn base64_len(bytes: u64) -> u64 {
    bytes.div_ceil(3) * 4
}

/// Tokens charged for media: a fixed amount for images, a quarter of the bytes (capped) else.
pub fn media_tokens(media_type: &str, bytes: u64) -> u64 {
    if media_type.starts_with("image/") {
        IMAGE_TOKENS
    } else {
        bytes.div_ceil(4).min(MAX_MEDIA_TOKENS)
    }
}

/// The hash of a pointer, if `value` is one.
pub fn pointer_hash(value: &str) -> Option<&str> {
    let hex = value.strip_prefix(POINTER_PREFIX)?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

fn pointer(hash: &str) -> String {
    format!("{POINTER_PREFIX}{hash}")
}

/// Decodes base64 after dropping ASCII whitespace; `None` for anything that is not base64.
fn decode(text: &str) -> Option<Vec<u8>> {
    let compact: String = text
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\x0c' | '\r' | ' '))
        .collect();
    let body = compact.trim_end_matches('=');
    if compact.len() - body.len() > 2
        || compact.len() % 4 == 1
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    {
        return None;
    }
    LENIENT.decode(compact.as_bytes()).ok()
}

/// `(media type from the header, payload)` of a base64 `data:` URL.
fn data_url(url: &str) -> Option<(&str, &str)> {
    let (header, payload) = url.strip_prefix("data:")?.split_once(',')?;
    Some((header.strip_suffix(";base64")?, payload))
}

/// Media that stays in its message: text, which is never extracted, and a type with control
/// characters, which is no media type (and PostgreSQL's `text` could not store its NUL).
fn stays_inline(media_type: &str) -> bool {
    media_type.starts_with("text/") || media_type.contains(char::is_control)
}

fn hash_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Extractor {
    out: Extraction,
}

impl Extractor {
    fn reference(&mut self, hash: &str, media_type: &str) {
        if !self.out.references.iter().any(|r| r.hash == hash) {
            self.out.references.push(Reference {
                hash: hash.to_owned(),
                media_type: media_type.to_owned(),
            });
        }
    }

    /// Stores `bytes` (once per hash) and puts a pointer in `field` of `record`.
    fn take(&mut self, record: &mut JsonMap, field: &str, media_type: String, bytes: Vec<u8>) {
        let hash = hash_hex(&bytes);
        self.reference(&hash, &media_type);
        if !self.out.payloads.iter().any(|p| p.hash == hash) {
            self.out.payloads.push(Payload {
                hash: hash.clone(),
                media_type: media_type.clone(),
                bytes,
            });
        }
        record.insert(field.to_owned(), Value::String(pointer(&hash)));
        record.insert("mediaType".to_owned(), Value::String(media_type));
    }

    fn walk(&mut self, value: &mut Value, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match value {
            Value::Array(items) => items.iter_mut().for_each(|v| self.walk(v, depth + 1)),
            Value::Object(record) => {
                let media = self.record(record);
                if !media {
                    record.values_mut().for_each(|v| self.walk(v, depth + 1));
                }
            }
            _ => {}
        }
    }

    /// Handles a record that is media (or points to media); false when it is neither.
    fn record(&mut self, record: &mut JsonMap) -> bool {
        let declared = record
            .get("mediaType")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(url) = record.get("url").and_then(Value::as_str) {
            if let Some(hash) = pointer_hash(url) {
                let media_type = declared.unwrap_or_default();
                let hash = hash.to_owned();
                self.reference(&hash, &media_type);
                return true;
            }
            let Some((header, payload)) = data_url(url) else {
                return false;
            };
            let media_type = declared.unwrap_or_else(|| match header {
                "" => "application/octet-stream".to_owned(),
                h => h.to_owned(),
            });
            if stays_inline(&media_type) {
                return false;
            }
            let Some(bytes) = decode(payload) else {
                return false;
            };
            self.take(record, "url", media_type, bytes);
            return true;
        }
        let Some(media_type) = declared.filter(|m| !stays_inline(m)) else {
            return false;
        };
        let Some(data) = record.get("data").and_then(Value::as_str) else {
            return false;
        };
        if let Some(hash) = pointer_hash(data) {
            let hash = hash.to_owned();
            self.reference(&hash, &media_type);
            return true;
        }
        let Some(bytes) = decode(data) else {
            return false;
        };
        self.take(record, "data", media_type, bytes);
        true
    }
}

/// Moves media out of `message` (its `parts` and `content`), leaving pointers.
pub fn extract(message: &mut JsonMap) -> Extraction {
    let mut extractor = Extractor {
        out: Extraction::default(),
    };
    for field in ["parts", "content"] {
        if let Some(value) = message.get_mut(field) {
            extractor.walk(value, 0);
        }
    }
    extractor.out
}

/// True when a message's JSON text may hold media or pointers: base64 `data:` URLs, `data`
/// fields, pointers. A cheap check that spares the common text message the walk.
pub fn may_hold_media(json: &str) -> bool {
    json.contains(";base64,") || json.contains("\"data\":") || may_hold_pointers(json)
}

/// True when a message's JSON text may hold pointers (a cheap check before parsing it).
pub fn may_hold_pointers(json: &str) -> bool {
    json.contains(POINTER_PREFIX)
}

/// The distinct hashes pointed to anywhere in a JSON text.
pub fn pointers_in(json: &str) -> Vec<String> {
    let mut hashes: Vec<String> = Vec::new();
    for (at, _) in json.match_indices(POINTER_PREFIX) {
        let candidate = json.get(at..at + POINTER_PREFIX.len() + 64).unwrap_or("");
        if let Some(hash) = pointer_hash(candidate)
            && !hashes.iter().any(|h| h == hash)
        {
            hashes.push(hash.to_owned());
        }
    }
    hashes
}

/// A payload ready to put back: its hash, the JSON-escaped media type and its canonical base64
/// (computed once per read batch, however many messages point to it).
#[derive(Debug, Clone)]
pub struct Encoded {
    pub hash: String,
    media_type: String,
    base64: String,
}

impl Encoded {
    pub fn new(payload: &Payload) -> Self {
        let quoted =
            serde_json::to_string(&payload.media_type).expect("a string always serialises");
        Self {
            hash: payload.hash.clone(),
            media_type: quoted[1..quoted.len() - 1].to_owned(),
            base64: STANDARD.encode(&payload.bytes),
        }
    }
}

/// Puts media back into a message's compact JSON text: the value of a `"url"` field holding a
/// pointer becomes a canonical base64 `data:` URL with the stored media type, a `"data"` field's
/// bare canonical base64. A pointer to none of `stored` stays as it is. Works on the text, so a
/// read copies each message once instead of parsing and re-serialising it.
pub fn resolve(json: &str, stored: &[Encoded]) -> String {
    // Sized first: a message grows from its pointer form to megabytes of base64, and growing a
    // buffer that large step by step copies it several times.
    let mut len = 0;
    resolved_pieces(json, stored, |piece| len += piece.len());
    let mut out = String::with_capacity(len);
    resolved_pieces(json, stored, |piece| out.push_str(piece));
    out
}

/// The pieces of [`resolve`]'s text, in order.
fn resolved_pieces<'a>(json: &'a str, stored: &'a [Encoded], mut emit: impl FnMut(&'a str)) {
    let mut rest = json;
    while let Some(at) = rest.find(POINTER_PREFIX) {
        let (before, from_pointer) = rest.split_at(at);
        emit(before);
        // The whole string value: the pointer and its closing quote.
        let end = POINTER_PREFIX.len() + 64;
        let hash = from_pointer
            .get(..end)
            .and_then(pointer_hash)
            .filter(|_| from_pointer.as_bytes().get(end) == Some(&b'"'));
        let field = if before.ends_with("\"url\":\"") {
            Some("url")
        } else if before.ends_with("\"data\":\"") {
            Some("data")
        } else {
            None
        };
        let found = hash.zip(field).and_then(|(hash, field)| {
            let index = stored.iter().position(|p| p.hash == hash)?;
            Some((field, index))
        });
        match found {
            Some((field, index)) => {
                let media = &stored[index];
                if field == "url" {
                    emit("data:");
                    emit(&media.media_type);
                    emit(";base64,");
                }
                emit(&media.base64);
                rest = &from_pointer[end..];
            }
            None => {
                emit(POINTER_PREFIX);
                rest = &from_pointer[POINTER_PREFIX.len()..];
            }
        }
    }
    emit(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> JsonMap {
        v.as_object().unwrap().clone()
    }

    fn png(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn data_urls_and_media_records_move_out_and_come_back_byte_exact() {
        let image = STANDARD.encode(png(3_000));
        let mut message = map(json!({"role": "user", "parts": [
            {"type": "text", "text": "look"},
            {"type": "file", "mediaType": "image/png", "url": format!("data:image/png;base64,{image}")},
            {"type": "tool-ocr", "output": {"type": "content", "value": [
                {"type": "media", "mediaType": "application/pdf", "data": "JVBERi0xLjQK"}]}}
        ]}));
        let original = message.clone();
        let out = extract(&mut message);
        assert_eq!(out.payloads.len(), 2);
        assert_eq!(out.references.len(), 2);
        let text = serde_json::to_string(&message).unwrap();
        assert!(text.len() < 600, "{text}");
        assert_eq!(pointers_in(&text).len(), 2);
        let encoded: Vec<Encoded> = out.payloads.iter().map(Encoded::new).collect();
        let restored: JsonMap = serde_json::from_str(&resolve(&text, &encoded)).unwrap();
        assert_eq!(restored, original);
        // A pointer the store does not hold, or one outside a url/data field, stays.
        let unknown = resolve(&text, &encoded[..1]);
        assert_eq!(pointers_in(&unknown).len(), 1);
        let elsewhere = format!("{{\"note\":\"{POINTER_PREFIX}{}\"}}", out.payloads[0].hash);
        assert_eq!(resolve(&elsewhere, &encoded), elsewhere);
    }

    #[test]
    fn text_broken_base64_and_lying_headers_stay_inline() {
        for url in [
            "data:text/plain;base64,aGVsbG8=",
            "data:image/png;base64,not*base64!",
            "data:image/png;base64,abcde",
            "data:image/png,rawbytes",
            "https://example.com/cat.png",
        ] {
            let mut message = map(json!({"role": "user", "parts": [{"type": "file", "url": url}]}));
            let before = message.clone();
            assert_eq!(extract(&mut message), Extraction::default(), "{url}");
            assert_eq!(message, before);
        }
        // A declared text type wins over the header.
        let mut lying = map(json!({"role": "user", "parts": [
            {"type": "file", "mediaType": "text/csv", "url": "data:image/png;base64,aGVsbG8="}]}));
        assert!(extract(&mut lying).payloads.is_empty());
    }

    #[test]
    fn duplicates_share_a_payload_and_pointers_count_as_references() {
        let url = format!("data:image/gif;base64,{}", STANDARD.encode(b"GIF89a"));
        let mut message = map(json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "image_url", "image_url": {"url": url}}]}));
        let out = extract(&mut message);
        assert_eq!((out.payloads.len(), out.references.len()), (1, 1));
        // Writing the pointer form back extracts nothing and keeps the reference.
        let again = extract(&mut message);
        assert!(again.payloads.is_empty());
        assert_eq!(again.references, out.references);
    }

    #[test]
    fn deep_nesting_is_left_alone() {
        let mut value = json!({"type": "media", "mediaType": "image/png", "data": "R0lGODlh"});
        for _ in 0..20 {
            value = json!({"wrap": value});
        }
        let mut message = map(json!({"role": "user", "parts": [value]}));
        assert!(extract(&mut message).payloads.is_empty());
    }

    #[test]
    fn non_canonical_base64_is_accepted_and_normalised() {
        let mut message = map(json!({"role": "user", "parts": [
            {"type": "file", "url": "data:image/png;base64,R0lG\nODlh"}]}));
        let out = extract(&mut message);
        assert_eq!(out.payloads[0].bytes, b"GIF89a");
        assert_eq!(out.payloads[0].media_type, "image/png");
        let text = serde_json::to_string(&message).unwrap();
        let encoded: Vec<Encoded> = out.payloads.iter().map(Encoded::new).collect();
        let restored: Value = serde_json::from_str(&resolve(&text, &encoded)).unwrap();
        assert_eq!(
            restored["parts"][0]["url"],
            "data:image/png;base64,R0lGODlh"
        );
        assert_eq!(restored["parts"][0]["mediaType"], "image/png");
    }
}

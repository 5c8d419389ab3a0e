//! Export and import of a whole session as NDJSON: the session's record, every message of the
//! tree (in insertion order, so parents come before children), then compactions, then state,
//! then the session's context (its own blocks, its own entries of keyed blocks, its frozen
//! prompt; the namespace's templates are not the session's and stay out). An export re-imports
//! into an equal session, in this store or another (a store moves session by session).
//!
//! Lines:
//! - `{"session": {"id", "name", "parentSessionId", "model", "source", "userId", "metadata",
//!   "settings", "endReason", "inputTokens", "outputTokens", "cost", "createdAt"}}` (the
//!   session object's own fields, every one optional; at most one such line): the record a
//!   session created by the import gets, with its creation time; a session that exists keeps
//!   its own. `id` is the exported session's and names nothing: lines go to the session the
//!   import is for.
//! - `{"message": {...}, "parentId": "…"|null, "createdAt": ms}` (`createdAt` optional: the
//!   message's own `createdAt`, else now)
//! - `{"compaction": {"id", "summary", "fromMessageId", "toMessageId", "createdAt"}}`
//! - `{"state": {"key": "…", "value": any JSON}}`
//! - `{"block": {"label", "kind", "description"?, "maxTokens"?, "content"?}}` (as
//!   `PUT …/context/{label}` takes it; replaces the session's block of that label)
//! - `{"entry": {"label", "key", "content", "description"?}}` (an entry of a skill or search
//!   block the session has or an earlier line defines)
//! - `{"prompt": {"text": "…"}}` (the frozen system prompt, frozen anew at import)
//!
//! The namespace's context templates export alike ([`Db::export_templates`]): a
//! `{"templates": {}}` line, then a block line per template block and an entry line per entry
//! of its keyed ones. Such a part imports only into the templates ([`Db::import_templates`]).

use futures::stream::{self, Stream, StreamExt, TryStreamExt};
use serde_json::Value;
use sessiondb_core::context::BlockKind;
use sessiondb_core::message::{JsonMap, validate_id, validate_text, validate_time};
use sessiondb_core::registry::validate_state_key;
use sessiondb_core::{
    Compaction, ContextEntry, Message, SessionInfo, SessionKey, SessionRecord, Store, StoreError,
    StoredMessage, UpdateOutcome, ValidationError, ValidationErrorKind, WINDOW_MAX_BYTES,
    WINDOW_MAX_ROWS, WriteCondition, WriteOp, WriteOutcome, WriteRequest, Written,
};

use crate::context::BlockSpec;
use crate::registry::check_record;
use crate::session::{check_named_parent, now_ms};
use crate::{Db, Error, Session};

/// One parsed import line.
#[derive(Debug, Clone, PartialEq)]
pub enum ImportLine {
    Session {
        /// The exported session's id: names nothing for an import into one session, and the
        /// session of its part for `sessiondb import --all`.
        id: Option<String>,
        record: Box<SessionRecord>,
        created_at: Option<i64>,
    },
    Message {
        message: Message,
        parent_id: Option<String>,
        created_at: Option<i64>,
        updated_at: Option<i64>,
        /// `"replace": true`: a message of this id the session has is rewritten with this body
        /// (as `PUT …/messages/{id}`: its parent, seq and createdAt stay) instead of skipped.
        replace: bool,
    },
    Compaction(Compaction),
    State {
        key: String,
        value: Value,
    },
    Block {
        label: String,
        spec: BlockSpec,
    },
    Entry {
        label: String,
        entry: ContextEntry,
    },
    Prompt(String),
    /// The line that opens the namespace templates' part of a dump.
    Templates,
}

/// Import lines, each with the 0-based number of the document line it was parsed from, which
/// its errors name (`lines[n]`, blank lines counted); lines built in code
/// (`Vec<ImportLine>`) are numbered by their position.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportLines(Vec<(usize, ImportLine)>);

impl ImportLines {
    /// Adds `line`, parsed from the document's line `number`.
    pub fn push(&mut self, number: usize, line: ImportLine) {
        self.0.push((number, line));
    }
}

impl From<Vec<ImportLine>> for ImportLines {
    fn from(lines: Vec<ImportLine>) -> Self {
        lines.into_iter().collect()
    }
}

impl FromIterator<ImportLine> for ImportLines {
    fn from_iter<I: IntoIterator<Item = ImportLine>>(lines: I) -> Self {
        ImportLines(lines.into_iter().enumerate().collect())
    }
}

/// The first line of the namespace templates' part of a dump.
pub const TEMPLATES_LINE: &str = "{\"templates\":{}}\n";

/// How an import's write ops count in its [`ImportSummary`].
struct ImportTally {
    /// Leading ops that count in neither total (the session line's).
    uncounted: usize,
    /// Lines skipped before writing (compactions the session has).
    skipped: usize,
}

impl ImportTally {
    fn summary(self, written: Written) -> ImportSummary {
        let mut summary = ImportSummary {
            imported: 0,
            skipped: self.skipped,
            version: written.version,
        };
        for outcome in written.outcomes.into_iter().skip(self.uncounted) {
            match outcome {
                WriteOutcome::Imported(None)
                | WriteOutcome::Updated(UpdateOutcome::Unchanged(_) | UpdateOutcome::Missing) => {
                    summary.skipped += 1
                }
                _ => summary.imported += 1,
            }
        }
        summary
    }
}

/// One session's part of [`Db::import_together`]: the lines to import into it and what must
/// hold of the session first: the active leaf it has, as for [`Session::import_lines_if_leaf`],
/// its version, or that it does not exist yet.
#[derive(Debug, Clone)]
pub struct ImportPart {
    pub session_id: String,
    pub lines: ImportLines,
    pub condition: Option<WriteCondition>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportSummary {
    /// Messages and compactions written; state keys, context blocks, entries and the prompt set
    /// (the session line counts in neither).
    pub imported: usize,
    /// Messages and compactions whose id already existed (nothing written for them).
    pub skipped: usize,
    /// The session's version once the import committed (`None` when it left no session: the
    /// templates' part).
    pub version: Option<i64>,
}

fn wrong(field: String, expected: &'static str) -> ValidationError {
    ValidationError::new(field, ValidationErrorKind::WrongType { expected })
}

fn string_field(map: &JsonMap, prefix: &str, name: &str) -> Result<String, ValidationError> {
    match map.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(ValidationError::new(
            format!("{prefix}.{name}"),
            ValidationErrorKind::Missing,
        )),
        Some(_) => Err(wrong(format!("{prefix}.{name}"), "a string")),
    }
}

fn optional_string(
    map: &JsonMap,
    prefix: &str,
    name: &str,
) -> Result<Option<String>, ValidationError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong(format!("{prefix}.{name}"), "a string or null")),
    }
}

/// A flag that is false unless the line sets it.
fn flag_field(map: &JsonMap, prefix: &str, name: &str) -> Result<bool, ValidationError> {
    match map.get(name) {
        None => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(_) => Err(wrong(format!("{prefix}.{name}"), "a boolean")),
    }
}

fn object(value: Value, prefix: &str) -> Result<JsonMap, ValidationError> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(wrong(prefix.to_owned(), "an object")),
    }
}

fn object_field(map: &mut JsonMap, prefix: &str, name: &str) -> Result<JsonMap, ValidationError> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(JsonMap::new()),
        Some(v) => object(v, &format!("{prefix}.{name}")),
    }
}

/// A token counter: both backends keep them as signed 64-bit integers.
fn counter_field(map: &JsonMap, prefix: &str, name: &str) -> Result<u64, ValidationError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .filter(|n| i64::try_from(*n).is_ok())
            .ok_or_else(|| {
                wrong(
                    format!("{prefix}.{name}"),
                    "a non-negative integer below 2^63",
                )
            }),
    }
}

fn time_field(map: &JsonMap, prefix: &str, name: &str) -> Result<Option<i64>, ValidationError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(format!("{prefix}.{name}"), "epoch milliseconds")),
    }
}

/// Parses line `number` (0-based; errors name it as `lines[n]`).
pub fn parse_import_line(number: usize, text: &str) -> Result<ImportLine, ValidationError> {
    import_line_of(number, json_line(number, text)?)
}

fn json_line(number: usize, text: &str) -> Result<Value, ValidationError> {
    serde_json::from_str(text).map_err(|e| {
        ValidationError::new(
            format!("lines[{number}]"),
            ValidationErrorKind::NotJson {
                reason: e.to_string(),
            },
        )
    })
}

/// Line `number`, parsed as JSON, as an import line.
fn import_line_of(number: usize, value: Value) -> Result<ImportLine, ValidationError> {
    let prefix = format!("lines[{number}]");
    let mut line = object(value, &prefix)?;
    if let Some(session) = line.remove("session") {
        let prefix = format!("{prefix}.session");
        let mut s = object(session, &prefix)?;
        let cost = match s.get("cost") {
            None | Some(Value::Null) => 0.0,
            Some(v) => v
                .as_f64()
                .filter(|c| c.is_finite() && *c >= 0.0)
                .ok_or_else(|| wrong(format!("{prefix}.cost"), "a finite non-negative number"))?,
        };
        let record = SessionRecord {
            name: optional_string(&s, &prefix, "name")?,
            parent_session_id: optional_string(&s, &prefix, "parentSessionId")?,
            model: optional_string(&s, &prefix, "model")?,
            source: optional_string(&s, &prefix, "source")?,
            user_id: optional_string(&s, &prefix, "userId")?,
            end_reason: optional_string(&s, &prefix, "endReason")?,
            input_tokens: counter_field(&s, &prefix, "inputTokens")?,
            output_tokens: counter_field(&s, &prefix, "outputTokens")?,
            cost,
            metadata: object_field(&mut s, &prefix, "metadata")?,
            settings: object_field(&mut s, &prefix, "settings")?,
        };
        let created_at = time_field(&s, &prefix, "createdAt")?;
        // The id names nothing inside the session it is imported into: not checked here.
        let id = s.get("id").and_then(Value::as_str).map(str::to_owned);
        return Ok(ImportLine::Session {
            id,
            record: Box::new(record),
            created_at,
        });
    }
    if let Some(message) = line.remove("message") {
        let parent_id = match line.get("parentId") {
            None | Some(Value::Null) => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(_) => return Err(wrong(format!("{prefix}.parentId"), "a string or null")),
        };
        if let Some(parent) = &parent_id {
            check_named_parent(&format!("{prefix}.parentId"), parent)?;
        }
        // A message's own times are store-owned fields: used when they are times a line could
        // give, ignored (like an ISO string) otherwise.
        let own_time = |name| {
            message
                .get(name)
                .and_then(Value::as_i64)
                .filter(|ms| validate_time(name, *ms).is_ok())
        };
        let created_at = time_field(&line, &prefix, "createdAt")?.or(own_time("createdAt"));
        let updated_at = own_time("updatedAt");
        let message = Message::from_value(message).map_err(under(&format!("{prefix}.message")))?;
        if message.id().is_none() {
            return Err(ValidationError::new(
                format!("{prefix}.message.id"),
                ValidationErrorKind::Missing,
            ));
        }
        return Ok(ImportLine::Message {
            message,
            parent_id,
            created_at,
            updated_at,
            replace: flag_field(&line, &prefix, "replace")?,
        });
    }
    if let Some(compaction) = line.remove("compaction") {
        let prefix = format!("{prefix}.compaction");
        let c = object(compaction, &prefix)?;
        let compaction = Compaction {
            id: string_field(&c, &prefix, "id")?,
            summary: string_field(&c, &prefix, "summary")?,
            from_message_id: string_field(&c, &prefix, "fromMessageId")?,
            to_message_id: string_field(&c, &prefix, "toMessageId")?,
            created_at: time_field(&c, &prefix, "createdAt")?.unwrap_or_else(now_ms),
        };
        validate_id(&format!("{prefix}.id"), &compaction.id)?;
        return Ok(ImportLine::Compaction(compaction));
    }
    if let Some(state) = line.remove("state") {
        let prefix = format!("{prefix}.state");
        let mut s = object(state, &prefix)?;
        let key = string_field(&s, &prefix, "key")?;
        validate_state_key(&key).map_err(under(&prefix))?;
        let value = s.remove("value").ok_or_else(|| {
            ValidationError::new(format!("{prefix}.value"), ValidationErrorKind::Missing)
        })?;
        return Ok(ImportLine::State { key, value });
    }
    if let Some(block) = line.remove("block") {
        let prefix = format!("{prefix}.block");
        let b = object(block, &prefix)?;
        let kind = string_field(&b, &prefix, "kind")?;
        let kind = BlockKind::parse(&kind).ok_or_else(|| {
            wrong(
                format!("{prefix}.kind"),
                "readonly, writable, skill or search",
            )
        })?;
        let max_tokens = match b.get("maxTokens") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                wrong(format!("{prefix}.maxTokens"), "a positive integer or null")
            })?),
        };
        let spec = BlockSpec {
            kind,
            description: optional_string(&b, &prefix, "description")?,
            max_tokens,
            content: optional_string(&b, &prefix, "content")?.unwrap_or_default(),
        };
        let label = string_field(&b, &prefix, "label")?;
        return Ok(ImportLine::Block { label, spec });
    }
    if let Some(entry) = line.remove("entry") {
        let prefix = format!("{prefix}.entry");
        let e = object(entry, &prefix)?;
        return Ok(ImportLine::Entry {
            label: string_field(&e, &prefix, "label")?,
            entry: ContextEntry {
                key: string_field(&e, &prefix, "key")?,
                content: string_field(&e, &prefix, "content")?,
                description: optional_string(&e, &prefix, "description")?,
            },
        });
    }
    if let Some(prompt) = line.remove("prompt") {
        let prefix = format!("{prefix}.prompt");
        let p = object(prompt, &prefix)?;
        return Ok(ImportLine::Prompt(string_field(&p, &prefix, "text")?));
    }
    if let Some(templates) = line.remove("templates") {
        object(templates, &format!("{prefix}.templates"))?;
        return Ok(ImportLine::Templates);
    }
    Err(wrong(
        prefix,
        "an object with `session`, `message`, `compaction`, `state`, `block`, `entry`, `prompt` \
         or `templates`",
    ))
}

/// Parses the NDJSON body of an import into several sessions ([`Db::import_together`]): a line
/// `{"into": {"sessionId": "…", "ifLeaf": "…"|null, "ifVersion": 7, "ifAbsent": true}}` opens
/// each session's part (the conditions optional and exclusive: `ifLeaf` `null` for a session
/// without messages, `ifVersion` for one still at a version read before, `ifAbsent` for one that
/// must not exist yet), and the lines after it, as
/// [`parse_import`] takes them, are that part's. Blank lines are ignored; the first bad line
/// fails it all, named as the body's line inside its part (`parts[1].lines[7].message.role`).
pub fn parse_import_parts(text: &str) -> Result<Vec<ImportPart>, ValidationError> {
    let mut parts: Vec<ImportPart> = Vec::new();
    let lines = text.lines().enumerate();
    for (number, text) in lines.filter(|(_, line)| !line.trim().is_empty()) {
        let mut value = json_line(number, text).map_err(in_last_part(parts.len()))?;
        if let Some(into) = value.as_object_mut().and_then(|line| line.remove("into")) {
            let prefix = format!("lines[{number}].into");
            let into = object(into, &prefix)?;
            let leaf = match into.get("ifLeaf") {
                None => None,
                Some(Value::Null) => Some(None),
                Some(Value::String(id)) => Some(Some(id.clone())),
                Some(_) => return Err(wrong(format!("{prefix}.ifLeaf"), "a message id or null")),
            };
            let version = match into.get("ifVersion") {
                None => None,
                Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v >= 0) => n.as_i64(),
                Some(_) => {
                    return Err(wrong(
                        format!("{prefix}.ifVersion"),
                        "a version (an integer ≥ 0)",
                    ));
                }
            };
            let absent = flag_field(&into, &prefix, "ifAbsent")?;
            let condition = match (absent, leaf, version) {
                (false, None, None) => None,
                (false, Some(leaf), None) => Some(WriteCondition::Leaf(leaf)),
                (false, None, Some(version)) => Some(WriteCondition::Version(version)),
                (true, None, None) => Some(WriteCondition::Absent),
                _ => {
                    return Err(wrong(
                        prefix,
                        "at most one of `ifLeaf`, `ifVersion` and `ifAbsent` (one condition per session)",
                    ));
                }
            };
            parts.push(ImportPart {
                session_id: string_field(&into, &prefix, "sessionId")?,
                lines: ImportLines::default(),
                condition,
            });
            continue;
        }
        let line = import_line_of(number, value).map_err(in_last_part(parts.len()))?;
        match parts.last_mut() {
            Some(part) => part.lines.push(number, line),
            None => {
                return Err(wrong(
                    format!("lines[{number}]"),
                    "an `into` line first, naming the session the lines after it import into",
                ));
            }
        }
    }
    Ok(parts)
}

/// Names a line's invalid field as one of the last of `parts` parts (`parts[i].lines[n]`, as
/// [`Db::import_together`] names its lines' refusals), when there is a part.
fn in_last_part(parts: usize) -> impl Fn(ValidationError) -> ValidationError {
    move |e| match parts.checked_sub(1) {
        Some(i) => under(&format!("parts[{i}]"))(e),
        None => e,
    }
}

/// Parses a whole NDJSON document (blank lines ignored); the first bad line fails it all.
pub fn parse_import(text: &str) -> Result<ImportLines, ValidationError> {
    let lines = text.lines().enumerate();
    let lines = lines.filter(|(_, line)| !line.trim().is_empty());
    let parsed = lines.map(|(n, line)| Ok((n, parse_import_line(n, line)?)));
    Ok(ImportLines(parsed.collect::<Result<_, ValidationError>>()?))
}

/// Names an invalid field as one inside `prefix` (a line's, as parse errors name them:
/// `lines[3]`, `lines[3].block`).
fn inside(prefix: String) -> impl Fn(Error) -> Error {
    move |error| match error {
        Error::Invalid(e) => Error::Invalid(under(&prefix)(e)),
        other => other,
    }
}

/// Names an invalid field as one inside `prefix`.
fn under(prefix: &str) -> impl Fn(ValidationError) -> ValidationError + '_ {
    move |e| ValidationError {
        field: format!("{prefix}.{}", e.field),
        kind: e.kind,
    }
}

/// An error met in part `part` of [`Db::import_together`]: an invalid field named inside the
/// part, anything else as [`Error::InPart`].
fn in_part(part: usize, session_id: &str, error: Error) -> Error {
    match error {
        Error::Invalid(e) => Error::Invalid(under(&format!("parts[{part}]"))(e)),
        error => Error::InPart {
            part,
            session_id: session_id.to_owned(),
            error: Box::new(error),
        },
    }
}

fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The session line: the record and creation time (what an import gives a session it creates).
fn session_line(info: &SessionInfo) -> String {
    let r = &info.record;
    let session = serde_json::json!({
        "id": info.id, "name": r.name, "parentSessionId": r.parent_session_id,
        "model": r.model, "source": r.source, "userId": r.user_id, "metadata": r.metadata,
        "settings": r.settings, "endReason": r.end_reason, "inputTokens": r.input_tokens,
        "outputTokens": r.output_tokens, "cost": r.cost, "createdAt": info.created_at});
    format!("{}\n", serde_json::json!({ "session": session }))
}

/// A context block's export line, as `PUT …/context/{label}` takes the block (a keyed block's
/// entries have lines of their own, and its content is theirs).
pub fn block_line(
    label: &str,
    kind: BlockKind,
    description: Option<&str>,
    max_tokens: Option<u64>,
    content: &str,
) -> String {
    let mut block = serde_json::json!({"label": label, "kind": kind.as_str()});
    if let Some(description) = description {
        block["description"] = description.into();
    }
    if let Some(max_tokens) = max_tokens {
        block["maxTokens"] = max_tokens.into();
    }
    if !kind.is_keyed() {
        block["content"] = content.into();
    }
    format!("{}\n", serde_json::json!({ "block": block }))
}

/// An entry's export line.
pub fn entry_line(label: &str, entry: &ContextEntry) -> String {
    let mut line = serde_json::json!({"label": label, "key": entry.key, "content": entry.content});
    if let Some(description) = &entry.description {
        line["description"] = description.as_str().into();
    }
    format!("{}\n", serde_json::json!({ "entry": line }))
}

fn message_line(m: &StoredMessage) -> String {
    let parent = m
        .parent_id
        .as_deref()
        .map_or("null".to_owned(), json_string);
    format!(
        "{{\"message\":{},\"parentId\":{parent},\"createdAt\":{}}}\n",
        m.json(),
        m.created_at
    )
}

impl<S: Store> Session<S> {
    /// Writes every line in one atomic request: all lines land, or (on any error) none.
    pub async fn import_lines(
        &self,
        lines: impl Into<ImportLines>,
    ) -> Result<ImportSummary, Error> {
        self.import_lines_if_leaf(lines, None).await
    }

    /// [`Session::import_lines`] when the session exists with this active leaf (`None`: no
    /// message), checked atomically with the write, as [`WriteCondition::Leaf`] is for an append.
    pub async fn import_lines_if_leaf(
        &self,
        lines: impl Into<ImportLines>,
        if_leaf: Option<Option<String>>,
    ) -> Result<ImportSummary, Error> {
        let (ops, tally) = self.plan_import(lines.into()).await?;
        let written = self
            .write_if(ops, if_leaf.map(WriteCondition::Leaf))
            .await?;
        Ok(tally.summary(written))
    }

    /// The write ops of an import's lines, every line checked, and how to count what they did.
    async fn plan_import(&self, lines: ImportLines) -> Result<(Vec<WriteOp>, ImportTally), Error> {
        let existing: Vec<String> = self
            .compactions()
            .await?
            .into_iter()
            .map(|c| c.id)
            .collect();
        let mut skipped = 0;
        let mut ops = Vec::with_capacity(lines.0.len());
        // Goes first, before a message line's write registers the session with an empty record.
        let mut create: Option<WriteOp> = None;
        let now = now_ms();
        let settings = self.write_settings().await?;
        // What an entry line's label may name: the blocks of earlier block lines, else the
        // session's visible blocks (read at the first entry line that needs them).
        let mut defined: Vec<(String, BlockKind)> = Vec::new();
        let mut visible: Option<Vec<(String, BlockKind)>> = None;
        let templates = self.key().is_templates();
        for (number, line) in lines.0 {
            let fits = match &line {
                ImportLine::Templates => templates,
                ImportLine::Block { .. } | ImportLine::Entry { .. } => true,
                _ => !templates,
            };
            if !fits {
                let expected = if templates {
                    "a block or entry line (the namespace templates hold only those)"
                } else {
                    "a line of a session (a `templates` line opens the namespace templates' part \
                     of a dump, which imports into the templates)"
                };
                return Err(wrong(format!("lines[{number}]"), expected).into());
            }
            match line {
                ImportLine::Templates => {}
                ImportLine::Session { .. } if create.is_some() => {
                    return Err(
                        wrong(format!("lines[{number}]"), "at most one session line").into(),
                    );
                }
                ImportLine::Session {
                    record, created_at, ..
                } => {
                    let prefix = format!("lines[{number}].session");
                    check_record(&record).map_err(under(&prefix))?;
                    if let Some(ms) = created_at {
                        validate_time(&format!("{prefix}.createdAt"), ms)?;
                    }
                    create = Some(WriteOp::CreateSession {
                        record: *record,
                        created_at,
                    });
                }
                ImportLine::Message {
                    message,
                    parent_id,
                    created_at,
                    updated_at,
                    replace,
                } => {
                    let times = [("createdAt", created_at), ("message.updatedAt", updated_at)];
                    for (name, ms) in times {
                        if let Some(ms) = ms {
                            validate_time(&format!("lines[{number}].{name}"), ms)?;
                        }
                    }
                    let message = self.prepare_verbatim(message, &settings).await;
                    ops.push(WriteOp::Import {
                        message: message.map_err(inside(format!("lines[{number}]")))?,
                        parent_id,
                        created_at: created_at.unwrap_or(now),
                        updated_at,
                        replace,
                    });
                }
                ImportLine::Compaction(c) if existing.contains(&c.id) => skipped += 1,
                ImportLine::Compaction(compaction) => {
                    let prefix = format!("lines[{number}].compaction");
                    self.check_text(&format!("{prefix}.summary"), &compaction.summary)?;
                    validate_time(&format!("{prefix}.createdAt"), compaction.created_at)?;
                    ops.push(WriteOp::AddCompaction {
                        compaction,
                        by_compact: false,
                    })
                }
                ImportLine::State { key, value } => ops.push(
                    self.put_state_op(&key, &value)
                        .map_err(inside(format!("lines[{number}].state")))?,
                ),
                ImportLine::Block { label, spec } => {
                    let block = self
                        .checked_block(&label, spec)
                        .map_err(inside(format!("lines[{number}].block")))?;
                    defined.push((label, block.kind));
                    ops.push(WriteOp::PutBlock { block });
                }
                ImportLine::Entry { label, entry } => {
                    let entry = self
                        .checked_entry(
                            &label,
                            &entry.key,
                            &entry.content,
                            entry.description.as_deref(),
                        )
                        .map_err(inside(format!("lines[{number}].entry")))?;
                    let mut kind = defined.iter().rev().find(|(l, _)| *l == label);
                    if kind.is_none() {
                        if visible.is_none() {
                            let blocks = self.store.context_blocks(self.key()).await?;
                            let blocks = blocks.into_iter().map(|b| (b.block.label, b.block.kind));
                            visible = Some(blocks.collect());
                        }
                        kind = visible.iter().flatten().rev().find(|(l, _)| *l == label);
                    }
                    if !kind.is_some_and(|(_, kind)| kind.is_keyed()) {
                        return Err(wrong(
                            format!("lines[{number}].entry.label"),
                            "a skill or search block the session has or an earlier line defines",
                        )
                        .into());
                    }
                    ops.push(WriteOp::PutEntry { label, entry });
                }
                ImportLine::Prompt(prompt) => {
                    validate_text(&format!("lines[{number}].prompt.text"), &prompt)?;
                    ops.push(WriteOp::FreezePrompt {
                        prompt,
                        replace: true,
                    });
                }
            }
        }
        let uncounted = usize::from(create.is_some());
        ops.splice(0..0, create);
        Ok((ops, ImportTally { uncounted, skipped }))
    }

    /// The session as NDJSON lines (each ending in `\n`), read window by window.
    pub fn export(&self) -> impl Stream<Item = Result<String, Error>> + Send + 'static {
        let session = self.clone();
        let head = {
            let session = session.clone();
            stream::once(async move {
                let info = session.info().await?;
                Ok::<_, Error>(stream::iter(info.as_ref().map(session_line).map(Ok)))
            })
            .try_flatten()
        };
        let messages = stream::try_unfold((session.clone(), 1i64), |(s, from)| async move {
            let batch = s
                .store
                .fetch_range(s.key(), from, i64::MAX, WINDOW_MAX_ROWS, WINDOW_MAX_BYTES)
                .await?;
            let Some(next) = batch.last().map(|m| m.seq + 1) else {
                return Ok(None);
            };
            let batch = s.resolved(batch).await?;
            let lines: Vec<Result<String, Error>> =
                batch.iter().map(|m| Ok(message_line(m))).collect();
            Ok::<_, Error>(Some((stream::iter(lines), (s, next))))
        })
        .try_flatten();
        let rest = stream::once(async move {
            let mut lines = Vec::new();
            for c in session.compactions().await? {
                let value = serde_json::json!({"compaction": {
                    "id": c.id, "summary": c.summary, "fromMessageId": c.from_message_id,
                    "toMessageId": c.to_message_id, "createdAt": c.created_at}});
                lines.push(Ok(format!("{value}\n")));
            }
            for (key, value) in session.state_entries().await? {
                let value = serde_json::json!({"state": {"key": key, "value": value}});
                lines.push(Ok(format!("{value}\n")));
            }
            lines.extend(session.context_lines().await?.into_iter().map(Ok));
            Ok::<_, Error>(stream::iter(lines))
        })
        .try_flatten();
        head.chain(messages).chain(rest)
    }

    /// The scope's own context as export lines: its blocks (a session's templates are the
    /// namespace's), the entries of keyed blocks it holds itself (a session's entry equal to the
    /// template's it shadows changes nothing and stays out), and a session's frozen prompt.
    async fn context_lines(&self) -> Result<Vec<String>, Error> {
        let store = &self.store;
        let in_templates = self.key().is_templates();
        let blocks = store.context_blocks(self.key()).await?;
        let mut lines = Vec::new();
        for scoped in blocks.iter().filter(|b| b.template == in_templates) {
            let b = &scoped.block;
            lines.push(block_line(
                &b.label,
                b.kind,
                b.description.as_deref(),
                b.max_tokens,
                &b.content,
            ));
        }
        let mut keyed: Vec<&str> = Vec::new();
        for scoped in blocks.iter().filter(|b| b.block.kind.is_keyed()) {
            if !keyed.contains(&scoped.block.label.as_str()) {
                keyed.push(&scoped.block.label);
            }
        }
        for label in keyed {
            // By key, the scope's own entry first: a template's entry directly after an own one
            // of its key is the one that own entry shadows.
            let entries = store.context_entries(self.key(), label, None, None).await?;
            for (i, scoped) in entries.iter().enumerate() {
                let own = &scoped.entry;
                let shadowed = entries.get(i + 1).filter(|next| next.entry.key == own.key);
                if scoped.template == in_templates && shadowed.is_none_or(|t| t.entry != *own) {
                    lines.push(entry_line(label, own));
                }
            }
        }
        if in_templates {
            return Ok(lines);
        }
        if let Some(frozen) = store.prompt(self.key()).await? {
            let line = serde_json::json!({"prompt": {"text": frozen.prompt}});
            lines.push(format!("{line}\n"));
        }
        Ok(lines)
    }
}

impl<S: Store> Db<S> {
    /// The namespace's context templates as export lines: [`TEMPLATES_LINE`], then a line per
    /// template block and per entry of its keyed ones; no lines when it has no template.
    pub async fn export_templates(&self, namespace: &str) -> Result<Vec<String>, Error> {
        let mut lines = self
            .context_templates(namespace)?
            .session
            .context_lines()
            .await?;
        if !lines.is_empty() {
            lines.insert(0, TEMPLATES_LINE.to_owned());
        }
        Ok(lines)
    }

    /// Imports into several sessions of `namespace` as one atomic write: every part's lines
    /// land, or (on any error in any part, a leaf condition included) nothing of any part. Each
    /// part is checked and applied as [`Session::import_lines_if_leaf`] does (errors in its
    /// lines name them as `parts[i].lines[n]`, `n` counted in the document the part was parsed
    /// from); a session may have several parts, applied in
    /// order. Summaries come in the parts' order.
    pub async fn import_together(
        &self,
        namespace: &str,
        parts: Vec<ImportPart>,
    ) -> Result<Vec<ImportSummary>, Error> {
        let mut tallies = Vec::with_capacity(parts.len());
        let mut requests = Vec::with_capacity(parts.len());
        for (i, part) in parts.into_iter().enumerate() {
            let named = |error| in_part(i, &part.session_id, error);
            let session = self
                .session_in(namespace, &part.session_id)
                .map_err(named)?;
            let (ops, tally) = session.plan_import(part.lines).await.map_err(named)?;
            requests.push(WriteRequest {
                condition: part.condition,
                ..session.request(ops)
            });
            tallies.push(tally);
        }
        let keys: Vec<SessionKey> = requests.iter().map(|r| r.key.clone()).collect();
        // A lone part is an ordinary write (on SQLite it then shares a group's commit).
        let written = match <[WriteRequest; 1]>::try_from(requests) {
            Ok([request]) => match self.store.write(request).await {
                Ok(written) => Ok(vec![written]),
                Err(error) => Err(in_part(0, &keys[0].session_id, error.into())),
            },
            Err(requests) => self
                .store
                .write_together(requests)
                .await
                .map_err(|e| match e {
                    StoreError::InRequest { index, error } => {
                        in_part(index, &keys[index].session_id, (*error).into())
                    }
                    other => other.into(),
                }),
        };
        // Imports can change what the sessions' memos were computed from.
        for key in &keys {
            self.caches.forget(key);
        }
        let summaries = (tallies.into_iter().zip(written?)).map(|(t, w)| t.summary(w));
        Ok(summaries.collect())
    }

    /// Imports a templates part of a dump (its `templates` line, then block and entry lines)
    /// into the namespace's templates, all lines or (on any error) none. A block replaces the
    /// template of its label, an entry the template entry of its key.
    pub async fn import_templates(
        &self,
        namespace: &str,
        lines: impl Into<ImportLines>,
    ) -> Result<ImportSummary, Error> {
        self.context_templates(namespace)?
            .session
            .import_lines(lines)
            .await
    }
}

//! Compaction runs: a [`Summarizer`] writes the summary of a planned span, `compact` stores it as
//! an overlay, and auto-compaction runs `compact` after an append takes a session over its
//! `compactAfter` threshold.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::Value;
use sessiondb_core::compaction::{
    CompactOptions, extended_from, extractive_summary, plan, summary_prompt,
};
use sessiondb_core::message::JsonMap;
use sessiondb_core::tokens::TokenCounter;
use sessiondb_core::{
    Change, Compaction, CompactionPhase, CompactionStatus, SessionInfo, SessionKey, Store,
    StoredMessage, WriteOp,
};

use crate::session::{HistoryOptions, Session, now_ms, unique_id};
use crate::{Error, tokenizers};

/// What a summarizer is asked to summarise.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRequest {
    /// The complete instruction for a language model (transcript included).
    pub prompt: String,
    /// The messages the summary replaces, oldest first.
    pub messages: Vec<Value>,
    /// The summary this one updates, if any.
    pub previous_summary: Option<String>,
    /// About how long the summary should be.
    pub budget_tokens: u64,
}

/// Why a summarizer produced no summary. The session is never changed by a failed summary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SummarizeError {
    #[error("the model did not answer within {seconds} s")]
    Timeout { seconds: u64 },
    #[error("the model answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the model's answer could not be read: {0}")]
    Malformed(String),
    #[error("the model could not be reached: {0}")]
    Transport(String),
}

/// Writes a summary. Implementations: [`ExtractiveSummarizer`] (no model) and the model clients
/// of the `sessiondb-summarizers` crate.
pub trait Summarizer: Send + Sync + std::fmt::Debug {
    fn summarize<'a>(
        &'a self,
        request: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>>;
}

/// A deterministic summary assembled from the messages themselves: needs no model, so
/// compaction works out of the box (see `sessiondb_core::compaction::extractive_summary`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtractiveSummarizer;

impl Summarizer for ExtractiveSummarizer {
    fn summarize<'a>(
        &'a self,
        request: &'a SummaryRequest,
    ) -> BoxFuture<'a, Result<String, SummarizeError>> {
        let middle: Vec<&Value> = request.messages.iter().collect();
        let summary = extractive_summary(
            &middle,
            request.previous_summary.as_deref(),
            request.budget_tokens,
        );
        Box::pin(async move { Ok(summary) })
    }
}

/// Per-session memos shared by every handle of a [`crate::Db`]: the auto-compaction estimate,
/// what a session's settings decide, and its loaded skills. The first two are derived from reads
/// and kept only when this process is the store's one writer (its writes refresh them); on a
/// shared store ([`Store::shared`]) every request derives them afresh, since another instance
/// may have changed what they came from. Loaded skills are the tool executor's own record (a
/// load is known before the agent stores its result), so they are kept either way; on a shared
/// store only while the session is as it was when they were recorded ([`HistoryMark`]), since
/// another instance may have loaded or unloaded one since.
#[derive(Debug, Default)]
pub(crate) struct SessionCaches {
    /// Keep nothing: other processes write to the store too.
    shared: bool,
    /// Per session: how many tokens overlays take off the raw path total for the path ending
    /// at `leaf`. Valid for appends under that leaf; anything else recomputes it.
    memos: Mutex<HashMap<SessionKey, Memo>>,
    /// Per session: what its settings decide for writes.
    settings: Mutex<HashMap<SessionKey, WriteSettings>>,
    /// Per session: the skills loaded (rebuilt from history when absent).
    skills: Mutex<HashMap<SessionKey, LoadedSkills>>,
    failures: AtomicU64,
}

/// What a session's settings decide for its writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteSettings {
    /// The counter its `tokenizer` setting names (`None`: the store's default).
    counter: Option<Arc<dyn TokenCounter>>,
    compact_after: Option<u64>,
}

/// A session's loaded skills as `label:key`, and on a shared store the mark of the session they
/// hold for.
type LoadedSkills = (Option<HistoryMark>, BTreeSet<String>);

/// What changes with every write to a session that another instance could make: its time, its
/// rows, its active leaf and the active path's bytes (a rewritten tool result changes those).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HistoryMark {
    updated_at: i64,
    stored_messages: u64,
    leaf_id: Option<String>,
    content_bytes: u64,
}

impl HistoryMark {
    pub(crate) fn of(info: Option<&SessionInfo>) -> Self {
        Self {
            updated_at: info.map_or(0, |i| i.updated_at),
            stored_messages: info.map_or(0, |i| i.stats.stored_messages),
            leaf_id: info.and_then(|i| i.stats.leaf_id.clone()),
            content_bytes: info.map_or(0, |i| i.stats.content_bytes),
        }
    }
}

#[derive(Debug, Clone)]
struct Memo {
    leaf: String,
    adjustment: u64,
}

/// Bounds the memo map; when full it starts over (each entry is one path walk to rebuild).
const MAX_MEMOS: usize = 10_000;

impl SessionCaches {
    pub(crate) fn new(shared: bool) -> Self {
        Self {
            shared,
            ..Self::default()
        }
    }

    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Forgets what was derived from a session's settings or path.
    pub(crate) fn forget(&self, key: &SessionKey) {
        self.memos.lock().unwrap().remove(key);
        self.settings.lock().unwrap().remove(key);
        self.skills.lock().unwrap().remove(key);
    }

    /// Whether other processes write to the store too.
    pub(crate) fn shared(&self) -> bool {
        self.shared
    }

    /// The loaded skills recorded for the session, if they hold for `mark` (`None` unless the
    /// store is shared).
    pub(crate) fn skills(
        &self,
        key: &SessionKey,
        mark: Option<&HistoryMark>,
    ) -> Option<BTreeSet<String>> {
        let (recorded, loaded) = cached(&self.skills, key)?;
        (recorded.as_ref() == mark).then_some(loaded)
    }

    pub(crate) fn set_skills(
        &self,
        key: &SessionKey,
        mark: Option<HistoryMark>,
        loaded: BTreeSet<String>,
    ) {
        bounded_insert(&self.skills, key, (mark, loaded));
    }

    fn memo(&self, key: &SessionKey) -> Option<Memo> {
        cached(&self.memos, key)
    }

    fn remember(&self, key: &SessionKey, memo: Memo) {
        self.keep(&self.memos, key, memo);
    }

    fn settings(&self, key: &SessionKey) -> Option<WriteSettings> {
        cached(&self.settings, key)
    }

    fn keep_settings(&self, key: &SessionKey, settings: WriteSettings) {
        self.keep(&self.settings, key, settings);
    }

    /// Keeps a value derived from reads, unless the store is shared.
    fn keep<T>(&self, map: &Mutex<HashMap<SessionKey, T>>, key: &SessionKey, value: T) {
        if !self.shared {
            bounded_insert(map, key, value);
        }
    }
}

fn cached<T: Clone>(map: &Mutex<HashMap<SessionKey, T>>, key: &SessionKey) -> Option<T> {
    map.lock().unwrap().get(key).cloned()
}

/// Inserts into a per-session map that starts over when full (each entry is cheap to rebuild).
fn bounded_insert<T>(map: &Mutex<HashMap<SessionKey, T>>, key: &SessionKey, value: T) {
    let mut map = map.lock().unwrap();
    if map.len() >= MAX_MEMOS && !map.contains_key(key) {
        map.clear();
    }
    map.insert(key.clone(), value);
}

fn setting(info: &SessionInfo, key: &str) -> Option<u64> {
    info.record.settings.get(key).and_then(Value::as_u64)
}

impl<S: Store> Session<S> {
    /// What this session's settings decide for writes, read once per process (and again after
    /// this process changes them; every time on a shared store). A `tokenizer` this build cannot
    /// honour falls back to the default counter.
    pub(crate) async fn write_settings(&self) -> Result<WriteSettings, Error> {
        if let Some(cached) = self.caches.settings(self.key()) {
            return Ok(cached);
        }
        let settings = match self.store.session(self.key()).await? {
            Some(info) => WriteSettings {
                counter: tokenizers::chosen(&info.record.settings).unwrap_or_else(|e| {
                    tracing::warn!(session = %self.id(), error = %e, "using the default token counter");
                    None
                }),
                compact_after: setting(&info, "compactAfter"),
            },
            None => WriteSettings::default(),
        };
        self.caches.keep_settings(self.key(), settings.clone());
        Ok(settings)
    }

    /// The token counter for this session's writes: its `tokenizer` setting's, else the
    /// store's default.
    pub(crate) async fn counter(&self) -> Result<Arc<dyn TokenCounter>, Error> {
        let chosen = self.write_settings().await?.counter;
        Ok(chosen.unwrap_or_else(|| self.options.token_counter.clone()))
    }

    /// The counter `settings` choose. A write call reads its settings once (on a shared store
    /// that is a read of the session row) and prepares every message with them.
    pub(crate) fn counter_of<'a>(&'a self, settings: &'a WriteSettings) -> &'a dyn TokenCounter {
        settings
            .counter
            .as_deref()
            .unwrap_or(self.options.token_counter.as_ref())
    }

    /// Summarises the branch ending at `leaf` (the active one when `None`) with the configured
    /// summarizer and stores the result as an overlay, extending the branch's existing overlay
    /// from its start. `None` when there is nothing to compact or the summary came back blank.
    /// Publishes `compact`, and around the summarizer's call a `status` event in phase
    /// `compacting` and one in phase `idle` (with the estimate before the run when a summary was
    /// stored). Fails with [`Error::NoSummarizer`] when none is configured and with
    /// [`Error::Summarize`] when the summarizer fails; nothing is written then.
    pub async fn compact(&self, leaf: Option<&str>) -> Result<Option<Compaction>, Error> {
        self.compact_keeping(leaf, None).await
    }

    /// [`Session::compact`] with the recent-token budget capped at `max_recent_tokens`.
    async fn compact_keeping(
        &self,
        leaf: Option<&str>,
        max_recent_tokens: Option<u64>,
    ) -> Result<Option<Compaction>, Error> {
        let summarizer = self.options.summarizer.clone().ok_or(Error::NoSummarizer)?;
        let info = self.store.session(self.key()).await?;
        let keep_recent_tokens = info
            .as_ref()
            .and_then(|i| setting(i, "keepRecentTokens"))
            .unwrap_or(self.options.compaction.keep_recent_tokens);
        let options = CompactOptions {
            keep_recent_tokens: keep_recent_tokens.min(max_recent_tokens.unwrap_or(u64::MAX)),
            ..self.options.compaction
        };
        let history = self
            .full_history(HistoryOptions {
                leaf: leaf.map(str::to_owned),
                newest_first: false,
            })
            .await?;
        let values: Vec<Value> = history.iter().map(StoredMessage::to_value).collect();
        let counter = self.counter().await?;
        let Some(plan) = plan(&values, &options, counter.as_ref()) else {
            return Ok(None);
        };
        let request = SummaryRequest {
            prompt: summary_prompt(
                &plan.middle,
                plan.previous_summary.as_deref(),
                plan.budget_tokens,
            ),
            messages: plan.middle.iter().map(|m| (*m).clone()).collect(),
            previous_summary: plan.previous_summary.clone(),
            budget_tokens: plan.budget_tokens,
        };
        let ids: Vec<&str> = history.iter().map(|m| m.id.as_str()).collect();

        // Subscribers learn that a (possibly long) summarizer call is under way, and then how
        // it ended, whichever way it ends.
        let settings = self.write_settings().await?;
        let prompt_tokens = self.frozen_prompt_tokens(&settings).await?;
        let before = prompt_tokens + history.iter().map(|m| m.token_estimate).sum::<u64>();
        let status = |phase, token_estimate, compacted_tokens_before| Change::Status {
            status: CompactionStatus {
                phase,
                token_estimate,
                token_threshold: settings.compact_after,
                compacted_tokens_before,
            },
        };
        self.store.announce(
            self.key(),
            status(CompactionPhase::Compacting, before, None),
        );
        let stored = async {
            let summary = summarizer
                .summarize(&request)
                .await
                .map_err(Error::Summarize)?;
            if summary.trim().is_empty() {
                return Ok(None);
            }
            self.check_text("summary", &summary)?;
            let compactions = self.store.compactions(self.key()).await?;
            let compaction = Compaction {
                id: unique_id(""),
                summary,
                from_message_id: extended_from(&compactions, &ids, &plan.from_message_id),
                to_message_id: plan.to_message_id.clone(),
                created_at: now_ms(),
            };
            self.write_one(WriteOp::AddCompaction {
                compaction: compaction.clone(),
                by_compact: true,
            })
            .await?;
            Ok(Some(compaction))
        }
        .await;
        let idle = match &stored {
            Ok(Some(_)) => {
                // A failed re-read must not turn a stored summary into an error.
                let after = self.overlaid_token_estimate(leaf).await.ok().flatten();
                let after = after.map_or(before, |tokens| tokens + prompt_tokens);
                status(CompactionPhase::Idle, after, Some(before))
            }
            _ => status(CompactionPhase::Idle, before, None),
        };
        self.store.announce(self.key(), idle);
        stored
    }

    /// Tokens of the session's frozen system prompt (counted as one system message), 0 when
    /// none is frozen. Reads the prompt; never freezes one.
    async fn frozen_prompt_tokens(&self, settings: &WriteSettings) -> Result<u64, Error> {
        let Some(frozen) = self.store.prompt(self.key()).await? else {
            return Ok(0);
        };
        let mut message = JsonMap::new();
        message.insert("role".into(), "system".into());
        message.insert("content".into(), frozen.prompt.into());
        Ok(self.counter_of(settings).count_message(&message))
    }

    /// Runs after an append stored `appended`, with the `settings` its write call read:
    /// compacts when the session's `compactAfter` setting is exceeded by the active path's
    /// (overlaid) token estimate plus its frozen system prompt's. Sessions without the setting
    /// cost nothing; with it, one O(1) session read and one of the prompt, and the overlaid
    /// total costs a path walk only when the path is not the one last measured (a branch,
    /// another process's write, a compaction). A failure never fails the append: it is logged,
    /// counted and published as an `error` event.
    pub(crate) async fn after_insert(&self, settings: &WriteSettings, appended: &StoredMessage) {
        if let Err(error) = self.auto_compact(settings, appended).await {
            self.caches.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                session = %self.id(),
                error = %error,
                "auto-compaction failed; the append stands"
            );
            self.store.announce(
                self.key(),
                Change::Error {
                    message: format!("auto-compaction failed: {error}"),
                },
            );
        }
    }

    async fn auto_compact(
        &self,
        settings: &WriteSettings,
        appended: &StoredMessage,
    ) -> Result<(), Error> {
        let Some(threshold) = settings.compact_after else {
            return Ok(());
        };
        if self.options.summarizer.is_none() {
            return Ok(());
        }
        let Some(info) = self.store.session(self.key()).await? else {
            return Ok(());
        };
        let raw = info.stats.token_estimate;
        let estimate = if !info.stats.has_compactions {
            raw
        } else {
            let memo = self
                .caches
                .memo(self.key())
                .filter(|m| appended.parent_id.as_deref() == Some(m.leaf.as_str()));
            let adjustment = match memo {
                Some(memo) => memo.adjustment,
                None => {
                    let overlaid = self.overlaid_token_estimate(None).await?.unwrap_or(raw);
                    raw.saturating_sub(overlaid)
                }
            };
            self.caches.remember(
                self.key(),
                Memo {
                    leaf: appended.id.to_string(),
                    adjustment,
                },
            );
            raw.saturating_sub(adjustment)
        };
        // The frozen system prompt goes to the model with the history, so it counts; a session
        // that never froze one has given the model none yet. Compaction cannot shrink it: when
        // it alone reaches the threshold, no run could bring the session back under it.
        let prompt = self.frozen_prompt_tokens(settings).await?;
        if estimate.saturating_add(prompt) > threshold && prompt < threshold {
            // At most half of what the prompt leaves stays as recent messages, so a run brings
            // the session back under the threshold even when `keepRecentTokens` is larger.
            self.compact_keeping(None, Some((threshold - prompt) / 2))
                .await?;
        }
        Ok(())
    }
}

//! Context blocks, the frozen system prompt and the AI tools (see `sessiondb_core::context`).
//!
//! A session sees its namespace's template blocks, then its own; a session block of a template's
//! label takes the template's place, and a session writing a template's text gets its own copy
//! (templates are shared, writes are not). Applications add blocks backed by their own sources
//! with [`Context::with_block`] and one provider trait per kind.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use sessiondb_core::context::{
    BlockDef, BlockKind, BlockView, ContextError, SEARCH_LIMIT, SkillTracker, ToolCall,
    ToolDefinition, WriteMode, entry_key, loading_call, merge_layers, render_prompt, results,
    rewrite_loading_part, rewrite_loading_result, search_results, search_summary, skill_id,
    skill_listing, tool_definitions, validate_entry_key, validate_label,
};
use sessiondb_core::{
    ContextEntry, FrozenPrompt, Message, SearchFilter, SessionKey, Source, Store, StoredMessage,
    ValidationError, ValidationErrorKind, WriteOp, WriteOutcome, message::validate_text, search,
};

use crate::compact::HistoryMark;
use crate::page::{Direction, Page, PageRequest, invalid_cursor};
use crate::{Db, Error, Session};

/// What a custom provider returns; its error becomes [`ContextError::Provider`].
pub type ProviderResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A readonly block's text (`None` renders as empty).
pub trait ReadonlyProvider: Send + Sync {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>>;
}

/// A writable block's text. Writes are checked against the block's `max_tokens` before `set`.
pub trait WritableProvider: Send + Sync {
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>>;
    fn set<'a>(&'a self, content: &'a str) -> BoxFuture<'a, ProviderResult<()>>;
}

/// Keyed skills loaded on demand.
pub trait SkillProvider: Send + Sync {
    /// The listing the prompt shows, as [`sessiondb_core::context::skill_listing`] words it.
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>>;
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ProviderResult<Option<String>>>;
    /// True when [`SkillProvider::set`] takes new entries (then `set_context` offers the block).
    fn writable(&self) -> bool {
        false
    }
    fn set<'a>(
        &'a self,
        _key: &'a str,
        _content: &'a str,
        _description: Option<&'a str>,
    ) -> BoxFuture<'a, ProviderResult<()>> {
        Box::pin(async { Err("this skill block does not take new entries".into()) })
    }
}

/// Keyed entries behind a search.
pub trait SearchProvider: Send + Sync {
    /// The summary the prompt shows (such as `12 entries indexed.`).
    fn get(&self) -> BoxFuture<'_, ProviderResult<Option<String>>>;
    /// Results formatted for the model (`None`: nothing found).
    fn search<'a>(&'a self, query: &'a str) -> BoxFuture<'a, ProviderResult<Option<String>>>;
    /// True when [`SearchProvider::set`] indexes new entries.
    fn writable(&self) -> bool {
        false
    }
    fn set<'a>(&'a self, _key: &'a str, _content: &'a str) -> BoxFuture<'a, ProviderResult<()>> {
        Box::pin(async { Err("this search block does not take new entries".into()) })
    }
}

#[derive(Clone)]
pub enum Provider {
    Readonly(Arc<dyn ReadonlyProvider>),
    Writable(Arc<dyn WritableProvider>),
    Skill(Arc<dyn SkillProvider>),
    Search(Arc<dyn SearchProvider>),
}

impl Provider {
    fn kind(&self) -> BlockKind {
        match self {
            Self::Readonly(_) => BlockKind::Readonly,
            Self::Writable(_) => BlockKind::Writable,
            Self::Skill(_) => BlockKind::Skill,
            Self::Search(_) => BlockKind::Search,
        }
    }

    fn writable(&self) -> bool {
        match self {
            Self::Readonly(_) => false,
            Self::Writable(_) => true,
            Self::Skill(p) => p.writable(),
            Self::Search(p) => p.writable(),
        }
    }

    async fn get(&self) -> Result<String, Error> {
        let text = match self {
            Self::Readonly(p) => p.get().await,
            Self::Writable(p) => p.get().await,
            Self::Skill(p) => p.get().await,
            Self::Search(p) => p.get().await,
        };
        Ok(text.map_err(provider_error)?.unwrap_or_default())
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Provider::{:?}", self.kind())
    }
}

fn provider_error(e: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Context(ContextError::Provider(e.to_string()))
}

/// A block an application backs with its own source.
#[derive(Debug, Clone)]
pub struct CustomBlock {
    pub label: String,
    pub description: Option<String>,
    pub max_tokens: Option<u64>,
    pub provider: Provider,
}

/// A stored block's definition, as [`Context::define`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpec {
    pub kind: BlockKind,
    pub description: Option<String>,
    pub max_tokens: Option<u64>,
    /// Text of a readonly or writable block; skill and search blocks take none (their entries
    /// come with [`Context::put_entry`]).
    pub content: String,
}

/// The context of one session, or of a namespace's templates ([`Db::context_templates`]).
#[derive(Debug)]
pub struct Context<S> {
    pub(crate) session: Session<S>,
    custom: Vec<CustomBlock>,
}

impl<S> Clone for Context<S> {
    fn clone(&self) -> Self {
        Self {
            session: self.session.clone(),
            custom: self.custom.clone(),
        }
    }
}

impl<S: Store> Session<S> {
    /// This session's context blocks, prompt and tools.
    pub fn context(&self) -> Context<S> {
        Context {
            session: self.clone(),
            custom: Vec::new(),
        }
    }

    /// `spec` as the block `label` of this scope, checked as [`Context::define`] checks it.
    pub(crate) fn checked_block(&self, label: &str, spec: BlockSpec) -> Result<BlockDef, Error> {
        check_label(label)?;
        self.check_text("content", &spec.content)?;
        if let Some(description) = &spec.description {
            self.check_text("description", description)?;
        }
        if spec.kind.is_keyed() && !spec.content.is_empty() {
            return Err(ValidationError::new(
                "content",
                ValidationErrorKind::WrongType {
                    expected: "absent for skill and search blocks (write their entries)",
                },
            )
            .into());
        }
        if spec.max_tokens == Some(0) {
            return Err(ValidationError::new(
                "maxTokens",
                ValidationErrorKind::OutOfRange {
                    min: 1,
                    max: u64::MAX,
                },
            )
            .into());
        }
        sessiondb_core::context::check_fits(label, spec.max_tokens, &spec.content)?;
        Ok(BlockDef {
            label: label.to_owned(),
            kind: spec.kind,
            description: spec.description.filter(|d| !d.is_empty()),
            max_tokens: spec.max_tokens,
            content: spec.content,
        })
    }

    /// An entry of the keyed block `label`, checked as [`Context::put_entry`] checks it.
    pub(crate) fn checked_entry(
        &self,
        label: &str,
        key: &str,
        content: &str,
        description: Option<&str>,
    ) -> Result<ContextEntry, Error> {
        check_label(label)?;
        validate_entry_key(key)?;
        self.check_text("content", content)?;
        if let Some(description) = description {
            self.check_text("description", description)?;
        }
        Ok(ContextEntry {
            key: key.to_owned(),
            content: content.to_owned(),
            description: description.filter(|d| !d.is_empty()).map(str::to_owned),
        })
    }
}

impl<S: Store> Db<S> {
    /// The namespace's template blocks, which every session of it sees. The prompt and the tools
    /// belong to sessions: use [`Session::context`] for those.
    pub fn context_templates(&self, namespace: &str) -> Result<Context<S>, Error> {
        if !namespace.is_empty() {
            sessiondb_core::message::validate_id("namespace", namespace)?;
        }
        Ok(Context {
            session: Session::new(
                self.store.clone(),
                self.options.clone(),
                self.caches.clone(),
                SessionKey::templates(namespace),
            ),
            custom: Vec::new(),
        })
    }
}

fn check_label(label: &str) -> Result<(), Error> {
    Ok(validate_label(label)?)
}

impl<S: Store> Context<S> {
    /// Adds a block backed by the application's provider after the stored ones (a stored block
    /// of the same label is then hidden). Lives in this handle only.
    pub fn with_block(mut self, block: CustomBlock) -> Self {
        self.custom.retain(|b| b.label != block.label);
        self.custom.push(block);
        self
    }

    fn key(&self) -> &SessionKey {
        self.session.key()
    }

    fn store(&self) -> &S {
        &self.session.store
    }

    fn check_text(&self, field: &str, text: &str) -> Result<(), Error> {
        Ok(self.session.check_text(field, text)?)
    }

    fn custom(&self, label: &str) -> Option<&CustomBlock> {
        self.custom.iter().find(|b| b.label == label)
    }

    async fn view_of_stored(&self, block: BlockDef) -> Result<BlockView, Error> {
        let content = match block.kind {
            BlockKind::Readonly | BlockKind::Writable => block.content,
            BlockKind::Skill => {
                let keys = self
                    .store()
                    .context_entry_keys(self.key(), &block.label)
                    .await?;
                skill_listing(keys.iter().map(|(k, d)| (k.as_str(), d.as_deref())))
            }
            BlockKind::Search => {
                let keys = self
                    .store()
                    .context_entry_keys(self.key(), &block.label)
                    .await?;
                search_summary(keys.len() as u64)
            }
        };
        Ok(BlockView::new(
            block.label,
            block.kind,
            block.description,
            block.max_tokens,
            content,
            stored_writable(block.kind),
        ))
    }

    /// Label, kind and writability of every block in prompt order, without reading any text or
    /// entry: what the tools check a call against.
    async fn kinds(&self) -> Result<Vec<(String, BlockKind, bool)>, Error> {
        let stored = merge_layers(self.store().context_blocks(self.key()).await?);
        let mut kinds: Vec<(String, BlockKind, bool)> = stored
            .into_iter()
            .filter(|b| self.custom(&b.label).is_none())
            .map(|b| (b.label, b.kind, stored_writable(b.kind)))
            .collect();
        kinds.extend(
            self.custom
                .iter()
                .map(|b| (b.label.clone(), b.provider.kind(), b.provider.writable())),
        );
        Ok(kinds)
    }

    /// Every block in prompt order, with its current content and token estimate: the stored
    /// ones (templates, then the session's), then the custom ones.
    pub async fn blocks(&self) -> Result<Vec<BlockView>, Error> {
        let stored = merge_layers(self.store().context_blocks(self.key()).await?);
        let mut blocks = Vec::with_capacity(stored.len() + self.custom.len());
        for block in stored {
            if self.custom(&block.label).is_none() {
                blocks.push(self.view_of_stored(block).await?);
            }
        }
        for block in &self.custom {
            blocks.push(BlockView::new(
                block.label.clone(),
                block.provider.kind(),
                block.description.clone(),
                block.max_tokens,
                block.provider.get().await?,
                block.provider.writable(),
            ));
        }
        Ok(blocks)
    }

    pub async fn block(&self, label: &str) -> Result<Option<BlockView>, Error> {
        Ok(self.blocks().await?.into_iter().find(|b| b.label == label))
    }

    /// Defines (or redefines) a stored block in this scope. Text beyond `max_tokens` is refused.
    pub async fn define(&self, label: &str, spec: BlockSpec) -> Result<BlockView, Error> {
        let block = self.session.checked_block(label, spec)?;
        self.session
            .write_one(WriteOp::PutBlock {
                block: block.clone(),
            })
            .await?;
        self.view_of_stored(block).await
    }

    /// Replaces a writable block's text.
    pub async fn set_block(&self, label: &str, content: &str) -> Result<BlockView, Error> {
        self.write_block(label, content, WriteMode::Replace).await
    }

    /// Adds to a writable block's text (on a new line); refused whole when the result would
    /// exceed `max_tokens`.
    pub async fn append_to_block(&self, label: &str, content: &str) -> Result<BlockView, Error> {
        self.write_block(label, content, WriteMode::Append).await
    }

    async fn write_block(
        &self,
        label: &str,
        text: &str,
        mode: WriteMode,
    ) -> Result<BlockView, Error> {
        check_label(label)?;
        self.check_text("content", text)?;
        if let Some(custom) = self.custom(label) {
            return self.write_custom(custom, text, mode).await;
        }
        let op = WriteOp::WriteBlock {
            label: label.to_owned(),
            text: text.to_owned(),
            mode,
        };
        match self.session.write_one(op).await? {
            WriteOutcome::BlockWritten(block) => self.view_of_stored(block).await,
            other => Err(unexpected(other)),
        }
    }

    async fn write_custom(
        &self,
        block: &CustomBlock,
        text: &str,
        mode: WriteMode,
    ) -> Result<BlockView, Error> {
        let Provider::Writable(provider) = &block.provider else {
            return Err(match block.provider.kind() {
                BlockKind::Readonly => ContextError::Readonly(block.label.clone()),
                _ => ContextError::Keyed(block.label.clone()),
            }
            .into());
        };
        let current = BlockDef {
            label: block.label.clone(),
            kind: BlockKind::Writable,
            description: block.description.clone(),
            max_tokens: block.max_tokens,
            content: provider
                .get()
                .await
                .map_err(provider_error)?
                .unwrap_or_default(),
        };
        let content = sessiondb_core::context::written_content(&current, text, mode)?;
        provider.set(&content).await.map_err(provider_error)?;
        Ok(BlockView::new(
            current.label,
            BlockKind::Writable,
            current.description,
            current.max_tokens,
            content,
            true,
        ))
    }

    /// Removes this scope's block of `label` with its entries; false when it had none.
    pub async fn delete_block(&self, label: &str) -> Result<bool, Error> {
        check_label(label)?;
        let op = WriteOp::DeleteBlock {
            label: label.to_owned(),
        };
        Ok(matches!(
            self.session.write_one(op).await?,
            WriteOutcome::Existed(true)
        ))
    }

    /// Stores an entry of a skill or search block (replacing this scope's entry of that key).
    pub async fn put_entry(
        &self,
        label: &str,
        key: &str,
        content: &str,
        description: Option<&str>,
    ) -> Result<(), Error> {
        let entry = self
            .session
            .checked_entry(label, key, content, description)?;
        if let Some(custom) = self.custom(label) {
            let written = match &custom.provider {
                Provider::Skill(p) => p.set(key, content, description).await,
                Provider::Search(p) => p.set(key, content).await,
                _ => return Err(ContextError::NotKeyed(label.to_owned()).into()),
            };
            return written.map_err(provider_error);
        }
        let op = WriteOp::PutEntry {
            label: label.to_owned(),
            entry,
        };
        self.session.write_one(op).await?;
        Ok(())
    }

    /// Deletes this scope's own entry of `key` (a session's template entry of that key then
    /// shows again); false when the scope holds none. A custom block's entries are its
    /// provider's and are not deleted here.
    pub async fn delete_entry(&self, label: &str, key: &str) -> Result<bool, Error> {
        check_label(label)?;
        validate_entry_key(key)?;
        if self.custom(label).is_some() {
            return Err(ContextError::NoWrites(label.to_owned()).into());
        }
        let op = WriteOp::DeleteEntry {
            label: label.to_owned(),
            key: key.to_owned(),
        };
        Ok(matches!(
            self.session.write_one(op).await?,
            WriteOutcome::Existed(true)
        ))
    }

    /// One stored entry (a custom skill block's `load`, without a description).
    pub async fn entry(&self, label: &str, key: &str) -> Result<Option<ContextEntry>, Error> {
        check_label(label)?;
        validate_entry_key(key)?;
        if let Some(custom) = self.custom(label) {
            let Provider::Skill(provider) = &custom.provider else {
                return Ok(None);
            };
            let content = provider.load(key).await.map_err(provider_error)?;
            return Ok(content.map(|content| ContextEntry {
                key: key.to_owned(),
                content,
                description: None,
            }));
        }
        Ok(self.store().context_entry(self.key(), label, key).await?)
    }

    /// Every stored entry of a skill or search block, by key; in a session, its own entry in
    /// place of its template's of the same key.
    pub async fn entries(&self, label: &str) -> Result<Vec<ContextEntry>, Error> {
        self.listed_entries(label, None, None).await
    }

    /// One page of [`Context::entries`]: ascending by key (as bytes), `request.after` a key
    /// (the `next_cursor` of the page before, or any valid key to start after it). Pages only
    /// go forward: `before` and `descending` are refused.
    pub async fn entry_page(
        &self,
        label: &str,
        request: &PageRequest,
    ) -> Result<Page<ContextEntry>, Error> {
        let (limit, direction) = request.checked()?;
        let Direction::Forward(after) = direction else {
            return Err(ValidationError::new(
                "before",
                ValidationErrorKind::WrongType {
                    expected: "absent: entries page forward by key",
                },
            )
            .into());
        };
        if request.descending {
            return Err(ValidationError::new(
                "order",
                ValidationErrorKind::WrongType {
                    expected: "ascending: entries page forward by key",
                },
            )
            .into());
        }
        if after.is_some_and(|key| validate_entry_key(key).is_err()) {
            return Err(invalid_cursor("after").into());
        }
        let mut items = self.listed_entries(label, after, Some(limit + 1)).await?;
        let more = items.len() > limit;
        items.truncate(limit);
        Ok(Page {
            next_cursor: more.then(|| items.last().map(|e| e.key.clone())).flatten(),
            previous_cursor: None,
            items,
        })
    }

    /// At most `keys` entries (all when `None`) with keys after `after`.
    async fn listed_entries(
        &self,
        label: &str,
        after: Option<&str>,
        keys: Option<usize>,
    ) -> Result<Vec<ContextEntry>, Error> {
        check_label(label)?;
        let kinds = self.kinds().await?;
        let Some((_, kind, _)) = kinds.iter().find(|(l, _, _)| l == label) else {
            return Err(ContextError::NotFound(label.to_owned()).into());
        };
        if !kind.is_keyed() {
            return Err(ContextError::NotKeyed(label.to_owned()).into());
        }
        if self.custom(label).is_some() {
            return Err(ContextError::Unlisted(label.to_owned()).into());
        }
        // A key has at most two rows (the session's and its template's), so twice as many rows
        // hold `keys` distinct keys whenever there are that many.
        let rows = keys.map(|n| n.saturating_mul(2));
        let scoped = self
            .store()
            .context_entries(self.key(), label, after, rows)
            .await?;
        let mut entries: Vec<ContextEntry> = Vec::new();
        // A session's entry comes before its template's of the same key and shadows it.
        for scoped in scoped {
            if entries
                .last()
                .is_none_or(|last| last.key != scoped.entry.key)
            {
                entries.push(scoped.entry);
            }
        }
        entries.truncate(keys.unwrap_or(usize::MAX));
        Ok(entries)
    }

    /// A search block's entries matching every word of `query`, formatted for the model;
    /// `None` when nothing matches.
    pub async fn search(&self, label: &str, query: &str) -> Result<Option<String>, Error> {
        check_label(label)?;
        if let Some(custom) = self.custom(label) {
            let Provider::Search(provider) = &custom.provider else {
                return Ok(None);
            };
            return provider.search(query).await.map_err(provider_error);
        }
        let words = search::query_words(query);
        let hits = self
            .store()
            .search_context(self.key(), label, &words, SEARCH_LIMIT)
            .await?;
        Ok(search_results(
            hits.iter().map(|(k, c)| (k.as_str(), c.as_str())),
        ))
    }

    /// The prompt the blocks render now (not frozen, not stored).
    pub async fn render(&self) -> Result<String, Error> {
        Ok(render_prompt(&self.blocks().await?))
    }

    /// The frozen system prompt: rendered and stored on the first call, the stored one after
    /// (even an empty one). Block writes never change it; [`Context::refresh_prompt`] does.
    pub async fn prompt(&self) -> Result<FrozenPrompt, Error> {
        if let Some(frozen) = self.store().prompt(self.key()).await? {
            return Ok(frozen);
        }
        self.freeze(false).await
    }

    /// Re-renders the prompt from the blocks as they are and stores it.
    pub async fn refresh_prompt(&self) -> Result<FrozenPrompt, Error> {
        self.freeze(true).await
    }

    async fn freeze(&self, replace: bool) -> Result<FrozenPrompt, Error> {
        if self.key().is_templates() {
            return Err(ValidationError::new("sessionId", ValidationErrorKind::Missing).into());
        }
        let prompt = self.render().await?;
        // Stored blocks never hold a NUL (their writes refuse it); a custom provider's text
        // can, and the frozen prompt is stored free text.
        validate_text("prompt", &prompt)?;
        match self
            .session
            .write_one(WriteOp::FreezePrompt { prompt, replace })
            .await?
        {
            WriteOutcome::Prompt(frozen) => Ok(frozen),
            other => Err(unexpected(other)),
        }
    }

    /// The tools the blocks call for; `session_search` adds the cross-session search tool.
    pub async fn tools(&self, session_search: bool) -> Result<Vec<ToolDefinition>, Error> {
        let blocks = self.blocks().await?;
        let loaded: Vec<String> = if blocks.iter().any(|b| b.kind == BlockKind::Skill) {
            self.loaded_skills().await?.into_iter().collect()
        } else {
            Vec::new()
        };
        Ok(tool_definitions(&blocks, &loaded, session_search))
    }

    /// Runs one tool call by name with JSON arguments (an object, or its JSON text). Never
    /// fails: refusals and faults come back as `Error: …` strings for the model.
    pub async fn execute(&self, name: &str, arguments: &Value) -> String {
        let call = match ToolCall::parse(name, arguments) {
            Ok(call) => call,
            Err(message) => return results::error(message),
        };
        match self.run(call).await {
            Ok(output) => output,
            Err(e) => results::error(e),
        }
    }

    async fn run(&self, call: ToolCall) -> Result<String, Error> {
        match call {
            ToolCall::SetContext {
                label,
                content,
                mode,
                title,
                description,
            } => {
                let kinds = self.kinds().await?;
                let Some(&(_, kind, writable)) = kinds.iter().find(|(l, ..)| *l == label) else {
                    return Ok(results::block_not_found(&label));
                };
                if !kind.is_keyed() {
                    let written = self.write_block(&label, &content, mode).await?;
                    return Ok(results::written(&written));
                }
                if !writable {
                    return Err(ContextError::NoWrites(label).into());
                }
                let key = entry_key(title.as_deref(), &content);
                let description = match kind {
                    BlockKind::Skill => description.or(title),
                    _ => None,
                };
                self.put_entry(&label, &key, &content, description.as_deref())
                    .await?;
                Ok(results::indexed(&key, &label))
            }
            ToolCall::LoadContext { label, key } => {
                let kinds = self.kinds().await?;
                let skills = labels_of(&kinds, BlockKind::Skill);
                if !skills.contains(&label.as_str()) {
                    return Ok(results::not_skill(&label, &skills));
                }
                let Some(entry) = self.entry(&label, &key).await? else {
                    return Ok(results::not_found(&key));
                };
                let (mark, mut loaded) = self.skills_and_mark().await?;
                loaded.insert(skill_id(&label, &key));
                self.session.caches.set_skills(self.key(), mark, loaded);
                Ok(entry.content)
            }
            ToolCall::UnloadContext { label, key } => {
                let kinds = self.kinds().await?;
                let skills = labels_of(&kinds, BlockKind::Skill);
                if !skills.contains(&label.as_str()) {
                    return Ok(results::not_skill(&label, &skills));
                }
                let (_, mut loaded) = self.skills_and_mark().await?;
                if !loaded.remove(&skill_id(&label, &key)) {
                    return Ok(results::not_loaded(&key, &label));
                }
                self.rewrite_loading(&label, &key).await?;
                // The set holds for the session as the rewrite left it: an older load result
                // of the key still stands in history until the unload's own result is stored.
                let mark = self.history_mark().await?;
                self.session.caches.set_skills(self.key(), mark, loaded);
                Ok(results::unloaded(&key, &label))
            }
            ToolCall::SearchContext { label, query } => {
                let kinds = self.kinds().await?;
                let searchable = labels_of(&kinds, BlockKind::Search);
                if !searchable.contains(&label.as_str()) {
                    return Ok(results::not_searchable(&label, &searchable));
                }
                Ok(self
                    .search(&label, &query)
                    .await?
                    .unwrap_or_else(|| results::NO_RESULTS.into()))
            }
            ToolCall::SessionSearch { query } => {
                let words = search::query_words(query.as_str());
                let every = SearchFilter::default();
                let hits = self
                    .store()
                    .search_namespace(&self.key().namespace, None, &words, &every, SEARCH_LIMIT)
                    .await?;
                Ok(results::session_hits(
                    hits.iter().map(|h| (h.role.as_str(), h.content.as_str())),
                ))
            }
        }
    }

    /// Skills loaded in this session as `label:key`: rebuilt from the active path's assistant
    /// and tool rows (raw, so compacted ranges count), then kept by the tools: once per process,
    /// or on a shared store whenever the session changed since (another instance may have
    /// loaded or unloaded one).
    pub async fn loaded_skills(&self) -> Result<BTreeSet<String>, Error> {
        Ok(self.skills_and_mark().await?.1)
    }

    /// [`Context::loaded_skills`] and the mark of the session they hold for.
    async fn skills_and_mark(&self) -> Result<(Option<HistoryMark>, BTreeSet<String>), Error> {
        let caches = &self.session.caches;
        let mark = self.history_mark().await?;
        if let Some(loaded) = caches.skills(self.key(), mark.as_ref()) {
            return Ok((mark, loaded));
        }
        let mut tracker = SkillTracker::default();
        for batch in self.tool_rows().await?.chunks(SCAN_BATCH) {
            for message in self.store().fetch(self.key(), batch).await? {
                tracker.observe(&message.to_value());
            }
        }
        let loaded = tracker.into_loaded();
        caches.set_skills(self.key(), mark.clone(), loaded.clone());
        Ok((mark, loaded))
    }

    /// The session's mark on a shared store (one row read), for the loaded skills to hold for;
    /// `None` otherwise, where they hold until this process changes them.
    async fn history_mark(&self) -> Result<Option<HistoryMark>, Error> {
        if !self.session.caches.shared() {
            return Ok(None);
        }
        let info = self.store().session(self.key()).await?;
        Ok(Some(HistoryMark::of(info.as_ref())))
    }

    /// Seqs of the active path's assistant and tool rows, oldest first (no content read).
    async fn tool_rows(&self) -> Result<Vec<i64>, Error> {
        let path = self.store().path(self.key(), None).await?;
        Ok(path
            .rows
            .iter()
            .filter(|r| r.role == "assistant" || r.role == "tool")
            .map(|r| r.seq)
            .collect())
    }

    /// Rewrites the newest standing result that loaded `label`/`key` to the unloaded marker,
    /// reading the path newest first and stopping there.
    async fn rewrite_loading(&self, label: &str, key: &str) -> Result<(), Error> {
        let seqs = self.tool_rows().await?;
        // Tool messages newer than the assistant message being read, by the call they answer.
        let mut answers: Vec<StoredMessage> = Vec::new();
        for batch in seqs.rchunks(SCAN_BATCH) {
            let newest_first: Vec<i64> = batch.iter().rev().copied().collect();
            for message in self.store().fetch(self.key(), &newest_first).await? {
                let mut value = message.to_message().into_value();
                if message.role == "tool" {
                    answers.push(message);
                    continue;
                }
                if rewrite_loading_part(&mut value, label, key) {
                    return self.rewrite(value).await;
                }
                let Some(call) = loading_call(&value, label, key) else {
                    continue;
                };
                for answer in &answers {
                    let mut answer = answer.to_message().into_value();
                    if rewrite_loading_result(&mut answer, call, key) {
                        return self.rewrite(answer).await;
                    }
                }
            }
        }
        Ok(())
    }

    async fn rewrite(&self, message: Value) -> Result<(), Error> {
        self.session
            .update(Message::from_value(message)?, Source::Server)
            .await?;
        Ok(())
    }
}

/// Rows a skill scan reads per fetch.
const SCAN_BATCH: usize = 16;

fn labels_of(kinds: &[(String, BlockKind, bool)], kind: BlockKind) -> Vec<&str> {
    kinds
        .iter()
        .filter(|(_, k, _)| *k == kind)
        .map(|(label, ..)| label.as_str())
        .collect()
}

/// Stored blocks of every kind but readonly take writes (text, or new entries).
fn stored_writable(kind: BlockKind) -> bool {
    kind != BlockKind::Readonly
}

fn unexpected(outcome: WriteOutcome) -> Error {
    sessiondb_core::StoreError::Corrupt(format!("unexpected write outcome {outcome:?}")).into()
}

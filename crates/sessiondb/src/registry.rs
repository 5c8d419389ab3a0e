//! The session registry (create, list, patch, delete), compactions, state and paginated message
//! lists.

use serde_json::Value;
use sessiondb_core::message::{validate_id, validate_texts};
use sessiondb_core::registry::{
    keeps_when_idle, state_text, validate_settings, validate_state_key,
};
use sessiondb_core::{
    Compaction, PathPlan, SearchFilter, SearchHit, SessionCursor, SessionInfo, SessionPatch,
    SessionQuery, SessionRecord, SessionSort, Store, StoreError, StoredMessage, Usage,
    ValidationError, ValidationErrorKind, WriteOp, WriteOutcome, search,
};

use crate::page::{
    Direction, Page, PageRequest, assemble, decode_cursor, encode_cursor, invalid_cursor,
};
use crate::session::{now_ms, unique_id};
use crate::{Db, Error, Session, tokenizers};

/// A listing of a namespace's sessions.
#[derive(Debug, Clone, Default)]
pub struct SessionListing {
    pub page: PageRequest,
    pub sort: SessionSort,
    /// Only sessions created with this `user_id`.
    pub user_id: Option<String>,
}

/// Ready at the second poll: the first wakes the task and returns `Pending`, so the executor
/// runs other tasks (or drops this one) before it goes on.
fn yield_now() -> impl std::future::Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

pub(crate) fn check_record(record: &SessionRecord) -> Result<(), ValidationError> {
    if let Some(parent) = &record.parent_session_id {
        validate_id("parentSessionId", parent)?;
    }
    if let Some(user) = &record.user_id {
        validate_id("userId", user)?;
    }
    validate_texts([
        ("name", record.name.as_deref()),
        ("model", record.model.as_deref()),
        ("source", record.source.as_deref()),
        ("endReason", record.end_reason.as_deref()),
    ])?;
    validate_settings(&record.settings)?;
    tokenizers::chosen(&record.settings)?;
    if record.settings.values().any(Value::is_null) {
        return Err(ValidationError::new(
            "settings",
            ValidationErrorKind::WrongType {
                expected: "an object without null values",
            },
        ));
    }
    Ok(())
}

/// Sessions listed, and then deleted in one commit, at a time by sweeps and erasures.
const DELETE_PAGE: usize = 100;

impl<S: Store> Db<S> {
    /// Registers a session (with a generated `ses_…` id when `id` is `None`). Fails with
    /// [`Error::SessionExists`] when the id is taken.
    pub async fn create_session(
        &self,
        namespace: &str,
        id: Option<String>,
        record: SessionRecord,
    ) -> Result<SessionInfo, Error> {
        check_record(&record)?;
        if let Some(id) = &id {
            validate_id("id", id)?;
        }
        let id = id.unwrap_or_else(|| unique_id("ses_"));
        let session = self.session_in(namespace, &id)?;
        let create = WriteOp::CreateSession {
            record,
            created_at: None,
        };
        match session.write_one(create).await? {
            WriteOutcome::SessionCreated { created: true } => {
                session.info().await?.ok_or_else(|| {
                    StoreError::Corrupt(format!("created session `{id}` vanished")).into()
                })
            }
            _ => Err(Error::SessionExists { id }),
        }
    }

    /// One page of a namespace's sessions.
    pub async fn list_sessions(
        &self,
        namespace: &str,
        listing: &SessionListing,
    ) -> Result<Page<SessionInfo>, Error> {
        let (limit, direction) = listing.page.checked()?;
        let (after, descending) = match &direction {
            Direction::Forward(after) => (*after, listing.page.descending),
            Direction::Backward(before) => (Some(*before), !listing.page.descending),
        };
        let field = match direction {
            Direction::Forward(_) => "after",
            Direction::Backward(_) => "before",
        };
        let after = after
            .map(|c| decode_cursor(field, c).map(|(value, id)| SessionCursor { value, id }))
            .transpose()?;
        let query = SessionQuery {
            sort: listing.sort,
            descending,
            after,
            user_id: listing.user_id.clone(),
            limit: limit + 1,
        };
        let read = self.store.list_sessions(namespace, &query).await?;
        let sort = listing.sort;
        Ok(assemble(read, limit, &direction, |info| {
            encode_cursor(sort.value_of(info), &info.id)
        }))
    }

    /// Deletes the namespace's sessions last written (`updatedAt`) before `before_ms` (epoch
    /// milliseconds), each with everything in it, as [`Session::delete_session`] does; returns
    /// how many. Sessions go oldest first, a page at a time (a page's deletes go to the store
    /// together: [`Store::write_all`]), and the writer checks each one's time again, so a session
    /// written after it was listed stays. A session whose settings hold `keepWhenIdle: true`
    /// stays too (setting it is a write, so it also saves a session a sweep has just listed).
    pub async fn delete_sessions_updated_before(
        &self,
        namespace: &str,
        before_ms: i64,
    ) -> Result<u64, Error> {
        let mut sweeper = IdleSweeper::default();
        Ok(self
            .sweep_idle_sessions(namespace, before_ms, &mut sweeper)
            .await?
            .deleted)
    }

    /// [`Db::delete_sessions_updated_before`] for a sweep that runs again and again over one
    /// namespace: `sweeper` remembers where the sessions kept when idle end, so the next sweep
    /// starts after them instead of listing them all again (see [`IdleSweeper`]).
    pub async fn sweep_idle_sessions(
        &self,
        namespace: &str,
        before_ms: i64,
        sweeper: &mut IdleSweeper,
    ) -> Result<IdleSweep, Error> {
        let started_ms = now_ms();
        let mut sweep = IdleSweep::default();
        let mut after = sweeper.start();
        loop {
            let query = SessionQuery {
                sort: SessionSort::UpdatedAt,
                descending: false,
                after: after.clone(),
                user_id: None,
                limit: DELETE_PAGE,
            };
            let page = self.store.list_sessions(namespace, &query).await?;
            let idle = page
                .iter()
                .take_while(|info| info.updated_at < before_ms)
                .count();
            let (kept, unkept): (Vec<_>, Vec<_>) = page[..idle]
                .iter()
                .partition(|info| keeps_when_idle(&info.record.settings));
            sweep.kept += kept.len() as u64;
            sweep.deleted += self
                .delete_together(namespace, unkept, Some(before_ms))
                .await?;
            if let Some(last) = page[..idle].last() {
                after = Some(SessionCursor {
                    value: last.updated_at,
                    id: last.id.clone(),
                });
            }
            // A page not idle to its end (or not full) was the last one.
            if idle < DELETE_PAGE {
                sweeper.finished(after, started_ms);
                return Ok(sweep);
            }
            // The embedded store's calls complete within their first poll, so without this a
            // sweep of a large backlog would hold its executor thread to the end, and a server
            // stopping could not drop it between pages.
            yield_now().await;
        }
    }

    /// Deletes every session of `user_id` in the namespace (those [`Db::list_sessions`] lists
    /// for that user), each with everything in it, as [`Session::delete_session`] does; returns
    /// how many. This is how what a user left is erased: sessions go a page at a time, oldest
    /// created first, each page's deletes in one commit ([`Store::write_all`]). Each session
    /// goes whole or stays whole, so a call that fails part-way can simply be made again; a
    /// session created for the user while a call runs may outlive it.
    pub async fn delete_user_sessions(&self, namespace: &str, user_id: &str) -> Result<u64, Error> {
        let mut deleted = 0;
        let mut after = None;
        loop {
            let query = SessionQuery {
                sort: SessionSort::CreatedAt,
                descending: false,
                after,
                user_id: Some(user_id.to_owned()),
                limit: DELETE_PAGE,
            };
            let page = self.store.list_sessions(namespace, &query).await?;
            deleted += self.delete_together(namespace, &page, None).await?;
            match page.last() {
                Some(last) if page.len() == DELETE_PAGE => {
                    after = Some(SessionCursor {
                        value: last.created_at,
                        id: last.id.clone(),
                    })
                }
                _ => return Ok(deleted),
            }
            // As in a sweep: the embedded store's calls complete within their first poll.
            yield_now().await;
        }
    }

    /// Deletes `listed` (sessions of `namespace`) in one commit, each only if not written since
    /// `updated_before` when given; returns how many were deleted.
    async fn delete_together<'a>(
        &self,
        namespace: &str,
        listed: impl IntoIterator<Item = &'a SessionInfo>,
        updated_before: Option<i64>,
    ) -> Result<u64, Error> {
        let sessions = listed
            .into_iter()
            .map(|info| self.session_in(namespace, &info.id))
            .collect::<Result<Vec<_>, _>>()?;
        if sessions.is_empty() {
            return Ok(0);
        }
        let deletes = sessions
            .iter()
            .map(|s| s.request(vec![WriteOp::DeleteSession { updated_before }]))
            .collect();
        let outcomes = self.store.write_all(deletes).await;
        for session in &sessions {
            self.caches.forget(session.key());
        }
        let mut deleted = 0;
        for written in outcomes {
            deleted += u64::from(written?.outcomes == [WriteOutcome::Existed(true)]);
        }
        Ok(deleted)
    }

    /// Full-text search across a namespace's sessions (optionally one user's), best first.
    pub async fn search_all(
        &self,
        namespace: &str,
        user_id: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, Error> {
        let filter = SearchFilter::default();
        self.search_all_filtered(namespace, user_id, query, &filter, limit)
            .await
    }

    /// [`Db::search_all`] keeping only the matches `filter` keeps (one role's, a time range's).
    pub async fn search_all_filtered(
        &self,
        namespace: &str,
        user_id: Option<&str>,
        query: &str,
        filter: &SearchFilter,
        limit: usize,
    ) -> Result<Vec<SearchHit>, Error> {
        let words = search::query_words(query);
        Ok(self
            .store
            .search_namespace(namespace, user_id, &words, filter, limit)
            .await?)
    }
}

impl<S: Store> Session<S> {
    /// The registry record and aggregates; `None` for a session never written. The token
    /// estimate counts compaction summaries in place of the rows they stand for.
    pub async fn info(&self) -> Result<Option<SessionInfo>, Error> {
        let Some(mut info) = self.store.session(self.key()).await? else {
            return Ok(None);
        };
        if info.stats.has_compactions
            && let Some(tokens) = self.overlaid_token_estimate(None).await?
        {
            info.stats.token_estimate = tokens;
        }
        Ok(Some(info))
    }

    /// Applies a patch (shallow metadata merge, usage added to counters). `None` when the
    /// session does not exist.
    pub async fn patch(&self, patch: SessionPatch) -> Result<Option<SessionInfo>, Error> {
        patch.validate()?;
        if let Some(settings) = &patch.settings {
            tokenizers::chosen(settings)?;
        }
        match self.write_one(WriteOp::PatchSession { patch }).await? {
            WriteOutcome::Existed(true) => self.info().await,
            _ => Ok(None),
        }
    }

    /// Adds model usage to the session's counters (and touches `updatedAt`). `None` when the
    /// session does not exist.
    pub async fn add_usage(&self, usage: Usage) -> Result<Option<SessionInfo>, Error> {
        self.patch(SessionPatch {
            usage: Some(usage),
            ..Default::default()
        })
        .await
    }

    /// Removes the session with its messages, compactions and state. Returns whether it existed.
    pub async fn delete_session(&self) -> Result<bool, Error> {
        Ok(matches!(
            self.write_one(WriteOp::DeleteSession {
                updated_before: None,
            })
            .await?,
            WriteOutcome::Existed(true)
        ))
    }

    /// Stores a compaction overlay: reads show `summary` in place of the rows from `from` to
    /// `to` on any path that holds both (in that order). Rows are never deleted.
    pub async fn add_compaction(
        &self,
        summary: String,
        from: String,
        to: String,
    ) -> Result<Compaction, Error> {
        validate_id("fromMessageId", &from)?;
        validate_id("toMessageId", &to)?;
        self.check_text("summary", &summary)?;
        let compaction = Compaction {
            id: unique_id(""),
            summary,
            from_message_id: from,
            to_message_id: to,
            created_at: now_ms(),
        };
        self.write_one(WriteOp::AddCompaction {
            compaction: compaction.clone(),
            by_compact: false,
        })
        .await?;
        Ok(compaction)
    }

    /// Compactions in creation order.
    pub async fn compactions(&self) -> Result<Vec<Compaction>, Error> {
        Ok(self.store.compactions(self.key()).await?)
    }

    pub async fn state(&self, name: &str) -> Result<Option<Value>, Error> {
        match self.store.state(self.key(), name).await? {
            Some(text) => Ok(Some(parse_state(&text)?)),
            None => Ok(None),
        }
    }

    /// Sets a state key to any JSON value (creating the session when needed). A `Value` holds
    /// no NaN or infinity by construction; [`Session::set_state_json`] takes JSON text.
    pub async fn set_state(&self, name: &str, value: &Value) -> Result<(), Error> {
        self.write_one(self.put_state_op(name, value)?).await?;
        Ok(())
    }

    /// Sets a state key from JSON text. Anything that is not one JSON value (`NaN`,
    /// `Infinity`, `undefined`, a function, trailing text) is a validation error.
    pub async fn set_state_json(&self, name: &str, json: &str) -> Result<Value, Error> {
        let value: Value = serde_json::from_str(json).map_err(|e| {
            ValidationError::new(
                "value",
                ValidationErrorKind::NotJson {
                    reason: e.to_string(),
                },
            )
        })?;
        self.set_state(name, &value).await?;
        Ok(value)
    }

    pub(crate) fn put_state_op(&self, name: &str, value: &Value) -> Result<WriteOp, Error> {
        validate_state_key(name)?;
        let value = state_text(value);
        self.check_size("value", value.len() as u64)?;
        Ok(WriteOp::PutState {
            name: name.to_owned(),
            value,
        })
    }

    /// Returns whether the key existed.
    pub async fn delete_state(&self, name: &str) -> Result<bool, Error> {
        Ok(matches!(
            self.write_one(WriteOp::DeleteState {
                name: name.to_owned()
            })
            .await?,
            WriteOutcome::Existed(true)
        ))
    }

    /// Every state key with its value, by key.
    pub async fn state_entries(&self) -> Result<Vec<(String, Value)>, Error> {
        self.store
            .state_entries(self.key())
            .await?
            .into_iter()
            .map(|(name, text)| Ok((name, parse_state(&text)?)))
            .collect()
    }

    /// One page of the active path's messages (raw rows; overlays do not apply), with message
    /// ids as cursors. A cursor that is not on the active path is refused.
    pub async fn list_messages(&self, request: &PageRequest) -> Result<Page<StoredMessage>, Error> {
        let (limit, direction) = request.checked()?;
        let read = match self.store.path_plan(self.key(), None).await? {
            PathPlan::Range { first, last } => {
                self.page_of_range(first, last, limit + 1, request.descending, &direction)
                    .await?
            }
            PathPlan::Rows(rows) => {
                let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
                self.page_of_path(seqs, limit + 1, request.descending, &direction)
                    .await?
            }
            PathPlan::Overlaid => {
                let rows = self.store.path(self.key(), None).await?.rows;
                let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
                self.page_of_path(seqs, limit + 1, request.descending, &direction)
                    .await?
            }
        };
        let read = self.resolved(read).await?;
        Ok(assemble(read, limit, &direction, |m| m.id.to_string()))
    }

    /// The seq of a cursor message when it lies within `first..=last`.
    async fn cursor_seq(
        &self,
        field: &str,
        id: &str,
        on_path: impl Fn(i64) -> bool,
    ) -> Result<i64, Error> {
        match self.store.message(self.key(), id).await? {
            Some(m) if on_path(m.seq) => Ok(m.seq),
            _ => Err(invalid_cursor(field).into()),
        }
    }

    /// A page of a dense path (its rows are exactly the seqs `first..=last`): one range read.
    async fn page_of_range(
        &self,
        first: i64,
        last: i64,
        rows: usize,
        descending: bool,
        direction: &Direction<'_>,
    ) -> Result<Vec<StoredMessage>, Error> {
        let in_range = |seq: i64| (first..=last).contains(&seq);
        // Which way the read runs from where, in seq terms.
        let (upward, from) = match direction {
            Direction::Forward(None) => (!descending, None),
            Direction::Forward(Some(id)) => (
                !descending,
                Some(self.cursor_seq("after", id, in_range).await?),
            ),
            Direction::Backward(id) => (
                descending,
                Some(self.cursor_seq("before", id, in_range).await?),
            ),
        };
        let key = self.key();
        Ok(if upward {
            let start = from.map_or(first, |s| s + 1);
            self.store
                .fetch_range(key, start, last, rows, u64::MAX)
                .await?
        } else {
            let end = from.map_or(last, |s| s - 1);
            self.store.fetch_range_newest(key, first, end, rows).await?
        })
    }

    /// A page of a path given by its seqs, root first.
    async fn page_of_path(
        &self,
        mut seqs: Vec<i64>,
        rows: usize,
        descending: bool,
        direction: &Direction<'_>,
    ) -> Result<Vec<StoredMessage>, Error> {
        if descending {
            seqs.reverse();
        }
        let position = |field: &str, seq: i64| {
            seqs.iter()
                .position(|&s| s == seq)
                .ok_or_else(|| Error::from(invalid_cursor(field)))
        };
        let window = match direction {
            Direction::Forward(None) => 0..seqs.len().min(rows),
            Direction::Forward(Some(after)) => {
                let seq = self.cursor_seq("after", after, |_| true).await?;
                let start = position("after", seq)? + 1;
                start..seqs.len().min(start + rows)
            }
            Direction::Backward(before) => {
                let seq = self.cursor_seq("before", before, |_| true).await?;
                let end = position("before", seq)?;
                end.saturating_sub(rows)..end
            }
        };
        let mut wanted = seqs[window].to_vec();
        if matches!(direction, Direction::Backward(_)) {
            wanted.reverse();
        }
        Ok(self.store.fetch(self.key(), &wanted).await?)
    }
}

fn parse_state(text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("state value: {e}")).into())
}

/// What a namespace's sweeps for idle sessions remember from one to the next: the place (in the
/// order of `updatedAt`, then id) up to which every session, when last swept, was idle and kept
/// (`keepWhenIdle`), so the next sweep starts after it. Sessions only move away from there: a
/// write stamps its session with the writer's time, later than anything a sweep found idle. A
/// clock set back, or another server on the same PostgreSQL database whose clock runs behind by
/// more than the idle time, could stamp a session before that place, so every tenth sweep starts
/// again from the oldest session.
#[derive(Debug, Clone, Default)]
pub struct IdleSweeper {
    kept_through: Option<SessionCursor>,
    /// Sweeps since the last one that started from the oldest session.
    resumed: u32,
}

impl IdleSweeper {
    const FULL_SWEEP_EVERY: u32 = 10;

    fn start(&mut self) -> Option<SessionCursor> {
        self.resumed += 1;
        if self.resumed == Self::FULL_SWEEP_EVERY || self.kept_through.is_none() {
            self.resumed = 0;
            self.kept_through = None;
        }
        self.kept_through.clone()
    }

    /// After a sweep whose last idle session (or, finding none, its start) was `swept_through`:
    /// every session that stayed at or before it is kept, and a place stamped before the sweep
    /// started is one that no later write can sort at or before.
    fn finished(&mut self, swept_through: Option<SessionCursor>, started_ms: i64) {
        self.kept_through = swept_through.filter(|place| place.value < started_ms);
    }
}

/// What one sweep for idle sessions did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleSweep {
    /// Sessions deleted.
    pub deleted: u64,
    /// Idle sessions listed and left because they are kept when idle.
    pub kept: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn yield_now_is_pending_once_and_wakes_its_task() {
        let waker_state = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(waker_state.clone());
        let mut cx = Context::from_waker(&waker);
        let mut yielding = std::pin::pin!(super::yield_now());
        assert!(yielding.as_mut().poll(&mut cx).is_pending());
        assert_eq!(waker_state.0.load(Ordering::SeqCst), 1);
        assert_eq!(yielding.as_mut().poll(&mut cx), Poll::Ready(()));
    }
}

//! SessionManager operations that make one session from another: fork and split.

use sessiondb_core::{
    Message, Parent, SessionInfo, SessionPatch, SessionRecord, Store, StoreError, WINDOW_MAX_ROWS,
    WriteOp,
};

use sessiondb_core::message::{validate_id, validate_text};

use crate::session::{Session, unique_id};
use crate::{Error, Source};

/// The text that opens a continuation session made by [`Session::split`].
pub const SPLIT_PREFIX: &str = "[Context from previous session]\n\n";

impl<S: Store> Session<S> {
    /// The record a derived session starts from: this one's model, source and owner, with this
    /// session as its parent.
    fn derived_record(&self, info: &SessionInfo, name: Option<String>) -> SessionRecord {
        SessionRecord {
            name,
            parent_session_id: Some(self.id().to_owned()),
            model: info.record.model.clone(),
            source: info.record.source.clone(),
            user_id: info.record.user_id.clone(),
            ..Default::default()
        }
    }

    /// Fails when a session `id` exists already.
    async fn ensure_new(&self, id: &str) -> Result<Session<S>, Error> {
        let target = self.sibling(id)?;
        if self.store.session(target.key()).await?.is_some() {
            return Err(Error::SessionExists { id: id.to_owned() });
        }
        Ok(target)
    }

    /// Copies the path ending at `at_message_id` into a new session (`id`, or a generated
    /// `ses_…`), in one atomic write: the raw rows (overlays neither applied nor copied, hidden
    /// echoes left out) with fresh message ids, chained from a new root; the new session's
    /// parent is this one and it keeps this one's model, source and owner. `None` when this
    /// session has no such message.
    pub async fn fork(
        &self,
        at_message_id: &str,
        id: Option<String>,
        name: Option<String>,
    ) -> Result<Option<SessionInfo>, Error> {
        if let Some(name) = &name {
            validate_text("name", name)?;
        }
        if let Some(id) = &id {
            validate_id("id", id)?;
        }
        let Some(info) = self.store.session(self.key()).await? else {
            return Ok(None);
        };
        if self.message(at_message_id).await?.is_none() {
            return Ok(None);
        }
        let id = id.unwrap_or_else(|| unique_id("ses_"));
        let target = self.ensure_new(&id).await?;
        let mut rows = self.store.path(self.key(), Some(at_message_id)).await?.rows;
        self.drop_hidden(&mut rows, |r| &r.id).await?;
        let mut ops = vec![WriteOp::CreateSession {
            record: self.derived_record(&info, name.or(info.record.name.clone())),
            created_at: None,
        }];
        let mut parent = Parent::Root;
        let settings = target.write_settings().await?;
        for window in rows.chunks(WINDOW_MAX_ROWS) {
            let seqs: Vec<i64> = window.iter().map(|r| r.seq).collect();
            for stored in self.store.fetch(self.key(), &seqs).await? {
                let mut message = stored.to_message().into_value();
                if let Some(fields) = message.as_object_mut() {
                    fields.shift_remove("id");
                }
                ops.push(WriteOp::Append {
                    message: target
                        .prepare(Message::from_value(message)?, Source::Server, &settings)
                        .await?,
                    parent: std::mem::replace(&mut parent, Parent::ActiveLeaf),
                });
            }
        }
        target.write(ops).await?;
        Ok(Some(created(&target).await?))
    }

    /// Ends this session with reason `compaction` and starts its continuation: a new session
    /// (named `name`, else this one's name, else `Compacted`) whose first message is an
    /// assistant message carrying `summary`. `None` when this session does not exist.
    pub async fn split(
        &self,
        summary: &str,
        name: Option<String>,
    ) -> Result<Option<SessionInfo>, Error> {
        if let Some(name) = &name {
            validate_text("name", name)?;
        }
        let Some(info) = self.store.session(self.key()).await? else {
            return Ok(None);
        };
        let target = self.ensure_new(&unique_id("ses_")).await?;
        let name = name
            .or_else(|| info.record.name.clone())
            .unwrap_or_else(|| "Compacted".to_owned());
        let opening = Message::text("assistant", format!("{SPLIT_PREFIX}{summary}"));
        let settings = target.write_settings().await?;
        target
            .write(vec![
                WriteOp::CreateSession {
                    record: self.derived_record(&info, Some(name)),
                    created_at: None,
                },
                WriteOp::Append {
                    message: target.prepare(opening, Source::Server, &settings).await?,
                    parent: Parent::Root,
                },
            ])
            .await?;
        self.patch(SessionPatch {
            end_reason: Some("compaction".to_owned()),
            ..Default::default()
        })
        .await?;
        Ok(Some(created(&target).await?))
    }
}

async fn created<S: Store>(session: &Session<S>) -> Result<SessionInfo, Error> {
    session.info().await?.ok_or_else(|| {
        StoreError::Corrupt(format!("created session `{}` vanished", session.id())).into()
    })
}

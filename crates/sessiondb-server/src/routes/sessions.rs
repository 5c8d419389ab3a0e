//! `/v1/sessions`: the session registry.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sessiondb::{
    PageRequest, SessionListing, SessionPatch, SessionRecord, SessionSort, Store, Usage,
};

use crate::App;
use crate::error::ApiError;
use crate::extract::{JsonBody, Params, QueryParams, Tenant};
use crate::wire::{self, Fields, value_response};

pub(crate) async fn create<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "session")?;
    let id = f.opt_string("id")?;
    let record = SessionRecord {
        name: f.opt_string("name")?,
        parent_session_id: f.opt_string("parentSessionId")?,
        model: f.opt_string("model")?,
        source: f.opt_string("source")?,
        user_id: f.opt_string("userId")?,
        metadata: f.opt_object("metadata")?.unwrap_or_default(),
        settings: f.opt_object("settings")?.unwrap_or_default(),
        ..Default::default()
    };
    f.finish()?;
    let info = app.db.create_session(&ns, id, record).await?;
    Ok(value_response(StatusCode::CREATED, &wire::session(&info)))
}

/// `?order=asc|desc` (default `desc`).
pub(crate) fn descending(order: Option<&str>, default_descending: bool) -> Result<bool, ApiError> {
    match order {
        None => Ok(default_descending),
        Some("desc") => Ok(true),
        Some("asc") => Ok(false),
        Some(other) => Err(ApiError::invalid(format!(
            "`order` must be `asc` or `desc`, not `{other}`"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
    before: Option<String>,
    user_id: Option<String>,
    sort: Option<String>,
}

pub(crate) async fn list<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let sort = match q.sort.as_deref() {
        None => SessionSort::default(),
        Some(name) => SessionSort::from_name(name).ok_or_else(|| {
            ApiError::invalid(format!(
                "`sort` must be updatedAt, lastMessageAt or createdAt, not `{name}`"
            ))
        })?,
    };
    let listing = SessionListing {
        page: PageRequest {
            limit: q.limit,
            descending: descending(q.order.as_deref(), true)?,
            after: q.after,
            before: q.before,
        },
        sort,
        user_id: q.user_id,
    };
    let page = app.db.list_sessions(&ns, &listing).await?;
    let items: Vec<Value> = page.items.iter().map(wire::session).collect();
    let mut body = json!({"items": items});
    if let Some(next) = page.next_cursor {
        body["nextCursor"] = next.into();
    }
    if let Some(previous) = page.previous_cursor {
        body["previousCursor"] = previous.into();
    }
    Ok(value_response(StatusCode::OK, &body))
}

pub(crate) async fn get<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let info = app
        .session(&ns, &sid)?
        .info()
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no session `{sid}`")))?;
    Ok(value_response(StatusCode::OK, &wire::session(&info)))
}

pub(crate) async fn patch<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "session patch")?;
    let patch = SessionPatch {
        name: f.opt_string("name")?,
        model: f.opt_string("model")?,
        metadata: f.opt_object("metadata")?,
        settings: f.opt_object("settings")?,
        ..Default::default()
    };
    f.finish()?;
    let info = app
        .session(&ns, &sid)?
        .patch(patch)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no session `{sid}`")))?;
    Ok(value_response(StatusCode::OK, &wire::session(&info)))
}

pub(crate) async fn delete<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    if app.session(&ns, &sid)?.delete_session().await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!("no session `{sid}`")))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DeleteForUserQuery {
    user_id: Option<String>,
}

/// `DELETE /v1/sessions?userId=`: every session of one user, as erasing a user asks. Without a
/// user it is refused rather than read as "every session".
pub(crate) async fn delete_for_user<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    QueryParams(q): QueryParams<DeleteForUserQuery>,
) -> Result<Response, ApiError> {
    let user_id = q.user_id.filter(|u| !u.is_empty()).ok_or_else(|| {
        ApiError::invalid(
            "`userId` is required: `DELETE /v1/sessions?userId=` deletes one user's sessions \
             (`DELETE /v1/sessions/{sid}` one session)",
        )
    })?;
    let deleted = app.db.delete_user_sessions(&ns, &user_id).await?;
    Ok(value_response(StatusCode::OK, &json!({"deleted": deleted})))
}

fn no_session(sid: &str) -> ApiError {
    ApiError::not_found(format!("no session `{sid}`"))
}

pub(crate) async fn fork<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "fork")?;
    let at = f.string("atMessageId")?;
    let name = f.opt_string("name")?;
    let id = f.opt_string("id")?;
    f.finish()?;
    let info = app
        .session(&ns, &sid)?
        .fork(&at, id, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no session `{sid}` with message `{at}`")))?;
    Ok(value_response(StatusCode::CREATED, &wire::session(&info)))
}

pub(crate) async fn split<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "split")?;
    let summary = f.string("summary")?;
    let name = f.opt_string("name")?;
    f.finish()?;
    let info = app
        .session(&ns, &sid)?
        .split(&summary, name)
        .await?
        .ok_or_else(|| no_session(&sid))?;
    Ok(value_response(StatusCode::CREATED, &wire::session(&info)))
}

pub(crate) async fn usage<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "usage")?;
    let usage = Usage {
        input_tokens: f.opt_u64("inputTokens")?.unwrap_or(0),
        output_tokens: f.opt_u64("outputTokens")?.unwrap_or(0),
        cost: f.opt_f64("cost")?.unwrap_or(0.0),
    };
    f.finish()?;
    let info = app
        .session(&ns, &sid)?
        .add_usage(usage)
        .await?
        .ok_or_else(|| no_session(&sid))?;
    Ok(value_response(StatusCode::OK, &wire::session(&info)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactQuery {
    leaf: Option<String>,
}

pub(crate) async fn compact<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(q): QueryParams<CompactQuery>,
) -> Result<Response, ApiError> {
    match app.session(&ns, &sid)?.compact(q.leaf.as_deref()).await? {
        Some(compaction) => Ok(value_response(
            StatusCode::OK,
            &wire::compaction(&compaction),
        )),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

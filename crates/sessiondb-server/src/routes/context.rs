//! Context blocks and entries (per session, and namespace templates under `/v1/context`), the
//! frozen prompt, and the AI tools.
//!
//! Each block handler serves both scopes: a session route has the session id as one more path
//! parameter in front of the ones the handler reads.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sessiondb::{
    BlockKind, BlockSpec, BlockView, Context, ContextEntry, FrozenPrompt, PageRequest, Store,
};

use crate::App;
use crate::error::ApiError;
use crate::extract::{JsonBody, NdjsonBody, Params, QueryParams, Tenant};
use crate::wire::{Fields, value_response};

/// The context a route addresses, and its own path parameters (label, entry key).
fn scope<S: Store>(
    app: &App<S>,
    namespace: &str,
    mut params: Vec<String>,
    own: usize,
) -> Result<(Context<S>, Vec<String>), ApiError> {
    if params.len() > own {
        let sid = params.remove(0);
        Ok((app.session(namespace, &sid)?.context(), params))
    } else {
        Ok((app.db.context_templates(namespace)?, params))
    }
}

fn block_json(block: &BlockView) -> Value {
    json!({
        "label": block.label,
        "kind": block.kind.as_str(),
        "description": block.description,
        "maxTokens": block.max_tokens,
        "content": block.content,
        "tokens": block.tokens,
    })
}

fn entry_json(entry: &ContextEntry) -> Value {
    json!({"key": entry.key, "content": entry.content, "description": entry.description})
}

fn prompt_json(frozen: &FrozenPrompt) -> Response {
    value_response(
        StatusCode::OK,
        &json!({"prompt": frozen.prompt, "frozenAt": frozen.frozen_at}),
    )
}

fn no_block(label: &str) -> ApiError {
    ApiError::not_found(format!("no context block `{label}`"))
}

fn no_entry(label: &str, key: &str) -> ApiError {
    ApiError::not_found(format!("no entry `{key}` in context block `{label}`"))
}

pub(crate) async fn list<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
) -> Result<Response, ApiError> {
    let (context, _) = scope(&app, &ns, params, 0)?;
    let blocks: Vec<Value> = context.blocks().await?.iter().map(block_json).collect();
    Ok(value_response(StatusCode::OK, &Value::Array(blocks)))
}

/// `POST /v1/context`: a templates' part of a dump (as `sessiondb export --all` writes it: an
/// optional `templates` line, then block and entry lines) into the namespace's templates, all
/// lines or none. A fixed segment under `/v1/context` would hide the template of that label, so
/// the import is the collection's POST.
pub(crate) async fn import<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    NdjsonBody(text): NdjsonBody,
) -> Result<Response, ApiError> {
    let lines = sessiondb::parse_import(&text)?;
    let summary = app.db.import_templates(&ns, lines).await?;
    Ok(value_response(
        StatusCode::OK,
        &json!({"imported": summary.imported, "skipped": summary.skipped}),
    ))
}

pub(crate) async fn put<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 1)?;
    let mut f = Fields::new(body.value, "block")?;
    let kind = f.string("kind")?;
    let kind = BlockKind::parse(&kind).ok_or_else(|| {
        ApiError::invalid(format!(
            "invalid `kind` in the block: `{kind}` is not one of readonly, writable, skill, search"
        ))
    })?;
    let spec = BlockSpec {
        kind,
        description: f.opt_string("description")?,
        max_tokens: f.opt_u64("maxTokens")?,
        content: f.opt_string("content")?.unwrap_or_default(),
    };
    f.finish()?;
    let block = context.define(&own[0], spec).await?;
    Ok(value_response(StatusCode::OK, &block_json(&block)))
}

pub(crate) async fn append<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 1)?;
    let mut f = Fields::new(body.value, "append")?;
    let content = f.string("content")?;
    f.finish()?;
    let block = context.append_to_block(&own[0], &content).await?;
    Ok(value_response(StatusCode::OK, &block_json(&block)))
}

pub(crate) async fn delete<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 1)?;
    if context.delete_block(&own[0]).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_block(&own[0]))
    }
}

pub(crate) async fn put_entry<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 2)?;
    let mut f = Fields::new(body.value, "entry")?;
    let content = f.string("content")?;
    let description = f.opt_string("description")?;
    f.finish()?;
    let (label, key) = (&own[0], &own[1]);
    context
        .put_entry(label, key, &content, description.as_deref())
        .await?;
    let entry = ContextEntry {
        key: key.clone(),
        content,
        description,
    };
    Ok(value_response(StatusCode::OK, &entry_json(&entry)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntriesQuery {
    limit: Option<usize>,
    after: Option<String>,
}

pub(crate) async fn entries<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
    QueryParams(query): QueryParams<EntriesQuery>,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 1)?;
    let request = PageRequest {
        limit: query.limit,
        after: query.after,
        ..PageRequest::default()
    };
    let page = context.entry_page(&own[0], &request).await?;
    let items: Vec<Value> = page.items.iter().map(entry_json).collect();
    let mut body = json!({"items": items});
    if let Some(next) = page.next_cursor {
        body["nextCursor"] = next.into();
    }
    Ok(value_response(StatusCode::OK, &body))
}

pub(crate) async fn delete_entry<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 2)?;
    let (label, key) = (&own[0], &own[1]);
    if context.delete_entry(label, key).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(no_entry(label, key))
    }
}

pub(crate) async fn get_entry<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(params): Params<Vec<String>>,
) -> Result<Response, ApiError> {
    let (context, own) = scope(&app, &ns, params, 2)?;
    let (label, key) = (&own[0], &own[1]);
    match context.entry(label, key).await? {
        Some(entry) => Ok(value_response(StatusCode::OK, &entry_json(&entry))),
        None => Err(no_entry(label, key)),
    }
}

pub(crate) async fn prompt<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let frozen = app.session(&ns, &sid)?.context().prompt().await?;
    Ok(prompt_json(&frozen))
}

pub(crate) async fn refresh<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
) -> Result<Response, ApiError> {
    let frozen = app.session(&ns, &sid)?.context().refresh_prompt().await?;
    Ok(prompt_json(&frozen))
}

#[derive(Debug, Deserialize)]
pub(crate) struct ToolsQuery {
    format: Option<String>,
}

/// The server offers `session_search` to every session: it is the namespace's session manager.
pub(crate) async fn tools<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params(sid): Params<String>,
    QueryParams(query): QueryParams<ToolsQuery>,
) -> Result<Response, ApiError> {
    let tools = app.session(&ns, &sid)?.context().tools(true).await?;
    let listed: Vec<Value> = match query.format.as_deref().unwrap_or("raw") {
        "raw" => tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
            .collect(),
        "openai" => tools.iter().map(|t| t.openai()).collect(),
        "anthropic" => tools.iter().map(|t| t.anthropic()).collect(),
        other => {
            return Err(ApiError::invalid(format!(
                "unknown format `{other}`: use raw, openai or anthropic"
            )));
        }
    };
    Ok(value_response(StatusCode::OK, &Value::Array(listed)))
}

pub(crate) async fn execute<S: Store>(
    State(app): State<Arc<App<S>>>,
    Tenant(ns): Tenant,
    Params((sid, name)): Params<(String, String)>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let mut f = Fields::new(body.value, "tool call")?;
    let arguments = f.take("arguments").unwrap_or_else(|| json!({}));
    f.finish()?;
    let output = app
        .session(&ns, &sid)?
        .context()
        .execute(&name, &arguments)
        .await;
    Ok(value_response(StatusCode::OK, &json!({"output": output})))
}

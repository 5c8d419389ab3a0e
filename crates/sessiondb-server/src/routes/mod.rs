//! Route table. Handlers are generic over the store; each module holds one resource.

mod compat;
mod context;
mod events;
mod extras;
mod messages;
mod ops;
mod reads;
mod sessions;

use std::sync::Arc;

use axum::Router;
use axum::routing::{any, get, post, put};
use sessiondb::Store;

use crate::App;

pub(crate) fn routes<S: Store>() -> Router<Arc<App<S>>> {
    Router::new()
        .route(
            "/v1/sessions",
            post(sessions::create::<S>)
                .get(sessions::list::<S>)
                .delete(sessions::delete_for_user::<S>),
        )
        .route(
            "/v1/sessions/{sid}",
            get(sessions::get::<S>)
                .patch(sessions::patch::<S>)
                .delete(sessions::delete::<S>),
        )
        .route("/v1/sessions/{sid}/fork", post(sessions::fork::<S>))
        .route("/v1/sessions/{sid}/split", post(sessions::split::<S>))
        .route("/v1/sessions/{sid}/usage", post(sessions::usage::<S>))
        .route("/v1/sessions/{sid}/compact", post(sessions::compact::<S>))
        .route("/v1/attachments/{hash}", get(extras::attachment::<S>))
        .route("/v1/messages", post(messages::append_by_header::<S>))
        .route(
            "/v1/sessions/{sid}/messages",
            post(messages::append::<S>)
                .get(messages::list::<S>)
                .delete(messages::clear::<S>),
        )
        .route(
            "/v1/sessions/{sid}/messages/batch",
            post(messages::batch::<S>),
        )
        .route(
            "/v1/sessions/{sid}/messages/delete",
            post(messages::delete_many::<S>),
        )
        .route(
            "/v1/sessions/{sid}/messages/{mid}",
            get(messages::get::<S>)
                .put(messages::put::<S>)
                .patch(messages::patch::<S>)
                .delete(messages::delete::<S>),
        )
        .route("/v1/sessions/{sid}/history", get(reads::history::<S>))
        .route(
            "/v1/sessions/{sid}/branches/{mid}",
            get(reads::branches::<S>),
        )
        .route("/v1/sessions/{sid}/rows", get(reads::rows::<S>))
        .route("/v1/sessions/{sid}/search", get(reads::search::<S>))
        .route("/v1/search", get(reads::search_all::<S>))
        .route("/v1/sessions/{sid}/import", post(extras::import::<S>))
        .route("/v1/import", post(extras::import_together::<S>))
        .route("/v1/sessions/{sid}/export", get(extras::export::<S>))
        .route(
            "/v1/sessions/{sid}/compactions",
            post(extras::add_compaction::<S>).get(extras::compactions::<S>),
        )
        .route("/v1/sessions/{sid}/state", get(extras::state_all::<S>))
        .route(
            "/v1/sessions/{sid}/state/{key}",
            get(extras::state_get::<S>)
                .put(extras::state_put::<S>)
                .delete(extras::state_delete::<S>),
        )
        .route("/v1/sessions/{sid}/context", get(context::list::<S>))
        .route(
            "/v1/sessions/{sid}/context/{label}",
            put(context::put::<S>).delete(context::delete::<S>),
        )
        .route(
            "/v1/sessions/{sid}/context/{label}/append",
            post(context::append::<S>),
        )
        .route(
            "/v1/sessions/{sid}/context/{label}/entries",
            get(context::entries::<S>),
        )
        .route(
            "/v1/sessions/{sid}/context/{label}/entries/{key}",
            put(context::put_entry::<S>)
                .get(context::get_entry::<S>)
                .delete(context::delete_entry::<S>),
        )
        .route(
            "/v1/context",
            get(context::list::<S>).post(context::import::<S>),
        )
        .route(
            "/v1/context/{label}",
            put(context::put::<S>).delete(context::delete::<S>),
        )
        .route("/v1/context/{label}/append", post(context::append::<S>))
        .route("/v1/context/{label}/entries", get(context::entries::<S>))
        .route(
            "/v1/context/{label}/entries/{key}",
            put(context::put_entry::<S>)
                .get(context::get_entry::<S>)
                .delete(context::delete_entry::<S>),
        )
        .route("/v1/sessions/{sid}/prompt", get(context::prompt::<S>))
        .route(
            "/v1/sessions/{sid}/prompt/refresh",
            post(context::refresh::<S>),
        )
        .route("/v1/sessions/{sid}/tools", get(context::tools::<S>))
        .route(
            "/v1/sessions/{sid}/tools/{name}",
            post(context::execute::<S>),
        )
        .route("/v1/sessions/{sid}/events", get(events::session::<S>))
        .route("/v1/events", get(events::namespace::<S>))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz::<S>))
        .route("/metrics", get(ops::metrics::<S>))
        .route("/openapi.json", get(ops::openapi))
        .route("/agents/session-object/{name}", any(compat::handle::<S>))
        .route(
            "/agents/session-object/{name}/{*rest}",
            any(compat::handle::<S>),
        )
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::not_found)
}

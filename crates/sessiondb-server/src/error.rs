//! The JSON error every route answers with: `{"error": {"code", "message"}}`.

use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sessiondb::{ContextError, StoreError};

/// An error answer. Bad input maps to a 4xx; only real faults become `internal` (500), and those
/// are logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 408: the request did not arrive in time (its body stalled).
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn quota(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "quota_exceeded", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        )
    }

    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "bad_gateway", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The same answer, its message said of `place` (the part of the request that failed).
    fn prefixed(self, place: &str) -> Self {
        Self {
            message: format!("{place}: {}", self.message),
            ..self
        }
    }

    /// The response body as JSON text.
    pub fn body(&self) -> String {
        serde_json::json!({"error": {"code": self.code, "message": self.message}}).to_string()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        }
        let mut response = (
            self.status,
            [(CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<sessiondb::Error> for ApiError {
    fn from(e: sessiondb::Error) -> Self {
        match e {
            sessiondb::Error::Invalid(v) => v.into(),
            sessiondb::Error::SessionExists { .. } => ApiError::conflict(e.to_string()),
            sessiondb::Error::QuotaExceeded { .. } => ApiError::quota(e.to_string()),
            sessiondb::Error::NoSummarizer => ApiError::conflict(e.to_string()),
            // The model behind the summarizer failed: a fault upstream, not bad input.
            sessiondb::Error::Summarize(_) => ApiError::bad_gateway(e.to_string()),
            sessiondb::Error::Store(store) => store.into(),
            sessiondb::Error::Context(context) => context.into(),
            sessiondb::Error::InPart {
                part,
                session_id,
                error,
            } => {
                ApiError::from(*error).prefixed(&format!("parts[{part}] (session `{session_id}`)"))
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::QuotaExceeded { .. } => ApiError::quota(e.to_string()),
            StoreError::ParentCycle { .. }
            | StoreError::LeafMoved { .. }
            | StoreError::VersionMoved { .. }
            | StoreError::MessageChanged { .. }
            | StoreError::SessionExists => ApiError::conflict(e.to_string()),
            StoreError::NoSession => ApiError::not_found(e.to_string()),
            StoreError::Context(context) => context.into(),
            // A fault of the moment rather than of the server: 503, which clients retry.
            StoreError::Unavailable(_) => ApiError::unavailable(e.to_string()),
            StoreError::InRequest { index, error } => {
                ApiError::from(*error).prefixed(&format!("request {index} of the write"))
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<ContextError> for ApiError {
    fn from(e: ContextError) -> Self {
        match e {
            ContextError::NotFound(_) => ApiError::not_found(e.to_string()),
            ContextError::TooLarge { .. } => ApiError::invalid(e.to_string()),
            ContextError::Provider(_) => ApiError::bad_gateway(e.to_string()),
            _ => ApiError::conflict(e.to_string()),
        }
    }
}

impl From<sessiondb::ValidationError> for ApiError {
    fn from(e: sessiondb::ValidationError) -> Self {
        match e.kind {
            sessiondb::ValidationErrorKind::TooLarge { .. } => ApiError::too_large(e.to_string()),
            _ => ApiError::invalid(e.to_string()),
        }
    }
}

//! Which error type belongs to which layer:
//! - `store::StoreError` — SQL and I/O failures in `store/`.
//! - `quota::QuotaError` — a budget that cannot cover a reservation, or a store failure.
//! - `upstream::UpstreamError` — one failed upstream attempt, classified by `upstream::retry`.
//! - `ApiError` (here) — what a `/v1/*` client is told. Inner errors become an `ApiError`
//!   once, in `pipeline.rs`, and an `ApiError` becomes JSON once, in `render`, in the wire
//!   format of the route the client called (OpenAI or Anthropic).

use std::borrow::Cow;

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use serde_json::{json, Value};

/// The client's wire format, which decides the error shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    OpenAi,
    Anthropic,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    InvalidRequest {
        message: String,
        /// The field named: the client's own key when it is one the gateway does not know
        /// (a translated Responses request's, `TranslateError`).
        param: Option<Cow<'static, str>>,
    },
    #[error("Invalid API key. Check the Sluice token you are sending (Authorization: Bearer sk-sl-… or x-api-key).")]
    InvalidApiKey,
    #[error("This token is not allowed to use the model `{0}`.")]
    ModelNotAllowed(String),
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    /// A stored response (`previous_response_id`, `GET`/`DELETE /v1/responses/{id}`) that
    /// does not exist, expired, or belongs to another token: all answered alike.
    #[error("Response with id '{id}' not found.")]
    ResponseNotFound {
        id: String,
        param: Option<&'static str>,
    },
    #[error("Request body is larger than the gateway accepts ({0} bytes).")]
    RequestTooLarge(usize),
    #[error("Budget exhausted: this token's remaining budget cannot cover the request's worst-case cost.")]
    InsufficientQuota { retry_after: Option<u64> },
    #[error("Rate limit reached for this token's {}; retry after {retry_after} s.", if *tokens { "tokens per window" } else { "requests per window" })]
    RateLimited { retry_after: u64, tokens: bool },
    #[error(
        "Every upstream key for this model is rate limited. Retry after {retry_after} seconds."
    )]
    UpstreamRateLimited { retry_after: u64 },
    #[error(
        "The upstream serving this model is at its concurrency limit. Retry in {retry_after} s."
    )]
    UpstreamBusy { retry_after: u64 },
    #[error(
        "The gateway's queue is full (you would be number {position}). Retry in {retry_after} s."
    )]
    QueueFull {
        position: usize,
        eta: u64,
        retry_after: u64,
    },
    #[error("The request waited too long in the gateway's queue (position {position}). Retry in {retry_after} s.")]
    QueueTimeout {
        position: usize,
        eta: u64,
        retry_after: u64,
    },
    #[error("Every upstream route failed for this request. Try again later.")]
    UpstreamError,
    /// The upstream refused the request as the client's fault; its own answer is passed on.
    #[error("The upstream rejected the request.")]
    UpstreamClientError,
    #[error("No upstream can serve this model right now (all routes are cooling down or failing). Try again in {}.", seconds(*.retry_after))]
    ServiceDegraded { retry_after: u64 },
    /// The budget ledger's database cannot be reached: nothing was reserved, so nothing is
    /// served (fail closed) and nothing charged.
    #[error("The budget ledger cannot be reached right now; nothing was charged. Try again in {}.", seconds(*.retry_after))]
    LedgerUnavailable { retry_after: u64 },
    /// The gateway is stopping and ended the request (see `pipeline::drain`).
    #[error("The gateway is shutting down; the request was ended. Retry it.")]
    ShuttingDown,
    /// The client went away before it was answered (for the request log only).
    #[error("The client closed the connection.")]
    ClientGone,
    #[error("The gateway hit an internal error. The request was not charged.")]
    Internal,
}

impl ApiError {
    /// A store error met outside the money path (the token lookup, a balance read): the
    /// database out of reach is the outage the ledger answers 503 for (the client may
    /// retry), anything else an internal error. `what` names the operation in the log.
    pub fn from_store(e: &crate::store::StoreError, what: &'static str) -> ApiError {
        if e.is_unavailable() {
            tracing::warn!(error = %e, what, "the database cannot be reached; request refused");
            ApiError::LedgerUnavailable { retry_after: 1 }
        } else {
            tracing::error!(error = %e, what, "store failed");
            ApiError::Internal
        }
    }
}

impl ApiError {
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::InvalidApiKey => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            ApiError::ModelNotFound(_) | ApiError::ResponseNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::RequestTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::InsufficientQuota { .. }
            | ApiError::UpstreamRateLimited { .. }
            | ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UpstreamError => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamClientError => StatusCode::BAD_REQUEST,
            ApiError::ServiceDegraded { .. }
            | ApiError::LedgerUnavailable { .. }
            | ApiError::UpstreamBusy { .. }
            | ApiError::QueueFull { .. }
            | ApiError::QueueTimeout { .. }
            | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            // nginx's 499: the client closed the request.
            ApiError::ClientGone => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        }
    }

    /// The Sluice code of DESIGN.md's status table.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. } => "invalid_request_error",
            ApiError::InvalidApiKey => "invalid_api_key",
            ApiError::ModelNotAllowed(_) => "model_not_allowed",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::ResponseNotFound { .. } => "not_found",
            ApiError::RequestTooLarge(_) => "request_too_large",
            ApiError::InsufficientQuota { .. } => "insufficient_quota",
            ApiError::UpstreamRateLimited { .. } | ApiError::RateLimited { .. } => {
                "rate_limit_exceeded"
            }
            ApiError::UpstreamError => "upstream_error",
            ApiError::UpstreamClientError => "upstream_client_error",
            ApiError::ServiceDegraded { .. } | ApiError::LedgerUnavailable { .. } => {
                "service_degraded"
            }
            ApiError::UpstreamBusy { .. } => "upstream_busy",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::QueueTimeout { .. } => "queue_timeout",
            ApiError::Internal => "internal_error",
            ApiError::ClientGone => "client_disconnected",
            ApiError::ShuttingDown => "shutting_down",
        }
    }

    /// What a 503 adds inside `error`: `retry_after_seconds`, and for the queue's answers
    /// `queue_position` and `estimated_wait_seconds` (empty for any other error). The same
    /// fields go into a queued stream's error event, which has no headers to carry them.
    pub fn wait_fields(&self) -> serde_json::Map<String, Value> {
        let mut fields = serde_json::Map::new();
        if self.status() != StatusCode::SERVICE_UNAVAILABLE {
            return fields;
        }
        if let Some(after) = self.retry_after() {
            fields.insert("retry_after_seconds".into(), json!(after));
            if let ApiError::QueueFull { position, eta, .. }
            | ApiError::QueueTimeout { position, eta, .. } = self
            {
                fields.insert("queue_position".into(), json!(position));
                fields.insert("estimated_wait_seconds".into(), json!(eta));
            }
        }
        fields
    }

    /// The error's `type` in OpenAI's and in Anthropic's format.
    pub fn wire_types(&self) -> (&'static str, &'static str) {
        (self.openai_type(), self.anthropic_type())
    }

    fn openai_type(&self) -> &'static str {
        match self {
            ApiError::InsufficientQuota { .. } => "insufficient_quota",
            ApiError::UpstreamRateLimited { .. } => "requests",
            ApiError::RateLimited { tokens, .. } => {
                if *tokens {
                    "tokens"
                } else {
                    "requests"
                }
            }
            ApiError::UpstreamError
            | ApiError::ServiceDegraded { .. }
            | ApiError::LedgerUnavailable { .. }
            | ApiError::UpstreamBusy { .. }
            | ApiError::QueueFull { .. }
            | ApiError::QueueTimeout { .. }
            | ApiError::ShuttingDown
            | ApiError::Internal => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::UpstreamClientError => {
                "invalid_request_error"
            }
            ApiError::InvalidApiKey => "authentication_error",
            ApiError::ModelNotAllowed(_) => "permission_error",
            ApiError::ModelNotFound(_) | ApiError::ResponseNotFound { .. } => "not_found_error",
            ApiError::RequestTooLarge(_) => "request_too_large",
            ApiError::InsufficientQuota { .. }
            | ApiError::UpstreamRateLimited { .. }
            | ApiError::RateLimited { .. } => "rate_limit_error",
            ApiError::UpstreamError | ApiError::Internal | ApiError::ClientGone => "api_error",
            ApiError::ServiceDegraded { .. }
            | ApiError::LedgerUnavailable { .. }
            | ApiError::UpstreamBusy { .. }
            | ApiError::QueueFull { .. }
            | ApiError::QueueTimeout { .. }
            | ApiError::ShuttingDown => "overloaded_error",
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::InsufficientQuota { retry_after } => *retry_after,
            ApiError::ServiceDegraded { retry_after }
            | ApiError::LedgerUnavailable { retry_after }
            | ApiError::UpstreamBusy { retry_after }
            | ApiError::QueueFull { retry_after, .. }
            | ApiError::QueueTimeout { retry_after, .. }
            | ApiError::UpstreamRateLimited { retry_after }
            | ApiError::RateLimited { retry_after, .. } => Some(*retry_after),
            ApiError::ShuttingDown => Some(1),
            _ => None,
        }
    }

    /// Whether the official SDKs should retry (`x-should-retry`): a rate limit or a 503 yes;
    /// any other 4xx, and a 502 (the gateway already tried every route), no.
    fn should_retry(&self) -> bool {
        matches!(
            self,
            ApiError::ServiceDegraded { .. }
                | ApiError::LedgerUnavailable { .. }
                | ApiError::UpstreamBusy { .. }
                | ApiError::QueueFull { .. }
                | ApiError::QueueTimeout { .. }
                | ApiError::ShuttingDown
                | ApiError::UpstreamRateLimited { .. }
                | ApiError::RateLimited { .. }
        )
    }

    pub fn render(&self, format: WireFormat) -> HttpResponse {
        let message = self.to_string();
        let mut body = match format {
            WireFormat::OpenAi => json!({"error": {
                "message": message,
                "type": self.openai_type(),
                "param": match self {
                    ApiError::InvalidRequest { param, .. } => param.as_deref(),
                    ApiError::ResponseNotFound { param, .. } => *param,
                    _ => None,
                },
                "code": self.code(),
            }}),
            WireFormat::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": message,
                "code": self.code(),
            }}),
        };
        if let Some(err) = body.get_mut("error").and_then(Value::as_object_mut) {
            err.extend(self.wait_fields());
        }
        let mut resp = HttpResponse::build(self.status());
        resp.insert_header((header::CONTENT_TYPE, "application/json"));
        resp.insert_header((
            "x-should-retry",
            if self.should_retry() { "true" } else { "false" },
        ));
        if let Some(after) = self.retry_after() {
            resp.insert_header((header::RETRY_AFTER, after.to_string()));
        }
        resp.body(body.to_string())
    }
}

/// `n` seconds in words, for "Try again in …" messages: "1 second", "7 seconds".
pub fn seconds(n: u64) -> String {
    if n == 1 {
        "1 second".to_string()
    } else {
        format!("{n} seconds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_of_one_second_is_said_in_the_singular() {
        let one = ApiError::LedgerUnavailable { retry_after: 1 }.to_string();
        assert!(one.ends_with("Try again in 1 second."), "{one}");
        let two = ApiError::ServiceDegraded { retry_after: 2 }.to_string();
        assert!(two.ends_with("Try again in 2 seconds."), "{two}");
        let admin = crate::admin::error::AdminError::Throttled { retry_after: 1 }.to_string();
        assert!(admin.ends_with("Try again in 1 second."), "{admin}");
    }

    #[test]
    fn shapes_follow_the_wire_format() {
        let e = ApiError::invalid("max_tokens", "max_tokens must be positive");
        let r = e.render(WireFormat::OpenAi);
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers().get("x-should-retry").unwrap(), "false");
        let d = ApiError::ServiceDegraded { retry_after: 7 }.render(WireFormat::Anthropic);
        assert_eq!(d.status(), 503);
        assert_eq!(d.headers().get("retry-after").unwrap(), "7");
        assert_eq!(d.headers().get("x-should-retry").unwrap(), "true");
        // The ledger out of reach charged nothing and says when to come back: retried too
        // (it said `false` beside its `Retry-After`; s30 streams attack, low note).
        let l = ApiError::LedgerUnavailable { retry_after: 1 }.render(WireFormat::OpenAi);
        assert_eq!(l.status(), 503);
        assert_eq!(l.headers().get("x-should-retry").unwrap(), "true");
    }
}

//! `/v1/*` handlers (thin: extract, call the pipeline, answer) and the health probes.

mod chat;
mod embeddings;
mod health;
mod messages;
mod models;
mod queue;
mod responses;
mod usage;

use actix_web::web;

use crate::auth::TokenAuth;
use crate::error::{ApiError, WireFormat};
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/v1/chat/completions",
        web::post().to(chat::chat_completions),
    )
    .route("/v1/completions", web::post().to(chat::completions))
    .route("/v1/embeddings", web::post().to(embeddings::embeddings))
    .route("/v1/messages", web::post().to(messages::messages))
    .route(
        "/v1/messages/count_tokens",
        web::post().to(messages::count_tokens),
    )
    .route("/v1/responses", web::post().to(responses::create))
    .route("/v1/responses/{id}", web::get().to(responses::get))
    .route("/v1/responses/{id}", web::delete().to(responses::delete))
    .route("/v1/models", web::get().to(models::list))
    .route("/v1/models/{id}", web::get().to(models::one))
    .route("/v1/usage", web::get().to(usage::usage))
    .route("/v1/queue", web::get().to(queue::mine))
    .route("/healthz", web::get().to(health::healthz))
    .route("/readyz", web::get().to(health::readyz))
    .route("/metrics", web::get().to(health::metrics));
}

/// The token of a request to an endpoint outside the pipeline, or the 401/503/500 to answer.
pub(crate) async fn authenticated(
    state: &AppState,
    req: &actix_web::HttpRequest,
    format: WireFormat,
) -> Result<std::sync::Arc<TokenAuth>, actix_web::HttpResponse> {
    match state
        .auth
        .authenticate(req.headers(), state.clock.now())
        .await
    {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(ApiError::InvalidApiKey.render(format)),
        Err(e) => Err(ApiError::from_store(&e, "token lookup").render(format)),
    }
}

/// Anything else: a 404 in the format the client speaks — Anthropic's when it sends
/// `anthropic-version` or asked under `/v1/messages`, else OpenAI's.
pub async fn not_found(req: actix_web::HttpRequest) -> actix_web::HttpResponse {
    let anthropic =
        req.headers().contains_key("anthropic-version") || req.path().starts_with("/v1/messages");
    let message = "Unknown route.";
    if anthropic {
        return actix_web::HttpResponse::NotFound().json(
            serde_json::json!({"type": "error", "error": {
                "type": "not_found_error", "message": message, "code": "not_found"
            }}),
        );
    }
    actix_web::HttpResponse::NotFound().json(serde_json::json!({"error": {
        "message": message, "type": "invalid_request_error", "param": null, "code": "not_found"
    }}))
}

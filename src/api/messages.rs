//! `POST /v1/messages` (Anthropic's wire format) and `POST /v1/messages/count_tokens`,
//! answered locally with the tokenizer.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use crate::endpoint::Endpoint;
use crate::error::{ApiError, WireFormat};
use crate::pipeline;
use crate::quota::estimate;
use crate::state::AppState;

pub async fn messages(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    pipeline::handle(state, req, body, Endpoint::Messages).await
}

/// Read like the pipeline's bodies (its size limit, its errors), so that a body too large,
/// cut short or wrongly encoded gets an Anthropic-shaped answer, not actix's plain text.
pub async fn count_tokens(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let f = WireFormat::Anthropic;
    if let Err(resp) = super::authenticated(&state, &req, f).await {
        return resp;
    }
    let body = match pipeline::read_body(payload, &req, &state.settings.server).await {
        Ok(b) => b,
        Err(e) => return e.render(f),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return ApiError::InvalidRequest {
            message: "The request body is not valid JSON.".into(),
            param: None,
        }
        .render(f);
    };
    let Some(msgs) = v.get("messages").and_then(Value::as_array) else {
        return ApiError::invalid("messages", "`messages` is required").render(f);
    };
    let n = estimate::chat_input(msgs, v.get("tools"))
        + v.get("system").map_or(0, estimate::count_value);
    HttpResponse::Ok().json(json!({"input_tokens": n}))
}

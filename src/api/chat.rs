//! `POST /v1/chat/completions` and `POST /v1/completions`.

use actix_web::{web, HttpRequest, HttpResponse};

use crate::endpoint::Endpoint;
use crate::pipeline;
use crate::state::AppState;

pub async fn chat_completions(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    pipeline::handle(state, req, body, Endpoint::Chat).await
}

pub async fn completions(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    pipeline::handle(state, req, body, Endpoint::Completions).await
}

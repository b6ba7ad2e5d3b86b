//! `POST /v1/embeddings`.

use actix_web::{web, HttpRequest, HttpResponse};

use crate::endpoint::Endpoint;
use crate::pipeline;
use crate::state::AppState;

pub async fn embeddings(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    pipeline::handle(state, req, body, Endpoint::Embeddings).await
}

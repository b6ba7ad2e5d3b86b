//! `POST /v1/responses` (the pipeline) and the stored responses' `GET` and `DELETE
//! /v1/responses/{id}`, scoped to the token that made them.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::endpoint::Endpoint;
use crate::error::{ApiError, WireFormat};
use crate::pipeline::{self, responses as kept};
use crate::state::AppState;

pub async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    pipeline::handle(state, req, body, Endpoint::Responses).await
}

fn not_found(id: String) -> HttpResponse {
    ApiError::ResponseNotFound { id, param: None }.render(WireFormat::OpenAi)
}

pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let auth = match super::authenticated(&state, &req, WireFormat::OpenAi).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let id = id.into_inner();
    match kept::find_stored(&state, &id, auth.owner.token_id).await {
        Ok(Some(response)) => HttpResponse::Ok()
            .content_type("application/json")
            .body(response),
        Ok(None) => not_found(id),
        Err(e) => ApiError::from_store(&e, "stored response").render(WireFormat::OpenAi),
    }
}

pub async fn delete(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let auth = match super::authenticated(&state, &req, WireFormat::OpenAi).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let id = id.into_inner();
    match kept::delete_stored(&state, &id, auth.owner.token_id).await {
        Ok(true) => {
            HttpResponse::Ok().json(json!({"id": id, "object": "response", "deleted": true}))
        }
        Ok(false) => not_found(id),
        Err(e) => ApiError::from_store(&e, "stored response").render(WireFormat::OpenAi),
    }
}

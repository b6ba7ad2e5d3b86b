//! `GET /v1/models`: only the models this token may use, in OpenAI's list shape (or
//! Anthropic's when the request carries `anthropic-version`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::error::{ApiError, WireFormat};
use crate::state::AppState;

pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let anthropic = req.headers().contains_key("anthropic-version");
    let format = if anthropic {
        WireFormat::Anthropic
    } else {
        WireFormat::OpenAi
    };
    let auth = match super::authenticated(&state, &req, format).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let catalog = state.catalog();
    let names = catalog.names.iter().filter(|n| auth.allows(n, n));
    let body = if anthropic {
        let data: Vec<_> = names
            .map(|n| json!({"type": "model", "id": n, "display_name": n, "created_at": "2024-01-01T00:00:00Z"}))
            .collect();
        json!({"data": data, "has_more": false, "first_id": data.first().map(|d| d["id"].clone()), "last_id": data.last().map(|d| d["id"].clone())})
    } else {
        let data: Vec<_> = names
            .map(|n| json!({"id": n, "object": "model", "created": 0, "owned_by": "sluice"}))
            .collect();
        json!({"object": "list", "data": data})
    };
    HttpResponse::Ok().json(body)
}

/// `GET /v1/models/{id}`: one model, if this token may use it.
pub async fn one(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let anthropic = req.headers().contains_key("anthropic-version");
    let format = if anthropic {
        WireFormat::Anthropic
    } else {
        WireFormat::OpenAi
    };
    let auth = match super::authenticated(&state, &req, format).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let catalog = state.catalog();
    let Some(model) = catalog.model(&id).filter(|m| auth.allows(&id, &m.name)) else {
        return ApiError::ModelNotFound(id.into_inner()).render(format);
    };
    if anthropic {
        HttpResponse::Ok().json(json!({"type": "model", "id": model.name, "display_name": model.name, "created_at": "2024-01-01T00:00:00Z"}))
    } else {
        HttpResponse::Ok()
            .json(json!({"id": model.name, "object": "model", "created": 0, "owned_by": "sluice"}))
    }
}

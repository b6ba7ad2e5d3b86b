//! `/healthz` (the process answers) and `/readyz` (the database answers). Cheap,
//! unauthenticated, and revealing nothing.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::state::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let db = sqlx::query_scalar::<_, i64>("SELECT value FROM meta WHERE key = 'token_epoch'")
        .fetch_one(&state.db.read)
        .await
        .is_ok();
    if db {
        HttpResponse::Ok().json(json!({"status": "ready", "database": "ok"}))
    } else {
        HttpResponse::ServiceUnavailable()
            .json(json!({"status": "not ready", "database": "unreachable"}))
    }
}

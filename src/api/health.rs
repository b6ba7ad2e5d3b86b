//! `/healthz` (the process answers) and `/readyz` (the database answers, and Redis when it
//! is configured). Cheap, unauthenticated, and revealing nothing.

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
    let redis = state.windows.redis_ready().await;
    let word = |ok: bool| if ok { "ok" } else { "unreachable" };
    let body = json!({
        "status": if db && redis != Some(false) { "ready" } else { "not ready" },
        "database": word(db),
        "redis": redis.map(word).unwrap_or("not configured"),
    });
    if db && redis != Some(false) {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

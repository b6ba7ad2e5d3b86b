//! `/healthz` (the process answers), `/readyz` (the database answers and is migrated, and
//! Redis when it is configured) and `/metrics` (Prometheus). Cheap, unauthenticated, and
//! revealing nothing secret.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::state::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let migrated = state.migrations_applied().await;
    let db = migrated.is_ok();
    let migrations_ok = migrated.unwrap_or(false);
    let redis = state.windows.redis_ready().await;
    let word = |ok: bool| if ok { "ok" } else { "unreachable" };
    let ready = db && migrations_ok && redis != Some(false);
    let body = json!({
        "status": if ready { "ready" } else { "not ready" },
        "database": word(db),
        "migrations": if migrations_ok { "applied" } else { "pending" },
        "redis": redis.map(word).unwrap_or("not configured"),
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics_text())
}

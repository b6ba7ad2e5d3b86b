//! `GET /v1/queue`: the caller's own requests waiting for admission on this replica.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::error::WireFormat;
use crate::state::AppState;

pub async fn mine(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let auth = match super::authenticated(&state, &req, WireFormat::OpenAi).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let waiting: Vec<_> = state
        .queue
        .waiting_for(auth.owner.token_id)
        .into_iter()
        .map(|(priority, position, waited, eta)| {
            json!({"priority": priority, "queue_position": position, "waited_ms": waited.as_millis() as u64,
                   "estimated_wait_seconds": eta.as_secs()})
        })
        .collect();
    let depth = state.queue.depth();
    HttpResponse::Ok()
        .json(json!({"object": "sluice.queue", "waiting": waiting, "depth_by_priority": depth}))
}

//! `GET /v1/usage`: a token holder's own budget and limits.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::error::{ApiError, WireFormat};
use crate::quota::pricing::usd;
use crate::state::AppState;

pub async fn usage(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let now = state.clock.now();
    let auth = match super::authenticated(&state, &req, WireFormat::OpenAi).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let balance = match state.balance(auth.owner.token_id, now).await {
        Ok(b) => b,
        Err(e) => return ApiError::from_store(&e, "balance").render(WireFormat::OpenAi),
    };
    let reset = auth.owner.resets[0];
    let money = |m: Option<i64>| m.map(usd);
    HttpResponse::Ok().json(json!({
        "object": "sluice.usage",
        "token_id": auth.owner.token_id,
        "limit_usd": money(balance.limit),
        "remaining_usd": money(balance.remaining),
        "reserved_usd": usd(balance.reserved),
        "spent_usd": usd(balance.spent),
        "limit_micros": balance.limit,
        "remaining_micros": balance.remaining,
        "reserved_micros": balance.reserved,
        "spent_micros": balance.spent,
        "period": reset.period_key(now),
        "reset": reset.as_str(),
        "period_start": reset.period_start(now),
        "period_end": reset.period_end(now),
        "expires_at": auth.expires_at,
        "rate_limits": {"rpm": auth.rpm, "tpm": auth.tpm, "user_rpm": auth.user_rpm, "user_tpm": auth.user_tpm},
        "models": auth.models,
    }))
}

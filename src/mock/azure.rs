//! The mock's Azure OpenAI: the classic deployment path
//! (`/openai/deployments/{deployment}/chat/completions?api-version=…`, 400 without the
//! version, as Azure answers), the v1 path (`/openai/v1/chat/completions`), the `api-key`
//! header or an Entra ID bearer token — issued by the mock's own token endpoint
//! (`/{tenant}/oauth2/v2.0/token`, client credentials) and accepted until it expires — and
//! Azure's answer shapes: `prompt_filter_results` (a first stream chunk with no choices),
//! content-filter errors and finishes (`Script::content_filter`), Azure's 429 body. Requests
//! are keyed by their `api-key`, or `entra:<client_id>` for a token; scripts, faults and
//! statistics work as for every other path.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use super::{responses, InFlightGuard, MockState};

/// What the token endpoint issued, and how long its tokens live.
pub struct EntraState {
    /// Token → (client id, expiry).
    tokens: Mutex<HashMap<String, (String, Instant)>>,
    /// Lifetime of the next tokens, in seconds (`expires_in`); Entra's is about an hour.
    pub expires_in: std::sync::atomic::AtomicU64,
    issued: std::sync::atomic::AtomicU64,
    /// Requests that came with a token the mock did not issue or that had expired.
    refused: std::sync::atomic::AtomicU64,
    /// `expires_in` as the next answers write it, when not the lifetime as an integer (a
    /// string, a fraction: what other token services send).
    pub expires_in_written: Mutex<Option<Value>>,
}

impl Default for EntraState {
    fn default() -> Self {
        Self {
            tokens: Mutex::new(HashMap::new()),
            expires_in: std::sync::atomic::AtomicU64::new(3599),
            issued: std::sync::atomic::AtomicU64::new(0),
            refused: std::sync::atomic::AtomicU64::new(0),
            expires_in_written: Mutex::new(None),
        }
    }
}

impl EntraState {
    pub fn issued(&self) -> u64 {
        self.issued.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Refuses every token issued so far, as Azure refuses a token before the expiry its
    /// endpoint announced (revoked, or a host whose monotonic clock stood still while it
    /// was suspended); tokens issued later are accepted.
    pub fn revoke_all(&self) {
        self.tokens.lock().clear();
    }
    pub fn set_expires_in(&self, seconds: u64) {
        self.expires_in
            .store(seconds, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The client secret the token endpoint refuses (as Entra refuses a wrong one).
pub const REFUSED_SECRET: &str = "wrong-secret";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/openai/deployments/{deployment}/{op:.*}",
        web::post().to(deployment_call),
    )
    .route("/openai/v1/{op:.*}", web::post().to(v1_call))
    .route("/{tenant}/oauth2/v2.0/token", web::post().to(token));
}

/// The OpenAI path an Azure operation answers like.
fn openai_path(op: &str) -> Option<&'static str> {
    match op {
        "chat/completions" => Some("/v1/chat/completions"),
        "completions" => Some("/v1/completions"),
        "embeddings" => Some("/v1/embeddings"),
        _ => None,
    }
}

fn azure_error(status: u16, code: &str, message: &str) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::BAD_REQUEST);
    HttpResponse::build(status).json(json!({"error": {"code": code, "message": message}}))
}

async fn deployment_call(
    state: web::Data<MockState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let (_deployment, op) = path.into_inner();
    let version = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get("api-version").cloned());
    if version.is_none() {
        return azure_error(
            400,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    call(state, req, &op, body).await
}

async fn v1_call(
    state: web::Data<MockState>,
    req: HttpRequest,
    op: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    call(state, req, &op.into_inner(), body).await
}

/// The key a request is made with: its `api-key`, or `entra:<client id>` for a token the
/// mock issued and that has not expired; `None` (answered 401) otherwise.
fn caller(state: &MockState, req: &HttpRequest) -> Option<String> {
    let h = req.headers();
    if let Some(k) = h.get("api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.to_string()).filter(|k| !k.is_empty());
    }
    let token = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())?
        .strip_prefix("Bearer ")?;
    let tokens = state.entra.tokens.lock();
    match tokens.get(token) {
        Some((client, expires)) if Instant::now() < *expires => Some(format!("entra:{client}")),
        _ => {
            state
                .entra
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            None
        }
    }
}

async fn call(
    state: web::Data<MockState>,
    req: HttpRequest,
    op: &str,
    body: web::Bytes,
) -> HttpResponse {
    let Some(openai_path) = openai_path(op) else {
        return azure_error(404, "404", "Resource not found");
    };
    let Some(key) = caller(&state, &req) else {
        return azure_error(
            401,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to \
             provide a valid key for an active subscription and use a correct regional API \
             endpoint for your resource.",
        );
    };
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut script = state.begin(&key, req.path(), super::headers_of(&req), &parsed);
    script.azure = true;
    let guard = InFlightGuard {
        state: state.clone().into_inner(),
        key,
    };
    responses::answer(&state.cfg, openai_path, &req, &parsed, script, guard).await
}

/// The client-credentials token endpoint: a token for any client whose secret is not
/// `REFUSED_SECRET`, living `expires_in` seconds. Scripts for `entra-token:<client id>`
/// (a 503, a delay, a `body` or `raw_body` answered as it is) apply as to any request.
async fn token(
    state: web::Data<MockState>,
    req: HttpRequest,
    form: web::Form<HashMap<String, String>>,
) -> HttpResponse {
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    let client = field("client_id").to_string();
    let key = format!("entra-token:{client}");
    let mut seen = Map::new();
    for k in ["grant_type", "client_id", "scope"] {
        seen.insert(k.into(), Value::String(field(k).into()));
    }
    let script = state.begin(
        &key,
        req.path(),
        super::headers_of(&req),
        &Value::Object(seen),
    );
    state.end(&key);
    if script.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
    }
    if let Some(scripted) = super::scripted_token_answer(&script) {
        return scripted;
    }
    if let Some(status) = script.status.filter(|s| !(200..300).contains(s)) {
        return azure_error(
            status,
            "temporarily_unavailable",
            "mock token endpoint error",
        );
    }
    if field("grant_type") != "client_credentials" || client.is_empty() {
        return HttpResponse::BadRequest().json(json!({"error": "unsupported_grant_type",
            "error_description": "AADSTS70003: The app requested an unsupported grant type."}));
    }
    if field("client_secret").is_empty() || field("client_secret") == REFUSED_SECRET {
        return HttpResponse::Unauthorized().json(json!({"error": "invalid_client",
            "error_description": "AADSTS7000215: Invalid client secret provided."}));
    }
    let n = state
        .entra
        .issued
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let lifetime = state
        .entra
        .expires_in
        .load(std::sync::atomic::Ordering::Relaxed);
    let token = format!("mock-entra-token-{n}-{:016x}", rand::random::<u64>());
    state.entra.tokens.lock().insert(
        token.clone(),
        (client, Instant::now() + Duration::from_secs(lifetime)),
    );
    let written = state
        .entra
        .expires_in_written
        .lock()
        .clone()
        .unwrap_or(json!(lifetime));
    HttpResponse::Ok().json(json!({"token_type": "Bearer", "expires_in": written,
        "ext_expires_in": lifetime, "access_token": token}))
}

/// Azure's per-prompt filter verdict, on answers and on a stream's first chunk.
pub fn prompt_filter_results() -> Value {
    json!([{"prompt_index": 0, "content_filter_results": filter_results(false)}])
}

/// Azure's verdict per category; `violence` filtered when `filtered`.
pub fn filter_results(filtered: bool) -> Value {
    let safe = json!({"filtered": false, "severity": "safe"});
    json!({"hate": safe, "self_harm": safe, "sexual": safe,
        "violence": {"filtered": filtered, "severity": if filtered { "medium" } else { "safe" }}})
}

/// Azure's 400 for a prompt its content filter blocked.
pub fn content_filter_error() -> Value {
    json!({"error": {"message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": null, "param": "prompt", "code": "content_filter", "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": filter_results(true)}}})
}

/// Azure's 429 body (the headers come from the script: `retry-after-ms`, `retry-after`).
pub fn rate_limit_error() -> Value {
    json!({"error": {"code": "429", "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}})
}

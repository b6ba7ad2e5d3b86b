//! `sluice mock`: a scriptable fake upstream speaking OpenAI (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models`, the Responses API `/v1/responses`),
//! Anthropic (`/v1/messages`), Azure OpenAI (`/openai/…` and an Entra ID token endpoint:
//! `azure.rs`) and Google's Gemini API and Vertex AI with its token endpoint (`gemini.rs`);
//! OpenAI-compatible servers' quirks are script switches
//! (`reject_stream_options`, `omit_usage`, `error_style`).
//! Tests script, per upstream API key, the next answers (status, body, headers, delays,
//! stream cuts) and read what it saw: per-key request counts, the highest concurrency, and
//! the last request bodies, headers and arrival times. A script may also carry seeded,
//! probabilistic faults (503s, stream cuts, malformed events) for soaks. Used in-process by
//! tests and as a process by the demo and the benchmark (control API under `/_mock/`).

pub mod azure;
pub mod bedrock;
mod faults;
mod gemini;
mod responses;
mod responses_api;

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use faults::Faults;

/// A token endpoint's scripted answer, when the script gives one: `raw_body` verbatim or
/// `body` as JSON, with the script's status (default 200) — a failing endpoint, garbage,
/// an `expires_in` of 0. `None`: the endpoint answers as it normally would.
pub(crate) fn scripted_token_answer(script: &Script) -> Option<HttpResponse> {
    let status = actix_web::http::StatusCode::from_u16(script.status.unwrap_or(200)).ok()?;
    match (&script.raw_body, &script.body) {
        (Some(raw), _) => Some(
            HttpResponse::build(status)
                .content_type("application/json")
                .body(raw.clone()),
        ),
        (None, Some(body)) => Some(HttpResponse::build(status).json(body)),
        (None, None) => None,
    }
}
pub use responses::{pieces, Script, SseEvent};

/// How many request bodies and header sets are kept per key.
const KEEP_LAST: usize = 50;

#[derive(Debug, Clone)]
pub struct MockConfig {
    pub text: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub workers: usize,
    /// With a secret, the Bedrock side verifies each SigV4 signature (`mock/bedrock.rs`).
    pub bedrock_secret: Option<String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            text: "Hello from the Sluice mock upstream. This answer is fixed so that tests can check every byte of it.".into(),
            prompt_tokens: 12,
            completion_tokens: 24,
            workers: 1,
            bedrock_secret: None,
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct KeyStats {
    pub count: u64,
    pub in_flight: u64,
    pub max_concurrency: u64,
    pub last_bodies: VecDeque<Value>,
    pub last_headers: VecDeque<Map<String, Value>>,
    pub last_paths: VecDeque<String>,
    /// When the last requests arrived, in milliseconds since the mock started: tests check
    /// that a key was left alone for its `Retry-After`.
    pub last_arrivals_ms: VecDeque<u64>,
}

#[derive(Default)]
struct Inner {
    queued: HashMap<String, VecDeque<Script>>,
    sticky: HashMap<String, Script>,
    keys: HashMap<String, KeyStats>,
    dice: faults::FaultDice,
    gemini: gemini::GeminiState,
}

pub struct MockState {
    cfg: MockConfig,
    started: std::time::Instant,
    inner: Mutex<Inner>,
    /// Azure's Entra ID token endpoint: what it issued (`azure.rs`).
    pub entra: azure::EntraState,
    /// AWS credentials registered per access key id, whose SigV4 signatures are verified
    /// (`bedrock.rs`).
    pub bedrock: bedrock::BedrockKeys,
}

impl MockState {
    /// Records a request and picks its script: the next queued one, else the sticky one,
    /// else the default answer.
    fn begin(&self, key: &str, path: &str, headers: Map<String, Value>, body: &Value) -> Script {
        let arrived_ms = self.started.elapsed().as_millis() as u64;
        let mut inner = self.inner.lock();
        let stats = inner.keys.entry(key.to_string()).or_default();
        push_bounded(&mut stats.last_arrivals_ms, arrived_ms);
        stats.count += 1;
        stats.in_flight += 1;
        stats.max_concurrency = stats.max_concurrency.max(stats.in_flight);
        push_bounded(&mut stats.last_bodies, body.clone());
        push_bounded(&mut stats.last_headers, headers);
        push_bounded(&mut stats.last_paths, path.to_string());
        let script = match inner.queued.get_mut(key).and_then(VecDeque::pop_front) {
            Some(s) => s,
            None => inner
                .sticky
                .get(key)
                .or_else(|| inner.sticky.get("*"))
                .cloned()
                .unwrap_or_default(),
        };
        inner.dice.apply(script)
    }

    fn end(&self, key: &str) {
        if let Some(s) = self.inner.lock().keys.get_mut(key) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// Queues answers for requests made with `key` (`*` for any key without its own).
    pub fn script(&self, key: &str, scripts: impl IntoIterator<Item = Script>) {
        self.inner
            .lock()
            .queued
            .entry(key.to_string())
            .or_default()
            .extend(scripts);
    }

    /// Answers every request with `key` this way until cleared (`None`).
    pub fn sticky(&self, key: &str, script: Option<Script>) {
        let mut inner = self.inner.lock();
        match script {
            Some(s) => inner.sticky.insert(key.to_string(), s),
            None => inner.sticky.remove(key),
        };
    }

    pub fn stats(&self, key: &str) -> KeyStats {
        self.inner.lock().keys.get(key).cloned().unwrap_or_default()
    }

    pub fn total_count(&self) -> u64 {
        self.inner.lock().keys.values().map(|k| k.count).sum()
    }

    pub fn reset(&self) {
        *self.inner.lock() = Inner::default();
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == KEEP_LAST {
        q.pop_front();
    }
    q.push_back(v);
}

/// Ends a request's in-flight count when its answer (including a stream) is finished.
pub(crate) struct InFlightGuard {
    state: Arc<MockState>,
    key: String,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.state.end(&self.key);
    }
}

/// A running mock: its address and its state, for tests to script and inspect.
pub struct MockServer {
    pub port: u16,
    pub state: Arc<MockState>,
    handle: ServerHandle,
}

impl MockServer {
    /// Binds `listen` (port 0 for a free one) and serves on the current runtime.
    pub fn start(listen: &str, cfg: MockConfig) -> std::io::Result<MockServer> {
        let listener = TcpListener::bind(listen)?;
        let port = listener.local_addr()?.port();
        let workers = cfg.workers.max(1);
        let state = Arc::new(MockState {
            cfg,
            started: std::time::Instant::now(),
            inner: Mutex::new(Inner::default()),
            entra: azure::EntraState::default(),
            bedrock: bedrock::BedrockKeys::default(),
        });
        let data = web::Data::from(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::JsonConfig::default().limit(64 * 1024 * 1024))
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .route("/v1/chat/completions", web::post().to(upstream))
                .route("/v1/completions", web::post().to(upstream))
                .route("/v1/embeddings", web::post().to(upstream))
                .route("/v1/messages", web::post().to(upstream))
                .route("/v1/responses", web::post().to(upstream))
                .route("/v1/models", web::get().to(models))
                .route("/model/{id}/{op}", web::post().to(bedrock_upstream))
                .route("/_mock/script", web::post().to(control_script))
                .route("/_mock/sticky", web::post().to(control_sticky))
                .route("/_mock/stats", web::get().to(control_stats))
                .route("/_mock/reset", web::post().to(control_reset))
                .route("/_mock/webhook", web::post().to(webhook))
                .route("/_mock/entra", web::post().to(control_entra))
                .configure(azure::configure)
                .configure(gemini::configure)
        })
        .workers(workers)
        // No 408 of its own: actix times a new connection's request head from its cached
        // clock, which a worker thread starved on a loaded machine leaves seconds behind,
        // so a gateway's first request could be refused at once. What the mock answers is
        // what a test scripted.
        .client_request_timeout(std::time::Duration::ZERO)
        .tcp_nodelay(true)
        .backlog(4096)
        .disable_signals()
        .listen(listener)?
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(MockServer {
            port,
            state,
            handle,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

/// The upstream key a request was made with.
fn key_of(req: &HttpRequest) -> String {
    let h = req.headers();
    if let Some(v) = h
        .get("x-api-key")
        .or_else(|| h.get("api-key"))
        .and_then(|v| v.to_str().ok())
    {
        return v.to_string();
    }
    h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim_start_matches("Bearer ")
                .trim_start_matches("bearer ")
                .to_string()
        })
        .unwrap_or_default()
}

/// A request's headers as the statistics keep them.
fn headers_of(req: &HttpRequest) -> Map<String, Value> {
    req.headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                Value::String(v.to_str().unwrap_or("").to_string()),
            )
        })
        .collect()
}

async fn upstream(state: web::Data<MockState>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let key = key_of(&req);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let script = state.begin(&key, req.path(), headers_of(&req), &parsed);
    let guard = InFlightGuard {
        state: state.clone().into_inner(),
        key,
    };
    responses::answer(&state.cfg, req.path(), &req, &parsed, script, guard).await
}

/// Bedrock's Converse (`op` = `converse`) and ConverseStream (`converse-stream`).
async fn bedrock_upstream(
    state: web::Data<MockState>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let stream = match req.match_info().get("op") {
        Some("converse") => false,
        Some("converse-stream") => true,
        _ => return bedrock::error(404, "UnknownOperationException", "Unknown operation."),
    };
    let key = match bedrock::key_of(&state.cfg, &state.bedrock, &req, &body) {
        Ok(k) => k,
        Err((status, ty, message)) => return bedrock::error(status, ty, message),
    };
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let headers: Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                Value::String(v.to_str().unwrap_or("").to_string()),
            )
        })
        .collect();
    let script = state.begin(&key, req.path(), headers, &parsed);
    let guard = InFlightGuard {
        state: state.clone().into_inner(),
        key,
    };
    bedrock::answer(&state.cfg, stream, &parsed, script, guard).await
}

/// A webhook receiver for alert tests: bodies are kept under the key `webhook`.
async fn webhook(state: web::Data<MockState>, body: web::Bytes) -> HttpResponse {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.begin("webhook", "/_mock/webhook", Map::new(), &parsed);
    state.end("webhook");
    HttpResponse::Ok().finish()
}

async fn models() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"object": "list", "data": [
        {"id": "mock-model", "object": "model", "created": 1_700_000_000, "owned_by": "sluice-mock"}
    ]}))
}

#[derive(Deserialize)]
struct ScriptReq {
    key: String,
    responses: Vec<Script>,
}

async fn control_script(state: web::Data<MockState>, body: web::Json<ScriptReq>) -> HttpResponse {
    let ScriptReq { key, responses } = body.into_inner();
    state.script(&key, responses);
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
struct StickyReq {
    key: String,
    response: Option<Script>,
}

async fn control_sticky(state: web::Data<MockState>, body: web::Json<StickyReq>) -> HttpResponse {
    let StickyReq { key, response } = body.into_inner();
    state.sticky(&key, response);
    HttpResponse::NoContent().finish()
}

async fn control_stats(state: web::Data<MockState>) -> HttpResponse {
    let keys = state.inner.lock().keys.clone();
    HttpResponse::Ok().json(serde_json::json!({"keys": keys}))
}

#[derive(Deserialize)]
struct EntraReq {
    expires_in: u64,
}

/// Sets the lifetime of the tokens the Entra ID endpoint issues next.
async fn control_entra(state: web::Data<MockState>, body: web::Json<EntraReq>) -> HttpResponse {
    state.entra.set_expires_in(body.expires_in);
    HttpResponse::NoContent().finish()
}

async fn control_reset(state: web::Data<MockState>) -> HttpResponse {
    state.reset();
    HttpResponse::NoContent().finish()
}

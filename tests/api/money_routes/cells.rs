//! The table's columns and rows as the gateway sees them: one gateway per upstream kind on
//! `sluice mock` in that provider's format (and a listener that cuts every connection
//! before its first byte), and each route's request bodies and answer shapes.

use secrecy::SecretString;
use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::MockServer;

use super::Route;
use crate::helpers::*;

/// The upstream kinds, `openai_compatible` twice: with `include_usage` (the default) and
/// without it (usage then counted from the deltas of a stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Openai,
    Anthropic,
    Azure,
    Compatible,
    CompatibleNoUsage,
    Gemini,
    Bedrock,
}

/// The model every check but the retry and the cut asks for (upstream `main`).
pub const MODEL: &str = "m";
/// The model whose upstream (`cut`) closes every connection before its first byte.
pub const CUT_MODEL: &str = "m-cut";

/// Prices of every model here, in USD per million tokens: 0.15 in, 0.075 cached in, 0.60
/// out — micro-dollars per token 0.15, 0.075 and 0.60, so costs round up.
fn priced(name: &str, upstreams: &[&str]) -> sluice::config::ModelSettings {
    let mut m = model(name, upstreams);
    m.price = sluice::config::PriceKeys::usd(0.15, 0.60);
    m.price.cached_input_usd_per_mtok = Some(0.075.into());
    m
}

/// The mock counts and scripts a call under its key: this upstream's.
pub fn key(upstream: &str) -> String {
    format!("key-{upstream}")
}

/// The retry check's model on `route`, streamed or not: its one upstream
/// `retry-<route>-<stream>-1`, then its fallback's, `…-2` (each used by one request).
pub fn retry_model(route: Route, stream: bool) -> String {
    format!("m-retry-{route:?}-{stream}")
}

pub fn retry_upstreams(route: Route, stream: bool) -> [String; 2] {
    [1, 2].map(|n| format!("retry-{route:?}-{stream}-{n}"))
}

fn upstream_of(kind: Kind, id: &str, mock: &MockServer) -> UpstreamSettings {
    let mut u = upstream(id, &key(id), mock);
    match kind {
        Kind::Openai => {}
        Kind::Anthropic => {
            u.provider = Provider::Anthropic;
            u.base_url = mock.base_url();
        }
        Kind::Azure => {
            u.provider = Provider::AzureOpenai;
            u.base_url = mock.base_url();
            u.api_version = Some("2024-10-21".into());
        }
        Kind::Compatible => u.provider = Provider::OpenaiCompatible,
        Kind::CompatibleNoUsage => {
            u.provider = Provider::OpenaiCompatible;
            u.quirks.include_usage = false;
        }
        Kind::Gemini => {
            u.provider = Provider::Gemini;
            u.base_url = mock.base_url();
        }
        Kind::Bedrock => {
            u.provider = Provider::Bedrock;
            u.base_url = mock.base_url();
            u.api_key = Secret::default();
            u.region = Some("us-east-1".into());
            u.access_key_id = Some(key(id));
            u.secret_access_key = Some(Secret(SecretString::from(
                "bedrock-test-secret".to_string(),
            )));
        }
    }
    u
}

/// One gateway for `kind`: `m` on `main`; per route a retry model on one upstream with a
/// fallback on another; `m-cut` on an upstream whose every connection is closed unanswered.
pub struct Gateway {
    pub kind: Kind,
    pub app: TestApp,
    cut: tokio::task::JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.cut.abort();
    }
}

impl Gateway {
    pub async fn start(kind: Kind) -> Gateway {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cut_port = listener.local_addr().unwrap().port();
        let cut = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        });
        let app = spawn_app_with(|s, mock| configure(s, mock, kind, cut_port)).await;
        Gateway { kind, app, cut }
    }
}

fn configure(s: &mut Settings, mock: &MockServer, kind: Kind, cut_port: u16) {
    let mut cut = upstream_of(kind, "cut", mock);
    cut.base_url = cut
        .base_url
        .replace(&mock.port.to_string(), &cut_port.to_string());
    s.upstreams = vec![upstream_of(kind, "main", mock), cut];
    s.models = vec![priced(MODEL, &["main"]), priced(CUT_MODEL, &["cut"])];
    for (route, stream) in super::ROUTES
        .into_iter()
        .flat_map(|r| [(r, false), (r, true)])
    {
        let [first, second] = retry_upstreams(route, stream);
        s.upstreams.push(upstream_of(kind, &first, mock));
        s.upstreams.push(upstream_of(kind, &second, mock));
        let name = retry_model(route, stream);
        let mut m = priced(&name, &[&first]);
        m.fallbacks = vec![format!("{name}-fallback")];
        s.models.push(m);
        s.models
            .push(priced(&format!("{name}-fallback"), &[&second]));
    }
    // A route's failures must not open its breaker for the cells after it.
    s.breaker.failure_threshold = 1000;
    s.breaker.min_calls = 1000;
}

/// A request on `route` for `model`: one user turn, `max` output tokens.
pub fn body(route: Route, model: &str, prompt: &str, max: i64, stream: bool) -> Value {
    match route {
        Route::Chat => json!({"model": model, "max_tokens": max, "stream": stream,
            "messages": [{"role": "user", "content": prompt}]}),
        Route::Messages => json!({"model": model, "max_tokens": max, "stream": stream,
            "messages": [{"role": "user", "content": prompt}]}),
        Route::Responses => json!({"model": model, "max_output_tokens": max, "stream": stream,
            "store": false, "input": prompt}),
    }
}

pub fn path(route: Route) -> &'static str {
    match route {
        Route::Chat => "/v1/chat/completions",
        Route::Messages => "/v1/messages",
        Route::Responses => "/v1/responses",
    }
}

pub async fn send(app: &TestApp, route: Route, token: &str, body: &Value) -> reqwest::Response {
    match route {
        Route::Messages => app.messages(token, body).await,
        _ => app.post(path(route), token, body).await,
    }
}

/// The text of a non-streamed answer in `route`'s format.
pub fn answer_text(route: Route, v: &Value) -> Option<String> {
    let text = match route {
        Route::Chat => v.pointer("/choices/0/message/content"),
        Route::Messages => v.pointer("/content/0/text"),
        Route::Responses => v["output"]
            .as_array()?
            .iter()
            .find(|i| i["type"] == "message")?
            .pointer("/content/0/text"),
    };
    text?.as_str().map(str::to_string)
}

/// One SSE event: its `event:` name (empty without one) and its data, parsed when JSON.
pub type Frame = (String, Value);

/// The complete events at the front of `buf`, taken out of it.
pub fn take_frames(buf: &mut String) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let raw: String = buf.drain(..end + 2).collect();
        let (mut name, mut data) = (String::new(), Value::Null);
        for line in raw.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_string();
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = serde_json::from_str(d).unwrap_or(Value::String(d.to_string()));
            }
        }
        if !raw.trim().is_empty() {
            out.push((name, data));
        }
    }
    out
}

/// The answer text a stream event of `route`'s format carries.
pub fn delta_text(route: Route, (name, data): &Frame) -> Option<String> {
    let text = match route {
        Route::Chat => data.pointer("/choices/0/delta/content"),
        Route::Messages => (name == "content_block_delta")
            .then(|| data.pointer("/delta/text"))
            .flatten(),
        Route::Responses => (data["type"] == "response.output_text.delta")
            .then(|| data.get("delta"))
            .flatten(),
    };
    text?.as_str().map(str::to_string)
}

/// The stream ended as complete in `route`'s format.
pub fn completed(route: Route, frames: &[Frame]) -> bool {
    let Some((name, data)) = frames.last() else {
        return false;
    };
    match route {
        Route::Chat => data == "[DONE]",
        Route::Messages => name == "message_stop",
        Route::Responses => data["type"] == "response.completed",
    }
}

/// An error body in `route`'s format carrying the gateway's (or the upstream's) `code`.
pub fn error_code(route: Route, v: &Value) -> Option<String> {
    if route == Route::Messages && v["type"] != "error" {
        return None;
    }
    v.pointer("/error/code")?.as_str().map(str::to_string)
}

/// The message of an error body in `route`'s format.
pub fn error_message(route: Route, v: &Value) -> Option<String> {
    if route == Route::Messages && v["type"] != "error" {
        return None;
    }
    v.pointer("/error/message")?.as_str().map(str::to_string)
}

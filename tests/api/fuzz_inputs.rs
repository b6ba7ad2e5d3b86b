//! What the fuzz test (`fuzz.rs`) sends: the routes, and proptest strategies for bodies
//! (arbitrary JSON, near-valid requests, invalid bytes) and header values.

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Number, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Chat,
    Completions,
    Embeddings,
    Messages,
    CountTokens,
    Models,
    Model,
    Usage,
    Queue,
}

const ROUTES: [Route; 9] = [
    Route::Chat,
    Route::Completions,
    Route::Embeddings,
    Route::Messages,
    Route::CountTokens,
    Route::Models,
    Route::Model,
    Route::Usage,
    Route::Queue,
];

impl Route {
    pub(super) fn post(self) -> bool {
        matches!(
            self,
            Route::Chat
                | Route::Completions
                | Route::Embeddings
                | Route::Messages
                | Route::CountTokens
        )
    }

    /// A valid request to start mutating from; chat and messages go to an OpenAI or an
    /// Anthropic upstream.
    fn template(self, anthropic_upstream: bool) -> Value {
        let msgs = json!([{"role": "user", "content": "hello"}]);
        let chat_model = if anthropic_upstream {
            "claude"
        } else {
            "gpt-4o-mini"
        };
        match self {
            Route::Chat => json!({"model": chat_model, "max_tokens": 5, "messages": msgs}),
            Route::Completions => json!({"model": "gpt-4o-mini", "max_tokens": 5, "prompt": "hi"}),
            Route::Embeddings => json!({"model": "text-embedding-3-small", "input": "hi"}),
            Route::Messages | Route::CountTokens => {
                json!({"model": chat_model, "max_tokens": 5, "messages": msgs})
            }
            _ => json!({}),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) enum Auth {
    Bearer,
    XApiKey,
    None,
    Raw(String),
}

#[derive(Clone)]
pub(super) struct Case {
    pub(super) route: Route,
    /// The `{id}` of `/v1/models/{id}`, already percent-encoded as sent.
    pub(super) model_id: String,
    pub(super) auth: Auth,
    pub(super) headers: Vec<(&'static str, Vec<u8>)>,
    pub(super) body: Vec<u8>,
}

/// Bytes as text (lossy), so a failing case reads as the request it was.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, String)> = self
            .headers
            .iter()
            .map(|(h, v)| (*h, String::from_utf8_lossy(v).into_owned()))
            .collect();
        f.debug_struct("Case")
            .field("route", &self.route)
            .field("model_id", &self.model_id)
            .field("auth", &self.auth)
            .field("headers", &headers)
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "input",
    "prompt",
    "dimensions",
    "seed",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "system",
    "thinking",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_sequences",
    "response_format",
    "user",
    "metadata",
    "parallel_tool_calls",
    "encoding_format",
    "suffix",
    "echo",
    "api_base",
    "base_url",
    "api_key",
    "extra_headers",
    "service_tier",
    "reasoning_effort",
];

const BLOCK_TYPES: &[&str] = &[
    "text",
    "image",
    "image_url",
    "input_image",
    "tool_use",
    "tool_result",
    "document",
    "thinking",
    "redacted_thinking",
    "search_result",
    "file",
    "input_audio",
    "server_tool_use",
];

const HEADERS: &[&str] = &[
    "x-sluice-priority",
    "x-sluice-request-deadline-ms",
    "x-sluice-cache",
    "x-sluice-cache-ttl",
    "x-sluice-cache-tags",
    "x-sluice-tags",
    "anthropic-version",
    "anthropic-beta",
    "content-type",
    "content-encoding",
];

fn nasty_number() -> impl Strategy<Value = Value> {
    let fixed: Vec<Value> = vec![
        json!(0),
        json!(-1),
        json!(1),
        json!(2),
        json!(16),
        json!(17),
        json!(4096),
        json!(4097),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(i32::MAX),
        json!(u32::MAX),
        json!(1e308),
        json!(-1e308),
        json!(1e-300),
        json!(0.5),
        json!(-0.0),
        json!(2.0000001),
        json!("NaN"),
        json!("Infinity"),
        json!("-Infinity"),
        json!("1e999"),
        json!("0x10"),
        json!("-1"),
        json!(""),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
    ];
    prop_oneof![
        select(fixed),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "",
            " ",
            "\u{0}",
            "\u{feff}",
            "🦀",
            "\u{202e}evil",
            "'; DROP TABLE tokens; --",
            "%s%n",
            "../../admin",
            "gpt-4o-mini",
            "mini",
            "text-embedding-3-small",
            "claude",
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "function",
        ])
        .prop_map(String::from),
        "[ -~]{0,24}",
        any::<String>().prop_map(|s| s.chars().take(24).collect()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        nasty_number(),
        nasty_string().prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(field(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(FIELDS).prop_map(String::from),
        1 => select(vec!["type", "role", "content", "text", "id", "name", "source", "data",
                         "url", "input", "arguments", "tool_use_id", "is_error", "cache_control",
                         "budget_tokens", "include_usage", "function", "index"]).prop_map(String::from),
        1 => "[a-z_]{1,10}",
    ]
}

/// JSON nested `depth` deep (past serde_json's 128 limit, or just under it).
fn deep(depth: usize) -> Value {
    let mut v = json!("bottom");
    for i in 0..depth {
        v = if i % 2 == 0 {
            json!([v])
        } else {
            json!({"content": v})
        };
    }
    v
}

fn content_block() -> impl Strategy<Value = Value> {
    (
        select(BLOCK_TYPES),
        prop::collection::btree_map(field(), json_value(), 0..4),
    )
        .prop_map(|(t, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            m.insert("type".into(), json!(t));
            Value::Object(m)
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(String, Value),
    Remove(String),
    Content(Vec<Value>),
    Message(Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (select(FIELDS).prop_map(String::from), nasty_number()).prop_map(|(f, v)| Mutation::Set(f, v)),
        3 => (field(), json_value()).prop_map(|(f, v)| Mutation::Set(f, v)),
        1 => (select(FIELDS).prop_map(String::from), 100usize..140).prop_map(|(f, d)| Mutation::Set(f, deep(d))),
        1 => select(FIELDS).prop_map(|f| Mutation::Remove(f.into())),
        3 => prop::collection::vec(content_block(), 0..4).prop_map(Mutation::Content),
        2 => json_value().prop_map(Mutation::Message),
    ]
}

fn near_valid(route: Route) -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), prop::collection::vec(mutation(), 1..5)).prop_map(move |(anthropic, muts)| {
        let mut v = route.template(anthropic);
        let Some(obj) = v.as_object_mut() else {
            return v.to_string().into_bytes();
        };
        for m in muts {
            match m {
                Mutation::Set(f, val) => {
                    obj.insert(f, val);
                }
                Mutation::Remove(f) => {
                    obj.remove(&f);
                }
                Mutation::Content(blocks) => {
                    obj.insert(
                        "messages".into(),
                        json!([{"role": "user", "content": blocks}]),
                    );
                }
                Mutation::Message(m) => {
                    let msgs = obj.entry("messages").or_insert_with(|| json!([]));
                    if let Some(a) = msgs.as_array_mut() {
                        a.push(m);
                    }
                }
            }
        }
        v.to_string().into_bytes()
    })
}

fn invalid_bytes(route: Route) -> impl Strategy<Value = Vec<u8>> {
    let valid = route.template(false).to_string().into_bytes();
    let cut = valid.clone();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        (0..valid.len()).prop_map(move |n| cut[..n].to_vec()),
        (129usize..400).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d)).into_bytes()),
        prop::collection::vec(any::<u8>(), 1..8).prop_map(move |junk| {
            let mut b = valid.clone();
            b.extend(junk);
            b
        }),
    ]
}

fn body(route: Route) -> BoxedStrategy<Vec<u8>> {
    if !route.post() {
        return prop_oneof![Just(Vec::new()), invalid_bytes(Route::Chat)].boxed();
    }
    prop_oneof![
        5 => near_valid(route),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        2 => invalid_bytes(route),
    ]
    .boxed()
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        select(vec![
            "0",
            "1",
            "4",
            "5",
            "-1",
            "3.0",
            "1e3",
            "9223372036854775807",
            "18446744073709551616",
            "99999999999999999999999",
            "NaN",
            "on",
            "off",
            "refresh",
            "ON",
            "",
            " ",
            "2023-06-01",
            "a:b",
            "a:b,c:d",
            "k:v,k:v,k:v,k:v,k:v,k:v,k:v,k:v,k:v,k:v,k:v",
            "%_",
            "_,%",
            "application/json",
            "text/plain",
            "multipart/form-data; boundary=x",
            "gzip",
            "br",
            "Bearer",
            "Bearer ",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        "[ -~]{0,40}".prop_map(String::into_bytes),
        // Every i64, and the extremes (i64::MAX panicked in chrono once).
        any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        select(vec![i64::MIN, -1, 0, i64::MAX]).prop_map(|n| n.to_string().into_bytes()),
        prop::collection::vec(0x80u8..=0xff, 1..8),
    ]
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    select(&ROUTES[..]).prop_flat_map(|route| {
        (
            Just(route),
            prop_oneof![
                select(vec![
                    "gpt-4o-mini",
                    "mini",
                    "nope",
                    "%FF",
                    "%00",
                    "a%2Fb",
                    "..",
                    "%F0%9F%A6%80"
                ])
                .prop_map(String::from),
                "[A-Za-z0-9._~-]{1,20}",
            ],
            prop_oneof![
                6 => Just(Auth::Bearer),
                2 => Just(Auth::XApiKey),
                1 => Just(Auth::None),
                1 => "[ -~]{0,60}".prop_map(Auth::Raw),
            ],
            prop::collection::vec((select(HEADERS), header_value()), 0..4),
            body(route),
        )
            .prop_map(|(route, model_id, auth, headers, body)| Case {
                route,
                model_id,
                auth,
                headers,
                body,
            })
    })
}

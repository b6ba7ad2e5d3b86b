//! The OpenAI Responses API (`POST /v1/responses`) as a client format, served two ways:
//!
//! - **natively** by an `openai` upstream (its `/responses` path): the client's body passes
//!   through with the model, the output cap (`max_output_tokens`), `store: false` and the
//!   expanded input rewritten (`shape_request`); usage is read from the answer's or
//!   `response.completed`'s `usage` (`usage_of`);
//! - **translated** for every other upstream, through the internal form like any client
//!   format (`adapter`): the request is read into a `canonical::Request` which the
//!   upstream's adapter writes; the upstream's answer, read into a `canonical::Answer`,
//!   becomes a `response` object, and its stream events the Responses events
//!   (`adapter::EventWriter`).
//!
//! The gateway keeps stored responses itself, so the id the client sees is the gateway's
//! (`Stamp`), never the upstream's. What a translated upstream cannot express is refused
//! with a 400 naming the field; built-in tools are refused on both paths (their calls are
//! billed apart from tokens, which the reservation cannot cover).

pub mod adapter;
pub mod stream;

use serde_json::{json, Map, Value};

use crate::config::Provider;
use crate::upstream::providers::canonical::Reported;
use crate::usage::Usage;

/// What the gateway writes into every response object it hands out.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The gateway's id (`resp_…`).
    pub id: String,
    pub store: bool,
    pub previous_response_id: Option<String>,
}

impl Stamp {
    /// Writes the gateway's id and its `store` / `previous_response_id` into a response.
    pub fn apply(&self, response: &mut Value) {
        if let Value::Object(o) = response {
            o.insert("id".into(), json!(self.id));
            o.insert("store".into(), json!(self.store));
            o.insert(
                "previous_response_id".into(),
                self.previous_response_id
                    .as_ref()
                    .map_or(Value::Null, |p| json!(p)),
            );
        }
    }
}

/// Whether `p` speaks the Responses API itself (else requests go through chat).
pub fn native(p: Provider) -> bool {
    matches!(p, Provider::Openai)
}

/// Body fields the gateway handles itself: never sent upstream as the client wrote them.
pub const GATEWAY_FIELDS: &[&str] = &["store", "previous_response_id"];

/// The native request: the client's fields with the upstream's model, the reserved cap,
/// `store: false` (the gateway keeps the conversation) and, when the client sends or gets
/// back reasoning, `include: ["reasoning.encrypted_content"]` so a later turn can carry it.
pub fn shape_request(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<i64>,
) -> Map<String, Value> {
    let mut out = body.clone();
    for f in GATEWAY_FIELDS {
        out.remove(*f);
    }
    out.insert("model".into(), json!(upstream_model));
    if let Some(cap) = cap {
        out.insert("max_output_tokens".into(), json!(cap));
    }
    out.insert("store".into(), json!(false));
    if out.get("reasoning").is_some_and(|r| !r.is_null()) {
        let include = out.entry("include").or_insert_with(|| json!([]));
        if let Value::Array(a) = include {
            if !a.iter().any(|v| v == "reasoning.encrypted_content") {
                a.push(json!("reasoning.encrypted_content"));
            }
        }
    }
    out
}

/// Usage from a Responses `usage` object (`input_tokens` includes the cached ones,
/// `output_tokens` the reasoning ones); `None` when absent or not in that shape.
pub fn usage_of(u: &Value) -> Option<Usage> {
    let count = |p: &str| crate::upstream::providers::tokens(u.pointer(p));
    // Both totals counts: a negative one is no report (`providers::tokens`).
    if !u.is_object() || count("/input_tokens").is_none() || count("/output_tokens").is_none() {
        return None;
    }
    let n = |p: &str| count(p).unwrap_or(0);
    Some(Usage {
        input: n("/input_tokens"),
        cached_input: n("/input_tokens_details/cached_tokens"),
        output: n("/output_tokens"),
        reasoning: n("/output_tokens_details/reasoning_tokens"),
        ..Usage::default()
    })
}

/// Usage of a whole Responses `response` object: its `usage`, and its `web_search_call`
/// output items, each a call billed per call (the usage object does not count them).
pub fn response_usage(response: &Value) -> Option<Usage> {
    let mut u = usage_of(response.get("usage")?)?;
    u.web_search_calls = web_search_calls(response);
    Some(u)
}

/// The sides a whole `response` object's `usage` reports (`usage_of`, its searches as in
/// `response_usage`): the input where `input_tokens` is a count, the output where
/// `output_tokens` is (a negative figure is none, `providers::tokens`); `None` with neither
/// or no such object.
pub fn response_reported(response: &Value) -> Option<Reported> {
    let u = response.get("usage").filter(|u| u.is_object())?;
    let has = |k: &str| crate::upstream::providers::tokens(u.get(k)).is_some();
    let (input, output) = (has("input_tokens"), has("output_tokens"));
    if !input && !output {
        return None;
    }
    let n = |p: &str| crate::upstream::providers::tokens(u.pointer(p)).unwrap_or(0);
    let usage = Usage {
        input: n("/input_tokens"),
        cached_input: n("/input_tokens_details/cached_tokens"),
        output: n("/output_tokens"),
        reasoning: n("/output_tokens_details/reasoning_tokens"),
        web_search_calls: web_search_calls(response),
        ..Usage::default()
    };
    Some(Reported::sides(usage, input, output))
}

/// How many searches a response's `output` holds: its `web_search_call` items, where the
/// items under one id are one search only when they are all the same item whole (a faulty
/// upstream's echoes); an id on items that differ (a relay's constant id) vouches for
/// nothing and each item under it is one. An id is of any JSON type; without one (`null`,
/// `""`) each item is one. Left (DESIGN, threat model): a constant-id relay's identical
/// search run twice is all-equal too, and counts one below its bill.
pub fn web_search_calls(response: &Value) -> i64 {
    use std::collections::hash_map::{Entry, HashMap};
    // Per id (its JSON text): the first item, how many items, whether all equal to it.
    let mut by_id: HashMap<String, (&Value, usize, bool)> = HashMap::new();
    let mut calls = 0usize;
    let items = response
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|item| item.get("type").and_then(Value::as_str) == Some("web_search_call"));
    for item in items {
        match item.get("id") {
            None | Some(Value::Null) => calls += 1,
            Some(Value::String(id)) if id.is_empty() => calls += 1,
            Some(id) => match by_id.entry(id.to_string()) {
                Entry::Vacant(v) => {
                    v.insert((item, 1, true));
                }
                Entry::Occupied(mut o) => {
                    let (first, n, same) = o.get_mut();
                    *n += 1;
                    *same = *same && *first == item;
                }
            },
        }
    }
    calls += by_id
        .values()
        .map(|&(_, n, same)| if same { 1 } else { n })
        .sum::<usize>();
    i64::try_from(calls).unwrap_or(i64::MAX)
}

/// The generated text of a response (counted when its usage is missing).
pub fn answer_text(v: &Value) -> String {
    let mut text = String::new();
    for item in v
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    for f in ["text", "refusal"] {
                        if let Some(t) = part.get(f).and_then(Value::as_str) {
                            text.push_str(t);
                        }
                    }
                }
            }
            Some("function_call" | "custom_tool_call") => {
                for f in ["name", "arguments", "input"] {
                    if let Some(t) = item.get(f).and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            // Reasoning the upstream shows: its summary and raw text (gpt-oss on vLLM).
            Some("reasoning") => {
                for part in ["summary", "content"]
                    .into_iter()
                    .filter_map(|f| item.get(f).and_then(Value::as_array))
                    .flatten()
                {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            // The calls of the other tools the client runs (shell, apply_patch…): what the
            // model wrote is the item's fields.
            Some(_) => text.push_str(&item.to_string()),
            None => {}
        }
    }
    text
}

/// The fields of a response object that echo the request.
pub fn echo(body: &Map<String, Value>) -> Map<String, Value> {
    let get = |k: &str, d: Value| body.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(d);
    let mut o = Map::new();
    o.insert("instructions".into(), get("instructions", Value::Null));
    o.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    o.insert("metadata".into(), get("metadata", json!({})));
    o.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    o.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    o.insert("temperature".into(), get("temperature", json!(1.0)));
    o.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    o.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    o.insert("tools".into(), get("tools", json!([])));
    o.insert("top_p".into(), get("top_p", json!(1.0)));
    o.insert("truncation".into(), json!("disabled"));
    o.insert("user".into(), get("user", Value::Null));
    o
}

#[cfg(test)]
mod tests;

//! The Responses API's own stages around the shared request path: before validation,
//! `previous_response_id` is expanded into the earlier conversation (the token's own stored
//! response, else 404); validation checks every item and tool (`validate`); after the
//! answer, the response is stored (`keep`) when the client asked for `store` (the default).
//! The upstream always gets `store: false` and the whole conversation, so any upstream and
//! key can continue it; the chain is counted and reserved for as a whole, never truncated.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::drain::Drain;
use super::request::Prepared;
use crate::auth::TokenAuth;
use crate::clock::db_time;
use crate::config::Provider;
use crate::error::ApiError;
use crate::quota::estimate;
use crate::state::AppState;
use crate::store::responses::{self as stored, StoredResponse};
use crate::store::StoreError;
use crate::upstream::providers;
use crate::upstream::providers::canonical::{Answer, Reported};
use crate::upstream::providers::formats::responses::{self as formats, Stamp};
use crate::upstream::providers::Format;

/// What the gateway knows of a Responses request beyond its body.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub stamp: Stamp,
    /// Every input item of the conversation up to this request (for the stored copy).
    pub input: Vec<Value>,
    pub token_id: i64,
}

/// The oldest stored response still kept (`[responses] retention_days`); a retention
/// longer than time goes back ("for ever") is the earliest instant there is, never an
/// overflow (which panicked every read, continuation and sweep).
pub fn oldest_kept(state: &AppState) -> DateTime<Utc> {
    let days = i64::from(state.settings.responses.retention_days);
    chrono::Duration::try_days(days)
        .and_then(|d| state.clock.now().checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `GET /v1/responses/{id}`: the stored response body, when it is the token's own and
/// still kept.
pub async fn find_stored(
    state: &AppState,
    id: &str,
    token_id: i64,
) -> Result<Option<String>, StoreError> {
    let row = stored::get(&state.db, id, token_id, oldest_kept(state)).await?;
    Ok(row.map(|r| r.response))
}

/// `DELETE /v1/responses/{id}`: whether the token's own kept response was there to delete.
pub async fn delete_stored(state: &AppState, id: &str, token_id: i64) -> Result<bool, StoreError> {
    stored::delete(&state.db, id, token_id, oldest_kept(state)).await
}

/// A new response id: `resp_` and a UUIDv7 (unique across replicas).
fn new_id() -> String {
    let mut buf = [0u8; uuid::fmt::Simple::LENGTH];
    format!(
        "resp_{}",
        uuid::Uuid::now_v7().simple().encode_lower(&mut buf)
    )
}

/// The request's input as items (a string is one user message).
fn items_of(input: Option<&Value>) -> Vec<Value> {
    match input {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    }
}

/// Reads `store` and `previous_response_id` and expands the latter: the body's `input`
/// becomes the stored conversation's input and output items followed by this request's.
/// A body that is not a JSON object is left for `request::prepare` to refuse.
pub async fn expand(
    state: &AppState,
    auth: &TokenAuth,
    raw: bytes::Bytes,
) -> Result<(bytes::Bytes, Ctx), ApiError> {
    let mut ctx = Ctx {
        stamp: Stamp {
            id: new_id(),
            store: true,
            previous_response_id: None,
        },
        input: Vec::new(),
        token_id: auth.owner.token_id,
    };
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(&raw) else {
        return Ok((raw, ctx));
    };
    ctx.stamp.store = match body.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid("store", "`store` must be a boolean")),
    };
    // A retention of 0 days keeps nothing: no conversation is written to wait for the
    // sweep, and the client is told `store: false`.
    ctx.stamp.store &= state.settings.responses.retention_days > 0;
    let previous = match body.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "`previous_response_id` must be a non-empty string",
            ))
        }
    };
    // A continuation's own input is read as strictly as a first turn's (`validate`): one of
    // another type is refused, never dropped for the stored conversation alone.
    if previous.is_some() {
        match body.get("input") {
            None => {}
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(Value::Array(a)) if !a.is_empty() => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "input",
                    "`input` must be a non-empty string or array of items",
                ))
            }
        }
    }
    let mut input = Vec::new();
    if let Some(id) = &previous {
        let row = stored::get(&state.db, id, auth.owner.token_id, oldest_kept(state))
            .await
            .map_err(|e| ApiError::from_store(&e, "stored response"))?
            .ok_or_else(|| ApiError::ResponseNotFound {
                id: id.clone(),
                param: Some("previous_response_id"),
            })?;
        let earlier: Vec<Value> = serde_json::from_str(&row.input).unwrap_or_default();
        let answer: Value = serde_json::from_str(&row.response).unwrap_or(Value::Null);
        input.extend(earlier);
        // A reasoning item without its `encrypted_content` (the model reasoned unasked, so
        // the upstream was not told to include it) is only an id the upstream never kept
        // (`store: false`): sent back, OpenAI answers 404. It is left out.
        input.extend(
            answer
                .get("output")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|i| {
                    i.get("type").and_then(Value::as_str) != Some("reasoning")
                        || i.get("encrypted_content").is_some_and(Value::is_string)
                })
                .cloned(),
        );
        ctx.stamp.previous_response_id = Some(id.clone());
    }
    if let Some(now) = body.get("input").filter(|v| v.is_string() || v.is_array()) {
        input.extend(items_of(Some(now)));
    }
    ctx.input = input;
    if previous.is_none() {
        return Ok((raw, ctx));
    }
    body.insert("input".into(), Value::Array(ctx.input.clone()));
    body.remove("previous_response_id");
    let raw = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
    // `server.max_body_bytes` bounds the conversation too: each turn under it must not
    // build one past it (an image counts ~1 105 tokens whatever its bytes, so the input
    // cap alone would let a chain be held, sent and stored at many times the limit).
    let limit = state.settings.server.max_body_bytes;
    if raw.len() > limit {
        return Err(ApiError::invalid(
            "input",
            format!(
                "The conversation continued from `previous_response_id` is {} bytes with this input; Sluice accepts at most {limit}.",
                raw.len()
            ),
        ));
    }
    Ok((raw.into(), ctx))
}

/// Request fields the gateway does not serve on any path, with why.
const REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported by Sluice",
    ),
    (
        "conversation",
        "conversations are not supported by Sluice; use `previous_response_id`",
    ),
    ("prompt", "prompt templates are not supported by Sluice"),
];

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

/// OpenAI's limits on `metadata`, which the gateway echoes and stores with the response
/// (and a translated upstream never sees): at most 16 pairs, keys of at most 64
/// characters, values strings of at most 512.
fn check_metadata(m: &Map<String, Value>) -> Result<(), ApiError> {
    if m.len() > 16 {
        return Err(bad(
            "metadata",
            format!("`metadata` has {} pairs; at most 16 are allowed", m.len()),
        ));
    }
    for (k, v) in m {
        if k.chars().count() > 64 {
            return Err(bad(
                "metadata",
                "`metadata` keys are at most 64 characters long",
            ));
        }
        match v.as_str() {
            Some(s) if s.chars().count() <= 512 => {}
            Some(_) => {
                return Err(bad(
                    "metadata",
                    "`metadata` values are at most 512 characters long",
                ))
            }
            None => return Err(bad("metadata", "`metadata` values must be strings")),
        }
    }
    Ok(())
}

/// Validates a Responses body and counts its input tokens.
pub fn validate(body: &Map<String, Value>) -> Result<i64, ApiError> {
    for (field, why) in REFUSED {
        match body.get(*field) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => return Err(bad(field, format!("`{field}`: {why}"))),
        }
    }
    if let Some(t) = body.get("truncation").filter(|t| !t.is_null()) {
        if t != "disabled" {
            return Err(bad(
                "truncation",
                "`truncation` must be `disabled`: Sluice never drops part of a conversation",
            ));
        }
    }
    if body
        .get("instructions")
        .is_some_and(|i| !(i.is_null() || i.is_string()))
    {
        return Err(bad("instructions", "`instructions` must be a string"));
    }
    for f in ["reasoning", "text", "metadata"] {
        if body.get(f).is_some_and(|v| !(v.is_null() || v.is_object())) {
            return Err(bad(f, format!("`{f}` must be an object")));
        }
    }
    if let Some(m) = body.get("metadata").and_then(Value::as_object) {
        check_metadata(m)?;
    }
    if body.get("include").is_some_and(|v| {
        !(v.is_null() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
    }) {
        return Err(bad("include", "`include` must be an array of strings"));
    }
    if let Some(f) = body
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
    {
        match f.get("type").and_then(Value::as_str) {
            Some("text" | "json_object") => {}
            Some("json_schema") => {
                if !f.get("name").is_some_and(Value::is_string)
                    || !f.get("schema").is_some_and(Value::is_object)
                {
                    return Err(bad(
                        "text",
                        "`text.format` of type `json_schema` needs a `name` and a `schema` object",
                    ));
                }
            }
            _ => {
                return Err(bad(
                    "text",
                    "`text.format.type` must be `text`, `json_object` or `json_schema`",
                ))
            }
        }
    }
    let tools = validate_tools(body)?;
    let items = match body.get("input") {
        Some(Value::String(s)) if !s.is_empty() => {
            return Ok(estimate::count_text(s) + 7 + instructions(body) + tools);
        }
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => {
            return Err(bad(
                "input",
                "`input` must be a non-empty string or array of items",
            ))
        }
        None => return Err(bad("input", "`input` is required")),
    };
    let mut calls: Vec<&str> = Vec::new();
    let mut tokens = 3 + instructions(body) + tools;
    for (i, item) in items.iter().enumerate() {
        validate_item(i, item, &mut calls)?;
        tokens += 4 + estimate::count_message(item);
    }
    Ok(tokens)
}

fn instructions(body: &Map<String, Value>) -> i64 {
    body.get("instructions")
        .and_then(Value::as_str)
        .map_or(0, |s| 4 + estimate::count_text(s))
}

/// Function tools only: a built-in tool is refused by name (its calls are billed apart
/// from tokens, which no reservation covers). Returns the tools' token count.
fn validate_tools(body: &Map<String, Value>) -> Result<i64, ApiError> {
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => {}
        Some(c) if c.get("type").and_then(Value::as_str) == Some("function")
            && c.get("name").is_some_and(Value::is_string) => {}
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "`tool_choice` must be `auto`, `none`, `required` or {\"type\": \"function\", \"name\": …}",
            ))
        }
    }
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(bad("tools", "`tools` must be an array")),
    };
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                if t.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
                    return Err(bad("tools", format!("tools[{i}]: a function tool needs a `name`")));
                }
                if t.get("parameters").is_some_and(|p| !(p.is_null() || p.is_object())) {
                    return Err(bad("tools", format!("tools[{i}]: `parameters` must be a JSON Schema object")));
                }
            }
            // Tools the client runs itself (Codex sends these): no hosted call to pay for.
            Some(kind) if CLIENT_TOOLS.contains(&kind) => {}
            Some(other) => {
                return Err(bad(
                    "tools",
                    format!("tools[{i}]: the built-in tool `{other}` is not supported by Sluice (its calls are billed apart from tokens); only tools the client runs are"),
                ))
            }
            None => return Err(bad("tools", format!("tools[{i}]: a tool needs a `type`"))),
        }
    }
    Ok(estimate::count_value(&Value::Array(tools.clone())))
}

/// Tool types the client executes (besides `function`): the upstream only writes calls.
const CLIENT_TOOLS: &[&str] = &["custom", "namespace", "local_shell", "shell", "apply_patch"];

/// Input items of those tools: calls the model made and outputs the client sends back.
const CLIENT_TOOL_ITEMS: &[&str] = &[
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
];

const PART_TYPES: &[&str] = &[
    "input_text",
    "input_image",
    "input_file",
    "output_text",
    "refusal",
];

fn validate_item<'a>(i: usize, item: &'a Value, calls: &mut Vec<&'a str>) -> Result<(), ApiError> {
    let Some(o) = item.as_object() else {
        return Err(bad("input", format!("input[{i}] must be an object")));
    };
    let text = |k: &str| o.get(k).and_then(Value::as_str);
    match text("type").unwrap_or("message") {
        "message" => {
            if !matches!(
                text("role"),
                Some("user" | "assistant" | "system" | "developer")
            ) {
                return Err(bad("input", format!("input[{i}]: a message needs a `role` of user, assistant, system or developer")));
            }
            match o.get("content") {
                Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => {
                    for (j, p) in parts.iter().enumerate() {
                        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                        if !PART_TYPES.contains(&kind) {
                            return Err(bad(
                                "input",
                                format!(
                                    "input[{i}].content[{j}]: unsupported content type {kind:?}"
                                ),
                            ));
                        }
                        // The upstream fetches and reads the whole document (each page's
                        // text and image charged as input) where the gateway sees a URL:
                        // no input count, so no reservation, covers it.
                        if kind == "input_file" && p.get("file_url").is_some_and(|u| !u.is_null()) {
                            return Err(bad(
                                "input",
                                format!("input[{i}].content[{j}]: an `input_file` by `file_url` is not supported by Sluice (it cannot count the document to reserve for it); send `file_data`"),
                            ));
                        }
                    }
                }
                _ => {
                    return Err(bad(
                        "input",
                        format!(
                            "input[{i}]: a message needs `content`: a string or an array of parts"
                        ),
                    ))
                }
            }
        }
        "function_call" => {
            let (Some(call_id), Some(_), Some(_)) =
                (text("call_id"), text("name"), text("arguments"))
            else {
                return Err(bad("input", format!("input[{i}]: a `function_call` needs string `call_id`, `name` and `arguments`")));
            };
            calls.push(call_id);
        }
        "function_call_output" => {
            let Some(call_id) = text("call_id") else {
                return Err(bad(
                    "input",
                    format!("input[{i}]: a `function_call_output` needs a string `call_id`"),
                ));
            };
            if !calls.contains(&call_id) {
                return Err(bad(
                    "input",
                    format!("input[{i}]: no earlier `function_call` has the call_id `{call_id}`"),
                ));
            }
            if !o
                .get("output")
                .is_some_and(|v| v.is_string() || v.is_array())
            {
                return Err(bad(
                    "input",
                    format!("input[{i}]: `output` must be a string or an array of parts"),
                ));
            }
        }
        "reasoning" => {
            if !o.get("summary").is_some_and(Value::is_array) {
                return Err(bad(
                    "input",
                    format!("input[{i}]: a `reasoning` item needs a `summary` array"),
                ));
            }
        }
        kind if CLIENT_TOOL_ITEMS.contains(&kind) => {
            if let Some(call_id) = text("call_id") {
                let output = kind.ends_with("_output");
                if output && kind.starts_with("custom") && !calls.contains(&call_id) {
                    return Err(bad(
                        "input",
                        format!("input[{i}]: no earlier call has the call_id `{call_id}`"),
                    ));
                }
                if !output {
                    calls.push(call_id);
                }
            }
        }
        other => {
            return Err(bad(
                "input",
                format!("input[{i}]: items of type `{other}` are not supported by Sluice"),
            ))
        }
    }
    Ok(())
}

/// A non-streamed answer for a Responses client: its usage as reported (each side, else
/// `None`), the format it was read in (`providers::answer_text` of it counts a side not
/// reported, `pipeline::finish`) and the response object, stamped with the gateway's id,
/// for `keep` to store once the answer's cost is what a departure is charged.
///
/// `read` is the answer of an upstream that does not speak the Responses API as the
/// attempt read it (`attempts::relayable`: one it cannot read was no success, and never
/// reaches here); `None`, a native answer, whose shape the attempt checked.
pub fn answer(
    p: &Prepared,
    ctx: &Ctx,
    upstream: Provider,
    (answer, read): (&Value, Option<&Answer>),
) -> (Reported, Format, bytes::Bytes, Value) {
    let (read_as, usage, mut response) = match read {
        None => {
            let usage = providers::answer_usage(Format::Responses, answer);
            (Format::Responses, usage, answer.clone())
        }
        // Through the internal form: written as a response object.
        Some(a) => {
            let usage = providers::answer_usage(upstream, answer);
            let ids = ctx.stamp.id.trim_start_matches("resp_");
            let response = formats::adapter::write_answer(a, &p.body, ids);
            (providers::format_of(upstream), usage, response)
        }
    };
    ctx.stamp.apply(&mut response);
    let body = bytes::Bytes::from(response.to_string());
    (usage, read_as, body, response)
}

/// How long after the drain's start a response may wait on the store (`keep`): past a
/// stream's read-on (`stream::AFTER_THE_FINISH`), so a response its end completed is still
/// kept, and short of the workers' stop (`startup::SETTLE_MARGIN`), with room to settle.
pub const STORED_BY: Duration = Duration::from_millis(2_500);

/// Stores the response the client receives (when it asked for `store`, the default) before
/// it is answered, so its id works at once. A store failure is logged (without the
/// conversation), never the client's error: the answer is already paid for.
///
/// At the shutdown the store has until `STORED_BY` after the drain: the request must
/// settle and answer before its worker is stopped, and a store held past that would stop
/// it first. The gateway then stops waiting: a write already with the database may still
/// land, one still waiting for a connection does not — the response may not be kept, which
/// the log warns of.
pub async fn keep(state: &AppState, ctx: &Ctx, response: &Value, drain: &Drain) {
    if !ctx.stamp.store || response.get("status").is_some_and(|s| s == "failed") {
        return;
    }
    let row = StoredResponse {
        id: ctx.stamp.id.clone(),
        token_id: ctx.token_id,
        created_at: db_time(state.clock.now()),
        input: Value::Array(ctx.input.clone()).to_string(),
        response: response.to_string(),
    };
    tokio::select! {
        biased;
        stored = stored::put(&state.db, &row) => if let Err(e) = stored {
            tracing::warn!(error = %e, response_id = %row.id, "a response could not be stored");
        },
        () = drain.after(STORED_BY) => tracing::warn!(
            response_id = %row.id,
            "the shutdown came before the response's store answered: it may not be kept"
        ),
    }
}

//! The mock's AWS Bedrock side: `POST /model/{id}/converse` (a Converse answer) and
//! `/model/{id}/converse-stream` (the binary event stream, encoded with
//! `aws-smithy-eventstream` through `providers::bedrock::eventstream::encode`).
//!
//! The caller's key is the SigV4 access key id (or the Bedrock API key of a bearer call),
//! so scripts and stats work per key as for the other formats. A SigV4 `Authorization`
//! header must have AWS's shape (service `bedrock`). The signature is verified — recomputed
//! with `aws-sigv4` over the request as received (its raw path, its headers, its body) and
//! a mismatch answered 403 `InvalidSignatureException` as AWS does — for an access key id
//! registered with its secret (`BedrockKeys::register`, optionally with the session token
//! its temporary credentials carry: then a request without that `x-amz-security-token`,
//! or with it unsigned, is refused), and for every key when `MockConfig::bedrock_secret`
//! is set. A signing bug fails a test.
//!
//! Scripts apply as elsewhere: `status` answers Bedrock's error (body `{"message"}`, type in
//! `x-amzn-ErrorType`), `text` / token figures shape the answer, `cut_after` ends the stream
//! after that many text deltas, `stall_after` stops sending there (the connection kept),
//! `corrupt_after` sends a frame with a broken CRC there, and
//! `events` (`[type, payload]` pairs) replaces the built-in stream — a type ending in
//! `Exception` is sent as an exception frame (a mid-stream error); `body` replaces a whole
//! answer's JSON.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::{InFlightGuard, MockConfig, Script, SseEvent};
use crate::upstream::providers::bedrock::eventstream::{encode, FrameKind};
use crate::upstream::providers::bedrock::sigv4::{BodyHashHeader, Signer};

/// A refused call: the status, Bedrock's error type and its message.
pub(super) type Refusal = (u16, &'static str, &'static str);

/// The AWS credentials the mock knows: access key id → (secret, session token).
#[derive(Debug, Default)]
pub struct BedrockKeys(parking_lot::Mutex<HashMap<String, (String, Option<String>)>>);

impl BedrockKeys {
    /// Signatures made with `access_key_id` are verified against `secret`; with a
    /// `session_token` (temporary credentials), the request must carry it, signed.
    pub fn register(&self, access_key_id: &str, secret: &str, session_token: Option<&str>) {
        self.0.lock().insert(
            access_key_id.to_string(),
            (secret.to_string(), session_token.map(str::to_string)),
        );
    }
}

/// The key a Bedrock call is counted under, or the 403 its `Authorization` earns.
pub(super) fn key_of(
    cfg: &MockConfig,
    keys: &BedrockKeys,
    req: &HttpRequest,
    body: &[u8],
) -> Result<String, Refusal> {
    let h = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let authz = h("authorization");
    if let Some(key) = authz.strip_prefix("Bearer ") {
        return Ok(key.to_string());
    }
    let Some(rest) = authz.strip_prefix("AWS4-HMAC-SHA256 Credential=") else {
        return Err((
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    };
    let scope: Vec<&str> = rest.split(',').next().unwrap_or("").split('/').collect();
    let well_formed = scope.len() == 5
        && scope[3] == "bedrock"
        && scope[4] == "aws4_request"
        && rest.contains(", SignedHeaders=")
        && rest.contains("host")
        && rest.contains("x-amz-date")
        && rest
            .rsplit("Signature=")
            .next()
            .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed {
        return Err((
            403,
            "IncompleteSignatureException",
            "The Authorization header is malformed.",
        ));
    }
    let key = scope[0].to_string();
    let sent_token = req
        .headers()
        .get("x-amz-security-token")
        .and_then(|v| v.to_str().ok());
    let registered = keys.0.lock().get(&key).cloned();
    let known = match registered {
        Some((secret, Some(token))) => {
            if sent_token != Some(token.as_str()) {
                return Err((
                    403,
                    "UnrecognizedClientException",
                    "The security token included in the request is invalid.",
                ));
            }
            Some((secret, Some(token)))
        }
        Some((secret, None)) => Some((secret, sent_token.map(str::to_string))),
        None => cfg
            .bedrock_secret
            .clone()
            .map(|secret| (secret, sent_token.map(str::to_string))),
    };
    if let Some((secret, token)) = known {
        let Some(time) = amz_time(h("x-amz-date")) else {
            return Err((
                403,
                "IncompleteSignatureException",
                "x-amz-date is missing or malformed.",
            ));
        };
        // With a token expected, it must be among the signed headers: the signature is
        // recomputed with it, as AWS does.
        let signer = Signer::new(&key, &secret, token.as_deref(), scope[2], "bedrock");
        let url = format!("http://{}{}", h("host"), req.uri());
        let expected = signer
            .sign(
                "POST",
                &url,
                &[("content-type", h("content-type"))],
                body,
                time,
                BodyHashHeader::Omit,
            )
            .ok()
            .and_then(|added| added.into_iter().find(|(n, _)| *n == "authorization"))
            .map(|(_, v)| v);
        if expected.as_deref() != Some(authz) {
            return Err((
                403,
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided.",
            ));
        }
    }
    Ok(key)
}

/// `20150830T123600Z` as a time.
fn amz_time(s: &str) -> Option<SystemTime> {
    let t = chrono::NaiveDateTime::parse_from_str(s, "%Y%m%dT%H%M%SZ").ok()?;
    let secs = u64::try_from(t.and_utc().timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// A Bedrock error answer.
pub(super) fn error(status: u16, ty: &str, message: &str) -> HttpResponse {
    let code = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code)
        .insert_header((
            "x-amzn-ErrorType",
            format!("{ty}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        ))
        .json(json!({ "message": message }))
}

fn error_type(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// The first tool of the request when the model should call one: tools were given and the
/// conversation's last turn is not a tool result.
fn tool_to_call(body: &Value) -> Option<String> {
    let name = body
        .pointer("/toolConfig/tools/0/toolSpec/name")?
        .as_str()?;
    let last = body.get("messages")?.as_array()?.last()?;
    let answered = last["content"]
        .as_array()
        .is_some_and(|c| c.iter().any(|b| b.get("toolResult").is_some()));
    (!answered).then(|| name.to_string())
}

/// Answers one Converse or ConverseStream call as `script` says.
/// `guard` holds the key's in-flight count until the answer (or the stream) ends.
pub(super) async fn answer(
    cfg: &MockConfig,
    stream: bool,
    body: &Value,
    script: Script,
    guard: InFlightGuard,
) -> HttpResponse {
    if script.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
    }
    if let Some(status) = script.status.filter(|s| *s >= 300) {
        let mut resp = error(
            status,
            error_type(status),
            "Scripted error from the Sluice mock.",
        );
        for (k, v) in &script.headers {
            if let (Ok(name), Ok(value)) = (
                actix_web::http::header::HeaderName::try_from(k.as_str()),
                actix_web::http::header::HeaderValue::from_str(v),
            ) {
                resp.headers_mut().insert(name, value);
            }
        }
        return resp;
    }
    let text = script.text.clone().unwrap_or_else(|| cfg.text.clone());
    // As Bedrock reports them: `inputTokens` without the prompt cache's reads, which
    // `cacheReadInputTokens` carries; reasoning inside `outputTokens`.
    let cached = script.cached_tokens.unwrap_or(0);
    let input = script.prompt_tokens.unwrap_or(cfg.prompt_tokens) - cached;
    let output = script.completion_tokens.unwrap_or(cfg.completion_tokens)
        + script.reasoning_tokens.unwrap_or(0);
    let mut usage = json!({ "inputTokens": input, "outputTokens": output, "totalTokens": input + cached + output });
    if cached > 0 {
        usage["cacheReadInputTokens"] = json!(cached);
    }
    let tool = tool_to_call(body);
    let args = script.tool_arguments.as_deref().unwrap_or("{}");
    if !stream {
        if let Some(b) = &script.body {
            return HttpResponse::Ok().json(b);
        }
        let mut content = vec![json!({ "text": text })];
        if let Some(name) = &tool {
            content.push(
                json!({ "toolUse": { "toolUseId": "tooluse_mock_1", "name": name,
                    "input": serde_json::from_str::<Value>(args).unwrap_or_default() } }),
            );
        }
        let stop = if tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        };
        return HttpResponse::Ok().json(json!({
            "output": { "message": { "role": "assistant", "content": content } },
            "stopReason": stop,
            "usage": usage,
            "metrics": { "latencyMs": 1 },
        }));
    }
    let mut frames: Vec<Vec<u8>> = Vec::new();
    // `stall_after`: the frame before which the stream stops sending (the connection kept).
    let mut stall_at = None;
    let event = |name: &str, data: Value| encode(FrameKind::Event, name, &data.to_string());
    if let Some(events) = &script.events {
        for e in events {
            let (name, data) = match e {
                SseEvent::Named(name, data) => (name.clone(), data.clone()),
                SseEvent::Data(data) => ("contentBlockDelta".to_string(), data.clone()),
            };
            let data = match data {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let kind = if name.ends_with("Exception") {
                FrameKind::Exception
            } else {
                FrameKind::Event
            };
            frames.push(encode(kind, &name, &data));
        }
    } else {
        frames.push(event("messageStart", json!({ "role": "assistant" })));
        let mut deltas = 0;
        for piece in super::pieces(&text) {
            if script.cut_after == Some(deltas) {
                break;
            }
            if script.stall_after == Some(deltas) {
                stall_at = Some(frames.len());
            }
            if script.corrupt_after == Some(deltas) {
                let mut bad = event(
                    "contentBlockDelta",
                    json!({ "contentBlockIndex": 0, "delta": { "text": "x" } }),
                );
                let n = bad.len();
                bad[n - 1] ^= 0xff;
                frames.push(bad);
            }
            frames.push(event(
                "contentBlockDelta",
                json!({ "contentBlockIndex": 0, "delta": { "text": piece } }),
            ));
            deltas += 1;
        }
        if script.cut_after.is_none_or(|c| c > deltas) {
            frames.push(event("contentBlockStop", json!({ "contentBlockIndex": 0 })));
            if let Some(name) = &tool {
                frames.push(event("contentBlockStart", json!({ "contentBlockIndex": 1, "start": { "toolUse": { "toolUseId": "tooluse_mock_1", "name": name } } })));
                frames.push(event(
                    "contentBlockDelta",
                    json!({ "contentBlockIndex": 1, "delta": { "toolUse": { "input": args } } }),
                ));
                frames.push(event("contentBlockStop", json!({ "contentBlockIndex": 1 })));
            }
            let stop = if tool.is_some() {
                "tool_use"
            } else {
                "end_turn"
            };
            frames.push(event("messageStop", json!({ "stopReason": stop })));
            if !script.omit_usage {
                frames.push(event(
                    "metadata",
                    json!({ "usage": usage, "metrics": { "latencyMs": 1 } }),
                ));
            }
        }
    }
    let chunk_delay = Duration::from_millis(script.chunk_delay_ms);
    let body = async_stream::stream! {
        let _guard = guard;
        for (i, f) in frames.into_iter().enumerate() {
            if !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            if stall_at == Some(i) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            yield Ok::<_, actix_web::Error>(actix_web::web::Bytes::from(f));
        }
    };
    HttpResponse::Ok()
        .content_type("application/vnd.amazon.eventstream")
        .streaming(body)
}

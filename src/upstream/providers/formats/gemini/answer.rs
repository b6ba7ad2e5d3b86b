//! A Gemini `GenerateContentResponse` → the internal answer, and `usageMetadata` → usage.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::upstream::providers::canonical::{Answer, Finish, Part, Reported, Usage};
use crate::upstream::providers::tokens;
use crate::upstream::providers::translate::stream::Corrupt;

/// A whole answer. The first candidate is the answer (the gateway never asks for more);
/// a prompt blocked by a safety filter (`promptFeedback.blockReason`, no candidate) is an
/// empty answer that finished by the content filter.
pub fn read_answer(v: &Value) -> Result<Answer, Corrupt> {
    let obj = v.as_object().ok_or(Corrupt::Shape)?;
    let prefix = call_prefix(v);
    let mut content = Vec::new();
    let mut calls = 0;
    let candidate = match obj.get("candidates") {
        None | Some(Value::Null) => None,
        Some(Value::Array(c)) => c.first(),
        Some(_) => return Err(Corrupt::Shape),
    };
    let finish = match candidate {
        Some(c) => {
            for part in parts_of(c)? {
                read_part(part, &prefix, &mut calls, &mut content)?;
            }
            finish_of(c.get("finishReason"), calls > 0)
        }
        None if blocked(v) => Finish::ContentFilter,
        // No candidate, nor a block named: no reason given (s28 stop attack F1).
        None => Finish::unvouched(Finish::Stop),
    };
    Ok(Answer {
        id: text(v.get("responseId")).unwrap_or_default(),
        model: text(v.get("modelVersion")).unwrap_or_default(),
        content,
        finish,
        usage: v.get("usageMetadata").and_then(read_usage),
        created: text(v.get("createTime"))
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.timestamp()),
    })
}

/// Usage from `usageMetadata`; `None` when it carries no figure.
pub fn read_usage(u: &Value) -> Option<Usage> {
    let u = u.as_object()?;
    let n = |k: &str| tokens(u.get(k));
    if n("promptTokenCount").is_none() && n("candidatesTokenCount").is_none() {
        return None;
    }
    let f = |k: &str| n(k).unwrap_or(0);
    let thoughts = f("thoughtsTokenCount");
    // Per-modality counts of the prompt and of the candidates (thoughts are apart from
    // them). The prompt's include its cached tokens, which `cacheTokensDetails` counts by
    // modality: a cached image token is priced as cached, once; a cached audio token as
    // audio — Google bills it above the text cache rate and no cached-audio rate is kept,
    // so the audio input rate is the one never below the bill.
    let modality = |details: &str, m: &str| {
        u.get(details)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|d| d.get("modality").and_then(Value::as_str) == Some(m))
            .filter_map(|d| tokens(d.get("tokenCount")))
            .fold(0i64, i64::saturating_add)
    };
    Some(Usage {
        input: f("promptTokenCount").saturating_add(f("toolUsePromptTokenCount")),
        output: f("candidatesTokenCount").saturating_add(thoughts),
        cached_input: (f("cachedContentTokenCount") - modality("cacheTokensDetails", "AUDIO"))
            .max(0),
        reasoning: thoughts,
        audio_input: modality("promptTokensDetails", "AUDIO"),
        image_input: (modality("promptTokensDetails", "IMAGE")
            - modality("cacheTokensDetails", "IMAGE"))
        .max(0),
        audio_output: modality("candidatesTokensDetails", "AUDIO"),
        image_output: modality("candidatesTokensDetails", "IMAGE"),
        ..Usage::default()
    })
}

/// The sides a `usageMetadata` reports (a stream chunk's or a whole answer's): the input
/// where `promptTokenCount` is, the output where `candidatesTokenCount` or
/// `thoughtsTokenCount` is. A running usage often has the prompt's count alone, and an
/// answer may carry `candidatesTokenCount` alone: the other side is absent, not 0.
pub fn read_reported(u: &Value) -> Option<Reported> {
    let has = |k: &str| tokens(u.get(k)).is_some();
    Some(Reported::sides(
        read_usage(u)?,
        has("promptTokenCount"),
        has("candidatesTokenCount") || has("thoughtsTokenCount"),
    ))
}

/// True when the prompt itself was blocked (no candidate is generated then).
pub(super) fn blocked(v: &Value) -> bool {
    v.pointer("/promptFeedback/blockReason")
        .is_some_and(|r| r.is_string())
}

/// A candidate's parts (`content` may be absent: a candidate stopped by a filter).
pub(super) fn parts_of(c: &Value) -> Result<&[Value], Corrupt> {
    match c.get("content").and_then(|c| c.get("parts")) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(p)) => Ok(p),
        Some(_) => Err(Corrupt::Shape),
    }
}

/// One part of an answer into the internal parts.
fn read_part(
    part: &Value,
    prefix: &str,
    calls: &mut usize,
    out: &mut Vec<Part>,
) -> Result<(), Corrupt> {
    let signature = text(part.get("thoughtSignature"));
    if part.get("thought").and_then(Value::as_bool) == Some(true) {
        out.push(Part::Reasoning {
            text: text(part.get("text")).unwrap_or_default(),
            signature,
            redacted: None,
        });
        return Ok(());
    }
    if let Some(s) = signature {
        out.push(Part::Reasoning {
            text: String::new(),
            signature: Some(s),
            redacted: None,
        });
    }
    if let Some(call) = part.get("functionCall") {
        let name = text(call.get("name")).ok_or(Corrupt::Shape)?;
        let args = match call.get("args") {
            None | Some(Value::Null) => "{}".to_string(),
            Some(a @ Value::Object(_)) => a.to_string(),
            Some(_) => return Err(Corrupt::Shape),
        };
        out.push(Part::ToolCall {
            id: call_id(prefix, *calls),
            name,
            arguments: args,
        });
        *calls += 1;
    } else if let Some(t) = part.get("text") {
        let t = t.as_str().ok_or(Corrupt::Shape)?;
        if !t.is_empty() {
            out.push(Part::Text {
                text: t.to_string(),
                cache: None,
            });
        }
    } else if !signature_only(part) {
        // Inline images, code execution: nothing the internal form carries, and an answer
        // is never cut silently.
        return Err(unmodelled(part));
    }
    Ok(())
}

/// A part that carries a thought signature and nothing the gateway leaves out: a signed
/// image or code part (Gemini 3 signs its image parts) is one the gateway cannot pass on,
/// not a signature to keep (s28 final attack #2: it was dropped, the answer cut silently).
pub(super) fn signature_only(part: &Value) -> bool {
    part.get("thoughtSignature").is_some()
        && !UNMODELLED_PARTS.iter().any(|k| part.get(*k).is_some())
}

/// The kinds of part Google documents that the gateway does not model.
const UNMODELLED_PARTS: [&str; 6] = [
    "inlineData",
    "fileData",
    "executableCode",
    "codeExecutionResult",
    "functionResponse",
    "videoMetadata",
];

/// Why a part that is none of those read could not be: one of a kind Google documents and
/// the gateway does not model (an `inlineData` image, `executableCode`) leaves the
/// upstream's answer well-formed (`Corrupt::Unsupported`); anything else — not an object,
/// nothing in it, or fields of no documented kind (a broken server's `{"value": …}`) — is
/// no part at all (`Corrupt::Shape`), so a garbled answer stays its key's failure (s28 late
/// attack F6: any stray field made it unsupported).
pub(super) fn unmodelled(part: &Value) -> Corrupt {
    match part.as_object() {
        Some(fields) if UNMODELLED_PARTS.iter().any(|k| fields.contains_key(*k)) => {
            Corrupt::Unsupported
        }
        _ => Corrupt::Shape,
    }
}

/// The prefix of this answer's call ids: its `responseId`, else a digest of the answer,
/// so the ids are the same each time the answer is read and differ between answers.
pub(super) fn call_prefix(v: &Value) -> String {
    match text(v.get("responseId")) {
        Some(id) if !id.is_empty() => id,
        _ => hex::encode(&Sha256::digest(v.to_string().as_bytes())[..8]),
    }
}

pub(super) fn call_id(prefix: &str, n: usize) -> String {
    format!("call_{prefix}_{n}")
}

/// Gemini's `finishReason`. `STOP` after function calls is the internal `ToolCalls`. None
/// given (absent, or `FINISH_REASON_UNSPECIFIED`) is told a client as `STOP` would be, but
/// is not whole (`Finish::Unvouched`, s28 stop attack F1).
pub(super) fn finish_of(reason: Option<&Value>, called: bool) -> Finish {
    let told = if called {
        Finish::ToolCalls
    } else {
        Finish::Stop
    };
    match reason.and_then(Value::as_str) {
        None | Some("FINISH_REASON_UNSPECIFIED") => Finish::unvouched(told),
        Some("STOP") => told,
        Some("MAX_TOKENS") => Finish::Length,
        Some(
            "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION",
        ) => Finish::ContentFilter,
        Some(other) => Finish::Other(other.to_string()),
    }
}

pub(super) fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

/// The text of an answer without usage, to count: every text part of the first candidate.
pub fn answer_text(v: &Value) -> String {
    let parts = v
        .pointer("/candidates/0/content/parts")
        .and_then(Value::as_array);
    let mut text = String::new();
    for p in parts.into_iter().flatten() {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            text.push_str(t);
        }
        if let Some(c) = p.get("functionCall") {
            text.push_str(&c.to_string());
        }
    }
    text
}

//! Reading what Bedrock sends back: a Converse answer, its usage, and its errors.

use serde_json::Value;

use crate::upstream::providers::canonical::{
    Answer, ErrorInfo, ErrorKind, Finish, Part, Reported, Usage,
};
use crate::upstream::providers::tokens;
use crate::upstream::providers::translate::stream::Corrupt;

/// A Converse `stopReason` in the internal form.
pub(super) fn finish_of(reason: &str) -> Finish {
    match reason {
        "end_turn" => Finish::Stop,
        "tool_use" => Finish::ToolCalls,
        "max_tokens" => Finish::Length,
        // Converse does not say which sequence matched.
        "stop_sequence" => Finish::StopSequence(None),
        "guardrail_intervened" | "content_filtered" => Finish::ContentFilter,
        other => Finish::Other(other.to_string()),
    }
}

/// Bedrock's usage: `inputTokens` counts the input outside the prompt cache, so the
/// internal form's `input` adds the cache reads and writes back in (as for Anthropic).
pub fn read_usage(u: &Value) -> Option<Usage> {
    tokens(u.get("inputTokens"))?;
    tokens(u.get("outputTokens"))?;
    Some(figures(u))
}

/// The sides a whole answer's `usage` reports (`read_usage`): the input where
/// `inputTokens` is a number, the output where `outputTokens` is; `None` with neither.
pub fn read_reported(u: &Value) -> Option<Reported> {
    let has = |k: &str| tokens(u.get(k)).is_some();
    let (input, output) = (has("inputTokens"), has("outputTokens"));
    (input || output).then(|| Reported::sides(figures(u), input, output))
}

/// A stream's `metadata` usage: both figures numbers (else the event is corrupt), each side
/// reported where its figure is a count — a negative one is none (`providers::tokens`), so
/// that side is estimated as if absent.
pub fn stream_reported(u: &Value) -> Option<Reported> {
    let number = |k: &str| u.get(k).is_some_and(Value::is_number);
    let has = |k: &str| tokens(u.get(k)).is_some();
    (number("inputTokens") && number("outputTokens"))
        .then(|| Reported::sides(figures(u), has("inputTokens"), has("outputTokens")))
}

/// Bedrock's usage figures, each 0 when absent.
fn figures(u: &Value) -> Usage {
    let input = tokens(u.get("inputTokens")).unwrap_or(0);
    let output = tokens(u.get("outputTokens")).unwrap_or(0);
    let read = tokens(u.get("cacheReadInputTokens")).unwrap_or(0);
    let write = tokens(u.get("cacheWriteInputTokens")).unwrap_or(0);
    Usage {
        input: input + read + write,
        output,
        cached_input: read,
        cache_write_5m: write,
        // Bedrock does not split its writes by lifetime.
        cache_write_unsplit: write,
        ..Usage::default()
    }
}

/// One content block of an answer (`output.message.content[i]`).
pub(super) fn part_of(block: &Value) -> Result<Option<Part>, Corrupt> {
    let Some(obj) = block.as_object() else {
        return Err(Corrupt::Shape);
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    if let Some(t) = obj.get("text") {
        let text = t.as_str().ok_or(Corrupt::Shape)?.to_string();
        return Ok(Some(Part::Text { text, cache: None }));
    }
    if let Some(u) = obj.get("toolUse") {
        let (Some(id), Some(name)) = (text(u.get("toolUseId")), text(u.get("name"))) else {
            return Err(Corrupt::Shape);
        };
        let arguments = u
            .get("input")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        return Ok(Some(Part::ToolCall {
            id,
            name,
            arguments: arguments.to_string(),
        }));
    }
    if let Some(r) = obj.get("reasoningContent") {
        if let Some(data) = text(r.get("redactedContent")) {
            return Ok(Some(Part::Reasoning {
                text: String::new(),
                signature: None,
                redacted: Some(data),
            }));
        }
        let t = r.get("reasoningText").ok_or(Corrupt::Shape)?;
        return Ok(Some(Part::Reasoning {
            text: text(t.get("text")).ok_or(Corrupt::Shape)?,
            signature: text(t.get("signature")),
            redacted: None,
        }));
    }
    // Blocks with no place in an answer of the internal form (citations, guard content)
    // carry no text the client asked for; an unknown one is an additive change of Bedrock's.
    Ok(None)
}

/// A Converse answer in the internal form. Converse names neither the answer nor the model
/// in its body: the id is made here (`bedrock-` + a random id) and the model is left empty
/// for the caller, which knows what it asked.
pub fn read_answer(v: &Value) -> Result<Answer, Corrupt> {
    let content = v
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .ok_or(Corrupt::Shape)?;
    let mut parts = Vec::new();
    for block in content {
        parts.extend(part_of(block)?);
    }
    let finish = finish_of(
        v.get("stopReason")
            .and_then(Value::as_str)
            .ok_or(Corrupt::Shape)?,
    );
    Ok(Answer {
        id: format!("bedrock-{}", uuid::Uuid::new_v4().simple()),
        model: String::new(),
        content: parts,
        finish,
        usage: v.get("usage").and_then(read_usage),
        created: None,
    })
}

/// The error type of a Bedrock error: the `x-amzn-ErrorType` header's name (the gateway's
/// client copies it into the body as `__type`), else the body's `__type` or `code`, as
/// AWS's JSON protocols allow. `ThrottlingException:http://…` → `ThrottlingException`.
pub fn error_type(body: &Value) -> Option<&str> {
    let t = body.get("__type").or_else(|| body.get("code"))?.as_str()?;
    let t = t.split(':').next().unwrap_or(t);
    Some(t.rsplit('#').next().unwrap_or(t))
}

/// A Bedrock error (an HTTP error answer, or a stream's exception event with `status` the
/// one its type stands for) in the internal form.
pub fn read_error(status: u16, body: &Value) -> ErrorInfo {
    let ty = error_type(body);
    let kind = match ty {
        Some("ThrottlingException" | "throttlingException") => ErrorKind::RateLimited,
        Some("ServiceQuotaExceededException" | "serviceQuotaExceededException") => {
            ErrorKind::QuotaExhausted
        }
        Some(
            "ModelNotReadyException"
            | "ServiceUnavailableException"
            | "serviceUnavailableException",
        ) => ErrorKind::Overloaded,
        Some("ValidationException" | "validationException") => ErrorKind::InvalidRequest,
        Some("AccessDeniedException") => ErrorKind::PermissionDenied,
        Some(
            "UnrecognizedClientException" | "InvalidSignatureException" | "ExpiredTokenException",
        ) => ErrorKind::Authentication,
        Some("ResourceNotFoundException") => ErrorKind::NotFound,
        Some(
            "ModelTimeoutException"
            | "InternalServerException"
            | "internalServerException"
            | "ModelErrorException"
            | "modelStreamErrorException"
            | "ModelStreamErrorException",
        ) => ErrorKind::Server,
        _ => match status {
            400 | 422 => ErrorKind::InvalidRequest,
            401 => ErrorKind::Authentication,
            403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            413 => ErrorKind::RequestTooLarge,
            429 => ErrorKind::RateLimited,
            503 | 529 => ErrorKind::Overloaded,
            _ => ErrorKind::Server,
        },
    };
    let message = body
        .get("message")
        .or_else(|| body.get("Message"))
        .and_then(Value::as_str)
        .unwrap_or("The Bedrock upstream answered with an error.")
        .to_string();
    ErrorInfo {
        status,
        kind,
        message,
        code: ty.map(str::to_string),
        param: None,
    }
}

/// Whether an exception type names a fault of the upstream's own — what a mid-stream error
/// judges its key by. An exception this reader does not know names none, though its
/// status reads as a server error (s28 late attack F7).
pub fn names_a_fault(exception: &str) -> bool {
    matches!(
        exception,
        "throttlingException"
            | "ThrottlingException"
            | "serviceUnavailableException"
            | "ServiceUnavailableException"
            | "ModelNotReadyException"
            | "internalServerException"
            | "InternalServerException"
            | "modelStreamErrorException"
            | "ModelStreamErrorException"
            | "ModelTimeoutException"
            | "ModelErrorException"
    )
}

/// The HTTP status a stream exception stands for (Bedrock's documented statuses).
pub(super) fn exception_status(name: &str) -> u16 {
    match name {
        "throttlingException" => 429,
        "validationException" => 400,
        "serviceUnavailableException" => 503,
        "modelStreamErrorException" => 424,
        _ => 500,
    }
}

/// The generated output of an answer, to count when it reports no usage: its text, its
/// tool calls (id, name and input, as the stream's `ToolCallStart` and `ToolArgsDelta` are
/// counted) and its reasoning — output Bedrock bills, counted as its stream counts it.
pub fn answer_text(v: &Value) -> String {
    let mut text = String::new();
    for b in v
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |p: &str| b.pointer(p).and_then(Value::as_str).unwrap_or("");
        text.push_str(s("/text"));
        text.push_str(s("/reasoningContent/reasoningText/text"));
        if let Some(u) = b.get("toolUse") {
            text.push_str(s("/toolUse/toolUseId"));
            text.push_str(s("/toolUse/name"));
            text.push_str(&u.get("input").map(Value::to_string).unwrap_or_default());
        }
    }
    text
}

//! Whole answers, usage and error bodies in OpenAI's chat format, to and from the internal
//! form. Ids, tool call ids and the upstream's `model` value are kept as they came.
//!
//! Finish reasons: `length` ↔ `Length`, `tool_calls` ↔ `ToolCalls` (also tool calls that
//! came with `stop`, as some OpenAI-compatible servers send them), `content_filter` ↔
//! `ContentFilter` / `Refusal`, and `stop` ↔ `Stop`, or `StopSequence` when the upstream
//! names the sequence — OpenAI-compatible servers (vLLM) put it in the choice's
//! `stop_reason`, which is also where an OpenAI client finds another format's stop
//! sequence; Text Generation Inference's `eos_token` is `Stop`, its `stop_sequence`
//! `StopSequence`. `Pause` (a long server-tool turn Anthropic paused) is `stop`: OpenAI has
//! no such state.

use serde_json::{json, Map, Value};

use super::super::{opt_string, string, usage_readable};
use crate::upstream::providers::canonical::{Answer, ErrorInfo, Finish, Part, Reported, Usage};
use crate::upstream::providers::openai::content_text;
use crate::upstream::providers::translate::stream::Corrupt;
use crate::upstream::providers::{tokens, MAX_REPORTED_TOKENS};

/// What decides the internal form's finish from an OpenAI choice (streamed or whole).
#[derive(Debug, Default, Clone)]
pub struct FinishNotes {
    pub reason: Option<String>,
    /// The matched stop string, when the upstream reports it (vLLM's `stop_reason`).
    pub sequence: Option<String>,
    pub tool_calls: bool,
    pub refusal: bool,
}

impl FinishNotes {
    /// No reason (null, absent, or a stream's `[DONE]` before one) and a reason not known
    /// are not whole (`Finish::Unvouched`, s28 stop attack F1), though a client is told
    /// what the answer holds: its tool calls, its stop sequence, or `stop`.
    pub fn finish(&self) -> Finish {
        let Some(reason) = self.reason.as_deref() else {
            return Finish::unvouched(self.held(Finish::Stop));
        };
        match reason {
            "length" => Finish::Length,
            "tool_calls" | "function_call" => Finish::ToolCalls,
            "content_filter" => Finish::ContentFilter,
            // Text Generation Inference before 2.2.1 ends an answer with `eos_token`:
            // whole, as the cache judges it within one format (a translated answer is
            // cached by this reading, late attack L5).
            "stop" | "eos_token" => self.held(Finish::Stop),
            "stop_sequence" => self.held(Finish::StopSequence(None)),
            other => match self.held(Finish::Other(other.to_string())) {
                f @ (Finish::Other(_) | Finish::Refusal) => f,
                f => Finish::unvouched(f),
            },
        }
    }

    /// The finish of an answer that ended with `stop` or the like (`or`): by its tool calls,
    /// its refusal or its stop sequence, when it has one.
    fn held(&self, or: Finish) -> Finish {
        if self.tool_calls {
            Finish::ToolCalls
        } else if self.refusal {
            Finish::Refusal
        } else if self.sequence.is_some() {
            Finish::StopSequence(self.sequence.clone())
        } else {
            or
        }
    }
}

/// OpenAI's `finish_reason` for a finish, and the matched stop sequence (`stop_reason`).
pub fn finish_reason(f: &Finish) -> (&'static str, Option<&str>) {
    match f.shown() {
        Finish::Length => ("length", None),
        Finish::ToolCalls => ("tool_calls", None),
        Finish::ContentFilter | Finish::Refusal => ("content_filter", None),
        Finish::StopSequence(s) => ("stop", s.as_deref()),
        Finish::Stop | Finish::Pause | Finish::Other(_) | Finish::Unvouched(_) => ("stop", None),
    }
}

/// An OpenAI choice's finish fields.
pub fn write_finish(choice: &mut Map<String, Value>, f: &Finish) {
    let (reason, sequence) = finish_reason(f);
    choice.insert("finish_reason".into(), json!(reason));
    if let Some(s) = sequence {
        choice.insert("stop_reason".into(), json!(s));
    }
}

/// Usage from an OpenAI `usage` object; `None` (the output is then counted) when it is not
/// an object or a figure is there but not a number — a `"completion_tokens": "40"` is no
/// count the gateway can charge, and must not be read as 0.
pub fn read_usage(u: &Value) -> Option<Usage> {
    const FIGURES: [&str; 10] = [
        "/prompt_tokens",
        "/completion_tokens",
        "/total_tokens",
        "/cache_creation_input_tokens",
        "/prompt_tokens_details/cached_tokens",
        "/prompt_tokens_details/cache_write_tokens",
        "/prompt_tokens_details/audio_tokens",
        "/prompt_tokens_details/cached_tokens_details/audio_tokens",
        "/completion_tokens_details/reasoning_tokens",
        "/completion_tokens_details/audio_tokens",
    ];
    if !usage_readable(u, &FIGURES) {
        return None;
    }
    let n = |p: &str| tokens(u.pointer(p)).unwrap_or(0);
    // `prompt_tokens` includes the cached and audio ones, `completion_tokens` the
    // reasoning and audio ones: the details are parts of the totals. Cached audio is in
    // both `cached_tokens` and `audio_tokens`: it is cached input, the audio part is the
    // rest (`uncached_audio`). Routers' cache writes are inside `prompt_tokens` too
    // (`cache_writes`).
    let written = cache_writes(
        n("/prompt_tokens_details/cache_write_tokens"),
        n("/cache_creation_input_tokens"),
    );
    Some(Usage {
        input: n("/prompt_tokens"),
        cached_input: n("/prompt_tokens_details/cached_tokens"),
        cache_write_5m: written,
        // Routers do not split their writes by lifetime: priced per the request's marks.
        cache_write_unsplit: written,
        audio_input: uncached_audio(
            n("/prompt_tokens_details/audio_tokens"),
            n("/prompt_tokens_details/cached_tokens_details/audio_tokens"),
        ),
        output: output_tokens(
            tokens(u.get("prompt_tokens")),
            n("/completion_tokens"),
            n("/completion_tokens_details/reasoning_tokens"),
            tokens(u.get("total_tokens")),
        ),
        reasoning: n("/completion_tokens_details/reasoning_tokens"),
        audio_output: n("/completion_tokens_details/audio_tokens"),
        ..Usage::default()
    })
}

/// The output an OpenAI-format usage reports. OpenAI counts the reasoning inside
/// `completion_tokens` and `total_tokens` is their sum with the prompt: the output is
/// `completion_tokens`. xAI's Grok (and relays like it) counts the reasoning apart from
/// `completion_tokens` and inside `total_tokens`: a reasoning figure above the completion,
/// or a total above prompt and completion, says so, and the output is the completion with
/// the reasoning, or the total less the prompt, whichever is more. A total without the
/// prompt figure cannot be split and is not read. Never above what the reservation covered
/// once charged: the settlement caps it as any figure.
pub fn output_tokens(
    prompt: Option<i64>,
    completion: i64,
    reasoning: i64,
    total: Option<i64>,
) -> i64 {
    let beside = if reasoning > completion {
        completion.saturating_add(reasoning)
    } else {
        completion
    };
    let rest = match (prompt, total) {
        (Some(p), Some(t)) if t > p.saturating_add(completion) => t - p,
        _ => 0,
    };
    beside.max(rest).min(MAX_REPORTED_TOKENS)
}

/// The sides an OpenAI `usage` object reports (`read_usage`): the input where
/// `prompt_tokens` is a number, the output where `completion_tokens` is. `{}` reports
/// neither, `{"completion_tokens": 40}` the output alone: an absent side is no zero.
pub fn read_reported(u: &Value) -> Option<Reported> {
    let has = |k: &str| tokens(u.get(k)).is_some();
    Some(Reported::sides(
        read_usage(u)?,
        has("prompt_tokens"),
        has("completion_tokens"),
    ))
}

/// The cache writes an OpenAI-format usage reports, part of `prompt_tokens`: routers in
/// front of models with priced writes (Claude) report them, OpenRouter as
/// `prompt_tokens_details.cache_write_tokens`, LiteLLM as a top-level
/// `cache_creation_input_tokens`. Two names for the same writes: the larger is read, never
/// their sum.
pub fn cache_writes(openrouter: i64, litellm: i64) -> i64 {
    openrouter.max(litellm).max(0)
}

/// The audio input priced as audio: OpenAI's `audio_tokens` less the cached ones
/// (`cached_tokens_details.audio_tokens`), which are priced once, as cached input.
pub fn uncached_audio(audio: i64, cached_audio: i64) -> i64 {
    audio.saturating_sub(cached_audio.max(0)).max(0)
}

/// OpenAI usage figures (input includes cache reads and writes).
pub fn write_usage(u: &Usage) -> Value {
    json!({"prompt_tokens": u.input, "completion_tokens": u.output,
        "total_tokens": u.input.saturating_add(u.output),
        "prompt_tokens_details": {"cached_tokens": u.cached_input}})
}

/// An OpenAI answer in the internal form. The request asked for one choice: the one with
/// index 0 is the answer.
pub fn read_answer(v: &Value) -> Result<Answer, Corrupt> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("index").and_then(Value::as_i64).unwrap_or(0) == 0)
        .unwrap_or(&Value::Null);
    let mut notes = FinishNotes {
        reason: opt_string(choice, "finish_reason"),
        sequence: opt_string(choice, "stop_reason"),
        ..FinishNotes::default()
    };
    let mut content = Vec::new();
    if let Some(t) = content_text(choice.pointer("/message/content")).filter(|t| !t.is_empty()) {
        content.push(Part::Text {
            text: t,
            cache: None,
        });
    }
    if let Some(t) = content_text(choice.pointer("/message/refusal")).filter(|t| !t.is_empty()) {
        content.push(Part::Refusal { text: t });
        notes.refusal = true;
    }
    for tc in choice
        .pointer("/message/tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |p: &str| tc.pointer(p).and_then(Value::as_str).unwrap_or("");
        let args = tc.pointer("/function/arguments").and_then(Value::as_str);
        content.push(Part::ToolCall {
            id: s("/id").to_string(),
            name: s("/function/name").to_string(),
            arguments: args.unwrap_or("{}").to_string(),
        });
        notes.tool_calls = true;
    }
    Ok(Answer {
        id: string(v, "id"),
        model: string(v, "model"),
        content,
        finish: notes.finish(),
        usage: v.get("usage").and_then(read_usage),
        created: v.get("created").and_then(Value::as_i64),
    })
}

/// An answer as an OpenAI `chat.completion`. Reasoning has no place in it (an OpenAI
/// client does not see it from OpenAI either).
pub fn write_answer(a: &Answer) -> Value {
    let mut text = String::new();
    let mut refusal = String::new();
    let mut tool_calls = Vec::new();
    for p in &a.content {
        match p {
            Part::Text { text: t, .. } => text.push_str(t),
            Part::Refusal { text: t } => refusal.push_str(t),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => tool_calls.push(json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": arguments}})),
            _ => {}
        }
    }
    // No text with tool calls or a refusal is `null`, as OpenAI sends it.
    let no_text = text.is_empty()
        && (!tool_calls.is_empty()
            || matches!(a.finish.shown(), Finish::Refusal | Finish::ContentFilter));
    let mut message =
        json!({"role": "assistant", "content": if no_text { Value::Null } else { json!(text) }});
    if !refusal.is_empty() {
        message["refusal"] = json!(refusal);
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let mut choice = Map::new();
    choice.insert("index".into(), json!(0));
    choice.insert("message".into(), message);
    choice.insert("logprobs".into(), Value::Null);
    write_finish(&mut choice, &a.finish);
    json!({
        "id": a.id,
        "object": "chat.completion",
        "created": a.created.unwrap_or_else(|| chrono::Utc::now().timestamp()),
        "model": a.model,
        "choices": [choice],
        "usage": write_usage(&a.usage.unwrap_or_default()),
    })
}

/// OpenAI's error `type` for a status.
fn error_type(status: u16) -> &'static str {
    if status == 429 {
        "requests"
    } else if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    }
}

/// An upstream's error body: whatever its shape, read by `super::super::read_error`.
pub fn read_error(status: u16, body: &Value) -> ErrorInfo {
    super::super::read_error(status, body)
}

/// An error in OpenAI's shape: the message kept, the type from the status, `code` the
/// upstream's own code or error type (`upstream_error` when it gave neither).
pub fn write_error(e: &ErrorInfo) -> Value {
    json!({"error": {"message": e.message, "type": error_type(e.status), "param": e.param,
        "code": e.code.as_deref().unwrap_or("upstream_error")}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_figures_are_read_or_left_to_the_count() {
        let u = read_usage(&json!({"prompt_tokens": 3, "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 1}}))
        .unwrap();
        assert_eq!(
            (u.input, u.cached_input, u.output, u.reasoning),
            (3, 2, 5, 1)
        );
        assert!(read_usage(&json!({"prompt_tokens": 3, "completion_tokens": "5"})).is_none());
    }

    /// TGI's own reasons read as whole answers: as `Other`, a translated one was no longer
    /// cached once the cache judged it by the upstream's finish (late attack L5).
    #[test]
    fn text_generation_inference_reasons_read_as_whole() {
        let read = |r: &str| {
            FinishNotes {
                reason: Some(r.into()),
                ..FinishNotes::default()
            }
            .finish()
        };
        assert_eq!(read("eos_token"), Finish::Stop);
        assert_eq!(read("stop_sequence"), Finish::StopSequence(None));
        assert_eq!(read("abort"), Finish::Other("abort".into()));
    }
}

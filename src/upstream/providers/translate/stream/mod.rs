//! Streams across formats, event by event, and the accounting every stream needs whatever
//! its formats: the usage the upstream reported and the text it produced (to count when
//! the usage never arrives).
//!
//! OpenAI → Anthropic client (`to_anthropic`): `message_start` carries the input estimate
//! (the real figure comes last in OpenAI streams), `message_delta.usage` the actual input
//! and output. Anthropic → OpenAI client (`to_openai`): deltas become
//! `chat.completion.chunk`s; the usage chunk is sent only when the client asked for it.
//! Either way an upstream's mid-stream error event reaches the client as its own format's
//! error event, and the stream ends there.

mod to_anthropic;
mod to_openai;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

use crate::error::WireFormat;
use crate::quota::estimate;
use crate::quota::pricing::Usage;
use crate::upstream::providers::{anthropic, openai};

pub struct StreamConverter {
    upstream: WireFormat,
    client: WireFormat,
    include_usage: bool,
    input_estimate: i64,
    input: Option<i64>,
    cached: i64,
    output: Option<i64>,
    text: String,
    done: bool,
    /// The upstream's own error event was passed on: the stream ends with it, and needs
    /// no error of the gateway's after it.
    error_sent: bool,
    anthropic_out: to_anthropic::State,
    openai_out: to_openai::State,
}

pub fn frame(event: Option<&str>, data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 32);
    if let Some(e) = event {
        b.put_slice(b"event: ");
        b.put_slice(e.as_bytes());
        b.put_slice(b"\n");
    }
    b.put_slice(b"data: ");
    b.put_slice(data.as_bytes());
    b.put_slice(b"\n\n");
    b.freeze()
}

/// An error event in `client`'s format, ending a stream that cannot complete.
pub fn error_event(client: WireFormat, message: &str, code: &str) -> Bytes {
    match client {
        WireFormat::OpenAi => frame(
            None,
            &json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}}).to_string(),
        ),
        WireFormat::Anthropic => frame(
            Some("error"),
            &json!({"type": "error", "error": {"type": "api_error", "message": message, "code": code}}).to_string(),
        ),
    }
}

impl StreamConverter {
    pub fn new(
        upstream: WireFormat,
        client: WireFormat,
        include_usage: bool,
        input_estimate: i64,
    ) -> Self {
        Self {
            upstream,
            client,
            include_usage,
            input_estimate,
            input: None,
            cached: 0,
            output: None,
            text: String::new(),
            done: false,
            error_sent: false,
            anthropic_out: to_anthropic::State::default(),
            openai_out: to_openai::State::default(),
        }
    }

    /// The upstream signalled a complete answer (`[DONE]` / `message_stop`).
    pub fn done(&self) -> bool {
        self.done
    }

    /// What to charge: the upstream's figures where they arrived, else the counted input and
    /// the output counted from the text received.
    pub fn usage(&self) -> Usage {
        Usage {
            input: self.input.unwrap_or(self.input_estimate),
            cached_input: self.cached,
            output: self
                .output
                .unwrap_or_else(|| estimate::count_text(&self.text)),
        }
    }

    /// The upstream sent an error event, which the client received in its format: the
    /// stream is over.
    pub fn upstream_failed(&self) -> bool {
        self.error_sent
    }

    /// The closing event of a stream that broke, in the client's format — none when the
    /// upstream's own error event already ended it.
    pub fn error_frame(&self, message: &str) -> Option<Bytes> {
        (!self.error_sent).then(|| error_event(self.client, message, "upstream_error"))
    }

    /// Takes one upstream event and appends what the client must receive to `out`.
    pub fn event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        // After the complete answer or the upstream's error, the client's stream is over.
        if self.error_sent || self.done {
            return;
        }
        // An event the gateway cannot read is a piece of the answer it cannot pass on:
        // the stream ends here as an error, not as a complete answer with a hole in it.
        // (An empty `data:` carries nothing; `[DONE]` is OpenAI's end marker.)
        let end_marker = self.upstream == WireFormat::OpenAi && data == "[DONE]";
        if !end_marker
            && !data.trim().is_empty()
            && serde_json::from_str::<serde::de::IgnoredAny>(data).is_err()
        {
            out.push(error_event(
                self.client,
                "The upstream sent an event that is not valid JSON; the stream was ended by the gateway.",
                "upstream_error",
            ));
            self.error_sent = true;
            return;
        }
        match (self.upstream, self.client) {
            (WireFormat::OpenAi, WireFormat::OpenAi) => self.openai_to_openai(data, out),
            (WireFormat::Anthropic, WireFormat::Anthropic) => {
                self.anthropic_to_anthropic(name, data, out)
            }
            (WireFormat::OpenAi, WireFormat::Anthropic) => self.openai_to_anthropic(data, out),
            (WireFormat::Anthropic, WireFormat::OpenAi) => self.anthropic_to_openai(data, out),
        }
    }

    fn note_openai_chunk(&mut self, v: &Value) {
        self.text.push_str(&openai::answer_text(v));
        if let Some(u) = v.get("usage").and_then(openai::usage_of) {
            self.input = Some(u.input);
            self.cached = u.cached_input;
            self.output = Some(u.output);
        }
    }

    fn openai_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) {
        if data == "[DONE]" {
            self.done = true;
            out.push(frame(None, data));
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(e) = openai_error(&v) {
            self.error_sent = true;
            // An error in OpenAI's own shape passes as it came; TGI's text form is
            // reshaped so the client's SDK reads its message and code.
            let raw = v.get("error").is_some_and(Value::is_object);
            out.push(if raw {
                frame(None, data)
            } else {
                frame(None, &e.to_string())
            });
            return;
        }
        self.note_openai_chunk(&v);
        let usage_only = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
            && v.get("usage").is_some_and(|u| !u.is_null());
        if !usage_only || self.include_usage {
            out.push(frame(None, data));
        }
    }

    /// Accounting of an Anthropic event; returns its type.
    fn note_anthropic_event<'v>(&mut self, v: &'v Value) -> &'v str {
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").and_then(anthropic::usage_of) {
                    self.input = Some(u.input);
                    self.cached = u.cached_input;
                }
            }
            "content_block_delta" => {
                for p in ["/delta/text", "/delta/partial_json"] {
                    if let Some(t) = v.pointer(p).and_then(Value::as_str) {
                        self.text.push_str(t);
                    }
                }
            }
            "message_delta" => {
                // Cumulative figures; the input ones only where this event carries them.
                let u = v.get("usage").unwrap_or(&Value::Null);
                if let Some(o) = crate::upstream::providers::tokens(u.get("output_tokens")) {
                    self.output = Some(o);
                }
                if u.get("input_tokens").is_some_and(Value::is_number) {
                    if let Some(full) = anthropic::usage_of(u) {
                        self.input = Some(full.input);
                        self.cached = full.cached_input;
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => self.error_sent = true,
            _ => {}
        }
        kind
    }

    fn anthropic_to_anthropic(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = self.note_anthropic_event(&v).to_string();
        let kind = if kind.is_empty() { "ping" } else { &kind };
        out.push(frame(Some(if name.is_empty() { kind } else { name }), data));
    }
}

/// An OpenAI-format mid-stream error in OpenAI's shape: a data chunk `{"error": {…}}`, or
/// `{"error": "<text>", "error_type": "…"}` as Hugging Face TGI sends it (reshaped, its
/// `error_type` as the code). `None` for any other chunk.
fn openai_error(v: &Value) -> Option<Value> {
    match v.get("error")? {
        Value::Object(_) => Some(v.clone()),
        Value::String(message) => {
            let code = v
                .get("error_type")
                .filter(|c| c.is_string())
                .cloned()
                .unwrap_or(json!("upstream_error"));
            Some(
                json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}}),
            )
        }
        _ => None,
    }
}

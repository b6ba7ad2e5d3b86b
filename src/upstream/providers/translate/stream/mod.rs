//! Streams across formats, event by event, and the accounting every stream needs whatever
//! its formats: the usage the upstream reported and the text it produced (to count when
//! the usage never arrives).
//!
//! OpenAI → Anthropic client (`to_anthropic`): `message_start` carries the input estimate
//! (the real figure comes last in OpenAI streams), `message_delta.usage` the actual input
//! and output. Anthropic → OpenAI client (`to_openai`): deltas become
//! `chat.completion.chunk`s; the usage chunk is sent only when the client asked for it.
//! Either way an upstream's mid-stream error event reaches the client as its own format's
//! error event, and the stream ends there. Every event, translated or passed through, is
//! read once into the typed fields of `shape`: one that is not JSON, or not in its format's
//! shape, ends the stream with the gateway's error event (`upstream_error`).

mod shape;
mod to_anthropic;
mod to_openai;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

use crate::error::WireFormat;
use crate::quota::estimate;
use crate::quota::pricing::Usage;
use shape::Body;
pub use shape::Corrupt;

/// Output text is counted (and let go of) in pieces of about this size, so a long stream
/// keeps no more than this of its text.
const COUNT_EVERY: usize = 64 * 1024;

/// The default of `StreamConverter::hold_limit`.
pub const HOLD_LIMIT: usize = 16 * 1024 * 1024;

pub struct StreamConverter {
    upstream: WireFormat,
    client: WireFormat,
    include_usage: bool,
    input_estimate: i64,
    input: Option<i64>,
    cached: i64,
    output: Option<i64>,
    /// The output text received and not yet counted (see `note_text`).
    text: String,
    /// Tokens of the output text already counted.
    counted: i64,
    /// The most this converter keeps of a stream (held blocks, arguments): past it the
    /// stream ends with an error event.
    hold_limit: usize,
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
            counted: 0,
            hold_limit: HOLD_LIMIT,
            done: false,
            error_sent: false,
            anthropic_out: to_anthropic::State::default(),
            openai_out: to_openai::State::default(),
        }
    }

    /// Sets the most the converter keeps of one stream (`HOLD_LIMIT` by default).
    pub fn hold_limit(mut self, bytes: usize) -> Self {
        self.hold_limit = bytes;
        self
    }

    /// Takes output text for the count. Past `COUNT_EVERY` bytes, the text up to its last
    /// whitespace is counted and dropped (the tokenizer starts a word at its leading space,
    /// so a cut there counts as the whole would, give or take a token per piece).
    fn note_text(&mut self, t: &str) {
        self.text.push_str(t);
        if self.text.len() < COUNT_EVERY {
            return;
        }
        let cut = self
            .text
            .rfind(char::is_whitespace)
            .filter(|&i| i > 0)
            .unwrap_or(self.text.len());
        let rest = self.text.split_off(cut);
        self.counted += estimate::count_text(&self.text);
        self.text = rest;
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
                .unwrap_or_else(|| self.counted + estimate::count_text(&self.text)),
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
        self.end_frame(message, "upstream_error")
    }

    /// As `error_frame`, with this code (`shutting_down` when the gateway ends the stream).
    pub fn end_frame(&self, message: &str, code: &str) -> Option<Bytes> {
        (!self.error_sent).then(|| error_event(self.client, message, code))
    }

    /// Takes one upstream event and appends what the client must receive to `out`.
    pub fn event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        // After the complete answer or the upstream's error, the client's stream is over.
        if self.error_sent || self.done {
            return;
        }
        // An empty `data:` carries nothing.
        if data.trim().is_empty() {
            return;
        }
        let read = match (self.upstream, self.client) {
            (WireFormat::OpenAi, WireFormat::OpenAi) => self.openai_to_openai(data, out),
            (WireFormat::Anthropic, WireFormat::Anthropic) => {
                self.anthropic_to_anthropic(name, data, out)
            }
            (WireFormat::OpenAi, WireFormat::Anthropic) => self.openai_to_anthropic(data, out),
            (WireFormat::Anthropic, WireFormat::OpenAi) => self.anthropic_to_openai(data, out),
        };
        // An event the gateway cannot read — not JSON, or JSON not in its format's shape
        // (see `shape`) — is a piece of the answer or of its usage it cannot pass on or
        // count: the stream ends here as an error, not as a complete answer with a hole.
        if let Err(corrupt) = read {
            out.push(error_event(
                self.client,
                corrupt.message(),
                "upstream_error",
            ));
            self.error_sent = true;
            return;
        }
        if self.anthropic_out.held_bytes > self.hold_limit && !self.error_sent {
            out.push(error_event(
                self.client,
                "The upstream held back more of the answer than the gateway keeps; the stream was ended by the gateway.",
                "upstream_error",
            ));
            self.error_sent = true;
        }
    }

    /// Accounting of an OpenAI chunk: the text it carries (counted when no usage comes)
    /// and its usage.
    fn note_openai_chunk(&mut self, c: &shape::Chunk) {
        for choice in c.choices.iter().flatten() {
            if let Some(t) = &choice.text {
                self.note_text(t);
            }
            let Some(d) = &choice.delta else { continue };
            if let Some(t) = &d.content {
                self.note_text(&t.text());
            }
            if let Some(t) = &d.refusal {
                self.note_text(t);
            }
            for tc in d.tool_calls.iter().flatten() {
                if let Some(id) = &tc.id {
                    self.note_text(id);
                }
                for t in tc
                    .function
                    .iter()
                    .flat_map(|f| [&f.name, &f.arguments])
                    .flatten()
                {
                    self.note_text(t);
                }
            }
        }
        if let Some((input, cached, output)) = c.usage.as_ref().and_then(|u| u.figures()) {
            self.input = Some(input);
            self.cached = cached;
            self.output = Some(output);
        }
    }

    fn openai_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) -> Result<(), Corrupt> {
        if data == "[DONE]" {
            self.done = true;
            out.push(frame(None, data));
            return Ok(());
        }
        let c = match openai_event(data)? {
            OpenAiEvent::Chunk(c) => c,
            OpenAiEvent::Error { error, raw } => {
                self.error_sent = true;
                // An error in OpenAI's own shape passes as it came; TGI's text form is
                // reshaped so the client's SDK reads its message and code.
                out.push(if raw {
                    frame(None, data)
                } else {
                    frame(None, &error.to_string())
                });
                return Ok(());
            }
        };
        self.note_openai_chunk(&c);
        let usage_only = c.choices.as_ref().is_none_or(Vec::is_empty) && c.usage.is_some();
        if !usage_only || self.include_usage {
            out.push(frame(None, data));
        }
        Ok(())
    }

    /// Accounting of an Anthropic event.
    fn note_anthropic_event(&mut self, e: &shape::Event) {
        match &e.body {
            Body::MessageStart(m) => {
                if let Some(u) = m.usage.as_ref().filter(|u| u.input_tokens.is_some()) {
                    let (input, cached) = u.input();
                    self.input = Some(input);
                    self.cached = cached;
                }
            }
            Body::BlockDelta { delta, .. } => {
                for t in [&delta.text, &delta.partial_json].into_iter().flatten() {
                    self.note_text(t);
                }
            }
            Body::MessageDelta(_, Some(u)) => {
                // Cumulative figures; the input ones only where this event carries them.
                if let Some(o) = u.output_tokens {
                    self.output = Some(o.0);
                }
                if u.input_tokens.is_some() {
                    let (input, cached) = u.input();
                    self.input = Some(input);
                    self.cached = cached;
                }
            }
            Body::MessageStop => self.done = true,
            Body::Error(_) => self.error_sent = true,
            _ => {}
        }
    }

    fn anthropic_to_anthropic(
        &mut self,
        name: &str,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
        let e = shape::anthropic_event(data)?;
        self.note_anthropic_event(&e);
        let kind = if e.kind.is_empty() { "ping" } else { &e.kind };
        out.push(frame(Some(if name.is_empty() { kind } else { name }), data));
        Ok(())
    }
}

/// An OpenAI-format upstream event: a chunk, or a mid-stream error.
enum OpenAiEvent<'a> {
    Chunk(shape::Obj<shape::Chunk<'a>>),
    /// The error in OpenAI's shape; `raw` when the upstream's own body already is.
    Error {
        error: Value,
        raw: bool,
    },
}

/// Reads an OpenAI-format event. An error chunk is recognised also when its other fields
/// would not pass as a chunk's (its shape is the error's, read apart).
fn openai_event(data: &str) -> Result<OpenAiEvent<'_>, Corrupt> {
    let chunk = shape::parse::<shape::Obj<shape::Chunk>>(data);
    if let Ok(c) = &chunk {
        if c.error.is_none() {
            return chunk.map(OpenAiEvent::Chunk);
        }
    }
    let as_error = serde_json::from_str::<Value>(data).ok().and_then(|v| {
        let raw = v.get("error").is_some_and(Value::is_object);
        openai_error(&v).map(|error| OpenAiEvent::Error { error, raw })
    });
    match as_error {
        Some(e) => Ok(e),
        None => chunk.map(OpenAiEvent::Chunk),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(content: &str) -> String {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
        .to_string()
    }

    /// An endless stream of small events keeps no more than `COUNT_EVERY` of its text, and
    /// the count of what it let go of is the count of the whole, give or take a token per
    /// piece.
    #[test]
    fn a_long_stream_keeps_little_of_its_text_and_counts_all_of_it() {
        let piece = "The engine light blinks when a cylinder misfires. ";
        let n = 20_000;
        for client in [WireFormat::OpenAi, WireFormat::Anthropic] {
            let mut c = StreamConverter::new(WireFormat::OpenAi, client, false, 10);
            let mut out = Vec::new();
            for _ in 0..n {
                c.event("", &chunk(piece), &mut out);
                out.clear();
                assert!(c.text.len() <= COUNT_EVERY + piece.len());
            }
            let whole = estimate::count_text(&piece.repeat(n));
            let pieces = (piece.len() * n / COUNT_EVERY) as i64 + 1;
            let got = c.usage().output;
            assert!(
                (got - whole).abs() <= pieces,
                "{got} counted, {whole} in the whole text"
            );
        }
    }

    /// A second tool call held back behind a live one, its arguments growing for ever: the
    /// converter ends the stream with an error event once it holds more than its limit.
    #[test]
    fn arguments_held_back_past_the_limit_end_the_stream_with_an_error() {
        let call = |index: i64, id: Option<&str>, name: Option<&str>, args: &str| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": args}}]}, "finish_reason": null}]})
            .to_string()
        };
        let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10)
            .hold_limit(100_000);
        let mut out = Vec::new();
        c.event("", &call(0, Some("call_1"), Some("live"), "{"), &mut out);
        c.event("", &call(1, Some("call_2"), Some("held"), "{"), &mut out);
        let mut events = 0;
        while !c.upstream_failed() {
            events += 1;
            assert!(events < 20_000, "never ended");
            c.event("", &call(1, None, None, "\"xxxxxxxxxx\","), &mut out);
        }
        assert!(c.anthropic_out.held_bytes > 100_000);
        let last = String::from_utf8_lossy(out.last().unwrap()).to_string();
        assert!(last.starts_with("event: error\n"), "{last}");
        assert!(last.contains("upstream_error"), "{last}");
        // Nothing after the error.
        let before = out.len();
        c.event("", &call(1, None, None, "x"), &mut out);
        c.event("", "[DONE]", &mut out);
        assert_eq!(out.len(), before);
    }
}

//! OpenAI chat-completion chunks to and from the internal form's stream events.
//!
//! Reading: OpenAI streams parallel tool calls side by side, told apart by `index` (only a
//! call's first chunk carries its id). A call is a new block for a new, non-empty id;
//! chunks without one continue their index's call. A block's name is given when it starts,
//! so a call whose name comes in a later chunk than its id waits (its arguments gathered)
//! for it. Only the choice with index 0 is the answer (another, an upstream's own `n`, is
//! still counted by the stream's accounting).
//!
//! Writing: each tool call is the next tool-call index, text deltas are content deltas,
//! the finish is a chunk of its own, and the usage chunk (when the client asked for it)
//! comes before `[DONE]`.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::answer::{write_finish, write_usage, FinishNotes};
use crate::upstream::providers::canonical::ErrorKind;
use crate::upstream::providers::canonical::{ErrorInfo, Event, Fault, Usage};
use crate::upstream::providers::formats::{status_of, upstream_code};
use crate::upstream::providers::translate::stream::frame;
use crate::upstream::providers::translate::stream::shape::{
    self, Chunk, Content, Corrupt, Obj, StopReason, ToolCall,
};

/// What one call waiting for its name costs to keep besides its id (the writer counts a
/// call once it started), and what one tool-call index remembered costs.
const CALL_BYTES: usize = std::mem::size_of::<Call>() + 16;
const SLOT_BYTES: usize = std::mem::size_of::<(i64, usize)>() + 16;

struct Call {
    id: String,
    name: String,
    /// The block it streams in, once started (its name known).
    block: Option<usize>,
    /// Arguments gathered while the call waits for its name.
    args: String,
}

/// Reads an OpenAI-format upstream's events into the internal form.
#[derive(Default)]
pub struct EventReader {
    started: bool,
    next_block: usize,
    text_block: Option<usize>,
    refusal_block: Option<usize>,
    calls: Vec<Call>,
    /// OpenAI tool-call index → the call it currently continues.
    slots: HashMap<i64, usize>,
    notes: FinishNotes,
    finished: bool,
    /// Bytes kept for calls that wait for their names (the call, its id and the arguments
    /// gathered) and for every tool-call index seen: an upstream that opens call after call
    /// and never names one grows it, and the stream is ended past the converter's limit.
    held_bytes: usize,
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

impl EventReader {
    /// Bytes this reader keeps for calls that wait for their names: an upstream that never
    /// names one grows it; the stream is ended past the converter's limit.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// One upstream event (`[DONE]`, a chunk, or an error chunk).
    pub fn read(&mut self, _name: &str, data: &str, out: &mut Vec<Event>) -> Result<(), Corrupt> {
        if data == "[DONE]" {
            self.done(out);
            return Ok(());
        }
        match read_event(data)? {
            OpenAiEvent::Chunk(c) => self.chunk(&c, out),
            OpenAiEvent::Error { error, .. } => self.error(&error, out),
        }
        Ok(())
    }

    fn block(&mut self) -> usize {
        let i = self.next_block;
        self.next_block += 1;
        i
    }

    /// `[DONE]`: the answer is complete (nothing, if it never began).
    pub fn done(&mut self, out: &mut Vec<Event>) {
        if !self.started {
            return;
        }
        self.finish(out);
        out.push(Event::Done);
    }

    fn finish(&mut self, out: &mut Vec<Event>) {
        if self.finished {
            return;
        }
        self.finished = true;
        // A call that never got its name starts now, nameless, with what it gathered.
        for c in 0..self.calls.len() {
            if self.calls[c].block.is_none() {
                self.start_call(c, out);
            }
        }
        self.notes.tool_calls = !self.calls.is_empty();
        out.push(Event::Finish(self.notes.finish()));
    }

    fn start_call(&mut self, c: usize, out: &mut Vec<Event>) {
        let i = self.block();
        let call = &mut self.calls[c];
        call.block = Some(i);
        out.push(Event::ToolCallStart {
            index: i,
            id: call.id.clone(),
            name: call.name.clone(),
        });
        let args = std::mem::take(&mut call.args);
        // From here the writer keeps the call (and counts it).
        self.held_bytes = self
            .held_bytes
            .saturating_sub(args.len() + CALL_BYTES + call.id.len());
        if !args.is_empty() {
            out.push(Event::ToolArgsDelta {
                index: i,
                json: args,
            });
        }
    }

    /// A mid-stream error, in OpenAI's shape (see `openai_error`).
    pub fn error(&mut self, v: &Value, out: &mut Vec<Event>) {
        let e = &v["error"];
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
        let kind = match (s("type"), s("code")) {
            (_, "rate_limit_exceeded") | ("requests" | "tokens", _) => ErrorKind::RateLimited,
            (_, "invalid_api_key") | ("authentication_error", _) => ErrorKind::Authentication,
            ("invalid_request_error", _) => ErrorKind::InvalidRequest,
            ("insufficient_quota", _) | (_, "insufficient_quota") => ErrorKind::QuotaExhausted,
            _ => ErrorKind::Server,
        };
        out.push(Event::Error(ErrorInfo {
            status: status_of(kind),
            kind,
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("The upstream failed mid-stream.")
                .to_string(),
            code: Some(upstream_code(v).unwrap_or_else(|| "upstream_error".into())),
            param: None,
        }));
    }

    /// One chunk, already read into its typed shape.
    pub fn chunk(&mut self, c: &Chunk, out: &mut Vec<Event>) {
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: c.id.clone().unwrap_or_else(|| "msg".into()),
                model: c.model.clone().unwrap_or_default(),
                created: None,
            });
        }
        let Some(choice) = c
            .choices
            .iter()
            .flatten()
            .find(|c| c.index.unwrap_or(0) == 0)
        else {
            return;
        };
        // `""` is no reason: Ollama, SGLang, LocalAI and some relays send it on every
        // chunk before the last, which carries the real one.
        let reason = choice.finish_reason.as_deref().filter(|r| !r.is_empty());
        if let Some(r) = reason {
            self.notes.reason = Some(r.to_string());
        }
        if let Some(StopReason::Text(seq)) = &choice.stop_reason {
            self.notes.sequence = Some(seq.clone());
        }
        if let Some(d) = &choice.delta {
            if let Some(t) = d
                .content
                .as_ref()
                .map(Content::text)
                .filter(|t| !t.is_empty())
            {
                let i = match self.text_block {
                    Some(i) => i,
                    None => {
                        let i = self.block();
                        self.text_block = Some(i);
                        out.push(Event::TextStart { index: i });
                        i
                    }
                };
                out.push(Event::TextDelta {
                    index: i,
                    text: t.into_owned(),
                });
            }
            if let Some(t) = d.refusal.as_deref().filter(|t| !t.is_empty()) {
                self.notes.refusal = true;
                let i = match self.refusal_block {
                    Some(i) => i,
                    None => {
                        let i = self.block();
                        self.refusal_block = Some(i);
                        i
                    }
                };
                out.push(Event::RefusalDelta {
                    index: i,
                    text: t.to_string(),
                });
            }
            for tc in d.tool_calls.iter().flatten() {
                self.tool_call(tc, out);
            }
        }
        if reason.is_some() {
            self.finish(out);
        }
    }

    fn tool_call(&mut self, tc: &ToolCall, out: &mut Vec<Event>) {
        let slot = tc.index.unwrap_or(0);
        let id = non_empty(&tc.id);
        let name = tc.function.as_ref().and_then(|f| non_empty(&f.name));
        let call = match (self.slots.get(&slot), id) {
            (Some(&c), Some(id)) if self.calls[c].id != id => None,
            (Some(&c), _) => Some(c),
            // No id and no call at this index: it continues the latest call, if any.
            (None, None) => self.calls.len().checked_sub(1),
            (None, Some(_)) => None,
        };
        let call = match call {
            Some(c) => {
                if let (Some(n), None) = (name, self.calls[c].block) {
                    if self.calls[c].name.is_empty() {
                        self.calls[c].name = n.to_string();
                        self.start_call(c, out);
                    }
                }
                c
            }
            None => {
                self.held_bytes += CALL_BYTES + id.map_or(0, str::len);
                self.calls.push(Call {
                    id: id.unwrap_or("").to_string(),
                    name: name.unwrap_or("").to_string(),
                    block: None,
                    args: String::new(),
                });
                let c = self.calls.len() - 1;
                if name.is_some() {
                    self.start_call(c, out);
                }
                c
            }
        };
        if self.slots.insert(slot, call).is_none() {
            self.held_bytes += SLOT_BYTES;
        }
        if let Some(args) = tc.function.as_ref().and_then(|f| non_empty(&f.arguments)) {
            match self.calls[call].block {
                Some(i) => out.push(Event::ToolArgsDelta {
                    index: i,
                    json: args.to_string(),
                }),
                None => {
                    self.held_bytes += args.len();
                    self.calls[call].args.push_str(args);
                }
            }
        }
    }
}

/// An OpenAI-format upstream event: a chunk, or a mid-stream error.
pub enum OpenAiEvent<'a> {
    Chunk(Obj<Chunk<'a>>),
    /// The error in OpenAI's shape, rebuilt: `{"error": {…}}` and nothing else.
    Error {
        error: Value,
    },
}

/// The upstream's own fault a mid-stream error in OpenAI's shape (`{"error": {…}}`, as
/// `read_event` gives it) names, if it is one (`Fault`): its `type` `server_error`.
pub fn fault(error: &Value) -> Option<Fault> {
    (error.pointer("/error/type").and_then(Value::as_str) == Some("server_error"))
        .then_some(Fault::Server)
}

/// Reads an OpenAI-format event. An error chunk is recognised also when its other fields
/// would not pass as a chunk's (its shape is the error's, read apart).
pub fn read_event(data: &str) -> Result<OpenAiEvent<'_>, Corrupt> {
    let chunk = shape::parse::<Obj<Chunk>>(data);
    if let Ok(c) = &chunk {
        if c.error.is_none() {
            return chunk.map(OpenAiEvent::Chunk);
        }
    }
    let as_error = serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| openai_error(&v).map(|error| OpenAiEvent::Error { error }));
    match as_error {
        Some(e) => Ok(e),
        None => chunk.map(OpenAiEvent::Chunk),
    }
}

/// An OpenAI-format mid-stream error in OpenAI's shape: a data chunk `{"error": {…}}`, or
/// `{"error": "<text>", "error_type": "…"}` as Hugging Face TGI sends it (reshaped, its
/// `error_type` as the code). `None` for any other chunk. Only the error is kept: the
/// chunk's other members (`choices` text among them) are not passed on uncounted (s31
/// diff attack F5).
fn openai_error(v: &Value) -> Option<Value> {
    match v.get("error")? {
        error @ Value::Object(_) => Some(json!({ "error": error })),
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

/// Writes the internal form's events as an OpenAI chat-completion stream.
pub struct EventWriter {
    include_usage: bool,
    id: String,
    model: String,
    created: i64,
    /// Block index → OpenAI tool-call index, and whether any of its arguments were written.
    tools: HashMap<usize, (i64, bool)>,
    next_tool: i64,
    usage: Usage,
}

impl EventWriter {
    /// `include_usage`: the client asked for the usage chunk.
    pub fn new(include_usage: bool) -> Self {
        Self {
            include_usage,
            id: String::new(),
            model: String::new(),
            created: 0,
            tools: HashMap::new(),
            next_tool: 0,
            usage: Usage::default(),
        }
    }

    fn chunk(&self, choice: Value) -> Bytes {
        frame(None, &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [choice]}).to_string())
    }

    fn delta(&self, delta: Value) -> Bytes {
        self.chunk(json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}))
    }

    pub fn write(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match e {
            Event::Start { id, model, created } => {
                self.id = id.clone();
                self.model = model.clone();
                self.created = created.unwrap_or_else(|| chrono::Utc::now().timestamp());
                out.push(self.delta(json!({"role": "assistant", "content": ""})));
            }
            Event::ToolCallStart { index, id, name } => {
                let slot = self.next_tool;
                self.next_tool += 1;
                self.tools.insert(*index, (slot, false));
                out.push(self.delta(
                    json!({"tool_calls": [{"index": slot, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                ));
            }
            Event::TextDelta { text, .. } => out.push(self.delta(json!({"content": text}))),
            Event::RefusalDelta { text, .. } => out.push(self.delta(json!({"refusal": text}))),
            Event::ToolArgsDelta { index, json } => {
                // Only a block that started as a tool call has a tool-call index; the input
                // of another (a server tool's block, whose start the reader did not pass
                // either) is no part of any call the client sees, and never call 0's.
                let Some((slot, written)) = self.tools.get_mut(index) else {
                    return;
                };
                *written |= !json.is_empty();
                let slot = *slot;
                out.push(self.delta(
                    json!({"tool_calls": [{"index": slot, "function": {"arguments": json}}]}),
                ));
            }
            // A call whose input came as nothing (Anthropic's `input: {}` streams no JSON)
            // has the arguments `{}`, as its whole answer and OpenAI itself give: `""`
            // fails the SDK's strict-tool parsing, and Gemini and Bedrock routes refuse it
            // when the history comes back (s24 attack, translation #5).
            Event::BlockStop { index } => {
                if let Some((slot, false)) = self.tools.get(index).copied() {
                    self.tools.insert(*index, (slot, true));
                    out.push(self.delta(
                        json!({"tool_calls": [{"index": slot, "function": {"arguments": "{}"}}]}),
                    ));
                }
            }
            Event::Finish(f) => {
                let mut choice = Map::new();
                choice.insert("index".into(), json!(0));
                choice.insert("delta".into(), json!({}));
                choice.insert("logprobs".into(), Value::Null);
                write_finish(&mut choice, f);
                out.push(self.chunk(Value::Object(choice)));
            }
            Event::Usage(u) => u.apply(&mut self.usage),
            Event::Done => {
                if self.include_usage {
                    out.push(frame(None, &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": write_usage(&self.usage)}).to_string()));
                }
                out.push(frame(None, "[DONE]"));
            }
            Event::Error(e) => out.push(frame(None, &super::write_error(e).to_string())),
            // Reasoning has no place in a chat-completion stream (an OpenAI client does
            // not see it from OpenAI either); block starts and ends are implicit.
            Event::TextStart { .. }
            | Event::ReasoningStart { .. }
            | Event::ReasoningDelta { .. }
            | Event::ReasoningSignature { .. } => {}
        }
    }
}

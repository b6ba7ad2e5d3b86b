//! Anthropic Messages stream events to and from the internal form's stream events.
//!
//! Reading is one to one: `message_start` is the start, block events the blocks (by the
//! upstream's index), `message_delta` the finish, `message_stop` the end.
//!
//! Writing: Anthropic streams one content block at a time, while other formats may stream
//! blocks side by side (OpenAI's parallel tool calls). So the first tool call streams live
//! in its block, and whatever arrives while it is open — further calls, text — is held
//! (arguments appended) and sent as whole blocks, in the order it first appeared, when the
//! answer finishes. `message_start` carries the input estimate (the real figure comes last
//! in other formats' streams), `message_delta.usage` the actual input and output.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{read_finish, write_finish, write_usage};
use crate::upstream::providers::canonical::{ErrorInfo, ErrorKind, Event, Fault, Reported, Usage};
use crate::upstream::providers::formats::status_of;
use crate::upstream::providers::translate::stream::frame;
use crate::upstream::providers::translate::stream::shape::{self, Body, Corrupt};

/// Reads an Anthropic upstream's events into the internal form.
#[derive(Default)]
pub struct EventReader;

fn index(i: i64) -> usize {
    usize::try_from(i).unwrap_or(0)
}

/// The error kind of an Anthropic error `type`.
fn error_kind(kind: &str) -> ErrorKind {
    match kind {
        "rate_limit_error" => ErrorKind::RateLimited,
        "overloaded_error" => ErrorKind::Overloaded,
        "api_error" | "timeout_error" => ErrorKind::Server,
        "authentication_error" => ErrorKind::Authentication,
        "permission_error" => ErrorKind::PermissionDenied,
        "not_found_error" => ErrorKind::NotFound,
        "request_too_large" => ErrorKind::RequestTooLarge,
        _ => ErrorKind::InvalidRequest,
    }
}

/// The upstream's own fault an `error` event's `type` names, if it is one (`Fault`): one
/// without a type names none.
pub fn fault(kind: Option<&str>) -> Option<Fault> {
    match kind? {
        "overloaded_error" => Some(Fault::Overloaded),
        "rate_limit_error" => Some(Fault::RateLimited),
        "api_error" => Some(Fault::Server),
        _ => None,
    }
}

impl EventReader {
    pub fn read(&mut self, _name: &str, data: &str, out: &mut Vec<Event>) -> Result<(), Corrupt> {
        let e = shape::anthropic_event(data)?;
        self.event(&e, out);
        Ok(())
    }

    /// One event, already read into its typed shape.
    pub fn event(&mut self, e: &shape::Event, out: &mut Vec<Event>) {
        match &e.body {
            Body::MessageStart(m) => {
                out.push(Event::Start {
                    id: m.id.clone().unwrap_or_default(),
                    model: m.model.clone().unwrap_or_default(),
                    created: None,
                });
                // Its `output_tokens` is a placeholder (0 or 1) before the real count in
                // `message_delta`: only the input is reported here.
                if let Some(u) = m.usage.as_ref().filter(|u| u.input_reported()) {
                    out.push(Event::Usage(Reported {
                        input: Some(u.input()),
                        output: None,
                    }));
                }
            }
            Body::BlockStart { index: i, block } => {
                let index = index(*i);
                match block.kind.as_str() {
                    "tool_use" => out.push(Event::ToolCallStart {
                        index,
                        id: block.id.clone().unwrap_or_default(),
                        name: block.name.clone().unwrap_or_default(),
                    }),
                    "text" => out.push(Event::TextStart { index }),
                    "thinking" => out.push(Event::ReasoningStart { index }),
                    // Its data is all of it, carried as the block's signature is (as
                    // `read_answer` carries it): dropped, the block could not be sent back
                    // (s29 responses attack F2).
                    "redacted_thinking" => {
                        out.push(Event::ReasoningStart { index });
                        if let Some(data) = &block.data {
                            out.push(Event::ReasoningSignature {
                                index,
                                signature: data.clone(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            Body::BlockDelta { index: i, delta } => {
                let index = index(*i);
                if let Some(t) = &delta.text {
                    out.push(Event::TextDelta {
                        index,
                        text: t.clone(),
                    });
                } else if let Some(p) = &delta.partial_json {
                    out.push(Event::ToolArgsDelta {
                        index,
                        json: p.clone(),
                    });
                } else if let Some(t) = &delta.thinking {
                    out.push(Event::ReasoningDelta {
                        index,
                        text: t.clone(),
                    });
                } else if let Some(s) = &delta.signature {
                    out.push(Event::ReasoningSignature {
                        index,
                        signature: s.clone(),
                    });
                }
            }
            Body::MessageDelta(d, u) => {
                out.push(Event::Finish(read_finish(
                    d.stop_reason.as_deref(),
                    d.stop_sequence.as_deref(),
                )));
                // Cumulative figures; the input ones only where this event carries them.
                if let Some(u) = u {
                    let r = Reported {
                        input: u.input_reported().then(|| u.input()),
                        output: u.output(),
                    };
                    if r != Reported::default() {
                        out.push(Event::Usage(r));
                    }
                }
            }
            Body::MessageStop => out.push(Event::Done),
            Body::Error(err) => {
                let t = err.kind.as_deref().unwrap_or("api_error");
                let kind = error_kind(t);
                out.push(Event::Error(ErrorInfo {
                    status: status_of(kind),
                    kind,
                    message: err
                        .message
                        .clone()
                        .unwrap_or_else(|| "The upstream failed mid-stream.".into()),
                    code: Some(t.to_string()),
                    param: None,
                }));
            }
            Body::BlockStop(i) => out.push(Event::BlockStop { index: index(*i) }),
            Body::Other => {}
        }
    }
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    args: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Thinking,
}

enum Held {
    Call(usize),
    Block {
        kind: Kind,
        text: String,
        signature: String,
    },
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Block(usize, Kind),
    /// A live tool block: (block index, call).
    Tool(usize, usize),
}

/// Writes the internal form's events as an Anthropic Messages stream.
#[derive(Default)]
pub struct EventWriter {
    started: bool,
    open: Option<Open>,
    next_block: usize,
    calls: Vec<Call>,
    /// The internal form's block index of each call → the call.
    call_of: HashMap<usize, usize>,
    held: Vec<Held>,
    finish: Option<crate::upstream::providers::canonical::Finish>,
    usage: Usage,
    /// Bytes this writer keeps: held text and arguments not yet sent, and every call's id
    /// and name. An upstream that keeps a second call or text waiting behind a live call
    /// for ever would grow it without bound: the converter ends the stream past its limit.
    held_bytes: usize,
    /// A reasoning block began upstream: its text or signature starts a thinking block of
    /// its own rather than joining the one before (a signature there would replace that
    /// block's own in the SDKs, which assign each `signature_delta`).
    new_reasoning: bool,
}

/// What one call costs to keep besides its strings.
const CALL_BYTES: usize = std::mem::size_of::<Call>() + 16;

fn event(out: &mut Vec<Bytes>, kind: &str, v: Value) {
    out.push(frame(Some(kind), &v.to_string()));
}

fn delta(out: &mut Vec<Bytes>, i: usize, delta: Value) {
    event(
        out,
        "content_block_delta",
        json!({"type": "content_block_delta", "index": i, "delta": delta}),
    );
}

fn text_delta(kind: Kind, t: &str) -> Value {
    match kind {
        Kind::Text => json!({"type": "text_delta", "text": t}),
        Kind::Thinking => json!({"type": "thinking_delta", "thinking": t}),
    }
}

fn empty_block(kind: Kind) -> Value {
    match kind {
        Kind::Text => json!({"type": "text", "text": ""}),
        Kind::Thinking => json!({"type": "thinking", "thinking": ""}),
    }
}

impl EventWriter {
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        if let Some(Open::Block(i, _) | Open::Tool(i, _)) = self.open.take() {
            event(
                out,
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
    }

    fn start(&mut self, out: &mut Vec<Bytes>, block: Value) -> usize {
        self.close(out);
        let i = self.next_block;
        self.next_block += 1;
        event(
            out,
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        );
        i
    }

    fn start_tool(&mut self, out: &mut Vec<Bytes>, call: usize) -> usize {
        let c = &self.calls[call];
        let block = json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}});
        self.start(out, block)
    }

    /// Something other than the live block is waiting, or a tool block is open.
    fn holding(&self) -> bool {
        !self.held.is_empty() || matches!(self.open, Some(Open::Tool(..)))
    }

    /// Text (or reasoning) of the answer: live in its block, or held.
    fn text(&mut self, out: &mut Vec<Bytes>, kind: Kind, t: &str) {
        let fresh = kind == Kind::Thinking && std::mem::take(&mut self.new_reasoning);
        if self.holding() {
            self.held_bytes += t.len();
            match self.held.last_mut() {
                Some(Held::Block { kind: k, text, .. }) if *k == kind && !fresh => text.push_str(t),
                _ => self.held.push(Held::Block {
                    kind,
                    text: t.to_string(),
                    signature: String::new(),
                }),
            }
            return;
        }
        let i = match self.open {
            Some(Open::Block(i, k)) if k == kind && !fresh => i,
            _ => {
                let i = self.start(out, empty_block(kind));
                self.open = Some(Open::Block(i, kind));
                i
            }
        };
        delta(out, i, text_delta(kind, t));
    }

    /// A reasoning signature: on its thinking block, or — none open, as Gemini puts one on
    /// a function call — on a thinking block of its own, as the whole answer gives it. It
    /// was dropped: the client sent the call back without it, which Gemini 3 refuses (s24
    /// attack, translation #2).
    fn signature(&mut self, out: &mut Vec<Bytes>, s: &str) {
        let fresh = std::mem::take(&mut self.new_reasoning);
        if self.holding() {
            self.held_bytes += s.len();
            match self.held.last_mut() {
                Some(Held::Block {
                    kind: Kind::Thinking,
                    signature,
                    ..
                }) if !fresh => signature.push_str(s),
                _ => self.held.push(Held::Block {
                    kind: Kind::Thinking,
                    text: String::new(),
                    signature: s.to_string(),
                }),
            }
            return;
        }
        let i = match self.open {
            Some(Open::Block(i, Kind::Thinking)) if !fresh => i,
            // Gemini signs ordinary text too: a block of its own there would split the text
            // the client reads as one (`content[0].text`); a text's signature is optional
            // to send back, a call's is not.
            Some(Open::Block(_, Kind::Text)) => return,
            _ => {
                let i = self.start(out, empty_block(Kind::Thinking));
                self.open = Some(Open::Block(i, Kind::Thinking));
                i
            }
        };
        delta(out, i, json!({"type": "signature_delta", "signature": s}));
    }

    fn tool_start(&mut self, out: &mut Vec<Bytes>, index: usize, id: &str, name: &str) {
        self.held_bytes += CALL_BYTES + id.len() + name.len();
        self.calls.push(Call {
            id: id.to_string(),
            name: name.to_string(),
            args: String::new(),
        });
        let c = self.calls.len() - 1;
        self.call_of.insert(index, c);
        self.held.push(Held::Call(c));
        self.go_live(out, c);
    }

    fn tool_args(&mut self, out: &mut Vec<Bytes>, index: usize, args: &str) {
        let Some(&call) = self.call_of.get(&index) else {
            return;
        };
        match self.open {
            Some(Open::Tool(i, live)) if live == call => delta(
                out,
                i,
                json!({"type": "input_json_delta", "partial_json": args}),
            ),
            _ => {
                self.held_bytes += args.len();
                self.calls[call].args.push_str(args)
            }
        }
    }

    /// Opens the live block of `call` when it is the only thing waiting and no tool block
    /// is open, sending the arguments gathered so far.
    fn go_live(&mut self, out: &mut Vec<Bytes>, call: usize) {
        if !matches!(self.held.as_slice(), [Held::Call(c)] if *c == call)
            || matches!(self.open, Some(Open::Tool(..)))
        {
            return;
        }
        self.held.clear();
        let i = self.start_tool(out, call);
        self.open = Some(Open::Tool(i, call));
        let args = std::mem::take(&mut self.calls[call].args);
        self.held_bytes = self.held_bytes.saturating_sub(args.len());
        if !args.is_empty() {
            delta(
                out,
                i,
                json!({"type": "input_json_delta", "partial_json": args}),
            );
        }
    }

    /// Closes the live block and sends what was held, each as a whole block.
    fn flush(&mut self, out: &mut Vec<Bytes>) {
        self.close(out);
        for h in std::mem::take(&mut self.held) {
            match h {
                Held::Call(c) => {
                    let i = self.start_tool(out, c);
                    let args = std::mem::take(&mut self.calls[c].args);
                    if !args.is_empty() {
                        delta(
                            out,
                            i,
                            json!({"type": "input_json_delta", "partial_json": args}),
                        );
                    }
                }
                Held::Block {
                    kind,
                    text,
                    signature,
                } => {
                    let i = self.start(out, empty_block(kind));
                    delta(out, i, text_delta(kind, &text));
                    if !signature.is_empty() {
                        delta(
                            out,
                            i,
                            json!({"type": "signature_delta", "signature": signature}),
                        );
                    }
                }
            }
            self.open = Some(Open::Block(self.next_block - 1, Kind::Text));
            self.close(out);
        }
        // What stays is the calls' ids and names.
        self.held_bytes = self
            .calls
            .iter()
            .map(|c| CALL_BYTES + c.id.len() + c.name.len())
            .sum();
    }

    pub fn write(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match e {
            Event::Start { id, model, .. } => {
                if self.started {
                    return;
                }
                self.started = true;
                let id = if id.is_empty() { "msg" } else { id };
                event(
                    out,
                    "message_start",
                    json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": self.usage.input, "output_tokens": 0}}}),
                );
            }
            Event::TextDelta { text, .. } | Event::RefusalDelta { text, .. } => {
                if !text.is_empty() {
                    self.text(out, Kind::Text, text)
                }
            }
            Event::ReasoningDelta { text, .. } => {
                if !text.is_empty() {
                    self.text(out, Kind::Thinking, text)
                }
            }
            Event::ReasoningSignature { signature, .. } => self.signature(out, signature),
            Event::ToolCallStart { index, id, name } => self.tool_start(out, *index, id, name),
            Event::ToolArgsDelta { index, json } => {
                if !json.is_empty() {
                    self.tool_args(out, *index, json)
                }
            }
            Event::Finish(f) => {
                self.flush(out);
                self.finish = Some(f.clone());
            }
            Event::Usage(u) => u.apply(&mut self.usage),
            Event::Done => {
                if !self.started {
                    return;
                }
                self.flush(out);
                let finish = self.finish.clone().unwrap_or_default();
                let (stop_reason, stop_sequence) = write_finish(&finish);
                event(
                    out,
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        "usage": write_usage(&self.usage)}),
                );
                event(out, "message_stop", json!({"type": "message_stop"}));
            }
            Event::Error(e) => event(out, "error", super::write_error(e)),
            Event::ReasoningStart { .. } => self.new_reasoning = true,
            Event::TextStart { .. } | Event::BlockStop { .. } => {}
        }
    }
}

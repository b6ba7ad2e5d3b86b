//! An OpenAI-format stream for an Anthropic client.
//!
//! Anthropic streams one content block at a time; OpenAI streams parallel tool calls
//! side by side, told apart by `index` (only a call's first chunk carries its id). So the
//! first tool call streams live in its block, and whatever arrives while it is open —
//! further calls, text — is held (arguments appended) and sent as whole blocks, in the
//! order it first appeared, when the choice finishes. A new `tool_use` block opens only
//! for a new, non-empty tool-call id; chunks without one continue their index's call. A
//! block's name is fixed when it opens, so a call whose name comes in a later chunk than
//! its id waits for it.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Value};

use super::shape::{Content, Corrupt, StopReason, ToolCall};
use super::{frame, openai_event, OpenAiEvent, StreamConverter};
use crate::upstream::providers::translate::response::{anthropic_error_type, openai_code, Finish};

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    args: String,
}

enum Held {
    Call(usize),
    Text(String),
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text(usize),
    /// A live tool block: (block index, call).
    Tool(usize, usize),
}

#[derive(Default)]
pub(super) struct State {
    started: bool,
    open: Option<Open>,
    next_block: usize,
    calls: Vec<Call>,
    /// OpenAI tool-call index → the call it currently continues.
    slots: HashMap<i64, usize>,
    held: Vec<Held>,
    finish: Finish,
    /// Bytes this state keeps: held text and arguments not yet sent, and every call's id
    /// and name. An upstream that keeps a second call or text waiting behind a live call
    /// for ever would grow it without bound: the converter ends the stream past its limit.
    pub(super) held_bytes: usize,
}

/// What one call costs to keep besides its strings.
const CALL_BYTES: usize = std::mem::size_of::<Call>() + 16;

fn event(out: &mut Vec<Bytes>, kind: &str, v: Value) {
    out.push(frame(Some(kind), &v.to_string()));
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

impl State {
    fn close(&mut self, out: &mut Vec<Bytes>) {
        if let Some(Open::Text(i) | Open::Tool(i, _)) = self.open.take() {
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

    fn delta(out: &mut Vec<Bytes>, i: usize, delta: Value) {
        event(
            out,
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": delta}),
        );
    }

    /// Something other than the live block is waiting, or a tool block is open.
    fn holding(&self) -> bool {
        !self.held.is_empty() || matches!(self.open, Some(Open::Tool(..)))
    }

    fn text(&mut self, out: &mut Vec<Bytes>, t: &str) {
        if self.holding() {
            self.held_bytes += t.len();
            match self.held.last_mut() {
                Some(Held::Text(s)) => s.push_str(t),
                _ => self.held.push(Held::Text(t.to_string())),
            }
            return;
        }
        let i = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                let i = self.start(out, json!({"type": "text", "text": ""}));
                self.open = Some(Open::Text(i));
                i
            }
        };
        Self::delta(out, i, json!({"type": "text_delta", "text": t}));
    }

    fn tool_call(&mut self, out: &mut Vec<Bytes>, tc: &ToolCall) {
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
                if let (Some(n), false) = (name, self.is_live(c)) {
                    if self.calls[c].name.is_empty() {
                        self.held_bytes += n.len();
                        self.calls[c].name = n.to_string();
                        self.go_live(out, c);
                    }
                }
                c
            }
            None => {
                self.held_bytes += CALL_BYTES + id.map_or(0, str::len) + name.map_or(0, str::len);
                self.calls.push(Call {
                    id: id.unwrap_or("").to_string(),
                    name: name.unwrap_or("").to_string(),
                    args: String::new(),
                });
                let c = self.calls.len() - 1;
                // A block's name is fixed when it opens: a call whose name comes in a
                // later chunk waits (its arguments gathered) until the name arrives.
                self.held.push(Held::Call(c));
                if name.is_some() {
                    self.go_live(out, c);
                }
                c
            }
        };
        self.slots.insert(slot, call);
        if let Some(args) = tc.function.as_ref().and_then(|f| non_empty(&f.arguments)) {
            match self.open {
                Some(Open::Tool(i, live)) if live == call => Self::delta(
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
            Self::delta(
                out,
                i,
                json!({"type": "input_json_delta", "partial_json": args}),
            );
        }
    }

    fn is_live(&self, call: usize) -> bool {
        matches!(self.open, Some(Open::Tool(_, c)) if c == call)
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
                        Self::delta(
                            out,
                            i,
                            json!({"type": "input_json_delta", "partial_json": args}),
                        );
                    }
                }
                Held::Text(t) => {
                    let i = self.start(out, json!({"type": "text", "text": ""}));
                    Self::delta(out, i, json!({"type": "text_delta", "text": t}));
                }
            }
            self.open = Some(Open::Text(self.next_block - 1));
            self.close(out);
        }
        // What stays is the calls' ids and names.
        self.held_bytes = self
            .calls
            .iter()
            .map(|c| CALL_BYTES + c.id.len() + c.name.len())
            .sum();
    }
}

impl StreamConverter {
    pub(super) fn openai_to_anthropic(
        &mut self,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
        if data == "[DONE]" {
            self.anthropic_end(out);
            return Ok(());
        }
        let v = match openai_event(data)? {
            OpenAiEvent::Chunk(c) => c,
            OpenAiEvent::Error { error: v, .. } => {
                let e = &v["error"];
                let (t, c) = (
                    e.get("type").and_then(Value::as_str).unwrap_or(""),
                    e.get("code").and_then(Value::as_str).unwrap_or(""),
                );
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("The upstream failed mid-stream.");
                event(
                    out,
                    "error",
                    json!({"type": "error", "error": {"type": anthropic_error_type(t, c), "message": message, "code": openai_code(&v)}}),
                );
                self.error_sent = true;
                return Ok(());
            }
        };
        self.note_openai_chunk(&v);
        let s = &mut self.anthropic_out;
        if !s.started {
            s.started = true;
            event(
                out,
                "message_start",
                json!({"type": "message_start", "message": {
                "id": v.id.as_deref().unwrap_or("msg"), "type": "message", "role": "assistant",
                "model": v.model.as_deref().unwrap_or(""),
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_estimate, "output_tokens": 0}}}),
            );
        }
        // The request asked for one choice: another (an upstream's own `n`) is not
        // spliced into the answer; it is counted in the accounting all the same.
        let Some(choice) = v
            .choices
            .iter()
            .flatten()
            .find(|c| c.index.unwrap_or(0) == 0)
        else {
            return Ok(());
        };
        if let Some(r) = &choice.finish_reason {
            s.finish.reason = Some(r.clone());
        }
        if let Some(StopReason::Text(seq)) = &choice.stop_reason {
            s.finish.sequence = Some(seq.clone());
        }
        if let Some(d) = &choice.delta {
            if let Some(t) = d
                .content
                .as_ref()
                .map(Content::text)
                .filter(|t| !t.is_empty())
            {
                s.text(out, &t);
            }
            if let Some(t) = d.refusal.as_deref().filter(|t| !t.is_empty()) {
                s.finish.refusal = true;
                s.text(out, t);
            }
            for tc in d.tool_calls.iter().flatten() {
                s.tool_call(out, tc);
            }
        }
        if choice.finish_reason.is_some() {
            s.flush(out);
        }
        Ok(())
    }

    /// `[DONE]`: the last blocks, then `message_delta` with the stop reason and the actual
    /// usage (the estimate only when the upstream sent none), then `message_stop`.
    fn anthropic_end(&mut self, out: &mut Vec<Bytes>) {
        if !self.anthropic_out.started {
            return;
        }
        self.anthropic_out.flush(out);
        let usage = self.usage();
        let s = &mut self.anthropic_out;
        s.finish.tool_calls = !s.calls.is_empty();
        let (stop_reason, stop_sequence) = s.finish.anthropic();
        event(
            out,
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"input_tokens": usage.input.saturating_sub(usage.cached_input).max(0), "output_tokens": usage.output,
                          "cache_read_input_tokens": usage.cached_input, "cache_creation_input_tokens": 0}}),
        );
        event(out, "message_stop", json!({"type": "message_stop"}));
        self.done = true;
    }
}

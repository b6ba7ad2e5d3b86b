//! The internal form's stream events written as the Responses stream events
//! (`EventWriter`).

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::answer::{reasoning_item, response_object, usage_json};
use crate::upstream::providers::canonical::{Event, Finish, Usage};
use crate::upstream::providers::formats::responses::stream::error_frame;
use crate::upstream::providers::formats::responses::Stamp;
use crate::upstream::providers::translate::stream::frame;

/// What one kept output item costs beside its texts, counted against the hold limit: its
/// JSON value is one or two maps of 0.6 KB each plus a string per key and value, about
/// 1–1.7 KB (s26 stop attack #3: 128 let a stream of tiny items keep ten times its count).
const ITEM_BYTES: usize = 2_048;

/// An item the stream has opened.
#[derive(Debug)]
enum Open {
    Message {
        index: usize,
        id: String,
        text: String,
    },
    Call {
        index: usize,
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
    Reasoning {
        index: usize,
        /// The internal form's block it holds: another block is another item.
        block: usize,
        id: String,
        text: String,
        signature: Option<String>,
    },
}

/// The internal form's stream events as the Responses stream: `response.created`,
/// `response.in_progress`, per item `response.output_item.added`,
/// (`response.content_part.added`, `response.output_text.delta`…, `…done`) or
/// (`response.function_call_arguments.delta`…, `…done`) or (a reasoning item's
/// `response.reasoning_text.delta`…, `…done`), `response.output_item.done`, and
/// `response.completed` (or `response.incomplete`) with the usage; an upstream's error as
/// the `error` event. Keeps the final response object for the stored copy.
pub struct EventWriter {
    body: Map<String, Value>,
    stamp: Stamp,
    seq: u64,
    started: bool,
    model: String,
    created: i64,
    /// Items complete, in output order.
    done_items: Vec<Value>,
    /// The open message or reasoning item, if any.
    message: Option<Open>,
    /// Open tool calls by the internal form's block index, in the order they opened.
    calls: Vec<(usize, Open)>,
    /// Where each open call's block index sits in `calls`: an upstream that opens call
    /// after call is not scanned in full at every event.
    call_at: HashMap<usize, usize>,
    finish: Option<Finish>,
    /// The figures told so far (`null` in the response until the first).
    usage: Option<Usage>,
    item_ids: String,
    /// Bytes of the answer kept (texts, reasoning, arguments, signatures, each item's ids
    /// and name with `ITEM_BYTES`): the response
    /// object at the end and its stored copy hold all of it, so it counts against the
    /// converter's hold limit (`held_bytes`).
    held: usize,
    pub completed: Option<Value>,
}

impl EventWriter {
    pub fn new(body: Map<String, Value>, stamp: Stamp) -> Self {
        let item_ids = stamp.id.trim_start_matches("resp_").to_string();
        EventWriter {
            body,
            stamp,
            seq: 0,
            started: false,
            model: String::new(),
            created: 0,
            done_items: Vec::new(),
            message: None,
            calls: Vec::new(),
            call_at: HashMap::new(),
            finish: None,
            usage: None,
            item_ids,
            held: 0,
            completed: None,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// The bytes of the answer this writer keeps (`held`).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    fn emit(&mut self, kind: &str, mut v: Value, out: &mut Vec<Bytes>) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push(frame(Some(kind), &v.to_string()));
    }

    /// The response object; at the end (`status_done`) it takes the kept items, which
    /// nothing needs after it (not copied: they may be most of the hold limit).
    fn response(&mut self, status_done: bool) -> Value {
        let mut r = if status_done {
            response_object(
                &self.body,
                &self.model,
                self.created,
                std::mem::take(&mut self.done_items),
                self.finish.as_ref(),
                self.usage.as_ref().map_or(Value::Null, usage_json),
            )
        } else {
            let mut r = response_object(
                &self.body,
                &self.model,
                self.created,
                vec![],
                None,
                Value::Null,
            );
            r["status"] = json!("in_progress");
            r
        };
        self.stamp.apply(&mut r);
        r
    }

    fn next_index(&self) -> usize {
        self.done_items.len() + usize::from(self.message.is_some()) + self.calls.len()
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        match self.message.take() {
            Some(Open::Message { index, id, text }) => {
                self.emit("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}), out);
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    out,
                );
                let item = json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]});
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.done_items.push(item);
            }
            Some(Open::Reasoning {
                index,
                id,
                text,
                signature,
                ..
            }) => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                    out,
                );
                let item = reasoning_item(id, &text, signature.as_deref());
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.done_items.push(item);
            }
            _ => {}
        }
    }

    fn close_calls(&mut self, out: &mut Vec<Bytes>) {
        self.call_at.clear();
        for (_, open) in std::mem::take(&mut self.calls) {
            let Open::Call {
                index,
                id,
                call_id,
                name,
                mut args,
            } = open
            else {
                continue;
            };
            // A call whose input came as nothing has the arguments `{}`, as its whole
            // answer gives (s24 attack, translation #5).
            if args.is_empty() {
                args.push_str("{}");
                self.emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": args}),
                    out,
                );
            }
            self.emit(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": args}),
                out,
            );
            let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args, "status": "completed"});
            self.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
                out,
            );
            self.done_items.push(item);
        }
    }

    fn start(&mut self, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let r = self.response(false);
        self.emit("response.created", json!({"response": r}), out);
        self.emit("response.in_progress", json!({"response": r}), out);
    }

    /// Opens a message item unless one is open (closing open calls or reasoning first).
    fn open_message(&mut self, out: &mut Vec<Bytes>) {
        if matches!(self.message, Some(Open::Message { .. })) {
            return;
        }
        self.close_message(out);
        self.close_calls(out);
        self.held = self.held.saturating_add(ITEM_BYTES);
        let index = self.next_index();
        // Its output index in the id: text after a call or a reasoning item opens another
        // message item, which needs an id of its own (s29 responses attack F4: all were
        // `msg_<ids>`, and OpenAI refuses a continuation holding two items of one id).
        let id = format!("msg_{}_{}", self.item_ids, index);
        self.emit("response.output_item.added", json!({"output_index": index,
            "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}), out);
        self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}),
            out,
        );
        self.message = Some(Open::Message {
            index,
            id,
            text: String::new(),
        });
    }

    /// Opens a reasoning item for the block `block` unless one is open: of that block, or,
    /// when `any`, of any block (a delta or signature with no start of its own goes on the
    /// open item). A start of another block closes the open item: one item per block, so
    /// a signature-only block keeps its place before the call it signs (s29 responses
    /// attack F2: a Gemini thought and the call's signature made one item, and the call
    /// went back without its signature).
    fn open_reasoning(&mut self, block: usize, any: bool, out: &mut Vec<Bytes>) {
        if let Some(Open::Reasoning { block: b, .. }) = &self.message {
            if any || *b == block {
                return;
            }
        }
        self.close_message(out);
        self.close_calls(out);
        self.held = self.held.saturating_add(ITEM_BYTES);
        let index = self.next_index();
        let id = format!("rs_{}_{}", self.item_ids, index);
        self.emit(
            "response.output_item.added",
            json!({"output_index": index,
            "item": {"type": "reasoning", "id": id, "summary": [], "content": []}}),
            out,
        );
        self.message = Some(Open::Reasoning {
            index,
            block,
            id,
            text: String::new(),
            signature: None,
        });
    }

    /// Writes the Responses events of one internal-form event.
    pub fn write(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match e {
            Event::Start { model, created, .. } => {
                if !self.started {
                    self.model = model.clone();
                    // An upstream that gives none (Anthropic): the time the answer began.
                    self.created = created.unwrap_or_else(|| chrono::Utc::now().timestamp());
                }
                self.start(out);
            }
            Event::TextDelta { text, .. } if !text.is_empty() => {
                self.start(out);
                self.open_message(out);
                let mut ev = None;
                if let Some(Open::Message { index, id, text: t }) = &mut self.message {
                    t.push_str(text);
                    self.held = self.held.saturating_add(text.len());
                    ev = Some(
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
                    );
                }
                if let Some(ev) = ev {
                    self.emit("response.output_text.delta", ev, out);
                }
            }
            Event::ReasoningStart { index: k } => {
                self.start(out);
                self.open_reasoning(*k, false, out);
            }
            Event::ReasoningDelta { index: k, text } if !text.is_empty() => {
                self.start(out);
                self.open_reasoning(*k, true, out);
                let mut ev = None;
                if let Some(Open::Reasoning {
                    index, id, text: t, ..
                }) = &mut self.message
                {
                    t.push_str(text);
                    self.held = self.held.saturating_add(text.len());
                    ev = Some(
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
                    );
                }
                if let Some(ev) = ev {
                    self.emit("response.reasoning_text.delta", ev, out);
                }
            }
            Event::ReasoningSignature {
                index: k,
                signature,
            } => {
                self.start(out);
                self.open_reasoning(*k, true, out);
                if let Some(Open::Reasoning { signature: s, .. }) = &mut self.message {
                    *s = Some(signature.clone());
                    self.held = self.held.saturating_add(signature.len());
                }
            }
            Event::ToolCallStart { index: k, id, name } => {
                self.start(out);
                if self.call_at.contains_key(k) {
                    return;
                }
                self.close_message(out);
                let index = self.next_index();
                let item_id = format!("fc_{}_{}", self.item_ids, index);
                // Kept until the answer is whole, as texts and arguments are (s26 diff
                // attack #2: a stream of calls grew without the hold limit seeing it).
                self.held = self
                    .held
                    .saturating_add(ITEM_BYTES + id.len() + name.len() + item_id.len());
                self.call_at.insert(*k, self.calls.len());
                self.emit("response.output_item.added", json!({"output_index": index,
                    "item": {"type": "function_call", "id": item_id, "call_id": id, "name": name, "arguments": "", "status": "in_progress"}}), out);
                self.calls.push((
                    *k,
                    Open::Call {
                        index,
                        id: item_id,
                        call_id: id.clone(),
                        name: name.clone(),
                        args: String::new(),
                    },
                ));
            }
            Event::ToolArgsDelta { index: k, json } if !json.is_empty() => {
                let mut ev = None;
                if let Some((
                    _,
                    Open::Call {
                        index, id, args, ..
                    },
                )) = self.call_at.get(k).and_then(|&at| self.calls.get_mut(at))
                {
                    args.push_str(json);
                    self.held = self.held.saturating_add(json.len());
                    ev = Some(json!({"item_id": id, "output_index": index, "delta": json}));
                }
                if let Some(ev) = ev {
                    self.emit("response.function_call_arguments.delta", ev, out);
                }
            }
            Event::RefusalDelta { text, .. } if !text.is_empty() => {
                // A refusal streamed as text of the message (no `response.refusal.delta` yet;
                // the non-streamed answer has its `refusal` part).
                self.write(
                    &Event::TextDelta {
                        index: 0,
                        text: text.clone(),
                    },
                    out,
                );
            }
            // A reasoning block's end ends its item: what follows is another's.
            Event::BlockStop { index: k } if matches!(self.message, Some(Open::Reasoning { block, .. }) if block == *k) =>
            {
                self.close_message(out);
            }
            Event::Usage(r) => r.apply(self.usage.get_or_insert_with(Usage::default)),
            Event::Finish(f) => self.finish = Some(f.clone()),
            Event::Error(e) => {
                let seq = self.seq;
                self.seq += 1;
                let code = e.code.as_deref().unwrap_or("upstream_error");
                out.push(error_frame(seq, &e.message, code));
            }
            // Once: the response took the kept items.
            Event::Done if self.completed.is_none() => {
                self.start(out);
                self.close_message(out);
                self.close_calls(out);
                let r = self.response(true);
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(kind, json!({"response": r}), out);
                self.completed = Some(r);
            }
            _ => {}
        }
    }
}

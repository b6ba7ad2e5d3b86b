//! `streamGenerateContent?alt=sse`: each SSE `data:` is a whole `GenerateContentResponse`
//! holding the next pieces of the first candidate. The chunk with the `finishReason` ends
//! the answer (`Finish`); its `usageMetadata` — or a later chunk's, which some servers send
//! on its own — is the final usage (each chunk before it may carry a running one). Gemini
//! has no end-of-stream event: the stream is over when its body ends, which the converter
//! sees (`StreamConverter::end`), so this reader never says `Done`; after the finish it
//! reads only usage. Function calls arrive whole, one part each.

use serde_json::Value;

use super::answer::{
    blocked, call_id, call_prefix, finish_of, parts_of, read_reported, signature_only, text,
    unmodelled,
};
use super::error::read_error;
use crate::upstream::providers::canonical::{Event, Finish};
use crate::upstream::providers::translate::stream::Corrupt;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Reasoning,
}

/// Reads one stream's chunks, in order, into internal events.
#[derive(Default)]
pub struct EventReader {
    started: bool,
    /// The open text or reasoning block and its index.
    open: Option<(Open, usize)>,
    next_index: usize,
    calls: usize,
    /// The call-id prefix, fixed by the first chunk (its `responseId`).
    prefix: String,
    /// The finish came: later chunks carry nothing but usage.
    finished: bool,
    /// The upstream's error event came: nothing after it is read.
    failed: bool,
}

impl EventReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// One SSE event; `name` is unused (Gemini names none).
    pub fn read(&mut self, _name: &str, data: &str, out: &mut Vec<Event>) -> Result<(), Corrupt> {
        let v: Value = serde_json::from_str(data).map_err(|e| {
            if e.is_data() {
                Corrupt::Shape
            } else {
                Corrupt::Json
            }
        })?;
        if !v.is_object() {
            return Err(Corrupt::Shape);
        }
        if self.failed {
            return Ok(());
        }
        if self.finished {
            if let Some(u) = v.get("usageMetadata").and_then(read_reported) {
                out.push(Event::Usage(u));
            }
            return Ok(());
        }
        if v.get("error").is_some_and(Value::is_object) {
            let status = v
                .pointer("/error/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500);
            out.push(Event::Error(read_error(status, &v)));
            self.failed = true;
            return Ok(());
        }
        if !self.started {
            self.started = true;
            self.prefix = call_prefix(&v);
            out.push(Event::Start {
                id: text(v.get("responseId")).unwrap_or_default(),
                model: text(v.get("modelVersion")).unwrap_or_default(),
                created: text(v.get("createTime"))
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                    .map(|t| t.timestamp()),
            });
        }
        let candidate = match v.get("candidates") {
            None | Some(Value::Null) => None,
            Some(Value::Array(c)) => c.first(),
            Some(_) => return Err(Corrupt::Shape),
        };
        let mut finish = None;
        if let Some(c) = candidate {
            for part in parts_of(c)? {
                self.part(part, out)?;
            }
            if let Some(r) = c.get("finishReason").filter(|r| !r.is_null()) {
                finish = Some(finish_of(Some(r), self.calls > 0));
            }
        } else if blocked(&v) {
            finish = Some(Finish::ContentFilter);
        }
        if let Some(f) = finish {
            self.close(out);
            out.push(Event::Finish(f));
            self.finished = true;
        }
        if let Some(u) = v.get("usageMetadata").and_then(read_reported) {
            out.push(Event::Usage(u));
        }
        Ok(())
    }

    fn part(&mut self, part: &Value, out: &mut Vec<Event>) -> Result<(), Corrupt> {
        let signature = text(part.get("thoughtSignature"));
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            let index = self.block(Open::Reasoning, out);
            let t = text(part.get("text")).unwrap_or_default();
            if !t.is_empty() {
                out.push(Event::ReasoningDelta { index, text: t });
            }
            if let Some(signature) = signature {
                out.push(Event::ReasoningSignature { index, signature });
            }
            return Ok(());
        }
        if let Some(signature) = signature {
            // A signature on the part after a thought: its own reasoning block, as
            // `read_answer` makes it.
            self.close(out);
            let index = self.block(Open::Reasoning, out);
            out.push(Event::ReasoningSignature { index, signature });
            self.close(out);
        }
        if let Some(call) = part.get("functionCall") {
            let name = text(call.get("name")).ok_or(Corrupt::Shape)?;
            let args = match call.get("args") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(a @ Value::Object(_)) => a.to_string(),
                Some(_) => return Err(Corrupt::Shape),
            };
            self.close(out);
            let index = self.take_index();
            let id = call_id(&self.prefix, self.calls);
            self.calls += 1;
            out.push(Event::ToolCallStart { index, id, name });
            out.push(Event::ToolArgsDelta { index, json: args });
            out.push(Event::BlockStop { index });
        } else if let Some(t) = part.get("text") {
            let t = t.as_str().ok_or(Corrupt::Shape)?;
            if !t.is_empty() {
                let index = self.block(Open::Text, out);
                out.push(Event::TextDelta {
                    index,
                    text: t.to_string(),
                });
            }
        } else if !signature_only(part) {
            return Err(unmodelled(part));
        }
        Ok(())
    }

    /// The open block of `kind`, opening it (and closing another) when needed.
    fn block(&mut self, kind: Open, out: &mut Vec<Event>) -> usize {
        if let Some((k, i)) = self.open {
            if k == kind {
                return i;
            }
            self.close(out);
        }
        let index = self.take_index();
        out.push(match kind {
            Open::Text => Event::TextStart { index },
            Open::Reasoning => Event::ReasoningStart { index },
        });
        self.open = Some((kind, index));
        index
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            out.push(Event::BlockStop { index });
        }
    }

    fn take_index(&mut self) -> usize {
        let i = self.next_index;
        self.next_index += 1;
        i
    }
}

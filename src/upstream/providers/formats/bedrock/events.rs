//! ConverseStream events → the internal form's stream events. Each call takes one frame of
//! the binary event stream (`providers::bedrock::eventstream`): its `:event-type` (or, for
//! an exception, its `:exception-type`) and its JSON payload.
//!
//! Bedrock starts a tool-use block with `contentBlockStart` but a text or reasoning block
//! with its first `contentBlockDelta`; the reader starts those blocks itself. Bedrock's
//! `contentBlockIndex` is renumbered in the order blocks start, as the internal form
//! numbers them. The usage comes in the last event, `metadata`, after `messageStop`: that
//! event ends the answer (`Done`). A `metadata` sent before `messageStop` is held and told
//! after the finish, where a final usage belongs (one before the finish is a running
//! figure to the converter) — unless more of the answer came after it: then it was not
//! the whole answer's usage, and it is told before the finish, a floor under the count. A
//! stream whose body ends after `messageStop` without `metadata` lost its usage: it is cut
//! (`StreamConverter::end`).

use std::collections::HashMap;

use serde_json::Value;

use super::read::{exception_status, finish_of, read_error, stream_reported};
use crate::upstream::providers::canonical::{Event, Reported};
use crate::upstream::providers::translate::stream::Corrupt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Reasoning,
    Tool,
}

#[derive(Debug, Default)]
pub struct EventReader {
    /// Bedrock's block index → (ours, what it is).
    blocks: HashMap<u64, (usize, Block)>,
    started: bool,
    /// `messageStop` came (the finish is out).
    stopped: bool,
    /// `metadata` came before `messageStop`: the answer ends at `messageStop`.
    metadata_seen: bool,
    /// The usages of `metadata` events that came before `messageStop` and after the last
    /// of the answer: told after the finish (the converter charges the most of them).
    held: Vec<Reported>,
    /// Such usages with more of the answer after them: running figures, told before the
    /// finish (floors under the count).
    floors: Vec<Reported>,
}

impl EventReader {
    pub fn new() -> EventReader {
        EventReader::default()
    }

    pub fn read(&mut self, name: &str, data: &str, out: &mut Vec<Event>) -> Result<(), Corrupt> {
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
        if matches!(name, "contentBlockStart" | "contentBlockDelta") {
            self.floors.append(&mut self.held);
        }
        match name {
            "messageStart" => self.start(out),
            "contentBlockStart" => {
                self.start(out);
                let index = block_index(&v)?;
                let start = v
                    .get("start")
                    .and_then(Value::as_object)
                    .ok_or(Corrupt::Shape)?;
                // A block that starts as anything but a tool call (one ConverseStream added
                // later) is a kind this reader does not model, not a broken event; a start
                // with nothing in it is no block at all.
                let tool = start.get("toolUse").ok_or(if start.is_empty() {
                    Corrupt::Shape
                } else {
                    Corrupt::Unsupported
                })?;
                let text = |k: &str| tool.get(k).and_then(Value::as_str).map(str::to_string);
                let (Some(id), Some(name)) = (text("toolUseId"), text("name")) else {
                    return Err(Corrupt::Shape);
                };
                if self.blocks.contains_key(&index) {
                    return Err(Corrupt::Shape);
                }
                let ours = self.open(index, Block::Tool);
                out.push(Event::ToolCallStart {
                    index: ours,
                    id,
                    name,
                });
            }
            "contentBlockDelta" => {
                self.start(out);
                let index = block_index(&v)?;
                let delta = v
                    .get("delta")
                    .and_then(Value::as_object)
                    .ok_or(Corrupt::Shape)?;
                let str_of = |x: &Value| x.as_str().map(str::to_string).ok_or(Corrupt::Shape);
                if let Some(t) = delta.get("text") {
                    let ours = self.block(index, Block::Text, out)?;
                    out.push(Event::TextDelta {
                        index: ours,
                        text: str_of(t)?,
                    });
                } else if let Some(u) = delta.get("toolUse") {
                    let Some(&(ours, Block::Tool)) = self.blocks.get(&index) else {
                        return Err(Corrupt::Shape);
                    };
                    let json = str_of(u.get("input").ok_or(Corrupt::Shape)?)?;
                    out.push(Event::ToolArgsDelta { index: ours, json });
                } else if let Some(r) = delta.get("reasoningContent") {
                    let ours = self.block(index, Block::Reasoning, out)?;
                    if let Some(t) = r.get("text") {
                        out.push(Event::ReasoningDelta {
                            index: ours,
                            text: str_of(t)?,
                        });
                    } else if let Some(s) = r.get("signature").or_else(|| r.get("redactedContent"))
                    {
                        out.push(Event::ReasoningSignature {
                            index: ours,
                            signature: str_of(s)?,
                        });
                    } else {
                        return Err(Corrupt::Shape);
                    }
                }
                // Other deltas (citations) carry nothing the internal form holds.
            }
            "contentBlockStop" => {
                let index = block_index(&v)?;
                let &(ours, _) = self.blocks.get(&index).ok_or(Corrupt::Shape)?;
                out.push(Event::BlockStop { index: ours });
            }
            "messageStop" => {
                let reason = v
                    .get("stopReason")
                    .and_then(Value::as_str)
                    .ok_or(Corrupt::Shape)?;
                out.extend(self.floors.drain(..).map(Event::Usage));
                out.push(Event::Finish(finish_of(reason)));
                self.stopped = true;
                out.extend(self.held.drain(..).map(Event::Usage));
                if self.metadata_seen {
                    out.push(Event::Done);
                }
            }
            // The usage; it ends the answer once the finish is out (Bedrock sends it after
            // `messageStop`; one sent before waits for it, so the stop reason is not lost).
            "metadata" => {
                if let Some(u) = v.get("usage") {
                    let u = stream_reported(u).ok_or(Corrupt::Shape)?;
                    if self.stopped {
                        out.push(Event::Usage(u));
                    } else {
                        self.held.push(u);
                    }
                }
                self.metadata_seen = true;
                if self.stopped {
                    out.push(Event::Done);
                }
            }
            exception if exception.ends_with("Exception") => {
                // The payload names no type; the frame's header does.
                let mut body = v.clone();
                body["__type"] = Value::String(exception.to_string());
                out.push(Event::Error(read_error(exception_status(exception), &body)));
            }
            // An event type added after this reader: additive, nothing to carry.
            _ => {}
        }
        Ok(())
    }

    fn start(&mut self, out: &mut Vec<Event>) {
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: format!("bedrock-{}", uuid::Uuid::new_v4().simple()),
                model: String::new(),
                created: None,
            });
        }
    }

    fn open(&mut self, index: u64, kind: Block) -> usize {
        let ours = self.blocks.len();
        self.blocks.insert(index, (ours, kind));
        ours
    }

    /// Our index of a text or reasoning block, starting it on its first delta. A delta of
    /// another kind than the block's is corrupt.
    fn block(&mut self, index: u64, kind: Block, out: &mut Vec<Event>) -> Result<usize, Corrupt> {
        match self.blocks.get(&index) {
            Some(&(ours, k)) if k == kind => Ok(ours),
            Some(_) => Err(Corrupt::Shape),
            None => {
                let ours = self.open(index, kind);
                out.push(match kind {
                    Block::Reasoning => Event::ReasoningStart { index: ours },
                    _ => Event::TextStart { index: ours },
                });
                Ok(ours)
            }
        }
    }
}

fn block_index(v: &Value) -> Result<u64, Corrupt> {
    v.get("contentBlockIndex")
        .and_then(Value::as_u64)
        .ok_or(Corrupt::Shape)
}

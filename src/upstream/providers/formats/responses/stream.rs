//! Responses API streams: typed SSE events (`event: response.…`) each carrying its `type`
//! and a `sequence_number`.
//!
//! - `Native` reads an `openai` upstream's own Responses stream and passes each event on,
//!   with the gateway's id written into the `response` objects it carries, while taking the
//!   text (to count when the usage never comes) and the usage of `response.completed`.
//!
//! Every other upstream's stream is written by `adapter::EventWriter` from the internal
//! form's events. Either keeps the final response object for the stored copy.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{response_usage, Stamp};
use crate::upstream::providers::canonical::Fault;
use crate::upstream::providers::translate::stream::frame;
use crate::usage::Usage;

/// The error event a Responses stream ends with.
pub fn error_frame(sequence_number: u64, message: &str, code: &str) -> Bytes {
    let data = json!({"type": "error", "code": code, "message": message, "param": null,
        "sequence_number": sequence_number});
    frame(Some("error"), &data.to_string())
}

/// What one native event told the accounting.
#[derive(Debug, Default)]
pub struct Read {
    pub frame: Option<Bytes>,
    /// Output text (or tool arguments) the event carried.
    pub text: Option<String>,
    pub usage: Option<Usage>,
    /// The response is complete (`response.completed` / `response.incomplete`).
    pub done: bool,
    /// The upstream ended the stream with its own error (`error` / `response.failed`).
    pub failed: bool,
    /// The upstream's own fault that error names, if it is one (`Fault`).
    pub fault: Option<Fault>,
}

pub struct Native {
    stamp: Stamp,
    /// The next sequence number the gateway would give an event of its own.
    pub next_seq: u64,
    /// The final response object, stamped.
    pub completed: Option<Value>,
}

impl Native {
    pub fn new(stamp: Stamp) -> Self {
        Native {
            stamp,
            next_seq: 0,
            completed: None,
        }
    }

    /// Reads one upstream event; `Err` when it is not a Responses event.
    pub fn read(&mut self, name: &str, data: &str) -> Result<Read, &'static str> {
        let mut v: Value = serde_json::from_str(data)
            .map_err(|_| "The upstream sent an event that is not JSON.")?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or("The upstream sent an event without a type.")?
            .to_string();
        if let Some(s) = v.get("sequence_number").and_then(Value::as_u64) {
            self.next_seq = self.next_seq.max(s.saturating_add(1));
        }
        let mut read = Read::default();
        if let Some(r) = v.get_mut("response") {
            self.stamp.apply(r);
        }
        match kind.as_str() {
            "response.output_text.delta"
            | "response.function_call_arguments.delta"
            | "response.refusal.delta"
            | "response.reasoning_summary_text.delta"
            // A custom tool's input (Codex's `apply_patch`) and raw reasoning text (gpt-oss
            // on vLLM): output billed as any other, counted when the usage never comes.
            | "response.custom_tool_call_input.delta"
            | "response.reasoning_text.delta" => {
                read.text = v.get("delta").and_then(Value::as_str).map(str::to_string);
            }
            "response.completed" | "response.incomplete" => {
                read.usage = v.get("response").and_then(response_usage);
                read.done = true;
                self.completed = v.get("response").cloned();
            }
            "response.failed" | "error" => {
                read.failed = true;
                // `response.failed` carries its error in the response, `error` at the top;
                // OpenAI's own fault is its code `server_error`.
                let code = ["/response/error/code", "/code"]
                    .iter()
                    .find_map(|p| v.pointer(p).and_then(Value::as_str));
                read.fault = (code == Some("server_error")).then_some(Fault::Server);
            }
            _ => {}
        }
        let name = if name.is_empty() || name == "message" {
            kind.as_str()
        } else {
            name
        };
        read.frame = Some(frame(Some(name), &v.to_string()));
        Ok(read)
    }
}

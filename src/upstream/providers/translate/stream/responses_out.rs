//! A Responses API client's stream: an upstream's native Responses events passed through,
//! stamped, or any other format's written as Responses events from the internal form.

use bytes::Bytes;

use super::across::Writer;
use super::StreamConverter;
use crate::upstream::providers::formats::responses::adapter as responses_adapter;
use crate::upstream::providers::formats::responses::stream as responses;
use crate::upstream::providers::Format;

/// How a Responses client's stream is written.
pub enum ResponsesOut {
    /// The upstream speaks the Responses API: its events pass through (stamped).
    Native(responses::Native),
    /// The upstream's stream, read by its format's reader, is written as Responses events
    /// from the internal form.
    Translated(Box<responses_adapter::EventWriter>),
}

impl StreamConverter {
    /// Writes the stream for a Responses API client (see `ResponsesOut`).
    pub fn responses(mut self, out: ResponsesOut) -> Self {
        self.include_usage = true;
        match out {
            ResponsesOut::Native(n) => self.responses = Some(Box::new(n)),
            ResponsesOut::Translated(w) => {
                self.client = Format::Responses;
                self.writer = Writer::Responses(w);
            }
        }
        self
    }

    /// A Responses client's final response object, once the stream completed.
    pub fn completed_response(&mut self) -> Option<serde_json::Value> {
        if let Some(n) = self.responses.as_deref_mut() {
            return n.completed.take();
        }
        match &mut self.writer {
            Writer::Responses(w) => w.completed.take(),
            _ => None,
        }
    }

    /// A native Responses stream: each event passes through, stamped and accounted.
    pub(super) fn responses_event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        let Some(mut n) = self.responses.take() else {
            return;
        };
        {
            match n.read(name, data) {
                Ok(read) => {
                    if let Some(t) = &read.text {
                        self.note_text(t);
                    }
                    // `response.completed` is the finish, the end and the usage.
                    self.finished |= read.done;
                    self.done |= read.done;
                    if let Some(u) = read.usage {
                        self.report(u);
                    }
                    if read.failed {
                        self.end_by_the_upstream(read.fault);
                    }
                    out.extend(read.frame);
                }
                Err(message) => {
                    out.push(responses::error_frame(
                        n.next_seq,
                        message,
                        "upstream_error",
                    ));
                    self.end_by_the_gateway();
                }
            }
        }
        self.responses = Some(n);
    }
}

//! The client's events framed as SSE, and the error event that ends a stream in the
//! client's format.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;

use super::across::Writer;
use super::StreamConverter;
use crate::upstream::providers::canonical::Fault;
use crate::upstream::providers::formats::responses::stream as responses;
use crate::upstream::providers::Format;

/// Whether `name` may stand as an SSE event's name: letters, digits, `_`, `.` and `-`, at
/// most 64 bytes. A name taken from an upstream's decoded data (its `type`) may hold a line
/// ending, and written out it would end the `event:` line and inject events of the
/// upstream's choosing — text never charged, a usage after the finish (s30 diff attack F1).
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One SSE event: `event` if named (a name that is not `plain_name` is left out: the event
/// reads as `message`), and `data` as one `data:` line per line of it. The parser joins an
/// event's `data:` lines with `\n`, so data an upstream sent over several lines (a
/// pretty-printed chunk: legal JSON) is framed back so, and the client's parser reads the
/// same data; one line holding the newline would end the data at it.
pub fn frame(event: Option<&str>, data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 32);
    if let Some(e) = event.filter(|e| plain_name(e)) {
        b.put_slice(b"event: ");
        b.put_slice(e.as_bytes());
        b.put_slice(b"\n");
    }
    for line in data.split('\n') {
        b.put_slice(b"data: ");
        b.put_slice(line.as_bytes());
        b.put_slice(b"\n");
    }
    b.put_slice(b"\n");
    b.freeze()
}

/// An error event in `client`'s format, ending a stream that cannot complete.
pub fn error_event(client: impl Into<Format>, message: &str, code: &str) -> Bytes {
    typed_error_event(
        client,
        (message, code),
        ("server_error", "api_error"),
        serde_json::Map::new(),
    )
}

/// `error_event` with the error's own `type` in each format (OpenAI's, Anthropic's) and
/// its `extra` fields inside `error`: a gateway refusal sent on a stream already open (a
/// queued request's 401 is an `authentication_error`; its queue timeout an
/// `overloaded_error` with `retry_after_seconds`, `queue_position` and
/// `estimated_wait_seconds`, which the stream has no header for), not a server error.
pub fn typed_error_event(
    client: impl Into<Format>,
    (message, code): (&str, &str),
    (openai, anthropic): (&str, &str),
    extra: serde_json::Map<String, serde_json::Value>,
) -> Bytes {
    match client.into() {
        // Gemini and Bedrock are never a client's format; OpenAI's shape stands in.
        Format::OpenAiChat | Format::Gemini | Format::Bedrock => {
            let mut error =
                json!({"message": message, "type": openai, "param": null, "code": code});
            if let Some(e) = error.as_object_mut() {
                e.extend(extra);
            }
            frame(None, &json!({ "error": error }).to_string())
        }
        Format::Anthropic => {
            let mut error = json!({"type": anthropic, "message": message, "code": code});
            if let Some(e) = error.as_object_mut() {
                e.extend(extra);
            }
            frame(
                Some("error"),
                &json!({"type": "error", "error": error}).to_string(),
            )
        }
        // A stream that ends before its first event (a converter writes its own with the
        // next sequence number: `StreamConverter::end_frame`).
        Format::Responses => responses::error_frame(0, message, code),
    }
}

impl StreamConverter {
    /// An error event — the upstream's, or the gateway's for an event it could not read
    /// (`ended_by_the_gateway`) — reached the client in its format: the stream is over.
    pub fn upstream_failed(&self) -> bool {
        self.error_sent
    }

    /// The stream ended on the gateway's own error event (an event it could not read, the
    /// hold limit): the upstream did not break it off, and may have run on.
    pub fn ended_by_the_gateway(&self) -> bool {
        self.gateway_ended
    }

    /// The gateway ended the stream on a piece of the answer of a kind it does not model
    /// (`Corrupt::Unsupported`): well-formed, no failure of the upstream's key (s28 streams
    /// F1: three streams of a Gemini image part by any token opened a shared key).
    pub fn unsupported(&self) -> bool {
        self.unsupported
    }

    /// The upstream's own fault its error event named (`Fault`), if that ended the stream
    /// and named one: its key's verdict (`pipeline::attempts::stream_ended`).
    pub fn fault(&self) -> Option<Fault> {
        self.fault
    }

    /// Ends the client's stream on the upstream's own error event (just passed on), which
    /// named `fault` if any.
    pub(super) fn end_by_the_upstream(&mut self, fault: Option<Fault>) {
        self.error_sent = true;
        self.fault = fault;
    }

    /// Ends the client's stream on the gateway's error event (just written).
    pub(super) fn end_by_the_gateway(&mut self) {
        self.error_sent = true;
        self.gateway_ended = true;
    }

    /// The closing event of a stream that broke, in the client's format — none when the
    /// upstream's own error event already ended it.
    pub fn error_frame(&self, message: &str) -> Option<Bytes> {
        self.end_frame(message, "upstream_error")
    }

    /// As `error_frame`, with this code (`shutting_down` when the gateway ends the stream).
    pub fn end_frame(&self, message: &str, code: &str) -> Option<Bytes> {
        (!self.error_sent).then(|| self.client_error(message, code))
    }

    /// An error event in the client's format; a Responses client's with the next sequence
    /// number of its stream.
    pub(super) fn client_error(&self, message: &str, code: &str) -> Bytes {
        if let Some(n) = &self.responses {
            return responses::error_frame(n.next_seq, message, code);
        }
        match &self.writer {
            Writer::Responses(w) => responses::error_frame(w.next_seq(), message, code),
            _ => error_event(self.client, message, code),
        }
    }
}

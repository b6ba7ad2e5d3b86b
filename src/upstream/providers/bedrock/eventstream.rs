//! The framing of Bedrock's ConverseStream answer: the AWS binary event stream
//! (`application/vnd.amazon.eventstream`), decoded with `aws-smithy-eventstream`, the
//! crate the AWS SDK for Rust decodes it with (length prelude, headers, payload, both CRCs
//! checked). Each frame becomes one `Frame`: the event or exception type and its JSON
//! payload, which `formats::bedrock::EventReader` reads like an SSE event's name and data.
//!
//! A frame that fails its checks — a bad CRC, a length that cannot be, a frame without a
//! type — is `Corrupt`: the stream ends with the gateway's error event, like a corrupt SSE
//! event. The prelude is checked as soon as its 12 bytes are in, so a corrupt length is
//! refused at once instead of waiting for bytes that will never come, and no frame may
//! claim more than `MAX_FRAME_BYTES`, so a lying upstream cannot make the gateway buffer
//! without bound.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use bytes::{Buf, BytesMut};

/// The largest frame accepted. AWS's event-stream limit is 16 MiB of payload plus 128 KiB
/// of headers; a frame over that is not Bedrock's.
pub const MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024 + 128 * 1024 + 16;

const PRELUDE: usize = 12;
const MIN_FRAME: u32 = 16;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// `:event-type` for an event (`messageStart`, `contentBlockDelta`, …), `:exception-type`
    /// for an exception (`throttlingException`, …), `:error-code` for an error frame.
    pub name: String,
    pub kind: FrameKind,
    /// The payload as text (JSON for events and exceptions; an error frame's
    /// `:error-message`).
    pub data: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Event,
    Exception,
    Error,
}

/// The byte stream is not a valid event stream; `what` says why, for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt event-stream frame: {what}")]
pub struct CorruptFrame {
    pub what: String,
}

fn corrupt(what: impl Into<String>) -> CorruptFrame {
    CorruptFrame { what: what.into() }
}

/// Decodes frames from the chunks of an HTTP body, however the chunks split them.
#[derive(Debug, Default)]
pub struct Decoder {
    frames: MessageFrameDecoder,
    buf: BytesMut,
    /// The prelude of the frame being read was checked.
    checked: bool,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Takes the next chunk of the body and appends every frame it completes to `out`.
    /// After an error the decoder is not usable: the stream is over.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Frame>) -> Result<(), CorruptFrame> {
        self.buf.extend_from_slice(chunk);
        loop {
            if !self.checked {
                if self.buf.len() < PRELUDE {
                    return Ok(());
                }
                check_prelude(&self.buf[..PRELUDE])?;
                self.checked = true;
            }
            match self.frames.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Incomplete) => return Ok(()),
                Ok(DecodedFrame::Complete(m)) => {
                    self.checked = false;
                    out.push(frame_of(&m)?);
                }
                Err(e) => return Err(corrupt(e.to_string())),
            }
        }
    }

    /// The body ended: bytes of an unfinished frame left over are a truncated stream.
    pub fn finish(&self) -> Result<(), CorruptFrame> {
        if self.buf.is_empty() && !self.checked {
            Ok(())
        } else {
            Err(corrupt("the stream ended inside a frame"))
        }
    }
}

/// The 12-byte prelude: total length, headers length, and the CRC32 of the first 8 bytes.
fn check_prelude(prelude: &[u8]) -> Result<(), CorruptFrame> {
    let mut p = prelude;
    let total = p.get_u32();
    let headers = p.get_u32();
    let crc = p.get_u32();
    if crc32fast::hash(&prelude[..8]) != crc {
        return Err(corrupt("prelude checksum mismatch"));
    }
    if !(MIN_FRAME..=MAX_FRAME_BYTES).contains(&total) || headers > total - MIN_FRAME {
        return Err(corrupt(format!("impossible frame length {total}")));
    }
    Ok(())
}

fn header<'m>(m: &'m Message, name: &str) -> Option<&'m str> {
    m.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            HeaderValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

fn frame_of(m: &Message) -> Result<Frame, CorruptFrame> {
    let payload = || {
        std::str::from_utf8(m.payload())
            .map(str::to_string)
            .map_err(|_| corrupt("payload is not UTF-8"))
    };
    let typed = |h: &str| {
        header(m, h)
            .map(str::to_string)
            .ok_or_else(|| corrupt(format!("no {h} header")))
    };
    match header(m, ":message-type") {
        Some("event") => Ok(Frame {
            name: typed(":event-type")?,
            kind: FrameKind::Event,
            data: payload()?,
        }),
        Some("exception") => Ok(Frame {
            name: typed(":exception-type")?,
            kind: FrameKind::Exception,
            data: payload()?,
        }),
        Some("error") => Ok(Frame {
            name: typed(":error-code")?,
            kind: FrameKind::Error,
            data: header(m, ":error-message").unwrap_or_default().to_string(),
        }),
        Some(other) => Err(corrupt(format!("unknown :message-type {other}"))),
        None => Err(corrupt("no :message-type header")),
    }
}

/// The message a stream of frames ends with when it cannot go on (the client gets it in
/// the gateway's `upstream_error` event).
pub const CORRUPT: &str =
    "The upstream sent an event-stream frame that failed its checks; the stream was ended by the gateway.";
pub const TOO_LARGE: &str =
    "The upstream sent an event larger than the gateway accepts; the stream was ended by the gateway.";
pub const BROKE: &str = "The upstream stream broke off.";

/// An HTTP body's frames as (type, payload) pairs, the way the stream pump reads SSE
/// events: an exception frame keeps its `…Exception` type (the format's reader turns it
/// into an error event), an error frame becomes an `internalServerException` carrying its
/// code and message. The stream ends with `Err(message)` on a corrupt frame, a frame over
/// `max_bytes`, a body that ends inside a frame, or a transport error.
pub fn events<S, E>(
    body: S,
    max_bytes: usize,
) -> impl futures_util::Stream<Item = Result<(String, String), &'static str>> + Send + 'static
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: Send + 'static,
{
    async_stream::stream! {
        use futures_util::StreamExt;
        let mut body = body;
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        loop {
            let Some(chunk) = body.next().await else {
                if decoder.finish().is_err() {
                    yield Err(BROKE);
                }
                return;
            };
            let Ok(chunk) = chunk else {
                yield Err(BROKE);
                return;
            };
            let pushed = decoder.push(&chunk, &mut frames);
            for f in frames.drain(..) {
                if f.data.len() > max_bytes {
                    yield Err(TOO_LARGE);
                    return;
                }
                yield Ok(match f.kind {
                    FrameKind::Error => (
                        "internalServerException".to_string(),
                        serde_json::json!({ "message": f.data, "code": f.name }).to_string(),
                    ),
                    _ => (f.name, f.data),
                });
            }
            if pushed.is_err() {
                yield Err(CORRUPT);
                return;
            }
            if decoder.buf.len() > max_bytes.saturating_add(PRELUDE) {
                yield Err(TOO_LARGE);
                return;
            }
        }
    }
}

/// Encodes one frame as Bedrock sends it (the mock's side, and tests').
pub fn encode(kind: FrameKind, name: &str, data: &str) -> Vec<u8> {
    use aws_smithy_types::event_stream::Header;
    let s = |v: &str| HeaderValue::String(v.to_string().into());
    let headers = match kind {
        FrameKind::Event => vec![
            Header::new(":message-type", s("event")),
            Header::new(":event-type", s(name)),
            Header::new(":content-type", s("application/json")),
        ],
        FrameKind::Exception => vec![
            Header::new(":message-type", s("exception")),
            Header::new(":exception-type", s(name)),
            Header::new(":content-type", s("application/json")),
        ],
        FrameKind::Error => vec![
            Header::new(":message-type", s("error")),
            Header::new(":error-code", s(name)),
            Header::new(":error-message", s(data)),
        ],
    };
    let payload = if kind == FrameKind::Error { "" } else { data };
    let message = Message::new_from_parts(headers, payload.as_bytes().to_vec());
    let mut out = Vec::new();
    // Writing to a Vec cannot fail; the only errors are over-long header names or values,
    // which the fixed names above and a data string under 32 KiB for errors never are.
    let _ = aws_smithy_eventstream::frame::write_message_to(&message, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], step: usize) -> Result<Vec<Frame>, CorruptFrame> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for chunk in bytes.chunks(step) {
            d.push(chunk, &mut out)?;
        }
        d.finish()?;
        Ok(out)
    }

    fn two_frames() -> Vec<u8> {
        let mut b = encode(FrameKind::Event, "messageStart", r#"{"role":"assistant"}"#);
        b.extend(encode(
            FrameKind::Exception,
            "throttlingException",
            r#"{"message":"slow down"}"#,
        ));
        b
    }

    #[test]
    fn frames_split_anywhere_decode_alike() {
        let bytes = two_frames();
        let whole = decode_all(&bytes, bytes.len()).unwrap();
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].name, "messageStart");
        assert_eq!(whole[0].kind, FrameKind::Event);
        assert_eq!(whole[0].data, r#"{"role":"assistant"}"#);
        assert_eq!(whole[1].kind, FrameKind::Exception);
        assert_eq!(whole[1].name, "throttlingException");
        for step in [1, 3, 11, 12, 13, 50] {
            assert_eq!(decode_all(&bytes, step).unwrap(), whole, "step {step}");
        }
    }

    #[test]
    fn a_flipped_payload_byte_fails_the_message_crc() {
        let mut bytes = two_frames();
        let last = bytes.len() - 6;
        bytes[last] ^= 0x20;
        assert!(decode_all(&bytes, 7).is_err());
    }

    #[test]
    fn a_corrupt_length_is_refused_at_once_not_waited_for() {
        let mut bytes = encode(FrameKind::Event, "messageStart", "{}");
        bytes[1] = 0x7f; // total length now ~2 GB, prelude CRC now wrong
        let mut d = Decoder::new();
        assert!(d.push(&bytes, &mut Vec::new()).is_err());
    }

    #[test]
    fn a_huge_length_with_a_valid_prelude_crc_is_refused() {
        let total: u32 = 1 << 30;
        let mut prelude = Vec::new();
        prelude.extend(total.to_be_bytes());
        prelude.extend(0u32.to_be_bytes());
        let crc = crc32fast::hash(&prelude);
        prelude.extend(crc.to_be_bytes());
        let err = Decoder::new().push(&prelude, &mut Vec::new()).unwrap_err();
        assert!(err.what.contains("impossible frame length"), "{err}");
    }

    #[test]
    fn a_truncated_stream_is_corrupt() {
        let bytes = two_frames();
        assert!(decode_all(&bytes[..bytes.len() - 3], 5).is_err());
        let mut d = Decoder::new();
        d.push(&bytes[..5], &mut Vec::new()).unwrap();
        assert!(d.finish().is_err());
    }

    fn run(bytes: Vec<u8>, max: usize) -> Vec<Result<(String, String), &'static str>> {
        let chunks: Vec<Result<bytes::Bytes, ()>> = bytes
            .chunks(5)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let s = events(futures_util::stream::iter(chunks), max);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(futures_util::StreamExt::collect::<Vec<_>>(Box::pin(s)))
    }

    #[test]
    fn the_pump_gets_pairs_then_one_error_that_ends_the_stream() {
        let mut bytes = two_frames();
        bytes.extend(encode(FrameKind::Error, "InternalFailure", "boom"));
        let got = run(bytes.clone(), 1 << 20);
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            Ok(("messageStart".into(), r#"{"role":"assistant"}"#.into()))
        );
        assert_eq!(got[1].as_ref().unwrap().0, "throttlingException");
        assert_eq!(got[2].as_ref().unwrap().0, "internalServerException");
        assert!(got[2].as_ref().unwrap().1.contains("InternalFailure"));

        let n = bytes.len();
        bytes[n - 1] ^= 1;
        let got = run(bytes.clone(), 1 << 20);
        assert_eq!(got.last(), Some(&Err(CORRUPT)));
        assert_eq!(
            run(bytes[..n - 2].to_vec(), 1 << 20).last(),
            Some(&Err(BROKE))
        );
        assert_eq!(run(two_frames(), 4).last(), Some(&Err(TOO_LARGE)));
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x9e37_79b9_u32;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let _ = decode_all(&bytes, 1 + len % 17);
        }
    }
}

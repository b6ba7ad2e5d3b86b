//! A cap on the size of one SSE event, ahead of the parser. `eventsource-stream` keeps the
//! bytes of an unfinished line and the data of an unfinished event in memory until the
//! line or the event ends; an upstream that sends a line without a newline, or data lines
//! without the blank line that closes the event, would grow them without bound. This
//! adapter counts the bytes since the last event boundary (an empty line, whatever the
//! line ending: `\n`, `\r\n` or `\r`) and fails the body once they pass the cap, so the
//! parser never holds more than the cap plus one chunk.
//!
//! It also checks that the body is UTF-8 as it passes. The parser's decoder keeps an
//! invalid byte, and every byte after it, in its buffer for ever (it waits for the rest of
//! a character that never comes): an upstream that sent one would have the gateway read on,
//! decode nothing and re-validate the whole growing buffer at every chunk until the idle
//! timeout. A byte that cannot be UTF-8 fails the body at once (`BodyError::NotUtf8`: a
//! corrupt event); a character cut between chunks is carried over (at most 3 bytes).
//!
//! And it hands the parser `\n` line endings only: a `\r\n` or a lone `\r` becomes `\n`.
//! The parser, at a buffer ending in `\r`, waits for the next byte (a `\n` may follow), and
//! at the body's end drops the event it was building: from an upstream ending its lines
//! with `\r` alone, every event reached the client one event late, and the last one never
//! (s30 streams attack, low note).
//!
//! And it hands the parser whole lines only: the bytes after a chunk's last line ending are
//! held until the next line ending comes (within the cap, as they count toward it). The
//! parser re-parses an unfinished line from its start at every chunk it gets, so a long
//! line fed to it in small pieces would cost the square of its length (a 16 MiB line in
//! 1 KiB pieces kept a worker busy for over a minute). And it hands them in small pieces
//! (`PIECE` bytes of whole lines, or one longer line): the parser copies the rest of its
//! buffer at every line it takes, so a frame of many short lines (a flood of blank lines)
//! would cost the square of the frame — seconds of a worker, and of every connection on it,
//! per frame.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::Stream;

/// The most handed to the parser at once, unless one line is longer.
const PIECE: usize = 512;

/// Why the upstream's body ended in error.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the upstream body broke off: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("an upstream event is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the upstream sent bytes that are not UTF-8")]
    NotUtf8,
}

/// The upstream's body, failing with `BodyError::TooLarge` once one event passes `limit`.
pub struct EventCap<S> {
    inner: S,
    limit: usize,
    /// Bytes since the last event boundary.
    event: usize,
    /// Bytes of the current line, line endings excluded.
    line: usize,
    /// The previous byte was `\r` (a `\n` right after it ends no second line).
    after_cr: bool,
    /// The last chunk handed on ended in a `\r` (written as `\n`): a `\n` starting the
    /// next one is that line ending's second byte, dropped.
    cr_at_end: bool,
    /// The start of a character the last chunk cut off (at most 3 bytes).
    carry: Vec<u8>,
    /// Bytes after the last line ending handed on, held until the line ends.
    line_bytes: BytesMut,
    /// Whole lines not yet handed on.
    lines: Bytes,
    /// The body failed or ended: nothing more is read.
    ended: bool,
    /// Chunks of the body received so far: what the pump's idle clock hears of an upstream
    /// that sends only comment lines (keep-alives the parser drops, `heard`).
    heard: Arc<AtomicU64>,
}

impl<S> EventCap<S> {
    pub fn new(inner: S, limit: usize) -> Self {
        Self {
            inner,
            limit,
            event: 0,
            line: 0,
            after_cr: false,
            cr_at_end: false,
            carry: Vec::new(),
            line_bytes: BytesMut::new(),
            lines: Bytes::new(),
            ended: false,
            heard: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A count of the chunks received, which goes up as they come (also those the parser
    /// turns into no event: comment lines, an event's first lines).
    pub fn heard(&self) -> Arc<AtomicU64> {
        self.heard.clone()
    }

    /// Checks that the body up to this chunk is UTF-8; false at a byte that cannot be
    /// (a character cut at the chunk's end is carried to the next one).
    fn utf8(&mut self, chunk: &[u8]) -> bool {
        let mut rest = chunk;
        if !self.carry.is_empty() {
            // Complete the carried character from the chunk's first bytes.
            let take = rest.len().min(4 - self.carry.len());
            let mut joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(&rest[..take]);
            match std::str::from_utf8(&joined) {
                Ok(_) => rest = &rest[take..],
                Err(e) if e.error_len().is_some() && e.valid_up_to() == 0 => return false,
                Err(e) if e.valid_up_to() == 0 => {
                    // Still cut short: the chunk was too small to finish it.
                    self.carry = joined;
                    return true;
                }
                Err(e) => {
                    // The carried character ended within the chunk's first bytes.
                    rest = &rest[e.valid_up_to() - (joined.len() - take)..];
                }
            }
        }
        match std::str::from_utf8(rest) {
            Ok(_) => true,
            Err(e) if e.error_len().is_some() => false,
            Err(e) => {
                self.carry = rest[e.valid_up_to()..].to_vec();
                true
            }
        }
    }

    /// The chunk with its line endings written `\n` (unchanged, not copied, when it has no
    /// `\r` and does not finish a `\r\n` the last one began).
    fn newlines(&mut self, chunk: Bytes) -> Bytes {
        let Some(&last) = chunk.last() else {
            return chunk;
        };
        let finishes = self.cr_at_end && chunk[0] == b'\n';
        self.cr_at_end = last == b'\r';
        if !finishes && !chunk.contains(&b'\r') {
            return chunk;
        }
        let mut out = BytesMut::with_capacity(chunk.len());
        // The `\n` finishing the last chunk's `\r` is dropped by the rule below.
        let mut after_cr = finishes;
        for &b in chunk.iter() {
            match b {
                b'\n' if after_cr => {}
                b'\r' => out.extend_from_slice(b"\n"),
                _ => out.extend_from_slice(&[b]),
            }
            after_cr = b == b'\r';
        }
        out.freeze()
    }

    /// Counts one chunk; false when the event it is part of passed the cap.
    fn count(&mut self, chunk: &[u8]) -> bool {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    if self.line == 0 {
                        // An empty line: the event ended here.
                        self.event = 0;
                        continue;
                    }
                    self.line = 0;
                }
                _ => {
                    self.after_cr = false;
                    self.line += 1;
                }
            }
            self.event += 1;
            if self.event > self.limit {
                return false;
            }
        }
        true
    }
}

impl<S> Stream for EventCap<S>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
{
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if !self.lines.is_empty() {
                let piece = next_piece(&mut self.lines);
                return Poll::Ready(Some(Ok(piece)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            let chunk = match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    self.heard.fetch_add(1, Ordering::Relaxed);
                    chunk
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    self.ended = true;
                    if self.line_bytes.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(self.line_bytes.split().freeze())));
                }
                Poll::Pending => return Poll::Pending,
            };
            if !self.utf8(&chunk) {
                self.ended = true;
                return Poll::Ready(Some(Err(BodyError::NotUtf8)));
            }
            if !self.count(&chunk) {
                self.ended = true;
                return Poll::Ready(Some(Err(BodyError::TooLarge(self.limit))));
            }
            let chunk = self.newlines(chunk);
            let Some(last) = chunk.iter().rposition(|&b| is_eol(b)) else {
                // No line ends in it: held (the cap bounds it) until one does.
                self.line_bytes.extend_from_slice(&chunk);
                continue;
            };
            self.lines = if self.line_bytes.is_empty() {
                let mut chunk = chunk;
                let rest = chunk.split_off(last + 1);
                self.line_bytes.extend_from_slice(&rest);
                chunk
            } else {
                self.line_bytes.extend_from_slice(&chunk[..=last]);
                let whole = self.line_bytes.split().freeze();
                self.line_bytes.extend_from_slice(&chunk[last + 1..]);
                whole
            };
        }
    }
}

fn is_eol(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// The next piece of `lines` (whole lines, ending with a line ending): up to `PIECE` bytes
/// of lines, or the first line alone when it is longer.
fn next_piece(lines: &mut Bytes) -> Bytes {
    if lines.len() <= PIECE {
        return std::mem::take(lines);
    }
    let end = match lines[..PIECE].iter().rposition(|&b| is_eol(b)) {
        Some(i) => i + 1,
        None => {
            PIECE
                + lines[PIECE..]
                    .iter()
                    .position(|&b| is_eol(b))
                    .map_or(lines.len() - PIECE, |i| i + 1)
        }
    };
    lines.split_to(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped(limit: usize, chunks: &[&str]) -> Result<(), usize> {
        let mut cap = EventCap::new(
            futures_util::stream::empty::<Result<Bytes, reqwest::Error>>(),
            limit,
        );
        for (i, c) in chunks.iter().enumerate() {
            if !cap.count(c.as_bytes()) {
                return Err(i);
            }
        }
        Ok(())
    }

    #[test]
    fn events_under_the_cap_pass_whatever_their_line_endings() {
        let event = "data: 0123456789\n\n";
        assert_eq!(capped(20, &[event; 1000]), Ok(()));
        assert_eq!(capped(20, &["data: 0123456789\r\n\r\n"; 1000]), Ok(()));
        assert_eq!(capped(20, &["data: 0123456789\r\r"; 1000]), Ok(()));
        // Boundaries split across chunks.
        assert_eq!(
            capped(20, &["data: 0123456789\r", "\n", "\r", "\n"].repeat(500)),
            Ok(())
        );
        assert_eq!(
            capped(20, &["event: a\ndata: 01\n", "\n"].repeat(500)),
            Ok(())
        );
    }

    /// Feeds `body` cut at every place into two chunks, and into one-byte chunks.
    fn utf8_whatever_the_cuts(body: &[u8]) -> bool {
        let one = |chunks: &[&[u8]]| {
            let mut cap = EventCap::new(
                futures_util::stream::empty::<Result<Bytes, reqwest::Error>>(),
                usize::MAX,
            );
            chunks.iter().all(|c| cap.utf8(c))
        };
        let whole = one(&[body]);
        for at in 0..=body.len() {
            assert_eq!(one(&[&body[..at], &body[at..]]), whole, "cut at {at}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(one(&bytes), whole, "one byte at a time");
        whole
    }

    #[test]
    fn utf8_cut_anywhere_passes_and_a_byte_that_cannot_be_fails() {
        assert!(utf8_whatever_the_cuts(
            "data: {\"t\": \"é€😀ok\"}\n\n".as_bytes()
        ));
        assert!(utf8_whatever_the_cuts("😀😀€é".as_bytes()));
        assert!(!utf8_whatever_the_cuts(b"data: \xff\n\n"));
        // A character cut short by another one's start.
        assert!(!utf8_whatever_the_cuts(b"data: \xe2\x82a\n\n"));
        assert!(!utf8_whatever_the_cuts(
            "é".as_bytes()
                .iter()
                .chain(b"\x80")
                .copied()
                .collect::<Vec<_>>()
                .as_slice()
        ));
        // An overlong encoding and a surrogate are not UTF-8.
        assert!(!utf8_whatever_the_cuts(b"\xc0\xaf"));
        assert!(!utf8_whatever_the_cuts(b"\xed\xa0\x80"));
    }

    /// The parser gets whole lines only, the bytes unchanged but for the line endings, the
    /// last piece at the end.
    #[tokio::test]
    async fn pieces_are_handed_on_as_whole_lines() {
        use futures_util::StreamExt;
        // `\r\n\n`: a CRLF line ending, then an LF blank line, split anywhere (an `\n`
        // after the one that finished a split CRLF was dropped, merging two events: s30
        // diff attack F6).
        let body =
            "data: {\"a\": \"é😀\"}\r\n\r\nevent: x\rdata: yy\r\r: c\n\ndata: 1\r\n\ndata: tail";
        for size in [1, 2, 3, 5, 7, 64] {
            let pieces: Vec<Result<Bytes, reqwest::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let out: Vec<Bytes> = EventCap::new(futures_util::stream::iter(pieces), 1 << 20)
                .map(|c| c.unwrap())
                .collect()
                .await;
            let (last, lines) = out.split_last().unwrap();
            for c in lines {
                assert!(matches!(c.last(), Some(b'\n' | b'\r')), "{c:?} at {size}");
                assert!(c.len() <= PIECE, "{} bytes at {size}", c.len());
            }
            assert_eq!(&last[..], b"data: tail", "at {size}");
            let lf = body.replace("\r\n", "\n").replace('\r', "\n");
            assert_eq!(out.concat(), lf.as_bytes(), "at {size}");
        }
    }

    /// An upstream ending its lines with `\r` alone: each event is dispatched at its blank
    /// line, with no byte after it, and a `\r\n` split between chunks is one line ending.
    #[tokio::test]
    async fn a_cr_only_stream_dispatches_each_event_at_its_blank_line() {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        let body = "event: a\rdata: 1\r\revent: b\r\ndata: 2\r\r";
        for size in [1, 2, 3, 64] {
            let pieces: Vec<Result<Bytes, reqwest::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            // The body stays open after its last byte, as an upstream's may.
            let open = futures_util::stream::iter(pieces).chain(futures_util::stream::pending());
            let events = EventCap::new(open, 1 << 20)
                .eventsource()
                .map(|e| e.map(|e| (e.event, e.data)).unwrap())
                .take(2)
                .collect::<Vec<_>>();
            let events = tokio::time::timeout(std::time::Duration::from_secs(1), events)
                .await
                .unwrap_or_else(|_| panic!("an event held back at {size}"));
            let want = [("a", "1"), ("b", "2")].map(|(e, d)| (e.to_string(), d.to_string()));
            assert_eq!(events, want, "at {size}");
        }
    }

    #[test]
    fn pieces_are_small_unless_one_line_is_longer() {
        let long = format!("data: {}\n", "x".repeat(3 * PIECE));
        let mut lines = Bytes::from(format!("a\n{long}{}", "\n".repeat(3 * PIECE)));
        let mut got = Vec::new();
        while !lines.is_empty() {
            got.push(next_piece(&mut lines));
        }
        assert_eq!(&got[0][..], b"a\n");
        assert_eq!(&got[1][..], long.as_bytes(), "a longer line whole");
        assert!(
            got[2..].iter().all(|p| p.len() == PIECE),
            "then PIECE-sized pieces"
        );
        assert_eq!(got[2..].concat().len(), 3 * PIECE);
    }

    #[test]
    fn a_line_without_end_or_an_event_that_never_closes_passes_the_cap() {
        assert_eq!(
            capped(100, &["data: ", &"x".repeat(60), &"x".repeat(60)]),
            Err(2)
        );
        // Many short lines, never the empty line that ends the event.
        assert_eq!(capped(100, &["data: x\n"; 20]), Err(12));
        // A lone `\r\n` after a `\r` line ending is not an empty line.
        assert_eq!(capped(100, &["data: x\r\n"; 20]), Err(11));
    }
}

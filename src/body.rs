//! Reading a request body whole, within a size and a time. Every surface that reads one —
//! the client API (`pipeline::read_body`) and the admin's (the sign-in form, the CSRF
//! field, `admin::input::Input`) — reads it so: unbounded in time, a client that declared
//! a long body and stopped sending held its connection and buffer for ever (s30 streams
//! attack F2 on `/v1`; s32 edge attack F1 on the admin, the sign-in form open to anyone).
//!
//! A compressed body (the admin's `gzip`, `deflate`) is inflated here, into a buffer that
//! never grows past the limit: actix's `Decompress` inflated each chunk whole before any
//! limit saw it, 64 KiB on the wire becoming 64 MiB in memory (s33 gzip).

use std::io::{self, Write};
use std::time::Duration;

use actix_web::error::PayloadError;
use actix_web::http::header::HeaderMap;
use actix_web::web::Bytes;
use flate2::write::{GzDecoder, ZlibDecoder};
use futures_util::{Stream, StreamExt};

/// The most of a declared `Content-Length` reserved before its bytes arrive: a typical
/// body in one allocation, while a client declaring the limit and sending nothing holds no
/// more than this.
const PREALLOC: usize = 64 * 1024;

/// Why a body was not read.
#[derive(Debug)]
pub enum BodyError {
    /// Past the limit (declared or sent), in bytes.
    TooLarge(usize),
    /// The connection broke or the body was malformed.
    Unreadable,
    /// Not whole within this time.
    TooSlow(Duration),
}

impl BodyError {
    /// What a client is told when its body did not arrive in time.
    pub fn too_slow_message(within: Duration) -> String {
        format!(
            "The request body did not arrive in time (the gateway waits {} s for the whole body).",
            within.as_secs()
        )
    }
}

/// A body's content coding, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Identity,
    /// RFC 1952, one member (as actix read it).
    Gzip,
    /// RFC 9110 §8.4.1.2: zlib-wrapped deflate (RFC 1950), as actix read it.
    Deflate,
}

impl Coding {
    /// The coding `headers` declare — none or `identity`, `gzip` (`x-gzip`), `deflate` — or,
    /// for any other, what the client is told: such a body is named, never read as the
    /// JSON it is not (s32 diff2 attack F3). Two lines are two codings (`gzip, gzip`: a
    /// body compressed twice), named as such (s33 late attack F4).
    pub fn of(headers: &HeaderMap) -> Result<Coding, String> {
        match declared(headers).as_deref() {
            None | Some("identity") => Ok(Coding::Identity),
            Some("gzip" | "x-gzip") => Ok(Coding::Gzip),
            Some("deflate") => Ok(Coding::Deflate),
            Some(other) => Err(format!(
                "content-encoding `{other}` is not read: send the body as gzip or uncompressed"
            )),
        }
    }
}

/// The `content-encoding` `headers` declare, lowercased, its lines joined as one list.
pub fn declared(headers: &HeaderMap) -> Option<String> {
    let lines: Vec<String> = headers
        .get_all(actix_web::http::header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or_default().trim().to_ascii_lowercase())
        .collect();
    (!lines.is_empty()).then(|| lines.join(", "))
}

/// Reads `payload` whole, decoded from `coding`: at most `limit` bytes on the wire (a
/// larger declared `Content-Length` is refused before any byte is read) and at most
/// `limit` decoded, the decoded buffer never past `limit` (a chunk is
/// inflated into it, not beside it), all of it within `within`. A cut or corrupt body is
/// `Unreadable`.
pub async fn read_decoded<S>(
    mut payload: S,
    headers: &HeaderMap,
    coding: Coding,
    limit: usize,
    within: Duration,
) -> Result<Bytes, BodyError>
where
    S: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|l| l > limit) {
        return Err(BodyError::TooLarge(limit));
    }
    // A compressed body's declared length says nothing of its decoded one.
    let reserve = match coding {
        Coding::Identity => declared.unwrap_or(1024),
        Coding::Gzip | Coding::Deflate => 1024,
    };
    let mut body = Decoder::new(coding, Bounded::new(reserve.min(PREALLOC), limit));
    let read = async {
        // The wire's bytes are counted too: a compressed body is not kept, but a chunked
        // one of no declared length is held to what a declared one is.
        let mut wire = 0usize;
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| match e {
                PayloadError::Overflow => BodyError::TooLarge(limit),
                _ => BodyError::Unreadable,
            })?;
            wire += chunk.len();
            if wire > limit {
                return Err(BodyError::TooLarge(limit));
            }
            body.feed(&chunk)?;
        }
        body.finish()
    };
    match tokio::time::timeout(within, read).await {
        Ok(read) => read,
        Err(_) => Err(BodyError::TooSlow(within)),
    }
}

/// A body as it is read: the bytes as sent, or an inflater writing into a `Bounded`.
/// Inflating in place costs at most a chunk's input and `limit` of output per chunk, so it
/// runs on the worker (actix's ran a large chunk on the blocking pool, its output unbounded).
enum Decoder {
    Identity(Bounded),
    Gzip(GzDecoder<Bounded>),
    Deflate(ZlibDecoder<Bounded>),
}

impl Decoder {
    fn new(coding: Coding, sink: Bounded) -> Self {
        match coding {
            Coding::Identity => Decoder::Identity(sink),
            Coding::Gzip => Decoder::Gzip(GzDecoder::new(sink)),
            Coding::Deflate => Decoder::Deflate(ZlibDecoder::new(sink)),
        }
    }

    fn sink(&self) -> &Bounded {
        match self {
            Decoder::Identity(sink) => sink,
            Decoder::Gzip(d) => d.get_ref(),
            Decoder::Deflate(d) => d.get_ref(),
        }
    }

    /// Takes one chunk as sent.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), BodyError> {
        let fed = match self {
            Decoder::Identity(sink) => sink.write_all(chunk),
            Decoder::Gzip(d) => d.write_all(chunk),
            Decoder::Deflate(d) => d.write_all(chunk),
        };
        fed.map_err(|_| self.refusal())
    }

    /// The body whole: a compressed one must have reached its end (and, gzip, its
    /// checksum and length); its last output is held to the limit as any other.
    fn finish(mut self) -> Result<Bytes, BodyError> {
        let done = match &mut self {
            Decoder::Identity(_) => Ok(()),
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Deflate(d) => d.try_finish(),
        };
        done.map_err(|_| self.refusal())?;
        let buf = match &mut self {
            Decoder::Identity(sink) => &mut sink.buf,
            Decoder::Gzip(d) => &mut d.get_mut().buf,
            Decoder::Deflate(d) => &mut d.get_mut().buf,
        };
        Ok(Bytes::from(std::mem::take(buf)))
    }

    /// Why a write failed: the sink refusing to pass the limit, or the input itself.
    fn refusal(&self) -> BodyError {
        let sink = self.sink();
        if sink.over {
            BodyError::TooLarge(sink.limit)
        } else {
            BodyError::Unreadable
        }
    }
}

/// A buffer that refuses to hold more than `limit` bytes, its capacity never past it.
struct Bounded {
    buf: Vec<u8>,
    limit: usize,
    /// A write was refused for passing the limit.
    over: bool,
}

impl Bounded {
    fn new(reserve: usize, limit: usize) -> Self {
        Bounded {
            buf: Vec::with_capacity(reserve.min(limit)),
            limit,
            over: false,
        }
    }
}

impl Write for Bounded {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let len = self.buf.len();
        if self.over || data.len() > self.limit - len {
            self.over = true;
            return Err(io::Error::other("past the body's limit"));
        }
        if data.len() > self.buf.capacity() - len {
            // Doubling, as `Vec` would, but never past the limit.
            let want = (len + data.len())
                .max(self.buf.capacity() * 2)
                .min(self.limit);
            self.buf.reserve_exact(want - len);
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    /// `wire` read as one chunk.
    async fn read_one(coding: Coding, wire: Vec<u8>, limit: usize) -> Result<Bytes, BodyError> {
        let chunks = futures_util::stream::iter([Ok::<_, PayloadError>(Bytes::from(wire))]);
        read_decoded(
            chunks,
            &HeaderMap::new(),
            coding,
            limit,
            Duration::from_secs(5),
        )
        .await
    }

    /// 100 MiB of zeros, about 100 KiB as gzip, against a 1 MiB limit: refused once the
    /// decoded bytes would pass the limit, the buffer's capacity never past it. actix's
    /// `Decompress` yielded the whole chunk inflated — 100 MiB — before the limit saw it.
    #[test]
    fn a_chunk_that_inflates_past_the_limit_never_grows_the_buffer_past_it() {
        let limit = 1 << 20;
        let bomb = gzip(&vec![0u8; 100 << 20]);
        assert!(bomb.len() < 128 * 1024, "{}", bomb.len());
        let mut body = Decoder::new(Coding::Gzip, Bounded::new(1024, limit));
        let fed = body.feed(&bomb);
        assert!(
            matches!(fed, Err(BodyError::TooLarge(l)) if l == limit),
            "{fed:?}"
        );
        let sink = body.sink();
        assert!(sink.buf.len() <= limit, "{}", sink.buf.len());
        assert!(sink.buf.capacity() <= limit, "{}", sink.buf.capacity());
        assert!(
            sink.buf.len() > limit - 64 * 1024,
            "filled to the limit first"
        );
    }

    /// A body split into chunks of 7 bytes reads as the whole: the decoder keeps its state
    /// from one chunk to the next.
    #[tokio::test]
    async fn a_gzip_body_in_many_small_chunks_is_read_whole() {
        let text: Vec<u8> = (0..50_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let wire = gzip(&text);
        let chunks: Vec<Result<Bytes, PayloadError>> = wire
            .chunks(7)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = read_decoded(
            futures_util::stream::iter(chunks),
            &HeaderMap::new(),
            Coding::Gzip,
            256 * 1024,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(body.as_ref(), text.as_slice());
    }

    /// Exactly the limit is read; a byte more is not, decoded or sent.
    #[tokio::test]
    async fn the_limit_holds_for_decoded_and_sent_bytes_alike() {
        let read = |coding, wire| read_one(coding, wire, 1000);
        let at = read(Coding::Gzip, gzip(&[b'a'; 1000])).await.unwrap();
        assert_eq!(at.len(), 1000);
        let past = read(Coding::Gzip, gzip(&[b'a'; 1001])).await;
        assert!(matches!(past, Err(BodyError::TooLarge(1000))), "{past:?}");
        assert_eq!(
            read(Coding::Identity, vec![1; 1000]).await.unwrap().len(),
            1000
        );
        let past = read(Coding::Identity, vec![1; 1001]).await;
        assert!(matches!(past, Err(BodyError::TooLarge(1000))), "{past:?}");
    }

    /// A zlib `deflate` body is read; a cut or corrupt compressed body is unreadable, not
    /// the bytes it had so far.
    #[tokio::test]
    async fn deflate_is_zlib_and_a_cut_or_corrupt_body_is_unreadable() {
        let read = |coding, wire| read_one(coding, wire, 1 << 20);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(b"{\"a\": 1}").unwrap();
        let zlib = z.finish().unwrap();
        assert_eq!(
            read(Coding::Deflate, zlib.clone()).await.unwrap().as_ref(),
            b"{\"a\": 1}"
        );
        let text = vec![b'x'; 10_000];
        let whole = gzip(&text);
        let mut corrupt = whole.clone();
        let crc = corrupt.len() - 8;
        corrupt[crc] ^= 0xff;
        for (what, coding, wire) in [
            ("cut gzip", Coding::Gzip, whole[..whole.len() - 4].to_vec()),
            ("corrupt gzip", Coding::Gzip, corrupt),
            ("cut zlib", Coding::Deflate, zlib[..zlib.len() - 6].to_vec()),
            ("not gzip", Coding::Gzip, b"{\"a\": 1}".to_vec()),
            (
                "gzip after the end",
                Coding::Gzip,
                [whole.clone(), whole].concat(),
            ),
        ] {
            let got = read(coding, wire).await;
            assert!(matches!(got, Err(BodyError::Unreadable)), "{what}: {got:?}");
        }
    }
}

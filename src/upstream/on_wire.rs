//! When a request reaches its upstream. hyper reads a request's body only once its head
//! has a connection to go out on — made (the name resolved, TCP and TLS done) or taken
//! from the pool — so the body's first read is the moment the upstream may start working
//! on it, and may bill it. A request dropped or cut off before that (its client left, its
//! deadline ran out while a connection or a credential was being made) was read by no
//! upstream and costs nothing (`pipeline::attempts`'s departure). reqwest has no hook
//! between the connection and the send; the body is the one thing of the request hyper
//! touches only then.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};

/// Whether a request's body was read, and who waits to hear it.
#[derive(Default)]
pub struct Wire {
    read: AtomicBool,
    waiting: AtomicWaker,
}

/// `req` with its body (`body`, the same bytes: a credential hook signs them and changes
/// none) read through `wire`.
pub fn watched(mut req: reqwest::Request, body: Bytes, wire: &Arc<Wire>) -> reqwest::Request {
    // hyper reads no empty body: such a request is out with its head.
    if body.is_empty() {
        wire.read.store(true, Ordering::Release);
    }
    *req.body_mut() = Some(reqwest::Body::wrap(Watched {
        body: Some(body),
        wire: wire.clone(),
    }));
    req
}

impl Wire {
    /// The request read is not out after all (an answer said it billed nothing): the next
    /// one's read is the one that counts.
    pub fn unread(&self) {
        self.read.store(false, Ordering::Release);
        self.waiting.wake();
    }
}

/// Runs `send`, whose requests' bodies are `watched` through `wire`, telling `reached`
/// each time the wire changes: true as soon as a body is first read — woken by the read,
/// not at the answer — and false again when `send` takes it back (`Wire::unread`). A
/// read not told yet when the call is dropped (its client left, or a deadline cut it, in
/// the turn of the read) is told as it is dropped.
pub async fn watch<F: Future>(send: F, wire: &Wire, reached: impl FnMut(bool)) -> F::Output {
    // Declared before `send`, so dropped after it.
    let mut told = Told {
        wire,
        told: false,
        reached,
    };
    let mut send = pin!(send);
    poll_fn(|cx| {
        wire.waiting.register(cx.waker());
        let out = send.as_mut().poll(cx);
        told.tell();
        out
    })
    .await
}

/// What `reached` was last told of a wire.
struct Told<'w, R: FnMut(bool)> {
    wire: &'w Wire,
    told: bool,
    reached: R,
}

impl<R: FnMut(bool)> Told<'_, R> {
    fn tell(&mut self) {
        let read = self.wire.read.load(Ordering::Acquire);
        if read != self.told {
            self.told = read;
            (self.reached)(read);
        }
    }
}

impl<R: FnMut(bool)> Drop for Told<'_, R> {
    fn drop(&mut self) {
        self.tell();
    }
}

/// A request body of known bytes that marks its `Wire` read at its first read.
struct Watched {
    body: Option<Bytes>,
    wire: Arc<Wire>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.wire.read.swap(true, Ordering::AcqRel) {
            this.wire.waiting.wake();
        }
        Poll::Ready(this.body.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Bytes::is_empty)
    }

    /// Exact, so hyper sends a `Content-Length`, as for the bytes it replaces.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.body.as_ref().map_or(0, |b| b.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding (s18, B2): a call dropped in the turn its body was read — before its
    /// next poll — never told the read, and a client that left then paid nothing for a
    /// request the upstream had.
    #[test]
    fn a_read_not_told_when_the_call_is_dropped_is_told_as_it_is_dropped() {
        let wire = Wire::default();
        let mut told = Vec::new();
        let mut call = Box::pin(watch(std::future::pending::<()>(), &wire, |on| {
            told.push(on)
        }));
        assert!(futures_util::FutureExt::now_or_never(call.as_mut()).is_none());
        // hyper reads the body on its connection's task.
        wire.read.store(true, Ordering::Release);
        drop(call);
        assert_eq!(told, [true]);
    }
}

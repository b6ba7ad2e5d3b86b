//! When a request reaches its upstream. hyper reads a request's body only once its head
//! has a connection to go out on — made (the name resolved, TCP and TLS done) or taken
//! from the pool — so the body's first read is the moment the upstream may start working
//! on it, and may bill it. A request dropped or cut off before that (its client left, its
//! deadline ran out while a connection or a credential was being made) was read by no
//! upstream and costs nothing (`pipeline::attempts`'s departure). reqwest has no hook
//! between the connection and the send; the body is the one thing of the request hyper
//! touches only then.
//!
//! hyper does not always ask whether a request's caller is still there before it reads
//! the body: its HTTP/2 client keeps a request the server's stream cap holds back ("pending
//! open") and sends it when a stream frees, whoever waits for it by then; and on either
//! version the caller can go on one core between hyper's own check and the read on the
//! other. So the read and the caller's going race for one state (`Wire`): whichever comes
//! first wins. A body read first is told to the caller, also as it goes; a caller gone
//! first leaves a body that ends short: the server gets the head and at most the body's
//! first part, short of its `Content-Length` (malformed), never the whole prompt — nothing
//! an upstream can work on — and hyper, seeing the caller gone, resets the stream
//! (HTTP/2) or closes the connection (HTTP/1, which will not end a body short of its
//! length).
//!
//! The read that counts is the last piece's (`Watched`): on HTTP/2 hyper reads the next
//! piece only once the one before it had flow-control window to go, so a request the
//! server's window holds back is not out. Its last byte may still wait for the window when the
//! call is cut off: that counts as out (it errs towards the upstream's bill).

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};

// A wire's state is one word, so that every change is one compare-and-swap: the state in
// its low two bits, whether a piece of the body went (`STARTED`), and above them the send
// its bodies belong to — each resend's body its own, so a dead send's body, read late,
// changes nothing.
/// Neither read nor given up: the request is on its way to a connection.
const WAITING: u32 = 0;
/// The body was read: the request is out.
const READ: u32 = 1;
/// The caller went before the read: the body is never to be read.
const GONE: u32 = 2;
const STATE: u32 = 0b11;
/// A piece of the body before its last was read: the request has a connection and its
/// upstream is taking it (or not taking it: a shut window, a full socket).
const STARTED: u32 = 0b100;
/// One send, in the bits above.
const SEND: u32 = 0b1000;

fn state(word: u32) -> u32 {
    word & STATE
}

fn send_of(word: u32) -> u32 {
    word & !(STATE | STARTED)
}

/// Whether a request's body was read, or its caller went first, and who waits to hear it.
#[derive(Default)]
pub struct Wire {
    word: AtomicU32,
    waiting: AtomicWaker,
}

/// `req` with its body (`body`, the same bytes: a credential hook signs them and changes
/// none) read through `wire`, as the wire's send of the moment.
pub fn watched(mut req: reqwest::Request, body: Bytes, wire: &Arc<Wire>) -> reqwest::Request {
    let send = send_of(wire.word.load(Ordering::Acquire));
    // hyper reads no empty body: such a request is out with its head.
    if body.is_empty() {
        let _ = wire.change(|w| (w == send | WAITING).then_some(send | READ));
    }
    *req.body_mut() = Some(reqwest::Body::wrap(Watched {
        body,
        wire: wire.clone(),
        send,
    }));
    req
}

impl Wire {
    fn change(&self, f: impl FnMut(u32) -> Option<u32>) -> Result<u32, u32> {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
    }

    /// The request sent is not out after all (an answer said it billed nothing, or it never
    /// went): the next send's read is the one that counts, and nothing of this one's body
    /// counts any more. Called only by the call `watch` runs, so never after its caller
    /// went.
    pub fn unread(&self) {
        // A wire whose caller went stays so.
        let _ = self.change(|w| (state(w) != GONE).then(|| send_of(w).wrapping_add(SEND)));
        self.waiting.wake();
    }

    fn read(&self) -> bool {
        state(self.word.load(Ordering::Acquire)) == READ
    }

    /// Whether the body is still unread: the whole request is not out. Once its call is
    /// dropped, whether the caller went first: the request never went out whole.
    pub fn unsent(&self) -> bool {
        !self.read()
    }

    /// Whether not a piece of the body was read: the request never left the client (hyper
    /// held it, or it is still on its way to a connection).
    pub fn untouched(&self) -> bool {
        let w = self.word.load(Ordering::Acquire);
        state(w) != READ && w & STARTED == 0
    }
}

/// Runs `send`, whose requests' bodies are `watched` through `wire`, telling `reached`
/// each time the wire changes: true as soon as a body is first read — woken by the read,
/// not at the answer — and false again when `send` takes it back (`Wire::unread`). When
/// the call is dropped (its client left, or a deadline cut it), a read that came first is
/// told as it is dropped, and a body not read yet never will be.
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
        let read = self.wire.read();
        if read != self.told {
            self.told = read;
            (self.reached)(read);
        }
    }
}

impl<R: FnMut(bool)> Drop for Told<'_, R> {
    fn drop(&mut self) {
        // The caller goes: a body not read by now is never read; one read first is told.
        let gone = (self.wire).change(|w| (state(w) == WAITING).then_some(w & !STATE | GONE));
        if gone.is_err() {
            self.tell();
        }
    }
}

/// A request body of known bytes that marks its `Wire` read when its last piece is read —
/// or, its caller gone first, ends short of its length.
///
/// It goes in three pieces: all but its last two bytes, then one, then the last (a body
/// of two bytes or fewer, byte by byte). hyper 1.12's HTTP/2 client reads a piece, waits
/// for stream capacity (what the window grants past the data still buffered) before it
/// hands that piece to the stream, and only then reads the next (`PipeToSendStream`): so
/// the last piece's read means the pieces before it had window — all of the body but its
/// last byte can go — and a request the server's window holds back is not out. (The order
/// is hyper's: a version that took window before reading would leave `STARTED` unset on a
/// shut window, and such a request would count as held.) Over HTTP/1 a body within hyper's write buffer (about 400 KiB) goes in
/// one write with its head, as one body did; a larger one's first piece is flushed to the
/// socket before the rest is read.
struct Watched {
    /// What is left of the body.
    body: Bytes,
    wire: Arc<Wire>,
    /// The wire's send this body is for.
    send: u32,
}

impl Watched {
    fn next_piece(&mut self) -> Bytes {
        let left = self.body.len();
        let piece = match left {
            0..=1 => left,
            2 => 1,
            _ => left - 2,
        };
        self.body.split_to(piece)
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::convert::Infallible>>> {
        let this = self.get_mut();
        if this.body.is_empty() {
            return Poll::Ready(None);
        }
        let piece = this.next_piece();
        let (last, send) = (this.body.is_empty(), this.send);
        // Its send's, and neither read nor given up: the last piece reads it, another
        // marks it started.
        let went = this.wire.change(|w| {
            (send_of(w) == send && state(w) == WAITING).then_some(match last {
                true => w & !STATE | READ,
                false => w | STARTED,
            })
        });
        if last && went.is_ok() {
            this.wire.waiting.wake();
        }
        if went.is_err() {
            // Its caller gone, or its send given up for another. Ended short, not failed: the server gets a body short of its `Content-Length`
            // (malformed; a lenient server's JSON without its last byte is no request
            // either: nothing billed), and hyper, seeing the call gone, resets the stream
            // (HTTP/2) or closes the connection (HTTP/1, which ends no body short of its
            // length). An error would have hyper reset the stream at once, which h2 0.4
            // queues behind the stream's head as well (its `is_pending_open` guard): either
            // is safe there; an end is safe whatever the version does.
            this.body = Bytes::new();
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_empty()
    }

    /// Exact, so hyper sends a `Content-Length`, as for the bytes it replaces.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.body.len() as u64)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An HTTP/2 server (no TLS) on a free port: one connection, made by `builder`, each of
    /// its streams given to `serve`. Its address.
    pub(crate) async fn h2_serving(
        builder: h2::server::Builder,
        mut serve: impl FnMut(http::Request<h2::RecvStream>, h2::server::SendResponse<Bytes>)
            + Send
            + 'static,
    ) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut conn = builder.handshake::<_, Bytes>(tcp).await.expect("handshake");
            while let Some(Ok((req, respond))) = conn.accept().await {
                serve(req, respond);
            }
        });
        addr
    }

    /// Answers a stream 200 with `body`.
    pub(crate) fn answer(mut respond: h2::server::SendResponse<Bytes>, body: &'static [u8]) {
        if let Ok(mut send) = respond.send_response(http::Response::new(()), false) {
            let _ = send.send_data(Bytes::from_static(body), true);
        }
    }

    /// A server whose stream window is nothing, never widened: no byte of a body can go.
    /// It answers a GET (a client takes its settings so) and holds every other stream.
    pub(crate) async fn shut_window_server() -> std::net::SocketAddr {
        let mut shut = h2::server::Builder::new();
        shut.initial_window_size(0);
        let mut held = Vec::new();
        h2_serving(shut, move |req, respond| {
            if req.method() == http::Method::GET {
                answer(respond, b"{}");
            } else {
                held.push((req, respond));
            }
        })
        .await
    }
    use http_body::Body;

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
        wire.word.store(READ, Ordering::Release);
        drop(call);
        assert_eq!(told, [true]);
    }

    /// Review finding (s18-final, 3): the caller can go on one core between hyper's check
    /// that it is still there and the body's read on the other. Going first, it leaves a
    /// body that ends empty: the prompt never goes, and nothing is told.
    #[test]
    fn a_body_read_after_its_caller_went_ends_empty_and_tells_nothing() {
        let wire = Arc::new(Wire::default());
        let mut body = Watched {
            body: Bytes::from_static(b"the prompt"),
            wire: wire.clone(),
            send: 0,
        };
        let mut told = Vec::new();
        let mut call = Box::pin(watch(std::future::pending::<()>(), &wire, |on| {
            told.push(on)
        }));
        assert!(futures_util::FutureExt::now_or_never(call.as_mut()).is_none());
        drop(call);
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let read = Pin::new(&mut body).poll_frame(&mut cx);
        assert!(matches!(read, Poll::Ready(None)), "no byte of the prompt");
        assert_eq!(told, [] as [bool; 0]);
    }

    /// An HTTP/2 server with room for `streams` at a time. Its first request is held
    /// (`first_in` says it came) until `free`; of every later one it reports the path and
    /// how many bytes of its body came.
    async fn h2_server(
        streams: u32,
        first_in: tokio::sync::oneshot::Sender<()>,
        free: tokio::sync::oneshot::Receiver<()>,
        got: tokio::sync::mpsc::UnboundedSender<(String, usize)>,
    ) -> std::net::SocketAddr {
        let mut capped = h2::server::Builder::new();
        capped.max_concurrent_streams(streams);
        let (mut first_in, mut free) = (Some(first_in), Some(free));
        h2_serving(capped, move |req, respond| {
            let path = req.uri().path().to_string();
            let mut body = req.into_body();
            let (first_in, free, got) = (first_in.take(), free.take(), got.clone());
            tokio::spawn(async move {
                let mut bytes = 0;
                while let Some(Ok(data)) = body.data().await {
                    bytes += data.len();
                }
                if let (Some(first_in), Some(free)) = (first_in, free) {
                    let _ = first_in.send(());
                    let _ = free.await;
                } else {
                    let _ = got.send((path, bytes));
                }
                answer(respond, b"{}");
            });
        })
        .await
    }

    /// A client with one HTTP/2 connection to `addr`, and its first request there, held by
    /// the server until the returned sender frees it.
    async fn first_request_held(
        streams: u32,
    ) -> (
        reqwest::Client,
        std::net::SocketAddr,
        tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::mpsc::UnboundedReceiver<(String, usize)>,
    ) {
        let (first_in, first_seen) = tokio::sync::oneshot::channel();
        let (free, freed) = tokio::sync::oneshot::channel();
        let (got, seen) = tokio::sync::mpsc::unbounded_channel();
        let addr = h2_server(streams, first_in, freed, got).await;
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .expect("client");
        let first = client.post(format!("http://{addr}/first")).body("first");
        let first = tokio::spawn(first.send());
        first_seen.await.expect("the first request is in");
        (client, addr, first, free, seen)
    }

    /// Review finding (s18-final, 1 and 3): hyper's HTTP/2 client keeps a request that the
    /// server's stream cap holds back and sends it once a stream frees, without asking
    /// whether its caller is still there. A call cut off while held back (its client left,
    /// the first-byte timer, the deadline) was told nothing — it cost nothing and its key's
    /// window was corrected to nothing — and the server then got the whole prompt. Now its
    /// head goes and no byte of its body.
    #[tokio::test]
    async fn a_request_held_back_by_the_servers_stream_cap_and_dropped_meanwhile_never_goes_out() {
        let (client, addr, first, free, mut seen) = first_request_held(1).await;
        let wire = Arc::new(Wire::default());
        let req = client
            .post(format!("http://{addr}/second"))
            .build()
            .expect("request");
        let req = watched(req, Bytes::from_static(b"the prompt"), &wire);
        let mut told = Vec::new();
        let call = watch(client.execute(req), &wire, |on| told.push(on));
        let cut = tokio::time::timeout(std::time::Duration::from_millis(300), call).await;
        assert!(cut.is_err(), "held back behind the first stream");
        assert_eq!(told, [] as [bool; 0], "nothing was read while held back");

        free.send(()).expect("free the stream");
        first.await.expect("task").expect("the first answer");
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), seen.recv()).await;
        assert_eq!(
            second.expect("the held-back head reaches the server once a stream frees"),
            Some(("/second".to_string(), 0)),
            "the server got the prompt of a call nobody was told went out"
        );
    }

    /// Review finding (s19a, 1): a body that refused its read with an error had hyper reset
    /// a stream whose head h2 had not sent yet — a reset of a stream the server never saw,
    /// which is a connection error: the server closed the one connection every request to
    /// that host shares, cutting the others. Ending the body empty sends the head first.
    #[tokio::test]
    async fn a_body_its_caller_left_does_not_cost_the_connection_its_other_requests() {
        let (client, addr, first, free, mut seen) = first_request_held(8).await;
        let wire = Arc::new(Wire::default());
        wire.word.store(GONE, Ordering::Release);
        let req = client
            .post(format!("http://{addr}/second"))
            .build()
            .expect("request");
        let second = client.execute(watched(req, Bytes::from_static(b"the prompt"), &wire));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), second).await;
        free.send(()).expect("free the first");
        let first = first.await.expect("task");
        assert_eq!(
            first
                .expect("the first request's answer, on the same connection")
                .status(),
            200
        );
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), seen.recv()).await;
        assert_eq!(second.expect("its head"), Some(("/second".to_string(), 0)));
    }

    /// The body's read frames, polled until it ends, with the wire's state after each.
    fn frames(body: &mut Watched) -> Vec<(Option<Vec<u8>>, u32)> {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let mut out = Vec::new();
        loop {
            let frame = match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => f.into_data().ok().map(|d| d.to_vec()),
                _ => None,
            };
            let end = frame.is_none();
            out.push((frame, state(body.wire.word.load(Ordering::Acquire))));
            if end {
                return out;
            }
        }
    }

    /// The body goes in three pieces — all but its last two bytes, then one, then the last
    /// — and is read at the last: on HTTP/2 hyper reads a piece only once the one before
    /// it has the window to go, so a read means all but the last byte can go. A caller gone
    /// before the last piece leaves a body short of its length: nothing an upstream can use.
    #[test]
    fn a_body_is_read_at_its_last_piece_and_ends_short_when_its_caller_goes_first() {
        let watched = |wire: &Arc<Wire>| Watched {
            body: Bytes::from_static(b"{\"a\":1}"),
            wire: wire.clone(),
            send: 0,
        };
        let wire = Arc::new(Wire::default());
        let mut body = watched(&wire);
        assert_eq!(body.size_hint().exact(), Some(7));
        assert_eq!(
            frames(&mut body),
            [
                (Some(b"{\"a\":".to_vec()), WAITING),
                (Some(b"1".to_vec()), WAITING),
                (Some(b"}".to_vec()), READ),
                (None, READ),
            ]
        );
        assert!(body.is_end_stream());

        let wire = Arc::new(Wire::default());
        let mut body = watched(&wire);
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(_))
        ));
        wire.word.store(GONE, Ordering::Release);
        assert_eq!(frames(&mut body), [(None, GONE)], "short of its length");
    }

    /// Review finding (s20, S5): one wire serves every resend of a call, and a dead send's
    /// body can still be read after the call gave it up for another — with three pieces,
    /// its last one after its stream was reset. Read then, it marked the wire read: a
    /// departure charged while the resend was still held, a `Timeout` where `Held` was due.
    /// A body counts only for its own send.
    #[test]
    fn a_body_of_a_send_given_up_for_another_changes_nothing() {
        let wire = Arc::new(Wire::default());
        let body = |send| Watched {
            body: Bytes::from_static(b"{\"a\":1}"),
            wire: wire.clone(),
            send,
        };
        let mut dead = body(0);
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        assert!(matches!(
            Pin::new(&mut dead).poll_frame(&mut cx),
            Poll::Ready(Some(_))
        ));
        assert!(!wire.untouched(), "a piece went");
        wire.unread();
        assert!(wire.untouched(), "the next send is untouched");
        assert_eq!(
            frames(&mut dead),
            [(None, WAITING)],
            "ended short, not read"
        );
        let mut next = body(send_of(wire.word.load(Ordering::Acquire)));
        assert_eq!(frames(&mut next).last(), Some(&(None, READ)));
    }

    /// Review finding (s19-final, N3): on HTTP/2 the body's first read came before any of
    /// the flow-control window it needs, so a request whose server gave it none was "out"
    /// with no byte of its body sent — billable to a client that left, and a server error
    /// at the first-byte timeout. Now nothing is told until all but its last byte can go.
    #[tokio::test]
    async fn a_body_the_servers_flow_control_window_holds_back_is_not_out() {
        let addr = shut_window_server().await;
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .expect("client");
        // The connection is up and the server's settings taken.
        let url = format!("http://{addr}/");
        client.get(&url).send().await.expect("the first answer");
        let wire = Arc::new(Wire::default());
        let req = client.post(&url).build().expect("request");
        let req = watched(req, Bytes::from_static(b"{\"prompt\":\"long\"}"), &wire);
        let mut told = Vec::new();
        let call = watch(client.execute(req), &wire, |on| told.push(on));
        let cut = tokio::time::timeout(std::time::Duration::from_millis(300), call).await;
        assert!(cut.is_err(), "held back by the window");
        assert_eq!(told, [] as [bool; 0], "no byte of the body could go");
    }
}

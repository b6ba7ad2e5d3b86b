//! The stream's side toward its client (`stream::ClientSink`) against a body drained at a
//! chosen pace, with short stall limits: what no socket test can pin exactly, since the
//! kernel wakes a blocked writer only once a share of its buffer is free.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use super::drain::Drain;
use super::stream::{sse_channel, ClientSink};

/// The client: takes the body's frames, pausing `pause` after each; how many it took.
fn read<S>(body: S, pause: Duration) -> tokio::task::JoinHandle<u32>
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    read_paced(body, move |_| pause)
}

/// The client: takes the body's frames, pausing `pace(n)` after the `n`th (from 1); how
/// many it took.
fn read_paced<S>(
    body: S,
    pace: impl Fn(u32) -> Duration + Send + 'static,
) -> tokio::task::JoinHandle<u32>
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut taken = 0u32;
        while let Some(Ok(_)) = body.next().await {
            taken += 1;
            let pause = pace(taken);
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        taken
    })
}

/// Sends `frame` (of an answer already whole when `whole`) until the sink gives its client
/// up: how many frames were handed on, and after how long.
async fn send_until_given_up(
    sink: &ClientSink,
    frame: &'static [u8],
    whole: bool,
) -> (u32, Duration) {
    let started = Instant::now();
    let mut sent = 0u32;
    loop {
        let frame = Bytes::from_static(frame);
        let handed = if whole {
            sink.send_whole(frame).await
        } else {
            sink.send(frame).await
        };
        if !handed {
            return (sent, started.elapsed());
        }
        sent += 1;
        assert!(sent < 400, "still handed on after {:?}", started.elapsed());
    }
}

/// A client that takes a frame every 20 ms keeps every single wait under a 100 ms stall
/// limit, yet keeps the stream waiting without end: it is given up once the waits add up to
/// five stall limits (s26 attack streams F3: it held its slots for as long as it read). Its
/// frames are of one byte (50 B/s, far below the floor rate: each earns 1 ms of its ~20 ms
/// wait), so the earnings barely delay it.
#[tokio::test]
async fn a_client_that_keeps_the_stream_waiting_five_stall_limits_in_all_is_given_up() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(20));
    let (sent, given_up) = send_until_given_up(&sink, b"\n", false).await;
    assert!(
        given_up >= stall * 5 && given_up < stall * 10,
        "given up after {given_up:?}"
    );
    drop(sink);
    let taken = reader.await.unwrap();
    assert!(taken <= sent, "{taken} of {sent}");
}

/// A client that keeps up costs nothing of the budget: frames that find room never wait.
#[tokio::test]
async fn a_client_that_keeps_up_never_runs_out_of_budget() {
    let stall = Duration::from_millis(50);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::ZERO);
    for _ in 0..10_000 {
        assert!(sink.send(Bytes::from_static(b"data: {}\n\n")).await);
    }
    drop(sink);
    assert_eq!(reader.await.unwrap(), 10_000);
}

/// Frames of an answer already whole (`send_whole`, after the upstream's finish) have twice
/// the budget: a client behind on them past the first budget gets them all (s26 diff attack
/// #3: cut after five stall limits, charged the whole answer, and its SDK would ask again),
/// but one that keeps them waiting past twice the budget is given up (s26 stop attack #4:
/// unbounded, an answer leaving many frames after its finish held its slots for hours).
/// One-byte frames, as above: far below the floor rate.
#[tokio::test]
async fn a_reader_behind_on_a_whole_answer_has_twice_the_budget() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(20));
    let (sent, given_up) = send_until_given_up(&sink, b"\n", true).await;
    assert!(
        given_up >= stall * 10 && given_up < stall * 20,
        "given up after {given_up:?}"
    );
    drop(sink);
    assert!(reader.await.unwrap() <= sent);
}

/// A steady slow reader above the floor rate (100-byte frames every 20 ms: 5 000 B/s, five
/// times `stream::FLOOR_BYTES_PER_SEC`) earns more wait than it spends: it gets every frame
/// though it keeps the stream waiting far more than five stall limits in all (s26 final
/// attack #4: a 10 MB answer over 150 kbit/s was cut after five stall limits of waiting).
#[tokio::test]
async fn a_steady_reader_above_the_floor_rate_is_never_given_up() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(20));
    let frame = Bytes::from(vec![b'x'; 100]);
    let started = Instant::now();
    for i in 0..120 {
        assert!(
            sink.send(frame.clone()).await,
            "frame {i} given up after {:?}",
            started.elapsed()
        );
    }
    // The first frames found room at once; the other ~100 waited ~20 ms each.
    let waited = started.elapsed();
    assert!(waited >= stall * 15, "waited only {waited:?}");
    drop(sink);
    assert_eq!(reader.await.unwrap(), 120);
}

/// A trickle reader — a 10-byte frame just before each stall limit (every 90 ms against
/// 100 ms) — earns 10 ms of wait per ~90 ms it spends, so it is given up once its waits
/// less those earnings add up to five stall limits: within 5 × 90 / (90 − 10) ≈ 5.6 stall
/// limits of waiting, about what it held before the floor rate.
#[tokio::test]
async fn a_trickle_reader_below_the_floor_rate_is_still_given_up() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(90));
    let (sent, given_up) = send_until_given_up(&sink, b"data: {}\n\n", false).await;
    assert!(
        given_up >= stall * 5 && given_up < stall * 8,
        "given up after {given_up:?}"
    );
    drop(sink);
    assert!(reader.await.unwrap() <= sent);
}

/// Earned wait does not pile up: a reader that took a long answer fast (4 000 frames of
/// 100 bytes, 400 s at the floor rate) and then trickles is given up as soon as a fresh
/// trickle is, its unspent earnings capped at the five stall limits it started with.
#[tokio::test]
async fn wait_earned_by_a_fast_start_does_not_carry_a_trickle_past_the_budget() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let fast = 4_000;
    let reader = read_paced(body, move |n| {
        if n < fast {
            Duration::ZERO
        } else {
            Duration::from_millis(90)
        }
    });
    let frame = Bytes::from(vec![b'x'; 100]);
    for _ in 0..fast - 20 {
        assert!(sink.send(frame.clone()).await);
    }
    let trickle = Instant::now();
    while sink.send(Bytes::from_static(b"data: {}\n\n")).await {
        assert!(
            trickle.elapsed() < stall * 20,
            "earnings carried the trickle on"
        );
    }
    let given_up = trickle.elapsed();
    assert!(given_up < stall * 9, "given up after {given_up:?}");
    drop(sink);
    reader.await.unwrap();
}

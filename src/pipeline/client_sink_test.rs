//! The stream's side toward its client (`stream::ClientSink`) against a body drained at a
//! chosen pace, with short stall limits: what no socket test can pin exactly, since the
//! kernel wakes a blocked writer only once a share of its buffer is free.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use super::drain::Drain;
use super::stream::sse_channel;

/// The client: takes the body's frames, pausing `pause` after each; how many it took.
fn read<S>(body: S, pause: Duration) -> tokio::task::JoinHandle<u32>
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut taken = 0u32;
        while let Some(Ok(_)) = body.next().await {
            taken += 1;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        taken
    })
}

/// A client that takes a frame every 20 ms keeps every single wait under a 100 ms stall
/// limit, yet keeps the stream waiting without end: it is given up once the waits add up to
/// five stall limits (s26 attack streams F3: it held its slots for as long as it read).
#[tokio::test]
async fn a_client_that_keeps_the_stream_waiting_five_stall_limits_in_all_is_given_up() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(20));
    let started = Instant::now();
    let mut sent = 0u32;
    while sink.send(Bytes::from_static(b"data: {}\n\n")).await {
        sent += 1;
        assert!(sent < 400, "still handed on after {:?}", started.elapsed());
    }
    let given_up = started.elapsed();
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
#[tokio::test]
async fn a_reader_behind_on_a_whole_answer_has_twice_the_budget() {
    let stall = Duration::from_millis(100);
    let (sink, body) = sse_channel(stall, Drain::default());
    let reader = read(body, Duration::from_millis(20));
    let started = Instant::now();
    let mut sent = 0u32;
    while sink.send_whole(Bytes::from_static(b"data: {}\n\n")).await {
        sent += 1;
        assert!(sent < 400, "still handed on after {:?}", started.elapsed());
    }
    let given_up = started.elapsed();
    assert!(
        given_up >= stall * 10 && given_up < stall * 20,
        "given up after {given_up:?}"
    );
    drop(sink);
    assert!(reader.await.unwrap() <= sent);
}

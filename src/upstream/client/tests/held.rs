//! A request hyper held at an HTTP/2 server's stream cap is `Held`, not a timeout, and is
//! sent again when a graceful GOAWAY gives it up; a body the upstream does not take and a
//! credential that hangs are timeouts.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION};

use super::{chat_url, h2_client, post_h2};
use crate::config::UpstreamTimeouts;
use crate::upstream::catalog::Deployment;
use crate::upstream::client::resend::{never_sent, unprocessed};
use crate::upstream::client::UpstreamClient;
use crate::upstream::on_wire;
use crate::upstream::on_wire::tests::{answer, h2_serving, shut_window_server};
use crate::upstream::UpstreamError;

/// An HTTP/2 server (no TLS) with room for one stream per connection. The first stream
/// of its first connection is held, unanswered, until `goaway` fires: then that
/// connection is shut down gracefully (GOAWAY `NO_ERROR`) and the held stream answered.
/// Every other stream, on any connection, is answered 200 at once: the count of them.
/// A client sends that first stream (`first`) with no timeout of its own.
struct Capped {
    url: reqwest::Url,
    answered: Arc<AtomicUsize>,
    first: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
}

async fn capped_server(
    client: &UpstreamClient,
    goaway: tokio::sync::oneshot::Receiver<()>,
) -> Capped {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let url = format!("http://{addr}/v1/chat/completions");
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let (first_in, first_seen) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut goaway = Some(goaway);
        let mut first_in = Some(first_in);
        while let Ok((tcp, _)) = listener.accept().await {
            let mut conn = h2::server::Builder::new()
                .max_concurrent_streams(1)
                .handshake::<_, Bytes>(tcp)
                .await
                .expect("handshake");
            let count = count.clone();
            let mut held = None;
            let mut goaway = goaway.take();
            let mut first_in = first_in.take();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        stream = conn.accept() => match stream {
                            // Its request kept too: dropped, it could free the stream.
                            Some(Ok(stream)) if held.is_none() && goaway.is_some() => {
                                held = Some(stream);
                                if let Some(first_in) = first_in.take() {
                                    let _ = first_in.send(());
                                }
                            }
                            Some(Ok((_, respond))) => {
                                count.fetch_add(1, SeqCst);
                                answer(respond, b"{}");
                            }
                            _ => break,
                        },
                        _ = async { goaway.as_mut().expect("checked").await }, if goaway.is_some() => {
                            goaway = None;
                            conn.graceful_shutdown();
                            if let Some((_, respond)) = held.take() {
                                answer(respond, b"{}");
                            }
                        }
                    }
                }
            });
        }
    });
    let first = client.private.post(&url).body("{}").send();
    let first = tokio::spawn(first);
    first_seen.await.expect("the first stream is in");
    let url = reqwest::Url::parse(&url).expect("url");
    Capped {
        url,
        answered,
        first,
    }
}

/// Review finding (s19-final, N1): a request hyper held at the server's stream cap past
/// the first-byte timeout never went out, yet was a `Timeout` — a server error, a
/// breaker failure of a key whose upstream did nothing wrong, and the next key of the
/// same host (the same full connection) tried. It is `Held` now: no fault of the
/// upstream's.
#[tokio::test]
async fn a_request_held_at_the_stream_cap_past_the_first_byte_timeout_is_held_not_timed_out() {
    let client = h2_client(&UpstreamTimeouts {
        connect_timeout_ms: 100,
        first_byte_timeout_ms: 400,
        ..UpstreamTimeouts::default()
    });
    let (_keep, goaway) = tokio::sync::oneshot::channel();
    let capped = capped_server(&client, goaway).await;
    let mut told = Vec::new();
    let second = post_h2(&client, &capped.url, &mut told).await;
    assert!(matches!(second, Err(UpstreamError::Held)), "{second:?}");
    assert_eq!(told, [] as [bool; 0]);
    assert_eq!(capped.answered.load(SeqCst), 0);
}

/// Review finding (s19-final, N4): a graceful GOAWAY reaching the request hyper held at
/// the stream cap ends it as "dispatch gone", not as an HTTP/2 error: it was not sent
/// again, and was a `Broken` call — a breaker failure — though it never left. A call
/// whose body was never read is sent again like one HTTP/2 says it did not process.
#[tokio::test]
async fn a_held_request_that_a_graceful_goaway_ends_is_sent_again() {
    let client = h2_client(&UpstreamTimeouts::default());
    let (goaway, go) = tokio::sync::oneshot::channel();
    let capped = capped_server(&client, go).await;
    let mut told = Vec::new();
    let second = post_h2(&client, &capped.url, &mut told);
    let shut = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = goaway.send(());
    };
    let (second, ()) = tokio::join!(second, shut);
    assert_eq!(second.expect("sent again").status(), 200);
    assert_eq!(told, [true]);
    assert_eq!(capped.answered.load(SeqCst), 1, "once, on a new connection");
    let first = capped.first.await.expect("task");
    assert_eq!(first.expect("the held one is answered").status(), 200);
}

/// Review finding (s20, S7): the error a graceful GOAWAY gives the request hyper held at
/// the stream cap is hyper giving it up ("dispatch gone"), not an HTTP/2 error: the
/// resend of `a_held_request_that_a_graceful_goaway_ends_is_sent_again` is
/// `never_sent`'s, not `unprocessed`'s.
#[tokio::test]
async fn a_graceful_goaway_reaching_a_held_request_is_hyper_giving_it_up() {
    let client = h2_client(&UpstreamTimeouts::default());
    let (goaway, go) = tokio::sync::oneshot::channel();
    let capped = capped_server(&client, go).await;
    let wire = Arc::new(on_wire::Wire::default());
    let req = client
        .private
        .post(capped.url.clone())
        .build()
        .expect("request");
    let held = client
        .private
        .execute(on_wire::watched(req, Bytes::from_static(b"{}"), &wire));
    let shut = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = goaway.send(());
    };
    let (held, ()) = tokio::join!(held, shut);
    let err = held.expect_err("given up");
    assert_eq!(unprocessed(&err), None, "{err:?}");
    assert!(never_sent(&err, &wire), "{err:?}");
}

/// Review finding (s20, S1): a request whose body the upstream does not take (its
/// HTTP/2 window shut; on HTTP/1 a full socket) is the upstream not reading it — a
/// timeout, its breaker's to count — not a request hyper held: `Held` was hiding a
/// wedged upstream fed large prompts from its breaker.
#[tokio::test]
async fn a_body_the_upstream_does_not_take_is_a_timeout_not_a_held_request() {
    let url = chat_url(shut_window_server().await);
    let client = h2_client(&UpstreamTimeouts {
        connect_timeout_ms: 50,
        first_byte_timeout_ms: 400,
        ..UpstreamTimeouts::default()
    });
    // The connection is up and the server's settings taken.
    client
        .private
        .get(url.clone())
        .send()
        .await
        .expect("the first answer");
    let mut told = Vec::new();
    let answer = post_h2(&client, &url, &mut told).await;
    assert!(matches!(answer, Err(UpstreamError::Timeout)), "{answer:?}");
    assert_eq!(told, [] as [bool; 0], "not out whole: nothing billed");
}

/// A credential made once at once, then never (its endpoint hangs).
#[derive(Debug, Default)]
struct SlowSecond(AtomicUsize);

impl crate::upstream::credential::Authorize for SlowSecond {
    fn authorize<'a>(
        &'a self,
        _: &'a reqwest::Client,
        req: reqwest::Request,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<reqwest::Request, UpstreamError>> + Send + 'a>,
    > {
        let first = self.0.fetch_add(1, SeqCst) == 0;
        let mut req = req;
        req.headers_mut()
            .insert(AUTHORIZATION, HeaderValue::from_static("Bearer cached"));
        Box::pin(async move {
            if !first {
                std::future::pending::<()>().await;
            }
            Ok(req)
        })
    }

    fn cached(&self) -> bool {
        true
    }
}

/// Review finding (s20, S7): a 401 to a cached credential, then a replacement that
/// never comes (its token endpoint hangs): the first-byte timer that ends it is the
/// credential's timeout — not `Held`, which would spare the upstream its breaker count.
#[tokio::test]
async fn a_replacement_credential_that_hangs_is_a_timeout_not_a_held_request() {
    let refusing = |_, mut respond: h2::server::SendResponse<Bytes>| {
        let refused = http::Response::builder().status(401).body(()).expect("401");
        if let Ok(mut send) = respond.send_response(refused, false) {
            let _ = send.send_data(Bytes::from_static(b"{}"), true);
        }
    };
    let url = chat_url(h2_serving(h2::server::Builder::new(), refusing).await);
    let client = h2_client(&UpstreamTimeouts {
        connect_timeout_ms: 50,
        first_byte_timeout_ms: 400,
        ..UpstreamTimeouts::default()
    });
    let dep = Deployment::alone(&crate::config::UpstreamSettings {
        id: "h2".into(),
        allow_private_network: true,
        ..Default::default()
    })
    .hooked(Arc::new(SlowSecond::default()));
    let mut told = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = client
        .post(
            &dep,
            Some(&url),
            Bytes::from_static(b"{}"),
            deadline,
            ((None, None), |on| told.push(on)),
        )
        .await;
    assert!(matches!(answer, Err(UpstreamError::Timeout)), "{answer:?}");
    assert_eq!(told, [true, false], "out, then taken back at the 401");
}

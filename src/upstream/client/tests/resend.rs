//! The resends of a request the upstream never had: HTTP/2's refusals and GOAWAYs, and
//! what is not resent (a connection not made, a stream reset).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{chat_url, h2_client, post_h2, Wrap};
use crate::config::UpstreamTimeouts;
use crate::upstream::catalog::Deployment;
use crate::upstream::client::resend::{unprocessed, Unprocessed, RESENDS, RESEND_PAUSE};
use crate::upstream::client::UpstreamClient;
use crate::upstream::on_wire::tests::{answer, h2_serving};
use crate::upstream::url_guard::SystemResolver;
use crate::upstream::UpstreamError;

/// The error an HTTP/2 client gets for a request its server answers with `answer`
/// (a reset of the stream with that reason, or a GOAWAY before it was accepted).
async fn h2_error(answer: Option<h2::Reason>) -> h2::Error {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.expect("handshake");
        match answer {
            Some(reason) => {
                while let Some(Ok((_, mut respond))) = conn.accept().await {
                    respond.send_reset(reason);
                }
            }
            None => {
                conn.graceful_shutdown();
                while conn.accept().await.is_some() {}
            }
        }
    });
    let (h2c, conn) = h2::client::handshake(client_io).await.expect("handshake");
    tokio::spawn(conn);
    if answer.is_none() {
        // The server's GOAWAY comes before the request.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut h2c = match h2c.ready().await {
        Ok(h2c) => h2c,
        Err(e) => return e,
    };
    let req = http::Request::post("https://upstream/")
        .body(())
        .expect("request");
    match h2c.send_request(req, true) {
        Ok((resp, _)) => resp.await.expect_err("refused"),
        Err(e) => e,
    }
}

/// Review finding (s18, 3): a watched body cannot be cloned, so reqwest's own retry of
/// the requests HTTP/2 says were not processed no longer runs: `post` resends them.
#[tokio::test]
async fn only_a_request_http2_says_was_not_processed_is_sent_again() {
    let refused = h2_error(Some(h2::Reason::REFUSED_STREAM)).await;
    let wrapped = Wrap("a request error", Box::new(refused));
    assert_eq!(unprocessed(&wrapped), Some(Unprocessed::Refused));
    let failed = h2_error(Some(h2::Reason::INTERNAL_ERROR)).await;
    assert_eq!(unprocessed(&failed), None);
    let gone = h2_error(None).await;
    assert_eq!(unprocessed(&gone), Some(Unprocessed::GoneAway), "{gone:?}");
    assert_eq!(
        unprocessed(&h2::Error::from(h2::Reason::REFUSED_STREAM)),
        None
    );
}

/// An HTTP/2 server (no TLS) that refuses its first `refusals` streams
/// (`REFUSED_STREAM`) and answers the rest 200; the count of streams it had.
async fn refusing_server(refusals: usize) -> (reqwest::Url, Arc<AtomicUsize>) {
    let had = Arc::new(AtomicUsize::new(0));
    let count = had.clone();
    let addr = h2_serving(h2::server::Builder::new(), move |_, mut respond| {
        if count.fetch_add(1, SeqCst) < refusals {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
        } else {
            answer(respond, b"{}");
        }
    })
    .await;
    (chat_url(addr), had)
}

/// What `post` made of a server that refuses `refusals` streams: its answer, how many
/// streams the server had, and what `reached` was told.
async fn post_to_refusing(
    refusals: usize,
) -> (Result<reqwest::Response, UpstreamError>, usize, Vec<bool>) {
    let (url, had) = refusing_server(refusals).await;
    let timeouts = UpstreamTimeouts::default();
    let client = UpstreamClient::built(&timeouts, Arc::new(SystemResolver), |b| {
        b.http2_prior_knowledge()
    })
    .expect("client");
    let dep = Deployment::alone(&crate::config::UpstreamSettings {
        id: "h2".into(),
        allow_private_network: true,
        ..Default::default()
    });
    let mut told = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = Bytes::from_static(b"{}");
    let answer = client
        .post(
            &dep,
            Some(&url),
            body,
            deadline,
            ((None, None), |on| told.push(on)),
        )
        .await;
    (answer, had.load(SeqCst), told)
}

/// A request HTTP/2 says was not processed is sent again, up to `RESENDS` times, each
/// taken back from the wire (the end-to-end resend, not only its classifier). Review
/// finding (s19a, 4): refused every time, it was a `Broken` call that had reached its
/// upstream — billable, its departure paying its input — though no upstream had it.
#[tokio::test]
async fn a_stream_refused_is_sent_again_and_refused_every_time_bills_nothing() {
    let (answer, had, told) = post_to_refusing(1).await;
    assert_eq!(answer.expect("the resend's answer").status(), 200);
    assert_eq!((had, told), (2, vec![true, false, true]));

    let began = Instant::now();
    let (answer, had, told) = post_to_refusing(usize::MAX).await;
    assert!(matches!(answer, Err(UpstreamError::Refused)), "{answer:?}");
    // Review finding (s19-final, N5): refused each time, it was a `Connect` failure —
    // a breaker count and no rest — its resends back to back. A refusal is how an
    // HTTP/2 server sheds load: resent after a pause, and an overload at the last.
    assert_eq!(
        crate::upstream::retry::classify(&UpstreamError::Refused),
        crate::upstream::retry::Tier::Overloaded
    );
    assert!(began.elapsed() >= RESEND_PAUSE * 3, "{:?}", began.elapsed());
    assert_eq!(had, 1 + RESENDS);
    assert_eq!(told.last(), Some(&false), "not out: {told:?}");
}

/// `never_sent` leaves a connection not made to the upstream: no resend, `Connect`.
#[tokio::test]
async fn a_connection_refused_is_not_sent_again() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}/")).expect("url");
    let answer = post_h2(
        &h2_client(&UpstreamTimeouts::default()),
        &url,
        &mut Vec::new(),
    )
    .await;
    assert!(
        matches!(&answer, Err(UpstreamError::Connect(what)) if what == "connect"),
        "{answer:?}"
    );
}

/// Review finding (s20b, B5): a stream the upstream resets before it took the body
/// whole (here `INTERNAL_ERROR`, its window shut) is the upstream's answer, not hyper
/// giving the request up: not sent again (it went three times before, a pushed-back
/// prompt uploaded thrice), and billing nothing.
#[tokio::test]
async fn a_stream_reset_before_its_body_went_whole_is_not_sent_again() {
    let streams = Arc::new(AtomicUsize::new(0));
    let count = streams.clone();
    let mut shut = h2::server::Builder::new();
    shut.initial_window_size(0);
    let addr = h2_serving(shut, move |req, mut respond| {
        if req.method() == http::Method::GET {
            answer(respond, b"{}");
            return;
        }
        count.fetch_add(1, SeqCst);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            respond.send_reset(h2::Reason::INTERNAL_ERROR);
            drop(req);
        });
    })
    .await;
    let url = chat_url(addr);
    let client = h2_client(&UpstreamTimeouts::default());
    // The connection is up and the server's settings taken.
    client
        .private
        .get(url.clone())
        .send()
        .await
        .expect("the first answer");
    let mut told = Vec::new();
    let answer = post_h2(&client, &url, &mut told).await;
    assert!(
        matches!(&answer, Err(UpstreamError::Connect(what)) if what == "request not sent"),
        "{answer:?}"
    );
    assert_eq!(streams.load(SeqCst), 1, "sent once");
    assert_eq!(told, [] as [bool; 0]);
}

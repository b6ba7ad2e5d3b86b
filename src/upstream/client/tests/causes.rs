//! What an answer or a failed call says: the wait an upstream asked for (`retry_after`)
//! and a shortage of the gateway's own resources (`local_shortage`).

use std::time::Duration;

use reqwest::header::{HeaderValue, RETRY_AFTER};

use super::Wrap;
use crate::upstream::client::{local_shortage, retry_after};

fn wrapped(errno: i32) -> Wrap {
    Wrap(
        "client error (Connect)",
        Box::new(Wrap(
            "tcp open error",
            Box::new(std::io::Error::from_raw_os_error(errno)),
        )),
    )
}

#[test]
fn retry_after_ms_comes_before_retry_after() {
    let mut h = reqwest::header::HeaderMap::new();
    assert_eq!(retry_after(&h), None);
    h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
    assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
    h.insert("retry-after-ms", HeaderValue::from_static("1500"));
    assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
    h.insert("retry-after-ms", HeaderValue::from_static("soon"));
    assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
    h.insert(RETRY_AFTER, HeaderValue::from_static("1e300"));
    assert_eq!(retry_after(&h), None, "no panic on an absurd wait");
}

#[test]
fn a_shortage_of_the_gateways_own_resources_is_found_down_the_chain() {
    for (errno, what) in [
        (libc::EMFILE, "EMFILE"),
        (libc::ENFILE, "ENFILE"),
        (libc::ENOBUFS, "ENOBUFS"),
        (libc::ENOMEM, "ENOMEM"),
    ] {
        let found = local_shortage(&wrapped(errno));
        assert!(found.is_some_and(|f| f.contains(what)), "{what}: {found:?}");
    }
    // The far side's faults are not the gateway's.
    for errno in [
        libc::ECONNREFUSED,
        libc::ECONNRESET,
        libc::ETIMEDOUT,
        libc::EHOSTUNREACH,
    ] {
        assert_eq!(local_shortage(&wrapped(errno)), None, "errno {errno}");
    }
    let not_os = Wrap("x", Box::new(std::io::Error::other("too many open files")));
    assert_eq!(
        local_shortage(&not_os),
        None,
        "only the errno decides, not words"
    );
    let io_in_io = std::io::Error::other(std::io::Error::from_raw_os_error(libc::EMFILE));
    assert!(local_shortage(&Wrap("x", Box::new(io_in_io))).is_some());
}

/// The walk reaches the `io::Error` inside a real reqwest connect error: a refused
/// connection's errno is found at the end of the same chain an `EMFILE` travels.
#[tokio::test]
async fn the_walk_reaches_the_os_error_inside_a_real_reqwest_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();
    let mut errnos = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = cause {
        errnos.extend(
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.raw_os_error()),
        );
        cause = e.source();
    }
    assert_eq!(errnos, [libc::ECONNREFUSED], "{err:?}");
    assert_eq!(local_shortage(&err), None);
}

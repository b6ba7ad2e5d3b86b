//! Reading a request body whole, within a size and a time. Every surface that reads one —
//! the client API (`pipeline::read_body`) and the admin's (the sign-in form, the CSRF
//! field, `admin::input::Input`) — reads it so: unbounded in time, a client that declared
//! a long body and stopped sending held its connection and buffer for ever (s30 streams
//! attack F2 on `/v1`; s32 edge attack F1 on the admin, the sign-in form open to anyone).

use std::time::Duration;

use actix_web::error::PayloadError;
use actix_web::http::header::HeaderMap;
use actix_web::web::{Bytes, BytesMut};
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

/// Reads `payload` whole: at most `limit` bytes (a larger declared `Content-Length` is
/// refused before any byte is read), all of it within `within`.
pub async fn read<S>(
    mut payload: S,
    headers: &HeaderMap,
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
    let mut body = BytesMut::with_capacity(declared.unwrap_or(1024).min(PREALLOC).min(limit));
    let read = async {
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| match e {
                PayloadError::Overflow => BodyError::TooLarge(limit),
                _ => BodyError::Unreadable,
            })?;
            if body.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge(limit));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(within, read).await {
        Ok(read) => read.map(|()| body.freeze()),
        Err(_) => Err(BodyError::TooSlow(within)),
    }
}

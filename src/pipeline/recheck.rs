//! A request's credential, checked again after a wait: for its body to arrive, in the
//! admission queue, or between retry rounds while its keys rest. Either may last up to the request's deadline (minutes),
//! and a token revoked, expired or whose user was disabled meanwhile must go no further —
//! as a new request would not (s25 attacks, identity #4 and the day's diff #1: such requests
//! were sent upstream and charged after the revocation).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap, HeaderName};

use crate::auth::TokenAuth;
use crate::config::Ladder;
use crate::error::ApiError;
use crate::state::AppState;

/// A wait at least this long is followed by a check of the request's credential (the token
/// cache's poll: a shorter wait is within a revocation's own bound).
pub const RECHECK_AFTER: Duration = Duration::from_millis(250);

/// The longest a re-check waits for its token lookup.
const LOOKUP_BOUND: Duration = Duration::from_secs(1);

/// The headers that carry a request's credential, kept while it waits for a slot.
pub fn credential(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for name in [header::AUTHORIZATION, HeaderName::from_static("x-api-key")] {
        for v in headers.get_all(&name) {
            kept.append(name.clone(), v.clone());
        }
    }
    kept
}

/// The request's credential authenticated (with the auth stage off, anonymous): a missing,
/// unknown, revoked or expired token, or one whose user is disabled, is a 401.
pub async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Arc<TokenAuth>, ApiError> {
    if !state.settings.ladder.has(Ladder::Auth) {
        return Ok(TokenAuth::anonymous());
    }
    state
        .auth
        .authenticate(headers, state.clock.now())
        .await
        .map_err(|e| ApiError::from_store(&e, "token lookup"))?
        .ok_or(ApiError::InvalidApiKey)
}

/// The request's authentication once its body has arrived, and when it was made: `auth`,
/// made at `at`, if the body came within `RECHECK_AFTER`; else made again, as a new
/// request's would be. The body is read after the head's authentication, and a client may
/// hold it back for as long as it likes: a token revoked, narrowed or whose user was
/// disabled meanwhile must go no further, and a text rotated meanwhile works as its
/// successor — it must reserve on the successor's budget, not on the old token's, which
/// the rotation handed to the successor too (s26 attack F2).
pub async fn after_body(
    state: &AppState,
    headers: &HeaderMap,
    (auth, at): (Arc<TokenAuth>, Instant),
) -> Result<(Arc<TokenAuth>, Instant), ApiError> {
    if at.elapsed() < RECHECK_AFTER {
        return Ok((auth, at));
    }
    let again = authenticate(state, headers).await?;
    Ok((again, Instant::now()))
}

/// The request's credential authenticated again, from the database, after its reservation
/// found the token it acted as rotated (`QuotaError::Rotated`: nothing was reserved). The
/// rotation committed after the last check — during the window call or the semantic
/// lookup's embedding, say (s26 final attack #2) — and the text now works as the successor:
/// that is the token to reserve on. Read past this process's cache (which may still map
/// the text to the old token until the next poll); a text that no longer authenticates
/// (the successor revoked, its user disabled meanwhile) is a 401, and so is one that still
/// maps to the rotated token (it cannot: the rotation wrote the successor before it
/// committed).
pub async fn after_rotation(
    state: &AppState,
    headers: &HeaderMap,
    rotated: i64,
) -> Result<Arc<TokenAuth>, ApiError> {
    let again = state
        .auth
        .authenticate_fresh(headers, state.clock.now())
        .await
        .map_err(|e| ApiError::from_store(&e, "token lookup"))?
        .ok_or(ApiError::InvalidApiKey)?;
    if again.owner.token_id == rotated {
        return Err(ApiError::InvalidApiKey);
    }
    Ok(again)
}

/// Whether a request that waited may go on: its credential still authenticates (else 401).
/// A lookup the store cannot answer within a second, or by the request's `deadline` (a cache
/// just cleared, the read pool busy), is a 503 then: not an answer later than the deadline
/// (s25 final attack F4), nor a slot of the queue or a key's gate held meanwhile (stop
/// attack F3).
pub async fn still_admitted(
    state: &AppState,
    credential: &HeaderMap,
    deadline: Instant,
) -> Result<(), ApiError> {
    if !state.settings.ladder.has(Ladder::Auth) {
        return Ok(());
    }
    let lookup = state.auth.authenticate(credential, state.clock.now());
    let bound = deadline.min(Instant::now() + LOOKUP_BOUND);
    match tokio::time::timeout_at(bound.into(), lookup).await {
        Ok(Ok(Some(_))) => Ok(()),
        Ok(Ok(None)) => Err(ApiError::InvalidApiKey),
        Ok(Err(e)) => Err(ApiError::from_store(&e, "token lookup")),
        Err(_) => Err(ApiError::ServiceDegraded { retry_after: 1 }),
    }
}

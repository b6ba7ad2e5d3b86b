//! Answers served from the cache: the stored whole answer, or its replay as SSE for a
//! stream. Nothing is reserved or charged; the request still counted in its request window,
//! and its token windows go back to 0 (its booking, dropped unrecorded: a hit consumed no
//! provider tokens). A hit carries every header a proxied answer carries (DESIGN "Wire
//! formats"): the budget left as it stands, a queue wait of 0 — it never queued — and
//! `x-sluice-dropped`, what the replayed answer's routes leave out.

use actix_web::HttpResponse;
use bytes::Bytes;

use super::request::Prepared;
use super::respond;
use crate::auth::TokenAuth;
use crate::cache::{replay, Hit, HitKind};
use crate::ops::metrics;
use crate::ops::warn_gate::WarnGate;
use crate::state::AppState;
use crate::store::requests::RequestRow;
use crate::store::StoreError;

/// What a hit answers: its stored text whole, or replayed as SSE for a stream.
pub enum Body {
    Whole(Bytes),
    Frames(Vec<Bytes>),
}

/// The body of `hit` for `p`; `None` when a stream asks for an entry that cannot be
/// replayed (`Entry::replayed`): the request then goes on as a miss.
pub fn body(p: &Prepared, hit: &Hit) -> Option<Body> {
    if !p.stream {
        return Some(Body::Whole(hit.entry.answer.clone()));
    }
    let answer = hit.entry.replayed(p.endpoint.format())?;
    Some(Body::Frames(replay::frames(
        p.endpoint.format(),
        &answer,
        p.include_usage,
    )))
}

/// How long a hit waits for its budget read before it goes without the budget header.
const BUDGET_READ_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Hits without their budget header are logged at most once per this while, for each
/// reason apart (a held read's lines would otherwise hide a failing one's): a store that
/// holds the reads holds every hit's (see `ops::warn_gate`).
static LATE: WarnGate = WarnGate::new(std::time::Duration::from_secs(10));
static FAILED: WarnGate = WarnGate::new(std::time::Duration::from_secs(10));

/// A hit goes without its budget header: counted each time by why, and logged through its
/// gate when the store is why — not when the client's own deadline left the read too
/// little time to begin (`store::cache::LEAST_TIME_LEFT`; s43 attack F6: any client could
/// drive the count and the warning with a 1 ms deadline). A read the deadline left time
/// for, not done by it, is the store's (`late`): a store holding every read shows as such
/// whatever deadlines its clients send (s43 final attack F2).
fn header_left_out(e: &StoreError, too_short: bool) {
    let (reason, gate) = match e {
        StoreError::NotInTime(_) if too_short => ("deadline", None),
        StoreError::NotInTime(_) => ("late", Some(&LATE)),
        _ => ("failed", Some(&FAILED)),
    };
    metrics::cache_budget_left_out(reason);
    if let Some(like_it) = gate.and_then(WarnGate::admit) {
        tracing::warn!(
            error = %e,
            left_out_since_the_last_line = like_it,
            "a cache hit went without its budget header"
        );
    }
}

pub async fn answer(
    state: &AppState,
    p: &Prepared,
    hit: &Hit,
    body: Body,
    log: &mut RequestRow,
    auth: &TokenAuth,
    deadline: std::time::Instant,
) -> HttpResponse {
    log.cache = match hit.kind {
        HitKind::Exact => "hit-exact",
        HitKind::Semantic => "hit-semantic",
    };
    log.cache_key = Some(hex::encode(&hit.entry.key[..8]));
    log.cache_similarity = Some(f64::from(hit.similarity));
    log.served_model = p.model.name.clone();
    log.upstream = "cache".into();
    // A failed read only leaves the header out, as a settlement that failed does; so does
    // one not done by `BUDGET_READ_WAIT` (or the client's deadline): SQLite can hold a read
    // ~10 s while another process holds the WAL's read marks, and a hit is answered at once
    // (s41 final attack F1). The read itself ends on its blocking thread.
    let started = std::time::Instant::now();
    let by = deadline.min(started + BUDGET_READ_WAIT);
    let too_short = by.saturating_duration_since(started) < crate::store::cache::LEAST_TIME_LEFT;
    let read = crate::store::cache::budget_remaining(&state.db, &auth.owner, state.clock.now(), by);
    let remaining = read.await.unwrap_or_else(|e| {
        header_left_out(&e, too_short);
        None
    });
    // The replayed answer was built without what its route dropped, and the hit cannot
    // tell which route served it: what any of them would drop, as a queued stream says.
    let candidates = super::attempts::candidates(state, p);
    let dropped = super::attempts::dropped_by_any(state, p, &candidates);
    let mut resp = HttpResponse::Ok();
    respond::gateway_headers(
        &mut resp, &log.id, "cache", remaining, log.cache, auth, &dropped,
    );
    resp.insert_header(("x-sluice-queue-wait-ms", "0"));
    match body {
        Body::Frames(frames) => {
            let body = futures_util::stream::iter(
                frames
                    .into_iter()
                    .map(Ok::<Bytes, std::convert::Infallible>),
            );
            resp.content_type("text/event-stream")
                .insert_header(("cache-control", "no-cache"))
                .streaming(body)
        }
        Body::Whole(text) => resp.content_type("application/json").body(text),
    }
}

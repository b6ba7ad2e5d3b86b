//! Budgets exact on every route and every provider kind (issue 18): one table of client
//! ROUTES (Chat Completions, Anthropic Messages, the Responses API) × upstream KINDS
//! (`openai`, `anthropic`, `azure_openai`, `openai_compatible` with and without
//! `include_usage`, `gemini`, `bedrock`), every cell running the same money checks through
//! the real gateway against `sluice mock` speaking that provider's format. Each check
//! asserts the exact micro-dollars, computed here by hand from the prices below (never by
//! the gateway's pricing code), then the money invariant (`helpers::assert_invariant`, on
//! whichever engine the suite runs).
//!
//! One gateway per kind serves every route; one test per kind runs its cells in turn, and
//! every assertion names its cell (`route × kind × check`). Cells that cannot apply are in
//! `SKIPS` with the reason.

mod cells;
mod checks;
mod counted;

use cells::Kind;

/// The client formats a token may speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Chat,
    Messages,
    Responses,
}

pub const ROUTES: [Route; 3] = [Route::Chat, Route::Messages, Route::Responses];

/// The money checks every cell runs (issue 18's list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// A non-streamed answer is charged exactly its reported usage (cached input and
    /// reasoning included).
    Answer,
    /// The same, streamed.
    Stream,
    /// The reservation is the worst case: one micro-dollar less is refused, the worst case
    /// passes, and the upstream is sent exactly the reserved cap.
    Reservation,
    /// A usage past the reservation (an input estimate too low) charges the reservation;
    /// the rest is an `absorbed` row, and the request log has the whole cost.
    Overrun,
    /// A stream whose upstream reports no usage is charged what was counted.
    UsageMissing,
    /// An answer whose usage says 0 is charged 0 (CHECKS Q5).
    ZeroAnswer,
    /// The same, streamed.
    ZeroStream,
    /// A client that leaves mid-stream is charged what was received.
    Departure,
    /// An upstream 4xx, 5xx or a connection cut before any byte charges nothing.
    UpstreamError,
    /// A first attempt refused (429 / 503 / 500), the second answered: charged once.
    Retry,
    /// A cache hit costs nothing.
    CacheHit,
}

pub const CHECKS: [Check; 11] = [
    Check::Answer,
    Check::Stream,
    Check::Reservation,
    Check::Overrun,
    Check::UsageMissing,
    Check::ZeroAnswer,
    Check::ZeroStream,
    Check::Departure,
    Check::UpstreamError,
    Check::Retry,
    Check::CacheHit,
];

/// Cells that cannot apply, and why (`None` = every route, or every kind).
const SKIPS: &[(Option<Route>, Option<Kind>, Check, &str)] = &[(
    Some(Route::Responses),
    None,
    Check::CacheHit,
    "the Responses API has no response cache (docs/DESIGN.md, \"The Responses API\")",
)];

fn skipped(route: Route, kind: Kind, check: Check) -> Option<&'static str> {
    SKIPS
        .iter()
        .find(|(r, k, c, _)| {
            r.is_none_or(|r| r == route) && k.is_none_or(|k| k == kind) && *c == check
        })
        .map(|s| s.3)
}

/// Every cell of `kind` that applies, on one gateway.
async fn run_kind(kind: Kind) {
    let gw = cells::Gateway::start(kind).await;
    for route in ROUTES {
        for check in CHECKS {
            if skipped(route, kind, check).is_some() {
                continue;
            }
            checks::run(&gw, route, check).await;
        }
    }
}

#[tokio::test]
async fn openai() {
    run_kind(Kind::Openai).await;
}

#[tokio::test]
async fn anthropic() {
    run_kind(Kind::Anthropic).await;
}

#[tokio::test]
async fn azure_openai() {
    run_kind(Kind::Azure).await;
}

#[tokio::test]
async fn openai_compatible() {
    run_kind(Kind::Compatible).await;
}

#[tokio::test]
async fn openai_compatible_without_include_usage() {
    run_kind(Kind::CompatibleNoUsage).await;
}

#[tokio::test]
async fn gemini() {
    run_kind(Kind::Gemini).await;
}

#[tokio::test]
async fn bedrock() {
    run_kind(Kind::Bedrock).await;
}

//! The benchmark's feature ladder (`serve --ladder STEP`, issue 10): the request path with
//! only its first stages on, so `bench/` can measure what each stage adds. Cumulative —
//! each step has every stage of the steps before it. Production always runs `All`.

use serde::Serialize;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Ladder {
    /// Validate, route, call, answer: no token (every caller is served), nothing written.
    Plain,
    /// + the sub-token lookup (in-memory cache in front of SQLite).
    Auth,
    /// + the token's and user's rate-limit windows (Redis or in process).
    Window,
    /// + the budget reservation and settlement (the quota CAS).
    Quota,
    /// + the request log (database row, JSON log line, request metrics).
    Log,
    /// + the response cache's lookup and write on a miss.
    Cache,
    /// Every stage: + the soft limit. (The priority queue's admission gate — an
    /// in-process counter — and the metrics of upstream calls run at every step.)
    #[default]
    All,
}

impl Ladder {
    /// Whether this step runs `stage`.
    pub fn has(self, stage: Ladder) -> bool {
        self >= stage
    }
}

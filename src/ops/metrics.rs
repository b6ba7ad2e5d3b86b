//! Every metric Sluice exports, declared here with its description; `/metrics` renders
//! them in Prometheus's text format. Labels are bounded: token ids (never token text),
//! configured model and upstream names, statuses, fixed enums.

use std::sync::OnceLock;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::upstream::live::Snapshot;

pub const REQUESTS: &str = "gateway_requests_total";
pub const REQUEST_DURATION: &str = "gateway_request_duration_seconds";
pub const QUOTA_REMAINING: &str = "gateway_quota_remaining_usd";
pub const UPSTREAM_LATENCY: &str = "gateway_upstream_latency_seconds";
pub const UPSTREAM_429: &str = "gateway_upstream_429_total";
pub const KEYPOOL_AVAILABLE: &str = "gateway_keypool_available";
pub const CACHE_REQUESTS: &str = "gateway_cache_requests_total";
pub const QUEUE_DEPTH: &str = "gateway_queue_depth";
pub const BREAKER_STATE: &str = "gateway_breaker_state";
pub const RATELIMIT_DEGRADED: &str = "gateway_ratelimit_degraded";
pub const ABSORBED: &str = "gateway_absorbed_micros_total";
pub const ALERTS: &str = "gateway_alerts_total";
pub const TOKEN_BUDGET_USED: &str = "gateway_token_budget_used_ratio";
pub const PASSWORD_VERIFICATIONS: &str = "gateway_password_verifications_total";
pub const PASSWORD_BUSY: &str = "gateway_password_hashing_busy_total";
pub const TRANSLATION_DROPPED: &str = "gateway_translation_dropped_total";
pub const CATALOG_STALE: &str = "gateway_catalog_stale";
pub const SERVED_TIER: &str = "gateway_upstream_service_tier_total";
pub const CACHE_BUDGET_LEFT_OUT: &str = "gateway_cache_hit_budget_header_left_out_total";
pub const HEAP_TRIMS: &str = "gateway_heap_trims_total";
pub const CACHE_STORES_DROPPED: &str = "gateway_cache_stores_dropped_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder once (several apps in one test process share it).
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

fn describe() {
    describe_counter!(
        REQUESTS,
        "Requests answered, by token id, model asked and HTTP status."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from request to complete answer (streams: to their end)."
    );
    describe_gauge!(
        QUOTA_REMAINING,
        "A token's remaining budget in USD after its last settlement."
    );
    describe_gauge!(
        TOKEN_BUDGET_USED,
        "Share of a token's budget used (0–1), for budget alerts."
    );
    describe_histogram!(
        UPSTREAM_LATENCY,
        Unit::Seconds,
        "Upstream time to response headers, per provider and upstream key."
    );
    describe_counter!(UPSTREAM_429, "429 answers from an upstream key.");
    describe_gauge!(KEYPOOL_AVAILABLE, "Keys of a model's pool that can take a request now (enabled, not cooling, breaker not open).");
    describe_counter!(
        CACHE_REQUESTS,
        "Cache lookups by result: hit-exact, hit-semantic, miss."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Requests waiting for admission, by priority (1 critical … 4 low)."
    );
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker per upstream key: 0 closed, 1 half-open, 2 open."
    );
    describe_gauge!(
        RATELIMIT_DEGRADED,
        "1 while Redis fails and rate limits use per-replica local windows."
    );
    describe_counter!(ABSORBED, "Micro-dollars of actual cost above a reservation, absorbed by the gateway (never charged to a token).");
    describe_counter!(ALERTS, "Alerts raised, by kind.");
    describe_gauge!(
        CATALOG_STALE,
        "1 while the stored keys and models cannot be built into a catalog and the one in use stays."
    );
    describe_counter!(
        PASSWORD_VERIFICATIONS,
        "argon2id password verifications run (sign-in and password change; an unknown user's counts too)."
    );
    describe_counter!(
        PASSWORD_BUSY,
        "Password checks refused with 429 because every hashing permit stayed taken."
    );
    describe_counter!(
        TRANSLATION_DROPPED,
        "Answers whose upstream request left out a client field (a hint the upstream has no place for), by the field's name as the client sent it."
    );
    describe_counter!(
        SERVED_TIER,
        "Answers an OpenAI or Anthropic upstream says it served at a service tier other than the standard one the ledger prices (billed apart), by upstream and tier."
    );
    describe_counter!(
        CACHE_BUDGET_LEFT_OUT,
        "Cache hits answered without x-sluice-budget-remaining-usd because their budget read failed (failed), was not done within the gateway's bound (late), or not begun because the client's own deadline left it too little time (deadline)."
    );
    describe_counter!(
        HEAP_TRIMS,
        "Free heap handed back to the OS, by rule: rest (the gateway came to rest) or burst (a burst's load fell while requests still came)."
    );
    describe_counter!(
        CACHE_STORES_DROPPED,
        "Answers the response cache did not store, by reason: behind (1 024 stores were already waiting), invalidated (this replica knew of an invalidation made after the request was planned) or refused (the table refused the row: an invalidation of any replica or the CLI came after the request was planned)."
    );
    describe_counter!(
        crate::ops::traces::SPANS_DROPPED,
        "Trace spans never delivered to the OTLP collector, by reason: queue_full (the export queue was full) or export_failed."
    );
    // Shown from the start (0), so a scrape can tell "none yet" from "not counted".
    counter!(PASSWORD_VERIFICATIONS).absolute(0);
    counter!(PASSWORD_BUSY).absolute(0);
}

pub fn request(token: Option<i64>, model: &str, status: u16, cache: &'static str, seconds: f64) {
    let token = token.map(|t| t.to_string()).unwrap_or_default();
    counter!(REQUESTS, "token" => token, "model" => model.to_string(), "status" => status.to_string()).increment(1);
    histogram!(REQUEST_DURATION).record(seconds);
    if cache != "off" {
        counter!(CACHE_REQUESTS, "result" => cache).increment(1);
    }
}

pub fn upstream_answer(provider: &'static str, upstream: &str, seconds: f64) {
    histogram!(UPSTREAM_LATENCY, "provider" => provider, "upstream" => upstream.to_string())
        .record(seconds);
}

pub fn upstream_429(upstream: &str) {
    counter!(UPSTREAM_429, "upstream" => upstream.to_string()).increment(1);
}

pub fn remaining(token: i64, micros: i64, used_ratio: Option<f64>) {
    gauge!(QUOTA_REMAINING, "token" => token.to_string()).set(micros as f64 / 1e6);
    if let Some(r) = used_ratio {
        gauge!(TOKEN_BUDGET_USED, "token" => token.to_string()).set(r);
    }
}

pub fn absorbed(micros: i64) {
    if micros > 0 {
        counter!(ABSORBED).increment(micros as u64);
    }
}

pub fn password_verified() {
    counter!(PASSWORD_VERIFICATIONS).increment(1);
}

pub fn password_busy() {
    counter!(PASSWORD_BUSY).increment(1);
}

/// One answer whose upstream request left these client fields out (a fixed set of names).
pub fn dropped(fields: &[&'static str]) {
    for f in fields {
        counter!(TRANSLATION_DROPPED, "field" => *f).increment(1);
    }
}

/// One answer served at a tier priced apart from the standard rates (a fixed set of labels,
/// `providers::tier::priced_apart`).
pub fn served_tier(upstream: &str, tier: &'static str) {
    counter!(SERVED_TIER, "upstream" => upstream.to_string(), "tier" => tier).increment(1);
}

pub fn catalog_stale(stale: bool) {
    gauge!(CATALOG_STALE).set(if stale { 1.0 } else { 0.0 });
}

/// A cache hit answered without its budget header; `reason` is `failed`, `late` or
/// `deadline`.
pub fn cache_budget_left_out(reason: &'static str) {
    counter!(CACHE_BUDGET_LEFT_OUT, "reason" => reason).increment(1);
}

/// An answer the cache did not store; `reason` is `behind` or `invalidated` (`refused` is
/// counted by the store and read at scrape time).
pub fn cache_store_dropped(reason: &'static str) {
    counter!(CACHE_STORES_DROPPED, "reason" => reason).increment(1);
}

pub fn heap_trim(rule: &'static str) {
    counter!(HEAP_TRIMS, "rule" => rule).increment(1);
}

pub fn alert(kind: &'static str) {
    counter!(ALERTS, "kind" => kind).increment(1);
}

/// What the scrape-time gauges are computed from, handed in by the caller (this module
/// stays below `state`, which reaches it through the alerts and the request log).
pub struct Scrape<'a> {
    /// The moment, as the pool counts its rests (`Clock::monotonic_ms`).
    pub now_ms: i64,
    pub live: &'a Snapshot,
    pub queue_depth: &'a [usize],
    pub ratelimit_degraded: bool,
    /// Cache entries the table refused so far (`store::cache::refused_so_far`).
    pub cache_rows_refused: u64,
}

/// Gauges computed at scrape time, then the rendered text.
pub fn render(scrape: &Scrape<'_>) -> String {
    let now_ms = scrape.now_ms;
    let (catalog, pool) = (&scrape.live.catalog, &scrape.live.pool);
    for (d, dep) in catalog.deployments.iter().enumerate() {
        if catalog.retired[d] {
            continue;
        }
        gauge!(BREAKER_STATE, "upstream" => dep.id.clone()).set(pool.breakers[d].state().gauge());
    }
    for name in &catalog.names {
        if let Some(m) = catalog.model(name) {
            let available = m
                .routes
                .iter()
                .filter(|r| {
                    let d = r.deployment;
                    catalog.usable(d)
                        && !pool.is_disabled(d)
                        && pool.cooling_ms(d, now_ms) == 0
                        && pool.breakers[d].state() != crate::upstream::breaker::State::Open
                })
                .count();
            gauge!(KEYPOOL_AVAILABLE, "model" => name.clone()).set(available as f64);
        }
    }
    for (i, depth) in scrape.queue_depth.iter().enumerate() {
        gauge!(QUEUE_DEPTH, "priority" => (i + 1).to_string()).set(*depth as f64);
    }
    gauge!(RATELIMIT_DEGRADED).set(if scrape.ratelimit_degraded { 1.0 } else { 0.0 });
    counter!(CACHE_STORES_DROPPED, "reason" => "refused").absolute(scrape.cache_rows_refused);
    install().map(PrometheusHandle::render).unwrap_or_default()
}

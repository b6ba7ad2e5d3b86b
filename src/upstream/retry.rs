//! The retry table: every failed upstream attempt is classified here, and the request path
//! (`pipeline::attempts`) acts on the tier — nowhere else decides whether to retry.
//!
//! | upstream answer                               | tier            | what happens                                      |
//! |-----------------------------------------------|-----------------|---------------------------------------------------|
//! | 429 rate limit                                | `RateLimited`   | key cools down (Retry-After, else 2^n s, capped); next key at once; all keys limited → 429 to the client |
//! | 503, 529 overloaded; an HTTP/2 stream refused on every resend | `Overloaded`    | key cools down; next key; none left → jittered backoff within the deadline and attempt cap, never inside a key's cooldown |
//! | out of money: 429/403 `insufficient_quota` / `billing_hard_limit_reached` / `billing_not_active` / "credit balance" — not a bare "billing", which OpenAI's free-tier rate limit links (Azure: `QuotaExceeded`, "Out of call volume quota"; Google: a per-day or zero-limit `QuotaFailure`), 402, a 400 whose error says so (Anthropic's "credit balance is too low", OpenAI's `billing_hard_limit_reached`) | `QuotaExhausted`| key disabled until re-enabled; alert; next key; never retried; the client never sees the upstream's billing text |
//! | 500, 502, 504, 408, timeout, connection, garbage | `ServerError` | no retry on the same key; counts toward its breaker; next key / fallback |
//! | 409 conflict                                  | `Conflict`      | transient (the SDKs retry it): next key; no cooldown, no breaker count |
//! | the request's own deadline ran out mid-attempt | `OutOfTime`    | no breaker count (the client's limit), except 3 unanswered probes in a row re-open a half-open breaker; the counted input is charged; no more attempts |
//! | 401, 403                                      | `AuthFailed`    | key disabled (possible leak or revocation); next key |
//! | 400, 404, 413, 422 (any other 4xx)            | `ClientError`   | returned to the client as it is; no retry         |
//! | none: the request waited in the gateway for room on its HTTP/2 connection (the server's stream cap) past the first-byte timeout or the deadline, not a piece of it sent | `Held` | no breaker count, no cooldown, no other key of that host (they share the connection); the next host's; every attempt held → 503 `upstream_busy` |
//! | none: the gateway itself ran out of open files, socket buffers or memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM` on connecting) | `LocalResources` | nothing reached the upstream: no breaker count, no cooldown, no other key (it would fail alike); 503 `service_degraded` with `Retry-After: 1`; a `local_resources` alert |
//!
//! A stream fails after its 200 too, before its finish: its upstream's own error event is
//! judged only when it names the upstream's own fault (`of_fault`: Anthropic's
//! `overloaded_error` is `Overloaded`, its `rate_limit_error` `RateLimited`, its `api_error`
//! and OpenAI's `server_error` `ServerError`; Gemini's and Bedrock's by the kind their
//! readers give them, `ErrorKind::fault`; any other error event gives no verdict), and a
//! stall, a break, an unreadable event or the hold limit is a `ServerError`; the key gets
//! that tier's verdict when the stream ends, but no other key is tried — the client has the
//! stream's first events. After the finish the answer is whole: the stream is the key's
//! success whatever follows (`pipeline::attempts::stream_ended`).
//!
//! An event or answer well-formed but holding a piece of a kind the gateway's reader does
//! not model (`Corrupt::Unsupported`, `UpstreamError::Unsupported`) is garbage to the
//! client and the run (a `ServerError`: charged alike, the next route tried before the
//! 200), but gives its key no verdict: the upstream answered well.
//!
//! 408 and 409 follow the official OpenAI and Anthropic SDKs, which retry 408, 409, 429
//! and every 5xx: passing them through would only make the client's SDK retry them.
//! Billing is read from the error's structure, not from any mention of the word: a 400 that
//! talks about billing in the client's own content stays the client's error.
//! A local shortage is the gateway's, not the upstream's: counted as a server error, a few
//! seconds of descriptor exhaustion under load would open every breaker for `open_seconds`
//! and keep answering 503 long after the descriptors were back.

use std::time::Duration;

use rand::Rng;

use super::providers::canonical::Fault;
use super::providers::formats::gemini;
use super::UpstreamError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    RateLimited,
    Overloaded,
    QuotaExhausted,
    ServerError,
    Conflict,
    OutOfTime,
    AuthFailed,
    ClientError,
    LocalResources,
    Held,
}

impl Tier {
    /// Its name in traces (`sluice.retry_tier`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::RateLimited => "rate_limited",
            Tier::Overloaded => "overloaded",
            Tier::QuotaExhausted => "quota_exhausted",
            Tier::ServerError => "server_error",
            Tier::Conflict => "conflict",
            Tier::OutOfTime => "out_of_time",
            Tier::AuthFailed => "auth_failed",
            Tier::ClientError => "client_error",
            Tier::LocalResources => "local_resources",
            Tier::Held => "held",
        }
    }
}

pub fn classify(err: &UpstreamError) -> Tier {
    match err {
        UpstreamError::Timeout
        | UpstreamError::Connect(_)
        | UpstreamError::Broken
        | UpstreamError::Garbage(_)
        | UpstreamError::Unsupported => Tier::ServerError,
        UpstreamError::Deadline => Tier::OutOfTime,
        UpstreamError::LocalResources(_) => Tier::LocalResources,
        UpstreamError::Held => Tier::Held,
        UpstreamError::Refused => Tier::Overloaded,
        // A typed Bedrock error (`x-amzn-ErrorType`) is classified by its type first.
        UpstreamError::Status { status, body, .. } => {
            super::providers::bedrock::tier(body).unwrap_or_else(|| by_status(*status, body))
        }
    }
}

/// The tier of the upstream's own fault an error event named in the middle of a stream.
pub fn of_fault(fault: Fault) -> Tier {
    match fault {
        Fault::Overloaded => Tier::Overloaded,
        Fault::RateLimited => Tier::RateLimited,
        Fault::Server => Tier::ServerError,
    }
}

fn by_status(status: u16, body: &[u8]) -> Tier {
    match status {
        s if out_of_money(s, body) => Tier::QuotaExhausted,
        429 => Tier::RateLimited,
        503 | 529 => Tier::Overloaded,
        401 | 403 => Tier::AuthFailed,
        408 => Tier::ServerError,
        409 => Tier::Conflict,
        400..=499 => Tier::ClientError,
        _ => Tier::ServerError,
    }
}

/// Whether an error answer says the key's account is out of money. 429/403 carry no client
/// fault, so an out-of-money code or sentence anywhere decides; a 400 must say so in its
/// error's own fields.
fn out_of_money(status: u16, body: &[u8]) -> bool {
    match status {
        402 => true,
        429 | 403 => {
            // Google's RESOURCE_EXHAUSTED says "billing details" on every rate limit: its
            // QuotaFailure detail decides (`formats::gemini::is_quota`).
            if let Some(google) = google_exhausted(body) {
                return gemini::is_quota(&google);
            }
            let b = String::from_utf8_lossy(&body[..body.len().min(4096)]).to_ascii_lowercase();
            // Azure: "Out of call volume quota …" (403) and the `QuotaExceeded` code. Not a
            // bare "billing": OpenAI's rate limit for a free-trial account links its billing
            // page, and would disable the key for good (s24 attack, resilience #3).
            b.contains("insufficient_quota")
                || b.contains("billing_hard_limit_reached")
                || b.contains("billing hard limit")
                || b.contains("billing_not_active")
                || b.contains("credit balance")
                || b.contains("out of call volume quota")
                || b.contains("\"quotaexceeded\"")
        }
        400 => {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
                return false;
            };
            let field = |p: &str| {
                v.pointer(p)
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
            };
            // OpenAI: a billing code. Anthropic: `invalid_request_error` whose message
            // *begins* with its out-of-credit sentence — a 400 message often quotes the
            // client's own input (an unknown field, a bad role), so the words anywhere else
            // in it are the client's, and must not disable the pool's keys.
            matches!(
                field("/error/code"),
                "insufficient_quota" | "billing_hard_limit_reached" | "billing_not_active"
            ) || (field("/error/type") == "invalid_request_error"
                && field("/error/message")
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("your credit balance is too low"))
        }
        _ => false,
    }
}

/// A Google `RESOURCE_EXHAUSTED` error body (plain, or Vertex's array of one), parsed.
fn google_exhausted(body: &[u8]) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let err = match &v {
        serde_json::Value::Array(a) => a.first()?.get("error")?,
        _ => v.get("error")?,
    };
    (err.get("status")? == "RESOURCE_EXHAUSTED").then_some(v)
}

/// The shortest rest of a key the upstream limited: an upstream answering every 429 with
/// `Retry-After: 0` (a relay's default, a hostile one) left the key never rested, every
/// request's first attempt spent on it (s29 limits attack F3). A second is the least the
/// gateway tells its own clients to wait (`Retry-After` is whole seconds).
const MIN_REST: Duration = Duration::from_secs(1);

/// A key's cooldown after its `streak`-th consecutive rate limit: the upstream's
/// `Retry-After` when given, at least `MIN_REST`; else 2^(streak−1) seconds; never above
/// `cap`. A given `Retry-After` does not grow with the streak: the streak counts every
/// request a burst sent at once, and twenty simultaneous 429s saying "2 s" rested the key
/// the cap (the s29 stop attack's finding on a first mend).
pub fn cooldown(retry_after: Option<Duration>, streak: u32, cap: Duration) -> Duration {
    let d = match retry_after {
        Some(given) => given.max(MIN_REST),
        None => Duration::from_secs(1u64 << streak.saturating_sub(1).min(16)),
    };
    d.min(cap)
}

/// Full-jitter backoff before retry round `round` (1-based): uniform in [0, base × 2^(round−1)].
pub fn backoff(base: Duration, round: u32) -> Duration {
    let ceiling = base.saturating_mul(1u32 << round.saturating_sub(1).min(10));
    let ms = ceiling.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(rand::thread_rng().gen_range(0..=ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn status(s: u16, body: &str) -> UpstreamError {
        UpstreamError::Status {
            status: s,
            body: Bytes::from(body.to_string()),
            retry_after: None,
        }
    }

    #[test]
    fn bedrock_errors_are_classified_by_their_type() {
        // As the gateway's client leaves them: the `x-amzn-ErrorType` header's type in
        // `__type`. ServiceQuotaExceededException is a 400 and ModelNotReadyException a 429,
        // so the status alone would pass the quota error to the client and cool the key
        // down for a model that is loading.
        let typed = |ty: &str| {
            format!(
                r#"{{"message":"m","__type":"{ty}:http://internal.amazon.com/coral/com.amazon.bedrock/"}}"#
            )
        };
        for (s, ty, tier) in [
            (400, "ServiceQuotaExceededException", Tier::QuotaExhausted),
            (429, "ThrottlingException", Tier::RateLimited),
            (429, "ModelNotReadyException", Tier::Overloaded),
            (503, "ServiceUnavailableException", Tier::Overloaded),
            (408, "ModelTimeoutException", Tier::ServerError),
            (400, "ValidationException", Tier::ClientError),
            (403, "AccessDeniedException", Tier::AuthFailed),
            (404, "ResourceNotFoundException", Tier::ClientError),
        ] {
            assert_eq!(classify(&status(s, &typed(ty))), tier, "{ty}");
        }
    }

    #[test]
    fn a_client_quoted_in_a_400_cannot_pass_for_out_of_credit() {
        for echo in [
            "Unrecognized request argument supplied: credit balance is too low",
            "messages.0.role: Input tag 'Your credit balance is too low' found using 'role' does not match",
        ] {
            let body = serde_json::json!({"error": {"type": "invalid_request_error", "message": echo}});
            assert_eq!(classify(&status(400, &body.to_string())), Tier::ClientError, "{echo}");
        }
        let real = serde_json::json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}});
        assert_eq!(
            classify(&status(400, &real.to_string())),
            Tier::QuotaExhausted
        );
    }

    /// Azure's quota signals: a 403 "Out of call volume quota" (the subscription's quota,
    /// replenished later) and a `QuotaExceeded` code are out of money, not a refused key
    /// and not a rate limit; its ordinary 429 — whose text links to a quota-increase page —
    /// stays a rate limit.
    #[test]
    fn azure_quota_is_out_of_money_and_its_rate_limit_is_not() {
        let out_of_volume = r#"{"error":{"code":"403","message":"Out of call volume quota for OpenAI API. Quota will be replenished in 2.12:34:56."}}"#;
        assert_eq!(classify(&status(403, out_of_volume)), Tier::QuotaExhausted);
        let exceeded = r#"{"error":{"code":"QuotaExceeded","message":"The monthly quota of this resource is used up."}}"#;
        assert_eq!(classify(&status(429, exceeded)), Tier::QuotaExhausted);
        let rate = crate::mock::azure::rate_limit_error().to_string();
        assert_eq!(classify(&status(429, &rate)), Tier::RateLimited);
    }

    #[test]
    fn the_table() {
        assert_eq!(
            classify(&status(429, r#"{"error":{"type":"requests"}}"#)),
            Tier::RateLimited
        );
        assert_eq!(
            classify(&status(429, r#"{"error":{"code":"insufficient_quota"}}"#)),
            Tier::QuotaExhausted
        );
        assert_eq!(
            classify(&status(403, "billing hard limit reached")),
            Tier::QuotaExhausted
        );
        let inactive = r#"{"error":{"message":"Your account is not active, please check your billing details on our website.","type":"billing_not_active","param":null,"code":"billing_not_active"}}"#;
        assert_eq!(classify(&status(429, inactive)), Tier::QuotaExhausted);
        // OpenAI's rate limit for an account on free-trial limits links the billing page: a
        // rate limit (cool down), not a spent quota (disabled until an admin acts) — a bare
        // "billing" anywhere disabled the key for good (s24 attack, resilience #3).
        let free_tier = r#"{"error":{"message":"Rate limit reached for default-gpt-3.5-turbo in organization org-x on requests per min. Limit: 3 / min. Please try again in 20s. Contact us through our help center at help.openai.com if you continue to have issues. Please add a payment method to your account to increase your rate limit. Visit https://platform.openai.com/account/billing to add a payment method.","type":"requests","param":null,"code":null}}"#;
        assert_eq!(classify(&status(429, free_tier)), Tier::RateLimited);
        assert_eq!(classify(&status(503, "")), Tier::Overloaded);
        assert_eq!(classify(&status(529, "")), Tier::Overloaded);
        for s in [500, 502, 504] {
            assert_eq!(classify(&status(s, "")), Tier::ServerError);
        }
        assert_eq!(classify(&UpstreamError::Timeout), Tier::ServerError);
        assert_eq!(classify(&status(401, "")), Tier::AuthFailed);
        assert_eq!(classify(&status(403, "forbidden")), Tier::AuthFailed);
        for s in [400, 404, 413, 422] {
            assert_eq!(classify(&status(s, "")), Tier::ClientError);
        }
        assert_eq!(classify(&status(408, "")), Tier::ServerError);
        assert_eq!(classify(&status(409, "")), Tier::Conflict);
        assert_eq!(classify(&status(402, "")), Tier::QuotaExhausted);
        assert_eq!(classify(&UpstreamError::Deadline), Tier::OutOfTime);
        assert_eq!(
            classify(&UpstreamError::LocalResources("open files")),
            Tier::LocalResources
        );
        assert_eq!(
            classify(&UpstreamError::Connect("connect".into())),
            Tier::ServerError
        );
    }

    #[test]
    fn only_a_400_that_says_the_account_is_out_of_money_is_quota() {
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
        assert_eq!(classify(&status(400, anthropic)), Tier::QuotaExhausted);
        let openai = r#"{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}"#;
        assert_eq!(classify(&status(400, openai)), Tier::QuotaExhausted);
        for client in [
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.0: text about billing and my credit balance"}}"#,
            r#"{"error":{"message":"Unknown parameter: 'billing'.","type":"invalid_request_error","param":"billing","code":"unknown_parameter"}}"#,
            "credit balance is too low",
        ] {
            assert_eq!(
                classify(&status(400, client)),
                Tier::ClientError,
                "{client}"
            );
        }
    }

    /// Google answers a per-minute rate limit with RESOURCE_EXHAUSTED whose message says
    /// "check your plan and billing details": only its QuotaFailure detail tells a spent
    /// daily quota from a rate limit (`providers::formats::gemini::is_quota`).
    #[test]
    fn a_gemini_rate_limit_that_mentions_billing_is_a_rate_limit_not_a_spent_quota() {
        let fixture = |name| crate::upstream::providers::formats::fixtures::text("gemini", name);
        assert_eq!(
            classify(&status(429, &fixture("error_rate_limited.json"))),
            Tier::RateLimited
        );
        assert_eq!(
            classify(&status(429, &fixture("error_quota_per_day.json"))),
            Tier::QuotaExhausted
        );
    }

    #[test]
    fn cooldowns_and_backoff() {
        let cap = Duration::from_secs(120);
        assert_eq!(
            cooldown(Some(Duration::from_secs(2)), 1, cap),
            Duration::from_secs(2)
        );
        assert_eq!(cooldown(None, 1, cap), Duration::from_secs(1));
        assert_eq!(cooldown(None, 3, cap), Duration::from_secs(4));
        assert_eq!(cooldown(None, 30, cap), cap);
        assert_eq!(cooldown(Some(Duration::from_secs(999)), 1, cap), cap);
        // A zero (or short) rest is a second; a given one does not grow with the streak.
        assert_eq!(
            cooldown(Some(Duration::ZERO), 1, cap),
            Duration::from_secs(1)
        );
        assert_eq!(
            cooldown(Some(Duration::from_millis(300)), 3, cap),
            Duration::from_secs(1)
        );
        assert_eq!(
            cooldown(Some(Duration::from_secs(2)), 20, cap),
            Duration::from_secs(2)
        );
        assert_eq!(
            cooldown(Some(Duration::from_millis(1_500)), 2, cap),
            Duration::from_millis(1_500)
        );
        for round in 1..5 {
            assert!(
                backoff(Duration::from_millis(100), round)
                    <= Duration::from_millis(100 << (round - 1))
            );
        }
    }
}

/// Keeps retries to one deployment at most `ratio` of its first attempts, plus a floor, over
/// a rolling window, so a dying upstream is not hammered by retries.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    state: parking_lot::Mutex<BudgetWindow>,
}

#[derive(Debug)]
struct BudgetWindow {
    start: std::time::Instant,
    firsts: u32,
    retries: u32,
}

/// Retries always allowed per window, so a quiet deployment can still be retried.
const RETRY_FLOOR: u32 = 10;
const BUDGET_WINDOW: Duration = Duration::from_secs(10);

impl RetryBudget {
    pub fn new(ratio: f64) -> Self {
        Self {
            ratio,
            state: parking_lot::Mutex::new(BudgetWindow {
                start: std::time::Instant::now(),
                firsts: 0,
                retries: 0,
            }),
        }
    }

    fn window(&self) -> parking_lot::MutexGuard<'_, BudgetWindow> {
        let mut w = self.state.lock();
        if w.start.elapsed() > BUDGET_WINDOW {
            *w = BudgetWindow {
                start: std::time::Instant::now(),
                firsts: 0,
                retries: 0,
            };
        }
        w
    }

    /// Counts a request's first attempt (it funds the budget).
    pub fn first_attempt(&self) {
        self.window().firsts += 1;
    }

    /// Takes one retry from the budget; `false` when it is spent.
    pub fn try_retry(&self) -> bool {
        let mut w = self.window();
        let allowed = RETRY_FLOOR + (self.ratio * f64::from(w.firsts)) as u32;
        if w.retries < allowed {
            w.retries += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn retries_stay_within_ten_percent_plus_the_floor() {
        let b = RetryBudget::new(0.10);
        for _ in 0..1000 {
            b.first_attempt();
        }
        let granted = (0..1000).filter(|_| b.try_retry()).count();
        assert_eq!(granted, 110);
    }
}

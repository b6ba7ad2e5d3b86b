//! Google's error body, `{"error": {"code", "message", "status", "details"}}`, → `ErrorInfo`.
//!
//! `RESOURCE_EXHAUSTED` (429) is how Google says both "too many requests this minute" and
//! "this key's daily or billing quota is spent", and its message says "quota" (and often
//! "billing details") either way. What tells them apart is the `QuotaFailure` detail: a
//! violated quota counted per day (`…PerDay…`), or one whose limit is 0 (a project without
//! billing for that model), will not come back within a cooldown — the key is out of quota;
//! per-minute ones are a rate limit.

use std::time::Duration;

use serde_json::Value;

use crate::upstream::providers::canonical::{ErrorInfo, ErrorKind};

/// Whether Google's `status` names a fault of the upstream's own — what a mid-stream error
/// judges its key by. A kind read from a bare number or an unknown status (`CANCELLED`, an
/// error with neither) names none (s28 late attack F7: they read as server errors).
pub fn names_a_fault(status: &str) -> bool {
    matches!(
        status,
        "UNAVAILABLE" | "RESOURCE_EXHAUSTED" | "INTERNAL" | "DEADLINE_EXCEEDED"
    )
}

/// Vertex AI wraps some error bodies in an array of one (`[{"error": …}]`): read either.
pub fn read_error(status: u16, body: &Value) -> ErrorInfo {
    let body = unwrap(body);
    let err = body.get("error");
    let field = |k: &str| err.and_then(|e| e.get(k)).and_then(Value::as_str);
    let google_status = field("status");
    let kind = match google_status {
        Some("RESOURCE_EXHAUSTED") if is_quota(body) => ErrorKind::QuotaExhausted,
        Some("RESOURCE_EXHAUSTED") => ErrorKind::RateLimited,
        Some("UNAVAILABLE") => ErrorKind::Overloaded,
        Some("INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE") => {
            ErrorKind::InvalidRequest
        }
        Some("PERMISSION_DENIED") => ErrorKind::PermissionDenied,
        Some("UNAUTHENTICATED") => ErrorKind::Authentication,
        Some("NOT_FOUND") => ErrorKind::NotFound,
        _ => match status {
            400 | 409 | 422 => ErrorKind::InvalidRequest,
            401 => ErrorKind::Authentication,
            403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            413 => ErrorKind::RequestTooLarge,
            429 => ErrorKind::RateLimited,
            503 | 529 => ErrorKind::Overloaded,
            _ => ErrorKind::Server,
        },
    };
    ErrorInfo {
        status,
        kind,
        message: field("message")
            .map(str::to_string)
            .unwrap_or_else(|| format!("The Gemini upstream answered {status}.")),
        code: google_status.map(str::to_string),
        param: None,
    }
}

/// Whether a `RESOURCE_EXHAUSTED` body says the key's quota is spent (daily, or none at
/// all), not a per-minute rate limit.
pub fn is_quota(body: &Value) -> bool {
    let body = unwrap(body);
    let Some(details) = body.pointer("/error/details").and_then(Value::as_array) else {
        return false;
    };
    details
        .iter()
        .filter(|d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("google.rpc.QuotaFailure"))
        })
        .filter_map(|d| d.get("violations").and_then(Value::as_array))
        .flatten()
        .any(|v| {
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            s("quotaId").contains("PerDay")
                || s("quotaMetric").contains("per_day")
                || s("quotaValue") == "0"
        })
}

/// The wait a `RetryInfo` detail asks for (`"retryDelay": "38s"`, or with a fraction);
/// Google sends it in the body instead of a `Retry-After` header.
pub fn retry_delay(body: &Value) -> Option<Duration> {
    unwrap(body)
        .pointer("/error/details")?
        .as_array()?
        .iter()
        .filter(|d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|d| {
            d.get("retryDelay")?
                .as_str()?
                .strip_suffix('s')?
                .parse::<f64>()
                .ok()
        })
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 86_400.0)
        .map(Duration::from_secs_f64)
}

fn unwrap(body: &Value) -> &Value {
    match body {
        Value::Array(a) => a.first().unwrap_or(body),
        _ => body,
    }
}

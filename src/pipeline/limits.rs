//! Every number a client sends, range-checked before anything is reserved: the `x-sluice-*`
//! request headers and the body fields Sluice does not otherwise price (penalties, log
//! probabilities, seeds, dimensions, thinking budgets). Out of range → 400 naming the
//! header or field, in the route's format. The output-side numbers (`max_tokens`, `n`,
//! `best_of`) and `temperature` / `top_p` are checked in `request`, where they are used;
//! `x-sluice-cache-ttl` belongs to the cache (`cache::Cache::plan`).

use actix_web::http::header::HeaderMap;
use serde_json::{Map, Value};

use super::request::number_in;
use crate::endpoint::Endpoint;
use crate::error::ApiError;

/// What the client asked for in its `x-sluice-*` headers, parsed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHeaders {
    /// 1 CRITICAL … 4 LOW, already capped by the token's `max_priority`.
    pub priority: u8,
    /// `x-sluice-request-deadline-ms`, when sent (capped by the config later).
    pub deadline_ms: Option<u64>,
}

/// Parses the numeric `x-sluice-*` headers. `max_priority` is the token's most urgent
/// allowed priority.
pub fn client_headers(headers: &HeaderMap, max_priority: i64) -> Result<ClientHeaders, ApiError> {
    let text = |name: &'static str, rule: &'static str| -> Result<Option<&str>, ApiError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(|s| Some(s.trim()))
                .map_err(|_| ApiError::invalid(name, rule)),
        }
    };
    const PRIORITY: &str = "x-sluice-priority must be 1, 2, 3 or 4";
    let asked = match text("x-sluice-priority", PRIORITY)? {
        None => 3,
        Some(s) => s
            .parse::<u8>()
            .ok()
            .filter(|p| (1..=4).contains(p))
            .ok_or_else(|| ApiError::invalid("x-sluice-priority", PRIORITY))?,
    };
    // Larger than the configured deadline is allowed (it is capped); zero, negative,
    // fractional or past u64 is not a deadline.
    const DEADLINE: &str =
        "x-sluice-request-deadline-ms must be a whole number of milliseconds, at least 1";
    let deadline_ms = match text("x-sluice-request-deadline-ms", DEADLINE)? {
        None => None,
        Some(s) => Some(
            s.parse::<u64>()
                .ok()
                .filter(|ms| *ms >= 1)
                .ok_or_else(|| ApiError::invalid("x-sluice-request-deadline-ms", DEADLINE))?,
        ),
    };
    Ok(ClientHeaders {
        priority: asked.max(max_priority.clamp(1, 4) as u8),
        deadline_ms,
    })
}

/// An integer field within `lo..=hi` (absent or null passes).
fn integer_in(
    body: &Map<String, Value>,
    field: &'static str,
    lo: i64,
    hi: i64,
) -> Result<(), ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(v) => match v.as_i64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(()),
            _ => Err(ApiError::invalid(
                field,
                format!("`{field}` must be an integer between {lo} and {hi}"),
            )),
        },
    }
}

/// Most output dimensions an embeddings request may ask for.
pub const MAX_DIMENSIONS: i64 = 65_536;

/// The body's other numbers, by endpoint, with the ranges the providers document.
pub fn body_numbers(endpoint: Endpoint, body: &Map<String, Value>) -> Result<(), ApiError> {
    match endpoint {
        Endpoint::Chat | Endpoint::Completions => {
            number_in(body, "frequency_penalty", -2.0, 2.0)?;
            number_in(body, "presence_penalty", -2.0, 2.0)?;
            if body
                .get("seed")
                .is_some_and(|s| !(s.is_null() || s.is_i64() || s.is_u64()))
            {
                return Err(ApiError::invalid("seed", "`seed` must be an integer"));
            }
            logit_bias(body)?;
            if endpoint == Endpoint::Chat {
                integer_in(body, "top_logprobs", 0, 20)
            } else {
                integer_in(body, "logprobs", 0, 5)
            }
        }
        Endpoint::Embeddings => {
            // One embedding per input; an `n` would multiply work nobody priced.
            integer_in(body, "n", 1, 1)?;
            integer_in(body, "dimensions", 1, MAX_DIMENSIONS)
        }
        Endpoint::Messages => {
            integer_in(body, "top_k", 0, i64::from(u32::MAX))?;
            thinking_budget(body)
        }
        Endpoint::Responses => {
            // One answer per request: `n` is no Responses field, and would multiply
            // output nobody priced.
            integer_in(body, "n", 1, 1)?;
            integer_in(body, "top_logprobs", 0, 20)?;
            integer_in(body, "max_tool_calls", 1, i64::from(u32::MAX))
        }
    }
}

/// `logit_bias`: an object of token ids to numbers in -100..=100.
fn logit_bias(body: &Map<String, Value>) -> Result<(), ApiError> {
    const RULE: &str = "`logit_bias` must map token ids to numbers between -100 and 100";
    match body.get("logit_bias") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m))
            if m.iter().all(|(k, v)| {
                k.parse::<u64>().is_ok()
                    && v.as_f64().is_some_and(|x| (-100.0..=100.0).contains(&x))
            }) =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::invalid("logit_bias", RULE)),
    }
}

/// `thinking.budget_tokens` counts inside `max_tokens` (so the reservation covers it): an
/// integer of at least 1 and below `max_tokens`, as Anthropic requires.
fn thinking_budget(body: &Map<String, Value>) -> Result<(), ApiError> {
    let Some(budget) = body.get("thinking").and_then(|t| t.get("budget_tokens")) else {
        return Ok(());
    };
    let max = body
        .get("max_tokens")
        .and_then(Value::as_i64)
        .unwrap_or(i64::MAX);
    match budget.as_i64() {
        Some(b) if b >= 1 && b < max => Ok(()),
        _ => Err(ApiError::invalid(
            "thinking",
            "`thinking.budget_tokens` must be an integer of at least 1 and below `max_tokens`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_static(k),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_out_of_range_name_themselves() {
        let ok = client_headers(&headers(&[]), 2).unwrap();
        assert_eq!((ok.priority, ok.deadline_ms), (3, None));
        let capped = client_headers(&headers(&[("x-sluice-priority", b"1")]), 2).unwrap();
        assert_eq!(capped.priority, 2);
        let d = client_headers(
            &headers(&[("x-sluice-request-deadline-ms", b"18446744073709551615")]),
            2,
        );
        assert_eq!(d.unwrap().deadline_ms, Some(u64::MAX));
        for (name, value) in [
            ("x-sluice-priority", &b"0"[..]),
            ("x-sluice-priority", b"5"),
            ("x-sluice-priority", b"-1"),
            ("x-sluice-priority", b"256"),
            ("x-sluice-priority", b"2.0"),
            ("x-sluice-priority", b"\xff"),
            ("x-sluice-request-deadline-ms", b"0"),
            ("x-sluice-request-deadline-ms", b"-5"),
            ("x-sluice-request-deadline-ms", b"1e3"),
            ("x-sluice-request-deadline-ms", b"abc"),
            ("x-sluice-request-deadline-ms", b"18446744073709551616"),
            ("x-sluice-request-deadline-ms", b"\xc3\xa9"),
        ] {
            match client_headers(&headers(&[(name, value)]), 2) {
                Err(ApiError::InvalidRequest { param, .. }) => {
                    assert_eq!(param.as_deref(), Some(name))
                }
                other => panic!("{name}: {value:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn body_numbers_out_of_range_name_themselves() {
        let cases = [
            (
                Endpoint::Chat,
                json!({"frequency_penalty": 2.5}),
                "frequency_penalty",
            ),
            (
                Endpoint::Chat,
                json!({"presence_penalty": "1"}),
                "presence_penalty",
            ),
            (Endpoint::Chat, json!({"seed": 1.5}), "seed"),
            (
                Endpoint::Chat,
                json!({"logit_bias": {"50256": 101}}),
                "logit_bias",
            ),
            (
                Endpoint::Chat,
                json!({"logit_bias": {"x": 1}}),
                "logit_bias",
            ),
            (Endpoint::Chat, json!({"top_logprobs": 21}), "top_logprobs"),
            (Endpoint::Completions, json!({"logprobs": 6}), "logprobs"),
            (Endpoint::Embeddings, json!({"dimensions": 0}), "dimensions"),
            (
                Endpoint::Embeddings,
                json!({"n": 5252150412692178459i64}),
                "n",
            ),
            (
                Endpoint::Embeddings,
                json!({"dimensions": 1e12}),
                "dimensions",
            ),
            (Endpoint::Messages, json!({"top_k": -1}), "top_k"),
            (
                Endpoint::Messages,
                json!({"max_tokens": 100, "thinking": {"type": "enabled", "budget_tokens": 100}}),
                "thinking",
            ),
            (
                Endpoint::Messages,
                json!({"max_tokens": 100, "thinking": {"budget_tokens": -9223372036854775808i64}}),
                "thinking",
            ),
        ];
        for (endpoint, body, field) in cases {
            let Value::Object(body) = body else {
                unreachable!()
            };
            match body_numbers(endpoint, &body) {
                Err(ApiError::InvalidRequest { param, .. }) => {
                    assert_eq!(param.as_deref(), Some(field))
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        let fine = json!({"seed": -3, "logit_bias": {"50256": -100}, "top_logprobs": 20, "presence_penalty": -2});
        let Value::Object(fine) = fine else {
            unreachable!()
        };
        assert!(body_numbers(Endpoint::Chat, &fine).is_ok());
    }
}

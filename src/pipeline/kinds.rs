//! What a request may make the upstream bill beyond plain input and output tokens, read
//! from the client's body so the reservation covers it (`pipeline::reservation_amount`):
//! prompt-cache writes (a `cache_control` mark anywhere; one-hour ones with
//! `ttl: "1h"`), audio in or out, and Anthropic's server tools: web searches (billed per
//! call) and web fetches, whose results come back to the model as input. A search or
//! fetch without a cap gets the gateway's; what the gateway cannot bound — code execution
//! (billed per container-hour), MCP servers, server tools it does not know, service tiers,
//! fast mode and data residency priced apart — is refused with a 400 naming the field.

use serde_json::{Map, Value};

mod server_tools;
mod turn;

pub use turn::Turn;

use crate::config::{BilledFields, FinanceSettings, Provider, BILLED_ROUTER_FIELDS};
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::quota::pricing::InputKinds;
use crate::upstream::providers;

/// The kinds a request may be billed for, the most web-search calls it may make, and the
/// most input its server tools may add.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    pub input: InputKinds,
    /// The request asks for audio out (`modalities` with `audio`, or `audio`).
    pub audio_output: bool,
    /// The most web-search calls the upstream may make and bill.
    pub web_search_calls: i64,
    /// The server tools' calls and the input their results may bring back (searches and
    /// fetches, each call its allowance): every step of the turn is billed its context.
    pub server_tools: Turn,
}

/// Reads the kinds of `body`. An Anthropic web-search or web-fetch tool without
/// `max_uses` gets `[finance] max_server_tool_calls` as its cap, a web fetch without
/// `max_content_tokens` gets `[finance] server_tool_input_tokens_per_call`, both sent
/// upstream with it.
pub fn read(
    endpoint: Endpoint,
    body: &mut Map<String, Value>,
    finance: &FinanceSettings,
) -> Result<Kinds, ApiError> {
    let mut kinds = Kinds::default();
    // The body itself too: a `cache_control` at its top is Anthropic's automatic caching
    // (s27 attack, translated money #3).
    object_marks(body, &mut kinds.input);
    kinds.audio_output = !body.get("audio").is_none_or(Value::is_null)
        || body
            .get("modalities")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|x| x.as_str() == Some("audio")));
    kinds.input.audio |= kinds.audio_output;
    service_tier(endpoint, body)?;
    if endpoint == Endpoint::Chat && !body.get("web_search_options").is_none_or(Value::is_null) {
        return Err(ApiError::invalid(
            "web_search_options",
            "`web_search_options` is not accepted: the gateway cannot cap the number of \
             searches it makes, and each is billed. Use a model without built-in search.",
        ));
    }
    if endpoint == Endpoint::Chat && !body.get("prediction").is_none_or(Value::is_null) {
        return Err(ApiError::invalid(
            "prediction",
            "`prediction` is not accepted: the predicted tokens the model rejects are billed \
             as output beyond `max_tokens`, which the gateway cannot cap.",
        ));
    }
    if endpoint == Endpoint::Messages {
        server_tools::read(body, finance, &mut kinds)?;
    }
    Ok(kinds)
}

/// Service tiers are priced apart from the standard rates the gateway prices at
/// (`priority` ~1.7–2×, OpenAI's `flex` half, `scale` prepaid): only the standard tier is
/// accepted, so the ledger is the bill. OpenAI's `auto` and `default` and Anthropic's `auto`
/// and `standard_only` are the standard tier for an account without a priority commitment.
/// So are Anthropic's fast mode (`speed: "fast"`, a multiple of the standard rates) and
/// US-only inference (`inference_geo: "us"`, 1.1× on Opus / Sonnet 4.6 and later): only
/// `standard` and `global`, their defaults, are accepted — in every client format, for a
/// body that crosses no format reaches the upstream with every field it carries.
fn service_tier(endpoint: Endpoint, body: &Map<String, Value>) -> Result<(), ApiError> {
    let tiers: &[&str] = match endpoint {
        Endpoint::Messages => &["auto", "standard_only"],
        _ => &["auto", "default"],
    };
    standard_only(body, "service_tier", tiers, "other tiers")?;
    standard_only(body, "speed", &["standard"], "other speeds")?;
    standard_only(
        body,
        "inference_geo",
        &["global"],
        "other inference geographies",
    )
}

/// `field` of `body` absent, null or one of `allowed`; else a 400 naming it: `others`
/// are billed at other rates than the ones the gateway charges.
fn standard_only(
    body: &Map<String, Value>,
    field: &'static str,
    allowed: &[&str],
    others: &str,
) -> Result<(), ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if allowed.contains(&t.as_str()) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            field,
            format!(
                "`{field}` must be {}: {others} are billed at other rates than the ones this \
                 gateway charges",
                allowed.join(" or ")
            ),
        )),
    }
}

/// A request to `endpoint` for an upstream of `provider` that allows the billed router
/// fields `allowed` (`quirks.billed_fields`): on an `openai_compatible` upstream, a chat,
/// legacy completions or embeddings body — sent as it is, every field with it (a translated
/// one, Messages or Responses, carries only the fields its translation reads; a router
/// routes embeddings by `provider` and `models` as it routes chat) — holding one of `BILLED_ROUTER_FIELDS` not
/// allowed, and not null, is a 400 naming it: the router would bill what the gateway does
/// not price. Other providers are not routers: OpenAI refuses a field it does not know.
pub fn billed_router_fields(
    endpoint: Endpoint,
    body: &Map<String, Value>,
    provider: Provider,
    allowed: BilledFields,
) -> Result<(), ApiError> {
    if provider != Provider::OpenaiCompatible
        || !matches!(
            endpoint,
            Endpoint::Chat | Endpoint::Completions | Endpoint::Embeddings
        )
    {
        return Ok(());
    }
    let refused = BILLED_ROUTER_FIELDS
        .into_iter()
        .find(|f| !body.get(*f).is_none_or(Value::is_null) && !allowed.allows(f));
    match refused {
        None => Ok(()),
        Some(field) => Err(ApiError::invalid(
            field,
            format!(
                "`{field}` is not accepted: the upstream bills it apart from the token prices \
                 this gateway charges (an operator may allow it with the upstream's \
                 `quirks.billed_fields`)"
            ),
        )),
    }
}

/// An answer `provider`'s upstream says it served at `served`: a tier priced apart from
/// the standard rates the ledger charged (the request was sent the standard tier,
/// `providers::tier`, so the provider overrode it) is logged as a warning and counted
/// (`gateway_upstream_service_tier_total`). The request row has no place for it; the
/// difference shows in `sluice reconcile` too.
pub fn served_tier(provider: Provider, upstream: &str, served: Option<&str>) {
    let Some(tier) = served
        .filter(|_| providers::tier::pinned(provider))
        .and_then(providers::tier::priced_apart)
    else {
        return;
    };
    tracing::warn!(
        upstream,
        tier,
        "an answer was served at a service tier billed apart from the standard rates the ledger charged; check the provider project's default tier"
    );
    crate::ops::metrics::served_tier(upstream, tier);
}

/// Notes the cache marks and audio parts anywhere under `v`.
fn marks(v: &Value, kinds: &mut InputKinds) {
    match v {
        Value::Object(o) => object_marks(o, kinds),
        Value::Array(a) => a.iter().for_each(|x| marks(x, kinds)),
        _ => {}
    }
}

/// `marks` of an object: its own `cache_control` and type, then everything under it.
fn object_marks(o: &Map<String, Value>, kinds: &mut InputKinds) {
    if let Some(Value::Object(c)) = o.get("cache_control") {
        if c.get("ttl").and_then(Value::as_str) == Some("1h") {
            kinds.cache_write_1h = true;
        } else {
            kinds.cache_write_5m = true;
        }
    }
    if o.get("type").and_then(Value::as_str) == Some("input_audio") {
        kinds.audio = true;
    }
    o.values().for_each(|x| marks(x, kinds));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_json(endpoint: Endpoint, body: Value) -> (Result<Kinds, ApiError>, Value) {
        let Value::Object(mut m) = body else {
            panic!("not an object")
        };
        let r = read(endpoint, &mut m, &FinanceSettings::default());
        (r, Value::Object(m))
    }

    fn param(r: Result<Kinds, ApiError>) -> Option<String> {
        match r {
            Err(ApiError::InvalidRequest { param, .. }) => param.map(String::from),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn cache_marks_and_audio_are_found_wherever_they_are() {
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}),
        );
        let k = k.unwrap();
        assert!(k.input.cache_write_5m && k.input.cache_write_1h && !k.input.audio);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio",
                "input_audio": {"data": "", "format": "wav"}}]}]}),
        );
        let k = k.unwrap();
        assert!(k.input.audio && !k.audio_output && !k.input.cache_write_5m);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [], "modalities": ["text", "audio"]}),
        );
        assert!(k.unwrap().audio_output);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(k.unwrap(), Kinds::default());
    }

    /// Anthropic's automatic caching: one `cache_control` at the top of the request marks
    /// the last cacheable block (s27 attack, translated money #3: the body itself was not
    /// looked at, so the prompt was reserved at 1× and billed at the write rate).
    #[test]
    fn a_top_level_cache_control_marks_the_request_as_writing_the_cache() {
        for (ttl, one_hour) in [(json!("1h"), true), (json!(null), false)] {
            let (k, _) = read_json(
                Endpoint::Messages,
                json!({"cache_control": {"type": "ephemeral", "ttl": ttl},
                    "messages": [{"role": "user", "content": "hi"}]}),
            );
            let k = k.unwrap();
            assert_eq!(
                (k.input.cache_write_1h, k.input.cache_write_5m),
                (one_hour, !one_hour),
                "{ttl}"
            );
        }
    }

    #[test]
    fn web_search_is_capped_or_refused() {
        // No cap of the client's: the gateway's is sent and reserved for.
        let (k, body) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        );
        let k = k.unwrap();
        assert_eq!((k.web_search_calls, k.server_tools.pages), (5, 5 * 25_000));
        assert_eq!(body["tools"][0]["max_uses"], 5);
        // The client's own cap is kept and reserved for.
        let (k, body) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
                {"name": "f", "input_schema": {}}]}),
        );
        let k = k.unwrap();
        assert_eq!((k.web_search_calls, k.server_tools.pages), (2, 2 * 25_000));
        assert_eq!(body["tools"][0]["max_uses"], 2);
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "max_uses": 0}]}),
        );
        assert_eq!(param(k).as_deref(), Some("tools"));
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [], "web_search_options": {}}),
        );
        assert_eq!(param(k).as_deref(), Some("web_search_options"));
    }

    #[test]
    fn caps_past_what_a_request_can_use_are_refused_not_reserved_to_overflow() {
        // A cap near i64::MAX would reserve i64::MAX micro-dollars and overflow every
        // level's balance beside it: refused, naming the tools.
        for tool in [
            json!({"type": "web_search_20250305", "name": "web_search", "max_uses": i64::MAX}),
            json!({"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 101}),
            json!({"type": "web_fetch_20250910", "name": "web_fetch", "max_content_tokens": i64::MAX}),
        ] {
            let (k, _) = read_json(Endpoint::Messages, json!({"tools": [tool]}));
            assert_eq!(param(k).as_deref(), Some("tools"), "{tool}");
        }
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch",
                "max_uses": 100, "max_content_tokens": 1_000_000}]}),
        );
        assert_eq!(k.unwrap().server_tools.pages, 100_000_000);
    }

    #[test]
    fn web_fetch_is_capped_in_calls_and_content() {
        let (k, body) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
        );
        let k = k.unwrap();
        assert_eq!((k.web_search_calls, k.server_tools.pages), (0, 5 * 25_000));
        assert_eq!(body["tools"][0]["max_uses"], 5);
        assert_eq!(body["tools"][0]["max_content_tokens"], 25_000);
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch",
                "max_uses": 2, "max_content_tokens": 1000}]}),
        );
        assert_eq!(k.unwrap().server_tools.pages, 2000);
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_fetch_20250910", "max_content_tokens": "lots"}]}),
        );
        assert_eq!(param(k).as_deref(), Some("tools"));
    }

    #[test]
    fn unboundable_server_tools_and_dearer_tiers_are_refused() {
        for tool in [
            "code_execution_20250825",
            "tool_search_tool_bm25_20251119",
            "x_20300101",
        ] {
            let (k, _) = read_json(
                Endpoint::Messages,
                json!({"tools": [{"type": tool, "name": "t"}]}),
            );
            assert_eq!(param(k).as_deref(), Some("tools"), "{tool}");
        }
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}),
        );
        assert_eq!(param(k).as_deref(), Some("mcp_servers"));
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"mcp_servers": [], "tools": [{"type": "bash_20250124", "name": "bash"},
                {"type": "custom", "name": "f", "input_schema": {}}]}),
        );
        assert_eq!(k.unwrap(), Kinds::default());
        for (endpoint, tier, ok) in [
            (Endpoint::Chat, "priority", false),
            (Endpoint::Chat, "flex", false),
            (Endpoint::Responses, "scale", false),
            (Endpoint::Messages, "priority", false),
            (Endpoint::Messages, "default", false),
            (Endpoint::Chat, "default", true),
            (Endpoint::Responses, "auto", true),
            (Endpoint::Messages, "standard_only", true),
        ] {
            let (k, _) = read_json(endpoint, json!({"service_tier": tier}));
            if ok {
                assert!(k.is_ok(), "{tier}");
            } else {
                assert_eq!(param(k).as_deref(), Some("service_tier"), "{tier}");
            }
        }
    }

    #[test]
    fn fast_mode_and_us_only_inference_are_refused_in_every_format() {
        for endpoint in [Endpoint::Messages, Endpoint::Chat, Endpoint::Responses] {
            for (field, value, ok) in [
                ("speed", json!("fast"), false),
                ("speed", json!(true), false),
                ("speed", json!("standard"), true),
                ("speed", Value::Null, true),
                ("inference_geo", json!("us"), false),
                ("inference_geo", json!("eu"), false),
                ("inference_geo", json!("global"), true),
            ] {
                let (k, _) = read_json(endpoint, json!({ field: value }));
                if ok {
                    assert!(k.is_ok(), "{field} {value}");
                } else {
                    assert_eq!(param(k).as_deref(), Some(field), "{field} {value}");
                }
            }
        }
    }

    #[test]
    fn a_routers_billed_fields_are_refused_where_sent_as_is_and_not_allowed() {
        let body = |field: &str| {
            let mut b = Map::new();
            b.insert(field.into(), json!(["x"]));
            b
        };
        let none = BilledFields::default();
        let plugins = BilledFields::of(&["plugins".to_string(), "unknown".to_string()]);
        let compat = Provider::OpenaiCompatible;
        for field in BILLED_ROUTER_FIELDS {
            for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Embeddings] {
                let err = billed_router_fields(endpoint, &body(field), compat, none).unwrap_err();
                assert!(
                    matches!(err, ApiError::InvalidRequest { param: Some(p), .. } if p == field)
                );
            }
            // Translated bodies carry only what their translation reads; OpenAI is no router.
            for endpoint in [Endpoint::Messages, Endpoint::Responses] {
                assert!(billed_router_fields(endpoint, &body(field), compat, none).is_ok());
            }
            assert!(
                billed_router_fields(Endpoint::Chat, &body(field), Provider::Openai, none).is_ok()
            );
        }
        assert!(billed_router_fields(Endpoint::Chat, &body("plugins"), compat, plugins).is_ok());
        assert!(billed_router_fields(Endpoint::Chat, &body("models"), compat, plugins).is_err());
        assert!(
            plugins.allows("plugins") && !plugins.allows("models") && !plugins.allows("unknown")
        );
        let mut null = Map::new();
        null.insert("provider".into(), Value::Null);
        assert!(billed_router_fields(Endpoint::Chat, &null, compat, none).is_ok());
    }
}

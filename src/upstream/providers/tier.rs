//! Service tiers on the wire. Sluice prices the standard tier only (`pipeline::kinds`
//! refuses the others), but a request that names no tier, or `auto`, runs at the tier the
//! provider's project or organisation defaults to — OpenAI's project setting may be
//! `priority`, and Anthropic's `auto` uses Priority Tier capacity where the organisation
//! has it — billed at ~1.7–2× what the ledger charges. So OpenAI's and Anthropic's own
//! APIs are told the standard tier in every body written for them, and the tier an
//! answer says it was served at is read back, so a dearer one is seen.

use serde_json::{Map, Value};

use super::Format;
use crate::config::Provider;

/// Whether bodies for `provider` carry the standard tier when the client named none or
/// `auto`: OpenAI's and Anthropic's own APIs, whose defaults may be dearer. Azure OpenAI
/// runs at the standard tier unless a request names another, and OpenAI-compatible
/// servers name their tiers otherwise (Groq's `on_demand`) or refuse the field.
pub fn pinned(provider: Provider) -> bool {
    matches!(provider, Provider::Openai | Provider::Anthropic)
}

/// The standard tier as `upstream`'s requests name it.
fn standard(upstream: Format) -> Option<&'static str> {
    match upstream {
        Format::OpenAiChat | Format::Responses => Some("default"),
        Format::Anthropic => Some("standard_only"),
        Format::Gemini | Format::Bedrock => None,
    }
}

/// Names the standard tier in `out`, a body written for `upstream`, where it names none
/// or `auto`. A standard tier the client named stays; the others never get here
/// (`pipeline::kinds` refuses them).
pub fn pin(upstream: Format, out: &mut Map<String, Value>) {
    let Some(tier) = standard(upstream) else {
        return;
    };
    let open = match out.get("service_tier") {
        None | Some(Value::Null) => true,
        Some(Value::String(t)) => t == "auto",
        Some(_) => false,
    };
    if open {
        out.insert("service_tier".into(), Value::from(tier));
    }
}

/// The tier an answer or stream event says it was served at: OpenAI's chat answers and
/// chunks and Responses objects at the top (`response.*` events inside `response`),
/// Anthropic's in its usage (`message_start`'s inside `message`).
pub fn served(v: &Value) -> Option<&str> {
    [
        "/service_tier",
        "/usage/service_tier",
        "/message/usage/service_tier",
        "/response/service_tier",
    ]
    .iter()
    .find_map(|p| v.pointer(p)?.as_str())
}

/// A served tier billed at other rates than the standard ones, as a bounded label (a
/// metric's): `None` for the standard tier by any of its names.
pub fn priced_apart(tier: &str) -> Option<&'static str> {
    match tier {
        "default" | "standard" | "standard_only" | "auto" => None,
        "priority" => Some("priority"),
        "flex" => Some("flex"),
        "scale" => Some("scale"),
        "batch" => Some("batch"),
        _ => Some("other"),
    }
}

/// The tier priced apart a stream event's text says it was served at, if any. A
/// Responses stream's `response.created` echoes the tier asked for and its
/// `response.completed` names the one served, so no event stands for the stream; an
/// event naming the standard tier as the providers write it (every OpenAI chunk does) is
/// passed over without being parsed.
pub fn priced_apart_in(data: &str) -> Option<String> {
    const STANDARD: [&str; 2] = [
        "\"service_tier\":\"default\"",
        "\"service_tier\":\"standard\"",
    ];
    if !data.contains("\"service_tier\"") || STANDARD.iter().any(|s| data.contains(s)) {
        return None;
    }
    let v: Value = serde_json::from_str(data).ok()?;
    let tier = served(&v)?;
    priced_apart(tier).map(|_| tier.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_standard_tier_is_named_where_the_body_names_none_or_auto() {
        let pinned_to = |upstream, tier: Value| {
            let mut out = Map::new();
            out.insert("service_tier".into(), tier);
            pin(upstream, &mut out);
            out["service_tier"].clone()
        };
        for open in [Value::Null, json!("auto")] {
            assert_eq!(pinned_to(Format::OpenAiChat, open.clone()), "default");
            assert_eq!(pinned_to(Format::Responses, open.clone()), "default");
            assert_eq!(pinned_to(Format::Anthropic, open), "standard_only");
        }
        assert_eq!(pinned_to(Format::OpenAiChat, json!("default")), "default");
        assert_eq!(pinned_to(Format::Gemini, Value::Null), Value::Null);
        assert_eq!(
            served(&json!({"message": {"usage": {"service_tier": "priority"}}}))
                .and_then(priced_apart),
            Some("priority")
        );
        assert_eq!(
            served(&json!({"service_tier": "default"})).and_then(priced_apart),
            None
        );
    }

    #[test]
    fn a_stream_event_names_a_tier_priced_apart_wherever_it_comes() {
        let completed = json!({"type": "response.completed",
            "response": {"id": "r", "service_tier": "priority"}});
        assert_eq!(
            priced_apart_in(&completed.to_string()).as_deref(),
            Some("priority")
        );
        let created = json!({"type": "response.created", "response": {"service_tier": "auto"}});
        assert_eq!(priced_apart_in(&created.to_string()), None);
        assert_eq!(
            priced_apart_in(r#"{"service_tier":"default","choices":[]}"#),
            None
        );
    }
}

//! Cache keys. The exact key is the SHA-256 of (scope — with the request headers that
//! change an answer, `anthropic-beta` — model, wire format, the canonical request): messages with tool calls and results, system, tools, response format,
//! temperature, top_p, output cap, stop — everything but `user`, `metadata`, `stream` and
//! `stream_options`. JSON objects serialise with sorted keys, so the same request always
//! gives the same bytes. The context key is the same hash with the last user message's
//! text left out, plus how that message is read (`meaning::Reading`) and the tokens of it
//! that must agree: requests sharing it differ at most in what the agreement check
//! forgives, and the semantic match compares only those. An entry made under one reading
//! (`ignore_identifiers`, strict or not) is never a candidate under another.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::meaning::{self, Reading};
use crate::error::WireFormat;

pub type Key = [u8; 32];

/// Whether a request names content by its address, at any depth (a tool result holds
/// images too): a member named `…_url` (`image_url`, `video_url`, `audio_url`,
/// `document_url`, `file_url`, as a string or `{"url": …}`) or a `file_data`, other than
/// a `data:` URL; an Anthropic `source` of type `url`. The key holds the address, not the
/// bytes behind it, which may change under it (a chart re-rendered, `latest.png`; s31 cache
/// attack F5, diff attack F3 — the forms of vLLM, Mistral and OpenRouter besides OpenAI's).
pub fn names_remote_content(v: &Value) -> bool {
    let remote = |u: &Value| {
        u.get("url")
            .unwrap_or(u)
            .as_str()
            .is_some_and(|u| !u.trim_start().starts_with("data:"))
    };
    match v {
        Value::Array(items) => items.iter().any(names_remote_content),
        Value::Object(o) => {
            let addressed = o
                .iter()
                .any(|(k, u)| (k.ends_with("_url") || k == "file_data") && remote(u));
            let url_source = o.get("type").and_then(Value::as_str) == Some("url")
                && o.get("url").is_some_and(Value::is_string);
            // A tool call's input is the model's own words, not content sent along: an
            // agent's `{"page_url": …}` made every later turn uncached (s31 final attack F2).
            let call = o.get("type").and_then(Value::as_str) == Some("tool_use");
            let inner = o
                .iter()
                .filter(|(k, _)| !(call && *k == "input"))
                .any(|(_, v)| names_remote_content(v));
            addressed || url_source || inner
        }
        _ => false,
    }
}

/// The longest last user message the semantic match reads (longer: exact matches only).
pub const MAX_SEMANTIC_BYTES: usize = 32 * 1024;

pub struct Keys {
    pub exact: Key,
    /// Present when the request ends with a user message with text of at most
    /// `MAX_SEMANTIC_BYTES` and the semantic match is on (semantic candidates).
    pub context: Option<Key>,
    pub last_user: Option<String>,
    /// What the embedder embeds for the semantic match (see `meaning`).
    pub embed_text: Option<String>,
}

const IGNORED: &[&str] = &["user", "metadata", "stream", "stream_options", "model"];

fn hash(kind: &str, scope: &str, model: &str, format: WireFormat, body: &Value) -> Key {
    let mut h = Sha256::new();
    for part in [
        kind,
        scope,
        model,
        if format == WireFormat::OpenAi {
            "openai"
        } else {
            "anthropic"
        },
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.update(body.to_string().as_bytes());
    h.finalize().into()
}

fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            // Parts other than text (images, tool results) make the message not comparable.
            (texts.len() == parts.len() && !texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

pub fn keys(
    scope: &str,
    model: &str,
    format: WireFormat,
    body: &Map<String, Value>,
    reading: Reading,
) -> Keys {
    let mut canonical = body.clone();
    for k in IGNORED {
        canonical.remove(*k);
    }
    let canonical = Value::Object(canonical);
    let exact = hash("exact.v1", scope, model, format, &canonical);
    let mut context_body = canonical;
    let last_user = context_body
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .and_then(|m| m.last_mut())
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| {
            let text = text_of(m.get("content")?)?;
            m["content"] = Value::String(String::new());
            Some(text)
        });
    // Only a message short enough for the semantic match is read: reading and embedding
    // cost memory in proportion to the text, and a long prompt is answered by exact
    // matches alone.
    let readable = last_user
        .as_deref()
        .filter(|t| reading.semantic && t.len() <= MAX_SEMANTIC_BYTES);
    // A message that reads as nothing (greetings and thanks only: "Thanks!", "Hi") has no
    // meaning to compare: exact matches only.
    let read = readable.and_then(|text| {
        let tokens = meaning::tokens(text, reading.ignore_identifiers);
        if tokens.is_empty() {
            return None;
        }
        let embed_text = if reading.strict {
            meaning::normalised(&tokens)
        } else {
            meaning::for_http(text, reading.ignore_identifiers)
        };
        let agreement = meaning::agreement(&tokens, reading.strict);
        Some((embed_text, Value::from(agreement)))
    });
    let (embed_text, context) = match read {
        Some((embed_text, agreement)) => {
            // The reading's version: bumped whenever the reading tells more questions apart,
            // since an entry stored under the looser one shares the key of a question the
            // new one tells apart from it — `ls -R` stored before v3 answered `ls -r` (s31
            // diff attack F1). Otherwise kept, so entries stay found across releases.
            let mut context = format!(
                "context.v4 strict={} ignore_identifiers={}",
                reading.strict, reading.ignore_identifiers
            );
            if !reading.model.is_empty() {
                context.push_str(" embedder=");
                context.push_str(reading.model);
            }
            let body = Value::Array(vec![context_body, agreement]);
            (
                Some(embed_text),
                Some(hash(&context, scope, model, format, &body)),
            )
        }
        None => (None, None),
    };
    Keys {
        exact,
        context,
        last_user,
        embed_text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const STRICT: Reading = Reading {
        semantic: true,
        strict: true,
        ignore_identifiers: false,
        model: "",
    };

    fn m(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// The `http` embedder's model is part of the context: another model's entries are no
    /// semantic candidates (their vectors are of another space), the exact key is the same.
    /// The lexical reading keeps the context it always had.
    #[test]
    fn the_embedding_model_is_part_of_the_context_not_of_the_exact_key() {
        let body = m(json!({"messages": [{"role": "user", "content": "Why does my car stall?"}]}));
        let by = |model| {
            keys(
                "team:1",
                "gpt",
                WireFormat::OpenAi,
                &body,
                Reading {
                    strict: false,
                    model,
                    ..STRICT
                },
            )
        };
        let (small, large) = (by("text-embedding-3-small"), by("text-embedding-3-large"));
        assert_eq!(small.exact, large.exact);
        assert!(small.context.is_some() && small.context != large.context);
        let lexical = keys("team:1", "gpt", WireFormat::OpenAi, &body, STRICT);
        let mut context_body = Value::Object(body.clone());
        context_body["messages"][0]["content"] = json!("");
        let tokens = meaning::tokens("Why does my car stall?", false);
        let agreement = Value::from(meaning::agreement(&tokens, true));
        assert_eq!(
            lexical.context,
            Some(hash(
                "context.v4 strict=true ignore_identifiers=false",
                "team:1",
                "gpt",
                WireFormat::OpenAi,
                &Value::Array(vec![context_body, agreement]),
            )),
            "the lexical context of this reading's version (v3: case of units and flags)"
        );
    }

    #[test]
    fn keys_ignore_what_does_not_change_the_answer() {
        let a = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(
                json!({"messages": [{"role": "user", "content": "why"}], "temperature": 0, "user": "a", "stream": true}),
            ),
            STRICT,
        );
        let b = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(
                json!({"temperature": 0, "messages": [{"role": "user", "content": "why"}], "user": "b"}),
            ),
            STRICT,
        );
        assert_eq!(a.exact, b.exact);
        let other_team = keys(
            "team:2",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": "why"}], "temperature": 0})),
            STRICT,
        );
        assert_ne!(a.exact, other_team.exact);
        let reworded = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": "why?"}], "temperature": 0})),
            STRICT,
        );
        assert_ne!(a.exact, reworded.exact);
        assert_eq!(
            a.context, reworded.context,
            "same context, the last message differs in punctuation only"
        );
        assert_eq!(reworded.last_user.as_deref(), Some("why?"));
        let other_question = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": "how"}], "temperature": 0})),
            STRICT,
        );
        assert_ne!(a.context, other_question.context, "other words never agree");
        let tool = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "tool", "tool_call_id": "x", "content": "42"}]})),
            STRICT,
        );
        assert!(tool.context.is_none());
        let long = "why ".repeat(MAX_SEMANTIC_BYTES / 4 + 1);
        let long = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": long}]})),
            STRICT,
        );
        assert!(long.context.is_none(), "too long to read: exact only");
        let off = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": "why"}]})),
            Reading {
                semantic: false,
                ..STRICT
            },
        );
        assert!(off.context.is_none(), "semantic off: nothing read");
        let thanks = keys(
            "team:1",
            "gpt",
            WireFormat::OpenAi,
            &m(json!({"messages": [{"role": "user", "content": "Thanks!"}]})),
            STRICT,
        );
        assert!(thanks.context.is_none(), "nothing to compare: exact only");
    }

    /// Everything but the last user message's text is keyed exactly: two requests that
    /// differ anywhere else are never semantic candidates of each other.
    #[test]
    fn the_rest_of_the_request_is_keyed_exactly() {
        let base = json!({"temperature": 0, "messages": [
            {"role": "system", "content": "Answer in English."},
            {"role": "user", "content": "Who wrote Hamlet?"},
            {"role": "assistant", "content": "Shakespeare."},
            {"role": "user", "content": "When was it written?"}]});
        let variants: Vec<(&str, Value)> = vec![
            ("/messages/0/content", json!("Answer in French.")),
            ("/messages/1/content", json!("Who wrote Macbeth?")),
            ("/messages/2/content", json!("Marlowe.")),
            ("/temperature", json!(0.5)),
            ("/max_tokens", json!(5)),
            ("/top_p", json!(0.1)),
            ("/seed", json!(7)),
            ("/stop", json!(["."])),
            ("/response_format", json!({"type": "json_object"})),
            (
                "/tools",
                json!([{"type": "function", "function": {"name": "f"}}]),
            ),
            ("/tool_choice", json!("none")),
            ("/messages/3/name", json!("bob")),
        ];
        let context = |body: &Value, format, model| {
            keys("team:1", model, format, &m(body.clone()), STRICT)
                .context
                .unwrap()
        };
        let same = context(&base, WireFormat::OpenAi, "gpt");
        assert_ne!(same, context(&base, WireFormat::Anthropic, "gpt"), "format");
        assert_ne!(same, context(&base, WireFormat::OpenAi, "other"), "model");
        for (pointer, value) in variants {
            let mut body = base.clone();
            match body.pointer_mut(pointer) {
                Some(v) => *v = value,
                None => {
                    let (parent, field) = pointer.rsplit_once('/').unwrap();
                    body.pointer_mut(if parent.is_empty() { "" } else { parent })
                        .unwrap()
                        .as_object_mut()
                        .unwrap()
                        .insert(field.to_string(), value);
                }
            }
            assert_ne!(same, context(&body, WireFormat::OpenAi, "gpt"), "{pointer}");
        }
        let mut image = base.clone();
        image["messages"][3]["content"] = json!([{"type": "text", "text": "When was it written?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]);
        assert!(keys("team:1", "gpt", WireFormat::OpenAi, &m(image), STRICT)
            .context
            .is_none());
    }
}

//! Cache keys. The exact key is the SHA-256 of (scope — with the request headers that
//! change an answer, `anthropic-beta` — model, wire format, the canonical request): messages with tool calls and results, system, tools, response format,
//! temperature, top_p, output cap, stop — everything but `user`, `metadata`, `stream` and
//! `stream_options`. JSON objects serialise with sorted keys, so the same request always
//! gives the same bytes. The context key is the same hash with the last user message's
//! text left out, plus how that message is read (`meaning::Reading`) and the tokens of it
//! that must agree: requests sharing it differ at most in what the agreement check
//! forgives, and the semantic match compares only those. An entry made under one reading
//! (`ignore_identifiers`, strict or not) is never a candidate under another.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
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

/// The semantic side of a request: present when it ends with a user message with text of
/// at most `MAX_SEMANTIC_BYTES` and the semantic match is on.
pub struct Question {
    /// The context key: the entries of the same context are its semantic candidates.
    pub context: Key,
    /// What the embedder embeds for the semantic match (see `meaning`).
    pub embed_text: String,
}

const IGNORED: &[&str] = &["user", "metadata", "stream", "stream_options", "model"];

/// A hash fed the parts before the body, each with its length.
fn prefixed(kind: &str, scope: &str, model: &str, format: WireFormat) -> Sha256 {
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
    h
}

fn hash(kind: &str, scope: &str, model: &str, format: WireFormat, body: &impl Serialize) -> Key {
    // The request is hashed as it is serialised (`Sha256` is an `io::Write`), never held
    // whole. Serialising a `Value` into a writer that cannot fail does not fail.
    let mut h = prefixed(kind, scope, model, format);
    let _ = serde_json::to_writer(&mut h, body);
    h.finalize().into()
}

/// The context key's kind: the reading's version and the reading. Bumped whenever the
/// reading tells more questions apart, since an entry stored under the looser one shares
/// the key of a question the new one tells apart from it — `ls -R` stored before v3
/// answered `ls -r` (s31 diff attack F1). Otherwise kept, so entries stay found across
/// releases.
fn context_kind(reading: &Reading) -> String {
    let mut kind = format!(
        "context.v4 strict={} ignore_identifiers={}",
        reading.strict, reading.ignore_identifiers
    );
    if !reading.model.is_empty() {
        kind.push_str(" embedder=");
        kind.push_str(reading.model);
    }
    kind
}

/// The request as keyed: its members but the ignored ones, in the order (sorted) and bytes
/// `serde_json` gives a `Value` — the keys of entries already stored depend on them — with
/// the last message's `content` written as `""` when `blank` (the context key's body).
/// Written from the client's body as it is, not from a copy of it.
struct Canonical<'a> {
    body: &'a Map<String, Value>,
    blank: bool,
}

impl Serialize for Canonical<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.body {
            if IGNORED.contains(&k.as_str()) {
                continue;
            }
            match v {
                Value::Array(messages) if self.blank && k == "messages" => {
                    map.serialize_entry(k, &LastBlank(messages))?
                }
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

/// Messages with the last one's `content` written as `""`.
struct LastBlank<'a>(&'a [Value]);

impl Serialize for LastBlank<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        let Some((last, before)) = self.0.split_last() else {
            return seq.end();
        };
        for m in before {
            seq.serialize_element(m)?;
        }
        match last {
            Value::Object(last) => seq.serialize_element(&ContentBlank(last))?,
            other => seq.serialize_element(other)?,
        }
        seq.end()
    }
}

/// A message with its `content` written as `""`.
struct ContentBlank<'a>(&'a Map<String, Value>);

impl Serialize for ContentBlank<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.0 {
            if k == "content" {
                map.serialize_entry(k, "")?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
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

/// The exact key.
pub fn exact(scope: &str, model: &str, format: WireFormat, body: &Map<String, Value>) -> Key {
    hash(
        "exact.v1",
        scope,
        model,
        format,
        &Canonical { body, blank: false },
    )
}

/// The request's last question as the semantic match reads it, with its context key: a
/// second pass over the request and a reading of the question, which an exact hit never
/// needs (`Cache::read_question`).
pub fn question(
    scope: &str,
    model: &str,
    format: WireFormat,
    body: &Map<String, Value>,
    reading: Reading,
) -> Option<Question> {
    if !reading.semantic {
        return None;
    }
    let last_user = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| text_of(m.get("content")?))?;
    // Only a message short enough for the semantic match is read: reading and embedding
    // cost memory in proportion to the text, and a long prompt is answered by exact
    // matches alone.
    if last_user.len() > MAX_SEMANTIC_BYTES {
        return None;
    }
    // A message that reads as nothing (greetings and thanks only: "Thanks!", "Hi") has no
    // meaning to compare: exact matches only.
    let tokens = meaning::tokens(&last_user, reading.ignore_identifiers);
    if tokens.is_empty() {
        return None;
    }
    let embed_text = if reading.strict {
        meaning::normalised(&tokens)
    } else {
        meaning::for_http(&last_user, reading.ignore_identifiers)
    };
    let agreement = meaning::agreement(&tokens, reading.strict);
    // Written as the array `[request, agreement]` it always was.
    let context = hash(
        &context_kind(&reading),
        scope,
        model,
        format,
        &(Canonical { body, blank: true }, agreement),
    );
    Some(Question {
        context,
        embed_text,
    })
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

    /// Both keys of a request.
    struct Keys {
        exact: Key,
        context: Option<Key>,
    }

    fn keys(
        scope: &str,
        model: &str,
        format: WireFormat,
        body: &Map<String, Value>,
        reading: Reading,
    ) -> Keys {
        Keys {
            exact: exact(scope, model, format, body),
            context: question(scope, model, format, body, reading).map(|q| q.context),
        }
    }

    /// The keys as computed before they were hashed while serialised (2026-12-06): a copy
    /// of the request without the ignored members, its text, the context's copy with the
    /// last user message blanked. Entries stored since depend on these bytes.
    fn copied_keys(
        scope: &str,
        model: &str,
        format: WireFormat,
        body: &Map<String, Value>,
        reading: Reading,
    ) -> (Key, Option<Key>) {
        let text_hash = |kind: &str, body: &Value| {
            let mut h = prefixed(kind, scope, model, format);
            h.update(body.to_string().as_bytes());
            let key: Key = h.finalize().into();
            key
        };
        let mut canonical = body.clone();
        for k in IGNORED {
            canonical.remove(*k);
        }
        let canonical = Value::Object(canonical);
        let exact = text_hash("exact.v1", &canonical);
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
        let context = last_user
            .filter(|t| reading.semantic && t.len() <= MAX_SEMANTIC_BYTES)
            .and_then(|text| {
                let tokens = meaning::tokens(&text, reading.ignore_identifiers);
                let agreement = Value::from(meaning::agreement(&tokens, reading.strict));
                (!tokens.is_empty()).then_some(agreement)
            })
            .map(|agreement| {
                text_hash(
                    &context_kind(&reading),
                    &Value::Array(vec![context_body, agreement]),
                )
            });
        (exact, context)
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-zA-Z0-9 ?!.,\"\\\\\n\t\u{1}\u{7f}é€😀]{0,16}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z_\"]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn message() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let question = "[a-zA-Z0-9 ?!.,'\"-]{0,40}".prop_map(Value::from);
        let parts = prop::collection::vec(
            prop_oneof![
                "[a-z0-9 ?]{0,20}".prop_map(|t| json!({"type": "text", "text": t})),
                json_value(),
            ],
            0..3,
        )
        .prop_map(Value::from);
        let content = prop_oneof![question, parts, json_value()];
        let role = prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("system"),
            Just("tool")
        ];
        let extra = prop::collection::btree_map("[a-z_]{1,6}", json_value(), 0..2);
        (role, proptest::option::of(content), extra).prop_map(|(role, content, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            m.insert("role".into(), role.into());
            if let Some(c) = content {
                m.insert("content".into(), c);
            }
            Value::Object(m)
        })
    }

    /// The keys of two requests, byte for byte as before the keys were hashed while
    /// serialised (7becd71): the property test below compares with the old computation
    /// rebuilt on the same serde_json, which would move with it (a feature such as
    /// `preserve_order` switched on by a dependency); these do not (s40 attack F3).
    #[test]
    fn keys_of_known_requests_stay_what_they_were() {
        let body = m(
            json!({"model": "gpt", "temperature": 0, "user": "u", "stream": true,
            "metadata": {"a": 1}, "max_tokens": 64, "tools": [{"type": "function",
            "function": {"name": "f", "parameters": {"z": 1, "a": [1.5, "é\n\"x\""]}}}],
            "messages": [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Why does the light 3 blink on WVWZZZ1JZXW000001?",
                 "name": "bob"}]}),
        );
        let hex = |k: &Key| hex::encode(k);
        let strict = keys("team:1", "gpt", WireFormat::OpenAi, &body, STRICT);
        let http = keys(
            "team:1\u{1f}anthropic-beta=x",
            "claude",
            WireFormat::Anthropic,
            &body,
            Reading {
                strict: false,
                ignore_identifiers: true,
                model: "text-embedding-3-small",
                ..STRICT
            },
        );
        let got = [
            hex(&strict.exact),
            strict.context.as_ref().map(hex).unwrap_or_default(),
            hex(&http.exact),
            http.context.as_ref().map(hex).unwrap_or_default(),
        ];
        assert_eq!(got, PINNED, "{got:#?}");
    }

    /// The exact keys (1st, 3rd) checked apart from serde_json: Python's `json.dumps` with
    /// sorted keys and no spaces, hashed after the length-prefixed parts, gives the same.
    const PINNED: [&str; 4] = [
        "c504de79214c66be1ca3231a38561fb74e1bcac5268e2350aad86fc36c3ab5a4",
        "ec83ed80fe8949adca3ab9b910aef55d671122aba6636bf087d4c87408095826",
        "ced58f0d97c172b29b61ea42430fa8e087cbf684c7a76dfaa0d9348f85d5df1c",
        "ea747ff39f1a20a0e2c4f5ef005b8592505689abe71e888a2508e8a4f1a095ee",
    ];

    /// Keys hashed as the request is serialised are the keys the copies gave, byte for
    /// byte, for any request and reading: entries stored before the change are found
    /// after it, exactly and semantically.
    #[test]
    fn keys_are_the_bytes_the_copies_gave() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        // Most requests end with a user's question, as most do: those have a context key.
        let question = (
            "[a-zA-Z0-9 ?!.,'\"-]{1,40}",
            prop::collection::btree_map("[a-z_]{1,6}", json_value(), 0..2),
        )
            .prop_map(|(q, extra)| {
                let mut m: Map<String, Value> = extra.into_iter().collect();
                m.insert("role".into(), "user".into());
                m.insert("content".into(), q.into());
                Value::Object(m)
            });
        let messages = (
            prop::collection::vec(message(), 0..4),
            proptest::option::weighted(0.8, question),
        )
            .prop_map(|(mut messages, question)| {
                messages.extend(question);
                messages
            });
        let body = (
            messages,
            prop::collection::btree_map(
                prop_oneof![
                    Just("user".to_string()),
                    Just("metadata".to_string()),
                    Just("stream".to_string()),
                    Just("model".to_string()),
                    Just("temperature".to_string()),
                    "[a-z_]{1,8}"
                ],
                json_value(),
                0..4,
            ),
            prop::bool::weighted(0.9),
        )
            .prop_map(|(messages, members, with_messages)| {
                let mut b: Map<String, Value> = members.into_iter().collect();
                if with_messages {
                    b.insert("messages".into(), Value::from(messages));
                }
                b
            });
        let reading = (
            prop::bool::weighted(0.8),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        );
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 2_000,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, b"sluice-cache-key-bytes-seed-0001"),
        );
        let contexts = std::cell::Cell::new(0);
        runner
            .run(
                &(body, reading),
                |(body, (semantic, strict, ignore_identifiers, embedder))| {
                    let reading = Reading {
                        semantic,
                        strict,
                        ignore_identifiers,
                        model: if embedder {
                            "text-embedding-3-small"
                        } else {
                            ""
                        },
                    };
                    for format in [WireFormat::OpenAi, WireFormat::Anthropic] {
                        let new = keys("team:1\u{1f}b=x", "gpt", format, &body, reading);
                        let old = copied_keys("team:1\u{1f}b=x", "gpt", format, &body, reading);
                        prop_assert_eq!(new.exact, old.0);
                        prop_assert_eq!(new.context, old.1);
                        contexts.set(contexts.get() + usize::from(new.context.is_some()));
                    }
                    Ok(())
                },
            )
            .unwrap();
        let contexts = contexts.get();
        assert!(contexts > 500, "only {contexts} requests had a context key");
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

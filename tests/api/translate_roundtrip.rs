//! Round trips of the translation over generated requests made only of what the other
//! side can express: OpenAI → Anthropic → OpenAI and Anthropic → OpenAI → Anthropic keep
//! every field (up to writing a content string as one text part). Fixed seed, as in
//! `translate_fuzz.rs`.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Map, Value};
use sluice::config::Provider;
use sluice::error::WireFormat;
use sluice::upstream::providers;

use crate::translate_fuzz::{runner, SEED};

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,?!éß中🦀]{1,16}"
}

/// A number in [0, 1] as clients write it (serde_json's default float parsing may move a
/// 17-digit one by an ulp — on the gateway's way in, not in the translation).
fn unit() -> impl Strategy<Value = f64> {
    (0u32..=100).prop_map(|x| f64::from(x) / 100.0)
}

fn tool_name() -> impl Strategy<Value = String> {
    "[a-z_]{1,10}"
}

fn args() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        "[a-z]{1,6}",
        prop_oneof![
            text().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from)
        ],
        0..3,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

const PDF: &str = "JVBERi0xLjQK";

/// An OpenAI user part Anthropic can express.
fn openai_part() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        Just(json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})),
        Just(json!({"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}})),
        text().prop_map(|n| json!({"type": "file", "file": {"filename": n, "file_data": format!("data:application/pdf;base64,{PDF}")}})),
    ]
}

/// One exchange: a user turn, the assistant's answer (text and/or tool calls) and the
/// results of its calls (some failed).
fn openai_exchange() -> impl Strategy<Value = Vec<Value>> {
    (
        prop_oneof![text().prop_map(Value::from), prop::collection::vec(openai_part(), 1..4).prop_map(Value::Array)],
        prop::option::of(text()),
        prop::collection::vec((tool_name(), args(), text(), any::<bool>()), 0..3),
    )
        .prop_map(|(user, said, calls)| {
            let mut out = vec![json!({"role": "user", "content": user})];
            let said = if calls.is_empty() { Some(said.unwrap_or_else(|| "ok".into())) } else { said };
            let mut a = json!({"role": "assistant", "content": said});
            if !calls.is_empty() {
                a["tool_calls"] = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (n, args, _, _))| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": n, "arguments": args.to_string()}}))
                    .collect();
            }
            out.push(a);
            for (i, (_, _, result, failed)) in calls.iter().enumerate() {
                let content = if *failed { format!("[tool_result is_error=true]\n{result}") } else { result.clone() };
                out.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": content}));
            }
            out
        })
}

fn openai_request() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::option::of(text()),
        prop::collection::vec(openai_exchange(), 0..3),
        prop_oneof![text().prop_map(Value::from), prop::collection::vec(openai_part(), 1..3).prop_map(Value::Array)],
        (prop::option::of(unit()), prop::option::of(unit()), prop::option::of(prop::collection::vec(text(), 1..4))),
        prop::collection::vec((tool_name(), prop::option::of(text())), 0..3),
        (0usize..5, any::<bool>(), prop::option::of(text()), prop::option::of(prop::sample::select(&["auto", "default"][..])), any::<bool>()),
    )
        .prop_map(|(system, exchanges, last, (temp, top_p, stop), tools, (choice, serial, user, tier, stream))| {
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.extend(exchanges.into_iter().flatten());
            messages.push(json!({"role": "user", "content": last}));
            let mut b = Map::new();
            b.insert("model".into(), json!("m"));
            b.insert("max_tokens".into(), json!(64));
            b.insert("messages".into(), Value::Array(messages));
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    b.insert(k.into(), v);
                }
            };
            put("temperature", temp.map(Value::from));
            put("top_p", top_p.map(Value::from));
            put("stop", stop.map(|s| json!(s)));
            put("user", user.map(Value::from));
            put("service_tier", tier.map(Value::from));
            put("stream", stream.then_some(json!(true)));
            if !tools.is_empty() {
                let first = tools[0].0.clone();
                put("tools", Some(tools.iter().map(|(n, d)| {
                    let mut f = json!({"name": n, "parameters": {"type": "object", "properties": {}}});
                    if let Some(d) = d { f["description"] = json!(d); }
                    json!({"type": "function", "function": f})
                }).collect()));
                let c = [json!("auto"), json!("required"), json!("none"), json!({"type": "function", "function": {"name": first}}), Value::Null][choice].clone();
                put("tool_choice", (!c.is_null()).then_some(c.clone()));
                put("parallel_tool_calls", (serial && c != json!("none")).then_some(json!(false)));
            }
            b
        })
}

/// An Anthropic user block OpenAI can express.
fn anthropic_block() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        Just(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}})),
        Just(json!({"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}})),
        text().prop_map(|t| json!({"type": "document", "title": t, "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}})),
    ]
}

fn anthropic_exchange() -> impl Strategy<Value = Vec<Value>> {
    (
        prop_oneof![text().prop_map(Value::from), prop::collection::vec(anthropic_block(), 1..4).prop_map(Value::Array)],
        prop::collection::vec(text(), 0..3),
        prop::collection::vec((tool_name(), args(), prop_oneof![text().prop_map(Value::from), prop::collection::vec(text(), 1..3).prop_map(|ts| ts.into_iter().map(|t| json!({"type": "text", "text": t})).collect())], any::<bool>()), 0..3),
        prop::option::of(text()),
    )
        .prop_map(|(user, said, calls, after)| {
            let mut blocks: Vec<Value> = said.iter().map(|t| json!({"type": "text", "text": t})).collect();
            if blocks.is_empty() && calls.is_empty() {
                blocks.push(json!({"type": "text", "text": "ok"}));
            }
            for (i, (n, input, _, _)) in calls.iter().enumerate() {
                blocks.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": n, "input": input}));
            }
            let mut out = vec![json!({"role": "user", "content": user}), json!({"role": "assistant", "content": blocks})];
            if !calls.is_empty() {
                let mut results: Vec<Value> = calls.iter().enumerate().map(|(i, (_, _, content, failed))| {
                    let mut r = json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": content});
                    if *failed { r["is_error"] = json!(true); }
                    r
                }).collect();
                if let Some(t) = after {
                    results.push(json!({"type": "text", "text": t}));
                }
                out.push(json!({"role": "user", "content": results}));
                out.push(json!({"role": "assistant", "content": "noted"}));
            }
            out
        })
}

fn anthropic_request() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop_oneof![Just(None), text().prop_map(|t| Some(json!(t))), prop::collection::vec(text(), 2..4).prop_map(|ts| Some(ts.into_iter().map(|t| json!({"type": "text", "text": t})).collect()))],
        prop::collection::vec(anthropic_exchange(), 0..3),
        prop_oneof![text().prop_map(Value::from), prop::collection::vec(anthropic_block(), 1..3).prop_map(Value::Array)],
        (prop::option::of(unit()), prop::option::of(unit()), prop::option::of(prop::collection::vec(text(), 1..4))),
        prop::collection::vec((tool_name(), prop::option::of(text())), 0..3),
        (0usize..5, any::<bool>(), prop::option::of(text()), prop::option::of(prop::sample::select(&["auto", "standard_only"][..])), any::<bool>()),
    )
        .prop_map(|(system, exchanges, last, (temp, top_p, stop), tools, (choice, serial, user, tier, stream))| {
            let mut messages: Vec<Value> = exchanges.into_iter().flatten().collect();
            messages.push(json!({"role": "user", "content": last}));
            let mut b = Map::new();
            b.insert("model".into(), json!("m"));
            b.insert("max_tokens".into(), json!(64));
            b.insert("messages".into(), Value::Array(messages));
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    b.insert(k.into(), v);
                }
            };
            put("system", system);
            put("temperature", temp.map(Value::from));
            put("top_p", top_p.map(Value::from));
            put("stop_sequences", stop.map(|s| json!(s)));
            put("metadata", user.map(|u| json!({"user_id": u})));
            put("service_tier", tier.map(Value::from));
            put("stream", stream.then_some(json!(true)));
            if !tools.is_empty() {
                let first = tools[0].0.clone();
                put("tools", Some(tools.iter().map(|(n, d)| {
                    let mut t = json!({"name": n, "input_schema": {"type": "object", "properties": {}}});
                    if let Some(d) = d { t["description"] = json!(d); }
                    t
                }).collect()));
                let mut c = [json!({"type": "auto"}), json!({"type": "any"}), json!({"type": "none"}), json!({"type": "tool", "name": first}), Value::Null][choice].clone();
                if serial && c.is_object() && c["type"] != "none" {
                    c["disable_parallel_tool_use"] = json!(true);
                }
                put("tool_choice", (!c.is_null()).then_some(c));
            }
            b
        })
}

/// The same request either way it may be written: a content string is one text part;
/// an assistant's empty content is none; the stream's usage request is the gateway's.
fn canonical(mut v: Value) -> Value {
    fn content(c: &mut Value) {
        if let Value::String(s) = c {
            *c = json!([{"type": "text", "text": s}]);
        }
        if let Value::Array(parts) = c {
            for p in parts {
                if let Some(inner) = p.get_mut("content") {
                    content(inner);
                }
            }
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("stream_options");
        // With tools, OpenAI's default choice is `auto`.
        if o.contains_key("tools") && !o.contains_key("tool_choice") {
            o.insert("tool_choice".into(), json!("auto"));
        }
        if let Some(s) = o.get_mut("system") {
            content(s);
        }
        for m in o
            .get_mut("messages")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            match m.get_mut("content") {
                Some(c) if c.is_null() || c.as_array().is_some_and(Vec::is_empty) => {
                    m.as_object_mut().map(|o| o.remove("content"));
                }
                Some(c) => content(c),
                None => {}
            }
        }
    }
    v
}

fn there_and_back(client: WireFormat, body: &Map<String, Value>) -> Result<Value, TestCaseError> {
    let (to, back) = match client {
        WireFormat::OpenAi => (
            Provider::Anthropic,
            (WireFormat::Anthropic, Provider::Openai),
        ),
        WireFormat::Anthropic => (Provider::Openai, (WireFormat::OpenAi, Provider::Anthropic)),
    };
    let stream = body.get("stream").is_some();
    let there = providers::build_request(client, to, body, "m", Some(("max_tokens", 64)), stream)
        .map_err(|e| TestCaseError::fail(format!("refused going there: {e}")))?;
    let there: Map<String, Value> = serde_json::from_slice(&there).unwrap();
    let back = providers::build_request(
        back.0,
        back.1,
        &there,
        "m",
        Some(("max_tokens", 64)),
        stream,
    )
    .map_err(|e| TestCaseError::fail(format!("refused coming back: {e} — sent {there:?}")))?;
    Ok(serde_json::from_slice(&back).unwrap())
}

#[test]
fn openai_requests_survive_a_round_trip_through_anthropic() {
    let result = runner().run(&openai_request(), |body| {
        let back = there_and_back(WireFormat::OpenAi, &body)?;
        prop_assert_eq!(canonical(back), canonical(Value::Object(body)));
        Ok(())
    });
    if let Err(e) = result {
        panic!("OpenAI → Anthropic → OpenAI lost something (seed {SEED:?}): {e}");
    }
}

#[test]
fn anthropic_requests_survive_a_round_trip_through_openai() {
    let result = runner().run(&anthropic_request(), |body| {
        let back = there_and_back(WireFormat::Anthropic, &body)?;
        prop_assert_eq!(canonical(back), canonical(Value::Object(body)));
        Ok(())
    });
    if let Err(e) = result {
        panic!("Anthropic → OpenAI → Anthropic lost something (seed {SEED:?}): {e}");
    }
}

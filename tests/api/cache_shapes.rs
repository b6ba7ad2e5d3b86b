//! What the cache stores and replays: only well-formed, complete answers in the client's
//! format, replayed as well-formed streams (attack cache #3, #4, #5).

use serde_json::{json, Value};
use sluice::config::{Provider, RouteSettings};
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;

/// `claude` on the Anthropic upstream `c` (key B).
pub(crate) async fn claude_app() -> TestApp {
    spawn_app_with(|s, m| {
        let mut c = upstream("c", KEY_B, m);
        c.provider = Provider::Anthropic;
        c.base_url = m.base_url();
        s.upstreams.push(c);
        s.models.push(model("claude", &["c"]));
        s.models[2].routes = vec![RouteSettings {
            upstream: "c".into(),
            model: "claude-upstream".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        }];
    })
    .await
}

fn claude_question(stream: bool) -> Value {
    json!({"model": "claude", "max_tokens": 100, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "What does fault code P0401 mean?"}]})
}

fn cache_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-sluice-cache")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Lets the entry a request may have stored (off the request path) land.
async fn settle_cache(app: &TestApp) {
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    app.state.cache.flush().await;
}

/// A 2xx Anthropic body that is no message is garbage, a 502 that costs nothing; one
/// shaped like a message but not a complete one (no stop reason, a usage that is no
/// object) is relayed as sent but never stored — before, a streamed repeat was a hit whose
/// replay panicked and dropped the connection.
#[tokio::test]
async fn a_2xx_anthropic_body_that_is_no_whole_message_is_never_stored_or_replayed() {
    let app = claude_app().await;
    let (id, token) = app.token("poison", Some("1")).await;
    app.mock.state.script(
        KEY_B,
        [Script {
            raw_body: Some("[]".into()),
            ..Script::default()
        }],
    );
    let resp = app
        .post("/v1/messages", &token, &claude_question(false))
        .await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000,
        "garbage costs nothing"
    );
    settle_cache(&app).await;

    app.mock.state.script(
        KEY_B,
        [Script {
            raw_body: Some(
                "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":5}".into(),
            ),
            ..Script::default()
        }],
    );
    let resp = app
        .post("/v1/messages", &token, &claude_question(false))
        .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    settle_cache(&app).await;

    let resp = app
        .post("/v1/messages", &token, &claude_question(true))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(cache_of(&resp), "miss");
    let body = resp.text().await.expect("a whole stream");
    assert!(
        body.trim_end()
            .ends_with("data: {\"type\":\"message_stop\"}"),
        "{body}"
    );
    app.wait_for_cache_entries(1).await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM cache_entries").await,
        1,
        "only the real answer is stored"
    );
    app.assert_invariant().await;
}

/// An OpenAI stream whose client did not ask for its usage never showed the usage chunk,
/// so the answer rebuilt from it has none: it is not stored, and a whole request is never
/// answered without `usage` (attack cache #5). A stream that carried it is stored and
/// replays it, streamed or whole.
#[tokio::test]
async fn a_whole_answer_built_from_a_stream_carries_its_usage() {
    let app = spawn_app().await;
    let (_, token) = app.token("usage", None).await;
    let body = |stream: bool, usage: bool| {
        let mut b = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 50, "stream": stream,
            "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
        if usage {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let resp = app.chat(&token, &body(true, false)).await;
    let _ = resp.text().await;
    settle_cache(&app).await;
    let resp = app.chat(&token, &body(false, false)).await;
    assert_eq!(resp.status(), 200);
    let cache = cache_of(&resp);
    let v: Value = resp.json().await.unwrap();
    assert!(v["usage"]["total_tokens"].is_u64(), "{cache}: {v}");

    // With its usage asked for, the stream's answer is stored, and every hit carries it.
    let other = |mut b: Value| {
        b["messages"][0]["content"] = json!("Why does the oil light blink?");
        b
    };
    let resp = app.chat(&token, &other(body(true, true))).await;
    let _ = resp.text().await;
    settle_cache(&app).await;
    let resp = app.chat(&token, &other(body(false, false))).await;
    assert_eq!(cache_of(&resp), "hit-exact");
    let v: Value = resp.json().await.unwrap();
    assert!(v["usage"]["total_tokens"].is_u64(), "{v}");
    let resp = app.chat(&token, &other(body(true, true))).await;
    assert_eq!(cache_of(&resp), "hit-exact");
    let (data, _) = sse_data(resp).await;
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(last["usage"]["total_tokens"].is_u64(), "{last}");
}

/// An Anthropic stream of `blocks` (each a block's start, deltas and stop events' data,
/// numbered in order) that ends with `stop_reason`.
fn anthropic_stream(stop_reason: &str, blocks: Vec<Vec<Value>>) -> Vec<SseEvent> {
    let ev = |v: Value| SseEvent::Named(v["type"].as_str().unwrap().to_string(), v);
    let mut out = vec![ev(
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-upstream", "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 0}}}),
    )];
    out.extend(blocks.into_iter().flatten().map(ev));
    out.push(ev(
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": 7}}),
    ));
    out.push(ev(json!({"type": "message_stop"})));
    out
}

fn text_block(i: usize, text: &str) -> Vec<Value> {
    vec![
        json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": i}),
    ]
}

/// Asks `body` twice; the second must reach the upstream (`key`): the first answer, though
/// relayed whole, was not stored.
async fn asked_twice_reaches_the_upstream(
    app: &TestApp,
    token: &str,
    path: &str,
    key: &str,
    body: &Value,
    script: Script,
    what: &str,
) {
    app.mock.state.script(key, [script]);
    let resp = app.post(path, token, body).await;
    assert_eq!(resp.status(), 200, "{what}");
    let _ = resp.text().await;
    settle_cache(app).await;
    let before = app.mock.state.stats(key).count;
    let resp = app.post(path, token, body).await;
    assert_eq!(resp.status(), 200, "{what}");
    assert_eq!(cache_of(&resp), "miss", "{what}");
    let _ = resp.text().await;
    assert_eq!(app.mock.state.stats(key).count, before + 1, "{what}");
    settle_cache(app).await;
}

/// An answer its provider marks not complete — cut by a content filter, refused partway,
/// a paused turn, the context window exceeded — is relayed but never stored, streamed or
/// not: it was served to the whole scope as a whole answer for its TTL (s27 cache attack
/// F3).
#[tokio::test]
async fn a_filtered_or_refused_answer_is_answered_but_not_cached() {
    let app = claude_app().await;
    let (_, token) = app.token("filtered", None).await;
    for (n, stream) in [false, true].into_iter().enumerate() {
        let mut body = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 50, "stream": stream,
            "messages": [{"role": "user", "content": format!("Why does the fuel light blink ({n})?")}]});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let filtered = Script {
            content_filter: Some("completion".into()),
            ..Script::default()
        };
        let what = format!("content_filter, stream: {stream}");
        asked_twice_reaches_the_upstream(
            &app,
            &token,
            "/v1/chat/completions",
            KEY_A,
            &body,
            filtered,
            &what,
        )
        .await;
    }
    for (n, stop) in ["refusal", "pause_turn", "model_context_window_exceeded"]
        .into_iter()
        .enumerate()
    {
        for stream in [false, true] {
            // Each its own key: the key leaves `stream` out.
            let mut body = claude_question(stream);
            body["messages"][0]["content"] = json!(format!(
                "What does fault code P04{n}{} mean?",
                u8::from(stream)
            ));
            let script = anthropic_answer(stop, stream);
            let what = format!("{stop}, stream: {stream}");
            asked_twice_reaches_the_upstream(
                &app,
                &token,
                "/v1/messages",
                KEY_B,
                &body,
                script,
                &what,
            )
            .await;
        }
    }
}

/// A streamed tool call whose input is not JSON — cut, or garbled by the upstream, with a
/// stop reason that says `tool_use` — was stored as `input: {}`, and every later request
/// of its key got a tidy call with no arguments, which an agent runs (s27 cache attack
/// F2). It is relayed as it came and not stored: the same request, whole, reaches the
/// upstream.
#[tokio::test]
async fn a_streamed_tool_call_whose_input_is_cut_is_not_cached() {
    let app = claude_app().await;
    let (_, token) = app.token("cut-call", None).await;
    let mut body = claude_question(true);
    body["tools"] = json!([{"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let call = vec![
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Par"}}),
        json!({"type": "content_block_stop", "index": 1}),
    ];
    let script = Script {
        events: Some(anthropic_stream(
            "tool_use",
            vec![text_block(0, "Checking."), call],
        )),
        ..Script::default()
    };
    app.mock.state.script(KEY_B, [script]);
    let resp = app.post("/v1/messages", &token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains(r#"{\"city\": \"Par"#),
        "relayed as it came: {text}"
    );
    settle_cache(&app).await;
    body["stream"] = json!(false);
    let before = app.mock.state.stats(KEY_B).count;
    let resp = app.post("/v1/messages", &token, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(cache_of(&resp), "miss");
    let v: Value = resp.json().await.unwrap();
    assert_ne!(v["content"][1]["input"], json!({}), "{v}");
    assert_eq!(app.mock.state.stats(KEY_B).count, before + 1);
}

/// An OpenAI `custom` tool call (`tools: [{"type": "custom", …}]`) is relayed as it came and
/// not stored: stored, its streamed repeat replayed it as a `function` call with a null
/// name (s27 cache attack F4).
#[tokio::test]
async fn a_custom_tool_call_is_answered_but_not_cached() {
    let app = spawn_app().await;
    let (_, token) = app.token("custom", None).await;
    let mut body = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 50,
        "tools": [{"type": "custom", "custom": {"name": "exec", "description": "Runs a shell command."}}],
        "messages": [{"role": "user", "content": "List the files."}]});
    let call = json!({"id": "call_1", "type": "custom", "custom": {"name": "exec", "input": "ls"}});
    let answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini-upstream",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [call]},
        "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}});
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(answer),
            ..Script::default()
        }],
    );
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["custom"]["input"],
        "ls"
    );
    settle_cache(&app).await;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let before = app.mock.state.stats(KEY_A).count;
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(cache_of(&resp), "miss");
    let _ = resp.text().await;
    assert_eq!(app.mock.state.stats(KEY_A).count, before + 1);
}

const KEY_G: &str = "gem-key-g-0123456789";

/// `claude_app` and `gem` on the Gemini upstream `g` (`KEY_G`): a client of either format is
/// translated to one of them.
async fn translated_app() -> TestApp {
    spawn_app_with(|s, m| {
        let mut c = upstream("c", KEY_B, m);
        c.provider = Provider::Anthropic;
        c.base_url = m.base_url();
        let mut g = upstream("g", KEY_G, m);
        g.provider = Provider::Gemini;
        g.base_url = m.base_url();
        s.upstreams.extend([c, g]);
        s.models.push(model("claude", &["c"]));
        s.models.push(model("gem", &["g"]));
    })
    .await
}

/// An Anthropic answer ending with `stop`, whole or as the stream of it.
fn anthropic_answer(stop: &str, stream: bool) -> Script {
    if stream {
        return Script {
            events: Some(anthropic_stream(stop, vec![text_block(0, "I can")])),
            ..Script::default()
        };
    }
    Script {
        body: Some(
            json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-upstream", "content": [{"type": "text", "text": "I can"}],
            "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 7}}),
        ),
        ..Script::default()
    }
}

/// A Gemini answer ending with `finish`, whole or as a stream of its one chunk.
fn gemini_answer(finish: &str, stream: bool) -> Script {
    let chunk = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "I can"}]},
        "index": 0, "finishReason": finish}], "responseId": "r1", "modelVersion": "gemini-2.5-flash",
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19}});
    match stream {
        true => Script {
            events: Some(vec![SseEvent::Data(chunk)]),
            ..Script::default()
        },
        false => Script {
            body: Some(chunk),
            ..Script::default()
        },
    }
}

/// The translated cases: an OpenAI client of `claude` (Anthropic upstream) and an Anthropic
/// client of `gem` (Gemini upstream), each whole and streamed, the upstream ending with
/// `anthropic` or `gemini`: (what, path, upstream key, body, script). Each its own key (the
/// key leaves `stream` out), `tag` telling two calls' questions apart.
fn translated_cases(
    anthropic: &str,
    gemini: &str,
    tag: &str,
) -> Vec<(String, &'static str, &'static str, Value, Script)> {
    let mut cases = Vec::new();
    for stream in [false, true] {
        let n = u8::from(stream);
        let mut openai = json!({"model": "claude", "temperature": 0, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": format!("What does fault code {tag}{n} mean?")}]});
        if stream {
            openai["stream_options"] = json!({"include_usage": true});
        }
        cases.push((
            format!("OpenAI client, Anthropic {anthropic}, stream: {stream}"),
            "/v1/chat/completions",
            KEY_B,
            openai,
            anthropic_answer(anthropic, stream),
        ));
        let anthropic_client = json!({"model": "gem", "temperature": 0, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": format!("Where is sensor {tag}{n}?")}]});
        cases.push((
            format!("Anthropic client, Gemini {gemini}, stream: {stream}"),
            "/v1/messages",
            KEY_G,
            anthropic_client,
            gemini_answer(gemini, stream),
        ));
    }
    cases
}

/// A translated answer its upstream paused or cut — Anthropic's `pause_turn` written to an
/// OpenAI client as `stop`, Gemini's `MALFORMED_FUNCTION_CALL` written to an Anthropic
/// client as `end_turn` — is relayed but not stored, streamed or not: the client format's
/// reason called it complete, and it was served as a whole answer for its TTL (late
/// attack L5).
#[tokio::test]
async fn a_translated_answer_its_upstream_paused_or_cut_is_answered_but_not_cached() {
    let app = translated_app().await;
    let (_, token) = app.token("paused", None).await;
    for (what, path, key, body, script) in
        translated_cases("pause_turn", "MALFORMED_FUNCTION_CALL", "P05")
    {
        asked_twice_reaches_the_upstream(&app, &token, path, key, &body, script, &what).await;
    }
}

/// The control: a translated answer its upstream ended whole (`end_turn`, `STOP`) is stored
/// and served to the same request, whole or streamed, without the upstream.
#[tokio::test]
async fn a_translated_answer_its_upstream_ended_whole_is_cached() {
    let app = translated_app().await;
    let (_, token) = app.token("whole", None).await;
    for (what, path, key, body, script) in translated_cases("end_turn", "STOP", "P06") {
        app.mock.state.script(key, [script]);
        let resp = app.post(path, &token, &body).await;
        assert_eq!(resp.status(), 200, "{what}");
        assert_eq!(cache_of(&resp), "miss", "{what}");
        let _ = resp.text().await;
        settle_cache(&app).await;
        let before = app.mock.state.stats(key).count;
        let resp = app.post(path, &token, &body).await;
        assert_eq!(resp.status(), 200, "{what}");
        assert_eq!(cache_of(&resp), "hit-exact", "{what}");
        let _ = resp.text().await;
        assert_eq!(app.mock.state.stats(key).count, before, "{what}");
    }
}

/// An OpenAI chat answer of `message` ending with `reason` (`null`: none), whole; or its
/// stream, whose finish chunk is left out for `null` — `[DONE]` ends it with no finish.
fn openai_answer(reason: Value, message: Value, stream: bool) -> Script {
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19});
    if !stream {
        return Script {
            body: Some(
                json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                "model": "gpt-4o-mini-upstream", "choices": [{"index": 0, "message": message,
                "logprobs": null, "finish_reason": reason}], "usage": usage}),
            ),
            ..Script::default()
        };
    }
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-4o-mini-upstream", "choices": choices, "usage": usage}),
        )
    };
    let mut events = vec![chunk(
        json!([{"index": 0, "delta": {"role": "assistant", "content": message["content"]}, "finish_reason": null}]),
        Value::Null,
    )];
    if !reason.is_null() {
        events.push(chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": reason}]),
            Value::Null,
        ));
    }
    events.push(chunk(json!([]), usage));
    events.push(SseEvent::Data(json!("[DONE]")));
    Script {
        events: Some(events),
        ..Script::default()
    }
}

/// A translated answer its upstream gave no reason for — Anthropic's `stop_reason: null`
/// (written to an OpenAI client as `stop`), OpenAI's `finish_reason: null` or a stream's
/// `[DONE]` before any finish (written to an Anthropic client as `end_turn`), Gemini's
/// `finishReason` absent — or a cut the reader wrote as a whole one (Anthropic's
/// `model_context_window_exceeded` as `length`, vLLM's `abort` beside a tool call as
/// `tool_use`) is relayed but not stored, streamed or not: the readers took these for a
/// whole finish, and the same answer refused within one format (`cache::shape`) was stored
/// translated (s28 stop attack F1).
#[tokio::test]
async fn a_translated_answer_its_upstream_gave_no_reason_for_is_answered_but_not_cached() {
    let app = translated_app().await;
    let (_, token) = app.token("no-reason", None).await;
    let said = json!({"role": "assistant", "content": "I can"});
    let called = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]});
    let mut cases: Vec<(String, &str, &str, Value, Script, &str)> = Vec::new();
    for stream in [false, true] {
        let n = u8::from(stream);
        let mut openai = json!({"model": "claude", "temperature": 0, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": format!("What does fault code F1{n} mean?")}]});
        if stream {
            openai["stream_options"] = json!({"include_usage": true});
        }
        // Anthropic's `stop_reason: null`, whole and in the stream's `message_delta`.
        let mut null = anthropic_answer("end_turn", stream);
        match (&mut null.body, &mut null.events) {
            (Some(b), _) => b["stop_reason"] = Value::Null,
            (_, Some(events)) => {
                for e in events {
                    if let SseEvent::Named(name, v) = e {
                        if name == "message_delta" {
                            v["delta"]["stop_reason"] = Value::Null;
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
        cases.push((
            format!("OpenAI client, Anthropic null, stream: {stream}"),
            "/v1/chat/completions",
            KEY_B,
            openai.clone(),
            null,
            r#""finish_reason":"stop""#,
        ));
        openai["messages"][0]["content"] = json!(format!("What does fault code F2{n} mean?"));
        cases.push((
            format!("OpenAI client, Anthropic model_context_window_exceeded, stream: {stream}"),
            "/v1/chat/completions",
            KEY_B,
            openai,
            anthropic_answer("model_context_window_exceeded", stream),
            r#""finish_reason":"length""#,
        ));
        let anthropic_client = |q: String| {
            json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100, "stream": stream,
                "messages": [{"role": "user", "content": q}]})
        };
        cases.push((
            format!("Anthropic client, OpenAI null, stream: {stream}"),
            "/v1/messages",
            KEY_A,
            anthropic_client(format!("Where is sensor F3{n}?")),
            openai_answer(Value::Null, said.clone(), stream),
            r#""stop_reason":"end_turn""#,
        ));
    }
    cases.push((
        "Anthropic client, OpenAI abort beside a tool call".into(),
        "/v1/messages",
        KEY_A,
        json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
            "messages": [{"role": "user", "content": "Look up sensor F40."}]}),
        openai_answer(json!("abort"), called, false),
        r#""stop_reason":"tool_use""#,
    ));
    let mut gemini = gemini_answer("STOP", false);
    gemini.body.as_mut().unwrap()["candidates"][0]
        .as_object_mut()
        .unwrap()
        .remove("finishReason");
    cases.push((
        "Anthropic client, Gemini without finishReason".into(),
        "/v1/messages",
        KEY_G,
        json!({"model": "gem", "temperature": 0, "max_tokens": 100,
            "messages": [{"role": "user", "content": "Where is sensor F50?"}]}),
        gemini,
        r#""stop_reason":"end_turn""#,
    ));
    for (what, path, key, body, script, told) in cases {
        // The client is told a reason, as before.
        app.mock.state.script(key, [script.clone()]);
        let resp = app.post(path, &token, &body).await;
        assert_eq!(resp.status(), 200, "{what}");
        let text = resp.text().await.unwrap().replace(": ", ":");
        assert!(text.contains(told), "{what}: {text}");
        settle_cache(&app).await;
        asked_twice_reaches_the_upstream(&app, &token, path, key, &body, script, &what).await;
    }
    // The control: the OpenAI upstream's `stop` to an Anthropic client is stored.
    let body = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
        "messages": [{"role": "user", "content": "Where is sensor F60?"}]});
    app.mock
        .state
        .script(KEY_A, [openai_answer(json!("stop"), said, false)]);
    let resp = app.post("/v1/messages", &token, &body).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    settle_cache(&app).await;
    let resp = app.post("/v1/messages", &token, &body).await;
    assert_eq!(cache_of(&resp), "hit-exact");
}

//! Hostile and unservable Responses requests: every one refused with a 400 (or 404 / 429)
//! in OpenAI's error shape that names the problem, none reaching an upstream or charging
//! anything; the translated (non-native) path's answers and refusals; and answers the
//! gateway cannot read, refused as the chat route refuses them.

use serde_json::{json, Value};
use sluice::mock::Script;

use crate::helpers::*;
use crate::responses::{ask, charged, cost, create, function_call, last_sent, output_text, ASK};

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_before_any_upstream() {
    let app = spawn_app_with_claude().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let huge = "word ".repeat(140_000);
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"model": "gpt-4o-mini"}),
            "input",
            "`input` is required",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": ""}),
            "input",
            "non-empty",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": []}),
            "input",
            "non-empty",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": 42}),
            "input",
            "non-empty",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [7]}),
            "input",
            "input[0] must be an object",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"type": "web_search_call", "id": "ws_1"}]}),
            "input",
            "`web_search_call`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input",
            "`item_reference`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"role": "wizard", "content": "hi"}]}),
            "input",
            "`role`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"role": "user", "content": [{"type": "input_audio"}]}]}),
            "input",
            "input_audio",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "call_never", "output": "42"}]}),
            "input",
            "call_never",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]}),
            "input",
            "call_id",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "web_search"}]}),
            "tools",
            "`web_search`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}),
            "tools",
            "`file_search`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "computer_use_preview"}]}),
            "tools",
            "`computer_use_preview`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "function"}]}),
            "tools",
            "`name`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "tool_choice": {"type": "web_search"}}),
            "tool_choice",
            "tool_choice",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "truncation": "auto"}),
            "truncation",
            "never drops",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "background": true}),
            "background",
            "background",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "conversation": "conv_1"}),
            "conversation",
            "previous_response_id",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
            "at least 1",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 1_000_000}),
            "max_output_tokens",
            "at most 4096",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": "many"}),
            "max_output_tokens",
            "integer",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "n": 3}),
            "n",
            "n",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "temperature": 9}),
            "temperature",
            "temperature",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "store": "yes"}),
            "store",
            "boolean",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "previous_response_id": 5}),
            "previous_response_id",
            "string",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "text": {"format": {"type": "json_schema"}}}),
            "text",
            "schema",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": "hi", "include": "everything"}),
            "include",
            "array",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": huge}),
            "input",
            "accepts at most 128000",
        ),
        // What the translated path cannot express.
        (
            json!({"model": "claude", "input": "hi", "top_logprobs": 3}),
            "top_logprobs",
            "cannot be served",
        ),
        (
            json!({"model": "claude", "input": "hi", "include": ["message.output_text.logprobs"]}),
            "include",
            "cannot be served",
        ),
        (
            json!({"model": "claude", "input": "hi", "text": {"verbosity": "low"}}),
            "text",
            "verbosity",
        ),
        (
            json!({"model": "claude", "input": "hi", "tools": [{"type": "custom", "name": "exec"}]}),
            "tools",
            "`custom`",
        ),
        (
            json!({"model": "claude", "input": [{"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "ls"}]}),
            "input",
            "`custom_tool_call`",
        ),
        (
            json!({"model": "gpt-4o-mini", "input": [{"type": "custom_tool_call_output", "call_id": "c9", "output": "x"}]}),
            "input",
            "c9",
        ),
        (
            json!({"model": "claude", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]}),
            "input",
            "file_id",
        ),
    ];
    for (body, param, says) in cases {
        let (status, err) = create(&app, &token, &body).await;
        let shown = body.to_string().chars().take(160).collect::<String>();
        assert_eq!(status, 400, "{shown}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{shown}");
        assert_eq!(err["error"]["param"], param, "{shown}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{shown}: {message}");
    }
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached an upstream"
    );
    assert_eq!(charged(&app, token_id).await, 0);
    // Not JSON at all, and a body that is not an object.
    for raw in ["{", "[1,2]", "\u{0}"] {
        let resp = app
            .http
            .post(format!("{}/v1/responses", app.address))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{raw:?}");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }
    app.assert_invariant().await;
}

#[tokio::test]
async fn an_unknown_token_and_an_exhausted_budget_answer_in_openais_shape() {
    let app = spawn_app().await;
    let (status, err) = create(&app, "sk-sl-unknown", &ask()).await;
    assert_eq!(status, 401);
    assert_eq!(err["error"]["code"], "invalid_api_key");
    // A budget below the worst case of one request: 429 insufficient_quota, nothing sent.
    let (token_id, token) = app.token("ola", Some("0.001")).await;
    let (status, err) = create(&app, &token, &ask()).await;
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["code"], "insufficient_quota");
    assert_eq!(err["error"]["type"], "insufficient_quota");
    assert_eq!(app.mock.state.total_count(), 0);
    // Exactly the worst case is enough; what is left after it is not.
    let worst = crate::responses::worst(&ask(), 4096);
    let dollars = format!("{}.{:06}", worst / 1_000_000, worst % 1_000_000);
    let (exact_id, exact) = app.token("kari", Some(&dollars)).await;
    assert_eq!(create(&app, &exact, &ask()).await.0, 200);
    let (status, _) = create(&app, &exact, &ask()).await;
    assert_eq!(status, 429);
    assert_eq!(charged(&app, exact_id).await, cost(12, 24));
    assert_eq!(charged(&app, token_id).await, 0);
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_translated_answer_is_a_response_object_charged_its_usage() {
    let app = spawn_app_with_claude().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let body = json!({"model": "claude", "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": ASK}]}],
        "max_output_tokens": 300, "temperature": 0.5});
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(r["max_output_tokens"], 300);
    assert_eq!(output_text(&r), sluice::mock::MockConfig::default().text);
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 24, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 36})
    );
    let sent = last_sent(&app, KEY_B);
    assert_eq!(sent["model"], "claude-upstream");
    assert_eq!(sent["max_tokens"], 300);
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["messages"][0]["role"], "user");
    assert_eq!(charged(&app, token_id).await, cost(12, 24));
    // A conversation continued on another provider: the stored items become messages.
    let follow = json!({"model": "gpt-4o-mini", "input": "Shorter?", "previous_response_id": r["id"], "stream": false});
    let (status, _) = create(&app, &token, &follow).await;
    assert_eq!(status, 200);
    let sent = last_sent(&app, KEY_A);
    assert_eq!(sent["input"].as_array().unwrap().len(), 3, "{sent}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_translated_function_tool_round_trip() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("ola", None).await;
    let tools = json!([{"type": "function", "name": "lookup_vehicle",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}}}]);
    let (status, r) = create(
        &app,
        &token,
        &json!({"model": "claude", "input": "Which car?", "tools": tools}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let call = function_call(&r);
    assert_eq!(call["name"], "lookup_vehicle");
    let sent = last_sent(&app, KEY_B);
    assert_eq!(sent["tools"][0]["name"], "lookup_vehicle");
    let next = json!({"model": "claude", "tools": tools, "previous_response_id": r["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "Golf"}]});
    let (status, done) = create(&app, &token, &next).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["output"][0]["type"], "message");
    let sent = last_sent(&app, KEY_B);
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["content"][0]["type"], "tool_result", "{sent}");
    assert_eq!(last["content"][0]["tool_use_id"], call["call_id"]);
    app.assert_invariant().await;
}

#[tokio::test]
async fn an_upstream_client_error_reaches_the_client_in_openais_shape() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    app.mock.state.script(KEY_A, [sluice::mock::Script {
        status: Some(400),
        body: Some(json!({"error": {"message": "Invalid schema for function", "type": "invalid_request_error", "param": "tools", "code": "invalid_function_parameters"}})),
        ..Default::default()
    }]);
    let (status, err) = create(&app, &token, &ask()).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["code"], "invalid_function_parameters");
    assert_eq!(charged(&app, token_id).await, 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    app.assert_invariant().await;
}

const KEY_G: &str = "gem-key-g-0123456789";

/// `gem` on the Gemini mock (key G) alone; `gem_or_mini` on it with `gpt-4o-mini` (the
/// native `openai` upstream, key A) as its fallback. The breakers open on no count of
/// failures here: each case fails its key on purpose (rested by `rest_no_more`).
async fn spawn_app_with_gemini() -> TestApp {
    spawn_app_with(|s, mock| {
        s.breaker.failure_threshold = 1_000;
        let mut g = upstream("g", KEY_G, mock);
        g.provider = sluice::config::Provider::Gemini;
        g.base_url = mock.base_url();
        s.upstreams.push(g);
        s.models.push(model("gem", &["g"]));
        let mut m = model("gem_or_mini", &["g"]);
        m.fallbacks = vec!["gpt-4o-mini".into()];
        s.models.push(m);
    })
    .await
}

/// An answer the gateway cannot read is refused as the chat route refuses it (s29
/// responses attack F1: it was a 200 `completed` empty response, charged and stored, no
/// other route tried): translated (a Gemini `inlineData` part the gateway does not model,
/// a Gemini answer not in its shape) and native (an `openai` upstream's `/responses`
/// answer that is no response object) — a 502 `upstream_error` in OpenAI's shape once
/// every route failed, charged what the chat route's refusal is (nothing), nothing stored;
/// and with a fallback configured, the fallback serves the answer.
#[tokio::test]
async fn an_answer_the_gateway_cannot_read_is_a_502_on_responses_too() {
    let app = spawn_app_with_gemini().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let (chat_id, chat_token) = app.token("chat", Some("10")).await;
    let usage = r#""usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 24, "totalTokenCount": 36}"#;
    let image = format!(
        r#"{{"candidates": [{{"content": {{"role": "model", "parts": [{{"inlineData": {{"mimeType": "image/png", "data": "AA=="}}}}]}}, "finishReason": "STOP"}}], {usage}}}"#
    );
    let shapeless = format!(r#"{{"candidates": 5, {usage}}}"#);
    let cases = [
        (KEY_G, "gem", image.clone()),
        (KEY_G, "gem", shapeless.clone()),
        (KEY_A, "gpt-4o-mini", "{}".to_string()),
        (
            KEY_A,
            "gpt-4o-mini",
            r#"{"object": "response", "output": 5}"#.to_string(),
        ),
    ];
    for (key, model, raw) in cases {
        let script = || Script {
            raw_body: Some(raw.clone()),
            ..Script::default()
        };
        let before = app.mock.state.stats(key).count;
        app.mock.state.script(key, [script()]);
        let (status, err) = create(&app, &token, &json!({"model": model, "input": ASK})).await;
        assert_eq!(status, 502, "{model} {raw}: {err}");
        assert_eq!(err["error"]["code"], "upstream_error", "{err}");
        assert_eq!(err["error"]["type"], "server_error", "{err}");
        assert_eq!(app.mock.state.stats(key).count, before + 1, "{raw}");
        // A garbled answer is its key's failure: rested no more for the next case.
        let upstream_id = if key == KEY_G { "g" } else { "a" };
        app.rest_no_more(upstream_id);
        // The chat route's refusal of the same answer, for its charge.
        app.mock.state.script(key, [script()]);
        let body = json!({"model": model, "messages": [{"role": "user", "content": ASK}]});
        let resp = app.chat(&chat_token, &body).await;
        assert_eq!(resp.status(), 502, "{raw}: {}", resp.text().await.unwrap());
        app.rest_no_more(upstream_id);
    }
    assert_eq!(charged(&app, token_id).await, charged(&app, chat_id).await);
    assert_eq!(charged(&app, token_id).await, 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    // Another route configured: it serves the answer, charged and stored as its own.
    for raw in [&image, &shapeless] {
        let (fallback_id, fallback) = app.token(&format!("fb{}", raw.len()), Some("10")).await;
        app.mock.state.script(
            KEY_G,
            [Script {
                raw_body: Some(raw.clone()),
                ..Script::default()
            }],
        );
        let answered_by_a = app.mock.state.stats(KEY_A).count;
        let body = json!({"model": "gem_or_mini", "input": ASK});
        let (status, r) = create(&app, &fallback, &body).await;
        assert_eq!(status, 200, "{raw}: {r}");
        assert_eq!(r["status"], "completed");
        assert_eq!(output_text(&r), sluice::mock::MockConfig::default().text);
        assert_eq!(app.mock.state.stats(KEY_A).count, answered_by_a + 1);
        assert_eq!(charged(&app, fallback_id).await, cost(12, 24));
        let (status, stored) =
            crate::responses::get(&app, r["id"].as_str().unwrap(), &fallback).await;
        assert_eq!(status, 200);
        assert_eq!(stored, r);
        app.rest_no_more("g");
    }
    app.assert_invariant().await;
}

/// The same answers streamed: the stream ends with an `error` event, never
/// `response.completed`, nothing is stored, and the charge is the chat route's for the
/// same stream.
#[tokio::test]
async fn a_stream_event_the_gateway_cannot_read_ends_a_responses_stream_unstored() {
    let app = spawn_app_with_gemini().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let (chat_id, chat_token) = app.token("chat", Some("10")).await;
    let text =
        |t: &str| json!({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}}]});
    let image = json!({"candidates": [{"content": {"role": "model", "parts": [
        {"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 24, "totalTokenCount": 36}});
    let gemini = || Script {
        events: Some(vec![
            sluice::mock::SseEvent::Data(text("The engine ")),
            sluice::mock::SseEvent::Data(image.clone()),
        ]),
        ..Script::default()
    };
    let native = || {
        Script {
        raw_stream: Some(vec![
            "event: response.created\ndata: {\"type\": \"response.created\", \"sequence_number\": 0, \"response\": {\"id\": \"resp_u\", \"object\": \"response\", \"status\": \"in_progress\", \"output\": []}}\n\n".into(),
            "event: response.output_text.delta\ndata: 5\n\n".into(),
        ]),
        ..Script::default()
    }
    };
    for (key, model, script) in [
        (KEY_G, "gem", &gemini as &dyn Fn() -> Script),
        (KEY_A, "gpt-4o-mini", &native),
    ] {
        app.mock.state.script(key, [script()]);
        let resp = app
            .post(
                "/v1/responses",
                &token,
                &json!({"model": model, "input": ASK, "stream": true}),
            )
            .await;
        assert_eq!(resp.status(), 200);
        let ev = crate::responses_streams::events(resp).await;
        let (name, last) = ev.last().unwrap();
        assert_eq!(name, "error", "{model}: {ev:?}");
        assert_eq!(last["code"], "upstream_error", "{last}");
        assert!(!ev.iter().any(|(n, _)| n == "response.completed"), "{ev:?}");
        app.rest_no_more(if key == KEY_G { "g" } else { "a" });
    }
    // The chat route's charge for the Gemini stream (a native Responses stream has no
    // chat counterpart): the text received and the input, on both routes.
    app.mock.state.script(KEY_G, [gemini()]);
    let body = json!({"model": "gem", "stream": true,
        "messages": [{"role": "user", "content": ASK}]});
    let chat = app.chat(&chat_token, &body).await;
    assert_eq!(chat.status(), 200);
    assert!(chat.text().await.unwrap().contains("upstream_error"));
    let before = charged(&app, token_id).await;
    app.mock.state.script(KEY_G, [gemini()]);
    let body = json!({"model": "gem", "input": ASK, "stream": true});
    let resp = app.post("/v1/responses", &token, &body).await;
    let _ = crate::responses_streams::events(resp).await;
    let gemini_charge = charged(&app, token_id).await - before;
    let gem_row = |t: i64, column: &str| {
        format!("SELECT {column} FROM requests WHERE token_id = {t} AND model = 'gem' LIMIT 1")
    };
    app.wait_for_log_rows(4).await;
    let (chat_in, chat_out) = (
        app.scalar(&gem_row(chat_id, "input_tokens")).await,
        app.scalar(&gem_row(chat_id, "output_tokens")).await,
    );
    let (in_, out) = (
        app.scalar(&gem_row(token_id, "input_tokens")).await,
        app.scalar(&gem_row(token_id, "output_tokens")).await,
    );
    // The same text received; the input each body's own estimate (the bodies differ).
    assert!(out > 0);
    assert_eq!(out, chat_out);
    assert_eq!(gemini_charge, cost(in_, out));
    assert_eq!(charged(&app, chat_id).await, cost(chat_in, chat_out));
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    app.assert_invariant().await;
}

/// Every item of a streamed answer has its own id, the same in its events, in the final
/// response and in the stored copy (s29 responses attack F4: every message item was
/// `msg_<ids>`, so text after a call gave two items of one id, which OpenAI refuses on a
/// continuation: "Duplicate item found").
#[tokio::test]
async fn each_streamed_item_has_its_own_id_in_its_events_and_the_stored_response() {
    let app = spawn_app_with_gemini().await;
    let (_, token) = app.token("ola", Some("10")).await;
    let part = |p: Value| {
        sluice::mock::SseEvent::Data(
            json!({"candidates": [{"content": {"role": "model", "parts": [p]}}]}),
        )
    };
    app.mock.state.script(
        KEY_G,
        [Script {
            events: Some(vec![
                part(json!({"text": "Let me check."})),
                part(json!({"functionCall": {"name": "lookup_vehicle", "args": {"vin": "1"}}})),
                part(json!({"text": "Checked."})),
                sluice::mock::SseEvent::Data(json!({"candidates": [{"content": {"role": "model",
                    "parts": [{"text": " It is a Golf."}]}, "finishReason": "STOP"}],
                    "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 24, "totalTokenCount": 36}})),
            ]),
            ..Script::default()
        }],
    );
    let tools = json!([{"type": "function", "name": "lookup_vehicle",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}}}]);
    let body = json!({"model": "gem", "input": ASK, "tools": tools, "stream": true});
    let resp = app.post("/v1/responses", &token, &body).await;
    assert_eq!(resp.status(), 200);
    let ev = crate::responses_streams::events(resp).await;
    let (name, done) = ev.last().unwrap();
    assert_eq!(name, "response.completed", "{ev:?}");
    let done = &done["response"];
    let ids: Vec<&str> = done["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    let kinds: Vec<&Value> = done["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["type"])
        .collect();
    assert_eq!(kinds, ["message", "function_call", "message"], "{done}");
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    // Each event names its item by the id the final response gives it at that index.
    for (kind, data) in &ev {
        let index = data["output_index"].as_u64();
        let named = data["item_id"].as_str().or(data["item"]["id"].as_str());
        if let (Some(index), Some(named)) = (index, named) {
            assert_eq!(named, ids[index as usize], "{kind}: {data}");
        }
    }
    let (status, stored) = crate::responses::get(&app, done["id"].as_str().unwrap(), &token).await;
    assert_eq!(status, 200);
    assert_eq!(&stored, done);
    app.assert_invariant().await;
}

/// A field a translated route cannot serve is refused naming it in `error.param`, as the
/// Responses API names an unknown parameter (s29 responses attack F5: `param` was null);
/// `stream_options` and `prompt_cache_retention`, which the native route takes, are a
/// stream's option no translated stream has a use for and a caching hint: dropped and
/// announced, as `prompt_cache_key` is, never refused.
#[tokio::test]
async fn an_unknown_field_on_a_translated_route_is_refused_with_its_param() {
    let app = spawn_app_with_claude().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    for field in ["frobnicate", "x-odd key"] {
        let mut body = json!({"model": "claude", "input": ASK});
        body[field] = json!(1);
        let (status, err) = create(&app, &token, &body).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["param"], field, "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(field),
            "{err}"
        );
    }
    assert_eq!(app.mock.state.stats(KEY_B).count, 0);
    assert_eq!(charged(&app, token_id).await, 0);
    for stream in [false, true] {
        let body = json!({"model": "claude", "input": ASK, "stream": stream,
            "stream_options": {"include_obfuscation": false}, "prompt_cache_retention": "24h"});
        let resp = app.post("/v1/responses", &token, &body).await;
        assert_eq!(resp.status(), 200, "stream: {stream}");
        let dropped = resp.headers()["x-sluice-dropped"]
            .to_str()
            .unwrap()
            .to_string();
        // A request that does not stream has its `stream_options` left out before any
        // route (`pipeline::request`), as on chat: nothing of the client's to announce.
        assert_eq!(dropped.contains("stream_options"), stream, "{dropped}");
        assert!(dropped.contains("prompt_cache_retention"), "{dropped}");
        let _ = resp.text().await;
        let sent = crate::responses::last_sent(&app, KEY_B);
        assert!(sent.get("stream_options").is_none(), "{sent}");
        assert!(sent.get("prompt_cache_retention").is_none(), "{sent}");
    }
    app.assert_invariant().await;
}

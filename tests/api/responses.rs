//! `POST /v1/responses` served natively by an `openai` upstream (the mock's `/v1/responses`),
//! and the stored responses: `GET` / `DELETE /v1/responses/{id}`, `previous_response_id`,
//! scoping to the token that made them, and the retention.

use std::sync::Arc;

use serde_json::{json, Value};
use sluice::clock::{Clock, ManualClock};
use sluice::mock::Script;

use crate::helpers::*;

pub const ASK: &str = "Why does the engine light blink?";

pub fn ask() -> Value {
    json!({"model": "gpt-4o-mini", "input": ASK})
}

pub async fn create(app: &TestApp, token: &str, body: &Value) -> (u16, Value) {
    let resp = app.post("/v1/responses", token, body).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON body"))
}

pub async fn fetch(app: &TestApp, method: reqwest::Method, id: &str, token: &str) -> (u16, Value) {
    let resp = app
        .http
        .request(method, format!("{}/v1/responses/{id}", app.address))
        .bearer_auth(token)
        .send()
        .await
        .expect("sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON body"))
}

/// A stored response as `GET /v1/responses/{id}` answers it.
pub async fn get(app: &TestApp, id: &str, token: &str) -> (u16, Value) {
    fetch(app, reqwest::Method::GET, id, token).await
}

/// The body the upstream behind `key` received last.
pub fn last_sent(app: &TestApp, key: &str) -> Value {
    app.mock
        .state
        .stats(key)
        .last_bodies
        .back()
        .cloned()
        .expect("a request reached the upstream")
}

/// A response object's function call item.
pub fn function_call(r: &Value) -> Value {
    r["output"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["type"] == "function_call")
        .cloned()
        .expect("a function_call item")
}

/// The text of a response object's message items.
pub fn output_text(r: &Value) -> String {
    let mut t = String::new();
    for item in r["output"].as_array().into_iter().flatten() {
        for part in item["content"].as_array().into_iter().flatten() {
            t.push_str(part["text"].as_str().unwrap_or(""));
        }
    }
    t
}

/// What the token was charged in total (reserve + settle rows).
pub async fn charged(app: &TestApp, token_id: i64) -> i64 {
    app.wait_settled().await;
    app.scalar(&format!(
        "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = {token_id} AND kind IN ('reserve', 'settle')"
    ))
    .await
}

/// The amount of the token's latest reservation.
pub async fn last_reserve(app: &TestApp, token_id: i64) -> i64 {
    app.scalar(&format!(
        "SELECT amount_micros FROM ledger WHERE token_id = {token_id} AND kind = 'reserve' ORDER BY id DESC LIMIT 1"
    ))
    .await
}

/// The test prices (0.15 / 0.60 USD per Mtok), rounded up once.
pub fn cost(input: i64, output: i64) -> i64 {
    (input * 150_000 + output * 600_000 + 999_999) / 1_000_000
}

/// The worst case the gateway must reserve for a Responses body with this output cap.
pub fn worst(body: &Value, cap: i64) -> i64 {
    let counted = sluice::pipeline::responses::validate(body.as_object().unwrap()).unwrap();
    cost(
        sluice::quota::pricing::input_with_margin(counted, 1.10, 16),
        cap,
    )
}

#[tokio::test]
async fn a_native_response_carries_the_gateways_id_and_is_charged_its_usage() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let (status, r) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    let id = r["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() > 20, "{id}");
    assert_eq!(r["store"], true);
    assert_eq!(output_text(&r), sluice::mock::MockConfig::default().text);
    assert_eq!(r["usage"]["input_tokens"], 12);
    assert_eq!(r["usage"]["output_tokens"], 24);
    // Upstream: its own path, the upstream model, the reserved cap, and never its storage.
    let stats = app.mock.state.stats(KEY_A);
    assert_eq!(stats.last_paths.back().unwrap(), "/v1/responses");
    let sent = stats.last_bodies.back().unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini-upstream");
    assert_eq!(sent["max_output_tokens"], 4096);
    assert_eq!(sent["store"], false);
    assert_eq!(sent["input"], ASK);
    // Reserved the worst case, charged the usage reported.
    assert_eq!(last_reserve(&app, token_id).await, worst(&ask(), 4096));
    assert_eq!(charged(&app, token_id).await, cost(12, 24));
    app.assert_invariant().await;
}

#[tokio::test]
async fn reasoning_tokens_are_charged_and_the_upstream_is_asked_for_encrypted_reasoning() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            reasoning_tokens: Some(100),
            ..Script::default()
        }],
    );
    let mut body = ask();
    body["reasoning"] = json!({"effort": "low"});
    body["max_output_tokens"] = json!(500);
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"][0]["type"], "reasoning");
    assert!(r["output"][0]["encrypted_content"].is_string());
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 100);
    let sent = last_sent(&app, KEY_A);
    assert_eq!(sent["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(sent["max_output_tokens"], 500);
    assert_eq!(charged(&app, token_id).await, cost(12, 124));
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_stored_response_is_read_and_deleted_by_its_token_only() {
    let app = spawn_app().await;
    let (_, mine) = app.token("ola", None).await;
    let (_, theirs) = app.token("kari", None).await;
    let (_, r) = create(&app, &mine, &ask()).await;
    let id = r["id"].as_str().unwrap();
    let (status, got) = get(&app, id, &mine).await;
    assert_eq!(status, 200);
    assert_eq!(got, r, "GET answers the response as it was given");
    // Another token: not found, as a missing id is; it cannot delete it either.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let (status, err) = fetch(&app, method.clone(), id, &theirs).await;
        assert_eq!(status, 404, "{method}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert_eq!(
            err["error"]["message"],
            format!("Response with id '{id}' not found.")
        );
    }
    let (status, missing) = get(&app, "resp_nope", &mine).await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["code"], "not_found");
    let (status, del) = fetch(&app, reqwest::Method::DELETE, id, &mine).await;
    assert_eq!(status, 200);
    assert_eq!(
        del,
        json!({"id": id, "object": "response", "deleted": true})
    );
    assert_eq!(get(&app, id, &mine).await.0, 404);
    assert_eq!(fetch(&app, reqwest::Method::DELETE, id, &mine).await.0, 404);
    // Without a token: 401 in OpenAI's shape.
    assert_eq!(get(&app, id, "sk-sl-nope").await.0, 401);
}

#[tokio::test]
async fn store_false_keeps_nothing() {
    let app = spawn_app().await;
    let (_, token) = app.token("ola", None).await;
    let mut body = ask();
    body["store"] = json!(false);
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200);
    assert_eq!(r["store"], false);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    let (status, _) = get(&app, r["id"].as_str().unwrap(), &token).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn previous_response_id_sends_the_whole_conversation_and_reserves_for_it() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let (_, first) = create(&app, &token, &ask()).await;
    let first_id = first["id"].as_str().unwrap();
    let follow = json!({"model": "gpt-4o-mini", "input": "And if it stays on?", "previous_response_id": first_id});
    let (status, second) = create(&app, &token, &follow).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], first_id);
    assert_ne!(second["id"], first["id"]);
    let sent = last_sent(&app, KEY_A);
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    assert_eq!(sent["store"], false);
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{sent}");
    assert_eq!(input[0], json!({"role": "user", "content": ASK}));
    assert_eq!(input[1], first["output"][0], "the earlier answer's items");
    assert_eq!(
        input[2],
        json!({"role": "user", "content": "And if it stays on?"})
    );
    // The reservation covers the expanded conversation, not the new message alone.
    let expanded = json!({"model": "gpt-4o-mini", "input": input});
    assert_eq!(last_reserve(&app, token_id).await, worst(&expanded, 4096));
    assert!(worst(&expanded, 4096) > worst(&follow, 4096));
    // A third turn continues from the second: all five items.
    let third =
        json!({"model": "gpt-4o-mini", "input": "Thanks", "previous_response_id": second["id"]});
    assert_eq!(create(&app, &token, &third).await.0, 200);
    let sent = last_sent(&app, KEY_A);
    assert_eq!(sent["input"].as_array().unwrap().len(), 5);
    app.assert_invariant().await;
}

#[tokio::test]
async fn an_unknown_or_foreign_previous_response_id_is_404_and_reaches_no_upstream() {
    let app = spawn_app().await;
    let (_, mine) = app.token("ola", None).await;
    let (theirs_id, theirs) = app.token("kari", Some("10")).await;
    let (_, r) = create(&app, &mine, &ask()).await;
    let before = app.mock.state.total_count();
    for id in [
        r["id"].as_str().unwrap(),
        "resp_0000",
        "resp_'; DROP TABLE stored_responses; --",
    ] {
        let body = json!({"model": "gpt-4o-mini", "input": "go on", "previous_response_id": id});
        let (status, err) = create(&app, &theirs, &body).await;
        assert_eq!(status, 404, "{id}: {err}");
        assert_eq!(err["error"]["param"], "previous_response_id");
        assert_eq!(
            err["error"]["message"],
            format!("Response with id '{id}' not found.")
        );
    }
    assert_eq!(app.mock.state.total_count(), before, "no upstream call");
    assert_eq!(charged(&app, theirs_id).await, 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 1);
}

#[tokio::test]
async fn stored_responses_past_their_retention_are_gone() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let app = spawn_app_full(|s, _| s.responses.retention_days = 2, Some(clock.clone())).await;
    let (_, token) = app.token("ola", None).await;
    let (_, r) = create(&app, &token, &ask()).await;
    let id = r["id"].as_str().unwrap();
    clock.advance(chrono::Duration::days(1));
    assert_eq!(get(&app, id, &token).await.0, 200);
    clock.advance(chrono::Duration::days(1) + chrono::Duration::seconds(1));
    assert_eq!(get(&app, id, &token).await.0, 404);
    let body = json!({"model": "gpt-4o-mini", "input": "go on", "previous_response_id": id});
    assert_eq!(create(&app, &token, &body).await.0, 404);
    // The sweep deletes the row itself.
    let swept = sluice::store::responses::sweep(app.db(), clock.now() - chrono::Duration::days(2))
        .await
        .unwrap();
    assert_eq!(swept, 1);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
}

#[tokio::test]
async fn a_function_tool_round_trip_natively() {
    let app = spawn_app().await;
    let (_, token) = app.token("ola", None).await;
    let tools = json!([{"type": "function", "name": "lookup_vehicle", "description": "Find a car",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}}}]);
    let body = json!({"model": "gpt-4o-mini", "input": ASK, "tools": tools});
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "{r}");
    let call = &r["output"][0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "lookup_vehicle");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["vin"], "WVWZZZ1JZXW000001");
    let next = json!({"model": "gpt-4o-mini", "tools": tools, "previous_response_id": r["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "{\"model\":\"Golf\"}"}]});
    let (status, done) = create(&app, &token, &next).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["output"][0]["type"], "message");
    let sent = last_sent(&app, KEY_A);
    assert_eq!(sent["input"][1]["type"], "function_call");
    assert_eq!(sent["input"][2]["type"], "function_call_output");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_conversation_grown_past_the_models_input_cap_is_refused_whole_never_truncated() {
    let app = spawn_app_with(|s, _| s.models[0].max_input_tokens = 150).await;
    let (_, token) = app.token("ola", Some("10")).await;
    let (_, mut last) = create(&app, &token, &ask()).await;
    let mut refused = None;
    for turn in 1..10 {
        let body = json!({"model": "gpt-4o-mini", "input": "Tell me more.", "previous_response_id": last["id"]});
        let sent_before = app.mock.state.total_count();
        let (status, r) = create(&app, &token, &body).await;
        if status == 400 {
            assert_eq!(r["error"]["param"], "input", "{r}");
            assert!(
                r["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("accepts at most 150"),
                "{r}"
            );
            assert_eq!(app.mock.state.total_count(), sent_before, "nothing sent");
            refused = Some(turn);
            break;
        }
        assert_eq!(status, 200, "{r}");
        // Every turn sent carried the whole conversation from its first message.
        let sent = last_sent(&app, KEY_A);
        assert_eq!(sent["input"][0], json!({"role": "user", "content": ASK}));
        assert_eq!(sent["input"].as_array().unwrap().len(), 1 + 2 * turn);
        last = r;
    }
    assert!(
        refused.is_some(),
        "the chain outgrew 150 tokens within 10 turns"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_retried_response_is_charged_once_and_a_failed_one_nothing() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(route("b", "gpt-4o-mini-upstream"));
    })
    .await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let unavailable = Script {
        status: Some(503),
        ..Script::default()
    };
    app.mock.state.script(KEY_A, [unavailable.clone()]);
    app.mock.state.script(KEY_B, [unavailable.clone()]);
    // CHECKS Q6 on this route: 503, 503 (each key once), then 200 after the backoff —
    // one request-log row with 3 attempts, one charge.
    let (status, r) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{r}");
    app.wait_for_log_rows(1).await;
    assert_eq!(app.scalar("SELECT attempts FROM requests").await, 3);
    assert_eq!(charged(&app, token_id).await, cost(12, 24));
    // Every key failing: 502 in OpenAI's shape, nothing charged, nothing stored.
    app.mock.state.sticky(
        "*",
        Some(Script {
            status: Some(500),
            ..Script::default()
        }),
    );
    let (status, err) = create(&app, &token, &ask()).await;
    assert_eq!(status, 502, "{err}");
    assert_eq!(err["error"]["code"], "upstream_error");
    assert_eq!(charged(&app, token_id).await, cost(12, 24));
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 1);
    app.assert_invariant().await;
}

/// The retention sweep deletes in batches of `SWEEP_BATCH` rows, each its own statement:
/// one `DELETE` of a whole backlog (after `retention_days` was lowered, or a long stop)
/// held the one SQLite write connection the money path shares for as long as it took, and
/// every reservation behind it waited (s25 attack, identity #3).
#[tokio::test]
async fn the_retention_sweep_deletes_a_backlog_batch_by_batch() {
    use sluice::store::responses::{sweep, sweep_batch, SWEEP_BATCH};
    let app = spawn_app().await;
    let old = sluice::clock::db_time(chrono::Utc::now() - chrono::Duration::days(40));
    let fresh = sluice::clock::db_time(chrono::Utc::now());
    let n = 2 * SWEEP_BATCH + 7;
    sql_exec(
        app.db(),
        &format!(
            "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {n})
             INSERT INTO stored_responses (id, token_id, created_at, input, response)
             SELECT 'resp_' || i, 1, '{old}', '[]', '{{}}' FROM g"
        ),
    )
    .await;
    sql_exec(
        app.db(),
        &format!("INSERT INTO stored_responses (id, token_id, created_at, input, response) VALUES ('resp_kept', 1, '{fresh}', '[]', '{{}}')"),
    )
    .await;
    let before = chrono::Utc::now() - chrono::Duration::days(30);
    assert_eq!(
        sweep_batch(app.db(), before).await.unwrap(),
        SWEEP_BATCH as u64,
        "one statement deletes one batch"
    );
    assert_eq!(
        sweep(app.db(), before).await.unwrap(),
        (SWEEP_BATCH + 7) as u64
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 1);
}

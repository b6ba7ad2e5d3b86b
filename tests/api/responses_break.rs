//! Attacks on the Responses endpoint, its stored responses and its money: a continuation
//! whose own `input` is of the wrong type, a conversation grown past the body limit by
//! `previous_response_id`, a delete past the retention, and an input whose size the
//! gateway cannot count.

use std::sync::Arc;

use serde_json::{json, Value};
use sluice::clock::ManualClock;
use sluice::mock::Script;

use crate::helpers::*;
use crate::responses::{ask, charged, cost, create, fetch, get};

/// A continuation's own `input` is read as strictly as a first turn's: a number, an object
/// or an empty string is refused naming `input`, never dropped in favour of the stored
/// conversation (which the upstream would then answer again, at the client's cost).
#[tokio::test]
async fn a_continuation_whose_input_is_not_items_is_refused_not_dropped() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let (status, first) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap();
    let spent = charged(&app, token_id).await;
    let calls = app.mock.state.total_count();
    for input in [
        json!(42),
        json!(true),
        json!({"role": "user", "content": "And if it stays on?"}),
        json!(""),
    ] {
        let body = json!({"model": "gpt-4o-mini", "input": input, "previous_response_id": id});
        let (status, err) = create(&app, &token, &body).await;
        assert_eq!(status, 400, "input {input}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
        assert_eq!(err["error"]["param"], "input", "input {input}: {err}");
    }
    assert_eq!(app.mock.state.total_count(), calls, "no upstream call");
    assert_eq!(charged(&app, token_id).await, spent, "nothing charged");
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 1);
    app.assert_invariant().await;
}

/// `server.max_body_bytes` bounds what one request makes the gateway hold, send upstream
/// and store. A chain of turns, each under the limit, must not build a conversation past it:
/// images count ~1 105 tokens whatever their bytes, so the input cap alone lets a chain
/// carry a hundred bodies' worth of image data, held in memory, sent and stored again on
/// every turn.
#[tokio::test]
async fn a_chain_cannot_grow_the_conversation_past_the_body_limit() {
    const LIMIT: usize = 100_000;
    let app = spawn_app_full(|s, _| s.server.max_body_bytes = LIMIT, None).await;
    let (_, token) = app.token("ola", Some("10")).await;
    let turn = |n: usize| {
        let image = format!("data:image/png;base64,{}", "QUFB".repeat(15_000 + n));
        json!([{"role": "user", "content": [
            {"type": "input_text", "text": format!("Picture {n}: what is this warning light?")},
            {"type": "input_image", "image_url": image}]}])
    };
    let (status, r) = create(
        &app,
        &token,
        &json!({"model": "gpt-4o-mini", "input": turn(0)}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let mut previous = r["id"].as_str().unwrap().to_string();
    let mut refused = None;
    for n in 1..6 {
        let body =
            json!({"model": "gpt-4o-mini", "input": turn(n), "previous_response_id": previous});
        assert!(serde_json::to_vec(&body).unwrap().len() < LIMIT);
        let (status, r) = create(&app, &token, &body).await;
        if status != 200 {
            refused = Some((n, status, r));
            break;
        }
        previous = r["id"].as_str().unwrap().to_string();
    }
    let largest_sent = app
        .mock
        .state
        .stats(KEY_A)
        .last_bodies
        .iter()
        .map(|b| b.to_string().len())
        .max()
        .unwrap();
    let largest_stored = app
        .scalar("SELECT MAX(LENGTH(input)) FROM stored_responses")
        .await;
    let (n, status, err) = refused.unwrap_or_else(|| {
        panic!(
            "every turn answered 200: the upstream got bodies of up to {largest_sent} bytes \
             and a stored row holds {largest_stored} bytes of input; max_body_bytes is {LIMIT}"
        )
    });
    assert_eq!(
        n, 1,
        "the first turn that grows past the limit is refused: {err}"
    );
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "input", "{err}");
    assert!(largest_sent < LIMIT, "sent upstream: {largest_sent} bytes");
    assert!(
        largest_stored < LIMIT as i64,
        "stored: {largest_stored} bytes"
    );
    app.assert_invariant().await;
}

/// Past the retention a stored response is gone for every verb: `DELETE` answers 404 as
/// `GET` does, not a 200 that says a response it would not show was there.
#[tokio::test]
async fn a_response_past_its_retention_is_not_found_by_delete_either() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let app = spawn_app_full(|s, _| s.responses.retention_days = 2, Some(clock.clone())).await;
    let (_, token) = app.token("ola", None).await;
    let (_, r) = create(&app, &token, &ask()).await;
    let id = r["id"].as_str().unwrap();
    clock.advance(chrono::Duration::days(3));
    assert_eq!(get(&app, id, &token).await.0, 404);
    let (status, body) = fetch(&app, reqwest::Method::DELETE, id, &token).await;
    assert_eq!(status, 404, "DELETE after GET said 404: {body}");
    assert_eq!(
        body["error"]["message"],
        format!("Response with id '{id}' not found.")
    );
}

/// An input whose size the gateway cannot count is no input it can reserve for: an
/// `input_file` by `file_url` is fetched and read by the upstream (every page's text and
/// image charged as input) while the gateway counts the URL's few tokens. Refused naming
/// `input`, as the translated path refuses it, never served to be absorbed.
#[tokio::test]
async fn a_file_by_url_that_the_gateway_cannot_count_is_refused() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    // The upstream read a 300-page manual: 200 000 input tokens.
    app.mock.state.script(
        KEY_A,
        [Script {
            prompt_tokens: Some(200_000),
            ..Script::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "max_output_tokens": 100, "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "Summarise the maintenance schedule."},
            {"type": "input_file", "file_url": "https://example.com/manual.pdf"}]}]});
    let (status, r) = create(&app, &token, &body).await;
    app.wait_settled().await;
    let absorbed = app.absorbed().await;
    assert_eq!(
        status,
        400,
        "served: charged {} micros, {absorbed} micros absorbed: {r}",
        charged(&app, token_id).await
    );
    assert_eq!(r["error"]["param"], "input", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("file_url"),
        "{r}"
    );
    assert_eq!(app.mock.state.total_count(), 0, "no upstream call");
    assert_eq!(charged(&app, token_id).await, 0);
    app.assert_invariant().await;
}

/// `retention_days = 0` keeps nothing (DESIGN's threat model: an operator who must keep
/// no content sets a short retention): no conversation is written to the database to
/// wait for the sweep, and no client is told `store: true` for an id that is never found.
#[tokio::test]
async fn a_retention_of_zero_days_stores_no_conversation() {
    let app = spawn_app_full(|s, _| s.responses.retention_days = 0, None).await;
    let (_, token) = app.token("ola", None).await;
    let (status, r) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let (got, _) = get(&app, id, &token).await;
    let rows = app.scalar("SELECT COUNT(*) FROM stored_responses").await;
    assert_eq!(
        (r["store"].clone(), rows),
        (json!(false), 0),
        "answered store: {}, GET {got}, {rows} row(s) holding the conversation",
        r["store"]
    );
    assert_eq!(got, 404);
}

/// A native stream cut before `response.completed` is charged the input plus the output
/// counted from what was received (DESIGN's cut-stream rule), whatever kind of delta
/// carried it: a Codex `apply_patch` (a custom tool: `response.custom_tool_call_input.delta`)
/// and raw reasoning text (`response.reasoning_text.delta`, gpt-oss on vLLM) are output the
/// upstream bills as any other.
#[tokio::test]
async fn a_cut_native_stream_charges_custom_tool_input_and_reasoning_text_received() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let sse = |v: Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
    let open = json!({"id": "resp_up", "object": "response", "status": "in_progress",
        "output": [], "model": "gpt-4o-mini-upstream"});
    let mut pieces = vec![
        sse(json!({"type": "response.created", "sequence_number": 0, "response": open})),
        sse(
            json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
        ),
    ];
    let mut received = String::new();
    let mut seq = 2;
    for i in 0..100 {
        let delta = format!("Step {i}: the patch must keep the blinking light's handler. ");
        received.push_str(&delta);
        pieces.push(sse(
            json!({"type": "response.reasoning_text.delta", "sequence_number": seq,
            "item_id": "rs_1", "output_index": 0, "content_index": 0, "delta": delta}),
        ));
        seq += 1;
    }
    pieces.push(sse(
        json!({"type": "response.output_item.added", "sequence_number": seq,
        "output_index": 1, "item": {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
        "name": "apply_patch", "input": ""}}),
    ));
    seq += 1;
    for i in 0..100 {
        let delta = format!("+    warning_light_{i}.blink(Duration::from_millis(500));\n");
        received.push_str(&delta);
        pieces.push(sse(json!({"type": "response.custom_tool_call_input.delta",
            "sequence_number": seq, "item_id": "ctc_1", "output_index": 1, "delta": delta})));
        seq += 1;
    }
    // Then the upstream's connection ends: no `response.completed`, no usage.
    app.mock.state.script(
        KEY_A,
        [Script {
            raw_stream: Some(pieces),
            ..Script::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "input": "Fix the blinking light.", "stream": true,
        "tools": [{"type": "custom", "name": "apply_patch"}]});
    let resp = app.post("/v1/responses", &token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("custom_tool_call_input.delta"), "{text}");
    app.wait_settled().await;
    let counted = sluice::pipeline::responses::validate(body.as_object().unwrap()).unwrap();
    let output = sluice::quota::estimate::count_text(&received);
    assert!(output > 1_000, "{output}");
    let charged = charged(&app, token_id).await;
    assert!(
        charged >= cost(counted, output) - 1,
        "charged {charged} micros: the input alone is {}, with the {output} output tokens received {}",
        cost(counted, 0),
        cost(counted, output)
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    app.assert_invariant().await;
}

/// A native answer without usage (a server behind an `openai` upstream that leaves it out)
/// is charged the counted input and the counted output — all of it: a custom tool's input
/// and reasoning text are output as a message's text is.
#[tokio::test]
async fn a_native_answer_without_usage_counts_custom_tool_input_and_reasoning_text() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let patch: String = (0..100)
        .map(|i| format!("+    warning_light_{i}.blink(Duration::from_millis(500));\n"))
        .collect();
    let thought: String = (0..100)
        .map(|i| format!("Step {i}: the patch must keep the blinking light's handler. "))
        .collect();
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(
                json!({"id": "resp_up", "object": "response", "status": "completed",
                "model": "gpt-4o-mini-upstream", "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": thought}]},
                {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1",
                 "name": "apply_patch", "input": patch, "status": "completed"}]}),
            ),
            ..Script::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "input": "Fix the blinking light.",
        "tools": [{"type": "custom", "name": "apply_patch"}]});
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "{r}");
    let counted = sluice::pipeline::responses::validate(body.as_object().unwrap()).unwrap();
    let output = sluice::quota::estimate::count_text(&format!("{thought}{patch}"));
    assert!(output > 1_000, "{output}");
    let charged = charged(&app, token_id).await;
    assert!(
        charged >= cost(counted, output) - 1,
        "charged {charged} micros: the input alone is {}, with the {output} output tokens answered {}",
        cost(counted, 0),
        cost(counted, output)
    );
    app.assert_invariant().await;
}

/// A non-streamed answer is in once the upstream has answered: a client that leaves while
/// the gateway stores the response (`store`, the default) is charged the answer's usage,
/// as one that leaves during the settlement is — not the input alone, which is what a
/// departure before the answer costs. The store is held here by a lock on its table
/// (PostgreSQL, so the ledger is not held with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_response_is_stored_is_charged_the_answer() {
    use crate::pg_gateway_app::{spawn_app_on, Engine};
    let app = spawn_app_on(Engine::Postgres, |_, _| {}).await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let pool = app.db().postgres().unwrap().pool.clone();
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE stored_responses IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // The client gives up once the upstream has answered and the store is waiting.
    let client = reqwest::Client::new();
    let (address, t) = (app.address.clone(), token.clone());
    let call = tokio::spawn(async move {
        client
            .post(format!("{address}/v1/responses"))
            .bearer_auth(t)
            .json(&ask())
            .timeout(std::time::Duration::from_secs(60))
            .send()
            .await
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while app.mock.state.total_count() == 0 {
        assert!(std::time::Instant::now() < deadline, "no upstream call");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The insert is waiting on the lock: then the client leaves.
    let waiting = "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO stored_responses%'";
    loop {
        let n: i64 = sqlx::query_scalar(waiting).fetch_one(&pool).await.unwrap();
        if n > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the insert never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    call.abort();
    let _ = call.await;
    // The departure is recorded (its settlement lands) before the store is let go.
    loop {
        let settles = app
            .scalar(&format!(
                "SELECT COUNT(*) FROM ledger WHERE token_id = {token_id} AND kind = 'settle'"
            ))
            .await;
        if settles > 0 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    lock.rollback().await.unwrap();
    let charged = charged(&app, token_id).await;
    let counted = sluice::pipeline::responses::validate(ask().as_object().unwrap()).unwrap();
    assert_eq!(
        charged,
        cost(12, 24),
        "the upstream answered 12 + 24 tokens; the input alone (counted {counted}) is {}",
        cost(counted, 0)
    );
    app.assert_invariant().await;
}

/// An operator who means "keep them for ever" writes a large `retention_days`: every read
/// (and every continuation, and the sweep) still works — the oldest kept instant is clamped
/// to the earliest time there is, never a date arithmetic overflow.
#[tokio::test]
async fn a_huge_retention_keeps_responses_readable() {
    let app = spawn_app_full(|s, _| s.responses.retention_days = u32::MAX, None).await;
    let (_, token) = app.token("ola", None).await;
    let (status, r) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let got = app
        .http
        .get(format!("{}/v1/responses/{id}", app.address))
        .bearer_auth(&token)
        .send()
        .await;
    let got = got.unwrap_or_else(|e| panic!("GET of a stored response: no answer ({e})"));
    assert_eq!(got.status(), 200);
    let body = json!({"model": "gpt-4o-mini", "input": "go on", "previous_response_id": id});
    assert_eq!(create(&app, &token, &body).await.0, 200);
    let before = sluice::pipeline::responses::oldest_kept(&app.state);
    let swept = sluice::store::responses::sweep(app.db(), before)
        .await
        .unwrap();
    assert_eq!(swept, 0);
}

/// A reasoning model reasons without being asked (`reasoning` left out: gpt-5's default
/// effort). The upstream gets `store: false`, so its reasoning item comes back without
/// `encrypted_content` unless `include` asks for it, and OpenAI answers a later turn that
/// carries that item by id with a 404 ("Items are not persisted when `store` is set to
/// false"). The second turn of such a conversation must still work.
#[tokio::test]
async fn a_conversation_with_unrequested_reasoning_can_be_continued() {
    let app = spawn_app().await;
    let (_, token) = app.token("ola", Some("10")).await;
    let reasons = || Script {
        reasoning_tokens: Some(64),
        ..Script::default()
    };
    app.mock.state.script(KEY_A, [reasons(), reasons()]);
    let (status, first) = create(&app, &token, &ask()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["output"][0]["type"], "reasoning", "{first}");
    let body = json!({"model": "gpt-4o-mini", "input": "And if it stays on?",
        "previous_response_id": first["id"]});
    let (status, second) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "the second turn: {second}");
    app.assert_invariant().await;
}

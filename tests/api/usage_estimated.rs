//! Issue 20: a request whose usage the gateway estimated (a side the upstream did not
//! report, charged the gateway's own count) says so in a column of its own,
//! `usage_estimated`, whatever its `error_code` — a departure (`client_disconnected`) whose
//! input was estimated keeps both marks — and the spend reports total how much of the spend
//! was estimated (`estimated_micros`), from the rollups kept on write.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::{Script, SseEvent};
use sluice::quota::estimate;
use tokio::io::AsyncReadExt;

use crate::admin_helpers::*;
use crate::helpers::*;

const BOUND: Duration = Duration::from_secs(10);

/// An OpenAI chunk of `text`, with its finish when given.
fn chunk(text: &str, finish: Option<&str>) -> SseEvent {
    SseEvent::Data(
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}),
    )
}

/// A whole stream — text, its finish, `[DONE]` — with its usage chunk when given.
fn whole_stream(usage: Option<(i64, i64)>) -> Script {
    let mut events = vec![chunk("The engine light ", None), chunk("", Some("stop"))];
    if let Some((i, o)) = usage {
        events.push(SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}}),
        ));
    }
    events.push(SseEvent::Data(json!("[DONE]")));
    Script {
        events: Some(events),
        ..Default::default()
    }
}

fn stream_body() -> Value {
    let mut b = chat_body(100);
    b["stream"] = json!(true);
    b
}

/// The token's one request row once logged and settled: (usage_estimated, error_code,
/// cost).
async fn row_of(app: &TestApp, token_id: i64) -> (bool, Option<String>, i64) {
    let rows = format!("SELECT COUNT(*) FROM requests WHERE token_id = {token_id}");
    let bound = Instant::now() + BOUND;
    loop {
        app.state.request_log.flush().await;
        if app.scalar("SELECT COUNT(*) FROM reservations").await == 0
            && app.scalar(&rows).await == 1
        {
            break;
        }
        assert!(Instant::now() < bound, "the request was never logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (estimated, code, cost): (i64, Option<String>, i64) = sql_row(
        app.db(),
        &format!(
            "SELECT CAST(CASE WHEN usage_estimated THEN 1 ELSE 0 END AS BIGINT), error_code, cost_micros FROM requests \
             WHERE token_id = {token_id}"
        ),
    )
    .await;
    (estimated == 1, code, cost)
}

/// A whole stream without its usage is charged the gateway's count: the column says so,
/// and `error_code` says `usage_estimated` as before; a stream and an answer with their
/// usage reported are not estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_its_usage_is_marked_estimated_and_a_reported_usage_is_not() {
    let app = spawn_app().await;

    let (id, token) = app.token("no-usage", Some("1")).await;
    app.mock.state.script(KEY_A, [whole_stream(None)]);
    let resp = app.chat(&token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(
        whole && data.last().is_some_and(|d| d == "[DONE]"),
        "{data:?}"
    );
    let (estimated, code, cost) = row_of(&app, id).await;
    assert!(estimated, "no usage: estimated");
    assert_eq!(code.as_deref(), Some("usage_estimated"));
    assert!(cost > 0);

    let (id, token) = app.token("reported", Some("1")).await;
    app.mock.state.script(KEY_A, [whole_stream(Some((12, 4)))]);
    let resp = app.chat(&token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    sse_data(resp).await;
    let (estimated, code, _) = row_of(&app, id).await;
    assert_eq!((estimated, code), (false, None), "a reported stream");

    let (id, token) = app.token("answer", Some("1")).await;
    let resp = app.chat(&token, &chat_body(50)).await;
    assert_eq!(resp.status(), 200);
    let (estimated, code, _) = row_of(&app, id).await;
    assert_eq!((estimated, code), (false, None), "a reported answer");
    app.assert_invariant().await;
}

/// A stream whose client leaves before the upstream reported its input pays the input
/// reserved for it and the output counted: its row keeps `client_disconnected` as its
/// code, and says it was estimated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_stream_with_an_estimated_input_is_marked_estimated_and_disconnected() {
    let app = spawn_app().await;
    let (id, token) = app.token("departed", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(vec![
                chunk("The engine ", None),
                chunk("light blinks ", None),
                chunk("because", None),
                SseEvent::Data(json!("[DONE]")),
            ]),
            stall_after: Some(2),
            ..Default::default()
        }),
    );
    let mut conn = send_raw_chat(&app.address, &token, &stream_body(), None).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        while !String::from_utf8_lossy(&got).contains("light blinks") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the two chunks came");
    drop(conn);
    let (estimated, code, cost) = row_of(&app, id).await;
    assert_eq!(code.as_deref(), Some("client_disconnected"));
    assert!(estimated, "its input was the gateway's count");
    assert!(cost > 0);
    app.mock.state.sticky(KEY_A, None);
    app.assert_invariant().await;
}

/// What finance reads: the request log's rows carry the column (and the page a marker),
/// and every spend report — JSON and CSV, over days and over whole months — totals the
/// estimated spend per group, the estimated requests' cost exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_and_the_spend_reports_show_the_estimated_spend() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (estimated_id, token) = app.token("estimated", Some("1")).await;
    for _ in 0..2 {
        app.mock.state.script(KEY_A, [whole_stream(None)]);
        let resp = app.chat(&token, &stream_body()).await;
        sse_data(resp).await;
    }
    let (reported_id, token) = app.token("reported", Some("1")).await;
    let resp = app.chat(&token, &chat_body(50)).await;
    assert_eq!(resp.status(), 200);
    app.wait_for_log_rows(3).await;
    app.wait_settled().await;
    let estimated_cost = app
        .scalar(&format!(
            "SELECT SUM(cost_micros) FROM requests WHERE token_id = {estimated_id}"
        ))
        .await;
    let reported_cost = app
        .scalar(&format!(
            "SELECT SUM(cost_micros) FROM requests WHERE token_id = {reported_id}"
        ))
        .await;
    assert!(estimated_cost > 0 && reported_cost > 0);

    let (status, v) = admin.get_json("/admin/api/v1/requests").await;
    assert_eq!(status, 200, "{v}");
    let rows = v["requests"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 3, "{v}");
    for r in &rows {
        let want = r["token_id"] == json!(estimated_id);
        assert_eq!(r["usage_estimated"], json!(want), "{r}");
    }
    let page = admin.get("/admin/requests").await.text().await.unwrap();
    assert_eq!(
        page.matches("class=\"estimated\"").count(),
        2,
        "the page marks the two estimated rows"
    );

    let today = chrono::Utc::now().date_naive();
    let day = |d: chrono::NaiveDate| d.format("%Y-%m-%d").to_string();
    let days = format!(
        "from={}&to={}",
        day(today),
        day(today + chrono::Duration::days(1))
    );
    // The current month: whole, read from the monthly level.
    for range in [days.as_str(), ""] {
        let (status, v) = admin
            .get_json(&format!(
                "/admin/api/v1/reports/spend?{range}&group_by=user"
            ))
            .await;
        assert_eq!(status, 200, "{v}");
        let by_user = |u: &str| {
            v["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["keys"][0] == json!(u)).cloned())
                .unwrap_or_else(|| panic!("{u} in {v}"))
        };
        let (e, r) = (by_user("estimated"), by_user("reported"));
        assert_eq!(
            (e["spend_micros"].as_i64(), e["estimated_micros"].as_i64()),
            (Some(estimated_cost), Some(estimated_cost)),
            "{range}: {v}"
        );
        assert_eq!(
            (r["spend_micros"].as_i64(), r["estimated_micros"].as_i64()),
            (Some(reported_cost), Some(0)),
            "{range}: {v}"
        );
        assert_eq!(
            v["total_estimated_micros"].as_i64(),
            Some(estimated_cost),
            "{range}: {v}"
        );
        let csv = admin
            .get(&format!(
                "/admin/api/v1/reports/spend?{range}&group_by=user&format=csv"
            ))
            .await
            .text()
            .await
            .unwrap();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("user,requests,input_tokens,output_tokens,spend_usd,estimated_usd"),
            "{csv}"
        );
        let estimated_line = lines
            .find(|l| l.starts_with("estimated,"))
            .unwrap_or_else(|| panic!("{csv}"));
        assert!(
            estimated_line.ends_with(&format!(",{}", sluice::quota::pricing::usd(estimated_cost))),
            "{estimated_line}"
        );
    }
}

/// A whole answer whose usage leaves the output out is charged its output counted, every
/// piece its stream would count (CHECKS Q3; attack s27 #5): Bedrock's reasoning and tool
/// call, Anthropic's thinking, an OpenAI-compatible server's `reasoning_content` — not the
/// text alone. The logged output is the pieces' count, to a token per piece.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_without_usage_counts_its_reasoning_and_tool_calls_as_its_stream_does() {
    const KEY_OC: &str = "oc-estimated-key-0123456789";
    const KEY_CL: &str = "cl-estimated-key-0123456789";
    const KEY_BR: &str = "AKIDESTIMATED";
    let app = spawn_app_with(|s, mock| {
        let mut oc = upstream("oc", KEY_OC, mock);
        oc.provider = Provider::OpenaiCompatible;
        let mut cl = upstream("cl", KEY_CL, mock);
        cl.provider = Provider::Anthropic;
        cl.base_url = mock.base_url();
        let br = bedrock_upstream("br", KEY_BR, mock);
        s.upstreams.extend([oc, cl, br]);
        for name in ["oc", "cl", "br"] {
            let mut m = model(name, &[name]);
            if name == "br" {
                m.routes[0].model = "anthropic.claude-3-5-sonnet-20240620-v1:0".into();
            }
            m.max_output_tokens = 8192;
            s.models.push(m);
        }
    })
    .await;
    let thought = "Weighing whether the engine light means the oil or the sensor. ".repeat(60);
    let args = json!({"query": "engine light oil sensor ".repeat(40)});
    let text = "Check the oil.";
    let cases = [
        (
            "oc",
            KEY_OC,
            json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                    "content": text, "reasoning_content": thought}}],
                "usage": {"prompt_tokens": 10}}),
            vec![text.to_string(), thought.clone()],
        ),
        (
            "cl",
            KEY_CL,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "thinking", "thinking": thought, "signature": "sig"},
                    {"type": "text", "text": text}],
                "stop_reason": "end_turn", "usage": {"input_tokens": 10}}),
            vec![text.to_string(), thought.clone()],
        ),
        (
            "br",
            KEY_BR,
            json!({"output": {"message": {"role": "assistant", "content": [
                    {"reasoningContent": {"reasoningText": {"text": thought, "signature": "sig"}}},
                    {"text": text},
                    {"toolUse": {"toolUseId": "tooluse_1", "name": "search", "input": args}}]}},
                "stopReason": "tool_use", "usage": {"inputTokens": 10}}),
            vec![
                text.to_string(),
                thought.clone(),
                "tooluse_1".to_string(),
                "search".to_string(),
                args.to_string(),
            ],
        ),
    ];
    for (name, key, answer, pieces) in cases {
        let (id, token) = app.token(&format!("whole-{name}"), Some("10")).await;
        app.mock.state.script(
            key,
            [Script {
                body: Some(answer),
                ..Script::default()
            }],
        );
        let mut body = chat_body(4000);
        body["model"] = json!(name);
        let resp = app.chat(&token, &body).await;
        let status = resp.status();
        assert_eq!(status, 200, "{name}: {}", resp.text().await.unwrap());
        let (estimated, _, _) = row_of(&app, id).await;
        assert!(estimated, "{name}: the output was counted");
        let output = app
            .scalar(&format!(
                "SELECT output_tokens FROM requests WHERE token_id = {id}"
            ))
            .await;
        let streamed: i64 = pieces.iter().map(|p| estimate::count_text(p)).sum();
        let n = pieces.len() as i64;
        assert!(
            (streamed - n..=streamed + n).contains(&output),
            "{name}: {output} output tokens counted, its stream counts {streamed}"
        );
    }
    app.assert_invariant().await;
}

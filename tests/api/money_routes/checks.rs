//! The money checks of one cell (a route on a gateway of one kind), each on a token of its
//! own: the exact charge, by hand from the prices of `cells::priced` (0.15 / 0.075 cached /
//! 0.60 micro-dollars per token, the sum rounded up once), then the invariant.

use serde_json::{json, Value};
use sluice::mock::Script;

use super::cells::{self, Gateway, Kind, CUT_MODEL, MODEL};
use super::{counted, Check, Route};
use crate::helpers::*;

/// Every request's one user turn.
pub(super) const PROMPT: &str = "Why does the engine light blink?";

/// The usage the mock reports for the answer and stream checks: 1000 prompt tokens of
/// which 600 read from the cache, 24 visible output tokens and 100 of reasoning.
pub(super) fn usage_script() -> Script {
    Script {
        prompt_tokens: Some(1000),
        cached_tokens: Some(600),
        completion_tokens: Some(24),
        reasoning_tokens: Some(100),
        ..Script::default()
    }
}

/// `usage_script`'s cost: 400 × 0.15 + 600 × 0.075 + (24 + 100) × 0.60 = 60 + 45 + 74.4 =
/// 179.4 → 180 micro-dollars.
const USAGE_COST: i64 = 180;

/// The mock's default answer, 12 prompt and 24 output tokens: 1.8 + 14.4 = 16.2 → 17.
const DEFAULT_COST: i64 = 17;

/// The tokenizer's count of `PROMPT`'s request on each route (its framing differs): the
/// input a stream without usage, or one its client left, is charged.
pub(super) fn counted_input(route: Route) -> i64 {
    match route {
        Route::Chat | Route::Messages => 17,
        Route::Responses => 14,
    }
}

/// The tokenizer's count of the mock's whole answer text.
pub(super) const TEXT_TOKENS: i64 = 23;

/// The tokens the gateway reserves for `PROMPT`'s input on `route`: the count × 1.10
/// rounded up, + 16 (DESIGN's margin): 17 → 35, 14 → 32.
fn reserved_input(route: Route) -> i64 {
    (counted_input(route) * 110 + 99) / 100 + 16
}

/// The worst case of `max` output tokens on `route`: its reserved input at 0.15 plus `max`
/// at 0.60, rounded up (chat with 100: 5.25 + 60 → 66).
pub(super) fn worst_case(route: Route, max: i64) -> i64 {
    cost(reserved_input(route), max)
}

/// `input` and `output` tokens at 0.15 and 0.60, rounded up.
pub(super) fn cost(input: i64, output: i64) -> i64 {
    (input * 150_000 + output * 600_000 + 999_999) / 1_000_000
}

/// The output cap of the reservation check.
const MAX: i64 = 100;

/// The mock's pieces a leaving client reads: "Hello ", "from ", "the ", "Sluice ", "mock ".
pub(super) const RECEIVED: usize = 5;
/// The tokenizer's count of those pieces' text, "Hello from the Sluice mock ".
pub(super) const RECEIVED_TOKENS: i64 = 8;

pub async fn run(gw: &Gateway, route: Route, check: Check) {
    let cell = format!("{route:?} × {:?} × {check:?}", gw.kind);
    match check {
        Check::Answer => answer(gw, route, &cell, false).await,
        Check::Stream => answer(gw, route, &cell, true).await,
        Check::Reservation => reservation(gw, route, &cell).await,
        Check::Overrun => overrun(gw, route, &cell).await,
        Check::UsageMissing => counted::usage_missing(gw, route, &cell).await,
        Check::ZeroAnswer => counted::zero_usage(gw, route, &cell, false).await,
        Check::ZeroStream => counted::zero_usage(gw, route, &cell, true).await,
        Check::Departure => counted::departure(gw, route, &cell).await,
        Check::UpstreamError => upstream_error(gw, route, &cell).await,
        Check::Retry => retry(gw, route, &cell).await,
        Check::CacheHit => cache_hit(gw, route, &cell).await,
    }
    gw.app.assert_invariant().await;
}

/// What the token has spent once nothing is reserved; its request-log rows agree.
pub(super) async fn spent(app: &TestApp, token_id: i64, cell: &str) -> i64 {
    app.wait_settled().await;
    app.state.request_log.flush().await;
    let spent = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros - reserved_micros FROM tokens WHERE id = {token_id}"
        ))
        .await;
    let logged = app
        .scalar(&format!(
            "SELECT COALESCE(SUM(cost_micros), 0) FROM requests WHERE token_id = {token_id}"
        ))
        .await;
    assert_eq!(
        spent, logged,
        "{cell}: the ledger and the request log agree"
    );
    spent
}

/// Reads a stream whole into its events.
pub(super) async fn frames(resp: reqwest::Response) -> Vec<cells::Frame> {
    let mut buf = resp.text().await.expect("the stream is read whole");
    buf.push_str("\n\n");
    cells::take_frames(&mut buf)
}

async fn answer(gw: &Gateway, route: Route, cell: &str, stream: bool) {
    let app = &gw.app;
    let (id, token) = app.token("answer", Some("1.00")).await;
    app.mock.state.script(&cells::key("main"), [usage_script()]);
    let resp = cells::send(
        app,
        route,
        &token,
        &cells::body(route, MODEL, PROMPT, 400, stream),
    )
    .await;
    assert_eq!(resp.status(), 200, "{cell}");
    let text = if stream {
        let frames = frames(resp).await;
        assert!(cells::completed(route, &frames), "{cell}: {frames:?}");
        frames
            .iter()
            .filter_map(|f| cells::delta_text(route, f))
            .collect()
    } else {
        let v: Value = resp.json().await.unwrap();
        cells::answer_text(route, &v).unwrap_or_else(|| panic!("{cell}: {v}"))
    };
    assert_eq!(text, sluice::mock::MockConfig::default().text, "{cell}");
    // Without a usage figure: the counted input and text (chat: 2.55 + 13.8 → 17).
    let expected = if stream && gw.kind == Kind::CompatibleNoUsage {
        cost(counted_input(route), TEXT_TOKENS)
    } else {
        USAGE_COST
    };
    assert_eq!(spent(app, id, cell).await, expected, "{cell}");
}

/// The budget's text for `micros`, six decimals.
fn usd(micros: i64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

async fn reservation(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    let worst = worst_case(route, MAX);
    let body = cells::body(route, MODEL, PROMPT, MAX, false);
    let before = app.mock.state.stats(&cells::key("main")).count;
    let (short_id, short) = app.token("short", Some(&usd(worst - 1))).await;
    let resp = cells::send(app, route, &short, &body).await;
    assert_eq!(resp.status(), 429, "{cell}: one micro-dollar short");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        cells::error_code(route, &v).as_deref(),
        Some("insufficient_quota"),
        "{cell}: {v}"
    );
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("budget"), "{cell}: {v}");
    assert_eq!(
        app.mock.state.stats(&cells::key("main")).count,
        before,
        "{cell}: nothing reached the upstream"
    );
    assert_eq!(spent(app, short_id, cell).await, 0, "{cell}");

    let (id, token) = app.token("exact", Some(&usd(worst))).await;
    let resp = cells::send(app, route, &token, &body).await;
    assert_eq!(resp.status(), 200, "{cell}: the worst case exactly");
    let sent = app.mock.state.stats(&cells::key("main"));
    let sent = sent.last_bodies.back().unwrap();
    let cap = [
        "/max_tokens",
        "/max_completion_tokens",
        "/max_output_tokens",
        "/generationConfig/maxOutputTokens",
        "/inferenceConfig/maxTokens",
    ]
    .iter()
    .find_map(|p| sent.pointer(p));
    assert_eq!(cap, Some(&json!(MAX)), "{cell}: the cap sent: {sent}");
    let reserved = app
        .scalar(&format!(
            "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = {id} AND kind = 'reserve'"
        ))
        .await;
    assert_eq!(reserved, worst, "{cell}: the reservation");
    assert_eq!(spent(app, id, cell).await, DEFAULT_COST, "{cell}");
}

/// `usage_script` under a cap of 200: the reservation (chat: 35 × 0.15 + 200 × 0.60 =
/// 125.25 → 126; responses: 32 → 124.8 → 125) is below its cost, 180.
async fn overrun(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    // A stream without usage is charged its counted figures, which the reservation covers.
    let streams: &[bool] = match gw.kind {
        Kind::CompatibleNoUsage => &[false],
        _ => &[false, true],
    };
    for &stream in streams {
        let (id, token) = app.token("overrun", Some("1.00")).await;
        app.mock.state.script(&cells::key("main"), [usage_script()]);
        let resp = cells::send(
            app,
            route,
            &token,
            &cells::body(route, MODEL, PROMPT, 200, stream),
        )
        .await;
        assert_eq!(resp.status(), 200, "{cell} (stream: {stream})");
        let _ = resp.text().await;
        let reserved = worst_case(route, 200);
        app.wait_settled().await;
        let charged = app
            .scalar(&format!(
                "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        assert_eq!(
            charged, reserved,
            "{cell} (stream: {stream}): the reservation, no more"
        );
        let absorbed = app
            .scalar(&format!(
                "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = {id} AND kind = 'absorbed'"
            ))
            .await;
        assert_eq!(
            absorbed,
            USAGE_COST - reserved,
            "{cell} (stream: {stream}): the rest absorbed"
        );
        app.wait_for_log_rows(1).await;
        let logged = app
            .scalar(&format!(
                "SELECT COALESCE(SUM(cost_micros), 0) FROM requests WHERE token_id = {id}"
            ))
            .await;
        assert_eq!(
            logged, USAGE_COST,
            "{cell} (stream: {stream}): the log says the whole cost"
        );
    }
}

async fn upstream_error(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    let main = cells::key("main");
    for (status, expected, stream) in [
        (400, 400, false),
        (400, 400, true),
        (500, 502, false),
        (500, 502, true),
    ] {
        let (id, token) = app.token("refused", Some("1.00")).await;
        app.mock.state.script(
            &main,
            [Script {
                status: Some(status),
                ..Script::default()
            }],
        );
        let before = app.mock.state.stats(&main).count;
        let resp = cells::send(
            app,
            route,
            &token,
            &cells::body(route, MODEL, PROMPT, 200, stream),
        )
        .await;
        assert_eq!(
            resp.status(),
            expected,
            "{cell}: upstream {status} (stream: {stream})"
        );
        let v: Value = resp.json().await.unwrap();
        if status == 400 {
            // The client's fault, passed on in the client's format with the upstream's words.
            let words = match gw.kind {
                Kind::Bedrock => "Scripted error from the Sluice mock.",
                _ => "mock error 400",
            };
            let message = cells::error_message(route, &v).unwrap_or_default();
            assert!(
                message.contains(words),
                "{cell}: upstream 400 (stream: {stream}): {v}"
            );
        } else {
            assert_eq!(
                cells::error_code(route, &v).as_deref(),
                Some("upstream_error"),
                "{cell}: upstream {status} (stream: {stream}): {v}"
            );
        }
        assert_eq!(
            app.mock.state.stats(&main).count,
            before + 1,
            "{cell}: upstream {status} (stream: {stream}): one attempt"
        );
        assert_eq!(
            spent(app, id, cell).await,
            0,
            "{cell}: upstream {status} (stream: {stream})"
        );
    }
    let (id, token) = app.token("cut", Some("1.00")).await;
    for stream in [false, true] {
        let resp = cells::send(
            app,
            route,
            &token,
            &cells::body(route, CUT_MODEL, PROMPT, 200, stream),
        )
        .await;
        assert_eq!(resp.status(), 502, "{cell}: a cut before any byte");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            cells::error_code(route, &v).as_deref(),
            Some("upstream_error"),
            "{cell}: {v}"
        );
    }
    assert_eq!(
        spent(app, id, cell).await,
        0,
        "{cell}: a cut before any byte"
    );
}

async fn retry(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    // Each route's first attempt fails its own way: a rate limit, an overload, a crash.
    let status = match route {
        Route::Chat => 429,
        Route::Messages => 503,
        Route::Responses => 500,
    };
    for stream in [false, true] {
        let [first, second] = cells::retry_upstreams(route, stream).map(|u| cells::key(&u));
        app.mock.state.script(
            &first,
            [Script {
                status: Some(status),
                headers: vec![("Retry-After".into(), "30".into())],
                ..Script::default()
            }],
        );
        let (id, token) = app.token("retried", Some("1.00")).await;
        let model = cells::retry_model(route, stream);
        let resp = cells::send(
            app,
            route,
            &token,
            &cells::body(route, &model, PROMPT, 200, stream),
        )
        .await;
        let what = format!("{cell} (stream: {stream}) after a {status}");
        assert_eq!(resp.status(), 200, "{what}");
        if stream {
            assert!(cells::completed(route, &frames(resp).await), "{what}");
        }
        let counts = (
            app.mock.state.stats(&first).count,
            app.mock.state.stats(&second).count,
        );
        assert_eq!(counts, (1, 1), "{what}: one attempt each");
        // A stream without usage is charged its counted figures (responses: 2.1 + 13.8 →
        // 16), any other the mock's default usage.
        let expected = if stream && gw.kind == Kind::CompatibleNoUsage {
            cost(counted_input(route), TEXT_TOKENS)
        } else {
            DEFAULT_COST
        };
        assert_eq!(
            spent(app, id, &what).await,
            expected,
            "{what}: charged once"
        );
        let reservations = app
            .scalar(&format!(
                "SELECT COUNT(*) FROM ledger WHERE token_id = {id} AND kind = 'reserve'"
            ))
            .await;
        assert_eq!(reservations, 1, "{what}: one reservation");
        let logged = app
            .scalar(&format!(
                "SELECT attempts FROM requests WHERE token_id = {id}"
            ))
            .await;
        assert_eq!(logged, 2, "{what}: one log row, two attempts");
    }
}

async fn cache_hit(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    for stream in [false, true] {
        let what = format!("{cell} (stream: {stream})");
        let (id, token) = app.token("cached", Some("1.00")).await;
        let prompt = format!("{PROMPT} ({route:?}, {stream})");
        let mut body = cells::body(route, MODEL, &prompt, 200, stream);
        body["temperature"] = json!(0);
        let entries = app.scalar("SELECT COUNT(*) FROM cache_entries").await;
        let resp = cells::send(app, route, &token, &body).await;
        assert_eq!(resp.status(), 200, "{what}");
        assert_eq!(resp.headers()["x-sluice-cache"], "miss", "{what}");
        let first = answer_of(route, resp, stream, &what).await;
        // The miss pays its usage (a stream without one pays its count, which the stream
        // check pins: this prompt is longer).
        let paid = spent(app, id, &what).await;
        if !(stream && gw.kind == Kind::CompatibleNoUsage) {
            assert_eq!(paid, DEFAULT_COST, "{what}: the miss");
        }
        app.wait_for_cache_entries(entries + 1).await;
        let calls = app.mock.state.stats(&cells::key("main")).count;
        let resp = cells::send(app, route, &token, &body).await;
        assert_eq!(resp.status(), 200, "{what}");
        assert_eq!(resp.headers()["x-sluice-cache"], "hit-exact", "{what}");
        assert_eq!(answer_of(route, resp, stream, &what).await, first, "{what}");
        assert_eq!(
            app.mock.state.stats(&cells::key("main")).count,
            calls,
            "{what}: the hit reached no upstream"
        );
        assert_eq!(
            spent(app, id, &what).await,
            paid,
            "{what}: the hit cost nothing"
        );
        let hit = app
            .scalar(&format!(
                "SELECT cost_micros FROM requests WHERE token_id = {id} AND cache = 'hit-exact'"
            ))
            .await;
        assert_eq!(hit, 0, "{what}: the hit's log row");
    }
}

/// The answer text of a whole answer or a complete stream.
pub(super) async fn answer_of(
    route: Route,
    resp: reqwest::Response,
    stream: bool,
    what: &str,
) -> String {
    if stream {
        let frames = frames(resp).await;
        assert!(cells::completed(route, &frames), "{what}: {frames:?}");
        return frames
            .iter()
            .filter_map(|f| cells::delta_text(route, f))
            .collect();
    }
    let v: Value = resp.json().await.unwrap();
    cells::answer_text(route, &v).unwrap_or_else(|| panic!("{what}: {v}"))
}

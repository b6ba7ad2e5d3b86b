//! Price layers that never under-price a kind (issue 20, findings 2 and 12): a kind a
//! config or admin price leaves out is billed at the bundled entry's price for the route's
//! upstream model, else — on a route Anthropic bills — at Anthropic's multipliers of the
//! input price, charged to the micro against hand-computed figures; an admin price prices
//! only the upstream model it was set for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sluice::clock::{Clock, ManualClock};
use sluice::config::{PriceKeys, Provider};
use sluice::mock::{Script, SseEvent};

use crate::admin_helpers::{login, make_login};
use crate::helpers::*;

const CLAUDE_KEY: &str = "sk-price-layers-anthropic-0123";

/// `tests/fixtures/anthropic/usage/<name>` as JSON.
fn fixture(name: &str) -> Value {
    let p = format!(
        "{}/tests/fixtures/anthropic/usage/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&p).expect(&p)).expect(&p)
}

/// Two models priced in the config with input (3 USD) and output (15 USD) only, as every
/// config written before cache writes and searches had prices: `listed` routed to a
/// Claude model the bundled table prices, `unlisted` to one it does not.
async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        let mut c = upstream("c", CLAUDE_KEY, mock);
        c.provider = Provider::Anthropic;
        c.base_url = mock.base_url();
        s.upstreams.push(c);
        for (name, upstream_model) in [
            ("listed", "claude-sonnet-4-5-20250929"),
            ("unlisted", "claude-private-1"),
        ] {
            let mut m = model(name, &["c"]);
            m.routes = vec![route("c", upstream_model)];
            m.price = PriceKeys::usd(3.0, 15.0);
            m.max_output_tokens = 8192;
            s.models.push(m);
        }
    })
    .await
}

/// What the token of one request was charged, and the request log's cost.
async fn charged(app: &TestApp, model: &str, script: Script, body: &Value) -> (i64, i64) {
    static SENT: AtomicUsize = AtomicUsize::new(0);
    let n = SENT.fetch_add(1, Ordering::Relaxed);
    let (id, token) = app.token(&format!("{model}-{n}"), Some("10")).await;
    app.mock.state.script(CLAUDE_KEY, [script]);
    let mut body = body.clone();
    body["model"] = json!(model);
    let resp = app.messages(&token, &body).await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{model}: {text}");
    app.wait_settled().await;
    let row = format!("FROM requests WHERE token_id = {id}");
    for _ in 0..500 {
        if app.scalar(&format!("SELECT COUNT(*) {row}")).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let spent = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    (
        spent,
        app.scalar(&format!("SELECT cost_micros {row}")).await,
    )
}

/// A Messages request marking a one-hour cache write and offering web search.
fn searching() -> Value {
    json!({"max_tokens": 8000,
        "system": [{"type": "text", "text": "You are terse.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]})
}

/// The usage of `message.json` (1000 fresh, 20 000 read, 2000 5 m writes, 3000 1 h writes,
/// 500 out, 2 searches) on a price of input 3 and output 15 only: reads 0.30, 5 m writes
/// 3.75, 1 h writes 6 and searches 10 per 1 000 — the bundled entry's for the listed
/// model, Anthropic's 0.1× / 1.25× / 2× / $10 for the unlisted one, the same figures:
/// 1000 × 3 + 20 000 × 0.30 + 2000 × 3.75 + 3000 × 6 + 500 × 15 + 2 × 10 000 = 62 000.
/// (Before the layers were filled: reads and writes at 3 and searches free, 85 500.)
#[tokio::test]
async fn a_config_price_of_input_and_output_only_bills_cache_writes_and_searches_at_their_price() {
    let app = app().await;
    for model in ["listed", "unlisted"] {
        let whole = Script {
            body: Some(fixture("message.json")),
            ..Script::default()
        };
        assert_eq!(
            charged(&app, model, whole, &searching()).await,
            (62_000, 62_000),
            "{model}"
        );
    }
    app.assert_invariant().await;
}

/// An admin price is set for the upstream model the route served then: once the config
/// file re-points the model at another (dearer) upstream model, the old admin price no
/// longer applies — the config's price does — and the prices API says why.
#[tokio::test]
async fn an_admin_price_set_for_one_upstream_model_does_not_price_another() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone() as Arc<dyn Clock>)).await;
    let (_, token) = app.token("ann", Some("10")).await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let path = "/admin/api/v1/models/gpt-4o-mini/prices";
    let (status, body) = admin
        .post(
            path,
            &json!({"input_usd_per_mtok": "1.5", "output_usd_per_mtok": "3"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    clock.advance(Duration::milliseconds(5));

    // The file re-points the model at a dearer upstream model with its own price.
    let mut file = (*app.state.live.file()).clone();
    let m = file
        .models
        .iter_mut()
        .find(|m| m.name == "gpt-4o-mini")
        .unwrap();
    m.routes = vec![route("a", "gpt-dearer")];
    m.price = PriceKeys::usd(5.0, 15.0);
    app.state
        .live
        .reload_file(&app.state.db, || Ok(file))
        .await
        .unwrap();

    let ask = json!({"model": "gpt-4o-mini", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(app.chat(&token, &ask).await.status(), 200);
    app.wait_for_log_rows(1).await;
    let (input, output, cost): (i64, i64, i64) = sql_row(
        app.db(),
        "SELECT input_tokens, output_tokens, cost_micros FROM requests",
    )
    .await;
    assert_eq!(
        cost,
        (input * 5_000_000 + output * 15_000_000 + 999_999) / 1_000_000,
        "priced from the config, not the admin price set for `gpt-4o-mini-upstream`"
    );
    let (_, history) = admin.get_json(path).await;
    let route = &history["routes"][0];
    assert_eq!(route["in_force"]["source"], "config", "{history}");
    assert!(
        route["admin_price_not_applied"]
            .as_str()
            .is_some_and(|s| s.contains("gpt-4o-mini-upstream")),
        "{history}"
    );
    assert_eq!(
        history["admin_prices"][0]["upstream_models"],
        json!(["gpt-4o-mini-upstream"]),
        "{history}"
    );
    app.assert_invariant().await;
}

/// Cache writes the upstream does not split by lifetime (`cache_creation_input_tokens`
/// without `cache_creation`: Bedrock, older API versions) on a request that marked a
/// one-hour write are priced at the one-hour rate, the worst case: 1000 × 3 + 5000 × 6 +
/// 500 × 15 = 40 500 micros (at the five-minute rate, 29 250). Without a
/// one-hour mark they are five-minute writes: 1000 × 3 + 5000 × 3.75 + 500 × 15 = 29 250.
#[tokio::test]
async fn unsplit_cache_writes_of_a_request_marking_a_one_hour_write_are_priced_at_the_hour_rate() {
    let app = app().await;
    let mut answer = fixture("message.json");
    answer["usage"] = json!({"input_tokens": 1000, "cache_creation_input_tokens": 5000,
        "output_tokens": 500});
    let script = || Script {
        body: Some(answer.clone()),
        ..Script::default()
    };
    let hour = json!({"max_tokens": 8000,
        "system": [{"type": "text", "text": "You are terse.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    assert_eq!(
        charged(&app, "listed", script(), &hour).await,
        (40_500, 40_500)
    );
    // Streamed: `message_start` and `message_delta` both without the split.
    let usage = json!({"input_tokens": 1000, "cache_creation_input_tokens": 5000,
        "output_tokens": 500});
    let mut start = answer.clone();
    start["content"] = json!([]);
    let events = vec![
        SseEvent::Named(
            "message_start".into(),
            json!({"type": "message_start", "message": start}),
        ),
        SseEvent::Named(
            "content_block_start".into(),
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
        SseEvent::Named(
            "content_block_delta".into(),
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Sluice is a gateway."}}),
        ),
        SseEvent::Named(
            "content_block_stop".into(),
            json!({"type": "content_block_stop", "index": 0}),
        ),
        SseEvent::Named(
            "message_delta".into(),
            json!({"type": "message_delta", "usage": usage,
                "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
        ),
        SseEvent::Named("message_stop".into(), json!({"type": "message_stop"})),
    ];
    let streamed = Script {
        events: Some(events),
        ..Script::default()
    };
    let mut hour_streamed = hour.clone();
    hour_streamed["stream"] = json!(true);
    assert_eq!(
        charged(&app, "unlisted", streamed, &hour_streamed).await,
        (40_500, 40_500),
        "streamed"
    );
    let mut five = hour.clone();
    five["system"][0]["cache_control"] = json!({"type": "ephemeral"});
    assert_eq!(
        charged(&app, "unlisted", script(), &five).await,
        (29_250, 29_250)
    );
    app.assert_invariant().await;
}

/// A model whose routes are priced apart (each route's upstream model has its own bundled
/// entry) shows each route's price in the API and on the page, not the first route's for
/// all (s21a #6: the second route's $2.50 was shown as the first's $0.15).
#[tokio::test]
async fn the_models_view_shows_each_routes_own_price() {
    let app = spawn_app_with(|s, _| {
        let mut m = model("split", &["a"]);
        m.routes = vec![route("a", "gpt-4o-mini"), route("a", "gpt-4o")];
        // No config price: each route is priced by its own upstream model's entry.
        m.price = PriceKeys::default();
        s.models.push(m);
    })
    .await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (status, body) = admin.get_json("/admin/api/v1/models").await;
    assert_eq!(status, 200, "{body}");
    let split = body["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "split")
        .cloned()
        .unwrap();
    let routes = split["routes"].as_array().unwrap();
    let prices: Vec<(Value, Value, Value)> = routes
        .iter()
        .map(|r| {
            (
                r["model"].clone(),
                r["input_micros_per_mtok"].clone(),
                r["price_source"].clone(),
            )
        })
        .collect();
    assert_eq!(
        prices,
        vec![
            (json!("gpt-4o-mini"), json!(150_000), json!("bundled")),
            (json!("gpt-4o"), json!(2_500_000), json!("bundled")),
        ],
        "{split}"
    );
    assert_eq!(routes[1]["output_micros_per_mtok"], 10_000_000, "{split}");
    let page = admin.get("/admin/upstreams").await.text().await.unwrap();
    let row = |upstream_model: &str| {
        page.split("<tr")
            .find(|r| r.contains(&format!("a → {upstream_model}<")))
            .unwrap_or_else(|| panic!("no row for {upstream_model}: {page}"))
            .to_string()
    };
    assert!(row("gpt-4o-mini").contains("$0.15"), "{page}");
    assert!(
        row("gpt-4o").contains("$2.50") && row("gpt-4o").contains("$10"),
        "{page}"
    );
}

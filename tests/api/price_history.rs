//! Prices with history (issue 20 item 3): a request is priced at the price in force when
//! it started — a dated config price changes the price mid-month and each request is
//! charged its own, the month's report equal to the ledger; an admin edit applies from its
//! date, never in the past, only an admin may make it, and it is audited; the table of
//! admin prices is append-only; a model without a price stops `check-config` and the
//! start, by name, unless it says `free = true`.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};
use sluice::clock::{Clock, ManualClock};
use sluice::config::{DatedPrices, PriceKeys};

use crate::admin_helpers::{login, make_login};
use crate::helpers::*;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// `ceil((in × input + out × output) / 1 000 000)`, prices in micro-dollars per Mtok.
fn priced(tokens: (i64, i64), (input, output): (i64, i64)) -> i64 {
    (tokens.0 * input + tokens.1 * output + 999_999) / 1_000_000
}

/// The tokens and cost the request log holds for its `n`-th row (0-based, by time).
async fn logged(app: &TestApp, n: usize) -> ((i64, i64), i64) {
    let rows: Vec<(i64, i64, i64)> = sql_rows(
        app.db(),
        "SELECT input_tokens, output_tokens, cost_micros FROM requests ORDER BY created_at, id",
    )
    .await;
    let (i, o, c) = rows[n];
    ((i, o), c)
}

fn ask() -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64})
}

#[tokio::test]
async fn a_price_change_mid_month_charges_each_request_its_own_price_and_the_report_is_the_ledger()
{
    let clock = Arc::new(ManualClock::new(at("2026-03-10T12:00:00Z")));
    let app = spawn_app_full(
        |s, _| {
            let m = &mut s.models[0];
            m.price = PriceKeys::usd(1.0, 2.0);
            m.prices = vec![DatedPrices {
                effective: "2026-03-15".into(),
                keys: PriceKeys::usd(3.0, 7.0),
            }];
        },
        Some(clock.clone() as Arc<dyn Clock>),
    )
    .await;
    let (_, token) = app.token("ann", Some("10")).await;

    let r = app.chat(&token, &ask()).await;
    assert_eq!(r.status(), 200);
    app.wait_for_log_rows(1).await;
    let (tokens, cost) = logged(&app, 0).await;
    assert_eq!(cost, priced(tokens, (1_000_000, 2_000_000)), "price A");

    // Past the 15th: price B, for a streamed request as for a plain one.
    clock.advance(Duration::days(7));
    assert_eq!(app.chat(&token, &ask()).await.status(), 200);
    let mut stream = ask();
    stream["stream"] = json!(true);
    let (_, done) = sse_data(app.chat(&token, &stream).await).await;
    assert!(done);
    app.wait_for_log_rows(3).await;
    for n in [1, 2] {
        let (tokens, cost) = logged(&app, n).await;
        assert_eq!(
            cost,
            priced(tokens, (3_000_000, 7_000_000)),
            "price B, row {n}"
        );
    }
    app.assert_invariant().await;

    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (status, report) = admin
        .get_json("/admin/api/v1/reports/spend?month=2026-03&by=model")
        .await;
    assert_eq!(status, 200, "{report}");
    let ledger = app
        .scalar("SELECT COALESCE(SUM(amount_micros), 0) FROM ledger")
        .await;
    let logged_total = app.scalar("SELECT SUM(cost_micros) FROM requests").await;
    assert_eq!(report["total_micros"], ledger, "{report}");
    assert_eq!(ledger, logged_total);
}

#[tokio::test]
async fn an_admin_price_edit_applies_from_now_never_the_past_admins_only_and_is_audited() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone() as Arc<dyn Clock>)).await;
    let (_, token) = app.token("ann", Some("10")).await;
    make_login(&app, "root", "admin", None).await;
    make_login(&app, "fin", "finance", None).await;
    let admin = login(&app, "root").await;
    let path = "/admin/api/v1/models/gpt-4o-mini/prices";

    assert_eq!(app.chat(&token, &ask()).await.status(), 200);
    app.wait_for_log_rows(1).await;
    // Read before any edit: the row an edit must leave as it is.
    let (first_tokens, first_cost) = logged(&app, 0).await;

    let edit = |from: Option<&str>| {
        let mut v = json!({"input_usd_per_mtok": "1.5", "output_usd_per_mtok": "3"});
        if let Some(f) = from {
            v["effective_from"] = json!(f);
        }
        v
    };
    // The past is not repriced.
    let (status, body) = admin.post(path, &edit(Some("2020-01-01"))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("effective_from"), "{body}");
    // Finance reads prices and changes none.
    let finance = login(&app, "fin").await;
    let (status, body) = finance.post(path, &edit(None)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(finance.get_json(path).await.0, 200);
    // Half a price is refused, naming what is missing.
    let (status, body) = admin.post(path, &json!({"input_usd_per_mtok": "1"})).await;
    assert_eq!(status, 400);
    assert!(body.to_string().contains("output_usd_per_mtok"), "{body}");
    assert_eq!(app.scalar("SELECT COUNT(*) FROM model_prices").await, 0);

    // Dated now: the next request is priced at it, the earlier one kept its price.
    let (status, body) = admin.post(path, &edit(None)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["input_micros_per_mtok"], 1_500_000);
    clock.advance(Duration::milliseconds(5));
    assert_eq!(app.chat(&token, &ask()).await.status(), 200);
    app.wait_for_log_rows(2).await;
    let (tokens, cost) = logged(&app, 1).await;
    assert_eq!(cost, priced(tokens, (1_500_000, 3_000_000)));
    assert_eq!(
        (first_tokens, first_cost),
        logged(&app, 0).await,
        "unchanged"
    );
    assert_eq!(first_cost, priced(first_tokens, (150_000, 600_000)));

    // Audited: who, what it replaced and what it set.
    let (actor, before, after): (String, String, String) = sql_row(
        app.db(),
        "SELECT actor, before, after FROM audit_log WHERE action = 'model.price' AND target = 'model:gpt-4o-mini'",
    )
    .await;
    assert_eq!(actor, "root");
    let (before, after): (Value, Value) = (
        serde_json::from_str(&before).unwrap(),
        serde_json::from_str(&after).unwrap(),
    );
    assert_eq!(before["input_micros_per_mtok"], 150_000);
    assert_eq!(before["source"], "config");
    assert_eq!(after["input_micros_per_mtok"], 1_500_000);
    let (_, history) = admin.get_json(path).await;
    assert_eq!(
        history["routes"][0]["in_force"]["source"], "admin",
        "{history}"
    );
    assert_eq!(history["admin_prices"].as_array().unwrap().len(), 1);
    app.assert_invariant().await;

    // Append-only on the engine itself.
    for sql in [
        "UPDATE model_prices SET prices = '{}'",
        "DELETE FROM model_prices",
    ] {
        let refused = match app.db().postgres() {
            None => sqlx::query(sql)
                .execute(&app.db().sqlite().write)
                .await
                .map(|_| ()),
            Some(pg) => sqlx::query(sql).execute(&pg.pool).await.map(|_| ()),
        };
        let err = refused.expect_err(sql).to_string();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
}

/// A model priced by nothing stops `check-config` and `serve`, naming it; said free, it
/// starts and its requests cost 0.
#[tokio::test]
async fn a_model_without_a_price_stops_the_start_by_name_and_a_free_one_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let write = |extra: &str| {
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite://{}/sluice.db\"\n\
                 [[upstreams]]\nid = \"local\"\nprovider = \"openai_compatible\"\n\
                 base_url = \"http://127.0.0.1:9/v1\"\nallow_private_network = true\n\
                 quirks = {{ auth = \"none\" }}\n[[models]]\nname = \"house-llm\"\n\
                 routes = [{{ upstream = \"local\", model = \"llama-3-8b\" }}]\n{extra}",
                dir.path().display()
            ),
        )
        .unwrap()
    };
    write("");
    assert_start_refused(&config, &["model `house-llm` has no price"]).await;
    write("free = true\n");
    assert_config_accepted(&config).await;

    let app = spawn_app_with(|s, _| {
        let m = &mut s.models[0];
        m.price = PriceKeys::default();
        m.free = true;
    })
    .await;
    let (_, token) = app.token("ann", Some("1")).await;
    assert_eq!(app.chat(&token, &ask()).await.status(), 200);
    app.wait_for_log_rows(1).await;
    let (tokens, cost) = logged(&app, 0).await;
    assert!(tokens.0 > 0 && tokens.1 > 0);
    assert_eq!(cost, 0);
    app.assert_invariant().await;
}

/// A fallback is priced by the model that served, at its own schedule: here the bundled
/// table's figure for its upstream model, matched without its date suffix.
#[tokio::test]
async fn a_fallback_is_charged_its_own_bundled_price() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        let mut bundled = model("bundled-mini", &["b"]);
        bundled.routes = vec![route("b", "gpt-4.1-mini-2025-04-14")];
        bundled.price = PriceKeys::default();
        s.models.push(bundled);
        s.models[0].fallbacks = vec!["bundled-mini".into()];
    })
    .await;
    let (_, token) = app.token("ann", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [sluice::mock::Script {
            status: Some(500),
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &ask()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    app.wait_for_log_rows(1).await;
    let (tokens, cost) = logged(&app, 0).await;
    // gpt-4.1-mini: $0.40 in, $1.60 out per million tokens (the bundled table).
    assert_eq!(cost, priced(tokens, (400_000, 1_600_000)));
    app.assert_invariant().await;
}

//! Budgets that cannot be overdrawn: the CAS under concurrency, exact integer money,
//! edits during traffic, and period resets.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::clock::{Clock, ManualClock};
use sluice::mock::Script;
use sluice::quota::{estimate, pricing};
use sluice::usage::Usage;

use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, spawn_app_on_full, Engine};

const PRICES: pricing::Prices = pricing::Prices::plain(150_000, 600_000);

/// The reserved input tokens of `chat_body`.
fn reserved_input() -> i64 {
    let counted = estimate::chat_input(
        &[json!({"role": "user", "content": "Why does the engine light blink?"})],
        None,
    );
    pricing::input_with_margin(counted, 1.10, 16)
}

async fn fire(app: &Arc<TestApp>, token: &str, n: usize, body: Value) -> Vec<(u16, Value)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, token, body) = (app.clone(), token.to_string(), body.clone());
            tokio::spawn(async move {
                let resp = app.chat(&token, &body).await;
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn a_budget_for_exactly_100_admits_exactly_100_of_200_concurrent(engine: Engine) {
    let app = Arc::new(spawn_app_on(engine, |_, _| {}).await);
    let input = reserved_input();
    let per_request = pricing::cost(
        Usage {
            input,
            output: 100,
            ..Default::default()
        },
        PRICES,
    );
    // The mock reports exactly the worst case, so spend must equal the budget exactly.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(input),
            completion_tokens: Some(100),
            ..Default::default()
        }),
    );
    let budget = pricing::usd(100 * per_request);
    let (id, token) = app.token("alice", Some(&budget)).await;
    let results = fire(&app, &token, 200, chat_body(100)).await;
    let ok = results.iter().filter(|(s, _)| *s == 200).count();
    let refused: Vec<_> = results.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(ok, 100);
    assert_eq!(refused.len(), 100);
    assert!(refused
        .iter()
        .all(|(_, v)| v["error"]["code"] == "insufficient_quota"));
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        100,
        "exactly 100 reached the upstream"
    );
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        0
    );
    let spent = app
        .scalar("SELECT SUM(amount_micros) FROM ledger WHERE kind IN ('reserve', 'settle')")
        .await;
    assert_eq!(spent, 100 * per_request);
}
on_both_engines!(a_budget_for_exactly_100_admits_exactly_100_of_200_concurrent);

async fn the_reservation_is_the_worst_case_and_refunds_are_exact(engine: Engine) {
    let app = Arc::new(spawn_app_on(engine, |_, _| {}).await);
    let worst = pricing::cost(
        Usage {
            input: reserved_input(),
            output: 100,
            ..Default::default()
        },
        PRICES,
    );
    let (id, token) = app.token("bob", Some(&pricing::usd(2 * worst))).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 300,
            ..Default::default()
        }),
    );
    // Sampled throughout: spent + reserved (= limit − remaining) never above the limit.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (app, done) = (app.clone(), done.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                samples.push(
                    app.scalar(&format!(
                        "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
                    ))
                    .await,
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        })
    };
    let results = fire(&app, &token, 6, chat_body(100)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    assert!(samples.len() > 10, "sampled during the run");
    assert!(
        samples.iter().all(|s| *s <= 2 * worst),
        "spent + reserved over the limit: {samples:?}"
    );
    assert!(
        samples.contains(&(2 * worst)),
        "both worst cases were held at once"
    );
    assert_eq!(results.iter().filter(|(s, _)| *s == 200).count(), 2);
    let refused = results.iter().find(|(s, _)| *s == 429).unwrap();
    assert_eq!(refused.1["error"]["type"], "insufficient_quota");
    assert_eq!(app.mock.state.stats(KEY_A).max_concurrency, 2);
    app.assert_invariant().await;
    // Each answer really cost 12 in + 24 out = 17 micro-dollars: the rest came back.
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        2 * worst - 2 * 17
    );
}
on_both_engines!(the_reservation_is_the_worst_case_and_refunds_are_exact);

async fn insufficient_quota_tells_sdks_not_to_retry_and_when_the_budget_resets(engine: Engine) {
    let app = spawn_app_on(engine, |_, _| {}).await;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("0.000010"),
            reset: Some("daily"),
            ..issue_args("carl")
        })
        .await;
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers().get("x-should-retry").unwrap(), "false");
    let after = retry_after(resp.headers());
    assert!((1..=86_400).contains(&after));
    let (_, never) = app.token("carla", Some("0.000010")).await;
    let resp = app.chat(&never, &chat_body(100)).await;
    assert_eq!(resp.status(), 429);
    assert!(
        resp.headers().get("retry-after").is_none(),
        "a budget that never resets has no Retry-After"
    );
    assert_eq!(app.mock.state.total_count(), 0);
}
on_both_engines!(insufficient_quota_tells_sdks_not_to_retry_and_when_the_budget_resets);

async fn uneven_prices_stay_exact_over_hundreds_of_requests(engine: Engine) {
    let app = spawn_app_on(engine, |s, _| {
        s.models[0].price = sluice::config::PriceKeys::usd(0.13, 0.37);
    })
    .await;
    let prices = pricing::Prices::plain(130_000, 370_000);
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(7),
            completion_tokens: Some(11),
            ..Default::default()
        }),
    );
    let cost = pricing::cost(
        Usage {
            input: 7,
            output: 11,
            ..Default::default()
        },
        prices,
    );
    assert_eq!(cost, 5, "7 × 0.13 + 11 × 0.37 = 4.98 → 5");
    let worst = pricing::cost(
        Usage {
            input: reserved_input(),
            output: 11,
            ..Default::default()
        },
        prices,
    );
    let n = 300;
    let (id, token) = app
        .token("dora", Some(&pricing::usd(worst + cost * (n - 1))))
        .await;
    let mut ok = 0;
    loop {
        let status = app.chat(&token, &chat_body(11)).await.status().as_u16();
        if status != 200 {
            assert_eq!(status, 429);
            break;
        }
        ok += 1;
        assert!(ok <= n, "admitted past the budget");
    }
    assert_eq!(
        ok, n,
        "refused exactly when the remainder no longer covers the worst case"
    );
    app.assert_invariant().await;
    let remaining = app
        .scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(remaining, worst - cost);
}
on_both_engines!(uneven_prices_stay_exact_over_hundreds_of_requests);

async fn admin_edits_during_traffic_never_lose_spend(engine: Engine) {
    let app = Arc::new(spawn_app_on(engine, |_, _| {}).await);
    let (id, token) = app.token("erin", Some("10")).await;
    let traffic = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { fire(&app, &token, 200, chat_body(50)).await })
    };
    for i in 0..50 {
        let change = match i % 3 {
            0 => sluice::cli::BudgetChange::Limit(Some(10_000_000 + i * 1000)),
            1 => sluice::cli::BudgetChange::TopUp(1_000),
            _ => sluice::cli::BudgetChange::Adjust {
                micros: 3,
                reason: format!("test adjustment {i}"),
            },
        };
        sluice::cli::token_budget(app.db(), id, change, chrono::Utc::now())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let results = traffic.await.unwrap();
    let ok = results.iter().filter(|(s, _)| *s == 200).count() as i64;
    assert_eq!(ok, 200);
    app.assert_invariant().await;
    let charged = app.scalar(&format!("SELECT SUM(amount_micros) FROM ledger WHERE token_id = {id} AND kind IN ('reserve', 'settle')")).await;
    assert_eq!(charged, ok * 17, "every request's charge is in the ledger");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action LIKE 'budget.%'")
            .await,
        50
    );
}
on_both_engines!(admin_edits_during_traffic_never_lose_spend);

/// A refund follows a rollback's carry by its reason text; an operator's adjustment
/// written with that text was followed as one — a later refund took an estimate back
/// into a period it was never carried from (s32 last attack F4). Such a reason is refused,
/// naming why, and nothing is written; any other text is taken as ever.
async fn an_adjustment_cannot_take_a_carrys_reason(engine: Engine) {
    let app = spawn_app_on(engine, |_, _| {}).await;
    let (id, _) = app.token("gwen", Some("10")).await;
    let rows = format!("SELECT COUNT(*) FROM ledger WHERE token_id = {id}");
    let before = app.scalar(&rows).await;
    let forged =
        "the spend of period 2036-12-04, carried back: a clock ahead had rolled the level into it";
    let change = sluice::cli::BudgetChange::Adjust {
        micros: 5,
        reason: forged.into(),
    };
    let err = sluice::cli::token_budget(app.db(), id, change, chrono::Utc::now())
        .await
        .expect_err("a carry's reason is the gateway's own");
    assert!(err.to_string().contains("reason"), "{err}");
    assert_eq!(app.scalar(&rows).await, before, "nothing written");
    let change = sluice::cli::BudgetChange::Adjust {
        micros: 5,
        reason: "the spend of period 2036-12-04, refunded by hand".into(),
    };
    sluice::cli::token_budget(app.db(), id, change, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(app.scalar(&rows).await, before + 1);
    app.assert_invariant().await;
}
on_both_engines!(an_adjustment_cannot_take_a_carrys_reason);

async fn a_period_reset_under_load_splits_spend_between_the_periods(engine: Engine) {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let app =
        Arc::new(spawn_app_on_full(engine, |_, _| {}, Some(clock.clone() as Arc<dyn Clock>)).await);
    let (id, token) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("1"),
            reset: Some("daily"),
            ..issue_args("fred")
        })
        .await;
    let old_period = sql_text(
        app.db(),
        &format!("SELECT period FROM tokens WHERE id = {id}"),
    )
    .await;
    // 20 requests in flight across the boundary: they settle into the old period.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 300,
            ..Default::default()
        }),
    );
    let in_flight = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { fire(&app, &token, 20, chat_body(50)).await })
    };
    // All 20 reserved (they reach the upstream after their reservation) before the day turns.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while app.mock.state.stats(KEY_A).count < 20 {
        assert!(
            std::time::Instant::now() < until,
            "the 20 requests never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.advance(chrono::Duration::days(1));
    app.mock.state.sticky(KEY_A, None);
    let after = fire(&app, &token, 20, chat_body(50)).await;
    assert!(after.iter().all(|(s, _)| *s == 200));
    assert!(in_flight.await.unwrap().iter().all(|(s, _)| *s == 200));
    app.assert_invariant().await;
    let period_sum = |p: String| {
        let app = app.clone();
        async move {
            sql_int(app.db(), &format!(
                "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = {id} AND period = '{p}' AND kind IN ('reserve', 'settle')"
            ))
            .await
        }
    };
    let new_period = sql_text(
        app.db(),
        &format!("SELECT period FROM tokens WHERE id = {id}"),
    )
    .await;
    assert_ne!(old_period, new_period);
    assert_eq!(period_sum(old_period).await, 20 * 17);
    assert_eq!(period_sum(new_period).await, 20 * 17);
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000 - 20 * 17
    );
    let rolled = app.scalar(&format!("SELECT COUNT(*) FROM audit_log WHERE action = 'budget.period_reset' AND target = 'token:{id}'")).await;
    assert_eq!(
        rolled, 1,
        "the daily token rolled over once, with an audit row"
    );
}
on_both_engines!(a_period_reset_under_load_splits_spend_between_the_periods);

async fn the_user_and_team_budgets_cap_their_tokens(engine: Engine) {
    let app = spawn_app_on(engine, |_, _| {}).await;
    let now = chrono::Utc::now();
    sluice::cli::team_create(app.db(), "ops", Some("0.000100"), now)
        .await
        .unwrap();
    let args = sluice::cli::UserArgs {
        username: "gina",
        team: Some("ops"),
        rpm: None,
        tpm: None,
        budget_usd: Some("1"),
        reset: None,
    };
    sluice::cli::user_create(app.db(), &args, now)
        .await
        .unwrap();
    let (_, t1) = app.token("gina", Some("5")).await;
    let (_, t2) = app.token("gina", None).await;
    let mut ok = 0;
    for t in [&t1, &t2, &t1, &t2, &t1, &t2, &t1, &t2] {
        if app.chat(t, &chat_body(20)).await.status() == 200 {
            ok += 1;
        }
    }
    // The team's 100 micro-dollars decide: each request reserves ~24 and costs 17.
    assert!((4..=5).contains(&ok), "{ok}");
    app.assert_invariant().await;
    let team_spent = app
        .scalar("SELECT limit_micros - remaining_micros FROM teams WHERE name = 'ops'")
        .await;
    assert_eq!(team_spent, ok * 17);
    let resp: Value = app
        .http
        .get(format!("{}/v1/usage", app.address))
        .bearer_auth(&t1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["limit_usd"], "5.000000");
    assert_eq!(resp["reset"], "never");
    // Spent is the period's ledger (read as `limit − remaining` for a limited token, the
    // invariant, rather than summed on every call).
    let ledger = app
        .scalar(&format!(
            "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = {}",
            resp["token_id"]
        ))
        .await;
    assert!(ledger > 0);
    assert_eq!(resp["spent_micros"], ledger);
    assert_eq!(resp["reserved_micros"], 0);
}
on_both_engines!(the_user_and_team_budgets_cap_their_tokens);

async fn past_the_alert_threshold_answers_warn_and_switch_to_the_downgrade_model(engine: Engine) {
    let app = spawn_app_on(engine, |s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        let mut cheap = model("cheap", &["b"]);
        cheap.price = sluice::config::PriceKeys::usd(0.01, 0.02);
        s.models.push(cheap);
    })
    .await;
    let args = sluice::cli::IssueArgs {
        budget_usd: Some("0.000200"),
        downgrade_model: Some("cheap"),
        ..issue_args("hank")
    };
    let (_, token) = app.issue(args).await;
    // Each answer costs 17 micro-dollars: after 10 the token has used 85% (threshold 80%).
    for i in 0..10 {
        let resp = app.chat(&token, &chat_body(50)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "a");
        assert_eq!(
            resp.headers().get("x-sluice-budget-warning").is_some(),
            i >= 9,
            "request {i}"
        );
    }
    let resp = app.chat(&token, &chat_body(50)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("x-sluice-upstream").unwrap(),
        "b",
        "served by the downgrade model"
    );
    assert!(resp
        .headers()
        .get("x-sluice-budget-warning")
        .unwrap()
        .to_str()
        .unwrap()
        .contains('%'));
    assert_eq!(
        app.mock.state.stats(KEY_B).last_bodies[0]["model"],
        "cheap-upstream"
    );
    app.assert_invariant().await;
}
on_both_engines!(past_the_alert_threshold_answers_warn_and_switch_to_the_downgrade_model);

/// Attack finding (s16c, 5b): a JSON number in a counted field (a tool schema's `enum`,
/// `minimum`, `default`) was counted as one token whatever its length, and its digits were
/// never seen, though every tokenizer reads it as text: o200k takes up to three digits in
/// a token, Gemini's one. A schema of 20 000 eighteen-digit integers was reserved for
/// ~20 000 tokens where OpenAI counts 120 000 for the numbers alone, and the rest absorbed
/// (17 693 µ$ of 19 693 here, repeatably). A number is now counted as its text is, its
/// digits with it.
#[tokio::test]
async fn the_numbers_of_a_tool_schema_are_counted_as_their_digits_read() {
    let app = spawn_app().await;
    let numbers: Vec<Value> = (0..20_000u64)
        .map(|i| json!(123_456_789_012_345_678u64 + i * 7_919))
        .collect();
    // What OpenAI counts for the enum's numbers: each as written (six tokens of three
    // digits), the separators its rendering adds left to the margin.
    let reported: i64 = numbers
        .iter()
        .map(|n| estimate::count_text(&n.to_string()))
        .sum();
    assert_eq!(reported, 120_000);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10,
        "messages": [{"role": "user", "content": "Pick one."}],
        "tools": [{"type": "function", "function": {"name": "pick", "parameters": {
            "type": "object", "properties": {"id": {"type": "integer", "enum": numbers}}}}}]});
    let (id, token) = app.token("numbers", Some("100")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            prompt_tokens: Some(reported),
            completion_tokens: Some(10),
            ..Script::default()
        }],
    );
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let (spent, absorbed) = crate::server_tools::spent_and_absorbed(&app, id).await;
    assert_eq!(
        absorbed, 0,
        "the reservation fell short of the schema's numbers (charged {spent})"
    );
    app.assert_invariant().await;
}

//! The money promise under attack (issue 14), over HTTP: every field that multiplies output
//! is in the reservation, a client that leaves while its reservation waits for the writer
//! is charged nothing and leaves nothing reserved, and the request log agrees with the
//! ledger for every request.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice::quota::{estimate, pricing};
use sqlx::Connection;

use crate::helpers::*;

const PRICES: pricing::Prices = pricing::Prices {
    input: 150_000,
    output: 600_000,
    cached_input: 150_000,
};

/// The worst case of a `/v1/completions` request for `prompt` with `max_tokens` × `copies`.
fn completion_worst(prompt: &str, max_tokens: i64, copies: i64) -> i64 {
    let input = pricing::input_with_margin(estimate::count_text(prompt), 1.10, 16);
    pricing::cost(
        pricing::Usage {
            input,
            cached_input: 0,
            output: max_tokens * copies,
        },
        PRICES,
    )
}

#[tokio::test]
async fn best_of_is_priced_as_the_completions_the_upstream_bills() {
    let app = spawn_app().await;
    let prompt = "Write a haiku about budgets.";
    // Enough for three single completions, not for one request with best_of = 4.
    let budget = 3 * completion_worst(prompt, 100, 1);
    let (id, token) = app.token("carol", Some(&pricing::usd(budget))).await;
    let body = |extra: serde_json::Value| {
        let mut b = json!({"model": "gpt-4o-mini", "prompt": prompt, "max_tokens": 100});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let resp = app
        .post("/v1/completions", &token, &body(json!({"best_of": 4})))
        .await;
    assert_eq!(
        resp.status(),
        429,
        "best_of = 4 must reserve four completions"
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert_eq!(app.mock.state.stats(KEY_A).count, 0);

    let resp = app
        .post("/v1/completions", &token, &body(json!({"best_of": 2})))
        .await;
    assert_eq!(resp.status(), 200);
    // Out of range, below n, or on a route that has no best_of: refused, naming it.
    for (path, extra) in [
        ("/v1/completions", json!({"best_of": 20})),
        ("/v1/completions", json!({"best_of": 1, "n": 2})),
        ("/v1/completions", json!({"best_of": "many"})),
        (
            "/v1/chat/completions",
            json!({"best_of": 2, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        let resp = app.post(path, &token, &body(extra.clone())).await;
        assert_eq!(resp.status(), 400, "{path} {extra}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], "best_of", "{path} {extra}");
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
    app.assert_invariant().await;
    assert!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await
            > 0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_reservation_waits_is_charged_nothing() {
    let app = Arc::new(spawn_app().await);
    let (id, token) = app.token("dave", Some("1.00")).await;
    // Another connection holds SQLite's write lock: the reservation waits in the writer.
    let path = app.dir.path().join("sluice.db");
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .json(&chat_body(100))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up before an answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
    // Released (or never written) within seconds, without any restart.
    app.wait_settled().await;
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        0,
        "the upstream was never called"
    );
    let charged = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros + reserved_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(charged, 0, "nothing reserved, nothing charged");
    app.assert_invariant().await;
}

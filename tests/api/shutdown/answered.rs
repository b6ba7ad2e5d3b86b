//! The drain reaching a non-streamed request whose answer is already in, while it waits on
//! the store (its response's write, its settlement): charged the answer, it gets it.

use std::time::Duration;

use serde_json::json;
use sluice::mock::{MockConfig, MockServer, Script};

use super::{settled_by_their_rules, started, stopped_with_the_store_held, with_grace};
use crate::gateway_proc::db_and_token;
use crate::helpers::*;

/// Review finding (s21a, 2): the drain ended a request still waiting with a 503
/// `shutting_down` — also one whose answer was in, waiting on the store to keep its
/// Responses response or to settle. Charged the whole answer all the same (its reservation
/// settled at the answer's cost), its client got an error its SDK retries: paid twice. From
/// the answer on, the drain does not end the request; the store is waited on until
/// `STORED_BY` after the drain, and the answer goes out then, the settlement landing in
/// the background. A chat answer (waiting to settle) and a Responses one (to be stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_when_the_drain_comes_is_given_though_the_store_is_held() {
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
        // A one-second grace: the drain comes a second after the signal.
        let mut gateway = with_grace(dir.path(), &mock, 1).await;
        let (db, token) = db_and_token(dir.path(), "answered").await;
        mock.state.script(
            KEY_A,
            [Script {
                text: Some("Check the sensor.".into()),
                delay_ms: 400,
                ..Default::default()
            }],
        );
        let body = match path {
            "/v1/responses" => json!({"model": "gpt-4o-mini", "max_output_tokens": 100,
                "input": "Why does the engine light blink?"}),
            _ => chat_body(100),
        };
        let client = tokio::spawn(
            reqwest::Client::new()
                .post(format!("{}{path}", gateway.url))
                .bearer_auth(&token)
                .json(&body)
                .send(),
        );
        // Reserved, the request is on the upstream: the store is held from here (the
        // answer comes 400 ms on) until well past the workers' stop.
        started(&mock).await;
        let status = stopped_with_the_store_held(&mut gateway, dir.path()).await;
        assert!(status.success(), "{path}: {status:?}");
        let resp = tokio::time::timeout(Duration::from_secs(5), client)
            .await
            .expect("answered")
            .unwrap()
            .expect("the client got an answer, not a cut connection");
        assert_eq!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("Check the sensor."), "{path}: {text}");
        settled_by_their_rules(&db, path).await;
        let rows: Vec<(i64, Option<String>, i64)> =
            sql_rows(&db, "SELECT status, error_code, cost_micros FROM requests").await;
        assert_eq!(rows.len(), 1, "{path}: {rows:?}");
        assert_eq!(
            (rows[0].0, rows[0].1.as_deref()),
            (200, None),
            "{path}: {rows:?}"
        );
        assert!(rows[0].2 > 0, "{path}: {rows:?}");
    }
}

//! Sub-token authentication: formats, revocation within a second, expiry, no echo.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;
use crate::pg_gateway_app::Engine;
use sluice::cli::IssueArgs;

async fn status_and_body(app: &TestApp, req: reqwest::RequestBuilder) -> (u16, String) {
    let _ = app;
    let resp = req.json(&chat_body(5)).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn bad_credentials_are_one_indistinguishable_401() {
    let app = spawn_app().await;
    let (_, token) = app.token("alice", None).await;
    let url = format!("{}/v1/chat/completions", app.address);
    let mut typo = token.clone().into_bytes();
    typo[10] = if typo[10] == b'a' { b'b' } else { b'a' };
    let typo = String::from_utf8(typo).unwrap();
    let unknown = sluice::auth::token::generate().text;
    let cases = vec![
        app.http.post(&url),
        app.http.post(&url).bearer_auth("sk-sl-short"),
        app.http.post(&url).bearer_auth(&typo),
        app.http.post(&url).bearer_auth(&unknown),
        app.http.post(&url).bearer_auth("' OR 1=1 --"),
        app.http
            .post(&url)
            .header("authorization", "Basic Zm9vOmJhcg=="),
    ];
    let mut bodies = Vec::new();
    for req in cases {
        let (status, body) = status_and_body(&app, req).await;
        assert_eq!(status, 401);
        assert!(
            !body.contains(&typo) && !body.contains(&unknown) && !body.contains("OR 1=1"),
            "401 echoes nothing"
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        bodies.push(body);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every bad credential gets the same body"
    );
    assert_eq!(app.mock.state.total_count(), 0);

    let (status, _) = status_and_body(&app, app.http.post(&url).header("x-api-key", &token)).await;
    assert_eq!(status, 200, "x-api-key is accepted too");
}

/// DESIGN's rule is "a revocation from any replica or the CLI takes effect within 1 s". The
/// mechanism, shown step by step: the revocation moves the database's change counter, and
/// the gateway's next poll of that counter drops its cached tokens, so the very next request
/// is refused. The gateway polls on its own every 250 ms: a second revocation is refused
/// within 20 polls of 50 ms or more each (≥ 1 s; a slow machine only gets more time).
#[tokio::test]
async fn a_revoked_token_is_refused_within_a_second() {
    let app = spawn_app().await;
    let (id, token) = app.token("bob", None).await;
    let (id2, token2) = app.token("bob", None).await;
    for t in [&token, &token2] {
        assert_eq!(app.chat(t, &chat_body(5)).await.status(), 200, "cached");
    }
    // Revoke through a second connection to the database, as the CLI or another replica
    // would.
    let other = sluice::store::Db::connect(&app.settings).await.unwrap();
    let epoch = "SELECT value FROM meta WHERE key = 'token_epoch'";
    let before = app.scalar(epoch).await;
    sluice::cli::token_revoke(&other, id, chrono::Utc::now())
        .await
        .unwrap();
    assert!(
        app.scalar(epoch).await > before,
        "the revocation moves the change counter"
    );
    // One poll of the counter, whether this one or the gateway's own got there first.
    app.state.auth.refresh(&*app.state.clock).await.unwrap();
    assert_refused(app.chat(&token, &chat_body(5)).await).await;

    // Nobody polls for the gateway this time.
    sluice::cli::token_revoke(&other, id2, chrono::Utc::now())
        .await
        .unwrap();
    let mut accepted = 0;
    for poll in 0.. {
        let resp = app.chat(&token2, &chat_body(5)).await;
        if resp.status() == 401 {
            assert_refused(resp).await;
            break;
        }
        assert_eq!(resp.status(), 200);
        accepted += 1;
        assert!(
            poll < 20,
            "still accepted 20 polls (1 s) after the revocation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        app.mock.state.total_count(),
        2 + accepted,
        "no refused request reached the upstream"
    );
}

async fn assert_refused(resp: reqwest::Response) {
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
}

/// Expiry is judged on every request. On SQLite by the gateway's clock: on a manual clock
/// the token is accepted a millisecond before its expiry and refused at it. On PostgreSQL
/// by the database's clock, the one every host shares (a host's clock may be off:
/// `pg_clock_skew::an_expired_token_is_refused_by_a_host_whose_clock_lags`), which no test
/// clock moves: there in real time, accepted before its expiry and refused within a second
/// after it.
#[tokio::test]
async fn an_expired_token_is_refused() {
    if test_engine() == Engine::Postgres {
        let app = spawn_app().await;
        let expiry = chrono::Utc::now() + chrono::Duration::seconds(2);
        let expires = expiry.to_rfc3339();
        let (_, token) = app
            .issue(IssueArgs {
                expires: Some(&expires),
                ..issue_args("carol")
            })
            .await;
        assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
        let wait = (expiry + chrono::Duration::seconds(1)) - chrono::Utc::now();
        tokio::time::sleep(wait.to_std().unwrap_or_default()).await;
        assert_refused(app.chat(&token, &chat_body(5)).await).await;
        app.assert_invariant().await;
        return;
    }
    // A whole second, so the expiry written to the database and the clock agree to the ms.
    let now = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp(), 0).unwrap();
    let clock = std::sync::Arc::new(sluice::clock::ManualClock::new(now));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone())).await;
    let expires = (now + chrono::Duration::seconds(60)).to_rfc3339();
    let (_, token) = app
        .issue(IssueArgs {
            expires: Some(&expires),
            ..issue_args("carol")
        })
        .await;
    assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    clock.advance(chrono::Duration::milliseconds(59_999));
    assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    clock.advance(chrono::Duration::milliseconds(1));
    assert_refused(app.chat(&token, &chat_body(5)).await).await;
}

#[tokio::test]
async fn secrets_never_reach_the_database_in_clear() {
    let app = spawn_app().await;
    let (_, token) = app.token("dora", Some("2")).await;
    for _ in 0..3 {
        assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    }
    let resp = app.chat(&token, &serde_json::json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "x"}]})).await;
    let _ = resp.text().await;
    app.wait_for_log_rows(4).await;
    app.wait_settled().await;
    let hash_hex = hex::encode(sluice::auth::token::hash(&token));
    // The SQLite file and its log as bytes; on PostgreSQL every value of every table.
    let held: Vec<(String, String)> = match postgres_contents(app.db()).await {
        Some(text) => vec![("the PostgreSQL database".into(), text)],
        None => ["sluice.db", "sluice.db-wal"]
            .iter()
            .map(|file| {
                let bytes = std::fs::read(app.dir.path().join(file)).unwrap_or_default();
                (
                    file.to_string(),
                    String::from_utf8_lossy(&bytes).into_owned(),
                )
            })
            .collect(),
    };
    assert!(
        held.iter().any(|(_, text)| text.contains("gpt-4o-mini")),
        "the scan sees the request log"
    );
    for (file, text) in held {
        for secret in [
            &token[..],
            &token[token.len() - 12..],
            KEY_A,
            &KEY_A[KEY_A.len() - 12..],
            &hash_hex,
        ] {
            assert!(!text.contains(secret), "{file} holds a secret in clear");
        }
    }
}

/// The admin pages identify a token by its 8-character display prefix, never by a longer
/// piece of its text.
#[tokio::test]
async fn admin_pages_show_no_piece_of_a_token() {
    use crate::admin_helpers::{login, make_login};
    let app = spawn_app().await;
    let (_, token) = app.token("pia", Some("1")).await;
    for _ in 0..2 {
        assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    }
    app.wait_for_log_rows(2).await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let chars: Vec<char> = token.chars().collect();
    for page in [
        "/admin",
        "/admin/tokens",
        "/admin/requests",
        "/admin/reports",
        "/admin/api/v1/tokens",
        "/admin/api/v1/requests",
    ] {
        let html = admin.get(page).await.text().await.unwrap();
        if page.ends_with("tokens") {
            assert!(
                html.contains(&token[6..14]),
                "{page} shows the display prefix"
            );
        }
        for w in chars.windows(12) {
            let piece: String = w.iter().collect();
            assert!(!html.contains(&piece), "{page} contains `{piece}`");
        }
    }
}

/// Issue 17: "revocation … reach[es] every host within 1 s" — not only the gateway that
/// made it. Two gateway processes on one database, the token cached by both, revoked
/// through a third connection (the CLI's): each refuses it within 20 polls of 50 ms or more
/// (≥ 1 s; LISTEN/NOTIFY on PostgreSQL, the change counter's poll on either engine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_every_gateway_process_within_a_second() {
    use crate::gateway_proc::{db_and_token, start_gateway_full};
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let gateways = [
        start_gateway_full(dir.path(), &mock, &[], "").await,
        start_gateway_full(dir.path(), &mock, &[], "").await,
    ];
    let (db, token) = db_and_token(dir.path(), "rita").await;
    let id = sql_int(&db, "SELECT id FROM tokens").await;
    let http = reqwest::Client::new();
    let post = |url: &str| {
        http.post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&token)
            .json(&chat_body(5))
            .send()
    };
    for g in &gateways {
        assert_eq!(post(&g.url).await.unwrap().status(), 200, "cached");
    }
    sluice::cli::token_revoke(&db, id, chrono::Utc::now())
        .await
        .unwrap();
    let mut refused = [false; 2];
    for poll in 0.. {
        for (g, done) in gateways.iter().zip(refused.iter_mut()) {
            if *done {
                continue;
            }
            let resp = post(&g.url).await.unwrap();
            if resp.status() == 401 {
                assert_refused(resp).await;
                *done = true;
            } else {
                assert_eq!(resp.status(), 200);
            }
        }
        if refused.iter().all(|d| *d) {
            break;
        }
        assert!(
            poll < 20,
            "still accepted 20 polls (1 s) after the revocation: refused {refused:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A revocation made through this host's admin surface takes effect on this host at once:
/// it waited for the next epoch poll (up to 250 ms; on PostgreSQL its own notice), so a
/// request right after the revoke's 200 could still be let in
/// (`pg_admin_hosts::a_revocation_on_one_host_is_refused_on_the_other_within_a_second`
/// failed once so, on the revoking host).
#[tokio::test]
async fn a_revocation_through_the_admin_api_is_refused_at_once_on_the_same_host() {
    use crate::admin_helpers::{login, make_login};
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    // `GET /v1/models` authenticates from the token cache alone (no reservation re-checks
    // the row), so it shows what the cache still holds.
    let models = crate::pg_admin::models_status;
    for round in 0..5 {
        let (id, token) = app.token("quin", None).await;
        assert_eq!(models(&app.address, &token).await, 200, "cached");
        let (s, _) = admin
            .post(
                &format!("/admin/api/v1/tokens/{id}/revoke"),
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(s, 200);
        assert_eq!(
            models(&app.address, &token).await,
            401,
            "round {round}: let in right after its revocation"
        );
    }
}

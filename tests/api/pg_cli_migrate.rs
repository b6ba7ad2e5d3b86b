//! `sluice migrate-store` (issue 17 item 6): a SQLite install with traffic history — paid
//! requests on budgets at every level, admin edits, a revocation, sessions, a failed
//! sign-in, audit rows — copied into an empty PostgreSQL database by the real binary:
//! refused while its gateway runs and into a database that is not empty; after it, every
//! balance, ledger row and audit hash is equal on both sides, and a gateway started on the
//! PostgreSQL copy knows the same tokens with the same remaining budgets, and serves the
//! stored responses of the Responses API to the tokens that made them (and only to them).

use std::time::Duration;

use serde_json::{json, Value};
use sluice::mock::{MockConfig, MockServer};
use sluice::secrets::MasterKey;
use sluice::store::{audit, directory, ledger, tokens, Db};

use crate::admin_helpers::{client, login_form_at, post_login_at, PASSWORD};
use crate::gateway_proc::{db_and_token, start_gateway_full};
use crate::helpers::{chat_body, KEY_A};
use crate::pg_admin::{models_status, sluice};
use crate::pg_server;

async fn usage(base: &str, token: &str) -> Value {
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/usage"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// `POST /v1/responses` (stored, as by default); the response object.
async fn respond(base: &str, token: &str, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/responses"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    r.json().await.unwrap()
}

/// `GET /v1/responses/{id}`: (status, body).
async fn stored(base: &str, token: &str, id: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/responses/{id}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn chat(base: &str, token: &str) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&chat_body(50))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

/// What both sides must agree on, read through the store.
async fn spend_picture(db: &Db) -> Vec<sluice::store::spend::Group> {
    use sluice::store::spend::{self, Dim, SpendQuery};
    let day = |s| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
    let q = SpendQuery {
        from: day("2000-01-01"),
        to: day("2100-01-01"),
        group_by: vec![
            Dim::Day,
            Dim::Token,
            Dim::Model,
            Dim::Upstream,
            Dim::Tag("env".into()),
        ],
        filters: Default::default(),
        scope: None,
    };
    let rows = spend::report(db, &q).await.unwrap();
    assert!(rows.iter().any(|r| r.keys[4] == "prod"), "{rows:?}");
    rows
}

/// The same over whole months, by month: read from `spend_months`.
async fn month_picture(db: &Db) -> Vec<sluice::store::spend::Group> {
    use sluice::store::spend::{self, Dim, SpendQuery};
    let day = |s| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
    let q = SpendQuery {
        from: day("2000-01-01"),
        to: day("2100-01-01"),
        group_by: vec![Dim::Month, Dim::Token, Dim::Tag("env".into())],
        filters: Default::default(),
        scope: None,
    };
    let rows = spend::report(db, &q).await.unwrap();
    assert!(rows.iter().any(|r| r.keys[2] == "prod"), "{rows:?}");
    rows
}

async fn picture(db: &Db) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", tokens::list(db).await.unwrap()),
        format!("{:?}", directory::teams(db, None).await.unwrap()),
        format!("{:?}", directory::members(db, None).await.unwrap()),
        format!("{:?}", directory::logins(db, None).await.unwrap()),
        // The spend rollup, rebuilt on the copy, by every column it keeps (tags too) …
        format!("{:?}", spend_picture(db).await),
        // … and its monthly level, which a report over whole months reads.
        format!("{:?}", month_picture(db).await),
    ];
    let chain = audit::verify(db, &db.audit).await.unwrap();
    assert_eq!(chain.broken, None);
    out.push(format!("audit {} {}", chain.rows, chain.last_hash));
    out
}

#[tokio::test]
async fn a_sqlite_install_with_history_moves_to_postgres_verified_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let lite_gw = start_gateway_full(dir.path(), &mock, &[], "").await;
    let (db, paid) = db_and_token(dir.path(), "rosa").await;
    sluice::cli::admin_create(
        &db,
        "root",
        "admin",
        None,
        PASSWORD.into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let admin = crate::pg_admin_hosts::login_at(&lite_gw.url, "root").await;
    let (s, team) = admin
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "budget_usd": "30", "tags": "env:prod"}),
        )
        .await;
    assert_eq!(s, 201, "{team}");
    let (s, user) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "bert", "team_id": team["id"], "budget_usd": "20"}),
        )
        .await;
    assert_eq!(s, 201, "{user}");
    let mut texts = vec![paid.clone()];
    for budget in ["5", "7"] {
        let (s, t) = admin
            .post(
                "/admin/api/v1/tokens",
                &json!({"user_id": user["id"], "budget_usd": budget}),
            )
            .await;
        assert_eq!(s, 201, "{t}");
        texts.push(t["token"].as_str().unwrap().to_string());
    }
    for (n, t) in texts.iter().enumerate() {
        for _ in 0..=n {
            chat(&lite_gw.url, t).await;
        }
    }
    let (_, list) = admin.get_json("/admin/api/v1/tokens").await;
    let newest = list["tokens"][0]["id"].as_i64().unwrap();
    assert_eq!(
        admin
            .patch(
                &format!("/admin/api/v1/tokens/{newest}"),
                &json!({"budget_usd": "9"})
            )
            .await
            .0,
        200
    );
    // A stored conversation of two turns by the first token, one response by the second.
    let first = respond(
        &lite_gw.url,
        &texts[0],
        &json!({"model": "gpt-4o-mini", "input": "Why does the engine light blink?"}),
    )
    .await;
    let turn = respond(
        &lite_gw.url,
        &texts[0],
        &json!({"model": "gpt-4o-mini", "input": "And if it stays on?", "previous_response_id": first["id"]}),
    )
    .await;
    let other = respond(
        &lite_gw.url,
        &texts[1],
        &json!({"model": "gpt-4o-mini", "instructions": "Be brief.", "input": [{"role": "user", "content": "Tyre pressure?"}]}),
    )
    .await;
    let conversations = [(0, &first), (0, &turn), (1, &other)];
    let revoked = texts.pop().unwrap();
    assert_eq!(
        admin
            .post(&format!("/admin/api/v1/tokens/{newest}/revoke"), &json!({}))
            .await
            .0,
        200
    );
    let http = client();
    let (pre, csrf) = login_form_at(&http, &lite_gw.url).await;
    let r = post_login_at(
        &http,
        &lite_gw.url,
        &format!("sluice_login={pre}"),
        &csrf,
        "root",
        "wrong",
    )
    .await;
    assert_eq!(r.status(), 401);
    let mut before = Vec::new();
    for t in &texts {
        before.push(usage(&lite_gw.url, t).await);
    }
    assert!(
        before.iter().all(|u| u["spent_micros"].as_i64() > Some(0)),
        "{before:?}"
    );

    let from = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let to = pg_server::database();
    let nowhere = dir.path().join("none.toml");
    let (ok, _, err) = sluice(
        &nowhere,
        &["migrate-store", "--from", &from, "--to", &to],
        &[],
    );
    assert!(!ok && err.contains("a gateway is running"), "{err}");

    // The gateway stops (SIGTERM: it settles, flushes and unregisters), then the copy.
    let pid = lite_gw.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let mut lite_gw = lite_gw;
    for _ in 0..200 {
        if lite_gw.child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        lite_gw.child.try_wait().unwrap().is_some(),
        "the gateway stopped"
    );
    let lite_picture = picture(&db).await;
    assert_eq!(
        ledger::invariant_violations(&db).await.unwrap(),
        Vec::<String>::new()
    );

    let (ok, out, err) = sluice(
        &nowhere,
        &["migrate-store", "--from", &from, "--to", &to],
        &[],
    );
    assert!(ok, "migrate-store failed: {out}\n{err}");
    for table in [
        "tokens",
        "ledger",
        "audit_log",
        "requests",
        "admin_sessions",
        "login_failures",
        "stored_responses",
    ] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(table))
            .unwrap_or_default();
        assert!(
            !line.ends_with(" 0 rows") && !line.is_empty(),
            "{table}: {out}"
        );
    }
    let (ok, _, err) = sluice(
        &nowhere,
        &["migrate-store", "--from", &from, "--to", &to],
        &[],
    );
    assert!(
        !ok && err.contains("not empty"),
        "a second copy is refused: {err}"
    );

    // Both sides through the store: the same rows, balances, spend and audit chain.
    let key_hex =
        std::fs::read_to_string(sluice::secrets::key_file_for(&dir.path().join("sluice.db")))
            .unwrap();
    let key = MasterKey::from_hex(key_hex.trim()).unwrap();
    let pg = Db::open_postgres(&to, &key).await.unwrap();
    assert_eq!(picture(&pg).await, lite_picture);
    assert_eq!(
        ledger::invariant_violations(&pg).await.unwrap(),
        Vec::<String>::new()
    );

    // A gateway on the copy (another folder: another host) serves the same tokens with
    // the same remaining budgets, and refuses the revoked one.
    let host = tempfile::tempdir().unwrap();
    let env = [
        ("SLUICE_DATABASE_URL", to.as_str()),
        ("SLUICE_SECRET_KEY", key_hex.trim()),
    ];
    let pg_gw = start_gateway_full(host.path(), &mock, &env, "").await;
    for (t, was) in texts.iter().zip(&before) {
        let now = usage(&pg_gw.url, t).await;
        assert_eq!(
            (
                &now["remaining_micros"],
                &now["spent_micros"],
                &now["limit_micros"]
            ),
            (
                &was["remaining_micros"],
                &was["spent_micros"],
                &was["limit_micros"]
            )
        );
    }
    assert_eq!(models_status(&pg_gw.url, &revoked).await, 401);

    // The stored responses: each read back whole by the token that made it, still not by
    // another, and a conversation continues from the copy with its whole history.
    for (owner, response) in conversations {
        let id = response["id"].as_str().unwrap();
        assert_eq!(
            stored(&pg_gw.url, &texts[owner], id).await,
            (200, response.clone())
        );
        let (s, body) = stored(&pg_gw.url, &texts[1 - owner], id).await;
        assert_eq!(s, 404, "{body}");
    }
    let before_calls = mock.state.total_count();
    let next = respond(
        &pg_gw.url,
        &texts[0],
        &json!({"model": "gpt-4o-mini", "input": "Thanks.", "previous_response_id": turn["id"]}),
    )
    .await;
    assert_eq!(next["previous_response_id"], turn["id"]);
    assert_eq!(mock.state.total_count(), before_calls + 1);
    let sent = mock.state.stats(KEY_A).last_bodies.back().cloned().unwrap();
    let said: Vec<&str> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["role"] == "user")
        .filter_map(|i| i["content"].as_str())
        .collect();
    assert_eq!(
        said,
        [
            "Why does the engine light blink?",
            "And if it stays on?",
            "Thanks."
        ],
        "{sent}"
    );
}

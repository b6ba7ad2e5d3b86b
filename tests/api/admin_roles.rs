//! Who may do what: a lead inside their team only (another team's ids answer 404), within
//! its budget, never a role; finance reads and changes nothing; every action one audit row.

use reqwest::Method;
use serde_json::{json, Value};

use crate::admin_helpers::*;
use crate::audit_tamper::{Attacker, Tamper};
use crate::helpers::*;

struct World {
    app: TestApp,
    admin: Session,
    red_member: i64,
    blue_member: i64,
    red_token: i64,
    blue_token: i64,
    blue_token_text: String,
}

async fn world() -> World {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (s, red) = admin
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "budget_usd": "10"}),
        )
        .await;
    assert_eq!(s, 201, "{red}");
    let (s, blue) = admin
        .post("/admin/api/v1/teams", &json!({"name": "blue"}))
        .await;
    assert_eq!(s, 201);
    let (s, rm) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": red["id"]}),
        )
        .await;
    assert_eq!(s, 201, "{rm}");
    let (_, bm) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "bert", "team_id": blue["id"]}),
        )
        .await;
    let (s, _) = admin.post("/admin/api/v1/users", &json!({"username": "lena", "role": "lead", "team_id": red["id"], "password": PASSWORD})).await;
    assert_eq!(s, 201);
    let (s, _) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "fin", "role": "finance", "password": PASSWORD}),
        )
        .await;
    assert_eq!(s, 201);
    let (s, rt) = admin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": rm["id"], "budget_usd": "2"}),
        )
        .await;
    assert_eq!(s, 201, "{rt}");
    let (_, bt) = admin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": bm["id"], "budget_usd": "2"}),
        )
        .await;
    World {
        red_member: rm["id"].as_i64().unwrap(),
        blue_member: bm["id"].as_i64().unwrap(),
        red_token: rt["id"].as_i64().unwrap(),
        blue_token: bt["id"].as_i64().unwrap(),
        blue_token_text: bt["token"].as_str().unwrap().to_string(),
        app,
        admin,
    }
}

fn names(v: &Value, list: &str, field: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[field].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_lead_sees_and_changes_only_their_own_team() {
    let w = world().await;
    let lead = login(&w.app, "lena").await;
    let (_, teams) = lead.get_json("/admin/api/v1/teams").await;
    assert_eq!(names(&teams, "teams", "name"), ["red"]);
    let (_, users) = lead.get_json("/admin/api/v1/users").await;
    assert_eq!(names(&users, "members", "username"), ["rosa"]);
    assert_eq!(names(&users, "logins", "username"), ["lena"]);
    let (_, tokens) = lead.get_json("/admin/api/v1/tokens").await;
    assert_eq!(names(&tokens, "tokens", "user"), ["rosa"]);
    let tokens_page = lead.get("/admin/tokens").await.text().await.unwrap();
    assert!(
        !tokens_page.contains("bert"),
        "the page shows nothing of blue"
    );

    // Another team's ids answer 404, whatever the operation.
    let (b, bt, bu) = (2, w.blue_token, w.blue_member);
    let cases: Vec<(Method, String, Value)> = vec![
        (
            Method::PATCH,
            format!("/admin/api/v1/users/{bu}"),
            json!({"disabled": true}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/revoke"),
            json!({}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/rotate"),
            json!({}),
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/tokens/{bt}"),
            json!({"rpm": 5}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/top-up"),
            json!({"amount_usd": "1"}),
        ),
        (
            Method::POST,
            "/admin/api/v1/tokens".into(),
            json!({"user_id": bu, "budget_usd": "1"}),
        ),
        (
            Method::POST,
            "/admin/api/v1/users".into(),
            json!({"username": "sneaky", "team_id": b}),
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/teams/{b}"),
            json!({"budget_usd": "99"}),
        ),
        (
            Method::POST,
            format!("/admin/tokens/{bt}/revoke"),
            json!({}),
        ),
    ];
    let before = state_counts(&w.app).await;
    for (m, path, body) in cases {
        let (status, _) = lead.send(m.clone(), &path, &body).await;
        assert_eq!(status, 404, "{m} {path}");
    }
    for path in [
        "/admin/api/v1/requests?team=2",
        "/admin/api/v1/users?team=2",
        "/admin/api/v1/audit",
        "/admin/api/v1/upstreams",
        "/admin/audit",
        "/admin/upstreams",
    ] {
        assert_eq!(lead.get(path).await.status(), 404, "{path}");
    }
    assert_eq!(
        state_counts(&w.app).await,
        before,
        "nothing of blue changed"
    );

    // Inside the team: within its 10 USD budget, no CRITICAL, no roles, no team budget.
    let rm = w.red_member;
    assert_eq!(
        lead.post(
            "/admin/api/v1/tokens",
            &json!({"user_id": rm, "budget_usd": "20"})
        )
        .await
        .0,
        403
    );
    assert_eq!(
        lead.post("/admin/api/v1/tokens", &json!({"user_id": rm}))
            .await
            .0,
        403,
        "an unlimited token in a limited team"
    );
    assert_eq!(
        lead.post(
            "/admin/api/v1/tokens",
            &json!({"user_id": rm, "budget_usd": "1", "max_priority": 1})
        )
        .await
        .0,
        403
    );
    let (s, t) = lead
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": rm, "budget_usd": "5", "models": ["gpt-4o-mini"]}),
        )
        .await;
    assert_eq!(s, 201, "{t}");
    let tid = t["id"].as_i64().unwrap();
    assert_eq!(
        lead.post(
            &format!("/admin/api/v1/tokens/{tid}/top-up"),
            &json!({"amount_usd": "6"})
        )
        .await
        .0,
        403,
        "11 > 10"
    );
    assert_eq!(
        lead.post(
            &format!("/admin/api/v1/tokens/{tid}/top-up"),
            &json!({"amount_usd": "5"})
        )
        .await
        .0,
        200
    );
    assert_eq!(
        lead.patch("/admin/api/v1/teams/1", &json!({"budget_usd": "1000"}))
            .await
            .0,
        403
    );
    assert_eq!(
        lead.post(
            "/admin/api/v1/users",
            &json!({"username": "boss", "role": "admin", "password": PASSWORD})
        )
        .await
        .0,
        403
    );
    let (_, me) = lead.get_json("/admin/api/v1/me").await;
    let my_id = me["id"].as_i64().unwrap();
    assert_eq!(
        lead.patch(
            &format!("/admin/api/v1/logins/{my_id}"),
            &json!({"role": "admin"})
        )
        .await
        .0,
        403
    );
    assert_eq!(
        w.app
            .scalar("SELECT COUNT(*) FROM admins WHERE username = 'lena' AND role = 'lead'")
            .await,
        1
    );
    // A new member of a lead joins the lead's team, whatever the body says about roles.
    let (s, v) = lead
        .post(
            "/admin/api/v1/users",
            &json!({"username": "newbie", "role": "member"}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["team"], "red");
    assert_eq!(
        lead.post(
            &format!("/admin/api/v1/tokens/{}/revoke", w.red_token),
            &json!({})
        )
        .await
        .0,
        200
    );

    // The blue token was never touched: it still works.
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        200
    );
}

#[tokio::test]
async fn finance_reads_everything_and_changes_nothing() {
    let w = world().await;
    let fin = login(&w.app, "fin").await;
    for path in [
        "/admin/",
        "/admin/teams",
        "/admin/users",
        "/admin/tokens",
        "/admin/requests",
        "/admin/reports",
        "/admin/reports.csv",
        "/admin/audit",
        "/admin/account",
        "/admin/api/v1/teams",
        "/admin/api/v1/tokens",
        "/admin/api/v1/requests",
        "/admin/api/v1/audit",
        "/admin/api/v1/reports/spend",
        "/admin/upstreams",
        "/admin/api/v1/upstreams",
        "/admin/api/v1/models",
    ] {
        let r = fin.get(path).await;
        assert_eq!(r.status(), 200, "{path}");
        let body = r.text().await.unwrap();
        if path.starts_with("/admin/") && !path.contains("api") && !path.ends_with(".csv") {
            // No button, form or control that would change something; only signing out.
            let writes = body.matches("hx-post=").count() + body.matches("method=\"post\"").count();
            assert_eq!(writes, 1, "{path} offers a change:\n{body}");
            assert!(body.contains("hx-post=\"/admin/logout\""));
        }
    }
    let (_, teams) = fin.get_json("/admin/api/v1/teams").await;
    assert!(
        names(&teams, "teams", "name").contains(&"blue".to_string()),
        "finance reads across teams"
    );
    // Upstreams and models as admins see them: the key masked, never in clear.
    let (_, ups) = fin.get_json("/admin/api/v1/upstreams").await;
    let (_, admin_ups) = w.admin.get_json("/admin/api/v1/upstreams").await;
    assert_eq!(ups, admin_ups);
    let key = w.app.settings.upstreams[0].api_key.expose().to_string();
    assert!(!ups.to_string().contains(&key), "{ups}");
    assert!(ups["upstreams"][0]["key"]
        .as_str()
        .unwrap()
        .starts_with("****"));
    let (_, models) = fin.get_json("/admin/api/v1/models").await;
    assert!(!names(&models, "models", "name").is_empty(), "{models}");

    let before = state_counts(&w.app).await;
    let (rt, bt, rm) = (w.red_token, w.blue_token, w.red_member);
    let cases: Vec<(Method, String, Value)> = vec![
        (
            Method::POST,
            "/admin/api/v1/teams".into(),
            json!({"name": "fin-team"}),
        ),
        (
            Method::PATCH,
            "/admin/api/v1/teams/1".into(),
            json!({"budget_usd": "1"}),
        ),
        (
            Method::POST,
            "/admin/api/v1/users".into(),
            json!({"username": "x", "team_id": 1}),
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/users/{rm}"),
            json!({"disabled": true}),
        ),
        (
            Method::POST,
            "/admin/api/v1/tokens".into(),
            json!({"user_id": rm}),
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/tokens/{rt}"),
            json!({"rpm": 1}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/revoke"),
            json!({}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/rotate"),
            json!({}),
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{bt}/top-up"),
            json!({"amount_usd": "1"}),
        ),
        (
            Method::POST,
            "/admin/api/v1/upstreams/a/disable".into(),
            json!({}),
        ),
        (
            Method::POST,
            "/admin/api/v1/keys".into(),
            json!({"name": "k"}),
        ),
        (
            Method::POST,
            "/admin/api/v1/upstreams/a/test".into(),
            json!({}),
        ),
        (
            Method::POST,
            "/admin/api/v1/upstreams".into(),
            json!({"id": "f", "provider": "openai", "base_url": "https://api.openai.com/v1", "api_key": "sk-finance-0000"}),
        ),
        (
            Method::PUT,
            "/admin/api/v1/models/fin-model".into(),
            json!({"routes": [{"upstream": "a", "model": "gpt-4o-mini"}]}),
        ),
        (
            Method::POST,
            "/admin/teams".into(),
            json!({"name": "fin-team"}),
        ),
        (
            Method::POST,
            format!("/admin/tokens/{bt}/revoke"),
            json!({}),
        ),
        (
            Method::POST,
            "/admin/account/password".into(),
            json!({"current_password": PASSWORD, "new_password": "another long password"}),
        ),
    ];
    for (m, path, body) in cases {
        let (status, v) = fin.send(m.clone(), &path, &body).await;
        assert_eq!(status, 403, "{m} {path}: {v}");
    }
    assert_eq!(state_counts(&w.app).await, before);
}

/// Switching a config-file upstream whose audit row fails changes nothing: the pool is
/// switched only after the audited commit (before, the key stayed disabled, unaudited).
#[tokio::test]
async fn a_config_upstream_switch_whose_audit_row_fails_changes_nothing() {
    let w = world().await;
    crate::audit_tamper::refuse_audit_of(&w.app.settings, "upstream.disable").await;
    let (status, v) = w
        .admin
        .post("/admin/api/v1/upstreams/a/disable", &json!({}))
        .await;
    assert_eq!(status, 500, "{v}");
    let (status, v) = w.admin.get_json("/admin/api/v1/upstreams").await;
    assert_eq!(status, 200, "{v}");
    let a = v["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "a")
        .cloned()
        .unwrap();
    assert_eq!(a["enabled"], true, "disabled without its audit row: {a}");
}

#[tokio::test]
async fn every_admin_action_writes_exactly_one_audit_row_without_secrets() {
    let w = world().await;
    let a = &w.admin;
    let audit = || w.app.scalar("SELECT COUNT(*) FROM audit_log");
    let steps: Vec<(Method, String, Value, &str)> = vec![
        (
            Method::POST,
            "/admin/api/v1/teams".into(),
            json!({"name": "green"}),
            "team.create",
        ),
        (
            Method::PATCH,
            "/admin/api/v1/teams/3".into(),
            json!({"budget_usd": "3"}),
            "budget.set_limit",
        ),
        (
            Method::POST,
            "/admin/api/v1/users".into(),
            json!({"username": "gina", "team_id": 3}),
            "user.create",
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/users/{}", w.red_member),
            json!({"rpm": 7}),
            "user.update",
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/users/{}", w.red_member),
            json!({"disabled": true}),
            "user.disable",
        ),
        (
            Method::PATCH,
            format!("/admin/api/v1/tokens/{}", w.blue_token),
            json!({"tpm": 1000}),
            "token.update",
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{}/top-up", w.blue_token),
            json!({"amount_usd": "1"}),
            "budget.top_up",
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{}/rotate", w.blue_token),
            json!({"overlap_seconds": 60}),
            "token.rotate",
        ),
        (
            Method::POST,
            format!("/admin/api/v1/tokens/{}/revoke", w.red_token),
            json!({}),
            "token.revoke",
        ),
        (
            Method::POST,
            "/admin/api/v1/upstreams/a/disable".into(),
            json!({}),
            "upstream.disable",
        ),
        (
            Method::POST,
            "/admin/api/v1/upstreams/a/enable".into(),
            json!({}),
            "upstream.enable",
        ),
        // A real, paid call with the key: recorded, with its outcome.
        (
            Method::POST,
            "/admin/api/v1/upstreams/a/test".into(),
            json!({}),
            "upstream.test",
        ),
        // Budget and tags at once: one action, one row carrying both changes.
        (
            Method::PATCH,
            "/admin/api/v1/teams/3".into(),
            json!({"budget_usd": "4", "tags": "dept:green"}),
            "team.update",
        ),
        (
            Method::POST,
            "/admin/api/v1/users".into(),
            json!({"username": "auditor", "role": "finance", "password": PASSWORD}),
            "admin.create",
        ),
        (
            Method::POST,
            "/admin/api/v1/keys".into(),
            json!({"name": "k"}),
            "apikey.create",
        ),
    ];
    let mut secrets = vec![w.blue_token_text.clone()];
    for (m, path, body, action) in steps {
        let n = audit().await;
        let (status, v) = a.send(m.clone(), &path, &body).await;
        assert!(status == 200 || status == 201, "{m} {path}: {status} {v}");
        for k in ["token", "key"] {
            if let Some(t) = v[k].as_str() {
                secrets.push(t.to_string());
            }
        }
        assert_eq!(audit().await, n + 1, "{action}: exactly one row");
        let row: (String, String, String, String) = sql_rows(
            w.app.db(),
            "SELECT actor, address, action, target FROM audit_log ORDER BY id DESC LIMIT 1",
        )
        .await
        .remove(0);
        assert_eq!(row.0, "root");
        assert_eq!(row.1, "127.0.0.1");
        assert_eq!(row.2, action);
        assert!(!row.3.is_empty() || action.starts_with("login"));
    }
    let dump: Vec<(Option<String>, Option<String>, String)> =
        sql_rows(w.app.db(), "SELECT before, after, target FROM audit_log").await;
    let hashes: Vec<String> = sql_rows::<(String,)>(w.app.db(), "SELECT password_hash FROM admins")
        .await
        .into_iter()
        .map(|(h,)| h)
        .collect();
    for (b, a, t) in dump {
        let text = format!("{b:?}{a:?}{t}");
        for s in secrets.iter().chain(hashes.iter()) {
            assert!(!text.contains(s.as_str()), "an audit row holds a secret");
        }
        assert!(!text.contains("$argon2id$"));
    }
    // The chain is intact, then `sluice audit verify` names a row edited behind its back.
    let chain = sluice::store::audit::verify(w.app.db(), &w.app.db().audit)
        .await
        .unwrap();
    assert!(chain.rows > 10 && chain.broken.is_none(), "{chain:?}");
}

#[tokio::test]
async fn audit_verify_names_a_row_edited_by_hand_in_the_database() {
    let w = world().await;
    let config = cli_config(&w.app);
    // Awaited, not blocking: a blocking wait would stall the in-process gateway's tasks.
    let verify = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--config", config.to_str().unwrap(), "audit", "verify"])
            .output()
    };
    // The signed head follows the last action from the gateway's exporter task.
    let head = std::path::Path::new(&w.app.settings.backup.dir).join("audit.head");
    let rows = w.app.scalar("SELECT COUNT(*) FROM audit_log").await;
    for _ in 0..200 {
        let text = std::fs::read_to_string(&head).unwrap_or_default();
        if serde_json::from_str::<Value>(&text).is_ok_and(|h| h["rows"] == rows) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let ok = verify().await.unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let target: i64 = w
        .app
        .scalar("SELECT id FROM audit_log WHERE action = 'user.create' ORDER BY id LIMIT 1")
        .await;
    // Only a hand edit can do this: the trigger refuses every UPDATE first.
    let mut c = Attacker::of(&w.app.settings).await;
    let refused = c
        .try_exec(&format!(
            "UPDATE audit_log SET actor = 'nobody' WHERE id = {target}"
        ))
        .await;
    assert!(refused.is_err(), "audit rows cannot be updated");
    c.lift_update_guard().await;
    c.exec(&format!(
        "UPDATE audit_log SET after = '{{\"username\":\"mallory\"}}' WHERE id = {target}"
    ))
    .await;
    c.close().await;
    let bad = verify().await.unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains(&format!("broken at row {target}")), "{err}");
    let page = w
        .admin
        .get("/admin/audit/verify")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!("Chain broken at row {target}")),
        "{page}"
    );
}

#[tokio::test]
async fn a_token_from_the_api_lives_rotates_and_dies() {
    let w = world().await;
    let a = &w.admin;
    let (s, t) = a
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": w.red_member, "budget_usd": "1", "reset": "monthly", "rpm": 100}),
        )
        .await;
    assert_eq!(s, 201);
    let (id, text) = (
        t["id"].as_i64().unwrap(),
        t["token"].as_str().unwrap().to_string(),
    );
    assert_eq!(w.app.chat(&text, &chat_body(5)).await.status(), 200);
    let (_, list) = a.get_json("/admin/api/v1/tokens").await;
    assert!(
        !list.to_string().contains(&text),
        "the text is never shown again"
    );
    w.app.wait_for_log_rows(1).await;
    let (_, reqs) = a
        .get_json(&format!("/admin/api/v1/requests?token={id}&status=2xx"))
        .await;
    assert_eq!(reqs["requests"].as_array().unwrap().len(), 1);
    let (_, rep) = a.get_json("/admin/api/v1/reports/spend?by=user").await;
    let rosa = rep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == "rosa")
        .expect("rosa in the report");
    assert!(rosa["spend_micros"].as_i64().unwrap() > 0);
    let csv = a
        .get("/admin/api/v1/reports/spend?by=user&format=csv")
        .await
        .text()
        .await
        .unwrap();
    assert!(csv.starts_with("user,requests,input_tokens,output_tokens,spend_usd,estimated_usd\n"));
    assert!(csv.lines().any(|l| l.starts_with("rosa,1,")), "{csv}");

    // Limits: only the embedding model allowed → the chat model is refused.
    let (s, v) = a
        .patch(
            &format!("/admin/api/v1/tokens/{id}"),
            &json!({"models": ["text-embedding-3-small"]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(w.app.chat(&text, &chat_body(5)).await.status(), 403);
    a.patch(
        &format!("/admin/api/v1/tokens/{id}"),
        &json!({"all_models": true}),
    )
    .await;

    let (s, r) = a
        .post(
            &format!("/admin/api/v1/tokens/{id}/rotate"),
            &json!({"overlap_seconds": 0}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let new_text = r["token"].as_str().unwrap().to_string();
    assert_eq!(
        r["limit_micros"], 1_000_000,
        "a monthly budget carries over whole"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        w.app.chat(&text, &chat_body(5)).await.status(),
        401,
        "the old token is retired"
    );
    assert_eq!(w.app.chat(&new_text, &chat_body(5)).await.status(), 200);
    let new_id = r["id"].as_i64().unwrap();
    assert_eq!(
        a.post(&format!("/admin/api/v1/tokens/{new_id}/revoke"), &json!({}))
            .await
            .0,
        200
    );
    assert_eq!(
        a.post(&format!("/admin/api/v1/tokens/{new_id}/revoke"), &json!({}))
            .await
            .0,
        409
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(w.app.chat(&new_text, &chat_body(5)).await.status(), 401);
    w.app.assert_invariant().await;
}

/// Rotates the blue member's token with an overlap of `overlap_seconds`: the answer (the
/// new token, its text once).
async fn rotate_blue(w: &World, overlap_seconds: i64) -> Value {
    let (s, r) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{}/rotate", w.blue_token),
            &json!({ "overlap_seconds": overlap_seconds }),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    r
}

/// A periodic budget's rotation carries the period's spend: the new token starts the period
/// where the old one was, not full — a rotation refilled the period, a lead's rotation
/// handing the token a second month. What is carried is a ledger row of the new token's
/// (kind `adjust`, no user or team: their levels already count it), so `limit − remaining ==
/// Σ ledger` holds at every level.
#[tokio::test]
async fn a_rotation_carries_the_periods_spend_to_the_new_token() {
    let w = world().await;
    let (s, t) = w
        .admin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": w.blue_member, "budget_usd": "2", "reset": "monthly"}),
        )
        .await;
    assert_eq!(s, 201, "{t}");
    let old = t["id"].as_i64().unwrap();
    assert_eq!(
        w.app
            .chat(t["token"].as_str().unwrap(), &chat_body(5))
            .await
            .status(),
        200
    );
    w.app.wait_for_log_rows(1).await;
    w.app.wait_settled().await;
    let remaining = |id: i64| {
        let app = &w.app;
        async move {
            app.scalar(&format!(
                "SELECT remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await
        }
    };
    let spent = 2_000_000 - remaining(old).await;
    assert!(spent > 0);
    let (s, r) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{old}/rotate"),
            &json!({"overlap_seconds": 0}),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let new = r["id"].as_i64().unwrap();
    assert_eq!(r["limit_micros"], 2_000_000, "the same limit");
    assert_eq!(
        remaining(new).await,
        2_000_000 - spent,
        "the period goes on where the old token was"
    );
    assert_eq!(r["spent_micros"], spent, "shown as spent this period");
    w.app.assert_invariant().await;
    assert_eq!(
        w.app
            .chat(r["token"].as_str().unwrap(), &chat_body(5))
            .await
            .status(),
        200
    );
    w.app.wait_for_log_rows(2).await;
    w.app.wait_settled().await;
    assert_eq!(remaining(new).await, 2_000_000 - 2 * spent);
    w.app.assert_invariant().await;
}

#[tokio::test]
async fn rotation_with_an_overlap_keeps_the_old_token_until_it_ends() {
    let w = world().await;
    let r = rotate_blue(&w, 2).await;
    assert_eq!(
        r["limit_micros"], 2_000_000,
        "a never-resetting budget moves what was left"
    );
    let new_text = r["token"].as_str().unwrap().to_string();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        200,
        "inside the overlap"
    );
    assert_eq!(w.app.chat(&new_text, &chat_body(5)).await.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(2000)).await;
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        401,
        "after the overlap"
    );
    w.app.assert_invariant().await;
}

/// Review s21 #7: during a rotation's overlap the old token spent its own remaining budget
/// while the new one had been given that same remaining — the pair could spend it twice.
/// The old text now authenticates as the new token: its requests are the new token's,
/// logged and charged to its one budget, the old token's own balance untouched (its
/// `last_used_at` still following its text's use); revoking the new token ends the old text
/// too. And (s22 attack, second batch #1/#7) the rotated token can no longer be rotated
/// again — its untouched budget would be handed out twice — nor edited or topped up, which
/// would be accepted and do nothing.
#[tokio::test]
async fn the_old_text_spends_the_new_tokens_budget_during_the_overlap() {
    let w = world().await;
    let r = rotate_blue(&w, 60).await;
    let new_id = r["id"].as_i64().unwrap();
    let new_text = r["token"].as_str().unwrap().to_string();
    for text in [&w.blue_token_text, &new_text] {
        assert_eq!(w.app.chat(text, &chat_body(5)).await.status(), 200);
    }
    w.app.wait_for_log_rows(2).await;
    w.app.wait_settled().await;
    let rows: Vec<(i64,)> = sql_rows(w.app.db(), "SELECT token_id FROM requests").await;
    assert_eq!(
        rows,
        [(new_id,), (new_id,)],
        "both texts' requests are the new token's"
    );
    let remaining = |id: i64| {
        let app = &w.app;
        async move {
            app.scalar(&format!(
                "SELECT remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await
        }
    };
    assert_eq!(
        remaining(w.blue_token).await,
        2_000_000,
        "the old budget is not spent"
    );
    let charged_to: Vec<(i64,)> =
        sql_rows(w.app.db(), "SELECT DISTINCT token_id FROM ledger").await;
    assert_eq!(
        charged_to,
        [(new_id,)],
        "every ledger row is the new token's"
    );
    let charged = w
        .app
        .scalar("SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE kind IN ('reserve', 'settle')")
        .await;
    assert!(charged > 0);
    assert_eq!(
        remaining(new_id).await,
        2_000_000 - charged,
        "one budget for the pair"
    );
    w.app.assert_invariant().await;
    // The old token's own use still shows (is the old text still in use?).
    let last_used = sql_rows::<(Option<String>,)>(
        w.app.db(),
        &format!(
            "SELECT last_used_at FROM tokens WHERE id = {}",
            w.blue_token
        ),
    )
    .await;
    assert!(last_used[0].0.is_some(), "{last_used:?}");
    // Rotated, the old token's own settings and budget no longer apply: a change to them,
    // or a second rotation (which would hand its budget out again), is refused by name.
    let old = w.blue_token;
    for (path, body) in [
        (
            format!("/admin/api/v1/tokens/{old}/rotate"),
            json!({"overlap_seconds": 60}),
        ),
        (
            format!("/admin/api/v1/tokens/{old}/top-up"),
            json!({"amount_usd": "1"}),
        ),
    ] {
        let (s, v) = w.admin.post(&path, &body).await;
        assert_eq!(s, 409, "{path}: {v}");
        assert!(
            v.to_string()
                .contains(&format!("rotated to token {new_id}")),
            "{v}"
        );
    }
    let (s, v) = w
        .admin
        .patch(&format!("/admin/api/v1/tokens/{old}"), &json!({"rpm": 1}))
        .await;
    assert_eq!(s, 409, "{v}");
    // Nor does the CLI change its budget.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", cli_config(&w.app).to_str().unwrap()])
        .args(["token", "budget", &old.to_string(), "--top-up-usd", "1"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("rotated to token {new_id}")),
        "{err}"
    );
    // Nor does an adjustment reaching the ledger past the CLI's own check (a rotation
    // committed between the two: s23 attack, money #2) — it is checked in its transaction.
    let err = sluice::store::ledger::adjust(
        w.app.db(),
        old,
        1_000_000,
        "late",
        "cli",
        chrono::Utc::now(),
    )
    .await
    .expect_err("an adjustment of a rotated token");
    assert!(
        err.to_string()
            .contains(&format!("rotated to token {new_id}")),
        "{err}"
    );
    // The page says so, and offers only its revocation.
    let page = w.admin.get("/admin/tokens").await.text().await.unwrap();
    let row = page
        .split(&format!("id=\"token-{old}\""))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_default();
    assert!(
        row.contains("rotated") && row.contains(&format!("works as id {new_id}")),
        "{row}"
    );
    assert!(
        row.contains("/revoke")
            && !row.contains("/rotate")
            && !row.contains("/top-up")
            && !row.contains("/limits"),
        "{row}"
    );
    // Revoking the new token ends the old text as well.
    assert_eq!(
        w.admin
            .post(&format!("/admin/api/v1/tokens/{new_id}/revoke"), &json!({}))
            .await
            .0,
        200
    );
    for text in [&w.blue_token_text, &new_text] {
        let mut status = 0;
        for _ in 0..50 {
            status = w.app.chat(text, &chat_body(5)).await.status().as_u16();
            if status == 401 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(status, 401);
    }
}

/// s23 attack #3: a rotation made before the upgrade that added `successor_id` left the
/// old text on its own budget for the rest of its overlap, beside the new token's — the
/// pair could spend both. The upgrade links each rotation it finds in the audit log — but
/// not one whose new token was revoked (s23 attack, third batch #6): the old text kept
/// working on its own budget then, and the link would end it unannounced.
#[tokio::test]
async fn a_rotation_made_before_the_upgrade_spends_one_budget() {
    let w = world().await;
    let r = rotate_blue(&w, 600).await;
    let new_id = r["id"].as_i64().unwrap();
    // An older version also let a rotated token be rotated again; that second new token
    // revoked, the pair to link is the first (s23 attack, fourth batch #2).
    sql_exec(w.app.db(), "UPDATE tokens SET successor_id = NULL").await;
    let again = rotate_blue(&w, 600).await;
    let (s, v) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{}/revoke", again["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, red) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{}/rotate", w.red_token),
            &json!({ "overlap_seconds": 600 }),
        )
        .await;
    assert_eq!(s, 201, "{red}");
    let (s, v) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{}/revoke", red["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    // As the previous version left it: no link.
    sql_exec(w.app.db(), "UPDATE tokens SET successor_id = NULL").await;
    let migration = match w.app.db().postgres() {
        Some(_) => "postgres/0016_rotated_successors.sql",
        None => "sqlite/0027_rotated_successors.sql",
    };
    let sql = std::fs::read_to_string(format!(
        "{}/migrations/{migration}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    sql_exec(w.app.db(), &sql).await;
    let linked = sql_int(
        w.app.db(),
        &format!(
            "SELECT successor_id FROM tokens WHERE id = {}",
            w.blue_token
        ),
    )
    .await;
    assert_eq!(linked, new_id, "the pair is linked again");
    assert_eq!(
        sql_int(
            w.app.db(),
            "SELECT COUNT(*) FROM tokens WHERE successor_id IS NOT NULL"
        )
        .await,
        1,
        "no other token linked: not red's, whose new token was revoked"
    );
    // Past the token caches' epoch poll (the rotation cleared them within a second), the
    // old text is the new token's.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        200
    );
    w.app.wait_for_log_rows(1).await;
    w.app.wait_settled().await;
    let rows: Vec<(i64,)> = sql_rows(w.app.db(), "SELECT token_id FROM requests").await;
    assert_eq!(rows, [(new_id,)]);
    w.app.assert_invariant().await;
}

/// s23 attack (third batch) #4: the walk from the token that stored a response was bound
/// at 16 rotations, so a token rotated daily lost its conversations within the retention.
#[tokio::test]
async fn a_response_stored_seventeen_rotations_back_is_still_reached() {
    let w = world().await;
    let id = stored_by_blue(&w).await;
    let mut newest = (w.blue_token, w.blue_token_text.clone());
    for _ in 0..17 {
        let (s, r) = w
            .admin
            .post(
                &format!("/admin/api/v1/tokens/{}/rotate", newest.0),
                &json!({ "overlap_seconds": 0 }),
            )
            .await;
        assert_eq!(s, 201, "{r}");
        newest = (
            r["id"].as_i64().unwrap(),
            r["token"].as_str().unwrap().to_string(),
        );
    }
    reached(&w.app, &id, &newest.1).await;
}

/// s23 attack (third batch) #3: on PostgreSQL an adjustment did not take the admin writes'
/// lock, so one could commit between a rotation's read of the old token's remaining and
/// its link — the credit stranded on the old token. An adjustment now waits for a
/// rotation in progress (on SQLite `BEGIN IMMEDIATE` always did) and is refused after it.
#[tokio::test]
async fn an_adjustment_waits_for_a_rotation_in_progress_and_is_refused_after_it() {
    let w = world().await;
    let mut rotation = w.app.db().begin().await.unwrap();
    let db = w.app.state.db.clone();
    let old = w.blue_token;
    let adjust = tokio::spawn(async move {
        sluice::store::ledger::adjust(&db, old, -1_000_000, "credit", "cli", chrono::Utc::now())
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !adjust.is_finished(),
        "the adjustment committed inside the rotation"
    );
    sluice::store::token_admin::set_successor(&mut rotation, old, w.red_token)
        .await
        .unwrap();
    rotation.commit().await.unwrap();
    let err = adjust
        .await
        .unwrap()
        .expect_err("an adjustment of a rotated token");
    assert!(err.to_string().contains("was rotated to token"), "{err}");
}

/// A response stored by the blue token's text: its id.
async fn stored_by_blue(w: &World) -> String {
    let (s, stored) =
        crate::responses::create(&w.app, &w.blue_token_text, &crate::responses::ask()).await;
    assert_eq!(s, 200, "{stored}");
    stored["id"].as_str().unwrap().to_string()
}

/// `GET /v1/responses/{id}` by `text` until it is found (2 s): an old text cached as the
/// old token is the new one once the rotation reaches every cache, within a second (the
/// token epoch).
async fn reached(app: &TestApp, id: &str, text: &str) {
    let mut got = (0, Value::Null);
    for _ in 0..40 {
        got = crate::responses::get(app, id, text).await;
        if got.0 == 200 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{id} not reached: {} {}", got.0, got.1);
}

/// s22 attack (second batch) #3: a rotation moved the old token's requests to the new one,
/// but not its stored Responses: neither text could reach what the old one stored. They
/// are reached through the rotation: both texts continue the conversation.
#[tokio::test]
async fn a_rotation_hands_the_stored_responses_to_the_new_token() {
    let w = world().await;
    let id = stored_by_blue(&w).await;
    let r = rotate_blue(&w, 60).await;
    let new_text = r["token"].as_str().unwrap().to_string();
    for text in [&w.blue_token_text, &new_text] {
        reached(&w.app, &id, text).await;
        let next =
            json!({"model": "gpt-4o-mini", "input": "And then?", "previous_response_id": id});
        let (s, v) = crate::responses::create(&w.app, text, &next).await;
        assert_eq!(s, 200, "{v}");
    }
}

/// s23 attack (money) #1: the rotation moved the old token's stored Responses in its own
/// transaction — an unindexed scan and a rewrite of every row it stored (whole
/// conversations), on SQLite's one write connection, every tenant's reservation waiting
/// behind it. And a response stored by a request in flight across the rotation stayed the
/// old token's, out of both texts' reach. Now a stored response is reached through the
/// rotations from the token that stored it: the rotation writes nothing to them.
#[tokio::test]
async fn a_rotation_writes_no_stored_response_and_one_stored_after_it_is_reached() {
    let w = world().await;
    let before = stored_by_blue(&w).await;
    // Any write to a stored response now fails, the rotation's included.
    let refuse = match w.app.db().postgres() {
        Some(_) => vec![
            "CREATE FUNCTION refuse_moves() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'stored response moved'; END; $$",
            "CREATE TRIGGER refuse_moves BEFORE UPDATE ON stored_responses FOR EACH ROW EXECUTE FUNCTION refuse_moves()",
        ],
        None => vec![
            "CREATE TRIGGER refuse_moves BEFORE UPDATE ON stored_responses BEGIN SELECT RAISE(ABORT, 'stored response moved'); END",
        ],
    };
    for sql in refuse {
        sql_exec(w.app.db(), sql).await;
    }
    let r = rotate_blue(&w, 600).await;
    let new_text = r["token"].as_str().unwrap().to_string();
    // A request in flight across the rotation stores its response as the old token.
    let late = "resp_stored_as_the_old_token_after_its_rotation";
    let mut row = sluice::store::responses::get(
        w.app.db(),
        &before,
        w.blue_token,
        chrono::Utc::now() - chrono::Duration::days(1),
    )
    .await
    .unwrap()
    .expect("stored as the old token");
    row.id = late.into();
    row.created_at = sluice::clock::db_time(chrono::Utc::now());
    sluice::store::responses::put(w.app.db(), &row)
        .await
        .unwrap();
    for text in [&w.blue_token_text, &new_text] {
        for id in [before.as_str(), late] {
            reached(&w.app, id, text).await;
        }
    }
    // Another token reaches neither.
    let (_, other) = w.app.token("blue-other", Some("1")).await;
    for id in [&before, &late.to_string()] {
        assert_eq!(crate::responses::get(&w.app, id, &other).await.0, 404);
    }
}

#[tokio::test]
async fn disabled_upstreams_serve_nothing_until_enabled() {
    let w = world().await;
    let (s, v) = w
        .admin
        .post("/admin/api/v1/upstreams/a/disable", &json!({}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["enabled"], false);
    assert_eq!(v["key"], "****3a9c");
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        503
    );
    let (_, list) = w.admin.get_json("/admin/api/v1/upstreams").await;
    assert!(!list.to_string().contains(KEY_A));
    w.admin
        .post("/admin/api/v1/upstreams/a/enable", &json!({}))
        .await;
    assert_eq!(
        w.app.chat(&w.blue_token_text, &chat_body(5)).await.status(),
        200
    );
    assert_eq!(
        w.admin
            .post("/admin/api/v1/upstreams/zz/disable", &json!({}))
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn injection_payloads_in_admin_parameters_are_just_data() {
    let w = world().await;
    let a = &w.admin;
    for path in [
        "/admin/api/v1/requests?model=%27%20OR%201%3D1%20--",
        "/admin/api/v1/audit?action=%25%27%20OR%20%271%27%3D%271",
        "/admin/api/v1/audit?actor=root%27--",
        "/admin/api/v1/reports/spend?by=user;DROP%20TABLE%20users",
    ] {
        let r = a.get(path).await;
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert!(status == 200 || status == 400, "{path}: {status}");
        assert!(
            !body.to_lowercase().contains("sql") && !body.contains("syntax"),
            "{path}: {body}"
        );
        if status == 200 && path.contains("requests") {
            assert!(body.contains("\"requests\":[]"), "{path}: {body}");
        }
    }
    for (path, body) in [
        ("/admin/api/v1/requests?team=1%20OR%201%3D1", None),
        ("/admin/api/v1/tokens?user=1;--", None),
        (
            "/admin/api/v1/users",
            Some(json!({"username": "x' OR '1'='1", "team_id": 1})),
        ),
        (
            "/admin/api/v1/teams",
            Some(json!({"name": "t\"; DROP TABLE teams; --"})),
        ),
    ] {
        let status = match body {
            None => a.get(path).await.status().as_u16(),
            Some(b) => a.post(path, &b).await.0,
        };
        assert_eq!(status, 400, "{path}");
    }
    assert_eq!(w.app.scalar("SELECT COUNT(*) FROM teams").await, 2);
    assert_eq!(w.app.scalar("SELECT COUNT(*) FROM users").await, 2);
}

/// Review s21 #4: a `tz_offset` no browser sends (`i64::MIN` overflowed `abs()`, a panic
/// that dropped the connection; `i64::MAX`; one minute past a day either way) is a 400
/// naming the field, on an issue and on an edit; a whole day is still taken.
#[tokio::test]
async fn a_hostile_tz_offset_is_a_400_naming_it() {
    let w = world().await;
    let a = &w.admin;
    let cases = [
        ("2030-01-01T00:00", json!(i64::MIN)),
        ("2030-01-01T00:00", json!(i64::MAX)),
        ("2030-01-01T00:00", json!(24 * 60 + 1)),
        ("2030-01-01T00:00", json!(-(24 * 60) - 1)),
    ];
    for (expires, tz) in cases {
        let edit = json!({"expires": expires, "tz_offset": tz});
        let (status, v) = a
            .patch(&format!("/admin/api/v1/tokens/{}", w.red_token), &edit)
            .await;
        assert_eq!(status, 400, "edit {edit}: {v}");
        assert!(v.to_string().contains("tz_offset"), "edit {edit}: {v}");
        let issue = json!({"user_id": w.red_member, "expires": expires, "tz_offset": tz});
        let (status, v) = a.post("/admin/api/v1/tokens", &issue).await;
        assert_eq!(status, 400, "issue {issue}: {v}");
        assert!(v.to_string().contains("tz_offset"), "issue {issue}: {v}");
    }
    let fine = json!({"expires": "2030-01-01T00:00", "tz_offset": -(24 * 60)});
    let (status, v) = a
        .patch(&format!("/admin/api/v1/tokens/{}", w.red_token), &fine)
        .await;
    assert_eq!(status, 200, "{v}");
}

/// s26 attack admin #6: an expiry chrono reads past year 9999 (`+10000-01-01T00:00`, or an
/// RFC 3339 instant whose offset carries it there) was stored as `+10000-…`, text that
/// sorts before every real time: the auth cache let the token in, the ledger refused it as
/// expired, and a later edit dropped the expiry. It is a 400 naming `expires`, on an issue
/// and on an edit; the last representable minute is still taken.
#[tokio::test]
async fn an_expiry_past_year_9999_is_a_400_naming_it() {
    let w = world().await;
    let a = &w.admin;
    for expires in ["+10000-01-01T00:00", "9999-12-31T23:59:00-05:00"] {
        let issue = json!({"user_id": w.red_member, "expires": expires});
        let (status, v) = a.post("/admin/api/v1/tokens", &issue).await;
        assert_eq!(status, 400, "issue {issue}: {v}");
        assert!(v.to_string().contains("expires"), "issue {issue}: {v}");
        let edit = json!({"expires": expires});
        let (status, v) = a
            .patch(&format!("/admin/api/v1/tokens/{}", w.red_token), &edit)
            .await;
        assert_eq!(status, 400, "edit {edit}: {v}");
        assert!(v.to_string().contains("expires"), "edit {edit}: {v}");
    }
    let last = json!({"user_id": w.red_member, "expires": "9999-12-31T23:59:00Z"});
    let (status, v) = a.post("/admin/api/v1/tokens", &last).await;
    assert_eq!(status, 201, "{v}");
    let refused = sluice::cli::token_issue(
        w.app.db(),
        &sluice::cli::IssueArgs {
            expires: Some("9999-12-31T23:59:00-05:00"),
            ..issue_args("rosa")
        },
        chrono::Utc::now(),
    )
    .await
    .err()
    .map(|e| e.to_string());
    assert!(
        refused.as_ref().is_some_and(|e| e.contains("--expires")),
        "the CLI as the API: {refused:?}"
    );
}

#[tokio::test]
async fn htmx_errors_land_in_the_flash_area() {
    let w = world().await;
    let r = w.admin.htmx_form("/admin/teams", &[("name", "red")]).await;
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()["hx-retarget"], "#flash");
    assert!(r.text().await.unwrap().contains("already exists"));
    let r = w
        .admin
        .htmx_form(
            "/admin/tokens",
            &[
                ("user_id", &w.red_member.to_string()),
                ("budget_usd", "lots"),
            ],
        )
        .await;
    assert_eq!(r.status(), 400);
    let ok = w
        .admin
        .htmx_form(
            "/admin/tokens",
            &[
                ("user_id", &w.red_member.to_string()),
                ("budget_usd", "1.5"),
                ("models", "gpt-4o-mini"),
                ("models", "text-embedding-3-small"),
            ],
        )
        .await;
    assert_eq!(ok.status(), 200);
    let html = ok.text().await.unwrap();
    let text = find_between(
        &html,
        "id=\"token-text\" class=\"mono\" readonly value=\"",
        "\"",
    )
    .expect("token shown once");
    assert_eq!(w.app.chat(&text, &chat_body(5)).await.status(), 200);
    assert!(
        html.contains("hx-swap-oob=\"true\""),
        "the list refreshes too"
    );
}

#[tokio::test]
async fn an_admin_resets_a_password_and_changes_a_role_and_the_old_sessions_end() {
    let w = world().await;
    let fin = login(&w.app, "fin").await;
    let fin_id = w
        .app
        .scalar("SELECT id FROM admins WHERE username = 'fin'")
        .await;
    let (s, v) = w
        .admin
        .patch(
            &format!("/admin/api/v1/logins/{fin_id}"),
            &json!({"password": "a brand new finance pass"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        fin.get_json("/admin/api/v1/me").await.0,
        401,
        "the reset ends their sessions"
    );
    let fin = login_with(&w.app, "fin", "a brand new finance pass").await;
    let (s, _) = w
        .admin
        .patch(
            &format!("/admin/api/v1/logins/{fin_id}"),
            &json!({"role": "lead", "team_id": 1}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        fin.get_json("/admin/api/v1/me").await.0,
        401,
        "a role change ends them too"
    );
    let (_, me) = w.admin.get_json("/admin/api/v1/me").await;
    let my_id = me["id"].as_i64().unwrap();
    for body in [
        json!({"role": "finance"}),
        json!({"disabled": true}),
        json!({"password": "my own new password"}),
    ] {
        assert_eq!(
            w.admin
                .patch(&format!("/admin/api/v1/logins/{my_id}"), &body)
                .await
                .0,
            403,
            "{body}"
        );
    }
    let row: (String, String) = sql_rows(
        w.app.db(),
        "SELECT action, after FROM audit_log WHERE action = 'admin.update' ORDER BY id LIMIT 1",
    )
    .await
    .remove(0);
    assert!(
        row.1.contains("password_reset") && !row.1.contains("$argon2"),
        "{row:?}"
    );
}

/// A request authenticated before its user is disabled, whose body arrives after: it is
/// authenticated again before it reserves (its body took longer than `RECHECK_AFTER`), so
/// it is refused as a new request would be, nothing sent upstream nor charged (s26 attack
/// F2: the credential was judged once, before the body, and the request was served).
#[tokio::test]
async fn a_request_whose_body_arrived_after_its_user_was_disabled_is_refused() {
    let w = world().await;
    let (conn, rest) = half_sent_chat(&w.app.address, &w.blue_token_text, &chat_body(5)).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (s, r) = w
        .admin
        .patch(
            &format!("/admin/api/v1/users/{}", w.blue_member),
            &json!({"disabled": true}),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let (status, answer) = finish_half_sent(conn, &rest).await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer.contains("invalid_api_key"), "{answer}");
    assert_eq!(w.app.mock.state.total_count(), 0, "nothing sent upstream");
    w.app.wait_settled().await;
    assert_nothing_charged_nor_held(&w.app, w.blue_token).await;
}

/// A request authenticated before its token's rotation, whose body arrives after: it is
/// authenticated again before it reserves, as the successor the old text now works as, so
/// it spends the new token's budget and the old token's balance stays untouched — the pair
/// spends one budget (s26 attack F2: it reserved on the old token, whose remaining the
/// never-resetting rotation had also handed the new one, up to twice the budget).
#[tokio::test]
async fn a_request_authenticated_before_a_rotation_spends_the_successors_budget() {
    let w = world().await;
    let (conn, rest) = half_sent_chat(&w.app.address, &w.blue_token_text, &chat_body(5)).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r = rotate_blue(&w, 3600).await;
    let new_id = r["id"].as_i64().unwrap();
    let (status, answer) = finish_half_sent(conn, &rest).await;
    assert_eq!(status, 200, "{answer}");
    w.app.wait_settled().await;
    let charged_to: Vec<(i64,)> = sql_rows(
        w.app.db(),
        "SELECT DISTINCT token_id FROM ledger WHERE kind <> 'adjust'",
    )
    .await;
    assert_eq!(charged_to, [(new_id,)], "charged to the successor");
    let old_remaining = w
        .app
        .scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {}",
            w.blue_token
        ))
        .await;
    assert_eq!(old_remaining, 2_000_000, "the old budget is not spent");
    w.app.assert_invariant().await;
}

/// s26 attack admin #5: a CLI command that makes a missing team or user on the way
/// (`user create --team T`, `token issue --user U`, `admin create --team T`) audits each
/// one made, as the web surface does: before, only the parent action had a row, and an
/// auditor replaying the log could not account for the tenant.
#[tokio::test]
async fn a_cli_command_that_makes_a_team_or_user_on_the_way_audits_it() {
    let app = spawn_app().await;
    let db = app.db();
    let now = chrono::Utc::now();
    let args = sluice::cli::UserArgs {
        username: "bob",
        team: Some("newteam"),
        rpm: None,
        tpm: None,
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(db, &args, now).await.unwrap();
    sluice::cli::token_issue(db, &issue_args("alice"), now)
        .await
        .unwrap();
    sluice::cli::admin_create(db, "ops", "lead", Some("ops-team"), PASSWORD.into(), now)
        .await
        .unwrap();
    for (action, target) in [
        (
            "team.create",
            "SELECT 'team:' || id FROM teams WHERE name = 'newteam'",
        ),
        (
            "team.create",
            "SELECT 'team:' || id FROM teams WHERE name = 'default'",
        ),
        (
            "team.create",
            "SELECT 'team:' || id FROM teams WHERE name = 'ops-team'",
        ),
        (
            "user.create",
            "SELECT 'user:' || id FROM users WHERE username = 'alice'",
        ),
        (
            "user.create",
            "SELECT 'user:' || id FROM users WHERE username = 'bob'",
        ),
    ] {
        let target = sql_text(db, target).await;
        let rows = app
            .scalar(&format!(
                "SELECT COUNT(*) FROM audit_log WHERE action = '{action}' AND target = '{target}'"
            ))
            .await;
        assert_eq!(rows, 1, "{action} {target}");
    }
}

/// The CRITICAL rule is about granting it: a lead lowers the limits of a token an admin
/// made CRITICAL in their team (it answered 403 "Only an admin can grant CRITICAL" to an
/// rpm change, while a rotation kept it CRITICAL), and still cannot make one CRITICAL
/// (s29 admin attack F3).
#[tokio::test]
async fn a_lead_can_lower_the_limits_of_an_admin_granted_critical_token() {
    let w = world().await;
    let lead = login(&w.app, "lena").await;
    let (s, critical) = w
        .admin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": w.red_member, "budget_usd": "1", "max_priority": 1}),
        )
        .await;
    assert_eq!(s, 201, "{critical}");
    let path = format!("/admin/api/v1/tokens/{}", critical["id"]);
    let (s, v) = lead.patch(&path, &json!({"rpm": 5})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["rpm"].as_i64(), v["max_priority"].as_i64()),
        (Some(5), Some(1)),
        "{v}"
    );
    let (s, v) = lead
        .patch(&path, &json!({"max_priority": 1, "tpm": 1000}))
        .await;
    assert_eq!(s, 200, "kept as it was, no grant: {v}");
    let (s, v) = lead.patch(&path, &json!({"max_priority": 3})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = lead.patch(&path, &json!({"max_priority": 1})).await;
    assert_eq!(s, 403, "granted again by a lead: {v}");
    let other = format!("/admin/api/v1/tokens/{}", w.red_token);
    assert_eq!(lead.patch(&other, &json!({"max_priority": 1})).await.0, 403);
}

/// `"models": []` named no model and was read as absent: a token for every model, with a
/// 201 (and on an edit, the old list kept). Refused, naming the field (s29 admin attack F4).
#[tokio::test]
async fn an_empty_model_list_is_refused_not_read_as_every_model() {
    let w = world().await;
    for models in [json!([]), json!([""])] {
        let (s, v) = w
            .admin
            .post(
                "/admin/api/v1/tokens",
                &json!({"user_id": w.red_member, "budget_usd": "1", "models": models}),
            )
            .await;
        assert_eq!(s, 400, "{models}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("models"),
            "{v}"
        );
        let path = format!("/admin/api/v1/tokens/{}", w.red_token);
        let (s, v) = w.admin.patch(&path, &json!({"models": models})).await;
        assert_eq!(s, 400, "{models}: {v}");
    }
    let (s, v) = w
        .admin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": w.red_member, "budget_usd": "1", "models": null}),
        )
        .await;
    assert_eq!(s, 201, "null is every model: {v}");
    assert!(v["models"].is_null(), "{v}");
}

/// The token list stopped at 1 000 rows without a word, rotated and expired ones among
/// them, and `?user=` filtered after the cut: on a busy install a user's live token was in
/// no list — `?user=X` answered none while it spent (s29 admin attack F2). The filter is
/// the query's, live tokens come first, and a cut list says so.
#[tokio::test]
async fn a_users_tokens_are_listed_whatever_the_number_of_other_tokens() {
    let w = world().await;
    let (rotated, _) = w.app.issue(crate::helpers::issue_args("busy")).await;
    let (s, _) = w
        .admin
        .post(
            &format!("/admin/api/v1/tokens/{rotated}/rotate"),
            &json!({"overlap_seconds": 0}),
        )
        .await;
    assert_eq!(s, 201);
    for _ in 0..1_000 {
        w.app.issue(crate::helpers::issue_args("busy")).await;
    }
    let (s, v) = w
        .admin
        .get_json(&format!("/admin/api/v1/tokens?user={}", w.red_member))
        .await;
    assert_eq!(s, 200, "{v}");
    let ids: Vec<i64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [w.red_token], "{v}");
    assert_eq!(v["more"], false);
    let (_, all) = w.admin.get_json("/admin/api/v1/tokens").await;
    let listed = all["tokens"].as_array().unwrap();
    assert_eq!(listed.len(), 1_000);
    assert_eq!(all["more"], true, "a cut list says so");
    assert!(
        !listed.iter().any(|t| t["id"] == rotated),
        "a rotated token comes after every live one"
    );
    let page = w.admin.get("/admin/tokens").await.text().await.unwrap();
    assert!(page.contains("newest 1000"), "the page says it is cut");
}

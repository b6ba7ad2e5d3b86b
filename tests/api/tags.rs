//! Attribution tags: `x-sluice-tags` refused in the client's format before anything is
//! reserved or sent; the header over the token's over the team's defaults, stored on the
//! request row; defaults set through the CLI and the admin API, audited, and not by finance;
//! spend by tag sums to the total, which is the ledger's.

use serde_json::{json, Value};
use sluice::cli::IssueArgs;

use crate::admin_helpers::*;
use crate::helpers::*;

fn bad_headers() -> Vec<(&'static str, Vec<u8>)> {
    let eleven: Vec<String> = (0..11).map(|i| format!("k{i}:v")).collect();
    vec![
        ("eleven tags", eleven.join(",").into_bytes()),
        (
            "a 65-byte value",
            format!("k:{}", "v".repeat(65)).into_bytes(),
        ),
        ("a:b:c", b"a:b:c".to_vec()),
        ("a duplicate key", b"env:prod,env:dev".to_vec()),
        ("non-ASCII", "k:caf\u{e9}".as_bytes().to_vec()),
        ("an empty key", b":v".to_vec()),
    ]
}

async fn tagged(
    app: &TestApp,
    path: &str,
    token: &str,
    tags: &[u8],
    body: &Value,
) -> reqwest::Response {
    let mut r = app
        .http
        .post(format!("{}{path}", app.address))
        .header(
            "x-sluice-tags",
            reqwest::header::HeaderValue::from_bytes(tags).expect("a header value"),
        )
        .json(body);
    r = if path == "/v1/messages" {
        r.header("x-api-key", token)
            .header("anthropic-version", "2023-06-01")
    } else {
        r.bearer_auth(token)
    };
    r.send().await.expect("request sent")
}

#[tokio::test]
async fn bad_tags_are_refused_in_the_clients_format_and_nothing_is_charged() {
    let app = spawn_app_with_claude().await;
    let (id, token) = app.token("alice", Some("1")).await;
    let anthropic = json!({"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    for (what, header) in bad_headers() {
        let r = tagged(
            &app,
            "/v1/chat/completions",
            &token,
            &header,
            &chat_body(16),
        )
        .await;
        assert_eq!(r.status(), 400, "{what}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "x-sluice-tags", "{what}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}");

        let r = tagged(&app, "/v1/messages", &token, &header, &anthropic).await;
        assert_eq!(r.status(), 400, "{what}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{what}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-sluice-tags"),
            "{what}: {v}"
        );
    }
    assert_eq!(app.mock.state.total_count(), 0, "the upstream saw nothing");
    app.wait_for_log_rows(12).await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {id}"
        ))
        .await,
        0,
        "nothing charged or reserved"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM requests WHERE status = 400 AND tags = ''")
            .await,
        12
    );
    app.assert_invariant().await;
}

async fn row_tags(app: &TestApp, n: i64) -> String {
    app.wait_for_log_rows(n).await;
    sql_text(
        app.db(),
        "SELECT tags FROM requests ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .await
}

#[tokio::test]
async fn the_header_adds_keys_and_the_token_wins_over_the_team() {
    let app = spawn_app().await;
    let args = IssueArgs {
        budget_usd: Some("1"),
        ..issue_args("ana")
    };
    let t = app
        .token_in_team(
            "core",
            Some("env:dev,cc:4711"),
            args,
            Some("env:prod,owner:ana"),
        )
        .await;
    let r = tagged(
        &app,
        "/v1/chat/completions",
        &t.text,
        b"env:prod,proj:x",
        &chat_body(16),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(row_tags(&app, 1).await, "cc:4711,env:prod,owner:ana,proj:x");
    assert_eq!(app.chat(&t.text, &chat_body(16)).await.status(), 200);
    assert_eq!(row_tags(&app, 2).await, "cc:4711,env:prod,owner:ana");
    // An empty header is no tags of its own.
    let r = tagged(&app, "/v1/chat/completions", &t.text, b"", &chat_body(16)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(row_tags(&app, 3).await, "cc:4711,env:prod,owner:ana");

    // A team edit reaches the cached auth record within a second or so.
    sluice::cli::team_edit_tags(app.db(), "core", "cc:9000", chrono::Utc::now())
        .await
        .unwrap();
    let mut seen = String::new();
    for n in 4..40 {
        assert_eq!(app.chat(&t.text, &chat_body(16)).await.status(), 200);
        seen = row_tags(&app, n).await;
        if seen == "cc:9000,env:prod,owner:ana" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "cc:9000,env:prod,owner:ana");
    // More than ten after the merge: refused, naming the header.
    let many: Vec<String> = (0..9).map(|i| format!("x{i}:y")).collect();
    let r = tagged(
        &app,
        "/v1/chat/completions",
        &t.text,
        many.join(",").as_bytes(),
        &chat_body(16),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "x-sluice-tags");
    app.assert_invariant().await;
}

async fn admin(app: &TestApp) -> Session {
    make_login(app, "root", "admin", None).await;
    login(app, "root").await
}

#[tokio::test]
async fn defaults_are_set_through_the_admin_api_validated_and_audited_and_finance_cannot() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let (s, team) = root
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "tags": "env:dev"}),
        )
        .await;
    assert_eq!(s, 201, "{team}");
    assert_eq!(team["tags"], "env:dev");
    let tid = team["id"].as_i64().unwrap();
    let (s, _) = root
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": tid}),
        )
        .await;
    assert_eq!(s, 201);
    let (s, v) = root
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": 1, "tags": "a:b:c"}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let (s, tok) = root
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": 1, "tags": "project:apollo,env:prod", "budget_usd": "1"}),
        )
        .await;
    assert_eq!(s, 201, "{tok}");
    assert_eq!(tok["tags"], "env:prod,project:apollo");
    let id = tok["id"].as_i64().unwrap();
    let text = tok["token"].as_str().unwrap().to_string();
    assert_eq!(app.chat(&text, &chat_body(16)).await.status(), 200);
    assert_eq!(row_tags(&app, 1).await, "env:prod,project:apollo");

    for bad in ["x:1,x:2", ":v", &format!("k:{}", "v".repeat(65))] {
        let (s, _) = root
            .patch(&format!("/admin/api/v1/tokens/{id}"), &json!({"tags": bad}))
            .await;
        assert_eq!(s, 400, "{bad}");
        let (s, _) = root
            .patch(&format!("/admin/api/v1/teams/{tid}"), &json!({"tags": bad}))
            .await;
        assert_eq!(s, 400, "{bad}");
    }
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/tokens/{id}"),
            &json!({"tags": "project:zeus"}),
        )
        .await;
    assert_eq!((s, v["tags"].as_str()), (200, Some("project:zeus")));
    assert_eq!(v["limit_micros"], 1_000_000, "the budget is untouched");
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/teams/{tid}"),
            &json!({"tags": "env:staging"}),
        )
        .await;
    assert_eq!((s, v["tags"].as_str()), (200, Some("env:staging")));
    let (_, audit) = root.get_json("/admin/api/v1/audit?action=team.tags").await;
    assert_eq!(audit["audit"].as_array().map(Vec::len), Some(1), "{audit}");
    let (_, audit) = root
        .get_json("/admin/api/v1/audit?action=token.update")
        .await;
    assert!(audit.to_string().contains("project:zeus"), "{audit}");

    make_login(&app, "fin", "finance", None).await;
    let fin = login(&app, "fin").await;
    let (s, _) = fin
        .get_json("/admin/api/v1/reports/spend?group_by=tag:project")
        .await;
    assert_eq!(s, 200, "finance reads reports");
    for (path, body) in [
        (format!("/admin/api/v1/tokens/{id}"), json!({"tags": "a:b"})),
        (format!("/admin/api/v1/teams/{tid}"), json!({"tags": "a:b"})),
    ] {
        assert_eq!(fin.patch(&path, &body).await.0, 403, "{path}");
    }
    let (s, _) = fin
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": 1, "tags": "a:b"}),
        )
        .await;
    assert_eq!(s, 403);
    let (_, t) = root.get_json("/admin/api/v1/tokens").await;
    assert_eq!(
        t["tokens"][0]["tags"], "project:zeus",
        "finance changed nothing"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn spend_by_tag_has_an_untagged_row_and_sums_to_the_total_and_the_ledger() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let (_, token) = app.token("alice", Some("5")).await;
    let plan: [&[u8]; 6] = [
        b"project:apollo",
        b"project:apollo,env:prod",
        b"project:zeus",
        b"env:prod",
        b"",
        b"project:apollo",
    ];
    for tags in plan {
        let r = tagged(&app, "/v1/chat/completions", &token, tags, &chat_body(16)).await;
        assert_eq!(r.status(), 200);
    }
    app.wait_for_log_rows(6).await;
    let today = chrono::Utc::now().date_naive();
    let range = format!("from={today}&to={}", today + chrono::Duration::days(1));
    let (s, v) = root
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&group_by=tag:project"
        ))
        .await;
    assert_eq!(s, 200, "{v}");
    let rows = v["rows"].as_array().unwrap();
    let keys: Vec<&str> = rows
        .iter()
        .map(|r| r["keys"][0].as_str().unwrap())
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, ["(untagged)", "apollo", "zeus"]);
    let count = |k: &str| rows.iter().find(|r| r["keys"][0] == k).unwrap()["requests"].as_i64();
    assert_eq!(
        (count("apollo"), count("zeus"), count("(untagged)")),
        (Some(3), Some(1), Some(2))
    );
    let sum: i64 = rows
        .iter()
        .map(|r| r["spend_micros"].as_i64().unwrap())
        .sum();
    assert_eq!(sum, v["total_micros"].as_i64().unwrap());
    let ledger = app
        .scalar(
            "SELECT CAST(SUM(amount_micros) AS BIGINT) FROM ledger WHERE kind IN ('reserve', 'settle', 'absorbed')",
        )
        .await;
    assert!(ledger > 0);
    assert_eq!(sum, ledger, "the report's total is the ledger's");
    let (_, f) = root
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&group_by=tag:env&tag=project:apollo"
        ))
        .await;
    assert_eq!(f["total_requests"], 3);
    let prod = f["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["keys"][0] == "prod");
    assert_eq!(prod.map(|r| r["requests"].clone()), Some(json!(1)));
    app.assert_invariant().await;
}

#[tokio::test]
async fn the_admin_pages_set_default_tags_and_the_reports_page_groups_by_them() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let r = root
        .htmx_form("/admin/teams", &[("name", "blue"), ("tags", "env:dev")])
        .await;
    assert_eq!(r.status(), 200);
    let (_, teams) = root.get_json("/admin/api/v1/teams").await;
    let blue = teams["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blue")
        .unwrap()
        .clone();
    assert_eq!(blue["tags"], "env:dev");
    let tid = blue["id"].as_i64().unwrap();
    let r = root
        .htmx_form(
            &format!("/admin/teams/{tid}/tags"),
            &[("tags", "env:qa,cc:1")],
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("cc:1,env:qa"));
    let r = root
        .htmx_form(
            &format!("/admin/teams/{tid}/tags"),
            &[("tags", "env:qa,env:dev")],
        )
        .await;
    assert_eq!(r.status(), 400, "the page refuses a duplicate key too");

    let (_, user) = root
        .post(
            "/admin/api/v1/users",
            &json!({"username": "bo", "team_id": tid}),
        )
        .await;
    let uid = user["id"].as_i64().unwrap().to_string();
    let r = root
        .htmx_form(
            "/admin/tokens",
            &[("user_id", uid.as_str()), ("tags", "project:apollo")],
        )
        .await;
    assert_eq!(r.status(), 200);
    let (_, toks) = root.get_json("/admin/api/v1/tokens").await;
    let id = toks["tokens"][0]["id"].as_i64().unwrap();
    assert_eq!(toks["tokens"][0]["tags"], "project:apollo");
    let r = root
        .htmx_form(
            &format!("/admin/tokens/{id}/limits"),
            &[("max_priority", "2"), ("tags", "project:zeus")],
        )
        .await;
    assert_eq!(r.status(), 200);
    let (_, toks) = root.get_json("/admin/api/v1/tokens").await;
    assert_eq!(toks["tokens"][0]["tags"], "project:zeus");
    let (s, rotated) = root
        .post(&format!("/admin/api/v1/tokens/{id}/rotate"), &json!({}))
        .await;
    assert_eq!(
        (s, rotated["tags"].as_str()),
        (201, Some("project:zeus")),
        "a rotated token keeps its tags"
    );
    let text = rotated["token"].as_str().unwrap();
    assert_eq!(app.chat(text, &chat_body(8)).await.status(), 200);
    assert_eq!(row_tags(&app, 1).await, "cc:1,env:qa,project:zeus");

    let page = root
        .get("/admin/reports?group_by=tag:project,model&tag=env:qa")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("value=\"tag:project,model\""),
        "the grouping is kept"
    );
    assert!(page.contains("value=\"env:qa\""), "the filter is kept");
    assert!(page.contains("<th scope=\"col\">tag:project</th><th scope=\"col\">model</th>"));
    assert!(
        page.contains("<th scope=\"row\">zeus</th><td>gpt-4o-mini</td>"),
        "{page}"
    );
}

#[tokio::test]
async fn the_header_cannot_move_spend_off_the_admins_tags() {
    let app = spawn_app_with_claude().await;
    let args = IssueArgs {
        budget_usd: Some("1"),
        ..issue_args("ana")
    };
    let t = app
        .token_in_team("core", Some("cc:4711"), args, Some("env:prod"))
        .await;
    let anthropic = json!({"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    for (header, key) in [("cc:9999", "cc"), ("env:test,proj:x", "env")] {
        let r = tagged(
            &app,
            "/v1/chat/completions",
            &t.text,
            header.as_bytes(),
            &chat_body(16),
        )
        .await;
        assert_eq!(r.status(), 400, "{header}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "x-sluice-tags", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`{key}`")), "{msg}");

        let r = tagged(&app, "/v1/messages", &t.text, header.as_bytes(), &anthropic).await;
        assert_eq!(r.status(), 400, "{header}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("x-sluice-tags") && msg.contains(&format!("`{key}`")),
            "{msg}"
        );
    }
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached the upstream"
    );
    // The admin's own value repeated is no override.
    let r = tagged(
        &app,
        "/v1/chat/completions",
        &t.text,
        b"cc:4711",
        &chat_body(16),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(row_tags(&app, 1).await, "cc:4711,env:prod");
    app.assert_invariant().await;
}

/// Team tags that with a token's would pass ten are refused when they are set — on the
/// token's issue or edit, and on the team's create or edit — not on every later request
/// with a 400 about a header the client never sent. A team edit of budget and tags is one
/// change: a bad tag leaves the budget as it was.
#[tokio::test]
async fn default_tags_that_would_pass_ten_are_refused_when_set() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let six: Vec<String> = (0..6).map(|i| format!("t{i}:v")).collect();
    let five: Vec<String> = (0..5).map(|i| format!("k{i}:v")).collect();
    let (s, team) = root
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "tags": six.join(",")}),
        )
        .await;
    assert_eq!(s, 201, "{team}");
    let tid = team["id"].as_i64().unwrap();
    let (s, _) = root
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": tid}),
        )
        .await;
    assert_eq!(s, 201);
    let (s, v) = root
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": 1, "tags": five.join(",")}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("tags"), "{v}");
    let (s, tok) = root
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": 1, "tags": "k0:v,k1:v,k2:v,k3:v"}),
        )
        .await;
    assert_eq!(s, 201, "{tok}");
    let id = tok["id"].as_i64().unwrap();
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/tokens/{id}"),
            &json!({"tags": five.join(",")}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let seven: Vec<String> = (0..7).map(|i| format!("t{i}:v")).collect();
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/teams/{tid}"),
            &json!({"tags": seven.join(",")}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    // Budget and a bad tag text together: refused as a whole.
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/teams/{tid}"),
            &json!({"budget_usd": "5", "tags": "a:b:c"}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let (_, teams) = root.get_json("/admin/api/v1/teams").await;
    let red = teams["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == tid)
        .cloned()
        .unwrap();
    assert_eq!(red["limit_micros"], Value::Null, "{red}");
    assert_eq!(red["tags"], six.join(","));
    // The CLI refuses alike.
    let now = chrono::Utc::now();
    let err = sluice::cli::team_edit_tags(app.db(), "red", &seven.join(","), now)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tags"), "{err}");
    // What is left still serves: the token's 4 and the team's 6.
    let text = tok["token"].as_str().unwrap();
    assert_eq!(app.chat(text, &chat_body(16)).await.status(), 200);
}

/// Moving a user to a team whose tags and the user's tokens' would pass ten together is
/// refused alike: the move, not every later request, is what fails.
#[tokio::test]
async fn a_user_is_not_moved_where_their_tokens_tags_would_pass_ten() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let six: Vec<String> = (0..6).map(|i| format!("t{i}:v")).collect();
    let five: Vec<String> = (0..5).map(|i| format!("k{i}:v")).collect();
    let (_, red) = root
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "tags": six.join(",")}),
        )
        .await;
    let (_, blue) = root
        .post("/admin/api/v1/teams", &json!({"name": "blue"}))
        .await;
    let (s, user) = root
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": blue["id"]}),
        )
        .await;
    assert_eq!(s, 201, "{user}");
    let uid = user["id"].as_i64().unwrap();
    let (s, tok) = root
        .post(
            "/admin/api/v1/tokens",
            &json!({"user_id": uid, "tags": five.join(",")}),
        )
        .await;
    assert_eq!(s, 201, "{tok}");
    let (s, v) = root
        .patch(
            &format!("/admin/api/v1/users/{uid}"),
            &json!({"team_id": red["id"]}),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("tags"), "{v}");
    let team = sql_text(
        app.db(),
        &format!(
            "SELECT tm.name FROM users u JOIN teams tm ON tm.id = u.team_id WHERE u.id = {uid}"
        ),
    )
    .await;
    assert_eq!(team, "blue");
}

/// A team PATCH sets the budget only when `budget_usd` is in the body: `{}` is refused
/// (naming the body) and leaves the budget, `{"tags": …}` changes the tags alone, and
/// `{"budget_usd": null}` is what clears the budget.
#[tokio::test]
async fn a_team_patch_without_budget_usd_leaves_the_budget() {
    let app = spawn_app().await;
    let root = admin(&app).await;
    let (s, team) = root
        .post(
            "/admin/api/v1/teams",
            &json!({"name": "red", "budget_usd": "25"}),
        )
        .await;
    assert_eq!(s, 201, "{team}");
    let path = format!("/admin/api/v1/teams/{}", team["id"]);
    let (s, v) = root.patch(&path, &json!({})).await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("body"), "{v}");
    let (s, v) = root.patch(&path, &json!({"tags": "env:dev"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["limit_micros"].as_i64(), v["tags"].as_str()),
        (Some(25_000_000), Some("env:dev"))
    );
    let (_, teams) = root.get_json("/admin/api/v1/teams").await;
    assert_eq!(teams["teams"][0]["limit_micros"], 25_000_000, "{teams}");
    let (s, v) = root.patch(&path, &json!({"budget_usd": null})).await;
    assert_eq!((s, &v["limit_micros"]), (200, &Value::Null), "{v}");
    assert_eq!(v["tags"], "env:dev", "{v}");
}

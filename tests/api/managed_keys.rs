//! Upstream keys and models managed through the admin API (issue 19 items 2–3): a key
//! added is used by the next request and shown by its last 4 characters only; rotated
//! under load with no failed request; disabled and never used again; deleted; tested; a
//! price changed prices the next request and not an earlier one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use sluice::mock::Script;

use crate::admin_helpers::{login, make_login, Session};
use crate::helpers::*;

const KEY_1: &str = "sk-managed-one-0001-WXYZ";
const KEY_2: &str = "sk-managed-two-0002-QRST";
const KEY_3: &str = "sk-managed-three-0003-LMNO";

async fn admin(app: &TestApp) -> Session {
    make_login(app, "root", "admin", None).await;
    login(app, "root").await
}

/// The `[[upstreams]]` table of a managed upstream on the test's mock.
fn table(app: &TestApp, id: &str, key: &str) -> Value {
    json!({
        "id": id, "provider": "openai", "base_url": format!("{}/v1", app.mock.base_url()),
        "api_key": key, "allow_private_network": true,
    })
}

fn priced(routes: &[&str], input: f64, output: f64) -> Value {
    json!({
        "routes": routes.iter().map(|u| json!({"upstream": u, "model": "managed-upstream"})).collect::<Vec<_>>(),
        "input_usd_per_mtok": input, "output_usd_per_mtok": output,
    })
}

/// Saves model `name` through the admin API; it must be taken. Returns the answer.
async fn put_model(s: &Session, name: &str, table: &Value) -> Value {
    let path = format!("/admin/api/v1/models/{name}");
    let (status, body) = s.send(reqwest::Method::PUT, &path, table).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn ask(app: &TestApp, token: &str, model: &str) -> (u16, Value) {
    let r = app
        .chat(token, &json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}))
        .await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn used(app: &TestApp, key: &str) -> u64 {
    app.mock.state.stats(key).count
}

#[tokio::test]
async fn a_key_added_through_the_api_serves_the_next_request_and_shows_only_its_last_four() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_1))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["key"], "****WXYZ");
    assert_eq!(body["source"], "admin");
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    let (status, body) = ask(&app, &token, "managed").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(used(&app, KEY_1), 1, "the managed key served the request");

    // The key is shown nowhere whole: not in the list, not in the audit log.
    let (_, list) = s.get_json("/admin/api/v1/upstreams").await;
    let text = list.to_string();
    assert!(!text.contains(KEY_1), "{text}");
    assert!(text.contains("****WXYZ"), "{text}");
    let a = list["upstreams"].as_array().unwrap();
    let config = a.iter().find(|u| u["id"] == "a").unwrap();
    assert_eq!(config["source"], "config");
    let (_, audit) = s.get_json("/admin/api/v1/audit").await;
    let text = audit.to_string();
    assert!(text.contains("upstream.add"), "{text}");
    assert!(text.contains("model.put"), "{text}");
    assert!(!text.contains(KEY_1), "{text}");
    // A config upstream is read-only here.
    let (status, body) = s
        .post(
            "/admin/api/v1/upstreams/a/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("config file"), "{body}");
    // Its id cannot be taken by a managed one, nor can an id be taken twice.
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(&app, "a", KEY_2))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_2))
        .await;
    assert_eq!(status, 409, "{body}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_key_is_rotated_under_load_with_no_failed_request_and_the_old_one_is_no_longer_used() {
    let app = Arc::new(spawn_app().await);
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    assert_eq!(
        s.post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_1))
            .await
            .0,
        201
    );
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    // Slow answers, so requests are in flight on the old key when it is rotated.
    app.mock.state.sticky(
        KEY_1,
        Some(Script {
            delay_ms: 150,
            ..Script::default()
        }),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (app, token, stop) = (app.clone(), token.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    statuses.push(ask(&app, &token, "managed").await);
                }
                statuses
            })
        })
        .collect();
    while used(&app, KEY_1) < 8 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, body) = s
        .post(
            "/admin/api/v1/upstreams/m1/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["key"], "****QRST");
    while used(&app, KEY_2) < 8 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        for (status, body) in w.await.unwrap() {
            assert_eq!(status, 200, "a request failed across the rotation: {body}");
        }
    }
    let old = used(&app, KEY_1);
    for _ in 0..4 {
        assert_eq!(ask(&app, &token, "managed").await.0, 200);
    }
    assert_eq!(
        used(&app, KEY_1),
        old,
        "the old key was used after the rotation"
    );
    let (_, audit) = s.get_json("/admin/api/v1/audit").await;
    let text = audit.to_string();
    assert!(text.contains("upstream.rotate_key"), "{text}");
    assert!(!text.contains(KEY_1) && !text.contains(KEY_2), "{text}");
    app.wait_settled().await;
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_disabled_key_is_never_used_again_and_a_deleted_one_is_gone() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    for (id, key) in [("m1", KEY_1), ("m2", KEY_2)] {
        assert_eq!(
            s.post("/admin/api/v1/upstreams", &table(&app, id, key))
                .await
                .0,
            201
        );
    }
    put_model(&s, "managed", &priced(&["m1", "m2"], 1.0, 2.0)).await;
    let (status, body) = s
        .post("/admin/api/v1/upstreams/m1/disable", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["enabled"], false);
    let before = used(&app, KEY_1);
    for _ in 0..6 {
        assert_eq!(ask(&app, &token, "managed").await.0, 200);
    }
    assert_eq!(used(&app, KEY_1), before, "a disabled key served a request");
    assert_eq!(used(&app, KEY_2), 6);
    // A model still routes to it: deleting it would break the model, and is refused.
    let (status, body) = s
        .send(
            reqwest::Method::DELETE,
            "/admin/api/v1/upstreams/m1",
            &json!({}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("unknown upstream `m1`"), "{body}");
    put_model(&s, "managed", &priced(&["m2"], 1.0, 2.0)).await;
    let (status, body) = s
        .send(
            reqwest::Method::DELETE,
            "/admin/api/v1/upstreams/m1",
            &json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, list) = s.get_json("/admin/api/v1/upstreams").await;
    assert!(
        list["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["id"] != "m1"),
        "{list}"
    );
    assert_eq!(ask(&app, &token, "managed").await.0, 200);
    assert_eq!(used(&app, KEY_1), before);
    let (status, _) = s
        .send(
            reqwest::Method::DELETE,
            "/admin/api/v1/upstreams/m1",
            &json!({}),
        )
        .await;
    assert_eq!(status, 404);
    app.assert_invariant().await;
}

#[tokio::test]
async fn test_shows_success_against_the_mock_and_a_clear_failure_for_a_refused_key() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    assert_eq!(
        s.post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_3))
            .await
            .0,
        201
    );
    // No model routes to it yet: test says so.
    let (status, body) = s.post("/admin/api/v1/upstreams/m1/test", &json!({})).await;
    assert_eq!(status, 409, "{body}");
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    let (status, body) = s.post("/admin/api/v1/upstreams/m1/test", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["status"], 200, "{body}");
    assert_eq!(used(&app, KEY_3), 1, "one upstream call");
    app.mock.state.sticky(
        KEY_3,
        Some(Script {
            status: Some(401),
            ..Script::default()
        }),
    );
    let (status, body) = s.post("/admin/api/v1/upstreams/m1/test", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(body["status"], 401, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("refused the key"),
        "{body}"
    );
    assert!(!body.to_string().contains(KEY_3));
    // A config upstream can be tested too.
    let (status, body) = s.post("/admin/api/v1/upstreams/a/test", &json!({})).await;
    assert_eq!((status, body["ok"].clone()), (200, json!(true)), "{body}");
}

#[tokio::test]
async fn a_price_changed_through_the_api_prices_the_next_request_and_not_an_earlier_one() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    // Overrides the config's `gpt-4o-mini` (routes to the config upstream `a`).
    let mini = |input: f64, output: f64| {
        json!({"routes": [{"upstream": "a", "model": "gpt-4o-mini-upstream"}], "aliases": ["mini"],
               "input_usd_per_mtok": input, "output_usd_per_mtok": output})
    };
    let put = put_model(&s, "gpt-4o-mini", &mini(10.0, 20.0)).await;
    assert_eq!(put["input_micros_per_mtok"], 10_000_000);
    assert_eq!(ask(&app, &token, "gpt-4o-mini").await.0, 200);
    app.wait_for_log_rows(1).await;
    let first = app.scalar("SELECT cost_micros FROM requests").await;
    assert!(first > 0);
    put_model(&s, "gpt-4o-mini", &mini(30.0, 60.0)).await;
    assert_eq!(ask(&app, &token, "gpt-4o-mini").await.0, 200);
    app.wait_for_log_rows(2).await;
    let costs: Vec<(i64,)> =
        sql_rows(app.db(), "SELECT cost_micros FROM requests ORDER BY id").await;
    assert_eq!(costs[0].0, first, "the earlier request kept its cost");
    assert_eq!(
        costs[1].0,
        first * 3,
        "the next request is priced at the new price"
    );
    // Deleting the override brings back the config's prices.
    let (status, _) = s
        .send(
            reqwest::Method::DELETE,
            "/admin/api/v1/models/gpt-4o-mini",
            &json!({}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, models) = s.get_json("/admin/api/v1/models").await;
    let m = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "gpt-4o-mini")
        .cloned()
        .unwrap();
    assert_eq!(m["input_micros_per_mtok"], 150_000);
    app.assert_invariant().await;
}

#[tokio::test]
async fn only_an_admin_manages_keys_and_a_bad_table_is_named() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    make_login(&app, "fin", "finance", None).await;
    let f = login(&app, "fin").await;
    let (status, _) = f
        .post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_1))
        .await;
    assert_eq!(status, 403);
    let mut bad = table(&app, "m1", KEY_1);
    bad["colour"] = json!("blue");
    let (status, body) = s.post("/admin/api/v1/upstreams", &bad).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("colour"), "{body}");
    let (status, body) = s.post("/admin/api/v1/upstreams", &json!({"id": "m1", "provider": "openai", "base_url": "http://10.0.0.1/v1", "api_key": KEY_1})).await;
    assert_eq!(
        status, 400,
        "a private address without allow_private_network: {body}"
    );
    let (status, body) = s
        .send(
            reqwest::Method::PUT,
            "/admin/api/v1/models/x",
            &json!({"routes": [{"upstream": "nope", "model": "x"}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("unknown upstream `nope`"),
        "{body}"
    );
}

/// A key pasted with the line's end (or spaces) around it is the key, not an invalid header
/// that fails every call; and a base URL carrying a query or a fragment — which would cut
/// off the path the gateway appends (`…/internal/action#` + `/chat/completions`) — is named
/// and refused.
#[tokio::test]
async fn a_pasted_key_is_trimmed_and_a_base_url_with_a_query_or_fragment_is_refused() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    let (status, body) = s
        .post(
            "/admin/api/v1/upstreams",
            &table(&app, "pasted", &format!("  {KEY_1}\n")),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["key"], "****WXYZ");
    put_model(&s, "pasted", &priced(&["pasted"], 1.0, 2.0)).await;
    let (status, body) = ask(&app, &token, "pasted").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(used(&app, KEY_1), 1, "the trimmed key served the request");
    let (status, body) = s
        .post(
            "/admin/api/v1/upstreams/pasted/rotate",
            &json!({"api_key": format!("{KEY_2}\r\n")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = ask(&app, &token, "pasted").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        used(&app, KEY_2),
        1,
        "the trimmed new key served the request"
    );

    for (id, tail) in [("q", "/v1?x=1"), ("f", "/internal/action#")] {
        let mut t = table(&app, id, KEY_1);
        t["base_url"] = json!(format!("{}{tail}", app.mock.base_url()));
        let (status, body) = s.post("/admin/api/v1/upstreams", &t).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("query or a fragment"), "{body}");
    }
    app.assert_invariant().await;
}

/// A key the upstream refused (401) is taken out of the pool; rotating in a good key brings
/// the upstream back at once — what the pool learned of the old key is not the new one's.
#[tokio::test]
async fn a_rotation_brings_back_an_upstream_whose_old_key_was_refused() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(&app, "solo", KEY_1))
        .await;
    assert_eq!(status, 201, "{body}");
    put_model(&s, "solo", &priced(&["solo"], 1.0, 2.0)).await;
    app.mock.state.sticky(
        KEY_1,
        Some(sluice::mock::Script {
            status: Some(401),
            ..sluice::mock::Script::default()
        }),
    );
    let (status, _) = ask(&app, &token, "solo").await;
    assert_ne!(status, 200, "the refused key fails");
    let (_, list) = s.get_json("/admin/api/v1/upstreams").await;
    let solo = list["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "solo")
        .cloned()
        .unwrap();
    assert_eq!(solo["enabled"], false, "taken out of the pool: {solo}");
    let (status, body) = s
        .post(
            "/admin/api/v1/upstreams/solo/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = ask(&app, &token, "solo").await;
    assert_eq!(status, 200, "the new key serves at once: {body}");
    assert_eq!(used(&app, KEY_2), 1);
    app.assert_invariant().await;
}

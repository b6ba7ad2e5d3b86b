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

/// Adds managed upstream `id` on the test's mock with `key` through the admin API; it must
/// be taken.
async fn add_upstream(app: &TestApp, s: &Session, id: &str, key: &str) {
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(app, id, key))
        .await;
    assert_eq!(status, 201, "{body}");
}

/// Managed upstreams `m1` (`KEY_1`) and `m2` (`KEY_2`), and model `managed` routed to both.
async fn two_keys(app: &TestApp, s: &Session) {
    for (id, key) in [("m1", KEY_1), ("m2", KEY_2)] {
        add_upstream(app, s, id, key).await;
    }
    put_model(s, "managed", &priced(&["m1", "m2"], 1.0, 2.0)).await;
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
    add_upstream(&app, &s, "m1", KEY_1).await;
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
    two_keys(&app, &s).await;
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
    add_upstream(&app, &s, "m1", KEY_3).await;
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
    // Each change's audit row says what it replaced, read with it: the config's model at
    // first, then the stored override — routes and prices, before and after.
    let rows: Vec<(String, String)> = sql_rows(
        app.db(),
        "SELECT before, after FROM audit_log WHERE action = 'model.put' ORDER BY id",
    )
    .await;
    let price =
        |text: &str| serde_json::from_str::<Value>(text).unwrap()["input_micros_per_mtok"].clone();
    assert_eq!(price(&rows[0].0), 150_000, "{rows:?}");
    assert_eq!(
        (price(&rows[1].0), price(&rows[1].1)),
        (json!(10_000_000), json!(30_000_000))
    );
    assert!(rows[1].0.contains("a:gpt-4o-mini-upstream"), "{rows:?}");
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

/// A managed model takes every kind's price key, as a `[[models]]` entry does; the API
/// shows each kind in micro-dollars (defaults filled in), and a bad one is named.
#[tokio::test]
async fn a_managed_model_takes_every_kind_s_price_and_the_api_shows_it() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let mut sonnet = priced(&["a"], 3.0, 15.0);
    for (k, v) in [
        ("cached_input_usd_per_mtok", 0.3),
        ("cache_write_5m_usd_per_mtok", 3.75),
        ("cache_write_1h_usd_per_mtok", 6.0),
        ("audio_input_usd_per_mtok", 40.0),
        ("web_search_usd_per_1k_calls", 10.0),
    ] {
        sonnet[k] = json!(v);
    }
    let put = put_model(&s, "sonnet", &sonnet).await;
    let (_, models) = s.get_json("/admin/api/v1/models").await;
    let listed = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "sonnet")
        .cloned()
        .unwrap();
    for m in [&put, &listed] {
        for (k, v) in [
            ("input_micros_per_mtok", 3_000_000),
            ("output_micros_per_mtok", 15_000_000),
            ("cached_input_micros_per_mtok", 300_000),
            ("cache_write_5m_micros_per_mtok", 3_750_000),
            ("cache_write_1h_micros_per_mtok", 6_000_000),
            ("reasoning_micros_per_mtok", 15_000_000),
            ("audio_input_micros_per_mtok", 40_000_000),
            ("audio_output_micros_per_mtok", 15_000_000),
            ("image_input_micros_per_mtok", 3_000_000),
            ("image_output_micros_per_mtok", 15_000_000),
            ("web_search_micros_per_1k_calls", 10_000_000),
        ] {
            assert_eq!(m[k], v, "{k}: {m}");
        }
    }
    let mut bad = priced(&["a"], 3.0, 15.0);
    bad["cache_write_1h_usd_per_mtok"] = json!(-1.0);
    let (status, body) = s
        .send(reqwest::Method::PUT, "/admin/api/v1/models/bad", &bad)
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("cache_write_1h_usd_per_mtok"),
        "{body}"
    );
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
    add_upstream(&app, &s, "solo", KEY_1).await;
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

/// Waits (5 s at most) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..250 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what} never came");
}

/// Bumps `catalog_epoch` as an admin change does, without one (the stored rows changed
/// under the gateway).
async fn bump_epoch(app: &TestApp) {
    let mut tx = app.db().begin().await.unwrap();
    sluice::store::managed::bump_epoch(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
}

/// Two admins at once, each change valid alone: one deletes an upstream, the other routes
/// a new model to it. They are checked one after the other: exactly one is taken, and the
/// stored catalog stays one the gateway can build. (Checked apart, both were taken: a
/// model routed to nothing was stored, and every replica's rebuild failed from then on.)
#[tokio::test]
async fn two_changes_at_once_are_checked_one_after_the_other() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    for i in 0..12 {
        add_upstream(&app, &s, "x", KEY_1).await;
        let model = format!("race{i}");
        let (none, path, routes) = (
            json!({}),
            format!("/admin/api/v1/models/{model}"),
            priced(&["x"], 1.0, 2.0),
        );
        let (deleted, routed) = tokio::join!(
            s.send(reqwest::Method::DELETE, "/admin/api/v1/upstreams/x", &none),
            s.send(reqwest::Method::PUT, &path, &routes),
        );
        assert!(
            (deleted.0 == 200) != (routed.0 == 200),
            "round {i}: delete {deleted:?}, route {routed:?}"
        );
        let ups = sluice::store::managed::upstreams(app.db()).await.unwrap();
        let models = sluice::store::managed::models(app.db()).await.unwrap();
        let prices = sluice::store::prices::all(app.db()).await.unwrap();
        sluice::upstream::live::effective(
            &app.state.live.file(),
            (&ups, &models, &prices),
            &app.db().seal,
            chrono::Utc::now(),
        )
        .unwrap_or_else(|e| panic!("round {i}: the stored catalog does not build: {e}"));
        if routed.0 == 200 {
            assert_eq!(s.send(reqwest::Method::DELETE, &path, &none).await.0, 200);
            let gone = s.send(reqwest::Method::DELETE, "/admin/api/v1/upstreams/x", &none);
            assert_eq!(gone.await.0, 200);
        }
    }
    assert!(!app.state.live.stale());
}

/// Someone who can write the database but holds no master key points a managed upstream
/// at their own server. The key is sealed with its row: in the altered row it does not
/// open, so no catalog sends it there — the one in use stays, the gateway says so — and
/// every poll tries again: the row put back applies with no further change. (Before, the
/// key opened wherever its row pointed; and a rebuild that failed was not tried again
/// until the next admin change.)
#[tokio::test]
async fn a_row_altered_in_the_database_sends_its_key_nowhere_and_is_retried_until_it_reads() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    add_upstream(&app, &s, "m1", KEY_1).await;
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    assert_eq!(ask(&app, &token, "managed").await.0, 200);
    let thief = sluice::mock::MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let stored = sql_text(
        app.db(),
        "SELECT settings FROM managed_upstreams WHERE id = 'm1'",
    )
    .await;
    let altered = stored.replace(&app.mock.base_url(), &thief.base_url());
    assert_ne!(altered, stored);
    let set = |v: &str| format!("UPDATE managed_upstreams SET settings = '{v}' WHERE id = 'm1'");
    sql_exec(app.db(), &set(&altered)).await;
    bump_epoch(&app).await;
    eventually("the refused rebuild", || app.state.live.stale()).await;
    for _ in 0..3 {
        assert_eq!(ask(&app, &token, "managed").await.0, 200);
    }
    assert_eq!(
        thief.state.stats(KEY_1).count,
        0,
        "the key went where the altered row said"
    );
    assert_eq!(used(&app, KEY_1), 4);
    // A gateway starting now serves the config file's catalog rather than not starting.
    let other = sluice::startup::Application::build(app.settings.clone())
        .await
        .expect("a gateway starts beside rows it cannot read");
    assert!(other.state().catalog().model("managed").is_none());
    assert!(other.state().catalog().model("gpt-4o-mini").is_some());
    sql_exec(app.db(), &set(&stored)).await;
    eventually("the rows read again", || !app.state.live.stale()).await;
    assert_eq!(ask(&app, &token, "managed").await.0, 200);
    assert_eq!(used(&app, KEY_1), 5);
    app.assert_invariant().await;
}

/// A disabled key switched back on in the database alone does not open: the switch is
/// sealed with it. Through the admin API it is sealed again and serves.
#[tokio::test]
async fn a_key_enabled_in_the_database_alone_stays_unused() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    two_keys(&app, &s).await;
    let off = s
        .post("/admin/api/v1/upstreams/m1/disable", &json!({}))
        .await;
    assert_eq!(off.0, 200, "{}", off.1);
    let on = if app.db().postgres().is_some() {
        "TRUE"
    } else {
        "1"
    };
    sql_exec(
        app.db(),
        &format!("UPDATE managed_upstreams SET enabled = {on} WHERE id = 'm1'"),
    )
    .await;
    bump_epoch(&app).await;
    eventually("the refused rebuild", || app.state.live.stale()).await;
    for _ in 0..4 {
        assert_eq!(ask(&app, &token, "managed").await.0, 200);
    }
    assert_eq!(
        used(&app, KEY_1),
        0,
        "a key switched on in the database alone served"
    );
    // The admin's own switch: refused while the row does not open (it is not theirs).
    sql_exec(
        app.db(),
        "UPDATE managed_upstreams SET enabled = NOT enabled WHERE id = 'm1'",
    )
    .await;
    eventually("the rows read again", || !app.state.live.stale()).await;
    let on = s
        .post("/admin/api/v1/upstreams/m1/enable", &json!({}))
        .await;
    assert_eq!(on.0, 200, "{}", on.1);
    let before = used(&app, KEY_1);
    for _ in 0..4 {
        assert_eq!(ask(&app, &token, "managed").await.0, 200);
    }
    assert!(
        used(&app, KEY_1) > before,
        "the key enabled by an admin serves"
    );
}

/// With `upstream.managed_allow_private_network` off (the default), an upstream added here
/// cannot opt in to private addresses: an admin session cannot point the gateway (or its
/// "test" button) at the internal network. A public one is still taken.
#[tokio::test]
async fn an_upstream_added_here_reaches_private_addresses_only_where_the_file_allows() {
    let app = spawn_app_with(|s, _| s.upstream.managed_allow_private_network = false).await;
    let s = admin(&app).await;
    let (status, body) = s
        .post("/admin/api/v1/upstreams", &table(&app, "m1", KEY_1))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("managed_allow_private_network"),
        "{body}"
    );
    let (_, list) = s.get_json("/admin/api/v1/upstreams").await;
    assert!(!list.to_string().contains("m1"), "{list}");
    let public = json!({
        "id": "m2", "provider": "openai", "base_url": "https://api.openai.com/v1", "api_key": KEY_2,
    });
    let (status, body) = s.post("/admin/api/v1/upstreams", &public).await;
    assert_eq!(status, 201, "{body}");
}

/// Turning `upstream.managed_allow_private_network` off takes the access back from the
/// upstreams added while it was on: a gateway whose file says off sends them nothing (they
/// kept reaching the internal network until deleted).
#[tokio::test]
async fn a_file_that_stops_allowing_private_addresses_rests_the_upstreams_added_before() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    add_upstream(&app, &s, "m1", KEY_1).await;
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    assert_eq!(ask(&app, &token, "managed").await.0, 200);
    let mut stricter = app.settings.clone();
    stricter.upstream.managed_allow_private_network = false;
    let other = sluice::startup::Application::build(stricter).await.unwrap();
    let other_url = format!("http://127.0.0.1:{}/v1/chat/completions", other.port());
    tokio::spawn(other.run_until_stopped());
    let r = app
        .http
        .post(&other_url)
        .bearer_auth(&token)
        .json(&json!({"model": "managed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 200);
    assert_eq!(used(&app, KEY_1), 1, "the private address got nothing more");
    app.assert_invariant().await;
}

/// A managed key the provider refused (401) is taken out of the pool by every replica that
/// saw the refusal. Once the provider takes it again, an admin's "enable" brings it back on
/// every replica, not only the one that took the click (which did not either: the row was
/// enabled already, so nothing changed).
#[tokio::test]
async fn enabling_a_refused_key_brings_it_back_on_every_replica() {
    let app = spawn_app().await;
    let other = sluice::startup::Application::build(app.settings.clone())
        .await
        .unwrap();
    let other_url = format!("http://127.0.0.1:{}/v1/chat/completions", other.port());
    tokio::spawn(other.run_until_stopped());
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    add_upstream(&app, &s, "solo", KEY_1).await;
    put_model(&s, "solo", &priced(&["solo"], 1.0, 2.0)).await;
    let body =
        json!({"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16});
    let ask_other = || async {
        let r = app
            .http
            .post(&other_url)
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await;
        r.unwrap().status().as_u16()
    };
    let mut tries = 0;
    while ask_other().await == 404 {
        tries += 1;
        assert!(tries < 250, "the other replica never applied the model");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let refused = sluice::mock::Script {
        status: Some(401),
        ..sluice::mock::Script::default()
    };
    app.mock.state.sticky(KEY_1, Some(refused));
    assert_ne!(ask(&app, &token, "solo").await.0, 200);
    assert_ne!(ask_other().await, 200);
    app.mock.state.sticky(KEY_1, None);
    assert_ne!(
        ask(&app, &token, "solo").await.0,
        200,
        "still out of the pool"
    );
    let on = s
        .post("/admin/api/v1/upstreams/solo/enable", &json!({}))
        .await;
    assert_eq!(on.0, 200, "{}", on.1);
    assert_eq!(
        ask(&app, &token, "solo").await.0,
        200,
        "back on this replica"
    );
    let mut tries = 0;
    while ask_other().await != 200 {
        tries += 1;
        assert!(
            tries < 100,
            "the other replica kept the key out of its pool"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    app.assert_invariant().await;
}

/// A key rotated while a request on the old one is out: the old key's refusal (401) comes
/// back after the rotation. It says nothing of the new key, which keeps serving (it was
/// taken out of the pool: the answer landed on the position the new key now holds).
#[tokio::test]
async fn the_old_keys_refusal_arriving_after_a_rotation_leaves_the_new_key_serving() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    add_upstream(&app, &s, "solo", KEY_1).await;
    put_model(&s, "solo", &priced(&["solo"], 1.0, 2.0)).await;
    let late_refusal = Script {
        status: Some(401),
        delay_ms: 600,
        ..Script::default()
    };
    app.mock.state.sticky(KEY_1, Some(late_refusal));
    let out = tokio::spawn({
        let (url, token) = (
            format!("{}/v1/chat/completions", app.address),
            token.clone(),
        );
        let body = json!({"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16});
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await;
            r.unwrap().status().as_u16()
        }
    });
    while app.mock.state.stats(KEY_1).in_flight == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let rotated = s
        .post(
            "/admin/api/v1/upstreams/solo/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(rotated.0, 200, "{}", rotated.1);
    assert_ne!(out.await.unwrap(), 200, "the old key was refused");
    for _ in 0..3 {
        assert_eq!(ask(&app, &token, "solo").await.0, 200, "the new key serves");
    }
    assert_eq!(used(&app, KEY_2), 3);
    app.assert_invariant().await;
}

/// Replicas share key cooldowns through Redis. A managed key told to rest for an hour (429
/// `Retry-After: 3600`) is rotated: the new key serves at once and stays serving — the old
/// key's cooldown, still in Redis, does not come back to it at the next exchange (it did:
/// cooldowns were shared by upstream id, whatever its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_does_not_get_the_old_keys_shared_cooldown_back() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let app = spawn_app_with(move |s, _| {
        s.redis = Some(sluice::config::RedisSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(url)),
            ..Default::default()
        });
    })
    .await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    add_upstream(&app, &s, "solo", KEY_1).await;
    put_model(&s, "solo", &priced(&["solo"], 1.0, 2.0)).await;
    let rest = Script {
        status: Some(429),
        headers: vec![("Retry-After".into(), "3600".into())],
        ..Script::default()
    };
    app.mock.state.script(KEY_1, [rest]);
    assert_ne!(ask(&app, &token, "solo").await.0, 200, "the only key rests");
    let d = app.state.catalog().position("solo").unwrap();
    let pattern = format!("*{}", app.state.catalog().deployments[d].shared_name());
    let mut tries = 0;
    while redis
        .cli(&["KEYS", &pattern])
        .await
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        tries += 1;
        assert!(tries < 250, "the cooldown was never shared");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let rotated = s
        .post(
            "/admin/api/v1/upstreams/solo/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(rotated.0, 200, "{}", rotated.1);
    // Several exchanges (every 250 ms) with the old cooldown still in Redis.
    for _ in 0..6 {
        assert_eq!(ask(&app, &token, "solo").await.0, 200, "the new key serves");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(used(&app, KEY_2), 6);
}

/// A failed read of the catalog's epoch (a database failing over, a busy file) is a
/// failure while it lasts, not after: the next good poll, with nothing changed, clears it
/// (it stayed "stale", alerting and with the gauge at 1, until the next admin change).
#[tokio::test]
async fn a_failed_poll_is_stale_only_while_it_fails() {
    let app = spawn_app().await;
    sql_exec(app.db(), "ALTER TABLE meta RENAME TO meta_away").await;
    eventually("the failed poll", || app.state.live.stale()).await;
    sql_exec(app.db(), "ALTER TABLE meta_away RENAME TO meta").await;
    eventually("the good poll", || !app.state.live.stale()).await;
}

/// A request waiting at a managed upstream's concurrency gate while the admin rotates its
/// key goes out with the new key, and one waiting while the upstream is disabled does not
/// go out at all (the attempt took its deployment before the gate, so after a wait of up
/// to the deadline the old key was sent — and its refusal then taught the pool nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_at_the_gate_does_not_send_a_key_replaced_meanwhile() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    let (_, token) = app.token("ann", None).await;
    let mut t = table(&app, "solo", KEY_1);
    t["max_concurrent"] = json!(1);
    t["max_queue"] = json!(4);
    let (status, body) = s.post("/admin/api/v1/upstreams", &t).await;
    assert_eq!(status, 201, "{body}");
    put_model(&s, "solo", &priced(&["solo"], 1.0, 2.0)).await;
    let slow = || Script {
        delay_ms: 1_500,
        ..Script::default()
    };
    app.mock.state.script(KEY_1, [slow()]);
    let send = || {
        let url = format!("{}/v1/chat/completions", app.address);
        let token = token.clone();
        let body = json!({"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16});
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await;
            r.unwrap().status().as_u16()
        })
    };
    let first = send();
    while app.mock.state.stats(KEY_1).in_flight == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let waiting = send();
    // The second request is at the gate (the first holds the only slot).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let rotated = s
        .post(
            "/admin/api/v1/upstreams/solo/rotate",
            &json!({"api_key": KEY_2}),
        )
        .await;
    assert_eq!(rotated.0, 200, "{}", rotated.1);
    assert_eq!(
        first.await.unwrap(),
        200,
        "the call out when the key changed is answered"
    );
    assert_eq!(waiting.await.unwrap(), 200, "the waiting request is served");
    assert_eq!(
        used(&app, KEY_1),
        1,
        "the old key went out once, before the rotation"
    );
    assert_eq!(
        used(&app, KEY_2),
        1,
        "the waiting request went out with the new key"
    );

    // Disabled while a request waits: it is not sent at all.
    app.mock.state.script(KEY_2, [slow()]);
    let first = send();
    while app.mock.state.stats(KEY_2).in_flight == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let waiting = send();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let off = s
        .post("/admin/api/v1/upstreams/solo/disable", &json!({}))
        .await;
    assert_eq!(off.0, 200, "{}", off.1);
    assert_eq!(first.await.unwrap(), 200);
    assert_ne!(waiting.await.unwrap(), 200, "nothing left to serve it");
    assert_eq!(
        used(&app, KEY_2),
        2,
        "the disabled key was not sent again (one each before)"
    );
    app.assert_invariant().await;
}

/// A gateway starting beside managed rows that do not build serves the config file's
/// catalog without the file models the admin changed: such a model served as the file
/// says would be charged the file's price and sent along the routes the admin moved it
/// away from (it was, at the file's price).
#[tokio::test]
async fn a_gateway_starting_beside_unreadable_rows_withholds_the_file_models_they_change() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    add_upstream(&app, &s, "m1", KEY_1).await;
    put_model(&s, "gpt-4o-mini", &priced(&["m1"], 5.0, 6.0)).await;
    let off = if app.db().postgres().is_some() {
        "FALSE"
    } else {
        "0"
    };
    // Switched off in the database alone: the key no longer opens, the rows do not build.
    sql_exec(
        app.db(),
        &format!("UPDATE managed_upstreams SET enabled = {off} WHERE id = 'm1'"),
    )
    .await;
    let other = sluice::startup::Application::build(app.settings.clone())
        .await
        .expect("a gateway starts beside rows it cannot read");
    let catalog = other.state().catalog();
    assert!(
        catalog.model("gpt-4o-mini").is_none() && catalog.model("mini").is_none(),
        "the changed model is withheld, not served at the file's price"
    );
    assert!(catalog.model("text-embedding-3-small").is_some());
}

/// Final review F7: an upstream's test is a real call paid with its key, and its audit row
/// was written after the call, with the outcome: a session ended (or an audit refused)
/// meanwhile left a paid call with no row. The row is written before the call, by a
/// credential checked then; every call the upstream had is in the log.
#[tokio::test]
async fn every_upstream_test_call_is_audited_though_the_session_ends_during_it() {
    let app = spawn_app().await;
    let s = admin(&app).await;
    add_upstream(&app, &s, "m1", KEY_3).await;
    put_model(&s, "managed", &priced(&["m1"], 1.0, 2.0)).await;
    app.mock.state.script(
        KEY_3,
        [Script {
            delay_ms: 300,
            ..Script::default()
        }],
    );
    let end = async {
        eventually("the test call reached the upstream", || {
            used(&app, KEY_3) == 1
        })
        .await;
        sql_exec(app.db(), "DELETE FROM admin_sessions").await;
    };
    let empty = json!({});
    let ((status, body), ()) = tokio::join!(s.post("/admin/api/v1/upstreams/m1/test", &empty), end);
    assert_eq!(used(&app, KEY_3), 1, "{status} {body}");
    let rows: Vec<(String, String, Option<String>)> = sql_rows(
        app.db(),
        "SELECT actor, target, after FROM audit_log WHERE action = 'upstream.test'",
    )
    .await;
    assert_eq!(
        rows.len(),
        1,
        "the paid call is not in the audit log: {status} {body}"
    );
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("root", "upstream:m1")
    );
    assert!(
        rows[0]
            .2
            .as_deref()
            .is_some_and(|a| a.contains("managed-upstream")),
        "{rows:?}"
    );
    // A session ended before the test makes no call at all.
    let (status, _) = s.post("/admin/api/v1/upstreams/m1/test", &json!({})).await;
    assert_eq!(status, 401);
    assert_eq!(used(&app, KEY_3), 1, "a call by an ended session");
}

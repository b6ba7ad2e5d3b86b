//! The response cache (layer 1): exact and semantic hits, scopes, tools, replay of streams
//! in both formats, TTLs, tags, and the embedders' measured precision.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::cache::embed;
use sluice::config::{Provider, RouteSettings};

use crate::helpers::*;

fn question(vin: &str) -> Value {
    json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
           "messages": [{"role": "system", "content": "You diagnose cars."},
                        {"role": "user", "content": format!("Why does the engine warning light blink on {vin} after a cold start?")}]})
}

async fn ask(app: &TestApp, token: &str, body: &Value) -> (String, Value) {
    let resp = app.chat(token, body).await;
    assert_eq!(resp.status(), 200);
    let cache = resp
        .headers()
        .get("x-sluice-cache")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    (cache, resp.json().await.unwrap())
}

/// Entries are written off the request path; give the write a moment.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

#[tokio::test]
async fn an_exact_repeat_is_a_free_hit_and_logged_as_one() {
    let app = spawn_app().await;
    let (id, token) = app.token("alice", Some("1")).await;
    let (first, answer) = ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    assert_eq!(first, "miss");
    settle().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    let (second, again) = ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    assert_eq!(second, "hit-exact");
    assert_eq!(again, answer);
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        spent,
        "a hit costs nothing"
    );
    app.wait_for_log_rows(2).await;
    let (cache, cost, key): (String, i64, Option<String>) =
        sqlx::query_as("SELECT cache, cost_micros, cache_key FROM requests ORDER BY created_at DESC, rowid DESC LIMIT 1").fetch_one(&app.db().read).await.unwrap();
    assert_eq!((cache.as_str(), cost), ("hit-exact", 0));
    assert_eq!(key.unwrap().len(), 16);
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_near_duplicate_is_a_semantic_hit_but_not_across_teams() {
    let app = spawn_app().await;
    let (_, token) = app.token("bob", None).await;
    sluice::cli::team_create(app.db(), "other", None, chrono::Utc::now())
        .await
        .unwrap();
    let args = sluice::cli::UserArgs {
        username: "carol",
        team: Some("other"),
        rpm: None,
        tpm: None,
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(app.db(), &args, chrono::Utc::now())
        .await
        .unwrap();
    let (_, other_team) = app.token("carol", None).await;
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    settle().await;
    let (kind, _) = ask(&app, &token, &question("WVWZZZ9KZYW123456")).await;
    assert_eq!(kind, "hit-semantic", "the same question about another VIN");
    let (kind, _) = ask(&app, &other_team, &question("WVWZZZ1JZXW000001")).await;
    assert_eq!(kind, "miss", "another team never sees this team's entries");
    let mut different = question("WVWZZZ1JZXW000001");
    different["messages"][1]["content"] =
        json!("Why does the oil pressure light blink on WVWZZZ1JZXW000001 after a cold start?");
    let (kind, _) = ask(&app, &token, &different).await;
    assert_eq!(kind, "miss", "a different question sharing most words");
    assert_eq!(app.mock.state.stats(KEY_A).count, 3);
}

#[tokio::test]
async fn a_different_tool_result_never_hits() {
    let app = spawn_app().await;
    let (_, token) = app.token("dan", None).await;
    let with_result = |result: &str| {
        json!({"model": "gpt-4o-mini", "temperature": 0, "messages": [
            {"role": "user", "content": "Which car is this?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup_vin", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]})
    };
    ask(&app, &token, &with_result("Golf 2019")).await;
    settle().await;
    assert_eq!(
        ask(&app, &token, &with_result("Golf 2019")).await.0,
        "hit-exact"
    );
    assert_eq!(
        ask(&app, &token, &with_result("Passat 2021")).await.0,
        "miss"
    );
}

#[tokio::test]
async fn streams_replay_from_whole_answers_and_whole_answers_come_from_streams() {
    let app = spawn_app_with(|s, m| {
        let mut c = upstream("c", KEY_B, m);
        c.provider = Provider::Anthropic;
        c.base_url = m.base_url();
        s.upstreams.push(c);
        s.models.push(model("claude", &["c"]));
        s.models[2].routes = vec![RouteSettings {
            upstream: "c".into(),
            model: "claude-upstream".into(),
            output_cap_param: None,
        }];
    })
    .await;
    let (_, token) = app.token("eve", None).await;
    let text = sluice::mock::MockConfig::default().text;

    // OpenAI: a non-streamed entry answers a stream.
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    settle().await;
    let mut streamed = question("WVWZZZ1JZXW000001");
    streamed["stream"] = json!(true);
    let resp = app.chat(&token, &streamed).await;
    assert_eq!(resp.headers().get("x-sluice-cache").unwrap(), "hit-exact");
    let (data, _) = sse_data(resp).await;
    assert_eq!(reassemble(&data), text);
    assert_eq!(data.last().unwrap(), "[DONE]");

    // Anthropic: a streamed entry answers a whole request.
    let messages = |stream: bool| {
        json!({"model": "claude", "max_tokens": 100, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "What does fault code P0401 mean?"}]})
    };
    let resp = app.post("/v1/messages", &token, &messages(true)).await;
    assert_eq!(resp.headers().get("x-sluice-cache").unwrap(), "miss");
    let _ = resp.text().await;
    settle().await;
    let resp = app.post("/v1/messages", &token, &messages(false)).await;
    assert_eq!(resp.headers().get("x-sluice-cache").unwrap(), "hit-exact");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], text);
    let resp = app.post("/v1/messages", &token, &messages(true)).await;
    let body = resp.text().await.unwrap();
    assert!(body.starts_with("event: message_start"));
    assert!(body
        .trim_end()
        .ends_with("data: {\"type\":\"message_stop\"}"));
    assert_eq!(app.mock.state.stats(KEY_B).count, 1);
}

#[tokio::test]
async fn ttl_tags_and_the_cache_headers() {
    let app = spawn_app().await;
    let (_, token) = app.token("fay", None).await;
    let send = |body: Value, headers: Vec<(&'static str, &'static str)>| {
        let mut req = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .json(&body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.send()
    };
    let cache = |r: &reqwest::Response| {
        r.headers()
            .get("x-sluice-cache")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };

    let r = send(
        question("WVWZZZ1JZXW000001"),
        vec![("x-sluice-cache-ttl", "1")],
    )
    .await
    .unwrap();
    assert_eq!(cache(&r), "miss");
    settle().await;
    assert_eq!(
        cache(&send(question("WVWZZZ1JZXW000001"), vec![]).await.unwrap()),
        "hit-exact"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        cache(&send(question("WVWZZZ1JZXW000001"), vec![]).await.unwrap()),
        "miss",
        "expired after its TTL"
    );

    let mut tagged = question("WVWZZZ1JZXW000777");
    tagged["messages"][1]["content"] =
        json!("Case 123: the tailgate will not open on WVWZZZ1JZXW000777.");
    assert_eq!(
        cache(
            &send(
                tagged.clone(),
                vec![("x-sluice-cache-tags", "case:123, batch:9")]
            )
            .await
            .unwrap()
        ),
        "miss"
    );
    settle().await;
    assert_eq!(
        cache(&send(tagged.clone(), vec![]).await.unwrap()),
        "hit-exact"
    );
    assert_eq!(app.state.cache.invalidate_tag("case:123").await.unwrap(), 1);
    assert_eq!(
        cache(&send(tagged.clone(), vec![]).await.unwrap()),
        "miss",
        "invalidated by tag"
    );
    settle().await;
    assert_eq!(
        cache(
            &send(tagged.clone(), vec![("x-sluice-cache", "off")])
                .await
                .unwrap()
        ),
        "off"
    );
    assert_eq!(
        cache(
            &send(tagged.clone(), vec![("x-sluice-cache", "refresh")])
                .await
                .unwrap()
        ),
        "miss"
    );
    let mut warm = tagged.clone();
    warm["temperature"] = json!(0.7);
    assert_eq!(
        cache(&send(warm.clone(), vec![]).await.unwrap()),
        "off",
        "deterministic mode caches temperature 0 only"
    );
    assert_eq!(
        cache(&send(warm, vec![("x-sluice-cache", "on")]).await.unwrap()),
        "miss"
    );
    let bad = send(tagged, vec![("x-sluice-cache", "maybe")])
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn a_hit_is_served_even_when_the_budget_is_spent() {
    let app = spawn_app().await;
    let (id, token) = app.token("gus", Some("0.000200")).await;
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    settle().await;
    sluice::cli::token_budget(
        app.db(),
        id,
        sluice::cli::BudgetChange::Limit(Some(20)),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        app.chat(&token, &question("WVWZZZ1JZXW999999"))
            .await
            .headers()
            .get("x-sluice-cache")
            .unwrap(),
        "hit-semantic"
    );
    let mut other = question("WVWZZZ1JZXW000001");
    other["messages"][1]["content"] = json!("Completely different question about brakes");
    assert_eq!(
        app.chat(&token, &other).await.status(),
        429,
        "a miss needs budget"
    );
}

#[tokio::test]
async fn a_batch_fault_is_answered_from_the_cache() {
    let app = spawn_app().await;
    let (_, token) = app.token("hal", None).await;
    let mut hits = 0;
    for i in 0..30 {
        let vin = format!("WVWZZZ1JZXW{:06}", 100_000 + i * 7919);
        let (kind, _) = ask(&app, &token, &question(&vin)).await;
        hits += usize::from(kind.starts_with("hit"));
        if i == 0 {
            settle().await;
        }
    }
    assert!(hits >= 28, "{hits} of 30 served from the cache");
    assert!(app.mock.state.stats(KEY_A).count <= 2);
}

#[tokio::test]
async fn the_http_embedder_works_against_an_embeddings_endpoint() {
    let app = spawn_app_with(|s, m| {
        s.cache.embedder = "http".into();
        s.cache.http_url = format!("{}/v1", m.base_url());
        s.cache.http_model = "text-embedding-3-small".into();
    })
    .await;
    let (_, token) = app.token("ian", None).await;
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    settle().await;
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ9KZYW123456")).await.0,
        "hit-semantic"
    );
    assert!(app
        .mock
        .state
        .stats("")
        .last_paths
        .iter()
        .any(|p| p == "/v1/embeddings"));
}

/// Precision and recall of the embedders on `tests/fixtures/cache/pairs.json` at the default
/// threshold. A false hit is a wrong answer to a user: precision must stay ≥ 0.99.
#[tokio::test]
async fn embedder_precision_on_the_evaluation_set() {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cache/pairs.json"
    ))
    .unwrap();
    let pairs: Vec<Value> = serde_json::from_str(&raw).unwrap();
    assert!(pairs.len() >= 200);
    let threshold = sluice::config::CacheSettings::default().similarity_threshold as f32;
    let (mut tp, mut fp, mut fn_, mut tn) = (0, 0, 0, 0);
    let mut by_kind = std::collections::BTreeMap::<String, (u32, u32)>::new();
    for p in &pairs {
        let sim = embed::cosine(
            &embed::lexical(p["a"].as_str().unwrap()),
            &embed::lexical(p["b"].as_str().unwrap()),
        );
        let hit = sim >= threshold;
        let same = p["same"].as_bool().unwrap();
        match (hit, same) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fn_ += 1,
            (false, false) => tn += 1,
        }
        let k = by_kind
            .entry(p["kind"].as_str().unwrap().to_string())
            .or_default();
        k.0 += u32::from(hit);
        k.1 += 1;
    }
    let precision = f64::from(tp) / f64::from((tp + fp).max(1));
    let recall = f64::from(tp) / f64::from((tp + fn_).max(1));
    println!("lexical @ {threshold}: precision {precision:.3}, recall {recall:.3} (tp {tp}, fp {fp}, fn {fn_}, tn {tn}); hits by kind {by_kind:?}");
    assert!(precision >= 0.99, "precision {precision:.3}");
    assert_eq!(
        by_kind["identifiers"].0, by_kind["identifiers"].1,
        "identifier-only differences always hit"
    );
}

#[tokio::test]
async fn admins_invalidate_by_tag_through_the_api_and_finance_cannot() {
    use crate::admin_helpers::{login, make_login};
    let app = spawn_app().await;
    let (_, token) = app.token("jo", None).await;
    let tagged = |body: Value| {
        app.http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("x-sluice-cache-tags", "case:77")
            .json(&body)
            .send()
    };
    tagged(question("WVWZZZ1JZXW000001")).await.unwrap();
    settle().await;
    make_login(&app, "root", "admin", None).await;
    make_login(&app, "fin", "finance", None).await;
    let (status, _) = login(&app, "fin")
        .await
        .post("/admin/api/v1/cache/invalidate", &json!({"tag": "case:77"}))
        .await;
    assert_eq!(status, 403);
    let (status, v) = login(&app, "root")
        .await
        .post("/admin/api/v1/cache/invalidate", &json!({"tag": "case:77"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["deleted"], 1);
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ1JZXW000001")).await.0,
        "miss"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'cache.invalidate'")
            .await,
        1
    );
}

/// A miss is answered from memory (the keys present), so entries another replica stored
/// must reach this replica's memory: they do at its next refresh (every second).
#[tokio::test]
async fn entries_another_replica_stored_are_found_after_its_next_refresh() {
    use sluice::cache::Cache;
    use sluice::config::{CacheSettings, UpstreamTimeouts};
    use sluice::error::WireFormat;
    use sluice::store::writer::Writer;

    let dir = tempfile::tempdir().unwrap();
    let db = sluice::store::Db::open(&dir.path().join("shared.db"), false)
        .await
        .unwrap();
    let replica = || {
        Cache::new(
            &CacheSettings::default(),
            &UpstreamTimeouts::default(),
            db.read.clone(),
            db.write.clone(),
            Writer::start(db.write.clone()),
        )
        .unwrap()
    };
    let (a, b) = (replica(), replica());
    let now = chrono::Utc::now();
    a.refresh(now).await.unwrap();
    b.refresh(now).await.unwrap();
    let body = question("WVWZZZ1JZXW000042");
    let headers = actix_web::http::header::HeaderMap::new();
    let plan = |c: &Cache| {
        c.plan(
            &headers,
            body.as_object().unwrap(),
            WireFormat::OpenAi,
            "gpt-4o-mini",
            (1, 1),
            None,
            None,
        )
        .unwrap()
        .expect("cacheable")
    };
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Check the EGR valve."}, "finish_reason": "stop"}]});
    a.put(&plan(&a), &answer, (12, 24), now).await;
    assert!(
        a.get(&plan(&a), now).await.is_some(),
        "the writer finds its own entry"
    );
    assert!(
        b.get(&plan(&b), now).await.is_none(),
        "before its refresh the other replica answers the miss from memory"
    );
    a.flush().await;
    b.refresh(now).await.unwrap();
    let hit = b
        .get(&plan(&b), now)
        .await
        .expect("found after the refresh");
    assert_eq!(hit.entry.answer, answer);
}

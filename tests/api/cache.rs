//! The response cache (layer 1): exact and semantic hits, scopes, tools, replay of streams
//! in both formats, TTLs, tags, the http embedder (precision: `cache_precision.rs`).

use serde_json::{json, Value};
use sluice::config::{Provider, RouteSettings};

use crate::helpers::*;

fn question(vin: &str) -> Value {
    json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
           "messages": [{"role": "system", "content": "You diagnose cars."},
                        {"role": "user", "content": format!("Why does the engine warning light blink on {vin} after a cold start?")}]})
}

/// The same question as `question(vin)`, reworded: filler, case and punctuation.
fn reworded(vin: &str) -> Value {
    let mut q = question(vin);
    q["messages"][1]["content"] = json!(format!(
        "Hi, why does the engine warning light blink on {vin} after a cold start, please? Thanks"
    ));
    q
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

#[tokio::test]
async fn an_exact_repeat_is_a_free_hit_and_logged_as_one() {
    let app = spawn_app().await;
    let (id, token) = app.token("alice", Some("1")).await;
    let (first, answer) = ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    assert_eq!(first, "miss");
    app.wait_for_cache_entries(1).await;
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
    // Request ids are UUIDv7, ordered by time: the last one is the hit.
    let (cache, cost, key): (String, i64, Option<String>) = sql_row(
        app.db(),
        "SELECT cache, cost_micros, cache_key FROM requests ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .await;
    assert_eq!((cache.as_str(), cost), ("hit-exact", 0));
    assert_eq!(key.unwrap().len(), 16);
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_near_duplicate_is_a_semantic_hit_but_not_across_teams() {
    let app = spawn_app().await;
    let (_, token) = app.token("bob", None).await;
    let other_team = app
        .token_in_team("other", None, issue_args("carol"), None)
        .await
        .text;
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    app.wait_for_cache_entries(1).await;
    let (kind, _) = ask(&app, &token, &reworded("WVWZZZ1JZXW000001")).await;
    assert_eq!(kind, "hit-semantic", "the same question reworded");
    let (kind, _) = ask(&app, &token, &reworded("WVWZZZ9KZYW123456")).await;
    assert_eq!(
        kind, "miss",
        "the same question about another VIN is another question"
    );
    let (kind, _) = ask(&app, &other_team, &reworded("WVWZZZ1JZXW000001")).await;
    assert_eq!(kind, "miss", "another team never sees this team's entries");
    let mut different = question("WVWZZZ1JZXW000001");
    different["messages"][1]["content"] =
        json!("Why does the oil pressure light blink on WVWZZZ1JZXW000001 after a cold start?");
    let (kind, _) = ask(&app, &token, &different).await;
    assert_eq!(kind, "miss", "a different question sharing most words");
    assert_eq!(app.mock.state.stats(KEY_A).count, 4);
}

/// A refresh stores its answer without a lookup. The question of a request is read only
/// past the memory (an exact repeat held there never needs it), and for every miss at the
/// cache stage's end: the entry a refresh stored is a semantic candidate as a miss's is.
#[tokio::test]
async fn an_answer_a_refresh_stored_is_a_semantic_candidate() {
    let app = spawn_app().await;
    let (_, token) = app.token("bea", None).await;
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-cache", "refresh")
        .json(&question("WVWZZZ1JZXW000001"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-sluice-cache"], "miss");
    app.wait_for_cache_entries(1).await;
    let (kind, _) = ask(&app, &token, &reworded("WVWZZZ1JZXW000001")).await;
    assert_eq!(kind, "hit-semantic", "the refreshed question reworded");
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
}

/// Issue 15 (attack on the agreement check), over HTTP: in one conversation, questions that
/// differ only in a pronoun, a modal verb, a greeting used as a word or a currency sign
/// are other questions. Each was a `hit-semantic` before pronouns, modal verbs and
/// in-sentence greetings were read as words and every symbol as a token; the reworded
/// control still hits.
#[tokio::test]
async fn words_the_filler_list_used_to_drop_tell_questions_apart() {
    let app = spawn_app().await;
    let (_, token) = app.token("dora", None).await;
    let turn = |last: &str| {
        json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 50, "messages": [
            {"role": "user", "content": "I said the meeting moves to Friday."},
            {"role": "assistant", "content": "Noted: Friday."},
            {"role": "user", "content": last}]})
    };
    let pairs = [
        ("What did I say?", "What did you say?"),
        ("Can we move it?", "Do we move it?"),
        (
            "How do you say thank you in Japanese?",
            "How do you say hello in Japanese?",
        ),
        ("Convert ₹500 to USD.", "Convert ₽500 to USD."),
    ];
    for (n, (stored, asked)) in pairs.into_iter().enumerate() {
        assert_eq!(ask(&app, &token, &turn(stored)).await.0, "miss", "{stored}");
        app.wait_for_cache_entries(n as i64 + 1).await;
        assert_eq!(
            ask(&app, &token, &turn(asked)).await.0,
            "miss",
            "{asked} ~ {stored}"
        );
    }
    let (kind, _) = ask(&app, &token, &turn("Hi! what did I say? Thanks")).await;
    assert_eq!(
        kind, "hit-semantic",
        "the control: the first question reworded"
    );
    assert_eq!(app.mock.state.stats(KEY_A).count, 8);
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
    app.wait_for_cache_entries(1).await;
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
            deployment: None,
            tier_model: None,
        }];
    })
    .await;
    let (_, token) = app.token("eve", None).await;
    let text = sluice::mock::MockConfig::default().text;

    // OpenAI: a non-streamed entry answers a stream.
    ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    app.wait_for_cache_entries(1).await;
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
    app.wait_for_cache_entries(2).await;
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
    let clock = std::sync::Arc::new(sluice::clock::ManualClock::new(chrono::Utc::now()));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone())).await;
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
    app.wait_for_cache_entries(1).await;
    assert_eq!(
        cache(&send(question("WVWZZZ1JZXW000001"), vec![]).await.unwrap()),
        "hit-exact"
    );
    clock.advance(chrono::Duration::seconds(2));
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
    app.wait_for_cache_entries(2).await;
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
    app.wait_for_cache_entries(2).await;
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
    app.wait_for_cache_entries(1).await;
    sluice::cli::token_budget(
        app.db(),
        id,
        sluice::cli::BudgetChange::Limit(Some(20)),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let hit = app.chat(&token, &reworded("WVWZZZ1JZXW000001")).await;
    assert_eq!(hit.status(), 200);
    assert_eq!(hit.headers()["x-sluice-cache"], "hit-semantic");
    let left = app
        .scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(
        hit.headers()["x-sluice-budget-remaining-usd"],
        sluice::quota::pricing::usd(left).as_str(),
        "the hit reports the budget as it stands"
    );
    let mut other = question("WVWZZZ1JZXW000001");
    other["messages"][1]["content"] = json!("Completely different question about brakes");
    assert_eq!(
        app.chat(&token, &other).await.status(),
        429,
        "a miss needs budget"
    );
}

/// Diagnosis reports that differ only in the VIN: one answer serves the batch — when the
/// model opts in to identifier-blind matching (`cache_ignore_identifiers`).
#[tokio::test]
async fn a_batch_fault_is_answered_from_the_cache_when_the_model_ignores_identifiers() {
    let app = spawn_app_with(|s, _| s.models[0].cache_ignore_identifiers = Some(true)).await;
    let (_, token) = app.token("hal", None).await;
    let mut hits = 0;
    for i in 0..30 {
        let vin = format!("WVWZZZ1JZXW{:06}", 100_000 + i * 7919);
        let (kind, _) = ask(&app, &token, &question(&vin)).await;
        hits += usize::from(kind.starts_with("hit"));
        if i == 0 {
            app.wait_for_cache_entries(1).await;
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
        // The mock listens on loopback: a local embedding server opts in like upstreams.
        s.cache.http_allow_private_network = true;
        s.cache.http_model = "text-embedding-3-small".into();
    })
    .await;
    let (_, token) = app.token("ian", None).await;
    let report = |cylinder: u32| {
        let mut q = question("WVWZZZ1JZXW000001");
        q["messages"][1]["content"] = json!(format!(
            "Workshop report for the blue estate car: intermittent misfire on cylinder {cylinder} at idle after a cold start, fuel trims normal, no stored codes, spark plugs replaced last month. What should we check first?"
        ));
        q
    };
    ask(&app, &token, &report(3)).await;
    app.wait_for_cache_entries(1).await;
    let mut again = report(3);
    again["messages"][1]["content"] = json!(again["messages"][1]["content"]
        .as_str()
        .unwrap()
        .replace("What should we check first?", "what should we check first"));
    assert_eq!(ask(&app, &token, &again).await.0, "hit-semantic");
    // The mock's embeddings call the two reports near-identical; the agreement check
    // still tells cylinder 3 from cylinder 4.
    let text = |q: &Value| q["messages"][1]["content"].as_str().unwrap().to_string();
    let similarity = sluice::cache::embed::cosine(
        &sluice::cache::embed::lexical(&text(&report(3))),
        &sluice::cache::embed::lexical(&text(&report(4))),
    );
    assert!(similarity >= 0.95, "{similarity}");
    assert_eq!(ask(&app, &token, &report(4)).await.0, "miss");
    assert!(app
        .mock
        .state
        .stats("")
        .last_paths
        .iter()
        .any(|p| p == "/v1/embeddings"));
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
    app.wait_for_cache_entries(1).await;
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

/// An answer whose request was in flight when an admin invalidated its tag is not served
/// after the invalidation: the upstream answered from what the tag said was gone (s46
/// stop attack F4: the store behind the invalidation landed after it and was served for its
/// TTL). A request sent after the invalidation is stored as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_flight_during_an_invalidation_is_not_served_after_it() {
    use crate::admin_helpers::{login, make_login};
    let app = spawn_app().await;
    let (_, token) = app.token("jo", None).await;
    make_login(&app, "root", "admin", None).await;
    let tagged = |body: Value| {
        app.http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("x-sluice-cache-tags", "case:79")
            .json(&body)
            .send()
    };
    app.mock.state.sticky(
        KEY_A,
        Some(sluice::mock::Script {
            delay_ms: 1_000,
            ..sluice::mock::Script::default()
        }),
    );
    let dropped = || counted(&app, "gateway_cache_stores_dropped_total", "invalidated");
    let dropped_before = dropped().await;
    let in_flight = tagged(question("WVWZZZ1JZXW000079"));
    let invalidate = async {
        let waited = std::time::Instant::now();
        while app.mock.state.stats(KEY_A).count == 0 {
            assert!(waited.elapsed().as_secs() < 10, "the upstream never had it");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        login(&app, "root")
            .await
            .post("/admin/api/v1/cache/invalidate", &json!({"tag": "case:79"}))
            .await
    };
    let (answered, (status, v)) = tokio::join!(in_flight, invalidate);
    assert_eq!((status, v["deleted"].as_i64()), (200, Some(0)), "{v}");
    assert_eq!(answered.unwrap().status(), 200);
    app.mock.state.sticky(KEY_A, None);
    // Stores are made one after another: once the next one's row is in, the first store
    // was made or refused.
    tagged(question("WVWZZZ1JZXW000080")).await.unwrap();
    app.wait_for_cache_entries(1).await;
    assert_eq!(app.scalar("SELECT COUNT(*) FROM cache_entries").await, 1);
    assert!(
        dropped().await > dropped_before,
        "the store dropped is not counted"
    );
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ1JZXW000079")).await.0,
        "miss"
    );
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ1JZXW000080")).await.0,
        "hit-exact"
    );
}

/// An invalidation whose audit row fails deletes nothing: the entries go inside the audited
/// transaction (before, they were deleted first and stayed deleted, unaudited).
#[tokio::test]
async fn an_invalidation_whose_audit_row_fails_deletes_nothing() {
    use crate::admin_helpers::{login, make_login};
    let app = spawn_app().await;
    let (_, token) = app.token("jo", None).await;
    app.http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-cache-tags", "case:78")
        .json(&question("WVWZZZ1JZXW000078"))
        .send()
        .await
        .unwrap();
    app.wait_for_cache_entries(1).await;
    make_login(&app, "root", "admin", None).await;
    crate::audit_tamper::refuse_audit_of(&app.settings, "cache.invalidate").await;
    let (status, v) = login(&app, "root")
        .await
        .post("/admin/api/v1/cache/invalidate", &json!({"tag": "case:78"}))
        .await;
    assert_eq!(status, 500, "{v}");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM cache_entries").await,
        1,
        "entries deleted without their audit row"
    );
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ1JZXW000078")).await.0,
        "hit-exact"
    );
}

/// A database of the suite's engine (a SQLite file in `dir`, or a PostgreSQL database).
/// A SQLite database in `dir`, for the tests that write its rows by hand.
async fn sqlite_db(dir: &tempfile::TempDir) -> sluice::store::Db {
    sluice::store::Db::open(&dir.path().join("cache.db"), false)
        .await
        .unwrap()
}

async fn suite_db(dir: &tempfile::TempDir) -> sluice::store::Db {
    use crate::pg_gateway_app::{shared_key, Engine};
    match test_engine() {
        Engine::Sqlite => sluice::store::Db::open(&dir.path().join("shared.db"), false).await,
        Engine::Postgres => {
            sluice::store::Db::open_postgres(&crate::pg_server::database(), &shared_key()).await
        }
    }
    .unwrap()
}

/// A cache of default settings over `db` with a writer of its own, as each replica has.
/// A whole chat completion, as the cache's direct tests store it.
fn egr_answer() -> Value {
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Check the EGR valve."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}})
}

pub(crate) fn cache_on(db: &sluice::store::Db) -> std::sync::Arc<sluice::cache::Cache> {
    sluice::cache::Cache::new(
        &sluice::config::CacheSettings::default(),
        &sluice::config::UpstreamTimeouts::default(),
        db.clone(),
        sluice::store::writer::Writer::start(db),
    )
    .unwrap()
}

/// The cache's plan for an OpenAI chat `body` to gpt-4o-mini (team 1, user 1, no header
/// and no per-model settings but `ignore_identifiers`), its question read; it must be
/// cacheable.
pub(crate) fn plan_of(
    cache: &sluice::cache::Cache,
    body: &Value,
    ignore_identifiers: Option<bool>,
) -> sluice::cache::Plan {
    let plan = cache
        .plan(
            &sluice::cache::Asked::default(),
            body.as_object().unwrap(),
            sluice::error::WireFormat::OpenAi,
            "gpt-4o-mini",
            (1, 1),
            None,
            None,
            ignore_identifiers,
        )
        .unwrap()
        .expect("cacheable");
    // As the pipeline does past the memory and before a store.
    cache.read_question(&plan, body.as_object().unwrap());
    plan
}

/// A rebuild reads the entries back a page at a time, and every page is kept: the
/// semantic candidates of entries past the first page are found (s24 attack on the day's
/// fixes, F2: the whole table's vectors were read in one query).
#[tokio::test]
async fn a_rebuild_reads_every_page_of_entries() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir).await;
    let (a, b) = (cache_on(&db), cache_on(&db));
    let now = chrono::Utc::now();
    let answer = egr_answer();
    let vin = |i: usize| format!("WVWZZZ1JZXW{i:06}");
    for i in 0..1_050 {
        a.put(
            &plan_of(&a, &question(&vin(i)), None),
            &answer,
            (12, 24),
            now,
        )
        .await;
    }
    a.flush().await;
    b.rebuild(now).await.unwrap();
    let last = reworded(&vin(1_049));
    let hit = b
        .get(&plan_of(&b, &last, None), now, no_deadline())
        .await
        .expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        answer
    );
}

/// An eviction forgets what it deleted, without reading the table back: an entry deleted
/// past `max_entries` is no longer served from memory — the LRU served it until its expiry
/// — and the entry kept is still found, exactly and by meaning. (s27 cache F6: every
/// eviction that deleted a row rebuilt the indexes from the whole table, every minute.)
#[tokio::test]
async fn an_eviction_forgets_what_it_deleted_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = suite_db(&dir).await;
    let cache = sluice::cache::Cache::new(
        &sluice::config::CacheSettings {
            max_entries: 1,
            ..Default::default()
        },
        &sluice::config::UpstreamTimeouts::default(),
        db.clone(),
        sluice::store::writer::Writer::start(&db),
    )
    .unwrap();
    let now = chrono::Utc::now();
    let answer = |text: &str| {
        json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}})
    };
    let (old, kept) = ("WVWZZZ1JZXW000001", "WVWZZZ1JZXW000002");
    let plan = |vin: &str| plan_of(&cache, &question(vin), None);
    let near = |vin: &str| plan_of(&cache, &reworded(vin), None);
    cache
        .put(
            &plan(old),
            &answer("Check the EGR valve."),
            (12, 24),
            now - chrono::Duration::seconds(5),
        )
        .await;
    cache
        .put(
            &plan(kept),
            &answer("Replace the EGR valve."),
            (12, 24),
            now,
        )
        .await;
    cache.flush().await;
    assert!(cache.get(&plan(old), now, no_deadline()).await.is_some());
    assert_eq!(cache.evict(now).await.unwrap(), 1, "the older one goes");
    assert!(
        cache.get(&plan(old), now, no_deadline()).await.is_none(),
        "the deleted entry is not served from memory"
    );
    assert!(cache.get(&near(old), now, no_deadline()).await.is_none());
    for p in [plan(kept), near(kept)] {
        let hit = cache.get(&p, now, no_deadline()).await.expect("kept");
        assert_eq!(
            serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
            answer("Replace the EGR valve.")
        );
    }
}

/// Vectors of two embedding models are never compared: the `http` embedder's model is part
/// of the semantic context, so after `http_model` changes the entries the old model
/// embedded are exact matches only until they expire. Before, a restart with another model
/// read the old vectors back and compared them by cosine with the new model's — numbers of
/// two spaces, whose similarity says nothing (s27 cache attack F5, its last mend).
#[tokio::test]
async fn entries_another_embedding_model_embedded_are_no_semantic_candidates() {
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .expect("mock");
    let dir = tempfile::tempdir().unwrap();
    let db = suite_db(&dir).await;
    let with_model = |model: &str| {
        sluice::cache::Cache::new(
            &sluice::config::CacheSettings {
                embedder: "http".into(),
                http_url: format!("{}/v1", mock.base_url()),
                http_allow_private_network: true,
                http_model: model.into(),
                ..Default::default()
            },
            &sluice::config::UpstreamTimeouts::default(),
            db.clone(),
            sluice::store::writer::Writer::start(&db),
        )
        .unwrap()
    };
    let now = chrono::Utc::now();
    let answer = egr_answer();
    // As `the_http_embedder_works_against_an_embeddings_endpoint`: the mock embeds the two
    // texts near-identically.
    let report = "Workshop report for the blue estate car: intermittent misfire on cylinder 3 at idle after a cold start, fuel trims normal, no stored codes, spark plugs replaced last month. What should we check first?";
    let asked = |text: &str| {
        let mut q = question("WVWZZZ1JZXW000001");
        q["messages"][1]["content"] = json!(text);
        q
    };
    let first = with_model("text-embedding-3-small");
    first
        .put(
            &plan_of(&first, &asked(report), None),
            &answer,
            (12, 24),
            now,
        )
        .await;
    first.flush().await;
    let same = with_model("text-embedding-3-small");
    same.rebuild(now).await.unwrap();
    let near = |c: &sluice::cache::Cache| {
        let text = report.replace("What should we check first?", "what should we check first");
        plan_of(c, &asked(&text), None)
    };
    assert!(
        same.get(&near(&same), now, no_deadline()).await.is_some(),
        "the same model finds it by meaning"
    );
    let other = with_model("text-embedding-3-large");
    other.rebuild(now).await.unwrap();
    assert!(
        other.get(&near(&other), now, no_deadline()).await.is_none(),
        "another model's vectors are not compared"
    );
    let exact = other
        .get(&plan_of(&other, &asked(report), None), now, no_deadline())
        .await;
    assert!(exact.is_some(), "the exact match stays");
}

/// A miss is answered from memory (the keys present), so entries another replica stored
/// must reach this replica's memory: they do at its next refresh (every second). The
/// replicas share the suite's engine (a SQLite file, or a PostgreSQL database).
#[tokio::test]
async fn entries_another_replica_stored_are_found_after_its_next_refresh() {
    use sluice::cache::Cache;

    let dir = tempfile::tempdir().unwrap();
    let (a, b, now) = two_replicas(&dir).await;
    let body = question("WVWZZZ1JZXW000042");
    let plan = |c: &Cache| plan_of(c, &body, None);
    let answer = egr_answer();
    a.put(&plan(&a), &answer, (12, 24), now).await;
    assert!(
        a.get(&plan(&a), now, no_deadline()).await.is_some(),
        "the writer finds its own entry"
    );
    assert!(
        b.get(&plan(&b), now, no_deadline()).await.is_none(),
        "before its refresh the other replica answers the miss from memory"
    );
    a.flush().await;
    b.refresh(now).await.unwrap();
    let hit = b
        .get(&plan(&b), now, no_deadline())
        .await
        .expect("found after the refresh");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        answer
    );
    // An answer stored again under the same key (`x-sluice-cache: refresh` on the other
    // replica) replaces the one this replica holds in memory at its next refresh: it
    // served the old one until its expiry (s24 attack, cache #6).
    let mut again = answer.clone();
    again["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    a.put(&plan(&a), &again, (12, 24), now).await;
    a.flush().await;
    b.refresh(now).await.unwrap();
    let hit = b
        .get(&plan(&b), now, no_deadline())
        .await
        .expect("still a hit");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        again
    );
}

/// An answer planned before another replica's invalidation is not written to the shared
/// table: this replica learns of the invalidation only at its next refresh, so the row
/// names the epoch it was planned under and the table refuses it (s46 stop attack F4) — on
/// PostgreSQL too, where the check runs under the cache's write lock.
#[tokio::test]
async fn an_answer_planned_before_another_replicas_invalidation_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, now) = two_replicas(&dir).await;
    let body = question("WVWZZZ1JZXW000043");
    let planned = plan_of(&a, &body, None);
    assert_eq!(b.invalidate_tag("case:43").await.unwrap(), 0);
    let refused = sluice::store::cache::refused_so_far();
    a.put(&planned, &egr_answer(), (12, 24), now).await;
    a.flush().await;
    assert!(
        sluice::store::cache::refused_so_far() > refused,
        "the refusal is not counted"
    );
    assert!(!found_after_refresh(&b, &body, now).await);
    assert!(!found_after_refresh(&a, &body, now).await);
    // Planned after the refresh, it is written and found by the other replica.
    a.put(&plan_of(&a, &body, None), &egr_answer(), (12, 24), now)
        .await;
    a.flush().await;
    assert!(found_after_refresh(&b, &body, now).await);
}

/// Two replicas' caches over one database of the suite's engine (a file in `dir` on SQLite),
/// each refreshed as at its start.
async fn two_replicas(
    dir: &tempfile::TempDir,
) -> (
    std::sync::Arc<sluice::cache::Cache>,
    std::sync::Arc<sluice::cache::Cache>,
    chrono::DateTime<chrono::Utc>,
) {
    let db = suite_db(dir).await;
    let (a, b) = (cache_on(&db), cache_on(&db));
    let now = chrono::Utc::now();
    a.refresh(now).await.unwrap();
    b.refresh(now).await.unwrap();
    (a, b, now)
}

/// Whether `cache`, refreshed, finds an answer to `body`.
async fn found_after_refresh(
    cache: &sluice::cache::Cache,
    body: &Value,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    cache.refresh(now).await.unwrap();
    cache
        .get(&plan_of(cache, body, None), now, no_deadline())
        .await
        .is_some()
}

/// A row the table refuses is counted on `/metrics` (`reason="refused"`): another replica,
/// not yet told of an invalidation, stores an answer planned before it.
#[tokio::test]
async fn a_row_the_table_refuses_is_counted_on_metrics() {
    let app = spawn_app().await;
    let other = cache_on(&app.state.db);
    let now = chrono::Utc::now();
    other.refresh(now).await.unwrap();
    let planned = plan_of(&other, &question("WVWZZZ1JZXW000045"), None);
    app.state.cache.invalidate_tag("case:45").await.unwrap();
    let before = sluice::store::cache::refused_so_far();
    other.put(&planned, &egr_answer(), (12, 24), now).await;
    other.flush().await;
    assert!(
        counted(&app, "gateway_cache_stores_dropped_total", "refused").await > before,
        "the refusal is not shown"
    );
}

/// A store off the request's path — the cache's own thread, a runtime with no I/O of its
/// own — lands in the table on either engine (s47 stop attack F6: only SQLite ran it).
#[tokio::test]
async fn a_store_off_the_path_lands_in_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, now) = two_replicas(&dir).await;
    let body = question("WVWZZZ1JZXW000046");
    a.store(plan_of(&a, &body, None), egr_answer(), (12, 24), now);
    let waited = std::time::Instant::now();
    while !found_after_refresh(&b, &body, now).await {
        assert!(waited.elapsed().as_secs() < 10, "the store never landed");
        a.flush().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The table's refusal holds against an invalidation still in its transaction: a batch of
/// entries waits for it (on PostgreSQL the cache's write lock, which both take; on SQLite
/// the write lock) and then reads its epoch. Written between the deletion and its commit,
/// the row outlived the invalidation (s47 attack F4).
#[tokio::test]
async fn a_batch_written_during_an_invalidations_transaction_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = suite_db(&dir).await;
    let a = cache_on(&db);
    let now = chrono::Utc::now();
    a.refresh(now).await.unwrap();
    let body = question("WVWZZZ1JZXW000044");
    let planned = plan_of(&a, &body, None);
    let mut tx = db.begin().await.unwrap();
    sluice::store::cache::delete_tag_in(&mut tx, "case:44")
        .await
        .unwrap();
    let writer = {
        let a = a.clone();
        tokio::spawn(async move {
            a.put(&planned, &egr_answer(), (12, 24), now).await;
            a.flush().await;
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished(),
        "the batch did not wait for the invalidation"
    );
    tx.commit().await.unwrap();
    writer.await.unwrap();
    let b = cache_on(&db);
    assert!(!found_after_refresh(&b, &body, now).await);
}

/// A semantic lookup waits for the `http` embedder no longer than the request's own
/// deadline: an embedding server that accepts and never answers held every request of a
/// context for the embedder's 5 s, whatever `x-sluice-request-deadline-ms` said.
#[tokio::test]
async fn a_hanging_embedder_is_waited_for_no_longer_than_the_requests_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let embedder = listener.local_addr().unwrap();
    // The first embedding is answered (it stores the first question's vector); every
    // later one is read and never answered.
    tokio::spawn(async move {
        let mut held = Vec::new();
        for n in 0.. {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            if n == 0 {
                let mut buf = vec![0u8; 65536];
                let _ = conn.read(&mut buf).await;
                let body = json!({"data": [{"embedding": [0.6, 0.8, 0.0]}]}).to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            } else {
                held.push(conn);
            }
        }
    });
    let app = spawn_app_with(move |s, _| {
        s.cache.embedder = "http".into();
        s.cache.http_url = format!("http://{embedder}/v1");
        s.cache.http_allow_private_network = true;
        s.cache.http_model = "text-embedding-3-small".into();
    })
    .await;
    let (_, token) = app.token("una", None).await;
    assert_eq!(
        ask(&app, &token, &question("WVWZZZ1JZXW000001")).await.0,
        "miss"
    );
    app.wait_for_cache_entries(1).await;
    let started = std::time::Instant::now();
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-request-deadline-ms", "400")
        .json(&reworded("WVWZZZ1JZXW000001"))
        .send()
        .await
        .unwrap();
    let waited = started.elapsed();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert!(
        waited < std::time::Duration::from_secs(2),
        "waited {waited:?} for an embedder past a 400 ms deadline ({status} {body})"
    );
}

/// A fallback model's answer is an outage's answer: stored under the asked model's key, it
/// was served as that model's for its TTL after the model recovered, logged as answered
/// by it (s27 cache attack F1). Here `gpt-4o-mini` fails (500), `backup` (with a lower output
/// cap, so its answer may be cut) answers; nothing is stored, and once the asked model is
/// healthy the same request, whole or streamed, reaches it.
#[tokio::test]
async fn a_fallback_models_answer_is_not_served_as_the_asked_model() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        let mut backup = model("backup", &["b"]);
        backup.max_output_tokens = 50;
        s.models.push(backup);
        s.models[0].fallbacks = vec!["backup".into()];
        // Every failure of `a` here is one request's: no breaker opens between them.
        s.breaker.failure_threshold = 1000;
    })
    .await;
    let (_, token) = app.token("outage", None).await;
    for (stored, stream) in [(0, false), (1, true)] {
        let mut q = question(if stream {
            "WVWZZZ1JZXW000002"
        } else {
            "WVWZZZ1JZXW000001"
        });
        if stream {
            q["stream"] = json!(true);
            q["stream_options"] = json!({"include_usage": true});
        }
        // A server error: no cooldown keeps the healed key out of the next request.
        let failing = sluice::mock::Script {
            status: Some(500),
            ..Default::default()
        };
        app.mock.state.sticky(KEY_A, Some(failing));
        let resp = app.chat(&token, &q).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-sluice-upstream"], "b", "stream: {stream}");
        let _ = resp.text().await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        app.state.cache.flush().await;
        assert_eq!(
            app.scalar("SELECT COUNT(*) FROM cache_entries").await,
            stored,
            "stream: {stream}: the fallback's answer is not stored"
        );

        app.mock.state.sticky(KEY_A, None);
        let asked = app.mock.state.stats(KEY_A).count;
        let resp = app.chat(&token, &q).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-sluice-cache"], "miss", "stream: {stream}");
        assert_eq!(resp.headers()["x-sluice-upstream"], "a", "stream: {stream}");
        let _ = resp.text().await;
        assert_eq!(app.mock.state.stats(KEY_A).count, asked + 1);
        // The asked model's own answer is stored as ever.
        app.wait_for_cache_entries(stored + 1).await;
    }
    app.assert_invariant().await;
}

/// An `http` embedder's answer is read up to a bound and its vector held to
/// `embed::MAX_DIMENSIONS`: a lying or broken one answering millions of elements had every
/// lookup parse all of it and every store write it whole (s27 cache attack F5). The answer
/// is a miss, and the entry is stored without a vector.
#[tokio::test]
async fn a_huge_embedding_is_refused_and_costs_a_miss() {
    let app = spawn_app_with(|s, m| {
        s.cache.embedder = "http".into();
        s.cache.http_url = format!("{}/v1", m.base_url());
        s.cache.http_allow_private_network = true;
        s.cache.http_model = "text-embedding-3-small".into();
        s.cache.http_api_key = Some(sluice::config::Secret(secrecy::SecretString::from(
            "embedder-key".to_string(),
        )));
    })
    .await;
    let huge = sluice::mock::Script {
        raw_body: Some(format!(
            "{{\"data\":[{{\"embedding\":[{}1]}}]}}",
            "0,".repeat(1_000_000)
        )),
        ..Default::default()
    };
    app.mock.state.sticky("embedder-key", Some(huge));
    let (_, token) = app.token("huge", None).await;
    let (kind, _) = ask(&app, &token, &question("WVWZZZ1JZXW000001")).await;
    assert_eq!(kind, "miss");
    app.wait_for_cache_entries(1).await;
    assert!(app.mock.state.stats("embedder-key").count >= 1);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM cache_entries WHERE vector IS NOT NULL")
            .await,
        0,
        "no vector past the bound is stored"
    );
}

/// A team's entries are not evicted for another team's: when the table is past
/// `max_entries`, each scope keeps its newest entries up to an equal share of the cap, so a
/// team that stores many (cheap ones: `max_tokens: 1`) loses its own oldest, not another
/// team's (s31 cache attack F2: the oldest of the whole table went, whoever stored them).
async fn one_scope_cannot_evict_another_scopes_entries(engine: crate::pg_gateway_app::Engine) {
    let app = crate::pg_gateway_app::spawn_app_on(engine, |s, _| s.cache.max_entries = 10).await;
    let (_, team_a) = app.token("alice", None).await;
    let flooding = app
        .token_in_team("flooding", None, issue_args("mallory"), None)
        .await;
    let team_b = flooding.text;
    let kept = question("WVWZZZ1JZXW000001");
    assert_eq!(ask(&app, &team_a, &kept).await.0, "miss");
    app.wait_for_cache_entries(1).await;
    for i in 0..30 {
        let mut cheap = question(&format!("WVWZZZ1JZXW{:06}", 100 + i));
        cheap["max_tokens"] = json!(1);
        assert_eq!(ask(&app, &team_b, &cheap).await.0, "miss");
    }
    app.wait_for_cache_entries(31).await;
    assert_eq!(
        app.state.cache.evict(chrono::Utc::now()).await.unwrap(),
        21,
        "down to the cap"
    );
    assert_eq!(ask(&app, &team_a, &kept).await.0, "hit-exact");
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM cache_entries WHERE scope = 'team:{}'",
            flooding.team_id
        ))
        .await,
        9,
        "the flooding team keeps the rest of the cap, its newest"
    );
}
crate::on_both_engines!(one_scope_cannot_evict_another_scopes_entries);

/// With `cache.scope = "token"`, the entries of a token no request can use any more — one
/// revoked, one rotated (its old text now speaks as the successor, whose keys differ), one
/// expired — go before any live token's: each dead scope kept its equal share of the cap,
/// unreachable, and a live token lost its entries to them (s31 evict attack F1; the
/// live token kept 2 of its 10).
async fn a_dead_tokens_entries_go_before_a_live_tokens(engine: crate::pg_gateway_app::Engine) {
    use crate::admin_helpers::{login, make_login};
    let app = crate::pg_gateway_app::spawn_app_on(engine, |s, _| {
        s.cache.max_entries = 10;
        s.cache.scope = "token".into();
    })
    .await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let mut dead = Vec::new();
    for (i, name) in ["revoked", "rotated", "expired"].into_iter().enumerate() {
        let (id, text) = app.token(name, None).await;
        for j in 0..3 {
            let q = question(&format!("WVWZZZ1JZXW{:06}", 10 * i + j));
            assert_eq!(ask(&app, &text, &q).await.0, "miss");
        }
        dead.push(id);
    }
    app.wait_for_cache_entries(9).await;
    sluice::cli::token_revoke(app.db(), dead[0], chrono::Utc::now())
        .await
        .unwrap();
    let (s, r) = admin
        .post(
            &format!("/admin/api/v1/tokens/{}/rotate", dead[1]),
            &json!({ "overlap_seconds": 3600 }),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    sql_exec(
        app.db(),
        &format!(
            "UPDATE tokens SET expires_at = '2020-01-01T00:00:00.000Z' WHERE id = {}",
            dead[2]
        ),
    )
    .await;

    let (_, live) = app.token("live", None).await;
    let kept: Vec<Value> = (0..10)
        .map(|i| question(&format!("WVWZZZ1JZXW{:06}", 500 + i)))
        .collect();
    for q in &kept {
        assert_eq!(ask(&app, &live, q).await.0, "miss");
    }
    app.wait_for_cache_entries(19).await;
    assert_eq!(
        app.state.cache.evict(chrono::Utc::now()).await.unwrap(),
        9,
        "down to the cap"
    );
    for q in &kept {
        assert_eq!(ask(&app, &live, q).await.0, "hit-exact");
    }
    for id in dead {
        assert_eq!(
            app.scalar(&format!(
                "SELECT COUNT(*) FROM cache_entries WHERE scope = 'token:{id}'"
            ))
            .await,
            0,
            "token {id} can be asked nothing: its entries went first"
        );
    }
}
crate::on_both_engines!(a_dead_tokens_entries_go_before_a_live_tokens);

/// Hosts that evict at the same moment delete the surplus once between them: each
/// counted the table and then deleted that many more of the oldest, so the entries went
/// down by the surplus once per host (s31 cache attack F2, multi-host). Four hosts on one
/// database (a SQLite file or a PostgreSQL database) evict at once; the cap is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_evicting_at_once_leave_the_cap() {
    use crate::pg_gateway_app::{shared_key, Engine};
    let dir = tempfile::tempdir().unwrap();
    let url = (test_engine() == Engine::Postgres).then(crate::pg_server::database);
    let open = || async {
        match &url {
            None => sluice::store::Db::open(&dir.path().join("shared.db"), false).await,
            Some(url) => sluice::store::Db::open_postgres(url, &shared_key()).await,
        }
        .unwrap()
    };
    let settings = sluice::config::CacheSettings {
        max_entries: 10,
        ..Default::default()
    };
    let mut hosts = Vec::new();
    for _ in 0..4 {
        let db = open().await;
        hosts.push(
            sluice::cache::Cache::new(
                &settings,
                &sluice::config::UpstreamTimeouts::default(),
                db.clone(),
                sluice::store::writer::Writer::start(&db),
            )
            .unwrap(),
        );
    }
    let now = chrono::Utc::now();
    let answer = egr_answer();
    for round in 0..3 {
        for i in 0..30 {
            let vin = format!("WVWZZZ1JZXW{:06}", round * 100 + i);
            let plan = plan_of(&hosts[0], &question(&vin), None);
            hosts[0].put(&plan, &answer, (12, 24), now).await;
        }
        hosts[0].flush().await;
        let evicted = futures_util::future::join_all(hosts.iter().map(|h| h.evict(now))).await;
        let evicted: u64 = evicted.into_iter().map(Result::unwrap).sum();
        let db = open().await;
        let left = scalar_on(&db, "SELECT COUNT(*) FROM cache_entries").await;
        // 30 new entries over the 10 kept (none kept before the first round).
        let surplus = if round == 0 { 20 } else { 30 };
        assert_eq!((left, evicted), (10, surplus), "round {round}");
    }
}

/// An answer nested deeper than it parses again — an OpenAI model's tool arguments 127
/// levels deep, streamed to an Anthropic client whose `input` holds them parsed three
/// levels down — is stored from the stream, but cannot be replayed: the streamed repeat
/// goes to the upstream as a miss and is charged as one, never a broken replay (s38: entries
/// held as text). (Whole, the same translated answer is not stored: it is read back from
/// the body it was sent as, which does not parse.)
#[tokio::test]
async fn a_stream_asking_for_an_answer_too_deep_to_replay_is_a_miss() {
    let app = spawn_app().await;
    let (_, token) = app.token("deep", None).await;
    let args = format!("{{\"a\":{}0{}}}", "[".repeat(126), "]".repeat(126));
    let script = || sluice::mock::Script {
        tool_arguments: Some(args.clone()),
        ..Default::default()
    };
    app.mock.state.script(KEY_A, [script(), script()]);
    let ask = json!({"model": "gpt-4o-mini", "max_tokens": 50, "temperature": 0, "stream": true,
        "tools": [{"name": "lookup_order", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Where is my order?"}]});
    let resp = app.post("/v1/messages", &token, &ask).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-cache").unwrap(), "miss");
    let body = resp.text().await.unwrap();
    assert!(body.contains("input_json_delta"), "{body}");
    app.wait_for_cache_entries(1).await;

    let resp = app.post("/v1/messages", &token, &ask).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-cache").unwrap(), "miss");
    let body = resp.text().await.unwrap();
    assert!(body.contains("message_stop"), "{body}");
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        2,
        "the upstream answered it"
    );
    app.wait_for_log_rows(2).await;
    let charged: i64 = app
        .scalar("SELECT COUNT(*) FROM requests WHERE cache = 'miss' AND cost_micros > 0")
        .await;
    assert_eq!(charged, 2, "both were charged as misses");
}

/// A row read back from the table is served as it was checked: a row holding a member
/// twice (written by hand, or by another program) is judged on the last one, as parsing
/// keeps it, and must not serve the first (s38 stop attack F2). On a SQLite file: the row
/// is rewritten by hand.
#[tokio::test]
async fn a_row_read_back_is_served_as_it_was_checked() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir).await;
    let (a, b) = (cache_on(&db), cache_on(&db));
    let now = chrono::Utc::now();
    let body = question("WVWZZZ1JZXW000043");
    let answer = egr_answer();
    a.put(&plan_of(&a, &body, None), &answer, (12, 24), now)
        .await;
    a.flush().await;
    let whole = answer.to_string();
    let cut = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Check the"},"finish_reason":"length"}],"#;
    let twice = format!("{cut}{}", &whole[1..]);
    sqlx::query("UPDATE cache_entries SET answer = ?")
        .bind(&twice)
        .execute(&db.sqlite().write)
        .await
        .unwrap();
    b.refresh(now).await.unwrap();
    let hit = b
        .get(&plan_of(&b, &body, None), now, no_deadline())
        .await
        .expect("found");
    let served = std::str::from_utf8(&hit.entry.answer).unwrap();
    assert!(!served.contains("\"length\""), "{served}");
    assert_eq!(served, whole);
}

/// A row stored by a version of Sluice before row versions (0, as every row the migration
/// found) is never taken for the one a replica holds: an older replica storing a key again
/// in a mixed fleet replaces the answer held here at the next refresh, as before versions.
#[tokio::test]
async fn a_row_without_a_version_always_replaces_the_entry_held() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir).await;
    let (a, b) = (cache_on(&db), cache_on(&db));
    let now = chrono::Utc::now();
    a.refresh(now).await.unwrap();
    b.refresh(now).await.unwrap();
    let body = question("WVWZZZ1JZXW000044");
    let answer = egr_answer();
    a.put(&plan_of(&a, &body, None), &answer, (12, 24), now)
        .await;
    a.flush().await;
    // The row as an older replica leaves it; B reads it into its memory.
    let unversioned = |text: String| {
        sqlx::query(
            "INSERT OR REPLACE INTO cache_entries (key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at, hits)
             SELECT key, scope, model, format, context_hash, vector, ?, input_tokens, output_tokens, tags, created_at, expires_at, hits FROM cache_entries",
        )
        .bind(text)
        .execute(&db.sqlite().write)
    };
    unversioned(answer.to_string()).await.unwrap();
    b.refresh(now).await.unwrap();
    let plan = plan_of(&b, &body, None);
    assert!(b.get(&plan, now, no_deadline()).await.is_some());
    let mut again = answer.clone();
    again["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    unversioned(again.to_string()).await.unwrap();
    b.refresh(now).await.unwrap();
    let hit = b.get(&plan, now, no_deadline()).await.expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        again,
        "the older replica's new answer, not the one held"
    );
}

/// Hits are counted in batches, not in a write of their own each: at one client every hit
/// waited for a commit of its own, for a count nothing on the request path reads (s39: the
/// writer's share of a hit's profile). Every hit is still counted.
#[tokio::test]
async fn hits_are_counted_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_db(&dir).await;
    let writer = sluice::store::writer::Writer::start(&db);
    let cache = sluice::cache::Cache::new(
        &sluice::config::CacheSettings::default(),
        &sluice::config::UpstreamTimeouts::default(),
        db.clone(),
        writer.clone(),
    )
    .unwrap();
    let now = chrono::Utc::now();
    cache.refresh(now).await.unwrap();
    let body = question("WVWZZZ1JZXW000045");
    let plan = plan_of(&cache, &body, None);
    let answer = egr_answer();
    cache.put(&plan, &answer, (12, 24), now).await;
    cache.flush().await;
    let before = writer.stats().jobs;
    for _ in 0..40 {
        cache.record_hit(&plan.exact);
    }
    cache.flush().await;
    let jobs = writer.stats().jobs - before;
    assert!(jobs <= 2, "{jobs} write jobs for 40 hits");
    let hits: i64 = sqlx::query_scalar("SELECT hits FROM cache_entries")
        .fetch_one(&db.sqlite().read)
        .await
        .unwrap();
    assert_eq!(hits, 40);
}

/// A hit's budget header is given at once or not at all: a budget read the store holds
/// leaves the header out and the answer goes, "answered at once" (s41 final attack F1: the
/// hit waited for the read, past the client's deadline). What holds it, per engine: on
/// SQLite another process holding the `-shm` read-mark bytes — the WAL read retry sleeps,
/// up to ~10 s, whatever the busy timeout (a second gateway on the file, a tool); on
/// PostgreSQL a session holding `ACCESS EXCLUSIVE` on `tokens` (an `ALTER TABLE`, a
/// `VACUUM FULL`): there 20 hits at once, more than the pool's 16 connections, all go
/// without the header, and once the lock goes a miss is served and settled through the
/// pool.
#[tokio::test]
async fn a_hit_whose_budget_read_is_held_goes_without_the_budget_header() {
    let app = spawn_app().await;
    let (_, token) = app.token("held", Some("5")).await;
    let q = question("WVWZZZ1JZXW000042");
    ask(&app, &token, &q).await;
    app.wait_for_cache_entries(1).await;
    let late_before = left_out(&app, "late").await;
    let hold = hold_the_budget_read(&app).await;
    let started = std::time::Instant::now();
    let hit = app.chat(&token, &q).await;
    let took = started.elapsed();
    assert_eq!(hit.status(), 200);
    assert_eq!(hit.headers()["x-sluice-cache"], "hit-exact");
    assert!(
        took < std::time::Duration::from_millis(1_000),
        "the hit waited {took:?} for its budget read"
    );
    assert!(
        hit.headers().get("x-sluice-budget-remaining-usd").is_none(),
        "a header the read could not give in time"
    );
    // Counted every time, though logged once per while (`ops::warn_gate`).
    assert!(
        left_out(&app, "late").await > late_before,
        "the hit left out uncounted"
    );
    // A deadline too short for the read to begin is the client's doing, not the store's
    // (s43 attack F6: any client could raise the `late` count and its warning with a 1 ms
    // deadline); one that left the read time and still passed is the store's (s43 final
    // attack F2: with short deadlines a store holding every read showed no `late`).
    let (deadline_before, late_before) = (
        left_out(&app, "deadline").await,
        left_out(&app, "late").await,
    );
    for ms in [10, 100] {
        let hurried = app.chat_with_deadline(&token, &q, ms).await;
        assert_eq!(hurried.status(), 200);
        assert!(hurried
            .headers()
            .get("x-sluice-budget-remaining-usd")
            .is_none());
    }
    assert!(
        left_out(&app, "deadline").await > deadline_before,
        "a hit its own deadline left no time for the read counted as the store's"
    );
    assert!(
        left_out(&app, "late").await > late_before,
        "a held read the client's deadline cut short not counted as the store's"
    );
    if matches!(hold, Hold::Postgres(_)) {
        // At once, more than the pool has connections: the reads past them wait for one
        // within the same bound.
        let started = std::time::Instant::now();
        let held = futures_util::future::join_all((0..20).map(|_| app.chat(&token, &q))).await;
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_millis(1_500),
            "20 held hits took {took:?}"
        );
        for hit in held {
            assert_eq!(hit.status(), 200);
            assert!(hit.headers().get("x-sluice-budget-remaining-usd").is_none());
        }
        // The reads given up on hold a few connections, not the pool (s42 final attack F2:
        // each kept one until the sessions' 2 s `lock_timeout`, and 15 of them left none).
        let pool = &app.state.db.postgres().unwrap().pool;
        let free =
            tokio::time::timeout(std::time::Duration::from_millis(500), pool.acquire()).await;
        assert!(
            matches!(free, Ok(Ok(_))),
            "a connection while the hits' reads are held"
        );
    }
    hold.release().await;
    // Once the lock went, the header is back, and a miss is reserved, settled and logged.
    let again = app.chat(&token, &q).await;
    assert!(again
        .headers()
        .get("x-sluice-budget-remaining-usd")
        .is_some());
    let miss = app.chat(&token, &question("WVWZZZ1JZXW000043")).await;
    assert_eq!(miss.status(), 200);
    let left = miss.headers()["x-sluice-budget-remaining-usd"]
        .to_str()
        .unwrap();
    assert!(left.parse::<f64>().unwrap() < 5.0, "settled: {left}");
}

/// Hits gone without their budget header for `reason`, as `/metrics` counts them (in the
/// whole test process: only this test holds budget reads).
async fn left_out(app: &TestApp, reason: &str) -> u64 {
    counted(
        app,
        "gateway_cache_hit_budget_header_left_out_total",
        reason,
    )
    .await
}

/// The counters `metric` holds for `reason` (in the whole test process).
async fn counted(app: &TestApp, metric: &str, reason: &str) -> u64 {
    let (metric, label) = (format!("{metric}{{"), format!("reason=\"{reason}\""));
    app.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with(&metric))
        .filter(|l| l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// What holds a hit's budget read in `a_hit_whose_budget_read_is_held_goes_without_the_
/// budget_header`: a child process holding SQLite's read marks for 3 s, or a PostgreSQL
/// transaction holding `tokens` until released.
enum Hold {
    Sqlite(tokio::process::Child),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

async fn hold_the_budget_read(app: &TestApp) -> Hold {
    let Some(pg) = app.state.db.postgres() else {
        let shm = app.dir.path().join("sluice.db-shm");
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/hold_read_marks.py"
        );
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .arg(&shm)
            .arg("3")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
            .await
            .unwrap();
        assert_eq!(line.trim(), "locked");
        return Hold::Sqlite(child);
    };
    let mut tx = pg.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    Hold::Postgres(tx)
}

impl Hold {
    async fn release(self) {
        match self {
            Self::Sqlite(mut child) => {
                child.wait().await.unwrap();
            }
            Self::Postgres(tx) => tx.rollback().await.unwrap(),
        }
    }
}

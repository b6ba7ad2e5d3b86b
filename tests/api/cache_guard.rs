//! The cache's edges under hostile input: client-supplied TTLs (header and token), tags
//! with LIKE's wildcards, and the headers of a hit, which must be a proxied answer's.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::helpers::*;

fn question(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
           "messages": [{"role": "user", "content": text}]})
}

fn claude_question(text: &str, stream: bool) -> Value {
    json!({"model": "claude", "temperature": 0, "max_tokens": 100, "stream": stream,
           "messages": [{"role": "user", "content": text}]})
}

async fn send(
    app: &TestApp,
    path: &str,
    token: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = app
        .http
        .post(format!("{}{path}", app.address))
        .bearer_auth(token)
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("request sent")
}

fn cache_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-sluice-cache")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn an_out_of_range_cache_ttl_is_a_400_naming_it_in_the_clients_format() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("ttl", None).await;
    for ttl in [
        "9223372036854775807",
        "9223372036854775",
        "99999999999",
        "-1",
        "0",
        "1e3",
        "ten",
    ] {
        let r = send(
            &app,
            "/v1/chat/completions",
            &token,
            &question("What is a TTL?"),
            &[("x-sluice-cache-ttl", ttl)],
        )
        .await;
        assert_eq!(r.status(), 400, "ttl {ttl}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], "x-sluice-cache-ttl", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-sluice-cache-ttl"),
            "{v}"
        );

        let r = send(
            &app,
            "/v1/messages",
            &token,
            &claude_question("What is a TTL?", false),
            &[("x-sluice-cache-ttl", ttl)],
        )
        .await;
        assert_eq!(r.status(), 400, "ttl {ttl}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-sluice-cache-ttl"),
            "{v}"
        );
    }
    // The largest TTL allowed is served and stored.
    let max = sluice::cache::MAX_TTL_SECONDS.to_string();
    let r = send(
        &app,
        "/v1/chat/completions",
        &token,
        &question("What is a TTL?"),
        &[("x-sluice-cache-ttl", &max)],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(cache_of(&r), "miss");
    app.wait_for_cache_entries(1).await;
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "nothing refused went upstream"
    );
}

/// A token's own TTL comes from the database, not from the client: a value past any date
/// (written by hand, or by a future admin page) must neither panic nor be refused — it is
/// held to the largest TTL.
#[tokio::test]
async fn a_huge_token_ttl_is_held_to_the_largest_ttl_not_a_panic() {
    let app = spawn_app().await;
    let (id, token) = app.token("forever", None).await;
    sql_exec(
        app.db(),
        &format!(
            "UPDATE tokens SET cache_ttl_seconds = {} WHERE id = {id}",
            i64::MAX
        ),
    )
    .await;
    let r = app
        .chat(&token, &question("How long do entries live?"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(cache_of(&r), "miss");
    app.wait_for_cache_entries(1).await;
    let r = app
        .chat(&token, &question("How long do entries live?"))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(cache_of(&r), "hit-exact");
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
}

#[test]
fn a_default_ttl_past_the_largest_is_refused_at_load() {
    let mut s = sluice::config::Settings::default();
    s.cache.default_ttl_seconds = u64::MAX;
    let e = s.validate().expect_err("refused");
    assert!(e.to_string().contains("default_ttl_seconds"), "{e}");
    s.cache.default_ttl_seconds = sluice::cache::MAX_TTL_SECONDS as u64;
    s.validate().expect("the largest TTL is valid");
    s.cache.default_ttl_seconds = 0;
    assert!(s.validate().is_err(), "a TTL of 0 stores nothing");
}

/// Tags are matched as whole, exact strings: `_` and `%` are characters like any other,
/// and case counts.
#[tokio::test]
async fn tags_with_like_wildcards_are_invalidated_exactly() {
    let app = spawn_app().await;
    let (_, token) = app.token("tags", None).await;
    let tagged = [
        ("a_b", "Question one about tags?"),
        ("axb", "Question two about tags?"),
        ("50%", "Question three about tags?"),
        ("500", "Question four about tags?"),
        ("Case:1", "Question five about tags?"),
        ("case:1", "Question six about tags?"),
    ];
    for (tag, text) in tagged {
        let r = send(
            &app,
            "/v1/chat/completions",
            &token,
            &question(text),
            &[("x-sluice-cache-tags", tag)],
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    let untagged = question("A question without any tag?");
    assert_eq!(app.chat(&token, &untagged).await.status(), 200);
    app.wait_for_cache_entries(7).await;

    let cache = &app.state.cache;
    assert_eq!(
        cache.invalidate_tag("%").await.unwrap(),
        0,
        "`%` is no wildcard"
    );
    assert_eq!(
        cache.invalidate_tag("_").await.unwrap(),
        0,
        "`_` is no wildcard"
    );
    assert_eq!(cache.invalidate_tag("a_b").await.unwrap(), 1);
    assert_eq!(cache.invalidate_tag("50%").await.unwrap(), 1);
    assert_eq!(cache.invalidate_tag("Case:1").await.unwrap(), 1);
    let hit = |text: &'static str| {
        let app = &app;
        let token = token.clone();
        async move { cache_of(&app.chat(&token, &question(text)).await) }
    };
    assert_eq!(hit("Question one about tags?").await, "miss", "a_b went");
    assert_eq!(
        hit("Question two about tags?").await,
        "hit-exact",
        "axb stays"
    );
    assert_eq!(hit("Question three about tags?").await, "miss", "50% went");
    assert_eq!(
        hit("Question four about tags?").await,
        "hit-exact",
        "500 stays"
    );
    assert_eq!(
        hit("Question five about tags?").await,
        "miss",
        "Case:1 went"
    );
    assert_eq!(
        hit("Question six about tags?").await,
        "hit-exact",
        "case:1 stays"
    );
    assert_eq!(hit("A question without any tag?").await, "hit-exact");
}

#[tokio::test]
async fn too_many_or_too_long_cache_tags_are_a_400_naming_the_header() {
    let app = spawn_app().await;
    let (_, token) = app.token("many", None).await;
    let many = (0..11)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let long = "x".repeat(201);
    for tags in [many.as_str(), long.as_str()] {
        let r = send(
            &app,
            "/v1/chat/completions",
            &token,
            &question("Tagged?"),
            &[("x-sluice-cache-tags", tags)],
        )
        .await;
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "x-sluice-cache-tags", "{v}");
    }
}

/// The headers of an answer that are the gateway's, by name, with the values that must
/// match between a proxied answer and a hit (the rest only have to be present).
fn gateway_headers(r: &reqwest::Response) -> BTreeMap<String, String> {
    r.headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-") || k.as_str() == "content-type")
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap().to_string()))
        .collect()
}

fn assert_same_headers(
    what: &str,
    proxied: &BTreeMap<String, String>,
    hit: &BTreeMap<String, String>,
) {
    let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(proxied), names(hit), "{what}: header names");
    for k in ["content-type", "x-ratelimit-limit-requests"] {
        assert_eq!(proxied.get(k), hit.get(k), "{what}: {k}");
    }
    // A whole answer reports the budget after its settlement, which a hit (costing
    // nothing) leaves as it is; a stream reports it at its start, with its reservation
    // still held, so there only the presence compares.
    if !what.contains("stream") {
        let k = "x-sluice-budget-remaining-usd";
        assert_eq!(proxied.get(k), hit.get(k), "{what}: {k}");
    }
    assert_eq!(hit["x-sluice-upstream"], "cache", "{what}");
    assert!(hit["x-sluice-cache"].starts_with("hit"), "{what}");
    assert_ne!(proxied["x-request-id"], hit["x-request-id"], "{what}");
}

/// C2: a hit carries every header a proxied answer carries — the budget left, the
/// token's window, the request id — in both formats, whole and streamed.
#[tokio::test]
async fn a_hit_carries_the_headers_of_a_proxied_answer() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("5"),
            rpm: Some(1000),
            ..issue_args("headers")
        })
        .await;
    let cases = [
        ("/v1/chat/completions", question("Which headers?"), "openai"),
        (
            "/v1/chat/completions",
            {
                let mut q = question("Which headers, streamed?");
                q["stream"] = json!(true);
                q
            },
            "openai stream",
        ),
        (
            "/v1/messages",
            claude_question("Which headers?", false),
            "anthropic",
        ),
        (
            "/v1/messages",
            claude_question("Which headers, streamed?", true),
            "anthropic stream",
        ),
    ];
    for (n, (path, body, what)) in cases.iter().enumerate() {
        let proxied = send(&app, path, &token, body, &[]).await;
        assert_eq!(proxied.status(), 200, "{what}");
        assert_eq!(cache_of(&proxied), "miss", "{what}");
        let proxied_headers = gateway_headers(&proxied);
        let _ = proxied.bytes().await.unwrap();
        app.wait_settled().await;
        app.wait_for_cache_entries(n as i64 + 1).await;
        let hit = send(&app, path, &token, body, &[]).await;
        assert_eq!(hit.status(), 200, "{what}");
        let hit_headers = gateway_headers(&hit);
        let _ = hit.bytes().await.unwrap();
        assert_same_headers(what, &proxied_headers, &hit_headers);
    }
}

/// A request header that changes the answer (`anthropic-beta`, forwarded to Anthropic
/// upstreams) is part of the key: an answer made without a beta feature never answers a
/// request that asks for it, nor the other way round.
#[tokio::test]
async fn answers_made_under_other_anthropic_beta_flags_are_not_hits() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("beta", None).await;
    let body = claude_question("Summarise the attached notes.", false);
    let beta = [("anthropic-beta", "files-api-2025-04-14")];
    let r = send(&app, "/v1/messages", &token, &body, &[]).await;
    assert_eq!(cache_of(&r), "miss");
    app.wait_for_cache_entries(1).await;
    let r = send(&app, "/v1/messages", &token, &body, &beta).await;
    assert_eq!(r.status(), 200);
    assert_eq!(cache_of(&r), "miss", "another beta, another answer");
    app.wait_for_cache_entries(2).await;
    assert_eq!(
        cache_of(&send(&app, "/v1/messages", &token, &body, &beta).await),
        "hit-exact"
    );
    assert_eq!(
        cache_of(&send(&app, "/v1/messages", &token, &body, &[]).await),
        "hit-exact"
    );
}

/// `max_entries` is a u64 in the config: one past i64::MAX must keep every entry, not read
/// as a negative limit that evicts them all.
#[tokio::test]
async fn a_huge_max_entries_evicts_nothing() {
    let app = spawn_app_with(|s, _| s.cache.max_entries = u64::MAX).await;
    let (_, token) = app.token("evict", None).await;
    assert_eq!(app.chat(&token, &question("Keep me?")).await.status(), 200);
    app.wait_for_cache_entries(1).await;
    assert_eq!(app.state.cache.evict(chrono::Utc::now()).await.unwrap(), 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM cache_entries").await, 1);
}

/// A bad cache header is named before the windows count the request, on every route: it
/// was read after them (each bad request took one of the token's and the user's request
/// slots, and at the limit the client got a 429 instead of the 400 naming the header) and
/// only on the two cached routes (`x-sluice-cache-ttl: -5` on embeddings passed without a
/// word) — s32 edge attack F4.
#[tokio::test]
async fn a_bad_cache_header_is_named_before_the_windows_count_it() {
    let app = spawn_app().await;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(2),
            ..issue_args("slots")
        })
        .await;
    for bad in [
        ("x-sluice-cache-ttl", "0"),
        ("x-sluice-cache", "yes"),
        ("x-sluice-cache-ttl", "-5"),
    ] {
        let r = send(
            &app,
            "/v1/chat/completions",
            &token,
            &question("Hi?"),
            &[bad],
        )
        .await;
        assert_eq!(r.status(), 400, "{bad:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], bad.0, "{v}");
    }
    let embed = json!({"model": "text-embedding-3-small", "input": "hi"});
    for (path, body) in [
        ("/v1/embeddings", &embed),
        (
            "/v1/responses",
            &json!({"model": "gpt-4o-mini", "input": "hi"}),
        ),
    ] {
        let r = send(&app, path, &token, body, &[("x-sluice-cache-ttl", "-5")]).await;
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "x-sluice-cache-ttl", "{path}: {v}");
    }
    // `anthropic-beta` is the provider's header, read by the cache only when it keys a
    // request: not text, it is no bad request on a route the cache does not serve (s32
    // stop attack F3).
    let r = app
        .http
        .post(format!("{}/v1/embeddings", app.address))
        .bearer_auth(&token)
        .header(
            "anthropic-beta",
            reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        )
        .json(&embed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // None of the refused requests took a slot of the window: the embedding took one,
    // one is left.
    for _ in 0..1 {
        let r = app.chat(&token, &question("Hi?")).await;
        assert_eq!(r.status(), 200);
    }
}

/// A non-text `anthropic-beta` on a cacheable request is keyed by its bytes, not refused:
/// refused by the cache plan, after the windows, it took a request slot and the next got a
/// 429 (s32 last attack F2); the same header on an uncached request was forwarded.
#[tokio::test]
async fn a_non_text_anthropic_beta_on_a_cached_route_is_keyed_not_refused() {
    let app = spawn_app().await;
    let (_, token) = app.token("beta", None).await;
    let ask = |beta: &'static [u8]| {
        app.http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header(
                "anthropic-beta",
                reqwest::header::HeaderValue::from_bytes(beta).unwrap(),
            )
            .json(&question("What is the boiling point of water?"))
            .send()
    };
    let first = ask(b"caf\xe9").await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(cache_of(&first), "miss");
    app.wait_for_cache_entries(1).await;
    let again = ask(b"caf\xe9").await.unwrap();
    assert_eq!(cache_of(&again), "hit-exact");
    let other = ask(b"caf\xe8").await.unwrap();
    assert_eq!(cache_of(&other), "miss", "another value is another key");
}

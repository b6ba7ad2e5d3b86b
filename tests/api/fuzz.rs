//! Fuzz-style property tests of every `/v1` route (the list of `api::configure`): arbitrary
//! JSON bodies (random shapes; near-valid requests with wrong types, huge, negative and
//! NaN-like numbers, deep nesting, odd content blocks; invalid bytes) and arbitrary values
//! of the headers the gateway reads, against one in-process gateway and the mock upstream.
//!
//! Every answer must be a well-formed answer or a well-formed error in the route's format;
//! a 500 or a dropped connection (how a panic in an actix handler shows) fails the case.
//!
//! Replayable: a fixed seed by default; a failure prints `SLUICE_FUZZ_SEED=<hex>` (and the
//! shrunk input). `SLUICE_FUZZ_CASES` sets the number of cases (1 000 by default, a few
//! seconds); `SLUICE_FUZZ_SEED=random` draws a new seed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::Value;

use sluice::config::Provider;

use crate::helpers::*;

#[path = "fuzz_inputs.rs"]
mod inputs;
use inputs::{case, Auth, Case, Route};

/// The seed used when none is given: fixed, so every run sends the same requests.
const DEFAULT_SEED: &str = "5a1ce0f0ed5eed00c0ffee15b0a7f00d5a1ce0f0ed5eed00c0ffee15b0a7f00d";

/// Which error shape the route answers in for this request.
fn anthropic_shaped(c: &Case) -> bool {
    match c.route {
        Route::Messages | Route::CountTokens => true,
        Route::Models | Route::Model => c.headers.iter().any(|(h, _)| *h == "anthropic-version"),
        _ => false,
    }
}

async fn run_case(
    app: &TestApp,
    token: &str,
    c: Case,
    seen: &Mutex<BTreeMap<u16, u32>>,
) -> Result<(), TestCaseError> {
    let path = match c.route {
        Route::Chat => "/v1/chat/completions".to_string(),
        Route::Completions => "/v1/completions".into(),
        Route::Embeddings => "/v1/embeddings".into(),
        Route::Messages => "/v1/messages".into(),
        Route::CountTokens => "/v1/messages/count_tokens".into(),
        Route::Models => "/v1/models".into(),
        Route::Model => format!("/v1/models/{}", c.model_id),
        Route::Usage => "/v1/usage".into(),
        Route::Queue => "/v1/queue".into(),
    };
    let url = format!("{}{path}", app.address);
    let mut req = if c.route.post() {
        app.http.post(url)
    } else {
        app.http.get(url)
    };
    req = match &c.auth {
        Auth::Bearer => req.bearer_auth(token),
        Auth::XApiKey => req.header("x-api-key", token),
        Auth::None => req,
        Auth::Raw(v) => req.header("authorization", v.as_str()),
    };
    let mut seen_type = false;
    for (name, value) in &c.headers {
        let Ok(v) = reqwest::header::HeaderValue::from_bytes(value) else {
            continue;
        };
        seen_type |= *name == "content-type";
        req = req.header(*name, v);
    }
    if !seen_type && c.route.post() {
        req = req.header("content-type", "application/json");
    }
    let resp = req.body(c.body.clone()).send().await.map_err(|e| {
        TestCaseError::fail(format!("no answer (a panic drops the connection): {e}"))
    })?;
    let status = resp.status().as_u16();
    *seen.lock().unwrap().entry(status).or_default() += 1;
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| TestCaseError::fail(format!("{status}: body cut: {e}")))?;
    let text = String::from_utf8_lossy(&bytes);
    if status >= 500 {
        // Allowed when well-formed (the mock may refuse what it was sent), but worth a look.
        eprintln!("{status} for {c:?}: {text}");
    }
    prop_assert!(
        status != 500,
        "500 (a panic or an internal error): {}",
        text
    );
    if (200..300).contains(&status) {
        if ctype.starts_with("text/event-stream") {
            prop_assert!(text.contains("data:"), "an empty stream: {}", text);
            // Every data line of a stream is JSON or the OpenAI end marker.
            for line in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                let line = line.trim();
                prop_assert!(
                    line == "[DONE]" || serde_json::from_str::<Value>(line).is_ok(),
                    "a stream event that is not JSON: {}",
                    line
                );
            }
        } else {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| TestCaseError::fail(format!("{status}: not JSON ({e}): {text}")))?;
            prop_assert!(v.is_object(), "{}", text);
        }
        return Ok(());
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        TestCaseError::fail(format!("{status}: error body is not JSON ({e}): {text:?}"))
    })?;
    let err = &v["error"];
    prop_assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{status}: no error message: {v}"
    );
    prop_assert!(err["type"].is_string(), "{status}: no error type: {v}");
    if anthropic_shaped(&c) {
        prop_assert_eq!(
            &v["type"],
            "error",
            "{}: not Anthropic-shaped: {}",
            status,
            v
        );
    } else {
        let e = err.as_object().cloned().unwrap_or_default();
        prop_assert!(
            e.contains_key("param") && e.contains_key("code"),
            "{status}: not OpenAI-shaped: {v}"
        );
    }
    Ok(())
}

#[test]
fn every_v1_route_answers_arbitrary_input_in_its_format() {
    let cases: u32 = std::env::var("SLUICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let seed_hex = match std::env::var("SLUICE_FUZZ_SEED") {
        Ok(s) if s == "random" => hex::encode(rand::random::<[u8; 32]>()),
        Ok(s) => s,
        Err(_) => DEFAULT_SEED.to_string(),
    };
    let seed: [u8; 32] = hex::decode(seed_hex.trim())
        .ok()
        .and_then(|v| v.try_into().ok())
        .expect("SLUICE_FUZZ_SEED: 64 hex digits or `random`");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (app, token) = rt.block_on(async {
        let app = spawn_app_with(|s, m| {
            s.server.max_body_bytes = 256 * 1024;
            // An Anthropic upstream too, so both translation directions run.
            let mut c = upstream("c", "sk-ant-fuzz-key", m);
            c.provider = Provider::Anthropic;
            c.base_url = m.base_url();
            s.upstreams.push(c);
            s.models.push(model("claude", &["c"]));
        })
        .await;
        let (_, token) = app.token("fuzz", None).await;
        (app, token)
    });
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 300,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let seen = Mutex::new(BTreeMap::new());
    let result = runner.run(&case(), |c| rt.block_on(run_case(&app, &token, c, &seen)));
    eprintln!("statuses seen: {:?}", seen.lock().unwrap());
    if let Err(e) = result {
        panic!("a /v1 route misanswered — replay with SLUICE_FUZZ_SEED={seed_hex}\n{e}");
    }
    // Nothing the fuzzer sent broke the money books.
    rt.block_on(app.assert_invariant());
}

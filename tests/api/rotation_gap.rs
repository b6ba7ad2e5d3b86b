//! A token rotated between a request's last credential check and its reservation (s26
//! final attack #2): the semantic lookup's embedding (and the window call) lie in that gap,
//! and a rotation committed there left the request reserving on the old token's budget — a
//! copy of what the rotation handed the successor, so the pair could spend it twice. The
//! reservation's CAS refuses a rotated token (`Refusal::Rotated`); the request is
//! authenticated again and reserves, books its windows and is logged as the successor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use crate::admin_helpers::{login, make_login};
use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, Engine};

/// The first question, whose answer the reworded one (`reworded_while_held`) is near.
const FIRST: &str =
    "Why does the engine warning light blink on WVWZZZ1JZXW000001 after a cold start?";

fn question(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
           "messages": [{"role": "system", "content": "You diagnose cars."},
                        {"role": "user", "content": text}]})
}

/// The first question reworded, sent by `text` in the background: its lookup reaches the
/// embedder (`asked`), which holds it; the response, once the embedder lets go.
async fn reworded_while_held(
    app: &TestApp,
    text: &str,
    asked: &mut mpsc::Receiver<()>,
) -> tokio::task::JoinHandle<reqwest::Response> {
    let (http, url, t) = (
        app.http.clone(),
        format!("{}/v1/chat/completions", app.address),
        text.to_string(),
    );
    let stalled = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(t)
            .json(&question(
                "Hi, why does the engine warning light blink on WVWZZZ1JZXW000001 after a cold start, please? Thanks",
            ))
            .send()
            .await
            .unwrap()
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), asked.recv())
        .await
        .expect("the lookup reached the embedder")
        .unwrap();
    stalled
}

/// An `http` cache embedder that answers its first call (the first answer's entry) at once
/// and holds its second (the next request's semantic lookup) until `go`, telling `asked`
/// when it arrives; its answer is `held` — orthogonal to the first (`[0, 1, 0]`), the
/// lookup misses; the first's (`[1, 0, 0]`), it hits. Later calls are answered at once.
async fn stalling_embedder(held: Value) -> (std::net::SocketAddr, mpsc::Receiver<()>, Arc<Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (asked_tx, asked) = mpsc::channel(4);
    let go = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let notify = go.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let (asked_tx, go, calls) = (asked_tx.clone(), notify.clone(), calls.clone());
            let held = held.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = conn.read(&mut buf).await;
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let vector = match n {
                    0 => json!([1.0, 0.0, 0.0]),
                    1 => {
                        let waited = go.notified();
                        let _ = asked_tx.send(()).await;
                        waited.await;
                        held
                    }
                    _ => json!([0.0, 0.0, 1.0]),
                };
                let body = json!({"data": [{"embedding": vector}]}).to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    (addr, asked, go)
}

/// The gateway on `engine`, its response cache embedding through a `stalling_embedder`
/// whose held answer is `held`.
async fn app_with_stalling_embedder(
    engine: Engine,
    held: Value,
) -> (TestApp, mpsc::Receiver<()>, Arc<Notify>) {
    let (embedder, asked, go) = stalling_embedder(held).await;
    let app = spawn_app_on(engine, move |s, _| {
        s.cache.embedder = "http".into();
        s.cache.http_url = format!("http://{embedder}/v1");
        s.cache.http_allow_private_network = true;
        s.cache.http_model = "text-embedding-3-small".into();
    })
    .await;
    (app, asked, go)
}

/// The request waits on the embedder at stage 4, its token is rotated meanwhile: it is
/// charged to the successor (every ledger row of it carries the successor's id, its log
/// row too), the old token's balance is untouched, its windows are the successor's (one
/// request in them, not the old token's two), its user's request window counts it once —
/// a user at its limit with it is not refused it (s27 diff attack F2: the move booked it
/// there a second time, a 429 for a request already admitted) — and the invariant holds.
async fn a_token_rotated_during_the_semantic_lookup_is_charged_as_its_successor(engine: Engine) {
    let (app, mut asked, go) = app_with_stalling_embedder(engine, json!([0.0, 1.0, 0.0])).await;
    // Two requests a minute for the user: the first question and the held one.
    let user = sluice::cli::UserArgs {
        username: "rita",
        team: None,
        rpm: Some(2),
        tpm: None,
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(app.db(), &user, chrono::Utc::now())
        .await
        .unwrap();
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (old_id, text) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("2"),
            rpm: Some(100),
            tpm: Some(1_000_000),
            ..issue_args("rita")
        })
        .await;
    let first = app.chat(&text, &question(FIRST)).await;
    assert_eq!(first.status(), 200);
    app.wait_for_cache_entries(1).await;
    app.wait_settled().await;

    // The same question reworded: same context, so its lookup embeds — and is held.
    let stalled = reworded_while_held(&app, &text, &mut asked).await;
    let old_remaining = format!("SELECT remaining_micros FROM tokens WHERE id = {old_id}");
    let before = app.scalar(&old_remaining).await;
    let (s, r) = admin
        .post(
            &format!("/admin/api/v1/tokens/{old_id}/rotate"),
            &json!({ "overlap_seconds": 3600 }),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let new_id = r["id"].as_i64().unwrap();
    go.notify_one();

    let resp = stalled.await.unwrap();
    assert_eq!(resp.status(), 200, "the user's window holds it once");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(header("x-sluice-cache").as_deref(), Some("miss"));
    let request_id = header("x-request-id").expect("a request id");
    let remaining_requests = header("x-ratelimit-remaining-requests");
    app.wait_settled().await;
    app.wait_for_log_rows(2).await;
    let rows = app
        .scalar(&format!(
            "SELECT COUNT(*) FROM ledger WHERE request_id = '{request_id}'"
        ))
        .await;
    assert!(rows >= 2, "reserved and settled: {rows} rows");
    let elsewhere = app
        .scalar(&format!(
            "SELECT COUNT(*) FROM ledger WHERE request_id = '{request_id}' AND token_id <> {new_id}"
        ))
        .await;
    assert_eq!(
        elsewhere, 0,
        "every ledger row of the request is the successor's"
    );
    let logged = app
        .scalar(&format!(
            "SELECT token_id FROM requests WHERE id = '{request_id}'"
        ))
        .await;
    assert_eq!(logged, new_id, "logged as the successor");
    assert_eq!(
        app.scalar(&old_remaining).await,
        before,
        "the old token's budget is not spent"
    );
    assert_eq!(
        remaining_requests.as_deref(),
        Some("99"),
        "the successor's window: this request alone"
    );
    app.assert_invariant().await;
    // Its answer is stored under its question's context, as any miss's: the move makes a
    // new plan, whose question went unread, and the entry was for exact matches only (s40
    // attack F1).
    app.wait_for_cache_entries(2).await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM cache_entries WHERE context_hash IS NULL")
            .await,
        0,
        "an entry stored for exact matches only"
    );
}
on_both_engines!(a_token_rotated_during_the_semantic_lookup_is_charged_as_its_successor);

/// A semantic hit found after a slow `http` embedder (up to 5 s) was served to a token
/// revoked during the wait: the last credential check was before the lookup (s27 cache
/// attack F7). A lookup that took `recheck::RECHECK_AFTER` or more is followed by a check
/// of the credential before its hit is answered: 401, and nothing served.
async fn a_token_revoked_during_a_slow_cache_lookup_gets_no_hit(engine: Engine) {
    let (app, mut asked, go) = app_with_stalling_embedder(engine, json!([1.0, 0.0, 0.0])).await;
    let (id, text) = app.token("revoked", None).await;
    let first = app.chat(&text, &question(FIRST)).await;
    assert_eq!(first.status(), 200);
    app.wait_for_cache_entries(1).await;
    let asked_upstream = app.mock.state.stats(KEY_A).count;

    let stalled = reworded_while_held(&app, &text, &mut asked).await;
    revoke_elsewhere(&app, id).await;
    // The lookup outlasts `RECHECK_AFTER`.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    go.notify_one();

    let resp = stalled.await.unwrap();
    assert_eq!(resp.status(), 401);
    assert_ne!(
        resp.headers()
            .get("x-sluice-cache")
            .map(|v| v.to_str().unwrap().to_string())
            .as_deref(),
        Some("hit-semantic")
    );
    let body = resp.text().await.unwrap();
    assert!(!body.contains("choices"), "no answer: {body}");
    assert_eq!(app.mock.state.stats(KEY_A).count, asked_upstream);
    app.assert_invariant().await;
}
on_both_engines!(a_token_revoked_during_a_slow_cache_lookup_gets_no_hit);

/// The re-check after a slow lookup counts from the credential's last check, not from the
/// lookup's start: a body that took just under `RECHECK_AFTER` and a lookup that took just
/// under it again add up past it, and a token revoked meanwhile got the hit (s28 diff
/// attack F4: only the lookup was timed). Here the body takes ~150 ms, the lookup ~150 ms,
/// the token is revoked during the body: 401, nothing served.
async fn a_hit_after_a_slow_body_and_a_slow_lookup_checks_the_credential_again(engine: Engine) {
    let (app, mut asked, go) = app_with_stalling_embedder(engine, json!([1.0, 0.0, 0.0])).await;
    let (id, text) = app.token("revoked", None).await;
    assert_eq!(app.chat(&text, &question(FIRST)).await.status(), 200);
    app.wait_for_cache_entries(1).await;
    let asked_upstream = app.mock.state.stats(KEY_A).count;

    let step = std::time::Duration::from_millis(150);
    let reworded = question(
        "Hi, why does the engine warning light blink on WVWZZZ1JZXW000001 after a cold start, please? Thanks",
    );
    let authenticated = tokio::time::Instant::now();
    let (conn, rest) = half_sent_chat(&app.address, &text, &reworded).await;
    revoke_elsewhere(&app, id).await;
    tokio::time::sleep_until(authenticated + step).await;
    let answered = tokio::spawn(async move { finish_half_sent(conn, &rest).await });
    tokio::time::timeout(std::time::Duration::from_secs(10), asked.recv())
        .await
        .expect("the lookup reached the embedder")
        .unwrap();
    tokio::time::sleep(step).await;
    go.notify_one();

    let (status, answer) = answered.await.unwrap();
    assert_eq!(status, 401, "{answer}");
    assert!(!answer.contains("choices"), "no answer: {answer}");
    assert_eq!(app.mock.state.stats(KEY_A).count, asked_upstream);
    app.assert_invariant().await;
}
on_both_engines!(a_hit_after_a_slow_body_and_a_slow_lookup_checks_the_credential_again);

//! The real binary as separate processes: two gateways on one SQLite file, and a
//! `kill -9` in the middle of traffic.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sluice::mock::{MockConfig, MockServer, Script};
use sluice::quota::pricing;

use crate::gateway_proc::open_dir_db;
pub(crate) use crate::gateway_proc::{free_port, start_gateway_full, Gateway};
use crate::helpers::*;

async fn start_gateway(dir: &std::path::Path, mock: &MockServer) -> Gateway {
    start_gateway_with(dir, mock, &[]).await
}

async fn start_gateway_with(
    dir: &std::path::Path,
    mock: &MockServer,
    env: &[(&str, &str)],
) -> Gateway {
    start_gateway_full(dir, mock, env, "").await
}

/// One gateway process on a fresh database, with an in-process mock upstream.
struct Rig {
    dir: tempfile::TempDir,
    mock: MockServer,
    gateway: Gateway,
    db: sluice::store::Db,
}

async fn rig(env: &[(&str, &str)]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let gateway = start_gateway_with(dir.path(), &mock, env).await;
    let db = open_dir_db(dir.path()).await;
    Rig {
        dir,
        mock,
        gateway,
        db,
    }
}

async fn issue(db: &sluice::store::Db, user: &str, budget_usd: &str) -> sluice::cli::Issued {
    let args = sluice::cli::IssueArgs {
        budget_usd: Some(budget_usd),
        ..issue_args(user)
    };
    sluice::cli::token_issue(db, &args, chrono::Utc::now())
        .await
        .unwrap()
}

async fn post(http: &reqwest::Client, url: &str, token: &str) -> (u16, Option<String>) {
    match http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&chat_body(100))
        .send()
        .await
    {
        Ok(r) => (
            r.status().as_u16(),
            r.headers()
                .get("x-request-id")
                .map(|v| v.to_str().unwrap().to_string()),
        ),
        Err(_) => (0, None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_database_never_overdraw() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let g1 = start_gateway(dir.path(), &mock).await;
    let g2 = start_gateway(dir.path(), &mock).await;
    let db = open_dir_db(dir.path()).await;
    let (input, per) = chat_worst_case(100);
    mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(input),
            completion_tokens: Some(100),
            ..Default::default()
        }),
    );
    let budget = pricing::usd(100 * per);
    let args = sluice::cli::IssueArgs {
        budget_usd: Some(&budget),
        ..issue_args("alice")
    };
    let token = sluice::cli::token_issue(&db, &args, chrono::Utc::now())
        .await
        .unwrap()
        .text;
    let http = reqwest::Client::new();
    let urls = Arc::new([g1.url.clone(), g2.url.clone()]);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (http, urls, token) = (http.clone(), urls.clone(), token.clone());
            tokio::spawn(async move { post(&http, &urls[i % 2], &token).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 100);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 100);
    assert_eq!(mock.state.stats(KEY_A).count, 100);
    assert_invariant_on(&db).await;
    assert_eq!(
        scalar_on(&db, "SELECT remaining_micros FROM tokens").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_load_loses_nothing() {
    let Rig {
        dir,
        mock,
        gateway: mut g,
        db,
    } = rig(&[]).await;
    let token = issue(&db, "bob", "10").await.text;
    let http = reqwest::Client::new();
    // Fast answers first, then slow ones that will be in flight at the kill.
    mock.state.script(KEY_A, (0..40).map(|_| Script::default()));
    mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 2_000,
            ..Default::default()
        }),
    );
    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let (http, url, token) = (http.clone(), g.url.clone(), token.clone());
            tokio::spawn(async move { post(&http, &url, &token).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    g.child.kill().unwrap();
    let _ = g.child.wait();
    let mut answered = Vec::new();
    for t in tasks {
        if let (200, Some(id)) = t.await.unwrap() {
            answered.push(id);
        }
    }
    assert!(!answered.is_empty());
    let open = sql_int(&db, "SELECT COUNT(*) FROM reservations").await;
    assert!(open > 0, "some reservations were in flight at the kill");

    mock.state.sticky(KEY_A, None);
    let _restarted = start_gateway(dir.path(), &mock).await;
    // On SQLite the restarted gateway sees at start that the killed one's pid is dead; on
    // PostgreSQL (liveness by heartbeat alone) once its heartbeat is 15 s old, at a
    // recovery tick 5 s apart.
    let bound = std::time::Instant::now() + Duration::from_secs(60);
    while sql_int(&db, "SELECT COUNT(*) FROM reservations").await > 0 {
        assert!(
            std::time::Instant::now() < bound,
            "the killed gateway's reservations were never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_invariant_on(&db).await;
    let orphans = sql_int(&db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await;
    assert_eq!(
        orphans, open,
        "every open reservation was settled and flagged"
    );
    for id in answered {
        assert!(
            id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a request id fit to quote: {id}"
        );
        let rows = sql_int(
            &db,
            &format!("SELECT COUNT(*) FROM ledger WHERE request_id = '{id}' AND kind = 'settle'"),
        )
        .await;
        assert_eq!(rows, 1, "request {id} answered 200 without a settlement");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_streaming_load_finishes_streams_and_leaves_no_reservation() {
    let Rig {
        dir: _dir,
        mock,
        gateway: mut g,
        db,
    } = rig(&[]).await;
    let token = issue(&db, "sig", "10").await.text;
    mock.state.sticky(
        KEY_A,
        Some(Script {
            chunk_delay_ms: 60,
            ..Default::default()
        }),
    );
    let http = reqwest::Client::new();
    let mut body = chat_body(100);
    body["stream"] = serde_json::json!(true);
    let streams: Vec<_> = (0..20)
        .map(|_| {
            let (http, url, token, body) =
                (http.clone(), g.url.clone(), token.clone(), body.clone());
            tokio::spawn(async move {
                let resp = http
                    .post(format!("{url}/v1/chat/completions"))
                    .bearer_auth(token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                resp.text().await.unwrap_or_default()
            })
        })
        .collect();
    // SIGTERM once every stream is under way.
    for _ in 0..100 {
        if mock.state.stats(KEY_A).count >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = g.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    for s in streams {
        let text = s.await.unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap_or("");
        assert!(
            last == "data: [DONE]" || last.contains("\"error\""),
            "a stream ended without [DONE] or an error event: {last}"
        );
    }
    let status = tokio::task::spawn_blocking(move || g.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "exit 0 after SIGTERM: {status:?}");
    let open = sql_int(&db, "SELECT COUNT(*) FROM reservations").await;
    assert_eq!(open, 0);
    assert_invariant_on(&db).await;
    let logged = sql_int(&db, "SELECT COUNT(*) FROM requests").await;
    assert_eq!(logged, 20, "every request's log row was flushed");
}

/// At the most verbose log level, after valid, bad, revoked and failing traffic, no piece of
/// a sub-token or an upstream key (12 characters or more), nor the token's SHA-256, is in the
/// log, the database, `/metrics` or `/healthz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_never_leak_at_trace_level() {
    let Rig {
        dir,
        mock,
        gateway: g,
        db,
    } = rig(&[("SLUICE_LOG", "trace")]).await;
    let issued = issue(&db, "canary", "1").await;
    let token = issued.text.clone();
    let http = reqwest::Client::new();
    let chat = |t: String| {
        let (http, url) = (http.clone(), g.url.clone());
        async move {
            http.post(format!("{url}/v1/chat/completions"))
                .bearer_auth(t)
                .json(&chat_body(10))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let mut bodies = vec![chat(token.clone()).await];
    bodies.push(chat(format!("{}x", &token[..token.len() - 1])).await);
    mock.state.script(
        KEY_A,
        [Script {
            status: Some(401),
            ..Default::default()
        }],
    );
    bodies.push(chat(token.clone()).await);
    mock.state.script(
        KEY_A,
        [Script {
            status: Some(500),
            ..Default::default()
        }],
    );
    bodies.push(chat(token.clone()).await);
    sluice::cli::token_revoke(&db, issued.id, chrono::Utc::now())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    bodies.push(chat(token.clone()).await);
    for path in ["/metrics", "/healthz", "/readyz"] {
        bodies.push(get_text(&http, format!("{}{path}", g.url)).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(g);
    let hash = hex::encode(sluice::auth::token::hash(&token));
    let mut haystacks: Vec<(String, Vec<u8>)> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, b)| (format!("response {i}"), b.into_bytes()))
        .collect();
    // On PostgreSQL the database is no file of the folder: every value of every table.
    if let Some(text) = postgres_contents(&db).await {
        assert!(
            text.contains("gpt-4o-mini"),
            "the scan sees the request log"
        );
        haystacks.push(("the PostgreSQL database".into(), text.into_bytes()));
    }
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() && p.extension().is_none_or(|e| e != "toml") {
            haystacks.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    let log_size: usize = haystacks
        .iter()
        .filter(|(n, _)| n.ends_with(".log"))
        .map(|(_, b)| b.len())
        .sum();
    assert!(
        log_size > 10_000,
        "the trace log is not empty ({log_size} bytes)"
    );
    for secret in [token.as_str(), KEY_A] {
        let chars: Vec<char> = secret.chars().collect();
        for w in chars.windows(12) {
            let piece: String = w.iter().collect();
            for (name, hay) in &haystacks {
                assert!(
                    !String::from_utf8_lossy(hay).contains(&piece),
                    "{name} contains `{piece}`"
                );
            }
        }
    }
    for (name, hay) in &haystacks {
        assert!(
            !String::from_utf8_lossy(hay).contains(&hash),
            "{name} contains the token's SHA-256"
        );
    }
}

/// CHECKS Q14: a gateway stopped (SIGSTOP) for longer than the stale-owner window, next to
/// a live one on the same database, keeps its reservations: nothing of it is orphaned or
/// charged twice, and the request log agrees with the ledger for every request. On SQLite
/// its live pid says it is alive; on PostgreSQL its liveness lock, whose session its kernel
/// keeps while it is paused (`store::pg::processes`) — there its heartbeat is checked
/// stale by the database's clock, and the neighbour has beaten (and so recovered orphans)
/// since, so the lock alone kept its reservations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_gateway_keeps_its_reservations() {
    let Rig {
        dir,
        mock,
        gateway: stalled,
        db,
    } = rig(&[]).await;
    let _neighbour = start_gateway(dir.path(), &mock).await;
    let token = issue(&db, "erin", "10").await.text;
    mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 1_500,
            ..Default::default()
        }),
    );
    let http = reqwest::Client::new();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (http, url, token) = (http.clone(), stalled.url.clone(), token.clone());
            tokio::spawn(async move { post(&http, &url, &token).await.0 })
        })
        .collect();
    let open = || sql_int(&db, "SELECT COUNT(*) FROM reservations");
    for _ in 0..100 {
        if open().await == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open().await, 3, "three requests hold reservations");
    let stalled_id: Option<String> = match db.postgres() {
        Some(pg) => Some(
            sqlx::query_scalar("SELECT owner FROM reservations LIMIT 1")
                .fetch_one(&pg.pool)
                .await
                .unwrap(),
        ),
        None => None,
    };
    let pid = stalled.child.id() as i32;
    // SAFETY: signals to our own child process.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Past the stale window (15 s) and the neighbour's next recovery tick (every 5 s).
    tokio::time::sleep(Duration::from_secs(22)).await;
    let orphaned = || sql_int(&db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'");
    if let (Some(pg), Some(stalled_id)) = (db.postgres(), &stalled_id) {
        // The stalled one's last beat, and the neighbour's latest, by the database's clock.
        // (No row: it was pruned as gone — the assertions below say what that cost.)
        let beats = || async {
            let row: Option<(bool, f64)> = sqlx::query_as(
                "SELECT s.seen_at < clock_timestamp() - interval '15 seconds',
                        EXTRACT(EPOCH FROM n.seen_at - s.seen_at)::float8
                 FROM processes s, processes n
                 WHERE s.id = $1 AND n.id <> s.id",
            )
            .bind(stalled_id)
            .fetch_optional(&pg.pool)
            .await
            .unwrap();
            row.unwrap_or((true, f64::INFINITY))
        };
        // A neighbour's beat 21 s after the stalled one's last: its recovery (right after a
        // beat) has run at least once after the stalled one's heartbeat was stale.
        let bound = std::time::Instant::now() + Duration::from_secs(30);
        while beats().await.1 < 21.0 {
            assert!(
                std::time::Instant::now() < bound,
                "the neighbour stopped beating"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(beats().await.0, "the stalled gateway's heartbeat is stale");
    }
    assert_eq!(
        open().await,
        3,
        "the neighbour orphaned a stopped gateway's reservations"
    );
    assert_eq!(orphaned().await, 0);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    mock.state.sticky(KEY_A, None);
    assert_eq!(post(&http, &stalled.url, &token).await.0, 200);
    for _ in 0..250 {
        if open().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        orphaned().await,
        0,
        "a stopped gateway's reservations orphaned"
    );
    assert_eq!(sql_int(&db, "SELECT COUNT(*) FROM orphaned").await, 0);
    // Every answer's log row is written (lingering batches), then books are compared.
    for _ in 0..250 {
        let rows = sql_int(&db, "SELECT COUNT(*) FROM requests").await;
        if rows >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_invariant_on(&db).await;
    // Charged once: the token's spend is what the request log says its four requests cost.
    let spent = sql_int(&db, "SELECT limit_micros - remaining_micros FROM tokens").await;
    let logged = sql_int(&db, "SELECT SUM(cost_micros) FROM requests").await;
    assert_eq!(
        sql_int(&db, "SELECT COUNT(*) FROM requests WHERE status = 200").await,
        4
    );
    assert_eq!(spent, logged, "charged twice");
}

/// The heap-release thread runs in the binary (`ops::memory`): the start-up's free heap
/// goes back at its first rest, two quiet seconds in, and `/metrics` counts the trim by its
/// rule. Scraped once a second: a scrape is no request answered, and costs the second
/// little CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_ups_free_heap_goes_back_at_rest_and_is_counted() {
    let r = rig(&[]).await;
    let http = reqwest::Client::new();
    let trimmed_at_rest = |text: &str| {
        text.lines()
            .any(|l| l.starts_with("gateway_heap_trims_total{rule=\"rest\"} "))
    };
    let mut text = String::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        text = get_text(&http, format!("{}/metrics", r.gateway.url)).await;
        if trimmed_at_rest(&text) {
            break;
        }
    }
    assert!(
        trimmed_at_rest(&text),
        "no rest trim counted in 20 s:\n{text}"
    );
}

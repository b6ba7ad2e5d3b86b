//! Real clocks that disagree (CHECKS Q12, R3): gateway processes whose system clock is
//! moved with libfaketime (`LD_PRELOAD`, Debian's `faketime` package; monotonic time left
//! alone), so every clock the process reads — the budget periods', the limiter's, the
//! heartbeat's — is skewed, not a test double only one module uses.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sluice::mock::{MockConfig, MockServer, Script};
use sluice::quota::pricing;

use crate::gateway_proc::{db_and_token, open_dir_db};
use crate::helpers::*;
use crate::processes::{start_gateway_full, Gateway};

/// The environment that runs a process `offset` ahead of the real clock (behind if
/// negative).
pub(crate) fn skewed(offset: chrono::Duration) -> Vec<(&'static str, String)> {
    let lib = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1"))
        .find(|p| std::path::Path::new(p).exists())
        .expect("libfaketime (Debian's faketime package; scripts/test-deps.sh installs it)");
    let secs = offset.num_milliseconds() as f64 / 1000.0;
    vec![
        ("LD_PRELOAD", lib),
        ("FAKETIME", format!("{secs:+.3}")),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ("FAKETIME_NO_CACHE", "1".into()),
    ]
}

async fn start(
    dir: &std::path::Path,
    mock: &MockServer,
    offset: chrono::Duration,
    extra: &str,
) -> Gateway {
    let env = skewed(offset);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    start_gateway_full(dir, mock, &env, extra).await
}

async fn post(http: &reqwest::Client, url: &str, token: &str) -> u16 {
    http.post(format!("{url}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&chat_body(100))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Two gateways on one folder, the second's clock `ahead_s` seconds ahead; a token `name`
/// with a $10 budget; the upstream holding every request `delay_ms`.
struct Skewed {
    _dir: tempfile::TempDir,
    _mock: MockServer,
    right: Gateway,
    ahead: Gateway,
    db: sluice::store::Db,
    token: String,
}

impl Skewed {
    async fn start(ahead_s: i64, name: &str, delay_ms: u64) -> Skewed {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
        let right = start(dir.path(), &mock, chrono::Duration::zero(), "").await;
        let ahead = start(dir.path(), &mock, chrono::Duration::seconds(ahead_s), "").await;
        let (db, token) = db_and_token(dir.path(), name).await;
        mock.state.sticky(
            KEY_A,
            Some(Script {
                delay_ms,
                ..Default::default()
            }),
        );
        Skewed {
            _dir: dir,
            _mock: mock,
            right,
            ahead,
            db,
            token,
        }
    }
}

/// Three requests with `token` to `gw`, in flight together: each one's status.
fn three_requests(gw: &Gateway, token: &str) -> Vec<tokio::task::JoinHandle<u16>> {
    let http = reqwest::Client::new();
    (0..3)
        .map(|_| {
            let (http, url, token) = (http.clone(), gw.url.clone(), token.to_string());
            tokio::spawn(async move { post(&http, &url, &token).await })
        })
        .collect()
}

/// Q12: two gateways on one database whose clocks are a second apart, traffic straddling a
/// day boundary on both: each day's spend is at most its limit, every request the budget
/// allowed is admitted, and the token is reset exactly once per boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_a_second_apart_straddle_a_day_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    // The boundary: a midnight two days ahead, reached by gateway A 10 s after it starts.
    let real = Utc::now();
    let boundary: DateTime<Utc> = (real.date_naive() + chrono::Days::new(2))
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc();
    let offset_a = boundary - chrono::Duration::seconds(10) - real;
    let offset_b = offset_a - chrono::Duration::seconds(1);
    let a = start(dir.path(), &mock, offset_a, "").await;
    let b = start(dir.path(), &mock, offset_b, "").await;
    let db = open_dir_db(dir.path()).await;
    // Each request costs exactly its worst case; the budget covers 10 a day.
    let (input, per) = chat_worst_case(100);
    mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(input),
            completion_tokens: Some(100),
            ..Default::default()
        }),
    );
    let args = sluice::cli::IssueArgs {
        budget_usd: Some(&pricing::usd(10 * per)),
        reset: Some("daily"),
        ..issue_args("quinn")
    };
    let token = sluice::cli::token_issue(&db, &args, real).await.unwrap();
    // From 3 s before the boundary (A's clock) to 5 s after, one request every 50 ms,
    // alternating between the gateways.
    let a_now = || Utc::now() + offset_a;
    while a_now() < boundary - chrono::Duration::seconds(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let http = reqwest::Client::new();
    let urls = Arc::new([a.url.clone(), b.url.clone()]);
    let mut tasks = Vec::new();
    let mut i = 0;
    while a_now() < boundary + chrono::Duration::seconds(5) {
        let (http, urls, text) = (http.clone(), urls.clone(), token.text.clone());
        tasks.push(tokio::spawn(async move {
            post(&http, &urls[i % 2], &text).await
        }));
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(ok, 20, "10 on each day, no more, no less");
    // Each period's spend within the limit; one reset into each period.
    let by_day: Vec<(String, i64)> = sql_rows(
        &db,
        &format!(
            "SELECT period, CAST(SUM(amount_micros) AS BIGINT) FROM ledger WHERE token_id = {} AND kind IN ('reserve', 'settle', 'adjust') GROUP BY period ORDER BY period",
            token.id
        ),
    )
    .await;
    let day = |d: DateTime<Utc>| d.format("%Y-%m-%d").to_string();
    let before = day(boundary - chrono::Duration::seconds(1));
    assert_eq!(
        by_day,
        [(before.clone(), 10 * per), (day(boundary), 10 * per)]
    );
    let resets: Vec<(String, i64)> = sql_rows(
        &db,
        &format!(
            "SELECT after, COUNT(*) FROM audit_log WHERE action = 'budget.period_reset' AND target = 'token:{}' GROUP BY after ORDER BY after",
            token.id
        ),
    )
    .await;
    assert_eq!(
        resets,
        [(before, 1), (day(boundary), 1)],
        "one reset per boundary"
    );
    assert_invariant_on(&db).await;
}

/// R3: two gateways sharing one Redis, the second's system clock 45 s ahead: together
/// they admit exactly the limit (the windows run on Redis's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_with_skewed_clocks_share_one_limit() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    // A generous Redis timeout (`gateway_fleet::TIMEOUT_MS`): a window call that outlives
    // the default 50 ms on a loaded machine falls back to local windows, which admit the
    // limit on each gateway — the documented fallback, not what this test is about.
    let extra = format!(
        "[redis]\nurl = \"{}\"\n[ratelimit]\nwindow_seconds = 60\nredis_timeout_ms = {}\n",
        redis.url(),
        crate::gateway_fleet::TIMEOUT_MS
    );
    let a = start(dir.path(), &mock, chrono::Duration::zero(), &extra).await;
    let b = start(dir.path(), &mock, chrono::Duration::seconds(45), &extra).await;
    let db = open_dir_db(dir.path()).await;
    let args = sluice::cli::IssueArgs {
        rpm: Some(20),
        ..issue_args("carol")
    };
    let token = sluice::cli::token_issue(&db, &args, Utc::now())
        .await
        .unwrap()
        .text;
    let http = reqwest::Client::new();
    let urls = Arc::new([a.url.clone(), b.url.clone()]);
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (http, urls, token) = (http.clone(), urls.clone(), token.clone());
            tokio::spawn(async move { post(&http, &urls[i % 2], &token).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let mut logs = String::new();
    for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".log") {
            logs += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
    }
    assert!(
        !logs.contains("rate limiting degraded"),
        "Redis outlived the timeout, the windows fell back to local ones:\n{logs}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        20,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 20);
}

/// Two gateways on one database, the second's clock 45 s ahead (an NTP failure on one
/// host): neither takes the other for gone while both beat. Requests on the gateway with
/// the right clock, each held by the upstream across the other's orphan sweeps (every
/// 5 s), are never orphaned — a heartbeat written by one clock must not be judged stale by
/// another's — and every request is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_clock_runs_ahead_orphans_nothing_of_a_live_one() {
    let skew = Skewed::start(45, "olga", 7_000).await;
    let db = &skew.db;
    let tasks = three_requests(&skew.right, &skew.token);
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let bound = std::time::Instant::now() + Duration::from_secs(30);
    while sql_int(db, "SELECT COUNT(*) FROM requests").await < 3 {
        assert!(std::time::Instant::now() < bound, "the log rows never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sql_int(db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await,
        0,
        "live requests were settled as orphans by the gateway whose clock runs ahead"
    );
    assert_invariant_on(db).await;
}

/// The other side of the same rule: a gateway whose clock runs a minute ahead is killed
/// (`kill -9`) with requests in flight; the one with the right clock recovers its
/// reservations as it would any crashed host's — on PostgreSQL once the heartbeat has not
/// moved for 15 s, not once the real time has caught up with a stamp a minute in the future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_gateway_whose_clock_ran_ahead_is_recovered_in_time() {
    let mut skew = Skewed::start(60, "pia", 60_000).await;
    let db = &skew.db;
    let tasks = three_requests(&skew.ahead, &skew.token);
    let open = || sql_int(db, "SELECT COUNT(*) FROM reservations");
    let bound = std::time::Instant::now() + Duration::from_secs(20);
    while open().await < 3 {
        assert!(
            std::time::Instant::now() < bound,
            "the requests never reserved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    skew.ahead.child.kill().unwrap();
    let _ = skew.ahead.child.wait();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 0, "cut by the kill");
    }
    // 15 s unmoved, found at a sweep 5 s apart, with room for a loaded machine; the stamp
    // a minute ahead would take 75 s.
    let bound = std::time::Instant::now() + Duration::from_secs(45);
    while open().await > 0 {
        assert!(
            std::time::Instant::now() < bound,
            "the crashed gateway's reservations are still held"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        sql_int(db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await,
        3
    );
    assert_invariant_on(db).await;
}

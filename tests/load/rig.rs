//! What the load tests share: one test at a time, a raised open-file limit, a gateway
//! process on a fresh database with tokens issued, and what `/proc` says about it.

use std::time::Duration;

use sluice::mock::{MockConfig, MockServer};

use crate::gateway_proc::{start_gateway_full, Gateway};
use crate::helpers::*;

/// Held by each load test for its whole run: they measure one gateway at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes the load lock (no poisoning: a failed test does not fail the next) and raises
/// this process's soft open-file limit to the hard one — a thousand streams are two
/// thousand sockets here (client and in-process mock) — which the gateway child inherits.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().await;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit / setrlimit read and write a struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    guard
}

/// The soft open-file limit now.
pub fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur
}

/// One gateway process (two workers) on a fresh database, its mock, and `tokens` tokens
/// with a budget of `budget_usd` each, over as many users.
pub struct LoadRig {
    _dir: tempfile::TempDir,
    pub mock: MockServer,
    pub gateway: Gateway,
    pub db: sluice::store::Db,
    pub tokens: Vec<String>,
}

impl LoadRig {
    pub async fn start(extra: &str, tokens: usize, budget_usd: &str) -> LoadRig {
        Self::start_with(|_| extra.to_string(), &[], tokens, budget_usd, None).await
    }

    /// `extra` config (given the mock, for more upstreams on it), more environment
    /// (`SLUICE_SECTION_KEY` overrides), and tokens with windows of `rpm` requests (and
    /// 10 000 tokens per request) a minute when given.
    pub async fn start_with(
        extra: impl FnOnce(&MockServer) -> String,
        env: &[(&str, &str)],
        tokens: usize,
        budget_usd: &str,
        rpm: Option<i64>,
    ) -> LoadRig {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
        let extra = extra(&mock);
        let mut env = env.to_vec();
        env.push(("SLUICE_SERVER_WORKERS", "2"));
        let gateway = start_gateway_full(dir.path(), &mock, &env, &extra).await;
        let db = sluice::store::Db::open(&dir.path().join("sluice.db"), false)
            .await
            .unwrap();
        let mut texts = Vec::new();
        for i in 0..tokens {
            let user = format!("load-{i}");
            let args = sluice::cli::IssueArgs {
                budget_usd: Some(budget_usd),
                rpm,
                tpm: rpm.map(|r| r * 10_000),
                ..issue_args(&user)
            };
            let t = sluice::cli::token_issue(&db, &args, chrono::Utc::now())
                .await
                .unwrap();
            texts.push(t.text);
        }
        LoadRig {
            _dir: dir,
            mock,
            gateway,
            db,
            tokens: texts,
        }
    }

    pub fn pid(&self) -> u32 {
        self.gateway.child.id()
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.db.sqlite().read)
            .await
            .expect(sql)
    }

    /// Waits (bounded: 60 s) until the request log holds `n` rows and nothing is reserved
    /// any more, then checks DESIGN's money invariant; fails with the counts otherwise.
    pub async fn settled_and_logged(&self, n: i64) {
        let mut last = (0, 0);
        for _ in 0..600 {
            last = (
                self.scalar("SELECT COUNT(*) FROM requests").await,
                self.scalar("SELECT COUNT(*) FROM reservations").await,
            );
            if last.0 >= n && last.1 == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            last,
            (n, 0),
            "60 s after the load: (request-log rows, open reservations) — every request has \
             exactly one row and nothing stays reserved"
        );
        let reserved = self
            .scalar("SELECT COALESCE(SUM(reserved_micros), 0) FROM tokens")
            .await;
        assert_eq!(reserved, 0, "reserved_micros summed over every token");
        assert_invariant_on(&self.db).await;
    }
}

/// A chat request (`body`, by `token`) to `url`: the body of its 200 answer, else what went
/// wrong (no answer, a broken body, or another status and its body).
pub async fn post_for_200(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: &serde_json::Value,
) -> Result<Vec<u8>, String> {
    let resp = http
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.map_err(|e| format!("body broke: {e}"))?;
    if status != 200 {
        return Err(format!("{status} {}", String::from_utf8_lossy(&bytes)));
    }
    Ok(bytes.to_vec())
}

/// A number from `/proc/PID/status` (kB for memory lines).
pub fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Resident memory now and at its peak, in MiB.
pub fn rss_mib(pid: u32) -> (u64, u64) {
    (
        status_field(pid, "VmRSS") / 1024,
        status_field(pid, "VmHWM") / 1024,
    )
}

/// Open file descriptors of the process.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Polls (1 s samples, at most `tries`) until the process uses fewer than `below` CPU ticks
/// in a second; returns every sample. A busy loop uses ~100 a second.
pub async fn until_idle(pid: u32, below: u64, tries: usize) -> Vec<u64> {
    let mut samples = Vec::new();
    for _ in 0..tries {
        let t = crate::gateway_proc::ticks_in_a_second(pid).await;
        samples.push(t);
        if t < below {
            break;
        }
    }
    samples
}

/// The `p`-th percentile (0..=100) of `v` (sorted in place), nearest rank.
pub fn percentile(v: &mut [Duration], p: usize) -> Duration {
    assert!(!v.is_empty());
    v.sort_unstable();
    let rank = (p * v.len()).div_ceil(100).max(1);
    v[rank - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

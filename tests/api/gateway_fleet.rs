//! Gateway processes sharing one database and one Redis topology, for the cluster and
//! Sentinel window tests: tokens, bursts spread over the gateways, and answers checked to be
//! a 200 or a window's 429 and nothing else.

use std::time::Duration;

use serde_json::Value;
use sluice::mock::{MockConfig, MockServer};

use crate::helpers::*;
use crate::processes::{start_gateway_full, Gateway};

/// Generous: a window call that outlives it falls back to the local window, which would make
/// an exactness assertion fail on a loaded machine rather than show a real over-admission.
pub const TIMEOUT_MS: u64 = 1000;

/// Gateway processes on one database and one Redis topology (`redis`: a `[redis]` table).
pub struct Fleet {
    _dir: tempfile::TempDir,
    _mock: MockServer,
    pub gateways: Vec<Gateway>,
    pub db: sluice::store::Db,
}

pub async fn fleet(n: usize, redis: &str) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let extra = format!("{redis}\n[ratelimit]\nredis_timeout_ms = {TIMEOUT_MS}\n");
    let mut gateways = Vec::new();
    for _ in 0..n {
        gateways.push(start_gateway_full(dir.path(), &mock, &[], &extra).await);
    }
    let db = crate::gateway_proc::open_dir_db(dir.path()).await;
    Fleet {
        _dir: dir,
        _mock: mock,
        gateways,
        db,
    }
}

impl Fleet {
    /// The gateways' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self._dir.path()).unwrap().flatten() {
            if e.file_name().to_string_lossy().ends_with(".log") {
                out += &std::fs::read_to_string(e.path()).unwrap_or_default();
            }
        }
        out
    }

    /// No gateway thread panicked (a panic in the Redis client's routing task leaves its
    /// connection dead while the gateway looks alive).
    pub fn assert_no_panic(&self) {
        let logs = self.logs();
        assert!(!logs.contains("panicked"), "{logs}");
    }

    /// A token of `user` (created when missing) with `rpm` requests per minute.
    pub async fn token(&self, user: &str, rpm: i64) -> sluice::cli::Issued {
        let args = sluice::cli::IssueArgs {
            rpm: Some(rpm),
            ..issue_args(user)
        };
        sluice::cli::token_issue(&self.db, &args, chrono::Utc::now())
            .await
            .unwrap()
    }

    pub async fn user_id(&self, token_id: i64) -> i64 {
        sql_int(
            &self.db,
            &format!("SELECT user_id FROM tokens WHERE id = {token_id}"),
        )
        .await
    }

    /// `n` requests at once, spread over every gateway: how many were admitted. Each is
    /// answered (bounded), 200 or 429 `rate_limit_exceeded` with `Retry-After`, nothing else.
    pub async fn burst(&self, token: &str, n: usize) -> usize {
        let http = reqwest::Client::new();
        let mut tasks = Vec::new();
        for i in 0..n {
            let url = self.gateways[i % self.gateways.len()].url.clone();
            let (http, token) = (http.clone(), token.to_string());
            tasks.push(tokio::spawn(
                async move { answer(&http, &url, &token).await },
            ));
        }
        let mut admitted = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(true) => admitted += 1,
                Ok(false) => {}
                Err(e) => panic!("{e}\n{}", self.logs()),
            }
        }
        admitted
    }

    /// One request to gateway `g`: admitted or refused by a window (anything else fails).
    pub async fn one(&self, g: usize, token: &str) -> bool {
        ask(&reqwest::Client::new(), &self.gateways[g].url, token).await
    }
}

/// Bounds a request that must be answered: it only turns a hang into a failure.
pub const BOUND: Duration = Duration::from_secs(15);

pub async fn ask(http: &reqwest::Client, url: &str, token: &str) -> bool {
    answer(http, url, token)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One request: `Ok(admitted)` for a 200 or a window's 429 (checked: code, `Retry-After`),
/// `Err` with the status and body for anything else.
pub async fn answer(http: &reqwest::Client, url: &str, token: &str) -> Result<bool, String> {
    let resp = tokio::time::timeout(
        BOUND,
        http.post(format!("{url}/v1/chat/completions"))
            .bearer_auth(token)
            .json(&chat_body(20))
            .send(),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    let status = resp.status().as_u16();
    let retry_after = resp.headers().contains_key("retry-after");
    let body: Value = resp.json().await.unwrap();
    match status {
        200 => Ok(true),
        429 if body["error"]["code"] == "rate_limit_exceeded" && retry_after => Ok(false),
        s => Err(format!("{s}: {body}")),
    }
}

/// `sl:v2:{u:<user>}:t:<token>:rq`: the token's request window in Redis.
pub fn token_rq_key(user: i64, token: i64) -> String {
    sluice::ratelimit::redis_window::RedisWindows::window_keys(&[
        sluice::ratelimit::WindowSpec::token(user, token, 1, 0),
    ])[0]
        .clone()
}

//! `spawn_app()`: the real application on a free port, a fresh database in a temp dir (a
//! SQLite file, or with `TEST_STORE=postgres` a fresh database on the shared
//! PostgreSQL server — `make test` runs the suite both ways), and an in-process `sluice
//! mock` upstream — one of each per test, so tests run in parallel.

use std::sync::Arc;

use secrecy::SecretString;
use serde_json::{json, Value};
use sluice::cli::{self, IssueArgs};
use sluice::clock::Clock;
use sluice::config::{ModelSettings, Provider, RouteSettings, Secret, Settings, UpstreamSettings};
use sluice::mock::{MockConfig, MockServer};
use sluice::startup::Application;
use sluice::state::AppState;
use sluice::store::ledger::Owner;
use sluice::store::Db;

use crate::pg_gateway_app::{on_postgres, Engine};

/// The upstream keys of the test config: a canary that must never leak.
pub const KEY_A: &str = "sk-upstream-canary-key-A-7f3a9c";
pub const KEY_B: &str = "sk-upstream-canary-key-B-1d2e3f";

pub struct TestApp {
    pub address: String,
    pub mock: MockServer,
    pub state: Arc<AppState>,
    pub settings: Settings,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
}

pub fn upstream(id: &str, key: &str, mock: &MockServer) -> UpstreamSettings {
    UpstreamSettings {
        id: id.into(),
        provider: Provider::Openai,
        base_url: format!("{}/v1", mock.base_url()),
        api_key: Secret(SecretString::from(key.to_string())),
        rpm_limit: 0,
        tpm_limit: 0,
        max_concurrent: 0,
        max_queue: 0,
        allow_private_network: true,
        ..Default::default()
    }
}

/// A route to `upstream`'s `model`.
pub fn route(upstream: &str, model: &str) -> RouteSettings {
    RouteSettings {
        upstream: upstream.into(),
        model: model.into(),
        output_cap_param: None,
        deployment: None,
        tier_model: None,
    }
}

pub fn model(name: &str, upstreams: &[&str]) -> ModelSettings {
    ModelSettings {
        name: name.into(),
        aliases: vec![],
        routes: upstreams
            .iter()
            .map(|u| route(u, &format!("{name}-upstream")))
            .collect(),
        fallbacks: vec![],
        price: sluice::config::PriceKeys::usd(0.15, 0.60),
        prices: vec![],
        free: false,
        max_output_tokens: 4096,
        max_input_tokens: 128_000,
        cache_similarity_threshold: None,
        cache_ignore_identifiers: None,
    }
}

/// The default test config: one upstream key (`a`), `gpt-4o-mini` (alias `mini`) and an
/// embedding model routed to it.
pub fn test_settings(dir: &std::path::Path, mock: &MockServer) -> Settings {
    let mut s = Settings::default();
    s.server.listen = "127.0.0.1:0".into();
    s.server.workers = 2;
    // The mock is on loopback: managed upstreams on it opt in, as config ones do.
    s.upstream.managed_allow_private_network = true;
    s.database.url = format!("sqlite://{}", dir.join("sluice.db").display());
    // The audit head lives in the backup folder: each test's own, never the repository's.
    s.backup.dir = dir.join("backup").display().to_string();
    s.upstreams = vec![upstream("a", KEY_A, mock)];
    let mut mini = model("gpt-4o-mini", &["a"]);
    mini.aliases = vec!["mini".into()];
    s.models = vec![mini, model("text-embedding-3-small", &["a"])];
    s.retry.base_delay_ms = 20;
    s
}

/// The engine this run of the suite puts its apps on: `TEST_STORE=postgres` for
/// PostgreSQL, SQLite otherwise. Tests that pin an engine (`on_both_engines!`, `pg_*`) or
/// set `[database] url` themselves are not moved by it.
pub fn test_engine() -> Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    *ENGINE.get_or_init(|| match std::env::var("TEST_STORE").as_deref() {
        Ok("postgres") => Engine::Postgres,
        Ok("sqlite") | Err(_) => Engine::Sqlite,
        Ok(other) => panic!("TEST_STORE={other}: expected sqlite or postgres"),
    })
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_, _| {}).await
}

/// An upstream of `provider` on the mock speaking that provider's own API (Anthropic's,
/// Gemini's): its base URL is the mock's root, not OpenAI's `/v1`.
pub fn native_upstream(
    provider: Provider,
    id: &str,
    key: &str,
    mock: &MockServer,
) -> UpstreamSettings {
    UpstreamSettings {
        provider,
        base_url: mock.base_url(),
        ..upstream(id, key, mock)
    }
}

/// A Bedrock upstream `id` on the mock, signing with the access key `key` (what the mock
/// scripts it by).
pub fn bedrock_upstream(id: &str, key: &str, mock: &MockServer) -> UpstreamSettings {
    UpstreamSettings {
        id: id.into(),
        provider: Provider::Bedrock,
        base_url: mock.base_url(),
        api_key: Secret::default(),
        region: Some("us-east-1".into()),
        access_key_id: Some(key.into()),
        secret_access_key: Some(Secret(SecretString::from("bedrock-test-secret"))),
        allow_private_network: true,
        ..UpstreamSettings::default()
    }
}

/// An app with an Anthropic model `claude` (upstream `c`, key B, on the same mock, serving
/// `claude-upstream`) beside the OpenAI `gpt-4o-mini`.
pub async fn spawn_app_with_claude() -> TestApp {
    spawn_app_with(add_claude).await
}

/// Adds `spawn_app_with_claude`'s Anthropic model `claude` (upstream `c`, key B).
pub fn add_claude(s: &mut Settings, m: &MockServer) {
    s.upstreams
        .push(native_upstream(Provider::Anthropic, "c", KEY_B, m));
    s.models.push(model("claude", &["c"]));
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut Settings, &MockServer)) -> TestApp {
    spawn_app_full(tweak, None).await
}

pub async fn spawn_app_full(
    tweak: impl FnOnce(&mut Settings, &MockServer),
    clock: Option<Arc<dyn Clock>>,
) -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).expect("mock");
    let mut settings = test_settings(dir.path(), &mock);
    if test_engine() == Engine::Postgres {
        on_postgres(&mut settings, dir.path());
    }
    tweak(&mut settings, &mock);
    let app = match clock {
        Some(c) => Application::build_with_clock(settings.clone(), c).await,
        None => Application::build(settings.clone()).await,
    }
    .expect("app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        mock,
        state,
        settings,
        dir,
        http: http_client(),
    }
}

/// The body of a GET of `url` as text (a page, `/metrics`); panics when the request fails.
pub async fn get_text(http: &reqwest::Client, url: String) -> String {
    http.get(url).send().await.unwrap().text().await.unwrap()
}

/// The tests' HTTP client. An idle connection is dropped well before the gateway's
/// keep-alive (actix's 5 s) would close it: reusing one the server is closing at that
/// instant fails the request with `IncompleteMessage`, which a loaded test run met.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .expect("the test client builds")
}

pub fn issue_args(user: &str) -> IssueArgs<'_> {
    IssueArgs {
        user,
        budget_usd: None,
        reset: None,
        expires: None,
        rpm: None,
        tpm: None,
        models: None,
        max_priority: 2,
        downgrade_model: None,
    }
}

/// What [`TestApp::token_in_team`] made: the team's id and the token's text.
pub struct InTeam {
    pub team_id: i64,
    pub text: String,
}

impl TestApp {
    pub fn db(&self) -> &Db {
        &self.state.db
    }

    /// Issues a token; returns (id, text).
    pub async fn issue(&self, args: IssueArgs<'_>) -> (i64, String) {
        let t = cli::token_issue(self.db(), &args, chrono::Utc::now())
            .await
            .expect("token issued");
        (t.id, t.text)
    }

    pub async fn token(&self, user: &str, budget_usd: Option<&str>) -> (i64, String) {
        self.issue(IssueArgs {
            budget_usd,
            ..issue_args(user)
        })
        .await
    }

    /// A new team (with `team_tags`), a user of it named `token.user` and a token of
    /// theirs (with `token_tags`): the "someone in another team" every cross-tenant test
    /// needs, written once.
    pub async fn token_in_team(
        &self,
        team: &str,
        team_tags: Option<&str>,
        token: IssueArgs<'_>,
        token_tags: Option<&str>,
    ) -> InTeam {
        let now = chrono::Utc::now();
        let team_id = cli::team_create_tagged(self.db(), team, None, team_tags, now)
            .await
            .expect("team created");
        let user = cli::UserArgs {
            username: token.user,
            team: Some(team),
            rpm: None,
            tpm: None,
            budget_usd: None,
            reset: None,
        };
        cli::user_create(self.db(), &user, now)
            .await
            .expect("user created");
        let issued = cli::token_issue_tagged(self.db(), &token, token_tags, now)
            .await
            .expect("token issued");
        InTeam {
            team_id,
            text: issued.text,
        }
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.address))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn chat(&self, token: &str, body: &Value) -> reqwest::Response {
        self.post("/v1/chat/completions", token, body).await
    }

    /// Rests `upstream`'s key no more (its cooldown and 429 streak cleared, as an admin's
    /// enable does), for a test whose cases each fail a stream on one key: a stream that
    /// fails after its 200 rests or counts against its key (s26 attack, streams F2), and
    /// each case must start on a key ready to serve.
    pub fn rest_no_more(&self, upstream: &str) {
        let d = self
            .state
            .catalog()
            .position(upstream)
            .expect("the upstream");
        self.state.pool().enable(d);
    }

    /// An Anthropic Messages request, with the key in `x-api-key` as Anthropic's SDKs send it.
    pub async fn messages(&self, token: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/messages", self.address))
            .header("x-api-key", token)
            .header("anthropic-version", "2023-06-01")
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// `body` sent to `path` as that endpoint's clients send it: Anthropic's Messages with
    /// the key in `x-api-key`, every other endpoint with a bearer token.
    pub async fn send(&self, path: &str, token: &str, body: &Value) -> reqwest::Response {
        if path == "/v1/messages" {
            self.messages(token, body).await
        } else {
            self.post(path, token, body).await
        }
    }

    /// `send` with Claude's 1M-token window turned on (`anthropic-beta:
    /// context-1m-2025-08-07`): without it Claude refuses a prompt past 200 000 tokens, so
    /// a long-context tier above that is out of reach (`long_context::provider_may_count`).
    pub async fn send_1m(&self, path: &str, token: &str, body: &Value) -> reqwest::Response {
        let req = self
            .http
            .post(format!("{}{path}", self.address))
            .header("anthropic-beta", "context-1m-2025-08-07");
        let req = if path == "/v1/messages" {
            req.header("x-api-key", token)
                .header("anthropic-version", "2023-06-01")
        } else {
            req.bearer_auth(token)
        };
        req.json(body).send().await.expect("request sent")
    }

    /// A chat request with its own deadline (`x-sluice-request-deadline-ms`).
    pub async fn chat_with_deadline(
        &self,
        token: &str,
        body: &Value,
        ms: u64,
    ) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.address))
            .bearer_auth(token)
            .header("x-sluice-request-deadline-ms", ms.to_string())
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// The text of `/metrics`.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.address))
            .send()
            .await
            .expect("metrics answered")
            .text()
            .await
            .expect("metrics read")
    }

    /// Waits until the request log holds `n` rows (it is written off the request path).
    pub async fn wait_for_log_rows(&self, n: i64) {
        self.state.request_log.flush().await;
        for _ in 0..100 {
            if self.scalar("SELECT COUNT(*) FROM requests").await >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("request log never reached {n} rows");
    }

    /// Waits until the request log holds a row of token `id` (written after the
    /// settlement, off the request path: a flush alone can come before it is queued).
    pub async fn wait_for_row_of(&self, id: i64) {
        for _ in 0..250 {
            self.state.request_log.flush().await;
            let sql = format!("SELECT COUNT(*) FROM requests WHERE token_id = {id}");
            if self.scalar(&sql).await > 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the request log never held a row of token {id}");
    }

    /// Waits until the cache table holds `n` entries (they are written off the request
    /// path; the replica's memory has them before the table does).
    pub async fn wait_for_cache_entries(&self, n: i64) {
        for _ in 0..250 {
            self.state.cache.flush().await;
            if self.scalar("SELECT COUNT(*) FROM cache_entries").await >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the cache never held {n} entries");
    }

    /// Micro-USD the gateway absorbed (charged to no one) so far.
    pub async fn absorbed(&self) -> i64 {
        self.scalar("SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE kind = 'absorbed'")
            .await
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        scalar_on(self.db(), sql).await
    }

    /// Waits until nothing is reserved any more (streams settle after the response).
    pub async fn wait_settled(&self) {
        for _ in 0..250 {
            if self.scalar("SELECT COUNT(*) FROM reservations").await == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("reservations still open after 5 s");
    }

    /// DESIGN.md's money invariant, for every level with a limit, plus no open reservation
    /// and a sound database file.
    pub async fn assert_invariant(&self) {
        self.wait_settled().await;
        assert_invariant_on(self.db()).await;
    }
}

/// The one integer `sql` selects, on whichever engine holds `db`.
pub async fn scalar_on(db: &Db, sql: &str) -> i64 {
    match db.postgres() {
        None => sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&db.sqlite().read)
            .await
            .expect(sql),
        // PostgreSQL's SUM of a BIGINT is a NUMERIC: the one value is cast back.
        Some(pg) => sqlx::query_scalar::<_, i64>(&format!("SELECT CAST(({sql}) AS BIGINT)"))
            .fetch_one(&pg.pool)
            .await
            .expect(sql),
    }
}

/// The one integer (or NULL, read as 0) `sql` selects, on whichever engine holds `db`
/// (`sql` is written in the SQL both read; a `SUM` is cast to `BIGINT` for PostgreSQL).
pub async fn sql_int(db: &Db, sql: &str) -> i64 {
    match db.postgres() {
        None => sqlx::query_scalar::<_, Option<i64>>(sql)
            .fetch_one(&db.sqlite().read)
            .await
            .expect(sql),
        Some(pg) => {
            sqlx::query_scalar::<_, Option<i64>>(&format!("SELECT CAST(({sql}) AS BIGINT)"))
                .fetch_one(&pg.pool)
                .await
                .expect(sql)
        }
    }
    .unwrap_or(0)
}

/// The one text `sql` selects, on whichever engine holds `db`.
pub async fn sql_text(db: &Db, sql: &str) -> String {
    match db.postgres() {
        None => sqlx::query_scalar::<_, String>(sql)
            .fetch_one(&db.sqlite().read)
            .await
            .expect(sql),
        Some(pg) => sqlx::query_scalar::<_, String>(sql)
            .fetch_one(&pg.pool)
            .await
            .expect(sql),
    }
}

/// Runs one statement on whichever engine holds `db`.
pub async fn sql_exec(db: &Db, sql: &str) {
    match db.postgres() {
        None => drop(
            sqlx::query(sql)
                .execute(&db.sqlite().write)
                .await
                .expect(sql),
        ),
        Some(pg) => drop(sqlx::query(sql).execute(&pg.pool).await.expect(sql)),
    }
}

/// The rows `sql` selects, on whichever engine holds `db`.
async fn rows_on<T>(db: &Db, sql: &str) -> Vec<T>
where
    T: Send + Unpin,
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    match db.postgres() {
        None => sqlx::query_as(sql).fetch_all(&db.sqlite().read).await,
        Some(pg) => sqlx::query_as(sql).fetch_all(&pg.pool).await,
    }
    .expect(sql)
}

/// DESIGN.md's money invariant on whichever engine holds `db`: per level with a limit,
/// `limit − remaining == Σ ledger` of its period and nothing reserved; the request log
/// and the ledger agree on every request's cost; the database is sound.
pub async fn assert_invariant_on(db: &Db) {
    for (table, id_col, period_col) in [
        ("tokens", "token_id", "period"),
        ("users", "user_id", "user_period"),
        ("teams", "team_id", "team_period"),
    ] {
        let sql = format!(
            "SELECT t.id, t.limit_micros - t.remaining_micros, t.reserved_micros,
                    CAST(COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.{id_col} = t.id AND l.{period_col} = t.period
                              AND l.kind IN ('reserve', 'settle', 'adjust')), 0) AS BIGINT)
             FROM {table} t WHERE t.limit_micros IS NOT NULL"
        );
        let rows: Vec<(i64, i64, i64, i64)> = rows_on(db, &sql).await;
        for (id, used, reserved, ledger) in rows {
            assert_eq!(
                used, ledger,
                "{table} {id}: limit − remaining must equal the ledger sum"
            );
            assert_eq!(reserved, 0, "{table} {id}: nothing may stay reserved");
        }
    }
    // The request log and the ledger agree on what every request cost.
    let disagree: Vec<(String, i64, i64)> = rows_on(
        db,
        "SELECT r.id, r.cost_micros, l.total FROM requests r
         JOIN (SELECT request_id, CAST(SUM(amount_micros) AS BIGINT) AS total FROM ledger
               WHERE kind IN ('reserve', 'settle', 'absorbed') AND request_id IS NOT NULL GROUP BY request_id) l
           ON l.request_id = r.id
         WHERE r.cost_micros <> l.total",
    )
    .await;
    assert!(
        disagree.is_empty(),
        "request log ≠ ledger (id, log, ledger): {disagree:?}"
    );
    assert_eq!(db.integrity_check().await.unwrap(), "ok");
}

/// `chat_body(max_tokens)`'s worst case at the test model's prices: the reserved input
/// tokens (counted, with the default margin) and the cost in micro-dollars. A mock that
/// reports exactly these tokens makes every answer cost its reservation.
pub fn chat_worst_case(max_tokens: i64) -> (i64, i64) {
    let counted = sluice::quota::estimate::chat_input(
        &[json!({"role": "user", "content": "Why does the engine light blink?"})],
        None,
    );
    let input = sluice::quota::pricing::input_with_margin(counted, 1.10, 16);
    let prices = sluice::quota::pricing::Prices::plain(150_000, 600_000);
    let usage = sluice::usage::Usage {
        input,
        output: max_tokens,
        ..Default::default()
    };
    (input, sluice::quota::pricing::cost(usage, prices))
}

pub fn chat_body(max_tokens: i64) -> Value {
    json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "Why does the engine light blink?"}]})
}

/// Reads an SSE body into its `data:` payloads.
pub async fn sse_data(resp: reqwest::Response) -> (Vec<String>, bool) {
    let text = match resp.text().await {
        Ok(t) => (t, true),
        Err(_) => (String::new(), false),
    };
    let data = text
        .0
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    (data, text.1)
}

/// The concatenated content deltas of OpenAI stream payloads.
pub fn reassemble(data: &[String]) -> String {
    data.iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

/// A chat request written by hand on a new connection to the gateway at `url` (with this
/// receive buffer when given, else the system's): the POST head, then `body`. Nothing is
/// read; the connection is the caller's, to read slowly, half-close or drop.
pub async fn send_raw_chat(
    url: &str,
    token: &str,
    body: &Value,
    rcvbuf: Option<u32>,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size).unwrap();
    }
    let mut conn = socket.connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    conn
}

/// A chat request of `body` on a new connection to the gateway at `url`, only its head and
/// the first half of its body sent: the gateway has authenticated it and waits for the
/// rest, returned for `finish_half_sent`. The head asks to close the connection after the
/// answer, so the answer is read to its end.
pub async fn half_sent_chat(
    url: &str,
    token: &str,
    body: &Value,
) -> (tokio::net::TcpStream, Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    let addr = url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string().into_bytes();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let (first, rest) = body.split_at(body.len() / 2);
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(first).await.unwrap();
    conn.flush().await.unwrap();
    (conn, rest.to_vec())
}

/// Sends the rest of a `half_sent_chat` and reads its answer: the status and the whole
/// response text (head and body).
pub async fn finish_half_sent(mut conn: tokio::net::TcpStream, rest: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(rest).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer}"));
    (status, answer)
}

/// `send_raw_chat` of a streamed `chat_body(100)`, then one read (up to 512 bytes) that must
/// begin with a 200 status line: the stream is open.
pub async fn open_raw_stream(url: &str, token: &str, rcvbuf: Option<u32>) -> tokio::net::TcpStream {
    use tokio::io::AsyncReadExt;
    let mut body = chat_body(100);
    body["stream"] = true.into();
    let mut conn = send_raw_chat(url, token, &body, rcvbuf).await;
    let mut buf = [0u8; 512];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    conn
}

/// TCP connections in state ESTABLISHED whose remote port is `port` (Linux's
/// `/proc/net/tcp*`; with the mock's port, the gateway's connections to it).
pub fn established_to(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    let remote_port = cols
                        .get(2)
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| u16::from_str_radix(p, 16).ok());
                    cols.get(3) == Some(&"01") && remote_port == Some(port)
                })
                .count()
        })
        .sum()
}

/// Waits until no connection to the app's mock is established any more: the gateway closed
/// its upstream connection (the mock itself notices only at its next write, which a stalled
/// or held answer never makes). The bound (10 s) only turns a connection left open into a
/// failure.
pub async fn upstream_closed(app: &TestApp) {
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while established_to(app.mock.port) > 0 {
        assert!(
            std::time::Instant::now() < bound,
            "the upstream connection was never closed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Another writer on the SQLite file at `path`, holding its write lock (`BEGIN IMMEDIATE`)
/// until the caller commits or drops it: the gateway's writes wait on it.
pub async fn hold_the_database(path: &std::path::Path) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    other
}

/// A stream's frames as `translate_wire::run_case` records them (`[event, data]`) ended by
/// the gateway's `upstream_error` event in `client`'s format — never `[DONE]`,
/// `message_stop` or `message_delta` — and that event.
pub fn assert_cut_by_an_error_event<'f>(
    frames: &'f [Value],
    client: &str,
    what: &str,
) -> &'f Value {
    assert!(
        !frames
            .iter()
            .any(|f| f[1] == "[DONE]" || f[0] == "message_stop" || f[0] == "message_delta"),
        "the stream ended as complete: {what}"
    );
    let last = frames.last().unwrap();
    if client == "anthropic" {
        assert_eq!(last[0], "error", "{what}");
        assert_eq!(last[1]["error"]["type"], "api_error", "{what}");
    } else {
        assert_eq!(last[1]["error"]["type"], "server_error", "{what}");
    }
    assert_eq!(last[1]["error"]["code"], "upstream_error", "{what}");
    last
}

/// An Anthropic stream's text ended by the gateway's error event because it held back
/// more of a tool call than its cap.
pub fn assert_ended_held_back(text: &str) {
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\n"), "{last}");
    assert!(last.contains("held back more"), "{last}");
}

/// A real `redis-server` on a free port, stopped when dropped.
pub struct RedisServer {
    pub port: u16,
    child: Option<std::process::Child>,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut r = RedisServer { port, child: None };
        r.restart().await;
        r
    }

    /// A `redis-server` started with other options (cluster mode), stopped when dropped.
    pub fn adopt(port: u16, child: std::process::Child) -> RedisServer {
        RedisServer {
            port,
            child: Some(child),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub async fn restart(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test-deps.sh)");
        self.child = Some(child);
        for _ in 0..100 {
            if self
                .cli(&["PING"])
                .await
                .is_some_and(|o| o.contains("PONG"))
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        panic!("redis-server did not start");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` (`-STOP`, `-CONT`) to the server: stopped, its connections stay open and
    /// nothing is answered for as long as the test wants.
    pub fn signal(&self, sig: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("the server runs")
            .id()
            .to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Runs a command through `redis-cli`; `None` if it failed.
    pub async fn cli(&self, args: &[&str]) -> Option<String> {
        let out = tokio::process::Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .output()
            .await
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A level's budget: limit (None = unlimited) and reset rule.
#[derive(Debug, Clone)]
pub struct Budget {
    pub limit: Option<i64>,
    pub reset: &'static str,
}

static NEXT_OWNER: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);

/// A team, user and token (ids fresh per call) with these budgets (token, user, team),
/// made directly in the store, for tests that drive `Quota` and the ledger themselves.
pub async fn budget_owner(db: &Db, levels: &[Budget; 3]) -> Owner {
    let id = NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let at = "2026-12-01T00:00:00.000Z";
    let [token, user, team] = levels;
    sqlx::query("INSERT INTO teams (id, name, limit_micros, remaining_micros, reset, created_at) VALUES (?, ?, ?, ?, ?, ?)")
        .bind(id)
        .bind(format!("team-{id}"))
        .bind(team.limit)
        .bind(team.limit)
        .bind(team.reset)
        .bind(at)
        .execute(&db.sqlite().write)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users (id, username, team_id, limit_micros, remaining_micros, reset, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
        .bind(id)
        .bind(format!("user-{id}"))
        .bind(id)
        .bind(user.limit)
        .bind(user.limit)
        .bind(user.reset)
        .bind(at)
        .execute(&db.sqlite().write)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tokens (id, user_id, token_hash, prefix, limit_micros, remaining_micros, reset, created_at)
         VALUES (?, ?, ?, 'abcdefgh', ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(id)
    .bind(id.to_be_bytes().to_vec())
    .bind(token.limit)
    .bind(token.limit)
    .bind(token.reset)
    .bind(at)
    .execute(&db.sqlite().write)
    .await
    .unwrap();
    let reset = |b: &Budget| sluice::quota::period::Reset::parse(b.reset).unwrap();
    Owner {
        token_id: id,
        user_id: id,
        team_id: id,
        resets: [reset(token), reset(user), reset(team)],
    }
}

/// A config naming the test gateway's database (on whichever engine it is) and backup
/// folder, for the real binary's CLI commands.
pub fn cli_config(app: &TestApp) -> std::path::PathBuf {
    let path = app.dir.path().join("cli.toml");
    if app.db().postgres().is_none() {
        return write_cli_config(
            &path,
            &app.settings.database_path(),
            std::path::Path::new(&app.settings.backup.dir),
        );
    }
    let key = app
        .settings
        .database
        .key_file
        .as_ref()
        .expect("a shared key file");
    std::fs::write(
        &path,
        format!(
            "[database]\nurl = \"{}\"\nkey_file = \"{}\"\n[backup]\ndir = \"{}\"\n",
            app.settings.database.url,
            key.display(),
            app.settings.backup.dir
        ),
    )
    .unwrap();
    path
}

/// Writes at `path` a config of only a SQLite database and a backup folder (what the CLI
/// needs).
pub fn write_cli_config(
    path: &std::path::Path,
    db: &std::path::Path,
    backup: &std::path::Path,
) -> std::path::PathBuf {
    std::fs::write(
        path,
        format!(
            "[database]\nurl = \"sqlite://{}\"\n[backup]\ndir = \"{}\"\n",
            db.display(),
            backup.display()
        ),
    )
    .unwrap();
    path.to_path_buf()
}

/// Sends `send` and leaves once the upstream has had `n` requests in all, `key`'s answers
/// held meanwhile: a client that left while the upstream worked on its request.
pub async fn leave_while_upstream_works(
    app: &TestApp,
    key: &str,
    n: u64,
    send: impl std::future::Future<Output = reqwest::Response>,
) {
    app.mock.state.sticky(
        key,
        Some(sluice::mock::Script {
            delay_ms: 3_600_000,
            ..sluice::mock::Script::default()
        }),
    );
    tokio::pin!(send);
    tokio::select! {
        _ = &mut send => panic!("answered while the upstream holds its answer"),
        _ = upstream_had(app, n) => {}
    }
}

/// Waits (bounded) until the mock has had `n` requests in all.
pub async fn upstream_had(app: &TestApp, n: u64) {
    for _ in 0..500 {
        if app.mock.state.total_count() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the upstream never had the request");
}

/// `sluice --config <config> <command>` run to its end; a `serve` that starts after all is
/// killed, failing the test, after 60 s.
pub async fn run_sluice(config: &std::path::Path, command: &str) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), command])
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("{command} started"))
        .unwrap()
}

/// `check-config` and `serve` both refuse `config`, naming every one of `names` on stderr.
pub async fn assert_start_refused(config: &std::path::Path, names: &[&str]) {
    for command in ["check-config", "serve"] {
        let out = run_sluice(config, command).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command} accepted it");
        assert!(names.iter().all(|n| err.contains(n)), "{command}: {err}");
    }
}

/// `check-config` accepts `config`.
pub async fn assert_config_accepted(config: &std::path::Path) {
    let out = run_sluice(config, "check-config").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The answer's `Retry-After` in seconds; it must be there and be a number.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> u64 {
    headers
        .get("retry-after")
        .expect("a Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `bytes` as a blob literal of the engine holding `db` (`x'…'` on SQLite, `'\x…'::bytea`
/// on PostgreSQL), to compare a BLOB/BYTEA column with in SQL both read otherwise.
pub fn sql_blob(db: &Db, bytes: &[u8]) -> String {
    match db.postgres() {
        None => format!("x'{}'", hex::encode(bytes)),
        Some(_) => format!("'\\x{}'::bytea", hex::encode(bytes)),
    }
}

/// The rows `sql` selects, on whichever engine holds `db` (`sql` in the SQL both read;
/// columns as `i64`, `String`, `bool` or `Option` of them, which both decode alike).
pub async fn sql_rows<T>(db: &Db, sql: &str) -> Vec<T>
where
    T: Send + Unpin,
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    rows_on(db, sql).await
}

/// The one row `sql` selects, on whichever engine holds `db` (see `sql_rows`).
pub async fn sql_row<T>(db: &Db, sql: &str) -> T
where
    T: Send + Unpin,
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    let mut rows: Vec<T> = rows_on(db, sql).await;
    assert_eq!(rows.len(), 1, "one row expected: {sql}");
    rows.remove(0)
}

/// Another writer holding the database of `[database] url` (`hold_the_store`).
pub enum HeldStore {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

/// Another writer on the database at `url` (a `[database] url`, on either engine), holding
/// it until `release`: the gateway's writes wait on it, its plain reads do not. On SQLite
/// its write lock (`hold_the_database`); on PostgreSQL every table of the schema locked in
/// EXCLUSIVE mode, which only plain `SELECT`s pass.
pub async fn hold_the_store(url: &str) -> HeldStore {
    use sqlx::Connection;
    let Some(path) = url.strip_prefix("sqlite://") else {
        let mut other = sqlx::PgConnection::connect(url).await.unwrap();
        // The gateway may be writing while the locks are taken one table after another: a
        // deadlock with one of its transactions aborts ours, which is then taken again.
        for _ in 0..20 {
            sqlx::query("BEGIN").execute(&mut other).await.unwrap();
            let locked = sqlx::query(
                "DO $$ DECLARE t TEXT; BEGIN
                   FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename LOOP
                     EXECUTE format('LOCK TABLE %I IN EXCLUSIVE MODE', t);
                   END LOOP;
                 END $$",
            )
            .execute(&mut other)
            .await;
            if locked.is_ok() {
                return HeldStore::Postgres(other);
            }
            sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
        }
        panic!("the PostgreSQL tables could not be locked");
    };
    HeldStore::Sqlite(hold_the_database(std::path::Path::new(path)).await)
}

impl HeldStore {
    /// Runs `sql` inside the holding transaction (its effects land with `release`).
    pub async fn exec(&mut self, sql: &str) {
        match self {
            HeldStore::Sqlite(c) => {
                sqlx::query(sql).execute(c).await.unwrap();
            }
            HeldStore::Postgres(c) => {
                sqlx::query(sql).execute(c).await.unwrap();
            }
        }
    }

    /// Lets the gateway's writes through (commits the holding transaction).
    pub async fn release(self) {
        match self {
            HeldStore::Sqlite(mut c) => {
                sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            }
            HeldStore::Postgres(mut c) => {
                sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            }
        }
    }
}

/// On PostgreSQL, everything the database holds, as a scan of a SQLite file sees it: every
/// text-like value of every table as text, every `BYTEA` value as its raw bytes (read
/// lossily), so a secret kept in clear in any column shows; `None` on SQLite, whose file
/// (and `-wal`) a test reads itself.
pub async fn postgres_contents(db: &Db) -> Option<String> {
    let pool = &db.postgres()?.pool;
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text FROM information_schema.columns
         WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(!columns.is_empty(), "no table in the database");
    let mut out = String::new();
    for (table, column, kind) in columns {
        let select = format!("SELECT \"{column}\" FROM \"{table}\" WHERE \"{column}\" IS NOT NULL");
        if kind == "bytea" {
            let values: Vec<Vec<u8>> = sqlx::query_scalar(&select).fetch_all(pool).await.unwrap();
            for v in values {
                out += &String::from_utf8_lossy(&v);
                out.push('\n');
            }
        } else {
            let select = format!(
                "SELECT \"{column}\"::text FROM \"{table}\" WHERE \"{column}\" IS NOT NULL"
            );
            let values: Vec<String> = sqlx::query_scalar(&select).fetch_all(pool).await.unwrap();
            for v in values {
                out += &v;
                out.push('\n');
            }
        }
    }
    Some(out)
}

/// An OpenAI-format stream chunk of `choices`, as the mock sends it.
pub fn chunk_event(choices: Value) -> sluice::mock::SseEvent {
    sluice::mock::SseEvent::Data(json!({"id": "c", "object": "chat.completion.chunk",
        "created": 1, "model": "m", "choices": choices}))
}

/// A request deadline far enough away not to matter (for calls made outside a request).
pub fn no_deadline() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(3600)
}

/// Revokes token `id` as the CLI or another replica would (a second connection to the
/// database), and lets this gateway's token cache hear of it at once.
pub async fn revoke_elsewhere(app: &TestApp, id: i64) {
    let other = sluice::store::Db::connect(&app.settings).await.unwrap();
    sluice::cli::token_revoke(&other, id, chrono::Utc::now())
        .await
        .unwrap();
    app.state.auth.refresh(&*app.state.clock).await.unwrap();
}

/// Token `id` was charged nothing and holds no reservation, and the money invariant holds.
pub async fn assert_nothing_charged_nor_held(app: &TestApp, id: i64) {
    let spent_or_held = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros + reserved_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent_or_held, 0, "nothing charged, nothing held");
    app.assert_invariant().await;
}

//! Someone with the database file but not the gateway's key (S11): edits a row, deletes
//! the newest rows, rewrites the whole chain, forges or removes the signed head.
//! `sluice audit verify` (the real binary) and the admin page detect each and say what.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteRow};
use sqlx::{Connection, FromRow};

use crate::admin_helpers::*;
use crate::helpers::*;

struct Rig {
    app: TestApp,
    admin: Session,
    config: PathBuf,
}

impl Rig {
    fn head_path(&self) -> PathBuf {
        Path::new(&self.app.settings.backup.dir).join("audit.head")
    }

    /// `sluice audit verify` as an operator runs it (awaited: a blocking wait would stall
    /// the in-process gateway's tasks).
    async fn verify(&self) -> Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--config", self.config.to_str().unwrap(), "audit", "verify"])
            .env_remove("SLUICE_SECRET_KEY")
            .output()
            .await
            .unwrap()
    }

    /// `verify` fails (else panics with `passed`) and its error output names `needle`.
    async fn verify_fails_naming(&self, needle: &str, passed: &str) {
        let out = self.verify().await;
        assert!(!ok(&out), "{passed}");
        assert!(stderr(&out).contains(needle), "{}", stderr(&out));
    }

    /// A team created through the API fails (500) rather than go unaudited: no team, no
    /// new audit row (else panics naming `what`).
    async fn team_create_fails_unaudited(&self, what: &str) {
        let rows = self.rows().await;
        let (s, body) = self
            .admin
            .post("/admin/api/v1/teams", &json!({"name": "unseen"}))
            .await;
        let teams = self
            .app
            .scalar("SELECT COUNT(*) FROM teams WHERE name = 'unseen'")
            .await;
        assert!(
            s == 500 && teams == 0,
            "{what}: {s} {body}: the team was created ({teams}) without its audit row"
        );
        assert_eq!(self.rows().await, rows, "{what}");
    }

    /// A process starting on the database (the CLI) refuses, naming `needle`.
    async fn cli_refuses_naming(&self, needle: &str, what: &str) {
        let out = cli(self, &["team", "create", "--name", "cli-unseen"]).await;
        assert!(
            !ok(&out) && stderr(&out).contains(needle),
            "{what}: the CLI ran: {}",
            stderr(&out)
        );
    }

    /// What someone holding the database but not the key has: a plain connection to it.
    async fn attacker(&self) -> Attacker {
        Attacker::of(&self.app.settings).await
    }

    async fn rows(&self) -> i64 {
        self.app.scalar("SELECT COUNT(*) FROM audit_log").await
    }

    /// Waits (bounded) until the signed head covers every row in the database.
    async fn head_caught_up(&self) -> Value {
        let mut last = Value::Null;
        for _ in 0..200 {
            let rows = self.rows().await;
            if let Ok(text) = std::fs::read_to_string(self.head_path()) {
                last = serde_json::from_str(&text).unwrap_or(Value::Null);
                if last["rows"] == json!(rows) {
                    return last;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the audit head never caught up with the database: {last}");
    }
}

/// A gateway with an admin who created teams and users: a dozen audit rows.
async fn rig() -> Rig {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    for name in ["red", "blue", "green"] {
        let (s, team) = admin
            .post("/admin/api/v1/teams", &json!({"name": name}))
            .await;
        assert_eq!(s, 201, "{team}");
        let (s, user) = admin
            .post(
                "/admin/api/v1/users",
                &json!({"username": format!("{name}-dev"), "team_id": team["id"]}),
            )
            .await;
        assert_eq!(s, 201, "{user}");
    }
    let config = cli_config(&app);
    let rig = Rig { app, admin, config };
    rig.head_caught_up().await;
    rig
}

pub(crate) fn ok(out: &Output) -> bool {
    out.status.success()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// HMAC-SHA256 (RFC 2104), written out so the attacker's tools need nothing of Sluice.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// An audit row as the attacker reads it: id, the fields the chain covers (actor, address,
/// action, target, before, after, created_at) and its hash.
type AuditRow = (
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
    String,
);

/// The columns of `AuditRow`, in its order.
const AUDIT_ROW: &str = "id, actor, address, action, target, before, after, created_at, hash";

/// The chain's fields of `r`, in the chain's order.
fn chain_fields(r: &AuditRow) -> [Option<&str>; 7] {
    [
        Some(r.1.as_str()),
        Some(r.2.as_str()),
        Some(r.3.as_str()),
        Some(r.4.as_str()),
        r.5.as_deref(),
        r.6.as_deref(),
        Some(r.7.as_str()),
    ]
}

/// The row's fields as the chain covers them, length-prefixed (NULL as its own marker).
fn encode(prev: &str, r: &AuditRow) -> Vec<u8> {
    let mut out = Vec::new();
    let mut field = |f: Option<&str>| match f {
        Some(s) => {
            out.extend((s.len() as u64).to_be_bytes());
            out.extend(s.as_bytes());
        }
        None => out.extend(u64::MAX.to_be_bytes()),
    };
    field(Some(prev));
    for f in chain_fields(r) {
        field(f);
    }
    out
}

/// The pre-key chain: plain SHA-256 over the same fields (NULL as "\0").
pub(crate) fn sha256_fields(prev: &str, fields: &[Option<&str>]) -> String {
    let mut h = Sha256::new();
    for s in std::iter::once(prev).chain(fields.iter().map(|f| f.unwrap_or("\u{0}"))) {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    }
    hex::encode(h.finalize())
}

fn sha256_row(prev: &str, r: &AuditRow) -> String {
    sha256_fields(prev, &chain_fields(r))
}

/// What someone holding the database but not the key does to it, on either engine: the
/// SQLite file opened with a plain connection, or PostgreSQL with the database's
/// credentials. Statements take no parameters (values are written into them).
pub(crate) trait Tamper {
    fn on_postgres(&self) -> bool;

    /// Runs `sql` (one statement or several); the database's refusal is the error.
    async fn try_exec(&mut self, sql: &str) -> Result<(), sqlx::Error>;

    /// The rows `sql` selects.
    async fn fetch<T>(&mut self, sql: &str) -> Vec<T>
    where
        T: Send + Unpin,
        T: for<'r> FromRow<'r, SqliteRow>,
        T: for<'r> FromRow<'r, PgRow>;

    async fn exec(&mut self, sql: &str) {
        self.try_exec(sql).await.expect(sql)
    }

    /// Takes away what refuses an UPDATE of an audit row (SQLite's `audit_no_update`
    /// trigger; PostgreSQL's `audit_append_only`, which refuses DELETE too).
    async fn lift_update_guard(&mut self) {
        match self.on_postgres() {
            true => self.exec("ALTER TABLE audit_log DISABLE TRIGGER audit_append_only"),
            false => self.exec("DROP TRIGGER IF EXISTS audit_no_update"),
        }
        .await
    }

    /// Takes away what refuses a DELETE of an audit row.
    async fn lift_delete_guard(&mut self) {
        match self.on_postgres() {
            true => self.exec("ALTER TABLE audit_log DISABLE TRIGGER audit_append_only"),
            false => self.exec("DROP TRIGGER IF EXISTS audit_no_delete"),
        }
        .await
    }

    /// Puts back what refuses a DELETE of an audit row, as the schema has it.
    async fn restore_delete_guard(&mut self) {
        match self.on_postgres() {
            true => self.exec("ALTER TABLE audit_log ENABLE TRIGGER audit_append_only"),
            false => self.exec("CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_log BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END"),
        }
        .await
    }
}

/// `Tamper` on each engine's own connection: the same statements, run by its driver.
macro_rules! tamper_on {
    ($conn:ty, $on_postgres:expr) => {
        impl Tamper for $conn {
            fn on_postgres(&self) -> bool {
                $on_postgres
            }

            async fn try_exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(sql).execute(self).await.map(drop)
            }

            async fn fetch<T>(&mut self, sql: &str) -> Vec<T>
            where
                T: Send + Unpin,
                T: for<'r> FromRow<'r, SqliteRow>,
                T: for<'r> FromRow<'r, PgRow>,
            {
                sqlx::query_as(sql).fetch_all(self).await.expect(sql)
            }
        }
    };
}

tamper_on!(SqliteConnection, false);
tamper_on!(PgConnection, true);

/// A plain connection to a gateway's database, on its engine.
pub(crate) enum Attacker {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

impl Attacker {
    /// A connection to the database `settings` name.
    pub(crate) async fn of(settings: &sluice::config::Settings) -> Attacker {
        match settings.database_postgres_url() {
            Some(url) => Attacker::Postgres(PgConnection::connect(url).await.unwrap()),
            None => Attacker::Sqlite(
                SqliteConnection::connect_with(
                    &SqliteConnectOptions::new().filename(settings.database_path()),
                )
                .await
                .unwrap(),
            ),
        }
    }

    /// A connection to the database of the gateway process(es) on `dir`
    /// (`gateway_proc::write_config`: `dir/sluice.db`, or the PostgreSQL database whose URL
    /// it keeps in `dir/pg-url`).
    pub(crate) async fn of_dir(dir: &Path) -> Attacker {
        match std::fs::read_to_string(dir.join("pg-url")) {
            Ok(url) => Attacker::Postgres(PgConnection::connect(&url).await.unwrap()),
            Err(_) => Attacker::Sqlite(
                SqliteConnection::connect_with(
                    &SqliteConnectOptions::new().filename(dir.join("sluice.db")),
                )
                .await
                .unwrap(),
            ),
        }
    }

    pub(crate) async fn close(self) {
        match self {
            Attacker::Sqlite(c) => c.close().await.unwrap(),
            Attacker::Postgres(c) => c.close().await.unwrap(),
        }
    }
}

impl Tamper for Attacker {
    fn on_postgres(&self) -> bool {
        matches!(self, Attacker::Postgres(_))
    }

    async fn try_exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Attacker::Sqlite(c) => c.try_exec(sql).await,
            Attacker::Postgres(c) => c.try_exec(sql).await,
        }
    }

    async fn fetch<T>(&mut self, sql: &str) -> Vec<T>
    where
        T: Send + Unpin,
        T: for<'r> FromRow<'r, SqliteRow>,
        T: for<'r> FromRow<'r, PgRow>,
    {
        match self {
            Attacker::Sqlite(c) => c.fetch(sql).await,
            Attacker::Postgres(c) => c.fetch(sql).await,
        }
    }
}

pub(crate) enum Rewrite {
    Sha256,
    WrongKey([u8; 32]),
}

/// Edits row `from`'s `after`, then recomputes every hash from it on: the chain links up
/// again, every hash is "right" — by the attacker's reckoning.
pub(crate) async fn rewrite_chain(c: &mut impl Tamper, from: i64, how: &Rewrite) {
    c.lift_update_guard().await;
    c.exec(&format!(
        "UPDATE audit_log SET after = '{{\"username\":\"mallory\"}}' WHERE id = {from}"
    ))
    .await;
    let rows: Vec<AuditRow> = c
        .fetch(&format!("SELECT {AUDIT_ROW} FROM audit_log ORDER BY id"))
        .await;
    let mut prev = "0".repeat(64);
    for r in &rows {
        let id = r.0;
        if id >= from {
            let hash = match how {
                Rewrite::Sha256 => sha256_row(&prev, r),
                Rewrite::WrongKey(k) => hex::encode(hmac_sha256(k, &encode(&prev, r))),
            };
            c.exec(&format!(
                "UPDATE audit_log SET prev_hash = '{prev}', hash = '{hash}' WHERE id = {id}"
            ))
            .await;
            prev = hash;
        } else {
            prev = r.8.clone();
        }
    }
}

/// Drops the delete trigger, deletes the newest `n` rows, and puts the trigger back.
async fn truncate(c: &mut impl Tamper, n: i64) {
    c.lift_delete_guard().await;
    c.exec(&format!(
        "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log ORDER BY id DESC LIMIT {n})"
    ))
    .await;
    c.restore_delete_guard().await;
}

async fn a_middle_row(rig: &Rig) -> i64 {
    rig.app
        .scalar("SELECT id FROM audit_log WHERE action = 'user.create' ORDER BY id LIMIT 1")
        .await
}

#[tokio::test]
async fn an_intact_log_verifies_and_its_head_matches() {
    let rig = rig().await;
    let out = rig.verify().await;
    assert!(ok(&out), "{}", stderr(&out));
    let rows = rig.rows().await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{rows} rows verified")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test]
async fn a_row_edited_in_place_is_named() {
    let rig = rig().await;
    let target = a_middle_row(&rig).await;
    let mut c = rig.attacker().await;
    c.lift_update_guard().await;
    c.exec(&format!(
        "UPDATE audit_log SET actor = 'nobody' WHERE id = {target}"
    ))
    .await;
    rig.verify_fails_naming(
        &format!("broken at row {target}"),
        "an edited row passed verification",
    )
    .await;
}

#[tokio::test]
async fn a_chain_rewritten_with_plain_sha256_is_named_at_the_edited_row() {
    let rig = rig().await;
    let target = a_middle_row(&rig).await;
    rewrite_chain(&mut rig.attacker().await, target, &Rewrite::Sha256).await;
    rig.verify_fails_naming(
        &format!("broken at row {target}"),
        "a SHA-256 rewrite passed verification",
    )
    .await;
}

#[tokio::test]
async fn a_chain_rewritten_under_another_key_is_named_at_the_edited_row() {
    let rig = rig().await;
    let target = a_middle_row(&rig).await;
    rewrite_chain(
        &mut rig.attacker().await,
        target,
        &Rewrite::WrongKey([7; 32]),
    )
    .await;
    rig.verify_fails_naming(
        &format!("broken at row {target}"),
        "a rewrite under a guessed key passed verification",
    )
    .await;
}

/// Red team: the whole chain rewritten under another key, from its first row, so that no
/// row verifies under the gateway's key — what a host holding another key looks like on
/// PostgreSQL, where such a host is refused when it opens the database. `sluice audit
/// verify` with the right key must still run and name the rewrite, on both engines.
#[tokio::test]
async fn a_chain_rewritten_from_its_first_row_under_another_key_is_named() {
    let rig = rig().await;
    rewrite_chain(&mut rig.attacker().await, 1, &Rewrite::WrongKey([7; 32])).await;
    let out = rig.verify().await;
    assert!(!ok(&out), "a whole-chain rewrite passed verification");
    let err = stderr(&out);
    assert!(err.contains("broken at row 1"), "{err}");
    assert!(err.contains("audit head mismatch"), "{err}");
}

#[tokio::test]
async fn deleting_the_newest_rows_is_caught_by_the_head() {
    let rig = rig().await;
    let before = rig.rows().await;
    truncate(&mut rig.attacker().await, 2).await;
    let out = rig.verify().await;
    assert!(!ok(&out), "a truncated log passed verification");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "audit head mismatch: count: the head says {before} rows, the database has {}",
            before - 2
        )),
        "{err}"
    );
    // The admin page's check says the same.
    let page = rig.admin.get("/admin/audit/verify").await;
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("audit head mismatch: count"), "{page}");
}

#[tokio::test]
async fn after_a_truncation_the_next_action_does_not_paper_over_it() {
    let rig = rig().await;
    let before = rig.rows().await;
    truncate(&mut rig.attacker().await, 2).await;
    // The gateway goes on: a new action appends (linking to the truncated tail) and wakes
    // the exporter, which must not replace the head with one of the truncated chain.
    let (s, _) = rig
        .admin
        .post("/admin/api/v1/teams", &json!({"name": "after"}))
        .await;
    assert_eq!(s, 201);
    let exported = sluice::ops::audit_head::export(
        rig.app.db(),
        Path::new(&rig.app.settings.backup.dir),
        "",
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(exported, sluice::ops::audit_head::Exported::Refused(_)),
        "{exported:?}"
    );
    let head: Value =
        serde_json::from_str(&std::fs::read_to_string(rig.head_path()).unwrap()).unwrap();
    assert_eq!(
        head["rows"],
        json!(before),
        "the head still says what it said"
    );
    rig.verify_fails_naming("audit head mismatch", "the truncation passed verification")
        .await;
}

#[tokio::test]
async fn a_forged_head_is_caught() {
    let rig = rig().await;
    truncate(&mut rig.attacker().await, 2).await;
    // A head that matches the truncated database, signed with a key the attacker made up.
    let (rows, last_id, last_hash): (i64, i64, String) = {
        let mut c = rig.attacker().await;
        c.fetch("SELECT (SELECT COUNT(*) FROM audit_log) AS n, id, hash FROM audit_log ORDER BY id DESC LIMIT 1")
            .await
            .remove(0)
    };
    let at = "2026-12-01T00:00:00.000Z";
    let text = format!("sluice audit head v1\n{rows}\n{last_id}\n{last_hash}\n{at}");
    let mac = hex::encode(hmac_sha256(&[9; 32], text.as_bytes()));
    let forged =
        json!({"rows": rows, "last_id": last_id, "last_hash": last_hash, "at": at, "mac": mac});
    std::fs::write(rig.head_path(), forged.to_string()).unwrap();
    rig.verify_fails_naming("audit head forged", "a forged head passed verification")
        .await;
}

#[tokio::test]
async fn a_missing_head_is_reported() {
    let rig = rig().await;
    std::fs::remove_file(rig.head_path()).unwrap();
    rig.verify_fails_naming("audit head missing", "verification passed without a head")
        .await;
}

#[tokio::test]
async fn heads_of_concurrent_actions_end_at_the_newest() {
    let rig = rig().await;
    // Admin actions in the gateway and CLI commands in processes of their own, all at
    // once: each writes a head; none may leave an older one over a newer one.
    let api = (0..8).map(|i| {
        let admin = &rig.admin;
        async move {
            let (s, _) = admin
                .post("/admin/api/v1/teams", &json!({"name": format!("api-{i}")}))
                .await;
            assert_eq!(s, 201);
        }
    });
    let cli = (0..4).map(|i| {
        let config = rig.config.clone();
        tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "--config",
                config.to_str().unwrap(),
                "team",
                "create",
                "--name",
            ])
            .arg(format!("cli-{i}"))
            .output()
    });
    let (_, outs) = tokio::join!(
        futures_util::future::join_all(api),
        futures_util::future::join_all(cli)
    );
    for o in outs {
        let o = o.unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let head = rig.head_caught_up().await;
    assert_eq!(head["rows"], json!(rig.rows().await));
    let out = rig.verify().await;
    assert!(ok(&out), "{}", stderr(&out));
}

/// A gateway process (the real binary) whose database holds eve's token, and its log file.
/// Fields drop in order: the process ends before its folder goes.
pub(crate) struct LoggedGateway {
    pub gw: crate::processes::Gateway,
    pub mock: sluice::mock::MockServer,
    pub token: String,
    pub port: String,
    pub log: PathBuf,
    pub dir: tempfile::TempDir,
}

pub(crate) async fn logged_gateway() -> LoggedGateway {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let db = crate::gateway_proc::open_dir_db(dir.path()).await;
    let issued = sluice::cli::token_issue(&db, &issue_args("eve"), chrono::Utc::now())
        .await
        .unwrap();
    db.close().await;
    let gw = crate::processes::start_gateway_full(dir.path(), &mock, &[], "").await;
    let port = gw.url.rsplit(':').next().unwrap().to_string();
    let log = dir.path().join(format!("gateway-{port}.log"));
    LoggedGateway {
        gw,
        mock,
        token: issued.text,
        port,
        log,
        dir,
    }
}

impl LoggedGateway {
    /// The upstream refuses the key: the gateway disables it — an audited action of its
    /// own. The client's answer is a 502 or 503; its body is returned.
    pub(crate) async fn refuse_the_key(&self) -> Value {
        self.mock.state.sticky(
            KEY_A,
            Some(sluice::mock::Script {
                status: Some(401),
                ..Default::default()
            }),
        );
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.gw.url))
            .bearer_auth(&self.token)
            .json(&chat_body(10))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert!(status == 502 || status == 503, "{status} {body}");
        body
    }
}

/// The head's JSON log lines of a gateway's log file (target `sluice::audit`); none while
/// the file is not there yet.
pub(crate) fn logged_heads(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "sluice::audit" && v["fields"]["message"] == "audit head")
        .map(|v| v["fields"].clone())
        .collect()
}

#[tokio::test]
async fn a_gateway_process_logs_each_new_head_and_no_secret() {
    let gw = logged_gateway().await;
    let log = gw.log.clone();
    let head_path = gw.dir.path().join("backup/audit.head");
    let body = gw.refuse_the_key().await;
    assert!(body["error"]["message"].is_string(), "{body}");
    // The new head follows the key's disabling (an `upstream.disable` row after the
    // token's rows — its team's, its user's, its own — and the `audit.head_started` row):
    // the head of 4 rows the gateway wrote at its start is not the one asked for (the row
    // may be written after the answer).
    let mut head = Value::Null;
    for _ in 0..200 {
        head = std::fs::read_to_string(&head_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        if head["rows"] == json!(5) && logged_heads(&log).iter().any(|h| h["rows"] == json!(5)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(head["rows"], json!(5), "{head}");
    let logged = logged_heads(&log);
    let last = logged.last().unwrap();
    for f in ["rows", "last_id", "last_hash", "at"] {
        assert_eq!(last[f], head[f], "{f}: the log and the file agree");
    }
    // Signed in the log's own domain: a logged head is no valid file (`audit_replay.rs`).
    assert!(
        last["mac"].as_str().is_some_and(|m| m.len() == 64),
        "{last}"
    );
    assert_ne!(last["mac"], head["mac"]);
    let text = std::fs::read_to_string(&log).unwrap();
    // The master key: beside the SQLite file, or the shared key file of PostgreSQL's hosts.
    let key_file = match crate::helpers::test_engine() {
        crate::pg_gateway_app::Engine::Sqlite => "sluice.db.key",
        crate::pg_gateway_app::Engine::Postgres => "shared.key",
    };
    let master = std::fs::read_to_string(gw.dir.path().join(key_file)).unwrap();
    for secret in [master.trim(), KEY_A, gw.token.as_str()] {
        assert!(!text.contains(secret), "a secret in the log");
    }
}

#[tokio::test]
async fn a_huge_head_file_is_reported_without_being_read() {
    let rig = rig().await;
    // 1 GiB, sparse: reading it whole would take 1 GiB of memory in the gateway's exporter
    // and on the admin page.
    std::fs::File::create(rig.head_path())
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    rig.verify_fails_naming(
        "audit head unreadable: larger than 4096 bytes",
        "a huge head passed verification",
    )
    .await;
}

/// Rows kept byte for byte but moved: a copy of an earlier row appended (a replay), two
/// rows' contents swapped, every id renumbered. The MAC covers the previous row's hash, so
/// a row verifies only in its place; ids are not in the MAC, but the head names the newest
/// id, so renumbering shows there.
#[tokio::test]
async fn replayed_swapped_or_renumbered_rows_are_caught() {
    const COLS: &str =
        "actor, address, action, target, before, after, created_at, prev_hash, hash, chain";
    let replayed = rig().await;
    let target = a_middle_row(&replayed).await;
    let mut c = replayed.attacker().await;
    c.exec(&format!(
        "INSERT INTO audit_log ({COLS}) SELECT {COLS} FROM audit_log WHERE id = {target}"
    ))
    .await;
    let copy = replayed.app.scalar("SELECT MAX(id) FROM audit_log").await;
    let err = stderr(&replayed.verify().await);
    assert!(
        err.contains(&format!("chain broken at row {copy}: it does not link")),
        "{err}"
    );

    let (swapped, first) = rig_swapped().await;
    let err = stderr(&swapped.verify().await);
    assert!(
        err.contains(&format!("chain broken at row {first}: it does not link")),
        "{err}"
    );

    let renumbered = rig().await;
    let mut c = renumbered.attacker().await;
    c.lift_update_guard().await;
    c.exec("UPDATE audit_log SET id = id + 1000").await;
    let err = stderr(&renumbered.verify().await);
    assert!(err.contains("audit head mismatch: hash"), "{err}");
    assert!(!err.contains("chain broken"), "{err}");
}

/// A rig whose middle row and the one after it swapped contents; the first of the two.
async fn rig_swapped() -> (Rig, i64) {
    let rig = rig().await;
    let a = a_middle_row(&rig).await;
    let mut c = rig.attacker().await;
    c.lift_update_guard().await;
    // Through a spare id: move a aside, b into a, the saved a into b.
    for sql in [
        format!("UPDATE audit_log SET id = -1 WHERE id = {a}"),
        format!("UPDATE audit_log SET id = {a} WHERE id = {a} + 1"),
        format!("UPDATE audit_log SET id = {a} + 1 WHERE id = -1"),
    ] {
        c.exec(&sql).await;
    }
    (rig, a)
}

/// Not an attack but the likeliest accident: the gateway's key changed (`SLUICE_SECRET_KEY`
/// set where the key file was used, or the file replaced). Every row and the head then fail
/// alike; `verify` says that the key is the likely cause, not only that rows changed.
#[tokio::test]
async fn verify_with_another_key_says_the_key_is_the_likely_cause() {
    let rig = rig().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", rig.config.to_str().unwrap(), "audit", "verify"])
        .env("SLUICE_SECRET_KEY", "cd".repeat(32))
        .output()
        .await
        .unwrap();
    assert!(!ok(&out));
    let err = stderr(&out);
    assert!(err.contains("chain broken at row 1"), "{err}");
    assert!(err.contains("audit head forged"), "{err}");
    assert!(
        err.contains("not the key that signed") && err.contains("SLUICE_SECRET_KEY"),
        "{err}"
    );
}

/// Red team: the head catches deleted newest rows only while it exists. Someone holding
/// the database and the backup folder deletes the newest rows *and* `audit.head`; the next
/// audited action's export wrote a fresh head over the truncated chain (`Found::Missing`:
/// a warning only), and `sluice audit verify` then passed. Fixed: the chain's
/// `audit.head_started` row says a head was started, so a missing one is an alarm.
#[tokio::test]
async fn redteam_deleting_the_head_with_the_newest_rows_is_not_covered_up() {
    let rig = rig().await;
    let mut c = rig.attacker().await;
    truncate(&mut c, 3).await;
    drop(c);
    std::fs::remove_file(rig.head_path()).unwrap();
    // Any later admin action, and the export that follows it (the gateway's task or this
    // one: they take turns under the head's lock).
    let (s, _) = rig
        .admin
        .post("/admin/api/v1/teams", &json!({"name": "after"}))
        .await;
    assert_eq!(s, 201);
    let dir = Path::new(&rig.app.settings.backup.dir);
    let done = sluice::ops::audit_head::export(&rig.app.state.db, dir, "", chrono::Utc::now())
        .await
        .unwrap();
    assert!(
        matches!(&done, sluice::ops::audit_head::Exported::Refused(why) if why.contains("sluice audit rearm")),
        "{done:?}"
    );
    assert!(
        !rig.head_path().exists(),
        "a new head was started over the truncated chain"
    );
    let out = rig.verify().await;
    assert!(
        !ok(&out),
        "three deleted rows went unnoticed: verify passed after the head was deleted and rewritten"
    );
    assert!(
        stderr(&out).contains("audit head missing") && stderr(&out).contains("sluice audit rearm"),
        "{}",
        stderr(&out)
    );
}

/// The CLI as the operator runs it on the rig's database (awaited, as `verify`).
async fn cli(rig: &Rig, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", rig.config.to_str().unwrap()])
        .args(args)
        .env_remove("SLUICE_SECRET_KEY")
        .output()
        .await
        .unwrap()
}

/// A head missing where one was started stays missing — a CLI command's export and a
/// gateway starting on the database (its first export is done before it serves) refuse to
/// start a new one, the gateway raising an alert — until the operator re-arms it: `sluice
/// audit rearm --reason …` starts a new head, records who and why in the chain, and keeps a
/// head it replaces aside.
#[tokio::test]
async fn a_missing_head_is_started_again_only_by_the_operator() {
    let rig = rig().await;
    std::fs::remove_file(rig.head_path()).unwrap();
    let out = cli(&rig, &["team", "create", "--name", "cli-after"]).await;
    assert!(ok(&out), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: audit.head is missing"),
        "{}",
        stderr(&out)
    );
    assert!(!rig.head_path().exists(), "the CLI started a new head");
    let (db, backup) = (
        rig.app.settings.database.clone(),
        rig.app.settings.backup.dir.clone(),
    );
    let second = spawn_app_with(move |s, _| {
        s.database = db;
        s.backup.dir = backup;
    })
    .await;
    assert!(
        !rig.head_path().exists(),
        "a gateway starting on the database started a new head"
    );
    drop(second);
    // The reason is required.
    let out = cli(&rig, &["audit", "rearm", "--reason", " "]).await;
    assert!(
        !ok(&out) && stderr(&out).contains("--reason"),
        "{}",
        stderr(&out)
    );
    let out = cli(
        &rig,
        &[
            "audit",
            "rearm",
            "--reason",
            "backup folder restored from tape",
        ],
    )
    .await;
    assert!(ok(&out), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("audit head started over"), "{said}");
    let out = rig.verify().await;
    assert!(ok(&out), "{}", stderr(&out));
    let (actor, after): (String, String) = sql_rows(
        rig.app.db(),
        "SELECT actor, after FROM audit_log WHERE action = 'audit.head_started' ORDER BY id DESC LIMIT 1",
    )
    .await
    .remove(0);
    assert_eq!(actor, "cli");
    assert!(
        after.contains("backup folder restored from tape"),
        "{after}"
    );
    // Re-arming over a head that is there keeps that one aside.
    let out = cli(&rig, &["audit", "rearm", "--reason", "a second look"]).await;
    assert!(ok(&out), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("audit.head.before-rearm-"), "{said}");
    let kept = std::fs::read_dir(&rig.app.settings.backup.dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("audit.head.before-rearm-")
        })
        .count();
    assert_eq!(kept, 1);
    assert!(ok(&rig.verify().await));
}

/// A fresh gateway's first head follows an `audit.head_started` row, the chain's record
/// that a head exists from then on; it is in the chain before the gateway serves anyone.
#[tokio::test]
async fn a_fresh_gateway_records_that_its_head_was_started() {
    let app = spawn_app().await;
    let (actor, action): (String, String) = sql_rows(
        app.db(),
        "SELECT actor, action FROM audit_log ORDER BY id LIMIT 1",
    )
    .await
    .remove(0);
    assert_eq!(
        (actor.as_str(), action.as_str()),
        ("system", "audit.head_started")
    );
    let head = Path::new(&app.settings.backup.dir).join("audit.head");
    let head: Value = serde_json::from_str(&std::fs::read_to_string(head).unwrap()).unwrap();
    assert_eq!(head["rows"], 1);
}

/// The chain's record that a head was started cannot be taken out to make a missing head
/// look like a first start: deleting the `audit.head_started` row (and the head) breaks the
/// link of the row after it, and relabelling it breaks its MAC; either way `verify` names
/// the row, whatever head the next export writes.
#[tokio::test]
async fn removing_the_record_of_the_head_is_named() {
    for how in ["delete", "relabel"] {
        let rig = rig().await;
        let marker: i64 = rig
            .app
            .scalar(
                "SELECT id FROM audit_log WHERE action = 'audit.head_started' ORDER BY id LIMIT 1",
            )
            .await;
        let mut c = rig.attacker().await;
        match how {
            "delete" => {
                c.lift_delete_guard().await;
                c.exec("DELETE FROM audit_log WHERE action = 'audit.head_started'")
                    .await
            }
            _ => {
                c.lift_update_guard().await;
                c.exec("UPDATE audit_log SET action = 'team.create' WHERE action = 'audit.head_started'")
                    .await
            }
        }
        c.close().await;
        truncate_quietly(&rig).await;
        std::fs::remove_file(rig.head_path()).unwrap();
        let dir = Path::new(&rig.app.settings.backup.dir);
        sluice::ops::audit_head::export(&rig.app.state.db, dir, "", chrono::Utc::now())
            .await
            .unwrap();
        let named = match how {
            "delete" => format!("broken at row {}", marker + 1),
            _ => format!("broken at row {marker}"),
        };
        rig.verify_fails_naming(
            &named,
            &format!("{how}: the record of the head went unnoticed"),
        )
        .await;
    }
}

/// Deletes the newest row (the delete trigger may already be gone).
async fn truncate_quietly(rig: &Rig) {
    let mut c = rig.attacker().await;
    c.lift_delete_guard().await;
    c.exec("DELETE FROM audit_log WHERE id = (SELECT MAX(id) FROM audit_log)")
        .await;
}

/// `sluice audit rearm` run with a key that did not sign the log (the operator's shell
/// lacks the gateway's `SLUICE_SECRET_KEY`, or has another one): it must not write its
/// `audit.head_started` row, which no one could ever verify — every later `verify` would
/// name it as signed without the key, for good — nor replace the head with one signed by
/// that key. It is refused, naming the key, and the log and its head stay as they were.
#[tokio::test]
async fn rearm_with_a_key_that_did_not_sign_the_log_is_refused() {
    let rig = rig().await;
    let rows = rig.rows().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", rig.config.to_str().unwrap()])
        .args(["audit", "rearm", "--reason", "the head alarm fired"])
        .env("SLUICE_SECRET_KEY", "ab".repeat(32))
        .output()
        .await
        .unwrap();
    assert!(
        !ok(&out),
        "re-armed under another key: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr(&out).contains("SLUICE_SECRET_KEY"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        rig.rows().await,
        rows,
        "a row was written under another key"
    );
    let out = rig.verify().await;
    assert!(ok(&out), "{}", stderr(&out));
    // With the right key it re-arms.
    let out = cli(
        &rig,
        &["audit", "rearm", "--reason", "the head alarm fired"],
    )
    .await;
    assert!(ok(&out), "{}", stderr(&out));
    assert!(ok(&rig.verify().await));
}

/// An app whose alerts go to the mock's webhook (generic format), with `root` signed in.
async fn alerting_app() -> (TestApp, Session) {
    use sluice::config::{Secret, WebhookSettings};
    let app = spawn_app_with(|s, m| {
        s.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
    })
    .await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    (app, admin)
}

/// Waits up to 10 s for an `audit_head` alert at the mock's webhook; fails saying `when`
/// it was due, with the kinds that came.
async fn audit_head_alert(app: &TestApp, when: &str) {
    let mut kinds = Vec::new();
    for _ in 0..400 {
        kinds = app
            .mock
            .state
            .stats("webhook")
            .last_bodies
            .iter()
            .filter_map(|b| b["kind"].as_str().map(String::from))
            .collect();
        if kinds.iter().any(|k| k == "audit_head") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no audit_head alert in 10 s {when}: {kinds:?}");
}

/// Someone with the backup folder puts a folder where the head's lock file is: from then on
/// every export fails before it reads anything, the head stays where it was while rows are
/// added (which that someone may then delete unseen by the gateway), and the gateway only
/// logged an error — no `audit_head` alert, as a refused head raises. A head that can no
/// longer be written is raised too.
#[tokio::test]
async fn a_head_that_can_no_longer_be_written_raises_an_alert() {
    let (app, admin) = alerting_app().await;
    let dir = Path::new(&app.settings.backup.dir).to_path_buf();
    let lock = dir.join("audit.head.lock");
    assert!(lock.is_file(), "the gateway's first export made its lock");
    std::fs::remove_file(&lock).unwrap();
    std::fs::create_dir(&lock).unwrap();
    let (s, _) = admin
        .post("/admin/api/v1/teams", &json!({"name": "frozen"}))
        .await;
    assert_eq!(s, 201);
    audit_head_alert(&app, "while the head could not be written").await;
}

/// Red team: rows rewritten under another key behind a running gateway, then the next
/// admin action. On SQLite it appends and the head's exporter, woken, refuses the chain
/// and raises the `audit_head` alert. On PostgreSQL the append is refused (a tip this key
/// did not sign stops every host's appends: fail closed) — and nothing woke the exporter,
/// so no alert was raised: the operator saw only 500s. The alert must come on both.
#[tokio::test]
async fn a_chain_rewritten_behind_a_running_gateway_raises_the_alert() {
    let (app, admin) = alerting_app().await;
    for name in ["red", "blue"] {
        let (s, team) = admin
            .post("/admin/api/v1/teams", &json!({"name": name}))
            .await;
        assert_eq!(s, 201, "{team}");
    }
    let config = cli_config(&app);
    let rig = Rig { app, admin, config };
    rig.head_caught_up().await;
    let target: i64 = rig
        .app
        .scalar("SELECT id FROM audit_log WHERE action = 'team.create' ORDER BY id LIMIT 1")
        .await;
    rewrite_chain(
        &mut rig.attacker().await,
        target,
        &Rewrite::WrongKey([7; 32]),
    )
    .await;
    let (status, v) = rig
        .admin
        .post("/admin/api/v1/teams", &json!({"name": "after"}))
        .await;
    match rig.app.db().postgres() {
        None => assert_eq!(status, 201, "{v}"),
        Some(_) => {
            assert_eq!(status, 500, "{v}");
            assert_eq!(v["error"]["code"], "internal_error", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("nothing was changed")),
                "{v}"
            );
        }
    }
    audit_head_alert(&rig.app, "after the chain was rewritten").await;
    rig.verify_fails_naming(
        &format!("broken at row {target}"),
        "the rewrite passed verification",
    )
    .await;
}

/// Plants the trigger `hide` that drops the audit rows of `team.create` (S11: the database
/// without the key): `skip` refuses the row before it is written (SQLite `RAISE(IGNORE)`,
/// PostgreSQL a BEFORE trigger returning NULL); `delete` removes it right after, the delete
/// guard lifted first. Either way the chain still links and its head still matches.
pub(crate) async fn plant_hiding_trigger(c: &mut impl Tamper, how: &str) {
    let sql = match (how, c.on_postgres()) {
        ("skip", false) => "CREATE TRIGGER hide BEFORE INSERT ON audit_log WHEN NEW.action = 'team.create' BEGIN SELECT RAISE(IGNORE); END",
        ("skip", true) => "CREATE FUNCTION hide() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
            CREATE TRIGGER hide BEFORE INSERT ON audit_log FOR EACH ROW WHEN (NEW.action = 'team.create') EXECUTE FUNCTION hide()",
        (_, false) => "CREATE TRIGGER hide AFTER INSERT ON audit_log WHEN NEW.action = 'team.create' BEGIN DELETE FROM audit_log WHERE id = NEW.id; END",
        (_, true) => "CREATE FUNCTION hide() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM audit_log WHERE id = NEW.id; RETURN NULL; END $$;
            CREATE TRIGGER hide AFTER INSERT ON audit_log FOR EACH ROW WHEN (NEW.action = 'team.create') EXECUTE FUNCTION hide()",
    };
    if how == "delete" {
        c.lift_delete_guard().await;
    }
    c.exec(sql).await;
}

/// A trigger that silently drops chosen audit rows: the admin action it would hide fails
/// (its transaction rolled back, so it does not happen unaudited), `verify` names the
/// trigger, and a process starting on the database (the CLI here) refuses to.
#[tokio::test]
async fn a_trigger_that_drops_audit_rows_fails_the_action_and_is_named() {
    for how in ["skip", "delete"] {
        let rig = rig().await;
        let mut c = rig.attacker().await;
        plant_hiding_trigger(&mut c, how).await;
        c.close().await;
        rig.team_create_fails_unaudited(how).await;
        rig.verify_fails_naming("hide", &format!("{how}: the hiding trigger went unnoticed"))
            .await;
        rig.cli_refuses_naming("hide", how).await;
    }
}

/// PostgreSQL's two quieter ways round the guards (final review F3): the delete guard set
/// to fire only in replica sessions (enabled, but never firing for the gateway), and a
/// deferred constraint trigger that deletes each new row at commit, after the append's own
/// check that its row was kept. The action fails rather than go unaudited; verify and a
/// starting process name both.
#[tokio::test]
async fn a_guard_set_to_replica_mode_and_a_deferred_delete_are_caught() {
    let rig = rig().await;
    if rig.app.db().postgres().is_none() {
        return;
    }
    let mut c = rig.attacker().await;
    c.exec("ALTER TABLE audit_log ENABLE REPLICA TRIGGER audit_append_only; \
        CREATE FUNCTION later() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM audit_log WHERE id = NEW.id; RETURN NULL; END $$; \
        CREATE CONSTRAINT TRIGGER later AFTER INSERT ON audit_log DEFERRABLE INITIALLY DEFERRED \
            FOR EACH ROW WHEN (NEW.action = 'team.create') EXECUTE FUNCTION later()")
        .await;
    c.close().await;
    rig.team_create_fails_unaudited("a deferred delete").await;
    rig.verify_fails_naming("later", "the deferred trigger went unnoticed")
        .await;
    rig.verify_fails_naming("audit_append_only", "the replica-only guard went unnoticed")
        .await;
    rig.cli_refuses_naming("audit_append_only", "the guard in replica mode")
        .await;
}

/// s22 attack F1 on PostgreSQL: a trigger on another table whose function reaches the log
/// by dynamic SQL (`'audit' || '_log'`, so its text never names it) — fired by a write the
/// admin transaction makes after its audit row's own check (logout ends its session after
/// the row) — and a schema trigger's function rewritten to do the same. Every trigger on
/// the schema's tables is the schema's own, its body as the migrations wrote it: verify
/// and a starting process name both.
#[tokio::test]
async fn a_trigger_reaching_the_log_by_dynamic_sql_is_named() {
    let rig = rig().await;
    if rig.app.db().postgres().is_none() {
        return;
    }
    let mut c = rig.attacker().await;
    c.exec("CREATE FUNCTION quiet() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
            EXECUTE 'DELETE FROM audit' || '_log WHERE id = (SELECT max(id) FROM audit' || '_log)'; \
            RETURN NULL; END $$; \
        CREATE TRIGGER quiet AFTER DELETE ON admin_sessions FOR EACH ROW EXECUTE FUNCTION quiet(); \
        CREATE OR REPLACE FUNCTION processes_seen_at() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
            EXECUTE 'DELETE FROM audit' || '_log WHERE false'; NEW.seen_at := now(); RETURN NEW; END $$")
        .await;
    c.close().await;
    rig.verify_fails_naming("quiet", "the trigger on admin_sessions went unnoticed")
        .await;
    rig.verify_fails_naming(
        "processes_seen_at",
        "the rewritten schema trigger went unnoticed",
    )
    .await;
    rig.cli_refuses_naming("quiet", "a trigger by dynamic SQL")
        .await;
}

/// s22 attack (second and third batches) on PostgreSQL: the check of the schema's triggers
/// holds the gateway's own tables and functions only — another application's table in the
/// same schema with a trigger of its own, or its own `audit_log` elsewhere written by a
/// trigger, does not stop the gateway — while a rule on one of its tables (fired by a
/// logout's session delete, after the audit row's check), a function its triggers call
/// given another body (`spend_months_add`: its own older one) and a schema trigger dropped
/// (the ledger's guard) are named.
#[tokio::test]
async fn another_apps_trigger_passes_and_a_rule_or_a_called_function_rewritten_is_named() {
    let rig = rig().await;
    if rig.app.db().postgres().is_none() {
        return;
    }
    let mut c = rig.attacker().await;
    // Another application: a table with a trigger of its own, and its own `audit_log` in a
    // schema of its own, written by a trigger whose text names it.
    c.exec("CREATE TABLE other_app (x INT, updated_at TIMESTAMPTZ); \
        CREATE FUNCTION other_app_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.updated_at := now(); RETURN NEW; END $$; \
        CREATE TRIGGER other_app_touch BEFORE UPDATE ON other_app FOR EACH ROW EXECUTE FUNCTION other_app_touch(); \
        CREATE SCHEMA app; CREATE TABLE app.orders (x INT); CREATE TABLE app.audit_log (x INT); \
        CREATE FUNCTION app.orders_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO app.audit_log VALUES (NEW.x); RETURN NEW; END $$; \
        CREATE TRIGGER orders_audit AFTER INSERT ON app.orders FOR EACH ROW EXECUTE FUNCTION app.orders_audit()")
        .await;
    let out = rig.verify().await;
    assert!(ok(&out), "another application's triggers: {}", stderr(&out));
    // A rule on one of the gateway's tables; a function its trigger calls given its older
    // body (0012's, before 0013 added a column); the ledger's guard dropped.
    let migration = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres/0012_spend_months.sql"
    ))
    .unwrap();
    let older = migration
        .split("CREATE FUNCTION spend_months_add")
        .nth(1)
        .and_then(|f| f.split("$$;").next())
        .unwrap();
    c.exec(&format!(
        "CREATE RULE loud AS ON DELETE TO admin_sessions DO ALSO SELECT 1; \
         CREATE OR REPLACE FUNCTION spend_months_add{older}$$; \
         DROP TRIGGER ledger_append_only ON ledger"
    ))
    .await;
    c.close().await;
    rig.verify_fails_naming("loud", "the rule on admin_sessions went unnoticed")
        .await;
    rig.verify_fails_naming("spend_months_add", "the older body went unnoticed")
        .await;
    rig.verify_fails_naming(
        "ledger_append_only",
        "the dropped ledger guard went unnoticed",
    )
    .await;
    rig.cli_refuses_naming("loud", "a rule on the gateway's table")
        .await;
}

/// Makes the database refuse the audit row of `action` (a trigger that aborts its insert),
/// to see that an action whose audit row fails leaves nothing of itself behind.
pub(crate) async fn refuse_audit_of(settings: &sluice::config::Settings, action: &str) {
    let mut c = Attacker::of(settings).await;
    let sql = match c.on_postgres() {
        false => format!("CREATE TRIGGER refuse BEFORE INSERT ON audit_log WHEN NEW.action = '{action}' BEGIN SELECT RAISE(ABORT, 'audit row refused'); END"),
        true => format!("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'audit row refused'; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON audit_log FOR EACH ROW WHEN (NEW.action = '{action}') EXECUTE FUNCTION refuse()"),
    };
    c.exec(&sql).await;
    c.close().await;
}

/// s23 attack (auth) #1/#2 on PostgreSQL: a table of another name made to hang off a
/// gateway table by a cascading foreign key is written by the gateway's own transactions
/// (a logout's session delete cascades into it), so a trigger there reaches the log; and a
/// schema trigger recreated with the same timing and events but narrowed to one column
/// (`UPDATE OF`) or given another `WHEN` (a function of the attacker's, run on every spend
/// batch) kept its name and kind. Each is named now.
#[tokio::test]
async fn a_cascade_into_another_table_or_a_trigger_narrowed_or_reconditioned_is_named() {
    let rig = rig().await;
    if rig.app.db().postgres().is_none() {
        return;
    }
    let mut c = rig.attacker().await;
    c.exec("CREATE TABLE side (s TEXT COLLATE \"C\" REFERENCES admin_sessions(id_hash) ON DELETE CASCADE); \
        CREATE FUNCTION cascaded() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
            EXECUTE 'DELETE FROM audit' || '_log WHERE id = (SELECT max(id) FROM audit' || '_log)'; \
            RETURN NULL; END $$; \
        CREATE TRIGGER cascaded AFTER DELETE ON side FOR EACH ROW EXECUTE FUNCTION cascaded()")
        .await;
    rig.verify_fails_naming(
        "cascaded",
        "the trigger on a table the sessions cascade into went unnoticed",
    )
    .await;
    rig.cli_refuses_naming("cascaded", "a trigger reached by a cascade")
        .await;
    // A table inheriting from the sessions: their delete reaches its rows (final attack #2).
    c.exec(
        "DROP TABLE side; \
        CREATE TABLE heir () INHERITS (admin_sessions); \
        CREATE TRIGGER inherited BEFORE DELETE ON heir FOR EACH ROW EXECUTE FUNCTION cascaded()",
    )
    .await;
    rig.verify_fails_naming(
        "inherited",
        "the trigger on a table inheriting the sessions went unnoticed",
    )
    .await;
    c.exec(
        "DROP TABLE heir; \
        DROP TRIGGER audit_append_only ON audit_log; \
        CREATE TRIGGER audit_append_only BEFORE UPDATE OF prev_hash OR DELETE ON audit_log \
            FOR EACH ROW EXECUTE FUNCTION sluice_append_only()",
    )
    .await;
    rig.verify_fails_naming(
        "audit_append_only",
        "the guard narrowed to one column went unnoticed",
    )
    .await;
    c.exec(
        "DROP TRIGGER audit_append_only ON audit_log; \
        CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit_log \
            FOR EACH ROW EXECUTE FUNCTION sluice_append_only(); \
        CREATE FUNCTION hook() RETURNS boolean LANGUAGE sql AS $$ SELECT true $$",
    )
    .await;
    c.exec(&spend_months_follow_when("hook()")).await;
    let out = rig.verify().await;
    assert!(
        !stderr(&out).contains("audit_append_only"),
        "the guard put back: {}",
        stderr(&out)
    );
    rig.verify_fails_naming(
        "spend_months_follow",
        "a WHEN of the attacker's went unnoticed",
    )
    .await;
    c.close().await;
}

/// s23 attack (third batch) #1/#2 on PostgreSQL: a `WHEN` changed inside its literal
/// (`'writ ten'`: every batch's own monthly write added again by the trigger), a schema
/// trigger pointed at a same-named function in another schema (its body word for word,
/// with a `search_path` of the attacker's), and a called function given a `search_path`
/// each passed the check. Each is named now.
#[tokio::test]
async fn a_when_changed_inside_its_literal_or_a_function_elsewhere_or_reconfigured_is_named() {
    let rig = rig().await;
    if rig.app.db().postgres().is_none() {
        return;
    }
    let mut c = rig.attacker().await;
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'writ ten'",
    ))
    .await;
    rig.verify_fails_naming(
        "spend_months_follow",
        "a WHEN changed inside its literal went unnoticed",
    )
    .await;
    c.exec(
        "CREATE FUNCTION ue() RETURNS boolean LANGUAGE sql AS $$ SELECT true $$; \
        CREATE FUNCTION tr(b boolean) RETURNS boolean LANGUAGE sql AS $$ SELECT b $$",
    )
    .await;
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', tr(ue())) IS DISTINCT FROM 'written'",
    ))
    .await;
    rig.verify_fails_naming(
        "spend_months_follow",
        "a WHEN calling functions that spell `true` went unnoticed",
    )
    .await;
    // An operator of the attacker's deparses as `IS DISTINCT FROM` all the same (final
    // attack #1).
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'",
    ))
    .await;
    c.exec("CREATE FUNCTION evil_eq(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT $1 = $2 $$; \
        CREATE OPERATOR public.= (leftarg = text, rightarg = text, function = evil_eq); \
        SET search_path = public, pg_catalog")
        .await;
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'",
    ))
    .await;
    c.exec("RESET search_path").await;
    rig.verify_fails_naming(
        "spend_months_follow",
        "a WHEN on an operator of the attacker's went unnoticed",
    )
    .await;
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'",
    ))
    .await;
    c.exec("DROP OPERATOR public.= (text, text)").await;
    let migration = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres/0002_process_seen_at.sql"
    ))
    .unwrap();
    let body = migration.split("$$").nth(1).unwrap();
    c.exec(&spend_months_follow_when(
        "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'",
    ))
    .await;
    c.exec(&format!(
        "CREATE SCHEMA evil; \
        CREATE FUNCTION evil.processes_seen_at() RETURNS trigger LANGUAGE plpgsql \
            SET search_path = evil, pg_catalog AS $${body}$$; \
        DROP TRIGGER processes_seen_at ON processes; \
        CREATE TRIGGER processes_seen_at BEFORE INSERT OR UPDATE OF heartbeat_at ON processes \
            FOR EACH ROW EXECUTE FUNCTION evil.processes_seen_at()"
    ))
    .await;
    let out = rig.verify().await;
    assert!(
        !stderr(&out).contains("spend_months_follow"),
        "the trigger put back: {}",
        stderr(&out)
    );
    rig.verify_fails_naming(
        "processes_seen_at",
        "a same-named function elsewhere went unnoticed",
    )
    .await;
    c.exec(
        "DROP TRIGGER processes_seen_at ON processes; \
        CREATE TRIGGER processes_seen_at BEFORE INSERT OR UPDATE OF heartbeat_at ON processes \
            FOR EACH ROW EXECUTE FUNCTION processes_seen_at(); \
        ALTER FUNCTION spend_months_add SET search_path = evil, public",
    )
    .await;
    rig.verify_fails_naming(
        "spend_months_add",
        "a called function given a search_path went unnoticed",
    )
    .await;
    c.close().await;
}

/// `spend_months_follow` recreated as its migration made it but with `condition` for its
/// `WHEN` (the migration's own: put back).
fn spend_months_follow_when(condition: &str) -> String {
    format!(
        "DROP TRIGGER spend_months_follow ON spend_days; \
         CREATE TRIGGER spend_months_follow AFTER INSERT OR UPDATE OR DELETE ON spend_days \
             FOR EACH ROW WHEN ({condition}) EXECUTE PROCEDURE spend_months_follow()"
    )
}

/// A head started afresh over a chain other heads were started over is an `audit_head`
/// alert: it trusts every row before it as it is. On PostgreSQL each host keeps a head of
/// its own, named after its host name and folder, and a new one used to start in silence
/// — so a host that lost its head together with its name (a container re-created under a
/// new host name with an empty folder, after someone deleted the newest rows) looked like
/// a new host, and no head ever showed the deletion (s30 multi-host attack F2). On SQLite,
/// one host's chain, the start row of the first head already refuses a missing one.
#[tokio::test]
async fn a_new_head_over_a_chain_other_heads_were_started_over_raises_the_alert() {
    let (app, admin) = alerting_app().await;
    let (s, _) = admin
        .post("/admin/api/v1/teams", &json!({"name": "before"}))
        .await;
    assert_eq!(s, 201);
    // This host's gateway under another folder: a head of another name with an empty
    // folder, as a re-created container's.
    let other = tempfile::tempdir().unwrap();
    sluice::ops::audit_head::start(
        app.db().clone(),
        other.path().to_path_buf(),
        String::new(),
        app.state.clock.clone(),
        app.state.alerts.clone(),
    )
    .await;
    audit_head_alert(&app, "after a new head started over the chain").await;
    let messages: Vec<String> = app
        .mock
        .state
        .stats("webhook")
        .last_bodies
        .iter()
        .filter(|b| b["kind"] == "audit_head")
        .map(|b| b.to_string())
        .collect();
    let expected = match app.db().postgres() {
        Some(_) => "other head(s) were started over before",
        None => "audit.head is missing, but row",
    };
    assert!(
        messages.iter().any(|m| m.contains(expected)),
        "{messages:?}"
    );
}

/// `[backup] head_name` names this host's head in place of its host name, which a
/// re-created container does not keep (s30 multi-host attack F2): the head started under
/// the configured name, and once its folder comes back empty under that name the head is
/// missed — the alarm — rather than started afresh as a new host's.
#[tokio::test]
async fn a_head_named_in_the_config_is_missed_when_its_folder_comes_back_empty() {
    let app = spawn_app_with(|s, _| s.backup.head_name = "gateway-a".into()).await;
    let dir = Path::new(&app.settings.backup.dir);
    assert_eq!(
        app.scalar(
            r#"SELECT COUNT(*) FROM audit_log WHERE action = 'audit.head_started' AND after LIKE '%"head":"gateway-a:%'"#
        )
        .await,
        1,
        "the head was not started under its configured name"
    );
    // The container re-created: a new host name, the folder empty, the head's name kept.
    std::fs::remove_file(dir.join("audit.head")).unwrap();
    let exported = sluice::ops::audit_head::export(app.db(), dir, "gateway-a", chrono::Utc::now())
        .await
        .unwrap();
    assert!(
        matches!(&exported, sluice::ops::audit_head::Exported::Refused(why) if why.contains("audit.head is missing")),
        "{exported:?}"
    );
    assert!(!dir.join("audit.head").exists());
}

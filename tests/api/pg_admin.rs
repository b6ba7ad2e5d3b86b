//! The admin surface through the real gateway on either engine (issue 17 item 1): one test
//! body, run on a SQLite file and on a real PostgreSQL server. `Engine` is the seam: it
//! points a config at one or the other; everything else goes through HTTP, the CLI or
//! store functions, never an engine's own handle.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::Settings;
use sluice::store::requests::RequestRow;
use sluice::store::{audit, ledger, requests};

use crate::admin_helpers::{login, make_login, Session};
use crate::helpers::{spawn_app_with, TestApp};
use crate::pg_server;

/// The master key every test host on PostgreSQL shares (`[database] key_file`).
pub const MASTER_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

pub const ENGINES: [Engine; 2] = [Engine::Sqlite, Engine::Postgres];

/// Writes the shared master key as a 0600 file in `dir`; its path.
pub fn key_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("master.key");
    if !path.exists() {
        std::fs::create_dir_all(dir).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        writeln!(f, "{MASTER_HEX}").unwrap();
    }
    path
}

/// Points `s` at a fresh database on `engine` (a new database on the shared PostgreSQL
/// server, with the shared key file beside the test's backup folder).
pub fn use_engine(engine: Engine, s: &mut Settings) {
    if engine == Engine::Postgres {
        s.database.url = pg_server::database();
        let dir = std::path::Path::new(&s.backup.dir)
            .parent()
            .expect("the backup folder is inside the test's folder")
            .to_path_buf();
        s.database.key_file = Some(key_file(&dir));
    }
}

pub async fn spawn_on(engine: Engine) -> TestApp {
    spawn_app_with(|s, _| use_engine(engine, s)).await
}

/// A config file for the real binary's CLI naming `app`'s database and backup folder.
pub fn cli_config_on(app: &TestApp) -> std::path::PathBuf {
    let path = app.dir.path().join("cli.toml");
    let key = match &app.settings.database.key_file {
        Some(k) => format!("key_file = \"{}\"\n", k.display()),
        None => String::new(),
    };
    std::fs::write(
        &path,
        format!(
            "[database]\nurl = \"{}\"\n{key}[backup]\ndir = \"{}\"\n",
            app.settings.database.url, app.settings.backup.dir
        ),
    )
    .unwrap();
    path
}

/// Runs the real binary with `args` (after `--config`); (success, stdout, stderr).
pub fn sluice(
    config: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("SLUICE_SECRET_KEY")
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sluice migrate-store` from the SQLite file `path` to a fresh PostgreSQL database, with
/// no config (`none.toml` in `dir`): (succeeded, stdout, stderr, the database's URL).
pub fn migrate_to_fresh_pg(
    dir: &std::path::Path,
    path: &std::path::Path,
) -> (bool, String, String, String) {
    let to = crate::pg_server::database();
    let (ok, out, err) = sluice(
        &dir.join("none.toml"),
        &[
            "migrate-store",
            "--from",
            &format!("sqlite://{}", path.display()),
            "--to",
            &to,
        ],
        &[],
    );
    (ok, out, err, to)
}

/// `sluice migrate-store --from from --to to` started with `config`; its output piped if
/// `piped`, else dropped.
pub fn spawn_migrate_store(
    config: &std::path::Path,
    from: &str,
    to: &str,
    piped: bool,
) -> std::process::Child {
    let stdio = || {
        if piped {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        }
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(config)
        .args(["migrate-store", "--from", from, "--to", to])
        .env_remove("SLUICE_SECRET_KEY")
        .stdout(stdio())
        .stderr(stdio())
        .spawn()
        .unwrap()
}

/// One connection to the PostgreSQL database at `url`.
pub async fn pg_connect(url: &str) -> sqlx::PgConnection {
    <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap()
}

/// `GET /v1/models` with `token`: the status (auth only, no money path).
pub async fn models_status(base: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{base}/v1/models"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the gateway answers")
        .status()
        .as_u16()
}

/// Polls `GET /v1/models` with `token` until it answers `want` (bounded: 10 s).
async fn models_until(base: &str, token: &str, want: u16) {
    for _ in 0..200 {
        if models_status(base, token).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base}/v1/models never answered {want}");
}

fn created(what: &str, (status, v): (u16, Value)) -> Value {
    assert_eq!(status, 201, "{what}: {v}");
    v
}

fn okay(what: &str, (status, v): (u16, Value)) -> Value {
    assert_eq!(status, 200, "{what}: {v}");
    v
}

/// The admin API's everyday round: team, user, token, budget edits, rotation, revocation;
/// what each engine answers, for comparison.
async fn admin_round(engine: Engine) -> Vec<Value> {
    let app = spawn_on(engine).await;
    make_login(&app, "root", "admin", None).await;
    let admin: Session = login(&app, "root").await;
    let mut seen = Vec::new();

    let team = created(
        "team",
        admin
            .post(
                "/admin/api/v1/teams",
                &json!({"name": "red", "budget_usd": "50"}),
            )
            .await,
    );
    let team_id = team["id"].as_i64().expect("team id");
    let user = created(
        "user",
        admin
            .post(
                "/admin/api/v1/users",
                &json!({"username": "rosa", "team_id": team_id}),
            )
            .await,
    );
    let user_id = user["id"].as_i64().expect("user id");
    let tok = created(
        "token",
        admin
            .post(
                "/admin/api/v1/tokens",
                &json!({"user_id": user_id, "budget_usd": "5"}),
            )
            .await,
    );
    let (id, text) = (
        tok["id"].as_i64().unwrap(),
        tok["token"].as_str().unwrap().to_string(),
    );
    assert_eq!(tok["limit_micros"], 5_000_000, "{engine:?}");
    assert_eq!(
        models_status(&app.address, &text).await,
        200,
        "{engine:?}: a new token works"
    );

    let edited = okay(
        "budget edit",
        admin
            .patch(
                &format!("/admin/api/v1/tokens/{id}"),
                &json!({"budget_usd": "7", "rpm": 30}),
            )
            .await,
    );
    seen.push(json!([
        edited["limit_micros"],
        edited["remaining_micros"],
        edited["rpm"]
    ]));
    let topped = okay(
        "top-up",
        admin
            .post(
                &format!("/admin/api/v1/tokens/{id}/top-up"),
                &json!({"amount_usd": "1"}),
            )
            .await,
    );
    seen.push(json!([topped["limit_micros"], topped["remaining_micros"]]));
    let team_edit = okay(
        "team budget",
        admin
            .patch(
                &format!("/admin/api/v1/teams/{team_id}"),
                &json!({"budget_usd": "60"}),
            )
            .await,
    );
    seen.push(json!([
        team_edit["limit_micros"],
        team_edit["remaining_micros"]
    ]));

    let rotated = created(
        "rotation",
        admin
            .post(
                &format!("/admin/api/v1/tokens/{id}/rotate"),
                &json!({"overlap_seconds": 3600}),
            )
            .await,
    );
    let (new_id, new_text) = (
        rotated["id"].as_i64().unwrap(),
        rotated["token"].as_str().unwrap().to_string(),
    );
    seen.push(json!([
        rotated["limit_micros"],
        rotated["remaining_micros"]
    ]));
    assert_eq!(
        models_status(&app.address, &new_text).await,
        200,
        "{engine:?}: the new token works"
    );
    assert_eq!(
        models_status(&app.address, &text).await,
        200,
        "{engine:?}: the old one within its overlap"
    );

    let revoked = okay(
        "revoke",
        admin
            .post(&format!("/admin/api/v1/tokens/{new_id}/revoke"), &json!({}))
            .await,
    );
    assert!(revoked["revoked_at"].is_string(), "{engine:?}: {revoked}");
    models_until(&app.address, &new_text, 401).await;
    assert_eq!(
        admin
            .post(&format!("/admin/api/v1/tokens/{new_id}/revoke"), &json!({}))
            .await
            .0,
        409,
        "{engine:?}: a revoked token cannot be revoked again"
    );

    let (_, list) = admin.get_json("/admin/api/v1/tokens").await;
    let mut states: Vec<(i64, bool)> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_i64().unwrap(), t["revoked_at"].is_string()))
        .collect();
    states.sort();
    assert_eq!(states, vec![(id, false), (new_id, true)], "{engine:?}");

    // Every admin action above is one audit row, chained and signed.
    let audit_rows = okay("audit", admin.get_json("/admin/api/v1/audit").await);
    let actions: Vec<String> = audit_rows["rows"]
        .as_array()
        .or(audit_rows["audit"].as_array())
        .expect("audit rows")
        .iter()
        .map(|r| r["action"].as_str().unwrap_or_default().to_string())
        .collect();
    seen.push(json!(actions));
    let chain = audit::verify(app.db(), &app.db().audit).await.unwrap();
    assert_eq!(chain.broken, None, "{engine:?}");
    assert!(chain.rows >= 7, "{engine:?}: {} audit rows", chain.rows);
    assert_eq!(
        ledger::invariant_violations(app.db()).await.unwrap(),
        Vec::<String>::new(),
        "{engine:?}"
    );

    // The pages render from the same store on either engine.
    for page in [
        "/admin/",
        "/admin/dashboard/stats",
        "/admin/teams",
        "/admin/users",
        "/admin/tokens",
        "/admin/requests",
        "/admin/reports",
        "/admin/reports.csv",
        "/admin/audit",
        "/admin/audit/verify",
        "/admin/upstreams",
        "/admin/account",
    ] {
        let r = admin.get(page).await;
        assert_eq!(r.status(), 200, "{engine:?} {page}");
    }

    // `sluice audit verify` on the same database and backup folder: rows, chain and the head
    // the gateway keeps (written off the request path: polled).
    let config = cli_config_on(&app);
    let mut last = (false, String::new(), String::new());
    for _ in 0..50 {
        last = sluice(&config, &["audit", "verify"], &[]);
        if last.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last.0,
        "{engine:?}: audit verify failed: {} {}",
        last.1, last.2
    );
    seen
}

#[tokio::test]
async fn the_admin_api_round_answers_alike_on_both_engines() {
    let mut answers = Vec::new();
    for engine in ENGINES {
        answers.push(admin_round(engine).await);
    }
    assert_eq!(
        answers[0], answers[1],
        "SQLite and PostgreSQL answered differently"
    );
    assert_eq!(answers[0][0], json!([7_000_000, 7_000_000, 30]));
    assert_eq!(answers[0][1], json!([8_000_000, 8_000_000]));
}

fn request(
    i: usize,
    ids: (i64, i64, i64),
    model: &str,
    status: u16,
    cost: i64,
    day: &str,
) -> RequestRow {
    RequestRow {
        trace: Default::default(),
        id: format!("req-{i}"),
        token_id: Some(ids.0),
        presented_token_id: None,
        user_id: Some(ids.1),
        team_id: Some(ids.2),
        endpoint: "chat",
        model: model.into(),
        served_model: model.into(),
        upstream: "a".into(),
        upstream_model: String::new(),
        status,
        error_code: None,
        usage_estimated: false,
        stream: false,
        attempts: 1,
        input_tokens: 10,
        output_tokens: 20,
        cost_micros: cost,
        latency_ms: 5,
        ttfb_ms: None,
        cache: "miss",
        cache_key: None,
        cache_similarity: None,
        created_at: format!("{day}T12:{:02}:{:02}.000Z", i / 60 % 60, i % 60),
        kinds: Default::default(),
        tags: String::new(),
        fixed_tags: String::new(),
    }
}

/// Two teams' traffic written through the store, then every report the admin API gives.
async fn reports(engine: Engine) -> Vec<Value> {
    let app = spawn_on(engine).await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let mut ids = Vec::new();
    for (team, user) in [("red", "rosa"), ("blue", "bert")] {
        let t = created(
            "team",
            admin
                .post("/admin/api/v1/teams", &json!({"name": team}))
                .await,
        );
        let u = created(
            "user",
            admin
                .post(
                    "/admin/api/v1/users",
                    &json!({"username": user, "team_id": t["id"]}),
                )
                .await,
        );
        let k = created(
            "token",
            admin
                .post("/admin/api/v1/tokens", &json!({"user_id": u["id"]}))
                .await,
        );
        ids.push((
            k["id"].as_i64().unwrap(),
            u["id"].as_i64().unwrap(),
            t["id"].as_i64().unwrap(),
        ));
    }
    let mut rows: Vec<RequestRow> = (0..30)
        .map(|i| request(i, ids[0], "gpt-4o-mini", 200, 100 + i as i64, "2026-10-03"))
        .collect();
    rows.push(request(30, ids[0], "gpt-4o-mini", 429, 0, "2026-10-04"));
    rows.push(request(
        31,
        ids[1],
        "text-embedding-3-small",
        200,
        7,
        "2026-10-04",
    ));
    rows.push(request(32, ids[1], "gpt-4o-mini", 502, 0, "2026-10-05"));
    rows.push(request(33, ids[1], "gpt-4o-mini", 200, 1000, "2026-11-01"));
    requests::insert_batch(app.db(), &rows).await.unwrap();

    let mut out = Vec::new();
    for q in [
        "reports/spend?month=2026-10&by=team",
        "reports/spend?month=2026-10&by=user",
        "reports/spend?month=2026-10&by=model",
        "reports/spend?month=2026-10&by=token",
        "reports/spend?month=2026-11&by=day",
        "requests?status=5xx",
        "requests?team=2",
        "requests?from=2026-10-04&to=2026-10-04",
    ] {
        let v = okay(q, admin.get_json(&format!("/admin/api/v1/{q}")).await);
        out.push(json!({"q": q, "v": without_prefixes(v)}));
    }
    let csv = admin
        .get("/admin/api/v1/reports/spend?month=2026-10&by=user&format=csv")
        .await;
    assert_eq!(csv.status(), 200, "{engine:?}");
    out.push(json!(csv.text().await.unwrap()));
    out
}

/// Token display prefixes are random: `"AbCd1234… (rosa)"` reads `"(rosa)"`, and a
/// `prefix` field is left out.
fn without_prefixes(v: Value) -> Value {
    match v {
        Value::String(s) => match s.split_once("… (") {
            Some((_, rest)) => Value::String(format!("({rest}")),
            None => Value::String(s),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(without_prefixes).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(k, _)| k != "prefix")
                .map(|(k, v)| (k, without_prefixes(v)))
                .collect(),
        ),
        v => v,
    }
}

#[tokio::test]
async fn reports_and_the_request_log_answer_alike_on_both_engines() {
    let lite = reports(Engine::Sqlite).await;
    let pg = reports(Engine::Postgres).await;
    for (a, b) in lite.iter().zip(&pg) {
        assert_eq!(a, b, "SQLite and PostgreSQL answered differently");
    }
    let team = &lite[0]["v"];
    assert!(
        team.to_string().contains("3435"),
        "red's October spend is Σ(100..130) = 3435: {team}"
    );
}

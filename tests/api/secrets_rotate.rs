//! `sluice secrets rotate` (issue 19 item 2): the database moved to a new master key, on
//! the suite's engine, through the real binary. After it the gateway starts with the new
//! key and serves a managed key, refuses the old key with the wrong-key message, and
//! `sluice audit verify` passes; the database holds no upstream key in clear. Refused —
//! with nothing changed — while a gateway runs, under a wrong current key, and over an
//! audit chain that does not verify.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::audit_tamper::{stderr, Attacker, Tamper};
use crate::gateway_proc::{free_port, open_dir_db, start_gateway_full, write_config, Gateway};
use crate::helpers::*;
use crate::pg_gateway_app::Engine;

const MANAGED_KEY: &str = "sk-rotate-managed-0001-LMNO";
const NEW_KEY_HEX: &str = "7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b7b";

/// A managed upstream `m1` (its key sealed in the database) behind the model `managed`,
/// added as the admin API adds them, and a token; the database closed again.
async fn seed(dir: &Path, mock: &sluice::mock::MockServer) -> String {
    let db = open_dir_db(dir).await;
    let now = chrono::Utc::now();
    let u = sluice::admin::upstream_ops::parse_upstream(json!({
        "id": "m1", "provider": "openai", "base_url": format!("{}/v1", mock.base_url()),
        "api_key": MANAGED_KEY, "allow_private_network": true,
    }))
    .unwrap();
    let row = sluice::store::managed::UpstreamRow::sealed(
        "m1",
        sluice::upstream::live::stored_settings(&u),
        true,
        MANAGED_KEY,
        &db.seal,
    );
    let mut m = model("managed", &["m1"]);
    m.routes[0].model = "managed-upstream".into();
    let mut tx = db.begin().await.unwrap();
    sluice::store::managed::insert_upstream(&mut tx, &row, &sluice::clock::db_time(now))
        .await
        .unwrap();
    let mrow = sluice::store::managed::ModelRow {
        name: "managed".into(),
        settings: serde_json::to_string(&m).unwrap(),
    };
    sluice::store::managed::put_model(&mut tx, &mrow, &sluice::clock::db_time(now))
        .await
        .unwrap();
    sluice::store::managed::bump_epoch(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let token = sluice::cli::token_issue(&db, &issue_args("ann"), now)
        .await
        .unwrap()
        .text;
    db.close().await;
    token
}

/// The file the gateways on `dir` read their master key from.
fn key_file(dir: &Path) -> PathBuf {
    match test_engine() {
        Engine::Sqlite => dir.join("sluice.db.key"),
        Engine::Postgres => dir.join("shared.key"),
    }
}

/// A 0600 file holding `hex`.
fn write_key(path: &Path, hex: &str) {
    std::fs::write(path, hex).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The CLI on `dir`'s database (the config of `write_config`), with `env`.
fn cli(dir: &Path, mock: &sluice::mock::MockServer, args: &[&str], env: &[(&str, &str)]) -> Output {
    let config = write_config(dir, mock, 0, "");
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(&config)
        .args(args)
        .env_remove("SLUICE_SECRET_KEY")
        .env_remove("SLUICE_NEW_SECRET_KEY")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn rotate(dir: &Path, mock: &sluice::mock::MockServer, new_key: &Path) -> Output {
    cli(
        dir,
        mock,
        &[
            "secrets",
            "rotate",
            "--new-key-file",
            new_key.to_str().unwrap(),
        ],
        &[],
    )
}

/// Stops a gateway as its supervisor would (SIGTERM) and waits for it to exit, so it has
/// left the process table.
fn stop(mut g: Gateway) {
    let pid = g.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while g.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A gateway started on `dir` that must refuse to start: its exit status and log.
fn refused_start(dir: &Path, mock: &sluice::mock::MockServer) -> String {
    let port = free_port();
    let config = write_config(dir, mock, port, "");
    let log = dir.join(format!("refused-{port}.log"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env_remove("SLUICE_SECRET_KEY")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a gateway under the old key started (or hung)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    std::fs::read_to_string(&log).unwrap()
}

async fn ask(url: &str, token: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&json!({"model": "managed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// Everything the database holds, as text (SQLite: the file and its WAL).
async fn contents(dir: &Path, key_hex: &str) -> String {
    match test_engine() {
        Engine::Sqlite => ["sluice.db", "sluice.db-wal"]
            .iter()
            .map(|f| {
                String::from_utf8_lossy(&std::fs::read(dir.join(f)).unwrap_or_default())
                    .into_owned()
            })
            .collect(),
        Engine::Postgres => {
            let url = std::fs::read_to_string(dir.join("pg-url")).unwrap();
            let key = sluice::secrets::MasterKey::from_hex(key_hex).unwrap();
            let db = sluice::store::Db::open_postgres(&url, &key).await.unwrap();
            let text = postgres_contents(&db).await.unwrap();
            db.close().await;
            text
        }
    }
}

fn current_hex(dir: &Path) -> String {
    std::fs::read_to_string(key_file(dir))
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test]
async fn after_rotate_the_new_key_serves_the_managed_key_and_the_old_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .unwrap();
    let token = seed(dir.path(), &mock).await;
    let old_hex = current_hex(dir.path());
    let new_key = dir.path().join("new.key");
    write_key(&new_key, NEW_KEY_HEX);

    let g = start_gateway_full(dir.path(), &mock, &[], "").await;
    let (status, body) = ask(&g.url, &token).await;
    assert_eq!(status, 200, "{body}");
    let out = rotate(dir.path(), &mock, &new_key);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("a gateway is running on this database"),
        "{}",
        stderr(&out)
    );
    stop(g);

    // A current key that is not the database's: refused before anything is written.
    write_key(&key_file(dir.path()), &"cd".repeat(32));
    let out = rotate(dir.path(), &mock, &new_key);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("master key"), "{}", stderr(&out));
    write_key(&key_file(dir.path()), &old_hex);

    let out = rotate(dir.path(), &mock, &new_key);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 upstream keys sealed again"), "{said}");

    // The old key: refused at start, with the wrong-key message.
    let log = refused_start(dir.path(), &mock);
    let expected = match test_engine() {
        Engine::Sqlite => "the master key does not open the stored upstream keys",
        Engine::Postgres => "did not sign the audit chain",
    };
    assert!(log.contains(expected), "{log}");

    // The new key in place: the managed key is served, and the log verifies.
    write_key(&key_file(dir.path()), NEW_KEY_HEX);
    let g = start_gateway_full(dir.path(), &mock, &[], "").await;
    let (status, body) = ask(&g.url, &token).await;
    assert_eq!(status, 200, "{body}");
    assert!(mock.state.stats(MANAGED_KEY).count >= 2);
    stop(g);
    let out = cli(dir.path(), &mock, &["audit", "verify"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = audit_rows_text(dir.path()).await;
    assert!(log.contains("secrets.rotate"), "{log}");
    // The log's append-only guard is back after the rewrite.
    let mut c = Attacker::of_dir(dir.path()).await;
    let refused = c.try_exec("UPDATE audit_log SET actor = 'x'").await;
    assert!(refused.unwrap_err().to_string().contains("append-only"));
    c.close().await;

    let text = contents(dir.path(), NEW_KEY_HEX).await;
    assert!(text.contains("LMNO"), "the scan sees the managed row");
    assert!(!text.contains(MANAGED_KEY) && !text.contains(&MANAGED_KEY[3..]));
    for hex in [NEW_KEY_HEX, old_hex.as_str()] {
        assert!(!text.contains(hex), "the database holds a master key");
    }
}

/// The audit rows' actions, as the CLI's verify does not list them.
async fn audit_rows_text(dir: &Path) -> String {
    let mut c = Attacker::of_dir(dir).await;
    let rows: Vec<(String, String)> = c
        .fetch("SELECT action, actor FROM audit_log ORDER BY id")
        .await;
    c.close().await;
    format!("{rows:?}")
}

#[tokio::test]
async fn a_chain_that_does_not_verify_is_not_carried_over_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .unwrap();
    let token = seed(dir.path(), &mock).await;
    let g = start_gateway_full(dir.path(), &mock, &[], "").await;
    assert_eq!(ask(&g.url, &token).await.0, 200);
    stop(g);
    let mut c = Attacker::of_dir(dir.path()).await;
    c.lift_update_guard().await;
    c.exec(
        "UPDATE audit_log SET after = '{\"forged\":1}' WHERE id = (SELECT MIN(id) FROM audit_log)",
    )
    .await;
    c.close().await;
    let new_key = dir.path().join("new.key");
    write_key(&new_key, NEW_KEY_HEX);
    let out = rotate(dir.path(), &mock, &new_key);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("does not verify under the current master key"),
        "{err}"
    );
    assert!(err.contains("changed after it was written"), "{err}");
    // Nothing was changed: the old key still starts the gateway and opens the managed key.
    let g = start_gateway_full(dir.path(), &mock, &[], "").await;
    let (status, body) = ask(&g.url, &token).await;
    assert_eq!(status, 200, "{body}");
    stop(g);
}

#[tokio::test]
async fn the_new_key_comes_from_exactly_one_place() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .unwrap();
    seed(dir.path(), &mock).await;
    let out = cli(dir.path(), &mock, &["secrets", "rotate"], &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("SLUICE_NEW_SECRET_KEY"),
        "{}",
        stderr(&out)
    );
    let same = dir.path().join("same.key");
    write_key(&same, &current_hex(dir.path()));
    let out = rotate(dir.path(), &mock, &same);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is the current one"),
        "{}",
        stderr(&out)
    );
    let open = dir.path().join("open.key");
    std::fs::write(&open, NEW_KEY_HEX).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = rotate(dir.path(), &mock, &open);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("open to others"), "{}", stderr(&out));
    // Through the environment instead: done. No gateway ever served this database, so no
    // head was started: rotation starts it (recorded in the log) under the new key.
    let out = cli(
        dir.path(),
        &mock,
        &["secrets", "rotate"],
        &[("SLUICE_NEW_SECRET_KEY", NEW_KEY_HEX)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(audit_rows_text(dir.path())
        .await
        .contains("audit.head_started"));
    let out = cli(
        dir.path(),
        &mock,
        &["audit", "verify"],
        &[("SLUICE_SECRET_KEY", NEW_KEY_HEX)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The newest audit rows deleted (the chain itself still links): the signed head shows it,
/// and rotation refuses rather than sign a new head over the shortened log.
#[tokio::test]
async fn a_log_whose_newest_rows_were_deleted_is_not_re_signed() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .unwrap();
    seed(dir.path(), &mock).await;
    let g = start_gateway_full(dir.path(), &mock, &[], "").await;
    stop(g);
    let out = cli(dir.path(), &mock, &["audit", "verify"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut c = Attacker::of_dir(dir.path()).await;
    c.lift_delete_guard().await;
    c.exec("DELETE FROM audit_log WHERE id = (SELECT MAX(id) FROM audit_log)")
        .await;
    c.restore_delete_guard().await;
    c.close().await;
    let new_key = dir.path().join("new.key");
    write_key(&new_key, NEW_KEY_HEX);
    let out = rotate(dir.path(), &mock, &new_key);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("audit head mismatch"), "{err}");
    assert!(err.contains("rows were deleted"), "{err}");
}

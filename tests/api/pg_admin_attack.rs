//! Attacks on the PostgreSQL admin path (issue 17): a host started with another master key
//! than the one the shared audit chain is signed with, and an admin write transaction stuck
//! while it holds the admin advisory lock.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::mock::{MockConfig, MockServer};
use sluice::secrets::MasterKey;
use sluice::store::Db;
use sqlx::Connection;

use crate::gateway_proc::{free_port, write_config};
use crate::pg_admin::MASTER_HEX;
use crate::pg_server;

const OTHER_HEX: &str = "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5";

/// A gateway started on a PostgreSQL database whose audit chain another key signed would
/// append rows no other host can verify (the chain breaks for good at its first admin
/// action): it must refuse to start, naming the key, and write nothing.
#[tokio::test]
async fn a_host_with_another_master_key_refuses_to_start_on_a_shared_database() {
    let url = pg_server::database();
    let key = MasterKey::from_hex(MASTER_HEX).unwrap();
    let db = Db::open_postgres(&url, &key).await.unwrap();
    sluice::cli::admin_create(
        &db,
        "root",
        "admin",
        None,
        "a long enough password 1".into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let rows_before = sluice::store::audit::verify(&db, &db.audit)
        .await
        .unwrap()
        .rows;
    assert!(rows_before > 0);

    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &mock, port, "");
    let log = dir.path().join("gateway.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("SLUICE_DATABASE_URL", &url)
        .env("SLUICE_SECRET_KEY", OTHER_HEX)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Ok(status);
        }
        if reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break Err("it serves");
        }
        if Instant::now() > deadline {
            break Err("it neither served nor exited within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let status = outcome.unwrap_or_else(|why| {
        panic!("a gateway holding another master key than the audit chain's: {why}\n{text}")
    });
    assert!(!status.success(), "{text}");
    assert!(text.contains("key"), "the refusal names the key: {text}");
    assert!(!text.contains(OTHER_HEX) && !text.contains(MASTER_HEX));
    // Nothing was appended under the other key: the chain still verifies whole.
    let after = sluice::store::audit::verify(&db, &db.audit).await.unwrap();
    assert!(after.broken.is_none(), "{:?}", after.broken);
}

/// Starts `sluice serve` on `url` with master key `hex`; whether it served (`Ok`, the
/// process left running in the returned child) or exited (`Err` with its log).
async fn serve_with_key(
    url: &str,
    hex: &str,
    mock: &MockServer,
    dir: &std::path::Path,
) -> (std::process::Child, Result<(), String>) {
    let port = free_port();
    let config = write_config(dir, mock, port, "");
    let log = dir.join(format!("gateway-{port}.log"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("SLUICE_DATABASE_URL", url)
        .env("SLUICE_SECRET_KEY", hex)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            return (
                child,
                Err(std::fs::read_to_string(&log).unwrap_or_default()),
            );
        }
        if reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return (child, Ok(()));
        }
        assert!(
            Instant::now() < deadline,
            "neither served nor exited in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two hosts holding different keys, started at once on a new shared database (an empty
/// audit log: nothing to check a key against yet): whatever the interleaving, the audit
/// chain must not end up signed by both — one of them refuses.
#[tokio::test]
async fn two_hosts_with_different_keys_started_at_once_do_not_fork_the_chain() {
    let url = pg_server::database();
    let k1 = MasterKey::from_hex(MASTER_HEX).unwrap();
    let k2 = MasterKey::from_hex(OTHER_HEX).unwrap();
    // Migrated before either host starts (as in pg_admin_hosts).
    let db1 = Db::open_postgres(&url, &k1).await.unwrap();
    let db2 = Db::open_postgres(&url, &k2).await.unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ((mut a, ra), (mut b, rb)) = tokio::join!(
        serve_with_key(&url, MASTER_HEX, &mock, dirs[0].path()),
        serve_with_key(&url, OTHER_HEX, &mock, dirs[1].path()),
    );
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let under1 = sluice::store::audit::verify(&db1, &db1.audit)
        .await
        .unwrap();
    let under2 = sluice::store::audit::verify(&db2, &db2.audit)
        .await
        .unwrap();
    eprintln!(
        "host 1 served: {}, host 2 served: {}; rows {}",
        ra.is_ok(),
        rb.is_ok(),
        under1.rows
    );
    assert!(
        under1.broken.is_none() || under2.broken.is_none(),
        "the chain is broken under either key: {:?} / {:?}",
        under1.broken,
        under2.broken
    );
}

/// An admin write transaction stuck while holding the admin advisory lock (a host frozen
/// mid-transaction, a connection left idle in transaction) must not block every admin and
/// CLI write on every host for ever: the next writer gives up with an error the caller can
/// retry, as SQLite's busy timeout does.
#[tokio::test]
async fn an_admin_write_gives_up_when_another_host_holds_the_admin_lock() {
    let url = pg_server::database();
    let key = MasterKey::from_hex(MASTER_HEX).unwrap();
    let db = Db::open_postgres(&url, &key).await.unwrap();
    // The stuck host: a transaction that took the admin lock and never ends.
    let mut stuck = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut held = stuck.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(sluice::store::pg::ADMIN_WRITE_LOCK)
        .execute(&mut *held)
        .await
        .unwrap();

    let started = Instant::now();
    let attempt = tokio::time::timeout(
        Duration::from_secs(90),
        sluice::cli::admin_create(
            &db,
            "root",
            "admin",
            None,
            "a long enough password 1".into(),
            chrono::Utc::now(),
        ),
    )
    .await;
    let waited = started.elapsed();
    let result = attempt.unwrap_or_else(|_| {
        panic!("the admin write still waits for the stuck host's lock after {waited:?}")
    });
    let err = result.expect_err("the write cannot have happened under the stuck lock");
    eprintln!("gave up after {waited:?}: {err}");

    // Once the stuck transaction ends, the write goes through.
    held.rollback().await.unwrap();
    sluice::cli::admin_create(
        &db,
        "root",
        "admin",
        None,
        "a long enough password 1".into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
}

/// The database password never reaches the operator's screen or logs, whichever way the
/// URL carries it: in its user part, as sqlx's `?password=` parameter, or in a URL the
/// masking cannot parse (a bad port, an unknown scheme).
#[tokio::test]
async fn the_database_password_is_masked_however_the_url_carries_it() {
    const PW: &str = "hunter2-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let key = crate::pg_admin::key_file(dir.path());
    let config = dir.path().join("sluice.toml");
    for url in [
        format!("postgres://sluice:{PW}@127.0.0.1:1/sluice"),
        format!("postgres://sluice@127.0.0.1:1/sluice?password={PW}"),
        format!("postgresql://sluice@127.0.0.1:1/sluice?sslmode=disable&password={PW}"),
        format!("postgres://sluice:{PW}@127.0.0.1:99999/sluice"),
        format!("mysql://sluice:{PW}@127.0.0.1:99999/sluice"),
    ] {
        std::fs::write(
            &config,
            format!(
                "[database]\nurl = \"{url}\"\nkey_file = \"{}\"\n",
                key.display()
            ),
        )
        .unwrap();
        for args in [&["check-config"][..], &["migrate"][..]] {
            let (_, out, err) = crate::pg_admin::sluice(&config, args, &[]);
            assert!(
                !out.contains(PW) && !err.contains(PW),
                "`sluice {args:?}` on {url} shows the password:\n{out}\n{err}"
            );
        }
    }
}

/// A statement PostgreSQL refuses for what it holds is a refusal, not an outage: SQLite's
/// busy and locked codes (5 and 6 in the low byte) must not be read into PostgreSQL's
/// five-digit SQLSTATEs — `22021` (a NUL in text: 22021 & 0xff = 5) would have the
/// lingering writer hold its batch for five minutes as "out of reach", and the money path
/// answer 503 for a request that cannot succeed.
#[tokio::test]
async fn a_postgres_refusal_whose_sqlstate_ends_like_sqlite_busy_is_not_an_outage() {
    let url = pg_server::database();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let e = sqlx::query("SELECT $1::text")
        .bind("a\0b")
        .execute(&mut conn)
        .await
        .expect_err("PostgreSQL's text cannot hold NUL");
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("22021"), "{e}");
    let e = sluice::store::StoreError::from(e);
    assert!(
        !e.is_unavailable(),
        "{e} is read as the database out of reach"
    );
}

/// A revocation while every host's `LISTEN` connection has just been killed (the
/// notification is lost): host B still refuses the token within a second, through the
/// reconnection's "lost" and the epoch poll.
#[tokio::test]
async fn a_revocation_reaches_the_other_host_when_its_notification_is_lost() {
    use serde_json::json;
    let h = crate::pg_admin_hosts::two_hosts().await;
    sluice::cli::admin_create(
        &h.db,
        "root",
        "admin",
        None,
        crate::admin_helpers::PASSWORD.into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let admin = crate::pg_admin_hosts::login_at(&h.a.url, "root").await;
    let (_, team) = admin
        .post("/admin/api/v1/teams", &json!({"name": "red"}))
        .await;
    let (_, u) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": team["id"]}),
        )
        .await;
    let (s, tok) = admin
        .post("/admin/api/v1/tokens", &json!({"user_id": u["id"]}))
        .await;
    assert_eq!(s, 201, "{tok}");
    let (id, text) = (
        tok["id"].as_i64().unwrap(),
        tok["token"].as_str().unwrap().to_string(),
    );
    use crate::pg_admin::models_status;
    for _ in 0..3 {
        assert_eq!(models_status(&h.b.url, &text).await, 200);
    }
    let t = Instant::now();
    assert_eq!(models_status(&h.b.url, &text).await, 200);
    let call = t.elapsed();
    let pool = h.db.postgres().unwrap().pool.clone();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!killed.is_empty(), "no listener connection found");
    let (s, _) = admin
        .post(&format!("/admin/api/v1/tokens/{id}/revoke"), &json!({}))
        .await;
    assert_eq!(s, 200);
    let revoked_at = Instant::now();
    loop {
        if models_status(&h.b.url, &text).await == 401 {
            break;
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(10),
            "still served after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = revoked_at.elapsed();
    eprintln!(
        "killed {} listeners; refused on B after {after:?} (one call {call:?})",
        killed.len()
    );
    assert!(after <= Duration::from_secs(1) + call * 3, "{after:?}");
}

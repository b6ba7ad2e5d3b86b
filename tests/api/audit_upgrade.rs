//! Upgrading from the plain SHA-256 chain, and restoring a backup: the old rows are sealed
//! and stay verifiable, relabelling keyed rows as old ones does not verify, and a restore
//! keeps the head of the database it replaced aside. Driven through the real binary. And
//! the upgrade that drops the sign-in throttle's counters kept by typed name.

use std::path::{Path, PathBuf};
use std::process::Output;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::Connection;

use crate::audit_tamper::{ok, rewrite_chain, sha256_fields, stderr, Rewrite};
use crate::helpers::write_cli_config;

/// A database as the previous version left it: every migration before the keyed chain,
/// and audit rows chained with plain SHA-256. Returns a config for it.
async fn legacy_database(dir: &Path) -> PathBuf {
    let old = dir.join("old-migrations");
    std::fs::create_dir_all(&old).unwrap();
    for e in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0013" {
            std::fs::copy(&p, old.join(name)).unwrap();
        }
    }
    let db = dir.join("sluice.db");
    let mut c = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::migrate::Migrator::new(old.as_path())
        .await
        .unwrap()
        .run(&mut c)
        .await
        .unwrap();
    let mut prev = "0".repeat(64);
    for (i, action) in ["team.create", "user.create", "token.issue"]
        .iter()
        .enumerate()
    {
        let after = format!("{{\"n\":{i}}}");
        let at = format!("2026-11-0{}T10:00:00.000Z", i + 1);
        let hash = sha256_fields(
            &prev,
            &[
                Some("cli"),
                Some(""),
                Some(action),
                Some("x"),
                None,
                Some(&after),
                Some(&at),
            ],
        );
        sqlx::query("INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash) VALUES ('cli', '', ?, 'x', NULL, ?, ?, ?, ?)")
            .bind(action)
            .bind(&after)
            .bind(&at)
            .bind(&prev)
            .bind(&hash)
            .execute(&mut c)
            .await
            .unwrap();
        prev = hash;
    }
    c.close().await.unwrap();
    write_cli_config(&dir.join("sluice.toml"), &db, &dir.join("backup"))
}

fn sluice(config: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("SLUICE_SECRET_KEY")
        .output()
        .unwrap()
}

async fn open_plain(config: &Path) -> SqliteConnection {
    let db = config.with_file_name("sluice.db");
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(db))
        .await
        .unwrap()
}

#[tokio::test]
async fn an_upgraded_database_seals_its_old_rows_and_goes_on_keyed() {
    let dir = tempfile::tempdir().unwrap();
    let config = legacy_database(dir.path()).await;
    // The upgrade itself: the old rows verify, and are sealed by one keyed row.
    let first = sluice(&config, &["migrate"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let out = sluice(&config, &["team", "create", "--name", "after-upgrade"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = sluice(&config, &["audit", "verify"]);
    assert!(ok(&out), "{}", stderr(&out));
    // 3 old rows, the seal, the first head's `audit.head_started` (`migrate`'s), the team.
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 rows verified"));
    let mut c = open_plain(&config).await;
    let chain: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT action, chain, after FROM audit_log ORDER BY id")
            .fetch_all(&mut c)
            .await
            .unwrap();
    assert_eq!(
        chain.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        [
            "sha256",
            "sha256",
            "sha256",
            "hmac-sha256",
            "hmac-sha256",
            "hmac-sha256"
        ]
    );
    assert_eq!(chain[3].0, "audit.keyed");
    assert_eq!(chain[4].0, "audit.head_started");
    assert_eq!(chain[3].2.as_deref(), Some("{\"legacy_rows\":3}"));
    // An old row edited afterwards is still named.
    sqlx::query("DROP TRIGGER audit_no_update")
        .execute(&mut c)
        .await
        .unwrap();
    sqlx::query("UPDATE audit_log SET target = 'y' WHERE id = 2")
        .execute(&mut c)
        .await
        .unwrap();
    let out = sluice(&config, &["audit", "verify"]);
    assert!(!ok(&out));
    assert!(stderr(&out).contains("broken at row 2"), "{}", stderr(&out));
}

#[tokio::test]
async fn relabelling_keyed_rows_as_old_ones_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let config = legacy_database(dir.path()).await;
    let out = sluice(&config, &["team", "create", "--name", "after-upgrade"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Everything becomes an "old" row, re-hashed with SHA-256: a consistent chain of the
    // kind the previous version accepted.
    let mut c = open_plain(&config).await;
    rewrite_chain(&mut c, 1, &Rewrite::Sha256).await;
    sqlx::query("UPDATE audit_log SET chain = 'sha256'")
        .execute(&mut c)
        .await
        .unwrap();
    let out = sluice(&config, &["audit", "verify"]);
    assert!(!ok(&out), "a chain relabelled as unkeyed passed");
    assert!(stderr(&out).contains("broken at row 1"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_restore_keeps_the_old_head_aside_and_starts_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let db = dir.path().join("sluice.db");
    let backup = dir.path().join("backup");
    write_cli_config(&config, &db, &backup);
    let run = |args: &[&str]| {
        let out = sluice(&config, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["team", "create", "--name", "one"]);
    let written = run(&["backup"]);
    let file = written.trim().rsplit(' ').next().unwrap().to_string();
    run(&["team", "create", "--name", "two"]);
    // The restored database is older than the head: that is a rollback the operator made.
    run(&["restore", &file]);
    let kept: Vec<String> = std::fs::read_dir(&backup)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("audit.head.before-restore-"))
        .collect();
    assert_eq!(kept.len(), 1, "the old head is kept aside");
    let out = sluice(&config, &["audit", "verify"]);
    assert!(ok(&out), "{}", stderr(&out));
    // The backup's team and first `audit.head_started` row, and the restore's own.
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 rows verified"));
    let mut c = open_plain(&config).await;
    let (actor, after): (String, String) = sqlx::query_as(
        "SELECT actor, after FROM audit_log WHERE action = 'audit.head_started' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(actor, "cli");
    assert!(after.contains("restore of"), "{after}");
}

/// `sluice backup` into the folder the scheduled backups use must take the folder's
/// `backup.lock` like they do: it prunes to `keep` as well, so run while a gateway's
/// scheduled backup is being written (lock held) it could delete that backup between its
/// `VACUUM INTO` and its integrity check (`keep = 1`), failing it with a `backup_failed`
/// alert. It waits for the lock instead.
#[test]
fn the_backup_command_waits_for_the_folders_backup_lock() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let db = dir.path().join("sluice.db");
    let backup = dir.path().join("backup");
    write_cli_config(&config, &db, &backup);
    let out = sluice(&config, &["team", "create", "--name", "one"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::create_dir_all(&backup).unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(backup.join("backup.lock"))
        .unwrap();
    lock.try_lock().unwrap();
    let cli = std::thread::spawn({
        let config = config.clone();
        move || sluice(&config, &["backup"])
    });
    let backups = || {
        std::fs::read_dir(&backup)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("sluice-") && n.ends_with(".db"))
            .count()
    };
    // Time enough for the command to start, open the database and write a backup.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while std::time::Instant::now() < until {
        assert!(
            !cli.is_finished() && backups() == 0,
            "`sluice backup` wrote into the folder while another process held backup.lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(lock);
    let out = cli.join().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(backups(), 1);
}

/// Review s21 (the sign-in throttle): the counters by typed name kept what was typed in
/// clear, and the sweep keeps the newest rows however old. Migration 0026 drops them (the
/// names' counts start again; now each name counts under its MAC); the addresses' stay.
#[tokio::test]
async fn the_upgrade_drops_the_throttle_counters_kept_by_typed_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = legacy_database(dir.path()).await;
    let mut c = open_plain(&config).await;
    sqlx::query(
        "INSERT INTO login_failures (key, at) VALUES ('user:hunter2', '2026-12-01T10:00:00.000Z'),
                                                     ('addr:198.51.100.7', '2026-12-01T10:00:00.000Z')",
    )
    .execute(&mut c)
    .await
    .unwrap();
    c.close().await.unwrap();
    let out = sluice(&config, &["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut c = open_plain(&config).await;
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM login_failures")
        .fetch_all(&mut c)
        .await
        .unwrap();
    assert_eq!(keys, ["addr:198.51.100.7"]);
}

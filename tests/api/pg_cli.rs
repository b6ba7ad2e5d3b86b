//! The real binary's commands on PostgreSQL (issue 17 item 1: every CLI command works on
//! either engine): each command that takes `--config` against a fresh PostgreSQL database;
//! `backup` and `restore` refuse, naming what to use instead.

use serde_json::Value;

use crate::pg_admin::{key_file, sluice};
use crate::pg_server;

#[tokio::test]
async fn every_database_command_works_on_postgres_and_file_backups_refuse_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let url = pg_server::database();
    let key = key_file(dir.path());
    let backup = dir.path().join("backup");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{url}\"\nkey_file = \"{}\"\n[backup]\ndir = \"{}\"\n",
            key.display(),
            backup.display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let (ok, out, err) = sluice(
            &config,
            args,
            &[("SLUICE_ADMIN_PASSWORD", "correct horse battery staple")],
        );
        assert!(ok, "sluice {args:?} failed: {out}\n{err}");
        out
    };

    let checked = sluice(&config, &["check-config"], &[]);
    assert!(checked.0, "{checked:?}");
    assert!(checked.1.contains("postgres://"), "{checked:?}");
    assert!(run(&["migrate"]).contains("up to date"));
    run(&["admin", "create", "--username", "root", "--role", "admin"]);
    run(&["team", "create", "--name", "red", "--budget-usd", "50"]);
    run(&[
        "user",
        "create",
        "--username",
        "rosa",
        "--team",
        "red",
        "--budget-usd",
        "20",
    ]);
    let issued: Value = serde_json::from_str(
        run(&[
            "token",
            "issue",
            "--user",
            "rosa",
            "--budget-usd",
            "5",
            "--json",
        ])
        .trim(),
    )
    .expect("token issue --json prints one object");
    let id = issued["id"].as_i64().expect("id");
    assert!(issued["token"].as_str().unwrap().starts_with("sk-sl-"));
    let listed: Value = serde_json::from_str(run(&["token", "list", "--json"]).trim()).unwrap();
    let row = &listed[0];
    assert_eq!(
        (
            row["id"].as_i64(),
            row["user"].as_str(),
            row["team"].as_str(),
            row["limit_micros"].as_i64(),
            row["remaining_micros"].as_i64(),
            row["spent_micros"].as_i64()
        ),
        (
            Some(id),
            Some("rosa"),
            Some("red"),
            Some(5_000_000),
            Some(5_000_000),
            Some(0)
        ),
        "{listed}"
    );
    run(&["token", "revoke", &id.to_string()]);
    let listed: Value = serde_json::from_str(run(&["token", "list", "--json"]).trim()).unwrap();
    assert_eq!(listed[0]["revoked"], true, "{listed}");
    run(&["admin", "unlock", "--username", "root"]);
    run(&["admin", "reset-password", "--username", "root"]);
    assert!(run(&["audit", "rearm", "--reason", "a test"]).contains("head"));
    run(&["cache", "invalidate", "--tag", "docs"]);
    // Audited like the admin API's invalidation (it wrote no row before).
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (after,): (String,) = sqlx::query_as(
        "SELECT after FROM audit_log WHERE action = 'cache.invalidate' AND target = 'cache-tag:docs'",
    )
    .fetch_one(&pool)
    .await
    .expect("the invalidation's audit row");
    assert_eq!(after, r#"{"deleted":0,"tag":"docs"}"#);
    pool.close().await;
    let (ok, _, err) = sluice(&config, &["cache", "invalidate", "--tag", "a,b"], &[]);
    assert!(!ok && err.contains("without commas"), "{err}");
    // Every command above was audited; the chain and this host's head verify.
    let verified = run(&["audit", "verify"]);
    assert!(!verified.is_empty());

    let (ok, out, err) = sluice(&config, &["backup"], &[]);
    assert!(!ok, "backup must refuse on PostgreSQL: {out}");
    assert!(
        err.contains("pg_dump") && err.contains("point-in-time"),
        "{err}"
    );
    let file = dir.path().join("some.db");
    std::fs::write(&file, b"").unwrap();
    let (ok, out, err) = sluice(&config, &["restore", file.to_str().unwrap()], &[]);
    assert!(!ok, "restore must refuse on PostgreSQL: {out}");
    assert!(
        err.contains("pg_restore") && err.contains("migrate-store"),
        "{err}"
    );
}

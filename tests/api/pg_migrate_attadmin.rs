//! Attacks on `sluice migrate-store`'s NUL → U+FFFD mapping (s6-attadmin).

use std::time::{Duration, Instant};

use sluice::store::Db;

use crate::pg_admin::{migrate_to_fresh_pg, pg_connect, sluice, spawn_migrate_store};
use crate::pg_server;

/// Polls PostgreSQL every `every` until `sql` counts a session, while `child` (a
/// `migrate-store`) runs: fails if it ends first, or after 240 s, saying what it was to be
/// seen `doing`.
async fn until_seen(
    watch: &mut sqlx::PgConnection,
    child: &mut std::process::Child,
    sql: &str,
    doing: &str,
    every: Duration,
) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let seen: i64 = sqlx::query_scalar(sql)
            .fetch_one(&mut *watch)
            .await
            .unwrap();
        if seen > 0 {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "migrate-store ended before it was seen {doing}"
        );
        assert!(Instant::now() < deadline, "never saw migrate-store {doing}");
        tokio::time::sleep(every).await;
    }
}

/// An older install could keep a team named `acme` + NUL (SQLite keeps the NUL; admin
/// bodies refuse it only since this version), and a team named `acme` + U+FFFD is a name
/// this version accepts. The copy maps the first onto the second: two rows, one unique
/// name. Before the fix the copy failed on PostgreSQL's unique index with "duplicate key
/// value violates unique constraint \"teams_name_key\"" — naming neither the mapping nor
/// the rows, so the operator could not tell what to rename.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_mapped_onto_an_existing_name_refuses_naming_the_table_and_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    let db = Db::open(&path, false).await.unwrap();
    let w = &db.sqlite().write;
    sqlx::query(
        "INSERT INTO teams (id, name, created_at) VALUES
            (7, 'acme' || char(0), '2026-11-30T10:00:00.000Z'),
            (8, 'acme' || char(65533), '2026-11-30T10:00:00.000Z')",
    )
    .execute(w)
    .await
    .unwrap();
    db.close().await;
    let (ok, out, err, to) = migrate_to_fresh_pg(dir.path(), &path);
    assert!(!ok, "two teams of one name were copied: {out}");
    assert!(
        err.contains("teams") && err.contains("U+FFFD"),
        "the refusal names neither the table nor the NUL mapping: {err}"
    );
    let mut pg = pg_connect(&to).await;
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM teams")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing was kept");
}

/// `migrate-store` killed with SIGKILL in the middle of copying the request log, then run
/// again: the first run kept nothing (one PostgreSQL transaction), the second copies every
/// row once, the ledger and audit chain verified on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_killed_midway_keeps_nothing_and_a_second_run_copies_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    let db = Db::open(&path, false).await.unwrap();
    sluice::store::audit::record(
        &db,
        &sluice::store::audit::AuditEntry {
            actor: "root",
            address: "127.0.0.1",
            action: "team.create",
            target: "team:acme",
            before: None,
            after: None,
        },
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let w = &db.sqlite().write;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)
         INSERT INTO requests (id, endpoint, model, status, cost_micros, created_at)
         SELECT printf('req-%08d', i), 'chat', 'gpt-4o-mini', 200, 37 + i % 101,
             printf('2026-%02d-%02dT%02d:%02d:00.000Z', 1 + i % 11, 1 + i % 28, i % 24, i % 60)
         FROM n",
    )
    .execute(w)
    .await
    .unwrap();
    let (rows, sum): (i64, i64) = sqlx::query_as("SELECT COUNT(*), SUM(cost_micros) FROM requests")
        .fetch_one(w)
        .await
        .unwrap();
    db.close().await;
    let from = format!("sqlite://{}", path.display());
    let to = pg_server::database();
    let mut watch = pg_connect(&to).await;

    let mut child = spawn_migrate_store(&dir.path().join("none.toml"), &from, &to, false);
    until_seen(
        &mut watch,
        &mut child,
        "SELECT COUNT(*) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'INSERT INTO requests%'",
        "copying the request log",
        Duration::from_millis(5),
    )
    .await;
    child.kill().unwrap();
    child.wait().unwrap();

    let (ok, out, err) = sluice(
        &dir.path().join("none.toml"),
        &["migrate-store", "--from", &from, "--to", &to],
        &[],
    );
    assert!(ok, "the second run failed: {out}\n{err}");
    let copied: (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(cost_micros)::BIGINT FROM requests")
            .fetch_one(&mut watch)
            .await
            .unwrap();
    assert_eq!(copied, (rows, sum), "every row once");
    let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log")
        .fetch_one(&mut watch)
        .await
        .unwrap();
    assert_eq!(audit, 1);
}

/// The SQLite install written while `migrate-store` compares it: a `sluice team create`
/// run against the file (no gateway, so no heartbeat the copy refuses on) lands after the
/// teams were compared and while the audit log is being compared. Each comparison read its
/// own SQLite snapshot, so the copy committed, verified ("same newest hash"), without the
/// team and its audit row — a write the CLI reported done, lost on PostgreSQL with no word.
/// `migrate-store` is stopped (SIGSTOP) while PostgreSQL shows the audit log's comparison
/// running, the CLI runs, then it is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_the_source_during_the_comparison_is_not_lost_silently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    let db = Db::open(&path, false).await.unwrap();
    let mut tx = db.begin().await.unwrap();
    let now = chrono::Utc::now();
    for i in 0..30_000 {
        let target = format!("team:t{i}");
        sluice::store::audit::append(
            &mut tx,
            &sluice::store::audit::AuditEntry {
                actor: "root",
                address: "127.0.0.1",
                action: "team.budget",
                target: &target,
                before: None,
                after: None,
            },
            now,
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    db.close().await;
    let from = format!("sqlite://{}", path.display());
    let to = pg_server::database();
    let mut watch = pg_connect(&to).await;
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"{from}\"\n[backup]\ndir = \"{}\"\n",
            dir.path().join("backups").display()
        ),
    )
    .unwrap();
    let env = [];

    let mut child = spawn_migrate_store(&config, &from, &to, true);
    until_seen(
        &mut watch,
        &mut child,
        "SELECT COUNT(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'active'
           AND query LIKE 'SELECT \"id\"%FROM audit_log ORDER BY 1'",
        "comparing the audit log",
        Duration::from_millis(2),
    )
    .await;
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let (cli_ok, cli_out, cli_err) =
        sluice(&config, &["team", "create", "--name", "lost-team"], &env);
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("team create: {cli_ok} {cli_out} {cli_err}\nmigrate-store: {stdout}\n{stderr}");
    assert!(
        cli_ok || cli_err.contains("locked") || cli_err.contains("busy"),
        "the CLI failed for another reason than the copy holding the file: {cli_out}\n{cli_err}"
    );
    if cli_ok && out.status.success() {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM teams WHERE name = 'lost-team'")
            .fetch_one(&mut watch)
            .await
            .unwrap();
        let audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log")
            .fetch_one(&mut watch)
            .await
            .unwrap();
        let lite = Db::open(&path, false).await.unwrap();
        let lite_audit: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log")
            .fetch_one(&lite.sqlite().write)
            .await
            .unwrap();
        lite.close().await;
        assert_eq!(
            (n, audit),
            (1, lite_audit),
            "the CLI created the team on SQLite and migrate-store said it copied and verified everything, yet PostgreSQL lacks it: {stdout}"
        );
    }
}

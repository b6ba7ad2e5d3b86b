//! `sluice migrate-store` on installs written by older versions and on large ones (issue
//! 17): a NUL byte SQLite kept in text no MAC covers is copied as U+FFFD and the output says
//! so; one in an audit row refuses the copy naming the row; 200 000 request rows arrive with
//! the process's memory bounded.

use std::path::Path;
use std::time::{Duration, Instant};

use sluice::store::audit::{self, AuditEntry};
use sluice::store::Db;

use crate::pg_admin::{migrate_to_fresh_pg, pg_connect, spawn_migrate_store};
use crate::pg_server;

/// A SQLite install as an older version could leave it: the schema of today, a
/// `login.failed`-style audit row (valid MAC), a throttle key and a request-log row with a
/// NUL; with `nul_in_audit`, the audit row's target holds the NUL too.
async fn old_install(path: &Path, nul_in_audit: bool) {
    let db = Db::open(path, false).await.unwrap();
    let target = if nul_in_audit {
        "user:root\0x"
    } else {
        "user:root"
    };
    audit::record(
        &db,
        &AuditEntry {
            actor: "anonymous",
            address: "127.0.0.1",
            action: "login.failed",
            target,
            before: None,
            after: None,
        },
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let w = &db.sqlite().write;
    sqlx::query("INSERT INTO login_failures (key, at) VALUES ('user:root' || char(0) || 'x', '2026-11-30T10:00:00.000Z')")
        .execute(w)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO requests (id, endpoint, model, status, error_code, cost_micros, created_at)
         VALUES ('r-nul', 'chat', 'gpt' || char(0) || '4', 400, 'bad' || char(0), 0, '2026-11-30T10:00:00.000Z')",
    )
    .execute(w)
    .await
    .unwrap();
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_outside_the_audit_log_are_copied_as_u_fffd_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    old_install(&path, false).await;
    let (ok, out, err, to) = migrate_to_fresh_pg(dir.path(), &path);
    assert!(ok, "migrate-store failed: {out}\n{err}");
    for said in [
        "login_failures: 1 text values held a NUL byte",
        "requests: 2 text values held a NUL byte",
    ] {
        assert!(
            out.contains(said),
            "the output does not say {said:?}: {out}"
        );
    }
    assert!(out.contains("U+FFFD"), "{out}");
    let mut pg = pg_connect(&to).await;
    let key: String = sqlx::query_scalar("SELECT key FROM login_failures")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(key, "user:root\u{FFFD}x");
    let (model, code): (String, String) =
        sqlx::query_as("SELECT model, error_code FROM requests WHERE id = 'r-nul'")
            .fetch_one(&mut pg)
            .await
            .unwrap();
    assert_eq!(
        (model.as_str(), code.as_str()),
        ("gpt\u{FFFD}4", "bad\u{FFFD}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_in_an_audit_row_refuses_the_copy_naming_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    old_install(&path, true).await;
    let (ok, out, err, to) = migrate_to_fresh_pg(dir.path(), &path);
    assert!(
        !ok,
        "migrate-store copied an audit row it cannot keep: {out}"
    );
    assert!(
        err.contains("audit log row 1 holds a NUL byte in target"),
        "the refusal does not name the row: {err}"
    );
    assert!(!err.contains("invalid byte sequence"), "{err}");
    let mut pg = pg_connect(&to).await;
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_log")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing was kept");
}

/// The peak RSS bound for copying 200 000 request rows (about 60 MB of SQLite): the
/// streamed copy holds a chunk of rows at a time; reading whole tables held them all.
const RSS_BOUND_KB: u64 = 120 * 1024;

/// 200 000 request rows (and a token with its ledger, so the ledger is verified on both
/// sides as always): every row arrives, the sums agree, and the process's peak RSS (VmHWM,
/// polled while it runs) stays under `RSS_BOUND_KB`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_install_moves_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    let db = Db::open(&path, false).await.unwrap();
    let w = &db.sqlite().write;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)
         INSERT INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
             input_tokens, output_tokens, cost_micros, latency_ms, cache, created_at)
         SELECT printf('req-%08d', i), 1 + i % 50, 1 + i % 20, 1 + i % 5, 'chat', 'gpt-4o-mini', 'gpt-4o-mini', 'a', 200,
             100 + i % 37, 200 + i % 91, 37 + i % 101, 20 + i % 13, 'miss',
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
    assert_eq!(rows, 200_000);
    db.close().await;

    let from = format!("sqlite://{}", path.display());
    let to = pg_server::database();
    let started = Instant::now();
    let mut child = spawn_migrate_store(&dir.path().join("none.toml"), &from, &to, true);
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            if let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "migrate-store of 200 000 rows still running after 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!(
        "migrate-store of 200 000 request rows: {:?}, peak RSS {} MB",
        started.elapsed(),
        peak_kb / 1024
    );
    assert!(status.success(), "migrate-store failed: {stdout}\n{stderr}");
    assert!(stdout.contains("requests        200000 rows"), "{stdout}");
    let mut pg = pg_connect(&to).await;
    let copied: (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(cost_micros)::BIGINT FROM requests")
            .fetch_one(&mut pg)
            .await
            .unwrap();
    assert_eq!(copied, (rows, sum), "every row arrived");
    assert!(peak_kb > 0, "the process's RSS was never read");
    assert!(
        peak_kb < RSS_BOUND_KB,
        "peak RSS {} MB over the bound of {} MB",
        peak_kb / 1024,
        RSS_BOUND_KB / 1024
    );
}

//! Transient PostgreSQL errors on the money path (issue 17): every error class that means
//! "the database cannot do it now" — a cancelled statement (`statement_timeout`,
//! `pg_cancel_backend`: 57014), a lock wait past `lock_timeout` (55P03), a serialization
//! failure or deadlock once its retries are spent (40001, 40P01), insufficient resources
//! (class 53), the server shutting down or dropping the session (57P0x, 25P03), a
//! connection exception (class 08), a system or I/O error (class 58) — is a 503
//! `service_degraded` the client may retry, never a 500; refusals stay refusals.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice::store::StoreError;
use sqlx::{Connection, Executor};

use crate::helpers::*;
use crate::pg_gateway_app::{spawn_app_on, Engine};

/// The error a real PostgreSQL server raises with SQLSTATE `code`, as the store sees it.
async fn raised(conn: &mut sqlx::PgConnection, code: &str) -> StoreError {
    let sql = format!(
        "DO $$ BEGIN RAISE EXCEPTION 'raised %', '{code}' USING ERRCODE = '{code}'; END $$"
    );
    let e = StoreError::from(conn.execute(&*sql).await.expect_err(&sql));
    match &e {
        StoreError::Sql(sqlx::Error::Database(db)) => {
            assert_eq!(db.code().as_deref(), Some(code), "{e}")
        }
        other => panic!("not a database error: {other}"),
    }
    e
}

/// Each transient class from a real server is "out of reach" (503); refusals are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transient_postgres_error_is_unavailable_and_refusals_are_not() {
    let url = crate::pg_server::database();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    // A real statement_timeout first.
    conn.execute("SET statement_timeout = '50ms'")
        .await
        .unwrap();
    let timeout = StoreError::from(
        conn.execute("SELECT pg_sleep(5)")
            .await
            .expect_err("statement_timeout"),
    );
    conn.execute("RESET statement_timeout").await.unwrap();
    assert!(timeout.is_unavailable(), "statement_timeout: {timeout}");
    let mut wrong = Vec::new();
    for code in [
        "57014", "55P03", "40001", "40P01", "40003", "53000", "53100", "53200", "53300", "53400",
        "57P01", "57P02", "57P03", "57P04", "57P05", "25P03", "08000", "08003", "08006", "08001",
        "08004", "58000", "58030",
    ] {
        if !raised(&mut conn, code).await.is_unavailable() {
            wrong.push(format!("{code} taken for a refusal (500)"));
        }
    }
    for code in [
        "22021", "42501", "23505", "23503", "22003", "42P01", "XX000", "P0001",
    ] {
        if raised(&mut conn, code).await.is_unavailable() {
            wrong.push(format!("{code} taken for an outage (503)"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// 200 requests (a wave more while nothing was cancelled yet) while every statement the
/// gateway runs on its database may be cancelled (`pg_cancel_backend` on every active
/// backend, again and again): each answer is a 200, a 429 `insufficient_quota` or a 503
/// `service_degraded` — no 500 —, the upstream saw exactly the 200s (nothing admitted
/// without a reservation), every 200 is logged, nothing stays reserved and the ledger
/// invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_statements_under_load_are_503_never_500() {
    let app = spawn_app_on(Engine::Postgres, |_, _| {}).await;
    let (_, token) = app.token("cancelled", Some("1")).await;
    let url = app.settings.database.url.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::new(AtomicI64::new(0));
    let canceller = {
        let (stop, cancelled) = (stop.clone(), cancelled.clone());
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap();
                cancelled.fetch_add(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // Waves of 200 until some statement was cancelled (one wave has always been enough
    // here; at most five on a slow machine).
    let mut answers = Vec::new();
    for _ in 0..5 {
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let http = app.http.clone();
            let (address, token) = (app.address.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let resp = http
                    .post(format!("{address}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .json(&chat_body(50))
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or(Value::Null))
            }));
        }
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        if cancelled.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    canceller.await.unwrap();
    let cancelled = cancelled.load(Ordering::Relaxed);
    let ok = answers.iter().filter(|(s, _)| *s == 200).count() as i64;
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(s, b)| {
            !(*s == 200
                || (*s == 503 && b["error"]["code"] == "service_degraded")
                || (*s == 429 && b["error"]["code"] == "insufficient_quota"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} answers neither 200, 429 insufficient_quota nor 503 service_degraded ({cancelled} statements cancelled): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        cancelled > 0,
        "nothing was cancelled: the test proved nothing"
    );
    assert_eq!(
        app.mock.state.total_count() as i64,
        ok,
        "the upstream saw exactly the 200s"
    );
    app.wait_for_log_rows(ok).await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM requests WHERE status = 200")
            .await,
        ok
    );
    app.assert_invariant().await;
}

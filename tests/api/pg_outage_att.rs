//! Attacks on the outage → 503 mapping on PostgreSQL (issue 17): states of the gateway in
//! which a database out of reach still leaked a 500 `internal_error`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;
use crate::pg_gateway::pg_hosts;
use crate::pg_server::PgServer;

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.timeout(Duration::from_secs(60)).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// PostgreSQL stopped, and a client whose token this host has not cached yet (a new
/// client, or any client after the cache was dropped — a token change, a LISTEN
/// reconnection): the token lookup cannot reach the database. That is the same outage the
/// reservation answers 503 `service_degraded` for, so the lookup must answer it too — on
/// the pipeline's routes and on the routes outside it (`/v1/models`, `/v1/usage`) — not
/// 500 `internal_error`; nor `/v1/usage` for a cached token, whose balance read fails the
/// same way. Before the fix: 500 `internal_error` on all four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncached_token_during_an_outage_is_503_not_500() {
    let server = Arc::new(PgServer::start());
    let fleet = pg_hosts(1, server.database()).await;
    let (_, warm) = fleet.token("warm", "10").await;
    let (_, cold) = fleet.token("cold", "10").await;
    let http = reqwest::Client::new();
    let base = fleet.hosts[0].gw.url.clone();
    let chat = |token: &str| {
        http.post(format!("{base}/v1/chat/completions"))
            .bearer_auth(token)
            .json(&chat_body(50))
    };
    let (status, body) = send(chat(&warm)).await;
    assert_eq!(status, 200, "{body}\n{}", fleet.logs());
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    let mut seen = Vec::new();
    for (what, req) in [
        ("chat", chat(&cold)),
        (
            "models",
            http.get(format!("{base}/v1/models")).bearer_auth(&cold),
        ),
        (
            "usage",
            http.get(format!("{base}/v1/usage")).bearer_auth(&cold),
        ),
        // A cached token: authenticated without the database, then its balance read.
        (
            "usage, cached",
            http.get(format!("{base}/v1/usage")).bearer_auth(&warm),
        ),
    ] {
        let (status, body) = send(req).await;
        seen.push((what, status, body["error"]["code"].clone()));
    }
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.run()).await.unwrap();
    for (what, status, code) in &seen {
        assert!(
            *status == 503 && code == "service_degraded",
            "{what} while PostgreSQL is down: {status} {code}; all: {seen:?}"
        );
    }
    // Back: the same client is served.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = send(chat(&cold)).await;
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "never served after the outage: {status} {body}\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The error PostgreSQL gives `sql` on `conn`, as the store sees it.
async fn pg_error(conn: &mut sqlx::PgConnection, sql: &str) -> sluice::store::StoreError {
    use sqlx::Executor;
    sluice::store::StoreError::from(conn.execute(sql).await.expect_err(sql))
}

fn code_of(e: &sluice::store::StoreError) -> String {
    match e {
        sluice::store::StoreError::Sql(sqlx::Error::Database(db)) => {
            db.code().unwrap_or_default().into_owned()
        }
        other => panic!("not a database error: {other}"),
    }
}

/// `StoreError::is_unavailable` (what the gateway answers 503 `service_degraded` for, and
/// what makes the request-log writer wait up to 5 minutes instead of dropping after 5
/// refusals) read every numeric SQLSTATE as a SQLite result code: PostgreSQL's 22021 (a NUL
/// in text: `character_not_in_repertoire`) and 42501 (`insufficient_privilege`) have 5 in
/// their low byte — SQLITE_BUSY — and counted as "out of reach", while the server refusing
/// new connections (53300 `too_many_connections`: max_connections met by the hosts'
/// pools, a role's or database's connection limit) counted as a refusal → 500. Real
/// errors from a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusals_are_not_outages_and_a_full_server_is_one() {
    use sqlx::{Connection, Executor};
    let url = crate::pg_server::database();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let name = url.rsplit('/').next().unwrap().to_string();

    let nul = bind_nul(&mut conn).await;
    assert_eq!(code_of(&nul), "22021");
    assert!(!nul.is_unavailable(), "a NUL in text is a refusal: {nul}");

    let reader = format!("{name}_reader");
    conn.execute(&*format!(
        "CREATE ROLE {reader}; CREATE TABLE secret (i INT)"
    ))
    .await
    .unwrap();
    conn.execute(&*format!("SET ROLE {reader}")).await.unwrap();
    let denied = pg_error(&mut conn, "SELECT * FROM secret").await;
    conn.execute("RESET ROLE").await.unwrap();
    assert_eq!(code_of(&denied), "42501");
    assert!(
        !denied.is_unavailable(),
        "permission denied is a refusal: {denied}"
    );

    let full = format!("{name}_full");
    conn.execute(&*format!("CREATE ROLE {full} LOGIN CONNECTION LIMIT 0"))
        .await
        .unwrap();
    let as_full = url.replacen("postgres@", &format!("{full}@"), 1);
    let e = sluice::store::StoreError::from(
        sqlx::PgConnection::connect(&as_full)
            .await
            .expect_err("the role may not connect"),
    );
    assert_eq!(code_of(&e), "53300");
    assert!(
        e.is_unavailable(),
        "a server refusing connections is out of reach: {e}"
    );
}

/// A Rust string with a NUL bound as text (what a client's input would be).
async fn bind_nul(conn: &mut sqlx::PgConnection) -> sluice::store::StoreError {
    sluice::store::StoreError::from(
        sqlx::query("SELECT $1::TEXT")
            .bind("a\0b")
            .fetch_one(&mut *conn)
            .await
            .expect_err("PostgreSQL text holds no NUL"),
    )
}

/// Two hosts on one PostgreSQL, a daily budget, clocks 2 s apart at midnight: the host
/// ahead rolls the token into the new day and spends in it; the host behind (still at
/// 23:59:59) serves `/v1/usage` from `ledger::balance`. The CAS on the host behind keeps
/// the newer period (`Reset::place`: a clock a little behind must not roll it back), so
/// that is the budget it enforces — but `balance` called every period other than `now`'s
/// "stale" and answered the full limit as remaining and the old day's ledger as spent:
/// the client was told 10 000 left while the gateway refused anything above 7 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_a_little_behind_reports_the_balance_the_cas_enforces() {
    use crate::pg_money::{clock_at, Store};
    use sluice::clock::Clock;
    use sluice::store::ledger::{self, ReserveRequest};
    let ahead = Store::postgres().await;
    let owner = ahead
        .owner(&[
            crate::helpers::Budget {
                limit: Some(10_000),
                reset: "daily",
            },
            crate::helpers::Budget {
                limit: None,
                reset: "never",
            },
            crate::helpers::Budget {
                limit: None,
                reset: "never",
            },
        ])
        .await;
    let clock_ahead: Arc<dyn Clock> = clock_at("2026-12-02T00:00:01Z");
    let held = ahead
        .reserve(&owner, "ahead-1", 3_000, "host-a", clock_ahead.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.token_remaining, Some(7_000));
    // The host behind: what the CAS enforces at its time …
    let behind_now = clock_at("2026-12-01T23:59:59Z").now();
    let refused = ledger::reserve(
        &ahead.db,
        &ReserveRequest {
            request_id: "behind-1",
            owner: &owner,
            amount: 7_001,
            process: "host-b",
            lease: chrono::Duration::seconds(60),
        },
        behind_now,
    )
    .await
    .unwrap();
    assert!(
        refused.is_err(),
        "the CAS enforces the newer period: {refused:?}"
    );
    // … and what `/v1/usage` tells the client there.
    let b = ledger::balance(&ahead.db, owner.token_id, behind_now)
        .await
        .unwrap();
    assert_eq!(
        (b.limit, b.remaining, b.reserved),
        (Some(10_000), Some(7_000), 3_000),
        "the balance the host behind reports: {b:?}"
    );
}

/// A gateway stopped (SIGTERM) while PostgreSQL is out of reach, with request-log rows
/// queued: the shutdown's flush waited for the rows' writes, each retried for up to 5 min
/// while the database is out of reach (`pg::lingering`), so the process hung for minutes
/// (s37 attack F6). It now gives the rows a bounded wait, says it dropped them, and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_during_an_outage_exits_without_its_queued_rows() {
    let server = Arc::new(PgServer::start());
    let mut fleet = pg_hosts(1, server.database()).await;
    let (_, token) = fleet.token("stopping", "10").await;
    let http = reqwest::Client::new();
    let base = fleet.hosts[0].gw.url.clone();
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    // Answered 503 during the outage; its log row is queued all the same.
    let (status, body) = send(
        http.post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&token)
            .json(&chat_body(50)),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let child = &mut fleet.hosts[0].gw.child;
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && stopped.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exited = child.try_wait().unwrap().is_some();
    if !exited {
        let _ = child.kill();
    }
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.run()).await.unwrap();
    let logs = fleet.logs();
    assert!(exited, "still running 60 s after SIGTERM\n{logs}");
    assert!(
        logs.contains("not written at shutdown"),
        "the dropped rows are not named in the log\n{logs}"
    );
}

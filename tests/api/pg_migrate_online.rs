//! PostgreSQL migrations that index the ledger build their indexes CONCURRENTLY, so every
//! host's reservations and settlements go on while they build: a plain CREATE INDEX held a
//! lock that queued every insert behind the build, each past the gateway's 2 s lock
//! timeout a 503, for as long as the build read the whole ledger (s33 late attack F1). An
//! index an interrupted build left invalid is rebuilt at the next start.

use std::borrow::Cow;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::pg_server;

const LEDGER_ROW: &str = "INSERT INTO ledger (token_id, user_id, team_id, period, user_period,
     team_period, kind, amount_micros, request_id, created_at)
     VALUES (1, 1, 1, '2026-12', '2026-12', '2026-12', 'reserve', 5, 'r', '2026-12-05T10:00:00.000Z')";

/// The migrations, up to and including `version` only.
fn up_to(version: i64) -> sqlx::migrate::Migrator {
    let mut m = sqlx::migrate!("./migrations/postgres");
    m.migrations = Cow::Owned(
        m.migrations
            .iter()
            .filter(|x| x.version <= version)
            .cloned()
            .collect(),
    );
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_indexes_build_while_writes_go_on() {
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    let mut setup = PgConnection::connect(&url).await.unwrap();
    up_to(19).run(&mut setup).await.unwrap();
    // A write in flight when the upgrade starts: a plain build waits for its lock, and every
    // later write queues behind the build.
    let mut inflight = PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut inflight).await.unwrap();
    sqlx::query(LEDGER_ROW)
        .execute(&mut inflight)
        .await
        .unwrap();
    let migrating = {
        let url = url.clone();
        tokio::spawn(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .unwrap();
            sqlx::migrate!("./migrations/postgres").run(&pool).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another host's reservation, with the gateway's lock timeout.
    let mut host = PgConnection::connect(&url).await.unwrap();
    sqlx::query("SET lock_timeout = '2s'")
        .execute(&mut host)
        .await
        .unwrap();
    let wrote = sqlx::query(LEDGER_ROW).execute(&mut host).await;
    assert!(
        wrote.is_ok(),
        "a write waited out the index build: {wrote:?}"
    );
    sqlx::query("COMMIT").execute(&mut inflight).await.unwrap();
    migrating.await.unwrap().unwrap();
    let valid: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indisvalid AND c.relname IN ('ledger_rollback_carries_token',
           'ledger_rollback_carries_user', 'ledger_rollback_carries_team', 'ledger_reserve_request')",
    )
    .fetch_one(&mut setup)
    .await
    .unwrap();
    assert_eq!(valid, 4);
}

#[tokio::test]
async fn an_index_an_interrupted_build_left_invalid_is_rebuilt_at_start() {
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    sqlx::migrate!("./migrations/postgres")
        .run(&mut conn)
        .await
        .unwrap();
    // What a build cut off leaves (the test server's role is a superuser).
    let valid =
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ledger_reserve_request'::regclass";
    sqlx::query("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'ledger_reserve_request'::regclass")
        .execute(&mut conn)
        .await
        .unwrap();
    assert!(!sqlx::query_scalar::<_, bool>(valid)
        .fetch_one(&mut conn)
        .await
        .unwrap());
    let key = sluice::secrets::MasterKey::from_hex(crate::pg_admin::MASTER_HEX).unwrap();
    let db = sluice::store::Db::open_postgres(&url, &key).await.unwrap();
    assert!(sqlx::query_scalar::<_, bool>(valid)
        .fetch_one(&mut conn)
        .await
        .unwrap());
    db.close().await;
}

/// Two hosts starting at once on a database that needs the index migrations, a write in
/// flight: both start and every index is valid. The second host waited in sqlx's blocking
/// `pg_advisory_lock`, a statement open for the whole migration, which the first host's
/// `CREATE INDEX CONCURRENTLY` waited for in turn — PostgreSQL aborted one of them (s33
/// stop attack F1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_starting_at_once_both_start_with_every_index_valid() {
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    let mut setup = PgConnection::connect(&url).await.unwrap();
    up_to(19).run(&mut setup).await.unwrap();
    let mut inflight = PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut inflight).await.unwrap();
    sqlx::query(LEDGER_ROW)
        .execute(&mut inflight)
        .await
        .unwrap();
    let start = |after: u64| {
        let url = url.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            let key = sluice::secrets::MasterKey::from_hex(crate::pg_admin::MASTER_HEX).unwrap();
            sluice::store::Db::open_postgres(&url, &key).await
        }
    };
    let release = async {
        // Past PostgreSQL's deadlock check (1 s) with both hosts waiting.
        tokio::time::sleep(Duration::from_millis(1800)).await;
        sqlx::query("COMMIT").execute(&mut inflight).await.unwrap();
    };
    let (first, second, ()) = tokio::join!(start(0), start(300), release);
    for host in [first, second] {
        host.expect("the host starts").close().await;
    }
    let valid: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indisvalid AND c.relname IN ('ledger_rollback_carries_token',
           'ledger_rollback_carries_user', 'ledger_rollback_carries_team', 'ledger_reserve_request')",
    )
    .fetch_one(&mut setup)
    .await
    .unwrap();
    assert_eq!(valid, 4);
}

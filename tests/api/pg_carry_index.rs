//! On PostgreSQL, the statements that look a rollback's carries up by reason — the
//! settlements' probe of whether a refund follows a carried estimate (the single and the
//! grouped one), `recarry`'s probe and the rollback's `done` sum (`carry_back`) — read
//! each level's carries through its partial index `ledger_carries_<level>` (migration
//! 0018): the ledger holds millions of rows and the carries a handful. The refund's walk
//! (`recarry`) reads a rollback's carries through `ledger_rollback_carries_<level>`,
//! whose predicate holds its `request_id IS NULL`, and finds the reservation's own row
//! through `ledger_reserve_request` (0020–0023). SQLite's half is the lib test
//! `store::ledger::carry_index_test`.

use sluice::store::pg::ledger::carry_lookups;
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::pg_server;
use crate::pg_store::pg_pool;

const LEVELS: [&str; 3] = ["token", "user", "team"];

/// PostgreSQL's plan of `query` (`EXPLAIN` plans it with the bound values; nothing runs).
async fn plan(
    conn: &mut sqlx::PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> String {
    let rows: Vec<PgRow> = query.fetch_all(conn).await.unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn each_levels_carry_lookups_use_its_partial_index() {
    let pool = pg_pool(&pg_server::database()).await;
    let sql = carry_lookups();
    // A ledger with some history, analysed. On an empty one the planner's costs say
    // nothing — even with sequential scans priced out (`enable_seqscan = off`) it hashed
    // every adjustment, read through any level's index, for each level's probe. With
    // spend rows by the thousand and adjustments by the hundred, as a running gateway has,
    // it plans as it would on the ledger's millions. Most adjustments are refunds' rows
    // taking a carry back (with a request id), a rollback's carries (without) the rest.
    sqlx::raw_sql(
        "INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period,
                             kind, amount_micros, request_id, reason, created_at)
         SELECT i % 400, i % 80, i % 8, '2026-12', '2026-12', '2026-12',
                CASE WHEN i % 100 = 0 THEN 'adjust' WHEN i % 2 = 0 THEN 'reserve' ELSE 'settle' END,
                -100, CASE WHEN i % 1000 <> 0 THEN 'r' || i END,
                CASE WHEN i % 100 = 0 THEN '2027-0' || (i % 9 + 1) || ', carried back' END,
                '2026-12-05T10:00:00.000000Z'
         FROM generate_series(1, 20000) AS i;
         ANALYZE ledger;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let now = "2026-12-05T10:00:00.000000Z";
    let settle = plan(
        &mut conn,
        sqlx::query(&format!("EXPLAIN {}", sql.settle))
            .bind("r1")
            .bind(true)
            .bind(100i64)
            .bind(now),
    )
    .await;
    let settle_many = plan(
        &mut conn,
        sqlx::query(&format!("EXPLAIN {}", sql.settle_many))
            .bind(vec!["r1"])
            .bind(vec![true])
            .bind(vec![100i64])
            .bind(vec![now]),
    )
    .await;
    for (i, (level, carry_back)) in LEVELS.iter().zip(&sql.carry_back).enumerate() {
        let index = format!(" using ledger_carries_{level} on ledger");
        let carry_back = plan(
            &mut conn,
            sqlx::query(&format!("EXPLAIN {carry_back}"))
                .bind(7i64)
                .bind("2026-12")
                .bind("2027-01")
                .bind("2027-01, carried back")
                .bind(now),
        )
        .await;
        let carried = plan(
            &mut conn,
            sqlx::query(&format!("EXPLAIN {}", sql.carried[i]))
                .bind(7i64)
                .bind("2027-01, carried back"),
        )
        .await;
        for (what, plan) in [
            ("settle", &settle),
            ("settle_many", &settle_many),
            ("carry_back", &carry_back),
            ("carried", &carried),
        ] {
            assert!(
                plan.contains(&index),
                "{what} reads the {level} level's carries without ledger_carries_{level}:\n{plan}"
            );
        }
        // The refund's walk reads a rollback's carries only, the predicate of its index:
        // through `ledger_carries_<level>` it read every refund's row and dropped it.
        let carried_into = plan(
            &mut conn,
            sqlx::query(&format!("EXPLAIN {}", sql.carried_into[i]))
                .bind(7i64)
                .bind("2027-01, carried back")
                .bind(3i64),
        )
        .await;
        let rollback = format!(" using ledger_rollback_carries_{level} on ledger");
        assert!(
            carried_into.contains(&rollback) && !filters_request_id(&carried_into),
            "carried_into reads the {level} level's carries without ledger_rollback_carries_{level}:\n{carried_into}"
        );
        // The reservation's own row, by its request id: not among the held period's rows.
        let reserve_row = plan(
            &mut conn,
            sqlx::query(&format!("EXPLAIN {}", sql.reserve_row[i]))
                .bind(7i64)
                .bind("2026-12")
                .bind("r2"),
        )
        .await;
        assert!(
            reserve_row.contains(" using ledger_reserve_request on ledger")
                && !filters_request_id(&reserve_row),
            "reserve_row finds the {level} level's reservation without ledger_reserve_request:\n{reserve_row}"
        );
    }
}

/// Whether a plan reads rows and drops them by their request id (a `Filter:` line naming it).
fn filters_request_id(plan: &str) -> bool {
    plan.lines()
        .any(|l| l.contains("Filter:") && l.contains("request_id"))
}

//! The statements that look a rollback's carries up by reason — the settlement's probe
//! (`carried`) and the rollback's `done` sum (`carry_back`) — read each level's carries
//! through its partial index `ledger_carries_<level>` (migration 0030): the ledger holds
//! millions of rows and the carries a handful, so a plan without the index reads a level's
//! whole history on every settlement that probes. Where a refund follows the estimate
//! (`carried_into`) reads a rollback's carries only, through
//! `ledger_rollback_carries_<level>` (0032), whose predicate holds its `request_id IS
//! NULL`; and the reservation's own row (`reserve_row`) among the held period's rows of
//! its level, through `ledger_<level>_period` (on PostgreSQL by its request id, 0023).

use sqlx::sqlite::SqliteArguments;
use sqlx::Arguments;

use super::{LEVELS, SQL};
use crate::store::Db;

/// A statement's parameters, in order.
enum P {
    Id(i64),
    Text(&'static str),
}

/// SQLite's plan of `sql` bound with `params` (its `detail` column, one line per step).
async fn plan(db: &Db, sql: &str, params: &[P]) -> String {
    let mut args = SqliteArguments::default();
    for p in params {
        match p {
            P::Id(n) => args.add(*n),
            P::Text(t) => args.add(*t),
        }
        .unwrap();
    }
    let rows: Vec<(i64, i64, i64, String)> =
        sqlx::query_as_with(&format!("EXPLAIN QUERY PLAN {sql}"), args)
            .fetch_all(&db.sqlite().write)
            .await
            .unwrap();
    rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn each_levels_carry_lookups_use_its_partial_index() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
    for level in LEVELS {
        let sql = &SQL[level.idx()];
        // `USING INDEX`, or `USING COVERING INDEX` when it holds every column read.
        let index = format!("INDEX ledger_carries_{} (", level.as_str());
        for (what, statement, params) in [
            ("carried", &sql.carried, vec![P::Id(7), P::Text("2026-12")]),
            (
                "carry_back",
                &sql.carry_back,
                vec![
                    P::Id(7),
                    P::Text("2026-12"),
                    P::Text("2027-01"),
                    P::Text("2027-01, carried back"),
                    P::Text("2026-12-05T10:00:00.000000Z"),
                ],
            ),
        ] {
            let plan = plan(&db, statement, &params).await;
            assert!(
                plan.contains(&index),
                "{what} of the {} level reads its carries without {index}:\n{plan}",
                level.as_str()
            );
        }
        // The refund's walk reads a rollback's carries only (no request id): through the
        // index whose predicate says so, not reading every refund's row and dropping it.
        let walk = [
            (
                "carried_into",
                &sql.carried_into,
                vec![P::Id(7), P::Text("2027-01, carried back"), P::Id(3)],
                format!("INDEX ledger_rollback_carries_{} (", level.as_str()),
            ),
            (
                "reserve_row",
                &sql.reserve_row,
                vec![P::Id(7), P::Text("2026-12"), P::Text("r1")],
                // No request-id index on SQLite (a page more per reservation, 0011): the
                // level's period index, not a scan of the ledger.
                format!("INDEX ledger_{}_period (", level.as_str()),
            ),
        ];
        for (what, statement, params, index) in walk {
            let plan = plan(&db, statement, &params).await;
            assert!(
                plan.contains(&index),
                "{what} of the {} level reads the ledger without {index}:\n{plan}",
                level.as_str()
            );
        }
    }
}

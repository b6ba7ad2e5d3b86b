//! The quota CAS on PostgreSQL: `store::ledger`'s contract, function for function, with
//! `&PgDb` (or the PostgreSQL `Writer`) in place of the SQLite pool or writer. The types —
//! `Owner`, `ReserveRequest`, `Reservation`, `Refusal`, `Settled`, `Orphans`, `Balance` —
//! are `store::ledger`'s own.
//!
//! Reserve, at every level (token, user, team), in ONE transaction (`reserve_tx`) — in the
//! common case (no rollover due, every level covers R) in one statement (`RESERVE_FAST`)
//! that does steps 0 and 3 at once; otherwise step by step:
//!   0. the levels' rows are locked first, in the one global order (tokens, users, teams,
//!      by id: `writer::lock_rows`), then read: balances, stored periods, reset rules;
//!   1. each level's period moves forward (`Reset::place`): a stored period older than
//!      `now`'s rolls over, conditionally on the stored period, with its audit row;
//!   2. a level that cannot cover R refuses the whole reservation: nothing is written but
//!      a rollover (true either way);
//!   3. one statement: per level `UPDATE … SET remaining = remaining − R, reserved =
//!      reserved + R WHERE id = $ AND (limit IS NULL OR remaining >= R) [token not revoked
//!      or expired] RETURNING remaining`, the reservation row and the `reserve` ledger row.
//!      Every level's UPDATE must change its row; if one did not, the job fails and the
//!      transaction is rolled back (never a partial reservation).
//!
//! Why READ COMMITTED is enough: every balance change is an `UPDATE` of the level's row, and
//! PostgreSQL, when an `UPDATE` (or `SELECT … FOR NO KEY UPDATE`) finds its row locked by another
//! transaction, waits for that transaction to end and then evaluates its `WHERE` again on
//! the newest committed version of the row (EvalPlanQual). So the check
//! `remaining >= R` is always made against the balance every committed reservation left,
//! under the row lock this transaction then holds until COMMIT — two transactions can never
//! both take the last R. The read in step 0 comes after the rows are locked, so it sees
//! the newest committed balances too, and the decision made from it holds until COMMIT.
//! SERIALIZABLE would only add serialization failures to retry.
//!
//! Settle / release / orphans: as on SQLite (`store::ledger`), each in one transaction.
//! Reserve and settle live in `cas.rs`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::writer::{lock_rows, Locks};
use super::{transact, PgDb};
use crate::clock::db_time;
use crate::quota::period::Reset;
use crate::store::audit::{AuditEntry, AuditKeys};
use crate::store::ledger::{
    carried_from, carry_back_reason, rollover_entry, Balance, Level, Orphans, Owner, CARRY_REASON,
    LEVELS,
};
use crate::store::{Result, StoreError};

mod cas;
pub mod group;
pub use cas::{release_via, reserve, reserve_tx, reserve_via, settle, settle_tx, settle_via};

/// (table, its ledger id column, its ledger period column) per level, in `LEVELS` order.
const TABLES: [(&str, &str, &str); 3] = [
    ("tokens", "token_id", "period"),
    ("users", "user_id", "user_period"),
    ("teams", "team_id", "team_period"),
];

fn idx(level: Level) -> usize {
    match level {
        Level::Token => 0,
        Level::User => 1,
        Level::Team => 2,
    }
}

fn id_of(owner: &Owner, level: Level) -> i64 {
    match level {
        Level::Token => owner.token_id,
        Level::User => owner.user_id,
        Level::Team => owner.team_id,
    }
}

fn tighter(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The locks of a job on `owner`'s three levels.
fn owner_locks(owner: &Owner) -> Locks {
    Locks {
        tokens: vec![owner.token_id],
        users: vec![owner.user_id],
        teams: vec![owner.team_id],
        requests: Vec::new(),
    }
}

fn rollover_sql(level: Level) -> String {
    let (table, id_col, period_col) = TABLES[idx(level)];
    format!(
        "UPDATE {table} SET period = $1, remaining_micros = limit_micros - COALESCE((SELECT SUM(amount_micros) FROM ledger
            WHERE {id_col} = $2 AND {period_col} = $1 AND kind IN ('reserve', 'settle', 'adjust')), 0)
         WHERE id = $2 AND period = $3 RETURNING remaining_micros"
    )
}

/// Into `$2`, before a rollback's rollover: what period `$3` spent that no carry with reason
/// `$4` brought yet, into any period, in full (as SQLite's `carry_back`).
fn carry_back_sql(level: Level) -> String {
    let (_, id_col, period_col) = TABLES[idx(level)];
    format!(
        "INSERT INTO ledger ({id_col}, period, user_period, team_period, kind, amount_micros, reason, created_at)
         SELECT $1, $2, $2, $2, 'adjust', (s.total - COALESCE(c.done, 0))::BIGINT, $4, $5
         FROM (SELECT SUM(amount_micros) AS total FROM ledger
                WHERE {id_col} = $1 AND {period_col} = $3 AND kind IN ('reserve', 'settle', 'adjust')) s,
              (SELECT SUM(amount_micros) AS done FROM ledger
                WHERE kind = 'adjust' AND reason = $4 AND {id_col} = $1) c
         WHERE s.total IS NOT NULL AND s.total - COALESCE(c.done, 0) <> 0"
    )
}

/// `recarry`'s probe: whether a carry with reason `$2` exists on level id `$1` — one probe
/// of the level's partial index `ledger_carries_<level>`.
fn carried_sql(level: Level) -> String {
    let id_col = TABLES[idx(level)].1;
    format!("SELECT 1 FROM ledger WHERE kind = 'adjust' AND reason = $2 AND {id_col} = $1 LIMIT 1")
}

/// `recarry`'s start: the ledger row of reservation `$3` in period `$2` of level id `$1`,
/// found through `ledger_reserve_request` (migration 0023) — else among every row of that
/// period of the level, a team's month of spend.
fn reserve_row_sql(level: Level) -> String {
    let (_, id_col, period_col) = TABLES[idx(level)];
    format!(
        "SELECT id FROM ledger WHERE {id_col} = $1 AND {period_col} = $2 AND request_id = $3 AND kind = 'reserve'"
    )
}

/// `recarry`'s step: the first rollback's carry (no request id) with reason `$2` on level
/// id `$1` after ledger row `$3`, through `ledger_rollback_carries_<level>` (migration
/// 0020–0022), whose predicate holds the query's `request_id IS NULL`: through
/// `ledger_carries_<level>` it read, and dropped, every refund's row taking a carry back.
fn carried_into_sql(level: Level) -> String {
    let (_, id_col, period_col) = TABLES[idx(level)];
    format!(
        "SELECT {period_col}, id FROM ledger WHERE kind = 'adjust' AND reason = $2 AND id > $3 AND {id_col} = $1
           AND request_id IS NULL
         ORDER BY id LIMIT 1"
    )
}

/// The period `level` (its row's `period` column, `at`) is in when a settlement's refund
/// may have to follow a carried estimate (`recarry`), else NULL: it is no longer the
/// reservation's (`held`), or a carry of `held`'s spend exists — a wrong clock's period the
/// level came back into (s31 recarry2 attack F1), with a limit or not (s31 final attack
/// F1). One probe of the level's partial index, which holds nothing but adjustments.
fn follow_sql(level: Level, at: &str, id: &str, held: &str) -> String {
    let id_col = TABLES[idx(level)].1;
    let (before, after) = CARRY_REASON;
    format!(
        "CASE WHEN {at} <> {held} OR (h.amount_micros > h.charged AND EXISTS (SELECT 1 FROM ledger c
            WHERE c.kind = 'adjust' AND c.reason = '{before}' || {held} || '{after}' AND c.{id_col} = {id}))
         THEN {at} END"
    )
}

/// `follow_sql` for each level of a settling statement, in `LEVELS` order: `rows` names
/// each level's updated row there (its table or an alias), `h` is the reservation, whose
/// id and period columns are named as the ledger's. The single-request and the grouped
/// settlement share it, so they cannot follow carries differently.
pub(super) fn follow_columns(rows: [&str; 3]) -> [String; 3] {
    std::array::from_fn(|i| {
        let (_, id_col, period_col) = TABLES[i];
        follow_sql(
            LEVELS[i],
            &format!("{}.period", rows[i]),
            &format!("h.{id_col}"),
            &format!("h.{period_col}"),
        )
    })
}

/// The statements that look a rollback's carries up by reason, and a refund's reservation
/// row, for the check that the planner reads each through its index —
/// `ledger_carries_<level>` (migration 0018), `ledger_rollback_carries_<level>` and
/// `ledger_reserve_request` (0020–0023; `tests/api/pg_carry_index.rs`): a plan without them
/// reads a level's whole history, or its held period.
/// Production code never calls it.
#[doc(hidden)]
pub fn carry_lookups() -> CarryLookups {
    CarryLookups {
        settle: cas::SETTLE.as_str(),
        settle_many: group::SETTLE_MANY.as_str(),
        carry_back: LEVELS.map(carry_back_sql),
        carried: LEVELS.map(carried_sql),
        reserve_row: LEVELS.map(reserve_row_sql),
        carried_into: LEVELS.map(carried_into_sql),
    }
}

/// What [`carry_lookups`] hands out, with each statement's parameters.
#[doc(hidden)]
pub struct CarryLookups {
    /// The single settlement: `$1` request id, `$2` whether an orphaned one counts, `$3`
    /// the cost, `$4` the time.
    pub settle: &'static str,
    /// The grouped settlement: `$1`–`$4` arrays of the same.
    pub settle_many: &'static str,
    /// Per level, in `LEVELS` order, a rollback's carry: `$1` the id, `$2` the period
    /// carried into, `$3` the one carried from, `$4` the reason, `$5` the time.
    pub carry_back: [String; 3],
    /// Per level, `recarry`'s probe: `$1` the id, `$2` the reason.
    pub carried: [String; 3],
    /// Per level, `recarry`'s reservation row: `$1` the id, `$2` its period, `$3` its
    /// request id.
    pub reserve_row: [String; 3],
    /// Per level, `recarry`'s step: `$1` the id, `$2` the reason, `$3` the row after which.
    pub carried_into: [String; 3],
}

/// A level a settlement found in another period than its reservation's (`held`): its id
/// and the period it is in, as the settling statement returned them (under the row lock it
/// took), and the refund.
pub(super) struct Moved<'a> {
    pub level: Level,
    pub id: i64,
    pub held: String,
    pub current: String,
    pub request_id: &'a str,
    pub refund: i64,
}

/// How many carries a refund follows back (as SQLite's `cas::MAX_HOPS`).
const MAX_HOPS: usize = 4;

/// After a refund into `held`, a period a wrong clock had put the level in and from which it
/// was rolled back (as SQLite's `cas::recarry_tx`): the refund follows the estimate where
/// the carries took it, each taking it back as a negative carry with its reason (and its
/// request's id: only a rollback's carries, without one, are followed — s32 stop attack
/// F1), and the level gets it when it lands in its current period (s30 last attack F1; s31
/// recarry attack F1, F2). Returns the level's remaining balance when it changed.
pub(super) async fn recarry(
    conn: &mut PgConnection,
    m: &Moved<'_>,
    now: &str,
) -> Result<Option<Option<i64>>> {
    if m.refund <= 0 {
        return Ok(None);
    }
    let (table, id_col, _) = TABLES[idx(m.level)];
    // As SQLite's: first whether anything of `held` was carried at all (one probe of the
    // partial index), since most levels found moved crossed a boundary, nothing carried.
    let carried: Option<i32> = sqlx::query_scalar(&carried_sql(m.level))
        .bind(m.id)
        .bind(carry_back_reason(&m.held))
        .fetch_optional(&mut *conn)
        .await?;
    if carried.is_none() {
        return Ok(None);
    }
    let mut after: i64 = match sqlx::query_scalar(&reserve_row_sql(m.level))
        .bind(m.id)
        .bind(&m.held)
        .bind(m.request_id)
        .fetch_optional(&mut *conn)
        .await?
    {
        Some(id) => id,
        None => return Ok(None),
    };
    let mut from = m.held.clone();
    let mut credited = None;
    for _ in 0..MAX_HOPS {
        let reason = carry_back_reason(&from);
        let found: Option<(String, i64)> = sqlx::query_as(&carried_into_sql(m.level))
            .bind(m.id)
            .bind(&reason)
            .bind(after)
            .fetch_optional(&mut *conn)
            .await?;
        let Some((into, carry)) = found else {
            break;
        };
        sqlx::query(&format!(
            "INSERT INTO ledger ({id_col}, period, user_period, team_period, kind, amount_micros, reason, request_id, created_at)
             VALUES ($1, $2, $2, $2, 'adjust', $3, $4, $6, $5)"
        ))
        .bind(m.id)
        .bind(&into)
        .bind(-m.refund)
        .bind(&reason)
        .bind(now)
        .bind(m.request_id)
        .execute(&mut *conn)
        .await?;
        // Credited where the level is, and followed on (as SQLite's: a carry out of that
        // period since is taken back too, s32 last attack F1).
        if into == m.current {
            credited = sqlx::query_scalar(&format!(
                "UPDATE {table} SET remaining_micros = remaining_micros + $1 WHERE id = $2 AND period = $3 RETURNING remaining_micros"
            ))
            .bind(m.refund)
            .bind(m.id)
            .bind(&m.current)
            .fetch_optional(&mut *conn)
            .await?;
        }
        (from, after) = (into, carry);
    }
    Ok(credited)
}

/// Rolls a level from `stored` over to `period` of rule `reset` (conditionally on the stored
/// period, which the caller read under the row lock), with its audit row; returns the level's
/// remaining balance in the new period (`None` without a limit).
#[allow(clippy::too_many_arguments)]
async fn rollover(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    level: Level,
    id: i64,
    reset: Reset,
    stored: &str,
    period: &str,
    now: DateTime<Utc>,
) -> Result<Option<i64>> {
    // A rollback carries the period ahead's spend in first, so the rollover counts it.
    let carried = carried_from(reset, stored, period);
    if let Some(reason) = &carried {
        sqlx::query(&carry_back_sql(level))
            .bind(id)
            .bind(period)
            .bind(stored)
            .bind(reason)
            .bind(db_time(now))
            .execute(&mut *conn)
            .await?;
    }
    let back = carried.is_some();
    let rolled: Option<Option<i64>> = sqlx::query_scalar(&rollover_sql(level))
        .bind(period)
        .bind(id)
        .bind(stored)
        .fetch_optional(&mut *conn)
        .await?;
    let rolled = rolled.ok_or_else(|| {
        StoreError::Conflict(format!(
            "the {} level's period changed under its row lock",
            level.as_str()
        ))
    })?;
    let target = format!("{}:{id}", level.as_str());
    let entry = rollover_entry(&target, stored, period, back);
    super::audit::append(conn, keys, &entry, now).await?;
    Ok(rolled)
}

/// The period a level is in at `now` (rolled over here when its stored one is older).
/// The caller holds the level's row lock.
async fn current_period(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    level: Level,
    id: i64,
    reset: Reset,
    now: DateTime<Utc>,
) -> Result<String> {
    let (table, ..) = TABLES[idx(level)];
    let stored: String = sqlx::query_scalar(&format!("SELECT period FROM {table} WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("{} {id}", level.as_str())))?;
    let (key, rolls) = reset.place(&stored, now);
    if rolls {
        rollover(conn, keys, level, id, reset, &stored, &key, now).await?;
    }
    Ok(key)
}

/// The reservations an orphan sweep takes, as a condition on `reservations` (`$1`: the
/// owner, for `OfOwner`).
fn orphans_where(which: Orphans<'_>) -> (&'static str, Option<&str>, &'static str) {
    match which {
        Orphans::OfOwner(owner) => ("owner = $1", Some(owner), "gone"),
        Orphans::LeaseExpired => (
            "deadline < (SELECT p.heartbeat_at FROM processes p WHERE p.id = reservations.owner) AND $1::TEXT IS NULL",
            None,
            "let its lease run out",
        ),
    }
}

/// Settles reservations nobody will settle any more at their full amount (nothing
/// refunded, a 0-amount `orphan` row for the record), keeps each in `orphaned` for a late
/// settlement by an owner that was only stalled, and releases what they held — one
/// statement, after the levels' rows are locked in the global order. Returns how many.
pub async fn settle_orphans(db: &PgDb, which: Orphans<'_>, now: DateTime<Utc>) -> Result<u64> {
    let (cond, owner, why) = orphans_where(which);
    let pick = format!("SELECT request_id FROM reservations WHERE {cond}");
    let take = format!(
        "WITH taken AS (DELETE FROM reservations WHERE {cond}
                RETURNING request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner),
            kept AS (INSERT INTO orphaned (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, created_at)
                SELECT request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, $2 FROM taken
                ON CONFLICT (request_id) DO UPDATE SET token_id = excluded.token_id, user_id = excluded.user_id,
                    team_id = excluded.team_id, period = excluded.period, user_period = excluded.user_period,
                    team_period = excluded.team_period, amount_micros = excluded.amount_micros,
                    owner = excluded.owner, created_at = excluded.created_at),
            t AS (UPDATE tokens SET reserved_micros = reserved_micros - s.amount
                FROM (SELECT token_id AS id, SUM(amount_micros)::BIGINT AS amount FROM taken GROUP BY token_id) s WHERE tokens.id = s.id),
            u AS (UPDATE users SET reserved_micros = reserved_micros - s.amount
                FROM (SELECT user_id AS id, SUM(amount_micros)::BIGINT AS amount FROM taken GROUP BY user_id) s WHERE users.id = s.id),
            m AS (UPDATE teams SET reserved_micros = reserved_micros - s.amount
                FROM (SELECT team_id AS id, SUM(amount_micros)::BIGINT AS amount FROM taken GROUP BY team_id) s WHERE teams.id = s.id),
            l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, reason, created_at)
                SELECT token_id, user_id, team_id, period, user_period, team_period, 'orphan', 0, request_id,
                    'owner process ' || owner || ' {why}; settled at the reserved ' || amount_micros || ' micro-dollars', $2
                FROM taken)
        SELECT COUNT(*) FROM taken"
    );
    let (pick, take): (Arc<str>, Arc<str>) = (pick.into(), take.into());
    let owner: Option<Arc<str>> = owner.map(Into::into);
    let now_s: Arc<str> = db_time(now).into();
    transact(&db.pool, move |conn| {
        let (pick, take, owner, now_s) = (pick.clone(), take.clone(), owner.clone(), now_s.clone());
        Box::pin(async move {
            let owner = owner.as_deref();
            let requests: Vec<String> = sqlx::query_scalar(&pick)
                .bind(owner)
                .fetch_all(&mut *conn)
                .await?;
            if requests.is_empty() {
                return Ok(0);
            }
            lock_rows(
                conn,
                &Locks {
                    requests,
                    ..Locks::default()
                },
            )
            .await?;
            let n: i64 = sqlx::query_scalar(&take)
                .bind(owner)
                .bind(&*now_s)
                .fetch_one(&mut *conn)
                .await?;
            Ok(n as u64)
        })
    })
    .await
}

/// Forgets orphan records older than `before` whose owner is no longer registered (see
/// `store::ledger::prune_orphaned`).
pub async fn prune_orphaned(db: &PgDb, before: DateTime<Utc>) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM orphaned WHERE created_at < $1 AND owner NOT IN (SELECT id FROM processes)",
    )
    .bind(db_time(before))
    .execute(&db.pool)
    .await?
    .rows_affected())
}

/// This process's open reservations: request id and deadline.
pub async fn own_reservations(db: &PgDb, owner: &str) -> Result<Vec<(String, String)>> {
    Ok(
        sqlx::query_as("SELECT request_id, deadline FROM reservations WHERE owner = $1")
            .bind(owner)
            .fetch_all(&db.pool)
            .await?,
    )
}

/// Renews the owner's lease on reservations a live request still holds (one statement).
pub async fn renew_leases(
    db: &PgDb,
    request_ids: &[String],
    deadline: DateTime<Utc>,
) -> Result<()> {
    sqlx::query("UPDATE reservations SET deadline = $1 WHERE request_id = ANY($2)")
        .bind(db_time(deadline))
        .bind(request_ids)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// The owner of a token, with each level's reset rule, read from the database.
pub async fn owner_of(conn: &mut PgConnection, token_id: i64) -> Result<Owner> {
    let row = sqlx::query(
        "SELECT t.id, u.id AS user_id, u.team_id, t.reset, u.reset AS user_reset, tm.reset AS team_reset
         FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id WHERE t.id = $1",
    )
    .bind(token_id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("token {token_id}")))?;
    let reset = |col: &str| -> Result<Reset> {
        Ok(Reset::parse(row.try_get::<&str, _>(col)?).unwrap_or(Reset::Never))
    };
    Ok(Owner {
        token_id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        team_id: row.try_get("team_id")?,
        resets: [reset("reset")?, reset("user_reset")?, reset("team_reset")?],
    })
}

/// An admin's adjustment of a token's spend (positive consumes, negative returns), applied
/// to the token, its user and its team alike, with a reason and an audit row.
pub async fn adjust(
    db: &PgDb,
    token_id: i64,
    amount: i64,
    reason: &str,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    let keys = db.audit.clone();
    let (reason, actor): (Arc<str>, Arc<str>) = (reason.into(), actor.into());
    transact(&db.pool, move |conn| {
        let (keys, reason, actor) = (keys.clone(), reason.clone(), actor.clone());
        Box::pin(async move {
            let (keys, reason, actor) = (&*keys, &*reason, &*actor);
            // An admin write (`Db::begin`'s lock, as SQLite's `BEGIN IMMEDIATE` is): a
            // rotation reads the token's remaining under it, so an adjustment cannot
            // commit between that read and the link and be stranded on the old token.
            sqlx::query(crate::store::ADMIN_LOCK_TIMEOUT)
                .execute(&mut *conn)
                .await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(super::ADMIN_WRITE_LOCK)
                .execute(&mut *conn)
                .await?;
            let owner = owner_of(conn, token_id).await?;
            lock_rows(conn, &owner_locks(&owner)).await?;
            let successor: Option<i64> =
                sqlx::query_scalar("SELECT successor_id FROM tokens WHERE id = $1")
                    .bind(token_id)
                    .fetch_one(&mut *conn)
                    .await?;
            crate::store::ledger::refuse_rotated(token_id, successor)?;
            let mut periods: [String; 3] = Default::default();
            for level in LEVELS {
                let (table, ..) = TABLES[idx(level)];
                let id = id_of(&owner, level);
                let period =
                    current_period(conn, keys, level, id, owner.resets[idx(level)], now).await?;
                sqlx::query(&format!(
                    "UPDATE {table} SET remaining_micros = remaining_micros - $1 WHERE id = $2 AND period = $3"
                ))
                .bind(amount)
                .bind(id)
                .bind(&period)
                .execute(&mut *conn)
                .await?;
                periods[idx(level)] = period;
            }
            sqlx::query(
                "INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, reason, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'adjust', $7, $8, $9)",
            )
            .bind(owner.token_id)
            .bind(owner.user_id)
            .bind(owner.team_id)
            .bind(&periods[0])
            .bind(&periods[1])
            .bind(&periods[2])
            .bind(amount)
            .bind(reason)
            .bind(db_time(now))
            .execute(&mut *conn)
            .await?;
            let target = format!("token:{token_id}");
            let after = format!("{amount} micro-dollars: {reason}");
            let entry = AuditEntry {
                actor,
                address: "",
                action: "budget.adjust",
                target: &target,
                before: None,
                after: Some(&after),
            };
            super::audit::append(conn, keys, &entry, now).await
        })
    })
    .await
}

/// Sets a level's limit (`None` = unlimited) inside the caller's transaction. Spend is never
/// erased: the new remaining is the new limit minus this period's ledger sum. Takes the
/// audit keys (SQLite's connection holds them) for the rollover it may do.
pub async fn set_limit(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    level: Level,
    id: i64,
    reset: Reset,
    limit: Option<i64>,
    now: DateTime<Utc>,
) -> Result<()> {
    let (table, id_col, period_col) = TABLES[idx(level)];
    sqlx::query(&format!(
        "SELECT 1 FROM {table} WHERE id = $1 FOR NO KEY UPDATE"
    ))
    .bind(id)
    .execute(&mut *conn)
    .await?;
    let period = current_period(conn, keys, level, id, reset, now).await?;
    sqlx::query(&format!(
        "UPDATE {table} SET limit_micros = $1, remaining_micros = $1 - COALESCE((SELECT SUM(amount_micros) FROM ledger
            WHERE {id_col} = $2 AND {period_col} = $3 AND kind IN ('reserve', 'settle', 'adjust')), 0)
         WHERE id = $2"
    ))
    .bind(limit)
    .bind(id)
    .bind(&period)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Raises a limited level's limit and remaining by `amount`; `false` if it has no limit.
pub async fn top_up(conn: &mut PgConnection, level: Level, id: i64, amount: i64) -> Result<bool> {
    let (table, ..) = TABLES[idx(level)];
    Ok(sqlx::query(&format!(
        "UPDATE {table} SET limit_micros = limit_micros + $1, remaining_micros = remaining_micros + $1
         WHERE id = $2 AND limit_micros IS NOT NULL"
    ))
    .bind(amount)
    .bind(id)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

/// `store::ledger::carry_to_successor`. The old token's row is already locked by the
/// rotation's write of its successor, so no reservation moves its balance meanwhile.
pub async fn carry_to_successor(
    conn: &mut PgConnection,
    from: i64,
    to: i64,
    now: DateTime<Utc>,
) -> Result<i64> {
    let row = sqlx::query(
        "SELECT limit_micros, remaining_micros, reset, period FROM tokens WHERE id = $1 FOR NO KEY UPDATE",
    )
    .bind(from)
    .fetch_one(&mut *conn)
    .await?;
    let Some((period, used)) = crate::store::ledger::carried(
        row.try_get("limit_micros")?,
        row.try_get("remaining_micros")?,
        row.try_get("reset")?,
        row.try_get("period")?,
        now,
    ) else {
        return Ok(0);
    };
    sqlx::query(
        "UPDATE tokens SET remaining_micros = remaining_micros - $1, period = $2 WHERE id = $3",
    )
    .bind(used)
    .bind(&period)
    .bind(to)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO ledger (token_id, period, user_period, team_period, kind, amount_micros, reason, created_at)
         VALUES ($1, $2, $2, $2, 'adjust', $3, $4, $5)",
    )
    .bind(to)
    .bind(&period)
    .bind(used)
    .bind(crate::store::ledger::carry_reason(from))
    .bind(db_time(now))
    .execute(&mut *conn)
    .await?;
    Ok(used)
}

/// A token's balance in its current period, as its holder sees it.
pub async fn balance(db: &PgDb, token_id: i64, now: DateTime<Utc>) -> Result<Balance> {
    let row = sqlx::query(
        "SELECT limit_micros, remaining_micros, reserved_micros, reset, period FROM tokens WHERE id = $1",
    )
    .bind(token_id)
    .fetch_optional(&db.pool)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("token {token_id}")))?;
    let limit: Option<i64> = row.try_get("limit_micros")?;
    let reset = Reset::parse(row.try_get::<&str, _>("reset")?).unwrap_or(Reset::Never);
    // The period the CAS would charge at `now` (`Reset::place`: a period another host whose
    // clock is a little ahead already rolled into stays).
    let stored: &str = row.try_get("period")?;
    let (current, stale) = reset.place(stored, now);
    let reserved: i64 = row.try_get("reserved_micros")?;
    let stored_remaining: Option<i64> = row.try_get("remaining_micros")?;
    // A limited token in its current period: `limit − remaining` is its ledger sum (the
    // invariant), read from the row — `GET /v1/usage` is outside the windows, and summing a
    // busy token's period on every call loaded the database (s25 attack, multi-host #4).
    let spent: i64 = match (limit, stored_remaining) {
        (Some(l), Some(r)) if !stale => l - r,
        _ => {
            // `store::ledger::STALE_SPENT`'s: carried in full less every carry made before.
            sqlx::query_scalar(
                "SELECT (COALESCE(SUM(amount_micros), 0)
                         - COALESCE((SELECT SUM(amount_micros) FROM ledger
                                     WHERE kind = 'adjust' AND reason = $4 AND token_id = $1), 0))::BIGINT
                 FROM ledger WHERE token_id = $1 AND period IN ($2, $3) AND kind IN ('reserve', 'settle', 'adjust')",
            )
            .bind(token_id)
            .bind(&current)
            .bind(reset.counted_with(stored, &current))
            .bind(carried_from(reset, stored, &current))
            .fetch_one(&db.pool)
            .await?
        }
    };
    // Not rolled over yet: what the rollover would make it (the limit less that period's
    // ledger sum, and back from a period ahead, what the carry will bring of that one's).
    let remaining = if stale {
        limit.map(|l| l - spent)
    } else {
        stored_remaining
    };
    Ok(Balance {
        limit,
        remaining,
        reserved,
        spent: spent - if stale { 0 } else { reserved },
    })
}

/// Levels whose `limit − remaining` differs from their ledger sum for the current period
/// (empty when the invariant holds everywhere).
pub async fn invariant_violations(db: &PgDb) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (table, id_col, period_col) in TABLES {
        let sql = format!(
            "SELECT t.id, t.limit_micros - t.remaining_micros,
                    COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.{id_col} = t.id AND l.{period_col} = t.period
                              AND l.kind IN ('reserve', 'settle', 'adjust')), 0)::BIGINT
             FROM {table} t WHERE t.limit_micros IS NOT NULL"
        );
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(&sql).fetch_all(&db.pool).await?;
        for (id, used, ledger) in rows {
            if used != ledger {
                out.push(format!(
                    "{table} {id}: limit − remaining = {used}, ledger sum = {ledger}"
                ));
            }
        }
    }
    Ok(out)
}

/// Reservations a process still holds.
pub async fn open_reservations(db: &PgDb, owner: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT COUNT(*) FROM reservations WHERE owner = $1")
            .bind(owner)
            .fetch_one(&db.pool)
            .await?,
    )
}

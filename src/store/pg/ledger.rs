//! The quota CAS on PostgreSQL: `store::ledger`'s contract, function for function, with
//! `&PgDb` (or the PostgreSQL `Writer`) in place of the SQLite pool or writer. The types —
//! `Owner`, `ReserveRequest`, `Reservation`, `Refusal`, `Settled`, `Orphans`, `Balance` —
//! are `store::ledger`'s own.
//!
//! Reserve, at every level (token, user, team), in ONE transaction (`reserve_tx`):
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
//! PostgreSQL, when an `UPDATE` (or `SELECT … FOR UPDATE`) finds its row locked by another
//! transaction, waits for that transaction to end and then evaluates its `WHERE` again on
//! the newest committed version of the row (EvalPlanQual). So the check
//! `remaining >= R` is always made against the balance every committed reservation left,
//! under the row lock this transaction then holds until COMMIT — two transactions can never
//! both take the last R. The read in step 0 comes after the rows are locked, so it sees
//! the newest committed balances too, and the decision made from it holds until COMMIT.
//! SERIALIZABLE would only add serialization failures to retry.
//!
//! Settle / release / orphans: as on SQLite (`store::ledger`), each in one transaction.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::writer::{lock_rows, Locks, Writer};
use super::{transact, Body, PgDb};
use crate::clock::{db_time, Clock};
use crate::quota::period::Reset;
use crate::store::audit::{AuditEntry, AuditKeys};
use crate::store::ledger::{
    Balance, Level, Orphans, Owner, Refusal, Reservation, ReserveRequest, Settled, LEVELS,
};
use crate::store::{Result, StoreError};

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

/// Rolls a level from `stored` over to `period` (conditionally on the stored period, which
/// the caller read under the row lock), with its audit row; returns the level's remaining
/// balance in the new period (`None` without a limit).
async fn rollover(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    level: Level,
    id: i64,
    stored: &str,
    period: &str,
    now: DateTime<Utc>,
) -> Result<Option<i64>> {
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
    super::audit::append(conn, keys, &period_reset_entry(&target, period), now).await?;
    Ok(rolled)
}

/// The audit row of a period rollover of `target` (`token:7`) into `period` (the same as
/// SQLite's).
fn period_reset_entry<'a>(target: &'a str, period: &'a str) -> AuditEntry<'a> {
    AuditEntry {
        actor: "system",
        address: "",
        action: "budget.period_reset",
        target,
        before: None,
        after: Some(period),
    }
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
        rollover(conn, keys, level, id, &stored, &key, now).await?;
    }
    Ok(key)
}

/// Each level's state as the CAS sees it: one statement for all three, which also locks
/// the three rows (already locked when the writer's batch took its locks: then it waits for
/// nothing; called on its own, a rollover decided from this read cannot race another
/// host's).
const LEVELS_STATE: &str =
    "SELECT TRUE, (t.revoked_at IS NOT NULL OR (t.expires_at IS NOT NULL AND t.expires_at <= $4)),
        t.limit_micros, t.remaining_micros, t.period, t.reset,
        TRUE, FALSE, u.limit_micros, u.remaining_micros, u.period, u.reset,
        TRUE, FALSE, m.limit_micros, m.remaining_micros, m.period, m.reset
    FROM tokens t, users u, teams m WHERE t.id = $1 AND u.id = $2 AND m.id = $3
    FOR UPDATE";

struct LevelState {
    exists: bool,
    gone: bool,
    limit: Option<i64>,
    remaining: Option<i64>,
    stored: String,
    reset: Reset,
}

impl LevelState {
    fn read(row: &sqlx::postgres::PgRow, at: usize) -> Result<LevelState> {
        let reset: Option<String> = row.try_get(at + 5)?;
        Ok(LevelState {
            exists: row.try_get::<Option<bool>, _>(at)?.unwrap_or(false),
            gone: row.try_get::<Option<bool>, _>(at + 1)?.unwrap_or(false),
            limit: row.try_get(at + 2)?,
            remaining: row.try_get(at + 3)?,
            stored: row
                .try_get::<Option<String>, _>(at + 4)?
                .unwrap_or_default(),
            reset: reset
                .as_deref()
                .and_then(Reset::parse)
                .unwrap_or(Reset::Never),
        })
    }

    fn covers(&self, amount: i64) -> bool {
        self.exists && (self.limit.is_none() || self.remaining.is_some_and(|r| r >= amount))
    }
}

/// Step 3 of the module doc: the three conditional decrements, the reservation row and its
/// ledger row, in one round trip. Returns how many levels changed and each one's remaining.
const RESERVE: &str = "WITH t AS (UPDATE tokens SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $2 AND (limit_micros IS NULL OR remaining_micros >= $1)
              AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $5) RETURNING remaining_micros),
    u AS (UPDATE users SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $3 AND (limit_micros IS NULL OR remaining_micros >= $1) RETURNING remaining_micros),
    m AS (UPDATE teams SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $4 AND (limit_micros IS NULL OR remaining_micros >= $1) RETURNING remaining_micros),
    r AS (INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
            VALUES ($6, $2, $3, $4, $7, $8, $9, $1, $10, $11, $5)),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            VALUES ($2, $3, $4, $7, $8, $9, 'reserve', $1, $6, $5))
    SELECT (SELECT COUNT(*) FROM t) + (SELECT COUNT(*) FROM u) + (SELECT COUNT(*) FROM m),
           (SELECT remaining_micros FROM t), (SELECT remaining_micros FROM u), (SELECT remaining_micros FROM m)";

/// The CAS inside the caller's transaction, at `now` (read inside it). The caller holds the
/// levels' row locks (`writer::lock_rows`; the writer takes them for the whole batch) —
/// without them it is still correct (the `UPDATE`s lock and re-check), only exposed to
/// deadlocks, which are retried.
pub async fn reserve_tx(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    r: &ReserveRequest<'_>,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let now_s = db_time(now);
    let row = sqlx::query(LEVELS_STATE)
        .bind(r.owner.token_id)
        .bind(r.owner.user_id)
        .bind(r.owner.team_id)
        .bind(&now_s)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else {
        let token: Option<i64> = sqlx::query_scalar("SELECT id FROM tokens WHERE id = $1")
            .bind(r.owner.token_id)
            .fetch_optional(&mut *conn)
            .await?;
        return match token {
            None => Ok(Err(Refusal::TokenGone)),
            Some(_) => Err(StoreError::NotFound(format!(
                "the user {} or team {} of token {}",
                r.owner.user_id, r.owner.team_id, r.owner.token_id
            ))),
        };
    };
    let mut levels = [
        LevelState::read(&row, 0)?,
        LevelState::read(&row, 6)?,
        LevelState::read(&row, 12)?,
    ];
    if !levels[0].exists || levels[0].gone {
        return Ok(Err(Refusal::TokenGone));
    }
    let mut periods: [String; 3] = Default::default();
    for level in LEVELS {
        let state = &mut levels[idx(level)];
        let (period, rolls) = state.reset.place(&state.stored, now);
        if rolls && state.exists {
            let id = id_of(r.owner, level);
            state.remaining = rollover(conn, keys, level, id, &state.stored, &period, now).await?;
        }
        periods[idx(level)] = period;
    }
    if let Some(level) = LEVELS
        .into_iter()
        .find(|l| !levels[idx(*l)].covers(r.amount))
    {
        let reset = levels[idx(level)].reset;
        return Ok(Err(Refusal::Insufficient(
            level,
            reset.seconds_to_reset(now),
        )));
    }
    let row = sqlx::query(RESERVE)
        .bind(r.amount)
        .bind(r.owner.token_id)
        .bind(r.owner.user_id)
        .bind(r.owner.team_id)
        .bind(&now_s)
        .bind(r.request_id)
        .bind(&periods[0])
        .bind(&periods[1])
        .bind(&periods[2])
        .bind(r.process)
        .bind(db_time(now + r.lease))
        .fetch_one(&mut *conn)
        .await?;
    let changed: i64 = row.try_get(0)?;
    if changed != 3 {
        return Err(StoreError::Conflict(
            "a level changed under its row lock; the reservation is rolled back".into(),
        ));
    }
    let left: [Option<i64>; 3] = [row.try_get(1)?, row.try_get(2)?, row.try_get(3)?];
    Ok(Ok(Reservation {
        request_id: r.request_id.into(),
        owner: r.owner.clone(),
        amount: r.amount,
        periods,
        remaining: left.into_iter().fold(None, tighter),
        token_remaining: left[0],
    }))
}

/// The CAS in a transaction of its own (with retries); the gateway goes through the
/// writer instead (`reserve_via`), with the same code.
pub async fn reserve(
    db: &PgDb,
    r: &ReserveRequest<'_>,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    // The body may run again, and owns what it uses (see `transact`).
    let locks = Arc::new(owner_locks(r.owner));
    let keys = db.audit.clone();
    let request_id: Arc<str> = r.request_id.into();
    let owner = Arc::new(r.owner.clone());
    let process: Arc<str> = r.process.into();
    let (amount, lease) = (r.amount, r.lease);
    transact(&db.pool, move |conn| {
        let (locks, keys, request_id, owner, process) = (
            locks.clone(),
            keys.clone(),
            request_id.clone(),
            owner.clone(),
            process.clone(),
        );
        Box::pin(async move {
            lock_rows(conn, &locks).await?;
            let req = ReserveRequest {
                request_id: &request_id,
                owner: &owner,
                amount,
                process: &process,
                lease,
            };
            reserve_tx(conn, &keys, &req, now).await
        })
    })
    .await
}

/// `reserve` as one job of the writer's next batch (group commit), at the time read from
/// `clock` when the job runs, inside the transaction. Skipped if the caller has gone
/// before it runs.
pub async fn reserve_via(
    writer: &Writer,
    r: &ReserveRequest<'_>,
    clock: Arc<dyn Clock>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let request_id: Arc<str> = r.request_id.into();
    let owner = Arc::new(r.owner.clone());
    let process: Arc<str> = r.process.into();
    let (amount, lease) = (r.amount, r.lease);
    let keys = writer.audit().clone();
    writer
        .run_for_caller(owner_locks(r.owner), move |conn| {
            let (request_id, owner, process, keys, clock) = (
                request_id.clone(),
                owner.clone(),
                process.clone(),
                keys.clone(),
                clock.clone(),
            );
            Box::pin(async move {
                let req = ReserveRequest {
                    request_id: &request_id,
                    owner: &owner,
                    amount,
                    process: &process,
                    lease,
                };
                reserve_tx(conn, &keys, &req, clock.now()).await
            }) as Body<'_, _>
        })
        .await
}

/// Takes a reservation's row: the open one, else (when `$2`) the one settled as an orphan.
const TAKE: &str = "WITH a AS (DELETE FROM reservations WHERE request_id = $1
            RETURNING token_id, user_id, team_id, period, user_period, team_period, amount_micros, TRUE AS open),
    b AS (DELETE FROM orphaned WHERE request_id = $1 AND $2 AND NOT EXISTS (SELECT 1 FROM a)
            RETURNING token_id, user_id, team_id, period, user_period, team_period, amount_micros, FALSE AS open)
    SELECT * FROM a UNION ALL SELECT * FROM b";

/// Every level's refund (into the reservation's period only) and, for an open reservation,
/// the release of what it held; the `settle` row and, when positive, the `absorbed` row.
const SETTLE: &str = "WITH t AS (UPDATE tokens SET reserved_micros = reserved_micros - $1,
                remaining_micros = CASE WHEN period = $2 THEN remaining_micros + $3 ELSE remaining_micros END
            WHERE id = $4 AND ($9 OR period = $2) RETURNING remaining_micros),
    u AS (UPDATE users SET reserved_micros = reserved_micros - $1,
                remaining_micros = CASE WHEN period = $5 THEN remaining_micros + $3 ELSE remaining_micros END
            WHERE id = $6 AND ($9 OR period = $5) RETURNING remaining_micros),
    m AS (UPDATE teams SET reserved_micros = reserved_micros - $1,
                remaining_micros = CASE WHEN period = $7 THEN remaining_micros + $3 ELSE remaining_micros END
            WHERE id = $8 AND ($9 OR period = $7) RETURNING remaining_micros),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            SELECT $4, $6, $8, $2, $5, $7, k.kind, k.amount, $10, $11
            FROM (VALUES ('settle', 0 - $3::BIGINT), ('absorbed', $12::BIGINT)) AS k(kind, amount)
            WHERE k.kind = 'settle' OR k.amount > 0)
    SELECT (SELECT remaining_micros FROM t), (SELECT remaining_micros FROM u), (SELECT remaining_micros FROM m)";

/// Settlement inside the caller's transaction, by request id (the row is the truth about
/// what was reserved); `store::ledger::settle_tx`'s semantics: an open reservation is
/// refunded and released, one settled as an orphan meanwhile is corrected to `actual`
/// (the refund only). `None` when the request was settled already (idempotent).
pub async fn settle_tx(
    conn: &mut PgConnection,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    settle_from(conn, request_id, actual, now, true).await
}

async fn settle_from(
    conn: &mut PgConnection,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
    or_orphaned: bool,
) -> Result<Option<Settled>> {
    let Some(held) = sqlx::query(TAKE)
        .bind(request_id)
        .bind(or_orphaned)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let amount: i64 = held.try_get("amount_micros")?;
    let open: bool = held.try_get("open")?;
    let actual = actual.max(0);
    let charged = actual.min(amount);
    let refund = amount - charged;
    let absorbed = actual - charged;
    let row = sqlx::query(SETTLE)
        .bind(if open { amount } else { 0 })
        .bind(held.try_get::<String, _>("period")?)
        .bind(refund)
        .bind(held.try_get::<i64, _>("token_id")?)
        .bind(held.try_get::<String, _>("user_period")?)
        .bind(held.try_get::<i64, _>("user_id")?)
        .bind(held.try_get::<String, _>("team_period")?)
        .bind(held.try_get::<i64, _>("team_id")?)
        .bind(open)
        .bind(request_id)
        .bind(db_time(now))
        .bind(absorbed)
        .fetch_one(&mut *conn)
        .await?;
    let left: [Option<i64>; 3] = [row.try_get(0)?, row.try_get(1)?, row.try_get(2)?];
    Ok(Some(Settled {
        charged,
        absorbed,
        remaining: left.into_iter().fold(None, tighter),
        token_remaining: left[0],
    }))
}

/// A settlement in a transaction of its own (with retries).
pub async fn settle(
    db: &PgDb,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    let request_id: Arc<str> = request_id.into();
    transact(&db.pool, move |conn| {
        let request_id = request_id.clone();
        Box::pin(async move {
            lock_rows(conn, &request_locks(&request_id)).await?;
            settle_tx(conn, &request_id, actual, now).await
        })
    })
    .await
}

fn request_locks(request_id: &str) -> Locks {
    Locks {
        requests: vec![request_id.to_string()],
        ..Locks::default()
    }
}

/// `settle` as one job of the writer's next batch. It runs even when its caller has gone:
/// a settlement must land.
pub async fn settle_via(
    writer: &Writer,
    request_id: Arc<str>,
    actual: i64,
    clock: Arc<dyn Clock>,
) -> Result<Option<Settled>> {
    writer
        .run(request_locks(&request_id), move |conn| {
            let (request_id, clock) = (request_id.clone(), clock.clone());
            Box::pin(async move { settle_tx(conn, &request_id, actual, clock.now()).await })
                as Body<'_, _>
        })
        .await
}

/// Releases an open reservation that nobody holds (settled at 0); one already settled, or
/// settled as an orphan, is left alone.
pub async fn release_via(
    writer: &Writer,
    request_id: Arc<str>,
    clock: Arc<dyn Clock>,
) -> Result<Option<Settled>> {
    writer
        .run(request_locks(&request_id), move |conn| {
            let (request_id, clock) = (request_id.clone(), clock.clone());
            Box::pin(async move { settle_from(conn, &request_id, 0, clock.now(), false).await })
                as Body<'_, _>
        })
        .await
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
            let owner = owner_of(conn, token_id).await?;
            lock_rows(conn, &owner_locks(&owner)).await?;
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
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = $1 FOR UPDATE"))
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
    let current = reset.period_key(now);
    let stale = row.try_get::<&str, _>("period")? != current;
    let reserved: i64 = row.try_get("reserved_micros")?;
    let remaining = if stale {
        limit
    } else {
        row.try_get("remaining_micros")?
    };
    let spent: i64 = sqlx::query_scalar(
        "SELECT COALESCE(SUM(amount_micros), 0)::BIGINT FROM ledger WHERE token_id = $1 AND period = $2 AND kind IN ('reserve', 'settle', 'adjust')",
    )
    .bind(token_id)
    .bind(&current)
    .fetch_one(&db.pool)
    .await?;
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

//! The CAS on PostgreSQL: reserve and settle, alone (`reserve`, `settle`, each in a
//! transaction of its own) or as jobs of the group-commit writer (`reserve_via`,
//! `settle_via`, `release_via`), with the same code (`reserve_tx`, `settle_tx`). See the
//! parent module for the transaction and why READ COMMITTED is enough.

use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::group::{Answer, Part};
use super::{follow_columns, id_of, idx, owner_locks, recarry, rollover, tighter, Moved};
use crate::clock::{db_time, Clock};
use crate::quota::period::Reset;
use crate::store::audit::AuditKeys;
use crate::store::ledger::{OwnedReserve, Refusal, Reservation, ReserveRequest, Settled, LEVELS};
use crate::store::pg::writer::{lock_rows, Group, Locks, Writer};
use crate::store::pg::{transact, Body, PgDb};
use crate::store::{Result, StoreError};

/// Each level's state as the CAS sees it: one statement for all three, which also locks
/// the three rows (already locked when the writer's batch took its locks: then it waits for
/// nothing; called on its own, a rollover decided from this read cannot race another
/// host's).
/// The token's expiry is judged by the database's clock (`db_now!`), whose time it
/// returns last, for `RESERVE` to re-check with the same instant.
const LEVELS_STATE: &str = concat!(
    "WITH d AS (SELECT ",
    db_now!(),
    " AS at)
    SELECT TRUE, (t.revoked_at IS NOT NULL OR (t.expires_at IS NOT NULL AND t.expires_at <= d.at)),
        t.limit_micros, t.remaining_micros, t.period, t.reset,
        TRUE, u.disabled, u.limit_micros, u.remaining_micros, u.period, u.reset,
        TRUE, FALSE, m.limit_micros, m.remaining_micros, m.period, m.reset, d.at, t.successor_id
    FROM d, tokens t, users u, teams m WHERE t.id = $1 AND u.id = $2 AND m.id = $3
    FOR NO KEY UPDATE OF t, u, m"
);

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
/// `$5` is the host's time (written in the rows), `$12` the database's time `LEVELS_STATE`
/// judged the token's expiry at.
const RESERVE: &str = "WITH t AS (UPDATE tokens SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $2 AND (limit_micros IS NULL OR remaining_micros >= $1)
              AND revoked_at IS NULL AND successor_id IS NULL AND (expires_at IS NULL OR expires_at > $12) RETURNING remaining_micros),
    u AS (UPDATE users SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $3 AND (limit_micros IS NULL OR remaining_micros >= $1) AND NOT disabled RETURNING remaining_micros),
    m AS (UPDATE teams SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $4 AND (limit_micros IS NULL OR remaining_micros >= $1) RETURNING remaining_micros),
    r AS (INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
            VALUES ($6, $2, $3, $4, $7, $8, $9, $1, $10, $11, $5)),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            VALUES ($2, $3, $4, $7, $8, $9, 'reserve', $1, $6, $5))
    SELECT (SELECT COUNT(*) FROM t) + (SELECT COUNT(*) FROM u) + (SELECT COUNT(*) FROM m),
           (SELECT remaining_micros FROM t), (SELECT remaining_micros FROM u), (SELECT remaining_micros FROM m)";

/// The common case in one round trip: when every level's stored period and reset rule are
/// the ones the caller expects (`$7`–`$9` the periods of `now` under `$12`–`$14`, the
/// owner's rules) and every level covers R, the levels' rows are locked and read, the three
/// conditional decrements, the reservation row and its ledger row written — all in one
/// statement. Otherwise (a rollover is due, a rule changed, a refusal) it writes nothing and
/// returns 0 in its first column: the caller decides step by step (`reserve_tx`). The
/// token's expiry is judged by the database's clock (`db_now!`), `$5` (the host's time) is
/// what the rows are stamped with.
const RESERVE_FAST: &str = concat!(
    "WITH s AS (SELECT t.period = $7 AND u.period = $8 AND m.period = $9
                AND t.reset = $12 AND u.reset = $13 AND m.reset = $14
                AND t.revoked_at IS NULL AND t.successor_id IS NULL AND NOT u.disabled
                AND (t.expires_at IS NULL OR t.expires_at > ",
    db_now!(),
    ")
                AND (t.limit_micros IS NULL OR t.remaining_micros >= $1)
                AND (u.limit_micros IS NULL OR u.remaining_micros >= $1)
                AND (m.limit_micros IS NULL OR m.remaining_micros >= $1) AS go
            FROM tokens t, users u, teams m WHERE t.id = $2 AND u.id = $3 AND m.id = $4 FOR NO KEY UPDATE),
    ok AS (SELECT 1 FROM s WHERE go),
    t AS (UPDATE tokens SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $2 AND EXISTS (SELECT 1 FROM ok) AND (limit_micros IS NULL OR remaining_micros >= $1)
              AND revoked_at IS NULL AND successor_id IS NULL AND (expires_at IS NULL OR expires_at > ",
    db_now!(),
    ") RETURNING remaining_micros),
    u AS (UPDATE users SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $3 AND EXISTS (SELECT 1 FROM ok) AND (limit_micros IS NULL OR remaining_micros >= $1) RETURNING remaining_micros),
    m AS (UPDATE teams SET remaining_micros = remaining_micros - $1, reserved_micros = reserved_micros + $1
            WHERE id = $4 AND EXISTS (SELECT 1 FROM ok) AND (limit_micros IS NULL OR remaining_micros >= $1) RETURNING remaining_micros),
    r AS (INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
            SELECT $6, $2, $3, $4, $7, $8, $9, $1, $10, $11, $5 FROM ok),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            SELECT $2, $3, $4, $7, $8, $9, 'reserve', $1, $6, $5 FROM ok)
    SELECT (SELECT COUNT(*) FROM ok), (SELECT COUNT(*) FROM t) + (SELECT COUNT(*) FROM u) + (SELECT COUNT(*) FROM m),
           (SELECT remaining_micros FROM t), (SELECT remaining_micros FROM u), (SELECT remaining_micros FROM m)"
);

/// `reserve_tx`'s one-statement path (`RESERVE_FAST`): `None` when it did not apply (and
/// wrote nothing).
async fn reserve_fast(
    conn: &mut PgConnection,
    r: &ReserveRequest<'_>,
    now: DateTime<Utc>,
) -> Result<Option<Reservation>> {
    let periods = r.owner.resets.map(|reset| reset.period_key(now));
    let now_s = db_time(now);
    let row = sqlx::query(RESERVE_FAST)
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
        .bind(r.owner.resets[0].as_str())
        .bind(r.owner.resets[1].as_str())
        .bind(r.owner.resets[2].as_str())
        .fetch_one(&mut *conn)
        .await?;
    let went: i64 = row.try_get(0)?;
    if went == 0 {
        return Ok(None);
    }
    reserved(&row, 1, r, periods).map(Some)
}

/// The reservation a reserve statement made, read from its columns from `at` on: how many
/// levels changed (all three, or the statement's locks were not what the CAS read: it is
/// rolled back), then each level's remaining balance.
fn reserved(
    row: &sqlx::postgres::PgRow,
    at: usize,
    r: &ReserveRequest<'_>,
    periods: [String; 3],
) -> Result<Reservation> {
    let changed: i64 = row.try_get(at)?;
    if changed != 3 {
        return Err(StoreError::Conflict(
            "a level changed under its row lock; the reservation is rolled back".into(),
        ));
    }
    let left: [Option<i64>; 3] = [
        row.try_get(at + 1)?,
        row.try_get(at + 2)?,
        row.try_get(at + 3)?,
    ];
    Ok(Reservation {
        request_id: r.request_id.into(),
        owner: r.owner.clone(),
        amount: r.amount,
        periods,
        remaining: left.into_iter().fold(None, tighter),
        token_remaining: left[0],
    })
}

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
    if let Some(resv) = reserve_fast(conn, r, now).await? {
        return Ok(Ok(resv));
    }
    let now_s = db_time(now);
    let row = sqlx::query(LEVELS_STATE)
        .bind(r.owner.token_id)
        .bind(r.owner.user_id)
        .bind(r.owner.team_id)
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
    if !levels[0].exists || levels[0].gone || levels[1].gone {
        return Ok(Err(Refusal::TokenGone));
    }
    // Rotated since it was authenticated: its budget is the successor's now (the old row
    // keeps a copy of what was handed over), refused before anything is written.
    if let Some(next) = row.try_get::<Option<i64>, _>(19)? {
        return Ok(Err(Refusal::Rotated(next)));
    }
    let db_now: String = row.try_get(18)?;
    let mut periods: [String; 3] = Default::default();
    for level in LEVELS {
        let state = &mut levels[idx(level)];
        let (period, rolls) = state.reset.place(&state.stored, now);
        if rolls && state.exists {
            let id = id_of(r.owner, level);
            state.remaining = rollover(
                conn,
                keys,
                level,
                id,
                state.reset,
                &state.stored,
                &period,
                now,
            )
            .await?;
        }
        periods[idx(level)] = period;
    }
    if let Some(level) = LEVELS
        .into_iter()
        .find(|l| !levels[idx(*l)].covers(r.amount))
    {
        // Refilled when the period it was refused in ends (another host may have rolled
        // the level into the next one).
        let reset = levels[idx(level)].reset;
        return Ok(Err(Refusal::Insufficient(
            level,
            reset.seconds_to_end_of(&periods[idx(level)], now),
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
        .bind(&db_now)
        .fetch_one(&mut *conn)
        .await?;
    reserved(&row, 0, r, periods).map(Ok)
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
    let job = OwnedReserve::new(r);
    transact(&db.pool, move |conn| {
        let (locks, keys, job) = (locks.clone(), keys.clone(), job.clone());
        Box::pin(async move {
            lock_rows(conn, &locks).await?;
            reserve_tx(conn, &keys, &job.request(), now).await
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
    let job = OwnedReserve::new(r);
    let keys = writer.audit().clone();
    let group = {
        let (job, clock) = (job.clone(), clock.clone());
        Group {
            part: Box::new(move || {
                let now = clock.now();
                Part::Reserve {
                    request_id: job.request_id.clone(),
                    owner: job.owner.clone(),
                    amount: job.amount,
                    process: job.process.clone(),
                    now,
                    deadline: now + job.lease,
                }
            }),
            take: |a| match a {
                Answer::Reserve(r) => Some(r),
                Answer::Settle(_) => None,
            },
        }
    };
    writer
        .run_grouped(
            owner_locks(r.owner),
            group,
            move |conn| {
                let (job, keys, clock) = (job.clone(), keys.clone(), clock.clone());
                Box::pin(async move { reserve_tx(conn, &keys, &job.request(), clock.now()).await })
                    as Body<'_, _>
            },
            true,
        )
        .await
}

/// Settlement in one round trip: takes the reservation's row (the open one, else — when
/// `$2` — the one settled as an orphan meanwhile), refunds every level still in the
/// reservation's period, releases what an open one held, and appends the `settle` row and,
/// when positive, the `absorbed` row. No row when the request was settled already.
/// `$3` is the actual cost (≥ 0), `$4` the time. Its columns from the sixth on are what
/// `follow_moved` reads: each level's period when it is no longer the reservation's, then
/// the reservation's ids and periods, and the refund.
pub(super) static SETTLE: LazyLock<String> = LazyLock::new(|| {
    let [t, u, m] = follow_columns(["tokens", "users", "teams"]);
    format!(
        "WITH a AS (DELETE FROM reservations WHERE request_id = $1
            RETURNING token_id, user_id, team_id, period, user_period, team_period, amount_micros, TRUE AS open),
    b AS (DELETE FROM orphaned WHERE request_id = $1 AND $2 AND NOT EXISTS (SELECT 1 FROM a)
            RETURNING token_id, user_id, team_id, period, user_period, team_period, amount_micros, FALSE AS open),
    h AS (SELECT x.*, LEAST($3::BIGINT, x.amount_micros) AS charged,
                 CASE WHEN x.open THEN x.amount_micros ELSE 0 END AS release
            FROM (SELECT * FROM a UNION ALL SELECT * FROM b) AS x),
    t AS (UPDATE tokens SET reserved_micros = reserved_micros - h.release,
                remaining_micros = CASE WHEN tokens.period = h.period THEN remaining_micros + h.amount_micros - h.charged ELSE remaining_micros END
            FROM h WHERE tokens.id = h.token_id
            RETURNING CASE WHEN h.open OR tokens.period = h.period THEN tokens.remaining_micros END AS remaining_micros,
                {t} AS moved),
    u AS (UPDATE users SET reserved_micros = reserved_micros - h.release,
                remaining_micros = CASE WHEN users.period = h.user_period THEN remaining_micros + h.amount_micros - h.charged ELSE remaining_micros END
            FROM h WHERE users.id = h.user_id
            RETURNING CASE WHEN h.open OR users.period = h.user_period THEN users.remaining_micros END AS remaining_micros,
                {u} AS moved),
    m AS (UPDATE teams SET reserved_micros = reserved_micros - h.release,
                remaining_micros = CASE WHEN teams.period = h.team_period THEN remaining_micros + h.amount_micros - h.charged ELSE remaining_micros END
            FROM h WHERE teams.id = h.team_id
            RETURNING CASE WHEN h.open OR teams.period = h.team_period THEN teams.remaining_micros END AS remaining_micros,
                {m} AS moved),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            SELECT h.token_id, h.user_id, h.team_id, h.period, h.user_period, h.team_period, k.kind, k.amount, $1, $4
            FROM h, LATERAL (VALUES ('settle', h.charged - h.amount_micros), ('absorbed', $3::BIGINT - h.charged)) AS k(kind, amount)
            WHERE k.kind = 'settle' OR k.amount > 0)
    SELECT h.charged, $3::BIGINT - h.charged, t.remaining_micros, u.remaining_micros, m.remaining_micros,
           t.moved, u.moved, m.moved,
           h.token_id, h.user_id, h.team_id, h.period, h.user_period, h.team_period,
           h.amount_micros - h.charged
    FROM h, t, u, m"
    )
});

/// Recarries (`pg::ledger::recarry`) the levels a settling statement's `row` found in
/// another period than the reservation's: from column `at`, each level's period when moved,
/// then the reservation's three ids, its three periods and the refund.
/// Returns the balances that changed: (level index, level id, remaining).
pub(super) async fn follow_moved(
    conn: &mut PgConnection,
    row: &PgRow,
    at: usize,
    request_id: &str,
    now: &str,
) -> Result<Vec<(usize, i64, Option<i64>)>> {
    let mut changed = Vec::new();
    for level in LEVELS {
        let i = idx(level);
        let Some(current) = row.try_get::<Option<String>, _>(at + i)? else {
            continue;
        };
        let moved = Moved {
            level,
            id: row.try_get(at + 3 + i)?,
            held: row.try_get(at + 6 + i)?,
            current,
            request_id,
            refund: row.try_get(at + 9)?,
        };
        if let Some(now_left) = recarry(conn, &moved, now).await? {
            changed.push((i, moved.id, now_left));
        }
    }
    Ok(changed)
}

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
    let Some(row) = sqlx::query(SETTLE.as_str())
        .bind(request_id)
        .bind(or_orphaned)
        .bind(actual.max(0))
        .bind(db_time(now))
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let mut left: [Option<i64>; 3] = [row.try_get(2)?, row.try_get(3)?, row.try_get(4)?];
    let (charged, absorbed): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    for (i, _, now_left) in follow_moved(conn, &row, 5, request_id, &db_time(now)).await? {
        left[i] = now_left;
    }
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
    let group = settle_group(request_id.clone(), actual, clock.clone(), true);
    writer
        .run_grouped(
            request_locks(&request_id),
            group,
            move |conn| {
                let (request_id, clock) = (request_id.clone(), clock.clone());
                Box::pin(async move { settle_tx(conn, &request_id, actual, clock.now()).await })
                    as Body<'_, _>
            },
            false,
        )
        .await
}

/// Releases an open reservation that nobody holds (settled at 0); one already settled, or
/// settled as an orphan, is left alone.
pub async fn release_via(
    writer: &Writer,
    request_id: Arc<str>,
    clock: Arc<dyn Clock>,
) -> Result<Option<Settled>> {
    let group = settle_group(request_id.clone(), 0, clock.clone(), false);
    writer
        .run_grouped(
            request_locks(&request_id),
            group,
            move |conn| {
                let (request_id, clock) = (request_id.clone(), clock.clone());
                Box::pin(async move { settle_from(conn, &request_id, 0, clock.now(), false).await })
                    as Body<'_, _>
            },
            false,
        )
        .await
}

/// A settlement's part of its batch's grouped statement (`group::SETTLE_MANY`).
fn settle_group(
    request_id: Arc<str>,
    actual: i64,
    clock: Arc<dyn Clock>,
    or_orphaned: bool,
) -> Group<Option<Settled>> {
    Group {
        part: Box::new(move || Part::Settle {
            request_id: request_id.clone(),
            actual: actual.max(0),
            now: clock.now(),
            or_orphaned,
        }),
        take: |a| match a {
            Answer::Settle(s) => Some(s),
            Answer::Reserve(_) => None,
        },
    }
}

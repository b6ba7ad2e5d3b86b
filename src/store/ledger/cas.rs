//! The CAS inside a write transaction of the store writer (`store::writer`), through the
//! raw handle (`store::raw`): what `reserve` and `settle` run, alone (`ledger::reserve`,
//! `ledger::settle`) or batched with other requests' jobs (`reserve_via`, `settle_via`).
//! On PostgreSQL the `_via` functions hand the job to `pg::ledger`'s (the writer is
//! `pg::writer`'s); the `_tx` functions are SQLite's.

use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};

use super::{
    carried_from, carry_back_reason, rollover_entry, tighter, Level, OwnedReserve, Owner, Refusal,
    Reservation, ReserveRequest, Settled, INSERT_LEDGER, LEVELS, SQL,
};
use crate::clock::{db_time, Clock};
use crate::quota::period::Reset;
use crate::store::audit;
use crate::store::raw::{self, Conn, Param};
use crate::store::writer::{Engine, Tx, Writer};
use crate::store::{Result, StoreError};

/// `ledger_row` inside a raw-handle transaction (the reserve and settle path).
fn ledger_row_tx(
    tx: &mut Conn<'_>,
    owner: &Owner,
    periods: &[String; 3],
    kind: &str,
    amount: i64,
    request_id: &str,
    now: &str,
) -> Result<()> {
    tx.execute(
        INSERT_LEDGER,
        &[
            owner.token_id.into(),
            owner.user_id.into(),
            owner.team_id.into(),
            (&periods[0]).into(),
            (&periods[1]).into(),
            (&periods[2]).into(),
            kind.into(),
            amount.into(),
            request_id.into(),
            Param::Null,
            now.into(),
        ],
    )?;
    Ok(())
}

/// Rolls a level from its stored period over to `period` of rule `reset` (conditional on the
/// stored one, which the caller read under the same write lock), with its audit row; returns
/// the level's remaining balance in the new period (`None` without a limit).
fn rollover_tx(
    tx: &mut Conn<'_>,
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
        let at = db_time(now);
        tx.execute(
            SQL[level.idx()].carry_back.as_str(),
            &[
                id.into(),
                period.into(),
                stored.into(),
                reason.as_str().into(),
                at.as_str().into(),
            ],
        )?;
    }
    let back = carried.is_some();
    let rolled = tx
        .query_row(
            SQL[level.idx()].rollover.as_str(),
            &[period.into(), id.into(), stored.into()],
            |r| r.int(0),
        )?
        .ok_or_else(|| {
            StoreError::Conflict(format!(
                "the {} level's period changed under the write lock",
                level.as_str()
            ))
        })?;
    let target = format!("{}:{id}", level.as_str());
    audit::append_tx(tx, &rollover_entry(&target, stored, period, back), now)?;
    Ok(rolled)
}

/// `reserve` as one job of the writer's next batch (group commit). The job reads `now`
/// from `clock` when it runs, inside the transaction: the period it charges and the
/// rollover it may do are decided under the write lock, never from a time taken before
/// the job waited in the queue. The writer skips the job if its caller has gone before
/// it runs (`Writer::run_for_caller`).
pub async fn reserve_via(
    writer: &Writer,
    r: &ReserveRequest<'_>,
    clock: Arc<dyn Clock>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    if let Engine::Postgres(pg, _) = writer.engine() {
        return crate::store::pg::ledger::reserve_via(pg, r, clock).await;
    }
    let job = OwnedReserve::new(r);
    writer
        .run_for_caller(move |tx| reserve_tx(tx, &job.request(), clock.now()))
        .await
}

/// Each level's state as the CAS sees it: one statement for all three. The token is gone
/// when revoked or expired, its user when disabled; last, the token's successor (a
/// rotation's: `Refusal::Rotated`).
const LEVELS_STATE: &str = "SELECT t.id IS NOT NULL, t.revoked_at IS NOT NULL OR (t.expires_at IS NOT NULL AND t.expires_at <= ?4),
        t.limit_micros, t.remaining_micros, t.period, t.reset,
        u.id IS NOT NULL, COALESCE(u.disabled <> 0, 0), u.limit_micros, u.remaining_micros, u.period, u.reset,
        m.id IS NOT NULL, 0, m.limit_micros, m.remaining_micros, m.period, m.reset,
        t.successor_id
    FROM (SELECT 1) AS one
    LEFT JOIN tokens t ON t.id = ?1
    LEFT JOIN users u ON u.id = ?2
    LEFT JOIN teams m ON m.id = ?3";

/// One level's balance before a reservation.
struct LevelState {
    exists: bool,
    gone: bool,
    limit: Option<i64>,
    remaining: Option<i64>,
    /// The period stored on the level.
    stored: String,
    reset: Reset,
}

impl LevelState {
    fn read(row: &raw::Row, at: i32) -> LevelState {
        LevelState {
            exists: row.int(at) == Some(1),
            gone: row.int(at + 1) == Some(1),
            limit: row.int(at + 2),
            remaining: row.int(at + 3),
            stored: row.text(at + 4).unwrap_or_default(),
            reset: row
                .text(at + 5)
                .and_then(|r| Reset::parse(&r))
                .unwrap_or(Reset::Never),
        }
    }

    /// Whether the level (in its current period) can cover `amount`.
    fn covers(&self, amount: i64) -> bool {
        self.exists && (self.limit.is_none() || self.remaining.is_some_and(|r| r >= amount))
    }
}

/// The CAS inside a write transaction (`BEGIN IMMEDIATE`: nobody else, in this process or
/// another, writes between its read and its writes), at `now` — read by the caller inside
/// the transaction.
///
/// It decides first, from one read of the three levels, and writes only when every level
/// can cover the amount — so a refusal writes nothing and needs no savepoint (see
/// `writer`). Then, per level (token → user → team): the rollover if the level's stored
/// period is older than `now`'s (periods only move forward: a newer stored period is the
/// one charged), and the conditional decrement, which must change its row — the check is
/// repeated by the `WHERE` clause, so if the read and the write ever disagreed the job
/// fails and nothing of it is kept.
pub fn reserve_tx(
    tx: &mut Tx<'_>,
    r: &ReserveRequest<'_>,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let now_s = db_time(now);
    let levels = tx
        .query_row(
            LEVELS_STATE,
            &[
                r.owner.token_id.into(),
                r.owner.user_id.into(),
                r.owner.team_id.into(),
                now_s.as_str().into(),
            ],
            |row| ([0, 6, 12].map(|at| LevelState::read(row, at)), row.int(18)),
        )?
        .ok_or_else(|| StoreError::Conflict("the level read returned no row".into()))?;
    let (levels, successor) = levels;
    if !levels[0].exists || levels[0].gone || levels[1].gone {
        return Ok(Err(Refusal::TokenGone));
    }
    // Rotated since it was authenticated: its budget is the successor's now (the old row
    // keeps a copy of what was handed over), refused before anything is written.
    if let Some(next) = successor {
        return Ok(Err(Refusal::Rotated(next)));
    }
    let mut levels = levels;
    // Each level into the period it is in at `now` first (a rollover is true whatever this
    // reservation's fate), then the decision on the balances of that period.
    let mut periods: [String; 3] = Default::default();
    for level in LEVELS {
        let state = &mut levels[level.idx()];
        let (period, rolls) = state.reset.place(&state.stored, now);
        if rolls {
            let id = r.owner.id(level);
            state.remaining = rollover_tx(tx, level, id, state.reset, &state.stored, &period, now)?;
        }
        periods[level.idx()] = period;
    }
    if let Some(level) = LEVELS
        .into_iter()
        .find(|l| !levels[l.idx()].covers(r.amount))
    {
        // Refilled when the period it was refused in ends (another host may have rolled
        // the level into the next one).
        let reset = levels[level.idx()].reset;
        return Ok(Err(Refusal::Insufficient(
            level,
            reset.seconds_to_end_of(&periods[level.idx()], now),
        )));
    }
    let mut remaining = None;
    let mut token_remaining = None;
    for level in LEVELS {
        let id = r.owner.id(level);
        let left = tx
            .query_row(
                SQL[level.idx()].reserve.as_str(),
                &[r.amount.into(), id.into(), now_s.as_str().into()],
                |row| row.int(0),
            )?
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "the {} level changed under the write lock",
                    level.as_str()
                ))
            })?;
        remaining = tighter(remaining, left);
        if level == Level::Token {
            token_remaining = left;
        }
    }
    tx.execute(
        "INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        &[
            r.request_id.into(),
            r.owner.token_id.into(),
            r.owner.user_id.into(),
            r.owner.team_id.into(),
            (&periods[0]).into(),
            (&periods[1]).into(),
            (&periods[2]).into(),
            r.amount.into(),
            r.process.into(),
            db_time(now + r.lease).as_str().into(),
            now_s.as_str().into(),
        ],
    )?;
    ledger_row_tx(
        tx,
        r.owner,
        &periods,
        "reserve",
        r.amount,
        r.request_id,
        &now_s,
    )?;
    Ok(Ok(Reservation {
        request_id: r.request_id.into(),
        owner: r.owner.clone(),
        amount: r.amount,
        periods,
        remaining,
        token_remaining,
    }))
}

/// `settle` as one job of the writer's next batch (group commit). It runs even when its
/// caller has gone: a settlement must land.
pub async fn settle_via(
    writer: &Writer,
    request_id: Arc<str>,
    actual: i64,
    clock: Arc<dyn Clock>,
) -> Result<Option<Settled>> {
    if let Engine::Postgres(pg, _) = writer.engine() {
        return crate::store::pg::ledger::settle_via(pg, request_id, actual, clock).await;
    }
    writer
        .run(move |tx| settle_tx(tx, &request_id, actual, clock.now()))
        .await
}

/// A reservation's row as settlement reads it (from `reservations` or `orphaned`).
struct Held {
    owner: Owner,
    periods: [String; 3],
    amount: i64,
}

const HELD_COLUMNS: &str =
    "token_id, user_id, team_id, period, user_period, team_period, amount_micros";

fn held_row(row: &raw::Row) -> Held {
    Held {
        owner: Owner {
            token_id: row.int(0).unwrap_or(0),
            user_id: row.int(1).unwrap_or(0),
            team_id: row.int(2).unwrap_or(0),
            resets: [Reset::Never; 3],
        },
        periods: [3, 4, 5].map(|i| row.text(i).unwrap_or_default()),
        amount: row.int(6).unwrap_or(0),
    }
}

static TAKE_RESERVATION: LazyLock<String> = LazyLock::new(|| {
    format!("DELETE FROM reservations WHERE request_id = ? RETURNING {HELD_COLUMNS}")
});
static TAKE_ORPHANED: LazyLock<String> =
    LazyLock::new(|| format!("DELETE FROM orphaned WHERE request_id = ? RETURNING {HELD_COLUMNS}"));

/// Settlement inside a write transaction, by request id — the row in the database is the
/// truth about what was reserved. An open reservation: its row goes, every level gets its
/// refund (into the reservation's period only) and releases the reserved amount. One that
/// was settled as an orphan meanwhile (its owner looked gone but was only stalled): the
/// orphan's full charge is corrected to `actual` — the refund only, `reserved` was
/// released then. Either way the `settle` (and `absorbed`) rows are appended. `None` when
/// the request was settled already (idempotent).
pub fn settle_tx(
    tx: &mut Tx<'_>,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    settle_from(tx, request_id, actual, now, true)
}

/// Releases an open reservation that nobody holds (settled at 0); a reservation already
/// settled, or settled as an orphan, is left alone.
pub async fn release_via(
    writer: &Writer,
    request_id: Arc<str>,
    clock: Arc<dyn Clock>,
) -> Result<Option<Settled>> {
    if let Engine::Postgres(pg, _) = writer.engine() {
        return crate::store::pg::ledger::release_via(pg, request_id, clock).await;
    }
    writer
        .run(move |tx| settle_from(tx, &request_id, 0, clock.now(), false))
        .await
}

fn settle_from(
    tx: &mut Tx<'_>,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
    or_orphaned: bool,
) -> Result<Option<Settled>> {
    let open = tx.query_row(TAKE_RESERVATION.as_str(), &[request_id.into()], held_row)?;
    let (held, open) = match open {
        Some(h) => (h, true),
        None if !or_orphaned => return Ok(None),
        None => match tx.query_row(TAKE_ORPHANED.as_str(), &[request_id.into()], held_row)? {
            Some(h) => (h, false),
            None => return Ok(None),
        },
    };
    let actual = actual.max(0);
    let charged = actual.min(held.amount);
    let refund = held.amount - charged;
    let mut left: [Option<i64>; 3] = [None; 3];
    // Levels whose refund may have to follow a carried estimate (`recarry_tx`): those no
    // longer in the reservation's period, and those still in it — a wrong clock's period
    // the level came back into, whose estimate a rollback had carried before (s31 recarry2
    // attack F1) — with a limit or not: an unlimited level's ledger is its spend report and
    // what a limit set later starts from (s31 final attack F1). (level, its period).
    let mut follow = Vec::new();
    for level in LEVELS {
        let sql = &SQL[level.idx()];
        let (id, period) = (held.owner.id(level), held.periods[level.idx()].as_str());
        let read = |r: &raw::Row| (r.int(0), r.text(1).unwrap_or_default());
        let row = if open {
            let params = [held.amount.into(), period.into(), refund.into(), id.into()];
            tx.query_row(sql.settle.as_str(), &params, read)?
        } else {
            let params = [refund.into(), id.into(), period.into()];
            tx.query_row(sql.refund.as_str(), &params, read)?
        };
        let Some((remaining, at)) = row else {
            continue;
        };
        if at == period {
            left[level.idx()] = remaining;
            follow.push((level, at));
        } else {
            // An orphan's correction refunds only a level still in its period.
            left[level.idx()] = remaining.filter(|_| open);
            follow.push((level, at));
        }
    }
    let now_s = db_time(now);
    ledger_row_tx(
        tx,
        &held.owner,
        &held.periods,
        "settle",
        -refund,
        request_id,
        &now_s,
    )?;
    let absorbed = actual - charged;
    if absorbed > 0 {
        ledger_row_tx(
            tx,
            &held.owner,
            &held.periods,
            "absorbed",
            absorbed,
            request_id,
            &now_s,
        )?;
    }
    if refund > 0 {
        for (level, at) in follow {
            let refunded = Refunded {
                level,
                id: held.owner.id(level),
                held: &held.periods[level.idx()],
                current: &at,
                request_id,
                refund,
            };
            if let Some(now_left) = recarry_tx(tx, &refunded, &now_s)? {
                left[level.idx()] = now_left;
            }
        }
    }
    Ok(Some(Settled {
        charged,
        absorbed,
        remaining: left.into_iter().fold(None, tighter),
        token_remaining: left[Level::Token.idx()],
    }))
}

/// How many carries a refund follows back — one per wrong clock between the period its
/// reservation was made in and the host's; more are not followed.
const MAX_HOPS: usize = 4;

/// A refund of `refund` to a level (`id`) made in `held`, a period it is no longer in
/// (`current`).
pub(super) struct Refunded<'a> {
    pub level: Level,
    pub id: i64,
    pub held: &'a str,
    pub current: &'a str,
    pub request_id: &'a str,
    pub refund: i64,
}

/// After a refund into `held`, a period a wrong clock had put the level in and from which it
/// was rolled back: the refund follows the estimate where the carries took it — the first
/// carry of `held`'s spend after the reservation's row, then (a carry into a period itself
/// rolled back: three clocks) the first carry of that period's after it — each taking the
/// refund back as a negative carry with its reason, and the level gets it when it lands in
/// its current period. Else the host's period kept the whole estimate of a request that
/// cost less (s30 last attack F1; s31 recarry attack F1), and a refund of an estimate
/// carried into the day before went to the next (F2). A level back in `held` itself got
/// the refund already (its roll forward counted the estimate too): the carry is taken
/// back all the same, or the next rollback's carry came out negative and credited the
/// host's next period with what the one before paid (s31 recarry2 attack F1); no carry of
/// `held` goes into `held`, so nothing is credited twice. Landing in the level's current
/// period the refund is credited there and followed on all the same (s32 last attack F1).
/// Returns the level's remaining balance when it changed.
fn recarry_tx(tx: &mut Conn<'_>, r: &Refunded<'_>, now: &str) -> Result<Option<Option<i64>>> {
    let sql = &SQL[r.level.idx()];
    let any = [r.id.into(), r.held.into()];
    if tx.query_row(sql.carried.as_str(), &any, |_| ())?.is_none() {
        return Ok(None);
    }
    let row = [r.id.into(), r.held.into(), r.request_id.into()];
    let Some(Some(mut after)) = tx.query_row(sql.reserve_row.as_str(), &row, |x| x.int(0))? else {
        return Ok(None);
    };
    let mut from = r.held.to_string();
    let mut credited = None;
    for _ in 0..MAX_HOPS {
        let reason = carry_back_reason(&from);
        let find = [r.id.into(), reason.as_str().into(), after.into()];
        let found = tx.query_row(sql.carried_into.as_str(), &find, |x| (x.text(0), x.int(1)))?;
        let Some((Some(into), Some(carry))) = found else {
            break;
        };
        let back = [
            r.id.into(),
            into.as_str().into(),
            (-r.refund).into(),
            reason.as_str().into(),
            now.into(),
            r.request_id.into(),
        ];
        tx.execute(sql.uncarry.as_str(), &back)?;
        // Credited where the level is, and followed on: a carry that took the estimate
        // out of that period before the level came back to it is taken back too (else the
        // next rollback's carry came out negative: s32 last attack F1). Carries only go
        // into earlier periods, so the chain passes the current one once.
        if into == r.current {
            let credit = [(-r.refund).into(), r.id.into(), r.current.into()];
            credited = tx.query_row(sql.debit.as_str(), &credit, |x| x.int(0))?;
        }
        (from, after) = (into, carry);
    }
    Ok(credited)
}

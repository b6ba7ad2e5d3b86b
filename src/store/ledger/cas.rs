//! The CAS inside a write transaction of the store writer (`store::writer`), through the
//! raw handle (`store::raw`): what `reserve` and `settle` run, alone (`ledger::reserve`,
//! `ledger::settle`) or batched with other requests' jobs (`reserve_via`, `settle_via`).

use chrono::{DateTime, Utc};

use super::{
    tighter, Level, Owner, Refusal, Reservation, ReserveRequest, Settled, INSERT_LEDGER, LEVELS,
    SQL,
};
use crate::clock::db_time;
use crate::store::audit::{self, AuditEntry};
use crate::store::raw::{self, Conn, Param};
use crate::store::writer::{Tx, Writer};
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

/// `rollover` inside a raw-handle transaction.
fn rollover_tx(
    tx: &mut Conn<'_>,
    level: Level,
    id: i64,
    period: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    let rolled = tx.query_row(
        SQL[level.idx()].rollover.as_str(),
        &[period.into(), id.into()],
        |r| r.int(0),
    )?;
    if rolled.is_some() {
        let target = format!("{}:{id}", level.as_str());
        let entry = AuditEntry {
            actor: "system",
            address: "",
            action: "budget.period_reset",
            target: &target,
            before: None,
            after: Some(period),
        };
        audit::append_tx(tx, &entry, now)?;
    }
    Ok(())
}

/// `reserve` as one job of the writer's next batch (group commit).
pub async fn reserve_via(
    writer: &Writer,
    r: &ReserveRequest<'_>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let request_id = r.request_id.to_string();
    let owner = r.owner.clone();
    let process = r.process.to_string();
    let (amount, deadline, now) = (r.amount, r.deadline, r.now);
    writer
        .run(move |tx| {
            let req = ReserveRequest {
                request_id: &request_id,
                owner: &owner,
                amount,
                process: &process,
                deadline,
                now,
            };
            reserve_tx(tx, &req)
        })
        .await
}

/// Each level's state as the CAS sees it: one statement for all three.
const LEVELS_STATE: &str = "SELECT t.id IS NOT NULL, t.revoked_at IS NOT NULL OR (t.expires_at IS NOT NULL AND t.expires_at <= ?4),
        t.limit_micros, t.remaining_micros, t.period = ?5,
        u.id IS NOT NULL, 0, u.limit_micros, u.remaining_micros, u.period = ?6,
        m.id IS NOT NULL, 0, m.limit_micros, m.remaining_micros, m.period = ?7
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
    current: bool,
}

impl LevelState {
    /// What the level would have left before this reservation: a level still in an older
    /// period starts the current one at its limit (the rollover below).
    fn covers(&self, amount: i64) -> bool {
        let remaining = if self.current {
            self.remaining
        } else {
            self.limit
        };
        self.exists && (self.limit.is_none() || remaining.is_some_and(|r| r >= amount))
    }
}

/// The CAS inside a write transaction (`BEGIN IMMEDIATE`: nobody else, in this process or
/// another, writes between its read and its writes).
///
/// It decides first, from one read of the three levels, and writes only when every level
/// can cover the amount — so a refusal writes nothing and needs no savepoint (see
/// `writer`). Then, per level (token → user → team): the rollover if the level is still
/// in an older period (conditional on that, with its audit row), and the conditional
/// decrement, which must change its row — the check is repeated by the `WHERE` clause, so
/// if the read and the write ever disagreed the job fails and nothing of it is kept.
pub fn reserve_tx(
    tx: &mut Tx<'_>,
    r: &ReserveRequest<'_>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let periods = r.owner.periods(r.now);
    let now_s = db_time(r.now);
    let state = |row: &raw::Row, at: i32| LevelState {
        exists: row.int(at) == Some(1),
        gone: row.int(at + 1) == Some(1),
        limit: row.int(at + 2),
        remaining: row.int(at + 3),
        current: row.int(at + 4) == Some(1),
    };
    let levels = tx
        .query_row(
            LEVELS_STATE,
            &[
                r.owner.token_id.into(),
                r.owner.user_id.into(),
                r.owner.team_id.into(),
                now_s.as_str().into(),
                periods[0].as_str().into(),
                periods[1].as_str().into(),
                periods[2].as_str().into(),
            ],
            |row| [state(row, 0), state(row, 5), state(row, 10)],
        )?
        .ok_or_else(|| StoreError::Conflict("the level read returned no row".into()))?;
    if !levels[0].exists || levels[0].gone {
        return Ok(Err(Refusal::TokenGone));
    }
    if let Some(level) = LEVELS
        .into_iter()
        .find(|l| !levels[l.idx()].covers(r.amount))
    {
        return Ok(Err(Refusal::Insufficient(level)));
    }
    let mut remaining = None;
    let mut token_remaining = None;
    for level in LEVELS {
        let id = r.owner.id(level);
        if !levels[level.idx()].current {
            rollover_tx(tx, level, id, &periods[level.idx()], r.now)?;
        }
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
            db_time(r.deadline).as_str().into(),
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
        request_id: r.request_id.to_string(),
        owner: r.owner.clone(),
        amount: r.amount,
        periods,
        remaining,
        token_remaining,
    }))
}

/// `settle` as one job of the writer's next batch (group commit).
pub async fn settle_via(
    writer: &Writer,
    resv: Reservation,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    writer
        .run(move |tx| settle_tx(tx, &resv, actual, now))
        .await
}

/// Settlement inside a write transaction: the reservation row goes, every level gets its
/// refund (into the reservation's period only) and releases the reserved amount, and the
/// `settle` (and `absorbed`) rows are appended.
pub fn settle_tx(
    tx: &mut Tx<'_>,
    resv: &Reservation,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    let actual = actual.max(0);
    let charged = actual.min(resv.amount);
    let refund = resv.amount - charged;
    let gone = tx.execute(
        "DELETE FROM reservations WHERE request_id = ?",
        &[resv.request_id.as_str().into()],
    )?;
    if gone == 0 {
        return Ok(None);
    }
    let mut remaining = None;
    let mut token_remaining = None;
    for level in LEVELS {
        let left = tx
            .query_row(
                SQL[level.idx()].settle.as_str(),
                &[
                    resv.amount.into(),
                    resv.periods[level.idx()].as_str().into(),
                    refund.into(),
                    resv.owner.id(level).into(),
                ],
                |r| r.int(0),
            )?
            .flatten();
        remaining = tighter(remaining, left);
        if level == Level::Token {
            token_remaining = left;
        }
    }
    let now_s = db_time(now);
    ledger_row_tx(
        tx,
        &resv.owner,
        &resv.periods,
        "settle",
        -refund,
        &resv.request_id,
        &now_s,
    )?;
    let absorbed = actual - charged;
    if absorbed > 0 {
        ledger_row_tx(
            tx,
            &resv.owner,
            &resv.periods,
            "absorbed",
            absorbed,
            &resv.request_id,
            &now_s,
        )?;
    }
    Ok(Some(Settled {
        charged,
        absorbed,
        remaining,
        token_remaining,
    }))
}

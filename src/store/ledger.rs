//! The quota CAS. Money moves only here, always inside one `BEGIN IMMEDIATE` transaction
//! that also appends its ledger rows, so a balance and its ledger can never disagree.
//!
//! Reserve, at every level (token, user, team), in one transaction:
//!   1. roll the level over to the current period if its stored period is older (a
//!      conditional write keyed by the old period: `… WHERE period <> ?current`);
//!   2. `UPDATE … SET remaining = remaining − R, reserved = reserved + R
//!       WHERE id = ? AND (limit IS NULL OR remaining >= R)` — zero rows means the level
//!      cannot cover R and the whole transaction rolls back: no partial reservation.
//!
//! Settle returns `R − charged` to every level whose period is still the reservation's
//! (a request admitted just before a reset settles into the old period) and releases R
//! from `reserved`. Invariant per level and current period:
//!   `limit − remaining == Σ ledger.amount (kinds reserve, settle, adjust)`.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::audit::{self, AuditEntry};
use super::raw::{self, Conn, Param};
use super::writer::{self, Tx, Writer};
use super::{Result, StoreError};
use crate::clock::db_time;
use crate::quota::period::Reset;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Token,
    User,
    Team,
}

pub const LEVELS: [Level; 3] = [Level::Token, Level::User, Level::Team];

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Token => "token",
            Level::User => "user",
            Level::Team => "team",
        }
    }
    fn idx(self) -> usize {
        self as usize
    }
}

/// The statements of one level, built once from the level's table and ledger columns.
struct LevelSql {
    rollover: String,
    reserve: String,
    settle: String,
    release: String,
    debit: String,
    set_limit: String,
    top_up: String,
}

static SQL: LazyLock<[LevelSql; 3]> = LazyLock::new(|| {
    [("tokens", "token_id", "period"), ("users", "user_id", "user_period"), ("teams", "team_id", "team_period")].map(
        |(table, id_col, period_col)| {
            let extra = if table == "tokens" { " AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?3)" } else { "" };
            LevelSql {
                rollover: format!(
                    "UPDATE {table} SET period = ?1, remaining_micros = limit_micros WHERE id = ?2 AND period <> ?1 RETURNING id"
                ),
                reserve: format!(
                    "UPDATE {table} SET remaining_micros = remaining_micros - ?1, reserved_micros = reserved_micros + ?1
                     WHERE id = ?2 AND (limit_micros IS NULL OR remaining_micros >= ?1){extra} RETURNING remaining_micros"
                ),
                settle: format!(
                    "UPDATE {table} SET reserved_micros = reserved_micros - ?1,
                            remaining_micros = CASE WHEN period = ?2 THEN remaining_micros + ?3 ELSE remaining_micros END
                     WHERE id = ?4 RETURNING remaining_micros"
                ),
                release: format!("UPDATE {table} SET reserved_micros = reserved_micros - ?1 WHERE id = ?2"),
                debit: format!(
                    "UPDATE {table} SET remaining_micros = remaining_micros - ?1 WHERE id = ?2 AND period = ?3"
                ),
                set_limit: format!(
                    "UPDATE {table} SET limit_micros = ?1, remaining_micros = ?1 - COALESCE((SELECT SUM(amount_micros) FROM ledger
                        WHERE {id_col} = ?2 AND {period_col} = ?3 AND kind IN ('reserve', 'settle', 'adjust')), 0)
                     WHERE id = ?2"
                ),
                top_up: format!(
                    "UPDATE {table} SET limit_micros = limit_micros + ?1, remaining_micros = remaining_micros + ?1
                     WHERE id = ?2 AND limit_micros IS NOT NULL"
                ),
            }
        },
    )
});

/// Who a reservation belongs to, with each level's reset rule (to name its current period).
#[derive(Debug, Clone)]
pub struct Owner {
    pub token_id: i64,
    pub user_id: i64,
    pub team_id: i64,
    pub resets: [Reset; 3],
}

impl Owner {
    fn id(&self, level: Level) -> i64 {
        match level {
            Level::Token => self.token_id,
            Level::User => self.user_id,
            Level::Team => self.team_id,
        }
    }
    fn periods(&self, now: DateTime<Utc>) -> [String; 3] {
        self.resets.map(|r| r.period_key(now))
    }
}

/// A reservation held in the database until `settle`.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub request_id: String,
    pub owner: Owner,
    pub amount: i64,
    pub periods: [String; 3],
    /// The tightest remaining balance among the levels that have a limit, after reserving.
    pub remaining: Option<i64>,
    /// The token level's own remaining balance, if it has a limit.
    pub token_remaining: Option<i64>,
}

#[derive(Debug)]
pub enum Refusal {
    /// This level's remaining budget is below the amount.
    Insufficient(Level),
    /// The token was revoked or expired since it was authenticated.
    TokenGone,
}

pub struct ReserveRequest<'a> {
    pub request_id: &'a str,
    pub owner: &'a Owner,
    pub amount: i64,
    pub process: &'a str,
    pub deadline: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

fn tighter(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Rolls a level over to `period` if it is still in an older one, with an audit row.
async fn rollover(
    conn: &mut SqliteConnection,
    level: Level,
    id: i64,
    period: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    let rolled: Option<i64> = sqlx::query_scalar(&SQL[level.idx()].rollover)
        .bind(period)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
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
        audit::append(conn, &entry, now).await?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn ledger_row(
    conn: &mut SqliteConnection,
    owner: &Owner,
    periods: &[String; 3],
    kind: &str,
    amount: i64,
    request_id: Option<&str>,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(INSERT_LEDGER)
        .bind(owner.token_id)
        .bind(owner.user_id)
        .bind(owner.team_id)
        .bind(&periods[0])
        .bind(&periods[1])
        .bind(&periods[2])
        .bind(kind)
        .bind(amount)
        .bind(request_id)
        .bind(reason)
        .bind(db_time(now))
        .execute(conn)
        .await?;
    Ok(())
}

const INSERT_LEDGER: &str = "INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, reason, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

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

/// The CAS. `Ok(Err(refusal))` when a level cannot cover the amount; nothing is written then.
/// Runs in its own `BEGIN IMMEDIATE` transaction on the caller's thread; the gateway goes
/// through the group-commit writer instead (`reserve_via`), with the same code (`reserve_tx`).
pub async fn reserve(
    pool: &SqlitePool,
    r: &ReserveRequest<'_>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    writer::once(pool, |tx| reserve_tx(tx, r)).await
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

#[derive(Debug, Clone, Copy)]
pub struct Settled {
    /// What the token was charged: the actual cost, capped at the reservation.
    pub charged: i64,
    /// Actual cost above the reservation, written as an `absorbed` row.
    pub absorbed: i64,
    /// The tightest remaining balance after settlement, if any level has a limit.
    pub remaining: Option<i64>,
    /// The token level's own remaining balance, if it has a limit.
    pub token_remaining: Option<i64>,
}

/// Settles a reservation at `actual` micro-dollars. Idempotent: a reservation already
/// settled (or settled as an orphan) is left alone and `None` is returned.
pub async fn settle(
    pool: &SqlitePool,
    resv: &Reservation,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    writer::once(pool, |tx| settle_tx(tx, resv, actual, now)).await
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

/// Settles every reservation of a dead process at its full amount (nothing refunded, a
/// 0-amount `orphan` row for the record). Returns how many were settled.
pub async fn settle_orphans(
    pool: &SqlitePool,
    dead_owner: &str,
    now: DateTime<Utc>,
) -> Result<u64> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let rows = sqlx::query(
        "DELETE FROM reservations WHERE owner = ?
         RETURNING request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros",
    )
    .bind(dead_owner)
    .fetch_all(&mut *tx)
    .await?;
    for r in &rows {
        let owner = Owner {
            token_id: r.get("token_id"),
            user_id: r.get("user_id"),
            team_id: r.get("team_id"),
            resets: [Reset::Never; 3],
        };
        let periods: [String; 3] = [r.get("period"), r.get("user_period"), r.get("team_period")];
        let amount: i64 = r.get("amount_micros");
        for level in LEVELS {
            sqlx::query(&SQL[level.idx()].release)
                .bind(amount)
                .bind(owner.id(level))
                .execute(&mut *tx)
                .await?;
        }
        let request_id: String = r.get("request_id");
        let reason = format!(
            "owner process {dead_owner} gone; settled at the reserved {amount} micro-dollars"
        );
        ledger_row(
            &mut tx,
            &owner,
            &periods,
            "orphan",
            0,
            Some(&request_id),
            Some(&reason),
            now,
        )
        .await?;
    }
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// The owner of a token, with each level's reset rule, read from the database.
pub async fn owner_of(conn: &mut SqliteConnection, token_id: i64) -> Result<Owner> {
    let row = sqlx::query(
        "SELECT t.id, u.id AS user_id, u.team_id, t.reset, u.reset AS user_reset, tm.reset AS team_reset
         FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id WHERE t.id = ?",
    )
    .bind(token_id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("token {token_id}")))?;
    let reset = |col: &str| Reset::parse(row.get::<&str, _>(col)).unwrap_or(Reset::Never);
    Ok(Owner {
        token_id: row.get("id"),
        user_id: row.get("user_id"),
        team_id: row.get("team_id"),
        resets: [reset("reset"), reset("user_reset"), reset("team_reset")],
    })
}

/// An admin's adjustment of a token's spend (positive consumes, negative returns), applied
/// to the token, its user and its team alike, with a reason and an audit row.
pub async fn adjust(
    pool: &SqlitePool,
    token_id: i64,
    amount: i64,
    reason: &str,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let owner = owner_of(&mut tx, token_id).await?;
    let periods = owner.periods(now);
    for level in LEVELS {
        let id = owner.id(level);
        rollover(&mut tx, level, id, &periods[level.idx()], now).await?;
        sqlx::query(&SQL[level.idx()].debit)
            .bind(amount)
            .bind(id)
            .bind(&periods[level.idx()])
            .execute(&mut *tx)
            .await?;
    }
    ledger_row(
        &mut tx,
        &owner,
        &periods,
        "adjust",
        amount,
        None,
        Some(reason),
        now,
    )
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
    audit::append(&mut tx, &entry, now).await?;
    tx.commit().await?;
    Ok(())
}

/// Sets a level's limit (`None` = unlimited). Spend is never erased: the new remaining is
/// the new limit minus this period's ledger sum, computed in the same statement.
pub async fn set_limit(
    conn: &mut SqliteConnection,
    level: Level,
    id: i64,
    reset: Reset,
    limit: Option<i64>,
    now: DateTime<Utc>,
) -> Result<()> {
    let period = reset.period_key(now);
    rollover(conn, level, id, &period, now).await?;
    sqlx::query(&SQL[level.idx()].set_limit)
        .bind(limit)
        .bind(id)
        .bind(&period)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Raises a limited level's limit and remaining by `amount`; `false` if it has no limit.
pub async fn top_up(
    conn: &mut SqliteConnection,
    level: Level,
    id: i64,
    amount: i64,
) -> Result<bool> {
    Ok(sqlx::query(&SQL[level.idx()].top_up)
        .bind(amount)
        .bind(id)
        .execute(conn)
        .await?
        .rows_affected()
        == 1)
}

/// A token's balance in its current period, as its holder sees it.
#[derive(Debug, Clone, Copy)]
pub struct Balance {
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reserved: i64,
    pub spent: i64,
}

pub async fn balance(pool: &SqlitePool, token_id: i64, now: DateTime<Utc>) -> Result<Balance> {
    let row = sqlx::query("SELECT limit_micros, remaining_micros, reserved_micros, reset, period FROM tokens WHERE id = ?")
        .bind(token_id)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("token {token_id}")))?;
    let limit: Option<i64> = row.get("limit_micros");
    let reset = Reset::parse(row.get::<&str, _>("reset")).unwrap_or(Reset::Never);
    let current = reset.period_key(now);
    let stale = row.get::<&str, _>("period") != current;
    let reserved: i64 = row.get("reserved_micros");
    // A period that has not been rolled over yet is, to its holder, already fresh.
    let remaining = if stale {
        limit
    } else {
        row.get("remaining_micros")
    };
    let spent: i64 = sqlx::query_scalar(
        "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = ? AND period = ? AND kind IN ('reserve', 'settle', 'adjust')",
    )
    .bind(token_id)
    .bind(&current)
    .fetch_one(pool)
    .await?;
    Ok(Balance {
        limit,
        remaining,
        reserved,
        spent: spent - if stale { 0 } else { reserved },
    })
}

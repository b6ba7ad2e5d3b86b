//! The quota CAS. Money moves only here, always inside one `BEGIN IMMEDIATE` transaction
//! that also appends its ledger rows, so a balance and its ledger can never disagree.
//!
//! Reserve, at every level (token, user, team), in one transaction (`cas.rs`):
//!   0. one read of the three levels (balances, stored periods, reset rules), with `now`
//!      read from the clock inside the transaction; a level that cannot cover R (after its
//!      rollover) refuses the whole reservation before any balance is reserved: no partial
//!      reservation;
//!   1. each level's period moves forward (`period::Reset::place`): a stored period older
//!      than `now`'s rolls over (a conditional write keyed by the stored period, with its
//!      audit row) to `limit − Σ ledger(new period)` — so a period the level was in before
//!      (a reset rule changed back and forth, a wrong clock corrected) is never reset a
//!      second time; the next period (another process's clock is a little ahead) is kept,
//!      and the reservation belongs to it. Levels roll over before the coverage check, so
//!      a refusal may leave a rollover behind (it is true either way);
//!   2. `UPDATE … SET remaining = remaining − R, reserved = reserved + R
//!       WHERE id = ? AND (limit IS NULL OR remaining >= R)` — it must change its row
//!      (the check, repeated under the write lock); if not, the job fails and nothing of
//!      it is kept.
//!
//! The gateway runs reserve and settle as jobs of the group-commit writer
//! (`store::writer`): many requests' jobs share one transaction, each still atomic.
//!
//! Settle deletes the reservation row and returns `R − charged` to every level whose period
//! is still the reservation's (a request admitted just before a reset settles into the old
//! period) — or, for a level rolled back from it since, to the period the carry of its
//! estimate went to (`cas::recarry_tx`) — and releases R from `reserved`. A reservation settled as an orphan (its owner
//! looked gone) is kept in `orphaned`; if its owner was only stalled and settles later, the
//! settlement refunds the orphan's overcharge, so the ledger and the request log agree.
//! Invariant per level and current period:
//!   `limit − remaining == Σ ledger.amount (kinds reserve, settle, adjust)`.

use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::writer;
use super::{Result, StoreError};
use crate::clock::db_time;
use crate::quota::period::Reset;

#[cfg(test)]
mod carry_index_test;
mod cas;
pub use cas::{release_via, reserve_tx, reserve_via, settle_tx, settle_via};

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
    carry_back: String,
    carried: String,
    reserve_row: String,
    carried_into: String,
    uncarry: String,
    period: String,
    refund: String,
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
            let extra = match table {
                "tokens" => " AND revoked_at IS NULL AND successor_id IS NULL AND (expires_at IS NULL OR expires_at > ?3)",
                "users" => " AND disabled = 0",
                _ => "",
            };
            LevelSql {
                rollover: format!(
                    "UPDATE {table} SET period = ?1, remaining_micros = limit_micros - COALESCE((SELECT SUM(amount_micros) FROM ledger
                        WHERE {id_col} = ?2 AND {period_col} = ?1 AND kind IN ('reserve', 'settle', 'adjust')), 0)
                     WHERE id = ?2 AND period = ?3 RETURNING remaining_micros"
                ),
                // Into `?2`, before a rollback's `rollover`: what period `?3` spent that no
                // carry with reason `?4` brought yet, into any period — counted once however
                // often the level flips, and however many of the host's periods the one
                // ahead spans (s31 recarry attack F2) — and in full: capped at the room under
                // the limit, a refund of a reservation open in `?2` gave back what the period
                // ahead had used (s30 final attack F1). The level may so be overdrawn, as by
                // a lowered limit.
                carry_back: format!(
                    "INSERT INTO ledger ({id_col}, period, user_period, team_period, kind, amount_micros, reason, created_at)
                     SELECT ?1, ?2, ?2, ?2, 'adjust', s.total - COALESCE(c.done, 0), ?4, ?5
                     FROM (SELECT SUM(amount_micros) AS total FROM ledger
                            WHERE {id_col} = ?1 AND {period_col} = ?3 AND kind IN ('reserve', 'settle', 'adjust')) s,
                          (SELECT SUM(amount_micros) AS done FROM ledger
                            WHERE kind = 'adjust' AND reason = ?4 AND {id_col} = ?1) c
                     WHERE s.total IS NOT NULL AND s.total - COALESCE(c.done, 0) <> 0"
                ),
                // What a refund follows back (`cas::recarry_tx`): whether any carry of period
                // `?2`'s spend exists (one probe of the level's partial index, empty but for
                // a wrong clock's periods), the reservation's own row (among the held
                // period's rows of its level: no request-id index on SQLite, a page more
                // per reservation), then the first carry with reason `?2` after row
                // `?3` — a rollback's (its own partial index `ledger_rollback_carries_<level>`,
                // predicate and all: migration 0032), never a refund's own row
                // taking a carry back (written with its request's id): followed, a refund
                // of another request took the estimate to the day before, and the host's
                // next day kept it whole (s32 stop attack F1).
                carried: format!(
                    "SELECT 1 FROM ledger WHERE kind = 'adjust' AND reason = '{}' || ?2 || '{}' AND {id_col} = ?1 LIMIT 1",
                    CARRY_REASON.0, CARRY_REASON.1
                ),
                reserve_row: format!(
                    "SELECT id FROM ledger WHERE {id_col} = ?1 AND {period_col} = ?2 AND request_id = ?3 AND kind = 'reserve'"
                ),
                carried_into: format!(
                    "SELECT {period_col}, id FROM ledger WHERE kind = 'adjust' AND reason = ?2 AND id > ?3 AND {id_col} = ?1
                       AND request_id IS NULL
                     ORDER BY id LIMIT 1"
                ),
                uncarry: format!(
                    "INSERT INTO ledger ({id_col}, period, user_period, team_period, kind, amount_micros, reason, request_id, created_at)
                     VALUES (?1, ?2, ?2, ?2, 'adjust', ?3, ?4, ?6, ?5)"
                ),
                period: format!("SELECT period FROM {table} WHERE id = ?1"),
                reserve: format!(
                    "UPDATE {table} SET remaining_micros = remaining_micros - ?1, reserved_micros = reserved_micros + ?1
                     WHERE id = ?2 AND (limit_micros IS NULL OR remaining_micros >= ?1){extra} RETURNING remaining_micros"
                ),
                settle: format!(
                    "UPDATE {table} SET reserved_micros = reserved_micros - ?1,
                            remaining_micros = CASE WHEN period = ?2 THEN remaining_micros + ?3 ELSE remaining_micros END
                     WHERE id = ?4 RETURNING remaining_micros, period"
                ),
                release: format!("UPDATE {table} SET reserved_micros = reserved_micros - ?1 WHERE id = ?2"),
                refund: format!(
                    "UPDATE {table} SET remaining_micros = CASE WHEN period = ?3 THEN remaining_micros + ?1 ELSE remaining_micros END
                     WHERE id = ?2 RETURNING remaining_micros, period"
                ),
                debit: format!(
                    "UPDATE {table} SET remaining_micros = remaining_micros - ?1 WHERE id = ?2 AND period = ?3 RETURNING remaining_micros"
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
}

/// A reservation held in the database until `settle`.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub request_id: Arc<str>,
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
    /// This level's remaining budget is below the amount; seconds until its next reset.
    Insufficient(Level, Option<u64>),
    /// The token was revoked or expired, or its user disabled, since it was authenticated.
    TokenGone,
    /// The token was rotated since it was authenticated (it has a successor, named here):
    /// its text now works as the successor, whose budget is the one to spend — the old row
    /// keeps a copy of what the rotation handed over (s26 final attack #2). Nothing is
    /// written; the caller authenticates the credential again and reserves on the token it
    /// now maps to.
    Rotated(i64),
}

pub struct ReserveRequest<'a> {
    pub request_id: &'a str,
    pub owner: &'a Owner,
    pub amount: i64,
    pub process: &'a str,
    /// How long the owner's lease on the reservation runs before it must renew it
    /// (`deadline` = now + lease; see `sweep`).
    pub lease: chrono::Duration,
}

/// A `ReserveRequest` that owns its parts, for a job that runs (maybe more than once)
/// after its caller's borrow has ended; cheap to clone.
#[derive(Clone)]
pub(crate) struct OwnedReserve {
    pub request_id: Arc<str>,
    pub owner: Arc<Owner>,
    pub amount: i64,
    pub process: Arc<str>,
    pub lease: chrono::Duration,
}

impl OwnedReserve {
    pub(crate) fn new(r: &ReserveRequest<'_>) -> OwnedReserve {
        OwnedReserve {
            request_id: r.request_id.into(),
            owner: Arc::new(r.owner.clone()),
            amount: r.amount,
            process: r.process.into(),
            lease: r.lease,
        }
    }

    pub(crate) fn request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            request_id: &self.request_id,
            owner: &self.owner,
            amount: self.amount,
            process: &self.process,
            lease: self.lease,
        }
    }
}

fn tighter(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The period a level is in at `now`: its stored period when that is current or newer
/// (periods only move forward), else `now`'s — rolled over here, with an audit row.
async fn current_period(
    tx: &mut super::Tx,
    level: Level,
    id: i64,
    reset: Reset,
    now: DateTime<Utc>,
) -> Result<String> {
    let sql = &SQL[level.idx()];
    let stored: String = sqlx::query_scalar(&sql.period)
        .bind(id)
        .fetch_optional(tx.sqlite()?)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("{} {id}", level.as_str())))?;
    let (key, rolls) = reset.place(&stored, now);
    if !rolls {
        return Ok(stored);
    }
    let carried = carried_from(reset, &stored, &key);
    if let Some(reason) = &carried {
        sqlx::query(&sql.carry_back)
            .bind(id)
            .bind(&key)
            .bind(&stored)
            .bind(reason)
            .bind(db_time(now))
            .execute(tx.sqlite()?)
            .await?;
    }
    let rolled: Option<Option<i64>> = sqlx::query_scalar(&sql.rollover)
        .bind(&key)
        .bind(id)
        .bind(&stored)
        .fetch_optional(tx.sqlite()?)
        .await?;
    if rolled.is_none() {
        // Read under the same write lock: never so, but a carry must not stand alone.
        return Err(StoreError::Conflict(format!(
            "the {} level's period changed under the write lock",
            level.as_str()
        )));
    }
    let target = format!("{}:{id}", level.as_str());
    let entry = rollover_entry(&target, &stored, &key, carried.is_some());
    audit::append(tx, &entry, now).await?;
    Ok(key)
}

/// The audit row of a period rollover of `target` (`token:7`) from `stored` into `period`:
/// a reset, or — `back` from a period a wrong clock put the level in — a rollback, which
/// restores nothing (its spend is carried: `carry_back_reason`), so a period still has one
/// reset at most.
pub(super) fn rollover_entry<'a>(
    target: &'a str,
    stored: &'a str,
    period: &'a str,
    back: bool,
) -> AuditEntry<'a> {
    AuditEntry {
        actor: "system",
        address: "",
        action: if back {
            "budget.period_rollback"
        } else {
            "budget.period_reset"
        },
        target,
        before: back.then_some(stored),
        after: Some(period),
    }
}

/// The reason of the carries a rollback from `stored` into `key` counts once (none when it
/// is no rollback): what the period ahead spent is counted there, not its carries again.
pub(super) fn carried_from(reset: Reset, stored: &str, key: &str) -> Option<String> {
    (reset.counted_with(stored, key) != key).then(|| carry_back_reason(stored))
}

/// The reason on the ledger row that carries the spend of the period `from` a wrong clock
/// put a level in into the host's own period, when the level is rolled back from it
/// (`Reset::place`): the rollback's `limit − remaining == Σ ledger` holds in the new
/// period, and nothing spent there is restored.
pub(super) fn carry_back_reason(from: &str) -> String {
    format!("{}{from}{}", CARRY_REASON.0, CARRY_REASON.1)
}

/// `carry_back_reason`'s text around the period, for the statements that build it from a
/// period column (no quote in it: it is written into SQL as it is).
pub(super) const CARRY_REASON: (&str, &str) = (
    "the spend of period ",
    ", carried back: a clock ahead had rolled the level into it",
);

#[allow(clippy::too_many_arguments)]
async fn ledger_row(
    tx: &mut super::Tx,
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
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

const INSERT_LEDGER: &str = "INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, reason, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The CAS. `Ok(Err(refusal))` when a level cannot cover the amount; nothing is written then.
/// Runs in its own `BEGIN IMMEDIATE` transaction on the caller's thread; the gateway goes
/// through the group-commit writer instead (`reserve_via`), with the same code (`reserve_tx`).
pub async fn reserve(
    db: &super::Db,
    r: &ReserveRequest<'_>,
    now: DateTime<Utc>,
) -> Result<std::result::Result<Reservation, Refusal>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::ledger::reserve(pg, r, now).await,
    };
    let pool = &sqlite.write;
    writer::once(pool, |tx| reserve_tx(tx, r, now)).await
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
/// settled is left alone and `None` is returned; one settled as an orphan meanwhile is
/// corrected to `actual` (see `cas::settle_tx`).
pub async fn settle(
    db: &super::Db,
    request_id: &str,
    actual: i64,
    now: DateTime<Utc>,
) -> Result<Option<Settled>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::ledger::settle(pg, request_id, actual, now).await
        }
    };
    let pool = &sqlite.write;
    writer::once(pool, |tx| settle_tx(tx, request_id, actual, now)).await
}

/// Which reservations an orphan sweep takes.
#[derive(Debug, Clone, Copy)]
pub enum Orphans<'a> {
    /// Every reservation of a process that is gone.
    OfOwner(&'a str),
    /// Every reservation whose owner let its lease run out: its `deadline` is older than the
    /// owner's own latest heartbeat — both written by the owner's clock, so another
    /// process's clock, however wrong, cannot expire a lease.
    LeaseExpired,
}

/// Settles reservations nobody will settle any more at their full amount (nothing
/// refunded, a 0-amount `orphan` row for the record) and keeps each in `orphaned`, so that
/// an owner that was only stalled can still settle it at its actual cost later (see
/// `cas::settle_tx`). Returns how many were settled.
pub async fn settle_orphans(db: &super::Db, which: Orphans<'_>, now: DateTime<Utc>) -> Result<u64> {
    const COLUMNS: &str = "request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner";
    if let super::Backend::Postgres(pg) = &db.backend {
        return super::pg::ledger::settle_orphans(pg, which, now).await;
    }
    let (which_rows, owner) = match which {
        Orphans::OfOwner(owner) => ("owner = ?", Some(owner)),
        Orphans::LeaseExpired => (
            "deadline < (SELECT p.heartbeat_at FROM processes p WHERE p.id = reservations.owner)",
            None,
        ),
    };
    let mut tx = db.begin().await?;
    // Kept for a late settlement by an owner that was only stalled.
    let keep = format!(
        "INSERT OR REPLACE INTO orphaned ({COLUMNS}, created_at) SELECT {COLUMNS}, ? FROM reservations WHERE {which_rows}"
    );
    let keep = sqlx::query(&keep).bind(db_time(now));
    match owner {
        Some(o) => keep.bind(o),
        None => keep,
    }
    .execute(tx.sqlite()?)
    .await?;
    let take = format!("DELETE FROM reservations WHERE {which_rows} RETURNING {COLUMNS}");
    let take = sqlx::query(&take);
    let rows = match owner {
        Some(o) => take.bind(o),
        None => take,
    }
    .fetch_all(tx.sqlite()?)
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
        let process: String = r.get("owner");
        for level in LEVELS {
            sqlx::query(&SQL[level.idx()].release)
                .bind(amount)
                .bind(owner.id(level))
                .execute(tx.sqlite()?)
                .await?;
        }
        let request_id: String = r.get("request_id");
        let reason = match which {
            Orphans::OfOwner(_) => format!(
                "owner process {process} gone; settled at the reserved {amount} micro-dollars"
            ),
            Orphans::LeaseExpired => format!(
                "owner process {process} let its lease run out; settled at the reserved {amount} micro-dollars"
            ),
        };
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

/// Forgets orphan records older than `before` whose owner is no longer registered: a
/// registered owner (alive, or back from a stall) may still settle them, whatever the
/// clock of the process that prunes says.
pub async fn prune_orphaned(db: &super::Db, before: DateTime<Utc>) -> Result<u64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::ledger::prune_orphaned(pg, before).await,
    };
    let pool = &sqlite.write;
    Ok(sqlx::query(
        "DELETE FROM orphaned WHERE created_at < ? AND owner NOT IN (SELECT id FROM processes)",
    )
    .bind(db_time(before))
    .execute(pool)
    .await?
    .rows_affected())
}

/// This process's open reservations: request id and deadline.
pub async fn own_reservations(db: &super::Db, owner: &str) -> Result<Vec<(String, String)>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::ledger::own_reservations(pg, owner).await
        }
    };
    let pool = &sqlite.read;
    Ok(
        sqlx::query_as("SELECT request_id, deadline FROM reservations WHERE owner = ?")
            .bind(owner)
            .fetch_all(pool)
            .await?,
    )
}

/// Renews the owner's lease on reservations a live request still holds.
pub async fn renew_leases(
    db: &super::Db,
    request_ids: &[String],
    deadline: DateTime<Utc>,
) -> Result<()> {
    if let super::Backend::Postgres(pg) = &db.backend {
        return super::pg::ledger::renew_leases(pg, request_ids, deadline).await;
    }
    let deadline = db_time(deadline);
    let mut tx = db.begin().await?;
    for id in request_ids {
        sqlx::query("UPDATE reservations SET deadline = ? WHERE request_id = ?")
            .bind(&deadline)
            .bind(id)
            .execute(tx.sqlite()?)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The owner of a token, with each level's reset rule, read from the database.
pub async fn owner_of(tx: &mut super::Tx, token_id: i64) -> Result<Owner> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::ledger::owner_of(conn, token_id).await;
    }
    let row = sqlx::query(
        "SELECT t.id, u.id AS user_id, u.team_id, t.reset, u.reset AS user_reset, tm.reset AS team_reset
         FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id WHERE t.id = ?",
    )
    .bind(token_id)
    .fetch_optional(tx.sqlite()?)
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
/// A change to a rotated token's own budget would land where nothing spends (its text
/// works as its successor): refused, naming the successor. Checked in the change's own
/// transaction (`adjust`; the CLI's budget commands): a rotation committed between a check
/// and the change let a credit be stranded (s23 attack, money #2).
pub fn refuse_rotated(token_id: i64, successor: Option<i64>) -> Result<()> {
    match successor {
        Some(next) => Err(StoreError::Conflict(format!(
            "token {token_id} was rotated to token {next}: until its overlap ends it works as that token; change token {next}, or revoke this one"
        ))),
        None => Ok(()),
    }
}

/// What a rotation carries to the successor: the old token's period and its spend in it
/// (`limit − remaining`, its open reservations included) — `None` for a budget that never
/// resets (the rotation moved what was left as the new limit), an unlimited one, one whose
/// period is over (the successor's starts full, as the old one's would), or nothing spent.
/// A period a wrong clock put it in far ahead is over too, but its spend is carried into
/// `now`'s period, as the old token's rollback would count it (`Reset::counted_with`).
pub fn carried(
    limit: Option<i64>,
    remaining: Option<i64>,
    reset: &str,
    period: &str,
    now: DateTime<Utc>,
) -> Option<(String, i64)> {
    let reset = Reset::parse(reset).filter(|r| *r != Reset::Never)?;
    let used = limit? - remaining?;
    let (kept, rolled) = reset.place(period, now);
    // Back from a period a wrong clock put it in, that period's spend stays spent.
    let back = reset.counted_with(period, &kept) != kept;
    ((!rolled || back) && used != 0).then_some((kept, used))
}

/// Carries a rotated token's spend in its current period to its successor (just inserted
/// with the same limit and rule), so a rotation does not refill the period: the successor
/// takes the old token's period and what it had left, and a ledger row of its own (`adjust`,
/// no user or team — their levels already count that spend) records what was carried, so
/// `limit − remaining == Σ ledger` holds at every level. Called with the old token's row
/// already written in the transaction (its successor set), so no reservation moves its
/// balance meanwhile; one still open settles into the old token's balance, what it leaves
/// unspent staying there (the pair errs towards less). Returns the amount carried.
pub async fn carry_to_successor(
    tx: &mut super::Tx,
    from: i64,
    to: i64,
    now: DateTime<Utc>,
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::ledger::carry_to_successor(conn, from, to, now).await;
    }
    let row = sqlx::query(
        "SELECT limit_micros, remaining_micros, reset, period FROM tokens WHERE id = ?",
    )
    .bind(from)
    .fetch_one(tx.sqlite()?)
    .await?;
    let Some((period, used)) = carried(
        row.try_get("limit_micros")?,
        row.try_get("remaining_micros")?,
        row.try_get("reset")?,
        row.try_get("period")?,
        now,
    ) else {
        return Ok(0);
    };
    sqlx::query(
        "UPDATE tokens SET remaining_micros = remaining_micros - ?, period = ? WHERE id = ?",
    )
    .bind(used)
    .bind(&period)
    .bind(to)
    .execute(tx.sqlite()?)
    .await?;
    sqlx::query(INSERT_LEDGER)
        .bind(to)
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(&period)
        .bind(&period)
        .bind(&period)
        .bind("adjust")
        .bind(used)
        .bind(None::<&str>)
        .bind(carry_reason(from))
        .bind(db_time(now))
        .execute(tx.sqlite()?)
        .await?;
    Ok(used)
}

/// The reason on a carried period's ledger row.
pub fn carry_reason(from: i64) -> String {
    format!("the period's spend of token {from}, carried at its rotation")
}

pub async fn adjust(
    db: &super::Db,
    token_id: i64,
    amount: i64,
    reason: &str,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    // A refund follows a rollback's carry by its reason (`carried_into`): an adjustment
    // written with that text would be followed as a carry (s32 last attack F4).
    if reason.starts_with(CARRY_REASON.0) && reason.ends_with(CARRY_REASON.1) {
        return Err(StoreError::Invalid(format!(
            "the reason \"{reason}\" is the text of the gateway's own carry rows; word the adjustment otherwise"
        )));
    }
    if let super::Backend::Postgres(pg) = &db.backend {
        return super::pg::ledger::adjust(pg, token_id, amount, reason, actor, now).await;
    }
    let mut tx = db.begin().await?;
    let owner = owner_of(&mut tx, token_id).await?;
    let successor: Option<i64> = sqlx::query_scalar("SELECT successor_id FROM tokens WHERE id = ?")
        .bind(token_id)
        .fetch_one(tx.sqlite()?)
        .await?;
    refuse_rotated(token_id, successor)?;
    let mut periods: [String; 3] = Default::default();
    for level in LEVELS {
        let id = owner.id(level);
        periods[level.idx()] =
            current_period(&mut tx, level, id, owner.resets[level.idx()], now).await?;
        sqlx::query(&SQL[level.idx()].debit)
            .bind(amount)
            .bind(id)
            .bind(&periods[level.idx()])
            .execute(tx.sqlite()?)
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
    tx: &mut super::Tx,
    level: Level,
    id: i64,
    reset: Reset,
    limit: Option<i64>,
    now: DateTime<Utc>,
) -> Result<()> {
    if let Some((conn, keys)) = tx.pg() {
        return super::pg::ledger::set_limit(conn, keys, level, id, reset, limit, now).await;
    }
    let period = current_period(tx, level, id, reset, now).await?;
    sqlx::query(&SQL[level.idx()].set_limit)
        .bind(limit)
        .bind(id)
        .bind(&period)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

/// Raises a limited level's limit and remaining by `amount`; `false` if it has no limit.
pub async fn top_up(tx: &mut super::Tx, level: Level, id: i64, amount: i64) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::ledger::top_up(conn, level, id, amount).await;
    }
    Ok(sqlx::query(&SQL[level.idx()].top_up)
        .bind(amount)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
        == 1)
}

/// What a token has spent in period `?2`, not rolled over yet, and — back from a period
/// `?3` a wrong clock put it in — what the rollback's carry (`carry_back`) will bring: that
/// period's spend less every carry of it (reason `?4`) made before, into any period (a
/// carry into the day before was counted again: s31 stop attack C4). `?3` is `?2` and `?4`
/// NULL for any other period.
const STALE_SPENT: &str = "SELECT COALESCE(SUM(amount_micros), 0)
        - COALESCE((SELECT SUM(amount_micros) FROM ledger WHERE kind = 'adjust' AND reason = ?4 AND token_id = ?1), 0)
     FROM ledger WHERE token_id = ?1 AND period IN (?2, ?3) AND kind IN ('reserve', 'settle', 'adjust')";

/// A token's balance in its current period, as its holder sees it.
#[derive(Debug, Clone, Copy)]
pub struct Balance {
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    pub reserved: i64,
    pub spent: i64,
}

pub async fn balance(db: &super::Db, token_id: i64, now: DateTime<Utc>) -> Result<Balance> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::ledger::balance(pg, token_id, now).await,
    };
    let pool = &sqlite.read;
    let row = sqlx::query("SELECT limit_micros, remaining_micros, reserved_micros, reset, period FROM tokens WHERE id = ?")
        .bind(token_id)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("token {token_id}")))?;
    let limit: Option<i64> = row.get("limit_micros");
    let reset = Reset::parse(row.get::<&str, _>("reset")).unwrap_or(Reset::Never);
    // The period the CAS would charge at `now` (`Reset::place`: a period another host whose
    // clock is a little ahead already rolled into stays).
    let stored: &str = row.get("period");
    let (current, stale) = reset.place(stored, now);
    let reserved: i64 = row.get("reserved_micros");
    let stored_remaining: Option<i64> = row.get("remaining_micros");
    // A limited token in its current period: `limit − remaining` is its ledger sum (the
    // invariant), read from the row — `GET /v1/usage` is outside the windows, and summing a
    // busy token's period on every call loaded the database (s25 attack, multi-host #4).
    let spent: i64 = match (limit, stored_remaining) {
        (Some(l), Some(r)) if !stale => l - r,
        _ => {
            sqlx::query_scalar(STALE_SPENT)
                .bind(token_id)
                .bind(&current)
                .bind(reset.counted_with(stored, &current))
                .bind(carried_from(reset, stored, &current))
                .fetch_one(pool)
                .await?
        }
    };
    // A period that has not been rolled over yet is, to its holder, already what the
    // rollover would make it: the limit less that period's ledger sum (and, back from a
    // period a wrong clock put it in, what the carry will bring of that one's).
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

/// Levels whose `limit − remaining` differs from their ledger sum for the current period,
/// described for a person (empty when the invariant holds everywhere).
pub async fn invariant_violations(db: &super::Db) -> Result<Vec<String>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::ledger::invariant_violations(pg).await,
    };
    let pool = &sqlite.read;
    let mut out = Vec::new();
    for (table, id_col, period_col) in [
        ("tokens", "token_id", "period"),
        ("users", "user_id", "user_period"),
        ("teams", "team_id", "team_period"),
    ] {
        let sql = format!(
            "SELECT t.id, t.limit_micros - t.remaining_micros,
                    COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.{id_col} = t.id AND l.{period_col} = t.period
                              AND l.kind IN ('reserve', 'settle', 'adjust')), 0)
             FROM {table} t WHERE t.limit_micros IS NOT NULL"
        );
        let rows: Vec<(i64, i64, i64)> = sqlx::query_as(&sql).fetch_all(pool).await?;
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
pub async fn open_reservations(db: &super::Db, owner: &str) -> Result<i64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::ledger::open_reservations(pg, owner).await
        }
    };
    let pool = &sqlite.read;
    Ok(
        sqlx::query_scalar("SELECT COUNT(*) FROM reservations WHERE owner = ?")
            .bind(owner)
            .fetch_one(pool)
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_rotation_carries_the_spend_of_the_period_still_running_only() {
        let now = at("2026-12-04T10:00:00Z");
        let carried =
            |limit, remaining, reset, period| carried(limit, remaining, reset, period, now);
        assert_eq!(
            carried(Some(100), Some(60), "monthly", "2026-12"),
            Some(("2026-12".into(), 40))
        );
        // A period another host's clock already moved to is kept, as the CAS keeps it.
        assert_eq!(
            carried(Some(100), Some(90), "daily", "2026-12-05"),
            Some(("2026-12-05".into(), 10))
        );
        // A period a wrong clock put it in far ahead: its spend into the host's own period,
        // as a rollback counts it (s29 final attack F1).
        assert_eq!(
            carried(Some(100), Some(90), "daily", "2036-12-04"),
            Some(("2026-12-04".into(), 10))
        );
        // A credit this period (remaining above the limit) is carried too.
        assert_eq!(
            carried(Some(100), Some(130), "weekly", "2026-W49"),
            Some(("2026-W49".into(), -30))
        );
        for (limit, remaining, reset, period) in [
            (Some(100), Some(60), "monthly", "2026-11"), // over: the new one starts full
            (Some(100), Some(60), "never", "never"),     // moved as the new limit instead
            (None, None, "monthly", "2026-12"),          // unlimited
            (Some(100), Some(100), "monthly", "2026-12"), // nothing spent
        ] {
            assert_eq!(
                carried(limit, remaining, reset, period),
                None,
                "{reset} {period}"
            );
        }
    }
}

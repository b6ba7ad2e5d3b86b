//! The seam of `pg_money`'s scenarios: one gateway process's view of either store (SQLite's
//! ledger and writer, or PostgreSQL's), and the rows a scenario starts from.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use sluice::clock::{Clock, ManualClock};
use sluice::store::audit::AuditKeys;
use sluice::store::ledger::{
    self, Level, Orphans, Owner, Refusal, Reservation, ReserveRequest, Settled,
};
use sluice::store::pg::{self, PgDb};
use sluice::store::processes::Me;
use sluice::store::{processes, writer, Db};
use tempfile::TempDir;

use crate::helpers::{budget_owner, Budget};
use crate::pg_server;

pub type Outcome = std::result::Result<Reservation, Refusal>;

/// One gateway process's view of a store: its database handle and its writer.
pub enum Store {
    Lite {
        db: Db,
        writer: writer::Writer,
        dir: Arc<TempDir>,
    },
    Pg {
        db: PgDb,
        writer: pg::writer::Writer,
        url: String,
    },
}

pub fn audit_keys() -> Arc<AuditKeys> {
    let master = sluice::secrets::MasterKey::from_hex(&"5a".repeat(32)).unwrap();
    Arc::new(AuditKeys::derive(&master))
}

impl Store {
    pub async fn sqlite() -> Store {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Store::open_lite(dir).await
    }

    async fn open_lite(dir: Arc<TempDir>) -> Store {
        let db = Db::open(&dir.path().join("money.db"), false).await.unwrap();
        let writer = writer::Writer::start(&db);
        Store::Lite { db, writer, dir }
    }

    pub async fn postgres() -> Store {
        Store::open_pg(pg_server::database()).await
    }

    pub async fn open_pg(url: String) -> Store {
        let db = PgDb::connect(&url, audit_keys()).await.unwrap();
        let writer = pg::writer::Writer::start(&db);
        Store::Pg { db, writer, url }
    }

    /// Another process on the same database (its own pool and writer).
    pub async fn another(&self) -> Store {
        match self {
            Store::Lite { dir, .. } => Store::open_lite(dir.clone()).await,
            Store::Pg { url, .. } => Store::open_pg(url.clone()).await,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Store::Lite { .. } => "sqlite",
            Store::Pg { .. } => "postgres",
        }
    }

    /// A team, user and token with these budgets (token, user, team).
    pub async fn owner(&self, levels: &[Budget; 3]) -> Owner {
        match self {
            Store::Lite { db, .. } => budget_owner(db, levels).await,
            Store::Pg { db, .. } => pg_owner(db, levels).await,
        }
    }

    pub async fn reserve(
        &self,
        owner: &Owner,
        request_id: &str,
        amount: i64,
        process: &str,
        clock: Arc<dyn Clock>,
    ) -> sluice::store::Result<Outcome> {
        let req = ReserveRequest {
            request_id,
            owner,
            amount,
            process,
            lease: Duration::minutes(10),
        };
        match self {
            Store::Lite { writer, .. } => ledger::reserve_via(writer, &req, clock).await,
            Store::Pg { writer, .. } => pg::ledger::reserve_via(writer, &req, clock).await,
        }
    }

    pub async fn settle(
        &self,
        request_id: &str,
        actual: i64,
        clock: Arc<dyn Clock>,
    ) -> sluice::store::Result<Option<Settled>> {
        match self {
            Store::Lite { writer, .. } => {
                ledger::settle_via(writer, request_id.into(), actual, clock).await
            }
            Store::Pg { writer, .. } => {
                pg::ledger::settle_via(writer, request_id.into(), actual, clock).await
            }
        }
    }

    pub async fn release(&self, request_id: &str, clock: Arc<dyn Clock>) -> Option<Settled> {
        match self {
            Store::Lite { writer, .. } => {
                ledger::release_via(writer, request_id.into(), clock).await
            }
            Store::Pg { writer, .. } => {
                pg::ledger::release_via(writer, request_id.into(), clock).await
            }
        }
        .unwrap()
    }

    pub async fn settle_orphans(&self, which: Orphans<'_>, now: DateTime<Utc>) -> u64 {
        match self {
            Store::Lite { db, .. } => ledger::settle_orphans(db, which, now).await,
            Store::Pg { db, .. } => pg::ledger::settle_orphans(db, which, now).await,
        }
        .unwrap()
    }

    pub async fn heartbeat(&self, me: &Me, now: DateTime<Utc>) -> bool {
        match self {
            Store::Lite { db, .. } => processes::heartbeat(db, me, now).await,
            Store::Pg { db, .. } => pg::processes::heartbeat(db, me, now).await,
        }
        .unwrap()
    }

    pub async fn dead_owners(&self, me: &Me, now: DateTime<Utc>) -> Vec<String> {
        let mut dead = match self {
            Store::Lite { db, .. } => processes::dead_owners(db, me, now).await,
            Store::Pg { db, .. } => pg::processes::dead_owners(db, me, now).await,
        }
        .unwrap();
        dead.sort();
        dead
    }

    pub async fn adjust(&self, token_id: i64, amount: i64, now: DateTime<Utc>) {
        match self {
            Store::Lite { db, .. } => {
                ledger::adjust(db, token_id, amount, "test", "admin", now).await
            }
            Store::Pg { db, .. } => {
                pg::ledger::adjust(db, token_id, amount, "test", "admin", now).await
            }
        }
        .unwrap()
    }

    /// Sets a level's limit as an admin edit does (in a transaction of its own).
    pub async fn set_limit(
        &self,
        level: Level,
        id: i64,
        reset: sluice::quota::period::Reset,
        limit: Option<i64>,
        now: DateTime<Utc>,
    ) {
        match self {
            Store::Lite { db, .. } => {
                let mut tx = db.begin().await.unwrap();
                ledger::set_limit(&mut tx, level, id, reset, limit, now)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            Store::Pg { db, .. } => {
                let mut tx = db.pool.begin().await.unwrap();
                pg::ledger::set_limit(&mut tx, &db.audit, level, id, reset, limit, now)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
    }

    pub async fn top_up(&self, level: Level, id: i64, amount: i64) -> bool {
        match self {
            Store::Lite { db, .. } => {
                let mut tx = db.begin().await.unwrap();
                let done = ledger::top_up(&mut tx, level, id, amount).await.unwrap();
                tx.commit().await.unwrap();
                done
            }
            Store::Pg { db, .. } => {
                let mut conn = db.pool.acquire().await.unwrap();
                pg::ledger::top_up(&mut conn, level, id, amount)
                    .await
                    .unwrap()
            }
        }
    }

    pub async fn violations(&self) -> Vec<String> {
        match self {
            Store::Lite { db, .. } => ledger::invariant_violations(db).await,
            Store::Pg { db, .. } => pg::ledger::invariant_violations(db).await,
        }
        .unwrap()
    }

    /// One integer from `sql` (written in the SQL both engines read).
    pub async fn int(&self, sql: &str) -> i64 {
        match self {
            Store::Lite { db, .. } => sqlx::query_scalar::<_, Option<i64>>(sql)
                .fetch_one(&db.sqlite().read)
                .await
                .unwrap(),
            Store::Pg { db, .. } => sqlx::query_scalar::<_, Option<i64>>(sql)
                .fetch_one(&db.pool)
                .await
                .unwrap(),
        }
        .unwrap_or(0)
    }

    /// One text from `sql`.
    pub async fn text(&self, sql: &str) -> String {
        match self {
            Store::Lite { db, .. } => sqlx::query_scalar::<_, String>(sql)
                .fetch_one(&db.sqlite().read)
                .await
                .unwrap(),
            Store::Pg { db, .. } => sqlx::query_scalar::<_, String>(sql)
                .fetch_one(&db.pool)
                .await
                .unwrap(),
        }
    }

    /// (limit, remaining, reserved) of a level's row.
    pub async fn level(&self, table: &str, id: i64) -> (i64, i64, i64) {
        (
            self.int(&format!("SELECT limit_micros FROM {table} WHERE id = {id}"))
                .await,
            self.int(&format!(
                "SELECT remaining_micros FROM {table} WHERE id = {id}"
            ))
            .await,
            self.int(&format!(
                "SELECT reserved_micros FROM {table} WHERE id = {id}"
            ))
            .await,
        )
    }

    /// Σ ledger of `kinds` (e.g. `'reserve', 'settle'`) for a token.
    pub async fn ledger_sum(&self, token_id: i64, kinds: &str) -> i64 {
        self.int(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {token_id} AND kind IN ({kinds})"
        ))
        .await
    }

    /// Every check that must hold whenever nothing is in flight.
    pub async fn assert_settled(&self) {
        assert_eq!(
            self.violations().await,
            Vec::<String>::new(),
            "{}",
            self.name()
        );
        for table in ["tokens", "users", "teams"] {
            assert_eq!(
                self.int(&format!(
                    "SELECT CAST(COALESCE(SUM(reserved_micros), 0) AS BIGINT) FROM {table}"
                ))
                .await,
                0,
                "{}: {table} still reserved",
                self.name()
            );
            assert_eq!(
                self.int(&format!(
                    "SELECT COUNT(*) FROM {table} WHERE remaining_micros < 0"
                ))
                .await,
                0,
                "{}: {table} overdrawn",
                self.name()
            );
        }
        assert_eq!(self.int("SELECT COUNT(*) FROM reservations").await, 0);
    }
}

static NEXT_PG_OWNER: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);

/// `helpers::budget_owner` on PostgreSQL.
pub async fn pg_owner(db: &PgDb, levels: &[Budget; 3]) -> Owner {
    let id = NEXT_PG_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let at = "2026-12-01T00:00:00.000Z";
    let [token, user, team] = levels;
    sqlx::query("INSERT INTO teams (id, name, limit_micros, remaining_micros, reset, created_at) VALUES ($1, $2, $3, $3, $4, $5)")
        .bind(id)
        .bind(format!("team-{id}"))
        .bind(team.limit)
        .bind(team.reset)
        .bind(at)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users (id, username, team_id, limit_micros, remaining_micros, reset, created_at) VALUES ($1, $2, $1, $3, $3, $4, $5)")
        .bind(id)
        .bind(format!("user-{id}"))
        .bind(user.limit)
        .bind(user.reset)
        .bind(at)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tokens (id, user_id, token_hash, prefix, limit_micros, remaining_micros, reset, created_at)
         VALUES ($1, $1, $2, 'abcdefgh', $3, $3, $4, $5)",
    )
    .bind(id)
    .bind(id.to_be_bytes().to_vec())
    .bind(token.limit)
    .bind(token.reset)
    .bind(at)
    .execute(&db.pool)
    .await
    .unwrap();
    let reset = |b: &Budget| sluice::quota::period::Reset::parse(b.reset).unwrap();
    Owner {
        token_id: id,
        user_id: id,
        team_id: id,
        resets: [reset(token), reset(user), reset(team)],
    }
}

pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub fn clock_at(s: &str) -> Arc<ManualClock> {
    Arc::new(ManualClock::new(at(s)))
}

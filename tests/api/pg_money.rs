//! The money contract on both stores (issue 17 item 2): each scenario is one body run
//! against the SQLite ledger (`store::ledger` through its writer) and the PostgreSQL one
//! (`store::pg::ledger` through its writer), on a real SQLite file and a real PostgreSQL
//! server. `Store` is the small seam between the body and the two modules.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::{
    self, Level, Orphans, Owner, Refusal, Reservation, ReserveRequest, Settled,
};
use sluice::store::pg::PgDb;
use sluice::store::processes::Me;
use sluice::store::{processes, writer, Db};
use tempfile::TempDir;

use crate::helpers::{budget_owner, Budget};
use crate::pg_server;

pub type Outcome = std::result::Result<Reservation, Refusal>;

/// One gateway process's view of a store: its database handle and its writer, on either
/// engine (`Db` dispatches; the body never asks which).
pub struct Store {
    pub db: Db,
    pub writer: writer::Writer,
    /// Where another process finds the same database.
    place: Place,
}

#[derive(Clone)]
enum Place {
    Sqlite(Arc<TempDir>),
    Postgres(String),
}

/// The master key every test process shares (on PostgreSQL all hosts must).
pub fn master_key() -> sluice::secrets::MasterKey {
    sluice::secrets::MasterKey::from_hex(&"5a".repeat(32)).unwrap()
}

impl Store {
    pub async fn sqlite() -> Store {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Store::open(Place::Sqlite(dir)).await
    }

    pub async fn postgres() -> Store {
        Store::open_pg(pg_server::database()).await
    }

    pub async fn open_pg(url: String) -> Store {
        Store::open(Place::Postgres(url)).await
    }

    async fn open(place: Place) -> Store {
        let db = match &place {
            Place::Sqlite(dir) => Db::open(&dir.path().join("money.db"), false).await.unwrap(),
            Place::Postgres(url) => Db::open_postgres(url, &master_key()).await.unwrap(),
        };
        let writer = writer::Writer::start(&db);
        Store { db, writer, place }
    }

    /// Another process on the same database (its own pool and writer).
    pub async fn another(&self) -> Store {
        Store::open(self.place.clone()).await
    }

    pub fn name(&self) -> &'static str {
        self.db.engine()
    }

    /// One request of `R` reserved as `id` at `clock` and settled at its full amount, or
    /// the refusal.
    pub async fn charge_one(
        &self,
        owner: &Owner,
        id: &str,
        clock: &Arc<ManualClock>,
    ) -> std::result::Result<(), Refusal> {
        let clock: Arc<dyn Clock> = clock.clone();
        self.reserve(owner, id, R, "p", clock.clone())
            .await
            .unwrap()?;
        self.settle(id, R, clock).await.unwrap().unwrap();
        Ok(())
    }

    /// The PostgreSQL database, for the checks that are PostgreSQL's own.
    pub fn pg(&self) -> &PgDb {
        self.db.postgres().expect("a PostgreSQL store")
    }

    /// A team, user and token with these budgets (token, user, team).
    pub async fn owner(&self, levels: &[Budget; 3]) -> Owner {
        match self.db.postgres() {
            None => budget_owner(&self.db, levels).await,
            Some(pg) => pg_owner(pg, levels).await,
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
        ledger::reserve_via(&self.writer, &req, clock).await
    }

    pub async fn settle(
        &self,
        request_id: &str,
        actual: i64,
        clock: Arc<dyn Clock>,
    ) -> sluice::store::Result<Option<Settled>> {
        ledger::settle_via(&self.writer, request_id.into(), actual, clock).await
    }

    pub async fn release(&self, request_id: &str, clock: Arc<dyn Clock>) -> Option<Settled> {
        ledger::release_via(&self.writer, request_id.into(), clock)
            .await
            .unwrap()
    }

    pub async fn settle_orphans(&self, which: Orphans<'_>, now: DateTime<Utc>) -> u64 {
        ledger::settle_orphans(&self.db, which, now).await.unwrap()
    }

    pub async fn heartbeat(&self, me: &Me, now: DateTime<Utc>) -> bool {
        processes::heartbeat(&self.db, me, now).await.unwrap()
    }

    /// Makes `id`'s latest heartbeat `secs` older by the clock liveness is judged by: on
    /// PostgreSQL the database's (`seen_at`); on SQLite the `now` the caller passes (nothing
    /// to do here).
    pub async fn age_heartbeat(&self, id: &str, secs: f64) {
        if let Some(pg) = self.db.postgres() {
            sqlx::query(
                "UPDATE processes SET seen_at = seen_at - make_interval(secs => $2) WHERE id = $1",
            )
            .bind(id)
            .bind(secs)
            .execute(&pg.pool)
            .await
            .unwrap();
        }
    }

    pub async fn dead_owners(&self, me: &Me, now: DateTime<Utc>) -> Vec<String> {
        let mut dead = processes::dead_owners(&self.db, me, now).await.unwrap();
        dead.sort();
        dead
    }

    pub async fn adjust(&self, token_id: i64, amount: i64, now: DateTime<Utc>) {
        ledger::adjust(&self.db, token_id, amount, "test", "admin", now)
            .await
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
        let mut tx = self.db.begin().await.unwrap();
        ledger::set_limit(&mut tx, level, id, reset, limit, now)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    pub async fn top_up(&self, level: Level, id: i64, amount: i64) -> bool {
        let mut tx = self.db.begin().await.unwrap();
        let done = ledger::top_up(&mut tx, level, id, amount).await.unwrap();
        tx.commit().await.unwrap();
        done
    }

    pub async fn violations(&self) -> Vec<String> {
        ledger::invariant_violations(&self.db).await.unwrap()
    }

    /// One integer from `sql` (written in the SQL both engines read).
    pub async fn int(&self, sql: &str) -> i64 {
        crate::helpers::sql_int(&self.db, sql).await
    }

    /// One text from `sql`.
    pub async fn text(&self, sql: &str) -> String {
        crate::helpers::sql_text(&self.db, sql).await
    }

    /// Runs one statement (written in the SQL both engines read).
    pub async fn exec(&self, sql: &str) {
        crate::helpers::sql_exec(&self.db, sql).await
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

/// Generates `sqlite` and `postgres` tests running `$body(store)`.
macro_rules! on_both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body(super::Store::sqlite().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$body(super::Store::postgres().await).await
            }
        }
    };
}

pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub fn clock_at(s: &str) -> Arc<ManualClock> {
    Arc::new(ManualClock::new(at(s)))
}

fn unlimited() -> Budget {
    Budget {
        limit: None,
        reset: "never",
    }
}

fn limit(micros: i64, reset: &'static str) -> Budget {
    Budget {
        limit: Some(micros),
        reset,
    }
}

const R: i64 = 1_000;

/// The setting of every wrong-clock scenario: an owner with `levels`, and a second host on
/// the same store whose clock ran ten years ahead (`wrong` at `ahead`) beside the right
/// clock (`right`).
struct WrongClock {
    owner: Owner,
    wrong: Store,
    ahead: Arc<ManualClock>,
    right: Arc<ManualClock>,
}

impl WrongClock {
    async fn new(store: &Store, levels: &[Budget; 3]) -> WrongClock {
        WrongClock {
            owner: store.owner(levels).await,
            wrong: store.another().await,
            ahead: clock_at("2036-12-04T10:00:00Z"),
            right: clock_at("2026-12-04T10:00:00Z"),
        }
    }

    /// A daily token budget of 10 R, no other limit.
    async fn daily(store: &Store) -> WrongClock {
        WrongClock::new(store, &[limit(10 * R, "daily"), unlimited(), unlimited()]).await
    }

    /// Reserves `amount` as `id` on the wrong clock's host, in its period ahead.
    async fn reserve_ahead(&self, id: &str, amount: i64) {
        let ahead: Arc<dyn Clock> = self.ahead.clone();
        let reserved = self.wrong.reserve(&self.owner, id, amount, "w", ahead);
        reserved.await.unwrap().unwrap();
    }

    /// The right host's day admits exactly `n` more requests of 1 R (from `store`).
    async fn admits_exactly(&self, store: &Store, n: i64) {
        for i in 0..n {
            let r = store
                .charge_one(&self.owner, &format!("last{i}"), &self.right)
                .await;
            assert!(r.is_ok(), "{}: {i} of {n}: {r:?}", store.name());
        }
        let refused = store.charge_one(&self.owner, "last", &self.right).await;
        assert!(refused.is_err(), "{}: the day is spent", store.name());
    }
}

/// 200 reservations at once, from two processes (100 each, every one its own task), on a
/// token whose budget covers exactly 100: exactly 100 admitted, 100 refused at the token
/// level; settled at their full amount, spend is the budget to the micro-dollar.
async fn two_hundred_reservations_for_a_budget_of_one_hundred(store: Store) {
    let other = store.another().await;
    let owner = store
        .owner(&[
            limit(100 * R, "never"),
            unlimited(),
            limit(1_000 * R, "monthly"),
        ])
        .await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    let stores = Arc::new([store, other]);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (stores, owner, clock) = (stores.clone(), owner.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            let s = &stores[i % 2];
            let id = format!("r{i}");
            let out = s
                .reserve(&owner, &id, R, &format!("p{}", i % 2), clock)
                .await;
            (id, out)
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            (id, Ok(Ok(_))) => admitted.push(id),
            (_, Ok(Err(Refusal::Insufficient(Level::Token, None)))) => refused += 1,
            (_, other) => panic!("{}: unexpected {other:?}", stores[0].name()),
        }
    }
    assert_eq!(
        (admitted.len(), refused),
        (100, 100),
        "{}",
        stores[0].name()
    );
    let store = &stores[0];
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (100 * R, 0, 100 * R)
    );
    for (i, id) in admitted.iter().enumerate() {
        let settled = stores[i % 2]
            .settle(id, R, clock.clone())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((settled.charged, settled.absorbed), (R, 0));
    }
    assert_eq!(
        store
            .ledger_sum(owner.token_id, "'reserve', 'settle', 'adjust'")
            .await,
        100 * R
    );
    assert_eq!(
        store.level("teams", owner.team_id).await,
        (1_000 * R, 900 * R, 0)
    );
    store.assert_settled().await;
}
on_both_stores!(
    two_hundred_reservations_on_a_budget_for_one_hundred_admit_exactly_one_hundred,
    two_hundred_reservations_for_a_budget_of_one_hundred
);

/// Reservations on both sides of midnight, under load, on a daily budget: each day's
/// spend is within the limit, the two days add up to everything charged, and the level
/// rolled over exactly once, with one audit row.
async fn a_rollover_under_load(store: Store) {
    let owner = store
        .owner(&[limit(50 * R, "daily"), unlimited(), unlimited()])
        .await;
    let clock = clock_at("2026-12-01T23:59:59.000Z");
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let store = Arc::new(store);
    let run = |from: usize, n: usize| {
        let mut tasks = Vec::new();
        for i in from..from + n {
            let (store, owner, clock) = (store.clone(), owner.clone(), dyn_clock.clone());
            tasks.push(tokio::spawn(async move {
                let id = format!("d{i}");
                match store
                    .reserve(&owner, &id, R, "p", clock.clone())
                    .await
                    .unwrap()
                {
                    Ok(_) => {
                        store.settle(&id, R / 2, clock).await.unwrap().unwrap();
                        1
                    }
                    Err(Refusal::Insufficient(Level::Token, Some(_))) => 0,
                    Err(other) => panic!("{other:?}"),
                }
            }));
        }
        tasks
    };
    let day1 = run(0, 120);
    clock.advance(Duration::milliseconds(500));
    let mut admitted = 0;
    for t in day1 {
        admitted += t.await.unwrap();
    }
    clock.advance(Duration::milliseconds(600)); // 2026-12-02T00:00:00.100
    let mut day2 = 0;
    for t in run(1_000, 120) {
        day2 += t.await.unwrap();
    }
    admitted += day2;
    let spend = |p: &'static str| {
        let store = store.clone();
        async move {
            store
                .int(&format!(
                    "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {} AND period = '{p}' AND kind IN ('reserve', 'settle')",
                    owner.token_id
                ))
                .await
        }
    };
    let (d1, d2) = (spend("2026-12-01").await, spend("2026-12-02").await);
    assert!(d1 <= 50 * R && d2 <= 50 * R, "{}: {d1} {d2}", store.name());
    assert_eq!(d1 + d2, admitted * R / 2, "{}", store.name());
    assert!(
        day2 >= 50,
        "{}: the new day admits its budget's worth ({day2})",
        store.name()
    );
    assert_eq!(
        store
            .int(&format!(
                "SELECT COUNT(*) FROM audit_log WHERE action = 'budget.period_reset' AND target = 'token:{}' AND after = '2026-12-02'",
                owner.token_id
            ))
            .await,
        1,
        "{}",
        store.name()
    );
    assert_eq!(
        store
            .text(&format!(
                "SELECT period FROM tokens WHERE id = {}",
                owner.token_id
            ))
            .await,
        "2026-12-02"
    );
    store.assert_settled().await;
}
on_both_stores!(
    a_period_rollover_under_load_splits_spend_between_the_periods,
    a_rollover_under_load
);

/// Two hosts, one's clock 30 hours ahead: a period another host stored that is newer than
/// this host's is kept, never rolled back. `Reset::place` rolled a period more than one
/// ahead back to the host's own, so the hosts flipped the level between their periods and
/// each flip restored that period's budget: a daily budget spent two and three times in one
/// real day (s29 money attack F1).
async fn a_period_ahead_is_never_rolled_back(store: Store) {
    let owner = store
        .owner(&[limit(10 * R, "daily"), unlimited(), unlimited()])
        .await;
    let other = store.another().await;
    let ahead = clock_at("2026-12-05T16:00:00.000Z");
    let right = clock_at("2026-12-04T10:00:00.000Z");
    let mut admitted = 0;
    let mut n = 0;
    for round in 0..2 {
        for _ in 0..15 {
            for (host, clock) in [(&store, &ahead), (&other, &right)] {
                n += 1;
                match host.charge_one(&owner, &format!("s{n}"), clock).await {
                    Ok(()) => admitted += 1,
                    Err(Refusal::Insufficient(Level::Token, wait)) if round == 1 => {
                        // Refilled when the period it was refused in ends: 12-06's end,
                        // on either host's clock (s29 money attack F2).
                        let end = at("2026-12-07T00:00:00Z");
                        let left = (end - clock.now()).num_seconds() as u64;
                        assert_eq!(wait, Some(left), "{}", store.name());
                    }
                    Err(Refusal::Insufficient(Level::Token, _)) => {}
                    Err(other) => panic!("{other:?}"),
                }
            }
        }
        if round == 0 {
            // The host ahead passes its midnight: one new day, once.
            for c in [&ahead, &right] {
                c.advance(Duration::hours(8));
            }
        }
    }
    assert_eq!(
        admitted,
        20,
        "{}: a budget for each day the stored period passed",
        store.name()
    );
    let days = store
        .int(&format!(
            "SELECT COUNT(DISTINCT period) FROM ledger WHERE token_id = {} AND kind = 'reserve'",
            owner.token_id
        ))
        .await;
    assert_eq!(
        days,
        2,
        "{}: 12-05 and 12-06, never 12-04 again",
        store.name()
    );
    store.assert_settled().await;
}
on_both_stores!(
    a_period_another_host_stored_ahead_is_never_rolled_back,
    a_period_ahead_is_never_rolled_back
);

/// A host whose clock ran ten years ahead for a moment charged a daily token budget and a
/// monthly user budget in its future periods. The hosts with the right clock roll each
/// level back to their own period, at the limit less both periods' spend: neither one
/// budget until 2036 with a Retry-After of years, nor a refill (s29 final attack F1).
async fn a_period_far_ahead_rolls_back(store: Store) {
    let levels = [
        limit(10 * R, "daily"),
        limit(100 * R, "monthly"),
        unlimited(),
    ];
    let WrongClock {
        owner,
        wrong,
        ahead,
        right,
    } = WrongClock::new(&store, &levels).await;
    let mut n = 0;
    let mut charge = async |host: &Store, clock: &Arc<ManualClock>, times: usize| {
        let (mut admitted, mut waits) = (0, Vec::new());
        for _ in 0..times {
            n += 1;
            match host.charge_one(&owner, &format!("f{n}"), clock).await {
                Ok(()) => admitted += 1,
                Err(Refusal::Insufficient(Level::Token, wait)) => waits.push(wait),
                Err(other) => panic!("{other:?}"),
            }
        }
        (admitted, waits)
    };
    assert_eq!(charge(&wrong, &ahead, 4).await.0, 4);
    let (admitted, waits) = charge(&store, &right, 10).await;
    assert_eq!(
        admitted,
        6,
        "{}: today's budget less what the wrong clock spent",
        store.name()
    );
    // Refilled at the end of the host's own day, 14 hours on.
    assert_eq!(waits, vec![Some(14 * 3600); 4], "{}", store.name());
    let row =
        |col: &str, table: &str, id: i64| format!("SELECT {col} FROM {table} WHERE id = {id}");
    assert_eq!(
        store.text(&row("period", "tokens", owner.token_id)).await,
        "2026-12-04"
    );
    assert_eq!(
        store.text(&row("period", "users", owner.user_id)).await,
        "2026-12"
    );
    assert_eq!(
        store
            .int(&row("remaining_micros", "users", owner.user_id))
            .await,
        90 * R,
        "{}: the month's budget less both months' spend",
        store.name()
    );
    // A rollback, not a second reset of the day.
    assert_eq!(
        store
            .int(&format!(
                "SELECT COUNT(*) FROM audit_log WHERE action = 'budget.period_rollback' AND target = 'token:{}' AND before = '2036-12-04' AND after = '2026-12-04'",
                owner.token_id
            ))
            .await,
        1,
        "{}",
        store.name()
    );
    store.assert_settled().await;
    // The next day refills as any day does.
    right.advance(Duration::hours(14));
    assert_eq!(charge(&store, &right, 10).await, (10, Vec::new()));
    store.assert_settled().await;
}
on_both_stores!(
    a_period_a_wrong_clock_put_far_ahead_is_rolled_back_without_a_refill,
    a_period_far_ahead_rolls_back
);

/// Settlement is exact on both sides of the reservation: below it the rest is refunded to
/// every level; above it the token is charged the reservation and the rest is `absorbed`.
async fn settle_exact(store: Store) {
    let owner = store
        .owner(&[
            limit(10 * R, "never"),
            limit(20 * R, "monthly"),
            limit(30 * R, "monthly"),
        ])
        .await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    let held = store
        .reserve(&owner, "low", 3 * R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (held.remaining, held.token_remaining),
        (Some(7 * R), Some(7 * R))
    );
    let s = store
        .settle("low", 1_234, clock.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.charged, s.absorbed), (1_234, 0));
    assert_eq!(s.token_remaining, Some(10 * R - 1_234));
    assert_eq!(
        store.level("users", owner.user_id).await,
        (20 * R, 20 * R - 1_234, 0)
    );
    assert!(
        store
            .settle("low", 1_234, clock.clone())
            .await
            .unwrap()
            .is_none(),
        "idempotent"
    );
    store
        .reserve(&owner, "high", 2 * R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let s = store
        .settle("high", 2 * R + 777, clock.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.charged, s.absorbed), (2 * R, 777));
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 10 * R - 1_234 - 2 * R, 0)
    );
    assert_eq!(store.ledger_sum(owner.token_id, "'absorbed'").await, 777);
    assert_eq!(
        store
            .ledger_sum(owner.token_id, "'reserve', 'settle'")
            .await,
        1_234 + 2 * R
    );
    store.assert_settled().await;
}
on_both_stores!(
    settlement_above_or_below_the_reservation_is_exact,
    settle_exact
);

/// A process on another host stops beating: a survivor finds it dead, settles its
/// reservations as orphans at their full amount and releases what they held.
async fn orphans_of_a_dead_owner(store: Store) {
    let survivor = store.another().await;
    let owner = store
        .owner(&[limit(10 * R, "never"), unlimited(), unlimited()])
        .await;
    let t0 = at("2026-12-01T12:00:00Z");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(t0));
    let dead = Me::new("dead".into(), "host-a".into());
    let alive = Me::new("alive".into(), "host-b".into());
    assert!(store.heartbeat(&dead, t0).await);
    for i in 0..3 {
        store
            .reserve(&owner, &format!("o{i}"), R, "dead", clock.clone())
            .await
            .unwrap()
            .unwrap();
    }
    let later = t0 + Duration::seconds(60);
    assert!(survivor.heartbeat(&alive, later).await);
    assert_eq!(
        survivor
            .dead_owners(&alive, t0 + Duration::seconds(5))
            .await,
        Vec::<String>::new()
    );
    // A minute without a beat (on PostgreSQL by the database's clock).
    store.age_heartbeat("dead", 60.0).await;
    assert_eq!(survivor.dead_owners(&alive, later).await, ["dead"]);
    assert_eq!(
        survivor
            .settle_orphans(Orphans::OfOwner("dead"), later)
            .await,
        3
    );
    assert_eq!(
        survivor
            .settle_orphans(Orphans::OfOwner("dead"), later)
            .await,
        0
    );
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 7 * R, 0)
    );
    assert_eq!(
        store
            .int("SELECT COUNT(*) FROM ledger WHERE kind = 'orphan' AND amount_micros = 0")
            .await,
        3
    );
    assert_eq!(store.int("SELECT COUNT(*) FROM orphaned").await, 3);
    assert_eq!(
        survivor.dead_owners(&alive, later).await,
        Vec::<String>::new()
    );
    store.assert_settled().await;
}
on_both_stores!(
    orphans_of_a_dead_owner_are_settled_by_another_process,
    orphans_of_a_dead_owner
);

/// An owner that was only stalled settles after its reservation was settled as an orphan:
/// the overcharge is refunded, the orphan record goes, and the spend is the actual cost.
async fn stalled_owner(store: Store) {
    let owner = store
        .owner(&[
            limit(10 * R, "never"),
            limit(10 * R, "monthly"),
            unlimited(),
        ])
        .await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    store
        .reserve(&owner, "s1", 4 * R, "stalled", clock.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .settle_orphans(Orphans::OfOwner("stalled"), clock.now())
            .await,
        1
    );
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 6 * R, 0)
    );
    // A release (the owner's sweep) leaves an orphan alone: only a settlement corrects it.
    assert!(store.release("s1", clock.clone()).await.is_none());
    let s = store
        .settle("s1", 1_500, clock.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.charged, s.absorbed), (1_500, 0));
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 10 * R - 1_500, 0)
    );
    assert_eq!(
        store.level("users", owner.user_id).await,
        (10 * R, 10 * R - 1_500, 0)
    );
    assert_eq!(store.int("SELECT COUNT(*) FROM orphaned").await, 0);
    assert!(store
        .settle("s1", 1_500, clock.clone())
        .await
        .unwrap()
        .is_none());
    store.assert_settled().await;
}
on_both_stores!(
    a_stalled_owner_settling_after_its_orphan_refunds_the_overcharge,
    stalled_owner
);

/// A refused reservation writes nothing: no reservation, no ledger row, no balance moved —
/// except a due rollover, which is true either way (with its audit row).
async fn refusal_writes_nothing(store: Store) {
    let owner = store
        .owner(&[
            limit(10 * R, "never"),
            limit(R - 1, "monthly"),
            limit(10 * R, "monthly"),
        ])
        .await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    let before = counts(&store).await;
    match store
        .reserve(&owner, "x", R, "p", clock.clone())
        .await
        .unwrap()
    {
        Err(Refusal::Insufficient(Level::User, Some(_))) => {}
        other => panic!("{}: {other:?}", store.name()),
    }
    // The stored periods were '' (never placed): each rolled over once, with its audit row.
    let after = counts(&store).await;
    assert_eq!((after.0, after.1), (before.0, before.1), "{}", store.name());
    assert_eq!(
        after.2,
        before.2 + 3,
        "{}: three true rollovers",
        store.name()
    );
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 10 * R, 0)
    );
    assert_eq!(store.level("users", owner.user_id).await, (R - 1, R - 1, 0));
    // Refused again: nothing more at all.
    assert!(store
        .reserve(&owner, "x", R, "p", clock.clone())
        .await
        .unwrap()
        .is_err());
    assert_eq!(counts(&store).await, after);
    // A revoked token is refused as gone, and nothing is written either.
    store
        .reserve(&owner, "ok", R - 1, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.settle("ok", 0, clock.clone()).await.unwrap().unwrap();
    let before = counts(&store).await;
    let revoke = format!(
        "UPDATE tokens SET revoked_at = '2026-12-01T00:00:00.000Z' WHERE id = {}",
        owner.token_id
    );
    store.exec(&revoke).await;
    assert!(matches!(
        store
            .reserve(&owner, "y", 1, "p", clock.clone())
            .await
            .unwrap(),
        Err(Refusal::TokenGone)
    ));
    assert_eq!(counts(&store).await, before);
    store.assert_settled().await;
}
on_both_stores!(
    a_refused_reservation_writes_nothing_but_a_true_rollover,
    refusal_writes_nothing
);

/// (ledger rows, reservations, audit rows).
async fn counts(s: &Store) -> (i64, i64, i64) {
    (
        s.int("SELECT COUNT(*) FROM ledger").await,
        s.int("SELECT COUNT(*) FROM reservations").await,
        s.int("SELECT COUNT(*) FROM audit_log").await,
    )
}

/// Admin edits between reservations: an adjustment, a lower limit, a top-up — the invariant
/// holds after each, and a limit below the spend refuses the next reservation.
async fn budget_edits(store: Store) {
    use sluice::quota::period::Reset;
    let owner = store
        .owner(&[limit(10 * R, "monthly"), unlimited(), unlimited()])
        .await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    store
        .reserve(&owner, "e1", 4 * R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.adjust(owner.token_id, 2 * R, clock.now()).await;
    assert_eq!(store.violations().await, Vec::<String>::new());
    store
        .set_limit(
            Level::Token,
            owner.token_id,
            Reset::Monthly,
            Some(5 * R),
            clock.now(),
        )
        .await;
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (5 * R, -R, 4 * R)
    );
    assert_eq!(store.violations().await, Vec::<String>::new());
    assert!(store
        .reserve(&owner, "e2", 1, "p", clock.clone())
        .await
        .unwrap()
        .is_err());
    store.settle("e1", R, clock.clone()).await.unwrap().unwrap();
    assert!(store.top_up(Level::Token, owner.token_id, 5 * R).await);
    assert!(
        !store.top_up(Level::User, owner.user_id, 5 * R).await,
        "unlimited"
    );
    assert_eq!(
        store.level("tokens", owner.token_id).await,
        (10 * R, 7 * R, 0)
    );
    store
        .reserve(&owner, "e3", 7 * R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    store
        .settle("e3", 7 * R, clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.assert_settled().await;
}
on_both_stores!(budget_edits_keep_the_invariant, budget_edits);

/// s26 final attack #2: a reservation on a token rotated since its request was
/// authenticated — it has a successor, whose budget the rotation handed the old one's (the
/// old row keeps a copy) — is refused as `Rotated`, naming the successor, and writes
/// nothing; in a batch with others' reservations (the grouped statements on PostgreSQL)
/// it is refused alone and the others go through. Through `Quota` the refusal leaves
/// nothing held: no live reservation, none of unknown outcome. A token whose user was
/// disabled is refused as gone. The successor reserves as usual.
async fn rotated_token_refused(store: Store) {
    use sluice::quota::{reservation::Quota, QuotaError};
    let levels = [
        limit(10 * R, "never"),
        unlimited(),
        limit(100 * R, "monthly"),
    ];
    let old = store.owner(&levels).await;
    let next = store.owner(&levels).await;
    let other = store.owner(&levels).await;
    let clock: Arc<dyn Clock> = clock_at("2026-12-01T12:00:00Z");
    // Before the rotation the old token reserves as usual.
    store
        .reserve(&old, "before", R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.settle("before", R / 2, clock.clone()).await.unwrap();
    store
        .exec(&format!(
            "UPDATE tokens SET successor_id = {} WHERE id = {}",
            next.token_id, old.token_id
        ))
        .await;
    let before = counts(&store).await;
    let old_levels = [
        store.level("tokens", old.token_id).await,
        store.level("users", old.user_id).await,
        store.level("teams", old.team_id).await,
    ];
    match store.reserve(&old, "alone", R, "p", clock.clone()).await {
        Ok(Err(Refusal::Rotated(n))) => assert_eq!(n, next.token_id, "{}", store.name()),
        other => panic!("{}: {other:?}", store.name()),
    }
    assert_eq!(
        counts(&store).await,
        before,
        "{}: nothing written",
        store.name()
    );
    // Concurrent jobs share the writer's batches: each refused or reserved on its own.
    let jobs = (0..24).map(|i| {
        let owner = [&old, &next, &other][i % 3].clone();
        let (store, clock) = (&store, clock.clone());
        async move {
            let id = format!("b{i}");
            (i % 3, store.reserve(&owner, &id, R / 4, "p", clock).await)
        }
    });
    let outcomes = futures_util::future::join_all(jobs).await;
    for (which, outcome) in outcomes {
        match (which, outcome) {
            (0, Ok(Err(Refusal::Rotated(n)))) => assert_eq!(n, next.token_id),
            (1 | 2, Ok(Ok(_))) => {}
            (w, o) => panic!("{}: owner {w}: {o:?}", store.name()),
        }
    }
    let after = [
        store.level("tokens", old.token_id).await,
        store.level("users", old.user_id).await,
        store.level("teams", old.team_id).await,
    ];
    assert_eq!(
        after,
        old_levels,
        "{}: the old token's levels untouched",
        store.name()
    );
    let on_old = store
        .int(&format!(
            "SELECT COUNT(*) FROM reservations WHERE token_id = {}",
            old.token_id
        ))
        .await;
    assert_eq!(on_old, 0, "{}", store.name());
    for i in (0..24).filter(|i| i % 3 != 0) {
        store
            .settle(&format!("b{i}"), 0, clock.clone())
            .await
            .unwrap();
    }
    // Through the quota: refused, nothing held, nothing left to the sweep.
    let quota = Quota::with_writer(store.writer.clone(), clock.clone(), "p".into());
    match quota.reserve("q", &old, R).await {
        Err(QuotaError::Rotated(n)) => assert_eq!(n, next.token_id),
        Err(e) => panic!("{}: {e}", store.name()),
        Ok(_) => panic!("{}: reserved on a rotated token", store.name()),
    }
    assert_eq!((quota.live_count(), quota.unsure_count()), (0, 0));
    // A disabled user's token is gone, whatever else it is.
    store
        .exec(&format!(
            "UPDATE users SET disabled = TRUE WHERE id = {}",
            other.user_id
        ))
        .await;
    let before = counts(&store).await;
    for id in ["d1", "d2"] {
        match store.reserve(&other, id, 1, "p", clock.clone()).await {
            Ok(Err(Refusal::TokenGone)) => {}
            o => panic!("{}: {o:?}", store.name()),
        }
    }
    assert_eq!(counts(&store).await, before, "{}", store.name());
    store.assert_settled().await;
}
on_both_stores!(
    a_reservation_on_a_rotated_token_is_refused_and_writes_nothing,
    rotated_token_refused
);

/// The host with the wrong clock keeps charging while the right one does: the level flips
/// between the two periods, and each rollback carries into the host's period only what the
/// period ahead spent since the last carry. Carried whole each time, the same spend was
/// counted again at every flip — 13 R of ledger for 7 R spent after four flips, the right
/// host refused for the rest of its day (s30 diff attack F3).
async fn interleaved_rollbacks(store: Store) {
    let WrongClock {
        owner,
        wrong,
        ahead,
        right,
    } = WrongClock::daily(&store).await;
    for i in 0..4 {
        let w = wrong.charge_one(&owner, &format!("w{i}"), &ahead).await;
        assert!(w.is_ok(), "{}: {w:?}", store.name());
        let r = store.charge_one(&owner, &format!("r{i}"), &right).await;
        assert!(r.is_ok(), "{}: flip {i}: {r:?}", store.name());
    }
    // 8 R really spent (4 in each period): the host's day has 2 R left.
    let (_, remaining, _) = store.level("tokens", owner.token_id).await;
    assert_eq!(remaining, 2 * R, "{}", store.name());
    store.assert_settled().await;
}
on_both_stores!(
    interleaved_rollbacks_from_a_period_ahead_count_its_spend_once,
    interleaved_rollbacks
);

/// The host's period holds a reservation of 8 R still open when the wrong clock's period
/// spends 5: the rollback carries the 5 in full (the level is overdrawn, as by a lowered
/// limit), so when the open request settles at 1 R the day has 4 R left — 1 + 5 spent — not
/// the 7 a carry capped at the room under the limit gave back (s30 final attack F1).
async fn rollback_in_full(store: Store) {
    let w = WrongClock::daily(&store).await;
    let open: Arc<dyn Clock> = w.right.clone();
    let reserved = store.reserve(&w.owner, "open", 8 * R, "p", open.clone());
    reserved.await.unwrap().unwrap();
    for i in 0..5 {
        let r = w
            .wrong
            .charge_one(&w.owner, &format!("w{i}"), &w.ahead)
            .await;
        assert!(r.is_ok(), "{}: {r:?}", store.name());
    }
    let refused = store.charge_one(&w.owner, "r-refused", &w.right).await;
    assert!(
        matches!(refused, Err(Refusal::Insufficient(Level::Token, _))),
        "{}: {refused:?}",
        store.name()
    );
    store.settle("open", R, open).await.unwrap().unwrap();
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(remaining, 4 * R, "{}: 1 R and 5 R spent", store.name());
    w.admits_exactly(&store, 4).await;
    store.assert_settled().await;
}
on_both_stores!(
    a_rollback_with_a_reservation_in_flight_counts_the_period_ahead_once,
    rollback_in_full
);

/// How a request the wrong clock's host admitted in its period ahead ends, after the right
/// host rolled the level back.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Settled at 1 R.
    Settled,
    /// Settled at 1 R in a transaction of its own.
    SettledAlone,
    /// Released (it cost nothing).
    Released,
    /// Settled as an orphan at its full 8 R, then at 1 R by its owner, only stalled (in a
    /// transaction of its own).
    LateOrphan,
}

/// The wrong clock's host reserves 8 R in its period ahead; the right host's request rolls
/// the level back, the 8 R carried into the host's period (day and month) in full. When the
/// request ends for less, the host's period gets the difference back: the carry follows
/// what the period ahead really spent. It kept the whole estimate — the day refused after
/// 1 R of real spend, for the rest of it (s30 last attack F1).
async fn ahead_ends_after_the_rollback(store: Store, end: End) {
    let levels = [
        limit(10 * R, "daily"),
        limit(100 * R, "monthly"),
        unlimited(),
    ];
    let w = WrongClock::new(&store, &levels).await;
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("ahead", 8 * R).await;
    let r = store.charge_one(&w.owner, "r0", &w.right).await;
    assert!(r.is_ok(), "{}: {r:?}", store.name());
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        remaining,
        R,
        "{}: the 8 R open ahead count today",
        store.name()
    );
    let (told, spent) = match end {
        End::Settled => (w.wrong.settle("ahead", R, ahead).await.unwrap(), R),
        End::SettledAlone => {
            let alone = ledger::settle(&w.wrong.db, "ahead", R, w.ahead.now()).await;
            (alone.unwrap(), R)
        }
        End::Released => (w.wrong.release("ahead", ahead).await, 0),
        End::LateOrphan => {
            assert_eq!(
                store
                    .settle_orphans(Orphans::OfOwner("w"), w.right.now())
                    .await,
                1
            );
            let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
            assert_eq!(
                remaining,
                R,
                "{}: an orphan is charged in full",
                store.name()
            );
            // In a transaction of its own (PostgreSQL's single-settlement statement; the
            // others go through the writer's grouped one).
            let late = ledger::settle(&w.wrong.db, "ahead", R, w.ahead.now()).await;
            (late.unwrap(), R)
        }
    };
    let (_, token, _) = store.level("tokens", w.owner.token_id).await;
    let (_, user, _) = store.level("users", w.owner.user_id).await;
    assert_eq!(
        (token, user),
        (9 * R - spent, 99 * R - spent),
        "{} {end:?}: 1 R spent today and {spent} ahead",
        store.name()
    );
    let told = told.expect("settled");
    if !matches!(end, End::LateOrphan) {
        // The balance the client is told is the one the level has now.
        assert_eq!(
            told.token_remaining,
            Some(token),
            "{} {end:?}",
            store.name()
        );
    }
    w.admits_exactly(&store, token / R).await;
    store.assert_settled().await;
}

async fn ahead_settled(store: Store) {
    ahead_ends_after_the_rollback(store, End::Settled).await
}
on_both_stores!(
    a_reservation_ahead_settled_after_the_rollback_refunds_the_hosts_period,
    ahead_settled
);

async fn ahead_settled_alone(store: Store) {
    ahead_ends_after_the_rollback(store, End::SettledAlone).await
}
on_both_stores!(
    a_reservation_ahead_settled_alone_after_the_rollback_refunds_the_hosts_period,
    ahead_settled_alone
);

async fn ahead_released(store: Store) {
    ahead_ends_after_the_rollback(store, End::Released).await
}
on_both_stores!(
    a_reservation_ahead_released_after_the_rollback_refunds_the_hosts_period,
    ahead_released
);

async fn ahead_orphaned(store: Store) {
    ahead_ends_after_the_rollback(store, End::LateOrphan).await
}
on_both_stores!(
    an_orphan_ahead_settled_late_after_the_rollback_refunds_the_hosts_period,
    ahead_orphaned
);

/// Σ of the carries of period `from`'s spend (any period they went into) and `from`'s own
/// spend, for the token: equal once nothing is open.
async fn carried_and_spent(store: &Store, owner: &Owner, from: &str) -> (i64, i64) {
    let reason = format!(
        "the spend of period {from}, carried back: a clock ahead had rolled the level into it"
    );
    let id = owner.token_id;
    (
        store
            .int(&format!(
                "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {id} AND kind = 'adjust' AND reason = '{reason}'"
            ))
            .await,
        store
            .int(&format!(
                "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {id} AND period = '{from}' AND kind IN ('reserve', 'settle', 'adjust')"
            ))
            .await,
    )
}

/// The wrong clock's day spans the host's midnight (ten years ahead less twelve hours): its
/// spend is carried into the host's day before midnight, and after it only what it spent
/// since — carried again in full, the next day paid for the day before and was refused
/// after 2 R of real spend. A reservation carried before midnight and settled after it
/// gives its refund to the day its estimate went into, not to the next (s31 recarry attack
/// F2).
async fn ahead_across_midnight(store: Store) {
    let w = WrongClock::daily(&store).await;
    // 22:00 at the host, 10:00 ten years on: the wrong day runs from the host's noon to
    // the next noon.
    w.right.advance(Duration::hours(12));
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("ahead", 8 * R).await;
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    assert_eq!(store.level("tokens", w.owner.token_id).await.1, R);
    // Past the host's midnight; the wrong clock is still in its day.
    w.right.advance(Duration::hours(2) + Duration::minutes(30));
    w.ahead.advance(Duration::hours(2) + Duration::minutes(30));
    assert!(w.wrong.charge_one(&w.owner, "w1", &w.ahead).await.is_ok());
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        remaining,
        8 * R,
        "{}: today 1 R and the 1 R ahead since midnight",
        store.name()
    );
    w.wrong.settle("ahead", R, ahead).await.unwrap().unwrap();
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        remaining,
        8 * R,
        "{}: the refund is yesterday's",
        store.name()
    );
    let (carried, spent) = carried_and_spent(&store, &w.owner, "2036-12-04").await;
    assert_eq!(carried, spent, "{}", store.name());
    store.assert_settled().await;
}
on_both_stores!(
    a_period_ahead_carried_before_and_after_the_hosts_midnight_counts_once,
    ahead_across_midnight
);

/// `GET /v1/usage` before a rollback the next request will make shows what that rollback
/// sets: of the period ahead, only what no earlier carry took (into the day before). It
/// counted the period ahead in full, 6 R remaining where the next request was given 9 R
/// (s31 stop attack C4).
async fn usage_before_a_second_rollback(store: Store) {
    let w = WrongClock::daily(&store).await;
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("a1", 3 * R).await;
    w.wrong
        .settle("a1", 3 * R, ahead.clone())
        .await
        .unwrap()
        .unwrap();
    // The right host rolls the level back, carrying 3 R into its day.
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    w.reserve_ahead("a2", R).await;
    w.wrong.settle("a2", R, ahead).await.unwrap().unwrap();
    w.right.advance(Duration::days(1));
    let shown = ledger::balance(&store.db, w.owner.token_id, w.right.now())
        .await
        .unwrap();
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        (shown.remaining, remaining),
        (Some(9 * R), 8 * R),
        "{}: the next day carries 1 R of the period ahead",
        store.name()
    );
    store.assert_settled().await;
}
on_both_stores!(
    the_usage_shown_before_a_rollback_is_what_the_rollback_sets,
    usage_before_a_second_rollback
);

/// Three clocks: the host's, one six days ahead, one ten years ahead. The reservation made
/// ten years ahead is carried into the six-days-ahead period, and that period's spend into
/// the host's; when the reservation settles for less, the refund follows its estimate
/// through both (s31 recarry attack F1: it reached neither and the host's day was refused
/// after 3 R of real spend).
async fn ahead_through_a_middle_period(store: Store) {
    let w = WrongClock::daily(&store).await;
    let middle_host = store.another().await;
    let middle = clock_at("2026-12-10T10:00:00Z");
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("ahead", 8 * R).await;
    assert!(middle_host
        .charge_one(&w.owner, "m0", &middle)
        .await
        .is_ok());
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    assert_eq!(store.level("tokens", w.owner.token_id).await.1, 0);
    w.wrong.settle("ahead", R, ahead).await.unwrap().unwrap();
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        remaining,
        7 * R,
        "{}: 1 R in each of the three periods",
        store.name()
    );
    w.admits_exactly(&store, 7).await;
    for from in ["2036-12-04", "2026-12-10"] {
        let (carried, spent) = carried_and_spent(&store, &w.owner, from).await;
        assert_eq!(carried, spent, "{}: {from}", store.name());
    }
    store.assert_settled().await;
}
on_both_stores!(
    a_reservation_two_periods_ahead_settled_after_two_rollbacks_refunds_the_hosts_period,
    ahead_through_a_middle_period
);

/// As `ahead_through_a_middle_period`, with the level back in the middle period (a roll
/// forward) when the reservation settles, and the host's midnight before the next
/// rollback: the refund is credited in the middle period and the carry that took the
/// estimate on out of it is taken back too — it stopped at the credit, the next rollback
/// carried −6 R into the host's new day (7 R over its limit) and the day before kept the
/// whole estimate (s32 last attack F1).
async fn ahead_back_in_the_middle(store: Store) {
    let w = WrongClock::daily(&store).await;
    let middle_host = store.another().await;
    let middle = clock_at("2026-12-10T10:00:00Z");
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("ahead", 8 * R).await;
    assert!(middle_host
        .charge_one(&w.owner, "m0", &middle)
        .await
        .is_ok());
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    assert!(middle_host
        .charge_one(&w.owner, "m1", &middle)
        .await
        .is_ok());
    w.wrong.settle("ahead", R, ahead).await.unwrap().unwrap();
    w.right.advance(Duration::days(1));
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    let name = store.name();
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(remaining, 8 * R, "{name}: m1 carried, r1 spent");
    let id = w.owner.token_id;
    let day_before = store
        .int(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {id} AND period = '2026-12-04' AND kind IN ('reserve', 'settle', 'adjust')"
        ))
        .await;
    assert_eq!(
        day_before,
        3 * R,
        "{name}: m0, r0 and the 1 R the reservation cost"
    );
    for from in ["2036-12-04", "2026-12-10"] {
        let (carried, spent) = carried_and_spent(&store, &w.owner, from).await;
        assert_eq!(carried, spent, "{name}: {from}");
    }
    w.admits_exactly(&store, 8).await;
    store.assert_settled().await;
}
on_both_stores!(
    a_refund_landing_in_a_period_since_carried_out_takes_that_carry_back_too,
    ahead_back_in_the_middle
);

/// Two reservations ahead, settled together after the rollback: each is told a balance
/// some order of the two settlements gives — at the last, the level's (s31 recarry attack
/// F3: in one grouped statement the second was told the balance before either refund).
async fn ahead_settled_together(store: Store) {
    let w = WrongClock::daily(&store).await;
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    for id in ["a1", "a2"] {
        w.reserve_ahead(id, 4 * R).await;
    }
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    let (a, b) = tokio::join!(
        w.wrong.settle("a1", R, ahead.clone()),
        w.wrong.settle("a2", R, ahead.clone())
    );
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(remaining, 7 * R, "{}", store.name());
    let mut told: Vec<i64> = [a, b]
        .into_iter()
        .map(|s| s.unwrap().unwrap().token_remaining.unwrap())
        .collect();
    told.sort();
    assert!(
        told == [4 * R, 7 * R] || told == [7 * R, 7 * R],
        "{}: told {told:?}",
        store.name()
    );
    store.assert_settled().await;
}
on_both_stores!(
    reservations_ahead_settled_together_are_told_a_true_balance,
    ahead_settled_together
);

/// As `ahead_across_midnight`, but the reservation ahead ends while the wrong clock has the
/// level in its period again: its refund goes to that period's balance, and its estimate,
/// carried into the host's day before, is taken back there — the next day's carry is only
/// what the period ahead spent since, never a negative one crediting it with what the day
/// before paid (s31 recarry2 attack F1: 16 R of the host's own spend in a 10 R day).
async fn ahead_ends_in_its_period_after_midnight(store: Store) {
    // The user's level has no limit but rolls daily: its ledger is its spend report and
    // what a limit set later starts from (s31 final attack F1).
    let unlimited_daily = Budget {
        limit: None,
        reset: "daily",
    };
    let levels = [limit(10 * R, "daily"), unlimited_daily, unlimited()];
    let w = WrongClock::new(&store, &levels).await;
    w.right.advance(Duration::hours(12));
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("ahead", 8 * R).await;
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    w.right.advance(Duration::hours(2) + Duration::minutes(30));
    w.ahead.advance(Duration::hours(2) + Duration::minutes(30));
    assert!(w.wrong.charge_one(&w.owner, "w1", &w.ahead).await.is_ok());
    w.wrong.settle("ahead", R, ahead).await.unwrap().unwrap();
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(
        remaining,
        8 * R,
        "{}: 1 R today and the 1 R ahead since midnight",
        store.name()
    );
    for (col, id) in [("token_id", w.owner.token_id), ("user_id", w.owner.user_id)] {
        let negative = store
            .int(&format!(
                "SELECT COUNT(*) FROM (SELECT period, reason FROM ledger WHERE {col} = {id} AND kind = 'adjust'
                 AND reason LIKE 'the spend of period %' GROUP BY period, reason HAVING SUM(amount_micros) < 0) n"
            ))
            .await;
        assert_eq!(
            negative,
            0,
            "{}: a {col} period credited by a carry",
            store.name()
        );
    }
    let (carried, spent) = carried_and_spent(&store, &w.owner, "2036-12-04").await;
    assert_eq!(carried, spent, "{}", store.name());
    w.admits_exactly(&store, 8).await;
    store.assert_settled().await;
}
on_both_stores!(
    a_refund_made_in_the_period_ahead_after_midnight_credits_the_next_day_nothing,
    ahead_ends_in_its_period_after_midnight
);

/// A client's retry with the same estimate, after its first try was released while the
/// wrong clock had the level in its period again: the release takes the first estimate's
/// carry back, so the next rollback carries the retry's, which its refund then follows — a
/// rollback of exactly 0 wrote no carry, and the retry's refund was lost to the host's day
/// (s31 recarry2 attack F2).
async fn retry_ahead(store: Store) {
    let levels = [limit(20 * R, "daily"), unlimited(), unlimited()];
    let w = WrongClock::new(&store, &levels).await;
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("a1", 8 * R).await;
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    w.reserve_ahead("a2", 8 * R).await;
    assert!(w.wrong.release("a1", ahead.clone()).await.is_some());
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    w.wrong.settle("a2", R, ahead).await.unwrap().unwrap();
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    assert_eq!(remaining, 17 * R, "{}: 2 R today, 1 R ahead", store.name());
    let (carried, spent) = carried_and_spent(&store, &w.owner, "2036-12-04").await;
    assert_eq!(carried, spent, "{}", store.name());
    w.admits_exactly(&store, 17).await;
    store.assert_settled().await;
}
on_both_stores!(
    a_retry_ahead_after_a_release_in_its_period_is_refunded_to_the_hosts_day,
    retry_ahead
);

/// As `retry_ahead`, with the host's midnight between the two rollbacks: the retry's
/// refund follows the carry that took its estimate (into the new day), not the first row
/// of the carry's reason after it — the release's own refund row (into the day before), so
/// the new day kept the retry's whole estimate for a request of 1 R and the day before
/// went below nothing (s32 stop attack F1, scenario A). With `settled_first` the retry
/// settles while the level is back in the wrong period (scenario B: its refund wrote a
/// stray row into the day before, and the next carry took its whole estimate).
async fn retry_ahead_across_midnight(store: Store, settled_first: bool) {
    let levels = [limit(20 * R, "daily"), unlimited(), unlimited()];
    let w = WrongClock::new(&store, &levels).await;
    let ahead: Arc<dyn Clock> = w.ahead.clone();
    w.reserve_ahead("a1", 8 * R).await;
    assert!(store.charge_one(&w.owner, "r0", &w.right).await.is_ok());
    w.reserve_ahead("a2", 8 * R).await;
    assert!(w.wrong.release("a1", ahead.clone()).await.is_some());
    if settled_first {
        w.wrong
            .settle("a2", R, ahead.clone())
            .await
            .unwrap()
            .unwrap();
    }
    w.right.advance(Duration::days(1));
    assert!(store.charge_one(&w.owner, "r1", &w.right).await.is_ok());
    if !settled_first {
        w.wrong.settle("a2", R, ahead).await.unwrap().unwrap();
    }
    let (_, remaining, _) = store.level("tokens", w.owner.token_id).await;
    let name = store.name();
    assert_eq!(remaining, 18 * R, "{name}: 1 R today, 1 R of the retry");
    let id = w.owner.token_id;
    let day_before = store
        .int(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {id} AND period = '2026-12-04' AND kind IN ('reserve', 'settle', 'adjust')"
        ))
        .await;
    assert_eq!(day_before, R, "{name}: the day before spent its 1 R");
    let (carried, spent) = carried_and_spent(&store, &w.owner, "2036-12-04").await;
    assert_eq!(carried, spent, "{name}");
    w.admits_exactly(&store, 18).await;
    store.assert_settled().await;
}

async fn retry_ahead_settled_after_midnight(store: Store) {
    retry_ahead_across_midnight(store, false).await
}
on_both_stores!(
    a_refund_after_midnight_follows_its_own_carry_not_an_earlier_refund,
    retry_ahead_settled_after_midnight
);

async fn retry_ahead_settled_before_midnight(store: Store) {
    retry_ahead_across_midnight(store, true).await
}
on_both_stores!(
    a_refund_in_the_wrong_period_leaves_no_row_in_the_day_before,
    retry_ahead_settled_before_midnight
);

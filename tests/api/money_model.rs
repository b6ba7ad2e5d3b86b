//! The money path against a model (CHECKS Q16): random schedules of reserve, settle,
//! cancel (the caller leaves while its reservation waits), abandon (a handler dropped
//! unsettled), clock steps forwards and backwards around period boundaries, a crash (the
//! other process settles the dead one's reservations as orphans), a stall (the same, but
//! the stalled process settles later), expired leases and the owner's sweep — across two
//! `Quota`s, each on its own connection pool and clock, on one database file. After every
//! step, for every level (token, user, team) of the case:
//!   - `limit − remaining == Σ ledger(reserve, settle, adjust)` of its stored period;
//!   - no period's spend exceeds the limit, and nothing is overdrawn (`remaining ≥ 0`);
//!   - `reserved == Σ` of its open reservations;
//!   - at most one period reset per level and period;
//!   - every request's ledger total equals what the model says it cost.
//!
//! At the end every holder settles: nothing stays reserved.
//!
//! Replay a failure with the seed it prints: `SLUICE_MONEY_SEED=<hex> cargo test --test api
//! money_model`; `SLUICE_MONEY_CASES` sets the number of cases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use sluice::clock::{Clock, ManualClock};
use sluice::ops::housekeeping;
use sluice::quota::reservation::{Held, Quota};
use sluice::quota::QuotaError;
use sluice::store::ledger::{self, Orphans, Owner};
use sluice::store::{processes, Db};

use crate::helpers::{budget_owner, Budget};

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        inst: usize,
        amount: i64,
    },
    /// The caller goes away after `yields` polls of its reservation.
    Cancel {
        inst: usize,
        amount: i64,
        yields: u8,
    },
    /// `actual` in per mille of the reservation (above 1000: the estimate was too low).
    Settle {
        pick: usize,
        permille: i64,
    },
    /// The handler is dropped unsettled, with this cost-if-dropped (per mille).
    Abandon {
        pick: usize,
        permille: i64,
    },
    /// The instance's clock moves (backwards too).
    Step {
        inst: usize,
        millis: i64,
    },
    /// The instance dies: its holders never settle; the other settles its orphans.
    Crash {
        inst: usize,
    },
    /// The instance stalls: the other settles its orphans; its holders settle later.
    Stall {
        inst: usize,
    },
    /// The instance beats at its clock; the other settles leases older than that beat.
    Expire {
        inst: usize,
    },
    /// An admin changes a level's reset rule (0 token, 1 user, 2 team).
    Rule {
        level: usize,
        reset: &'static str,
    },
    /// The instance's own sweep (must never release what a live request holds).
    Sweep {
        inst: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let inst = 0usize..2;
    prop_oneof![
        4 => (inst.clone(), 1i64..400).prop_map(|(inst, amount)| Op::Reserve { inst, amount }),
        1 => (inst.clone(), 1i64..400, 0u8..6).prop_map(|(inst, amount, yields)| Op::Cancel { inst, amount, yields }),
        3 => (0usize..64, 0i64..1500).prop_map(|(pick, permille)| Op::Settle { pick, permille }),
        1 => (0usize..64, 0i64..1200).prop_map(|(pick, permille)| Op::Abandon { pick, permille }),
        2 => (inst.clone(), prop_oneof![-3_000i64..3_000, 0i64..90_000_000]).prop_map(|(inst, millis)| Op::Step { inst, millis }),
        1 => inst.clone().prop_map(|inst| Op::Crash { inst }),
        1 => inst.clone().prop_map(|inst| Op::Stall { inst }),
        1 => inst.clone().prop_map(|inst| Op::Expire { inst }),
        1 => (0usize..3, reset()).prop_map(|(level, reset)| Op::Rule { level, reset }),
        1 => inst.prop_map(|inst| Op::Sweep { inst }),
    ]
}

fn reset() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("daily"),
        Just("weekly"),
        Just("monthly"),
        Just("never")
    ]
}

/// A level's budget (also `pg_money_model`'s).
pub(crate) fn budget() -> impl Strategy<Value = Budget> {
    (
        prop_oneof![1 => Just(None), 3 => (300i64..2_000).prop_map(Some)],
        prop_oneof![
            Just("daily"),
            Just("weekly"),
            Just("monthly"),
            Just("never")
        ],
    )
        .prop_map(|(limit, reset)| Budget { limit, reset })
}

#[derive(Debug, Clone)]
struct Case {
    levels: [Budget; 3],
    /// Both clocks start this many ms before a month's end, the second `skew` ms behind.
    before_boundary: i64,
    skew: i64,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        [budget(), budget(), budget()],
        0i64..5_000,
        0i64..2_000,
        proptest::collection::vec(op(), 1..40),
    )
        .prop_map(|(levels, before_boundary, skew, ops)| Case {
            levels,
            before_boundary,
            skew,
            ops,
        })
}

/// The database file and the two processes' connection pools, shared by every case (each
/// case has its own team, user and token).
struct Env {
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    dbs: [Db; 2],
}

#[test]
fn the_money_invariants_hold_in_every_schedule() {
    let cases: u32 = std::env::var("SLUICE_MONEY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let seed = seed("SLUICE_MONEY_SEED", rand::random);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("money.db");
    let dbs = rt.block_on(async {
        let a = Db::open(&path, false).await.unwrap();
        let b = Db::open(&path, false).await.unwrap();
        [a, b]
    });
    let env = Env { rt, _dir: dir, dbs };
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&case(), |c| env.rt.block_on(run_case(&env, c)));
    if let Err(e) = result {
        panic!(
            "money invariant broken — replay with SLUICE_MONEY_SEED={}\n{e}",
            hex::encode(seed)
        );
    }
}

/// The seed in `var` (64 hex digits), else `otherwise()` (also `pg_money_model`'s).
pub(crate) fn seed(var: &str, otherwise: impl FnOnce() -> [u8; 32]) -> [u8; 32] {
    match std::env::var(var) {
        Ok(hex_seed) => hex::decode(hex_seed.trim())
            .ok()
            .and_then(|v| v.try_into().ok())
            .unwrap_or_else(|| panic!("{var}: 64 hex digits")),
        Err(_) => otherwise(),
    }
}

/// One open reservation of the model.
struct Live {
    held: Held,
    inst: usize,
    id: String,
    amount: i64,
}

struct World {
    owner: Owner,
    clocks: [Arc<ManualClock>; 2],
    quotas: [Arc<Quota>; 2],
    live: Vec<Live>,
    /// Holders of crashed instances: they never settle (until the case is over).
    crashed: Vec<Held>,
    /// Request id → what the ledger must say it cost (reserve + settle + absorbed).
    expected: HashMap<String, i64>,
    next_request: u64,
    /// Periods may be entered more than once (a rule changed, or the two clocks were a
    /// day or more apart): a second reset row for one period is then expected — it starts
    /// from that period's ledger sum, which the other checks hold it to.
    reentry: bool,
    /// The instances' clocks were once further apart than a host's clock may be right
    /// (`period::MAX_CLOCK_SKEW`): the one behind rolls a level back from the other's
    /// period, carrying its spend in full — the host's period may then be overdrawn and
    /// its ledger past the limit (DESIGN "Periods only move forward").
    skewed: bool,
}

async fn run_case(env: &Env, c: Case) -> Result<(), TestCaseError> {
    let owner = budget_owner(&env.dbs[0], &c.levels).await;
    let end_of_month =
        Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 59).unwrap() + chrono::Duration::seconds(1);
    let start = end_of_month - chrono::Duration::milliseconds(c.before_boundary);
    let clocks = [
        Arc::new(ManualClock::new(start)),
        Arc::new(ManualClock::new(
            start - chrono::Duration::milliseconds(c.skew),
        )),
    ];
    let quotas = [0, 1].map(|i| {
        Quota::new(
            &env.dbs[i],
            clocks[i].clone() as Arc<dyn Clock>,
            format!("p{}-{i}", owner.token_id),
        )
    });
    let mut w = World {
        owner,
        clocks,
        quotas,
        live: Vec::new(),
        crashed: Vec::new(),
        expected: HashMap::new(),
        next_request: 0,
        reentry: false,
        skewed: false,
    };
    for (step, op) in c.ops.iter().enumerate() {
        apply(env, &mut w, op).await;
        quiesce(&w).await;
        check(env, &w, false)
            .await
            .map_err(|e| TestCaseError::fail(format!("after step {step} ({op:?}): {e}")))?;
    }
    for l in std::mem::take(&mut w.live) {
        let actual = l.amount / 2;
        w.expected.insert(l.id.clone(), actual);
        l.held.settle(actual).await;
    }
    quiesce(&w).await;
    let end = check(env, &w, true).await;
    drop(std::mem::take(&mut w.crashed));
    end.map_err(|e| TestCaseError::fail(format!("after every holder settled: {e}")))
}

async fn apply(env: &Env, w: &mut World, op: &Op) {
    match *op {
        Op::Reserve { inst, amount } => {
            let id = w.request_id();
            match w.quotas[inst].reserve(&id, &w.owner, amount).await {
                Ok(held) => {
                    w.expected.insert(id.clone(), amount);
                    w.live.push(Live {
                        held,
                        inst,
                        id,
                        amount,
                    });
                }
                Err(QuotaError::Insufficient { .. }) => {}
                Err(e) => panic!("reserve failed: {e}"),
            }
        }
        Op::Cancel {
            inst,
            amount,
            yields,
        } => {
            let id = w.request_id();
            let (q, o, rid) = (w.quotas[inst].clone(), w.owner.clone(), id.clone());
            let task = tokio::spawn(async move { q.reserve(&rid, &o, amount).await });
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            task.abort();
            match task.await {
                Ok(Ok(held)) => {
                    // It finished before the caller left: an ordinary holder.
                    w.expected.insert(id.clone(), amount);
                    w.live.push(Live {
                        held,
                        inst,
                        id,
                        amount,
                    });
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    w.expected.insert(id, 0);
                }
            }
        }
        Op::Settle { pick, permille } => {
            if w.live.is_empty() {
                return;
            }
            let l = w.live.swap_remove(pick % w.live.len());
            let actual = l.amount * permille / 1000;
            let s = l.held.settle(actual).await;
            assert_eq!(s.charged + s.absorbed, actual);
            w.expected.insert(l.id, actual);
        }
        Op::Abandon { pick, permille } => {
            if w.live.is_empty() {
                return;
            }
            let mut l = w.live.swap_remove(pick % w.live.len());
            let cost = l.amount * permille / 1000;
            l.held.set_cost_if_dropped(cost);
            w.expected.insert(l.id, cost);
        }
        Op::Step { inst, millis } => {
            w.clocks[inst].advance(chrono::Duration::milliseconds(millis));
            let apart = w.clocks[0].now() - w.clocks[1].now();
            w.reentry |= apart.num_hours().abs() >= 24;
            w.skewed |= apart.abs() > sluice::quota::period::MAX_CLOCK_SKEW;
        }
        Op::Crash { inst } => {
            let (dead, alive): (Vec<Live>, Vec<Live>) = std::mem::take(&mut w.live)
                .into_iter()
                .partition(|l| l.inst == inst);
            w.live = alive;
            for l in dead {
                // Settled at the reserved amount by the survivor.
                w.expected.insert(l.id, l.amount);
                w.crashed.push(l.held);
            }
            w.orphans(env, inst).await;
        }
        Op::Stall { inst } => w.orphans(env, inst).await,
        Op::Expire { inst } => {
            // The instance beats at its clock; leases older than its beat expire.
            let now = w.clocks[inst].now();
            let me = processes::Me::new(w.quotas[inst].process_id().to_string(), "model".into());
            processes::heartbeat(&env.dbs[inst], &me, now)
                .await
                .unwrap();
            ledger::settle_orphans(
                &env.dbs[1 - inst],
                Orphans::LeaseExpired,
                w.clocks[1 - inst].now(),
            )
            .await
            .unwrap();
        }
        Op::Rule { level, reset } => {
            let (table, id) = [
                ("tokens", w.owner.token_id),
                ("users", w.owner.user_id),
                ("teams", w.owner.team_id),
            ][level];
            sqlx::query(&format!("UPDATE {table} SET reset = ? WHERE id = ?"))
                .bind(reset)
                .bind(id)
                .execute(&env.dbs[0].sqlite().write)
                .await
                .unwrap();
            w.reentry = true;
        }
        Op::Sweep { inst } => {
            let now = w.clocks[inst].now();
            housekeeping::sweep_own(&w.quotas[inst], &env.dbs[inst], now)
                .await
                .unwrap();
        }
    }
}

impl World {
    fn request_id(&mut self) -> String {
        self.next_request += 1;
        format!("req-{}-{}", self.owner.token_id, self.next_request)
    }

    /// The other instance settles `inst`'s reservations as orphans.
    async fn orphans(&self, env: &Env, inst: usize) {
        let other = 1 - inst;
        let pid = self.quotas[inst].process_id();
        ledger::settle_orphans(
            &env.dbs[other],
            Orphans::OfOwner(pid),
            self.clocks[other].now(),
        )
        .await
        .unwrap();
    }
}

/// Waits until every background settlement and release has landed: each instance's live
/// set is exactly its model holders (crashed holders stay in theirs).
async fn quiesce(w: &World) {
    for _ in 0..500 {
        let want = |i: usize| w.live.iter().filter(|l| l.inst == i).count();
        let crashed = w.crashed.len();
        let have = w.quotas[0].live_count() + w.quotas[1].live_count();
        if w.quotas[0].live_count() >= want(0)
            && w.quotas[1].live_count() >= want(1)
            && have == want(0) + want(1) + crashed
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("background settlements never landed");
}

/// The case's invariants, read from the database.
async fn check(env: &Env, w: &World, all_settled: bool) -> Result<(), String> {
    let db = &env.dbs[0].sqlite().read;
    let o = &w.owner;
    for (table, id, id_col, period_col) in [
        ("tokens", o.token_id, "token_id", "period"),
        ("users", o.user_id, "user_id", "user_period"),
        ("teams", o.team_id, "team_id", "team_period"),
    ] {
        let (limit, remaining, reserved, period): (Option<i64>, Option<i64>, i64, String) = sqlx::query_as(&format!(
            "SELECT limit_micros, remaining_micros, reserved_micros, period FROM {table} WHERE id = ?"
        ))
        .bind(id)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())?;
        let open: i64 = sqlx::query_scalar(&format!(
            "SELECT COALESCE(SUM(amount_micros), 0) FROM reservations WHERE {id_col} = ?"
        ))
        .bind(id)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())?;
        if reserved != open {
            return Err(format!(
                "{table}: reserved {reserved} ≠ open reservations {open}"
            ));
        }
        if all_settled && reserved != 0 {
            return Err(format!(
                "{table}: {reserved} still reserved after every holder settled"
            ));
        }
        let Some(limit) = limit else { continue };
        let by_period: Vec<(String, i64)> = sqlx::query_as(&format!(
            "SELECT {period_col}, SUM(amount_micros) FROM ledger WHERE {id_col} = ? AND kind IN ('reserve', 'settle', 'adjust') GROUP BY {period_col}"
        ))
        .bind(id)
        .fetch_all(db)
        .await
        .map_err(|e| e.to_string())?;
        let current = by_period
            .iter()
            .find(|(p, _)| *p == period)
            .map_or(0, |(_, s)| *s);
        let remaining = remaining.unwrap_or(limit);
        if !period.is_empty() && limit - remaining != current {
            return Err(format!(
                "{table} (period {period}): limit {limit} − remaining {remaining} ≠ ledger {current}; by period {by_period:?}"
            ));
        }
        if remaining < 0 && !w.skewed {
            return Err(format!("{table}: overdrawn, remaining {remaining}"));
        }
        if let Some((p, spent)) = by_period.iter().find(|(_, s)| *s > limit && !w.skewed) {
            return Err(format!(
                "{table}: period {p} spent {spent} over the limit {limit}"
            ));
        }
        let resets: Vec<(String, i64)> = sqlx::query_as(
            "SELECT after, COUNT(*) FROM audit_log WHERE action = 'budget.period_reset' AND target = ? GROUP BY after HAVING COUNT(*) > 1",
        )
        .bind(format!("{}:{id}", &table[..table.len() - 1]))
        .fetch_all(db)
        .await
        .map_err(|e| e.to_string())?;
        if !resets.is_empty() && !w.reentry {
            return Err(format!(
                "{table}: a period was reset more than once: {resets:?}"
            ));
        }
    }
    let totals: Vec<(String, i64)> = sqlx::query_as(
        "SELECT request_id, SUM(amount_micros) FROM ledger WHERE token_id = ? AND kind IN ('reserve', 'settle', 'absorbed') GROUP BY request_id",
    )
    .bind(o.token_id)
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let totals: HashMap<String, i64> = totals.into_iter().collect();
    for (id, want) in &w.expected {
        let got = totals.get(id).copied().unwrap_or(0);
        if got != *want {
            return Err(format!("request {id}: ledger says {got}, the model {want}"));
        }
    }
    Ok(())
}

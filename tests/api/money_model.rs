//! The money path against a model (CHECKS Q16): random schedules of reserve, settle,
//! cancel (the caller leaves while its reservation waits), abandon (a handler dropped
//! unsettled), clock steps forwards and backwards around period boundaries and jumps of
//! days to weeks (past `MAX_CLOCK_SKEW`: rollbacks), a crash (the other process settles the
//! dead one's reservations as orphans), a stall (the same, but the stalled process settles
//! later), expired leases and the owner's sweep — across two `Quota`s, each on its own
//! connection pool and clock, on one database file. After every step, for every level
//! (token, user, team) of the case:
//!   - `limit − remaining == Σ ledger(reserve, settle, adjust)` of its stored period;
//!   - no period's spend without the carries a rollback brought into it exceeds the limit;
//!   - no period's spend exceeds the limit, and nothing is overdrawn (`remaining ≥ 0`),
//!     except a period carried into, of a level with a `budget.period_rollback` row (a
//!     rollback carries the period ahead's spend in full);
//!   - `reserved == Σ` of its open reservations;
//!   - at most one period reset per level and period, unless the level was rolled back or
//!     its rule changed;
//!   - every request's ledger total equals what the model says it cost.
//!
//! At the end every holder settles: nothing stays reserved, and each carry into a level's
//! current period equals the spend of the period it names, when the level last left that
//! period by a rollback into this one (`carried_in_full`).
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
        2 => (inst.clone(), step()).prop_map(|(inst, millis)| Op::Step { inst, millis }),
        1 => inst.clone().prop_map(|inst| Op::Crash { inst }),
        1 => inst.clone().prop_map(|inst| Op::Stall { inst }),
        1 => inst.clone().prop_map(|inst| Op::Expire { inst }),
        1 => (0usize..3, reset()).prop_map(|(level, reset)| Op::Rule { level, reset }),
        1 => inst.prop_map(|inst| Op::Sweep { inst }),
    ]
}

/// A clock step in ms: a jitter, up to a day forward (across a boundary), or a jump of days
/// to weeks either way — a clock set wrong, or set right again: past `MAX_CLOCK_SKEW` the
/// instance behind rolls a level back from the other's period.
fn step() -> impl Strategy<Value = i64> {
    const DAY: i64 = 86_400_000;
    prop_oneof![
        2 => -3_000i64..3_000,
        2 => 0i64..90_000_000,
        1 => prop_oneof![2 * DAY..40 * DAY, -40 * DAY..-2 * DAY],
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
    /// The level's reset rule was changed (0 token, 1 user, 2 team): it may enter a period
    /// of its first rule again, a second reset row for that period.
    rule_changed: [bool; 3],
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
        rule_changed: [false; 3],
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
            w.rule_changed[level] = true;
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

/// The reason of a carry into the host's period names the period ahead it carries from
/// after this (`ledger::carry_back_reason`).
const CARRY: &str = "the spend of period ";

/// The period a carry's reason names.
fn carried_period(reason: &str) -> Option<&str> {
    Some(reason.strip_prefix(CARRY)?.split_once(',')?.0)
}

/// The case's invariants, read from the database.
async fn check(env: &Env, w: &World, all_settled: bool) -> Result<(), String> {
    let db = &env.dbs[0].sqlite().read;
    let o = &w.owner;
    for (level, (table, id, id_col, period_col)) in [
        ("tokens", o.token_id, "token_id", "period"),
        ("users", o.user_id, "user_id", "user_period"),
        ("teams", o.team_id, "team_id", "team_period"),
    ]
    .into_iter()
    .enumerate()
    {
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
        // The level's periods in the order it entered them: every move writes its audit
        // row (`ledger::rollover_entry`), a rollback's naming the period it left.
        let moves: Vec<(String, Option<String>, String)> = sqlx::query_as(
            "SELECT action, before, after FROM audit_log WHERE action IN ('budget.period_reset', 'budget.period_rollback') AND target = ? ORDER BY id",
        )
        .bind(format!("{}:{id}", &table[..table.len() - 1]))
        .fetch_all(db)
        .await
        .map_err(|e| e.to_string())?;
        let rolled_back = moves.iter().any(|(a, ..)| a == "budget.period_rollback");
        // A period is entered by a second reset only after the level left it backwards (a
        // rollback) or for another rule's period and back: it then starts from that
        // period's ledger sum, which the other checks hold it to.
        if !rolled_back && !w.rule_changed[level] {
            let mut reset = std::collections::HashSet::new();
            if let Some((_, _, p)) = moves
                .iter()
                .find(|(a, _, p)| a == "budget.period_reset" && !reset.insert(p))
            {
                return Err(format!(
                    "{table}: period {p} was reset more than once: {moves:?}"
                ));
            }
        }
        let Some(limit) = limit else { continue };
        // Per period: its ledger sum, the part not carried back into it, and its carries.
        let by_period: Vec<(String, i64, i64, i64)> = sqlx::query_as(&format!(
            "SELECT {period_col}, SUM(amount_micros),
                    SUM(CASE WHEN kind = 'adjust' AND reason LIKE '{CARRY}%' THEN 0 ELSE amount_micros END),
                    COUNT(CASE WHEN kind = 'adjust' AND reason LIKE '{CARRY}%' THEN 1 END)
             FROM ledger WHERE {id_col} = ? AND kind IN ('reserve', 'settle', 'adjust') GROUP BY {period_col}"
        ))
        .bind(id)
        .fetch_all(db)
        .await
        .map_err(|e| e.to_string())?;
        let current = by_period
            .iter()
            .find(|(p, ..)| *p == period)
            .map_or(0, |(_, s, ..)| *s);
        let remaining = remaining.unwrap_or(limit);
        if !period.is_empty() && limit - remaining != current {
            return Err(format!(
                "{table} (period {period}): limit {limit} − remaining {remaining} ≠ ledger {current}; by period {by_period:?}"
            ));
        }
        for (p, spent, own, carries) in &by_period {
            // Remaining is the limit less the period's own spend and its carries, and a
            // reservation needs remaining ≥ R: its own spend stays within the limit, carries
            // or not.
            if *own > limit {
                return Err(format!(
                    "{table}: period {p} spent {own} of its own, over the limit {limit}"
                ));
            }
            // A rollback carries the period ahead's spend in full: the host's period may
            // then be past its limit, and (its `limit − remaining == Σ`) overdrawn — only a
            // period carried into, of a level rolled back.
            if *spent > limit && !(rolled_back && *carries > 0) {
                return Err(format!(
                    "{table}: period {p} spent {spent} over the limit {limit}; by period {by_period:?}"
                ));
            }
        }
        if remaining < 0 && !by_period.iter().any(|(p, _, _, c)| *p == period && *c > 0) {
            return Err(format!("{table}: overdrawn, remaining {remaining}"));
        }
        if all_settled && !period.is_empty() {
            carried_in_full(db, table, id, id_col, period_col, &period, &moves).await?;
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

/// Once every holder has settled, the carries of a period's spend — into whatever periods
/// they went — sum to what it spent, when the level last left it by a rollback: a carry
/// is that period's ledger sum less what earlier carries brought (`ledger::carry_back`),
/// and a refund there after the rollback follows its estimate back (s30 last attack F1,
/// s31 recarry attack F1, F2). A period the level last left otherwise (rolled over into a
/// later one) is not compared: what it spent since its last carry was never carried (a
/// level flipped into `Q`, rolled over into `Q2`, then rolled back carries `Q2`'s spend,
/// not `Q`'s). And a carry into the current period `p` from a period comes with a rollback
/// from there into `p`.
async fn carried_in_full(
    db: &sqlx::SqlitePool,
    table: &str,
    id: i64,
    id_col: &str,
    period_col: &str,
    p: &str,
    moves: &[(String, Option<String>, String)],
) -> Result<(), String> {
    let rollback = "budget.period_rollback";
    // Which move last left each period, and where to: a rollback names the period it left,
    // a reset leaves the one the move before entered.
    let mut left: HashMap<&str, (&str, &str)> = HashMap::new();
    let mut at: Option<&str> = None;
    for (action, before, after) in moves {
        if let Some(from) = before.as_deref().or(at) {
            left.insert(from, (action.as_str(), after.as_str()));
        }
        at = Some(after.as_str());
    }
    let rows: Vec<(String, String, i64)> = sqlx::query_as(&format!(
        "SELECT {period_col}, reason, SUM(amount_micros) FROM ledger WHERE {id_col} = ?
         AND kind = 'adjust' AND reason LIKE '{CARRY}%' GROUP BY {period_col}, reason"
    ))
    .bind(id)
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut carried: HashMap<&str, i64> = HashMap::new();
    for (into, reason, sum) in &rows {
        let q = carried_period(reason).ok_or_else(|| format!("{table}: carry {reason:?}"))?;
        *carried.entry(q).or_default() += sum;
        let ever_back = moves
            .iter()
            .any(|(a, b, to)| a == rollback && b.as_deref() == Some(q) && to == into);
        if into == p && !ever_back {
            return Err(format!(
                "{table}: period {p} holds a carry from {q}, never rolled back from there: {moves:?}"
            ));
        }
    }
    // (A period the level has come back into since spends there again, uncarried.)
    let left_by_rollback = left
        .iter()
        .filter(|(q, (action, _))| *action == rollback && **q != p);
    for (q, _) in left_by_rollback {
        let spent: i64 = sqlx::query_scalar(&format!(
            "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE {id_col} = ? AND {period_col} = ?
             AND kind IN ('reserve', 'settle', 'adjust')"
        ))
        .bind(id)
        .bind(q)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())?;
        let c = carried.get(q).copied().unwrap_or(0);
        if c != spent {
            return Err(format!(
                "{table}: the carries of {q}'s spend sum to {c}, it spent {spent}; moves {moves:?}"
            ));
        }
    }
    Ok(())
}

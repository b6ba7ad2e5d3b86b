//! The PostgreSQL money path against a model: random interleavings of reserve, settle,
//! release, admin edits (adjust, set limit, top up), clock steps across period boundaries
//! (rollovers), orphan sweeps and late settlements by a stalled owner — across two
//! processes (two pools, two group-commit writers) on one database. After every step:
//!   - the ledger invariant (`pg::ledger::invariant_violations`) for every level;
//!   - each level's `reserved` equals the sum of its open reservations;
//!   - every request's ledger total (reserve, settle) is what the model says it cost.
//!
//! At the end everything is settled: nothing stays reserved. A fixed seed by default (the
//! same schedules every run); `SLUICE_PG_MONEY_SEED=<64 hex>` replays another, and
//! `SLUICE_PG_MONEY_CASES` sets the number of cases.

use std::sync::Arc;

use chrono::Duration;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::{Orphans, LEVELS};

use crate::helpers::Budget;
use crate::money_model::{budget, seed};
use crate::pg_money::{at, Store};

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        inst: usize,
        amount: i64,
    },
    /// `actual` in per mille of the reservation (above 1000: the estimate was too low).
    Settle {
        inst: usize,
        pick: usize,
        permille: i64,
    },
    Release {
        inst: usize,
        pick: usize,
    },
    Adjust {
        amount: i64,
    },
    SetLimit {
        level: usize,
        limit: i64,
    },
    TopUp {
        level: usize,
        amount: i64,
    },
    Step {
        millis: i64,
    },
    /// The instance looks dead: the other settles its reservations as orphans.
    Orphan {
        inst: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let inst = 0usize..2;
    prop_oneof![
        5 => (inst.clone(), 1i64..400).prop_map(|(inst, amount)| Op::Reserve { inst, amount }),
        4 => (inst.clone(), 0usize..64, 0i64..1500).prop_map(|(inst, pick, permille)| Op::Settle { inst, pick, permille }),
        1 => (inst.clone(), 0usize..64).prop_map(|(inst, pick)| Op::Release { inst, pick }),
        1 => (-300i64..300).prop_map(|amount| Op::Adjust { amount }),
        1 => (0usize..3, 0i64..2_000).prop_map(|(level, limit)| Op::SetLimit { level, limit }),
        1 => (0usize..3, 1i64..500).prop_map(|(level, amount)| Op::TopUp { level, amount }),
        2 => prop_oneof![-3_000i64..3_000, 0i64..90_000_000].prop_map(|millis| Op::Step { millis }),
        1 => inst.prop_map(|inst| Op::Orphan { inst }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    levels: [Budget; 3],
    /// The clock starts this many ms before a month's end.
    before_boundary: i64,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        [budget(), budget(), budget()],
        0i64..5_000,
        proptest::collection::vec(op(), 1..40),
    )
        .prop_map(|(levels, before_boundary, ops)| Case {
            levels,
            before_boundary,
            ops,
        })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Open,
    Orphaned,
    Done,
}

/// A request of the model: its reservation, its state, and what it costs so far.
struct Req {
    id: String,
    inst: usize,
    amount: i64,
    state: State,
    cost: i64,
}

struct Env {
    rt: tokio::runtime::Runtime,
    stores: [Store; 2],
}

const PROCS: [&str; 2] = ["host-a", "host-b"];
const TABLES: [&str; 3] = ["tokens", "users", "teams"];

async fn run_case(env: &Env, c: Case) -> Result<(), TestCaseError> {
    let [a, b] = &env.stores;
    let stores = [a, b];
    let owner = a.owner(&c.levels).await;
    let ids = [owner.token_id, owner.user_id, owner.team_id];
    let t0 = at("2026-12-31T23:59:59.999Z") - Duration::milliseconds(c.before_boundary);
    let manual = Arc::new(ManualClock::new(t0));
    let clock: Arc<dyn Clock> = manual.clone();
    let mut reqs: Vec<Req> = Vec::new();
    let mut next = 0;
    for op in &c.ops {
        match *op {
            Op::Reserve { inst, amount } => {
                next += 1;
                let id = format!("{}-{next}", owner.token_id);
                if stores[inst]
                    .reserve(&owner, &id, amount, PROCS[inst], clock.clone())
                    .await
                    .map_err(|e| TestCaseError::fail(format!("reserve: {e}")))?
                    .is_ok()
                {
                    reqs.push(Req {
                        id,
                        inst,
                        amount,
                        state: State::Open,
                        cost: amount,
                    });
                }
            }
            Op::Settle {
                inst,
                pick,
                permille,
            } => {
                let Some(r) = pick_req(&mut reqs, pick, |s| s != State::Done) else {
                    continue;
                };
                let actual = r.amount * permille / 1000;
                // The owner settles (a stalled one after its orphan); `inst` is ignored for an
                // open one only in that either process may settle by request id.
                let s = stores[if r.state == State::Orphaned {
                    r.inst
                } else {
                    inst
                }]
                .settle(&r.id, actual, clock.clone())
                .await
                .map_err(|e| TestCaseError::fail(format!("settle: {e}")))?;
                prop_assert!(s.is_some(), "{} was open or orphaned", r.id);
                r.cost = actual.min(r.amount);
                r.state = State::Done;
            }
            Op::Release { inst, pick } => {
                let Some(r) = pick_req(&mut reqs, pick, |s| s != State::Done) else {
                    continue;
                };
                let released = stores[inst].release(&r.id, clock.clone()).await;
                prop_assert_eq!(released.is_some(), r.state == State::Open);
                if r.state == State::Open {
                    r.cost = 0;
                    r.state = State::Done;
                }
            }
            Op::Adjust { amount } => a.adjust(owner.token_id, amount, clock.now()).await,
            Op::SetLimit { level, limit } => {
                b.set_limit(
                    LEVELS[level],
                    ids[level],
                    owner.resets[level],
                    Some(limit),
                    clock.now(),
                )
                .await
            }
            Op::TopUp { level, amount } => {
                a.top_up(LEVELS[level], ids[level], amount).await;
            }
            Op::Step { millis } => manual.advance(Duration::milliseconds(millis)),
            Op::Orphan { inst } => {
                let n = stores[1 - inst]
                    .settle_orphans(Orphans::OfOwner(PROCS[inst]), clock.now())
                    .await;
                let mut expected = 0;
                for r in reqs
                    .iter_mut()
                    .filter(|r| r.inst == inst && r.state == State::Open)
                {
                    r.state = State::Orphaned;
                    expected += 1;
                }
                prop_assert_eq!(n, expected);
            }
        }
        check(a, &owner, ids, &reqs).await?;
    }
    for r in reqs.iter_mut().filter(|r| r.state != State::Done) {
        stores[r.inst]
            .settle(&r.id, r.amount / 3, clock.clone())
            .await
            .unwrap();
        r.cost = r.amount / 3;
        r.state = State::Done;
    }
    check(a, &owner, ids, &reqs).await?;
    for (table, id) in TABLES.iter().zip(ids) {
        prop_assert_eq!(a.level(table, id).await.2, 0, "{} still reserved", table);
    }
    Ok(())
}

fn pick_req(reqs: &mut [Req], pick: usize, want: impl Fn(State) -> bool) -> Option<&mut Req> {
    let n = reqs.iter().filter(|r| want(r.state)).count();
    if n == 0 {
        return None;
    }
    reqs.iter_mut().filter(|r| want(r.state)).nth(pick % n)
}

async fn check(
    store: &Store,
    owner: &sluice::store::ledger::Owner,
    ids: [i64; 3],
    reqs: &[Req],
) -> Result<(), TestCaseError> {
    let v = store.violations().await;
    prop_assert!(v.is_empty(), "ledger invariant: {:?}", v);
    let open: i64 = reqs
        .iter()
        .filter(|r| r.state == State::Open)
        .map(|r| r.amount)
        .sum();
    for (table, id) in TABLES.iter().zip(ids) {
        prop_assert_eq!(store.level(table, id).await.2, open, "{} reserved", table);
    }
    let charged = store
        .int(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger WHERE token_id = {} AND kind IN ('reserve', 'settle')",
            owner.token_id
        ))
        .await;
    let model: i64 = reqs.iter().map(|r| r.cost).sum();
    prop_assert_eq!(charged, model, "charges");
    Ok(())
}

#[test]
fn the_money_invariants_hold_on_postgres_in_every_schedule() {
    let cases: u32 = std::env::var("SLUICE_PG_MONEY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let seed = seed("SLUICE_PG_MONEY_SEED", || [17; 32]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stores = rt.block_on(async {
        let a = Store::postgres().await;
        let b = a.another().await;
        [a, b]
    });
    let env = Env { rt, stores };
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
            "money invariant broken on PostgreSQL — replay with SLUICE_PG_MONEY_SEED={}\n{e}",
            hex::encode(seed)
        );
    }
}

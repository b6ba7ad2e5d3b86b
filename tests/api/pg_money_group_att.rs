//! Attack on the grouped money statements (`store::pg::ledger::group`): random batches of
//! reservations on tokens that share a user and a team (limited and unlimited levels mixed,
//! amounts of 0, amounts near `i64::MAX / 64`, a revoked token, a token whose period is stale so
//! its jobs roll over step by step, an owner whose reset rule is stale), all in ONE batch
//! (`pg_round_trips::two_batches`: the writer held until every job is queued), then a
//! batch of settlements with duplicates and releases of the same request ids. After each:
//!   - no limited level is overdrawn, and the ledger invariant holds;
//!   - every refusal for a level is justified: in a batch of reservations only, a level's
//!     remaining never grows once the batch's rollovers are done, so a job refused at a
//!     level must not fit what that level has left at the end;
//!   - a revoked token is never admitted, and refused as gone;
//!   - each reservation is settled exactly once, charged `min(actual, reserved)`.
//!
//! A fixed seed (`SLUICE_PG_GROUP_SEED=<64 hex>` replays another).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::quota::period::Reset;
use sluice::store::ledger::{Level, Owner, Refusal, Settled};

use crate::money_model::seed;
use crate::pg_money::{at, Outcome, Store};
use crate::pg_round_trips::Link;

/// Tokens: 0, 1 on user 0; 2, 3 on user 1 (3 is revoked, or rotated to token 0: `Case::rotated`);
/// all in one team.
const TOKENS: usize = 4;
const REVOKED: usize = 3;

#[derive(Debug, Clone)]
struct Case {
    /// Limits of tokens 0..4, users 0..2, the team (None: unlimited).
    token_limits: [Option<i64>; TOKENS],
    user_limits: [Option<i64>; 2],
    team_limit: Option<i64>,
    /// Token 1's stored period is stale (its jobs roll it over step by step).
    stale_period: bool,
    /// (token, amount, the owner's reset rule for the token is stale)
    jobs: Vec<(usize, i64, bool)>,
    /// Each job's clock on either side of the month's end (per job: `late`), so one batch
    /// holds jobs of both periods; refusals are then not checked (a rollover in the batch
    /// raises a level's remaining).
    boundary: bool,
    late: Vec<bool>,
    /// Per job: settle at this per mille of the reservation, and maybe twice / a release.
    settles: Vec<(i64, u8)>,
    /// Token 3 is rotated (its successor token 0) instead of revoked: refused as
    /// `Rotated`, alone in its batch (s26 final attack #2).
    rotated: bool,
}

fn limit() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![1 => Just(None), 3 => (0i64..5_000).prop_map(Some)]
}

fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        12 => 1i64..1_500,
        // Near the top of the range, yet 40 of them still fit an i64 `reserved` column.
        1 => Just(i64::MAX / 64),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        [limit(), limit(), limit(), limit()],
        [limit(), limit()],
        limit(),
        any::<bool>(),
        proptest::collection::vec((0usize..TOKENS, amount(), prop::bool::weighted(0.1)), 2..40),
        proptest::collection::vec((0i64..1_500, 0u8..4), 40),
        prop::bool::weighted(0.3),
        proptest::collection::vec(any::<bool>(), 40),
        any::<bool>(),
    )
        .prop_map(
            |(
                token_limits,
                user_limits,
                team_limit,
                stale_period,
                jobs,
                settles,
                boundary,
                late,
                rotated,
            )| Case {
                token_limits,
                user_limits,
                team_limit,
                stale_period,
                jobs,
                boundary,
                late,
                settles,
                rotated,
            },
        )
}

/// Runs `jobs` in as few batches as the writer allows: the database's answers are held
/// (`Link::hold`) until every job is in the writer's hands, so those the writer had not
/// taken yet form one batch.
async fn one_batch<T: Send + 'static>(
    link: &Link,
    store: &Store,
    jobs: Vec<BoxFuture<'static, T>>,
) -> Vec<T> {
    let n = jobs.len() as u64;
    let before = store.writer.stats().jobs;
    link.hold(true);
    let tasks: Vec<_> = jobs.into_iter().map(tokio::spawn).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.writer.queued() as u64 + store.writer.stats().jobs - before < n {
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs never reached the writer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    link.hold(false);
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

struct Env {
    rt: tokio::runtime::Runtime,
    link: Link,
    store: Arc<Store>,
}

static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);

/// Round trips and jobs of the reservation batches (how grouped they ran).
static TRIPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const AT: &str = "2026-12-01T00:00:00.000Z";

async fn exec(store: &Store, sql: &str, limit: Option<i64>) {
    let pg = store.pg();
    sqlx::query(sql)
        .bind(limit)
        .execute(&pg.pool)
        .await
        .expect(sql);
}

/// (token ids, user ids, team id) created for a case.
async fn world(store: &Store, c: &Case) -> ([i64; TOKENS], [i64; 2], i64) {
    let base = 1_000_000 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 10;
    let team = base;
    exec(
        store,
        &format!("INSERT INTO teams (id, name, limit_micros, remaining_micros, reset, created_at) VALUES ({team}, 'g-{team}', $1, $1, 'monthly', '{AT}')"),
        c.team_limit,
    )
    .await;
    let users = [base + 1, base + 2];
    for (k, u) in users.iter().enumerate() {
        exec(
            store,
            &format!("INSERT INTO users (id, username, team_id, limit_micros, remaining_micros, reset, created_at) VALUES ({u}, 'g-{u}', {team}, $1, $1, 'monthly', '{AT}')"),
            c.user_limits[k],
        )
        .await;
    }
    let tokens = [base + 3, base + 4, base + 5, base + 6];
    for (k, t) in tokens.iter().enumerate() {
        let u = users[k / 2];
        exec(
            store,
            &format!("INSERT INTO tokens (id, user_id, token_hash, prefix, limit_micros, remaining_micros, reset, created_at)
                      VALUES ({t}, {u}, decode('{t:016x}', 'hex'), 'abcdefgh', $1, $1, 'monthly', '{AT}')"),
            c.token_limits[k],
        )
        .await;
    }
    (tokens, users, team)
}

fn owner(tokens: &[i64; TOKENS], users: &[i64; 2], team: i64, k: usize, stale: bool) -> Owner {
    let monthly = Reset::parse("monthly").unwrap();
    let token_rule = if stale {
        Reset::parse("daily").unwrap()
    } else {
        monthly
    };
    Owner {
        token_id: tokens[k],
        user_id: users[k / 2],
        team_id: team,
        resets: [token_rule, monthly, monthly],
    }
}

async fn int(store: &Store, sql: &str) -> Option<i64> {
    sqlx::query_scalar::<_, Option<i64>>(sql)
        .fetch_one(&store.pg().pool)
        .await
        .expect(sql)
}

async fn run_case(env: &Env, c: Case) -> Result<(), TestCaseError> {
    let store = &env.store;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (tokens, users, team) = world(store, &c).await;
    // Every level rolled into the current period (as the gateway's first request would).
    for k in 0..TOKENS {
        let o = owner(&tokens, &users, team, k, false);
        let id = format!("warm-{}", tokens[k]);
        let r = store.reserve(&o, &id, 0, "p", clock.clone()).await.unwrap();
        prop_assert!(r.is_ok(), "warm-up of token {k}: {r:?}");
        store.settle(&id, 0, clock.clone()).await.unwrap();
    }
    let gone = match c.rotated {
        true => format!("successor_id = {}", tokens[0]),
        false => format!("revoked_at = '{AT}'"),
    };
    exec(
        store,
        &format!(
            "UPDATE tokens SET {gone} WHERE id = {} AND $1::BIGINT IS NULL",
            tokens[REVOKED]
        ),
        None,
    )
    .await;
    if c.stale_period {
        exec(
            store,
            &format!(
                "UPDATE tokens SET period = '2026-10' WHERE id = {} AND $1::BIGINT IS NULL",
                tokens[1]
            ),
            None,
        )
        .await;
    }

    // One batch of every reservation (after a first job alone).
    let jobs: Vec<BoxFuture<'static, Outcome>> = c
        .jobs
        .iter()
        .enumerate()
        .map(|(n, &(k, amount, stale))| {
            let store = env.store.clone();
            let clock: Arc<dyn Clock> = match (c.boundary, c.late[n % c.late.len()]) {
                (false, _) => clock.clone(),
                (true, false) => Arc::new(ManualClock::new(at("2026-12-31T23:59:59.500Z"))),
                (true, true) => Arc::new(ManualClock::new(at("2027-01-01T00:00:00.500Z"))),
            };
            let o = owner(&tokens, &users, team, k, stale);
            let id = format!("g-{}-{n}", tokens[0]);
            Box::pin(async move { store.reserve(&o, &id, amount, "p", clock).await.unwrap() })
                as BoxFuture<'static, Outcome>
        })
        .collect();
    let trips = env.link.round_trips();
    let outcomes = one_batch(&env.link, store, jobs).await;
    TRIPS.fetch_add(
        env.link.round_trips() - trips,
        std::sync::atomic::Ordering::Relaxed,
    );
    JOBS.fetch_add(c.jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);

    // No level overdrawn, the ledger agrees.
    let v = store.violations().await;
    prop_assert!(v.is_empty(), "violations after the reservations: {v:?}");
    for (table, id) in tokens
        .iter()
        .map(|t| ("tokens", *t))
        .chain(users.iter().map(|u| ("users", *u)))
        .chain([("teams", team)])
    {
        let over = int(
            store,
            &format!("SELECT COUNT(*) FROM {table} WHERE id = {id} AND limit_micros IS NOT NULL AND remaining_micros < 0"),
        )
        .await;
        prop_assert_eq!(over, Some(0), "{} {} overdrawn", table, id);
    }
    // Every refusal justified by what its level has left at the end.
    for (n, o) in outcomes.iter().enumerate() {
        let (k, amount, _) = c.jobs[n];
        match o {
            Ok(r) => {
                prop_assert!(
                    k != REVOKED,
                    "job {n}: a revoked or rotated token was admitted: {r:?}"
                );
                prop_assert_eq!(r.amount, amount);
            }
            Err(Refusal::TokenGone) => {
                prop_assert_eq!(k, REVOKED, "job {} refused as gone", n);
                prop_assert!(!c.rotated, "job {n}: a rotated token refused as gone");
            }
            Err(Refusal::Rotated(next)) => {
                prop_assert_eq!(k, REVOKED, "job {} refused as rotated", n);
                prop_assert!(c.rotated, "job {n}: a revoked token refused as rotated");
                prop_assert_eq!(*next, tokens[0]);
            }
            Err(Refusal::Insufficient(level, _)) => {
                prop_assert!(
                    k != REVOKED,
                    "job {n}: a revoked token refused for {level:?}"
                );
                if c.boundary {
                    continue;
                }
                let (table, id) = match level {
                    Level::Token => ("tokens", tokens[k]),
                    Level::User => ("users", users[k / 2]),
                    Level::Team => ("teams", team),
                };
                let left = int(
                    store,
                    &format!("SELECT remaining_micros FROM {table} WHERE id = {id} AND limit_micros IS NOT NULL"),
                )
                .await;
                prop_assert!(
                    left.is_none_or(|l| l < amount),
                    "job {n} (token {k}, {amount}) refused for {level:?}, but {table} {id} has {left:?} left after the batch \
                     (limits: tokens {:?}, users {:?}, team {:?})",
                    c.token_limits,
                    c.user_limits,
                    c.team_limit
                );
            }
        }
    }

    // One batch of settlements: each reserved id settled, some twice, some released too.
    let mut expect: HashMap<String, (i64, Vec<i64>)> = HashMap::new();
    let mut settles: Vec<BoxFuture<'static, (String, Option<Settled>)>> = Vec::new();
    for (n, o) in outcomes.iter().enumerate() {
        let Ok(r) = o else { continue };
        let id = r.request_id.to_string();
        let (permille, extra) = c.settles[n % c.settles.len()];
        let actual = if r.amount > i64::MAX / 1_500 {
            r.amount / 1_000 * permille.min(1_000)
        } else {
            r.amount * permille / 1_000
        };
        let mut push = |actual: Option<i64>| {
            let (store, clock, id) = (env.store.clone(), clock.clone(), id.clone());
            expect
                .entry(id.clone())
                .or_insert((r.amount, vec![]))
                .1
                .push(actual.unwrap_or(0));
            settles.push(Box::pin(async move {
                let s = match actual {
                    Some(a) => store.settle(&id, a, clock).await.unwrap(),
                    None => store.release(&id, clock).await,
                };
                (id, s)
            }));
        };
        push(Some(actual));
        match extra {
            1 => push(Some(actual)),
            2 => push(None),
            _ => {}
        }
    }
    if settles.len() >= 2 {
        let settled = one_batch(&env.link, store, settles).await;
        let mut got: HashMap<String, Vec<Settled>> = HashMap::new();
        for (id, s) in settled {
            if let Some(s) = s {
                got.entry(id).or_default().push(s);
            }
        }
        for (id, (amount, actuals)) in &expect {
            let s = got.get(id).map(Vec::as_slice).unwrap_or_default();
            prop_assert_eq!(
                s.len(),
                1,
                "{} (reserved {}) settled {:?} times",
                id,
                amount,
                s.len()
            );
            let charged = s[0].charged;
            prop_assert!(
                actuals.iter().any(|a| charged == (*a).min(*amount)),
                "{id}: reserved {amount}, settled at {actuals:?}, charged {charged}"
            );
        }
    } else {
        for s in settles {
            s.await;
        }
    }
    let v = store.violations().await;
    prop_assert!(v.is_empty(), "violations after the settlements: {v:?}");
    prop_assert_eq!(
        int(
            store,
            &format!(
                "SELECT COUNT(*) FROM reservations WHERE token_id IN ({}, {}, {}, {})",
                tokens[0], tokens[1], tokens[2], tokens[3]
            )
        )
        .await,
        Some(0)
    );
    Ok(())
}

#[test]
fn grouped_reservations_never_overdraw_and_every_refusal_is_justified() {
    let seed = seed("SLUICE_PG_GROUP_SEED", || [23; 32]);
    let cases: u32 = std::env::var("SLUICE_PG_GROUP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (link, store) = rt.block_on(async {
        let link = Link::start(&crate::pg_server::database()).await;
        let store = Arc::new(Store::open_pg(link.url.clone()).await);
        (link, store)
    });
    let env = Env { rt, link, store };
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 100,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&case(), |c| env.rt.block_on(run_case(&env, c)));
    println!(
        "reservation batches: {} jobs in {} round trips",
        JOBS.load(std::sync::atomic::Ordering::Relaxed),
        TRIPS.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Err(e) = result {
        panic!(
            "grouped money path broken — replay with SLUICE_PG_GROUP_SEED={}\n{e}",
            hex::encode(seed)
        );
    }
}

/// Callers that stop waiting while their reservations wait in the writer's queue (a client
/// hanging up): in the batch that then runs, each of their jobs is left out, and a release
/// of the same request id in that very batch (what `quota::Pending::drop` sends) finds
/// nothing — nothing stays reserved for a caller that left, the others are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_of_callers_gone_mid_queue_are_not_kept_even_beside_their_release() {
    let link = Link::start(&crate::pg_server::database()).await;
    let store = Arc::new(Store::open_pg(link.url.clone()).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let c = Case {
        token_limits: [Some(1_000_000); TOKENS],
        user_limits: [Some(1_000_000); 2],
        team_limit: Some(1_000_000),
        stale_period: false,
        jobs: vec![],
        boundary: false,
        late: vec![],
        settles: vec![],
        rotated: false,
    };
    let (tokens, users, team) = world(&store, &c).await;
    for k in 0..TOKENS {
        let o = owner(&tokens, &users, team, k, false);
        let id = format!("warm-{k}");
        store
            .reserve(&o, &id, 0, "p", clock.clone())
            .await
            .unwrap()
            .unwrap();
        store.settle(&id, 0, clock.clone()).await.unwrap();
    }
    let before = store.writer.stats().jobs;
    link.hold(true);
    let n = 24u64;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (store, clock) = (store.clone(), clock.clone());
            let o = owner(&tokens, &users, team, (i % 3) as usize, false);
            tokio::spawn(async move {
                store
                    .reserve(&o, &format!("gone-{i}"), 1_000, "p", clock)
                    .await
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.writer.queued() as u64 + store.writer.stats().jobs - before < n {
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs never reached the writer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    // Every other caller hangs up; its release follows into the queue.
    let mut releases = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        if i % 2 == 1 {
            t.abort();
            let (store, clock) = (store.clone(), clock.clone());
            releases.push(tokio::spawn(async move {
                store.release(&format!("gone-{i}"), clock).await
            }));
        }
    }
    while store.writer.queued() as u64 + store.writer.stats().jobs - before
        < n + releases.len() as u64
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the releases never reached the writer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    link.hold(false);
    let mut kept = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(r) => {
                assert!(matches!(r, Ok(Ok(_))), "caller {i}: {r:?}");
                kept += 1;
            }
            Err(e) => assert!(e.is_cancelled() && i % 2 == 1, "caller {i}: {e:?}"),
        }
    }
    for r in releases {
        r.await.unwrap();
    }
    // What is still reserved is exactly the open reservations, and those are callers'
    // who waited (or, for a caller whose job ran before it hung up, its release landed).
    let open: Vec<String> =
        sqlx::query_scalar("SELECT request_id FROM reservations ORDER BY request_id")
            .fetch_all(&store.pg().pool)
            .await
            .unwrap();
    let gone: Vec<&String> = open
        .iter()
        .filter(|id| id.trim_start_matches("gone-").parse::<u64>().unwrap() % 2 == 1)
        .collect();
    assert!(
        gone.is_empty(),
        "reservations kept for callers that left: {gone:?}"
    );
    assert_eq!(open.len(), kept, "{open:?}");
    let reserved = int(
        &store,
        &format!("SELECT reserved_micros FROM teams WHERE id = {team}"),
    )
    .await;
    assert_eq!(reserved, Some(1_000 * kept as i64));
    assert_eq!(store.violations().await, Vec::<String>::new());
    for id in &open {
        store
            .settle(id, 1_000, clock.clone())
            .await
            .unwrap()
            .unwrap();
    }
    store.assert_settled().await;
}

/// One request larger than its team has left (a client asking for a huge `max_tokens`: it
/// is refused anyway) must not make the rest of its batch run step by step: the grouped
/// statement's running sum counted the refused job's amount, so every later job of that
/// team (and user, and token) "might fit" and was left to `reserve_tx` — a round trip or
/// more per job, the ungrouped cost the grouping exists to remove, for every caller that
/// shares a batch with one oversized request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_oversized_request_does_not_ungroup_the_rest_of_its_batch() {
    let link = Link::start(&crate::pg_server::database()).await;
    let store = Arc::new(Store::open_pg(link.url.clone()).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let c = Case {
        token_limits: [None; TOKENS],
        user_limits: [None; 2],
        team_limit: Some(1_000_000),
        stale_period: false,
        jobs: vec![],
        boundary: false,
        late: vec![],
        settles: vec![],
        rotated: false,
    };
    let (tokens, users, team) = world(&store, &c).await;
    for k in 0..TOKENS - 1 {
        let o = owner(&tokens, &users, team, k, false);
        let id = format!("warm-{k}");
        store
            .reserve(&o, &id, 0, "p", clock.clone())
            .await
            .unwrap()
            .unwrap();
        store.settle(&id, 0, clock.clone()).await.unwrap();
    }
    let spawn = |id: String, k: usize, amount: i64| {
        let (store, clock) = (store.clone(), clock.clone());
        let o = owner(&tokens, &users, team, k, false);
        tokio::spawn(async move { store.reserve(&o, &id, amount, "p", clock).await.unwrap() })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let wait = |what: &str| {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
    };
    let (before, trips) = (store.writer.stats(), link.round_trips());
    link.hold(true);
    // A first batch alone, held; then the oversized job first in the next batch, and 40
    // ordinary ones behind it.
    let first = spawn("first".into(), 0, 1_000);
    while store.writer.stats().jobs == before.jobs {
        wait("the first batch");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let huge = spawn("huge".into(), 1, 2_000_000);
    while store.writer.queued() < 1 {
        wait("the oversized job queued");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let small: Vec<_> = (0..40)
        .map(|i| spawn(format!("small-{i}"), i % 3, 1_000))
        .collect();
    while store.writer.queued() < 41 {
        wait("the ordinary jobs queued");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    link.hold(false);
    assert!(first.await.unwrap().is_ok());
    let refused = huge.await.unwrap();
    assert!(
        matches!(refused, Err(Refusal::Insufficient(Level::Team, _))),
        "{refused:?}"
    );
    for s in small {
        assert!(s.await.unwrap().is_ok());
    }
    let after = store.writer.stats();
    let round_trips = link.round_trips() - trips;
    assert_eq!(
        (after.batches - before.batches, after.jobs - before.jobs),
        (2, 42)
    );
    // BEGIN, the locks, the grouped settlements, the grouped reservations, COMMIT.
    assert!(
        round_trips <= 2 * 5,
        "42 reservations in 2 batches took {round_trips} round trips (at most 10 expected)"
    );
    assert_eq!(
        store.level("teams", team).await,
        (1_000_000, 1_000_000 - 41 * 1_000, 41 * 1_000)
    );
    for id in ["first".to_string()]
        .into_iter()
        .chain((0..40).map(|i| format!("small-{i}")))
    {
        store
            .settle(&id, 1_000, clock.clone())
            .await
            .unwrap()
            .unwrap();
    }
    store.assert_settled().await;
}

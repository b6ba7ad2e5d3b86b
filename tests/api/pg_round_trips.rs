//! Group commit on PostgreSQL costs O(1) round trips per batch (issue 17 item 2: "a remote
//! database with 0.5 ms round trips does not cap throughput"), counted, not timed: the
//! gateway talks to the server through `Link`, a forwarder that reads the client's side of
//! the PostgreSQL protocol and counts the messages the client then waits on (`Sync` of the
//! extended protocol, `Query` of the simple one) — one per round trip. `Link` also holds
//! the server's answers while its gate is closed, so a test can make the writer wait in
//! one batch while the next batch's jobs queue up, and know exactly what each batch held.
//! It can also close the gate as a client sends its next `COMMIT` (`hold_next_commit`):
//! the server commits, and the client never hears it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::{Clock, SystemClock};
use sluice::store::ledger::{Level, Refusal, Settled};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::helpers::Budget;
use crate::pg_money::Store;

/// A forwarder to a PostgreSQL server that counts round trips and can hold the answers.
pub struct Link {
    pub url: String,
    round_trips: Arc<AtomicU64>,
    gate: Arc<watch::Sender<bool>>,
    hold_commit: Arc<AtomicBool>,
}

/// The SSLRequest and GSSENCRequest codes: untyped messages the startup message follows.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// Counts the messages of the client's stream after which the client waits for the server.
#[derive(Default)]
struct Reader {
    buf: Vec<u8>,
    started: bool,
    /// Simple-protocol `COMMIT`s seen.
    commits: u64,
}

impl Reader {
    /// Takes the next bytes; returns how many `Sync`/`Query` messages they completed.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.buf.extend_from_slice(bytes);
        let mut n = 0;
        loop {
            if !self.started {
                // Untyped: length (4, itself included), then a code.
                if self.buf.len() < 8 {
                    return n;
                }
                let len = u32::from_be_bytes(self.buf[0..4].try_into().unwrap()) as usize;
                if self.buf.len() < len {
                    return n;
                }
                let code = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
                self.started = code != SSL_REQUEST && code != GSSENC_REQUEST;
                self.buf.drain(..len);
            } else {
                if self.buf.len() < 5 {
                    return n;
                }
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() < 1 + len {
                    return n;
                }
                if matches!(self.buf[0], b'S' | b'Q') {
                    n += 1;
                }
                if self.buf[0] == b'Q' && self.buf[5..1 + len].starts_with(b"COMMIT") {
                    self.commits += 1;
                }
                self.buf.drain(..1 + len);
            }
        }
    }
}

impl Link {
    pub async fn start(url: &str) -> Link {
        let mut target = url::Url::parse(url).unwrap();
        let server = format!("{}:{}", target.host_str().unwrap(), target.port().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let (gate, open) = watch::channel(true);
        let gate = Arc::new(gate);
        let hold_commit = Arc::new(AtomicBool::new(false));
        let counted = round_trips.clone();
        let (closer, armed) = (gate.clone(), hold_commit.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = tokio::net::TcpStream::connect(&server).await.unwrap();
                client.set_nodelay(true).unwrap();
                upstream.set_nodelay(true).unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let counted = counted.clone();
                let (closer, armed) = (closer.clone(), armed.clone());
                tokio::spawn(async move {
                    let (mut reader, mut buf) = (Reader::default(), vec![0u8; 64 * 1024]);
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let commits = reader.commits;
                        counted.fetch_add(reader.feed(&buf[..n]), Ordering::SeqCst);
                        if reader.commits > commits && armed.swap(false, Ordering::SeqCst) {
                            closer.send_replace(false);
                        }
                        if uw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let mut open = open.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match ur.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if open.wait_for(|o| *o).await.is_err()
                            || cw.write_all(&buf[..n]).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        target.set_port(Some(port)).unwrap();
        Link {
            url: target.to_string(),
            round_trips,
            gate,
            hold_commit,
        }
    }

    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }

    pub fn hold(&self, held: bool) {
        self.gate.send_replace(!held);
    }

    /// Closes the gate as a client sends its next `COMMIT`: the server receives it (and
    /// commits), its answer is held until `hold(false)`.
    pub fn hold_next_commit(&self) {
        self.hold_commit.store(true, Ordering::SeqCst);
    }
}

/// Polls `cond` until it holds (a generous deadline for a loaded machine).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What one measured pair of batches cost.
struct Cost {
    batches: u64,
    jobs: u64,
    round_trips: u64,
}

/// Runs `jobs` so that the first is a batch alone and all the others one batch together:
/// the first job's batch waits (the answers held) until the others are queued.
async fn two_batches<T: Send + 'static>(
    link: &Link,
    store: &Store,
    mut jobs: Vec<futures_util::future::BoxFuture<'static, T>>,
) -> (Vec<T>, Cost) {
    let (stats, trips) = (store.writer.stats(), link.round_trips());
    link.hold(true);
    let rest = jobs.split_off(1);
    let first = tokio::spawn(jobs.pop().unwrap());
    until("the first batch is sent", || link.round_trips() > trips).await;
    let n = rest.len();
    let rest: Vec<_> = rest.into_iter().map(tokio::spawn).collect();
    until("the other jobs are queued", || store.writer.queued() == n).await;
    link.hold(false);
    let mut out = vec![first.await.unwrap()];
    for t in rest {
        out.push(t.await.unwrap());
    }
    let after = store.writer.stats();
    let cost = Cost {
        batches: after.batches - stats.batches,
        jobs: after.jobs - stats.jobs,
        round_trips: link.round_trips() - trips,
    };
    (out, cost)
}

/// Round trips one batch may take however many jobs it holds: BEGIN, the locks, the
/// grouped settlements, the grouped reservations, COMMIT.
const PER_BATCH: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_reservations_and_settlements_costs_a_few_round_trips_not_one_per_job() {
    let link = Link::start(&crate::pg_server::database()).await;
    let store = Arc::new(Store::open_pg(link.url.clone()).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let big = Budget {
        limit: Some(1_000_000_000),
        reset: "monthly",
    };
    let none = Budget {
        limit: None,
        reset: "never",
    };
    // 64 jobs of 1000 on 8 tokens of one team that covers 40 of them: the rest are refused.
    let team = Budget {
        limit: Some(40_000),
        reset: "monthly",
    };
    let first = store.owner(&[big.clone(), none.clone(), team]).await;
    let mut owners = vec![first.clone()];
    for _ in 1..8 {
        let o = store
            .owner(&[big.clone(), none.clone(), none.clone()])
            .await;
        owners.push(sluice::store::ledger::Owner {
            team_id: first.team_id,
            // The team's own reset rule (the owner's resets are the rows' rules).
            resets: [o.resets[0], o.resets[1], first.resets[2]],
            ..o
        });
    }
    // Warm up: the writer's statements prepared on its connection, and every level rolled
    // into the current period (a rollover is step by step, once per level and period).
    for (k, owner) in owners.iter().enumerate() {
        let id = format!("warm-{k}");
        store
            .reserve(owner, &id, 0, "p", clock.clone())
            .await
            .unwrap()
            .unwrap();
        store.settle(&id, 0, clock.clone()).await.unwrap().unwrap();
    }

    let reserves: Vec<_> = (0..64)
        .map(|k| {
            let (store, owner, clock) = (store.clone(), owners[k % 8].clone(), clock.clone());
            Box::pin(async move {
                store
                    .reserve(&owner, &format!("rt-{k}"), 1_000, "p", clock)
                    .await
                    .unwrap()
            }) as futures_util::future::BoxFuture<'static, crate::pg_money::Outcome>
        })
        .collect();
    let (outcomes, cost) = two_batches(&link, &store, reserves).await;
    println!(
        "64 reservations: {} batches, {} jobs, {} round trips",
        cost.batches, cost.jobs, cost.round_trips
    );
    assert_eq!((cost.batches, cost.jobs), (2, 64));
    let reserved = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(reserved, 40, "the team covers exactly 40 reservations");
    for o in &outcomes {
        if let Err(refusal) = o {
            assert!(
                matches!(refusal, Refusal::Insufficient(Level::Team, Some(_))),
                "{refusal:?}"
            );
        }
    }
    assert!(
        cost.round_trips <= PER_BATCH * cost.batches,
        "64 reservations in 2 batches took {} round trips (at most {} expected)",
        cost.round_trips,
        PER_BATCH * cost.batches
    );

    let settles: Vec<_> = (0..64)
        .map(|k| {
            let (store, clock) = (store.clone(), clock.clone());
            Box::pin(async move { store.settle(&format!("rt-{k}"), 400, clock).await.unwrap() })
                as futures_util::future::BoxFuture<'static, Option<Settled>>
        })
        .collect();
    let (settled, cost) = two_batches(&link, &store, settles).await;
    println!(
        "64 settlements: {} batches, {} jobs, {} round trips",
        cost.batches, cost.jobs, cost.round_trips
    );
    assert_eq!((cost.batches, cost.jobs), (2, 64));
    for (k, s) in settled.iter().enumerate() {
        match (&outcomes[k], s) {
            (Ok(_), Some(s)) => assert_eq!((s.charged, s.absorbed), (400, 0)),
            (Err(_), None) => {}
            (o, s) => panic!("request rt-{k}: reserved {:?}, settled {s:?}", o.is_ok()),
        }
    }
    assert!(
        cost.round_trips <= PER_BATCH * cost.batches,
        "64 settlements in 2 batches took {} round trips (at most {} expected)",
        cost.round_trips,
        PER_BATCH * cost.batches
    );
    // The money: 40 × 400 spent at the team, nothing held, the ledger agrees.
    assert_eq!(
        store.level("teams", first.team_id).await,
        (40_000, 40_000 - 40 * 400, 0)
    );
    assert_eq!(store.violations().await, Vec::<String>::new());
    store.assert_settled().await;
}

/// A reservation whose request id is already open makes the grouped statement fail (a
/// unique violation): its batch runs again job by job, and that job fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_already_reserved_fails_alone_in_a_grouped_batch() {
    let link = Link::start(&crate::pg_server::database()).await;
    let store = Arc::new(Store::open_pg(link.url.clone()).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let budget = Budget {
        limit: Some(1_000_000),
        reset: "monthly",
    };
    let owner = store
        .owner(&[budget.clone(), budget.clone(), budget.clone()])
        .await;
    store
        .reserve(&owner, "old", 1_000, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let jobs: Vec<_> = (0..16)
        .map(|k| {
            let (store, owner, clock) = (store.clone(), owner.clone(), clock.clone());
            // Job 0 is a batch alone; job 5, in the second batch, reuses `old`.
            let id = if k == 5 {
                "old".to_string()
            } else {
                format!("new-{k}")
            };
            Box::pin(async move { store.reserve(&owner, &id, 1_000, "p", clock).await })
                as futures_util::future::BoxFuture<'static, _>
        })
        .collect();
    let before = store.writer.stats();
    let (outcomes, cost) = two_batches(&link, &store, jobs).await;
    assert_eq!((cost.batches, cost.jobs), (2, 16));
    for (k, o) in outcomes.iter().enumerate() {
        match (k, o) {
            (5, Err(sluice::store::StoreError::Sql(e))) => {
                assert!(e.to_string().contains("duplicate key"), "{e}")
            }
            (5, other) => panic!("the reused id: {other:?}"),
            (_, Ok(Ok(_))) => {}
            (_, other) => panic!("job {k}: {other:?}"),
        }
    }
    assert_eq!(store.writer.stats().failed_batches, before.failed_batches);
    for k in (0..16).filter(|k| *k != 5) {
        store
            .settle(&format!("new-{k}"), 1_000, clock.clone())
            .await
            .unwrap()
            .unwrap();
    }
    store
        .settle("old", 1_000, clock.clone())
        .await
        .unwrap()
        .unwrap();
    // 16 × 1000 charged at every level, and the ledger agrees.
    assert_eq!(
        store.level("teams", owner.team_id).await,
        (1_000_000, 1_000_000 - 16 * 1_000, 0)
    );
    store.assert_settled().await;
}

/// In one batch a settlement comes before the reservations (any order of one batch's
/// jobs is a true history; this one lets a reservation use what a settlement frees): a
/// team with room for one reservation settles one and admits the next in the same batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_one_batch_a_settlement_frees_what_a_reservation_then_takes() {
    let link = Link::start(&crate::pg_server::database()).await;
    let store = Arc::new(Store::open_pg(link.url.clone()).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let one = Budget {
        limit: Some(1_000),
        reset: "monthly",
    };
    let none = Budget {
        limit: None,
        reset: "never",
    };
    let owner = store.owner(&[none.clone(), none.clone(), one]).await;
    let other = store.owner(&[none.clone(), none.clone(), none]).await;
    store
        .reserve(&owner, "a", 1_000, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let refused = store
        .reserve(&owner, "b0", 1_000, "p", clock.clone())
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(Refusal::Insufficient(Level::Team, _))),
        "{refused:?}"
    );
    let (s1, c1, s2, c2) = (store.clone(), clock.clone(), store.clone(), clock.clone());
    let (o1, o2) = (owner.clone(), other.clone());
    let jobs: Vec<futures_util::future::BoxFuture<'static, String>> = vec![
        Box::pin(async move {
            let r = s1.reserve(&o2, "warm", 1, "p", c1).await.unwrap();
            format!("{:?}", r.map(|r| r.amount))
        }),
        Box::pin(async move {
            let r = s2.reserve(&o1, "b", 1_000, "p", c2).await.unwrap();
            format!("{:?}", r.map(|r| r.amount))
        }),
        {
            let (s, c) = (store.clone(), clock.clone());
            Box::pin(async move {
                let r = s.settle("a", 0, c).await.unwrap();
                format!("{:?}", r.map(|r| r.charged))
            })
        },
    ];
    let (out, cost) = two_batches(&link, &store, jobs).await;
    assert_eq!((cost.batches, cost.jobs), (2, 3));
    assert_eq!(out, ["Ok(1)", "Ok(1000)", "Some(0)"]);
    assert_eq!(store.level("teams", owner.team_id).await, (1_000, 0, 1_000));
    store
        .settle("b", 1_000, clock.clone())
        .await
        .unwrap()
        .unwrap();
    store
        .settle("warm", 1, clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.assert_settled().await;
}

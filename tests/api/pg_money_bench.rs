//! Reserve + settle pairs per second on PostgreSQL through the group-commit writer, at 1,
//! 16 and 64 concurrent callers, next to SQLite's writer on the same machine. Not a check
//! (benchmarks are never timed assertions): it prints its figures.
//!
//! `cargo test --release --test api pg_money_bench -- --ignored --nocapture`. Without
//! `SLUICE_PG_BENCH_URL` it starts a server of its own with PostgreSQL's durable defaults
//! (`fsync = on`). It measures PostgreSQL directly and again through `delayed_link`, which
//! holds every answer 0.5 ms (`SLUICE_PG_BENCH_RTT_US` microseconds): a remote database.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::{Clock, SystemClock};

use crate::helpers::Budget;
use crate::pg_money::Store;
use crate::pg_server::PgServer;

const SECONDS: u64 = 4;

async fn pairs_per_second(store: &Arc<Store>, callers: usize) -> f64 {
    let unlimited = Budget {
        limit: None,
        reset: "never",
    };
    let limited = Budget {
        limit: Some(i64::MAX / 4),
        reset: "monthly",
    };
    // One token per caller, all in one team (the team row is every pair's hot row).
    let first = store
        .owner(&[limited.clone(), unlimited.clone(), limited.clone()])
        .await;
    let mut owners = vec![first.clone()];
    for _ in 1..callers {
        let o = store
            .owner(&[limited.clone(), unlimited.clone(), unlimited.clone()])
            .await;
        owners.push(sluice::store::ledger::Owner {
            team_id: first.team_id,
            // The team's own reset rule (the owner's resets are the rows' rules).
            resets: [o.resets[0], o.resets[1], first.resets[2]],
            ..o
        });
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (c, owner) in owners.into_iter().enumerate() {
        let (store, clock, stop, done) = (store.clone(), clock.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let id = format!("b{}-{c}-{k}", owner.token_id);
                store
                    .reserve(&owner, &id, 1_000, "bench", clock.clone())
                    .await
                    .unwrap()
                    .unwrap();
                store
                    .settle(&id, 400, clock.clone())
                    .await
                    .unwrap()
                    .unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, start) = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(SECONDS)).await;
    let n = done.load(Ordering::Relaxed) - from;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --nocapture"]
async fn pg_money_bench() {
    let (_server, url, note) = match std::env::var("SLUICE_PG_BENCH_URL") {
        Ok(url) => (None, url, "SLUICE_PG_BENCH_URL"),
        Err(_) => {
            let server = PgServer::start_durable();
            let url = server.database();
            (Some(server), url, "a server of its own, fsync=on")
        }
    };
    let rtt_us: u64 = std::env::var("SLUICE_PG_BENCH_RTT_US")
        .map(|v| v.parse().expect("SLUICE_PG_BENCH_RTT_US: microseconds"))
        .unwrap_or(500);
    let far_url = delayed_link(&url, Duration::from_micros(rtt_us));
    let pg = Arc::new(Store::open_pg(url).await);
    let far = Arc::new(Store::open_pg(far_url).await);
    let lite = Arc::new(Store::sqlite().await);
    println!(
        "reserve+settle pairs/s ({note}; +{rtt_us} µs: through a link holding each answer that long; SQLite synchronous=normal)"
    );
    for callers in [1, 16, 64] {
        let (p, p_batch) = measured(&pg, callers).await;
        let (f, f_batch) = measured(&far, callers).await;
        let s = pairs_per_second(&lite, callers).await;
        println!(
            "callers {callers:>3}: postgres {p:>7.0} ({p_batch})   postgres +{rtt_us} µs {f:>7.0} ({f_batch})   sqlite {s:>7.0}"
        );
    }
}

/// Pairs per second on `store`, with the writer's jobs per batch and retries meanwhile.
async fn measured(store: &Arc<Store>, callers: usize) -> (f64, String) {
    let before = store.writer.stats();
    let rate = pairs_per_second(store, callers).await;
    let after = store.writer.stats();
    let per_batch =
        (after.jobs - before.jobs) as f64 / (after.batches - before.batches).max(1) as f64;
    (
        rate,
        format!(
            "{per_batch:.1} jobs/batch, {} retries",
            after.retries - before.retries
        ),
    )
}

/// A forwarder to `url`'s server that delivers each chunk the server sends `rtt` after it
/// arrived (a remote database's round trip; OS threads and `std::thread::sleep`, which on
/// Linux oversleeps by tens of microseconds, where Tokio's timers round up to 1 ms).
/// Returns the URL through it; it lives as long as the process.
pub fn delayed_link(url: &str, rtt: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let mut target = url::Url::parse(url).unwrap();
    let server = format!("{}:{}", target.host_str().unwrap(), target.port().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let upstream = TcpStream::connect(&server).unwrap();
            client.set_nodelay(true).unwrap();
            upstream.set_nodelay(true).unwrap();
            let (mut cr, mut uw) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut cr, &mut uw);
                let _ = uw.shutdown(std::net::Shutdown::Write);
            });
            let (mut ur, mut cw) = (upstream, client);
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match ur.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            std::thread::spawn(move || {
                for (at, chunk) in rx {
                    let due = at + rtt;
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    if cw.write_all(&chunk).is_err() {
                        return;
                    }
                }
                let _ = cw.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    target.set_port(Some(port)).unwrap();
    target.to_string()
}

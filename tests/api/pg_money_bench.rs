//! Reserve + settle pairs per second on PostgreSQL through the group-commit writer, at 1,
//! 16 and 64 concurrent callers, next to SQLite's writer on the same machine. Not a check
//! (benchmarks are never timed assertions): it prints its figures.
//!
//! `cargo test --test api pg_money_bench -- --ignored --nocapture`. Without
//! `SLUICE_PG_BENCH_URL` it runs on a server of the harness, which runs with `fsync=off`;
//! set it to a database of a server with `fsync = on` for the durable figure.
//! `SLUICE_PG_BENCH_RTT_MS=n` puts a proxy in front of the server that holds every answer
//! n ms (a remote database's round trip; Tokio's timers are 1 ms coarse).

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
            let server = PgServer::start();
            let url = server.database();
            (Some(server), url, "harness server, fsync=off")
        }
    };
    let (url, note) = match std::env::var("SLUICE_PG_BENCH_RTT_MS") {
        Ok(ms) => {
            let ms: u64 = ms.parse().expect("SLUICE_PG_BENCH_RTT_MS: milliseconds");
            (
                slow_link(&url, Duration::from_millis(ms)).await,
                format!("{note}, {ms} ms round trips"),
            )
        }
        Err(_) => (url, note.to_string()),
    };
    let pg = Arc::new(Store::open_pg(url).await);
    let lite = Arc::new(Store::sqlite().await);
    println!("reserve+settle pairs/s ({note}; SQLite synchronous=normal)");
    let stats = || pg.writer.stats();
    for callers in [1, 16, 64] {
        let before = stats();
        let p = pairs_per_second(&pg, callers).await;
        let after = stats();
        let s = pairs_per_second(&lite, callers).await;
        println!(
            "callers {callers:>3}: postgres {p:>8.0} ({:.1} jobs/batch, {} retries)   sqlite {s:>8.0}",
            (after.jobs - before.jobs) as f64 / (after.batches - before.batches).max(1) as f64,
            after.retries - before.retries
        );
    }
}

/// A proxy to `url`'s server that holds every chunk the server sends for `rtt`: each round
/// trip takes at least that long. Returns the URL through it.
async fn slow_link(url: &str, rtt: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut target = url::Url::parse(url).unwrap();
    let server = format!("{}:{}", target.host_str().unwrap(), target.port().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::TcpStream::connect(&server).await.unwrap();
            client.set_nodelay(true).unwrap();
            upstream.set_nodelay(true).unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut ur, mut uw) = upstream.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut uw).await });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match ur.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    tokio::time::sleep(rtt).await;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    target.set_port(Some(port)).unwrap();
    target.to_string()
}

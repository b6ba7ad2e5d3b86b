//! Micro-benchmark of the quota CAS alone: `Quota::reserve` then `Held::settle`, from
//! `--clients` concurrent tasks on one current-thread runtime (like one HTTP worker), on a
//! fresh SQLite file, with `synchronous = normal` and then `= full`.
//!
//!     cargo run --release --example quota_cas -- [--seconds 3] [--clients 1,16,64]
//!
//! Prints, per setting and concurrency: reservations + settlements per second (pairs/s),
//! p50 / p99 / p99.9 latency of a reserve and of a settle, the process CPU time per pair,
//! and (when the writer exposes it) the average jobs per write transaction.
//! A benchmark, not a test: it asserts nothing. Pin it (`taskset -c 0`) to compare runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::SystemClock;
use sluice::quota::period::Reset;
use sluice::quota::reservation::Quota;
use sluice::store::ledger::Owner;
use sluice::store::Db;

struct Args {
    seconds: u64,
    clients: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 3,
        clients: vec![1, 16, 64],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        match argv[i].as_str() {
            "--seconds" => a.seconds = argv[i + 1].parse().unwrap_or(a.seconds),
            "--clients" => {
                a.clients = argv[i + 1]
                    .split(',')
                    .filter_map(|c| c.parse().ok())
                    .collect()
            }
            _ => {}
        }
        i += 2;
    }
    a
}

/// CPU time of this process (user + system), from /proc (Linux), in microseconds.
fn cpu_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000) // USER_HZ = 100 on Linux
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

async fn setup(dir: &std::path::Path, full: bool) -> (Db, Owner) {
    let db = Db::open(&dir.join("cas.db"), full).await.expect("open");
    let at = "2026-01-01T00:00:00.000Z";
    for sql in [
        "INSERT INTO teams (id, name, limit_micros, remaining_micros, reset, period, created_at) VALUES (1, 'team', 1000000000000000, 1000000000000000, 'monthly', '', ?)",
        "INSERT INTO users (id, username, team_id, reset, created_at) VALUES (1, 'user', 1, 'never', ?)",
        "INSERT INTO tokens (id, user_id, token_hash, prefix, limit_micros, remaining_micros, reset, period, created_at)
         VALUES (1, 1, x'01', 'abcdefgh', 1000000000000000, 1000000000000000, 'never', 'never', ?)",
    ] {
        sqlx::query(sql).bind(at).execute(&db.sqlite().write).await.expect("setup");
    }
    let owner = Owner {
        token_id: 1,
        user_id: 1,
        team_id: 1,
        resets: [Reset::Never, Reset::Never, Reset::Monthly],
    };
    (db, owner)
}

async fn run(full: bool, clients: usize, seconds: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, owner) = setup(dir.path(), full).await;
    let quota = Quota::new(&db, Arc::new(SystemClock), "bench".into());
    // Warm-up (statements prepared, pages cached).
    for i in 0..200 {
        let held = quota
            .reserve(&format!("warm-{i}"), &owner, 1_000)
            .await
            .expect("reserve");
        held.settle(400).await;
    }
    let before = stats(&quota);
    let cpu0 = cpu_us();
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (quota, owner) = (quota.clone(), owner.clone());
            tokio::spawn(async move {
                let (mut res, mut set) = (Vec::new(), Vec::new());
                let mut n = 0u64;
                while Instant::now() < until {
                    let id = format!("c{c}-{n}");
                    n += 1;
                    let t = Instant::now();
                    let held = quota.reserve(&id, &owner, 1_000).await.expect("reserve");
                    res.push(t.elapsed());
                    let t = Instant::now();
                    held.settle(400).await;
                    set.push(t.elapsed());
                }
                (res, set)
            })
        })
        .collect();
    let (mut res, mut set) = (Vec::new(), Vec::new());
    for t in tasks {
        let (r, s) = t.await.expect("task");
        res.extend(r);
        set.extend(s);
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(cpu_us()).map(|(a, b)| b.saturating_sub(a));
    res.sort_unstable();
    set.sort_unstable();
    let pairs = set.len() as f64;
    let batch = match (before, stats(&quota)) {
        (Some((b0, j0)), Some((b1, j1))) if b1 > b0 => {
            format!("{:.1}", (j1 - j0) as f64 / (b1 - b0) as f64)
        }
        _ => "-".into(),
    };
    println!(
        "{:<6} {:>7} {:>10.0} {:>9.0} {:>9.0} {:>10.0} {:>9.0} {:>9.0} {:>10.0} {:>12} {:>6}",
        if full { "full" } else { "normal" },
        clients,
        pairs / wall,
        pct(&res, 0.50),
        pct(&res, 0.99),
        pct(&res, 0.999),
        pct(&set, 0.50),
        pct(&set, 0.99),
        pct(&set, 0.999),
        cpu.map_or("-".into(), |c| format!("{:.0}", c as f64 / pairs)),
        batch,
    );
    drop(quota);
    db.close().await;
}

/// (write transactions, jobs) of the quota's writer, if this build has one.
fn stats(quota: &Quota) -> Option<(u64, u64)> {
    let s = quota.writer().stats();
    Some((s.batches, s.jobs))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = args();
    println!(
        "quota CAS: reserve + settle per pair, {} s per row, one current-thread runtime",
        a.seconds
    );
    println!(
        "{:<6} {:>7} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>12} {:>6}",
        "sync",
        "clients",
        "pairs/s",
        "res p50",
        "res p99",
        "res p99.9",
        "set p50",
        "set p99",
        "set p99.9",
        "cpu us/pair",
        "batch"
    );
    println!(
        "{:<6} {:>7} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10}",
        "", "", "", "(µs)", "(µs)", "(µs)", "(µs)", "(µs)", "(µs)"
    );
    for full in [false, true] {
        for &c in &a.clients {
            run(full, c, a.seconds).await;
        }
    }
}

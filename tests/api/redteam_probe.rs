//! Red-team findings on the cache agreement check (lexical embedder): an en dash or em
//! dash used as a minus sign is dropped as punctuation (`is_quote_or_dash`), so a
//! question about a negative number is answered from the cache with the positive one's
//! answer (fixed: a dash before a number is a minus sign, kept as a token).
use sluice::cache::meaning;

fn hit(a: &str, b: &str) -> bool {
    let t = sluice::config::CacheSettings::default().similarity_threshold as f32;
    meaning::lexical_match(a, b, false, t)
}

#[test]
fn redteam_en_dash_minus_sign_is_not_dropped() {
    for (a, b) in [
        ("What is –3 × 4?", "What is 3 × 4?"),
        ("Is x > –1?", "Is x > 1?"),
        (
            "The temperature is –5 °C, do I need a coat?",
            "The temperature is 5 °C, do I need a coat?",
        ),
        ("What is 10 – 3?", "What is 10 3?"),
    ] {
        assert!(!hit(a, b), "a false hit: {a} ~ {b}");
    }
}

/// Breaker probe counting: a finished probe frees the *newest* probe's slot
/// (`probes.pop()`, src/upstream/breaker.rs `success`/`abandon`/`unanswered`), so the older,
/// finished probe's start time stays behind; once it is `half_open_max_wait_seconds` old,
/// `admit` calls it hung and re-opens the breaker though the probe still out is young and
/// the finished one succeeded (with `open_seconds = 0` it goes straight back to half-open,
/// its successes forgotten). Fixed: a `Permit` frees its own start time (takes ~2.3 s).
#[test]
fn redteam_a_finished_probe_is_not_left_behind_as_hung() {
    use sluice::config::BreakerSettings;
    use sluice::upstream::breaker::{Breaker, State};
    use std::time::Duration;
    let cfg = BreakerSettings {
        failure_threshold: 1,
        open_seconds: 0,
        half_open_probes: 2,
        close_after_successes: 2,
        half_open_max_wait_seconds: 2,
        ..BreakerSettings::default()
    };
    let b = std::sync::Arc::new(Breaker::new(&cfg));
    assert!(b.failure(false), "opens");
    // Probe A out at t=0 (the breaker goes half-open). The request path holds a `Permit`.
    let a = b.permit().expect("probe A");
    std::thread::sleep(Duration::from_millis(1500));
    // Probe B out at t=1.5.
    let b_probe = b.permit().expect("probe B");
    // A answers well at t=1.5.
    a.success();
    std::thread::sleep(Duration::from_millis(800));
    // t=2.3: only B is out, and it is 0.8 s old: nothing has hung.
    // (A third caller comes; A's slot is free, so it may probe.)
    let _ = b.admit();
    // B answers well too: two successful probes of two close the breaker.
    b_probe.success();
    assert_eq!(
        b.state(),
        State::Closed,
        "the finished probe A's start time was taken for a hung probe: re-opened, count reset"
    );
}

/// Sign-in throttle after a clock step back: attempts stamped by a clock that ran ahead
/// (then stepped back, or another replica's) keep counting until their own time plus the
/// window, but `Retry-After` is clamped to one window (`over_limit`, src/auth/throttle.rs):
/// an admin who waits exactly as told is refused again, for as long as the step. Fixed: the
/// wait is what the attempts say (a lock is never shortened by a clock, so it may be longer
/// than a window; `sluice admin unlock` lifts it).
#[tokio::test]
async fn redteam_retry_after_is_honest_after_a_clock_step_back() {
    use chrono::{Duration, Utc};
    use sluice::auth::throttle::USER_LIMIT;
    let dir = tempfile::tempdir().unwrap();
    let db = sluice::store::Db::open(&dir.path().join("t.db"), false)
        .await
        .unwrap();
    let now = Utc::now();
    // Five failures stamped while the clock was an hour ahead.
    let ahead = now + Duration::hours(1);
    for _ in 0..USER_LIMIT {
        assert!(
            attempt(&db, "root", "10.0.0.1", ahead).await.is_ok(),
            "admitted up to the limit"
        );
    }
    // The clock steps back; the admin is told when to come back.
    let retry = attempt(&db, "root", "10.0.0.2", now)
        .await
        .expect_err("a sixth attempt");
    let back = now + Duration::seconds(retry as i64 + 1);
    assert!(
        attempt(&db, "root", "10.0.0.2", back).await.is_ok(),
        "refused again after waiting the Retry-After ({retry} s) it was given"
    );
}

/// A sign-in attempt at `name` from `addr`, by a clock that reads `at`: admitted (the
/// attempt kept, as a failure), or refused for this many seconds.
async fn attempt(
    db: &sluice::store::Db,
    name: &str,
    addr: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), u64> {
    use sluice::auth::throttle::{admit, Admission};
    let clock = sluice::clock::ManualClock::new(at);
    match admit(db, name, addr, &clock).await.unwrap() {
        Admission::Admitted(a) => {
            std::mem::forget(a);
            Ok(())
        }
        Admission::Refused { retry_after } => Err(retry_after),
    }
}

async fn admit_root(db: &sluice::store::Db, addr: &str, at: chrono::DateTime<chrono::Utc>) -> bool {
    attempt(db, "root", addr, at).await.is_ok()
}

async fn login_failures(db: &sluice::store::Db) -> i64 {
    let mut c = db.sqlite().write.acquire().await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM login_failures")
        .fetch_one(&mut *c)
        .await
        .unwrap()
}

/// A process whose clock runs a day ahead (another replica, or this host before a step
/// back) recorded an attempt, and its sweep of "rows older than a day" took every other
/// process's attempts with it: the name locked at the right clock was open again.
#[tokio::test]
async fn redteam_a_process_a_day_ahead_does_not_sweep_other_processes_attempts() {
    use chrono::{Duration, Utc};
    use sluice::auth::throttle::USER_LIMIT;
    let dir = tempfile::tempdir().unwrap();
    let db = sluice::store::Db::open(&dir.path().join("t.db"), false)
        .await
        .unwrap();
    let now = Utc::now();
    for _ in 0..USER_LIMIT {
        assert!(admit_root(&db, "10.0.0.1", now).await);
    }
    assert!(
        !admit_root(&db, "10.0.0.2", now).await,
        "locked at the right clock"
    );
    // The process a day ahead does not see those attempts (a day old by its clock) and
    // admits one at another name, recording it (and, before the fix, sweeping).
    let ahead = now + Duration::days(1) + Duration::minutes(1);
    let before = login_failures(&db).await;
    assert!(
        attempt(&db, "other", "10.0.0.3", ahead).await.is_ok(),
        "a fresh name"
    );
    let after = login_failures(&db).await;
    assert_eq!(after, before + 2, "the process a day ahead swept attempts");
    // Back at the right clock, a minute later: the name is still locked.
    assert!(
        !admit_root(&db, "10.0.0.2", now + Duration::minutes(1)).await,
        "the name was unlocked by another process's clock"
    );
}

/// The host's clock ran a day ahead for a while; twenty wrong sign-ins from one address
/// (the office's NAT, or a reverse proxy without `trusted_proxies`: everyone) were stamped
/// with it, then the clock stepped back. That address is locked for a day and a window —
/// honest, but far longer than any guess earns — and the documented way out of a lock a bad
/// clock made too long, `sluice admin unlock`, lifted only the name's count: the admin at
/// that address was still refused for a day.
#[tokio::test]
async fn redteam_unlock_lifts_an_address_lock_a_clock_running_ahead_made() {
    use chrono::{Duration, Utc};
    use sluice::auth::throttle::ADDR_LIMIT;
    let dir = tempfile::tempdir().unwrap();
    let db = sluice::store::Db::open(&dir.path().join("t.db"), false)
        .await
        .unwrap();
    let now = Utc::now();
    sluice::cli::admin_create(
        &db,
        "root",
        "admin",
        None,
        "a password of length".into(),
        now,
    )
    .await
    .unwrap();
    let ahead = now + Duration::days(1);
    for i in 0..ADDR_LIMIT {
        let clock = sluice::clock::ManualClock::new(ahead);
        match sluice::auth::throttle::admit(&db, &format!("u{i}"), "198.51.100.7", &clock)
            .await
            .unwrap()
        {
            sluice::auth::throttle::Admission::Admitted(a) => std::mem::forget(a),
            sluice::auth::throttle::Admission::Refused { .. } => panic!("attempt {i}"),
        }
    }
    assert!(
        !admit_root(&db, "198.51.100.7", now).await,
        "the address is locked"
    );
    sluice::cli::admin_unlock(&db, "root", now).await.unwrap();
    assert!(
        admit_root(&db, "198.51.100.7", now).await,
        "after `sluice admin unlock root`, root at that address is still refused for a day"
    );
}

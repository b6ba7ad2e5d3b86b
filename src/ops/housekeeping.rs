//! Background tasks of a running gateway: the token-cache refresh (revocations within 1 s),
//! the process heartbeat, settling reservations of processes that died, and the sweep of
//! this process's own reservations (released when no live request holds them, leases
//! renewed while one does), the scheduled backup, the sweep of stored responses past
//! their retention, and the sweep of the spend rollup's admitted tag places of past days.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::ops::metrics;
use crate::quota::reservation::{Quota, RESERVATION_LEASE};
use crate::state::AppState;
use crate::store::ledger::{self, Orphans};
use crate::store::processes::{self, Me};
use crate::store::Db;
use crate::upstream::live::Refreshed;

const AUTH_POLL: Duration = Duration::from_millis(250);
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long an orphan record of an owner that is no longer registered is kept for its
/// owner's late settlement (generous: the pruner's clock may be off).
const ORPHANS_KEPT: chrono::Duration = chrono::Duration::days(7);
/// Cache invalidations from other replicas are picked up within this.
const CACHE_POLL: Duration = Duration::from_secs(1);
/// Cache polls between two evictions of expired entries (a minute).
const EVICT_ROUNDS: u64 = 60 / CACHE_POLL.as_secs();
/// Cache polls between two rebuilds of its indexes (`cache::REBUILD_EVERY`).
const REBUILD_ROUNDS: u64 = crate::cache::REBUILD_EVERY.as_secs() / CACHE_POLL.as_secs();

/// What the cache poll's `round`-th tick (from 0) does besides its refresh: whether it
/// evicts, and whether it rebuilds the indexes — each at the last tick of its period.
fn cache_chores(round: u64) -> (bool, bool) {
    let last_of = |period: u64| round % period == period - 1;
    (last_of(EVICT_ROUNDS), last_of(REBUILD_ROUNDS))
}

/// How often the scheduled backup checks whether one is due (the first check at start).
const BACKUP_POLL: Duration = Duration::from_secs(60);

/// How often replicas exchange key cooldowns through Redis.
const COOLDOWN_SYNC: Duration = Duration::from_millis(250);

/// Rebuilds the catalog if the managed keys or models changed (`upstream::live`); a
/// rebuild that fails keeps the catalog in use, is tried again at every poll, and is
/// alerted once per reason (`catalog_stale`).
async fn follow_catalog(state: &AppState) {
    match state.live.refresh(&state.db).await {
        Refreshed::Rebuilt => {
            tracing::info!("upstream catalog rebuilt: the managed keys or models changed")
        }
        Refreshed::Unchanged => {}
        Refreshed::Failed { error, news } => {
            if news {
                state.alerts.raise(
                    "catalog_stale",
                    "catalog",
                    &format!("The managed keys or models changed but the catalog could not be rebuilt; still serving the one in use: {error}"),
                );
            }
        }
    }
    metrics::catalog_stale(state.live.stale());
}

pub fn spawn(state: Arc<AppState>, me: Me) {
    tokio::spawn(sweep_stored_responses(state.clone()));
    tokio::spawn(sweep_tag_places(state.clone()));
    tokio::spawn(forecast_alerts(state.clone()));
    if state.settings.backup.interval_hours > 0 && state.db.backs_up_to_file() {
        tokio::spawn(scheduled_backups(state.clone()));
    } else if state.settings.backup.interval_hours > 0 {
        tracing::info!(
            "no scheduled backup: {}",
            crate::store::backup::NO_FILE_BACKUP
        );
    }
    if state.windows.uses_redis() {
        tokio::spawn(share_cooldowns(state.clone()));
    }
    let c = state.clone();
    let k = state.clone();
    state.auth.hear_changes(
        move || {
            let c = c.clone();
            tokio::spawn(async move {
                if let Err(e) = c.cache.refresh(c.cache_now()).await {
                    tracing::warn!(error = %e, "cache refresh failed");
                }
            });
        },
        move || {
            let k = k.clone();
            tokio::spawn(async move { follow_catalog(&k).await });
        },
    );
    let k = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(AUTH_POLL);
        loop {
            tick.tick().await;
            follow_catalog(&k).await;
        }
    });
    let s = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(AUTH_POLL);
        loop {
            tick.tick().await;
            if let Err(e) = s.auth.refresh(&*s.clock).await {
                tracing::warn!(error = %e, "token cache refresh failed");
            }
        }
    });
    if state.windows.uses_redis() {
        let s = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(AUTH_POLL);
            let mut was = false;
            loop {
                tick.tick().await;
                let now = s.windows.degraded();
                if now && !was {
                    s.alerts.raise(
                        "ratelimit_degraded",
                        "redis",
                        "Redis failed: rate limits fall back to per-replica local windows",
                    );
                }
                was = now;
            }
        });
    }
    let c = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CACHE_POLL);
        for round in 0u64.. {
            tick.tick().await;
            let now = c.cache_now();
            if let Err(e) = c.cache.refresh(now).await {
                tracing::warn!(error = %e, "cache refresh failed");
            }
            let (evict, rebuild) = cache_chores(round);
            if evict {
                if let Err(e) = c.cache.evict(now).await {
                    tracing::warn!(error = %e, "cache eviction failed");
                }
            }
            if rebuild {
                if let Err(e) = c.cache.rebuild(now).await {
                    tracing::warn!(error = %e, "cache rebuild failed");
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        loop {
            tick.tick().await;
            let now = state.clock.now();
            // Leases renewed before the beat: a lease is expired when it is older than its
            // owner's latest heartbeat (`Orphans::LeaseExpired`).
            if let Err(e) = sweep_own(&state.quota, &state.db, now).await {
                tracing::warn!(error = %e, "sweeping this process's reservations failed");
            }
            match processes::heartbeat(&state.db, &me, now).await {
                Ok(true) => {
                    tracing::warn!(process = %me.id, "this process had been taken for gone (a stall past the stale window?); registered again")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
            if let Err(e) = recover_orphans(&state, &me).await {
                tracing::warn!(error = %e, "orphan recovery failed");
            }
            let w = state.quota.writer().stats();
            tracing::debug!(target: "sluice::store::writer", batches = w.batches, jobs = w.jobs,
                failed_batches = w.failed_batches, "store writer: write transactions and jobs so far");
        }
    });
}

/// Takes a backup whenever one is due (`ops::backup::backup_if_due`); a failure raises
/// `backup_failed` and is tried again at the next check.
/// How often budgets are projected for `budget_exhaustion_forecast` (and the weekly digest
/// looked at), and how long after start the first time.
const FORECAST_CHECK: Duration = Duration::from_secs(3600);
const FORECAST_FIRST: Duration = Duration::from_secs(300);

/// Raises `budget_exhaustion_forecast` for budgets about to run out (`finance::alerts`)
/// and sends last week's digest per team (`finance::digest`); every replica checks, one
/// sends per subject and day (digest: per team and week).
async fn forecast_alerts(state: Arc<AppState>) {
    // The first check waits a while: a digest is read in several queries, which must not
    // straddle the writes of a start-up (a restore, a migration, a test seeding its log).
    let first = tokio::time::Instant::now() + FORECAST_FIRST;
    let mut tick = tokio::time::interval_at(first, FORECAST_CHECK);
    loop {
        tick.tick().await;
        if let Err(e) = crate::finance::alerts::check(&state).await {
            tracing::warn!(error = %e, "budget forecast check failed");
        }
        if let Err(e) = crate::finance::digest::send(&state).await {
            tracing::warn!(error = %e, "weekly digest failed");
        }
    }
}

/// How often stored responses past their retention are deleted, and how long after start
/// the first time.
const RESPONSES_SWEEP: Duration = Duration::from_secs(600);
const RESPONSES_SWEEP_FIRST: Duration = Duration::from_secs(60);

/// Deletes stored responses older than `[responses] retention_days` (reads already ignore
/// them: `pipeline::responses::oldest_kept`). Not at start: the batches would take turns on
/// the write connection with a starting fleet's first requests, and a test seeding old rows
/// just after start raced the sweep (`responses::the_retention_sweep_deletes_a_backlog_batch_by_batch`
/// found 7 rows of its 1 007 left for its first batch).
async fn sweep_stored_responses(state: Arc<AppState>) {
    let first = tokio::time::Instant::now() + RESPONSES_SWEEP_FIRST;
    let mut tick = tokio::time::interval_at(first, RESPONSES_SWEEP);
    loop {
        tick.tick().await;
        let before = crate::pipeline::responses::oldest_kept(&state);
        match crate::store::responses::sweep(&state.db, before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "stored responses past their retention swept"),
            Err(e) => tracing::warn!(error = %e, "stored responses sweep failed"),
        }
    }
}

/// How often the spend rollup's admitted tag places of past days are deleted, and how long
/// after start the first time.
const TAG_PLACES_SWEEP: Duration = Duration::from_secs(3600);
const TAG_PLACES_FIRST: Duration = Duration::from_secs(300);

/// Deletes the tag keys, values and sets admitted for days before yesterday
/// (`store::tag_bound::sweep`): only today's and yesterday's rows are still written.
async fn sweep_tag_places(state: Arc<AppState>) {
    // Not at start: a past day's rows written just after start (a test seeding its log)
    // would have their places swept in between, and count against the bound anew.
    let first = tokio::time::Instant::now() + TAG_PLACES_FIRST;
    let mut tick = tokio::time::interval_at(first, TAG_PLACES_SWEEP);
    loop {
        tick.tick().await;
        match crate::store::tag_bound::sweep(&state.db, state.clock.now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "spend rollup's tag places of past days swept"),
            Err(e) => tracing::warn!(error = %e, "spend rollup's tag places sweep failed"),
        }
    }
}

async fn scheduled_backups(state: Arc<AppState>) {
    let b = &state.settings.backup;
    // Ten years at most: chrono's durations end at about 292 million years.
    let interval = chrono::Duration::hours(b.interval_hours.min(24 * 365 * 10) as i64);
    let dir = std::path::PathBuf::from(&b.dir);
    let mut tick = tokio::time::interval(BACKUP_POLL);
    loop {
        tick.tick().await;
        match crate::ops::backup::backup_if_due(
            &state.db,
            &dir,
            b.keep,
            interval,
            state.clock.now(),
        )
        .await
        {
            Ok(Some(path)) => tracing::info!(path = %path.display(), "scheduled backup written"),
            Ok(None) => {}
            Err(e) => state.alerts.raise(
                "backup_failed",
                &b.dir,
                &format!("scheduled backup failed: {e}"),
            ),
        }
    }
}

/// Settles the reservations of every process that is gone, and those whose lease ran out;
/// returns how many.
pub async fn recover_orphans(state: &AppState, me: &Me) -> Result<u64, crate::store::StoreError> {
    let now = state.clock.now();
    let mut settled = 0;
    // Back from an outage that ended every session (its own too), a host cannot tell the
    // others' stale heartbeats from death until they have had the time to beat again.
    let judging = processes::may_judge(&state.db, me).await?;
    let gone = match judging {
        true => processes::dead_owners(&state.db, me, now).await?,
        false => Vec::new(),
    };
    for owner in gone {
        let n = ledger::settle_orphans(&state.db, Orphans::OfOwner(&owner), now).await?;
        if n > 0 {
            tracing::warn!(owner = %owner, reservations = n, "settled orphaned reservations at their reserved amount");
        }
        settled += n;
    }
    // A lease its owner let run out by its own clock: it beats but does not sweep.
    let expired = ledger::settle_orphans(&state.db, Orphans::LeaseExpired, now).await?;
    if expired > 0 {
        tracing::warn!(
            reservations = expired,
            "settled reservations whose lease ran out at their reserved amount"
        );
    }
    if judging {
        processes::prune(&state.db, me, now).await?;
    }
    ledger::prune_orphaned(&state.db, now - ORPHANS_KEPT).await?;
    Ok(settled + expired)
}

/// This process's own reservations: one that no live request holds (its holder vanished
/// without settling — a bug, or a crash of a task) is released at once, nothing charged;
/// one that a live request holds gets its lease renewed before it runs out. Then the
/// reservations this process answered with an unknown COMMIT outcome are settled at 0,
/// open or already settled as orphans by another host (`Quota::settle_unsure`) — last, so
/// a failure there never holds up the renewals.
pub async fn sweep_own(
    quota: &Quota,
    db: &Db,
    now: DateTime<Utc>,
) -> Result<(), crate::store::StoreError> {
    let renew_before = crate::clock::db_time(now + RESERVATION_LEASE / 2);
    let (mut renew, mut unheld) = (Vec::new(), Vec::new());
    for (id, deadline) in ledger::own_reservations(db, quota.process_id()).await? {
        if quota.is_live(&id) {
            if deadline < renew_before {
                renew.push(id);
            }
        } else {
            unheld.push(id);
        }
    }
    // The live leases first, and each step tried whatever another's fate: a failed release
    // stopped the pass before the renewals, the heartbeat went on, and five minutes later
    // live requests' reservations were charged in full as orphans (s29 money attack F3).
    // The first error is reported at the end.
    let mut first = None;
    if !renew.is_empty() {
        if let Err(e) = ledger::renew_leases(db, &renew, now + RESERVATION_LEASE).await {
            first.get_or_insert(e);
        }
    }
    for id in unheld {
        match quota.release_unheld(&id).await {
            Ok(true) => {
                tracing::warn!(request_id = %id, "released a reservation no live request held")
            }
            Ok(false) => {}
            // The rest wait for the next pass: a store refusing one refuses them all, each
            // after the writer's own wait.
            Err(e) => {
                first.get_or_insert(e);
                break;
            }
        }
    }
    if let Err(e) = quota
        .settle_unsure(crate::quota::reservation::UNSURE_PER_PASS)
        .await
    {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

/// Publishes this replica's key cooldowns to Redis and adopts the other replicas', so a
/// key that answered 429 rests on every replica, not only the one that saw it.
async fn share_cooldowns(state: Arc<AppState>) {
    // Per position: the shared name it was published under, and the latest until.
    let mut published: Vec<(String, i64)> = Vec::new();
    let mut tick = tokio::time::interval(COOLDOWN_SYNC);
    loop {
        tick.tick().await;
        let Some(redis) = state.windows.redis() else {
            continue;
        };
        // The catalog of the moment: deployments added since (managed keys, SIGHUP) are
        // shared too; positions never change, so `published` only grows. A cooldown is
        // shared under the upstream's id and its key (`Deployment::shared_name`): a key
        // rotated since does not get the old one's cooldown back from the others.
        let live = state.live.snapshot();
        let ids: Vec<String> = live
            .catalog
            .deployments
            .iter()
            .map(|d| d.shared_name())
            .collect();
        published.resize(ids.len(), (String::new(), 0));
        for (p, id) in published.iter_mut().zip(&ids) {
            if p.0 != *id {
                *p = (id.clone(), 0);
            }
        }
        // The pool's rests are on this process's monotonic clock; what Redis holds beside
        // their time left is the wall instant they end (the others read only the time left).
        let (now, wall) = (
            state.clock.monotonic_ms(),
            state.clock.now().timestamp_millis(),
        );
        let mut publish = Vec::new();
        for (d, id) in ids.iter().enumerate() {
            let until = live.pool.cooling_until_ms(d);
            if until > now && until > published[d].1 {
                let left = until - now;
                publish.push((id.clone(), wall.saturating_add(left), left as u64));
                published[d].1 = until;
            }
        }
        // Another replica's cooldown is taken as the time it has left, on this clock, and
        // no longer than a 429 may rest a key here.
        let cap = Duration::from_secs(state.settings.retry.max_cooldown_seconds);
        match redis.sync_cooldowns(&publish, &ids).await {
            Ok(left) => {
                // A key rotated during the exchange: what Redis holds under its old name is
                // not the new key's to take (the pool's members outlive the snapshot).
                let current = state.live.snapshot();
                let now = state.clock.monotonic_ms();
                for (d, left) in left.into_iter().enumerate() {
                    let same_key = current
                        .catalog
                        .deployments
                        .get(d)
                        .is_some_and(|dep| dep.shared_name() == ids[d]);
                    let Some(left) = left.filter(|_| same_key).map(Duration::from_millis) else {
                        continue;
                    };
                    let pool = &current.pool;
                    if left > cap {
                        // Longer than a 429 may rest a key (an older version's, uncapped):
                        // taken once at the cap and published back at it — read again at
                        // the cap every exchange, it rested the key until its own expiry.
                        if pool.cooling_ms(d, now) == 0 {
                            pool.cool_down(d, now, cap);
                        }
                        published[d].1 = 0;
                    } else {
                        pool.cool_down(d, now, left);
                        // What Redis holds, not this replica's own rest: a 429 of its own
                        // met during the exchange is still to publish (s24 final attack #3).
                        let held =
                            now.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX));
                        published[d].1 = published[d].1.max(held);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "sharing key cooldowns failed"),
        }
    }
}

#[cfg(test)]
mod cache_schedule_tests {
    use super::*;

    /// Over the first 20 minutes of polls: an eviction at the end of each minute, a rebuild
    /// at the end of each `REBUILD_EVERY` (10 minutes) — the backstop that forgets other
    /// replicas' deletions and reads rows a refresh passed over.
    #[test]
    fn the_cache_evicts_every_minute_and_rebuilds_every_ten() {
        let at = |round: u64| (round + 1) * CACHE_POLL.as_secs();
        let rounds = 0..20 * 60 / CACHE_POLL.as_secs();
        let evictions: Vec<u64> = rounds
            .clone()
            .filter(|r| cache_chores(*r).0)
            .map(at)
            .collect();
        assert_eq!(evictions, (1..=20).map(|m| m * 60).collect::<Vec<_>>());
        let rebuilds: Vec<u64> = rounds.filter(|r| cache_chores(*r).1).map(at).collect();
        assert_eq!(rebuilds, [600, 1200]);
        assert_eq!(crate::cache::REBUILD_EVERY.as_secs(), 600);
    }
}

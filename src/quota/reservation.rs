//! A held reservation. `Quota::reserve` runs the CAS; the returned `Held` must be settled
//! with the actual cost. Nothing a request holds can be left behind:
//! - a caller that goes away while its reservation waits for the writer (the future is
//!   dropped) leaves a `Pending` guard behind: the writer skips the job if it has not run
//!   yet, and if it has, the guard releases it (settled at 0: nothing was served);
//! - a `Held` dropped unsettled (the client went away while the handler awaited the
//!   upstream) settles itself in the background at the cost given by
//!   `set_cost_if_dropped` (0 until the upstream may be working, then the counted input);
//! - a settlement that fails on a store error is retried in the background until it lands;
//!   the caller gets the amounts at once (they are decided here, not by the store), so the
//!   client's answer never waits for a retry and the request log and the ledger agree;
//! - every reservation a live request holds is in this process's `live` set; the
//!   housekeeping's sweep releases any of this process's reservations that no live request
//!   holds, and renews the lease (`deadline`) of those that one does;
//! - a reservation whose batch's COMMIT went unanswered (`StoreError::CommitUnknown`: the
//!   request is answered 503 and reaches no upstream, but the row may have landed) is
//!   remembered (`unsure`), and the sweep settles it at 0 — open, or already settled as an
//!   orphan by another host that took this one for gone meanwhile (`settle_unsure`).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::QuotaError;
use crate::clock::Clock;
use crate::store::ledger::{self, Owner, Refusal, Reservation, ReserveRequest, Settled};
use crate::store::writer::Writer;
use crate::store::StoreError;

pub struct Quota {
    /// The group-commit writer: reservations and settlements of concurrent requests share
    /// one transaction (see `store::writer`).
    writer: Writer,
    clock: Arc<dyn Clock>,
    /// This process's id, the owner of its reservations (see `store::processes`).
    process_id: String,
    /// The reservations live requests of this process hold (or are about to): a count per
    /// request-id hash, so entering and leaving costs no allocation. Two ids sharing a hash
    /// count twice, so neither leaves while the other is held.
    live: Mutex<HashMap<u64, u32>>,
    /// The runtime that built the quota (the gateway's own, which outlives the workers):
    /// where background settlements run. A reservation dropped as a worker stops — its
    /// runtime going, a spawn there would never run — still settles.
    runtime: Option<tokio::runtime::Handle>,
    /// Wakes every settlement waiting to retry (`retry_settlements_now`): at the exit, so
    /// a store freed within its wait is seen at once, while retries otherwise back off.
    retry_now: tokio::sync::Notify,
    /// Reservations this process answered with `StoreError::CommitUnknown`: they may have
    /// landed though their request failed (503) and never reached an upstream, so they owe
    /// nothing. In memory only: the rows of a previous incarnation of this host (a crash,
    /// whose requests may have reached an upstream) are never among them and keep their
    /// orphan charge. Settled at 0 by the sweep (`settle_unsure`).
    unsure: Mutex<HashMap<Arc<str>, Unsure>>,
}

/// An unsure reservation's state in the sweep.
#[derive(Default)]
struct Unsure {
    /// Since when every settlement tried found nothing (the COMMIT did not land, or has not
    /// yet, or another host's orphan sweep was committing as it ran): forgotten once that
    /// has lasted `UNSURE_QUIET`.
    quiet_since: Option<std::time::Instant>,
}

/// How long an unsure reservation is looked for after the first sweep that found nothing:
/// several sweeps (every 5 s), past a COMMIT that lands late and past another host's
/// orphan sweep running at the same moment (whose row a statement begun before its commit
/// does not see).
const UNSURE_QUIET: Duration = Duration::from_secs(30);

/// Most unsure reservations one sweep settles (`Quota::settle_unsure`): one writer batch.
pub const UNSURE_PER_PASS: usize = 256;

/// Most unsure reservations remembered (a bound on memory in a long outage; past it, one
/// that did land is charged as an orphan as before).
const MAX_UNSURE: usize = 100_000;

/// How long a reservation's lease runs: the owner renews it while a live request holds
/// the reservation; past it, any process may settle it as an orphan (`ledger::Orphans`).
pub const RESERVATION_LEASE: chrono::Duration = chrono::Duration::minutes(10);

impl Quota {
    /// Starts a writer of its own over the database's write connection.
    pub fn new(db: &crate::store::Db, clock: Arc<dyn Clock>, process_id: String) -> Arc<Self> {
        Self::with_writer(Writer::start(db), clock, process_id)
    }

    /// Shares a writer (the gateway shares it with the request log).
    pub fn with_writer(writer: Writer, clock: Arc<dyn Clock>, process_id: String) -> Arc<Self> {
        Arc::new(Self {
            writer,
            clock,
            process_id,
            live: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::try_current().ok(),
            retry_now: tokio::sync::Notify::new(),
            unsure: Mutex::new(HashMap::new()),
        })
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    pub fn process_id(&self) -> &str {
        &self.process_id
    }

    /// How many reservations live requests of this process hold (or settle right now).
    pub fn live_count(&self) -> usize {
        self.live.lock().values().map(|n| *n as usize).sum()
    }

    /// Whether a live request of this process holds the reservation of `request_id`.
    pub fn is_live(&self, request_id: &str) -> bool {
        self.live.lock().contains_key(&live_key(request_id))
    }

    fn enter(&self, key: u64) {
        *self.live.lock().entry(key).or_insert(0) += 1;
    }

    fn leave(&self, key: u64) {
        let mut live = self.live.lock();
        if let Some(n) = live.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                live.remove(&key);
            }
        }
    }

    pub async fn reserve(
        self: &Arc<Self>,
        request_id: &str,
        owner: &Owner,
        amount: i64,
    ) -> Result<Held, QuotaError> {
        let key = live_key(request_id);
        self.enter(key);
        let pending = Pending {
            quota: self,
            request_id,
            armed: true,
        };
        let req = ReserveRequest {
            request_id,
            owner,
            amount,
            process: &self.process_id,
            lease: RESERVATION_LEASE,
        };
        // Dropped here (the caller went away) → `Pending::drop` undoes whatever committed.
        let outcome = ledger::reserve_via(&self.writer, &req, self.clock.clone()).await;
        pending.disarm();
        let refusal = match outcome {
            Ok(Ok(resv)) => {
                return Ok(Held {
                    resv: Some(resv),
                    quota: self.clone(),
                    cost_if_dropped: 0,
                })
            }
            Ok(Err(refusal)) => refusal,
            Err(e) => {
                // Nothing of a failed batch is kept (see `store::writer`) — unless its
                // COMMIT was sent: then it may have landed, and the sweep settles it at 0.
                self.leave(key);
                if matches!(e, StoreError::CommitUnknown(_)) {
                    self.note_unsure(request_id);
                }
                return Err(e.into());
            }
        };
        self.leave(key);
        Err(match refusal {
            Refusal::TokenGone => QuotaError::TokenGone,
            Refusal::Rotated(next) => QuotaError::Rotated(next),
            Refusal::Insufficient(level, retry_after) => QuotaError::Insufficient {
                level: level.as_str(),
                retry_after,
            },
        })
    }

    /// Remembers a reservation this process answered with `CommitUnknown` (`unsure`).
    fn note_unsure(&self, request_id: &str) {
        let mut unsure = self.unsure.lock();
        if unsure.len() < MAX_UNSURE {
            unsure.insert(request_id.into(), Unsure::default());
        } else {
            tracing::error!(request_id, "too many reservations of unknown outcome remembered; this one, if it landed, is left to the sweeps");
        }
    }

    /// How many reservations of unknown outcome the sweep still looks for.
    pub fn unsure_count(&self) -> usize {
        self.unsure.lock().len()
    }

    /// Settles at 0 every reservation this process answered with `CommitUnknown` (the
    /// sweep, and the exit): one that landed is released if still open, or corrected to 0
    /// if another host settled it as an orphan meanwhile (`settle_via` takes either) —
    /// its request failed and reached no upstream. One found is forgotten; one not found is
    /// looked for again until `UNSURE_QUIET` has passed; one whose settlement failed stays.
    /// Returns how many were settled; the first store error after trying them all.
    /// At most `max` are tried: the sweep passes `UNSURE_PER_PASS` — it holds up the
    /// heartbeat and orphan recovery, and its jobs queue ahead of live reservations, while a
    /// store hanging on COMMIT could leave thousands (s25 final attack F5).
    pub async fn settle_unsure(&self, max: usize) -> Result<usize, StoreError> {
        let ids: Vec<Arc<str>> = self.unsure.lock().keys().take(max).cloned().collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let outcomes = futures_util::future::join_all(
            ids.iter()
                .map(|id| ledger::settle_via(&self.writer, id.clone(), 0, self.clock.clone())),
        )
        .await;
        let (mut settled, mut failed) = (0, None);
        let mut unsure = self.unsure.lock();
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            match outcome {
                Ok(Some(s)) => {
                    unsure.remove(&id);
                    settled += 1;
                    tracing::warn!(request_id = %id, charged = s.charged, "settled at 0 a reservation whose COMMIT went unanswered (its request failed)");
                }
                Ok(None) => {
                    let quiet = unsure.get_mut(&id).map(|u| {
                        u.quiet_since
                            .get_or_insert_with(std::time::Instant::now)
                            .elapsed()
                    });
                    if quiet.is_some_and(|q| q >= UNSURE_QUIET) {
                        unsure.remove(&id);
                    }
                }
                Err(e) => {
                    if let Some(u) = unsure.get_mut(&id) {
                        u.quiet_since = None;
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(settled),
        }
    }

    /// Releases a reservation of this process that no live request holds (the sweep):
    /// nothing is charged. `false` when it was settled meanwhile.
    pub async fn release_unheld(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(
            ledger::release_via(&self.writer, request_id.into(), self.clock.clone())
                .await?
                .is_some(),
        )
    }

    /// A `Held` with nothing reserved (the benchmark ladder's steps below `quota`).
    pub fn unreserved(self: &Arc<Self>) -> Held {
        Held {
            resv: None,
            quota: self.clone(),
            cost_if_dropped: 0,
        }
    }

    /// Settles the reservation at `actual`, retrying on store errors until it lands (or the
    /// writer is gone: the process is ending, and its shutdown settles what is left). The
    /// reservation stays in the live set until then (`entry`), so the sweep never takes it.
    async fn settle_until_landed(&self, entry: &LiveEntry, actual: i64) -> Option<Settled> {
        let mut pause = Duration::from_millis(50);
        loop {
            let id = entry.id.clone();
            match ledger::settle_via(&self.writer, id, actual, self.clock.clone()).await {
                Ok(settled) => return settled,
                Err(StoreError::WriterGone) => {
                    tracing::error!(request_id = %entry.id, "the store writer is gone; the reservation is left for the shutdown or orphan recovery");
                    return None;
                }
                Err(e) => {
                    let wait = jittered(pause);
                    tracing::warn!(request_id = %entry.id, error = %e, retry_in_ms = wait.as_millis() as u64, "settlement failed; retrying until it lands");
                    // Spread, and at most 5 s apart: settlements failing together in a long
                    // outage do not retry in step. The exit's wait for its last settlements
                    // wakes them (`retry_settlements_now`), so a store freed within it is
                    // seen before the rest are settled at their reserved amounts.
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = self.retry_now.notified() => {}
                    }
                    pause = backoff(pause);
                }
            }
        }
    }

    /// Has every settlement waiting to retry try again now (the exit's wait for them).
    pub fn retry_settlements_now(&self) {
        self.retry_now.notify_waiters();
    }

    /// Settles in the background (the caller does not wait), on the quota's own runtime.
    fn settle_later(entry: LiveEntry, actual: i64) {
        let runtime = match &entry.quota.runtime {
            Some(rt) => Ok(rt.clone()),
            None => tokio::runtime::Handle::try_current(),
        };
        match runtime {
            Ok(rt) => {
                rt.spawn(async move {
                    let quota = entry.quota.clone();
                    quota.settle_until_landed(&entry, actual).await
                });
            }
            Err(_) => {
                tracing::error!(request_id = %entry.id, "reservation dropped outside a runtime; left for orphan recovery")
            }
        }
    }

    /// The live-set entry of a reservation this process already counts as held.
    fn entry(self: &Arc<Self>, id: Arc<str>) -> LiveEntry {
        LiveEntry {
            key: live_key(&id),
            quota: self.clone(),
            id,
        }
    }
}

/// The live set's key of a request id (stable within the process).
fn live_key(request_id: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(request_id)
}

/// A reservation in the live set; leaves it when dropped (after its settlement landed).
struct LiveEntry {
    quota: Arc<Quota>,
    id: Arc<str>,
    key: u64,
}

impl Drop for LiveEntry {
    fn drop(&mut self) {
        self.quota.leave(self.key);
    }
}

/// A reservation on its way through the writer: if the caller goes away before the answer,
/// the reservation is released (the writer skipped it, or it is settled at 0). It owns
/// nothing until then: the id is copied only when it must be released.
struct Pending<'a> {
    quota: &'a Arc<Quota>,
    request_id: &'a str,
    armed: bool,
}

impl Pending<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            Quota::settle_later(self.quota.entry(self.request_id.into()), 0);
        }
    }
}

pub struct Held {
    resv: Option<Reservation>,
    quota: Arc<Quota>,
    cost_if_dropped: i64,
}

impl Held {
    pub fn amount(&self) -> i64 {
        self.resv.as_ref().map(|r| r.amount).unwrap_or(0)
    }

    /// The tightest remaining balance right after reserving.
    pub fn remaining(&self) -> Option<i64> {
        self.resv.as_ref().and_then(|r| r.remaining)
    }

    /// The token's own remaining balance right after reserving.
    pub fn token_remaining(&self) -> Option<i64> {
        self.resv.as_ref().and_then(|r| r.token_remaining)
    }

    /// What settling at `actual` will be recorded as costing (`Settled::charged +
    /// absorbed`): `actual` when something is reserved, 0 when nothing is (no quota). Known
    /// before the settlement lands, for a log row that must not wait on the store.
    pub fn cost_of(&self, actual: i64) -> i64 {
        if self.resv.is_some() {
            actual.max(0)
        } else {
            0
        }
    }

    pub fn set_cost_if_dropped(&mut self, micros: i64) {
        self.cost_if_dropped = micros;
    }

    /// What settling at `actual` charges and absorbs (capped at the reservation: the excess
    /// is `absorbed`), the balances unknown: what `settle` answers when the store did not.
    pub fn decided(&self, actual: i64) -> Settled {
        let actual = if self.resv.is_some() {
            actual.max(0)
        } else {
            0
        };
        let charged = actual.min(self.amount());
        Settled {
            charged,
            absorbed: actual - charged,
            remaining: None,
            token_remaining: None,
        }
    }

    /// Settles at the actual cost (`decided`). Never fails: the amounts are decided here;
    /// if the store fails, the settlement is retried in the background until it lands, and
    /// the balances are then unknown (`None`). Dropped while it waits on the store, it hands
    /// the settlement to that same background retry.
    pub async fn settle(mut self, actual: i64) -> Settled {
        let decided = self.decided(actual);
        let Some(resv) = self.resv.take() else {
            return decided;
        };
        let actual = actual.max(0);
        // Stays in the live set until the settlement landed: here, or — if the store failed,
        // or the caller stopped awaiting before the answer — in a background retry (a
        // settlement that already landed makes the retry a no-op).
        let quota = self.quota.clone();
        let id = resv.request_id;
        let mut settling = Settling {
            entry: Some(quota.entry(id.clone())),
            actual,
        };
        let outcome =
            ledger::settle_via(&quota.writer, id.clone(), actual, quota.clock.clone()).await;
        match outcome {
            Ok(Some(s)) => {
                settling.entry = None;
                s
            }
            Ok(None) => {
                settling.entry = None;
                tracing::error!(request_id = %id, "the reservation was already settled");
                decided
            }
            Err(e) => {
                tracing::warn!(request_id = %id, error = %e, "settlement failed; retrying in the background");
                decided
            }
        }
    }
}

/// A settlement under way: dropped before it is known to have landed, it hands the
/// settlement to a background retry (its `LiveEntry` with it).
struct Settling {
    entry: Option<LiveEntry>,
    actual: i64,
}

impl Drop for Settling {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            Quota::settle_later(entry, self.actual);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(resv) = self.resv.take() {
            Quota::settle_later(self.quota.entry(resv.request_id), self.cost_if_dropped);
        }
    }
}

/// The next pause between settlement retries: doubled, at most 5 s.
fn backoff(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_secs(5))
}

/// A pause drawn between half of `pause` and all of it.
fn jittered(pause: Duration) -> Duration {
    use rand::Rng;
    let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retries back off to 5 s and are spread within each pause (s23 attack, money #3:
    /// every failing settlement retried once a second, all in step).
    #[test]
    fn settlement_retries_back_off_to_five_seconds_spread_within_each_pause() {
        let mut pause = Duration::from_millis(50);
        let mut pauses = vec![];
        for _ in 0..10 {
            pauses.push(pause.as_millis());
            pause = backoff(pause);
        }
        assert_eq!(
            pauses,
            [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]
        );
        let drawn: std::collections::HashSet<u128> = (0..200)
            .map(|_| jittered(Duration::from_secs(5)).as_millis())
            .collect();
        assert!(
            drawn.iter().all(|ms| (2500..=5000).contains(ms)),
            "{drawn:?}"
        );
        assert!(drawn.len() > 50, "spread: {} distinct pauses", drawn.len());
    }
}

//! Group commit on PostgreSQL: one task per process writes the money path's transactions.
//!
//! Callers hand the writer a job — a closure over the transaction's connection, with the
//! budget rows it will touch (`Locks`) — and await its answer on a oneshot. The writer takes
//! every job waiting (up to `MAX_BATCH`) into ONE transaction on its own connection. The
//! reservations and settlements of a batch (`run_grouped`) are decided together, one
//! statement over arrays for all its settlements and one for all its reservations
//! (`ledger::group`); only the jobs those leave undecided (a rollover due, a job that might
//! fit where the grouped rule could not tell) and other jobs run one after another. So a
//! batch costs a fixed handful of round trips — BEGIN, the locks, the two grouped
//! statements, COMMIT — however many jobs it holds (`pg_round_trips` counts them), and the
//! jobs that arrive meanwhile form the next, larger batch: with 0.5 ms round trips a caller
//! waits for about one batch, not for a queue of commits or of statements.
//!
//! - Answers are sent only after COMMIT succeeded: no caller acts on a reservation that is
//!   not in the database. When BEGIN or COMMIT fails (the server is unreachable) every job
//!   of the batch gets the error — the money path fails closed; settlements are retried by
//!   their caller (`quota::reservation`) until they land, and are idempotent. A batch cut
//!   once its COMMIT was sent (the connection broke, or `BATCH_TIMEOUT` ran out) may have
//!   committed: its jobs get `StoreError::CommitUnknown`, and a reservation answered so is
//!   settled at 0 by its owner's sweep (`Quota::settle_unsure`), wherever it is by then.
//! - A job writes nothing unless it succeeds (a refused reservation writes nothing but a
//!   rollover, which is true either way: `ledger::reserve_tx`). A job that fails spoils
//!   the transaction (PostgreSQL aborts it): the batch is rolled back, that job keeps its
//!   error, and the batch runs again without it — each rerun leaves out one more failed
//!   job, so one bad job never fails the good jobs that shared its batch. A grouped
//!   statement that fails on an error of its own (a duplicate request id) spoils it the
//!   same way: the batch runs again job by job, where the bad job fails alone.
//! - A serialization failure (40001) or a deadlock (40P01) anywhere in the batch rolls it
//!   back and runs the whole batch again after a jittered pause, up to `pg::MAX_ATTEMPTS`
//!   times; the callers never see it.
//! - A job whose caller has gone before it runs can be skipped (`run_for_caller`).
//! - No lock is waited for past `pg::LOCK_TIMEOUT` (every session's `lock_timeout`): the
//!   server ends the wait (55P03) and with it everything the transaction held. A job whose
//!   lock wait ran out fails alone, as any failing job — in practice a period rollover
//!   waiting for the audit chain's lock, which a host paused or cut off between its append
//!   and its commit may hold (until the server ends that session,
//!   `pg::IDLE_IN_TRANSACTION_TIMEOUT`). The batch's next runs then wait for no lock past
//!   its row locks (`NO_WAIT`): its other rollovers would each wait the timeout again, for
//!   the same lock, holding every caller of the batch meanwhile. Locks `LOCK_ROWS` waits
//!   for past the timeout fail the batch.
//!
//! Locks: the batch first locks every budget row its jobs will touch — tokens, then users,
//! then teams, each in id order — in one statement (`LOCK_ROWS`). Every batch of every host
//! takes its locks in that one global order, so two hosts' batches wait for each other but
//! never deadlock, however their jobs interleave (within a job the order token → user →
//! team alone would not be enough: job 1 of one batch and job 2 of another can hold each
//! other's rows). Transactions outside the writer that lock budget rows in another order
//! (an admin edit) may still deadlock with a batch; PostgreSQL breaks it and the batch runs
//! again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot};

use super::ledger::group::{self, Answer, Part};
use super::{backoff, is_broken, is_lock_timeout, is_retryable, Body, PgDb, MAX_ATTEMPTS};
use crate::store::audit::AuditKeys;
use crate::store::{Result, StoreError};

/// How many jobs one transaction takes at most.
const MAX_BATCH: usize = 256;
/// How many jobs may wait for the writer before callers wait to hand theirs over.
const QUEUE: usize = 8192;

/// The budget rows and reservations a job touches, locked before the batch's jobs run.
#[derive(Debug, Default, Clone)]
pub struct Locks {
    pub tokens: Vec<i64>,
    pub users: Vec<i64>,
    pub teams: Vec<i64>,
    /// Reservations (open or orphaned) by request id: their levels are locked.
    pub requests: Vec<String>,
}

impl Locks {
    fn is_empty(&self) -> bool {
        self.tokens.is_empty()
            && self.users.is_empty()
            && self.teams.is_empty()
            && self.requests.is_empty()
    }

    fn add(&mut self, other: &Locks) {
        self.tokens.extend_from_slice(&other.tokens);
        self.users.extend_from_slice(&other.users);
        self.teams.extend_from_slice(&other.teams);
        self.requests.extend(other.requests.iter().cloned());
    }
}

/// Locks the budget rows of `locks` in the one global order: tokens, users, teams, each by
/// id. `ORDER BY … FOR NO KEY UPDATE` locks rows as they come out of the sort, and `UNION
/// ALL` runs its branches one after another.
///
/// Why `FOR NO KEY UPDATE` and not `FOR UPDATE`: the money path only ever changes non-key
/// columns of these rows (balances, periods), which is exactly the lock its `UPDATE`s take
/// anyway; it conflicts with itself, with every `UPDATE` and with `DELETE`, so two batches,
/// an admin edit and a deletion still wait for each other as before. The only lock it lets
/// through is `FOR KEY SHARE`, which a foreign-key check takes on the row it references: a
/// token issued for a user or a user created in a team whose row a batch holds no longer
/// waits for that batch (`pg_row_locks::a_money_batch_does_not_block_inserts_…`, 55P03
/// under a 2 s lock timeout with `FOR UPDATE`). Every other `FOR NO KEY UPDATE` of the
/// money path (`ledger/cas.rs`, `ledger::set_limit`) is the same lock on the same rows.
const LOCK_ROWS: &str = "WITH held AS (
        SELECT token_id, user_id, team_id FROM reservations WHERE request_id = ANY($4)
        UNION ALL SELECT token_id, user_id, team_id FROM orphaned WHERE request_id = ANY($4))
    SELECT 0 FROM (SELECT id FROM tokens WHERE id = ANY($1) OR id IN (SELECT token_id FROM held) ORDER BY id FOR NO KEY UPDATE) t
    UNION ALL SELECT 1 FROM (SELECT id FROM users WHERE id = ANY($2) OR id IN (SELECT user_id FROM held) ORDER BY id FOR NO KEY UPDATE) u
    UNION ALL SELECT 2 FROM (SELECT id FROM teams WHERE id = ANY($3) OR id IN (SELECT team_id FROM held) ORDER BY id FOR NO KEY UPDATE) m";

/// Locks `locks`' rows inside the caller's transaction (see `LOCK_ROWS`).
pub async fn lock_rows(conn: &mut PgConnection, locks: &Locks) -> Result<()> {
    if locks.is_empty() {
        return Ok(());
    }
    sqlx::query(LOCK_ROWS)
        .bind(&locks.tokens)
        .bind(&locks.users)
        .bind(&locks.teams)
        .bind(&locks.requests)
        .execute(conn)
        .await?;
    Ok(())
}

/// A job's closure: it may run more than once (see the module doc).
pub trait JobFn<T>: for<'c> FnMut(&'c mut PgConnection) -> Body<'c, T> + Send + 'static {}
impl<T, F> JobFn<T> for F where
    F: for<'c> FnMut(&'c mut PgConnection) -> Body<'c, T> + Send + 'static
{
}

type Run<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A job of the writer's batches, type-erased.
trait Job: Send {
    fn locks(&self) -> &Locks;
    /// Whether the job is left out of this run: it failed on its own error before, or
    /// its caller has gone (`run_for_caller`).
    fn out(&self) -> bool;
    /// Runs it; its error, if any, is then in `error`.
    fn run<'a>(&'a mut self, conn: &'a mut PgConnection) -> Run<'a>;
    fn error(&self) -> Option<&StoreError>;
    /// What a groupable job asks (`ledger::group`), unless it is out of this run.
    fn part(&mut self) -> Option<Part>;
    /// Takes the answer the grouped statements decided for it: it does not run on its own.
    fn decide(&mut self, answer: Answer);
    /// Forgets the result of a run whose transaction was rolled back.
    fn reset(&mut self);
    /// Delivers the job's own result, or the batch's failure.
    fn finish(self: Box<Self>, batch: std::result::Result<(), &StoreError>);
}

/// How a job is grouped with its batch's others (`ledger::group`): what it asks, read when
/// the batch runs, and how its result is read from the grouped answer (`None`: the answer
/// is not of its kind; it then runs on its own).
pub struct Group<T> {
    pub part: Box<dyn FnMut() -> Part + Send>,
    pub take: fn(Answer) -> Option<T>,
}

struct Call<T, F> {
    f: F,
    group: Option<Group<T>>,
    locks: Locks,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
    for_caller: bool,
    gone: bool,
}

impl<T, F> Call<T, F> {
    /// Whether its caller stopped waiting before it ran (`run_for_caller`): then it is
    /// left out, with an error nobody reads.
    fn left(&mut self) -> bool {
        if !self.gone && self.for_caller && self.reply.is_closed() {
            self.gone = true;
            self.result = Some(Err(StoreError::Batch("the caller has gone".into())));
        }
        self.gone
    }
}

impl<T: Send + 'static, F: JobFn<T>> Job for Call<T, F> {
    fn locks(&self) -> &Locks {
        &self.locks
    }
    fn out(&self) -> bool {
        self.gone || matches!(&self.result, Some(Err(e)) if !is_retryable(e) && !is_broken(e))
    }
    fn run<'a>(&'a mut self, conn: &'a mut PgConnection) -> Run<'a> {
        Box::pin(async move {
            if self.result.is_some() || self.left() {
                return;
            }
            self.result = Some((self.f)(conn).await);
        })
    }
    fn error(&self) -> Option<&StoreError> {
        match &self.result {
            Some(Err(e)) if !self.gone => Some(e),
            _ => None,
        }
    }
    fn part(&mut self) -> Option<Part> {
        if self.out() || self.left() {
            return None;
        }
        self.group.as_mut().map(|g| (g.part)())
    }
    fn decide(&mut self, answer: Answer) {
        if let Some(t) = self.group.as_ref().and_then(|g| (g.take)(answer)) {
            self.result = Some(Ok(t));
        }
    }
    fn reset(&mut self) {
        if !self.out() {
            self.result = None;
        }
    }
    fn finish(self: Box<Self>, batch: std::result::Result<(), &StoreError>) {
        let answer = match (batch, self.result) {
            (_, Some(Err(e))) if self.gone => Err(e),
            (Ok(()), Some(r)) => r,
            (Ok(()), None) => Err(StoreError::Batch("the job did not run".into())),
            (Err(_), Some(Err(mine))) if !is_retryable(&mine) && !is_broken(&mine) => Err(mine),
            (Err(StoreError::CommitUnknown(e)), _) => Err(StoreError::CommitUnknown(e.clone())),
            (Err(e), _) => Err(StoreError::Batch(e.to_string())),
        };
        // A caller that went away no longer needs the answer (its writes stand).
        let _ = self.reply.send(answer);
    }
}

/// The handle callers use; cheap to clone. The task ends when every handle is dropped.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Box<dyn Job>>,
    counters: Arc<Counters>,
    audit: Arc<AuditKeys>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    jobs: AtomicU64,
    failed_batches: AtomicU64,
    retries: AtomicU64,
}

/// What the writer has done so far (jobs are counted when taken into a batch; a batch run
/// again after a serialization failure or deadlock counts once, and once in `retries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub batches: u64,
    pub jobs: u64,
    pub failed_batches: u64,
    pub retries: u64,
}

impl Writer {
    /// Starts the writer task (on the current Tokio runtime) with a connection of its own
    /// to `db`'s database, opened at the first batch and again after it broke.
    pub fn start(db: &PgDb) -> Writer {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let opts = (*db.pool.connect_options()).clone();
        tokio::spawn(serve(opts, rx, counters.clone()));
        Writer {
            tx,
            counters,
            audit: db.audit.clone(),
        }
    }

    /// The audit keys the jobs sign their audit rows with (a period rollover).
    pub fn audit(&self) -> &Arc<AuditKeys> {
        &self.audit
    }

    /// How many jobs wait for the writer to take them into a batch.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            batches: self.counters.batches.load(Relaxed),
            jobs: self.counters.jobs.load(Relaxed),
            failed_batches: self.counters.failed_batches.load(Relaxed),
            retries: self.counters.retries.load(Relaxed),
        }
    }

    /// Runs `f` inside the next batch, after `locks` are taken; the answer comes after the
    /// commit. `f` must write nothing unless it returns `Ok`, and may run again. The job
    /// runs even if the caller stops waiting (a settlement must land).
    pub async fn run<T: Send + 'static>(&self, locks: Locks, f: impl JobFn<T>) -> Result<T> {
        self.submit(locks, None, f, false).await
    }

    /// Like `run` (`for_caller`: like `run_for_caller`), decided with the batch's other
    /// grouped jobs in one statement when `group` can (`ledger::group`); `f` runs when it
    /// cannot, or when the batch runs again job by job.
    pub async fn run_grouped<T: Send + 'static>(
        &self,
        locks: Locks,
        group: Group<T>,
        f: impl JobFn<T>,
        for_caller: bool,
    ) -> Result<T> {
        self.submit(locks, Some(group), f, for_caller).await
    }

    /// Like `run`, but skipped if its caller has stopped waiting before it runs.
    pub async fn run_for_caller<T: Send + 'static>(
        &self,
        locks: Locks,
        f: impl JobFn<T>,
    ) -> Result<T> {
        self.submit(locks, None, f, true).await
    }

    async fn submit<T: Send + 'static>(
        &self,
        locks: Locks,
        group: Option<Group<T>>,
        f: impl JobFn<T>,
        for_caller: bool,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            f,
            group,
            locks,
            result: None,
            reply,
            for_caller,
            gone: false,
        });
        self.tx
            .send(job)
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn serve(
    opts: PgConnectOptions,
    mut rx: mpsc::Receiver<Box<dyn Job>>,
    counters: Arc<Counters>,
) {
    let mut conn: Option<PgConnection> = None;
    let mut jobs: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    while let Some(job) = rx.recv().await {
        // Let the callers just answered (and woken ones) hand in their next jobs first: on
        // a busy runtime they have not run yet, and their jobs make this batch larger.
        tokio::task::yield_now().await;
        jobs.push(job);
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        counters.jobs.fetch_add(jobs.len() as u64, Relaxed);
        counters.batches.fetch_add(1, Relaxed);
        let outcome = batch(&opts, &mut conn, &mut jobs, &counters).await;
        if let Err(e) = &outcome {
            counters.failed_batches.fetch_add(1, Relaxed);
            tracing::error!(error = %e, jobs = jobs.len(), "a write batch failed; its callers get the error");
        }
        for job in jobs.drain(..) {
            job.finish(outcome.as_ref().map(|_| ()));
        }
    }
}

/// How long one run of a batch may take before it fails (fail closed). Generous: a batch
/// may wait for another host's batch or an admin edit holding its rows (each lock at most
/// `pg::LOCK_TIMEOUT`).
const BATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a run after a job's lock wait ran out takes the locks past its row locks: at once or
/// not at all (`lock_timeout` cannot be 0, which means no timeout).
const NO_WAIT: &str = "SET LOCAL lock_timeout = '1ms'";

/// How long the writer waits for a connection before the batch fails (fail closed).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

async fn connection<'a>(
    opts: &PgConnectOptions,
    slot: &'a mut Option<PgConnection>,
) -> Result<&'a mut PgConnection> {
    if slot.is_none() {
        let c = tokio::time::timeout(CONNECT_TIMEOUT, super::open_session(opts))
            .await
            .map_err(|_| StoreError::Sql(sqlx::Error::PoolTimedOut))??;
        *slot = Some(c);
    }
    // Set just above when it was empty.
    slot.as_mut()
        .ok_or_else(|| StoreError::Batch("no connection".into()))
}

/// How one run of a batch ended short of its COMMIT.
enum Stop {
    /// Job `i` failed on its own error: run again without it.
    Job(usize),
    /// A grouped statement failed on an error of its own: run again job by job, so the job
    /// that caused it fails alone.
    Ungroup(StoreError),
    /// A serialization failure or deadlock: run the whole batch again.
    Retry(StoreError),
    /// BEGIN, the locks or COMMIT failed: the batch fails.
    Batch(StoreError),
    /// The connection broke: the batch fails, and the next one opens a new connection.
    Broken(StoreError),
}

fn stop(e: StoreError) -> Stop {
    if is_retryable(&e) {
        Stop::Retry(e)
    } else if is_broken(&e) {
        Stop::Broken(e)
    } else {
        Stop::Batch(e)
    }
}

/// Runs a batch until it commits (see the module doc); `Err` fails every job still in it.
async fn batch(
    opts: &PgConnectOptions,
    slot: &mut Option<PgConnection>,
    jobs: &mut [Box<dyn Job>],
    counters: &Counters,
) -> Result<()> {
    let mut attempt = 1;
    let mut grouped = true;
    // Set once a job's lock wait ran out (see the module doc).
    let mut no_wait = false;
    loop {
        for job in jobs.iter_mut() {
            job.reset();
        }
        if jobs.iter().all(|j| j.out()) {
            return Ok(());
        }
        let conn = match connection(opts, slot).await {
            Ok(c) => c,
            Err(e) => {
                *slot = None;
                return Err(e);
            }
        };
        // A server that stops answering (a network partition, a frozen host) must not hold
        // every caller forever: past `BATCH_TIMEOUT` the batch fails and its connection is
        // dropped (which ends the transaction on the server once it notices; a wait for a
        // lock it does not notice, which `lock_timeout` ends).
        // Set as COMMIT is sent: a batch cut from then on may have committed.
        let mut committing = false;
        let run = match tokio::time::timeout(
            BATCH_TIMEOUT,
            once(conn, jobs, grouped, no_wait, &mut committing),
        )
        .await
        {
            Ok(run) => run,
            Err(_) => Err(Stop::Broken(StoreError::Batch(format!(
                "no answer from the database within {BATCH_TIMEOUT:?}"
            )))),
        };
        match run {
            Ok(()) => return Ok(()),
            Err(Stop::Ungroup(e)) => {
                tracing::warn!(error = %e, "a grouped write statement failed; its batch runs again job by job");
                grouped = false;
            }
            Err(Stop::Job(i)) => {
                no_wait |= jobs[i].error().is_some_and(is_lock_timeout);
                tracing::warn!(error = ?jobs[i].error().map(ToString::to_string), "a write job failed; its batch runs again without it");
            }
            Err(Stop::Retry(e)) if attempt < MAX_ATTEMPTS => {
                counters.retries.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, attempt, "a write batch runs again");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            Err(Stop::Broken(e)) => {
                *slot = None;
                return Err(if committing {
                    StoreError::CommitUnknown(e.to_string())
                } else {
                    e
                });
            }
            Err(Stop::Retry(e) | Stop::Batch(e)) => return Err(e),
        }
    }
}

/// One run: BEGIN, the locks, the grouped statements (`grouped`), every job still in and
/// not decided by them, COMMIT; past the row locks no lock is waited for (`no_wait`).
async fn once(
    conn: &mut PgConnection,
    jobs: &mut [Box<dyn Job>],
    grouped: bool,
    no_wait: bool,
    committing: &mut bool,
) -> std::result::Result<(), Stop> {
    let mut tx = conn.begin().await.map_err(|e| stop(e.into()))?;
    let mut locks = Locks::default();
    for job in jobs.iter().filter(|j| !j.out()) {
        locks.add(job.locks());
    }
    let ran = async {
        lock_rows(&mut tx, &locks).await.map_err(stop)?;
        if no_wait {
            sqlx::query(NO_WAIT)
                .execute(&mut *tx)
                .await
                .map_err(|e| stop(e.into()))?;
        }
        if grouped {
            let parts: Vec<Option<Part>> = jobs.iter_mut().map(|j| j.part()).collect();
            if parts.iter().any(Option::is_some) {
                let answers = group::run(&mut tx, &parts)
                    .await
                    .map_err(|e| match stop(e) {
                        Stop::Batch(e) => Stop::Ungroup(e),
                        s => s,
                    })?;
                for (job, answer) in jobs.iter_mut().zip(answers) {
                    if let Some(answer) = answer {
                        job.decide(answer);
                    }
                }
            }
        }
        for (i, job) in jobs.iter_mut().enumerate() {
            if job.out() {
                continue;
            }
            job.run(&mut tx).await;
            if let Some(e) = job.error() {
                return Err(if is_retryable(e) {
                    Stop::Retry(StoreError::Batch(e.to_string()))
                } else if is_broken(e) {
                    Stop::Broken(StoreError::Batch(e.to_string()))
                } else {
                    Stop::Job(i)
                });
            }
        }
        Ok(())
    }
    .await;
    match ran {
        Ok(()) => {
            *committing = true;
            tx.commit().await.map_err(|e| stop(e.into()))
        }
        Err(s) => {
            // A rollback that fails leaves a broken connection; the next run finds out.
            let _ = tx.rollback().await;
            Err(s)
        }
    }
}

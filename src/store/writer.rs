//! Group commit: one thread writes the money path's transactions (and the request log's).
//! `Writer` is the handle for either engine: on PostgreSQL it runs `pg::writer` instead
//! (docs/DESIGN.md "Money on PostgreSQL"); the rest of this doc is the SQLite writer.
//!
//! Callers hand the writer a job — a closure over a `Tx` — and await its answer on a
//! oneshot. The writer takes every job waiting (up to `MAX_BATCH`) and runs them one after
//! another in ONE `BEGIN IMMEDIATE` transaction:
//! - answers are sent only after `COMMIT` succeeded, so no caller acts on a reservation
//!   that is not in the database;
//! - a job must write nothing unless it succeeds (a refusal is a success: a refused
//!   reservation reserves nothing, and what it wrote — a period rollover — is true either
//!   way, `ledger::reserve_tx`). That is what lets a batch do without a savepoint per job
//!   (each savepoint copies every page the job touches into a sub-journal);
//! - a job that fails (its statements may have half-run) spoils the transaction: it is
//!   rolled back, that job keeps its error, and the batch runs again without it in a fresh
//!   transaction — as often as a further job fails, up to `RERUNS` times; past that, each
//!   remaining job runs in a transaction of its own. So one bad job fails alone, never the
//!   good jobs that shared its batch. Only when `BEGIN` or `COMMIT` itself fails does every
//!   job of the batch get an error (nothing of it is kept; settlements retry, see
//!   `quota::reservation`); the writer goes on with the next batch;
//! - a job whose caller has gone before it runs can be skipped (`run_for_caller`): a
//!   reservation nobody waits for any more is never written.
//!
//! Each job's compare-and-swap stays atomic: the batch holds SQLite's write lock from
//! `BEGIN IMMEDIATE` to `COMMIT` — against other processes too — and the jobs run one after
//! another inside it, each seeing the balances the previous ones left.
//!
//! The batch runs synchronously through the connection's raw handle (see `raw`: one hop
//! to sqlx's worker thread per batch instead of one per statement), so the writer has a
//! thread of its own, with a small current-thread Tokio runtime for sqlx's pool: an fsync
//! at `COMMIT` (`synchronous = full`) or a wait for another process's lock blocks this
//! thread only, never an HTTP worker. Jobs arriving meanwhile form the next, larger
//! batch — with `synchronous = full` that is what keeps throughput up.
//!
//! The write pool's single connection is still shared: the writer acquires it per batch,
//! so admin edits, the housekeeping and the CLI queue with it as before.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::raw::{Conn, Keeper, Statements};
use super::{Result, StoreError};

/// How many jobs one transaction takes at most.
const MAX_BATCH: usize = 256;
/// How many jobs may wait for the writer before callers wait to hand theirs over.
const QUEUE: usize = 8192;

/// A connection inside a write transaction, as a job sees it.
pub struct Tx<'c> {
    conn: Conn<'c>,
}

impl<'c> Deref for Tx<'c> {
    type Target = Conn<'c>;
    fn deref(&self) -> &Conn<'c> {
        &self.conn
    }
}
impl<'c> DerefMut for Tx<'c> {
    fn deref_mut(&mut self) -> &mut Conn<'c> {
        &mut self.conn
    }
}

/// A unit of work of a transaction. It may run more than once (see the module doc).
trait Run {
    /// Runs inside the transaction; `false` when it failed (the transaction is spoiled).
    fn run(&mut self, tx: &mut Tx<'_>) -> bool;
    /// Whether its last run failed (it is then left out of a rerun).
    fn failed(&self) -> bool;
    /// Marks it failed after it ran (its own transaction could not commit).
    fn fail(&mut self, e: StoreError);
}

/// A job of the writer's batches, type-erased.
trait Job: Run + Send {
    /// Delivers the job's own result, or the batch's failure.
    fn finish(self: Box<Self>, batch: std::result::Result<(), &StoreError>);
}

/// The closure of a job and, once it ran, its result.
struct Once<T, F> {
    f: F,
    out: Option<Result<T>>,
}

impl<T, F: FnMut(&mut Tx<'_>) -> Result<T>> Run for Once<T, F> {
    fn run(&mut self, tx: &mut Tx<'_>) -> bool {
        // A panicking job is a failed job: it must not take the writer (and the open
        // transaction on the locked connection) down with it.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.f)(tx)))
            .unwrap_or_else(|_| Err(StoreError::Batch("the job panicked".into())));
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }
    fn failed(&self) -> bool {
        matches!(self.out, Some(Err(_)))
    }
    fn fail(&mut self, e: StoreError) {
        self.out = Some(Err(e));
    }
}

impl<T, F> Once<T, F> {
    fn result(self) -> Result<T> {
        self.out
            .unwrap_or_else(|| Err(StoreError::Batch("job did not run".into())))
    }
}

struct Call<T, F> {
    once: Once<T, F>,
    reply: oneshot::Sender<Result<T>>,
    /// Skip the job when its caller has gone before it runs.
    for_caller: bool,
}

impl<T, F: FnMut(&mut Tx<'_>) -> Result<T>> Run for Call<T, F> {
    fn run(&mut self, tx: &mut Tx<'_>) -> bool {
        if self.for_caller && self.reply.is_closed() {
            // Nothing written: the transaction is not spoiled, and a rerun leaves it out.
            self.once.out = Some(Err(StoreError::Batch("the caller has gone".into())));
            return true;
        }
        self.once.run(tx)
    }
    fn failed(&self) -> bool {
        self.once.failed()
    }
    fn fail(&mut self, e: StoreError) {
        self.once.fail(e)
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnMut(&mut Tx<'_>) -> Result<T> + Send,
{
    fn finish(self: Box<Self>, batch: std::result::Result<(), &StoreError>) {
        let answer = match batch {
            Ok(()) => self.once.result(),
            Err(e) => Err(StoreError::Batch(e.to_string())),
        };
        // A caller that went away no longer needs the answer (its writes stand).
        let _ = self.reply.send(answer);
    }
}

/// The group-commit writer of whichever engine holds the database; cheap to clone. The
/// money path's jobs (`ledger::reserve_via`, `settle_via`, `release_via`), the request log
/// and cache writes (`store::lingering`) and cache hit counts go through it, and nothing
/// above the store knows which engine runs them:
/// - SQLite: one thread over the one write connection (this module); lingering rows share
///   the money path's transactions;
/// - PostgreSQL: `pg::writer`'s task over a connection of its own, taking each batch's
///   row locks in the one global order; lingering rows are written by `pg::lingering` in
///   transactions of their own on the pool (they lock no budget row, so they need not wait
///   for the money path's batches, nor make them wait).
#[derive(Clone, Debug)]
pub struct Writer {
    engine: Engine,
}

#[derive(Clone, Debug)]
pub(in crate::store) enum Engine {
    Sqlite(SqliteWriter),
    Postgres(super::pg::writer::Writer, sqlx::PgPool),
}

impl Writer {
    /// Starts the writer of `db`'s engine (on PostgreSQL a task on the current runtime).
    pub fn start(db: &super::Db) -> Writer {
        let engine = match &db.backend {
            super::Backend::Sqlite(sqlite) => Engine::Sqlite(SqliteWriter::start(sqlite)),
            super::Backend::Postgres(pg) => {
                Engine::Postgres(super::pg::writer::Writer::start(pg), pg.pool.clone())
            }
        };
        Writer { engine }
    }

    pub(in crate::store) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// How many jobs wait for the writer to take them into a batch.
    pub fn queued(&self) -> usize {
        match &self.engine {
            Engine::Sqlite(w) => w.tx.max_capacity() - w.tx.capacity(),
            Engine::Postgres(w, _) => w.queued(),
        }
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> Stats {
        match &self.engine {
            Engine::Sqlite(w) => w.stats(),
            Engine::Postgres(w, _) => {
                let s = w.stats();
                Stats {
                    batches: s.batches,
                    jobs: s.jobs,
                    failed_batches: s.failed_batches,
                    retries: s.retries,
                }
            }
        }
    }

    /// A SQLite job (see `SqliteWriter::run`); on another engine the caller is a store
    /// function that has forgotten its PostgreSQL arm.
    pub(in crate::store) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        self.sqlite()?.run(f).await
    }

    /// A SQLite job skipped when its caller has gone (see `SqliteWriter::run_for_caller`).
    pub(in crate::store) async fn run_for_caller<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        self.sqlite()?.run_for_caller(f).await
    }

    fn sqlite(&self) -> Result<&SqliteWriter> {
        match &self.engine {
            Engine::Sqlite(w) => Ok(w),
            Engine::Postgres(..) => Err(StoreError::Batch(
                "a SQLite write job was handed to the PostgreSQL writer".into(),
            )),
        }
    }
}

/// The SQLite writer thread's handle; cheap to clone. The thread ends when every handle
/// is dropped.
#[derive(Clone)]
pub(in crate::store) struct SqliteWriter {
    tx: mpsc::Sender<Box<dyn Job>>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    jobs: AtomicU64,
    failed_batches: AtomicU64,
}

/// What the writer has done so far (jobs are counted when taken into a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub batches: u64,
    pub jobs: u64,
    pub failed_batches: u64,
    /// Batches run again after a serialization failure or deadlock (PostgreSQL; SQLite's
    /// one writer meets neither).
    pub retries: u64,
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter").finish_non_exhaustive()
    }
}

impl SqliteWriter {
    /// Starts the writer thread over the database's write connection.
    fn start(sqlite: &super::SqlitePools) -> SqliteWriter {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let pool = sqlite.write.clone();
        let seen = counters.clone();
        let started = std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt.block_on(async move {
                        let checkpoints = tokio::spawn(checkpointer(pool.connect_options()));
                        serve(pool, rx, seen).await;
                        checkpoints.abort();
                    }),
                    Err(e) => tracing::error!(error = %e, "the store writer could not start"),
                }
            });
        if let Err(e) = started {
            // `rx` is gone with the closure: every call answers `WriterGone`.
            tracing::error!(error = %e, "the store writer thread could not start");
        }
        SqliteWriter { tx, counters }
    }

    pub fn stats(&self) -> Stats {
        Stats {
            batches: self.counters.batches.load(Relaxed),
            jobs: self.counters.jobs.load(Relaxed),
            failed_batches: self.counters.failed_batches.load(Relaxed),
            retries: 0,
        }
    }

    /// Runs `f` inside the next batch; the answer comes after the commit. `f` must write
    /// nothing unless it returns `Ok`, and may run again if another job of its batch fails.
    /// The job runs even if the caller stops waiting (a settlement must land).
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        self.submit(f, false).await
    }

    /// Like `run`, but the job is skipped if its caller has stopped waiting before it runs
    /// (a reservation for a request whose client has gone). A caller that stops waiting
    /// after the job ran must undo it itself (`quota::reservation` releases it).
    pub async fn run_for_caller<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        self.submit(f, true).await
    }

    async fn submit<T, F>(&self, f: F, for_caller: bool) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            once: Once { f, out: None },
            reply,
            for_caller,
        });
        self.tx
            .send(job)
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// WAL checkpoints off the writer's path. With SQLite's automatic checkpoint, the commit
/// that crosses 1000 WAL pages copies them back and fsyncs — on the writer's thread, while
/// every reservation waits (the p99 of the CAS was that). Here a connection of its own
/// runs a PASSIVE checkpoint every `CHECKPOINT_EVERY` (it never takes the write lock, so
/// the writer goes on meanwhile, and its fsync waits on sqlx's worker thread for that
/// connection); `Db::open` keeps the automatic one as a backstop with a high threshold.
/// Durability is unchanged: commits are as durable as `synchronous` says.
///
/// Under steady load the backstop is what usually restarts the WAL: SQLite moves it back
/// to its start only when a write transaction begins with every frame copied back (and no
/// reader on a WAL snapshot), and a writer that commits all the time rarely begins one
/// then. A longer interval (bigger fsyncs) and a
/// catch-up checkpoint on the writer after each of these (an fsync per checkpoint and per
/// restart on the writer) were measured worse: docs/PERFORMANCE.md.
async fn checkpointer(opts: Arc<SqliteConnectOptions>) {
    let mut conn = match SqliteConnection::connect_with(&opts).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "the checkpointer could not connect; automatic checkpoints only");
            return;
        }
    };
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut conn)
            .await
        {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    }
}

async fn serve(pool: SqlitePool, mut rx: mpsc::Receiver<Box<dyn Job>>, counters: Arc<Counters>) {
    let mut keeper = Keeper::default();
    let mut jobs: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    loop {
        if jobs.is_empty() {
            match rx.recv().await {
                Some(job) => {
                    counters.jobs.fetch_add(1, Relaxed);
                    jobs.push(job);
                }
                None => return,
            }
        }
        take_waiting(&mut rx, &mut jobs, &counters);
        if let Err(e) = session(&pool, &mut keeper, &mut rx, &mut jobs, &counters).await {
            finish(&mut jobs, Err(&e), &counters);
        }
    }
}

/// How many batches in a row may run on the connection before it goes back to the pool
/// (where admin edits, the housekeeping and the CLI wait for it).
const MAX_ROUNDS: usize = 32;
/// How long an idle writer keeps the connection locked, waiting for the next job.
const IDLE_HOLD: Duration = Duration::from_millis(2);

/// Locks the write connection once and runs batches on it while jobs keep coming: one
/// hand-over from sqlx's worker thread (and one pool round trip) for many batches.
// The statement cache's lock is held across the idle wait on purpose: only this thread
// uses the statements of the connection it holds, and they stay locked with it.
#[allow(clippy::await_holding_lock)]
async fn session(
    pool: &SqlitePool,
    keeper: &mut Keeper,
    rx: &mut mpsc::Receiver<Box<dyn Job>>,
    jobs: &mut Vec<Box<dyn Job>>,
    counters: &Counters,
) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let mut handle = conn.lock_handle().await?;
    let cache = keeper.attach(&mut handle);
    let mut stmts = cache.lock();
    let db = handle.as_raw_handle().as_ptr();
    let mut tx = Tx {
        conn: Conn::new(db, &mut stmts)?,
    };
    for _ in 0..MAX_ROUNDS {
        let outcome = transact(&mut tx, jobs);
        finish(jobs, outcome.as_ref().map(|_| ()), counters);
        // Let the callers just answered run (on a shared CPU they are waiting for it):
        // their next jobs make the next batch, on the connection we still hold.
        std::thread::yield_now();
        take_waiting(rx, jobs, counters);
        if jobs.is_empty() {
            // A request's settlement (or the next request) usually follows within a
            // millisecond or two: keep the connection that long rather than hand it back.
            match tokio::time::timeout(IDLE_HOLD, rx.recv()).await {
                Ok(Some(job)) => {
                    counters.jobs.fetch_add(1, Relaxed);
                    jobs.push(job);
                    take_waiting(rx, jobs, counters);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
    Ok(())
}

/// Adds the jobs already waiting, up to `MAX_BATCH`.
fn take_waiting(
    rx: &mut mpsc::Receiver<Box<dyn Job>>,
    jobs: &mut Vec<Box<dyn Job>>,
    counters: &Counters,
) {
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => {
                counters.jobs.fetch_add(1, Relaxed);
                jobs.push(job);
            }
            Err(_) => break,
        }
    }
}

/// Answers every job of a batch (after its commit, or with the batch's failure).
fn finish(
    jobs: &mut Vec<Box<dyn Job>>,
    outcome: std::result::Result<(), &StoreError>,
    counters: &Counters,
) {
    counters.batches.fetch_add(1, Relaxed);
    if let Err(e) = outcome {
        counters.failed_batches.fetch_add(1, Relaxed);
        tracing::error!(error = %e, jobs = jobs.len(), "a write batch failed; its callers get the error");
    }
    for job in jobs.drain(..) {
        job.finish(outcome);
    }
}

/// How often a batch runs again without its failed jobs before the rest run one by one.
const RERUNS: usize = 4;

/// One transaction over `jobs`, rerun without each job that failed; past `RERUNS`, every
/// remaining job in a transaction of its own — one bad job never fails a good one. `Err`
/// only when `BEGIN`/`COMMIT` of the whole batch failed: nothing of it is kept then.
fn transact<J: Run + ?Sized>(tx: &mut Tx<'_>, jobs: &mut [Box<J>]) -> Result<()> {
    for _attempt in 0..RERUNS {
        match run_all(tx, jobs) {
            Ok(true) => return Ok(()),
            Ok(false) => rollback(tx),
            Err(e) => {
                rollback(tx);
                return Err(e);
            }
        }
    }
    for job in jobs.iter_mut().filter(|j| !j.failed()) {
        match run_all(tx, std::slice::from_mut(job)) {
            Ok(true) => {}
            Ok(false) => rollback(tx),
            Err(e) => {
                rollback(tx);
                job.fail(e);
            }
        }
    }
    Ok(())
}

/// `Ok(false)` when a job failed (the transaction is left open for the caller to roll back).
fn run_all<J: Run + ?Sized>(tx: &mut Tx<'_>, jobs: &mut [Box<J>]) -> Result<bool> {
    tx.execute("BEGIN IMMEDIATE", &[])?;
    for job in jobs.iter_mut().filter(|j| !j.failed()) {
        if !job.run(tx) {
            return Ok(false);
        }
    }
    tx.execute("COMMIT", &[])?;
    Ok(true)
}

fn rollback(tx: &mut Tx<'_>) {
    // SQLite may have rolled back by itself (some errors end the transaction).
    if tx.in_transaction() {
        if let Err(e) = tx.execute("ROLLBACK", &[]) {
            tracing::error!(error = %e, "rolling back a write batch failed");
        }
    }
}

/// Runs one job in its own transaction on the caller's thread, without the writer (the
/// standalone `ledger` functions; tools and tests). Statements are prepared for this call
/// only. Blocks the calling thread for the transaction, including a commit's fsync.
pub async fn once<T>(pool: &SqlitePool, f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
    let mut conn = pool.acquire().await?;
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    let mut stmts = Statements::new(db);
    let mut tx = Tx {
        conn: Conn::new(db, &mut stmts)?,
    };
    let mut one = [Box::new(Once { f, out: None })];
    let batch = transact(&mut tx, &mut one);
    let [one] = one;
    match (batch, one.out) {
        (_, Some(Err(e))) | (Err(e), _) => Err(e),
        (Ok(()), Some(Ok(v))) => Ok(v),
        (Ok(()), None) => Err(StoreError::Batch("job did not run".into())),
    }
}

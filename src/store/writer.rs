//! Group commit: one thread writes the money path's transactions (and the request log's).
//!
//! Callers hand the writer a job — a closure over a `Tx` — and await its answer on a
//! oneshot. The writer takes every job waiting (up to `MAX_BATCH`) and runs them in ONE
//! `BEGIN IMMEDIATE` transaction, each job under its own `SAVEPOINT`:
//! - a job that fails, or that `discard`s its writes (a refused reservation), is rolled
//!   back to its savepoint alone; the other jobs keep theirs;
//! - answers are sent only after `COMMIT` succeeded, so no caller acts on a reservation
//!   that is not in the database;
//! - if `BEGIN`, a savepoint or `COMMIT` fails (or SQLite rolled the transaction back on
//!   its own), every job of that batch gets an error, nothing of the batch is kept, and the
//!   writer goes on with the next batch.
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

use sqlx::SqlitePool;
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
    discard: bool,
}

impl Tx<'_> {
    /// Rolls this job's writes back (to its savepoint) when it returns, even if it returns
    /// `Ok` — a refused reservation writes nothing.
    pub fn discard(&mut self) {
        self.discard = true;
    }
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

/// A unit of work of a transaction.
trait Run {
    /// Runs inside the transaction, under the job's savepoint; `false` rolls the savepoint back.
    fn run(&mut self, tx: &mut Tx<'_>) -> bool;
}

/// A job of the writer's batches, type-erased.
trait Job: Run + Send {
    /// Delivers the job's own result, or the batch's failure.
    fn finish(self: Box<Self>, batch: std::result::Result<(), &StoreError>);
}

/// The closure of a job and, once it ran, its result.
struct Once<T, F> {
    f: Option<F>,
    out: Option<Result<T>>,
}

impl<T, F: FnOnce(&mut Tx<'_>) -> Result<T>> Run for Once<T, F> {
    fn run(&mut self, tx: &mut Tx<'_>) -> bool {
        let Some(f) = self.f.take() else { return false };
        let out = f(tx);
        let keep = out.is_ok();
        self.out = Some(out);
        keep
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
}

impl<T, F: FnOnce(&mut Tx<'_>) -> Result<T>> Run for Call<T, F> {
    fn run(&mut self, tx: &mut Tx<'_>) -> bool {
        self.once.run(tx)
    }
}

impl<T, F> Job for Call<T, F>
where
    T: Send,
    F: FnOnce(&mut Tx<'_>) -> Result<T> + Send,
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

/// The handle callers use; cheap to clone. The thread ends when every handle is dropped.
#[derive(Clone)]
pub struct Writer {
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
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread over `pool` (the single-connection write pool).
    pub fn start(pool: SqlitePool) -> Writer {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let seen = counters.clone();
        let started = std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt.block_on(serve(pool, rx, seen)),
                    Err(e) => tracing::error!(error = %e, "the store writer could not start"),
                }
            });
        if let Err(e) = started {
            // `rx` is gone with the closure: every call answers `WriterGone`.
            tracing::error!(error = %e, "the store writer thread could not start");
        }
        Writer { tx, counters }
    }

    pub fn stats(&self) -> Stats {
        Stats {
            batches: self.counters.batches.load(Relaxed),
            jobs: self.counters.jobs.load(Relaxed),
            failed_batches: self.counters.failed_batches.load(Relaxed),
        }
    }

    /// Runs `f` inside the next batch; its writes are kept if it returns `Ok` (and did not
    /// `discard`) and the batch commits. The answer comes after the commit.
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Call {
            once: Once {
                f: Some(f),
                out: None,
            },
            reply,
        });
        self.tx
            .send(job)
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn serve(pool: SqlitePool, mut rx: mpsc::Receiver<Box<dyn Job>>, counters: Arc<Counters>) {
    let mut keeper = Keeper::default();
    let mut jobs: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        jobs.push(first);
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        counters.batches.fetch_add(1, Relaxed);
        counters.jobs.fetch_add(jobs.len() as u64, Relaxed);
        let outcome = batch(&pool, &mut keeper, &mut jobs).await;
        if let Err(e) = &outcome {
            counters.failed_batches.fetch_add(1, Relaxed);
            tracing::error!(error = %e, jobs = jobs.len(), "a write batch failed; its callers get the error");
        }
        for job in jobs.drain(..) {
            job.finish(outcome.as_ref().map(|_| ()));
        }
    }
}

async fn batch(pool: &SqlitePool, keeper: &mut Keeper, jobs: &mut [Box<dyn Job>]) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let mut handle = conn.lock_handle().await?;
    let cache = keeper.attach(&mut handle);
    let mut stmts = cache.lock();
    let db = handle.as_raw_handle().as_ptr();
    let mut tx = Tx {
        conn: Conn::new(db, &mut stmts)?,
        discard: false,
    };
    transact(&mut tx, jobs.iter_mut().map(|j| &mut **j))
}

/// One transaction over `jobs`; on error nothing of it is kept (rolled back here).
fn transact<'j, J: Run + ?Sized + 'j>(
    tx: &mut Tx<'_>,
    jobs: impl IntoIterator<Item = &'j mut J>,
) -> Result<()> {
    let result = run_all(tx, jobs);
    if result.is_err() && tx.in_transaction() {
        if let Err(e) = tx.execute("ROLLBACK", &[]) {
            tracing::error!(error = %e, "rolling back a failed write batch failed");
        }
    }
    result
}

fn run_all<'j, J: Run + ?Sized + 'j>(
    tx: &mut Tx<'_>,
    jobs: impl IntoIterator<Item = &'j mut J>,
) -> Result<()> {
    tx.execute("BEGIN IMMEDIATE", &[])?;
    for job in jobs {
        tx.execute("SAVEPOINT job", &[])?;
        tx.discard = false;
        let keep = job.run(tx);
        if !keep || tx.discard {
            // Fails when SQLite already rolled the whole transaction back: the batch is lost.
            tx.execute("ROLLBACK TO job", &[])?;
        }
        tx.execute("RELEASE job", &[])?;
    }
    tx.execute("COMMIT", &[])
        .map(|_| ())
}

/// Runs one job in its own transaction on the caller's thread, without the writer (the
/// standalone `ledger` functions; tools and tests). Statements are prepared for this call
/// only. Blocks the calling thread for the transaction, including a commit's fsync.
pub async fn once<T>(pool: &SqlitePool, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
    let mut conn = pool.acquire().await?;
    let mut handle = conn.lock_handle().await?;
    let mut stmts = Statements::new(handle.as_raw_handle().as_ptr());
    let db = handle.as_raw_handle().as_ptr();
    let mut tx = Tx {
        conn: Conn::new(db, &mut stmts)?,
        discard: false,
    };
    let mut one = Once { f: Some(f), out: None };
    transact(&mut tx, std::iter::once(&mut one))?;
    one.result()
}

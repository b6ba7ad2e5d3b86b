//! Writes that may wait: rows that are not money (the request log, cache entries) are
//! collected for `LINGER` from a batch's first and written as one job of the group-commit
//! writer.
//!
//! Under light load a commit of their own per request cost as much CPU as a reservation;
//! lingering, they share one commit with many others (and usually with the reservations of
//! the same moment). Rows only wait in memory, so a crash loses at most `LINGER` of them;
//! `flush` (at shutdown, and in tests) writes everything queued before it at once.
//!
//! On PostgreSQL the same collecting runs in `pg::lingering`, and each batch is one
//! multi-row statement in a transaction of its own on the pool (`BatchWrite::pg`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use super::pg::lingering::{Lingering as PgLingering, WriteBatch};
use super::writer::{Engine, Tx, Writer};
use super::Result;

/// How one kind of row is written as a batch, on each engine (`requests::LOG_BATCH`,
/// `cache::PUT_BATCH`).
pub struct BatchWrite<T: 'static> {
    /// Inside a job of the SQLite group-commit writer.
    pub sqlite: fn(&mut Tx<'_>, &[T]) -> Result<()>,
    /// Inside a PostgreSQL transaction of its own.
    pub pg: WriteBatch<T>,
}

/// Items a batch takes at most.
const BATCH: usize = 512;
/// How many items may wait before `push` waits for the task.
const QUEUE: usize = 10_000;
/// How long a batch waits for more items before it is written.
const LINGER: Duration = Duration::from_millis(25);

enum Msg<T> {
    Item(T),
    Flush(oneshot::Sender<()>),
}

/// The handle; cheap to clone. The task ends when every handle is dropped.
pub struct Lingering<T> {
    queue: Queue<T>,
}

impl<T> Clone for Lingering<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> Lingering<T> {
    /// Starts the task; `what` names the rows in log lines, `write` writes one batch.
    pub fn start(writer: Writer, what: &'static str, write: BatchWrite<T>) -> Lingering<T> {
        let queue = match writer.engine() {
            Engine::Postgres(_, pool) => PgLingering::start(pool.clone(), what, write.pg).queue,
            Engine::Sqlite(_) => {
                let write = write.sqlite;
                Queue::start(move |batch| {
                    let writer = writer.clone();
                    async move { store(&writer, batch, what, write).await }
                })
            }
        };
        Lingering { queue }
    }

    /// Queues an item (waits only if the task is `QUEUE` items behind). The wait runs in a
    /// task of its own: a caller dropped meanwhile — a request whose client left while its
    /// row waited — does not take the item with it.
    pub async fn push(&self, item: T) -> bool {
        self.queue.push(item).await
    }

    /// Queues an item if there is room, never waiting: for rows that may be lost (a cache
    /// hit's count), whose caller must not wait on the database (s39 attack H1: a hit
    /// waited once 10 000 counts were queued behind a database that did not answer).
    pub fn offer(&self, item: T) -> bool {
        self.queue.tx.try_send(Msg::Item(item)).is_ok()
    }

    /// Waits until every item queued before this call is written.
    pub async fn flush(&self) {
        self.queue.flush().await
    }
}

/// The collecting task of either engine and its sending end: items are collected for
/// `LINGER` from a batch's first (cut short by a flush, skipped when a full batch is
/// already queued), written in batches of at most `BATCH`, each handed to the engine's
/// `store`, the one thing that differs (`collect`).
pub(super) struct Queue<T> {
    tx: mpsc::Sender<Msg<T>>,
    /// Ends the collecting task's linger (`collect`).
    flushing: Arc<Notify>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            flushing: self.flushing.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> Queue<T> {
    /// Starts the task; `store` writes one batch (and retries it as its engine wants).
    pub(super) fn start<F, W>(store: F) -> Queue<T>
    where
        F: FnMut(Arc<[T]>) -> W + Send + 'static,
        W: Future<Output = ()> + Send + 'static,
    {
        Self::start_lingering(LINGER, store)
    }

    fn start_lingering<F, W>(linger: Duration, store: F) -> Queue<T>
    where
        F: FnMut(Arc<[T]>) -> W + Send + 'static,
        W: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        let flushing = Arc::new(Notify::new());
        tokio::spawn(collect(rx, linger, flushing.clone(), store));
        Queue { tx, flushing }
    }

    /// Queues an item (see `Lingering::push`).
    pub(super) async fn push(&self, item: T) -> bool {
        match self.tx.try_send(Msg::Item(item)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(msg)) => {
                let tx = self.tx.clone();
                let waiting = tokio::spawn(async move { tx.send(msg).await.is_ok() });
                waiting.await.unwrap_or(false)
            }
        }
    }

    /// Waits until every item queued before this call is written.
    pub(super) async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            // `notify_one`: when the task is not sleeping out a linger now (it is writing
            // a batch), the signal is kept and cuts the next linger, which may hold this
            // flush (`notify_waiters` would lose it). A flush on an idle queue leaves its
            // signal for the next batch, which is then written without a linger.
            self.flushing.notify_one();
            let _ = wait.await;
        }
    }
}

/// Collects batches. Only the first message of a batch wakes the task (`recv`): the
/// linger is slept out without polling the channel, so the items pushed meanwhile do not
/// each wake it across threads (a write to the runtime's eventfd and a context switch per
/// item: ~1.6 % of the gateway's CPU samples per lingering kind on the sending side
/// alone, `docs/PERFORMANCE.md`); a flush cuts the sleep short
/// (`flushing`). After the linger everything queued is taken, in batches of at most
/// `BATCH`, each ending at a flush, which is answered once its batch is written; items
/// that arrive while the last batch is written wait for a linger of their own.
async fn collect<T, F, W>(
    mut rx: mpsc::Receiver<Msg<T>>,
    linger: Duration,
    flushing: Arc<Notify>,
    mut store: F,
) where
    F: FnMut(Arc<[T]>) -> W,
    W: Future<Output = ()>,
{
    let mut batch: Vec<T> = Vec::with_capacity(BATCH);
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        // A full batch already queued (a backlog behind a slow write) waits no longer.
        if matches!(first, Msg::Item(_)) && rx.len() < BATCH {
            tokio::select! {
                _ = tokio::time::sleep(linger) => {}
                _ = flushing.notified() => {}
            }
        }
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Item(r) => batch.push(r),
                Msg::Flush(done) => waiting.push(done),
            }
            next = rx.try_recv().ok();
            if batch.len() < BATCH && waiting.is_empty() && next.is_some() {
                continue;
            }
            if !batch.is_empty() {
                store(Arc::from(std::mem::take(&mut batch))).await;
                batch.reserve(BATCH);
            }
            for done in waiting.drain(..) {
                let _ = done.send(());
            }
        }
    }
}

/// Writes one batch, retrying a failed write a few times before dropping it.
async fn store<T: Send + Sync + 'static>(
    writer: &Writer,
    batch: Arc<[T]>,
    what: &'static str,
    write: fn(&mut Tx<'_>, &[T]) -> Result<()>,
) {
    for attempt in 0..5u64 {
        let items = batch.clone();
        match writer.run(move |tx| write(tx, &items)).await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(error = %e, what, items = batch.len(), attempt, "a lingering write failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    tracing::error!(
        what,
        items = batch.len(),
        "rows dropped after 5 failed writes"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The batches a test's queue wrote, in order.
    type Written = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A runtime of one worker, as the gateway's main runtime is to an HTTP worker.
    fn one_worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// `f`'s output; the test fails, saying `what`, when it takes 10 s (the tests' lingers
    /// are 30 s).
    async fn soon<T>(f: impl Future<Output = T>, what: &str) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .unwrap_or_else(|_| panic!("{what}"))
    }

    /// A queue on a runtime of its own (`one_worker`), whose batches land in the returned
    /// list.
    fn queue(linger: Duration) -> (tokio::runtime::Runtime, Queue<u32>, Written) {
        let rt = one_worker();
        let written = Arc::new(Mutex::new(Vec::new()));
        let w = written.clone();
        let q = {
            let _in = rt.enter();
            Queue::start_lingering(linger, move |batch: Arc<[u32]>| {
                w.lock().unwrap().push(batch.to_vec());
                async {}
            })
        };
        (rt, q, written)
    }

    /// Every push used to wake the collecting task across threads (a write to the other
    /// runtime's eventfd and a context switch: ~1.6 % of the gateway's CPU samples per
    /// lingering kind on the sending side). Items pushed while a batch lingers must not wake it.
    #[tokio::test]
    async fn items_pushed_while_a_batch_lingers_do_not_wake_its_task() {
        let (rt, q, written) = queue(Duration::from_secs(30));
        let parks = || rt.metrics().worker_park_count(0);
        q.push(0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = parks();
        for i in 1..=50 {
            q.push(i).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let woken = parks() - before;
        assert!(
            woken < 5,
            "the collecting task was woken {woken} times for 50 items"
        );
        q.flush().await;
        assert_eq!(*written.lock().unwrap(), vec![(0..=50).collect::<Vec<_>>()]);
        drop(q);
        rt.shutdown_background();
    }

    /// An offer never waits: with the queue full behind a write that does not end, it is
    /// refused at once.
    #[tokio::test]
    async fn an_offer_to_a_full_queue_is_refused_without_waiting() {
        let rt = one_worker();
        let writing = Arc::new(Notify::new());
        let started = writing.clone();
        let q = {
            let _in = rt.enter();
            Queue::start_lingering(Duration::from_millis(1), move |_: Arc<[u32]>| {
                started.notify_one();
                std::future::pending::<()>()
            })
        };
        let l = Lingering { queue: q };
        assert!(l.offer(0));
        // The first batch is being written, for ever: the task takes no more.
        soon(writing.notified(), "the first batch was not written").await;
        let offered = (1..=(QUEUE + 10) as u32)
            .take_while(|&i| l.offer(i))
            .count();
        assert_eq!(offered, QUEUE, "the queue's room, then refused");
        assert!(!l.offer(0));
        drop(l);
        rt.shutdown_background();
    }

    /// A flush does not wait out the linger, and items beyond `BATCH` go in later batches,
    /// in order, each written before the flush returns.
    #[tokio::test]
    async fn a_flush_cuts_the_linger_and_batches_keep_their_bound_and_order() {
        let (rt, q, written) = queue(Duration::from_secs(30));
        let n = 2 * BATCH as u32 + 7;
        let started = std::time::Instant::now();
        for i in 0..n {
            q.push(i).await;
        }
        q.flush().await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the flush waited out the linger"
        );
        let batches = written.lock().unwrap().clone();
        assert!(
            batches.iter().all(|b| b.len() <= BATCH),
            "a batch over BATCH"
        );
        assert_eq!(
            batches.concat(),
            (0..n).collect::<Vec<_>>(),
            "lost or reordered"
        );
        // A flush with nothing queued returns at once; an item after it is written by the
        // next flush.
        q.flush().await;
        q.push(n).await;
        q.flush().await;
        assert_eq!(written.lock().unwrap().last().unwrap(), &vec![n]);
        drop(q);
        rt.shutdown_background();
    }

    /// A queue (30 s linger) whose every batch write is announced on the receiver and then
    /// waits for a permit of the semaphore.
    fn gated_queue() -> (
        tokio::runtime::Runtime,
        Queue<u32>,
        mpsc::UnboundedReceiver<Vec<u32>>,
        Arc<tokio::sync::Semaphore>,
    ) {
        let rt = one_worker();
        let (entered, writing) = mpsc::unbounded_channel();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let g = gate.clone();
        let q = {
            let _in = rt.enter();
            Queue::start_lingering(Duration::from_secs(30), move |batch: Arc<[u32]>| {
                let (entered, g) = (entered.clone(), g.clone());
                async move {
                    let _ = entered.send(batch.to_vec());
                    g.acquire().await.unwrap().forget();
                }
            })
        };
        (rt, q, writing, gate)
    }

    fn flush_in_background(q: &Queue<u32>) -> tokio::task::JoinHandle<()> {
        let q = q.clone();
        tokio::spawn(async move { q.flush().await })
    }

    /// Pushes item 0 and flushes it in the background: returns the flush once the gated
    /// queue is writing that first batch.
    async fn writing_the_first_batch(
        q: &Queue<u32>,
        writing: &mut mpsc::UnboundedReceiver<Vec<u32>>,
    ) -> tokio::task::JoinHandle<()> {
        q.push(0).await;
        let flushed = flush_in_background(q);
        assert_eq!(writing.recv().await.unwrap(), vec![0]);
        flushed
    }

    /// With no flush, a row is written once its linger is out (the sleep ends).
    #[tokio::test]
    async fn a_row_is_written_when_its_linger_ends_without_a_flush() {
        let (rt, q, written) = queue(Duration::from_millis(50));
        q.push(7).await;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while written.lock().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < until,
                "never written without a flush"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*written.lock().unwrap(), vec![vec![7]]);
        drop(q);
        rt.shutdown_background();
    }

    /// A backlog of a full batch or more, queued while a write was slow (a database out of
    /// reach), is written as soon as that write returns, not after another linger.
    #[tokio::test]
    async fn a_backlog_of_a_full_batch_is_written_without_a_linger() {
        let (rt, q, mut writing, gate) = gated_queue();
        let flushed = writing_the_first_batch(&q, &mut writing).await;
        let n = BATCH as u32 + 88;
        for i in 1..=n {
            q.push(i).await;
        }
        gate.add_permits(3);
        flushed.await.unwrap();
        let mut got = Vec::new();
        while got.len() < n as usize {
            let batch = soon(writing.recv(), "the backlog waited out a linger")
                .await
                .unwrap();
            got.extend(batch);
        }
        assert_eq!(got, (1..=n).collect::<Vec<_>>());
        drop(q);
        rt.shutdown_background();
    }

    /// A flush sent while the task is writing the batch before it: the task is not waiting
    /// for the flush's signal then, which must still cut the next batch's linger short
    /// (a signal kept for the next wait, `Notify::notify_one`; `notify_waiters` loses it).
    #[tokio::test]
    async fn a_flush_sent_while_a_batch_is_written_does_not_wait_out_the_next_linger() {
        let (rt, q, mut writing, gate) = gated_queue();
        let first = writing_the_first_batch(&q, &mut writing).await;
        q.push(1).await;
        let second = flush_in_background(&q);
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.add_permits(2);
        first.await.unwrap();
        soon(second, "the second flush waited out the linger")
            .await
            .unwrap();
        assert_eq!(writing.recv().await.unwrap(), vec![1]);
        drop(q);
        rt.shutdown_background();
    }
}

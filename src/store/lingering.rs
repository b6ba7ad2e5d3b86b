//! Writes that may wait: rows that are not money (the request log, cache entries) are
//! collected for up to `LINGER` and written as one job of the group-commit writer.
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

use tokio::sync::{mpsc, oneshot};

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

    /// Waits until every item queued before this call is written.
    pub async fn flush(&self) {
        self.queue.flush().await
    }
}

/// The collecting task of either engine and its sending end: items are collected for up to
/// `LINGER` (or `BATCH` of them, or until a flush) and each batch handed to the engine's
/// `store`, the one thing that differs.
pub(super) struct Queue<T> {
    tx: mpsc::Sender<Msg<T>>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
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
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(collect(rx, store));
        Queue { tx }
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
            let _ = wait.await;
        }
    }
}

async fn collect<T, F, W>(mut rx: mpsc::Receiver<Msg<T>>, mut store: F)
where
    F: FnMut(Arc<[T]>) -> W,
    W: Future<Output = ()>,
{
    let mut batch: Vec<T> = Vec::with_capacity(BATCH);
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + LINGER;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Item(r) => batch.push(r),
                Msg::Flush(done) => waiting.push(done),
            }
            if batch.len() >= BATCH || !waiting.is_empty() {
                break;
            }
            next = match rx.try_recv() {
                Ok(msg) => Some(msg),
                Err(_) => tokio::time::timeout_at(until, rx.recv())
                    .await
                    .ok()
                    .flatten(),
            };
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

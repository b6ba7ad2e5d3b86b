//! Writes that may wait, on PostgreSQL (see `store::lingering`): request-log rows and cache
//! entries are collected for up to `LINGER` and written as one transaction of their own —
//! one multi-row statement per batch (`pg::requests`, `pg::cache`). Unlike SQLite there is
//! no single write connection to share with the money path, so these batches take a pool
//! connection and leave the money writer alone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};

use crate::store::Result;

/// Items a batch takes at most.
const BATCH: usize = 512;
/// How many items may wait before `push` waits for the task.
const QUEUE: usize = 10_000;
/// How long a batch waits for more items before it is written.
const LINGER: Duration = Duration::from_millis(25);

/// Writes one batch inside the transaction it is given.
pub type WriteBatch<T> = for<'c> fn(&'c mut PgConnection, &'c [T]) -> BoxFuture<'c, Result<()>>;

enum Msg<T> {
    Item(T),
    Flush(oneshot::Sender<()>),
}

/// The handle; cheap to clone. The task ends when every handle is dropped.
pub struct Lingering<T> {
    tx: mpsc::Sender<Msg<T>>,
}

impl<T> Clone for Lingering<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Send + Sync + 'static> Lingering<T> {
    /// Starts the task; `what` names the rows in log lines, `write` writes one batch.
    pub fn start(pool: PgPool, what: &'static str, write: WriteBatch<T>) -> Lingering<T> {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(collect(pool, rx, what, write));
        Lingering { tx }
    }

    /// Queues an item (waits only if the task is `QUEUE` items behind), in a task of its
    /// own so a caller dropped meanwhile does not take the item with it.
    pub async fn push(&self, item: T) -> bool {
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
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn collect<T: Send + Sync + 'static>(
    pool: PgPool,
    mut rx: mpsc::Receiver<Msg<T>>,
    what: &'static str,
    write: WriteBatch<T>,
) {
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
            store(&pool, Arc::from(std::mem::take(&mut batch)), what, write).await;
            batch.reserve(BATCH);
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn once<T>(pool: &PgPool, items: &[T], write: WriteBatch<T>) -> Result<()> {
    let mut tx = pool.begin().await?;
    write(&mut tx, items).await?;
    tx.commit().await?;
    Ok(())
}

/// How long a batch is retried while the database is out of reach (a restart, a failover)
/// before its rows are dropped.
const OUT_OF_REACH: Duration = Duration::from_secs(300);

/// Writes one batch. While the database is out of reach (`StoreError::is_unavailable`) the
/// batch is retried, with a pause growing to 5 s, for up to `OUT_OF_REACH`: the rows of
/// requests answered just before an outage land once it returns (a deadlock or a lost
/// connection fails the whole transaction, so a retry writes it whole). A batch the
/// database refuses is tried 5 times before it is dropped.
async fn store<T: Send + Sync + 'static>(
    pool: &PgPool,
    batch: Arc<[T]>,
    what: &'static str,
    write: WriteBatch<T>,
) {
    let since = tokio::time::Instant::now();
    let mut refused = 0u64;
    let mut pause = Duration::from_millis(100);
    loop {
        let e = match once(pool, &batch, write).await {
            Ok(()) => return,
            Err(e) => e,
        };
        if e.is_unavailable() && since.elapsed() < OUT_OF_REACH {
            tracing::warn!(error = %e, what, items = batch.len(), "the database is out of reach; the batch waits for it");
        } else {
            refused += 1;
            if refused >= 5 {
                tracing::error!(error = %e, what, items = batch.len(), "rows dropped after failed writes");
                return;
            }
            tracing::error!(error = %e, what, items = batch.len(), attempt = refused, "a lingering write failed; retrying");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

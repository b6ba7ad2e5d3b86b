//! Writes that may wait, on PostgreSQL (see `store::lingering`): request-log rows and cache
//! entries are collected for up to `LINGER` and written as one transaction of their own —
//! one multi-row statement per batch (`pg::requests`, `pg::cache`). Unlike SQLite there is
//! no single write connection to share with the money path, so these batches take a pool
//! connection and leave the money writer alone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::{PgConnection, PgPool};

use crate::store::lingering::Queue;
use crate::store::Result;

/// Writes one batch inside the transaction it is given.
pub type WriteBatch<T> = for<'c> fn(&'c mut PgConnection, &'c [T]) -> BoxFuture<'c, Result<()>>;

/// The handle; cheap to clone. The task ends when every handle is dropped.
pub struct Lingering<T> {
    pub(in crate::store) queue: Queue<T>,
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
    pub fn start(pool: PgPool, what: &'static str, write: WriteBatch<T>) -> Lingering<T> {
        let queue = Queue::start(move |batch| {
            let pool = pool.clone();
            async move { store(&pool, batch, what, write).await }
        });
        Lingering { queue }
    }

    /// Queues an item (waits only if the task is `QUEUE` items behind), in a task of its
    /// own so a caller dropped meanwhile does not take the item with it.
    pub async fn push(&self, item: T) -> bool {
        self.queue.push(item).await
    }

    /// Waits until every item queued before this call is written.
    pub async fn flush(&self) {
        self.queue.flush().await
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

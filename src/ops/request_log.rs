//! The request log, off the request path: handlers hand a row to a channel; one task
//! writes rows in batches (one transaction per batch) and emits the JSON log line.
//! Never a prompt, a completion or a credential — the row has no field for them.

use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::ops::metrics;
use crate::store::requests::{self, RequestRow};
use crate::store::writer::Writer;

enum Msg {
    Row(Box<RequestRow>),
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct RequestLog {
    /// `None` when the log is off (the benchmark ladder's steps below `log`).
    tx: Option<mpsc::Sender<Msg>>,
}

const QUEUE: usize = 10_000;
const BATCH: usize = 512;
/// How long a batch waits for more rows before it is written (unless it is full or a
/// `flush` asks for it). Each write is a commit with a dozen WAL pages; under light load
/// one per request cost as much CPU as the reservation itself. Rows only wait in memory:
/// this is the log, not money (reservations and settlements never wait).
const LINGER: Duration = Duration::from_millis(25);

impl RequestLog {
    /// Rows go to the database through the store's group-commit writer, one job per batch
    /// (so they usually share a transaction with reservations and settlements).
    pub fn start(write: Writer) -> (RequestLog, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (RequestLog { tx: Some(tx) }, tokio::spawn(writer(write, rx)))
    }

    /// A log that records nothing (`serve --ladder` below `log`).
    pub fn off() -> RequestLog {
        RequestLog { tx: None }
    }

    /// Queues a row (waits only if the writer is `QUEUE` rows behind).
    pub async fn record(&self, row: RequestRow) {
        let Some(tx) = &self.tx else { return };
        tracing::info!(
            target: "sluice::request",
            request_id = %row.id,
            token_id = row.token_id,
            user_id = row.user_id,
            team_id = row.team_id,
            endpoint = row.endpoint,
            model = %row.model,
            served_model = %row.served_model,
            upstream = %row.upstream,
            status = row.status,
            error = row.error_code,
            attempts = row.attempts,
            stream = row.stream,
            cache = row.cache,
            latency_ms = row.latency_ms,
            ttfb_ms = row.ttfb_ms,
            input_tokens = row.input_tokens,
            output_tokens = row.output_tokens,
            cost_micros = row.cost_micros,
            "request"
        );
        metrics::request(
            row.token_id,
            &row.model,
            row.status,
            row.cache,
            row.latency_ms as f64 / 1000.0,
        );
        if tx.send(Msg::Row(Box::new(row))).await.is_err() {
            tracing::error!("request log writer is gone; row lost");
        }
    }

    /// Waits until every row queued before this call is in the database.
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = oneshot::channel();
        if tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn writer(pool: Writer, mut rx: mpsc::Receiver<Msg>) {
    let mut batch: Vec<RequestRow> = Vec::with_capacity(BATCH);
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + LINGER;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Row(r) => batch.push(*r),
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
            write(&pool, Arc::from(std::mem::take(&mut batch))).await;
            batch.reserve(BATCH);
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn write(pool: &Writer, batch: Arc<[RequestRow]>) {
    for attempt in 0..5u64 {
        let rows = batch.clone();
        match pool
            .run(move |tx| requests::insert_batch_tx(tx, &rows))
            .await
        {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(error = %e, rows = batch.len(), attempt, "writing the request log failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    tracing::error!(
        rows = batch.len(),
        "request log rows dropped after 5 failed writes"
    );
}

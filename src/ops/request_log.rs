//! The request log, off the request path: handlers hand a row over; rows are written in
//! lingering batches (`store::lingering`: one writer job per batch) and each emits its JSON
//! log line at once. Never a prompt, a completion or a credential — the row has no field
//! for them.

use crate::ops::metrics;
use crate::store::lingering::Lingering;
use crate::store::requests::{self, RequestRow};
use crate::store::writer::Writer;

#[derive(Clone)]
pub struct RequestLog {
    /// `None` when the log is off (the benchmark ladder's steps below `log`).
    rows: Option<Lingering<RequestRow>>,
}

impl RequestLog {
    /// Rows go to the database through the store's group-commit writer, one job per batch
    /// (so they usually share a transaction with reservations and settlements).
    pub fn start(writer: Writer) -> RequestLog {
        RequestLog {
            rows: Some(Lingering::start(
                writer,
                "request log rows",
                requests::LOG_BATCH,
            )),
        }
    }

    /// A log that records nothing (`serve --ladder` below `log`).
    pub fn off() -> RequestLog {
        RequestLog { rows: None }
    }

    /// Emits the log line and the metrics, and queues the row (waits only if the log is
    /// thousands of rows behind).
    pub async fn record(&self, row: RequestRow) {
        let Some(rows) = &self.rows else { return };
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
        if !rows.push(row).await {
            tracing::error!("request log writer is gone; row lost");
        }
    }

    /// Waits until every row queued before this call is in the database.
    pub async fn flush(&self) {
        if let Some(rows) = &self.rows {
            rows.flush().await;
        }
    }
}

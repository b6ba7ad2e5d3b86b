//! The request log, off the request path: handlers hand a row over; rows are written in
//! lingering batches (`store::lingering`: one writer job per batch) and each emits its JSON
//! log line at once. Never a prompt, a completion or a credential — the row has no field
//! for them.

use opentelemetry::KeyValue;

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
        crate::ops::memory::served();
        if row.trace.is_on() {
            let error = (row.status >= 500).then(|| row.error_code.unwrap_or("error"));
            row.trace.finish(&row.model, trace_attributes(&row), error);
        }
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

/// The request span's attributes (`ops::traces`), from its row: names, counts, money and
/// status, as the log line has them — never a prompt, a completion or a credential.
fn trace_attributes(row: &RequestRow) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("gen_ai.request.model", row.model.clone()),
        KeyValue::new("sluice.request_id", row.id.clone()),
        KeyValue::new("sluice.cache", row.cache),
        KeyValue::new("sluice.cost_micros", row.cost_micros),
        KeyValue::new("sluice.attempts", i64::from(row.attempts)),
        KeyValue::new("sluice.stream", row.stream),
        KeyValue::new("http.response.status_code", i64::from(row.status)),
        KeyValue::new("gen_ai.usage.input_tokens", row.input_tokens),
        KeyValue::new("gen_ai.usage.output_tokens", row.output_tokens),
    ];
    let named = [
        ("gen_ai.response.model", &row.upstream_model),
        ("sluice.upstream", &row.upstream),
    ];
    for (key, value) in named.into_iter().filter(|(_, v)| !v.is_empty()) {
        a.push(KeyValue::new(key, value.clone()));
    }
    let ids = [
        ("sluice.token_id", row.token_id),
        ("sluice.team_id", row.team_id),
    ];
    for (key, id) in ids {
        if let Some(id) = id {
            a.push(KeyValue::new(key, id));
        }
    }
    if let Some(code) = row.error_code {
        a.push(KeyValue::new("error.type", code));
    }
    a
}

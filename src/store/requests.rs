//! The request log: one row per logical request, written in batches by
//! `ops::request_log` off the request path.

use super::raw::Param;
use super::writer::Tx;
use super::Result;

#[derive(Debug, Clone, Default)]
pub struct RequestRow {
    pub id: String,
    pub token_id: Option<i64>,
    pub user_id: Option<i64>,
    pub team_id: Option<i64>,
    pub endpoint: &'static str,
    pub model: String,
    pub served_model: String,
    pub upstream: String,
    /// The model name the upstream was sent (the route's `model`): what the provider bills
    /// it under (`finance::reconcile`).
    pub upstream_model: String,
    pub status: u16,
    pub error_code: Option<&'static str>,
    pub stream: bool,
    pub attempts: u32,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_micros: i64,
    pub latency_ms: i64,
    pub ttfb_ms: Option<i64>,
    pub cache: &'static str,
    /// The first 8 bytes (hex) of the cache entry that answered, and its similarity.
    pub cache_key: Option<String>,
    pub cache_similarity: Option<f64>,
    pub created_at: String,
}

const INSERT: &str = "INSERT OR IGNORE INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
                 error_code, stream, attempts, input_tokens, output_tokens, cost_micros, latency_ms, ttfb_ms, cache, cache_key,
                 cache_similarity, created_at, upstream_model)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// How the request log's batches are written on each engine (`store::lingering`).
pub const LOG_BATCH: super::lingering::BatchWrite<RequestRow> = super::lingering::BatchWrite {
    sqlite: insert_batch_tx,
    pg: pg_batch,
};

fn pg_batch<'c>(
    conn: &'c mut sqlx::PgConnection,
    rows: &'c [RequestRow],
) -> futures_util::future::BoxFuture<'c, Result<()>> {
    Box::pin(super::pg::requests::insert_batch_tx(conn, rows))
}

/// `insert_batch` inside a write transaction of the store writer (the gateway's path).
pub fn insert_batch_tx(tx: &mut Tx<'_>, rows: &[RequestRow]) -> Result<()> {
    for r in rows {
        tx.execute(
            INSERT,
            &[
                r.id.as_str().into(),
                r.token_id.into(),
                r.user_id.into(),
                r.team_id.into(),
                r.endpoint.into(),
                r.model.as_str().into(),
                r.served_model.as_str().into(),
                r.upstream.as_str().into(),
                i64::from(r.status).into(),
                r.error_code.into(),
                i64::from(r.stream).into(),
                i64::from(r.attempts).into(),
                r.input_tokens.into(),
                r.output_tokens.into(),
                r.cost_micros.into(),
                r.latency_ms.into(),
                r.ttfb_ms.into(),
                r.cache.into(),
                r.cache_key.as_deref().into(),
                r.cache_similarity.map_or(Param::Null, Param::Real),
                r.created_at.as_str().into(),
                r.upstream_model.as_str().into(),
            ],
        )?;
    }
    for (token, at) in last_used(rows) {
        tx.execute(
            "UPDATE tokens SET last_used_at = ? WHERE id = ?",
            &[Param::Text(at), token.into()],
        )?;
    }
    Ok(())
}

/// One `last_used_at` update per token and batch (as before: the smallest timestamp of the
/// token's rows in the batch).
fn last_used(rows: &[RequestRow]) -> Vec<(i64, &str)> {
    let mut used: Vec<(i64, &str)> = rows
        .iter()
        .filter_map(|r| r.token_id.map(|t| (t, r.created_at.as_str())))
        .collect();
    used.sort_unstable();
    used.dedup_by_key(|(t, _)| *t);
    used
}

/// Inserts a batch in one transaction; tokens' `last_used_at` is refreshed alongside.
pub async fn insert_batch(db: &super::Db, rows: &[RequestRow]) -> Result<()> {
    if let super::Backend::Postgres(pg) = &db.backend {
        return super::pg::requests::insert_batch(&pg.pool, rows).await;
    }
    let mut tx = db.begin().await?;
    for r in rows {
        sqlx::query(
            "INSERT OR IGNORE INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
                 error_code, stream, attempts, input_tokens, output_tokens, cost_micros, latency_ms, ttfb_ms, cache, cache_key,
                 cache_similarity, created_at, upstream_model)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&r.id)
        .bind(r.token_id)
        .bind(r.user_id)
        .bind(r.team_id)
        .bind(r.endpoint)
        .bind(&r.model)
        .bind(&r.served_model)
        .bind(&r.upstream)
        .bind(r.status)
        .bind(r.error_code)
        .bind(r.stream)
        .bind(r.attempts)
        .bind(r.input_tokens)
        .bind(r.output_tokens)
        .bind(r.cost_micros)
        .bind(r.latency_ms)
        .bind(r.ttfb_ms)
        .bind(r.cache)
        .bind(&r.cache_key)
        .bind(r.cache_similarity)
        .bind(&r.created_at)
        .bind(&r.upstream_model)
        .execute(tx.sqlite()?)
        .await?;
    }
    for (token, at) in last_used(rows) {
        sqlx::query("UPDATE tokens SET last_used_at = ? WHERE id = ?")
            .bind(at)
            .bind(token)
            .execute(tx.sqlite()?)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

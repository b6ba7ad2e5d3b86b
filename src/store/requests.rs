//! The request log: one row per logical request, written in batches by
//! `ops::request_log` off the request path.

use super::raw::Param;
use super::writer::Tx;
use super::Result;
use crate::quota::pricing::Parts;

#[derive(Debug, Clone, Default)]
pub struct RequestRow {
    pub id: String,
    pub token_id: Option<i64>,
    /// A rotated token whose text was presented, working as `token_id` (its successor)
    /// during its overlap: not stored in the row, but its `last_used_at` follows its use.
    pub presented_token_id: Option<i64>,
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
    /// A side of the usage (input or output) was not the upstream's report but the
    /// gateway's own count (`pipeline::USAGE_ESTIMATED`), whatever `error_code` says.
    pub usage_estimated: bool,
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
    /// The request's tags, canonical (`pipeline::tags`); empty for none.
    pub tags: String,
    /// The admin's tags among them (the token's over the team's defaults), canonical: the
    /// rollup's bound never counts nor rolls up these pairs (`store::tag_bound`).
    pub fixed_tags: String,
    /// The tokens priced apart, by kind (`Usage::parts` in `quota::pricing`): the columns after
    /// `created_at` (`INSERT`); fresh input and text output are the rest of the
    /// totals.
    pub kinds: Parts,
    /// The request's trace (`ops::traces`), ended when the row is recorded: not stored.
    pub trace: crate::ops::traces::Trace,
}

/// The per-kind figures of a row, in the order of their columns in `INSERT` (and in
/// `pg::requests`).
pub fn kind_values(k: &Parts) -> [i64; 9] {
    [
        k.cached_input,
        k.cache_write_5m,
        k.cache_write_1h,
        k.reasoning,
        k.audio_input,
        k.audio_output,
        k.image_input,
        k.image_output,
        k.web_search_calls,
    ]
}

/// The SQLite insert of one row.
const INSERT: &str = "INSERT OR IGNORE INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
                 error_code, stream, attempts, input_tokens, output_tokens, cost_micros, latency_ms, ttfb_ms, cache, cache_key,
                 cache_similarity, created_at, tags, upstream_model, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
                 reasoning_tokens, audio_input_tokens, audio_output_tokens, image_input_tokens, image_output_tokens,
                 web_search_calls, usage_estimated)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// What one logged request adds to its day's row of the spend rollup (`store::spend`), its
/// tags bounded (`store::tag_bound`); the trigger on `spend_days` adds the same to the
/// month's row (`spend_months`, migrations `0023_spend_months`, `0024_usage_estimated`) in
/// this statement. An estimated request's cost is added to `estimated_micros` too.
const ROLLUP: &str = "INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                 requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
             VALUES (substr(?1, 1, 10), ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (day, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
                 requests = requests + 1, errors = errors + excluded.errors,
                 input_tokens = input_tokens + excluded.input_tokens,
                 output_tokens = output_tokens + excluded.output_tokens,
                 cost_micros = cost_micros + excluded.cost_micros,
                 estimated_micros = estimated_micros + excluded.estimated_micros";

/// What a row adds to the rollup's `estimated_micros`: its cost when its usage was
/// estimated.
pub fn estimated_micros(r: &RequestRow) -> i64 {
    if r.usage_estimated {
        r.cost_micros
    } else {
        0
    }
}

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

/// `insert_batch` inside a write transaction of the store writer (the gateway's path). A
/// row already logged (the same id) is skipped and adds nothing to the rollup; a row of an
/// unauthenticated request (no token) is logged but belongs to no report.
pub fn insert_batch_tx(tx: &mut Tx<'_>, rows: &[RequestRow]) -> Result<()> {
    for r in rows {
        let mut params = vec![
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
            r.tags.as_str().into(),
            r.upstream_model.as_str().into(),
        ];
        params.extend(kind_values(&r.kinds).map(Param::from));
        params.push(i64::from(r.usage_estimated).into());
        let inserted = tx.execute(INSERT, &params)?;
        if let (1, Some(token)) = (inserted, r.token_id) {
            let tags = super::tag_bound::bounded_tx(tx, r)?;
            tx.execute(
                ROLLUP,
                &[
                    r.created_at.as_str().into(),
                    r.team_id.unwrap_or(0).into(),
                    r.user_id.unwrap_or(0).into(),
                    token.into(),
                    r.model.as_str().into(),
                    r.served_model.as_str().into(),
                    r.upstream.as_str().into(),
                    tags.as_str().into(),
                    i64::from(!(200..300).contains(&r.status)).into(),
                    r.input_tokens.into(),
                    r.output_tokens.into(),
                    r.cost_micros.into(),
                    estimated_micros(r).into(),
                ],
            )?;
        }
    }
    for (token, at) in last_used(rows) {
        tx.execute(LAST_USED, &[Param::Text(at), token.into()])?;
    }
    Ok(())
}

/// Moves a token's `last_used_at` forward only: a batch flushed late (a retry, another
/// host's) carries older uses than one already written. Timestamps are `clock::db_time`
/// text, whose order is time order. A use is kept at most a minute ahead of the database's
/// clock, and a value further ahead (a clock since set back) gives way: forward-only, a
/// future value would hide every use until real time passed it (s23 final attack #3).
const LAST_USED: &str =
    "WITH cap(at) AS (SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+60 seconds'))
     UPDATE tokens SET last_used_at = MIN(?1, (SELECT at FROM cap))
     WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at < MIN(?1, (SELECT at FROM cap))
                        OR last_used_at > (SELECT at FROM cap))";

/// One `last_used_at` update per token and batch, at the latest of the token's rows in the
/// batch, for the token served and a rotated one whose text was used.
pub(super) fn last_used(rows: &[RequestRow]) -> Vec<(i64, &str)> {
    let mut used: Vec<(i64, &str)> = rows
        .iter()
        .flat_map(|r| {
            [r.token_id, r.presented_token_id].map(|t| t.map(|t| (t, r.created_at.as_str())))
        })
        .flatten()
        .collect();
    // Latest first within each token, so the dedup keeps it.
    used.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)));
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
        let mut q = sqlx::query(INSERT)
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
            .bind(&r.tags)
            .bind(&r.upstream_model);
        for v in kind_values(&r.kinds) {
            q = q.bind(v);
        }
        q = q.bind(r.usage_estimated);
        let inserted = q.execute(tx.sqlite()?).await?.rows_affected();
        if let (1, Some(token)) = (inserted, r.token_id) {
            let tags = super::tag_bound::bounded(tx.sqlite()?, r).await?;
            sqlx::query(ROLLUP)
                .bind(&r.created_at)
                .bind(r.team_id.unwrap_or(0))
                .bind(r.user_id.unwrap_or(0))
                .bind(token)
                .bind(&r.model)
                .bind(&r.served_model)
                .bind(&r.upstream)
                .bind(&tags)
                .bind(i64::from(!(200..300).contains(&r.status)))
                .bind(r.input_tokens)
                .bind(r.output_tokens)
                .bind(r.cost_micros)
                .bind(estimated_micros(r))
                .execute(tx.sqlite()?)
                .await?;
        }
    }
    for (token, at) in last_used(rows) {
        sqlx::query(LAST_USED)
            .bind(at)
            .bind(token)
            .execute(tx.sqlite()?)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

//! Finance's own reads and records: Sluice's spend by (day, upstream, upstream model) — the
//! one question reconciliation asks of the request log, kept in one function so it can be
//! answered from a rollup later — and the stored reconciliation runs.

use chrono::NaiveDate;
use serde::Serialize;
use sqlx::FromRow;

use super::Result;

/// Spend of one upstream deployment on one model on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct UpstreamSpend {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// The deployment that answered (`requests.upstream`).
    pub upstream: String,
    /// The model the upstream was sent (before this was logged: the model that answered).
    pub model: String,
    /// Σ `cost_micros`: what the requests cost, absorbed amounts included (the provider
    /// billed them).
    pub cost_micros: i64,
}

const SPEND_BY_UPSTREAM: &str = "SELECT substr(created_at, 1, 10) AS day, upstream,
        CASE WHEN upstream_model <> '' THEN upstream_model ELSE served_model END AS model,
        SUM(cost_micros) AS cost_micros
     FROM requests WHERE created_at >= ?1 AND created_at < ?2 AND upstream <> ''
     GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";

/// Spend in `[from, to)` (database times) by day, upstream and upstream model.
pub async fn spend_by_upstream(db: &super::Db, from: &str, to: &str) -> Result<Vec<UpstreamSpend>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::finance::spend_by_upstream(&pg.pool, from, to).await
        }
    };
    Ok(sqlx::query_as(SPEND_BY_UPSTREAM)
        .bind(from)
        .bind(to)
        .fetch_all(&sqlite.read)
        .await?)
}

/// Tokens of one upstream deployment on one model on one UTC day, as the request log
/// recorded them (the provider's report, else the gateway's count).
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct UpstreamTokens {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub upstream: String,
    /// The model the upstream was sent (as `UpstreamSpend::model`).
    pub model: String,
    /// Σ `input_tokens`: every input token, cached ones included.
    pub input_tokens: i64,
    /// Σ `output_tokens`: every output token, reasoning included.
    pub output_tokens: i64,
    /// Σ `cached_input_tokens`.
    pub cached_input_tokens: i64,
}

const TOKENS_BY_UPSTREAM: &str = "SELECT substr(created_at, 1, 10) AS day, upstream,
        CASE WHEN upstream_model <> '' THEN upstream_model ELSE served_model END AS model,
        SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens,
        SUM(cached_input_tokens) AS cached_input_tokens
     FROM requests WHERE created_at >= ?1 AND created_at < ?2 AND upstream <> ''
       AND endpoint IN ('chat.completions', 'completions', 'responses', 'messages')
     GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";

/// Tokens in `[from, to)` (database times) by day, upstream and upstream model: what
/// `sluice reconcile --provider openai-usage` holds against the provider's usage export.
/// Only the endpoints that export counts — OpenAI's completions usage: chat, legacy
/// completions, responses, and messages (an Anthropic-format request an OpenAI deployment
/// is sent as chat, `upstream::providers::path`); not embeddings, another export. The
/// request log names them as `Endpoint::name` does.
pub async fn tokens_by_upstream(
    db: &super::Db,
    from: &str,
    to: &str,
) -> Result<Vec<UpstreamTokens>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::finance::tokens_by_upstream(&pg.pool, from, to).await
        }
    };
    Ok(sqlx::query_as(TOKENS_BY_UPSTREAM)
        .bind(from)
        .bind(to)
        .fetch_all(&sqlite.read)
        .await?)
}

/// One run of `sluice reconcile`.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Reconciliation {
    pub id: i64,
    pub provider: String,
    pub source: String,
    pub first_day: String,
    pub last_day: String,
    pub threshold_micros: i64,
    pub threshold_pct_bp: i64,
    pub sluice_micros: i64,
    pub provider_micros: i64,
    pub flagged: i64,
    pub created_at: String,
}

/// One (day, model, account) of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, FromRow)]
pub struct ReconciliationRow {
    pub day: String,
    pub model: String,
    pub account: String,
    pub sluice_micros: i64,
    pub provider_micros: i64,
    pub diff_micros: i64,
    pub flagged: bool,
}

/// Stores a run and its rows inside `tx`; `run.id` is ignored, the new id returned.
pub async fn save(
    tx: &mut super::Tx,
    run: &Reconciliation,
    rows: &[ReconciliationRow],
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::finance::save(conn, run, rows).await;
    }
    let conn = tx.sqlite()?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO reconciliations (provider, source, first_day, last_day, threshold_micros, threshold_pct_bp,
              sluice_micros, provider_micros, flagged, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(&run.provider)
    .bind(&run.source)
    .bind(&run.first_day)
    .bind(&run.last_day)
    .bind(run.threshold_micros)
    .bind(run.threshold_pct_bp)
    .bind(run.sluice_micros)
    .bind(run.provider_micros)
    .bind(run.flagged)
    .bind(&run.created_at)
    .fetch_one(&mut *conn)
    .await?;
    for r in rows {
        sqlx::query(
            "INSERT INTO reconciliation_rows (run_id, day, model, account, sluice_micros, provider_micros, diff_micros, flagged)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(&r.day)
        .bind(&r.model)
        .bind(&r.account)
        .bind(r.sluice_micros)
        .bind(r.provider_micros)
        .bind(r.diff_micros)
        .bind(r.flagged)
        .execute(&mut *conn)
        .await?;
    }
    Ok(id)
}

pub(in crate::store) const LAST_RUN: &str =
    "SELECT id, provider, source, first_day, last_day, threshold_micros, threshold_pct_bp,
        sluice_micros, provider_micros, flagged, created_at
     FROM reconciliations ORDER BY id DESC LIMIT 1";

pub(in crate::store) const RUN_ROWS: &str =
    "SELECT day, model, account, sluice_micros, provider_micros, diff_micros, flagged
     FROM reconciliation_rows WHERE run_id = $1 ORDER BY day, model, account";

/// The latest run and its rows (day, model, account order), if there was one.
pub async fn last(db: &super::Db) -> Result<Option<(Reconciliation, Vec<ReconciliationRow>)>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::finance::last(&pg.pool).await,
    };
    let Some(run) = sqlx::query_as::<_, Reconciliation>(LAST_RUN)
        .fetch_optional(&sqlite.read)
        .await?
    else {
        return Ok(None);
    };
    let rows = sqlx::query_as(RUN_ROWS)
        .bind(run.id)
        .fetch_all(&sqlite.read)
        .await?;
    Ok(Some((run, rows)))
}

/// Spend of one token (with its user and team) on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct TokenDay {
    pub token_id: i64,
    pub user_id: Option<i64>,
    pub team_id: Option<i64>,
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Σ `cost_micros` (absorbed amounts included: a forecast errs early, not late).
    pub cost_micros: i64,
}

/// From the daily rollup (`spend_days`, kept on write with the request rows: the same sums,
/// read per day instead of per request); `0` there is "no user / team".
const SPEND_BY_TOKEN_DAY: &str =
    "SELECT token_id, NULLIF(user_id, 0) AS user_id, NULLIF(team_id, 0) AS team_id, day,
        CAST(SUM(cost_micros) AS BIGINT) AS cost_micros
     FROM spend_days WHERE day >= ?1 AND day < ?2
     GROUP BY token_id, user_id, team_id, day ORDER BY 1, 4";

/// Spend on the UTC days `[from, to)` by token and day — the one question forecasts and
/// the digest ask (users and teams are sums of their tokens' rows).
pub async fn spend_by_token_day(
    db: &super::Db,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<TokenDay>> {
    let (from, to) = (from.to_string(), to.to_string());
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::finance::spend_by_token_day(&pg.pool, &from, &to).await
        }
    };
    Ok(sqlx::query_as(SPEND_BY_TOKEN_DAY)
        .bind(from)
        .bind(to)
        .fetch_all(&sqlite.read)
        .await?)
}

/// Undoes `note_once`: what was noted was not sent after all, so a later check sends it.
pub async fn forget(db: &super::Db, kind: &str, subject: &str, day: &str) -> Result<()> {
    let mut tx = db.begin().await?;
    if let Some((conn, _)) = tx.pg() {
        sqlx::query("DELETE FROM finance_notices WHERE kind = $1 AND subject = $2 AND day = $3")
            .bind(kind)
            .bind(subject)
            .bind(day)
            .execute(conn)
            .await?;
    } else {
        sqlx::query("DELETE FROM finance_notices WHERE kind = ? AND subject = ? AND day = ?")
            .bind(kind)
            .bind(subject)
            .bind(day)
            .execute(tx.sqlite()?)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Records that `kind` was sent about `subject` on `day`; `false` when some replica already
/// had (the primary key decides, so exactly one replica sends it).
pub async fn note_once(
    db: &super::Db,
    kind: &str,
    subject: &str,
    day: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool> {
    let mut tx = db.begin().await?;
    let at = crate::clock::db_time(now);
    let inserted = if let Some((conn, _)) = tx.pg() {
        sqlx::query(
            "INSERT INTO finance_notices (kind, subject, day, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(kind)
        .bind(subject)
        .bind(day)
        .bind(&at)
        .execute(conn)
        .await?
        .rows_affected()
    } else {
        sqlx::query(
            "INSERT OR IGNORE INTO finance_notices (kind, subject, day, created_at) VALUES (?, ?, ?, ?)",
        )
        .bind(kind)
        .bind(subject)
        .bind(day)
        .bind(&at)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
    };
    tx.commit().await?;
    Ok(inserted == 1)
}

//! Finance's reads and records on PostgreSQL (see `store::finance`): the same statements,
//! `SUM` cast back from NUMERIC and grouped by its expressions.

use sqlx::{PgConnection, PgPool};

use crate::store::finance::{Reconciliation, ReconciliationRow, UpstreamSpend, UpstreamTokens};
use crate::store::Result;

pub async fn spend_by_upstream(pool: &PgPool, from: &str, to: &str) -> Result<Vec<UpstreamSpend>> {
    Ok(sqlx::query_as(
        "SELECT substr(created_at, 1, 10) AS day, upstream,
                CASE WHEN upstream_model <> '' THEN upstream_model ELSE served_model END AS model,
                SUM(cost_micros)::BIGINT AS cost_micros
         FROM requests WHERE created_at >= $1 AND created_at < $2 AND upstream <> ''
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

pub async fn tokens_by_upstream(
    pool: &PgPool,
    from: &str,
    to: &str,
) -> Result<Vec<UpstreamTokens>> {
    Ok(sqlx::query_as(
        "SELECT substr(created_at, 1, 10) AS day, upstream,
                CASE WHEN upstream_model <> '' THEN upstream_model ELSE served_model END AS model,
                SUM(input_tokens)::BIGINT AS input_tokens, SUM(output_tokens)::BIGINT AS output_tokens,
                SUM(cached_input_tokens)::BIGINT AS cached_input_tokens
         FROM requests WHERE created_at >= $1 AND created_at < $2 AND upstream <> ''
           AND endpoint IN ('chat.completions', 'completions', 'responses', 'messages')
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

pub async fn save(
    conn: &mut PgConnection,
    run: &Reconciliation,
    rows: &[ReconciliationRow],
) -> Result<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO reconciliations (provider, source, first_day, last_day, threshold_micros, threshold_pct_bp,
              sluice_micros, provider_micros, flagged, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(super::text::key(&run.provider).as_ref())
    .bind(super::text::key(&run.source).as_ref())
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
    let col = |f: fn(&ReconciliationRow) -> &str| {
        rows.iter()
            .map(|r| super::text::key(f(r)).into_owned())
            .collect::<Vec<String>>()
    };
    let num = |f: fn(&ReconciliationRow) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
    sqlx::query(
        "INSERT INTO reconciliation_rows (run_id, day, model, account, sluice_micros, provider_micros, diff_micros, flagged)
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::boolean[])",
    )
    .bind(id)
    .bind(col(|r| &r.day))
    .bind(col(|r| &r.model))
    .bind(col(|r| &r.account))
    .bind(num(|r| r.sluice_micros))
    .bind(num(|r| r.provider_micros))
    .bind(num(|r| r.diff_micros))
    .bind(rows.iter().map(|r| r.flagged).collect::<Vec<bool>>())
    .execute(conn)
    .await?;
    Ok(id)
}

pub async fn last(pool: &PgPool) -> Result<Option<(Reconciliation, Vec<ReconciliationRow>)>> {
    let Some(run) = sqlx::query_as::<_, Reconciliation>(crate::store::finance::LAST_RUN)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let rows = sqlx::query_as(crate::store::finance::RUN_ROWS)
        .bind(run.id)
        .fetch_all(pool)
        .await?;
    Ok(Some((run, rows)))
}

/// `store::finance::spend_by_token_day`: from the daily rollup, on the days `[from, to)`.
pub async fn spend_by_token_day(
    pool: &PgPool,
    from: &str,
    to: &str,
) -> Result<Vec<crate::store::finance::TokenDay>> {
    Ok(sqlx::query_as(
        "SELECT token_id, NULLIF(user_id, 0) AS user_id, NULLIF(team_id, 0) AS team_id, day,
                SUM(cost_micros)::BIGINT AS cost_micros
         FROM spend_days WHERE day >= $1 AND day < $2
         GROUP BY token_id, user_id, team_id, day ORDER BY 1, 4",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

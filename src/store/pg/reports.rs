//! What finance and the dashboard read (PostgreSQL; see `store::reports`). The same results
//! as SQLite's queries:
//!
//! - every text column is `COLLATE "C"` (the schema), so orders and comparisons are
//!   bytewise like SQLite's;
//! - `SUM` of BIGINT is NUMERIC here: cast back; SQLite's `SUM(bool)` is a `COUNT FILTER`;
//! - SQLite lets a grouped query name a column it does not group by (any row's value);
//!   PostgreSQL does not: a group's label is `MIN(label)` (one value per group anyway);
//! - the audit filter's prefix match: SQLite's `LIKE` ignores ASCII case only, which is
//!   `ILIKE` under the "C" collation (it folds ASCII letters only).

use sqlx::{PgPool, Postgres, QueryBuilder};

use super::text;
use crate::store::reports::{
    AuditLine, GroupBy, RequestFilter, RequestLine, SpendRow, TopToken, Totals,
};
use crate::store::Result;

/// Spend, request count and non-2xx count since `from` (a database time string).
pub async fn totals(pool: &PgPool, scope: Option<i64>, from: &str) -> Result<Totals> {
    let (spend, requests, errors): (i64, i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(cost_micros), 0)::BIGINT, COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299)
         FROM requests WHERE created_at >= $1 AND ($2::BIGINT IS NULL OR team_id = $2)",
    )
    .bind(from)
    .bind(scope)
    .fetch_one(pool)
    .await?;
    Ok(Totals {
        spend_micros: spend,
        requests,
        errors,
    })
}

/// (label expression, grouping expression), as `store::reports`'s `GroupBy::sql`.
fn group_sql(by: GroupBy) -> (&'static str, &'static str) {
    match by {
        GroupBy::Token => (
            "COALESCE(t.prefix || '… (' || u.username || ')', 'no token')",
            "r.token_id",
        ),
        GroupBy::User => ("COALESCE(u.username, 'no user')", "r.user_id"),
        GroupBy::Team => ("COALESCE(tm.name, 'no team')", "r.team_id"),
        GroupBy::Model => (
            "CASE WHEN r.served_model <> '' THEN r.served_model ELSE r.model END",
            "CASE WHEN r.served_model <> '' THEN r.served_model ELSE r.model END",
        ),
        GroupBy::Day => ("substr(r.created_at, 1, 10)", "substr(r.created_at, 1, 10)"),
    }
}

/// Spend in `[from, to)` grouped by `by`; days in date order, everything else dearest first.
pub async fn spend(
    pool: &PgPool,
    scope: Option<i64>,
    by: GroupBy,
    from: &str,
    to: &str,
) -> Result<Vec<SpendRow>> {
    let (label, group) = group_sql(by);
    let order = if by == GroupBy::Day {
        "label"
    } else {
        "spend_micros DESC, label"
    };
    let sql = format!(
        "SELECT MIN({label}) AS label, COUNT(*) AS requests, COALESCE(SUM(r.input_tokens), 0)::BIGINT AS input_tokens,
                COALESCE(SUM(r.output_tokens), 0)::BIGINT AS output_tokens, COALESCE(SUM(r.cost_micros), 0)::BIGINT AS spend_micros
         FROM requests r LEFT JOIN tokens t ON t.id = r.token_id LEFT JOIN users u ON u.id = r.user_id
              LEFT JOIN teams tm ON tm.id = r.team_id
         WHERE r.created_at >= $1 AND r.created_at < $2 AND ($3::BIGINT IS NULL OR r.team_id = $3) AND r.token_id IS NOT NULL
         GROUP BY {group} ORDER BY {order} LIMIT 5000"
    );
    Ok(sqlx::query_as(&sql)
        .bind(from)
        .bind(to)
        .bind(scope)
        .fetch_all(pool)
        .await?)
}

pub async fn top_tokens(
    pool: &PgPool,
    scope: Option<i64>,
    from: &str,
    n: i64,
) -> Result<Vec<TopToken>> {
    Ok(sqlx::query_as(
        "SELECT r.token_id, MIN(t.prefix) AS prefix, MIN(u.username) AS user, SUM(r.cost_micros)::BIGINT AS spend_micros,
                COUNT(*) AS requests
         FROM requests r JOIN tokens t ON t.id = r.token_id JOIN users u ON u.id = t.user_id
         WHERE r.created_at >= $1 AND ($2::BIGINT IS NULL OR r.team_id = $2)
         GROUP BY r.token_id ORDER BY spend_micros DESC, r.token_id LIMIT $3",
    )
    .bind(from)
    .bind(scope)
    .bind(n)
    .fetch_all(pool)
    .await?)
}

/// One page of the request log, newest first; `limit + 1` rows (as `store::reports`).
pub async fn requests(
    pool: &PgPool,
    f: &RequestFilter,
    limit: i64,
    offset: i64,
) -> Result<Vec<RequestLine>> {
    let texts = [f.model.as_deref(), f.from.as_deref(), f.to.as_deref()];
    if texts.into_iter().flatten().any(|t| !text::storable(t)) {
        return Ok(Vec::new());
    }
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT r.id, r.created_at, tm.name AS team, u.username AS user, r.token_id, t.prefix, r.endpoint, r.model,
                r.served_model, r.status, r.error_code, r.stream, r.attempts, r.input_tokens, r.output_tokens,
                r.cost_micros, r.latency_ms, r.cache
         FROM requests r LEFT JOIN tokens t ON t.id = r.token_id LEFT JOIN users u ON u.id = r.user_id
              LEFT JOIN teams tm ON tm.id = r.team_id WHERE 1 = 1",
    );
    if let Some(v) = f.team_id {
        q.push(" AND r.team_id = ").push_bind(v);
    }
    if let Some(v) = f.user_id {
        q.push(" AND r.user_id = ").push_bind(v);
    }
    if let Some(v) = f.token_id {
        q.push(" AND r.token_id = ").push_bind(v);
    }
    if let Some(v) = &f.model {
        q.push(" AND (r.model = ")
            .push_bind(v.clone())
            .push(" OR r.served_model = ")
            .push_bind(v.clone())
            .push(")");
    }
    match f.status {
        Some((code, false)) => {
            q.push(" AND r.status = ").push_bind(code);
        }
        Some((class, true)) => {
            q.push(" AND r.status / 100 = ").push_bind(class);
        }
        None => {}
    }
    if let Some(v) = &f.from {
        q.push(" AND r.created_at >= ").push_bind(v.clone());
    }
    if let Some(v) = &f.to {
        q.push(" AND r.created_at < ").push_bind(v.clone());
    }
    q.push(" ORDER BY r.created_at DESC, r.id DESC LIMIT ")
        .push_bind(limit.saturating_add(1))
        .push(" OFFSET ")
        .push_bind(offset);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

/// One page of the audit log, newest first (`limit + 1` rows, as `requests`).
pub async fn audit(
    pool: &PgPool,
    action: Option<&str>,
    actor: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<AuditLine>> {
    if [action, actor]
        .into_iter()
        .flatten()
        .any(|t| !text::storable(t))
    {
        return Ok(Vec::new());
    }
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT id, actor, address, action, target, before, after, created_at FROM audit_log WHERE 1 = 1",
    );
    if let Some(a) = action {
        // A prefix match, ASCII case ignored as SQLite's LIKE does; the input's own
        // wildcards escaped.
        let escaped = a
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        q.push(" AND action ILIKE ")
            .push_bind(format!("{escaped}%"))
            .push(" ESCAPE '\\'");
    }
    if let Some(a) = actor {
        q.push(" AND actor = ").push_bind(a.to_string());
    }
    q.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit.saturating_add(1))
        .push(" OFFSET ")
        .push_bind(offset);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

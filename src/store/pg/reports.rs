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

use chrono::{DateTime, Duration, NaiveTime, Utc};
use sqlx::{PgPool, Postgres, QueryBuilder};

use super::text;
use crate::clock::db_time;
use crate::store::reports::{AuditLine, RequestFilter, RequestLine, TopToken, Totals};
use crate::store::Result;

/// How a range from `from` on is read: the whole days inside it from `request_days`, the
/// partial day at its start from `requests`. Every `created_at` is a `db_time` string, so
/// text order is time order and a row's day is its first 10 characters; a bound that is
/// not itself a `db_time` string (text order and time order could then disagree) is read
/// from `requests` alone.
struct Span {
    /// Whether whole days are read from `request_days`: `first_day <= day`.
    days: bool,
    first_day: String,
    /// `requests` rows in `[from, head_end)`; `None`: every row from `from` on.
    head_end: Option<String>,
}

fn midnight(t: DateTime<Utc>) -> DateTime<Utc> {
    t.date_naive().and_time(NaiveTime::MIN).and_utc()
}

impl Span {
    fn from(from: &str) -> Span {
        let exact = DateTime::parse_from_rfc3339(from)
            .ok()
            .map(|t| t.with_timezone(&Utc))
            .filter(|t| db_time(*t) == from);
        let Some(start) = exact else {
            return Span {
                days: false,
                first_day: String::new(),
                head_end: None,
            };
        };
        let first = if midnight(start) == start {
            start
        } else {
            midnight(start) + Duration::days(1)
        };
        Span {
            days: true,
            first_day: first.format("%Y-%m-%d").to_string(),
            head_end: Some(db_time(first)),
        }
    }
}

/// Spend, request count and non-2xx count since `from` (a database time string).
pub async fn totals(pool: &PgPool, scope: Option<i64>, from: &str) -> Result<Totals> {
    let span = Span::from(from);
    let (spend, requests, errors): (i64, i64, i64) = sqlx::query_as(
        "WITH src AS (
            SELECT requests, errors, cost_micros FROM request_days
             WHERE $3 AND day >= $4 AND ($2::BIGINT IS NULL OR team_id = $2)
            UNION ALL
            SELECT 1, CASE WHEN status NOT BETWEEN 200 AND 299 THEN 1 ELSE 0 END, cost_micros FROM requests
             WHERE created_at >= $1 AND ($5::TEXT IS NULL OR created_at < $5) AND ($2::BIGINT IS NULL OR team_id = $2))
         SELECT COALESCE(SUM(cost_micros), 0)::BIGINT, COALESCE(SUM(requests), 0)::BIGINT, COALESCE(SUM(errors), 0)::BIGINT
         FROM src",
    )
    .bind(from)
    .bind(scope)
    .bind(span.days)
    .bind(&span.first_day)
    .bind(&span.head_end)
    .fetch_one(pool)
    .await?;
    Ok(Totals {
        spend_micros: spend,
        requests,
        errors,
    })
}

pub async fn top_tokens(
    pool: &PgPool,
    scope: Option<i64>,
    from: &str,
    n: i64,
) -> Result<Vec<TopToken>> {
    let span = Span::from(from);
    Ok(sqlx::query_as(
        "WITH src AS (
            SELECT token_id, requests, cost_micros FROM request_days
             WHERE $4 AND day >= $5 AND token_id IS NOT NULL AND ($2::BIGINT IS NULL OR team_id = $2)
            UNION ALL
            SELECT token_id, 1, cost_micros FROM requests
             WHERE created_at >= $1 AND ($6::TEXT IS NULL OR created_at < $6) AND token_id IS NOT NULL
               AND ($2::BIGINT IS NULL OR team_id = $2))
         SELECT r.token_id, MIN(t.prefix) AS prefix, MIN(u.username) AS user, SUM(r.cost_micros)::BIGINT AS spend_micros,
                SUM(r.requests)::BIGINT AS requests
         FROM src r JOIN tokens t ON t.id = r.token_id JOIN users u ON u.id = t.user_id
         GROUP BY r.token_id ORDER BY spend_micros DESC, r.token_id LIMIT $3",
    )
    .bind(from)
    .bind(scope)
    .bind(n)
    .bind(span.days)
    .bind(&span.first_day)
    .bind(&span.head_end)
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
    let mut q: QueryBuilder<Postgres> = crate::store::reports::requests_query(f, limit, offset);
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
        // The login's actions, also those it took with an API key (`name (api key …)`):
        // compared as text, no pattern. Not `name (oidc …)`: a sign-in's row is named by
        // the provider's display name, which anyone at the provider may choose (s26 diff
        // attack #4).
        let named = format!("{a} (api key ");
        q.push(" AND (actor = ")
            .push_bind(a.to_string())
            .push(" OR substr(actor, 1, ")
            .push_bind(named.chars().count() as i64)
            .push("::int) = ")
            .push_bind(named)
            .push(")");
    }
    q.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit.saturating_add(1))
        .push(" OFFSET ")
        .push_bind(offset);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

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
use crate::store::reports::{
    AuditLine, GroupBy, RequestFilter, RequestLine, SpendRow, TopToken, Totals,
};
use crate::store::Result;

/// How a report's time range is read: the whole days inside it from `request_days`, the
/// partial days at its edges from `requests`. Every `created_at` is a `db_time` string, so
/// text order is time order and a row's day is its first 10 characters; a bound that is
/// not itself a `db_time` string (text order and time order could then disagree) is read
/// from `requests` alone.
struct Span {
    /// Whether whole days are read from `request_days`: `first_day <= day < end_day`.
    days: bool,
    first_day: String,
    /// `None`: no end (every day from `first_day` on).
    end_day: Option<String>,
    /// `requests` rows in `[from, head_end)` …
    head_end: Option<String>,
    /// … and in `[tail_start, to)`.
    tail_start: Option<String>,
}

fn parse_exact(s: &str) -> Option<DateTime<Utc>> {
    let t = DateTime::parse_from_rfc3339(s).ok()?.with_timezone(&Utc);
    (db_time(t) == s).then_some(t)
}

fn midnight(t: DateTime<Utc>) -> DateTime<Utc> {
    t.date_naive().and_time(NaiveTime::MIN).and_utc()
}

fn day_of(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d").to_string()
}

impl Span {
    fn of(from: &str, to: Option<&str>) -> Span {
        let raw = Span {
            days: false,
            first_day: String::new(),
            end_day: None,
            head_end: to.map(str::to_string),
            tail_start: None,
        };
        let Some(start) = parse_exact(from) else {
            return raw;
        };
        let first = if midnight(start) == start {
            start
        } else {
            midnight(start) + Duration::days(1)
        };
        let end = match to.map(parse_exact) {
            None => None,
            Some(None) => return raw,
            Some(Some(t)) => Some(midnight(t)),
        };
        if end.is_some_and(|end| end <= first) {
            return raw;
        }
        Span {
            days: true,
            first_day: day_of(first),
            end_day: end.map(day_of),
            head_end: Some(db_time(first)),
            tail_start: end.map(db_time),
        }
    }
}

/// Spend, request count and non-2xx count since `from` (a database time string).
pub async fn totals(pool: &PgPool, scope: Option<i64>, from: &str) -> Result<Totals> {
    let span = Span::of(from, None);
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

/// (label expression, grouping expression) over `src` (the rows of `spend`), as
/// `store::reports`'s `GroupBy::sql` over `requests`.
fn group_sql(by: GroupBy) -> (&'static str, &'static str) {
    match by {
        GroupBy::Token => (
            "COALESCE(t.prefix || '… (' || u.username || ')', 'no token')",
            "r.token_id",
        ),
        GroupBy::User => ("COALESCE(u.username, 'no user')", "r.user_id"),
        GroupBy::Team => ("COALESCE(tm.name, 'no team')", "r.team_id"),
        GroupBy::Model => ("r.model", "r.model"),
        GroupBy::Day => ("r.day", "r.day"),
    }
}

/// Spend in `[from, to)` grouped by `by`; days in date order, everything else dearest first.
/// Requests that never authenticated (no token) cost nothing and belong to nobody: left out.
pub async fn spend(
    pool: &PgPool,
    scope: Option<i64>,
    by: GroupBy,
    from: &str,
    to: &str,
) -> Result<Vec<SpendRow>> {
    let span = Span::of(from, Some(to));
    let (label, group) = group_sql(by);
    let order = if by == GroupBy::Day {
        "label"
    } else {
        "spend_micros DESC, label"
    };
    let sql = format!(
        "WITH src AS (
            SELECT token_id, user_id, team_id, model, day, requests, input_tokens, output_tokens, cost_micros
              FROM request_days
             WHERE $4 AND day >= $5 AND day < $6 AND token_id IS NOT NULL AND ($3::BIGINT IS NULL OR team_id = $3)
            UNION ALL
            SELECT token_id, user_id, team_id, CASE WHEN served_model <> '' THEN served_model ELSE model END,
                   substr(created_at, 1, 10), 1, input_tokens, output_tokens, cost_micros
              FROM requests
             WHERE ((created_at >= $1 AND created_at < $7) OR (created_at >= $8 AND created_at < $2))
               AND token_id IS NOT NULL AND ($3::BIGINT IS NULL OR team_id = $3))
         SELECT MIN({label}) AS label, SUM(r.requests)::BIGINT AS requests,
                COALESCE(SUM(r.input_tokens), 0)::BIGINT AS input_tokens,
                COALESCE(SUM(r.output_tokens), 0)::BIGINT AS output_tokens,
                COALESCE(SUM(r.cost_micros), 0)::BIGINT AS spend_micros
         FROM src r LEFT JOIN tokens t ON t.id = r.token_id LEFT JOIN users u ON u.id = r.user_id
              LEFT JOIN teams tm ON tm.id = r.team_id
         GROUP BY {group} ORDER BY {order} LIMIT 5000"
    );
    Ok(sqlx::query_as(&sql)
        .bind(from)
        .bind(to)
        .bind(scope)
        .bind(span.days)
        .bind(&span.first_day)
        .bind(span.end_day.as_deref().unwrap_or(""))
        .bind(span.head_end.as_deref().unwrap_or(to))
        .bind(span.tail_start.as_deref().unwrap_or(to))
        .fetch_all(pool)
        .await?)
}

pub async fn top_tokens(
    pool: &PgPool,
    scope: Option<i64>,
    from: &str,
    n: i64,
) -> Result<Vec<TopToken>> {
    let span = Span::of(from, None);
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
        q.push(" AND actor = ").push_bind(a.to_string());
    }
    q.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit.saturating_add(1))
        .push(" OFFSET ")
        .push_bind(offset);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

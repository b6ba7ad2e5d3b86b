//! What finance and the dashboard read: spend aggregates from the request log (whose
//! `cost_micros` is what a request really cost, absorbed amounts included, so every cent is
//! counted), the filtered request log, and the audit log. All reads; `scope` = `Some(team)`
//! restricts every query to one team.

use serde::Serialize;
use sqlx::{Database, Encode, FromRow, QueryBuilder, Sqlite, Type};

use super::Result;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub spend_micros: i64,
    pub requests: i64,
    pub errors: i64,
}

/// Spend, request count and non-2xx count since `from` (a database time string).
pub async fn totals(db: &super::Db, scope: Option<i64>, from: &str) -> Result<Totals> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::reports::totals(&pg.pool, scope, from).await
        }
    };
    let pool = &sqlite.read;
    let (spend, requests, errors): (i64, i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(cost_micros), 0), COUNT(*), COALESCE(SUM(status NOT BETWEEN 200 AND 299), 0)
         FROM requests WHERE created_at >= ?1 AND (?2 IS NULL OR team_id = ?2)",
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

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct TopToken {
    pub token_id: i64,
    pub prefix: String,
    pub user: String,
    pub spend_micros: i64,
    pub requests: i64,
}

pub async fn top_tokens(
    db: &super::Db,
    scope: Option<i64>,
    from: &str,
    n: i64,
) -> Result<Vec<TopToken>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::reports::top_tokens(&pg.pool, scope, from, n).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(
        "SELECT r.token_id, t.prefix, u.username AS user, SUM(r.cost_micros) AS spend_micros, COUNT(*) AS requests
         FROM requests r JOIN tokens t ON t.id = r.token_id JOIN users u ON u.id = t.user_id
         WHERE r.created_at >= ?1 AND (?2 IS NULL OR r.team_id = ?2)
         GROUP BY r.token_id ORDER BY spend_micros DESC, r.token_id LIMIT ?3",
    )
    .bind(from)
    .bind(scope)
    .bind(n)
    .fetch_all(pool)
    .await?)
}

/// Request-log filters; every field is optional. Dates are database time strings.
#[derive(Debug, Clone, Default)]
pub struct RequestFilter {
    pub team_id: Option<i64>,
    pub user_id: Option<i64>,
    pub token_id: Option<i64>,
    pub model: Option<String>,
    /// An exact status (`429`) or a class (`4` for 4xx).
    pub status: Option<(i64, bool)>,
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct RequestLine {
    pub id: String,
    pub created_at: String,
    pub team: Option<String>,
    pub user: Option<String>,
    pub token_id: Option<i64>,
    pub prefix: Option<String>,
    pub endpoint: String,
    pub model: String,
    pub served_model: String,
    pub status: i64,
    pub error_code: Option<String>,
    /// A side of the usage was the gateway's count, not the upstream's report
    /// (`store::requests::RequestRow::usage_estimated`).
    pub usage_estimated: bool,
    pub stream: bool,
    pub attempts: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_micros: i64,
    pub latency_ms: i64,
    pub cache: String,
    /// The model name the upstream billed the request under, and the request's tags.
    pub upstream_model: String,
    pub tags: String,
    /// The parts of the totals priced apart (`Usage::parts` in `quota::pricing`) and the web searches.
    pub cached_input_tokens: i64,
    pub cache_write_5m_tokens: i64,
    pub cache_write_1h_tokens: i64,
    pub reasoning_tokens: i64,
    pub audio_input_tokens: i64,
    pub audio_output_tokens: i64,
    pub image_input_tokens: i64,
    pub image_output_tokens: i64,
    pub web_search_calls: i64,
}

impl RequestLine {
    /// The kinds priced apart that the request had, for the request log's page
    /// ("cached 200 · 1 h write 3 000 · 2 searches"); empty for plain tokens.
    pub fn kinds(&self) -> String {
        let parts = [
            ("cached", self.cached_input_tokens),
            ("5 m write", self.cache_write_5m_tokens),
            ("1 h write", self.cache_write_1h_tokens),
            ("reasoning", self.reasoning_tokens),
            ("audio in", self.audio_input_tokens),
            ("audio out", self.audio_output_tokens),
            ("image in", self.image_input_tokens),
            ("image out", self.image_output_tokens),
            ("searches", self.web_search_calls),
        ];
        parts
            .iter()
            .filter(|(_, n)| *n != 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// One page of the request log, newest first; `limit + 1` rows are read so the caller can
/// tell whether an older page exists.
pub async fn requests(
    db: &super::Db,
    f: &RequestFilter,
    limit: i64,
    offset: i64,
) -> Result<Vec<RequestLine>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::reports::requests(&pg.pool, f, limit, offset).await
        }
    };
    let mut q: QueryBuilder<Sqlite> = requests_query(f, limit, offset);
    Ok(q.build_query_as().fetch_all(&sqlite.read).await?)
}

/// The statement of `requests` on either engine: the same text, placeholders aside.
pub(super) fn requests_query<'a, DB: Database>(
    f: &RequestFilter,
    limit: i64,
    offset: i64,
) -> QueryBuilder<'a, DB>
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    let mut q = QueryBuilder::new(
        "SELECT r.id, r.created_at, tm.name AS team, u.username AS user, r.token_id, t.prefix, r.endpoint, r.model,
                r.served_model, r.status, r.error_code, r.usage_estimated, r.stream, r.attempts, r.input_tokens, r.output_tokens,
                r.cost_micros, r.latency_ms, r.cache, r.upstream_model, r.tags, r.cached_input_tokens,
                r.cache_write_5m_tokens, r.cache_write_1h_tokens, r.reasoning_tokens, r.audio_input_tokens,
                r.audio_output_tokens, r.image_input_tokens, r.image_output_tokens, r.web_search_calls
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
    q
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct AuditLine {
    pub id: i64,
    pub actor: String,
    pub address: String,
    pub action: String,
    pub target: String,
    pub before: Option<String>,
    pub after: Option<String>,
    pub created_at: String,
}

/// One page of the audit log, newest first (`limit + 1` rows, as `requests`).
pub async fn audit(
    db: &super::Db,
    action: Option<&str>,
    actor: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<AuditLine>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::reports::audit(&pg.pool, action, actor, limit, offset).await
        }
    };
    let pool = &sqlite.read;
    let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT id, actor, address, action, target, before, after, created_at FROM audit_log WHERE 1 = 1",
    );
    if let Some(a) = action {
        // A prefix match on the action (`token.` finds every token action); LIKE's own
        // wildcards in the input are escaped.
        let escaped = a
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        q.push(" AND action LIKE ")
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
            .push(") = ")
            .push_bind(named)
            .push(")");
    }
    q.push(" ORDER BY id DESC LIMIT ")
        .push_bind(limit + 1)
        .push(" OFFSET ")
        .push_bind(offset);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

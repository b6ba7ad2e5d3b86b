//! The request log on PostgreSQL (see `store::requests`). A batch is one `INSERT … SELECT
//! FROM unnest(…)` over one array per column — one statement and one round trip whatever
//! its size — idempotent on the request id (`ON CONFLICT DO NOTHING`, SQLite's `INSERT OR
//! IGNORE`), and one `UPDATE … FROM unnest(…)` for the tokens' `last_used_at`. The same
//! statement adds the rows it inserted to the spend-by-day rollups: `request_days`, which
//! the dashboard reads (`pg::reports`), and `spend_days`, which spend reports read
//! (`store::spend`).

use sqlx::{PgConnection, PgPool};

use super::text;
use crate::store::requests::{kind_values, last_used, RequestRow};
use crate::store::Result;

/// The batch, and what it adds to `request_days`, `spend_days` and `spend_months`
/// (`store::spend`, its tags bounded: `$33`–`$34`, by request id, `store::tag_bound`; the
/// `usage_estimated` column is `$35`), in one
/// statement. The months are the days' rows summed per month, from the same rows and text;
/// their CTE is last and unread, so it runs after the days' (PostgreSQL runs such CTEs in
/// order at the end): each host locks every day row, then every month row, each in key order. Only rows
/// really inserted count (`RETURNING` leaves out the ones already logged); the day rows are
/// upserted in key order, so two hosts' batches lock them in the same order. The bounded
/// text is joined on the id, never on the logged text (which the log may store otherwise:
/// `pg::text`), and a row without one keeps its logged text rather than drop out of the
/// rollup; the statement answers the counts `insert_batch_tx` checks.
const INSERT: &str = "WITH ins AS (
       INSERT INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
            error_code, stream, attempts, input_tokens, output_tokens, cost_micros, latency_ms, ttfb_ms, cache, cache_key,
            cache_similarity, created_at, tags, upstream_model, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
            reasoning_tokens, audio_input_tokens, audio_output_tokens, image_input_tokens, image_output_tokens,
            web_search_calls, usage_estimated)
       SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[],
            $8::text[], $9::bigint[], $10::text[], $11::boolean[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[],
            $16::bigint[], $17::bigint[], $18::text[], $19::text[], $20::float8[], $21::text[], $22::text[],
            $23::text[], $24::bigint[], $25::bigint[], $26::bigint[], $27::bigint[], $28::bigint[], $29::bigint[],
            $30::bigint[], $31::bigint[], $32::bigint[], $35::boolean[])
       ON CONFLICT (id) DO NOTHING
       RETURNING id, created_at, token_id, user_id, team_id, model, served_model, upstream, status, input_tokens,
            output_tokens, cost_micros, tags, CASE WHEN usage_estimated THEN cost_micros ELSE 0 END AS estimated_micros),
     days AS (
       INSERT INTO request_days AS d (day, token_id, user_id, team_id, model, requests, errors, input_tokens, output_tokens, cost_micros)
       SELECT substr(created_at, 1, 10), token_id, user_id, team_id,
              CASE WHEN served_model <> '' THEN served_model ELSE model END,
              COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299),
              SUM(input_tokens), SUM(output_tokens), SUM(cost_micros)
       FROM ins GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
       ON CONFLICT (day, token_id, user_id, team_id, model) DO UPDATE SET
              requests = d.requests + EXCLUDED.requests, errors = d.errors + EXCLUDED.errors,
              input_tokens = d.input_tokens + EXCLUDED.input_tokens,
              output_tokens = d.output_tokens + EXCLUDED.output_tokens,
              cost_micros = d.cost_micros + EXCLUDED.cost_micros),
     b AS (SELECT * FROM unnest($33::text[], $34::text[]) AS b(id, tags)),
     tagged AS (SELECT ins.*, b.tags AS bounded FROM ins LEFT JOIN b ON b.id = ins.id WHERE ins.token_id IS NOT NULL),
     spend AS (
       INSERT INTO spend_days AS s (day, team_id, user_id, token_id, model, served_model, upstream, tags,
              requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
       SELECT substr(created_at, 1, 10), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
              upstream, COALESCE(bounded, tags), COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299),
              SUM(input_tokens), SUM(output_tokens), SUM(cost_micros), SUM(estimated_micros)
       FROM tagged GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8
       ON CONFLICT (day, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
              requests = s.requests + EXCLUDED.requests, errors = s.errors + EXCLUDED.errors,
              input_tokens = s.input_tokens + EXCLUDED.input_tokens,
              output_tokens = s.output_tokens + EXCLUDED.output_tokens,
              cost_micros = s.cost_micros + EXCLUDED.cost_micros,
              estimated_micros = s.estimated_micros + EXCLUDED.estimated_micros),
     months AS (
       INSERT INTO spend_months AS m (month, team_id, user_id, token_id, model, served_model, upstream, tags,
              requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
       SELECT substr(created_at, 1, 7), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
              upstream, COALESCE(bounded, tags), COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299),
              SUM(input_tokens), SUM(output_tokens), SUM(cost_micros), SUM(estimated_micros)
       FROM tagged GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8
       ON CONFLICT (month, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
              requests = m.requests + EXCLUDED.requests, errors = m.errors + EXCLUDED.errors,
              input_tokens = m.input_tokens + EXCLUDED.input_tokens,
              output_tokens = m.output_tokens + EXCLUDED.output_tokens,
              cost_micros = m.cost_micros + EXCLUDED.cost_micros,
              estimated_micros = m.estimated_micros + EXCLUDED.estimated_micros)
     SELECT (SELECT COUNT(*) FROM ins WHERE token_id IS NOT NULL), (SELECT COUNT(*) FROM tagged),
            (SELECT COUNT(bounded) FROM tagged)";

/// Marks the transaction as writing `spend_months` itself (migration `0012_spend_months`).
const MONTHS_WRITTEN: &str = "SELECT set_config('sluice.spend_months', 'written', true)";

/// `request_days`, `spend_days` and `spend_months` rebuilt from the request log (after rows were copied in
/// by other means than `insert_batch_tx`: `sluice migrate-store`).
pub async fn rebuild_days(conn: &mut PgConnection) -> Result<()> {
    // One transaction (a savepoint inside the caller's): `MONTHS_WRITTEN` is transaction-local,
    // and on a bare connection it would end with its own statement, leaving the trigger to
    // add every day to the months written below a second time.
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let conn = &mut *tx;
    sqlx::query("DELETE FROM request_days")
        .execute(&mut *conn)
        .await?;
    sqlx::query(MONTHS_WRITTEN).execute(&mut *conn).await?;
    for table in ["spend_days", "spend_months"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query(
        "INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                                 requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
         SELECT substr(created_at, 1, 10), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
                upstream, tags, COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299),
                SUM(input_tokens), SUM(output_tokens), SUM(cost_micros),
                SUM(CASE WHEN usage_estimated THEN cost_micros ELSE 0 END)
         FROM requests WHERE token_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 7, 8",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO spend_months (month, team_id, user_id, token_id, model, served_model, upstream, tags,
                                   requests, errors, input_tokens, output_tokens, cost_micros, estimated_micros)
         SELECT substr(day, 1, 7), team_id, user_id, token_id, model, served_model, upstream, tags,
                SUM(requests), SUM(errors), SUM(input_tokens), SUM(output_tokens), SUM(cost_micros),
                SUM(estimated_micros)
         FROM spend_days GROUP BY 1, 2, 3, 4, 5, 6, 7, 8",
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO request_days (day, token_id, user_id, team_id, model, requests, errors, input_tokens, output_tokens, cost_micros)
         SELECT substr(created_at, 1, 10), token_id, user_id, team_id,
                CASE WHEN served_model <> '' THEN served_model ELSE model END,
                COUNT(*), COUNT(*) FILTER (WHERE status NOT BETWEEN 200 AND 299),
                SUM(input_tokens), SUM(output_tokens), SUM(cost_micros)
         FROM requests GROUP BY 1, 2, 3, 4, 5",
    )
    .execute(&mut *conn)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The tokens' rows are locked in id order (`ORDER BY … FOR NO KEY UPDATE`), so two hosts'
/// batches touching the same tokens wait for each other instead of deadlocking; the column
/// only moves forward, at most a minute ahead of the database's clock — the one clock every
/// host shares — a value further ahead giving way (as on SQLite: `store::requests::LAST_USED`).
const LAST_USED: &str = "WITH cap AS (SELECT to_char(now() AT TIME ZONE 'UTC' + interval '60 seconds',
                                     'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS at),
          v AS (SELECT id, LEAST(at, (SELECT at FROM cap)) AS at
                FROM unnest($1::bigint[], $2::text[]) AS v(id, at)),
          locked AS (SELECT t.id FROM tokens t JOIN v ON v.id = t.id ORDER BY t.id FOR NO KEY UPDATE OF t)
     UPDATE tokens t SET last_used_at = v.at FROM v, locked
     WHERE t.id = v.id AND locked.id = v.id
       AND (t.last_used_at IS NULL OR t.last_used_at < v.at OR t.last_used_at > (SELECT at FROM cap))";

/// Writes a batch inside the caller's transaction: one statement for the rows, one for
/// the tokens' `last_used_at`.
pub async fn insert_batch_tx(conn: &mut PgConnection, rows: &[RequestRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    // A NUL (which PostgreSQL's text cannot hold) becomes U+FFFD: one such row must not
    // fail the whole batch it shares with others (`pg::text`).
    let col = |f: fn(&RequestRow) -> String| {
        rows.iter()
            .map(|r| text::key(&f(r)).into_owned())
            .collect::<Vec<String>>()
    };
    let num = |f: fn(&RequestRow) -> Option<i64>| rows.iter().map(f).collect::<Vec<Option<i64>>>();
    let mut q = sqlx::query(INSERT)
        .bind(col(|r| r.id.clone()))
        .bind(num(|r| r.token_id))
        .bind(num(|r| r.user_id))
        .bind(num(|r| r.team_id))
        .bind(col(|r| r.endpoint.to_string()))
        .bind(col(|r| r.model.clone()))
        .bind(col(|r| r.served_model.clone()))
        .bind(col(|r| r.upstream.clone()))
        .bind(num(|r| Some(i64::from(r.status))))
        .bind(rows.iter().map(|r| r.error_code).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.stream).collect::<Vec<_>>())
        .bind(num(|r| Some(i64::from(r.attempts))))
        .bind(num(|r| Some(r.input_tokens)))
        .bind(num(|r| Some(r.output_tokens)))
        .bind(num(|r| Some(r.cost_micros)))
        .bind(num(|r| Some(r.latency_ms)))
        .bind(num(|r| r.ttfb_ms))
        .bind(col(|r| r.cache.to_string()))
        .bind(
            rows.iter()
                .map(|r| r.cache_key.as_deref().map(|k| text::key(k).into_owned()))
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.cache_similarity).collect::<Vec<_>>())
        .bind(col(|r| r.created_at.clone()))
        .bind(col(|r| r.tags.clone()))
        .bind(col(|r| r.upstream_model.clone()));
    // One array per kind column, in `kind_values`' order.
    for k in 0..9 {
        q = q.bind(
            rows.iter()
                .map(|r| kind_values(&r.kinds)[k])
                .collect::<Vec<i64>>(),
        );
    }
    // The rollup's tags, bounded (`store::tag_bound`): request id → rolled-up tags.
    let [ids, rolled] = super::tag_bound::bounded(&mut *conn, rows).await?;
    // This statement writes the months itself: the trigger that follows other writers of
    // `spend_days` (the previous version's) stays off for this transaction.
    sqlx::query(MONTHS_WRITTEN).execute(&mut *conn).await?;
    let counts = q
        .bind(ids)
        .bind(rolled)
        .bind(rows.iter().map(|r| r.usage_estimated).collect::<Vec<_>>())
        .fetch_one(&mut *conn)
        .await?;
    let count = |i: usize| sqlx::Row::try_get::<i64, _>(&counts, i);
    let (logged, summed, bounded) = (count(0)?, count(1)?, count(2)?);
    // Every logged row is summed into the rollup exactly once (a twice-joined row would
    // count its spend twice: the batch is refused, nothing of it kept) …
    if summed != logged {
        return Err(crate::store::StoreError::Batch(format!(
            "the spend rollup would sum {summed} rows of the {logged} logged"
        )));
    }
    // … and one that missed its bounded text is summed under its logged text.
    if bounded != logged {
        tracing::error!(
            logged,
            bounded,
            "spend rollup: rows summed under their logged tags, past the tag bound"
        );
    }
    let (ids, ats): (Vec<i64>, Vec<&str>) = last_used(rows).into_iter().unzip();
    if !ids.is_empty() {
        sqlx::query(LAST_USED)
            .bind(ids)
            .bind(ats)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Inserts a batch in one transaction; tokens' `last_used_at` is refreshed alongside.
pub async fn insert_batch(pool: &PgPool, rows: &[RequestRow]) -> Result<()> {
    let mut tx = pool.begin().await?;
    insert_batch_tx(&mut tx, rows).await?;
    tx.commit().await?;
    Ok(())
}

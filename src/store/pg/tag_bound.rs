//! The spend rollup's bound on tag cardinality on PostgreSQL (see `store::tag_bound`): one
//! statement admits a batch's new (day, key, value)s while their key has room and answers
//! which of the batch's values are admitted, now or before.

use std::collections::HashSet;

use sqlx::PgConnection;

use crate::store::requests::RequestRow;
use crate::store::tag_bound::{day, rolled};
use crate::store::Result;
use crate::tags::Tags;

const ADMIT: &str = "WITH cand AS (SELECT DISTINCT d, k, v FROM unnest($1::text[], $2::text[], $3::text[]) AS c(d, k, v)),
     fresh AS (SELECT c.d, c.k, c.v, ROW_NUMBER() OVER (PARTITION BY c.d, c.k ORDER BY c.v) AS n FROM cand c
               WHERE NOT EXISTS (SELECT 1 FROM spend_tag_values s WHERE s.day = c.d AND s.key = c.k AND s.value = c.v)),
     room AS (SELECT f.d, f.k, f.v FROM fresh f
              WHERE f.n <= (SELECT max_values FROM spend_tag_bound)
                           - (SELECT COUNT(*) FROM spend_tag_values s WHERE s.day = f.d AND s.key = f.k)),
     added AS (INSERT INTO spend_tag_values (day, key, value) SELECT d, k, v FROM room ORDER BY d, k, v
               ON CONFLICT DO NOTHING RETURNING day, key, value)
     SELECT day, key, value FROM added
     UNION ALL
     SELECT s.day, s.key, s.value FROM spend_tag_values s JOIN cand c ON s.day = c.d AND s.key = c.k AND s.value = c.v";

/// The rollup's tag text of each row of the batch, in order (rows without a token, which
/// the rollup leaves out, keep theirs).
pub async fn bounded(conn: &mut PgConnection, rows: &[RequestRow]) -> Result<Vec<String>> {
    let parsed: Vec<Tags> = rows.iter().map(|r| Tags::stored(&r.tags)).collect();
    let (mut days, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for (r, tags) in rows.iter().zip(&parsed) {
        if r.token_id.is_none() {
            continue;
        }
        for (k, v) in tags.pairs() {
            days.push(day(&r.created_at).to_string());
            keys.push(k.to_string());
            values.push(v.to_string());
        }
    }
    if days.is_empty() {
        return Ok(rows.iter().map(|r| r.tags.clone()).collect());
    }
    let admitted: HashSet<(String, String, String)> = sqlx::query_as(ADMIT)
        .bind(days)
        .bind(keys)
        .bind(values)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    Ok(rows
        .iter()
        .zip(parsed)
        .map(|(r, tags)| {
            let d = day(&r.created_at);
            let over: Vec<String> = tags
                .pairs()
                .filter(|(k, v)| !admitted.contains(&(d.to_string(), k.to_string(), v.to_string())))
                .map(|(k, _)| k.to_string())
                .collect();
            rolled(tags, &r.tags, over)
        })
        .collect())
}

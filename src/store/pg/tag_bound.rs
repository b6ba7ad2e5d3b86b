//! The spend rollup's bound on tag cardinality on PostgreSQL (see `store::tag_bound`): one
//! statement admits a batch's new (day, key, value)s while their key has room and answers
//! which of the batch's values are admitted, now or before.

use std::collections::{BTreeSet, HashSet};

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

/// The rollup's tag text of the batch's rows with a token (the rollup leaves the others
/// out): (day, tags as logged, tags as rolled up), one per distinct (day, tags) — the rolled
/// text is a function of those two, so the statement joins on them (not on the request id,
/// which a batch may repeat with other content).
pub async fn bounded(conn: &mut PgConnection, rows: &[RequestRow]) -> Result<[Vec<String>; 3]> {
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for r in rows.iter().filter(|r| r.token_id.is_some()) {
        seen.insert((day(&r.created_at), r.tags.as_str()));
    }
    let parsed: Vec<(&str, &str, Tags)> = seen
        .into_iter()
        .map(|(d, t)| (d, t, Tags::stored(t)))
        .collect();
    let (mut days, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for (d, _, tags) in &parsed {
        for (k, v) in tags.pairs() {
            days.push(d.to_string());
            keys.push(k.to_string());
            values.push(v.to_string());
        }
    }
    let admitted: HashSet<(String, String, String)> = if days.is_empty() {
        HashSet::new()
    } else {
        sqlx::query_as(ADMIT)
            .bind(days)
            .bind(keys)
            .bind(values)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect()
    };
    let mut out: [Vec<String>; 3] = Default::default();
    for (d, text, tags) in parsed {
        let over: Vec<String> = tags
            .pairs()
            .filter(|(k, v)| !admitted.contains(&(d.to_string(), k.to_string(), v.to_string())))
            .map(|(k, _)| k.to_string())
            .collect();
        out[0].push(d.to_string());
        out[1].push(text.to_string());
        out[2].push(rolled(tags, text, over));
    }
    Ok(out)
}

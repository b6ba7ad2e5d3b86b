//! The spend rollup's bound on tag cardinality on PostgreSQL (see `store::tag_bound`): one
//! statement admits a batch's new (day, scope, key)s while their tenant's day has room, a
//! second its new values of the admitted keys while their key has room, a third its new
//! sets (the counted pairs' texts, so bounded) while their tenant's day has room — run once
//! for the texts themselves, then for the `key:(other)` texts of the rows left without a
//! place; each answers which of the batch's are admitted, now or before.
//!
//! A place another host admits at the same moment is still ours: its insert conflicts, and
//! `ON CONFLICT DO UPDATE … RETURNING` (unlike `DO NOTHING`) waits for that host's commit
//! and returns the row, which the statement's snapshot read would not see.

use std::collections::{BTreeMap, HashSet};

use sqlx::PgConnection;

use super::text;
use crate::store::requests::RequestRow;
use crate::store::tag_bound::{Asked, Ladder};
use crate::store::Result;

const ADMIT_KEYS: &str = "WITH cand AS (SELECT d, s, k, bool_or(a) AS a
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[]) AS c(d, s, k, a) GROUP BY d, s, k),
     fresh AS (SELECT c.d, c.s, c.k, ROW_NUMBER() OVER (PARTITION BY c.d, c.s ORDER BY c.k) AS n FROM cand c
               WHERE c.a AND NOT EXISTS (SELECT 1 FROM spend_tag_keys t WHERE t.day = c.d AND t.scope = c.s AND t.key = c.k)),
     room AS (SELECT f.d, f.s, f.k FROM fresh f
              WHERE f.n <= (SELECT max_keys FROM spend_tag_bound)
                           - (SELECT COUNT(*) FROM spend_tag_keys t WHERE t.day = f.d AND t.scope = f.s)),
     added AS (INSERT INTO spend_tag_keys (day, scope, key) SELECT d, s, k FROM room ORDER BY d, s, k
               ON CONFLICT (day, scope, key) DO UPDATE SET key = EXCLUDED.key RETURNING day, scope, key)
     SELECT day, scope, key FROM added
     UNION ALL
     SELECT t.day, t.scope, t.key FROM spend_tag_keys t JOIN cand c ON t.day = c.d AND t.scope = c.s AND t.key = c.k";

const ADMIT_VALUES: &str = "WITH cand AS (SELECT d, s, k, v, bool_or(a) AS a
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::text[]) AS c(d, s, k, a, v)
                   GROUP BY d, s, k, v),
     fresh AS (SELECT c.d, c.s, c.k, c.v, ROW_NUMBER() OVER (PARTITION BY c.d, c.s, c.k ORDER BY c.v) AS n FROM cand c
               WHERE c.a AND NOT EXISTS (SELECT 1 FROM spend_tag_values t
                                         WHERE t.day = c.d AND t.scope = c.s AND t.key = c.k AND t.value = c.v)),
     room AS (SELECT f.d, f.s, f.k, f.v FROM fresh f
              WHERE f.n <= (SELECT max_values FROM spend_tag_bound)
                           - (SELECT COUNT(*) FROM spend_tag_values t WHERE t.day = f.d AND t.scope = f.s AND t.key = f.k)),
     added AS (INSERT INTO spend_tag_values (day, scope, key, value) SELECT d, s, k, v FROM room ORDER BY d, s, k, v
               ON CONFLICT (day, scope, key, value) DO UPDATE SET value = EXCLUDED.value RETURNING day, scope, key, value)
     SELECT day, scope, key, value FROM added
     UNION ALL
     SELECT t.day, t.scope, t.key, t.value FROM spend_tag_values t
            JOIN cand c ON t.day = c.d AND t.scope = c.s AND t.key = c.k AND t.value = c.v";

/// The batch's new sets ((day, scope, set, admits, room)) while their tenant's day holds
/// fewer than `room` times the bound (`Ladder::room`), as `ADMIT_KEYS` its keys.
const ADMIT_SETS: &str = "WITH cand AS (SELECT d, s, t, bool_or(a) AS a, max(m) AS m
                   FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::bigint[]) AS c(d, s, t, a, m)
                   GROUP BY d, s, t),
     fresh AS (SELECT c.d, c.s, c.t, c.m, ROW_NUMBER() OVER (PARTITION BY c.d, c.s ORDER BY c.t) AS n FROM cand c
               WHERE c.a AND NOT EXISTS (SELECT 1 FROM spend_tag_sets x WHERE x.day = c.d AND x.scope = c.s AND x.tags = c.t)),
     room AS (SELECT f.d, f.s, f.t FROM fresh f
              WHERE f.n <= (SELECT max_sets FROM spend_tag_bound) * f.m
                           - (SELECT COUNT(*) FROM spend_tag_sets x WHERE x.day = f.d AND x.scope = f.s)),
     added AS (INSERT INTO spend_tag_sets (day, scope, tags) SELECT d, s, t FROM room ORDER BY d, s, t
               ON CONFLICT (day, scope, tags) DO UPDATE SET tags = EXCLUDED.tags RETURNING day, scope, tags)
     SELECT day, scope, tags FROM added
     UNION ALL
     SELECT x.day, x.scope, x.tags FROM spend_tag_sets x JOIN cand c ON x.day = c.d AND x.scope = c.s AND x.tags = c.t";

/// One (day, scope, key, admits, value) per counted pair of the batch's rows; for a set,
/// (day, scope, set, admits, "").
type Cand = (String, String, String, bool, String);

/// A row's request id (as the log stores it), its row and what the bound asks about it.
type Row<'r> = (String, &'r RequestRow, Asked);

/// The rollup's tag text of each of the batch's rows with a token (the rollup leaves the
/// others out), by request id as the log stores it: (ids, rolled-up tags). A batch may log
/// an id twice; the log keeps its first row, and so does this.
pub async fn bounded(conn: &mut PgConnection, rows: &[RequestRow]) -> Result<[Vec<String>; 2]> {
    let mut asked: BTreeMap<String, (&RequestRow, Asked)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.token_id.is_some()) {
        let id = text::key(&r.id).into_owned();
        asked.entry(id).or_insert_with(|| (r, Asked::of(r)));
    }
    let asked: Vec<Row<'_>> = asked.into_iter().map(|(id, (r, a))| (id, r, a)).collect();
    let cands: Vec<Cand> = asked
        .iter()
        .flat_map(|(_, _, a)| {
            a.counted().map(|(k, v)| {
                let d = text::key(&a.day).into_owned();
                (d, a.scope.clone(), k.to_string(), a.admits, v.to_string())
            })
        })
        .collect();
    let keys: HashSet<(String, String, String)> = admit(conn, ADMIT_KEYS, &cands, false)
        .await?
        .into_iter()
        .map(|(d, s, k, _)| (d, s, k))
        .collect();
    let open: Vec<Cand> = cands
        .into_iter()
        .filter(|(d, s, k, _, _)| keys.contains(&(d.clone(), s.clone(), k.clone())))
        .collect();
    let values: HashSet<(String, String, String, String)> = admit(conn, ADMIT_VALUES, &open, true)
        .await?
        .into_iter()
        .collect();
    let ladders: Vec<Ladder> = asked
        .iter()
        .map(|(_, _, a)| {
            let d = text::key(&a.day).into_owned();
            a.ladder(a.by_pairs(|k, v| {
                let key = (d.clone(), a.scope.clone(), k.to_string());
                let admitted = keys.contains(&key);
                (
                    admitted,
                    admitted && values.contains(&(key.0, key.1, key.2, v.to_string())),
                )
            }))
        })
        .collect();
    let placed = place(conn, &asked, &ladders).await?;
    let mut out: [Vec<String>; 2] = Default::default();
    for ((id, r, a), (ladder, placed)) in asked.iter().zip(ladders.iter().zip(placed)) {
        let tags = placed
            .and_then(|step| ladder.tries.get(step))
            .map_or(&ladder.last, |(_, t)| t);
        out[0].push(id.clone());
        out[1].push(text::key(&a.text(&r.tags, tags)).into_owned());
    }
    Ok(out)
}

/// Which try of each row's ladder holds a place (`None`: none does, the row takes its
/// `last`): the first tries of the whole batch in one statement, then the next tries of the
/// rows still without one — so a batch admits its rows' own texts before any rolled one.
async fn place(
    conn: &mut PgConnection,
    asked: &[Row<'_>],
    ladders: &[Ladder],
) -> Result<Vec<Option<usize>>> {
    let mut placed: Vec<Option<usize>> = vec![None; asked.len()];
    let steps = ladders.iter().map(|l| l.tries.len()).max().unwrap_or(0);
    for step in 0..steps {
        // The set of each row still without a place, at this step, and its room.
        let looking: Vec<(usize, Cand, i64)> = asked
            .iter()
            .zip(ladders)
            .enumerate()
            .filter(|(i, _)| placed.get(*i).is_some_and(Option::is_none))
            .filter_map(|(i, ((_, _, a), l))| {
                let (set, _) = l.tries.get(step)?;
                let d = text::key(&a.day).into_owned();
                let cand = (d, a.scope.clone(), set.clone(), a.admits, String::new());
                Some((i, cand, l.room(step)))
            })
            .collect();
        let admitted = admit_sets(conn, &looking).await?;
        for (i, (d, s, t, _, _), _) in looking {
            if let (true, Some(p)) = (admitted.contains(&(d, s, t)), placed.get_mut(i)) {
                *p = Some(step);
            }
        }
    }
    Ok(placed)
}

/// Runs `ADMIT_SETS` over the sets looked for (each with its room): which are admitted, as
/// (day, scope, set).
async fn admit_sets(
    conn: &mut PgConnection,
    looking: &[(usize, Cand, i64)],
) -> Result<HashSet<(String, String, String)>> {
    if looking.is_empty() {
        return Ok(HashSet::new());
    }
    let col = |f: fn(&Cand) -> &String| {
        looking
            .iter()
            .map(|(_, c, _)| f(c).clone())
            .collect::<Vec<_>>()
    };
    let rows: Vec<(String, String, String)> = sqlx::query_as(ADMIT_SETS)
        .bind(col(|c| &c.0))
        .bind(col(|c| &c.1))
        .bind(col(|c| &c.2))
        .bind(looking.iter().map(|(_, c, _)| c.3).collect::<Vec<bool>>())
        .bind(looking.iter().map(|(_, _, m)| *m).collect::<Vec<i64>>())
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Runs `sql` over `cands` (with their values when `with_values`): what is admitted, as
/// (day, scope, key, value) (value empty for keys).
async fn admit(
    conn: &mut PgConnection,
    sql: &'static str,
    cands: &[Cand],
    with_values: bool,
) -> Result<Vec<(String, String, String, String)>> {
    if cands.is_empty() {
        return Ok(Vec::new());
    }
    let col = |f: fn(&Cand) -> &String| cands.iter().map(|c| f(c).clone()).collect::<Vec<_>>();
    let q = sqlx::query(sql)
        .bind(col(|c| &c.0))
        .bind(col(|c| &c.1))
        .bind(col(|c| &c.2))
        .bind(cands.iter().map(|c| c.3).collect::<Vec<bool>>());
    let q = if with_values {
        q.bind(col(|c| &c.4))
    } else {
        q
    };
    let rows = q.fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            use sqlx::Row;
            let value = if with_values {
                row.try_get(3)?
            } else {
                String::new()
            };
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, value))
        })
        .collect()
}

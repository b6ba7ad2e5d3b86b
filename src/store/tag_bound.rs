//! The spend rollup's bound on tag cardinality. Per UTC day and tenant (`scope`: the team;
//! a user without one, the user), at most `[finance] max_tag_keys_per_day` distinct tag keys
//! and, of each, `max_tag_values_per_day` distinct values get their own rows in
//! `spend_days`; a later value of an admitted key rolls up as `key:(other)`, a later key
//! (whatever its value) as `(other):(other)` (`tags::OTHER`). Without it a tag unique to
//! each request (`trace:<id>`, or ten fresh keys) makes the rollup one row per request and
//! reports slow down. The request row keeps its exact tags; only its rollup row's tag text
//! differs, so spend by tag still sums to the total, key by key.
//!
//! Who cannot spend the bound for others:
//! - the admin's pairs (the token's and the team's default tags, `RequestRow::fixed_tags`)
//!   are neither counted nor rolled up;
//! - a tenant's header values count against its own bound only, so one team's flood after
//!   midnight moves nobody else's tags to `(other)`;
//! - a request that costs nothing (refused, failed, charged 0) admits no new key or value:
//!   it takes the places admitted already, or rolls up.
//!
//! `spend_tag_keys` and `spend_tag_values` hold what is admitted; `spend_tag_bound` the
//! bounds (written from the config at start and on SIGHUP, so every writer reads them in its
//! own transaction). A key or value is admitted in the transaction that writes its request
//! row: on SQLite one writer at a time, so the bound is exact; on PostgreSQL two hosts'
//! batches committing at once can each admit the last free places (at most one batch's new
//! ones per concurrent writer past the bound).

use crate::tags::Tags;

use super::raw::Param;
use super::requests::RequestRow;
use super::writer::Tx;
use super::Result;

/// Admits the key of ?1 day, ?2 scope, ?3 key while ?4 (the request cost something) and the
/// tenant's day has room (a known key is left as it is) …
const ADMIT_KEY: &str = "INSERT OR IGNORE INTO spend_tag_keys (day, scope, key)
     SELECT ?1, ?2, ?3 WHERE ?4
        AND (SELECT COUNT(*) FROM spend_tag_keys WHERE day = ?1 AND scope = ?2)
            < (SELECT max_keys FROM spend_tag_bound)";
/// … its value ?5 likewise, once the key is admitted …
const ADMIT_VALUE: &str = "INSERT OR IGNORE INTO spend_tag_values (day, scope, key, value)
     SELECT ?1, ?2, ?3, ?5 WHERE ?4
        AND EXISTS (SELECT 1 FROM spend_tag_keys WHERE day = ?1 AND scope = ?2 AND key = ?3)
        AND (SELECT COUNT(*) FROM spend_tag_values WHERE day = ?1 AND scope = ?2 AND key = ?3)
            < (SELECT max_values FROM spend_tag_bound)";
/// … and whether each is admitted, now or before (the same parameters, ?4 unused).
const ADMITTED: &str = "SELECT EXISTS (SELECT 1 FROM spend_tag_keys WHERE day = ?1 AND scope = ?2 AND key = ?3),
     EXISTS (SELECT 1 FROM spend_tag_values WHERE day = ?1 AND scope = ?2 AND key = ?3 AND value = ?5)";

/// The UTC day of a database time (`YYYY-MM-DD…`), as the rollup keys it.
pub fn day(created_at: &str) -> &str {
    created_at.get(..10).unwrap_or(created_at)
}

/// Whose bound a request's header tags count against: its team's; without a team, its
/// user's (a user's tokens share one bound, as they share one budget); else its token's.
pub fn scope(r: &RequestRow) -> String {
    match (r.team_id.filter(|t| *t != 0), r.user_id.filter(|u| *u != 0)) {
        (Some(team), _) => format!("team:{team}"),
        (None, Some(user)) => format!("user:{user}"),
        (None, None) => format!("token:{}", r.token_id.unwrap_or(0)),
    }
}

/// What the bound asks about one request: its tags, and which of them it counts.
pub(crate) struct Asked {
    pub day: String,
    pub scope: String,
    /// Whether the request may admit new keys and values (it cost something).
    pub admits: bool,
    pub tags: Tags,
    fixed: Tags,
}

impl Asked {
    pub fn of(r: &RequestRow) -> Asked {
        Asked {
            day: day(&r.created_at).to_string(),
            scope: scope(r),
            admits: r.cost_micros > 0,
            tags: Tags::stored(&r.tags),
            fixed: Tags::stored(&r.fixed_tags),
        }
    }

    /// The pairs the bound counts: all but the admin's.
    pub fn counted(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tags
            .pairs()
            .filter(|(k, v)| self.fixed.get(k) != Some(*v))
    }

    /// The rollup's text of `logged`, given whether each counted pair's key and value are
    /// admitted (the same text when all are).
    pub fn rolled(&self, logged: &str, admitted: impl Fn(&str, &str) -> (bool, bool)) -> String {
        let (mut values, mut keys) = (Vec::new(), Vec::new());
        for (k, v) in self.counted() {
            match admitted(k, v) {
                (false, _) => keys.push(k.to_string()),
                (true, false) => values.push(k.to_string()),
                (true, true) => {}
            }
        }
        if values.is_empty() && keys.is_empty() {
            return logged.to_string();
        }
        self.tags.clone().rolled_up(&values, &keys).canonical()
    }
}

/// The rollup's tag text of a logged request `r` (the writer's transaction, SQLite).
pub fn bounded_tx(tx: &mut Tx<'_>, r: &RequestRow) -> Result<String> {
    let asked = Asked::of(r);
    let mut answers = Vec::new();
    for (key, value) in asked.counted() {
        let params = [
            Param::Text(&asked.day),
            Param::Text(&asked.scope),
            key.into(),
            i64::from(asked.admits).into(),
            value.into(),
        ];
        tx.execute(ADMIT_KEY, &params[..4])?;
        tx.execute(ADMIT_VALUE, &params)?;
        let answer = tx
            .query_row(ADMITTED, &params, |r| {
                (r.int(0).unwrap_or(0) != 0, r.int(1).unwrap_or(0) != 0)
            })?
            .unwrap_or((false, false));
        answers.push((key, answer));
    }
    Ok(asked.rolled(&r.tags, |k, _| answer_of(&answers, k)))
}

/// `bounded_tx` in a transaction of the pool (SQLite, `requests::insert_batch`).
pub async fn bounded(conn: &mut sqlx::SqliteConnection, r: &RequestRow) -> Result<String> {
    let asked = Asked::of(r);
    let mut answers = Vec::new();
    for (key, value) in asked.counted() {
        sqlx::query(ADMIT_KEY)
            .bind(&asked.day)
            .bind(&asked.scope)
            .bind(key)
            .bind(asked.admits)
            .execute(&mut *conn)
            .await?;
        sqlx::query(ADMIT_VALUE)
            .bind(&asked.day)
            .bind(&asked.scope)
            .bind(key)
            .bind(asked.admits)
            .bind(value)
            .execute(&mut *conn)
            .await?;
        let (k, v): (bool, bool) = sqlx::query_as(ADMITTED)
            .bind(&asked.day)
            .bind(&asked.scope)
            .bind(key)
            .bind(asked.admits)
            .bind(value)
            .fetch_one(&mut *conn)
            .await?;
        answers.push((key, (k, v)));
    }
    Ok(asked.rolled(&r.tags, |k, _| answer_of(&answers, k)))
}

/// The answer for key `k` (a request has one value per key).
fn answer_of(answers: &[(&str, (bool, bool))], k: &str) -> (bool, bool) {
    answers
        .iter()
        .find(|(key, _)| *key == k)
        .map_or((false, false), |(_, a)| *a)
}

/// Writes the configured bounds (at start and on SIGHUP; the last replica to do so sets them
/// for all).
pub async fn set_bound(db: &super::Db, finance: &crate::config::FinanceSettings) -> Result<()> {
    let values = i64::from(finance.max_tag_values_per_day);
    let keys = i64::from(finance.max_tag_keys_per_day);
    let sets = i64::from(finance.max_tag_sets_per_day);
    match &db.backend {
        super::Backend::Postgres(pg) => {
            sqlx::query("UPDATE spend_tag_bound SET max_values = $1, max_keys = $2, max_sets = $3")
                .bind(values)
                .bind(keys)
                .bind(sets)
                .execute(&pg.pool)
                .await?;
        }
        super::Backend::Sqlite(_) => {
            let mut tx = db.begin().await?;
            sqlx::query("UPDATE spend_tag_bound SET max_values = ?, max_keys = ?, max_sets = ?")
                .bind(values)
                .bind(keys)
                .bind(sets)
                .execute(tx.sqlite()?)
                .await?;
            tx.commit().await?;
        }
    }
    Ok(())
}

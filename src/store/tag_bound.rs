//! The spend rollup's bound on tag cardinality. Per UTC day and tenant (`scope`: the team;
//! a user without one, the user), at most `[finance] max_tag_keys_per_day` distinct tag keys
//! and, of each, `max_tag_values_per_day` distinct values get their own rows in
//! `spend_days`; a later value of an admitted key rolls up as `key:(other)`, a later key
//! (whatever its value) as `(other):(other)` (`tags::OTHER`). Without it a tag unique to
//! each request (`trace:<id>`, or ten fresh keys) makes the rollup one row per request and
//! reports slow down. The request row keeps its exact tags; only its rollup row's tag text
//! differs, so spend by tag still sums to the total, key by key.
//!
//! Keys and values each within their bounds still combine (`a:v<i%1000>,b:v<i/1000>` is a
//! million texts), and the rollup is keyed by the whole text. So, after the pairs are
//! bounded, at most `max_tag_sets_per_day` distinct texts of the counted pairs (a *set*)
//! get places; a later text is rolled up pair by pair to `key:(other)` — a text that takes a
//! place too, within twice the bound (`Ladder::room`) — and where that one has none either,
//! every counted pair becomes the one `(other):(other)`, which needs none (`Ladder`). A
//! tenant's day so has at most 2 × `max_tag_sets_per_day` + 1 distinct counted texts.
//!
//! Who cannot spend the bound for others:
//! - the admin's pairs (the token's and the team's default tags, `RequestRow::fixed_tags`)
//!   are neither counted nor rolled up;
//! - a tenant's header values count against its own bound only, so one team's flood after
//!   midnight moves nobody else's tags to `(other)`;
//! - a request that costs nothing (refused, failed, charged 0) admits no new key, value or
//!   text: it takes the places admitted already, or rolls up.
//!
//! `spend_tag_keys`, `spend_tag_values` and `spend_tag_sets` hold what is admitted (today's
//! and yesterday's: `sweep`); `spend_tag_bound` the bounds (written from the config at start
//! and on SIGHUP, so every writer reads them in its own transaction). A place is admitted in
//! the transaction that writes its request row: on SQLite one writer at a time, so the bound
//! is exact; on PostgreSQL two hosts' batches committing at once can each admit the last
//! free places (at most one batch's new ones per concurrent writer past the bound).

use chrono::{DateTime, Utc};

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
/// Admits the set (the counted pairs' text) ?3 of ?1 day, ?2 scope while ?4 and the
/// tenant's day holds fewer than ?5 times the bound (`Ladder::room`) …
const ADMIT_SET: &str = "INSERT OR IGNORE INTO spend_tag_sets (day, scope, tags)
     SELECT ?1, ?2, ?3 WHERE ?4
        AND (SELECT COUNT(*) FROM spend_tag_sets WHERE day = ?1 AND scope = ?2)
            < (SELECT max_sets FROM spend_tag_bound) * ?5";
/// … and whether it is admitted, now or before (?4 unused).
const SET_ADMITTED: &str =
    "SELECT EXISTS (SELECT 1 FROM spend_tag_sets WHERE day = ?1 AND scope = ?2 AND tags = ?3)";

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
    /// Whether the request may admit new keys, values and sets (it cost something).
    pub admits: bool,
    pub tags: Tags,
    fixed: Tags,
}

/// Where a request's tags, bounded pair by pair, may go in the rollup: the first of
/// `tries` whose set holds a place (admitted before, or now), else `last`, which needs
/// none. Each try is (its set: the counted pairs' canonical text, its tags).
#[derive(Debug)]
pub(crate) struct Ladder {
    pub tries: Vec<(String, Tags)>,
    pub last: Tags,
    /// The `key:(other)` form of the tags.
    others: Tags,
}

impl Ladder {
    /// How many times `max_tag_sets_per_day` the tenant's day may hold for try `i` to take
    /// a new place: a text as sent, once; its `key:(other)` form, twice — a room of its own,
    /// since it is tried only once the day is full and could otherwise never take one (s25
    /// attack on the day's diff, #4). A day so holds at most twice the bound, and one more
    /// text, `(other):(other)`.
    pub fn room(&self, i: usize) -> i64 {
        match self.tries.get(i) {
            Some((_, t)) if *t == self.others => 2,
            _ => 1,
        }
    }
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
        self.counted_in(&self.tags)
    }

    /// The pairs of `tags` (these, or their rollup) that are not the admin's.
    fn counted_in<'t>(&'t self, tags: &'t Tags) -> impl Iterator<Item = (&'t str, &'t str)> {
        tags.pairs().filter(|(k, v)| self.fixed.get(k) != Some(*v))
    }

    /// The tags bounded pair by pair, given whether each counted pair's key and value are
    /// admitted (the tags themselves when all are).
    pub fn by_pairs(&self, admitted: impl Fn(&str, &str) -> (bool, bool)) -> Tags {
        let (mut values, mut keys) = (Vec::new(), Vec::new());
        for (k, v) in self.counted() {
            match admitted(k, v) {
                (false, _) => keys.push(k.to_string()),
                (true, false) => values.push(k.to_string()),
                (true, true) => {}
            }
        }
        if values.is_empty() && keys.is_empty() {
            return self.tags.clone();
        }
        self.tags.clone().rolled_up(&values, &keys)
    }

    /// Where `tags` (bounded pair by pair) may go: themselves; else every counted value as
    /// `(other)` (`key:(other)`: per-key sums stay exact), both taking a place — subsets of
    /// up to ten of the admitted keys are still many; else every counted pair as the one
    /// `(other):(other)`, which takes none (a key rolled there counts as `(untagged)`).
    /// Tags without a counted pair, or whose only one is `(other):(other)`, need no place.
    pub fn ladder(&self, tags: Tags) -> Ladder {
        let keys: Vec<String> = self.counted_in(&tags).map(|(k, _)| k.to_string()).collect();
        let last = tags.clone().rolled_up(&[], &keys);
        let others = tags.clone().rolled_up(&keys, &[]);
        let mut tries: Vec<(String, Tags)> = Vec::new();
        for t in [tags, others.clone()] {
            if t == last || tries.iter().any(|(_, x)| *x == t) {
                continue;
            }
            tries.push((self.set_of(&t), t));
        }
        Ladder {
            tries,
            last,
            others,
        }
    }

    /// The set of `tags`: its counted pairs' canonical text (`Tags` keeps them sorted).
    fn set_of(&self, tags: &Tags) -> String {
        let pairs: Vec<String> = self
            .counted_in(tags)
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        pairs.join(",")
    }

    /// The rollup's text of `tags`: `logged` itself when nothing was rolled up.
    pub fn text(&self, logged: &str, tags: &Tags) -> String {
        if *tags == self.tags {
            logged.to_string()
        } else {
            tags.canonical()
        }
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
    let ladder = asked.ladder(asked.by_pairs(|k, _| answer_of(&answers, k)));
    for (i, (set, tags)) in ladder.tries.iter().enumerate() {
        let params = [
            Param::Text(&asked.day),
            Param::Text(&asked.scope),
            Param::Text(set),
            i64::from(asked.admits).into(),
            ladder.room(i).into(),
        ];
        tx.execute(ADMIT_SET, &params)?;
        let placed = tx
            .query_row(SET_ADMITTED, &params[..3], |r| r.int(0).unwrap_or(0) != 0)?
            .unwrap_or(false);
        if placed {
            return Ok(asked.text(&r.tags, tags));
        }
    }
    Ok(asked.text(&r.tags, &ladder.last))
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
    let ladder = asked.ladder(asked.by_pairs(|k, _| answer_of(&answers, k)));
    for (i, (set, tags)) in ladder.tries.iter().enumerate() {
        sqlx::query(ADMIT_SET)
            .bind(&asked.day)
            .bind(&asked.scope)
            .bind(set)
            .bind(asked.admits)
            .bind(ladder.room(i))
            .execute(&mut *conn)
            .await?;
        let placed: bool = sqlx::query_scalar(SET_ADMITTED)
            .bind(&asked.day)
            .bind(&asked.scope)
            .bind(set)
            .fetch_one(&mut *conn)
            .await?;
        if placed {
            return Ok(asked.text(&r.tags, tags));
        }
    }
    Ok(asked.text(&r.tags, &ladder.last))
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

/// The admission tables the sweep clears, each with its key.
const ADMISSIONS: [(&str, &str); 3] = [
    ("spend_tag_keys", "day, scope, key"),
    ("spend_tag_values", "day, scope, key, value"),
    ("spend_tag_sets", "day, scope, tags"),
];

/// The most admitted places one statement of the sweep deletes: the write lock is held a
/// short while at a time, however many places a past day holds.
const SWEEP_CHUNK: u64 = 10_000;

/// Deletes the admitted keys, values and sets of the days before yesterday (UTC, by `now`);
/// returns how many. Yesterday's stay: a batch written just after midnight may still carry
/// yesterday's rows, and finds its places. The rollup is never read or written here — the
/// places only decide how later rows of their day are rolled up, so a day older than
/// yesterday that still received a row (a batch retried that late) would count its places
/// anew, up to twice its bounds.
pub async fn sweep(db: &super::Db, now: DateTime<Utc>) -> Result<u64> {
    let Some(yesterday) = now.date_naive().pred_opt() else {
        return Ok(0);
    };
    let before = yesterday.format("%Y-%m-%d").to_string();
    let mut swept = 0;
    for (table, key) in ADMISSIONS {
        loop {
            let n = match &db.backend {
                super::Backend::Postgres(pg) => {
                    let sql = format!(
                        "DELETE FROM {table} WHERE ({key}) IN
                           (SELECT {key} FROM {table} WHERE day < $1 LIMIT {SWEEP_CHUNK})"
                    );
                    sqlx::query(&sql)
                        .bind(&before)
                        .execute(&pg.pool)
                        .await?
                        .rows_affected()
                }
                super::Backend::Sqlite(sqlite) => {
                    let sql = format!(
                        "DELETE FROM {table} WHERE ({key}) IN
                           (SELECT {key} FROM {table} WHERE day < ?1 LIMIT {SWEEP_CHUNK})"
                    );
                    sqlx::query(&sql)
                        .bind(&before)
                        .execute(&sqlite.write)
                        .await?
                        .rows_affected()
                }
            };
            swept += n;
            if n < SWEEP_CHUNK {
                break;
            }
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the bound asks about a paying request with `tags`, the admin's being `fixed`.
    fn asked(tags: &str, fixed: &str) -> Asked {
        Asked::of(&RequestRow {
            token_id: Some(1),
            cost_micros: 1,
            created_at: "2026-03-01T10:00:00.000Z".into(),
            tags: tags.into(),
            fixed_tags: fixed.into(),
            ..Default::default()
        })
    }

    /// A ladder as texts: its tries (set, rollup text), and its last text.
    fn texts(l: &Ladder) -> (Vec<(&str, String)>, String) {
        let tries = l.tries.iter().map(|(s, t)| (s.as_str(), t.canonical()));
        (tries.collect(), l.last.canonical())
    }

    #[test]
    fn a_text_without_a_place_rolls_to_its_keys_other_then_to_the_one_other_pair() {
        // The admin's `env:prod` is neither counted in the set nor rolled up.
        let a = asked("b:2,a:1,env:prod", "env:prod");
        let l = a.ladder(a.by_pairs(|_, _| (true, true)));
        assert_eq!(
            texts(&l),
            (
                vec![
                    ("a:1,b:2", "a:1,b:2,env:prod".into()),
                    ("a:(other),b:(other)", "a:(other),b:(other),env:prod".into()),
                ],
                "(other):(other),env:prod".into()
            )
        );
        // A value past its bound is already `(other)` in the first try's set.
        let a = asked("a:1,trace:t9", "");
        let l = a.ladder(a.by_pairs(|k, _| (true, k != "trace")));
        assert_eq!(
            texts(&l).0,
            [
                ("a:1,trace:(other)", "a:1,trace:(other)".into()),
                ("a:(other),trace:(other)", "a:(other),trace:(other)".into()),
            ]
        );
        // A key past its bound is already `(other):(other)`, and stays in the set.
        let a = asked("a:1,k9:x", "");
        let l = a.ladder(a.by_pairs(|k, _| (k != "k9", true)));
        assert_eq!(
            texts(&l),
            (
                vec![
                    ("(other):(other),a:1", "(other):(other),a:1".into()),
                    (
                        "(other):(other),a:(other)",
                        "(other):(other),a:(other)".into()
                    ),
                ],
                "(other):(other)".into()
            )
        );
    }

    #[test]
    fn tags_already_rolled_to_their_keys_other_try_once() {
        let a = asked("a:1,b:2", "");
        let l = a.ladder(a.by_pairs(|_, _| (true, false)));
        assert_eq!(
            texts(&l),
            (
                vec![("a:(other),b:(other)", "a:(other),b:(other)".into())],
                "(other):(other)".into()
            )
        );
    }

    #[test]
    fn tags_without_a_counted_pair_or_only_other_need_no_place() {
        for (tags, fixed, admitted, last) in [
            ("", "", true, ""),
            (
                "env:prod,team:x",
                "env:prod,team:x",
                true,
                "env:prod,team:x",
            ),
            (
                "env:prod,k:v",
                "env:prod",
                false,
                "(other):(other),env:prod",
            ),
            // Text the tag rules refuse counts as no tags: it keeps its logged text.
            ("k:a\0b", "", true, ""),
        ] {
            let a = asked(tags, fixed);
            let l = a.ladder(a.by_pairs(|_, _| (admitted, admitted)));
            assert_eq!(texts(&l), (vec![], last.to_string()), "{tags}");
        }
        let a = asked("k:a\0b", "");
        let l = a.ladder(a.by_pairs(|_, _| (true, true)));
        assert_eq!(a.text("k:a\0b", &l.last), "k:a\0b");
    }

    #[test]
    fn a_text_not_rolled_up_is_the_logged_one() {
        let a = asked(" a:1 , b:2", "");
        let tags = a.by_pairs(|_, _| (true, true));
        assert_eq!(a.text(" a:1 , b:2", &tags), " a:1 , b:2");
        let rolled = a.ladder(tags).last;
        assert_eq!(a.text(" a:1 , b:2", &rolled), "(other):(other)");
    }
}

//! A batch's reservations and settlements in one statement each (group commit with O(1)
//! round trips): the writer hands every reserve and settle job of its batch here, after
//! the batch's rows are locked (`writer::lock_rows`), and runs only the jobs these
//! statements leave undecided one by one (`reserve_tx`, `settle_tx`), in the same
//! transaction.
//!
//! The jobs of one batch are concurrent (no caller has had an answer for one of them when
//! it handed in another), so any order of them is a true history; this one is: the
//! settlements (`SETTLE_MANY`), then the reservations (`RESERVE_MANY`), then the
//! undecided jobs in their order of arrival.
//!
//! `RESERVE_MANY` decides, over arrays (`unnest`), the jobs whose three levels are in the
//! period of their `now` under the owner's rules and whose token is live ("current"), in
//! order of arrival: a current job is reserved when, at each limited level, the running
//! sum of the amounts of the current jobs that fit each level alone ("alone": the amount
//! is at most the level's remaining balance before the batch) up to it fits that level's
//! remaining balance. That sum counts every such job before it, reserved or not, and
//! every reserved job is such a job, so the reserved ones never take more than a level has
//! (the sum of the reserved ones is at most the running sum at the last of them) — it may
//! only leave a job that would have fitted to the step-by-step path. A job that does not
//! fit alone is refused and not counted: one oversized request (refused anyway) would
//! otherwise push every later job of its levels over the sum and to the step-by-step path
//! (`pg_money_group_att::one_oversized_request_does_not_ungroup_the_rest_of_its_batch`:
//! 48 round trips for 42 jobs in 2 batches, instead of at most 10).
//! All levels' conditional decrements (one `UPDATE` per level over the reserved jobs'
//! sums, each re-checking `remaining >= sum` under the row lock), the reservation rows and
//! the ledger rows are that one statement. A current job not reserved that a level cannot
//! cover with what the reserved ones left is refused there (nothing is written for it; no
//! rollover is due). Anything else — a rollover due, a rule changed, a revoked or rotated
//! token (it has a successor), a disabled user, a job that might fit — is left to
//! `reserve_tx`, which refuses it alone (`Refusal::Rotated`, `TokenGone`).
//!
//! `SETTLE_MANY` is `cas::SETTLE` over arrays: each level's refund and release summed per
//! row. A request id that appears twice in a batch is decided once here; its other jobs
//! run step by step after (and find it settled, as they would have one after the other).
//!
//! When either statement fails on an error of its own (a duplicate request id, say), the
//! writer rolls the batch back and runs it again job by job, so the bad job fails alone.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::cas::follow_moved;
use super::{follow_columns, tighter};
use crate::clock::db_time;
use crate::store::ledger::{Owner, Refusal, Reservation, Settled, LEVELS};
use crate::store::{Result, StoreError};

/// What a groupable job asks, read when its batch runs (its `now` from its clock then).
pub enum Part {
    Reserve {
        request_id: Arc<str>,
        owner: Arc<Owner>,
        amount: i64,
        process: Arc<str>,
        now: DateTime<Utc>,
        deadline: DateTime<Utc>,
    },
    Settle {
        request_id: Arc<str>,
        /// The actual cost, ≥ 0.
        actual: i64,
        now: DateTime<Utc>,
        /// Whether a reservation settled as an orphan meanwhile is corrected too (`false`
        /// for a release).
        or_orphaned: bool,
    },
}

/// A job's result decided by the grouped statements.
pub enum Answer {
    Reserve(std::result::Result<Reservation, Refusal>),
    Settle(Option<Settled>),
}

/// `$1`–`$4` arrays of request id, whether an orphaned one counts, actual cost, time; one
/// row per request id found: its index (`i`, 1-based in the arrays), charged, absorbed,
/// each level's remaining balance after the whole statement, then what `cas::follow_moved`
/// reads. Every level of a settled reservation is written (a release of 0 where nothing
/// changes), so each has its row to report its period from.
pub(super) static SETTLE_MANY: LazyLock<String> = LazyLock::new(|| {
    let [t, u, m] = follow_columns(["t", "u", "m"]);
    format!(
        "WITH j AS (SELECT * FROM unnest($1::TEXT[], $2::BOOL[], $3::BIGINT[], $4::TEXT[])
            WITH ORDINALITY AS j(request_id, or_orphaned, actual, at, i)),
    a AS (DELETE FROM reservations r USING j WHERE r.request_id = j.request_id
            RETURNING r.request_id, r.token_id, r.user_id, r.team_id, r.period, r.user_period, r.team_period, r.amount_micros, TRUE AS open),
    b AS (DELETE FROM orphaned o USING j WHERE o.request_id = j.request_id AND j.or_orphaned
                AND NOT EXISTS (SELECT 1 FROM a WHERE a.request_id = o.request_id)
            RETURNING o.request_id, o.token_id, o.user_id, o.team_id, o.period, o.user_period, o.team_period, o.amount_micros, FALSE AS open),
    h AS (SELECT x.*, j.i, j.at, j.actual, LEAST(j.actual, x.amount_micros) AS charged,
                 CASE WHEN x.open THEN x.amount_micros ELSE 0 END AS release
            FROM (SELECT * FROM a UNION ALL SELECT * FROM b) AS x JOIN j ON j.request_id = x.request_id),
    t AS (UPDATE tokens SET reserved_micros = reserved_micros - s.release, remaining_micros = remaining_micros + s.refund
            FROM (SELECT h.token_id AS id, SUM(h.release)::BIGINT AS release,
                         SUM(CASE WHEN k.period = h.period THEN h.amount_micros - h.charged ELSE 0 END)::BIGINT AS refund
                  FROM h JOIN tokens k ON k.id = h.token_id GROUP BY h.token_id) s
            WHERE tokens.id = s.id RETURNING tokens.id, tokens.remaining_micros, tokens.period),
    u AS (UPDATE users SET reserved_micros = reserved_micros - s.release, remaining_micros = remaining_micros + s.refund
            FROM (SELECT h.user_id AS id, SUM(h.release)::BIGINT AS release,
                         SUM(CASE WHEN k.period = h.user_period THEN h.amount_micros - h.charged ELSE 0 END)::BIGINT AS refund
                  FROM h JOIN users k ON k.id = h.user_id GROUP BY h.user_id) s
            WHERE users.id = s.id RETURNING users.id, users.remaining_micros, users.period),
    m AS (UPDATE teams SET reserved_micros = reserved_micros - s.release, remaining_micros = remaining_micros + s.refund
            FROM (SELECT h.team_id AS id, SUM(h.release)::BIGINT AS release,
                         SUM(CASE WHEN k.period = h.team_period THEN h.amount_micros - h.charged ELSE 0 END)::BIGINT AS refund
                  FROM h JOIN teams k ON k.id = h.team_id GROUP BY h.team_id) s
            WHERE teams.id = s.id RETURNING teams.id, teams.remaining_micros, teams.period),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            SELECT h.token_id, h.user_id, h.team_id, h.period, h.user_period, h.team_period, k.kind, k.amount, h.request_id, h.at
            FROM h, LATERAL (VALUES ('settle', h.charged - h.amount_micros), ('absorbed', h.actual - h.charged)) AS k(kind, amount)
            WHERE k.kind = 'settle' OR k.amount > 0)
    SELECT h.i, h.charged, h.actual - h.charged,
           CASE WHEN h.open OR t.period = h.period THEN t.remaining_micros END,
           CASE WHEN h.open OR u.period = h.user_period THEN u.remaining_micros END,
           CASE WHEN h.open OR m.period = h.team_period THEN m.remaining_micros END,
           {t}, {u}, {m},
           h.token_id, h.user_id, h.team_id, h.period, h.user_period, h.team_period,
           h.amount_micros - h.charged
    FROM h JOIN t ON t.id = h.token_id JOIN u ON u.id = h.user_id JOIN m ON m.id = h.team_id"
    )
});

/// Arrays: `$1` amount, `$2`–`$4` token, user, team, `$5` time (the host's, written in
/// the rows; the token's expiry is judged by the database's clock, `db_now!`), `$6`
/// request id, `$7`–`$9` the periods of the time under `$12`–`$14` (the owner's rules),
/// `$10` owner process, `$11` deadline. One row per job: its index, whether it is current,
/// whether it was reserved, each level's limit (NULL: none) and remaining balance — after
/// the reserved jobs up to it for a reserved one, after all the reserved ones otherwise.
const RESERVE_MANY: &str = concat!(
    "WITH j AS (SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[], $6::TEXT[],
                $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], $12::TEXT[], $13::TEXT[], $14::TEXT[])
            WITH ORDINALITY AS j(amount, token_id, user_id, team_id, at, request_id, period, user_period, team_period,
                owner, deadline, reset, user_reset, team_reset, i)),
    s AS (SELECT j.*, t.limit_micros AS tl, t.remaining_micros AS tr, u.limit_micros AS ul, u.remaining_micros AS ur,
                 m.limit_micros AS ml, m.remaining_micros AS mr,
                 (t.period = j.period AND u.period = j.user_period AND m.period = j.team_period
                  AND t.reset = j.reset AND u.reset = j.user_reset AND m.reset = j.team_reset
                  AND t.revoked_at IS NULL AND t.successor_id IS NULL AND NOT u.disabled
                  AND (t.expires_at IS NULL OR t.expires_at > ",
    db_now!(),
    ")
                  AND j.amount >= 0) AS current,
                 ((t.limit_micros IS NULL OR j.amount <= t.remaining_micros) AND (u.limit_micros IS NULL OR j.amount <= u.remaining_micros)
                  AND (m.limit_micros IS NULL OR j.amount <= m.remaining_micros)) AS alone
            FROM j JOIN tokens t ON t.id = j.token_id JOIN users u ON u.id = j.user_id JOIN teams m ON m.id = j.team_id
            FOR NO KEY UPDATE OF t, u, m),
    c AS (SELECT s.*,
                 SUM(CASE WHEN current AND alone THEN amount ELSE 0 END) OVER (PARTITION BY token_id ORDER BY i) AS tc,
                 SUM(CASE WHEN current AND alone THEN amount ELSE 0 END) OVER (PARTITION BY user_id ORDER BY i) AS uc,
                 SUM(CASE WHEN current AND alone THEN amount ELSE 0 END) OVER (PARTITION BY team_id ORDER BY i) AS mc
            FROM s),
    go AS (SELECT c.*,
                  SUM(amount) OVER (PARTITION BY token_id ORDER BY i) AS tg,
                  SUM(amount) OVER (PARTITION BY user_id ORDER BY i) AS ug,
                  SUM(amount) OVER (PARTITION BY team_id ORDER BY i) AS mg
            FROM c WHERE current AND alone AND (tl IS NULL OR tc <= tr) AND (ul IS NULL OR uc <= ur) AND (ml IS NULL OR mc <= mr)),
    tt AS (SELECT token_id AS id, SUM(amount)::BIGINT AS amount FROM go GROUP BY token_id),
    ut AS (SELECT user_id AS id, SUM(amount)::BIGINT AS amount FROM go GROUP BY user_id),
    mt AS (SELECT team_id AS id, SUM(amount)::BIGINT AS amount FROM go GROUP BY team_id),
    t AS (UPDATE tokens SET remaining_micros = remaining_micros - tt.amount, reserved_micros = reserved_micros + tt.amount
            FROM tt WHERE tokens.id = tt.id AND (limit_micros IS NULL OR remaining_micros >= tt.amount) RETURNING tokens.id),
    u AS (UPDATE users SET remaining_micros = remaining_micros - ut.amount, reserved_micros = reserved_micros + ut.amount
            FROM ut WHERE users.id = ut.id AND (limit_micros IS NULL OR remaining_micros >= ut.amount) RETURNING users.id),
    m AS (UPDATE teams SET remaining_micros = remaining_micros - mt.amount, reserved_micros = reserved_micros + mt.amount
            FROM mt WHERE teams.id = mt.id AND (limit_micros IS NULL OR remaining_micros >= mt.amount) RETURNING teams.id),
    r AS (INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
            SELECT request_id, token_id, user_id, team_id, period, user_period, team_period, amount, owner, deadline, at FROM go),
    l AS (INSERT INTO ledger (token_id, user_id, team_id, period, user_period, team_period, kind, amount_micros, request_id, created_at)
            SELECT token_id, user_id, team_id, period, user_period, team_period, 'reserve', amount, request_id, at FROM go ORDER BY i)
    SELECT c.i, c.current, go.i IS NOT NULL, c.tl, c.ul, c.ml,
           (c.tr - COALESCE(go.tg, (SELECT amount FROM tt WHERE tt.id = c.token_id), 0))::BIGINT,
           (c.ur - COALESCE(go.ug, (SELECT amount FROM ut WHERE ut.id = c.user_id), 0))::BIGINT,
           (c.mr - COALESCE(go.mg, (SELECT amount FROM mt WHERE mt.id = c.team_id), 0))::BIGINT,
           ((SELECT COUNT(*) FROM tt) = (SELECT COUNT(*) FROM t) AND (SELECT COUNT(*) FROM ut) = (SELECT COUNT(*) FROM u)
            AND (SELECT COUNT(*) FROM mt) = (SELECT COUNT(*) FROM m))
    FROM c LEFT JOIN go ON go.i = c.i"
);

/// Decides what it can of `parts` (in the caller's transaction, the batch's rows locked):
/// one answer per part, `None` for a part left to its job's own step-by-step run.
pub async fn run(conn: &mut PgConnection, parts: &[Option<Part>]) -> Result<Vec<Option<Answer>>> {
    let mut answers: Vec<Option<Answer>> = parts.iter().map(|_| None).collect();
    settle_many(conn, parts, &mut answers).await?;
    reserve_many(conn, parts, &mut answers).await?;
    Ok(answers)
}

/// Indexes of the parts of one kind, each request id once (its first job).
fn firsts(parts: &[Option<Part>], kind: impl Fn(&Part) -> Option<&str>) -> Vec<usize> {
    let mut seen = HashSet::new();
    parts
        .iter()
        .enumerate()
        .filter_map(|(n, p)| Some((n, kind(p.as_ref()?)?)))
        .filter(|(_, id)| seen.insert(id.to_string()))
        .map(|(n, _)| n)
        .collect()
}

async fn settle_many(
    conn: &mut PgConnection,
    parts: &[Option<Part>],
    answers: &mut [Option<Answer>],
) -> Result<()> {
    let picked = firsts(parts, |p| match p {
        Part::Settle { request_id, .. } => Some(request_id),
        Part::Reserve { .. } => None,
    });
    if picked.is_empty() {
        return Ok(());
    }
    let (mut ids, mut orph, mut actual, mut at) = (vec![], vec![], vec![], vec![]);
    for &n in &picked {
        if let Some(Part::Settle {
            request_id,
            actual: a,
            now,
            or_orphaned,
        }) = &parts[n]
        {
            ids.push(request_id.to_string());
            orph.push(*or_orphaned);
            actual.push((*a).max(0));
            at.push(db_time(*now));
        }
    }
    let rows = sqlx::query(SETTLE_MANY.as_str())
        .bind(&ids)
        .bind(&orph)
        .bind(&actual)
        .bind(&at)
        .fetch_all(&mut *conn)
        .await?;
    // Every picked request not found was settled already: `None`, as `settle_tx` says.
    for &n in &picked {
        answers[n] = Some(Answer::Settle(None));
    }
    // Every row first, then the balances a recarry changed, on every row of that level:
    // one row's recarry gives back the refunds of the whole batch (s31 recarry attack F3).
    let mut settled = Vec::with_capacity(rows.len());
    let mut changed = Vec::new();
    for row in rows {
        let i: i64 = row.try_get(0)?;
        let k = index(i, picked.len())?;
        let left: [Option<i64>; 3] = [row.try_get(3)?, row.try_get(4)?, row.try_get(5)?];
        let levels: [i64; 3] = [row.try_get(9)?, row.try_get(10)?, row.try_get(11)?];
        changed.extend(follow_moved(conn, &row, 6, &ids[k], &at[k]).await?);
        let (charged, absorbed): (i64, i64) = (row.try_get(1)?, row.try_get(2)?);
        settled.push((picked[k], charged, absorbed, left, levels));
    }
    for (n, charged, absorbed, mut left, levels) in settled {
        for &(i, id, now_left) in &changed {
            if levels[i] == id {
                left[i] = now_left;
            }
        }
        answers[n] = Some(Answer::Settle(Some(Settled {
            charged,
            absorbed,
            remaining: left.into_iter().fold(None, tighter),
            token_remaining: left[0],
        })));
    }
    Ok(())
}

/// The 0-based position of a statement's 1-based `ORDINALITY`.
fn index(i: i64, len: usize) -> Result<usize> {
    usize::try_from(i - 1)
        .ok()
        .filter(|n| *n < len)
        .ok_or_else(|| StoreError::Batch(format!("a grouped statement answered for job {i}")))
}

async fn reserve_many(
    conn: &mut PgConnection,
    parts: &[Option<Part>],
    answers: &mut [Option<Answer>],
) -> Result<()> {
    let picked = firsts(parts, |p| match p {
        Part::Reserve { request_id, .. } => Some(request_id),
        Part::Settle { .. } => None,
    });
    if picked.is_empty() {
        return Ok(());
    }
    let mut cols: [Vec<i64>; 4] = Default::default();
    let mut text: [Vec<String>; 10] = Default::default();
    for &n in &picked {
        if let Some(Part::Reserve {
            request_id,
            owner,
            amount,
            process,
            now,
            deadline,
        }) = &parts[n]
        {
            cols[0].push(*amount);
            cols[1].push(owner.token_id);
            cols[2].push(owner.user_id);
            cols[3].push(owner.team_id);
            text[0].push(db_time(*now));
            text[1].push(request_id.to_string());
            for (k, reset) in owner.resets.iter().enumerate() {
                text[2 + k].push(reset.period_key(*now));
                text[7 + k].push(reset.as_str().to_string());
            }
            text[5].push(process.to_string());
            text[6].push(db_time(*deadline));
        }
    }
    let mut q = sqlx::query(RESERVE_MANY);
    for c in &cols {
        q = q.bind(c);
    }
    for t in &text {
        q = q.bind(t);
    }
    let rows = q.fetch_all(&mut *conn).await?;
    for row in rows {
        if !row.try_get::<bool, _>(9)? {
            return Err(StoreError::Conflict(
                "a level changed under its row lock; the batch's reservations are rolled back"
                    .into(),
            ));
        }
        let i: i64 = row.try_get(0)?;
        let n = picked[index(i, picked.len())?];
        let Some(Part::Reserve {
            request_id,
            owner,
            amount,
            now,
            ..
        }) = &parts[n]
        else {
            continue;
        };
        let current: bool = row.try_get(1)?;
        let went: bool = row.try_get(2)?;
        let limits: [Option<i64>; 3] = [row.try_get(3)?, row.try_get(4)?, row.try_get(5)?];
        let after: [Option<i64>; 3] = [row.try_get(6)?, row.try_get(7)?, row.try_get(8)?];
        let left: [Option<i64>; 3] = std::array::from_fn(|k| limits[k].and(after[k]));
        if went {
            answers[n] = Some(Answer::Reserve(Ok(Reservation {
                request_id: request_id.clone(),
                owner: (**owner).clone(),
                amount: *amount,
                periods: owner.resets.map(|reset| reset.period_key(*now)),
                remaining: left.into_iter().fold(None, tighter),
                token_remaining: left[0],
            })));
        } else if current {
            let short = LEVELS
                .into_iter()
                .enumerate()
                .find(|(k, _)| limits[*k].is_some() && after[*k].is_none_or(|l| l < *amount));
            if let Some((k, level)) = short {
                let reset = owner.resets[k];
                answers[n] = Some(Answer::Reserve(Err(Refusal::Insufficient(
                    level,
                    reset.seconds_to_reset(*now),
                ))));
            }
        }
    }
    Ok(())
}

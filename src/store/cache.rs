//! Cache entries (see `cache/`): whole answers keyed by the SHA-256 of the canonical request.

use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::writer::Tx;
use super::Result;
use crate::clock::db_time;

#[derive(Debug, Clone, FromRow)]
pub struct EntryRow {
    pub key: Vec<u8>,
    pub answer: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub expires_at: String,
    pub version: i64,
}

/// A live entry stored since a replica last looked (`keys_after`), and which store of its
/// key the row holds.
#[derive(Debug, Clone, FromRow)]
pub struct KeyRow {
    pub id: i64,
    pub key: Vec<u8>,
    pub version: i64,
}

/// An entry to store (queued in memory until its batch is written, so it owns its data).
pub struct NewEntry {
    pub key: [u8; 32],
    pub scope: String,
    pub model: String,
    pub format: &'static str,
    pub context_hash: Option<[u8; 32]>,
    pub vector: Option<Vec<u8>>,
    pub answer: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub tags: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Drawn at random, never 0, per store: which store of its key a row holds, where
    /// times may be equal (two replicas storing one key in the same millisecond).
    pub version: i64,
    /// `meta.cache_epoch` when the answer's request was planned: the row is written only
    /// while the table's is still that one. An invalidation since, on any replica, may
    /// have deleted what the answer was made from, and a row written after its delete
    /// outlived it (s46 stop attack F4). `None`: planned before the process read the epoch
    /// (never once it serves: it reads it at start), written as it is.
    pub epoch: Option<i64>,
}

pub async fn get(db: &super::Db, key: &[u8], now: DateTime<Utc>) -> Result<Option<EntryRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::cache::get(&pg.pool, key, now).await,
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as("SELECT key, answer, input_tokens, output_tokens, expires_at, version FROM cache_entries WHERE key = ? AND expires_at > ?")
        .bind(key)
        .bind(db_time(now))
        .fetch_optional(pool)
        .await?)
}

/// Written only while the table's epoch is the one the entry was planned under (`?14`;
/// NULL: unknown, written as it is): see `NewEntry::epoch`.
const PUT: &str = "INSERT OR REPLACE INTO cache_entries (key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at, version)
     SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
     WHERE ?14 IS NULL OR ?14 = (SELECT value FROM meta WHERE key = 'cache_epoch')";

/// How cache entries' batches are written on each engine (`store::lingering`).
pub const PUT_BATCH: super::lingering::BatchWrite<NewEntry> = super::lingering::BatchWrite {
    sqlite: put_batch_tx,
    pg: pg_put_batch,
};

fn pg_put_batch<'c>(
    conn: &'c mut sqlx::PgConnection,
    entries: &'c [NewEntry],
) -> futures_util::future::BoxFuture<'c, Result<()>> {
    Box::pin(super::pg::cache::put_batch_tx(conn, entries))
}

/// Stores entries inside a write batch (`store::lingering`): cache writes share the money
/// path's transactions instead of taking the write connection away from them.
pub fn put_batch_tx(tx: &mut Tx<'_>, entries: &[NewEntry]) -> Result<()> {
    for e in entries {
        let (created, expires) = (db_time(e.created_at), db_time(e.expires_at));
        let written = tx.execute(
            PUT,
            &[
                e.key.as_slice().into(),
                e.scope.as_str().into(),
                e.model.as_str().into(),
                e.format.into(),
                e.context_hash.as_ref().map(|c| c.as_slice()).into(),
                e.vector.as_deref().into(),
                e.answer.as_str().into(),
                e.input_tokens.into(),
                e.output_tokens.into(),
                e.tags.as_str().into(),
                created.as_str().into(),
                expires.as_str().into(),
                e.version.into(),
                e.epoch.into(),
            ],
        )?;
        if written == 0 {
            refused(1);
        }
    }
    Ok(())
}

/// Entries the table refused since the process started (`NewEntry::epoch`: planned
/// before an invalidation of any replica or the CLI), for `/metrics`. A batch that fails
/// and is written again (`store::lingering`, up to five times) counts its refusals again,
/// so the count may run above the entries refused.
static REFUSED: AtomicU64 = AtomicU64::new(0);

pub(super) fn refused(n: u64) {
    if n > 0 {
        REFUSED.fetch_add(n, Ordering::Relaxed);
    }
}

/// How many entries the table refused so far (`REFUSED`).
pub fn refused_so_far() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// A live entry as the in-memory indexes see it: (rowid, key, context hash, vector).
pub type IndexRow = (i64, Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

/// Live entries stored after rowid `after` (0: all), oldest first: what the in-memory
/// indexes (keys present, semantic candidates) are built and kept fresh from.
pub async fn index_rows(
    db: &super::Db,
    after: i64,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<IndexRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::cache::index_rows(&pg.pool, after, now, limit).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(
        "SELECT rowid, key, context_hash, vector FROM cache_entries WHERE rowid > ? AND expires_at > ? ORDER BY rowid LIMIT ?",
    )
    .bind(after)
    .bind(db_time(now))
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// (rowid, key) of the live entries stored after rowid `after`: enough to tell whether
/// another replica stored anything, without reading vectors back.
pub async fn keys_after(db: &super::Db, after: i64, now: DateTime<Utc>) -> Result<Vec<KeyRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::cache::keys_after(&pg.pool, after, now).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(
        "SELECT rowid AS id, key, version FROM cache_entries WHERE rowid > ? AND expires_at > ? ORDER BY rowid",
    )
    .bind(after)
    .bind(db_time(now))
    .fetch_all(pool)
    .await?)
}

/// Deletes every entry carrying `tag` and moves `cache_epoch` — even when none went, so
/// that an answer planned before it is not written after it (`NewEntry::epoch`); returns
/// the deleted keys. Entries store their tags
/// as `,a,b,`, and a tag is found as the whole, exact string `,tag,` — with `instr`, not
/// `LIKE`: `LIKE` reads `_` and `%` in a tag as wildcards (`a_b` would take `axb` with it,
/// `%` every entry) and ignores ASCII case (`Case:1` would take `case:1`).
pub async fn delete_tag(db: &super::Db, tag: &str) -> Result<Vec<Vec<u8>>> {
    if let super::Backend::Postgres(pg) = &db.backend {
        return super::pg::cache::delete_tag(&pg.pool, tag).await;
    }
    let mut tx = db.begin().await?;
    let keys = delete_tag_in(&mut tx, tag).await?;
    tx.commit().await?;
    Ok(keys)
}

/// `delete_tag` inside the caller's transaction: an admin's invalidation deletes in the
/// transaction of its audit row, so the entries go only if the row is written.
pub async fn delete_tag_in(tx: &mut super::Tx, tag: &str) -> Result<Vec<Vec<u8>>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::cache::delete_tag_in(conn, tag).await;
    }
    let needle = format!(",{tag},");
    let keys: Vec<Vec<u8>> =
        sqlx::query_scalar("DELETE FROM cache_entries WHERE instr(tags, ?) > 0 RETURNING key")
            .bind(needle)
            .fetch_all(tx.sqlite()?)
            .await?;
    sqlx::query("UPDATE meta SET value = value + 1 WHERE key = 'cache_epoch'")
        .execute(tx.sqlite()?)
        .await?;
    Ok(keys)
}

/// `cache_epoch` as the caller's transaction sees it (after its own `delete_tag_in`).
pub async fn epoch_in(tx: &mut super::Tx) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::cache::epoch_in(conn).await;
    }
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'cache_epoch'")
            .fetch_one(tx.sqlite()?)
            .await?,
    )
}

/// Deletes expired entries; returns their keys, for the cache to forget (it no longer
/// reads the whole table back after an eviction).
pub async fn evict_expired(db: &super::Db, now: DateTime<Utc>) -> Result<Vec<Vec<u8>>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::cache::evict_expired(&pg.pool, now).await
        }
    };
    Ok(
        sqlx::query_scalar("DELETE FROM cache_entries WHERE expires_at <= ? RETURNING key")
            .bind(db_time(now))
            .fetch_all(&sqlite.write)
            .await?,
    )
}

/// The query of the ids of the entries past a cap (bound at `cap`), on either engine, the
/// instant `now` judging which tokens have expired.
///
/// No scope's entries go for another's (s31 cache attack F2: the oldest of the whole
/// table went, so one team storing many cheap entries pushed every other team's out).
/// Each entry is ranked within its scope, newest first (by id: commit order, not the
/// stamping host's clock), and the table keeps the first `cap` of all entries ordered by
/// that rank, newest first among equal ranks. That is an equal share of the cap per
/// scope, a scope under its share keeping all of its entries and leaving the rest to the
/// others: a scope loses entries only while it holds more than the other scopes leave it.
/// A scope no request can reach any more — a token's (`cache.scope = "token"`) that is
/// revoked, rotated (its old text speaks as the successor, whose keys differ) or expired
/// — is placed after every reachable one, so its entries go first: with an equal share
/// each, dead tokens held the cap for their unreachable entries until these expired, up
/// to a year (s31 evict attack F1). Each entry probes its token by id (a token scope is
/// `token:<id>`, and `CASE` tests the prefix before the cast): tokens are never deleted, so
/// dead ones pile up, and the set of them read whole was rescanned for every entry on
/// PostgreSQL once past `work_mem`, minutes inside the eviction's lock (s33 diff attack
/// F1). The surplus is worked out from the rows the query sees, not from an earlier count.
#[doc(hidden)] // public for the plan tests (`tests/api/pg_cache_plan.rs`)
pub fn past_cap(cap: &str, now: &str) -> String {
    format!(
        "SELECT id FROM (
           SELECT id, ROW_NUMBER() OVER (ORDER BY gone, in_scope, id DESC) AS place
           FROM (SELECT id,
                        ROW_NUMBER() OVER (PARTITION BY scope ORDER BY id DESC) AS in_scope,
                        CASE WHEN scope NOT LIKE 'token:%' THEN 0
                             WHEN EXISTS (
                               SELECT 1 FROM tokens t
                               WHERE t.id = CAST(SUBSTR(scope, 7) AS BIGINT)
                                 AND (t.revoked_at IS NOT NULL OR t.successor_id IS NOT NULL
                                      OR t.expires_at <= {now})
                             ) THEN 1 ELSE 0 END AS gone
                 FROM cache_entries) AS ranked
         ) AS placed
         WHERE place > {cap}"
    )
}

/// Deletes the entries past `max_entries`, each scope's oldest beyond its share first
/// (`past_cap`); returns their keys.
pub async fn evict_over_cap(
    db: &super::Db,
    max_entries: u64,
    now: DateTime<Utc>,
) -> Result<Vec<Vec<u8>>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::cache::evict_over_cap(&pg.pool, max_entries, now).await
        }
    };
    // `as i64` would read a `max_entries` past i64::MAX as negative: everything "over".
    let cap = i64::try_from(max_entries).unwrap_or(i64::MAX);
    // A count first, so that the table is ranked only when it is past the cap.
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cache_entries")
        .fetch_one(&sqlite.read)
        .await?;
    if count <= cap {
        return Ok(Vec::new());
    }
    // Ranked on a read connection: the ranking sorts the whole table (about 0.5 s at
    // 100 000 entries), and on the write connection it held every write — the money
    // path's too — for that long. The rows are then deleted by id. A row placed past the
    // cap stays past it whatever is stored meanwhile (a new row only moves others down),
    // and replicas evicting at once delete the same ids; only rows another replica
    // deleted in between (an invalidation) can take the table that many below the cap.
    let ids: Vec<i64> = sqlx::query_scalar(&past_cap("?1", "?2"))
        .bind(cap)
        .bind(db_time(now))
        .fetch_all(&sqlite.read)
        .await?;
    // In chunks, each a write of its own: a surplus of 100 000 answers of a few KB deleted
    // in one statement held the one write connection — every reservation and settlement
    // behind it — for seconds (s31 evict attack F2).
    let mut keys = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(EVICT_CHUNK) {
        let list = chunk
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let deleted: std::result::Result<Vec<Vec<u8>>, _> = sqlx::query_scalar(
            "DELETE FROM cache_entries WHERE id IN (SELECT value FROM json_each(?)) RETURNING key",
        )
        .bind(format!("[{list}]"))
        .fetch_all(&sqlite.write)
        .await;
        match deleted {
            Ok(deleted) => keys.extend(deleted),
            // The keys the chunks before deleted are handed back, so memory forgets them
            // too (the error lost them until the next rebuild: s31 final attack F3); the
            // rest is the next pass's.
            Err(e) if !keys.is_empty() => {
                tracing::warn!(error = %e, evicted = keys.len(), "cache eviction stopped part way; the rest waits for the next pass");
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(keys)
}

/// How many entries one write of the eviction deletes at most.
const EVICT_CHUNK: usize = 500;

pub async fn epoch(db: &super::Db) -> Result<i64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::cache::epoch(&pg.pool).await,
    };
    let pool = &sqlite.read;
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'cache_epoch'")
            .fetch_one(pool)
            .await?,
    )
}

/// Counts a hit of the entry `key` through the writer: a job of the SQLite writer's next
/// batch, or (PostgreSQL) one statement on the pool — it locks no budget row.
/// How hits are counted, in batches (`store::lingering`): a count is statistics nothing on
/// the request path reads, and a write of its own per hit was a commit per hit at one
/// client (s39).
pub const HIT_BATCH: super::lingering::BatchWrite<[u8; 32]> = super::lingering::BatchWrite {
    sqlite: count_hits_tx,
    pg: pg_count_hits,
};

fn pg_count_hits<'c>(
    conn: &'c mut sqlx::PgConnection,
    keys: &'c [[u8; 32]],
) -> futures_util::future::BoxFuture<'c, Result<()>> {
    Box::pin(super::pg::cache::count_hits_tx(conn, keys))
}

/// Counts the hits of `keys` (a key once per hit) inside a write batch: one statement per
/// key.
pub fn count_hits_tx(tx: &mut Tx<'_>, keys: &[[u8; 32]]) -> Result<()> {
    for (key, n) in tally(keys) {
        tx.execute(
            "UPDATE cache_entries SET hits = hits + ? WHERE key = ?",
            &[n.into(), key.as_slice().into()],
        )?;
    }
    Ok(())
}

/// Each key of `keys` once with how many times it is there (in key order).
pub(super) fn tally(keys: &[[u8; 32]]) -> Vec<([u8; 32], i64)> {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<([u8; 32], i64)> = Vec::new();
    for k in sorted {
        match out.last_mut() {
            Some((last, n)) if *last == k => *n += 1,
            _ => out.push((k, 1)),
        }
    }
    out
}

/// The tightest remaining budget of a token, its user and its team, as a cache hit reports
/// it in `x-sluice-budget-remaining-usd` (a hit costs nothing, so it is the balance as it
/// stands; `None` when no level has a limit). A level whose period has passed but was not
/// rolled over yet (`Reset::place`, as the CAS and `ledger::balance` place it) reads as its
/// full limit. Read-only: the balances are the ledger's, never written here.
///
/// Given up at `by` (`StoreError::NotInTime`), and not begun with less than
/// `LEAST_TIME_LEFT` before it — neither on entry nor when its slot comes: a read begun
/// then was given up on at once yet held a slot, and its thread, until the store let go
/// (s42 final attack F4: a client deadline spent on the lookup; s43 attack F1: a slot
/// handed over just before the bound, taken after it).
pub async fn budget_remaining(
    db: &super::Db,
    owner: &super::ledger::Owner,
    now: DateTime<Utc>,
    by: std::time::Instant,
) -> Result<Option<i64>> {
    tokio::time::timeout_at(by.into(), budget_rows(db, owner, by))
        .await
        .map_err(|_| not_in_time())?
        .map(|rows| tightest(rows, owner, now))
}

fn not_in_time() -> super::StoreError {
    super::StoreError::NotInTime("a cache hit's budget read")
}

/// A budget read is begun only with at least this long left before its bound: one begun
/// closer to it mostly ends after the hit stopped waiting — for nobody, holding its slot —
/// and with the slots queued, each freed slot goes to the waiter with the least time left,
/// so under a burst nearly every hit lost its header, not only the excess (s43 final
/// attack F1). Reads take well under a millisecond when the store is well.
pub const LEAST_TIME_LEFT: std::time::Duration = std::time::Duration::from_millis(25);

/// Whether a read bound by `by` may still begin (`LEAST_TIME_LEFT`).
fn time_left(by: std::time::Instant) -> bool {
    by.saturating_duration_since(std::time::Instant::now()) >= LEAST_TIME_LEFT
}

/// The (level, limit, remaining, period) rows of `budget_remaining`, read to their end on
/// a task or thread of their own whatever becomes of this future — if begun in time.
async fn budget_rows(
    db: &super::Db,
    owner: &super::ledger::Owner,
    by: std::time::Instant,
) -> Result<Vec<BudgetRow>> {
    if !time_left(by) {
        return Err(not_in_time());
    }
    // A slot first, held by the read itself until it ends — not by this future, which the
    // hit stops waiting on at its bound: a read the store holds keeps its thread and
    // connection until the store lets go, and past the slots the others wait their turn
    // (within the hit's bound) instead of piling up threads and connections behind the
    // lock — or, on PostgreSQL, every pooled connection behind a `LOCK` until the
    // sessions' `lock_timeout` (s42 final attack F1, F2).
    let slot = db
        .budget_reads
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| super::StoreError::Sql(sqlx::Error::PoolClosed))?;
    if !time_left(by) {
        return Err(not_in_time());
    }
    match &db.backend {
        super::Backend::Postgres(pg) => {
            let (pool, ids) = (pg.pool.clone(), owner.clone());
            tokio::spawn(async move {
                let _slot = slot;
                super::pg::cache::budget_rows(&pool, &ids).await
            })
            .await
        }
        // Three rows by their keys, on a reader of the store's own (`readers`), in one hop
        // to a blocking thread: through the read pool it went to the connection's worker
        // thread and back, and once more for the connection's return, and waited behind
        // reads holding every pooled connection. Not on the worker's thread: SQLite's WAL
        // read retry sleeps, up to ~10 s, while another process holds the read marks, and
        // would hold every request of the worker (s40 final attack F1; docs/DESIGN.md
        // "Store").
        super::Backend::Sqlite(sqlite) => {
            let readers = sqlite.readers.clone();
            let ids = [owner.token_id, owner.user_id, owner.team_id];
            tokio::task::spawn_blocking(move || {
                let _slot = slot;
                let mut rows = Vec::with_capacity(3);
                readers.read(|conn| {
                    conn.query_rows(
                        "SELECT 0, limit_micros, remaining_micros, period FROM tokens WHERE id = ?1
                         UNION ALL SELECT 1, limit_micros, remaining_micros, period FROM users WHERE id = ?2
                         UNION ALL SELECT 2, limit_micros, remaining_micros, period FROM teams WHERE id = ?3",
                        &[ids[0].into(), ids[1].into(), ids[2].into()],
                        |r| {
                            if let Some(level) = r.int(0) {
                                rows.push((level, r.int(1), r.int(2), r.text(3).unwrap_or_default()));
                            }
                        },
                    )
                })?;
                Ok::<_, super::StoreError>(rows)
            })
            .await
        }
    }
    .map_err(|e| super::StoreError::Conflict(format!("the budget read did not finish: {e}")))?
}

/// Cache hits' budget reads in flight at most (`budget_remaining`), on either engine: four
/// keep up with hits (a read is three rows by key) and leave the PostgreSQL pool's 16
/// connections to the rest while a `LOCK` holds the reads.
const MOST_BUDGET_READS: usize = 4;

pub(super) fn budget_read_slots() -> std::sync::Arc<tokio::sync::Semaphore> {
    std::sync::Arc::new(tokio::sync::Semaphore::new(MOST_BUDGET_READS))
}

/// A budget row as `budget_remaining` reads it: (level — 0 token, 1 user, 2 team — limit,
/// remaining, period).
pub type BudgetRow = (i64, Option<i64>, Option<i64>, String);

/// The tightest of the (level, limit, remaining, period) rows `budget_remaining` reads, on
/// either engine.
pub(super) fn tightest(
    rows: Vec<BudgetRow>,
    owner: &super::ledger::Owner,
    now: DateTime<Utc>,
) -> Option<i64> {
    rows.into_iter()
        .filter_map(|(level, limit, remaining, period)| {
            let limit = limit?;
            // The first column names the level: token, user, team — the order of `resets`.
            let reset = *owner.resets.get(usize::try_from(level).ok()?)?;
            let (key, rolls) = reset.place(&period, now);
            // Rolled forward, the new period starts full; rolled back from one a wrong clock
            // put it in, what is left there bounds it.
            let refills = rolls && reset.counted_with(&period, &key) == key;
            Some(if refills {
                limit
            } else {
                remaining.unwrap_or(limit)
            })
        })
        .min()
}

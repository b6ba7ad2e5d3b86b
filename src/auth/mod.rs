//! Authentication of `/v1/*` requests (`token`: the sub-token format) and of admins
//! (`password`: argon2id, bounded; `throttle`: the guessing limit; `session`, `csrf`).
//!
//! Sub-tokens are looked up by SHA-256 in an in-memory LRU in front of SQLite. The cache is
//! dropped whenever the database's `token_epoch` counter moves (polled every 250 ms, so a
//! revocation from any replica or the CLI takes effect within 1 s); on PostgreSQL another
//! host's change is also heard at once (`hear_changes`: LISTEN/NOTIFY), the poll staying the
//! fallback. Expiry is checked on every request, cache hit or not: on SQLite against the
//! host's clock (the only one), on PostgreSQL against the database's — the host's clock
//! corrected by its offset to the database's, learned at each poll (`refresh`), as the
//! CAS judges expiry by the database's clock (`store::pg::db_now!`): hosts' clocks may
//! disagree by any amount, and a host whose clock lags must not serve an expired token.

pub mod csrf;
pub mod oidc;
pub mod password;
pub mod session;
pub mod throttle;
pub mod token;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use actix_web::http::header::HeaderMap;
use chrono::{DateTime, Utc};
use lru::LruCache;
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::quota::period::Reset;
use crate::store::ledger::Owner;
use crate::store::tokens::{self, TokenAuthRow};
use crate::store::{Change, Db, StoreError};

/// What the request path knows about an authenticated token.
#[derive(Debug)]
pub struct TokenAuth {
    pub owner: Owner,
    pub prefix: String,
    /// A rotated token whose text was presented, working as its successor (`owner`) during
    /// its overlap: its `last_used_at` still follows its use (`store::requests`).
    pub presented: Option<i64>,
    /// The models the token may use (all when `None`); shared, so each request's
    /// `Prepared::allowed` is a pointer copy.
    pub models: Option<Arc<[String]>>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub user_rpm: Option<i64>,
    pub user_tpm: Option<i64>,
    pub max_priority: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub limit_micros: Option<i64>,
    /// Percent of the budget after which the soft limit applies.
    pub alert_percent: i64,
    /// The model requests switch to past the soft limit.
    pub downgrade_model: Option<String>,
    /// This token's default cache TTL (else the config's).
    pub cache_ttl_seconds: Option<i64>,
    /// The token's and its team's default tags, canonical (`pipeline::tags`); a request's
    /// own tags are merged over them.
    pub tags: String,
    pub team_tags: String,
    /// The token's remaining balance as last seen by this process (for the soft limit;
    /// the hard limit is always the CAS).
    remaining_hint: AtomicI64,
    alerted: AtomicBool,
}

impl TokenAuth {
    /// `presented`: the id of the token whose text was presented, when it is not `row`'s
    /// (a rotated token's, `row` its successor's).
    fn from_row(row: TokenAuthRow, presented: i64) -> Self {
        let reset = |s: &str| Reset::parse(s).unwrap_or(Reset::Never);
        TokenAuth {
            owner: Owner {
                token_id: row.id,
                user_id: row.user_id,
                team_id: row.team_id,
                resets: [
                    reset(&row.reset),
                    reset(&row.user_reset),
                    reset(&row.team_reset),
                ],
            },
            prefix: row.prefix,
            presented: (presented != row.id).then_some(presented),
            models: row
                .models
                .as_deref()
                .and_then(|m| serde_json::from_str::<Vec<String>>(m).ok())
                .map(Arc::from),
            rpm: row.rpm,
            tpm: row.tpm,
            user_rpm: row.user_rpm,
            user_tpm: row.user_tpm,
            max_priority: row.max_priority,
            limit_micros: row.limit_micros,
            alert_percent: row.alert_percent,
            downgrade_model: row.downgrade_model,
            cache_ttl_seconds: row.cache_ttl_seconds,
            tags: row.tags,
            team_tags: row.team_tags,
            remaining_hint: AtomicI64::new(row.remaining_micros.unwrap_or(i64::MAX)),
            alerted: AtomicBool::new(false),
            expires_at: row
                .expires_at
                .as_deref()
                .and_then(|e| DateTime::parse_from_rfc3339(e).ok())
                .map(|e| e.with_timezone(&Utc)),
        }
    }

    /// The caller of a `plain` benchmark ladder step (`config::Ladder`): no token, no
    /// limits, every model; one shared instance. Never used when authentication is on.
    pub fn anonymous() -> Arc<Self> {
        static ANONYMOUS: OnceLock<Arc<TokenAuth>> = OnceLock::new();
        ANONYMOUS
            .get_or_init(|| {
                Arc::new(TokenAuth {
                    owner: Owner {
                        token_id: 0,
                        user_id: 0,
                        team_id: 0,
                        resets: [Reset::Never; 3],
                    },
                    prefix: String::new(),
                    presented: None,
                    models: None,
                    rpm: None,
                    tpm: None,
                    user_rpm: None,
                    user_tpm: None,
                    max_priority: 4,
                    limit_micros: None,
                    alert_percent: 100,
                    downgrade_model: None,
                    cache_ttl_seconds: None,
                    tags: String::new(),
                    team_tags: String::new(),
                    remaining_hint: AtomicI64::new(i64::MAX),
                    alerted: AtomicBool::new(false),
                    expires_at: None,
                })
            })
            .clone()
    }

    /// Records the token's remaining balance after a reservation or settlement; `true`
    /// the first time it crosses the alert threshold (the caller raises the alert).
    pub fn note_remaining(&self, remaining: Option<i64>) -> bool {
        let Some(r) = remaining else { return false };
        self.remaining_hint.store(r, Ordering::Relaxed);
        self.past_threshold() && !self.alerted.swap(true, Ordering::Relaxed)
    }

    /// Percent of the token's budget used, as last seen (0 without a limit).
    pub fn percent_used(&self) -> i64 {
        match self.limit_micros {
            Some(l) if l > 0 => {
                let left = self.remaining_hint.load(Ordering::Relaxed).clamp(0, l);
                ((i128::from(l - left) * 100) / i128::from(l)) as i64
            }
            _ => 0,
        }
    }

    /// Past the soft limit (the alert threshold).
    pub fn past_threshold(&self) -> bool {
        self.limit_micros.is_some() && self.percent_used() >= self.alert_percent
    }

    /// Whether this token may use a model (asked by `name`, canonically `canonical`).
    pub fn allows(&self, name: &str, canonical: &str) -> bool {
        listed(self.models.as_deref(), name, canonical)
    }
}

/// Whether a token's `models` list (`None`: every model) holds a model, by the name it was
/// asked by or its canonical name.
pub fn listed(models: Option<&[String]>, name: &str, canonical: &str) -> bool {
    models.is_none_or(|m| m.iter().any(|x| x == name || x == canonical))
}

/// The credential a request presents: `Authorization: Bearer …` or `x-api-key: …`.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            return Some(v[7..].trim());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

const CACHE_ENTRIES: usize = 50_000;

/// Most successors a rotated token's text is followed through (`as_successor`).
const MAX_ROTATIONS: usize = 16;

/// The earlier of two stored expiries (`None`: never).
fn earliest(a: Option<String>, b: Option<String>) -> Option<String> {
    let at = |s: &String| DateTime::parse_from_rfc3339(s).ok();
    match (a, b) {
        (Some(a), Some(b)) => Some(if at(&a) <= at(&b) { a } else { b }),
        (a, b) => a.or(b),
    }
}

pub struct Authenticator {
    db: Db,
    cache: Mutex<LruCache<token::TokenHash, Arc<TokenAuth>>>,
    epoch: AtomicI64,
    /// Bumped (under the cache lock) by every `invalidate`. A row read from the database
    /// is cached only if no invalidation came between the read and the insert: a read that
    /// started before a revocation committed, and finished after the cache was cleared for
    /// it, would otherwise put the revoked token back for good (the epoch does not move
    /// again).
    generation: AtomicU64,
    /// What this host's clock lags the database's by, in ms (negative: it runs ahead),
    /// learned at each poll on PostgreSQL (`refresh`); 0 on SQLite, and until learned.
    db_offset_ms: AtomicI64,
}

/// The longest poll whose reading of the database's clock is kept: the database read it
/// somewhere between the poll's start and end, so the offset is known to within half that.
const MAX_SAMPLE_MS: i64 = 1_000;

/// The offset of the database's clock (`db_ms`, read between `before` and `after` on this
/// host's clock) to this host's, in ms; `None` when the read took too long (or the host's
/// clock went back meanwhile) to tell it within `MAX_SAMPLE_MS / 2`.
fn offset_of(before: DateTime<Utc>, db_ms: i64, after: DateTime<Utc>) -> Option<i64> {
    let (b, a) = (before.timestamp_millis(), after.timestamp_millis());
    if a < b || a - b > MAX_SAMPLE_MS {
        return None;
    }
    Some(db_ms - (b + (a - b) / 2))
}

impl Authenticator {
    pub fn new(db: Db) -> Arc<Self> {
        let cap = NonZeroUsize::new(CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN);
        Arc::new(Self {
            db,
            cache: Mutex::new(LruCache::new(cap)),
            epoch: AtomicI64::new(i64::MIN),
            generation: AtomicU64::new(0),
            db_offset_ms: AtomicI64::new(0),
        })
    }

    /// `now`, this host's time, on the database's clock (the same on SQLite): what token
    /// expiries are judged against.
    pub fn on_db_clock(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::milliseconds(self.db_offset_ms.load(Ordering::Relaxed))
    }

    /// Whether a token expiring at `expires_at` has expired at `now` (this host's time),
    /// judged on the database's clock.
    fn expired(&self, expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        expires_at.is_some_and(|e| e <= self.on_db_clock(now))
    }

    /// `Ok(None)` for a missing, malformed, unknown, revoked or expired token — the caller
    /// answers all of them with the same 401. `now` is this host's time; expiry is judged
    /// on the database's clock (`on_db_clock`), on a cache hit as on a fresh read.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<TokenAuth>>, StoreError> {
        self.authenticate_from(headers, now, true).await
    }

    /// `authenticate` read from the database whatever this process has cached (and cached
    /// again): for a request whose reservation found its token rotated, which must learn
    /// the successor now, not at the next poll (`pipeline::recheck::after_rotation`).
    pub async fn authenticate_fresh(
        &self,
        headers: &HeaderMap,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<TokenAuth>>, StoreError> {
        self.authenticate_from(headers, now, false).await
    }

    async fn authenticate_from(
        &self,
        headers: &HeaderMap,
        now: DateTime<Utc>,
        cached: bool,
    ) -> Result<Option<Arc<TokenAuth>>, StoreError> {
        let Some(hash) = presented(headers).and_then(token::parse) else {
            return Ok(None);
        };
        let cached = match cached {
            true => self.cache.lock().get(&hash).cloned(),
            false => None,
        };
        let auth = match cached {
            Some(a) => a,
            None => {
                let read_at = self.generation.load(Ordering::Acquire);
                let Some(row) = tokens::find_auth(&self.db, &hash).await? else {
                    return Ok(None);
                };
                let presented = row.id;
                let Some(row) = self.as_successor(row).await? else {
                    return Ok(None);
                };
                let a = Arc::new(TokenAuth::from_row(row, presented));
                self.remember(read_at, hash, a.clone());
                a
            }
        };
        if self.expired(auth.expires_at, now) {
            return Ok(None);
        }
        Ok(Some(auth))
    }

    /// A rotated token's row as the token it was rotated to (and that one's, if rotated in
    /// turn): its successor's budget, windows and limits, under the earliest expiry of the
    /// chain (the old text's overlap ends it). `None` when a successor is not live (revoked,
    /// its user disabled): revoking the new token ends the old text too. A chain longer
    /// than `MAX_ROTATIONS` (rotations within overlaps, each one new) is refused.
    async fn as_successor(
        &self,
        mut row: tokens::TokenAuthRow,
    ) -> Result<Option<tokens::TokenAuthRow>, StoreError> {
        for _ in 0..=MAX_ROTATIONS {
            let Some(next) = row.successor_id else {
                return Ok(Some(row));
            };
            let Some(mut successor) = tokens::find_auth_by_id(&self.db, next).await? else {
                return Ok(None);
            };
            successor.expires_at = earliest(row.expires_at, successor.expires_at);
            row = successor;
        }
        Ok(None)
    }

    /// Caches a row read when the generation was `read_at`, unless the cache was cleared
    /// since (the row may predate the change that cleared it).
    fn remember(&self, read_at: u64, hash: token::TokenHash, auth: Arc<TokenAuth>) {
        let mut cache = self.cache.lock();
        if self.generation.load(Ordering::Acquire) == read_at {
            cache.put(hash, auth);
        }
    }

    /// Drops every cached token (after a revocation or an edit in this process).
    pub fn invalidate(&self) {
        let mut cache = self.cache.lock();
        cache.clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Follows changes other hosts commit as they are heard (`Db::hear_changes`): a token
    /// change drops this cache at once instead of at the next poll; `on_cache` runs for a
    /// cache invalidation, `on_catalog` for a change to the managed keys and models. The
    /// poll (`refresh`) goes on regardless, as the fallback.
    pub fn hear_changes(
        self: &Arc<Self>,
        on_cache: impl Fn() + Send + Sync + 'static,
        on_catalog: impl Fn() + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let me = Arc::downgrade(self);
        self.db.hear_changes(move |change| {
            let Some(me) = me.upgrade() else { return };
            if matches!(change, Change::Tokens | Change::Unknown) {
                me.invalidate();
            }
            if matches!(change, Change::Cache | Change::Unknown) {
                on_cache();
            }
            if matches!(change, Change::Catalog | Change::Unknown) {
                on_catalog();
            }
        })
    }

    /// Polls the change counter; clears the cache when it moved. Returns whether it did.
    /// On PostgreSQL the same read takes the database's clock, and this host's offset to
    /// it (`clock` is the host's) is learned from it, when the read was quick enough.
    pub async fn refresh(&self, clock: &dyn Clock) -> Result<bool, StoreError> {
        let started = clock.now();
        let (now, db_ms) = tokens::epoch_and_clock(&self.db).await?;
        if let Some(offset) = db_ms.and_then(|db| offset_of(started, db, clock.now())) {
            self.db_offset_ms.store(offset, Ordering::Relaxed);
        }
        let before = self.epoch.swap(now, Ordering::Relaxed);
        if before != now {
            self.invalidate();
        }
        Ok(before != now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interleaving that kept a revoked token alive: a request reads the token's row,
    /// the revocation commits and the cache is cleared, then the request caches what it
    /// read. The stale row must not be cached.
    #[tokio::test]
    async fn a_row_read_before_an_invalidation_is_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
        let auth = Authenticator::new(db);
        let hash: token::TokenHash = Default::default();
        let read_at = auth.generation.load(Ordering::Acquire);
        auth.invalidate();
        auth.remember(read_at, hash, TokenAuth::anonymous());
        assert!(auth.cache.lock().is_empty(), "a stale row was cached");
        let read_at = auth.generation.load(Ordering::Acquire);
        auth.remember(read_at, hash, TokenAuth::anonymous());
        assert_eq!(auth.cache.lock().len(), 1, "a fresh row is cached");
    }

    /// The offset to the database's clock is read against the middle of the poll, and a
    /// poll too slow to tell it within half a second is not used.
    #[test]
    fn the_offset_to_the_database_clock_is_read_at_the_middle_of_a_quick_poll() {
        let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap();
        let real = 1_800_000_000_000;
        // A host 120 s behind; the poll took 200 ms, the database read mid-way.
        let lag = 120_000;
        assert_eq!(
            offset_of(at(real - lag), real + 100, at(real - lag + 200)),
            Some(lag)
        );
        // A host 30 s ahead, an instant poll.
        assert_eq!(
            offset_of(at(real + 30_000), real, at(real + 30_000)),
            Some(-30_000)
        );
        assert_eq!(
            offset_of(at(real), real, at(real + MAX_SAMPLE_MS + 1)),
            None,
            "too slow"
        );
        assert_eq!(
            offset_of(at(real), real, at(real - 1)),
            None,
            "the clock went back"
        );
    }

    /// A token that expired 5 s ago by the database's clock is refused by a host whose clock
    /// lags 2 min once the offset is learned (before: by its own clock it had 115 s left),
    /// and one with a minute left is served by a host 2 min ahead.
    #[tokio::test]
    async fn expiry_is_judged_on_the_database_clock_through_the_learned_offset() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
        let auth = Authenticator::new(db);
        let real = Utc::now();
        let expired = Some(real - chrono::Duration::seconds(5));
        let behind = real - chrono::Duration::seconds(120);
        assert!(
            !auth.expired(expired, behind),
            "unlearned: the host's clock"
        );
        let offset = offset_of(behind, real.timestamp_millis(), behind).unwrap();
        auth.db_offset_ms.store(offset, Ordering::Relaxed);
        assert!(auth.expired(expired, behind), "served 5 s after its expiry");
        assert!(auth.expired(expired, real - chrono::Duration::seconds(119)));
        let ahead = real + chrono::Duration::seconds(120);
        let offset = offset_of(ahead, real.timestamp_millis(), ahead).unwrap();
        auth.db_offset_ms.store(offset, Ordering::Relaxed);
        let left = Some(real + chrono::Duration::seconds(60));
        assert!(!auth.expired(left, ahead), "refused with a minute left");
        assert!(auth.expired(left, ahead + chrono::Duration::seconds(60)));
    }

    /// SQLite's poll reads no database clock: the offset stays 0, expiry follows the host.
    #[tokio::test]
    async fn on_sqlite_expiry_follows_the_host_clock() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
        let auth = Authenticator::new(db);
        let clock = crate::clock::ManualClock::new(Utc::now() - chrono::Duration::days(3));
        auth.refresh(&clock).await.unwrap();
        assert_eq!(auth.on_db_clock(clock.now()), clock.now());
    }
}

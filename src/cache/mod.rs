//! Stage 4, the response cache (layer 1). Exact match on the canonical request's key
//! (`key.rs`), then — when the last user message differs — a semantic match among the
//! entries sharing the same context, whose last user message agrees with this one
//! (`meaning.rs`: numbers, dates, identifiers, negations, units, names, code and order are
//! significant): cosine similarity of its embedding (`embed.rs`) ≥ the threshold. Entries live in SQLite (shared by replicas)
//! with an LRU in front; the semantic index is held in memory per context and rebuilt at
//! start and whenever another process invalidates entries (`cache_epoch`). A hit costs
//! nothing; streams are replayed from whole answers (`replay.rs`).

pub mod embed;
pub mod headers;
pub mod key;
pub mod meaning;
pub mod replay;
pub mod shape;
mod words;

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use chrono::{DateTime, Duration, Utc};
use lru::LruCache;
use parking_lot::{Mutex, RwLock};
use serde_json::Value;

use crate::config::{CacheSettings, UpstreamTimeouts};
use crate::error::{ApiError, WireFormat};
use crate::store::lingering::Lingering;
use crate::store::writer::Writer;
use crate::store::{self, StoreError};
use crate::upstream::url_guard::SystemResolver;
use embed::{Embedder, Vector};
use headers::{expiry, header, parse_tags, parse_ttl};
pub use headers::{invalidation_tag, MAX_TAGS, MAX_TAG_LEN, MAX_TTL_SECONDS};
use key::{Key, Keys};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    Exact,
    Semantic,
}

pub struct Entry {
    pub key: Key,
    pub answer: Value,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub expires_at: DateTime<Utc>,
}

pub struct Hit {
    pub entry: Arc<Entry>,
    pub kind: HitKind,
    pub similarity: f32,
}

/// What one request does with the cache.
#[derive(Clone)]
pub struct Plan {
    pub keys: Arc<Keys>,
    pub scope: String,
    pub model: String,
    pub format: WireFormat,
    /// `x-sluice-cache: refresh`: skip the lookup, store the new answer.
    pub refresh: bool,
    pub ttl: Duration,
    pub tags: String,
    pub threshold: f32,
}

pub struct Cache {
    cfg: CacheSettings,
    embedder: Embedder,
    db: store::Db,
    /// New entries, written in lingering batches through the group-commit writer.
    stored: Lingering<store::cache::NewEntry>,
    /// Hit counts go through the writer too.
    writer: Writer,
    lru: Mutex<Lru>,
    /// Context key → (entry key, embedding of its last user message).
    index: RwLock<Index>,
    /// The exact keys (their first 8 bytes) of the entries in the database, so that a miss
    /// — most lookups — is answered without a database read. Entries written by other
    /// replicas are picked up within `CACHE_POLL` (by rowid); one that expired or was
    /// evicted since only costs the read it would have cost anyway.
    present: RwLock<HashSet<u64>>,
    /// The highest rowid the in-memory indexes have seen.
    seen_rowid: AtomicI64,
    epoch: AtomicI64,
}

fn prefix(key: &Key) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_le_bytes(b)
}

/// Most semantic candidates kept per context (the oldest go first): a lookup compares the
/// question with every candidate of its context, so one context shared by every request
/// (the same system prompt for a whole application) must not grow without bound.
const MAX_PER_CONTEXT: usize = 256;

/// Most entries kept in memory in front of SQLite.
const LRU_ENTRIES: usize = 10_000;

/// Rows the semantic index reads back per query.
const INDEX_PAGE: i64 = 1_000;

/// Most memory those entries may hold (64 MiB): an answer may be as large as
/// `upstream.max_response_bytes`, and 10 000 of them had no bound (s24 attack, cache #2).
const LRU_BYTES: usize = 64 << 20;

/// About the memory an entry holds: the entry and its parsed answer. The answer's text
/// undercounts it (`[0,0,…]` is two bytes a number as text and a 32-byte `Value` parsed;
/// s24 review F6), so the bound counts the parsed form.
fn held(e: &Entry) -> usize {
    std::mem::size_of::<Entry>() + parsed(&e.answer)
}

/// The heap a parsed JSON value holds beyond its own slot (strings, array slots, and per
/// object member its key, value slot and a share of the tree's node).
fn parsed(v: &Value) -> usize {
    const SLOT: usize = std::mem::size_of::<Value>();
    const MEMBER: usize = std::mem::size_of::<String>() + SLOT + 16;
    match v {
        Value::String(s) => s.capacity(),
        Value::Array(a) => a.capacity() * SLOT + a.iter().map(parsed).sum::<usize>(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| MEMBER + k.capacity() + parsed(v))
            .sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// The entries in memory, least recently used first out, bounded in count and in the
/// memory they hold (`held`).
struct Lru {
    entries: LruCache<Key, (Arc<Entry>, usize)>,
    bytes: usize,
}

impl Lru {
    fn get(&mut self, key: &Key) -> Option<Arc<Entry>> {
        self.entries.get(key).map(|(e, _)| e.clone())
    }

    /// Keeps `entry`; one larger than the whole budget is not kept (it is read from the
    /// database when asked for).
    fn put(&mut self, key: Key, entry: Arc<Entry>) {
        let bytes = held(&entry);
        if bytes > LRU_BYTES {
            self.pop(&key);
            return;
        }
        if let Some((_, (_, gone))) = self.entries.push(key, (entry, bytes)) {
            self.bytes -= gone;
        }
        self.bytes += bytes;
        while self.bytes > LRU_BYTES {
            match self.entries.pop_lru() {
                Some((_, (_, gone))) => self.bytes -= gone,
                None => break,
            }
        }
    }

    fn pop(&mut self, key: &Key) {
        if let Some((_, gone)) = self.entries.pop(key) {
            self.bytes -= gone;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

/// Most vector features the semantic index keeps in memory (64 MiB): `max_entries` alone
/// let an index of large vectors outgrow the process, reloaded whole at every start (s24
/// attack, cache #2). Past it, a new entry is an exact match only until older ones go.
const MAX_INDEX_FEATURES: usize = 8 << 20;

/// The semantic candidates in memory, per context, and how many features they hold.
#[derive(Default)]
struct Index {
    buckets: HashMap<Key, Vec<(Key, Vector)>>,
    features: usize,
}

impl Index {
    /// Adds a candidate to its context's bucket (replacing the same entry, dropping the
    /// oldest past `MAX_PER_CONTEXT`); `false`, and nothing added, past the budget.
    fn add(&mut self, context: Key, key: Key, v: Vector) -> bool {
        let bucket = self.buckets.entry(context).or_default();
        let mut freed = 0;
        bucket.retain(|(k, old)| {
            let same = *k == key;
            if same {
                freed += old.len();
            }
            !same
        });
        if bucket.len() >= MAX_PER_CONTEXT {
            freed += bucket.remove(0).1.len();
        }
        self.features -= freed;
        if self.features + v.len() > MAX_INDEX_FEATURES {
            if bucket.is_empty() {
                self.buckets.remove(&context);
            }
            return false;
        }
        self.features += v.len();
        bucket.push((key, v));
        true
    }

    fn forget(&mut self, keys: &[Key]) {
        let mut freed = 0;
        for bucket in self.buckets.values_mut() {
            bucket.retain(|(k, v)| {
                let gone = keys.contains(k);
                if gone {
                    freed += v.len();
                }
                !gone
            });
        }
        self.buckets.retain(|_, b| !b.is_empty());
        self.features -= freed;
    }
}

/// The entries a `Cache::delete_tag` deleted, to forget once its transaction commits.
pub struct Deleted(Vec<Key>);

impl Deleted {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn as_key(v: &[u8]) -> Option<Key> {
    v.try_into().ok()
}

impl Cache {
    pub fn new(
        cfg: &CacheSettings,
        timeouts: &UpstreamTimeouts,
        db: store::Db,
        writer: Writer,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let embedder = match cfg.embedder.as_str() {
            "http" => Embedder::http(
                &cfg.http_url,
                &cfg.http_model,
                cfg.http_api_key.as_ref().map(|k| k.expose().to_string()),
                cfg.http_allow_private_network,
                std::time::Duration::from_millis(timeouts.connect_timeout_ms),
                Arc::new(SystemResolver),
            )?,
            _ => Embedder::Lexical,
        };
        let cap = NonZeroUsize::new(LRU_ENTRIES).unwrap_or(NonZeroUsize::MIN);
        Ok(Arc::new(Self {
            cfg: cfg.clone(),
            embedder,
            db,
            stored: Lingering::start(writer.clone(), "cache entries", store::cache::PUT_BATCH),
            writer,
            lru: Mutex::new(Lru {
                entries: LruCache::new(cap),
                bytes: 0,
            }),
            index: RwLock::new(Index::default()),
            present: RwLock::new(HashSet::new()),
            seen_rowid: AtomicI64::new(0),
            epoch: AtomicI64::new(i64::MIN),
        }))
    }

    /// Decides whether and how a request uses the cache (`None`: not cacheable).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        headers: &HeaderMap,
        body: &serde_json::Map<String, Value>,
        format: WireFormat,
        model: &str,
        owner: (i64, i64),
        token_ttl: Option<i64>,
        model_threshold: Option<f64>,
        model_ignore_identifiers: Option<bool>,
    ) -> Result<Option<Plan>, ApiError> {
        let asked = header(headers, "x-sluice-cache")?;
        if !matches!(asked, None | Some("on" | "off" | "refresh")) {
            return Err(ApiError::invalid(
                "x-sluice-cache",
                "x-sluice-cache must be on, off or refresh",
            ));
        }
        // Checked whether or not the request is cacheable: a bad header is a bad request.
        let asked_ttl = header(headers, "x-sluice-cache-ttl")?
            .map(parse_ttl)
            .transpose()?;
        let tags = parse_tags(header(headers, "x-sluice-cache-tags")?)?;
        let deterministic = body.get("temperature").and_then(Value::as_f64) == Some(0.0);
        let wanted = match (self.cfg.mode.as_str(), asked) {
            ("off", _) | (_, Some("off")) => false,
            (_, Some("on" | "refresh")) => true,
            ("all", _) => true,
            _ => deterministic,
        };
        if !wanted || body.get("n").and_then(Value::as_i64).unwrap_or(1) > 1 {
            return Ok(None);
        }
        let ttl = match asked_ttl {
            Some(t) => t,
            // A token's TTL (from the database) and the config's are held to the range
            // rather than refused: the client did not choose them.
            None => token_ttl
                .filter(|t| *t > 0)
                .unwrap_or(self.cfg.default_ttl_seconds.min(MAX_TTL_SECONDS as u64) as i64)
                .clamp(1, MAX_TTL_SECONDS),
        };
        let scope = match self.cfg.scope.as_str() {
            "token" => format!("token:{}", owner.0),
            "global" => "global".to_string(),
            _ => format!("team:{}", owner.1),
        };
        // A request header that changes the answer is part of the key: Anthropic's beta
        // features (forwarded to Anthropic upstreams) can change what the model returns.
        let key_scope = match header(headers, "anthropic-beta")? {
            Some(beta) if !beta.is_empty() => format!("{scope}\u{1f}anthropic-beta={beta}"),
            _ => scope.clone(),
        };
        Ok(Some(Plan {
            keys: Arc::new(key::keys(
                &key_scope,
                model,
                format,
                body,
                self.reading(model_ignore_identifiers),
            )),
            scope,
            model: model.to_string(),
            format,
            refresh: asked == Some("refresh"),
            ttl: Duration::seconds(ttl),
            tags: format!(",{},", tags.join(",")),
            threshold: model_threshold.unwrap_or(self.cfg.similarity_threshold) as f32,
        }))
    }

    /// How questions are read for the semantic match: strictly with the lexical embedder,
    /// identifiers significant unless the model or the config opts out.
    fn reading(&self, model_ignore_identifiers: Option<bool>) -> meaning::Reading {
        meaning::Reading {
            semantic: self.cfg.semantic,
            strict: !matches!(self.embedder, Embedder::Http { .. }),
            ignore_identifiers: model_ignore_identifiers.unwrap_or(self.cfg.ignore_identifiers),
        }
    }

    /// The live entry of `key`, answered in `format`. One read back that is not a whole
    /// answer (stored by an older version, or by hand) is a miss.
    async fn entry(
        &self,
        key: &Key,
        format: WireFormat,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<Entry>>, StoreError> {
        let cached = self.lru.lock().get(key);
        if let Some(e) = cached.filter(|e| e.expires_at > now) {
            return Ok(Some(e));
        }
        if !self.present.read().contains(&prefix(key)) {
            return Ok(None);
        }
        let Some(row) = store::cache::get(&self.db, key, now).await? else {
            return Ok(None);
        };
        let Ok(answer) = serde_json::from_str(&row.answer) else {
            return Ok(None);
        };
        if !shape::whole(format, &answer) {
            return Ok(None);
        }
        let entry = Arc::new(Entry {
            key: *key,
            answer,
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            expires_at: DateTime::parse_from_rfc3339(&row.expires_at)
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or(now),
        });
        self.lru.lock().put(*key, entry.clone());
        Ok(Some(entry))
    }

    /// Exact, then semantic. Errors are logged and read as a miss: the cache never fails a
    /// request. The embedder is waited for until the request's `deadline` at most (an `http`
    /// embedder that never answers held each lookup for its own 5 s, whatever the client's
    /// deadline said).
    pub async fn get(
        &self,
        plan: &Plan,
        now: DateTime<Utc>,
        deadline: std::time::Instant,
    ) -> Option<Hit> {
        match self.entry(&plan.keys.exact, plan.format, now).await {
            Ok(Some(entry)) => {
                return Some(Hit {
                    entry,
                    kind: HitKind::Exact,
                    similarity: 1.0,
                })
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cache lookup failed"),
        }
        if !self.cfg.semantic {
            return None;
        }
        let (Some(context), Some(text)) = (plan.keys.context, plan.keys.embed_text.as_deref())
        else {
            return None;
        };
        if !self.index.read().buckets.contains_key(&context) {
            return None;
        }
        let embedded = tokio::time::timeout_at(deadline.into(), self.embedder.embed(text)).await;
        let v = embedded
            .map_err(|_| tracing::warn!("embedding cut off by the request's deadline"))
            .ok()?
            .map_err(|e| tracing::warn!(error = %e, "embedding failed"))
            .ok()?;
        let best = self
            .index
            .read()
            .buckets
            .get(&context)?
            .iter()
            .map(|(k, other)| (*k, embed::cosine(&v, other)))
            .filter(|(_, sim)| *sim >= plan.threshold)
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        match self.entry(&best.0, plan.format, now).await {
            Ok(Some(entry)) => Some(Hit {
                entry,
                kind: HitKind::Semantic,
                similarity: best.1,
            }),
            _ => {
                self.forget(&[best.0]);
                None
            }
        }
    }

    /// Stores an answer (in the client's format) for a plan; one that is not a whole answer
    /// is not stored (`shape::whole`).
    pub async fn put(&self, plan: &Plan, answer: &Value, usage: (i64, i64), now: DateTime<Utc>) {
        if !shape::whole(plan.format, answer) {
            tracing::debug!("not a whole answer in the client's format: not cached");
            return;
        }
        let vector = match (&plan.keys.context, plan.keys.embed_text.as_deref()) {
            (Some(_), Some(text)) if self.cfg.semantic => self.embedder.embed(text).await.ok(),
            _ => None,
        };
        let stored = store::cache::NewEntry {
            key: plan.keys.exact,
            scope: plan.scope.clone(),
            model: plan.model.clone(),
            format: if plan.format == WireFormat::OpenAi {
                "openai"
            } else {
                "anthropic"
            },
            context_hash: plan.keys.context,
            vector: vector.as_deref().map(embed::to_bytes),
            answer: answer.to_string(),
            input_tokens: usage.0,
            output_tokens: usage.1,
            tags: plan.tags.clone(),
            created_at: now,
            expires_at: expiry(now, plan.ttl),
        };
        // Memory first, then the database: once the row is there, this replica finds it
        // (a row that then fails to land only costs a database read on a later lookup).
        let e = Arc::new(Entry {
            key: plan.keys.exact,
            answer: answer.clone(),
            input_tokens: usage.0,
            output_tokens: usage.1,
            expires_at: expiry(now, plan.ttl),
        });
        self.lru.lock().put(plan.keys.exact, e);
        self.present.write().insert(prefix(&plan.keys.exact));
        if let (Some(context), Some(v)) = (plan.keys.context, vector) {
            if !self.index.write().add(context, plan.keys.exact, v) {
                tracing::debug!("semantic index full: the entry is an exact match only");
            }
        }
        if !self.stored.push(stored).await {
            tracing::warn!("cache writer is gone; entry not stored");
        }
    }

    pub async fn record_hit(&self, key: &Key) {
        let counted = store::cache::count_hit(&self.writer, key.to_vec()).await;
        if let Err(e) = counted {
            tracing::debug!(error = %e, "cache hit count failed");
        }
    }

    fn forget(&self, keys: &[Key]) {
        let mut lru = self.lru.lock();
        for k in keys {
            lru.pop(k);
        }
        drop(lru);
        self.index.write().forget(keys);
    }

    /// Deletes every entry tagged `tag`, here and (through `cache_epoch`) on other replicas.
    pub async fn invalidate_tag(&self, tag: &str) -> Result<usize, StoreError> {
        let deleted: Vec<Key> = store::cache::delete_tag(&self.db, tag)
            .await?
            .iter()
            .filter_map(|k| as_key(k))
            .collect();
        self.forget(&deleted);
        Ok(deleted.len())
    }

    /// Deletes every entry tagged `tag` inside `tx` (an admin's, with its audit row). The
    /// entries stay in memory until `forget_deleted`, called once `tx` committed: rolled
    /// back, they are still in the database and still served.
    pub async fn delete_tag(tx: &mut store::Tx, tag: &str) -> Result<Deleted, StoreError> {
        Ok(Deleted(
            store::cache::delete_tag_in(tx, tag)
                .await?
                .iter()
                .filter_map(|k| as_key(k))
                .collect(),
        ))
    }

    /// Drops from memory the entries `delete_tag` deleted, after its transaction committed.
    pub fn forget_deleted(&self, deleted: Deleted) {
        self.forget(&deleted.0);
    }

    /// Waits until every entry stored before this call is in the database.
    pub async fn flush(&self) {
        self.stored.flush().await;
    }

    /// Rebuilds the in-memory indexes (keys present, semantic candidates) from the
    /// database.
    pub async fn rebuild(&self, now: DateTime<Utc>) -> Result<(), StoreError> {
        let (mut index, mut present) = (Index::default(), HashSet::new());
        let (mut after, mut seen) = (0, self.seen_rowid.load(Ordering::Relaxed));
        // A page at a time: the whole table's vectors at once were the rebuild's peak (s24
        // attack on the fixes, F2).
        loop {
            let rows = store::cache::index_rows(&self.db, after, now, INDEX_PAGE).await?;
            let full = rows.len() as i64 == INDEX_PAGE;
            after = rows.last().map_or(after, |r| r.0);
            seen = seen.max(self.add_rows(rows, &mut index, &mut present));
            if !full {
                break;
            }
        }
        *self.index.write() = index;
        *self.present.write() = present;
        self.seen_rowid.store(seen, Ordering::Relaxed);
        Ok(())
    }

    /// Adds rows to the indexes; returns the highest rowid among them (or the one seen).
    fn add_rows(
        &self,
        rows: Vec<store::cache::IndexRow>,
        index: &mut Index,
        present: &mut HashSet<u64>,
    ) -> i64 {
        let mut seen = self.seen_rowid.load(Ordering::Relaxed);
        // Rows come oldest first: the newest MAX_PER_CONTEXT of a context stay.
        for (rowid, k, c, v) in rows {
            seen = seen.max(rowid);
            let Some(k) = as_key(&k) else { continue };
            present.insert(prefix(&k));
            if let (Some(c), Some(v)) = (c.as_deref().and_then(as_key), v) {
                let v = embed::from_bytes(&v);
                // A lexical vector stored by an older version had no bound.
                let v = match self.embedder {
                    Embedder::Lexical => embed::bounded(v),
                    Embedder::Http { .. } => v,
                };
                index.add(c, k, v);
            }
        }
        seen
    }

    /// Polls `cache_epoch`: when another process invalidated entries, drops the LRU and
    /// rebuilds the indexes; otherwise adds the entries stored since the last poll (by
    /// this replica or another).
    pub async fn refresh(&self, now: DateTime<Utc>) -> Result<(), StoreError> {
        let epoch = store::cache::epoch(&self.db).await?;
        if self.epoch.swap(epoch, Ordering::Relaxed) != epoch {
            self.lru.lock().clear();
            return self.rebuild(now).await;
        }
        // Most new rows are this replica's own, already in memory: read vectors back only
        // when another replica stored something.
        let after = self.seen_rowid.load(Ordering::Relaxed);
        let keys = store::cache::keys_after(&self.db, after, now).await?;
        let Some(last) = keys.last().map(|(rowid, _)| *rowid) else {
            return Ok(());
        };
        let foreign = {
            let present = self.present.read();
            keys.iter()
                .any(|(_, k)| as_key(k).is_some_and(|k| !present.contains(&prefix(&k))))
        };
        // A key stored again (`x-sluice-cache: refresh`, here or on another replica) has a
        // new answer: the one held in memory gives way, read again from the database at
        // its next use — it was served until its expiry (s24 attack, cache #6).
        {
            let mut lru = self.lru.lock();
            for k in keys.iter().filter_map(|(_, k)| as_key(k)) {
                lru.pop(&k);
            }
        }
        let mut from = after;
        while foreign && from < last {
            let rows = store::cache::index_rows(&self.db, from, now, INDEX_PAGE).await?;
            let Some(next) = rows.last().map(|r| r.0) else {
                break;
            };
            from = next;
            let (mut index, mut present) = (self.index.write(), self.present.write());
            self.add_rows(rows, &mut index, &mut present);
        }
        self.seen_rowid.fetch_max(last, Ordering::Relaxed);
        Ok(())
    }

    pub async fn evict(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let n = store::cache::evict(&self.db, self.cfg.max_entries, now).await?;
        if n > 0 {
            self.rebuild(now).await?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_keeps_its_newest_candidates_only() {
        let mut index = Index::default();
        let context = [7u8; 32];
        let key = |i: usize| {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            k
        };
        for i in 0..MAX_PER_CONTEXT + 10 {
            index.add(context, key(i), vec![(1, 1.0)]);
        }
        // The same entry again replaces itself rather than growing the bucket.
        index.add(context, key(MAX_PER_CONTEXT + 9), vec![(2, 1.0)]);
        assert_eq!(index.features, MAX_PER_CONTEXT);
        let bucket = &index.buckets[&context];
        assert_eq!(bucket.len(), MAX_PER_CONTEXT);
        assert_eq!(bucket[0].0, key(10), "the oldest ten were dropped");
        assert_eq!(bucket.last().unwrap().1, vec![(2, 1.0)]);
        assert_eq!(
            bucket
                .iter()
                .filter(|(k, _)| *k == key(MAX_PER_CONTEXT + 9))
                .count(),
            1
        );
    }

    /// The entries in memory hold at most `LRU_BYTES`: the least recently used go first, an
    /// entry larger than the whole budget is not kept, and a replaced entry gives its bytes
    /// back.
    #[test]
    fn the_entries_in_memory_keep_to_their_byte_budget() {
        let cap = NonZeroUsize::new(LRU_ENTRIES).unwrap();
        let mut lru = Lru {
            entries: LruCache::new(cap),
            bytes: 0,
        };
        // An entry holding about `bytes`: an answer of one string that long.
        let entry = |i: u8, bytes: usize| {
            let text = "x".repeat(bytes.saturating_sub(std::mem::size_of::<Entry>()));
            Arc::new(Entry {
                key: [i; 32],
                answer: Value::String(text),
                input_tokens: 0,
                output_tokens: 0,
                expires_at: Utc::now(),
            })
        };
        let third = LRU_BYTES / 3;
        for i in 1..=3 {
            lru.put([i; 32], entry(i, third));
        }
        assert!(lru.get(&[1; 32]).is_some(), "three thirds fit");
        lru.put([4; 32], entry(4, third));
        assert!(lru.get(&[2; 32]).is_none(), "the least recently used went");
        assert!(lru.get(&[1; 32]).is_some() && lru.get(&[4; 32]).is_some());
        assert!(lru.bytes <= LRU_BYTES);
        let small = entry(4, 1000);
        lru.put([4; 32], small.clone());
        assert_eq!(
            lru.bytes,
            2 * third + held(&small),
            "a replaced entry gives its bytes back"
        );
        lru.put([5; 32], entry(5, LRU_BYTES + 1));
        assert!(
            lru.get(&[5; 32]).is_none(),
            "larger than the budget: not kept"
        );
        lru.pop(&[1; 32]);
        lru.pop(&[3; 32]);
        lru.pop(&[4; 32]);
        assert_eq!(lru.bytes, 0);
    }

    /// An answer is counted as the memory it holds parsed, not its text: 100 000 zeros are
    /// 200 kB of text and 3.2 MB of `Value`s (s24 review F6: 64 MiB of such text held
    /// over 1 GiB).
    #[test]
    fn an_entry_counts_its_parsed_answer_not_its_text() {
        let text = format!("[{}0]", "0,".repeat(99_999));
        let answer: Value = serde_json::from_str(&text).unwrap();
        let e = Entry {
            key: [0; 32],
            answer,
            input_tokens: 0,
            output_tokens: 0,
            expires_at: Utc::now(),
        };
        assert!(held(&e) >= 100_000 * std::mem::size_of::<Value>());
        let object: Value = serde_json::json!({"choices": [{"message": {"content": "hi"}}]});
        assert!(parsed(&object) > 3 * std::mem::size_of::<Value>());
    }

    /// The index holds at most `MAX_INDEX_FEATURES` features: past it a candidate is not
    /// added (its entry stays an exact match), and forgetting entries frees the room.
    #[test]
    fn the_index_keeps_to_its_feature_budget() {
        let mut index = Index::default();
        let key = |i: u8| [i; 32];
        let big = |w: f32| vec![(1, w); MAX_INDEX_FEATURES / 2];
        assert!(index.add(key(1), key(1), big(1.0)));
        assert!(index.add(key(2), key(2), big(1.0)));
        assert!(
            !index.add(key(3), key(3), vec![(1, 1.0)]),
            "past the budget"
        );
        assert!(!index.buckets.contains_key(&key(3)));
        // The same entry replaced frees its own room first.
        assert!(index.add(key(2), key(2), big(0.5)));
        assert_eq!(index.features, MAX_INDEX_FEATURES);
        index.forget(&[key(1)]);
        assert_eq!(index.features, MAX_INDEX_FEATURES / 2);
        assert!(index.add(key(3), key(3), vec![(1, 1.0)]));
    }
}

//! Stage 4, the response cache (layer 1). Exact match on the canonical request's key
//! (`key.rs`), then — when the last user message differs — a semantic match among the
//! entries sharing the same context, whose last user message agrees with this one
//! (`meaning.rs`: numbers, dates, identifiers, negations, units, names, code and order are
//! significant): cosine similarity of its embedding (`embed.rs`) ≥ the threshold. Entries live in SQLite (shared by replicas)
//! with an LRU in front; the semantic index is held in memory per context and rebuilt at
//! start and whenever another process invalidates entries (`cache_epoch`); what this
//! process deletes it forgets by key. A hit costs
//! nothing; streams are replayed from whole answers (`replay.rs`).

pub mod embed;
pub mod headers;
pub mod key;
#[cfg(test)]
mod lifecycle_test;
pub mod meaning;
mod memory;
pub mod replay;
pub mod shape;
pub mod thread;
mod words;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use chrono::{DateTime, Duration, Utc};
use parking_lot::{Mutex, RwLock};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::{CacheSettings, UpstreamTimeouts};
use crate::error::{ApiError, WireFormat};
use crate::ops::metrics;
use crate::store::lingering::Lingering;
use crate::store::writer::Writer;
use crate::store::{self, StoreError};
use crate::upstream::url_guard::SystemResolver;
use embed::Embedder;
use headers::expiry;
pub use headers::{invalidation_tag, Asked, MAX_TAGS, MAX_TAG_LEN, MAX_TTL_SECONDS};
use key::{Key, Question};
use memory::{Index, Lru};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitKind {
    Exact,
    Semantic,
}

pub struct Entry {
    pub key: Key,
    /// The answer as JSON text (`Value::to_string`'s): kept as text, not as a parsed tree,
    /// which held more, in an allocation per string, array and member (and was cloned at
    /// every store); a whole answer is served as is, a replay parses it.
    pub answer: Bytes,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Which store of its key this is (`store::cache::NewEntry::version`): a refresh keeps
    /// the entry when the key's new row is this very one.
    pub version: i64,
    pub expires_at: DateTime<Utc>,
}

/// The members of a stored OpenAI answer its replay reads (`replay::frames`); an
/// Anthropic replay's `message_start` carries every member of the message.
const REPLAYED_OPENAI: [&str; 5] = ["id", "created", "model", "choices", "usage"];

/// Most stores waiting to be made (`Cache::store`): each holds its answer meanwhile.
const STORES_BEHIND: usize = 1024;

/// A store counted among those behind until it is dropped — with the task that holds it
/// last, however that task ends (a panic, a worker's runtime stopped).
struct Behind(Arc<Cache>);

impl Behind {
    /// A place among the stores behind, or `None` (counted as dropped) past
    /// `STORES_BEHIND`.
    fn take(cache: Arc<Cache>) -> Option<Behind> {
        if cache.behind.fetch_add(1, Ordering::Relaxed) >= STORES_BEHIND {
            cache.behind.fetch_sub(1, Ordering::Relaxed);
            tracing::debug!("cache stores are behind; answer not stored");
            metrics::cache_store_dropped("behind");
            return None;
        }
        Some(Behind(cache))
    }
}

impl Drop for Behind {
    fn drop(&mut self) {
        self.0.behind.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether an answer may be stored: a whole answer in the client's format.
fn storable(plan: &Plan, answer: &Value) -> bool {
    debug_assert!(
        plan.question.get().is_some(),
        "a store before its question is read"
    );
    let whole = shape::whole(plan.format, answer);
    if !whole {
        tracing::debug!("not a whole answer in the client's format: not cached");
    }
    whole
}

/// An answer's text for its table row and for memory. `to_string`'s buffer grows by
/// doubling and `Bytes::from` keeps all of it: memory gets a copy of its own size, or the
/// LRU's bound, which counts the text (`memory::held`), held up to twice itself (s38 attack
/// F1). The row's copy lives until its batch is written.
fn texts(answer: &Value) -> (String, Bytes) {
    let row = answer.to_string();
    let held = Bytes::copy_from_slice(row.as_bytes());
    (row, held)
}

impl Entry {
    /// The members of the answer a replay as SSE in `format` reads (`replay::frames`),
    /// parsed; the others are passed over unparsed — an OpenAI answer's top-level member
    /// no replay reads, parsed at every streamed hit, could hold 16 times its text (s38 stop
    /// attack F1); members nested in those read are parsed whole. An Anthropic replay's
    /// `message_start` carries the whole message: every member is read (s39 final attack
    /// F1: it had gone out without `type` and `role`). `None` for text nested deeper than
    /// `serde_json` parses (a tool call's arguments streamed to a client of the other
    /// format, parsed a few levels below the answer's own): such an entry answers whole
    /// requests only.
    pub fn replayed(&self, format: WireFormat) -> Option<Value> {
        if format == WireFormat::Anthropic {
            return serde_json::from_slice(&self.answer).ok();
        }
        let members: HashMap<String, &RawValue> = serde_json::from_slice(&self.answer).ok()?;
        let mut replayed = serde_json::Map::new();
        for name in REPLAYED_OPENAI {
            if let Some(raw) = members.get(name) {
                replayed.insert(name.into(), serde_json::from_str(raw.get()).ok()?);
            }
        }
        Some(Value::Object(replayed))
    }
}

pub struct Hit {
    pub entry: Arc<Entry>,
    pub kind: HitKind,
    pub similarity: f32,
}

/// What one request does with the cache.
#[derive(Clone)]
pub struct Plan {
    pub exact: Key,
    /// The request's last question, read when first needed (`Cache::read_question`): an
    /// exact hit held in memory never needs it. Shared by the plan's clones.
    question: Arc<OnceLock<Option<Question>>>,
    /// The scope as keyed: with the request headers that change an answer.
    key_scope: String,
    /// The model's `ignore_identifiers`, for the reading of the question.
    ignore_identifiers: Option<bool>,
    pub scope: String,
    pub model: String,
    pub format: WireFormat,
    /// `x-sluice-cache: refresh`: skip the lookup, store the new answer.
    pub refresh: bool,
    pub ttl: Duration,
    pub tags: String,
    pub threshold: f32,
    /// The cache epoch when the request was planned: its answer is not kept once an
    /// invalidation moved it (`keep_answer`, `store::cache::NewEntry::epoch`).
    epoch: i64,
}

pub struct Cache {
    cfg: CacheSettings,
    embedder: Embedder,
    db: store::Db,
    /// New entries, written in lingering batches through the group-commit writer.
    stored: Lingering<store::cache::NewEntry>,
    /// Hits to count, in lingering batches too.
    hits: Lingering<Key>,
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
    /// Stores waiting to be made (`STORES_BEHIND`).
    behind: AtomicUsize,
    /// `meta.cache_epoch` as this process last read (`refresh`) or moved it
    /// (`forget_deleted`); `UNREAD_EPOCH` before the first refresh.
    epoch: AtomicI64,
    /// A rebuild at the next refresh, after an invalidation here: moving the epoch itself,
    /// this replica's refresh no longer saw it move, and keys with no row stayed in memory —
    /// a row queued at the invalidation, which the table then refused, and the keys another
    /// replica's invalidation deleted, whose epoch this one's jumped over (s47 stop attack
    /// F1).
    rebuild_due: AtomicBool,
}

/// The epoch before the first `refresh` (at start, before the gateway serves).
const UNREAD_EPOCH: i64 = i64::MIN;

fn prefix(key: &Key) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_le_bytes(b)
}

/// How often each replica rebuilds its indexes from the table (`Cache::rebuild`), as a
/// backstop: its own deletions it forgets at once, other replicas' at its lookups.
pub const REBUILD_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// Adds rows to the indexes; returns the highest rowid among them (0 for none).
fn add_rows(
    embedder: &Embedder,
    rows: Vec<store::cache::IndexRow>,
    index: &mut Index,
    present: &mut HashSet<u64>,
) -> i64 {
    let mut seen = 0;
    // Rows come oldest first: the newest `memory::MAX_PER_CONTEXT` of a context stay.
    for (rowid, k, c, v) in rows {
        seen = seen.max(rowid);
        let Some(k) = as_key(&k) else { continue };
        present.insert(prefix(&k));
        // An `http` vector past `MAX_DIMENSIONS` (stored before the bound) is not read.
        let v = v.filter(|v| {
            matches!(embedder, Embedder::Lexical) || v.len() <= embed::MAX_DIMENSIONS * 8
        });
        if let (Some(c), Some(v)) = (c.as_deref().and_then(as_key), v) {
            let v = embed::from_bytes(&v);
            // A lexical vector stored by an older version had no bound.
            let v = match embedder {
                Embedder::Lexical => embed::bounded(v),
                Embedder::Http { .. } => v,
            };
            index.add(c, k, v);
        }
    }
    seen
}

/// Rows the semantic index reads back per query.
const INDEX_PAGE: i64 = 1_000;

/// The entries a `Cache::delete_tag` deleted, and the epoch it moved to, to forget once
/// its transaction commits.
pub struct Deleted {
    keys: Vec<Key>,
    epoch: i64,
}

impl Deleted {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn as_key(v: &[u8]) -> Option<Key> {
    v.try_into().ok()
}

impl Plan {
    /// The last question, once read (`Cache::read_question`); `None` too when the request
    /// has none the semantic match reads.
    pub fn question(&self) -> Option<&Question> {
        self.question.get().and_then(Option::as_ref)
    }
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
        Ok(Arc::new(Self {
            cfg: cfg.clone(),
            embedder,
            db,
            stored: Lingering::start(writer.clone(), "cache entries", store::cache::PUT_BATCH),
            hits: Lingering::start(writer, "cache hits", store::cache::HIT_BATCH),
            lru: Mutex::new(Lru::new()),
            index: RwLock::new(Index::default()),
            present: RwLock::new(HashSet::new()),
            seen_rowid: AtomicI64::new(0),
            behind: AtomicUsize::new(0),
            epoch: AtomicI64::new(UNREAD_EPOCH),
            rebuild_due: AtomicBool::new(false),
        }))
    }

    /// Decides whether and how a request uses the cache (`None`: not cacheable).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        asked: &Asked<'_>,
        body: &serde_json::Map<String, Value>,
        format: WireFormat,
        model: &str,
        owner: (i64, i64),
        token_ttl: Option<i64>,
        model_threshold: Option<f64>,
        model_ignore_identifiers: Option<bool>,
    ) -> Result<Option<Plan>, ApiError> {
        let deterministic = body.get("temperature").and_then(Value::as_f64) == Some(0.0);
        let wanted = match (self.cfg.mode.as_str(), asked.mode) {
            ("off", _) | (_, Some("off")) => false,
            (_, Some("on" | "refresh")) => true,
            // Content named by its address is keyed by the address: the answer about
            // what it held is served after it changed, unless the client asks for that
            // (s31 cache attack F5).
            _ if body.get("messages").is_some_and(key::names_remote_content) => false,
            ("all", _) => true,
            _ => deterministic,
        };
        if !wanted || body.get("n").and_then(Value::as_i64).unwrap_or(1) > 1 {
            return Ok(None);
        }
        let ttl = match asked.ttl {
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
        let key_scope = match asked.beta() {
            Some(beta) => format!("{scope}\u{1f}anthropic-beta={beta}"),
            None => scope.clone(),
        };
        let plan = Plan {
            exact: key::exact(&key_scope, model, format, body),
            question: Arc::new(OnceLock::new()),
            key_scope,
            ignore_identifiers: model_ignore_identifiers,
            scope,
            model: model.to_string(),
            format,
            refresh: asked.mode == Some("refresh"),
            ttl: Duration::seconds(ttl),
            tags: format!(",{},", asked.tags.join(",")),
            threshold: model_threshold.unwrap_or(self.cfg.similarity_threshold) as f32,
            epoch: self.epoch.load(Ordering::Acquire),
        };
        Ok(Some(plan))
    }

    /// Reads the last question of `body` — the request `plan` was made for — for the
    /// semantic match, once: before a lookup past the memory (`get`), and before the answer
    /// is stored (`put` stores the entry under its context only once it is read).
    pub fn read_question(&self, plan: &Plan, body: &serde_json::Map<String, Value>) {
        plan.question.get_or_init(|| {
            key::question(
                &plan.key_scope,
                &plan.model,
                plan.format,
                body,
                self.reading(plan.ignore_identifiers),
            )
        });
    }

    /// The exact hit held in memory, if any: all an exact repeat needs, before its question
    /// is read.
    pub fn held(&self, plan: &Plan, now: DateTime<Utc>) -> Option<Hit> {
        let entry = self.lru.lock().get(&plan.exact)?;
        (entry.expires_at > now).then_some(Hit {
            entry,
            kind: HitKind::Exact,
            similarity: 1.0,
        })
    }

    /// How questions are read for the semantic match: strictly with the lexical embedder,
    /// identifiers significant unless the model or the config opts out.
    fn reading(&self, model_ignore_identifiers: Option<bool>) -> meaning::Reading<'_> {
        let (strict, model) = match &self.embedder {
            Embedder::Lexical => (true, ""),
            Embedder::Http { model, .. } => (false, model.as_str()),
        };
        meaning::Reading {
            semantic: self.cfg.semantic,
            strict,
            ignore_identifiers: model_ignore_identifiers.unwrap_or(self.cfg.ignore_identifiers),
            model,
        }
    }

    /// The live entry of `key`, answered in `format`. One read back that is not a whole
    /// answer (stored by an older version, or by hand) is a miss.
    async fn entry(
        &self,
        key: &Key,
        context: Option<&Key>,
        format: WireFormat,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<Entry>>, StoreError> {
        let (cached, changes) = {
            let mut lru = self.lru.lock();
            (lru.get(key), lru.changes(key))
        };
        if let Some(e) = cached.filter(|e| e.expires_at > now) {
            return Ok(Some(e));
        }
        if !self.present.read().contains(&prefix(key)) {
            return Ok(None);
        }
        let read = self.read(key, context, format, now).await?;
        if let Some(entry) = &read {
            self.keep(entry, changes);
        }
        Ok(read)
    }

    /// The live row of `key`, as an entry.
    async fn read(
        &self,
        key: &Key,
        context: Option<&Key>,
        format: WireFormat,
        now: DateTime<Utc>,
    ) -> Result<Option<Arc<Entry>>, StoreError> {
        let Some(row) = store::cache::get(&self.db, key, now).await? else {
            // Gone (another replica evicted or invalidated it) or expired: forgotten here
            // too, or its key and vector stayed in memory until the next rebuild (s28 late
            // attack F1).
            self.forget_one(key, context);
            return Ok(None);
        };
        // Held as written again from what was checked: a row holding a member twice (by
        // hand, by another program) is judged on the last, as parsing keeps it, and its text
        // would have served the first (s38 stop attack F2).
        let answer = match serde_json::from_str::<Value>(&row.answer) {
            Ok(a) if shape::whole(format, &a) => texts(&a).1,
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(Entry {
            key: *key,
            answer,
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            version: row.version,
            expires_at: DateTime::parse_from_rfc3339(&row.expires_at)
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or(now),
        })))
    }

    /// Keeps in memory an entry read from the table when its key's shard of memory did not
    /// change since `changes` (`memory::Lru::changes`, taken before the read): a refresh
    /// that dropped its key meanwhile (stored again elsewhere), an eviction or an
    /// invalidation would have been undone by the older row read, served then until the
    /// next rebuild (s39 attack F3), and a store of its key here meanwhile replaced by it
    /// (H6). A change of any key of the shard counts: such a read is served once and read
    /// again at its next use.
    fn keep(&self, entry: &Arc<Entry>, changes: u64) {
        let bytes = memory::held(entry);
        let mut lru = self.lru.lock();
        if lru.changes(&entry.key) == changes {
            lru.put(entry.key, entry.clone(), bytes);
        }
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
        // Unread, the semantic side would be skipped and a row found gone forgotten from
        // the semantic index under no context (s40 attack F2).
        debug_assert!(
            plan.question.get().is_some(),
            "a lookup before its question is read"
        );
        let question = plan.question();
        let context = question.map(|q| &q.context);
        match self.entry(&plan.exact, context, plan.format, now).await {
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
        let (context, text) = (question?.context, question?.embed_text.as_str());
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
        match self.entry(&best.0, Some(&context), plan.format, now).await {
            Ok(Some(entry)) => Some(Hit {
                entry,
                kind: HitKind::Semantic,
                similarity: best.1,
            }),
            _ => {
                self.forget_one(&best.0, Some(&context));
                None
            }
        }
    }

    /// Stores an answer off the request's path. Its embedding is made on the caller's
    /// runtime (an `http` embedder's connections stay with the workers that also embed
    /// lookups); what the cache keeps of it is made on the cache's own thread (`thread`):
    /// made on the worker, entries lay among the buffers of the requests that made them.
    /// What the worker made (the plan, the answer, the vector, of which the cache's thread
    /// keeps a copy) goes back to the worker to be freed: freed on the cache's thread,
    /// glibc's per-thread cache of small chunks (tcache, 7 of each size) handed those
    /// chunks to that thread's next entries: 786 of 1 000 entries' LRU nodes and 573 of their
    /// vectors lay in the worker's arena again. At most `STORES_BEHIND` stores wait for the
    /// cache's thread; one more is not stored — a store is best-effort, and one thread takes
    /// them. One waiting for its embedding holds no place: an `http` embedder that hangs (up
    /// to its 5 s) filled them in seconds, and every store after was dropped, exact entries
    /// too (s47 stop attack F4); those tasks are as many as the misses of those 5 s.
    pub fn store(
        self: &Arc<Self>,
        plan: Plan,
        answer: Value,
        usage: (i64, i64),
        now: DateTime<Utc>,
    ) {
        if !storable(&plan, &answer) {
            return;
        }
        let cache = self.clone();
        tokio::spawn(async move {
            let vector = cache.embedding(&plan).await;
            let Some(counted) = Behind::take(cache) else {
                return;
            };
            let (back, made_here) = tokio::sync::oneshot::channel();
            thread::spawn(async move {
                let kept = vector.clone();
                counted
                    .0
                    .keep_answer(&plan, &answer, kept, usage, now)
                    .await;
                let _ = back.send((plan, answer, vector));
            });
            // Sent back, or dropped with the cache's task (a panic).
            drop(made_here.await);
        });
    }

    /// Stores an answer (in the client's format) for a plan, in place; one that is not a
    /// whole answer is not stored (`shape::whole`).
    pub async fn put(&self, plan: &Plan, answer: &Value, usage: (i64, i64), now: DateTime<Utc>) {
        if storable(plan, answer) {
            let vector = self.embedding(plan).await;
            self.keep_answer(plan, answer, vector, usage, now).await;
        }
    }

    /// The vector of the plan's question, for the semantic index.
    async fn embedding(&self, plan: &Plan) -> Option<embed::Vector> {
        match plan.question() {
            Some(q) if self.cfg.semantic => self.embedder.embed(&q.embed_text).await.ok(),
            _ => None,
        }
    }

    /// Keeps an answer in memory, then queues its row.
    async fn keep_answer(
        &self,
        plan: &Plan,
        answer: &Value,
        vector: Option<embed::Vector>,
        usage: (i64, i64),
        now: DateTime<Utc>,
    ) {
        let question = plan.question();
        let (text, held) = texts(answer);
        let version = rand::random::<i64>() | 1;
        let stored = store::cache::NewEntry {
            key: plan.exact,
            scope: plan.scope.clone(),
            model: plan.model.clone(),
            format: if plan.format == WireFormat::OpenAi {
                "openai"
            } else {
                "anthropic"
            },
            context_hash: question.map(|q| q.context),
            vector: vector.as_deref().map(embed::to_bytes),
            answer: text,
            input_tokens: usage.0,
            output_tokens: usage.1,
            tags: plan.tags.clone(),
            created_at: now,
            expires_at: expiry(now, plan.ttl),
            version,
            epoch: (plan.epoch != UNREAD_EPOCH).then_some(plan.epoch),
        };
        // Memory first, then the database: once the row is there, this replica finds it.
        // A row that then fails to land (a batch the writer gives up, a NUL PostgreSQL
        // refuses) is this replica's alone, served from memory until it leaves the LRU or
        // the next rebuild, while the table keeps what it had (s39 attack F4).
        let e = Arc::new(Entry {
            key: plan.exact,
            answer: held,
            input_tokens: usage.0,
            output_tokens: usage.1,
            version,
            expires_at: expiry(now, plan.ttl),
        });
        let bytes = memory::held(&e);
        {
            // Planned before an invalidation this replica knows of: not kept. Looked at under
            // the LRU's lock, which an invalidation takes after moving the epoch: either this
            // sees the epoch moved, or the invalidation's clear finds the entry. Put first,
            // the answer was served until a later look, and replaced a newer store of its key
            // (s47 attack F2, stop attack F2).
            let mut lru = self.lru.lock();
            if self.planned_before_an_invalidation(plan) {
                return;
            }
            lru.put(plan.exact, e, bytes);
        }
        self.present.write().insert(prefix(&plan.exact));
        if let (Some(q), Some(v)) = (question, vector) {
            if !self.index.write().add(q.context, plan.exact, v) {
                tracing::debug!("semantic index full: the entry is an exact match only");
            }
        }
        // Looked at again once its key and vector are in memory too: an invalidation since
        // the put cleared the entry, and its row would be refused.
        if self.planned_before_an_invalidation(plan) {
            self.forget_one(&plan.exact, question.map(|q| &q.context));
            return;
        }
        if !self.stored.push(stored).await {
            tracing::warn!("cache writer is gone; entry not stored");
        }
    }

    /// Whether this replica learned of an invalidation since `plan` was made: its answer may
    /// come from what was invalidated (counted as dropped).
    fn planned_before_an_invalidation(&self, plan: &Plan) -> bool {
        let moved = self.epoch.load(Ordering::Acquire) != plan.epoch;
        if moved {
            metrics::cache_store_dropped("invalidated");
        }
        moved
    }

    /// Counts a hit of `key`, in the next batch of counts: queued at once or not at all
    /// (10 000 behind, or the writer gone) — a count is statistics, and a hit must not wait
    /// on the database (s39 attack H1).
    pub fn record_hit(&self, key: &Key) {
        if !self.hits.offer(*key) {
            tracing::debug!("cache hit counts are behind; hit not counted");
        }
    }

    /// Drops deleted entries from memory: the LRU, the keys present and the semantic index.
    /// A key stored again meanwhile (its new row not yet read) is back at the next
    /// `refresh`, which reads a row whose key is not present as another replica's.
    /// Drops one entry from memory, looking for its candidate in `context`'s bucket only:
    /// an entry is indexed under the context of the request that stored it, which is the
    /// context of every request its key matches. (One stored under another context — an
    /// embedder changed between replicas — is dropped by the periodic rebuild.)
    fn forget_one(&self, key: &Key, context: Option<&Key>) {
        self.lru.lock().pop(key);
        self.present.write().remove(&prefix(key));
        if let Some(context) = context {
            self.index.write().forget_in(context, key);
        }
    }

    fn forget(&self, keys: &[Key]) {
        if keys.is_empty() {
            return;
        }
        let mut lru = self.lru.lock();
        for k in keys {
            lru.pop(k);
        }
        drop(lru);
        {
            let mut present = self.present.write();
            for k in keys {
                present.remove(&prefix(k));
            }
        }
        let keys: HashSet<Key> = keys.iter().copied().collect();
        self.index.write().forget(&keys);
    }

    /// Deletes every entry tagged `tag`, here and (through `cache_epoch`) on other replicas.
    pub async fn invalidate_tag(&self, tag: &str) -> Result<usize, StoreError> {
        let mut tx = self.db.begin().await?;
        let deleted = Self::delete_tag(&mut tx, tag).await?;
        tx.commit().await?;
        let n = deleted.len();
        self.forget_deleted(deleted);
        Ok(n)
    }

    /// Deletes every entry tagged `tag` inside `tx` (an admin's, with its audit row). The
    /// entries stay in memory until `forget_deleted`, called once `tx` committed: rolled
    /// back, they are still in the database and still served.
    pub async fn delete_tag(tx: &mut store::Tx, tag: &str) -> Result<Deleted, StoreError> {
        let keys = store::cache::delete_tag_in(tx, tag)
            .await?
            .iter()
            .filter_map(|k| as_key(k))
            .collect();
        let epoch = store::cache::epoch_in(tx).await?;
        Ok(Deleted { keys, epoch })
    }

    /// Drops from memory, after `delete_tag`'s transaction committed, the entries it
    /// deleted — and every entry held: an answer planned before the invalidation may be
    /// held whose row the table refuses (`store::cache::NewEntry::epoch`). The table's
    /// entries are read again at their next use.
    pub fn forget_deleted(&self, deleted: Deleted) {
        // The epoch first, then the memory (`keep_answer` looks in the other order). The
        // highest: a refresh may have read a later one meanwhile.
        self.epoch.fetch_max(deleted.epoch, Ordering::AcqRel);
        self.rebuild_due.store(true, Ordering::Release);
        let held = self.lru.lock().clear();
        drop(held); // after the lock
        self.forget(&deleted.keys);
    }

    /// Waits until every entry stored before this call is in the database.
    pub async fn flush(&self) {
        self.stored.flush().await;
        self.hits.flush().await;
    }

    /// Rebuilds the in-memory indexes (keys present, semantic candidates) from the
    /// database.
    ///
    /// Besides at start and after another process's invalidation, every
    /// `REBUILD_EVERY` (housekeeping): what other replicas evicted is forgotten by each
    /// one's own lookups only when they look, and a row `refresh` passed over — on
    /// PostgreSQL a batch committed after a later id's — is read (s28 late attack F1, F2;
    /// SQLite's ids never come back, migration 0029). The high-water mark is the highest
    /// row read, so a table restored or copied with lower ids is followed again.
    pub async fn rebuild(&self, now: DateTime<Utc>) -> Result<(), StoreError> {
        // An answer held in memory whose row was replaced unseen (a refresh passing over
        // its new id) is read again at its next use (s28 final attack #3).
        let held = self.lru.lock().clear();
        drop(held); // after the lock
        let (mut index, mut present) = (Index::default(), HashSet::new());
        let (mut after, mut seen) = (0, 0);
        // A page at a time: the whole table's vectors at once were the rebuild's peak (s24
        // attack on the fixes, F2).
        loop {
            let rows = store::cache::index_rows(&self.db, after, now, INDEX_PAGE).await?;
            let full = rows.len() as i64 == INDEX_PAGE;
            after = rows.last().map_or(after, |r| r.0);
            seen = seen.max(add_rows(&self.embedder, rows, &mut index, &mut present));
            if !full {
                break;
            }
        }
        *self.index.write() = index;
        *self.present.write() = present;
        self.seen_rowid.store(seen, Ordering::Relaxed);
        Ok(())
    }

    /// Polls `cache_epoch`: when another process invalidated entries, drops the LRU and
    /// rebuilds the indexes; otherwise adds the entries stored since the last poll (by
    /// this replica or another).
    pub async fn refresh(&self, now: DateTime<Utc>) -> Result<(), StoreError> {
        let known = self.epoch.load(Ordering::Acquire);
        let read = store::cache::epoch(&self.db).await?;
        self.refresh_from(known, read, now).await
    }

    /// `refresh` once the table's epoch was read (`read`; this replica knew `known` before
    /// the read).
    async fn refresh_from(
        &self,
        known: i64,
        read: i64,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let due = self.rebuild_due.swap(false, Ordering::AcqRel);
        if read != known {
            // Only from an epoch before the one read: one moved meanwhile past it (this
            // replica's invalidation, `forget_deleted`, or another refresh — on PostgreSQL a
            // notification's runs beside the poll) stays. Set back to what was read, a store
            // planned before that invalidation passed `keep_answer` (s47 attack F1); left at
            // one before it, a store planned under that one was held though the table
            // refused it, until the next refresh (stop attack F3). (From `known` down to a
            // lower one read: a table restored from an older copy.)
            let mut from = known;
            loop {
                match self
                    .epoch
                    .compare_exchange(from, read, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return self.rebuild(now).await,
                    Err(now_at) if now_at < read => from = now_at,
                    Err(_) => break,
                }
            }
        }
        if due {
            return self.rebuild(now).await;
        }
        // Most new rows are this replica's own, already in memory: read vectors back only
        // when another replica stored something.
        let after = self.seen_rowid.load(Ordering::Relaxed);
        let keys = store::cache::keys_after(&self.db, after, now).await?;
        let Some(last) = keys.last().map(|r| r.id) else {
            return Ok(());
        };
        let keys: Vec<(Key, i64)> = keys
            .iter()
            .filter_map(|r| Some((as_key(&r.key)?, r.version)))
            .collect();
        let foreign = {
            let present = self.present.read();
            keys.iter().any(|(k, _)| !present.contains(&prefix(k)))
        };
        // A key stored again (`x-sluice-cache: refresh`, here or on another replica) has a
        // new answer: the one held in memory gives way, read again from the database at
        // its next use — it was served until its expiry (s24 attack, cache #6). The very
        // version held stays: most new rows are this replica's own, and popping them cost
        // each a table read at its next use (s38 lead).
        {
            let mut lru = self.lru.lock();
            for (k, version) in &keys {
                // 0: a row stored by a version of Sluice before versions (or by hand).
                let held = *version != 0 && lru.peek(k).is_some_and(|e| e.version == *version);
                if !held {
                    lru.pop(k);
                }
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
            add_rows(&self.embedder, rows, &mut index, &mut present);
        }
        self.seen_rowid.fetch_max(last, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes expired entries and those past `max_entries`, and forgets them here: the
    /// eviction every minute read the whole table's vectors back (a rebuild) whenever one
    /// row had expired (s27 cache F6). Other replicas forget them as their lookups find the
    /// rows gone, and at their periodic rebuild (`REBUILD_EVERY`).
    pub async fn evict(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let keys = |deleted: Vec<Vec<u8>>| -> Vec<Key> {
            deleted.iter().filter_map(|k| as_key(k)).collect()
        };
        // Each step forgets what it deleted before the next may fail.
        let expired = keys(store::cache::evict_expired(&self.db, now).await?);
        self.forget(&expired);
        let over = keys(store::cache::evict_over_cap(&self.db, self.cfg.max_entries, now).await?);
        self.forget(&over);
        Ok((expired.len() + over.len()) as u64)
    }
}

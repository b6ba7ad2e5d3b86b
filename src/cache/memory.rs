//! What the cache holds in memory, each within a budget: the entries in front of the table
//! (`Lru`, bounded in count and in the memory their answers hold) and the semantic
//! candidates per context (`Index`, bounded per context and in vector features).

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

use super::embed::Vector;
use super::key::Key;
use super::Entry;

/// Most semantic candidates kept per context (the oldest go first): a lookup compares the
/// question with every candidate of its context, so one context shared by every request
/// (the same system prompt for a whole application) must not grow without bound.
pub(super) const MAX_PER_CONTEXT: usize = 256;

/// Most entries kept in memory in front of SQLite.
pub(super) const LRU_ENTRIES: usize = 10_000;
/// Most memory those entries may hold (64 MiB): an answer may be as large as
/// `upstream.max_response_bytes`, and 10 000 of them had no bound (s24 attack, cache #2).
pub(super) const LRU_BYTES: usize = 64 << 20;

/// The memory an entry holds: the entry and its answer's text (held as text, not parsed:
/// s24 review F6 found a parsed `[0,0,…]` holding 16 times its text).
pub(super) fn held(e: &Entry) -> usize {
    std::mem::size_of::<Entry>() + e.answer.len()
}

/// Shards of the LRU's change counts (`Lru::changes`): one count for every key kept every
/// read of a row from being kept under a steady stream of stores (s39 stop attack M2);
/// with 64, a read is given up when one of 1/64 of the keys changed meanwhile.
pub(super) const CHANGE_SHARDS: usize = 64;

pub(super) fn shard(key: &Key) -> usize {
    usize::from(key[0]) % CHANGE_SHARDS
}

/// The entries in memory, least recently used first out, bounded in count and in the
/// memory they hold (`held`).
pub(super) struct Lru {
    entries: LruCache<Key, (Arc<Entry>, usize)>,
    bytes: usize,
    /// Changes so far (`put`, `pop`, `clear`), per shard of keys: a row read from the table
    /// while its key's shard changed may be older than what changed it (`Cache::keep`).
    changes: [u64; CHANGE_SHARDS],
}

impl Lru {
    pub(super) fn new() -> Lru {
        let cap = NonZeroUsize::new(LRU_ENTRIES).unwrap_or(NonZeroUsize::MIN);
        Lru {
            entries: LruCache::new(cap),
            bytes: 0,
            changes: [0; CHANGE_SHARDS],
        }
    }

    pub(super) fn get(&mut self, key: &Key) -> Option<Arc<Entry>> {
        self.entries.get(key).map(|(e, _)| e.clone())
    }

    /// Keeps `entry`, which holds `bytes` (`held`, measured before the lock is taken: the
    /// walk of a large answer must not hold up every lookup); one larger than the whole
    /// budget is not kept (it is read from the database when asked for).
    pub(super) fn put(&mut self, key: Key, entry: Arc<Entry>, bytes: usize) {
        self.changes[shard(&key)] += 1;
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

    /// The entry held for `key`, without marking it used.
    pub(super) fn peek(&self, key: &Key) -> Option<&Arc<Entry>> {
        self.entries.peek(key).map(|(e, _)| e)
    }

    /// The changes so far in `key`'s shard.
    pub(super) fn changes(&self, key: &Key) -> u64 {
        self.changes[shard(key)]
    }

    pub(super) fn pop(&mut self, key: &Key) {
        self.changes[shard(key)] += 1;
        if let Some((_, gone)) = self.entries.pop(key) {
            self.bytes -= gone;
        }
    }

    /// Empties the LRU; returns its entries, to be dropped once its lock is released: up to
    /// `LRU_BYTES` of answers freed under it held up every lookup (s47 attack F5).
    #[must_use = "the entries are to be dropped after the lock"]
    pub(super) fn clear(&mut self) -> Vec<Arc<Entry>> {
        for c in &mut self.changes {
            *c += 1;
        }
        self.bytes = 0;
        let mut held = Vec::with_capacity(self.entries.len());
        while let Some((_, (e, _))) = self.entries.pop_lru() {
            held.push(e);
        }
        held
    }
}

/// Most vector features the semantic index keeps in memory (64 MiB): `max_entries` alone
/// let an index of large vectors outgrow the process, reloaded whole at every start (s24
/// attack, cache #2). Past it, a new entry is an exact match only until older ones go.
pub(super) const MAX_INDEX_FEATURES: usize = 8 << 20;

/// The semantic candidates in memory, per context, and how many features they hold.
#[derive(Default)]
pub(super) struct Index {
    pub(super) buckets: HashMap<Key, Vec<(Key, Vector)>>,
    features: usize,
}

impl Index {
    /// The vector features held (`MAX_INDEX_FEATURES` bounds them).
    #[cfg(test)]
    pub(super) fn features(&self) -> usize {
        self.features
    }

    /// Adds a candidate to its context's bucket (replacing the same entry, dropping the
    /// oldest past `MAX_PER_CONTEXT`); `false`, and nothing added, past the budget.
    pub(super) fn add(&mut self, context: Key, key: Key, v: Vector) -> bool {
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

    /// Drops `keys` from every bucket: one pass over the index, a set lookup per entry (a
    /// scan of `keys` per entry was O(indexed × deleted) under the index's write lock —
    /// seconds for a tag on most entries, every lookup's worker blocked; s27 cache F6).
    pub(super) fn forget(&mut self, keys: &HashSet<Key>) {
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

    /// Drops `key` from its context's bucket alone: a lookup that finds its row gone knows
    /// the context it asked in, and a pass over every bucket per gone row held the index's
    /// write lock for the whole index each time another replica's eviction showed.
    pub(super) fn forget_in(&mut self, context: &Key, key: &Key) {
        let Some(bucket) = self.buckets.get_mut(context) else {
            return;
        };
        let Some(at) = bucket.iter().position(|(k, _)| k == key) else {
            return;
        };
        self.features -= bucket.remove(at).1.len();
        if bucket.is_empty() {
            self.buckets.remove(context);
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    #[test]
    fn a_key_is_forgotten_in_its_context_only() {
        let mut index = Index::default();
        let (here, there) = ([1u8; 32], [2u8; 32]);
        let (gone, kept) = ([3u8; 32], [4u8; 32]);
        index.add(here, gone, vec![(1, 1.0), (2, 1.0)]);
        index.add(here, kept, vec![(1, 1.0)]);
        index.add(there, gone, vec![(1, 1.0)]);
        index.forget_in(&here, &gone);
        assert_eq!(index.buckets[&here], vec![(kept, vec![(1, 1.0)])]);
        assert_eq!(
            index.buckets[&there].len(),
            1,
            "another context's is not looked at"
        );
        assert_eq!(index.features, 2);
        index.forget_in(&here, &kept);
        index.forget_in(&here, &kept);
        assert!(!index.buckets.contains_key(&here), "an emptied bucket goes");
        assert_eq!(index.features, 1);
    }

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
            changes: [0; CHANGE_SHARDS],
        };
        // An entry holding about `bytes`: an answer of one string that long.
        let entry = |i: u8, bytes: usize| {
            let text = "x".repeat(bytes.saturating_sub(std::mem::size_of::<Entry>()));
            Arc::new(Entry {
                key: [i; 32],
                answer: bytes::Bytes::from(text),
                input_tokens: 0,
                output_tokens: 0,
                version: 1,
                expires_at: Utc::now(),
            })
        };
        let keep = |lru: &mut Lru, key: Key, e: Arc<Entry>| {
            let bytes = held(&e);
            lru.put(key, e, bytes);
        };
        let third = LRU_BYTES / 3;
        for i in 1..=3 {
            keep(&mut lru, [i; 32], entry(i, third));
        }
        assert!(lru.get(&[1; 32]).is_some(), "three thirds fit");
        keep(&mut lru, [4; 32], entry(4, third));
        assert!(lru.get(&[2; 32]).is_none(), "the least recently used went");
        assert!(lru.get(&[1; 32]).is_some() && lru.get(&[4; 32]).is_some());
        assert!(lru.bytes <= LRU_BYTES);
        let small = entry(4, 1000);
        keep(&mut lru, [4; 32], small.clone());
        assert_eq!(
            lru.bytes,
            2 * third + held(&small),
            "a replaced entry gives its bytes back"
        );
        keep(&mut lru, [5; 32], entry(5, LRU_BYTES + 1));
        assert!(
            lru.get(&[5; 32]).is_none(),
            "larger than the budget: not kept"
        );
        lru.pop(&[1; 32]);
        lru.pop(&[3; 32]);
        lru.pop(&[4; 32]);
        assert_eq!(lru.bytes, 0);

        // A clear hands its entries back (to be freed after the lock) and counts a change
        // in every shard.
        keep(&mut lru, [6; 32], entry(6, 1000));
        keep(&mut lru, [7; 32], entry(7, 1000));
        let before = lru.changes;
        let held = lru.clear();
        assert_eq!(held.len(), 2);
        assert!(lru.get(&[6; 32]).is_none() && lru.bytes == 0);
        assert!(before.iter().zip(lru.changes).all(|(b, a)| a == b + 1));
    }

    /// An entry holds its answer as the text it counts: 100 000 zeros are 200 kB held, not
    /// the 3.2 MB of `Value`s they parse into (s24 review F6: counted by their text, 64 MiB
    /// of such answers held over 1 GiB parsed).
    #[test]
    fn an_entry_holds_the_text_it_counts() {
        let text = format!("[{}0]", "0,".repeat(99_999));
        let e = Entry {
            key: [0; 32],
            answer: bytes::Bytes::from(text.clone()),
            input_tokens: 0,
            output_tokens: 0,
            version: 1,
            expires_at: Utc::now(),
        };
        assert_eq!(held(&e), std::mem::size_of::<Entry>() + text.len());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&e.answer)
                .ok()
                .and_then(|a| a.as_array().map(Vec::len)),
            Some(100_000)
        );
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
        index.forget(&HashSet::from([key(1)]));
        assert_eq!(index.features, MAX_INDEX_FEATURES / 2);
        assert!(index.add(key(3), key(3), vec![(1, 1.0)]));
    }
}

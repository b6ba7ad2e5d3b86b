//! Embedders behind one type. `lexical` (built in, offline, the default) is not a neural
//! model: a hashed vector of word unigrams, word bigrams and character trigrams,
//! L2-normalised. `http`: any OpenAI-compatible `/embeddings` endpoint (a local embedding
//! server), which also catches paraphrases. Neither decides a hit alone: a candidate must
//! first agree with the question (`meaning.rs`).

use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::Resolve;
use serde_json::{json, Value};

use crate::upstream::client::guarded;

/// A sparse vector: (feature, weight) sorted by feature, L2-normalised. Lexical
/// embeddings have a few hundred features out of 2^32; dense embeddings from an HTTP
/// embedder are stored the same way (feature = dimension).
pub type Vector = Vec<(u32, f32)>;

/// The most dimensions an `http` embedder's vector may have (8 192 covers every public
/// embedding model): a longer one is refused, never compared nor stored (s27 cache attack
/// F5: a lying embedder's millions of elements were parsed at every lookup and written at
/// every store).
pub const MAX_DIMENSIONS: usize = 8192;

/// The most bytes of an `http` embedder's answer read: `MAX_DIMENSIONS` numbers written out
/// in full take about 200 KiB, and the rest of an answer little.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[error("embedding failed: {0}")]
pub struct EmbedError(pub String);

pub enum Embedder {
    Lexical,
    Http {
        client: reqwest::Client,
        url: String,
        model: String,
        key: Option<String>,
    },
}

impl Embedder {
    /// The `http` embedder: `{base_url}/embeddings` through a guarded client
    /// (`upstream::client::guarded`): metadata addresses refused always, private ones
    /// unless `allow_private` (`cache.http_allow_private_network`, as upstreams opt in).
    pub fn http(
        base_url: &str,
        model: &str,
        key: Option<String>,
        allow_private: bool,
        connect_timeout: Duration,
        dns: Arc<dyn Resolve>,
    ) -> Result<Self, reqwest::Error> {
        Ok(Embedder::Http {
            client: guarded(allow_private, dns)
                .connect_timeout(connect_timeout)
                .build()?,
            url: format!("{}/embeddings", base_url.trim_end_matches('/')),
            model: model.to_string(),
            key,
        })
    }

    pub async fn embed(&self, text: &str) -> Result<Vector, EmbedError> {
        match self {
            Embedder::Lexical => Ok(lexical(text)),
            Embedder::Http {
                client,
                url,
                model,
                key,
            } => {
                let mut req = client
                    .post(url)
                    .timeout(Duration::from_secs(5))
                    .json(&json!({"model": model, "input": text}));
                if let Some(k) = key {
                    req = req.bearer_auth(k);
                }
                let resp = req
                    .send()
                    .await
                    .map_err(|_| EmbedError("embedding server unreachable".into()))?;
                if !resp.status().is_success() {
                    return Err(EmbedError(format!(
                        "embedding server answered {}",
                        resp.status()
                    )));
                }
                // Read a chunk at a time up to the bound: the whole body at once had no limit.
                let mut resp = resp;
                let mut body = Vec::new();
                while let Some(chunk) = resp
                    .chunk()
                    .await
                    .map_err(|_| EmbedError("embedding answer cut".into()))?
                {
                    if body.len().saturating_add(chunk.len()) > MAX_ANSWER_BYTES {
                        return Err(EmbedError("embedding answer too large".into()));
                    }
                    body.extend_from_slice(&chunk);
                }
                dense(&body)
            }
        }
    }
}

/// The vector of an `http` embedder's answer: `data[0].embedding`, of 1 to
/// `MAX_DIMENSIONS` finite numbers, normalised; anything else is refused.
fn dense(body: &[u8]) -> Result<Vector, EmbedError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| EmbedError("embedding answer is not JSON".into()))?;
    let raw = v
        .pointer("/data/0/embedding")
        .and_then(Value::as_array)
        .ok_or_else(|| EmbedError("no embedding in the answer".into()))?;
    if raw.is_empty() || raw.len() > MAX_DIMENSIONS {
        return Err(EmbedError(format!(
            "embedding of {} dimensions (1 to {MAX_DIMENSIONS})",
            raw.len()
        )));
    }
    let mut out = Vector::with_capacity(raw.len());
    // `i` is below `MAX_DIMENSIONS`, so it fits a `u32`.
    for (i, x) in (0u32..).zip(raw) {
        let x = x
            .as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite())
            .ok_or_else(|| EmbedError("embedding holds something not a finite number".into()))?;
        out.push((i, x));
    }
    normalise(&mut out);
    Ok(out)
}

fn feature(text: &str, salt: u32) -> u32 {
    let h = crc32fast::hash(text.as_bytes()) ^ salt.wrapping_mul(0x9e37_79b9);
    h.wrapping_mul(0x85eb_ca6b) ^ (h >> 13)
}

/// The lexical embedding: words weigh most, word pairs keep order, character trigrams
/// forgive small spelling differences. The cache embeds a question's tokens
/// (`meaning::normalised`), which a candidate must share anyway (the agreement check).
pub fn lexical(text: &str) -> Vector {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || (c.is_ascii_punctuation() && c != '<' && c != '>'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut weights: std::collections::HashMap<u32, f32> = std::collections::HashMap::new();
    let mut add = |f: u32, w: f32| *weights.entry(f).or_default() += w;
    for w in &words {
        add(feature(w, 1), 2.0);
        let chars: Vec<char> = format!("^{w}$").chars().collect();
        for g in chars.windows(3) {
            add(feature(&g.iter().collect::<String>(), 3), 0.35);
        }
    }
    for pair in words.windows(2) {
        add(feature(&format!("{} {}", pair[0], pair[1]), 2), 1.5);
    }
    bounded(weights.into_iter().collect())
}

/// A lexical vector of at most `MAX_FEATURES`, sorted by feature, normalised, holding no
/// more memory than its features: the heaviest, ties by feature, so the same text keeps
/// the same ones — and a stored vector of an older version, bounded again on load, keeps
/// what the question's would (weights scale alike under normalisation).
pub fn bounded(mut v: Vector) -> Vector {
    if v.len() > MAX_FEATURES {
        v.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(MAX_FEATURES);
        // Truncated, the vector keeps its allocation: 22 000 features' worth, counted as
        // 1 024 (s24 attack on the day's fixes, F1).
        v.shrink_to_fit();
    }
    v.sort_unstable_by_key(|&(f, _)| f);
    normalise(&mut v);
    v
}

/// Most features a lexical vector keeps (8 KiB): 32 KiB of distinct words made about
/// 22 000 (176 KiB), every one kept in memory for every entry stored (s24 attack, cache #2).
/// A question that long is compared on its heaviest features; the agreement check
/// (`meaning.rs`) still reads it whole.
pub const MAX_FEATURES: usize = 1024;

fn normalise(v: &mut [(u32, f32)]) {
    let n = v.iter().map(|(_, x)| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|(_, x)| *x /= n);
    }
}

/// Cosine similarity of two normalised sparse vectors (a merge of their sorted features).
pub fn cosine(a: &[(u32, f32)], b: &[(u32, f32)]) -> f32 {
    let (mut i, mut j, mut dot) = (0, 0, 0f32);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                dot += a[i].1 * b[j].1;
                i += 1;
                j += 1;
            }
        }
    }
    dot
}

/// Stored form: (u32, f32) little-endian pairs.
pub fn to_bytes(v: &[(u32, f32)]) -> Vec<u8> {
    v.iter()
        .flat_map(|(f, x)| f.to_le_bytes().into_iter().chain(x.to_le_bytes()))
        .collect()
}

pub fn from_bytes(b: &[u8]) -> Vector {
    b.chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `http` embedder's answer holds a vector of at most `MAX_DIMENSIONS` numbers, each
    /// finite: anything else is refused, never stored or compared (s27 cache attack F5).
    #[test]
    fn an_embedding_past_its_bound_or_not_numbers_is_refused() {
        let answer = |v: &str| format!("{{\"data\": [{{\"embedding\": {v}}}]}}");
        let ok = dense(answer("[3, 4]").as_bytes()).unwrap();
        assert_eq!(ok, vec![(0, 0.6), (1, 0.8)]);
        let most = format!("[{}1]", "0,".repeat(MAX_DIMENSIONS - 1));
        assert_eq!(
            dense(answer(&most).as_bytes()).unwrap().len(),
            MAX_DIMENSIONS
        );
        let over = format!("[{}1]", "0,".repeat(MAX_DIMENSIONS));
        for bad in [
            answer(&over),
            answer("[1, \"x\"]"),
            answer("[1, null]"),
            answer("[1e300]"),
            answer("[]"),
            answer("5"),
            "[]".to_string(),
            "not json".to_string(),
        ] {
            assert!(dense(bad.as_bytes()).is_err(), "{bad:.80}");
        }
    }

    #[test]
    fn words_and_their_order_count() {
        let a = lexical("why does the engine light blink");
        assert!(cosine(&a, &lexical("Why does the ENGINE light blink?")) > 0.999);
        assert!(cosine(&a, &lexical("why does the oil light blink")) < 0.95);
        assert!(cosine(&a, &lexical("the engine light why does blink")) < 0.95);
    }

    /// A long question keeps at most `MAX_FEATURES`, the same ones each time it is read.
    #[test]
    fn a_long_question_keeps_a_bounded_vector_the_same_each_time() {
        let mut seed = 7u64;
        let mut word = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (0..3 + (seed >> 60) % 6)
                .map(|i| (b'a' + ((seed >> (8 * i)) % 26) as u8) as char)
                .collect::<String>()
        };
        let text: String = std::iter::repeat_with(&mut word)
            .take(5_000)
            .collect::<Vec<_>>()
            .join(" ");
        let v = lexical(&text);
        assert!(v.len() <= MAX_FEATURES, "{} features", v.len());
        assert!(v.capacity() <= MAX_FEATURES, "{} allocated", v.capacity());
        assert!(cosine(&v, &lexical(&text)) > 0.9999);
        assert!(v.windows(2).all(|w| w[0].0 < w[1].0), "sorted by feature");
    }
}

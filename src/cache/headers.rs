//! The client's cache headers, range-checked before anything uses them
//! (`x-sluice-cache-ttl`, `x-sluice-cache-tags`): out of range is a 400 naming the header,
//! in the client's format — never a panic, never a silent default.

use actix_web::http::header::{HeaderMap, HeaderValue};
use chrono::{DateTime, Duration, Utc};

use crate::error::ApiError;

/// The longest an entry may live (one year), whoever asks: `x-sluice-cache-ttl` above it is
/// refused, a token's or the config's default is held to it — so `now + ttl` never
/// overflows a date. Defined beside the cache's settings, which the config checks against
/// it (the config sits below the cache).
pub use crate::config::MAX_CACHE_TTL_SECONDS as MAX_TTL_SECONDS;

/// A request header as text, trimmed; one that is not visible ASCII is refused by name.
fn header<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<Option<&'h str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|v| Some(v.trim()))
            .map_err(|_| ApiError::invalid(name, format!("{name} must be visible ASCII text"))),
    }
}

/// What a request's headers ask of the cache, read and range-checked in stage 2 on every
/// route, before the windows count the request: read when the cache was planned, a bad
/// header took one of the windows' request slots and was named only on the two cached
/// routes (s32 edge attack F4).
#[derive(Debug, Default)]
pub struct Asked<'h> {
    /// `x-sluice-cache`: `on`, `off` or `refresh`.
    pub(super) mode: Option<&'h str>,
    /// `x-sluice-cache-ttl`, in range.
    pub(super) ttl: Option<i64>,
    /// `x-sluice-cache-tags`, in number and length.
    pub(super) tags: Vec<&'h str>,
    /// `anthropic-beta` (it changes what the model returns, so it is part of the key): the
    /// provider's header, forwarded as it came, so never refused (s32 stop attack F3).
    pub(super) beta: Option<&'h HeaderValue>,
}

impl<'h> Asked<'h> {
    pub fn read(headers: &'h HeaderMap) -> Result<Asked<'h>, ApiError> {
        let mode = header(headers, "x-sluice-cache")?;
        if !matches!(mode, None | Some("on" | "off" | "refresh")) {
            return Err(ApiError::invalid(
                "x-sluice-cache",
                "x-sluice-cache must be on, off or refresh",
            ));
        }
        Ok(Asked {
            mode,
            ttl: header(headers, "x-sluice-cache-ttl")?
                .map(parse_ttl)
                .transpose()?,
            tags: parse_tags(header(headers, "x-sluice-cache-tags")?)?,
            beta: headers.get("anthropic-beta"),
        })
    }
}

impl Asked<'_> {
    /// `anthropic-beta` for the key: its text, trimmed (absent when empty), or — not text —
    /// its bytes escaped, so two values never share a key. Never refused: it is the
    /// provider's header, forwarded as it came, and refused in the plan (after the windows)
    /// it cost a request slot (s32 last attack F2).
    pub(super) fn beta(&self) -> Option<String> {
        let beta = self.beta?;
        let text = match beta.to_str() {
            Ok(text) => text.trim().to_string(),
            Err(_) => beta.as_bytes().escape_ascii().to_string(),
        };
        (!text.is_empty()).then_some(text)
    }
}

/// `x-sluice-cache-ttl`: whole seconds, 1 to `MAX_TTL_SECONDS`.
fn parse_ttl(t: &str) -> Result<i64, ApiError> {
    t.parse::<i64>()
        .ok()
        .filter(|t| (1..=MAX_TTL_SECONDS).contains(t))
        .ok_or_else(|| {
            ApiError::invalid(
                "x-sluice-cache-ttl",
                format!(
                    "x-sluice-cache-ttl must be a whole number of seconds from 1 to {MAX_TTL_SECONDS}"
                ),
            )
        })
}

/// Most tags on one entry, and the longest tag (the admin API's limit too).
pub const MAX_TAGS: usize = 10;
pub const MAX_TAG_LEN: usize = 200;

/// A tag to invalidate (`POST /admin/api/v1/cache/invalidate`, `sluice cache invalidate`):
/// trimmed, 1 to `MAX_TAG_LEN` bytes, no comma — or what is wrong with it.
pub fn invalidation_tag(tag: &str) -> Result<&str, String> {
    let tag = tag.trim();
    if tag.is_empty() || tag.len() > MAX_TAG_LEN || tag.contains(',') {
        return Err(format!(
            "tag must be 1 to {MAX_TAG_LEN} characters, without commas"
        ));
    }
    Ok(tag)
}

/// `x-sluice-cache-tags: a,b`: at most `MAX_TAGS` tags of at most `MAX_TAG_LEN` bytes.
/// Any other character is kept as it is (invalidation matches whole tags exactly).
fn parse_tags(header: Option<&str>) -> Result<Vec<&str>, ApiError> {
    let tags: Vec<&str> = header
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if tags.len() > MAX_TAGS || tags.iter().any(|t| t.len() > MAX_TAG_LEN) {
        return Err(ApiError::invalid(
            "x-sluice-cache-tags",
            format!(
                "x-sluice-cache-tags takes at most {MAX_TAGS} tags of at most {MAX_TAG_LEN} characters"
            ),
        ));
    }
    Ok(tags)
}

/// When an entry stored at `now` expires; the TTL is bounded, and a date past chrono's
/// range would still not panic.
pub(super) fn expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    now.checked_add_signed(ttl)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any header text: a TTL in range or a 400 naming the header, never a panic; any
        /// tag list: at most `MAX_TAGS` tags of at most `MAX_TAG_LEN`, or a 400.
        #[test]
        fn client_numbers_and_tags_are_range_checked(text in "\\PC{0,40}", n in proptest::num::i64::ANY) {
            for t in [text.clone(), n.to_string()] {
                match parse_ttl(&t) {
                    Ok(ttl) => proptest::prop_assert!((1..=MAX_TTL_SECONDS).contains(&ttl)),
                    Err(e) => proptest::prop_assert_eq!(e.status(), 400),
                }
                let _ = expiry(DateTime::<Utc>::MAX_UTC, Duration::seconds(MAX_TTL_SECONDS));
            }
            if let Ok(tags) = parse_tags(Some(&text)) {
                proptest::prop_assert!(tags.len() <= MAX_TAGS);
                proptest::prop_assert!(tags.iter().all(|t| t.len() <= MAX_TAG_LEN && !t.contains(',')));
            }
        }
    }
}

//! Attribution tags: `key:value,key:value` — on a request (`x-sluice-tags`, merged in
//! `pipeline::tags`) and as the token's and the team's default tags. Keys and values are 1
//! to 64 bytes of `A-Z a-z 0-9 . _ -`; at most `MAX_TAGS` pairs, before and after a merge.
//! The canonical text — pairs sorted by key, `key:value` joined by `,`, empty for none — is
//! what the request log, the token and team rows and the spend rollup store, so a report
//! can parse it back with the same rules. It lives below `store` and `pipeline` because both
//! read it.
//!
//! Checked byte by byte (no regex): the charset has no `:` or `,`, so the text splits
//! unambiguously.

use std::collections::BTreeMap;

pub const MAX_TAGS: usize = 10;
/// The value the spend rollup gives a key past its daily bound of distinct values, and the
/// key (with this value) it gives the keys past its daily bound of distinct keys
/// (`store::tag_bound`). Outside the charset, so no request's tag can be it.
pub const OTHER: &str = "(other)";
pub const MAX_LEN: usize = 64;

/// A validated set of tags, ordered by key (one value per key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags(BTreeMap<String, String>);

/// Why a tag text was refused (the message names the offending piece).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TagError(pub(crate) String);

/// Whether `s` may be a tag key or value.
pub fn is_word(s: &str) -> bool {
    (1..=MAX_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn describe(s: &str) -> String {
    // The offending text is echoed only when it is short and printable.
    if s.len() <= MAX_LEN && s.bytes().all(|b| b.is_ascii_graphic()) {
        format!("`{s}`")
    } else {
        format!("of {} bytes", s.len())
    }
}

impl Tags {
    /// Parses `key:value,key:value`; surrounding spaces of a pair are ignored, and an
    /// empty text is no tags.
    pub fn parse(text: &str) -> Result<Tags, TagError> {
        Tags::parse_as(text, false)
    }

    /// `parse`, where a stored rollup text may also hold `OTHER` as a key or value.
    fn parse_as(text: &str, stored: bool) -> Result<Tags, TagError> {
        let mut tags = BTreeMap::new();
        if text.trim().is_empty() {
            return Ok(Tags(tags));
        }
        for pair in text.split(',') {
            let pair = pair.trim();
            if tags.len() == MAX_TAGS {
                return Err(TagError(format!("at most {MAX_TAGS} tags")));
            }
            let Some((key, value)) = pair.split_once(':') else {
                return Err(TagError(format!(
                    "the tag {} is not `key:value`",
                    describe(pair)
                )));
            };
            for (what, s) in [("key", key), ("value", value)] {
                let rolled_up = stored && s == OTHER;
                if !(is_word(s) || rolled_up) {
                    return Err(TagError(format!(
                        "the tag {what} {} must be 1 to {MAX_LEN} of A-Z a-z 0-9 . _ -",
                        describe(s)
                    )));
                }
            }
            if tags.insert(key.to_string(), value.to_string()).is_some() {
                return Err(TagError(format!("the tag key `{key}` appears twice")));
            }
        }
        Ok(Tags(tags))
    }

    /// Text stored before it was written by `canonical` is parsed leniently: anything that
    /// does not parse counts as no tags (only validated text is ever written).
    pub fn stored(text: &str) -> Tags {
        Tags::parse_as(text, true).unwrap_or_default()
    }

    /// The pairs, ordered by key.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The same tags with the value of each of `values` replaced by `OTHER`, and the pairs
    /// of `keys` replaced by one `OTHER:OTHER`.
    pub fn rolled_up(mut self, values: &[String], keys: &[String]) -> Tags {
        for k in values {
            if let Some(v) = self.0.get_mut(k) {
                *v = OTHER.to_string();
            }
        }
        let before = self.0.len();
        self.0.retain(|k, _| !keys.contains(k));
        if self.0.len() < before {
            self.0.insert(OTHER.to_string(), OTHER.to_string());
        }
        self
    }

    /// `self` over `under`, key by key; more than `MAX_TAGS` in the result is refused.
    pub fn over(mut self, under: &Tags) -> Result<Tags, TagError> {
        for (k, v) in &under.0 {
            self.0.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if self.0.len() > MAX_TAGS {
            return Err(TagError(format!(
                "at most {MAX_TAGS} tags, with the token's and the team's default tags counted"
            )));
        }
        Ok(self)
    }

    /// `self` (a request's own tags) added to `fixed` (the admin's defaults): a key of
    /// `fixed` may be repeated with its value but not given another one.
    pub fn beside(self, fixed: &Tags) -> Result<Tags, TagError> {
        for (k, v) in &self.0 {
            if fixed.get(k).is_some_and(|f| f != v) {
                return Err(TagError(format!(
                    "the tag key `{k}` is set by the admin on the token or team and cannot be changed"
                )));
            }
        }
        self.over(fixed)
    }

    pub fn canonical(&self) -> String {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        pairs.join(",")
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_tags_parse_to_their_canonical_text() {
        let t = Tags::parse(" project:apollo , env:prod,a.b_c-9:X").unwrap();
        assert_eq!(t.canonical(), "a.b_c-9:X,env:prod,project:apollo");
        assert_eq!(t.get("env"), Some("prod"));
        assert!(Tags::parse("").unwrap().is_empty());
        assert!(Tags::parse("   ").unwrap().is_empty());
        let ten: Vec<String> = (0..10).map(|i| format!("k{i}:v")).collect();
        assert_eq!(Tags::parse(&ten.join(",")).unwrap().0.len(), 10);
        let long = "v".repeat(64);
        assert!(Tags::parse(&format!("k:{long}")).is_ok());
    }

    #[test]
    fn a_rolled_up_value_reads_back_from_the_store_but_never_from_a_request() {
        let t = Tags::parse("a:1,trace:x")
            .unwrap()
            .rolled_up(&["trace".into()], &[]);
        assert_eq!(t.canonical(), "a:1,trace:(other)");
        assert_eq!(Tags::stored(&t.canonical()).get("trace"), Some(OTHER));
        assert!(Tags::parse(&t.canonical()).is_err());
        // Keys past the bound are one `(other):(other)` pair.
        let t = Tags::parse("a:1,b:2,c:3")
            .unwrap()
            .rolled_up(&["a".into()], &["b".into(), "c".into()]);
        assert_eq!(t.canonical(), "(other):(other),a:(other)");
        assert_eq!(Tags::stored(&t.canonical()).get(OTHER), Some(OTHER));
        assert!(Tags::parse(&t.canonical()).is_err());
    }

    #[test]
    fn bad_tags_are_refused() {
        let eleven: Vec<String> = (0..11).map(|i| format!("k{i}:v")).collect();
        let long = format!("k:{}", "v".repeat(65));
        for bad in [
            eleven.join(","),
            long,
            "a:b:c".into(),
            "a:1,a:2".into(),
            "k:caf\u{e9}".into(),
            ":v".into(),
            "k:".into(),
            "novalue".into(),
            "a:1,".into(),
            "a b:1".into(),
        ] {
            assert!(Tags::parse(&bad).is_err(), "{bad}");
        }
    }
}

//! `[redis]` validated into the topology the window store connects to. Every error names the
//! key at fault and shows a URL only with its password masked.

use super::{ConfigError, RedisSettings};

/// Where the rate-limit windows live. URLs keep their credentials (they are secrets: never
/// logged; `redacted` is what may be shown).
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (`url`).
    Single(String),
    /// A Redis Cluster: the seed nodes of `url`; the client learns every other node and the
    /// slot map from them, follows `MOVED`/`ASK` and refreshes the map after a failover.
    Cluster(Vec<String>),
    /// A master found by asking `sentinels` for `master_name`, asked again after a failure.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
        master_password: Option<String>,
    },
}

impl std::fmt::Debug for RedisTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |urls: &[String]| urls.iter().map(|u| redacted(u)).collect::<Vec<_>>();
        match self {
            RedisTopology::Single(u) => write!(f, "Single({})", redacted(u)),
            RedisTopology::Cluster(urls) => write!(f, "Cluster({:?})", list(urls)),
            RedisTopology::Sentinel {
                sentinels,
                master_name,
                master_password,
            } => write!(
                f,
                "Sentinel({:?}, {master_name:?}, password {})",
                list(sentinels),
                if master_password.is_some() {
                    "set"
                } else {
                    "none"
                }
            ),
        }
    }
}

impl RedisSettings {
    /// The topology these settings describe, or an error naming the key at fault.
    pub fn topology(&self) -> Result<RedisTopology, ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        let urls = split_urls(self.url.expose());
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.expose().trim().to_string())
            .collect();
        if !sentinels.is_empty() {
            if !urls.is_empty() {
                return invalid(
                    "redis: set either `url` (one server or a cluster) or `sentinels`, not both"
                        .into(),
                );
            }
            if self.cluster {
                return invalid(
                    "redis.cluster = true cannot be combined with redis.sentinels \
                     (Sentinel watches a master and its replicas, not a cluster)"
                        .into(),
                );
            }
            let Some(master_name) = self.master_name.as_ref().filter(|m| !m.trim().is_empty())
            else {
                return invalid(
                    "redis.master_name is required with redis.sentinels (the name the \
                     sentinels monitor, e.g. \"mymaster\")"
                        .into(),
                );
            };
            for s in &sentinels {
                check_url("redis.sentinels", s, false)?;
            }
            return Ok(RedisTopology::Sentinel {
                sentinels,
                master_name: master_name.trim().to_string(),
                master_password: self
                    .master_password
                    .as_ref()
                    .filter(|p| !p.is_empty())
                    .map(|p| p.expose().to_string()),
            });
        }
        if self.master_name.is_some() {
            return invalid("redis.master_name needs redis.sentinels".into());
        }
        if self.master_password.is_some() {
            return invalid(
                "redis.master_password needs redis.sentinels (with `url`, put the password \
                 in the URL: redis://:password@host:6379)"
                    .into(),
            );
        }
        match urls.as_slice() {
            [] => invalid(
                "[redis] needs `url` (one server, or cluster nodes with `cluster = true`) \
                 or `sentinels` with `master_name`"
                    .into(),
            ),
            [one] if !self.cluster => {
                check_url("redis.url", one, true)?;
                Ok(RedisTopology::Single(one.clone()))
            }
            many if !self.cluster => invalid(format!(
                "redis.url lists {} servers: set redis.cluster = true for a Redis Cluster, \
                 or redis.sentinels for Sentinel",
                many.len()
            )),
            nodes => {
                for n in nodes {
                    check_url("redis.url", n, false)?;
                }
                Ok(RedisTopology::Cluster(nodes.to_vec()))
            }
        }
    }
}

/// `redis://a:7000, redis://b:7001` → each URL, trimmed; empty parts dropped. Only a comma
/// that another URL follows (`scheme://`) separates: one inside a URL — a password's, which
/// RFC 3986 allows unescaped — stays in it.
fn split_urls(text: &str) -> Vec<String> {
    let mut urls = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices(',') {
        if starts_a_url(&text[i + 1..]) {
            urls.push(&text[start..i]);
            start = i + 1;
        }
    }
    urls.push(&text[start..]);
    urls.into_iter()
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether `rest`, past leading blanks (or further commas), begins with `scheme://` or is
/// the end (a trailing comma).
fn starts_a_url(rest: &str) -> bool {
    let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
    if rest.is_empty() {
        return true;
    }
    let Some((scheme, _)) = rest.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// A `redis://` or `rediss://` URL with a host; a database other than 0 only where one is
/// possible (a cluster and a sentinel have database 0 only).
fn check_url(key: &str, text: &str, db_allowed: bool) -> Result<(), ConfigError> {
    let invalid = |why: &str| {
        Err(ConfigError::Invalid(format!(
            "{key}: `{}` {why}",
            redacted(text)
        )))
    };
    let Ok(url) = url::Url::parse(text) else {
        return invalid("is not a URL (redis://host:port)");
    };
    if !matches!(url.scheme(), "redis" | "rediss") {
        return invalid("must start with redis:// or rediss://");
    }
    if url.host_str().is_none_or(str::is_empty) {
        return invalid("has no host");
    }
    let db = url.path().trim_matches('/');
    if !db.is_empty() {
        match db.parse::<u32>() {
            Ok(0) => {}
            Ok(_) if db_allowed => {}
            Ok(_) => return invalid("names a database: a cluster or sentinel has database 0 only"),
            Err(_) => return invalid("has a path that is not a database number"),
        }
    }
    if redis::IntoConnectionInfo::into_connection_info(text).is_err() {
        return invalid("is not a Redis URL the client accepts");
    }
    Ok(())
}

/// The URL with its password, if any, shown as `****`: what errors and logs may print.
pub fn redacted(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("****"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        // Not a URL: it could still hold a secret, so none of it is shown.
        Err(_) => "<not a URL>".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::load_from;

    fn topology(text: &str) -> Result<RedisTopology, String> {
        let s = load_from(Some(text), &BTreeMap::new()).map_err(|e| e.to_string())?;
        let r = s.redis.clone().expect("a [redis] table");
        let t = r.topology().map_err(|e| e.to_string());
        assert_eq!(
            s.validate().map_err(|e| e.to_string()).err(),
            t.clone().err(),
            "validate() runs the same check"
        );
        t
    }

    #[test]
    fn one_server_a_cluster_and_sentinel() {
        assert_eq!(
            topology("[redis]\nurl = \"redis://127.0.0.1:6379/2\"").unwrap(),
            RedisTopology::Single("redis://127.0.0.1:6379/2".into())
        );
        assert_eq!(
            topology("[redis]\nurl = \"redis://a:7000, redis://b:7001,\"\ncluster = true").unwrap(),
            RedisTopology::Cluster(vec!["redis://a:7000".into(), "redis://b:7001".into()])
        );
        // One seed node is enough for a cluster.
        assert!(matches!(
            topology("[redis]\nurl = \"redis://a:7000\"\ncluster = true").unwrap(),
            RedisTopology::Cluster(n) if n.len() == 1
        ));
        assert_eq!(
            topology(
                "[redis]\nsentinels = [\"redis://s1:26379\", \"redis://s2:26379\"]\nmaster_name = \"mymaster\""
            )
            .unwrap(),
            RedisTopology::Sentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                master_name: "mymaster".into(),
                master_password: None,
            }
        );
        let with_password = "[redis]\nsentinels = [\"redis://s1:26379\"]\nmaster_name = \"m\"\nmaster_password = \"hunter2-secret\"";
        let t = topology(with_password).unwrap();
        assert!(matches!(
            &t,
            RedisTopology::Sentinel { master_password: Some(p), .. } if p == "hunter2-secret"
        ));
        assert!(!format!("{t:?}").contains("hunter2"), "{t:?}");
        let s = load_from(Some(with_password), &BTreeMap::new()).unwrap();
        assert!(!s.to_masked_toml().contains("hunter2"));
    }

    #[test]
    fn every_mistake_names_its_key() {
        let cases = [
            ("[redis]\nurl = \"http://a:1\"", "redis.url"),
            ("[redis]\nurl = \"redis://a:1,redis://b:2\"", "redis.cluster = true"),
            ("[redis]\nurl = \"redis://a:1/3\"\ncluster = true", "database 0"),
            ("[redis]\nurl = \"redis://a:1/x\"", "database number"),
            ("[redis]\ncluster = true", "needs `url`"),
            ("[redis]\nsentinels = [\"redis://s:26379\"]", "redis.master_name"),
            (
                "[redis]\nsentinels = [\"redis://s:26379\"]\nmaster_name = \"m\"\nurl = \"redis://a:1\"",
                "not both",
            ),
            (
                "[redis]\nsentinels = [\"redis://s:26379\"]\nmaster_name = \"m\"\ncluster = true",
                "redis.sentinels",
            ),
            ("[redis]\nsentinels = [\"tcp://s:26379\"]\nmaster_name = \"m\"", "redis.sentinels"),
            ("[redis]\nmaster_name = \"m\"\nurl = \"redis://a:1\"", "redis.master_name"),
            (
                "[redis]\nmaster_password = \"p\"\nurl = \"redis://a:1\"",
                "redis.master_password",
            ),
        ];
        for (text, key) in cases {
            let err = topology(text).expect_err(text);
            assert!(err.contains(key), "{text}: {err} does not name {key}");
        }
        assert!(load_from(
            Some("[redis]\nurl = \"redis://a:1\"\nmode = \"x\""),
            &BTreeMap::new()
        )
        .is_err());
    }

    #[test]
    fn passwords_never_show_in_errors_or_printed_config() {
        let text = "[redis]\nurl = \"redis://:hunter2-secret@a:1,redis://:hunter2-secret@b:2/9\"\ncluster = true";
        let err = topology(text).unwrap_err();
        assert!(err.contains("****") && !err.contains("hunter2"), "{err}");
        let ok = "[redis]\nurl = \"redis://u:hunter2-secret@a:1,redis://u:hunter2-secret@b:2\"\ncluster = true";
        let t = topology(ok).unwrap();
        assert!(!format!("{t:?}").contains("hunter2"), "{t:?}");
        let s = load_from(Some(ok), &BTreeMap::new()).unwrap();
        assert!(!s.to_masked_toml().contains("hunter2"));
        let sentinel =
            "[redis]\nsentinels = [\"redis://:hunter2-secret@s:26379/4\"]\nmaster_name = \"m\"";
        let err = topology(sentinel).unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        assert_eq!(redacted("not a url hunter2"), "<not a URL>");
    }
}

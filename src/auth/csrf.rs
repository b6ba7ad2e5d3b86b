//! Cross-site request refusal for the admin surface.
//!
//! Two independent checks on every state-changing request:
//! 1. `Sec-Fetch-Site` (when the browser sends it) must be `same-origin` or `none`, and
//!    `Origin` (when sent) must be this server's origin — so a cross-site form or fetch is
//!    refused before anything else happens;
//! 2. a per-session token: `SHA-256("sluice-csrf" ‖ session id)`, sent as the header
//!    `x-csrf-token` (htmx, via `hx-headers`) or the form field `csrf_token`. It is derived
//!    from the session id, which only the browser holds (the database keeps a different
//!    hash of it), so another session's token or a guessed one never matches.
//!
//! The login form, which has no session yet, uses the same scheme keyed by a short-lived
//! pre-session cookie.

use actix_web::http::header::HeaderMap;
use sha2::{Digest, Sha256};

pub const HEADER: &str = "x-csrf-token";
pub const FIELD: &str = "csrf_token";

/// The CSRF token that belongs to a session (or pre-session) secret.
pub fn token_for(secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"sluice-csrf\0");
    h.update(secret.as_bytes());
    hex::encode(h.finalize())
}

/// Constant-time comparison of a supplied token with the expected one.
pub fn matches(secret: &str, supplied: &str) -> bool {
    let expected = token_for(secret);
    let (a, b) = (expected.as_bytes(), supplied.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a state-changing request may come from where it says it comes from.
/// `public_url` is `server.public_url`; the request's own `Host` is accepted as well, since a
/// browser always sends the host it is talking to.
pub fn same_origin(headers: &HeaderMap, public_url: &str, scheme: &str) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.to_str(), Ok("same-origin") | Ok("none")) {
            return false;
        }
    }
    let Some(origin) = headers.get("origin") else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim_end_matches('/');
    if origin == origin_of(public_url) {
        return true;
    }
    headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .is_some_and(|host| origin.eq_ignore_ascii_case(&format!("{scheme}://{host}")))
}

/// `scheme://host[:port]` of a URL, lower-cased; "" when it has none.
fn origin_of(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => u.origin().ascii_serialization().to_ascii_lowercase(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn tokens_are_bound_to_their_secret() {
        let t = token_for("session-a");
        assert!(matches("session-a", &t));
        assert!(!matches("session-b", &t));
        assert!(!matches("session-a", ""));
        assert!(!matches("session-a", &t[1..]));
    }

    #[test]
    fn cross_site_is_refused() {
        let url = "http://127.0.0.1:8080";
        assert!(same_origin(&headers(&[]), url, "http"));
        assert!(same_origin(
            &headers(&[("origin", "http://127.0.0.1:8080")]),
            url,
            "http"
        ));
        assert!(same_origin(
            &headers(&[("origin", "http://gw:9000"), ("host", "gw:9000")]),
            url,
            "http"
        ));
        assert!(!same_origin(
            &headers(&[("origin", "https://evil.example")]),
            url,
            "http"
        ));
        assert!(!same_origin(&headers(&[("origin", "null")]), url, "http"));
        assert!(!same_origin(
            &headers(&[("sec-fetch-site", "cross-site")]),
            url,
            "http"
        ));
        assert!(!same_origin(
            &headers(&[("sec-fetch-site", "same-site")]),
            url,
            "http"
        ));
        assert!(same_origin(
            &headers(&[("sec-fetch-site", "same-origin")]),
            url,
            "http"
        ));
    }
}

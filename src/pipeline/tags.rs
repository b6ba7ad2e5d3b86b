//! The request's tags: `x-sluice-tags` parsed with the rules of `crate::tags` and merged
//! over the token's and the team's default tags.

use actix_web::http::header::HeaderMap;

use crate::error::ApiError;
use crate::tags::{TagError, Tags};

pub const HEADER: &str = "x-sluice-tags";

/// The tags of one request: the header's over the token's over the team's defaults (both
/// stored canonical). A bad header, or more than `MAX_TAGS` after the merge, is a 400
/// naming the header.
pub fn resolve(headers: &HeaderMap, token: &str, team: &str) -> Result<Tags, ApiError> {
    let bad = |e: TagError| ApiError::invalid(HEADER, format!("{HEADER}: {e}."));
    let asked = match headers.get(HEADER) {
        None => Tags::default(),
        Some(v) => {
            let text = v.to_str().map_err(|_| {
                bad(TagError(
                    "tags must be ASCII `key:value` pairs separated by `,`".into(),
                ))
            })?;
            Tags::parse(text).map_err(bad)?
        }
    };
    asked
        .over(&Tags::stored(token))
        .and_then(|t| t.over(&Tags::stored(team)))
        .map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_wins_over_the_token_over_the_team() {
        let mut h = HeaderMap::new();
        h.insert(
            actix_web::http::header::HeaderName::from_static(HEADER),
            actix_web::http::header::HeaderValue::from_static("env:test"),
        );
        let t = resolve(&h, "env:prod,owner:ops", "env:dev,cc:42").unwrap();
        assert_eq!(t.canonical(), "cc:42,env:test,owner:ops");
        let none = resolve(&HeaderMap::new(), "", "env:dev").unwrap();
        assert_eq!(none.canonical(), "env:dev");
    }

    #[test]
    fn more_than_ten_after_the_merge_is_refused() {
        let team: Vec<String> = (0..6).map(|i| format!("t{i}:v")).collect();
        let token: Vec<String> = (0..5).map(|i| format!("k{i}:v")).collect();
        let err = resolve(&HeaderMap::new(), &token.join(","), &team.join(",")).unwrap_err();
        assert_eq!(err.status(), 400);
    }
}

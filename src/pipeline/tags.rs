//! The request's tags: `x-sluice-tags` parsed with the rules of `crate::tags` and merged
//! over the token's and the team's default tags.

use actix_web::http::header::HeaderMap;

use crate::error::ApiError;
use crate::tags::{TagError, Tags};

pub const HEADER: &str = "x-sluice-tags";

/// The tags of one request: the header's added to the token's over the team's defaults
/// (both stored canonical), and those defaults alone (the admin's pairs, which the spend
/// rollup's bound leaves alone: `store::tag_bound`). A bad header, a header value for a key
/// the token or team sets, or more than `MAX_TAGS` after the merge, is a 400 naming the
/// header.
pub fn resolve(headers: &HeaderMap, token: &str, team: &str) -> Result<(Tags, Tags), ApiError> {
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
    // The token's defaults over the team's: both are the admin's, which the header may add
    // to but not override (it would move spend to another cost centre).
    let fixed = Tags::stored(token).over(&Tags::stored(team)).map_err(bad)?;
    let all = asked.beside(&fixed).map_err(bad)?;
    Ok((all, fixed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            actix_web::http::header::HeaderName::from_static(HEADER),
            actix_web::http::header::HeaderValue::from_static(text),
        );
        h
    }

    #[test]
    fn the_header_adds_keys_and_the_token_wins_over_the_team() {
        let (t, fixed) = resolve(&header("proj:x"), "env:prod,owner:ops", "env:dev,cc:42").unwrap();
        assert_eq!(t.canonical(), "cc:42,env:prod,owner:ops,proj:x");
        assert_eq!(fixed.canonical(), "cc:42,env:prod,owner:ops");
        let (none, _) = resolve(&HeaderMap::new(), "", "env:dev").unwrap();
        assert_eq!(none.canonical(), "env:dev");
    }

    #[test]
    fn the_header_cannot_override_a_key_the_admin_set() {
        for (h, token, team) in [
            ("env:test", "env:prod,owner:ops", "cc:42"),
            ("cc:43", "env:prod", "cc:42"),
            ("cc:43", "", "cc:42"),
        ] {
            let err = resolve(&header(h), token, team).unwrap_err();
            assert_eq!(err.status(), 400, "{h}");
            let key = h.split(':').next().unwrap();
            let text = format!("{err:?}");
            assert!(
                text.contains(HEADER) && text.contains(&format!("`{key}`")),
                "{text}"
            );
        }
        // Repeating the admin's value is no override; the token's value is the one that
        // stands over the team's.
        let (t, _) = resolve(&header("env:prod,cc:42"), "env:prod", "cc:42,env:dev").unwrap();
        assert_eq!(t.canonical(), "cc:42,env:prod");
    }

    #[test]
    fn more_than_ten_after_the_merge_is_refused() {
        let team: Vec<String> = (0..6).map(|i| format!("t{i}:v")).collect();
        let token: Vec<String> = (0..5).map(|i| format!("k{i}:v")).collect();
        let err = resolve(&HeaderMap::new(), &token.join(","), &team.join(",")).unwrap_err();
        assert_eq!(err.status(), 400);
    }
}

//! `[oidc]`: single sign-on for the admin UI (`auth::oidc`, `admin::oidc`), and the
//! `[[oidc.roles]]` rows that turn a person's claims into a Sluice role and team.

use serde::{Deserialize, Serialize};
use url::Url;

use super::{ConfigError, Secret};

/// The path every `redirect_url` ends with: the callback route.
pub const CALLBACK_PATH: &str = "/admin/oidc/callback";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The provider's issuer URL, exactly as its discovery document states it.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: Secret,
    /// This gateway's callback as registered at the provider: `https://…/admin/oidc/callback`.
    pub redirect_url: String,
    /// Password sign-in beside SSO; `false` leaves it to break-glass logins only.
    #[serde(default = "yes")]
    pub password_login: bool,
    /// Scopes asked for besides `openid`.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// How far the provider's clock may be from ours when `exp` and `iat` are checked.
    #[serde(default = "default_skew")]
    pub clock_skew_seconds: u64,
    /// The button's text on the sign-in page.
    #[serde(default = "default_label")]
    pub label: String,
    #[serde(default)]
    pub roles: Vec<OidcRole>,
}

/// One mapping row: a person whose `claim` holds `value` (a string, or a list with it) gets
/// `role`. One `*` in `value` matches any non-empty text; `team = "*"` then names the team
/// by what it matched (`llm-lead-*` → lead of `search` for group `llm-lead-search`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcRole {
    pub claim: String,
    pub value: String,
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

fn yes() -> bool {
    true
}
fn default_scopes() -> Vec<String> {
    vec!["email".into(), "profile".into()]
}
fn default_skew() -> u64 {
    60
}
fn default_label() -> String {
    "Sign in with single sign-on".into()
}

/// What a mapping row grants: a role, and for a lead the team's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: String,
    pub team: Option<String>,
}

impl OidcSettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(format!("[oidc] {m}")));
        match Url::parse(&self.issuer) {
            Ok(u) if web_url(&u) => {}
            _ => return invalid(format!("issuer `{}` is not an http(s) URL", self.issuer)),
        }
        if self.client_id.trim().is_empty() {
            return invalid("client_id is empty".into());
        }
        if self.client_secret.is_empty() {
            return invalid(
                "client_secret is empty (set it, e.g. client_secret = \"${SLUICE_OIDC_SECRET}\")"
                    .into(),
            );
        }
        match Url::parse(&self.redirect_url) {
            Ok(u) if web_url(&u) && u.path() == CALLBACK_PATH && u.query().is_none() => {}
            _ => {
                return invalid(format!(
                    "redirect_url `{}` must be this gateway's absolute http(s) URL ending in {CALLBACK_PATH}",
                    self.redirect_url
                ))
            }
        }
        if self.clock_skew_seconds > 600 {
            return invalid("clock_skew_seconds must be at most 600".into());
        }
        if self.roles.is_empty() {
            return invalid("needs at least one [[oidc.roles]] row: nobody could sign in".into());
        }
        for r in &self.roles {
            if r.claim.is_empty() || r.value.is_empty() {
                return invalid("an [[oidc.roles]] row needs a claim and a value".into());
            }
            if r.value.matches('*').count() > 1 {
                return invalid(format!("value `{}`: at most one `*`", r.value));
            }
            match (r.role.as_str(), r.team.as_deref()) {
                ("lead", None) => {
                    return invalid(format!("value `{}`: a lead needs a team", r.value))
                }
                ("lead", Some("*")) if !r.value.contains('*') => {
                    return invalid(format!(
                        "value `{}`: team = \"*\" takes the team from a `*` in the value",
                        r.value
                    ))
                }
                ("lead", Some(_)) | ("admin" | "finance", None) => {}
                ("admin" | "finance", Some(_)) => {
                    return invalid(format!("value `{}`: only a lead has a team", r.value))
                }
                (other, _) => {
                    return invalid(format!("role `{other}` must be admin, lead or finance"))
                }
            }
        }
        Ok(())
    }

    /// Every grant the claims match, in the config's order (put the strongest first), and
    /// within a row in the claim's order. The first one Sluice can give wins
    /// (`admin::oidc`: a lead's team must exist) — a later value or row still grants where
    /// an earlier one names a team Sluice does not have.
    pub fn grants(&self, claims: &serde_json::Map<String, serde_json::Value>) -> Vec<Grant> {
        let mut out = Vec::new();
        for r in &self.roles {
            let values: Vec<&str> = match claims.get(&r.claim) {
                Some(serde_json::Value::String(s)) => vec![s.as_str()],
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
                _ => continue,
            };
            for v in values {
                let Some(matched) = matches(&r.value, v) else {
                    continue;
                };
                let team = match r.team.as_deref() {
                    Some("*") => Some(matched.to_string()),
                    other => other.map(str::to_string),
                };
                out.push(Grant {
                    role: r.role.clone(),
                    team,
                });
            }
        }
        out
    }
}

/// Whether `text` matches `pattern` (one optional `*`); the text the `*` stood for.
fn matches<'t>(pattern: &str, text: &'t str) -> Option<&'t str> {
    match pattern.split_once('*') {
        None => (pattern == text).then_some(""),
        Some((head, tail)) => {
            let rest = text.strip_prefix(head)?.strip_suffix(tail)?;
            (!rest.is_empty()).then_some(rest)
        }
    }
}

/// `https://`, or `http://` to a loopback host (a provider on the same machine, tests).
fn web_url(u: &Url) -> bool {
    match u.scheme() {
        "https" => u.host().is_some(),
        "http" => match u.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(roles: Vec<OidcRole>) -> OidcSettings {
        OidcSettings {
            issuer: "https://id.example.com/realms/acme".into(),
            client_id: "sluice".into(),
            client_secret: Secret(secrecy::SecretString::from("s3cret-value")),
            redirect_url: "https://llm.example.com/admin/oidc/callback".into(),
            password_login: true,
            scopes: default_scopes(),
            clock_skew_seconds: 60,
            label: default_label(),
            roles,
        }
    }

    fn row(claim: &str, value: &str, role: &str, team: Option<&str>) -> OidcRole {
        OidcRole {
            claim: claim.into(),
            value: value.into(),
            role: role.into(),
            team: team.map(str::to_string),
        }
    }

    fn claims(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn the_first_matching_row_wins_and_a_pattern_names_the_team() {
        let s = settings(vec![
            row("groups", "llm-admins", "admin", None),
            row("groups", "llm-lead-*", "lead", Some("*")),
            row("hd", "example.com", "finance", None),
        ]);
        s.validate().unwrap();
        let g = |v| s.grants(&claims(v)).into_iter().next();
        assert_eq!(
            g(serde_json::json!({"groups": ["x", "llm-lead-search", "llm-admins"]})),
            Some(Grant {
                role: "admin".into(),
                team: None
            })
        );
        assert_eq!(
            g(serde_json::json!({"groups": ["llm-lead-search"]})),
            Some(Grant {
                role: "lead".into(),
                team: Some("search".into())
            })
        );
        assert_eq!(
            g(serde_json::json!({"hd": "example.com", "groups": "llm-lead-"})),
            Some(Grant {
                role: "finance".into(),
                team: None
            })
        );
        assert_eq!(g(serde_json::json!({"groups": ["llm-admins-not"]})), None);
        assert_eq!(g(serde_json::json!({"groups": 7})), None);
        // Every match, in order: a lead of two teams, then finance.
        let all = s.grants(&claims(serde_json::json!({
            "groups": ["llm-lead-old", "llm-lead-search"], "hd": "example.com"
        })));
        let teams: Vec<_> = all.iter().map(|g| g.team.as_deref()).collect();
        assert_eq!(teams, [Some("old"), Some("search"), None]);
    }

    #[test]
    fn a_misconfigured_section_names_its_mistake() {
        let mut s = settings(vec![row("groups", "a", "admin", None)]);
        s.redirect_url = "https://llm.example.com/callback".into();
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("redirect_url"));
        let mut s = settings(vec![row("groups", "a", "admin", None)]);
        s.client_secret = Secret(secrecy::SecretString::from(""));
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("client_secret"));
        let mut s = settings(vec![row("groups", "a", "admin", None)]);
        s.issuer = "http://id.example.com".into();
        assert!(s.validate().unwrap_err().to_string().contains("issuer"));
        let s = settings(vec![row("groups", "a", "lead", None)]);
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("needs a team"));
        let s = settings(vec![]);
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at least one"));
    }
}

//! The `Settings` tree: defaults → TOML file → `${VAR}` expansion → `SLUICE_<SECTION>_<KEY>`
//! environment overrides, then `validate()` into the typed `Config` the gateway runs on.
//! Nothing opens a socket before validation has passed.

use std::collections::HashSet;
use std::path::PathBuf;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::upstream::url_guard::{self, UrlGuardError};

mod ladder;
mod layers;
mod oidc;
pub mod price_table;
mod prices;
mod redis;
mod sections;
mod service_account;
mod traces;
mod upstream_checks;

pub use ladder::Ladder;
pub use layers::{load, load_from};
pub use oidc::{Grant, OidcRole, OidcSettings, CALLBACK_PATH};
pub use prices::parse_effective;
pub use redis::RedisTopology;
pub use sections::*;
pub use service_account::ServiceAccount;
pub use traces::TracingSettings;
pub use upstream_checks::{
    bedrock_base_url, check_bedrock, check_gemini, gemini_base_url, GEMINI_API,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("invalid config: {0}")]
    Parse(String),
    #[error("environment variable {0} referenced in the config is not set")]
    MissingVar(String),
    #[error("invalid config: {0}")]
    Invalid(String),
    #[error("upstream `{0}`: {1}")]
    UpstreamUrl(String, UrlGuardError),
}

/// A secret from the config: kept out of `Debug`, and printed as its last 4 characters only.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub SecretString);

impl Secret {
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }
    /// What pages, logs and `check-config` may show: the last 4 characters.
    pub fn masked(&self) -> String {
        mask_secret(self.expose())
    }
}

pub fn mask_secret(s: &str) -> String {
    let tail: String = s
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if s.chars().count() <= 8 {
        "****".to_string()
    } else {
        format!("****{tail}")
    }
}

impl UpstreamSettings {
    /// What each provider kind needs beyond a base URL: a base URL where the kind has no
    /// default, Azure an `api_version` and a key or Entra credentials (whose token endpoint
    /// passes the URL guard too), Gemini a key or Vertex AI's service account (likewise) and
    /// model names fit for its URL path (`models`: those its routes send), Bedrock a region
    /// and one kind of credentials, every kind that sends a key a key, and each kind's
    /// fields and quirks only where they mean something.
    fn check_kind(&self, models: &[&str]) -> Result<(), ConfigError> {
        let id = &self.id;
        let fail = |why: String| ConfigError::Invalid(format!("upstream `{id}`: {why}"));
        let bad = |what: String| Err(fail(what));
        let keyless = self.quirks.auth == AuthMode::None;
        let aws = self.region.is_some()
            || self.access_key_id.is_some()
            || self.secret_access_key.is_some()
            || self.session_token.is_some();
        // Gemini and Bedrock have default endpoints (`effective_base_url`).
        let defaulted = matches!(self.provider, Provider::Gemini | Provider::Bedrock);
        if self.base_url.is_empty() && !defaulted {
            return bad("`base_url` is required".into());
        }
        if !self.quirks.billed_fields.is_empty() && self.provider != Provider::OpenaiCompatible {
            return bad(
                "`quirks.billed_fields` is for `provider = \"openai_compatible\"` only".into(),
            );
        }
        if let Some(f) = self
            .quirks
            .billed_fields
            .iter()
            .find(|f| !BILLED_ROUTER_FIELDS.contains(&f.as_str()))
        {
            return bad(format!(
                "`quirks.billed_fields` names {f:?}: the fields it allows are {}",
                BILLED_ROUTER_FIELDS.join(", ")
            ));
        }
        if self.vertex.is_some() && self.provider != Provider::Gemini {
            return bad("`vertex` is for `provider = \"gemini\"` only".into());
        }
        if aws && self.provider != Provider::Bedrock {
            return bad(
                "region, access_key_id, secret_access_key and session_token are for \
                 provider \"bedrock\" only"
                    .into(),
            );
        }
        match self.provider {
            Provider::AzureOpenai => {
                match self.api_version.as_deref() {
                    None | Some("") => {
                        return bad("azure_openai needs `api_version` (a dated version such as \
                             \"2024-10-21\" for the deployment path, or \"v1\")"
                            .into())
                    }
                    Some(v) if !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                        return bad(format!("`api_version` {v:?} is not a version"))
                    }
                    Some(_) => {}
                }
                if let Some(e) = &self.entra {
                    if e.tenant_id.is_empty()
                        || e.client_id.is_empty()
                        || e.client_secret.is_empty()
                    {
                        return bad("`entra` needs tenant_id, client_id and client_secret".into());
                    }
                    url_guard::check_base_url(&e.authority, self.allow_private_network).map_err(
                        |err| {
                            ConfigError::Invalid(format!("upstream `{id}`: entra.authority: {err}"))
                        },
                    )?;
                } else if self.api_key.is_empty() && !keyless {
                    return bad("azure_openai needs `api_key` or `entra`".into());
                }
            }
            _ if self.entra.is_some() || self.api_version.is_some() => {
                return bad("`entra` and `api_version` are for azure_openai upstreams".into())
            }
            Provider::Anthropic | Provider::Gemini | Provider::Bedrock
                if self.quirks != Quirks::default() =>
            {
                return bad("`quirks` are for OpenAI-format upstreams".into())
            }
            Provider::Bedrock => check_bedrock(self).map_err(fail)?,
            Provider::Gemini => {
                check_gemini(self, models).map_err(fail)?;
                if let Some(v) = &self.vertex {
                    let account = ServiceAccount::load(&v.credentials_file).map_err(fail)?;
                    url_guard::check_base_url(&account.token_uri, self.allow_private_network)
                        .map_err(|e| fail(format!("the service account's token_uri: {e}")))?;
                }
            }
            _ if self.api_key.is_empty() && !keyless => {
                return bad(
                    "`api_key` is empty (a keyless local server: quirks = { auth = \"none\" })"
                        .into(),
                )
            }
            _ => {}
        }
        Ok(())
    }
}

/// An absent secret: empty.
impl Default for Secret {
    fn default() -> Self {
        Secret(SecretString::from(String::new()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSettings>,
    pub upstreams: Vec<UpstreamSettings>,
    pub models: Vec<ModelSettings>,
    pub quota: QuotaSettings,
    pub ratelimit: RateLimitSettings,
    pub queue: QueueSettings,
    pub retry: RetrySettings,
    pub breaker: BreakerSettings,
    pub cache: CacheSettings,
    pub upstream: UpstreamTimeouts,
    pub alerts: AlertSettings,
    pub backup: BackupSettings,
    pub responses: ResponsesSettings,
    pub finance: FinanceSettings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcSettings>,
    pub tracing: TracingSettings,
    /// Not a config key: `serve --ladder`, for the benchmark only.
    #[serde(skip)]
    pub ladder: Ladder,
}

impl Settings {
    /// Checks every cross-reference, every price and every upstream URL.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.server.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid(format!(
                "server.listen `{}` is not an address:port",
                self.server.listen
            ));
        }
        crate::client_addr::ClientAddr::new(&self.server.trusted_proxies)
            .map_err(ConfigError::Invalid)?;
        if self.server.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes must be at least 1024".into());
        }
        if !(1..=3600).contains(&self.server.body_timeout_seconds) {
            return invalid("server.body_timeout_seconds must be between 1 and 3600".into());
        }
        if let Some(oidc) = &self.oidc {
            oidc.validate()?;
        }
        self.tracing.validate()?;
        self.queue.validate().map_err(ConfigError::Invalid)?;
        if !self.database.url.starts_with("sqlite://") && self.database_postgres_url().is_none() {
            return invalid(format!(
                "database.url `{}` must start with sqlite:// or postgres://",
                self.database.masked_url()
            ));
        }
        if self.database.key_file.is_some() && self.database_postgres_url().is_none() {
            return invalid(
                "database.key_file is for a postgres:// database (hosts sharing one key); with sqlite:// the key \
                 file sits beside the database file"
                    .into(),
            );
        }
        // 0 would free a streaming probe's slot at its 200: a half-open key would take probe
        // after probe (s27 late attack L3).
        if self.breaker.half_open_max_wait_seconds == 0 {
            return invalid("breaker.half_open_max_wait_seconds must be at least 1".into());
        }
        if self.quota.input_margin_ratio < 1.0 || !self.quota.input_margin_ratio.is_finite() {
            return invalid("quota.input_margin_ratio must be at least 1.0".into());
        }
        if !matches!(self.quota.synchronous.as_str(), "normal" | "full") {
            return invalid("quota.synchronous must be \"normal\" or \"full\"".into());
        }
        self.finance.validate()?;
        if self.quota.alert_threshold_percent > 100 {
            return invalid("quota.alert_threshold_percent must be at most 100".into());
        }
        if !matches!(self.cache.mode.as_str(), "deterministic" | "all" | "off") {
            return invalid("cache.mode must be deterministic, all or off".into());
        }
        if !matches!(self.cache.scope.as_str(), "team" | "token" | "global") {
            return invalid("cache.scope must be team, token or global".into());
        }
        let max_ttl = MAX_CACHE_TTL_SECONDS as u64;
        if !(1..=max_ttl).contains(&self.cache.default_ttl_seconds) {
            return invalid(format!(
                "cache.default_ttl_seconds must be from 1 to {max_ttl} (one year)"
            ));
        }
        if !(0.0..=1.0).contains(&self.cache.similarity_threshold) {
            return invalid("cache.similarity_threshold must be between 0 and 1".into());
        }
        match self.cache.embedder.as_str() {
            "lexical" => {}
            "http" => {
                url_guard::check_base_url(
                    &self.cache.http_url,
                    self.cache.http_allow_private_network,
                )
                .map_err(|e| ConfigError::UpstreamUrl("cache.http_url".into(), e))?;
                if self.cache.http_model.is_empty() {
                    return invalid("cache.http_model is required with embedder = \"http\"".into());
                }
            }
            other => return invalid(format!("cache.embedder `{other}` must be lexical or http")),
        }
        for w in &self.alerts.webhooks {
            if !matches!(
                w.format.as_str(),
                "generic" | "slack" | "dingtalk" | "wecom"
            ) {
                return invalid(format!(
                    "alert webhook format `{}` must be generic, slack, dingtalk or wecom",
                    w.format
                ));
            }
            // Webhook receivers are often on the operator's own network: private
            // addresses are allowed, metadata ones never (and DNS is checked again at
            // delivery, `ops::alerts`).
            match url_guard::check_webhook_url(w.url.expose()) {
                Ok(()) => {}
                Err(UrlGuardError::Forbidden) => {
                    return invalid(
                        "alert webhook url points at a metadata, link-local, unspecified, \
                         multicast or reserved address"
                            .into(),
                    )
                }
                Err(_) => return invalid("alert webhook url must be an http(s) URL".into()),
            }
        }
        if self.ratelimit.expected_replicas == 0 {
            return invalid("ratelimit.expected_replicas must be at least 1".into());
        }
        if self.upstream.first_byte_timeout_ms == 0 || self.upstream.stream_idle_timeout_ms == 0 {
            return invalid(
                "upstream.first_byte_timeout_ms and upstream.stream_idle_timeout_ms must be positive"
                    .into(),
            );
        }
        if self.ratelimit.window_seconds == 0 || self.ratelimit.redis_timeout_ms == 0 {
            return invalid(
                "ratelimit.window_seconds and ratelimit.redis_timeout_ms must be positive".into(),
            );
        }
        if let Some(r) = &self.redis {
            r.topology()?;
        }
        let mut ids = HashSet::new();
        for u in &self.upstreams {
            if u.id.is_empty() || !ids.insert(u.id.as_str()) {
                return invalid(format!("upstream id `{}` is empty or repeated", u.id));
            }
            let models: Vec<&str> = (self.models.iter().flat_map(|m| &m.routes))
                .filter(|r| r.upstream == u.id)
                .map(|r| r.model.as_str())
                .collect();
            u.check_kind(&models)?;
            url_guard::check_base_url(&u.effective_base_url(), u.allow_private_network)
                .map_err(|e| ConfigError::UpstreamUrl(u.id.clone(), e))?;
        }
        let mut names = HashSet::new();
        for m in &self.models {
            for n in std::iter::once(&m.name).chain(&m.aliases) {
                if n.is_empty() || !names.insert(n.as_str()) {
                    return invalid(format!("model name `{n}` is empty or repeated"));
                }
            }
            if m.routes.is_empty() {
                return invalid(format!("model `{}` has no routes", m.name));
            }
            for r in &m.routes {
                if !ids.contains(r.upstream.as_str()) {
                    return invalid(format!(
                        "model `{}` routes to unknown upstream `{}`",
                        m.name, r.upstream
                    ));
                }
                let azure = self
                    .upstreams
                    .iter()
                    .any(|u| u.id == r.upstream && u.provider == Provider::AzureOpenai);
                if r.deployment
                    .as_deref()
                    .is_some_and(|d| d.is_empty() || !azure)
                {
                    return invalid(format!(
                        "model `{}`: a route's `deployment` names an Azure deployment: only on an \
                         azure_openai upstream, and not empty",
                        m.name
                    ));
                }
                if let Some(tier) = r.tier_model.as_deref() {
                    let table = price_table::bundled();
                    if !table.has_model(tier) {
                        return invalid(format!(
                            "model `{}`: a route's `tier_model` {tier:?} is no model of the \
                             bundled price table (the models with a long-context tier: {})",
                            m.name,
                            table.tiered_models().join(", ")
                        ));
                    }
                }
                // One path segment of Azure's URL: `.` and `..` are dropped by the URL
                // builder, which sent a chat request to deployment `chat`, operation
                // `completions`. Azure's names have neither.
                let name = r.deployment.as_deref().unwrap_or(&r.model);
                if azure && matches!(name, "." | "..") {
                    return invalid(format!(
                        "model `{}`: the Azure deployment name {name:?} (a route's `deployment`, \
                         else its `model`) is no deployment name",
                        m.name
                    ));
                }
            }
            m.config_prices()?;
            if m.max_output_tokens == 0 || m.max_input_tokens == 0 {
                return invalid(format!("model `{}`: token caps must be positive", m.name));
            }
            if m.cache_similarity_threshold
                .is_some_and(|t| !(0.0..=1.0).contains(&t))
            {
                return invalid(format!(
                    "model `{}`: cache_similarity_threshold must be between 0 and 1",
                    m.name
                ));
            }
        }
        for m in &self.models {
            for f in &m.fallbacks {
                if !names.contains(f.as_str()) || f == &m.name {
                    return invalid(format!(
                        "model `{}` falls back to unknown model `{f}`",
                        m.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The PostgreSQL URL, when `[database] url` names one (`postgres://` or
    /// `postgresql://`).
    pub fn database_postgres_url(&self) -> Option<&str> {
        let url = self.database.url.as_str();
        (url.starts_with("postgres://") || url.starts_with("postgresql://")).then_some(url)
    }

    /// The SQLite file this config points at (`sqlite://rel` or `sqlite:///abs`).
    pub fn database_path(&self) -> PathBuf {
        let rest = self.database.url.trim_start_matches("sqlite://");
        PathBuf::from(rest.split('?').next().unwrap_or(rest))
    }

    /// The effective configuration as TOML, every secret masked.
    pub fn to_masked_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::quota::pricing::Prices;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_without_file() {
        let s = load_from(None, &env(&[])).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:8080");
        assert_eq!(s.database.url, "sqlite://data/sluice.db");
        assert!(s.upstreams.is_empty());
        s.validate().unwrap();
    }

    #[test]
    fn env_overrides_and_var_expansion() {
        let text = r#"
[[upstreams]]
id = "a"
provider = "openai"
base_url = "https://api.openai.com/v1"
api_key = "${KEY_A}"
"#;
        let s = load_from(
            Some(text),
            &env(&[
                ("KEY_A", "sk-secret-abcdefgh1234"),
                ("SLUICE_SERVER_LISTEN", "0.0.0.0:9000"),
                ("SLUICE_QUOTA_INPUT_MARGIN_RATIO", "1.5"),
            ]),
        )
        .unwrap();
        assert_eq!(s.server.listen, "0.0.0.0:9000");
        assert_eq!(s.quota.input_margin_ratio, 1.5);
        assert_eq!(s.upstreams[0].api_key.expose(), "sk-secret-abcdefgh1234");
        let printed = s.to_masked_toml();
        assert!(printed.contains("****1234"));
        assert!(!printed.contains("sk-secret"));
    }

    /// Absent reserves take their defaults, which fit a small gate; reserves leaving LOW no
    /// slot are refused by name (with the defaults fixed at 8, `max_in_flight = 8` left no
    /// unreserved slot and every request without a priority waited until refused).
    #[test]
    fn queue_reserves_default_to_fit_the_gate_and_must_leave_low_a_slot() {
        let load = |queue: &str| load_from(Some(&format!("[queue]\n{queue}\n")), &env(&[]));
        let reserves = |queue: &str| load(queue).unwrap().queue.reserves();
        assert_eq!(reserves(""), [8, 8, 0, 0]);
        load("max_in_flight = 8").unwrap().validate().unwrap();
        assert_eq!(reserves("max_in_flight = 8"), [1, 1, 0, 0]);
        assert_eq!(reserves("max_in_flight = 4"), [0, 0, 0, 0]);
        assert_eq!(reserves("max_in_flight = 1000"), [8, 8, 0, 0]);
        assert_eq!(reserves("reserved = { normal = 2 }"), [8, 8, 2, 0]);
        // Absent reserves fit in what the written ones leave, one slot unreserved.
        assert_eq!(reserves("reserved = { critical = 60 }"), [60, 3, 0, 0]);
        load("reserved = { critical = 60 }")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(
            reserves("max_in_flight = 8\nreserved = { high = 7 }"),
            [0, 7, 0, 0]
        );
        // The seed's platform example: every slot reserved, LOW keeping its own.
        assert_eq!(
            reserves(
                "max_in_flight = 20\nreserved = { critical = 5, high = 10, normal = 4, low = 1 }"
            ),
            [5, 10, 4, 1]
        );
        for queue in [
            "max_in_flight = 16\nreserved = { critical = 8, high = 8 }",
            "max_in_flight = 8\nreserved = { critical = 8, high = 8 }",
            "max_in_flight = 0",
            "reserved = { critical = 4294967295, high = 4294967295 }",
        ] {
            let e = load(queue).unwrap().validate().unwrap_err().to_string();
            assert!(
                e.contains("queue.reserved") && e.contains("max_in_flight"),
                "{queue}: {e}"
            );
        }
        let env_only = load_from(None, &env(&[("SLUICE_QUEUE_MAX_IN_FLIGHT", "8")])).unwrap();
        assert_eq!(env_only.queue.reserves(), [1, 1, 0, 0]);
    }

    #[test]
    fn unknown_fields_and_missing_vars_are_refused() {
        assert!(load_from(Some("[server]\nlisten_addr = \"x\""), &env(&[])).is_err());
        assert!(matches!(
            load_from(Some("[redis]\nurl = \"${NOPE}\""), &env(&[])),
            Err(ConfigError::MissingVar(_))
        ));
    }

    #[test]
    fn prices_are_integer_micros() {
        let text = r#"
[[upstreams]]
id = "a"
provider = "openai"
base_url = "https://api.openai.com/v1"
api_key = "k"
[[models]]
name = "m"
routes = [{ upstream = "a", model = "m" }]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.6
"#;
        let s = load_from(Some(text), &env(&[])).unwrap();
        s.validate().unwrap();
        assert_eq!(
            s.models[0].price.prices("m").unwrap(),
            Some(Prices::plain(150_000, 600_000))
        );
    }

    /// A forecast horizon past a year is refused at load: near `u32::MAX` days it was past
    /// the calendar's end, and the hourly forecast check stopped at its first date.
    #[test]
    fn a_forecast_horizon_past_a_year_is_refused() {
        for (days, ok) in [(366, true), (367, false), (200_000_000, false)] {
            let text = format!("[finance]\nforecast_alert_days = {days}\n");
            let s = load_from(Some(&text), &env(&[])).unwrap();
            assert_eq!(s.validate().is_ok(), ok, "{days}");
        }
        // A half-open probe's maximum wait of 0 would free a streaming probe at its 200.
        for (wait, ok) in [(0, false), (1, true)] {
            let text = format!("[breaker]\nhalf_open_max_wait_seconds = {wait}\n");
            let s = load_from(Some(&text), &env(&[])).unwrap();
            assert_eq!(s.validate().is_ok(), ok, "{wait}");
        }
        // The server tools' defaults: their product is reserved, so both are bounded.
        for (knob, value, ok) in [
            ("max_server_tool_calls", 100_u64, true),
            ("max_server_tool_calls", 101, false),
            ("max_server_tool_calls", 0, false),
            ("server_tool_input_tokens_per_call", 1_000_000, true),
            ("max_tag_keys_per_day", 10_000, true),
            ("max_tag_keys_per_day", 10_001, false),
            ("max_tag_keys_per_day", 0, false),
            (
                "server_tool_input_tokens_per_call",
                4_000_000_000_u64,
                false,
            ),
            ("document_tokens_per_page", 100_000, true),
            ("document_tokens_per_page", 100_001, false),
            ("document_tokens_per_page", 0, false),
        ] {
            let text = format!("[finance]\n{knob} = {value}\n");
            let s = load_from(Some(&text), &env(&[])).unwrap();
            assert_eq!(s.validate().is_ok(), ok, "{knob} = {value}");
        }
    }

    /// Timeouts of 0 are refused at load: a stream idle timeout of 0 cut every stream at its
    /// first event and failed every non-streamed body (s30 streams attack, low note); a
    /// body timeout is 1 s to an hour.
    #[test]
    fn a_zero_timeout_is_refused() {
        for (section, knob, value, ok) in [
            ("upstream", "stream_idle_timeout_ms", 0, false),
            ("upstream", "stream_idle_timeout_ms", 1, true),
            ("upstream", "first_byte_timeout_ms", 0, false),
            ("server", "body_timeout_seconds", 0, false),
            ("server", "body_timeout_seconds", 3600, true),
            ("server", "body_timeout_seconds", 3601, false),
        ] {
            let text = format!("[{section}]\n{knob} = {value}\n");
            let s = load_from(Some(&text), &env(&[])).unwrap();
            match s.validate() {
                Ok(()) => assert!(ok, "{knob} = {value} accepted"),
                Err(e) => {
                    assert!(!ok, "{knob} = {value} refused: {e}");
                    assert!(e.to_string().contains(knob), "{e}");
                }
            }
        }
    }

    /// The spend rollup's bound on distinct tag texts per day and tenant
    /// (`store::tag_bound`): 1 to 1 000 000, 1 000 by default, and a refusal names the key.
    #[test]
    fn the_tag_sets_bound_is_checked_and_named() {
        let s = load_from(Some("[finance]\n"), &env(&[])).unwrap();
        assert_eq!(s.finance.max_tag_sets_per_day, 1000);
        for (value, ok) in [(1, true), (1_000_000, true), (0, false), (1_000_001, false)] {
            let text = format!("[finance]\nmax_tag_sets_per_day = {value}\n");
            let s = load_from(Some(&text), &env(&[])).unwrap();
            match s.validate() {
                Ok(()) => assert!(ok, "{value} accepted"),
                Err(e) => {
                    assert!(!ok, "{value} refused: {e}");
                    assert!(
                        e.to_string().contains("finance.max_tag_sets_per_day"),
                        "{e}"
                    );
                }
            }
        }
    }

    /// The example config (with its price keys and `[finance]`) loads and validates.
    #[test]
    fn the_example_config_loads() {
        let text = include_str!("../../sluice.example.toml");
        let keys = [
            ("OPENAI_API_KEY", "k"),
            ("ANTHROPIC_API_KEY", "k"),
            ("AZURE_OPENAI_API_KEY", "k"),
        ];
        let s = load_from(Some(text), &env(&keys)).unwrap();
        s.validate().unwrap();
        assert_eq!(s.finance.max_server_tool_calls, 5);
        let haiku = s.models.iter().find(|m| m.name == "claude-haiku").unwrap();
        let p = haiku.price.prices("claude-haiku").unwrap().unwrap();
        assert_eq!(
            (p.cache_write_1h, p.web_search_per_1k_calls),
            (1_600_000, 10_000_000)
        );
    }

    #[test]
    fn every_kind_has_its_price_key_and_its_default() {
        let model = |extra: &str| {
            format!(
                "[[upstreams]]\nid = \"a\"\nprovider = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\n\
                 api_key = \"k\"\n[[models]]\nname = \"m\"\nroutes = [{{ upstream = \"a\", model = \"m\" }}]\n\
                 input_usd_per_mtok = 3\noutput_usd_per_mtok = 15\n{extra}"
            )
        };
        let all = model(
            "cached_input_usd_per_mtok = 0.3\ncache_write_5m_usd_per_mtok = 3.75\n\
             cache_write_1h_usd_per_mtok = 6\nreasoning_usd_per_mtok = 16\n\
             audio_input_usd_per_mtok = 40\naudio_output_usd_per_mtok = 80\n\
             image_input_usd_per_mtok = 5\nimage_output_usd_per_mtok = 30\n\
             web_search_usd_per_1k_calls = 10\n",
        );
        let s = load_from(Some(&all), &env(&[])).unwrap();
        s.validate().unwrap();
        assert_eq!(
            s.models[0].price.prices("m").unwrap().unwrap(),
            Prices {
                input: 3_000_000,
                output: 15_000_000,
                cached_input: 300_000,
                cache_write_5m: 3_750_000,
                cache_write_1h: 6_000_000,
                reasoning: 16_000_000,
                audio_input: 40_000_000,
                audio_output: 80_000_000,
                image_input: 5_000_000,
                image_output: 30_000_000,
                web_search_per_1k_calls: 10_000_000,
            }
        );
        // One-hour writes default to the five-minute price, not to the input's.
        let s = load_from(
            Some(&model("cache_write_5m_usd_per_mtok = 3.75\n")),
            &env(&[]),
        )
        .unwrap();
        let p = s.models[0].price.prices("m").unwrap().unwrap();
        assert_eq!((p.cache_write_5m, p.cache_write_1h), (3_750_000, 3_750_000));
        assert_eq!(p.web_search_per_1k_calls, 0);
        // A bad price names its key.
        let s = load_from(
            Some(&model("web_search_usd_per_1k_calls = -1\n")),
            &env(&[]),
        )
        .unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("web_search_usd_per_1k_calls"), "{e}");
    }

    #[test]
    fn a_route_names_its_output_cap_field() {
        let route = |extra: &str| {
            format!(
                "[[models]]\nname = \"m\"\nroutes = [{{ upstream = \"a\", model = \"m\"{extra} }}]"
            )
        };
        let s = load_from(
            Some(&route(", output_cap_param = \"max_completion_tokens\"")),
            &env(&[]),
        )
        .unwrap();
        assert_eq!(
            s.models[0].routes[0].output_cap_param,
            Some(OutputCapParam::MaxCompletionTokens)
        );
        assert_eq!(
            load_from(Some(&route("")), &env(&[])).unwrap().models[0].routes[0].output_cap_param,
            None
        );
        assert!(load_from(
            Some(&route(", output_cap_param = \"max_output\"")),
            &env(&[])
        )
        .is_err());
    }
}

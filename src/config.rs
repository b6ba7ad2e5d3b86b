//! The `Settings` tree: defaults → TOML file → `${VAR}` expansion → `SLUICE_<SECTION>_<KEY>`
//! environment overrides, then `validate()` into the typed `Config` the gateway runs on.
//! Nothing opens a socket before validation has passed.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::upstream::url_guard::{self, UrlGuardError};

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
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub listen: String,
    pub max_body_bytes: usize,
    pub public_url: String,
    /// Worker threads for the HTTP server; 0 = one per core.
    pub workers: usize,
    /// On SIGTERM/SIGINT, how long in-flight requests and streams may take to finish.
    pub shutdown_timeout_seconds: u64,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 2_000_000,
            public_url: "http://127.0.0.1:8080".into(),
            workers: 0,
            shutdown_timeout_seconds: 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    pub url: String,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://data/sluice.db".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: Secret,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Openai,
    Anthropic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    pub id: String,
    pub provider: Provider,
    pub base_url: String,
    pub api_key: Secret,
    #[serde(default)]
    pub rpm_limit: u64,
    #[serde(default)]
    pub tpm_limit: u64,
    #[serde(default)]
    pub max_concurrent: u32,
    #[serde(default)]
    pub max_queue: u32,
    #[serde(default)]
    pub allow_private_network: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    pub upstream: String,
    pub model: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub routes: Vec<RouteSettings>,
    #[serde(default)]
    pub fallbacks: Vec<String>,
    #[serde(default)]
    pub input_usd_per_mtok: f64,
    #[serde(default)]
    pub output_usd_per_mtok: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_usd_per_mtok: Option<f64>,
    #[serde(default = "default_max_output")]
    pub max_output_tokens: u32,
    #[serde(default = "default_max_input")]
    pub max_input_tokens: u32,
    /// Overrides `cache.similarity_threshold` for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_similarity_threshold: Option<f64>,
}

fn default_max_output() -> u32 {
    4096
}
fn default_max_input() -> u32 {
    128_000
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaSettings {
    pub input_margin_ratio: f64,
    pub input_margin_tokens: u32,
    /// `normal` (the default, WAL-safe) or `full` (fsync every commit).
    pub synchronous: String,
    /// Percent of a budget after which answers carry `x-sluice-budget-warning`.
    pub alert_threshold_percent: u32,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            input_margin_ratio: 1.10,
            input_margin_tokens: 16,
            synchronous: "normal".into(),
            alert_threshold_percent: 80,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitSettings {
    pub redis_timeout_ms: u64,
    pub expected_replicas: u32,
    /// The window `rpm` / `tpm` limits count over (60 s: per minute).
    pub window_seconds: u64,
}

impl Default for RateLimitSettings {
    fn default() -> Self {
        Self {
            redis_timeout_ms: 50,
            expected_replicas: 1,
            window_seconds: 60,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    pub max_in_flight: u32,
    pub reserved: ReservedSlots,
    pub max_depth: u32,
    pub max_wait_seconds: u64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            reserved: ReservedSlots {
                critical: 8,
                high: 8,
                normal: 0,
                low: 0,
            },
            max_depth: 200,
            max_wait_seconds: 300,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ReservedSlots {
    pub critical: u32,
    pub high: u32,
    pub normal: u32,
    pub low: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    pub max_attempts: u32,
    pub base_delay_ms: u64,
    pub max_cooldown_seconds: u64,
    pub budget_ratio: f64,
    pub request_deadline_ms: u64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay_ms: 500,
            max_cooldown_seconds: 120,
            budget_ratio: 0.10,
            request_deadline_ms: 120_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    pub failure_threshold: u32,
    pub open_seconds: u64,
    pub half_open_probes: u32,
    pub close_after_successes: u32,
    pub half_open_max_wait_seconds: u64,
    /// Also open when at least `min_calls` calls in `window_seconds` failed at this rate.
    pub failure_rate: f64,
    pub min_calls: u32,
    pub window_seconds: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            open_seconds: 60,
            half_open_probes: 1,
            close_after_successes: 2,
            half_open_max_wait_seconds: 30,
            failure_rate: 0.5,
            min_calls: 20,
            window_seconds: 60,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSettings {
    pub mode: String,
    pub scope: String,
    pub default_ttl_seconds: u64,
    pub semantic: bool,
    pub embedder: String,
    pub similarity_threshold: f64,
    pub max_entries: u64,
    /// For `embedder = "http"`: an OpenAI-compatible base URL (with `/v1`), model and key.
    pub http_url: String,
    pub http_model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_api_key: Option<Secret>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            mode: "deterministic".into(),
            scope: "team".into(),
            default_ttl_seconds: 3600,
            semantic: true,
            embedder: "lexical".into(),
            similarity_threshold: 0.95,
            max_entries: 100_000,
            http_url: String::new(),
            http_model: String::new(),
            http_api_key: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTimeouts {
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub stream_idle_timeout_ms: u64,
    /// Largest non-streamed upstream body read into memory.
    pub max_response_bytes: usize,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 5000,
            first_byte_timeout_ms: 60_000,
            stream_idle_timeout_ms: 60_000,
            max_response_bytes: 16 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertSettings {
    pub webhooks: Vec<WebhookSettings>,
    /// One alert per condition per this many seconds.
    pub cooloff_seconds: u64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            webhooks: vec![],
            cooloff_seconds: 600,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    pub url: Secret,
    #[serde(default = "default_webhook_format")]
    pub format: String,
}

fn default_webhook_format() -> String {
    "generic".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupSettings {
    pub interval_hours: u64,
    pub keep: u32,
    pub dir: String,
}

impl Default for BackupSettings {
    fn default() -> Self {
        Self {
            interval_hours: 24,
            keep: 7,
            dir: "backup".into(),
        }
    }
}

/// Where the settings come from: the file named by `--config` / `SLUICE_CONFIG` (must exist),
/// else `sluice.toml` when present, else the embedded defaults.
pub fn load(explicit: Option<&Path>) -> Result<Settings, ConfigError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let path = explicit
        .map(Path::to_path_buf)
        .or_else(|| env.get("SLUICE_CONFIG").map(PathBuf::from));
    let text = match &path {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| ConfigError::Read(p.clone(), e))?),
        None => std::fs::read_to_string("sluice.toml").ok(),
    };
    load_from(text.as_deref(), &env)
}

/// The pure part of `load`, for tests: text of the file (if any) and the environment.
pub fn load_from(
    text: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<Settings, ConfigError> {
    let mut root = match text {
        Some(t) => t
            .parse::<toml::Table>()
            .map_err(|e| ConfigError::Parse(e.to_string()))?,
        None => toml::Table::new(),
    };
    expand_vars(&mut root, env)?;
    apply_env_overrides(&mut root, env)?;
    let mut settings: Settings = toml::Value::Table(root)
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
    if text.is_none() && settings.upstreams.is_empty() {
        add_env_upstreams(&mut settings, env);
    }
    Ok(settings)
}

fn expand_vars(table: &mut toml::Table, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (_, value) in table.iter_mut() {
        expand_value(value, env)?;
    }
    Ok(())
}

fn expand_value(
    value: &mut toml::Value,
    env: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) if s.contains("${") => *s = expand_str(s, env)?,
        toml::Value::Array(items) => {
            for item in items {
                expand_value(item, env)?;
            }
        }
        toml::Value::Table(t) => expand_vars(t, env)?,
        _ => {}
    }
    Ok(())
}

fn expand_str(s: &str, env: &BTreeMap<String, String>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| ConfigError::Parse(format!("unclosed ${{ in `{s}`")))?;
        let name = &after[..end];
        let val = env
            .get(name)
            .ok_or_else(|| ConfigError::MissingVar(name.to_string()))?;
        out.push_str(val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Sections whose scalar keys may be overridden from the environment.
const SECTIONS: &[&str] = &[
    "server",
    "database",
    "redis",
    "quota",
    "ratelimit",
    "queue",
    "retry",
    "breaker",
    "cache",
    "upstream",
    "backup",
];
/// `SLUICE_*` variables that are not section overrides.
const NON_OVERRIDES: &[&str] = &[
    "SLUICE_CONFIG",
    "SLUICE_SECRET_KEY",
    "SLUICE_LOG",
    "SLUICE_ADMIN_PASSWORD",
];

fn apply_env_overrides(
    root: &mut toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SLUICE_") else {
            continue;
        };
        if NON_OVERRIDES.contains(&name.as_str()) {
            continue;
        }
        let Some((section, key)) = rest.split_once('_') else {
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        if !SECTIONS.contains(&section.as_str()) {
            tracing::warn!(variable = %name, "ignoring environment variable: no such config section");
            continue;
        }
        let entry = root
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(t) = entry else {
            return Err(ConfigError::Invalid(format!("`{section}` must be a table")));
        };
        t.insert(key, parse_scalar(raw));
    }
    Ok(())
}

/// `50` → integer, `true` → bool, `0.9` → float, anything else → string.
fn parse_scalar(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| {
            !matches!(
                v,
                toml::Value::Table(_) | toml::Value::Array(_) | toml::Value::Datetime(_)
            )
        })
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// With no config file, real provider keys from the environment configure real upstreams.
fn add_env_upstreams(settings: &mut Settings, env: &BTreeMap<String, String>) {
    let model = |name: &str, upstream: &str, input: f64, output: f64| ModelSettings {
        name: name.into(),
        aliases: vec![],
        routes: vec![RouteSettings {
            upstream: upstream.into(),
            model: name.into(),
        }],
        fallbacks: vec![],
        input_usd_per_mtok: input,
        output_usd_per_mtok: output,
        cached_input_usd_per_mtok: None,
        max_output_tokens: 4096,
        max_input_tokens: 128_000,
        cache_similarity_threshold: None,
    };
    let upstream = |id: &str, provider, base_url: &str, key: &String| UpstreamSettings {
        id: id.into(),
        provider,
        base_url: base_url.into(),
        api_key: Secret(SecretString::from(key.clone())),
        rpm_limit: 0,
        tpm_limit: 0,
        max_concurrent: 0,
        max_queue: 0,
        allow_private_network: false,
    };
    if let Some(key) = env.get("OPENAI_API_KEY").filter(|k| !k.is_empty()) {
        settings.upstreams.push(upstream(
            "openai",
            Provider::Openai,
            "https://api.openai.com/v1",
            key,
        ));
        settings
            .models
            .push(model("gpt-4o-mini", "openai", 0.15, 0.60));
        settings.models.push(model("gpt-4o", "openai", 2.50, 10.0));
        let mut embed = model("text-embedding-3-small", "openai", 0.02, 0.0);
        embed.max_input_tokens = 8191;
        settings.models.push(embed);
    }
    if let Some(key) = env.get("ANTHROPIC_API_KEY").filter(|k| !k.is_empty()) {
        settings.upstreams.push(upstream(
            "anthropic",
            Provider::Anthropic,
            "https://api.anthropic.com",
            key,
        ));
        settings
            .models
            .push(model("claude-3-5-haiku-latest", "anthropic", 0.80, 4.0));
        settings
            .models
            .push(model("claude-sonnet-4-0", "anthropic", 3.0, 15.0));
    }
}

/// Integer micro-dollars per million tokens from a config price in USD per million tokens.
fn price_micros(field: &str, model: &str, usd: f64) -> Result<i64, ConfigError> {
    if !usd.is_finite() || usd < 0.0 || usd > 1_000_000.0 {
        return Err(ConfigError::Invalid(format!(
            "model `{model}`: `{field}` must be between 0 and 1000000"
        )));
    }
    // Prices are written with at most 6 decimals; rounding removes the binary-float noise.
    Ok((usd * 1_000_000.0).round() as i64)
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
        if self.server.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes must be at least 1024".into());
        }
        if !self.database.url.starts_with("sqlite://") {
            return invalid(format!(
                "database.url `{}` must start with sqlite://",
                self.database.url
            ));
        }
        if self.quota.input_margin_ratio < 1.0 || !self.quota.input_margin_ratio.is_finite() {
            return invalid("quota.input_margin_ratio must be at least 1.0".into());
        }
        if !matches!(self.quota.synchronous.as_str(), "normal" | "full") {
            return invalid("quota.synchronous must be \"normal\" or \"full\"".into());
        }
        if self.quota.alert_threshold_percent > 100 {
            return invalid("quota.alert_threshold_percent must be at most 100".into());
        }
        if !matches!(self.cache.mode.as_str(), "deterministic" | "all" | "off") {
            return invalid("cache.mode must be deterministic, all or off".into());
        }
        if !matches!(self.cache.scope.as_str(), "team" | "token" | "global") {
            return invalid("cache.scope must be team, token or global".into());
        }
        if !(0.0..=1.0).contains(&self.cache.similarity_threshold) {
            return invalid("cache.similarity_threshold must be between 0 and 1".into());
        }
        match self.cache.embedder.as_str() {
            "lexical" => {}
            "http" => {
                url_guard::check_base_url(&self.cache.http_url, true)
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
            if url::Url::parse(w.url.expose()).map(|u| matches!(u.scheme(), "http" | "https"))
                != Ok(true)
            {
                return invalid("alert webhook url must be an http(s) URL".into());
            }
        }
        if self.ratelimit.expected_replicas == 0 {
            return invalid("ratelimit.expected_replicas must be at least 1".into());
        }
        if self.ratelimit.window_seconds == 0 || self.ratelimit.redis_timeout_ms == 0 {
            return invalid(
                "ratelimit.window_seconds and ratelimit.redis_timeout_ms must be positive".into(),
            );
        }
        if let Some(r) = &self.redis {
            if !r.url.expose().starts_with("redis://") && !r.url.expose().starts_with("rediss://") {
                return invalid("redis.url must start with redis:// or rediss://".into());
            }
        }
        let mut ids = HashSet::new();
        for u in &self.upstreams {
            if u.id.is_empty() || !ids.insert(u.id.as_str()) {
                return invalid(format!("upstream id `{}` is empty or repeated", u.id));
            }
            url_guard::check_base_url(&u.base_url, u.allow_private_network)
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
            }
            price_micros("input_usd_per_mtok", &m.name, m.input_usd_per_mtok)?;
            price_micros("output_usd_per_mtok", &m.name, m.output_usd_per_mtok)?;
            if let Some(c) = m.cached_input_usd_per_mtok {
                price_micros("cached_input_usd_per_mtok", &m.name, c)?;
            }
            if m.max_output_tokens == 0 || m.max_input_tokens == 0 {
                return invalid(format!("model `{}`: token caps must be positive", m.name));
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

    /// Prices of a model in micro-dollars per million tokens: (input, output, cached input).
    pub fn prices(m: &ModelSettings) -> (i64, i64, i64) {
        let p = |v: f64| (v * 1_000_000.0).round() as i64;
        let input = p(m.input_usd_per_mtok);
        (
            input,
            p(m.output_usd_per_mtok),
            m.cached_input_usd_per_mtok.map(p).unwrap_or(input),
        )
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
    use super::*;

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
        assert_eq!(Settings::prices(&s.models[0]), (150_000, 600_000, 150_000));
    }
}

//! How the settings are assembled: defaults → TOML file → `${VAR}` expansion →
//! `SLUICE_<SECTION>_<KEY>` environment overrides (and, with no file, real upstreams from
//! `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use secrecy::SecretString;

use super::{
    ConfigError, ModelSettings, Provider, RouteSettings, Secret, Settings, UpstreamSettings,
};

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
    "responses",
    "finance",
    "tracing",
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
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        }],
        fallbacks: vec![],
        price: super::PriceKeys::usd(input, output),
        prices: vec![],
        free: false,
        max_output_tokens: 4096,
        max_input_tokens: 128_000,
        cache_similarity_threshold: None,
        cache_ignore_identifiers: None,
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
        ..Default::default()
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

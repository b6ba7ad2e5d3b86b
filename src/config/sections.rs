//! The config file's sections, each with the defaults DESIGN.md lists.

use serde::{Deserialize, Serialize};

use super::Secret;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    pub listen: String,
    pub max_body_bytes: usize,
    /// How long a request's whole body may take to arrive, from its head: the body is read
    /// before any window or queue counts the request, so an unbounded read let a token
    /// holder keep connections and their buffers for ever.
    pub body_timeout_seconds: u64,
    pub public_url: String,
    /// Worker threads for the HTTP server; 0 = one per core.
    pub workers: usize,
    /// On SIGTERM/SIGINT, how long in-flight requests and streams may take to finish.
    pub shutdown_timeout_seconds: u64,
    /// Reverse proxies whose `X-Forwarded-For` is believed (addresses or CIDR ranges);
    /// empty: the socket's peer is the client (`client_addr.rs`). From the environment
    /// (`SLUICE_SERVER_TRUSTED_PROXIES`), one string of comma-separated entries.
    #[serde(deserialize_with = "list_or_commas")]
    pub trusted_proxies: Vec<String>,
}

/// A list, or one string of comma-separated entries (an environment override is a string).
fn list_or_commas<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entries {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Entries::deserialize(d)? {
        Entries::List(list) => list,
        Entries::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect(),
    })
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 2_000_000,
            body_timeout_seconds: 60,
            public_url: "http://127.0.0.1:8080".into(),
            workers: 0,
            shutdown_timeout_seconds: 30,
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[database]`: `sqlite://path` (the embedded default) or `postgres://user:pass@host/db`
/// (several hosts on one database). Printed (`check-config`, `Debug`) with the URL's
/// password masked.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    pub url: String,
    /// PostgreSQL only: a file holding the master key every host shares (64 hex digits,
    /// mode 0600), when `SLUICE_SECRET_KEY` is not set. It is never created: each host must
    /// hold the same key, so the operator makes it once and gives it to each.
    pub key_file: Option<std::path::PathBuf>,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://data/sluice.db".into(),
            key_file: None,
        }
    }
}

impl DatabaseSettings {
    /// The URL with its password (if any) masked: the user part's and any query parameter
    /// naming one (sqlx reads `?password=`). A URL that does not parse shows its scheme
    /// only: where its password would be is not known.
    pub fn masked_url(&self) -> String {
        let Ok(mut u) = url::Url::parse(&self.url) else {
            return match self.url.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://**** (not a valid URL)"),
                None => "**** (not a valid URL)".into(),
            };
        };
        if u.password().is_some() {
            let _ = u.set_password(Some("****"));
        }
        if u.query().is_some() {
            let pairs: Vec<(String, String)> = u
                .query_pairs()
                .map(|(k, v)| {
                    let secret = k.to_ascii_lowercase().contains("password");
                    (
                        k.into_owned(),
                        if secret {
                            "****".into()
                        } else {
                            v.into_owned()
                        },
                    )
                })
                .collect();
            u.query_pairs_mut().clear().extend_pairs(pairs);
        }
        u.to_string()
    }
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &self.masked_url())
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl Serialize for DatabaseSettings {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("DatabaseSettings", 2)?;
        st.serialize_field("url", &self.masked_url())?;
        if let Some(k) = &self.key_file {
            st.serialize_field("key_file", k)?;
        }
        st.end()
    }
}

/// `[redis]`: one server (`url`), a Redis Cluster (`url` lists seed nodes, comma-separated,
/// with `cluster = true`) or a master found through Sentinel (`sentinels` + `master_name`).
/// `super::redis` validates it into a [`super::RedisTopology`].
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    #[serde(default, skip_serializing_if = "Secret::is_empty")]
    pub url: Secret,
    #[serde(default)]
    pub cluster: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sentinels: Vec<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    /// The password of the master (and its replicas) under Sentinel, when they require one
    /// (`requirepass`); the sentinels' own passwords go in their URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_password: Option<Secret>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    #[default]
    Openai,
    Anthropic,
    /// Azure OpenAI: deployments in the path, `api-version`, `api-key` or Entra ID.
    AzureOpenai,
    /// vLLM, Ollama, llama.cpp, DeepSeek, Groq, Mistral: OpenAI's format with `quirks`.
    OpenaiCompatible,
    /// Google's `generateContent`: the Gemini API (`api_key`) or Vertex AI (`vertex`).
    Gemini,
    /// AWS Bedrock's Converse API (`upstream::providers::bedrock`).
    Bedrock,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::AzureOpenai => "azure_openai",
            Provider::OpenaiCompatible => "openai_compatible",
            Provider::Gemini => "gemini",
            Provider::Bedrock => "bedrock",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    pub id: String,
    pub provider: Provider,
    /// Required, except for `gemini` and `bedrock`, whose defaults are Google's and the
    /// region's runtime endpoint (`effective_base_url`).
    #[serde(default)]
    pub base_url: String,
    /// Absent for a keyless local server (`quirks.auth = "none"`), Azure with `entra`, a
    /// `gemini` upstream on Vertex AI (`vertex`), which signs in with a service account, or
    /// a `bedrock` upstream signing with SigV4; on `bedrock`, a Bedrock API key (sent as a
    /// bearer token) instead of SigV4.
    #[serde(default)]
    pub api_key: Secret,
    /// `gemini` on Vertex AI: `vertex = { project, location, credentials_file }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex: Option<VertexSettings>,
    /// `bedrock` only: the AWS region and SigV4 credentials (`config::check_bedrock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<Secret>,
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
    /// `azure_openai`: a dated version (`2024-10-21`: the classic deployment path) or `v1`
    /// (the v1 GA path, `/openai/v1/…`, no version); `preview` (v1 path) likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `azure_openai`: Entra ID client credentials instead of the `api-key` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entra: Option<EntraSettings>,
    /// OpenAI-format servers that differ from OpenAI (`openai_compatible` mostly).
    #[serde(default)]
    pub quirks: Quirks,
    /// The provider's account this key bills to, as its cost export names it (an OpenAI
    /// project or API key id, an Anthropic workspace id): `sluice reconcile` compares
    /// per account. Absent: the account `*` (every key no other upstream names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_account: Option<String>,
}

impl UpstreamSettings {
    /// `base_url`, or the provider's default when it has one and none is given: Google's
    /// for `gemini`, the region's runtime endpoint for `bedrock`.
    pub fn effective_base_url(&self) -> String {
        match (self.provider, self.region.as_deref()) {
            _ if !self.base_url.is_empty() => self.base_url.clone(),
            (Provider::Gemini, _) => super::gemini_base_url(self.vertex.as_ref()),
            (Provider::Bedrock, Some(region)) => super::bedrock_base_url(region),
            _ => self.base_url.clone(),
        }
    }
}

/// A Vertex AI project and region, and the service-account JSON key file to sign in with
/// (its private key stays in that file and in memory; only the path is shown).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VertexSettings {
    pub project: String,
    /// A region (`us-central1`, `europe-west4`…) or `global`.
    pub location: String,
    pub credentials_file: std::path::PathBuf,
}

/// Entra ID (Azure AD) client credentials: a token from
/// `{authority}/{tenant_id}/oauth2/v2.0/token` for `scope`, sent as `Authorization: Bearer`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EntraSettings {
    pub tenant_id: String,
    pub client_id: String,
    pub client_secret: Secret,
    #[serde(default = "default_entra_authority")]
    pub authority: String,
    #[serde(default = "default_entra_scope")]
    pub scope: String,
}

fn default_entra_authority() -> String {
    "https://login.microsoftonline.com".into()
}
fn default_entra_scope() -> String {
    "https://cognitiveservices.azure.com/.default".into()
}

/// How an OpenAI-format server differs from OpenAI's API.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Quirks {
    /// Ask streams for a usage chunk (`stream_options.include_usage`). `false` for servers
    /// that refuse `stream_options`: nothing of it is sent, and the output is counted from
    /// the deltas (a usage chunk the server sends anyway is still preferred).
    pub include_usage: bool,
    /// The field the output cap goes in for every route of this upstream (a route's own
    /// `output_cap_param` wins); absent: `max_tokens` on `openai_compatible`, else by the
    /// model's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_field: Option<OutputCapParam>,
    /// `bearer` (`Authorization: Bearer <api_key>`) or `none` (no credential header at all:
    /// a local server).
    pub auth: AuthMode,
    /// `openai_compatible` only: which of the billed router fields (`BILLED_ROUTER_FIELDS`)
    /// a client may send this upstream. Absent: none — a request carrying one is refused
    /// with a 400 naming it (`pipeline::kinds::billed_router_fields`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub billed_fields: Vec<String>,
}

/// Body fields an OpenAI-compatible router (OpenRouter and the like) passes through and
/// bills beyond the route's token prices: `plugins` (web search, PDF parsing — fees per
/// call), `models` (a fallback to other, maybe dearer, models) and `provider` (routing
/// among the model's providers at their own prices). Sluice prices none of them.
pub const BILLED_ROUTER_FIELDS: [&str; 3] = ["plugins", "models", "provider"];

/// The `BILLED_ROUTER_FIELDS` an upstream allows, one bit each (the catalog keeps its
/// deployments small).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BilledFields(u8);

impl BilledFields {
    /// The fields of `names` that are billed router fields.
    pub fn of(names: &[String]) -> BilledFields {
        let bits = BILLED_ROUTER_FIELDS
            .iter()
            .enumerate()
            .filter(|(_, f)| names.iter().any(|n| n == *f))
            .fold(0u8, |bits, (i, _)| bits | (1 << i));
        BilledFields(bits)
    }

    /// Whether `field` (one of `BILLED_ROUTER_FIELDS`) is allowed.
    pub fn allows(self, field: &str) -> bool {
        BILLED_ROUTER_FIELDS
            .iter()
            .position(|f| *f == field)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

impl Default for Quirks {
    fn default() -> Self {
        Self {
            include_usage: true,
            max_tokens_field: None,
            auth: AuthMode::Bearer,
            billed_fields: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    #[default]
    Bearer,
    None,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    pub upstream: String,
    pub model: String,
    /// `azure_openai`: the deployment's name (in the URL, and the body's `model` on the v1
    /// path); absent, `model` is the deployment's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The body field that carries the output cap for this upstream model; absent, it
    /// follows from the model's name (`OutputCapParam::for_model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_cap_param: Option<OutputCapParam>,
    /// The bundled model whose long-context tier this route is billed at (its name in the
    /// bundled price table, `claude-sonnet-4-5`): for an upstream name no bundled model
    /// matches (a Bedrock ARN, a custom deployment) served under a gateway name that says
    /// nothing (`smart`). Absent, the tier follows the route's names
    /// (`price_table::Table::route_tiers`). A name not in the table is refused at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_model: Option<String>,
}

/// How an OpenAI-format upstream model takes its output cap. OpenAI's reasoning models
/// (o1, o3, o4…, the gpt-5 family) refuse `max_tokens` and want `max_completion_tokens`;
/// other models and OpenAI-compatible servers (vLLM, Ollama, llama.cpp) take `max_tokens`.
/// Anthropic upstreams always take `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputCapParam {
    MaxTokens,
    MaxCompletionTokens,
}

impl OutputCapParam {
    /// The default for an upstream model name: o-series and gpt-5* take
    /// `max_completion_tokens`. A provider prefix (`openai/o3-mini`) is ignored.
    pub fn for_model(upstream_model: &str) -> OutputCapParam {
        let name = upstream_model.rsplit('/').next().unwrap_or(upstream_model);
        let o_series = name
            .strip_prefix('o')
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
        if o_series || name.starts_with("gpt-5") {
            OutputCapParam::MaxCompletionTokens
        } else {
            OutputCapParam::MaxTokens
        }
    }

    pub fn field(self) -> &'static str {
        match self {
            OutputCapParam::MaxTokens => "max_tokens",
            OutputCapParam::MaxCompletionTokens => "max_completion_tokens",
        }
    }
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
    /// The price keys at the model's top level: in force from the beginning (until a
    /// dated entry of `prices` replaces them).
    #[serde(flatten)]
    pub price: PriceKeys,
    /// `[[models.prices]]`: prices from a date on (`effective`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prices: Vec<DatedPrices>,
    /// Costs nothing, said on purpose: without a price a model is refused
    /// (`Settings::check_priced`), never priced at zero.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free: bool,
    #[serde(default = "default_max_output")]
    pub max_output_tokens: u32,
    #[serde(default = "default_max_input")]
    pub max_input_tokens: u32,
    /// Overrides `cache.similarity_threshold` for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_similarity_threshold: Option<f64>,
    /// Overrides `cache.ignore_identifiers` for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ignore_identifiers: Option<bool>,
}

/// A price in USD as the config writes it: a number (`0.15`) or a decimal string (`"0.15"`,
/// read exactly, as the bundled table's are).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    untagged,
    expecting = "a price in USD: a number (0.15) or a decimal string (\"0.15\")"
)]
pub enum Usd {
    Text(String),
    Number(f64),
}

impl From<f64> for Usd {
    fn from(v: f64) -> Self {
        Usd::Number(v)
    }
}

/// The price keys of one price: a model's top level, a dated entry (`DatedPrices`), an admin
/// edit and a bundled table entry all hold these, and all are read by one function
/// (`PriceKeys::prices`). A new kind of price is one more key here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct PriceKeys {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_usd_per_mtok: Option<Usd>,
    /// Absent: the input price (cached input never costs more than input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_usd_per_mtok: Option<Usd>,
    /// The prices of the other token kinds and of web search; each defaults as
    /// `PriceKeys::prices` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_5m_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_input_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_output_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_input_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_output_usd_per_mtok: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_usd_per_1k_calls: Option<Usd>,
}

impl PriceKeys {
    /// Input and output prices in USD per million tokens.
    pub fn usd(input: f64, output: f64) -> PriceKeys {
        PriceKeys {
            input_usd_per_mtok: Some(input.into()),
            output_usd_per_mtok: Some(output.into()),
            ..PriceKeys::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == PriceKeys::default()
    }

    /// Every key's value, in the order of the fields.
    pub fn values(&self) -> [&Option<Usd>; 11] {
        [
            &self.input_usd_per_mtok,
            &self.output_usd_per_mtok,
            &self.cached_input_usd_per_mtok,
            &self.cache_write_5m_usd_per_mtok,
            &self.cache_write_1h_usd_per_mtok,
            &self.reasoning_usd_per_mtok,
            &self.audio_input_usd_per_mtok,
            &self.audio_output_usd_per_mtok,
            &self.image_input_usd_per_mtok,
            &self.image_output_usd_per_mtok,
            &self.web_search_usd_per_1k_calls,
        ]
    }
}

/// `[[models.prices]]`: a price in force from `effective` (`2026-03-01`, midnight UTC, or an
/// RFC 3339 instant) until a later entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatedPrices {
    pub effective: String,
    #[serde(flatten)]
    pub keys: PriceKeys,
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
            reserved: ReservedSlots::default(),
            max_depth: 200,
            max_wait_seconds: 300,
        }
    }
}

impl QueueSettings {
    /// Each priority's reserve (CRITICAL first), an absent one at its default: CRITICAL and
    /// HIGH 8 each but at most an eighth of `max_in_flight` (8 of the default 64), NORMAL and
    /// LOW none. Fixed at 8, the defaults took a smaller gate whole (`max_in_flight = 8`: no
    /// unreserved slot), and NORMAL — every request without a priority — waited out every
    /// request; an absent key beside a written one was 0.
    ///
    /// An absent reserve also fits in what the written ones leave, one slot kept unreserved:
    /// `reserved = { critical = 60 }` of 64 slots is 60 + 3, not 60 + 8 refused for a
    /// `high` nobody wrote.
    pub fn reserves(&self) -> [u32; 4] {
        let share = (self.max_in_flight / 8).min(8);
        let r = &self.reserved;
        let written = [r.critical, r.high, r.normal, r.low];
        let mut room = self
            .max_in_flight
            .saturating_sub(
                written
                    .iter()
                    .flatten()
                    .fold(0u32, |a, r| a.saturating_add(*r)),
            )
            .saturating_sub(1);
        let mut default = |given: Option<u32>, wanted: u32| {
            given.unwrap_or_else(|| {
                let taken = wanted.min(room);
                room -= taken;
                taken
            })
        };
        [
            default(r.critical, share),
            default(r.high, share),
            default(r.normal, 0),
            default(r.low, 0),
        ]
    }

    /// Every priority must be able to take a slot: LOW, which only its own reserve and the
    /// unreserved slots serve, at least one (so the more urgent ones too).
    pub(super) fn validate(&self) -> Result<(), String> {
        let [critical, high, normal, low] = self.reserves().map(u64::from);
        let sum = critical + high + normal + low;
        let max = u64::from(self.max_in_flight);
        if sum > max || (sum == max && low == 0) {
            return Err(format!(
                "queue.reserved (critical {critical} + high {high} + normal {normal} + low {low} = {sum}) \
                 leaves no slot of queue.max_in_flight ({max}) for low-priority requests (nor for normal ones \
                 without a reserve): keep the reserves under max_in_flight, or reserve slots for low"
            ));
        }
        Ok(())
    }
}

/// Slots kept for a priority and the more urgent ones; absent ones take their default
/// (`QueueSettings::reserves`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ReservedSlots {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normal: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<u32>,
}

impl ReservedSlots {
    /// Nothing reserved: every slot for anyone.
    pub const NONE: Self = Self::of([0; 4]);

    /// These reserves, CRITICAL first.
    pub const fn of(r: [u32; 4]) -> Self {
        Self {
            critical: Some(r[0]),
            high: Some(r[1]),
            normal: Some(r[2]),
            low: Some(r[3]),
        }
    }
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

/// The longest a cache entry may live (one year), whoever asks (`cache::MAX_TTL_SECONDS`):
/// `default_ttl_seconds` above it is refused.
pub const MAX_CACHE_TTL_SECONDS: i64 = 365 * 24 * 3600;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSettings {
    pub mode: String,
    pub scope: String,
    pub default_ttl_seconds: u64,
    pub semantic: bool,
    pub embedder: String,
    pub similarity_threshold: f64,
    /// Opt-in: identifiers (VINs, UUIDs, hex ids, timestamps, numbers of 5+ digits) do not
    /// tell two questions apart in the semantic match (`cache::meaning`). Per model too.
    pub ignore_identifiers: bool,
    pub max_entries: u64,
    /// For `embedder = "http"`: an OpenAI-compatible base URL (with `/v1`), model and key.
    pub http_url: String,
    pub http_model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_api_key: Option<Secret>,
    /// `http_url` may point at a loopback or private address (a local embedding server),
    /// as an upstream's `allow_private_network`. Metadata addresses are refused always.
    pub http_allow_private_network: bool,
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
            ignore_identifiers: false,
            max_entries: 100_000,
            http_url: String::new(),
            http_model: String::new(),
            http_api_key: None,
            http_allow_private_network: false,
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
    /// Whether an upstream added in the admin UI or API may set `allow_private_network`
    /// (a local model server). Off, an admin session reaches public addresses only: it
    /// cannot turn the gateway — its requests, or the "test" button — on the internal
    /// network. Upstreams of the config file are not concerned.
    pub managed_allow_private_network: bool,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 5000,
            first_byte_timeout_ms: 60_000,
            stream_idle_timeout_ms: 60_000,
            max_response_bytes: 16 * 1024 * 1024,
            managed_allow_private_network: false,
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
    /// The name this host's audit head goes by with `dir` (`ops::audit_head::head_id`);
    /// empty: the host name. It must survive a re-creation of the host (a container's
    /// host name may not).
    pub head_name: String,
}

impl Default for BackupSettings {
    fn default() -> Self {
        Self {
            interval_hours: 24,
            keep: 7,
            dir: "backup".into(),
            head_name: String::new(),
        }
    }
}

/// `[responses]`: stored responses of the Responses API (`store`, `previous_response_id`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesSettings {
    /// Stored responses older than this are swept (and no longer found); 0 keeps none.
    pub retention_days: u32,
}

impl Default for ResponsesSettings {
    fn default() -> Self {
        Self { retention_days: 30 }
    }
}

/// `[finance]`: how spend is bounded and priced beyond the models' prices, and
/// reconciliation against the provider's bill (`sluice reconcile`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FinanceSettings {
    /// The most server-tool calls (web searches) a request may make when the client sets
    /// no cap of its own: sent upstream as the tool's `max_uses`, and reserved for.
    pub max_server_tool_calls: u32,
    /// The input tokens one web-search or web-fetch call may add (its results, which come
    /// back to the model as input): reserved per call, and a fetch's `max_content_tokens`
    /// when the client sets none.
    pub server_tool_input_tokens_per_call: u32,
    /// The input tokens one page of an inline PDF is typically billed (its text and an
    /// image of the page; Anthropic documents 1 500–3 000): the estimate charged per page
    /// when the gateway counts the usage itself — the reservation holds the model's whole
    /// input, no provider bounding a page (`quota::documents`).
    pub document_tokens_per_page: u32,
    /// A (day, model, account) row is flagged when its difference exceeds both this …
    pub reconcile_threshold_usd: f64,
    /// … and this percentage of the provider's figure.
    pub reconcile_threshold_pct: f64,
    /// `budget_exhaustion_forecast` is raised for a budget projected to run out within
    /// this many days (0: never).
    pub forecast_alert_days: u32,
    /// The spend rollup keeps at most this many distinct values of one tag key per UTC day;
    /// later values are rolled up under `(other)` (`store::tag_bound`).
    pub max_tag_values_per_day: u32,
    /// … and at most this many distinct tag keys per UTC day and tenant; later keys are
    /// rolled up as the key `(other)`.
    pub max_tag_keys_per_day: u32,
    /// … and at most this many distinct tag texts (the pairs the admin did not set) per UTC
    /// day and tenant; a later text is rolled up pair by pair to `key:(other)`, else to
    /// `(other):(other)`.
    pub max_tag_sets_per_day: u32,
}

impl Default for FinanceSettings {
    fn default() -> Self {
        Self {
            max_server_tool_calls: 5,
            server_tool_input_tokens_per_call: 25_000,
            document_tokens_per_page: 3_000,
            reconcile_threshold_usd: 1.0,
            reconcile_threshold_pct: 2.0,
            forecast_alert_days: 7,
            max_tag_values_per_day: 1000,
            max_tag_keys_per_day: 100,
            max_tag_sets_per_day: 1000,
        }
    }
}

impl FinanceSettings {
    fn in_range(field: &str, v: f64, max: f64) -> Result<(), super::ConfigError> {
        if v.is_finite() && (0.0..=max).contains(&v) {
            return Ok(());
        }
        Err(super::ConfigError::Invalid(format!(
            "finance.{field} must be between 0 and {max}"
        )))
    }

    pub fn validate(&self) -> Result<(), super::ConfigError> {
        Self::in_range("reconcile_threshold_usd", self.reconcile_threshold_usd, 1e9)?;
        Self::in_range(
            "reconcile_threshold_pct",
            self.reconcile_threshold_pct,
            1000.0,
        )?;
        // A horizon past a year forecasts nothing more, and one near u32::MAX days is past
        // the calendar's end: the hourly check would stop at its first date.
        if self.forecast_alert_days > 366 {
            return Err(super::ConfigError::Invalid(
                "finance.forecast_alert_days must be between 0 and 366".into(),
            ));
        }
        // The server tools' defaults stay within what a request may set itself
        // (`pipeline::kinds::server_tools`): their product is reserved as input.
        if !(1..=100).contains(&self.max_server_tool_calls) {
            return Err(super::ConfigError::Invalid(
                "finance.max_server_tool_calls must be between 1 and 100".into(),
            ));
        }
        if !(1..=1_000_000).contains(&self.server_tool_input_tokens_per_call) {
            return Err(super::ConfigError::Invalid(
                "finance.server_tool_input_tokens_per_call must be between 1 and 1000000".into(),
            ));
        }
        // Reserved per page: a page is never free, and no provider bills one near 100 000.
        if !(1..=100_000).contains(&self.document_tokens_per_page) {
            return Err(super::ConfigError::Invalid(
                "finance.document_tokens_per_page must be between 1 and 100000".into(),
            ));
        }
        if !(1..=1_000_000).contains(&self.max_tag_values_per_day) {
            return Err(super::ConfigError::Invalid(
                "finance.max_tag_values_per_day must be between 1 and 1000000".into(),
            ));
        }
        if !(1..=10_000).contains(&self.max_tag_keys_per_day) {
            return Err(super::ConfigError::Invalid(
                "finance.max_tag_keys_per_day must be between 1 and 10000".into(),
            ));
        }
        if !(1..=1_000_000).contains(&self.max_tag_sets_per_day) {
            return Err(super::ConfigError::Invalid(
                "finance.max_tag_sets_per_day must be between 1 and 1000000".into(),
            ));
        }
        Ok(())
    }

    /// The absolute threshold in micro-dollars (written with at most 6 decimals: rounding
    /// removes the binary-float noise, as for prices).
    pub fn threshold_micros(&self) -> i64 {
        (self.reconcile_threshold_usd * 1_000_000.0).round() as i64
    }

    /// The relative threshold in basis points (2 % = 200).
    pub fn threshold_bp(&self) -> i64 {
        (self.reconcile_threshold_pct * 100.0).round() as i64
    }
}

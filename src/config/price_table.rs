//! The bundled default price table (`price_table.toml`, embedded in the binary): the
//! providers' public prices of the common OpenAI, Anthropic and Gemini models, each entry
//! dated (`effective`), with the day it was read (`as_of`) and where (`source_url`). It
//! prices a route only where neither an admin nor the config file prices its model
//! (`schedule`). An upstream model name matches an entry's `model` as written, else with a
//! trailing date suffix removed (`gpt-4o-mini-2024-07-18`, `claude-sonnet-4-20250514`);
//! on a Bedrock route, a Bedrock id of a bundled Claude model matches that model at what AWS
//! bills for it (`bedrock`).

mod bedrock;

pub use bedrock::{billing_region, commercial};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use chrono::NaiveDate;
use serde::Deserialize;

use super::{ConfigError, PriceKeys, Provider, Usd};
use crate::quota::long_tiers::{self, LongTiers};
use crate::quota::pricing::{parse_usd, LongTier};
use crate::quota::schedule::Dated;

const TABLE: &str = include_str!("price_table.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    prices: Vec<RawEntry>,
}

#[derive(Deserialize)]
struct RawEntry {
    provider: String,
    model: String,
    effective: String,
    as_of: String,
    source_url: String,
    /// Prompts above this many input tokens are billed at a dearer tier (Claude Sonnet 4 /
    /// 4.5, Gemini 2.5 Pro: 200 000): reserved input past it is refused
    /// (`pipeline::long_context`), reported input past it is priced at the tier's rates.
    #[serde(default)]
    long_context_above_tokens: Option<i64>,
    /// The tier's factors on every input and every output rate, decimal strings ("2",
    /// "1.5"); both required with a threshold.
    #[serde(default)]
    long_context_input_multiplier: Option<String>,
    #[serde(default)]
    long_context_output_multiplier: Option<String>,
    /// The longest prompt the provider serves the model unless the request turns Claude's
    /// 1M-token window on (`anthropic-beta: context-1m-…`): Claude up to 4.5, 200 000
    /// (4.6 and later serve their whole window). What a request is charged without the
    /// provider's count is bounded by it (`pipeline::long_context::Reader`).
    #[serde(default)]
    window_tokens: Option<i64>,
    #[serde(flatten)]
    keys: PriceKeys,
    /// Any other key: refused by name (a misspelt kind would otherwise be dropped).
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

/// One entry of the table, read.
#[derive(Debug, Clone)]
pub struct Entry {
    pub provider: String,
    pub model: String,
    pub dated: Dated,
    pub as_of: NaiveDate,
    pub source_url: String,
}

#[derive(Debug, Default)]
pub struct Table {
    pub entries: Vec<Entry>,
    by_model: HashMap<String, Arc<[Dated]>>,
    /// Per model, its long-context tier from each entry's date (`long_tiers`).
    long_context: HashMap<String, long_tiers::Dated>,
    /// Per model, the provider whose model it is (its entries' `provider`): the family a
    /// route's provider must serve for the gateway's name to bring its tier (`route_tiers`).
    family: HashMap<String, String>,
    /// Per model, the window it keeps without Claude's 1M beta (`window_tokens`).
    window: HashMap<String, i64>,
}

/// The embedded table, read once. It is part of the binary and its unit test reads it
/// (`the_bundled_table_parses_and_every_entry_is_sourced`): a table that does not read
/// fails the build's tests, not a gateway.
pub fn bundled() -> &'static Table {
    static TABLE_READ: OnceLock<Table> = OnceLock::new();
    TABLE_READ.get_or_init(|| {
        parse(TABLE).unwrap_or_else(|e| {
            tracing::error!(error = %e, "the bundled price table does not read: no bundled prices");
            Table::default()
        })
    })
}

fn invalid(why: String) -> ConfigError {
    ConfigError::Invalid(format!("bundled price table: {why}"))
}

/// Reads a table in `price_table.toml`'s format.
pub fn parse(text: &str) -> Result<Table, ConfigError> {
    let file: File = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let mut table = Table::default();
    let mut by_model: HashMap<String, Vec<Dated>> = HashMap::new();
    let mut tiers: HashMap<String, Vec<long_tiers::TierFrom>> = HashMap::new();
    for raw in file.prices {
        let name = &raw.model;
        if let Some(key) = raw.unknown.keys().next() {
            return Err(invalid(format!("`{name}`: unknown key `{key}`")));
        }
        let decimal = raw
            .keys
            .values()
            .into_iter()
            .flatten()
            .all(|v| matches!(v, Usd::Text(_)));
        if !decimal {
            return Err(invalid(format!(
                "`{name}`: prices are decimal strings, not numbers"
            )));
        }
        let prices = raw
            .keys
            .partial(name)?
            .ok_or_else(|| invalid(format!("`{name}` has no price")))?;
        let from = super::parse_effective(&raw.effective)
            .ok_or_else(|| invalid(format!("`{name}`: effective {:?}", raw.effective)))?;
        let as_of = NaiveDate::parse_from_str(&raw.as_of, "%Y-%m-%d")
            .map_err(|_| invalid(format!("`{name}`: as_of {:?}", raw.as_of)))?;
        if !raw.source_url.starts_with("https://") || raw.provider.is_empty() {
            return Err(invalid(format!(
                "`{name}` needs a provider and an https source_url"
            )));
        }
        let tier = long_tier(name, &raw)?;
        tiers.entry(name.clone()).or_default().push((from, tier));
        let dated = Dated::new(from, prices);
        let same_day = by_model.entry(name.clone()).or_default();
        if same_day.iter().any(|d| d.from == from) {
            return Err(invalid(format!(
                "`{name}` has two entries effective {from}"
            )));
        }
        same_day.push(dated);
        match raw.window_tokens {
            Some(w) if w <= 0 => {
                return Err(invalid(format!("`{name}`: window_tokens {w}")));
            }
            Some(w) => {
                table.window.insert(name.clone(), w);
            }
            None => {}
        }
        table.family.insert(name.clone(), raw.provider.clone());
        table.entries.push(Entry {
            provider: raw.provider,
            model: raw.model,
            dated,
            as_of,
            source_url: raw.source_url,
        });
    }
    table.by_model = by_model
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by_key(|d| d.from);
            (k, Arc::from(v))
        })
        .collect();
    table.long_context = tiers
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by_key(|(from, _)| *from);
            (k, Arc::from(v))
        })
        .collect();
    Ok(table)
}

impl Table {
    /// The dated prices of an upstream model name: its own entries, else those of the name
    /// without its date suffix; empty when neither is in the table.
    pub fn for_upstream_model(&self, name: &str) -> Arc<[Dated]> {
        self.by_model
            .get(name)
            .or_else(|| self.by_model.get(without_date_suffix(name)?))
            .cloned()
            .unwrap_or_else(|| Arc::from([]))
    }

    /// The dated prices of a route to `upstream_model` on a `provider` upstream in `region`:
    /// on Bedrock, the id of a bundled Claude model of 4.5 or later is priced from that
    /// model's entries at what AWS bills for it (`bedrock::prices`) — and nothing at all in
    /// a Region outside AWS's commercial partition (`bedrock::commercial`), whose own price
    /// list the table does not hold; otherwise, and for every other provider, the name's
    /// own match (`for_upstream_model`).
    pub fn for_route(
        &self,
        upstream_model: &str,
        provider: Provider,
        region: Option<&str>,
    ) -> Arc<[Dated]> {
        if provider != Provider::Bedrock {
            return self.for_upstream_model(upstream_model);
        }
        if !region.is_none_or(bedrock::commercial) {
            return Arc::from([]);
        }
        bedrock::prices(self, upstream_model)
            .unwrap_or_else(|| self.for_upstream_model(upstream_model))
    }

    /// The long-context tiers the provider bills `name` (a model name, or it without its
    /// date suffix) at over time (`long_tiers`); empty when no bundled model matches. A
    /// bundled model decides for itself, tier or none. A name that only contains bundled
    /// models' (Bedrock's `anthropic.claude-sonnet-4-5-20250929-v1:0`, Vertex's
    /// `claude-sonnet-4-5@20250929`, a router's `google/gemini-2.5-pro-preview`) has the
    /// tiers of those it contains (the lowest threshold in force wins) counting only the
    /// most specific: `anthropic.claude-sonnet-4-6-v1:0` is the flat Sonnet 4.6, not the
    /// tiered `claude-sonnet-4` it also contains.
    pub fn long_context(&self, name: &str) -> LongTiers {
        self.tiers_of(self.matching(name))
    }

    /// A route's long-context tiers over time, in this order:
    /// - its `tier_model`, when set: that bundled model's, whatever the names say;
    /// - else those of the bundled models its upstream names match (the model it serves,
    ///   Azure's deployment): the name the provider bills by;
    /// - else, when those say nothing (a Bedrock ARN, a custom deployment), those of the
    ///   bundled models the gateway's model name matches — only the ones whose family the
    ///   route's provider serves (`serves`): `claude-sonnet-4`'s tier on its Anthropic or
    ///   Bedrock route, never on its fallback route to a vLLM `qwen`.
    pub fn route_tiers(
        &self,
        tier_model: Option<&str>,
        upstream_names: &[&str],
        gateway_name: &str,
        provider: Provider,
    ) -> LongTiers {
        if let Some(model) = tier_model {
            return self.tiers_of(vec![model]);
        }
        let by_upstream = upstream_names
            .iter()
            .fold(LongTiers::default(), |all, n| all.and(self.long_context(n)));
        if !by_upstream.is_empty() {
            return by_upstream;
        }
        let served = self.matching(gateway_name).into_iter().filter(|model| {
            self.family
                .get(*model)
                .is_some_and(|family| serves(provider, family))
        });
        self.tiers_of(served.collect())
    }

    /// Whose model a route serves, decided as its tiers are (`route_tiers`): its
    /// `tier_model`'s family, else that of the bundled models its upstream names match,
    /// else of those the gateway's name matches that the route's provider serves; else
    /// Gemini's when a name says `gemini` or `gemma` (a model newer than the table, an
    /// alias: their tokenizer splits digits, and counting them only raises a reservation);
    /// a route no name places (a custom deployment, an open model) is its provider's
    /// (`Family::served_by`). Gemini served through Google's OpenAI-compatible endpoint is
    /// Gemini's, read by Gemini's tokenizer (`pipeline::long_context::Reader`).
    pub fn route_family(
        &self,
        tier_model: Option<&str>,
        upstream_names: &[&str],
        gateway_name: &str,
        provider: Provider,
    ) -> Family {
        let named = self.route_model(tier_model, upstream_names, gateway_name, provider);
        (named.and_then(|model| self.family.get(model)))
            .map(|family| Family::named(family))
            .or_else(|| {
                let says = |n: &str| {
                    let n = n.to_ascii_lowercase();
                    n.contains("gemini") || n.contains("gemma")
                };
                (upstream_names.iter().any(|n| says(n)) || says(gateway_name))
                    .then_some(Family::Gemini)
            })
            .unwrap_or(Family::served_by(provider))
    }

    /// The window the route's model keeps without Claude's 1M beta (`window_tokens`), by
    /// the bundled model its names place as they place its family (`route_family`); none
    /// for a model the table does not name.
    pub fn route_window(
        &self,
        tier_model: Option<&str>,
        upstream_names: &[&str],
        gateway_name: &str,
        provider: Provider,
    ) -> Option<i64> {
        let named = self.route_model(tier_model, upstream_names, gateway_name, provider);
        named.and_then(|model| self.window.get(model).copied())
    }

    /// The bundled model a route's names place: its `tier_model`, else the first its
    /// upstream names name, else one its gateway name names whose family its provider
    /// serves.
    fn route_model(
        &self,
        tier_model: Option<&str>,
        upstream_names: &[&str],
        gateway_name: &str,
        provider: Provider,
    ) -> Option<&str> {
        let bundled = |model: &str| self.family.get_key_value(model).map(|(k, _)| k.as_str());
        match tier_model {
            Some(model) => bundled(model),
            None => (upstream_names.iter())
                .flat_map(|n| self.matching(n))
                .find_map(bundled)
                .or_else(|| {
                    (self.matching(gateway_name).into_iter()).find(|model| {
                        (self.family.get(*model)).is_some_and(|family| serves(provider, family))
                    })
                }),
        }
    }

    /// Whether `name` is a bundled model's own name: what a route's `tier_model` may be.
    pub fn has_model(&self, name: &str) -> bool {
        self.long_context.contains_key(name)
    }

    /// The bundled models with a long-context tier at some date, sorted (for messages).
    pub fn tiered_models(&self) -> Vec<&str> {
        let mut names: Vec<&str> = (self.long_context.iter())
            .filter(|(_, tiers)| tiers.iter().any(|(_, tier)| tier.is_some()))
            .map(|(name, _)| name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// The bundled models `name` names (`long_context`).
    fn matching<'a>(&'a self, name: &str) -> Vec<&'a str> {
        for own in [Some(name), without_date_suffix(name)]
            .into_iter()
            .flatten()
        {
            if let Some((model, _)) = self.long_context.get_key_value(own) {
                return vec![model.as_str()];
            }
        }
        let name = name.to_ascii_lowercase();
        let held: Vec<&str> = self
            .by_model
            .keys()
            .map(String::as_str)
            .filter(|model| name.contains(model))
            .collect();
        held.iter()
            .copied()
            .filter(|model| {
                !held
                    .iter()
                    .any(|other| other.len() > model.len() && other.contains(*model))
            })
            .collect()
    }

    fn tiers_of(&self, models: Vec<&str>) -> LongTiers {
        LongTiers::of(
            models
                .into_iter()
                .filter_map(|model| self.long_context.get(model).cloned())
                .collect(),
        )
    }
}

/// Whose models a route serves (`Table::route_family`): whose tokenizer counts its input
/// and bills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Anthropic's Claude by its name, wherever it is served: its window is known.
    Claude,
    /// Google's Gemini (or Gemma), wherever it is served.
    Gemini,
    /// OpenAI's.
    Openai,
    /// No name says: a custom deployment, an open model, a model newer than the table on
    /// Anthropic, Bedrock or a router — counted as widely as Claude, no window assumed.
    Unknown,
}

impl Family {
    /// A bundled entry's `provider`'s family.
    fn named(provider: &str) -> Family {
        match provider {
            "anthropic" => Family::Claude,
            "gemini" => Family::Gemini,
            "openai" => Family::Openai,
            _ => Family::Unknown,
        }
    }

    /// The family of a route no name places: Gemini's on a Gemini upstream (the API and
    /// Vertex serve Gemini only), OpenAI's on OpenAI and Azure; elsewhere unknown — Bedrock
    /// and an Anthropic-format server serve other families too (Nova, Llama, a proxy's).
    fn served_by(provider: Provider) -> Family {
        match provider {
            Provider::Gemini => Family::Gemini,
            Provider::Openai | Provider::AzureOpenai => Family::Openai,
            Provider::Anthropic | Provider::Bedrock | Provider::OpenaiCompatible => Family::Unknown,
        }
    }
}

/// Whether a route to `provider` is billed as the bundled models of `family` (their
/// entries' `provider`) are: Anthropic's Claude on Anthropic and on Bedrock (there is no
/// Vertex-Anthropic kind: a `gemini` upstream speaks `generateContent`, which serves
/// Gemini only), Gemini on `gemini` (the API or Vertex AI), OpenAI's on OpenAI and Azure.
/// An `openai_compatible` server (vLLM, Ollama, a router) serves any model under any name:
/// it serves no family by the gateway's name — its upstream name, or the route's
/// `tier_model`, must say.
pub fn serves(provider: Provider, family: &str) -> bool {
    match provider {
        Provider::Anthropic | Provider::Bedrock => family == "anthropic",
        Provider::Gemini => family == "gemini",
        Provider::Openai | Provider::AzureOpenai => family == "openai",
        Provider::OpenaiCompatible => false,
    }
}

/// An entry's long-context tier: a positive threshold with both factors (each at least 1,
/// in thousandths), or none of the three.
fn long_tier(name: &str, raw: &RawEntry) -> Result<Option<LongTier>, ConfigError> {
    let factor = |v: &Option<String>, field: &str| {
        v.as_deref()
            .and_then(parse_usd)
            .filter(|m| *m >= 1_000_000 && m % 1_000 == 0)
            .map(|m| m / 1_000)
            .ok_or_else(|| {
                invalid(format!(
                    "`{name}`: a long-context tier needs `{field}`, a decimal string of at \
                     least 1 with at most 3 decimals"
                ))
            })
    };
    match raw.long_context_above_tokens {
        None if raw.long_context_input_multiplier.is_none()
            && raw.long_context_output_multiplier.is_none() =>
        {
            Ok(None)
        }
        Some(above) if above >= 1 => Ok(Some(LongTier {
            above,
            input_permille: factor(
                &raw.long_context_input_multiplier,
                "long_context_input_multiplier",
            )?,
            output_permille: factor(
                &raw.long_context_output_multiplier,
                "long_context_output_multiplier",
            )?,
        })),
        _ => Err(invalid(format!(
            "`{name}`: long_context_above_tokens must be a positive integer, set with its \
             multipliers"
        ))),
    }
}

/// `name` without a trailing `-YYYY-MM-DD` or `-YYYYMMDD`; `None` when it has neither.
pub fn without_date_suffix(name: &str) -> Option<&str> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (head, tail) = name.rsplit_once('-')?;
    if tail.len() == 8 && digits(tail) {
        return Some(head);
    }
    // `-YYYY-MM-DD`: the last three dash-separated parts are 4, 2 and 2 digits.
    let (rest, day) = (head, tail);
    let (rest, month) = rest.rsplit_once('-')?;
    let (base, year) = rest.rsplit_once('-')?;
    let dated = year.len() == 4 && month.len() == 2 && day.len() == 2;
    (dated && digits(year) && digits(month) && digits(day) && !base.is_empty()).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::pricing::Prices;

    #[test]
    fn the_bundled_table_parses_and_every_entry_is_sourced() {
        let t = parse(TABLE).expect("the bundled table reads");
        assert!(t.entries.len() >= 25, "{}", t.entries.len());
        for e in &t.entries {
            assert!(e.source_url.starts_with("https://"), "{}", e.model);
            assert!(
                e.as_of >= NaiveDate::from_ymd_opt(2024, 1, 1).unwrap(),
                "{}",
                e.model
            );
            assert!(
                e.dated.prices.input > 0 && e.dated.prices.output >= 0,
                "{}",
                e.model
            );
            assert!(
                e.dated.from.date_naive() <= e.as_of,
                "{}: read before it took effect",
                e.model
            );
        }
        for provider in ["openai", "anthropic", "gemini"] {
            assert!(
                t.entries.iter().any(|e| e.provider == provider),
                "{provider}"
            );
        }
        assert_eq!(bundled().entries.len(), t.entries.len());
    }

    #[test]
    fn long_context_tiers_follow_the_upstream_model() {
        let (t, now) = (bundled(), chrono::Utc::now());
        let tier = LongTier {
            above: 200_000,
            input_permille: 2_000,
            output_permille: 1_500,
        };
        for m in [
            "claude-sonnet-4-5-20250929",
            "claude-sonnet-4",
            "gemini-2.5-pro",
        ] {
            assert_eq!(t.long_context(m).at(now), Some(tier), "{m}");
        }
        assert_eq!(t.long_context("gpt-4o").at(now), None);
        // Claude 4.6 and later are flat over their 1M window: a name holding an untiered
        // model (`claude-sonnet-4-6`) is not given the tier of a shorter one it contains
        // (`claude-sonnet-4`), whether it is the bundled name or a cloud's spelling of it.
        for m in [
            "claude-sonnet-4-6",
            "claude-sonnet-4-6-20260217",
            "anthropic.claude-sonnet-4-6-v1:0",
            "claude-sonnet-4-6@20260217",
            "claude-opus-4-6",
            "claude-sonnet-5-5",
        ] {
            assert_eq!(t.long_context(m).at(now), None, "{m}");
        }
        let haiku = LongTier {
            above: 100_000,
            input_permille: 5_000,
            output_permille: 5_000,
        };
        for m in ["claude-haiku-5-5", "anthropic.claude-haiku-5-5"] {
            assert_eq!(t.long_context(m).at(now), Some(haiku), "{m}");
        }
        for m in [
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "claude-sonnet-4-5@20250929",
            "google/gemini-2.5-pro-preview-06-05",
        ] {
            assert_eq!(t.long_context(m).at(now), Some(tier), "{m}");
        }
        let entry = |tier: &str| {
            format!(
                "[[prices]]\nprovider = \"x\"\nmodel = \"m\"\neffective = \"2025-01-01\"\n\
                 as_of = \"2025-01-02\"\nsource_url = \"https://x\"\n\
                 {tier}\ninput_usd_per_mtok = \"1\"\noutput_usd_per_mtok = \"1\"\n"
            )
        };
        let both =
            "long_context_input_multiplier = \"2.125\"\nlong_context_output_multiplier = \"1\"";
        assert_eq!(
            parse(&entry(&format!("long_context_above_tokens = 10\n{both}")))
                .unwrap()
                .long_context("m")
                .at(now),
            Some(LongTier {
                above: 10,
                input_permille: 2_125,
                output_permille: 1_000
            })
        );
        assert!(t
            .long_context("arn:aws:bedrock:x:1:application-inference-profile/a")
            .is_empty());
        assert!(!t.long_context("gpt-4o").is_empty());
        for bad in [
            format!("long_context_above_tokens = 0\n{both}"),
            "long_context_above_tokens = 10".into(),
            both.into(),
            "long_context_above_tokens = 10\nlong_context_input_multiplier = \"0.5\"\n\
             long_context_output_multiplier = \"1\""
                .into(),
            "long_context_above_tokens = 10\nlong_context_input_multiplier = \"2.0001\"\n\
             long_context_output_multiplier = \"1\""
                .into(),
        ] {
            assert!(parse(&entry(&bad)).is_err(), "{bad}");
        }
    }

    /// A model's later entry brings its own tier: its factors from its date on, and an
    /// entry without one ends the tier — a request is billed the tier of its day.
    #[test]
    fn a_routes_tier_is_its_tier_model_else_its_names_else_the_gateways_on_its_family() {
        let (t, now) = (bundled(), chrono::Utc::now());
        let sonnet = t.long_context("claude-sonnet-4").at(now);
        let gemini = t.long_context("gemini-2.5-pro").at(now);
        assert!(sonnet.is_some() && gemini.is_some());
        let arn = "arn:aws:bedrock:us-east-1:1:application-inference-profile/a";
        let at = |tier_model, names: &[&str], gateway, provider| {
            t.route_tiers(tier_model, names, gateway, provider).at(now)
        };
        // The gateway's name brings its tier only where the provider serves its family.
        for p in [Provider::Anthropic, Provider::Bedrock] {
            assert_eq!(at(None, &[arn], "claude-sonnet-4", p), sonnet, "{p:?}");
            assert_eq!(at(None, &[arn], "gemini-2.5-pro", p), None, "{p:?}");
        }
        for p in [
            Provider::OpenaiCompatible,
            Provider::Openai,
            Provider::AzureOpenai,
            Provider::Gemini,
        ] {
            let qwen = at(None, &["qwen2.5-72b-instruct"], "claude-sonnet-4", p);
            assert_eq!(qwen, None, "{p:?}");
        }
        assert_eq!(
            at(None, &["custom"], "gemini-2.5-pro", Provider::Gemini),
            gemini
        );
        // An upstream name the table knows decides, on any provider.
        let router = ["anthropic/claude-sonnet-4-20250514"];
        assert_eq!(
            at(None, &router, "smart", Provider::OpenaiCompatible),
            sonnet
        );
        // `tier_model` decides over both.
        for p in [Provider::Bedrock, Provider::OpenaiCompatible] {
            assert_eq!(at(Some("claude-sonnet-4"), &[arn], "smart", p), sonnet);
            let flat = at(Some("claude-sonnet-4-6"), &router, "claude-sonnet-4", p);
            assert_eq!(flat, None, "{p:?}");
        }
        assert!(t.has_model("claude-sonnet-4-5") && !t.has_model("claude-sonnet-4.5"));
        let tiered = t.tiered_models();
        assert!(tiered.contains(&"gemini-2.5-pro") && !tiered.contains(&"gpt-4o"));
    }

    #[test]
    fn a_routes_family_is_decided_by_its_names_as_its_tier_is_else_by_its_provider() {
        use Family::{Claude, Gemini, Openai, Unknown};
        use Provider::{Anthropic, Bedrock, OpenaiCompatible};
        let t = bundled();
        let arn = "arn:aws:bedrock:us-east-1:1:application-inference-profile/a";
        let bedrock_sonnet = "anthropic.claude-sonnet-4-5-20250929-v1:0";
        // (tier_model, upstream name, gateway name, provider, family)
        let cases = [
            // Gemini by its name on any wire: Google's OpenAI endpoint, an Anthropic proxy.
            (None, "gemini-2.5-pro", "g", OpenaiCompatible, Gemini),
            (None, "gemini-2.5-pro", "g", Anthropic, Gemini),
            (
                None,
                "google/gemini-2.5-pro-preview",
                "g",
                OpenaiCompatible,
                Gemini,
            ),
            (None, bedrock_sonnet, "s", Bedrock, Claude),
            (None, "gpt-4o", "smart", OpenaiCompatible, Openai),
            // The gateway's name only where the provider serves its family.
            (None, arn, "claude-sonnet-4", Bedrock, Claude),
            (None, arn, "smart", Bedrock, Unknown),
            (None, "custom", "gemini-2.5-pro", Provider::Gemini, Gemini),
            (
                None,
                "qwen2.5-72b",
                "claude-sonnet-4",
                OpenaiCompatible,
                Unknown,
            ),
            // A name that says Gemini (or Gemma), though the table does not hold it.
            (
                None,
                "gemini-flash-latest",
                "flash",
                OpenaiCompatible,
                Gemini,
            ),
            (
                None,
                "qwen2.5-72b",
                "gemini-2.5-pro",
                OpenaiCompatible,
                Gemini,
            ),
            (None, "google/gemma-3-27b-it", "g", OpenaiCompatible, Gemini),
            // No name places it: its provider's own, else unknown.
            (None, "qwen2.5-72b", "q", OpenaiCompatible, Unknown),
            (None, "amazon.nova-premier-v1:0", "nova", Bedrock, Unknown),
            (None, "custom", "c", Provider::Openai, Openai),
            (None, "custom", "c", Provider::Gemini, Gemini),
            // `tier_model` decides over both.
            (
                Some("gemini-2.5-pro"),
                arn,
                "claude-sonnet-4",
                Bedrock,
                Gemini,
            ),
        ];
        for (tier_model, upstream, gateway, provider, family) in cases {
            assert_eq!(
                t.route_family(tier_model, &[upstream], gateway, provider),
                family,
                "{tier_model:?} {upstream} {gateway} {provider:?}"
            );
        }
    }

    /// Claude up to 4.5 keeps a 200 000-token window without the 1M beta; 4.6 and later,
    /// and every other family, have none in the table (review finding, s18).
    #[test]
    fn a_routes_window_is_its_bundled_models() {
        use Provider::{Anthropic, Bedrock, OpenaiCompatible};
        let t = bundled();
        let cases = [
            (
                None,
                "claude-sonnet-4-5-20250929",
                "s",
                Anthropic,
                Some(200_000),
            ),
            (
                None,
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
                "s",
                Bedrock,
                Some(200_000),
            ),
            (None, "claude-opus-4-1", "o", Anthropic, Some(200_000)),
            (
                None,
                "claude-3-5-haiku-latest",
                "h",
                Anthropic,
                Some(200_000),
            ),
            (None, "claude-sonnet-4-6", "s", Anthropic, None),
            (None, "claude-opus-5", "o", Anthropic, None),
            (None, "gemini-2.5-pro", "g", OpenaiCompatible, None),
            (
                None,
                "custom",
                "claude-sonnet-4-5",
                Anthropic,
                Some(200_000),
            ),
            (
                Some("claude-sonnet-4-6"),
                "claude-sonnet-4-5",
                "s",
                Anthropic,
                None,
            ),
        ];
        for (tier_model, upstream, gateway, provider, window) in cases {
            assert_eq!(
                t.route_window(tier_model, &[upstream], gateway, provider),
                window,
                "{tier_model:?} {upstream} {gateway} {provider:?}"
            );
        }
    }

    #[test]
    fn the_tier_follows_the_entry_in_force() {
        let entry = |effective: &str, tier: &str| {
            format!(
                "[[prices]]\nprovider = \"x\"\nmodel = \"m\"\neffective = \"{effective}\"\n\
                 as_of = \"2025-01-02\"\nsource_url = \"https://x\"\n{tier}\n\
                 input_usd_per_mtok = \"1\"\noutput_usd_per_mtok = \"1\"\n"
            )
        };
        let tier = |above: i64, factor: &str| {
            format!(
                "long_context_above_tokens = {above}\nlong_context_input_multiplier = \"{factor}\"\n\
                 long_context_output_multiplier = \"1.5\""
            )
        };
        let text = [
            entry("2026-01-01", &tier(200_000, "3")),
            entry("2025-01-01", &tier(100_000, "2")),
            entry("2026-06-01", ""),
        ]
        .concat();
        let t = parse(&text).unwrap().long_context("m");
        let day = |d: &str| crate::config::parse_effective(d).unwrap();
        let of = |above, input_permille| {
            Some(LongTier {
                above,
                input_permille,
                output_permille: 1_500,
            })
        };
        assert_eq!(t.at(day("2025-03-01")), of(100_000, 2_000));
        assert_eq!(t.at(day("2026-03-01")), of(200_000, 3_000));
        assert_eq!(t.at(day("2026-07-01")), None);
    }

    #[test]
    fn spot_figures_in_micros_per_million_tokens() {
        let t = bundled();
        let now = chrono::Utc::now();
        let at = |m: &str| {
            let s = crate::quota::schedule::Schedule::new(vec![], vec![], t.for_upstream_model(m));
            s.rates_at(now).unwrap_or_else(|| panic!("{m} is bundled"))
        };
        assert_eq!(
            at("gpt-4o-mini"),
            Prices {
                cached_input: 75_000,
                web_search_per_1k_calls: 25_000_000,
                ..Prices::plain(150_000, 600_000)
            }
        );
        assert_eq!(
            at("claude-sonnet-4-5"),
            Prices {
                cached_input: 300_000,
                cache_write_5m: 3_750_000,
                cache_write_1h: 6_000_000,
                web_search_per_1k_calls: 10_000_000,
                ..Prices::plain(3_000_000, 15_000_000)
            }
        );
        // o3 after its price cut of 2025-06-10.
        assert_eq!(at("o3").input, 2_000_000);
        // Gemini's context-caching price, after Google's cut (10 % of the input).
        assert_eq!(at("gemini-2.5-flash").cached_input, 30_000);
        // 2.0 Flash-Lite has no context caching: cached input at the input price.
        assert_eq!(at("gemini-2.0-flash-lite").cached_input, 75_000);
        // Opus 5.5's cache reads are 0.05× input, not Anthropic's usual 0.1×.
        assert_eq!(
            at("claude-opus-5-5"),
            Prices {
                cached_input: 200_000,
                cache_write_5m: 5_000_000,
                cache_write_1h: 8_000_000,
                web_search_per_1k_calls: 10_000_000,
                ..Prices::plain(4_000_000, 20_000_000)
            }
        );
        let fable = at("claude-fable-5-1");
        assert_eq!(
            (fable.input, fable.cached_input, fable.output),
            (10_000_000, 250_000, 50_000_000)
        );
        // Haiku 5.5's lower tier, to the micro-dollar (its 5m write is 0.125).
        let h55 = at("claude-haiku-5-5");
        assert_eq!(
            (h55.input, h55.cached_input, h55.cache_write_5m, h55.output),
            (100_000, 10_000, 125_000, 500_000)
        );
        assert_eq!(at("claude-sonnet-4-6-20260217").cache_write_1h, 6_000_000);
        let haiku = at("claude-3-5-haiku");
        assert_eq!(
            (haiku.cache_write_5m, haiku.cache_write_1h),
            (1_000_000, 1_600_000)
        );
    }

    /// Every OpenAI and Gemini row as checked against the price pages on 2026-12-03 (the
    /// table's header says against which, and what could not be checked): (model,
    /// effective, input, cached input, output, audio input) in micro-dollars per million
    /// tokens — a kind the row leaves out at its default (cached and audio at the input).
    /// Every Anthropic figure, re-checked 2026-12-05 against genai-prices 0.2.5 (pydantic's
    /// table, each model citing platform.claude.com's pricing page) and LiteLLM 1.110.2:
    /// all agree but Sonnet 5.5's cache hit, 0.05× its input like Opus 5.5's (the row had
    /// Sonnet 5's 0.1×, $0.20: its cache reads billed at twice the price).
    #[test]
    fn the_anthropic_figures_are_the_pages() {
        // (model, effective, input, cache hit, output, 5-minute write, 1-hour write,
        // web search per 1 000 calls)
        type Pinned = (&'static str, &'static str, i64, i64, i64, i64, i64, i64);
        #[rustfmt::skip]
        let checked: [Pinned; 19] = [
            ("claude-fable-5-1", "2026-09-01", 10_000_000, 250_000, 50_000_000, 12_500_000, 20_000_000, 10_000_000),
            ("claude-fable-5", "2026-06-09", 10_000_000, 1_000_000, 50_000_000, 12_500_000, 20_000_000, 10_000_000),
            ("claude-opus-5-5", "2026-09-23", 4_000_000, 200_000, 20_000_000, 5_000_000, 8_000_000, 10_000_000),
            ("claude-opus-5", "2026-07-24", 5_000_000, 500_000, 25_000_000, 6_250_000, 10_000_000, 10_000_000),
            ("claude-opus-4-6", "2026-02-05", 5_000_000, 500_000, 25_000_000, 6_250_000, 10_000_000, 10_000_000),
            ("claude-sonnet-5-5", "2026-09-28", 2_000_000, 100_000, 10_000_000, 2_500_000, 4_000_000, 10_000_000),
            ("claude-sonnet-5", "2026-06-30", 2_000_000, 200_000, 10_000_000, 2_500_000, 4_000_000, 10_000_000),
            ("claude-sonnet-4-6", "2026-02-17", 3_000_000, 300_000, 15_000_000, 3_750_000, 6_000_000, 10_000_000),
            ("claude-haiku-5-5", "2026-10-07", 100_000, 10_000, 500_000, 125_000, 200_000, 10_000_000),
            ("claude-opus-4-5", "2025-11-24", 5_000_000, 500_000, 25_000_000, 6_250_000, 10_000_000, 10_000_000),
            ("claude-opus-4-1", "2025-08-05", 15_000_000, 1_500_000, 75_000_000, 18_750_000, 30_000_000, 10_000_000),
            ("claude-opus-4", "2025-05-22", 15_000_000, 1_500_000, 75_000_000, 18_750_000, 30_000_000, 10_000_000),
            ("claude-sonnet-4-5", "2025-09-29", 3_000_000, 300_000, 15_000_000, 3_750_000, 6_000_000, 10_000_000),
            ("claude-sonnet-4", "2025-05-22", 3_000_000, 300_000, 15_000_000, 3_750_000, 6_000_000, 10_000_000),
            ("claude-3-7-sonnet", "2025-02-24", 3_000_000, 300_000, 15_000_000, 3_750_000, 6_000_000, 10_000_000),
            ("claude-3-5-sonnet", "2024-06-20", 3_000_000, 300_000, 15_000_000, 3_750_000, 6_000_000, 0),
            ("claude-haiku-4-5", "2025-10-15", 1_000_000, 100_000, 5_000_000, 1_250_000, 2_000_000, 10_000_000),
            ("claude-3-5-haiku", "2024-11-04", 800_000, 80_000, 4_000_000, 1_000_000, 1_600_000, 10_000_000),
            ("claude-3-haiku", "2024-03-13", 250_000, 30_000, 1_250_000, 300_000, 500_000, 0),
        ];
        type Row<'a> = (&'a str, String, i64, i64, i64, i64, i64, i64);
        let rows: Vec<Row> = bundled()
            .entries
            .iter()
            .filter(|e| e.provider == "anthropic")
            .map(|e| {
                let p = e.dated.prices;
                (
                    e.model.as_str(),
                    e.dated.from.date_naive().to_string(),
                    p.input,
                    p.cached_input,
                    p.output,
                    p.cache_write_5m,
                    p.cache_write_1h,
                    p.web_search_per_1k_calls,
                )
            })
            .collect();
        let want: Vec<Row> = checked
            .iter()
            .map(|&(m, d, i, c, o, w5, w1, s)| (m, d.to_string(), i, c, o, w5, w1, s))
            .collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn the_openai_and_gemini_figures_are_the_pages() {
        #[rustfmt::skip]
        let checked: [(&str, &str, i64, i64, i64, i64, i64); 22] = [
            ("gpt-4o", "2024-10-02", 2_500_000, 1_250_000, 10_000_000, 2_500_000, 25_000_000),
            ("gpt-4o-2024-05-13", "2024-05-13", 5_000_000, 5_000_000, 15_000_000, 5_000_000, 25_000_000),
            ("gpt-4o-mini", "2024-07-18", 150_000, 75_000, 600_000, 150_000, 25_000_000),
            ("gpt-4.1", "2025-04-14", 2_000_000, 500_000, 8_000_000, 2_000_000, 25_000_000),
            ("gpt-4.1-mini", "2025-04-14", 400_000, 100_000, 1_600_000, 400_000, 25_000_000),
            ("gpt-4.1-nano", "2025-04-14", 100_000, 25_000, 400_000, 100_000, 0),
            ("o3", "2025-04-16", 10_000_000, 2_500_000, 40_000_000, 10_000_000, 10_000_000),
            ("o3", "2025-06-10", 2_000_000, 500_000, 8_000_000, 2_000_000, 10_000_000),
            ("o4-mini", "2025-04-16", 1_100_000, 275_000, 4_400_000, 1_100_000, 10_000_000),
            ("o3-mini", "2025-01-31", 1_100_000, 550_000, 4_400_000, 1_100_000, 0),
            ("gpt-5", "2025-08-07", 1_250_000, 125_000, 10_000_000, 1_250_000, 10_000_000),
            ("gpt-5-mini", "2025-08-07", 250_000, 25_000, 2_000_000, 250_000, 10_000_000),
            ("gpt-5-nano", "2025-08-07", 50_000, 5_000, 400_000, 50_000, 10_000_000),
            ("text-embedding-3-small", "2024-01-25", 20_000, 20_000, 0, 20_000, 0),
            ("text-embedding-3-large", "2024-01-25", 130_000, 130_000, 0, 130_000, 0),
            ("gemini-2.5-pro", "2025-06-17", 1_250_000, 312_500, 10_000_000, 1_250_000, 0),
            ("gemini-2.5-pro", "2025-11-18", 1_250_000, 125_000, 10_000_000, 1_250_000, 0),
            ("gemini-2.5-flash", "2025-06-17", 300_000, 75_000, 2_500_000, 1_000_000, 0),
            ("gemini-2.5-flash", "2025-11-18", 300_000, 30_000, 2_500_000, 1_000_000, 0),
            ("gemini-2.5-flash-lite", "2025-07-22", 100_000, 25_000, 400_000, 300_000, 0),
            ("gemini-2.5-flash-lite", "2025-11-18", 100_000, 10_000, 400_000, 300_000, 0),
            ("gemini-2.0-flash", "2025-02-05", 100_000, 25_000, 400_000, 700_000, 0),
        ];
        let t = bundled();
        let rows: Vec<(&str, String, i64, i64, i64, i64, i64)> = t
            .entries
            .iter()
            .filter(|e| e.provider == "openai" || e.provider == "gemini")
            .filter(|e| e.model != "gemini-2.0-flash-lite")
            .map(|e| {
                let p = e.dated.prices;
                (
                    e.model.as_str(),
                    e.dated.from.date_naive().to_string(),
                    p.input,
                    p.cached_input,
                    p.output,
                    p.audio_input,
                    p.web_search_per_1k_calls,
                )
            })
            .collect();
        let want: Vec<(&str, String, i64, i64, i64, i64, i64)> = checked
            .iter()
            .map(|&(m, d, i, c, o, a, w)| (m, d.to_string(), i, c, o, a, w))
            .collect();
        assert_eq!(rows, want);
        // 2.0 Flash-Lite: no context caching, cached input at the input price.
        let lite = &t.for_upstream_model("gemini-2.0-flash-lite")[0].prices;
        assert_eq!(
            (lite.input, lite.cached_input, lite.output),
            (75_000, 75_000, 300_000)
        );
        // 2.5 Pro's tier above 200 000 on both of its entries: ×2 input (the page's $2.50
        // and, cached, $0.625 then $0.25), ×1.5 output ($15.00).
        for day in ["2025-08-01", "2026-12-01"] {
            let at = NaiveDate::parse_from_str(day, "%Y-%m-%d")
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc();
            assert_eq!(
                t.long_context("gemini-2.5-pro").at(at),
                Some(LongTier {
                    above: 200_000,
                    input_permille: 2_000,
                    output_permille: 1_500,
                }),
                "{day}"
            );
        }
    }

    #[test]
    fn a_dated_upstream_name_matches_its_undated_entry() {
        let t = bundled();
        assert_eq!(
            without_date_suffix("gpt-4o-mini-2024-07-18"),
            Some("gpt-4o-mini")
        );
        assert_eq!(
            without_date_suffix("claude-sonnet-4-20250514"),
            Some("claude-sonnet-4")
        );
        assert_eq!(without_date_suffix("gpt-4o-mini"), None);
        assert_eq!(without_date_suffix("o3-mini"), None);
        assert_eq!(without_date_suffix("model-12345678x"), None);
        assert_eq!(without_date_suffix("-2024-07-18"), None);
        assert_eq!(
            t.for_upstream_model("gpt-4o-mini-2024-07-18"),
            t.for_upstream_model("gpt-4o-mini")
        );
        assert_eq!(
            t.for_upstream_model("claude-3-5-haiku-20241022"),
            t.for_upstream_model("claude-3-5-haiku")
        );
        // A snapshot with its own entry keeps it: the first gpt-4o is not priced as gpt-4o.
        assert_eq!(
            t.for_upstream_model("gpt-4o-2024-05-13")[0].prices.input,
            5_000_000
        );
        assert_eq!(
            t.for_upstream_model("gpt-4o-2024-08-06")[0].prices.input,
            2_500_000
        );
        assert!(t.for_upstream_model("gpt-4o-mini-upstream").is_empty());
        assert!(t.for_upstream_model("my-llama").is_empty());
    }

    #[test]
    fn a_table_with_a_float_an_unknown_key_or_no_source_is_refused() {
        let entry = |extra: &str| {
            format!(
                "[[prices]]\nprovider = \"openai\"\nmodel = \"m\"\neffective = \"2025-01-01\"\n\
                 as_of = \"2025-02-01\"\nsource_url = \"https://example.com/p\"\n{extra}"
            )
        };
        let good = entry("input_usd_per_mtok = \"1\"\noutput_usd_per_mtok = \"2\"\n");
        assert_eq!(
            parse(&good).unwrap().entries[0].dated.prices.output,
            2_000_000
        );
        for (bad, why) in [
            (
                entry("input_usd_per_mtok = 1.0\noutput_usd_per_mtok = \"2\"\n"),
                "decimal strings",
            ),
            (
                entry(
                    "input_usd_per_mtok = \"1\"\noutput_usd_per_mtok = \"2\"\nvideo_usd = \"1\"\n",
                ),
                "unknown key `video_usd`",
            ),
            (entry("input_usd_per_mtok = \"1\"\n"), "output_usd_per_mtok"),
            (
                good.replace("https://example.com/p", "ftp://x"),
                "source_url",
            ),
            (good.replace("as_of = \"2025-02-01\"\n", ""), "as_of"),
        ] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }
}

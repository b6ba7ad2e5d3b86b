//! Reading prices: one function (`PriceKeys::prices`) for a model's top-level keys, its
//! dated entries, an admin's edit and the bundled table's entries; the config layer of a
//! model's schedule; and the rule that a model without a price in force is refused, never
//! priced at zero (`Settings::check_priced`).

use chrono::{DateTime, NaiveDate, Utc};

use super::price_table;
use super::{ConfigError, ModelSettings, PriceKeys, Provider, Settings, Usd};
use crate::quota::fill::{Kind, Partial, Stated};
use crate::quota::pricing::{parse_usd, Prices};
use crate::quota::schedule::{AdminPrices, Dated, Schedule};

/// The largest price accepted, in USD per million tokens.
const MAX_USD: i64 = 1_000_000;

impl Usd {
    /// Integer micro-dollars: a decimal string exactly (`pricing::parse_usd`), a number
    /// rounded to 6 decimals (which removes the binary float's noise).
    pub fn micros(&self, field: &str, model: &str) -> Result<i64, ConfigError> {
        let micros = match self {
            Usd::Text(s) => parse_usd(s),
            Usd::Number(v) if v.is_finite() && *v >= 0.0 && *v <= MAX_USD as f64 => {
                Some((v * 1_000_000.0).round() as i64)
            }
            Usd::Number(_) => None,
        };
        micros.filter(|m| *m <= MAX_USD * 1_000_000).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "model `{model}`: `{field}` must be a price in USD from 0 to {MAX_USD}, \
                     with at most 6 decimals"
            ))
        })
    }
}

impl PriceKeys {
    /// The price these keys give, in micro-dollars per million tokens, every kind they do
    /// not state at the price it falls under within the price (`fill::Kind`); `None` when
    /// no key is set. On a route, such a kind is taken from a lower layer first
    /// (`schedule`): this is the price as the keys alone say it.
    pub fn prices(&self, model: &str) -> Result<Option<Prices>, ConfigError> {
        Ok(self.partial(model)?.map(|p| p.fill(false)))
    }

    /// The price these keys state and which kinds they state. A price names its input and
    /// its output (0 written out where nothing is charged, as for an embedding model's
    /// output): a missing one is an error, never 0. Every other kind is optional.
    pub fn partial(&self, model: &str) -> Result<Option<Partial>, ConfigError> {
        if self.is_empty() {
            return Ok(None);
        }
        let need = |v: &Option<Usd>, field: &str| match v {
            Some(v) => v.micros(field, model),
            None => Err(ConfigError::Invalid(format!(
                "model `{model}`: a price needs `{field}` (write 0 where nothing is charged)"
            ))),
        };
        let input = need(&self.input_usd_per_mtok, "input_usd_per_mtok")?;
        let output = need(&self.output_usd_per_mtok, "output_usd_per_mtok")?;
        let mut p = Partial {
            prices: Prices::plain(input, output),
            stated: Stated::default(),
        };
        // USD per 1 000 web-search calls → micro-dollars per 1 000 calls, as the tokens'.
        for (kind, value, field) in [
            (
                Kind::CachedInput,
                &self.cached_input_usd_per_mtok,
                "cached_input_usd_per_mtok",
            ),
            (
                Kind::CacheWrite5m,
                &self.cache_write_5m_usd_per_mtok,
                "cache_write_5m_usd_per_mtok",
            ),
            (
                Kind::CacheWrite1h,
                &self.cache_write_1h_usd_per_mtok,
                "cache_write_1h_usd_per_mtok",
            ),
            (
                Kind::Reasoning,
                &self.reasoning_usd_per_mtok,
                "reasoning_usd_per_mtok",
            ),
            (
                Kind::AudioInput,
                &self.audio_input_usd_per_mtok,
                "audio_input_usd_per_mtok",
            ),
            (
                Kind::AudioOutput,
                &self.audio_output_usd_per_mtok,
                "audio_output_usd_per_mtok",
            ),
            (
                Kind::ImageInput,
                &self.image_input_usd_per_mtok,
                "image_input_usd_per_mtok",
            ),
            (
                Kind::ImageOutput,
                &self.image_output_usd_per_mtok,
                "image_output_usd_per_mtok",
            ),
            (
                Kind::WebSearch,
                &self.web_search_usd_per_1k_calls,
                "web_search_usd_per_1k_calls",
            ),
        ] {
            if let Some(v) = value {
                kind.set(&mut p.prices, v.micros(field, model)?);
                p.stated = p.stated.with(kind);
            }
        }
        // The kinds not stated at their within-price default, as `prices` shows them.
        Ok(Some(Partial {
            prices: p.fill(false),
            stated: p.stated,
        }))
    }
}

/// An effective date: `2026-03-01` (midnight UTC) or an RFC 3339 instant.
pub fn parse_effective(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Some(d.and_hms_opt(0, 0, 0)?.and_utc());
    }
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

impl ModelSettings {
    /// The config file's layer of this model's schedule: the top-level price from the
    /// beginning, each `[[models.prices]]` from its date, or zero from the beginning when
    /// `free = true`. Errors name the model and the key.
    pub fn config_prices(&self) -> Result<Vec<Dated>, ConfigError> {
        let name = &self.name;
        let invalid = |why: String| Err(ConfigError::Invalid(format!("model `{name}`: {why}")));
        let top = self.price.partial(name)?;
        if self.free {
            if top.is_some() || !self.prices.is_empty() {
                return invalid("`free = true` and a price: say one".into());
            }
            // Every kind stated at zero: nothing is filled from a lower layer.
            return Ok(vec![Dated::new(
                DateTime::<Utc>::MIN_UTC,
                Partial::whole(Prices::default()),
            )]);
        }
        let mut out: Vec<Dated> = top
            .map(|p| Dated::new(DateTime::<Utc>::MIN_UTC, p))
            .into_iter()
            .collect();
        for entry in &self.prices {
            let Some(from) = parse_effective(&entry.effective) else {
                return invalid(format!(
                    "`effective = {:?}` in [[models.prices]] is not a date (2026-03-01) or an \
                     RFC 3339 instant",
                    entry.effective
                ));
            };
            let Some(prices) = entry.keys.partial(name)? else {
                return invalid(format!(
                    "the [[models.prices]] entry effective {:?} has no price keys",
                    entry.effective
                ));
            };
            if out.iter().any(|d| d.from == from) {
                return invalid(format!(
                    "two [[models.prices]] entries are effective {:?}",
                    entry.effective
                ));
            }
            out.push(Dated::new(from, prices));
        }
        out.sort_by_key(|d| d.from);
        Ok(out)
    }

    /// The schedule of this model's route to `upstream_model` on a `provider` upstream in
    /// `region`: `admin` (this model's appended rows), the config layer, and the bundled
    /// table's entries for that name on that provider there (`Table::for_route`: a Bedrock
    /// id of a bundled Claude model, in AWS's commercial partition); Anthropic's rule fills
    /// what none states on a route it bills.
    pub fn schedule(
        &self,
        admin: &AdminPrices,
        upstream_model: &str,
        provider: Provider,
        region: Option<&str>,
    ) -> Schedule {
        let rows = admin.get(&self.name).map(Vec::as_slice).unwrap_or_default();
        Schedule::new(
            rows.iter().map(|a| a.for_route(upstream_model)).collect(),
            // Validated before a catalog is built (`Settings::validate`): an error here
            // would have stopped it, so none is left to be dropped.
            self.config_prices().unwrap_or_default(),
            price_table::bundled().for_route(upstream_model, provider, region),
        )
        .billed_by_anthropic(billed_by_anthropic(provider, upstream_model))
    }
}

impl Settings {
    /// Every route of every model has a price in force at `now` — from an admin, the
    /// config file or the bundled table — or its model says `free = true`. A model
    /// without one is refused, named, rather than served at zero. An admin price set for
    /// other upstream models than a route serves is warned of.
    pub fn check_priced(&self, admin: &AdminPrices, now: DateTime<Utc>) -> Result<(), ConfigError> {
        for m in &self.models {
            for r in &m.routes {
                // The model a route serves (on Azure, not its deployment's name).
                let name = &r.model;
                let upstream = self.upstreams.iter().find(|u| u.id == r.upstream);
                // Validated: a route names a configured upstream. The provider (and a
                // Bedrock upstream's Region) decide how the name matches the bundled
                // table and which rule fills the kinds no layer states.
                let provider = upstream.map_or(Provider::default(), |u| u.provider);
                let region = upstream
                    .and_then(|u| price_table::billing_region(u.region.as_deref(), &u.base_url));
                let schedule = m.schedule(admin, name, provider, region);
                if let Some(set_for) = schedule.admin_set_aside(now) {
                    // At every start and rebuild: the model was re-pointed since its admin
                    // price was set.
                    tracing::warn!(model = %m.name, upstream_model = %name, set_for = ?set_for,
                        "the admin price in force was set for other upstream models: not applied to this route (its config or bundled price is)");
                }
                if schedule.rates_at(now).is_none() {
                    let why = match region
                        .filter(|r| provider == Provider::Bedrock && !price_table::commercial(r))
                    {
                        Some(r) => format!(
                            "its upstream's Region `{r}` is outside AWS's commercial partition, \
                             whose prices the bundled table holds"
                        ),
                        None => format!(
                            "the bundled price table has no entry for its upstream model `{name}`"
                        ),
                    };
                    return Err(ConfigError::Invalid(format!(
                        "model `{}` has no price in force: set input_usd_per_mtok and \
                         output_usd_per_mtok (or [[models.prices]]), or free = true; {why}",
                        m.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Whether Anthropic bills what a route serves, so its rule fills the kinds no layer
/// prices: the `anthropic` provider, or a Claude model behind another one (Bedrock's
/// `anthropic.claude-…`, a compatible proxy's `anthropic/claude-…`).
fn billed_by_anthropic(provider: Provider, upstream_model: &str) -> bool {
    provider == Provider::Anthropic || upstream_model.to_ascii_lowercase().contains("claude")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_from;
    use crate::quota::schedule::Appended;

    fn settings(model: &str) -> Settings {
        let text = format!(
            "[[upstreams]]\nid = \"a\"\nprovider = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\n\
             api_key = \"k\"\n[[models]]\n{model}"
        );
        load_from(Some(&text), &Default::default()).unwrap()
    }

    fn now() -> DateTime<Utc> {
        parse_effective("2026-12-02T12:00:00Z").unwrap()
    }

    #[test]
    fn top_level_and_dated_prices_read_through_one_function() {
        let s = settings(
            "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"mine\" }]\n\
             input_usd_per_mtok = 0.15\noutput_usd_per_mtok = \"0.60\"\n\
             [[models.prices]]\neffective = \"2026-03-15\"\ninput_usd_per_mtok = \"0.2\"\n\
             output_usd_per_mtok = 0.8\ncached_input_usd_per_mtok = \"0.1\"\n",
        );
        s.validate().unwrap();
        let layer = s.models[0].config_prices().unwrap();
        assert_eq!(layer.len(), 2);
        assert_eq!(layer[0].prices, Prices::plain(150_000, 600_000));
        assert_eq!(layer[1].from, parse_effective("2026-03-15").unwrap());
        assert_eq!(layer[1].prices.cached_input, 100_000);
        let sched = s.models[0].schedule(&AdminPrices::default(), "mine", Provider::Openai, None);
        let at = |t: &str| sched.rates_at(parse_effective(t).unwrap()).unwrap().input;
        assert_eq!(at("2026-03-14T23:59:59.999Z"), 150_000);
        assert_eq!(at("2026-03-15T00:00:00Z"), 200_000);
    }

    #[test]
    fn a_model_without_a_price_is_refused_by_name_unless_free() {
        let unpriced =
            settings("name = \"house-llm\"\nroutes = [{ upstream = \"a\", model = \"llama\" }]\n");
        unpriced.validate().unwrap();
        let err = unpriced
            .check_priced(&AdminPrices::default(), now())
            .unwrap_err()
            .to_string();
        assert!(err.contains("model `house-llm` has no price"), "{err}");
        let free = settings(
            "name = \"house-llm\"\nfree = true\nroutes = [{ upstream = \"a\", model = \"llama\" }]\n",
        );
        free.check_priced(&AdminPrices::default(), now()).unwrap();
        assert_eq!(
            free.models[0]
                .schedule(&AdminPrices::default(), "llama", Provider::Openai, None)
                .rates_at(now()),
            Some(Prices::default())
        );
        // A bundled upstream model needs no config price.
        let bundled = settings("name = \"mini\"\nroutes = [{ upstream = \"a\", model = \"gpt-4o-mini-2024-07-18\" }]\n");
        bundled
            .check_priced(&AdminPrices::default(), now())
            .unwrap();
        // A dated config price only from the future: nothing in force now.
        let later = settings(
            "name = \"later\"\nroutes = [{ upstream = \"a\", model = \"llama\" }]\n\
             [[models.prices]]\neffective = \"2027-01-01\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
        );
        assert!(later.check_priced(&AdminPrices::default(), now()).is_err());
        // An admin row prices it.
        let admin: AdminPrices = [(
            "house-llm".to_string(),
            vec![Appended {
                from: now(),
                prices: Some(Partial::whole(Prices::plain(1, 2))),
                set_for: None,
            }],
        )]
        .into();
        unpriced.check_priced(&admin, now()).unwrap();
    }

    /// A route's prices at `now`, its model configured by `model` on an Anthropic upstream.
    fn anthropic_route(model: &str) -> Prices {
        let text = format!(
            "[[upstreams]]\nid = \"c\"\nprovider = \"anthropic\"\n\
             base_url = \"https://api.anthropic.com\"\napi_key = \"k\"\n[[models]]\n{model}"
        );
        let s = load_from(Some(&text), &Default::default()).unwrap();
        s.validate().unwrap();
        s.check_priced(&AdminPrices::default(), now()).unwrap();
        let m = &s.models[0];
        m.schedule(
            &AdminPrices::default(),
            &m.routes[0].model,
            Provider::Anthropic,
            None,
        )
        .rates_at(now())
        .unwrap()
    }

    #[test]
    fn kinds_a_config_price_leaves_out_come_from_the_bundled_entry_or_anthropics_rule() {
        // Input and output only, for a bundled upstream model (dated name): the cache and
        // search prices are the bundled entry's, not the input price and zero.
        let p = anthropic_route(
            "name = \"sonnet\"\nroutes = [{ upstream = \"c\", model = \"claude-sonnet-4-5-20250929\" }]\n\
             input_usd_per_mtok = 3\noutput_usd_per_mtok = 15\n",
        );
        assert_eq!(
            (
                p.cached_input,
                p.cache_write_5m,
                p.cache_write_1h,
                p.web_search_per_1k_calls
            ),
            (300_000, 3_750_000, 6_000_000, 10_000_000)
        );
        assert_eq!(
            (p.input, p.output, p.reasoning),
            (3_000_000, 15_000_000, 15_000_000)
        );
        // A Claude model the table does not know: Anthropic's multipliers of its input
        // price (0.1×, 1.25×, 2×, $10 per 1 000 searches); a kind it states stays.
        let p = anthropic_route(
            "name = \"next\"\nroutes = [{ upstream = \"c\", model = \"claude-next-7\" }]\n\
             input_usd_per_mtok = \"2.000001\"\noutput_usd_per_mtok = 10\n\
             cached_input_usd_per_mtok = \"0.25\"\n",
        );
        assert_eq!(
            (
                p.cached_input,
                p.cache_write_5m,
                p.cache_write_1h,
                p.web_search_per_1k_calls
            ),
            // 1.25 × 2 000 001 = 2 500 001.25, rounded up.
            (250_000, 2_500_002, 4_000_002, 10_000_000)
        );
        // Free stays free for every kind.
        let p = anthropic_route(
            "name = \"gift\"\nfree = true\nroutes = [{ upstream = \"c\", model = \"claude-sonnet-4-5\" }]\n",
        );
        assert_eq!(p, Prices::default());
        // Elsewhere, a kind nobody states falls under its price within the price.
        let s = settings(
            "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"llama\" }]\n\
             input_usd_per_mtok = 1\noutput_usd_per_mtok = 2\n",
        );
        let p = s.models[0]
            .schedule(&AdminPrices::default(), "llama", Provider::Openai, None)
            .rates_at(now())
            .unwrap();
        assert_eq!(p, Prices::plain(1_000_000, 2_000_000));
    }

    /// A Bedrock upstream in a Region outside AWS's commercial partition (GovCloud, China,
    /// the isolated and the European Sovereign Cloud) is billed by that partition's own
    /// price list, which the bundled table does not hold: no bundled price there, so the
    /// model needs its price in config and is refused at start without one, rather than
    /// priced at the commercial 1.1 × (s21a #3).
    #[test]
    fn a_bedrock_route_outside_the_commercial_partition_needs_a_config_price() {
        let route = "routes = [{ upstream = \"b\", model = \"anthropic.claude-sonnet-4-5-20250929-v1:0\" }]\n";
        let in_region = |region: &str, price: &str| {
            let text = format!(
                "[[upstreams]]\nid = \"b\"\nprovider = \"bedrock\"\nregion = \"{region}\"\n\
                 api_key = \"k\"\n[[models]]\nname = \"sonnet\"\n{route}{price}"
            );
            let s = load_from(Some(&text), &Default::default()).unwrap();
            s.validate().unwrap();
            s.check_priced(&AdminPrices::default(), now())
        };
        in_region("us-east-1", "").unwrap();
        in_region("eu-central-1", "").unwrap();
        for region in [
            "us-gov-west-1",
            "cn-north-1",
            "us-iso-east-1",
            "us-isob-east-1",
            "eu-isoe-west-1",
            "eusc-de-east-1",
        ] {
            let err = in_region(region, "").unwrap_err().to_string();
            assert!(
                err.contains("model `sonnet` has no price") && err.contains(region),
                "{region}: {err}"
            );
            in_region(region, "input_usd_per_mtok = 4\noutput_usd_per_mtok = 20\n").unwrap();
        }
        // A GovCloud endpoint under a commercial `region` (an API key holds it to nothing).
        let err = in_region(
            "us-east-1\"\nbase_url = \"https://bedrock-runtime.us-gov-west-1.amazonaws.com",
            "",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("us-gov-west-1"), "{err}");
    }

    /// A config price dearer than the entry below it (a Bedrock Region above the bundled
    /// 1.1 ×, a data-zone surcharge) keeps that entry's multiples for the kinds it leaves
    /// out, rounded up: the bundled figures taken as written billed cache reads and writes
    /// below the configured input's multiples (s21a #4). A cheaper one keeps the figures.
    #[test]
    fn kinds_a_config_price_leaves_out_follow_its_input_and_output() {
        let text = "[[upstreams]]\nid = \"b\"\nprovider = \"bedrock\"\nregion = \"us-east-1\"\n\
             api_key = \"k\"\n[[models]]\nname = \"sonnet\"\n\
             routes = [{ upstream = \"b\", model = \"anthropic.claude-sonnet-4-5-20250929-v1:0\" }]\n";
        let priced = |extra: &str| {
            let s = load_from(Some(&format!("{text}{extra}")), &Default::default()).unwrap();
            s.validate().unwrap();
            let m = &s.models[0];
            m.schedule(
                &AdminPrices::default(),
                &m.routes[0].model,
                Provider::Bedrock,
                Some("us-east-1"),
            )
            .rates_at(now())
            .unwrap()
        };
        let bundled = priced("");
        // Bedrock's regional figures, 1.1 × Anthropic's list.
        assert_eq!(
            (bundled.input, bundled.cache_write_5m, bundled.reasoning),
            (3_300_000, 4_125_000, 16_500_000)
        );
        let p = priced("input_usd_per_mtok = 4\noutput_usd_per_mtok = 20\n");
        assert_eq!(
            (
                p.cached_input,
                p.cache_write_5m,
                p.cache_write_1h,
                p.reasoning,
                p.web_search_per_1k_calls
            ),
            // 0.1 ×, 1.25 ×, 2 × of 4 and the output for reasoning; a search is a fee, not
            // a rate: the entry's.
            (
                400_000,
                5_000_000,
                8_000_000,
                20_000_000,
                bundled.web_search_per_1k_calls
            )
        );
        // Dearer by a fraction: rounded up (4.125 × 3.300001 / 3.3 = 4.12500125).
        let p = priced("input_usd_per_mtok = \"3.300001\"\noutput_usd_per_mtok = 20\n");
        assert_eq!((p.cached_input, p.cache_write_5m), (330_001, 4_125_002));
        // Cheaper than the entry: its figures as written — a discount on them is stated.
        let p = priced("input_usd_per_mtok = 1\noutput_usd_per_mtok = 5\n");
        assert_eq!((p.cached_input, p.cache_write_5m), (330_000, 4_125_000));
    }

    #[test]
    fn half_a_price_or_a_bad_date_is_refused_naming_the_key() {
        for (model, why) in [
            (
                "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"x\" }]\ninput_usd_per_mtok = 1\n",
                "needs `output_usd_per_mtok`",
            ),
            (
                "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"x\" }]\ninput_usd_per_mtok = 1\n\
                 output_usd_per_mtok = -1\n",
                "`output_usd_per_mtok` must be a price",
            ),
            (
                "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"x\" }]\n\
                 input_usd_per_mtok = \"0.0000001\"\noutput_usd_per_mtok = 1\n",
                "`input_usd_per_mtok` must be a price",
            ),
            (
                "name = \"m\"\nroutes = [{ upstream = \"a\", model = \"x\" }]\n[[models.prices]]\n\
                 effective = \"March\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
                "`effective = \"March\"`",
            ),
            (
                "name = \"m\"\nfree = true\nroutes = [{ upstream = \"a\", model = \"x\" }]\n\
                 input_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
                "`free = true` and a price",
            ),
        ] {
            let err = settings(model).validate().unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
        let typo = "[[upstreams]]\nid = \"a\"\nprovider = \"openai\"\nbase_url = \"https://x.example\"\n\
                    api_key = \"k\"\n[[models]]\nname = \"m\"\nroutes = []\ninput_usd_per_mtk = 1\n";
        assert!(load_from(Some(typo), &Default::default()).is_err());
    }
}

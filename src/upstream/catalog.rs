//! The configured deployments (one key at one base URL) and models (a name, its aliases, its
//! routes to deployments, its fallbacks, prices and caps), resolved into indexes so the
//! request path does no string matching beyond one hash lookup.
//!
//! A catalog is rebuilt whenever the managed keys and models change or the config file is
//! reloaded (`upstream::live`), and a request keeps the one it started with. So that an
//! index means the same deployment in every catalog of the process, a rebuild keeps every
//! deployment id at its position (`Catalog::rebuild`): new ids are appended, and a removed
//! one stays as a retired entry that no route names and no new attempt picks, which lets the
//! requests in flight on it finish.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::price_table::{self, Family};
use crate::config::{BilledFields, OutputCapParam, Provider, Secret, Settings, UpstreamSettings};
use crate::endpoint::Endpoint;
use crate::quota::images::Rule;
use crate::quota::long_tiers::LongTiers;
use crate::quota::pricing::LongTier;
use crate::quota::schedule::{AdminPrices, Schedule};
use crate::upstream::credential::Credential;
use crate::upstream::providers;

#[derive(Debug)]
pub struct Deployment {
    pub id: String,
    /// Added in the admin UI or API (stored sealed in the database), not from the config file.
    pub managed: bool,
    /// `false` once an admin disabled it (every replica), or when it was removed.
    pub usable: bool,
    /// A managed upstream's sealing (its nonce's first bytes; 0 for the file's): every
    /// admin change of the row — rotate, enable, disable — seals the key again under a
    /// fresh nonce, so a new value tells every replica the admin acted on it (`live`: what
    /// the pool learned of the key is then forgotten, as for a new key).
    pub sealing: u64,
    /// A keyed tag of the key and its sealing (`Sealer::tag`; 0 in a catalog built
    /// without the database's sealer): the name replicas share its state under.
    shared_tag: u32,
    /// The keyed digest of everything its credential is made of (`live::effective`; `None`
    /// in a catalog built without the database's sealer): a rebuild that finds it unchanged
    /// keeps the credential hook in use, and with it the cached token.
    credential_id: Option<[u8; 32]>,
    pub provider: Provider,
    /// Without a trailing slash; paths are appended as the provider's SDK would.
    pub base_url: String,
    pub api_key: Secret,
    pub allow_private: bool,
    /// The key's own request and token windows (`rpm_limit`, `tpm_limit`; 0 = none).
    pub rpm_limit: u64,
    pub tpm_limit: u64,
    /// Streams ask for a usage chunk (`quirks.include_usage`).
    pub include_usage: bool,
    /// The billed router fields a client may send it (`quirks.billed_fields`).
    pub billed_fields: BilledFields,
    /// The URLs of every route target (`Route::target`): for most providers one, shared by
    /// every route; where the URL names the deployment or model (Azure, Gemini, Bedrock), one per name. Each
    /// holds the URL of every endpoint, streamed and not, parsed once at start rather than
    /// on every request.
    targets: Vec<Target>,
    /// How requests prove who they are (see `credential`): for most, one header built once
    /// and marked sensitive so that no debug print shows it.
    credential: Credential,
}

#[derive(Debug)]
struct Target {
    name: String,
    urls: Vec<(Endpoint, bool, reqwest::Url)>,
}

impl Deployment {
    /// `kept`: the previous catalog's credential hook for the same credential, else one is
    /// made from `u`.
    fn new(
        u: &UpstreamSettings,
        managed: bool,
        usable: bool,
        (sealing, shared_tag, credential_id): (u64, u32, Option<[u8; 32]>),
        kept: Option<Credential>,
    ) -> Deployment {
        Deployment {
            id: u.id.clone(),
            managed,
            usable,
            sealing,
            shared_tag,
            credential_id,
            provider: u.provider,
            base_url: u.effective_base_url().trim_end_matches('/').to_string(),
            api_key: u.api_key.clone(),
            allow_private: u.allow_private_network,
            rpm_limit: u.rpm_limit,
            tpm_limit: u.tpm_limit,
            include_usage: u.quirks.include_usage,
            billed_fields: BilledFields::of(&u.quirks.billed_fields),
            targets: Vec::new(),
            credential: kept.unwrap_or_else(|| providers::credential(u)),
        }
    }

    /// A deployment of `u` alone, outside a catalog (the client's own tests).
    #[cfg(test)]
    pub(crate) fn alone(u: &UpstreamSettings) -> Deployment {
        Deployment::new(u, false, true, (0, 0, None), None)
    }

    /// This deployment with its credential made by `hook` (the client's own tests).
    #[cfg(test)]
    pub(crate) fn hooked(mut self, hook: Arc<dyn crate::upstream::credential::Authorize>) -> Self {
        self.credential = Credential::Hook(hook);
        self
    }

    /// The index of a route target's URLs, made the first time it is named.
    fn target(&mut self, u: &UpstreamSettings, name: &str) -> usize {
        let name = if providers::target_in_url(u.provider) {
            name
        } else {
            ""
        };
        if let Some(i) = self.targets.iter().position(|t| t.name == name) {
            return i;
        }
        let urls = Endpoint::ALL
            .iter()
            .flat_map(|e| [(*e, false), (*e, true)])
            .filter_map(|(e, stream)| {
                Some((
                    e,
                    stream,
                    providers::url(u, &self.base_url, e, name, stream)?,
                ))
            })
            .collect();
        self.targets.push(Target {
            name: name.to_string(),
            urls,
        });
        self.targets.len() - 1
    }

    /// The URL `route`'s request to `endpoint` goes to (see `providers::url`). The route may
    /// come from an earlier catalog than this deployment (a request that started before a
    /// rebuild, which numbers targets anew): its index is used when it still names the
    /// route's model, else the target is found by that name — never another model's URL.
    pub fn url(&self, route: &Route, endpoint: Endpoint, stream: bool) -> Option<&reqwest::Url> {
        let name = if providers::target_in_url(self.provider) {
            route.upstream_model.as_str()
        } else {
            ""
        };
        self.targets
            .get(route.target)
            .filter(|t| t.name == name)
            .or_else(|| self.targets.iter().find(|t| t.name == name))?
            .urls
            .iter()
            .find(|(e, s, _)| *e == endpoint && *s == stream)
            .map(|(_, _, u)| u)
    }

    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// The name replicas share this key's state under (its cooldown in Redis): the
    /// upstream's id and the keyed tag of its key and sealing, so a rotated key starts
    /// clean everywhere, and the name tells whoever reads Redis nothing of the key.
    /// The keyed tag of every credential the deployment sends, and its sealing.
    pub fn shared_tag(&self) -> u32 {
        self.shared_tag
    }

    pub fn shared_name(&self) -> String {
        format!("{}:{:08x}", self.id, self.shared_tag)
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    /// Index into `Catalog::deployments`.
    pub deployment: usize,
    /// The model name the upstream knows (on Azure, the deployment's name).
    pub upstream_model: String,
    /// The model the route serves, which prices go by (on Azure, not the deployment's
    /// name): the bundled entry's name, and the one an admin price is set for.
    pub model: String,
    /// Which of the deployment's URL sets this route's requests go to (`Deployment::url`).
    pub target: usize,
    /// The body field this upstream model takes its output cap in (config
    /// `output_cap_param`, else by the model's name; always `max_tokens` on Anthropic).
    pub cap_param: OutputCapParam,
    /// What a request served here costs at each instant: its model's admin and config
    /// prices, else the bundled table's for `upstream_model` (`quota::schedule`).
    pub schedule: Arc<Schedule>,
    /// How the provider turns a request's images into tokens here, decided once when the
    /// catalog is built rather than from the names on every request.
    pub image_rule: Rule,
    /// Whose model this route serves, by its names as its tiers are
    /// (`price_table::Table::route_family`): whose tokenizer counts its input.
    pub family: Family,
    /// The longest prompt its model is served without Claude's 1M beta, if the bundled
    /// table knows one (`price_table::Table::route_window`: Claude up to 4.5).
    pub window: Option<i64>,
    /// The dearer tier the provider bills this route's long prompts at, if any: in the
    /// catalog the latest one; on a candidate (`Route::at`) the one in force when its
    /// request started, which the reservation and the settlement both price with.
    pub long_context: Option<LongTier>,
    /// That tier over time: the bundled entries' of the route's `tier_model`, else of its
    /// model and upstream model (the lower threshold), else of the gateway's model name
    /// where the route's provider serves that model's family
    /// (`price_table::Table::route_tiers`, `quota::long_tiers`).
    pub long_context_tiers: LongTiers,
}

impl Route {
    /// This route as a request started at `t` is served by it: its long-context tier the
    /// one in force then, as its prices are (`Schedule::rates_at`).
    pub fn at(&self, t: DateTime<Utc>) -> Route {
        Route {
            long_context: self.long_context_tiers.at(t),
            ..self.clone()
        }
    }

    /// The field the output cap is sent in for a request to `endpoint`: the legacy
    /// completions endpoint only knows `max_tokens`.
    pub fn cap_field(&self, endpoint: Endpoint) -> &'static str {
        match endpoint {
            Endpoint::Completions => OutputCapParam::MaxTokens.field(),
            _ => self.cap_param.field(),
        }
    }
}

#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub routes: Vec<Route>,
    pub fallbacks: Vec<String>,
    pub max_output_tokens: i64,
    pub max_input_tokens: i64,
    pub cache_similarity_threshold: Option<f64>,
    pub cache_ignore_identifiers: Option<bool>,
}

#[derive(Debug, Default)]
pub struct Catalog {
    /// Every deployment this process has known, at a fixed position (see the module doc);
    /// `retired` ones are no longer configured.
    pub deployments: Vec<Arc<Deployment>>,
    pub retired: Vec<bool>,
    models: HashMap<String, Arc<Model>>,
    /// Canonical names in config order, for `/v1/models`.
    pub names: Vec<String>,
}

impl Catalog {
    /// Built from validated settings.
    pub fn from_settings(s: &Settings) -> Catalog {
        Catalog::rebuild(s, &Managed::default(), None)
    }

    /// Built from validated settings, keeping every deployment of `previous` at its
    /// position (those no longer in `s` retired), `managed` telling which upstreams came
    /// from the database and which of those are disabled.
    pub fn rebuild(s: &Settings, managed: &Managed, previous: Option<&Catalog>) -> Catalog {
        let mut slots: Vec<Slot> = previous
            .map(|p| p.deployments.iter().map(|d| Slot::Old(d.clone())).collect())
            .unwrap_or_default();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for u in &s.upstreams {
            let at = slots.iter().position(|x| x.id() == u.id);
            let credential_id = managed.credential_ids.get(&u.id).copied();
            // A token source (Entra, Vertex) of the same credential is kept, its cached
            // token with it: a rebuild for an unrelated change (a price, another model, a
            // SIGHUP) sends no deployment back to its token endpoint.
            let kept = at.and_then(|i| slots[i].hook_for(credential_id));
            let d = Deployment::new(
                u,
                managed.ids.contains(&u.id),
                !managed.disabled.contains(&u.id),
                (
                    managed.sealings.get(&u.id).copied().unwrap_or(0),
                    managed.shared_tags.get(&u.id).copied().unwrap_or(0),
                    credential_id,
                ),
                kept,
            );
            let i = match at {
                Some(i) => {
                    slots[i] = Slot::New(Box::new(d));
                    i
                }
                None => {
                    slots.push(Slot::New(Box::new(d)));
                    slots.len() - 1
                }
            };
            index.insert(u.id.as_str(), i);
        }
        let by_id: HashMap<&str, &UpstreamSettings> =
            s.upstreams.iter().map(|u| (u.id.as_str(), u)).collect();
        let mut models = HashMap::new();
        let mut names = Vec::new();
        for m in &s.models {
            let model = Arc::new(Model {
                name: m.name.clone(),
                routes: m
                    .routes
                    .iter()
                    .filter_map(|r| {
                        let &d = index.get(r.upstream.as_str())?;
                        let u = by_id.get(r.upstream.as_str())?;
                        // Azure's deployment: in the URL, and the body's model on the v1 path.
                        let name = r.deployment.as_ref().unwrap_or(&r.model);
                        let by_config = r.output_cap_param.or(u.quirks.max_tokens_field);
                        let table = price_table::bundled();
                        // The route's `tier_model`, else its upstream names' tiers, else
                        // the gateway name's where this provider serves its family.
                        let names = (r.tier_model.as_deref(), [r.model.as_str(), name]);
                        let tiers = table.route_tiers(names.0, &names.1, &m.name, u.provider);
                        let family = table.route_family(names.0, &names.1, &m.name, u.provider);
                        let window = table.route_window(names.0, &names.1, &m.name, u.provider);
                        Some(Route {
                            deployment: d,
                            schedule: Arc::new(m.schedule(
                                &managed.prices,
                                &r.model,
                                u.provider,
                                price_table::billing_region(u.region.as_deref(), &u.base_url),
                            )),
                            image_rule: Rule::of(u.provider, &[&r.model, name, &m.name]),
                            family,
                            window,
                            long_context: tiers.at(DateTime::<Utc>::MAX_UTC),
                            long_context_tiers: tiers,
                            upstream_model: name.clone(),
                            model: r.model.clone(),
                            target: slots[d].fresh()?.target(u, name),
                            cap_param: match u.provider {
                                Provider::Anthropic | Provider::Gemini | Provider::Bedrock => {
                                    OutputCapParam::MaxTokens
                                }
                                Provider::OpenaiCompatible => {
                                    by_config.unwrap_or(OutputCapParam::MaxTokens)
                                }
                                Provider::Openai | Provider::AzureOpenai => {
                                    by_config.unwrap_or_else(|| OutputCapParam::for_model(&r.model))
                                }
                            },
                        })
                    })
                    .collect(),
                fallbacks: m.fallbacks.clone(),
                max_output_tokens: i64::from(m.max_output_tokens),
                max_input_tokens: i64::from(m.max_input_tokens),
                cache_similarity_threshold: m.cache_similarity_threshold,
                cache_ignore_identifiers: m.cache_ignore_identifiers,
            });
            for n in std::iter::once(&m.name).chain(&m.aliases) {
                models.insert(n.clone(), model.clone());
            }
            names.push(m.name.clone());
        }
        let retired = slots.iter().map(|x| matches!(x, Slot::Old(_))).collect();
        Catalog {
            deployments: slots.into_iter().map(Slot::into_arc).collect(),
            retired,
            models,
            names,
        }
    }

    /// Whether a new attempt may go to deployment `d`: configured, and not disabled by an
    /// admin.
    pub fn usable(&self, d: usize) -> bool {
        !self.retired.get(d).copied().unwrap_or(true)
            && self.deployments.get(d).is_some_and(|x| x.usable)
    }

    /// The position of the configured (not retired) deployment `id`.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.deployments
            .iter()
            .enumerate()
            .position(|(i, d)| d.id == id && !self.retired[i])
    }

    /// A model by its name or one of its aliases.
    pub fn model(&self, name: &str) -> Option<&Arc<Model>> {
        self.models.get(name)
    }
}

/// Which upstreams of a settings tree were added in the admin (the rest came from the
/// config file), and which of those an admin disabled.
#[derive(Debug, Default, Clone)]
pub struct Managed {
    pub ids: std::collections::HashSet<String>,
    pub disabled: std::collections::HashSet<String>,
    /// Each managed upstream's `Deployment::sealing`.
    pub sealings: HashMap<String, u64>,
    /// Every upstream's `Deployment::shared_tag`.
    pub shared_tags: HashMap<String, u32>,
    /// Every upstream's `Deployment::credential_id`.
    pub credential_ids: HashMap<String, [u8; 32]>,
    /// The prices admins appended (`model_prices`), by model.
    pub prices: AdminPrices,
}

/// A position while a catalog is built: a deployment of the previous catalog (retired
/// unless the new settings name it again) or one built now.
enum Slot {
    Old(Arc<Deployment>),
    New(Box<Deployment>),
}

impl Slot {
    fn id(&self) -> &str {
        match self {
            Slot::Old(d) => &d.id,
            Slot::New(d) => &d.id,
        }
    }

    /// The credential hook of the previous catalog's deployment here, if it was made of
    /// the same credential (`credential_id`, known on both sides).
    fn hook_for(&self, credential_id: Option<[u8; 32]>) -> Option<Credential> {
        match self {
            Slot::Old(d)
                if credential_id.is_some()
                    && d.credential_id == credential_id
                    && matches!(d.credential, Credential::Hook(_)) =>
            {
                Some(d.credential.clone())
            }
            _ => None,
        }
    }

    fn fresh(&mut self) -> Option<&mut Deployment> {
        match self {
            Slot::New(d) => Some(d),
            Slot::Old(_) => None,
        }
    }

    fn into_arc(self) -> Arc<Deployment> {
        match self {
            Slot::Old(d) => d,
            Slot::New(d) => Arc::from(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_models_take_max_completion_tokens() {
        for name in [
            "o1",
            "o1-mini",
            "o3-mini",
            "o4-mini-2025-04-16",
            "gpt-5",
            "gpt-5-nano",
            "openai/o3",
        ] {
            assert_eq!(
                OutputCapParam::for_model(name),
                OutputCapParam::MaxCompletionTokens,
                "{name}"
            );
        }
        for name in [
            "gpt-4o-mini",
            "gpt-4.1",
            "omni-moderation",
            "llama3",
            "o",
            "qwen/o-1",
        ] {
            assert_eq!(
                OutputCapParam::for_model(name),
                OutputCapParam::MaxTokens,
                "{name}"
            );
        }
        let route = Route {
            deployment: 0,
            upstream_model: "o3".into(),
            model: "o3".into(),
            target: 0,
            cap_param: OutputCapParam::MaxCompletionTokens,
            schedule: Arc::default(),
            image_rule: Rule::Unknown,
            family: Family::Openai,
            window: None,
            long_context: None,
            long_context_tiers: LongTiers::default(),
        };
        assert_eq!(route.cap_field(Endpoint::Chat), "max_completion_tokens");
        assert_eq!(route.cap_field(Endpoint::Completions), "max_tokens");
    }

    /// A request prepared before a rebuild keeps its route; the rebuild numbers the
    /// deployment's URL targets anew (a model added before the others in order moves them).
    /// The old route still reaches its own model's URL, never the one now at its index
    /// (which served another model, at another price).
    #[test]
    fn a_route_from_an_earlier_catalog_reaches_its_own_models_url() {
        let gemini = |models: &[(&str, &str)]| {
            let mut s = settings(&[], &[]);
            s.models.clear();
            s.upstreams.push(UpstreamSettings {
                id: "g".into(),
                provider: Provider::Gemini,
                base_url: "https://generativelanguage.googleapis.com".into(),
                api_key: crate::config::Secret(secrecy::SecretString::from("AIza-test-key-1234")),
                ..Default::default()
            });
            let mut base = settings(&[], &[]).models.remove(0);
            for (name, upstream_model) in models {
                base.name = name.to_string();
                base.routes = vec![crate::config::RouteSettings {
                    upstream: "g".into(),
                    model: upstream_model.to_string(),
                    ..Default::default()
                }];
                s.models.push(base.clone());
            }
            s
        };
        let before = Catalog::from_settings(&gemini(&[("b", "gemini-flash"), ("c", "gemini-pro")]));
        let route = before.model("b").unwrap().routes[0].clone();
        let after = Catalog::rebuild(
            &gemini(&[
                ("a", "gemini-pro"),
                ("b", "gemini-flash"),
                ("c", "gemini-pro"),
            ]),
            &Managed::default(),
            Some(&before),
        );
        let url = after.deployments[route.deployment]
            .url(&route, Endpoint::Chat, false)
            .unwrap()
            .to_string();
        assert!(url.contains("/models/gemini-flash:"), "{url}");
        let moved = after.model("b").unwrap().routes[0].target;
        assert_ne!(moved, route.target, "the test must move the target");
    }

    fn settings(upstreams: &[&str], model_routes: &[&str]) -> Settings {
        let mut s = Settings::default();
        for id in upstreams {
            s.upstreams.push(UpstreamSettings {
                id: id.to_string(),
                provider: Provider::Openai,
                base_url: "https://api.openai.com/v1".into(),
                api_key: crate::config::Secret(secrecy::SecretString::from("sk-test-key-123456")),
                ..Default::default()
            });
        }
        s.models.push(crate::config::ModelSettings {
            name: "m".into(),
            aliases: vec![],
            routes: model_routes
                .iter()
                .map(|u| crate::config::RouteSettings {
                    upstream: u.to_string(),
                    model: "m".into(),
                    ..Default::default()
                })
                .collect(),
            fallbacks: vec![],
            price: crate::config::PriceKeys::usd(1.0, 2.0),
            prices: vec![],
            free: false,
            max_output_tokens: 16,
            max_input_tokens: 1000,
            cache_similarity_threshold: None,
            cache_ignore_identifiers: None,
        });
        s
    }

    /// An index means the same deployment in every catalog of the process: a removed one
    /// is retired in place (its requests in flight still find it), a new one is appended,
    /// and one that comes back takes its old place.
    #[test]
    fn a_rebuild_keeps_every_deployment_at_its_position() {
        let first = Catalog::from_settings(&settings(&["a", "b"], &["a", "b"]));
        let second = Catalog::rebuild(
            &settings(&["c", "b"], &["c", "b"]),
            &Managed::default(),
            Some(&first),
        );
        let ids: Vec<&str> = second.deployments.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(second.retired, [true, false, false]);
        assert!(!second.usable(0) && second.usable(1) && second.usable(2));
        assert_eq!(second.position("a"), None);
        assert_eq!(second.position("c"), Some(2));
        let routes: Vec<usize> = second
            .model("m")
            .unwrap()
            .routes
            .iter()
            .map(|r| r.deployment)
            .collect();
        assert_eq!(routes, [2, 1]);
        let disabled = Managed {
            ids: ["a".to_string()].into(),
            disabled: ["a".to_string()].into(),
            ..Managed::default()
        };
        let third = Catalog::rebuild(&settings(&["a", "b"], &["a"]), &disabled, Some(&second));
        assert_eq!(third.position("a"), Some(0));
        assert_eq!(third.retired, [false, false, true]);
        assert!(third.deployments[0].managed);
        assert!(!third.usable(0), "disabled by an admin");
        // The pool carries its entries by position: state set before is there after.
        let pool = crate::upstream::pool::Pool::new(&settings(&["a", "b"], &["a", "b"]));
        pool.cool_until(1, i64::MAX);
        let carried = crate::upstream::pool::Pool::carried(
            Some(&pool),
            &second,
            &settings(&["c", "b"], &["c"]),
        );
        assert_eq!(carried.cooling_until_ms(1), i64::MAX);
        assert_eq!(carried.cooling_until_ms(2), 0);
    }
}

//! The configured deployments (one key at one base URL) and models (a name, its aliases, its
//! routes to deployments, its fallbacks, prices and caps), resolved once at start into
//! indexes so the request path does no string matching beyond one hash lookup.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{OutputCapParam, Provider, Secret, Settings, UpstreamSettings};
use crate::pipeline::request::Endpoint;
use crate::quota::pricing::Prices;
use crate::upstream::credential::Credential;
use crate::upstream::providers;

#[derive(Debug)]
pub struct Deployment {
    pub id: String,
    pub provider: Provider,
    /// Without a trailing slash; paths are appended as the provider's SDK would.
    pub base_url: String,
    pub api_key: Secret,
    pub allow_private: bool,
    /// Streams ask for a usage chunk (`quirks.include_usage`).
    pub include_usage: bool,
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
    fn new(u: &UpstreamSettings) -> Deployment {
        Deployment {
            id: u.id.clone(),
            provider: u.provider,
            base_url: u.effective_base_url().trim_end_matches('/').to_string(),
            api_key: u.api_key.clone(),
            allow_private: u.allow_private_network,
            include_usage: u.quirks.include_usage,
            targets: Vec::new(),
            credential: providers::credential(u),
        }
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

    /// The URL a route's request to `endpoint` goes to (see `providers::url`).
    pub fn url(&self, target: usize, endpoint: Endpoint, stream: bool) -> Option<&reqwest::Url> {
        self.targets
            .get(target)?
            .urls
            .iter()
            .find(|(e, s, _)| *e == endpoint && *s == stream)
            .map(|(_, _, u)| u)
    }

    pub fn credential(&self) -> &Credential {
        &self.credential
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    /// Index into `Catalog::deployments`.
    pub deployment: usize,
    /// The model name the upstream knows (on Azure, the deployment's name).
    pub upstream_model: String,
    /// Which of the deployment's URL sets this route's requests go to (`Deployment::url`).
    pub target: usize,
    /// The body field this upstream model takes its output cap in (config
    /// `output_cap_param`, else by the model's name; always `max_tokens` on Anthropic).
    pub cap_param: OutputCapParam,
}

impl Route {
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
    pub prices: Prices,
    pub max_output_tokens: i64,
    pub max_input_tokens: i64,
    pub cache_similarity_threshold: Option<f64>,
    pub cache_ignore_identifiers: Option<bool>,
}

#[derive(Debug, Default)]
pub struct Catalog {
    pub deployments: Vec<Deployment>,
    models: HashMap<String, Arc<Model>>,
    /// Canonical names in config order, for `/v1/models`.
    pub names: Vec<String>,
}

impl Catalog {
    /// Built from validated settings.
    pub fn from_settings(s: &Settings) -> Catalog {
        let mut deployments: Vec<Deployment> = s.upstreams.iter().map(Deployment::new).collect();
        let index: HashMap<&str, usize> = s
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| (u.id.as_str(), i))
            .collect();
        let mut models = HashMap::new();
        let mut names = Vec::new();
        for m in &s.models {
            let (input, output, cached_input) = Settings::prices(m);
            let model = Arc::new(Model {
                name: m.name.clone(),
                routes: m
                    .routes
                    .iter()
                    .filter_map(|r| {
                        let &d = index.get(r.upstream.as_str())?;
                        let u = &s.upstreams[d];
                        // Azure's deployment: in the URL, and the body's model on the v1 path.
                        let name = r.deployment.as_ref().unwrap_or(&r.model);
                        let by_config = r.output_cap_param.or(u.quirks.max_tokens_field);
                        Some(Route {
                            deployment: d,
                            upstream_model: name.clone(),
                            target: deployments[d].target(u, name),
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
                prices: Prices {
                    input,
                    output,
                    cached_input,
                },
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
        Catalog {
            deployments,
            models,
            names,
        }
    }

    /// A model by its name or one of its aliases.
    pub fn model(&self, name: &str) -> Option<&Arc<Model>> {
        self.models.get(name)
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
            target: 0,
            cap_param: OutputCapParam::MaxCompletionTokens,
        };
        assert_eq!(route.cap_field(Endpoint::Chat), "max_completion_tokens");
        assert_eq!(route.cap_field(Endpoint::Completions), "max_tokens");
    }
}

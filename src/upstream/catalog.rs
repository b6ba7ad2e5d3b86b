//! The configured deployments (one key at one base URL) and models (a name, its aliases, its
//! routes to deployments, its fallbacks, prices and caps), resolved once at start into
//! indexes so the request path does no string matching beyond one hash lookup.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};

use crate::config::{OutputCapParam, Provider, Secret, Settings, UpstreamSettings};
use crate::pipeline::request::Endpoint;
use crate::quota::pricing::Prices;
use crate::upstream::providers;

#[derive(Debug)]
pub struct Deployment {
    pub id: String,
    pub provider: Provider,
    /// Without a trailing slash; paths are appended as the provider's SDK would.
    pub base_url: String,
    pub api_key: Secret,
    pub allow_private: bool,
    /// The URL of every path this provider serves, parsed once at start rather than on
    /// every request.
    urls: Vec<(&'static str, reqwest::Url)>,
    /// The credential header (`Authorization: Bearer …` or `x-api-key`), built once and
    /// marked sensitive so that no debug print shows it; `None` if the key is not a valid
    /// header value (every call then fails as a request error).
    credential: Option<(HeaderName, HeaderValue)>,
    /// A `bedrock` deployment's credentials (SigV4 or a Bedrock API key), which sign each
    /// request's exact bytes instead of being one fixed header.
    pub bedrock: Option<providers::bedrock::Auth>,
}

impl Deployment {
    fn new(u: &UpstreamSettings) -> Deployment {
        let base_url = u.effective_base_url().trim_end_matches('/').to_string();
        let urls = Endpoint::ALL
            .iter()
            .filter_map(|e| providers::path(*e, u.provider))
            .filter_map(|p| Some((p, reqwest::Url::parse(&format!("{base_url}{p}")).ok()?)))
            .collect();
        let key = u.api_key.expose();
        let credential = match u.provider {
            Provider::Openai => (
                AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}")),
            ),
            Provider::Anthropic | Provider::Bedrock => (
                HeaderName::from_static("x-api-key"),
                HeaderValue::from_str(key),
            ),
        };
        let credential = match credential {
            (name, Ok(mut value)) => {
                value.set_sensitive(true);
                Some((name, value))
            }
            (_, Err(_)) => None,
        };
        // Bedrock signs each request instead (`bedrock` below).
        let credential = credential.filter(|_| u.provider != Provider::Bedrock);
        Deployment {
            id: u.id.clone(),
            provider: u.provider,
            base_url,
            api_key: u.api_key.clone(),
            allow_private: u.allow_private_network,
            urls,
            credential,
            bedrock: match u.provider {
                Provider::Bedrock => providers::bedrock::Auth::of(u),
                _ => None,
            },
        }
    }

    /// The URL of one of this provider's paths (see `providers::path`).
    pub fn url(&self, path: &str) -> Option<&reqwest::Url> {
        self.urls.iter().find(|(p, _)| *p == path).map(|(_, u)| u)
    }

    pub fn credential(&self) -> Option<&(HeaderName, HeaderValue)> {
        self.credential.as_ref()
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    /// Index into `Catalog::deployments`.
    pub deployment: usize,
    /// The model name the upstream knows.
    pub upstream_model: String,
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
        let deployments: Vec<Deployment> = s.upstreams.iter().map(Deployment::new).collect();
        let index: HashMap<&str, usize> = deployments
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.as_str(), i))
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
                        index.get(r.upstream.as_str()).map(|&d| Route {
                            deployment: d,
                            upstream_model: r.model.clone(),
                            cap_param: match deployments[d].provider {
                                Provider::Anthropic | Provider::Bedrock => {
                                    OutputCapParam::MaxTokens
                                }
                                Provider::Openai => r
                                    .output_cap_param
                                    .unwrap_or_else(|| OutputCapParam::for_model(&r.model)),
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
            cap_param: OutputCapParam::MaxCompletionTokens,
        };
        assert_eq!(route.cap_field(Endpoint::Chat), "max_completion_tokens");
        assert_eq!(route.cap_field(Endpoint::Completions), "max_tokens");
    }
}

//! Stage 2, validate: the body is parsed once into a JSON map, every field Sluice relies on
//! is type-checked with an error naming it, the model is resolved and checked against the
//! token, and the input is counted with the tokenizer. Nothing here talks to an upstream.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use serde_json::{Map, Value};

use crate::auth::TokenAuth;
use crate::config::price_table::Family;
use crate::config::Provider;
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::quota::documents::Documents;
use crate::quota::estimate;
use crate::quota::images::{Images, Rule};
use crate::upstream::catalog::{Catalog, Model, Route};
use crate::upstream::providers::openai::ROUTING_FIELDS;

use super::long_context::Reader;
use crate::upstream::providers::translate::stream::MOST_CHOICES;

/// The most input tokens Claude's tool-use system prompt adds to a request with tools: the
/// largest figure of Anthropic's "tool use pricing" table (530, Claude 3 Opus with `auto`
/// or `none`; Claude 4 models add 313 to 346). Anthropic-defined client tools add their
/// own definitions on top (`DEFINED_TOOLS`).
pub const TOOL_USE_PROMPT: i64 = 530;

/// The input tokens each Anthropic-defined client tool adds beyond the few fields the
/// client sends for it (Anthropic's pages for each tool): the bash tool 245, the text
/// editor 700, computer use 735 for its definition and up to 499 of its own system prompt.
/// By type prefix; the memory tool publishes no figure and is counted as its JSON only.
pub const DEFINED_TOOLS: &[(&str, i64)] = &[
    ("bash_", 245),
    ("text_editor_", 700),
    ("computer_", 735 + 499),
];

/// Most completions one request may ask for (`n`); each is priced as a completion.
pub const MAX_N: i64 = 16;

#[derive(Debug)]
pub struct Prepared {
    pub endpoint: Endpoint,
    pub requested_model: String,
    pub model: Arc<Model>,
    pub body: Map<String, Value>,
    pub stream: bool,
    /// The client asked for the usage chunk itself (else it is removed again).
    pub include_usage: bool,
    /// The output cap and the client's field that set it; `None` for embeddings. Upstream,
    /// the route decides the field (`catalog::Route::cap_field`).
    pub cap: Option<(&'static str, i64)>,
    /// How many completions the upstream generates — and bills — for this request: `n`,
    /// or `best_of` on `/v1/completions` when larger, for each prompt. Every field that
    /// multiplies output is here (`completions`), so the reservation and the windows count
    /// all of them.
    pub n: i64,
    /// The client's `n` (1..=16; 1 when absent, and on embeddings): the choices each
    /// prompt returns.
    pub choices_per_prompt: i64,
    /// How many prompts the request holds (`prompts`): more than one only in a
    /// `/v1/completions` prompt array.
    pub prompts: i64,
    /// Input tokens counted by the tokenizer (no margin).
    pub input_tokens: i64,
    /// The ASCII digits of the text counted in `input_tokens` (`estimate::counting_digits`):
    /// a tokenizer that makes each digit a token (Gemini's) counts them beyond our estimate
    /// (`long_context::beyond_the_estimate`).
    pub input_digits: i64,
    /// The client's `anthropic-beta` header, forwarded to Anthropic upstreams only
    /// (`providers::anthropic::beta_header`).
    pub anthropic_beta: Option<reqwest::header::HeaderValue>,
    /// It turns Claude's 1M-token window on (`providers::anthropic::asks_1m_window`), read
    /// once for every `reader`.
    pub claude_1m: bool,
    /// A Responses API request's id, `store` and whole conversation (`pipeline::responses`).
    pub responses: Option<super::responses::Ctx>,
    /// What the request may be billed for beyond plain tokens (`pipeline::kinds`).
    pub kinds: super::kinds::Kinds,
    /// The request's images, which each route's provider bills by its own rule.
    pub images: Images,
    /// The request's documents: PDFs by their pages, others of unknown size (read with
    /// `[finance] document_tokens_per_page` once the settings are at hand, `pipeline`).
    pub documents: Documents,
    /// When the request started: it is priced at the prices in force then, for its
    /// reservation and its settlement alike, whichever route serves it.
    pub started_at: DateTime<Utc>,
    /// The token's `models` list (`TokenAuth::models`; `None`: every model), which bounds
    /// the fallbacks too (`fallbacks`).
    pub allowed: Option<Arc<[String]>>,
}

impl Prepared {
    /// The model's fallbacks in `catalog` that the token may use, in order. A token's
    /// `models` list is the one control of where its requests go: a fallback outside it
    /// was sent the token's prompts when the model failed, and priced into every
    /// reservation, refusing a budget the model itself fits (s30 upstream attack F6).
    pub fn fallbacks<'a>(&'a self, catalog: &'a Catalog) -> impl Iterator<Item = &'a Arc<Model>> {
        self.model.fallbacks.iter().filter_map(move |f| {
            catalog
                .model(f)
                .filter(|m| crate::auth::listed(self.allowed.as_deref(), f, &m.name))
        })
    }

    /// How many choices a streamed answer has: the client's `n` for each prompt, each
    /// whole only at its own finish. Not `n`'s multiplier `best_of`: those completions are
    /// generated, never sent.
    pub fn choices(&self) -> i64 {
        self.choices_per_prompt.saturating_mul(self.prompts)
    }

    /// The most output the request may be billed: its cap × n (0 without a cap).
    pub fn output_cap(&self) -> i64 {
        self.cap.map_or(0, |(_, c)| c).saturating_mul(self.n)
    }

    /// The input reserved on a route whose provider reads images by `rule`, of a model
    /// accepting `max_input` tokens, read by `reader`: the estimate plus what its images may
    /// cost there beyond the estimate's flat figure, plus what the model family's tokenizer
    /// counts beyond the estimate whatever its factor (`with_digits`), plus its documents
    /// (with any, at least `max_input`: `Documents::reserved`) — no more than the provider
    /// serves there (`Reader::bound`: Claude's window; none for the reservation,
    /// `Reader::reserving`). What the reservation uses (before its margin), and what a request that ends before its answer without the input reported
    /// is charged (its client left, its deadline cut the attempt off, a stall or a cut
    /// stream, the shutdown): the upstream had the whole request and may bill all of it
    /// (`attempts::departure_on`, `stream::Pump::settle`) — the same input, so a departure's
    /// tier is decided as the reservation's is.
    pub fn reserved_input_on(&self, rule: Rule, max_input: i64, reader: Reader) -> i64 {
        let counted = self.with_digits(rule, max_input, reader);
        reader.bound(self.documents.reserved(counted, max_input))
    }

    /// The input charged on such a route for an answer whose usage does not report its
    /// input (none at all, or the output alone): its documents at their estimate
    /// (`Documents::estimated`), not the reservation's bound. Only there: the upstream
    /// answered, so it read the request once, as the estimate counts it — on Gemini each
    /// digit once more, as Gemini counts them and the reservation did.
    pub fn estimated_input_on(&self, rule: Rule, max_input: i64, reader: Reader) -> i64 {
        let counted = self.with_digits(rule, max_input, reader);
        reader.bound(self.documents.estimated(counted))
    }

    /// Who reads this request's input on `route` on `provider` (`long_context::Reader`):
    /// its model family, and whether the client's `anthropic-beta` turned Claude's 1M
    /// window on, which lets Claude up to 4.5 serve (and bill) past its window.
    pub fn reader(&self, route: &Route, provider: Provider) -> Reader {
        Reader::new(route.family, provider, route.window, self.claude_1m)
    }

    /// The estimate with its images as the route's provider bills them (`counted_on`), plus
    /// the digits `reader`'s tokenizer counts beyond it (on Gemini each once more,
    /// `long_context::beyond_the_estimate`) — past the model's configured input
    /// (`max_input`) too: the gateway checks its own count against that, so a prompt whose
    /// digits pass it still reaches a provider that may take more; but never past the
    /// largest window Gemini serves (`long_context::GEMINI_LARGEST_WINDOW`), beyond which it
    /// refuses the prompt and bills nothing. The digits are part of the input a document's
    /// bound covers, not beyond it.
    fn with_digits(&self, rule: Rule, max_input: i64, reader: Reader) -> i64 {
        use super::long_context::{beyond_the_estimate, GEMINI_LARGEST_WINDOW};
        let counted = self
            .counted_on(rule)
            .saturating_add(self.tool_use_prompt(reader));
        let digits = beyond_the_estimate(reader.family, self.input_digits);
        let most = counted.max(max_input).max(GEMINI_LARGEST_WINDOW);
        counted.saturating_add(digits).min(most)
    }

    /// The system prompt Claude adds to a request with tools, billed as input though no
    /// client sent it (`TOOL_USE_PROMPT`): on a Claude model wherever it is served, and on
    /// any model Anthropic serves (a Claude newer than the price table).
    /// Tools are `tools` or OpenAI's legacy `functions` (s26 final attack #5: a Claude on
    /// an OpenAI-format route took `functions` without the prompt reserved); each
    /// Anthropic-defined client tool adds its definition (`DEFINED_TOOLS`).
    fn tool_use_prompt(&self, reader: Reader) -> i64 {
        let claude = reader.family == Family::Claude || reader.provider == Provider::Anthropic;
        // Legacy `functions` are tools to a Claude served in OpenAI's format.
        let tools = ["tools", "functions"].iter().any(|field| {
            (self.body.get(*field))
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty())
        });
        if !(claude && tools) {
            return 0;
        }
        let defined: i64 = (self.body.get("tools").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .filter_map(|t| t.get("type")?.as_str())
            .filter_map(|kind| {
                let (_, tokens) = DEFINED_TOOLS.iter().find(|(p, _)| kind.starts_with(p))?;
                Some(*tokens)
            })
            .sum();
        TOOL_USE_PROMPT.saturating_add(defined)
    }

    /// The estimate with the request's images as the route's provider bills them.
    fn counted_on(&self, rule: Rule) -> i64 {
        self.input_tokens
            .saturating_add(self.images.beyond_estimate(rule))
    }
}

/// What a request asks the upstream for (`completions`), read once.
struct Completions {
    /// The client's `n`: the choices each prompt returns.
    n: i64,
    /// The prompts (`prompts`).
    prompts: i64,
    /// The completions the upstream generates and bills in all (`Prepared::n`).
    generated: i64,
}

/// How many completions a request makes the upstream generate and bill: `n` (1..=16) and,
/// on `/v1/completions`, `best_of` (1..=16, at least `n`: the upstream generates `best_of`
/// and returns `n`), for each of its prompts (`prompts`). `best_of` elsewhere is refused
/// rather than passed on unpriced. A stream of more choices than its reader tells apart
/// (`stream::MOST_CHOICES`) is refused.
fn completions(endpoint: Endpoint, body: &Map<String, Value>) -> Result<Completions, ApiError> {
    let n = int_field(body, "n")?.unwrap_or(1);
    let per_prompt = per_prompt(endpoint, body, n)?;
    let prompts = prompts(endpoint, body);
    if body.get("stream") == Some(&Value::Bool(true)) && n.saturating_mul(prompts) > MOST_CHOICES {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "a stream takes at most {MOST_CHOICES} choices (`n` for each prompt): send fewer prompts, or not as a stream"
            ),
        ));
    }
    Ok(Completions {
        n,
        prompts,
        generated: per_prompt.saturating_mul(prompts),
    })
}

/// How many prompts a request holds: on `/v1/completions` an array of strings (or of token
/// arrays) is one prompt for each item — the upstream completes each; one string or one
/// token array is one.
fn prompts(endpoint: Endpoint, body: &Map<String, Value>) -> i64 {
    match body.get("prompt") {
        Some(Value::Array(items))
            if endpoint == Endpoint::Completions
                && items.iter().any(|i| i.is_string() || i.is_array()) =>
        {
            i64::try_from(items.len()).unwrap_or(i64::MAX)
        }
        _ => 1,
    }
}

/// The completions one prompt makes: `n` (the client's), or `best_of` when given (see
/// `completions`).
fn per_prompt(endpoint: Endpoint, body: &Map<String, Value>, n: i64) -> Result<i64, ApiError> {
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be between 1 and {MAX_N}"),
        ));
    }
    let Some(best_of) = int_field(body, "best_of")? else {
        return Ok(n);
    };
    if endpoint != Endpoint::Completions {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` is only accepted on /v1/completions",
        ));
    }
    if !(n..=MAX_N).contains(&best_of) {
        return Err(ApiError::invalid(
            "best_of",
            format!("`best_of` must be between `n` ({n}) and {MAX_N}"),
        ));
    }
    Ok(best_of)
}

fn int_field(body: &Map<String, Value>, field: &'static str) -> Result<Option<i64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be an integer"))),
    }
}

fn bool_field(body: &Map<String, Value>, field: &'static str) -> Result<bool, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be a boolean"),
        )),
    }
}

/// A number field within `lo..=hi` (absent or null passes).
pub(super) fn number_in(
    body: &Map<String, Value>,
    field: &'static str,
    lo: f64,
    hi: f64,
) -> Result<(), ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(()),
            _ => Err(ApiError::invalid(
                field,
                format!("`{field}` must be a number between {lo} and {hi}"),
            )),
        },
    }
}

/// Parses and validates a request body for `endpoint` on behalf of `auth`.
pub fn prepare(
    endpoint: Endpoint,
    raw: &[u8],
    auth: &TokenAuth,
    catalog: &Catalog,
    started_at: DateTime<Utc>,
) -> Result<Prepared, ApiError> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| ApiError::InvalidRequest {
        message: format!("The request body is not valid JSON: {e}"),
        param: None,
    })?;
    let Value::Object(mut body) = value else {
        return Err(ApiError::InvalidRequest {
            message: "The request body must be a JSON object.".into(),
            param: None,
        });
    };
    for f in ROUTING_FIELDS {
        body.remove(*f);
    }
    let requested_model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "model",
                "`model` must be a non-empty string",
            ))
        }
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let model = catalog
        .model(&requested_model)
        .ok_or_else(|| ApiError::ModelNotFound(requested_model.clone()))?
        .clone();
    if !auth.allows(&requested_model, &model.name) {
        return Err(ApiError::ModelNotAllowed(requested_model));
    }
    let max_temperature = if endpoint == Endpoint::Messages {
        1.0
    } else {
        2.0
    };
    number_in(&body, "temperature", 0.0, max_temperature)?;
    number_in(&body, "top_p", 0.0, 1.0)?;
    super::limits::body_numbers(endpoint, &body)?;

    let (input_tokens, input_digits) = estimate::counting_digits(|| {
        counted_input(endpoint, &body).map(|n| n + billed_definitions(endpoint, &body))
    });
    let input_tokens = input_tokens?;
    if input_tokens > model.max_input_tokens {
        return Err(ApiError::invalid(
            endpoint.input_field(),
            format!(
                "The input is about {input_tokens} tokens; `{}` accepts at most {}.",
                model.name, model.max_input_tokens
            ),
        ));
    }

    let stream = endpoint != Endpoint::Embeddings && bool_field(&body, "stream")?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    "`stream_options.include_usage` must be a boolean",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    if body.contains_key("stream_options") && !stream {
        body.remove("stream_options");
    }

    if endpoint == Endpoint::Messages && !body.contains_key("max_tokens") {
        return Err(ApiError::invalid("max_tokens", "`max_tokens` is required"));
    }
    let (cap, asked) = if endpoint == Endpoint::Embeddings {
        let one = Completions {
            n: 1,
            prompts: 1,
            generated: 1,
        };
        (None, one)
    } else {
        let asked = completions(endpoint, &body)?;
        // Each cap sent must be in range on its own; when both are, the tighter one is
        // the client's intent.
        let cap_of = |field: &'static str| -> Result<Option<(&'static str, i64)>, ApiError> {
            match int_field(&body, field)? {
                None => Ok(None),
                Some(v) if v < 1 => Err(ApiError::invalid(
                    field,
                    format!("`{field}` must be at least 1"),
                )),
                Some(v) if v > model.max_output_tokens => Err(ApiError::invalid(
                    field,
                    format!(
                        "`{field}` is {v}; `{}` allows at most {}.",
                        model.name, model.max_output_tokens
                    ),
                )),
                Some(v) => Ok(Some((field, v))),
            }
        };
        let cap = if endpoint == Endpoint::Responses {
            cap_of("max_output_tokens")?.unwrap_or(("max_output_tokens", model.max_output_tokens))
        } else {
            match (cap_of("max_completion_tokens")?, cap_of("max_tokens")?) {
                (Some(c), Some(m)) if m.1 < c.1 => m,
                (Some(c), _) => c,
                (None, Some(m)) => m,
                (None, None) => ("max_tokens", model.max_output_tokens),
            }
        };
        (Some(cap), asked)
    };
    let images = Images::read(&body).map_err(|t| {
        ApiError::invalid(
            if endpoint == Endpoint::Messages {
                "source.media_type"
            } else {
                "image_url"
            },
            format!(
                "an image part must carry an image, not `{}`; send a document as a file part",
                t.0
            ),
        )
    })?;
    Ok(Prepared {
        endpoint,
        requested_model,
        model,
        body,
        stream,
        include_usage,
        cap,
        n: asked.generated,
        choices_per_prompt: asked.n,
        prompts: asked.prompts,
        input_tokens,
        input_digits,
        anthropic_beta: None,
        claude_1m: false,
        responses: None,
        kinds: super::kinds::Kinds::default(),
        images,
        documents: Documents::default(),
        started_at,
        allowed: auth.models.clone(),
    })
}

/// Where a body holds definitions beside its messages and tools that the provider puts
/// into the prompt and bills as input, though they are no message: OpenAI chat's legacy
/// `functions` and a `response_format` JSON schema, a Responses `text.format` schema, an
/// Anthropic `output_format` or `output_config.format` schema. A body that crosses no
/// format reaches the upstream with all of them, so each is counted as input like `tools`
/// — in the reservation and in the check against the model's input.
///
/// Each is a top-level field and a JSON pointer inside it ("" for the whole field).
fn definitions(endpoint: Endpoint) -> &'static [(&'static str, &'static str)] {
    match endpoint {
        Endpoint::Chat => &[("functions", ""), ("response_format", "/json_schema")],
        Endpoint::Responses => &[("text", "/format/schema"), ("text", "/format/description")],
        Endpoint::Messages => &[("output_format", ""), ("output_config", "/format")],
        Endpoint::Completions | Endpoint::Embeddings => &[],
    }
}

/// The tokens of `body`'s billed definitions (`definitions`), counted as `tools` are.
fn billed_definitions(endpoint: Endpoint, body: &Map<String, Value>) -> i64 {
    definitions(endpoint)
        .iter()
        .filter_map(|(field, inner)| body.get(*field)?.pointer(inner))
        .map(estimate::count_value)
        .sum()
}

/// The request's input counted with the tokenizer (no margin), its shape checked on the
/// way: the messages (and `system`, tools) of a chat or Messages request, a completion's
/// prompt, a Responses input, an embedding's input.
fn counted_input(endpoint: Endpoint, body: &Map<String, Value>) -> Result<i64, ApiError> {
    Ok(match endpoint {
        Endpoint::Chat => {
            let msgs = match body.get("messages") {
                Some(Value::Array(m)) if !m.is_empty() => m,
                Some(Value::Array(_)) => {
                    return Err(ApiError::invalid(
                        "messages",
                        "`messages` must not be empty",
                    ))
                }
                Some(_) => {
                    return Err(ApiError::invalid(
                        "messages",
                        "`messages` must be an array of message objects",
                    ))
                }
                None => return Err(ApiError::invalid("messages", "`messages` is required")),
            };
            for m in msgs {
                if !m.get("role").is_some_and(Value::is_string) {
                    return Err(ApiError::invalid(
                        "messages",
                        "every message must be an object with a string `role`",
                    ));
                }
            }
            estimate::chat_input(msgs, body.get("tools"))
        }
        Endpoint::Messages => {
            let msgs = match body.get("messages") {
                Some(Value::Array(m)) if !m.is_empty() => m,
                _ => {
                    return Err(ApiError::invalid(
                        "messages",
                        "`messages` must be a non-empty array of messages",
                    ))
                }
            };
            for m in msgs {
                let role = m.get("role").and_then(Value::as_str);
                if !matches!(role, Some("user" | "assistant")) {
                    return Err(ApiError::invalid(
                        "messages",
                        "every message needs a `role` of user or assistant",
                    ));
                }
                if !m
                    .get("content")
                    .is_some_and(|c| c.is_string() || c.is_array())
                {
                    return Err(ApiError::invalid(
                        "messages",
                        "every message needs `content`: a string or an array of blocks",
                    ));
                }
            }
            if body
                .get("system")
                .is_some_and(|s| !(s.is_string() || s.is_array()))
            {
                return Err(ApiError::invalid(
                    "system",
                    "`system` must be a string or an array of text blocks",
                ));
            }
            estimate::chat_input(msgs, body.get("tools"))
                + body.get("system").map_or(0, estimate::count_value)
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(p @ (Value::String(_) | Value::Array(_))) => estimate::count_value(p) + 3,
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string or an array of strings",
                ))
            }
        },
        Endpoint::Responses => super::responses::validate(body)?,
        Endpoint::Embeddings => match body.get("input") {
            Some(Value::String(s)) if !s.is_empty() => estimate::count_text(s),
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|x| match x {
                    Value::String(s) => Ok(estimate::count_text(s)),
                    Value::Number(_) => Ok(1),
                    Value::Array(ids) if ids.iter().all(Value::is_number) => Ok(ids.len() as i64),
                    _ => Err(ApiError::invalid(
                        "input",
                        "`input` items must be strings or arrays of token ids",
                    )),
                })
                .sum::<Result<i64, ApiError>>()?,
            _ => {
                return Err(ApiError::invalid(
                    "input",
                    "`input` must be a non-empty string or array",
                ))
            }
        },
    })
}

//! The dispatch between wire formats: which adapter reads a client's request and which
//! writes it for the upstream, through the internal form (`canonical`). A body whose
//! client and upstream speak the same format never builds the internal form: it passes
//! untouched but for the model and the output cap (the same-format fast path).
//!
//! Adding a format: a variant of `Format`, its adapter module under `formats/`, and one
//! match arm in each function here (and in `translate::stream` for its events).

use bytes::Bytes;
use serde_json::{Map, Value};

use super::canonical::{Answer, ErrorInfo, ErrorKind, Message, Part, Reported, Request, Role};
use super::formats::{self, UPSTREAM};
use super::translate::stream::Corrupt;
use super::translate::TranslateError;
use super::{anthropic, openai};
use crate::config::Provider;
use crate::error::WireFormat;

/// The wire format a client speaks to the gateway, or an upstream speaks to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI chat completions (also `/v1/completions` and `/v1/embeddings` on the same
    /// upstreams, which only ever pass through).
    OpenAiChat,
    /// Anthropic Messages.
    Anthropic,
    /// The OpenAI Responses API: a client format (`formats::responses::adapter`), and
    /// the native upstream format of a provider that speaks it (its body passes through).
    Responses,
    /// Google's `generateContent` (Gemini API and Vertex AI): an upstream format only, no
    /// client speaks it to the gateway; where a function needs a client format for it, it
    /// takes OpenAI's.
    Gemini,
    /// AWS Bedrock Converse: an upstream format only, like Gemini.
    Bedrock,
}

impl Format {
    /// How a refusal names an upstream of this format ("cannot be sent to …").
    pub fn model_noun(self) -> &'static str {
        match self {
            Format::OpenAiChat => "an OpenAI-format model",
            Format::Anthropic => "an Anthropic model",
            Format::Responses => "a Responses API model",
            Format::Gemini => "a Gemini model",
            Format::Bedrock => "a Bedrock model",
        }
    }

    /// The error shape a client of this format reads.
    pub fn error_format(self) -> WireFormat {
        match self {
            // Gemini and Bedrock are never a client's format: OpenAI's stands in.
            Format::OpenAiChat | Format::Gemini | Format::Bedrock => WireFormat::OpenAi,
            Format::Anthropic => WireFormat::Anthropic,
            Format::Responses => WireFormat::OpenAi,
        }
    }
}

impl From<WireFormat> for Format {
    fn from(w: WireFormat) -> Self {
        match w {
            WireFormat::OpenAi => Format::OpenAiChat,
            WireFormat::Anthropic => Format::Anthropic,
        }
    }
}

impl From<Provider> for Format {
    fn from(p: Provider) -> Self {
        format_of(p)
    }
}

/// The wire format a provider kind speaks.
pub fn format_of(p: Provider) -> Format {
    match p {
        Provider::Openai | Provider::AzureOpenai | Provider::OpenaiCompatible => Format::OpenAiChat,
        Provider::Anthropic => Format::Anthropic,
        Provider::Gemini => Format::Gemini,
        Provider::Bedrock => Format::Bedrock,
    }
}

/// A client's request in the internal form; a refusal names the upstream it was read for.
fn read_request(
    client: Format,
    upstream: Format,
    body: &Map<String, Value>,
) -> Result<Request, TranslateError> {
    let read = match client {
        // No client speaks Gemini or Converse (`From<WireFormat>` never makes them).
        Format::OpenAiChat | Format::Gemini | Format::Bedrock => {
            formats::openai_chat::read_request(body)
        }
        Format::Anthropic => formats::anthropic::read_request(body),
        Format::Responses => formats::responses::adapter::check_upstream(body, upstream)
            .and_then(|()| formats::responses::adapter::read_request(body)),
    };
    read.map_err(|mut e| {
        e.message = e.message.replace(UPSTREAM, upstream.model_noun());
        e
    })
}

/// How a system message in the middle of a conversation reaches an upstream with one
/// system slot: a user turn at its place, its text marked as the system's words (as
/// Anthropic's own agent, Claude Code, sends its mid-conversation reminders). Moving it
/// into the system slot would take it out of time: the model would read "approval mode
/// is now never" as if it had held from the start.
pub const SYSTEM_MARK: (&str, &str) = ("<system-reminder>\n", "\n</system-reminder>");

/// Fits a request to what `upstream` can express without changing what the answer means
/// or its shape: the hints it has no place for are taken out and named, as the client
/// named them, in `Request::dropped` — a reasoning summary where the upstream writes none,
/// `strict` tools where it cannot guarantee schema-exact arguments, an image's `detail`
/// and a speaker's `name` where it has neither — and a mid-conversation system message
/// becomes a marked user turn where the only system slot is at the start (`SYSTEM_MARK`).
/// What would change the answer (a JSON schema, `tool_choice: none` where it cannot be
/// forbidden, `n`, logprobs…) is left for the writer to refuse.
fn fit(upstream: Format, r: &mut Request) {
    // Gemini shows the thoughts' summaries (`includeThoughts`); the others write none.
    if upstream != Format::Gemini {
        let summary = r.client_name("reasoning.summary", "reasoning.summary");
        if let Some(x) = r.reasoning.as_mut() {
            let had = x.summary.take().is_some();
            if x.effort.is_none() && x.budget_tokens.is_none() {
                r.reasoning = None;
            }
            if had {
                r.drop_field(summary);
            }
        }
    }
    if upstream == Format::OpenAiChat {
        return;
    }
    let mut strict = false;
    for t in &mut r.tools {
        strict |= t.strict.take() == Some(true);
    }
    if strict {
        r.drop_field(r.client_name("tools.strict", "tools[].function.strict"));
    }
    let (mut detail, mut name) = (false, false);
    for m in &mut r.messages {
        name |= m.name.take().is_some();
        for p in &mut m.content {
            let parts = match p {
                Part::ToolResult { content, .. } => content.iter_mut().collect(),
                other => vec![other],
            };
            for p in parts {
                if let Part::Image { detail: d, .. } = p {
                    detail |= d.take().is_some_and(|d| d != "auto");
                }
            }
        }
        if m.role == Role::System {
            *m = system_turn(m);
        }
    }
    if detail {
        r.drop_field(r.client_name("detail", "image_url.detail"));
    }
    if name {
        r.drop_field(r.client_name("name", "messages[].name"));
    }
}

/// `text` with the mark's own tags made inert — the `<` of every `<system-reminder` and
/// `</system-reminder`, in any case, written as `&lt;` — so that a message holding them
/// (a quoted file, an environment dump) can neither end its mark early (what follows
/// would read as the user's words) nor open another.
fn unmarked(text: &str) -> std::borrow::Cow<'_, str> {
    const TAG: &[u8] = b"system-reminder";
    let bytes = text.as_bytes();
    let opens_tag = |i: usize| {
        let rest = &bytes[i + 1..];
        let rest = rest.strip_prefix(b"/").unwrap_or(rest);
        rest.len() >= TAG.len() && rest[..TAG.len()].eq_ignore_ascii_case(TAG)
    };
    let at: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] == b'<' && opens_tag(i))
        .collect();
    if at.is_empty() {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 3 * at.len());
    let mut from = 0;
    for i in at {
        out.push_str(&text[from..i]);
        out.push_str("&lt;");
        from = i + 1;
    }
    out.push_str(&text[from..]);
    out.into()
}

/// A mid-conversation system message as a user turn marked as the system's words.
fn system_turn(m: &Message) -> Message {
    let content = m
        .content
        .iter()
        .map(|p| match p {
            Part::Text { text, cache } => Part::Text {
                text: format!("{}{}{}", SYSTEM_MARK.0, unmarked(text), SYSTEM_MARK.1),
                cache: cache.clone(),
            },
            other => other.clone(),
        })
        .collect();
    Message {
        role: Role::User,
        content,
        name: None,
        plain: false,
    }
}

fn write_request(
    upstream: Format,
    r: &Request,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    match upstream {
        Format::OpenAiChat => formats::openai_chat::write_request(r, upstream_model, cap, stream),
        Format::Anthropic => formats::anthropic::write_request(r, upstream_model, cap, stream),
        // A provider that speaks the Responses API is sent Responses clients' bodies only,
        // which pass through (`build_request_with`).
        Format::Responses => Err(TranslateError {
            param: None,
            message: "only a Responses API client can be served by a Responses API upstream".into(),
        }),
        Format::Gemini => formats::gemini::write_request(r, upstream_model, cap, stream),
        Format::Bedrock => formats::bedrock::write_request(r, upstream_model, cap, stream),
    }
}

/// The body to send to an `upstream` deployment for a request in the `client` format.
/// `cap` is the output cap and the field the upstream model takes it in (see
/// `catalog::Route::cap_field`); it is sent under that name only.
pub fn build_request(
    client: impl Into<Format>,
    upstream: impl Into<Format>,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Vec<u8>, TranslateError> {
    let upstream: Format = upstream.into();
    build_request_with(client, upstream, body, upstream_model, cap, (stream, true)).map(|b| b.body)
}

/// Where a body goes: the upstream's format, and whether it is told the standard service
/// tier where the client named none or `auto` (`Destination::of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    pub format: Format,
    pub standard_tier: bool,
}

impl Destination {
    /// A request to `endpoint` on a `provider` upstream: told the standard tier where the
    /// provider's default may be dearer (`tier::pinned`) and the endpoint takes a tier —
    /// chat, messages and responses; embeddings and legacy completions take none.
    pub fn of(provider: Provider, endpoint: crate::endpoint::Endpoint) -> Destination {
        use crate::endpoint::Endpoint as E;
        Destination {
            format: format_of(provider),
            standard_tier: super::tier::pinned(provider)
                && matches!(endpoint, E::Chat | E::Messages | E::Responses),
        }
    }
}

impl From<Format> for Destination {
    fn from(format: Format) -> Self {
        Destination {
            format,
            standard_tier: false,
        }
    }
}

impl From<WireFormat> for Destination {
    fn from(w: WireFormat) -> Self {
        Format::from(w).into()
    }
}

impl From<Provider> for Destination {
    fn from(p: Provider) -> Self {
        format_of(p).into()
    }
}

/// A request built for an upstream: its body, and the client fields left out of it
/// (`Request::dropped`, announced to the client as `x-sluice-dropped`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub body: Vec<u8>,
    pub dropped: Vec<&'static str>,
}

/// `build_request` for an upstream that may not take `stream_options`: with
/// `include_usage` false (its `quirks.include_usage`), an OpenAI-format body carries none.
pub fn build_request_with(
    client: impl Into<Format>,
    upstream: impl Into<Destination>,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    (stream, include_usage): (bool, bool),
) -> Result<Built, TranslateError> {
    let (client, to) = (client.into(), upstream.into());
    let upstream = to.format;
    let mut dropped = Vec::new();
    let mut out = match upstream {
        Format::OpenAiChat if client == upstream => {
            openai::shape_request(body, upstream_model, cap, stream)
        }
        Format::Anthropic if client == upstream => {
            anthropic::shape_request(body, upstream_model, cap)
        }
        Format::Responses if client == upstream => {
            formats::responses::shape_request(body, upstream_model, cap.map(|(_, c)| c))
        }
        // Crossing formats, and the upstream-only formats (Gemini, Bedrock) always.
        _ => {
            let mut r = read_request(client, upstream, body)?;
            fit(upstream, &mut r);
            dropped = std::mem::take(&mut r.dropped);
            write_request(upstream, &r, upstream_model, cap, stream)?
        }
    };
    if !include_usage && upstream == Format::OpenAiChat {
        out.remove("stream_options");
    }
    if to.standard_tier {
        super::tier::pin(upstream, &mut out);
    }
    // A map of JSON values always serializes.
    Ok(Built {
        body: serde_json::to_vec(&Value::Object(out)).unwrap_or_default(),
        dropped,
    })
}

/// The usage a whole answer reports, each side as it reports it: a side it does not report
/// (an absent figure, `"usage": {}`, no usage at all) is `None` — counted by the gateway
/// (`pipeline::finish`), never read as 0 — while a figure of 0 is the upstream's word.
/// A usage with a figure that is not a number reports nothing.
pub fn answer_usage(upstream: impl Into<Format>, v: &Value) -> Reported {
    match upstream.into() {
        Format::OpenAiChat => v.get("usage").and_then(formats::openai_chat::read_reported),
        Format::Anthropic => formats::anthropic::answer_usage(v),
        // Its web-search calls are output items, not usage figures.
        Format::Responses => formats::responses::response_reported(v),
        Format::Gemini => v
            .get("usageMetadata")
            .and_then(formats::gemini::read_reported),
        Format::Bedrock => v.get("usage").and_then(formats::bedrock::read_reported),
    }
    .unwrap_or_default()
}

/// The generated text of a whole answer: counted for an output its usage does not report.
pub fn answer_text(upstream: impl Into<Format>, v: &Value) -> String {
    match upstream.into() {
        Format::OpenAiChat => openai::answer_text(v),
        Format::Anthropic => anthropic::answer_text(v),
        Format::Responses => formats::responses::answer_text(v),
        Format::Gemini => formats::gemini::answer_text(v),
        Format::Bedrock => formats::bedrock::answer_text(v),
    }
}

/// An upstream's answer in the internal form.
pub fn read_answer(upstream: impl Into<Format>, v: &Value) -> Result<Answer, Corrupt> {
    match upstream.into() {
        Format::OpenAiChat => formats::openai_chat::read_answer(v),
        Format::Anthropic => formats::anthropic::read_answer(v),
        // Responses answers pass through to Responses clients only.
        Format::Responses => Err(Corrupt::Shape),
        Format::Gemini => formats::gemini::read_answer(v),
        Format::Bedrock => formats::bedrock::read_answer(v),
    }
}

fn write_answer(client: Format, a: &Answer) -> Value {
    match client {
        // Never a client's format: OpenAI's stands in.
        Format::OpenAiChat | Format::Gemini | Format::Bedrock => {
            formats::openai_chat::write_answer(a)
        }
        Format::Anthropic => formats::anthropic::write_answer(a),
        // The response object echoes the request, which the pipeline writes it with
        // (`pipeline::responses::answer`); this one echoes the defaults.
        Format::Responses => formats::responses::adapter::write_answer(a, &Map::new(), &a.id),
    }
}

/// Whether a non-streamed 2xx body is an answer the gateway can relay to a `client` (of
/// the chat endpoints, or of the Responses API): it has its upstream format's shape, and
/// the upstream's adapter reads it when it is to be translated. One that is not is garbage, as a body that is not JSON is — never a
/// 200 carrying an error (`convert_answer`) or a body no SDK reads as an answer; why is
/// the error (`Corrupt::Unsupported`: well-formed, holding a part the adapter does not
/// model). A translated answer comes back as read, `None` one passed through.
pub fn relayable(
    upstream: impl Into<Format>,
    client: impl Into<Format>,
    v: &Value,
) -> Result<Option<Answer>, Corrupt> {
    let (upstream, client) = (upstream.into(), client.into());
    let shaped = match upstream {
        Format::OpenAiChat => v.get("choices").is_some_and(Value::is_array),
        Format::Anthropic => {
            v.get("type").and_then(Value::as_str) == Some("message")
                && v.get("content").is_some_and(Value::is_array)
        }
        // A native Responses answer is passed through (stamped): a response object with
        // its output items, or nothing a Responses client reads as an answer.
        Format::Responses => {
            v.get("object").and_then(Value::as_str) == Some("response")
                && v.get("output").is_some_and(Value::is_array)
        }
        // Read whole by their adapters below.
        Format::Gemini | Format::Bedrock => true,
    };
    if !shaped {
        return Err(Corrupt::Shape);
    }
    if upstream == client {
        return Ok(None);
    }
    read_answer(upstream, v).map(Some)
}

/// A non-streamed answer in the client's format: the upstream's bytes untouched when the
/// formats match, through the internal form otherwise — `read` when `relayable` already
/// read it so (one parse of the answer per request), else read here. An answer the
/// upstream's adapter cannot read becomes an error in the client's format.
pub fn convert_answer(
    upstream: impl Into<Format>,
    client: impl Into<Format>,
    raw: Bytes,
    (v, read): (&Value, Option<&Answer>),
) -> Bytes {
    let (upstream, client) = (upstream.into(), client.into());
    if upstream == client {
        return raw;
    }
    let read = match read {
        Some(a) => Ok(std::borrow::Cow::Borrowed(a)),
        None => read_answer(upstream, v).map(std::borrow::Cow::Owned),
    };
    let out = match read {
        Ok(a) => write_answer(client, &a),
        Err(c) => write_error(
            client,
            &ErrorInfo {
                status: 502,
                kind: ErrorKind::Server,
                message: c.message().to_string(),
                code: Some("upstream_error".into()),
                param: None,
            },
        ),
    };
    Bytes::from(out.to_string())
}

fn read_error(upstream: Format, status: u16, v: &Value) -> ErrorInfo {
    match upstream {
        Format::OpenAiChat | Format::Responses => formats::openai_chat::read_error(status, v),
        Format::Anthropic => formats::anthropic::read_error(status, v),
        Format::Gemini => formats::gemini::read_error(status, v),
        Format::Bedrock => formats::bedrock::read_error(status, v),
    }
}

fn write_error(client: Format, e: &ErrorInfo) -> Value {
    match client {
        // Never a client's format: OpenAI's stands in.
        Format::OpenAiChat | Format::Gemini | Format::Bedrock => {
            formats::openai_chat::write_error(e)
        }
        Format::Anthropic => formats::anthropic::write_error(e),
        Format::Responses => formats::responses::adapter::write_error(e),
    }
}

/// An upstream's client-error body in the client's format: untouched when it is already
/// the client's format's error, rebuilt otherwise (the other format, an OpenAI-compatible
/// server's own shape, a proxy's HTML page).
pub fn convert_error(
    upstream: impl Into<Format>,
    client: impl Into<Format>,
    status: u16,
    raw: Bytes,
) -> Bytes {
    let (upstream, client) = (upstream.into(), client.into());
    let v: Value = serde_json::from_slice(&raw)
        .ok()
        .or_else(|| plain_text_error(&raw))
        .unwrap_or(Value::Null);
    if upstream == client && is_error_of(client, &v) {
        return raw;
    }
    let e = read_error(upstream, status, &v);
    Bytes::from(write_error(client, &e).to_string())
}

/// A short plain-text error body (a server's "model not found") as `{"message": …}`; not
/// an HTML page (a proxy's), which says nothing a client can use.
fn plain_text_error(raw: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    let plain = !text.is_empty()
        && text.len() <= 1000
        && !text.starts_with('<')
        && !text.chars().any(char::is_control);
    plain.then(|| serde_json::json!({ "message": text }))
}

/// True when `v` is an error body of `format`'s own shape, which its SDKs parse.
fn is_error_of(format: Format, v: &Value) -> bool {
    let text = |p: &str| v.pointer(p).is_some_and(Value::is_string);
    match format {
        Format::OpenAiChat | Format::Responses => text("/error/message"),
        Format::Anthropic => v["type"] == "error" && text("/error/type") && text("/error/message"),
        Format::Gemini | Format::Bedrock => false,
    }
}

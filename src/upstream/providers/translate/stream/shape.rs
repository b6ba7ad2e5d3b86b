//! The fields of upstream stream events that the converters read, as typed structs: an
//! event is parsed once, into these, and a field read present with the wrong JSON type, or
//! a required field missing, is a parse error — the event is corrupt, like one that is not
//! JSON (`Corrupt::Shape`). Fields not listed are ignored, so an additive change of a
//! provider (a new field, a new Anthropic event type) keeps working.
//!
//! `null` counts as absent where the formats write an absent value as `null` (content,
//! refusal, finish_reason, usage, tool_calls, `choices`, an OpenAI choice's `delta`, ids,
//! names, optional figures): it carries no piece of the answer. Where a format defines an
//! object or an array (a choice, a tool call, `function`,
//! an Anthropic event's `message`, `delta`, `content_block`), `null` is the wrong shape
//! (see `present`).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::upstream::providers::canonical::{Input, Output};
use crate::upstream::providers::formats::openai_chat;
use crate::upstream::providers::MAX_REPORTED_TOKENS;

/// Why an event could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrupt {
    /// Not JSON at all.
    Json,
    /// JSON, but not in the shape its format defines.
    Shape,
    /// An end of the message before its finish (Anthropic's `message_stop` with no
    /// `message_delta` before it): the answer was cut short, however it ended.
    Unfinished,
    /// In its format's shape, but a piece of the answer of a kind the gateway's reader does
    /// not model (a Gemini image part, a Bedrock block that starts as no tool call): the
    /// upstream answered well, only the gateway cannot pass it on — no failure of its key
    /// (s28 diff attack F1).
    Unsupported,
}

impl Corrupt {
    fn of(e: &serde_json::Error) -> Self {
        if e.is_data() {
            Corrupt::Shape
        } else {
            Corrupt::Json
        }
    }

    /// The message of the gateway's error event.
    pub fn message(self) -> &'static str {
        match self {
            Corrupt::Json => {
                "The upstream sent an event that is not valid JSON; the stream was ended by the gateway."
            }
            Corrupt::Shape => {
                "The upstream sent an event that is not in the shape its format defines; the stream was ended by the gateway."
            }
            Corrupt::Unfinished => {
                "The upstream ended its message before its finish; the stream was ended by the gateway."
            }
            Corrupt::Unsupported => {
                "The upstream sent a kind of content the gateway cannot pass on; the stream was ended by the gateway."
            }
        }
    }
}

/// Parses `data` as `T`, a failure classified.
pub fn parse<'a, T: Deserialize<'a>>(data: &'a str) -> Result<T, Corrupt> {
    serde_json::from_str(data).map_err(|e| Corrupt::of(&e))
}

/// A field that may be absent but, when present, must be a `T`: `null` is refused. (With
/// `#[serde(default)]`, serde calls this only for a field that is there.)
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A `T` read from a JSON object only: serde's derived structs also take an array of their
/// fields in order, which no format here sends (`"usage": [9, 4]` is the wrong shape).
pub struct Obj<T>(pub T);

impl<T> Deref for Obj<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Obj)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A token figure: any JSON number, clamped to `MAX_REPORTED_TOKENS` as
/// `providers::tokens` does; anything else (a string, `null` where a figure is required)
/// is the wrong shape. A negative number is the right shape but no count: it reports
/// nothing (`count`), as `providers::tokens` reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens(Option<i64>);

impl Tokens {
    /// The count, `None` for a negative figure.
    pub fn count(self) -> Option<i64> {
        self.0
    }
}

/// The count of a figure that may be absent: `None` when absent or negative.
pub fn reported(t: Option<Tokens>) -> Option<i64> {
    t.and_then(Tokens::count)
}

impl<'de> Deserialize<'de> for Tokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Tokens;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token count")
            }
            fn visit_i64<E>(self, n: i64) -> Result<Tokens, E> {
                Ok(Tokens((n >= 0).then(|| n.min(MAX_REPORTED_TOKENS))))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Tokens, E> {
                Ok(Tokens(Some(n.min(MAX_REPORTED_TOKENS as u64) as i64)))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Tokens, E> {
                // The sign before the cast: `-0.9` is no count either, not a 0.
                Ok(Tokens(
                    (n >= 0.0).then(|| (n as i64).min(MAX_REPORTED_TOKENS)),
                ))
            }
        }
        d.deserialize_any(V)
    }
}

fn figure(t: Option<Tokens>) -> i64 {
    reported(t).unwrap_or(0)
}

// ---- OpenAI ---------------------------------------------------------------------------

/// A `chat.completion.chunk` (or a completions chunk), as far as it is read.
#[derive(Deserialize)]
pub struct Chunk<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// `null` is "no choices", as `[]`: servers written in Go send their empty list so
    /// (go-openai's nil slice: the one-api / new-api relays), and ModelScope's and Workers
    /// AI's usage chunks carry it.
    #[serde(default)]
    pub choices: Option<Vec<Obj<Choice>>>,
    /// Boxed: most chunks carry none, and the figures would make every chunk (and
    /// `OpenAiEvent`) as large as the usage.
    #[serde(default)]
    pub usage: Option<Box<Obj<OpenAiUsage>>>,
    /// An error chunk's `error` (an object, or TGI's text), read apart (`openai_error`).
    #[serde(default, borrow)]
    pub error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub struct Choice {
    #[serde(default, deserialize_with = "present")]
    pub index: Option<i64>,
    /// Absent in Azure's content-filter chunks; `null` on the last chunk, beside its
    /// `finish_reason`, from GLM's API and some Ollama builds: no text either way.
    #[serde(default)]
    pub delta: Option<Obj<Delta>>,
    /// A completions choice's text.
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM's matched stop: a string, or the token id that stopped it.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    Text(String),
    /// Checked to be a number, not used: only a matched string is passed on.
    Token(#[allow(dead_code)] i64),
}

#[derive(Deserialize, Default)]
pub struct Delta {
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub refusal: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Obj<ToolCall>>>,
    /// The model's reasoning, as DeepSeek and vLLM's reasoning parsers stream it
    /// (`reasoning_content`) and OpenRouter (`reasoning`): output the upstream bills, so it
    /// is counted when the usage never arrives. Read leniently (no client sees it through
    /// the gateway's reading): anything but a string is no text, not a corrupt event.
    #[serde(default, deserialize_with = "lenient_text")]
    pub reasoning_content: Option<String>,
    #[serde(default, deserialize_with = "lenient_text")]
    pub reasoning: Option<String>,
    /// An audio answer's piece (`modalities` with `audio`): its `content` is `null`, its
    /// transcript and audio are the output the upstream bills.
    #[serde(default)]
    pub audio: Option<Obj<Audio>>,
    /// The legacy `functions` API's call: its name and arguments are output, as a tool
    /// call's are.
    #[serde(default)]
    pub function_call: Option<Obj<Function>>,
}

/// A delta's `audio`: the transcript's text, and of the audio only its size (base64), which
/// is all the count needs — the audio itself is not kept.
#[derive(Deserialize)]
pub struct Audio {
    #[serde(default)]
    pub transcript: Option<String>,
    #[serde(default)]
    pub data: Option<Size>,
}

/// The length of a JSON string, read without keeping it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size(pub usize);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, s: &str) -> Result<Size, E> {
                Ok(Size(s.len()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A string, else nothing (whatever else is there).
fn lenient_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    })
}

/// A delta's `content`: a string, or (Mistral) an array of parts whose `text` parts are
/// the answer, and whose `thinking` parts (Magistral's reasoning, each an array of `text`
/// parts) are output it bills; a `text` part without its text is the wrong shape.
pub enum Content {
    Text(String),
    Parts(Vec<Obj<Part>>),
}

#[derive(Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// A `thinking` part's own parts.
    #[serde(default)]
    pub thinking: Option<Vec<Obj<Part>>>,
}

impl Content {
    /// The answer's text in it.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(s) => Cow::Borrowed(s),
            Content::Parts(parts) => Cow::Owned(
                parts
                    .iter()
                    .filter(|p| p.kind == "text")
                    .filter_map(|p| p.text.as_deref())
                    .collect(),
            ),
        }
    }

    /// The text of its `thinking` parts (Mistral's), piece by piece: output, not answer.
    pub fn thinking(&self) -> impl Iterator<Item = &str> {
        let parts = match self {
            Content::Text(_) => &[][..],
            Content::Parts(parts) => parts,
        };
        parts
            .iter()
            .filter(|p| p.kind == "thinking")
            .flat_map(|p| p.thinking.iter().flatten())
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text.as_deref())
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<Obj<Part>>()? {
                    if p.kind == "text" && p.text.is_none() {
                        return Err(de::Error::missing_field("text"));
                    }
                    parts.push(p);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
pub struct ToolCall {
    #[serde(default, deserialize_with = "present")]
    pub index: Option<i64>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub function: Option<Obj<Function>>,
}

#[derive(Deserialize)]
pub struct Function {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

/// OpenAI's `usage`. A figure of the wrong type makes the event corrupt; a figure missing
/// (or `null`) makes the usage unusable, not the stream: some OpenAI-compatible servers
/// send partial usage, and counting the tokens is exact enough, while ending every stream
/// of such a server would break it.
#[derive(Deserialize)]
pub struct OpenAiUsage {
    #[serde(default)]
    pub prompt_tokens: Option<Tokens>,
    #[serde(default)]
    pub completion_tokens: Option<Tokens>,
    /// Read for the reasoning some providers count outside `completion_tokens`
    /// (`openai_chat::output_tokens`).
    #[serde(default)]
    pub total_tokens: Option<Tokens>,
    /// LiteLLM's cache writes (`openai_chat::cache_writes`).
    #[serde(default)]
    pub cache_creation_input_tokens: Option<Tokens>,
    #[serde(default)]
    pub prompt_tokens_details: Option<Obj<PromptDetails>>,
    #[serde(default)]
    pub completion_tokens_details: Option<Obj<CompletionDetails>>,
}

#[derive(Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<Tokens>,
    #[serde(default)]
    pub audio_tokens: Option<Tokens>,
    /// OpenRouter's cache writes (`openai_chat::cache_writes`).
    #[serde(default)]
    pub cache_write_tokens: Option<Tokens>,
    /// The cached tokens by modality: the cached audio is part of `audio_tokens` too.
    #[serde(default)]
    pub cached_tokens_details: Option<Obj<CachedDetails>>,
}

#[derive(Deserialize)]
pub struct CachedDetails {
    #[serde(default)]
    pub audio_tokens: Option<Tokens>,
}

#[derive(Deserialize)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<Tokens>,
    #[serde(default)]
    pub audio_tokens: Option<Tokens>,
}

impl OpenAiUsage {
    /// Both sides, the details as parts of the totals and the reasoning outside
    /// `completion_tokens` added to the output (as `openai_chat::read_usage`); none unless
    /// both totals are there.
    pub fn figures(&self) -> Option<(Input, Output)> {
        let prompt = self.prompt_tokens_details.as_ref();
        let completion = self.completion_tokens_details.as_ref();
        let reasoning = figure(completion.and_then(|d| d.reasoning_tokens));
        let written = openai_chat::cache_writes(
            figure(prompt.and_then(|d| d.cache_write_tokens)),
            figure(self.cache_creation_input_tokens),
        );
        Some((
            Input {
                input: reported(self.prompt_tokens)?,
                cached_input: figure(prompt.and_then(|d| d.cached_tokens)),
                cache_write_5m: written,
                // Unsplit by lifetime, as `openai_chat::read_usage` reads them.
                cache_write_unsplit: written,
                audio_input: openai_chat::uncached_audio(
                    figure(prompt.and_then(|d| d.audio_tokens)),
                    figure(
                        prompt
                            .and_then(|d| d.cached_tokens_details.as_ref())
                            .and_then(|c| c.audio_tokens),
                    ),
                ),
                ..Input::default()
            },
            Output {
                output: openai_chat::output_tokens(
                    reported(self.prompt_tokens),
                    reported(self.completion_tokens)?,
                    reasoning,
                    reported(self.total_tokens),
                ),
                reasoning,
                audio_output: figure(completion.and_then(|d| d.audio_tokens)),
                ..Output::default()
            },
        ))
    }
}

// ---- Anthropic ------------------------------------------------------------------------

/// An Anthropic stream event: its `type` (required), the rest kept as raw JSON until the
/// type says which fields are read — so an event type the gateway does not know (ignored,
/// as Anthropic documents new ones may appear) is never refused for its fields.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
    #[serde(default, borrow)]
    index: Option<&'a RawValue>,
    #[serde(default, borrow)]
    content_block: Option<&'a RawValue>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// An Anthropic event, as far as it is read.
pub struct Event<'a> {
    pub kind: Cow<'a, str>,
    pub body: Body,
}

pub enum Body {
    MessageStart(Obj<Message>),
    BlockStart {
        index: i64,
        block: Obj<Block>,
    },
    BlockDelta {
        index: i64,
        delta: Obj<BlockDelta>,
    },
    MessageDelta(Obj<MessageDelta>, Option<Obj<AnthropicUsage>>),
    MessageStop,
    /// `content_block_stop` (an index of the wrong shape reads as 0: nothing depends on it).
    BlockStop(i64),
    Error(ErrorBody),
    /// `ping`, and types the gateway does not know: nothing read.
    Other,
}

#[derive(Deserialize)]
pub struct Message {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub usage: Option<Obj<AnthropicUsage>>,
}

#[derive(Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A `redacted_thinking` block's data.
    #[serde(default)]
    pub data: Option<String>,
    /// A tool result's content, unread: only a web search's error result is looked into
    /// (`Block::content_type`).
    #[serde(default)]
    pub content: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct Typed {
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

impl Block {
    /// The `type` of the block's content when it is an object (an error result's), else
    /// `None` (a list of results, or no content).
    pub fn content_type(&self) -> Option<String> {
        let raw = self.content.as_ref()?;
        let Obj(t): Obj<Typed> = serde_json::from_str(raw.get()).ok()?;
        t.kind
    }
}

#[derive(Deserialize)]
pub struct BlockDelta {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub partial_json: Option<String>,
    /// A `thinking_delta`'s text.
    #[serde(default)]
    pub thinking: Option<String>,
    /// A `signature_delta`'s signature.
    #[serde(default)]
    pub signature: Option<String>,
}

#[derive(Deserialize)]
pub struct MessageDelta {
    #[serde(default)]
    pub stop_reason: Option<String>,
    #[serde(default)]
    pub stop_sequence: Option<String>,
}

/// Anthropic's `usage`; which figure counts depends on the event (`message_start`:
/// `input_tokens`; `message_delta`: `output_tokens`). As with OpenAI's, a figure missing
/// leaves it to the count; one of the wrong type is corrupt.
#[derive(Deserialize)]
pub struct AnthropicUsage {
    #[serde(default)]
    pub input_tokens: Option<Tokens>,
    #[serde(default)]
    pub output_tokens: Option<Tokens>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<Tokens>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<Tokens>,
    #[serde(default)]
    pub cache_creation: Option<Obj<CacheCreation>>,
    #[serde(default)]
    pub server_tool_use: Option<Obj<ServerToolUse>>,
}

/// Anthropic's split of the cache writes by lifetime.
#[derive(Deserialize)]
pub struct CacheCreation {
    #[serde(default)]
    pub ephemeral_5m_input_tokens: Option<Tokens>,
    #[serde(default)]
    pub ephemeral_1h_input_tokens: Option<Tokens>,
}

/// Anthropic's count of server-tool calls.
#[derive(Deserialize)]
pub struct ServerToolUse {
    #[serde(default)]
    pub web_search_requests: Option<Tokens>,
}

impl AnthropicUsage {
    /// Whether the input is reported: `input_tokens` a count (not absent, not negative).
    pub fn input_reported(&self) -> bool {
        reported(self.input_tokens).is_some()
    }

    /// The input side: Sluice's input is Anthropic's input plus cache reads and writes,
    /// each a part of it (by `formats::anthropic::input_of`, as a whole answer's usage).
    pub fn input(&self) -> Input {
        let creation = self.cache_creation.as_ref();
        crate::upstream::providers::formats::anthropic::input_of(&|p: &str| {
            figure(match p {
                "/input_tokens" => self.input_tokens,
                "/cache_read_input_tokens" => self.cache_read_input_tokens,
                "/cache_creation_input_tokens" => self.cache_creation_input_tokens,
                "/cache_creation/ephemeral_5m_input_tokens" => {
                    creation.and_then(|c| c.ephemeral_5m_input_tokens)
                }
                "/cache_creation/ephemeral_1h_input_tokens" => {
                    creation.and_then(|c| c.ephemeral_1h_input_tokens)
                }
                _ => None,
            })
        })
    }

    /// The output side, with the web-search calls (cumulative, as the output).
    pub fn output(&self) -> Option<Output> {
        Some(Output {
            output: reported(self.output_tokens)?,
            web_search_calls: figure(
                self.server_tool_use
                    .as_ref()
                    .and_then(|s| s.web_search_requests),
            ),
            ..Output::default()
        })
    }
}

/// An `error` event's body; read leniently (the stream ends with it whatever its shape).
#[derive(Deserialize, Default)]
pub struct ErrorBody {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

fn required<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Result<T, Corrupt> {
    parse(raw.ok_or(Corrupt::Shape)?.get())
}

fn optional<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Result<Option<T>, Corrupt> {
    raw.map(|r| parse(r.get())).transpose()
}

/// Reads one Anthropic event.
pub fn anthropic_event(data: &str) -> Result<Event<'_>, Corrupt> {
    let Obj(raw): Obj<RawEvent> = parse(data)?;
    let body = match raw.kind.as_ref() {
        "message_start" => Body::MessageStart(required(raw.message)?),
        "content_block_start" => {
            let block: Obj<Block> = required(raw.content_block)?;
            if block.kind == "tool_use" && (block.id.is_none() || block.name.is_none()) {
                return Err(Corrupt::Shape);
            }
            Body::BlockStart {
                index: required(raw.index)?,
                block,
            }
        }
        "content_block_delta" => {
            let delta: Obj<BlockDelta> = required(raw.delta)?;
            let missing = match delta.kind.as_str() {
                "text_delta" => delta.text.is_none(),
                "input_json_delta" => delta.partial_json.is_none(),
                _ => false,
            };
            if missing {
                return Err(Corrupt::Shape);
            }
            Body::BlockDelta {
                index: required(raw.index)?,
                delta,
            }
        }
        "message_delta" => Body::MessageDelta(required(raw.delta)?, optional(raw.usage)?),
        "message_stop" => Body::MessageStop,
        "content_block_stop" => {
            Body::BlockStop(optional::<i64>(raw.index).ok().flatten().unwrap_or(0))
        }
        "error" => Body::Error(
            raw.error
                .and_then(|e| serde_json::from_str::<Obj<ErrorBody>>(e.get()).ok())
                .map_or_else(ErrorBody::default, |e| e.0),
        ),
        _ => Body::Other,
    };
    Ok(Event {
        kind: raw.kind,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_numbers_clamped_and_nothing_else() {
        let u: Obj<OpenAiUsage> =
            serde_json::from_str(r#"{"prompt_tokens": 1e30, "completion_tokens": 4}"#).unwrap();
        let (i, o) = u.figures().unwrap();
        assert_eq!(
            (i.input, i.cached_input, o.output),
            (MAX_REPORTED_TOKENS, 0, 4)
        );
        // A negative figure is the right shape but no count: that side is not reported.
        for negative in [
            r#"{"prompt_tokens": 1e30, "completion_tokens": -4}"#,
            r#"{"prompt_tokens": -100000, "completion_tokens": 5}"#,
            r#"{"prompt_tokens": -1.5, "completion_tokens": 5}"#,
            // Cast first, -0.9 was read as a reported 0 (review finding, s17b).
            r#"{"prompt_tokens": -0.9, "completion_tokens": 5}"#,
        ] {
            let u: Obj<OpenAiUsage> = serde_json::from_str(negative).unwrap();
            assert_eq!(u.figures(), None, "{negative}");
        }
        let u: Obj<AnthropicUsage> =
            serde_json::from_str(r#"{"input_tokens": -100000, "output_tokens": 5}"#).unwrap();
        assert!(!u.input_reported());
        assert_eq!(u.output().map(|o| o.output), Some(5));
        for partial in [
            r#"{"prompt_tokens": 9}"#,
            r#"{"prompt_tokens": 9, "completion_tokens": null}"#,
        ] {
            let u: Obj<OpenAiUsage> = parse(partial).unwrap();
            assert_eq!(u.figures(), None, "{partial}: counted, not read");
        }
        for bad in [
            r#"{"prompt_tokens": "9", "completion_tokens": 4}"#,
            r#"{"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": true}}"#,
            r#"[9, 4]"#,
        ] {
            assert_eq!(
                parse::<Obj<OpenAiUsage>>(bad).err(),
                Some(Corrupt::Shape),
                "{bad}"
            );
        }
        assert_eq!(parse::<Obj<OpenAiUsage>>("{").err(), Some(Corrupt::Json));
    }

    #[test]
    fn an_unknown_event_type_is_never_refused_for_its_fields() {
        let e = anthropic_event(r#"{"type": "later", "delta": 5, "usage": "x"}"#).unwrap();
        assert!(matches!(e.body, Body::Other));
        assert_eq!(e.kind, "later");
        assert!(anthropic_event(r#"{"delta": {}}"#).is_err());
    }

    /// A key twice is refused, not read one way here and another by the client (a
    /// JavaScript client keeps the last: `{"type":"ping","type":"content_block_delta"}`
    /// would reach it as text the gateway did not count).
    #[test]
    fn a_key_given_twice_is_refused() {
        let delta = r#""index": 0, "delta": {"type": "text_delta", "text": "x"}"#;
        // Each with its duplicate, and once without it (read).
        for (twice, once) in [
            (
                r#""type": "ping", "type": "content_block_delta""#,
                r#""type": "content_block_delta""#,
            ),
            (
                r#""type": "content_block_delta", "type": "ping""#,
                r#""type": "ping""#,
            ),
        ] {
            assert!(
                anthropic_event(&format!("{{{twice}, {delta}}}")).is_err(),
                "{twice}"
            );
            assert!(
                anthropic_event(&format!("{{{once}, {delta}}}")).is_ok(),
                "{once}"
            );
        }
        let text = |t: &str| {
            format!(
                r#"{{"type": "content_block_delta", "index": 0, "delta": {{"type": "text_delta", {t}}}}}"#
            )
        };
        assert!(anthropic_event(&text(r#""text": "", "text": "uncounted""#)).is_err());
        assert!(anthropic_event(&text(r#""text": "counted""#)).is_ok());
        let usage =
            |u: &str| format!(r#"{{"type": "message_delta", "delta": {{}}, "usage": {{{u}}}}}"#);
        assert!(anthropic_event(&usage(r#""output_tokens": 900, "output_tokens": 1"#)).is_err());
        assert!(anthropic_event(&usage(r#""output_tokens": 900"#)).is_ok());
    }
}

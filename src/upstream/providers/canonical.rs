//! The one internal form every wire format is translated through: a request, a whole
//! answer and a stream event, each as plain data that names no provider. A client format
//! has an adapter *in* (its request → `Request`) and *out* (`Answer` / `Event` → its
//! answer and events); an upstream format has the reverse pair (`Request` → its request,
//! its answer and events → `Answer` / `Event`). N client formats and M upstream formats
//! then need N + M adapters, not N × M translators, and a new provider is one adapter.
//!
//! When the client's format and the upstream's are the same, the request and the answer
//! pass through untouched (only the model and the output cap are rewritten): the internal
//! form is for crossing formats, and a body that crosses none keeps every field the
//! gateway does not know.
//!
//! The rule every adapter follows: every field and content block is carried faithfully or
//! refused with a 400 naming it (`TranslateError`) — never dropped silently. The one
//! exception is named: hints and the client's bookkeeping that change neither what the
//! answer means nor its shape (a reasoning summary where the upstream has none, `strict`
//! tools where it cannot guarantee them, an image's `detail`, a speaker's `name`, prompt
//! cache keys) are left out and listed in `Request::dropped`, which the client is told. A field of the client's
//! format that has a counterpart here is read into it; one that has none is refused by the
//! adapter in, unless it is at its default. A value here that the upstream's format cannot
//! express is refused by the adapter out, naming the field as the client sent it
//! (`Request::names` keeps the client's field names for that message).

use serde_json::{Map, Value};

/// The token figures of the internal form (`crate::usage`: the providers and the pricing
/// share them, and the providers know no prices).
pub use crate::usage::Usage;

/// A request in the internal form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// The client's model name; the adapter out writes the upstream model instead.
    pub model: String,
    /// System instructions (OpenAI `system`/`developer` messages, Anthropic `system`,
    /// Responses `instructions`), in order, as text blocks (with cache marks).
    pub system: Vec<Part>,
    /// The conversation, oldest first. Consecutive messages of one role are kept apart;
    /// an adapter out that needs them merged merges them.
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    /// `false` when the client forbade parallel tool calls.
    pub parallel_tool_calls: Option<bool>,
    /// The output cap the client asked for, if any (the gateway decides the one sent).
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Anthropic/Gemini `top_k`.
    pub top_k: Option<i64>,
    /// OpenAI/Gemini sampling seed.
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub stop: Vec<String>,
    pub response_format: Option<ResponseFormat>,
    pub reasoning: Option<Reasoning>,
    pub stream: bool,
    /// The client asked for the usage on its stream (OpenAI `stream_options.include_usage`;
    /// always on for Anthropic and Responses clients).
    pub include_usage: bool,
    /// An end-user id for the provider's abuse monitoring (OpenAI `user`, Anthropic
    /// `metadata.user_id`, Responses `user`/`safety_identifier`).
    pub user: Option<String>,
    /// Provider-neutral key/value metadata (OpenAI/Responses `metadata`).
    pub metadata: Map<String, Value>,
    /// Service tier, when the client named one (`auto`, `default`, `flex`, `priority`…).
    pub service_tier: Option<String>,
    /// Client field name → the name this form uses, for refusal messages that name what
    /// the client sent (e.g. `max_completion_tokens` → `max_output_tokens`).
    pub names: Vec<(&'static str, &'static str)>,
    /// Client fields (as the client named them) left out of what the upstream is sent:
    /// hints and the client's own bookkeeping, which change neither what the answer means
    /// nor its shape (`dispatch::fit`). The gateway announces them (`x-sluice-dropped`).
    pub dropped: Vec<&'static str>,
}

impl Request {
    /// The client's name of a field of this form (see `names`), else `default`.
    pub fn client_name(&self, field: &str, default: &'static str) -> &'static str {
        self.names
            .iter()
            .find(|(_, ours)| *ours == field)
            .map_or(default, |(theirs, _)| theirs)
    }

    /// Names a client field as left out (`dropped`), once however often it is met.
    pub fn drop_field(&mut self, name: &'static str) {
        if !self.dropped.contains(&name) {
            self.dropped.push(name);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// A tool's result (OpenAI `tool` message; Anthropic `tool_result` blocks in a user
    /// message; Responses `function_call_output` items). Its parts are `ToolResult`s.
    Tool,
    /// A system (or developer) message after the conversation began, kept at its place
    /// (the leading ones are `Request::system`). Its parts are text.
    System,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    /// The speaker's name (OpenAI `name`), where a format has one.
    pub name: Option<String>,
    /// The client wrote the content as one plain string, not as parts: an adapter out may
    /// write it back as a string, so a translated body reads as the client wrote it (the
    /// OpenAI adapter does; no answer changes either way).
    pub plain: bool,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text {
        text: String,
        /// Anthropic `cache_control` (prompt-cache breakpoint), carried where the upstream
        /// has one and dropped only where caching is automatic (OpenAI), which changes no
        /// answer.
        cache: Option<CacheMark>,
    },
    Image {
        source: Source,
        /// OpenAI `detail` (`auto`, `low`, `high`).
        detail: Option<String>,
        cache: Option<CacheMark>,
    },
    /// A document (PDF…): Anthropic `document`, OpenAI `file`, Responses `input_file`.
    File {
        source: Source,
        filename: Option<String>,
        cache: Option<CacheMark>,
    },
    /// The model's own reasoning, returned so a multi-turn conversation keeps it.
    /// `signature` is the provider's opaque proof (Anthropic `signature`, Responses
    /// `encrypted_content`); a reasoning part without one cannot be sent back to a
    /// provider that requires it.
    Reasoning {
        text: String,
        signature: Option<String>,
        /// Anthropic `redacted_thinking` data.
        redacted: Option<String>,
    },
    /// A call the model made: `arguments` is the JSON text of the arguments as the model
    /// wrote it (kept as text: a model may write invalid JSON and the client sees it as is).
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    ToolResult {
        call_id: String,
        /// Text and images; a plain string result is one `Text` part.
        content: Vec<Part>,
        is_error: bool,
        cache: Option<CacheMark>,
        /// The client wrote the result as one plain string (see `Message::plain`).
        plain: bool,
    },
    /// The model declined to answer (OpenAI `refusal`, Responses `refusal` content).
    Refusal { text: String },
}

/// Anthropic's prompt-cache breakpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMark {
    /// `5m` (the default) or `1h`.
    pub ttl: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An `http(s)` URL the provider fetches itself.
    Url(String),
    Base64 {
        media_type: String,
        data: String,
    },
    /// A provider-side file id (OpenAI `file_id`, Anthropic Files API); usable only on the
    /// provider that issued it.
    FileId(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the arguments.
    pub parameters: Value,
    /// OpenAI `strict` structured arguments.
    pub strict: Option<bool>,
    pub cache: Option<CacheMark>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    /// The model must not call a tool.
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this tool.
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    /// Any JSON object.
    JsonObject,
    JsonSchema {
        name: String,
        schema: Value,
        strict: Option<bool>,
        description: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reasoning {
    /// OpenAI effort (`minimal`, `low`, `medium`, `high`).
    pub effort: Option<String>,
    /// Anthropic/Gemini thinking budget in tokens.
    pub budget_tokens: Option<i64>,
    /// Responses `reasoning.summary` (`auto`, `concise`, `detailed`).
    pub summary: Option<String>,
}

/// A whole (non-streamed) answer in the internal form.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// The upstream's id for the answer.
    pub id: String,
    /// The model the upstream says answered.
    pub model: String,
    /// The answer's parts in order: text, reasoning, tool calls, refusals.
    pub content: Vec<Part>,
    pub finish: Finish,
    pub usage: Option<Usage>,
    /// Unix seconds the upstream gave, if any.
    pub created: Option<i64>,
}

impl Answer {
    /// Whether the upstream ended this answer whole (`Finish::ended_whole`).
    pub fn ended_whole(&self) -> bool {
        let calls = self
            .content
            .iter()
            .any(|p| matches!(p, Part::ToolCall { .. }));
        self.finish.ended_whole(calls)
    }
}

/// Why the answer ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Finish {
    /// The model finished (OpenAI `stop`, Anthropic `end_turn`).
    #[default]
    Stop,
    /// One of the client's stop sequences (Anthropic says which).
    StopSequence(Option<String>),
    /// The output cap.
    Length,
    ToolCalls,
    /// A content filter stopped the answer.
    ContentFilter,
    /// The model refused (Anthropic `refusal`).
    Refusal,
    /// Anthropic `pause_turn` (a long server-tool turn paused).
    Pause,
    /// A reason this form has no name for, carried as the upstream wrote it.
    Other(String),
    /// A finish the reader stood in for one the upstream did not vouch for as whole: no
    /// reason given (Anthropic's `stop_reason`, OpenAI's `finish_reason` null or absent, a
    /// stream's `[DONE]` before any; Gemini's `finishReason` absent), a reason not known
    /// beside tool calls or a stop sequence, or a cut the client's formats have no word
    /// for but the inner one (Anthropic's `model_context_window_exceeded`, written as
    /// `Length`). Written to the client as the inner finish (`shown`), never whole
    /// (s28 stop attack F1: the readers took these for `Stop` or `ToolCalls`, and a
    /// translated answer so cut was cached).
    Unvouched(Box<Finish>),
}

impl Finish {
    /// Whether an answer that ended so is whole — the response cache's rule for a
    /// translated answer, whose client format's reason is written from this one and may
    /// call a paused or cut answer complete (`stop`, `end_turn`; late attack L5): the model
    /// finished, or stopped at a stop sequence, or to call tools; or at the output cap the
    /// request set, but not with a tool call, whose arguments the cap may have cut mid-JSON.
    /// A paused turn, a refusal, a filter's cut, any reason not named and a finish the
    /// upstream did not give (`Unvouched`) are not.
    pub fn ended_whole(&self, tool_calls: bool) -> bool {
        match self {
            Finish::Stop | Finish::StopSequence(_) | Finish::ToolCalls => true,
            Finish::Length => !tool_calls,
            Finish::ContentFilter
            | Finish::Refusal
            | Finish::Pause
            | Finish::Other(_)
            | Finish::Unvouched(_) => false,
        }
    }

    /// The finish a client is told: an `Unvouched` one's stand-in, any other itself.
    pub fn shown(&self) -> &Finish {
        match self {
            Finish::Unvouched(f) => f.shown(),
            f => f,
        }
    }

    /// `f`, marked as not vouched for by the upstream (`Unvouched`).
    pub fn unvouched(f: Finish) -> Finish {
        match f {
            Finish::Unvouched(_) => f,
            f => Finish::Unvouched(Box::new(f)),
        }
    }
}

/// The usage one stream event reported. A side the event did not carry is `None`: absent,
/// never a zero, for a zero is a figure (a stream whose usage says 0 costs 0), while
/// Anthropic's `message_start` reports the input with a placeholder output and its
/// `message_delta` the output alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reported {
    /// `input` and its parts (cache reads and writes, audio, images).
    pub input: Option<Input>,
    /// `output`, its parts (reasoning, audio, images) and the web-search calls.
    pub output: Option<Output>,
}

/// The input side of a `Usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Input {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write_5m: i64,
    pub cache_write_1h: i64,
    pub cache_write_unsplit: i64,
    pub audio_input: i64,
    pub image_input: i64,
}

/// The output side of a `Usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Output {
    pub output: i64,
    pub reasoning: i64,
    pub audio_output: i64,
    pub image_output: i64,
    pub web_search_calls: i64,
}

impl Usage {
    /// `self` with its input side replaced by `i`.
    pub fn with_input(mut self, i: Input) -> Usage {
        Reported {
            input: Some(i),
            output: None,
        }
        .apply(&mut self);
        self
    }
}

impl Reported {
    /// Both sides of `u`.
    pub fn whole(u: Usage) -> Reported {
        Reported {
            input: Some(Input {
                input: u.input,
                cached_input: u.cached_input,
                cache_write_5m: u.cache_write_5m,
                cache_write_1h: u.cache_write_1h,
                cache_write_unsplit: u.cache_write_unsplit,
                audio_input: u.audio_input,
                image_input: u.image_input,
            }),
            output: Some(Output {
                output: u.output,
                reasoning: u.reasoning,
                audio_output: u.audio_output,
                image_output: u.image_output,
                web_search_calls: u.web_search_calls,
            }),
        }
    }

    /// The sides of `u` a report carried: its input side when `input`, its output side when
    /// `output` (a side not carried is absent, never read as zeros).
    pub fn sides(u: Usage, input: bool, output: bool) -> Reported {
        let whole = Reported::whole(u);
        Reported {
            input: whole.input.filter(|_| input),
            output: whole.output.filter(|_| output),
        }
    }

    /// The whole usage when both sides are reported; `None` when either is absent.
    pub fn usage(&self) -> Option<Usage> {
        let mut u = Usage::default();
        self.apply(&mut u);
        (self.input.is_some() && self.output.is_some()).then_some(u)
    }

    /// `u` with the sides reported here replaced.
    pub fn apply(&self, u: &mut Usage) {
        if let Some(i) = self.input {
            u.input = i.input;
            u.cached_input = i.cached_input;
            u.cache_write_5m = i.cache_write_5m;
            u.cache_write_1h = i.cache_write_1h;
            u.cache_write_unsplit = i.cache_write_unsplit;
            u.audio_input = i.audio_input;
            u.image_input = i.image_input;
        }
        if let Some(o) = self.output {
            u.output = o.output;
            u.reasoning = o.reasoning;
            u.audio_output = o.audio_output;
            u.image_output = o.image_output;
            u.web_search_calls = o.web_search_calls;
        }
    }
}

/// One stream event in the internal form. An adapter in turns each upstream event into
/// zero or more of these; an adapter out turns each into zero or more client events.
/// Content blocks are numbered from 0 in the order they start; text, reasoning and tool
/// calls may interleave by index.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The answer began (id and model as the upstream gave them).
    Start {
        id: String,
        model: String,
        created: Option<i64>,
    },
    /// A text block begins.
    TextStart {
        index: usize,
    },
    TextDelta {
        index: usize,
        text: String,
    },
    /// A reasoning block begins.
    ReasoningStart {
        index: usize,
    },
    ReasoningDelta {
        index: usize,
        text: String,
    },
    /// The reasoning block's signature (or redacted data), sent once before its end.
    ReasoningSignature {
        index: usize,
        signature: String,
    },
    /// A tool call begins, with its id and name.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A piece of the tool call's JSON arguments, as text.
    ToolArgsDelta {
        index: usize,
        json: String,
    },
    RefusalDelta {
        index: usize,
        text: String,
    },
    /// The block `index` is complete.
    BlockStop {
        index: usize,
    },
    /// Usage figures; a later one replaces the sides it carries (streams report input
    /// first and output last, or all at the end).
    Usage(Reported),
    /// The answer finished for this reason (the usage may still follow).
    Finish(Finish),
    /// The upstream reported an error mid-stream: the stream ends with it, in the client's
    /// format.
    Error(ErrorInfo),
    /// The upstream's end of stream (`[DONE]`, `message_stop`, `response.completed`, the
    /// last Bedrock/Gemini event): the answer is complete.
    Done,
}

/// An error as any format reports it: the adapter in reads the upstream's error body or
/// event into it, the adapter out writes it in the client's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorInfo {
    /// The HTTP status it came with (a stream's error event: the status it stands for).
    pub status: u16,
    pub kind: ErrorKind,
    pub message: String,
    /// The upstream's own code or type string, kept for the client (`code`).
    pub code: Option<String>,
    /// The request field it names, if any.
    pub param: Option<String>,
}

/// The upstream's own fault an error event in the middle of a stream names: the only error
/// events that judge its key (`retry::of_fault`). Any other — the client's, its account's
/// (billing, authentication, permission), a type not known — says nothing of the key's
/// health and gives it no verdict (s26 stop attack #2: Anthropic's unknown types read as
/// `invalid_request_error`, which counted as the key's success).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Anthropic's `overloaded_error`, Gemini's `UNAVAILABLE`, Bedrock's
    /// `serviceUnavailableException`: as a 529.
    Overloaded,
    /// Anthropic's `rate_limit_error`, Gemini's `RESOURCE_EXHAUSTED` (not a spent quota),
    /// Bedrock's `throttlingException`: as a 429.
    RateLimited,
    /// Anthropic's `api_error`, OpenAI's `server_error`, Gemini's `INTERNAL`, Bedrock's
    /// `internalServerException` and `modelStreamErrorException`: as a 500.
    Server,
}

/// What went wrong, in the terms the retry tiers and the client formats share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    PermissionDenied,
    NotFound,
    /// Too large a request.
    RequestTooLarge,
    /// A rate limit: worth retrying on another key or later.
    RateLimited,
    /// A quota or billing limit: not worth retrying on this key until it is topped up.
    QuotaExhausted,
    /// A content filter refused the request or the answer.
    ContentFilter,
    Overloaded,
    Server,
}

impl ErrorKind {
    /// The upstream's own fault an error event of this kind names (`Fault`), for the
    /// formats whose error events are read only into the internal form (Gemini's,
    /// Bedrock's: their readers already tell the kind from Google's status or AWS's
    /// exception type). Any other kind names none.
    pub fn fault(self) -> Option<Fault> {
        match self {
            ErrorKind::Overloaded => Some(Fault::Overloaded),
            ErrorKind::RateLimited => Some(Fault::RateLimited),
            ErrorKind::Server => Some(Fault::Server),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a finish that ends an answer whole is one the cache stores a translated answer
    /// by (late attack L5); the cap only without a tool call.
    #[test]
    fn only_finishes_that_end_an_answer_whole_are_whole() {
        for f in [Finish::Stop, Finish::StopSequence(None), Finish::ToolCalls] {
            assert!(f.ended_whole(true) && f.ended_whole(false), "{f:?}");
        }
        assert!(Finish::Length.ended_whole(false));
        assert!(!Finish::Length.ended_whole(true));
        for f in [
            Finish::ContentFilter,
            Finish::Refusal,
            Finish::Pause,
            Finish::Other("MALFORMED_FUNCTION_CALL".into()),
            Finish::unvouched(Finish::Stop),
            Finish::unvouched(Finish::ToolCalls),
            Finish::unvouched(Finish::Length),
        ] {
            assert!(!f.ended_whole(false), "{f:?}");
        }
        let call = Part::ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{\"a\": 1".into(),
        };
        let cut = Answer {
            content: vec![call],
            finish: Finish::Length,
            ..Answer::default()
        };
        assert!(!cut.ended_whole());
        assert!(Answer::default().ended_whole());
    }
}

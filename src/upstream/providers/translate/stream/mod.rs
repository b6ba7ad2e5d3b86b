//! Streams across formats, event by event, and the accounting every stream needs whatever
//! its formats: the usage the upstream reported and the text it produced (to count when
//! the usage never arrives).
//!
//! Same format: each event passes as it came (read once for the accounting). Across
//! formats: the upstream format's `EventReader` turns each event into the internal form's
//! events (`canonical::Event`) and the client format's `EventWriter` writes those. The
//! converter owns the usage: the writer is told the accounted figures (an `Event::Usage`)
//! before the start and before the end, so `message_start` carries the input estimate and
//! the end the actual figures (or the count). Either way an upstream's mid-stream error
//! event reaches the client as its own format's error event, and the stream ends there.
//! Every event is read once into the typed fields of `shape`: one that is not JSON, or not
//! in its format's shape, ends the stream with the gateway's error event
//! (`upstream_error`).
//!
//! When a stream is complete, and what it costs:
//! - It is *complete* once the upstream sent its finish (OpenAI's `finish_reason` — of
//!   every choice the request asked for, its `n`: a choice not yet started has not finished —
//!   Anthropic's `message_delta`, Gemini's `finishReason`, Bedrock's `messageStop`,
//!   Responses' `response.completed`) and then its end: its end-of-stream event (`[DONE]`,
//!   `message_stop`, Bedrock's `metadata`) or, for every format, the end of its body —
//!   Gemini has no end event, and some OpenAI-compatible servers send no `[DONE]`. The
//!   pump tells the converter when the body ended, broke off or stalled (`end`); after a
//!   finish and its usage that completes the stream, and the client gets its closing
//!   events then — no later than the upstream ended (or went an idle timeout after its
//!   finish without telling more of the answer, `progress`: a usage, new or not, is not
//!   more of it). In a format whose usage comes before its end event (all but Gemini), a
//!   body that ends after the finish with neither is *cut*: the usage was lost on the way
//!   (unless the gateway never asked for it: `usage_not_asked`). An OpenAI answer with
//!   fewer choices started than asked, each finished, then a usage in a chunk of its own,
//!   is whole at the stream's end (`[DONE]`, its body's end, break or stall) if no choice
//!   starts first: a server that ignores `n` (Ollama) generates one; one that sends its
//!   choices one after another, a usage after each (a relay fanning `n` out), has more to
//!   come. Until that end the answer is not whole: a client leaving is a departure, the
//!   shutdown a cut, every choice's text received counted.
//!   After the finish the answer is whole: more of it is neither passed on nor counted,
//!   and once an OpenAI upstream's usage came after the finish in a chunk of its own,
//!   nothing but a higher usage is (the text of another choice included). A choice an
//!   OpenAI upstream sends that was not asked for (an index of `n` or more, or negative)
//!   counts toward no finish; before the answer is whole (or whole at its end) it is
//!   passed on and counted (an upstream that numbers an `n` = 1 answer's choices wrongly
//!   puts its text there), after it it is no part of the answer. A stream that ends before its
//!   finish is *cut*, and
//!   so is one with an event the gateway cannot read, before or after the finish (it may
//!   be the usage): the client gets an error event.
//! - Anthropic web searches are charged at the most of those reported and of the
//!   `server_tool_use` blocks named `web_search` seen before the finish: a search the
//!   model started is billed even when the stream is cut before the usage.
//! - Its *price* is the usage the upstream reported with or after its finish, zeros
//!   included (a side absent from a report is not a zero, see `canonical::Reported`).
//!   Reports after the finish are totals of one answer: the most of them is charged, per
//!   side (a later, lower one does not lower it; one report of zeros costs 0), never a
//!   sum. An input is known from the first event: the most reported counts wherever
//!   it came, and so does the most of its uncached part. A usage reported only before the
//!   finish may be a running figure
//!   (Gemini's every chunk, vLLM's continuous usage): its output is a floor, and the output
//!   counted from the text received counts if it is more. The reports of an answer one of
//!   whose choices started after such a usage of part of it (`parted`) are floors too,
//!   with or after the finish — the most of them all: each may be of one part or of all so
//!   far. With `n` > 1 every report is merged so, none replacing another (one on choice 0's
//!   finish chunk may be the whole answer's). An answer whole at its end is priced as after
//!   a finish from the usage that made it so: the most of that one, every later one and
//!   every one before. Without any usage, the input
//!   estimate and the counted output. An OpenAI client is told, at the latest at `[DONE]`,
//!   what it is charged when the last usage passed on said otherwise; while an answer is
//!   whole at its end it is passed a usage only when that raises a side above what it was
//!   told (`raises`).

pub mod shape;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

use crate::quota::estimate;
use crate::upstream::providers::canonical::{self, Event, Input, Output, Reported};
use crate::upstream::providers::formats::openai_chat::stream::{read_event, OpenAiEvent};
use crate::upstream::providers::formats::responses::adapter as responses_adapter;
use crate::upstream::providers::formats::responses::stream as responses;
use crate::upstream::providers::formats::{anthropic, bedrock, gemini, openai_chat};
use crate::upstream::providers::{tier, Format};
use crate::usage::Usage;
use shape::Body;
pub use shape::Corrupt;

/// Output text is counted (and let go of) in pieces of about this size, so a long stream
/// keeps no more than this of its text.
const COUNT_EVERY: usize = 64 * 1024;

/// The default of `StreamConverter::hold_limit`.
pub const HOLD_LIMIT: usize = 16 * 1024 * 1024;

/// How much of the answer a stream told so far (`StreamConverter::progress`): compared,
/// never read.
pub type Progress = (i64, usize);

/// The upstream format's reader (used across formats only).
enum Reader {
    OpenAiChat(openai_chat::EventReader),
    Anthropic(anthropic::EventReader),
    Gemini(gemini::EventReader),
    Bedrock(bedrock::EventReader),
}

/// Keeps of a reader's events only what may follow the finish — the usage, the end, an
/// error — once the finish came (`finished`: before these events, or among them): the
/// answer is whole then, and more of it would reach the client uncharged, for the usage
/// reported with or after the finish is the price (see the module doc).
fn after_finish(events: &mut Vec<Event>, mut finished: bool) {
    events.retain(|e| {
        let keep = !finished || matches!(e, Event::Usage(_) | Event::Done | Event::Error(_));
        finished |= matches!(e, Event::Finish(_));
        keep
    });
}

/// The client format's writer (used across formats only).
enum Writer {
    OpenAiChat(openai_chat::EventWriter),
    Anthropic(anthropic::EventWriter),
    Responses(Box<responses_adapter::EventWriter>),
}

impl Writer {
    fn write(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match self {
            Writer::OpenAiChat(w) => w.write(e, out),
            Writer::Anthropic(w) => w.write(e, out),
            Writer::Responses(w) => w.write(e, out),
        }
    }

    fn held_bytes(&self) -> usize {
        match self {
            Writer::OpenAiChat(_) | Writer::Responses(_) => 0,
            Writer::Anthropic(w) => w.held_bytes(),
        }
    }
}

/// What an OpenAI usage chunk tells a client: the input, its cached part, the output.
type Told = (i64, i64, i64);

/// What a usage tells (`Told`).
fn told_of(u: &Usage) -> Told {
    (u.input, u.cached_input, u.output)
}

/// What a chunk's usage tells: `None` for a chunk without one, `Some(None)` for one that
/// cannot be read whole.
fn told_in(c: &shape::Chunk) -> Option<Option<Told>> {
    c.usage.as_ref().map(|r| {
        r.figures()
            .map(|(i, o)| (i.input, i.cached_input, o.output))
    })
}

/// The most choices a stream's finishes are told apart for (`StreamConverter::choices`,
/// one bit each): a request streaming more is refused (`pipeline::request`).
pub const MOST_CHOICES: i64 = 32;

pub struct StreamConverter {
    upstream: Format,
    client: Format,
    include_usage: bool,
    input_estimate: i64,
    /// The input side as reported (see `report_input`).
    input: Option<Input>,
    /// The output side as reported (see `report_output`).
    output: Option<Output>,
    /// `output` was reported with or after the finish: the stream's price, not a floor.
    output_final: bool,
    /// The upstream sent its finish — of every choice the request asked for (`choices`),
    /// or of those a server that ignores `n` generated, at its end (`whole_at_end`): the
    /// answer is whole, the usage may still follow.
    finished: bool,
    /// How many choices the answer has: the request's `n` (`choices`), 1 but for an OpenAI
    /// chat or completions request asking for more, whose stream is whole only once each
    /// of them has its finish (a choice not yet started has not finished).
    choices: u32,
    /// The choices under `choices`, by index, whose finish came (an OpenAI stream's
    /// `finish_reason`): each is whole then, and what a later chunk says of it is neither
    /// passed on nor counted (`openai_to_openai`).
    finishes: u64,
    /// The choices a chunk of which came (`finishes`' bits).
    started: u64,
    /// An OpenAI upstream's usage came after the finish in a chunk of its own (its last
    /// usage chunk): the answer and its price are told, no choice's text is more of it.
    told: bool,
    /// A usage came in a chunk of its own with every choice started finished, but fewer
    /// started than asked, and no choice started since: a server that ignores `n` (Ollama)
    /// has told its whole answer, one that sends its choices one after another has more to
    /// come. The answer is whole at the stream's end (`[DONE]`, its body's end), that
    /// usage its price (`at_the_end`); a choice that starts first makes it `parted`.
    whole_at_end: bool,
    /// A usable output report came with or after the usage that made the answer
    /// `whole_at_end`: the price at its end, and the most of such reports (`report_output`).
    /// Cleared when the answer becomes `parted`: that report was of a part.
    end_reported: bool,
    /// The input, its cached part and the output of the last usage an OpenAI client was
    /// told (`Told`; `None` for one it cannot read, or none told): at `[DONE]` it is told
    /// what it is charged when that differs (`openai_done`).
    usage_told: Option<Told>,
    /// A choice started after such a usage: the upstream reports usage part by part (a
    /// relay fanning `n` out into n calls), and does not say whether a report is of its
    /// part or of every part so far. Its reports are floors under the count of every
    /// choice's text, with or after the finish too (`usage`).
    parted: bool,
    /// The gateway asked the upstream for its usage (false: an OpenAI-compatible server
    /// with `quirks.include_usage = false`): a finish without one lost nothing.
    usage_asked: bool,
    /// The output text received and not yet counted (see `note_text`).
    text: String,
    /// Tokens of the output text already counted.
    counted: i64,
    /// Anthropic web searches the model started (`server_tool_use` blocks named
    /// `web_search`) before the finish, less those answered with an error result (not
    /// billed): each is billed even when the stream is cut before the usage that counts
    /// them, so without a report these are the calls charged.
    searches_seen: i64,
    /// The finish carried the upstream's count of web searches: that count is charged.
    searches_reported: bool,
    /// Anthropic server-tool calls of any tool (`server_tool_use` blocks) started before
    /// the finish: how far a turn got, for a stream left before its usage.
    server_calls_seen: i64,
    /// The most this converter keeps of a stream (held blocks, arguments): past it the
    /// stream ends with an error event.
    hold_limit: usize,
    /// A service tier priced apart the upstream says it served at (`note_tier`).
    served_tier: Option<String>,
    done: bool,
    /// The upstream's own error event was passed on: the stream ends with it, and needs
    /// no error of the gateway's after it.
    error_sent: bool,
    reader: Reader,
    writer: Writer,
    /// A Responses client of an upstream that speaks the Responses API
    /// (`formats::responses::stream`): set by `responses`.
    responses: Option<Box<responses::Native>>,
    /// The first OpenAI chunk's `id`, `object`, `created` and `model` (the first that names
    /// its `object`, see `openai_to_openai`), for a usage chunk the gateway writes itself
    /// (`usage_chunk`).
    first_chunk: Option<Value>,
}

/// How a Responses client's stream is written.
pub enum ResponsesOut {
    /// The upstream speaks the Responses API: its events pass through (stamped).
    Native(responses::Native),
    /// The upstream's stream, read by its format's reader, is written as Responses events
    /// from the internal form.
    Translated(Box<responses_adapter::EventWriter>),
}

pub fn frame(event: Option<&str>, data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 32);
    if let Some(e) = event {
        b.put_slice(b"event: ");
        b.put_slice(e.as_bytes());
        b.put_slice(b"\n");
    }
    b.put_slice(b"data: ");
    b.put_slice(data.as_bytes());
    b.put_slice(b"\n\n");
    b.freeze()
}

/// An error event in `client`'s format, ending a stream that cannot complete.
pub fn error_event(client: impl Into<Format>, message: &str, code: &str) -> Bytes {
    match client.into() {
        // Gemini and Bedrock are never a client's format; OpenAI's shape stands in.
        Format::OpenAiChat | Format::Gemini | Format::Bedrock => frame(
            None,
            &json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}}).to_string(),
        ),
        Format::Anthropic => frame(
            Some("error"),
            &json!({"type": "error", "error": {"type": "api_error", "message": message, "code": code}}).to_string(),
        ),
        // A stream that ends before its first event (a converter writes its own with the
        // next sequence number: `StreamConverter::end_frame`).
        Format::Responses => responses::error_frame(0, message, code),
    }
}

impl StreamConverter {
    pub fn new(
        upstream: impl Into<Format>,
        client: impl Into<Format>,
        include_usage: bool,
        input_estimate: i64,
    ) -> Self {
        let (upstream, client) = (upstream.into(), client.into());
        Self {
            upstream,
            client,
            include_usage,
            input_estimate,
            input: None,
            output: None,
            told: false,
            whole_at_end: false,
            end_reported: false,
            usage_told: None,
            parted: false,
            usage_asked: true,
            output_final: false,
            finished: false,
            choices: 1,
            finishes: 0,
            started: 0,
            text: String::new(),
            counted: 0,
            searches_seen: 0,
            searches_reported: false,
            server_calls_seen: 0,
            hold_limit: HOLD_LIMIT,
            served_tier: None,
            done: false,
            error_sent: false,
            reader: match upstream {
                // A Responses upstream's native events are read by `responses::Native`.
                Format::OpenAiChat | Format::Responses => {
                    Reader::OpenAiChat(openai_chat::EventReader::default())
                }
                Format::Anthropic => Reader::Anthropic(anthropic::EventReader),
                Format::Gemini => Reader::Gemini(gemini::EventReader::new()),
                Format::Bedrock => Reader::Bedrock(bedrock::EventReader::new()),
            },
            writer: match client {
                // A Responses client's writer comes with its request (`responses`); no client
                // speaks Gemini or Bedrock: OpenAI's writer stands in.
                Format::OpenAiChat | Format::Responses | Format::Gemini | Format::Bedrock => {
                    Writer::OpenAiChat(openai_chat::EventWriter::new(include_usage))
                }
                Format::Anthropic => Writer::Anthropic(anthropic::EventWriter::default()),
            },
            responses: None,
            first_chunk: None,
        }
    }

    /// Writes the stream for a Responses API client (see `ResponsesOut`).
    pub fn responses(mut self, out: ResponsesOut) -> Self {
        self.include_usage = true;
        match out {
            ResponsesOut::Native(n) => self.responses = Some(Box::new(n)),
            ResponsesOut::Translated(w) => {
                self.client = Format::Responses;
                self.writer = Writer::Responses(w);
            }
        }
        self
    }

    /// A Responses client's final response object, once the stream completed.
    pub fn completed_response(&mut self) -> Option<serde_json::Value> {
        if let Some(n) = self.responses.as_deref_mut() {
            return n.completed.take();
        }
        match &mut self.writer {
            Writer::Responses(w) => w.completed.take(),
            _ => None,
        }
    }

    /// A native Responses stream: each event passes through, stamped and accounted.
    fn responses_event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        let Some(mut n) = self.responses.take() else {
            return;
        };
        {
            match n.read(name, data) {
                Ok(read) => {
                    if let Some(t) = &read.text {
                        self.note_text(t);
                    }
                    // `response.completed` is the finish, the end and the usage.
                    self.finished |= read.done;
                    self.done |= read.done;
                    if let Some(u) = read.usage {
                        self.report(u);
                    }
                    self.error_sent |= read.failed;
                    out.extend(read.frame);
                }
                Err(message) => {
                    out.push(responses::error_frame(
                        n.next_seq,
                        message,
                        "upstream_error",
                    ));
                    self.error_sent = true;
                }
            }
        }
        self.responses = Some(n);
    }

    /// The answer has `n` choices (the request's `n`; 1 by default): the stream is whole
    /// (`finished`) once each has its finish. At most 32 are told apart: `n` is at most 16.
    pub fn choices(mut self, n: i64) -> Self {
        self.choices = u32::try_from(n.clamp(1, MOST_CHOICES)).unwrap_or(1);
        self
    }

    /// Choice `index`'s bit in `finishes`; none for a choice not asked for (an index of
    /// `choices` or more, or negative): it counts toward no finish.
    fn choice_bit(&self, index: i64) -> Option<u64> {
        u32::try_from(index)
            .ok()
            .filter(|&i| i < self.choices)
            .map(|i| 1u64 << i)
    }

    /// What a chunk says of choice `index` is the client's, and counted: a choice asked
    /// for, not finished by `finishes`; a choice not asked for while the answer was not
    /// yet whole (`whole`: `finished` before the chunk, or whole at its end — its text
    /// would reach the client free of the usage that prices it). An upstream that numbers an `n` = 1
    /// answer's choices wrongly (LiteLLM in front of Claude with thinking puts the text
    /// on index 1, TGI before 1.4.4 the token's position) bills that text: it is the
    /// answer. After the finish it is no part of it (it would reach the client free).
    fn is_live(&self, finishes: u64, whole: bool, index: i64) -> bool {
        match self.choice_bit(index) {
            Some(b) => finishes & b == 0,
            None => !whole,
        }
    }

    /// The upstream was not asked for its usage (`usage_asked`).
    pub fn usage_not_asked(mut self) -> Self {
        self.usage_asked = false;
        self
    }

    /// Sets the most the converter keeps of one stream (`HOLD_LIMIT` by default).
    pub fn hold_limit(mut self, bytes: usize) -> Self {
        self.hold_limit = bytes;
        self
    }

    /// Takes output text for the count. Past `COUNT_EVERY` bytes, the text up to its last
    /// whitespace is counted and dropped (the tokenizer starts a word at its leading space,
    /// so a cut there counts as the whole would, give or take a token per piece).
    fn note_text(&mut self, t: &str) {
        self.text.push_str(t);
        if self.text.len() < COUNT_EVERY {
            return;
        }
        let cut = self
            .text
            .rfind(char::is_whitespace)
            .filter(|&i| i > 0)
            .unwrap_or(self.text.len());
        let rest = self.text.split_off(cut);
        self.counted += estimate::count_text(&self.text);
        self.text = rest;
    }

    /// The stream is complete (see the module doc): nothing after this is the client's.
    pub fn done(&self) -> bool {
        self.done
    }

    /// The upstream sent its finish, of every choice asked for (`choices`): the answer is
    /// whole, its usage or end may follow.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The answer is whole at the stream's end if no choice starts first (`whole_at_end`):
    /// the pump holds it, as a finished one, to the idle timeout after it last told more
    /// of it (`progress`).
    pub fn whole_at_end(&self) -> bool {
        self.whole_at_end && !self.finished
    }

    /// How much of the answer the stream has told so far: the same after an event that
    /// told none of it (a `ping`, a usage, new or repeated), so the pump sees an upstream
    /// that keeps sending after its finish without more of the answer (`pipeline::stream`).
    /// A usage is not progress: one that changes forever would hold the stream open as
    /// long as the upstream likes. With `n` > 1 the pump looks at it only once every
    /// choice finished (`finished`): until then a choice still streaming is the answer's
    /// own, held to the idle timeout between events like any stream before its finish.
    pub fn progress(&self) -> Progress {
        (self.counted, self.text.len())
    }

    /// The upstream's body ended — cleanly, broken off, or stalled past the idle timeout.
    /// True when the stream is complete: its end-of-stream event came, or its finish did,
    /// and then the client's closing events (the usage, `[DONE]`, `message_stop`,
    /// `response.completed`) are appended to `out`. False for a cut stream.
    pub fn end(&mut self, out: &mut Vec<Bytes>) -> bool {
        if self.done {
            return true;
        }
        self.at_the_end();
        // A native Responses stream finishes with its end (`response.completed`).
        if self.error_sent || !self.finished || self.responses.is_some() {
            return false;
        }
        // Every format but Gemini sends its usage before its end event: a finish followed
        // by neither lost its usage on the way (see the module doc).
        if !self.output_final && self.usage_asked && self.upstream != Format::Gemini {
            return false;
        }
        self.close(out)
    }

    /// Ends a whole answer whose usage or end the gateway stopped waiting for (the shutdown
    /// reached it after its finish, `pipeline::stream`): the client's closing events as at
    /// its end, with what it is charged (the usage if it came, else the count). False, and
    /// nothing written, when the answer is not whole.
    pub fn close(&mut self, out: &mut Vec<Bytes>) -> bool {
        if self.done {
            return true;
        }
        if self.error_sent || !self.finished || self.responses.is_some() {
            return false;
        }
        match (self.upstream, self.client) {
            (Format::OpenAiChat, Format::OpenAiChat) => self.openai_done(out),
            (Format::Anthropic, Format::Anthropic) => {
                self.done = true;
                out.push(frame(Some("message_stop"), r#"{"type":"message_stop"}"#));
            }
            _ => self.forward(&Event::Done, out),
        }
        true
    }

    /// What to charge (see the module doc): the usage reported with or after the finish,
    /// else a running output as a floor under the output counted from the text received,
    /// and the reported input, else its estimate.
    pub fn usage(&self) -> Usage {
        let i = self.input.unwrap_or(Input {
            input: self.input_estimate,
            ..Input::default()
        });
        let o = self.output.unwrap_or_default();
        let output = match self.output {
            Some(reported) if self.output_final && !self.parted => reported.output,
            reported => reported
                .map_or(0, |r| r.output)
                .max(self.counted + estimate::count_text(&self.text)),
        };
        Usage {
            input: i.input,
            cached_input: i.cached_input,
            cache_write_5m: i.cache_write_5m,
            cache_write_1h: i.cache_write_1h,
            cache_write_unsplit: i.cache_write_unsplit,
            audio_input: i.audio_input,
            image_input: i.image_input,
            output,
            reasoning: o.reasoning,
            audio_output: o.audio_output,
            image_output: o.image_output,
            web_search_calls: if self.searches_reported {
                o.web_search_calls
            } else {
                o.web_search_calls.max(self.searches_seen)
            },
        }
    }

    /// The Anthropic server-tool calls started before the finish (searches and fetches).
    pub fn server_calls_seen(&self) -> i64 {
        self.server_calls_seen
    }

    /// Whether the upstream reported the input: else `usage` charges the gateway's estimate.
    pub fn input_reported(&self) -> bool {
        self.input.is_some()
    }

    /// The usage the upstream reported with or after its finish came: `usage` is its
    /// price, not a count of what was seen.
    pub fn usage_final(&self) -> bool {
        self.output.is_some() && self.output_final && !self.parted
    }

    /// The stream ended (`[DONE]`, its body's end, break or stall): an answer whole at its
    /// end (`whole_at_end`) is whole now, the usage with or after the one that made it so
    /// its price (`end_reported`; a running figure before it stays a floor).
    fn at_the_end(&mut self) {
        if self.whole_at_end && !self.finished {
            self.finished = true;
            self.output_final = self.end_reported;
        }
    }

    /// Both sides of a whole usage the upstream reported.
    fn report(&mut self, u: Usage) {
        let r = Reported::whole(u);
        self.report_sides(&r);
    }

    /// The sides a usage event carries.
    fn report_sides(&mut self, r: &Reported) {
        if let Some(i) = r.input {
            self.report_input(i);
        }
        if let Some(o) = r.output {
            self.report_output(o);
        }
    }

    /// An output side the upstream reported: the price when it came with or after the
    /// finish (the most of such reports, figure by figure: each is a total of one answer),
    /// a floor before it. So too, the most of them, with or after the usage that made the
    /// answer whole at its end (`whole_at_end`: a later, lower one does not lower it), and
    /// every report of a `parted` answer: each is of one call or of every call so far (the
    /// upstream does not say), so the most of them is a floor under either; their sum could
    /// charge a relay reporting running totals for its calls n times over. With `n` > 1
    /// every report is merged so, those before such a usage too: a report on choice 0's
    /// finish chunk may be the whole answer's (a server that ignores `n`), or call 0's, and
    /// a later, lower usage in a chunk of its own does not lower it. A running figure of an
    /// `n` > 1 stream rises toward the final one (vLLM's is one choice's count, under the
    /// total), so the most of them is the final one there.
    fn report_output(&mut self, o: Output) {
        let most = self.output_final
            || self.parted
            || (self.whole_at_end && self.end_reported)
            || self.choices > 1;
        self.output = match self.output {
            Some(had) if most => Some(Output {
                output: had.output.max(o.output),
                reasoning: had.reasoning.max(o.reasoning),
                audio_output: had.audio_output.max(o.audio_output),
                image_output: had.image_output.max(o.image_output),
                web_search_calls: had.web_search_calls.max(o.web_search_calls),
            }),
            _ => Some(o),
        };
        self.output_final = self.finished;
        self.end_reported |= self.whole_at_end;
    }

    /// An input side the upstream reported. The input is known from the first event:
    /// every report is a total of the same prompt, so the most reported counts, wherever
    /// it came — and so does the most reported of its uncached part, for a later report
    /// with more input but more of it cached would lower the price too. The cache writes
    /// count at the most reported of them in all, the most reported of the one-hour ones
    /// among them, and as unsplit what the largest split did not cover (Anthropic's
    /// `message_delta` repeats the writes' total without its split by lifetime: that is
    /// no five-minute write), audio and images at the most reported.
    fn report_input(&mut self, i: Input) {
        let cached = i.cached_input.clamp(0, i.input.max(0));
        let (total, fresh, had) = match self.input {
            None => (i.input, i.input - cached, Input::default()),
            Some(had) => (
                had.input.max(i.input),
                (had.input - had.cached_input).max(i.input - cached),
                had,
            ),
        };
        let written = |x: &Input| x.cache_write_5m.saturating_add(x.cache_write_1h);
        let hour = had.cache_write_1h.max(i.cache_write_1h);
        let all = written(&had).max(written(&i));
        let five = all - hour;
        // Unsplit: the most written in all beyond the largest split total any report gave
        // (a report's split is its writes less its own unsplit part). The `message_delta`
        // repeating `message_start`'s total adds nothing unsplit; a larger total there adds
        // the difference, priced per the request's marks (`Usage::at_worst_lifetime`).
        let split = |x: &Input| written(x) - x.cache_write_unsplit;
        let unsplit = all - split(&had).max(split(&i));
        self.input = Some(Input {
            input: total,
            cached_input: (total - fresh).max(0),
            cache_write_5m: five,
            cache_write_1h: hour,
            cache_write_unsplit: unsplit.clamp(0, five),
            audio_input: had.audio_input.max(i.audio_input),
            image_input: had.image_input.max(i.image_input),
        });
    }

    /// The first service tier priced apart (`tier::priced_apart`) an event of the stream
    /// says it was served at.
    pub fn served_tier(&self) -> Option<&str> {
        self.served_tier.as_deref()
    }

    /// Notes the first tier priced apart an event names (`tier::priced_apart_in`): any
    /// event may be the one that tells, so each is looked at until one does.
    fn note_tier(&mut self, data: &str) {
        if self.served_tier.is_none() {
            self.served_tier = tier::priced_apart_in(data);
        }
    }

    /// The upstream sent an error event, which the client received in its format: the
    /// stream is over.
    pub fn upstream_failed(&self) -> bool {
        self.error_sent
    }

    /// The closing event of a stream that broke, in the client's format — none when the
    /// upstream's own error event already ended it.
    pub fn error_frame(&self, message: &str) -> Option<Bytes> {
        self.end_frame(message, "upstream_error")
    }

    /// As `error_frame`, with this code (`shutting_down` when the gateway ends the stream).
    pub fn end_frame(&self, message: &str, code: &str) -> Option<Bytes> {
        (!self.error_sent).then(|| self.client_error(message, code))
    }

    /// An error event in the client's format; a Responses client's with the next sequence
    /// number of its stream.
    fn client_error(&self, message: &str, code: &str) -> Bytes {
        if let Some(n) = &self.responses {
            return responses::error_frame(n.next_seq, message, code);
        }
        match &self.writer {
            Writer::Responses(w) => responses::error_frame(w.next_seq(), message, code),
            _ => error_event(self.client, message, code),
        }
    }

    /// Takes one upstream event and appends what the client must receive to `out`.
    pub fn event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        // After the complete answer or the upstream's error, the client's stream is over.
        if self.error_sent || self.done {
            return;
        }
        // An empty `data:` carries nothing.
        if data.trim().is_empty() {
            return;
        }
        self.note_tier(data);
        if self.responses.is_some() {
            return self.responses_event(name, data, out);
        }
        let read = match (self.upstream, self.client) {
            (Format::OpenAiChat, Format::OpenAiChat) => self.openai_to_openai(data, out),
            (Format::Anthropic, Format::Anthropic) => self.anthropic_to_anthropic(name, data, out),
            _ => self.across(name, data, out),
        };
        // An event the gateway cannot read — not JSON, or JSON not in its format's shape
        // (see `shape`) — is a piece of the answer or of its usage it cannot pass on or
        // count: the stream ends here as an error, not as a complete answer with a hole.
        // Also after the finish: the event may be the usage, which then goes uncounted.
        if let Err(corrupt) = read {
            out.push(self.client_error(corrupt.message(), "upstream_error"));
            self.error_sent = true;
            return;
        }
        if self.held_bytes() > self.hold_limit && !self.error_sent {
            out.push(self.client_error(
                "The upstream held back more of the answer than the gateway keeps; the stream was ended by the gateway.",
                "upstream_error",
            ));
            self.error_sent = true;
        }
    }

    /// Accounting of an OpenAI chunk: the text it carries (counted when no usage comes)
    /// and its usage.
    fn note_openai_chunk(&mut self, c: &shape::Chunk) {
        // The answer is whole once each of its `choices` finished (choice 0 alone with
        // `n` = 1, see `openai_chat::stream`); a chunk that finishes the last and carries
        // the usage (vLLM's continuous usage) carries the final one. What a later chunk
        // says of a finished choice, or of a choice not asked for once the answer is whole,
        // is not the client's (`openai_to_openai`): not counted either; nor, once the usage came after
        // the finish in a chunk of its own, is the text of any choice (see the module doc).
        let before = self.finishes;
        let was_whole = self.finished || self.whole_at_end;
        let started = self.started;
        let told = self.told;
        for choice in c.choices.iter().flatten() {
            let Some(bit) = self.choice_bit(choice.index.unwrap_or(0)) else {
                continue;
            };
            self.started |= bit;
            if (choice.finish_reason.as_deref()).is_some_and(|r| !r.is_empty()) {
                self.finishes |= bit;
            }
        }
        let usage_only = c.choices.as_ref().is_none_or(Vec::is_empty) && c.usage.is_some();
        // A choice that starts after a usage that came with fewer choices started than
        // asked: that usage was of a part of the answer (`parted`), and a report made with
        // it says nothing of a later usage that makes the answer whole at its end again
        // (`end_reported`: one the gateway cannot read leaves its end a cut, `at_the_end`).
        if self.whole_at_end && self.started != started {
            self.whole_at_end = false;
            self.end_reported = false;
            self.parted = true;
        }
        // Whole once every choice asked for finished (a choice not yet started has not).
        // A usage in a chunk of its own with every choice started finished comes after
        // every choice the server generated so far: one that ignores `n` (Ollama) generates
        // fewer than asked, and is whole at its end; one that sends its choices one after
        // another, a usage after each, has more to come (`whole_at_end`).
        self.finished |= self.finishes == (1u64 << self.choices) - 1;
        self.whole_at_end |= !self.finished
            && usage_only
            && self.started != 0
            && self.finishes & self.started == self.started;
        for choice in c.choices.iter().flatten() {
            if told || !self.is_live(before, was_whole, choice.index.unwrap_or(0)) {
                continue;
            }
            if let Some(t) = &choice.text {
                self.note_text(t);
            }
            let Some(d) = &choice.delta else { continue };
            if let Some(t) = &d.content {
                self.note_text(&t.text());
            }
            if let Some(t) = &d.refusal {
                self.note_text(t);
            }
            // Reasoning is output the upstream bills (see `shape::Delta`).
            for t in [&d.reasoning_content, &d.reasoning].into_iter().flatten() {
                self.note_text(t);
            }
            for tc in d.tool_calls.iter().flatten() {
                if let Some(id) = &tc.id {
                    self.note_text(id);
                }
                for t in tc
                    .function
                    .iter()
                    .flat_map(|f| [&f.name, &f.arguments])
                    .flatten()
                {
                    self.note_text(t);
                }
            }
        }
        if let Some((input, output)) = c.usage.as_ref().and_then(|u| u.figures()) {
            self.report_input(input);
            self.report_output(output);
            // A usage on a chunk with choices may be a running one (vLLM's continuous
            // usage: another choice of an `n` > 1 stream may still be streaming).
            self.told |= self.finished && usage_only;
        }
    }

    /// The end of an OpenAI stream for an OpenAI client: `[DONE]`, the upstream's or the
    /// gateway's (a server that sends none, see `end`).
    fn openai_done(&mut self, out: &mut Vec<Bytes>) {
        self.done = true;
        // The client asked for the usage chunk and the server sent none (it refuses
        // `stream_options`: `quirks.include_usage = false`), or only running ones before
        // its finish (a floor under the count, vLLM's continuous usage): it is told what
        // it is charged, the counted figures, as an Anthropic client is. So is one whose
        // last usage told says less than it is charged: a `parted` answer's last report on
        // its finish chunk under the count, a lower report after the one that made the
        // answer whole at its end (`report_output`).
        if self.include_usage
            && (!self.output_final || self.usage_told != Some(told_of(&self.usage())))
        {
            self.push_usage_chunk(out);
        }
        out.push(frame(None, "[DONE]"));
    }

    /// A chunk's usage (`told_in`) tells the client more than it was told (`usage_told`): a
    /// side higher — the input, its uncached part or the output — or anything readable when
    /// nothing readable was told.
    fn raises(&self, usage: Option<Option<Told>>) -> bool {
        match (usage.flatten(), self.usage_told) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some((i, c, o)), Some((ti, tc, to))) => {
                i > ti || i.saturating_sub(c) > ti.saturating_sub(tc) || o > to
            }
        }
    }

    /// Passes a usage chunk of the gateway's own (`usage_chunk`), and notes what it told.
    fn push_usage_chunk(&mut self, out: &mut Vec<Bytes>) {
        let u = self.usage();
        out.push(self.usage_chunk(&u));
        self.usage_told = Some(told_of(&u));
    }

    /// A usage chunk of the gateway's own telling what the stream is charged (`u`), its
    /// details (reasoning, audio) as the upstream's would, under the first chunk's `id`,
    /// `object` (`text_completion` on `/v1/completions`), `created` and `model`.
    fn usage_chunk(&self, u: &Usage) -> Bytes {
        let first = self.first_chunk.as_ref().unwrap_or(&Value::Null);
        let object = (first["object"].as_str())
            .filter(|o| !o.is_empty())
            .unwrap_or("chat.completion.chunk");
        frame(
            None,
            &json!({"id": first["id"], "object": object,
                "created": first["created"], "model": first["model"], "choices": [],
                "usage": {"prompt_tokens": u.input, "completion_tokens": u.output,
                    "total_tokens": u.input.saturating_add(u.output),
                    "prompt_tokens_details": {"cached_tokens": u.cached_input,
                        "audio_tokens": u.audio_input},
                    "completion_tokens_details": {"reasoning_tokens": u.reasoning,
                        "audio_tokens": u.audio_output}}})
            .to_string(),
        )
    }

    fn openai_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) -> Result<(), Corrupt> {
        if data == "[DONE]" {
            self.at_the_end();
            self.openai_done(out);
            return Ok(());
        }
        // The first chunk names the stream, unless it names no `object` (Azure's first chunk,
        // the prompt's filter verdict, has an empty `id` and `object`): then the first chunk
        // before any choice started that does.
        let unnamed = |f: &Value| f["object"].as_str().is_none_or(str::is_empty);
        if self.include_usage && self.started == 0 && self.first_chunk.as_ref().is_none_or(unnamed)
        {
            self.first_chunk = serde_json::from_str::<Value>(data).ok().map(|v| {
                json!({"id": v["id"], "object": v["object"], "created": v["created"],
                        "model": v["model"]})
            });
        }
        let before = self.finishes;
        let was_whole = self.finished || self.whole_at_end;
        // Counting the text not yet counted costs up to `COUNT_EVERY` bytes of tokenizing:
        // done only where a figure is needed, never per chunk (it made a long stream
        // quadratic: 500 KB of one-word chunks took minutes).
        let told = self.told;
        let charged = told.then(|| self.usage());
        let c = match read_event(data)? {
            OpenAiEvent::Chunk(c) => c,
            OpenAiEvent::Error { error, raw } => {
                self.error_sent = true;
                // An error in OpenAI's own shape passes as it came; TGI's text form is
                // reshaped so the client's SDK reads its message and code.
                out.push(if raw {
                    frame(None, data)
                } else {
                    frame(None, &error.to_string())
                });
                return Ok(());
            }
        };
        self.note_openai_chunk(&c);
        // Once the usage came after the finish, the answer and its price are told: only a
        // usage that raises the price is told again — the gateway's own chunk of what it
        // charges, so the client's last usage chunk is that (a side may have gone down).
        if told {
            if self.include_usage && Some(self.usage()) != charged {
                self.push_usage_chunk(out);
            }
            return Ok(());
        }
        // After its finish a choice is whole: more of it — text, a second finish — is not
        // passed on (nor counted), else the client would hold more than the usage reported
        // with the finish, its price. The choices still streaming (`n` > 1, each whole at
        // its own finish) and the usage still pass; a choice not asked for (an index of `n`
        // or more, or negative) passes until the answer is whole (`is_live`). A usage whose
        // every choice is filtered out so (the LiteLLM proxy's usage chunk, its empty choice
        // 0 already finished) is told as one in a chunk of its own is.
        let mut usage_only = c.choices.as_ref().is_none_or(Vec::is_empty) && c.usage.is_some();
        let mut filtered = None;
        if c.choices
            .iter()
            .flatten()
            .any(|choice| !self.is_live(before, was_whole, choice.index.unwrap_or(0)))
        {
            let mut v: Value = serde_json::from_str(data).map_err(|_| Corrupt::Json)?;
            if let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) {
                choices.retain(|choice| {
                    self.is_live(before, was_whole, choice["index"].as_i64().unwrap_or(0))
                });
                if choices.is_empty() && (c.usage.is_none() || !self.include_usage) {
                    return Ok(());
                }
                usage_only = choices.is_empty();
            }
            filtered = Some(v.to_string());
        }
        if usage_only && !self.include_usage {
            return Ok(());
        }
        // The usage after the finish, where it says less than is charged on a side (a usage
        // on the finish chunk said more): the client is told the gateway's figures.
        let differs = || {
            let u = self.usage();
            c.usage
                .as_ref()
                .and_then(|r| r.figures())
                .map(|(i, o)| (i.input, i.cached_input, o.output))
                != Some((u.input, u.cached_input, u.output))
        };
        if usage_only && self.finished && differs() {
            self.push_usage_chunk(out);
        } else if usage_only && self.whole_at_end() && !self.raises(told_in(&c)) {
            // While the answer is whole at its end, a usage of its own that tells the client
            // nothing higher (a repeat, a lower one, one it cannot read) is not passed on: a
            // client summing its usage chunks (LangChain's `add_usage`) would add it up, and
            // `[DONE]` tells what is charged if it differs (`openai_done`). Not the gateway's
            // own chunk here: until that end `usage` is a floor, not the price.
        } else {
            out.push(frame(None, filtered.as_deref().unwrap_or(data)));
            if let Some(told) = told_in(&c) {
                self.usage_told = told;
            }
        }
        Ok(())
    }

    /// Accounting of an Anthropic event.
    fn note_anthropic_event(&mut self, e: &shape::Event) {
        match &e.body {
            Body::MessageStart(m) => {
                if let Some(u) = m.usage.as_ref().filter(|u| u.input_reported()) {
                    self.report_input(u.input());
                }
            }
            // After the finish (`message_delta`) the answer is whole: a later block is not
            // passed on (`after_finish`) nor counted.
            Body::BlockDelta { .. } | Body::BlockStart { .. } if self.finished => {}
            Body::BlockStart { block, .. } if block.kind == "server_tool_use" => {
                self.server_calls_seen += 1;
                if anthropic::is_web_search_call(&block.kind, block.name.as_deref()) {
                    self.searches_seen += 1;
                }
            }
            // A search past `max_uses` (or failed) is answered with an error result and not
            // billed: its `server_tool_use` block came before it.
            Body::BlockStart { block, .. }
                if anthropic::is_search_error(&block.kind, block.content_type().as_deref()) =>
            {
                self.searches_seen = (self.searches_seen - 1).max(0);
            }
            Body::BlockDelta { delta, .. } => {
                // Thinking is output Anthropic bills: a stream cut while the model thinks
                // is charged what it thought.
                for t in [&delta.text, &delta.partial_json, &delta.thinking]
                    .into_iter()
                    .flatten()
                {
                    self.note_text(t);
                }
            }
            // The finish, with the final figures: cumulative, the input ones only where this
            // event carries them.
            Body::MessageDelta(_, u) => {
                self.finished = true;
                let Some(u) = u else { return };
                self.searches_reported |= u
                    .server_tool_use
                    .as_ref()
                    .is_some_and(|s| shape::reported(s.web_search_requests).is_some());
                if let Some(o) = u.output() {
                    self.report_output(o);
                }
                if u.input_reported() {
                    self.report_input(u.input());
                }
            }
            Body::MessageStop => self.done = true,
            Body::Error(_) => self.error_sent = true,
            _ => {}
        }
    }

    fn anthropic_to_anthropic(
        &mut self,
        name: &str,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
        let e = shape::anthropic_event(data)?;
        let was_finished = self.finished;
        self.note_anthropic_event(&e);
        // After the finish the answer is whole: no more blocks, no second start or finish
        // (a second `message_delta` could tell the client less than it is charged; a
        // higher usage in one is charged, not told).
        if was_finished
            && matches!(
                e.body,
                Body::BlockStart { .. }
                    | Body::BlockDelta { .. }
                    | Body::BlockStop(_)
                    | Body::MessageStart(_)
                    | Body::MessageDelta(..)
            )
        {
            return Ok(());
        }
        let kind = if e.kind.is_empty() { "ping" } else { &e.kind };
        out.push(frame(Some(if name.is_empty() { kind } else { name }), data));
        Ok(())
    }

    /// Bytes held for the client across formats (calls waiting for their names, blocks
    /// waiting behind a live one).
    fn held_bytes(&self) -> usize {
        let reader = match &self.reader {
            Reader::OpenAiChat(r) => r.held_bytes(),
            Reader::Anthropic(_) | Reader::Gemini(_) | Reader::Bedrock(_) => 0,
        };
        reader + self.writer.held_bytes()
    }

    /// An upstream event through the internal form: read (and accounted) by the upstream
    /// format's reader, written by the client format's writer.
    fn across(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) -> Result<(), Corrupt> {
        let mut events = Vec::new();
        // An OpenAI upstream's end (`whole_at_end` is only ever set by its chunks).
        if data == "[DONE]" {
            self.at_the_end();
        }
        let finished = self.finished;
        match &mut self.reader {
            Reader::OpenAiChat(r) => {
                if data == "[DONE]" {
                    r.done(&mut events);
                } else {
                    match read_event(data)? {
                        OpenAiEvent::Chunk(c) => {
                            r.chunk(&c, &mut events);
                            self.note_openai_chunk(&c);
                        }
                        OpenAiEvent::Error { error, .. } => r.error(&error, &mut events),
                    }
                }
            }
            Reader::Anthropic(r) => {
                let e = shape::anthropic_event(data)?;
                r.event(&e, &mut events);
                self.note_anthropic_event(&e);
            }
            // Formats read only through the internal form: accounted from its events.
            Reader::Gemini(r) => {
                r.read(name, data, &mut events)?;
                after_finish(&mut events, finished);
                events.iter().for_each(|e| self.note_event(e));
            }
            Reader::Bedrock(r) => {
                r.read(name, data, &mut events)?;
                after_finish(&mut events, finished);
                events.iter().for_each(|e| self.note_event(e));
            }
        }
        after_finish(&mut events, finished);
        for e in &events {
            self.forward(e, out);
        }
        Ok(())
    }

    /// Accounting from the internal form's events, for an upstream format whose reader is
    /// not read into typed shapes here (the OpenAI and Anthropic readers are, and keep
    /// their own accounting, `note_openai_chunk` / `note_anthropic_event`). A format added
    /// later calls this on its reader's events: every piece of output is counted, the
    /// finish noted, and a usage event sets the sides it reports — zeros too (input first,
    /// output last, or all at once).
    fn note_event(&mut self, e: &Event) {
        match e {
            Event::TextDelta { text, .. }
            | Event::ReasoningDelta { text, .. }
            | Event::RefusalDelta { text, .. } => self.note_text(text),
            Event::ToolArgsDelta { json, .. } => self.note_text(json),
            Event::ToolCallStart { id, name, .. } => {
                self.note_text(id);
                self.note_text(name);
            }
            Event::Usage(r) => self.report_sides(r),
            Event::Finish(_) => self.finished = true,
            Event::Done => self.done = true,
            Event::Error(_) => self.error_sent = true,
            _ => {}
        }
    }

    /// The accounted usage in the internal form.
    fn accounted(&self) -> canonical::Usage {
        self.usage()
    }

    fn forward(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match e {
            // The converter owns the usage (see the module doc).
            Event::Usage(_) => return,
            Event::Start { .. } => {
                let estimate = canonical::Usage {
                    input: self.input_estimate,
                    ..canonical::Usage::default()
                };
                self.writer
                    .write(&Event::Usage(Reported::whole(estimate)), out);
            }
            Event::Done => {
                self.done = true;
                let usage = self.accounted();
                self.writer
                    .write(&Event::Usage(Reported::whole(usage)), out);
            }
            Event::Error(_) => self.error_sent = true,
            _ => {}
        }
        self.writer.write(e, out);
    }
}

#[cfg(test)]
mod tests;

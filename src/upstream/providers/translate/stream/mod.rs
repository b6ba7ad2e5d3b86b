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
//!   finish is *cut* (an Anthropic `message_stop` before its `message_delta` too), and
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

mod accounting;
mod across;
mod finish;
mod framing;
mod from_anthropic;
mod from_openai;
mod responses_out;

use bytes::Bytes;
use serde_json::Value;

use crate::upstream::providers::canonical::{Fault, Input, Output};
use crate::upstream::providers::formats::responses::stream as responses;
use crate::upstream::providers::formats::{anthropic, bedrock, gemini, openai_chat};
use crate::upstream::providers::Format;
use across::{Reader, Writer};
pub use finish::{Progress, MOST_CHOICES};
pub use framing::{error_event, frame, typed_error_event};
use from_openai::Told;
pub use responses_out::ResponsesOut;
pub use shape::Corrupt;

/// The default of `StreamConverter::hold_limit`.
pub const HOLD_LIMIT: usize = 16 * 1024 * 1024;

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
    /// Across formats: a tool call came (`Event::ToolCallStart`), which the cap may have
    /// cut (`cut`).
    called: bool,
    /// Across formats: the upstream's own finish, read into the internal form, says the
    /// answer is not whole (`Finish::ended_whole`: a paused turn, a refusal, a filter's cut,
    /// a reason not named), though the client's format may write it as a complete one
    /// (`stop`, `end_turn`; late attack L5). See `ended_whole`.
    cut: bool,
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
    /// Bytes of base64 audio received (an OpenAI audio answer's `delta.audio.data`): counted
    /// as audio output when no usage prices the stream (`accounting::heard`).
    audio_bytes: usize,
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
    /// The error event that ended the stream was the gateway's (an event it cannot read,
    /// the hold limit), not the upstream's: the upstream did not stop there.
    gateway_ended: bool,
    /// The gateway's error event was for a piece of the answer of a kind it does not model
    /// (`Corrupt::Unsupported`): the upstream answered well, its key gets no verdict.
    unsupported: bool,
    /// The upstream's own fault its error event named (`Fault`): its key's verdict.
    fault: Option<Fault>,
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
            called: false,
            cut: false,
            choices: 1,
            finishes: 0,
            started: 0,
            text: String::new(),
            counted: 0,
            audio_bytes: 0,
            searches_seen: 0,
            searches_reported: false,
            server_calls_seen: 0,
            hold_limit: HOLD_LIMIT,
            served_tier: None,
            done: false,
            error_sent: false,
            gateway_ended: false,
            unsupported: false,
            fault: None,
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
            (Format::Anthropic, Format::Anthropic) => self.anthropic_to_anthropic(data, out),
            _ => self.across(name, data, out),
        };
        // An event the gateway cannot read — not JSON, or JSON not in its format's shape
        // (see `shape`) — is a piece of the answer or of its usage it cannot pass on or
        // count: the stream ends here as an error, not as a complete answer with a hole.
        // Also after the finish: the event may be the usage, which then goes uncounted.
        // One of a kind the gateway does not model ends it alike (the same error event, the
        // same charge), but is no failure of the upstream's (`unsupported`).
        if let Err(corrupt) = read {
            out.push(self.client_error(corrupt.message(), "upstream_error"));
            self.end_by_the_gateway();
            self.unsupported = corrupt == Corrupt::Unsupported;
            return;
        }
        if self.held_bytes() > self.hold_limit && !self.error_sent {
            out.push(self.client_error(
                "The upstream held back more of the answer than the gateway keeps; the stream was ended by the gateway.",
                "upstream_error",
            ));
            self.end_by_the_gateway();
        }
    }
}

#[cfg(test)]
mod tests;

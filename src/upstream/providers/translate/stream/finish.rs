//! When a stream is complete (the rule: the module doc of `translate::stream`): the finish
//! of each choice asked for, an answer whole at the stream's end, and the client's closing
//! events once the upstream ended.

use bytes::Bytes;

use super::framing::frame;
use super::StreamConverter;
use crate::upstream::providers::canonical::Event;
use crate::upstream::providers::Format;

/// How much of the answer a stream told so far (`StreamConverter::progress`): compared,
/// never read.
pub type Progress = (i64, usize);

/// The most choices a stream's finishes are told apart for (`StreamConverter::choices`,
/// one bit each): a request streaming more is refused (`pipeline::request`).
pub const MOST_CHOICES: i64 = 32;

impl StreamConverter {
    /// The answer has `n` choices (the request's `n`; 1 by default): the stream is whole
    /// (`finished`) once each has its finish. At most 32 are told apart: `n` is at most 16.
    pub fn choices(mut self, n: i64) -> Self {
        self.choices = u32::try_from(n.clamp(1, MOST_CHOICES)).unwrap_or(1);
        self
    }

    /// Choice `index`'s bit in `finishes`; none for a choice not asked for (an index of
    /// `choices` or more, or negative): it counts toward no finish.
    pub(super) fn choice_bit(&self, index: i64) -> Option<u64> {
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
    pub(super) fn is_live(&self, finishes: u64, whole: bool, index: i64) -> bool {
        match self.choice_bit(index) {
            Some(b) => finishes & b == 0,
            None => !whole,
        }
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

    /// Nothing the upstream said ends the answer short of whole: false once a translated
    /// stream's finish, read into the internal form, is a paused turn, a refusal, a
    /// filter's cut or a reason not named (`Finish::ended_whole`), which the client's format
    /// may call complete — such an answer is not cached (late attack L5). Within one format
    /// the client's reason is the upstream's own, and the cache judges it (`cache::shape`).
    pub fn ended_whole(&self) -> bool {
        !self.cut
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

    /// The stream ended (`[DONE]`, its body's end, break or stall): an answer whole at its
    /// end (`whole_at_end`) is whole now, the usage with or after the one that made it so
    /// its price (`end_reported`; a running figure before it stays a floor).
    pub(super) fn at_the_end(&mut self) {
        if self.whole_at_end && !self.finished {
            self.finished = true;
            self.output_final = self.end_reported;
        }
    }
}

//! What a stream costs: its output text counted, the sides of the usages the upstream
//! reported merged into the price or a floor under the count (the rule: the module doc of
//! `translate::stream`), and the service tier it says it was served at.

use super::StreamConverter;
use crate::quota::estimate;
use crate::upstream::providers::canonical::{Input, Output, Reported};
use crate::upstream::providers::tier;
use crate::usage::Usage;

/// Output text is counted (and let go of) in pieces of about this size, so a long stream
/// keeps no more than this of its text.
pub(super) const COUNT_EVERY: usize = 64 * 1024;

/// Base64 characters of streamed audio per audio output token. OpenAI streams audio as
/// `pcm16` only (24 kHz mono: 48 000 bytes a second, 64 000 in base64) and bills its output
/// audio at 20 tokens a second (one per 50 ms): 3 200 characters a token.
const AUDIO_BASE64_PER_TOKEN: usize = 3_200;

impl StreamConverter {
    /// Takes output text for the count. Past `COUNT_EVERY` bytes, the text up to its last
    /// whitespace is counted and dropped (the tokenizer starts a word at its leading space,
    /// so a cut there counts as the whole would, give or take a token per piece).
    pub(super) fn note_text(&mut self, t: &str) {
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

    /// What to charge (see the module doc): the usage reported with or after the finish,
    /// else a running output as a floor under the output counted from the text received,
    /// and the reported input, else its estimate.
    pub fn usage(&self) -> Usage {
        let i = self.input.unwrap_or(Input {
            input: self.input_estimate,
            ..Input::default()
        });
        let o = self.output.unwrap_or_default();
        let heard = self.heard();
        let (output, audio_output) = match self.output {
            Some(reported) if self.output_final && !self.parted => {
                (reported.output, reported.audio_output)
            }
            // The audio received is part of the output counted, priced as audio.
            reported => (
                reported.map_or(0, |r| r.output).max(
                    self.counted
                        .saturating_add(estimate::count_text(&self.text))
                        .saturating_add(heard),
                ),
                o.audio_output.max(heard),
            ),
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
            audio_output,
            image_output: o.image_output,
            web_search_calls: if self.searches_reported {
                o.web_search_calls
            } else {
                o.web_search_calls.max(self.searches_seen)
            },
        }
    }

    /// Audio output tokens of the audio received (`audio_bytes`), rounded up.
    fn heard(&self) -> i64 {
        i64::try_from(self.audio_bytes.div_ceil(AUDIO_BASE64_PER_TOKEN)).unwrap_or(i64::MAX)
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

    /// Both sides of a whole usage the upstream reported.
    pub(super) fn report(&mut self, u: Usage) {
        let r = Reported::whole(u);
        self.report_sides(&r);
    }

    /// The sides a usage event carries.
    pub(super) fn report_sides(&mut self, r: &Reported) {
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
    pub(super) fn report_output(&mut self, o: Output) {
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
    pub(super) fn report_input(&mut self, i: Input) {
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
    pub(super) fn note_tier(&mut self, data: &str) {
        if self.served_tier.is_none() {
            self.served_tier = tier::priced_apart_in(data);
        }
    }
}

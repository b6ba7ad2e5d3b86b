//! An OpenAI upstream's chunks: their accounting (the choices they start and finish, their
//! text, their usage), and their way to an OpenAI client — as they came but for what is no
//! part of the answer, with a usage chunk of the gateway's where the last one it was told
//! says other than it is charged.

use bytes::Bytes;
use serde_json::{json, Value};

use super::framing::frame;
use super::shape::{self, Corrupt};
use super::StreamConverter;
use crate::upstream::providers::formats::openai_chat::{
    self,
    stream::{read_event, OpenAiEvent},
};
use crate::usage::Usage;

/// What an OpenAI usage chunk tells a client: the input, its cached part, the output.
pub(super) type Told = (i64, i64, i64);

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

impl StreamConverter {
    /// Accounting of an OpenAI chunk: the text it carries (counted when no usage comes)
    /// and its usage.
    pub(super) fn note_openai_chunk(&mut self, c: &shape::Chunk) {
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
                t.thinking().for_each(|t| self.note_text(t));
            }
            if let Some(a) = &d.audio {
                if let Some(t) = &a.transcript {
                    self.note_text(t);
                }
                self.audio_bytes = self
                    .audio_bytes
                    .saturating_add(a.data.unwrap_or_default().0);
            }
            for t in d
                .function_call
                .iter()
                .flat_map(|f| [&f.name, &f.arguments])
                .flatten()
            {
                self.note_text(t);
            }
            if let Some(t) = &d.refusal {
                self.note_text(t);
            }
            // Reasoning is output the upstream bills (see `shape::Delta`): the longer of its
            // two names, once, as some vLLM versions send both (s27 diff attack F4) and an
            // empty one may stand beside the other (late attack L4).
            let reasoning = [&d.reasoning_content, &d.reasoning]
                .into_iter()
                .flatten()
                .max_by_key(|t| t.len());
            if let Some(t) = reasoning {
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
    pub(super) fn openai_done(&mut self, out: &mut Vec<Bytes>) {
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

    pub(super) fn openai_to_openai(
        &mut self,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
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
            OpenAiEvent::Error { error } => {
                self.end_by_the_upstream(openai_chat::stream::fault(&error));
                // The error alone, in OpenAI's shape (TGI's text form reshaped), so the
                // client's SDK reads its message and code.
                out.push(frame(None, &error.to_string()));
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
}

//! Streams across formats: the upstream format's reader turns each event into the internal
//! form's events, the client format's writer writes those; and the accounting of a format
//! read only through the internal form.

use bytes::Bytes;

use super::from_anthropic;
use super::{Corrupt, StreamConverter};
use crate::upstream::providers::canonical::{self, Event, Reported};
use crate::upstream::providers::formats::openai_chat::stream::{read_event, OpenAiEvent};
use crate::upstream::providers::formats::responses::adapter as responses_adapter;
use crate::upstream::providers::formats::{anthropic, bedrock, gemini, openai_chat};

/// The upstream format's reader (used across formats only).
pub(super) enum Reader {
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
pub(super) enum Writer {
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
            Writer::OpenAiChat(_) => 0,
            Writer::Anthropic(w) => w.held_bytes(),
            Writer::Responses(w) => w.held_bytes(),
        }
    }
}

impl StreamConverter {
    /// Bytes held for the client across formats (calls waiting for their names, blocks
    /// waiting behind a live one, a Responses client's answer kept for its response object).
    pub(super) fn held_bytes(&self) -> usize {
        let reader = match &self.reader {
            Reader::OpenAiChat(r) => r.held_bytes(),
            Reader::Anthropic(_) | Reader::Gemini(_) | Reader::Bedrock(_) => 0,
        };
        reader + self.writer.held_bytes()
    }

    /// An upstream event through the internal form: read (and accounted) by the upstream
    /// format's reader, written by the client format's writer.
    pub(super) fn across(
        &mut self,
        name: &str,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
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
                        OpenAiEvent::Error { error, .. } => {
                            self.fault = openai_chat::stream::fault(&error);
                            r.error(&error, &mut events);
                        }
                    }
                }
            }
            Reader::Anthropic(r) => {
                let e = from_anthropic::read_event(data, finished)?;
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
    /// finish noted, a usage event sets the sides it reports — zeros too (input first,
    /// output last, or all at once) — and an error event ends the stream with the fault its
    /// kind names (`ErrorKind::fault`), when its provider's name for it (`code`: Google's
    /// status, Bedrock's exception type) is one its reader knows (`names_a_fault`).
    pub(super) fn note_event(&mut self, e: &Event) {
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
            // The upstream's own error event ends the stream, and judges its key by the
            // fault its kind names (s28 diff attack F2: it named none, and a Gemini or Bedrock
            // key failing every stream after its 200 was neither rested nor opened).
            // An error of a name the reader does not know is no fault of the upstream's (s28
            // late attack F7: its fallback kind, a server error, opened the key).
            Event::Error(e) => self.end_by_the_upstream(
                e.kind
                    .fault()
                    .filter(|_| e.code.as_deref().is_some_and(names_a_fault)),
            ),
            _ => {}
        }
    }

    /// The accounted usage in the internal form.
    fn accounted(&self) -> canonical::Usage {
        self.usage()
    }

    pub(super) fn forward(&mut self, e: &Event, out: &mut Vec<Bytes>) {
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
            Event::ToolCallStart { .. } => self.called = true,
            // Sticky: a later finish (one choice across formats) does not mend an earlier cut.
            Event::Finish(f) => self.cut |= !f.ended_whole(self.called),
            _ => {}
        }
        self.writer.write(e, out);
    }
}

/// Whether an error's provider name (`ErrorInfo::code`) names a fault of the upstream's
/// own, for the formats read through the internal form: Google's statuses and Bedrock's
/// exception types do not overlap.
fn names_a_fault(code: &str) -> bool {
    gemini::names_a_fault(code) || bedrock::names_a_fault(code)
}

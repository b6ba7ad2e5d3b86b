//! An Anthropic upstream's events: their accounting (the input, the text and thinking, the
//! web searches, the finish and its usage), and their way to an Anthropic client — as they
//! came, but nothing of the answer after its finish.

use bytes::Bytes;

use super::framing::{frame, plain_name};
use super::shape::{self, Body, Corrupt};
use super::StreamConverter;
use crate::upstream::providers::formats::anthropic;

/// An Anthropic event read; a `message_stop` before the finish (`finished`: its
/// `message_delta` came) ends a message cut short — no stop reason, no final usage — and
/// is refused as such (`Corrupt::Unfinished`), not passed on as a complete answer's end.
pub(super) fn read_event(data: &str, finished: bool) -> Result<shape::Event<'_>, Corrupt> {
    let e = shape::anthropic_event(data)?;
    if matches!(e.body, Body::MessageStop) && !finished {
        return Err(Corrupt::Unfinished);
    }
    Ok(e)
}

impl StreamConverter {
    /// Accounting of an Anthropic event.
    pub(super) fn note_anthropic_event(&mut self, e: &shape::Event) {
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
            Body::Error(e) => self.end_by_the_upstream(anthropic::stream::fault(e.kind.as_deref())),
            _ => {}
        }
    }

    /// An Anthropic event passed through, named by its data's `type` (the upstream's SSE
    /// name is not read: see below).
    pub(super) fn anthropic_to_anthropic(
        &mut self,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
        let e = read_event(data, self.finished)?;
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
        // Named by the data's `type`, the name the accounting above went by: a server that
        // sends only `data:` lines has them named `message` by the SSE reader, which every
        // Anthropic SDK drops (s30 streams attack F1), and a name that differs from the
        // type would have the client read another event than the one charged.
        // A type that is no plain name is none the client may read as another event: the
        // upstream's own name could say `content_block_delta` over a body not counted as
        // one (s30 final attack F6).
        let kind = if plain_name(&e.kind) { &e.kind } else { "ping" };
        out.push(frame(Some(kind), data));
        Ok(())
    }
}

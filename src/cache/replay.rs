//! Cached answers are stored whole, in the client's wire format. A streamed request is
//! answered from an entry by replaying it as SSE events (`frames`); a streamed answer is
//! stored by assembling the events the client received back into a whole answer
//! (`Assembler`). So a stream can be served from a non-streamed entry and vice versa.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::error::WireFormat;
use crate::upstream::providers::translate::stream::frame;

/// Text is replayed in pieces of about this many characters.
const PIECE: usize = 24;

fn pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in text.chars() {
        cur.push(ch);
        if cur.len() >= PIECE && ch == ' ' {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The SSE events of a stored answer, as the client's format streams them.
pub fn frames(format: WireFormat, answer: &Value, include_usage: bool) -> Vec<Bytes> {
    match format {
        WireFormat::OpenAi => openai_frames(answer, include_usage),
        WireFormat::Anthropic => anthropic_frames(answer),
    }
}

fn openai_frames(a: &Value, include_usage: bool) -> Vec<Bytes> {
    let chunk = |delta: Value, finish: Value| {
        frame(None, &json!({"id": a["id"], "object": "chat.completion.chunk", "created": a["created"], "model": a["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}).to_string())
    };
    let msg = &a["choices"][0]["message"];
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(text) = msg["content"].as_str() {
        for p in pieces(text) {
            out.push(chunk(json!({"content": p}), Value::Null));
        }
    }
    if let Some(text) = msg["refusal"].as_str() {
        for p in pieces(text) {
            out.push(chunk(json!({"refusal": p}), Value::Null));
        }
    }
    for (i, tc) in msg["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.push(chunk(json!({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
            "function": {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}}]}), Value::Null));
    }
    out.push(chunk(json!({}), a["choices"][0]["finish_reason"].clone()));
    if include_usage {
        out.push(frame(
            None,
            &json!({"id": a["id"], "object": "chat.completion.chunk", "created": a["created"],
            "model": a["model"], "choices": [], "usage": a["usage"]})
            .to_string(),
        ));
    }
    out.push(frame(None, "[DONE]"));
    out
}

fn anthropic_frames(a: &Value) -> Vec<Bytes> {
    let ev = |name: &str, v: Value| frame(Some(name), &v.to_string());
    // Built without indexing by assignment, which panics on a value that is no object:
    // only whole answers are stored (`shape::whole`), and still nothing here may panic.
    let mut start = a.as_object().cloned().unwrap_or_default();
    start.insert("content".into(), json!([]));
    start.insert("stop_reason".into(), Value::Null);
    if let Some(u) = start.get_mut("usage").and_then(Value::as_object_mut) {
        u.insert("output_tokens".into(), json!(0));
    }
    let mut out = vec![ev(
        "message_start",
        json!({"type": "message_start", "message": start}),
    )];
    for (i, b) in a["content"].as_array().into_iter().flatten().enumerate() {
        match b["type"].as_str() {
            Some("text") => {
                out.push(ev("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})));
                for p in pieces(b["text"].as_str().unwrap_or("")) {
                    out.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": p}})));
                }
            }
            Some("tool_use") => {
                out.push(ev("content_block_start", json!({"type": "content_block_start", "index": i,
                    "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}})));
                out.push(ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": b["input"].to_string()}}),
                ));
            }
            _ => continue,
        }
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        ));
    }
    out.push(ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": a["stop_reason"], "stop_sequence": a["stop_sequence"]},
        "usage": a["usage"]})));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    out
}

/// Rebuilds a whole answer from the SSE frames a client received.
pub struct Assembler {
    format: WireFormat,
    answer: Map<String, Value>,
    text: String,
    refusal: String,
    tools: Vec<(String, String, String)>,
    blocks: Vec<Value>,
    /// An Anthropic `message_start` came: a second one, or a block before the first, is
    /// a stream the SDKs read otherwise than it is rebuilt.
    started: bool,
    partial: String,
    complete: bool,
    /// False once a frame came that the answer cannot be rebuilt from faithfully: it is
    /// then not cached.
    faithful: bool,
    /// The most it assembles (the cache's largest entry): past it, the answer is let go of
    /// and not cached, so a long stream holds no copy of itself.
    limit: usize,
    /// Bytes taken so far.
    taken: usize,
}

/// An SSE frame's data: its `data:` lines joined with `\n`, as a client's parser joins
/// them (`stream::frame` writes data of several lines so). Borrowed for the usual one line.
fn event_data(text: &str) -> Option<Cow<'_, str>> {
    let mut lines = text.lines().filter_map(|l| l.strip_prefix("data: "));
    let first = lines.next()?;
    Some(match lines.next() {
        None => Cow::Borrowed(first),
        Some(second) => {
            let mut joined = [first, second].join("\n");
            for line in lines {
                joined.push('\n');
                joined.push_str(line);
            }
            Cow::Owned(joined)
        }
    })
}

impl Assembler {
    pub fn new(format: WireFormat, limit: usize) -> Self {
        Self {
            limit,
            taken: 0,
            format,
            answer: Map::new(),
            text: String::new(),
            refusal: String::new(),
            tools: Vec::new(),
            blocks: Vec::new(),
            started: false,
            partial: String::new(),
            complete: false,
            faithful: true,
        }
    }

    pub fn push(&mut self, frame: &[u8]) {
        if self.taken > self.limit {
            return;
        }
        self.taken += frame.len();
        if self.taken > self.limit {
            // Too large to cache: nothing of it is kept.
            *self = Self::new(self.format, self.limit);
            self.taken = usize::MAX;
            return;
        }
        let Ok(text) = std::str::from_utf8(frame) else {
            return;
        };
        let Some(data) = event_data(text) else {
            return;
        };
        if data == "[DONE]" {
            self.complete = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            return;
        };
        match self.format {
            WireFormat::OpenAi => self.push_openai(&v),
            WireFormat::Anthropic => self.push_anthropic(&v),
        }
    }

    fn push_openai(&mut self, v: &Value) {
        for k in ["id", "created", "model"] {
            self.answer.entry(k).or_insert_with(|| v[k].clone());
        }
        if !v["usage"].is_null() {
            self.answer.insert("usage".into(), v["usage"].clone());
        }
        // One choice, numbered 0, is what is rebuilt: another (a choice not asked for, or one
        // numbered otherwise) would be appended to it — the client's SDK keeps choices
        // apart by their index (s31 cache attack F4).
        let choices = v["choices"].as_array().map_or(0, Vec::len);
        let c = &v["choices"][0];
        if choices > 1 || !(c["index"].is_null() || c["index"] == 0) {
            self.faithful = false;
        }
        // Log probabilities, audio and annotations are not rebuilt: an answer that had
        // them is not stored rather than stored without them.
        // `content` only as text: parts (Mistral's, thinking among them) are not rebuilt,
        // and an answer stored without them would be served empty (s26 diff attack #1).
        let kept = |(k, d): (&String, &Value)| {
            d.is_null()
                || matches!(k.as_str(), "role" | "refusal" | "tool_calls")
                || (k == "content" && d.is_string())
        };
        let delta = c["delta"].as_object().into_iter().flatten();
        if !c["logprobs"].is_null() || !delta.into_iter().all(kept) {
            self.faithful = false;
        }
        if let Some(t) = c["delta"]["content"].as_str() {
            self.text.push_str(t);
        }
        if let Some(t) = c["delta"]["refusal"].as_str() {
            self.refusal.push_str(t);
        }
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            // Calls are numbered from 0 in order: an index past the next one is not an
            // answer this can rebuild (nor grow a list to).
            let i = tc["index"].as_u64().unwrap_or(0);
            let Ok(i) = usize::try_from(i) else {
                self.faithful = false;
                return;
            };
            if i == self.tools.len() {
                self.tools.push(Default::default());
            }
            // Only `function` calls are rebuilt: a `custom` one became a nameless
            // `function` call (s27 cache attack F4).
            let typed = tc["type"].is_null() || tc["type"] == "function";
            if !typed || !tc["custom"].is_null() {
                self.faithful = false;
                return;
            }
            let Some(slot) = self.tools.get_mut(i) else {
                self.faithful = false;
                return;
            };
            if let Some(id) = tc["id"].as_str() {
                slot.0 = id.to_string();
            }
            if let Some(n) = tc["function"]["name"].as_str() {
                slot.1.push_str(n);
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                slot.2.push_str(a);
            }
        }
        if !c["finish_reason"].is_null() {
            self.answer
                .insert("finish_reason".into(), c["finish_reason"].clone());
        }
    }

    /// Whether an Anthropic event's `index` is `n`.
    fn at(&self, v: &Value, n: usize) -> bool {
        v["index"].as_u64().and_then(|i| usize::try_from(i).ok()) == Some(n)
    }

    /// Whether an Anthropic event's `index` is the block last started.
    fn at_open(&self, v: &Value) -> bool {
        self.blocks
            .len()
            .checked_sub(1)
            .is_some_and(|n| self.at(v, n))
    }

    fn push_anthropic(&mut self, v: &Value) {
        match v["type"].as_str() {
            Some("message_start") => {
                // The SDKs keep the first start's head (Python) or throw (TypeScript);
                // the rebuilt answer would take the last one's (s32 diff attack F3).
                if std::mem::replace(&mut self.started, true) {
                    self.faithful = false;
                }
                if let Some(m) = v["message"].as_object() {
                    // The answer is rebuilt from the blocks alone: content opened here
                    // is not in it.
                    if m.get("content")
                        .is_some_and(|c| !c.is_null() && *c != json!([]))
                    {
                        self.faithful = false;
                    }
                    self.answer = m.clone();
                }
            }
            Some("content_block_start") => {
                // Only the blocks a replay streams are rebuilt (`shape::whole`): thinking,
                // server tools and citations make the answer one that is not stored.
                let b = &v["content_block"];
                let cited = !b["citations"].is_null() && b["citations"] != json!([]);
                if !matches!(b["type"].as_str(), Some("text" | "tool_use"))
                    || cited
                    || !self.started
                {
                    self.faithful = false;
                }
                // Blocks are rebuilt in the order they start, each delta into the open one:
                // numbered otherwise, a delta would land in another block than the
                // client's (s31 cache attack F4).
                if !self.at(v, self.blocks.len()) {
                    self.faithful = false;
                }
                self.blocks.push(v["content_block"].clone());
                self.partial.clear();
            }
            Some("content_block_delta") => {
                // A delta of the open block's kind: text into a tool call was written into
                // the stored call, which the client never showed (s31 diff attack F4).
                let open = self.blocks.last().map(|b| &b["type"]);
                let fits = match v["delta"]["type"].as_str() {
                    Some("text_delta") => open.is_some_and(|t| t == "text"),
                    Some("input_json_delta") => open.is_some_and(|t| t == "tool_use"),
                    _ => false,
                };
                if !fits || !self.at_open(v) {
                    self.faithful = false;
                }
                let block = self.blocks.last_mut().and_then(Value::as_object_mut);
                if let (Some(b), Some(t)) = (block, v["delta"]["text"].as_str()) {
                    // Appended in place: rebuilding the text for every delta is quadratic.
                    match b.get_mut("text") {
                        Some(Value::String(s)) => s.push_str(t),
                        _ => {
                            b.insert("text".into(), json!(t));
                        }
                    }
                }
                if let Some(p) = v["delta"]["partial_json"].as_str() {
                    self.partial.push_str(p);
                }
            }
            Some("content_block_stop") => {
                if !self.at_open(v) {
                    self.faithful = false;
                }
                if let Some(b) = self.blocks.last_mut().filter(|b| b["type"] == "tool_use") {
                    // No input streamed is the empty object the call started as. Input that
                    // is not a JSON object (cut at the cap, or garbled) is not rebuilt: as
                    // `{}` it was a tidy call with no arguments, which an agent runs (s27
                    // cache attack F2).
                    let input = if self.partial.is_empty() {
                        Some(json!({}))
                    } else {
                        serde_json::from_str::<Value>(&self.partial)
                            .ok()
                            .filter(Value::is_object)
                    };
                    match input {
                        Some(input) => b["input"] = input,
                        None => self.faithful = false,
                    }
                }
            }
            Some("message_delta") => {
                self.answer
                    .insert("stop_reason".into(), v["delta"]["stop_reason"].clone());
                self.answer
                    .insert("stop_sequence".into(), v["delta"]["stop_sequence"].clone());
                // The final usage is the actual one (a translated stream's message_start
                // holds the estimate): every figure it carries replaces the start's.
                if let (Some(figures), Some(u)) = (
                    v["usage"].as_object(),
                    self.answer.get_mut("usage").and_then(Value::as_object_mut),
                ) {
                    for (k, n) in figures.iter().filter(|(_, n)| n.is_u64()) {
                        u.insert(k.clone(), n.clone());
                    }
                }
            }
            Some("message_stop") => self.complete = true,
            _ => {}
        }
    }

    /// The whole answer, if the stream completed. `charged` is the usage the stream was
    /// charged (input, output): an OpenAI client that did not ask for the usage chunk never
    /// received it, and a whole answer carries its usage.
    pub fn finish(self, charged: Option<(i64, i64)>) -> Option<Value> {
        if !self.complete || !self.faithful || self.taken > self.limit {
            return None;
        }
        match self.format {
            WireFormat::OpenAi => {
                let mut a = self.answer;
                if let (false, Some((input, output))) = (a.contains_key("usage"), charged) {
                    a.insert(
                        "usage".into(),
                        json!({"prompt_tokens": input, "completion_tokens": output,
                        "total_tokens": input.saturating_add(output)}),
                    );
                }
                // None came: not an answer that ended (`shape::whole` refuses `null`).
                let finish = a.remove("finish_reason").unwrap_or(Value::Null);
                // No text beside tool calls or a refusal is `null`, as OpenAI sends it.
                let no_text =
                    self.text.is_empty() && !(self.tools.is_empty() && self.refusal.is_empty());
                let mut message = json!({"role": "assistant", "content": if no_text { Value::Null } else { json!(self.text) }});
                if !self.refusal.is_empty() {
                    message["refusal"] = json!(self.refusal);
                }
                if !self.tools.is_empty() {
                    message["tool_calls"] = self
                        .tools
                        .into_iter()
                        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect();
                }
                a.insert("object".into(), json!("chat.completion"));
                a.insert("choices".into(), json!([{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}]));
                Some(Value::Object(a))
            }
            WireFormat::Anthropic => {
                let mut a = self.answer;
                a.insert("content".into(), Value::Array(self.blocks));
                Some(Value::Object(a))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_answer_replays_and_reassembles_to_itself() {
        let openai = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "The EGR valve is stuck open, replace it soon."}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}});
        let anthropic = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"vin": "X"}}],
            "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 9}});
        for (format, answer) in [
            (WireFormat::OpenAi, openai),
            (WireFormat::Anthropic, anthropic),
        ] {
            let mut asm = Assembler::new(format, 1 << 20);
            for f in frames(format, &answer, true) {
                asm.push(&f);
            }
            assert_eq!(asm.finish(None).unwrap(), answer);
        }
    }

    /// Bodies an upstream may send with a 2xx that are no answer (attack cache #3): their
    /// replay must never panic, whatever was stored.
    fn no_answers() -> Vec<Value> {
        vec![
            json!([]),
            json!("ok"),
            json!(5),
            json!(null),
            json!({"usage": 5}),
            json!({"type": "message", "content": [], "usage": 5}),
            json!({"type": "message", "content": [5, "x", {"type": 3}], "usage": {}}),
            json!({"choices": 5}),
            json!({"choices": [5], "usage": []}),
        ]
    }

    #[test]
    fn a_body_that_is_no_answer_replays_without_a_panic() {
        for a in no_answers() {
            for format in [WireFormat::OpenAi, WireFormat::Anthropic] {
                let _ = frames(format, &a, true);
            }
        }
    }

    #[test]
    fn an_assembler_fed_blocks_that_are_no_objects_keeps_nothing_and_does_not_panic() {
        let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
        for data in [
            json!({"type": "message_start", "message": {"type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": "x"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 1}}),
            json!({"type": "message_stop"}),
        ] {
            asm.push(&frame(None, &data.to_string()));
        }
        assert_eq!(asm.finish(None), None);
    }

    /// A refusal is a refusal when replayed and when rebuilt from a stream, never empty
    /// content (attack cache #5).
    #[test]
    fn a_refusal_replays_and_reassembles_to_itself() {
        let refusal = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": "I can't help with that."}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}});
        let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
        for f in frames(WireFormat::OpenAi, &refusal, true) {
            asm.push(&f);
        }
        assert_eq!(asm.finish(None).unwrap(), refusal);
    }

    /// A chunk the upstream sent over several `data:` lines is framed so to the client
    /// (`stream::frame`) and rebuilt whole: its text is part of the stored answer.
    #[test]
    fn a_chunk_framed_over_several_data_lines_is_rebuilt() {
        let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
        for data in [
            "{\"id\": \"c\", \"object\": \"chat.completion.chunk\", \"created\": 1, \"model\": \"m\",\n\"choices\": [{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"Hi\"}, \"finish_reason\": null}]}",
            "{\"id\": \"c\", \"object\": \"chat.completion.chunk\", \"created\": 1, \"model\": \"m\", \"choices\": [{\"index\": 0, \"delta\": {}, \"finish_reason\": \"stop\"}],\n\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 1, \"total_tokens\": 4}}",
            "[DONE]",
        ] {
            asm.push(&frame(None, data));
        }
        let answer = asm.finish(None).unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "Hi", "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 1, "{answer}");
    }

    /// A stream whose chunks number their choices otherwise than one choice 0, or whose
    /// Anthropic deltas go to another block than the one open, is not stored: the client
    /// kept them apart by index, the rebuilt answer would join them (s31 cache attack F4).
    #[test]
    fn a_stream_numbered_otherwise_than_it_is_rebuilt_is_not_stored() {
        let chunk = |index: Value, content: &str, finish: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": index, "delta": {"content": content}, "finish_reason": finish}]})
        };
        let openai = |second: Value| {
            let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
            for data in [
                chunk(json!(0), "Paris", Value::Null),
                second,
                chunk(json!(0), "", json!("stop")),
            ] {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.push(&frame(None, "[DONE]"));
            asm.finish(None)
        };
        assert!(openai(chunk(json!(0), " is in France", Value::Null)).is_some());
        assert_eq!(openai(chunk(json!(1), " is in Texas", Value::Null)), None);
        let two = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": " is"}, "finish_reason": null},
                        {"index": 1, "delta": {"content": " in Texas"}, "finish_reason": null}]});
        assert_eq!(openai(two), None);
        let anthropic = |events: &[Value]| {
            let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
            let start = json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                "model": "c", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 1, "output_tokens": 0}}});
            let end = [
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
                json!({"type": "message_stop"}),
            ];
            for data in std::iter::once(&start).chain(events).chain(&end) {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.finish(None)
        };
        let text_start = |i: u64| json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}});
        let delta = |i: u64, t: &str| json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}});
        let stop = |i: u64| json!({"type": "content_block_stop", "index": i});
        let tool = json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}});
        assert!(anthropic(&[text_start(0), delta(0, "Hi"), stop(0)]).is_some());
        for events in [
            vec![text_start(1), delta(1, "Hi"), stop(1)],
            vec![
                text_start(0),
                delta(0, "Hi"),
                tool.clone(),
                delta(0, "late"),
                stop(1),
                stop(0),
            ],
            vec![text_start(0), delta(0, "Hi"), stop(1)],
            vec![
                text_start(0),
                json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}),
                stop(0),
            ],
            vec![
                text_start(0),
                delta(0, "Hi"),
                stop(0),
                tool.clone(),
                delta(1, "into the call"),
                stop(1),
            ],
        ] {
            assert_eq!(anthropic(&events), None, "{events:?}");
        }
    }

    /// Content an Anthropic `message_start` carries is shown by the SDKs before the blocks
    /// that follow it (they append to the snapshot), but a rebuilt answer holds only the
    /// blocks: such a stream is not stored, or the next asker got another answer than the
    /// one proxied (s31 stop attack C3).
    #[test]
    fn content_in_a_message_start_is_not_stored() {
        let rebuilt = |content: Value| {
            let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
            for data in [
                json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                    "model": "c", "content": content, "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 1, "output_tokens": 0}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " Refund denied."}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
                json!({"type": "message_stop"}),
            ] {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.finish(None)
        };
        assert!(rebuilt(json!([])).is_some());
        assert!(rebuilt(Value::Null).is_some());
        assert_eq!(
            rebuilt(json!([{"type": "text", "text": "Refund approved."}])),
            None
        );
    }

    /// A second `message_start`, or a block before the first: the SDKs keep the first
    /// start's head or throw, the rebuilt answer took the last one's — not stored (s32
    /// diff attack F3).
    #[test]
    fn a_stream_started_twice_or_not_at_all_is_not_stored() {
        let start = |id: &str, input: u64| {
            json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
                "model": "c", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": 0}}})
        };
        let block = [
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_stop", "index": 0}),
        ];
        let end = [
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
            json!({"type": "message_stop"}),
        ];
        let rebuilt = |events: Vec<Value>| {
            let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
            for data in events.iter().chain(&end) {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.finish(None)
        };
        let once: Vec<Value> = std::iter::once(start("m1", 10))
            .chain(block.clone())
            .collect();
        assert!(rebuilt(once).is_some());
        let twice: Vec<Value> = std::iter::once(start("m1", 10))
            .chain(block.clone())
            .chain([start("m2", 9999)])
            .collect();
        assert_eq!(rebuilt(twice), None);
        let late: Vec<Value> = block.iter().cloned().chain([start("m1", 10)]).collect();
        assert_eq!(rebuilt(late), None);
        assert_eq!(rebuilt(block.to_vec()), None);
    }

    /// What a rebuilt answer cannot hold faithfully makes it not stored: log probabilities.
    #[test]
    fn a_stream_with_logprobs_is_not_rebuilt() {
        let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
        for data in [
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"},
                "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]}, "finish_reason": null}]}),
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}),
        ] {
            asm.push(&frame(None, &data.to_string()));
        }
        asm.push(&frame(None, "[DONE]"));
        assert_eq!(asm.finish(None), None);
    }

    /// A chunk whose `content` is an array of parts (Mistral's, thinking among them) is not
    /// rebuilt: the stream is not stored, where it was stored with empty content and served
    /// so to the next asker (s26 diff attack #1).
    #[test]
    fn a_chunk_whose_content_is_parts_is_not_stored() {
        let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
        for data in [
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Fuses first."}]}]}, "finish_reason": null}]}),
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "Check fuse F12."}]}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}}),
        ] {
            asm.push(&frame(None, &data.to_string()));
        }
        asm.push(&frame(None, "[DONE]"));
        assert_eq!(asm.finish(None), None);
    }

    /// A stream of blocks the replay does not rebuild (thinking and its signature, server
    /// tools, citations) is not stored rather than stored without them (attack cache #4).
    #[test]
    fn an_anthropic_stream_of_blocks_not_rebuilt_is_not_stored() {
        let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 0}}});
        let end = [
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 5}}),
            json!({"type": "message_stop"}),
        ];
        let thinking = [
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm."}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            json!({"type": "content_block_stop", "index": 0}),
        ];
        let cited = [
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": {"type": "char_location", "cited_text": "x"}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Yes."}}),
            json!({"type": "content_block_stop", "index": 0}),
        ];
        for blocks in [&thinking[..], &cited[..]] {
            let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
            for data in std::iter::once(&start).chain(blocks).chain(&end) {
                asm.push(&frame(None, &data.to_string()));
            }
            assert_eq!(asm.finish(None), None, "{blocks:?}");
        }
    }

    /// A tool call whose streamed input is not a JSON object — cut at the cap, or garbled
    /// by the upstream — was rebuilt as `input: {}` and served so: a tidy call with no
    /// arguments, which an agent runs (s27 cache attack F2). It is not stored; a call
    /// streamed with no input at all is the empty object it started as.
    #[test]
    fn a_tool_call_whose_input_is_cut_is_not_stored() {
        let assemble = |partials: &[&str]| {
            let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 0}}});
            let mut events = vec![
                start,
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
            ];
            events.extend(partials.iter().map(|p| {
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": p}})
            }));
            events.extend([
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 5}}),
                json!({"type": "message_stop"}),
            ]);
            let mut asm = Assembler::new(WireFormat::Anthropic, 1 << 20);
            for data in events {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.finish(None)
        };
        for cut in [
            &["{\"city\": \"Par"][..],
            &["[1]"],
            &["\"Paris\""],
            &["{\"a\": 1}x"],
        ] {
            assert_eq!(assemble(cut), None, "{cut:?}");
        }
        let whole = assemble(&["{\"city\": ", "\"Paris\"}"]).unwrap();
        assert_eq!(whole["content"][0]["input"], json!({"city": "Paris"}));
        let none = assemble(&[]).unwrap();
        assert_eq!(none["content"][0]["input"], json!({}));
        let empty = assemble(&[""]).unwrap();
        assert_eq!(empty["content"][0]["input"], json!({}));
    }

    /// A streamed OpenAI `custom` tool call was rebuilt as a `function` call with an empty
    /// name and arguments, and served so to whole requests too (s27 cache attack F4): a
    /// call of a type the rebuild does not reproduce makes the stream not stored.
    #[test]
    fn a_custom_tool_call_is_not_stored() {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
                "usage": null})
        };
        for call in [
            json!({"index": 0, "id": "call_1", "type": "custom", "custom": {"name": "exec", "input": "ls"}}),
            json!({"index": 0, "id": "call_1", "custom": {"name": "exec", "input": "ls"}}),
        ] {
            let mut asm = Assembler::new(WireFormat::OpenAi, 1 << 20);
            for data in [
                chunk(json!({"role": "assistant", "content": null}), Value::Null),
                chunk(json!({"tool_calls": [call.clone()]}), Value::Null),
                chunk(json!({}), json!("tool_calls")),
                json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
            ] {
                asm.push(&frame(None, &data.to_string()));
            }
            asm.push(&frame(None, "[DONE]"));
            assert_eq!(asm.finish(None), None, "{call}");
        }
    }

    #[test]
    fn an_answer_larger_than_the_limit_is_let_go_of_and_not_cached() {
        let long = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "word ".repeat(10_000)}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}});
        let mut asm = Assembler::new(WireFormat::OpenAi, 20_000);
        for f in frames(WireFormat::OpenAi, &long, true) {
            asm.push(&f);
            assert!(asm.text.len() <= 20_000, "it keeps no more than its limit");
        }
        assert_eq!(asm.finish(None), None);
    }
}

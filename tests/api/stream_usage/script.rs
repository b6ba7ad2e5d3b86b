//! The scripted streams of the upstream formats: pieces (text, a running usage, the finish,
//! a usage of its own, the end, another choice's text) written in each format's own events.

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use super::{Up, TEXT};

/// A piece of a scripted stream, written in each format's own events.
#[derive(Debug, Clone, Copy)]
pub(super) enum Piece {
    Text,
    /// A text delta carrying a running usage (vLLM's continuous usage, Gemini's every
    /// chunk; Anthropic's `message_start` input; Bedrock has none).
    RunningText(i64, i64),
    /// The finish, with the final usage on it where the format can put it there.
    Finish(Option<(i64, i64)>),
    /// A usage in an event of its own (OpenAI's usage chunk, Gemini's usage-only chunk,
    /// Bedrock's `metadata`; Anthropic has none after `message_delta`).
    Usage(i64, i64),
    /// The format's end-of-stream event (`[DONE]`, `message_stop`; none in Gemini and
    /// Bedrock).
    End,
    /// Text of choice 1 (OpenAI's `index` 1; only OpenAI): of an `n` = 2 answer
    /// (`stream_n`), or of a choice the client did not ask for.
    OtherChoiceText,
    /// Choice 1's finish (as `OtherChoiceText`).
    OtherChoiceFinish,
    /// A usage on a chunk whose only choice is choice 0 with nothing in it (only OpenAI):
    /// the LiteLLM proxy's `include_usage` chunk
    /// (`{"index": 0, "delta": {}, "finish_reason": null}`).
    EmptyChoiceUsage(i64, i64),
}

pub(super) fn events(up: Up, pieces: &[Piece]) -> Vec<SseEvent> {
    let mut out = Vec::new();
    let named = |n: &str, v: Value| SseEvent::Named(n.into(), v);
    match up {
        Up::OpenAi => {
            let chunk = |choices: Value, usage: Option<(i64, i64)>| {
                let mut c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": choices});
                if let Some((i, o)) = usage {
                    c["usage"] =
                        json!({"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o});
                }
                SseEvent::Data(c)
            };
            let text = json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]);
            for p in pieces {
                out.push(match *p {
                    Piece::Text => chunk(text.clone(), None),
                    Piece::RunningText(i, o) => chunk(text.clone(), Some((i, o))),
                    Piece::Finish(u) => chunk(
                        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
                        u,
                    ),
                    Piece::Usage(i, o) => chunk(json!([]), Some((i, o))),
                    Piece::End => SseEvent::Data(json!("[DONE]")),
                    Piece::OtherChoiceText => chunk(
                        json!([{"index": 1, "delta": {"content": TEXT}, "finish_reason": null}]),
                        None,
                    ),
                    Piece::OtherChoiceFinish => chunk(
                        json!([{"index": 1, "delta": {}, "finish_reason": "stop"}]),
                        None,
                    ),
                    Piece::EmptyChoiceUsage(i, o) => chunk(
                        json!([{"index": 0, "delta": {}, "finish_reason": null}]),
                        Some((i, o)),
                    ),
                });
            }
        }
        Up::Anthropic => {
            let input = pieces.iter().find_map(|p| match p {
                Piece::RunningText(i, _) => Some(*i),
                _ => None,
            });
            let mut usage = json!({"output_tokens": 1});
            if let Some(i) = input {
                usage["input_tokens"] = json!(i);
            }
            out.push(named(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                    "role": "assistant", "model": "claude", "content": [], "stop_reason": null,
                    "usage": usage}}),
            ));
            out.push(named(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            for p in pieces {
                match *p {
                    Piece::Text | Piece::RunningText(..) => out.push(named(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": TEXT}}),
                    )),
                    Piece::Finish(u) => {
                        out.push(named(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ));
                        let mut d = json!({"type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": null}});
                        if let Some((i, o)) = u {
                            d["usage"] = json!({"input_tokens": i, "output_tokens": o});
                        }
                        out.push(named("message_delta", d));
                    }
                    Piece::Usage(..)
                    | Piece::OtherChoiceText
                    | Piece::OtherChoiceFinish
                    | Piece::EmptyChoiceUsage(..) => {
                        unreachable!(
                            "Anthropic reports no usage after message_delta, has one choice"
                        )
                    }
                    Piece::End => out.push(named("message_stop", json!({"type": "message_stop"}))),
                }
            }
        }
        Up::Gemini => {
            let usage = |i: i64, o: i64| json!({"promptTokenCount": i, "candidatesTokenCount": o, "totalTokenCount": i + o});
            let text = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": TEXT}]}, "index": 0}],
                "responseId": "r1", "modelVersion": "gemini-2.5-flash"});
            for p in pieces {
                match *p {
                    Piece::Text => out.push(SseEvent::Data(text.clone())),
                    Piece::RunningText(i, o) => {
                        let mut t = text.clone();
                        t["usageMetadata"] = usage(i, o);
                        out.push(SseEvent::Data(t));
                    }
                    Piece::Finish(u) => {
                        let mut f = json!({"candidates": [{"content": {"role": "model", "parts": []},
                            "index": 0, "finishReason": "STOP"}], "responseId": "r1"});
                        if let Some((i, o)) = u {
                            f["usageMetadata"] = usage(i, o);
                        }
                        out.push(SseEvent::Data(f));
                    }
                    Piece::Usage(i, o) => out.push(SseEvent::Data(
                        json!({"usageMetadata": usage(i, o), "responseId": "r1"}),
                    )),
                    Piece::End
                    | Piece::OtherChoiceText
                    | Piece::OtherChoiceFinish
                    | Piece::EmptyChoiceUsage(..) => {
                        unreachable!("Gemini has no end-of-stream event; one candidate here")
                    }
                }
            }
        }
        Up::Bedrock => {
            out.push(named("messageStart", json!({"role": "assistant"})));
            for p in pieces {
                match *p {
                    Piece::Text => out.push(named(
                        "contentBlockDelta",
                        json!({"contentBlockIndex": 0, "delta": {"text": TEXT}}),
                    )),
                    Piece::Finish(u) => {
                        assert!(u.is_none(), "Bedrock's usage is its own event");
                        out.push(named("contentBlockStop", json!({"contentBlockIndex": 0})));
                        out.push(named("messageStop", json!({"stopReason": "end_turn"})));
                    }
                    Piece::Usage(i, o) => out.push(named(
                        "metadata",
                        json!({"usage": {"inputTokens": i, "outputTokens": o, "totalTokens": i + o},
                            "metrics": {"latencyMs": 1}}),
                    )),
                    Piece::RunningText(..)
                    | Piece::End
                    | Piece::OtherChoiceText
                    | Piece::OtherChoiceFinish
                    | Piece::EmptyChoiceUsage(..) => {
                        unreachable!("Bedrock has no running usage, no end event, one choice")
                    }
                }
            }
        }
    }
    out
}

/// The usual stream of `up` with this final usage, where the format puts it.
pub(super) fn usual(up: Up, usage: Option<(i64, i64)>) -> Vec<Piece> {
    match (up, usage) {
        (Up::OpenAi, Some((i, o))) => vec![
            Piece::Text,
            Piece::Finish(None),
            Piece::Usage(i, o),
            Piece::End,
        ],
        (Up::OpenAi | Up::Anthropic, u) => vec![Piece::Text, Piece::Finish(u), Piece::End],
        (Up::Gemini, u) => vec![Piece::Text, Piece::Finish(u)],
        (Up::Bedrock, Some((i, o))) => vec![Piece::Text, Piece::Finish(None), Piece::Usage(i, o)],
        (Up::Bedrock, None) => unreachable!("a Bedrock stream without its usage is cut"),
    }
}

pub(super) fn scripted(up: Up, pieces: &[Piece]) -> Script {
    Script {
        events: Some(events(up, pieces)),
        ..Script::default()
    }
}

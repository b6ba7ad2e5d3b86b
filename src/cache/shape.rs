//! What may be stored in the cache: a well-formed, complete answer in the client's wire
//! format. An upstream's 2xx body is relayed as it came, but a body the gateway cannot
//! read as an answer would, once stored, be served to every later request of its key
//! until it expires — so it is never stored, and an entry read back that is not one is a
//! miss.

use serde_json::Value;

use crate::error::WireFormat;

/// Whether `a` is a whole answer in `format` (what `replay::frames` replays faithfully).
pub fn whole(format: WireFormat, a: &Value) -> bool {
    match format {
        WireFormat::OpenAi => whole_openai(a),
        WireFormat::Anthropic => whole_anthropic(a),
    }
}

fn string(v: &Value, k: &str) -> bool {
    v.get(k).is_some_and(Value::is_string)
}

/// A `chat.completion` of one choice with a message, a finish reason that marks it complete
/// (s27 cache attack F3) and usage figures,
/// holding nothing a replay as a stream (or a rebuild from one) would drop: no log
/// probabilities, audio or annotations — an entry answers whole and streamed requests
/// alike, so a hit may not differ in kind from the upstream's answer.
fn whole_openai(a: &Value) -> bool {
    let Some([choice]) = a
        .get("choices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    else {
        return false;
    };
    let Some(message) = choice.get("message").and_then(Value::as_object) else {
        return false;
    };
    let usage = a.get("usage").filter(|u| {
        u.get("prompt_tokens").is_some_and(Value::is_u64)
            && u.get("completion_tokens").is_some_and(Value::is_u64)
    });
    let replayed = message.iter().all(|(k, v)| match k.as_str() {
        "role" => true,
        "content" | "refusal" => v.is_string() || v.is_null(),
        // `null` as vLLM and other servers send it for none (s24 final attack: such an
        // answer was never stored).
        "tool_calls" => v.is_null() || v.as_array().is_some_and(|t| t.iter().all(function_call)),
        "annotations" => v.is_null() || v.as_array().is_some_and(Vec::is_empty),
        _ => v.is_null(),
    });
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let ended = match choice.get("finish_reason").and_then(Value::as_str) {
        // TGI before 2.2.1 ends an answer with `eos_token` or `stop_sequence` (s27 diff
        // attack F3: its answers were no longer stored).
        Some("stop" | "tool_calls" | "function_call" | "eos_token" | "stop_sequence") => true,
        // Cut at the cap the key holds: that request's answer — but not a tool call,
        // whose arguments the cap may have cut mid-JSON.
        Some("length") => !calls,
        // `content_filter` (cut where the filter fired) and anything else.
        _ => false,
    };
    a.get("object").and_then(Value::as_str) == Some("chat.completion")
        && ended
        && choice.get("logprobs").is_none_or(Value::is_null)
        && message.contains_key("content")
        && replayed
        && usage.is_some()
}

/// A tool call a replay reproduces and a rebuild restores exactly: a `function` call (the
/// `type` may be absent) with its id, a name and its arguments as text. Any other — an
/// OpenAI `custom` call — was replayed as a `function` call with no name (s27 cache
/// attack F4).
fn function_call(c: &Value) -> bool {
    let Some(c) = c.as_object() else {
        return false;
    };
    let function = c.get("function").is_some_and(|f| {
        f.get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
            && string(f, "arguments")
    });
    function
        && c.get("id").is_some_and(Value::is_string)
        && c.iter().all(|(k, v)| match k.as_str() {
            "id" | "function" | "index" => true,
            "type" => v == "function",
            _ => v.is_null(),
        })
}

/// An assistant `message` with a stop reason that marks it complete, blocks a replay
/// rebuilds, and usage figures.
fn whole_anthropic(a: &Value) -> bool {
    let Some(content) = a.get("content").and_then(Value::as_array) else {
        return false;
    };
    let usage = a.get("usage").filter(|u| {
        u.get("input_tokens").is_some_and(Value::is_u64)
            && u.get("output_tokens").is_some_and(Value::is_u64)
    });
    let calls = content
        .iter()
        .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"));
    let ended = match a.get("stop_reason").and_then(Value::as_str) {
        Some("end_turn" | "stop_sequence" | "tool_use") => true,
        // As OpenAI's `length`: a text answer cut at the key's cap, never a tool call.
        Some("max_tokens") => !calls,
        // `refusal` (stopped partway), `pause_turn` (a turn to continue),
        // `model_context_window_exceeded` (cut), and anything else.
        _ => false,
    };
    a.get("type").and_then(Value::as_str) == Some("message")
        && a.get("role").and_then(Value::as_str) == Some("assistant")
        && ended
        && usage.is_some()
        && content.iter().all(replayed)
}

/// A block `replay::frames` streams and the assembler rebuilds as it was: text without
/// citations, or a tool call. Thinking (and its signature), server tools and their
/// results, and citations would be dropped or leave gaps in the block indexes, so an
/// answer holding them is not stored.
fn replayed(b: &Value) -> bool {
    let none = |k: &str| {
        b.get(k)
            .is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))
    };
    match b.get("type").and_then(Value::as_str) {
        Some("text") => string(b, "text") && none("citations"),
        Some("tool_use") => {
            string(b, "id") && string(b, "name") && b.get("input").is_some_and(Value::is_object)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_whole_answers_are_storable() {
        let openai = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
        let anthropic = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "Hi."}], "stop_reason": "end_turn",
            "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 2}});
        assert!(whole(WireFormat::OpenAi, &openai));
        let mut no_calls = openai.clone();
        no_calls["choices"][0]["message"]["tool_calls"] = Value::Null;
        assert!(
            whole(WireFormat::OpenAi, &no_calls),
            "tool_calls: null is none"
        );
        assert!(whole(WireFormat::Anthropic, &anthropic));
        assert!(!whole(WireFormat::OpenAi, &anthropic));
        assert!(!whole(WireFormat::Anthropic, &openai));
        let error = json!({"error": {"code": "upstream_error", "message": "unreadable"}});
        for bad in [
            json!([]),
            json!("ok"),
            json!({"usage": 5}),
            error,
            json!({"type": "message", "role": "assistant", "content": [], "usage": 5, "stop_reason": "end_turn"}),
            json!({"type": "message", "role": "assistant", "content": [5], "usage": {"input_tokens": 1, "output_tokens": 1}, "stop_reason": "end_turn"}),
            json!({"object": "chat.completion", "choices": [5]}),
            json!({"object": "chat.completion", "choices": [{"message": {"content": 5}, "finish_reason": "stop"}]}),
        ] {
            assert!(!whole(WireFormat::OpenAi, &bad), "{bad}");
            assert!(!whole(WireFormat::Anthropic, &bad), "{bad}");
        }
        // What a replay or a rebuild would drop is not stored (attack cache #5).
        let mut no_usage = openai.clone();
        no_usage.as_object_mut().unwrap().remove("usage");
        let mut logprobs = openai.clone();
        logprobs["choices"][0]["logprobs"] = json!({"content": []});
        let mut audio = openai.clone();
        audio["choices"][0]["message"]["audio"] = json!({"id": "a", "data": "AAAA"});
        for dropped in [no_usage, logprobs, audio] {
            assert!(!whole(WireFormat::OpenAi, &dropped), "{dropped}");
        }
        let mut empty = openai.clone();
        empty["choices"][0]["message"]["annotations"] = json!([]);
        empty["choices"][0]["message"]["refusal"] = Value::Null;
        assert!(whole(WireFormat::OpenAi, &empty), "OpenAI's empty fields");
        // Blocks a streamed replay does not rebuild are not stored (attack cache #4).
        for block in [
            json!({"type": "thinking", "thinking": "Hmm.", "signature": "sig"}),
            json!({"type": "redacted_thinking", "data": "x"}),
            json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
            json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
            json!({"type": "text", "text": "Yes.", "citations": [{"type": "char_location"}]}),
        ] {
            let mut a = anthropic.clone();
            a["content"] = json!([{"type": "text", "text": "Hi."}, block]);
            assert!(!whole(WireFormat::Anthropic, &a), "{a}");
        }
        let mut tool = anthropic.clone();
        tool["content"] = json!([{"type": "text", "text": "Hi.", "citations": null},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]);
        assert!(whole(WireFormat::Anthropic, &tool));
        let mut cut = anthropic.clone();
        cut["stop_reason"] = Value::Null;
        assert!(
            !whole(WireFormat::Anthropic, &cut),
            "an answer without its end"
        );
    }

    /// Only tool calls a replay reproduces exactly are stored: an OpenAI `custom` call was
    /// replayed and rebuilt as a `function` call with no name (s27 cache attack F4).
    #[test]
    fn only_function_calls_are_storable() {
        let with = |call: Value| {
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [call]},
                "logprobs": null, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        };
        for call in [
            json!({"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}),
            json!({"id": "call_1", "function": {"name": "exec", "arguments": "{}"}}),
        ] {
            assert!(whole(WireFormat::OpenAi, &with(call.clone())), "{call}");
        }
        for call in [
            json!({"id": "call_1", "type": "custom", "custom": {"name": "exec", "input": "ls"}}),
            json!({"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": "{}"}, "custom": {"input": "ls"}}),
            json!({"id": "call_1", "type": "function", "function": {"name": null, "arguments": null}}),
            json!({"id": "call_1", "type": "function", "function": {"name": "exec", "arguments": {}}}),
            json!({"id": "call_1", "type": "function"}),
            json!({"type": "function", "function": {"name": "exec", "arguments": "{}"}}),
        ] {
            assert!(!whole(WireFormat::OpenAi, &with(call.clone())), "{call}");
        }
    }

    /// Only an answer its provider marks complete is stored (s27 cache attack F3): one cut
    /// by a filter, refused partway, paused or out of context is not, nor a tool call cut
    /// at the output cap. A text answer cut at the cap is the answer to its key, which
    /// holds the cap.
    #[test]
    fn only_answers_ended_whole_are_storable() {
        let openai = |finish: &str, tools: bool| {
            let mut a = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."}, "logprobs": null, "finish_reason": finish}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
            if tools {
                a["choices"][0]["message"]["tool_calls"] = json!([{"id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": "{\"vin\": \"X\"}"}}]);
            }
            a
        };
        let anthropic = |stop: &str, tools: bool| {
            let mut content = vec![json!({"type": "text", "text": "Hi."})];
            if tools {
                content.push(json!({"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"vin": "X"}}));
            }
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": content, "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 2}})
        };
        for (finish, tools) in [
            ("stop", false),
            ("stop", true),
            ("tool_calls", true),
            ("function_call", true),
            ("length", false),
            // Text Generation Inference before 2.2.1 (s27 diff attack F3).
            ("eos_token", false),
            ("stop_sequence", false),
        ] {
            assert!(
                whole(WireFormat::OpenAi, &openai(finish, tools)),
                "{finish} {tools}"
            );
        }
        for (finish, tools) in [
            ("length", true),
            ("content_filter", false),
            ("content_filter", true),
            ("refusal", false),
            ("guardrail_intervened", false),
            ("", false),
        ] {
            assert!(
                !whole(WireFormat::OpenAi, &openai(finish, tools)),
                "{finish} {tools}"
            );
        }
        for (stop, tools) in [
            ("end_turn", false),
            ("end_turn", true),
            ("stop_sequence", false),
            ("tool_use", true),
            ("max_tokens", false),
        ] {
            assert!(
                whole(WireFormat::Anthropic, &anthropic(stop, tools)),
                "{stop} {tools}"
            );
        }
        for (stop, tools) in [
            ("max_tokens", true),
            ("refusal", false),
            ("pause_turn", false),
            ("pause_turn", true),
            ("model_context_window_exceeded", false),
            ("", false),
        ] {
            assert!(
                !whole(WireFormat::Anthropic, &anthropic(stop, tools)),
                "{stop} {tools}"
            );
        }
    }
}

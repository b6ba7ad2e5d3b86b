//! Every provider's documented usage object (`tests/fixtures/<provider>/usage/`), whole
//! and streamed, read into the priced parts and priced to the micro-dollar by hand.

use serde_json::Value;

use super::fixtures;
use crate::quota::pricing::{cost, Parts, Prices};
use crate::upstream::providers::translate::stream::StreamConverter;
use crate::upstream::providers::{self, Format};
use crate::usage::Usage;

/// A whole answer's usage when it reports both sides (`providers::answer_usage`).
fn answer_usage(upstream: Format, v: &Value) -> Option<Usage> {
    providers::answer_usage(upstream, v).usage()
}

/// Sonnet's prices: 3 / 3.75 (5 m write) / 6 (1 h write) / 0.30 (read) / 15 USD per Mtok,
/// 10 USD per 1 000 searches.
fn sonnet() -> Prices {
    Prices {
        cached_input: 300_000,
        cache_write_5m: 3_750_000,
        cache_write_1h: 6_000_000,
        web_search_per_1k_calls: 10_000_000,
        ..Prices::plain(3_000_000, 15_000_000)
    }
}

/// The usage a stream fixture (an array of `[event, data]` pairs or data payloads, as the
/// mock's `events` script) is charged, read by the converter from `upstream` for `client`.
fn streamed(upstream: Format, client: Format, events: &[(String, String)]) -> Usage {
    let mut c = StreamConverter::new(upstream, client, true, 1);
    let mut out = Vec::new();
    for (name, data) in events {
        c.event(name, data, &mut out);
    }
    assert!(c.end(&mut out), "the stream completes");
    c.usage()
}

/// A JSON stream fixture as (event name, data) pairs.
fn events(provider: &str, path: &str) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let Value::Array(items) = fixtures::json(provider, path) else {
        panic!("{path}: not an array")
    };
    items
        .iter()
        .map(|e| match e {
            Value::Array(pair) => (text(&pair[0]), text(&pair[1])),
            data => (String::new(), text(data)),
        })
        .collect()
}

/// Bedrock's stream fixture (one `{"event", "data"}` per line).
fn jsonl(provider: &str, path: &str) -> Vec<(String, String)> {
    fixtures::text(provider, path)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["event"].as_str().unwrap().to_string(),
                v["data"].to_string(),
            )
        })
        .collect()
}

#[test]
fn openai_chat_usage_with_cached_audio_and_reasoning_is_priced_part_by_part() {
    let u = answer_usage(
        Format::OpenAiChat,
        &fixtures::json("openai", "usage/chat.json"),
    )
    .unwrap();
    // prompt_tokens includes the cached and audio ones, completion_tokens the reasoning
    // and audio ones.
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 881,
            cached_input: 1025,
            audio_input: 100,
            text_output: 58,
            reasoning: 192,
            audio_output: 50,
            ..Parts::default()
        }
    );
    let p = Prices {
        cached_input: 1_250_000,
        audio_input: 40_000_000,
        audio_output: 80_000_000,
        ..Prices::plain(2_500_000, 10_000_000)
    };
    // 881×2.5 + 1025×1.25 + 100×40 + 58×10 + 192×10 + 50×80
    // = 2202.5 + 1281.25 + 4000 + 580 + 1920 + 4000 = 13 983.75 → 13 984.
    assert_eq!(cost(u, p), 13_984);
    let s = streamed(
        Format::OpenAiChat,
        Format::OpenAiChat,
        &events("openai", "usage/chat.stream.json"),
    );
    assert_eq!(s, u, "streamed as whole");
    // Through the internal form to an Anthropic client, the same.
    let s = streamed(
        Format::OpenAiChat,
        Format::Anthropic,
        &events("openai", "usage/chat.stream.json"),
    );
    assert_eq!(s, u);
}

#[test]
fn responses_usage_counts_its_web_search_calls() {
    let v = fixtures::json("openai", "usage/responses.json");
    let u = answer_usage(Format::Responses, &v).unwrap();
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 1000,
            cached_input: 4000,
            text_output: 288,
            reasoning: 512,
            web_search_calls: 2,
            ..Parts::default()
        }
    );
    let p = Prices {
        cached_input: 275_000,
        web_search_per_1k_calls: 10_000_000,
        ..Prices::plain(1_100_000, 4_400_000)
    };
    // 1000×1.1 + 4000×0.275 + 800×4.4 + 2 × 10 000 = 1100 + 1100 + 3520 + 20 000.
    assert_eq!(cost(u, p), 25_720);
    // Streamed: `response.completed` carries the same response object.
    let completed =
        serde_json::json!({"type": "response.completed", "sequence_number": 1, "response": v});
    let mut n = super::responses::stream::Native::new(super::responses::Stamp {
        id: "resp_gateway".into(),
        store: false,
        previous_response_id: None,
    });
    let read = n
        .read("response.completed", &completed.to_string())
        .unwrap();
    assert_eq!(read.usage, Some(u));
}

/// A `web_search_call` item repeated under one id is one search (OpenAI bills a call, not
/// its echoes); an item without an id is a call of its own (s33 stop attack F3).
#[test]
fn responses_web_search_calls_are_counted_once_per_id() {
    let item = |id: Option<&str>| match id {
        Some(id) => serde_json::json!({"type": "web_search_call", "id": id, "status": "completed"}),
        None => serde_json::json!({"type": "web_search_call", "status": "completed"}),
    };
    let response = serde_json::json!({"output": [
        item(Some("ws_1")), item(Some("ws_1")), item(Some("ws_1")), item(Some("ws_2")),
        {"type": "message", "id": "ws_1", "content": []},
        item(None), item(None),
    ]});
    assert_eq!(super::responses::web_search_calls(&response), 4);
    // An id of another type (a faulty relay's) is an id too (s34 attack F3); `null` is none.
    let other = |id: serde_json::Value| serde_json::json!({"type": "web_search_call", "id": id});
    let response = serde_json::json!({"output": [
        other(7.into()), other(7.into()), other(serde_json::json!({"n": 1})),
        other(serde_json::json!({"n": 1})), other("7".into()), other(serde_json::Value::Null),
        other(serde_json::Value::Null),
    ]});
    assert_eq!(super::responses::web_search_calls(&response), 5);
    // A relay's blank or constant id is no echo: searches that differ are each billed — only
    // an item repeated whole is one call (s34 stop attack F1: three `""` ids counted 1).
    let search = |id: &str, query: &str| {
        serde_json::json!({"type": "web_search_call", "id": id, "status": "completed",
            "action": {"type": "search", "query": query}})
    };
    let response = serde_json::json!({"output": [
        search("", "a"), search("", "b"), search("", "c"),
        search("ws", "a"), search("ws", "b"), search("ws", "b"),
    ]});
    // An id seen on items that differ is no one search's: every item under it is one, the
    // whole copies too — the same query twice under a relay's constant id is billed twice
    // (s35 stop attack F1: 5).
    assert_eq!(super::responses::web_search_calls(&response), 6);
}

#[test]
fn anthropic_usage_with_both_cache_write_lifetimes_and_web_search_is_exact() {
    let u = answer_usage(
        Format::Anthropic,
        &fixtures::json("anthropic", "usage/message.json"),
    )
    .unwrap();
    // input_tokens excludes the cache reads and writes: 1000 + 20 000 + 5 000 in all.
    assert_eq!(u.input, 26_000);
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 1000,
            cached_input: 20_000,
            cache_write_5m: 2000,
            cache_write_1h: 3000,
            text_output: 500,
            web_search_calls: 2,
            ..Parts::default()
        }
    );
    // 1000×3 + 20 000×0.30 + 2000×3.75 + 3000×6 + 500×15 + 2 × 10 000
    // = 3000 + 6000 + 7500 + 18 000 + 7500 + 20 000.
    assert_eq!(cost(u, sonnet()), 62_000);
    for client in [Format::Anthropic, Format::OpenAiChat] {
        let s = streamed(
            Format::Anthropic,
            client,
            &events("anthropic", "usage/message.stream.json"),
        );
        assert_eq!(s, u, "streamed to {client:?}");
    }
}

#[test]
fn gemini_usage_by_modality_with_cache_and_thoughts_is_exact() {
    let u = answer_usage(
        Format::Gemini,
        &fixtures::json("gemini", "usage/answer.json"),
    )
    .unwrap();
    // Thoughts are apart from the candidates' count; cached audio is priced as audio, not
    // at the text cache rate (review finding, s18: Google bills cached audio above it —
    // 2.5 Flash 0.10 against 0.03 per Mtok — and no cached-audio rate is kept).
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 200,
            cached_input: 700,
            audio_input: 200,
            image_input: 100,
            text_output: 250,
            reasoning: 150,
            image_output: 50,
            ..Parts::default()
        }
    );
    let p = Prices {
        cached_input: 75_000,
        audio_input: 1_000_000,
        image_output: 30_000_000,
        ..Prices::plain(300_000, 2_500_000)
    };
    // 200×0.3 + 700×0.075 + 200×1 + 100×0.3 + 250×2.5 + 150×2.5 + 50×30
    // = 60 + 52.5 + 200 + 30 + 625 + 375 + 1500, rounded up.
    assert_eq!(cost(u, p), 2_843);
    let s = streamed(
        Format::Gemini,
        Format::OpenAiChat,
        &events("gemini", "usage/answer.stream.json"),
    );
    assert_eq!(s, u);
}

#[test]
fn bedrock_usage_with_cache_reads_and_writes_is_exact() {
    let u = answer_usage(
        Format::Bedrock,
        &fixtures::json("bedrock", "usage/converse.json"),
    )
    .unwrap();
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 320,
            cached_input: 1000,
            cache_write_5m: 200,
            text_output: 58,
            ..Parts::default()
        }
    );
    // 320×3 + 1000×0.30 + 200×3.75 + 58×15 = 960 + 300 + 750 + 870.
    assert_eq!(cost(u, sonnet()), 2_880);
    let s = streamed(
        Format::Bedrock,
        Format::OpenAiChat,
        &jsonl("bedrock", "usage/converse_stream.jsonl"),
    );
    assert_eq!(s, u);
}

/// An OpenAI-format answer and its stream (content, then a usage chunk) reporting `usage`.
fn chat_whole_and_streamed(usage: &Value) -> (Usage, Usage) {
    let answer = serde_json::json!({"id": "c", "object": "chat.completion", "created": 1,
        "model": "grok-4", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hi"}}], "usage": usage});
    let whole = answer_usage(Format::OpenAiChat, &answer).unwrap();
    let chunk = |body: Value| (String::new(), body.to_string());
    let events = [
        chunk(
            serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "grok-4", "choices": [{"index": 0, "delta": {"content": "Hi"},
                "finish_reason": "stop"}]}),
        ),
        chunk(
            serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "grok-4", "choices": [], "usage": usage}),
        ),
        (String::new(), "[DONE]".to_string()),
    ];
    (
        whole,
        streamed(Format::OpenAiChat, Format::OpenAiChat, &events),
    )
}

/// xAI's Grok counts its reasoning apart from `completion_tokens` and inside `total_tokens`
/// (docs.x.ai; attack s27 #2): the reasoning is output, charged — 386 of 387 output tokens,
/// not the 1 `completion_tokens` says — whole and streamed. Either sign is enough: the
/// reasoning above `completion_tokens`, or a `total_tokens` above prompt and completion.
#[test]
fn openai_chat_reasoning_reported_beside_completion_tokens_is_charged() {
    use serde_json::json;
    let xai = json!({"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 399,
        "completion_tokens_details": {"reasoning_tokens": 386}});
    let (whole, s) = chat_whole_and_streamed(&xai);
    assert_eq!((whole.input, whole.output, whole.reasoning), (12, 387, 386));
    assert_eq!(s, whole, "streamed as whole");
    let p = Prices::plain(3_000_000, 15_000_000);
    // 12×3 + 387×15 = 36 + 5805.
    assert_eq!(cost(whole, p), 5_841);
    for (usage, output) in [
        // The reasoning above the completion, no total: both are output.
        (
            json!({"prompt_tokens": 12, "completion_tokens": 1,
                "completion_tokens_details": {"reasoning_tokens": 386}}),
            387,
        ),
        // A total above prompt and completion, no reasoning figure: the rest is output.
        (
            json!({"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 399}),
            387,
        ),
        // A total that says more than the reasoning beside the completion: the total.
        (
            json!({"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 500,
                "completion_tokens_details": {"reasoning_tokens": 386}}),
            488,
        ),
    ] {
        let (whole, s) = chat_whole_and_streamed(&usage);
        assert_eq!(whole.output, output, "{usage}");
        assert_eq!(s, whole, "{usage}: streamed as whole");
    }
}

/// OpenAI's own shape — the reasoning inside `completion_tokens`, `total_tokens` their sum
/// or less — is read as it was: the reasoning is a part of the output, never added to it.
#[test]
fn openai_chat_reasoning_inside_completion_tokens_is_not_added() {
    use serde_json::json;
    for usage in [
        json!({"prompt_tokens": 12, "completion_tokens": 387, "total_tokens": 399,
            "completion_tokens_details": {"reasoning_tokens": 386}}),
        json!({"prompt_tokens": 12, "completion_tokens": 387, "total_tokens": 5,
            "completion_tokens_details": {"reasoning_tokens": 387}}),
        json!({"prompt_tokens": 12, "completion_tokens": 387, "total_tokens": null}),
        json!({"prompt_tokens": 12, "completion_tokens": 387, "total_tokens": -1}),
    ] {
        let (whole, s) = chat_whole_and_streamed(&usage);
        assert_eq!((whole.input, whole.output), (12, 387), "{usage}");
        assert_eq!(s, whole, "{usage}: streamed as whole");
    }
    // Without the prompt figure the total cannot be split: the output is the completion.
    let answer = json!({"choices": [], "usage": {"completion_tokens": 1, "total_tokens": 399}});
    let r = providers::answer_usage(Format::OpenAiChat, &answer);
    assert_eq!((r.input, r.output.map(|o| o.output)), (None, Some(1)));
    // A total that is not a number is the wrong shape, as any other figure: not read.
    let answer = json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": "399"}});
    assert_eq!(answer_usage(Format::OpenAiChat, &answer), None);
}

/// Routers in front of Claude report its cache writes in OpenAI-format usage, inside
/// `prompt_tokens`: OpenRouter as `prompt_tokens_details.cache_write_tokens`
/// (openrouter.ai/docs/use-cases/usage-accounting), LiteLLM as a top-level
/// `cache_creation_input_tokens` (attack s27 #4). Unsplit by lifetime, they are priced
/// per the request's marks (`Usage::at_worst_lifetime`), as Bedrock's writes are — 100 at
/// the 1-hour rate with a 1-hour mark, the 5-minute rate without — and 94 as fresh input,
/// whole and streamed; never as 194 fresh input tokens.
#[test]
fn a_routers_cache_write_tokens_are_priced_as_writes() {
    use crate::quota::pricing::InputKinds;
    use serde_json::json;
    let hour = InputKinds {
        cache_write_1h: true,
        ..InputKinds::default()
    };
    let five = InputKinds {
        cache_write_5m: true,
        ..InputKinds::default()
    };
    for usage in [
        json!({"prompt_tokens": 194, "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 100}}),
        json!({"prompt_tokens": 194, "completion_tokens": 2, "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}),
    ] {
        let (whole, s) = chat_whole_and_streamed(&usage);
        assert_eq!(s, whole, "{usage}: streamed as whole");
        assert_eq!(
            (whole.cache_write_5m, whole.cache_write_unsplit),
            (100, 100),
            "{usage}"
        );
        let at_hour = whole.at_worst_lifetime(hour);
        assert_eq!(
            at_hour.parts(),
            Parts {
                fresh_input: 94,
                cache_write_1h: 100,
                text_output: 2,
                ..Parts::default()
            },
            "{usage}"
        );
        // 94×3 + 100×6 + 2×15 = 282 + 600 + 30.
        assert_eq!(cost(at_hour, sonnet()), 912, "{usage}");
        // 94×3 + 100×3.75 + 2×15 = 282 + 375 + 30.
        assert_eq!(
            cost(whole.at_worst_lifetime(five), sonnet()),
            687,
            "{usage}"
        );
    }
    // Both names for the same writes are read once.
    let both = json!({"prompt_tokens": 194, "completion_tokens": 2,
        "cache_creation_input_tokens": 100, "prompt_tokens_details": {"cache_write_tokens": 100}});
    let (whole, s) = chat_whole_and_streamed(&both);
    assert_eq!((whole.cache_write_5m, s), (100, whole));
    // A write figure that is not a number is the wrong shape, as any other figure: the
    // usage is not read (whole) and the event is corrupt (streamed).
    for bad in [
        json!({"prompt_tokens": 194, "completion_tokens": 2, "cache_creation_input_tokens": "100"}),
        json!({"prompt_tokens": 194, "completion_tokens": 2,
            "prompt_tokens_details": {"cache_write_tokens": "100"}}),
    ] {
        let answer = json!({"choices": [], "usage": bad});
        assert_eq!(answer_usage(Format::OpenAiChat, &answer), None, "{bad}");
        let parsed = serde_json::from_value::<
            crate::upstream::providers::translate::stream::shape::Obj<
                crate::upstream::providers::translate::stream::shape::OpenAiUsage,
            >,
        >(bad.clone());
        assert!(parsed.is_err(), "{bad}");
    }
}

/// A whole answer whose usage leaves the output out is charged its generated text counted
/// (`providers::answer_text`), as its stream counts every delta (CHECKS Q3; attack s27 #5):
/// Bedrock's tool calls and reasoning, Anthropic's thinking, an OpenAI-format answer's
/// `reasoning_content` / `reasoning`, refusal and `thinking` parts (Mistral) are output
/// the upstream bills, and are counted with the text.
#[test]
fn a_whole_answers_count_takes_every_piece_its_stream_counts() {
    use serde_json::json;
    let cases = [
        (
            Format::Bedrock,
            json!({"output": {"message": {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "bedrock-thought", "signature": "s"}}},
                {"text": "bedrock-text"},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "bedrock_tool",
                    "input": {"city": "bedrock-args"}}}]}},
                "stopReason": "tool_use", "usage": {"inputTokens": 10}}),
            &[
                "bedrock-thought",
                "bedrock-text",
                "bedrock_tool",
                "bedrock-args",
            ][..],
        ),
        (
            Format::Anthropic,
            json!({"type": "message", "content": [
                {"type": "thinking", "thinking": "anthropic-thought", "signature": "s"},
                {"type": "text", "text": "anthropic-text"},
                {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"a": "anthropic-args"}}],
                "usage": {"input_tokens": 10}}),
            &["anthropic-thought", "anthropic-text", "anthropic-args"][..],
        ),
        (
            Format::OpenAiChat,
            json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "openai-text",
                "reasoning_content": "deepseek-thought", "refusal": "openai-refusal"}}]}),
            &["openai-text", "deepseek-thought", "openai-refusal"][..],
        ),
        (
            Format::OpenAiChat,
            json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "openai-text",
                "reasoning": "openrouter-thought"}}]}),
            &["openai-text", "openrouter-thought"][..],
        ),
        (
            Format::OpenAiChat,
            json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "mistral-thought"}]},
                    {"type": "text", "text": "mistral-text"}]}}]}),
            &["mistral-thought", "mistral-text"][..],
        ),
    ];
    // Some vLLM versions send the reasoning under both names, the same text: counted once
    // (s27 diff attack F4).
    let both = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "x",
        "reasoning_content": "vllm-thought", "reasoning": "vllm-thought"}}]});
    let text = providers::answer_text(Format::OpenAiChat, &both);
    assert_eq!(text.matches("vllm-thought").count(), 1, "{text:?}");
    // An empty one beside the other hides nothing (late attack L4).
    let empty = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "x",
        "reasoning_content": "", "reasoning": "router-thought"}}]});
    let text = providers::answer_text(Format::OpenAiChat, &empty);
    assert!(text.contains("router-thought"), "{text:?}");
    for (f, answer, pieces) in cases {
        assert_eq!(providers::answer_usage(f, &answer).output, None, "{f:?}");
        let text = providers::answer_text(f, &answer);
        for piece in pieces {
            assert!(
                text.contains(piece),
                "{f:?}: {piece} not counted in {text:?}"
            );
        }
    }
}

/// Cached audio is cached input (OpenAI's `cached_tokens_details.audio_tokens`, part of
/// both `cached_tokens` and `audio_tokens`): priced once, at the cached price, and the
/// audio part is the uncached audio only — whole and streamed.
#[test]
fn openai_cached_audio_is_priced_once() {
    let usage = serde_json::json!({"prompt_tokens": 2006, "completion_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 1025, "audio_tokens": 100,
            "cached_tokens_details": {"text_tokens": 985, "audio_tokens": 40}}});
    let answer = serde_json::json!({"id": "c", "object": "chat.completion", "created": 1,
        "model": "gpt-audio", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hi"}}], "usage": usage});
    let u = answer_usage(Format::OpenAiChat, &answer).unwrap();
    let parts = u.parts();
    assert_eq!(
        (parts.cached_input, parts.audio_input, parts.fresh_input),
        (1025, 60, 921)
    );
    let chunk = |body: Value| (String::new(), body.to_string());
    let events = [
        chunk(
            serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-audio", "choices": [{"index": 0, "delta": {"content": "Hi"},
                "finish_reason": "stop"}]}),
        ),
        chunk(
            serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-audio", "choices": [], "usage": usage}),
        ),
        (String::new(), "[DONE]".to_string()),
    ];
    assert_eq!(streamed(Format::OpenAiChat, Format::OpenAiChat, &events), u);
}

/// A `web_search_requests` written as `null` is no count: the searches the answer shows are
/// charged, as when the field is absent.
#[test]
fn a_null_search_count_is_no_report() {
    let search = |i: u32| {
        serde_json::json!({"type": "server_tool_use", "id": format!("srvtoolu_{i}"),
            "name": "web_search", "input": {"query": "sluice"}})
    };
    let answer = serde_json::json!({"type": "message", "content": [search(0), search(1)],
        "usage": {"input_tokens": 10, "output_tokens": 5,
            "server_tool_use": {"web_search_requests": null}}});
    let u = answer_usage(Format::Anthropic, &answer).unwrap();
    assert_eq!(u.web_search_calls, 2);
}

/// A whole answer's usage that leaves a side out reports that side absent, never 0 — and a
/// 0 it states is reported (`providers::answer_usage`, `pipeline::finish`).
#[test]
fn a_usage_that_leaves_a_side_out_reports_it_absent_and_a_zero_as_zero() {
    use serde_json::json;
    let sides = |f: Format, v: Value| {
        let r = providers::answer_usage(f, &v);
        (r.input.map(|i| i.input), r.output.map(|o| o.output))
    };
    let chat = |u: Value| json!({"choices": [], "usage": u});
    let message = |u: Value| json!({"content": [], "usage": u});
    let gemini = |u: Value| json!({"candidates": [], "usageMetadata": u});
    let converse = |u: Value| json!({"output": {}, "usage": u});
    let response = |u: Value| json!({"output": [], "usage": u});
    let cases = [
        (Format::OpenAiChat, chat(json!({})), (None, None)),
        (Format::OpenAiChat, chat(Value::Null), (None, None)),
        (Format::OpenAiChat, json!({"choices": []}), (None, None)),
        (
            Format::OpenAiChat,
            chat(json!({"completion_tokens": 40})),
            (None, Some(40)),
        ),
        (
            Format::OpenAiChat,
            chat(json!({"prompt_tokens": 30})),
            (Some(30), None),
        ),
        (
            Format::OpenAiChat,
            chat(json!({"prompt_tokens": 0, "completion_tokens": 40})),
            (Some(0), Some(40)),
        ),
        (
            Format::Anthropic,
            message(json!({"output_tokens": 5})),
            (None, Some(5)),
        ),
        (
            Format::Anthropic,
            message(json!({"input_tokens": 0, "output_tokens": 5})),
            (Some(0), Some(5)),
        ),
        (
            Format::Gemini,
            gemini(json!({"candidatesTokenCount": 7})),
            (None, Some(7)),
        ),
        (
            Format::Gemini,
            gemini(json!({"promptTokenCount": 0, "candidatesTokenCount": 7})),
            (Some(0), Some(7)),
        ),
        (
            Format::Bedrock,
            converse(json!({"outputTokens": 9})),
            (None, Some(9)),
        ),
        (
            Format::Responses,
            response(json!({"output_tokens": 3})),
            (None, Some(3)),
        ),
        (
            Format::Responses,
            response(json!({"input_tokens": 0, "output_tokens": 3})),
            (Some(0), Some(3)),
        ),
    ];
    for (f, v, want) in cases {
        assert_eq!(sides(f, v.clone()), want, "{f:?} {v}");
    }
}

/// Gemini's cached input (`cachedContentTokenCount`, part of `promptTokenCount`) priced at
/// the bundled table's context-caching rates (`config/price_table.toml`), to the
/// micro-dollar — on 2.5 Pro above 200 000 prompt tokens at its tier (×2 input, ×1.5
/// output), and before Google's cut of the cache rates at the older ones.
#[test]
fn gemini_cached_input_is_priced_at_the_bundled_cache_rates() {
    use crate::config::price_table::bundled;
    use crate::quota::schedule::Schedule;

    let at = |model: &str, day: &str, u: Usage| {
        let t = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap()
            .and_utc();
        let table = bundled();
        let prices = Schedule::new(vec![], vec![], table.for_upstream_model(model))
            .rates_at(t)
            .unwrap_or_else(|| panic!("{model} is bundled"));
        let tier = table.long_context(model).at(t);
        cost(u, prices.for_input(u.input, tier))
    };
    let u = answer_usage(
        Format::Gemini,
        &fixtures::json("gemini", "usage/cached.json"),
    )
    .unwrap();
    assert_eq!(
        u.parts(),
        Parts {
            fresh_input: 2_000,
            cached_input: 10_000,
            text_output: 500,
            reasoning: 300,
            ..Parts::default()
        }
    );
    let now = "2026-12-01";
    // 2.5 Pro: 2 000 × 1.25 + 10 000 × 0.125 + 800 × 10 = 2 500 + 1 250 + 8 000.
    assert_eq!(at("gemini-2.5-pro", now, u), 11_750);
    // 2.5 Flash: 2 000 × 0.30 + 10 000 × 0.03 + 800 × 2.50 = 600 + 300 + 2 000.
    assert_eq!(at("gemini-2.5-flash", now, u), 2_900);
    // 2.5 Flash-Lite: 2 000 × 0.10 + 10 000 × 0.01 + 800 × 0.40 = 200 + 100 + 320.
    assert_eq!(at("gemini-2.5-flash-lite", now, u), 620);
    // 2.0 Flash: 2 000 × 0.10 + 10 000 × 0.025 + 800 × 0.40 = 200 + 250 + 320.
    assert_eq!(at("gemini-2.0-flash", now, u), 770);
    // Before the cut, the cache rates of Google's 75 % discount: 2.5 Pro 2 500 + 10 000 ×
    // 0.3125 + 8 000; 2.5 Flash 600 + 10 000 × 0.075 + 2 000; Flash-Lite 200 + 10 000 ×
    // 0.025 + 320.
    let before = "2025-08-01";
    assert_eq!(at("gemini-2.5-pro", before, u), 13_625);
    assert_eq!(at("gemini-2.5-flash", before, u), 3_350);
    assert_eq!(at("gemini-2.5-flash-lite", before, u), 770);

    // Past 200 000 prompt tokens (cached ones count), 2.5 Pro's tier: 50 000 × 2.50 +
    // 200 000 × 0.25 + 1 000 × 15 = 125 000 + 50 000 + 15 000.
    let long = answer_usage(
        Format::Gemini,
        &fixtures::json("gemini", "usage/cached_long.json"),
    )
    .unwrap();
    assert_eq!((long.input, long.cached_input), (250_000, 200_000));
    assert_eq!(at("gemini-2.5-pro", now, long), 190_000);
    // … and before the cut: 125 000 + 200 000 × 0.625 + 15 000.
    assert_eq!(at("gemini-2.5-pro", before, long), 265_000);
}

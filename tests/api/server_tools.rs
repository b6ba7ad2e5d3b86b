//! What a request can make the upstream bill beyond what its tokens say up front: Anthropic
//! server tools whose results come back as input (web search, web fetch) are reserved for
//! and charged exactly; the ones whose cost the gateway cannot bound (code execution,
//! MCP servers, tools it does not know) and the dearer service tiers are refused naming
//! the field; a stream cut after a web search still pays for the search.

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::{Script, SseEvent};
use sluice::pipeline::request::TOOL_USE_PROMPT;
use sluice::quota::estimate;
use sluice::quota::pricing::{self, Prices};
use sluice::usage::Usage;

use crate::helpers::*;
use crate::responses::last_reserve;

pub(crate) const KEY: &str = "sk-server-tools-anthropic-0123";

/// Claude Sonnet at 3 / 15 USD per Mtok, 10 USD per 1 000 searches, over an Anthropic
/// upstream (the mock), plus the default OpenAI model.
pub(crate) async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        let mut an = upstream("an", KEY, mock);
        an.provider = Provider::Anthropic;
        an.base_url = mock.base_url();
        s.upstreams.push(an);
        let mut sonnet = model("sonnet", &["an"]);
        sonnet.price.input_usd_per_mtok = Some(3.0.into());
        sonnet.price.output_usd_per_mtok = Some(15.0.into());
        sonnet.price.web_search_usd_per_1k_calls = Some(10.0.into());
        sonnet.max_output_tokens = 8192;
        // The same, served by a model Anthropic bills at a dearer tier above 200 000
        // input tokens (the bundled table's `long_context_above_tokens`).
        let mut long = sonnet.clone();
        long.name = "sonnet-long".into();
        long.routes = vec![route("an", "claude-sonnet-4-5-20250929")];
        long.max_input_tokens = 1_000_000;
        s.models.extend([sonnet, long]);
    })
    .await
}

pub(crate) fn sonnet_prices() -> Prices {
    Prices {
        web_search_per_1k_calls: 10_000_000,
        ..Prices::plain(3_000_000, 15_000_000)
    }
}

/// The token's spend and what the gateway absorbed for it.
pub(crate) async fn spent_and_absorbed(app: &TestApp, id: i64) -> (i64, i64) {
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    let absorbed = app
        .scalar(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger
             WHERE kind = 'absorbed' AND token_id = {id}"
        ))
        .await;
    (spent, absorbed)
}

/// An Anthropic answer whose input grew by the pages the tools brought back.
pub(crate) fn answer(input: i64, output: i64, searches: i64, content: Value) -> Value {
    json!({"id": "msg_tools", "type": "message", "role": "assistant", "model": "sonnet",
        "content": content, "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output,
            "server_tool_use": {"web_search_requests": searches}}})
}

/// Search results and fetched pages are billed as input: a request whose input grew from
/// a few tokens to 60 000 by two searches and a fetch is charged exactly its priced usage,
/// and its reservation covered it (nothing absorbed). The fetch tool went upstream capped
/// in calls and in content.
#[tokio::test]
async fn tool_results_billed_as_input_are_reserved_and_charged_exactly() {
    let app = app().await;
    let (id, token) = app.token("search", Some("10")).await;
    let text = json!([{"type": "text", "text": "Found it."}]);
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(60_000, 300, 2, text)),
            ..Script::default()
        }],
    );
    let body = json!({"model": "sonnet", "max_tokens": 1000,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
            {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 1}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let expected = pricing::cost(
        Usage {
            input: 60_000,
            output: 300,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(expected, 204_500);
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    let sent = app
        .mock
        .state
        .stats(KEY)
        .last_bodies
        .back()
        .cloned()
        .unwrap();
    assert_eq!(sent["tools"][1]["max_uses"], 1, "{sent}");
    assert!(
        sent["tools"][1]["max_content_tokens"].as_i64().is_some(),
        "{sent}"
    );
    // Without caps of its own the fetch tool gets the gateway's.
    let (_, token) = app.token("fetch", Some("10")).await;
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(100, 10, 0, json!([]))),
            ..Script::default()
        }],
    );
    let body = json!({"model": "sonnet", "max_tokens": 10,
        "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}],
        "messages": [{"role": "user", "content": "Read https://example.com"}]});
    assert_eq!(app.messages(&token, &body).await.status(), 200);
    let sent = app
        .mock
        .state
        .stats(KEY)
        .last_bodies
        .back()
        .cloned()
        .unwrap();
    assert_eq!(sent["tools"][0]["max_uses"], 5, "{sent}");
    assert_eq!(sent["tools"][0]["max_content_tokens"], 25_000, "{sent}");
    app.assert_invariant().await;
}

/// The reservation of a turn with 3 searches: 4 sampling steps, each billed its whole
/// context — the margin-padded counted input, the results of the searches before it (the
/// allowance per call) and the output written before it (at most the cap) — at the input
/// price; one micro short is refused before the upstream sees anything.
#[tokio::test]
async fn each_search_reserves_its_input_allowance() {
    let app = app().await;
    let body = json!({"model": "sonnet", "max_tokens": 100,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    // With tools Claude reads its tool-use system prompt too, at each step.
    let counted = estimate::chat_input(body["messages"].as_array().unwrap(), body.get("tools"))
        + TOOL_USE_PROMPT;
    let first = pricing::input_with_margin(counted, 1.10, 16);
    let worst = pricing::cost(
        Usage {
            input: 4 * first + 25_000 * (3 + 2 + 1) + 3 * 100,
            output: 100,
            web_search_calls: 3,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    let (_, short) = app.token("short", Some(&pricing::usd(worst - 1))).await;
    assert_eq!(app.messages(&short, &body).await.status(), 429);
    assert_eq!(app.mock.state.stats(KEY).count, 0, "nothing sent upstream");
    let (_, exact) = app.token("exact", Some(&pricing::usd(worst))).await;
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(100, 10, 0, json!([]))),
            ..Script::default()
        }],
    );
    assert_eq!(app.messages(&exact, &body).await.status(), 200);
    app.assert_invariant().await;
}

/// Server tools run only where the request reaches its upstream in its own format: a
/// translated route refuses them (a 400, nothing billed), so it reserves nothing. A model
/// served by Claude and, as a fallback, by OpenAI's gpt-4o — whose bundled web-search fee
/// ($25 per 1 000) is dearer than Claude's ($10) — reserved its searches at the OpenAI
/// route's fee, a route that cannot run them (s33 diff attack F2): $2.50 for 100 searches
/// where $1.00 is the most they can cost.
#[tokio::test]
async fn a_route_that_cannot_run_the_server_tools_reserves_none() {
    let app = spawn_app_with(|s, mock| {
        let mut an = upstream("an", KEY, mock);
        an.provider = Provider::Anthropic;
        an.base_url = mock.base_url();
        s.upstreams.push(an);
        // Input and output priced here, every other kind of each route from the bundled
        // table by its upstream model.
        let mut claude = model("claude", &[]);
        claude.routes = vec![route("an", "claude-haiku-4-5")];
        let mut mixed = claude.clone();
        mixed.name = "mixed".into();
        mixed.routes.push(route("a", "gpt-4o"));
        s.models.extend([claude, mixed]);
    })
    .await;
    let mut reserved = Vec::new();
    for model in ["claude", "mixed"] {
        let body = json!({"model": model, "max_tokens": 100,
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 100}],
            "messages": [{"role": "user", "content": "What is Sluice?"}]});
        let (id, token) = app.token(model, Some("1000")).await;
        app.mock.state.script(
            KEY,
            [Script {
                body: Some(answer(100, 10, 0, json!([]))),
                ..Script::default()
            }],
        );
        let resp = app.messages(&token, &body).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        reserved.push(last_reserve(&app, id).await);
    }
    assert_eq!(reserved[1], reserved[0], "the OpenAI fallback adds nothing");
    app.assert_invariant().await;
}

/// A 400 in Anthropic's format whose message names `field`.
async fn refused_naming(resp: reqwest::Response, field: &str) {
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    let message = err["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(&format!("`{field}`")), "{err}");
}

/// Code execution (billed per container-hour), MCP servers (their results billed as
/// input, unbounded) and server tools the gateway does not know are refused naming the
/// field; the client-run tools (bash, text editor, computer use, memory) pass.
#[tokio::test]
async fn server_tools_whose_cost_cannot_be_bounded_are_refused_naming_the_field() {
    let app = app().await;
    let (_, token) = app.token("tools", Some("1")).await;
    let ask = |extra: Value| {
        let mut b = json!({"model": "sonnet", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for tool in [
        json!({"type": "code_execution_20250825", "name": "code_execution"}),
        json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search"}),
        json!({"type": "some_new_tool_20300101", "name": "x"}),
    ] {
        let resp = app.messages(&token, &ask(json!({"tools": [tool]}))).await;
        refused_naming(resp, "tools").await;
    }
    let mcp = json!({"mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse",
        "name": "x"}]});
    refused_naming(app.messages(&token, &ask(mcp)).await, "mcp_servers").await;
    assert_eq!(app.mock.state.stats(KEY).count, 0, "nothing sent upstream");
    let client_tools = json!({"tools": [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
            "display_height_px": 768},
        {"type": "memory_20250818", "name": "memory"}]});
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(100, 10, 0, json!([]))),
            ..Script::default()
        }],
    );
    assert_eq!(app.messages(&token, &ask(client_tools)).await.status(), 200);
    app.assert_invariant().await;
}

/// `service_tier: "priority"` (OpenAI's and Anthropic's dearer tier) and OpenAI's `flex` /
/// `scale` are refused naming `service_tier`; `auto`, `default` and `standard_only` pass.
#[tokio::test]
async fn a_service_tier_priced_apart_is_refused_naming_it() {
    let app = app().await;
    let (_, token) = app.token("tiers", Some("1")).await;
    for tier in ["priority", "flex", "scale", "batch"] {
        let resp = app
            .chat(
                &token,
                &json!({"model": "gpt-4o-mini", "max_tokens": 10, "service_tier": tier,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 400, "{tier}");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["param"], "service_tier", "{tier}: {err}");
    }
    let resp = app
        .messages(
            &token,
            &json!({"model": "sonnet", "max_tokens": 10, "service_tier": "priority",
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    refused_naming(resp, "service_tier").await;
    assert_eq!(app.mock.state.stats(KEY).count, 0, "nothing sent upstream");
    for tier in ["auto", "default"] {
        let resp = app
            .chat(
                &token,
                &json!({"model": "gpt-4o-mini", "max_tokens": 10, "service_tier": tier,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{tier}");
    }
    for tier in ["auto", "standard_only"] {
        app.mock.state.script(
            KEY,
            [Script {
                body: Some(answer(100, 10, 0, json!([]))),
                ..Script::default()
            }],
        );
        let resp = app
            .messages(
                &token,
                &json!({"model": "sonnet", "max_tokens": 10, "service_tier": tier,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{tier}");
    }
    app.assert_invariant().await;
}

/// The events of a search the model started: its `server_tool_use` block, whole.
pub(crate) fn search_block(index: i64) -> Vec<SseEvent> {
    let e = |name: &str, data: Value| SseEvent::Named(name.into(), data);
    vec![
        e(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block":
                {"type": "server_tool_use", "id": format!("srvtoolu_{index}"),
                 "name": "web_search", "input": {}}}),
        ),
        e(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta":
                {"type": "input_json_delta", "partial_json": "{\"query\": \"sluice\"}"}}),
        ),
        e(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ),
    ]
}

/// A stream cut after the model made a search (its `server_tool_use` block went by, the
/// final usage with `web_search_requests` never came) pays the search's fee: the calls
/// charged are the most of those counted and those reported. The steps the 2 searches
/// caused are charged too (`server_tool_turns`): 3 steps of the 100 reported, the pages
/// re-read 2 + 1 times, the output seen re-read twice.
#[tokio::test]
async fn a_stream_cut_after_a_search_pays_for_the_search() {
    let app = app().await;
    let (id, token) = app.token("cut", Some("10")).await;
    let mut events = vec![SseEvent::Named(
        "message_start".into(),
        json!({"type": "message_start", "message": {"id": "msg_cut", "type": "message",
            "role": "assistant", "model": "sonnet", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
    )];
    events.extend(search_block(0));
    events.extend(search_block(1));
    let sent = events.len();
    events.push(SseEvent::Named(
        "message_delta".into(),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 50}}),
    ));
    app.mock.state.script(
        KEY,
        [Script {
            events: Some(events),
            cut_after: Some(sent),
            ..Script::default()
        }],
    );
    let body = json!({"model": "sonnet", "max_tokens": 1000, "stream": true,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    let output = estimate::count_text(&"{\"query\": \"sluice\"}".repeat(2));
    let expected = pricing::cost(
        Usage {
            input: 3 * 100 + 25_000 * (2 + 1) + 2 * output,
            output,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

/// A whole answer that shows its searches but reports none (no `server_tool_use` in its
/// usage) is charged the searches shown.
#[tokio::test]
async fn a_whole_answer_pays_for_the_searches_it_shows() {
    let app = app().await;
    let (id, token) = app.token("whole", Some("10")).await;
    let search = |i: i64| {
        json!({"type": "server_tool_use", "id": format!("srvtoolu_{i}"), "name": "web_search",
            "input": {"query": "sluice"}})
    };
    let content = json!([search(0), search(1), {"type": "text", "text": "Found it."}]);
    let mut unreported = answer(1_000, 100, 0, content);
    unreported["usage"]
        .as_object_mut()
        .unwrap()
        .remove("server_tool_use");
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(unreported),
            ..Script::default()
        }],
    );
    let body = json!({"model": "sonnet", "max_tokens": 1000,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    assert_eq!(app.messages(&token, &body).await.status(), 200);
    let expected = pricing::cost(
        Usage {
            input: 1_000,
            output: 100,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

/// A prompt that may pass a model's long-context threshold (200 000 input tokens on Claude
/// Sonnet 4.5, reserved input with its margin) is reserved at the tier's rates (2× input,
/// 1.5× output: 6 / 22.50 USD per Mtok) and served, on either client format; the answer is
/// priced at the tier. Before, it was refused naming the input's field (400).
#[tokio::test]
async fn a_prompt_past_the_long_context_tier_is_reserved_at_its_rates() {
    let app = app().await;
    let ask = |words: usize| {
        json!({"model": "sonnet-long", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi ".repeat(words)}]})
    };
    let body = ask(190_000);
    let counted = estimate::chat_input(body["messages"].as_array().unwrap(), None);
    let reserved = pricing::input_with_margin(counted, 1.10, 16);
    assert!(reserved > 200_000, "{reserved}");
    let tier = Prices::plain(6_000_000, 22_500_000);
    let reserve = pricing::cost(
        Usage {
            input: reserved,
            output: 10,
            ..Usage::default()
        },
        tier,
    );
    // 209 029 × 6 + 10 × 22.50 micro-dollars per token-million, rounded up.
    assert_eq!((reserved, reserve), (209_029, 1_254_399));
    for (i, chat) in [true, false].into_iter().enumerate() {
        let (id, token) = app.token(&format!("long-{i}"), Some("100")).await;
        app.mock.state.script(
            KEY,
            [Script {
                body: Some(answer(210_000, 10, 0, json!([]))),
                ..Script::default()
            }],
        );
        let path = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/messages"
        };
        let resp = app.send_1m(path, &token, &body).await;
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 200, "chat={chat}: {text}");
        assert_eq!(last_reserve(&app, id).await, reserve, "chat={chat}");
        // 210 000 × 6 + 10 × 22.50 micro-dollars per token-million.
        let (charged, absorbed) = spent_and_absorbed(&app, id).await;
        assert_eq!(charged + absorbed, 1_260_225, "chat={chat}");
    }
    app.assert_invariant().await;
}

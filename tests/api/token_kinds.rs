//! Every token kind priced exactly, through the real gateway and the mock: the providers'
//! documented usage objects (`tests/fixtures/<provider>/usage/`), whole and streamed, to
//! OpenAI and Anthropic clients, are charged their hand-computed figure to the micro-dollar
//! and logged by kind; the reservation is the worst case the request may cause (one micro
//! short is refused before anything reaches the upstream).

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::{Script, SseEvent};
use sluice::quota::estimate;
use sluice::quota::pricing::{self, Prices};
use sluice::usage::Usage;

use crate::helpers::*;

const ANTHROPIC_KEY: &str = "sk-token-kinds-anthropic-0123";
const OPENAI_KEY: &str = "sk-token-kinds-openai-0123";
const ROUTER_KEY: &str = "sk-token-kinds-router-0123";

/// `tests/fixtures/<provider>/usage/<name>` as JSON.
fn fixture(provider: &str, name: &str) -> Value {
    let p = format!(
        "{}/tests/fixtures/{provider}/usage/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&p).expect(&p)).expect(&p)
}

/// A stream fixture (`[event, data]` pairs or data payloads) as the mock's events.
fn stream_events(provider: &str, name: &str) -> Vec<SseEvent> {
    let Value::Array(items) = fixture(provider, name) else {
        panic!("{name}: not an array")
    };
    items
        .into_iter()
        .map(|e| match e {
            Value::Array(mut pair) => {
                let data = pair.pop().unwrap();
                SseEvent::Named(pair[0].as_str().unwrap().into(), data)
            }
            data => SseEvent::Data(data),
        })
        .collect()
}

/// Claude Sonnet at 3 / 3.75 (5 m write) / 6 (1 h write) / 0.30 (read) / 15 USD per Mtok,
/// 10 USD per 1 000 searches; an OpenAI audio model at 2.5 / 1.25 (cached) / 40 (audio in)
/// / 10 / 80 (audio out).
async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        let mut an = upstream("an", ANTHROPIC_KEY, mock);
        an.provider = Provider::Anthropic;
        an.base_url = mock.base_url();
        let oa = upstream("oa", OPENAI_KEY, mock);
        // A router (OpenRouter, LiteLLM) in front of Claude, in OpenAI's format.
        let mut router = upstream("router", ROUTER_KEY, mock);
        router.provider = Provider::OpenaiCompatible;
        s.upstreams.extend([an, oa, router]);
        let mut sonnet = model("sonnet", &["an"]);
        sonnet.price.input_usd_per_mtok = Some(3.0.into());
        sonnet.price.output_usd_per_mtok = Some(15.0.into());
        sonnet.price.cached_input_usd_per_mtok = Some(0.30.into());
        sonnet.price.cache_write_5m_usd_per_mtok = Some(3.75.into());
        sonnet.price.cache_write_1h_usd_per_mtok = Some(6.0.into());
        sonnet.price.web_search_usd_per_1k_calls = Some(10.0.into());
        sonnet.max_output_tokens = 8192;
        let mut audio = model("gpt-audio", &["oa"]);
        audio.price.input_usd_per_mtok = Some(2.5.into());
        audio.price.cached_input_usd_per_mtok = Some(1.25.into());
        audio.price.audio_input_usd_per_mtok = Some(40.0.into());
        audio.price.output_usd_per_mtok = Some(10.0.into());
        audio.price.audio_output_usd_per_mtok = Some(80.0.into());
        audio.max_output_tokens = 8192;
        let mut routed = model("routed-sonnet", &["router"]);
        routed.price = sonnet.price.clone();
        routed.max_output_tokens = 8192;
        s.models.extend([sonnet, audio, routed]);
        // The tests here cut many streams on one key, each a failure of its breaker (s26
        // attack, streams F2): the breaker is not theirs, it must not open.
        s.breaker.failure_threshold = u32::MAX;
    })
    .await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    OpenAi,
    Anthropic,
}

/// What one request was charged: the token's spend, the absorbed sum and the request
/// log's cost and per-kind columns.
#[derive(Debug, PartialEq, Eq)]
struct Charged {
    spent: i64,
    absorbed: i64,
    logged_cost: i64,
    /// cached, 5 m writes, 1 h writes, reasoning, audio in, audio out, web searches.
    kinds: (i64, i64, i64, i64, i64, i64, i64),
}

/// Sends `body` as `client`, streamed or not, with a fresh token of 1 USD; the upstream
/// answers `script`.
async fn charged(
    app: &TestApp,
    client: Client,
    key: &str,
    script: Script,
    mut body: Value,
    stream: bool,
) -> Charged {
    let (id, token) = app
        .token(&format!("{client:?}-{stream}-{key}"), Some("10"))
        .await;
    app.mock.state.script(key, [script]);
    body["stream"] = json!(stream);
    if stream && client == Client::OpenAi {
        body["stream_options"] = json!({"include_usage": true});
    }
    let resp = match client {
        Client::OpenAi => app.chat(&token, &body).await,
        Client::Anthropic => app.messages(&token, &body).await,
    };
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{client:?} stream={stream}: {text}");
    assert!(
        !text.contains("\"error\""),
        "{client:?} stream={stream}: {text}"
    );
    app.wait_settled().await;
    let row = format!("FROM requests WHERE token_id = {id}");
    for _ in 0..500 {
        if app.scalar(&format!("SELECT COUNT(*) {row}")).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (logged_cost, cached, w5, w1, reasoning, audio_in, audio_out, searches): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sql_row(
        app.db(),
        &format!(
            "SELECT cost_micros, cached_input_tokens, cache_write_5m_tokens, cache_write_1h_tokens,
                    reasoning_tokens, audio_input_tokens, audio_output_tokens, web_search_calls {row}"
        ),
    )
    .await;
    Charged {
        spent: app
            .scalar(&format!(
                "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await,
        absorbed: app
            .scalar(&format!(
                "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger
                 WHERE kind = 'absorbed' AND token_id = {id}"
            ))
            .await,
        logged_cost,
        kinds: (cached, w5, w1, reasoning, audio_in, audio_out, searches),
    }
}

/// Anthropic's usage with reads, both write lifetimes and two web searches: 1000 × 3 +
/// 20 000 × 0.30 + 2000 × 3.75 + 3000 × 6 + 500 × 15 + 2 × 10 000 = 62 000 micros, the
/// same whole or streamed, to an Anthropic or an OpenAI client.
#[tokio::test]
async fn anthropic_cache_writes_of_both_lifetimes_and_web_searches_are_charged_exactly() {
    let app = app().await;
    let expected = Charged {
        spent: 62_000,
        absorbed: 0,
        logged_cost: 62_000,
        kinds: (20_000, 2_000, 3_000, 0, 0, 0, 2),
    };
    for client in [Client::Anthropic, Client::OpenAi] {
        for stream in [false, true] {
            let script = if stream {
                Script {
                    events: Some(stream_events("anthropic", "message.stream.json")),
                    ..Script::default()
                }
            } else {
                Script {
                    body: Some(fixture("anthropic", "message.json")),
                    ..Script::default()
                }
            };
            let mark = json!({"type": "ephemeral", "ttl": "1h"});
            let body = match client {
                Client::Anthropic => json!({"model": "sonnet", "max_tokens": 8000,
                    "system": [{"type": "text", "text": "You are terse.", "cache_control": mark}],
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                    "messages": [{"role": "user", "content": "What is Sluice?"}]}),
                Client::OpenAi => json!({"model": "sonnet", "max_tokens": 8000,
                    "messages": [{"role": "user", "content": [{"type": "text",
                        "text": "What is Sluice?", "cache_control": mark}]}]}),
            };
            let c = charged(&app, client, ANTHROPIC_KEY, script, body, stream).await;
            assert_eq!(c, expected, "{client:?} stream={stream}");
            if client == Client::Anthropic {
                // The web-search tool went upstream with the gateway's cap on its calls.
                let sent = app
                    .mock
                    .state
                    .stats(ANTHROPIC_KEY)
                    .last_bodies
                    .back()
                    .cloned();
                assert_eq!(sent.unwrap()["tools"][0]["max_uses"], 5);
            }
        }
    }
    app.assert_invariant().await;
    // The request log shows finance each kind priced apart, in its API and on its page.
    crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let admin = crate::admin_helpers::login(&app, "root").await;
    let (status, log) = admin.get_json("/admin/api/v1/requests?model=sonnet").await;
    assert_eq!(status, 200);
    let rows = log["requests"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        let kinds = [
            "cached_input_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens",
        ];
        let got: Vec<_> = kinds.iter().map(|k| r[k].as_i64()).collect();
        assert_eq!(got, [Some(20_000), Some(2_000), Some(3_000)], "{r}");
        assert_eq!(r["web_search_calls"], 2, "{r}");
        assert_eq!(r["cost_micros"], 62_000, "{r}");
    }
    let page = admin
        .get("/admin/requests?model=sonnet")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("cached 20000 · 5 m write 2000 · 1 h write 3000 · searches 2"),
        "{page}"
    );
}

/// OpenAI's usage with cached and audio input, reasoning and audio output: 881 × 2.5 +
/// 1025 × 1.25 + 100 × 40 + 58 × 10 + 192 × 10 + 50 × 80 = 13 983.75 → 13 984 micros,
/// the same whole or streamed, to an OpenAI or an Anthropic client.
#[tokio::test]
async fn openai_cached_audio_and_reasoning_tokens_are_charged_exactly() {
    let app = app().await;
    let expected = Charged {
        spent: 13_984,
        absorbed: 0,
        logged_cost: 13_984,
        kinds: (1_025, 0, 0, 192, 100, 50, 0),
    };
    for client in [Client::OpenAi, Client::Anthropic] {
        for stream in [false, true] {
            let script = if stream {
                Script {
                    events: Some(stream_events("openai", "chat.stream.json")),
                    ..Script::default()
                }
            } else {
                Script {
                    body: Some(fixture("openai", "chat.json")),
                    ..Script::default()
                }
            };
            let body = match client {
                Client::OpenAi => json!({"model": "gpt-audio", "max_tokens": 2000,
                    "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
                    "messages": [{"role": "user", "content": "Say hello."}]}),
                Client::Anthropic => json!({"model": "gpt-audio", "max_tokens": 2000,
                    "messages": [{"role": "user", "content": "Say hello."}]}),
            };
            let c = charged(&app, client, OPENAI_KEY, script, body, stream).await;
            assert_eq!(c, expected, "{client:?} stream={stream}");
        }
    }
    app.assert_invariant().await;
}

/// An OpenAI-format upstream answering with `usage`, whole or streamed (content, then a
/// usage chunk).
fn chat_script(usage: Value, stream: bool) -> Script {
    if stream {
        let chunk = |choices: Value, usage: Value| {
            SseEvent::Data(
                json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                "model": "grok-4", "choices": choices, "usage": usage}),
            )
        };
        Script {
            events: Some(vec![
                chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": "Hi"},
                        "finish_reason": "stop"}]),
                    Value::Null,
                ),
                chunk(json!([]), usage),
                SseEvent::Data(json!("[DONE]")),
            ]),
            ..Script::default()
        }
    } else {
        Script {
            body: Some(json!({"id": "c", "object": "chat.completion", "created": 1,
                "model": "grok-4", "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Hi"}}], "usage": usage})),
            ..Script::default()
        }
    }
}

/// xAI's Grok counts its reasoning outside `completion_tokens`, inside `total_tokens`
/// (attack s27 #2): 12 × 2.5 + (1 + 386) × 10 = 3 900 micros, the reasoning logged, the
/// same whole or streamed, to an OpenAI or an Anthropic client — not the 1 output token
/// `completion_tokens` says.
#[tokio::test]
async fn reasoning_reported_beside_completion_tokens_is_charged() {
    let app = app().await;
    let expected = Charged {
        spent: 3_900,
        absorbed: 0,
        logged_cost: 3_900,
        kinds: (0, 0, 0, 386, 0, 0, 0),
    };
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 399,
        "completion_tokens_details": {"reasoning_tokens": 386}});
    for client in [Client::OpenAi, Client::Anthropic] {
        for stream in [false, true] {
            let body = json!({"model": "gpt-audio", "max_tokens": 2000,
                "messages": [{"role": "user", "content": "Say hello."}]});
            let script = chat_script(usage.clone(), stream);
            let c = charged(&app, client, OPENAI_KEY, script, body, stream).await;
            assert_eq!(c, expected, "{client:?} stream={stream}");
        }
    }
    app.assert_invariant().await;
}

/// A router in front of Claude reports its cache writes in OpenAI-format usage, inside
/// `prompt_tokens` (attack s27 #4): OpenRouter's `prompt_tokens_details.cache_write_tokens`
/// and LiteLLM's `cache_creation_input_tokens`. The request marked a 1-hour write, so the
/// unsplit writes are priced at the hour rate: 94 × 3 + 100 × 6 + 2 × 15 = 912 micros,
/// whole or streamed, to an OpenAI or an Anthropic client — not 194 fresh input tokens.
#[tokio::test]
async fn a_routers_cache_writes_are_charged_as_writes() {
    let app = app().await;
    let expected = Charged {
        spent: 912,
        absorbed: 0,
        logged_cost: 912,
        kinds: (0, 0, 100, 0, 0, 0, 0),
    };
    let mark = json!({"type": "ephemeral", "ttl": "1h"});
    for usage in [
        json!({"prompt_tokens": 194, "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 100}}),
        json!({"prompt_tokens": 194, "completion_tokens": 2, "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 0}),
    ] {
        for client in [Client::OpenAi, Client::Anthropic] {
            for stream in [false, true] {
                let body = match client {
                    Client::OpenAi => json!({"model": "routed-sonnet", "max_tokens": 2000,
                        "messages": [{"role": "user", "content": [{"type": "text",
                            "text": "What is Sluice?", "cache_control": mark}]}]}),
                    Client::Anthropic => json!({"model": "routed-sonnet", "max_tokens": 2000,
                        "system": [{"type": "text", "text": "You are terse.", "cache_control": mark}],
                        "messages": [{"role": "user", "content": "What is Sluice?"}]}),
                };
                let script = chat_script(usage.clone(), stream);
                let c = charged(&app, client, ROUTER_KEY, script, body, stream).await;
                assert_eq!(c, expected, "{usage} {client:?} stream={stream}");
            }
        }
    }
    app.assert_invariant().await;
}

/// The reservation of `body` (a Messages request) as the gateway computes it: the counted
/// input (with Claude's tool-use prompt) with the default margin at `input_price` — with `calls` web searches, once per
/// sampling step (`calls + 1`), with each search's results (25 000 tokens,
/// `[finance] server_tool_input_tokens_per_call`) and the output re-read by every step
/// after it — `max_tokens` at `output_price`, and the searches' fee.
fn worst_case(body: &Value, input_price: i64, output_price: i64, calls: i64, fee: i64) -> i64 {
    let messages = body["messages"].as_array().unwrap();
    let mut counted = estimate::chat_input(messages, body.get("tools"));
    if let Some(system) = body.get("system") {
        counted += estimate::count_value(system);
    }
    // Claude (`sonnet`, on Anthropic) reads its tool-use system prompt with any tools.
    if body["model"] == "sonnet" && body.get("tools").is_some() {
        counted += sluice::pipeline::request::TOOL_USE_PROMPT;
    }
    let usage = Usage {
        input: (calls + 1) * pricing::input_with_margin(counted, 1.10, 16)
            + 25_000 * calls * (calls + 1) / 2
            + calls * body["max_tokens"].as_i64().unwrap(),
        output: body["max_tokens"].as_i64().unwrap(),
        web_search_calls: calls,
        ..Usage::default()
    };
    pricing::cost(
        usage,
        Prices {
            input: input_price,
            output: output_price,
            web_search_per_1k_calls: fee,
            ..Prices::default()
        },
    )
}

/// A request with a budget one micro short of its worst case is refused with
/// `insufficient_quota` before anything reaches the upstream; with exactly the worst case
/// it is served. The worst case prices the input at the one-hour cache-write rate only
/// when the request marks a one-hour breakpoint, audio only when audio is asked for, and
/// reserves the web-search fee for every call the tool may make.
#[tokio::test]
async fn the_reservation_covers_the_dearest_kind_the_request_may_cause_to_the_micro() {
    let app = app().await;
    let searching = json!({"model": "sonnet", "max_tokens": 100,
        "system": [{"type": "text", "text": "You are terse.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    // Input at 6 (one-hour writes), output at 15, 3 searches at 10 000 micros each.
    let worst = worst_case(&searching, 6_000_000, 15_000_000, 3, 10_000_000);
    assert!(worst > 30_000, "the searches are reserved: {worst}");
    let plain = json!({"model": "sonnet", "max_tokens": 100,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    let audio = json!({"model": "gpt-audio", "max_tokens": 100,
        "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
        "messages": [{"role": "user", "content": "Say hello."}]});
    // Audio in at 40, audio out at 80.
    let audio_worst = worst_case(&audio, 40_000_000, 80_000_000, 0, 0);
    // Anthropic's automatic caching: one mark at the top of the request (s27 attack,
    // translated money #3: reserved at the plain input rate, billed at the write rate).
    let automatic = json!({"model": "sonnet", "max_tokens": 100,
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]});
    let automatic_worst = worst_case(&automatic, 6_000_000, 15_000_000, 0, 0);
    let answer = Script {
        body: Some(fixture("anthropic", "message.json")),
        ..Script::default()
    };
    for (client, key, body, worst) in [
        (Client::Anthropic, ANTHROPIC_KEY, &searching, worst),
        (Client::OpenAi, OPENAI_KEY, &audio, audio_worst),
        (
            Client::Anthropic,
            ANTHROPIC_KEY,
            &automatic,
            automatic_worst,
        ),
    ] {
        let before = app.mock.state.stats(key).count;
        let (_, short) = app
            .token(
                &format!("short-{key}-{worst}"),
                Some(&pricing::usd(worst - 1)),
            )
            .await;
        let resp = match client {
            Client::OpenAi => app.chat(&short, body).await,
            Client::Anthropic => app.messages(&short, body).await,
        };
        assert_eq!(resp.status(), 429, "{client:?}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err.to_string().contains("insufficient_quota"),
            "{client:?}: {err}"
        );
        assert_eq!(
            app.mock.state.stats(key).count,
            before,
            "nothing sent upstream"
        );
        // Exactly the worst case is enough.
        let (_, exact) = app
            .token(&format!("exact-{key}-{worst}"), Some(&pricing::usd(worst)))
            .await;
        let script = if client == Client::Anthropic {
            answer.clone()
        } else {
            Script {
                body: Some(fixture("openai", "chat.json")),
                ..Script::default()
            }
        };
        app.mock.state.script(key, [script]);
        let resp = match client {
            Client::OpenAi => app.chat(&exact, body).await,
            Client::Anthropic => app.messages(&exact, body).await,
        };
        assert_eq!(resp.status(), 200, "{client:?}");
        assert_eq!(app.mock.state.stats(key).count, before + 1);
    }
    // Without a cache mark or a search tool the same budget buys the plain request: the
    // dearer rates are reserved only when asked for.
    let plain_worst = worst_case(&plain, 3_000_000, 15_000_000, 0, 0);
    assert!(plain_worst < worst);
    let (_, token) = app.token("plain", Some(&pricing::usd(plain_worst))).await;
    app.mock.state.script(ANTHROPIC_KEY, [answer]);
    assert_eq!(app.messages(&token, &plain).await.status(), 200);
    app.assert_invariant().await;
}

/// OpenAI's `web_search_options` makes searches the gateway cannot cap: refused naming it.
#[tokio::test]
async fn a_web_search_the_gateway_cannot_cap_is_refused_naming_the_field() {
    let app = app().await;
    let (_, token) = app.token("search", Some("1")).await;
    let resp = app
        .chat(
            &token,
            &json!({"model": "gpt-audio", "max_tokens": 10, "web_search_options": {},
                "messages": [{"role": "user", "content": "news?"}]}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["param"], "web_search_options", "{err}");
    assert_eq!(app.mock.state.stats(OPENAI_KEY).count, 0);
    app.assert_invariant().await;
}

/// Review finding (s16): a prompt marked for a cache write (`cache_control`, five-minute or
/// one-hour) whose client left while Anthropic worked on it was charged its reserved input
/// at the plain input rate (3 USD per Mtok), though Anthropic bills a marked prompt it
/// processed at the write rate (3.75 for five minutes, 6 for an hour) and the reservation
/// held that rate. A departure pays the input the reservation held at the rate it held:
/// the dearest write the request marked — streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departure_of_a_prompt_marked_for_a_cache_write_pays_the_write_rate() {
    let app = app().await;
    let text = "The engine light blinks twice, then once. ".repeat(200);
    app.mock.state.sticky(
        ANTHROPIC_KEY,
        Some(Script {
            delay_ms: 3_600_000,
            ..Script::default()
        }),
    );
    let mut had = 0;
    for (ttl, rate) in [("1h", 6_000_000), ("5m", 3_750_000)] {
        for stream in [false, true] {
            let case = format!("ttl={ttl} stream={stream}");
            let (id, token) = app.token(&format!("left-{ttl}-{stream}"), Some("1")).await;
            let body = json!({"model": "sonnet", "max_tokens": 100, "stream": stream,
                "system": [{"type": "text", "text": text,
                    "cache_control": {"type": "ephemeral", "ttl": ttl}}],
                "messages": [{"role": "user", "content": "What is Sluice?"}]});
            had += 1;
            {
                let send = app.messages(&token, &body);
                tokio::pin!(send);
                tokio::select! {
                    _ = &mut send => panic!("{case}: answered while the upstream holds it"),
                    _ = async {
                        for _ in 0..500 {
                            if app.mock.state.stats(ANTHROPIC_KEY).count >= had {
                                return;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        }
                        panic!("{case}: the upstream never had the request");
                    } => {}
                }
            }
            // The row and the settlement land apart once the client has left.
            app.wait_for_log_rows(had as i64).await;
            app.wait_settled().await;
            let (input, cost): (i64, i64) = sql_row(
                app.db(),
                &format!("SELECT input_tokens, cost_micros FROM requests WHERE token_id = {id}"),
            )
            .await;
            assert!(input > 1_000, "{case}: {input}");
            let want = (input * rate + 999_999) / 1_000_000;
            let spent = app
                .scalar(&format!(
                    "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
                ))
                .await;
            assert_eq!((cost, spent), (want, want), "{case}: {input} tokens");
        }
    }
    app.mock.state.sticky(ANTHROPIC_KEY, None);
    app.assert_invariant().await;
}

/// A streamed answer cut after `cut` of `deltas` (each the `delta` of one OpenAI chunk,
/// after a role chunk): the request row's output tokens, audio output tokens and cost.
async fn cut_stream(
    app: &TestApp,
    name: &str,
    body: &Value,
    deltas: Vec<Value>,
    cut: usize,
) -> (i64, i64, i64) {
    let (id, token) = app.token(name, Some("10")).await;
    let chunk = |delta: Value, finish: Value| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-audio", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": null}),
        Value::Null,
    )];
    events.extend(deltas.into_iter().map(|d| chunk(d, Value::Null)));
    events.push(chunk(json!({}), json!("stop")));
    events.push(SseEvent::Data(
        json!({"id": "c", "object": "chat.completion.chunk",
        "created": 1, "model": "gpt-audio", "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5000}}),
    ));
    app.mock.state.script(
        OPENAI_KEY,
        [Script {
            events: Some(events),
            cut_after: Some(cut),
            ..Script::default()
        }],
    );
    let mut body = body.clone();
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200, "{name}");
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("upstream_error"),
        "{name}: the cut is told: {text}"
    );
    app.wait_settled().await;
    let rows = format!("SELECT COUNT(*) FROM requests WHERE token_id = {id}");
    for _ in 0..500 {
        if app.scalar(&rows).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    sql_row(
        app.db(),
        &format!(
            "SELECT output_tokens, audio_output_tokens, cost_micros FROM requests WHERE token_id = {id}"
        ),
    )
    .await
}

/// Output the upstream streams outside `content` — an audio answer's transcript and audio
/// data, a legacy `functions` call's name and arguments, Mistral's thinking parts — is
/// counted as text is: a stream cut before its usage is charged the input and the output
/// it received, more than a stream cut before any output.
#[tokio::test]
async fn output_streamed_outside_content_is_charged_when_the_stream_is_cut() {
    let app = app().await;
    let audio = json!({"model": "gpt-audio", "max_tokens": 2000,
        "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
        "messages": [{"role": "user", "content": "Say hello."}]});
    let functions = json!({"model": "gpt-audio", "max_tokens": 2000,
        "functions": [{"name": "lookup", "parameters": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Look it up."}]});
    let data = "A".repeat(4096);
    let sound = (0..20)
        .map(|_| json!({"audio": {"id": "a1", "data": data, "transcript": "The engine light blinks. "}}))
        .collect::<Vec<_>>();
    let call = std::iter::once(json!({"function_call": {"name": "lookup", "arguments": ""}}))
        .chain(
            (0..19)
                .map(|_| json!({"function_call": {"arguments": "{\"query\": \"engine light\"} "}})),
        )
        .collect::<Vec<_>>();
    let thinking = (0..20)
        .map(|_| {
            json!({"content": [{"type": "thinking",
            "thinking": [{"type": "text", "text": "The engine light blinks. "}]}]})
        })
        .collect::<Vec<_>>();
    for (name, body, deltas) in [
        ("audio", &audio, sound),
        ("function_call", &functions, call),
        ("thinking", &functions, thinking),
    ] {
        let (nothing, _, nothing_cost) =
            cut_stream(&app, &format!("{name}-none"), body, deltas.clone(), 1).await;
        assert_eq!(nothing, 0, "{name}: cut before any output");
        let (output, audio_out, cost) = cut_stream(&app, name, body, deltas, 11).await;
        assert!(output > 0, "{name}: the output received is counted");
        assert!(
            cost > nothing_cost,
            "{name}: {cost} charged, {nothing_cost} without output"
        );
        assert_eq!(
            audio_out > 0,
            name == "audio",
            "{name}: audio counted as audio"
        );
    }
    app.assert_invariant().await;
}

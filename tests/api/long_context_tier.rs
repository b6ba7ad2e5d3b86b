//! Long-context tiers at settlement: the gateway reserves at the tier's rates a prompt whose
//! reserved input may pass a model's long-context threshold (`provider_may_count`), but the
//! provider's tokenizer can count past it what the gateway counted further below. Such an
//! answer is priced at the tier's rates (Claude
//! Sonnet 4.5: every token at 2× input and 1.5× output), streamed or not, and what passes
//! the reservation is absorbed, so the ledger is the bill.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::{PriceKeys, Provider, RouteSettings, UpstreamSettings};
use sluice::mock::{MockServer, Script, SseEvent};

use crate::helpers::*;
use crate::server_tools::{app, spent_and_absorbed, KEY};
use sluice::cli::IssueArgs;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const ARN: &str = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3";

/// An app with `upstreams` (made on its mock) and one more model, `name` over `routes` at
/// `input` / `output` USD per Mtok, taking up to a million input tokens.
async fn app_serving(
    upstreams: impl FnOnce(&MockServer) -> Vec<UpstreamSettings>,
    name: &str,
    routes: Vec<RouteSettings>,
    (input, output): (f64, f64),
) -> TestApp {
    spawn_app_with(|s, mock| {
        s.upstreams.extend(upstreams(mock));
        let mut m = model(name, &[]);
        m.routes = routes;
        m.price = PriceKeys::usd(input, output);
        m.max_input_tokens = 1_000_000;
        s.models.push(m);
    })
    .await
}

/// An app serving Gemini 2.5 Pro (1.25 / 10 USD per Mtok, its tier above 200 000 input
/// tokens) from a Gemini upstream with `key`, taking up to a million input tokens.
async fn gemini_pro(key: &str) -> TestApp {
    gemini_pro_on(Provider::Gemini, key, 1_000_000).await
}

/// Gemini 2.5 Pro served by an upstream of `provider`'s wire format with `key` (Google's
/// OpenAI-compatible endpoint, an Anthropic-format proxy), taking up to `max_input` tokens.
async fn gemini_pro_on(provider: Provider, key: &str, max_input: u32) -> TestApp {
    spawn_app_with(|s, mock| {
        let mut g = native_upstream(provider, "g", key, mock);
        if provider == Provider::OpenaiCompatible {
            g.base_url = format!("{}/v1", mock.base_url());
        }
        s.upstreams.push(g);
        let mut m = model("gemini-2.5-pro", &[]);
        m.routes = vec![route("g", "gemini-2.5-pro")];
        m.price = PriceKeys::usd(1.25, 10.0);
        m.max_input_tokens = max_input;
        s.models.push(m);
    })
    .await
}

/// Models of the given names, each over its one route, at 3 / 15 USD per Mtok and taking up
/// to a million input tokens; each `(from, to)` of `fallbacks` falls back from one to another.
fn models_over(
    s: &mut sluice::config::Settings,
    routes: Vec<(&str, RouteSettings)>,
    fallbacks: &[(&str, &str)],
) {
    for (name, r) in routes {
        let mut m = model(name, &[]);
        m.routes = vec![r];
        m.price = PriceKeys::usd(3.0, 15.0);
        m.max_input_tokens = 1_000_000;
        m.fallbacks = (fallbacks.iter())
            .filter(|(from, _)| *from == name)
            .map(|(_, to)| to.to_string())
            .collect();
        s.models.push(m);
    }
}

/// What one request cost its token once settled, and the upstream that served it.
struct Billed {
    id: i64,
    charged: i64,
    absorbed: i64,
    upstream: Option<String>,
}

/// Sends `body` to `path` with a new 100-USD token of `user`, Claude's 1M-token window
/// turned on, while `key`'s upstream reports `input` tokens in and 10 out; the answer is a 200.
async fn billed(
    app: &TestApp,
    user: &str,
    (key, input): (&str, i64),
    path: &str,
    body: &Value,
) -> Billed {
    billed_with(app, user, (key, input), (path, true), body).await
}

/// `billed`, with Claude's 1M-token window turned on or not (`window_1m`).
async fn billed_with(
    app: &TestApp,
    user: &str,
    (key, input): (&str, i64),
    (path, window_1m): (&str, bool),
    body: &Value,
) -> Billed {
    let (id, token) = app.token(user, Some("100")).await;
    app.mock.state.script(
        key,
        [Script {
            prompt_tokens: Some(input),
            completion_tokens: Some(10),
            ..Script::default()
        }],
    );
    let resp = if window_1m {
        app.send_1m(path, &token, body).await
    } else {
        app.send(path, &token, body).await
    };
    assert_eq!(resp.status(), 200, "{user}");
    let upstream = resp
        .headers()
        .get("x-sluice-upstream")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    resp.text().await.unwrap();
    let (charged, absorbed) = spent_and_absorbed(app, id).await;
    Billed {
        id,
        charged,
        absorbed,
        upstream,
    }
}

/// A question about an attached corpus, of `model`, capped at 10 output tokens.
fn corpus_question(model: &str) -> Value {
    json!({"model": model, "max_tokens": 10,
        "messages": [{"role": "user", "content": "Summarise the attached corpus."}]})
}

#[tokio::test]
async fn an_answer_reported_past_the_tier_is_priced_at_its_rates_and_the_rest_absorbed() {
    let app = app().await;
    for (n, stream) in [(1, false), (2, true)] {
        let mut body = corpus_question("sonnet-long");
        body["stream"] = json!(stream);
        let b = billed(
            &app,
            &format!("long-{stream}"),
            (KEY, 210_000),
            MESSAGES,
            &body,
        )
        .await;
        // 210 000 × 6 + 10 × 22.50 micro-dollars per token-million: what Anthropic bills.
        assert_eq!(b.charged + b.absorbed, 1_260_225, "stream={stream}");
        assert!(
            b.absorbed > 0,
            "stream={stream}: the reservation covered a small prompt"
        );
        app.wait_for_log_rows(n).await;
        let logged = app
            .scalar(&format!(
                "SELECT cost_micros FROM requests WHERE token_id = {}",
                b.id
            ))
            .await;
        assert_eq!(logged, 1_260_225, "stream={stream}");
    }
    app.assert_invariant().await;
}

/// A prompt counted below the threshold but within the provider tokenizer's reach of it
/// (Claude's counts up to ~1.35× o200k) is reserved at the tier's rates: when the provider
/// then reports it past the threshold, the reservation holds the dearer rates for the input
/// it counted, and only what the provider counted beyond the reserved input is absorbed —
/// not the whole jump of the tier.
#[tokio::test]
async fn a_prompt_the_providers_tokenizer_may_count_past_the_tier_is_reserved_at_its_rates() {
    let app = app().await;
    // ~150 000 tokens counted, ~165 000 reserved with the margin: under 200 000.
    let body = json!({"model": "sonnet-long", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi ".repeat(150_000)}]});
    let b = billed(&app, "near-tier", (KEY, 210_000), MESSAGES, &body).await;
    assert_eq!(b.charged + b.absorbed, 1_260_225);
    // The reservation (all of it charged) priced its ≥ 150 000 input tokens at 6 USD per
    // Mtok, the tier's, not at 3.
    assert!(
        b.charged >= 150_000 * 6,
        "charged {}, absorbed {}",
        b.charged,
        b.absorbed
    );
    app.assert_invariant().await;
}

/// A route whose upstream model name is no bundled model's (a Bedrock inference-profile
/// ARN, a custom deployment) takes the tier of the model it serves by the gateway's name
/// (`claude-sonnet-4-5`, bundled with a tier above 200 000): an answer reported past the
/// threshold is priced at the tier's rates, not at the standard ones.
#[tokio::test]
async fn a_route_to_an_unbundled_upstream_name_takes_the_tier_of_its_gateway_model() {
    let app = app_serving(
        |mock| vec![native_upstream(Provider::Anthropic, "an", KEY, mock)],
        "claude-sonnet-4-5",
        vec![route("an", ARN)],
        (3.0, 15.0),
    )
    .await;
    let body = corpus_question("claude-sonnet-4-5");
    let b = billed(&app, "arn", (KEY, 210_000), MESSAGES, &body).await;
    // 210 000 × 6 + 10 × 22.50, as for the bundled upstream name above.
    assert_eq!(b.charged + b.absorbed, 1_260_225);
    app.assert_invariant().await;
}

/// Finding 4: the gateway model's name decides a route's tier only where the route's
/// provider serves that name's family. `claude-sonnet-4` (Anthropic's, tiered above 200 000)
/// falling back to a vLLM route serving `qwen2.5-72b-instruct` is billed as vLLM bills it:
/// no tier, 210 000 input tokens at the model's 3 USD, not at Claude's 6.
#[tokio::test]
async fn a_fallback_route_to_another_family_is_charged_without_the_gateway_names_tier() {
    const KEY_Q: &str = "sk-vllm-qwen-route-0123";
    let app = app_serving(
        |mock| {
            let mut vllm = upstream("vllm", KEY_Q, mock);
            vllm.provider = Provider::OpenaiCompatible;
            vec![native_upstream(Provider::Anthropic, "an", KEY, mock), vllm]
        },
        "claude-sonnet-4",
        vec![
            route("an", "claude-sonnet-4-20250514"),
            route("vllm", "qwen2.5-72b-instruct"),
        ],
        (3.0, 15.0),
    )
    .await;
    app.mock.state.sticky(
        KEY,
        Some(Script {
            status: Some(500),
            ..Script::default()
        }),
    );
    let body = corpus_question("claude-sonnet-4");
    let b = billed(&app, "qwen", (KEY_Q, 210_000), CHAT, &body).await;
    assert_eq!(b.upstream.as_deref(), Some("vllm"));
    // 210 000 × 3 + 10 × 15: the standard rates (Claude's tier would make it 1 260 225).
    assert_eq!(b.charged + b.absorbed, 630_150);
    app.assert_invariant().await;
}

/// An alias gateway name (`smart`) over a Bedrock inference-profile ARN: neither name is
/// a bundled model's, so only the route's `tier_model` says which tier Bedrock bills —
/// Claude Sonnet 4.5's, 2× input and 1.5× output above 200 000.
#[tokio::test]
async fn an_alias_over_an_arn_with_tier_model_is_charged_the_named_tier() {
    let app = app_serving(
        |mock| vec![bedrock_upstream("br", "AKIDSMART", mock)],
        "smart",
        vec![RouteSettings {
            tier_model: Some("claude-sonnet-4-5".into()),
            ..route("br", ARN)
        }],
        (3.0, 15.0),
    )
    .await;
    let body = corpus_question("smart");
    let b = billed(&app, "smart", ("AKIDSMART", 210_000), CHAT, &body).await;
    // 210 000 × 6 + 10 × 22.50: the tier Bedrock bills Sonnet 4.5 at.
    assert_eq!(b.charged + b.absorbed, 1_260_225);
    app.assert_invariant().await;
}

/// A `tier_model` the bundled table does not hold stops `check-config` and `serve`, naming
/// the key and the name (a misspelt tier would otherwise bill no tier at all).
#[tokio::test]
async fn an_unknown_tier_model_stops_check_config_and_the_start_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let write = |tier: &str| {
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite://{}/sluice.db\"\n\
                 [[upstreams]]\nid = \"an\"\nprovider = \"anthropic\"\n\
                 base_url = \"http://127.0.0.1:9\"\napi_key = \"sk-ant-test-0123456789\"\n\
                 allow_private_network = true\n[[models]]\nname = \"smart\"\n\
                 input_usd_per_mtok = 3\noutput_usd_per_mtok = 15\n\
                 routes = [{{ upstream = \"an\", model = \"{ARN}\", tier_model = \"{tier}\" }}]\n",
                dir.path().display()
            ),
        )
        .unwrap()
    };
    write("claude-sonnet-4.5");
    assert_start_refused(&config, &["tier_model", "claude-sonnet-4.5"]).await;
    write("claude-sonnet-4-5");
    assert_config_accepted(&config).await;
}

/// Finding 5: Gemini's tokenizer splits every digit into a token of its own, where o200k
/// takes digits three at a time — a digit-heavy prompt counts about 3× on Gemini, past any
/// flat factor. On a Gemini route each ASCII digit is counted as one token on top of the
/// gateway's count: 240 000 digits (~80 000 o200k tokens) that Gemini 2.5 Pro reports as
/// 240 010 input tokens, past its 200 000 threshold, are reserved at the tier's rates for
/// at least that input, and the answer is charged in full — nothing absorbed.
#[tokio::test]
async fn a_digit_heavy_prompt_on_gemini_is_reserved_for_what_gemini_counts() {
    const KEY_G: &str = "gem-key-digits-0123456789";
    let app = gemini_pro(KEY_G).await;
    let digits = "0123456789".repeat(24_000);
    assert!(sluice::quota::estimate::count_text(&digits) <= 80_001);
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10,
        "messages": [{"role": "user", "content": digits}]});
    let b = billed(&app, "digits", (KEY_G, 240_010), CHAT, &body).await;
    // 240 010 × 2.50 + 10 × 15: Gemini 2.5 Pro's tier (2× input, 1.5× output).
    assert_eq!(b.charged + b.absorbed, 600_175);
    assert_eq!(
        b.absorbed, 0,
        "the reservation fell short of Gemini's count"
    );
    app.assert_invariant().await;
}

/// Review finding (s16): a digit-heavy Gemini prompt that ends before its answer — its
/// client left, its deadline cut the attempt off, the stream stalled before Gemini reported
/// its input — was charged the gateway's count without its digits (~80 000 tokens), at the
/// standard rates (~100 000 µ$), though its reservation counted each digit as Gemini does
/// and held the tier (Gemini bills 240 010 tokens at 2.50 USD here, 600 025 µ$). A
/// departure pays the input reserved for it, digits included, with its tier decided as the
/// reservation decides it (DESIGN "a departure is charged the reservation's input").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digit_heavy_gemini_prompt_that_ends_before_its_answer_pays_its_digits_at_the_tier() {
    const KEY_G: &str = "gem-key-departs-0123456789";
    let app = spawn_app_with(|s, mock| {
        s.upstream.stream_idle_timeout_ms = 500;
        let mut g = upstream("g", KEY_G, mock);
        g.provider = Provider::Gemini;
        g.base_url = mock.base_url();
        s.upstreams.push(g);
        let mut m = model("gemini-2.5-pro", &["g"]);
        m.routes = vec![route("g", "gemini-2.5-pro")];
        m.price.input_usd_per_mtok = Some(1.25.into());
        m.price.output_usd_per_mtok = Some(10.0.into());
        m.max_input_tokens = 1_000_000;
        s.models.push(m);
    })
    .await;
    let message = json!({"role": "user", "content": "0123456789".repeat(24_000)});
    let reserved =
        sluice::quota::estimate::chat_input(std::slice::from_ref(&message), None) + 240_000;
    // Gemini 2.5 Pro's tier: 2.50 USD per Mtok in, 15 out.
    let at_tier =
        |input: i64, output: i64| (input * 2_500_000 + output * 15_000_000 + 999_999) / 1_000_000;
    let had = |n: u64| {
        let app = &app;
        async move {
            for _ in 0..500 {
                if app.mock.state.total_count() >= n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("the upstream never had the request");
        }
    };
    let row = |id: i64| {
        let app = &app;
        async move {
            app.wait_settled().await;
            app.wait_for_row_of(id).await;
            let (input, output, cost): (i64, i64, i64) = sql_row(
                app.db(),
                &format!(
                    "SELECT input_tokens, output_tokens, cost_micros FROM requests \
                     WHERE token_id = {id}"
                ),
            )
            .await;
            let charged = app
                .scalar(&format!(
                    "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
                ))
                .await;
            (input, output, cost, charged)
        }
    };
    let body = |stream: bool| {
        json!({"model": "gemini-2.5-pro", "max_tokens": 10, "stream": stream,
            "messages": [message.clone()]})
    };

    // The client leaves while Gemini holds its answer.
    let (id, token) = app.token("left", Some("100")).await;
    app.mock.state.sticky(
        KEY_G,
        Some(Script {
            delay_ms: 3_600_000,
            ..Script::default()
        }),
    );
    {
        let left = body(false);
        let send = app.chat(&token, &left);
        tokio::pin!(send);
        tokio::select! {
            _ = &mut send => panic!("answered while the upstream holds it"),
            _ = had(1) => {}
        }
    }
    let want = at_tier(reserved, 0);
    assert_eq!(row(id).await, (reserved, 0, want, want), "left");

    // Its own deadline cuts the attempt off after Gemini had it.
    let (id, token) = app.token("cut", Some("100")).await;
    app.mock.state.sticky(
        KEY_G,
        Some(Script {
            delay_ms: 8_000,
            ..Script::default()
        }),
    );
    // Deadline counted from arrival: room for counting 240 000 digits in a debug build.
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-request-deadline-ms", "3000")
        .json(&body(false))
        .send()
        .await
        .unwrap();
    resp.bytes().await.unwrap();
    assert_eq!(app.mock.state.total_count(), 2, "the upstream had it");
    assert_eq!(row(id).await, (reserved, 0, want, want), "cut");

    // The stream stalls before Gemini reports its usage (its last chunk).
    let (id, token) = app.token("stall", Some("100")).await;
    app.mock.state.sticky(
        KEY_G,
        Some(Script {
            text: Some("The engine light blinks again tonight".into()),
            stall_after: Some(2),
            ..Script::default()
        }),
    );
    let resp = app.chat(&token, &body(true)).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = tokio::time::timeout(std::time::Duration::from_secs(10), sse_data(resp))
        .await
        .expect("the gateway ended the stalled stream");
    let output = sluice::quota::estimate::count_text(&reassemble(&data));
    assert!(output > 0);
    let want = at_tier(reserved, output);
    assert_eq!(row(id).await, (reserved, output, want, want), "stall");
    app.mock.state.sticky(KEY_G, None);
    app.assert_invariant().await;
}

/// An answer whose usage leaves its input out is charged the gateway's count of it; when the
/// provider's tokenizer may count that past the threshold, the tier is decided as for the
/// reservation and a departure (`provider_may_count`): with its 1M-token window on, Claude
/// may count these ~150 000 o200k tokens as 225 000, and bills them at the tier's 6 USD.
/// Before, the count was priced at the standard 3 USD, half of what the reservation held.
/// Without the window Claude refuses a prompt past 200 000 tokens — one it answered was
/// billed at the standard rates, and so it is charged (attack finding, s16: the factor had
/// priced it at the tier regardless).
#[tokio::test]
async fn an_answer_without_its_input_counted_within_the_providers_reach_of_the_tier_is_priced_at_its_rates_if_it_can_reach_it(
) {
    let app = app().await;
    let message = json!({"role": "user", "content": "hi ".repeat(150_000)});
    let counted = sluice::quota::estimate::chat_input(std::slice::from_ref(&message), None);
    assert!((140_000..200_000).contains(&counted), "{counted}");
    let said = "A summary.";
    let start = json!({"type": "message_start", "message": {"id": "msg_t", "type": "message",
        "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": {"output_tokens": 1}}});
    let events = json!([
        ["message_start", start],
        ["content_block_start", {"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": said}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 0}],
        ["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
            "stop_sequence": null}, "usage": {"output_tokens": 4}}],
        ["message_stop", {"type": "message_stop"}]
    ]);
    let whole = json!({"id": "msg_t", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": said}],
        "stop_reason": "end_turn", "stop_sequence": null, "usage": {"output_tokens": 4}});
    let cases = [(false, true), (true, true), (false, false), (true, false)];
    for (n, (stream, wide)) in (1..).zip(cases) {
        let (id, token) = app
            .token(&format!("no-input-{stream}-{wide}"), Some("100"))
            .await;
        let script = if stream {
            Script {
                events: Some(
                    events
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| SseEvent::Named(e[0].as_str().unwrap().into(), e[1].clone()))
                        .collect(),
                ),
                ..Script::default()
            }
        } else {
            Script {
                body: Some(whole.clone()),
                ..Script::default()
            }
        };
        app.mock.state.script(KEY, [script]);
        let body = json!({"model": "sonnet-long", "max_tokens": 10, "stream": stream,
            "messages": [message.clone()]});
        let resp = if wide {
            app.send_1m(MESSAGES, &token, &body).await
        } else {
            app.send(MESSAGES, &token, &body).await
        };
        assert_eq!(resp.status(), 200, "stream={stream}");
        resp.text().await.unwrap();
        app.wait_for_log_rows(n).await;
        let (charged, absorbed) = spent_and_absorbed(&app, id).await;
        // With the window every input token at the tier's 6 USD and the 4 output tokens at
        // its 22.50; without it at the standard 3 and 15.
        let (input_rate, output_rate) = if wide {
            (6_000_000, 22_500_000)
        } else {
            (3_000_000, 15_000_000)
        };
        let want = (counted * input_rate + 4 * output_rate + 999_999) / 1_000_000;
        assert_eq!(
            (charged, absorbed),
            (want, 0),
            "stream={stream} wide={wide}"
        );
        let (input, code): (i64, Option<String>) = sql_row(
            app.db(),
            &format!("SELECT input_tokens, error_code FROM requests WHERE token_id = {id}"),
        )
        .await;
        assert_eq!(
            (input, code.as_deref()),
            (counted, Some("usage_estimated")),
            "stream={stream}"
        );
    }
    app.assert_invariant().await;
}

/// The estimate charged for a Gemini answer that left its input out counts each digit as
/// Gemini does, as the reservation counts it: 240 000 digits (~80 000 o200k tokens) are
/// 240 010 tokens to Gemini, past its 200 000 threshold. Before, the estimate was the
/// gateway's count alone, at the standard rates: 100 089 µ$ where Gemini bills ~600 000.
#[tokio::test]
async fn a_digit_heavy_gemini_answer_without_its_input_is_charged_its_digits() {
    const KEY_G: &str = "gem-key-estimate-0123456789";
    let app = gemini_pro(KEY_G).await;
    let message = json!({"role": "user", "content": "0123456789".repeat(24_000)});
    let counted =
        sluice::quota::estimate::chat_input(std::slice::from_ref(&message), None) + 240_000;
    let (id, token) = app.token("estimate", Some("100")).await;
    app.mock.state.script(
        KEY_G,
        [Script {
            body: Some(json!({"candidates": [{"content": {"role": "model",
                "parts": [{"text": "Digits."}]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"candidatesTokenCount": 7}, "modelVersion": "gemini-2.5-pro",
                "responseId": "r1"})),
            ..Script::default()
        }],
    );
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10, "messages": [message]});
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    app.wait_for_log_rows(1).await;
    // Gemini 2.5 Pro's tier: 2.50 USD per Mtok in, 15 out.
    let at_tier = (counted * 2_500_000 + 7 * 15_000_000 + 999_999) / 1_000_000;
    assert_eq!(spent_and_absorbed(&app, id).await, (at_tier, 0));
    let input = app
        .scalar(&format!(
            "SELECT input_tokens FROM requests WHERE token_id = {id}"
        ))
        .await;
    assert_eq!(input, counted);
    app.assert_invariant().await;
}

/// A Gemini request with a document of unknown size reserves (and, leaving before its
/// answer, pays) the model's whole input: its digits are part of that input, not beyond it
/// (attack finding, s16: the digits were added after the document's bound, so a departure
/// paid 30 000 tokens past the model's window, more than any prompt Gemini accepts).
#[tokio::test]
async fn a_gemini_departure_with_a_document_pays_no_more_than_the_models_whole_input() {
    const KEY_G: &str = "gem-key-document-0123456789";
    let app = gemini_pro(KEY_G).await;
    let (id, token) = app.token("document", Some("100")).await;
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10, "messages": [{"role": "user",
        "content": [{"type": "document", "source": {"type": "base64",
            "media_type": "application/pdf", "data": crate::documents::b64(&crate::documents::pdf(2))}},
            {"type": "text", "text": "0123456789".repeat(3_000)}]}]});
    leave_while_upstream_works(&app, KEY_G, 1, app.messages(&token, &body)).await;
    app.wait_settled().await;
    app.wait_for_row_of(id).await;
    // The model's whole input (1 000 000 tokens) at Gemini 2.5 Pro's tier, 2.50 USD.
    assert_eq!(spent_and_absorbed(&app, id).await, (2_500_000, 0));
    let input = app
        .scalar(&format!(
            "SELECT input_tokens FROM requests WHERE token_id = {id}"
        ))
        .await;
    assert_eq!(input, 1_000_000);
    app.mock.state.sticky(KEY_G, None);
    app.assert_invariant().await;
}

/// Attack finding (s16c): Gemini served through another wire format — Google's
/// OpenAI-compatible endpoint, an Anthropic-format proxy — took Gemini's tier from its
/// model's name but counted its prompt as the wire format's provider would: no digits, and
/// on the Anthropic format within Claude's 200 000-token window, so Gemini's tier was out of
/// reach. The digit-heavy prompt Gemini reports as 240 010 tokens was reserved at the
/// standard rates and ~490 000 µ$ of its 600 175 absorbed. The tokenizer is the model's
/// family's, whatever the wire.
#[tokio::test]
async fn a_digit_heavy_gemini_prompt_through_another_wire_format_is_reserved_for_what_gemini_counts(
) {
    const KEY_G: &str = "gem-key-wire-0123456789";
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10,
        "messages": [{"role": "user", "content": "0123456789".repeat(24_000)}]});
    for (provider, window_1m) in [
        (Provider::OpenaiCompatible, false),
        (Provider::Anthropic, false),
        (Provider::Anthropic, true),
    ] {
        let app = gemini_pro_on(provider, KEY_G, 1_000_000).await;
        let b = billed_with(&app, "wire", (KEY_G, 240_010), (CHAT, window_1m), &body).await;
        // 240 010 × 2.50 + 10 × 15: Gemini 2.5 Pro's tier.
        assert_eq!(
            (b.charged + b.absorbed, b.absorbed),
            (600_175, 0),
            "{provider:?} 1M={window_1m}: the reservation fell short of Gemini's count"
        );
        app.assert_invariant().await;
    }
}

/// Attack finding (s16c): a Claude request with a document reserves, and leaving before its
/// answer pays, the model's whole input — 1 000 000 tokens configured here for clients that
/// turn the 1M window on. Without the window (on Anthropic without the beta, on Bedrock
/// always) Claude refuses a prompt past 200 000 tokens, so it can bill no more: the
/// departure is bounded there (the reservation is not: what serves the route may keep no
/// window, `a_claude_route_that_serves_past_its_window_without_the_beta_is_reserved_in_full`).
/// Before, its departure was charged 3 000 000 µ$, five times what Claude can bill.
#[tokio::test]
async fn a_claude_departure_with_a_document_pays_no_more_than_the_window_claude_serves() {
    const KEY_A: &str = "claude-key-window-0123456789";
    const KEY_BR: &str = "AKIDWINDOW";
    let app = spawn_app_with(|s, mock| {
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "anth", KEY_A, mock));
        s.upstreams.push(bedrock_upstream("br", KEY_BR, mock));
        let sonnet_br = "anthropic.claude-sonnet-4-5-20250929-v1:0";
        let routes = vec![
            ("sonnet-a", route("anth", "claude-sonnet-4-5")),
            ("sonnet-br", route("br", sonnet_br)),
            ("nova-br", route("br", "amazon.nova-premier-v1:0")),
            ("sonnet-46", route("anth", "claude-sonnet-4-6")),
        ];
        models_over(s, routes, &[]);
    })
    .await;
    let question = |model: &str| {
        json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                "data": crate::documents::b64(&crate::documents::pdf(2))}},
            {"type": "text", "text": "What does it say?"}]}]})
    };
    // (model, key, the 1M window asked for, the input charged, its cost)
    let cases = [
        ("sonnet-a", KEY_A, false, 200_000, 600_000),
        ("sonnet-br", KEY_BR, false, 200_000, 600_000),
        ("sonnet-br", KEY_BR, true, 200_000, 600_000),
        // With the window on, Anthropic may bill the whole input, at Sonnet 4.5's tier.
        ("sonnet-a", KEY_A, true, 1_000_000, 6_000_000),
        // A model no name says is Claude's has no Claude window, on Bedrock too (review
        // finding, s17: Nova Premier, 1M tokens, was bounded at 200 000 — 600 000 µ$).
        ("nova-br", KEY_BR, false, 1_000_000, 3_000_000),
        // Claude 4.6 and later serve their whole 1M window without the beta: no window
        // (review finding, s18: it was bounded at 200 000 — 600 000 µ$ of 3 000 000).
        ("sonnet-46", KEY_A, false, 1_000_000, 3_000_000),
    ];
    for (n, (model, key, window_1m, input, cost)) in cases.into_iter().enumerate() {
        let case = format!("{model} 1M={window_1m}");
        let (id, token) = app.token(&format!("doc-{n}"), Some("100")).await;
        let body = question(model);
        let send = async {
            if window_1m {
                app.send_1m(MESSAGES, &token, &body).await
            } else {
                app.send(MESSAGES, &token, &body).await
            }
        };
        leave_while_upstream_works(&app, key, n as u64 + 1, send).await;
        app.wait_for_log_rows(n as i64 + 1).await;
        assert_eq!(spent_and_absorbed(&app, id).await, (cost, 0), "{case}");
        let logged = app
            .scalar(&format!(
                "SELECT input_tokens FROM requests WHERE token_id = {id}"
            ))
            .await;
        assert_eq!(logged, input, "{case}");
        app.mock.state.sticky(key, None);
    }
    app.assert_invariant().await;
}

/// Review finding (s17): Gemini's digits count in full even past the model's configured
/// input. The gateway checks its own count against `max_input_tokens`, so 540 000 digits
/// (~180 000 o200k tokens) pass a model configured for 200 000, and Gemini, which takes a
/// million, bills 540 010: bounding the digits at the configured input reserved ~550 000 µ$
/// and absorbed ~800 000 of 1 350 175.
#[tokio::test]
async fn gemini_digits_past_the_configured_input_are_reserved_for_what_gemini_counts() {
    const KEY_G: &str = "gem-key-bound-0123456789";
    let app = gemini_pro_on(Provider::Gemini, KEY_G, 200_000).await;
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10,
        "messages": [{"role": "user", "content": "0123456789".repeat(54_000)}]});
    let b = billed(&app, "digits", (KEY_G, 540_010), CHAT, &body).await;
    // 540 010 × 2.50 + 10 × 15: Gemini 2.5 Pro's tier.
    assert_eq!((b.charged + b.absorbed, b.absorbed), (1_350_175, 0));
    app.assert_invariant().await;
}

/// Review finding (s17): a Gemini model the bundled table does not name
/// (`gemini-flash-latest`, a preview, an alias) behind an OpenAI-compatible server was read
/// as a router's unknown model, without its digits: a name that says Gemini (or Gemma,
/// its open sibling with the same tokenizer) is read as Gemini's.
#[tokio::test]
async fn a_gemini_model_the_table_does_not_name_is_read_with_its_digits() {
    const KEY_G: &str = "gem-key-latest-0123456789";
    let app = spawn_app_with(|s, mock| {
        let mut g = native_upstream(Provider::OpenaiCompatible, "g", KEY_G, mock);
        g.base_url = format!("{}/v1", mock.base_url());
        s.upstreams.push(g);
        let mut m = model("flash", &[]);
        m.routes = vec![route("g", "gemini-flash-latest")];
        m.price = PriceKeys::usd(0.3, 2.5);
        m.max_input_tokens = 1_000_000;
        s.models.push(m);
    })
    .await;
    let body = json!({"model": "flash", "max_tokens": 10,
        "messages": [{"role": "user", "content": "0123456789".repeat(24_000)}]});
    let b = billed(&app, "latest", (KEY_G, 240_010), CHAT, &body).await;
    // 240 010 × 0.30 + 10 × 2.50.
    assert_eq!((b.charged + b.absorbed, b.absorbed), (72_028, 0));
    app.assert_invariant().await;
}

/// Attack finding (s16b, 3): a request that ended before its answer was charged the
/// departure of the dearest of its candidates, fallbacks never tried included. Claude
/// first with a Gemini fallback: the client leaves while Claude holds a digit-heavy
/// prompt, which Claude counts as the gateway does (~80 000 tokens, 240 030 µ$) — it was
/// charged Gemini's count of its digits at Gemini's tier (~320 000 tokens, 1 920 060 µ$),
/// though Gemini never had it. A departure pays for the candidates it was sent to, as its
/// deadline cut does.
#[tokio::test]
async fn a_departure_pays_for_the_candidates_it_was_sent_to_not_a_fallback_never_tried() {
    const KEY_A: &str = "claude-key-first-0123456789";
    const KEY_G: &str = "gem-key-fallback-0123456789";
    let app = spawn_app_with(|s, mock| {
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "anth", KEY_A, mock));
        s.upstreams
            .push(native_upstream(Provider::Gemini, "g", KEY_G, mock));
        let routes = vec![
            ("sonnet", route("anth", "claude-sonnet-4-5")),
            ("gem", route("g", "gemini-2.5-pro")),
        ];
        models_over(s, routes, &[("sonnet", "gem")]);
    })
    .await;
    let message = json!({"role": "user", "content": "0123456789".repeat(24_000)});
    let counted = sluice::quota::estimate::chat_input(std::slice::from_ref(&message), None);
    let body = json!({"model": "sonnet", "max_tokens": 10, "messages": [message]});
    let (id, token) = app.token("left", Some("100")).await;
    leave_while_upstream_works(&app, KEY_A, 1, app.chat(&token, &body)).await;
    app.wait_for_log_rows(1).await;
    assert_eq!(
        app.mock.state.stats(KEY_G).count,
        0,
        "the fallback was never tried"
    );
    // Claude's count at the standard 3 USD per Mtok: within its window, below the tier.
    let on_claude = (counted * 3_000_000 + 999_999) / 1_000_000;
    assert_eq!(spent_and_absorbed(&app, id).await, (on_claude, 0));
    let input = app
        .scalar(&format!(
            "SELECT input_tokens FROM requests WHERE token_id = {id}"
        ))
        .await;
    assert_eq!(input, counted);
    app.mock.state.sticky(KEY_A, None);
    app.assert_invariant().await;
}

/// Review findings (s17): the departure was raised before the candidate's gates — a key
/// window full, a breaker open — so a candidate skipped without a call was paid for; a
/// candidate that refused the request (429, 503) kept its departure, though such a refusal
/// bills nothing; and so did one the request never reached (a refused connection, a DNS
/// or TLS failure, a credential not made). Gemini first with a Claude fallback: Gemini
/// skipped (its key's one request a minute spent), answering 429, or unreachable, then the
/// client leaves while Claude holds the digit-heavy prompt — it pays Claude's count
/// (240 030 µ$), not Gemini's digits at its tier (1 920 060).
#[tokio::test]
async fn a_departure_pays_nothing_for_a_candidate_skipped_or_refused_before_its_work() {
    const KEY_A: &str = "claude-key-second-0123456789";
    const KEY_G: &str = "gem-key-refuses-0123456789";
    let message = json!({"role": "user", "content": "0123456789".repeat(24_000)});
    let counted = sluice::quota::estimate::chat_input(std::slice::from_ref(&message), None);
    let on_claude = (counted * 3_000_000 + 999_999) / 1_000_000;
    for gemini in ["skipped", "429", "unreachable"] {
        let app = spawn_app_with(|s, mock| {
            s.upstreams
                .push(native_upstream(Provider::Anthropic, "anth", KEY_A, mock));
            let mut g = native_upstream(Provider::Gemini, "g", KEY_G, mock);
            match gemini {
                "skipped" => g.rpm_limit = 1,
                // Nothing listens on port 1: the connection is refused.
                "unreachable" => g.base_url = "http://127.0.0.1:1".into(),
                _ => {}
            }
            s.upstreams.push(g);
            let routes = vec![
                ("gem", route("g", "gemini-2.5-pro")),
                ("sonnet", route("anth", "claude-sonnet-4-5")),
            ];
            models_over(s, routes, &[("gem", "sonnet")]);
        })
        .await;
        let (_, token) = app.token("first", Some("100")).await;
        let mut rows = 1;
        if gemini == "skipped" {
            // The key's one request of the minute.
            let first = json!({"model": "gem", "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}]});
            let resp = app.chat(&token, &first).await;
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap();
            rows += 1;
        } else {
            app.mock.state.sticky(
                KEY_G,
                Some(Script {
                    status: Some(429),
                    ..Script::default()
                }),
            );
        }
        let before = app.mock.state.total_count();
        let (id, token) = app.token("left", Some("100")).await;
        let body = json!({"model": "gem", "max_tokens": 10, "messages": [message.clone()]});
        let had = before + u64::from(gemini == "429") + 1;
        leave_while_upstream_works(&app, KEY_A, had, app.chat(&token, &body)).await;
        app.wait_for_log_rows(rows).await;
        assert_eq!(
            spent_and_absorbed(&app, id).await,
            (on_claude, 0),
            "{gemini}"
        );
        app.mock.state.sticky(KEY_A, None);
        app.assert_invariant().await;
    }
}

/// Review finding (s17b): with no bound, Gemini's digits made a departure of a prompt
/// Gemini refuses outright pay for more tokens than any Gemini serves: 2 200 000 digits
/// (~733 000 o200k tokens, within the model's million) were charged ~2 933 000 tokens at the
/// tier. They count up to Gemini's largest window, 2 097 152 tokens: 5 242 880 µ$.
#[tokio::test]
async fn gemini_digits_count_no_further_than_the_largest_window_gemini_serves() {
    const KEY_G: &str = "gem-key-largest-0123456789";
    let app = spawn_app_with(|s, mock| {
        s.server.max_body_bytes = 4_000_000;
        s.upstreams
            .push(native_upstream(Provider::Gemini, "g", KEY_G, mock));
        let mut m = model("gemini-2.5-pro", &[]);
        m.routes = vec![route("g", "gemini-2.5-pro")];
        m.price = PriceKeys::usd(1.25, 10.0);
        m.max_input_tokens = 1_000_000;
        s.models.push(m);
    })
    .await;
    let (id, token) = app.token("largest", Some("100")).await;
    let body = json!({"model": "gemini-2.5-pro", "max_tokens": 10,
        "messages": [{"role": "user", "content": "0123456789".repeat(220_000)}]});
    leave_while_upstream_works(&app, KEY_G, 1, app.chat(&token, &body)).await;
    app.wait_for_log_rows(1).await;
    // 2 097 152 tokens at Gemini 2.5 Pro's tier, 2.50 USD per Mtok.
    assert_eq!(spent_and_absorbed(&app, id).await, (5_242_880, 0));
    app.mock.state.sticky(KEY_G, None);
    app.assert_invariant().await;
}

/// Review finding (s17c, A0): the window bounds what a request is charged when the
/// provider's count is unknown, never what it is reserved for. Claude's name and the
/// missing beta say nothing of what serves the route: an Anthropic-format proxy that turns
/// the 1M window on itself, or a Claude model that serves past 200 000 tokens without the
/// beta, bills an 800 000-token document in full. Bounding the reservation at the window
/// reserved 200 000 tokens at the base rate and absorbed 4 200 075 of 4 800 225 µ$.
#[tokio::test]
async fn a_claude_route_that_serves_past_its_window_without_the_beta_is_reserved_in_full() {
    const KEY_A: &str = "claude-key-proxy-0123456789";
    let app = spawn_app_with(|s, mock| {
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "anth", KEY_A, mock));
        models_over(
            s,
            vec![("sonnet-a", route("anth", "claude-sonnet-4-5"))],
            &[],
        );
    })
    .await;
    let body = json!({"model": "sonnet-a", "max_tokens": 10, "messages": [{"role": "user",
        "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                "data": crate::documents::b64(&crate::documents::pdf(2))}},
            {"type": "text", "text": "What does it say?"}]}]});
    let b = billed_with(&app, "proxy", (KEY_A, 800_000), (MESSAGES, false), &body).await;
    // 800 000 × 6.00 + 10 × 22.50: Sonnet 4.5's tier, all of it reserved.
    assert_eq!((b.charged + b.absorbed, b.absorbed), (4_800_225, 0));
    app.assert_invariant().await;
}

/// Review finding (s17c, A1): a request pays a departure only once it reached the upstream.
/// An attempt went out, for the departure rule, before its credential was made and its
/// connection opened, so a client that left — or whose own deadline cut the attempt off —
/// while the TLS handshake hung was charged the reserved input of a request no upstream
/// ever read (10 017 µ$ each here). It is out when the upstream's connection reads its body.
#[tokio::test]
async fn a_request_cut_or_left_while_its_connection_is_made_pays_nothing() {
    const KEY_A: &str = "claude-key-unsent-0123456789";
    let (port, holder) = silent_listener().await;
    let app = spawn_app_with(|s, mock| {
        s.upstream.connect_timeout_ms = 60_000;
        let mut a = native_upstream(Provider::Anthropic, "anth", KEY_A, mock);
        a.base_url = format!("https://127.0.0.1:{port}");
        s.upstreams.push(a);
        models_over(s, vec![("sonnet", route("anth", "claude-sonnet-4-5"))], &[]);
    })
    .await;
    let body = json!({"model": "sonnet", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hello ".repeat(3_000)}]});
    let (cut, token) = app.token("cut", Some("100")).await;
    let resp = app.chat_with_deadline(&token, &body, 1_000).await;
    assert_eq!(
        resp.status(),
        502,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let (left, token) = app.token("left", Some("100")).await;
    let send = app.chat(&token, &body);
    assert!(tokio::time::timeout(Duration::from_millis(1_000), send)
        .await
        .is_err());
    app.wait_for_log_rows(2).await;
    assert_eq!(spent_and_absorbed(&app, cut).await, (0, 0), "cut");
    assert_eq!(spent_and_absorbed(&app, left).await, (0, 0), "left");
    holder.abort();
    app.assert_invariant().await;
}

/// Review finding (s18, 2): a deadline that ran out while a fallback's connection was being
/// made counted as the deadline cutting an attempt off after the upstream had it: the
/// request paid the input of an earlier candidate that had failed with a 500 (9 033 µ$;
/// all attempts failing cost nothing), and the token's TPM window kept its input, so the
/// next request of the size was refused (429). It is a failure that reached nothing more.
#[tokio::test]
async fn a_deadline_that_runs_out_before_a_fallback_is_reached_cuts_nothing() {
    const KEY_A: &str = "claude-key-failing-0123456789";
    let (port, holder) = silent_listener().await;
    let app = spawn_app_with(|s, mock| {
        s.upstream.connect_timeout_ms = 60_000;
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "anth", KEY_A, mock));
        let mut hung = native_upstream(Provider::Anthropic, "hung", "k", mock);
        hung.base_url = format!("https://127.0.0.1:{port}");
        s.upstreams.push(hung);
        let routes = vec![
            ("first", route("anth", "claude-sonnet-4-5")),
            ("second", route("hung", "claude-sonnet-4-5")),
            ("ok", route("anth", "claude-sonnet-4-5")),
        ];
        models_over(s, routes, &[("first", "second")]);
    })
    .await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(500),
            ..Script::default()
        }),
    );
    let (id, token) = app
        .issue(IssueArgs {
            budget_usd: Some("100"),
            tpm: Some(5_000),
            ..issue_args("fell")
        })
        .await;
    let ask = |model: &str| {
        json!({"model": model, "max_tokens": 1,
            "messages": [{"role": "user", "content": "hello ".repeat(3_000)}]})
    };
    let resp = app.chat_with_deadline(&token, &ask("first"), 1_000).await;
    assert!(resp.status().is_server_error(), "{}", resp.status());
    app.wait_for_log_rows(1).await;
    assert_eq!(spent_and_absorbed(&app, id).await, (0, 0));
    app.mock.state.sticky(KEY_A, None);
    let resp = app.chat(&token, &ask("ok")).await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    holder.abort();
    app.assert_invariant().await;
}

/// A port that takes connections and says nothing, so a TLS handshake with it never ends,
/// and the task that holds them.
async fn silent_listener() -> (u16, tokio::task::JoinHandle<()>) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let port = silent.local_addr().expect("its address").port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    (port, holder)
}

//! Provider kind `openai_compatible` (vLLM, Ollama, llama.cpp, DeepSeek, Groq, Mistral)
//! behind Sluice, with its quirks against the mock's switches: a server that refuses
//! `stream_options` (usage then counted from the deltas, and a usage chunk the server sends
//! anyway preferred), the output cap's field, no credential at all, and the servers' own
//! error bodies rebuilt in each client's format with their status. Plus the config checks
//! of both new kinds.

use serde_json::{json, Value};
use sluice::config::{AuthMode, OutputCapParam, Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::{MockServer, Script, SseEvent};
use sluice::quota::pricing::{cost, Prices};
use sluice::usage::Usage;

use crate::azure::{anthropic_body, events, spent};
use crate::helpers::*;

pub(crate) const KEY_C: &str = "sk-compat-canary-key-C-2b3c4d5e";

pub(crate) fn compatible(id: &str, mock: &MockServer) -> UpstreamSettings {
    let mut u = upstream(id, KEY_C, mock);
    u.provider = Provider::OpenaiCompatible;
    u
}

/// `gpt-4o-mini` served by `u` alone, as `upstream_model`.
pub(crate) fn only(s: &mut Settings, u: UpstreamSettings, upstream_model: &str) {
    let id = u.id.clone();
    s.upstreams = vec![u];
    let mut m = model("gpt-4o-mini", &[&id]);
    m.routes[0].model = upstream_model.into();
    s.models = vec![m];
}

/// The server behind `KEY_C` refuses `stream_options` (a 400), as an old vLLM does.
pub(crate) fn refuses_stream_options(app: &TestApp) {
    app.mock.state.sticky(
        KEY_C,
        Some(Script {
            reject_stream_options: true,
            ..Default::default()
        }),
    );
}

/// The token was charged `input` and `output` tokens at the test prices.
async fn assert_charged(app: &TestApp, token_id: i64, input: i64, output: i64) {
    let prices = Prices::plain(150_000, 600_000);
    let usage = Usage {
        input,
        output,
        ..Default::default()
    };
    assert_eq!(spent(app, token_id).await, cost(usage, prices));
}

/// The tokens the request log holds for the one request of a token.
async fn logged_tokens(app: &TestApp, token_id: i64) -> (i64, i64) {
    app.wait_for_log_rows(1).await;
    let q = |col: &str| format!("SELECT {col} FROM requests WHERE token_id = {token_id}");
    (
        app.scalar(&q("input_tokens")).await,
        app.scalar(&q("output_tokens")).await,
    )
}

fn streamed(max_tokens: i64) -> Value {
    let mut b = chat_body(max_tokens);
    b["stream"] = json!(true);
    b
}

#[tokio::test]
async fn a_server_that_refuses_stream_options_is_sent_none_and_charged_what_was_counted() {
    let app = spawn_app_with(|s, m| {
        let mut quiet = compatible("quiet", m);
        quiet.quirks.include_usage = false;
        only(s, quiet, "llama-3.1-8b");
        // The same server without the quirk, to show what the quirk is for.
        s.upstreams.push(compatible("plain", m));
        let mut plain = model("plain", &["plain"]);
        plain.routes[0].model = "llama-3.1-8b".into();
        s.models.push(plain);
    })
    .await;
    refuses_stream_options(&app);
    let (_, other) = app.token("other", Some("1.00")).await;
    let mut body = streamed(64);
    body["model"] = json!("plain");
    let refused = app.chat(&other, &body).await;
    assert_eq!(refused.status(), 400, "an old vLLM refuses stream_options");
    let v: Value = refused.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_options"),
        "{v}"
    );

    let (id, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &streamed(64)).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(reassemble(&data), sluice::mock::MockConfig::default().text);
    let sent = app
        .mock
        .state
        .stats(KEY_C)
        .last_bodies
        .back()
        .cloned()
        .unwrap();
    assert!(sent.get("stream_options").is_none(), "{sent}");
    let (input, output) = logged_tokens(&app, id).await;
    assert!(input > 0 && output > 0, "counted: {input} in, {output} out");
    assert_ne!(
        output, 24,
        "the server reported nothing: the output was counted"
    );
    assert_charged(&app, id, input, output).await;
}

#[tokio::test]
async fn a_usage_chunk_the_server_sends_anyway_is_preferred_over_the_count() {
    let app = spawn_app_with(|s, m| {
        let mut u = compatible("c", m);
        u.quirks.include_usage = false;
        only(s, u, "deepseek-chat");
    })
    .await;
    let chunk = |delta: Value, finish: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "deepseek-chat", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    app.mock.state.script(
        KEY_C,
        [Script {
            events: Some(vec![
                chunk(
                    json!({"role": "assistant", "content": "Hi there"}),
                    Value::Null,
                ),
                chunk(json!({}), json!("stop")),
                SseEvent::Data(
                    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "deepseek-chat", "choices": [],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}),
                ),
                SseEvent::Data(json!("[DONE]")),
            ]),
            ..Default::default()
        }],
    );
    let (id, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &streamed(64)).await;
    assert_eq!(resp.status(), 200);
    let _ = sse_data(resp).await;
    assert_eq!(logged_tokens(&app, id).await, (7, 5));
    assert_charged(&app, id, 7, 5).await;
}

#[tokio::test]
async fn an_anthropic_client_streams_from_a_server_without_usage_and_is_told_the_count() {
    let app = spawn_app_with(|s, m| {
        let mut u = compatible("c", m);
        u.quirks.include_usage = false;
        only(s, u, "llama3");
    })
    .await;
    refuses_stream_options(&app);
    let (id, token) = app.token("dev", Some("1.00")).await;
    let evs = events(app.messages(&token, &anthropic_body(true)).await).await;
    assert_eq!(
        evs.last().map(|(n, _)| n.as_str()),
        Some("message_stop"),
        "{evs:?}"
    );
    let delta = evs.iter().find(|(n, _)| n == "message_delta").unwrap();
    let (_, output) = logged_tokens(&app, id).await;
    assert_eq!(delta.1["usage"]["output_tokens"], output, "{delta:?}");
    assert!(output > 0);
    let (input, _) = logged_tokens(&app, id).await;
    assert_charged(&app, id, input, output).await;
}

#[tokio::test]
async fn the_output_cap_goes_in_the_field_the_server_takes() {
    let app = spawn_app_with(|s, m| {
        only(s, compatible("plain", m), "qwen3-32b");
        let mut groq = compatible("groq", m);
        groq.api_key = Secret(secrecy::SecretString::from("sk-groq-key-0000".to_string()));
        groq.quirks.max_tokens_field = Some(OutputCapParam::MaxCompletionTokens);
        s.upstreams.push(groq);
        let mut g = model("groq", &["groq"]);
        g.routes[0].model = "llama-3.3-70b".into();
        s.models.push(g);
    })
    .await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    assert_eq!(app.chat(&token, &chat_body(64)).await.status(), 200);
    let sent = &app.mock.state.stats(KEY_C).last_bodies[0];
    assert_eq!(sent["max_tokens"], 64, "{sent}");
    assert!(sent.get("max_completion_tokens").is_none());
    let mut body = chat_body(64);
    body["model"] = json!("groq");
    assert_eq!(app.chat(&token, &body).await.status(), 200);
    let sent = &app.mock.state.stats("sk-groq-key-0000").last_bodies[0];
    assert_eq!(sent["max_completion_tokens"], 64, "{sent}");
    assert!(sent.get("max_tokens").is_none());
}

#[tokio::test]
async fn a_local_server_without_auth_gets_no_credential_header() {
    let app = spawn_app_with(|s, m| {
        let mut u = compatible("ollama", m);
        u.api_key = Secret::default();
        u.quirks.auth = AuthMode::None;
        only(s, u, "llama3.2");
    })
    .await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    assert_eq!(app.chat(&token, &chat_body(64)).await.status(), 200);
    let stats = app.mock.state.stats("");
    assert_eq!(stats.count, 1);
    let h = &stats.last_headers[0];
    assert!(
        h.get("authorization").is_none() && h.get("x-api-key").is_none(),
        "{h:?}"
    );
}

#[tokio::test]
async fn each_servers_error_body_reaches_each_client_in_its_format_with_the_status() {
    let app = spawn_app_with(|s, m| only(s, compatible("c", m), "mistral-small")).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    for style in ["fastapi", "ollama", "vllm", "text"] {
        for status in [400u16, 404, 422] {
            let script = Script {
                status: Some(status),
                error_style: Some(style.into()),
                ..Default::default()
            };
            app.mock.state.script(KEY_C, [script.clone(), script]);
            let resp = app.chat(&token, &chat_body(64)).await;
            assert_eq!(resp.status(), status, "{style}");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(
                v["error"]["message"],
                format!("mock error {status}"),
                "{style}: {v}"
            );
            assert_eq!(v["error"]["type"], "invalid_request_error", "{style}: {v}");
            let resp = app.messages(&token, &anthropic_body(false)).await;
            assert_eq!(resp.status(), status, "{style}");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["type"], "error", "{style}: {v}");
            assert_eq!(
                v["error"]["message"],
                format!("mock error {status}"),
                "{style}: {v}"
            );
            let kind = if status == 404 {
                "not_found_error"
            } else {
                "invalid_request_error"
            };
            assert_eq!(v["error"]["type"], kind, "{style}: {v}");
        }
    }
    assert_eq!(
        app.state.pool().disabled(0),
        None,
        "client errors leave the key alone"
    );
    assert_eq!(spent(&app, id).await, 0);
}

#[test]
fn the_config_names_what_each_kind_is_missing() {
    let mock_url = "https://example.com";
    let base = |provider| UpstreamSettings {
        id: "u".into(),
        provider,
        base_url: mock_url.into(),
        api_key: Secret(secrecy::SecretString::from("k-123456789".to_string())),
        ..Default::default()
    };
    let check = |u: UpstreamSettings, route: Option<&str>| {
        let mut m = model("m", &["u"]);
        m.routes[0].deployment = route.map(str::to_string);
        let s = Settings {
            upstreams: vec![u],
            models: vec![m],
            ..Default::default()
        };
        s.validate().err().map(|e| e.to_string())
    };
    let no_version = check(base(Provider::AzureOpenai), None).unwrap();
    assert!(no_version.contains("api_version"), "{no_version}");
    let mut az = base(Provider::AzureOpenai);
    az.api_version = Some("2024-10-21".into());
    assert_eq!(check(az.clone(), Some("dep")), None);
    az.api_key = Secret::default();
    let keyless = check(az, None).unwrap();
    assert!(
        keyless.contains("api_key") && keyless.contains("entra"),
        "{keyless}"
    );
    let dep = check(base(Provider::Openai), Some("dep")).unwrap();
    assert!(dep.contains("deployment"), "{dep}");
    let mut ant = base(Provider::Anthropic);
    ant.quirks.include_usage = false;
    assert!(check(ant, None).unwrap().contains("quirks"));
    let mut empty = base(Provider::OpenaiCompatible);
    empty.api_key = Secret::default();
    assert!(check(empty.clone(), None).unwrap().contains("api_key"));
    empty.quirks.auth = AuthMode::None;
    assert_eq!(check(empty.clone(), None), None);
    // The billed router fields an upstream allows: known ones, on a router only.
    empty.quirks.billed_fields = vec!["plugins".into(), "provider".into()];
    assert_eq!(check(empty.clone(), None), None);
    empty.quirks.billed_fields = vec!["plugin".into()];
    let typo = check(empty, None).unwrap();
    assert!(
        typo.contains("plugin") && typo.contains("billed_fields"),
        "{typo}"
    );
    let mut oa = base(Provider::Openai);
    oa.quirks.billed_fields = vec!["plugins".into()];
    let not_router = check(oa, None).unwrap();
    assert!(not_router.contains("openai_compatible"), "{not_router}");
    let mut v = base(Provider::Openai);
    v.api_version = Some("v1".into());
    assert!(check(v, None).unwrap().contains("azure_openai"));
    let toml = r#"
[[upstreams]]
id = "vllm"
provider = "openai_compatible"
base_url = "http://127.0.0.1:8000/v1"
allow_private_network = true
quirks = { include_usage = false, max_tokens_field = "max_tokens", auth = "none" }
"#;
    let s: Settings = toml::from_str(toml).unwrap();
    assert!(!s.upstreams[0].quirks.include_usage);
    assert_eq!(s.upstreams[0].quirks.auth, AuthMode::None);
}

/// An OpenAI-compatible router passes fields it knows through and bills them: OpenRouter's
/// `plugins` (web search, PDF parsing: fees per call), `models` (a fallback to other,
/// dearer models) and `provider` (routing among providers at their own prices). Sluice
/// prices none of that: each is refused with a 400 naming it, on chat and completions,
/// nothing sent — unless the upstream's `quirks.billed_fields` allows it; null is absent;
/// an `openai` upstream is not concerned (OpenAI refuses what it does not know).
#[tokio::test]
async fn billed_router_fields_are_refused_unless_the_upstream_allows_them() {
    const KEY_OPEN: &str = "sk-router-allows-plugins-0000";
    let app = spawn_app_with(|s, m| {
        only(s, compatible("router", m), "openai/gpt-4o-mini");
        let mut open = compatible("open", m);
        open.api_key = Secret(secrecy::SecretString::from(KEY_OPEN.to_string()));
        open.quirks.billed_fields = vec!["plugins".into()];
        s.upstreams.push(open);
        let mut o = model("open", &["open"]);
        o.routes[0].model = "openai/gpt-4o-mini".into();
        s.models.push(o);
        s.upstreams.push(upstream("oa", KEY_A, m));
        s.models.push(model("oa", &["oa"]));
    })
    .await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    let fields = [
        ("plugins", json!([{"id": "web"}])),
        ("models", json!(["anthropic/claude-opus-4"])),
        ("provider", json!({"sort": "throughput"})),
    ];
    for (field, value) in &fields {
        let mut body = chat_body(64);
        body[*field] = value.clone();
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 400, "{field}");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["param"], *field, "{err}");
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("billed_fields")),
            "the message says how to allow it: {err}"
        );
        let mut legacy = json!({"model": "gpt-4o-mini", "max_tokens": 16, "prompt": "Hi"});
        legacy[*field] = value.clone();
        let resp = app.post("/v1/completions", &token, &legacy).await;
        assert_eq!(resp.status(), 400, "completions {field}");
    }
    assert_eq!(
        app.mock.state.stats(KEY_C).count,
        0,
        "nothing sent upstream"
    );

    // Null is absent: the request is served.
    let mut body = chat_body(64);
    body["plugins"] = Value::Null;
    assert_eq!(app.chat(&token, &body).await.status(), 200);

    // The upstream that allows `plugins` is sent them; `models` it still refuses.
    let mut body = chat_body(64);
    body["model"] = json!("open");
    body["plugins"] = fields[0].1.clone();
    assert_eq!(app.chat(&token, &body).await.status(), 200);
    let sent = app.mock.state.stats(KEY_OPEN).last_bodies;
    assert_eq!(sent.back().unwrap()["plugins"], fields[0].1, "{sent:?}");
    body["models"] = fields[1].1.clone();
    assert_eq!(app.chat(&token, &body).await.status(), 400);

    // OpenAI's own API is not a router: the gateway leaves the field to it.
    let mut body = chat_body(64);
    body["model"] = json!("oa");
    body["provider"] = fields[2].1.clone();
    assert_eq!(app.chat(&token, &body).await.status(), 200);
    app.assert_invariant().await;
}

/// Review finding (s16): an embeddings body is sent to an `openai_compatible` upstream as
/// the client wrote it (no translation), so a router's billed fields in it reached the
/// router — `provider` picking a dearer host, `models` a dearer fallback model — billed
/// apart from the prices the gateway charges, where the same fields on chat are refused.
/// They are refused on embeddings too, nothing sent, unless `quirks.billed_fields` allows
/// them.
#[tokio::test]
async fn billed_router_fields_in_an_embeddings_body_are_refused_unless_allowed() {
    const KEY_OPEN: &str = "sk-router-embeds-allowed-0000";
    let app = spawn_app_with(|s, m| {
        only(s, compatible("router", m), "openai/text-embedding-3-small");
        let mut open = compatible("open", m);
        open.api_key = Secret(secrecy::SecretString::from(KEY_OPEN.to_string()));
        open.quirks.billed_fields = vec!["provider".into()];
        s.upstreams.push(open);
        let mut o = model("open", &["open"]);
        o.routes[0].model = "openai/text-embedding-3-small".into();
        s.models.push(o);
    })
    .await;
    let (_, token) = app.token("embeds", Some("1.00")).await;
    let fields = [
        ("plugins", json!([{"id": "web"}])),
        ("models", json!(["openai/text-embedding-3-large"])),
        (
            "provider",
            json!({"order": ["azure"], "allow_fallbacks": false}),
        ),
    ];
    for (field, value) in &fields {
        let mut body = json!({"model": "gpt-4o-mini", "input": "The engine light blinks."});
        body[*field] = value.clone();
        let resp = app.post("/v1/embeddings", &token, &body).await;
        let status = resp.status();
        let err: Value = resp.json().await.unwrap();
        assert_eq!(status, 400, "{field}: {err}");
        assert_eq!(err["error"]["param"], *field, "{err}");
    }
    assert_eq!(
        app.mock.state.stats(KEY_C).count,
        0,
        "nothing sent upstream"
    );
    // Without them, or allowed, the embedding is served.
    let plain = json!({"model": "gpt-4o-mini", "input": "The engine light blinks."});
    assert_eq!(
        app.post("/v1/embeddings", &token, &plain).await.status(),
        200
    );
    let mut allowed = json!({"model": "open", "input": "The engine light blinks."});
    allowed["provider"] = fields[2].1.clone();
    assert_eq!(
        app.post("/v1/embeddings", &token, &allowed).await.status(),
        200
    );
    let sent = app.mock.state.stats(KEY_OPEN).last_bodies;
    assert_eq!(sent.back().unwrap()["provider"], fields[2].1, "{sent:?}");
    app.assert_invariant().await;
}

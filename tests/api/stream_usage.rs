//! A stream is charged what its upstream reported, wherever in the stream it said it —
//! table-driven over the upstream formats (OpenAI, Anthropic, Gemini, Bedrock; the
//! Responses API apart), each scripted on the mock and reached by an OpenAI client that
//! asked for the usage chunk. A usage of zeros costs 0; a usage after the finish (in an
//! event of its own, before a body that ends, breaks or stalls) is the price; a usage
//! reported twice costs the last; a usage over the reservation is charged the reservation
//! with the rest absorbed; a finish without any usage is charged the estimate. See
//! `translate::stream`'s module doc for the rule.

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Up {
    OpenAi,
    Anthropic,
    Gemini,
    Bedrock,
}

const ALL: [Up; 4] = [Up::OpenAi, Up::Anthropic, Up::Gemini, Up::Bedrock];
const TEXT: &str = "Hello world";

impl Up {
    fn model(self) -> &'static str {
        match self {
            Up::OpenAi => "m-openai",
            Up::Anthropic => "m-anthropic",
            Up::Gemini => "m-gemini",
            Up::Bedrock => "m-bedrock",
        }
    }

    /// The key the mock scripts this upstream by (Bedrock's: the access key id).
    fn key(self) -> &'static str {
        match self {
            Up::OpenAi => "sk-stream-usage-openai-0123",
            Up::Anthropic => "sk-stream-usage-anthropic-0123",
            Up::Gemini => "gem-stream-usage-0123456789",
            Up::Bedrock => "AKIDSTREAMUSAGE",
        }
    }
}

/// A piece of a scripted stream, written in each format's own events.
#[derive(Debug, Clone, Copy)]
enum Piece {
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

fn events(up: Up, pieces: &[Piece]) -> Vec<SseEvent> {
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
fn usual(up: Up, usage: Option<(i64, i64)>) -> Vec<Piece> {
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

fn bedrock(key_id: &str, base_url: String) -> UpstreamSettings {
    UpstreamSettings {
        id: "br".into(),
        provider: Provider::Bedrock,
        base_url,
        api_key: Secret::default(),
        region: Some("us-east-1".into()),
        access_key_id: Some(key_id.into()),
        secret_access_key: Some(Secret(secrecy::SecretString::from("bedrock-test-secret"))),
        allow_private_network: true,
        ..UpstreamSettings::default()
    }
}

/// One app with a model per upstream format, priced 3 / 15 USD per million tokens.
async fn app_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_with(|s, mock| {
        let mut openai = upstream("oa", Up::OpenAi.key(), mock);
        openai.provider = Provider::OpenaiCompatible;
        let mut anthropic = upstream("an", Up::Anthropic.key(), mock);
        anthropic.provider = Provider::Anthropic;
        anthropic.base_url = mock.base_url();
        let mut gemini = upstream("ge", Up::Gemini.key(), mock);
        gemini.provider = Provider::Gemini;
        gemini.base_url = mock.base_url();
        s.upstreams.extend([
            openai,
            anthropic,
            gemini,
            bedrock(Up::Bedrock.key(), mock.base_url()),
        ]);
        for (up, id) in [
            (Up::OpenAi, "oa"),
            (Up::Anthropic, "an"),
            (Up::Gemini, "ge"),
            (Up::Bedrock, "br"),
        ] {
            let mut m = model(up.model(), &[id]);
            m.price = sluice::config::PriceKeys::usd(3.0, 15.0);
            s.models.push(m);
        }
        tweak(s);
    })
    .await
}

async fn app() -> TestApp {
    app_with(|_| {}).await
}

/// The cost of a usage at the test prices, rounded up once.
fn cost(input: i64, output: i64) -> i64 {
    (input * 3_000_000 + output * 15_000_000 + 999_999) / 1_000_000
}

/// What one streamed request did: the client's `data:` payloads, and from the books the
/// token's spend, the request log's (input, output, cost, error code) and the absorbed sum.
struct Charged {
    data: Vec<String>,
    spent: i64,
    logged: (i64, i64, i64, Option<String>),
    absorbed: i64,
}

impl Charged {
    /// The client's stream ended complete: its last payload is `[DONE]`, after a usage
    /// chunk that tells the logged figures, and it holds no error.
    fn complete(&self, what: &str) {
        self.complete_coded(what, None);
    }

    /// Complete, and charged the gateway's count of the input (none was reported): the row
    /// says `usage_estimated`.
    fn complete_estimated(&self, what: &str) {
        self.complete_coded(what, Some("usage_estimated"));
    }

    fn complete_coded(&self, what: &str, code: Option<&str>) {
        assert_eq!(
            self.data.last().map(String::as_str),
            Some("[DONE]"),
            "{what}: {:?}",
            self.data
        );
        assert!(
            !self.data.iter().any(|d| d.contains("\"error\"")),
            "{what}: {:?}",
            self.data
        );
        let usage = self
            .data
            .iter()
            .rev()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v["usage"].is_object())
            .unwrap_or_else(|| panic!("{what}: no usage chunk in {:?}", self.data));
        assert_eq!(
            (
                usage["usage"]["prompt_tokens"].as_i64(),
                usage["usage"]["completion_tokens"].as_i64()
            ),
            (Some(self.logged.0), Some(self.logged.1)),
            "{what}: the client is told what it is charged"
        );
        assert_eq!(self.logged.3.as_deref(), code, "{what}: logged as complete");
    }

    /// Charged exactly this usage, which the reservation covered.
    fn exactly(&self, what: &str, input: i64, output: i64) {
        assert_eq!((self.logged.0, self.logged.1), (input, output), "{what}");
        assert_eq!(
            (self.logged.2, self.spent, self.absorbed),
            (cost(input, output), cost(input, output), 0),
            "{what}"
        );
    }
}

async fn stream(app: &TestApp, up: Up, user: &str, script: Script, max_tokens: i64) -> Charged {
    stream_n(app, up, user, script, max_tokens, 1).await
}

/// As `stream`, the request asking for `n` choices.
async fn stream_n(
    app: &TestApp,
    up: Up,
    user: &str,
    script: Script,
    max_tokens: i64,
    n: i64,
) -> Charged {
    let (id, token) = app.token(user, Some("1")).await;
    app.mock.state.script(up.key(), [script]);
    let mut body = json!({"model": up.model(), "stream": true, "max_tokens": max_tokens,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi"}]});
    if n != 1 {
        body["n"] = json!(n);
    }
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200, "{up:?}");
    let (data, whole) = sse_data(resp).await;
    assert!(whole, "{up:?}: the body ends cleanly");
    app.wait_settled().await;
    let row = format!("FROM requests WHERE token_id = {id}");
    for _ in 0..500 {
        if app.scalar(&format!("SELECT COUNT(*) {row}")).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let logged: (i64, i64, i64, Option<String>) = sql_row(
        app.db(),
        &format!("SELECT input_tokens, output_tokens, cost_micros, error_code {row}"),
    )
    .await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    let absorbed = app
        .scalar(&format!(
            "SELECT CAST(COALESCE(SUM(amount_micros), 0) AS BIGINT) FROM ledger
             WHERE kind = 'absorbed' AND token_id = {id}"
        ))
        .await;
    Charged {
        data,
        spent,
        logged,
        absorbed,
    }
}

fn scripted(up: Up, pieces: &[Piece]) -> Script {
    Script {
        events: Some(events(up, pieces)),
        ..Script::default()
    }
}

/// CHECKS Q5: a stream whose final usage says 0 is charged 0, in every format.
#[tokio::test]
async fn a_final_usage_of_zeros_is_charged_zero() {
    let app = app().await;
    for up in ALL {
        let c = stream(
            &app,
            up,
            &format!("z-{up:?}"),
            scripted(up, &usual(up, Some((0, 0)))),
            100,
        )
        .await;
        c.complete(&format!("{up:?}"));
        c.exactly(&format!("{up:?}"), 0, 0);
    }
    app.assert_invariant().await;
}

/// The same through an Anthropic client (`/v1/messages`): its `message_delta` tells the
/// zeros it is charged, and `message_stop` ends its stream.
#[tokio::test]
async fn an_anthropic_client_is_charged_a_final_usage_of_zeros() {
    let app = app().await;
    for up in ALL {
        let (id, token) = app.token(&format!("za-{up:?}"), Some("1")).await;
        app.mock
            .state
            .script(up.key(), [scripted(up, &usual(up, Some((0, 0))))]);
        let resp = app
            .messages(
                &token,
                &json!({"model": up.model(), "stream": true, "max_tokens": 100,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{up:?}");
        let body = resp.text().await.unwrap();
        let events: Vec<Value> = body
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(
            events.last().unwrap()["type"],
            "message_stop",
            "{up:?}: {body}"
        );
        let delta = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap_or_else(|| panic!("{up:?}: {body}"));
        assert_eq!(delta["usage"]["output_tokens"], 0, "{up:?}: {body}");
        app.wait_settled().await;
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        assert_eq!(spent, 0, "{up:?}");
    }
    app.assert_invariant().await;
}

/// A usage in an event of its own after the finish (and, for OpenAI, no `[DONE]` after
/// it: some compatible servers send none) is read before the stream completes, and is
/// its price.
#[tokio::test]
async fn a_usage_after_the_finish_is_the_price() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(7, 4000),
                Piece::End,
            ],
        ),
        (
            Up::OpenAi,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        (
            Up::Gemini,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        (
            Up::Bedrock,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        // Anthropic's usage rides on its finish; a server that sends no `message_stop`.
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((7, 4000)))],
        ),
    ] {
        let what = format!("{up:?} {pieces:?}");
        let c = stream(
            &app,
            up,
            &format!("a-{}", what.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        c.complete(&what);
        c.exactly(&what, 7, 4000);
    }
    app.assert_invariant().await;
}

/// A running usage, then the final one: the last wins, never summed with the first.
#[tokio::test]
async fn a_usage_reported_twice_costs_the_last() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 30))),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 30))),
                Piece::Usage(1000, 40),
            ],
        ),
        (
            Up::Anthropic,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 40))),
                Piece::End,
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let c = stream(&app, up, &format!("t-{what}"), scripted(up, &pieces), 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// The body breaks after the finish and its usage, where `[DONE]`, `message_stop` or a
/// later chunk would come: the answer was whole, so the client's stream completes and the
/// reported usage is the price. (The mock cuts no scripted Bedrock stream; its `metadata`
/// is its end.)
#[tokio::test]
async fn a_body_cut_after_the_usage_that_followed_the_finish_is_complete_and_charged_it() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::Usage(1, 1),
            ],
        ),
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((1000, 40))), Piece::End],
        ),
    ] {
        let what = format!("{up:?}");
        let mut script = scripted(up, &pieces);
        // Broken where the last event would come.
        script.cut_after = Some(script.events.as_ref().unwrap().len() - 1);
        let c = stream(&app, up, &format!("c-{what}"), script, 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// An upstream that finished, told its usage and then holds its body open: the idle timer
/// ends the wait, and the stream is complete and charged that usage.
#[tokio::test]
async fn a_body_held_open_after_the_finish_completes_at_the_idle_timeout() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::Text,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 40))),
                Piece::Usage(1000, 40),
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let mut script = scripted(up, &pieces);
        // Held before its last event, for an hour.
        script.stall_after = Some(script.events.as_ref().unwrap().len() - 1);
        let c = stream(&app, up, &format!("s-{what}"), script, 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// An event the gateway cannot read after the finish — here one larger than it accepts —
/// may be the usage: the stream is cut (an error event, logged as an upstream error) and
/// charged the usage reported with the finish.
#[tokio::test]
async fn an_event_too_large_after_the_finish_cuts_the_stream() {
    let app = app_with(|s| s.upstream.max_response_bytes = 64 * 1024).await;
    let mut events = events(Up::Gemini, &[Piece::Text, Piece::Finish(Some((7, 40)))]);
    events.push(SseEvent::Data(
        json!({"usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 40},
            "padding": "x".repeat(128 * 1024)}),
    ));
    let script = Script {
        events: Some(events),
        ..Script::default()
    };
    let c = stream(&app, Up::Gemini, "too-large", script, 4096).await;
    let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{:?}", c.data);
    assert!(!c.data.iter().any(|d| d == "[DONE]"), "{:?}", c.data);
    assert_eq!(c.logged.3.as_deref(), Some("upstream_error"));
    assert_eq!((c.logged.0, c.logged.1), (7, 40));
    assert_eq!((c.spent, c.absorbed), (cost(7, 40), 0));
    app.assert_invariant().await;
}

/// A finish without any usage, with its format's end event (Bedrock's is its usage, so
/// a Bedrock stream without one is cut: `a_finish_whose_usage_and_end_never_came_is_a_cut`):
/// the estimate — the output counted from the text received — as before.
#[tokio::test]
async fn a_finish_without_usage_is_charged_the_estimate() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(TEXT);
    for up in [Up::OpenAi, Up::Anthropic, Up::Gemini] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("n-{what}"),
            scripted(up, &usual(up, None)),
            100,
        )
        .await;
        c.complete_estimated(&what);
        let (input, output, cost_micros, _) = c.logged;
        assert_eq!(output, counted, "{what}");
        assert!(input > 0, "{what}: the input estimate");
        assert_eq!(
            (c.spent, cost_micros),
            (cost(input, output), cost(input, output)),
            "{what}"
        );
    }
    app.assert_invariant().await;
}

/// A usage over the reservation (an output far past the cap the upstream was sent): the
/// token is charged its reservation, the rest is absorbed (DESIGN "Settlement"), and the
/// log keeps the reported figures.
#[tokio::test]
async fn a_usage_over_the_reservation_is_charged_the_reservation_and_the_rest_absorbed() {
    let app = app().await;
    for up in ALL {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("o-{what}"),
            scripted(up, &usual(up, Some((1000, 5000)))),
            10,
        )
        .await;
        c.complete(&what);
        let full = cost(1000, 5000);
        assert_eq!((c.logged.0, c.logged.1), (1000, 5000), "{what}");
        assert!(c.spent < full, "{what}: charged {} of {full}", c.spent);
        assert_eq!(c.spent + c.absorbed, full, "{what}");
        assert_eq!(c.logged.2, full, "{what}: the log keeps the whole cost");
    }
    app.assert_invariant().await;
}

/// The Responses API upstream reports its usage in `response.completed`, its finish and
/// end: zeros are charged zero there too.
#[tokio::test]
async fn a_responses_stream_whose_usage_says_zero_is_charged_zero() {
    let app = spawn_app().await;
    let (id, token) = app.token("r0", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Script::default()
        }],
    );
    let resp = app
        .post(
            "/v1/responses",
            &token,
            &json!({"model": "gpt-4o-mini", "input": "hi", "stream": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("response.completed"), "{body}");
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent, 0);
    app.assert_invariant().await;
}

/// The text the client received after its finish (`finish_reason`), and in all.
fn text_after_finish(data: &[String]) -> (String, String) {
    let (mut after, mut all, mut finished) = (String::new(), String::new(), false);
    for v in data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
    {
        for c in v["choices"].as_array().into_iter().flatten() {
            let t = c["delta"]["content"].as_str().unwrap_or("");
            all.push_str(t);
            if finished {
                after.push_str(t);
            }
            finished |= c["finish_reason"].is_string();
        }
    }
    (after, all)
}

/// A lying upstream finishes, reports a tiny usage, and then goes on sending text: the
/// answer was whole at the finish, so nothing after it reaches the client — else the client
/// would hold many more tokens than the reported usage it is charged (the price, see the
/// module doc of `translate::stream`).
#[tokio::test]
async fn text_after_the_finish_does_not_reach_the_client_uncharged() {
    let app = app().await;
    let more = vec![Piece::Text; 200];
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            [
                vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
                more.clone(),
                vec![Piece::End],
            ]
            .concat(),
        ),
        (
            Up::Anthropic,
            [
                vec![Piece::Text, Piece::Finish(Some((5, 1)))],
                more.clone(),
                vec![Piece::End],
            ]
            .concat(),
        ),
        (
            Up::Gemini,
            [vec![Piece::Text, Piece::Finish(Some((5, 1)))], more.clone()].concat(),
        ),
        (
            Up::Bedrock,
            [
                vec![Piece::Text, Piece::Finish(None)],
                more.clone(),
                vec![Piece::Usage(5, 1)],
            ]
            .concat(),
        ),
    ] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("after-{what}"),
            scripted(up, &pieces),
            4096,
        )
        .await;
        let (after, all) = text_after_finish(&c.data);
        if !after.is_empty() || (c.logged.0, c.logged.1) != (5, 1) {
            broken.push(format!(
                "{what}: {} bytes of text after the finish (of {} received), charged {:?}",
                after.len(),
                all.len(),
                (c.logged.0, c.logged.1)
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// A Responses client of a translated upstream whose final usage comes after the finish
/// (and, for Gemini, a running one before it): `response.completed` is written once, after
/// that usage, and tells what the client is charged — the last report.
#[tokio::test]
async fn a_responses_client_gets_one_completed_with_the_usage_after_the_finish() {
    let app = app().await;
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(Some((3, 2))),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((1000, 40))), Piece::End],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((3, 2))),
                Piece::Usage(1000, 40),
            ],
        ),
        (
            Up::Bedrock,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(1000, 40)],
        ),
    ] {
        let what = format!("{up:?}");
        let (id, token) = app.token(&format!("resp-{what}"), Some("1")).await;
        app.mock.state.script(up.key(), [scripted(up, &pieces)]);
        let resp = app
            .post(
                "/v1/responses",
                &token,
                &json!({"model": up.model(), "input": "hi", "stream": true, "max_output_tokens": 4096}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{what}");
        let body = resp.text().await.expect("the body ends cleanly");
        let data: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect();
        app.wait_settled().await;
        let completed: Vec<Value> = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|v| v["type"] == "response.completed")
            .collect();
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        let told = completed.first().map(|c| {
            (
                c["response"]["usage"]["input_tokens"].as_i64(),
                c["response"]["usage"]["output_tokens"].as_i64(),
            )
        });
        if completed.len() != 1
            || told != Some((Some(1000), Some(40)))
            || spent != cost(1000, 40)
            || data
                .last()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                != completed.first().cloned()
        {
            broken.push(format!(
                "{what}: {} response.completed, told {told:?}, spent {spent} (want {}), last {:?}",
                completed.len(),
                cost(1000, 40),
                data.last()
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// After its finish and usage, an upstream keeps its body open with an endless run of SSE
/// comments (keep-alives): they carry no event, so they do not hold the idle timer off —
/// the stream completes at the idle timeout, charged the usage.
#[tokio::test]
async fn keep_alive_comments_after_the_finish_do_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let data = |v: Value| format!("data: {v}\n\n");
    let script = Script {
        raw_stream: Some(vec![
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]}),
            ),
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ),
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040}}),
            ),
            ": keep-alive\n\n".to_string(),
        ]),
        raw_repeat: 50_000,
        raw_hold: true,
        ..Script::default()
    };
    let c = stream(&app, Up::OpenAi, "comments", script, 4096).await;
    c.complete("comments");
    c.exactly("comments", 1000, 40);
    app.assert_invariant().await;
}

/// The client leaves after the finish, while the upstream holds its body before the usage
/// (and the end): its answer was whole, so it is no departure (s16c finding 3) — the
/// gateway reads on for the usage at most `stream::AFTER_THE_FINISH` (2 s), then settles it
/// once, charged the input reported before the finish (or the estimate) and the output
/// counted from the text received.
#[tokio::test]
async fn a_client_leaving_after_the_finish_before_the_usage_is_settled_once_at_the_count() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(&TEXT.repeat(3));
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Text,
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Text,
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
            ],
        ),
        // (The mock holds no scripted Bedrock stream.)
    ] {
        let what = format!("{up:?}");
        let (id, token) = app.token(&format!("leave-{what}"), Some("1")).await;
        let mut script = scripted(up, &pieces);
        let all = script.events.as_ref().unwrap();
        // Held for an hour right after the finish.
        let finish = all.iter().rposition(|e| match e {
            SseEvent::Data(v) => {
                v["choices"][0]["finish_reason"].is_string()
                    || v["candidates"][0]["finishReason"].is_string()
            }
            SseEvent::Named(..) => false,
        });
        script.stall_after = Some(finish.unwrap() + 1);
        app.mock.state.script(up.key(), [script]);
        let resp = app
            .chat(
                &token,
                &json!({"model": up.model(), "stream": true, "max_tokens": 4096,
                    "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{what}");
        let mut body = resp.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("finish_reason\":\"") {
            let chunk = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                futures_util::StreamExt::next(&mut body),
            )
            .await
            .expect("the finish comes")
            .expect("the body is open")
            .unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        drop(body);
        let row = format!("FROM requests WHERE token_id = {id}");
        for _ in 0..1500 {
            if app.scalar(&format!("SELECT COUNT(*) {row}")).await == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        app.wait_settled().await;
        let logged: (i64, i64, i64, Option<String>) = sql_row(
            app.db(),
            &format!("SELECT input_tokens, output_tokens, cost_micros, error_code {row}"),
        )
        .await;
        assert_eq!(logged.3.as_deref(), None, "{what}: {logged:?}");
        assert_eq!(logged.1, counted, "{what}: the counted output");
        // The output is the gateway's count: the row says so in its column (its code
        // stays the input's alone, as before).
        assert_eq!(
            app.scalar(&format!(
                "SELECT CAST(CASE WHEN usage_estimated THEN 1 ELSE 0 END AS BIGINT) {row}"
            ))
            .await,
            1,
            "{what}: the counted output is estimated"
        );
        assert_eq!(
            logged.0, 1000,
            "{what}: the input reported before the finish"
        );
        let settles = app
            .scalar(&format!(
                "SELECT COUNT(*) FROM ledger WHERE kind = 'settle' AND token_id = {id}"
            ))
            .await;
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        assert_eq!(
            (settles, spent),
            (1, cost(logged.0, logged.1)),
            "{what}: settled once"
        );
    }
    app.assert_invariant().await;
}

/// A running usage only before the finish (vLLM's continuous usage on its text chunks, none
/// on the finish chunk), the output it says far under the text received: the stream is
/// charged the counted output (the running figure is a floor), and the client that asked
/// for the usage is told that, in a last usage chunk — not left with the running figure as
/// the last it saw.
#[tokio::test]
async fn a_running_usage_under_the_count_is_not_the_last_usage_the_client_is_told() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(&TEXT.repeat(4));
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::Finish(None),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::Finish(None),
            ],
        ),
    ] {
        let what = format!("{up:?} {}", pieces.len());
        let c = stream(
            &app,
            up,
            &format!("run-{}", broken.len() + pieces.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        let result = std::panic::catch_unwind(|| {
            c.complete(&what);
            c.exactly(&what, 1000, counted);
        });
        if let Err(e) = result {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            broken.push(format!("{what}: {msg}"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// After its finish (and usage) an upstream sends small events without end — Anthropic's
/// `ping`, OpenAI's usage chunk again and again — and never ends its body (the mock sends
/// no raw Gemini stream). The answer is whole: the
/// gateway waits for the end no longer than the idle timeout after the finish, and the
/// client's stream completes, charged the last usage — not held open as long as the
/// upstream likes (the client never getting its `[DONE]`, the reservation never settled).
#[tokio::test]
async fn endless_small_events_after_the_finish_do_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let data = |v: Value| format!("data: {v}\n\n");
    let named = |n: &str, v: Value| format!("event: {n}\ndata: {v}\n\n");
    let openai_usage = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 40,
        "total_tokens": 1040}});
    for (up, pieces) in [
        (
            Up::Anthropic,
            vec![
                named(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_1",
                    "type": "message", "role": "assistant", "model": "claude", "content": [],
                    "stop_reason": null, "usage": {"input_tokens": 1000, "output_tokens": 1}}}),
                ),
                named(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                ),
                named(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": TEXT}}),
                ),
                named(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                named(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": 40}}),
                ),
                named("ping", json!({"type": "ping"})),
            ],
        ),
        (
            Up::OpenAi,
            vec![
                data(
                    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {"content": TEXT},
                    "finish_reason": null}]}),
                ),
                data(
                    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                ),
                data(openai_usage),
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let script = Script {
            raw_stream: Some(pieces),
            raw_repeat: 1 << 40,
            raw_hold: true,
            ..Script::default()
        };
        let c = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            stream(&app, up, &format!("endless-{what}"), script, 4096),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: the stream did not complete in 60 s"));
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// After its finish a lying upstream tells a new usage every 50 ms for 100 s, never the
/// same twice, and never ends its body: only the answer's own text holds the stream open
/// after the finish, so the gateway waits no longer than the idle timeout after the last
/// of it, then completes the stream, charged the last usage it read and told the client.
#[tokio::test]
async fn usage_that_keeps_changing_after_the_finish_does_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let mut events = vec![
        chunk(
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    events.extend((0..2000).map(|i| {
        chunk(
            json!([]),
            json!({"prompt_tokens": 1000, "completion_tokens": 40 + i, "total_tokens": 1040 + i}),
        )
    }));
    let script = Script {
        events: Some(events),
        chunk_delay_ms: 50,
        ..Script::default()
    };
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream(&app, Up::OpenAi, "changing", script, 4096),
    )
    .await
    .expect("the stream completes: changing usage after the finish does not hold it open");
    c.complete("changing");
    let output = c.logged.1;
    assert!((40..2040).contains(&output), "{output}");
    c.exactly("changing", 1000, output);
    app.assert_invariant().await;
}

/// Review finding (s19 attack F6): an `n` = 2 answer from a server that ignores `n` — choice
/// 0, its finish, then a new usage every 50 ms for 30 s, never ending its body — is whole at
/// its end, and its usages tell no more of it: they held the stream open as long as they
/// came (the idle clock was armed only at the finish of every choice asked for). The
/// gateway waits no longer than the idle timeout after the last of its text, then completes
/// it, charged the most reported and told the client.
#[tokio::test]
async fn usage_that_keeps_changing_after_an_answer_whole_at_its_end_does_not_hold_the_stream_open()
{
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let mut events = vec![
        chunk(
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    events.extend((0..600).map(|i| {
        chunk(
            json!([]),
            json!({"prompt_tokens": 1000, "completion_tokens": 40 + i, "total_tokens": 1040 + i}),
        )
    }));
    let script = Script {
        events: Some(events),
        chunk_delay_ms: 50,
        ..Script::default()
    };
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream_n(&app, Up::OpenAi, "ignored", script, 4096, 2),
    )
    .await
    .expect("the stream completes: usages after an answer whole at its end do not hold it open");
    c.complete("ignored");
    let output = c.logged.1;
    assert!((40..640).contains(&output), "{output}");
    c.exactly("ignored", 1000, output);
    app.assert_invariant().await;
}

/// Review finding (s19 attack F1): an `n` = 1 upstream that numbers its choices wrongly —
/// LiteLLM in front of Claude with thinking: the reasoning on index 0, the answer's text on
/// index 1, the finish on either — had the answer dropped, its client getting only the
/// reasoning and paying the usage. Before the finish such a choice reaches the client.
#[tokio::test]
async fn an_answer_on_the_wrong_choice_index_reaches_the_client() {
    let app = app().await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    for finish_on in [0, 1] {
        let user = format!("wrong{finish_on}");
        let events = vec![
            chunk(
                json!([{"index": 0, "delta": {"reasoning_content": "thinking "},
                    "finish_reason": null}]),
                Value::Null,
            ),
            chunk(
                json!([{"index": 1, "delta": {"content": TEXT}, "finish_reason": null}]),
                Value::Null,
            ),
            chunk(
                json!([{"index": finish_on, "delta": {}, "finish_reason": "stop"}]),
                Value::Null,
            ),
            chunk(
                json!([]),
                json!({"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040}),
            ),
            SseEvent::Data(json!("[DONE]")),
        ];
        let script = Script {
            events: Some(events),
            ..Script::default()
        };
        let c = stream(&app, Up::OpenAi, &user, script, 4096).await;
        let texts: String = c
            .data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .flat_map(|v| v["choices"].as_array().cloned().unwrap_or_default())
            .filter_map(|ch| ch["delta"]["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(texts, TEXT, "finish on {finish_on}: {:?}", c.data);
        c.complete(&user);
        assert_eq!(c.logged.0, 1000, "{user}");
        assert!(c.logged.1 >= 40, "{user}: {:?}", c.logged);
    }
    app.assert_invariant().await;
}

/// A ConverseStream whose `metadata` (the usage) comes before `messageStop`, and then more
/// text: that usage was not the whole answer's. It is a floor under the output counted
/// from the text the client received, never the price of text it does not cover.
#[tokio::test]
async fn a_bedrock_usage_followed_by_more_text_is_a_floor_under_the_count() {
    let app = app().await;
    let pieces = [
        vec![Piece::Text, Piece::Usage(1000, 1)],
        vec![Piece::Text; 50],
        vec![Piece::Finish(None)],
    ]
    .concat();
    let c = stream(
        &app,
        Up::Bedrock,
        "early-metadata",
        scripted(Up::Bedrock, &pieces),
        4096,
    )
    .await;
    let (_, all) = text_after_finish(&c.data);
    assert_eq!(all, TEXT.repeat(51), "the client got every delta");
    let counted = sluice::quota::estimate::count_text(&all);
    assert!(counted > 1, "{counted}");
    c.complete("bedrock");
    c.exactly("bedrock", 1000, counted);
    app.assert_invariant().await;
}

/// After the final usage the answer and its price are told: text of another choice (one
/// the client never asked for) that a lying upstream sends then neither reaches the client
/// uncharged nor holds the stream open past the idle timeout.
#[tokio::test]
async fn text_of_another_choice_after_the_final_usage_is_not_passed_on() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let pieces = [
        vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
        vec![Piece::OtherChoiceText; 100],
        vec![Piece::End],
    ]
    .concat();
    let c = stream(
        &app,
        Up::OpenAi,
        "other-choice",
        scripted(Up::OpenAi, &pieces),
        4096,
    )
    .await;
    let (after, all) = text_after_finish(&c.data);
    assert_eq!((after.as_str(), all.as_str()), ("", TEXT), "{:?}", c.data);
    c.complete("other choice");
    c.exactly("other choice", 5, 1);

    // Endless: one such chunk every 50 ms for 100 s, never an end.
    let mut script = scripted(
        Up::OpenAi,
        &[
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
            vec![Piece::OtherChoiceText; 2000],
        ]
        .concat(),
    );
    script.chunk_delay_ms = 50;
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream(&app, Up::OpenAi, "other-choice-endless", script, 4096),
    )
    .await
    .expect("another choice's text after the final usage does not hold the stream open");
    c.complete("endless other choice");
    c.exactly("endless other choice", 5, 1);
    app.assert_invariant().await;
}

/// Reports after the finish are totals of the same answer: a later, lower one (a lying or
/// confused upstream's zeros after the real figures) does not lower the price — the most
/// reported after the finish is charged, per side. The client's last usage chunk tells
/// what it is charged.
#[tokio::test]
async fn a_lower_usage_after_the_final_one_does_not_lower_the_price() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Usage(0, 0),
                Piece::End,
            ],
        ),
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 3),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Usage(0, 0),
            ],
        ),
        (
            Up::Bedrock,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
            ],
        ),
        (
            Up::Anthropic,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Finish(Some((0, 0))),
                Piece::End,
            ],
        ),
        // Two `metadata` before `messageStop`, nothing of the answer between them.
        (
            Up::Bedrock,
            vec![
                Piece::Text,
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
                Piece::Finish(None),
            ],
        ),
        // An input reported before the finish is the prompt's: not lowered after it.
        (
            Up::Anthropic,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((0, 800))),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![Piece::RunningText(1000, 1), Piece::Finish(Some((0, 800)))],
        ),
        // Each side at its most: the client's last usage chunk is the gateway's.
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(900, 800),
                Piece::Usage(1000, 3),
                Piece::End,
            ],
        ),
    ] {
        let what = format!("{up:?} {pieces:?}");
        let c = stream(
            &app,
            up,
            &format!("low-{}", what.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        c.complete(&what);
        c.exactly(&what, 1000, 800);
    }
    // The first row with `n` = 2, to a server that ignores `n`: the usage in a chunk of its
    // own makes the answer whole at its end, and the report on choice 0's finish chunk
    // before it is not lowered by it either (review finding, s20 G1: charged 0 output,
    // marked exact).
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((1000, 800))),
        Piece::Usage(1000, 0),
        Piece::End,
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "low-n2",
        scripted(Up::OpenAi, &pieces),
        4096,
        2,
    )
    .await;
    c.complete("n = 2");
    c.exactly("n = 2", 1000, 800);
    // An Anthropic client of an Anthropic upstream: the events pass as they came, but not
    // a second `message_delta` that would tell it less than it is charged.
    let (id, token) = app.token("low-anthropic-native", Some("1")).await;
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((1000, 800))),
        Piece::Finish(Some((0, 0))),
        Piece::End,
    ];
    app.mock
        .state
        .script(Up::Anthropic.key(), [scripted(Up::Anthropic, &pieces)]);
    let resp = app
        .messages(
            &token,
            &json!({"model": Up::Anthropic.model(), "stream": true, "max_tokens": 4096,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let deltas: Vec<Value> = body
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["type"] == "message_delta")
        .collect();
    assert_eq!(deltas.len(), 1, "{body}");
    assert_eq!(deltas[0]["usage"]["output_tokens"], 800, "{body}");
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent, cost(1000, 800));
    app.assert_invariant().await;
}

/// A format whose stream ends with an end event after its usage (OpenAI's usage chunk
/// and `[DONE]`, Anthropic's `message_delta` usage and `message_stop`, Bedrock's `metadata`)
/// whose body ends after the finish with neither the usage nor the end: the usage was
/// lost on the way — the stream is cut (CHECKS Q5: an error ending, not `[DONE]`), charged
/// the estimate. Gemini has no end event: its finish and the body's end complete it.
#[tokio::test]
async fn a_finish_whose_usage_and_end_never_came_is_a_cut() {
    let app = app().await;
    for (up, pieces) in [
        (Up::OpenAi, vec![Piece::Text, Piece::Finish(None)]),
        (Up::Anthropic, vec![Piece::Text, Piece::Finish(None)]),
        (Up::Bedrock, vec![Piece::Text, Piece::Finish(None)]),
    ] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("lost-{what}"),
            scripted(up, &pieces),
            100,
        )
        .await;
        let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
        assert_eq!(
            last["error"]["code"], "upstream_error",
            "{what}: {:?}",
            c.data
        );
        assert!(
            !c.data.iter().any(|d| d == "[DONE]"),
            "{what}: {:?}",
            c.data
        );
        assert_eq!(c.logged.3.as_deref(), Some("upstream_error"), "{what}");
        let counted = sluice::quota::estimate::count_text(TEXT);
        assert_eq!(c.logged.1, counted, "{what}");
        assert_eq!(c.spent, cost(c.logged.0, counted), "{what}");
    }
    app.assert_invariant().await;
}

/// An `n` > 1 stream from a server that puts a running usage on its chunks (vLLM's
/// continuous usage): the usage on the chunk that finishes choice 0 is no final word while
/// choice 1 still streams — its text reaches the client, and the last usage chunk prices it.
/// (Until s19 the request asked for one choice, and its upstream's choice 1 — one not asked
/// for, no part of the answer after the finish, `translate::stream`'s
/// `a_choice_not_asked_for_is_neither_passed_on_nor_counted_after_the_finish` — stood for
/// the second.)
#[tokio::test]
async fn another_choice_still_streaming_after_a_usage_on_the_finish_reaches_the_client() {
    let app = app().await;
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((5, 1))),
        Piece::OtherChoiceText,
        Piece::OtherChoiceText,
        Piece::OtherChoiceFinish,
        Piece::Usage(5, 9),
        Piece::End,
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "n2",
        scripted(Up::OpenAi, &pieces),
        4096,
        2,
    )
    .await;
    let (after, _) = text_after_finish(&c.data);
    assert_eq!(after, TEXT.repeat(2), "{:?}", c.data);
    c.complete("n2");
    c.exactly("n2", 5, 9);
    app.assert_invariant().await;
}

/// A server the gateway does not ask for its usage (`quirks.include_usage = false`) that
/// sends no `[DONE]` either: its finish and the body's end complete the stream (no usage was
/// lost: none was asked for), charged the count.
#[tokio::test]
async fn a_server_not_asked_for_usage_completes_at_its_finish_and_the_body_end() {
    let app = app_with(|s| {
        let oa = s.upstreams.iter_mut().find(|u| u.id == "oa").unwrap();
        oa.quirks.include_usage = false;
    })
    .await;
    let pieces = [Piece::Text, Piece::Finish(None)];
    let c = stream(
        &app,
        Up::OpenAi,
        "no-usage-asked",
        scripted(Up::OpenAi, &pieces),
        100,
    )
    .await;
    c.complete_estimated("no usage asked");
    let counted = sluice::quota::estimate::count_text(TEXT);
    assert_eq!(c.logged.1, counted);
    assert_eq!(c.spent, cost(c.logged.0, counted));
    app.assert_invariant().await;
}

/// Review finding (s18 #4): with `n` = 2, choice 0's finish started the clock of "idle after
/// the finish" while choice 1 was still generating: its chunks that told no text yet (empty
/// deltas, as a server sends while a choice thinks) were not progress, and one idle timeout
/// after choice 0's finish the stream was cut — choice 1 never reached the client, the row
/// `upstream_error`. The answer is whole only at the last choice's finish; until then each
/// event holds the stream open, as before any finish.
#[tokio::test]
async fn a_choice_still_streaming_is_not_idle_after_another_choices_finish() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1000).await;
    let value = |choices: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
    };
    let chunk = |choices: Value| SseEvent::Data(value(choices));
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let mut events = vec![text(0, TEXT), finish(0)];
    // Two seconds of choice 1's empty deltas: twice the idle timeout, no text.
    events.extend((0..8).map(|_| text(1, "")));
    events.extend([text(1, TEXT), finish(1)]);
    let mut usage = value(json!([]));
    usage["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11});
    events.extend([SseEvent::Data(usage), SseEvent::Data(json!("[DONE]"))]);
    let (id, token) = app.token("n2-thinking", Some("1")).await;
    app.mock.state.script(
        Up::OpenAi.key(),
        [Script {
            events: Some(events),
            chunk_delay_ms: 250,
            ..Script::default()
        }],
    );
    let resp = app
        .chat(
            &token,
            &json!({"model": Up::OpenAi.model(), "stream": true, "max_tokens": 100, "n": 2,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(whole);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let second: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["choices"][0]["index"] == 1)
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(second, TEXT, "choice 1 reached the client whole");
    app.wait_settled().await;
    app.wait_for_log_rows(1).await;
    let (code, input, output, charged): (Option<String>, i64, i64, i64) = sql_row(
        app.db(),
        &format!(
            "SELECT error_code, input_tokens, output_tokens, cost_micros FROM requests \
             WHERE token_id = {id}"
        ),
    )
    .await;
    assert_eq!((code, input, output, charged), (None, 5, 6, cost(5, 6)));
    app.assert_invariant().await;
}

/// The (input, output) of every usage the client was told, in order.
fn usages_told(data: &[String]) -> Vec<(i64, i64)> {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["usage"].is_object())
        .map(|v| {
            let u = &v["usage"];
            (
                u["prompt_tokens"].as_i64().unwrap_or(-1),
                u["completion_tokens"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// Review finding (s20 G2): while an `n` = 2 answer of a server that ignores `n` is whole
/// at its end, every usage in a chunk of its own reached the client as it came — repeats
/// and lower ones too — and `[DONE]` then added the gateway's: 800, 0, 800 (an SDK that
/// sums the chunks, LangChain's `add_usage`, told 1600). Only a usage that raises a side
/// above what the client was told passes; the figures it is told never go down.
#[tokio::test]
async fn usages_of_an_answer_whole_at_its_end_reach_the_client_only_when_they_rise() {
    let app = app().await;
    for (row, (pieces, told)) in [
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 0),
                Piece::End,
            ],
            vec![(1000, 800)],
        ),
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 800),
                Piece::End,
            ],
            vec![(1000, 800)],
        ),
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 700),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
                Piece::End,
            ],
            vec![(1000, 700), (1000, 800)],
        ),
        // The body ends without `[DONE]`.
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 0),
            ],
            vec![(1000, 800)],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{pieces:?}");
        let c = stream_n(
            &app,
            Up::OpenAi,
            &format!("rise-{row}"),
            scripted(Up::OpenAi, &pieces),
            4096,
            2,
        )
        .await;
        assert_eq!(usages_told(&c.data), told, "{what}: {:?}", c.data);
        c.complete(&what);
        c.exactly(&what, 1000, 800);
    }
    app.assert_invariant().await;
}

/// Review finding (s20 G3): after the finish, the LiteLLM proxy's usage chunk — its one
/// choice, choice 0, empty and already finished, so filtered out — passed as it came when
/// its figures differed from the charge (a running report before had more input), and
/// `[DONE]` then added the gateway's: two usage chunks after the finish. It is replaced by
/// the gateway's, as a usage in a chunk of its own is.
#[tokio::test]
async fn a_usage_on_a_chunk_of_finished_choices_that_differs_from_the_charge_is_replaced() {
    let app = app().await;
    let pieces = [
        Piece::RunningText(1000, 1),
        Piece::Finish(None),
        Piece::EmptyChoiceUsage(900, 800),
        Piece::End,
    ];
    let c = stream(
        &app,
        Up::OpenAi,
        "litellm",
        scripted(Up::OpenAi, &pieces),
        4096,
    )
    .await;
    // The running one on the text, then one after the finish: the charge.
    assert_eq!(
        usages_told(&c.data),
        [(1000, 1), (1000, 800)],
        "{:?}",
        c.data
    );
    c.complete("litellm");
    c.exactly("litellm", 1000, 800);
    app.assert_invariant().await;
}

/// Review finding (s20 G4): the gateway's own usage chunk (here replacing a lower usage
/// after the one on the finish) told no reasoning tokens, and said `chat.completion.chunk`
/// on a `/v1/completions` stream too: it carries the usage's details, and its `object` is
/// the upstream's chunks' (not that of Azure's first chunk, the prompt's filter verdict,
/// whose `object` is empty).
#[tokio::test]
async fn the_gateway_s_usage_chunk_tells_the_reasoning_and_the_stream_s_object() {
    let app = app().await;
    for (path, object, azure) in [
        ("/v1/chat/completions", "chat.completion.chunk", false),
        ("/v1/completions", "text_completion", false),
        ("/v1/chat/completions", "chat.completion.chunk", true),
    ] {
        let chunk = |choice: Value, usage: Value| {
            SseEvent::Data(
                json!({"id": "c1", "object": object, "created": 1, "model": "m",
                "choices": choice, "usage": usage}),
            )
        };
        let text = if object == "text_completion" {
            json!([{"index": 0, "text": TEXT, "finish_reason": null}])
        } else {
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}])
        };
        let mut finish = text.clone();
        finish[0]["finish_reason"] = json!("stop");
        let mut events = vec![
            chunk(text, Value::Null),
            chunk(
                finish,
                json!({"prompt_tokens": 1000, "completion_tokens": 800, "total_tokens": 1800,
                    "completion_tokens_details": {"reasoning_tokens": 300}}),
            ),
            chunk(
                json!([]),
                json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
            ),
            SseEvent::Data(json!("[DONE]")),
        ];
        if azure {
            events.insert(
                0,
                SseEvent::Data(json!({"choices": [], "created": 0, "id": "", "model": "",
                    "object": "", "prompt_filter_results": []})),
            );
        }
        let (_, token) = app
            .token(&format!("details-{object}-{azure}"), Some("1"))
            .await;
        app.mock.state.script(
            Up::OpenAi.key(),
            [Script {
                events: Some(events),
                ..Script::default()
            }],
        );
        let mut body = json!({"model": Up::OpenAi.model(), "stream": true, "max_tokens": 4096,
            "stream_options": {"include_usage": true}});
        if object == "text_completion" {
            body["prompt"] = json!("hi");
        } else {
            body["messages"] = json!([{"role": "user", "content": "hi"}]);
        }
        let resp = app.post(path, &token, &body).await;
        assert_eq!(resp.status(), 200, "{path}");
        let (data, whole) = sse_data(resp).await;
        assert!(whole);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
        let last: Value = data
            .iter()
            .rev()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v["usage"].is_object())
            .unwrap();
        assert_eq!(last["object"], object, "{path}: {data:?}");
        assert_eq!(last["usage"]["completion_tokens"], 800, "{path}: {data:?}");
        assert_eq!(
            last["usage"]["completion_tokens_details"]["reasoning_tokens"], 300,
            "{path}: {data:?}"
        );
    }
    app.wait_settled().await;
    app.assert_invariant().await;
}

/// Review finding (s20 G5): an `n` = 3 answer whole at its end after call 0's usage, then
/// `parted` (choice 1 starts), whole at its end again at a usage the gateway cannot read,
/// its body ending without `[DONE]`: call 0's report still counted as one made with the
/// usage that made the answer whole at its end, and the stream completed. Without a
/// readable report since it is a cut, as with `n` = 1.
#[tokio::test]
async fn a_parted_answer_whose_last_usage_cannot_be_read_is_a_cut_at_its_body_s_end() {
    let app = app().await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let text = |i: i64| {
        chunk(
            json!([{"index": i, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        )
    };
    let finish = |i: i64| {
        chunk(
            json!([{"index": i, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        )
    };
    let events = vec![
        text(0),
        finish(0),
        chunk(
            json!([]),
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
        ),
        text(1),
        finish(1),
        chunk(json!([]), json!({"prompt_tokens": 10})),
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "parted-unread",
        Script {
            events: Some(events),
            ..Script::default()
        },
        4096,
        3,
    )
    .await;
    assert!(!c.data.iter().any(|d| d == "[DONE]"), "{:?}", c.data);
    let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{:?}", c.data);
    assert_eq!(c.logged.3.as_deref(), Some("upstream_error"));
    app.assert_invariant().await;
}

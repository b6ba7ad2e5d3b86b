//! A stream is charged what its upstream reported, wherever in the stream it said it —
//! table-driven over the upstream formats (OpenAI, Anthropic, Gemini, Bedrock; the
//! Responses API apart), each scripted on the mock and reached by an OpenAI client that
//! asked for the usage chunk. A usage of zeros costs 0; a usage after the finish (in an
//! event of its own, before a body that ends, breaks or stalls) is the price; a usage
//! reported twice costs the last; a usage over the reservation is charged the reservation
//! with the rest absorbed; a finish without any usage is charged the estimate. See
//! `translate::stream`'s module doc for the rule.

mod choices;
mod ending;
mod idle;
mod price;
mod reports;
mod script;
mod told;

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::Script;

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

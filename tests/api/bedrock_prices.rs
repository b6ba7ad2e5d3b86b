//! A Bedrock route priced by the bundled table through its Bedrock model id: Claude 4.5 and
//! later at Anthropic's list price on a `global.` profile and 1.1 × it elsewhere, every
//! kind, without a price in config; a config price still wins; an id that is not such a
//! Claude (Nova, an older Claude) is refused at start without a price, naming the model.

use serde_json::json;
use sluice::config::{PriceKeys, Provider, Secret, UpstreamSettings};
use sluice::mock::Script;

use crate::helpers::{assert_config_accepted, assert_start_refused, model, spawn_app_with};

const US: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const BARE: &str = "anthropic.claude-sonnet-4-5-20250929-v1:0";
const GLOBAL: &str = "global.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// 1 000 prompt tokens of which 600 read from the cache, 24 out: Bedrock reports
/// `inputTokens` 400 and `cacheReadInputTokens` 600.
fn usage() -> Script {
    Script {
        prompt_tokens: Some(1000),
        cached_tokens: Some(600),
        completion_tokens: Some(24),
        ..Script::default()
    }
}

/// Each model, one route to its Bedrock id, and what the usage above costs there, by hand
/// from the bundled Claude Sonnet 4.5 entry (3 USD per Mtok in, 0.30 cache reads, 15 out):
/// - `global.`: 400 × 3 + 600 × 0.30 + 24 × 15 = 1 200 + 180 + 360;
/// - a geographic profile and the bare (in-Region) id, every rate × 1.1:
///   400 × 3.30 + 600 × 0.33 + 24 × 16.50 = 1 320 + 198 + 396;
/// - the `us.` id with input and output in config (3 and 15): those win, the cache reads
///   it leaves out come from the bundled layer, at 0.33: 1 200 + 198 + 360.
const CASES: [(&str, &str, i64); 4] = [
    ("sonnet-global", GLOBAL, 1_740),
    ("sonnet-us", US, 1_914),
    ("sonnet-bare", BARE, 1_914),
    ("sonnet-configured", US, 1_758),
];

#[tokio::test]
async fn a_bedrock_claude_id_without_a_config_price_is_charged_the_bundled_figures() {
    let app = spawn_app_with(|s, mock| {
        s.upstreams = vec![UpstreamSettings {
            id: "br".into(),
            provider: Provider::Bedrock,
            base_url: mock.base_url(),
            region: Some("us-east-1".into()),
            access_key_id: Some("AKIDBR".into()),
            secret_access_key: Some(Secret(secrecy::SecretString::from("bedrock-secret"))),
            allow_private_network: true,
            ..UpstreamSettings::default()
        }];
        s.models = CASES
            .iter()
            .map(|&(name, id, _)| {
                let mut m = model(name, &["br"]);
                m.routes[0].model = id.into();
                m.price = match name {
                    "sonnet-configured" => PriceKeys::usd(3.0, 15.0),
                    _ => PriceKeys::default(),
                };
                m
            })
            .collect();
    })
    .await;
    app.mock.state.sticky("AKIDBR", Some(usage()));
    for (name, id, charge) in CASES {
        let (token_id, token) = app.token(name, Some("10")).await;
        let body = json!({"model": name, "messages": [{"role": "user", "content": "hi"}]});
        let resp = app.post("/v1/chat/completions", &token, &body).await;
        assert_eq!(resp.status(), 200, "{name}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], 1000, "{name}");
        let sent = app.mock.state.stats("AKIDBR").last_bodies;
        assert!(!sent.is_empty(), "{name}: {id} reached Bedrock");
        let spent: i64 = app
            .scalar(&format!(
                "SELECT limit_micros - remaining_micros - reserved_micros FROM tokens \
                 WHERE id = {token_id}"
            ))
            .await;
        assert_eq!(spent, charge, "{name} ({id})");
    }
    app.assert_invariant().await;
}

/// `check-config` and `serve` accept a Bedrock Claude 4.5 id with no price and refuse, by
/// name, one the rule does not cover: Nova, a Claude before 4.5, and a Bedrock id on an
/// upstream that is not Bedrock.
#[tokio::test]
async fn a_bedrock_id_the_table_does_not_price_stops_the_start_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let write = |provider: &str, id: &str| {
        let auth = match provider {
            "bedrock" => {
                "region = \"us-east-1\"\naccess_key_id = \"AKIDBR\"\n\
                 secret_access_key = \"bedrock-secret\"\n"
            }
            _ => "api_key = \"sk-ant-test-0123456789\"\n",
        };
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite://{}/sluice.db\"\n\
                 [[upstreams]]\nid = \"up\"\nprovider = \"{provider}\"\n\
                 base_url = \"http://127.0.0.1:9\"\nallow_private_network = true\n{auth}\
                 [[models]]\nname = \"m\"\nroutes = [{{ upstream = \"up\", model = \"{id}\" }}]\n",
                dir.path().display()
            ),
        )
        .unwrap()
    };
    for id in [US, GLOBAL, "eu.anthropic.claude-haiku-4-5-20251001-v1:0"] {
        write("bedrock", id);
        assert_config_accepted(&config).await;
    }
    for (provider, id) in [
        ("bedrock", "amazon.nova-premier-v1:0"),
        ("bedrock", "us.anthropic.claude-3-5-sonnet-20241022-v2:0"),
        ("bedrock", "anthropic.claude-opus-4-7-v1"),
        ("anthropic", US),
    ] {
        write(provider, id);
        assert_start_refused(&config, &["model `m` has no price", id]).await;
    }
}

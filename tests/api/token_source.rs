//! The one token source (`upstream::credential::token::TokenSource`) under the same attacks
//! for both issuers — Azure's Entra ID (client-credentials) and Vertex AI (a service
//! account's signed JWT) — through the gateway to the mock's token endpoints: an endpoint
//! that fails, hangs, answers garbage or a lifetime of zero or less; a token the upstream
//! refuses (one refresh, one retry, never a loop); many requests at expiry (one exchange).
//! The failure rules are one set: a refused credential disables the key, an unusable
//! endpoint is a server error that counts toward the breaker and lets the next
//! deployment serve.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, VertexSettings};
use sluice::mock::{MockServer, Script};
use sluice::upstream::pool::Disabled;

use crate::admin_helpers::{login, make_login};
use crate::azure::{azure, entra};
use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, Engine};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemini");
const EMAIL: &str = "sluice-test@sluice-test.iam.gserviceaccount.com";
const ENTRA_SECRET: &str = "entra-token-source-secret-canary-42";
const CLIENT: &str = "app-ts";

#[derive(Clone, Copy, Debug)]
enum Issuer {
    Entra,
    Vertex,
}

const BOTH: [Issuer; 2] = [Issuer::Entra, Issuer::Vertex];

impl Issuer {
    /// The mock's script and stats key of the token endpoint.
    fn token_key(self) -> &'static str {
        match self {
            Issuer::Entra => "entra-token:app-ts",
            Issuer::Vertex => "token",
        }
    }

    /// The mock's stats key of the calls the deployment makes with its tokens.
    fn upstream_key(self) -> &'static str {
        match self {
            Issuer::Entra => "entra:app-ts",
            Issuer::Vertex => EMAIL,
        }
    }

    /// Every token issued so far no longer taken by the upstream.
    fn revoke_all(self, mock: &MockServer) {
        match self {
            Issuer::Entra => mock.state.entra.revoke_all(),
            Issuer::Vertex => mock.state.expire_vertex_tokens(),
        }
    }

    /// The lifetime of the tokens issued from now on.
    fn set_lifetime(self, mock: &MockServer, seconds: u64) {
        match self {
            Issuer::Entra => mock.state.entra.set_expires_in(seconds),
            Issuer::Vertex => {
                let pem =
                    std::fs::read_to_string(format!("{FIXTURES}/test-service-account.pub.pem"))
                        .unwrap();
                mock.state
                    .register_vertex_account(EMAIL, &pem, Some(Duration::from_secs(seconds)))
                    .unwrap();
            }
        }
    }
}

/// The gateway with `gpt-4o-mini` served by one deployment of `issuer` (deployment 0),
/// `tweak` applied last; the folder holds the service-account file.
async fn app(
    issuer: Issuer,
    tweak: impl FnOnce(&mut Settings, &MockServer),
) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sa_path = dir.path().join("sa.json");
    let app = spawn_app_with(move |s, m| configure(issuer, &sa_path, s, m, tweak)).await;
    (app, dir)
}

/// `app` with its database on `engine`.
async fn app_on(
    engine: Engine,
    issuer: Issuer,
    tweak: impl FnOnce(&mut Settings, &MockServer),
) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sa_path = dir.path().join("sa.json");
    let app = spawn_app_on(engine, move |s, m| configure(issuer, &sa_path, s, m, tweak)).await;
    (app, dir)
}

fn configure(
    issuer: Issuer,
    sa_path: &std::path::Path,
    s: &mut Settings,
    m: &MockServer,
    tweak: impl FnOnce(&mut Settings, &MockServer),
) {
    let u = match issuer {
        Issuer::Entra => {
            let mut u = azure("tok", m, "2024-10-21");
            u.api_key = Secret::default();
            u.entra = Some(entra(m, CLIENT, ENTRA_SECRET));
            u
        }
        Issuer::Vertex => {
            let text =
                std::fs::read_to_string(format!("{FIXTURES}/test-service-account.json")).unwrap();
            let mut sa: Value = serde_json::from_str(&text).unwrap();
            sa["token_uri"] = json!(format!("{}/token", m.base_url()));
            std::fs::write(sa_path, sa.to_string()).unwrap();
            Issuer::Vertex.set_lifetime(m, 3600);
            let mut u = upstream("tok", "unused", m);
            u.provider = Provider::Gemini;
            u.base_url = m.base_url();
            u.api_key = Secret::default();
            u.vertex = Some(VertexSettings {
                project: "sluice-test".into(),
                location: "us-central1".into(),
                credentials_file: sa_path.to_path_buf(),
            });
            u
        }
    };
    s.upstreams = vec![u];
    let mut gpt = model("gpt-4o-mini", &["tok"]);
    if matches!(issuer, Issuer::Entra) {
        gpt.routes[0].deployment = Some("prod-gpt4o-mini".into());
    }
    s.models = vec![gpt];
    tweak(s, m);
}

fn exchanges(app: &TestApp, issuer: Issuer) -> u64 {
    app.mock.state.stats(issuer.token_key()).count
}

fn upstream_calls(app: &TestApp, issuer: Issuer) -> u64 {
    app.mock.state.stats(issuer.upstream_key()).count
}

/// A 502 `upstream_error` in OpenAI's shape, naming no secret.
async fn assert_upstream_error(resp: reqwest::Response, issuer: Issuer) {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 502, "{issuer:?}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{issuer:?}: {text}");
    assert!(
        !text.contains(ENTRA_SECRET) && !text.contains("PRIVATE KEY"),
        "{text}"
    );
}

/// Answers a token endpoint can give that leave the deployment without a usable token:
/// each is a server error for the request (502 with no other deployment), the key is not
/// disabled, nothing reaches the upstream, and the next request is served.
#[tokio::test]
async fn an_unusable_token_answer_is_a_server_error_not_a_refused_key() {
    let unusable = [
        Script {
            status: Some(500),
            ..Script::default()
        },
        Script {
            status: Some(429),
            ..Script::default()
        },
        Script {
            raw_body: Some("<html>not a token</html>".into()),
            ..Script::default()
        },
        Script {
            body: Some(json!({"token_type": "Bearer"})),
            ..Script::default()
        },
        Script {
            body: Some(json!({"access_token": "tok-zero", "expires_in": 0})),
            ..Script::default()
        },
        Script {
            body: Some(json!({"access_token": "tok-past", "expires_in": -300})),
            ..Script::default()
        },
        Script {
            body: Some(json!({"access_token": "bad\ntoken", "expires_in": 3600})),
            ..Script::default()
        },
    ];
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |s, _| s.breaker.failure_threshold = 100).await;
        let (id, token) = app.token("dev", Some("1.00")).await;
        for (i, answer) in unusable.iter().enumerate() {
            app.mock.state.script(issuer.token_key(), [answer.clone()]);
            let resp = app.chat(&token, &chat_body(8)).await;
            assert_upstream_error(resp, issuer).await;
            assert_eq!(
                exchanges(&app, issuer),
                i as u64 + 1,
                "{issuer:?} {answer:?}"
            );
            assert_eq!(app.state.pool().disabled(0), None, "{issuer:?} {answer:?}");
            assert_eq!(upstream_calls(&app, issuer), 0, "{issuer:?} {answer:?}");
        }
        // Room for the mock's whole answer: charged its usage, nothing absorbed.
        let resp = app.chat(&token, &chat_body(64)).await;
        assert_eq!(resp.status(), 200, "{issuer:?}");
        let usage = resp.json::<Value>().await.unwrap()["usage"].clone();
        assert_eq!(upstream_calls(&app, issuer), 1);
        let spent = crate::azure::spent(&app, id).await;
        let cost = sluice::quota::pricing::cost(
            sluice::usage::Usage {
                input: usage["prompt_tokens"].as_i64().unwrap(),
                output: usage["completion_tokens"].as_i64().unwrap(),
                ..Default::default()
            },
            sluice::quota::pricing::Prices::plain(150_000, 600_000),
        );
        assert_eq!(spent, cost, "{issuer:?}: the failures cost nothing");
    }
}

/// A failing token endpoint counts toward the deployment's breaker and the fallback model
/// serves meanwhile: after the threshold the endpoint is not asked any more.
#[tokio::test]
async fn a_failing_token_endpoint_opens_the_breaker_and_the_fallback_serves() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |s, m| {
            s.breaker.failure_threshold = 3;
            s.upstreams.push(upstream("backup", KEY_B, m));
            s.models[0].fallbacks = vec!["backup-model".into()];
            s.models.push(model("backup-model", &["backup"]));
        })
        .await;
        app.mock.state.sticky(
            issuer.token_key(),
            Some(Script {
                status: Some(503),
                ..Script::default()
            }),
        );
        let (_, token) = app.token("dev", Some("1.00")).await;
        for n in 1..=5u64 {
            let resp = app.chat(&token, &chat_body(8)).await;
            assert_eq!(resp.status(), 200, "{issuer:?} request {n}");
            assert_eq!(resp.headers()["x-sluice-upstream"], "backup", "{issuer:?}");
            assert_eq!(exchanges(&app, issuer), n.min(3), "{issuer:?} request {n}");
        }
        assert_eq!(app.state.pool().disabled(0), None, "{issuer:?}");
        assert_eq!(app.mock.state.stats(KEY_B).count, 5);
        app.assert_invariant().await;
    }
}

/// A token endpoint that does not answer: each request ends at its first-byte bound as a
/// server error and the key stays enabled. The exchange runs on to its own bound
/// (`EXCHANGE_BOUND`, 30 s) whoever waits for it: a request meanwhile waits on it, not on
/// an exchange of its own (the endpoint is asked once); after it the next request exchanges
/// anew and is served. Both issuers at once, so the bound is waited out once.
#[tokio::test]
async fn a_hanging_token_endpoint_ends_at_the_first_byte_bound() {
    futures_util::future::join_all(BOTH.map(a_hanging_token_endpoint)).await;
}

async fn a_hanging_token_endpoint(issuer: Issuer) {
    let (app, _dir) = app(issuer, |s, _| {
        s.breaker.failure_threshold = 100;
        s.upstream.first_byte_timeout_ms = 1_500;
    })
    .await;
    app.mock.state.script(
        issuer.token_key(),
        [Script {
            delay_ms: 120_000,
            ..Script::default()
        }],
    );
    let (_, token) = app.token("dev", Some("1.00")).await;
    let started = std::time::Instant::now();
    for _ in 0..2 {
        let resp = tokio::time::timeout(Duration::from_secs(60), app.chat(&token, &chat_body(8)))
            .await
            .expect("the request was held past its first-byte bound");
        let status = resp.status().as_u16();
        assert!(matches!(status, 502 | 504), "{issuer:?}: {status}");
        assert_eq!(app.state.pool().disabled(0), None);
        assert_eq!(exchanges(&app, issuer), 1, "{issuer:?}");
    }
    // Past the exchange's own bound: time passing, not a condition awaited.
    let bound = sluice::upstream::credential::token::EXCHANGE_BOUND + Duration::from_secs(1);
    tokio::time::sleep(bound.saturating_sub(started.elapsed())).await;
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 200, "{issuer:?}");
    assert_eq!(exchanges(&app, issuer), 2, "{issuer:?}");
}

/// The token endpoint refusing the credentials is a refused key: disabled, an auth
/// failure, the endpoint's own words not passed to the client.
#[tokio::test]
async fn a_refused_credential_disables_the_key() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |_, _| {}).await;
        app.mock.state.script(
            issuer.token_key(),
            [Script {
                status: Some(401),
                body: Some(json!({"error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret for tenant-0123."})),
                ..Script::default()
            }],
        );
        let (_, token) = app.token("dev", Some("1.00")).await;
        let resp = app.chat(&token, &chat_body(8)).await;
        let text = resp.text().await.unwrap();
        assert!(
            !text.contains("AADSTS") && !text.contains("tenant-0123"),
            "{text}"
        );
        assert_eq!(
            app.state.pool().disabled(0),
            Some(Disabled::Auth),
            "{issuer:?}"
        );
        assert_eq!(upstream_calls(&app, issuer), 0);
    }
}

/// A token the upstream refuses before its time is replaced: one new exchange and one
/// retry, the client served, the key kept. Twenty requests refused at once share that
/// one exchange. An upstream that refuses every token gets exactly two calls per request
/// (the retry is one, never a loop) and the key is disabled.
#[tokio::test]
async fn a_refused_token_is_replaced_once_and_never_in_a_loop() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |_, _| {}).await;
        let (_, token) = app.token("dev", Some("5.00")).await;
        assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
        assert_eq!(exchanges(&app, issuer), 1);

        issuer.revoke_all(&app.mock);
        let body = chat_body(8);
        let all = futures_util::future::join_all((0..20).map(|_| app.chat(&token, &body))).await;
        for r in all {
            assert_eq!(r.status(), 200, "{issuer:?}");
        }
        assert_eq!(
            exchanges(&app, issuer),
            2,
            "{issuer:?}: one exchange for all"
        );
        assert_eq!(app.state.pool().disabled(0), None, "{issuer:?}");

        let before = upstream_calls(&app, issuer);
        app.mock.state.sticky(
            issuer.upstream_key(),
            Some(Script {
                status: Some(401),
                ..Script::default()
            }),
        );
        let resp = app.chat(&token, &chat_body(8)).await;
        assert_upstream_error(resp, issuer).await;
        assert_eq!(upstream_calls(&app, issuer) - before, 2, "{issuer:?}");
        assert_eq!(exchanges(&app, issuer), 3, "{issuer:?}");
        assert_eq!(
            app.state.pool().disabled(0),
            Some(Disabled::Auth),
            "{issuer:?}"
        );
        app.assert_invariant().await;
    }
}

/// Many requests arriving when the token has expired wait on one exchange.
#[tokio::test]
async fn requests_at_expiry_share_one_exchange() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |_, _| {}).await;
        issuer.set_lifetime(&app.mock, 2);
        let (_, token) = app.token("dev", Some("5.00")).await;
        assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
        assert_eq!(exchanges(&app, issuer), 1);
        issuer.set_lifetime(&app.mock, 3600);
        // Past the two seconds the token lives: time passing, not a condition awaited.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // The exchange takes a moment, so that the requests arrive while it is in flight.
        app.mock.state.script(
            issuer.token_key(),
            [Script {
                delay_ms: 300,
                ..Script::default()
            }],
        );
        let body = chat_body(8);
        let all = futures_util::future::join_all((0..20).map(|_| app.chat(&token, &body))).await;
        for r in all {
            assert_eq!(r.status(), 200, "{issuer:?}");
        }
        assert_eq!(exchanges(&app, issuer), 2, "{issuer:?}");
        assert_eq!(
            upstream_calls(&app, issuer),
            21,
            "no expired token sent, none refused"
        );
    }
}

/// Many requests arriving when the token has expired and the exchange fails: they wait on
/// one exchange and all share its failure (a 502 each, nothing charged, every hold
/// released) — the failing endpoint is asked once, not once per waiting request.
#[tokio::test]
async fn requests_at_expiry_share_one_failing_exchange() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |s, _| s.breaker.failure_threshold = 1_000).await;
        issuer.set_lifetime(&app.mock, 2);
        let (id, token) = app.token("dev", Some("5.00")).await;
        // Room for the mock's whole answer: nothing absorbed, the log and ledger agree.
        assert_eq!(app.chat(&token, &chat_body(64)).await.status(), 200);
        let spent_before = crate::azure::spent(&app, id).await;
        assert_eq!(exchanges(&app, issuer), 1);
        // Past the two seconds the token lives: time passing, not a condition awaited.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // A slow failure, so that every request arrives while it is in flight.
        app.mock.state.sticky(
            issuer.token_key(),
            Some(Script {
                status: Some(503),
                delay_ms: 2_000,
                ..Script::default()
            }),
        );
        let body = chat_body(8);
        let all = futures_util::future::join_all((0..20).map(|_| app.chat(&token, &body))).await;
        for r in all {
            assert_upstream_error(r, issuer).await;
        }
        assert_eq!(exchanges(&app, issuer), 2, "{issuer:?}");
        assert_eq!(upstream_calls(&app, issuer), 1, "{issuer:?}");
        assert_eq!(app.state.pool().disabled(0), None, "{issuer:?}");
        app.wait_settled().await;
        assert_eq!(
            crate::azure::spent(&app, id).await,
            spent_before,
            "{issuer:?}"
        );
        app.assert_invariant().await;
    }
}

/// A stream whose token the upstream refuses is sent again whole with a new one: the
/// retried request carries the same body as the refused one (a large one too), and the
/// client gets one complete stream, charged once.
#[tokio::test]
async fn a_refused_token_on_a_stream_resends_the_whole_body() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |_, _| {}).await;
        let (id, token) = app.token("dev", Some("5.00")).await;
        assert_eq!(app.chat(&token, &chat_body(64)).await.status(), 200);
        issuer.revoke_all(&app.mock);
        let before = upstream_calls(&app, issuer);
        let big = "engine light ".repeat(20_000);
        let body = json!({"model": "gpt-4o-mini", "max_tokens": 64, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": big}]});
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200, "{issuer:?}");
        let text = resp.text().await.unwrap();
        assert!(text.trim_end().ends_with("data: [DONE]"), "{issuer:?}");
        // The mock records only the call it served (the refused one is turned away at
        // its token check): that one carries the whole conversation.
        assert_eq!(upstream_calls(&app, issuer) - before, 1, "{issuer:?}");
        assert_eq!(exchanges(&app, issuer), 2, "{issuer:?}");
        let stats = app.mock.state.stats(issuer.upstream_key());
        let retried = stats.last_bodies.back().unwrap().to_string();
        assert!(retried.contains(&big), "{issuer:?}");
        assert_eq!(app.state.pool().disabled(0), None, "{issuer:?}");
        let spent = crate::azure::spent(&app, id).await;
        assert!(spent > 0, "{issuer:?}");
    }
}

/// A token endpoint that announces a second's lifetime and takes longer than that to
/// answer: the token's life ended on the way, so it cannot be cached — an unusable answer
/// (the upstream's breaker counts it), not an exchange for every request.
#[tokio::test]
async fn a_token_whose_life_ended_on_the_way_is_unusable() {
    for issuer in BOTH {
        let (app, _dir) = app(issuer, |_, _| {}).await;
        issuer.set_lifetime(&app.mock, 1);
        app.mock.state.sticky(
            issuer.token_key(),
            Some(Script {
                delay_ms: 1_200,
                ..Script::default()
            }),
        );
        let (_, token) = app.token("dev", Some("5.00")).await;
        let resp = app.chat(&token, &chat_body(8)).await;
        assert_upstream_error(resp, issuer).await;
        assert_eq!(upstream_calls(&app, issuer), 0, "{issuer:?}");
        app.assert_invariant().await;
    }
}

/// A rebuild of the catalog (an admin changing a model that has nothing to do with this
/// deployment) keeps the deployment's cached token: the next request is sent with it, no
/// new exchange — a price edit does not send every deployment to its token endpoint.
async fn a_catalog_rebuild_keeps_the_cached_token(engine: Engine) {
    for issuer in BOTH {
        let (app, _dir) = app_on(engine, issuer, |_, _| {}).await;
        let (_, token) = app.token("dev", Some("5.00")).await;
        assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
        assert_eq!(exchanges(&app, issuer), 1, "{issuer:?}");
        make_login(&app, "root", "admin", None).await;
        let admin = login(&app, "root").await;
        let other = json!({"routes": [{"upstream": "tok", "model": "gpt-4o"}],
                           "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0});
        let (status, body) = admin
            .send(
                reqwest::Method::PUT,
                "/admin/api/v1/models/unrelated",
                &other,
            )
            .await;
        assert_eq!(status, 200, "{issuer:?}: {body}");
        assert!(
            app.state.catalog().model("unrelated").is_some(),
            "{issuer:?}"
        );
        assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
        assert_eq!(
            exchanges(&app, issuer),
            1,
            "{issuer:?}: the cached token was kept"
        );
        assert_eq!(upstream_calls(&app, issuer), 2, "{issuer:?}");
    }
}
on_both_engines!(a_catalog_rebuild_keeps_the_cached_token);

/// An exchange started by a request that gives up (its own deadline of 200 ms, the token
/// endpoint taking 800) runs on to its end: the next request is served by that exchange's
/// token, and the endpoint was asked once.
async fn an_exchange_outlives_the_request_that_started_it(engine: Engine) {
    for issuer in BOTH {
        let (app, _dir) = app_on(engine, issuer, |s, _| s.breaker.failure_threshold = 100).await;
        app.mock.state.script(
            issuer.token_key(),
            [Script {
                delay_ms: 800,
                ..Script::default()
            }],
        );
        let (_, token) = app.token("dev", Some("5.00")).await;
        let resp = app.chat_with_deadline(&token, &chat_body(8), 200).await;
        assert!(!resp.status().is_success(), "{issuer:?}: {}", resp.status());
        let resp = app.chat(&token, &chat_body(8)).await;
        assert_eq!(resp.status(), 200, "{issuer:?}");
        assert_eq!(
            exchanges(&app, issuer),
            1,
            "{issuer:?}: one exchange for both"
        );
        assert_eq!(app.state.pool().disabled(0), None, "{issuer:?}");
        app.assert_invariant().await;
    }
}
on_both_engines!(an_exchange_outlives_the_request_that_started_it);

/// Google refuses an assertion stamped outside the minutes it tolerates (this host's clock
/// off) with `400 invalid_grant` naming the JWT's time: the gateway's own fault, not a
/// refused key — the request fails as a server error, the key is not disabled (so no
/// `key_disabled` alert: one goes out only with the disabling), and once the assertion is
/// taken the next request is served.
async fn a_vertex_assertion_refused_for_its_time_does_not_disable_the_key(engine: Engine) {
    let issuer = Issuer::Vertex;
    let (app, _dir) = app_on(engine, issuer, |_, _| {}).await;
    app.mock.state.script(
        issuer.token_key(),
        [Script {
            status: Some(400),
            body: Some(json!({"error": "invalid_grant",
                "error_description": "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."})),
            ..Script::default()
        }],
    );
    let (_, token) = app.token("dev", Some("5.00")).await;
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_upstream_error(resp, issuer).await;
    assert_eq!(app.state.pool().disabled(0), None);
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(exchanges(&app, issuer), 2);
    assert_eq!(upstream_calls(&app, issuer), 1);
    app.assert_invariant().await;
}
on_both_engines!(a_vertex_assertion_refused_for_its_time_does_not_disable_the_key);

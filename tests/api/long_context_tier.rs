//! Long-context tiers at settlement: the gateway reserves at the tier's rates a prompt whose
//! reserved input may pass a model's long-context threshold (`provider_may_count`), but the
//! provider's tokenizer can count past it what the gateway counted further below. Such an
//! answer is priced at the tier's rates (Claude
//! Sonnet 4.5: every token at 2× input and 1.5× output), streamed or not, and what passes
//! the reservation is absorbed, so the ledger is the bill.

use serde_json::json;
use sluice::config::Provider;
use sluice::mock::Script;

use crate::helpers::*;
use crate::server_tools::{app, spent_and_absorbed, KEY};

#[tokio::test]
async fn an_answer_reported_past_the_tier_is_priced_at_its_rates_and_the_rest_absorbed() {
    let app = app().await;
    for (n, stream) in [(1, false), (2, true)] {
        let (id, token) = app.token(&format!("long-{stream}"), Some("100")).await;
        app.mock.state.script(
            KEY,
            [Script {
                prompt_tokens: Some(210_000),
                completion_tokens: Some(10),
                ..Script::default()
            }],
        );
        let body = json!({"model": "sonnet-long", "max_tokens": 10, "stream": stream,
            "messages": [{"role": "user", "content": "Summarise the attached corpus."}]});
        let resp = app.messages(&token, &body).await;
        assert_eq!(resp.status(), 200, "stream={stream}");
        resp.text().await.unwrap();
        let (charged, absorbed) = spent_and_absorbed(&app, id).await;
        // 210 000 × 6 + 10 × 22.50 micro-dollars per token-million: what Anthropic bills.
        assert_eq!(charged + absorbed, 1_260_225, "stream={stream}");
        assert!(
            absorbed > 0,
            "stream={stream}: the reservation covered a small prompt"
        );
        app.wait_for_log_rows(n).await;
        let logged = app
            .scalar(&format!(
                "SELECT cost_micros FROM requests WHERE token_id = {id}"
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
    let (id, token) = app.token("near-tier", Some("100")).await;
    app.mock.state.script(
        KEY,
        [Script {
            prompt_tokens: Some(210_000),
            completion_tokens: Some(10),
            ..Script::default()
        }],
    );
    // ~150 000 tokens counted, ~165 000 reserved with the margin: under 200 000.
    let body = json!({"model": "sonnet-long", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi ".repeat(150_000)}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let (charged, absorbed) = spent_and_absorbed(&app, id).await;
    assert_eq!(charged + absorbed, 1_260_225);
    // The reservation (all of it charged) priced its ≥ 150 000 input tokens at 6 USD per
    // Mtok, the tier's, not at 3.
    assert!(
        charged >= 150_000 * 6,
        "charged {charged}, absorbed {absorbed}"
    );
    app.assert_invariant().await;
}

/// A route whose upstream model name is no bundled model's (a Bedrock inference-profile
/// ARN, a custom deployment) takes the tier of the model it serves by the gateway's name
/// (`claude-sonnet-4-5`, bundled with a tier above 200 000): an answer reported past the
/// threshold is priced at the tier's rates, not at the standard ones.
#[tokio::test]
async fn a_route_to_an_unbundled_upstream_name_takes_the_tier_of_its_gateway_model() {
    let app = spawn_app_with(|s, mock| {
        let mut an = upstream("an", KEY, mock);
        an.provider = Provider::Anthropic;
        an.base_url = mock.base_url();
        s.upstreams.push(an);
        let mut m = model("claude-sonnet-4-5", &["an"]);
        m.routes = vec![route(
            "an",
            "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3",
        )];
        m.price.input_usd_per_mtok = Some(3.0.into());
        m.price.output_usd_per_mtok = Some(15.0.into());
        m.max_input_tokens = 1_000_000;
        s.models.push(m);
    })
    .await;
    let (id, token) = app.token("arn", Some("100")).await;
    app.mock.state.script(
        KEY,
        [Script {
            prompt_tokens: Some(210_000),
            completion_tokens: Some(10),
            ..Script::default()
        }],
    );
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 10,
        "messages": [{"role": "user", "content": "Summarise the attached corpus."}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    let (charged, absorbed) = spent_and_absorbed(&app, id).await;
    // 210 000 × 6 + 10 × 22.50, as for the bundled upstream name above.
    assert_eq!(charged + absorbed, 1_260_225);
    app.assert_invariant().await;
}

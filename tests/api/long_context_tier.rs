//! Long-context tiers at settlement: the gateway reserves at the tier's rates a prompt whose
//! reserved input may pass a model's long-context threshold (`provider_may_count`), but the
//! provider's tokenizer can count past it what the gateway counted further below. Such an
//! answer is priced at the tier's rates (Claude
//! Sonnet 4.5: every token at 2× input and 1.5× output), streamed or not, and what passes
//! the reservation is absorbed, so the ledger is the bill.

use serde_json::json;
use sluice::mock::Script;

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

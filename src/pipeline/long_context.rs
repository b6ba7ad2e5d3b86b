//! Long-context tiers: some models cost more per token once a prompt passes a threshold
//! (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro above 200 000 input tokens, the bundled price
//! table's `long_context_above_tokens`). No request is refused for it: the reservation
//! prices the tier wherever the provider's tokenizer may count the reserved input — with
//! the margin, its documents at the model's whole input, a server-tool turn's every step —
//! past a candidate's threshold (`provider_may_count`, `pipeline::reservation_amount`), and
//! an answer is priced from the input it reports (`priced`): one the provider counted past
//! the threshold though the gateway counted below it is priced at the tier's rates, and
//! what passes the reservation is absorbed and shown as such, never lost from the ledger.

use crate::quota::pricing::{self, LongTier, Prices, Usage};

/// How much more a provider's tokenizer may count than the gateway's (o200k) estimate, in
/// percent: Claude's counts up to ~1.35× o200k on code and non-English text (more with its
/// newer tokenizer), Gemini's less. A reservation whose input could pass a tier's threshold
/// counted so is priced at the tier, so a prompt the provider counts past it is covered.
const PROVIDER_COUNTS_UP_TO_PERCENT: i64 = 150;

/// The most input a provider may count for `input` of the gateway's estimate.
pub fn provider_may_count(input: i64) -> i64 {
    let most = i128::from(input.max(0)) * i128::from(PROVIDER_COUNTS_UP_TO_PERCENT) / 100;
    i64::try_from(most).unwrap_or(i64::MAX)
}

/// What `usage` costs at `prices`: at the route's long-context `tier` when the reported
/// input passes its threshold (warned: the estimate fell short of the provider's count).
pub fn priced(usage: Usage, prices: Prices, tier: Option<LongTier>) -> i64 {
    let billed = prices.for_input(usage.input, tier);
    if billed != prices {
        tracing::warn!(
            input = usage.input,
            threshold = tier.map_or(0, |t| t.above),
            "an answer reported input past its model's long-context threshold: priced at the \
             dearer tier"
        );
    }
    pricing::cost(usage, billed)
}

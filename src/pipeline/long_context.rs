//! Long-context tiers: some models cost more per token once a prompt passes a threshold
//! (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro above 200 000 input tokens, the bundled price
//! table's `long_context_above_tokens`). A request whose largest step's input — counted
//! with the margin, its documents as `quota::documents` sizes them (one of unknown size: the
//! model's whole input); in a server-tool turn the last sampling step, which also reads
//! every call's result and the output before it (`kinds::Turn::last_step`) — passes the
//! threshold of any model that may serve it is refused: its reservation, at standard rates,
//! could not cover the dearer tier. The provider's tokenizer may still count past it what
//! the gateway's counted below (Claude's counts more than o200k): such an answer is priced
//! at the tier's rates, and what passes the reservation is absorbed and shown as such,
//! never lost from the ledger.

use super::attempts::Candidate;
use super::request::Prepared;
use crate::error::ApiError;
use crate::quota::pricing::{self, LongTier, Prices};
use crate::usage::Usage;

/// Refuses `p` when its reserved input on a candidate (`input`) passes that candidate's
/// long-context threshold, naming the field that carries the input.
pub fn check(
    p: &Prepared,
    candidates: &[Candidate],
    input: impl Fn(&Candidate) -> i64,
) -> Result<(), ApiError> {
    let past = candidates.iter().find_map(|c| {
        let above = c.route.long_context?.above;
        let input = input(c);
        (input > above).then_some((input, above))
    });
    match past {
        Some((input, above)) => Err(ApiError::invalid(
            p.endpoint.input_field(),
            format!(
                "`{}` may reach {input} tokens (counted, with the gateway's margin; a PDF at \
                 its pages, a document by URL or file id at the model's whole input; in a \
                 server-tool turn's last step, with every result and the output before it); \
                 `{}` bills prompts above {above} tokens at a dearer tier this gateway does \
                 not price. Shorten the input.",
                p.endpoint.input_field(),
                p.requested_model
            ),
        )),
        None => Ok(()),
    }
}

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

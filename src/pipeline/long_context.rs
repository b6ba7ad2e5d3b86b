//! Long-context tiers: some models cost more per token once a prompt passes a threshold
//! (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro above 200 000 input tokens, the bundled price
//! table's `long_context_above_tokens`). The gateway prices the standard tier only, so a
//! request whose reserved input — counted, server-tool allowance and margin, its documents
//! as `quota::documents` sizes them (one of unknown size: the model's whole input) — passes the
//! threshold of any model that may serve it is refused: it can never be billed the dearer
//! tier at the standard price.

use super::attempts::Candidate;
use super::request::Prepared;
use crate::error::ApiError;
use crate::quota::price_table;

/// Refuses `p` when its reserved input on a candidate (`input`) passes that candidate's
/// long-context threshold, naming the field that carries the input.
pub fn check(
    p: &Prepared,
    candidates: &[Candidate],
    input: impl Fn(&Candidate) -> i64,
) -> Result<(), ApiError> {
    let table = price_table::bundled();
    let past = candidates.iter().find_map(|c| {
        let above = [&c.route.model, &c.route.upstream_model]
            .into_iter()
            .filter_map(|name| table.long_context_above(name))
            .min()?;
        let input = input(c);
        (input > above).then_some((input, above))
    });
    match past {
        Some((input, above)) => Err(ApiError::invalid(
            p.endpoint.input_field(),
            format!(
                "`{}` may reach {input} tokens (counted, with the gateway's margin and \
                 server-tool allowance; a PDF at its pages, a document by URL or file id at \
                 the model's whole input); `{}` bills prompts above {above} tokens at a \
                 dearer tier this gateway does not price. Shorten the input.",
                p.endpoint.input_field(),
                p.requested_model
            ),
        )),
        None => Ok(()),
    }
}

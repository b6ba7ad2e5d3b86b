//! Long-context tiers: some models cost more per token once a prompt passes a threshold
//! (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro above 200 000 input tokens, the bundled price
//! table's `long_context_above_tokens`). The gateway prices the standard tier only, so a
//! request whose largest step's input — counted with the margin; in a server-tool turn the
//! last sampling step, which also reads every call's result and the output before it
//! (`kinds::Turn::last_step`) — passes the threshold of any model that may serve it is
//! refused: it can never be billed the dearer tier at the standard price.

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
                "`{}` may reach {input} tokens (counted, with the gateway's margin; in a \
                 server-tool turn's last step, with every result and the output before it); `{}` bills prompts above {above} tokens at a dearer \
                 tier this gateway does not price. Shorten the input.",
                p.endpoint.input_field(),
                p.requested_model
            ),
        )),
        None => Ok(()),
    }
}

//! What upstreams billed for answers the gateway refused (`attempts::Billed`): priced as a
//! served answer is, and recorded as absorbed, never charged to the token (DESIGN "Stream
//! states", non-streamed).

use super::attempts::Billed;
use super::request::Prepared;
use super::{answer_usage, long_context};
use crate::ops::metrics;
use crate::quota::reservation::Held;
use crate::store::requests::RequestRow;
use crate::upstream::providers;

/// What an upstream billed for an answer the gateway refused (`attempts::Billed`): its usage
/// as reported, a side it did not report counted as a served answer's is (`answer_usage`),
/// priced at the route that answered, as `finish` prices a served one.
fn cost(p: &Prepared, b: &Billed) -> i64 {
    let reader = p.reader(&b.route, b.dep.provider);
    let estimate = p.estimated_input_on(b.route.image_rule, b.model.max_input_tokens, reader);
    let reported = providers::answer_usage(b.read_as, &b.answer);
    let usage = answer_usage(p, estimate, reported, || {
        providers::answer_text(b.read_as, &b.answer)
    })
    .at_worst_lifetime(p.kinds.input);
    match reported.input {
        Some(_) => long_context::priced(usage, b.prices, b.route.long_context),
        None => long_context::priced_counted(usage, b.prices, b.route.long_context, reader),
    }
}

/// Records what upstreams billed for the request's refused answers (`cost`) as
/// `absorbed` ledger rows, one per attempt, and in the absorbed metric: the attempts failed,
/// so the token is charged none of it (a 502 when all fail: charged 0), but finance sees
/// every cent the providers bill (s27 translated money #6). Returns what was recorded.
pub(super) async fn absorb(p: &Prepared, held: &Held, billed: &[Billed]) -> i64 {
    if billed.is_empty() {
        return 0;
    }
    let amounts = billed.iter().map(|b| cost(p, b)).collect();
    let absorbed = held.absorb(amounts).await;
    metrics::absorbed(absorbed);
    absorbed
}

/// A request no attempt served is logged under the upstream that billed its last refused
/// answer: reconciliation reads the log by upstream and model (`finance::reconcile`, rows
/// with an upstream only), so the cost the provider billed is found where its bill has it.
/// A served request's row names the upstream that served, as ever.
pub(super) fn name_biller(log: &mut RequestRow, billed: &[Billed]) {
    if let Some(b) = billed.last() {
        log.upstream = b.dep.id.clone();
        log.served_model = b.model.name.clone();
        log.upstream_model = b.route.upstream_model.clone();
    }
}

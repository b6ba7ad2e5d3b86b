//! What a request that reached an upstream costs when it ends without an answer
//! (`Departure`), and which failed attempts billed nothing.

use super::candidates::Candidate;
use crate::config::Provider;
use crate::pipeline::long_context;
use crate::pipeline::request::Prepared;
use crate::state::AppState;
use crate::upstream::retry::Tier;
use crate::usage::Usage;

/// What a request that reached the upstream is charged when it ends without an answer — its
/// client left, its own deadline cut the attempt off, the shutdown ended it: `input` tokens
/// costing `cost` micro-dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Departure {
    pub input: i64,
    pub cost: i64,
}

/// What a request sent to candidate `c` costs if it ends before the answer (its client
/// leaves, its deadline cuts the attempt off, the shutdown ends it): the upstream had the
/// whole request and may bill all of it, which the gateway cannot know, so the input
/// reserved for it there (`Prepared::reserved_input_on`: with documents, at least the
/// model's whole input, within the window the provider serves; on Gemini each digit once
/// more, as the reservation counts it), at its price — at the dearest cache write the
/// request marked, and at a long-context tier's rates where the provider's tokenizer may
/// count that input past its threshold, as the reservation decides
/// (`long_context::priced_departed`, `provider_may_count`). A server-tool turn may have run
/// whole meanwhile (the upstream goes on without its client): every step's input
/// (`kinds::Turn::billed_input` of that input) and every search it was allowed. Never more
/// than the reservation (the same input without its margin). `call` takes the dearest of
/// the candidates a request was sent to, never one it was not.
pub(super) fn departure_on(state: &AppState, p: &Prepared, c: &Candidate) -> Departure {
    // Deployments keep their position across rebuilds; one not found (it cannot be) is
    // taken at the largest count, as the reservation takes it.
    let provider = (state.live.snapshot().catalog.deployments)
        .get(c.route.deployment)
        .map_or(Provider::Anthropic, |d| d.provider);
    let turn = p.kinds.server_tools;
    let reader = p.reader(&c.route, provider);
    let reserved = p.reserved_input_on(c.route.image_rule, c.model.max_input_tokens, reader);
    let input = Usage {
        input: turn.billed_input(reserved, p.output_cap()),
        web_search_calls: p.kinds.web_search_calls,
        ..Usage::default()
    };
    Departure {
        input: input.input,
        cost: long_context::priced_departed(
            input,
            (c.prices, p.kinds.input),
            c.route.long_context,
            reader,
        ),
    }
}

/// Whether an attempt that failed so billed nothing: the upstream refused the request
/// before working on it (a rate limit, an overload, a spent quota, a refused key, a
/// conflict, the client's own error), or it never left the gateway. A server error, a
/// timeout or a broken answer may come after the work, and the request's own deadline
/// cuts off an upstream that had it: those keep their input.
pub(super) fn bills_nothing(tier: Tier) -> bool {
    match tier {
        Tier::RateLimited
        | Tier::Overloaded
        | Tier::QuotaExhausted
        | Tier::AuthFailed
        | Tier::Conflict
        | Tier::ClientError
        | Tier::LocalResources
        | Tier::Held => true,
        Tier::ServerError | Tier::OutOfTime => false,
    }
}

/// The dearer of two departures.
pub(super) fn dearer(a: Departure, b: Departure) -> Departure {
    if (b.cost, b.input) > (a.cost, a.input) {
        b
    } else {
        a
    }
}

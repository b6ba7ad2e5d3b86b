//! The candidates of a request: the routes that may serve it, in the order they are tried,
//! each with its price at the request's start; the body each one's upstream gets; and
//! whether one may be attempted now.

use std::sync::Arc;
use std::time::Duration;

use super::run::Run;
use crate::pipeline::request::Prepared;
use crate::quota::pricing::Prices;
use crate::state::AppState;
use crate::upstream::catalog::{Deployment, Model, Route};
use crate::upstream::providers::{self, translate::TranslateError, Built};

#[derive(Debug, Clone)]
pub struct Candidate {
    pub model: Arc<Model>,
    pub route: Route,
    /// The route's prices in force when the request started (`Prepared::started_at`); its
    /// long-context tier, too, is the one in force then (`Route::at`).
    pub prices: Prices,
}

/// The routes that may serve a request, in the order they are tried, each with its price
/// at the request's start: its model's, then those of each fallback the token may use
/// (`Prepared::fallbacks`). The reservation is the worst case over these. A route without one there is left out, never served at zero
/// (none is: a catalog is built only when every route has a price from then on,
/// `Settings::check_priced`).
pub fn candidates(state: &AppState, p: &Prepared) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(p.model.routes.len());
    let live = state.live.snapshot();
    let turn = live.pool.next_turn();
    let mut push_model = |m: &Arc<Model>| {
        let start = out.len();
        let n = m.routes.len().max(1);
        for r in &m.routes {
            // A route whose provider has no such endpoint (embeddings on Anthropic) is skipped.
            let provider = live.catalog.deployments[r.deployment].provider;
            if providers::path(p.endpoint, provider).is_none() {
                continue;
            }
            match r.schedule.rates_at(p.started_at) {
                Some(prices) => out.push(Candidate {
                    model: m.clone(),
                    route: r.at(p.started_at),
                    prices,
                }),
                None => {
                    tracing::error!(model = %m.name, upstream_model = %r.upstream_model, "a route has no price in force: left out")
                }
            }
        }
        // Least in flight first; among equals, a rotating start spreads load over the pool.
        let mut keyed: Vec<(u32, usize, Candidate)> = out
            .drain(start..)
            .enumerate()
            .map(|(i, c)| {
                (
                    live.pool.in_flight(c.route.deployment),
                    (i + n - turn % n) % n,
                    c,
                )
            })
            .collect();
        keyed.sort_by_key(|(load, order, _)| (*load, *order));
        out.extend(keyed.into_iter().map(|(_, _, c)| c));
    };
    push_model(&p.model);
    for m in p.fallbacks(&live.catalog) {
        push_model(m);
    }
    out
}

/// Whether candidate `c` could take the request — `None` when its upstream no longer serves
/// the endpoint, else whether its format can express the request (`build`).
pub(super) fn could_take(
    state: &AppState,
    p: &Prepared,
    c: &Candidate,
) -> Option<Result<(), TranslateError>> {
    let catalog = state.catalog();
    let dep = &catalog.deployments[c.route.deployment];
    dep.url(&c.route, p.endpoint, p.stream)?;
    Some(build(dep, p, c).map(|_| ()))
}

/// The body for candidate `c`'s upstream, and the client fields it leaves out.
pub(super) fn build(
    dep: &Deployment,
    p: &Prepared,
    c: &Candidate,
) -> Result<Built, TranslateError> {
    // A fallback model may cap its output lower than the model asked for: sent the asked
    // model's cap, its upstream refused the request, a 400 passed to the client as its own
    // fault (s24 attack, translation #4). Lower never exceeds what was reserved.
    let cap = p.cap.map(|(_, cap)| {
        (
            c.route.cap_field(p.endpoint),
            cap.min(c.model.max_output_tokens),
        )
    });
    if p.responses.is_some() {
        providers::build_responses_request(
            dep.provider,
            &p.body,
            &c.route.upstream_model,
            cap,
            (p.stream, dep.include_usage),
        )
    } else {
        providers::build_request_with(
            p.endpoint.format(),
            providers::Destination::of(dep.provider, p.endpoint),
            &p.body,
            &c.route.upstream_model,
            cap,
            (p.stream, dep.include_usage),
        )
    }
}

/// What any candidate's upstream would leave out of the request: the announcement of a
/// stream whose headers leave before a route is taken (a queued stream), which any of
/// them may serve.
pub fn dropped_by_any(
    state: &AppState,
    p: &Prepared,
    candidates: &[Candidate],
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let catalog = state.catalog();
    let built = candidates
        .iter()
        .filter_map(|c| build(&catalog.deployments[c.route.deployment], p, c).ok());
    for built in built {
        for field in built.dropped {
            if !out.contains(&field) {
                out.push(field);
            }
        }
    }
    out
}

/// Whether a candidate may be attempted now: not disabled, not cooling down (a cooling
/// one only tells when it may serve again).
pub(super) fn ready(state: &AppState, c: &Candidate, run: &mut Run) -> bool {
    let d = c.route.deployment;
    let cooling = state.pool().cooling_ms(d, state.clock.monotonic_ms());
    if cooling > 0 {
        run.wait(Duration::from_millis(cooling));
    }
    !off(state, d) && cooling == 0
}

/// Whether deployment `d` takes no new attempt: disabled on this replica (quota, refused
/// key, an admin's switch), or, in the catalog of the moment, disabled by an admin for
/// every replica or removed (its requests in flight finish; no new one starts).
pub(super) fn off(state: &AppState, d: usize) -> bool {
    state.pool().is_disabled(d) || !state.catalog().usable(d)
}

//! Price edits in the admin UI and API: each appends a row to the model's price history
//! (`model_prices`, append-only) effective from `effective_from` — absent or `"now"`: the
//! edit's instant; never in the past, so a request already priced is never priced again.
//! Admins only (finance reads, a lead is told nothing exists: `Actor::require_admin`); the
//! write, its check against the whole catalog and its audit row are `upstream_ops::apply`.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::actor::Actor;
use super::error::AdminError;
use crate::clock::db_time;
use crate::config::{parse_effective, PriceKeys};
use crate::quota::pricing::Prices;
use crate::quota::schedule::Appended;
use crate::state::AppState;
use crate::store::prices::{prices_json, PriceRow};

/// A price edit's body: the price keys of `[[models]]` and `effective_from`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Edit {
    #[serde(default)]
    effective_from: Option<Value>,
    #[serde(flatten)]
    keys: PriceKeys,
}

/// The row an edit of `model`'s price appends, read from its body.
pub fn edit(
    state: &AppState,
    actor: &Actor,
    model: &str,
    body: Value,
) -> Result<PriceRow, AdminError> {
    let catalog = state.catalog();
    let m = catalog.model(model).ok_or(AdminError::NotFound)?;
    let set_for: Vec<String> = m.routes.iter().map(|r| r.model.clone()).collect();
    let name = m.name.clone();
    let e: Edit = serde_json::from_value(body)
        .map_err(|e| AdminError::invalid(format!("The price does not read: {e}.")))?;
    if e.keys.is_empty() {
        return Err(AdminError::invalid(
            "A price needs `input_usd_per_mtok` and `output_usd_per_mtok`.",
        ));
    }
    row(state, actor, (&name, &set_for), &e.keys, e.effective_from)
}

/// The row appending `keys` to `model`'s prices from `effective_from` (absent or "now":
/// the edit's instant), set for the upstream models its routes serve (`set_for`). A date
/// in the past is refused, naming the field.
pub fn row(
    state: &AppState,
    actor: &Actor,
    (model, set_for): (&str, &[String]),
    keys: &PriceKeys,
    effective_from: Option<Value>,
) -> Result<PriceRow, AdminError> {
    let prices = keys
        .partial(model)
        .map_err(|e| AdminError::invalid(e.to_string()))?
        .ok_or_else(|| {
            AdminError::invalid("A price needs `input_usd_per_mtok` and `output_usd_per_mtok`.")
        })?;
    let now = state.clock.now();
    let from = match effective_from {
        None | Some(Value::Null) => now,
        Some(Value::String(s)) if s == "now" => now,
        Some(Value::String(s)) => parse_effective(&s).ok_or_else(|| {
            AdminError::invalid(format!(
                "`effective_from` {s:?} is not a date (2026-03-01), an RFC 3339 instant or \"now\"."
            ))
        })?,
        Some(other) => {
            return Err(AdminError::invalid(format!(
            "`effective_from` {other} is not a date (2026-03-01), an RFC 3339 instant or \"now\"."
        )))
        }
    };
    // Stored to the millisecond, compared as stored.
    let from_ms = db_time(from);
    if from_ms < db_time(now) {
        return Err(AdminError::invalid(format!(
            "`effective_from` {from_ms} is in the past: a price applies from now on (requests already priced keep their price)."
        )));
    }
    Ok(PriceRow {
        model: model.to_string(),
        effective_from: from_ms,
        prices: prices_json(Some(&prices), set_for),
        created_by: actor.audit_name.clone(),
        created_at: db_time(now),
    })
}

fn prices_view(p: &Prices) -> Value {
    json!({
        "input_micros_per_mtok": p.input,
        "output_micros_per_mtok": p.output,
        "cached_input_micros_per_mtok": p.cached_input,
    })
}

/// An appended row as the audit log and the API show it, with the upstream models it was
/// set for.
pub fn row_view(row: &PriceRow) -> Value {
    let mut v = match row.appended() {
        Some(Appended {
            prices: Some(p),
            set_for,
            ..
        }) => {
            let mut v = prices_view(&p.prices);
            if let Some(set_for) = set_for {
                v["upstream_models"] = json!(set_for);
            }
            v
        }
        _ => json!({"withdrawn": true}),
    };
    v["effective_from"] = json!(row.effective_from);
    v
}

/// Whether `row` would only repeat the admin price in force at its instant, set for the
/// same upstream models (an edit that saves a model unchanged): then nothing is appended.
pub fn repeats(rows: &[PriceRow], row: &PriceRow) -> bool {
    let Some(new) = row.appended() else {
        return false;
    };
    rows.iter()
        .filter(|r| r.model == row.model)
        .filter_map(|r| r.appended())
        .filter(|a| a.from <= new.from)
        .max_by_key(|a| a.from)
        .is_some_and(|a| a.prices == new.prices && a.set_for == new.set_for)
}

/// Why an admin price does not price a route: it was set for other upstream models.
pub fn not_applied(set_for: &[String], upstream_model: &str) -> String {
    format!(
        "the admin price in force was set for upstream model(s) {}; this route serves `{}`: \
         its config or bundled price applies until a price is set again",
        set_for.join(", "),
        upstream_model
    )
}

/// `model`'s admin row in force at `at` (a price or a withdrawal).
fn admin_in_force(rows: &[PriceRow], model: &str, at: DateTime<Utc>) -> Option<Appended> {
    rows.iter()
        .filter(|r| r.model == model)
        .filter_map(|r| r.appended())
        .filter(|a| a.from <= at)
        .max_by_key(|a| a.from)
}

/// The row that ends `model`'s admin prices at `now` (its model is deleted in the admin,
/// and its config or bundled price applies again), when `rows` give it one in force then.
pub fn withdrawal(
    rows: &[PriceRow],
    model: &str,
    now: DateTime<Utc>,
    actor: &Actor,
) -> Option<PriceRow> {
    admin_in_force(rows, model, now)?.prices?;
    Some(PriceRow {
        model: model.to_string(),
        effective_from: db_time(now),
        prices: prices_json(None, &[]),
        created_by: actor.audit_name.clone(),
        created_at: db_time(now),
    })
}

/// A model's price in force at `at` (its first route's) and its source, as audit rows show
/// what an edit replaced.
pub fn price_fields(state: &AppState, model: &str, at: DateTime<Utc>) -> Option<Value> {
    let catalog = state.catalog();
    let (source, d) = catalog
        .model(model)?
        .routes
        .first()?
        .schedule
        .in_force(at)?;
    let mut v = prices_view(&d.prices);
    v["source"] = json!(source.as_str());
    Some(v)
}

/// A model's price history: every route's price in force now and its source, and the rows
/// admins appended. Admins and finance read it.
pub async fn history(state: &AppState, actor: &Actor, model: &str) -> Result<Value, AdminError> {
    actor.require_global_reader()?;
    let catalog = state.catalog();
    let m = catalog.model(model).ok_or(AdminError::NotFound)?;
    let now = state.clock.now();
    let routes: Vec<Value> = m
        .routes
        .iter()
        .map(|r| {
            let mut v = json!({
                "upstream": catalog.deployments[r.deployment].id,
                "model": r.upstream_model,
            });
            if let Some((source, d)) = r.schedule.in_force(now) {
                v["in_force"] = prices_view(&d.prices);
                v["in_force"]["source"] = json!(source.as_str());
            }
            if let Some(set_for) = r.schedule.admin_set_aside(now) {
                v["admin_price_not_applied"] = json!(not_applied(set_for, &r.model));
            }
            v
        })
        .collect();
    let rows = crate::store::prices::all(&state.db).await?;
    let appended: Vec<Value> = rows
        .iter()
        .filter(|r| r.model == m.name)
        .map(|r| {
            let mut v = row_view(r);
            v["created_by"] = json!(r.created_by);
            v["created_at"] = json!(r.created_at);
            v
        })
        .collect();
    Ok(json!({"model": m.name, "routes": routes, "admin_prices": appended}))
}

//! Upstream keys and their live state on this replica: enabled, disabled (and why), cooling
//! down until when, requests in flight. Keys are shown masked (last 4 characters) and never
//! returned whole. Admins may disable and re-enable a key: a key added in the admin
//! (`upstream_ops`) for every replica, a key of the config file on this replica only (each
//! replica keeps its own pool state, as the request path does).

use actix_web::{web, HttpResponse};
use askama::Template;
use chrono::{TimeZone, Utc};
use serde::Serialize;
use serde_json::json;

use super::actor::Actor;
use super::error::AdminError;
use super::input::Input;
use super::view::{self, Chrome};
use crate::state::AppState;
use crate::upstream::pool::Disabled;

#[derive(Debug, Serialize)]
pub struct UpstreamView {
    pub id: String,
    /// `config` (read-only here) or `admin` (added in the UI or API).
    pub source: &'static str,
    pub provider: String,
    pub base_url: String,
    pub key: String,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub cooling_until: Option<String>,
    pub in_flight: u32,
    /// The circuit breaker: closed, half_open or open.
    pub breaker: &'static str,
}

/// Every upstream as admins and finance see it (the key masked); leads are told nothing
/// exists. Finance reads everything and changes nothing: the writes check `require_admin`.
pub fn list(state: &AppState, actor: &Actor) -> Result<Vec<UpstreamView>, AdminError> {
    actor.require_global_reader()?;
    // A rest is kept on the monotonic clock (`upstream::pool`): shown at the wall time it
    // ends, its time left from now.
    let (now_ms, wall_ms) = (
        state.clock.monotonic_ms(),
        state.clock.now().timestamp_millis(),
    );
    let live = state.live.snapshot();
    let (catalog, pool) = (&live.catalog, &live.pool);
    Ok(catalog
        .deployments
        .iter()
        .enumerate()
        .filter(|(i, _)| !catalog.retired[*i])
        .map(|(i, d)| {
            let reason = if d.usable {
                pool.disabled(i)
            } else {
                Some(Disabled::Admin)
            };
            let left = i64::try_from(pool.cooling_ms(i, now_ms)).unwrap_or(i64::MAX);
            UpstreamView {
                id: d.id.clone(),
                source: if d.managed { "admin" } else { "config" },
                provider: d.provider.as_str().to_string(),
                base_url: d.base_url.clone(),
                key: d.api_key.masked(),
                enabled: reason.is_none(),
                disabled_reason: reason.map(|r| r.as_str().to_string()),
                cooling_until: (left > 0)
                    .then(|| {
                        Utc.timestamp_millis_opt(wall_ms.saturating_add(left))
                            .single()
                            .map(crate::clock::db_time)
                    })
                    .flatten(),
                in_flight: pool.in_flight(i),
                breaker: pool.breakers[i].state().as_str(),
            }
        })
        .collect())
}

/// Enables or disables one key, with an audit row (before → after).
pub async fn set_enabled(
    state: &AppState,
    actor: &Actor,
    id: &str,
    enable: bool,
) -> Result<UpstreamView, AdminError> {
    actor.require_admin()?;
    let catalog = state.catalog();
    let d = catalog.position(id).ok_or(AdminError::NotFound)?;
    if catalog.deployments[d].managed {
        super::upstream_ops::set_enabled(state, actor, id, enable).await?;
        return view(state, actor, id);
    }
    let before = state
        .pool()
        .disabled(d)
        .map(|r| r.as_str())
        .unwrap_or("enabled");
    let after = if enable {
        "enabled"
    } else {
        Disabled::Admin.as_str()
    };
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let action = if enable {
        "upstream.enable"
    } else {
        "upstream.disable"
    };
    let (b, a) = (
        json!({"state": before}).to_string(),
        json!({"state": after}).to_string(),
    );
    actor
        .audit(
            &mut tx,
            action,
            &format!("upstream:{id}"),
            Some(&b),
            Some(&a),
            now,
        )
        .await?;
    tx.commit().await?;
    // The pool is switched only once the audit row is committed: switched first, a row
    // that could not be written left the key switched, unaudited.
    if enable {
        // Enabled at once (a handler dropped while Redis answers must not leave the key off
        // after its audit row says on), then its cooldown shared through Redis cleared —
        // left there, the next exchange (within 250 ms) put it back on this replica and kept
        // it on the others — and enabled again past what an exchange meanwhile re-adopted.
        state.pool().enable(d);
        if let Some(redis) = state.windows.redis() {
            let name = state.catalog().deployments[d].shared_name();
            if let Err(e) = redis.clear_cooldown(&name).await {
                tracing::warn!(upstream = %id, error = %e, "could not clear the key's shared cooldown");
            }
            state.pool().enable(d);
        }
    } else {
        state.pool().disable(d, Disabled::Admin);
    }
    view(state, actor, id)
}

/// One upstream as `list` shows it.
pub fn view(state: &AppState, actor: &Actor, id: &str) -> Result<UpstreamView, AdminError> {
    list(state, actor)?
        .into_iter()
        .find(|u| u.id == id)
        .ok_or(AdminError::NotFound)
}

#[derive(Template)]
#[template(path = "admin/upstreams.html")]
struct UpstreamsPage {
    c: Chrome,
    ups: Vec<UpstreamView>,
    models: Vec<ModelLine>,
    /// Whether to offer the controls (finance reads the page without them).
    write: bool,
}

#[derive(Template)]
#[template(path = "admin/_models_table.html")]
struct ModelsTable {
    models: Vec<ModelLine>,
}

/// A model as the page lists it: one line per route, each with its own price (routes
/// to different upstream models are priced apart).
struct ModelLine {
    name: String,
    routes: Vec<RouteLine>,
}

struct RouteLine {
    route: String,
    input: String,
    output: String,
    /// Where the price in force comes from: admin, config or bundled.
    source: String,
}

fn model_lines(state: &AppState, actor: &Actor) -> Result<Vec<ModelLine>, AdminError> {
    let usd = |v: &serde_json::Value| {
        format!(
            "${}",
            crate::quota::pricing::usd(v.as_i64().unwrap_or_default())
        )
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let route_line = |r: &serde_json::Value| RouteLine {
        route: format!("{} → {}", text(&r["upstream"]), text(&r["model"])),
        input: usd(&r["input_micros_per_mtok"]),
        output: usd(&r["output_micros_per_mtok"]),
        source: match r["admin_price_not_applied"].as_str() {
            Some(why) => format!("{} ({why})", text(&r["price_source"])),
            None => text(&r["price_source"]),
        },
    };
    Ok(super::upstream_ops::models(state, actor)?
        .iter()
        .map(|m| ModelLine {
            name: text(&m["name"]),
            routes: m["routes"]
                .as_array()
                .map(|r| r.iter().map(route_line).collect())
                .unwrap_or_default(),
        })
        .collect())
}

#[derive(Template)]
#[template(path = "admin/_upstreams_table.html")]
struct UpstreamsTable {
    ups: Vec<UpstreamView>,
    write: bool,
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let ups = list(&state, &actor)?;
    view::html(&UpstreamsPage {
        c: Chrome::new(&actor, "upstreams"),
        ups,
        models: model_lines(&state, &actor)?,
        write: actor.is_admin(),
    })
}

pub async fn toggle(
    actor: Actor,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, AdminError> {
    let (id, action) = path.into_inner();
    let enable = match action.as_str() {
        "enable" => true,
        "disable" => false,
        _ => return Err(AdminError::NotFound),
    };
    let u = set_enabled(&state, &actor, &id, enable).await?;
    let msg = format!(
        "Upstream {} {}.",
        u.id,
        if enable { "enabled" } else { "disabled" }
    );
    view::html_with_flash(
        &UpstreamsTable {
            ups: list(&state, &actor)?,
            write: actor.is_admin(),
        },
        &msg,
    )
}

fn table_with(state: &AppState, actor: &Actor, msg: &str) -> Result<HttpResponse, AdminError> {
    view::html_with_flash(
        &UpstreamsTable {
            ups: list(state, actor)?,
            write: actor.is_admin(),
        },
        msg,
    )
}

/// The "Add a key" form.
#[derive(Debug, serde::Deserialize)]
pub struct KeyForm {
    id: String,
    provider: String,
    base_url: String,
    api_key: String,
    #[serde(default)]
    allow_private_network: Option<String>,
}

pub async fn add_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(f): Input<KeyForm>,
) -> Result<HttpResponse, AdminError> {
    let table = json!({
        "id": f.id, "provider": f.provider, "base_url": f.base_url, "api_key": f.api_key,
        "allow_private_network": f.allow_private_network.is_some(),
    });
    super::upstream_ops::add(&state, &actor, table).await?;
    table_with(&state, &actor, &format!("Upstream {} added.", f.id))
}

#[derive(Debug, serde::Deserialize)]
pub struct RotateForm {
    api_key: String,
}

pub async fn rotate_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<String>,
    Input(f): Input<RotateForm>,
) -> Result<HttpResponse, AdminError> {
    super::upstream_ops::rotate(&state, &actor, &id, &f.api_key).await?;
    table_with(&state, &actor, &format!("Key of upstream {id} rotated."))
}

pub async fn delete_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, AdminError> {
    super::upstream_ops::delete(&state, &actor, &id).await?;
    table_with(&state, &actor, &format!("Upstream {id} deleted."))
}

pub async fn test_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<String>,
) -> Result<HttpResponse, AdminError> {
    let t = super::upstream_ops::test(&state, &actor, &id).await?;
    let verdict = if t.ok { "works" } else { "failed" };
    let msg = format!(
        "Test of {}: {verdict}. {} ({} ms, model {}).",
        t.id, t.message, t.elapsed_ms, t.model
    );
    table_with(&state, &actor, &msg)
}

/// The "Add or change a model" form: one route and its prices, appended to the model's
/// price history from `effective_from` (blank: now).
#[derive(Debug, serde::Deserialize)]
pub struct ModelForm {
    name: String,
    upstream: String,
    model: String,
    input_usd_per_mtok: String,
    output_usd_per_mtok: String,
    /// The other kinds' prices : left empty, a kind takes its
    /// default (`PriceKeys::prices`).
    #[serde(default)]
    cached_input_usd_per_mtok: String,
    #[serde(default)]
    cache_write_5m_usd_per_mtok: String,
    #[serde(default)]
    cache_write_1h_usd_per_mtok: String,
    #[serde(default)]
    reasoning_usd_per_mtok: String,
    #[serde(default)]
    audio_input_usd_per_mtok: String,
    #[serde(default)]
    audio_output_usd_per_mtok: String,
    #[serde(default)]
    image_input_usd_per_mtok: String,
    #[serde(default)]
    image_output_usd_per_mtok: String,
    #[serde(default)]
    web_search_usd_per_1k_calls: String,
    #[serde(default)]
    effective_from: String,
}

pub async fn model_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(f): Input<ModelForm>,
) -> Result<HttpResponse, AdminError> {
    // Decimal strings, read exactly (`config::Usd`); a blank date is now.
    let mut table = json!({
        "routes": [{"upstream": f.upstream, "model": f.model}],
        "input_usd_per_mtok": f.input_usd_per_mtok.trim(),
        "output_usd_per_mtok": f.output_usd_per_mtok.trim(),
    });
    for (key, v) in [
        ("cached_input_usd_per_mtok", &f.cached_input_usd_per_mtok),
        (
            "cache_write_5m_usd_per_mtok",
            &f.cache_write_5m_usd_per_mtok,
        ),
        (
            "cache_write_1h_usd_per_mtok",
            &f.cache_write_1h_usd_per_mtok,
        ),
        ("reasoning_usd_per_mtok", &f.reasoning_usd_per_mtok),
        ("audio_input_usd_per_mtok", &f.audio_input_usd_per_mtok),
        ("audio_output_usd_per_mtok", &f.audio_output_usd_per_mtok),
        ("image_input_usd_per_mtok", &f.image_input_usd_per_mtok),
        ("image_output_usd_per_mtok", &f.image_output_usd_per_mtok),
        (
            "web_search_usd_per_1k_calls",
            &f.web_search_usd_per_1k_calls,
        ),
    ] {
        if !v.trim().is_empty() {
            table[key] = json!(v.trim());
        }
    }
    if !f.effective_from.trim().is_empty() {
        table["effective_from"] = json!(f.effective_from.trim());
    }
    super::upstream_ops::put_model(&state, &actor, &f.name, table).await?;
    view::html_with_flash(
        &ModelsTable {
            models: model_lines(&state, &actor)?,
        },
        &format!("Model {} saved.", f.name),
    )
}

//! Upstream keys and models managed in the admin UI and API (issue 19): add, rotate a key,
//! disable and enable, delete, test; add, change and delete models. Admins only. Each
//! change reads the managed rows inside one write transaction (`Db::begin`: admin writes
//! run one at a time on both engines), is checked against the whole catalog it makes (the
//! same `Settings::validate` as the config file, `upstream::live::effective`), commits with
//! its audit row and a bump of `catalog_epoch` in that one transaction, and is applied on this replica before the answer (the others
//! follow within the poll, or at once on PostgreSQL). Keys are sealed before they reach the
//! store, bound to their row (`UpstreamRow::purpose`), and shown afterwards by their last
//! 4 characters only; the audit rows carry those.
//!
//! Upstreams of the config file are read-only here (their enable switch stays this
//! replica's, as before); a model added here under a config model's name overrides it
//! until deleted.

use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::actor::Actor;
use super::error::AdminError;
use crate::config::{ModelSettings, UpstreamSettings};
use crate::state::AppState;
use crate::store::managed::{self, ModelRow, UpstreamRow};
use crate::store::prices::{self, PriceRow};
use crate::upstream::live::{effective, stored_settings, LiveError};
use crate::upstream::providers;

/// How long "test" waits for the upstream's answer.
const TEST_TIMEOUT: Duration = Duration::from_secs(15);

/// One change an admin asks for, made to the managed rows as they stand in its transaction.
enum Change {
    Add(Box<UpstreamSettings>),
    Key {
        id: String,
        key: String,
    },
    Enabled {
        id: String,
        enabled: bool,
    },
    Delete(String),
    /// A model, and the price its edit appends (`price_ops`).
    PutModel(ModelWrite<ModelRow>),
    DeleteModel(String),
    /// A price appended to a model's schedule.
    Price(PriceRow),
}

/// The writes of `Change::PutModel` and `Write::DeleteModel`: the model row, and the
/// price row appended with it (its price; for a deletion, the end of its admin prices).
type ModelWrite<T> = (T, Option<PriceRow>);

/// The store write a change makes.
enum Write {
    Insert(UpstreamRow),
    Update(UpstreamRow),
    Delete(String),
    PutModel(ModelWrite<ModelRow>),
    DeleteModel(ModelWrite<String>),
    Price(PriceRow),
}

/// An audit row's action, target, before and after.
type Audit = (&'static str, String, Option<Value>, Option<Value>);

fn refuse(e: LiveError) -> AdminError {
    match e {
        LiveError::Store(s) => s.into(),
        other => AdminError::Invalid(other.to_string()),
    }
}

/// The managed upstream `id` among `rows`, or why it cannot be changed here.
fn managed_one<'a>(
    state: &AppState,
    rows: &'a mut [UpstreamRow],
    id: &str,
) -> Result<&'a mut UpstreamRow, AdminError> {
    match rows.iter_mut().find(|r| r.id == id) {
        Some(r) => Ok(r),
        None if state.live.file().upstreams.iter().any(|u| u.id == id) => Err(
            AdminError::Conflict(format!(
                "Upstream `{id}` comes from the config file and is read-only here; change it in the file (SIGHUP reloads it)."
            )),
        ),
        None => Err(AdminError::NotFound),
    }
}

/// Reads the managed rows in a write transaction (admin writes run one at a time), makes
/// `change` to them, checks the whole catalog they make (the same `Settings::validate` as
/// the config file), stores the change with its audit row and a bump of `catalog_epoch`, and applies it here. Read,
/// check and write are one transaction: two admins' changes are checked one after the
/// other, never each against a catalog without the other's.
async fn apply(state: &AppState, actor: &Actor, change: Change) -> Result<(), AdminError> {
    let seal = &state.db.seal;
    let now = state.clock.now();
    // A write transaction is the lock: `BEGIN IMMEDIATE` on SQLite, the admin advisory
    // lock on PostgreSQL (`Db::begin`).
    let mut tx = state.db.begin().await?;
    let mut ups = managed::upstreams_in(&mut tx).await?;
    let mut models = managed::models_in(&mut tx).await?;
    let mut price_rows = prices::all_in(&mut tx).await?;
    let word = |e: bool| if e { "enabled" } else { "disabled by an admin" };
    let (write, audit): (Write, Audit) = match change {
        Change::Add(u) => {
            if u.allow_private_network && !state.settings.upstream.managed_allow_private_network {
                return Err(AdminError::invalid(
                    "`allow_private_network` is not allowed for upstreams added here: set `upstream.managed_allow_private_network = true` in the config file to allow it, or add the upstream in the config file.",
                ));
            }
            if ups.iter().any(|r| r.id == u.id) {
                return Err(AdminError::Conflict(format!(
                    "An upstream `{}` exists already.",
                    u.id
                )));
            }
            // A key pasted with its line's end is the key, not a header value that fails
            // every call.
            let key = u.api_key.expose().trim();
            let row = UpstreamRow::sealed(&u.id, stored_settings(&u), true, key, seal);
            let after = json!({
                "provider": u.provider.as_str(), "base_url": u.base_url, "key": row.key_last4,
            });
            ups.push(row.clone());
            let target = format!("upstream:{}", u.id);
            (
                Write::Insert(row),
                ("upstream.add", target, None, Some(after)),
            )
        }
        Change::Key { id, key } => {
            let row = managed_one(state, &mut ups, &id)?;
            let before = json!({ "key": row.key_last4 });
            row.seal_key(&key, seal);
            let after = json!({ "key": row.key_last4 });
            let audit = (
                "upstream.rotate_key",
                format!("upstream:{id}"),
                Some(before),
                Some(after),
            );
            (Write::Update(row.clone()), audit)
        }
        Change::Enabled { id, enabled } => {
            let row = managed_one(state, &mut ups, &id)?;
            // The switch is sealed with the key (`UpstreamRow::purpose`): the key is sealed
            // again under the new one.
            let key = row
                .open_key(seal)
                .map_err(|_| refuse(LiveError::Sealed(id.clone())))?;
            let before = json!({ "state": word(row.enabled) });
            row.enabled = enabled;
            row.seal_key(key.expose_secret(), seal);
            let action = if enabled {
                "upstream.enable"
            } else {
                "upstream.disable"
            };
            let after = json!({ "state": word(enabled) });
            let audit = (action, format!("upstream:{id}"), Some(before), Some(after));
            (Write::Update(row.clone()), audit)
        }
        Change::Delete(id) => {
            let before = json!({ "key": managed_one(state, &mut ups, &id)?.key_last4 });
            ups.retain(|r| r.id != id);
            let audit = (
                "upstream.delete",
                format!("upstream:{id}"),
                Some(before),
                None,
            );
            (Write::Delete(id), audit)
        }
        Change::PutModel((row, price)) => {
            // What it replaces, as stored (read in this transaction), else the file's.
            let before = match models.iter().find(|m| m.name == row.name) {
                Some(old) => stored_model(old).map(|m| model_view(&m)),
                None => state
                    .live
                    .file()
                    .models
                    .iter()
                    .find(|m| m.name == row.name)
                    .map(model_view),
            };
            // Prices: the one in force now, and the one appended (else the same).
            let in_force = super::price_ops::price_fields(state, &row.name, now);
            let price = price.filter(|p| !super::price_ops::repeats(&price_rows, p));
            let before = before.map(|b| with_price(b, in_force.clone()));
            let after = stored_model(&row).map(|m| {
                let appended = price.as_ref().map(super::price_ops::row_view);
                with_price(model_view(&m), appended.or(in_force))
            });
            price_rows.extend(price.clone());
            models.retain(|m| m.name != row.name);
            models.push(row.clone());
            let target = format!("model:{}", row.name);
            (
                Write::PutModel((row, price)),
                ("model.put", target, before, after),
            )
        }
        Change::Price(row) => {
            // What was to be in force from that instant without this row.
            let at = crate::config::parse_effective(&row.effective_from).unwrap_or(now);
            let before = super::price_ops::price_fields(state, &row.model, at);
            let after = Some(super::price_ops::row_view(&row));
            price_rows.push(row.clone());
            let target = format!("model:{}", row.model);
            (Write::Price(row), ("model.price", target, before, after))
        }
        Change::DeleteModel(name) => {
            let before = models.len();
            models.retain(|m| m.name != name);
            if models.len() == before {
                return Err(AdminError::NotFound);
            }
            // Its admin prices end with it: a config model it overrode has its own again.
            let ended = super::price_ops::withdrawal(&price_rows, &name, now, actor);
            price_rows.extend(ended.clone());
            let target = format!("model:{name}");
            (
                Write::DeleteModel((name, ended)),
                ("model.delete", target, None, None),
            )
        }
    };
    effective(&state.live.file(), (&ups, &models, &price_rows), seal, now).map_err(refuse)?;
    let at = crate::clock::db_time(now);
    let found = match &write {
        Write::Insert(row) => managed::insert_upstream(&mut tx, row, &at)
            .await
            .map(|_| true)?,
        Write::Update(row) => managed::update_upstream(&mut tx, row, &at).await?,
        Write::Delete(id) => managed::delete_upstream(&mut tx, id).await?,
        Write::PutModel((row, price)) => {
            managed::put_model(&mut tx, row, &at).await?;
            if let Some(p) = price {
                prices::append(&mut tx, p).await?;
            }
            true
        }
        Write::Price(row) => prices::append(&mut tx, row).await.map(|_| true)?,
        Write::DeleteModel((name, ended)) => {
            if let Some(p) = ended {
                prices::append(&mut tx, p).await?;
            }
            managed::delete_model(&mut tx, name).await?
        }
    };
    if !found {
        return Err(AdminError::NotFound);
    }
    managed::bump_epoch(&mut tx).await?;
    let (action, target, before, after) = audit;
    let (b, a) = (before.map(|v| v.to_string()), after.map(|v| v.to_string()));
    actor
        .audit(&mut tx, action, &target, b.as_deref(), a.as_deref(), now)
        .await?;
    tx.commit().await?;
    if let Err(e) = state.live.rebuild(&state.db).await {
        // Stored and checked: the poll retries it; the answer says what was stored.
        tracing::error!(error = %e, "a managed change was stored but this replica could not apply it yet");
    }
    Ok(())
}

/// An upstream as an admin adds it: its `[[upstreams]]` table, as JSON.
pub fn parse_upstream(table: Value) -> Result<UpstreamSettings, AdminError> {
    let u: UpstreamSettings = serde_json::from_value(table)
        .map_err(|e| AdminError::invalid(format!("The upstream does not read: {e}.")))?;
    if u.id.trim().is_empty() || u.id.len() > 64 {
        return Err(AdminError::invalid("`id` must be 1 to 64 characters."));
    }
    if u.vertex.is_some()
        || u.entra.is_some()
        || u.secret_access_key.is_some()
        || u.session_token.is_some()
    {
        return Err(AdminError::invalid(
            "Upstreams signing in with `vertex`, `entra` or AWS credentials are set in the config file; here only an `api_key` is stored.",
        ));
    }
    if u.api_key.expose().trim().is_empty() {
        return Err(AdminError::invalid("`api_key` is required."));
    }
    Ok(u)
}

pub async fn add(state: &AppState, actor: &Actor, table: Value) -> Result<(), AdminError> {
    actor.require_admin()?;
    apply(state, actor, Change::Add(Box::new(parse_upstream(table)?))).await
}

/// Replaces the key: requests from now on go out with the new one; those already sent
/// finish with the old one, which is not kept.
pub async fn rotate(
    state: &AppState,
    actor: &Actor,
    id: &str,
    key: &str,
) -> Result<(), AdminError> {
    actor.require_admin()?;
    let key = key.trim();
    if key.is_empty() {
        return Err(AdminError::invalid("`api_key` is required."));
    }
    let change = Change::Key {
        id: id.to_string(),
        key: key.to_string(),
    };
    apply(state, actor, change).await
}

pub async fn set_enabled(
    state: &AppState,
    actor: &Actor,
    id: &str,
    enabled: bool,
) -> Result<(), AdminError> {
    actor.require_admin()?;
    let change = Change::Enabled {
        id: id.to_string(),
        enabled,
    };
    apply(state, actor, change).await
}

pub async fn delete(state: &AppState, actor: &Actor, id: &str) -> Result<(), AdminError> {
    actor.require_admin()?;
    apply(state, actor, Change::Delete(id.to_string())).await
}

/// What "test" found.
#[derive(Debug, Serialize)]
pub struct Tested {
    pub id: String,
    pub ok: bool,
    /// The upstream's HTTP status, when it answered.
    pub status: Option<u16>,
    pub model: String,
    pub message: String,
    pub elapsed_ms: u64,
}

/// One cheap call through the upstream as the request path would make it: a chat request
/// of one output token for the first model routed to it, within `TEST_TIMEOUT`. Works for
/// config upstreams too (nothing changes).
pub async fn test(state: &AppState, actor: &Actor, id: &str) -> Result<Tested, AdminError> {
    actor.require_admin()?;
    let catalog = state.catalog();
    let d = catalog.position(id).ok_or(AdminError::NotFound)?;
    let dep = catalog.deployments[d].clone();
    let route = catalog
        .names
        .iter()
        .filter_map(|n| catalog.model(n))
        .flat_map(|m| m.routes.iter())
        .find(|r| r.deployment == d)
        .cloned()
        .ok_or_else(|| {
            AdminError::Conflict(format!(
                "No model routes to upstream `{id}` yet: add a model with a route to it, then test."
            ))
        })?;
    let mut body = Map::new();
    body.insert(
        "messages".into(),
        json!([{"role": "user", "content": "Reply with one word."}]),
    );
    let endpoint = crate::endpoint::Endpoint::Chat;
    let built = providers::build_request_with(
        endpoint.format(),
        providers::Destination::of(dep.provider, endpoint),
        &body,
        &route.upstream_model,
        Some((route.cap_field(endpoint), 1)),
        (false, dep.include_usage),
    )
    .map_err(|e| AdminError::invalid(format!("Cannot build a test request: {e}")))?;
    // The call is real and paid for with the upstream's key, so it is an admin action like
    // any other: one row, written before the call by a credential checked now — a call is
    // never made unaudited (final review F7: written after it, a session ended meanwhile
    // left a paid call with no row). The outcome goes to the caller and the log line.
    let after =
        json!({"model": route.upstream_model, "timeout_ms": TEST_TIMEOUT.as_millis() as u64})
            .to_string();
    let mut tx = state.db.begin().await?;
    actor
        .audit(
            &mut tx,
            "upstream.test",
            &format!("upstream:{id}"),
            None,
            Some(&after),
            state.clock.now(),
        )
        .await?;
    tx.commit().await?;
    let started = Instant::now();
    let sent = state
        .upstream
        .post(
            &dep,
            dep.url(&route, endpoint, false),
            built.body.into(),
            started + TEST_TIMEOUT,
            ((None, None), |_| ()),
        )
        .await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let (ok, status, message) = match sent {
        Ok(resp) => (
            true,
            Some(resp.status().as_u16()),
            "The upstream answered.".to_string(),
        ),
        Err(crate::upstream::UpstreamError::Status { status, .. }) => (
            false,
            Some(status),
            match status {
                401 | 403 => format!("The upstream refused the key ({status})."),
                _ => format!("The upstream answered {status}."),
            },
        ),
        Err(e) => (false, None, format!("No answer: {e}.")),
    };
    tracing::info!(upstream = %id, ok, status, elapsed_ms, "upstream tested");
    Ok(Tested {
        id: id.to_string(),
        ok,
        status,
        model: route.upstream_model,
        message,
        elapsed_ms,
    })
}

/// A model as an admin sets it: its `[[models]]` table, as JSON (the name from the path).
/// Its price keys are not kept in the table: they are appended to the model's price
/// history (`model_prices`), effective from `effective_from` (absent: now), never in the
/// past.
pub async fn put_model(
    state: &AppState,
    actor: &Actor,
    name: &str,
    mut table: Value,
) -> Result<(), AdminError> {
    actor.require_admin()?;
    if name.trim().is_empty() || name.len() > 128 {
        return Err(AdminError::invalid(
            "A model name must be 1 to 128 characters.",
        ));
    }
    let effective_from = match table.as_object_mut() {
        Some(o) => {
            o.insert("name".into(), json!(name));
            o.remove("effective_from")
        }
        None => None,
    };
    let mut m: ModelSettings = serde_json::from_value(table)
        .map_err(|e| AdminError::invalid(format!("The model does not read: {e}.")))?;
    if !m.prices.is_empty() {
        return Err(AdminError::invalid(format!(
            "`prices`: a dated price is appended with `effective_from` here or POST /admin/api/v1/models/{name}/prices."
        )));
    }
    let price = match std::mem::take(&mut m.price) {
        keys if keys.is_empty() => None,
        keys => {
            // Set for the upstream models the model serves once this edit applies.
            let set_for: Vec<String> = m.routes.iter().map(|r| r.model.clone()).collect();
            Some(super::price_ops::row(
                state,
                actor,
                (name, &set_for),
                &keys,
                effective_from,
            )?)
        }
    };
    let settings = serde_json::to_string(&m).map_err(|_| AdminError::Internal)?;
    let row = ModelRow {
        name: name.to_string(),
        settings,
    };
    apply(state, actor, Change::PutModel((row, price))).await
}

/// Appends a price to a model's schedule (`price_ops::row` reads it).
pub async fn put_price(
    state: &AppState,
    actor: &Actor,
    name: &str,
    body: Value,
) -> Result<PriceRow, AdminError> {
    actor.require_admin()?;
    let row = super::price_ops::edit(state, actor, name, body)?;
    apply(state, actor, Change::Price(row.clone())).await?;
    Ok(row)
}

pub async fn delete_model(state: &AppState, actor: &Actor, name: &str) -> Result<(), AdminError> {
    actor.require_admin()?;
    apply(state, actor, Change::DeleteModel(name.to_string())).await
}

/// A stored model row's settings (its name is the row's).
fn stored_model(row: &ModelRow) -> Option<ModelSettings> {
    let mut table: Value = serde_json::from_str(&row.settings).ok()?;
    table
        .as_object_mut()?
        .insert("name".into(), json!(row.name));
    serde_json::from_value(table).ok()
}

/// A model's prices as the API and the audit rows show them: every kind, in micro-dollars
/// per million tokens (web search per 1 000 calls).
fn price_fields(p: &crate::quota::pricing::Prices) -> serde_json::Map<String, Value> {
    let fields = [
        ("input_micros_per_mtok", p.input),
        ("output_micros_per_mtok", p.output),
        ("cached_input_micros_per_mtok", p.cached_input),
        ("cache_write_5m_micros_per_mtok", p.cache_write_5m),
        ("cache_write_1h_micros_per_mtok", p.cache_write_1h),
        ("reasoning_micros_per_mtok", p.reasoning),
        ("audio_input_micros_per_mtok", p.audio_input),
        ("audio_output_micros_per_mtok", p.audio_output),
        ("image_input_micros_per_mtok", p.image_input),
        ("image_output_micros_per_mtok", p.image_output),
        ("web_search_micros_per_1k_calls", p.web_search_per_1k_calls),
    ];
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect()
}

/// An audit view with a price's fields added.
fn with_price(mut view: Value, price: Option<Value>) -> Value {
    if let (Some(v), Some(Value::Object(p))) = (view.as_object_mut(), price) {
        v.extend(p);
    }
    view
}

/// A model as its audit rows show it: routes, fallbacks and its config price.
fn model_view(m: &ModelSettings) -> Value {
    let mut v = json!({
        "routes": m.routes.iter().map(|r| format!("{}:{}", r.upstream, r.model)).collect::<Vec<_>>(),
        "fallbacks": m.fallbacks,
    });
    if let (Ok(Some(p)), Some(o)) = (m.price.prices(&m.name), v.as_object_mut()) {
        o.extend(price_fields(&p));
    }
    if m.free {
        v["free"] = json!(true);
    }
    v
}

/// A model as the API shows it: each route with its price in force now and where that
/// price comes from (routes differ where the bundled table prices their upstream models
/// apart), and the model's own fields as its first route's — the route served first.
pub fn models(state: &AppState, actor: &Actor) -> Result<Vec<Value>, AdminError> {
    // A read: finance sees models as admins do (their changes check `require_admin`).
    actor.require_global_reader()?;
    let catalog = state.catalog();
    let now = state.clock.now();
    Ok(catalog
        .names
        .iter()
        .filter_map(|n| catalog.model(n))
        .map(|m| {
            let routes: Vec<Value> = m
                .routes
                .iter()
                .map(|r| {
                    let mut view = json!({
                        "upstream": catalog.deployments[r.deployment].id,
                        "model": r.upstream_model,
                    });
                    let Some(v) = view.as_object_mut() else {
                        return view;
                    };
                    if let Some((source, d)) = r.schedule.in_force(now) {
                        v.extend(price_fields(&d.prices));
                        v.insert("price_source".into(), json!(source.as_str()));
                    }
                    if let Some(set_for) = r.schedule.admin_set_aside(now) {
                        let why = super::price_ops::not_applied(set_for, &r.model);
                        v.insert("admin_price_not_applied".into(), json!(why));
                    }
                    view
                })
                .collect();
            let mut view = json!({"name": m.name, "fallbacks": m.fallbacks});
            if let (Some(v), Some(Value::Object(first))) = (view.as_object_mut(), routes.first()) {
                v.extend(
                    first
                        .iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "upstream" | "model"))
                        .map(|(k, val)| (k.clone(), val.clone())),
                );
            }
            view["routes"] = Value::Array(routes);
            view
        })
        .collect())
}

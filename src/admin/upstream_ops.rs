//! Upstream keys and models managed in the admin UI and API (issue 19): add, rotate a key,
//! disable and enable, delete, test; add, change and delete models. Admins only. Each
//! change is checked against the whole catalog first (the same `Settings::validate` as the
//! config file, `upstream::live::effective`), commits with its audit row and a bump of
//! `catalog_epoch`, and is applied on this replica before the answer (the others follow
//! within the poll, or at once on PostgreSQL). Keys are sealed before they reach the store
//! and shown afterwards by their last 4 characters only; the audit rows carry those.
//!
//! Upstreams of the config file are read-only here (their enable switch stays this
//! replica's, as before); a model added here under a config model's name overrides it
//! until deleted.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::actor::Actor;
use super::error::AdminError;
use crate::config::{ModelSettings, UpstreamSettings};
use crate::state::AppState;
use crate::store::managed::{self, key_purpose, ModelRow, UpstreamRow};
use crate::upstream::live::{effective, last4, stored_settings, LiveError};
use crate::upstream::providers;

/// How long "test" waits for the upstream's answer.
const TEST_TIMEOUT: Duration = Duration::from_secs(15);

/// One change, applied to the managed rows before it is checked and stored.
enum Change {
    Add(UpstreamRow),
    Key {
        id: String,
        sealed: Vec<u8>,
        last4: String,
    },
    Enabled {
        id: String,
        enabled: bool,
    },
    Delete(String),
    PutModel(ModelRow),
    DeleteModel(String),
}

fn refuse(e: LiveError) -> AdminError {
    match e {
        LiveError::Store(s) => s.into(),
        other => AdminError::Invalid(other.to_string()),
    }
}

/// Checks the catalog `change` would make, stores it with its audit row, and applies it
/// here.
async fn apply(
    state: &AppState,
    actor: &Actor,
    change: Change,
    audit: (&str, String, Option<Value>, Option<Value>),
) -> Result<(), AdminError> {
    let mut ups = managed::upstreams(&state.db).await?;
    let mut models = managed::models(&state.db).await?;
    match &change {
        Change::Add(row) if ups.iter().any(|r| r.id == row.id) => {
            return Err(AdminError::Conflict(format!(
                "An upstream `{}` exists already.",
                row.id
            )))
        }
        Change::Add(row) => ups.push(row.clone()),
        Change::Key { id, sealed, .. } => {
            let row = ups
                .iter_mut()
                .find(|r| &r.id == id)
                .ok_or(AdminError::NotFound)?;
            row.key_sealed = sealed.clone();
        }
        Change::Enabled { id, enabled } => {
            let row = ups
                .iter_mut()
                .find(|r| &r.id == id)
                .ok_or(AdminError::NotFound)?;
            row.enabled = *enabled;
        }
        Change::Delete(id) => {
            let before = ups.len();
            ups.retain(|r| &r.id != id);
            if ups.len() == before {
                return Err(AdminError::NotFound);
            }
        }
        Change::PutModel(row) => {
            models.retain(|m| m.name != row.name);
            models.push(row.clone());
        }
        Change::DeleteModel(name) => {
            let before = models.len();
            models.retain(|m| &m.name != name);
            if models.len() == before {
                return Err(AdminError::NotFound);
            }
        }
    }
    effective(&state.live.file(), &ups, &models, &state.db.seal).map_err(refuse)?;
    let now = state.clock.now();
    let at = crate::clock::db_time(now);
    let mut tx = state.db.begin().await?;
    let found = match &change {
        Change::Add(row) => managed::insert_upstream(&mut tx, row, &at)
            .await
            .map(|_| true)?,
        Change::Key { id, sealed, last4 } => {
            managed::set_key(&mut tx, id, sealed, last4, &at).await?
        }
        Change::Enabled { id, enabled } => managed::set_enabled(&mut tx, id, *enabled, &at).await?,
        Change::Delete(id) => managed::delete_upstream(&mut tx, id).await?,
        Change::PutModel(row) => managed::put_model(&mut tx, row, &at).await.map(|_| true)?,
        Change::DeleteModel(name) => managed::delete_model(&mut tx, name).await?,
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

fn view_of(key: &str) -> Value {
    json!({ "key": last4(key) })
}

pub async fn add(state: &AppState, actor: &Actor, table: Value) -> Result<(), AdminError> {
    actor.require_admin()?;
    let u = parse_upstream(table)?;
    // A key pasted with its line's end is the key, not a header value that fails every call.
    let key = u.api_key.expose().trim();
    let row = UpstreamRow {
        id: u.id.clone(),
        settings: stored_settings(&u),
        key_sealed: state.db.seal.seal(&key_purpose(&u.id), key.as_bytes()),
        key_last4: last4(key),
        enabled: true,
    };
    let after = json!({
        "provider": u.provider.as_str(), "base_url": u.base_url, "key": row.key_last4,
    });
    let target = format!("upstream:{}", u.id);
    apply(
        state,
        actor,
        Change::Add(row),
        ("upstream.add", target, None, Some(after)),
    )
    .await
}

/// A managed upstream's id, or why it cannot be changed here.
async fn managed_one(state: &AppState, id: &str) -> Result<UpstreamRow, AdminError> {
    let rows = managed::upstreams(&state.db).await?;
    match rows.into_iter().find(|r| r.id == id) {
        Some(r) => Ok(r),
        None if state.live.file().upstreams.iter().any(|u| u.id == id) => Err(
            AdminError::Conflict(format!(
                "Upstream `{id}` comes from the config file and is read-only here; change it in the file (SIGHUP reloads it)."
            )),
        ),
        None => Err(AdminError::NotFound),
    }
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
    let old = managed_one(state, id).await?;
    let change = Change::Key {
        id: id.to_string(),
        sealed: state.db.seal.seal(&key_purpose(id), key.as_bytes()),
        last4: last4(key),
    };
    let audit = (
        "upstream.rotate_key",
        format!("upstream:{id}"),
        Some(json!({ "key": old.key_last4 })),
        Some(view_of(key)),
    );
    apply(state, actor, change, audit).await
}

pub async fn set_enabled(
    state: &AppState,
    actor: &Actor,
    id: &str,
    enabled: bool,
) -> Result<(), AdminError> {
    actor.require_admin()?;
    let old = managed_one(state, id).await?;
    let word = |e: bool| if e { "enabled" } else { "disabled by an admin" };
    let audit = (
        if enabled {
            "upstream.enable"
        } else {
            "upstream.disable"
        },
        format!("upstream:{id}"),
        Some(json!({ "state": word(old.enabled) })),
        Some(json!({ "state": word(enabled) })),
    );
    let change = Change::Enabled {
        id: id.to_string(),
        enabled,
    };
    apply(state, actor, change, audit).await
}

pub async fn delete(state: &AppState, actor: &Actor, id: &str) -> Result<(), AdminError> {
    actor.require_admin()?;
    let old = managed_one(state, id).await?;
    let audit = (
        "upstream.delete",
        format!("upstream:{id}"),
        Some(json!({ "key": old.key_last4 })),
        None,
    );
    apply(state, actor, Change::Delete(id.to_string()), audit).await
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
    let endpoint = crate::pipeline::request::Endpoint::Chat;
    let built = providers::build_request_with(
        endpoint.format(),
        dep.provider,
        &body,
        &route.upstream_model,
        Some((route.cap_field(endpoint), 1)),
        (false, dep.include_usage),
    )
    .map_err(|e| AdminError::invalid(format!("Cannot build a test request: {e}")))?;
    let started = Instant::now();
    let sent = state
        .upstream
        .post(
            &dep,
            dep.url(route.target, endpoint, false),
            built.body.into(),
            started + TEST_TIMEOUT,
            None,
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
    if let Some(o) = table.as_object_mut() {
        o.insert("name".into(), json!(name));
    }
    let m: ModelSettings = serde_json::from_value(table)
        .map_err(|e| AdminError::invalid(format!("The model does not read: {e}.")))?;
    let before = state
        .catalog()
        .model(name)
        .map(|m| json!({"input_micros_per_mtok": m.prices.input, "output_micros_per_mtok": m.prices.output}));
    let settings = serde_json::to_string(&m).map_err(|_| AdminError::Internal)?;
    let (input, output, _) = crate::config::Settings::prices(&m);
    let after = json!({
        "routes": m.routes.iter().map(|r| format!("{}:{}", r.upstream, r.model)).collect::<Vec<_>>(),
        "fallbacks": m.fallbacks,
        "input_micros_per_mtok": input, "output_micros_per_mtok": output,
    });
    let row = ModelRow {
        name: name.to_string(),
        settings,
    };
    let audit = ("model.put", format!("model:{name}"), before, Some(after));
    apply(state, actor, Change::PutModel(row), audit).await
}

pub async fn delete_model(state: &AppState, actor: &Actor, name: &str) -> Result<(), AdminError> {
    actor.require_admin()?;
    let audit = ("model.delete", format!("model:{name}"), None, None);
    apply(state, actor, Change::DeleteModel(name.to_string()), audit).await
}

/// A model as the API shows it.
pub fn models(state: &AppState, actor: &Actor) -> Result<Vec<Value>, AdminError> {
    actor.require_admin()?;
    let catalog = state.catalog();
    Ok(catalog
        .names
        .iter()
        .filter_map(|n| catalog.model(n))
        .map(|m| {
            json!({
                "name": m.name,
                "routes": m.routes.iter().map(|r| json!({
                    "upstream": catalog.deployments[r.deployment].id, "model": r.upstream_model,
                })).collect::<Vec<_>>(),
                "fallbacks": m.fallbacks,
                "input_micros_per_mtok": m.prices.input,
                "output_micros_per_mtok": m.prices.output,
                "cached_input_micros_per_mtok": m.prices.cached_input,
            })
        })
        .collect())
}

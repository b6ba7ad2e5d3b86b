//! The catalog and key pool in use, swapped whole when they change (issue 19 "hot apply").
//!
//! What a catalog is built from: the config file's `[[upstreams]]` and `[[models]]`, plus
//! the upstreams and models managed in the admin UI and API (`store::managed`; their keys
//! opened with the database's sealer). A managed model of a config model's name replaces
//! it; a managed upstream cannot take a config upstream's id. The merged settings pass the
//! same `Settings::validate` as the file, so an admin change cannot make a catalog the
//! file could not.
//!
//! Triggers: every managed change bumps `catalog_epoch` in its transaction; each replica
//! polls it every 250 ms (`refresh`) and, on PostgreSQL, hears it at once (`Change::Catalog`);
//! `SIGHUP` re-reads the config file (`reload_file`). A rebuild that fails keeps the catalog
//! in use and says why.
//!
//! Requests take the snapshot of the moment (`catalog`, `pool`) and keep it: a swap never
//! changes the model, prices or routes of a request that started, and positions are kept
//! across catalogs (`Catalog::rebuild`), so the pool's state carries over by deployment id
//! and a removed deployment's requests in flight finish.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::catalog::{Catalog, Managed};
use super::pool::Pool;
use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::config::{ConfigError, ModelSettings, Secret, Settings, UpstreamSettings};
use crate::secrets::seal::Sealer;
use crate::store::managed::{self, ModelRow, UpstreamRow};
use crate::store::prices::{self, PriceRow};
use crate::store::{Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The file itself did not read (`SIGHUP`), as against a merged catalog not valid.
    #[error("{0}")]
    Unreadable(ConfigError),
    #[error("the master key does not open the stored key of upstream `{0}` (its row was altered, or moved from another row)")]
    Sealed(String),
    #[error("the stored settings of {0} do not read: {1}")]
    Stored(String, String),
}

/// One catalog and the pool built for it.
pub struct Snapshot {
    pub catalog: Arc<Catalog>,
    pub pool: Arc<Pool>,
}

pub struct Live {
    current: ArcSwap<Snapshot>,
    /// The config file's settings the catalog was last built from.
    file: parking_lot::Mutex<Arc<Settings>>,
    /// The `catalog_epoch` the current catalog was built at.
    epoch: AtomicI64,
    /// One rebuild at a time, so an older read never replaces a newer catalog.
    rebuilding: tokio::sync::Mutex<()>,
    /// Why the stored catalog could not be built, while it cannot (`Refreshed::Failed`).
    failing: parking_lot::Mutex<Option<String>>,
    /// The instant a rebuild checks every model has a price in force at.
    clock: Arc<dyn Clock>,
}

/// What a poll of `catalog_epoch` did.
#[derive(Debug)]
pub enum Refreshed {
    Unchanged,
    Rebuilt,
    /// The catalog in use stays; the next poll tries again. `news`: the first failure, or
    /// another reason than the last (the caller alerts once, not every poll).
    Failed {
        error: LiveError,
        news: bool,
    },
}

/// The settings a catalog is built from: the file's, with the managed upstreams (keys
/// opened) and models merged in, validated, every model with a price in force at `now`
/// (`Settings::check_priced`, the admins' `prices` included); and which upstreams are
/// managed, with the admins' prices.
pub fn effective(
    file: &Settings,
    (upstreams, models, prices): (&[UpstreamRow], &[ModelRow], &[PriceRow]),
    sealer: &Sealer,
    now: DateTime<Utc>,
) -> Result<(Settings, Managed), LiveError> {
    let mut s = file.clone();
    let mut which = Managed::default();
    for row in upstreams {
        let stored = |e: serde_json::Error| {
            LiveError::Stored(format!("upstream `{}`", row.id), e.to_string())
        };
        let mut table: serde_json::Value = serde_json::from_str(&row.settings).map_err(stored)?;
        if let Some(o) = table.as_object_mut() {
            o.insert("id".into(), row.id.clone().into());
        }
        let mut u: UpstreamSettings = serde_json::from_value(table).map_err(stored)?;
        let key = row
            .open_key(sealer)
            .map_err(|_| LiveError::Sealed(row.id.clone()))?;
        u.api_key = Secret(key);
        if s.upstreams.iter().any(|f| f.id == u.id) {
            return Err(ConfigError::Invalid(format!(
                "upstream `{}` is in the config file and was also added in the admin; remove one",
                u.id
            ))
            .into());
        }
        which.ids.insert(u.id.clone());
        which
            .sealings
            .insert(u.id.clone(), sealing(&row.key_sealed));
        // Private addresses are the file's to allow, now as when the row was added: a row
        // that opted in while the file allowed it rests while the file does not.
        let private_refused =
            u.allow_private_network && !file.upstream.managed_allow_private_network;
        if private_refused {
            tracing::warn!(upstream = %u.id, "not used: it reaches private addresses, which upstream.managed_allow_private_network no longer allows");
        }
        if !row.enabled || private_refused {
            which.disabled.insert(u.id.clone());
        }
        s.upstreams.push(u);
    }
    for row in models {
        let stored = |e: serde_json::Error| {
            LiveError::Stored(format!("model `{}`", row.name), e.to_string())
        };
        let mut table: serde_json::Value = serde_json::from_str(&row.settings).map_err(stored)?;
        if let Some(o) = table.as_object_mut() {
            o.insert("name".into(), row.name.clone().into());
        }
        let m: ModelSettings = serde_json::from_value(table).map_err(stored)?;
        match s.models.iter_mut().find(|f| f.name == m.name) {
            Some(f) => *f = m,
            None => s.models.push(m),
        }
    }
    s.validate()?;
    which.prices =
        prices::admin_prices(prices).map_err(|e| LiveError::Stored("model_prices".into(), e))?;
    s.check_priced(&which.prices, now)?;
    for u in &s.upstreams {
        let sealing = which.sealings.get(&u.id).copied().unwrap_or(0);
        let mut tagged = credentials(u);
        tagged.extend_from_slice(&sealing.to_le_bytes());
        which.shared_tags.insert(u.id.clone(), sealer.tag(&tagged));
        tagged.extend_from_slice(&hook_inputs(u));
        which
            .credential_ids
            .insert(u.id.clone(), sealer.digest(&tagged));
    }
    Ok((s, which))
}

/// Every field an upstream's calls are authorized with, each length-prefixed: a SIGHUP that
/// changes a Bedrock secret, an Entra client secret or a Vertex service account (with the
/// same `api_key`) is a new key too — what the pool learned of the old one is forgotten and
/// its cooldowns are not shared to the new one. A Vertex account counts by its file's path
/// and contents: a key file replaced in place, then a SIGHUP, is a new key as well.
fn credentials(u: &UpstreamSettings) -> Vec<u8> {
    fn secret(s: Option<&Secret>) -> &str {
        s.map_or("", |s| s.expose())
    }
    let entra = u.entra.as_ref();
    let vertex = u.vertex.as_ref();
    let account = vertex.map(|v| account_digest(&v.credentials_file));
    let path = vertex.map(|v| v.credentials_file.to_string_lossy());
    let fields: [&[u8]; 9] = [
        u.api_key.expose().as_bytes(),
        u.access_key_id.as_deref().unwrap_or("").as_bytes(),
        secret(u.secret_access_key.as_ref()).as_bytes(),
        secret(u.session_token.as_ref()).as_bytes(),
        entra.map_or("", |e| e.tenant_id.as_str()).as_bytes(),
        entra.map_or("", |e| e.client_id.as_str()).as_bytes(),
        secret(entra.map(|e| &e.client_secret)).as_bytes(),
        path.as_deref().unwrap_or("").as_bytes(),
        account.as_deref().unwrap_or(&[]),
    ];
    let mut out = Vec::new();
    for f in fields {
        out.extend_from_slice(&(f.len() as u64).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// What else a credential hook is made of (`providers::credential`), each length-prefixed:
/// the provider and its auth mode (which kind of credential), Entra's authority and scope
/// (where and for what the token is asked), the region a SigV4 signer signs for, the
/// address and reach a hook's requests take, Vertex's project and location. With
/// `credentials` and the sealing, equal bytes make the same hook, so a rebuild keeps the
/// one in use (`Catalog::rebuild`); a Bedrock signer kept across a region change signed
/// for the old region, and AWS's 403 disabled the key (s30 diff attack F2).
fn hook_inputs(u: &UpstreamSettings) -> Vec<u8> {
    let entra = u.entra.as_ref();
    let vertex = u.vertex.as_ref();
    let fields = [
        format!("{:?}", u.provider),
        format!("{:?}", u.quirks.auth),
        entra.map_or(String::new(), |e| e.authority.clone()),
        entra.map_or(String::new(), |e| e.scope.clone()),
        u.region.clone().unwrap_or_default(),
        u.base_url.clone(),
        u.allow_private_network.to_string(),
        vertex.map_or(String::new(), |v| v.project.clone()),
        vertex.map_or(String::new(), |v| v.location.clone()),
    ];
    let mut out = Vec::new();
    for f in fields {
        out.extend_from_slice(&(f.len() as u64).to_le_bytes());
        out.extend_from_slice(f.as_bytes());
    }
    out
}

/// The SHA-256 of a service-account file's bytes (it holds a private key: only its digest
/// goes into the keyed tag); empty when it does not read — the deployment then fails as a
/// refused key, and the file readable again is a new key.
fn account_digest(path: &std::path::Path) -> Vec<u8> {
    use sha2::Digest;
    std::fs::read(path)
        .map(|bytes| sha2::Sha256::digest(bytes).to_vec())
        .unwrap_or_default()
}

/// `file` without the models the admin changed (and without them as anyone's fallback):
/// served as the file says, such a model would be charged the file's price and sent along
/// the file's routes — the ones the admin moved it away from.
fn without_models(file: &Settings, changed: &[ModelRow]) -> Settings {
    let gone = |name: &String| changed.iter().any(|m| &m.name == name);
    let mut s = file.clone();
    s.models.retain(|m| !gone(&m.name));
    for m in &mut s.models {
        m.fallbacks.retain(|f| !gone(f));
    }
    s
}

/// The JSON a managed upstream's settings are stored as: its table without the key (and
/// without the id, which is the row's).
pub fn stored_settings(u: &UpstreamSettings) -> String {
    let mut v = serde_json::to_value(u).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("api_key");
        o.remove("id");
    }
    v.to_string()
}

impl Live {
    /// The catalog of `file` and the managed rows. The master key is checked first: a key
    /// that does not open the database's sealed values stops the start
    /// (`store::managed::check_master_key`, in `Db::connect`).
    ///
    /// Stored rows that do not make a valid catalog (altered in the database, or refused
    /// by a config file that changed since) do not stop the start: the gateway serves the
    /// config file's catalog without the models the admin changed, says why, and the first
    /// poll tries the rows again and alerts (`Refreshed::Failed`).
    pub async fn start(
        db: &Db,
        file: Arc<Settings>,
        clock: Arc<dyn Clock>,
    ) -> Result<Live, LiveError> {
        let mut epoch = managed::epoch(db).await?;
        let (settings, which) = match Self::read(db, &file, clock.now()).await {
            Ok(read) => read,
            Err(e @ LiveError::Store(_)) => return Err(e),
            Err(e) => {
                tracing::error!(error = %e, "the managed keys and models do not make a valid catalog: serving the config file's alone, without the models changed in the admin, until they do");
                // No epoch is "applied": the first poll rebuilds.
                epoch = i64::MIN;
                let changed = managed::models(db).await?;
                let prices = prices::all(db).await?;
                effective(
                    &without_models(&file, &changed),
                    (&[], &[], &prices),
                    &db.seal,
                    clock.now(),
                )?
            }
        };
        let catalog = Catalog::rebuild(&settings, &which, None);
        let pool = Pool::carried(None, &catalog, &settings);
        Ok(Live {
            current: ArcSwap::from_pointee(Snapshot {
                catalog: Arc::new(catalog),
                pool: Arc::new(pool),
            }),
            file: parking_lot::Mutex::new(file),
            epoch: AtomicI64::new(epoch),
            rebuilding: tokio::sync::Mutex::new(()),
            failing: parking_lot::Mutex::new(None),
            clock,
        })
    }

    /// The rows are read in one snapshot: an upstream and the model routed to it, added
    /// by two changes between the two reads, would otherwise read as a model routed to
    /// nothing (a false `catalog_stale`).
    async fn read(
        db: &Db,
        file: &Settings,
        now: DateTime<Utc>,
    ) -> Result<(Settings, Managed), LiveError> {
        let mut tx = db.begin_read().await?;
        let ups = managed::upstreams_in(&mut tx).await?;
        let models = managed::models_in(&mut tx).await?;
        let prices = prices::all_in(&mut tx).await?;
        tx.rollback().await?;
        effective(file, (&ups, &models, &prices), &db.seal, now)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.current.load().catalog.clone()
    }

    pub fn pool(&self) -> Arc<Pool> {
        self.current.load().pool.clone()
    }

    /// The config file's settings in use.
    pub fn file(&self) -> Arc<Settings> {
        self.file.lock().clone()
    }

    /// Rebuilds from the database and the file settings in use; on an error the catalog
    /// in use stays, and the epoch stays unapplied: every poll tries again.
    pub async fn rebuild(&self, db: &Db) -> Result<(), LiveError> {
        let _one = self.rebuilding.lock().await;
        // Read before the rows: a change committed after this read bumps it again, and the
        // next poll rebuilds once more.
        let epoch = managed::epoch(db).await?;
        let file = self.file();
        let (settings, which) = Self::read(db, &file, self.clock.now()).await?;
        self.swap(&settings, &which);
        self.epoch.store(epoch, Ordering::Release);
        *self.failing.lock() = None;
        Ok(())
    }

    /// Builds the catalog and pool of `settings`, carrying the pool's state over.
    fn swap(&self, settings: &Settings, which: &Managed) {
        let old = self.current.load_full();
        let catalog = Catalog::rebuild(settings, which, Some(&old.catalog));
        let pool = Pool::carried(Some(&old.pool), &catalog, settings);
        forget_replaced_keys(&old.catalog, &catalog, &pool);
        self.current.store(Arc::new(Snapshot {
            catalog: Arc::new(catalog),
            pool: Arc::new(pool),
        }));
    }

    /// Polls `catalog_epoch`; rebuilds when it moved, or when the last rebuild failed.
    pub async fn refresh(&self, db: &Db) -> Refreshed {
        let now = match managed::epoch(db).await {
            Ok(now) => now,
            Err(e) => return self.failed(e.into()),
        };
        if now == self.epoch.load(Ordering::Acquire) {
            // Built from the latest rows: a failure before (a read that failed once, a
            // database failing over) is over.
            *self.failing.lock() = None;
            return Refreshed::Unchanged;
        }
        match self.rebuild(db).await {
            Ok(()) => Refreshed::Rebuilt,
            Err(e) => self.failed(e),
        }
    }

    fn failed(&self, error: LiveError) -> Refreshed {
        let why = error.to_string();
        let news = self.failing.lock().replace(why.clone()).as_ref() != Some(&why);
        Refreshed::Failed { error, news }
    }

    /// Whether the catalog in use is behind the stored one (a rebuild failing).
    pub fn stale(&self) -> bool {
        self.failing.lock().is_some()
    }

    /// Takes a re-read config file (`SIGHUP`): its upstreams and models, and the spend
    /// rollup's tag bounds (`[finance]`, `store::tag_bound`), apply at once if the merged
    /// settings validate; otherwise the file in use stays. Other settings are read at start
    /// only: the ones that differ are named (`restart_needed`).
    ///
    /// The file is read (`load`) and applied under the rebuild lock: of two `SIGHUP`s close
    /// together, the later reads the file last and applies last — an older read never wins.
    pub async fn reload_file(
        &self,
        db: &Db,
        load: impl FnOnce() -> Result<Settings, ConfigError>,
    ) -> Result<Vec<String>, LiveError> {
        let _one = self.rebuilding.lock().await;
        let new = load().map_err(LiveError::Unreadable)?;
        let (settings, which) = Self::read(db, &new, self.clock.now()).await?;
        crate::store::tag_bound::set_bound(db, &new.finance).await?;
        self.swap(&settings, &which);
        let ignored = restart_needed(&self.file(), &new);
        *self.file.lock() = Arc::new(new);
        Ok(ignored)
    }
}

/// `Deployment::sealing` of a sealed key: the first 8 bytes of its nonce, fresh and random
/// at every sealing, and read alike by every replica.
fn sealing(sealed: &[u8]) -> u64 {
    sealed
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Positions are kept across rebuilds: where a deployment's key changed, or an admin acted
/// on a managed one (rotated, enabled, disabled it: sealed again), the pool forgets what it
/// learned from the key (`Pool::key_replaced`) — on every replica, so an admin's "enable"
/// lifts a key refused earlier (401) wherever it was refused.
fn forget_replaced_keys(old: &Catalog, new: &Catalog, pool: &Pool) {
    for (i, (o, n)) in old.deployments.iter().zip(&new.deployments).enumerate() {
        if o.api_key.expose() != n.api_key.expose()
            || o.sealing != n.sealing
            || o.shared_tag() != n.shared_tag()
        {
            pool.key_replaced(i);
        }
    }
}

/// The sections of `new` that differ from `old` outside `[[upstreams]]` and `[[models]]`:
/// read at start only, so they wait for a restart.
pub fn restart_needed(old: &Settings, new: &Settings) -> Vec<String> {
    let (Ok(serde_json::Value::Object(mut a)), Ok(serde_json::Value::Object(mut b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    // The tag bounds apply on reload (`reload_file`): they alone do not wait for a restart.
    for side in [&mut a, &mut b] {
        if let Some(serde_json::Value::Object(f)) = side.get_mut("finance") {
            f.remove("max_tag_values_per_day");
            f.remove("max_tag_keys_per_day");
            f.remove("max_tag_sets_per_day");
        }
    }
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| !matches!(k.as_str(), "upstreams" | "models"))
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::MasterKey;

    fn file() -> Settings {
        let mut s: Settings = toml::from_str(
            r#"
[[upstreams]]
id = "a"
provider = "openai"
base_url = "https://api.openai.com/v1"
api_key = "sk-config-key-0001"
[[models]]
name = "m"
routes = [{ upstream = "a", model = "m" }]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"#,
        )
        .unwrap();
        s.server.listen = "127.0.0.1:0".into();
        s
    }

    fn row(sealer: &Sealer, id: &str, key: &str) -> UpstreamRow {
        let settings = r#"{"provider":"openai","base_url":"https://api.openai.com/v1"}"#;
        UpstreamRow::sealed(id, settings.into(), true, key, sealer)
    }

    #[test]
    fn managed_rows_merge_into_the_file_and_a_managed_model_overrides_the_files() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let model = ModelRow {
            name: "m".into(),
            settings: r#"{"routes":[{"upstream":"k","model":"m"}],"input_usd_per_mtok":3.0,"output_usd_per_mtok":4.0}"#
                .into(),
        };
        let (s, which) = effective(
            &file(),
            (&[row(&sealer, "k", "sk-managed-0001")], &[model], &[]),
            &sealer,
            chrono::Utc::now(),
        )
        .unwrap();
        assert_eq!(s.upstreams.len(), 2);
        assert_eq!(s.upstreams[1].api_key.expose(), "sk-managed-0001");
        assert!(which.ids.contains("k") && !which.ids.contains("a"));
        assert_eq!(s.models.len(), 1);
        assert_eq!(s.models[0].price.input_usd_per_mtok, Some(3.0.into()));
        // An id of the file: refused, named.
        let err = effective(
            &file(),
            (&[row(&sealer, "a", "sk-managed-0001")], &[], &[]),
            &sealer,
            chrono::Utc::now(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("upstream `a` is in the config file"),
            "{err}"
        );
        // A sealed key moved to another row does not open there.
        let mut moved = row(&sealer, "k", "sk-managed-0001");
        moved.id = "j".into();
        let err =
            effective(&file(), (&[moved], &[], &[]), &sealer, chrono::Utc::now()).unwrap_err();
        assert!(
            matches!(err, LiveError::Sealed(ref id) if id == "j"),
            "{err}"
        );
    }

    /// Someone who can write the database but holds no master key: a row pointed at their
    /// own server (the key would go there) or a disabled key switched back on no longer
    /// opens — the catalog refuses it — while the row as Sluice wrote it does.
    #[test]
    fn a_sealed_key_opens_only_in_the_row_it_was_sealed_in() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let good = row(&sealer, "k", "sk-managed-0001");
        let now = chrono::Utc::now();
        assert!(effective(
            &file(),
            (std::slice::from_ref(&good), &[], &[]),
            &sealer,
            now
        )
        .is_ok());
        let mut elsewhere = good.clone();
        elsewhere.settings = elsewhere
            .settings
            .replace("https://api.openai.com/v1", "https://attacker.example/v1");
        let mut disabled = good.clone();
        disabled.enabled = false;
        disabled.seal_key("sk-managed-0001", &sealer);
        let mut switched_on = disabled.clone();
        switched_on.enabled = true;
        assert!(effective(&file(), (&[disabled], &[], &[]), &sealer, now).is_ok());
        for (what, tampered) in [("base_url", elsewhere), ("enabled", switched_on)] {
            let err = effective(&file(), (&[tampered], &[], &[]), &sealer, now).unwrap_err();
            assert!(
                matches!(err, LiveError::Sealed(ref id) if id == "k"),
                "{what}: {err}"
            );
        }
    }

    /// A credential other than `api_key` changed by a reload (a Bedrock secret, an Entra
    /// client secret) makes a new tag: the pool forgets the old credential's lessons, and
    /// its shared cooldowns are not the new one's.
    #[test]
    fn every_credential_field_is_part_of_the_keys_tag() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let tag = |s: &Settings| {
            effective(s, (&[], &[], &[]), &sealer, chrono::Utc::now())
                .unwrap()
                .1
                .shared_tags["a"]
        };
        let base = file();
        let secret = |v: &str| Some(Secret(secrecy::SecretString::from(v)));
        let mut bedrock = base.clone();
        let u = &mut bedrock.upstreams[0];
        u.provider = crate::config::Provider::Bedrock;
        u.base_url = String::new();
        u.api_key = Secret::default();
        u.region = Some("us-east-1".into());
        u.access_key_id = Some("AKIDEXAMPLE".into());
        u.secret_access_key = secret("old-secret");
        let mut rotated = bedrock.clone();
        rotated.upstreams[0].secret_access_key = secret("new-secret");
        let mut token = bedrock.clone();
        token.upstreams[0].session_token = secret("old-secret");
        let tags = [tag(&base), tag(&bedrock), tag(&rotated), tag(&token)];
        for (i, a) in tags.iter().enumerate() {
            for b in &tags[i + 1..] {
                assert_ne!(a, b, "{tags:?}");
            }
        }
        assert_eq!(tag(&rotated), tag(&rotated.clone()), "a tag is stable");
    }

    /// A Vertex service-account file replaced in place (same path, new contents), then a
    /// reload: a new tag, so the pool forgets what it learned of the old account (a key
    /// disabled as refused serves again).
    #[test]
    fn a_service_account_file_replaced_in_place_is_a_new_key() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.json");
        let mut s = file();
        let u = &mut s.upstreams[0];
        u.provider = crate::config::Provider::Gemini;
        u.api_key = Secret::default();
        u.vertex = Some(crate::config::VertexSettings {
            project: "p".into(),
            location: "us-central1".into(),
            credentials_file: path.clone(),
        });
        let tag = || {
            effective(&s, (&[], &[], &[]), &sealer, chrono::Utc::now())
                .unwrap()
                .1
                .shared_tags["a"]
        };
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/gemini/test-service-account.json"
        );
        let mut account: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        std::fs::write(&path, account.to_string()).unwrap();
        let old = tag();
        assert_eq!(tag(), old, "a tag is stable");
        account["private_key_id"] = "rotated".into();
        std::fs::write(&path, account.to_string()).unwrap();
        assert_ne!(tag(), old);
    }

    /// A rebuild keeps a deployment's credential hook (its token source and cached token)
    /// while everything the hook is made of is unchanged — another model's change does
    /// not touch it — and makes a new one when any of it changes: the client secret, the
    /// authority, the scope.
    #[test]
    fn a_rebuild_keeps_the_credential_hook_of_an_unchanged_credential() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let mut base: Settings = toml::from_str(
            r#"
[[upstreams]]
id = "az"
provider = "azure_openai"
base_url = "https://res.openai.azure.com"
api_version = "2024-10-21"
entra = { tenant_id = "t", client_id = "c", client_secret = "s-1" }
[[models]]
name = "m"
routes = [{ upstream = "az", model = "gpt-4o-mini" }]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"#,
        )
        .unwrap();
        base.server.listen = "127.0.0.1:0".into();
        let build = |s: &Settings, previous: Option<&Catalog>| {
            let (s, which) = effective(s, (&[], &[], &[]), &sealer, chrono::Utc::now()).unwrap();
            Catalog::rebuild(&s, &which, previous)
        };
        let hook = |c: &Catalog| match c.deployments[0].credential() {
            crate::upstream::credential::Credential::Hook(h) => h.clone(),
            other => panic!("not a hook: {other:?}"),
        };
        let first = build(&base, None);
        let mut priced = base.clone();
        priced.models[0].price.input_usd_per_mtok = Some(3.0.into());
        let kept = build(&priced, Some(&first));
        assert!(Arc::ptr_eq(&hook(&first), &hook(&kept)));
        let entra = |f: fn(&mut crate::config::EntraSettings)| {
            let mut s = base.clone();
            f(s.upstreams[0].entra.as_mut().unwrap());
            s
        };
        for changed in [
            entra(|e| e.client_secret = Secret(secrecy::SecretString::from("s-2"))),
            entra(|e| e.authority = "https://login.example".into()),
            entra(|e| e.scope = "api://other/.default".into()),
        ] {
            let next = build(&changed, Some(&first));
            assert!(!Arc::ptr_eq(&hook(&first), &hook(&next)));
        }
        // A Bedrock signer signs for its region: moved, it is a new hook (s30 diff attack F2).
        let mut bedrock: Settings = toml::from_str(
            r#"
[[upstreams]]
id = "br"
provider = "bedrock"
region = "us-east-1"
access_key_id = "AKIDEXAMPLE"
secret_access_key = "secret"
[[models]]
name = "m"
routes = [{ upstream = "br", model = "anthropic.claude-3-haiku-20240307-v1:0" }]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"#,
        )
        .unwrap();
        bedrock.server.listen = "127.0.0.1:0".into();
        let first = build(&bedrock, None);
        assert!(Arc::ptr_eq(
            &hook(&first),
            &hook(&build(&bedrock, Some(&first)))
        ));
        bedrock.upstreams[0].region = Some("eu-west-1".into());
        let moved = build(&bedrock, Some(&first));
        assert!(!Arc::ptr_eq(&hook(&first), &hook(&moved)));
    }

    #[test]
    fn a_reload_names_the_sections_that_wait_for_a_restart() {
        let old = file();
        let mut new = file();
        new.models[0].price.input_usd_per_mtok = Some(9.0.into());
        new.finance.max_tag_values_per_day = 7;
        new.finance.max_tag_keys_per_day = 9;
        new.finance.max_tag_sets_per_day = 11;
        assert!(restart_needed(&old, &new).is_empty());
        new.finance.forecast_alert_days = 1;
        assert_eq!(restart_needed(&old, &new), ["finance"]);
        new.finance.forecast_alert_days = old.finance.forecast_alert_days;
        new.server.listen = "127.0.0.1:1".into();
        assert_eq!(restart_needed(&old, &new), ["server"]);
    }
}

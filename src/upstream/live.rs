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
use crate::config::{ConfigError, ModelSettings, Secret, Settings, UpstreamSettings};
use crate::secrets::seal::Sealer;
use crate::store::managed::{self, key_purpose, ModelRow, UpstreamRow};
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
}

/// The settings a catalog is built from: the file's, with the managed upstreams (keys
/// opened) and models merged in, validated; and which upstreams are managed.
pub fn effective(
    file: &Settings,
    upstreams: &[UpstreamRow],
    models: &[ModelRow],
    sealer: &Sealer,
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
        let key = sealer
            .open_text(&key_purpose(&row.id), &row.key_sealed)
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
        if !row.enabled {
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
    Ok((s, which))
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

/// The last 4 characters of a key, as every page and answer shows it.
pub fn last4(key: &str) -> String {
    Secret(secrecy::SecretString::from(key)).masked()
}

impl Live {
    /// The catalog of `file` and the managed rows. The master key is checked first: a key
    /// that does not open the database's sealed values stops the start
    /// (`store::managed::check_master_key`, in `Db::connect`).
    pub async fn start(db: &Db, file: Arc<Settings>) -> Result<Live, LiveError> {
        let epoch = managed::epoch(db).await?;
        let (settings, which) = Self::read(db, &file).await?;
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
        })
    }

    async fn read(db: &Db, file: &Settings) -> Result<(Settings, Managed), LiveError> {
        let ups = managed::upstreams(db).await?;
        let models = managed::models(db).await?;
        effective(file, &ups, &models, &db.seal)
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
    /// in use stays.
    pub async fn rebuild(&self, db: &Db) -> Result<(), LiveError> {
        let _one = self.rebuilding.lock().await;
        // Read before the rows: a change committed after this read bumps it again, and the
        // next poll rebuilds once more.
        let epoch = managed::epoch(db).await?;
        let file = self.file();
        let (settings, which) = match Self::read(db, &file).await {
            Ok(read) => read,
            Err(e) => {
                // Not retried at every poll (and logged each time) unless the database
                // could not be read: the next change bumps the epoch again.
                if !matches!(e, LiveError::Store(_)) {
                    self.epoch.store(epoch, Ordering::Release);
                }
                return Err(e);
            }
        };
        let old = self.current.load_full();
        let catalog = Catalog::rebuild(&settings, &which, Some(&old.catalog));
        let pool = Pool::carried(Some(&old.pool), &catalog, &settings);
        forget_replaced_keys(&old.catalog, &catalog, &pool);
        self.current.store(Arc::new(Snapshot {
            catalog: Arc::new(catalog),
            pool: Arc::new(pool),
        }));
        self.epoch.store(epoch, Ordering::Release);
        Ok(())
    }

    /// Polls `catalog_epoch`; rebuilds when it moved. Returns whether it did.
    pub async fn refresh(&self, db: &Db) -> Result<bool, LiveError> {
        let now = managed::epoch(db).await?;
        if now == self.epoch.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.rebuild(db).await?;
        Ok(true)
    }

    /// Takes a re-read config file (`SIGHUP`): its upstreams and models apply at once if
    /// the merged catalog validates; otherwise the file in use stays. Other settings are
    /// read at start only: the ones that differ are named (`restart_needed`).
    ///
    /// The file is read (`load`) under the rebuild lock: of two `SIGHUP`s close together,
    /// the later reads the file last and applies last — an older read never wins.
    pub async fn reload_file(
        &self,
        db: &Db,
        load: impl FnOnce() -> Result<Settings, ConfigError>,
    ) -> Result<Vec<String>, LiveError> {
        let _one = self.rebuilding.lock().await;
        let new = load().map_err(LiveError::Unreadable)?;
        let (settings, which) = Self::read(db, &new).await?;
        let old = self.current.load_full();
        let catalog = Catalog::rebuild(&settings, &which, Some(&old.catalog));
        let pool = Pool::carried(Some(&old.pool), &catalog, &settings);
        forget_replaced_keys(&old.catalog, &catalog, &pool);
        let ignored = restart_needed(&self.file(), &new);
        *self.file.lock() = Arc::new(new);
        self.current.store(Arc::new(Snapshot {
            catalog: Arc::new(catalog),
            pool: Arc::new(pool),
        }));
        Ok(ignored)
    }
}

/// Positions are kept across rebuilds: where a deployment's key changed, the pool forgets
/// what it learned from the old one (`Pool::key_replaced`).
fn forget_replaced_keys(old: &Catalog, new: &Catalog, pool: &Pool) {
    for (i, (o, n)) in old.deployments.iter().zip(&new.deployments).enumerate() {
        if o.api_key.expose() != n.api_key.expose() {
            pool.key_replaced(i);
        }
    }
}

/// The sections of `new` that differ from `old` outside `[[upstreams]]` and `[[models]]`:
/// read at start only, so they wait for a restart.
pub fn restart_needed(old: &Settings, new: &Settings) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
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
"#,
        )
        .unwrap();
        s.server.listen = "127.0.0.1:0".into();
        s
    }

    fn row(sealer: &Sealer, id: &str, key: &str) -> UpstreamRow {
        UpstreamRow {
            id: id.into(),
            settings: r#"{"provider":"openai","base_url":"https://api.openai.com/v1"}"#.into(),
            key_sealed: sealer.seal(&key_purpose(id), key.as_bytes()),
            key_last4: last4(key),
            enabled: true,
        }
    }

    #[test]
    fn managed_rows_merge_into_the_file_and_a_managed_model_overrides_the_files() {
        let sealer = Sealer::new(&MasterKey::from_hex(&"ab".repeat(32)).unwrap());
        let model = ModelRow {
            name: "m".into(),
            settings: r#"{"routes":[{"upstream":"k","model":"m"}],"input_usd_per_mtok":3.0}"#
                .into(),
        };
        let (s, which) = effective(
            &file(),
            &[row(&sealer, "k", "sk-managed-0001")],
            &[model],
            &sealer,
        )
        .unwrap();
        assert_eq!(s.upstreams.len(), 2);
        assert_eq!(s.upstreams[1].api_key.expose(), "sk-managed-0001");
        assert!(which.ids.contains("k") && !which.ids.contains("a"));
        assert_eq!(s.models.len(), 1);
        assert_eq!(s.models[0].input_usd_per_mtok, 3.0);
        // An id of the file: refused, named.
        let err = effective(
            &file(),
            &[row(&sealer, "a", "sk-managed-0001")],
            &[],
            &sealer,
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
        let err = effective(&file(), &[moved], &[], &sealer).unwrap_err();
        assert!(
            matches!(err, LiveError::Sealed(ref id) if id == "j"),
            "{err}"
        );
    }

    #[test]
    fn a_reload_names_the_sections_that_wait_for_a_restart() {
        let old = file();
        let mut new = file();
        new.models[0].input_usd_per_mtok = 9.0;
        assert!(restart_needed(&old, &new).is_empty());
        new.server.listen = "127.0.0.1:1".into();
        assert_eq!(restart_needed(&old, &new), ["server"]);
    }
}

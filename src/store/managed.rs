//! Upstream keys, deployments and models managed in the admin UI and API (issue 19), and
//! the sealed check value that tells a wrong master key at start. Keys are stored sealed
//! (`secrets::seal`, the row itself as associated data: `UpstreamRow::purpose`) with their last 4
//! characters; every change bumps `catalog_epoch`, which every replica polls (and, on
//! PostgreSQL, hears at once) to rebuild its catalog.

use secrecy::SecretString;

use super::Result;
use crate::secrets::seal::{SealError, Sealer};

const UPSTREAMS: &str = "SELECT id, settings, key_sealed, key_last4, enabled FROM managed_upstreams ORDER BY created_at, id";
const MODELS: &str = "SELECT name, settings FROM managed_models ORDER BY name";

/// One managed upstream as stored: its `[[upstreams]]` table as JSON without the key, the
/// key sealed, its last 4 characters, and whether it takes requests.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UpstreamRow {
    pub id: String,
    pub settings: String,
    pub key_sealed: Vec<u8>,
    pub key_last4: String,
    pub enabled: bool,
}

/// One managed model: its `[[models]]` table as JSON.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ModelRow {
    pub name: String,
    pub settings: String,
}

impl UpstreamRow {
    /// A row with `key` sealed under its contents (`purpose`).
    pub fn sealed(id: &str, settings: String, enabled: bool, key: &str, seal: &Sealer) -> Self {
        let mut row = UpstreamRow {
            id: id.to_string(),
            settings,
            key_sealed: Vec::new(),
            key_last4: String::new(),
            enabled,
        };
        row.seal_key(key, seal);
        row
    }

    /// The associated data the key is sealed under: everything the row says about where
    /// and whether the key goes — its id, enabled switch and settings (`base_url` among
    /// them). Someone who can write the database but has no master key can neither move a
    /// sealed key to another row nor point its row elsewhere (a `base_url` of theirs would
    /// receive it) nor re-enable a disabled one: the key no longer opens, and the catalog
    /// is not rebuilt (`upstream::live`). Restoring a whole earlier row is not detected
    /// here; the audit log records every change made through Sluice.
    pub fn purpose(&self) -> String {
        format!(
            "upstream:{}\n{}\n{}",
            self.id, self.enabled as u8, self.settings
        )
    }

    pub fn open_key(&self, seal: &Sealer) -> std::result::Result<SecretString, SealError> {
        seal.open_text(&self.purpose(), &self.key_sealed)
    }

    /// Seals `key` into the row as it stands (after any change of `enabled`).
    pub fn seal_key(&mut self, key: &str, seal: &Sealer) {
        self.key_sealed = seal.seal(&self.purpose(), key.as_bytes());
        self.key_last4 = last4(key);
    }
}

/// The last 4 characters of a key, as every page and answer shows it.
pub fn last4(key: &str) -> String {
    crate::config::Secret(SecretString::from(key)).masked()
}

/// The sealed check value, if one was stored.
pub async fn seal_check(db: &super::Db) -> Result<Option<Vec<u8>>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::managed::seal_check(&pg.pool).await,
    };
    Ok(
        sqlx::query_scalar("SELECT sealed FROM seal_check WHERE id = 1")
            .fetch_optional(&sqlite.read)
            .await?,
    )
}

/// Stores the check value unless one is there already (two starting at once keep the
/// first); the caller reads back what was kept.
pub async fn put_seal_check(tx: &mut super::Tx, sealed: &[u8]) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::put_seal_check(conn, sealed).await;
    }
    sqlx::query("INSERT OR IGNORE INTO seal_check (id, sealed) VALUES (1, ?)")
        .bind(sealed)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

/// Replaces the check value (`sluice secrets rotate`).
pub async fn replace_seal_check(tx: &mut super::Tx, sealed: &[u8]) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::replace_seal_check(conn, sealed).await;
    }
    sqlx::query("INSERT OR REPLACE INTO seal_check (id, sealed) VALUES (1, ?)")
        .bind(sealed)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn upstreams(db: &super::Db) -> Result<Vec<UpstreamRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::managed::upstreams(&pg.pool).await,
    };
    Ok(sqlx::query_as(UPSTREAMS).fetch_all(&sqlite.read).await?)
}

/// Every managed upstream, read inside `tx` (to re-seal them all, `sluice secrets rotate`).
pub async fn upstreams_in(tx: &mut super::Tx) -> Result<Vec<UpstreamRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::upstreams_in(conn).await;
    }
    Ok(sqlx::query_as(UPSTREAMS).fetch_all(tx.sqlite()?).await?)
}

/// Every managed model, read inside `tx`.
pub async fn models_in(tx: &mut super::Tx) -> Result<Vec<ModelRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::models_in(conn).await;
    }
    Ok(sqlx::query_as(MODELS).fetch_all(tx.sqlite()?).await?)
}

pub async fn models(db: &super::Db) -> Result<Vec<ModelRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::managed::models(&pg.pool).await,
    };
    Ok(sqlx::query_as(MODELS).fetch_all(&sqlite.read).await?)
}

/// Adds an upstream; a `Conflict` if its id is taken.
pub async fn insert_upstream(tx: &mut super::Tx, row: &UpstreamRow, now: &str) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::insert_upstream(conn, row, now).await;
    }
    let done = sqlx::query(
        "INSERT OR IGNORE INTO managed_upstreams (id, settings, key_sealed, key_last4, enabled, created_at, updated_at)
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&row.id)
    .bind(&row.settings)
    .bind(&row.key_sealed)
    .bind(&row.key_last4)
    .bind(row.enabled)
    .bind(now)
    .bind(now)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected();
    if done == 0 {
        return Err(super::StoreError::Conflict(format!(
            "an upstream `{}` exists already",
            row.id
        )));
    }
    Ok(())
}

/// Writes an upstream's key (sealed), its last 4 and its switch; `false` if there is no
/// such row.
pub async fn update_upstream(tx: &mut super::Tx, row: &UpstreamRow, now: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::update_upstream(conn, row, now).await;
    }
    Ok(sqlx::query(
        "UPDATE managed_upstreams SET key_sealed = ?, key_last4 = ?, enabled = ?, updated_at = ? WHERE id = ?",
    )
    .bind(&row.key_sealed)
    .bind(&row.key_last4)
    .bind(row.enabled)
    .bind(now)
    .bind(&row.id)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected()
        == 1)
}

pub async fn delete_upstream(tx: &mut super::Tx, id: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::delete_upstream(conn, id).await;
    }
    Ok(sqlx::query("DELETE FROM managed_upstreams WHERE id = ?")
        .bind(id)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
        == 1)
}

/// Adds or replaces a model.
pub async fn put_model(tx: &mut super::Tx, row: &ModelRow, now: &str) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::put_model(conn, row, now).await;
    }
    sqlx::query(
        "INSERT OR REPLACE INTO managed_models (name, settings, updated_at) VALUES (?, ?, ?)",
    )
    .bind(&row.name)
    .bind(&row.settings)
    .bind(now)
    .execute(tx.sqlite()?)
    .await?;
    Ok(())
}

pub async fn delete_model(tx: &mut super::Tx, name: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::managed::delete_model(conn, name).await;
    }
    Ok(sqlx::query("DELETE FROM managed_models WHERE name = ?")
        .bind(name)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
        == 1)
}

/// Every change above bumps this counter in the same transaction (and, on PostgreSQL,
/// notifies the other hosts when it commits).
pub async fn bump_epoch(tx: &mut super::Tx) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::notify::bump(conn, super::pg::notify::Epoch::Catalog).await;
    }
    sqlx::query("UPDATE meta SET value = value + 1 WHERE key = 'catalog_epoch'")
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn epoch(db: &super::Db) -> Result<i64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::managed::epoch(&pg.pool).await,
    };
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'catalog_epoch'")
            .fetch_one(&sqlite.read)
            .await?,
    )
}

/// Refuses a master key that does not open what the database holds sealed. The first
/// start stores a check value; a later start whose key does not open it stops with
/// `SecretError::SealedUnderAnotherKey`. While nothing else is sealed there is nothing a
/// wrong key could misread, so the check value is then sealed again under this key (a
/// SQLite database whose key file was lost before any key was added keeps starting).
pub async fn check_master_key(db: &super::Db) -> Result<()> {
    // Read only when the key opens the check (a read-only database, every CLI command).
    if let Some(check) = seal_check(db).await? {
        if db.seal.opens_check(&check).is_ok() {
            return Ok(());
        }
    }
    check_master_key_locked(db).await
}

/// `check_master_key` in one write transaction, so it runs after any `sluice secrets
/// rotate` under way (admin writes run one at a time): the gateway calls it again once it
/// is registered as running (`startup`), which the rotation refuses to run beside — a
/// gateway that passed the first check under the old key just before a rotation committed
/// stops here, rather than sealing new keys under a key the database no longer uses.
pub async fn check_master_key_locked(db: &super::Db) -> Result<()> {
    let mut tx = db.begin().await?;
    let check = match tx.pg() {
        Some((conn, _)) => super::pg::managed::seal_check_in(conn).await?,
        None => {
            sqlx::query_scalar("SELECT sealed FROM seal_check WHERE id = 1")
                .fetch_optional(tx.sqlite()?)
                .await?
        }
    };
    match check {
        None => put_seal_check(&mut tx, &db.seal.check_value()).await?,
        Some(check) => {
            if let Err(e) = db.seal.opens_check(&check) {
                if !upstreams_in(&mut tx).await?.is_empty() {
                    return Err(
                        crate::secrets::SecretError::SealedUnderAnotherKey(e.to_string()).into(),
                    );
                }
                replace_seal_check(&mut tx, &db.seal.check_value()).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

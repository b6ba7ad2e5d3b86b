//! `sluice migrate-store --from sqlite://… --to postgres://…`: moves a single-host install
//! onto PostgreSQL (issue 17 item 6). Refuses while a gateway runs on the SQLite file (a
//! fresh heartbeat), when the source does not verify (ledger invariant, audit chain), or
//! when the target is not empty; copies every table in one PostgreSQL transaction, compared
//! with the source before it commits (`store::migrate`); then checks on PostgreSQL what a
//! gateway would: the ledger invariant and the audit chain, with the same number of rows
//! and the same newest hash as the source. The SQLite file is left as it was (migrated to
//! this version's schema, as any start of the gateway would).

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use crate::secrets::MasterKey;
use crate::store::{self, audit, ledger, Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    #[error("--from must name the database file to copy (sqlite://path), not `{0}`")]
    From(String),
    #[error("--to must name a PostgreSQL database (postgres://…)")]
    To,
    #[error("no database file at {0}")]
    Missing(PathBuf),
    #[error("a gateway is running on {0} (heartbeat in the last 15 s): stop every gateway on it, then migrate (requests served meanwhile would be lost to the copy)")]
    InUse(PathBuf),
    #[error("the source database does not verify ({0}); nothing was copied")]
    SourceBroken(String),
    #[error("copied, but PostgreSQL does not verify: {0}; the source database is untouched — drop the PostgreSQL database and report this")]
    CopyBroken(String),
}

/// What was copied and checked.
#[derive(Debug)]
pub struct Migrated {
    pub tables: Vec<(String, u64)>,
    /// Per table, text values that held a NUL byte and were copied with U+FFFD in its place.
    pub replaced: Vec<(String, u64)>,
    pub tokens_checked: usize,
    pub audit_rows: i64,
    /// The master key file the gateways on PostgreSQL need (`[database] key_file`), when
    /// the key came from a file rather than `SLUICE_SECRET_KEY`.
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (table, n) in &self.tables {
            writeln!(f, "  {table:<15} {n} rows")?;
        }
        for (table, n) in &self.replaced {
            writeln!(f, "  {table}: {n} text values held a NUL byte, which PostgreSQL's text cannot store; copied with U+FFFD in its place")?;
        }
        writeln!(
            f,
            "verified on both sides: every row of every table (request log and cache by count and sums), every balance and ledger row, {} audit rows with the same newest hash; ledger invariant holds on PostgreSQL",
            self.audit_rows
        )?;
        match &self.key_file {
            Some(k) => write!(f, "every gateway on PostgreSQL needs this install's master key: copy {} to each host and set `[database] key_file` to it (or set {} to its contents)", k.display(), crate::secrets::ENV),
            None => write!(f, "every gateway on PostgreSQL needs the same {} as this install", crate::secrets::ENV),
        }
    }
}

/// Copies the SQLite database at `from` into the empty PostgreSQL database at `to`.
pub async fn migrate_store(
    from: &str,
    to: &str,
    now: DateTime<Utc>,
) -> Result<Migrated, MigrateError> {
    let path = PathBuf::from(
        from.strip_prefix("sqlite://")
            .ok_or_else(|| MigrateError::From(from.to_string()))?
            .split('?')
            .next()
            .unwrap_or_default(),
    );
    if !(to.starts_with("postgres://") || to.starts_with("postgresql://")) {
        return Err(MigrateError::To);
    }
    if !path.is_file() {
        return Err(MigrateError::Missing(path));
    }
    if store::backup::gateways_alive_on(&path, now - store::processes::STALE_AFTER).await? > 0 {
        return Err(MigrateError::InUse(path));
    }
    let key_from_env = std::env::var(crate::secrets::ENV).is_ok_and(|v| !v.trim().is_empty());
    let key = MasterKey::for_database(&path)?;
    let source = Db::open(&path, false).await?;
    // No write lands in the file from here until the copy is committed and checked
    // (`store::migrate::hold_source`).
    let held = match store::migrate::hold_source(&path).await {
        Ok(held) => held,
        Err(e) => {
            source.close().await;
            return Err(e.into());
        }
    };
    let result = copy(&source, to, &key).await;
    held.release().await;
    source.close().await;
    let mut done = result?;
    done.key_file = (!key_from_env).then(|| crate::secrets::key_file_for(&path));
    Ok(done)
}

async fn copy(source: &Db, to: &str, key: &MasterKey) -> Result<Migrated, MigrateError> {
    let problems = ledger::invariant_violations(source).await?;
    if let Some(p) = problems.first() {
        return Err(MigrateError::SourceBroken(format!("ledger: {p}")));
    }
    let chain = audit::verify(source, &source.audit).await?;
    if let Some(b) = &chain.broken {
        return Err(MigrateError::SourceBroken(format!(
            "audit log row {}: {}",
            b.id, b.why
        )));
    }
    let target = Db::open_postgres(to, key).await?;
    let out = async {
        let copied = store::migrate::sqlite_to_postgres(source, &target).await?;
        let problems = ledger::invariant_violations(&target).await?;
        if let Some(p) = problems.first() {
            return Err(MigrateError::CopyBroken(format!("ledger: {p}")));
        }
        let copy = audit::verify(&target, &target.audit).await?;
        if copy.broken.is_some() || (copy.rows, &copy.last_hash) != (chain.rows, &chain.last_hash) {
            return Err(MigrateError::CopyBroken(format!(
                "audit chain: {} rows ending {} against {} rows ending {} ({:?})",
                copy.rows, copy.last_hash, chain.rows, chain.last_hash, copy.broken
            )));
        }
        Ok(Migrated {
            tokens_checked: store::tokens::count(&target).await? as usize,
            audit_rows: copy.rows,
            tables: copied.tables,
            replaced: copied.replaced,
            key_file: None,
        })
    }
    .await;
    target.close().await;
    out
}

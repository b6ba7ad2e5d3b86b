//! `sluice secrets rotate` in the store: every secret the database holds under the master
//! key moved, in one transaction, to a new key — the sealed upstream keys and the check
//! value sealed again (fresh nonces) under the new key's subkey, and the audit chain signed
//! again under the new key's audit subkey after it was verified, whole, under the old one.
//! A crash or an error before the commit leaves the old state whole; nothing is written
//! outside the database here (the head is `ops::rotate`'s, after the commit).
//!
//! The audit log refuses UPDATE (a trigger on each engine): rewriting its MACs lifts that
//! trigger inside this transaction and puts it back before the commit, so no other
//! transaction ever sees the table without it. This is not a hole in the append-only
//! guarantee: the trigger guards against someone with the database alone, and rotating
//! takes the old master key, with which its holder could already sign any row and any
//! chain; the chain is checked whole under that key before a row is touched, so what is
//! carried over is only a chain that verified.

use chrono::{DateTime, Utc};

use super::audit::{self, AuditEntry, AuditKeys, Broken, Relinked, Resigned};
use super::managed;
use super::{Db, Result, StoreError};
use crate::secrets::seal::Sealer;
use crate::secrets::MasterKey;

/// The action of the audit row a rotation appends.
pub const ACTION: &str = "secrets.rotate";

/// What a rotation carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub upstream_keys: usize,
    pub audit_rows: i64,
}

/// Why a rotation was refused (nothing was changed).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("a gateway is running on this database ({0}): stop every gateway on it, then rotate (a gateway holding the old key would sign rows and open keys the new key no longer matches)")]
    Running(String),
    #[error("the audit log does not verify under the current master key, so it cannot be carried over to a new one: row {}: {}. Look into it with `sluice audit verify` first", .0.id, .0.why)]
    Chain(Broken),
    #[error("the stored key of upstream `{0}` does not open under the current master key ({1}); start with the key the database was sealed under")]
    Sealed(String, String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Re-seals every upstream key and the check value under `new`, and signs the whole audit
/// chain again under it, with an audit row `secrets.rotate` by `actor` at its end — all in
/// one transaction, after checking that no gateway runs on the database.
pub async fn rotate(
    db: &Db,
    new: &MasterKey,
    actor: &str,
    now: DateTime<Utc>,
) -> std::result::Result<Rotated, Refused> {
    let sealer = Sealer::new(new);
    let keys = AuditKeys::derive(new);
    let mut tx = db.begin().await?;
    let running =
        super::processes::running_in(&mut tx, &super::processes::this_host(), now).await?;
    if !running.is_empty() {
        return Err(Refused::Running(running.join(", ")));
    }
    let upstreams = managed::upstreams_in(&mut tx).await?;
    let mut resealed = Vec::with_capacity(upstreams.len());
    for u in &upstreams {
        let purpose = u.purpose();
        let clear = db
            .seal
            .open(&purpose, &u.key_sealed)
            .map_err(|e| Refused::Sealed(u.id.clone(), e.to_string()))?;
        resealed.push((u.id.clone(), sealer.seal(&purpose, &clear)));
    }
    let after = serde_json::json!({"upstream_keys": upstreams.len()}).to_string();
    let entry = AuditEntry {
        actor,
        address: "",
        action: ACTION,
        target: "master key",
        before: None,
        after: Some(&after),
    };
    // Signed under the old key like every row before it, then carried over with them.
    audit::append(&mut tx, &entry, now).await?;
    let relinked = match tx.pg() {
        Some((conn, old)) => {
            let old = old.clone();
            super::pg::rotate::relink(conn, &old, &keys).await?
        }
        None => relink(&mut tx, &db.audit, &keys).await?,
    };
    let resigned = relinked.map_err(Refused::Chain)?;
    match tx.pg() {
        Some((conn, _)) => super::pg::rotate::rewrite(conn, &resealed, &resigned.relinked).await?,
        None => rewrite(&mut tx, &resealed, &resigned.relinked).await?,
    }
    managed::replace_seal_check(&mut tx, &sealer.check_value()).await?;
    tx.commit().await?;
    Ok(Rotated {
        upstream_keys: upstreams.len(),
        audit_rows: resigned.rows,
    })
}

const ROWS: &str = "SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain FROM audit_log ORDER BY id";

/// The chain read inside `tx`, verified under `old` and signed again under `new`: the rows
/// whose links change, and the row count; or the first row that does not verify.
async fn relink(
    tx: &mut super::Tx,
    old: &AuditKeys,
    new: &AuditKeys,
) -> Result<std::result::Result<Resigned, Broken>> {
    let rows = sqlx::query(ROWS).fetch_all(tx.sqlite()?).await?;
    Ok(audit::resign(&rows, old, new))
}

/// Writes the re-sealed keys and the new links inside `tx`, with the audit log's UPDATE
/// trigger lifted for the rewrite and put back as it was (its own stored text).
async fn rewrite(
    tx: &mut super::Tx,
    resealed: &[(String, Vec<u8>)],
    relinked: &[Relinked],
) -> Result<()> {
    let conn = tx.sqlite()?;
    for (id, sealed) in resealed {
        sqlx::query("UPDATE managed_upstreams SET key_sealed = ? WHERE id = ?")
            .bind(sealed)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    let trigger: String = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'audit_no_update'",
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| StoreError::NotFound("the audit log's trigger audit_no_update".into()))?;
    sqlx::query("DROP TRIGGER audit_no_update")
        .execute(&mut *conn)
        .await?;
    for (id, prev, hash) in relinked {
        sqlx::query("UPDATE audit_log SET prev_hash = ?, hash = ? WHERE id = ?")
            .bind(prev)
            .bind(hash)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query(&trigger).execute(&mut *conn).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::managed::UpstreamRow;
    use secrecy::ExposeSecret;

    fn key(hex: &str) -> MasterKey {
        MasterKey::from_hex(&hex.repeat(32)).unwrap()
    }

    /// A database with one sealed key and three audit rows, under the key `ab`.
    async fn seeded(path: &std::path::Path) -> Db {
        let db = Db::open_with_key(path, false, &key("ab")).await.unwrap();
        let mut tx = db.begin().await.unwrap();
        let row = UpstreamRow::sealed("u", "{}".into(), true, "sk-secret", &db.seal);
        managed::insert_upstream(&mut tx, &row, "t").await.unwrap();
        managed::put_seal_check(&mut tx, &db.seal.check_value())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        for action in ["one", "two", "three"] {
            let e = AuditEntry {
                actor: "t",
                address: "",
                action,
                target: "x",
                before: None,
                after: None,
            };
            audit::record(&db, &e, chrono::Utc::now()).await.unwrap();
        }
        db
    }

    /// What a refused rotation must leave as it was: the rows, the sealed key, the check.
    async fn state(db: &Db) -> (Vec<(String, String)>, Vec<u8>, Vec<u8>) {
        let rows = sqlx::query_as("SELECT action, hash FROM audit_log ORDER BY id")
            .fetch_all(&db.sqlite().read)
            .await
            .unwrap();
        let sealed = managed::upstreams(db).await.unwrap()[0].key_sealed.clone();
        (
            rows,
            sealed,
            managed::seal_check(db).await.unwrap().unwrap(),
        )
    }

    /// The chain is checked again inside the transaction, after the `secrets.rotate` row
    /// was appended: a break found there rolls that row back with everything else. So does
    /// a sealed key that does not open (here: another row's sealed value).
    #[tokio::test]
    async fn a_refusal_inside_the_transaction_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = seeded(&dir.path().join("r.db")).await;
        let was = state(&db).await;
        sqlx::raw_sql(
            "DROP TRIGGER audit_no_update; UPDATE audit_log SET actor = 'forged' WHERE id = 2",
        )
        .execute(&db.sqlite().write)
        .await
        .unwrap();
        let tampered = state(&db).await;
        let err = rotate(&db, &key("cd"), "t", chrono::Utc::now()).await;
        assert!(
            matches!(err, Err(Refused::Chain(Broken { id: 2, .. }))),
            "{err:?}"
        );
        assert_eq!(state(&db).await, tampered);
        assert_eq!(tampered.1, was.1);

        let dir = tempfile::tempdir().unwrap();
        let db = seeded(&dir.path().join("s.db")).await;
        let moved =
            UpstreamRow::sealed("other", "{}".into(), true, "sk-other", &db.seal).key_sealed;
        sqlx::query("UPDATE managed_upstreams SET key_sealed = ?")
            .bind(&moved)
            .execute(&db.sqlite().write)
            .await
            .unwrap();
        let was = state(&db).await;
        let err = rotate(&db, &key("cd"), "t", chrono::Utc::now()).await;
        assert!(
            matches!(err, Err(Refused::Sealed(ref id, _)) if id == "u"),
            "{err:?}"
        );
        assert_eq!(state(&db).await, was);
    }

    /// A gateway that passed the key check under the old key just before a rotation
    /// committed: its check once registered as running (`startup`) stops it.
    #[tokio::test]
    async fn a_gateway_opened_under_the_old_key_is_stopped_by_its_check_after_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.db");
        let gateway = seeded(&path).await;
        managed::check_master_key_locked(&gateway).await.unwrap();
        let cli = Db::open_with_key(&path, false, &key("ab")).await.unwrap();
        rotate(&cli, &key("cd"), "t", chrono::Utc::now())
            .await
            .unwrap();
        let err = managed::check_master_key_locked(&gateway)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("the master key does not open"),
            "{err}"
        );
    }

    /// After a rotation the chain verifies under the new key only, the sealed key and the
    /// check value open under the new key only, and the audit log refuses UPDATE again —
    /// its trigger put back as it was.
    #[tokio::test]
    async fn everything_moves_to_the_new_key_and_the_log_is_append_only_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = seeded(&dir.path().join("r.db")).await;
        let now = chrono::Utc::now();
        let trigger = "SELECT sql FROM sqlite_master WHERE name = 'audit_no_update'";
        let before: String = sqlx::query_scalar(trigger)
            .fetch_one(&db.sqlite().read)
            .await
            .unwrap();
        let new = key("cd");
        let done = rotate(&db, &new, "cli (t)", now).await.unwrap();
        assert_eq!((done.upstream_keys, done.audit_rows), (1, 4));
        let after: String = sqlx::query_scalar(trigger)
            .fetch_one(&db.sqlite().read)
            .await
            .unwrap();
        assert_eq!(before, after);
        let refused = sqlx::query("UPDATE audit_log SET actor = 'x'")
            .execute(&db.sqlite().write)
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("append-only"), "{refused}");
        let new_keys = AuditKeys::derive(&new);
        let st = audit::verify(&db, &new_keys).await.unwrap();
        assert_eq!((st.rows, st.broken), (4, None));
        assert!(audit::verify(&db, &db.audit)
            .await
            .unwrap()
            .broken
            .is_some());
        let row = &managed::upstreams(&db).await.unwrap()[0];
        let opened = row.open_key(&Sealer::new(&new)).unwrap();
        assert_eq!(opened.expose_secret(), "sk-secret");
        assert!(row.open_key(&db.seal).is_err());
        let check = managed::seal_check(&db).await.unwrap().unwrap();
        assert!(Sealer::new(&new).opens_check(&check).is_ok());
        assert!(db.seal.opens_check(&check).is_err());
    }
}

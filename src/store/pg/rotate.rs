//! `sluice secrets rotate` on PostgreSQL (see `store::rotate`): the same rewrite, the
//! audit log's append-only trigger disabled and enabled again inside the transaction
//! (`ALTER TABLE` takes the table's ACCESS EXCLUSIVE lock to the commit, so no other
//! session reads or appends to the log meanwhile, nor ever sees it without the trigger).

use sqlx::PgConnection;

use crate::store::audit::{self, AuditKeys, Broken, Relinked, Resigned};
use crate::store::Result;

/// The chain verified under `old` and signed again under `new` (as `store::rotate`).
pub(in crate::store) async fn relink(
    conn: &mut PgConnection,
    old: &AuditKeys,
    new: &AuditKeys,
) -> Result<std::result::Result<Resigned, Broken>> {
    // The whole chain is verified and signed again here, between two statements: a long
    // while for a long chain, not the idle transaction of a frozen host
    // (`pg::IDLE_IN_TRANSACTION_TIMEOUT`).
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *conn)
        .await?;
    // Taken first: no append can slip in between the read and the rewrite.
    sqlx::query("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *conn)
        .await?;
    let rows = sqlx::query("SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain FROM audit_log ORDER BY id")
        .fetch_all(&mut *conn)
        .await?;
    Ok(audit::resign(&rows, old, new))
}

/// Writes the re-sealed keys and the new links.
pub(in crate::store) async fn rewrite(
    conn: &mut PgConnection,
    resealed: &[(String, Vec<u8>)],
    relinked: &[Relinked],
) -> Result<()> {
    for (id, sealed) in resealed {
        sqlx::query("UPDATE managed_upstreams SET key_sealed = $1 WHERE id = $2")
            .bind(sealed)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("ALTER TABLE audit_log DISABLE TRIGGER audit_append_only")
        .execute(&mut *conn)
        .await?;
    for (id, prev, hash) in relinked {
        sqlx::query("UPDATE audit_log SET prev_hash = $1, hash = $2 WHERE id = $3")
            .bind(prev)
            .bind(hash)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("ALTER TABLE audit_log ENABLE TRIGGER audit_append_only")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

//! The audit chain on PostgreSQL (issue 17): the MAC computed by the gateway, one chain
//! however many hosts append at once, tampering detected as on SQLite, and a chain written
//! on SQLite verifying after a row-for-row copy.

use sha2::{Digest, Sha256};
use sluice::store::audit::{self, AuditEntry, AuditKeys};
use sluice::store::pg::audit as pg_audit;
use sqlx::{PgPool, Row};

use crate::pg_server;
use crate::pg_store::{at, both, pg_pool, Both};

fn entry(action: &str) -> AuditEntry<'_> {
    AuditEntry {
        actor: "root",
        address: "10.0.0.1",
        action,
        target: "token 7",
        before: None,
        after: Some("{\"rpm\":5}"),
    }
}

async fn fresh_pg() -> (String, PgPool) {
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    let pool = pg_pool(&url).await;
    (url, pool)
}

/// The superuser's bypass of the append-only triggers (what an attacker with the database
/// but not the gateway's key can do).
async fn as_attacker(pool: &PgPool, sql: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("ALTER TABLE audit_log DISABLE TRIGGER USER")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sql).execute(&mut *tx).await.unwrap();
    sqlx::query("ALTER TABLE audit_log ENABLE TRIGGER USER")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn append_n(pool: &PgPool, keys: &AuditKeys, n: usize) {
    for i in 0..n {
        let action = format!("token.edit.{i}");
        pg_audit::record(pool, keys, &entry(&action), at(10, i as u32))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn two_hosts_appending_at_once_keep_one_chain() {
    let b = both().await;
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    // Two "hosts": two pools on one database, each with writers of its own.
    let hosts = [pg_pool(&url).await, pg_pool(&url).await];
    let keys = b.lite.audit.clone();
    let mut tasks = Vec::new();
    for (h, pool) in hosts.iter().enumerate() {
        for w in 0..4 {
            let (pool, keys) = (pool.clone(), keys.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..25 {
                    let action = format!("h{h}.w{w}.{i}");
                    // Inside a transaction that does something else first, as an admin edit.
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
                    pg_audit::append(&mut tx, &keys, &entry(&action), chrono::Utc::now())
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = pg_audit::verify(&hosts[0], &keys).await.unwrap();
    assert_eq!((st.rows, st.broken), (200, None), "one chain of every row");
    let (rows, links): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT prev_hash) FROM audit_log")
            .fetch_one(&hosts[0])
            .await
            .unwrap();
    assert_eq!(
        rows, links,
        "no two rows link to the same row (the chain never forked)"
    );
    b.lite.close().await;
}

#[tokio::test]
async fn an_edited_a_removed_or_a_resigned_row_is_named_and_cut_newest_rows_show_against_the_head()
{
    let b = both().await;
    let keys = b.lite.audit.clone();
    // The triggers refuse changes to anyone who does not bypass them.
    let (_, pool) = fresh_pg().await;
    append_n(&pool, &keys, 5).await;
    for sql in [
        "UPDATE audit_log SET actor = 'x' WHERE id = 2",
        "DELETE FROM audit_log WHERE id = 5",
        "TRUNCATE audit_log",
    ] {
        let err = sqlx::query(sql).execute(&pool).await.unwrap_err();
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(pg_audit::verify(&pool, &keys).await.unwrap().broken, None);

    // An edited row.
    as_attacker(
        &pool,
        "UPDATE audit_log SET after = '{\"rpm\":500}' WHERE id = 3",
    )
    .await;
    let broken = pg_audit::verify(&pool, &keys)
        .await
        .unwrap()
        .broken
        .unwrap();
    assert_eq!((broken.id, broken.why), (3, audit::UNSIGNED));
    assert_eq!(
        pg_audit::signed_with(&pool, &keys).await.unwrap(),
        Some(true),
        "the other rows still verify: an edit, not another key"
    );

    // A row removed from the middle.
    let (_, pool) = fresh_pg().await;
    append_n(&pool, &keys, 5).await;
    as_attacker(&pool, "DELETE FROM audit_log WHERE id = 2").await;
    let broken = pg_audit::verify(&pool, &keys)
        .await
        .unwrap()
        .broken
        .unwrap();
    assert_eq!(broken.id, 3);
    assert!(broken.why.contains("does not link"), "{}", broken.why);

    // The newest rows removed: the chain alone still verifies; the head taken before
    // (`ops::audit_head` keeps it outside the database) is no longer held.
    let (_, pool) = fresh_pg().await;
    append_n(&pool, &keys, 5).await;
    let mut conn = pool.acquire().await.unwrap();
    let (rows, last_id, last_hash) = pg_audit::tip(&mut conn).await.unwrap();
    assert_eq!((rows, last_id), (5, 5));
    assert!(pg_audit::holds(&mut conn, rows, last_id, &last_hash)
        .await
        .unwrap());
    as_attacker(&pool, "DELETE FROM audit_log WHERE id >= 4").await;
    assert_eq!(pg_audit::verify(&pool, &keys).await.unwrap().broken, None);
    assert!(
        !pg_audit::holds(&mut conn, rows, last_id, &last_hash)
            .await
            .unwrap(),
        "a cut chain does not hold the head"
    );
    // … nor does a truncated table, however re-filled.
    as_attacker(&pool, "TRUNCATE audit_log").await;
    append_n(&pool, &keys, 5).await;
    assert!(!pg_audit::holds(&mut conn, rows, last_id, &last_hash)
        .await
        .unwrap());
    drop(conn);

    // The whole chain rewritten under another key (an attacker's own): nothing verifies.
    let (_, pool) = fresh_pg().await;
    let other = sluice::store::Db::open(&b._dir.path().join("other.db"), false)
        .await
        .unwrap();
    append_n(&pool, &other.audit, 3).await;
    let broken = pg_audit::verify(&pool, &keys)
        .await
        .unwrap()
        .broken
        .unwrap();
    assert_eq!((broken.id, broken.why), (1, audit::UNSIGNED));
    assert_eq!(
        pg_audit::signed_with(&pool, &keys).await.unwrap(),
        Some(false)
    );
    other.close().await;
    b.lite.close().await;
}

/// The pre-keying hash (`store::audit`'s legacy rows), computed independently.
fn legacy(prev: &str, f: [&str; 7]) -> String {
    let mut h = Sha256::new();
    for part in std::iter::once(prev).chain(f) {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Copies every audit row, ids included, from the SQLite database to PostgreSQL (what
/// `sluice migrate-store` does), then moves the id sequence past them.
async fn copy_chain(b: &Both) {
    let rows = sqlx::query("SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain FROM audit_log ORDER BY id")
        .fetch_all(&b.lite.sqlite().read)
        .await
        .unwrap();
    for r in rows {
        sqlx::query("INSERT INTO audit_log (id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
            .bind(r.get::<i64, _>("id"))
            .bind(r.get::<String, _>("actor"))
            .bind(r.get::<String, _>("address"))
            .bind(r.get::<String, _>("action"))
            .bind(r.get::<String, _>("target"))
            .bind(r.get::<Option<String>, _>("before"))
            .bind(r.get::<Option<String>, _>("after"))
            .bind(r.get::<String, _>("created_at"))
            .bind(r.get::<String, _>("prev_hash"))
            .bind(r.get::<String, _>("hash"))
            .bind(r.get::<String, _>("chain"))
            .execute(&b.pool)
            .await
            .unwrap();
    }
    sqlx::query(
        "SELECT setval(pg_get_serial_sequence('audit_log', 'id'), (SELECT max(id) FROM audit_log))",
    )
    .execute(&b.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_chain_written_on_sqlite_verifies_on_postgres_after_a_row_for_row_copy() {
    let b = both().await;
    let keys = b.lite.audit.clone();
    // Two rows from before the chain was keyed, then the seal, then keyed rows (NULLs,
    // non-ASCII, an empty address) and a head start.
    let genesis = "0".repeat(64);
    let h1 = legacy(
        &genesis,
        [
            "cli",
            "",
            "team.create",
            "team 1",
            "\u{0}",
            "{}",
            "2025-01-01T00:00:00.000Z",
        ],
    );
    let h2 = legacy(
        &h1,
        [
            "cli",
            "",
            "user.create",
            "user 1",
            "{}",
            "\u{0}",
            "2025-01-01T00:00:01.000Z",
        ],
    );
    for (id, prev, hash, action, target, before, after, t) in [
        (
            1,
            genesis.as_str(),
            h1.as_str(),
            "team.create",
            "team 1",
            None,
            Some("{}"),
            "2025-01-01T00:00:00.000Z",
        ),
        (
            2,
            h1.as_str(),
            h2.as_str(),
            "user.create",
            "user 1",
            Some("{}"),
            None,
            "2025-01-01T00:00:01.000Z",
        ),
    ] {
        sqlx::query("INSERT INTO audit_log (id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain) VALUES (?, 'cli', '', ?, ?, ?, ?, ?, ?, ?, 'sha256')")
            .bind(id).bind(action).bind(target).bind(before).bind(after).bind(t).bind(prev).bind(hash)
            .execute(&b.lite.sqlite().write).await.unwrap();
    }
    let seal = AuditEntry {
        actor: "sluice",
        address: "",
        action: audit::SEAL,
        target: "",
        before: None,
        after: Some("{\"legacy_rows\":2}"),
    };
    audit::record(&b.lite, &seal, at(8, 0)).await.unwrap();
    for (i, e) in [
        entry("token.revoke"),
        AuditEntry {
            actor: "émile",
            address: "",
            action: "login",
            target: "",
            before: None,
            after: None,
        },
        AuditEntry {
            actor: "root",
            address: "::1",
            action: audit::HEAD_STARTED,
            target: "",
            before: Some("x"),
            after: Some(""),
        },
        entry("token.rotate"),
    ]
    .iter()
    .enumerate()
    {
        audit::record(&b.lite, e, at(9, i as u32)).await.unwrap();
    }
    let on_sqlite = audit::verify(&b.lite, &keys).await.unwrap();
    assert_eq!((on_sqlite.rows, &on_sqlite.broken), (7, &None));

    copy_chain(&b).await;
    let on_pg = pg_audit::verify(&b.pool, &keys).await.unwrap();
    assert_eq!(on_pg, on_sqlite, "the copy verifies the same");
    let mut lite = b.lite.begin_read().await.unwrap();
    let mut on_pg = b.pg.begin_read().await.unwrap();
    assert_eq!(
        audit::tip(&mut lite).await.unwrap(),
        audit::tip(&mut on_pg).await.unwrap()
    );
    // A copied `audit.head_started` row names no head: on SQLite (one host) it still
    // counts; on PostgreSQL each host's head counts only rows naming it, so the copy's
    // hosts start heads of their own.
    assert!(audit::head_started(&mut lite, "host:/dir")
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        audit::head_started(&mut on_pg, "host:/dir").await.unwrap(),
        None
    );
    drop(on_pg);
    let mut pg = b.pool.acquire().await.unwrap();
    let (rows, id, hash) = pg_audit::tip(&mut pg).await.unwrap();
    assert!(pg_audit::holds(&mut pg, rows, id, &hash).await.unwrap());
    assert_eq!(
        pg_audit::signed_with(&b.pool, &keys).await.unwrap(),
        Some(true)
    );
    drop((lite, pg));

    // The chain goes on on PostgreSQL, and the same row appended on SQLite gets the same MAC.
    let next = entry("team.budget");
    pg_audit::record(&b.pool, &keys, &next, at(11, 0))
        .await
        .unwrap();
    audit::record(&b.lite, &next, at(11, 0)).await.unwrap();
    let st = pg_audit::verify(&b.pool, &keys).await.unwrap();
    assert_eq!((st.rows, &st.broken), (8, &None));
    assert_eq!(
        st,
        audit::verify(&b.lite, &keys).await.unwrap(),
        "both engines sign the same bytes alike"
    );

    // A legacy row edited in the copy is named as on SQLite.
    as_attacker(
        &b.pool,
        "UPDATE audit_log SET target = 'team 2' WHERE id = 1",
    )
    .await;
    let broken = pg_audit::verify(&b.pool, &keys)
        .await
        .unwrap()
        .broken
        .unwrap();
    assert_eq!(
        (broken.id, broken.why),
        (1, "it was changed after it was written")
    );
    b.lite.close().await;
}

/// A database (or role) whose default isolation is REPEATABLE READ, as a managed
/// PostgreSQL's template may set: an append's snapshot was fixed by its transaction's first
/// statement, before it waited for the chain lock, so the second of two appends at once
/// linked to the row before the first one's — a chain forked for good, `verify` naming a
/// tampering that never was (s30 multi-host attack F1). The gateway's sessions pin READ
/// COMMITTED whatever the server's default.
#[tokio::test]
async fn appends_link_under_a_repeatable_read_default() {
    let (url, admin) = fresh_pg().await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&admin)
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let key = sluice::secrets::MasterKey::from_hex(crate::pg_admin::MASTER_HEX).unwrap();
    let db = sluice::store::Db::open_postgres(&url, &key).await.unwrap();
    let pg = db.postgres().expect("a PostgreSQL Db");
    let (pool, keys) = (pg.pool.clone(), pg.audit.clone());
    // Set on the session, not in the startup packet: a session-mode pooler (PgBouncer)
    // refuses startup parameters it does not track (s30 diff attack F4).
    assert_eq!(pool.connect_options().get_options(), None);
    for (setting, value) in [
        ("transaction_isolation", "read committed"),
        ("lock_timeout", "2s"),
        ("idle_in_transaction_session_timeout", "30s"),
        ("tcp_keepalives_idle", "10"),
    ] {
        let shown: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(shown, value, "{setting}");
    }
    let mut first = pool.begin().await.unwrap();
    pg_audit::append(&mut first, &keys, &entry("first"), at(10, 0))
        .await
        .unwrap();
    let (p2, k2) = (pool.clone(), keys.clone());
    let second = tokio::spawn(async move {
        let mut tx = p2.begin().await.unwrap();
        // Something read first, as an admin edit does: the snapshot of a REPEATABLE READ
        // transaction is fixed here, before the chain lock is waited for.
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        pg_audit::append(&mut tx, &k2, &entry("second"), at(10, 1))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    first.commit().await.unwrap();
    second.await.unwrap();
    let st = pg_audit::verify(&pool, &keys).await.unwrap();
    assert_eq!((st.rows, st.broken), (2, None), "one chain");
}

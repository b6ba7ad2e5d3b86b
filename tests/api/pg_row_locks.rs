//! The money path's row locks on PostgreSQL (issue 17): the writer locks budget rows with
//! `FOR NO KEY UPDATE`, the lock its `UPDATE`s of non-key columns take anyway, so a
//! concurrent insert whose foreign key names a locked row (a token issued for a user, a
//! user created in a team) does not wait for the money batch to commit, while another
//! balance change still does.

use std::time::Duration;

use sluice::store::pg::writer::{lock_rows, Locks};
use sqlx::Connection;

use crate::helpers::Budget;
use crate::pg_money::{pg_owner, Store};

fn unlimited() -> Budget {
    Budget {
        limit: None,
        reset: "never",
    }
}

/// While a money batch holds its locks on a user and a team, a token issued for that user
/// and a user created in that team go through at once (no 55P03 under a 2 s lock
/// timeout); a balance update of the locked user still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_money_batch_does_not_block_inserts_whose_foreign_keys_name_its_rows() {
    let store = Store::postgres().await;
    let db = store.pg();
    let owner = pg_owner(db, &[unlimited(), unlimited(), unlimited()]).await;
    let mut batch = db.pool.acquire().await.unwrap();
    let mut held = batch.begin().await.unwrap();
    lock_rows(
        &mut held,
        &Locks {
            tokens: vec![owner.token_id],
            users: vec![owner.user_id],
            teams: vec![owner.team_id],
            requests: vec![],
        },
    )
    .await
    .unwrap();

    let mut admin = db.pool.acquire().await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '2s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let issued = sqlx::query(
        "INSERT INTO tokens (id, user_id, token_hash, prefix, created_at) VALUES ($2, $1, '\\x0102'::bytea, 'abcdefgh', '2026-12-01T00:00:00.000Z')",
    )
    .bind(owner.user_id)
    .bind(owner.token_id + 1_000_000)
    .execute(&mut *tx)
    .await;
    assert!(
        issued.is_ok(),
        "a token issued for a user whose row a money batch holds: {issued:?}"
    );
    let created = sqlx::query(
        "INSERT INTO users (id, username, team_id, created_at) VALUES ($2, 'newcomer', $1, '2026-12-01T00:00:00.000Z')",
    )
    .bind(owner.team_id)
    .bind(owner.user_id + 1_000_000)
    .execute(&mut *tx)
    .await;
    assert!(
        created.is_ok(),
        "a user created in a team whose row a money batch holds: {created:?}"
    );
    tx.commit().await.unwrap();

    // A balance change of a held row still waits for the batch (here: times out).
    let mut other = db.pool.acquire().await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '300ms'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = sqlx::query("UPDATE users SET remaining_micros = 0 WHERE id = $1")
        .bind(owner.user_id)
        .execute(&mut *tx)
        .await
        .expect_err("a balance update of a row the batch holds waits for it");
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.to_string());
    assert_eq!(code.as_deref(), Some("55P03"), "{err}");
    drop(tx);
    held.rollback().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        sqlx::query("UPDATE users SET remaining_micros = NULL WHERE id = $1")
            .bind(owner.user_id)
            .execute(&db.pool)
            .await
            .unwrap()
    })
    .await
    .unwrap();
}

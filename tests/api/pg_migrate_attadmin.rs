//! Attacks on `sluice migrate-store`'s NUL → U+FFFD mapping (s6-attadmin).

use sluice::store::Db;

use crate::pg_admin::sluice;
use crate::pg_server;

/// An older install could keep a team named `acme` + NUL (SQLite keeps the NUL; admin
/// bodies refuse it only since this version), and a team named `acme` + U+FFFD is a name
/// this version accepts. The copy maps the first onto the second: two rows, one unique
/// name. Before the fix the copy failed on PostgreSQL's unique index with "duplicate key
/// value violates unique constraint \"teams_name_key\"" — naming neither the mapping nor
/// the rows, so the operator could not tell what to rename.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_mapped_onto_an_existing_name_refuses_naming_the_table_and_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.db");
    let db = Db::open(&path, false).await.unwrap();
    let w = &db.sqlite().write;
    sqlx::query(
        "INSERT INTO teams (id, name, created_at) VALUES
            (7, 'acme' || char(0), '2026-11-30T10:00:00.000Z'),
            (8, 'acme' || char(65533), '2026-11-30T10:00:00.000Z')",
    )
    .execute(w)
    .await
    .unwrap();
    db.close().await;
    let from = format!("sqlite://{}", path.display());
    let to = pg_server::database();
    let (ok, out, err) = sluice(
        &dir.path().join("none.toml"),
        &["migrate-store", "--from", &from, "--to", &to],
        &[],
    );
    assert!(!ok, "two teams of one name were copied: {out}");
    assert!(
        err.contains("teams") && err.contains("U+FFFD"),
        "the refusal names neither the table nor the NUL mapping: {err}"
    );
    let mut pg = <sqlx::PgConnection as sqlx::Connection>::connect(&to)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM teams")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing was kept");
}

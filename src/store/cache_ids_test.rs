//! The cache table's SQLite ids across the upgrade that made them `AUTOINCREMENT`
//! (migration 0029): every entry keeps its number, and a number once given never comes
//! back, so replicas following new rows by id see each one (s28 stop attack F2,
//! `cache::lifecycle_test::a_row_stored_after_the_newest_was_evicted_is_followed_by_other_replicas`).

use super::Db;

#[tokio::test]
async fn the_upgrade_to_ids_that_never_come_back_keeps_every_entry_and_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upgraded.db");
    // The table as migration 0010 made it, with two entries, and 0029 not yet applied.
    let before = include_str!("../../migrations/sqlite/0010_cache.sql");
    let table = &before[before.find("CREATE TABLE cache_entries").unwrap()
        ..before.find("ALTER TABLE tokens").unwrap()];
    {
        let db = Db::open(&file, false).await.unwrap();
        let w = &db.sqlite().write;
        let undo = format!(
            "DROP TABLE cache_entries; {table} DELETE FROM _sqlx_migrations WHERE version = 29;"
        );
        sqlx::raw_sql(&undo).execute(w).await.unwrap();
        for (rowid, key) in [(7_i64, "a"), (9, "b")] {
            sqlx::query(
                "INSERT INTO cache_entries (rowid, key, scope, model, format, answer, tags, created_at, expires_at, hits)
                 VALUES (?, ?, 's', 'm', 'openai', '{}', ',x,', 'c', 'e', 3)",
            )
            .bind(rowid)
            .bind(key.as_bytes())
            .execute(w)
            .await
            .unwrap();
        }
        w.close().await;
    }

    let db = Db::open(&file, false).await.unwrap();
    let w = &db.sqlite().write;
    let rows: Vec<(i64, Vec<u8>, String, i64)> =
        sqlx::query_as("SELECT rowid, key, tags, hits FROM cache_entries ORDER BY rowid")
            .fetch_all(w)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            (7, b"a".to_vec(), ",x,".into(), 3),
            (9, b"b".to_vec(), ",x,".into(), 3)
        ]
    );
    // The newest row deleted, a key stored again still takes a number past every one given.
    sqlx::query("DELETE FROM cache_entries WHERE rowid = 9")
        .execute(w)
        .await
        .unwrap();
    sqlx::query(
        "INSERT OR REPLACE INTO cache_entries (key, scope, model, format, answer, created_at, expires_at)
         VALUES (x'61', 's', 'm', 'openai', '{}', 'c', 'e')",
    )
    .execute(w)
    .await
    .unwrap();
    let ids: Vec<i64> = sqlx::query_scalar("SELECT rowid FROM cache_entries")
        .fetch_all(w)
        .await
        .unwrap();
    assert_eq!(ids, [10]);
}

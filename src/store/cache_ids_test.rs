//! The cache table's SQLite ids across the upgrade that made them `AUTOINCREMENT`
//! (migration 0029): the table starts again empty (a cache; copying it held the write lock
//! from a previous version still running), every replica rebuilds (the epoch moves), and a
//! number once given never comes back, so replicas following new rows by id see each one
//! (s28 stop attack F2,
//! `cache::lifecycle_test::a_row_stored_after_the_newest_was_evicted_is_followed_by_other_replicas`).

use super::Db;

#[tokio::test]
async fn the_upgrade_to_ids_that_never_come_back_empties_the_cache_and_moves_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upgraded.db");
    // The table as migration 0010 made it, with two entries, and 0029 not yet applied.
    let before = include_str!("../../migrations/sqlite/0010_cache.sql");
    let table = &before[before.find("CREATE TABLE cache_entries").unwrap()
        ..before.find("ALTER TABLE tokens").unwrap()];
    let epoch = |db: &Db| {
        let pool = db.sqlite().write.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT value FROM meta WHERE key = 'cache_epoch'")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let was = {
        let db = Db::open(&file, false).await.unwrap();
        let w = &db.sqlite().write;
        let undo = format!(
            "DROP TABLE cache_entries; {table} DELETE FROM _sqlx_migrations WHERE version = 29;"
        );
        sqlx::raw_sql(&undo).execute(w).await.unwrap();
        for (rowid, key) in [(7_i64, "a"), (9, "b")] {
            sqlx::query(
                "INSERT INTO cache_entries (rowid, key, scope, model, format, answer, created_at, expires_at)
                 VALUES (?, ?, 's', 'm', 'openai', '{}', 'c', 'e')",
            )
            .bind(rowid)
            .bind(key.as_bytes())
            .execute(w)
            .await
            .unwrap();
        }
        let was = epoch(&db).await;
        w.close().await;
        was
    };

    let db = Db::open(&file, false).await.unwrap();
    let w = &db.sqlite().write;
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM cache_entries")
            .fetch_one(w)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 0, "a cache starts again empty");
    assert_eq!(epoch(&db).await, was + 1, "every replica rebuilds");
    // The newest row deleted, a key stored again still takes a number past every one given.
    let put = |key: &'static str| async move {
        sqlx::query(
            "INSERT OR REPLACE INTO cache_entries (key, scope, model, format, answer, created_at, expires_at)
             VALUES (?, 's', 'm', 'openai', '{}', 'c', 'e')",
        )
        .bind(key.as_bytes())
        .execute(w)
        .await
        .unwrap();
    };
    put("a").await;
    put("b").await;
    sqlx::query("DELETE FROM cache_entries WHERE key = x'62'")
        .execute(w)
        .await
        .unwrap();
    put("a").await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT rowid FROM cache_entries")
        .fetch_all(w)
        .await
        .unwrap();
    assert_eq!(ids, [3]);
}

//! The PostgreSQL test harness itself (`pg_server`): separate databases on the shared
//! server, and a server of a test's own that stops and comes back. Kept apart from the
//! harness, which the load suite includes too.

use std::process::Command;

use crate::pg_server::{database, shared, PgServer};

#[test]
fn a_shared_server_hands_out_separate_databases() {
    let a = database();
    let b = database();
    assert_ne!(a, b);
    for url in [&a, &b] {
        let db = url.rsplit('/').next().unwrap();
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &shared().port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", db, "-tAc", "SELECT current_database()"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), db);
    }
}

#[test]
fn a_server_of_its_own_stops_and_comes_back_with_its_data() {
    let server = PgServer::start();
    let url = server.database();
    let db = url.rsplit('/').next().unwrap().to_string();
    let psql = |sql: &str| {
        Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &server.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", &db, "-v", "ON_ERROR_STOP=1", "-tAc", sql])
            .output()
            .unwrap()
    };
    assert!(psql("CREATE TABLE t (v BIGINT); INSERT INTO t VALUES (42)")
        .status
        .success());
    server.stop();
    assert!(!psql("SELECT 1").status.success(), "stopped");
    server.run();
    assert_eq!(
        String::from_utf8_lossy(&psql("SELECT v FROM t").stdout).trim(),
        "42"
    );
}

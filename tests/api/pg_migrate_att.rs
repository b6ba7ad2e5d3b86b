//! Attack on `sluice migrate-store`: text an anonymous client made SQLite keep verbatim.
//! SQLite stores a NUL ('\0') inside text like any character; PostgreSQL's text refuses
//! it. One failed sign-in as `root\0x` on the SQLite install leaves the throttle key
//! `user:root\0x` in `login_failures`, and the copy of that one row failed the whole
//! migration with "invalid byte sequence for encoding UTF8: 0x00" — nobody can move the
//! install to PostgreSQL while the row is there. The sign-in path now records the username
//! with U+FFFD in its place (and the throttle key is now the name's MAC, the audit row of
//! a failed sign-in at an unknown name `(unknown)`: neither holds a NUL); what an older
//! version left is handled by the copy itself (NUL → U+FFFD
//! outside the audit log, a refusal naming the row inside it): `pg_migrate_old`.

use std::time::Duration;

use sluice::mock::{MockConfig, MockServer};

use crate::admin_helpers::{client, login_form_at, post_login_at};
use crate::gateway_proc::start_gateway_full;
use crate::pg_admin::{migrate_to_fresh_pg, pg_connect};

#[tokio::test]
async fn a_failed_sign_in_with_a_nul_in_the_username_does_not_block_migrate_store() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let gw = start_gateway_full(dir.path(), &mock, &[], "").await;
    let form = client();
    let (pre, csrf) = login_form_at(&form, &gw.url).await;
    let r = post_login_at(
        &form,
        &gw.url,
        &format!("sluice_login={pre}"),
        &csrf,
        "root\u{0}x",
        "wrong",
    )
    .await;
    assert_eq!(r.status(), 401);

    // SIGTERM: the gateway settles, flushes and unregisters.
    let pid = gw.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let mut gw = gw;
    for _ in 0..200 {
        if gw.child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gw.child.try_wait().unwrap().is_some(),
        "the gateway stopped"
    );

    let path = dir.path().join("sluice.db");
    let lite = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let with_nul: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM login_failures WHERE instr(key, char(0)) > 0")
            .fetch_one(&lite)
            .await
            .unwrap();
    lite.close().await;
    assert_eq!(
        with_nul, 0,
        "the anonymous username is recorded without its NUL"
    );

    let (ok, out, err, to) = migrate_to_fresh_pg(dir.path(), &path);
    assert!(
        ok,
        "migrate-store failed on one sign-in throttle row: {out}\n{err}"
    );

    let mut pg = pg_connect(&to).await;
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT key FROM login_failures WHERE key LIKE 'user:%'")
            .fetch_all(&mut pg)
            .await
            .unwrap();
    // The name is counted under its MAC (no typed text kept), so no NUL can be in it.
    assert_eq!(keys.len(), 1, "{keys:?}");
    let mac = keys[0].strip_prefix("user:").unwrap_or_default();
    assert!(
        mac.len() == 64 && mac.bytes().all(|b| b.is_ascii_hexdigit()),
        "{keys:?}"
    );
}

//! In-process apps on either engine (issue 17): `spawn_app_on(Engine::Postgres, …)` is
//! `spawn_app_with` with its database on a fresh database of the shared PostgreSQL server,
//! so a test body checking behaviour runs unchanged on both (`on_both_engines!`).

use std::sync::Arc;

use sluice::clock::Clock;
use sluice::config::Settings;
use sluice::mock::MockServer;

use crate::helpers::{spawn_app_full, TestApp};

/// Which engine an in-process app's database is on (`spawn_app_on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// The master key every test host on one PostgreSQL database shares (hex).
pub const SHARED_KEY_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// The master key of `SHARED_KEY_HEX`, for opening a shared database beside its hosts.
pub fn shared_key() -> sluice::secrets::MasterKey {
    sluice::secrets::MasterKey::from_hex(SHARED_KEY_HEX).expect("the shared key is hex")
}

/// Points `s` at a fresh database on the shared PostgreSQL server, with the shared key in a
/// key file of `dir` (mode 0600, as the gateway demands).
pub fn on_postgres(s: &mut Settings, dir: &std::path::Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let key = dir.join("shared.key");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&key)
        .unwrap();
    std::io::Write::write_all(&mut f, SHARED_KEY_HEX.as_bytes()).unwrap();
    s.database.url = crate::pg_server::database();
    s.database.key_file = Some(key);
}

/// `spawn_app_with` on either engine: the same app, its database on SQLite (the default
/// everywhere else) or on a fresh database of the shared PostgreSQL server.
pub async fn spawn_app_on(
    engine: Engine,
    tweak: impl FnOnce(&mut Settings, &MockServer),
) -> TestApp {
    spawn_app_on_full(engine, tweak, None).await
}

/// `spawn_app_full` on either engine.
pub async fn spawn_app_on_full(
    engine: Engine,
    tweak: impl FnOnce(&mut Settings, &MockServer),
    clock: Option<Arc<dyn Clock>>,
) -> TestApp {
    spawn_app_full(
        |s, mock| {
            // The suite-wide switch (`TEST_STORE`) has already chosen an engine for
            // `s`; a test that names its engine gets that one whatever the switch says.
            let dir = std::path::PathBuf::from(&s.backup.dir);
            let dir = dir.parent().unwrap().to_path_buf();
            match engine {
                Engine::Postgres if !s.database.url.starts_with("postgres") => on_postgres(s, &dir),
                Engine::Postgres => {}
                Engine::Sqlite => {
                    s.database.url = format!("sqlite://{}", dir.join("sluice.db").display());
                    s.database.key_file = None;
                }
            }
            tweak(s, mock)
        },
        clock,
    )
    .await
}

/// Generates `sqlite` and `postgres` tests running `$body(Engine)`: one body, two stores.
#[macro_export]
macro_rules! on_both_engines {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::pg_gateway_app::Engine::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::pg_gateway_app::Engine::Postgres).await
            }
        }
    };
}

//! The real binary as a child process: a gateway on a temp dir's database with an
//! in-process mock upstream, started and polled until healthy, and what tests read of it
//! from `/proc` (CPU time). Shared by the api suite (`processes.rs`, `slow_reader.rs`) and
//! the load suite (`tests/load/`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice::mock::MockServer;

use crate::helpers::{issue_args, test_engine, KEY_A};
use crate::pg_gateway_app::{on_postgres, shared_key, Engine};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) struct Gateway {
    pub child: Child,
    pub url: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gateway's config, on `dir`'s database; `extra` is appended (more tables, e.g.
/// `[redis]`).
pub(crate) fn write_config(
    dir: &std::path::Path,
    mock: &MockServer,
    port: u16,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("sluice-{port}.toml"));
    let sqlite = dir.join("sluice.db");
    let mut text = config_text(port, &sqlite, &dir.join("backup"), mock, extra);
    if test_engine() == Engine::Postgres {
        let (url, key) = dir_postgres(dir);
        text = text.replace(
            &format!("url = \"sqlite://{}\"", sqlite.display()),
            &format!("url = \"{url}\"\nkey_file = \"{}\"", key.display()),
        );
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// On the suite's PostgreSQL pass, the database every gateway and reader of `dir` shares
/// (as they share `dir/sluice.db` otherwise): a fresh one at first use, its URL kept in
/// `dir/pg-url`; and the shared key's file.
fn dir_postgres(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let kept = dir.join("pg-url");
    let key = dir.join("shared.key");
    if let Ok(url) = std::fs::read_to_string(&kept) {
        return (url, key);
    }
    let mut s = sluice::config::Settings::default();
    on_postgres(&mut s, dir);
    std::fs::write(&kept, &s.database.url).unwrap();
    (s.database.url, key)
}

/// The database of the gateway(s) on `dir`, opened beside them (on the suite's engine).
pub(crate) async fn open_dir_db(dir: &std::path::Path) -> sluice::store::Db {
    match test_engine() {
        Engine::Sqlite => sluice::store::Db::open(&dir.join("sluice.db"), false).await,
        Engine::Postgres => {
            let (url, _) = dir_postgres(dir);
            sluice::store::Db::open_postgres(&url, &shared_key()).await
        }
    }
    .unwrap()
}

/// A gateway's config: listening on `port`, its database at `db` and its backups in
/// `backup`, the mock as its one upstream, one priced model; `extra` is appended.
pub(crate) fn config_text(
    port: u16,
    db: &std::path::Path,
    backup: &std::path::Path,
    mock: &MockServer,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers = 1
[database]
url = "sqlite://{db}"
[[upstreams]]
id = "a"
provider = "openai"
base_url = "{mock}/v1"
api_key = "{KEY_A}"
allow_private_network = true
[[models]]
name = "gpt-4o-mini"
routes = [{{ upstream = "a", model = "gpt-4o-mini" }}]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
# The mock is on loopback: managed upstreams on it opt in, as config ones do.
[upstream]
managed_allow_private_network = true
[backup]
dir = "{backup}"
{extra}
"#,
        db = db.display(),
        backup = backup.display(),
        mock = mock.base_url()
    )
}

/// A gateway process on `dir`'s database with extra environment and config.
pub(crate) async fn start_gateway_full(
    dir: &std::path::Path,
    mock: &MockServer,
    env: &[(&str, &str)],
    extra: &str,
) -> Gateway {
    on_a_free_port(|port| {
        let config = write_config(dir, mock, port, extra);
        let log = dir.join(format!("gateway-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--config", config.to_str().unwrap(), "serve"])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    })
    .await
    .0
}

/// A gateway process `spawn` starts on a free port, and its log; started again on another
/// port when another process took that one between its choice and the gateway's bind (the
/// suite runs tests in parallel: a free port is only free until someone binds it).
pub(crate) async fn on_a_free_port(
    mut spawn: impl FnMut(u16) -> (Child, std::path::PathBuf),
) -> (Gateway, std::path::PathBuf) {
    for _ in 0..5 {
        let port = free_port();
        let (child, log) = spawn(port);
        match started(child, port, &log).await {
            Ok(gateway) => return (gateway, log),
            Err(text) if text.contains("Address already in use") => continue,
            Err(text) => panic!("gateway did not start: {text}"),
        }
    }
    panic!("no free port in five tries");
}

/// The database of the gateway on `dir` (`open_dir_db`), opened beside the process, and a
/// token for `user` with a budget of $10 issued in it.
pub(crate) async fn db_and_token(dir: &std::path::Path, user: &str) -> (sluice::store::Db, String) {
    let db = open_dir_db(dir).await;
    let args = sluice::cli::IssueArgs {
        budget_usd: Some("10"),
        ..issue_args(user)
    };
    let token = sluice::cli::token_issue(&db, &args, chrono::Utc::now())
        .await
        .unwrap()
        .text;
    (db, token)
}

/// The gateway process `child` on `port` once its `/healthz` answers 200 (bounded); else it
/// is ended and the test fails with its log.
pub(crate) async fn healthy(child: Child, port: u16, log: &std::path::Path) -> Gateway {
    started(child, port, log)
        .await
        .unwrap_or_else(|text| panic!("gateway did not start: {text}"))
}

/// `healthy`, or the log of a process that did not start (it exited, or never answered).
async fn started(child: Child, port: u16, log: &std::path::Path) -> Result<Gateway, String> {
    let mut gateway = Gateway {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if reqwest::get(format!("{}/healthz", gateway.url))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return Ok(gateway);
        }
        if gateway.child.try_wait().ok().flatten().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(std::fs::read_to_string(log).unwrap_or_default())
}

/// CPU time (user + system, in clock ticks) the process has used so far.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) start at field 3: utime is
    // field 14 and stime field 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The CPU ticks the process uses over one second.
pub(crate) async fn ticks_in_a_second(pid: u32) -> u64 {
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    cpu_ticks(pid) - before
}

/// The `[database] url` of the gateway(s) on `dir` (`write_config`), on the suite's engine.
pub(crate) fn dir_database_url(dir: &std::path::Path) -> String {
    match test_engine() {
        Engine::Sqlite => format!("sqlite://{}", dir.join("sluice.db").display()),
        Engine::Postgres => dir_postgres(dir).0,
    }
}

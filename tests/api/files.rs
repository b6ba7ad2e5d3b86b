//! The files the gateway keeps (S13): the database, its `-wal` and `-shm`, the master key
//! and the signed audit head are for the gateway's user only — created 0600 by a real
//! gateway process under the usual umask 022, and tightened when an older version left
//! them readable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice::mock::{MockConfig, MockServer};

use crate::helpers::KEY_A;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `sluice serve` on `dir/data/sluice.db` under umask 022, with `env`; waits for /healthz.
async fn serve(dir: &Path, mock: &MockServer, env: &[(&str, &str)]) -> (Proc, PathBuf) {
    let port = free_port();
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"
workers = 1
[database]
url = "sqlite://{dir}/data/sluice.db"
[backup]
dir = "{dir}/backup"
[[upstreams]]
id = "a"
provider = "openai"
base_url = "{mock}/v1"
api_key = "{KEY_A}"
allow_private_network = true
[[models]]
name = "gpt-4o-mini"
routes = [{{ upstream = "a", model = "gpt-4o-mini" }}]
"#,
            dir = dir.display(),
            mock = mock.base_url()
        ),
    )
    .unwrap();
    let log = dir.join(format!("gateway-{port}.log"));
    let child = Command::new("sh")
        .args(["-c", "umask 022 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env_remove("SLUICE_SECRET_KEY")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    let url = format!("http://127.0.0.1:{port}/healthz");
    for _ in 0..200 {
        if reqwest::get(&url).await.is_ok_and(|r| r.status() == 200) {
            return (proc, log);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "gateway did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Waits (bounded) for a file the gateway writes in the background.
async fn appears(p: &Path) {
    for _ in 0..200 {
        if p.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} never appeared", p.display());
}

#[tokio::test]
async fn a_fresh_gateway_creates_every_file_0600() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let (_gw, _) = serve(dir.path(), &mock, &[]).await;
    let data = dir.path().join("data");
    for f in [
        "sluice.db",
        "sluice.db-wal",
        "sluice.db-shm",
        "sluice.db.key",
    ] {
        let f = data.join(f);
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    let head = dir.path().join("backup/audit.head");
    appears(&head).await;
    assert_eq!(mode(&head), 0o600);
}

#[tokio::test]
async fn files_an_older_version_left_readable_are_tightened_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let db = dir.path().join("data/sluice.db");
    {
        let (_gw, _) = serve(dir.path(), &mock, &[]).await;
    }
    for f in [
        "sluice.db",
        "sluice.db-wal",
        "sluice.db-shm",
        "sluice.db.key",
    ] {
        let p = dir.path().join("data").join(f);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let (_gw, log) = serve(dir.path(), &mock, &[]).await;
    assert_eq!(mode(&db), 0o600);
    for f in ["sluice.db-wal", "sluice.db-shm"] {
        let p = dir.path().join("data").join(f);
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    assert_eq!(mode(&dir.path().join("data/sluice.db.key")), 0o600);
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains("database file was readable by others"),
        "no warning logged: {text}"
    );
}

#[tokio::test]
async fn with_sluice_secret_key_no_key_file_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let key = "ab".repeat(32);
    let (_gw, log) = serve(dir.path(), &mock, &[("SLUICE_SECRET_KEY", &key)]).await;
    appears(&dir.path().join("backup/audit.head")).await;
    assert!(!dir.path().join("data/sluice.db.key").exists());
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!text.contains(&key), "the master key is in the log");
}

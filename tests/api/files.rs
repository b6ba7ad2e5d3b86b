//! The files the gateway keeps (S13): the database, its `-wal` and `-shm`, the master key
//! and the signed audit head are for the gateway's user only — created 0600 by a real
//! gateway process under the usual umask 022, and tightened when an older version left
//! them readable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice::mock::{MockConfig, MockServer};

use crate::gateway_proc::config_text;
use crate::gateway_proc::on_a_free_port;
use crate::processes::{free_port, Gateway};

/// `sluice serve` on `dir/data/sluice.db` under umask 022, with `env`; waits for /healthz.
async fn serve(dir: &Path, mock: &MockServer, env: &[(&str, &str)]) -> (Gateway, PathBuf) {
    serve_umask(dir, mock, env, "022").await
}

/// The config of a gateway on `dir/data/sluice.db` listening on `port`.
fn write_config(dir: &Path, mock: &MockServer, port: u16) -> PathBuf {
    let config = dir.join("sluice.toml");
    let text = config_text(
        port,
        &dir.join("data/sluice.db"),
        &dir.join("backup"),
        mock,
        "",
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// `sluice <args>` under `umask`, its standard error into `log`.
fn sluice(config: &Path, umask: &str, args: &[&str], env: &[(&str, &str)], log: &Path) -> Child {
    Command::new("sh")
        .args(["-c", &format!("umask {umask} && exec \"$0\" \"$@\"")])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap()])
        .args(args)
        .env_remove("SLUICE_SECRET_KEY")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// `serve` under `umask`.
async fn serve_umask(
    dir: &Path,
    mock: &MockServer,
    env: &[(&str, &str)],
    umask: &str,
) -> (Gateway, PathBuf) {
    on_a_free_port(|port| {
        let config = write_config(dir, mock, port);
        let log = dir.join(format!("gateway-{port}.log"));
        (sluice(&config, umask, &["serve"], env, &log), log)
    })
    .await
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
    for f in ["sluice.db", "sluice.db-wal", "sluice.db-shm"] {
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

/// Waits (bounded) for a process that should stop by itself; its exit status.
async fn exits(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..400 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the process did not stop by itself");
}

/// Under umask 000 (a careless unit file or container) nothing the gateway makes is open
/// to others: files 0600 — also a backup and the head's lock — and the folders it creates
/// 0700, so nobody else can swap the key file, the head or a backup for their own.
#[tokio::test]
async fn under_umask_000_files_are_0600_and_new_folders_0700() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let (_gw, log) = serve_umask(dir.path(), &mock, &[], "000").await;
    let data = dir.path().join("data");
    let backup = dir.path().join("backup");
    appears(&backup.join("audit.head")).await;
    let config = dir.path().join("sluice.toml");
    let mut cli = sluice(&config, "000", &["backup"], &[], &log.with_extension("cli"));
    assert!(exits(&mut cli).await.success());
    let copy = std::fs::read_dir(&backup)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "db"))
        .expect("a backup file");
    for f in [
        data.join("sluice.db"),
        data.join("sluice.db-wal"),
        data.join("sluice.db-shm"),
        data.join("sluice.db.key"),
        backup.join("audit.head"),
        backup.join("audit.head.lock"),
        copy,
    ] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    for d in [&data, &backup] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
}

/// A key file others could read may already have been read: the gateway does not start on
/// it (as ssh and PostgreSQL refuse their key files), and says what to do, instead of
/// tightening it and carrying on with a key that may be out.
#[tokio::test]
async fn a_key_file_readable_by_others_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    {
        let (_gw, _) = serve(dir.path(), &mock, &[]).await;
    }
    let key = dir.path().join("data/sluice.db.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = write_config(dir.path(), &mock, free_port());
    let log = dir.path().join("refused.log");
    let mut gw = sluice(&config, "022", &["serve"], &[], &log);
    assert!(!exits(&mut gw).await.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&key.display().to_string()) && text.contains("chmod 600"),
        "the error names the file and the fix: {text}"
    );
    assert_eq!(
        mode(&key),
        0o644,
        "left as found, for the operator to look at"
    );
}

/// A key file that is not 64 hex characters, or a malformed `SLUICE_SECRET_KEY`: the start
/// stops with an error naming it (and never prints what it holds).
#[tokio::test]
async fn a_malformed_key_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let config = write_config(dir.path(), &mock, free_port());
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let key = dir.path().join("data/sluice.db.key");
    std::fs::write(&key, "not-a-key-0123456789\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = dir.path().join("bad-file.log");
    let mut gw = sluice(&config, "022", &["serve"], &[], &log);
    assert!(!exits(&mut gw).await.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("64 hex characters"), "{text}");
    assert!(text.contains(&key.display().to_string()), "{text}");
    assert!(
        !text.contains("not-a-key-0123456789"),
        "the content is not printed"
    );

    std::fs::remove_file(&key).unwrap();
    let bad = "zz-secret-zz".repeat(6);
    let log = dir.path().join("bad-env.log");
    let mut gw = sluice(
        &config,
        "022",
        &["serve"],
        &[("SLUICE_SECRET_KEY", &bad)],
        &log,
    );
    assert!(!exits(&mut gw).await.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("SLUICE_SECRET_KEY must be 64 hex"), "{text}");
    assert!(!text.contains(&bad), "the value is not printed");
}

/// At the most verbose log level, through a start, sign-ins and audited actions, the
/// master key from the key file appears nowhere in the log, nor any subkey derived from it.
#[tokio::test]
async fn the_master_key_never_reaches_a_trace_log() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let (gw, log) = serve(dir.path(), &mock, &[("SLUICE_LOG", "trace")]).await;
    appears(&dir.path().join("backup/audit.head")).await;
    drop(gw);
    let key = std::fs::read_to_string(dir.path().join("data/sluice.db.key")).unwrap();
    let key = key.trim();
    assert_eq!(key.len(), 64);
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.len() > 1000, "a trace log was written");
    for piece in key.as_bytes().chunks(16) {
        let piece = std::str::from_utf8(piece).unwrap();
        assert!(!text.contains(piece), "a piece of the key is in the log");
    }
}

/// docker-compose.yml passes `SLUICE_SECRET_KEY: ${SLUICE_SECRET_KEY:-}`: unset on the host,
/// the variable is set but empty in the container. Empty means unset — the key file is
/// used — or the default deployment would not start at all.
#[tokio::test]
async fn an_empty_sluice_secret_key_means_the_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let (_gw, _) = serve(dir.path(), &mock, &[("SLUICE_SECRET_KEY", "")]).await;
    let key = dir.path().join("data/sluice.db.key");
    assert_eq!(mode(&key), 0o600);
}

/// `sluice migrate` on a fresh folder (creates the database and the key file); waits for it.
async fn first_start(dir: &Path, mock: &MockServer) -> PathBuf {
    let config = write_config(dir, mock, free_port());
    let log = dir.join("migrate.log");
    let mut first = sluice(&config, "022", &["migrate"], &[], &log);
    assert!(
        exits(&mut first).await.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    config
}

/// `sluice serve` is refused at start; its standard error.
async fn refused(config: &Path, dir: &Path, name: &str) -> String {
    let log = dir.join(name);
    let mut gw = sluice(config, "022", &["serve"], &[], &log);
    assert!(!exits(&mut gw).await.success(), "the gateway started");
    std::fs::read_to_string(&log).unwrap()
}

/// A key file with a second name (a hard link) is refused: whoever made the other name can
/// reach the key through it — a link placed in a folder of theirs survives a `chmod` of
/// ours, and a key file put in place as a link to a file of theirs is a key they know.
#[tokio::test]
async fn a_hard_linked_key_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let config = first_start(dir.path(), &mock).await;
    let key = dir.path().join("data/sluice.db.key");
    assert_eq!(
        std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(&key).unwrap()),
        1,
        "one name after the first start"
    );
    // Someone adds a name of their own for it.
    let other = dir.path().join("elsewhere.key");
    std::fs::hard_link(&key, &other).unwrap();
    let text = refused(&config, dir.path(), "linked.log").await;
    assert!(
        text.contains(&key.display().to_string()) && text.contains("hard link"),
        "the error names the file and the problem: {text}"
    );
    // A key file put in place before the first start as a link to someone's own file.
    std::fs::remove_file(&key).unwrap();
    std::fs::remove_file(&other).unwrap();
    let theirs = dir.path().join("theirs.key");
    std::fs::write(&theirs, "ab".repeat(32)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&theirs, &key).unwrap();
    let text = refused(&config, dir.path(), "planted.log").await;
    assert!(text.contains("hard link"), "{text}");
    assert!(!text.contains(&"ab".repeat(32)), "the key is not printed");
}

/// A key file that belongs to another user is refused: they placed it (a key they know) or
/// can read it. Needs root to give a file away; elsewhere the test says so and stops.
#[tokio::test]
async fn a_key_file_owned_by_another_user_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let config = first_start(dir.path(), &mock).await;
    let key = dir.path().join("data/sluice.db.key");
    if let Err(e) = std::os::unix::fs::chown(&key, Some(65534), None) {
        eprintln!("SKIPPED: giving the key file to another user needs root ({e})");
        return;
    }
    let text = refused(&config, dir.path(), "owner.log").await;
    assert!(
        text.contains(&key.display().to_string()) && text.contains("belongs to user 65534"),
        "the error names the file and its owner: {text}"
    );
}

/// The key file is durable once made: its folder is fsynced right after the file's name is
/// published (and a folder made for it, in its parent), or a power cut after the first
/// start could lose the name while the database — signed with the key — survives. Shown by
/// the system calls of a real first start (`strace -y` names each descriptor): the very next
/// file-system call of the thread that published the key syncs its folder.
#[tokio::test]
async fn the_key_files_folder_is_synced_after_the_key_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let config = write_config(dir.path(), &mock, free_port());
    let trace = dir.path().join("trace.txt");
    let status = Command::new("strace")
        .args(["-f", "-y", "-qq", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=fsync,fdatasync,rename,renameat,renameat2,link,linkat,mkdir,mkdirat,unlink,unlinkat",
        ])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "migrate"])
        .env_remove("SLUICE_SECRET_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("strace runs (scripts/test-deps.sh installs it)");
    assert!(status.success());
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The next traced call of the thread (strace -f starts each line with its id) after
    // line `at`.
    let next_of_thread = |at: usize| {
        let pid = lines[at].split_whitespace().next().unwrap();
        lines[at + 1..]
            .iter()
            .find(|l| l.split_whitespace().next() == Some(pid))
            .copied()
            .unwrap_or("")
    };
    let data = dir.path().join("data");
    let published = lines
        .iter()
        .position(|l| {
            (l.contains("rename") || l.contains("link(") || l.contains("linkat("))
                && l.contains("sluice.db.key\"")
                && l.ends_with("= 0")
        })
        .unwrap_or_else(|| panic!("the key file was never published:\n{text}"));
    let next = next_of_thread(published);
    assert!(
        next.contains("fsync(") && next.contains(&format!("<{}>)", data.display())),
        "after publishing the key file its thread did `{next}`, not an fsync of {}:\n{text}",
        data.display()
    );
    // The folder made for the database and the key, in its parent.
    let made = lines
        .iter()
        .position(|l| l.contains("mkdir") && l.contains(&format!("{}\"", data.display())))
        .unwrap_or_else(|| panic!("the data folder was not made:\n{text}"));
    let next = next_of_thread(made);
    assert!(
        next.contains("fsync(") && next.contains(&format!("<{}>)", dir.path().display())),
        "after making {} its thread did `{next}`, not an fsync of its parent:\n{text}",
        data.display()
    );
}

/// The lines of the block `key:` at `indent` spaces in a compose file (its own indented
/// lines, comments left out).
fn compose_block<'a>(lines: &[&'a str], indent: usize, key: &str) -> Vec<&'a str> {
    let head = format!("{}{key}:", " ".repeat(indent));
    let Some(start) = lines.iter().position(|l| l.trim_end() == head) else {
        panic!("no `{key}:` at indent {indent}");
    };
    lines[start + 1..]
        .iter()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .take_while(|l| l.len() - l.trim_start().len() > indent)
        .copied()
        .collect()
}

/// docker-compose.cluster.yml: each gateway keeps its audit head across a re-creation of
/// its container — a fixed host name (the head is named after it and its folder) and a
/// named volume of its own at `SLUICE_BACKUP_DIR`. Without them every `docker compose up`
/// after a rebuild or a config change started a fresh head over whatever the database held
/// then, rows deleted meanwhile included, with the old head and its evidence gone (s30
/// multi-host attack F2).
#[test]
fn the_cluster_compose_keeps_each_gateways_audit_head() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker-compose.cluster.yml"
    ))
    .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The folder as the compose file sets it, or else as the image does.
    let image =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    let dir = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("SLUICE_BACKUP_DIR:"))
        .or_else(|| {
            image
                .lines()
                .find_map(|l| l.trim().strip_prefix("SLUICE_BACKUP_DIR="))
        })
        .expect("SLUICE_BACKUP_DIR set for the gateways")
        .trim();
    let declared: Vec<&str> = compose_block(&lines, 0, "volumes")
        .iter()
        .map(|l| l.trim().trim_end_matches(':'))
        .collect();
    let services = compose_block(&lines, 0, "services");
    let mut seen = Vec::new();
    for gateway in ["sluice-a", "sluice-b"] {
        let block = compose_block(&services, 2, gateway);
        assert!(
            block.iter().any(|l| l.trim() == "<<: *sluice"),
            "{gateway} is a gateway"
        );
        assert!(
            block
                .iter()
                .any(|l| l.trim() == format!("hostname: {gateway}")),
            "{gateway} has no fixed host name"
        );
        let volumes = compose_block(&block, 4, "volumes");
        let mounts: Vec<&str> = volumes
            .iter()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .collect();
        // `volumes` replaces the anchor's list: the config must be mounted again.
        assert!(
            mounts.contains(&"./sluice.toml:/etc/sluice/sluice.toml:ro"),
            "{gateway} lost its config: {mounts:?}"
        );
        let backup = mounts
            .iter()
            .find_map(|m| m.strip_suffix(&format!(":{dir}")))
            .unwrap_or_else(|| panic!("{gateway} mounts nothing at {dir}: {mounts:?}"));
        assert!(
            declared.contains(&backup),
            "{gateway}'s {backup} is not a named volume: {declared:?}"
        );
        assert!(!seen.contains(&backup), "{backup} is shared");
        seen.push(backup);
    }
}

/// The image's build stage copies every part of the tree `cargo build --release` reads: a
/// part left out either fails the build or — `build.rs`, which Cargo runs only when it is
/// there — builds a different binary than the tree does silently (the image's was linked
/// without packed relocations, s35 diff attack M1).
#[test]
fn the_images_build_stage_copies_everything_the_build_reads() {
    let root = env!("CARGO_MANIFEST_DIR");
    let image = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    // What comes before the first `FROM` is comments; the build stage is the first one.
    let build_stage = image.split("\nFROM ").nth(1).expect("a build stage");
    let copied: Vec<&str> = build_stage
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY "))
        .flat_map(|args| {
            let words: Vec<&str> = args.split_whitespace().collect();
            // Every word but the destination is a source.
            words[..words.len().saturating_sub(1)].to_vec()
        })
        .collect();
    let mut read = vec![
        "Cargo.toml",
        "Cargo.lock",
        "src",
        "migrations",
        "templates",
        "static",
    ];
    if std::path::Path::new(&format!("{root}/build.rs")).exists() {
        read.push("build.rs");
    }
    // The order `build.rs` has the linker lay the code out in.
    if std::path::Path::new(&format!("{root}/link/code-order.txt")).exists() {
        read.push("link");
    }
    // Cargo's own configuration: the flags that keep that order's names stable.
    if std::path::Path::new(&format!("{root}/.cargo/config.toml")).exists() {
        read.push(".cargo");
    }
    for part in read {
        assert!(
            copied.contains(&part),
            "the Dockerfile's build stage does not copy {part}: {copied:?}"
        );
    }
}

/// Built on glibc 2.36 or later for this machine, the gateway's binary carries its relative
/// relocations packed (`build.rs`; DT_RELR, a 1 MB table less at every start: issue 21
/// item 2), and it starts (the test suite runs it throughout).
#[test]
fn the_binary_is_linked_with_packed_relocations_where_glibc_runs_them() {
    let glibc = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let version: Vec<u32> = glibc
        .strip_prefix("glibc ")
        .unwrap_or("0.0")
        .split('.')
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    if !cfg!(all(target_os = "linux", target_env = "gnu")) || version[..] < [2, 36][..] {
        return;
    }
    let dynamic = std::process::Command::new("readelf")
        .args(["--dynamic", env!("CARGO_BIN_EXE_sluice")])
        .output()
        .expect("readelf (binutils) runs");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic.contains("(RELR)"),
        "no DT_RELR in the gateway's binary on {glibc}:\n{dynamic}"
    );
}

/// The list the linker gets (`build.rs`, `OUT_DIR/code-order.txt`) is `link/code-order.txt`
/// with each function ThinLTO exported also under every codegen unit's number and bare, in
/// the list's order — the forms `bench/overhead.py` counts a binary's names by
/// (`linked_forms`): the two agree name for name, and the list has exported names to expand.
#[test]
fn the_linkers_list_is_the_code_order_under_every_codegen_unit() {
    let Some(linked) = option_env!("SLUICE_CODE_ORDER") else {
        return;
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let listed = std::fs::read_to_string(format!("{root}/link/code-order.txt")).unwrap();
    let exported = listed.lines().filter(|n| n.contains(".llvm.")).count();
    assert!(exported >= 100, "{exported} exported names in the list");
    let expected = std::process::Command::new("python3")
        .current_dir(format!("{root}/bench"))
        .args([
            "-c",
            "import overhead, sys\n\
             seen = set()\n\
             for name in open(sys.argv[1]).read().split():\n\
             \x20   for form in overhead.linked_forms(name):\n\
             \x20       if form not in seen:\n\
             \x20           seen.add(form)\n\
             \x20           print(form)\n",
        ])
        .arg(format!("{root}/link/code-order.txt"))
        .output()
        .expect("python3 runs");
    assert!(expected.status.success(), "{expected:?}");
    let linked = std::fs::read_to_string(linked).unwrap();
    let expected = String::from_utf8(expected.stdout).unwrap();
    assert!(linked.lines().count() > listed.lines().count() + 9 * exported);
    assert_eq!(linked, expected);
}

/// Where its linker reads a symbol ordering file (`build.rs` probes it: LLD, the default of
/// rustup's `x86_64-unknown-linux-gnu` toolchains), the gateway's binary lays its code out
/// in the order of `link/code-order.txt`: the functions a gateway runs together at the
/// start of its code, so that the pages start-up and the request path touch are few (issue
/// 21 item 2, idle RSS 27 → 18 MB). The test binary is a debug build, whose Rust functions
/// are named apart from the release build's the list was made from; SQLite's C functions
/// are named alike in both. Names that share an address (a C compiler's folded twins) are
/// left out (the linker places their one section by the first of them), and so are names two
/// functions have.
///
/// Where the binary is linked by LLD and the build left the list out, it fails: build.rs's
/// probe failed for another reason than the linker (a relative path in the flags, run from
/// another folder than the build's), and the test returned early — the order and the test
/// meant to notice its loss both gone, with a warning only (s42 final attack F3).
#[test]
fn the_binarys_code_is_laid_out_in_the_order_of_the_list() {
    let Some(list) = option_env!("SLUICE_CODE_ORDER") else {
        // With the list in the checkout, on Linux (an ELF binary).
        let listed = concat!(env!("CARGO_MANIFEST_DIR"), "/link/code-order.txt");
        if !cfg!(target_os = "linux") || !std::path::Path::new(listed).exists() {
            return;
        }
        // Without binutils there is no telling the linker: as before, nothing to check.
        let Ok(comment) = std::process::Command::new("readelf")
            .args(["--string-dump=.comment", env!("CARGO_BIN_EXE_sluice")])
            .output()
        else {
            return;
        };
        assert!(
            !String::from_utf8_lossy(&comment.stdout).contains("Linker: LLD"),
            "linked by LLD, which reads the list, yet the build left it out: see build.rs's \
             cargo warning"
        );
        return;
    };
    let order = std::fs::read_to_string(list).unwrap();
    let symbols = std::process::Command::new("nm")
        .args(["--defined-only", env!("CARGO_BIN_EXE_sluice")])
        .output()
        .expect("nm (binutils) runs");
    let symbols = String::from_utf8_lossy(&symbols.stdout);
    // A name given to functions of two objects (C's `static` ones) has no one place.
    let mut address = std::collections::HashMap::new();
    for line in symbols.lines() {
        let mut words = line.split_whitespace();
        if let (Some(at), Some("t" | "T"), Some(name)) = (words.next(), words.next(), words.next())
        {
            let at = u64::from_str_radix(at, 16).unwrap();
            address
                .entry(name)
                .and_modify(|a: &mut Option<u64>| *a = None)
                .or_insert(Some(at));
        }
    }
    let listed: Vec<(&str, u64)> = order
        .lines()
        .filter_map(|name| address.get(name).copied().flatten().map(|at| (name, at)))
        .collect();
    let mut names_at = std::collections::HashMap::<u64, usize>::new();
    for (_, at) in &listed {
        *names_at.entry(*at).or_default() += 1;
    }
    let laid: Vec<(&str, u64)> = listed
        .into_iter()
        .filter(|(_, at)| names_at[at] == 1)
        .collect();
    assert!(
        laid.len() >= 100,
        "only {} of the list's functions are in the binary",
        laid.len()
    );
    for pair in laid.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "{} at {:#x} before {} at {:#x}: the code is not in the list's order",
            pair[1].0,
            pair[1].1,
            pair[0].0,
            pair[0].1
        );
    }
}

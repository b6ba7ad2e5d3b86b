//! A real PostgreSQL server for the tests (issue 17): `initdb` into a temporary folder and
//! `postgres` on a free port, started by the test binary itself.
//!
//! - PostgreSQL refuses to run as root, and CI runs as root: then the server runs as the
//!   `postgres` user (the Debian package creates it), its folder owned by that user.
//! - The servers die with the test binary: each is spawned with `PR_SET_PDEATHSIG`
//!   (SIGQUIT, PostgreSQL's immediate shutdown, which also ends its backends). That signal
//!   follows the death of the spawning *thread*, so every server is spawned by one thread
//!   that lives as long as the process. Folders left by an earlier run whose process is gone
//!   are removed at the next start.
//! - `shared()` is one server for the whole binary; each test takes a database of its own
//!   (`database()`). A test that stops or restarts its server starts one of its own
//!   (`PgServer::start`).
//! - The binaries: `postgres`/`initdb` on PATH, else Debian's `/usr/lib/postgresql/<v>/bin`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::gateway_proc::free_port;

/// One PostgreSQL server of this test binary.
pub struct PgServer {
    pub port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    /// `fsync` on (the defaults): for the benchmarks' durable figures.
    durable: bool,
}

/// What the spawning thread is asked to run.
type Spawn = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread every server is spawned from (see the module doc): it lives until the
/// process exits.
fn spawner() -> &'static Mutex<mpsc::Sender<Spawn>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Spawn>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Spawn>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
            // Every sender is gone only at exit; keep the thread (and so the servers) alive.
            loop {
                std::thread::park();
            }
        });
        Mutex::new(tx)
    })
}

fn spawn_lasting(cmd: Command) -> Child {
    let (reply, answer) = mpsc::channel();
    spawner().lock().unwrap().send((cmd, reply)).unwrap();
    answer.recv().unwrap().expect("postgres starts")
}

fn bin_dir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("postgres").exists() {
            return dir;
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, p)| p.join("postgres").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .expect("PostgreSQL is installed (scripts/test-deps.sh installs Debian's postgresql)")
}

fn is_root() -> bool {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() == 0 }
}

/// The `postgres` user's uid and gid, when the tests run as root.
fn postgres_user() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam returns NULL or a pointer to a static record, read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root needs the `postgres` user (Debian's postgresql package creates it)"
    );
    // SAFETY: checked non-null above.
    unsafe { Some(((*pw).pw_uid, (*pw).pw_gid)) }
}

fn command(program: &Path, die_with_parent: bool) -> Command {
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = postgres_user() {
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp");
    }
    if die_with_parent {
        // SAFETY: only prctl runs between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Removes folders of earlier test runs whose process is gone.
fn remove_stale(base: &Path) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("sluice-pg-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl PgServer {
    /// A new server of this test's own, ready for connections.
    pub fn start() -> PgServer {
        PgServer::start_with(false)
    }

    /// A new server with PostgreSQL's durable defaults (`fsync`, `synchronous_commit` and
    /// `full_page_writes` on): what the benchmarks measure.
    pub fn start_durable() -> PgServer {
        PgServer::start_with(true)
    }

    fn start_with(durable: bool) -> PgServer {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        remove_stale(&base);
        let dir = base.join(format!(
            "sluice-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = postgres_user() {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let bin = bin_dir();
        let data = dir.join("data");
        let out = command(&bin.join("initdb"), false)
            .args(["-D", data.to_str().unwrap()])
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let server = PgServer {
            port: free_port(),
            dir,
            child: Mutex::new(None),
            durable,
        };
        server.run();
        server
    }

    /// Starts the server process (again) on its folder and port; returns once it accepts
    /// connections.
    pub fn run(&self) {
        let bin = bin_dir();
        let data = self.dir.join("data");
        let log = std::fs::File::create(self.dir.join(format!("log-{}", self.port))).unwrap();
        if let Some((uid, gid)) = postgres_user() {
            let _ = std::os::unix::fs::chown(
                self.dir.join(format!("log-{}", self.port)),
                Some(uid),
                Some(gid),
            );
        }
        let mut cmd = command(&bin.join("postgres"), true);
        cmd.args(["-D", data.to_str().unwrap()])
            .args(["-p", &self.port.to_string()])
            .args(["-k", self.dir.to_str().unwrap()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "max_connections=400"])
            .args(["-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if !self.durable {
            // Test data is thrown away: durability to the disk is not what these tests are
            // about (the gateway's own crash tests kill the gateway, not the server).
            cmd.args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]);
        }
        *self.child.lock().unwrap() = Some(spawn_lasting(cmd));
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new("psql")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .args(["-d", "postgres", "-tAc", "SELECT 1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            if let Some(status) = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("postgres exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < until,
                "postgres never accepted connections: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: connections are cut), keeping its data.
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            let _ = child.wait();
        }
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("log-{}", self.port))).unwrap_or_default()
    }

    /// Waits, right after this server started, until it has been up longer than the
    /// store's stale-owner window (`store::processes::STALE_AFTER`). The whole window: the
    /// server's own start time is a little before `start` returned, never after.
    pub fn wait_past_the_stale_window(&self) {
        let window = sluice::store::processes::STALE_AFTER.to_std().unwrap();
        std::thread::sleep(window + Duration::from_secs(1));
    }

    /// A new, empty database on this server; returns its URL.
    pub fn database(&self) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc"])
            .arg(format!("CREATE DATABASE {name}"))
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "CREATE DATABASE: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The binary's shared server (started at first use), handed out once it has been up for
/// the stale-owner window: until then the store takes no process for gone (a beat counts as
/// no older than the server's start: `pg::processes::dead_owners`), and tests that age a
/// heartbeat by hand expect its owner gone at once.
pub fn shared() -> &'static PgServer {
    static SHARED: OnceLock<PgServer> = OnceLock::new();
    SHARED.get_or_init(|| {
        let server = PgServer::start();
        server.wait_past_the_stale_window();
        server
    })
}

/// A new, empty database on the shared server.
pub fn database() -> String {
    shared().database()
}

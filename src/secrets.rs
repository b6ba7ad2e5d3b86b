//! The gateway's master key: 32 random bytes from `SLUICE_SECRET_KEY` (64 hex characters),
//! else from a key file beside the database (`<database file>.key`, mode 0600), created at
//! the first start; a key file open to others, with a second name (hard link), or owned by
//! another user stops the start. Nothing uses the master key itself: each purpose derives its own subkey
//! with HKDF-SHA256 under a label (`subkey`), so a key for one purpose (the audit chain,
//! later the encryption of upstream keys) says nothing about another.
//!
//! The key is never logged, printed or stored in the database; its `Debug` shows nothing,
//! and its bytes are wiped when dropped (`secrecy`).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hkdf::Hkdf;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox};
use sha2::Sha256;

pub mod seal;

/// The environment variable that carries the master key (it wins over the key file).
pub const ENV: &str = "SLUICE_SECRET_KEY";
/// The environment variable that carries the new master key of `sluice secrets rotate`
/// (or its `--new-key-file`).
pub const NEW_ENV: &str = "SLUICE_NEW_SECRET_KEY";
const LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{ENV} must be 64 hex characters (32 bytes), e.g. from `openssl rand -hex 32`")]
    BadEnv,
    #[error("the key file {0} does not hold 64 hex characters (32 bytes)")]
    BadFile(PathBuf),
    #[error("the key file {0} is open to others (mode {1:o}); `chmod 600` it, and if anyone else could have read it, treat the key as leaked")]
    Exposed(PathBuf, u32),
    #[error("the key file {0} has {1} names (hard links): whoever made another name can reach the key through it, or put the file there; find them with `find / -xdev -samefile {0}`, remove them, and if the file was not yours or anyone else could have read it, treat the key as leaked")]
    Linked(PathBuf, u64),
    #[error("the key file {0} belongs to user {1}, not to the user the gateway runs as ({2}): someone else put it there or can read it; if it is yours, `chown` it, else treat the key as leaked")]
    NotOwned(PathBuf, u32, u32),
    #[error("the key file {0} is not a regular file (a FIFO, device or folder was put under its name); remove it, and find out who could write its folder")]
    NotAFile(PathBuf),
    #[error("key file {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("on PostgreSQL every gateway must hold the same master key (it keys the audit chain all hosts append to): set {ENV} to 64 hex digits (`openssl rand -hex 32`), or put them in a 0600 file named by `[database] key_file`, the same on every host")]
    SharedKeyRequired,
    #[error("the master key this gateway holds did not sign the audit chain of this PostgreSQL database: every host must hold the key the others hold (`{ENV}` or `[database] key_file`); a host with another key would append rows no other host can verify. If every host's key is right, the log was rewritten: look into it with the right key's `sluice audit verify`")]
    SharedKeyMismatch,
    #[error("the master key does not open the stored upstream keys: {0}. Start with the key the database was sealed under ({ENV} or the key file); after `sluice secrets rotate`, with the new one")]
    SealedUnderAnotherKey(String),
    #[error("give the new master key either in {NEW_ENV} (64 hex characters) or as `--new-key-file FILE` (a 0600 file of 64 hex characters, `openssl rand -hex 32 > FILE; chmod 600 FILE`), not both")]
    NewKeySource,
    #[error("the new master key is the current one: nothing would change")]
    SameKey,
    #[error("the key file {0} named by `[database] key_file` does not exist: create it once (`openssl rand -hex 32 > FILE; chmod 600 FILE`) and give every gateway host the same file")]
    SharedKeyMissing(PathBuf),
}

/// 32 bytes, wiped on drop.
pub struct MasterKey(SecretBox<[u8; LEN]>);

/// A purpose-specific key derived from the master key.
pub struct Subkey(SecretBox<[u8; LEN]>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl std::fmt::Debug for Subkey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Subkey(..)")
    }
}

impl Subkey {
    pub fn bytes(&self) -> &[u8] {
        self.0.expose_secret()
    }
}

/// Where the key file of the database at `db` lives: beside it, `<file name>.key`.
pub fn key_file_for(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".key");
    db.with_file_name(name)
}

/// Gives the written key file `tmp` its name `path` unless another process was first (two
/// starting at once then agree on that one): a rename that never replaces
/// (`RENAME_NOREPLACE`), so the key file never has a second name, not even for a moment —
/// a reader refuses one. File systems without it (`EINVAL`) get a hard link, which fails
/// the same way; the temporary name is removed right after (`publish_file`).
fn publish_once(tmp: &Path, path: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    use rustix::io::Errno;
    let done = match renameat_with(CWD, tmp, CWD, path, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL | Errno::NOSYS) => std::fs::hard_link(tmp, path),
        other => other.map_err(std::io::Error::from),
    };
    match done {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn parse_hex(text: &str) -> Option<[u8; LEN]> {
    let mut out = [0u8; LEN];
    hex::decode_to_slice(text.trim(), &mut out).ok()?;
    Some(out)
}

impl MasterKey {
    /// The key from `SLUICE_SECRET_KEY` when set, else from the key file of the database at
    /// `db` (created when missing). Set but empty counts as unset: docker-compose.yml passes
    /// `${SLUICE_SECRET_KEY:-}`, which is empty in the container when the host has none.
    pub fn for_database(db: &Path) -> Result<MasterKey, SecretError> {
        match std::env::var(ENV) {
            Ok(v) if v.trim().is_empty() => MasterKey::load_or_create(&key_file_for(db)),
            Ok(v) => MasterKey::from_hex(&v).ok_or(SecretError::BadEnv),
            Err(std::env::VarError::NotPresent) => MasterKey::load_or_create(&key_file_for(db)),
            Err(std::env::VarError::NotUnicode(_)) => Err(SecretError::BadEnv),
        }
    }

    /// The key of a database several hosts share (PostgreSQL): from `SLUICE_SECRET_KEY`,
    /// else from `key_file` — which must exist (with the same checks as a SQLite key file):
    /// a key made up here would differ from the other hosts'.
    pub fn for_shared_database(key_file: Option<&Path>) -> Result<MasterKey, SecretError> {
        match std::env::var(ENV) {
            Ok(v) if !v.trim().is_empty() => MasterKey::from_hex(&v).ok_or(SecretError::BadEnv),
            Err(std::env::VarError::NotUnicode(_)) => Err(SecretError::BadEnv),
            _ => match key_file {
                Some(path) if path.exists() => MasterKey::load_or_create(path),
                Some(path) => Err(SecretError::SharedKeyMissing(path.to_path_buf())),
                None => Err(SecretError::SharedKeyRequired),
            },
        }
    }

    /// The new key of `sluice secrets rotate`: from `file` (which must exist, with the
    /// checks of every key file) or from `SLUICE_NEW_SECRET_KEY` — exactly one of them.
    pub fn new_for_rotation(file: Option<&Path>) -> Result<MasterKey, SecretError> {
        let env = std::env::var(NEW_ENV).ok().filter(|v| !v.trim().is_empty());
        match (file, env) {
            (Some(path), None) if !path.exists() => Err(SecretError::Io(
                path.to_path_buf(),
                std::io::ErrorKind::NotFound.into(),
            )),
            (Some(path), None) => MasterKey::load_or_create(path),
            (None, Some(v)) => MasterKey::from_hex(&v).ok_or(SecretError::BadEnv),
            _ => Err(SecretError::NewKeySource),
        }
    }

    /// Whether `other` is this very key (compared through a subkey, never the key itself).
    pub fn same_as(&self, other: &MasterKey) -> bool {
        const PROBE: &str = "sluice/same-key-probe/v1";
        self.subkey(PROBE).bytes() == other.subkey(PROBE).bytes()
    }

    pub fn from_hex(text: &str) -> Option<MasterKey> {
        parse_hex(text).map(|k| MasterKey(SecretBox::new(Box::new(k))))
    }

    /// Reads the key file at `path`, or creates it (mode 0600) with a fresh random key. Two
    /// processes starting at once agree on one key: the file is written under a temporary
    /// name and published by a rename that fails if the other was first (`publish_once`).
    /// A key file that is not ours alone stops the start: another owner, a second name, or
    /// any permission for others.
    pub fn load_or_create(path: &Path) -> Result<MasterKey, SecretError> {
        let io = |e| SecretError::Io(path.to_path_buf(), e);
        if !path.exists() {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                crate::private_fs::create_dir_all(dir).map_err(io)?;
            }
            let mut key = [0u8; LEN];
            rand::rngs::OsRng.fill_bytes(&mut key);
            let tmp = path.with_extension(format!("key.{}.tmp", uuid::Uuid::new_v4().simple()));
            let mut text = hex::encode(key);
            text.push('\n');
            key.fill(0);
            let written = crate::private_fs::publish_file(&tmp, text.as_bytes(), |tmp| {
                publish_once(tmp, path)
            });
            written.map_err(io)?;
        }
        // The checks are made on the file opened, so what is checked is what is read.
        // Non-blocking: opening a FIFO planted under the name would otherwise wait for a
        // writer for ever, and the start would hang saying nothing.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(SecretError::NotAFile(path.to_path_buf()));
        }
        let me = rustix::process::geteuid().as_raw();
        if meta.uid() != me {
            return Err(SecretError::NotOwned(path.to_path_buf(), meta.uid(), me));
        }
        if meta.nlink() > 1 {
            return Err(SecretError::Linked(path.to_path_buf(), meta.nlink()));
        }
        // Others could have read it already: tightening it quietly would carry on with a
        // key that may be out. Stop, as ssh and PostgreSQL do with their key files.
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::Exposed(path.to_path_buf(), mode & 0o777));
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io)?;
        MasterKey::from_hex(&text).ok_or_else(|| SecretError::BadFile(path.to_path_buf()))
    }

    /// The subkey for one purpose: HKDF-SHA256 (RFC 5869) of the master key, with `label`
    /// as its info. Labels are fixed strings naming the purpose and its version.
    #[allow(clippy::expect_used)]
    pub fn subkey(&self, label: &str) -> Subkey {
        let mut out = Box::new([0u8; LEN]);
        Hkdf::<Sha256>::new(None, self.0.expose_secret())
            .expand(label.as_bytes(), out.as_mut())
            // cannot fail: HKDF-SHA256 refuses only outputs over 255 × 32 bytes; this one is
            // a fixed 32, independent of any input.
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        Subkey(SecretBox::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key file that is a FIFO (or any non-file) used to hang the start in `open`, with
    /// nothing said: whoever can write the folder could stop the gateway silently.
    #[test]
    fn a_key_file_that_is_not_a_regular_file_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.db.key");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(MasterKey::load_or_create(&p).map(|_| ())));
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("loading a FIFO as the key file hung");
        let err = got.expect_err("a FIFO is no key file").to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_key_file_is_created_0600_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/sluice.db.key");
        let a = MasterKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = MasterKey::load_or_create(&path).unwrap();
        assert_eq!(a.subkey("x").bytes(), b.subkey("x").bytes());
        assert_ne!(a.subkey("x").bytes(), a.subkey("y").bytes());
        assert_ne!(a.subkey("x").bytes(), a.0.expose_secret());
        assert_eq!(format!("{a:?}"), "MasterKey(..)");
    }

    #[test]
    fn a_bad_key_is_refused() {
        assert!(MasterKey::from_hex("abc").is_none());
        assert!(MasterKey::from_hex(&"zz".repeat(32)).is_none());
        assert!(MasterKey::from_hex(&"ab".repeat(32)).is_some());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "ab".repeat(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            MasterKey::load_or_create(&path),
            Err(SecretError::Exposed(_, 0o644))
        ));
        std::fs::write(&path, "short").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            MasterKey::load_or_create(&path),
            Err(SecretError::BadFile(_))
        ));
    }

    #[test]
    fn processes_starting_at_once_agree_on_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/sluice.db.key");
        let keys: Vec<Vec<u8>> = std::thread::scope(|s| {
            let started: Vec<_> = (0..8)
                .map(|_| s.spawn(|| MasterKey::load_or_create(&path).unwrap()))
                .collect();
            started
                .into_iter()
                .map(|h| h.join().unwrap().subkey("x").bytes().to_vec())
                .collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "one key for all");
        // No temporary file is left behind, and the folder made for it is 0700.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("data"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("sluice.db.key")]);
        let mode = std::fs::metadata(dir.path().join("data"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn the_key_file_sits_beside_the_database() {
        assert_eq!(
            key_file_for(Path::new("data/sluice.db")),
            PathBuf::from("data/sluice.db.key")
        );
    }
}

//! Folders and files the gateway creates for itself: folders (the database's, the backup
//! folder) mode 0700 from the start, whatever the umask, so nobody else can list them or
//! put a file of their own in them (a key file, a head or a backup swapped for another); a
//! folder that already exists is left as it is: the operator chose it. Small files (the key
//! file, the audit head) mode 0600 from the start, written whole before anyone can see them.
//! Durable: a file is synced before its name is published, and the folder after, so a power
//! cut leaves the old name or the new one; a new folder is synced into its parent.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// `create_dir_all`, each folder it creates 0700 and synced into its parent.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    for made in missing.iter().rev() {
        sync_dir(parent_of(made))?;
    }
    Ok(())
}

/// The folder `path` is named in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Takes the exclusive advisory lock of `path` (created 0600 if missing), waiting up to
/// `max_wait` for another holder — another process too — to let go; held until the file
/// returned is dropped. Waited for without blocking a thread: a blocking wait on a lock a
/// hung process or an operator's `flock` holds cannot be cancelled, and the runtime waits
/// for its blocking threads at exit, so the gateway could not stop.
pub async fn lock(path: &Path, max_wait: std::time::Duration) -> io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)?;
    let waited = std::time::Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if waited.elapsed() < max_wait => {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} held by another process for {} s",
                        path.display(),
                        max_wait.as_secs()
                    ),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Syncs a folder, making the names created, renamed or removed in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `bytes` to the new file `tmp` (mode 0600; an existing file there is an error, not
/// opened), syncs it, then hands its path to `publish` (a rename over the old file, or one
/// that fails if another process published first), then syncs the folder so the new name
/// survives a power cut. `tmp` is removed after, in every case: a crash or an error leaves
/// the old file or the new one, never a torn one.
pub fn publish_file(
    tmp: &Path,
    bytes: &[u8],
    publish: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        publish(tmp)?;
        sync_dir(parent_of(tmp))
    })();
    // After a rename there is nothing left to remove.
    let _ = std::fs::remove_file(tmp);
    written
}

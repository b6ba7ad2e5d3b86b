//! Folders and files the gateway creates for itself: folders (the database's, the backup
//! folder) mode 0700 from the start, whatever the umask, so nobody else can list them or
//! put a file of their own in them (a key file, a head or a backup swapped for another); a
//! folder that already exists is left as it is: the operator chose it. Small files (the key
//! file, the audit head) mode 0600 from the start, written whole before anyone can see them.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// `create_dir_all`, each folder it creates 0700.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to the new file `tmp` (mode 0600; an existing file there is an error, not
/// opened), syncs it, then hands its path to `publish` (a rename over the old file, or a
/// hard link that fails if another process published first). `tmp` is removed after, in
/// every case: a crash or an error leaves the old file or the new one, never a torn one.
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
        publish(tmp)
    })();
    // After a rename there is nothing left to remove.
    let _ = std::fs::remove_file(tmp);
    written
}

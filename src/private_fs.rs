//! Folders the gateway creates for its own files (the database's, the backup folder): mode
//! 0700 from the start, whatever the umask, so nobody else can list them or put a file of
//! their own in them (a key file, a head or a backup swapped for another). A folder that
//! already exists is left as it is: the operator chose it.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// `create_dir_all`, each folder it creates 0700.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

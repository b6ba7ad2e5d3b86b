//! The request path's own SQLite readers (`raw::Reader`): a few read-only connections
//! reused on the callers' threads, opened when first needed.

use std::path::PathBuf;

use parking_lot::Mutex;

use super::raw::{Conn, Reader};
use super::Result;

/// Connections kept for reuse; more may be open at a moment (one per concurrent caller),
/// the rest are closed when their read ends.
const KEPT: usize = 4;

pub struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Reader>>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers").field("path", &self.path).finish()
    }
}

impl Readers {
    pub fn new(path: PathBuf) -> Readers {
        Readers {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on an idle reader, or a new one. A reader whose read failed is closed,
    /// not kept: whatever state the failure left it in goes with it.
    pub fn read<T>(&self, read: impl FnOnce(&mut Conn<'_>) -> Result<T>) -> Result<T> {
        let idle = self.idle.lock().pop();
        let mut reader = match idle {
            Some(r) => r,
            None => Reader::open(&self.path)?,
        };
        let out = read(&mut reader.conn())?;
        let mut idle = self.idle.lock();
        if idle.len() < KEPT {
            idle.push(reader);
        }
        Ok(out)
    }
}

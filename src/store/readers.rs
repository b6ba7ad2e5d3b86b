//! The request path's own SQLite readers (`raw::Reader`): a few read-only connections,
//! reused, opened when first needed, with the pools' busy timeout. Callers run them on a
//! blocking thread (`store::cache::budget_remaining`).

use std::path::PathBuf;

use parking_lot::Mutex;

use super::raw::{Conn, Reader};
use super::{Result, StoreError};

/// Connections kept for reuse; more may be open at a moment (one per concurrent caller),
/// the others are closed when their read ends.
const KEPT: usize = 4;

pub struct Readers {
    path: PathBuf,
    /// The idle readers; `None` once the database is closed (`close`).
    idle: Mutex<Option<Vec<Reader>>>,
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
            idle: Mutex::new(Some(Vec::new())),
        }
    }

    /// Runs `read` on an idle reader, or a new one. A reader whose read failed is closed,
    /// not kept: whatever state the failure left it in goes with it. After `close`, every
    /// read fails, as the pools' do. How many run at once is the caller's to bound
    /// (`store::cache::budget_remaining`).
    pub fn read<T>(&self, read: impl FnOnce(&mut Conn<'_>) -> Result<T>) -> Result<T> {
        // A new reader is opened under the lock: one opened after `close` took the idle
        // ones would outlive the pools (s41 final attack F2).
        let mut reader = match self.idle.lock().as_mut() {
            None => return Err(StoreError::Sql(sqlx::Error::PoolClosed)),
            Some(idle) => match idle.pop() {
                Some(r) => r,
                None => Reader::open(&self.path, super::BUSY_TIMEOUT)?,
            },
        };
        let out = read(&mut reader.conn())?;
        if let Some(idle) = self.idle.lock().as_mut().filter(|i| i.len() < KEPT) {
            idle.push(reader);
        }
        Ok(out)
    }

    /// Closes the idle readers and every one in use as its read ends: the last connection
    /// to close is then the write pool's, which checkpoints the WAL and removes it — an open
    /// reader left the `-wal` and `-shm` files behind.
    pub fn close(&self) {
        self.idle.lock().take();
    }
}

//! The request path's own SQLite readers (`raw::Reader`): a few read-only connections,
//! reused, opened when first needed, with the pools' busy timeout. Callers run them on a
//! blocking thread (`store::cache::budget_remaining`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::raw::{Conn, Reader};
use super::{Result, StoreError};

/// Connections kept for reuse; more may be open at a moment (one per concurrent caller),
/// the others are closed when their read ends.
const KEPT: usize = 4;

/// Reads in flight at most. A read SQLite holds (its WAL read retry, ~10 s, while another
/// process holds the read marks) keeps its blocking thread and its connection until SQLite
/// lets go, whoever stopped waiting for it (`pipeline::cached`); past this many, a read
/// fails at once rather than pile threads and connections up behind the lock (s41 final
/// attack F1).
const MOST_IN_FLIGHT: usize = 16;

pub struct Readers {
    path: PathBuf,
    /// The idle readers; `None` once the database is closed (`close`).
    idle: Mutex<Option<Vec<Reader>>>,
    in_flight: AtomicUsize,
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
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Runs `read` on an idle reader, or a new one. A reader whose read failed is closed,
    /// not kept: whatever state the failure left it in goes with it. After `close`, every
    /// read fails, as the pools' do; so does one past `MOST_IN_FLIGHT`.
    pub fn read<T>(&self, read: impl FnOnce(&mut Conn<'_>) -> Result<T>) -> Result<T> {
        let _counted = InFlight::count(&self.in_flight)?;
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

/// One read counted in flight until it drops.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn count(in_flight: &'a AtomicUsize) -> Result<InFlight<'a>> {
        let counted = InFlight(in_flight);
        if in_flight.fetch_add(1, Ordering::AcqRel) >= MOST_IN_FLIGHT {
            return Err(StoreError::Conflict(format!(
                "{MOST_IN_FLIGHT} reads already in flight"
            )));
        }
        Ok(counted)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads SQLite holds pile up no further than `MOST_IN_FLIGHT`: the next fails at once
    /// instead of taking another thread and connection (s41 final attack F1); and when one
    /// ends, reads go again.
    #[tokio::test]
    async fn reads_past_the_most_in_flight_fail_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let _db = crate::store::Db::open(&path, false).await.unwrap();
        let readers = std::sync::Arc::new(Readers::new(path));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Arc::new(Mutex::new(held));
        let (entered, entries) = std::sync::mpsc::channel();
        let holders: Vec<_> = (0..MOST_IN_FLIGHT)
            .map(|_| {
                let (readers, held, entered) = (readers.clone(), held.clone(), entered.clone());
                std::thread::spawn(move || {
                    readers.read(|_| {
                        entered.send(()).unwrap();
                        held.lock().recv().unwrap();
                        Ok(())
                    })
                })
            })
            .collect();
        for _ in 0..MOST_IN_FLIGHT {
            entries.recv().unwrap();
        }
        let started = std::time::Instant::now();
        let refused = readers.read(|_| Ok(()));
        assert!(refused.is_err(), "a read past the most in flight ran");
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
        release.send(()).unwrap();
        let mut ended = 0;
        while ended == 0 {
            ended = holders.iter().filter(|h| h.is_finished()).count();
            std::thread::yield_now();
        }
        assert!(readers.read(|_| Ok(())).is_ok(), "a read once one ended");
        for _ in 1..MOST_IN_FLIGHT {
            release.send(()).unwrap();
        }
        for h in holders {
            h.join().unwrap().unwrap();
        }
    }
}

//! The cache's own thread: what the cache keeps of a stored answer — the entry, its
//! text, the LRU's node, its vector — is made there (`Cache::store`).
//!
//! Why: glibc's malloc gives each thread an arena of its own, and the heap-release thread
//! (`ops::memory`) can hand back only the whole free pages of one. Entries stored by the
//! serving worker lay among the buffers of the requests that made them, each pinning the
//! pages around it once those were freed: 5 s after 1 000 streams, ~3 700 chunks of entries
//! (1.3 MB) held ~11 MB of the worker's arena resident (docs/PERFORMANCE.md, "The cache's
//! own thread"). Made on a thread that makes nothing else, they lie together, and what the
//! requests freed goes back whole.
//!
//! Only memory work runs here, no I/O (its runtime has no I/O driver): a connection
//! opened from this runtime (a database pool's, an `http` embedder's) would be driven by
//! this one thread for every worker that reuses it (s46 attack F3), and the housekeeping that reads the table (refresh, rebuild)
//! stays on the application's runtime, which ends with it (F1). One thread for the process,
//! started at its first use; a thread that cannot start leaves the work to the caller's
//! runtime (the caller is on one), as before.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;

static THREAD: OnceLock<Option<Handle>> = OnceLock::new();

/// Runs `task` on the cache's thread (on the caller's runtime if it could not start).
pub fn spawn<F>(task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match THREAD.get_or_init(start) {
        Some(thread) => drop(thread.spawn(task)),
        None => drop(tokio::spawn(task)),
    }
}

fn start() -> Option<Handle> {
    start_on(|work| {
        std::thread::Builder::new()
            .name("cache".into())
            .spawn(work)
            .map(drop)
    })
}

/// Starts the thread through `spawn_thread`, its runtime built on it — built on the caller
/// and dropped there when the thread could not start, a runtime panics the caller's task
/// (tokio refuses to drop one in an async context; s46 stop attack F1).
fn start_on(
    spawn_thread: impl FnOnce(Box<dyn FnOnce() + Send>) -> std::io::Result<()>,
) -> Option<Handle> {
    let (started, handle) = std::sync::mpsc::channel();
    let spawned = spawn_thread(Box::new(move || {
        // A clock, no I/O driver: nothing here may open a connection (module doc).
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => {
                let _ = started.send(Some(runtime.handle().clone()));
                // Never ends: the process's, like the heap-release thread.
                runtime.block_on(std::future::pending::<()>());
            }
            Err(e) => {
                tracing::warn!(error = %e, "the cache's thread has no runtime: entries are made on the workers");
                let _ = started.send(None);
            }
        }
    }));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the cache's thread did not start: entries are made on the workers");
        return None;
    }
    handle.recv().ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store runs on the thread named `cache`, not the caller's.
    #[tokio::test]
    async fn a_task_runs_on_the_caches_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn(async move {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        });
        assert_eq!(rx.await.unwrap().as_deref(), Some("cache"));
    }

    /// A thread that cannot start leaves no runtime to drop in the caller's task: the
    /// caller gets none, and no panic.
    #[tokio::test]
    async fn a_thread_that_cannot_start_is_none_without_a_panic() {
        let failed = start_on(|_work| Err(std::io::Error::other("no threads left")));
        assert!(failed.is_none());
    }
}

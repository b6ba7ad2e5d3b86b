//! Giving freed heap memory back to the operating system.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::Duration;

/// How often the allocator's free memory is looked at (`release_after_bursts`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Free heap up to this much is kept for reuse: handing back a few pages only to fault them
/// in again at the next request costs more than it saves.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_FREE: usize = 4 << 20;

/// Hands the allocator's free pages back to the OS (glibc's `malloc_trim`; elsewhere a
/// no-op). glibc keeps freed memory for reuse indefinitely, so the RSS after a burst, or
/// after start-up work, stays at its peak without this.
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Starts a thread that hands the free heap back once a burst is over: each second, when
/// more is free than in use and more than `KEEP_FREE` was freed since the least free the
/// heap had since the last trim. After 1 000 streams the
/// gateway held 88 MB against 37 MB idle, all of it glibc's free lists (issue 21 item 2);
/// with this, 48 MB 5 s later. Under a steady load the freed memory is reused and less is
/// free than in use, so nothing is handed back to be faulted in again. A thread of its
/// own: a trim of a large heap takes milliseconds, not to be spent on a request's worker.
/// One per process, however many gateways it builds (the tests build hundreds).
pub fn release_after_bursts() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(start_releasing);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn start_releasing() {
    let spawned = std::thread::Builder::new()
        .name("heap-release".into())
        .spawn(|| {
            // The least free heap seen since the last trim. A trim leaves the free chunks
            // free (only their pages go back), so "more free than in use" alone held after
            // one burst for ever and trimmed every second — a test process spent twice the
            // system time on it; what counts is memory freed since (s33).
            let mut low = usize::MAX;
            loop {
                std::thread::sleep(LOOK_EVERY);
                // SAFETY: mallinfo2 only reads the allocator's statistics.
                let heap = unsafe { libc::mallinfo2() };
                let free = heap.fordblks;
                low = low.min(free);
                if free > heap.uordblks && free - low > KEEP_FREE {
                    release_free();
                    low = free;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the heap-release thread did not start: memory freed after a burst stays with the process");
    }
}

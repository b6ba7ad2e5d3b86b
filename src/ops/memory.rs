//! Giving freed heap memory back to the operating system.

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

/// Requests answered by the process so far (`served`): work for the heap-release thread
/// to rest from. One relaxed add per request.
static SERVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a request answered (`ops::request_log` calls it for each).
pub fn served() {
    SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Starts a thread that hands the free heap back when a burst is over or the gateway comes
/// to rest (`Releaser` says when), looking each second; elsewhere than glibc a no-op. A
/// thread of its own: a trim of a large heap takes milliseconds, not to be spent on a
/// request's worker. One per process, however many gateways it builds (the tests build
/// hundreds).
pub fn release_after_bursts() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(glibc::start_releasing);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod releaser;

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

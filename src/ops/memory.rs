//! Giving freed heap memory back to the operating system.
// Only glibc's allocator is trimmed: elsewhere `Releaser` and its bars have no caller.
#![cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::Duration;

/// How often the allocator's free memory is looked at (`release_after_bursts`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Free heap up to this much is kept for reuse while the gateway works: handing back a few
/// pages only to fault them in again at the next request costs more than it saves.
const KEEP_FREE: usize = 4 << 20;

/// Less CPU than this over one look is a quiet second: a gateway at rest spends 3.5–5 ms
/// a second on its beats (`bench/overhead.py`'s `gw_idle_cpu_ms_per_s`), a request with
/// every feature on about 1 ms — so a quiet second served fewer than ~15 requests.
const QUIET_CPU: Duration = Duration::from_millis(20);

/// Free heap at rest below this is kept: not worth a trim.
const KEEP_FREE_AT_REST: usize = 1 << 20;

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

/// Starts a thread that hands the free heap back (`Releaser` says when), looking each
/// second. After 1 000 streams the gateway held 88 MB against 37 MB idle, all of it glibc's
/// free lists (issue 21 item 2); with this, 48 MB 5 s later. A thread of its own: a trim of
/// a large heap takes milliseconds, not to be spent on a request's worker. One per
/// process, however many gateways it builds (the tests build hundreds).
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
            let mut releaser = Releaser::default();
            let mut cpu = process_cpu();
            loop {
                std::thread::sleep(LOOK_EVERY);
                let now = process_cpu();
                // SAFETY: mallinfo2 only reads the allocator's statistics.
                let heap = unsafe { libc::mallinfo2() };
                if releaser.look(heap.fordblks, heap.uordblks, now.saturating_sub(cpu)) {
                    release_free();
                }
                cpu = now;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the heap-release thread did not start: memory freed after a burst stays with the process");
    }
}

/// The CPU time of the whole process so far (every thread's, this one's included).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn process_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; the clock is always there on
    // Linux, and on an error `t` stays zero (the look then counts as busy or quiet once).
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// When the free heap goes back, from one look a second at the allocator and the process's
/// CPU:
/// - **a burst is over**: more is free than in use and more than `KEEP_FREE` was freed
///   since the least free the heap had since the last trim. A trim leaves the free chunks
///   free (only their pages go back), so "more free than in use" alone held after one burst
///   for ever and trimmed every second — a test process spent twice the system time on it;
///   what counts is memory freed since (s33). Under a steady load the freed memory is
///   reused and less is free than in use, so nothing is handed back to be faulted in again.
/// - **the gateway came to rest**: the first quiet second (`QUIET_CPU`) after a busy one,
///   with more than `KEEP_FREE_AT_REST` free — once per quiet spell. Below the burst's bar
///   the free heap otherwise stayed: 1.8–3.5 MB after the warm-up of `overhead.py`'s
///   streams phase, of which a trim gave back 0.7–1.2 MB of the idle RSS (s44). Its cost is
///   a few page faults for the next request to touch those pages — once per spell, never
///   under a load.
struct Releaser {
    /// The least free heap seen since the last trim.
    low: usize,
    /// A busy second came since the last trim (and at start: the start-up's work).
    worked: bool,
}

impl Default for Releaser {
    fn default() -> Self {
        Self {
            low: usize::MAX,
            worked: true,
        }
    }
}

impl Releaser {
    /// One look: the heap's free and in-use bytes, and the CPU the process spent since the
    /// last look. True: trim now.
    fn look(&mut self, free: usize, in_use: usize, cpu: Duration) -> bool {
        self.low = self.low.min(free);
        let quiet = cpu < QUIET_CPU;
        let burst_over = free > in_use && free - self.low > KEEP_FREE;
        let came_to_rest = quiet && self.worked && free > KEEP_FREE_AT_REST;
        if !quiet {
            self.worked = true;
        }
        let trim = burst_over || came_to_rest;
        if trim {
            self.low = free;
            self.worked = !quiet;
        }
        trim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;
    const BUSY: Duration = Duration::from_millis(400);
    const QUIET: Duration = Duration::from_millis(4);

    #[test]
    fn the_free_heap_goes_back_once_when_the_gateway_comes_to_rest() {
        let mut r = Releaser::default();
        assert!(!r.look(2 * MB, 8 * MB, BUSY), "not while it works");
        assert!(r.look(2 * MB, 8 * MB, QUIET), "the first quiet second");
        assert!(!r.look(2 * MB, 8 * MB, QUIET), "once per quiet spell");
        assert!(!r.look(3 * MB, 8 * MB, QUIET));
        assert!(!r.look(2 * MB, 8 * MB, BUSY));
        assert!(r.look(2 * MB, 8 * MB, QUIET), "the next spell");
    }

    #[test]
    fn the_start_ups_free_heap_goes_back_at_the_first_quiet_second() {
        assert!(Releaser::default().look(2 * MB, 8 * MB, QUIET));
    }

    #[test]
    fn a_little_free_heap_at_rest_is_kept_until_there_is_more() {
        let mut r = Releaser::default();
        assert!(!r.look(MB / 2, 8 * MB, QUIET));
        assert!(!r.look(MB, 8 * MB, QUIET));
        assert!(
            r.look(MB + MB / 2, 8 * MB, QUIET),
            "still the spell's first trim"
        );
    }

    #[test]
    fn a_steady_load_keeps_its_free_heap() {
        let mut r = Releaser::default();
        for free in [3, 2, 5, 1, 4, 3, 5, 2].map(|m| m * MB) {
            assert!(!r.look(free, 40 * MB, BUSY), "{free}");
        }
    }

    #[test]
    fn the_heap_freed_by_a_burst_goes_back_while_the_gateway_still_works() {
        let mut r = Releaser::default();
        assert!(!r.look(2 * MB, 80 * MB, BUSY));
        assert!(
            r.look(60 * MB, 20 * MB, BUSY),
            "more free than in use, 58 MB freed"
        );
        assert!(
            !r.look(61 * MB, 20 * MB, BUSY),
            "a trim leaves the chunks free"
        );
        assert!(r.look(62 * MB, 20 * MB, QUIET), "at rest: the spell's trim");
        assert!(
            !r.look(63 * MB, 20 * MB, BUSY),
            "1 MB freed since: below the bar"
        );
    }
}

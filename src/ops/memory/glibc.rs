//! The heap-release thread on glibc: once a second it reads the CPU the rest of the
//! process spent and its anonymous memory, and trims when `Releaser` says — at rest, after
//! freeing SQLite's page caches (`store::raw::release_page_caches`).

use std::time::{Duration, Instant};

use super::releaser::{Releaser, LOOK_EVERY};
use crate::ops::metrics;

pub fn start_releasing() {
    let spawned = std::thread::Builder::new()
        .name("heap-release".into())
        .spawn(|| {
            let mut releaser = Releaser::new(Instant::now(), others_cpu());
            let mut served = 0;
            let mut unreadable = false;
            loop {
                std::thread::sleep(LOOK_EVERY);
                // Unreadable (out of file descriptors, say): no look this second; the
                // next one takes the CPU of the seconds missed as their average.
                let Some(anon) = anonymous_rss() else {
                    if !std::mem::replace(&mut unreadable, true) {
                        tracing::warn!("the heap-release thread cannot read /proc/self/statm: no trims until it can");
                    }
                    continue;
                };
                unreadable = false;
                let now = Instant::now();
                let seen = std::mem::replace(
                    &mut served,
                    super::SERVED.load(std::sync::atomic::Ordering::Relaxed),
                );
                if let Some(rule) = releaser.look(now, others_cpu(), anon, seen != served) {
                    // The trim alone is timed for its spacing (stop attack nit 7) — with, at
                    // rest, SQLite's release, which is part of its work.
                    let started = Instant::now();
                    // At rest only: under a load the pages would be read again at once.
                    if rule == "rest" {
                        crate::store::raw::release_page_caches();
                    }
                    super::release_free();
                    let ended = Instant::now();
                    metrics::heap_trim(rule);
                    let left = anonymous_rss().unwrap_or(anon);
                    releaser.trimmed(started, ended, left);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "the heap-release thread did not start: memory freed after a burst stays with the process");
    }
}

/// The process's resident memory that no file backs (the heap, stacks, relocated
/// data), from `/proc/self/statm`: resident less shared pages, counted by the kernel —
/// where glibc's own statistics (`mallinfo2`, read here each second before s44) walk
/// every free chunk of every arena under its lock: 0.2 ms a look on a fresh gateway,
/// up to 6–8 ms of CPU (7–12 ms from its first sample to its last) each second, 50 s into
/// a load at one client with every feature on, on the gateway's core (`perf record` of
/// this thread). None if the file cannot be read.
fn anonymous_rss() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_ascii_whitespace().skip(1);
    let resident: usize = pages.next()?.parse().ok()?;
    let shared: usize = pages.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(resident.saturating_sub(shared) * usize::try_from(page).ok()?)
}

/// The CPU the process has spent so far, this thread's own left out.
fn others_cpu() -> Duration {
    cpu(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(cpu(libc::CLOCK_THREAD_CPUTIME_ID))
}

/// A CPU clock's time so far: the process's (every thread's) or this thread's own.
fn cpu(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; both clocks are always
    // there on Linux (were one not, `t` stays zero: every second looks quiet, and only
    // the requests answered tell work from rest).
    unsafe { libc::clock_gettime(clock, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_anonymous_memory_read_is_the_kernels_own_count() {
        let anon = anonymous_rss().expect("/proc/self/statm is readable on Linux");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let rss_anon_kb: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        // The same kernel counters (resident − file-backed − shared memory), read a moment
        // apart while other tests' threads allocate and free: within a factor of two, which
        // a count of pages taken for bytes is not.
        let kernel = rss_anon_kb * 1024;
        assert!(
            anon >= kernel / 2 && anon <= kernel * 2 + (16 << 20),
            "{anon} B against RssAnon {rss_anon_kb} kB"
        );
    }

    #[test]
    fn the_cpu_read_leaves_this_threads_own_out() {
        let (process, others) = (cpu(libc::CLOCK_PROCESS_CPUTIME_ID), others_cpu());
        // Spin until this thread has had 50 ms of CPU, not 50 ms of wall clock: on a
        // busy 2-core runner the other tests' threads can take most of a wall-clock
        // span (CI failed on that once).
        let own = cpu(libc::CLOCK_THREAD_CPUTIME_ID);
        let spin = Instant::now();
        while cpu(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(own) < Duration::from_millis(50)
            && spin.elapsed() < Duration::from_secs(30)
        {
            std::hint::black_box(0u64);
        }
        let (others_after, process_after) = (others_cpu(), cpu(libc::CLOCK_PROCESS_CPUTIME_ID));
        // Whatever other tests' threads ran meanwhile counts in both; this thread's
        // ~50 ms of spinning only in the process's. Read in this order, the process's
        // span holds the others' span, so a preemption between two reads only adds.
        let left_out = (process_after.saturating_sub(process))
            .saturating_sub(others_after.saturating_sub(others));
        assert!(left_out >= Duration::from_millis(30), "{left_out:?}");
    }
}

//! When the heap-release thread (`super::glibc`) trims: its rules, from what it reads
//! each second.

use std::time::{Duration, Instant};

/// How often the process is looked at.
pub(super) const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The anonymous memory must have grown by more than this since the last trim for the
/// end of a burst to trim: handing back a few pages only to fault them in again at the
/// next request costs more than it saves.
const GROWN: usize = 4 << 20;

/// A second in which the rest of the process spent less CPU than this is quiet: a
/// gateway at rest spends 3.5–5 ms a second on its beats (`bench/overhead.py`'s
/// `gw_idle_cpu_ms_per_s`); a request costs ~0.2 ms plain, ~1 ms with every feature on.
/// On a host whose beats cost more, the bar is twice the least second seen, up to
/// `QUIET_CPU_MOST`.
const QUIET_CPU: Duration = Duration::from_millis(20);
const QUIET_CPU_MOST: Duration = Duration::from_millis(100);

/// Quiet seconds in a row that make the gateway at rest.
const REST_LOOKS: u32 = 2;

/// The anonymous memory must have grown by more than this since the last trim for a
/// rest to trim: a request still running when its client's next one is minutes away
/// (a long upstream call, a stream) makes a rest of its own seconds, and without new
/// memory behind it a trim there only walks the heap and hands back pages its next
/// request faults in again (s44 final attack F1).
const REST_GROWN: usize = 256 << 10;

/// A trim that took `t` is followed by none for `TRIM_SPACING × t`: trimming holds each
/// arena's lock in turn while it walks the free chunks (up to ~10 ms on a fragmented
/// heap), so it never takes more than a hundredth of a core.
const TRIM_SPACING: u32 = 100;

/// How long after a `burst` trim the next rest trims whatever grew: the burst's end frees
/// for a second or two after the CPU fell (s45); later, a load that went on has reused
/// what it freed, and a trim would only walk the heap.
const BURST_TAIL: Duration = Duration::from_secs(10);

/// For this long after a trim, growth counts from the memory the trim began at, not
/// from what it left: a load that comes back within it faults the handed-back pages in
/// again, and trimming them once more each time would cost a walk of the heap and the
/// faults per cycle for nothing (s45 stop attack F1: a batch every 2 s trimmed every 2 s).
const REFAULT_WINDOW: Duration = Duration::from_secs(60);

/// The spacing's cap: a trim's wall-clock time also counts a stop of the process in the
/// middle of it (SIGSTOP, a paused container), which must not hold trims off for hours.
const MOST_SPACING: Duration = Duration::from_secs(60);

/// When the free heap goes back, from one look a second at the CPU the rest of the
/// process spent (this thread's own trims left out, so a trim cannot make the next
/// second look busy) and its anonymous memory (never the allocator's statistics: see
/// `super::glibc`'s `anonymous_rss`). The rules, counted in `gateway_heap_trims_total{rule}`:
/// - **`rest`**: `REST_LOOKS` quiet seconds in a row in which no request was answered,
///   after work (a request answered, or a second that was not quiet), the anonymous
///   memory grown by more than `REST_GROWN` since the last trim — once per spell of
///   rest. What work leaves free otherwise stays: 1.8–3.5 MB of heap after the warm-up
///   of `overhead.py`'s streams phase, of which a trim gave back 0.7–1.2 MB of the RSS
///   (s44). The growth is measured from the memory left by the last trim, though what
///   is freed afterwards does not lower the RSS: a trim in the middle of light work
///   sees only what that work grew after it; and for `REFAULT_WINDOW` after a trim it
///   counts from what the trim began at, so pages handed back and faulted in again by
///   the same load are not trimmed again each time. A load that comes and goes at rest's
///   edge trims at most every third second (with new memory each time; once a minute
///   when its memory only comes back), and `TRIM_SPACING` bounds what that costs.
///   A rest within `BURST_TAIL` of a `burst` trim, its quiet seconds counted from that
///   trim, trims whatever grew: what the burst's end frees after the trim shows as no
///   growth, and stayed — 2.1–2.3 MB two seconds after the trim that followed 1 000
///   streams, all answered before it; 0.2 MB a second after it (s45). What stragglers
///   free after that rest stays.
/// - **`burst`** while requests still come: the anonymous memory grew by more than
///   `GROWN` since the last trim and the process's CPU fell under a quarter of its
///   busiest second since then. After 1 000 streams the gateway held 88 MB against
///   37 MB idle, all of it glibc's free lists (issue 21 item 2); with a trim, 48 MB 5 s
///   later. Under a steady load the freed memory is reused and the CPU does not fall, so
///   nothing is handed back to be faulted in again; memory that grew in use (the
///   response cache filling) is trimmed at most once per `GROWN` of growth.
///
/// Either costs the requests of its second a wait on the arena being walked, and the
/// next ones the page faults of touching handed-back pages again.
pub(super) struct Releaser {
    /// The process's CPU at the last look, this thread's left out.
    cpu: Duration,
    /// The least CPU of a second seen: the host's idle, for the quiet bar.
    least: Duration,
    /// Quiet seconds in a row; `None` from a rest's trim until work (at start `Some(0)`:
    /// the start-up's leftovers go at its first rest).
    quiet_looks: Option<u32>,
    /// The anonymous memory after the last trim.
    floor: usize,
    /// The anonymous memory at the look that made the last trim, and when it was
    /// (`REFAULT_WINDOW`).
    trimmed_from: usize,
    trimmed_at: Instant,
    /// The busiest second's CPU since the last trim.
    busiest: Duration,
    /// When the last `burst` trim was, if no `rest` has trimmed since: a rest within
    /// `BURST_TAIL` of it is due whatever grew.
    burst_trim: Option<Instant>,
    /// No trim before this (`TRIM_SPACING`).
    not_before: Instant,
    /// When the last look was.
    looked: Instant,
}

impl Releaser {
    pub(super) fn new(now: Instant, cpu: Duration) -> Self {
        Self {
            cpu,
            least: Duration::MAX,
            quiet_looks: Some(0),
            floor: 0,
            trimmed_from: 0,
            trimmed_at: now,
            busiest: Duration::ZERO,
            burst_trim: None,
            not_before: now,
            looked: now,
        }
    }

    /// One look: the time, the CPU the rest of the process has spent so far, its
    /// anonymous memory now, and whether requests were answered since the last look
    /// (work to rest from even at a pace that keeps the CPU quiet, and no second of
    /// rest). `Some(rule)`: trim now, then say what it took (`trimmed`).
    pub(super) fn look(
        &mut self,
        now: Instant,
        cpu: Duration,
        anon: usize,
        answered: bool,
    ) -> Option<&'static str> {
        // Per second: a look skipped (or a sleep overslept) spreads its CPU over the
        // seconds it covers, not into one busy second that would make a steady load
        // look like a burst that fell.
        let seconds = now.saturating_duration_since(self.looked).max(LOOK_EVERY);
        let spent = cpu
            .saturating_sub(self.cpu)
            .mul_f64(LOOK_EVERY.as_secs_f64() / seconds.as_secs_f64());
        self.cpu = cpu;
        self.looked = now;
        // The least second creeps up (~1.6 % a look) so one second that was cut short
        // (the VM paused the process, say) does not hold the bar down for good.
        // (From 0 too: a clock that read nothing once must not pin the bar.)
        let creep = self.least / 64 + Duration::from_micros(100);
        self.least = spent.min(self.least.saturating_add(creep));
        let bar = self
            .least
            .saturating_mul(2)
            .clamp(QUIET_CPU, QUIET_CPU_MOST);
        self.quiet_looks = if spent < bar && !answered {
            self.quiet_looks.map(|n| n.saturating_add(1))
        } else {
            Some(0)
        };
        let base = if now.saturating_duration_since(self.trimmed_at) < REFAULT_WINDOW {
            self.floor.max(self.trimmed_from)
        } else {
            self.floor
        };
        let burst_over =
            anon > base.saturating_add(GROWN) && spent.saturating_mul(4) < self.busiest;
        self.busiest = self.busiest.max(spent);
        if now < self.not_before {
            return None;
        }
        let grown = anon.saturating_sub(base);
        if self.quiet_looks.is_some_and(|n| n >= REST_LOOKS)
            && (grown > REST_GROWN
                || self
                    .burst_trim
                    .is_some_and(|at| now.saturating_duration_since(at) <= BURST_TAIL))
        {
            self.quiet_looks = None;
            self.burst_trim = None;
            self.begins(now, anon);
            return Some("rest");
        }
        if burst_over {
            // The rest after it counts its quiet seconds from here: the burst's end
            // goes on freeing for a second or two after the CPU fell. (A spell whose rest
            // has trimmed stays over: its next rest comes after work.)
            self.burst_trim = Some(now);
            self.begins(now, anon);
            if let Some(n) = self.quiet_looks.as_mut() {
                *n = 0;
            }
        }
        burst_over.then_some("burst")
    }

    /// A trim begins at `anon`: for `REFAULT_WINDOW` growth counts from here — but not
    /// from the first, of the start-up's leftovers (migrations, what is filled once),
    /// which no load brings back: the warm-up after it is new memory (s45: 0.3 MB
    /// left after the streams phase's warm-up otherwise).
    fn begins(&mut self, now: Instant, anon: usize) {
        if self.floor > 0 {
            (self.trimmed_from, self.trimmed_at) = (anon, now);
        }
    }

    /// A trim ran from `started` to `ended` and left `anon` of anonymous memory:
    /// growth counts from here, the busiest second from the next.
    pub(super) fn trimmed(&mut self, started: Instant, ended: Instant, anon: usize) {
        self.floor = anon;
        self.busiest = Duration::ZERO;
        let took = ended.saturating_duration_since(started);
        self.not_before = ended + took.saturating_mul(TRIM_SPACING).min(MOST_SPACING);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;
    const BUSY: u64 = 400;
    const LIGHT: u64 = 90;
    const QUIET: u64 = 4;

    /// Drives a `Releaser` a second at a time, as the thread does, each trim taking
    /// 1 ms (so none for the next 0.1 s) and leaving the memory at `left`.
    struct Seconds {
        r: Releaser,
        at: Instant,
        cpu: Duration,
        /// Requests answered in the next second.
        answering: bool,
    }

    impl Seconds {
        fn new() -> Self {
            let at = Instant::now();
            Self {
                r: Releaser::new(at, Duration::ZERO),
                at,
                cpu: Duration::ZERO,
                answering: false,
            }
        }

        fn look(&mut self, spent_ms: u64, anon_mb: usize, left_mb: usize) -> Option<&str> {
            self.at += LOOK_EVERY;
            self.cpu += Duration::from_millis(spent_ms);
            let answered = std::mem::take(&mut self.answering);
            let rule = self.r.look(self.at, self.cpu, anon_mb * MB, answered);
            if rule.is_some() {
                let ended = self.at + Duration::from_millis(1);
                self.r.trimmed(self.at, ended, left_mb * MB);
            }
            rule
        }

        /// A gateway whose start-up's rest trim took `took`.
        fn after_a_rest_trim_of(took: Duration) -> Self {
            let mut s = Self::new();
            s.trims(&[QUIET], 7, 7);
            s.at += LOOK_EVERY;
            assert_eq!(s.r.look(s.at, s.cpu, 7 * MB, false), Some("rest"));
            s.r.trimmed(s.at, s.at + took, 7 * MB);
            s
        }

        /// Seconds of `ms` each, the memory at `anon` and `left` after a trim.
        fn trims(&mut self, seconds: &[u64], anon_mb: usize, left_mb: usize) -> usize {
            seconds
                .iter()
                .filter(|&&ms| self.look(ms, anon_mb, left_mb).is_some())
                .count()
        }
    }

    #[test]
    fn the_free_heap_goes_back_once_when_the_gateway_comes_to_rest() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        assert_eq!(s.look(BUSY, 8, 7), None, "not while it works");
        assert_eq!(s.look(QUIET, 8, 7), None, "one quiet second is not rest");
        assert_eq!(s.look(QUIET, 8, 7), Some("rest"), "two in a row are");
        assert_eq!(s.trims(&[QUIET; 10], 7, 7), 0, "once per spell of rest");
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET], 9, 7), 1, "the next spell");
    }

    #[test]
    fn the_start_ups_free_heap_goes_back_at_its_first_rest() {
        let mut s = Seconds::new();
        assert_eq!(s.trims(&[QUIET, QUIET], 7, 5), 1);
        // Light work after it grows into what the start-up left free: still new memory.
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET], 6, 5), 1);
    }

    #[test]
    fn a_load_at_rests_edge_trims_its_refaulted_pages_once_a_minute() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        // Each busy second grows the memory again: busy and quiet seconds in turn are
        // never two quiet in a row.
        assert_eq!(s.trims(&[BUSY, QUIET].repeat(50), 8, 7), 0);
        // Seconds at the bar or over it break a rest.
        assert_eq!(
            s.trims(&[BUSY, QUIET, 20, QUIET, 30, QUIET].repeat(10), 8, 7),
            0
        );
        // A load every third second, its memory back at each to where the last trim
        // began: once in the minute after a trim.
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET].repeat(10), 8, 7), 1);
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET].repeat(20), 8, 7), 1);
        // New memory each time: a trim each time.
        for mb in 9..14 {
            assert_eq!(s.trims(&[BUSY, QUIET, QUIET], mb, 7), 1, "{mb} MB");
        }
    }

    #[test]
    fn a_load_that_comes_every_second_second_is_not_trimmed_every_second_second() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        let mut n = 0;
        for _ in 0..20 {
            s.answering = true;
            // The 6 MB a trim gave back, faulted in again by the next batch.
            n += usize::from(s.look(BUSY, 12, 12).is_some());
            s.answering = true;
            n += usize::from(s.look(LIGHT, 12, 6).is_some());
        }
        assert_eq!(n, 1, "trims in 40 s of the same 6 MB");
    }

    #[test]
    fn a_rest_trim_refaulted_by_the_next_call_is_not_repeated_every_call() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        let mut n = 0;
        // One long call every 4 s, its 1 MB of buffers faulted in again after each trim.
        for _ in 0..10 {
            s.answering = true;
            n += s.trims(&[QUIET], 8, 8);
            n += s.trims(&[QUIET, QUIET, QUIET], 8, 7);
        }
        assert_eq!(n, 1);
    }

    #[test]
    fn trims_are_spaced_by_what_they_took() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        s.r.not_before = s.at + Duration::from_secs(4);
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET], 8, 7), 0, "3 s of 4 waited");
        assert_eq!(s.trims(&[QUIET], 8, 7), 1, "the rest's trim, late");
        assert_eq!(s.trims(&[QUIET, QUIET], 7, 7), 0);
    }

    #[test]
    fn a_few_requests_answered_are_work_to_rest_from() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        assert_eq!(s.trims(&[QUIET; 5], 8, 7), 0, "none answered");
        s.answering = true;
        assert_eq!(s.look(QUIET, 8, 7), None, "the second they came in");
        assert_eq!(s.look(QUIET, 8, 7), None);
        assert_eq!(s.look(QUIET, 8, 7), Some("rest"));
        s.answering = true;
        assert_eq!(s.look(QUIET, 9, 7), None);
        assert_eq!(s.look(QUIET, 9, 7), None);
        s.answering = true;
        assert_eq!(
            s.look(QUIET, 9, 7),
            None,
            "a second with a request is no rest"
        );
        assert_eq!(s.look(QUIET, 9, 7), None);
        assert_eq!(s.look(QUIET, 9, 7), Some("rest"));
    }

    #[test]
    fn a_rest_after_work_that_left_nothing_new_trims_nothing() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        // A client whose next request comes when its last is answered, each minutes
        // long upstream: its seconds are rests, its memory reused.
        s.answering = true;
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET, QUIET, QUIET], 7, 7), 0);
        assert_eq!(s.look(QUIET, 8, 7), Some("rest"), "new memory: trimmed");
    }

    #[test]
    fn a_long_trim_holds_the_next_off_for_a_hundred_times_as_long() {
        let mut s = Seconds::after_a_rest_trim_of(Duration::from_millis(40));
        // No trim for 4 s after it ended.
        s.answering = true;
        assert_eq!(s.trims(&[QUIET, QUIET, QUIET, QUIET], 8, 7), 0);
        assert_eq!(s.look(QUIET, 8, 7), Some("rest"), "5 s on");
    }

    #[test]
    fn the_quiet_bar_stops_at_100_ms() {
        let mut s = Seconds::new();
        // Beats of 60 ms: twice that would be 120 ms, past the bar's cap.
        assert_eq!(s.trims(&[60, 60], 7, 7), 1);
        assert_eq!(s.trims(&[BUSY, 110, 110, 110], 8, 7), 0);
    }

    /// Beats of 30 ms (a bar of 60 ms), one second of `short` ms (the bar down to 20 ms),
    /// then beats again: the bar rises back within `risen_within` seconds.
    fn a_short_second_among_beats_of_30_ms(short: u64, risen_within: usize) {
        let mut s = Seconds::new();
        assert_eq!(s.trims(&[30, 30], 7, 7), 1, "beats of 30 ms: bar 60 ms");
        assert_eq!(
            s.trims(&[BUSY, short, 30, 30], 8, 7),
            0,
            "bar 20 ms after the {short} ms"
        );
        assert_eq!(s.trims(&vec![30; risen_within], 8, 7), 1, "risen back");
    }

    #[test]
    fn one_short_second_does_not_hold_the_quiet_bar_down() {
        a_short_second_among_beats_of_30_ms(8, 100);
    }

    #[test]
    fn a_look_skipped_under_a_steady_load_is_no_burst_that_fell() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 7, 7);
        assert_eq!(s.look(BUSY, 8, 8), None);
        // statm unreadable for 4 s: the next look covers 5 s of the same load.
        s.at += LOOK_EVERY * 4;
        s.cpu += Duration::from_millis(BUSY * 4);
        assert_eq!(s.look(BUSY, 20, 20), None);
        assert_eq!(s.look(BUSY, 20, 20), None, "the busiest is one second's");
    }

    #[test]
    fn a_trim_stretched_by_a_stopped_process_holds_the_next_off_a_minute_at_most() {
        let mut s = Seconds::after_a_rest_trim_of(Duration::from_secs(600));
        s.at += Duration::from_secs(600);
        s.answering = true;
        assert_eq!(s.trims(&[QUIET; 61], 8, 7), 1);
    }

    #[test]
    fn a_second_that_read_no_cpu_does_not_pin_the_quiet_bar() {
        a_short_second_among_beats_of_30_ms(0, 400);
    }

    #[test]
    fn a_host_with_busier_beats_still_comes_to_rest() {
        let mut s = Seconds::new();
        assert_eq!(s.trims(&[30, 31], 8, 7), 1, "bar 60 ms");
        assert_eq!(s.trims(&[200, 30, 30], 9, 7), 1);
    }

    #[test]
    fn a_steady_load_keeps_its_free_heap() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        // The CPU moves as much as this VM moves it, the memory grows as it fills.
        for (mb, ms) in [
            (10, 500),
            (14, 300),
            (19, 700),
            (25, 350),
            (30, 600),
            (36, 250),
        ] {
            assert_eq!(s.look(ms, mb, mb), None, "{mb} MB, {ms} ms");
        }
    }

    #[test]
    fn the_heap_freed_by_a_burst_goes_back_while_requests_still_come() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        assert_eq!(s.look(BUSY, 50, 50), None, "the burst");
        assert_eq!(s.look(BUSY, 88, 88), None);
        assert_eq!(
            s.look(LIGHT, 88, 40),
            Some("burst"),
            "its load fell under a quarter"
        );
        assert_eq!(s.look(LIGHT, 41, 41), None, "once");
        assert_eq!(s.look(QUIET, 41, 41), None);
        assert_eq!(
            s.look(QUIET, 41, 39),
            Some("rest"),
            "then at rest, the spell's"
        );
    }

    #[test]
    fn what_a_burst_frees_after_its_trim_goes_back_at_the_rest_after_it() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        assert_eq!(s.look(BUSY, 88, 88), None, "1 000 streams");
        assert_eq!(s.look(LIGHT, 88, 23), Some("burst"), "all answered");
        // What their end frees after the trim leaves the RSS as it was: no growth.
        assert_eq!(s.look(QUIET, 23, 23), None);
        assert_eq!(
            s.look(QUIET, 23, 21),
            Some("rest"),
            "due after a burst's trim"
        );
        assert_eq!(s.trims(&[QUIET; 5], 21, 21), 0, "once per spell");
        s.answering = true;
        assert_eq!(s.trims(&[BUSY, QUIET, QUIET], 21, 21), 0, "once per burst");
    }

    #[test]
    fn a_burst_does_not_reopen_a_spell_of_rest_that_trimmed() {
        let mut s = Seconds::new();
        assert_eq!(s.trims(&[QUIET, QUIET], 6, 6), 1);
        assert_eq!(s.look(18, 8, 8), None, "under the bar: still the spell");
        assert_eq!(
            s.look(QUIET, 11, 8),
            Some("burst"),
            "a quarter of 18 ms, 5 MB grown"
        );
        assert_eq!(
            s.trims(&[QUIET; 3], 8, 8),
            0,
            "the spell's rest has trimmed"
        );
        s.answering = true;
        assert_eq!(
            s.trims(&[QUIET; 3], 8, 8),
            1,
            "the next spell's, after work"
        );
    }

    #[test]
    fn a_rest_long_after_a_burst_needs_new_memory_again() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        assert_eq!(s.look(BUSY, 88, 88), None);
        assert_eq!(s.look(LIGHT, 88, 40), Some("burst"));
        for _ in 0..10 {
            s.answering = true;
            assert_eq!(s.look(LIGHT, 40, 40), None, "a light load goes on");
        }
        assert_eq!(s.trims(&[QUIET; 5], 40, 40), 0, "11 s after the trim");
    }

    #[test]
    fn the_rest_after_a_burst_counts_from_its_trim() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 6, 6);
        assert_eq!(s.look(BUSY, 88, 88), None);
        assert_eq!(s.look(QUIET, 88, 23), Some("burst"), "a quiet second");
        assert_eq!(
            s.look(QUIET, 23, 23),
            None,
            "one quiet second since the trim"
        );
        assert_eq!(s.look(QUIET, 23, 21), Some("rest"));
    }

    #[test]
    fn a_burst_held_off_by_the_spacing_leaves_no_tail() {
        let mut s = Seconds::after_a_rest_trim_of(Duration::from_millis(40));
        s.answering = true;
        assert_eq!(s.look(BUSY, 20, 20), None, "no trim for 4 s");
        assert_eq!(s.look(LIGHT, 20, 20), None, "a burst over, held off");
        // Its large buffers were mapped apart and went back when freed: nothing grew.
        s.answering = true;
        assert_eq!(s.trims(&[QUIET, QUIET, QUIET, QUIET], 7, 7), 0);
    }

    #[test]
    fn memory_grown_in_use_is_trimmed_at_most_once_per_its_growth() {
        let mut s = Seconds::new();
        s.trims(&[QUIET, QUIET], 20, 20);
        assert_eq!(s.look(BUSY, 22, 22), None);
        assert_eq!(s.look(LIGHT, 23, 23), None, "grown 3 MB: kept");
        assert_eq!(s.look(BUSY, 26, 26), None);
        assert_eq!(s.look(110, 26, 26), None, "over a quarter of the busiest");
        assert_eq!(
            s.look(LIGHT, 26, 26),
            Some("burst"),
            "grown 6 MB, the load fell"
        );
        assert_eq!(
            s.look(LIGHT, 31, 31),
            None,
            "the busiest counts from the trim"
        );
        assert_eq!(s.look(BUSY, 31, 31), None);
        assert_eq!(
            s.look(LIGHT, 31, 31),
            Some("burst"),
            "grown 5 MB, the load fell"
        );
        assert_eq!(s.look(BUSY, 32, 32), None);
        assert_eq!(s.look(LIGHT, 32, 32), None, "grown 1 MB since: kept");
    }
}

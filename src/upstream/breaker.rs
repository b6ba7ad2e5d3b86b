//! A circuit breaker per deployment. CLOSED → OPEN after `failure_threshold` consecutive
//! failures, or when at least `min_calls` calls in the last `window_seconds` failed at a
//! rate of `failure_rate` or more. OPEN for `open_seconds`, answering without an upstream
//! call. Then HALF_OPEN: up to `half_open_probes` probes at a time; `close_after_successes`
//! successes close it, a failure re-opens it, and a probe that outlives
//! `half_open_max_wait_seconds` from its send counts as a failure, so a hung probe cannot
//! wedge it (one still waiting at its key's concurrency gate is not sent, and not hung).
//! Only server-side failures count: 429s and client errors are not failures. A call is
//! held as a `Permit`: a probe whose request is dropped mid-call (the client left) frees
//! its slot when the permit drops, instead of holding it for the maximum wait. Such a probe,
//! or one cut by its request's own deadline, gave no verdict; but
//! [`UNANSWERED_PROBES_REOPEN`] of them in a row, with no success between, re-open the
//! breaker, so clients that never wait long enough cannot keep it half-open for ever either.
//! A stream's call is judged when the stream ends, not at its 200: a probe that is a stream
//! holds its slot while it progresses, up to the maximum wait, and its verdict counts in the
//! half-open period that admitted it (`Permit::streaming`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::BreakerSettings;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
    /// For the `gateway_breaker_state` gauge: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> f64 {
        match self {
            State::Closed => 0.0,
            State::HalfOpen => 1.0,
            State::Open => 2.0,
        }
    }
}

/// Probes in a row that went out and ended without a verdict (the request's own deadline
/// cut them, or their client left mid-call) after which a half-open breaker re-opens.
/// One such probe says nothing of the upstream — its client's time was short — so it only
/// frees its slot. But a hung upstream makes *every* probe end that way: without a count
/// the breaker would stay half-open for ever, each request in turn waiting out its deadline
/// on the hung key and getting 502 instead of a fast 503. Three: one or two impatient
/// clients cannot re-open a healthy key, and a hung one costs at most three requests'
/// deadlines per open period. A success resets the count; so does re-opening.
///
/// Only a probe that waited at least `half_open_max_wait / UNANSWERED_PROBES_REOPEN`
/// counts (three of them add up to one hung probe): a client that sends a 20 ms deadline,
/// or leaves at once, again and again would otherwise keep a healthy key shut for everyone.
/// A shorter probe only frees its slot.
pub const UNANSWERED_PROBES_REOPEN: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A normal call.
    Call,
    /// A half-open probe: report its outcome with `probe = true`.
    Probe,
    /// Open: do not call; it may be tried again after this long.
    Reject(Duration),
}

#[derive(Debug)]
struct Inner {
    state: State,
    consecutive_failures: u32,
    window_start: Instant,
    window_calls: u32,
    window_failures: u32,
    open_until: Instant,
    probes: Vec<Probe>,
    probe_successes: u32,
    /// Probes in a row that ended without a verdict (see `UNANSWERED_PROBES_REOPEN`).
    unanswered_probes: u32,
    /// How many times it opened: a probe's verdict counts as one only in the half-open
    /// period that admitted it (`Permit::opening`).
    openings: u64,
}

/// A half-open probe's slot.
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// When it was admitted: its own slot is found by it (`release`).
    started: Instant,
    /// When it went out to the upstream (`Permit::sent`): its maximum wait runs from then.
    /// Admitted, a probe may still wait at its key's concurrency gate, up to its request's
    /// deadline; nothing is sent meanwhile, so nothing can hang (s30 upstream attack F3: a
    /// probe queued behind a busy local server's calls was taken for hung and re-opened the
    /// breaker, period after period, with no call made). Its request's end frees its slot
    /// (`Permit`'s drop abandons a probe never sent).
    sent: Option<Instant>,
    /// Once it is a stream (`Permit::streaming`): when it last made progress, and how long
    /// it may go without before it counts as hung.
    stream: Option<(Instant, Duration)>,
}

impl Probe {
    fn new(started: Instant, sent: Option<Instant>) -> Self {
        Self {
            started,
            sent,
            stream: None,
        }
    }

    /// When it hung, if it did by `now`: `max_wait` after it was sent, or a stream's own
    /// bound after its last progress (a healthy stream runs for minutes past the maximum
    /// wait). One not sent yet has not hung.
    fn hung(&self, now: Instant, max_wait: Duration) -> Option<Instant> {
        let (since, limit) = match (self.stream, self.sent) {
            (Some(stream), _) => stream,
            (None, Some(sent)) => (sent, max_wait),
            (None, None) => return None,
        };
        // `since + limit` is before `now`: it cannot overflow.
        (now.duration_since(since) > limit).then(|| since + limit)
    }
}

#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerSettings,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub fn new(cfg: &BreakerSettings) -> Self {
        let now = Instant::now();
        Self {
            cfg: cfg.clone(),
            inner: Mutex::new(Inner {
                state: State::Closed,
                consecutive_failures: 0,
                window_start: now,
                window_calls: 0,
                window_failures: 0,
                open_until: now,
                probes: Vec::new(),
                probe_successes: 0,
                unanswered_probes: 0,
                openings: 0,
            }),
        }
    }

    pub fn state(&self) -> State {
        self.inner.lock().state
    }

    /// Whether a call may go out now, and as what: a probe admitted here is taken as sent
    /// at once (a caller with a gate to pass first takes a `permit`).
    pub fn admit(&self) -> Admission {
        self.admit_locked(&mut self.inner.lock(), true)
    }

    /// `sent`: a probe admitted goes out at once; else its hung clock starts at
    /// `Permit::sent`.
    fn admit_locked(&self, s: &mut Inner, sent: bool) -> Admission {
        let now = Instant::now();
        let max_wait = Duration::from_secs(self.cfg.half_open_max_wait_seconds);
        if s.state == State::HalfOpen {
            if let Some(at) = s.probes.iter().find_map(|p| p.hung(now, max_wait)) {
                // A probe hung past its limit: a failure at the moment its limit ran out.
                self.open(s, at);
            } else {
                // A streaming probe still making progress past the maximum wait frees its
                // slot, its verdict still to come at its end: held until then, a client
                // reading a long answer slowly kept the key half-open — every other request
                // refused — for as long as it read (s27 diff attack F1). Another probe may
                // go out, no more often than once a maximum wait per slot.
                s.probes.retain(|p| {
                    p.stream.is_none()
                        || now.duration_since(p.sent.unwrap_or(p.started)) <= max_wait
                });
            }
        }
        match s.state {
            State::Closed => Admission::Call,
            State::Open if now < s.open_until => Admission::Reject(s.open_until - now),
            State::Open | State::HalfOpen => {
                if s.state == State::Open {
                    s.state = State::HalfOpen;
                    s.probe_successes = 0;
                    s.probes.clear();
                }
                if s.probes.len() < self.cfg.half_open_probes.max(1) as usize {
                    s.probes.push(Probe::new(now, sent.then_some(now)));
                    Admission::Probe
                } else {
                    Admission::Reject(Duration::from_secs(1))
                }
            }
        }
    }

    pub fn success(&self, probe: bool) {
        self.success_of(probe, None, None)
    }

    /// `own`: the probe's start time, to free its own slot (`None`: the newest); `opening`:
    /// the half-open period that admitted it (`None`: this one).
    fn success_of(&self, probe: bool, own: Option<Instant>, opening: Option<u64>) {
        let now = Instant::now();
        let mut s = self.inner.lock();
        let probe = probe && of_this_period(&s, opening);
        self.count(&mut s, now, false);
        s.consecutive_failures = 0;
        s.unanswered_probes = 0;
        if probe && s.state == State::HalfOpen {
            release(&mut s.probes, own);
            s.probe_successes += 1;
            if s.probe_successes >= self.cfg.close_after_successes.max(1) {
                s.state = State::Closed;
                s.window_calls = 0;
                s.window_failures = 0;
            }
        }
    }

    /// Records a failure; returns true when it opened the breaker.
    pub fn failure(&self, probe: bool) -> bool {
        let now = Instant::now();
        let mut s = self.inner.lock();
        self.count(&mut s, now, true);
        s.consecutive_failures += 1;
        let rate_tripped = s.window_calls >= self.cfg.min_calls.max(1)
            && f64::from(s.window_failures) >= self.cfg.failure_rate * f64::from(s.window_calls);
        let trip = match s.state {
            State::HalfOpen => probe || !s.probes.is_empty(),
            State::Closed => {
                s.consecutive_failures >= self.cfg.failure_threshold.max(1) || rate_tripped
            }
            State::Open => false,
        };
        if trip {
            self.open(&mut s, now);
        }
        trip
    }

    /// A call that ended without a verdict on the upstream before it was sent, or with an
    /// answer that says nothing of its health (429, 409): frees its probe slot.
    pub fn abandon(&self, probe: bool) {
        self.abandon_of(probe, None)
    }

    fn abandon_of(&self, probe: bool, own: Option<Instant>) {
        if probe {
            release(&mut self.inner.lock().probes, own);
        }
    }

    /// A call that went out and ended without an answer in its request's own time (the
    /// deadline cut it, or its client left) after `waited`: frees its probe slot, and the
    /// `UNANSWERED_PROBES_REOPEN`-th such probe in a row that waited long enough re-opens
    /// the breaker. Returns true when it did.
    pub fn unanswered(&self, probe: bool, waited: Duration) -> bool {
        self.unanswered_of(probe, waited, None, None)
    }

    fn unanswered_of(
        &self,
        probe: bool,
        waited: Duration,
        own: Option<Instant>,
        opening: Option<u64>,
    ) -> bool {
        if !probe {
            return false;
        }
        let mut s = self.inner.lock();
        if !of_this_period(&s, opening) {
            return false;
        }
        release(&mut s.probes, own);
        let long_enough =
            Duration::from_secs(self.cfg.half_open_max_wait_seconds) / UNANSWERED_PROBES_REOPEN;
        if s.state != State::HalfOpen || waited < long_enough {
            return false;
        }
        s.unanswered_probes += 1;
        let reopen = s.unanswered_probes >= UNANSWERED_PROBES_REOPEN;
        if reopen {
            self.open(&mut s, Instant::now());
        }
        reopen
    }

    /// Admits a call as a `Permit` that must report its outcome; one dropped without a
    /// report (its request's future was dropped: the client left mid-call) abandons it, so a
    /// half-open probe slot is freed at once rather than held for the maximum wait.
    /// `Err` is how long the breaker stays open. The permit holds its breaker: a stream's
    /// outlives the request's handler, reported when the stream ends (`Permit::streaming`).
    pub fn permit(self: &Arc<Self>) -> Result<Permit, Duration> {
        let mut s = self.inner.lock();
        let probe = match self.admit_locked(&mut s, false) {
            Admission::Reject(after) => return Err(after),
            Admission::Probe => true,
            Admission::Call => false,
        };
        // Its own start time (just pushed), so it frees its own slot, not the newest one:
        // a finished probe's time left behind would later read as a hung probe.
        let started = s.probes.last().map(|p| p.started).filter(|_| probe);
        let opening = s.openings;
        drop(s);
        Ok(Permit {
            breaker: self.clone(),
            probe,
            started,
            opening,
            sent: None,
            reported: false,
        })
    }

    fn count(&self, s: &mut Inner, now: Instant, failed: bool) {
        if now.duration_since(s.window_start) > Duration::from_secs(self.cfg.window_seconds.max(1))
        {
            s.window_start = now;
            s.window_calls = 0;
            s.window_failures = 0;
        }
        s.window_calls += 1;
        s.window_failures += u32::from(failed);
    }

    fn open(&self, s: &mut Inner, now: Instant) {
        s.openings = s.openings.wrapping_add(1);
        s.state = State::Open;
        s.open_until = now + Duration::from_secs(self.cfg.open_seconds);
        s.probes.clear();
        s.probe_successes = 0;
        s.consecutive_failures = 0;
        s.unanswered_probes = 0;
    }
}

/// One admitted call. Exactly one of `success`, `failure`, `unanswered` or `abandon`
/// reports it; if none does before it is dropped (the request's future was dropped), the
/// drop reports it as unanswered once it was `sent`, else abandons it.
#[derive(Debug)]
pub struct Permit {
    breaker: Arc<Breaker>,
    probe: bool,
    /// A probe's start time, as the breaker holds it.
    started: Option<Instant>,
    /// The breaker's `openings` when it was admitted: a streaming probe whose slot was
    /// freed past the maximum wait may end after the breaker re-opened, and its verdict
    /// then is no probe's of the later half-open period (s27 late attack L1: old slow
    /// streams ending whole closed a breaker whose new probes all failed).
    opening: u64,
    /// When the call went out to the upstream.
    sent: Option<Instant>,
    reported: bool,
}

impl Permit {
    /// The call is going out to the upstream: from here on, ending without a verdict counts
    /// toward re-opening a half-open breaker, and a probe's maximum wait runs.
    pub fn sent(&mut self) {
        let now = Instant::now();
        self.sent = Some(now);
        self.with_slot(|p| p.sent = Some(now));
    }

    /// A stream's 200: the call is answered, its verdict waits for the stream's end (a
    /// stall or an error event after the 200 is a failure, only a whole stream a success;
    /// s26 attack, streams F2). A probe keeps its slot until then, so a half-open key takes
    /// no other probe while it streams (s26 stop attack #1: one freed at its 200 let probe
    /// after probe in). A stream runs for minutes, past `half_open_max_wait_seconds`: from
    /// now the probe counts as hung only once it made no progress (`progress`) for `bound`,
    /// and past the maximum wait it frees its slot, its verdict still to come (s27 diff
    /// attack F1: a slow reader kept the key half-open for as long as it read).
    pub fn streaming(&mut self, bound: Duration) {
        self.with_slot(|p| p.stream = Some((Instant::now(), bound)));
    }

    /// A streaming probe made progress (an event read, a frame handed on): its bound
    /// runs from now. Nothing for any other call.
    pub fn progress(&self) {
        self.with_slot(|p| {
            if let Some((last, _)) = p.stream.as_mut() {
                *last = Instant::now();
            }
        });
    }

    /// Runs `f` on this probe's own slot, if it is a probe and its slot is still held (the
    /// breaker re-opening clears every slot).
    fn with_slot(&self, f: impl FnOnce(&mut Probe)) {
        let Some(started) = self.started else { return };
        let mut s = self.breaker.inner.lock();
        if let Some(p) = s.probes.iter_mut().find(|p| p.started == started) {
            f(p);
        }
    }

    fn waited(&self) -> Duration {
        self.sent.map_or(Duration::ZERO, |t| t.elapsed())
    }

    pub fn success(mut self) {
        self.reported = true;
        self.breaker
            .success_of(self.probe, self.started, Some(self.opening));
    }

    /// Returns true when this failure opened the breaker.
    pub fn failure(mut self) -> bool {
        self.reported = true;
        self.breaker.failure(self.probe)
    }

    /// Sent, but no answer within the request's own time. Returns true when this re-opened
    /// the breaker.
    pub fn unanswered(mut self) -> bool {
        self.reported = true;
        self.breaker
            .unanswered_of(self.probe, self.waited(), self.started, Some(self.opening))
    }

    /// No verdict on the upstream (a gate refused, a rate limit, a conflict).
    pub fn abandon(mut self) {
        self.reported = true;
        self.breaker.abandon_of(self.probe, self.started);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.reported {
            return;
        }
        if self.sent.is_some() {
            self.breaker
                .unanswered_of(self.probe, self.waited(), self.started, Some(self.opening));
        } else {
            self.breaker.abandon_of(self.probe, self.started);
        }
    }
}

/// Whether a probe admitted in the half-open period after opening `opening` (`None`: this
/// one) reports in that period still.
fn of_this_period(s: &Inner, opening: Option<u64>) -> bool {
    opening.is_none_or(|o| o == s.openings)
}

/// Frees a probe's slot: its own start time when known, else the newest.
fn release(probes: &mut Vec<Probe>, own: Option<Instant>) {
    match own.and_then(|t| probes.iter().position(|p| p.started == t)) {
        Some(i) => {
            probes.remove(i);
        }
        None if own.is_none() => {
            probes.pop();
        }
        // Its slot is already gone (the breaker re-opened and cleared every probe, or freed
        // a streaming probe's past the maximum wait).
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerSettings {
        BreakerSettings {
            open_seconds: 0,
            half_open_max_wait_seconds: 0,
            ..BreakerSettings::default()
        }
    }

    #[test]
    fn opens_probes_and_closes() {
        let b = Breaker::new(&BreakerSettings::default());
        assert!(!b.failure(false));
        assert!(!b.failure(false));
        assert!(b.failure(false), "third consecutive failure opens");
        assert!(matches!(b.admit(), Admission::Reject(_)));

        let b = Breaker::new(&cfg());
        for _ in 0..3 {
            b.failure(false);
        }
        assert_eq!(b.admit(), Admission::Probe, "open time over: one probe");
        b.success(true);
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.admit(), Admission::Probe);
        b.success(true);
        assert_eq!(b.state(), State::Closed, "two successes close it");
    }

    #[test]
    fn a_failed_or_hung_probe_reopens() {
        let b = Breaker::new(&BreakerSettings {
            open_seconds: 0,
            ..BreakerSettings::default()
        });
        for _ in 0..3 {
            b.failure(false);
        }
        assert_eq!(b.admit(), Admission::Probe);
        assert!(
            matches!(b.admit(), Admission::Reject(_)),
            "one probe at a time"
        );
        assert!(b.failure(true));
        assert_eq!(b.state(), State::Open);

        let hung = Breaker::new(&cfg());
        for _ in 0..3 {
            hung.failure(false);
        }
        assert_eq!(hung.admit(), Admission::Probe);
        std::thread::sleep(Duration::from_millis(5));
        // The probe never reported back; the next admission sees it expired and re-opens,
        // then (open time 0) lets a fresh probe through.
        assert_eq!(hung.admit(), Admission::Probe);
    }

    #[test]
    fn a_dropped_probe_frees_its_slot() {
        let b = Arc::new(Breaker::new(&BreakerSettings {
            open_seconds: 0,
            ..BreakerSettings::default()
        }));
        for _ in 0..3 {
            b.failure(false);
        }
        let probe = b.permit().expect("a probe");
        assert!(b.permit().is_err(), "one probe at a time");
        drop(probe);
        let again = b.permit().expect("the slot is free again at once");
        again.success();
        assert_eq!(b.state(), State::HalfOpen);
    }

    /// A breaker opened by three failures, half-open at once (open time 0), closed by one
    /// success, with a maximum probe wait of 1 s.
    fn half_open_after_failures() -> Arc<Breaker> {
        let b = Arc::new(Breaker::new(&BreakerSettings {
            open_seconds: 0,
            close_after_successes: 1,
            half_open_max_wait_seconds: 1,
            ..cfg()
        }));
        for _ in 0..3 {
            b.failure(false);
        }
        b
    }

    /// s30 upstream attack F3: a probe's maximum wait runs from its send, not its admission
    /// — one waiting at its key's concurrency gate meanwhile sent nothing that could hang.
    #[test]
    fn a_probe_not_sent_yet_is_not_hung() {
        let b = half_open_after_failures();
        let mut probe = b.permit().expect("a probe");
        std::thread::sleep(Duration::from_millis(1100));
        assert!(b.permit().is_err(), "its slot is held, not taken for hung");
        assert_eq!(b.state(), State::HalfOpen);
        probe.sent();
        assert!(b.permit().is_err(), "sent: its maximum wait starts now");
        std::thread::sleep(Duration::from_millis(1100));
        let next = b
            .permit()
            .expect("hung once sent: re-opened, and a fresh probe (open 0)");
        probe.success();
        assert_eq!(
            b.state(),
            State::HalfOpen,
            "the hung probe's period is over"
        );
        next.success();
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn a_streaming_probe_holds_its_slot_while_it_progresses_and_counts_at_its_end() {
        let b = half_open_after_failures();
        let mut probe = b.permit().expect("a probe");
        probe.sent();
        probe.streaming(Duration::from_millis(200));
        // Within the maximum wait (1 s here), progressing: its slot held.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(50));
            probe.progress();
            assert!(
                b.permit().is_err(),
                "one probe at a time, also while it streams"
            );
            assert_eq!(b.state(), State::HalfOpen, "a 200 is no success yet");
        }
        // Past it, still progressing: no hung probe, but its slot is freed for another
        // (s27 diff attack F1: a slow reader held it for as long as it read).
        std::thread::sleep(Duration::from_millis(900));
        probe.progress();
        let other = b.permit().expect("the slot freed past the maximum wait");
        assert!(b.permit().is_err(), "one slot, taken by the other probe");
        other.abandon();
        assert_eq!(b.state(), State::HalfOpen);
        probe.success();
        assert_eq!(b.state(), State::Closed, "the whole stream closes it");
        for _ in 0..3 {
            b.failure(false);
        }
        let mut probe = b.permit().expect("a probe");
        probe.streaming(Duration::from_millis(200));
        assert!(
            probe.failure(),
            "a stream that fails after its 200 re-opens it"
        );
        assert_eq!(b.state(), State::Open);
        // A stream that makes no progress for its bound is a hung probe.
        let mut probe = b.permit().expect("a probe");
        probe.streaming(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(40));
        let next = b
            .permit()
            .expect("the hung probe re-opened it; open time 0: a new probe");
        next.abandon();
        probe.abandon();
    }

    /// A streaming probe freed past the maximum wait that ends whole after the breaker
    /// re-opened is no probe of the next half-open period: it closes nothing (s27 late
    /// attack L1: old slow streams closed a breaker whose new probes all failed).
    #[test]
    fn a_freed_probe_from_before_a_reopen_does_not_close_the_next_half_open() {
        let b = half_open_after_failures();
        let mut old = b.permit().expect("a probe");
        old.sent();
        old.streaming(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1100));
        old.progress();
        let failing = b.permit().expect("the slot freed past the maximum wait");
        assert!(failing.failure(), "its failure re-opens the breaker");
        let mut next = b.permit().expect("open time 0: the next period's probe");
        next.sent();
        old.success();
        assert_eq!(b.state(), State::HalfOpen, "the old stream closes nothing");
        assert!(next.failure());
        assert_eq!(b.state(), State::Open);
    }

    #[test]
    fn probes_left_unanswered_in_a_row_reopen_it() {
        let b = Arc::new(Breaker::new(&BreakerSettings {
            open_seconds: 0,
            ..BreakerSettings::default()
        }));
        for _ in 0..3 {
            b.failure(false);
        }
        // Probes shorter than a third of the maximum wait count for nothing, however many.
        for _ in 0..10 {
            let mut p = b.permit().expect("a probe");
            p.sent();
            assert!(!p.unanswered(), "a short deadline re-opens nothing");
        }
        // Sent long enough ago (a third of the 30 s maximum wait) to count.
        let long_ago = || Some(Instant::now() - Duration::from_secs(11));
        // A success between unanswered probes resets the count.
        for _ in 0..UNANSWERED_PROBES_REOPEN - 1 {
            let mut p = b.permit().expect("a probe");
            p.sent = long_ago();
            assert!(!p.unanswered(), "one slow client re-opens nothing");
        }
        b.permit().expect("a probe").success();
        // Dropped before it was sent (a gate refused it): not counted.
        drop(b.permit().expect("a probe"));
        for n in 1..=UNANSWERED_PROBES_REOPEN {
            let mut p = b.permit().expect("the slot is free again");
            p.sent = long_ago();
            // The last one's client leaves: its permit is dropped mid-call.
            if n < UNANSWERED_PROBES_REOPEN {
                assert!(!p.unanswered());
            } else {
                drop(p);
            }
        }
        assert_eq!(
            b.state(),
            State::Open,
            "a hung upstream cannot keep it half-open"
        );
    }

    #[test]
    fn a_high_failure_rate_opens_it() {
        let b = Breaker::new(&BreakerSettings {
            failure_threshold: 100,
            min_calls: 10,
            failure_rate: 0.5,
            ..BreakerSettings::default()
        });
        let mut opened = false;
        for _ in 0..10 {
            b.success(false);
            opened |= b.failure(false);
        }
        assert!(opened);
    }
}

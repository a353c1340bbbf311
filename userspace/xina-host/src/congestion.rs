//! Congestion control: how many chunks a worker keeps open.
//!
//! A job's slots bound how far ahead of the slowest rank a worker may run;
//! they say nothing about what the path between the worker and the switch
//! takes. A window of every slot queues behind a slow link: 64 chunks of
//! 9 KB wait 9 ms behind a 500 Mbit/s port, round trips grow faster than
//! the retransmission timeout follows them, and chunks that were only
//! queued go again and take link capacity of their own. [`Window`] keeps
//! the chunks a worker has open (sent, result not in) to what the path
//! carries without a standing queue.
//!
//! # The signal: the round trip of a result
//!
//! The acknowledgement of this protocol is the switch's result, and its
//! round trip (from sending a contribution to receiving the result) is the
//! one signal every worker has on every path, XDP switch or P4 switch, shaped
//! or not, without anything new on the wire. The window follows it in the
//! manner of Swift (Kumar et al., SIGCOMM 2020): it grows while round trips
//! stay under a target and shrinks, at most once per round trip and in
//! proportion to the excess, when they exceed it.
//!
//! - **Target.** The lowest round trip of a full chunk (`base`) plus a
//!   headroom of `base` itself or [`Config::queue_target`], whichever is
//!   larger: a queue of about one bandwidth-delay product keeps a link busy,
//!   and the floor keeps a worker on a shared CPU (where a few scheduling
//!   delays, not a link, make the round trip) from shrinking its window to
//!   nothing. A window below the slots adds up to one more headroom, the
//!   more the smaller it is (Swift's flow scaling): jobs whose `base` was
//!   measured with different queues in the way would otherwise settle where
//!   the one with the higher target starves the other (two jobs sharing
//!   500 Mbit/s links: Jain's index 0.86 without it, 0.97-0.99 with it).
//! - **Growth.** One chunk per result in slow start (the window doubles
//!   every round trip) until the first decrease, then one chunk per window
//!   of results (additive increase). It grows only while the window is what
//!   holds the worker back, so a run of small calls does not inflate it.
//! - **Decrease.** When even the lowest round trip of a whole round (one
//!   smoothed round trip of results) exceeded the target, by
//!   `1 - 0.8 · (rtt - target) / rtt` of that lowest one, at least halving,
//!   at most once per round. A queue delays every chunk of a round; a loss
//!   delays only the chunks that waited for some rank's recovery, and those
//!   must not shrink the window (at 5% loss and 8 ranks most chunks wait
//!   for one). AIMD converges to equal shares for workers of different jobs
//!   behind one port (Chiu and Jain, 1989).
//! - **Bounds.** At least one chunk, at most the job's slots.
//!
//! Loss alone does not shrink the window. In an aggregation protocol one
//! frame lost in a chunk's `2n` (n contributions, n result copies) holds the
//! chunk back for every rank: 1% of frames lost at 8 ranks stalls about 15%
//! of chunks, and a window that halved on each would be a handful of chunks
//! however fast the path. A queue that overflows shows in the round trip
//! first; a stall (a second timeout in a row with no result at all for a
//! whole timeout) halves the window, once per round trip, in case it did
//! not.
//!
//! What this is not (yet): DCTCP-style marks from the switch or the links
//! (the switch cannot see the queues of the ports it sends to), pacing
//! (a window opens one chunk per result, which spaces sends by arrivals).
//!
//! The state lives as long as the worker ([`Engine::with_window`]), like its
//! round-trip estimate, so each call starts with the window the last one
//! ended with.
//!
//! [`Config::queue_target`]: crate::engine::Config::queue_target
//! [`Engine::with_window`]: crate::engine::Engine::with_window

use std::time::{Duration, Instant};

/// The window a worker starts with, in chunks.
pub const INITIAL_WINDOW: f64 = 4.0;

/// How strongly a decrease follows the excess over the target (Swift's β).
const BETA: f64 = 0.8;

/// The largest fraction one decrease takes off.
const MAX_DECREASE: f64 = 0.5;

/// The smallest window, in chunks.
pub const MIN_WINDOW: f64 = 1.0;

/// A round trip, as the window takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// From sending a chunk to receiving its result.
    pub rtt: Duration,
    /// The smoothed round trip: decreases are at least this far apart.
    pub srtt: Duration,
    /// The chunk's payload bytes.
    pub bytes: usize,
}

/// The target round trip of a window of `cwnd` chunks out of `slots`:
/// `base` plus a headroom of `max(base, queue_target)`, plus up to that
/// headroom again the smaller the window is (Swift's flow scaling:
/// `1/√cwnd`, all of it at one chunk, none at every slot), so that of two
/// jobs behind one queue the one with the smaller window tolerates more of
/// it and grows while the other shrinks.
fn target(base: Duration, queue_target: Duration, cwnd: f64, slots: u32) -> Duration {
    let headroom = base.max(queue_target);
    let most = 1.0 / f64::from(slots.max(2)).sqrt();
    let scale = ((1.0 / cwnd.max(1.0).sqrt() - most) / (1.0 - most)).clamp(0.0, 1.0);
    base + headroom + headroom.mul_f64(scale)
}

/// A worker's congestion window (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Chunks that may be open, fractional between whole steps.
    cwnd: f64,
    /// Whether the window still doubles every round trip.
    slow_start: bool,
    /// The lowest round trip of a chunk of `bytes`.
    base: Option<Duration>,
    /// The longest chunk (payload bytes) a round trip came from.
    bytes: usize,
    /// The round (one smoothed round trip of results) under way: when it
    /// began and its lowest round trip.
    round: Option<(Instant, Duration)>,
    /// When the window last shrank.
    last_decrease: Option<Instant>,
    /// How many times it shrank.
    decreases: u64,
}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    /// A window of [`INITIAL_WINDOW`] chunks in slow start.
    pub const fn new() -> Self {
        Self {
            cwnd: INITIAL_WINDOW,
            slow_start: true,
            base: None,
            bytes: 0,
            round: None,
            last_decrease: None,
            decreases: 0,
        }
    }

    /// The window in chunks, fractional.
    pub const fn chunks(&self) -> f64 {
        self.cwnd
    }

    /// How many chunks may be open with `slots` slots: the window's whole
    /// part, at least one, at most `slots`.
    pub fn limit(&self, slots: u32) -> usize {
        // The window is at least MIN_WINDOW and at most slots (a u32).
        (self.cwnd.floor() as usize).clamp(1, slots as usize)
    }

    /// The lowest round trip seen.
    pub const fn base(&self) -> Option<Duration> {
        self.base
    }

    /// The round trip above which the window shrinks, with `slots` slots.
    pub fn target(&self, queue_target: Duration, slots: u32) -> Option<Duration> {
        self.base
            .map(|base| target(base, queue_target, self.cwnd, slots))
    }

    /// How many times the window has shrunk.
    pub const fn decreases(&self) -> u64 {
        self.decreases
    }

    /// Whether the window still doubles every round trip.
    pub const fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    /// Takes the result of a chunk sent once at `now`: `full` says whether
    /// the window held the worker back (as many chunks open as it allows)
    /// when it arrived.
    ///
    /// The lowest round trip is that of the longest chunks seen: on a slow
    /// link a short chunk (a call check, the last one of a call) comes back
    /// far sooner, and a target set by it would hold every full chunk
    /// above it.
    pub fn on_result(
        &mut self,
        now: Instant,
        sample: Sample,
        full: bool,
        slots: u32,
        queue_target: Duration,
    ) {
        let Sample { rtt, srtt, bytes } = sample;
        if bytes > self.bytes {
            self.bytes = bytes;
            self.base = None;
        }
        let base = match self.base {
            Some(b) if bytes < self.bytes => b,
            Some(b) => b.min(rtt),
            None => rtt,
        };
        self.base = Some(base);
        let target = target(base, queue_target, self.cwnd, slots);
        if rtt <= target && full {
            self.cwnd += if self.slow_start {
                1.0
            } else {
                1.0 / self.cwnd
            };
            self.cwnd = self.cwnd.min(f64::from(slots));
        }
        match self.round {
            Some((start, lowest)) if now.saturating_duration_since(start) < srtt => {
                self.round = Some((start, lowest.min(rtt)));
            }
            ended => {
                if let Some((_, lowest)) = ended
                    && lowest > target
                    && self.may_decrease(now, srtt)
                {
                    let excess = (lowest - target).as_secs_f64() / lowest.as_secs_f64();
                    self.shrink(now, (1.0 - BETA * excess).max(1.0 - MAX_DECREASE));
                }
                self.round = Some((now, rtt));
            }
        }
    }

    /// A timeout that found no result for a whole timeout: halves the window
    /// (at most once per smoothed round trip `srtt`).
    pub fn on_stall(&mut self, now: Instant, srtt: Duration) {
        if self.may_decrease(now, srtt) {
            self.shrink(now, 1.0 - MAX_DECREASE);
        }
    }

    fn may_decrease(&self, now: Instant, srtt: Duration) -> bool {
        self.last_decrease
            .is_none_or(|t| now.saturating_duration_since(t) >= srtt)
    }

    fn shrink(&mut self, now: Instant, factor: f64) {
        self.cwnd = (self.cwnd * factor).max(MIN_WINDOW);
        self.slow_start = false;
        self.last_decrease = Some(now);
        self.decreases += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn result(w: &mut Window, now: Instant, rtt: Duration, full: bool) {
        let sample = Sample {
            rtt,
            srtt: 2 * MS,
            bytes: 1000,
        };
        w.on_result(now, sample, full, 64, MS);
    }

    #[test]
    fn slow_start_doubles_the_window_each_round_trip_while_it_is_full() {
        let mut w = Window::new();
        let t = Instant::now();
        for _ in 0..4 {
            result(&mut w, t, MS, true);
        }
        assert_eq!(w.limit(64), 8, "four results of a full window of four");
        result(&mut w, t, MS, false);
        assert_eq!(w.limit(64), 8, "a window that held nothing back stays");
        for _ in 0..100 {
            result(&mut w, t, MS, true);
        }
        assert_eq!(w.limit(64), 64, "never above the slots");
        assert_eq!(w.limit(16), 16);
        assert!(w.in_slow_start());
    }

    #[test]
    fn rounds_whose_every_round_trip_exceeds_the_target_shrink_it() {
        let mut w = Window::new();
        let t = Instant::now();
        for _ in 0..28 {
            result(&mut w, t, MS, true);
        }
        assert_eq!(w.limit(64), 32);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // Rounds last 2 ms (the smoothed round trip). The first one had
        // 1 ms round trips: no decrease when it ends.
        result(&mut w, t + 2 * MS, 4 * MS, true);
        assert!(near(w.chunks(), 32.0), "{}", w.chunks());
        // The second round's lowest is 4 ms; base 1 ms, target about 2 ms:
        // about 2 ms over, 0.8 * 2/4 = 40% off when it ends.
        result(&mut w, t + 3 * MS, 40 * MS, true);
        assert!(near(w.chunks(), 32.0), "{}", w.chunks());
        result(&mut w, t + 4 * MS, 40 * MS, true);
        let over = (4 * MS - target(MS, MS, 32.0, 64)).as_secs_f64() / 0.004;
        let shrunk = 32.0 * (1.0 - 0.8 * over);
        assert!(near(w.chunks(), shrunk), "{} {shrunk}", w.chunks());
        assert!((19.0..20.0).contains(&shrunk), "{shrunk}");
        assert!(!w.in_slow_start());
        // A far larger excess takes half, not more.
        result(&mut w, t + 6 * MS, 40 * MS, true);
        assert!(near(w.chunks(), shrunk / 2.0), "{}", w.chunks());
        assert_eq!(w.decreases(), 2);
    }

    #[test]
    fn a_round_with_one_prompt_result_does_not_shrink_it() {
        // Under loss many results wait for another rank's recovery; the
        // chunks that did not keep the window.
        let mut w = Window::new();
        let t = Instant::now();
        result(&mut w, t, MS, true);
        for i in 1..20 {
            let rtt = if i % 2 == 0 { MS } else { 30 * MS };
            result(&mut w, t + i * MS, rtt, true);
        }
        assert_eq!(w.decreases(), 0);
        assert!(w.chunks() > 4.0, "{}", w.chunks());
    }

    #[test]
    fn after_slow_start_it_grows_by_one_chunk_per_window() {
        let mut w = Window::new();
        let t = Instant::now();
        for _ in 0..6 {
            result(&mut w, t, MS, true);
        }
        result(&mut w, t + 2 * MS, 10 * MS, true);
        result(&mut w, t + 4 * MS, 10 * MS, true);
        assert_eq!(w.chunks(), 5.0, "halved from 10");
        for _ in 0..5 {
            result(&mut w, t + 4 * MS, MS, true);
        }
        assert!((w.chunks() - 6.0).abs() < 0.1, "{}", w.chunks());
    }

    #[test]
    fn the_target_is_the_lowest_round_trip_plus_the_larger_headroom() {
        let us = Duration::from_micros(1);
        // A full window: the plain headroom.
        assert_eq!(target(300 * us, MS, 64.0, 64), 1300 * us);
        assert_eq!(target(10 * MS, MS, 64.0, 64), 20 * MS, "a long path's own");
        // One chunk: twice the headroom; in between, more for less.
        assert_eq!(target(300 * us, MS, 1.0, 64), 2300 * us);
        let mut last = Duration::ZERO;
        for cwnd in [64.0, 32.0, 8.0, 2.0, 1.0] {
            let t = target(300 * us, MS, cwnd, 64);
            assert!(t > last || cwnd == 64.0, "{cwnd}: {t:?}");
            last = t;
        }

        let mut w = Window::new();
        let t = Instant::now();
        assert_eq!(w.target(MS, 64), None);
        result(&mut w, t, 300 * us, true);
        result(&mut w, t, 5 * MS, true);
        assert_eq!(w.base(), Some(300 * us), "the lowest");
        assert_eq!(w.target(MS, 64), Some(target(300 * us, MS, w.chunks(), 64)));
    }

    #[test]
    fn a_stall_halves_it_down_to_one_chunk() {
        let mut w = Window::new();
        let t = Instant::now();
        w.on_stall(t, MS);
        assert_eq!(w.chunks(), 2.0);
        w.on_stall(t, MS);
        assert_eq!(w.chunks(), 2.0, "once per round trip");
        w.on_stall(t + MS, MS);
        w.on_stall(t + 2 * MS, MS);
        assert_eq!(w.chunks(), MIN_WINDOW);
        assert_eq!(w.limit(64), 1);
    }
}

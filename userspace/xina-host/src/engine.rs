//! The sans-IO collective engine.
//!
//! [`Engine`] is a state machine for one collective call (allreduce, reduce,
//! reduce-scatter or barrier) over one buffer of int32 or int64 elements. It
//! owns no socket and reads no clock: the driver feeds it received datagrams
//! ([`Engine::handle_packet`]) and timer expiries ([`Engine::handle_timeout`]),
//! always with the current time, and asks it for datagrams to send
//! ([`Engine::poll_transmit`]) and for the next deadline
//! ([`Engine::poll_timeout`]). The UDP [`Worker`](crate::Worker), the tokio
//! [`AsyncWorker`](crate::AsyncWorker) and the simulated network of
//! [`sim`](crate::sim) drive the same engine.
//!
//! # The call check
//!
//! Every call starts with a few chunks of its own, the *call check*: eight
//! small numbers that encode the collective, its root and the buffer length
//! (four 12-bit digits), sent so that the switch's combination tells every
//! rank whether all ranks made the same call. With a sum the check sends the
//! numbers `v` and their squares, and every rank expects `n·v` and `n·v²`
//! (equal sums of values and of squares mean equal values); with max or min it
//! sends `v` and `-v` and expects them back. A mismatch fails the call on every
//! rank that receives the check's result with [`Error::CallMismatch`] instead
//! of combining unrelated chunks in silence. The check costs one chunk per
//! call (more when a packet holds fewer than eight elements, and one per rank
//! in reduce-scatter, where each rank only sees the chunks it is root of); it
//! travels with the first data chunks, so it adds no round trip.
//!
//! # Chunks, slots and the window
//!
//! The buffer is cut into chunks of `elems_per_packet` elements (the last one
//! may be shorter). Chunk `k` of a call whose first chunk number is `first`
//! has the chunk number `c = first + k` (a `u64` that grows over the worker's
//! lifetime); it travels with the sequence number `c mod 2^32`, in slot
//! `c mod W` of the job's `W` slots, in copy `(c / W) mod 2` of that slot.
//! Until the sequence number wraps this is the switch contract's
//! `slot = s % W`, `version = (s / W) % 2`; deriving slot and version from the
//! 64-bit chunk number keeps them continuous across the wrap even when `W`
//! does not divide 2^32.
//!
//! Chunk `c` is sent only once the result of chunk `c - W` has arrived. Sending
//! `c` resets the slot copy that held `c - 2W`; every rank has that result
//! already, because every rank contributed to `c - W` and a rank contributes to
//! `c - W` only after receiving the result of `c - 2W`. The other copy still
//! holds `c - W`'s result for ranks that lost it and retransmit. So at most `W`
//! chunks are outstanding. On top of that the worker's congestion window
//! ([`crate::congestion`]) bounds how many are open (sent, result not in),
//! by what the path carries without a standing queue.
//!
//! # Reliability
//!
//! Every sent chunk has a retransmission timeout. Its first value comes from a
//! [`RttEstimator`] (RFC 6298 smoothing of the time from sending a chunk to
//! receiving its result, sampled only from chunks sent once, clamped to
//! `min_rto..=max_rto`; before the first sample of a chunk as long,
//! `initial_rto`; backed off after a timeout until the next result (the next
//! sample before any); see
//! [`RttEstimator`]). A first copy times out only once no result at all has
//! come for its timeout (as TCP restarts its timer on every new
//! acknowledgement), so chunks queued behind others are not resent. While the
//! chunk is open and sent once, a result that makes the estimate's timeout
//! longer lengthens the chunk's too, counted from its send time (as TCP
//! re-arms its timer on every acknowledgement): a round trip that grows
//! with a queue would otherwise time out chunks that are only queued. Each
//! retransmission of that chunk doubles it, up to `max_rto`. A retransmission
//! carries [`Flags::RETRANSMIT`]; the switch answers it from the slot's stored
//! result ([`Flags::FROM_CACHE`]) when the chunk is already complete, or
//! counts it in when the first copy was lost. When no new result has arrived
//! for `give_up`, the call fails with [`Error::GaveUp`] listing the outstanding
//! sequence numbers.
//!
//! Losses are also found without waiting for a timeout, in the manner of
//! TCP's RACK (RFC 8985): every rank sends its chunks in order, so when the
//! result of a chunk sent once at time `t` arrives, every rank had sent its
//! contributions to the chunks this rank sent before `t`; one of those still
//! without a result had a contribution or its result lost (or overtaken), and
//! it goes again at once if its last copy went more than a reordering
//! allowance (a quarter of the smoothed round trip at first, growing each
//! time such a retransmission proves unneeded) before `t`. The rule holds
//! for retransmissions too, as RACK judges the latest transmission: every
//! rank sends its retransmissions before any new chunk, so a rank whose
//! contribution was lost had resent it before it sent the chunk that came
//! back, and a retransmission still unanswered then was lost as well (its
//! own or that rank's) — without this, a lost retransmission cost a
//! doubled timeout. A rank whose contribution is in and waits for another's
//! recovery resends too, once per round trip at most, while that rank has
//! not yet resent. Such a retransmission keeps its timeout as it was; only a
//! timeout doubles it. A spurious one costs a datagram: the switch ignores
//! a contribution it has, and answers one for a complete chunk from the
//! slot. A result that comes back sooner after a retransmission than the
//! lowest round trip answered an earlier copy: the retransmission is
//! counted as unneeded ([`Stats::spurious`]), and the first copy's round
//! trip is sampled if it was the only earlier one. Like TCP after a new
//! acknowledgement, each new result also takes back the backoff of the
//! chunks still open, so that one whose own result is lost after a long wait
//! for another rank is not left waiting out a doubled timeout.
//!
//! Where no later result comes to reveal a loss — the tail of a call, or a
//! window whose every chunk waits for something lost (its retransmission
//! too, at 5% loss) — an open first copy goes again as a *probe* (RFC 8985,
//! 7's tail-loss probe, here wherever the results stop) when no result has
//! come for `max(2 × smoothed round trip, probe_floor)` since it was sent or
//! since the last result, whichever is later; once per chunk, without
//! doubling its timeout. A one-chunk call (an 8-byte allreduce) whose
//! contribution or result was lost then waits about two round trips, not
//! the 5 ms timeout floor, and a stalled window starts again as soon. A
//! probe whose chunk was complete is answered from the slot; one whose
//! chunk waits for another rank costs a datagram (that rank probes too).
//! While results flow, none fires; outside the tail, none fires unless a
//! chunk went again on evidence of a loss within [`LOSS_MEMORY`]: without
//! loss, results pause when a rank is not scheduled (8 ranks on 2 CPUs:
//! often for longer than two round trips), and probing then resent up to
//! 1% of the chunks for nothing.
//!
//! A result carrying [`Flags::OVERFLOW`] makes the call fail
//! with [`Error::Overflow`] once every chunk is complete (the engine keeps
//! going so that the other ranks, which see the same overflow, are not left
//! waiting for its contributions).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use xina_proto::header::HEADER_LEN;
use xina_proto::{DType, Flags, Kind, MAX_FRAME_PAYLOAD, MAX_RANKS, Op, Packet, Repr};

use crate::congestion::{Sample, Window};
use crate::error::{Error, SeqList};

/// The largest window (slots per job) the engine accepts.
///
/// It keeps the slot index clear of the header's version bit and keeps `2W`
/// (the distance between two chunks sharing a slot copy) far below 2^31, the
/// horizon of the switch's wrapping sequence comparison. A switch with more
/// slots than this for one job would need over 32 GiB of slot memory.
pub const MAX_WINDOW: u32 = 1 << 24;

/// The longest datagram any engine writes: a header and the largest payload
/// ([`MAX_FRAME_PAYLOAD`] bytes: 16,128 int32 or 8,064 int64). A job's own
/// datagrams are at most [`datagram_len`] of its elements per packet.
pub const MAX_DATAGRAM_LEN: usize = HEADER_LEN + MAX_FRAME_PAYLOAD;

/// The longest datagram of a job with `elems_per_packet` elements of `dtype`
/// per packet (what a result can be, too).
pub const fn datagram_len(dtype: DType, elems_per_packet: u16) -> usize {
    HEADER_LEN + dtype.size() * elems_per_packet as usize
}

/// An element type the switch combines: `i32` or `i64`.
///
/// Floats travel as one of these (see [`crate::float`]).
pub trait Element: Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    /// The wire type.
    const DTYPE: DType;
    /// Reads a big-endian element from the first `DTYPE.size()` bytes.
    fn read(bytes: &[u8]) -> Self;
    /// Writes the element big-endian into the first `DTYPE.size()` bytes.
    fn write(self, out: &mut [u8]);
    /// The element with a value that fits every element type.
    fn from_i32(value: i32) -> Self;
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn read(bytes: &[u8]) -> Self {
        Self::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
    fn write(self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.to_be_bytes());
    }
    fn from_i32(value: i32) -> Self {
        value
    }
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn read(bytes: &[u8]) -> Self {
        let mut raw = [0; 8];
        raw.copy_from_slice(&bytes[..8]);
        Self::from_be_bytes(raw)
    }
    fn write(self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.to_be_bytes());
    }
    fn from_i32(value: i32) -> Self {
        Self::from(value)
    }
}

/// How the switch delivers a job's completed chunks; fixed per job when the
/// control plane installs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every member gets every result.
    #[default]
    Allreduce,
    /// The chunk's root gets the result, the others a payload-less notice.
    Reduce,
    /// Like `Reduce`, each chunk naming its own root.
    ReduceScatter,
}

impl Mode {
    /// The name used in configs and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Reduce => "reduce",
            Self::ReduceScatter => "reduce-scatter",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The collective one [`Engine`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the combination of all buffers (an allreduce job).
    Allreduce,
    /// Rank `root` ends with the combination; the others' buffers are left
    /// as they were (a reduce job).
    Reduce {
        /// The rank that receives the result.
        root: u8,
    },
    /// The buffer is cut into `fan_in` equal parts; rank `r` ends with the
    /// combination of part `r` in place, the other parts are left as they
    /// were (a reduce-scatter job).
    ReduceScatter,
    /// No data: returns once every rank has called it (any job mode).
    Barrier,
    /// Every rank ends with the combination of all buffers, whatever the
    /// job's mode: an allreduce in allreduce mode; in the reduce modes the
    /// buffer goes to the switch once per rank, each time with that rank as
    /// the root, so it costs `fan_in` times the traffic — for small buffers,
    /// such as the scale agreement of float calls.
    Share,
}

impl Collective {
    /// The name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Reduce { .. } => "reduce",
            Self::ReduceScatter => "reduce-scatter",
            Self::Barrier => "barrier",
            Self::Share => "share",
        }
    }

    /// The job mode the collective needs, `None` for any.
    pub const fn mode(self) -> Option<Mode> {
        match self {
            Self::Allreduce => Some(Mode::Allreduce),
            Self::Reduce { .. } => Some(Mode::Reduce),
            Self::ReduceScatter => Some(Mode::ReduceScatter),
            Self::Barrier | Self::Share => None,
        }
    }

    /// The number the call check carries for the collective and its root.
    const fn code(self) -> i32 {
        match self {
            Self::Allreduce => 1,
            Self::Reduce { root } => 2 + 4 * root as i32,
            Self::ReduceScatter => 3,
            Self::Barrier => 0,
            Self::Share => 4 * 64 + 2,
        }
    }
}

/// One worker's place in a job: everything the engine needs to know about the
/// job, none of it about addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// The job (tenant) id installed on the switch.
    pub job: u32,
    /// This worker's rank, below `fan_in`.
    pub rank: u8,
    /// How many ranks contribute to every chunk (1..=64).
    pub fan_in: u8,
    /// Elements per packet, `E` (1 to 360 int32 or 180 int64); the same on
    /// every rank.
    pub elems_per_packet: u16,
    /// The job's aggregator slots, `W`: the window (1..=[`MAX_WINDOW`]).
    pub slots: u32,
    /// How the switch combines the job's elements.
    pub op: Op,
    /// The job's element type.
    pub dtype: DType,
    /// How the switch delivers the job's results.
    pub mode: Mode,
}

impl Member {
    /// Checks the ranges of every field.
    ///
    /// # Errors
    /// [`Error::InvalidFanIn`], [`Error::RankOutOfRange`],
    /// [`Error::InvalidElemsPerPacket`] or [`Error::InvalidWindow`].
    pub fn validate(&self) -> Result<(), Error> {
        let Self {
            job,
            rank,
            fan_in,
            elems_per_packet,
            slots,
            dtype,
            ..
        } = *self;
        if fan_in == 0 || usize::from(fan_in) > MAX_RANKS {
            return Err(Error::InvalidFanIn { job, fan_in });
        }
        if rank >= fan_in {
            return Err(Error::RankOutOfRange { job, rank, fan_in });
        }
        if elems_per_packet == 0 || usize::from(elems_per_packet) > dtype.max_elems() {
            return Err(Error::InvalidElemsPerPacket {
                job,
                elems_per_packet,
                dtype,
            });
        }
        if slots == 0 || slots > MAX_WINDOW {
            return Err(Error::InvalidWindow { job, slots });
        }
        Ok(())
    }

    /// The slot index and the slot copy (version bit) of chunk number `chunk`.
    ///
    /// # Panics
    /// If `slots` is 0.
    pub fn slot_of(&self, chunk: u64) -> (u32, bool) {
        let w = u64::from(self.slots);
        let index = u32::try_from(chunk % w).expect("the remainder is below a u32 window");
        (index, (chunk / w) % 2 == 1)
    }

    /// The sequence number chunk number `chunk` travels with: its low 32 bits.
    pub const fn seq_of(chunk: u64) -> u32 {
        // Truncation is the point: the wire sequence number wraps.
        chunk as u32
    }
}

/// Timing parameters of the reliability engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The retransmission timeout before any round trip has been measured,
    /// and at least the timeout of a chunk longer than any measured: it
    /// must exceed the round trip of the first window of full chunks (four
    /// 64 KB chunks back to back take 26 ms to come back over 100 Mbit/s).
    pub initial_rto: Duration,
    /// The floor of a timeout computed from measured round trips.
    pub min_rto: Duration,
    /// The ceiling of every timeout, backoff included.
    pub max_rto: Duration,
    /// How long to wait for any new result before failing with
    /// [`Error::GaveUp`].
    pub give_up: Duration,
    /// Headroom bits of float sums' fixed-point scale; `None` for the safe
    /// `⌈log₂ fan_in⌉`, which cannot overflow (see [`crate::float`]).
    pub float_headroom_bits: Option<u8>,
    /// The shortest wait before a probe: an open first copy goes again after
    /// `max(2 × smoothed round trip, probe_floor)` without any result (see
    /// the module docs).
    pub probe_floor: Duration,
    /// Congestion control: the queueing a worker's window lets build, as
    /// round trip above the lowest one seen (the larger of this and that
    /// lowest round trip; see [`crate::congestion`]). `None` turns it off:
    /// every call keeps all of the job's slots open.
    pub queue_target: Option<Duration>,
}

impl Default for Config {
    /// 100 ms initial timeout, 5 ms floor, 500 ms ceiling, give up after 5 s;
    /// congestion control with a 1 ms queue target.
    ///
    /// The floor sits well above the round trip through a software switch
    /// (tens to hundreds of microseconds) because a worker thread that is not
    /// scheduled for a few milliseconds would otherwise retransmit chunks
    /// whose results are merely unread: on a 2-core machine with 4 workers a
    /// 1 ms floor caused about one spurious retransmission per 10 chunks.
    fn default() -> Self {
        Self {
            initial_rto: Duration::from_millis(100),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_millis(500),
            give_up: Duration::from_secs(5),
            float_headroom_bits: None,
            probe_floor: Duration::from_millis(1),
            queue_target: Some(Duration::from_millis(1)),
        }
    }
}

impl Config {
    /// Checks that the timeouts are positive and ordered
    /// (`0 < min_rto <= initial_rto <= max_rto`, `give_up > 0`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first violated rule.
    pub fn validate(&self) -> Result<(), Error> {
        let problem = if self.min_rto.is_zero() {
            "min_rto must be positive"
        } else if self.initial_rto < self.min_rto {
            "initial_rto must be at least min_rto"
        } else if self.max_rto < self.initial_rto {
            "max_rto must be at least initial_rto"
        } else if self.give_up.is_zero() {
            "give_up must be positive"
        } else if self.float_headroom_bits.is_some_and(|h| h > 30) {
            "float_headroom_bits must be at most 30"
        } else if self.probe_floor > self.min_rto {
            "probe_floor must be at most min_rto"
        } else if self.queue_target.is_some_and(|t| t.is_zero()) {
            "queue_target must be positive (None turns congestion control off)"
        } else {
            return Ok(());
        };
        Err(Error::InvalidConfig { problem })
    }
}

/// Round-trip estimation in the manner of RFC 6298, over the time from sending
/// a chunk to receiving its result (which includes waiting for the slowest
/// rank, exactly what a timeout must not fire before).
///
/// One difference: a sample more than [`OUTLIER_FACTOR`] times the smoothed
/// round trip is set aside, unless [`OUTLIER_RUN`] such samples come in a
/// row (then the path really got slower and the estimate follows). Under loss
/// many chunks complete only after another rank recovered its contribution
/// by a timeout, and those waits are the other rank's, not the path's:
/// taken in, they inflated the variation, hence this rank's timeouts, to tens
/// of milliseconds, and every loss of this rank's own then stalled the window
/// that long (5% loss made an 8-rank run 60 times slower than 1%).
///
/// Two more things a worker learns about its path live here:
///
/// - **Backoff** (RFC 6298, 5.5 and 5.7): a timeout doubles the timeout of
///   chunks sent afterwards too, until a chunk sent once comes back. A path
///   whose round trip exceeds the timeout (a 64 KB frame takes 5 ms each way
///   at 100 Mbit/s) would otherwise time out every chunk before its result,
///   and by Karn's rule never sample a round trip to learn from. Once one
///   was sampled, any result ends the backoff: a timeout shorter than the
///   round trip is then found by the first copy's result arriving right
///   after the retransmission (sampled, Eifel's way), and under random loss
///   holding on to doubled timeouts until a first copy came back cost each
///   later loss two, four, eight times the timeout (5% loss: a 64 MiB call
///   in the simulator went from 0.28 s to 0.9 s).
/// - **Reordering** (RFC 8985, 6.2): the allowance of the RACK-like rule
///   starts at a quarter of the smoothed round trip and grows by a quarter,
///   up to the whole round trip, each time a fast retransmission turns out
///   to have been unneeded (results of a chunk's first copy come back after
///   later chunks' when the switch completes them on different CPUs), and
///   goes back to a quarter after [`REORDER_PERSIST`] fast retransmissions
///   in a row that were needed. Not every unneeded one was reordering: a
///   rank that resent a chunk waiting for another rank's recovery sees the
///   result soon after its resend too, and a larger allowance slows every
///   later recovery.
///
/// A worker keeps one across calls so that every call starts with a measured
/// timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttEstimator {
    smoothed: Option<Duration>,
    variation: Duration,
    /// Outliers set aside in a row.
    outliers: u32,
    /// The lowest sample.
    lowest: Option<Duration>,
    /// Doublings of the timeout since the last sample.
    backoff: u8,
    /// The reordering allowance in quarters of the smoothed round trip.
    reorder_quarters: u8,
    /// Needed fast retransmissions until the allowance is a quarter again.
    reorder_persist: u8,
    /// The longest datagram sampled ([`sample_sized`](Self::sample_sized)).
    bytes: usize,
}

/// Needed fast retransmissions in a row after which a grown reordering
/// allowance goes back to a quarter of the round trip (RFC 8985's
/// `reo_wnd_persist`).
pub const REORDER_PERSIST: u8 = 16;

/// How long after the last retransmission on evidence of a loss (at once or
/// after a timeout) open first copies are still probed outside a call's
/// tail (see the module docs).
pub const LOSS_MEMORY: Duration = Duration::from_millis(100);

/// The most doublings [`RttEstimator::on_timeout`] keeps.
const MAX_BACKOFF: u8 = 6;

/// How many times the smoothed round trip a sample may be before it is set
/// aside as an outlier.
pub const OUTLIER_FACTOR: u32 = 4;

/// Outliers in a row after which they are taken in.
pub const OUTLIER_RUN: u32 = 16;

impl RttEstimator {
    /// An estimator without samples.
    pub const fn new() -> Self {
        Self {
            smoothed: None,
            variation: Duration::ZERO,
            outliers: 0,
            lowest: None,
            backoff: 0,
            reorder_quarters: 1,
            reorder_persist: 0,
            bytes: 0,
        }
    }

    /// The smoothed round trip, once there is a sample.
    pub const fn smoothed(&self) -> Option<Duration> {
        self.smoothed
    }

    /// The lowest round trip sampled.
    pub const fn lowest(&self) -> Option<Duration> {
        self.lowest
    }

    /// The round-trip variation.
    pub const fn variation(&self) -> Duration {
        self.variation
    }

    /// Adds a round-trip sample of a datagram of `bytes` bytes. The first
    /// sample of a longer datagram than any before starts the estimate
    /// afresh: on a slow link a full chunk's round trip is many times a
    /// short one's (a call check of 40 bytes, a 64 KB chunk), and compared
    /// with the short ones' estimate it would be set aside as an outlier.
    pub fn sample_sized(&mut self, rtt: Duration, bytes: usize) {
        if bytes > self.bytes {
            self.bytes = bytes;
            self.smoothed = None;
            self.outliers = 0;
        }
        self.sample(rtt);
    }

    /// Adds a round-trip sample (which ends any backoff: the chunk came
    /// back without a retransmission, as late as it may have been).
    pub fn sample(&mut self, rtt: Duration) {
        self.lowest = Some(self.lowest.map_or(rtt, |l| l.min(rtt)));
        self.backoff = 0;
        match self.smoothed {
            None => {
                self.smoothed = Some(rtt);
                self.variation = rtt / 2;
            }
            Some(smoothed)
                if rtt > smoothed.saturating_mul(OUTLIER_FACTOR) && self.outliers < OUTLIER_RUN =>
            {
                self.outliers += 1;
            }
            Some(smoothed) => {
                self.outliers = 0;
                let diff = smoothed.abs_diff(rtt);
                self.variation = (self.variation.saturating_mul(3).saturating_add(diff)) / 4;
                self.smoothed = Some((smoothed.saturating_mul(7).saturating_add(rtt)) / 8);
            }
        }
    }

    /// The timeout for a chunk sent now: `initial_rto` without samples, else
    /// smoothed + 4 × variation clamped to `min_rto..=max_rto`; doubled for
    /// every timeout since the last sample, up to `max_rto`.
    pub fn rto(&self, config: &Config) -> Duration {
        let rto = match self.smoothed {
            None => config.initial_rto,
            Some(smoothed) => smoothed
                .saturating_add(self.variation.saturating_mul(4))
                .clamp(config.min_rto, config.max_rto),
        };
        rto.saturating_mul(1 << self.backoff).min(config.max_rto)
    }

    /// The timeout for a chunk of `bytes` bytes sent now: [`rto`](Self::rto),
    /// and at least `initial_rto` when no chunk that long has been sampled.
    pub fn rto_for(&self, config: &Config, bytes: usize) -> Duration {
        let rto = self.rto(config);
        if bytes > self.bytes {
            rto.max(config.initial_rto)
        } else {
            rto
        }
    }

    /// A chunk timed out: chunks sent from now on wait twice as long, until
    /// the next result ([`on_delivery`](Self::on_delivery)).
    pub fn on_timeout(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// A result arrived, of a first copy or a retransmission: once a round
    /// trip has been measured, the path delivers and the backoff goes.
    /// Before, it stays until the first sample (Karn's rule: the timeout
    /// may be shorter than the round trip).
    pub fn on_delivery(&mut self) {
        if self.smoothed.is_some() {
            self.backoff = 0;
        }
    }

    /// The longest datagram payload sampled, bytes.
    pub const fn sampled_bytes(&self) -> usize {
        self.bytes
    }

    /// Timeouts since the last sample.
    pub const fn backoff(&self) -> u8 {
        self.backoff
    }

    /// How much later than a chunk whose result came back an earlier chunk
    /// may have been sent and still be waited for (the RACK-like rule):
    /// a quarter of the smoothed round trip (of `fallback` before any
    /// sample) at first, more after unneeded fast retransmissions.
    pub fn reorder_allowance(&self, fallback: Duration) -> Duration {
        self.smoothed.unwrap_or(fallback) * u32::from(self.reorder_quarters) / 4
    }

    /// A fast retransmission was unneeded: the allowance grows by a
    /// quarter of the round trip, up to the whole round trip.
    pub fn on_reordering(&mut self) {
        self.reorder_quarters = (self.reorder_quarters + 1).min(4);
        self.reorder_persist = REORDER_PERSIST;
    }

    /// A fast retransmission was needed: after [`REORDER_PERSIST`] in a row
    /// the allowance is a quarter of the round trip again.
    pub fn on_recovery(&mut self) {
        self.reorder_persist = self.reorder_persist.saturating_sub(1);
        if self.reorder_persist == 0 {
            self.reorder_quarters = 1;
        }
    }
}

/// Counters of one collective call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Chunks the call was cut into, the call check's included.
    pub chunks: u64,
    /// Datagrams written by [`Engine::poll_transmit`], retransmissions included.
    pub packets_sent: u64,
    /// Bytes of those datagrams (xina header and payload).
    pub bytes_sent: u64,
    /// Datagrams given to [`Engine::handle_packet`], whatever they were.
    pub packets_received: u64,
    /// Bytes of those datagrams.
    pub bytes_received: u64,
    /// Chunks sent again: after their timeout, at once (see
    /// `fast_retransmissions`), or as probes (`probes`).
    pub retransmissions: u64,
    /// Of `retransmissions`, the chunks sent again at once because the
    /// result of a chunk sent well after them came back first (the RACK-like
    /// rule of the module docs), without waiting for their timeout.
    pub fast_retransmissions: u64,
    /// Timer events that found at least one chunk past its timeout.
    pub timeouts: u64,
    /// Of `retransmissions`, probes: first copies sent again because no
    /// result at all came for twice the round trip.
    pub probes: u64,
    /// Of `retransmissions`, those found unneeded: the chunk's result came
    /// back sooner after the retransmission than the lowest round trip, so
    /// it answered the first copy (which had only been slow).
    pub spurious: u64,
    /// Results accepted that the switch answered from a slot's stored copy
    /// ([`Flags::FROM_CACHE`]): results recovered after a loss.
    pub from_cache: u64,
    /// Results for chunks whose result had already arrived.
    pub duplicates: u64,
    /// Datagrams that were not a result this call was waiting for: malformed,
    /// another job, another kind, a sequence number outside the call, a
    /// mismatched element count or slot.
    pub ignored: u64,
    /// Chunks of a float call sent again at a coarser scale because their
    /// fixed-point sum overflowed (see [`crate::float`]); 0 for integer calls.
    pub rescaled: u64,
    /// The congestion window when the call ended, in chunks (the slots
    /// without congestion control).
    pub window: u32,
    /// The most chunks the call had open at once.
    pub max_open: u32,
    /// Times the congestion window shrank during the call.
    pub window_decreases: u64,
    /// From the creation of the engine to its completion or failure (or to
    /// the last event, while it runs).
    pub elapsed: Duration,
}

impl Stats {
    /// Adds the counters of a later call of the same collective (a float
    /// call runs several engines).
    pub fn absorb(&mut self, other: &Self) {
        self.chunks += other.chunks;
        self.packets_sent += other.packets_sent;
        self.bytes_sent += other.bytes_sent;
        self.packets_received += other.packets_received;
        self.bytes_received += other.bytes_received;
        self.retransmissions += other.retransmissions;
        self.fast_retransmissions += other.fast_retransmissions;
        self.timeouts += other.timeouts;
        self.spurious += other.spurious;
        self.probes += other.probes;
        self.from_cache += other.from_cache;
        self.duplicates += other.duplicates;
        self.ignored += other.ignored;
        self.rescaled += other.rescaled;
        self.window = other.window;
        self.max_open = self.max_open.max(other.max_open);
        self.window_decreases += other.window_decreases;
        self.elapsed += other.elapsed;
    }
}

/// One line for logs: `3907 chunks, 3907 sent (4.1 MB), 3907 received
/// (4.1 MB), 0 retransmitted, 0 timeouts, 0 from cache, 0 duplicates,
/// 0 ignored, 0.347 s` (and `, N rescaled` when a float call rescaled).
impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: u64| b as f64 / 1e6;
        write!(
            f,
            "{} chunks, {} sent ({:.1} MB), {} received ({:.1} MB), {} retransmitted \
             ({} probes, {} unneeded), {} timeouts, {} from cache, {} duplicates, {} ignored, ",
            self.chunks,
            self.packets_sent,
            mb(self.bytes_sent),
            self.packets_received,
            mb(self.bytes_received),
            self.retransmissions,
            self.probes,
            self.spurious,
            self.timeouts,
            self.from_cache,
            self.duplicates,
            self.ignored,
        )?;
        if self.rescaled > 0 {
            write!(f, "{} rescaled, ", self.rescaled)?;
        }
        write!(
            f,
            "window {} (at most {} open, {} decreases), {:.3} s",
            self.window,
            self.max_open,
            self.window_decreases,
            self.elapsed.as_secs_f64()
        )
    }
}

/// The state of a chunk that has been sent and is not yet behind the window.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    /// When its first transmission left.
    first_sent: Instant,
    /// When its latest transmission left.
    sent_at: Instant,
    /// The timeout of its latest transmission.
    rto: Duration,
    /// When it times out; `None` once queued for retransmission (or done).
    deadline: Option<Instant>,
    /// Its payload bytes.
    bytes: usize,
    /// How many times it has been sent.
    transmissions: u32,
    /// Why its latest retransmission went (`None` while it was sent once).
    resent: Option<Resend>,
    /// Whether its result has arrived.
    done: bool,
}

/// Why a chunk goes again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Its timeout passed (doubles its timeout).
    Timeout,
    /// A chunk sent well after it came back first (the RACK-like rule).
    Reorder,
    /// A probe: no result for twice the round trip.
    Probe,
}

/// A retransmission timer; stale entries are skipped when they surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    chunk: usize,
    transmission: u32,
}

/// Elements in the call check.
const CHECK_LEN: usize = 8;

/// Which buffer a segment's elements come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The call check.
    Check,
    /// The caller's buffer.
    Data,
    /// The caller's buffer as it was at the start (a shared reduction in a
    /// reduce mode); results go to the caller's buffer.
    Shared,
}

/// A run of elements chunked together, all with one root.
#[derive(Clone, Copy, Debug)]
struct Segment {
    source: Source,
    /// The first element in its source.
    start: usize,
    /// Elements in the segment.
    len: usize,
    /// The rank that gets the results of its chunks (in reduce modes).
    root: u8,
    /// The index of its first chunk in the call.
    first: usize,
}

/// The numbers of the call check — `v` then `v²` (sum) or `-v` (max, min) —
/// and their combination over `fan_in` ranks that all sent the same.
///
/// Every number is below 2^16 and its square below 2^24, so `fan_in` (at most
/// 64) times it fits an int32 without overflow.
fn check_values<T: Element>(
    op: Op,
    collective: Collective,
    len: usize,
    fan_in: u8,
) -> ([T; CHECK_LEN], [T; CHECK_LEN]) {
    const DIGIT: usize = 1 << 12;
    let digit = |i: u32| i32::try_from((len / DIGIT.pow(i)) % DIGIT).expect("below 2^12");
    let v = [collective.code(), digit(0), digit(1), digit(2)];
    let n = if op == Op::Sum { i32::from(fan_in) } else { 1 };
    let mut send = [T::default(); CHECK_LEN];
    let mut expect = [T::default(); CHECK_LEN];
    for (i, x) in v.into_iter().enumerate() {
        let other = if op == Op::Sum { x * x } else { -x };
        send[i] = T::from_i32(x);
        send[4 + i] = T::from_i32(other);
        expect[i] = T::from_i32(n * x);
        expect[4 + i] = T::from_i32(n * other);
    }
    (send, expect)
}

/// One collective call over one buffer, in place.
///
/// Create it with the caller's buffer, then loop: send what
/// [`poll_transmit`](Self::poll_transmit) writes, feed received datagrams to
/// [`handle_packet`](Self::handle_packet), call
/// [`handle_timeout`](Self::handle_timeout) once
/// [`poll_timeout`](Self::poll_timeout) has passed, until
/// [`is_done`](Self::is_done); then [`take_outcome`](Self::take_outcome).
/// A running engine always has a deadline (at least the give-up time), so a
/// driver that honours it never waits forever.
///
/// Results are written into the buffer chunk by chunk as they arrive; a chunk's
/// inputs are never needed again once its result is in. After a failure the
/// buffer holds a mix of results and inputs and must not be used as a result.
#[derive(Debug)]
pub struct Engine<'a, T: Element> {
    member: Member,
    config: Config,
    collective: Collective,
    rtt: RttEstimator,
    congestion: Window,
    /// Chunks sent whose result has not arrived.
    open: usize,
    /// Whether the congestion window, not the slots or the end of the
    /// call, held back the next chunk when sending last stopped: only then
    /// do results grow the window.
    limited: bool,
    /// With [`trace_window`](Self::trace_window): the window's limit when
    /// the call started and at every change.
    trace: Option<Vec<(Instant, u32)>>,
    data: &'a mut [T],
    /// With [`with_input`](Self::with_input): what is sent instead of
    /// `data`'s contents (`data` then only receives results).
    input: Option<&'a [T]>,
    /// What this rank sends in the call check, and receives when it is
    /// the root of the check's chunks.
    check: [T; CHECK_LEN],
    /// What the check's result must be.
    check_expect: [T; CHECK_LEN],
    check_result: [T; CHECK_LEN],
    /// The input of a [`Collective::Share`] in a reduce mode.
    shared: Vec<T>,
    /// Check elements received with a payload.
    check_received: usize,
    /// Check elements this rank receives a payload for.
    check_expected: usize,
    segments: Vec<Segment>,
    first_chunk: u64,
    /// Chunks in the call.
    chunks: usize,
    /// The lowest chunk whose result has not arrived.
    base: usize,
    /// The next chunk to send for the first time.
    next: usize,
    /// Chunks `base..next`.
    window: VecDeque<Chunk>,
    /// Retransmission timers, earliest first; the top is always live.
    timers: BinaryHeap<Reverse<Timer>>,
    /// At least the timeout of every open chunk.
    rto_bound: Duration,
    /// The timeout a chunk sent at the last result would have had: when
    /// the next result's is longer, the open chunks' timeouts follow it.
    last_rto: Duration,
    /// Chunks found lost, waiting for `poll_transmit`, and whether by a
    /// timeout (which doubles the chunk's timeout).
    retransmit: VecDeque<(usize, Resend)>,
    started: Instant,
    last_event: Instant,
    last_progress: Instant,
    /// When a chunk last went again on evidence of a loss (at once, or
    /// after its timeout): probes outside the tail only follow one.
    last_loss: Option<Instant>,
    finished: Option<Instant>,
    /// The first overflowing chunk and how many chunks overflowed.
    overflow: Option<(usize, usize)>,
    /// Every chunk whose result carried the overflow flag, when asked for.
    overflowed: Option<Vec<usize>>,
    failure: Option<Error>,
    outcome_taken: bool,
    stats: Stats,
}

impl<'a, T: Element> Engine<'a, T> {
    /// Starts `collective` over `data`, whose first chunk (the call check's)
    /// has the chunk number `first_chunk` (0 for a worker's first
    /// collective, then [`next_chunk`](Self::next_chunk) of the previous
    /// one; every rank must use the same number).
    ///
    /// # Errors
    /// The errors of [`Member::validate`] and [`Config::validate`];
    /// [`Error::WrongType`] if `T` is not the job's element type,
    /// [`Error::WrongMode`] if the collective needs another job mode,
    /// [`Error::RootOutOfRange`], [`Error::LengthNotDivisible`] (a
    /// reduce-scatter whose length is not a multiple of the fan-in).
    pub fn new(
        member: Member,
        config: Config,
        collective: Collective,
        first_chunk: u64,
        data: &'a mut [T],
        now: Instant,
    ) -> Result<Self, Error> {
        member.validate()?;
        config.validate()?;
        let Member {
            job, fan_in, rank, ..
        } = member;
        if member.dtype != T::DTYPE {
            return Err(Error::WrongType {
                job,
                job_dtype: member.dtype,
                call: format!(
                    "{} of {}",
                    collective.name(),
                    crate::error::dtype_name(T::DTYPE)
                ),
            });
        }
        if let Some(needed) = collective.mode()
            && needed != member.mode
        {
            return Err(Error::WrongMode {
                job,
                mode: member.mode,
                needed,
                collective: collective.name(),
            });
        }
        let len = data.len();
        let mut shared = Vec::new();
        let mut roots: Vec<(Source, usize, usize, u8)> = Vec::new();
        // The check goes to the ranks that need it: everybody in allreduce,
        // the root in reduce, each rank in reduce-scatter.
        match (collective, member.mode) {
            (Collective::Reduce { root }, _) if root >= fan_in => {
                return Err(Error::RootOutOfRange { job, root, fan_in });
            }
            (Collective::Reduce { root }, _) => roots.push((Source::Check, 0, CHECK_LEN, root)),
            (Collective::ReduceScatter, _)
            | (Collective::Barrier, Mode::ReduceScatter)
            | (Collective::Share, Mode::Reduce | Mode::ReduceScatter) => {
                roots.extend((0..fan_in).map(|r| (Source::Check, 0, CHECK_LEN, r)));
            }
            _ => roots.push((Source::Check, 0, CHECK_LEN, 0)),
        }
        match collective {
            Collective::Allreduce => roots.push((Source::Data, 0, len, 0)),
            Collective::Reduce { root } => roots.push((Source::Data, 0, len, root)),
            Collective::ReduceScatter => {
                if !len.is_multiple_of(usize::from(fan_in)) {
                    return Err(Error::LengthNotDivisible { job, len, fan_in });
                }
                let part = len / usize::from(fan_in);
                roots.extend((0..fan_in).map(|r| (Source::Data, usize::from(r) * part, part, r)));
            }
            Collective::Barrier => {}
            Collective::Share if member.mode == Mode::Allreduce => {
                roots.push((Source::Data, 0, len, 0));
            }
            Collective::Share => {
                // Each rank's copy of the result comes back to it in place,
                // so what goes out comes from a copy of the input.
                shared = data.to_vec();
                roots.extend((0..fan_in).map(|r| (Source::Shared, 0, len, r)));
            }
        }
        let e = usize::from(member.elems_per_packet);
        let mut segments = Vec::with_capacity(roots.len());
        let mut chunks = 0;
        let mut check_expected = 0;
        for (source, start, len, root) in roots {
            if len == 0 {
                continue;
            }
            if source == Source::Check && (member.mode == Mode::Allreduce || root == rank) {
                check_expected += len;
            }
            segments.push(Segment {
                source,
                start,
                len,
                root,
                first: chunks,
            });
            chunks += len.div_ceil(e);
        }
        let (check, check_expect) = check_values(member.op, collective, len, fan_in);
        Ok(Self {
            member,
            config,
            collective,
            rtt: RttEstimator::new(),
            congestion: Window::new(),
            open: 0,
            limited: false,
            trace: None,
            data,
            input: None,
            check,
            check_expect,
            check_result: [T::default(); CHECK_LEN],
            shared,
            check_received: 0,
            check_expected,
            segments,
            first_chunk,
            chunks,
            base: 0,
            next: 0,
            window: VecDeque::new(),
            timers: BinaryHeap::new(),
            rto_bound: Duration::ZERO,
            last_rto: Duration::ZERO,
            retransmit: VecDeque::new(),
            started: now,
            last_event: now,
            last_progress: now,
            last_loss: None,
            finished: None,
            overflow: None,
            overflowed: None,
            failure: None,
            outcome_taken: false,
            stats: Stats {
                chunks: chunks as u64,
                ..Stats::default()
            },
        })
    }

    /// Sends `input` instead of the data buffer's contents: an
    /// out-of-place call, whose results land in the data buffer and whose
    /// input is left as it was.
    ///
    /// # Panics
    /// If `input` is not exactly as long as the data buffer.
    #[must_use]
    pub fn with_input(mut self, input: &'a [T]) -> Self {
        assert_eq!(
            input.len(),
            self.data.len(),
            "an out-of-place call's input and results differ in length"
        );
        self.input = Some(input);
        self
    }

    /// Starts from a round-trip estimate carried over from earlier calls.
    #[must_use]
    pub fn with_rtt(mut self, rtt: RttEstimator) -> Self {
        self.rtt = rtt;
        self
    }

    /// Starts from a congestion window carried over from earlier calls.
    #[must_use]
    pub fn with_window(mut self, window: Window) -> Self {
        self.congestion = window;
        self
    }

    /// Records the window's limit at the start and at every change
    /// ([`window_trace`](Self::window_trace)).
    #[must_use]
    pub fn trace_window(mut self) -> Self {
        let limit = u32::try_from(self.window_limit()).unwrap_or(u32::MAX);
        self.trace = Some(vec![(self.started, limit)]);
        self
    }

    /// The window's limit over time, with
    /// [`trace_window`](Self::trace_window); empty without.
    pub fn window_trace(&self) -> &[(Instant, u32)] {
        self.trace.as_deref().unwrap_or_default()
    }

    /// Completes the call even when results carry the overflow flag and
    /// records which data chunks overflowed ([`overflowed`](Self::overflowed)),
    /// for a caller that recovers from overflow itself (float calls).
    #[must_use]
    pub fn tolerate_overflow(mut self) -> Self {
        self.overflowed = Some(Vec::new());
        self
    }

    /// The element ranges of the caller's buffer whose chunks came back with
    /// the overflow flag, in chunk order (only with
    /// [`tolerate_overflow`](Self::tolerate_overflow)).
    pub fn overflowed(&self) -> Vec<Range<usize>> {
        self.overflowed
            .iter()
            .flatten()
            .filter_map(|&k| {
                let (segment, range) = self.locate(k);
                (segment.source != Source::Check).then_some(range)
            })
            .collect()
    }

    /// The member this engine speaks for.
    pub const fn member(&self) -> &Member {
        &self.member
    }

    /// The collective this engine runs.
    pub const fn collective(&self) -> Collective {
        self.collective
    }

    /// The round-trip estimate, to carry over to the next call.
    pub const fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// The congestion window, to carry over to the next call.
    pub const fn window(&self) -> &Window {
        &self.congestion
    }

    /// How many chunks may be open now: the congestion window, or every
    /// slot without congestion control.
    pub fn window_limit(&self) -> usize {
        match self.config.queue_target {
            Some(_) => self.congestion.limit(self.member.slots),
            None => self.member.slots as usize,
        }
    }

    /// How many chunks the call was cut into, the call check's included.
    pub const fn chunks(&self) -> usize {
        self.chunks
    }

    /// The chunk number of this call's first chunk.
    pub const fn first_chunk(&self) -> u64 {
        self.first_chunk
    }

    /// The chunk number the worker's next collective must start at, whether
    /// this one succeeds or not.
    pub const fn next_chunk(&self) -> u64 {
        self.first_chunk.wrapping_add(self.chunks as u64)
    }

    /// The longest datagram this engine writes; `poll_transmit` needs a buffer
    /// at least this long.
    pub fn max_datagram_len(&self) -> usize {
        let longest = self.segments.iter().map(|s| s.len).max().unwrap_or(0);
        HEADER_LEN + T::DTYPE.size() * usize::from(self.member.elems_per_packet).min(longest)
    }

    /// Whether the call has completed or failed.
    pub const fn is_done(&self) -> bool {
        self.finished.is_some()
    }

    /// The failure, if the call has failed.
    pub const fn error(&self) -> Option<&Error> {
        self.failure.as_ref()
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        let end = self.finished.unwrap_or(self.last_event);
        Stats {
            elapsed: end.saturating_duration_since(self.started),
            window: u32::try_from(self.window_limit()).unwrap_or(u32::MAX),
            ..self.stats
        }
    }
    /// The outcome, once: `Some` the first time it is called after the call
    /// completed or failed, `None` before and after.
    pub fn take_outcome(&mut self) -> Option<Result<Stats, Error>> {
        if !self.is_done() || self.outcome_taken {
            return None;
        }
        self.outcome_taken = true;
        Some(match self.failure.take() {
            Some(error) => Err(error),
            None => Ok(self.stats()),
        })
    }

    /// The next deadline at which [`handle_timeout`](Self::handle_timeout)
    /// must be called: the earliest retransmission timeout, or the give-up
    /// time. `None` once done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_done() {
            return None;
        }
        let give_up = self.last_progress + self.config.give_up;
        Some(
            self.timers
                .peek()
                .map_or(give_up, |Reverse(t)| t.at.min(give_up)),
        )
    }

    /// Writes the next datagram to send to the switch into `buf` and returns
    /// its length; `None` when nothing may be sent now. Retransmissions go
    /// first, then new chunks as far as the window allows. Call it until it
    /// returns `None` after every event.
    ///
    /// # Panics
    /// If `buf` is shorter than [`max_datagram_len`](Self::max_datagram_len)
    /// ([`MAX_DATAGRAM_LEN`] always suffices).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.touch(now);
        if self.is_done() {
            return None;
        }
        while let Some((k, why)) = self.retransmit.pop_front() {
            let timed_out = why == Resend::Timeout;
            let max_rto = self.config.max_rto;
            let Some(chunk) = self.chunk_mut(k) else {
                continue;
            };
            if chunk.done || chunk.deadline.is_some() {
                continue;
            }
            chunk.transmissions += 1;
            chunk.resent = Some(why);
            if timed_out {
                chunk.rto = chunk.rto.saturating_mul(2).min(max_rto);
            }
            let rto = chunk.rto;
            chunk.sent_at = now;
            let at = now + chunk.rto;
            chunk.deadline = Some(at);
            let transmission = chunk.transmissions;
            self.timers.push(Reverse(Timer {
                at,
                chunk: k,
                transmission,
            }));
            self.stats.retransmissions += 1;
            match why {
                Resend::Reorder => self.stats.fast_retransmissions += 1,
                Resend::Probe => self.stats.probes += 1,
                Resend::Timeout => {}
            }
            if why != Resend::Probe {
                self.last_loss = Some(now);
            }
            self.rto_bound = self.rto_bound.max(rto);
            return Some(self.emit(k, true, buf));
        }
        if self.next < self.chunks && self.window_open() {
            let k = self.next;
            self.next += 1;
            let bytes = self.locate(k).1.len() * T::DTYPE.size();
            let rto = self.rtt.rto_for(&self.config, bytes);
            self.rto_bound = self.rto_bound.max(rto);
            // Its timer fires at its probe time, when there is one; it is
            // pushed back while results flow (`handle_timeout`).
            let at = now
                + self
                    .probe_timeout(bytes)
                    .filter(|_| self.losing(now))
                    .map_or(rto, |pto| pto.min(rto));
            self.open += 1;
            self.stats.max_open = self
                .stats
                .max_open
                .max(u32::try_from(self.open).unwrap_or(u32::MAX));
            self.window.push_back(Chunk {
                first_sent: now,
                sent_at: now,
                rto,
                deadline: Some(at),
                bytes,
                transmissions: 1,
                resent: None,
                done: false,
            });
            self.timers.push(Reverse(Timer {
                at,
                chunk: k,
                transmission: 1,
            }));
            if self.next == self.chunks {
                self.arm_probes(now);
            }
            return Some(self.emit(k, false, buf));
        }
        self.limited =
            self.next < self.chunks && self.slot_free() && self.open >= self.window_limit();
        None
    }

    /// Takes a received datagram (the UDP payload: xina header and payload).
    /// Anything but a result of this job for a chunk this call is waiting for
    /// is counted and otherwise ignored.
    pub fn handle_packet(&mut self, now: Instant, datagram: &[u8]) {
        self.touch(now);
        self.stats.packets_received += 1;
        self.stats.bytes_received += datagram.len() as u64;

        let Ok(packet) = Packet::new_checked(datagram) else {
            self.stats.ignored += 1;
            return;
        };
        let Ok(repr) = Repr::parse(&packet) else {
            self.stats.ignored += 1;
            return;
        };
        let Member { job, rank, op, .. } = self.member;
        if repr.kind != Kind::AggResult
            || repr.job != job
            || repr.op != op
            || repr.dtype != T::DTYPE
            || repr.bitmap & (1 << rank) == 0
        {
            self.stats.ignored += 1;
            return;
        }

        let base_seq = Member::seq_of(self.chunk_number(self.base));
        let ahead = repr.seq.wrapping_sub(base_seq) as usize;
        if ahead >= self.next - self.base {
            // Not in flight: a late copy of a result already taken, or junk.
            let behind = base_seq.wrapping_sub(repr.seq) as usize;
            if (1..=self.base).contains(&behind) {
                self.stats.duplicates += 1;
            } else {
                self.stats.ignored += 1;
            }
            return;
        }
        if self.window[ahead].done {
            self.stats.duplicates += 1;
            return;
        }
        let k = self.base + ahead;
        let (segment, range) = self.locate(k);
        let bytes = range.len() * T::DTYPE.size();
        let (slot, version) = self.member.slot_of(self.chunk_number(k));
        let notice = repr.flags.contains(Flags::NOTICE);
        let expected_count = if self.expects_payload(&segment) {
            range.len()
        } else {
            0
        };
        if self.finished.is_some()
            || notice != (expected_count == 0)
            || usize::from(repr.count) != expected_count
            || repr.root != segment.root
            || repr.slot != slot
            || repr.slot_version != version
        {
            self.stats.ignored += 1;
            return;
        }

        if !notice {
            let size = T::DTYPE.size();
            let values = packet.payload().chunks_exact(size).map(T::read);
            match segment.source {
                Source::Data | Source::Shared => {
                    for (dst, value) in self.data[range].iter_mut().zip(values) {
                        *dst = value;
                    }
                }
                Source::Check => {
                    let n = range.len();
                    for (dst, value) in self.check_result[range].iter_mut().zip(values) {
                        *dst = value;
                    }
                    self.check_received += n;
                }
            }
        }
        if repr.flags.contains(Flags::FROM_CACHE) {
            self.stats.from_cache += 1;
        }
        if repr.flags.contains(Flags::OVERFLOW) {
            match &mut self.overflowed {
                Some(list) => list.push(k),
                None => {
                    self.overflow = Some(match self.overflow {
                        None => (k, 1),
                        Some((first, n)) => (first.min(k), n + 1),
                    });
                }
            }
        }
        let chunk = &mut self.window[ahead];
        chunk.done = true;
        chunk.deadline = None;
        let (sent_once, sent_at) = (chunk.transmissions == 1, chunk.sent_at);
        // A result sooner after the retransmission than any round trip
        // answers the first copy: the retransmission was not needed, and
        // the first copy's round trip is a true sample (as TCP's Eifel
        // detection finds with timestamps).
        let spurious = chunk.transmissions >= 2
            && !repr.flags.contains(Flags::FROM_CACHE)
            && self
                .rtt
                .lowest()
                .is_some_and(|lowest| now.saturating_duration_since(sent_at) < lowest);
        // A timeout that fired before the first copy's result (the
        // timeout was too short: Eifel's case) is the one resend whose
        // first copy is sampled. After a fast retransmission or a probe the
        // first copy's round trip is no news, and often not a round trip of
        // the path: a rank whose contribution was in resent the chunk while
        // another rank recovered its own, and the result came soon after.
        let eifel = spurious && chunk.transmissions == 2 && chunk.resent == Some(Resend::Timeout);
        let fast = chunk.resent == Some(Resend::Reorder);
        let sampled_from = if eifel { chunk.first_sent } else { sent_at };
        let full = self.limited;
        self.open -= 1;
        if spurious {
            self.stats.spurious += 1;
            if fast {
                self.rtt.on_reordering();
            }
        } else if fast {
            self.rtt.on_recovery();
        }
        if sent_once || eifel {
            let rtt = now.saturating_duration_since(sampled_from);
            self.rtt.sample_sized(rtt, bytes);
            if let Some(queue_target) = self.config.queue_target {
                let srtt = self.rtt.smoothed().unwrap_or(rtt);
                let before = self.congestion.decreases();
                let sample = Sample { rtt, srtt, bytes };
                self.congestion
                    .on_result(now, sample, full, self.member.slots, queue_target);
                self.stats.window_decreases += self.congestion.decreases() - before;
                self.note_window(now);
            }
        }
        if sent_once {
            self.on_progress(now, ahead, sent_at);
        }
        self.rtt.on_delivery();
        self.last_progress = now;
        while self.window.front().is_some_and(|c| c.done) {
            self.window.pop_front();
            self.base += 1;
        }
        self.prune_timers();
        if segment.source == Source::Check
            && self.check_expected > 0
            && self.check_received == self.check_expected
            && !self.check_passed()
        {
            self.fail(now, self.mismatch());
            return;
        }
        if self.base == self.chunks {
            self.complete(now);
        }
    }

    /// Acts on the deadlines that have passed by `now`: queues the chunks past
    /// their timeout for retransmission, or fails with [`Error::GaveUp`] when
    /// no result has arrived for `give_up`. Harmless when nothing has expired.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.touch(now);
        if self.is_done() {
            return;
        }
        let waited = now.saturating_duration_since(self.last_progress);
        if waited >= self.config.give_up {
            self.give_up(now, waited);
            return;
        }
        let mut fired = false;
        let learned = self.rtt.sampled_bytes();
        // Outside the tail, only while losses are being found: a pause in
        // the results of a lossless run is a rank that was not scheduled
        // (on a busy host, often longer than two round trips), and probing
        // every open chunk then only adds load.
        let tail = self.next == self.chunks;
        let pto = self
            .probe_timeout(learned)
            .filter(|_| tail || self.losing(now));
        while let Some(&Reverse(timer)) = self.timers.peek() {
            if timer.at > now {
                break;
            }
            self.timers.pop();
            if !self.is_live(&timer) {
                continue;
            }
            let progress = self.last_progress;
            let Some(chunk) = self.chunk_mut(timer.chunk) else {
                continue;
            };
            // A first copy times out only once no result at all has come
            // for its timeout, as TCP restarts its timer on every new
            // acknowledgement: chunks queued behind others (a window of
            // 64 KB chunks on a slow link) are late, not lost, and a loss
            // while results flow is found at once (the RACK-like rule).
            let since_progress = progress + chunk.rto;
            // A probe comes first (see the module docs); a
            // chunk is probed once, as its first copy's only resend.
            let probe = (chunk.transmissions == 1 && chunk.bytes <= learned)
                .then_some(pto)
                .flatten()
                .map(|pto| chunk.sent_at.max(progress) + pto);
            if probe.is_some_and(|at| at <= now) {
                chunk.deadline = None;
                self.retransmit.push_back((timer.chunk, Resend::Probe));
                continue;
            }
            let next = probe.map_or(since_progress, |at| at.min(since_progress));
            if chunk.transmissions == 1 && next > now {
                chunk.deadline = Some(next);
                self.timers.push(Reverse(Timer { at: next, ..timer }));
                continue;
            }
            chunk.deadline = None;
            self.retransmit.push_back((timer.chunk, Resend::Timeout));
            fired = true;
        }
        self.prune_timers();
        if fired {
            self.stats.timeouts += 1;
            // A second timeout in a row with nothing at all coming back is
            // a stall: a queue that overflows before its delay shows. A
            // single one is what a random loss of the last chunks open costs.
            let stalled = self.rtt.backoff() > 0 && waited >= self.rtt.rto(&self.config);
            self.rtt.on_timeout();
            if self.config.queue_target.is_some() && stalled {
                let before = self.congestion.decreases();
                let srtt = self.rtt.smoothed().unwrap_or(self.config.initial_rto);
                self.congestion.on_stall(now, srtt);
                self.stats.window_decreases += self.congestion.decreases() - before;
                self.note_window(now);
            }
        }
    }

    /// After the result of a chunk sent once at `acked` arrived at `now`:
    /// queues for retransmission the chunks whose last copy went well before
    /// `acked` and still have no result, and takes back the backoff of the others
    /// (see the module docs).
    ///
    /// Runs for every result, so it looks only where something can change:
    /// chunks sent once after the acknowledged one (window position
    /// `acked_at`) were sent after it, and a chunk's timeout can only come
    /// down if some open chunk's is above the current one (`rto_bound`).
    fn on_progress(&mut self, now: Instant, acked_at: usize, acked: Instant) {
        let base_rto = self.rtt.rto(&self.config);
        let learned = self.rtt.sampled_bytes();
        let allowance = self.rtt.reorder_allowance(self.config.min_rto);
        // A longer timeout than at the last result (round trips grow with a
        // queue): the open chunks sent once get it too, as TCP re-arms its
        // timer on every acknowledgement, instead of timing out on the
        // shorter one they were sent with.
        let grown = base_rto > self.last_rto;
        self.last_rto = base_rto;
        let scan = if grown || self.rto_bound > base_rto {
            self.rto_bound = base_rto;
            self.window.len()
        } else {
            acked_at
        };
        for (i, chunk) in self.window.iter_mut().enumerate().take(scan) {
            let Some(deadline) = chunk.deadline else {
                continue;
            };
            if chunk.done {
                continue;
            }
            let k = self.base + i;
            // A chunk longer than any sampled keeps the initial timeout.
            let rto = if chunk.bytes > learned {
                base_rto.max(self.config.initial_rto)
            } else {
                base_rto
            };
            if chunk.sent_at + allowance < acked {
                chunk.deadline = None;
                self.retransmit.push_back((k, Resend::Reorder));
            } else if grown && chunk.transmissions == 1 && chunk.rto < rto {
                chunk.rto = rto;
                let at = chunk.sent_at + rto;
                if at > deadline {
                    chunk.deadline = Some(at);
                    self.timers.push(Reverse(Timer {
                        at,
                        chunk: k,
                        transmission: chunk.transmissions,
                    }));
                }
            } else if chunk.rto > rto {
                chunk.rto = rto;
                let at = (chunk.sent_at + rto).max(now).min(deadline);
                if at < deadline {
                    chunk.deadline = Some(at);
                    self.timers.push(Reverse(Timer {
                        at,
                        chunk: k,
                        transmission: chunk.transmissions,
                    }));
                }
            }
        }
    }

    /// Whether a chunk went again on evidence of a loss within the last
    /// [`LOSS_MEMORY`].
    fn losing(&self, now: Instant) -> bool {
        self.last_loss
            .is_some_and(|t| now.saturating_duration_since(t) <= LOSS_MEMORY)
    }

    /// How long an open first copy of `bytes` waits without any result
    /// before a probe: twice the smoothed round trip, at least
    /// `probe_floor`; `None` before a round trip of chunks that long was
    /// measured (a 9 KB chunk's round trip is not a call check's).
    fn probe_timeout(&self, bytes: usize) -> Option<Duration> {
        if bytes > self.rtt.sampled_bytes() {
            return None;
        }
        self.rtt
            .smoothed()
            .map(|srtt| srtt.saturating_mul(2).max(self.config.probe_floor))
    }

    /// Once the last chunk has gone: brings the deadline of every open
    /// first copy forward to its probe time, if that is sooner (chunks sent
    /// before any round trip was measured have none).
    fn arm_probes(&mut self, now: Instant) {
        let learned = self.rtt.sampled_bytes();
        let Some(pto) = self.probe_timeout(learned) else {
            return;
        };
        let progress = self.last_progress;
        for (i, chunk) in self.window.iter_mut().enumerate() {
            let Some(deadline) = chunk.deadline else {
                continue;
            };
            if chunk.done || chunk.transmissions != 1 || chunk.bytes > learned {
                continue;
            }
            let at = (chunk.sent_at.max(progress) + pto).max(now);
            if at < deadline {
                chunk.deadline = Some(at);
                self.timers.push(Reverse(Timer {
                    at,
                    chunk: self.base + i,
                    transmission: 1,
                }));
            }
        }
    }

    /// Adds the window's limit to the trace if it changed.
    fn note_window(&mut self, now: Instant) {
        let limit = u32::try_from(self.window_limit()).unwrap_or(u32::MAX);
        if let Some(trace) = &mut self.trace
            && trace.last().is_none_or(|&(_, last)| last != limit)
        {
            trace.push((now, limit));
        }
    }

    fn touch(&mut self, now: Instant) {
        self.last_event = self.last_event.max(now);
    }

    fn chunk_number(&self, k: usize) -> u64 {
        self.first_chunk.wrapping_add(k as u64)
    }

    /// The segment of chunk `k` and the chunk's elements in the segment's
    /// source.
    fn locate(&self, k: usize) -> (Segment, Range<usize>) {
        let i = self.segments.partition_point(|s| s.first <= k) - 1;
        let segment = self.segments[i];
        let e = usize::from(self.member.elems_per_packet);
        let offset = (k - segment.first) * e;
        let start = segment.start + offset;
        let end = segment.start + (offset + e).min(segment.len);
        (segment, start..end)
    }

    /// Whether this rank gets the result of the segment's chunks with their
    /// payload (or a notice).
    fn expects_payload(&self, segment: &Segment) -> bool {
        self.member.mode == Mode::Allreduce || segment.root == self.member.rank
    }

    /// Whether the check's result is what equal calls on every rank give.
    fn check_passed(&self) -> bool {
        self.check_result == self.check_expect
    }

    fn mismatch(&self) -> Error {
        let Member { job, rank, .. } = self.member;
        Error::CallMismatch {
            job,
            rank,
            collective: self.collective.name(),
            root: match self.collective {
                Collective::Reduce { root } => Some(root),
                _ => None,
            },
            len: self.data.len(),
        }
    }

    /// The in-flight chunk `k`, or `None` if it is behind the window.
    fn chunk_mut(&mut self, k: usize) -> Option<&mut Chunk> {
        k.checked_sub(self.base)
            .and_then(|i| self.window.get_mut(i))
    }

    fn is_chunk_done(&self, k: usize) -> bool {
        k < self.base || self.window.get(k - self.base).is_some_and(|c| c.done)
    }

    /// Whether chunk `next` may go: its slot copy is free and the
    /// congestion window has room.
    fn window_open(&self) -> bool {
        self.slot_free() && self.open < self.window_limit()
    }

    /// Whether the slot copy of chunk `next` is free: the result of
    /// `next - W` is in.
    fn slot_free(&self) -> bool {
        let w = self.member.slots as usize;
        self.next < w || self.is_chunk_done(self.next - w)
    }

    fn is_live(&self, timer: &Timer) -> bool {
        timer
            .chunk
            .checked_sub(self.base)
            .and_then(|i| self.window.get(i))
            .is_some_and(|c| {
                !c.done && c.transmissions == timer.transmission && c.deadline == Some(timer.at)
            })
    }

    /// Drops stale timers from the top of the heap.
    fn prune_timers(&mut self) {
        while let Some(&Reverse(timer)) = self.timers.peek() {
            if self.is_live(&timer) {
                break;
            }
            self.timers.pop();
        }
    }

    fn emit(&mut self, k: usize, retransmit: bool, buf: &mut [u8]) -> usize {
        let (segment, range) = self.locate(k);
        let size = T::DTYPE.size();
        let len = HEADER_LEN + size * range.len();
        assert!(
            buf.len() >= len,
            "transmit buffer of {} bytes, need {len}",
            buf.len()
        );
        let chunk = self.chunk_number(k);
        let (slot, slot_version) = self.member.slot_of(chunk);
        let repr = Repr {
            kind: Kind::AggData,
            flags: Flags(if retransmit { Flags::RETRANSMIT } else { 0 }),
            job: self.member.job,
            rank: self.member.rank,
            fan_in: self.member.fan_in,
            op: self.member.op,
            dtype: T::DTYPE,
            seq: Member::seq_of(chunk),
            slot,
            slot_version,
            count: u16::try_from(range.len()).expect("a chunk holds at most MAX_ELEMS elements"),
            exponent: 0,
            root: segment.root,
            bitmap: 1 << self.member.rank,
        };
        let mut packet = Packet::new_unchecked(&mut buf[..len]);
        repr.emit(&mut packet);
        let values = match segment.source {
            Source::Data => match self.input {
                Some(input) => &input[range],
                None => &self.data[range],
            },
            Source::Shared => &self.shared[range],
            Source::Check => &self.check[range],
        };
        for (dst, value) in packet.payload_mut().chunks_exact_mut(size).zip(values) {
            value.write(dst);
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        len
    }

    fn complete(&mut self, now: Instant) {
        self.finished = Some(now);
        if let Some((k, chunks)) = self.overflow {
            let Member { job, rank, .. } = self.member;
            let error = Error::Overflow {
                job,
                rank,
                seq: Member::seq_of(self.chunk_number(k)),
                elements: self.locate(k).1,
                chunks,
            };
            log::warn!("{error}");
            self.failure = Some(error);
        }
    }

    fn give_up(&mut self, now: Instant, waited: Duration) {
        let outstanding = SeqList::new(
            self.window
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.done)
                .map(|(i, _)| Member::seq_of(self.chunk_number(self.base + i))),
        );
        let completed = self.base + self.window.iter().filter(|c| c.done).count();
        let Member { job, rank, .. } = self.member;
        self.fail(
            now,
            Error::GaveUp {
                job,
                rank,
                waited,
                completed,
                total: self.chunks,
                outstanding,
                received: self.stats.packets_received,
            },
        );
    }

    fn fail(&mut self, now: Instant, error: Error) {
        log::warn!("{error}");
        self.failure = Some(error);
        self.finished = Some(now);
        self.retransmit.clear();
        self.timers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_print_on_one_line() {
        let stats = Stats {
            chunks: 3,
            packets_sent: 4,
            bytes_sent: 2_500_000,
            packets_received: 3,
            bytes_received: 1_250_000,
            retransmissions: 1,
            fast_retransmissions: 0,
            timeouts: 1,
            spurious: 0,
            probes: 0,
            from_cache: 1,
            duplicates: 0,
            ignored: 2,
            rescaled: 0,
            window: 5,
            max_open: 6,
            window_decreases: 1,
            elapsed: Duration::from_millis(1500),
        };
        assert_eq!(
            stats.to_string(),
            "3 chunks, 4 sent (2.5 MB), 3 received (1.2 MB), 1 retransmitted (0 probes, \
             0 unneeded), 1 timeouts, 1 from cache, 0 duplicates, 2 ignored, window 5 (at most 6 open, 1 decreases), \
             1.500 s"
        );
    }

    const MS: Duration = Duration::from_millis(1);

    fn member(rank: u8, fan_in: u8, elems_per_packet: u16, slots: u32) -> Member {
        Member {
            job: 9,
            rank,
            fan_in,
            elems_per_packet,
            slots,
            op: Op::Sum,
            dtype: DType::I32,
            mode: Mode::Allreduce,
        }
    }

    /// An allreduce engine whose data chunks have the chunk numbers `first`,
    /// `first + 1`, ...: its call check (the chunks before `first`, one per
    /// `elems_per_packet` of its 8 numbers) is sent and answered at `t0`, and
    /// the round-trip samples that gave are forgotten, so the tests below see
    /// the data chunks alone.
    fn start(
        member: Member,
        config: Config,
        first: u64,
        data: &mut [i32],
        t0: Instant,
    ) -> Engine<'_, i32> {
        let checks = CHECK_LEN.div_ceil(usize::from(member.elems_per_packet));
        let mut engine = Engine::new(
            member,
            config,
            Collective::Allreduce,
            first.wrapping_sub(checks as u64),
            data,
            t0,
        )
        .expect("valid parameters");
        for _ in 0..checks {
            let (check, values, _) = sent(&mut engine, t0).expect("the call check");
            let n = i32::from(member.fan_in);
            let sums: Vec<i32> = values.iter().map(|v| v * n).collect();
            engine.handle_packet(t0, &result(&check, &sums, 0));
        }
        assert_eq!(engine.base, checks, "the check passed");
        engine.rtt = RttEstimator::new();
        engine.congestion = Window::new();
        engine
    }

    /// The bytes of a call check cut into `chunks` datagrams.
    const fn check_bytes(chunks: u64) -> u64 {
        chunks * HEADER_LEN as u64 + 4 * CHECK_LEN as u64
    }

    fn sent(engine: &mut Engine<'_, i32>, now: Instant) -> Option<(Repr, Vec<i32>, Vec<u8>)> {
        let mut buf = [0; MAX_DATAGRAM_LEN];
        let len = engine.poll_transmit(now, &mut buf)?;
        let packet = Packet::new_checked(&buf[..len]).expect("a whole packet");
        let repr = Repr::parse(&packet).expect("a valid header");
        assert_eq!(len, repr.buffer_len());
        let values = (0..usize::from(repr.count))
            .map(|i| packet.i32_at(i))
            .collect();
        Some((repr, values, buf[..len].to_vec()))
    }

    /// The switch's result for a contribution with header `to`.
    fn result(to: &Repr, values: &[i32], flags: u8) -> Vec<u8> {
        let repr = Repr {
            kind: Kind::AggResult,
            flags: Flags(flags),
            count: u16::try_from(values.len()).unwrap(),
            bitmap: (1 << to.fan_in) - 1,
            ..*to
        };
        let mut buf = vec![0; repr.buffer_len()];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut packet);
        for (i, v) in values.iter().enumerate() {
            packet.set_i32_at(i, *v);
        }
        buf
    }

    #[test]
    fn the_window_holds_back_chunk_c_until_the_result_of_c_minus_w() {
        let t0 = Instant::now();
        let mut data: Vec<i32> = (1..=10).collect();
        let mut engine = start(member(1, 2, 4, 2), Config::default(), 0, &mut data, t0);
        assert_eq!(engine.chunks(), 5, "2 check chunks and 3 data chunks");

        let (r0, v0, _) = sent(&mut engine, t0).expect("chunk 0");
        let (r1, v1, _) = sent(&mut engine, t0).expect("chunk 1");
        assert!(
            sent(&mut engine, t0).is_none(),
            "a window of 2 holds 2 chunks"
        );
        assert_eq!(
            (r0.kind, r0.flags, r0.job, r0.rank, r0.fan_in, r0.bitmap),
            (Kind::AggData, Flags(0), 9, 1, 2, 0b10)
        );
        assert_eq!(
            (r0.seq, r0.slot, r0.slot_version, r0.count),
            (0, 0, false, 4)
        );
        assert_eq!(
            (r1.seq, r1.slot, r1.slot_version, r1.count),
            (1, 1, false, 4)
        );
        assert_eq!((v0, v1), (vec![1, 2, 3, 4], vec![5, 6, 7, 8]));

        // Chunk 2 reuses slot 0: it needs the result of chunk 0, not chunk 1.
        engine.handle_packet(t0 + MS, &result(&r1, &[50, 60, 70, 80], 0));
        assert!(sent(&mut engine, t0 + MS).is_none());
        engine.handle_packet(t0 + 2 * MS, &result(&r0, &[10, 20, 30, 40], 0));
        let (r2, v2, _) = sent(&mut engine, t0 + 2 * MS).expect("chunk 2");
        assert_eq!(
            (r2.seq, r2.slot, r2.slot_version, r2.count),
            (2, 0, true, 2)
        );
        assert_eq!(v2, [9, 10]);
        assert!(!engine.is_done());

        engine.handle_packet(t0 + 3 * MS, &result(&r2, &[90, 100], 0));
        assert!(engine.is_done());
        assert_eq!(engine.next_chunk(), 3);
        let stats = engine.take_outcome().expect("done").expect("success");
        assert!(engine.take_outcome().is_none(), "the outcome is taken once");
        assert_eq!(
            (stats.chunks, stats.packets_sent, stats.packets_received),
            (5, 5, 5)
        );
        assert_eq!(
            stats.bytes_sent,
            check_bytes(2) + 3 * HEADER_LEN as u64 + 40
        );
        assert_eq!(
            (stats.retransmissions, stats.duplicates, stats.ignored),
            (0, 0, 0)
        );
        assert_eq!(stats.elapsed, 3 * MS);
        drop(engine);
        assert_eq!(data, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
    }

    #[test]
    fn slot_and_version_follow_the_chunk_number_across_the_seq_wrap() {
        let m = member(0, 1, 1, 3);
        assert_eq!(m.slot_of(5), (2, true));
        assert_eq!(m.slot_of(6), (0, false));
        let last = u64::from(u32::MAX);
        // (2^32 - 1) / 3 = 1431655765 (odd), 2^32 / 3 = 1431655765 too.
        assert_eq!(
            (Member::seq_of(last), m.slot_of(last)),
            (u32::MAX, (0, true))
        );
        assert_eq!(
            (Member::seq_of(last + 1), m.slot_of(last + 1)),
            (0, (1, true))
        );
        assert_eq!(
            (Member::seq_of(last + 2), m.slot_of(last + 2)),
            (1, (2, true))
        );
        assert_eq!(
            (Member::seq_of(last + 3), m.slot_of(last + 3)),
            (2, (0, false))
        );

        let t0 = Instant::now();
        let mut data = [1, 2, 3];
        let mut engine = start(m, Config::default(), last, &mut data, t0);
        let seqs: Vec<_> = std::iter::from_fn(|| sent(&mut engine, t0))
            .map(|(r, _, _)| (r.seq, r.slot, r.slot_version))
            .collect();
        assert_eq!(seqs, [(u32::MAX, 0, true), (0, 1, true), (1, 2, true)]);
        assert_eq!(engine.next_chunk(), last + 3);
    }

    #[test]
    fn a_chunk_is_retransmitted_after_its_timeout_with_backoff_up_to_max_rto() {
        let config = Config {
            initial_rto: 10 * MS,
            max_rto: 40 * MS,
            ..Config::default()
        };
        let t0 = Instant::now();
        let mut data = [7];
        let mut engine = start(member(0, 2, 8, 4), config, 0, &mut data, t0);
        let (first, _, _) = sent(&mut engine, t0).unwrap();
        assert_eq!(engine.poll_timeout(), Some(t0 + 10 * MS));

        engine.handle_timeout(t0 + 9 * MS);
        assert!(sent(&mut engine, t0 + 9 * MS).is_none(), "not yet");

        let mut at = t0 + 10 * MS;
        for (i, wait) in [20, 40, 40, 40].into_iter().enumerate() {
            engine.handle_timeout(at);
            let (again, values, _) = sent(&mut engine, at).expect("a retransmission");
            assert!(again.flags.contains(Flags::RETRANSMIT));
            assert_eq!(
                Repr {
                    flags: Flags(0),
                    ..again
                },
                first
            );
            assert_eq!(values, [7]);
            assert!(sent(&mut engine, at).is_none());
            assert_eq!(engine.stats().retransmissions, i as u64 + 1);
            assert_eq!(engine.stats().fast_retransmissions, 0);
            assert_eq!(engine.stats().timeouts, i as u64 + 1);
            assert_eq!(engine.poll_timeout(), Some(at + wait * MS));
            at += wait * MS;
        }

        // The result of a retransmitted chunk is no round-trip sample (Karn).
        engine.handle_packet(at, &result(&first, &[8], Flags::FROM_CACHE));
        assert_eq!(engine.rtt().smoothed(), None);
        let stats = engine.take_outcome().unwrap().unwrap();
        assert_eq!((stats.from_cache, stats.packets_sent), (1, 6));
    }

    /// Retransmissions, how many of them went at once, and timeouts.
    fn resends(engine: &Engine<'_, i32>) -> (u64, u64, u64) {
        let stats = engine.stats();
        (
            stats.retransmissions,
            stats.fast_retransmissions,
            stats.timeouts,
        )
    }

    #[test]
    fn a_result_for_a_later_chunk_retransmits_the_earlier_ones_at_once() {
        let t0 = Instant::now();
        let mut data = [1, 2, 3, 4];
        let mut engine = start(member(0, 2, 1, 4), Config::default(), 0, &mut data, t0);
        let mut sent_at = Vec::new();
        for i in 0..4 {
            let at = t0 + i * MS;
            sent_at.push(sent(&mut engine, at).expect("a chunk").0);
        }
        // The result of chunk 2 (sent at 2 ms) arrives at 3 ms: chunks 0 and
        // 1, sent before it, lost something; chunk 3 was sent after it.
        engine.handle_packet(t0 + 3 * MS, &result(&sent_at[2], &[6], 0));
        let again: Vec<u32> = std::iter::from_fn(|| sent(&mut engine, t0 + 3 * MS))
            .map(|(r, _, _)| {
                assert!(r.flags.contains(Flags::RETRANSMIT));
                r.seq
            })
            .collect();
        assert_eq!(again, [0, 1]);
        assert_eq!(resends(&engine), (2, 2, 0));
        // Not a timeout: their timeouts stay the initial 10 ms, not doubled;
        // chunk 3's comes down to the measured 5 ms (1 ms round trip, 5 ms
        // floor) from its send time.
        assert_eq!(engine.poll_timeout(), Some(t0 + 3 * MS + 5 * MS));
    }

    #[test]
    fn a_retransmission_overtaken_by_a_later_chunk_goes_again_at_once() {
        let t0 = Instant::now();
        let mut data = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut engine = start(member(0, 2, 1, 8), Config::default(), 0, &mut data, t0);
        let first = sent(&mut engine, t0).expect("chunk 0").0;
        let one = sent(&mut engine, t0 + MS).expect("chunk 1").0;
        // Chunk 1's result at 3 ms (a 2 ms round trip): chunk 0 goes again.
        engine.handle_packet(t0 + 3 * MS, &result(&one, &[4], 0));
        let again = sent(&mut engine, t0 + 3 * MS).expect("chunk 0 again").0;
        assert_eq!((again.seq, first.seq), (0, 0));
        let two = sent(&mut engine, t0 + 4 * MS).expect("chunk 2").0;
        let three = sent(&mut engine, t0 + 5 * MS).expect("chunk 3").0;
        assert_eq!((two.seq, three.seq), (2, 3));
        // Chunk 2, sent 1 ms after the retransmission, comes back first:
        // that retransmission was lost too, and goes again without waiting
        // for its timeout.
        engine.handle_packet(t0 + 6 * MS, &result(&two, &[6], 0));
        let (third, _, _) = sent(&mut engine, t0 + 6 * MS).expect("chunk 0 a third time");
        assert_eq!(third.seq, 0);
        assert!(third.flags.contains(Flags::RETRANSMIT));
        // Chunk 3, sent after the second copy, is not judged lost: the
        // window goes on with new chunks.
        assert_eq!(sent(&mut engine, t0 + 6 * MS).map(|s| s.0.seq), Some(4));
        assert_eq!(resends(&engine), (2, 2, 0));
    }

    #[test]
    fn results_that_pause_are_probed_mid_call_only_while_losses_are_found() {
        let t0 = Instant::now();
        let mut data = [1; 8];
        let mut engine = start(member(0, 2, 1, 8), Config::default(), 0, &mut data, t0);
        // Chunks 0 and 1 at 0 ms, 2 and 3 at 0.5 ms.
        let chunks: Vec<Repr> = (0..4)
            .map(|i| sent(&mut engine, t0 + (i / 2) * MS / 2).expect("a chunk").0)
            .collect();
        // Chunk 0 back after 1 ms: probes would wait 2 ms (twice that).
        engine.handle_packet(t0 + MS, &result(&chunks[0], &[2], 0));
        let opened = sent(&mut engine, t0 + MS).expect("chunk 4").0;
        // Nothing for 3 ms, nothing lost so far: a pause, not probed; the
        // open chunks wait for their timeouts (5 ms floor).
        engine.handle_timeout(t0 + 4 * MS);
        assert!(sent(&mut engine, t0 + 4 * MS).is_none());
        assert!(engine.poll_timeout().unwrap() >= t0 + 5 * MS);
        // Chunk 2's result: chunk 1, sent before it, is lost and goes at
        // once. From then on a pause is probed after two round trips.
        engine.handle_packet(t0 + 4 * MS, &result(&chunks[2], &[2], 0));
        let again = sent(&mut engine, t0 + 4 * MS).expect("chunk 1 again").0;
        assert_eq!(again.seq, chunks[1].seq);
        while sent(&mut engine, t0 + 4 * MS).is_some() {}
        let (probed, at) = loop {
            let at = engine.poll_timeout().expect("a timer");
            engine.handle_timeout(at);
            let out: Vec<u32> = std::iter::from_fn(|| sent(&mut engine, at))
                .map(|(r, _, _)| r.seq)
                .collect();
            if !out.is_empty() {
                break (out, at);
            }
        };
        assert!(
            probed.contains(&chunks[3].seq) && probed.contains(&opened.seq),
            "probed {probed:?}"
        );
        let stats = engine.stats();
        assert_eq!((stats.probes, stats.timeouts), (probed.len() as u64, 0));
        // Two round trips after the last result, not a timeout later.
        let srtt = engine.rtt().smoothed().unwrap();
        assert!(at <= t0 + 4 * MS + 2 * srtt, "{:?}", at - t0);
    }

    #[test]
    fn a_grown_reordering_allowance_shrinks_after_needed_fast_retransmissions() {
        let mut rtt = RttEstimator::new();
        rtt.sample(4 * MS);
        assert_eq!(rtt.reorder_allowance(MS), MS);
        rtt.on_reordering();
        rtt.on_reordering();
        assert_eq!(rtt.reorder_allowance(MS), 3 * MS);
        for _ in 1..REORDER_PERSIST {
            rtt.on_recovery();
        }
        assert_eq!(rtt.reorder_allowance(MS), 3 * MS, "not yet");
        rtt.on_recovery();
        assert_eq!(rtt.reorder_allowance(MS), MS);
        // An unneeded one in between starts the count again.
        rtt.on_reordering();
        for _ in 1..REORDER_PERSIST {
            rtt.on_recovery();
        }
        rtt.on_reordering();
        rtt.on_recovery();
        assert_eq!(rtt.reorder_allowance(MS), 3 * MS);
    }

    #[test]
    fn after_a_sample_any_result_ends_the_backoff() {
        let mut rtt = RttEstimator::new();
        rtt.on_timeout();
        rtt.on_delivery();
        assert_eq!(rtt.backoff(), 1, "before any sample, only a sample ends it");
        rtt.sample(2 * MS);
        rtt.on_timeout();
        rtt.on_timeout();
        assert_eq!(rtt.backoff(), 2);
        rtt.on_delivery();
        assert_eq!(rtt.backoff(), 0);
    }

    #[test]
    fn a_result_that_answers_the_first_copy_marks_the_retransmission_unneeded() {
        let t0 = Instant::now();
        let mut data = [1, 2, 3, 4];
        let mut engine = start(member(0, 2, 1, 4), Config::default(), 0, &mut data, t0);
        let chunks: Vec<Repr> = (0..3)
            .map(|i| sent(&mut engine, t0 + i * MS).expect("a chunk").0)
            .collect();
        // Chunk 1 (sent at 1 ms) comes back at 2 ms: 1 ms round trip, a
        // quarter of it allowed for reordering; chunk 0 goes again.
        engine.handle_packet(t0 + 2 * MS, &result(&chunks[1], &[4], 0));
        assert_eq!(engine.rtt().reorder_allowance(MS), MS / 4);
        let (again, _, _) = sent(&mut engine, t0 + 2 * MS).expect("chunk 0 again");
        assert_eq!(again.seq, 0);
        // Its first copy's result, 0.1 ms later: sooner than any round
        // trip after the retransmission, so it answers the first copy.
        let at = t0 + 2 * MS + MS / 10;
        engine.handle_packet(at, &result(&chunks[0], &[2], 0));
        let stats = engine.stats();
        assert_eq!((stats.retransmissions, stats.spurious), (1, 1));
        // Reordering is allowed half a round trip from now on. The first
        // copy's 2.1 ms is no sample: after a fast retransmission it may as
        // well be the wait for another rank's recovery.
        let srtt = engine.rtt().smoothed().unwrap();
        assert_eq!(srtt, MS);
        assert_eq!(engine.rtt().reorder_allowance(MS), srtt / 2);
        // A result that comes a round trip after the retransmission is no
        // such evidence.
        let (last, _, _) = sent(&mut engine, at).expect("chunk 3");
        engine.handle_packet(at + MS, &result(&chunks[2], &[6], 0));
        let (again, deadline) = loop {
            let deadline = engine.poll_timeout().unwrap();
            engine.handle_timeout(deadline);
            if let Some((again, _, _)) = sent(&mut engine, deadline) {
                break (again, deadline);
            }
        };
        assert_eq!(again.seq, last.seq);
        engine.handle_packet(deadline + 2 * MS, &result(&last, &[8], 0));
        assert_eq!(engine.stats().spurious, 1);
        assert!(engine.take_outcome().unwrap().is_ok());
    }

    #[test]
    fn the_last_chunks_open_are_probed_after_two_round_trips() {
        let t0 = Instant::now();
        let mut data = [5, 6];
        let mut engine = start(member(0, 2, 1, 4), Config::default(), 0, &mut data, t0);
        engine.rtt.sample_sized(2 * MS, 4);
        let first = sent(&mut engine, t0).expect("chunk 0").0;
        let last = sent(&mut engine, t0 + MS / 2).expect("chunk 1").0;
        // Every chunk is out: both are probed 4 ms (twice the round trip)
        // after they left, long before their 5 ms timeout floor...
        assert_eq!(engine.poll_timeout(), Some(t0 + 4 * MS));
        // ...unless a result came since: chunk 0's at 3 ms (the smoothed
        // round trip becomes 2.125 ms) moves chunk 1's probe to 7.25 ms.
        engine.handle_packet(t0 + 3 * MS, &result(&first, &[10], 0));
        let (probe, values, at) = loop {
            let deadline = engine.poll_timeout().unwrap();
            engine.handle_timeout(deadline);
            if let Some((probe, values, _)) = sent(&mut engine, deadline) {
                break (probe, values, deadline);
            }
        };
        assert_eq!(at, t0 + Duration::from_micros(7250));
        assert_eq!((probe.seq, values), (last.seq, vec![6]));
        assert!(probe.flags.contains(Flags::RETRANSMIT));
        let stats = engine.stats();
        assert_eq!((stats.probes, stats.timeouts), (1, 0));
        assert_eq!(engine.rtt().backoff(), 0, "a probe is no timeout");
        // Once: after the probe the chunk's own timeout applies.
        let deadline = engine.poll_timeout().unwrap();
        assert!(deadline >= at + 5 * MS, "{:?}", deadline - t0);
        engine.handle_packet(t0 + 8 * MS, &result(&last, &[12], Flags::FROM_CACHE));
        assert!(engine.take_outcome().unwrap().is_ok());
    }

    #[test]
    fn a_timeout_backs_off_the_chunks_sent_after_it_until_a_sample() {
        let config = Config {
            initial_rto: 10 * MS,
            max_rto: 100 * MS,
            ..Config::default()
        };
        let mut rtt = RttEstimator::new();
        assert_eq!(rtt.rto(&config), 10 * MS);
        rtt.on_timeout();
        assert_eq!(rtt.rto(&config), 20 * MS);
        for _ in 0..10 {
            rtt.on_timeout();
        }
        assert_eq!(rtt.rto(&config), 100 * MS, "at most max_rto");
        rtt.sample(12 * MS);
        assert_eq!(rtt.backoff(), 0);
        // 12 ms + 4 x 6 ms.
        assert_eq!(rtt.rto(&config), 36 * MS);
    }

    #[test]
    fn open_chunks_take_a_timeout_that_grew_with_the_round_trip() {
        let config = Config {
            initial_rto: 10 * MS,
            ..Config::default()
        };
        let t0 = Instant::now();
        let mut data = [1, 2, 3];
        let mut engine = start(member(0, 2, 1, 4), config, 0, &mut data, t0);
        let (first, _, _) = sent(&mut engine, t0).expect("a chunk");
        sent(&mut engine, t0).expect("a chunk");
        sent(&mut engine, t0).expect("a chunk");
        assert_eq!(engine.poll_timeout(), Some(t0 + config.initial_rto));
        // The first result comes back after 20 ms (a queue on the way):
        // from now on a timeout of 20 + 4 x 10 = 60 ms, and the two chunks
        // still open take it from when they were sent, rather than timing
        // out on the 10 ms they left with.
        engine.handle_packet(t0 + 20 * MS, &result(&first, &[2], 0));
        assert_eq!(engine.poll_timeout(), Some(t0 + 60 * MS));
        engine.handle_timeout(t0 + 30 * MS);
        assert!(sent(&mut engine, t0 + 30 * MS).is_none(), "nothing resent");
        assert_eq!(engine.stats().retransmissions, 0);
        // At 60 ms (two round trips after the last result) the call's
        // last chunks are probed, once each; their timeouts count from the
        // probe, as TCP restarts its timer on every acknowledgement.
        engine.handle_timeout(t0 + 60 * MS);
        let probes: Vec<_> = std::iter::from_fn(|| sent(&mut engine, t0 + 60 * MS)).collect();
        assert_eq!(probes.len(), 2);
        assert!(
            probes
                .iter()
                .all(|(r, _, _)| r.flags.contains(Flags::RETRANSMIT))
        );
        let stats = engine.stats();
        assert_eq!((stats.probes, stats.timeouts), (2, 0));
        assert_eq!(engine.poll_timeout(), Some(t0 + 120 * MS));
    }

    #[test]
    fn the_timeout_comes_from_measured_round_trips() {
        let config = Config::default();
        let mut rtt = RttEstimator::new();
        assert_eq!(rtt.rto(&config), config.initial_rto);
        rtt.sample(2 * MS);
        assert_eq!((rtt.smoothed(), rtt.variation()), (Some(2 * MS), MS));
        assert_eq!(rtt.rto(&config), 6 * MS);
        for _ in 0..100 {
            rtt.sample(Duration::from_micros(20));
        }
        assert_eq!(rtt.rto(&config), config.min_rto, "floored");
        // One slow chunk (another rank's loss) moves nothing; a run of them
        // (a slower path) does.
        let calm = rtt;
        rtt.sample(Duration::from_secs(30));
        assert_eq!(rtt.smoothed(), calm.smoothed(), "an outlier is set aside");
        for _ in 0..OUTLIER_RUN {
            rtt.sample(Duration::from_secs(30));
        }
        assert_eq!(rtt.rto(&config), config.max_rto, "capped");

        let t0 = Instant::now();
        let mut data = [1, 2];
        let mut engine = start(member(0, 1, 1, 2), config, 0, &mut data, t0);
        let (r0, _, _) = sent(&mut engine, t0).unwrap();
        engine.handle_packet(t0 + 4 * MS, &result(&r0, &[1], 0));
        assert_eq!(engine.rtt().smoothed(), Some(4 * MS));
        let (r1, _, _) = sent(&mut engine, t0 + 4 * MS).unwrap();
        // 4 + 4 x 2 = 12 ms; the last chunk of the call is probed sooner,
        // after two round trips.
        assert_eq!(engine.rtt().rto(&config), 12 * MS);
        assert_eq!(engine.poll_timeout(), Some(t0 + 4 * MS + 8 * MS));
        engine.handle_packet(t0 + 5 * MS, &result(&r1, &[2], 0));
        assert!(engine.take_outcome().unwrap().is_ok());
    }

    #[test]
    fn the_congestion_window_opens_with_results_and_shuts_on_long_round_trips() {
        let t0 = Instant::now();
        let mut data = vec![0; 64];
        let mut engine = start(member(0, 1, 1, 16), Config::default(), 0, &mut data, t0);
        let burst = |engine: &mut Engine<'_, i32>, now| {
            std::iter::from_fn(|| sent(engine, now)).collect::<Vec<_>>()
        };
        let first = burst(&mut engine, t0);
        assert_eq!(first.len(), 4, "the initial window, not the 16 slots");
        // Slow start: each result of a full window opens two chunks.
        let mut now = t0 + MS;
        engine.handle_packet(now, &result(&first[0].0, &[0], 0));
        assert_eq!(burst(&mut engine, now).len(), 2);
        assert_eq!(engine.window_limit(), 5);
        for (repr, _, _) in &first[1..] {
            engine.handle_packet(now, &result(repr, &[0], 0));
        }
        let open = burst(&mut engine, now);
        assert_eq!(engine.window_limit(), 8);
        assert_eq!(open.len() + 2, 8, "as many open as the window");
        // A round of round trips of 11 ms against a target of 2 ms (1 ms
        // lowest plus the 1 ms queue target): the window stops growing, and
        // shrinks once the round is over, by half at most.
        now = t0 + 12 * MS;
        for (repr, _, _) in &open {
            engine.handle_packet(now, &result(repr, &[0], 0));
        }
        assert_eq!(engine.window_limit(), 8);
        let next = burst(&mut engine, now);
        engine.handle_packet(t0 + 24 * MS, &result(&next[0].0, &[0], 0));
        assert_eq!(engine.window_limit(), 4);
        assert_eq!(engine.stats().window_decreases, 1);
        assert_eq!(engine.stats().max_open, 8);
    }

    #[test]
    fn without_congestion_control_every_slot_is_open() {
        let t0 = Instant::now();
        let mut data = vec![0; 64];
        let fixed = Config {
            queue_target: None,
            ..Config::default()
        };
        let mut engine = start(member(0, 1, 1, 16), fixed, 0, &mut data, t0);
        assert_eq!(std::iter::from_fn(|| sent(&mut engine, t0)).count(), 16);
        assert_eq!(engine.stats().window, 16);
    }

    #[test]
    fn no_progress_for_give_up_fails_naming_the_outstanding_seqs() {
        let config = Config {
            give_up: Duration::from_secs(1),
            queue_target: None,
            ..Config::default()
        };
        let t0 = Instant::now();
        let mut data = vec![0; 40];
        let mut engine = start(member(2, 3, 1, 20), config, 100, &mut data, t0);
        let first: Vec<_> = std::iter::from_fn(|| sent(&mut engine, t0)).collect();
        assert_eq!(first.len(), 20);

        // A result at 900 ms pushes the give-up time to 1.9 s.
        let progress_at = t0 + 900 * MS;
        let mut delivered = false;
        let mut now = t0;
        for _ in 0..10_000 {
            let Some(deadline) = engine.poll_timeout() else {
                break;
            };
            assert!(deadline > now, "deadlines move forward");
            if !delivered && deadline >= progress_at {
                delivered = true;
                now = progress_at;
                engine.handle_packet(now, &result(&first[0].0, &[0], 0));
                while sent(&mut engine, now).is_some() {}
                continue;
            }
            now = deadline;
            engine.handle_timeout(now);
            while sent(&mut engine, now).is_some() {}
        }
        assert_eq!(now, t0 + 1900 * MS);
        let error = engine.take_outcome().expect("done").expect_err("gave up");
        let Error::GaveUp {
            job,
            rank,
            waited,
            completed,
            total,
            outstanding,
            ..
        } = &error
        else {
            panic!("{error}");
        };
        assert_eq!(
            (*job, *rank, *waited, *completed, *total),
            (9, 2, 1000 * MS, 9, 48)
        );
        // Chunk 0 done let chunk 20 (seq 120) go.
        let mut expected: Vec<u32> = (101..120).collect();
        expected.push(120);
        assert_eq!(outstanding.total, 20);
        assert_eq!(outstanding.first, expected[..SeqList::SHOWN]);
        assert_eq!(
            error.to_string(),
            "job 9, rank 2: no new result for 1s (9 of 48 chunks completed); 20 chunk(s) \
             outstanding: seq 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, \
             113, 114, 115, 116 and 4 more"
        );
        assert!(engine.poll_timeout().is_none());
        assert!(
            sent(&mut engine, now).is_none(),
            "a failed engine sends nothing"
        );
    }

    #[test]
    fn anything_but_an_awaited_result_is_ignored_and_duplicates_are_counted() {
        let t0 = Instant::now();
        let mut data = [1, 2, 3, 4, 5, 6];
        let mut engine = start(member(0, 2, 4, 1), Config::default(), 0, &mut data, t0);
        let (r0, _, contribution) = sent(&mut engine, t0).unwrap();
        let good = result(&r0, &[2, 4, 6, 8], 0);

        let mut other_job = good.clone();
        Packet::new_unchecked(&mut other_job[..]).set_job(10);
        let mut wrong_slot = good.clone();
        Packet::new_unchecked(&mut wrong_slot[..]).set_slot(0, true);
        let mut not_mine = good.clone();
        Packet::new_unchecked(&mut not_mine[..]).set_bitmap(0b10);
        let mut bad_magic = good.clone();
        bad_magic[0] = 0;
        let rejects = [
            &[][..],
            &good[..HEADER_LEN + 3],
            &bad_magic,
            &contribution,
            &other_job,
            &wrong_slot,
            &not_mine,
            &result(&r0, &[2, 4, 6], 0),
            &result(&Repr { seq: 1, ..r0 }, &[2, 4], 0),
            &result(
                &Repr {
                    seq: u32::MAX - 5,
                    ..r0
                },
                &[2, 4, 6, 8],
                0,
            ),
        ];
        for datagram in rejects {
            engine.handle_packet(t0, datagram);
        }
        assert_eq!(engine.stats().ignored, rejects.len() as u64);
        assert!(sent(&mut engine, t0).is_none(), "nothing was accepted");

        engine.handle_packet(t0 + MS, &good);
        engine.handle_packet(t0 + MS, &good);
        assert_eq!(engine.stats().duplicates, 1);
        let (r1, _, _) = sent(&mut engine, t0 + MS).unwrap();
        engine.handle_packet(t0 + 2 * MS, &result(&r1, &[10, 12], 0));
        engine.handle_packet(t0 + 2 * MS, &good);
        let stats = engine.take_outcome().unwrap().unwrap();
        assert_eq!(
            (stats.duplicates, stats.ignored, stats.packets_received),
            (2, 10, 16)
        );
        drop(engine);
        assert_eq!(data, [2, 4, 6, 8, 10, 12]);
    }

    #[test]
    fn an_overflowed_result_fails_the_call_once_every_chunk_is_in() {
        let t0 = Instant::now();
        let mut data = vec![0; 10];
        let mut engine = start(member(0, 2, 4, 4), Config::default(), 7, &mut data, t0);
        let sent: Vec<_> = std::iter::from_fn(|| sent(&mut engine, t0)).collect();
        assert_eq!(sent.len(), 3);
        engine.handle_packet(t0, &result(&sent[2].0, &[i32::MAX, 0], Flags::OVERFLOW));
        engine.handle_packet(
            t0,
            &result(&sent[1].0, &[0, i32::MIN, 0, 0], Flags::OVERFLOW),
        );
        assert!(!engine.is_done(), "chunk 0 is still awaited");
        engine.handle_packet(t0, &result(&sent[0].0, &[0; 4], 0));
        let error = engine.take_outcome().unwrap().expect_err("overflow");
        let Error::Overflow {
            job,
            rank,
            seq,
            elements,
            chunks,
        } = &error
        else {
            panic!("{error}");
        };
        assert_eq!(
            (*job, *rank, *seq, elements.clone(), *chunks),
            (9, 0, 8, 4..8, 2)
        );
        assert_eq!(
            error.to_string(),
            "job 9, rank 0: sum overflowed in chunk seq 8 (elements 4..8); \
             2 chunk(s) overflowed in this call"
        );
    }

    #[test]
    fn an_empty_buffer_is_just_the_call_check() {
        let t0 = Instant::now();
        let mut engine = Engine::<i32>::new(
            member(0, 4, 256, 8),
            Config::default(),
            Collective::Allreduce,
            42,
            &mut [],
            t0,
        )
        .unwrap();
        assert_eq!((engine.chunks(), engine.next_chunk()), (1, 43));
        let (check, values, _) = sent(&mut engine, t0).expect("the check");
        assert_eq!((check.seq, check.count), (42, 8));
        assert_eq!(values, [1, 0, 0, 0, 1, 0, 0, 0], "allreduce of 0 elements");
        assert!(sent(&mut engine, t0).is_none());
        engine.handle_packet(t0 + MS, &result(&check, &[4, 0, 0, 0, 4, 0, 0, 0], 0));
        let stats = engine.take_outcome().unwrap().unwrap();
        assert_eq!((stats.chunks, stats.packets_sent), (1, 1));
    }

    #[test]
    fn a_call_check_that_disagrees_fails_the_call_naming_it() {
        let t0 = Instant::now();
        let mut data = vec![5; 5000];
        let mut engine = Engine::new(
            member(1, 2, 8, 4),
            Config::default(),
            Collective::Allreduce,
            0,
            &mut data,
            t0,
        )
        .unwrap();
        let (check, values, _) = sent(&mut engine, t0).unwrap();
        // 5000 = 904 + 1 × 4096: code 1, digits 904, 1, 0.
        assert_eq!(values, [1, 904, 1, 0, 1, 904 * 904, 1, 0]);
        // The other rank called with 5001 elements.
        let sums = [2, 1809, 2, 0, 2, 904 * 904 + 905 * 905, 2, 0];
        engine.handle_packet(t0 + MS, &result(&check, &sums, 0));
        let error = engine.take_outcome().unwrap().expect_err("mismatch");
        assert_eq!(
            error.to_string(),
            "job 9, rank 1: the ranks did not all make the same call (this rank: allreduce of \
             5000 elements); the job's chunk numbering is now out of step, reinstall it"
        );
        assert!(sent(&mut engine, t0 + MS).is_none(), "nothing more is sent");
    }

    #[test]
    fn reduce_modes_root_each_chunk_and_take_notices_for_the_others() {
        let t0 = Instant::now();
        let rs = Member {
            mode: Mode::ReduceScatter,
            ..member(1, 2, 2, 16)
        };
        let mut data = [1, 2, 3, 4, 5, 6];
        let fixed = Config {
            queue_target: None,
            ..Config::default()
        };
        let mut engine =
            Engine::new(rs, fixed, Collective::ReduceScatter, 0, &mut data, t0).unwrap();
        // Two checks (one per root, 4 chunks each) and parts of 3 elements
        // (2 chunks each).
        assert_eq!(engine.chunks(), 8 + 4);
        let all: Vec<_> = std::iter::from_fn(|| sent(&mut engine, t0)).collect();
        let roots: Vec<u8> = all.iter().map(|(r, _, _)| r.root).collect();
        assert_eq!(roots, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1]);
        let payloads: Vec<Vec<i32>> = all[8..].iter().map(|(_, v, _)| v.clone()).collect();
        assert_eq!(payloads, [vec![1, 2], vec![3], vec![4, 5], vec![6]]);
        for (repr, values, _) in &all {
            let reply = if repr.root == 1 {
                let doubled: Vec<i32> = values.iter().map(|v| 2 * v).collect();
                result(repr, &doubled, 0)
            } else {
                // Rank 1 is not the root: a notice; a payload would be ignored.
                engine.handle_packet(t0, &result(repr, values, 0));
                result(repr, &[], Flags::NOTICE)
            };
            engine.handle_packet(t0 + MS, &reply);
        }
        let stats = engine.take_outcome().unwrap().expect("success");
        assert_eq!(stats.ignored, 6, "the payloads where notices were due");
        drop(engine);
        assert_eq!(
            data,
            [1, 2, 3, 8, 10, 12],
            "part 1 reduced, part 0 untouched"
        );
    }

    #[test]
    fn calls_the_job_cannot_carry_are_refused_before_sending() {
        let t0 = Instant::now();
        let reduce = Member {
            mode: Mode::Reduce,
            ..member(0, 4, 8, 8)
        };
        let refuse = |m: Member, c: Collective, len: usize| {
            Engine::new(m, Config::default(), c, 0, &mut vec![0i32; len], t0)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            refuse(reduce, Collective::Allreduce, 4),
            "job 9 is installed in reduce mode; allreduce needs a job in allreduce mode"
        );
        assert_eq!(
            refuse(reduce, Collective::Reduce { root: 4 }, 4),
            "job 9: root 4 is not a rank (fan-in 4, ranks 0..4)"
        );
        let rs = Member {
            mode: Mode::ReduceScatter,
            ..reduce
        };
        assert_eq!(
            refuse(rs, Collective::ReduceScatter, 6),
            "job 9: reduce-scatter of 6 elements: the length must be a multiple of the fan-in 4"
        );
        let i64_job = Member {
            dtype: DType::I64,
            ..member(0, 4, 8, 8)
        };
        assert_eq!(
            refuse(i64_job, Collective::Allreduce, 4),
            "job 9 carries int64 elements; allreduce of int32 is not supported on it"
        );
    }

    #[test]
    fn invalid_parameters_are_rejected_with_specific_errors() {
        let ok = member(0, 2, 4, 4);
        let cases = [
            (
                Member { fan_in: 0, ..ok },
                "job 9: fan-in 0 is out of range 1..=64",
            ),
            (
                Member { fan_in: 65, ..ok },
                "job 9: fan-in 65 is out of range 1..=64",
            ),
            (
                Member { rank: 2, ..ok },
                "job 9: rank 2 is not a member (fan-in 2, ranks 0..2)",
            ),
            (
                Member {
                    elems_per_packet: 0,
                    ..ok
                },
                "job 9: 0 elements per packet is out of range 1..=16128 for int32",
            ),
            (
                Member {
                    elems_per_packet: 16_129,
                    ..ok
                },
                "job 9: 16129 elements per packet is out of range 1..=16128 for int32",
            ),
            (
                Member { slots: 0, ..ok },
                "job 9: a window of 0 slots is out of range 1..=16777216",
            ),
            (
                Member {
                    slots: MAX_WINDOW + 1,
                    ..ok
                },
                "job 9: a window of 16777217 slots is out of range 1..=16777216",
            ),
        ];
        for (m, message) in cases {
            let error = Engine::new(
                m,
                Config::default(),
                Collective::Allreduce,
                0,
                &mut [1],
                Instant::now(),
            )
            .expect_err("invalid");
            assert_eq!(error.to_string(), message);
        }
        assert!(
            Member {
                fan_in: 64,
                rank: 63,
                elems_per_packet: 256,
                ..ok
            }
            .validate()
            .is_ok()
        );

        let bad_configs = [
            Config {
                min_rto: Duration::ZERO,
                ..Config::default()
            },
            Config {
                initial_rto: Duration::from_micros(10),
                ..Config::default()
            },
            Config {
                max_rto: MS,
                ..Config::default()
            },
            Config {
                give_up: Duration::ZERO,
                ..Config::default()
            },
        ];
        for config in bad_configs {
            let error = Engine::new(
                ok,
                config,
                Collective::Allreduce,
                0,
                &mut [1],
                Instant::now(),
            )
            .unwrap_err();
            assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
        }
    }
}

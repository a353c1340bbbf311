//! A simulated switch and a deterministic lossy network, to run the engine
//! without sockets.
//!
//! - [`SwitchModel`]: the switch's aggregation semantics in plain Rust, the
//!   reference the XDP dataplane must agree with. It takes a contribution and
//!   returns at most one reply (a result for every member, or a cached result
//!   for the sender).
//! - [`Network`]: datagrams in flight between [`Endpoint`]s with seeded loss,
//!   duplication and reordering ([`LinkConfig`]), in simulated time.
//! - [`Cluster`]: `fan_in` [`Engine`]s, the switch model and the
//!   network in one discrete-event loop, with dead ranks and start skew; it
//!   keeps the switch state and every rank's chunk numbers across calls.
//! - [`SplitMix64`]: the tiny pseudo-random generator behind it all, so a seed
//!   reproduces a run exactly.
//!
//! ```
//! use xina_host::sim::{Cluster, ClusterConfig, LinkConfig};
//!
//! let mut config = ClusterConfig::new(3, 4, 2);
//! config.link = LinkConfig::lossy(0.05, 0.01, 0.1);
//! let mut cluster = Cluster::new(config);
//! let mut inputs = vec![vec![1, 2, 3, 4, 5]; 3];
//! let round = cluster.allreduce(&mut inputs).expect("the run terminates");
//! assert!(round.outcomes.iter().all(|o| matches!(o, Some(Ok(_)))));
//! assert_eq!(inputs[0], [3, 6, 9, 12, 15]);
//! ```

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use xina_proto::header::SLOT_VERSION_BIT;
use xina_proto::{DType, Flags, Kind, MAX_RANKS, Op, Packet, Repr};

use crate::call::{Plan, Scalar, StepData, StepOutcome};
use crate::congestion::Window;
use crate::engine::{
    Collective, Config, Element, Engine, MAX_DATAGRAM_LEN, Member, Mode, RttEstimator, Stats,
};
use crate::error::Error;

/// `SplitMix64`: a small, fast, seedable pseudo-random generator (not for
/// cryptography).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform value in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // 53 random bits: every value is exact in an f64.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }

    /// A value in `0..=max` (nearly uniform; the bias is below 2^-32 for the
    /// ranges a simulation uses).
    pub fn up_to(&mut self, max: u64) -> u64 {
        match max.checked_add(1) {
            Some(n) => self.next_u64() % n,
            None => self.next_u64(),
        }
    }

    /// A duration in `0..=max`, to the nanosecond.
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.up_to(nanos))
    }
}

/// Where a [`SwitchModel`] reply goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// Every member of the job (a chunk just completed).
    AllMembers,
    /// One rank (a retransmission answered from the slot's stored result).
    Rank(u8),
}

/// A datagram the switch sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Who receives it.
    pub to: Destination,
    /// The UDP payload: xina header and payload.
    pub datagram: Vec<u8>,
}

/// What the [`SwitchModel`] did with the datagrams it was given. Each
/// datagram lands in exactly one of these but `completed`, as each frame of
/// the dataplane ends in one outcome counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Contributions that started a slot copy (first of a chunk).
    pub initialised: u64,
    /// Contributions added to a slot copy.
    pub combined: u64,
    /// Chunks completed (results sent to all members). The completing
    /// contribution is also counted as initialised or combined.
    pub completed: u64,
    /// Results sent from a slot's stored copy to one rank.
    pub from_cache: u64,
    /// Contributions from a rank already counted in an incomplete chunk.
    pub duplicates: u64,
    /// Contributions for a chunk that is neither the one their slot copy
    /// holds nor the next one it may take (`seq + 2 × slots`).
    pub stale: u64,
    /// Contributions whose shape disagrees with the job (element type, op,
    /// fan-in, an element count of 0 or above the job's, a root that is not
    /// a rank) or with the chunk in the slot copy (element count, root).
    pub bad_shape: u64,
    /// Datagrams that are not xina packets.
    pub malformed: u64,
    /// xina packets refused: not aggregation data, an unknown job, a rank that
    /// is not a member, a slot outside the job's range.
    pub rejected: u64,
}

/// A job as the [`SwitchModel`] holds it: what the control plane installs
/// in the dataplane's job table, minus the members' addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobConfig {
    /// Ranks `0..fan_in` contribute to every chunk (1 to 64).
    pub fan_in: u8,
    /// The job's aggregator slots `W`; each has two copies.
    pub slots: u32,
    /// Most elements in one contribution.
    pub elems_per_packet: u16,
    /// How elements combine.
    pub op: Op,
    /// The element type.
    pub dtype: DType,
    /// Who gets the results (see [`SwitchModel::copy_for`]).
    pub mode: Mode,
}

impl JobConfig {
    /// An `int32` sum allreduce with packets of up to [`DType::max_elems`]
    /// elements.
    pub const fn sum_i32(fan_in: u8, slots: u32) -> Self {
        Self {
            fan_in,
            slots,
            elems_per_packet: DType::I32.narrow_elems() as u16,
            op: Op::Sum,
            dtype: DType::I32,
            mode: Mode::Allreduce,
        }
    }
}

#[derive(Clone, Debug)]
struct SlotCopy {
    seq: u32,
    count: u16,
    root: u8,
    bitmap: u64,
    overflow: bool,
    /// Accumulators, clamped to the element type once the chunk completes.
    values: Vec<i64>,
}

#[derive(Clone, Debug)]
struct JobState {
    config: JobConfig,
    /// Slot copies by (slot index, version bit), created on first use.
    copies: HashMap<(u32, bool), SlotCopy>,
}

impl JobState {
    fn all_ranks(&self) -> u64 {
        if usize::from(self.config.fan_in) == MAX_RANKS {
            u64::MAX
        } else {
            (1 << self.config.fan_in) - 1
        }
    }
}

/// The switch's aggregation semantics, as the XDP dataplane implements them
/// (`ebpf/xina-ebpf/src/slot.rs` and `switch.rs`), for the allreduce
/// delivery mode: every completed chunk goes to every member.
///
/// Admission, in the dataplane's order: the packet must be aggregation data
/// of an installed job from a rank below its fan-in (else `rejected`); its
/// element type, op and fan-in must be the job's, its element count between
/// 1 and the job's elements per packet, its root a rank (else `bad_shape`);
/// its slot must lie in the job's range (else `rejected`).
///
/// Then, for a contribution with sequence number `s` from rank `r` to copy
/// `version` of slot `slot` (both taken from the header; `W` is the job's
/// slot count, so one copy holds chunks `s`, `s + 2W`, ...):
///
/// | copy holds                 | contribution        | action                                   |
/// |----------------------------|---------------------|------------------------------------------|
/// | nothing (never used)       | any `s`             | initialise with it                       |
/// | chunk `s - 2W` (wrapping)  | `s`                 | initialise with it                       |
/// | any other chunk than `s`   | `s`                 | drop (`stale`)                           |
/// | chunk `s`                  | other count or root | drop (`bad_shape`)                       |
/// | chunk `s`, partial         | `r` not yet counted | combine; if all ranks: result to all     |
/// | chunk `s`, partial         | `r` counted         | drop (`duplicates`)                      |
/// | chunk `s`, complete        | `r` counted         | stored result to the sender, `FROM_CACHE`|
///
/// Combining: `int32` sums accumulate in `i64` (64 ranks cannot overflow it)
/// and are clamped to `i32` once, when the chunk completes, with
/// [`Flags::OVERFLOW`] set if an element had to be, so the result does not
/// depend on the order of arrival. `int64` sums saturate at each step and
/// set the flag when they do (so they can depend on the order). Max and min
/// never overflow. A job with `fan_in` 1 completes on every first
/// contribution.
///
/// A result is the contribution that completed the chunk (or the
/// retransmission answered from the copy) turned around: kind
/// [`Kind::AggResult`], the flags byte replaced by the result's flags
/// (`OVERFLOW`, `FROM_CACHE`; a `RETRANSMIT` bit does not survive), the
/// bitmap of the ranks that contributed, the payload replaced by the
/// chunk's values; every other field, the sender's rank, the exponent and
/// the root among them, is echoed.
#[derive(Clone, Debug, Default)]
pub struct SwitchModel {
    jobs: HashMap<u32, JobState>,
    stats: SwitchStats,
}

impl SwitchModel {
    /// A switch without jobs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs (or replaces, with empty slots) an `int32` sum job with
    /// packets of up to [`DType::max_elems`] elements.
    ///
    /// # Panics
    /// If `fan_in` is not in `1..=64` or `slots` is 0.
    pub fn add_job(&mut self, job: u32, fan_in: u8, slots: u32) {
        self.add_job_with(job, JobConfig::sum_i32(fan_in, slots));
    }

    /// Installs (or replaces, with empty slots) a job.
    ///
    /// # Panics
    /// If `fan_in` is not in `1..=64`, `slots` is 0 or above 2^31 (the slot
    /// field's index bits), or `elems_per_packet` is 0 or more than a packet
    /// holds of the element type.
    pub fn add_job_with(&mut self, job: u32, config: JobConfig) {
        let JobConfig {
            fan_in,
            slots,
            elems_per_packet,
            dtype,
            ..
        } = config;
        assert!(
            (1..=MAX_RANKS).contains(&usize::from(fan_in)),
            "fan-in {fan_in}"
        );
        assert!(
            slots > 0 && slots <= SLOT_VERSION_BIT,
            "a job needs 1 to 2^31 slots, not {slots}"
        );
        assert!(
            elems_per_packet > 0 && usize::from(elems_per_packet) <= dtype.max_elems(),
            "{elems_per_packet} elements of {dtype:?} per packet"
        );
        assert!(
            dtype != DType::Bytes,
            "the simulated switch aggregates integers; bytes are multicast payload"
        );
        self.jobs.insert(
            job,
            JobState {
                config,
                copies: HashMap::new(),
            },
        );
    }

    /// What the switch has done so far.
    pub const fn stats(&self) -> &SwitchStats {
        &self.stats
    }

    /// Processes one datagram sent to the switch and returns the datagram the
    /// switch sends in answer, if any.
    pub fn handle(&mut self, datagram: &[u8]) -> Option<Reply> {
        let Some((repr, packet)) = Packet::new_checked(datagram)
            .ok()
            .and_then(|p| Some((Repr::parse(&p).ok()?, p)))
        else {
            self.stats.malformed += 1;
            return None;
        };
        let stats = &mut self.stats;
        let Some(job) = self.jobs.get_mut(&repr.job) else {
            stats.rejected += 1;
            return None;
        };
        let config = job.config;
        if repr.kind != Kind::AggData || repr.rank >= config.fan_in {
            stats.rejected += 1;
            return None;
        }
        if repr.dtype != config.dtype
            || repr.op != config.op
            || repr.fan_in != config.fan_in
            || repr.count == 0
            || repr.count > config.elems_per_packet
            || repr.root >= config.fan_in
        {
            stats.bad_shape += 1;
            return None;
        }
        if repr.slot >= config.slots {
            stats.rejected += 1;
            return None;
        }
        let all = job.all_ranks();
        let bit = 1u64 << repr.rank;
        let reuse = config.slots.wrapping_mul(2);
        let values = elements(packet.payload(), config.dtype);
        let fresh = |values| SlotCopy {
            seq: repr.seq,
            count: repr.count,
            root: repr.root,
            bitmap: bit,
            overflow: false,
            values,
        };
        let copy = match job.copies.entry((repr.slot, repr.slot_version)) {
            Entry::Vacant(vacant) => {
                stats.initialised += 1;
                vacant.insert(fresh(values))
            }
            Entry::Occupied(occupied) => {
                let copy = occupied.into_mut();
                if repr.seq == copy.seq.wrapping_add(reuse) {
                    // A rank sends chunk s + 2W only after it has the result
                    // of s + W, so every rank had the result of s.
                    stats.initialised += 1;
                    *copy = fresh(values);
                } else if repr.seq != copy.seq {
                    stats.stale += 1;
                    return None;
                } else if repr.count != copy.count || repr.root != copy.root {
                    stats.bad_shape += 1;
                    return None;
                } else if copy.bitmap & bit != 0 {
                    if copy.bitmap == all {
                        stats.from_cache += 1;
                        return Some(Reply {
                            to: Destination::Rank(repr.rank),
                            datagram: result(&repr, copy, config.dtype, true),
                        });
                    }
                    stats.duplicates += 1;
                    return None;
                } else {
                    stats.combined += 1;
                    for (acc, value) in copy.values.iter_mut().zip(values) {
                        let (combined, saturated) = combine(config, *acc, value);
                        *acc = combined;
                        copy.overflow |= saturated;
                    }
                    copy.bitmap |= bit;
                }
                copy
            }
        };
        if copy.bitmap != all {
            return None;
        }
        // Complete: clamp once to the element type.
        for value in &mut copy.values {
            let (clamped, over) = clamp(config.dtype, *value);
            *value = clamped;
            copy.overflow |= over;
        }
        stats.completed += 1;
        Some(Reply {
            to: Destination::AllMembers,
            datagram: result(&repr, copy, config.dtype, false),
        })
    }
}

impl SwitchModel {
    /// What the egress program makes of result `datagram` for member `rank`:
    /// the result itself in allreduce mode or for the chunk's root, else a
    /// notice (the [`Flags::NOTICE`] flag added, the element count 0, the
    /// payload cut; every other field kept, the overflow flag among them).
    ///
    /// # Panics
    /// If `datagram` is not a result of an installed job.
    pub fn copy_for(&self, rank: u8, datagram: &[u8]) -> Vec<u8> {
        let packet = Packet::new_checked(datagram).expect("a result");
        let repr = Repr::parse(&packet).expect("a result");
        let mode = self.jobs[&repr.job].config.mode;
        if mode == Mode::Allreduce || repr.root == rank {
            return datagram.to_vec();
        }
        let notice = Repr {
            flags: Flags(repr.flags.0 | Flags::NOTICE),
            count: 0,
            ..repr
        };
        let mut buf = vec![0; notice.buffer_len()];
        notice.emit(&mut Packet::new_unchecked(&mut buf[..]));
        buf
    }
}

/// The payload's elements, sign-extended to `i64`.
fn elements(payload: &[u8], dtype: DType) -> Vec<i64> {
    payload
        .chunks_exact(dtype.size())
        .map(|b| match dtype {
            DType::I32 => i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            DType::I64 => {
                let mut raw = [0; 8];
                raw.copy_from_slice(b);
                i64::from_be_bytes(raw)
            }
            DType::Bytes => unreachable!("add_job_with refuses byte jobs"),
        })
        .collect()
}

/// Combines an accumulator with a value; `true` if a sum saturated.
fn combine(config: JobConfig, acc: i64, value: i64) -> (i64, bool) {
    match (config.op, config.dtype) {
        // |sum| <= 64 × 2^31 = 2^37.
        (Op::Sum, DType::I32) => (acc + value, false),
        (Op::Sum, DType::I64) => match acc.checked_add(value) {
            Some(sum) => (sum, false),
            // Saturate in the direction of the true sum.
            None if value > 0 => (i64::MAX, true),
            None => (i64::MIN, true),
        },
        (Op::Sum, DType::Bytes) => unreachable!("add_job_with refuses byte jobs"),
        (Op::Max, _) => (acc.max(value), false),
        (Op::Min, _) => (acc.min(value), false),
    }
}

/// Clamps an accumulator to the element type; `true` if it had to.
fn clamp(dtype: DType, value: i64) -> (i64, bool) {
    match dtype {
        DType::I32 => {
            let clamped = value.clamp(i64::from(i32::MIN), i64::from(i32::MAX));
            (clamped, clamped != value)
        }
        DType::I64 => (value, false),
        DType::Bytes => unreachable!("add_job_with refuses byte jobs"),
    }
}

/// The result datagram of a complete slot copy, answering contribution `to`.
fn result(to: &Repr, copy: &SlotCopy, dtype: DType, from_cache: bool) -> Vec<u8> {
    let mut flags = 0;
    if copy.overflow {
        flags |= Flags::OVERFLOW;
    }
    if from_cache {
        flags |= Flags::FROM_CACHE;
    }
    let repr = Repr {
        kind: Kind::AggResult,
        flags: Flags(flags),
        bitmap: copy.bitmap,
        root: copy.root,
        ..*to
    };
    let mut buf = vec![0; repr.buffer_len()];
    let mut packet = Packet::new_unchecked(&mut buf[..]);
    repr.emit(&mut packet);
    let size = dtype.size();
    for (dst, value) in packet
        .payload_mut()
        .chunks_exact_mut(size)
        .zip(&copy.values)
    {
        match dtype {
            // Clamped to the type's range when the chunk completed.
            DType::I32 => dst.copy_from_slice(&(*value as i32).to_be_bytes()),
            DType::I64 => dst.copy_from_slice(&value.to_be_bytes()),
            DType::Bytes => unreachable!("add_job_with refuses byte jobs"),
        }
    }
    buf
}

/// The faults of the simulated network, applied to every datagram
/// independently, and the links' rate.
///
/// Every worker has a link of its own to the switch, one queue each way.
/// With a rate, a datagram waits behind the bytes queued before it on its
/// link, takes its serialization time (its length plus
/// [`FRAME_OVERHEAD`] bytes at the rate), and is dropped when the queue
/// would hold more than `queue_bytes` with it (tail drop; an empty queue
/// takes any frame); then the faults apply to it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a delivered datagram is delivered twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back by up to `reorder_delay`,
    /// letting later ones overtake it.
    pub reorder: f64,
    /// One-way delay of every datagram.
    pub latency: Duration,
    /// The most extra delay of a reordered (or duplicated) datagram.
    pub reorder_delay: Duration,
    /// Every link's rate in each direction, bits per second; `None`: no
    /// limit (a datagram takes just the latency).
    pub rate_bps: Option<u64>,
    /// With a rate: the bytes a link's queue holds before it drops.
    pub queue_bytes: u64,
}

/// Bytes each frame carries besides the xina datagram: Ethernet, IPv4
/// and UDP headers.
pub const FRAME_OVERHEAD: u64 = 14 + 20 + 8;

impl LinkConfig {
    /// No loss, duplication or reordering; 10 µs one way.
    pub const fn perfect() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            latency: Duration::from_micros(10),
            reorder_delay: Duration::from_micros(500),
            rate_bps: None,
            queue_bytes: 4 << 20,
        }
    }

    /// A perfect network whose links carry `mbit` Mbit/s each way, with
    /// queues of `queue_bytes`.
    pub const fn shaped(mbit: u64, queue_bytes: u64) -> Self {
        Self {
            rate_bps: Some(mbit * 1_000_000),
            queue_bytes,
            ..Self::perfect()
        }
    }

    /// The given fault probabilities with the latencies of
    /// [`perfect`](Self::perfect).
    pub const fn lossy(loss: f64, duplicate: f64, reorder: f64) -> Self {
        Self {
            loss,
            duplicate,
            reorder,
            ..Self::perfect()
        }
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self::perfect()
    }
}

/// A network endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// The switch.
    Switch,
    /// The worker of this rank.
    Rank(u8),
}

/// What the [`Network`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams given to [`Network::send`].
    pub sent: u64,
    /// Datagrams dropped.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams held back to be reordered.
    pub reordered: u64,
    /// Datagrams dropped because their link's queue was full.
    pub overflowed: u64,
    /// Datagrams handed out by [`Network::pop_arrived`].
    pub delivered: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    /// Send order, to break ties deterministically.
    order: u64,
    to: Endpoint,
    datagram: Vec<u8>,
}

/// Datagrams in flight in simulated time, with seeded faults.
#[derive(Clone, Debug)]
pub struct Network {
    link: LinkConfig,
    rng: SplitMix64,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    /// With a rate: when each link (sender, receiver) has sent what it
    /// holds.
    busy_until: HashMap<(Endpoint, Endpoint), Instant>,
    stats: NetStats,
}

impl Network {
    /// An empty network whose faults are fixed by `seed`.
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self {
            link,
            rng: SplitMix64::new(seed),
            in_flight: BinaryHeap::new(),
            order: 0,
            busy_until: HashMap::new(),
            stats: NetStats::default(),
        }
    }

    /// What the network has done so far.
    pub const fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Sends `datagram` from `from` to `to` at time `now`: with a rate it
    /// queues on the link between them (or is dropped when the queue is
    /// full); then it is lost, or arrives after the latency (plus a random
    /// extra delay if reordered), maybe twice.
    pub fn send(&mut self, now: Instant, from: Endpoint, to: Endpoint, datagram: Vec<u8>) {
        self.stats.sent += 1;
        let now = match self.link.rate_bps {
            None => now,
            Some(rate) => {
                let busy = self.busy_until.entry((from, to)).or_insert(now);
                let start = (*busy).max(now);
                let queued =
                    start.duration_since(now).as_nanos() * u128::from(rate) / 8_000_000_000;
                let bytes = datagram.len() as u64 + FRAME_OVERHEAD;
                if queued > 0 && queued + u128::from(bytes) > u128::from(self.link.queue_bytes) {
                    self.stats.overflowed += 1;
                    return;
                }
                let nanos = u128::from(bytes) * 8_000_000_000 / u128::from(rate);
                *busy = start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
                *busy
            }
        };
        if self.rng.chance(self.link.loss) {
            self.stats.lost += 1;
            return;
        }
        if self.rng.chance(self.link.duplicate) {
            self.stats.duplicated += 1;
            let at = now + self.link.latency + self.rng.duration_up_to(self.link.reorder_delay);
            self.push(at, to, datagram.clone());
        }
        let mut at = now + self.link.latency;
        if self.rng.chance(self.link.reorder) {
            self.stats.reordered += 1;
            at += self.rng.duration_up_to(self.link.reorder_delay);
        }
        self.push(at, to, datagram);
    }

    fn push(&mut self, at: Instant, to: Endpoint, datagram: Vec<u8>) {
        self.order += 1;
        self.in_flight.push(Reverse(InFlight {
            at,
            order: self.order,
            to,
            datagram,
        }));
    }

    /// When the next datagram arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(f)| f.at)
    }

    /// Datagrams in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The next datagram that has arrived by `now`, earliest first.
    pub fn pop_arrived(&mut self, now: Instant) -> Option<(Endpoint, Vec<u8>)> {
        if self.next_arrival()? > now {
            return None;
        }
        let Reverse(f) = self.in_flight.pop()?;
        self.stats.delivered += 1;
        Some((f.to, f.datagram))
    }
}

/// The setup of a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Job id.
    pub job: u32,
    /// Ranks.
    pub fan_in: u8,
    /// Elements per packet.
    pub elems_per_packet: u16,
    /// Slots (the window).
    pub slots: u32,
    /// The job's operation.
    pub op: Op,
    /// The job's element type.
    pub dtype: DType,
    /// The job's delivery mode.
    pub mode: Mode,
    /// The engines' timing.
    pub engine: Config,
    /// The faults of every datagram, both directions.
    pub link: LinkConfig,
    /// Seed of the network's faults and the start skew.
    pub seed: u64,
    /// Bitmap of ranks that never take part (dead peers).
    pub dead: u64,
    /// Each rank starts each call at a random offset in `0..=start_skew`.
    pub start_skew: Duration,
    /// Simulated time one call may take before [`Cluster::allreduce`] reports
    /// [`Stalled`].
    pub time_limit: Duration,
    /// Loop iterations and events one call may take before it reports
    /// [`Stalled`].
    pub max_events: u64,
}

impl ClusterConfig {
    /// A perfect network, default engine config, no dead ranks, no skew, a
    /// 10-minute simulated time limit.
    pub fn new(fan_in: u8, elems_per_packet: u16, slots: u32) -> Self {
        Self {
            job: 1,
            fan_in,
            elems_per_packet,
            slots,
            op: Op::Sum,
            dtype: DType::I32,
            mode: Mode::Allreduce,
            engine: Config::default(),
            link: LinkConfig::perfect(),
            seed: 0,
            dead: 0,
            start_skew: Duration::ZERO,
            time_limit: Duration::from_secs(600),
            max_events: 20_000_000,
        }
    }

    /// The member description of `rank`.
    pub const fn member(&self, rank: u8) -> Member {
        Member {
            job: self.job,
            rank,
            fan_in: self.fan_in,
            elems_per_packet: self.elems_per_packet,
            slots: self.slots,
            op: self.op,
            dtype: self.dtype,
            mode: self.mode,
        }
    }
}

/// One collective call of a [`Cluster`].
#[derive(Debug)]
pub struct Round {
    /// Each rank's outcome; `None` for dead ranks.
    pub outcomes: Vec<Option<Result<Stats, Error>>>,
    /// Simulated time from the start of the call to the last outcome.
    pub duration: Duration,
}

/// A simulated call that did not end within its limits: the engines or the
/// harness would have hung.
#[derive(Debug, thiserror::Error)]
#[error(
    "simulation stalled ({reason}) after {elapsed:?} of simulated time and {events} events; \
     ranks without an outcome: {pending:?}"
)]
pub struct Stalled {
    /// Why the loop stopped.
    pub reason: &'static str,
    /// Simulated time since the start of the call.
    pub elapsed: Duration,
    /// Events processed.
    pub events: u64,
    /// Live ranks that had no outcome.
    pub pending: Vec<u8>,
}

/// `fan_in` engines, a [`SwitchModel`] and a [`Network`], run together in
/// simulated time.
///
/// The switch state, the datagrams still in flight, the clock and every rank's
/// chunk number and round-trip estimate persist from one call to the next, as
/// they would on real hosts.
#[derive(Debug)]
pub struct Cluster {
    config: ClusterConfig,
    switch: SwitchModel,
    net: Network,
    rng: SplitMix64,
    origin: Instant,
    now: Instant,
    next_chunk: Vec<u64>,
    rtt: Vec<RttEstimator>,
    window: Vec<Window>,
}

impl Cluster {
    /// A cluster at simulated time zero, with the job installed on the switch.
    ///
    /// # Panics
    /// If the member parameters or the engine config are invalid.
    pub fn new(config: ClusterConfig) -> Self {
        config
            .member(0)
            .validate()
            .expect("valid cluster parameters");
        config.engine.validate().expect("valid engine config");
        let mut switch = SwitchModel::new();
        switch.add_job_with(
            config.job,
            JobConfig {
                fan_in: config.fan_in,
                slots: config.slots,
                elems_per_packet: config.elems_per_packet,
                op: config.op,
                dtype: config.dtype,
                mode: config.mode,
            },
        );
        let ranks = usize::from(config.fan_in);
        let origin = Instant::now();
        Self {
            net: Network::new(config.link, config.seed),
            rng: SplitMix64::new(config.seed ^ 0x5eed_5eed_5eed_5eed),
            switch,
            origin,
            now: origin,
            next_chunk: vec![0; ranks],
            rtt: vec![RttEstimator::new(); ranks],
            window: vec![Window::new(); ranks],
            config,
        }
    }

    /// The round-trip estimate `rank` carries to its next call.
    ///
    /// # Panics
    /// If there is no such rank.
    pub fn rtt(&self, rank: u8) -> &RttEstimator {
        &self.rtt[usize::from(rank)]
    }

    /// The congestion window `rank` carries to its next call.
    ///
    /// # Panics
    /// If there is no such rank.
    pub fn window(&self, rank: u8) -> &Window {
        &self.window[usize::from(rank)]
    }

    /// The simulated time since the cluster was created.
    pub fn elapsed(&self) -> Duration {
        self.now - self.origin
    }

    /// The switch model.
    pub const fn switch(&self) -> &SwitchModel {
        &self.switch
    }

    /// The network.
    pub const fn network(&self) -> &Network {
        &self.net
    }

    /// The chunk number `rank`'s next call starts at.
    pub fn next_chunk(&self, rank: u8) -> u64 {
        self.next_chunk[usize::from(rank)]
    }

    /// Sets the chunk number `rank`'s next call starts at (to start near the
    /// sequence wrap, or to break continuity on purpose).
    pub fn set_next_chunk(&mut self, rank: u8, chunk: u64) {
        self.next_chunk[usize::from(rank)] = chunk;
    }

    /// Sets the bitmap of dead ranks for the next calls (a rank that dies
    /// between calls).
    pub fn set_dead(&mut self, dead: u64) {
        self.config.dead = dead;
    }

    /// Runs one int32 allreduce: `inputs[r]` is rank `r`'s buffer and
    /// receives its result (dead ranks' buffers are left alone). Returns when
    /// every live rank has an outcome.
    ///
    /// # Errors
    /// [`Stalled`] if the call exceeds the time or event limit, or if nothing
    /// is left to happen while a rank has no outcome.
    ///
    /// # Panics
    /// If `inputs` does not have one buffer per rank.
    pub fn allreduce(&mut self, inputs: &mut [Vec<i32>]) -> Result<Round, Stalled> {
        self.run(Collective::Allreduce, inputs)
    }

    /// Runs `collective` over each rank's buffer with one engine per live
    /// rank, as [`allreduce`](Self::allreduce) does.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    ///
    /// # Panics
    /// If `inputs` does not have one buffer per rank, or the engines refuse
    /// the call (a wrong type or mode for the job).
    pub fn run<T: Element>(
        &mut self,
        collective: Collective,
        inputs: &mut [Vec<T>],
    ) -> Result<Round, Stalled> {
        let mut slices: Vec<&mut [T]> = inputs.iter_mut().map(Vec::as_mut_slice).collect();
        let (outcomes, duration) = self.run_engines(collective, false, 0, &mut slices)?;
        Ok(Round {
            outcomes: outcomes
                .into_iter()
                .map(|o| o.map(|o| o.map(|o| o.stats)))
                .collect(),
            duration,
        })
    }

    /// Runs `collective` over each rank's buffer of any [`Scalar`] type
    /// through the same plans as the workers' drivers (several engine runs
    /// for floats), the ranks' runs side by side.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    ///
    /// # Panics
    /// If `inputs` does not have one buffer per rank, or a plan refuses the
    /// call.
    pub fn call<S: Scalar>(
        &mut self,
        collective: Collective,
        inputs: &mut [Vec<S>],
    ) -> Result<Round, Stalled> {
        let ranks = usize::from(self.config.fan_in);
        assert_eq!(inputs.len(), ranks, "one buffer per rank");
        let start = self.now;
        let engine_config = self.config.engine;
        let mut plans: Vec<Option<Box<dyn Plan + '_>>> = inputs
            .iter_mut()
            .zip(0u8..)
            .map(|(data, rank)| {
                (self.config.dead & (1 << rank) == 0).then(|| {
                    S::plan(&self.config.member(rank), &engine_config, collective, data)
                        .expect("a valid call")
                })
            })
            .collect();
        loop {
            let mut steps: Vec<_> = plans
                .iter_mut()
                .map(|p| p.as_mut().and_then(|p| p.next()))
                .collect();
            let Some(first) = steps.iter().flatten().next() else {
                break;
            };
            let (collective, tolerate) = (first.collective, first.tolerate_overflow);
            // Ranks whose plan is over (failed) sit the step out.
            let idle = steps
                .iter()
                .zip(0..)
                .filter(|(s, _)| s.is_none())
                .fold(0u64, |bits, (_, r)| bits | 1 << r);
            let mut i32s: Vec<&mut [i32]> = Vec::new();
            let mut i64s: Vec<&mut [i64]> = Vec::new();
            for step in &mut steps {
                match step.as_mut().map(|s| &mut s.data) {
                    Some(StepData::I32(d)) => i32s.push(d),
                    Some(StepData::I64(d)) => i64s.push(d),
                    None if self.config.dtype == DType::I32 => i32s.push(&mut []),
                    None => i64s.push(&mut []),
                }
            }
            let (outcomes, _) = if i64s.is_empty() {
                self.run_engines(collective, tolerate, idle, &mut i32s)?
            } else {
                self.run_engines(collective, tolerate, idle, &mut i64s)?
            };
            drop(steps);
            for (plan, outcome) in plans.iter_mut().zip(outcomes) {
                if let (Some(plan), Some(outcome)) = (plan, outcome) {
                    plan.feed(outcome);
                }
            }
        }
        Ok(Round {
            outcomes: plans.into_iter().map(|p| p.map(Plan::finish)).collect(),
            duration: self.now - start,
        })
    }

    /// The engines of one step, run to their outcomes.
    #[allow(clippy::type_complexity)]
    fn run_engines<T: Element>(
        &mut self,
        collective: Collective,
        tolerate_overflow: bool,
        idle: u64,
        inputs: &mut [&mut [T]],
    ) -> Result<(Vec<Option<Result<StepOutcome, Error>>>, Duration), Stalled> {
        let ranks = usize::from(self.config.fan_in);
        assert_eq!(inputs.len(), ranks, "one buffer per rank");
        let start = self.now;
        let limit = start + self.config.time_limit;
        let live: Vec<bool> = (0..ranks)
            .map(|r| (self.config.dead | idle) & (1 << r) == 0)
            .collect();
        let start_at: Vec<Instant> = (0..ranks)
            .map(|_| start + self.rng.duration_up_to(self.config.start_skew))
            .collect();
        let mut data: Vec<Option<&mut [T]>> = inputs.iter_mut().map(|v| Some(&mut **v)).collect();
        let mut engines: Vec<Option<Engine<'_, T>>> = (0..ranks).map(|_| None).collect();
        let mut outcomes: Vec<Option<Result<StepOutcome, Error>>> =
            (0..ranks).map(|_| None).collect();
        let mut buf = vec![0; MAX_DATAGRAM_LEN];
        let mut events = 0u64;

        loop {
            events += 1;
            let now = self.now;
            let stalled = |reason, events, outcomes: &[Option<_>]| Stalled {
                reason,
                elapsed: now - start,
                events,
                pending: (0..ranks)
                    .filter(|&r| live[r] && outcomes[r].is_none())
                    .map(|r| u8::try_from(r).expect("ranks fit a u8"))
                    .collect(),
            };
            if events > self.config.max_events {
                return Err(stalled("event limit", events, &outcomes));
            }

            for (r, rank) in (0..ranks).zip(0u8..) {
                if live[r]
                    && start_at[r] <= now
                    && let Some(buffer) = data[r].take()
                {
                    let engine = Engine::new(
                        self.config.member(rank),
                        self.config.engine,
                        collective,
                        self.next_chunk[r],
                        buffer,
                        now,
                    )
                    .expect("a call the job supports")
                    .with_rtt(self.rtt[r])
                    .with_window(self.window[r]);
                    engines[r] = Some(if tolerate_overflow {
                        engine.tolerate_overflow()
                    } else {
                        engine
                    });
                }
            }
            for engine in engines.iter_mut().flatten() {
                if engine.poll_timeout().is_some_and(|t| t <= now) {
                    engine.handle_timeout(now);
                }
                let from = Endpoint::Rank(engine.member().rank);
                while let Some(len) = engine.poll_transmit(now, &mut buf) {
                    events += 1;
                    self.net
                        .send(now, from, Endpoint::Switch, buf[..len].to_vec());
                }
            }
            let mut arrived = false;
            while let Some((to, datagram)) = self.net.pop_arrived(now) {
                arrived = true;
                events += 1;
                match to {
                    Endpoint::Switch => {
                        let Some(reply) = self.switch.handle(&datagram) else {
                            continue;
                        };
                        let ranks = match reply.to {
                            Destination::AllMembers => 0..self.config.fan_in,
                            Destination::Rank(rank) => rank..rank + 1,
                        };
                        for rank in ranks {
                            let copy = self.switch.copy_for(rank, &reply.datagram);
                            self.net
                                .send(now, Endpoint::Switch, Endpoint::Rank(rank), copy);
                        }
                    }
                    Endpoint::Rank(rank) => {
                        if let Some(engine) = engines[usize::from(rank)].as_mut() {
                            engine.handle_packet(now, &datagram);
                        }
                    }
                }
            }
            for r in 0..ranks {
                let Some(engine) = engines[r].as_mut() else {
                    continue;
                };
                if let Some(outcome) = engine.take_outcome() {
                    self.next_chunk[r] = engine.next_chunk();
                    self.rtt[r] = *engine.rtt();
                    self.window[r] = *engine.window();
                    let overflowed = engine.overflowed();
                    outcomes[r] = Some(outcome.map(|stats| StepOutcome { stats, overflowed }));
                    engines[r] = None;
                }
            }
            if (0..ranks).all(|r| !live[r] || outcomes[r].is_some()) {
                return Ok((outcomes, now - start));
            }
            if arrived {
                // Answers to what arrived may be sendable at once.
                continue;
            }

            let next = engines
                .iter()
                .flatten()
                .filter_map(Engine::poll_timeout)
                .chain(self.net.next_arrival())
                .chain(
                    (0..ranks)
                        .filter(|&r| data[r].is_some() && live[r])
                        .map(|r| start_at[r]),
                )
                .min();
            match next {
                None => return Err(stalled("nothing left to happen", events, &outcomes)),
                Some(t) if t > limit => return Err(stalled("time limit", events, &outcomes)),
                Some(t) => self.now = self.now.max(t),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn chance_has_the_requested_frequency() {
        let mut rng = SplitMix64::new(0x5717c4);
        for p in [0.001, 0.03, 0.2, 0.5] {
            let n = 200_000;
            let hits = (0..n).filter(|_| rng.chance(p)).count();
            let freq = hits as f64 / f64::from(n);
            assert!((freq - p).abs() < 0.1 * p + 0.001, "p {p}: {freq}");
        }
        assert!(!rng.chance(0.0));
        assert!((0..1000).all(|_| rng.up_to(3) <= 3));
        assert_eq!(rng.duration_up_to(Duration::ZERO), Duration::ZERO);
    }
}

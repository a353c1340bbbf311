//! `xina-testbed bench allreduce`: allreduce through the XDP switch against a
//! host-based ring allreduce ([`crate::ring`]) and, when it is installed,
//! Open MPI's ([`crate::mpi`]), in nccl-tests' columns.
//!
//! # Method
//!
//! For each worker count two stars of the same options are built: one with
//! the switch attached for the whole sweep (xina's path), and a plain one
//! with no XDP anywhere ([`crate::plain`]: the baselines' path, where TCP
//! keeps its 64 KB segments, as in a cluster without xina). Every rank is
//! one thread that holds an `xina_host::Worker` (UDP to the switch, bound in
//! its worker namespace of the XDP star) and a [`RingRank`] (TCP to its ring
//! neighbours, connected in its worker namespace of the plain star, bridged
//! there by the switch namespace's bridge). Open MPI runs one rank in each
//! worker namespace of the plain star, started once per worker count and
//! driven command by command. Each record's `path` says which star it ran on.
//!
//! For every loss rate, size and implementation: one warm-up repetition,
//! then `reps` measured ones, the implementations interleaved rep by rep so
//! that noise on this shared machine hits all alike (Open MPI's repetition
//! is timed the same way inside its program, after about 200 ms of untimed
//! warm-up: its ranks sleep between commands). A repetition is:
//! every rank fills `iters` buffers with its input, all ranks meet at a
//! barrier, and each runs `iters` allreduces back to back; the repetition's
//! time is from the first rank leaving the barrier to the last rank
//! finishing, divided by `iters`. Small sizes run several allreduces per
//! repetition (`iters = clamp(1 MiB / bytes, 1, 20)`) so that the barrier's
//! wake-up skew is spread out. After the clock stops every buffer is
//! compared with the element-wise sum computed here; a wrong or failed
//! allreduce ends the benchmark with an error, so no wrong answer is timed.
//!
//! - `time_us`: the median over repetitions of the time per allreduce;
//! - `algbw = bytes / time` (bytes per worker), `busbw = algbw · 2(n-1)/n`,
//!   both in GB/s (10^9 bytes per second), as in nccl-tests;
//! - `retransmits`: xina's retransmitted chunks (`Stats::retransmissions`)
//!   or the ring's TCP retransmitted segments (`tcpi_total_retrans` of each
//!   rank's sending connection), summed over ranks and measured repetitions;
//! - `fast_retransmits` (xina only): how many of those went at once because
//!   a later chunk's result came first; the others after their timeout;
//! - loss: the lossy link ([`crate::lossy`]) on every worker's interface,
//!   dropping that fraction of *all* frames (xina's, TCP's data and ACKs) in
//!   both directions, per the `loss_model` ([`LossModel`]): `frame` (the
//!   default) turns segmentation and receive offloads off on both stars and
//!   UDP GSO off in xina's workers for the whole run, its lossless cases
//!   included, so each wire frame is kept or lost on its own; `batch` keeps
//!   the offloads and drops what a hook sees whole (up to 64 xina datagrams
//!   of a UDP GSO send, up to 64 KiB of TCP segments). `frames_seen` and
//!   `frames_dropped` count wire frames, `packets_seen` and `packets_dropped`
//!   what the hooks saw, over the measured repetitions; the bench fails if a
//!   per-frame run saw a packet of more than one frame.

use std::{
    cell::RefCell,
    fmt::Write as _,
    net::SocketAddrV4,
    sync::{
        Arc, Barrier,
        mpsc::{self, Receiver, Sender},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde::Serialize;
use xina_host::{JobParams, Worker};
use xina_proto::{DType, XINA_UDP_PORT, frame::elems_for_mtu};

use crate::{
    bench::{Machine, median},
    lossy::{self, Counts, LossModel},
    mpi::{MpiJob, MpiProgram},
    netns::NetNs,
    plain,
    ring::{RingRank, ring_addrs},
    scenario::{self, AllreduceSpec, JOB_ID, WORKER_PORT},
    shape,
    topology::{MAX_MTU, Star, StarOptions},
};

/// Most allreduces one repetition runs back to back.
const MAX_ITERS: usize = 20;
/// How long Open MPI may take to answer one repetition (it has no
/// timeout of its own: a stuck job fails the bench after this).
const MPI_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Small sizes run `MIN_REP_BYTES / bytes` allreduces per repetition.
const MIN_REP_BYTES: usize = 1 << 20;

/// The goals of issue 4, each checked at one point of the sweep.
pub const GOAL_WORKERS: usize = 8;
/// Goal 1: xina's algbw at least twice the ring's at 64 MiB and 8 workers.
pub const GOAL_BANDWIDTH_BYTES: usize = 64 << 20;
pub const GOAL_BANDWIDTH_RATIO: f64 = 2.0;
/// Goal 2: xina's time at most half the ring's for 8 bytes at 8 workers.
pub const GOAL_LATENCY_BYTES: usize = 8;
pub const GOAL_LATENCY_RATIO: f64 = 2.0;
/// Issue 12: xina's algbw at least 1.5x Open MPI's at 64 MiB and 8 workers.
pub const GOAL_MPI_BANDWIDTH_RATIO: f64 = 1.5;
/// Issue 12: an 8-byte allreduce at 8 workers in at most a quarter of Open
/// MPI's time.
pub const GOAL_MPI_LATENCY_RATIO: f64 = 4.0;
/// Issue 12, link-bound (every link shaped to one rate): at 64 MiB and 8
/// workers, at least this times Open MPI's speed.
pub const GOAL_LINK_MPI_RATIO: f64 = 2.5;
/// Issue 12, link-bound: xina's time at 8 workers at most this times its
/// time at the fewest workers measured (2).
pub const GOAL_LINK_FLATNESS: f64 = 1.15;
/// Goal 3: xina's goodput at 1% loss at least 80% of lossless.
pub const GOAL_LOSS_PCT: f64 = 1.0;
pub const GOAL_GOODPUT_RATIO: f64 = 0.8;
/// Issue 27: an 8-byte allreduce's median single call at `GOAL_LOSS_PCT`
/// loss at most twice the lossless one (lossless over lossy, at least this).
pub const GOAL_LOSS_LATENCY_RATIO: f64 = 0.5;

/// An allreduce implementation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Impl {
    /// Through the XDP switch (`xina_host::Worker::allreduce_i32`).
    Xina,
    /// The host-based ring over TCP ([`RingRank::allreduce_i32`]), on the
    /// plain star.
    Ring,
    /// Open MPI's `MPI_Allreduce` over TCP ([`crate::mpi`]), on the plain
    /// star.
    Mpi,
}

impl Impl {
    /// Every implementation, in table order (`mpi` runs only when
    /// installed).
    pub const ALL: [Self; 3] = [Self::Xina, Self::Ring, Self::Mpi];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Xina => "xina",
            Self::Ring => "ring",
            Self::Mpi => "mpi",
        }
    }

    /// The topology it runs on: [`plain::XDP_PATH`] or [`plain::PLAIN_PATH`].
    pub const fn path(self) -> &'static str {
        match self {
            Self::Xina => plain::XDP_PATH,
            Self::Ring | Self::Mpi => plain::PLAIN_PATH,
        }
    }
}

/// What to measure.
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceBenchSpec {
    /// Worker counts, each on its own star.
    pub workers: Vec<usize>,
    /// Bytes per worker (multiples of 4: int32 elements).
    pub sizes: Vec<usize>,
    /// Measured repetitions per size and implementation (after a warm-up).
    pub reps: usize,
    /// Loss rates in percent of frames, each direction.
    pub losses: Vec<f64>,
    /// Link MTUs, each on its own stars: the frame size xina's packets may
    /// take (and TCP's segments).
    pub frames: Vec<u32>,
    /// xina's elements per packet; `None`: as many as a frame holds
    /// (`xina_proto::frame::elems_for_mtu`).
    pub elems_per_packet: Option<u16>,
    /// xina's aggregator slots (the workers' window); `None`: about 1 MiB
    /// of chunks in flight per worker, 4 to 64 slots ([`window_for`]).
    pub slots: Option<u32>,
    /// xina's `Config::queue_target` (the library's default unless set);
    /// `None` keeps every slot open, as before the workers had a
    /// congestion window.
    pub queue_target: Option<Duration>,
    /// How long an xina worker waits without progress before failing.
    pub give_up: Duration,
    /// How long a ring rank waits for a neighbour that does not move.
    pub ring_timeout: Duration,
    /// Seed of the workers' data.
    pub seed: u64,
    /// Implementations, in table order (Open MPI's only when `mpirun` and
    /// `mpicc` are installed).
    pub impls: Vec<Impl>,
    /// What a loss rate applies to; offloads change only when some loss
    /// rate is above 0.
    pub loss_model: LossModel,
    /// The link-bound regime: every worker link of both stars shaped to
    /// this many Mbit/s in both directions ([`crate::shape`]); `None`:
    /// unshaped (CPU-bound on this machine).
    pub rate_mbit: Option<u32>,
}

impl Default for AllreduceBenchSpec {
    fn default() -> Self {
        Self {
            workers: vec![2, 4, 8],
            sizes: size_range(4, 64 << 20, 2).unwrap_or_default(),
            reps: 5,
            losses: vec![0.0],
            frames: vec![1500],
            elems_per_packet: None,
            slots: None,
            queue_target: xina_host::Config::default().queue_target,
            give_up: Duration::from_secs(5),
            ring_timeout: Duration::from_secs(10),
            seed: 1,
            impls: Impl::ALL.to_vec(),
            loss_model: LossModel::Frame,
            rate_mbit: None,
        }
    }
}

impl AllreduceBenchSpec {
    /// Checks every field, naming the first bad one.
    ///
    /// # Errors
    /// When a list is empty or a value is out of range.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(!self.workers.is_empty(), "workers: none given");
        for &w in &self.workers {
            ensure!(
                (2..=xina_proto::MAX_RANKS).contains(&w),
                "workers: {w} (must be 2..={})",
                xina_proto::MAX_RANKS
            );
        }
        ensure!(!self.sizes.is_empty(), "sizes: none given");
        for &s in &self.sizes {
            ensure!(
                s >= 4 && s.is_multiple_of(4),
                "sizes: {s} bytes is not a positive multiple of 4 (int32 elements)"
            );
        }
        ensure!(self.reps >= 1, "reps: must be at least 1");
        ensure!(!self.losses.is_empty(), "loss: none given");
        for &l in &self.losses {
            ensure!(
                (0.0..100.0).contains(&l),
                "loss: {l}% (must be at least 0 and below 100)"
            );
        }
        ensure!(!self.impls.is_empty(), "impls: none given");
        ensure!(
            self.queue_target.is_none_or(|t| !t.is_zero()),
            "queue-target: must be positive"
        );
        if let Some(rate) = self.rate_mbit {
            shape::check_rate(rate, self.frames.iter().copied())?;
            ensure!(
                self.losses.iter().all(|&l| l == 0.0),
                "rate: cannot be combined with loss (both take the root qdisc of the worker links)"
            );
        }
        ensure!(!self.frames.is_empty(), "frame: none given");
        for &f in &self.frames {
            ensure!(
                (1500..=MAX_MTU).contains(&f),
                "frame: {f} (must be 1500..={MAX_MTU})"
            );
            if let Some(e) = self.elems_per_packet {
                let most = elems_for_mtu(DType::I32, f as usize);
                ensure!(
                    e >= 1 && usize::from(e) <= most,
                    "elems-per-packet: {e} (must be 1..={most} at frame {f})"
                );
            }
        }
        Ok(())
    }

    /// Whether the links run without offloads for per-frame loss.
    pub fn per_frame(&self) -> bool {
        self.loss_model_used() == Some(LossModel::Frame)
    }

    /// The loss model the records say they ran under (`None` without loss).
    pub fn loss_model_used(&self) -> Option<LossModel> {
        self.losses
            .iter()
            .any(|&l| l > 0.0)
            .then_some(self.loss_model)
    }

    /// xina's slots (window) at link MTU `frame`.
    pub fn slots_at(&self, frame: u32) -> u32 {
        self.slots
            .unwrap_or_else(|| window_for(usize::from(self.elems_at(frame))))
    }

    /// xina's elements per packet at link MTU `frame`.
    pub fn elems_at(&self, frame: u32) -> u16 {
        self.elems_per_packet.unwrap_or_else(|| {
            u16::try_from(elems_for_mtu(DType::I32, frame as usize)).unwrap_or(u16::MAX)
        })
    }
}

/// One measurement: an implementation at one worker count, size and loss.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    #[serde(rename = "impl")]
    pub implementation: Impl,
    /// The links' MTU: the largest IP packet either implementation may send.
    pub frame_bytes: u32,
    /// xina's elements per packet (0 for the ring).
    pub elems_per_packet: u16,
    /// The topology it ran on ([`Impl::path`]).
    pub path: &'static str,
    pub workers: usize,
    /// Bytes per worker.
    pub bytes: usize,
    /// Elements per worker.
    pub count: usize,
    pub dtype: &'static str,
    pub redop: &'static str,
    /// Median over repetitions of the time per allreduce, microseconds.
    pub time_us: f64,
    /// `bytes / time`, GB/s (10^9 bytes per second).
    pub algbw_gbps: f64,
    /// `algbw · 2(n-1)/n`, GB/s.
    pub busbw_gbps: f64,
    /// Retransmissions summed over ranks and measured repetitions (xina:
    /// chunks; ring: TCP segments).
    pub retransmits: u64,
    /// xina: how many of its `retransmits` went at once because a later
    /// chunk's result came back first (`Stats::fast_retransmissions`); the
    /// others went after their timeout. `None` for the TCP baselines.
    pub fast_retransmits: Option<u64>,
    /// xina: the largest congestion window (chunks) a rank ended a measured
    /// repetition with, median over repetitions (the slots with
    /// `fixed_window`). `None` for the TCP baselines.
    pub window: Option<u32>,
    /// xina: the most chunks one rank had open at once, over the measured
    /// repetitions.
    pub max_open: Option<u32>,
    /// xina: how often the ranks' congestion windows shrank, summed over
    /// ranks and measured repetitions.
    pub window_decreases: Option<u64>,
    /// xina: whether its workers kept every slot open (no congestion
    /// control).
    pub fixed_window: bool,
    /// xina: the largest smoothed round trip (send to result) a rank ended
    /// the last measured repetition with, microseconds: the queue the
    /// window keeps.
    pub srtt_us: Option<f64>,
    /// xina: rank 0's congestion window over the last measured repetition,
    /// `(milliseconds into it, chunks)` at its start and at every change.
    pub window_trace: Option<Vec<(f64, u32)>>,
    /// Frames dropped by the lossy links, percent (each direction).
    pub loss: f64,
    /// Measured repetitions.
    pub reps: usize,
    /// Allreduces per repetition.
    pub iters: usize,
    /// Every repetition's time per allreduce, microseconds.
    pub times_us: Vec<f64>,
    /// Single calls over the measured repetitions (each call's time: the
    /// longest any rank spent in it), median and 99th percentile,
    /// microseconds; `None` for Open MPI, whose program reports means.
    pub call_p50_us: Option<f64>,
    pub call_p99_us: Option<f64>,
    /// What the lossy links saw and dropped during the measured repetitions
    /// (all links, both directions), in wire frames; zero without loss.
    pub frames_seen: u64,
    pub frames_dropped: u64,
    /// The same in packets at the hooks (equal to the frames under the
    /// `frame` model, fewer under `batch`).
    pub packets_seen: u64,
    pub packets_dropped: u64,
    /// What the loss applied to (`None`: no loss rate above 0 in the run).
    pub loss_model: Option<LossModel>,
    /// The links' shaped rate, Mbit/s (`None`: unshaped).
    pub rate_mbit: Option<u32>,
    /// With shaped links: the highest rate one link direction carried over
    /// a measured repetition, Mbit/s (at most `rate_mbit` when the shaper
    /// holds).
    pub busiest_link_mbit: Option<f64>,
}

/// A goal and how the run did against it.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub statement: String,
    /// The measured ratio (what the threshold applies to), if measured.
    pub ratio: Option<f64>,
    pub threshold: f64,
    pub met: Option<bool>,
    /// What the ratio was computed from, or what is missing.
    pub detail: String,
}

/// Everything `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceBenchReport {
    pub machine: Machine,
    pub spec: AllreduceBenchSpec,
    pub goals: Vec<Goal>,
    /// One per measurement.
    pub records: Vec<Record>,
}

/// Parses a size such as `4`, `4B`, `64KiB`, `64K`, `1MiB`, `1M`, `1GiB`.
///
/// # Errors
/// When the number or the unit is not understood.
pub fn parse_size(text: &str) -> anyhow::Result<usize> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: usize = number
        .parse()
        .with_context(|| format!("size {text:?}: no number"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "KB" => 1 << 10,
        "M" | "MiB" | "MB" => 1 << 20,
        "G" | "GiB" | "GB" => 1 << 30,
        other => bail!("size {text:?}: unknown unit {other:?} (B, KiB, MiB, GiB)"),
    };
    number
        .checked_mul(scale)
        .with_context(|| format!("size {text:?} is too large"))
}

/// `min, min·factor, ...` up to `max` (and `max` itself if the steps miss it).
///
/// # Errors
/// When `min` is 0, `min > max` or `factor < 2`.
pub fn size_range(min: usize, max: usize, factor: usize) -> anyhow::Result<Vec<usize>> {
    ensure!(min > 0, "sizes: the smallest size must be positive");
    ensure!(min <= max, "sizes: {min} is larger than {max}");
    ensure!(factor >= 2, "factor: {factor} (must be at least 2)");
    let mut sizes = Vec::new();
    let mut s = min;
    while s <= max {
        sizes.push(s);
        match s.checked_mul(factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    if sizes.last() != Some(&max) {
        sizes.push(max);
    }
    Ok(sizes)
}

/// Parses `MIN..MAX` (sizes as [`parse_size`]) into [`size_range`], or a
/// comma-separated list of sizes (`8B,64MiB`) as given.
///
/// # Errors
/// As [`parse_size`] and [`size_range`].
pub fn parse_size_range(text: &str, factor: usize) -> anyhow::Result<Vec<usize>> {
    match text.split_once("..") {
        Some((min, max)) => size_range(parse_size(min)?, parse_size(max)?, factor),
        None => text.split(',').map(parse_size).collect(),
    }
}

/// `4B`, `16KiB`, `64MiB`: the largest binary unit that divides `bytes`.
pub fn format_size(bytes: usize) -> String {
    for (unit, scale) in [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}B")
}

/// The default window of int32 chunks of `elems` elements: about 1 MiB in
/// flight per worker (more only queues in the switch and the sockets), 4 to
/// 64 chunks.
pub fn window_for(elems: usize) -> u32 {
    u32::try_from((1 << 20) / (4 * elems.max(1)))
        .unwrap_or(u32::MAX)
        .clamp(4, 64)
}

/// Allreduces per repetition at `bytes` per worker.
pub fn iters_for(bytes: usize) -> usize {
    (MIN_REP_BYTES / bytes.max(1)).clamp(1, MAX_ITERS)
}

/// Runs the whole sweep; `progress` gets a line per measurement.
///
/// # Errors
/// When a topology, switch or lossy link cannot be set up, a rank cannot
/// connect, or any allreduce fails or returns a wrong result (the error
/// names the implementation, size and ranks).
pub fn run(
    spec: &AllreduceBenchSpec,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<Record>> {
    spec.validate()?;
    let mut impls = spec.impls.clone();
    let program = MpiProgram::for_bench(impls.contains(&Impl::Mpi), "column", &mut progress)?;
    if program.is_none() {
        impls.retain(|&i| i != Impl::Mpi);
    }
    ensure!(!impls.is_empty(), "impls: only mpi, which is not installed");
    let mut records = Vec::new();
    for &frame in &spec.frames {
        for &workers in &spec.workers {
            progress(&format!(
                "{workers} workers, MTU {frame}: building the stars"
            ));
            let options = StarOptions::new(workers).with_mtu(frame);
            let star = Star::build_with(options).context("building the star topology")?;
            let plain = plain::build(options).context("building the plain star")?;
            let result = (|| {
                if spec.per_frame() {
                    lossy::per_frame(&star, true).context("offloads off on the XDP star")?;
                    lossy::per_frame(&plain, false).context("offloads off on the plain star")?;
                }
                if let Some(rate) = spec.rate_mbit {
                    shape::shape(&star, rate).context("shaping the XDP star")?;
                    shape::shape(&plain, rate).context("shaping the plain star")?;
                }
                let job = program
                    .as_ref()
                    .map(|p| MpiJob::start(p, &plain, MPI_ANSWER_TIMEOUT))
                    .transpose()
                    .context("starting Open MPI on the plain star")?;
                let stars = Stars {
                    xdp: &star,
                    plain: &plain,
                };
                let on = On {
                    stars,
                    mpi: job,
                    impls: &impls,
                };
                run_on(on, spec, frame, workers, &mut records, &mut progress)
            })();
            plain.teardown().context("tearing the plain star down")?;
            star.teardown().context("tearing the topology down")?;
            result?;
        }
    }
    Ok(records)
}

/// The two stars of one worker count.
#[derive(Clone, Copy)]
struct Stars<'a> {
    /// With the switch attached: xina's path.
    xdp: &'a Star,
    /// Without XDP: the baselines' path.
    plain: &'a Star,
}

/// Where one worker count runs.
struct On<'a> {
    stars: Stars<'a>,
    /// Open MPI on the plain star, when measured.
    mpi: Option<MpiJob<'a>>,
    /// The implementations to measure, in table order.
    impls: &'a [Impl],
}

/// The sweep of one worker count.
fn run_on(
    On { stars, mpi, impls }: On<'_>,
    spec: &AllreduceBenchSpec,
    frame: u32,
    workers: usize,
    records: &mut Vec<Record>,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    let elems_per_packet = spec.elems_at(frame);
    let slots = spec.slots_at(frame);
    let scenario_spec = AllreduceSpec {
        workers,
        elems_per_packet,
        slots,
        ..Default::default()
    };
    let star = stars.xdp;
    let config = scenario::star_config(star, &scenario_spec);
    // Detached when dropped, at the end of this function.
    let _dp = scenario::start_switch(star, &config)?;
    let addrs = ring_addrs(star.workers().iter().map(|w| w.ip));
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let barrier = Barrier::new(workers);
    let (to_driver, from_ranks) = mpsc::channel();
    std::thread::scope(|scope| {
        let mut commands = Vec::with_capacity(workers);
        for rank in 0..workers {
            let (tx, rx) = mpsc::channel();
            commands.push(tx);
            let setup = RankSetup {
                rank,
                params: JobParams {
                    job: JOB_ID,
                    rank: u8::try_from(rank).context("rank")?,
                    fan_in: u8::try_from(workers).context("workers")?,
                    elems_per_packet,
                    slots,
                    op: xina_proto::Op::Sum,
                    dtype: DType::I32,
                    mode: xina_host::Mode::Allreduce,
                    switch,
                },
                bind: SocketAddrV4::new(star.worker(rank).ip, WORKER_PORT),
                give_up: spec.give_up,
                queue_target: spec.queue_target,
                segmentation_offload: !spec.per_frame(),
                addrs: &addrs,
                ring_ns: stars.plain.worker(rank).ns(),
                ring_timeout: spec.ring_timeout,
            };
            let (ns, barrier, to_driver) = (star.worker(rank).ns(), &barrier, to_driver.clone());
            scope.spawn(move || {
                let failed = to_driver.clone();
                if let Err(e) = ns.run(move || rank_loop(&setup, barrier, &rx, &to_driver)) {
                    let _ = failed.send(Message::Ready(rank, Err(format!("{e:#}"))));
                }
            });
        }
        drop(to_driver);
        let driver = Driver {
            stars,
            spec,
            frame,
            elems_per_packet,
            workers,
            commands: &commands,
            results: &from_ranks,
            mpi: mpi.map(RefCell::new),
            impls,
        };
        // Dropping `commands` on the way out ends every rank's loop.
        driver.run(records, progress)
    })
}

/// What a rank thread needs to set itself up.
struct RankSetup<'a> {
    rank: usize,
    params: JobParams,
    bind: SocketAddrV4,
    give_up: Duration,
    /// xina's queue target; `None`: every slot open.
    queue_target: Option<Duration>,
    /// Whether xina's worker may send with UDP GSO.
    segmentation_offload: bool,
    addrs: &'a [SocketAddrV4],
    /// Where the ring's sockets live: this rank's namespace of the plain star.
    ring_ns: &'a NetNs,
    ring_timeout: Duration,
}

/// One repetition for every rank.
struct Command {
    which: Impl,
    input: Arc<Vec<i32>>,
    expected: Arc<Vec<i32>>,
    iters: usize,
}

/// From a rank thread to the driver.
enum Message {
    /// Set up (or not); sent once.
    Ready(usize, Result<(), String>),
    Done(RankResult),
}

struct RankResult {
    rank: usize,
    start: Instant,
    end: Instant,
    retransmits: u64,
    fast_retransmits: u64,
    /// xina's congestion window at the end, the most chunks it had open,
    /// how often the window shrank.
    window: u32,
    max_open: u32,
    window_decreases: u64,
    /// Rank 0's congestion window over the repetition (xina).
    window_trace: Vec<(f64, u32)>,
    /// The smoothed round trip at the end, microseconds (xina).
    srtt_us: f64,
    /// How long each call took this rank, from its start to its return.
    calls: Vec<Duration>,
    outcome: Result<(), String>,
}

/// A rank: sets up its xina worker and ring connections, then runs one
/// repetition per command until the driver hangs up.
fn rank_loop(
    setup: &RankSetup<'_>,
    barrier: &Barrier,
    commands: &Receiver<Command>,
    to_driver: &Sender<Message>,
) {
    let rank = setup.rank;
    let ready = (|| -> anyhow::Result<(Worker, RingRank)> {
        let config = xina_host::Config {
            give_up: setup.give_up,
            queue_target: setup.queue_target,
            ..Default::default()
        };
        let mut worker = Worker::new(setup.params, setup.bind, config)
            .with_context(|| format!("rank {rank}: xina worker"))?;
        worker.set_segmentation_offload(setup.segmentation_offload);
        let ring = setup.ring_ns.run(|| -> anyhow::Result<RingRank> {
            let listener = RingRank::listen(rank, setup.addrs)?;
            Ok(RingRank::connect(
                rank,
                setup.addrs,
                &listener,
                setup.ring_timeout,
            )?)
        })??;
        Ok((worker, ring))
    })();
    let (mut worker, mut ring) = match ready {
        Ok(pair) => {
            let _ = to_driver.send(Message::Ready(rank, Ok(())));
            pair
        }
        Err(e) => {
            let _ = to_driver.send(Message::Ready(rank, Err(format!("{e:#}"))));
            return;
        }
    };
    while let Ok(cmd) = commands.recv() {
        let mut bufs: Vec<Vec<i32>> = (0..cmd.iters).map(|_| cmd.input.to_vec()).collect();
        worker.trace_window(rank == 0 && cmd.which == Impl::Xina);
        barrier.wait();
        let start = Instant::now();
        let (mut retransmits, mut fast_retransmits) = (0, 0);
        let (mut window, mut max_open, mut window_decreases) = (0, 0, 0);
        let mut outcome = Ok(());
        let mut calls = Vec::with_capacity(bufs.len());
        for buf in &mut bufs {
            let called = Instant::now();
            let done = match cmd.which {
                Impl::Xina => worker
                    .allreduce_i32(buf)
                    .map(|s| {
                        window = s.window;
                        max_open = max_open.max(s.max_open);
                        window_decreases += s.window_decreases;
                        (s.retransmissions, s.fast_retransmissions)
                    })
                    .map_err(|e| e.to_string()),
                Impl::Ring => ring
                    .allreduce_i32(buf)
                    .map(|s| (s.retransmits, 0))
                    .map_err(|e| e.to_string()),
                Impl::Mpi => Err("Open MPI runs in its own processes".to_owned()),
            };
            calls.push(called.elapsed());
            match done {
                Ok((r, fast)) => {
                    retransmits += r;
                    fast_retransmits += fast;
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        let end = Instant::now();
        if outcome.is_ok() {
            outcome = check(&bufs, &cmd.expected);
        }
        let result = RankResult {
            rank,
            start,
            end,
            retransmits,
            fast_retransmits,
            window,
            max_open,
            window_decreases,
            srtt_us: worker
                .rtt()
                .smoothed()
                .map_or(0.0, |d| d.as_secs_f64() * 1e6),
            window_trace: worker
                .take_window_trace()
                .into_iter()
                .map(|(t, w)| (t.saturating_duration_since(start).as_secs_f64() * 1e3, w))
                .collect(),
            calls,
            outcome,
        };
        if to_driver.send(Message::Done(result)).is_err() {
            return;
        }
    }
}

/// Whether every buffer is exactly `expected`.
fn check(bufs: &[Vec<i32>], expected: &[i32]) -> Result<(), String> {
    for (i, b) in bufs.iter().enumerate() {
        if b.len() != expected.len() {
            return Err(format!(
                "allreduce {i}: {} elements, expected {}",
                b.len(),
                expected.len()
            ));
        }
        if let Some(at) = b.iter().zip(expected).position(|(x, y)| x != y) {
            return Err(format!(
                "allreduce {i}: WRONG result at element {at}: {} (expected {})",
                b[at], expected[at]
            ));
        }
    }
    Ok(())
}

/// The driver's side of one worker count.
struct Driver<'a, 'm> {
    stars: Stars<'a>,
    spec: &'a AllreduceBenchSpec,
    frame: u32,
    elems_per_packet: u16,
    workers: usize,
    commands: &'a [Sender<Command>],
    results: &'a Receiver<Message>,
    /// Open MPI on the plain star, when installed.
    mpi: Option<RefCell<MpiJob<'m>>>,
    impls: &'a [Impl],
}

/// One repetition's outcome across ranks.
/// What one repetition runs: every rank's input, the sum it must return,
/// allreduces back to back, bytes per rank, and the links' loss rate.
#[derive(Clone, Copy)]
struct Work<'a> {
    inputs: &'a [Arc<Vec<i32>>],
    expected: &'a Arc<Vec<i32>>,
    iters: usize,
    bytes: usize,
    loss: f64,
}

struct Rep {
    /// Time per allreduce.
    time: Duration,
    retransmits: u64,
    /// xina's fast retransmissions (0 for the others).
    fast_retransmits: u64,
    /// xina: the largest final window, the most open, window decreases
    /// (0 for the others).
    window: u32,
    max_open: u32,
    window_decreases: u64,
    /// Rank 0's congestion window (xina).
    window_trace: Vec<(f64, u32)>,
    /// The largest smoothed round trip at the end, microseconds (xina).
    srtt_us: f64,
    /// With shaped links: the busiest link direction, Mbit/s.
    busiest_mbit: Option<f64>,
    /// Each call's time: the longest any rank spent in it (empty for Open
    /// MPI, whose program reports the loop's mean).
    calls: Vec<Duration>,
}

impl Driver<'_, '_> {
    fn run(
        &self,
        records: &mut Vec<Record>,
        progress: &mut impl FnMut(&str),
    ) -> anyhow::Result<()> {
        self.wait_ready()?;
        for &loss in &self.spec.losses {
            let mut links = lossy::on_star(self.stars.xdp, loss, false)?;
            links.extend(lossy::on_star(
                self.stars.plain,
                loss,
                self.spec.per_frame(),
            )?);
            for &bytes in &self.spec.sizes {
                let count = bytes / 4;
                let inputs: Vec<Arc<Vec<i32>>> = (0..self.workers)
                    .map(|r| Arc::new(scenario::worker_data(self.spec.seed, r, count)))
                    .collect();
                let mut expected = vec![0i32; count];
                for input in &inputs {
                    for (e, v) in expected.iter_mut().zip(input.iter()) {
                        *e = e.wrapping_add(*v);
                    }
                }
                let expected = Arc::new(expected);
                let iters = iters_for(bytes);
                let impls = self.impls;
                let mut reps: Vec<Vec<Rep>> = impls.iter().map(|_| Vec::new()).collect();
                let mut frames = vec![Counts::default(); impls.len()];
                let work = Work {
                    inputs: &inputs,
                    expected: &expected,
                    iters,
                    bytes,
                    loss,
                };
                for &which in impls {
                    self.rep(which, &work)?;
                }
                for _ in 0..self.spec.reps {
                    for (i, &which) in impls.iter().enumerate() {
                        let before = lossy::total(&links)?;
                        reps[i].push(self.shaped_rep(which, &work)?);
                        let seen = lossy::total(&links)?.since(before);
                        check_per_frame(self.spec, which, seen)?;
                        frames[i] = frames[i].plus(seen);
                    }
                }
                for (i, &which) in impls.iter().enumerate() {
                    let record = self.record(which, bytes, iters, loss, &reps[i], frames[i]);
                    progress(&format!(
                        "{} workers, MTU {}, loss {loss}%, {}: {} {:.1} us, {:.3} GB/s, {} retransmits{}",
                        self.workers,
                        self.frame,
                        format_size(bytes),
                        which.name(),
                        record.time_us,
                        record.algbw_gbps,
                        record.retransmits,
                        match (
                            record.fast_retransmits,
                            record.window,
                            record.max_open,
                            record.srtt_us
                        ) {
                            (Some(n), Some(w), Some(open), Some(srtt)) => format!(
                                " ({n} at once), window {w} (at most {open} open), round trip {:.2} ms",
                                srtt / 1e3
                            ),
                            _ => String::new(),
                        }
                    ));
                    records.push(record);
                }
            }
        }
        Ok(())
    }

    /// Waits until every rank has set up, or reports every rank that failed.
    fn wait_ready(&self) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        for _ in 0..self.workers {
            match self.results.recv() {
                Ok(Message::Ready(_, Ok(()))) => {}
                Ok(Message::Ready(rank, Err(e))) => failed.push(format!("rank {rank}: {e}")),
                Ok(Message::Done(_)) => bail!("a rank reported a result before it was set up"),
                Err(_) => bail!("every rank thread ended before setting up"),
            }
        }
        if !failed.is_empty() {
            bail!("setting up the ranks: {}", failed.join("; "));
        }
        Ok(())
    }

    /// [`Self::rep`], and with shaped links the busiest link direction of
    /// the star `which` runs on over it.
    fn shaped_rep(&self, which: Impl, work: &Work<'_>) -> anyhow::Result<Rep> {
        if self.spec.rate_mbit.is_none() {
            return self.rep(which, work);
        }
        let star = match which {
            Impl::Xina => self.stars.xdp,
            Impl::Ring | Impl::Mpi => self.stars.plain,
        };
        let before = shape::link_bytes(star)?;
        let started = Instant::now();
        let mut rep = self.rep(which, work)?;
        let wall = started.elapsed();
        let after = shape::link_bytes(star)?;
        // Open MPI's command warms up for about 200 ms before its timed
        // loop, and those bytes cross the links too: over the timed loop's
        // time alone they showed rates above the shaper's. Its rate is
        // over the whole command (a little low: it includes the launch).
        let seconds = match which {
            Impl::Mpi => wall.as_secs_f64(),
            Impl::Xina | Impl::Ring => rep.time.as_secs_f64() * work.iters as f64,
        };
        rep.busiest_mbit = Some(shape::busiest_mbit(&before, &after, seconds));
        Ok(rep)
    }

    /// One repetition of `which` on every rank.
    fn rep(&self, which: Impl, work: &Work<'_>) -> anyhow::Result<Rep> {
        let Work {
            inputs,
            expected,
            iters,
            bytes,
            loss,
        } = *work;
        if which == Impl::Mpi {
            let mut job = self
                .mpi
                .as_ref()
                .context("Open MPI is not running")?
                .borrow_mut();
            let answer = job.allreduce_i32(bytes, iters, 1).with_context(|| {
                format!(
                    "Open MPI allreduce of {} per worker, {} workers, loss {loss}%",
                    format_size(bytes),
                    self.workers
                )
            })?;
            return Ok(Rep {
                time: answer.samples.first().copied().context("no sample")?,
                retransmits: answer.retransmits,
                fast_retransmits: 0,
                window: 0,
                max_open: 0,
                window_decreases: 0,
                window_trace: Vec::new(),
                srtt_us: 0.0,
                busiest_mbit: None,
                calls: Vec::new(),
            });
        }
        for (tx, input) in self.commands.iter().zip(inputs) {
            tx.send(Command {
                which,
                input: Arc::clone(input),
                expected: Arc::clone(expected),
                iters,
            })
            .context("a rank thread has ended")?;
        }
        let mut results = Vec::with_capacity(self.workers);
        for _ in 0..self.workers {
            match self.results.recv() {
                Ok(Message::Done(r)) => results.push(r),
                Ok(Message::Ready(rank, _)) => bail!("rank {rank} set itself up twice"),
                Err(_) => bail!("a rank thread has ended"),
            }
        }
        results.sort_by_key(|r| r.rank);
        let failed: Vec<String> = results
            .iter()
            .filter_map(|r| {
                r.outcome
                    .as_ref()
                    .err()
                    .map(|e| format!("rank {}: {e}", r.rank))
            })
            .collect();
        if !failed.is_empty() {
            bail!(
                "{} allreduce of {} per worker, {} workers, loss {loss}%: {}",
                which.name(),
                format_size(bytes),
                self.workers,
                failed.join("; ")
            );
        }
        let start = results.iter().map(|r| r.start).min().context("no ranks")?;
        let end = results.iter().map(|r| r.end).max().context("no ranks")?;
        Ok(Rep {
            time: end.duration_since(start) / u32::try_from(iters).unwrap_or(u32::MAX),
            retransmits: results.iter().map(|r| r.retransmits).sum(),
            fast_retransmits: results.iter().map(|r| r.fast_retransmits).sum(),
            window: results.iter().map(|r| r.window).max().unwrap_or(0),
            max_open: results.iter().map(|r| r.max_open).max().unwrap_or(0),
            window_decreases: results.iter().map(|r| r.window_decreases).sum(),
            srtt_us: results.iter().map(|r| r.srtt_us).fold(0.0, f64::max),
            window_trace: results
                .iter()
                .find(|r| r.rank == 0)
                .map(|r| r.window_trace.clone())
                .unwrap_or_default(),
            busiest_mbit: None,
            calls: (0..iters)
                .map(|i| {
                    results
                        .iter()
                        .filter_map(|r| r.calls.get(i))
                        .max()
                        .copied()
                        .unwrap_or_default()
                })
                .collect(),
        })
    }

    fn record(
        &self,
        which: Impl,
        bytes: usize,
        iters: usize,
        loss: f64,
        reps: &[Rep],
        frames: Counts,
    ) -> Record {
        let times_us: Vec<f64> = reps.iter().map(|r| r.time.as_secs_f64() * 1e6).collect();
        let time_us = median(&times_us).unwrap_or(f64::NAN);
        let algbw_gbps = bytes as f64 / (time_us * 1e-6) / 1e9;
        let mut calls_us: Vec<f64> = reps
            .iter()
            .flat_map(|r| r.calls.iter().map(|c| c.as_secs_f64() * 1e6))
            .collect();
        calls_us.sort_by(f64::total_cmp);
        let quantile = |q: f64| {
            (!calls_us.is_empty()).then(|| {
                let at = (q * (calls_us.len() - 1) as f64).round() as usize;
                calls_us[at]
            })
        };
        Record {
            implementation: which,
            frame_bytes: self.frame,
            elems_per_packet: match which {
                Impl::Xina => self.elems_per_packet,
                Impl::Ring | Impl::Mpi => 0,
            },
            path: which.path(),
            workers: self.workers,
            bytes,
            count: bytes / 4,
            dtype: "int32",
            redop: "sum",
            time_us,
            algbw_gbps,
            busbw_gbps: busbw(algbw_gbps, self.workers),
            retransmits: reps.iter().map(|r| r.retransmits).sum(),
            fast_retransmits: match which {
                Impl::Xina => Some(reps.iter().map(|r| r.fast_retransmits).sum()),
                Impl::Ring | Impl::Mpi => None,
            },
            window: (which == Impl::Xina).then(|| {
                let windows: Vec<f64> = reps.iter().map(|r| f64::from(r.window)).collect();
                // A median of u32s is a u32 or halfway between two.
                median(&windows).unwrap_or(0.0).round() as u32
            }),
            max_open: (which == Impl::Xina)
                .then(|| reps.iter().map(|r| r.max_open).max().unwrap_or(0)),
            window_decreases: (which == Impl::Xina)
                .then(|| reps.iter().map(|r| r.window_decreases).sum()),
            fixed_window: self.spec.queue_target.is_none(),
            srtt_us: (which == Impl::Xina).then(|| reps.last().map_or(0.0, |r| r.srtt_us)),
            window_trace: (which == Impl::Xina).then(|| {
                reps.last()
                    .map(|r| r.window_trace.clone())
                    .unwrap_or_default()
            }),
            loss,
            reps: reps.len(),
            iters,
            times_us,
            call_p50_us: quantile(0.5),
            call_p99_us: quantile(0.99),
            frames_seen: frames.frames,
            frames_dropped: frames.frames_dropped,
            packets_seen: frames.seen,
            packets_dropped: frames.dropped,
            loss_model: self.spec.loss_model_used(),
            rate_mbit: self.spec.rate_mbit,
            busiest_link_mbit: reps.iter().filter_map(|r| r.busiest_mbit).reduce(f64::max),
        }
    }
}

/// Bus bandwidth of an allreduce among `n`: `algbw · 2(n-1)/n`.
pub fn busbw(algbw: f64, n: usize) -> f64 {
    algbw * 2.0 * (n as f64 - 1.0) / n as f64
}

/// Under the per-frame model, fails if the lossy links saw a packet of
/// more than one frame during `which`'s repetition: its numbers would not
/// be what the record says.
pub(crate) fn check_per_frame(
    spec: &AllreduceBenchSpec,
    which: Impl,
    seen: Counts,
) -> anyhow::Result<()> {
    ensure!(
        !spec.per_frame() || seen.frames == seen.seen,
        "loss model frame: the lossy links saw {} packets carrying {} frames during a {} \
         repetition (an offload batched frames)",
        seen.seen,
        seen.frames,
        which.name()
    );
    Ok(())
}

fn find(
    records: &[Record],
    which: Impl,
    at: (u32, usize),
    bytes: usize,
    loss: f64,
) -> Option<&Record> {
    let (frame, workers) = at;
    records.iter().find(|r| {
        r.implementation == which
            && r.frame_bytes == frame
            && r.workers == workers
            && r.bytes == bytes
            && r.loss == loss
    })
}

/// The largest link MTU `records` measured (the goals are judged there).
pub fn largest_frame(records: &[Record]) -> u32 {
    records.iter().map(|r| r.frame_bytes).max().unwrap_or(1500)
}

/// The table of one worker count and loss rate, nccl-tests' columns for
/// each implementation (Open MPI's only when it ran), and xina's algbw over
/// each baseline's (the baseline's time over xina's: above 1, xina is
/// faster), at link MTU `frame`. A first line says which star each
/// implementation ran on.
pub fn table(records: &[Record], frame: u32, workers: usize, loss: f64) -> String {
    let at = (frame, workers);
    let here: Vec<&Record> = records
        .iter()
        .filter(|r| r.frame_bytes == frame && r.workers == workers && r.loss == loss)
        .collect();
    let impls: Vec<Impl> = [Impl::Xina, Impl::Ring, Impl::Mpi]
        .into_iter()
        .filter(|&i| here.iter().any(|r| r.implementation == i))
        .collect();
    let baselines: Vec<Impl> = impls.iter().copied().filter(|&i| i != Impl::Xina).collect();
    let mut out = String::new();
    let paths: Vec<String> = impls
        .iter()
        .map(|i| format!("{} on the {}", i.name(), i.path()))
        .collect();
    let _ = writeln!(out, "paths: {}", paths.join(", "));
    let _ = write!(out, "{:>8} {:>9} {:>6} {:>5}", "", "", "", "");
    for i in &impls {
        let _ = write!(out, " | {:>34} {:>5}", i.name(), "");
    }
    let _ = writeln!(out, " |");
    let _ = write!(
        out,
        "{:>8} {:>9} {:>6} {:>5}",
        "size", "count", "type", "redop"
    );
    for _ in &impls {
        let _ = write!(
            out,
            " | {:>11} {:>11} {:>11} {:>5}",
            "time(us)", "algbw(GB/s)", "busbw(GB/s)", "retx"
        );
    }
    for b in &baselines {
        let _ = write!(out, " | {:>9}", format!("xina/{}", b.name()));
    }
    let _ = writeln!(out);
    let mut sizes: Vec<usize> = here.iter().map(|r| r.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for bytes in sizes {
        let _ = write!(
            out,
            "{:>8} {:>9} {:>6} {:>5}",
            format_size(bytes),
            bytes / 4,
            "int32",
            "sum"
        );
        for &which in &impls {
            let cols = find(records, which, at, bytes, loss).map_or_else(
                || format!("{:>11} {:>11} {:>11} {:>5}", "-", "-", "-", "-"),
                |r| {
                    format!(
                        "{:>11.1} {:>11.4} {:>11.4} {:>5}",
                        r.time_us, r.algbw_gbps, r.busbw_gbps, r.retransmits
                    )
                },
            );
            let _ = write!(out, " | {cols}");
        }
        for &b in &baselines {
            let ratio = ratio_to(records, b, at, bytes, loss)
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
            let _ = write!(out, " | {ratio:>9}");
        }
        let _ = writeln!(out);
    }
    if let Some(rate) = here.iter().find_map(|r| r.rate_mbit) {
        let busiest: Vec<String> = impls
            .iter()
            .map(|&i| {
                let most = here
                    .iter()
                    .filter(|r| r.implementation == i)
                    .filter_map(|r| r.busiest_link_mbit)
                    .reduce(f64::max);
                most.map_or_else(
                    || format!("{} not measured", i.name()),
                    |m| format!("{} {m:.0}", i.name()),
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "links shaped to {rate} Mbit/s each way (tbf); busiest link direction over a \
             repetition, Mbit/s: {}",
            busiest.join(", ")
        );
    }
    out
}

/// xina's algbw over the ring's (the ring's time over xina's).
pub fn ratio(records: &[Record], at: (u32, usize), bytes: usize, loss: f64) -> Option<f64> {
    ratio_to(records, Impl::Ring, at, bytes, loss)
}

/// xina's algbw over `baseline`'s (its time over xina's).
pub fn ratio_to(
    records: &[Record],
    baseline: Impl,
    at: (u32, usize),
    bytes: usize,
    loss: f64,
) -> Option<f64> {
    let x = find(records, Impl::Xina, at, bytes, loss)?;
    let b = find(records, baseline, at, bytes, loss)?;
    Some(b.time_us / x.time_us)
}

/// The three goals against what `records` measured, at the largest frame.
pub fn judge_goals(records: &[Record]) -> Vec<Goal> {
    let frame = largest_frame(records);
    let records: Vec<Record> = records
        .iter()
        .filter(|r| r.frame_bytes == frame)
        .cloned()
        .collect();
    let records = records.as_slice();
    let goal_at = (frame, GOAL_WORKERS);
    let judge = |statement: String, ratio: Option<f64>, threshold: f64, detail: String| Goal {
        statement,
        met: ratio.map(|r| r >= threshold),
        ratio,
        threshold,
        detail,
    };
    let at = |bytes| {
        let r = ratio(records, goal_at, bytes, 0.0);
        let detail = match r {
            Some(_) => format!(
                "lossless, {GOAL_WORKERS} workers, MTU {frame}, {}: ring time / xina time",
                format_size(bytes)
            ),
            None => format!(
                "not measured (needs {GOAL_WORKERS} workers, {} and loss 0)",
                format_size(bytes)
            ),
        };
        (r, detail)
    };
    let (bw, bw_detail) = at(GOAL_BANDWIDTH_BYTES);
    let (lat, lat_detail) = at(GOAL_LATENCY_BYTES);
    let mut goals = vec![
        judge(
            format!(
                "at {} and {GOAL_WORKERS} workers, xina's algbw >= {GOAL_BANDWIDTH_RATIO}x the ring's",
                format_size(GOAL_BANDWIDTH_BYTES)
            ),
            bw,
            GOAL_BANDWIDTH_RATIO,
            bw_detail,
        ),
        judge(
            format!(
                "{GOAL_LATENCY_BYTES}-byte allreduce at {GOAL_WORKERS} workers: xina's time <= 1/{GOAL_LATENCY_RATIO} of the ring's"
            ),
            lat,
            GOAL_LATENCY_RATIO,
            lat_detail,
        ),
    ];
    // Goodput under loss: the largest size and worker count measured both
    // lossless and at the goal's loss rate.
    let lossy = records
        .iter()
        .filter(|r| r.implementation == Impl::Xina && r.loss == GOAL_LOSS_PCT)
        .filter_map(|l| {
            find(records, Impl::Xina, (frame, l.workers), l.bytes, 0.0).map(|clean| (l, clean))
        })
        .max_by_key(|(l, _)| (l.bytes, l.workers));
    let (goodput, detail) = match lossy {
        Some((l, clean)) => (
            Some(l.algbw_gbps / clean.algbw_gbps),
            format!(
                "xina, {} workers, {}: algbw {:.4} GB/s at {GOAL_LOSS_PCT}% loss, {:.4} lossless{}",
                l.workers,
                format_size(l.bytes),
                l.algbw_gbps,
                clean.algbw_gbps,
                find(
                    records,
                    Impl::Ring,
                    (frame, l.workers),
                    l.bytes,
                    GOAL_LOSS_PCT
                )
                .zip(find(records, Impl::Ring, (frame, l.workers), l.bytes, 0.0))
                .map_or_else(String::new, |(rl, rc)| format!(
                    " (ring: {:.2} of lossless)",
                    rl.algbw_gbps / rc.algbw_gbps
                ))
            ),
        ),
        None => (
            None,
            format!("not measured (needs loss 0 and {GOAL_LOSS_PCT} at the same size)"),
        ),
    };
    goals.push(judge(
        format!(
            "goodput at {GOAL_LOSS_PCT}% loss >= {}% of lossless",
            GOAL_GOODPUT_RATIO * 100.0
        ),
        goodput,
        GOAL_GOODPUT_RATIO,
        detail,
    ));
    if records.iter().any(|r| r.rate_mbit.is_some()) {
        goals.extend(link_bound_goals(records, frame));
        return goals;
    }
    // Issue 12's CPU-bound goals, against Open MPI on the plain star.
    for (bytes, threshold, what) in [
        (
            GOAL_BANDWIDTH_BYTES,
            GOAL_MPI_BANDWIDTH_RATIO,
            format!(
                "at {} and {GOAL_WORKERS} workers, xina's algbw >= {GOAL_MPI_BANDWIDTH_RATIO}x Open MPI's",
                format_size(GOAL_BANDWIDTH_BYTES)
            ),
        ),
        (
            GOAL_LATENCY_BYTES,
            GOAL_MPI_LATENCY_RATIO,
            format!(
                "{GOAL_LATENCY_BYTES}-byte allreduce at {GOAL_WORKERS} workers: xina's time <= 1/{GOAL_MPI_LATENCY_RATIO} of Open MPI's"
            ),
        ),
    ] {
        let r = ratio_to(records, Impl::Mpi, goal_at, bytes, 0.0);
        let detail = match r {
            Some(_) => format!(
                "lossless, {GOAL_WORKERS} workers, MTU {frame}, {}: Open MPI's time / xina's",
                format_size(bytes)
            ),
            None => format!(
                "not measured (needs Open MPI, {GOAL_WORKERS} workers, {} and loss 0)",
                format_size(bytes)
            ),
        };
        goals.push(judge(what, r, threshold, detail));
    }
    let p50 = |loss| {
        find(records, Impl::Xina, goal_at, GOAL_LATENCY_BYTES, loss).and_then(|r| r.call_p50_us)
    };
    let (ratio, detail) = match (p50(0.0), p50(GOAL_LOSS_PCT)) {
        (Some(clean), Some(lossy)) => (
            Some(clean / lossy),
            format!(
                "xina, {GOAL_WORKERS} workers, MTU {frame}: median call {lossy:.1} us at \
                 {GOAL_LOSS_PCT}% loss, {clean:.1} us lossless (lossless / lossy)"
            ),
        ),
        _ => (
            None,
            format!(
                "not measured (needs {GOAL_WORKERS} workers, {GOAL_LATENCY_BYTES} B, loss 0 and \
                 {GOAL_LOSS_PCT})"
            ),
        ),
    };
    goals.push(judge(
        format!(
            "{GOAL_LATENCY_BYTES}-byte allreduce at {GOAL_LOSS_PCT}% loss: median call <= \
             {}x lossless",
            1.0 / GOAL_LOSS_LATENCY_RATIO
        ),
        ratio,
        GOAL_LOSS_LATENCY_RATIO,
        detail,
    ));
    goals
}

/// How flat two times are: the shorter over the longer (1 is flat), so
/// that a time that falls with more workers is no flatter than one that
/// grows as much.
pub fn flatness(a: f64, b: f64) -> f64 {
    a.min(b) / a.max(b)
}

/// Issue 12's link-bound goals (links shaped), at link MTU `frame`.
fn link_bound_goals(records: &[Record], frame: u32) -> Vec<Goal> {
    let goal_at = (frame, GOAL_WORKERS);
    let bytes = GOAL_BANDWIDTH_BYTES;
    let size = format_size(bytes);
    let vs_mpi = ratio_to(records, Impl::Mpi, goal_at, bytes, 0.0);
    let mpi_detail = match vs_mpi {
        Some(_) => format!(
            "shaped links, {GOAL_WORKERS} workers, MTU {frame}, {size}: Open MPI's time / xina's"
        ),
        None => format!("not measured (needs Open MPI, {GOAL_WORKERS} workers and {size})"),
    };
    let few = records
        .iter()
        .filter(|r| r.implementation == Impl::Xina && r.bytes == bytes && r.frame_bytes == frame)
        .min_by_key(|r| r.workers);
    let many = find(records, Impl::Xina, goal_at, bytes, 0.0);
    let (flat, flat_detail) = match (few, many) {
        (Some(f), Some(m)) if f.workers < m.workers => (
            Some(flatness(f.time_us, m.time_us)),
            format!(
                "xina, {size}: {:.0} us at {} workers, {:.0} us at {GOAL_WORKERS} (shorter time / longer)",
                f.time_us, f.workers, m.time_us
            ),
        ),
        _ => (
            None,
            format!("not measured (needs xina at {size} with {GOAL_WORKERS} workers and fewer)"),
        ),
    };
    vec![
        Goal {
            statement: format!(
                "link-bound: at {size} and {GOAL_WORKERS} workers, xina's algbw >= {GOAL_LINK_MPI_RATIO}x Open MPI's"
            ),
            met: vs_mpi.map(|r| r >= GOAL_LINK_MPI_RATIO),
            ratio: vs_mpi,
            threshold: GOAL_LINK_MPI_RATIO,
            detail: mpi_detail,
        },
        Goal {
            statement: format!(
                "link-bound: xina's time at {size} flat from the fewest workers to {GOAL_WORKERS}, within {:.0}%",
                (GOAL_LINK_FLATNESS - 1.0) * 100.0
            ),
            met: flat.map(|r| r >= 1.0 / GOAL_LINK_FLATNESS),
            ratio: flat,
            threshold: 1.0 / GOAL_LINK_FLATNESS,
            detail: flat_detail,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_step() {
        assert_eq!(parse_size("4B").unwrap(), 4);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("16K").unwrap(), 16 << 10);
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert_eq!(
            parse_size_range("4B..64B", 2).unwrap(),
            vec![4, 8, 16, 32, 64]
        );
        assert_eq!(parse_size_range("4..64", 4).unwrap(), vec![4, 16, 64]);
        assert_eq!(parse_size_range("4..32", 4).unwrap(), vec![4, 16, 32]);
        assert!(parse_size_range("64..4", 2).is_err());
        assert_eq!(parse_size_range("8B,64MiB", 2).unwrap(), vec![8, 64 << 20]);
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(12), "12B");
        assert_eq!(format_size(3 << 10), "3KiB");
    }

    #[test]
    fn spec_errors_name_the_field() {
        let bad = |f: fn(&mut AllreduceBenchSpec)| {
            let mut s = AllreduceBenchSpec::default();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(|s| s.workers = vec![1]).starts_with("workers: 1"));
        assert!(bad(|s| s.sizes = vec![6]).starts_with("sizes: 6"));
        assert!(bad(|s| s.reps = 0).starts_with("reps"));
        assert!(bad(|s| s.losses = vec![100.0]).starts_with("loss: 100"));
        assert!(bad(|s| s.rate_mbit = Some(0)).starts_with("rate: 0"));
        fn shaped(s: &mut AllreduceBenchSpec) {
            s.rate_mbit = Some(500);
            s.frames = vec![65_000];
        }
        assert!(
            bad(|s| {
                shaped(s);
                s.losses = vec![0.0, 1.0];
            })
            .contains("cannot be combined with loss")
        );
        assert!(
            bad(|s| {
                shaped(s);
                s.frames = vec![1500, 65_000];
            })
            .contains("needs frames above 1500")
        );
        let mut s = AllreduceBenchSpec::default();
        shaped(&mut s);
        s.validate().unwrap();
        AllreduceBenchSpec::default().validate().unwrap();
    }

    #[test]
    fn flatness_is_two_sided() {
        assert!((flatness(1.0, 1.0) - 1.0).abs() < 1e-12);
        assert!((flatness(1.0, 1.15) - flatness(1.15, 1.0)).abs() < 1e-12);
        // 3.2 s at 2 workers and 1.7 s at 8 is not flat.
        assert!(flatness(3.2, 1.7) < 1.0 / GOAL_LINK_FLATNESS);
        assert!(flatness(1.08, 1.12) >= 1.0 / GOAL_LINK_FLATNESS);
    }

    #[test]
    fn busbw_is_nccl_tests_factor() {
        assert!((busbw(1.0, 2) - 1.0).abs() < 1e-12);
        assert!((busbw(1.0, 8) - 1.75).abs() < 1e-12);
        assert_eq!(iters_for(4), MAX_ITERS);
        assert_eq!(iters_for(256 << 10), 4);
        assert_eq!(iters_for(64 << 20), 1);
    }
}

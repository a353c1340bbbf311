//! `xina-testbed bench switch`: what one packet costs the switch, in the
//! kernel, without a sender in the way, and what real senders get through it.
//!
//! # In-kernel cost per path (`BPF_PROG_TEST_RUN`)
//!
//! The cost of a contribution depends on the path it takes through the slot
//! state machine (see `ebpf/xina-ebpf/src/slot.rs`), and the path depends on
//! the slot's state, which the packet itself changes. Repeating one frame
//! would therefore mix paths: the first run initialises the slot, the second
//! is a duplicate. So each path is measured over a stream of *distinct*
//! frames that all take it, on a job of fan-in 3 with `slots` slots, in
//! batches of `2 × slots` chunks (both copies of every slot):
//!
//! | path          | frames of the batch                  | outcome (checked)           |
//! |---------------|--------------------------------------|-----------------------------|
//! | `first`       | rank 0's chunks                      | `consumed`, `XDP_DROP`      |
//! | `duplicate`   | rank 0's chunks again (unfinished)   | `drop_duplicate`, `XDP_DROP`|
//! | `combining`   | rank 1's chunks                      | `consumed`, `XDP_DROP`      |
//! | `completing`  | rank 2's chunks                      | `completed`, `XDP_REDIRECT` |
//! | `from_cache`  | rank 0's chunks again (finished)     | `reply_from_cache`, `XDP_REDIRECT` |
//! | `unknown_job` | chunks of a job that is not installed| `drop_unknown_job`, `XDP_DROP` |
//!
//! From the second batch on, the first contribution reuses a copy that holds
//! the chunk `2 × slots` earlier, as in a running job. Every frame is run
//! once (`repeat = 1`), and the kernel's own duration of that run is used:
//! it is taken inside `BPF_PROG_TEST_RUN` around the program, so the syscall
//! and the copy of the frame are not in it. The cost of a path is the sum over
//! its frames divided by their number. The action of every run and the
//! switch's counters after every round are checked, so a frame that strayed
//! onto another path fails the benchmark instead of skewing it.
//!
//! # The drop baseline
//!
//! A `repeat = 1` duration still contains a fixed cost of the test harness
//! (reading the clock, disabling bottom halves) that is not the switch's. So
//! every frame is also run through `xina_drop`, a program that only returns
//! `XDP_DROP`, in the same way and interleaved with the switch frame by frame
//! (alternating which goes first), so that noise on this shared machine hits
//! both alike. `ratio = agg_pps / drop_pps = drop_ns / ns` says how close a
//! path comes to the cheapest possible XDP program measured the same way;
//! `extra_ns = ns − drop_ns` is what the switch adds to it.
//!
//! The whole measurement is repeated `rounds` times, each on a freshly
//! installed job (empty slots), and every figure reported is the median over
//! the rounds: one round hit by a noisy neighbour moves the median little.
//!
//! For the two paths a repeated frame stays on (`duplicate`, `unknown_job`),
//! one frame is also run with a large `repeat` next to `xina_drop` with the
//! same `repeat`: there the harness's fixed cost is spread over all runs, so
//! the difference between `xina_drop` at `repeat = 1` and at a large repeat is
//! the harness's share of every `repeat = 1` figure.
//!
//! What `BPF_PROG_TEST_RUN` cannot show: what happens after the program
//! returns. For `completing`, the broadcast through the devmap, the copy of
//! the frame per port and `xina_egress` on each copy are not in the figure.
//!
//! # End to end
//!
//! [`run_end_to_end`] runs the real allreduce scenario (workers in network
//! namespaces sending one UDP datagram per syscall through veth pairs to the
//! XDP switch) and reports the packets per second through the switch and
//! each worker's send rate. It compares them with what the `TestRun` costs
//! say one core could take, and with the switch programs' own run time
//! measured in place with the kernel's BPF run-time statistics
//! (`BPF_ENABLE_STATS`), to say which side limits the run.

use std::{fmt::Write as _, net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, bail, ensure};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde::Serialize;
use xina::{Counters, Dataplane, JobSpec, LoadOptions, MemberSpec, dataplane::Mode, frame};
use xina_proto::{DType, Flags, Kind, Op, Repr, counters::Counter, maps::programs};

use crate::scenario::{self, AllreduceSpec};
use xina::dataplane::xdp_action::{DROP as XDP_DROP, PASS as XDP_PASS, REDIRECT as XDP_REDIRECT};

/// The job the `TestRun` benchmark installs, and one it never installs.
const JOB: u32 = 9;
const UNKNOWN_JOB: u32 = 9_999;
/// Fan-in of the benchmark job: one first, one combining and one completing
/// contribution per chunk.
const FAN_IN: u8 = 3;
const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 254);

/// The goal: every aggregation path at 64 elements per packet takes at least
/// this fraction of the drop baseline's packet rate.
pub const GOAL_RATIO: f64 = 0.5;
/// Elements per packet the goal is stated for.
pub const GOAL_ELEMS: u16 = 64;
/// Issue 12: int32 sum combining, ns per element at the largest frame.
pub const GOAL_COMBINE_NS: f64 = 1.0;
/// Issue 12: int32 sum completing, ns per element at the largest frame.
pub const GOAL_COMPLETE_NS: f64 = 2.0;
/// Issue 12: max and min combining, at most this times sum's cost.
pub const GOAL_MAX_MIN_FACTOR: f64 = 1.5;

/// An element type and op of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Variant {
    I32Sum,
    I32Max,
    I32Min,
    I64Sum,
    I64Max,
    I64Min,
}

impl Variant {
    pub const fn dtype(self) -> DType {
        match self {
            Self::I32Sum | Self::I32Max | Self::I32Min => DType::I32,
            Self::I64Sum | Self::I64Max | Self::I64Min => DType::I64,
        }
    }

    pub const fn op(self) -> Op {
        match self {
            Self::I32Sum | Self::I64Sum => Op::Sum,
            Self::I32Max | Self::I64Max => Op::Max,
            Self::I32Min | Self::I64Min => Op::Min,
        }
    }

    /// `int32`, `int64`.
    pub const fn dtype_name(self) -> &'static str {
        match self.dtype() {
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bytes => "bytes",
        }
    }

    /// `sum`, `max`, `min`.
    pub const fn op_name(self) -> &'static str {
        match self.op() {
            Op::Sum => "sum",
            Op::Max => "max",
            Op::Min => "min",
        }
    }
}

/// The way a contribution goes through the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// Initialises its slot copy.
    First,
    /// Combined into a copy that still misses ranks.
    Combining,
    /// Completes the chunk: becomes the result and is broadcast.
    Completing,
    /// A rank's contribution to a chunk it already contributed to.
    Duplicate,
    /// A retransmission after completion, answered from the stored result.
    FromCache,
    /// A job that is not installed: dropped at admission.
    UnknownJob,
}

impl Path {
    /// In table order.
    pub const ALL: [Self; 6] = [
        Self::First,
        Self::Combining,
        Self::Completing,
        Self::Duplicate,
        Self::FromCache,
        Self::UnknownJob,
    ];

    /// The paths that aggregate (the goal is stated for these).
    pub const AGGREGATION: [Self; 3] = [Self::First, Self::Combining, Self::Completing];

    /// The order paths are driven in within a batch of chunks: each leaves
    /// the slots in the state the next one needs.
    const BATCH_ORDER: [Self; 5] = [
        Self::First,
        Self::Duplicate,
        Self::Combining,
        Self::Completing,
        Self::FromCache,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Combining => "combining",
            Self::Completing => "completing",
            Self::Duplicate => "duplicate",
            Self::FromCache => "from_cache",
            Self::UnknownJob => "unknown_job",
        }
    }

    /// The rank whose frames take this path (of the benchmark's fan-in 3).
    const fn rank(self) -> u8 {
        match self {
            Self::Combining => 1,
            Self::Completing => 2,
            Self::First | Self::Duplicate | Self::FromCache | Self::UnknownJob => 0,
        }
    }

    /// The XDP action every frame on this path must get. On the wide path a
    /// completed result is passed to the kernel, where the tc fan-out
    /// program clones it to the members.
    const fn action(self, wide: bool) -> u32 {
        match self {
            Self::Completing if wide => XDP_PASS,
            Self::Completing | Self::FromCache => XDP_REDIRECT,
            Self::First | Self::Combining | Self::Duplicate | Self::UnknownJob => XDP_DROP,
        }
    }

    /// The ingress outcome counter every frame on this path must bump.
    const fn counter(self) -> Counter {
        match self {
            Self::First | Self::Combining => Counter::Consumed,
            Self::Completing => Counter::Completed,
            Self::Duplicate => Counter::DropDuplicate,
            Self::FromCache => Counter::ReplyFromCache,
            Self::UnknownJob => Counter::DropUnknownJob,
        }
    }
}

/// What to measure with `BPF_PROG_TEST_RUN`.
#[derive(Clone, Debug, Serialize)]
pub struct SwitchBenchSpec {
    /// Elements per packet of each case.
    pub elems: Vec<u16>,
    /// More cases: for each of these IP MTUs, as many elements as a packet
    /// of that MTU holds (`xina_proto::frame::elems_for_mtu`).
    pub frames: Vec<usize>,
    /// Element types and ops of each case.
    #[serde(serialize_with = "variant_names")]
    pub variants: Vec<Variant>,
    /// Repetitions of the whole measurement; medians are reported.
    pub rounds: usize,
    /// Distinct frames per path and round.
    pub stream: u32,
    /// Slots of the benchmark job (the window of a running job); `None`:
    /// what `bench allreduce` gives a job of each case's size (about 1 MiB
    /// of chunks, 4 to 64 slots: [`crate::allreduce_bench::window_for`]).
    pub slots: Option<u32>,
    /// `repeat` of the single-frame runs (duplicate, unknown job, baseline).
    pub repeat: u32,
    /// Seed of the payloads.
    pub seed: u64,
}

impl SwitchBenchSpec {
    /// The job's slots at `elems` elements per packet.
    pub fn slots_at(&self, elems: u16) -> u32 {
        self.slots
            .unwrap_or_else(|| crate::allreduce_bench::window_for(usize::from(elems)))
    }
}

fn variant_names<S: serde::Serializer>(v: &[Variant], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        v.iter()
            .map(|v| format!("{} {}", v.dtype_name(), v.op_name())),
    )
}

impl Default for SwitchBenchSpec {
    fn default() -> Self {
        Self {
            elems: vec![64, 256],
            frames: Vec::new(),
            variants: vec![Variant::I32Sum, Variant::I32Max, Variant::I64Sum],
            rounds: 5,
            stream: 2048,
            slots: None,
            repeat: 10_000,
            seed: 1,
        }
    }
}

/// One path of one case: medians over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct PathRecord {
    /// `"testrun"`.
    pub kind: &'static str,
    pub dtype: &'static str,
    pub op: &'static str,
    pub elements_per_packet: u16,
    /// The IP packet's length: headers and `elements_per_packet` elements.
    pub frame_bytes: usize,
    pub path: &'static str,
    /// Median over the rounds of the mean in-kernel time per frame.
    pub ns_per_packet: f64,
    /// `extra_ns / elements_per_packet`: what the path costs per element
    /// above a bare `XDP_DROP` of the same frame.
    pub ns_per_element: f64,
    /// `1e9 / ns_per_element`: elements per second one core handles on
    /// this path.
    pub elements_per_s: f64,
    /// `1e9 / ns_per_packet`: packets per second on one core.
    pub agg_pps: f64,
    /// The same for `xina_drop` over the same frames.
    pub drop_ns: f64,
    pub drop_pps: f64,
    /// `agg_pps / drop_pps`.
    pub ratio: f64,
    /// `ns_per_packet − drop_ns`: what the switch adds to a bare `XDP_DROP`.
    pub extra_ns: f64,
    /// Smallest and largest round.
    pub ns_min: f64,
    pub ns_max: f64,
    pub rounds: usize,
    pub frames_per_round: u32,
    /// Each round's mean, switch and baseline.
    pub round_ns: Vec<f64>,
    pub round_drop_ns: Vec<f64>,
}

/// One frame run `repeat` times, on a path a repeated frame stays on.
#[derive(Clone, Debug, Serialize)]
pub struct RepeatRecord {
    /// `"testrun_repeat"`.
    pub kind: &'static str,
    pub dtype: &'static str,
    pub op: &'static str,
    pub elements_per_packet: u16,
    pub path: &'static str,
    pub repeat: u32,
    /// Median over the rounds of the kernel's mean time per run.
    pub ns_per_packet: f64,
    pub drop_ns: f64,
    pub ratio: f64,
    pub rounds: usize,
}

/// Whether the goal was met.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub statement: String,
    pub elements_per_packet: u16,
    pub min_ratio: f64,
    /// The smallest ratio among the aggregation paths of `int32 sum` at
    /// [`GOAL_ELEMS`], and its path; `None` if that case was not measured.
    pub worst_ratio: Option<f64>,
    pub worst_path: Option<&'static str>,
    pub met: Option<bool>,
}

/// Everything `bench switch` measured.
#[derive(Clone, Debug, Serialize)]
pub struct SwitchBenchReport {
    pub machine: Machine,
    pub spec: SwitchBenchSpec,
    pub goal: Goal,
    pub element_goals: Vec<ElementGoal>,
    /// Median `xina_drop` time at `repeat = 1` minus at `spec.repeat`: the
    /// test harness's share of every `repeat = 1` figure.
    pub harness_ns: Option<f64>,
    pub testrun: Vec<PathRecord>,
    pub testrun_repeat: Vec<RepeatRecord>,
    pub end_to_end: Vec<EndToEndRecord>,
}

/// Where it ran.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub kernel: String,
}

impl Machine {
    pub fn this() -> Self {
        Self {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some(f64::midpoint(v[n / 2 - 1], v[n / 2])),
    }
}

/// Packets per second at `ns` nanoseconds per packet.
pub fn pps(ns: f64) -> f64 {
    if ns > 0.0 { 1e9 / ns } else { f64::INFINITY }
}

/// Mean in-kernel time per contribution of a chunk among `fan_in` ranks:
/// one first, `fan_in − 2` combining and one completing contribution
/// (`fan_in` 1: the first completes; 2: first and completing).
pub fn ns_per_contribution(first: f64, combining: f64, completing: f64, fan_in: usize) -> f64 {
    match fan_in {
        0 => 0.0,
        1 => completing,
        n => (first + (n - 2) as f64 * combining + completing) / n as f64,
    }
}

/// A rate for a table: `12.3M`, `850k`.
pub fn format_rate(pps: f64) -> String {
    if pps >= 1e6 {
        format!("{:.2}M", pps / 1e6)
    } else if pps >= 1e3 {
        format!("{:.0}k", pps / 1e3)
    } else {
        format!("{pps:.0}")
    }
}

fn member(rank: u8) -> MemberSpec {
    MemberSpec {
        rank,
        ip: Ipv4Addr::new(10, 99, 0, rank + 1),
        udp_port: 5000 + u16::from(rank),
        mac: [0x02, 0x99, 0, 0, 0, rank + 1],
        // Test runs never redirect for real; the index only has to be set.
        ifindex: 100 + u32::from(rank),
        port_mac: [0x02, 0x5b, 0, 0, 0, rank + 1],
        sender: false,
        down: false,
    }
}

fn job_spec(variant: Variant, elems: u16, slots: u32) -> JobSpec {
    JobSpec {
        id: JOB,
        op: variant.op(),
        dtype: variant.dtype(),
        mode: Mode::Allreduce,
        elems_per_packet: elems,
        slot_base: 0,
        slot_count: slots,
        members: (0..FAN_IN).map(member).collect(),
    }
}

/// The distinct frames of one case: `by_rank[r][seq]`, and the unknown
/// job's frames.
struct Frames {
    by_rank: Vec<Vec<Vec<u8>>>,
    unknown: Vec<Vec<u8>>,
}

impl Frames {
    fn new(variant: Variant, elems: u16, stream: u32, slots: u32, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut one = |job: u32, rank: u8, seq: u32| {
            let payload: Vec<u8> = match variant.dtype() {
                DType::I32 => frame::i32_payload(
                    &(0..elems)
                        .map(|_| rng.random_range(-(1 << 20)..(1 << 20)))
                        .collect::<Vec<i32>>(),
                ),
                DType::I64 => (0..elems)
                    .flat_map(|_| rng.random_range(-(1i64 << 40)..(1 << 40)).to_be_bytes())
                    .collect(),
                DType::Bytes => (0..elems).map(|_| rng.random()).collect(),
            };
            let m = member(rank);
            let repr = Repr {
                kind: Kind::AggData,
                flags: Flags::default(),
                job,
                rank,
                fan_in: FAN_IN,
                op: variant.op(),
                dtype: variant.dtype(),
                seq,
                slot: seq % slots,
                slot_version: (seq / slots) % 2 == 1,
                count: elems,
                exponent: 0,
                root: 0,
                bitmap: 1 << rank,
            };
            frame::from_member(&m, SWITCH_IP, &repr, &payload)
        };
        let by_rank = (0..FAN_IN)
            .map(|rank| (0..stream).map(|seq| one(JOB, rank, seq)).collect())
            .collect();
        let unknown = (0..stream).map(|seq| one(UNKNOWN_JOB, 0, seq)).collect();
        Self { by_rank, unknown }
    }

    fn get(&self, path: Path, seq: u32) -> &[u8] {
        match path {
            Path::UnknownJob => &self.unknown[seq as usize],
            p => &self.by_rank[usize::from(p.rank())][seq as usize],
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `frame` once through the switch and once through `xina_drop`, in
/// the order `drop_first` says; returns the kernel's two durations in ns.
fn time_pair(
    dp: &mut Dataplane,
    frame: &[u8],
    drop_first: bool,
    path: Path,
    seq: u32,
    wide: bool,
) -> anyhow::Result<(u64, u64)> {
    let run_drop = |dp: &mut Dataplane| -> anyhow::Result<u64> {
        let (out, d) = dp.test_run_drop(frame, 1)?;
        ensure!(out.action == XDP_DROP, "xina_drop returned {}", out.action);
        Ok(nanos(d))
    };
    let drop_before = if drop_first { run_drop(dp)? } else { 0 };
    let (out, d) = dp.test_run_switch_timed(frame, 1)?;
    ensure!(
        out.action == path.action(wide),
        "path {}: chunk {seq} got XDP action {} instead of {}",
        path.name(),
        out.action,
        path.action(wide)
    );
    let drop = if drop_first {
        drop_before
    } else {
        run_drop(dp)?
    };
    Ok((nanos(d), drop))
}

/// Checks that the ingress outcome counters moved by exactly the sums of
/// `expect` (a counter may appear more than once).
fn check_outcomes(delta: &Counters, expect: &[(Counter, u64)]) -> anyhow::Result<()> {
    let total: u64 = expect.iter().map(|e| e.1).sum();
    let mut wrong = Vec::new();
    if delta.get(Counter::RxPackets) != total {
        wrong.push(format!(
            "rx_packets {} (expected {total})",
            delta.get(Counter::RxPackets)
        ));
    }
    for c in Counter::ALL.into_iter().filter(|c| c.is_ingress_outcome()) {
        let want: u64 = expect.iter().filter(|e| e.0 == c).map(|e| e.1).sum();
        if delta.get(c) != want {
            wrong.push(format!("{} {} (expected {want})", c.name(), delta.get(c)));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        bail!(
            "frames left their path; switch counters: {}",
            wrong.join(", ")
        )
    }
}

/// Per-round means of one case, by path.
#[derive(Default)]
struct CaseRounds {
    /// `(switch ns, drop ns)` per round, per path (index in [`Path::ALL`]).
    stream: [Vec<(f64, f64)>; 6],
    /// `(switch ns, drop ns)` per round for the repeated-frame runs.
    duplicate: Vec<(f64, f64)>,
    unknown: Vec<(f64, f64)>,
    /// `xina_drop` at `repeat = 1` and at `spec.repeat`, per round.
    drop_single: Vec<f64>,
    drop_repeated: Vec<f64>,
}

fn path_index(p: Path) -> usize {
    Path::ALL.iter().position(|q| *q == p).expect("in ALL")
}

/// One round of the stream measurement on a freshly installed job.
fn stream_round(
    dp: &mut Dataplane,
    spec: &SwitchBenchSpec,
    job: &JobSpec,
    frames: &Frames,
    round: usize,
    out: &mut CaseRounds,
) -> anyhow::Result<()> {
    dp.install_job(job)?;
    let before = dp.counters()?;
    let mut sums = [(0u64, 0u64); 6];
    let mut drop_first = round.is_multiple_of(2);
    let mut measure = |dp: &mut Dataplane, path: Path, seq: u32| -> anyhow::Result<()> {
        let wide = job.is_wide();
        let (s, d) = time_pair(dp, frames.get(path, seq), drop_first, path, seq, wide)?;
        drop_first = !drop_first;
        let sum = &mut sums[path_index(path)];
        sum.0 += s;
        sum.1 += d;
        Ok(())
    };
    let batch = 2 * job.slot_count;
    for start in (0..spec.stream).step_by(batch as usize) {
        let end = (start + batch).min(spec.stream);
        for path in Path::BATCH_ORDER {
            for seq in start..end {
                measure(dp, path, seq)?;
            }
        }
    }
    for seq in 0..spec.stream {
        measure(dp, Path::UnknownJob, seq)?;
    }
    let expect = Path::ALL.map(|p| (p.counter(), u64::from(spec.stream)));
    check_outcomes(&dp.counters()?.delta(&before), &expect)?;
    dp.remove_job(JOB)?;
    let n = f64::from(spec.stream);
    for (rounds, (s, d)) in out.stream.iter_mut().zip(sums) {
        rounds.push((s as f64 / n, d as f64 / n));
    }
    Ok(())
}

/// One round of the single-frame runs: a duplicate and an unknown job's
/// frame `spec.repeat` times each, and the baseline at repeat 1 and
/// `spec.repeat`.
fn repeat_round(
    dp: &mut Dataplane,
    spec: &SwitchBenchSpec,
    job: &JobSpec,
    frames: &Frames,
    out: &mut CaseRounds,
) -> anyhow::Result<()> {
    dp.install_job(job)?;
    let before = dp.counters()?;
    let frame = frames.get(Path::First, 0);
    ensure!(dp.test_run_switch(frame, 0)?.action == XDP_DROP);
    let single = |dp: &mut Dataplane, path: Path, frame: &[u8]| -> anyhow::Result<(f64, f64)> {
        let (out, d) = dp.test_run_switch_timed(frame, spec.repeat)?;
        ensure!(
            out.action == path.action(job.is_wide()),
            "{}: XDP action {}",
            path.name(),
            out.action
        );
        let (_, drop) = dp.test_run_drop(frame, spec.repeat)?;
        Ok((nanos(d) as f64, nanos(drop) as f64))
    };
    out.duplicate.push(single(dp, Path::Duplicate, frame)?);
    out.unknown.push(single(
        dp,
        Path::UnknownJob,
        frames.get(Path::UnknownJob, 0),
    )?);
    let expect = [
        (Counter::Consumed, 1),
        (Counter::DropDuplicate, u64::from(spec.repeat)),
        (Counter::DropUnknownJob, u64::from(spec.repeat)),
    ];
    check_outcomes(&dp.counters()?.delta(&before), &expect)?;
    dp.remove_job(JOB)?;
    // The harness's fixed cost: the baseline alone, at repeat 1 and many.
    let mut ones = Vec::new();
    for i in 0..256 {
        let (_, d) = dp.test_run_drop(frames.get(Path::First, i % spec.stream), 1)?;
        ones.push(nanos(d) as f64);
    }
    out.drop_single
        .push(ones.iter().sum::<f64>() / ones.len() as f64);
    let (_, d) = dp.test_run_drop(frame, spec.repeat)?;
    out.drop_repeated.push(nanos(d) as f64);
    Ok(())
}

fn medians(pairs: &[(f64, f64)]) -> (f64, f64) {
    let a: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let b: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    (
        median(&a).unwrap_or(f64::NAN),
        median(&b).unwrap_or(f64::NAN),
    )
}

/// Measures every case of `spec`; `progress` gets one line per case.
///
/// # Errors
/// When the dataplane cannot be loaded (root is needed), a test run fails,
/// or a frame does not take its path.
pub fn run_switch_bench(
    spec: &SwitchBenchSpec,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<(Vec<PathRecord>, Vec<RepeatRecord>, Option<f64>)> {
    ensure!(spec.rounds > 0, "rounds must be at least 1");
    ensure!(spec.stream > 0, "the stream needs at least one frame");
    ensure!(spec.slots != Some(0), "the job needs at least one slot");
    ensure!(spec.repeat > 0, "repeat must be at least 1");
    // Room for the widest case's partials on every possible CPU, and for
    // the case with the most slots.
    let mut units = u64::from(xina_proto::maps::DEFAULT_UNITS);
    let mut slot_pool = 1;
    let by_frame = spec
        .frames
        .iter()
        .map(|&mtu| xina_proto::frame::elems_for_mtu(DType::I32, mtu));
    for elems in by_frame.chain(spec.elems.iter().map(|&e| usize::from(e))) {
        let elems = u16::try_from(elems).unwrap_or(u16::MAX);
        let slots = spec.slots_at(elems);
        units = units.max(xina::dataplane::wide_units_here(elems, slots)?);
        slot_pool = slot_pool.max(slots);
    }
    let mut dp = Dataplane::load(LoadOptions {
        slot_pool,
        units: u32::try_from(units).context("units")?,
        debug: false,
    })
    .context("loading the dataplane (are you root?)")?;
    let mut records = Vec::new();
    let mut repeated = Vec::new();
    let (mut singles, mut repeats) = (Vec::new(), Vec::new());
    for &variant in &spec.variants {
        let by_frame = spec.frames.iter().map(|&mtu| {
            u16::try_from(xina_proto::frame::elems_for_mtu(variant.dtype(), mtu)).unwrap_or(0)
        });
        let mut cases: Vec<u16> = spec.elems.iter().copied().chain(by_frame).collect();
        cases.dedup();
        for elems in cases {
            let max = variant.dtype().max_elems();
            if elems == 0 || usize::from(elems) > max {
                progress(&format!(
                    "skipping {} {} at {elems} elements per packet (1..={max} fit a packet)",
                    variant.dtype_name(),
                    variant.op_name()
                ));
                continue;
            }
            let slots = spec.slots_at(elems);
            progress(&format!(
                "measuring {} {} at {elems} elements per packet, {slots} slots: {} rounds x {} paths x {} frames",
                variant.dtype_name(),
                variant.op_name(),
                spec.rounds,
                Path::ALL.len(),
                spec.stream
            ));
            let job = job_spec(variant, elems, slots);
            // At most about 256 MiB of frames (3 ranks and the unknown job's).
            let frame_bytes = xina_proto::frame::ip_len(variant.dtype(), usize::from(elems));
            let most = u32::try_from((64 << 20) / frame_bytes).unwrap_or(u32::MAX);
            let case = SwitchBenchSpec {
                stream: spec.stream.min(most.max(2 * slots)),
                slots: Some(slots),
                ..spec.clone()
            };
            let spec = &case;
            let frames = Frames::new(variant, elems, spec.stream, slots, spec.seed);
            let mut rounds = CaseRounds::default();
            for round in 0..spec.rounds {
                stream_round(&mut dp, spec, &job, &frames, round, &mut rounds)
                    .with_context(|| format!("round {round}"))?;
                repeat_round(&mut dp, spec, &job, &frames, &mut rounds)
                    .with_context(|| format!("round {round}, single-frame runs"))?;
            }
            for (path, per_round) in Path::ALL.into_iter().zip(&rounds.stream) {
                let (ns, drop_ns) = medians(per_round);
                let ns_all: Vec<f64> = per_round.iter().map(|p| p.0).collect();
                records.push(PathRecord {
                    kind: "testrun",
                    dtype: variant.dtype_name(),
                    op: variant.op_name(),
                    elements_per_packet: elems,
                    frame_bytes,
                    path: path.name(),
                    ns_per_packet: ns,
                    ns_per_element: (ns - drop_ns) / f64::from(elems),
                    elements_per_s: f64::from(elems) * 1e9 / (ns - drop_ns),
                    agg_pps: pps(ns),
                    drop_ns,
                    drop_pps: pps(drop_ns),
                    ratio: drop_ns / ns,
                    extra_ns: ns - drop_ns,
                    ns_min: ns_all.iter().copied().fold(f64::INFINITY, f64::min),
                    ns_max: ns_all.iter().copied().fold(0.0, f64::max),
                    rounds: spec.rounds,
                    frames_per_round: spec.stream,
                    round_ns: ns_all,
                    round_drop_ns: per_round.iter().map(|p| p.1).collect(),
                });
            }
            for (path, per_round) in [
                (Path::Duplicate, &rounds.duplicate),
                (Path::UnknownJob, &rounds.unknown),
            ] {
                let (ns, drop_ns) = medians(per_round);
                repeated.push(RepeatRecord {
                    kind: "testrun_repeat",
                    dtype: variant.dtype_name(),
                    op: variant.op_name(),
                    elements_per_packet: elems,
                    path: path.name(),
                    repeat: spec.repeat,
                    ns_per_packet: ns,
                    drop_ns,
                    ratio: drop_ns / ns,
                    rounds: spec.rounds,
                });
            }
            singles.extend(rounds.drop_single);
            repeats.extend(rounds.drop_repeated);
        }
    }
    let harness = median(&singles).zip(median(&repeats)).map(|(a, b)| a - b);
    Ok((records, repeated, harness))
}

/// The goal, judged on the `int32 sum` rows at [`GOAL_ELEMS`].
pub fn judge_goal(records: &[PathRecord]) -> Goal {
    let worst = records
        .iter()
        .filter(|r| {
            r.dtype == "int32"
                && r.op == "sum"
                && r.elements_per_packet == GOAL_ELEMS
                && Path::AGGREGATION.iter().any(|p| p.name() == r.path)
        })
        .min_by(|a, b| a.ratio.total_cmp(&b.ratio));
    Goal {
        statement: format!(
            "aggregation paths (first, combining, completing) of int32 sum at {GOAL_ELEMS} \
             elements per packet at >= {:.0}% of the XDP_DROP packet rate",
            GOAL_RATIO * 100.0
        ),
        elements_per_packet: GOAL_ELEMS,
        min_ratio: GOAL_RATIO,
        worst_ratio: worst.map(|r| r.ratio),
        worst_path: worst.map(|r| r.path),
        met: worst.map(|r| r.ratio >= GOAL_RATIO),
    }
}

/// Issue 12's per-element goals, judged at the largest int32 frame
/// measured: int32 sum combining at most [`GOAL_COMBINE_NS`] and completing
/// at most [`GOAL_COMPLETE_NS`] ns per element over a bare `XDP_DROP`, and
/// max and min combining within [`GOAL_MAX_MIN_FACTOR`] of sum.
pub fn judge_element_goals(records: &[PathRecord]) -> Vec<ElementGoal> {
    let largest = records
        .iter()
        .filter(|r| r.dtype == "int32")
        .map(|r| r.elements_per_packet)
        .max();
    let at = |op: &str, path: Path| {
        records.iter().find(|r| {
            Some(r.elements_per_packet) == largest
                && r.dtype == "int32"
                && r.op == op
                && r.path == path.name()
        })
    };
    let goal = |statement: String, value: Option<f64>, most: f64| ElementGoal {
        statement,
        elements_per_packet: largest,
        met: value.map(|v| v <= most),
        value,
        most,
    };
    let sum_combining = at("sum", Path::Combining).map(|r| r.ns_per_element);
    let mut goals = vec![
        goal(
            "int32 sum, combining: ns per element over XDP_DROP".to_owned(),
            sum_combining,
            GOAL_COMBINE_NS,
        ),
        goal(
            "int32 sum, completing: ns per element over XDP_DROP".to_owned(),
            at("sum", Path::Completing).map(|r| r.ns_per_element),
            GOAL_COMPLETE_NS,
        ),
    ];
    for op in ["max", "min"] {
        goals.push(goal(
            format!("int32 {op}, combining: ns per element / int32 sum's"),
            at(op, Path::Combining)
                .zip(sum_combining)
                .map(|(r, s)| r.ns_per_element / s),
            GOAL_MAX_MIN_FACTOR,
        ));
    }
    goals
}

/// One of [`judge_element_goals`]' goals.
#[derive(Clone, Debug, Serialize)]
pub struct ElementGoal {
    pub statement: String,
    /// The int32 case it was judged at (`None`: no int32 case ran).
    pub elements_per_packet: Option<u16>,
    /// The measured value, if that case ran; at most `most` meets the goal.
    pub value: Option<f64>,
    pub most: f64,
    pub met: Option<bool>,
}

/// The `TestRun` table.
pub fn testrun_table(records: &[PathRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>6} {:>5} {:<10} {:<12} {:>9} {:>7} {:>8} {:>9} {:>8} {:>9} {:>6} {:>8} {:>15}",
        "frame",
        "elems",
        "type",
        "path",
        "ns/pkt",
        "ns/elem",
        "elems/s",
        "agg_pps",
        "drop_ns",
        "drop_pps",
        "ratio",
        "extra_ns",
        "ns min..max"
    );
    for r in records {
        let _ = writeln!(
            out,
            "{:>6} {:>5} {:<10} {:<12} {:>9.1} {:>7.2} {:>8} {:>9} {:>8.1} {:>9} {:>6.2} {:>8.1} {:>15}",
            r.frame_bytes,
            r.elements_per_packet,
            format!("{} {}", r.dtype, r.op),
            r.path,
            r.ns_per_packet,
            r.ns_per_element,
            format_rate(r.elements_per_s),
            format_rate(r.agg_pps),
            r.drop_ns,
            format_rate(r.drop_pps),
            r.ratio,
            r.extra_ns,
            format!("{:.0}..{:.0}", r.ns_min, r.ns_max)
        );
    }
    out
}

/// The single-frame table.
pub fn repeat_table(records: &[RepeatRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:<10} {:<12} {:>9} {:>8} {:>6}",
        "elems", "type", "path", "ns/pkt", "drop_ns", "ratio"
    );
    for r in records {
        let _ = writeln!(
            out,
            "{:>5} {:<10} {:<12} {:>9.1} {:>8.1} {:>6.2}",
            r.elements_per_packet,
            format!("{} {}", r.dtype, r.op),
            r.path,
            r.ns_per_packet,
            r.drop_ns,
            r.ratio
        );
    }
    out
}

// ---------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------

/// The end-to-end runs.
#[derive(Clone, Debug, Serialize)]
pub struct EndToEndSpec {
    pub workers: usize,
    /// `int32` elements per worker.
    pub elements: usize,
    /// Elements per packet of each run.
    pub elems: Vec<u16>,
    pub slots: u32,
    pub give_up: Duration,
}

impl Default for EndToEndSpec {
    fn default() -> Self {
        Self {
            workers: 4,
            elements: 2_000_000,
            elems: vec![64, 256],
            slots: 64,
            give_up: Duration::from_secs(5),
        }
    }
}

/// The switch programs' own run time during a run, from the kernel's BPF
/// statistics.
#[derive(Clone, Debug, Serialize)]
pub struct InPlace {
    /// Runs of `xina_switch` (one per frame received on a port) and their
    /// mean time, tail-called aggregation included.
    pub switch_runs: u64,
    pub switch_ns_per_run: f64,
    /// Runs of `xina_egress` (one per broadcast copy) and their mean time.
    pub egress_runs: u64,
    pub egress_ns_per_run: f64,
    /// Both programs' run time over the run's wall time: cores they kept busy.
    pub busy_cores: f64,
    /// `busy_cores` over the machine's CPUs: the share of all CPU time the
    /// switch programs took (workers, stack and switch share the CPUs).
    pub cpu_share: f64,
}

/// One end-to-end run.
#[derive(Clone, Debug, Serialize)]
pub struct EndToEndRecord {
    /// `"end_to_end"`.
    pub kind: &'static str,
    pub elements_per_packet: u16,
    pub workers: usize,
    pub elements: usize,
    pub chunks: u64,
    pub elapsed_s: f64,
    /// Frames the switch's ports received, and per second of the run.
    pub switch_rx_packets: u64,
    pub switch_pps: f64,
    /// Each worker's datagrams sent per second of its own run.
    pub worker_send_pps: Vec<f64>,
    pub retransmissions: u64,
    /// Exact results, and every chunk summed in the switch.
    pub correct: bool,
    pub accounting_error: Option<String>,
    /// Mean `TestRun` time per contribution for this fan-in (int32 sum, this
    /// packet size), and the packets per second that makes on one core.
    pub testrun_ns_per_contribution: Option<f64>,
    pub testrun_capacity_pps: Option<f64>,
    pub in_place: Option<InPlace>,
    /// `"senders"` or `"switch"`.
    pub limited_by: &'static str,
    pub reading: String,
}

/// The `TestRun` cost per contribution of `workers` ranks at `elems`.
fn testrun_cost(records: &[PathRecord], elems: u16, workers: usize) -> Option<f64> {
    let get = |p: Path| {
        records
            .iter()
            .find(|r| {
                r.dtype == "int32"
                    && r.op == "sum"
                    && r.elements_per_packet == elems
                    && r.path == p.name()
            })
            .map(|r| r.ns_per_packet)
    };
    Some(ns_per_contribution(
        get(Path::First)?,
        get(Path::Combining)?,
        get(Path::Completing)?,
        workers,
    ))
}

/// Runs the allreduce scenario at each packet size of `spec`, with the
/// kernel's BPF run-time statistics on, and reads each against the `TestRun`
/// costs in `testrun`.
///
/// # Errors
/// When the scenario cannot be set up.
pub fn run_end_to_end(
    spec: &EndToEndSpec,
    testrun: &[PathRecord],
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<EndToEndRecord>> {
    let cpus = Machine::this().cpus.max(1);
    let mut out = Vec::new();
    for &elems in &spec.elems {
        progress(&format!(
            "end to end: {} workers x {} int32 at {elems} elements per packet",
            spec.workers, spec.elements
        ));
        let scenario = AllreduceSpec {
            workers: spec.workers,
            elements: spec.elements,
            elems_per_packet: elems,
            slots: spec.slots,
            give_up: spec.give_up,
            ..AllreduceSpec::default()
        };
        let stats = prog_stats::enable();
        if let Err(e) = &stats {
            progress(&format!(
                "BPF run-time statistics unavailable ({e}); no in-place figures"
            ));
        }
        let sampler = prog_stats::Sampler::start(prog_stats::prog_ids());
        let report = scenario::run_allreduce(&scenario);
        let samples = sampler.finish();
        drop(stats);
        let report = report?;
        let rx = report.counter(Counter::RxPackets);
        let elapsed = report.elapsed_s;
        let switch_pps = rx as f64 / elapsed;
        let by_name = |name: &str| {
            samples
                .values()
                .filter(|s| s.name == name)
                .max_by_key(|s| s.run_cnt)
                .cloned()
        };
        let in_place = match (by_name(programs::SWITCH), by_name(programs::EGRESS)) {
            (Some(sw), eg) if sw.run_cnt > 0 => {
                let eg = eg.unwrap_or_default();
                Some(InPlace {
                    switch_runs: sw.run_cnt,
                    switch_ns_per_run: sw.run_time_ns as f64 / sw.run_cnt as f64,
                    egress_runs: eg.run_cnt,
                    egress_ns_per_run: if eg.run_cnt > 0 {
                        eg.run_time_ns as f64 / eg.run_cnt as f64
                    } else {
                        0.0
                    },
                    busy_cores: (sw.run_time_ns + eg.run_time_ns) as f64 / (elapsed * 1e9),
                    cpu_share: (sw.run_time_ns + eg.run_time_ns) as f64
                        / (elapsed * 1e9 * cpus as f64),
                })
            }
            _ => None,
        };
        let cost = testrun_cost(testrun, elems, spec.workers);
        let capacity = cost.map(pps);
        let (limited_by, reading) = read_limit(switch_pps, capacity, in_place.as_ref());
        out.push(EndToEndRecord {
            kind: "end_to_end",
            elements_per_packet: elems,
            workers: spec.workers,
            elements: spec.elements,
            chunks: report.chunks,
            elapsed_s: elapsed,
            switch_rx_packets: rx,
            switch_pps,
            worker_send_pps: report
                .workers
                .iter()
                .map(|w| w.packets_sent as f64 / w.elapsed_s)
                .collect(),
            retransmissions: report.workers.iter().map(|w| w.retransmissions).sum(),
            correct: report.all_correct(),
            accounting_error: report.switch_accounting_error(),
            testrun_ns_per_contribution: cost,
            testrun_capacity_pps: capacity,
            in_place,
            limited_by,
            reading,
        });
    }
    Ok(out)
}

/// Which side limited a run: the switch if it ran near what its programs
/// can take on one core, or was busy most of a core; the senders otherwise.
fn read_limit(
    switch_pps: f64,
    capacity: Option<f64>,
    in_place: Option<&InPlace>,
) -> (&'static str, String) {
    let mut why = Vec::new();
    let mut switch_bound = false;
    if let Some(cap) = capacity {
        let share = switch_pps / cap;
        why.push(format!(
            "the switch took {} pps, {:.0}% of the {} pps its TestRun cost allows on one core",
            format_rate(switch_pps),
            share * 100.0,
            format_rate(cap)
        ));
        switch_bound |= share >= 0.5;
    }
    if let Some(p) = in_place {
        why.push(format!(
            "in place its programs ran {:.0} ns per received frame and {:.0} ns per result copy, \
             busy {:.0}% of one core ({:.0}% of the machine's CPU time)",
            p.switch_ns_per_run,
            p.egress_ns_per_run,
            p.busy_cores * 100.0,
            p.cpu_share * 100.0
        ));
        switch_bound |= p.busy_cores >= 0.5;
    }
    if why.is_empty() {
        return (
            "unknown",
            "no TestRun cost or in-place statistics to compare with".to_owned(),
        );
    }
    let verdict = if switch_bound {
        "switch"
    } else {
        why.push(
            "the rest of the time went to the workers' one-datagram-per-syscall sends and \
             receives, the UDP/IP stack and veth"
                .to_owned(),
        );
        "senders"
    };
    (verdict, why.join("; "))
}

/// The end-to-end table.
pub fn end_to_end_table(records: &[EndToEndRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:>7} {:>8} {:>10} {:>10} {:>14} {:>12} {:>10} {:>10} {:>6} {:>8} {:>7}",
        "elems",
        "workers",
        "time(s)",
        "switch_rx",
        "switch_pps",
        "send_pps/wkr",
        "capacity_pps",
        "ns/rx",
        "ns/copy",
        "busy",
        "limit",
        "correct"
    );
    for r in records {
        let send = median(&r.worker_send_pps).unwrap_or(f64::NAN);
        let (ns_rx, ns_copy, busy) =
            r.in_place
                .as_ref()
                .map_or(("-".to_owned(), "-".to_owned(), "-".to_owned()), |p| {
                    (
                        format!("{:.0}", p.switch_ns_per_run),
                        format!("{:.0}", p.egress_ns_per_run),
                        format!("{:.0}%", p.busy_cores * 100.0),
                    )
                });
        let _ = writeln!(
            out,
            "{:>5} {:>7} {:>8.3} {:>10} {:>10} {:>14} {:>12} {:>10} {:>10} {:>6} {:>8} {:>7}",
            r.elements_per_packet,
            r.workers,
            r.elapsed_s,
            r.switch_rx_packets,
            format_rate(r.switch_pps),
            format_rate(send),
            r.testrun_capacity_pps.map_or("-".to_owned(), format_rate),
            ns_rx,
            ns_copy,
            busy,
            r.limited_by,
            if r.correct && r.accounting_error.is_none() {
                "yes"
            } else {
                "NO"
            }
        );
    }
    out
}

/// The kernel's per-program run-time statistics (`BPF_ENABLE_STATS`, Linux
/// 5.8), read from this process's own program descriptors, so programs
/// other processes load are never counted.
mod prog_stats {
    use std::{
        collections::{BTreeMap, BTreeSet, btree_map::Entry},
        io,
        os::fd::{FromRawFd as _, OwnedFd, RawFd},
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        thread::JoinHandle,
        time::Duration,
    };

    /// `BPF_ENABLE_STATS` and `BPF_OBJ_GET_INFO_BY_FD` of `enum bpf_cmd`.
    const BPF_ENABLE_STATS: libc::c_long = 32;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    /// `BPF_STATS_RUN_TIME` of `enum bpf_stats_type`.
    const BPF_STATS_RUN_TIME: u32 = 0;
    /// How often the program descriptors are read.
    const PERIOD: Duration = Duration::from_millis(20);

    /// Turns run-time statistics on until the descriptor is closed.
    pub fn enable() -> io::Result<OwnedFd> {
        let attr = [BPF_STATS_RUN_TIME, 0u32];
        // SAFETY: `attr` is a valid `union bpf_attr` prefix for this command
        // (`enable_stats.type`, zero padding) of the size passed; the kernel
        // only reads it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_ptr(),
                size_of_val(&attr),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// One program's statistics.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Sample {
        pub name: String,
        pub run_time_ns: u64,
        pub run_cnt: u64,
    }

    /// `prog_id`, `run_time_ns` and `run_cnt` of a BPF program descriptor's
    /// `/proc/<pid>/fdinfo` text.
    pub fn parse_fdinfo(text: &str) -> Option<(u32, u64, u64)> {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .map(str::trim)
        };
        Some((
            field("prog_id")?.parse().ok()?,
            field("run_time_ns")?.parse().ok()?,
            field("run_cnt")?.parse().ok()?,
        ))
    }

    /// `struct bpf_prog_info` up to and including `name`.
    #[repr(C, align(8))]
    struct InfoHead {
        kind: u32,
        id: u32,
        _middle: [u8; 56],
        name: [u8; 16],
    }

    /// The `BPF_OBJ_GET_INFO_BY_FD` part of `union bpf_attr`.
    #[repr(C, align(8))]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }

    /// The name of program `id` behind descriptor `fd`, if it still is.
    fn name(fd: RawFd, id: u32) -> Option<String> {
        let mut info = InfoHead {
            kind: 0,
            id: 0,
            _middle: [0; 56],
            name: [0; 16],
        };
        let attr = InfoAttr {
            bpf_fd: u32::try_from(fd).ok()?,
            info_len: u32::try_from(size_of::<InfoHead>()).ok()?,
            info: (&raw mut info) as u64,
        };
        // SAFETY: `attr` is the command's attribute of the size passed, and
        // points to `info`, writable for `info_len` bytes, which the kernel
        // fills (all-zero input requests no arrays).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_OBJ_GET_INFO_BY_FD,
                &raw const attr,
                size_of::<InfoAttr>(),
            )
        };
        if rc != 0 || info.id != id {
            return None;
        }
        let end = info.name.iter().position(|b| *b == 0).unwrap_or(16);
        Some(String::from_utf8_lossy(&info.name[..end]).into_owned())
    }

    /// This process's BPF program descriptors: `(fd, id, run time, runs)`.
    fn scan() -> Vec<(RawFd, u32, u64, u64)> {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        dir.filter_map(|e| {
            let e = e.ok()?;
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            if link.as_os_str() != "anon_inode:bpf-prog" {
                return None;
            }
            let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
            let (id, time, runs) = parse_fdinfo(&text)?;
            Some((fd, id, time, runs))
        })
        .collect()
    }

    /// The ids of the programs this process holds now.
    pub fn prog_ids() -> BTreeSet<u32> {
        scan().into_iter().map(|(_, id, _, _)| id).collect()
    }

    /// Reads this process's program statistics every [`PERIOD`] on its own
    /// thread, keeping the last figures of every program it saw, until
    /// [`Sampler::finish`]. (The programs of a scenario's switch go away
    /// with it, so they must be read while it runs.)
    pub struct Sampler {
        stop: Arc<AtomicBool>,
        thread: JoinHandle<BTreeMap<u32, Sample>>,
    }

    impl Sampler {
        /// Starts sampling every program but those in `ignore`.
        pub fn start(ignore: BTreeSet<u32>) -> Self {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&stop);
            let thread = std::thread::spawn(move || {
                let mut seen: BTreeMap<u32, Sample> = BTreeMap::new();
                loop {
                    let last = flag.load(Ordering::Relaxed);
                    for (fd, id, time, runs) in scan() {
                        if ignore.contains(&id) {
                            continue;
                        }
                        let s = match seen.entry(id) {
                            Entry::Occupied(e) => e.into_mut(),
                            Entry::Vacant(e) => {
                                let Some(name) = name(fd, id) else { continue };
                                e.insert(Sample {
                                    name,
                                    ..Sample::default()
                                })
                            }
                        };
                        if runs >= s.run_cnt {
                            s.run_cnt = runs;
                            s.run_time_ns = time;
                        }
                    }
                    if last {
                        return seen;
                    }
                    std::thread::sleep(PERIOD);
                }
            });
            Self { stop, thread }
        }

        /// Stops sampling; the last figures of every program seen.
        pub fn finish(self) -> BTreeMap<u32, Sample> {
            self.stop.store(true, Ordering::Relaxed);
            self.thread.join().unwrap_or_default()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn fdinfo_of_a_program() {
            let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2071\n\
                        prog_type:\t6\nprog_jited:\t1\nprog_tag:\t3b185187f1855c4c\n\
                        memlock:\t4096\nprog_id:\t1234\nrun_time_ns:\t98765\n\
                        run_cnt:\t321\nrecursion_misses:\t0\nverified_insns:\t2\n";
            assert_eq!(parse_fdinfo(text), Some((1234, 98_765, 321)));
        }

        #[test]
        fn fdinfo_of_something_else() {
            assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\nmap_type:\t2\n"), None);
            // `run_cnt` must not be taken for `run_cnt_extra` or the like.
            assert_eq!(
                parse_fdinfo("prog_id:\t1\nrun_time_ns:\t5\nrun_cnt_x:\t7\n"),
                None
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[4.0]), Some(4.0));
        assert_eq!(median(&[9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        // One outlier round does not move it.
        assert_eq!(median(&[10.0, 11.0, 10.5, 900.0, 10.2]), Some(10.5));
    }

    #[test]
    fn rates() {
        assert!((pps(100.0) - 1e7).abs() < 1e-6);
        assert!(pps(0.0).is_infinite());
        assert_eq!(format_rate(12_345_678.0), "12.35M");
        assert_eq!(format_rate(850_400.0), "850k");
        assert_eq!(format_rate(12.0), "12");
    }

    #[test]
    fn cost_per_contribution_weights_paths_by_fan_in() {
        assert!((ns_per_contribution(10.0, 20.0, 40.0, 4) - 22.5).abs() < 1e-9);
        assert!((ns_per_contribution(10.0, 20.0, 40.0, 2) - 25.0).abs() < 1e-9);
        assert!((ns_per_contribution(10.0, 20.0, 40.0, 1) - 40.0).abs() < 1e-9);
    }

    #[test]
    fn every_stream_path_has_its_frames_and_outcome() {
        // The batch drives every path but the unknown job's, which gets its
        // own stream.
        for p in Path::ALL {
            assert_eq!(
                Path::BATCH_ORDER.contains(&p),
                p != Path::UnknownJob,
                "{}",
                p.name()
            );
            assert!(p.counter().is_ingress_outcome(), "{}", p.name());
        }
        assert!(Path::AGGREGATION.iter().all(|p| p.rank() < FAN_IN));
    }

    fn record(path: Path, ratio: f64) -> PathRecord {
        PathRecord {
            kind: "testrun",
            dtype: "int32",
            op: "sum",
            elements_per_packet: GOAL_ELEMS,
            frame_bytes: 316,
            path: path.name(),
            ns_per_packet: 100.0,
            ns_per_element: 0.0,
            elements_per_s: 0.0,
            agg_pps: 1e7,
            drop_ns: 100.0 * ratio,
            drop_pps: 1e7 / ratio,
            ratio,
            extra_ns: 0.0,
            ns_min: 0.0,
            ns_max: 0.0,
            rounds: 1,
            frames_per_round: 1,
            round_ns: Vec::new(),
            round_drop_ns: Vec::new(),
        }
    }

    #[test]
    fn element_goals_are_judged_at_the_largest_int32_frame() {
        let row = |op: &'static str, path: Path, elems: u16, ns: f64| PathRecord {
            op,
            elements_per_packet: elems,
            ns_per_element: ns,
            ..record(path, 1.0)
        };
        let rows = [
            // A smaller frame, slower: not what is judged.
            row("sum", Path::Combining, 256, 9.0),
            row("sum", Path::Combining, 16_128, 0.8),
            row("sum", Path::Completing, 16_128, 2.5),
            row("max", Path::Combining, 16_128, 1.0),
        ];
        let g = judge_element_goals(&rows);
        let got: Vec<_> = g.iter().map(|g| (g.met, g.elements_per_packet)).collect();
        assert_eq!(
            got,
            [
                (Some(true), Some(16_128)),
                (Some(false), Some(16_128)),
                (Some(true), Some(16_128)),
                (None, Some(16_128)),
            ]
        );
        assert!((g[2].value.unwrap() - 1.25).abs() < 1e-9);
        assert!(judge_element_goals(&[]).iter().all(|g| g.met.is_none()));
    }

    #[test]
    fn goal_is_judged_on_the_worst_aggregation_path() {
        let rows = [
            record(Path::First, 0.8),
            record(Path::Completing, 0.45),
            // Not an aggregation path: ignored.
            record(Path::UnknownJob, 0.1),
        ];
        let g = judge_goal(&rows);
        assert_eq!((g.met, g.worst_path), (Some(false), Some("completing")));
        let g = judge_goal(&rows[..1]);
        assert_eq!(g.met, Some(true));
        assert_eq!(judge_goal(&[]).met, None);
    }

    #[test]
    fn limit_reading() {
        let (who, _) = read_limit(100_000.0, Some(5e6), None);
        assert_eq!(who, "senders");
        let (who, _) = read_limit(4e6, Some(5e6), None);
        assert_eq!(who, "switch");
        let busy = InPlace {
            switch_runs: 1,
            switch_ns_per_run: 1.0,
            egress_runs: 0,
            egress_ns_per_run: 0.0,
            busy_cores: 0.9,
            cpu_share: 0.45,
        };
        let (who, _) = read_limit(100_000.0, Some(5e6), Some(&busy));
        assert_eq!(who, "switch");
        assert_eq!(read_limit(1.0, None, None).0, "unknown");
    }
}

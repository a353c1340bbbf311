//! Scenarios on a [`Star`]: the switch runs the XDP dataplane in its
//! namespace, workers run `xina-host` in theirs.
//!
//! ```text
//!   worker 0 ─┐
//!   worker 1 ─┤   ┌──────────────────────────────┐
//!      ...    ├───┤ switch: xina_switch on every │
//!   worker N ─┘   │ port, one job of N ranks     │
//!                 └──────────────────────────────┘
//! ```

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io,
    net::SocketAddrV4,
    sync::{
        Barrier,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde::Serialize;
use xina::{Counters, Dataplane, config::Config};
use xina_host::{JobParams, Mode, Scalar, Stats, Worker};
use xina_proto::{DType, Op, XINA_UDP_PORT, counters::Counter, maps::names};

use crate::{
    netns,
    topology::{Star, StarOptions},
};

/// The UDP port every worker binds (each in its own namespace).
pub const WORKER_PORT: u16 = 5000;
/// The job id the scenarios install.
pub const JOB_ID: u32 = 1;

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceSpec {
    pub workers: usize,
    /// Elements per worker.
    pub elements: usize,
    pub elems_per_packet: u16,
    /// Aggregator slots of the job: the workers' window.
    pub slots: u32,
    /// Seed of the workers' random data.
    pub seed: u64,
    /// How long a worker waits without progress before it gives up.
    pub give_up: Duration,
    /// Ranks that are members of the job but never send (dead peers).
    pub absent: Vec<usize>,
    /// The element type of the workers' buffers.
    pub dtype: ElementType,
    /// A rank run as a separate process and killed mid-call.
    pub kill: Option<Kill>,
}

/// The element type a scenario reduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ElementType {
    /// Random int32 in ±2^20: exact sums.
    #[default]
    Int32,
    /// Random float32 in ±1, summed as fixed point: within
    /// [`xina_host::float::sum_error_bound`].
    Float32,
}

/// A worker run as its own process (`xina-testbed worker`) and killed with
/// `SIGKILL` once the switch has completed `after_chunks` chunks of the job:
/// a host that dies in the middle of a call.
#[derive(Clone, Debug, Serialize)]
pub struct Kill {
    pub rank: usize,
    pub after_chunks: u64,
    /// The `xina-testbed` executable.
    pub exe: std::path::PathBuf,
}

impl Default for AllreduceSpec {
    fn default() -> Self {
        Self {
            workers: 4,
            elements: 4_000_000,
            elems_per_packet: 256,
            slots: 64,
            seed: 1,
            give_up: Duration::from_secs(5),
            absent: Vec::new(),
            dtype: ElementType::Int32,
            kill: None,
        }
    }
}

impl AllreduceSpec {
    /// Number of chunks each worker sends: the call check and the data; for
    /// floats also the scale agreement (a check and a 256-bin histogram).
    pub fn chunks(&self) -> u64 {
        let e = usize::from(self.elems_per_packet);
        let call = |len: usize| (8usize.div_ceil(e) + len.div_ceil(e)) as u64;
        match self.dtype {
            ElementType::Int32 => call(self.elements),
            ElementType::Float32 => call(256) + call(self.elements),
        }
    }

    /// The parameters of rank `rank` for an allreduce job on `switch`.
    pub fn params(&self, rank: usize, switch: SocketAddrV4) -> JobParams {
        JobParams {
            job: JOB_ID,
            rank: u8::try_from(rank).expect("at most 64 ranks"),
            fan_in: u8::try_from(self.workers).expect("at most 64 ranks"),
            elems_per_packet: self.elems_per_packet,
            slots: self.slots,
            op: Op::Sum,
            dtype: DType::I32,
            mode: Mode::Allreduce,
            switch,
        }
    }

    /// The workers' config.
    pub fn config(&self) -> xina_host::Config {
        xina_host::Config {
            give_up: self.give_up,
            ..Default::default()
        }
    }
}

/// A scenario's element type: its workers' data and the check of a result.
pub trait Sample: Scalar + Send + Sync {
    /// What a correct result is compared against.
    type Expected: Sync;
    /// Worker `rank`'s data.
    fn data(seed: u64, rank: usize, elements: usize) -> Vec<Self>;
    /// The combination of every worker's data.
    fn expected(data: &[Vec<Self>]) -> Self::Expected;
    /// The first element of `got` that is not a correct result.
    fn first_mismatch(got: &[Self], want: &Self::Expected) -> Option<usize>;
}

impl Sample for i32 {
    type Expected = Vec<i32>;

    fn data(seed: u64, rank: usize, elements: usize) -> Vec<Self> {
        worker_data(seed, rank, elements)
    }

    fn expected(data: &[Vec<Self>]) -> Vec<i32> {
        let mut sum = vec![0i32; data.first().map_or(0, Vec::len)];
        for d in data {
            for (e, v) in sum.iter_mut().zip(d) {
                *e += *v;
            }
        }
        sum
    }

    fn first_mismatch(got: &[Self], want: &Vec<i32>) -> Option<usize> {
        got.iter().zip(want).position(|(a, b)| a != b)
    }
}

/// The exact sums of float inputs and the documented error bound.
pub struct FloatSums {
    exact: Vec<f64>,
    bound: f64,
}

impl Sample for f32 {
    type Expected = FloatSums;

    fn data(seed: u64, rank: usize, elements: usize) -> Vec<Self> {
        worker_floats(seed, rank, elements)
    }

    fn expected(data: &[Vec<Self>]) -> FloatSums {
        let mut exact = vec![0f64; data.first().map_or(0, Vec::len)];
        let mut max_abs = 0f32;
        for d in data {
            for (e, v) in exact.iter_mut().zip(d) {
                *e += f64::from(*v);
                max_abs = max_abs.max(v.abs());
            }
        }
        let n = u8::try_from(data.len()).expect("at most 64 ranks");
        FloatSums {
            exact,
            bound: xina_host::float::sum_error_bound(max_abs, n),
        }
    }

    fn first_mismatch(got: &[Self], want: &FloatSums) -> Option<usize> {
        got.iter().zip(&want.exact).position(|(a, b)| {
            (f64::from(*a) - b).abs() > want.bound + b.abs() * f64::from(f32::EPSILON) / 2.0
        })
    }
}

/// How a scenario is placed on the machine and observed, as opposed to what
/// it computes ([`AllreduceSpec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RunOptions {
    /// TX and RX queues of every veth of the star that [`run_allreduce_with`]
    /// builds ([`StarOptions::queues`]).
    pub queues: u32,
    /// Pins worker `rank`'s thread to CPU `cpus[rank % cpus.len()]`, `cpus`
    /// being the CPUs this process may run on in increasing order: on a
    /// 2-CPU machine even ranks run on CPU 0 and odd ranks on CPU 1.
    pub pin_cpus: bool,
    /// Reads the dataplane's per-CPU counters with `bpftool` before, during
    /// and after the run ([`AllreduceReport::per_cpu`]).
    pub per_cpu: bool,
    /// Puts a lossy link on every worker's interface, disturbing xina
    /// traffic in both directions ([`AllreduceReport::lossy`]).
    pub loss: Option<Loss>,
    /// The MTU of every veth of the star ([`StarOptions::mtu`]): what the
    /// job's `elems_per_packet` must fit.
    pub mtu: u32,
}

/// Faults injected on every worker's link, in parts per million of xina
/// frames, in both directions (to the switch and from it); delays (which
/// reorder) only towards the switch, see [`crate::lossy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Loss {
    pub drop_ppm: u32,
    pub duplicate_ppm: u32,
    pub delay_ppm: u32,
}

/// Rate of the lossy links' slow class: a delayed 1 KB frame waits 0.4 ms
/// or more.
const LOSSY_SLOW_RATE: &str = "20mbit";

/// What one worker's lossy link did.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LossyReport {
    pub rank: usize,
    /// Frames from the worker to the switch.
    pub to_switch: crate::lossy::Counts,
    /// Frames from the switch to the worker.
    pub from_switch: crate::lossy::Counts,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            queues: 1,
            pin_cpus: false,
            per_cpu: false,
            loss: None,
            mtu: 1500,
        }
    }
}

/// One worker's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    pub rank: usize,
    /// The CPU the worker's thread was pinned to ([`RunOptions::pin_cpus`]).
    pub cpu: Option<usize>,
    /// Whether the result equals the locally computed element-wise sum.
    pub correct: bool,
    /// The first element that differs, if any.
    pub first_mismatch: Option<usize>,
    /// The error, if the allreduce failed.
    pub error: Option<String>,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub from_cache: u64,
    pub elapsed_s: f64,
}

/// One switch port's share of a run.
#[derive(Clone, Debug, Serialize)]
pub struct PortReport {
    /// Interface name in the switch namespace.
    pub name: String,
    pub ifindex: u32,
    /// The rank of the worker behind it.
    pub rank: usize,
    /// Changes of the port's counters: ingress frames that arrived on it,
    /// and result copies that left through it (`results_sent`).
    pub counters: BTreeMap<&'static str, u64>,
    /// Frames the port's XDP program ran on, per RX queue (`ethtool -S`:
    /// `rx_queue_N_xdp_packets`), changes during the run.
    pub rx_queue_xdp_packets: Vec<u64>,
}

impl PortReport {
    /// A counter's change during the run.
    pub fn counter(&self, c: Counter) -> u64 {
        self.counters.get(c.name()).copied().unwrap_or(0)
    }
}

/// Where the switch did its work during a run: the dataplane's per-CPU
/// counter blocks, read with `bpftool` ([`RunOptions::per_cpu`]).
#[derive(Clone, Debug, Serialize)]
pub struct PerCpuReport {
    /// Changes of the job's counters, by CPU number.
    pub job: Vec<BTreeMap<&'static str, u64>>,
    /// For each port (in the order of [`AllreduceReport::ports`]), the
    /// frames its ingress program handled, by CPU number.
    pub port_rx: Vec<Vec<u64>>,
    /// Readings of the job's per-CPU counters taken while the workers ran.
    pub samples: u64,
    /// Intervals between consecutive readings in which the job's
    /// contributions grew on more than one CPU.
    pub overlapping_intervals: u64,
    /// Mean time between consecutive readings.
    pub mean_interval_ms: f64,
}

impl PerCpuReport {
    /// The change of the job's counter `c` on `cpu`.
    pub fn job_counter(&self, cpu: usize, c: Counter) -> u64 {
        self.job
            .get(cpu)
            .and_then(|m| m.get(c.name()))
            .copied()
            .unwrap_or(0)
    }

    /// The CPUs on which the job's counter `c` moved.
    pub fn cpus_with(&self, c: Counter) -> Vec<usize> {
        (0..self.job.len())
            .filter(|&cpu| self.job_counter(cpu, c) > 0)
            .collect()
    }
}

/// The outcome of [`run_allreduce`].
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceReport {
    pub spec: AllreduceSpec,
    pub options: RunOptions,
    pub chunks: u64,
    pub workers: Vec<WorkerReport>,
    /// Counter changes in the switch during the run.
    pub switch_counters: BTreeMap<&'static str, u64>,
    /// Changes of the job's own counters during the run.
    pub job_counters: BTreeMap<&'static str, u64>,
    /// Every switch port, port `i` facing rank `i`.
    pub ports: Vec<PortReport>,
    /// Per-CPU counters, when [`RunOptions::per_cpu`] asked for them.
    pub per_cpu: Option<PerCpuReport>,
    /// What each worker's lossy link did, when [`RunOptions::loss`] asked
    /// for them.
    pub lossy: Vec<LossyReport>,
    /// Wall time from the common start to the last worker's finish.
    pub elapsed_s: f64,
    /// The switch configuration that was installed.
    pub config: String,
}

impl AllreduceReport {
    /// Every worker that ran got exactly the element-wise sum.
    pub fn all_correct(&self) -> bool {
        self.workers.iter().all(|w| w.correct)
    }

    /// A switch counter's change during the run.
    pub fn counter(&self, c: Counter) -> u64 {
        self.switch_counters.get(c.name()).copied().unwrap_or(0)
    }

    /// A counter of the job's change during the run.
    pub fn job_counter(&self, c: Counter) -> u64 {
        self.job_counters.get(c.name()).copied().unwrap_or(0)
    }

    /// Why the run does not prove in-switch aggregation, if it does not:
    /// every contribution must have reached the switch exactly once
    /// (`contributions = workers × chunks`), every chunk completed there
    /// once, one copy per worker left it (plus one per retransmission
    /// answered from a slot), and every frame the switch saw is accounted for
    /// by exactly one outcome counter.
    pub fn switch_accounting_error(&self) -> Option<String> {
        let w = self.spec.workers as u64;
        let expect = [
            (Counter::Contributions, w * self.chunks),
            (Counter::Completed, self.chunks),
            (
                Counter::ResultsSent,
                w * self.chunks + self.counter(Counter::ReplyFromCache),
            ),
        ];
        let mut wrong: Vec<String> = expect
            .iter()
            .filter(|(c, want)| self.counter(*c) != *want)
            .map(|(c, want)| format!("{} = {} (expected {want})", c.name(), self.counter(*c)))
            .collect();
        // Every frame the ingress program saw ended in exactly one outcome.
        let outcomes: u64 = Counter::ALL
            .iter()
            .filter(|c| c.is_ingress_outcome())
            .map(|c| self.counter(*c))
            .sum();
        if outcomes != self.counter(Counter::RxPackets) {
            wrong.push(format!(
                "ingress outcomes add up to {outcomes}, rx_packets = {}",
                self.counter(Counter::RxPackets)
            ));
        }
        (!wrong.is_empty()).then(|| wrong.join(", "))
    }

    /// Why the job's counters differ from the switch-wide ones, if they do,
    /// or its ingress outcomes do not add up to its `rx_packets`.
    ///
    /// In a run with one job the only other frames are the workers' kernels'
    /// answers (ICMP port unreachable) to result copies that arrived after
    /// their worker had finished and closed its socket: a retransmission's
    /// reply from the slot overtaken by the original result. The switch hands
    /// those to its kernel (`passed`, no job). So each port may have passed at
    /// most as many frames as it sent results its worker did not take, and
    /// apart from `passed` and `rx_packets` (which counts them) the job's
    /// counters must equal the switch-wide ones.
    pub fn job_accounting_error(&self) -> Option<String> {
        let passed = self.counter(Counter::Passed);
        let mut wrong: Vec<String> = Counter::ALL
            .iter()
            .filter(|c| {
                let job = self.job_counter(**c);
                match c {
                    Counter::Passed => job != 0,
                    Counter::RxPackets => job + passed != self.counter(**c),
                    _ => job != self.counter(**c),
                }
            })
            .map(|c| {
                format!(
                    "job {JOB_ID} {} = {}, switch-wide {}",
                    c.name(),
                    self.job_counter(*c),
                    self.counter(*c)
                )
            })
            .collect();
        for port in &self.ports {
            let untaken = self
                .workers
                .iter()
                .find(|w| w.rank == port.rank)
                .map_or(0, |w| {
                    port.counter(Counter::ResultsSent)
                        .saturating_sub(w.packets_received)
                });
            if port.counter(Counter::Passed) > untaken {
                wrong.push(format!(
                    "port {} (rank {}) passed {} non-xina frames to the kernel, but sent only \
                     {untaken} results its worker did not take",
                    port.name,
                    port.rank,
                    port.counter(Counter::Passed)
                ));
            }
        }
        let outcomes: u64 = Counter::ALL
            .iter()
            .filter(|c| c.is_ingress_outcome())
            .map(|c| self.job_counter(*c))
            .sum();
        if outcomes != self.job_counter(Counter::RxPackets) {
            wrong.push(format!(
                "job {JOB_ID}'s ingress outcomes add up to {outcomes}, its rx_packets = {}",
                self.job_counter(Counter::RxPackets)
            ));
        }
        (!wrong.is_empty()).then(|| wrong.join(", "))
    }

    /// Why the per-port counters do not show one contribution per chunk
    /// arriving from each rank on its own port and one result per chunk
    /// (plus one per retransmission answered from a slot, which goes back
    /// out of the port it came in by) leaving through every port, if they do
    /// not. Only meaningful when every rank took part.
    pub fn port_accounting_error(&self) -> Option<String> {
        let wrong: Vec<String> = self
            .ports
            .iter()
            .flat_map(|p| {
                let replies = p.counter(Counter::ReplyFromCache);
                [
                    (Counter::Contributions, self.chunks),
                    (Counter::ResultsSent, self.chunks + replies),
                ]
                .into_iter()
                .filter(|(c, want)| p.counter(*c) != *want)
                .map(move |(c, want)| {
                    format!(
                        "port {} (rank {}): {} = {} (expected {want})",
                        p.name,
                        p.rank,
                        c.name(),
                        p.counter(c),
                    )
                })
            })
            .collect();
        (!wrong.is_empty()).then(|| wrong.join(", "))
    }

    /// A human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let s = &self.spec;
        let bytes = (s.elements * 4) as f64;
        let _ = writeln!(
            out,
            "{:>7} {:>10} {:>8} {:>10} {:>10} {:>8} {:>7}",
            "workers", "elements", "chunks", "time(s)", "algbw(MB/s)", "retx", "correct"
        );
        let retx: u64 = self.workers.iter().map(|w| w.retransmissions).sum();
        let _ = writeln!(
            out,
            "{:>7} {:>10} {:>8} {:>10.3} {:>10.1} {:>8} {:>7}",
            s.workers,
            s.elements,
            self.chunks,
            self.elapsed_s,
            bytes / self.elapsed_s / 1e6,
            retx,
            if self.all_correct() { "yes" } else { "NO" }
        );
        let _ = writeln!(out, "\nper worker:");
        let _ = writeln!(
            out,
            "{:>5} {:>4} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8}  result",
            "rank", "cpu", "sent", "received", "retx", "timeouts", "from_cache", "time(s)"
        );
        for w in &self.workers {
            let result = match (&w.error, w.first_mismatch) {
                (Some(e), _) => format!("error: {e}"),
                (None, Some(i)) => format!("WRONG from element {i}"),
                (None, None) => match self.spec.dtype {
                    ElementType::Int32 => "exact",
                    ElementType::Float32 => "within bound",
                }
                .to_owned(),
            };
            let cpu = w.cpu.map_or_else(|| "-".to_owned(), |c| c.to_string());
            let _ = writeln!(
                out,
                "{:>5} {cpu:>4} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8.3}  {result}",
                w.rank,
                w.packets_sent,
                w.packets_received,
                w.retransmissions,
                w.timeouts,
                w.from_cache,
                w.elapsed_s
            );
        }
        let _ = writeln!(
            out,
            "\nswitch counters (this run), all jobs | job {JOB_ID}:"
        );
        for c in Counter::ALL {
            let (all, job) = (self.counter(c), self.job_counter(c));
            if all != 0 || job != 0 {
                let _ = writeln!(out, "  {:<22}{all:>12} |{job:>10}", c.name());
            }
        }
        if self.job_counter(Counter::RxPackets) == 0 && self.counter(Counter::RxPackets) > 0 {
            let _ = writeln!(
                out,
                "  (rx_packets is counted before the job is known, so never for the job)"
            );
        }
        match self.switch_accounting_error() {
            None => {
                let _ = writeln!(
                    out,
                    "  => summed in the switch: {} contributions = {} workers x {} chunks",
                    self.counter(Counter::Contributions),
                    s.workers,
                    self.chunks
                );
            }
            Some(e) => {
                let _ = writeln!(out, "  => switch accounting does not add up: {e}");
            }
        }
        self.port_table(&mut out);
        if let Some(per_cpu) = &self.per_cpu {
            per_cpu_table(&mut out, per_cpu, &self.ports);
        }
        out
    }

    fn port_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nper port (ingress on the port; results = copies leaving it):"
        );
        let _ = writeln!(
            out,
            "{:>5} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8}  xdp frames per rx queue",
            "rank", "ifindex", "rx", "contrib", "dup", "stale", "cache", "results"
        );
        for p in &self.ports {
            let queues: Vec<String> = p
                .rx_queue_xdp_packets
                .iter()
                .map(ToString::to_string)
                .collect();
            let _ = writeln!(
                out,
                "{:>5} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8}  [{}]",
                p.rank,
                p.ifindex,
                p.counter(Counter::RxPackets),
                p.counter(Counter::Contributions),
                p.counter(Counter::DropDuplicate),
                p.counter(Counter::DropStale),
                p.counter(Counter::ReplyFromCache),
                p.counter(Counter::ResultsSent),
                queues.join(" ")
            );
        }
    }
}

fn per_cpu_table(out: &mut String, per_cpu: &PerCpuReport, ports: &[PortReport]) {
    let cpus = per_cpu.job.len();
    let _ = write!(out, "\nper CPU:{:>16}", "");
    for cpu in 0..cpus {
        let _ = write!(out, " {:>9}", format!("cpu{cpu}"));
    }
    let _ = writeln!(out);
    for c in [
        Counter::Contributions,
        Counter::Completed,
        Counter::ResultsSent,
    ] {
        let _ = write!(out, "  job {:<19}", c.name());
        for cpu in 0..cpus {
            let _ = write!(out, " {:>9}", per_cpu.job_counter(cpu, c));
        }
        let _ = writeln!(out);
    }
    for (p, rx) in ports.iter().zip(&per_cpu.port_rx) {
        let _ = write!(out, "  rx of port/rank {:<7}", p.rank);
        for v in rx {
            let _ = write!(out, " {v:>9}");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "  contributions grew on more than one CPU in {} of {} intervals of ~{:.1} ms",
        per_cpu.overlapping_intervals,
        per_cpu.samples.saturating_sub(1),
        per_cpu.mean_interval_ms
    );
}

/// The switch configuration for one job spanning every worker of `star`.
pub fn star_config(star: &Star, spec: &AllreduceSpec) -> String {
    let mut toml = String::new();
    let ports: Vec<String> = star
        .ports()
        .iter()
        .map(|p| format!("{:?}", p.name))
        .collect();
    let pool = spec.slots.max(xina_proto::maps::DEFAULT_SLOT_POOL);
    // Room for a wide job's partials on every possible CPU (a machine whose
    // CPUs cannot be read gets the default, and the job's refusal names it).
    let units = xina::dataplane::wide_units_here(spec.elems_per_packet, spec.slots)
        .unwrap_or(0)
        .max(u64::from(xina_proto::maps::DEFAULT_UNITS));
    let _ = writeln!(
        toml,
        "[switch]\nports = [{}]\nslot_pool = {pool}\nunits = {units}\n",
        ports.join(", ")
    );
    let _ = writeln!(
        toml,
        "[[jobs]]\nid = {JOB_ID}\nelems_per_packet = {}\nslot_base = 0\nslot_count = {}\n",
        spec.elems_per_packet, spec.slots
    );
    for w in star.workers() {
        member_entry(&mut toml, star, w, WORKER_PORT);
    }
    toml
}

/// Appends worker `w` of `star` as a `[[jobs.members]]` entry of the last
/// job in `toml`, at UDP port `port`.
pub fn member_entry(toml: &mut String, star: &Star, w: &crate::topology::Worker, port: u16) {
    let _ = writeln!(
        toml,
        "[[jobs.members]]\nrank = {}\nip = \"{}\"\nport = {port}\nmac = \"{}\"\ninterface = \"{}\"\n",
        w.rank,
        w.ip,
        w.mac,
        star.port(w.port).name
    );
}

/// Worker `rank`'s data: uniform in ±2^20, so sums over up to 1,024 workers
/// stay far from `i32` overflow.
pub fn worker_data(seed: u64, rank: usize, elements: usize) -> Vec<i32> {
    let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..elements)
        .map(|_| rng.random_range(-(1 << 20)..(1 << 20)))
        .collect()
}

/// Worker `rank`'s float data: uniform in ±1.
pub fn worker_floats(seed: u64, rank: usize, elements: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..elements).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Brings a switch up on `star` with one job of all its workers.
///
/// # Errors
/// When the configuration is refused or the dataplane cannot be attached.
pub fn start_switch(star: &Star, config_text: &str) -> anyhow::Result<Dataplane> {
    let config = Config::parse(config_text).context("the generated switch configuration")?;
    let dp = star
        .switch()
        .run(|| xina::switch::start(&config))
        .context("entering the switch namespace")?
        .context("starting the switch")?;
    star.refresh_redirect_targets()
        .context("re-enabling redirects into the workers")?;
    Ok(dp)
}

/// Runs an allreduce of `spec.elements` random `i32` per worker on a fresh
/// star topology and checks every worker's result against the sum computed
/// here. The topology is removed before returning, also on error.
///
/// # Errors
/// When the topology or the switch cannot be set up, or a worker thread
/// cannot be started. A worker whose allreduce fails is reported, not an error.
pub fn run_allreduce(spec: &AllreduceSpec) -> anyhow::Result<AllreduceReport> {
    run_allreduce_with(spec, RunOptions::default())
}

/// [`run_allreduce`] placed and observed as `options` say.
///
/// # Errors
/// As [`run_allreduce`]; also when a per-CPU reading fails.
pub fn run_allreduce_with(
    spec: &AllreduceSpec,
    options: RunOptions,
) -> anyhow::Result<AllreduceReport> {
    check_workers(spec)?;
    let star = Star::build_with(StarOptions {
        workers: spec.workers,
        queues: options.queues,
        mtu: options.mtu,
    })
    .context("building the star topology")?;
    let result = run_allreduce_on(&star, spec, options);
    star.teardown().context("tearing the topology down")?;
    result
}

/// [`run_allreduce_with`] on an existing star of `spec.workers` workers,
/// which is left as it was found: the switch is attached for this run only.
/// [`RunOptions::queues`] is the star's business and not looked at.
///
/// # Errors
/// As [`run_allreduce_with`]; also when the star has another worker count.
pub fn run_allreduce_on(
    star: &Star,
    spec: &AllreduceSpec,
    options: RunOptions,
) -> anyhow::Result<AllreduceReport> {
    check_workers(spec)?;
    if star.workers().len() != spec.workers {
        bail!(
            "the star has {} workers, the spec {}",
            star.workers().len(),
            spec.workers
        );
    }
    let config = star_config(star, spec);
    let dp = start_switch(star, &config)?;
    let options = RunOptions {
        queues: star.queues(),
        ..options
    };
    let links = match options.loss {
        Some(loss) => attach_lossy_links(star, loss)?,
        None => Vec::new(),
    };
    // The switch is detached (by dropping it) on every path out.
    let mut report = run_workers(star, &dp, spec, options, config)?;
    for (rank, link) in links.iter().enumerate() {
        report.lossy.push(LossyReport {
            rank,
            to_switch: link.counts(xina_proto::lossy::direction::EGRESS)?,
            from_switch: link.counts(xina_proto::lossy::direction::INGRESS)?,
        });
    }
    Ok(report)
}

/// A lossy link on every worker's interface, as `loss` says.
pub(crate) fn attach_lossy_links(
    star: &Star,
    loss: Loss,
) -> anyhow::Result<Vec<crate::lossy::LossyLink>> {
    let to_switch = crate::lossy::rates(loss.drop_ppm, loss.duplicate_ppm, loss.delay_ppm, true);
    let from_switch = crate::lossy::rates(loss.drop_ppm, loss.duplicate_ppm, 0, true);
    star.workers()
        .iter()
        .map(|w| {
            crate::lossy::LossyLink::attach(
                w.ns(),
                &w.iface,
                to_switch,
                from_switch,
                LOSSY_SLOW_RATE,
            )
            .with_context(|| format!("lossy link on worker {}", w.rank))
        })
        .collect()
}

fn check_workers(spec: &AllreduceSpec) -> anyhow::Result<()> {
    if spec.workers == 0 || spec.workers > xina_proto::MAX_RANKS {
        bail!(
            "workers: {} (must be 1..={})",
            spec.workers,
            xina_proto::MAX_RANKS
        );
    }
    Ok(())
}

/// Counter readings taken before the workers start.
struct Before {
    switch: Counters,
    job: Counters,
    ports: Vec<Counters>,
    queues: Vec<Vec<u64>>,
    per_cpu: Option<(CounterMaps, PerCpuBlocks, Vec<PerCpuBlocks>)>,
}

impl Before {
    fn read(star: &Star, dp: &Dataplane, options: RunOptions) -> anyhow::Result<Self> {
        let per_cpu = if options.per_cpu {
            let maps = CounterMaps::find(star, dp)?;
            let job = maps.job_blocks()?;
            let ports = star
                .ports()
                .iter()
                .map(|p| maps.port_blocks(p.ifindex))
                .collect::<anyhow::Result<_>>()?;
            Some((maps, job, ports))
        } else {
            None
        };
        Ok(Self {
            switch: dp.counters()?,
            job: dp.job_counters(JOB_ID)?,
            ports: star
                .ports()
                .iter()
                .map(|p| dp.port_counters(p.ifindex))
                .collect::<Result<_, _>>()?,
            queues: star
                .ports()
                .iter()
                .map(|p| rx_queue_xdp_packets(star, &p.name))
                .collect::<anyhow::Result<_>>()?,
            per_cpu,
        })
    }
}

fn run_workers(
    star: &Star,
    dp: &Dataplane,
    spec: &AllreduceSpec,
    options: RunOptions,
    config: String,
) -> anyhow::Result<AllreduceReport> {
    match spec.dtype {
        ElementType::Int32 => run_workers_of::<i32>(star, dp, spec, options, config),
        ElementType::Float32 => run_workers_of::<f32>(star, dp, spec, options, config),
    }
}

fn run_workers_of<S: Sample>(
    star: &Star,
    dp: &Dataplane,
    spec: &AllreduceSpec,
    options: RunOptions,
    config: String,
) -> anyhow::Result<AllreduceReport> {
    let data: Vec<Vec<S>> = (0..spec.workers)
        .map(|r| S::data(spec.seed, r, spec.elements))
        .collect();
    let expected = S::expected(&data);
    let cpus = if options.pin_cpus {
        allowed_cpus().context("reading this process's CPU affinity")?
    } else {
        Vec::new()
    };
    let before = Before::read(star, dp, options)?;
    let present = (0..spec.workers)
        .filter(|r| !spec.absent.contains(r))
        .count();
    let barrier = Barrier::new(present);
    let done = AtomicBool::new(false);
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let start = Instant::now();
    /// A worker's buffer after the call, its outcome, and when it finished.
    type Outcome<S> = (Vec<S>, Result<Stats, String>, Instant);
    let (outcomes, sampled) = std::thread::scope(|scope| {
        // Stops the sampler when the workers are done, also when one panics
        // (the scope waits for every thread before it lets the panic go on).
        let stop_sampler = SetOnDrop(&done);
        let sampler = before
            .per_cpu
            .as_ref()
            .map(|(maps, ..)| scope.spawn(|| sample_job(maps, &done)));
        let handles: Vec<_> = data
            .into_iter()
            .enumerate()
            .filter(|(rank, _)| !spec.absent.contains(rank))
            .map(|(rank, mut buf)| {
                let worker = star.worker(rank);
                let barrier = &barrier;
                let cpu = (!cpus.is_empty()).then(|| cpus[rank % cpus.len()]);
                let handle = scope.spawn(move || {
                    let params = spec.params(rank, switch);
                    let bind = SocketAddrV4::new(worker.ip, WORKER_PORT);
                    let config = spec.config();
                    if let Some(kill) = spec.kill.as_ref().filter(|k| k.rank == rank) {
                        let completed = || -> anyhow::Result<u64> {
                            Ok(dp.job_counters(JOB_ID)?.get(Counter::Completed))
                        };
                        let ready = || {
                            barrier.wait();
                        };
                        let addrs = (switch, bind);
                        let outcome =
                            run_and_kill(kill, worker.ns(), spec, addrs, ready, completed);
                        return Ok(outcome.map(|error| (Vec::new(), Err(error), Instant::now())));
                    }
                    worker.ns().run(move || -> anyhow::Result<Outcome<S>> {
                        // This is the thread that sends and receives.
                        let pinned = cpu.map_or(Ok(()), pin_current_thread);
                        // Everyone binds first, so no result arrives at a
                        // worker that has no socket yet; a worker that could
                        // not be pinned still passes the barrier, so the
                        // others are not stuck there.
                        let w = Worker::new(params, bind, config);
                        barrier.wait();
                        pinned.with_context(|| {
                            format!("pinning rank {rank} to CPU {}", cpu.unwrap_or_default())
                        })?;
                        let stats = w
                            .and_then(|mut w| w.allreduce(&mut buf))
                            .map_err(|e| e.to_string());
                        Ok((buf, stats, Instant::now()))
                    })
                });
                (rank, cpu, handle)
            })
            .collect();
        let outcomes: Vec<_> = handles
            .into_iter()
            .map(|(rank, cpu, h)| match h.join() {
                Ok(r) => (
                    rank,
                    cpu,
                    r.context("entering a worker namespace").and_then(|r| r),
                ),
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect();
        drop(stop_sampler);
        let sampled = sampler.map(|h| match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        });
        (outcomes, sampled)
    });
    let mut workers = Vec::with_capacity(spec.workers);
    let mut end = start;
    for (rank, cpu, outcome) in outcomes {
        let (buf, stats, finished) = outcome?;
        end = end.max(finished);
        let (error, stats) = match stats {
            Ok(s) => (None, s),
            Err(e) => (Some(e), Stats::default()),
        };
        let first_mismatch = if error.is_some() {
            None
        } else {
            S::first_mismatch(&buf, &expected)
        };
        workers.push(WorkerReport {
            rank,
            cpu,
            correct: error.is_none() && first_mismatch.is_none() && buf.len() == spec.elements,
            first_mismatch,
            error,
            packets_sent: stats.packets_sent,
            packets_received: stats.packets_received,
            retransmissions: stats.retransmissions,
            timeouts: stats.timeouts,
            from_cache: stats.from_cache,
            elapsed_s: stats.elapsed.as_secs_f64(),
        });
    }
    let counters = dp.counters()?.delta(&before.switch);
    let job_counters = dp.job_counters(JOB_ID)?.delta(&before.job);
    let mut ports = Vec::with_capacity(spec.workers);
    for ((p, port_before), queues_before) in
        star.ports().iter().zip(&before.ports).zip(&before.queues)
    {
        let queues = rx_queue_xdp_packets(star, &p.name)?;
        ports.push(PortReport {
            name: p.name.clone(),
            ifindex: p.ifindex,
            rank: p.worker,
            counters: dp.port_counters(p.ifindex)?.delta(port_before).to_map(),
            rx_queue_xdp_packets: queues
                .iter()
                .zip(queues_before.iter().chain(std::iter::repeat(&0)))
                .map(|(after, before)| after.wrapping_sub(*before))
                .collect(),
        });
    }
    let per_cpu = match (before.per_cpu, sampled) {
        (Some((maps, job_before, ports_before)), Some(sampled)) => {
            let (samples, overlapping_intervals, mean_interval_ms) = sampled?;
            let job = maps.job_blocks()?;
            let mut port_rx = Vec::with_capacity(spec.workers);
            for (p, port_before) in star.ports().iter().zip(&ports_before) {
                let after = maps.port_blocks(p.ifindex)?;
                port_rx.push(
                    per_cpu_delta(&after, port_before)
                        .iter()
                        .map(|b| b[Counter::RxPackets as usize])
                        .collect(),
                );
            }
            Some(PerCpuReport {
                job: per_cpu_delta(&job, &job_before)
                    .iter()
                    .map(|b| Counters(*b).to_map())
                    .collect(),
                port_rx,
                samples,
                overlapping_intervals,
                mean_interval_ms,
            })
        }
        _ => None,
    };
    Ok(AllreduceReport {
        spec: spec.clone(),
        options,
        chunks: spec.chunks(),
        workers,
        switch_counters: counters.to_map(),
        job_counters: job_counters.to_map(),
        ports,
        per_cpu,
        lossy: Vec::new(),
        elapsed_s: end.duration_since(start).as_secs_f64(),
        config,
    })
}

/// Runs rank `kill.rank` as `xina-testbed worker` in namespace `ns` and kills
/// it with `SIGKILL` once `completed` (the job's completed chunks) reaches
/// `kill.after_chunks`; calls `ready` once the process is ready to start its
/// call; returns what happened to it.
fn run_and_kill(
    kill: &Kill,
    ns: &netns::NetNs,
    spec: &AllreduceSpec,
    (switch, bind): (SocketAddrV4, SocketAddrV4),
    ready: impl FnOnce(),
    completed: impl Fn() -> anyhow::Result<u64>,
) -> anyhow::Result<String> {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns.name()]).arg(&kill.exe).args([
        "worker",
        "--rank",
        &kill.rank.to_string(),
        "--workers",
        &spec.workers.to_string(),
        "--elements",
        &spec.elements.to_string(),
        "--elems-per-packet",
        &spec.elems_per_packet.to_string(),
        "--slots",
        &spec.slots.to_string(),
        "--seed",
        &spec.seed.to_string(),
        "--type",
        match spec.dtype {
            ElementType::Int32 => "int32",
            ElementType::Float32 => "float32",
        },
        "--switch",
        &switch.to_string(),
        "--bind",
        &bind.to_string(),
    ]);
    let who = format!("rank {}", kill.rank);
    let target = (kill.after_chunks, "chunks were complete");
    kill_when(cmd, &who, ready, completed, target, spec.give_up * 4)
}

/// Runs `cmd`, a process whose first line of output is `ready` once it may be
/// timed, calls `ready` then, and kills the process with `SIGKILL` as soon as
/// `count()` reaches `target.0` (`target.1` says what is counted, as in
/// "3000 chunks were complete"); fails if the process ends by itself first,
/// or if the count is not reached within `patience`. Returns what happened.
pub(crate) fn kill_when(
    mut cmd: std::process::Command,
    who: &str,
    ready: impl FnOnce(),
    count: impl Fn() -> anyhow::Result<u64>,
    (target, what): (u64, &str),
    patience: Duration,
) -> anyhow::Result<String> {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {who}'s process"))?;
    // It says when its socket is bound and its data made; then the others
    // may start, and the clock starts.
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        io::BufRead::read_line(&mut io::BufReader::new(out), &mut line)
            .with_context(|| format!("reading {who}'s output"))?;
    }
    ready();
    if line.trim() != "ready" {
        let _ = child.kill();
        let status = child.wait().with_context(|| format!("reaping {who}"))?;
        bail!("{who} did not start: {status}");
    }
    let deadline = Instant::now() + patience;
    let reached = loop {
        let n = count()?;
        if n >= target {
            break n;
        }
        if let Some(status) = child.try_wait().with_context(|| format!("polling {who}"))? {
            bail!("{who} ended by itself before it was killed: {status}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{n} of {target} {what} before the kill of {who} was due");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    child.kill().with_context(|| format!("killing {who}"))?;
    let status = child.wait().with_context(|| format!("reaping {who}"))?;
    Ok(format!("killed once {reached} {what} ({status})"))
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// CPUs
// ---------------------------------------------------------------------------

/// The CPUs the calling thread may run on, in increasing order: where
/// [`RunOptions::pin_cpus`] places the workers.
///
/// # Errors
/// When `sched_getaffinity` fails or the mask is empty.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: `cpu < max`, the set's capacity in bits.
    let cpus: Vec<usize> = (0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    if cpus.is_empty() {
        return Err(io::Error::other("the affinity mask is empty"));
    }
    Ok(cpus)
}

/// Pins the calling thread to `cpu`.
fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return Err(io::Error::other(format!(
            "CPU {cpu} does not fit a cpu_set_t"
        )));
    }
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below the set's capacity (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Per-queue and per-CPU readings
// ---------------------------------------------------------------------------

/// `rx_queue_N_xdp_packets` of a switch port, by queue (`ethtool -S`).
fn rx_queue_xdp_packets(star: &Star, port: &str) -> anyhow::Result<Vec<u64>> {
    let text = star.switch().exec(&["ethtool", "-S", port])?;
    let mut queues: Vec<u64> = Vec::new();
    for line in text.lines() {
        let Some((name, value)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(queue) = name
            .strip_prefix("rx_queue_")
            .and_then(|rest| rest.strip_suffix("_xdp_packets"))
        else {
            continue;
        };
        let queue: usize = queue
            .parse()
            .with_context(|| format!("{port}: ethtool line {line:?}"))?;
        let value: u64 = value
            .trim()
            .parse()
            .with_context(|| format!("{port}: ethtool line {line:?}"))?;
        if queues.len() <= queue {
            queues.resize(queue + 1, 0);
        }
        queues[queue] = value;
    }
    Ok(queues)
}

/// One counter block per possible CPU.
type PerCpuBlocks = Vec<[u64; Counter::COUNT]>;

fn per_cpu_delta(after: &PerCpuBlocks, before: &PerCpuBlocks) -> PerCpuBlocks {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| std::array::from_fn(|i| a[i].wrapping_sub(b[i])))
        .collect()
}

/// Runs `bpftool -j args...` (in the root namespace: map and program ids are
/// global) and parses its output.
fn bpftool(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let text = netns::run_command("bpftool", &full)
        .context("bpftool (needed for per-CPU counters) failed")?;
    serde_json::from_str(&text).with_context(|| format!("bpftool {}: not JSON", args.join(" ")))
}

/// The ids of this switch's per-job and per-port counter maps, found from
/// the program attached to its first port (several dataplanes may be loaded
/// at once, each with maps of the same names).
struct CounterMaps {
    job: String,
    port: String,
    /// The job's index in `JOB_COUNTERS`.
    job_index: u32,
    /// `PORT_COUNTERS` index by ifindex.
    port_index: BTreeMap<u32, u32>,
}

impl CounterMaps {
    fn find(star: &Star, dp: &Dataplane) -> anyhow::Result<Self> {
        let port = &star.port(0).name;
        let link: serde_json::Value = serde_json::from_str(
            &star
                .switch()
                .ip(&["-j", "-d", "link", "show", "dev", port])?,
        )
        .context("ip -j link: not JSON")?;
        let xdp = &link[0]["xdp"];
        let prog = xdp["prog"]["id"]
            .as_u64()
            .or_else(|| xdp["attached"][0]["prog"]["id"].as_u64())
            .ok_or_else(|| anyhow!("{port}: no XDP program attached ({xdp})"))?;
        let info = bpftool(&["prog", "show", "id", &prog.to_string()])?;
        let ids = info["map_ids"]
            .as_array()
            .ok_or_else(|| anyhow!("program {prog}: no map ids in {info}"))?;
        let (mut job, mut port_map) = (None, None);
        for id in ids.iter().filter_map(serde_json::Value::as_u64) {
            let map = bpftool(&["map", "show", "id", &id.to_string()])?;
            match map["name"].as_str() {
                Some(names::JOB_COUNTERS) => job = Some(id.to_string()),
                Some(names::PORT_COUNTERS) => port_map = Some(id.to_string()),
                _ => {}
            }
        }
        let job_index = dp
            .job_counter_index(JOB_ID)
            .ok_or_else(|| anyhow!("job {JOB_ID} is not installed"))?;
        let port_index = star
            .ports()
            .iter()
            .map(|p| {
                let index = dp
                    .port_index(p.ifindex)
                    .ok_or_else(|| anyhow!("{} is not a port", p.name))?;
                Ok((p.ifindex, index))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            job_index,
            port_index,
            job: job.ok_or_else(|| anyhow!("program {prog} uses no {}", names::JOB_COUNTERS))?,
            port: port_map
                .ok_or_else(|| anyhow!("program {prog} uses no {}", names::PORT_COUNTERS))?,
        })
    }

    fn job_blocks(&self) -> anyhow::Result<PerCpuBlocks> {
        lookup_blocks(&self.job, self.job_index)
    }

    fn port_blocks(&self, ifindex: u32) -> anyhow::Result<PerCpuBlocks> {
        let index = *self
            .port_index
            .get(&ifindex)
            .ok_or_else(|| anyhow!("ifindex {ifindex} is not a port"))?;
        lookup_blocks(&self.port, index)
    }
}

/// The per-CPU counter blocks of entry `key` of the map with id `map`.
fn lookup_blocks(map: &str, key: u32) -> anyhow::Result<PerCpuBlocks> {
    let key: Vec<String> = key.to_ne_bytes().iter().map(ToString::to_string).collect();
    let mut args = vec!["map", "lookup", "id", map, "key"];
    args.extend(key.iter().map(String::as_str));
    let entry = bpftool(&args)?;
    let values = entry["values"]
        .as_array()
        .ok_or_else(|| anyhow!("map {map}: no per-CPU values in {entry}"))?;
    values
        .iter()
        .map(|v| {
            // Raw bytes ("0x2a" strings) in host order.
            let bytes: Vec<u8> = v["value"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            if bytes.len() != 8 * Counter::COUNT {
                bail!("map {map}: a per-CPU value of {} bytes: {v}", bytes.len());
            }
            Ok(std::array::from_fn(|i| {
                let mut word = [0; 8];
                word.copy_from_slice(&bytes[8 * i..8 * i + 8]);
                u64::from_ne_bytes(word)
            }))
        })
        .collect()
}

/// Reads the job's per-CPU contributions until `done`: returns the number of
/// readings, the intervals between consecutive readings in which more than
/// one CPU's count grew, and the mean interval in milliseconds.
fn sample_job(maps: &CounterMaps, done: &AtomicBool) -> anyhow::Result<(u64, u64, f64)> {
    let (mut samples, mut overlapping) = (0u64, 0u64);
    let mut previous: Option<Vec<u64>> = None;
    let started = Instant::now();
    while !done.load(Ordering::Relaxed) {
        let now: Vec<u64> = maps
            .job_blocks()?
            .iter()
            .map(|b| b[Counter::Contributions as usize])
            .collect();
        samples += 1;
        if let Some(previous) = &previous {
            let grew = now.iter().zip(previous).filter(|(n, p)| n > p).count();
            if grew > 1 {
                overlapping += 1;
            }
        }
        previous = Some(now);
        std::thread::sleep(Duration::from_millis(2));
    }
    let mean_ms = if samples > 1 {
        started.elapsed().as_secs_f64() * 1e3 / (samples - 1) as f64
    } else {
        0.0
    };
    Ok((samples, overlapping, mean_ms))
}

#[cfg(test)]
#[path = "scenario_tests.rs"]
mod tests;

//! `xina-testbed bench bcast`: broadcast implementations on the namespaces
//! and links xina's multicast groups use, per rank count, size and loss
//! rate, with ratios against root-to-all unicast.
//!
//! # Method
//!
//! For each rank count two stars of the same options are built: one with
//! the XDP switch attached for the whole sweep (xina's path), and a plain
//! one with no XDP anywhere ([`crate::plain`]: the baselines' path, where
//! TCP keeps its 64 KB segments, as in a cluster without xina). Every rank
//! is one thread, set up before anything is timed ([`RankImpls::setup`]:
//! the TCP mesh of [`crate::bcast`], connected in its worker namespace of
//! the plain star, and xina's group member, bound in its namespace of the
//! XDP star). Open MPI (`mpi`, when installed: [`crate::mpi`]) runs one rank
//! in each worker namespace of the plain star, started once per rank count;
//! its repetition is `iters` broadcasts timed inside its program the same
//! way. Each record's `path` says which star it ran on.
//!
//! For every loss rate and size: one warm-up broadcast per implementation,
//! then `reps` repetitions, interleaved implementation by implementation so
//! that noise on this shared machine hits all alike. A repetition of an
//! implementation is `iters` broadcasts (`clamp(1 MiB / bytes, 1, 20)`, more
//! samples where one is short), each timed on its own:
//!
//! - the root's buffer holds the input, every other rank's buffer its
//!   complement (so every byte must be written), outside the clock;
//! - all ranks meet at a barrier; each notes the instant it leaves it;
//! - each rank runs [`RankImpls::broadcast`], and every receiver reports the
//!   instant its last byte arrived;
//! - the broadcast's time is from the first rank out of the barrier to the
//!   **slowest** receiver's last byte (all ranks are threads of this
//!   process, so their instants compare);
//! - after the clock, every receiver compares its buffer with the input; a
//!   wrong or failed broadcast ends the benchmark with an error naming the
//!   implementation, size, root and rank, so no wrong answer is timed.
//!
//! Roots rotate over the ranks from broadcast to broadcast. Per
//! implementation, rank count, size and loss rate:
//!
//! - `time_us`: the median of the broadcasts' times, microseconds;
//! - `algbw_gbps = bytes / time` in GB/s (10^9 B/s), `bytes` being the
//!   buffer's size (nccl-tests' broadcast: busbw = algbw);
//! - `retransmits`: TCP segments retransmitted on the senders' connections
//!   (`tcpi_total_retrans` of `TCP_INFO` before and after each broadcast),
//!   summed over ranks and measured broadcasts;
//! - `loss`: percent of *all* packets dropped by the lossy link
//!   ([`crate::lossy`]) on every worker interface, both directions, with
//!   offloads on ([`crate::lossy::LossModel::Batch`]: a GSO send or a TCP
//!   packet of up to 64 KiB is dropped whole); `packets_seen` and
//!   `packets_dropped` count what the links saw and dropped during the
//!   measured broadcasts, `frames_seen`/`frames_dropped` the wire frames in
//!   those packets.
//!
//! # xina
//!
//! xina's rows come from one multicast group of every rank
//! ([`crate::group`]: 1,440 bytes per packet, a window of 128 chunks per
//! sender) installed on the same switch; each rank's `GroupWorker` is bound
//! before timing. A receiver's time ends when its `broadcast` call returns
//! (it has every byte, and knows its last acknowledgements arrived); the
//! root's own return (after every receiver's acknowledgement) is not
//! counted, as for the baselines. `retransmits` are the chunks the roots
//! sent again.

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

use crate::{
    allreduce_bench::{format_size, iters_for},
    bcast::{Algorithm, MeshRank, mesh_addrs, payload},
    bench::{Machine, median},
    group::{self, GroupSpec},
    lossy::{self, Counts},
    mpi::{MpiJob, MpiProgram},
    netns::NetNs,
    plain, scenario,
    topology::{Star, StarOptions},
};
use xina_host::{GroupParams, GroupWorker};

/// The goals of issue 6 are judged at this rank count, size and no loss.
pub const GOAL_RANKS: usize = 8;
pub const GOAL_BYTES: usize = 64 << 20;
/// Goal 1: xina's algbw at least this many times unicast's.
pub const GOAL_VS_UNICAST: f64 = 3.0;
/// Goal 2: xina's time at most this many times `once`'s.
pub const GOAL_VS_ONCE: f64 = 1.5;

/// A broadcast implementation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Impl {
    /// The root sends the whole buffer to every rank over TCP, concurrently.
    Unicast,
    /// A binomial tree over TCP, forwarding pipelined.
    Tree,
    /// The root sends the buffer to one rank over TCP: the bound a network
    /// multicast could reach.
    Once,
    /// xina's reliable broadcast through a multicast group of every rank on
    /// the XDP switch (`xina_host::GroupWorker::broadcast`); a receiver's
    /// time ends when its call returns.
    Xina,
    /// Open MPI's `MPI_Bcast` over TCP ([`crate::mpi`]), when `mpirun` and
    /// `mpicc` are installed.
    Mpi,
}

impl Impl {
    /// The host-based baselines, in table order.
    pub const BASELINES: [Self; 4] = [Self::Unicast, Self::Tree, Self::Once, Self::Mpi];
    /// Every implementation, in table order (`mpi` runs only when
    /// installed).
    pub const ALL: [Self; 5] = [Self::Unicast, Self::Tree, Self::Once, Self::Mpi, Self::Xina];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Unicast => "unicast",
            Self::Tree => "tree",
            Self::Once => "once",
            Self::Xina => "xina",
            Self::Mpi => "mpi",
        }
    }

    /// Whether this is a host-based baseline; the goals judge the others.
    pub const fn is_baseline(self) -> bool {
        match self {
            Self::Unicast | Self::Tree | Self::Once | Self::Mpi => true,
            Self::Xina => false,
        }
    }

    /// The topology it runs on: [`plain::XDP_PATH`] or [`plain::PLAIN_PATH`].
    pub const fn path(self) -> &'static str {
        match self {
            Self::Xina => plain::XDP_PATH,
            Self::Unicast | Self::Tree | Self::Once | Self::Mpi => plain::PLAIN_PATH,
        }
    }

    /// How many ranks receive the buffer in a broadcast among `ranks`.
    pub const fn receivers(self, ranks: usize) -> usize {
        match self {
            Self::Once => 1,
            Self::Unicast | Self::Tree | Self::Xina | Self::Mpi => ranks - 1,
        }
    }
}

/// What to measure.
#[derive(Clone, Debug, Serialize)]
pub struct BcastBenchSpec {
    /// Rank counts, each on its own star.
    pub ranks: Vec<usize>,
    /// Buffer sizes in bytes.
    pub sizes: Vec<usize>,
    /// Repetitions per size and implementation (after a warm-up).
    pub reps: usize,
    /// Loss rates in percent of frames, each direction.
    pub losses: Vec<f64>,
    /// Implementations, in table order.
    pub impls: Vec<Impl>,
    /// How long a rank waits for a peer that does not move.
    pub timeout: Duration,
    /// Seed of the data.
    pub seed: u64,
}

impl Default for BcastBenchSpec {
    fn default() -> Self {
        Self {
            ranks: vec![2, 4, 8],
            sizes: vec![4, 64 << 10, 1 << 20, 64 << 20],
            reps: 5,
            losses: vec![0.0],
            impls: Impl::ALL.to_vec(),
            timeout: Duration::from_secs(30),
            seed: 1,
        }
    }
}

impl BcastBenchSpec {
    /// Checks every field, naming the first bad one.
    ///
    /// # Errors
    /// When a list is empty or a value is out of range.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(!self.ranks.is_empty(), "ranks: none given");
        for &r in &self.ranks {
            ensure!(
                (2..=xina_proto::MAX_RANKS).contains(&r),
                "ranks: {r} (must be 2..={})",
                xina_proto::MAX_RANKS
            );
        }
        ensure!(!self.sizes.is_empty(), "sizes: none given");
        ensure!(
            self.sizes.iter().all(|&s| s > 0),
            "sizes: 0 bytes (must be positive)"
        );
        ensure!(self.reps >= 1, "reps: must be at least 1");
        ensure!(!self.losses.is_empty(), "loss: none given");
        for &l in &self.losses {
            ensure!(
                (0.0..100.0).contains(&l),
                "loss: {l}% (must be at least 0 and below 100)"
            );
        }
        ensure!(!self.impls.is_empty(), "impls: none given");
        Ok(())
    }
}

/// One measurement: an implementation at one rank count, size and loss.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    #[serde(rename = "impl")]
    pub implementation: Impl,
    /// The topology it ran on ([`Impl::path`]).
    pub path: &'static str,
    pub ranks: usize,
    /// Buffer size.
    pub bytes: usize,
    /// Median over broadcasts of the time from the barrier to the slowest
    /// receiver's last byte, microseconds.
    pub time_us: f64,
    /// `bytes / time`, GB/s (10^9 bytes per second).
    pub algbw_gbps: f64,
    /// TCP segments retransmitted, summed over ranks and measured
    /// broadcasts.
    pub retransmits: u64,
    /// Frames dropped by the lossy links, percent (each direction).
    pub loss: f64,
    /// Repetitions.
    pub reps: usize,
    /// Broadcasts per repetition.
    pub iters: usize,
    /// Every measured broadcast's time, microseconds.
    pub times_us: Vec<f64>,
    /// What the lossy links saw and dropped during the measured broadcasts
    /// (all links, both directions), in wire frames; zero without loss.
    pub frames_seen: u64,
    pub frames_dropped: u64,
    /// The same in packets at the hooks.
    pub packets_seen: u64,
    pub packets_dropped: u64,
}

/// A goal and how the run did against it.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub statement: String,
    /// The measured value the bound applies to, if it could be measured.
    pub value: Option<f64>,
    /// `value >= bound` (`at_least`) or `value <= bound`.
    pub bound: f64,
    pub at_least: bool,
    pub met: Option<bool>,
    /// What the value was computed from, or why it cannot be judged.
    pub detail: String,
}

/// Everything `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct BcastBenchReport {
    pub machine: Machine,
    pub spec: BcastBenchSpec,
    pub goals: Vec<Goal>,
    /// One per measurement.
    pub records: Vec<Record>,
}

/// Runs the whole sweep; `progress` gets a line per measurement.
///
/// # Errors
/// When a topology, switch or lossy link cannot be set up, a rank cannot
/// connect, or any broadcast fails or delivers wrong bytes (the error names
/// the implementation, size, root and rank).
pub fn run(spec: &BcastBenchSpec, mut progress: impl FnMut(&str)) -> anyhow::Result<Vec<Record>> {
    spec.validate()?;
    let mut impls = spec.impls.clone();
    let program = MpiProgram::for_bench(impls.contains(&Impl::Mpi), "rows", &mut progress)?;
    if program.is_none() {
        impls.retain(|&i| i != Impl::Mpi);
    }
    ensure!(!impls.is_empty(), "impls: only mpi, which is not installed");
    let mut records = Vec::new();
    for &ranks in &spec.ranks {
        progress(&format!("{ranks} ranks: building the stars"));
        let options = StarOptions::new(ranks);
        let star = Star::build_with(options).context("building the star topology")?;
        let plain = plain::build(options).context("building the plain star")?;
        let result = (|| {
            let job = program
                .as_ref()
                .map(|p| MpiJob::start(p, &plain, spec.timeout))
                .transpose()
                .context("starting Open MPI on the plain star")?;
            let on = On {
                star: &star,
                plain: &plain,
                mpi: job.map(RefCell::new),
                impls: &impls,
            };
            run_on(on, spec, ranks, &mut records, &mut progress)
        })();
        plain.teardown().context("tearing the plain star down")?;
        star.teardown().context("tearing the topology down")?;
        result?;
    }
    Ok(records)
}

/// Where one rank count runs.
struct On<'a> {
    /// With the XDP switch: xina's path.
    star: &'a Star,
    /// Without XDP: the baselines' path.
    plain: &'a Star,
    /// Open MPI on the plain star, when measured.
    mpi: Option<RefCell<MpiJob<'a>>>,
    /// The implementations to measure, in table order.
    impls: &'a [Impl],
}

/// The sweep of one rank count.
fn run_on(
    on: On<'_>,
    spec: &BcastBenchSpec,
    ranks: usize,
    records: &mut Vec<Record>,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    let star = on.star;
    // The switch's program on every port, passing the baselines' TCP to the
    // kernel, with xina's multicast group of every rank.
    let group = GroupSpec {
        give_up: spec.timeout,
        ..GroupSpec::default()
    };
    // Detached when dropped, at the end of this function.
    let mut dp = scenario::start_switch(star, &group::switch_config(star, &group))?;
    let xina = on.impls.contains(&Impl::Xina);
    if xina {
        dp.install_job(&group::group_spec(star, &group))
            .context("installing xina's multicast group")?;
    }
    let switch = SocketAddrV4::new(star.service_ip(), xina_proto::XINA_UDP_PORT);
    let members: Vec<Option<(GroupParams, SocketAddrV4)>> = star
        .workers()
        .iter()
        .map(|w| {
            xina.then(|| {
                let params = GroupParams {
                    group: group::GROUP_ID,
                    rank: u8::try_from(w.rank).expect("at most 64 ranks"),
                    fan_in: u8::try_from(ranks).expect("at most 64 ranks"),
                    bytes_per_packet: group.bytes_per_packet,
                    window: group.window,
                    switch,
                };
                (params, SocketAddrV4::new(w.ip, group::MEMBER_PORT))
            })
        })
        .collect();
    let addrs = mesh_addrs(star.workers().iter().map(|w| w.ip));
    let barrier = Barrier::new(ranks);
    let (to_driver, from_ranks) = mpsc::channel();
    std::thread::scope(|scope| {
        let mut commands = Vec::with_capacity(ranks);
        for (rank, &member) in members.iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            commands.push(tx);
            let (ns, barrier, to_driver, addrs) =
                (star.worker(rank).ns(), &barrier, to_driver.clone(), &addrs);
            let mesh_ns = on.plain.worker(rank).ns();
            scope.spawn(move || {
                let failed = to_driver.clone();
                let timeout = spec.timeout;
                if let Err(e) = ns.run(move || {
                    let setup = (addrs.as_slice(), mesh_ns, member);
                    rank_loop(rank, setup, timeout, barrier, &rx, &to_driver);
                }) {
                    let _ = failed.send(Message::Ready(rank, Err(format!("{e:#}"))));
                }
            });
        }
        drop(to_driver);
        let driver = Driver {
            star,
            plain: on.plain,
            mpi: on.mpi,
            impls: on.impls,
            spec,
            ranks,
            commands: &commands,
            results: &from_ranks,
        };
        // Dropping `commands` on the way out ends every rank's loop.
        driver.run(records, progress)
    })
}

/// What one rank's part of one broadcast returned.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    /// When this rank's last byte arrived; `None` when it receives nothing
    /// (the root, or a rank the implementation leaves out).
    pub received: Option<Instant>,
    /// Retransmissions this rank made during the call.
    pub retransmits: u64,
}

/// One rank's means to run every implementation, set up before any timing.
#[derive(Debug)]
pub struct RankImpls {
    /// The TCP baselines' connections to every other rank.
    mesh: MeshRank,
    /// xina's group member, when xina is measured.
    member: Option<GroupWorker>,
}

impl RankImpls {
    /// Sets rank `rank` up among `addrs` (one per rank; every rank at about
    /// the same time): its TCP mesh in `mesh_ns` (its namespace of the plain
    /// star), and, when `member` gives its parameters and address, its group
    /// member in the calling thread's namespace (its namespace of the XDP
    /// star).
    ///
    /// # Errors
    /// When the rank cannot listen or connect to the others, or bind.
    pub fn setup(
        rank: usize,
        addrs: &[SocketAddrV4],
        mesh_ns: &NetNs,
        member: Option<(GroupParams, SocketAddrV4)>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mesh = mesh_ns.run(|| -> anyhow::Result<MeshRank> {
            let listener = MeshRank::listen(rank, addrs)?;
            Ok(MeshRank::connect(rank, addrs, &listener, timeout)?)
        })??;
        let member = member
            .map(|(params, bind)| {
                let config = xina_host::Config {
                    give_up: timeout,
                    ..xina_host::Config::default()
                };
                GroupWorker::new(params, bind, config)
                    .with_context(|| format!("binding rank {rank}'s group member"))
            })
            .transpose()?;
        Ok(Self { mesh, member })
    }

    /// This rank's part in one broadcast of `data` from `root` by `which`;
    /// every rank calls it with the same arguments but `data` (the root's
    /// holds the input).
    ///
    /// # Errors
    /// The implementation's error as text (naming the rank and peer).
    pub fn broadcast(&mut self, which: Impl, root: usize, data: &mut [u8]) -> Result<Done, String> {
        let algorithm = match which {
            Impl::Unicast => Algorithm::Unicast,
            Impl::Tree => Algorithm::Tree,
            Impl::Once => Algorithm::Once,
            Impl::Mpi => return Err("Open MPI runs in its own processes".to_owned()),
            Impl::Xina => {
                let member = self
                    .member
                    .as_mut()
                    .ok_or("xina was not set up on this rank")?;
                let root = u8::try_from(root).map_err(|_| format!("root {root}"))?;
                let stats = member.broadcast(root, data).map_err(|e| e.to_string())?;
                let rank = member.params().rank;
                return Ok(Done {
                    received: (rank != root).then(Instant::now),
                    retransmits: stats.retransmissions,
                });
            }
        };
        let c = self
            .mesh
            .broadcast(algorithm, root, data)
            .map_err(|e| e.to_string())?;
        Ok(Done {
            received: c.received,
            retransmits: c.retransmits,
        })
    }
}

/// One broadcast for every rank.
struct Command {
    which: Impl,
    root: usize,
    input: Arc<Vec<u8>>,
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
    /// The rank's part, its data checked.
    outcome: Result<Done, String>,
}

/// A rank: sets up, then runs one broadcast per command until the driver
/// hangs up.
fn rank_loop(
    rank: usize,
    (addrs, mesh_ns, member): (&[SocketAddrV4], &NetNs, Option<(GroupParams, SocketAddrV4)>),
    timeout: Duration,
    barrier: &Barrier,
    commands: &Receiver<Command>,
    to_driver: &Sender<Message>,
) {
    let mut impls = match RankImpls::setup(rank, addrs, mesh_ns, member, timeout) {
        Ok(impls) => {
            let _ = to_driver.send(Message::Ready(rank, Ok(())));
            impls
        }
        Err(e) => {
            let _ = to_driver.send(Message::Ready(rank, Err(format!("{e:#}"))));
            return;
        }
    };
    let mut buf: Vec<u8> = Vec::new();
    while let Ok(cmd) = commands.recv() {
        buf.clear();
        if rank == cmd.root {
            buf.extend_from_slice(&cmd.input);
        } else {
            buf.extend(cmd.input.iter().map(|b| !b));
        }
        barrier.wait();
        let start = Instant::now();
        let outcome = impls
            .broadcast(cmd.which, cmd.root, &mut buf)
            .and_then(|done| {
                if done.received.is_some() || rank == cmd.root {
                    check(&buf, &cmd.input)?;
                }
                Ok(done)
            });
        let result = RankResult {
            rank,
            start,
            outcome,
        };
        if to_driver.send(Message::Done(result)).is_err() {
            return;
        }
    }
}

/// Whether `got` is exactly `want`.
fn check(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} bytes, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(at) => Err(format!(
            "WRONG data at byte {at}: {:#04x} (expected {:#04x})",
            got[at], want[at]
        )),
        None => Ok(()),
    }
}

/// The driver's side of one rank count.
struct Driver<'a, 'm> {
    star: &'a Star,
    plain: &'a Star,
    /// Open MPI on the plain star, when measured.
    mpi: Option<RefCell<MpiJob<'m>>>,
    impls: &'a [Impl],
    spec: &'a BcastBenchSpec,
    ranks: usize,
    commands: &'a [Sender<Command>],
    results: &'a Receiver<Message>,
}

/// One broadcast's outcome across ranks.
struct Sample {
    time: Duration,
    retransmits: u64,
}

impl Driver<'_, '_> {
    fn run(
        &self,
        records: &mut Vec<Record>,
        progress: &mut impl FnMut(&str),
    ) -> anyhow::Result<()> {
        self.wait_ready()?;
        let impls = self.impls;
        for &loss in &self.spec.losses {
            let mut links = lossy::on_star(self.star, loss, false)?;
            links.extend(lossy::on_star(self.plain, loss, false)?);
            for &bytes in &self.spec.sizes {
                let input = Arc::new(payload(self.spec.seed ^ bytes as u64, bytes));
                let iters = iters_for(bytes);
                let mut samples: Vec<Vec<Sample>> = impls.iter().map(|_| Vec::new()).collect();
                let mut frames = vec![Counts::default(); impls.len()];
                for &which in impls {
                    if which == Impl::Mpi {
                        self.mpi_broadcasts(bytes, 1, loss)?;
                    } else {
                        self.broadcast(which, 0, &input, loss)?;
                    }
                }
                for rep in 0..self.spec.reps {
                    for (i, &which) in impls.iter().enumerate() {
                        let before = lossy::total(&links)?;
                        if which == Impl::Mpi {
                            samples[i].extend(self.mpi_broadcasts(bytes, iters, loss)?);
                        }
                        for it in (0..iters).filter(|_| which != Impl::Mpi) {
                            let root = (rep * iters + it) % self.ranks;
                            samples[i].push(self.broadcast(which, root, &input, loss)?);
                        }
                        frames[i] = frames[i].plus(lossy::total(&links)?.since(before));
                    }
                }
                for (i, &which) in impls.iter().enumerate() {
                    let record = self.record(which, bytes, iters, loss, &samples[i], frames[i]);
                    progress(&format!(
                        "{} ranks, loss {loss}%, {}: {} {:.1} us, {:.3} GB/s, {} retransmits",
                        self.ranks,
                        format_size(bytes),
                        which.name(),
                        record.time_us,
                        record.algbw_gbps,
                        record.retransmits
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
        for _ in 0..self.ranks {
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

    /// `iters` broadcasts of `bytes` by Open MPI, each timed inside its
    /// program as [`Driver::broadcast`] times the others (its roots rotate
    /// from 0).
    fn mpi_broadcasts(&self, bytes: usize, iters: usize, loss: f64) -> anyhow::Result<Vec<Sample>> {
        let mut job = self
            .mpi
            .as_ref()
            .context("Open MPI is not running")?
            .borrow_mut();
        let answer = job.bcast(bytes, iters, 1).with_context(|| {
            format!(
                "Open MPI broadcast of {}, {} ranks, loss {loss}%",
                format_size(bytes),
                self.ranks
            )
        })?;
        // The namespace counters cover the whole call; count them once.
        Ok(answer
            .samples
            .iter()
            .enumerate()
            .map(|(k, &time)| Sample {
                time,
                retransmits: if k == 0 { answer.retransmits } else { 0 },
            })
            .collect())
    }

    /// One broadcast of `which` from `root` on every rank, timed from the
    /// first rank out of the barrier to the slowest receiver's last byte.
    fn broadcast(
        &self,
        which: Impl,
        root: usize,
        input: &Arc<Vec<u8>>,
        loss: f64,
    ) -> anyhow::Result<Sample> {
        for tx in self.commands {
            tx.send(Command {
                which,
                root,
                input: Arc::clone(input),
            })
            .context("a rank thread has ended")?;
        }
        let mut results = Vec::with_capacity(self.ranks);
        for _ in 0..self.ranks {
            match self.results.recv() {
                Ok(Message::Done(r)) => results.push(r),
                Ok(Message::Ready(rank, _)) => bail!("rank {rank} set itself up twice"),
                Err(_) => bail!("a rank thread has ended"),
            }
        }
        results.sort_by_key(|r| r.rank);
        let what = || {
            format!(
                "{} broadcast of {} from root {root}, {} ranks, loss {loss}%",
                which.name(),
                format_size(input.len()),
                self.ranks
            )
        };
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
            bail!("{}: {}", what(), failed.join("; "));
        }
        let done: Vec<(usize, Done)> = results
            .iter()
            .filter_map(|r| r.outcome.as_ref().ok().map(|d| (r.rank, *d)))
            .collect();
        let received: Vec<Instant> = done.iter().filter_map(|(_, d)| d.received).collect();
        if received.len() != which.receivers(self.ranks) {
            bail!(
                "{}: {} ranks received the buffer, expected {}",
                what(),
                received.len(),
                which.receivers(self.ranks)
            );
        }
        let start = results.iter().map(|r| r.start).min().context("no ranks")?;
        let end = received.into_iter().max().context("no receivers")?;
        Ok(Sample {
            time: end.saturating_duration_since(start),
            retransmits: done.iter().map(|(_, d)| d.retransmits).sum(),
        })
    }

    fn record(
        &self,
        which: Impl,
        bytes: usize,
        iters: usize,
        loss: f64,
        samples: &[Sample],
        frames: Counts,
    ) -> Record {
        let times_us: Vec<f64> = samples.iter().map(|s| s.time.as_secs_f64() * 1e6).collect();
        let time_us = median(&times_us).unwrap_or(f64::NAN);
        Record {
            implementation: which,
            path: which.path(),
            ranks: self.ranks,
            bytes,
            time_us,
            algbw_gbps: bytes as f64 / (time_us * 1e-6) / 1e9,
            retransmits: samples.iter().map(|s| s.retransmits).sum(),
            loss,
            reps: self.spec.reps,
            iters,
            times_us,
            frames_seen: frames.frames,
            frames_dropped: frames.frames_dropped,
            packets_seen: frames.seen,
            packets_dropped: frames.dropped,
        }
    }
}

fn find(records: &[Record], which: Impl, ranks: usize, bytes: usize, loss: f64) -> Option<&Record> {
    records.iter().find(|r| {
        r.implementation == which && r.ranks == ranks && r.bytes == bytes && r.loss == loss
    })
}

/// `which`'s algbw over unicast's (unicast's time over `which`'s) at the
/// same point of the same run.
pub fn vs_unicast(
    records: &[Record],
    which: Impl,
    ranks: usize,
    bytes: usize,
    loss: f64,
) -> Option<f64> {
    let x = find(records, which, ranks, bytes, loss)?;
    let u = find(records, Impl::Unicast, ranks, bytes, loss)?;
    Some(u.time_us / x.time_us)
}

/// `which`'s algbw over Open MPI's (Open MPI's time over `which`'s) at
/// the same point of the same run.
pub fn vs_mpi(
    records: &[Record],
    which: Impl,
    ranks: usize,
    bytes: usize,
    loss: f64,
) -> Option<f64> {
    let x = find(records, which, ranks, bytes, loss)?;
    let m = find(records, Impl::Mpi, ranks, bytes, loss)?;
    Some(m.time_us / x.time_us)
}

/// The table of one rank count and loss rate: a row per size and
/// implementation, with the star it ran on and its algbw relative to Open
/// MPI's (when it ran) and to unicast's.
pub fn table(records: &[Record], ranks: usize, loss: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>8} {:>10} {:>8} {:>10} | {:>11} {:>11} {:>6} | {:>7} {:>10}",
        "size", "bytes", "impl", "path", "time(us)", "algbw(GB/s)", "retx", "x mpi", "x unicast"
    );
    let mut rows: Vec<&Record> = records
        .iter()
        .filter(|r| r.ranks == ranks && r.loss == loss)
        .collect();
    // Stable: implementations keep their measured order within a size.
    rows.sort_by_key(|r| r.bytes);
    for r in rows {
        let ratio = vs_unicast(records, r.implementation, ranks, r.bytes, loss)
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"));
        let mpi = vs_mpi(records, r.implementation, ranks, r.bytes, loss)
            .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "{:>8} {:>10} {:>8} {:>10} | {:>11.1} {:>11.4} {:>6} | {mpi:>7} {ratio:>10}",
            format_size(r.bytes),
            r.bytes,
            r.implementation.name(),
            r.path,
            r.time_us,
            r.algbw_gbps,
            r.retransmits
        );
    }
    out
}

/// The goals, judged for the first implementation in `records` that is not
/// a baseline (xina); without one they say they cannot be judged.
pub fn judge_goals(records: &[Record]) -> Vec<Goal> {
    match records
        .iter()
        .map(|r| r.implementation)
        .find(|i| !i.is_baseline())
    {
        Some(candidate) => judge_goals_for(records, candidate),
        None => goal_statements("xina")
            .into_iter()
            .map(|(statement, bound, at_least)| Goal {
                statement,
                value: None,
                bound,
                at_least,
                met: None,
                detail: "cannot be judged: no xina rows (only the host-based baselines ran; \
                         add xina to --impls)"
                    .to_owned(),
            })
            .collect(),
    }
}

/// The goals' statements for `candidate`, with their bound and direction.
fn goal_statements(candidate: &str) -> [(String, f64, bool); 2] {
    let at = format!("at {} and {GOAL_RANKS} ranks", format_size(GOAL_BYTES));
    [
        (
            format!("{at}, {candidate}'s algbw >= {GOAL_VS_UNICAST}x unicast's"),
            GOAL_VS_UNICAST,
            true,
        ),
        (
            format!("{at}, {candidate}'s time <= {GOAL_VS_ONCE}x once's"),
            GOAL_VS_ONCE,
            false,
        ),
    ]
}

/// The goals with `candidate` in xina's place, lossless.
pub fn judge_goals_for(records: &[Record], candidate: Impl) -> Vec<Goal> {
    let point = |which| find(records, which, GOAL_RANKS, GOAL_BYTES, 0.0);
    let name = candidate.name();
    let [vs_unicast_goal, vs_once_goal] = goal_statements(name);
    let mut goals = Vec::new();
    for ((statement, bound, at_least), other) in
        [(vs_unicast_goal, Impl::Unicast), (vs_once_goal, Impl::Once)]
    {
        let (value, detail) = match (point(candidate), point(other)) {
            (Some(c), Some(o)) => {
                let value = if at_least {
                    o.time_us / c.time_us
                } else {
                    c.time_us / o.time_us
                };
                let detail = format!(
                    "lossless: {name} {:.1} us ({:.4} GB/s), {} {:.1} us ({:.4} GB/s)",
                    c.time_us,
                    c.algbw_gbps,
                    other.name(),
                    o.time_us,
                    o.algbw_gbps
                );
                (Some(value), detail)
            }
            _ => (
                None,
                format!(
                    "not measured (needs {name} and {} at {GOAL_RANKS} ranks, {}, loss 0)",
                    other.name(),
                    format_size(GOAL_BYTES)
                ),
            ),
        };
        goals.push(Goal {
            statement,
            met: value.map(|v| if at_least { v >= bound } else { v <= bound }),
            value,
            bound,
            at_least,
            detail,
        });
    }
    goals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(which: Impl, ranks: usize, bytes: usize, time_us: f64) -> Record {
        Record {
            implementation: which,
            path: which.path(),
            ranks,
            bytes,
            time_us,
            algbw_gbps: bytes as f64 / time_us / 1e3,
            retransmits: 0,
            loss: 0.0,
            reps: 1,
            iters: 1,
            times_us: vec![time_us],
            frames_seen: 0,
            frames_dropped: 0,
            packets_seen: 0,
            packets_dropped: 0,
        }
    }

    /// The goals' arithmetic, with `tree` standing in for xina: 3x unicast
    /// is met at a third of unicast's time and not just above it; 1.5x once
    /// is met at 1.5x once's time and not just above it.
    #[test]
    fn goals_compare_the_right_times() {
        let judged = |tree_us: f64| {
            let records = vec![
                record(Impl::Unicast, GOAL_RANKS, GOAL_BYTES, 300.0),
                record(Impl::Tree, GOAL_RANKS, GOAL_BYTES, tree_us),
                record(Impl::Once, GOAL_RANKS, GOAL_BYTES, 66.0),
            ];
            judge_goals_for(&records, Impl::Tree)
        };
        let g = judged(99.0);
        assert_eq!(g[0].met, Some(true), "{g:?}");
        assert!((g[0].value.unwrap() - 300.0 / 99.0).abs() < 1e-9);
        assert_eq!(g[1].met, Some(true), "{g:?}");
        assert!((g[1].value.unwrap() - 1.5).abs() < 1e-9);
        let g = judged(101.0);
        assert_eq!(g[0].met, Some(false), "{g:?}");
        assert_eq!(g[1].met, Some(false), "{g:?}");
        // Baselines only: nothing to judge, and the goals say so.
        let records = vec![record(Impl::Unicast, GOAL_RANKS, GOAL_BYTES, 300.0)];
        for g in judge_goals(&records) {
            assert!(
                g.met.is_none() && g.detail.contains("cannot be judged"),
                "{g:?}"
            );
        }
        // The wrong rank count is not the goal's point.
        let records = vec![
            record(Impl::Unicast, 4, GOAL_BYTES, 300.0),
            record(Impl::Tree, 4, GOAL_BYTES, 10.0),
        ];
        assert!(judge_goals_for(&records, Impl::Tree)[0].met.is_none());
    }

    #[test]
    fn table_has_a_row_per_implementation_and_ratios() {
        let records = vec![
            record(Impl::Unicast, 4, 4096, 200.0),
            record(Impl::Tree, 4, 4096, 100.0),
            record(Impl::Once, 4, 4096, 50.0),
            record(Impl::Tree, 4, 4, 10.0),
        ];
        let text = table(&records, 4, 0.0);
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 5, "{text}");
        assert!(
            rows[1].contains("tree") && rows[1].trim_end().ends_with('-'),
            "{text}"
        );
        assert!(rows[2].contains("unicast") && rows[2].trim_end().ends_with("1.00"));
        assert!(rows[3].contains("tree") && rows[3].trim_end().ends_with("2.00"));
        assert!(rows[4].contains("once") && rows[4].trim_end().ends_with("4.00"));
    }

    #[test]
    fn spec_errors_name_the_field() {
        let bad = |f: fn(&mut BcastBenchSpec)| {
            let mut s = BcastBenchSpec::default();
            f(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(|s| s.ranks = vec![1]).starts_with("ranks: 1"));
        assert!(bad(|s| s.sizes = vec![0]).starts_with("sizes: 0"));
        assert!(bad(|s| s.reps = 0).starts_with("reps"));
        assert!(bad(|s| s.losses = vec![100.0]).starts_with("loss: 100"));
        assert!(bad(|s| s.impls.clear()).starts_with("impls"));
        BcastBenchSpec::default().validate().unwrap();
    }
}

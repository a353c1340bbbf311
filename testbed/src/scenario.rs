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
    fmt::Write as _,
    net::SocketAddrV4,
    sync::Barrier,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use serde::Serialize;
use xina::{Counters, Dataplane, config::Config};
use xina_host::{JobParams, Stats, Worker};
use xina_proto::{XINA_UDP_PORT, counters::Counter};

use crate::topology::Star;

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
        }
    }
}

impl AllreduceSpec {
    /// Number of chunks each worker sends.
    pub fn chunks(&self) -> u64 {
        self.elements.div_ceil(usize::from(self.elems_per_packet)) as u64
    }
}

/// One worker's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    pub rank: usize,
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

/// The outcome of [`run_allreduce`].
#[derive(Clone, Debug, Serialize)]
pub struct AllreduceReport {
    pub spec: AllreduceSpec,
    pub chunks: u64,
    pub workers: Vec<WorkerReport>,
    /// Counter changes in the switch during the run.
    pub switch_counters: std::collections::BTreeMap<&'static str, u64>,
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

    /// Why the run does not prove in-switch aggregation, if it does not:
    /// every contribution must have reached the switch exactly once
    /// (`contributions = workers × chunks`), every chunk completed there
    /// once, one copy per worker left it, and every frame the switch saw is
    /// accounted for by exactly one outcome counter.
    pub fn switch_accounting_error(&self) -> Option<String> {
        let w = self.spec.workers as u64;
        let expect = [
            (Counter::Contributions, w * self.chunks),
            (Counter::Completed, self.chunks),
            (Counter::ResultsSent, w * self.chunks),
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
            "{:>5} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8}  result",
            "rank", "sent", "received", "retx", "timeouts", "from_cache", "time(s)"
        );
        for w in &self.workers {
            let result = match (&w.error, w.first_mismatch) {
                (Some(e), _) => format!("error: {e}"),
                (None, Some(i)) => format!("WRONG from element {i}"),
                (None, None) => "exact".to_owned(),
            };
            let _ = writeln!(
                out,
                "{:>5} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8.3}  {result}",
                w.rank,
                w.packets_sent,
                w.packets_received,
                w.retransmissions,
                w.timeouts,
                w.from_cache,
                w.elapsed_s
            );
        }
        let _ = writeln!(out, "\nswitch counters (this run):");
        for (name, v) in &self.switch_counters {
            if *v != 0 {
                let _ = writeln!(out, "  {name:<22}{v:>12}");
            }
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
        out
    }
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
    let _ = writeln!(
        toml,
        "[switch]\nports = [{}]\nslot_pool = {pool}\n",
        ports.join(", ")
    );
    let _ = writeln!(
        toml,
        "[[jobs]]\nid = {JOB_ID}\nelems_per_packet = {}\nslot_base = 0\nslot_count = {}\n",
        spec.elems_per_packet, spec.slots
    );
    for w in star.workers() {
        let _ = writeln!(
            toml,
            "[[jobs.members]]\nrank = {}\nip = \"{}\"\nport = {WORKER_PORT}\nmac = \"{}\"\ninterface = \"{}\"\n",
            w.rank,
            w.ip,
            w.mac,
            star.port(w.port).name
        );
    }
    toml
}

/// Worker `rank`'s data: uniform in ±2^20, so sums over up to 1,024 workers
/// stay far from `i32` overflow.
pub fn worker_data(seed: u64, rank: usize, elements: usize) -> Vec<i32> {
    let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..elements)
        .map(|_| rng.random_range(-(1 << 20)..(1 << 20)))
        .collect()
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
    if spec.workers == 0 || spec.workers > xina_proto::MAX_RANKS {
        bail!(
            "workers: {} (must be 1..={})",
            spec.workers,
            xina_proto::MAX_RANKS
        );
    }
    let star = Star::build(spec.workers).context("building the star topology")?;
    let config = star_config(&star, spec);
    let dp = start_switch(&star, &config)?;
    let result = run_workers(&star, &dp, spec, config);
    drop(dp);
    star.teardown().context("tearing the topology down")?;
    result
}

fn run_workers(
    star: &Star,
    dp: &Dataplane,
    spec: &AllreduceSpec,
    config: String,
) -> anyhow::Result<AllreduceReport> {
    let data: Vec<Vec<i32>> = (0..spec.workers)
        .map(|r| worker_data(spec.seed, r, spec.elements))
        .collect();
    let mut expected = vec![0i32; spec.elements];
    for d in &data {
        for (e, v) in expected.iter_mut().zip(d) {
            *e += *v;
        }
    }
    let before: Counters = dp.counters()?;
    let present = (0..spec.workers)
        .filter(|r| !spec.absent.contains(r))
        .count();
    let barrier = Barrier::new(present);
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let start = Instant::now();
    /// A worker's buffer after the call, its outcome, and when it finished.
    type Outcome = (Vec<i32>, Result<Stats, xina_host::Error>, Instant);
    let outcomes: Vec<(usize, anyhow::Result<Outcome>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = data
            .into_iter()
            .enumerate()
            .filter(|(rank, _)| !spec.absent.contains(rank))
            .map(|(rank, mut buf)| {
                let worker = star.worker(rank);
                let barrier = &barrier;
                let handle = scope.spawn(move || {
                    let params = JobParams {
                        job: JOB_ID,
                        rank: u8::try_from(rank).expect("at most 64 ranks"),
                        fan_in: u8::try_from(spec.workers).expect("at most 64 ranks"),
                        elems_per_packet: spec.elems_per_packet,
                        slots: spec.slots,
                        switch,
                    };
                    let bind = SocketAddrV4::new(worker.ip, WORKER_PORT);
                    let config = xina_host::Config {
                        give_up: spec.give_up,
                        ..Default::default()
                    };
                    worker.ns().run(move || {
                        // Everyone binds first, so no result arrives at a
                        // worker that has no socket yet.
                        let w = Worker::new(params, bind, config);
                        barrier.wait();
                        let stats = w.and_then(|mut w| w.allreduce_i32(&mut buf));
                        (buf, stats, Instant::now())
                    })
                });
                (rank, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, h)| match h.join() {
                Ok(r) => (rank, r.context("entering a worker namespace")),
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    });
    let mut workers = Vec::with_capacity(spec.workers);
    let mut end = start;
    for (rank, outcome) in outcomes {
        let (buf, stats, finished) = outcome?;
        end = end.max(finished);
        let (error, stats) = match stats {
            Ok(s) => (None, s),
            Err(e) => (Some(e.to_string()), Stats::default()),
        };
        let first_mismatch = if error.is_some() {
            None
        } else {
            buf.iter().zip(&expected).position(|(a, b)| a != b)
        };
        workers.push(WorkerReport {
            rank,
            correct: error.is_none() && first_mismatch.is_none() && buf.len() == expected.len(),
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
    let counters = dp.counters()?.delta(&before);
    Ok(AllreduceReport {
        spec: spec.clone(),
        chunks: spec.chunks(),
        workers,
        switch_counters: counters.to_map(),
        elapsed_s: end.duration_since(start).as_secs_f64(),
        config,
    })
}

//! `bench mpi`: one MPI benchmark program (`testbed/mpi/xina_mpi_bench.c`)
//! run twice in one sweep, repetitions interleaved: with Open MPI's own
//! collectives on the plain star (no XDP on the path), and through xina
//! with the PMPI library (`userspace/xina-mpi`) preloaded, on the XDP star,
//! its jobs leased from a job service that runs in this process in the
//! switch's namespace. OSU-style columns (size, average, minimum and
//! maximum latency, algorithm bandwidth) and JSON.
//!
//! A sample is the program's: for allreduce, the time of one
//! `MPI_Allreduce` averaged over a repetition of back-to-back calls (first
//! rank out of a barrier to the last rank done); for bcast, one
//! `MPI_Bcast` (first rank out to the slowest receiver), the root
//! rotating. Every result is checked inside the program.

use std::{
    path::Path,
    sync::{Arc, Barrier, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use xina::{
    config::Config,
    control,
    pin::{self, PinDir},
    service::{self, Service, ServiceConfig},
};
use xina_host::JobParams;
use xina_proto::{DType, frame};

use crate::{
    allreduce_bench::{format_size, iters_for, window_for},
    bcast_bench::Goal,
    mpi::{MpiJob, MpiProgram},
    netns, plain,
    pmpi::{Pmpi, service_text},
    topology::{Star, StarOptions},
};

/// How long one command of the program may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Issue 16's goals, in one run at 8 ranks: 64 MiB `MPI_Allreduce` at
/// least this times Open MPI's speed,
pub const GOAL_ALLREDUCE_RATIO: f64 = 1.5;
/// 64 MiB `MPI_Bcast` at least this,
pub const GOAL_BCAST_RATIO: f64 = 2.0;
/// an 8-byte `MPI_Allreduce` at most this fraction of Open MPI's
/// latency,
pub const GOAL_SMALL_LATENCY_FRACTION: f64 = 0.25;

/// and the PMPI library's time at most this much above the Rust API's.
pub const GOAL_LIBRARY_COST: f64 = 0.05;

/// A collective of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Coll {
    /// `MPI_Allreduce`, int32 sum.
    Allreduce,
    /// `MPI_Bcast` of bytes.
    Bcast,
}

impl Coll {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Bcast => "bcast",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug, Serialize)]
pub struct MpiBenchSpec {
    pub ranks: Vec<usize>,
    pub sizes: Vec<usize>,
    pub colls: Vec<Coll>,
    /// The MTU of every link of both stars.
    pub frame: u32,
    /// Repetitions per size and implementation.
    pub reps: usize,
}

impl MpiBenchSpec {
    /// # Errors
    /// A field out of range, named.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(!self.ranks.is_empty(), "ranks: none");
        for &r in &self.ranks {
            ensure!((2..=64).contains(&r), "ranks: {r} (must be 2 to 64)");
        }
        ensure!(!self.sizes.is_empty(), "sizes: none");
        ensure!(!self.colls.is_empty(), "colls: none");
        if self.colls.contains(&Coll::Allreduce) {
            for &s in &self.sizes {
                ensure!(
                    s >= 4 && s % 4 == 0,
                    "sizes: {s} bytes is not a whole number of int32 for allreduce"
                );
            }
        }
        ensure!(
            (1500..=crate::topology::MAX_MTU).contains(&self.frame),
            "frame: {} (must be 1500 to {})",
            self.frame,
            crate::topology::MAX_MTU
        );
        ensure!(self.reps > 0, "reps: 0");
        Ok(())
    }
}

/// One size of one collective by one implementation.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub coll: Coll,
    /// `mpi` (Open MPI's own), `xina` (through the PMPI library) or
    /// `xina-rust` (the Rust API, allreduce only).
    pub implementation: &'static str,
    /// `plain star` or `xdp switch`.
    pub path: &'static str,
    pub ranks: usize,
    pub bytes: usize,
    pub frame_bytes: u32,
    /// Calls per sample (allreduce) or 1 (bcast).
    pub iters: usize,
    pub samples_us: Vec<f64>,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// `bytes / avg`, GB/s (1e9 B/s).
    pub algbw_gbps: f64,
}

impl Record {
    fn new(
        coll: Coll,
        implementation: &'static str,
        at: (usize, usize, u32, usize),
        samples: &[Duration],
    ) -> Self {
        let (ranks, bytes, frame_bytes, iters) = at;
        let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        let avg = us.iter().sum::<f64>() / us.len().max(1) as f64;
        Self {
            coll,
            implementation,
            path: if implementation == "mpi" {
                plain::PLAIN_PATH
            } else {
                plain::XDP_PATH
            },
            ranks,
            bytes,
            frame_bytes,
            iters,
            avg_us: avg,
            min_us: us.iter().copied().fold(f64::INFINITY, f64::min),
            max_us: us.iter().copied().fold(0.0, f64::max),
            algbw_gbps: if avg > 0.0 {
                bytes as f64 / avg / 1e3
            } else {
                0.0
            },
            samples_us: us,
        }
    }
}

/// A pinned switch on a star with a job service in this process, in the
/// switch's namespace; stopped and removed on drop.
struct Switch {
    dir: PinDir,
    service: Option<(
        Arc<Service>,
        tokio::sync::oneshot::Sender<()>,
        JoinHandle<()>,
    )>,
    addr: String,
    token: String,
}

impl Switch {
    fn start(star: &Star, frame: u32) -> anyhow::Result<Self> {
        let dir = PinDir::new(pin::DEFAULT_ROOT, &format!("xm{}", star.token()))
            .map_err(|e| anyhow::anyhow!("the switch's pin directory: {e}"))?;
        let ports: Vec<String> = star
            .ports()
            .iter()
            .map(|p| format!("{:?}", p.name))
            .collect();
        let elems = u16::try_from(frame::elems_for_mtu(DType::I32, frame as usize)).unwrap_or(1);
        let slots = window_for(usize::from(elems));
        // Room for three wide jobs at once: the int32 sum the bench times
        // and the int64 minimum and maximum its clock takes.
        let units = 3 * xina::dataplane::wide_units_here(elems, slots).unwrap_or(0);
        let units = units.max(u64::from(xina_proto::maps::DEFAULT_UNITS));
        let config = Config::parse(&format!(
            "[switch]\nports = [{}]\nunits = {units}\n",
            ports.join(", ")
        ))
        .context("the bench's switch configuration")?;
        star.switch()
            .run(|| control::up(&config, &dir, None))?
            .context("bringing the switch up")?;
        let mut switch = Self {
            dir,
            service: None,
            addr: String::new(),
            token: format!("bench-{}", netns::unique_token()).repeat(2),
        };
        star.refresh_redirect_targets()?;
        let text = service_text(
            star,
            30,
            &format!(
                "[[tenants]]\nname = \"bench\"\ntoken = \"{}\"\nmax_jobs = 64\nmax_slots = 1000000\n",
                switch.token
            ),
        );
        let config = ServiceConfig::parse(&text).context("the bench's service file")?;
        let dir = switch.dir.clone();
        let (service, _) = star
            .switch()
            .run(move || Service::new(config, dir))?
            .context("starting the job service")?;
        let service = Arc::new(service);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, addr) = mpsc::channel();
        let listen = service.config().file.listen;
        let s = Arc::clone(&service);
        let thread = star.switch().spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = bound.send(Err(anyhow::Error::from(e)));
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::bind(listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = bound.send(Err(e.into()));
                        return;
                    }
                };
                let _ = bound.send(listener.local_addr().map_err(Into::into));
                if let Err(e) = service::run(s, listener, async move {
                    let _ = stopped.await;
                })
                .await
                {
                    log::error!("the bench's job service: {e}");
                }
            });
        })?;
        let addr = addr
            .recv()
            .context("the job service's thread ended")?
            .context("the job service's listener")?;
        switch.addr = addr.to_string();
        switch.service = Some((service, stop, thread));
        Ok(switch)
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        if let Some((_, stop, thread)) = self.service.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
        if let Err(e) = control::down(&self.dir) {
            log::warn!("taking the bench's switch down: {e}");
        }
    }
}

/// The Rust API's column: one thread per rank in its worker namespace,
/// each with a [`Worker`] of a job leased from the same service, timed as
/// the MPI program times itself (first rank out of a barrier to the last
/// rank done, over back-to-back calls), so that the PMPI library's own
/// cost shows.
struct RustRanks {
    commands: Vec<mpsc::Sender<(usize, usize)>>,
    results: mpsc::Receiver<Result<(Instant, Instant), String>>,
    threads: Vec<JoinHandle<()>>,
    job: u32,
}

/// The UDP port of every rank of the Rust column.
const RUST_PORT: u16 = 7000;

impl RustRanks {
    fn start(star: &Star, switch: &Switch, slots: u32) -> anyhow::Result<Self> {
        let (service, ..) = switch.service.as_ref().context("the job service is gone")?;
        let members = star
            .workers()
            .iter()
            .map(|w| service::MemberRequest {
                ip: w.ip,
                port: RUST_PORT,
                mac: Some(w.mac.to_string()),
                sender: None,
            })
            .collect();
        let request = service::JobRequest {
            mode: xina::config::ModeName::Allreduce,
            op: None,
            dtype: None,
            elems_per_packet: None,
            bytes_per_packet: None,
            slots: Some(slots),
            window: None,
            members,
        };
        let s = Arc::clone(service);
        let created = star
            .switch()
            .run(move || s.create(0, &request))?
            .map_err(|e| anyhow::anyhow!("leasing the Rust column's job: {}", e.message))?;
        let job = created.job;
        let ranks = star.workers().len();
        let barrier = Arc::new(Barrier::new(ranks));
        let (done, results) = mpsc::channel();
        let mut commands = Vec::with_capacity(ranks);
        let mut threads = Vec::with_capacity(ranks);
        for (r, w) in star.workers().iter().enumerate() {
            let params = JobParams {
                job: job.id,
                rank: u8::try_from(r)?,
                fan_in: u8::try_from(ranks)?,
                elems_per_packet: job.elems_per_packet,
                slots: job.slot_count,
                op: xina_proto::Op::Sum,
                dtype: DType::I32,
                mode: xina_host::Mode::Allreduce,
                switch: created.switch_addr,
            };
            let bind = std::net::SocketAddrV4::new(w.ip, RUST_PORT);
            let (tx, rx) = mpsc::channel::<(usize, usize)>();
            let (done, barrier) = (done.clone(), Arc::clone(&barrier));
            threads.push(w.ns().spawn(move || {
                let mut worker =
                    match xina_host::Worker::new(params, bind, xina_host::Config::default()) {
                        Ok(w) => w,
                        Err(e) => {
                            let _ = done.send(Err(format!("rank {r}: {e}")));
                            return;
                        }
                    };
                for (bytes, iters) in rx {
                    let _ = done.send(rust_rep(&mut worker, &barrier, r, ranks, bytes, iters));
                }
            })?);
            commands.push(tx);
        }
        Ok(Self {
            commands,
            results,
            threads,
            job: job.id,
        })
    }

    /// One repetition: `iters` calls of `bytes` per rank; the time per call.
    fn rep(&self, bytes: usize, iters: usize) -> anyhow::Result<Duration> {
        for c in &self.commands {
            c.send((bytes, iters))
                .context("a rank of the Rust column is gone")?;
        }
        let mut first: Option<Instant> = None;
        let mut last: Option<Instant> = None;
        for _ in &self.commands {
            let (start, end) = self
                .results
                .recv_timeout(ANSWER_TIMEOUT)
                .context("a rank of the Rust column did not answer")?
                .map_err(|e| anyhow::anyhow!("the Rust column: {e}"))?;
            first = Some(first.map_or(start, |f| f.min(start)));
            last = Some(last.map_or(end, |l| l.max(end)));
        }
        let span = last.zip(first).map(|(l, f)| l - f).unwrap_or_default();
        Ok(span / u32::try_from(iters.max(1)).unwrap_or(u32::MAX))
    }
}

impl Drop for RustRanks {
    fn drop(&mut self) {
        self.commands.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One rank's repetition: a warm-up call, the barrier, `iters` calls timed;
/// the result checked after the clock stops.
fn rust_rep(
    worker: &mut xina_host::Worker,
    barrier: &Barrier,
    rank: usize,
    ranks: usize,
    bytes: usize,
    iters: usize,
) -> Result<(Instant, Instant), String> {
    let n = bytes / 4;
    let fill = |buf: &mut Vec<i32>| {
        buf.clear();
        buf.extend(
            (0..n).map(|i| i32::try_from(i % 1000).unwrap_or(0) + i32::try_from(rank).unwrap_or(0)),
        );
    };
    let mut buf = Vec::with_capacity(n);
    fill(&mut buf);
    worker
        .allreduce_i32(&mut buf)
        .map_err(|e| format!("rank {rank}: {e}"))?;
    barrier.wait();
    let start = Instant::now();
    for _ in 0..iters {
        fill(&mut buf);
        worker
            .allreduce_i32(&mut buf)
            .map_err(|e| format!("rank {rank}: {e}"))?;
    }
    let end = Instant::now();
    let ranks_sum = i32::try_from(ranks * (ranks - 1) / 2).unwrap_or(0);
    let r = i32::try_from(ranks).unwrap_or(0);
    for (i, v) in buf.iter().enumerate() {
        let want = r * i32::try_from(i % 1000).unwrap_or(0) + ranks_sum;
        if *v != want {
            return Err(format!("rank {rank}: element {i} is {v}, not {want}"));
        }
    }
    Ok((start, end))
}

/// Runs the sweep; `xina_c_dir` holds `libxina_c.so`; `progress` gets a
/// line per measurement.
///
/// # Errors
/// When Open MPI is missing, a topology or the switch cannot be set up, or
/// a command fails (a wrong result aborts the program: the error has its
/// message).
pub fn run(
    spec: &MpiBenchSpec,
    xina_c_dir: &Path,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<Record>> {
    spec.validate()?;
    ensure!(
        crate::mpi::available(),
        "mpirun and mpicc are needed (Debian: openmpi-bin libopenmpi-dev)"
    );
    progress("compiling the benchmark program and the PMPI library");
    let program = MpiProgram::build()?;
    let pmpi = Pmpi::build(xina_c_dir)?;
    let mut records = Vec::new();
    for &ranks in &spec.ranks {
        progress(&format!(
            "{ranks} ranks, MTU {}: building the stars",
            spec.frame
        ));
        let options = StarOptions::new(ranks).with_mtu(spec.frame);
        let star = Star::build_with(options).context("building the XDP star")?;
        let plain = plain::build(options).context("building the plain star")?;
        let result = (|| {
            let switch = Switch::start(&star, spec.frame)?;
            let library = pmpi.library.to_string_lossy().into_owned();
            let url = format!("http://{}", switch.addr);
            let elems = frame::elems_for_mtu(DType::I32, spec.frame as usize);
            let slots = window_for(elems).to_string();
            let env = [
                ("LD_PRELOAD", library.as_str()),
                ("XINA_SERVICE", url.as_str()),
                ("XINA_TOKEN", switch.token.as_str()),
                ("XINA_MPI_SLOTS", slots.as_str()),
                ("XINA_MPI_VERBOSE", "1"),
            ];
            let mut mpi = MpiJob::start(&program, &plain, ANSWER_TIMEOUT)
                .context("starting Open MPI on the plain star")?;
            let mut xina = MpiJob::start_with_env(&program, &star, ANSWER_TIMEOUT, &[], &env)
                .context("starting the program through xina on the XDP star")?;
            let rust = if spec.colls.contains(&Coll::Allreduce) {
                Some(RustRanks::start(&star, &switch, window_for(elems))?)
            } else {
                None
            };
            for &coll in &spec.colls {
                for &bytes in &spec.sizes {
                    let iters = match coll {
                        Coll::Allreduce => iters_for(bytes),
                        Coll::Bcast => iters_for(bytes).min(20),
                    };
                    let (mut m, mut x, mut rs) = (Vec::new(), Vec::new(), Vec::new());
                    for rep in 0..spec.reps {
                        if let (Coll::Allreduce, Some(rust)) = (coll, &rust) {
                            let (service, ..) =
                                switch.service.as_ref().context("the job service is gone")?;
                            service.renew(0, rust.job).map_err(|e| {
                                anyhow::anyhow!("renewing the Rust column's job: {}", e.message)
                            })?;
                            rs.push(rust.rep(bytes, iters).with_context(|| {
                                format!(
                                    "the Rust API's allreduce of {} at {ranks} ranks",
                                    format_size(bytes)
                                )
                            })?);
                        }
                        // Alternate which goes first.
                        for first in [rep % 2 == 0, rep % 2 == 1] {
                            let (job, into) = if first {
                                (&mut mpi, &mut m)
                            } else {
                                (&mut xina, &mut x)
                            };
                            let answer = match coll {
                                Coll::Allreduce => job.allreduce_i32(bytes, iters, 1),
                                Coll::Bcast => job.bcast(bytes, iters, 1),
                            }
                            .with_context(|| {
                                format!(
                                    "{} {} of {} at {ranks} ranks",
                                    if first { "Open MPI's" } else { "xina's" },
                                    coll.name(),
                                    format_size(bytes)
                                )
                            })?;
                            into.extend(answer.samples);
                        }
                    }
                    let per = match coll {
                        Coll::Allreduce => iters,
                        Coll::Bcast => 1,
                    };
                    let at = (ranks, bytes, spec.frame, per);
                    let (rm, rx) = (
                        Record::new(coll, "mpi", at, &m),
                        Record::new(coll, "xina", at, &x),
                    );
                    progress(&format!(
                        "{} {} at {ranks} ranks: mpi {:.1} us, xina {:.1} us",
                        coll.name(),
                        format_size(bytes),
                        rm.avg_us,
                        rx.avg_us
                    ));
                    records.push(rm);
                    records.push(rx);
                    if !rs.is_empty() {
                        let rr = Record::new(coll, "xina-rust", at, &rs);
                        progress(&format!("  the Rust API: {:.1} us", rr.avg_us));
                        records.push(rr);
                    }
                }
            }
            drop(rust);
            drop(xina);
            drop(mpi);
            drop(switch);
            anyhow::Ok(())
        })();
        plain.teardown().context("tearing the plain star down")?;
        star.teardown().context("tearing the XDP star down")?;
        result?;
    }
    Ok(records)
}

fn find<'a>(
    records: &'a [Record],
    coll: Coll,
    imp: &str,
    ranks: usize,
    bytes: usize,
) -> Option<&'a Record> {
    records
        .iter()
        .find(|r| r.coll == coll && r.implementation == imp && r.ranks == ranks && r.bytes == bytes)
}

/// Open MPI's average over xina's: how many times faster xina is.
pub fn ratio(records: &[Record], coll: Coll, ranks: usize, bytes: usize) -> Option<f64> {
    let m = find(records, coll, "mpi", ranks, bytes)?;
    let x = find(records, coll, "xina", ranks, bytes)?;
    (x.avg_us > 0.0).then(|| m.avg_us / x.avg_us)
}

/// The PMPI library's time over the Rust API's, minus one: its own cost.
pub fn library_cost(records: &[Record], ranks: usize, bytes: usize) -> Option<f64> {
    let x = find(records, Coll::Allreduce, "xina", ranks, bytes)?;
    let r = find(records, Coll::Allreduce, "xina-rust", ranks, bytes)?;
    (r.avg_us > 0.0).then(|| x.avg_us / r.avg_us - 1.0)
}

/// The OSU-style table of `coll` at `ranks`.
pub fn table(records: &[Record], coll: Coll, ranks: usize) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:>9} | {:>28} | {:>28} | {:>9} | {:>9} {:>9} | {:>6} | {:>8}\n",
        "size",
        "mpi avg/min/max (us)",
        "xina avg/min/max (us)",
        "rust (us)",
        "mpi GB/s",
        "xina GB/s",
        "x mpi",
        "lib cost"
    );
    let mut sizes: Vec<usize> = records
        .iter()
        .filter(|r| r.coll == coll && r.ranks == ranks)
        .map(|r| r.bytes)
        .collect();
    sizes.dedup();
    for bytes in sizes {
        let (Some(m), Some(x)) = (
            find(records, coll, "mpi", ranks, bytes),
            find(records, coll, "xina", ranks, bytes),
        ) else {
            continue;
        };
        let rust = find(records, coll, "xina-rust", ranks, bytes)
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r.avg_us));
        let cost = library_cost(records, ranks, bytes)
            .filter(|_| coll == Coll::Allreduce)
            .map_or_else(|| "-".to_owned(), |c| format!("{:+.1}%", c * 100.0));
        let _ = writeln!(
            out,
            "{:>9} | {:>9.1} {:>9.1} {:>8.1} | {:>9.1} {:>9.1} {:>8.1} | {rust:>9} | {:>9.3} {:>9.3} | {:>6.2} | {cost:>8}",
            format_size(bytes),
            m.avg_us,
            m.min_us,
            m.max_us,
            x.avg_us,
            x.min_us,
            x.max_us,
            m.algbw_gbps,
            x.algbw_gbps,
            ratio(records, coll, ranks, bytes).unwrap_or(0.0)
        );
    }
    out
}

/// Issue 16's speed goals at 8 ranks.
pub fn judge_goals(records: &[Record]) -> Vec<Goal> {
    let goal = |statement: &str, value: Option<f64>, bound: f64, at_least: bool, of: &str| Goal {
        statement: statement.to_owned(),
        value,
        bound,
        at_least,
        met: value.map(|v| if at_least { v >= bound } else { v <= bound }),
        detail: if value.is_some() {
            format!("{of}, average latencies in this run")
        } else {
            "not measured (needs 8 ranks and the size)".to_owned()
        },
    };
    let small = ratio(records, Coll::Allreduce, 8, 8).map(|r| 1.0 / r);
    vec![
        goal(
            "64 MiB MPI_Allreduce at 8 ranks: xina's speed over Open MPI's",
            ratio(records, Coll::Allreduce, 8, 64 << 20),
            GOAL_ALLREDUCE_RATIO,
            true,
            "Open MPI's over xina's",
        ),
        goal(
            "64 MiB MPI_Bcast at 8 ranks: xina's speed over Open MPI's",
            ratio(records, Coll::Bcast, 8, 64 << 20),
            GOAL_BCAST_RATIO,
            true,
            "Open MPI's over xina's",
        ),
        goal(
            "8-byte MPI_Allreduce at 8 ranks: xina's latency over Open MPI's",
            small,
            GOAL_SMALL_LATENCY_FRACTION,
            false,
            "xina's over Open MPI's",
        ),
        goal(
            "64 MiB MPI_Allreduce at 8 ranks: the PMPI library's time over the Rust API's, minus one",
            library_cost(records, 8, 64 << 20),
            GOAL_LIBRARY_COST,
            false,
            "the PMPI library's over the Rust API's, minus one",
        ),
    ]
}

/// What `bench mpi --json` writes.
#[derive(Debug, Serialize)]
pub struct MpiBenchReport {
    pub machine: crate::bench::Machine,
    pub spec: MpiBenchSpec,
    pub goals: Vec<Goal>,
    pub records: Vec<Record>,
}

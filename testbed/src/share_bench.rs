//! `bench share`: jobs sharing one switch and every worker's link.
//!
//! One star of `workers` namespaces; every job has a member in each of them
//! (UDP port 5000 for the first job, 5001 for the second, ...), so all jobs'
//! chunks cross the same worker links and switch ports. With `rate`, every
//! link is shaped both ways ([`crate::shape`]) and the links are what the
//! jobs share; unshaped, they share the CPUs.
//!
//! From one barrier, every job's ranks run `calls` allreduces of `bytes`
//! back to back, each result checked exactly. A job's goodput is what it
//! allreduced (per worker) by the time the first job finished, over that
//! time (the call under way counted by the share of its time that had
//! passed): a job that got more than its share finishes first, and what
//! the other did until then is its share. Jain's index of the goodputs,
//! `(Σx)² / (n·Σx²)`, is 1 for equal shares and `1/n` when one job takes
//! everything.
//!
//! A *stalled* job (`stall`) has one rank that never calls: its other ranks
//! must fail naming the job and the outstanding chunks after their give-up
//! time, and the other jobs must finish as they would alone.

use std::net::SocketAddrV4;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use xina_host::{JobParams, Mode, Worker};
use xina_proto::{DType, XINA_UDP_PORT, frame::elems_for_mtu};

use crate::allreduce_bench::window_for;
use crate::scenario::{self, WORKER_PORT, worker_data};
use crate::shape;
use crate::topology::{MAX_MTU, Star, StarOptions};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ShareSpec {
    /// Jobs sharing the star (2..=8).
    pub jobs: usize,
    /// Workers, each with one member of every job.
    pub workers: usize,
    /// Link MTU: xina's packets take as many elements as it holds.
    pub frame: u32,
    /// Every link shaped to this many Mbit/s both ways; `None`: unshaped.
    pub rate_mbit: Option<u32>,
    /// Bytes per worker per allreduce.
    pub bytes: usize,
    /// Allreduces per job.
    pub calls: usize,
    /// The workers' `Config::queue_target`; `None` keeps every slot open
    /// (no congestion control).
    pub queue_target: Option<Duration>,
    /// The job (index) with a rank that never calls, if any.
    pub stall: Option<usize>,
    /// How long a worker waits without progress before failing.
    pub give_up: Duration,
}

impl Default for ShareSpec {
    fn default() -> Self {
        Self {
            jobs: 2,
            workers: 4,
            frame: 9000,
            rate_mbit: Some(500),
            bytes: 4 << 20,
            calls: 24,
            queue_target: xina_host::Config::default().queue_target,
            stall: None,
            give_up: Duration::from_secs(5),
        }
    }
}

impl ShareSpec {
    /// Checks every field, naming the first bad one.
    ///
    /// # Errors
    /// When a value is out of range.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            (2..=8).contains(&self.jobs),
            "jobs: {} (must be 2..=8)",
            self.jobs
        );
        ensure!(
            (2..=xina_proto::MAX_RANKS).contains(&self.workers),
            "workers: {} (must be 2..={})",
            self.workers,
            xina_proto::MAX_RANKS
        );
        ensure!(
            (1500..=MAX_MTU).contains(&self.frame),
            "frame: {} (must be 1500..={MAX_MTU})",
            self.frame
        );
        if let Some(rate) = self.rate_mbit {
            shape::check_rate(rate, std::iter::once(self.frame))?;
        }
        ensure!(
            self.bytes >= 4 && self.bytes.is_multiple_of(4),
            "bytes: {} is not a positive multiple of 4 (int32 elements)",
            self.bytes
        );
        ensure!(self.calls >= 1, "calls: must be at least 1");
        if let Some(j) = self.stall {
            ensure!(
                j < self.jobs,
                "stall: job {j} (there are {} jobs)",
                self.jobs
            );
        }
        Ok(())
    }

    /// Elements per packet at the frame.
    pub fn elems_per_packet(&self) -> u16 {
        u16::try_from(elems_for_mtu(DType::I32, self.frame as usize)).unwrap_or(u16::MAX)
    }

    /// Each job's slots.
    pub fn slots(&self) -> u32 {
        window_for(usize::from(self.elems_per_packet()))
    }
}

/// How one job did.
#[derive(Clone, Debug, Serialize)]
pub struct JobShare {
    /// The job id on the switch.
    pub job: u32,
    /// Allreduces every rank completed.
    pub calls: usize,
    /// From the barrier to the job's last result, seconds (`None` if it
    /// failed).
    pub seconds: Option<f64>,
    /// Bytes per worker allreduced by the time the first job finished (the
    /// call under way counted by the share of its time that had passed),
    /// over that time, Mbit/s.
    pub goodput_mbit: f64,
    /// Chunks resent, summed over ranks.
    pub retransmits: u64,
    /// The largest congestion window a rank ended with.
    pub window: u32,
    /// The first failure, if the job failed.
    pub error: Option<String>,
}

/// The outcome of a [`run`].
#[derive(Clone, Debug, Serialize)]
pub struct ShareReport {
    pub spec: ShareSpec,
    pub elems_per_packet: u16,
    pub slots: u32,
    pub jobs: Vec<JobShare>,
    /// Jain's index over the jobs that did not stall.
    pub jain: f64,
    /// When the first job finished, seconds after the barrier.
    pub overlap_s: f64,
}

/// Jain's fairness index of `x`: 1 for equal values, `1/n` when one value
/// holds everything; `NaN` for none or all zero.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    sum * sum / (x.len() as f64 * squares)
}

/// What a rank thread hands back.
struct RankRun {
    job: usize,
    /// When each call returned, after the barrier.
    done: Vec<Instant>,
    retransmits: u64,
    window: u32,
    error: Option<String>,
}

/// Runs the jobs on a fresh star (removed before returning, also on error).
///
/// # Errors
/// When the star, the shapers or the switch cannot be set up, or a rank
/// cannot bind. A job whose allreduce fails or returns a wrong result is
/// reported in its [`JobShare`], not as an error.
pub fn run(spec: &ShareSpec) -> anyhow::Result<ShareReport> {
    spec.validate()?;
    let star = Star::build_with(StarOptions::new(spec.workers).with_mtu(spec.frame))
        .context("building the star")?;
    let result = run_on(&star, spec);
    star.teardown().context("tearing the star down")?;
    result
}

fn run_on(star: &Star, spec: &ShareSpec) -> anyhow::Result<ShareReport> {
    if let Some(rate) = spec.rate_mbit {
        shape::shape(star, rate).context("shaping the star")?;
    }
    let (elems, slots) = (spec.elems_per_packet(), spec.slots());
    let _dp = scenario::start_switch(star, &config(star, spec.jobs, elems, slots))?;
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let len = spec.bytes / 4;
    let inputs: Vec<Vec<Vec<i32>>> = (0..spec.jobs)
        .map(|j| {
            (0..spec.workers)
                .map(|r| worker_data(j as u64 + 1, r, len))
                .collect()
        })
        .collect();
    let expected: Vec<Arc<Vec<i32>>> = inputs
        .iter()
        .map(|job| {
            Arc::new(
                (0..len)
                    .map(|i| job.iter().map(|v| v[i]).sum())
                    .collect::<Vec<i32>>(),
            )
        })
        .collect();
    let stalled = |j: usize, rank: usize| spec.stall == Some(j) && rank == spec.workers - 1;
    let callers = spec.jobs * spec.workers - usize::from(spec.stall.is_some());
    let barrier = Barrier::new(callers);
    let mut runs = Vec::new();
    let mut start = None;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for (j, job_inputs) in inputs.iter().enumerate() {
            for (rank, input) in job_inputs.iter().enumerate() {
                if stalled(j, rank) {
                    continue;
                }
                let params = JobParams {
                    job: job_id(j),
                    rank: u8::try_from(rank).context("rank")?,
                    fan_in: u8::try_from(spec.workers).context("workers")?,
                    elems_per_packet: elems,
                    slots,
                    op: xina_proto::Op::Sum,
                    dtype: DType::I32,
                    mode: Mode::Allreduce,
                    switch,
                };
                let w = star.worker(rank);
                let bind = SocketAddrV4::new(w.ip, member_port(j));
                let (barrier, expected) = (&barrier, Arc::clone(&expected[j]));
                handles.push(scope.spawn(move || -> anyhow::Result<(RankRun, Instant)> {
                    w.ns()
                        .run(|| rank_run(spec, j, params, bind, input, &expected, barrier))
                        .map_err(|e| anyhow::anyhow!("{e:#}"))?
                }));
            }
        }
        for h in handles {
            let (run, began) = h
                .join()
                .map_err(|_| anyhow::anyhow!("a rank thread panicked"))??;
            start = Some(start.map_or(began, |s: Instant| s.min(began)));
            runs.push(run);
        }
        Ok(())
    })?;
    let start = start.context("no ranks ran")?;
    Ok(report(spec, elems, slots, start, &runs))
}

/// One rank: binds, waits at the barrier, runs the calls.
fn rank_run(
    spec: &ShareSpec,
    job: usize,
    params: JobParams,
    bind: SocketAddrV4,
    input: &[i32],
    expected: &[i32],
    barrier: &Barrier,
) -> anyhow::Result<(RankRun, Instant)> {
    let config = xina_host::Config {
        give_up: spec.give_up,
        queue_target: spec.queue_target,
        ..Default::default()
    };
    let worker = Worker::new(params, bind, config)
        .with_context(|| format!("job {}, rank {}: worker", params.job, params.rank));
    let Ok(mut worker) = worker else {
        // The others must not wait for this rank at the barrier forever.
        barrier.wait();
        return worker.map(|_| unreachable!());
    };
    let mut buf = input.to_vec();
    barrier.wait();
    let began = Instant::now();
    let mut run = RankRun {
        job,
        done: Vec::with_capacity(spec.calls),
        retransmits: 0,
        window: 0,
        error: None,
    };
    for call in 0..spec.calls {
        buf.copy_from_slice(input);
        match worker.allreduce_i32(&mut buf) {
            Ok(stats) => {
                run.retransmits += stats.retransmissions;
                run.window = stats.window;
            }
            Err(e) => {
                run.error = Some(format!("call {call}: {e}"));
                break;
            }
        }
        if buf != expected {
            run.error = Some(format!("call {call}: wrong result"));
            break;
        }
        run.done.push(Instant::now());
    }
    Ok((run, began))
}

fn report(
    spec: &ShareSpec,
    elems_per_packet: u16,
    slots: u32,
    start: Instant,
    runs: &[RankRun],
) -> ShareReport {
    // A job's call is done when its last rank has the result.
    let jobs: Vec<Vec<Instant>> = (0..spec.jobs)
        .map(|j| {
            let mine: Vec<&RankRun> = runs.iter().filter(|r| r.job == j).collect();
            let calls = mine.iter().map(|r| r.done.len()).min().unwrap_or(0);
            (0..calls)
                .map(|c| mine.iter().map(|r| r.done[c]).max().unwrap_or(start))
                .collect()
        })
        .collect();
    let healthy = |j: usize| spec.stall != Some(j);
    let finished = |j: usize| {
        let done = &jobs[j];
        (done.len() == spec.calls)
            .then(|| done.last().copied())
            .flatten()
    };
    let first_end = (0..spec.jobs)
        .filter(|&j| healthy(j))
        .filter_map(finished)
        .min();
    let overlap = first_end.map_or(Duration::ZERO, |t| t.duration_since(start));
    let shares: Vec<JobShare> = (0..spec.jobs)
        .map(|j| {
            let mine = runs.iter().filter(|r| r.job == j);
            let calls_by_end = first_end.map_or(0.0, |end| progress(&jobs[j], start, end));
            let bits = calls_by_end * (spec.bytes * 8) as f64;
            JobShare {
                job: job_id(j),
                calls: jobs[j].len(),
                seconds: finished(j).map(|t| t.duration_since(start).as_secs_f64()),
                goodput_mbit: if overlap.is_zero() {
                    0.0
                } else {
                    bits / overlap.as_secs_f64() / 1e6
                },
                retransmits: mine.clone().map(|r| r.retransmits).sum(),
                window: mine.clone().map(|r| r.window).max().unwrap_or(0),
                error: mine.filter_map(|r| r.error.clone()).next(),
            }
        })
        .collect();
    let goodputs: Vec<f64> = shares
        .iter()
        .enumerate()
        .filter(|(j, _)| healthy(*j))
        .map(|(_, s)| s.goodput_mbit)
        .collect();
    ShareReport {
        spec: spec.clone(),
        elems_per_packet,
        slots,
        jain: jain(&goodputs),
        overlap_s: overlap.as_secs_f64(),
        jobs: shares,
    }
}

/// How many calls a job whose calls returned at `done` had made by `at`,
/// counting the call under way by the share of its time that had passed
/// (a call's chunks flow steadily): whole calls alone would credit a job
/// that is one chunk from the end of a call with nothing for it.
fn progress(done: &[Instant], start: Instant, at: Instant) -> f64 {
    let whole = done.iter().filter(|&&t| t <= at).count();
    let Some(&next) = done.get(whole) else {
        return whole as f64;
    };
    let began = if whole == 0 { start } else { done[whole - 1] };
    let part = at.saturating_duration_since(began).as_secs_f64()
        / next
            .saturating_duration_since(began)
            .as_secs_f64()
            .max(1e-9);
    whole as f64 + part.min(1.0)
}

/// The switch id of job number `j`.
fn job_id(j: usize) -> u32 {
    scenario::JOB_ID + u32::try_from(j).unwrap_or(u32::MAX)
}

/// The UDP port of job number `j`'s members.
fn member_port(j: usize) -> u16 {
    WORKER_PORT + u16::try_from(j).unwrap_or(u16::MAX)
}

/// The switch file: every port, `jobs` allreduce jobs with a member on
/// every worker, `slots` each.
fn config(star: &Star, jobs: usize, elems: u16, slots: u32) -> String {
    use std::fmt::Write as _;
    let ports: Vec<String> = star
        .ports()
        .iter()
        .map(|p| format!("{:?}", p.name))
        .collect();
    let total = slots * u32::try_from(jobs).unwrap_or(u32::MAX);
    let pool = total.max(xina_proto::maps::DEFAULT_SLOT_POOL);
    let units = xina::dataplane::wide_units_here(elems, slots)
        .unwrap_or(0)
        .saturating_mul(jobs as u64)
        .max(u64::from(xina_proto::maps::DEFAULT_UNITS));
    let mut toml = format!(
        "[switch]\nports = [{}]\nslot_pool = {pool}\nunits = {units}\n\n",
        ports.join(", ")
    );
    for j in 0..jobs {
        let _ = writeln!(
            toml,
            "[[jobs]]\nid = {}\nelems_per_packet = {elems}\nslot_base = {}\nslot_count = {slots}\n",
            job_id(j),
            slots * u32::try_from(j).unwrap_or(0)
        );
        for w in star.workers() {
            scenario::member_entry(&mut toml, star, w, member_port(j));
        }
    }
    toml
}

/// The report as a table.
pub fn table(report: &ShareReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| job | calls | time | goodput until the first finished | retransmits | window | outcome |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---|");
    for s in &report.jobs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} Mbit/s | {} | {} | {} |",
            s.job,
            s.calls,
            s.seconds
                .map_or_else(|| "-".to_owned(), |t| format!("{t:.3} s")),
            s.goodput_mbit,
            s.retransmits,
            s.window,
            s.error.as_deref().unwrap_or("ok")
        );
    }
    let _ = writeln!(
        out,
        "Jain's index {:.3} over {:.3} s (the jobs that did not stall)",
        report.jain, report.overlap_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_the_call_under_way_by_its_elapsed_share() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let done = [t + ms(10), t + ms(20), t + ms(40)];
        assert!((progress(&done, t, t + ms(5)) - 0.5).abs() < 1e-9);
        assert!((progress(&done, t, t + ms(20)) - 2.0).abs() < 1e-9);
        assert!((progress(&done, t, t + ms(30)) - 2.5).abs() < 1e-9);
        assert!((progress(&done, t, t + ms(50)) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() {
        assert!((jain(&[3.0, 3.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[4.0, 0.0]) - 0.5).abs() < 1e-12);
        assert!((jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
    }
}

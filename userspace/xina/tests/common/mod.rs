//! The `BPF_PROG_TEST_RUN` harness shared by the dataplane and group tests:
//! one loaded dataplane per test binary, and a frame run through a program
//! with the counters it moved, checked exactly.

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use xina::{Counters, Dataplane, JobSpec, LoadOptions, dataplane::TestOutput};
use xina_proto::counters::Counter;

/// The binary's dataplane, loaded once with a pool of `pool` slots (the
/// first caller's), shared by its tests one at a time. Each test installs
/// its own jobs and removes them; a test that failed while holding the lock
/// leaves only its own jobs behind.
pub fn shared(pool: u32) -> MutexGuard<'static, Dataplane> {
    static DP: OnceLock<Mutex<Dataplane>> = OnceLock::new();
    DP.get_or_init(|| {
        Mutex::new(
            Dataplane::load(LoadOptions {
                slot_pool: pool,
                debug: false,
                ..LoadOptions::default()
            })
            .expect("load (are you root?)"),
        )
    })
    .lock()
    .unwrap_or_else(PoisonError::into_inner)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Nonzero counters as (name, value), in index order.
pub fn nonzero(c: &Counters) -> Vec<(&'static str, u64)> {
    Counter::ALL
        .iter()
        .filter(|k| c.get(**k) != 0)
        .map(|k| (k.name(), c.get(*k)))
        .collect()
}

/// One frame through a program, with the counters it moved.
pub struct Step {
    pub out: TestOutput,
    /// Switch-wide counter deltas.
    pub all: Counters,
    /// Deltas of the job's (or group's) own block.
    pub own: Counters,
    /// Whether it ran the ingress program (which counts `rx_packets`).
    pub ingress: bool,
}

impl Step {
    /// Checks the action and that exactly the counters `counted` moved, by
    /// one each (with `rx_packets` on ingress), switch-wide and — when `own`,
    /// that is once the frame's job is known — in the job's block (else that
    /// block did not move). On ingress exactly one of the moved counters is
    /// an outcome, so the outcomes add up to `rx_packets`.
    #[track_caller]
    pub fn expect(self, action: u32, counted: &[Counter], own: bool, what: &str) -> TestOutput {
        assert_eq!(self.out.action, action, "{what}: XDP action");
        let want: Vec<(&'static str, u64)> = Counter::ALL
            .iter()
            .filter(|c| counted.contains(c) || (self.ingress && **c == Counter::RxPackets))
            .map(|c| (c.name(), 1))
            .collect();
        assert_eq!(nonzero(&self.all), want, "{what}: counters");
        let own_want = if own { want } else { Vec::new() };
        assert_eq!(
            nonzero(&self.own),
            own_want,
            "{what}: the job's own counters"
        );
        if self.ingress {
            let outcomes: u64 = Counter::ALL
                .iter()
                .filter(|c| c.is_ingress_outcome())
                .map(|c| self.all.get(*c))
                .sum();
            assert_eq!(outcomes, 1, "{what}: exactly one outcome");
        }
        self.out
    }
}

/// Runs `f` through the ingress program, `job`'s counter block read around it.
pub fn ingress(dp: &mut Dataplane, job: &JobSpec, f: &[u8]) -> Step {
    let (all, own) = (dp.counters().unwrap(), dp.job_counters(job.id).unwrap());
    let out = dp.test_run_switch(f, 0).unwrap();
    Step {
        out,
        all: dp.counters().unwrap().delta(&all),
        own: dp.job_counters(job.id).unwrap().delta(&own),
        ingress: true,
    }
}

/// Runs `f` through the egress program as if it left through `ifindex`.
pub fn egress(dp: &mut Dataplane, job: &JobSpec, f: &[u8], ifindex: u32) -> Step {
    let (all, own) = (dp.counters().unwrap(), dp.job_counters(job.id).unwrap());
    let out = dp.test_run_egress(f, ifindex).unwrap();
    Step {
        out,
        all: dp.counters().unwrap().delta(&all),
        own: dp.job_counters(job.id).unwrap().delta(&own),
        ingress: false,
    }
}

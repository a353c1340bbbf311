//! Unmodified MPI programs through the switch (root, Open MPI's `mpirun`
//! and `mpicc`): the PMPI library (`userspace/xina-mpi`) preloaded into
//! every rank of an MPI job that spans a star's namespaces, its jobs leased
//! from `xina serve`. The testbed's check program compares every
//! intercepted call with the `PMPI_` call's result.
//!
//! ```text
//!   rank 0..3, one per worker namespace ── switch (XDP) ── xina serve
//!   mpirun -x LD_PRELOAD=libxina_mpi.so -x XINA_SERVICE -x XINA_TOKEN
//! ```

mod pinned;

use std::{
    path::PathBuf,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use pinned::{Guard, Serve, Xina, installed};
use xina_testbed::{
    pmpi::{Ended, MpiRun, Pmpi},
    topology::Star,
};

const RANKS: usize = 4;
const TOKEN: &str = "mpi-tenant-secret-0001";
/// How long the check program may take (hundreds of collectives on a
/// 2-CPU machine, each also run by MPI).
const CHECK_TIMEOUT: Duration = Duration::from_secs(600);

/// One MPI test at a time: each runs a rank per namespace on every CPU.
static SERIAL: Mutex<()> = Mutex::new(());

/// Where cargo put `libxina_c.so` (a dev-dependency of this crate), next to
/// this test binary.
fn xina_c_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    assert!(
        deps.join("libxina_c.so").exists(),
        "libxina_c.so not built in {}",
        deps.display()
    );
    deps
}

/// A star with a pinned switch (a pool of 4,096 slots) and the PMPI
/// library built.
struct Bed {
    star: Star,
    guard: Guard,
    name: String,
    pmpi: Pmpi,
}

impl Bed {
    fn new() -> Self {
        let star = Star::build(RANKS).unwrap();
        let mut guard = Guard::new("t-mpi-");
        let name = guard.pins.name().to_owned();
        let switch_file = guard.switch_file(&star, 4096);
        let bed = Self {
            pmpi: Pmpi::build(&xina_c_dir()).unwrap(),
            star,
            guard,
            name,
        };
        bed.xina()
            .ok(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
        bed.star.refresh_redirect_targets().unwrap();
        bed
    }

    fn xina(&self) -> Xina<'_> {
        Xina {
            ns: self.star.switch().name(),
            name: &self.name,
        }
    }

    fn serve(&mut self, lease_secs: u64) -> Serve {
        let text = xina_testbed::pmpi::service_text(
            &self.star,
            lease_secs,
            &format!(
                "[[tenants]]\nname = \"mpi\"\ntoken = \"{TOKEN}\"\nmax_jobs = 40\nmax_slots = 4096\n"
            ),
        );
        let file = self.guard.file(&text);
        let xina = Xina {
            ns: self.star.switch().name(),
            name: &self.name,
        };
        Serve::start(&xina, &file)
    }

    /// The check program with the library preloaded, talking to `service`.
    fn check(&self, service: &str, args: &[&str], extra: &[(&str, &str)]) -> MpiRun {
        let library = self.pmpi.library.to_str().unwrap();
        let url = format!("http://{service}");
        let mut env = vec![
            ("LD_PRELOAD", library),
            ("XINA_SERVICE", url.as_str()),
            ("XINA_TOKEN", TOKEN),
            ("XINA_MPI_STATS", "1"),
        ];
        env.extend_from_slice(extra);
        MpiRun::start(&self.star, &self.pmpi.check, args, &env).unwrap()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.xina().command(&["switch", "down"]).output();
    }
}

/// Each rank's `(through the switch, all)` counts of `call`, from the
/// library's `XINA_MPI_STATS` lines.
fn counts(ended: &Ended, call: &str) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = ended
        .stderr
        .iter()
        .filter(|l| l.starts_with("xina-mpi: rank ") && l.contains("(through the switch/all)"))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == call).unwrap() + 1;
            let (a, b) = words[at].split_once('/').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    out.sort_unstable();
    out
}

fn explain(ended: &Ended) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        ended.status,
        ended.stdout.join("\n"),
        ended.stderr.join("\n")
    )
}

/// The check program ran to its end and found every result right.
fn assert_passed(ended: &Ended) {
    for line in ended.stdout.iter().chain(&ended.stderr) {
        println!("{line}");
    }
    assert!(ended.status.success(), "{}", explain(ended));
    assert!(
        ended
            .stdout
            .iter()
            .any(|l| l.starts_with("xina-mpi-check: ok ")),
        "{}",
        explain(ended)
    );
}

/// The check program passed, and every rank made every kind of call both
/// through the switch and (for what the switch does not take) on MPI.
fn assert_checked_through_the_switch(ended: &Ended) {
    assert_passed(ended);
    for call in [
        "allreduce",
        "reduce",
        "reduce_scatter_block",
        "barrier",
        "bcast",
        "allgather",
    ] {
        let c = counts(ended, call);
        assert_eq!(c.len(), RANKS, "{call}: {}", explain(ended));
        assert!(
            c.iter().all(|&(through, _)| through > 0),
            "{call}: {c:?}\n{}",
            explain(ended)
        );
    }
    // Double sums, integer products, float maxima and a split communicator
    // went to MPI.
    assert!(
        counts(ended, "allreduce")
            .iter()
            .all(|&(t, all)| all >= t + 4),
        "{}",
        explain(ended)
    );
}

/// `jobs` MPI jobs of the check program at once, each through the switch.
fn checks_at_once(jobs: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut bed = Bed::new();
    let serve = bed.serve(30);
    let runs: Vec<MpiRun> = (0..jobs)
        .map(|_| bed.check(&serve.addr, &[], &[]))
        .collect();
    for run in runs {
        assert_checked_through_the_switch(&run.wait(CHECK_TIMEOUT).unwrap());
    }
    // MPI_Finalize released every job.
    assert!(installed(&bed.xina()).is_empty());
    assert!(serve.stop());
}

#[test]
fn mpi_calls_through_the_switch_give_what_pmpi_gives() {
    checks_at_once(1);
}

#[test]
fn two_mpi_jobs_at_once_share_the_switch() {
    checks_at_once(2);
}

/// The check program passes with every call on MPI, said once on stderr
/// with `reason`.
fn assert_all_on_mpi(ended: &Ended, reason: &str) {
    assert_passed(ended);
    let said: Vec<&String> = ended.stderr.iter().filter(|l| l.contains(reason)).collect();
    assert_eq!(said.len(), 1, "said once: {}", explain(ended));
    for call in ["allreduce", "bcast", "barrier"] {
        assert!(
            counts(ended, call)
                .iter()
                .all(|&(through, all)| through == 0 && all > 0),
            "{call}: {}",
            explain(ended)
        );
    }
}

#[test]
fn with_the_service_down_every_call_goes_to_mpi() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let bed = Bed::new();
    // Nothing listens on port 1 of the switch host.
    let service = format!("{}:1", bed.star.control_ip());
    let ended = bed.check(&service, &[], &[]).wait(CHECK_TIMEOUT).unwrap();
    assert_all_on_mpi(&ended, "no xina switch");
    assert!(installed(&bed.xina()).is_empty());
}

#[test]
fn under_mpi_thread_multiple_every_call_goes_to_mpi() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut bed = Bed::new();
    let serve = bed.serve(30);
    let ended = bed
        .check(&serve.addr, &["--thread-multiple"], &[])
        .wait(CHECK_TIMEOUT)
        .unwrap();
    assert_all_on_mpi(&ended, "MPI_THREAD_MULTIPLE");
    assert!(installed(&bed.xina()).is_empty());
    assert!(serve.stop());
}

#[test]
fn a_rank_killed_mid_allreduce_ends_the_job_and_its_lease_lapses() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut bed = Bed::new();
    let lease_secs = 2;
    let serve = bed.serve(lease_secs);
    let mut run = bed.check(
        &serve.addr,
        &["--only-allreduce"],
        &[("XINA_MPI_GIVE_UP_MS", "3000")],
    );
    run.wait_for_line("xina-mpi-check: looping", Duration::from_secs(120))
        .unwrap();
    assert_eq!(installed(&bed.xina()).len(), 1);
    std::thread::sleep(Duration::from_millis(300));
    let victim = bed.star.worker_ns(2).name().to_owned();
    let pids = xina_testbed::netns::run_command("ip", &["netns", "pids", &victim]).unwrap();
    let mut killed = 0;
    for pid in pids.split_whitespace() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "xina_mpi_check" {
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(pid.parse().unwrap(), libc::SIGKILL) };
            killed += 1;
        }
    }
    assert_eq!(killed, 1, "rank 2's process in {victim}: {pids}");
    // The job ends with an error, not a hang.
    let ended = run.wait(Duration::from_secs(60)).unwrap();
    assert!(!ended.status.success(), "{}", explain(&ended));
    // Rank 0, which held the lease, is gone too: the lease lapses and the
    // switch job with it.
    let deadline = Instant::now() + Duration::from_secs(lease_secs * 4);
    while !installed(&bed.xina()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the job outlived its lease: {:?}",
            installed(&bed.xina())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(serve.stop());
}

//! Open MPI's column of the benches and the plain star it runs on (root and
//! `openmpi-bin libopenmpi-dev` needed: `testbed/scripts/ensure-deps.sh`
//! installs them).
//!
//! ```text
//!   XDP star (xina)                       plain star (ring, tree, mpi)
//!   w0 ──┐                                w0 ──┐  mpirun + rank 0
//!   w1 ──┼── switch ns: XDP on each       w1 ──┼── switch ns: bridge only,
//!   w2 ──┘   port, bridge behind          w2 ──┘   no XDP, TSO on the workers
//! ```
//!
//! Nothing here looks at the timings' values beyond their being positive
//! and consistent with each other. That Open MPI's answers are right is
//! checked inside its program; the last tests make it falsify a result and
//! see the job fail.

use std::time::Duration;

use xina_testbed::{
    allreduce_bench::{self, AllreduceBenchSpec},
    bcast_bench::{self, BcastBenchSpec, Impl},
    ethtool,
    mpi::{self, MpiJob, MpiProgram},
    plain,
    topology::StarOptions,
};

fn require_mpi() {
    assert!(
        mpi::available(),
        "mpirun and mpicc are needed (Debian openmpi-bin libopenmpi-dev; \
         testbed/scripts/ensure-deps.sh installs them)"
    );
}

/// `records` (as JSON) holds exactly one record of `implementation` at
/// `bytes`, on `path`, with a positive time and an algbw that matches it.
fn check_record(json: &serde_json::Value, implementation: &str, bytes: u64, path: &str) {
    let matching: Vec<_> = json
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["impl"] == implementation && r["bytes"].as_u64() == Some(bytes))
        .collect();
    assert_eq!(matching.len(), 1, "{implementation} {bytes} B");
    let r = matching[0];
    assert_eq!(r["path"], path, "{implementation} {bytes} B");
    assert!(r["retransmits"].is_u64(), "{r}");
    let samples = r["times_us"].as_array().unwrap();
    assert!(!samples.is_empty(), "{r}");
    assert!(
        samples
            .iter()
            .all(|t| t.as_f64().is_some_and(|t| t > 0.0 && t.is_finite())),
        "{r}"
    );
    let time = r["time_us"].as_f64().unwrap();
    let algbw = r["algbw_gbps"].as_f64().unwrap();
    assert!(time > 0.0 && time.is_finite(), "time_us {time}");
    let expect = bytes as f64 / time / 1e3;
    assert!((algbw - expect).abs() <= 1e-9 * expect, "algbw {algbw}");
}

#[test]
fn bench_allreduce_has_an_mpi_column_on_the_plain_star() {
    require_mpi();
    let spec = AllreduceBenchSpec {
        workers: vec![2],
        sizes: vec![8, 4096, 1 << 20],
        reps: 2,
        ..Default::default()
    };
    let records = allreduce_bench::run(&spec, |line| eprintln!("{line}")).expect("bench runs");
    assert_eq!(records.len(), 3 * 3, "impl x size");
    let json = serde_json::to_value(&records).unwrap();
    for bytes in [8, 4096, 1 << 20] {
        check_record(&json, "xina", bytes, plain::XDP_PATH);
        check_record(&json, "ring", bytes, plain::PLAIN_PATH);
        check_record(&json, "mpi", bytes, plain::PLAIN_PATH);
    }
    for r in records
        .iter()
        .filter(|r| r.implementation == allreduce_bench::Impl::Mpi)
    {
        assert_eq!((r.workers, r.dtype, r.count), (2, "int32", r.bytes / 4));
        assert_eq!(r.times_us.len(), 2, "one sample per repetition");
        assert_eq!(r.iters, allreduce_bench::iters_for(r.bytes));
    }
    let text = allreduce_bench::table(&records, 1500, 2, 0.0);
    assert!(
        text.contains("mpi on the plain star")
            && text.contains("xina on the xdp switch")
            && text.contains("xina/mpi")
            && text.contains("xina/ring"),
        "{text}"
    );
}

#[test]
fn bench_bcast_has_mpi_rows_on_the_plain_star() {
    require_mpi();
    let spec = BcastBenchSpec {
        ranks: vec![3],
        sizes: vec![4, 1001, 65_536],
        reps: 2,
        impls: vec![Impl::Unicast, Impl::Mpi],
        ..Default::default()
    };
    let records = bcast_bench::run(&spec, |line| eprintln!("{line}")).expect("bench runs");
    assert_eq!(records.len(), 2 * 3, "impl x size");
    let json = serde_json::to_value(&records).unwrap();
    for bytes in [4, 1001, 65_536] {
        check_record(&json, "unicast", bytes, plain::PLAIN_PATH);
        check_record(&json, "mpi", bytes, plain::PLAIN_PATH);
    }
    for r in records.iter().filter(|r| r.implementation == Impl::Mpi) {
        assert_eq!(r.ranks, 3);
        assert_eq!(
            r.times_us.len(),
            r.reps * r.iters,
            "one sample per broadcast"
        );
    }
    let text = bcast_bench::table(&records, 3, 0.0);
    assert!(
        text.contains("x mpi") && text.contains("plain star"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1 + 2 * 3, "{text}");
}

/// The plain star has no XDP program and its workers keep TX checksum
/// offload (so TSO).
#[test]
fn plain_star_has_no_xdp_and_tx_offloads() {
    let star = plain::build(StarOptions::new(2)).expect("plain star");
    assert!(star.ports_with_xdp().unwrap().is_empty());
    for w in star.workers() {
        let on = w.ns().run(|| ethtool::tx_checksum(&w.iface)).unwrap();
        assert!(on.unwrap(), "worker {}: tx checksum offload off", w.rank);
    }
    star.teardown().unwrap();
}

/// A rank that falsifies its result makes the job fail, naming it WRONG;
/// nothing is reported as a time.
#[test]
fn a_wrong_mpi_result_fails_the_run() {
    require_mpi();
    let program = MpiProgram::build().expect("mpicc");
    let star = plain::build(StarOptions::new(2)).expect("plain star");
    let timeout = Duration::from_secs(60);
    for what in ["int32", "float", "bcast"] {
        let mut job = MpiJob::start_with(&program, &star, timeout, &["--corrupt-rank", "1"])
            .expect("mpirun starts");
        let result = match what {
            "int32" => job.allreduce_i32(4096, 2, 1),
            "float" => job.allreduce_f32(4096, 2, 1),
            _ => job.bcast(4096, 2, 1),
        };
        let error = format!("{:#}", result.expect_err("a falsified result must fail"));
        assert!(error.contains("WRONG"), "{what}: {error}");
    }
    // Without falsification the same commands answer.
    let mut job = MpiJob::start(&program, &star, timeout).expect("mpirun starts");
    assert_eq!(job.allreduce_i32(4096, 2, 3).unwrap().samples.len(), 3);
    assert_eq!(job.allreduce_f32(1 << 20, 1, 2).unwrap().samples.len(), 2);
    assert_eq!(job.bcast(4096, 2, 3).unwrap().samples.len(), 6);
    drop(job);
    star.teardown().unwrap();
}

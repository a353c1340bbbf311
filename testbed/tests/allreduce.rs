//! Allreduce through the XDP switch with real traffic between network
//! namespaces (root needed).
//!
//! ```text
//!   w0 (10.77.0.1) ──┐
//!   w1 (10.77.0.2) ──┤   switch namespace: xina_switch on every port,
//!   w2 (10.77.0.3) ──┼── job 1 = {w0..w3}, service address 10.77.0.254
//!   w3 (10.77.0.4) ──┘
//! ```

use std::time::{Duration, Instant};

use xina_proto::counters::Counter;
use xina_testbed::scenario::{
    AllreduceSpec, ElementType, Kill, Loss, RunOptions, run_allreduce, run_allreduce_with,
};

/// Four workers, a million random int32 each: every worker gets exactly the
/// element-wise sum, and the switch's counters show the sum was made there.
#[test]
fn four_workers_allreduce_a_million_int32_in_the_switch() {
    let spec = AllreduceSpec {
        workers: 4,
        elements: 1_000_000,
        seed: 7,
        ..Default::default()
    };
    let report = run_allreduce(&spec).expect("scenario runs");
    print!("{}", report.table());
    for w in &report.workers {
        assert!(
            w.correct,
            "rank {}: {:?} (first mismatch {:?})",
            w.rank, w.error, w.first_mismatch
        );
    }
    assert_eq!(report.workers.len(), 4);
    // 3907 data chunks and the call check.
    assert_eq!(report.chunks, 3908);
    // Each contribution reached the switch and counted once, each chunk
    // completed once there, and one copy per worker left it (plus a copy per
    // retransmission answered from a slot, if a worker was not scheduled in
    // time): the sum cannot have been made anywhere else.
    assert_eq!(report.switch_accounting_error(), None);
    assert_eq!(report.counter(Counter::Contributions), 4 * 3908);
    assert_eq!(report.counter(Counter::Completed), 3908);
    let replies = report.counter(Counter::ReplyFromCache);
    assert_eq!(report.counter(Counter::ResultsSent), 4 * 3908 + replies);

    // The only job saw everything the switch saw, counter for counter.
    for c in Counter::ALL {
        assert_eq!(
            report.job_counter(c),
            report.counter(c),
            "job 1's {} against the switch's",
            c.name()
        );
    }
    assert_eq!(report.job_accounting_error(), None);
    assert_eq!(report.job_counter(Counter::Completed), 3908);

    // Each rank's contributions arrived on its own port, once per chunk, and
    // one result per chunk (and per reply from a slot) left through every port.
    assert_eq!(report.ports.len(), 4);
    for (i, p) in report.ports.iter().enumerate() {
        assert_eq!(p.rank, i);
        assert_eq!(p.counter(Counter::Contributions), 3908, "port {}", p.name);
        let replies = p.counter(Counter::ReplyFromCache);
        assert_eq!(
            p.counter(Counter::ResultsSent),
            3908 + replies,
            "port {}",
            p.name
        );
    }
    assert_eq!(report.port_accounting_error(), None);
    for c in Counter::ALL {
        let ports: u64 = report.ports.iter().map(|p| p.counter(c)).sum();
        assert_eq!(ports, report.counter(c), "{} summed over ports", c.name());
    }
}

/// Lengths that are not a multiple of the packet size, a window of one slot,
/// and small packets still give exact results.
#[test]
fn odd_shapes_are_exact() {
    let spec = AllreduceSpec {
        workers: 3,
        elements: 10_007,
        elems_per_packet: 100,
        slots: 1,
        seed: 3,
        ..Default::default()
    };
    let report = run_allreduce(&spec).expect("scenario runs");
    assert!(report.all_correct(), "{}", report.table());
    assert_eq!(report.chunks, 101 + 1);
    assert_eq!(report.switch_accounting_error(), None, "{}", report.table());
    assert_eq!(report.port_accounting_error(), None, "{}", report.table());
    assert_eq!(report.job_accounting_error(), None, "{}", report.table());
}

/// A member that never sends: the others give up after the bound with an
/// error naming the job and the outstanding sequence numbers — no hang, and
/// no partial result presented as complete.
#[test]
fn dead_peer_gives_a_naming_error_within_the_bound() {
    let give_up = Duration::from_millis(1500);
    let spec = AllreduceSpec {
        workers: 3,
        elements: 5_000,
        seed: 5,
        give_up,
        absent: vec![2],
        ..Default::default()
    };
    let started = Instant::now();
    let report = run_allreduce(&spec).expect("scenario runs");
    let took = started.elapsed();
    assert_eq!(report.workers.len(), 2);
    for w in &report.workers {
        assert!(!w.correct);
        let e = w.error.as_deref().expect("an error");
        assert!(
            e.starts_with(&format!("job 1, rank {}: no new result for", w.rank)),
            "{e}"
        );
        assert!(e.contains("outstanding: seq 0, 1, 2"), "{e}");
    }
    assert_eq!(
        report.counter(Counter::Completed),
        0,
        "nothing can complete without rank 2"
    );
    // Rank 2's port received nothing and no result left any port.
    assert_eq!(report.ports[2].counter(Counter::RxPackets), 0);
    for p in &report.ports {
        assert_eq!(p.counter(Counter::ResultsSent), 0, "port {}", p.name);
    }
    for rank in [0, 1] {
        let p = &report.ports[rank];
        assert!(p.counter(Counter::Contributions) > 0, "port {}", p.name);
    }
    // Generous: building and tearing down the topology takes a moment too.
    assert!(took < give_up + Duration::from_secs(30), "took {took:?}");
}

/// Lossy links on every worker in both directions — drops, duplicates and
/// (towards the switch) reordering — at 1% and 5%: every result is still
/// exact, the losses were recovered by retransmissions answered from the
/// switch's slots, and the switch still counted each contribution once.
#[test]
fn exact_under_loss_duplication_and_reordering() {
    for (drop_ppm, seed) in [(10_000, 11), (50_000, 12)] {
        // The worker's egress hook sees UDP GSO batches of up to 64
        // datagrams, so a call of 783 chunks gave it as few as 50 frames,
        // and 1% duplication sometimes none to duplicate (seen once): 3,900
        // chunks and 3% make a duplicated contribution near certain.
        let spec = AllreduceSpec {
            workers: 4,
            elements: 1_000_000,
            seed,
            ..Default::default()
        };
        let loss = Loss {
            drop_ppm,
            duplicate_ppm: 30_000,
            delay_ppm: 10_000,
        };
        let options = RunOptions {
            loss: Some(loss),
            ..RunOptions::default()
        };
        let report = run_allreduce_with(&spec, options).expect("scenario runs");
        print!("{}", report.table());
        assert!(report.all_correct(), "{}", report.table());
        assert_eq!(report.switch_accounting_error(), None, "{}", report.table());
        let dropped: u64 = report
            .lossy
            .iter()
            .map(|l| l.to_switch.dropped + l.from_switch.dropped)
            .sum();
        let duplicated: u64 = report
            .lossy
            .iter()
            .map(|l| l.to_switch.duplicated + l.from_switch.duplicated)
            .sum();
        let retransmitted: u64 = report.workers.iter().map(|w| w.retransmissions).sum();
        println!(
            "loss {drop_ppm} ppm: links dropped {dropped}, duplicated {duplicated}; workers retransmitted {retransmitted}"
        );
        assert!(dropped > 0 && duplicated > 0, "the links did inject faults");
        assert!(retransmitted > 0, "losses were recovered by retransmission");
        assert!(
            report.counter(Counter::ReplyFromCache) > 0,
            "lost results came back from the slots"
        );
        assert!(
            report.counter(Counter::DropDuplicate) > 0,
            "duplicated contributions were not added twice"
        );
    }
}

/// Eight workers, 16 Mi elements each, int32 and float32, through lossy links
/// at 1% and 5% in both directions: exact (int32) or within the documented
/// bound (float32) on every worker; the retransmissions are reported.
#[test]
fn eight_workers_allreduce_16_mi_elements_under_1_and_5_percent_loss() {
    for (dtype, drop_ppm, seed) in [
        (ElementType::Int32, 10_000, 21),
        (ElementType::Int32, 50_000, 22),
        (ElementType::Float32, 10_000, 23),
        (ElementType::Float32, 50_000, 24),
    ] {
        let spec = AllreduceSpec {
            workers: 8,
            elements: 16 << 20,
            seed,
            dtype,
            give_up: Duration::from_secs(20),
            ..Default::default()
        };
        let options = RunOptions {
            loss: Some(Loss {
                drop_ppm,
                duplicate_ppm: 0,
                delay_ppm: 0,
            }),
            ..RunOptions::default()
        };
        let report = run_allreduce_with(&spec, options).expect("scenario runs");
        assert!(report.all_correct(), "{}", report.table());
        assert_eq!(report.switch_accounting_error(), None, "{}", report.table());
        let retransmitted: u64 = report.workers.iter().map(|w| w.retransmissions).sum();
        let dropped: u64 = report
            .lossy
            .iter()
            .map(|l| l.to_switch.dropped + l.from_switch.dropped)
            .sum();
        println!(
            "{dtype:?} at {drop_ppm} ppm loss: {:.2} s, links dropped {dropped}, workers \
             retransmitted {retransmitted} ({} chunks per worker)",
            report.elapsed_s, report.chunks
        );
        assert!(retransmitted > 0, "losses were recovered by retransmission");
    }
}

/// A worker process killed in the middle of a large allreduce: every other
/// worker returns an error naming the job, itself and the outstanding
/// sequence numbers within the give-up bound, instead of hanging or
/// returning a partial result.
#[test]
fn a_worker_killed_mid_allreduce_makes_the_others_fail_with_a_naming_error() {
    let give_up = Duration::from_millis(1500);
    let spec = AllreduceSpec {
        workers: 4,
        elements: 4 << 20,
        seed: 31,
        give_up,
        kill: Some(Kill {
            rank: 2,
            after_chunks: 1000,
            exe: env!("CARGO_BIN_EXE_xina-testbed").into(),
        }),
        ..Default::default()
    };
    let report = run_allreduce(&spec).expect("scenario runs");
    println!("{}", report.table());
    assert_eq!(report.workers.len(), 4);
    for w in &report.workers {
        let e = w.error.as_deref().expect("an error");
        assert!(!w.correct);
        if w.rank == 2 {
            assert!(e.starts_with("killed once "), "{e}");
            continue;
        }
        assert!(
            e.starts_with(&format!("job 1, rank {}: no new result for 1.5", w.rank)),
            "{e}"
        );
        assert!(e.contains("chunk(s) outstanding: seq "), "{e}");
    }
    // The killed worker took part before it died: chunks completed.
    assert!(report.counter(Counter::Completed) > 0, "{}", report.table());
    assert!(
        report.counter(Counter::Completed) < report.chunks,
        "it died before the end"
    );
    // From the start of the call to the last error: the time to the kill
    // (1,000 chunks take well under a second), then the give-up time without
    // progress, then (generously) scheduling delays.
    let bound = give_up + Duration::from_secs(8);
    assert!(
        report.elapsed_s < bound.as_secs_f64(),
        "the last worker returned after {:.2} s",
        report.elapsed_s
    );
}

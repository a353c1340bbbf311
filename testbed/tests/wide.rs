//! Allreduce with big frames through the XDP switch, with real traffic
//! between network namespaces (root needed): single-buffer jumbo frames
//! (3,500-byte MTU), multi-buffer jumbo (9,000) and 64 KB frames (65,000),
//! exact, also under loss, every result fanned out by the tc program.

use std::time::Duration;

use xina_proto::{DType, frame::elems_for_mtu};
use xina_testbed::scenario::{AllreduceSpec, Loss, RunOptions, run_allreduce_with};

fn spec(workers: usize, mtu: u32, elements: usize, seed: u64) -> AllreduceSpec {
    AllreduceSpec {
        workers,
        elements,
        elems_per_packet: u16::try_from(elems_for_mtu(DType::I32, mtu as usize)).unwrap(),
        slots: 16,
        seed,
        give_up: Duration::from_secs(20),
        ..Default::default()
    }
}

#[test]
fn jumbo_and_64_kb_frames_allreduce_exactly() {
    for (mtu, workers) in [(3500, 4), (9000, 4), (65_000, 4), (65_000, 8)] {
        let spec = spec(workers, mtu, 4 << 20, u64::from(mtu));
        let options = RunOptions {
            mtu,
            ..RunOptions::default()
        };
        let report = run_allreduce_with(&spec, options).expect("scenario runs");
        print!("{}", report.table());
        assert!(report.all_correct(), "MTU {mtu}: {}", report.table());
        assert_eq!(report.switch_accounting_error(), None, "{}", report.table());
        // Each chunk completed once in the switch and was cloned to every
        // worker by the fan-out program (plus replies from the slots):
        // `switch_accounting_error` checks exactly that.
        println!(
            "MTU {mtu}, {workers} workers: {} chunks of {} elements, {:.3} s",
            report.chunks, spec.elems_per_packet, report.elapsed_s
        );
    }
}

#[test]
fn sixty_four_kb_frames_are_exact_under_one_percent_loss() {
    let spec = spec(4, 65_000, 8 << 20, 65);
    let options = RunOptions {
        mtu: 65_000,
        loss: Some(Loss {
            drop_ppm: 10_000,
            duplicate_ppm: 0,
            delay_ppm: 0,
        }),
        ..RunOptions::default()
    };
    let report = run_allreduce_with(&spec, options).expect("scenario runs");
    print!("{}", report.table());
    assert!(report.all_correct(), "{}", report.table());
    assert_eq!(report.switch_accounting_error(), None, "{}", report.table());
    let retransmitted: u64 = report.workers.iter().map(|w| w.retransmissions).sum();
    let dropped: u64 = report
        .lossy
        .iter()
        .map(|l| l.to_switch.dropped + l.from_switch.dropped)
        .sum();
    println!(
        "64 KB frames at 1% loss: {:.2} s, links dropped {dropped}, workers retransmitted {retransmitted}",
        report.elapsed_s
    );
    assert!(dropped > 0, "the links dropped frames");
    assert!(retransmitted > 0, "losses were recovered by retransmission");
}

//! The switch under concurrency, with real traffic between namespaces: eight
//! ranks send at full speed from threads pinned to different CPUs into
//! multi-queue veth ports, and every result must still be exact. Needs root,
//! iproute2, ethtool and bpftool (per-CPU counters), and at least 2 CPUs.
//!
//! ```text
//!   threads pinned to CPU 0                            threads pinned to CPU 1
//!   ┌────────────────┐                                  ┌────────────────┐
//!   │ w0  10.77.0.1  ├─veth─┐                    ┌─veth─┤ w1  10.77.0.2  │
//!   │ w2  10.77.0.3  ├─veth─┤  switch namespace  ├─veth─┤ w3  10.77.0.4  │
//!   │ w4  10.77.0.5  ├─veth─┤  xina_switch on 8  ├─veth─┤ w5  10.77.0.6  │
//!   │ w6  10.77.0.7  ├─veth─┘  ports, job 1 of   └─veth─┤ w7  10.77.0.8  │
//!   └────────────────┘         ranks 0..7               └────────────────┘
//!         every veth: 4 TX and 4 RX queues, both ends
//!
//!   wN ──frame──▶ port N: XDP runs on the CPU wN's thread is pinned to
//!   port N ──result (devmap broadcast)──▶ every wM, on RX queue
//!                                         (CPU that completed the chunk) % 4
//! ```
//!
//! What the kernel does with veth queues (Linux 6.18): `ethtool -l` shows the
//! queues a veth was created with; a frame a worker sends lands on the switch
//! port's RX queue of the same number as the TX queue its stack picked (a
//! hash of the flow, so all of one worker's frames use one queue), and that
//! queue's NAPI runs on the sending CPU, in the softirq at the end of the
//! send. So port `N`'s XDP program runs on worker `N`'s CPU, and the ports of
//! even and odd ranks run on CPU 0 and CPU 1 at the same time. Every chunk
//! needs all eight ranks, so both CPUs take the lock of the same slot copy
//! for every chunk: with windows of 1 to 4 slots and packets of 8 to 64
//! elements, they do so tens of thousands of times a run. The results the
//! switch redirects into the workers' veths go to RX queue `cpu % queues` of
//! each worker, `cpu` being the CPU that completed the chunk.
//!
//! The test asserts these observations from the kernel's own counters: the
//! dataplane's per-CPU counter maps (read with `bpftool`) and the veths'
//! per-queue `xdp_packets` (`ethtool -S`).

use std::time::Instant;

use xina_proto::counters::Counter;
use xina_testbed::scenario::{
    AllreduceReport, AllreduceSpec, RunOptions, allowed_cpus, run_allreduce_on,
};
use xina_testbed::topology::{Star, StarOptions};

const WORKERS: usize = 8;
const QUEUES: u32 = 4;
const ELEMENTS: usize = 500_000;

/// `(elements per packet, slots)` of each run: mostly small packets and
/// small windows, so that many contributions race on few slot copies; a
/// window of 1 puts all eight ranks on one copy at a time.
const SHAPES: [(u16, u32); 10] = [
    (8, 1),
    (16, 2),
    (32, 4),
    (64, 1),
    (24, 3),
    (17, 5),
    (100, 8),
    (48, 16),
    (256, 2),
    (360, 64),
];

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the namespace tests need root");
}

/// The queues the kernel gave a link, from `ip -d -j link show`.
fn queues_of(ns: &xina_testbed::netns::NetNs, iface: &str) -> (u64, u64) {
    let text = ns
        .ip(&["-d", "-j", "link", "show", "dev", iface])
        .expect("ip link show");
    let link: serde_json::Value = serde_json::from_str(&text).expect("ip -j prints JSON");
    let get = |key: &str| {
        link[0][key]
            .as_u64()
            .unwrap_or_else(|| panic!("{iface}: no {key} in {text}"))
    };
    (get("num_tx_queues"), get("num_rx_queues"))
}

/// Where the switch's XDP programs ran during one run, checked against
/// where the workers were pinned.
fn check_placement(report: &AllreduceReport, context: &str) -> u64 {
    let per_cpu = report
        .per_cpu
        .as_ref()
        .expect("per-CPU counters were asked for");
    // Both CPUs added contributions of the job to its slots: each took the
    // lock of copies the other had written. (Which CPU completes the chunks
    // depends on which ranks happen to be last; a short run can complete
    // them all on one, so that is checked over all runs, by the caller.)
    let c = Counter::Contributions;
    assert!(
        per_cpu.cpus_with(c).len() >= 2,
        "{context}: job {} only on CPUs {:?}",
        c.name(),
        per_cpu.cpus_with(c)
    );
    for (port, rx) in report.ports.iter().zip(&per_cpu.port_rx) {
        let cpu = report.workers[port.rank].cpu.expect("workers are pinned");
        // A port's ingress program ran on its sender's CPU for every frame
        // of the sender's socket. Only frames its kernel sends on its own
        // may come from the other CPU: ICMP port unreachable, answering a
        // result that came after the worker closed its socket (those the
        // switch passes to its kernel; see `job_accounting_error`).
        let elsewhere: u64 = rx
            .iter()
            .enumerate()
            .filter(|(c, _)| *c != cpu)
            .map(|(_, n)| n)
            .sum();
        let on_cpu = rx.get(cpu).copied().unwrap_or(0);
        assert!(
            on_cpu + elsewhere == port.counter(Counter::RxPackets)
                && elsewhere <= port.counter(Counter::Passed),
            "{context}: port {} (rank {}, pinned to CPU {cpu}) ran XDP on {rx:?} for {} frames, \
             {} of them passed to the kernel",
            port.name,
            port.rank,
            port.counter(Counter::RxPackets),
            port.counter(Counter::Passed)
        );
        // The kernel's count of XDP runs on the port's queues agrees.
        assert_eq!(
            port.rx_queue_xdp_packets.len(),
            QUEUES as usize,
            "{context}: {}",
            port.name
        );
        assert_eq!(
            port.rx_queue_xdp_packets.iter().sum::<u64>(),
            port.counter(Counter::RxPackets),
            "{context}: port {} per-queue xdp_packets {:?}",
            port.name,
            port.rx_queue_xdp_packets
        );
    }
    per_cpu.overlapping_intervals
}

/// Eight ranks, pinned alternately to CPU 0 and CPU 1, allreduce 500,000
/// int32 each through the switch ten times, with different data, packet
/// sizes and windows: every rank's result is exact every time, the switch's
/// counters account for every frame once, and the per-CPU counters show XDP
/// running on both CPUs for the same job at the same time.
///
/// Each run is bounded by the workers' give-up time (no progress for 5 s
/// ends it with an error); there is no assertion on wall-clock time.
#[test]
fn eight_ranks_pinned_to_two_cpus_sum_exactly_run_after_run() {
    require_root();
    let cpus = allowed_cpus().expect("the CPU affinity");
    assert!(
        cpus.len() >= 2,
        "this test needs 2 CPUs to run XDP on, the process may use {cpus:?}"
    );
    let star = Star::build_with(StarOptions {
        queues: QUEUES,
        ..StarOptions::new(WORKERS)
    })
    .expect("building the star");
    print!("{star}");
    let q = u64::from(QUEUES);
    for (port, worker) in star.ports().iter().zip(star.workers()) {
        assert_eq!(
            queues_of(star.switch(), &port.name),
            (q, q),
            "{}",
            port.name
        );
        assert_eq!(
            queues_of(worker.ns(), &worker.iface),
            (q, q),
            "{}",
            worker.iface
        );
    }
    let channels = star
        .switch()
        .exec(&["ethtool", "-l", &star.port(0).name])
        .expect("ethtool -l");
    println!("{channels}");

    let options = RunOptions {
        queues: QUEUES,
        pin_cpus: true,
        per_cpu: true,
        ..RunOptions::default()
    };
    let started = Instant::now();
    let (mut overlapping, mut intervals) = (0, 0);
    let mut completing_cpus = std::collections::BTreeSet::new();
    for (run, &(elems_per_packet, slots)) in SHAPES.iter().enumerate() {
        let spec = AllreduceSpec {
            workers: WORKERS,
            elements: ELEMENTS,
            elems_per_packet,
            slots,
            seed: 0xc0c0 + run as u64,
            ..Default::default()
        };
        let context = format!(
            "run {run}: {elems_per_packet} elements per packet, {slots} slots, seed {}",
            spec.seed
        );
        let report = run_allreduce_on(&star, &spec, options).expect("the scenario runs");
        println!("\n== {context}");
        print!("{}", report.table());
        for w in &report.workers {
            assert!(
                w.correct,
                "{context}: rank {} on CPU {:?}: {:?} (first mismatch {:?})",
                w.rank, w.cpu, w.error, w.first_mismatch
            );
            assert_eq!(w.cpu, Some(cpus[w.rank % cpus.len()]), "{context}");
        }
        assert_eq!(report.workers.len(), WORKERS);
        assert_eq!(report.switch_accounting_error(), None, "{context}");
        assert_eq!(report.port_accounting_error(), None, "{context}");
        assert_eq!(report.job_accounting_error(), None, "{context}");
        let both = check_placement(&report, &context);
        if let Some(per_cpu) = &report.per_cpu {
            completing_cpus.extend(per_cpu.cpus_with(Counter::Completed));
        }
        // Readings a few milliseconds apart saw both CPUs add contributions
        // of the job in between: they ran XDP for it at the same time.
        assert!(both > 0, "{context}: never both CPUs between two readings");
        overlapping += both;
        intervals += report
            .per_cpu
            .as_ref()
            .map_or(0, |p| p.samples.saturating_sub(1));
    }
    assert!(
        completing_cpus.len() >= 2,
        "chunks completed only on CPUs {completing_cpus:?} over all runs"
    );
    println!(
        "\n{} runs in {:.1} s; the job's contributions grew on more than one CPU \
         in {overlapping} of {intervals} sampling intervals",
        SHAPES.len(),
        started.elapsed().as_secs_f64()
    );
    star.teardown().expect("tearing the star down");
}

//! The accounting checks of [`AllreduceReport`] on made-up counter readings.

use super::*;

/// Two ranks, one chunk; rank 1 retransmitted and its reply from the slot
/// came after it had taken the original result. `kernel_answers` frames came
/// back from the workers' kernels (rank 1's port), `late` is how many results
/// rank 1 did not take.
fn report(kernel_answers: u64, late: u64) -> AllreduceReport {
    let counters = |entries: &[(Counter, u64)]| -> BTreeMap<&'static str, u64> {
        entries.iter().map(|(c, n)| (c.name(), *n)).collect()
    };
    let job = [
        (Counter::RxPackets, 3),
        (Counter::Contributions, 2),
        (Counter::Consumed, 1),
        (Counter::Completed, 1),
        (Counter::ResultsSent, 3),
        (Counter::ReplyFromCache, 1),
    ];
    let mut switch = job;
    switch[0].1 += kernel_answers;
    let worker = |rank, received| WorkerReport {
        rank,
        cpu: None,
        correct: true,
        first_mismatch: None,
        error: None,
        packets_sent: 1 + rank as u64,
        packets_received: received,
        retransmissions: rank as u64,
        timeouts: rank as u64,
        from_cache: 0,
        elapsed_s: 0.1,
    };
    let port = |rank, entries: &[(Counter, u64)]| PortReport {
        name: format!("p{rank}"),
        ifindex: 10 + rank as u32,
        rank,
        counters: counters(entries),
        rx_queue_xdp_packets: Vec::new(),
    };
    let mut switch_counters = counters(&switch);
    switch_counters.insert(Counter::Passed.name(), kernel_answers);
    AllreduceReport {
        spec: AllreduceSpec {
            workers: 2,
            ..Default::default()
        },
        options: RunOptions::default(),
        chunks: 1,
        workers: vec![worker(0, 1), worker(1, 2 - late)],
        switch_counters,
        job_counters: counters(&job),
        ports: vec![
            port(0, &[(Counter::Contributions, 1), (Counter::ResultsSent, 1)]),
            port(
                1,
                &[
                    (Counter::Contributions, 1),
                    (Counter::ReplyFromCache, 1),
                    (Counter::ResultsSent, 2),
                    (Counter::Passed, kernel_answers),
                ],
            ),
        ],
        per_cpu: None,
        lossy: Vec::new(),
        elapsed_s: 0.1,
        config: String::new(),
    }
}

#[test]
fn a_kernel_answer_to_a_result_its_worker_no_longer_took_is_not_an_error() {
    assert_eq!(report(0, 0).job_accounting_error(), None);
    assert_eq!(report(1, 1).job_accounting_error(), None);
    assert_eq!(report(1, 1).switch_accounting_error(), None);
}

#[test]
fn a_frame_outside_the_job_that_no_late_result_explains_is_an_error() {
    let error = report(1, 0)
        .job_accounting_error()
        .expect("a stray frame is reported");
    assert!(error.contains("port p1 (rank 1) passed 1"), "{error}");
    let error = report(2, 1)
        .job_accounting_error()
        .expect("more stray frames than late results");
    assert!(error.contains("passed 2"), "{error}");
}

//! The engine against the switch model over the simulated lossy network.
//!
//! Every run is bounded in simulated time and events by the cluster
//! ([`Stalled`] fails the test), so a hang shows up as a failure, not a
//! stuck test.

use std::time::Duration;

use proptest::prelude::*;
use xina_host::sim::{Cluster, ClusterConfig, LinkConfig, Round, SplitMix64, Stalled};
use xina_host::{Error, Stats};

/// Inputs whose sums cannot overflow for up to 64 ranks (|x| <= 2^24).
fn inputs(fan_in: u8, len: usize, seed: u64) -> Vec<Vec<i32>> {
    let mut rng = SplitMix64::new(seed);
    (0..fan_in)
        .map(|_| {
            (0..len)
                .map(|_| i32::try_from(rng.up_to(1 << 25)).unwrap() - (1 << 24))
                .collect()
        })
        .collect()
}

fn sums(inputs: &[Vec<i32>]) -> Vec<i32> {
    let mut sum = vec![0i32; inputs[0].len()];
    for input in inputs {
        for (s, x) in sum.iter_mut().zip(input) {
            *s = s.checked_add(*x).expect("test inputs do not overflow");
        }
    }
    sum
}

/// Runs one allreduce and checks that every rank got the exact sums.
fn allreduce_exact(cluster: &mut Cluster, fan_in: u8, len: usize, seed: u64) -> Vec<Stats> {
    let mut buffers = inputs(fan_in, len, seed);
    let expected = sums(&buffers);
    let round = cluster
        .allreduce(&mut buffers)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut stats = Vec::new();
    for (rank, (outcome, got)) in round.outcomes.into_iter().zip(&buffers).enumerate() {
        match outcome {
            Some(Ok(s)) => stats.push(s),
            Some(Err(e)) => panic!("rank {rank}: {e}"),
            None => panic!("rank {rank} has no outcome"),
        }
        // Compare whole buffers only on failure, to keep messages short.
        if *got != expected {
            let first = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap();
            panic!(
                "rank {rank}: element {first} is {} instead of {}",
                got[first], expected[first]
            );
        }
    }
    stats
}

#[test]
fn every_rank_gets_the_exact_sum_under_loss_duplication_and_reordering() {
    const E: u16 = 8;
    let e = usize::from(E);
    let mut lost = 0;
    let mut from_cache = 0;
    let mut retransmissions = 0;
    for loss in [0.0, 0.001, 0.01, 0.05, 0.2] {
        for (duplicate, reorder) in [(0.0, 0.0), (0.05, 0.2)] {
            for seed in 0..3 {
                for slots in [1, 4] {
                    for len in [0, 1, e - 1, e, e + 1, 150 * e + 3] {
                        let mut config = ClusterConfig::new(3, E, slots);
                        config.link = LinkConfig::lossy(loss, duplicate, reorder);
                        config.seed = seed;
                        let mut cluster = Cluster::new(config);
                        let context = format!(
                            "loss {loss}, dup {duplicate}, reorder {reorder}, seed {seed}, \
                             W {slots}, len {len}"
                        );
                        let stats = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            allreduce_exact(&mut cluster, 3, len, seed)
                        }))
                        .unwrap_or_else(|_| panic!("failed with {context}"));
                        let chunks = len.div_ceil(e);
                        assert_eq!(cluster.next_chunk(0), chunks as u64, "{context}");
                        if loss == 0.0 && duplicate == 0.0 && reorder == 0.0 {
                            for s in &stats {
                                assert_eq!(
                                    (s.retransmissions, s.duplicates, s.packets_sent),
                                    (0, 0, chunks as u64),
                                    "no spurious retransmission on a perfect network: {context}"
                                );
                            }
                        }
                        lost += cluster.network().stats().lost;
                        from_cache += stats.iter().map(|s| s.from_cache).sum::<u64>();
                        retransmissions += stats.iter().map(|s| s.retransmissions).sum::<u64>();
                    }
                }
            }
        }
    }
    // The grid really exercised recovery.
    assert!(lost > 1000, "{lost} datagrams lost");
    assert!(from_cache > 100, "{from_cache} results from cache");
    assert!(
        retransmissions > lost / 2,
        "{retransmissions} retransmissions"
    );
}

#[test]
fn full_packets_many_ranks_and_start_skew() {
    for (fan_in, elems, slots, len, loss) in [
        (8, 256, 16, 256 * 40 + 17, 0.01),
        (64, 16, 4, 16 * 10 + 1, 0.0),
        (64, 16, 4, 16 * 10 + 1, 0.02),
        (2, 256, 1, 256 * 3, 0.05),
    ] {
        for seed in 0..2 {
            let mut config = ClusterConfig::new(fan_in, elems, slots);
            config.link = LinkConfig::lossy(loss, 0.01, 0.1);
            config.seed = seed;
            config.start_skew = Duration::from_millis(20);
            let mut cluster = Cluster::new(config);
            allreduce_exact(&mut cluster, fan_in, len, seed);
        }
    }
}

#[test]
fn chunk_numbers_continue_across_calls() {
    let mut config = ClusterConfig::new(4, 5, 2);
    config.link = LinkConfig::lossy(0.05, 0.05, 0.2);
    config.seed = 11;
    config.start_skew = Duration::from_millis(5);
    let mut cluster = Cluster::new(config);
    let mut chunks = 0;
    for (call, len) in [23, 0, 1, 100, 5, 64].into_iter().enumerate() {
        allreduce_exact(&mut cluster, 4, len, call as u64);
        chunks += len.div_ceil(5) as u64;
        for rank in 0..4 {
            assert_eq!(cluster.next_chunk(rank), chunks);
        }
    }
}

#[test]
fn restarting_the_numbering_gets_every_chunk_dropped_as_stale() {
    let mut config = ClusterConfig::new(3, 4, 2);
    config.engine.give_up = Duration::from_secs(1);
    let mut cluster = Cluster::new(config);
    allreduce_exact(&mut cluster, 3, 40, 1);
    for rank in 0..3 {
        cluster.set_next_chunk(rank, 0);
    }
    let mut buffers = inputs(3, 40, 2);
    let round = cluster.allreduce(&mut buffers).expect("terminates");
    for outcome in round.outcomes {
        assert!(
            matches!(outcome, Some(Err(Error::GaveUp { completed: 0, .. }))),
            "{outcome:?}"
        );
    }
    assert!(cluster.switch().stats().stale > 0);
}

#[test]
fn sequence_numbers_wrap_around_2_to_the_32() {
    // With W = 3 (which does not divide 2^32) the slot of a seq-derived
    // mapping jumps at the wrap; the chunk-number mapping does not. Heavy loss
    // makes ranks depend on the slots' stored results around the wrap.
    for slots in [3, 4] {
        for seed in 0..30 {
            let mut config = ClusterConfig::new(3, 2, slots);
            config.link = LinkConfig::lossy(0.2, 0.05, 0.2);
            config.engine.give_up = Duration::from_secs(20);
            config.seed = seed;
            let mut cluster = Cluster::new(config);
            let start = (1u64 << 32) - 7;
            for rank in 0..3 {
                cluster.set_next_chunk(rank, start);
            }
            allreduce_exact(&mut cluster, 3, 2 * 10, seed);
            allreduce_exact(&mut cluster, 3, 2 * 10 + 1, seed + 1);
            assert_eq!(cluster.next_chunk(0), start + 21);
        }
    }
}

fn gave_up(round: &Round, rank: usize) -> (usize, Vec<u32>, usize) {
    match &round.outcomes[rank] {
        Some(Err(Error::GaveUp {
            completed,
            outstanding,
            ..
        })) => (*completed, outstanding.first.clone(), outstanding.total),
        other => panic!("rank {rank}: {other:?}"),
    }
}

#[test]
fn a_dead_peer_makes_every_other_rank_give_up_naming_the_outstanding_seqs() {
    let give_up = Duration::from_secs(2);
    for seed in 0..3 {
        for slots in [1, 8, 40] {
            let mut config = ClusterConfig::new(4, 4, slots);
            config.engine.give_up = give_up;
            config.link = LinkConfig::lossy(0.01, 0.01, 0.1);
            config.seed = seed;
            config.dead = 1 << 2;
            let mut cluster = Cluster::new(config);
            let mut buffers = inputs(4, 4 * 30, seed);
            let before = buffers.clone();
            let round = cluster
                .allreduce(&mut buffers)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                round.duration <= give_up,
                "gave up after {:?}",
                round.duration
            );
            assert!(round.outcomes[2].is_none());
            assert_eq!(buffers[2], before[2], "the dead rank's buffer is untouched");
            let in_flight = (slots as usize).min(30);
            let expected: Vec<u32> = (0..in_flight.min(16) as u32).collect();
            for rank in [0, 1, 3] {
                assert_eq!(gave_up(&round, rank), (0, expected.clone(), in_flight));
                let message = round.outcomes[rank].as_ref().unwrap().as_ref().unwrap_err();
                assert!(
                    message
                        .to_string()
                        .starts_with(&format!("job 1, rank {rank}: no new result")),
                    "{message}"
                );
            }
        }
    }
}

#[test]
fn a_peer_that_dies_between_calls_is_reported_at_the_next_seqs() {
    let mut config = ClusterConfig::new(3, 4, 4);
    config.engine.give_up = Duration::from_millis(500);
    config.link = LinkConfig::lossy(0.02, 0.0, 0.0);
    config.seed = 5;
    let mut cluster = Cluster::new(config);
    allreduce_exact(&mut cluster, 3, 4 * 25, 1);
    cluster.set_dead(1 << 1);
    let mut buffers = inputs(3, 4 * 25, 2);
    let round = cluster
        .allreduce(&mut buffers)
        .unwrap_or_else(|e| panic!("{e}"));
    for rank in [0, 2] {
        assert_eq!(gave_up(&round, rank), (0, vec![25, 26, 27, 28], 4));
    }
}

#[test]
fn saturated_sums_fail_with_the_overflow_error_on_every_rank() {
    let mut config = ClusterConfig::new(2, 4, 2);
    config.link = LinkConfig::lossy(0.05, 0.05, 0.2);
    config.seed = 3;
    let mut cluster = Cluster::new(config);
    allreduce_exact(&mut cluster, 2, 8, 0); // chunks 0 and 1

    let mut buffers = vec![vec![1; 13], vec![1; 13]];
    buffers[0][5] = i32::MAX; // chunk 3 (elements 4..8)
    buffers[0][11] = i32::MIN; // chunk 4 (elements 8..12)
    buffers[1][11] = -1;
    let round = cluster
        .allreduce(&mut buffers)
        .unwrap_or_else(|e| panic!("{e}"));
    for (rank, outcome) in round.outcomes.iter().enumerate() {
        match outcome {
            Some(Err(Error::Overflow {
                job: 1,
                seq: 3,
                elements,
                chunks: 2,
                ..
            })) if *elements == (4..8) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // Everyone completed every chunk, so the numbering is still in step.
    assert_eq!(cluster.next_chunk(0), 6);
    assert_eq!(cluster.next_chunk(1), 6);
    allreduce_exact(&mut cluster, 2, 9, 4);
}

#[test]
fn a_stalled_cluster_is_reported_not_hung() {
    // An engine that could never finish is cut off by the time limit: with a
    // dead peer and a give-up time beyond the limit, the harness reports it.
    let mut config = ClusterConfig::new(2, 4, 2);
    config.dead = 1;
    config.engine.give_up = Duration::from_secs(1000);
    config.time_limit = Duration::from_secs(10);
    let mut cluster = Cluster::new(config);
    let mut buffers = inputs(2, 8, 0);
    let stalled: Stalled = cluster.allreduce(&mut buffers).expect_err("stalls");
    assert_eq!((stalled.reason, stalled.pending), ("time limit", vec![1]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_shapes_reduce_exactly(
        len in 0usize..2500,
        elems in prop_oneof![1u16..=16, 17u16..=256],
        slots in 1u32..=12,
        fan_in in 1u8..=5,
        loss in prop_oneof![Just(0.0), 0.0f64..0.1],
        seed in any::<u64>(),
    ) {
        let mut config = ClusterConfig::new(fan_in, elems, slots);
        config.link = LinkConfig::lossy(loss, 0.02, 0.1);
        config.seed = seed;
        let mut cluster = Cluster::new(config);
        allreduce_exact(&mut cluster, fan_in, len, seed);
        allreduce_exact(&mut cluster, fan_in, len / 3, seed ^ 1);
        let chunks = (len.div_ceil(usize::from(elems)) + (len / 3).div_ceil(usize::from(elems))) as u64;
        prop_assert_eq!(cluster.next_chunk(0), chunks);
    }
}

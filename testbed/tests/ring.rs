//! The host-based ring allreduce over TCP between worker namespaces (root
//! needed): exact results, and a peer that dies or stops is named in an
//! error within a bound.
//!
//! ```text
//!   w0 (10.77.0.1) ──┐                      rank 0 ──▶ rank 1 ──▶ rank 2
//!   w1 (10.77.0.2) ──┼── bridge in the        ▲                     │
//!   w2 (10.77.0.3) ──┘   switch namespace     └─────────────────────┘
//! ```

use std::{
    sync::Barrier,
    time::{Duration, Instant},
};

use xina_testbed::{
    ring::{Error, RingRank, RingStats, WHOLE_MAX_BYTES, ring_addrs},
    scenario::worker_data,
    topology::Star,
};

/// Every rank of an `n`-rank ring, connected, runs `f(rank, ring)` in its
/// namespace; returns what each returned, by rank.
fn on_ring<T: Send>(
    star: &Star,
    timeout: Duration,
    f: impl Fn(usize, RingRank) -> T + Sync,
) -> Vec<T> {
    let addrs = ring_addrs(star.workers().iter().map(|w| w.ip));
    let barrier = Barrier::new(addrs.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..addrs.len())
            .map(|rank| {
                let (addrs, barrier, f) = (&addrs, &barrier, &f);
                scope.spawn(move || {
                    star.worker(rank)
                        .ns()
                        .run(move || {
                            let listener = RingRank::listen(rank, addrs).expect("listen");
                            barrier.wait();
                            let ring = RingRank::connect(rank, addrs, &listener, timeout)
                                .expect("connect");
                            f(rank, ring)
                        })
                        .expect("entering the worker namespace")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// Lengths below, at and above the rank count, odd, and large enough that
/// a step spans many reads: every rank gets exactly the element-wise sum,
/// call after call on the same connections.
fn exact(n: usize) {
    let star = Star::build(n).expect("star");
    let lengths = [1usize, 2, n, 5, 1001, 333_333];
    let results = on_ring(&star, Duration::from_secs(10), |rank, mut ring| {
        lengths
            .iter()
            .map(|&len| {
                let mut data = worker_data(11, rank, len);
                let stats = ring.allreduce_i32(&mut data).expect("allreduce");
                (data, stats)
            })
            .collect::<Vec<_>>()
    });
    for (i, &len) in lengths.iter().enumerate() {
        let mut expected = vec![0i32; len];
        for rank in 0..n {
            for (e, v) in expected.iter_mut().zip(worker_data(11, rank, len)) {
                *e += v;
            }
        }
        for (rank, per_len) in results.iter().enumerate() {
            let (data, stats) = &per_len[i];
            assert!(
                data == &expected,
                "{n} ranks, {len} elements: rank {rank} is wrong"
            );
            // Small buffers: n-1 steps of the whole buffer; larger ones:
            // 2(n-1) steps of about len/n elements each.
            let (steps, bytes) = (n as u64 - 1, 4 * len as u64);
            let bound = if 4 * len <= WHOLE_MAX_BYTES {
                steps * bytes
            } else {
                2 * steps * 4 * (len as u64 / n as u64 + 1)
            };
            assert!(
                stats.bytes_sent <= bound,
                "rank {rank} sent {} bytes for {len} elements",
                stats.bytes_sent
            );
        }
    }
    star.teardown().expect("teardown");
}

#[test]
fn three_ranks_sum_exactly() {
    exact(3);
}

#[test]
fn four_ranks_sum_exactly() {
    exact(4);
}

/// A ring of three in which rank 2 connects and then does `rank2` with its
/// end instead of taking part; ranks 0 and 1 allreduce a million elements.
/// Returns their outcomes and how long each call took.
fn rank_2_misbehaves(
    timeout: Duration,
    rank2: impl Fn(RingRank) + Sync,
) -> Vec<(Result<RingStats, Error>, Duration)> {
    let star = Star::build(3).expect("star");
    let results = on_ring(&star, timeout, |rank, mut ring| {
        if rank == 2 {
            rank2(ring);
            return None;
        }
        // Cheap to make: the peer's clock starts with the ring.
        let mut data = vec![1; 1_000_000];
        let started = Instant::now();
        Some((ring.allreduce_i32(&mut data), started.elapsed()))
    });
    star.teardown().expect("teardown");
    results.into_iter().flatten().collect()
}

/// Rank 2 connects and then goes away (its sockets close, as when its
/// process is killed): rank 0, which receives from it, fails at once naming
/// rank 2, and rank 1 fails too instead of hanging.
#[test]
fn a_killed_peer_is_named() {
    let timeout = Duration::from_secs(5);
    let results = rank_2_misbehaves(timeout, drop);
    let (r0, t0) = &results[0];
    match r0 {
        Err(Error::Closed {
            rank: 0, peer: 2, ..
        }) => {}
        other => panic!("rank 0: expected rank 2 closed, got {other:?}"),
    }
    assert!(r0.as_ref().unwrap_err().to_string().contains("rank 2"));
    assert!(*t0 < timeout, "rank 0 took {t0:?}");
    let (r1, t1) = &results[1];
    let e1 = r1
        .as_ref()
        .expect_err("rank 1 cannot finish without rank 2");
    assert!(matches!(e1, Error::Closed { rank: 1, .. }), "rank 1: {e1}");
    assert!(*t1 < timeout, "rank 1 took {t1:?}");
}

/// Rank 2 connects and then neither sends nor reads (a hung process): rank 0
/// gives up after the timeout naming rank 2; rank 1 gives up as well.
#[test]
fn a_silent_peer_is_named_after_the_timeout() {
    let timeout = Duration::from_secs(1);
    let results = rank_2_misbehaves(timeout, |ring| {
        std::thread::sleep(3 * timeout);
        drop(ring);
    });
    let (r0, t0) = &results[0];
    match r0 {
        Err(Error::Stalled {
            rank: 0, peer: 2, ..
        }) => {}
        other => panic!("rank 0: expected a stall on rank 2, got {other:?} after {t0:?}"),
    }
    assert!(
        *t0 >= timeout && *t0 < 2 * timeout,
        "rank 0 gave up after {t0:?}"
    );
    let (r1, t1) = &results[1];
    assert!(r1.is_err(), "rank 1 cannot finish without rank 2");
    assert!(*t1 < 3 * timeout, "rank 1 took {t1:?}");
}

//! The host-based broadcast baselines over TCP between worker namespaces
//! (root needed): every receiver ends with exactly the root's bytes, for
//! every algorithm, several roots and sizes, and every rank of a ring
//! allgather with every part; lossless and with 1% of the frames dropped on
//! every worker link.
//!
//! ```text
//!   w0 (10.77.0.1) ──┐                       a TCP connection between
//!   w1 (10.77.0.2) ──┼── bridge in the       every pair of workers; a
//!   ...              │   switch namespace    broadcast uses the ones its
//!   w7 (10.77.0.8) ──┘                       algorithm needs
//! ```
//!
//! Every star is a fresh set of uniquely named namespaces, deleted when the
//! `Star` is dropped, also while a failed assertion unwinds. Rank threads
//! never panic: they report failures, which are asserted on here.

use std::{sync::Barrier, time::Duration};

use xina_proto::lossy::direction;
use xina_testbed::{
    bcast::{Algorithm, MeshRank, mesh_addrs, payload},
    lossy::{self, LossyLink},
    topology::Star,
};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Every rank of the star's mesh, connected, runs `f(rank, mesh)` in its
/// namespace; returns what each returned, by rank (a rank that cannot set
/// up returns its error).
fn on_mesh<T: Send>(
    star: &Star,
    f: impl Fn(usize, MeshRank) -> T + Sync,
) -> Vec<Result<T, String>> {
    let addrs = mesh_addrs(star.workers().iter().map(|w| w.ip));
    let barrier = Barrier::new(addrs.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..addrs.len())
            .map(|rank| {
                let (addrs, barrier, f) = (&addrs, &barrier, &f);
                scope.spawn(move || {
                    star.worker(rank)
                        .ns()
                        .run(move || {
                            let listener = MeshRank::listen(rank, addrs);
                            // Every listener is bound before anyone connects.
                            barrier.wait();
                            let mesh = MeshRank::connect(rank, addrs, &listener?, TIMEOUT)?;
                            Ok::<_, xina_testbed::bcast::Error>(f(rank, mesh))
                        })
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("rank {rank}: {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("rank thread panicked".into()))
            })
            .collect()
    })
}

/// One call of the sequence every rank runs: a broadcast from `root` by
/// `algorithm`, or a ring allgather (`algorithm` `None`, `root` unused).
#[derive(Clone, Copy, Debug)]
struct Case {
    algorithm: Option<Algorithm>,
    root: usize,
    len: usize,
}

/// What the ranks did over `cases`: how many receiver buffers were checked
/// and every failure, named.
fn broadcast_all(star: &Star, cases: &[Case]) -> (usize, Vec<String>) {
    let n = star.workers().len();
    let per_rank = on_mesh(star, |rank, mut mesh| {
        let mut checked = 0usize;
        let mut failures = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let want = payload(i as u64, c.len);
            let what = format!("{c:?} of {n} ranks, rank {rank}");
            let Some(algorithm) = c.algorithm else {
                // Allgather: this rank holds its own part, the complement
                // elsewhere, so every other byte must change.
                let mine = rank * c.len / n..(rank + 1) * c.len / n;
                let mut data: Vec<u8> = want.iter().map(|b| !b).collect();
                data[mine.clone()].copy_from_slice(&want[mine]);
                match mesh.allgather_ring(&mut data) {
                    Ok(_) => {
                        checked += 1;
                        if let Some(at) = data.iter().zip(&want).position(|(a, b)| a != b) {
                            failures.push(format!(
                                "{what}: byte {at} is {:#04x}, its owner had {:#04x}",
                                data[at], want[at]
                            ));
                        }
                    }
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        break;
                    }
                }
                continue;
            };
            // Receivers start from the complement, so every byte must change.
            let mut data: Vec<u8> = if rank == c.root {
                want.clone()
            } else {
                want.iter().map(|b| !b).collect()
            };
            let done = match mesh.broadcast(algorithm, c.root, &mut data) {
                Ok(done) => done,
                Err(e) => {
                    // The mesh is out of step after an error; stop here.
                    failures.push(format!("{what}: {e}"));
                    break;
                }
            };
            let receives =
                rank != c.root && (algorithm != Algorithm::Once || rank == (c.root + 1) % n);
            if receives {
                checked += 1;
                if let Some(at) = data.iter().zip(&want).position(|(a, b)| a != b) {
                    failures.push(format!(
                        "{what}: byte {at} is {:#04x}, the root sent {:#04x}",
                        data[at], want[at]
                    ));
                }
                if done.received.is_none() {
                    failures.push(format!("{what}: no completion instant"));
                }
            } else {
                if data != want && rank == c.root {
                    failures.push(format!("{what}: the root's buffer changed"));
                }
                if done.received.is_some() {
                    failures.push(format!("{what}: a completion instant but no data"));
                }
            }
        }
        (checked, failures)
    });
    let mut checked = 0;
    let mut failures = Vec::new();
    for r in per_rank {
        match r {
            Ok((c, f)) => {
                checked += c;
                failures.extend(f);
            }
            Err(e) => failures.push(e),
        }
    }
    (checked, failures)
}

/// Every algorithm, from the first, a middle and the last rank, at each of
/// `lengths`; then, with `allgather`, a ring allgather at each of them.
fn cases(n: usize, lengths: &[usize], algorithms: &[Algorithm], allgather: bool) -> Vec<Case> {
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    let mut cases = Vec::new();
    for &algorithm in algorithms {
        for &root in &roots {
            for &len in lengths {
                cases.push(Case {
                    algorithm: Some(algorithm),
                    root,
                    len,
                });
            }
        }
    }
    if allgather {
        cases.extend(lengths.iter().map(|&len| Case {
            algorithm: None,
            root: 0,
            len,
        }));
    }
    cases
}

/// Buffers checked over `cases` among `n` ranks: every receiver of a
/// broadcast, every rank of an allgather.
fn receivers(n: usize, cases: &[Case]) -> usize {
    cases
        .iter()
        .map(|c| match c.algorithm {
            Some(Algorithm::Once) => 1,
            Some(_) => n - 1,
            None => n,
        })
        .sum()
}

fn exact(n: usize) {
    let star = Star::build(n).expect("star");
    // 4 bytes, fewer bytes than ranks, odd sizes, a few MiB.
    let lengths = [4, 1, 7, 1001, 65_537, (3 << 20) + 5];
    let cases = cases(
        n,
        &lengths,
        &[Algorithm::Unicast, Algorithm::Tree, Algorithm::Once],
        true,
    );
    let (checked, failures) = broadcast_all(&star, &cases);
    assert!(failures.is_empty(), "{n} ranks: {failures:#?}");
    assert_eq!(checked, receivers(n, &cases), "{n} ranks");
    star.teardown().expect("teardown");
}

#[test]
fn bcast_baseline_two_ranks_exact() {
    exact(2);
}

#[test]
fn bcast_baseline_four_ranks_exact() {
    exact(4);
}

#[test]
fn bcast_baseline_eight_ranks_exact() {
    exact(8);
}

/// 1% of all frames (data and ACKs, both directions) dropped on every
/// worker link: TCP recovers and every receiver is still exact. The links
/// must have dropped something, or the test proved nothing.
fn exact_under_loss(n: usize) {
    let star = Star::build(n).expect("star");
    let rates = lossy::rates(10_000, 0, 0, false);
    let links: Vec<LossyLink> = star
        .workers()
        .iter()
        .map(|w| LossyLink::attach(w.ns(), &w.iface, rates, rates, "1mbit").expect("lossy link"))
        .collect();
    let cases = cases(
        n,
        &[4, 1001, (2 << 20) + 3],
        &[Algorithm::Unicast, Algorithm::Tree],
        true,
    );
    let (checked, failures) = broadcast_all(&star, &cases);
    let (mut seen, mut dropped) = (0, 0);
    for link in &links {
        for dir in [direction::EGRESS, direction::INGRESS] {
            let c = link.counts(dir).expect("lossy link counters");
            seen += c.seen;
            dropped += c.dropped;
        }
    }
    drop(links);
    eprintln!("{n} ranks: the lossy links dropped {dropped} of {seen} frames");
    assert!(failures.is_empty(), "{n} ranks at 1% loss: {failures:#?}");
    assert_eq!(checked, receivers(n, &cases), "{n} ranks");
    assert!(dropped > 0, "the lossy links dropped none of {seen} frames");
    star.teardown().expect("teardown");
}

#[test]
fn bcast_baseline_four_ranks_exact_at_one_percent_loss() {
    exact_under_loss(4);
}

#[test]
fn bcast_baseline_eight_ranks_exact_at_one_percent_loss() {
    exact_under_loss(8);
}

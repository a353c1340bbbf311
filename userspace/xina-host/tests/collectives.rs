//! Every collective, element type and operation through the plans and
//! engines the drivers use, on the simulated lossy network with the switch
//! model in each delivery mode.

use std::time::Duration;

use xina_host::float::sum_error_bound;
use xina_host::sim::{Cluster, ClusterConfig, LinkConfig, Round, SplitMix64};
use xina_host::{Collective, Error, Mode, Scalar, Stats};
use xina_proto::{DType, Op};

fn cluster(fan_in: u8, e: u16, slots: u32, op: Op, dtype: DType, mode: Mode, seed: u64) -> Cluster {
    let mut config = ClusterConfig::new(fan_in, e, slots);
    config.op = op;
    config.dtype = dtype;
    config.mode = mode;
    config.seed = seed;
    config.link = LinkConfig::lossy(0.05, 0.02, 0.2);
    config.engine.give_up = Duration::from_secs(30);
    Cluster::new(config)
}

fn ok_stats(round: Round) -> Vec<Stats> {
    round
        .outcomes
        .into_iter()
        .enumerate()
        .map(|(rank, o)| match o {
            Some(Ok(s)) => s,
            Some(Err(e)) => panic!("rank {rank}: {e}"),
            None => panic!("rank {rank}: no outcome"),
        })
        .collect()
}

fn combine_i64(op: Op, a: i64, b: i64) -> i64 {
    match op {
        Op::Sum => a + b,
        Op::Max => a.max(b),
        Op::Min => a.min(b),
    }
}

/// Where rank `rank` holds results after `collective` over `len` elements.
fn region(collective: Collective, rank: u8, fan_in: u8, len: usize) -> std::ops::Range<usize> {
    match collective {
        Collective::Allreduce | Collective::Share => 0..len,
        Collective::Reduce { root } if root == rank => 0..len,
        Collective::ReduceScatter => {
            let part = len / usize::from(fan_in);
            usize::from(rank) * part..(usize::from(rank) + 1) * part
        }
        _ => 0..0,
    }
}

fn mode_of(collective: Collective) -> Mode {
    collective.mode().unwrap_or(Mode::Allreduce)
}

/// Integers of every collective, type and op: exact in the result region,
/// untouched elsewhere.
fn integers<T>(dtype: DType, input: fn(i64) -> T, to: fn(i64) -> T, from: fn(T) -> i64)
where
    T: Scalar + PartialEq + std::fmt::Debug,
{
    let fan_in = 4;
    for (i, collective) in [
        Collective::Allreduce,
        Collective::Reduce { root: 2 },
        Collective::ReduceScatter,
    ]
    .into_iter()
    .enumerate()
    {
        for op in [Op::Sum, Op::Max, Op::Min] {
            let seed = i as u64 * 10 + op as u64;
            let e = if dtype == DType::I64 { 90 } else { 100 };
            let mut c = cluster(fan_in, e, 6, op, dtype, mode_of(collective), seed);
            let len = 4 * 1234;
            let mut rng = SplitMix64::new(seed);
            let inputs: Vec<Vec<T>> = (0..fan_in)
                .map(|_| {
                    (0..len)
                        .map(|_| input(rng.up_to(2_000_000) as i64 - 1_000_000))
                        .collect()
                })
                .collect();
            let mut buffers = inputs.clone();
            ok_stats(c.call(collective, &mut buffers).expect("terminates"));
            for rank in 0..fan_in {
                let r = usize::from(rank);
                let region = region(collective, rank, fan_in, len);
                for j in 0..len {
                    let want = if region.contains(&j) {
                        let v = inputs
                            .iter()
                            .map(|b| from(b[j]))
                            .reduce(|a, b| combine_i64(op, a, b));
                        to(v.unwrap())
                    } else {
                        inputs[r][j]
                    };
                    assert_eq!(
                        buffers[r][j], want,
                        "{collective:?} {op:?} {dtype:?}: rank {rank}, element {j}"
                    );
                }
            }
        }
    }
}

#[test]
fn int32_collectives_are_exact_under_loss() {
    integers::<i32>(DType::I32, |v| v as i32, |v| v as i32, i64::from);
}

#[test]
fn int64_collectives_are_exact_under_loss() {
    integers::<i64>(DType::I64, |v| v << 20, |v| v, |v| v);
}

fn floats(rank: u8, len: usize, scale: f64, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ u64::from(rank) << 40);
    (0..len)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32)
        .collect()
}

#[test]
fn float_sums_are_within_the_documented_bound_in_every_mode() {
    for (i, collective) in [
        Collective::Allreduce,
        Collective::Reduce { root: 0 },
        Collective::ReduceScatter,
    ]
    .into_iter()
    .enumerate()
    {
        for (scale, fan_in) in [(1.0, 8u8), (3.0e-5, 3), (7.5e4, 5)] {
            let seed = i as u64 * 7 + u64::from(fan_in);
            let len = usize::from(fan_in) * 700;
            let mut c = cluster(
                fan_in,
                256,
                8,
                Op::Sum,
                DType::I32,
                mode_of(collective),
                seed,
            );
            let inputs: Vec<Vec<f32>> = (0..fan_in).map(|r| floats(r, len, scale, seed)).collect();
            let mut buffers = inputs.clone();
            let stats = ok_stats(c.call(collective, &mut buffers).expect("terminates"));
            assert!(stats.iter().all(|s| s.rescaled == 0));
            let max_abs = inputs.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
            let bound = sum_error_bound(max_abs, fan_in);
            let mut worst = 0f64;
            for rank in 0..fan_in {
                let r = usize::from(rank);
                let region = region(collective, rank, fan_in, len);
                for j in 0..len {
                    let got = buffers[r][j];
                    if !region.contains(&j) {
                        assert_eq!(got.to_bits(), inputs[r][j].to_bits(), "untouched");
                        continue;
                    }
                    let exact: f64 = inputs.iter().map(|b| f64::from(b[j])).sum();
                    let err = (f64::from(got) - exact).abs();
                    worst = worst.max(err / bound);
                    assert!(
                        err <= bound + exact.abs() * f64::from(f32::EPSILON) / 2.0,
                        "{collective:?} x{scale} n{fan_in}: rank {rank} [{j}] {got} vs {exact}, bound {bound}"
                    );
                }
            }
            println!(
                "{collective:?} scale {scale} n {fan_in}: worst error {worst:.3} of the bound"
            );
        }
    }
}

#[test]
fn float_max_and_min_are_bit_exact() {
    for op in [Op::Max, Op::Min] {
        let fan_in = 5;
        let mut c = cluster(fan_in, 64, 4, op, DType::I32, Mode::Allreduce, 3);
        let mut inputs: Vec<Vec<f32>> = (0..fan_in).map(|r| floats(r, 999, 1e30, 5)).collect();
        inputs[1][7] = f32::INFINITY;
        inputs[2][8] = f32::NEG_INFINITY;
        inputs[3][9] = -0.0;
        let mut buffers = inputs.clone();
        ok_stats(
            c.call(Collective::Allreduce, &mut buffers)
                .expect("terminates"),
        );
        for j in 0..999 {
            let column = inputs.iter().map(|b| b[j]);
            let want = if op == Op::Max {
                column.fold(f32::NEG_INFINITY, f32::max)
            } else {
                column.fold(f32::INFINITY, f32::min)
            };
            for b in &buffers {
                assert_eq!(b[j], want, "{op:?} [{j}]");
            }
        }
    }
}

#[test]
fn an_overflowing_float_sum_is_redone_at_the_safe_scale() {
    // No headroom: 4 ranks adding values near the largest of the scale
    // overflow int32 in the chunks where they all have the same sign.
    let fan_in = 4;
    let mut config = ClusterConfig::new(fan_in, 100, 8);
    config.engine.float_headroom_bits = Some(0);
    config.link = LinkConfig::lossy(0.02, 0.0, 0.1);
    let mut c = Cluster::new(config);
    let len = 1000;
    let inputs: Vec<Vec<f32>> = (0..fan_in)
        .map(|r| {
            (0..len)
                // Elements 300..500 add up in one direction on every rank.
                .map(|j| {
                    if (300..500).contains(&j) {
                        0.9
                    } else {
                        0.9 * if (j + usize::from(r)) % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        }
                    }
                })
                .collect()
        })
        .collect();
    let mut buffers = inputs.clone();
    let stats = ok_stats(
        c.call(Collective::Allreduce, &mut buffers)
            .expect("terminates"),
    );
    for s in &stats {
        // Chunks 3 and 4 (elements 300..500) overflowed.
        assert_eq!(s.rescaled, 2, "{s}");
        assert!(s.to_string().contains("2 rescaled"), "{s}");
    }
    for b in &buffers {
        for j in 0..len {
            let exact: f64 = inputs.iter().map(|x| f64::from(x[j])).sum();
            assert!(
                (f64::from(b[j]) - exact).abs() <= sum_error_bound(0.9, fan_in),
                "[{j}] {} vs {exact}",
                b[j]
            );
        }
    }
}

#[test]
fn a_nan_on_one_rank_fails_the_float_sum_on_every_rank() {
    let mut c = cluster(3, 256, 4, Op::Sum, DType::I32, Mode::Allreduce, 1);
    let mut buffers: Vec<Vec<f32>> = (0..3).map(|r| floats(r, 500, 1.0, 1)).collect();
    buffers[2][17] = f32::NAN;
    let round = c
        .call(Collective::Allreduce, &mut buffers)
        .expect("terminates");
    for (rank, o) in round.outcomes.iter().enumerate() {
        match o {
            Some(Err(e @ Error::NonFinite { .. })) => assert_eq!(
                e.to_string(),
                format!(
                    "job 1, rank {rank}: a float input is NaN or infinite on at least one rank"
                )
            ),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // The ranks are still in step.
    let mut again: Vec<Vec<f32>> = (0..3).map(|r| floats(r, 10, 1.0, 2)).collect();
    ok_stats(
        c.call(Collective::Allreduce, &mut again)
            .expect("terminates"),
    );
}

#[test]
fn ranks_that_disagree_on_the_length_fail_with_a_naming_error() {
    for mode in [Mode::Allreduce, Mode::ReduceScatter] {
        let mut c = cluster(3, 16, 4, Op::Sum, DType::I32, mode, 9);
        let collective = if mode == Mode::Allreduce {
            Collective::Allreduce
        } else {
            Collective::ReduceScatter
        };
        // Rank 1 is one packet longer: without the check its extra chunk
        // would meet the others' next call.
        let mut buffers = vec![vec![1i32; 48], vec![1; 48 + 48], vec![1; 48]];
        let round = c.call(collective, &mut buffers).expect("terminates");
        for (rank, o) in round.outcomes.iter().enumerate() {
            let len = buffers[rank].len();
            match o {
                Some(Err(Error::CallMismatch { len: l, .. })) => assert_eq!(*l, len),
                other => panic!("{mode}: rank {rank}: {other:?}"),
            }
        }
    }
}

#[test]
fn barriers_complete_in_every_mode() {
    for mode in [Mode::Allreduce, Mode::Reduce, Mode::ReduceScatter] {
        let mut c = cluster(6, 8, 2, Op::Sum, DType::I64, mode, 4);
        let mut none: Vec<Vec<i64>> = vec![Vec::new(); 6];
        let stats = ok_stats(c.call(Collective::Barrier, &mut none).expect("terminates"));
        assert!(stats.iter().all(|s| s.chunks >= 1));
    }
}

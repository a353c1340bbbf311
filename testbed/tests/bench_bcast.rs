//! `bench bcast`'s code path at small sizes (root needed): it measures xina
//! and every baseline at every size and loss and writes records with the
//! fields plots and comparisons read. Nothing here looks at the timings' values beyond
//! their being positive and consistent with each other.

use xina_testbed::bcast_bench::{BcastBenchSpec, Impl, judge_goals, run, table};

#[test]
fn bench_bcast_records_carry_every_field() {
    let spec = BcastBenchSpec {
        ranks: vec![3],
        sizes: vec![4, 1001, 65_536],
        reps: 2,
        losses: vec![0.0, 1.0],
        // Open MPI's rows have their own test (tests/mpi.rs).
        impls: Impl::ALL.into_iter().filter(|&i| i != Impl::Mpi).collect(),
        ..Default::default()
    };
    let records = run(&spec, |line| eprintln!("{line}")).expect("bench runs");
    assert_eq!(records.len(), 4 * 3 * 2, "impl x size x loss");
    let json = serde_json::to_value(&records).expect("records serialise");
    for loss in [0.0, 1.0] {
        for bytes in [4u64, 1001, 65_536] {
            for which in Impl::ALL.into_iter().filter(|&i| i != Impl::Mpi) {
                let implementation = which.name();
                let matching: Vec<_> = json
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|r| {
                        r["impl"] == implementation
                            && r["bytes"].as_u64() == Some(bytes)
                            && r["loss"].as_f64() == Some(loss)
                    })
                    .collect();
                assert_eq!(matching.len(), 1, "{implementation} {bytes} B loss {loss}");
                let r = matching[0];
                assert_eq!(r["ranks"], 3);
                assert_eq!(r["path"], which.path(), "{implementation}");
                assert!(r["retransmits"].is_u64());
                let (reps, iters) = (r["reps"].as_u64().unwrap(), r["iters"].as_u64().unwrap());
                assert_eq!(reps, 2);
                assert_eq!(
                    r["times_us"].as_array().map(Vec::len),
                    usize::try_from(reps * iters).ok()
                );
                let time = r["time_us"].as_f64().unwrap();
                let algbw = r["algbw_gbps"].as_f64().unwrap();
                assert!(time > 0.0 && time.is_finite(), "time_us {time}");
                let expect = bytes as f64 / time / 1e3;
                assert!((algbw - expect).abs() <= 1e-9 * expect, "algbw {algbw}");
                // The lossy links saw traffic only when attached.
                let seen = r["frames_seen"].as_u64().unwrap();
                assert_eq!(seen > 0, loss > 0.0, "frames_seen {seen} at loss {loss}");
            }
        }
    }
    for loss in [0.0, 1.0] {
        let text = table(&records, 3, loss);
        assert!(
            text.contains("64KiB") && text.contains("1001B") && text.contains("x unicast"),
            "{text}"
        );
        // A header and one row per size and implementation.
        assert_eq!(text.lines().count(), 1 + 4 * 3, "{text}");
        assert!(text.contains("xina"), "{text}");
    }
    // xina ran, but not at the goals' point (8 ranks, 64 MiB): the goals
    // say what they need.
    let goals = judge_goals(&records);
    assert_eq!(goals.len(), 2);
    for g in &goals {
        assert!(
            g.met.is_none() && g.detail.contains("not measured"),
            "{g:?}"
        );
    }
    // Without xina they cannot be judged at all.
    let baselines: Vec<_> = records
        .iter()
        .filter(|r| r.implementation != Impl::Xina)
        .cloned()
        .collect();
    for g in judge_goals(&baselines) {
        assert!(
            g.met.is_none() && g.detail.contains("cannot be judged"),
            "{g:?}"
        );
    }
}

//! `bench mpi`'s code path at small sizes (root, Open MPI): the one MPI
//! program runs with Open MPI's collectives and through xina's PMPI library
//! (every result checked inside it), and every record carries its fields.
//! Nothing here judges the timings beyond their being positive and
//! consistent.

use xina_testbed::mpi_bench::{Coll, MpiBenchSpec, judge_goals, run, table};

#[test]
fn bench_mpi_measures_both_columns_with_every_field() {
    let spec = MpiBenchSpec {
        ranks: vec![3],
        sizes: vec![8, 4004, 1 << 20],
        colls: vec![Coll::Allreduce, Coll::Bcast],
        frame: 9000,
        reps: 2,
    };
    // libxina_c.so, a dependency of this crate, next to this test binary.
    let exe = std::env::current_exe().unwrap();
    let lib_dir = exe.parent().unwrap();
    let records = run(&spec, lib_dir, |line| eprintln!("{line}")).expect("bench runs");
    // Both collectives by Open MPI and the PMPI library, allreduce also by
    // the Rust API.
    assert_eq!(records.len(), 2 * 3 * 2 + 3, "coll x size x implementation");
    for r in &records {
        assert_eq!(r.ranks, 3);
        assert_eq!(r.frame_bytes, 9000);
        // Two repetitions: a sample each for allreduce, several
        // broadcasts each for bcast.
        assert!(r.samples_us.len() >= 2, "{r:?}");
        assert!(
            r.min_us > 0.0 && r.min_us <= r.avg_us && r.avg_us <= r.max_us,
            "{r:?}"
        );
        assert!(r.algbw_gbps > 0.0, "{r:?}");
        let path = if r.implementation == "mpi" {
            "plain star"
        } else {
            "xdp switch"
        };
        assert_eq!(r.path, path);
    }
    let text = table(&records, Coll::Allreduce, 3);
    assert_eq!(text.lines().count(), 4, "{text}");
    // Goals name 8 ranks and 64 MiB: not measured here, so not judged.
    assert!(judge_goals(&records).iter().all(|g| g.met.is_none()));
    serde_json::to_string(&records).expect("records serialise");
}

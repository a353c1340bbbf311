//! Jobs sharing one switch and every worker link (root needed): both get a
//! share, and one job's stalled rank costs only that job.

use std::time::Duration;

use xina_testbed::share_bench::{ShareSpec, run, table};

#[test]
fn two_jobs_behind_the_same_shaped_links_both_finish_with_a_fair_share() {
    // About two seconds: long enough for the windows to converge (the
    // first tenths of a second can go 3:1 to whichever job starts first).
    let spec = ShareSpec {
        workers: 3,
        bytes: 4 << 20,
        calls: 16,
        ..ShareSpec::default()
    };
    let report = run(&spec).expect("the jobs run");
    let text = table(&report);
    println!("{text}");
    for job in &report.jobs {
        assert_eq!(job.error, None, "{text}");
        assert_eq!(job.calls, spec.calls, "{text}");
    }
    // 0.8 is about a 1:3 split; the benchmark shows 0.97-0.99 (README).
    assert!(report.jain >= 0.8, "{text}");
}

#[test]
fn a_stalled_rank_fails_its_own_job_and_not_the_other() {
    let spec = ShareSpec {
        workers: 3,
        bytes: 1 << 20,
        calls: 4,
        stall: Some(1),
        give_up: Duration::from_secs(1),
        ..ShareSpec::default()
    };
    let report = run(&spec).expect("the jobs run");
    let text = table(&report);
    let [healthy, stalled] = &report.jobs[..] else {
        panic!("{text}")
    };
    assert_eq!(healthy.error, None, "{text}");
    assert_eq!(healthy.calls, spec.calls, "{text}");
    assert_eq!(stalled.calls, 0, "{text}");
    let error = stalled.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("job 2") && error.contains("no new result"),
        "{error}\n{text}"
    );
}

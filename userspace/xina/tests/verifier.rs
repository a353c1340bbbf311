//! Every program of the dataplane, loaded as `xina switch up` loads it (the
//! same map sizes and globals), stays under a quarter of the verifier's
//! budget on the running kernel: a program near the budget today is refused
//! after the next kernel update (`ebpf/README.md`, "Verifier budget").
//! `testbed/scripts/kernels.sh` runs the same check on the other kernels
//! the project names.

use xina::{Dataplane, LoadOptions, verifier};
use xina_proto::maps::programs;

#[test]
fn every_program_is_far_under_the_verifiers_budget() {
    let dp = Dataplane::load(LoadOptions::default()).expect("load (are you root?)");
    let report = dp.verification();
    print!("{}", report.table());
    let expected = [
        programs::SWITCH,
        programs::EGRESS,
        programs::EGRESS_TEST,
        programs::DROP,
        programs::GROUP,
        programs::FANOUT,
    ]
    .into_iter()
    .chain(programs::AGGREGATE)
    .chain(programs::WIDE);
    for name in expected {
        let p = report
            .programs
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} was not loaded"));
        let insns = p
            .insns
            .unwrap_or_else(|| panic!("{name}: the kernel reported no verified instructions"));
        assert!(insns > 0);
        assert!(
            insns <= verifier::MARGIN,
            "{name}: {insns} instructions verified, more than a quarter of the budget ({})",
            verifier::MARGIN
        );
    }
}

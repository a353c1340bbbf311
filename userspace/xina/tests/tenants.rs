//! Many tenants on one switch, under `BPF_PROG_TEST_RUN` (root needed): 1,024
//! jobs installed at once, each with its own op and slot, each aggregating
//! only its own members' data.

use std::net::Ipv4Addr;

use xina::dataplane::xdp_action::{DROP as XDP_DROP, REDIRECT as XDP_REDIRECT};
use xina::{Dataplane, JobSpec, LoadOptions, MemberSpec, dataplane::Mode, frame};
use xina_proto::{DType, Flags, Kind, Op, Repr, counters::Counter};

const JOBS: u32 = 1024;
const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);

fn op_of(job: u32) -> Op {
    [Op::Sum, Op::Max, Op::Min][(job % 3) as usize]
}

/// Rank `rank` of job `job`: two hosts serve every job, each job on its own
/// UDP ports.
fn member(job: u32, rank: u8) -> MemberSpec {
    MemberSpec {
        rank,
        ip: Ipv4Addr::new(10, 77, 0, rank + 1),
        udp_port: 10_000 + u16::try_from(2 * job).unwrap() + u16::from(rank),
        mac: [0x02, 0x77, 0, 0, 0, rank + 1],
        ifindex: 100 + u32::from(rank),
        port_mac: [0x02, 0x5a, 0, 0, 0, rank + 1],
        sender: false,
        down: false,
    }
}

fn contribution(job: u32, rank: u8, claimed_job: u32, values: &[i32]) -> Vec<u8> {
    let m = member(job, rank);
    let repr = Repr {
        kind: Kind::AggData,
        flags: Flags::default(),
        job: claimed_job,
        rank,
        fan_in: 2,
        op: op_of(claimed_job),
        dtype: DType::I32,
        seq: 0,
        slot: 0,
        slot_version: false,
        count: u16::try_from(values.len()).unwrap(),
        exponent: 0,
        root: 0,
        bitmap: 1 << rank,
    };
    frame::from_member(&m, SWITCH_IP, &repr, &frame::i32_payload(values))
}

#[test]
fn a_thousand_jobs_aggregate_side_by_side() {
    let mut dp = Dataplane::load(LoadOptions {
        slot_pool: JOBS,
        debug: false,
        ..LoadOptions::default()
    })
    .expect("load (root?)");
    for job in 1..=JOBS {
        let spec = JobSpec {
            id: job,
            op: op_of(job),
            dtype: DType::I32,
            mode: Mode::Allreduce,
            elems_per_packet: 64,
            slot_base: job - 1,
            slot_count: 1,
            members: vec![member(job, 0), member(job, 1)],
        };
        dp.install_job(&spec)
            .unwrap_or_else(|e| panic!("job {job}: {e}"));
    }
    let j = i32::try_from(JOBS).unwrap();
    // Rank 0 of every job contributes first, so every job's slot is partial
    // at once, then rank 1 completes them in reverse order.
    for job in 1..=JOBS {
        let k = i32::try_from(job).unwrap();
        let out = dp
            .test_run_switch(&contribution(job, 0, job, &[k, -k, 7]), 0)
            .unwrap();
        assert_eq!(out.action, XDP_DROP, "job {job}: consumed");
    }
    // A member of job 5 cannot touch job 6's slot, whatever it claims: its
    // address and port are not job 6's rank 1.
    let before = dp.counters().unwrap();
    let out = dp
        .test_run_switch(&contribution(5, 1, 6, &[1_000_000, 0, 0]), 0)
        .unwrap();
    assert_eq!(out.action, XDP_DROP);
    let d = dp.counters().unwrap().delta(&before);
    assert_eq!(d.get(Counter::DropNotMember), 1);
    for job in (1..=JOBS).rev() {
        let k = i32::try_from(job).unwrap();
        let out = dp
            .test_run_switch(&contribution(job, 1, job, &[j - k, k, 7]), 0)
            .unwrap();
        assert_eq!(out.action, XDP_REDIRECT, "job {job}: completed");
        let p = frame::parse(&out.frame).unwrap();
        let want = match op_of(job) {
            Op::Sum => vec![j, 0, 14],
            Op::Max => vec![k.max(j - k), k, 7],
            Op::Min => vec![k.min(j - k), -k, 7],
        };
        assert_eq!(
            (p.repr.job, p.values),
            (job, want),
            "job {job} ({:?})",
            op_of(job)
        );
        let c = dp.job_counters(job).unwrap();
        assert_eq!(
            (
                c.get(Counter::Contributions),
                c.get(Counter::Completed),
                c.get(Counter::DropNotMember)
            ),
            (2, 1, u64::from(job == 6)),
            "job {job}'s own counters"
        );
    }
    let all = dp.counters().unwrap();
    assert_eq!(all.get(Counter::Completed), u64::from(JOBS));
    assert_eq!(all.get(Counter::Contributions), 2 * u64::from(JOBS));
}

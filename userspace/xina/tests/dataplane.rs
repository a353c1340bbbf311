//! The XDP dataplane under `BPF_PROG_TEST_RUN`: crafted frames in, the XDP
//! action, the bytes out, the slot state and the counters checked. No
//! interface is needed (root is: loading BPF programs needs it).

use std::net::Ipv4Addr;

use xina::{
    Counters, Dataplane, JobSpec, LoadOptions, MemberSpec,
    dataplane::Mode,
    frame::{self, Endpoint},
};
use xina_proto::{
    DType, Flags, Kind, MAGIC, Op, Repr, XINA_UDP_PORT, counters::Counter, header::field,
    maps::slot_state,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

const JOB: u32 = 7;
const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);

fn member(rank: u8) -> MemberSpec {
    MemberSpec {
        rank,
        ip: Ipv4Addr::new(10, 77, 0, rank + 1),
        udp_port: 5000 + u16::from(rank),
        mac: [0x02, 0x77, 0, 0, 0, rank + 1],
        ifindex: 100 + u32::from(rank),
        port_mac: [0x02, 0x5a, 0, 0, 0, rank + 1],
    }
}

fn job(fan_in: u8, slot_count: u32) -> JobSpec {
    JobSpec {
        id: JOB,
        op: Op::Sum,
        dtype: DType::I32,
        mode: Mode::Allreduce,
        elems_per_packet: 256,
        slot_base: 10,
        slot_count,
        members: (0..fan_in).map(member).collect(),
    }
}

fn dataplane(fan_in: u8) -> Dataplane {
    let mut dp = Dataplane::load(LoadOptions {
        slot_pool: 64,
        debug: false,
    })
    .expect("load (are you root?)");
    dp.install_job(&job(fan_in, 4)).expect("install job");
    dp
}

fn repr(rank: u8, fan_in: u8, seq: u32, count: u16) -> Repr {
    Repr {
        kind: Kind::AggData,
        flags: Flags::default(),
        job: JOB,
        rank,
        fan_in,
        op: Op::Sum,
        dtype: DType::I32,
        seq,
        slot: seq % 4,
        slot_version: (seq / 4) % 2 == 1,
        count,
        exponent: 0,
        root: 0,
        bitmap: 1 << rank,
    }
}

fn contribution(rank: u8, fan_in: u8, seq: u32, values: &[i32]) -> Vec<u8> {
    let m = member(rank);
    let count = u16::try_from(values.len()).unwrap();
    frame::build(
        Endpoint {
            mac: m.mac,
            ip: m.ip,
            port: m.udp_port,
        },
        Endpoint {
            mac: m.port_mac,
            ip: SWITCH_IP,
            port: XINA_UDP_PORT,
        },
        &repr(rank, fan_in, seq, count),
        &frame::i32_payload(values),
    )
}

fn delta(dp: &Dataplane, before: &Counters) -> Vec<(&'static str, u64)> {
    let d = dp.counters().unwrap().delta(before);
    Counter::ALL
        .iter()
        .filter(|c| d.get(**c) != 0)
        .map(|c| (c.name(), d.get(*c)))
        .collect()
}

#[test]
fn first_middle_last_contribution() {
    let mut dp = dataplane(3);
    let a = [1, -2, i32::MAX - 10, 7];
    let b = [10, 20, 5, -7];
    let c = [100, 200, 4, 0];

    let before = dp.counters().unwrap();
    let out = dp.test_run_switch(&contribution(0, 3, 0, &a), 0).unwrap();
    assert_eq!(out.action, XDP_DROP, "the first contribution is consumed");
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("contributions", 1), ("consumed", 1)]
    );
    let s = dp.slot(10, false).unwrap();
    assert_eq!(
        (s.state, s.seq, s.count, s.bitmap),
        (slot_state::PARTIAL, 0, 4, 0b001)
    );
    assert_eq!(&s.values[..4], &a.map(i64::from));

    let before = dp.counters().unwrap();
    let out = dp.test_run_switch(&contribution(1, 3, 0, &b), 0).unwrap();
    assert_eq!(out.action, XDP_DROP, "a middle contribution is consumed");
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("contributions", 1), ("consumed", 1)]
    );
    let s = dp.slot(10, false).unwrap();
    assert_eq!((s.state, s.bitmap), (slot_state::PARTIAL, 0b011));
    assert_eq!(&s.values[..4], &[11, 18, i64::from(i32::MAX) - 5, 0]);

    let before = dp.counters().unwrap();
    let input = contribution(2, 3, 0, &c);
    let out = dp.test_run_switch(&input, 0).unwrap();
    assert_eq!(
        out.action, XDP_REDIRECT,
        "the last contribution is broadcast"
    );
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("contributions", 1), ("completed", 1)]
    );
    let s = dp.slot(10, false).unwrap();
    assert_eq!(
        (s.state, s.bitmap, s.flags),
        (slot_state::COMPLETE, 0b111, 0)
    );

    let p = frame::parse(&out.frame).expect("a xina frame");
    let sum = [111, 218, i32::MAX - 1, 0];
    assert_eq!(p.values, sum);
    assert_eq!(p.repr.kind, Kind::AggResult);
    assert_eq!(p.repr.bitmap, 0b111);
    assert_eq!(p.repr.flags, Flags::default());
    assert_eq!((p.repr.job, p.repr.seq, p.repr.count), (JOB, 0, 4));
    assert_eq!(
        p.src.ip, SWITCH_IP,
        "the result comes from the switch's address"
    );
    assert_eq!(p.src.port, XINA_UDP_PORT);
    assert!(
        p.ip_checksum_ok && p.udp_checksum_ok,
        "checksums stay valid"
    );
    // Only the xina fields, addresses and ports change; sizes do not.
    assert_eq!(out.frame.len(), input.len());

    // Each broadcast copy is addressed to the member behind its port.
    for rank in 0..3 {
        let m = member(rank);
        let before = dp.counters().unwrap();
        let copy = dp.test_run_egress(&out.frame, m.ifindex).unwrap();
        assert_eq!(copy.action, XDP_PASS, "copy to rank {rank} is sent");
        assert_eq!(delta(&dp, &before), [("results_sent", 1)]);
        let q = frame::parse(&copy.frame).unwrap();
        assert_eq!(
            q.dst,
            Endpoint {
                mac: m.mac,
                ip: m.ip,
                port: m.udp_port
            }
        );
        assert_eq!(
            q.src,
            Endpoint {
                mac: m.port_mac,
                ip: SWITCH_IP,
                port: XINA_UDP_PORT
            }
        );
        assert_eq!(q.values, sum);
        assert!(
            q.ip_checksum_ok && q.udp_checksum_ok,
            "copy to rank {rank}: checksums"
        );
    }
    // A port without a member of the job gets nothing.
    let before = dp.counters().unwrap();
    assert_eq!(
        dp.test_run_egress(&out.frame, 999).unwrap().action,
        XDP_DROP
    );
    assert_eq!(delta(&dp, &before), [("egress_not_member", 1)]);
}

#[test]
fn duplicate_contribution_is_not_added_twice() {
    let mut dp = dataplane(3);
    dp.test_run_switch(&contribution(0, 3, 0, &[5, 6]), 0)
        .unwrap();
    let before = dp.counters().unwrap();
    let out = dp
        .test_run_switch(&contribution(0, 3, 0, &[5, 6]), 0)
        .unwrap();
    assert_eq!(out.action, XDP_DROP);
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("drop_duplicate", 1)]
    );
    let s = dp.slot(10, false).unwrap();
    assert_eq!((s.bitmap, &s.values[..2]), (0b001, &[5, 6][..]));
}

#[test]
fn retransmission_after_completion_is_answered_from_the_slot() {
    let mut dp = dataplane(2);
    dp.test_run_switch(&contribution(0, 2, 0, &[1, 2]), 0)
        .unwrap();
    dp.test_run_switch(&contribution(1, 2, 0, &[3, 4]), 0)
        .unwrap();
    // Rank 1 lost its result and retransmits.
    let before = dp.counters().unwrap();
    let out = dp
        .test_run_switch(&contribution(1, 2, 0, &[3, 4]), 0)
        .unwrap();
    assert_eq!(out.action, XDP_REDIRECT);
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("reply_from_cache", 1)]
    );
    let p = frame::parse(&out.frame).unwrap();
    assert_eq!(p.values, [4, 6]);
    assert_eq!(p.repr.kind, Kind::AggResult);
    assert!(p.repr.flags.contains(Flags::FROM_CACHE));
    let m = member(1);
    assert_eq!(
        p.dst,
        Endpoint {
            mac: m.mac,
            ip: m.ip,
            port: m.udp_port
        },
        "unicast to the sender"
    );
    assert_eq!(
        p.src,
        Endpoint {
            mac: m.port_mac,
            ip: SWITCH_IP,
            port: XINA_UDP_PORT
        }
    );
    assert!(p.ip_checksum_ok && p.udp_checksum_ok);
}

#[test]
fn slot_is_reused_for_a_later_chunk_and_stale_chunks_are_dropped() {
    let mut dp = dataplane(2);
    // Chunks 0 and 8 share slot 0, copy 0 (window 4: 8 = 0 + 2 * 4).
    for rank in 0..2 {
        dp.test_run_switch(&contribution(rank, 2, 0, &[1]), 0)
            .unwrap();
    }
    let out = dp
        .test_run_switch(&contribution(0, 2, 8, &[40]), 0)
        .unwrap();
    assert_eq!(out.action, XDP_DROP);
    let s = dp.slot(10, false).unwrap();
    assert_eq!(
        (s.state, s.seq, s.bitmap, s.values[0]),
        (slot_state::PARTIAL, 8, 0b01, 40)
    );
    let before = dp.counters().unwrap();
    let out = dp.test_run_switch(&contribution(1, 2, 0, &[1]), 0).unwrap();
    assert_eq!(out.action, XDP_DROP);
    assert_eq!(delta(&dp, &before), [("rx_packets", 1), ("drop_stale", 1)]);
    let out = dp.test_run_switch(&contribution(1, 2, 8, &[2]), 0).unwrap();
    assert_eq!(out.action, XDP_REDIRECT);
    assert_eq!(frame::parse(&out.frame).unwrap().values, [42]);
}

#[test]
fn saturating_sum_sets_overflow() {
    let mut dp = dataplane(2);
    dp.test_run_switch(&contribution(0, 2, 0, &[i32::MAX, i32::MIN, 1]), 0)
        .unwrap();
    let out = dp
        .test_run_switch(&contribution(1, 2, 0, &[1, -1, 1]), 0)
        .unwrap();
    let p = frame::parse(&out.frame).unwrap();
    assert_eq!(p.values, [i32::MAX, i32::MIN, 2]);
    assert!(p.repr.flags.contains(Flags::OVERFLOW));
    assert!(p.udp_checksum_ok);
}

#[test]
fn unknown_job_non_member_and_bad_slot_are_dropped_and_counted() {
    let mut dp = dataplane(2);
    type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: [(&str, Mutation); 5] = [
        (
            "drop_unknown_job",
            Box::new(|f| f[frame::XINA + field::JOB.start + 3] = 8),
        ),
        (
            "drop_not_member",
            Box::new(|f| f[frame::XINA + field::RANK] = 5),
        ),
        // Source port of another member: not who rank 0 is.
        ("drop_not_member", Box::new(|f| f[14 + 20 + 1] ^= 1)),
        (
            "drop_bad_slot",
            Box::new(|f| f[frame::XINA + field::SLOT.start + 3] = 4),
        ),
        (
            "drop_bad_shape",
            Box::new(|f| f[frame::XINA + field::OP] = Op::Max as u8),
        ),
    ];
    for (counter, mutate) in cases {
        let mut f = contribution(0, 2, 0, &[1, 2]);
        mutate(&mut f);
        let before = dp.counters().unwrap();
        let out = dp.test_run_switch(&f, 0).unwrap();
        assert_eq!(out.action, XDP_DROP, "{counter}");
        assert_eq!(delta(&dp, &before), [("rx_packets", 1), (counter, 1)]);
    }
    let s = dp.slot(10, false).unwrap();
    assert_eq!(
        s.state,
        slot_state::EMPTY,
        "no dropped packet touched the slot"
    );
}

#[test]
fn truncated_and_foreign_frames() {
    let mut dp = dataplane(2);
    let full = contribution(0, 2, 0, &[1, 2, 3]);
    // Cut inside the xina header, and inside the payload.
    for len in [frame::XINA + 10, full.len() - 2] {
        let before = dp.counters().unwrap();
        let out = dp.test_run_switch(&full[..len], 0).unwrap();
        assert_eq!(out.action, XDP_DROP, "{len} bytes");
        assert_eq!(
            delta(&dp, &before),
            [("rx_packets", 1), ("drop_truncated", 1)]
        );
    }
    // Bad magic on the xina port.
    let mut bad = full.clone();
    bad[frame::XINA] = MAGIC ^ 0xff;
    let before = dp.counters().unwrap();
    assert_eq!(dp.test_run_switch(&bad, 0).unwrap().action, XDP_DROP);
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("drop_bad_header", 1)]
    );
    // Other UDP traffic, a frame cut after the Ethernet header, and ARP pass
    // unchanged (the kernel judges them).
    let mut other = full.clone();
    other[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&53u16.to_be_bytes());
    let mut arp = full[..60].to_vec();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    for f in [other, full[..14].to_vec(), arp] {
        let before = dp.counters().unwrap();
        let out = dp.test_run_switch(&f, 0).unwrap();
        assert_eq!(out.action, XDP_PASS);
        assert_eq!(out.frame, f, "passed unchanged");
        assert_eq!(delta(&dp, &before), [("rx_packets", 1), ("passed", 1)]);
    }
    assert_eq!(dp.slot(10, false).unwrap().state, slot_state::EMPTY);
}

#[test]
fn bad_jobs_are_refused_and_leave_nothing() {
    let mut dp = Dataplane::load(LoadOptions {
        slot_pool: 32,
        debug: false,
    })
    .unwrap();
    dp.install_job(&job(2, 8)).unwrap();
    let mut other = job(2, 8);
    other.id = 8;
    let err = dp.install_job(&other).unwrap_err().to_string();
    assert!(err.contains("overlap job 7"), "{err}");
    other.slot_base = 28;
    let err = dp.install_job(&other).unwrap_err().to_string();
    assert!(
        err.contains("slots 28..36 do not fit the pool of 32 slots"),
        "{err}"
    );
    other.slot_base = 17;
    let err = dp.install_job(&other).unwrap_err().to_string();
    assert!(
        err.contains("slots 17..25 overlap job 7's slots 10..18"),
        "{err}"
    );
    other.slot_base = 0;
    other.slot_count = 8;
    dp.install_job(&other).unwrap();
    // Job 8's traffic is refused once it is removed.
    dp.remove_job(8).unwrap();
    let mut f = contribution(0, 2, 0, &[1]);
    f[frame::XINA + field::JOB.start + 3] = 8;
    let before = dp.counters().unwrap();
    assert_eq!(dp.test_run_switch(&f, 0).unwrap().action, XDP_DROP);
    assert_eq!(
        delta(&dp, &before),
        [("rx_packets", 1), ("drop_unknown_job", 1)]
    );
}

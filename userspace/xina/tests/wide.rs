//! The wide path (jobs above one 1,500-byte frame per packet, up to 64 KB
//! multi-buffer frames) under `BPF_PROG_TEST_RUN`: every step of the state
//! machine with exact bytes, checksums and counters, contributions from
//! different CPUs merged, frames whose fragments split an element, and the
//! control plane's refusals.
//!
//! `BPF_PROG_TEST_RUN` hands a frags-capable program a frame longer than
//! 3,520 bytes as a multi-buffer frame (a linear part, then 4 KiB
//! fragments), as a veth does.

mod common;

use std::net::Ipv4Addr;

use common::{egress, hex, ingress};
use xina::dataplane::xdp_action::{DROP as XDP_DROP, PASS as XDP_PASS, REDIRECT as XDP_REDIRECT};
use xina::{
    Dataplane, JobSpec, MemberSpec,
    dataplane::Mode,
    frame::{self, Endpoint},
};
use xina_proto::{
    DType, Flags, Kind, Op, Repr, XINA_UDP_PORT,
    counters::Counter,
    frame::{PAYLOAD, blocks, elems_for_mtu},
    maps::{FanoutMeta, slot_state},
};

const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 254);
const POOL: u32 = 512;

fn member(rank: u8) -> MemberSpec {
    MemberSpec {
        rank,
        ip: Ipv4Addr::new(10, 78, 0, rank + 1),
        udp_port: 6000 + u16::from(rank),
        mac: [0x02, 0x78, 0, 0, 0, rank + 1],
        ifindex: 200 + u32::from(rank),
        port_mac: [0x02, 0x5b, 0, 0, 0, rank + 1],
        sender: false,
        down: false,
    }
}

fn wide_job(id: u32, fan_in: u8, op: Op, dtype: DType, elems: u16, slots: u32) -> JobSpec {
    JobSpec {
        id,
        op,
        dtype,
        mode: Mode::Allreduce,
        elems_per_packet: elems,
        // Each job its own range, so that a failed test's leftovers do
        // not get in the way of the others.
        slot_base: (id - 40) * 64,
        slot_count: slots,
        members: (0..fan_in).map(member).collect(),
    }
}

fn header(job: &JobSpec, kind: Kind, rank: u8, seq: u32, count: usize) -> Repr {
    Repr {
        kind,
        flags: Flags::default(),
        job: job.id,
        rank,
        fan_in: u8::try_from(job.members.len()).unwrap(),
        op: job.op,
        dtype: job.dtype,
        seq,
        slot: seq % job.slot_count,
        slot_version: (seq / job.slot_count) % 2 == 1,
        count: u16::try_from(count).unwrap(),
        exponent: 0,
        root: 0,
        bitmap: 1 << rank,
    }
}

fn encode(dtype: DType, values: &[i64]) -> Vec<u8> {
    match dtype {
        DType::I32 => values
            .iter()
            .flat_map(|v| i32::try_from(*v).expect("an int32").to_be_bytes())
            .collect(),
        _ => frame::i64_payload(values),
    }
}

/// Rank `rank`'s contribution `values` to chunk `seq`.
fn contribution(job: &JobSpec, rank: u8, seq: u32, values: &[i64]) -> Vec<u8> {
    let m = member(rank);
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
        &header(job, Kind::AggData, rank, seq, values.len()),
        &encode(job.dtype, values),
    )
}

/// The result frame the switch makes of the packet of `rank` (which it
/// came in as): kind, flags and bitmap set, addresses and ports swapped.
fn result(job: &JobSpec, rank: u8, seq: u32, values: &[i64], flags: u8, unicast: bool) -> Vec<u8> {
    let m = member(rank);
    let mut repr = header(job, Kind::AggResult, rank, seq, values.len());
    repr.flags = Flags(flags);
    repr.bitmap = job.all_ranks();
    let (src_mac, dst_mac) = if unicast {
        (m.port_mac, m.mac)
    } else {
        (m.mac, m.port_mac)
    };
    frame::build(
        Endpoint {
            mac: src_mac,
            ip: SWITCH_IP,
            port: XINA_UDP_PORT,
        },
        Endpoint {
            mac: dst_mac,
            ip: m.ip,
            port: m.udp_port,
        },
        &repr,
        &encode(job.dtype, values),
    )
}

#[track_caller]
fn assert_frame(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        let around = |f: &[u8]| hex(&f[at.saturating_sub(8).min(f.len())..(at + 8).min(f.len())]);
        panic!(
            "{what}: frames differ at byte {at} (got {} bytes, want {}): got ..{}.. want ..{}..",
            got.len(),
            want.len(),
            around(got),
            around(want)
        );
    }
    let p = frame::parse(got).unwrap_or_else(|| panic!("{what}: not an xina frame"));
    assert!(p.lengths_ok && p.ip_checksum_ok, "{what}: IPv4");
    assert!(
        p.udp_checksum != 0 && p.udp_checksum_ok,
        "{what}: UDP checksum"
    );
}

/// The fan-out mark of a completed result.
#[track_caller]
fn assert_marked(meta: &[u8], job: &JobSpec) {
    assert_eq!(meta.len(), size_of::<FanoutMeta>(), "the fan-out mark");
    let key = u32::from_ne_bytes(meta[0..4].try_into().unwrap());
    let id = u32::from_ne_bytes(meta[4..8].try_into().unwrap());
    assert_ne!(key, 0, "the fan-out key");
    assert_eq!(id, job.id, "the job in the fan-out mark");
}

/// Runs `f` on CPU `cpu` (the wide path keeps one partial per CPU).
fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> T {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    // SAFETY: plain syscalls on this thread's affinity mask.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut old);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % cpus, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set),
            0,
            "pinning to CPU {cpu}"
        );
        let r = f();
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const old);
        r
    }
}

/// Deterministic values of rank `rank`, in the type's range.
fn values(dtype: DType, rank: u8, seq: u32, n: usize) -> Vec<i64> {
    (0..n)
        .map(|i| {
            let x = (i as i64 * 7919 + i64::from(rank) * 104_729 + i64::from(seq) * 31) % 2_000_003
                - 1_000_000;
            match dtype {
                DType::I32 => x * 1000,
                _ => x * 1_000_000_007,
            }
        })
        .collect()
}

fn combine(op: Op, dtype: DType, inputs: &[Vec<i64>]) -> (Vec<i64>, bool) {
    let n = inputs[0].len();
    let mut over = false;
    let out = (0..n)
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            match op {
                Op::Max => col.max().unwrap(),
                Op::Min => col.min().unwrap(),
                Op::Sum => {
                    let s: i128 = col.map(i128::from).sum();
                    let (lo, hi) = match dtype {
                        DType::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
                        _ => (i128::from(i64::MIN), i128::from(i64::MAX)),
                    };
                    let c = s.clamp(lo, hi);
                    over |= c != s;
                    i64::try_from(c).unwrap()
                }
            }
        })
        .collect();
    (out, over)
}

/// Every rank of `job` contributes to `seq` in rank order, rank `r` on CPU
/// `r`; all but the last are consumed, the last completes: checks counters,
/// the result frame, its checksum and the fan-out mark. Returns the inputs.
fn complete(dp: &mut Dataplane, job: &JobSpec, seq: u32, count: usize) -> Vec<Vec<i64>> {
    let fan_in = u8::try_from(job.members.len()).unwrap();
    let inputs: Vec<Vec<i64>> = (0..fan_in)
        .map(|r| values(job.dtype, r, seq, count))
        .collect();
    let what = format!("{:?} {:?} x{count}", job.op, job.dtype);
    for r in 0..fan_in - 1 {
        let f = contribution(job, r, seq, &inputs[usize::from(r)]);
        on_cpu(usize::from(r), || ingress(dp, job, &f)).expect(
            XDP_DROP,
            &[Counter::Contributions, Counter::Consumed],
            true,
            &format!("{what}: rank {r} consumed"),
        );
    }
    let last = fan_in - 1;
    let f = contribution(job, last, seq, &inputs[usize::from(last)]);
    let out = on_cpu(usize::from(last), || ingress(dp, job, &f)).expect(
        XDP_PASS,
        &[Counter::Contributions, Counter::Completed],
        true,
        &format!("{what}: the last rank completes"),
    );
    let (want, over) = combine(job.op, job.dtype, &inputs);
    let flags = if over { Flags::OVERFLOW } else { 0 };
    assert_frame(
        &out.frame,
        &result(job, last, seq, &want, flags, false),
        &format!("{what}: the result"),
    );
    assert_marked(&out.meta, job);
    inputs
}

#[test]
fn every_type_and_op_at_every_frame_size() {
    // The claim below: the linear part ends inside an element of either type.
    assert_ne!((3520 - PAYLOAD) % 4, 0);
    assert_ne!((3520 - PAYLOAD) % 8, 0);
    let mut dp = common::shared(POOL);
    // 9000- and 65000-byte MTUs, and a count whose last step is short; every
    // frame above 3,520 bytes is multi-buffer, and at these counts an element
    // straddles the end of the linear part (74 + 4 × 861.5 = 3,520).
    for dtype in [DType::I32, DType::I64] {
        for op in [Op::Sum, Op::Max, Op::Min] {
            for elems in [
                elems_for_mtu(dtype, 9000),
                elems_for_mtu(dtype, 65_000),
                dtype.narrow_elems() + 1,
            ] {
                let elems = u16::try_from(elems).unwrap();
                let job = wide_job(40, 3, op, dtype, elems, 2);
                dp.install_job(&job).expect("install");
                assert!(job.is_wide());
                let full = usize::from(elems);
                // Chunk 0 full, chunk 1 short (another copy), chunk 2 with one
                // element, then chunk 4: copy 0 again, reused.
                complete(&mut dp, &job, 0, full);
                complete(&mut dp, &job, 1, full / 3 + 1);
                complete(&mut dp, &job, 2, 1);
                complete(&mut dp, &job, 4, full);
                dp.remove_job(job.id).unwrap();
            }
        }
    }
}

#[test]
fn saturation_and_clamping_set_overflow() {
    let mut dp = common::shared(POOL);
    for dtype in [DType::I32, DType::I64] {
        let job = wide_job(41, 2, Op::Sum, dtype, 2000, 1);
        dp.install_job(&job).unwrap();
        let big = match dtype {
            DType::I32 => i64::from(i32::MAX),
            _ => i64::MAX,
        };
        let mut a = values(dtype, 0, 0, 2000);
        let mut b = values(dtype, 1, 0, 2000);
        a[1500] = big;
        b[1500] = big;
        a[3] = -big;
        b[3] = -big;
        let f = contribution(&job, 0, 0, &a);
        on_cpu(0, || ingress(&mut dp, &job, &f)).expect(
            XDP_DROP,
            &[Counter::Contributions, Counter::Consumed],
            true,
            "first",
        );
        let f = contribution(&job, 1, 0, &b);
        let out = on_cpu(1, || ingress(&mut dp, &job, &f)).expect(
            XDP_PASS,
            &[Counter::Contributions, Counter::Completed],
            true,
            "completing",
        );
        let (want, over) = combine(Op::Sum, dtype, &[a.clone(), b]);
        assert!(over);
        assert_frame(
            &out.frame,
            &result(&job, 1, 0, &want, Flags::OVERFLOW, false),
            &format!("{dtype:?}: clamped"),
        );
        // A repeat is answered from the stored sums, clamped the same way,
        // from the other CPU too.
        let f = contribution(&job, 0, 0, &a);
        let out = on_cpu(0, || ingress(&mut dp, &job, &f)).expect(
            XDP_REDIRECT,
            &[Counter::ReplyFromCache],
            true,
            "a repeat",
        );
        assert_frame(
            &out.frame,
            &result(&job, 0, 0, &want, Flags::OVERFLOW | Flags::FROM_CACHE, true),
            &format!("{dtype:?}: clamped from the cache"),
        );
        dp.remove_job(job.id).unwrap();
    }
}

#[test]
fn repeats_stale_chunks_and_bad_shapes() {
    let mut dp = common::shared(POOL);
    let job = wide_job(42, 3, Op::Sum, DType::I32, 16_000, 2);
    dp.install_job(&job).unwrap();
    let n = 16_000;
    let v = |r: u8| values(DType::I32, r, 0, n);
    let own = [Counter::Contributions, Counter::Consumed];

    let f0 = contribution(&job, 0, 0, &v(0));
    on_cpu(0, || ingress(&mut dp, &job, &f0)).expect(XDP_DROP, &own, true, "rank 0");
    // A repeat while the chunk is partial: a duplicate, nothing added.
    on_cpu(1, || ingress(&mut dp, &job, &f0)).expect(
        XDP_DROP,
        &[Counter::DropDuplicate],
        true,
        "a duplicate",
    );
    // Another element count than the chunk's: bad shape.
    let short = contribution(&job, 1, 0, &v(1)[..100]);
    ingress(&mut dp, &job, &short).expect(
        XDP_DROP,
        &[Counter::DropBadShape],
        true,
        "another count",
    );
    // A chunk this copy neither holds nor may take next (it holds 0 and
    // takes 4 = 0 + 2W next; 8 maps to it too): stale.
    let stale = contribution(&job, 1, 8, &v(1));
    ingress(&mut dp, &job, &stale).expect(XDP_DROP, &[Counter::DropStale], true, "stale");
    // More elements than the job's packets.
    let mut too_many = v(1);
    too_many.push(1);
    let f = contribution(&job, 1, 0, &too_many);
    ingress(&mut dp, &job, &f).expect(XDP_DROP, &[Counter::DropBadShape], true, "too many");
    // A frame cut short of its announced payload (multi-buffer).
    let mut cut = contribution(&job, 1, 0, &v(1));
    cut.truncate(cut.len() - 4);
    ingress(&mut dp, &job, &cut).expect(XDP_DROP, &[Counter::DropTruncated], true, "cut");

    let f1 = contribution(&job, 1, 0, &v(1));
    on_cpu(1, || ingress(&mut dp, &job, &f1)).expect(XDP_DROP, &own, true, "rank 1");
    let f2 = contribution(&job, 2, 0, &v(2));
    let out = on_cpu(0, || ingress(&mut dp, &job, &f2)).expect(
        XDP_PASS,
        &[Counter::Contributions, Counter::Completed],
        true,
        "rank 2 completes",
    );
    let (want, over) = combine(Op::Sum, DType::I32, &[v(0), v(1), v(2)]);
    let flags = if over { Flags::OVERFLOW } else { 0 };
    assert_frame(
        &out.frame,
        &result(&job, 2, 0, &want, flags, false),
        "result",
    );
    let slot = dp.slot(job.slot_base, false).unwrap();
    assert_eq!(
        (slot.state, slot.seq, slot.bitmap, slot.landed),
        (slot_state::COMPLETE, 0, 0b111, 0b111)
    );

    // A repeat of a finished chunk, from any rank and CPU: the stored
    // result, back to that rank alone, flagged from the cache.
    for (rank, cpu) in [(0, 1), (2, 0), (1, 0)] {
        let f = contribution(&job, rank, 0, &v(rank));
        let out = on_cpu(cpu, || ingress(&mut dp, &job, &f)).expect(
            XDP_REDIRECT,
            &[Counter::ReplyFromCache],
            true,
            "from the cache",
        );
        assert!(out.meta.is_empty(), "a reply is not fanned out");
        let reply = result(&job, rank, 0, &want, flags | Flags::FROM_CACHE, true);
        assert_frame(&out.frame, &reply, &format!("rank {rank}: from the cache"));
        // Its one devmap entry's egress program takes the 64 KB frame and
        // addresses it to the member behind the port: the frame it is.
        let m = member(rank);
        let out = egress(&mut dp, &job, &out.frame, m.ifindex).expect(
            XDP_PASS,
            &[Counter::ResultsSent],
            true,
            "the reply's egress",
        );
        assert_frame(&out.frame, &reply, &format!("rank {rank}: addressed"));
        // Behind another port it is no member's.
        egress(&mut dp, &job, &reply, 999).expect(
            XDP_DROP,
            &[Counter::EgressNotMember],
            true,
            "no member there",
        );
    }
    dp.remove_job(job.id).unwrap();
}

#[test]
fn one_rank_completes_alone() {
    let mut dp = common::shared(POOL);
    let job = wide_job(43, 1, Op::Max, DType::I64, 8_064, 1);
    dp.install_job(&job).unwrap();
    complete(&mut dp, &job, 0, 8_064);
    complete(&mut dp, &job, 1, 5);
    dp.remove_job(job.id).unwrap();
}

#[test]
fn wide_jobs_are_allreduce_only_and_fit_the_pool() {
    let mut dp = common::shared(POOL);
    let mut job = wide_job(44, 2, Op::Sum, DType::I32, 400, 2);
    job.mode = Mode::Reduce;
    let e = dp.install_job(&job).unwrap_err().to_string();
    assert!(e.contains("only allreduce"), "{e}");
    assert!(dp.job(44).is_none());

    // More units than the pool has: refused, naming the pool.
    let (units, cpus) = dp.unit_pool();
    // One slot more than the pool holds.
    let slots = units / (2 * cpus * blocks(16_128) as u32) + 1;
    let job = wide_job(45, 2, Op::Sum, DType::I32, 16_128, slots);
    assert!(dp.units_needed(&job) > u64::from(units));
    let e = dp.install_job(&job).unwrap_err().to_string();
    assert!(e.contains("units of wide-path memory"), "{e}");
    assert!(e.contains(&format!("{cpus} CPUs")), "{e}");
    assert!(dp.job(45).is_none());

    // Two wide jobs get disjoint unit ranges, and a freed range is reused.
    let a = wide_job(46, 2, Op::Sum, DType::I32, 16_128, 4);
    let b = wide_job(47, 2, Op::Sum, DType::I32, 1_000, 4);
    dp.install_job(&a).unwrap();
    dp.install_job(&b).unwrap();
    complete(&mut dp, &a, 0, 16_128);
    complete(&mut dp, &b, 0, 1_000);
    complete(&mut dp, &a, 1, 16_128);
    dp.remove_job(a.id).unwrap();
    dp.remove_job(b.id).unwrap();
}

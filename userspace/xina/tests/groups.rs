//! Multicast and anycast groups under `BPF_PROG_TEST_RUN` (root needed):
//! every branch of the group paths of the ingress program (`xina_group`,
//! tail-called by `xina_switch`) and of the egress program, with the frames
//! out compared byte for byte against frames built from scratch (so every
//! checksum the switch updated incrementally is checked against a full
//! computation), the slot copies, the counters (switch-wide and the group's
//! own block) and the per-member packet counters.
//!
//! The tests share one loaded dataplane (loading verifies ~30 programs);
//! each installs its groups with its own ids and slots, holds the lock
//! throughout and removes its groups when it ends, failed or not.

mod common;

use std::{net::Ipv4Addr, sync::MutexGuard};

use common::{egress, hex, ingress};

use xina::dataplane::xdp_action::{DROP as XDP_DROP, PASS as XDP_PASS, REDIRECT as XDP_REDIRECT};
use xina::{
    Dataplane, JobSpec, LoadOptions, MemberSpec,
    dataplane::Mode,
    frame::{self, Endpoint},
};
use xina_proto::{
    DType, Flags, Kind, Op, Repr, XINA_UDP_PORT, anycast, checksum,
    counters::Counter,
    header::{HEADER_LEN, SLOT_VERSION_BIT},
    maps::{Slot, slot_state},
    net::{ETH_HLEN, IPV4_HLEN, UDP_CSUM},
};

const SWITCH_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 254);
const IP_AT: usize = ETH_HLEN;
const UDP_AT: usize = ETH_HLEN + IPV4_HLEN;
/// Slots of the shared dataplane: 32 per test.
const POOL: u32 = 32 * 16;
/// An interface index no member sits behind.
const NO_MEMBER_PORT: u32 = 999;

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

fn shared() -> MutexGuard<'static, Dataplane> {
    common::shared(POOL)
}

/// A group to install: ranks `0..fan_in`, `senders` and `down` as bitmaps
/// of ranks, `window` slots per member (multicast; anycast gets none).
#[derive(Clone, Copy)]
struct Shape {
    mode: Mode,
    fan_in: u8,
    senders: u64,
    down: u64,
    window: u32,
    elems: u16,
}

const MULTICAST: Shape = Shape {
    mode: Mode::Multicast,
    fan_in: 4,
    senders: 0b0011,
    down: 0,
    window: 2,
    elems: 64,
};

const ANYCAST: Shape = Shape {
    mode: Mode::Anycast,
    fan_in: 4,
    senders: 0b0001,
    down: 0,
    window: 0,
    elems: 64,
};

/// One test's share of the shared dataplane; its groups are removed when
/// it is dropped, also when the test fails.
struct Fixture {
    dp: MutexGuard<'static, Dataplane>,
    next_id: u32,
    next_slot: u32,
    end: u32,
    installed: Vec<u32>,
}

impl Fixture {
    /// Test number `n` gets group ids from `100 (n + 1)` and slots
    /// `32 n..32 (n + 1)`.
    fn new(n: u32) -> Self {
        Self {
            dp: shared(),
            next_id: 100 * (n + 1),
            next_slot: 32 * n,
            end: 32 * (n + 1),
            installed: Vec::new(),
        }
    }

    /// The next group of this shape (its slots taken only once installed).
    fn spec(&mut self, shape: Shape) -> JobSpec {
        let slot_count = if shape.mode == Mode::Multicast {
            shape.window * u32::from(shape.fan_in)
        } else {
            0
        };
        assert!(self.next_slot + slot_count <= self.end, "test slot range");
        let spec = JobSpec {
            id: self.next_id,
            op: Op::Sum,
            dtype: DType::Bytes,
            mode: shape.mode,
            elems_per_packet: shape.elems,
            slot_base: self.next_slot,
            slot_count,
            members: (0..shape.fan_in)
                .map(|r| MemberSpec {
                    sender: shape.senders >> r & 1 == 1,
                    down: shape.down >> r & 1 == 1,
                    ..member(r)
                })
                .collect(),
        };
        self.next_id += 1;
        spec
    }

    fn install(&mut self, shape: Shape) -> JobSpec {
        let spec = self.spec(shape);
        self.dp.install_job(&spec).expect("install group");
        self.installed.push(spec.id);
        self.next_slot += spec.slot_count;
        spec
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for id in self.installed.drain(..) {
            let _ = self.dp.remove_job(id);
        }
    }
}

fn fan_in(job: &JobSpec) -> u8 {
    u8::try_from(job.members.len()).unwrap()
}

fn window(job: &JobSpec) -> u32 {
    job.slot_count / u32::from(fan_in(job))
}

/// Bits of `ranks`.
fn bits(ranks: &[u8]) -> u64 {
    ranks.iter().fold(0, |b, r| b | 1 << r)
}

/// Chunk `seq` from `root` (slot `root W + seq mod W`, copy `(seq / W) mod 2`).
fn data(job: &JobSpec, root: u8, seq: u32, flags: u8, count: usize) -> Repr {
    let w = window(job).max(1);
    Repr {
        kind: Kind::McastData,
        flags: Flags(flags),
        job: job.id,
        rank: root,
        fan_in: fan_in(job),
        op: Op::Sum,
        dtype: DType::Bytes,
        seq,
        slot: u32::from(root) * w + seq % w,
        slot_version: (seq / w) % 2 == 1,
        count: u16::try_from(count).unwrap(),
        exponent: 0,
        root,
        bitmap: 0,
    }
}

/// Receiver `q`'s acknowledgement of chunk `seq` from `root`.
fn ack(job: &JobSpec, q: u8, root: u8, seq: u32) -> Repr {
    Repr {
        kind: Kind::McastAck,
        rank: q,
        ..data(job, root, seq, 0, 0)
    }
}

/// What the switch makes of an acknowledgement or data: an acknowledgement
/// with these flags and bitmap and no payload.
fn reply(repr: &Repr, flags: u8, bitmap: u64) -> Repr {
    Repr {
        kind: Kind::McastAck,
        flags: Flags(flags),
        count: 0,
        bitmap,
        ..*repr
    }
}

fn payload(seq: u32, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| u8::try_from((seq as usize * 31 + i * 7 + 1) % 256).unwrap())
        .collect()
}

fn endpoint(m: &MemberSpec) -> Endpoint {
    Endpoint {
        mac: m.mac,
        ip: m.ip,
        port: m.udp_port,
    }
}

/// The switch's side: a MAC, the switch's address, the xina port.
fn switch(mac: [u8; 6]) -> Endpoint {
    Endpoint {
        mac,
        ip: SWITCH_IP,
        port: XINA_UDP_PORT,
    }
}

/// A frame from the member of rank `repr.rank` to the switch.
fn send(job: &JobSpec, repr: &Repr, payload: &[u8]) -> Vec<u8> {
    frame::from_member(
        &job.members[usize::from(repr.rank)],
        SWITCH_IP,
        repr,
        payload,
    )
}

/// A frame built from scratch (every checksum computed in full); an
/// acknowledgement the switch makes has no UDP checksum.
fn build(src: Endpoint, dst: Endpoint, repr: &Repr, payload: &[u8]) -> Vec<u8> {
    let mut f = frame::build(src, dst, repr, payload);
    if repr.kind == Kind::McastAck {
        f[UDP_AT + UDP_CSUM..UDP_AT + UDP_CSUM + 2].fill(0);
    }
    f
}

/// A packet from the switch to member `m`, as addressed for it.
fn to_member(m: &MemberSpec, repr: &Repr, payload: &[u8]) -> Vec<u8> {
    build(switch(m.port_mac), endpoint(m), repr, payload)
}

/// The UDP checksum of `f` computed in full (with the field zeroed).
fn full_udp_checksum(f: &[u8]) -> u16 {
    let mut udp = f[UDP_AT..].to_vec();
    udp[UDP_CSUM..UDP_CSUM + 2].fill(0);
    checksum::udp_ipv4(
        f[IP_AT + 12..IP_AT + 16].try_into().unwrap(),
        f[IP_AT + 16..IP_AT + 20].try_into().unwrap(),
        &udp,
    )
}

/// Byte-for-byte equality with the first difference named; the frame must
/// be self-consistent: lengths, IPv4 checksum, and a UDP checksum that a
/// full computation confirms (data always carries one; acknowledgements
/// from the switch carry none).
#[track_caller]
fn assert_frame(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: frames differ at byte {at} (got {} bytes, want {})\n got: {}\nwant: {}",
            got.len(),
            want.len(),
            hex(got),
            hex(want)
        );
    }
    let p = frame::parse(got).unwrap_or_else(|| panic!("{what}: not an xina frame"));
    assert!(p.lengths_ok, "{what}: IPv4 / UDP lengths");
    assert!(p.ip_checksum_ok, "{what}: IPv4 checksum");
    let stored = u16::from_be_bytes([got[UDP_AT + UDP_CSUM], got[UDP_AT + UDP_CSUM + 1]]);
    if p.repr.kind == Kind::McastData {
        assert_ne!(stored, 0, "{what}: data keeps its UDP checksum");
        assert_eq!(stored, full_udp_checksum(got), "{what}: UDP checksum");
    } else {
        assert_eq!(stored, 0, "{what}: no UDP checksum on an acknowledgement");
        assert_eq!(got.len(), frame::XINA + HEADER_LEN, "{what}: no payload");
    }
}

/// The slot copy chunk `seq` of `root` uses.
fn copy_of(dp: &Dataplane, job: &JobSpec, root: u8, seq: u32) -> Slot {
    let w = window(job);
    dp.slot(
        job.slot_base + u32::from(root) * w + seq % w,
        (seq / w) % 2 == 1,
    )
    .unwrap()
}

/// A copy as (state, seq, root, count, bitmap, flags).
fn state(s: &Slot) -> (u32, u32, u32, u32, u64, u32) {
    (s.state, s.seq, s.root, s.count, s.bitmap, s.flags)
}

/// Every copy of every slot of `job`.
fn copies(dp: &Dataplane, job: &JobSpec) -> Vec<Slot> {
    (job.slot_base..job.slot_base + job.slot_count)
        .flat_map(|s| [dp.slot(s, false).unwrap(), dp.slot(s, true).unwrap()])
        .collect()
}

/// Sends chunk `seq` of `root` as a first transmission and checks it is
/// replicated; returns the broadcast frame.
fn first_transmission(
    dp: &mut Dataplane,
    job: &JobSpec,
    root: u8,
    seq: u32,
    flags: u8,
    bytes: &[u8],
) -> Vec<u8> {
    let repr = data(job, root, seq, flags, bytes.len());
    let what = format!("group {} chunk {seq} of root {root}", job.id);
    let out = ingress(dp, job, &send(job, &repr, bytes)).expect(
        XDP_REDIRECT,
        &[Counter::McastReplicated],
        true,
        &what,
    );
    let receivers = bits(&(0..fan_in(job)).filter(|r| *r != root).collect::<Vec<_>>());
    let m = &job.members[usize::from(root)];
    let copy = Repr {
        bitmap: receivers,
        flags: Flags(flags & !Flags::MISSING),
        ..repr
    };
    assert_frame(
        &out.frame,
        &build(switch(m.mac), switch(m.port_mac), &copy, bytes),
        &what,
    );
    out.frame
}

/// Receiver `q` acknowledges chunk `seq` of `root`; the switch consumes it.
fn ack_consumed(dp: &mut Dataplane, job: &JobSpec, q: u8, root: u8, seq: u32) {
    let f = send(job, &ack(job, q, root, seq), &[]);
    ingress(dp, job, &f).expect(
        XDP_DROP,
        &[Counter::AcksConsumed],
        true,
        &format!("group {} chunk {seq}: ACK from {q}", job.id),
    );
}

#[test]
fn first_transmission_is_replicated_and_each_port_gets_its_copy() {
    let mut fx = Fixture::new(0);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    let bytes = payload(0, 37);
    let broadcast = first_transmission(dp, &job, 0, 0, 0, &bytes);
    assert_eq!(
        state(&copy_of(dp, &job, 0, 0)),
        (slot_state::PARTIAL, 0, 0, 37, 0, 0),
        "the copy holds the chunk, nobody acknowledged yet"
    );
    let copy = Repr {
        bitmap: 0b1110,
        ..data(&job, 0, 0, 0, 37)
    };
    // Each receiver's port: the copy, addressed to that receiver.
    for rank in 1..4u8 {
        let m = &job.members[usize::from(rank)];
        let what = format!("copy to rank {rank}");
        let out = egress(dp, &job, &broadcast, m.ifindex).expect(
            XDP_PASS,
            &[Counter::McastCopies],
            true,
            &what,
        );
        assert_frame(&out.frame, &to_member(m, &copy, &bytes), &what);
    }
    // The root's port: its own data is not sent back.
    egress(dp, &job, &broadcast, job.members[0].ifindex).expect(
        XDP_DROP,
        &[Counter::McastSkipped],
        true,
        "copy to the root",
    );
    egress(dp, &job, &broadcast, NO_MEMBER_PORT).expect(
        XDP_DROP,
        &[Counter::EgressNotMember],
        true,
        "a port without a member",
    );
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 1, 1, 1]);
}

#[test]
fn retransmission_of_an_incomplete_chunk_goes_to_the_missing_receivers_only() {
    let mut fx = Fixture::new(1);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    let bytes = payload(3, 60);
    // Rank 1 sends chunk 3 (slot 1 W + 1, copy 1); rank 2 acknowledges.
    first_transmission(dp, &job, 1, 3, Flags::SYNC, &bytes);
    ack_consumed(dp, &job, 2, 1, 3);
    let before = copies(dp, &job);
    let repr = data(&job, 1, 3, Flags::RETRANSMIT | Flags::SYNC, bytes.len());
    let out = ingress(dp, &job, &send(&job, &repr, &bytes)).expect(
        XDP_REDIRECT,
        &[Counter::McastResent],
        true,
        "retransmission",
    );
    assert_eq!(copies(dp, &job), before, "a retransmission changes no copy");
    let resent = Repr {
        flags: Flags(Flags::RETRANSMIT | Flags::SYNC | Flags::MISSING),
        bitmap: bits(&[0, 3]),
        ..repr
    };
    let m1 = &job.members[1];
    assert_frame(
        &out.frame,
        &build(switch(m1.mac), switch(m1.port_mac), &resent, &bytes),
        "retransmission",
    );
    // Ranks 0 and 3 get it again, rank 2 (which has it) does not.
    for rank in [0, 3] {
        let m = &job.members[rank];
        let what = format!("resent copy to rank {rank}");
        let out = egress(dp, &job, &out.frame, m.ifindex).expect(
            XDP_PASS,
            &[Counter::McastCopies],
            true,
            &what,
        );
        assert_frame(&out.frame, &to_member(m, &resent, &bytes), &what);
    }
    egress(dp, &job, &out.frame, job.members[2].ifindex).expect(
        XDP_DROP,
        &[Counter::McastSkipped],
        true,
        "resent copy to rank 2, which acknowledged",
    );
    // The root's copy becomes its missing-receiver report.
    let report = egress(dp, &job, &out.frame, m1.ifindex).expect(
        XDP_PASS,
        &[Counter::AcksSent],
        true,
        "the root's copy",
    );
    let want = reply(&resent, resent.flags.0, bits(&[0, 3]));
    assert_frame(&report.frame, &to_member(m1, &want, &[]), "missing report");
    assert_eq!(dp.member_packets(job.id).unwrap(), [1, 0, 0, 1]);
}

#[test]
fn acks_first_middle_last_and_repeats_to_the_root() {
    let mut fx = Fixture::new(2);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    let (root, seq) = (0, 5);
    let bytes = payload(seq, 9);
    first_transmission(dp, &job, root, seq, 0, &bytes);
    // First and middle ACKs are consumed; the copy records them.
    ack_consumed(dp, &job, 3, root, seq);
    assert_eq!(copy_of(dp, &job, root, seq).bitmap, bits(&[3]));
    ack_consumed(dp, &job, 1, root, seq);
    assert_eq!(
        state(&copy_of(dp, &job, root, seq)),
        (slot_state::PARTIAL, seq, 0, 9, bits(&[1, 3]), 0)
    );
    // A repeated ACK of the incomplete chunk: rank 1 learns who is missing.
    let a1 = ack(&job, 1, root, seq);
    let m1 = &job.members[1];
    let out = ingress(dp, &job, &send(&job, &a1, &[])).expect(
        XDP_REDIRECT,
        &[Counter::MissingReport],
        true,
        "repeated ACK, chunk incomplete",
    );
    let want = reply(&a1, Flags::MISSING, bits(&[2]));
    assert_frame(&out.frame, &to_member(m1, &want, &[]), "missing report");
    // Its port's egress leaves it as it is (the ACK names rank 1).
    let again = egress(dp, &job, &out.frame, m1.ifindex).expect(
        XDP_PASS,
        &[Counter::AcksSent],
        true,
        "missing report through egress",
    );
    assert_frame(&again.frame, &out.frame, "missing report through egress");
    assert_eq!(
        state(&copy_of(dp, &job, root, seq)),
        (slot_state::PARTIAL, seq, 0, 9, bits(&[1, 3]), 0),
        "a repeated ACK changes nothing"
    );

    // The last ACK: the aggregated ACK, to the root only (no SYNC).
    let a2 = ack(&job, 2, root, seq);
    let out = ingress(dp, &job, &send(&job, &a2, &[])).expect(
        XDP_REDIRECT,
        &[Counter::AcksCompleted],
        true,
        "last ACK",
    );
    let m0 = &job.members[0];
    let aggregated = reply(&a2, 0, bits(&[1, 2, 3]));
    assert_frame(
        &out.frame,
        &to_member(m0, &aggregated, &[]),
        "aggregated ACK",
    );
    assert_eq!(
        state(&copy_of(dp, &job, root, seq)),
        (slot_state::COMPLETE, seq, 0, 9, bits(&[1, 2, 3]), 0)
    );
    // At egress it is for the root and for the rank it names (2), nobody else.
    for (rank, to) in [(0, true), (1, false), (2, true), (3, false)] {
        let m = &job.members[rank];
        let what = format!("aggregated ACK at rank {rank}'s port");
        if to {
            let got = egress(dp, &job, &out.frame, m.ifindex).expect(
                XDP_PASS,
                &[Counter::AcksSent],
                true,
                &what,
            );
            assert_frame(&got.frame, &to_member(m, &aggregated, &[]), &what);
        } else {
            egress(dp, &job, &out.frame, m.ifindex).expect(
                XDP_DROP,
                &[Counter::McastSkipped],
                true,
                &what,
            );
        }
    }

    // A repeated ACK of the complete chunk: answered from the slot.
    let a3 = ack(&job, 3, root, seq);
    let out = ingress(dp, &job, &send(&job, &a3, &[])).expect(
        XDP_REDIRECT,
        &[Counter::AckFromCache],
        true,
        "repeated ACK, chunk complete",
    );
    let want = reply(&a3, Flags::FROM_CACHE, bits(&[1, 2, 3]));
    assert_frame(
        &out.frame,
        &to_member(&job.members[3], &want, &[]),
        "ACK from cache to the receiver",
    );

    // A retransmission of the complete chunk: the root gets the ACK from
    // the slot, nobody gets the data again.
    let re = data(&job, root, seq, Flags::RETRANSMIT, bytes.len());
    let out = ingress(dp, &job, &send(&job, &re, &bytes)).expect(
        XDP_REDIRECT,
        &[Counter::AckFromCache],
        true,
        "retransmission of a complete chunk",
    );
    let want = reply(&re, Flags::FROM_CACHE, bits(&[1, 2, 3]));
    assert_frame(
        &out.frame,
        &to_member(m0, &want, &[]),
        "ACK from cache to the root",
    );
    assert_eq!(
        state(&copy_of(dp, &job, root, seq)),
        (slot_state::COMPLETE, seq, 0, 9, bits(&[1, 2, 3]), 0),
        "answers from the slot change nothing"
    );
}

#[test]
fn sync_chunk_completion_goes_to_every_member() {
    let mut fx = Fixture::new(3);
    let job = fx.install(Shape {
        fan_in: 3,
        senders: 0b111,
        ..MULTICAST
    });
    let dp = &mut *fx.dp;
    let (root, seq) = (2, 1);
    let bytes = payload(seq, 1);
    first_transmission(dp, &job, root, seq, Flags::SYNC | Flags::RETRANSMIT, &bytes);
    assert_eq!(
        copy_of(dp, &job, root, seq).flags,
        u32::from(Flags::SYNC),
        "the copy keeps the SYNC bit only"
    );
    ack_consumed(dp, &job, 0, root, seq);
    let a1 = ack(&job, 1, root, seq);
    let out = ingress(dp, &job, &send(&job, &a1, &[])).expect(
        XDP_REDIRECT,
        &[Counter::AcksCompleted],
        true,
        "last ACK of a SYNC chunk",
    );
    // Broadcast, from the switch, not yet addressed.
    let completion = reply(&a1, Flags::SYNC, bits(&[0, 1]));
    let m1 = &job.members[1];
    assert_frame(
        &out.frame,
        &build(switch(m1.mac), switch(m1.port_mac), &completion, &[]),
        "completion broadcast",
    );
    for m in &job.members {
        let what = format!("completion to rank {}", m.rank);
        let got = egress(dp, &job, &out.frame, m.ifindex).expect(
            XDP_PASS,
            &[Counter::AcksSent],
            true,
            &what,
        );
        assert_frame(&got.frame, &to_member(m, &completion, &[]), &what);
    }
    // Repeats keep the SYNC bit: they stand for the completion.
    let a0 = ack(&job, 0, root, seq);
    let out = ingress(dp, &job, &send(&job, &a0, &[])).expect(
        XDP_REDIRECT,
        &[Counter::AckFromCache],
        true,
        "repeated ACK of a complete SYNC chunk",
    );
    let want = reply(&a0, Flags::FROM_CACHE | Flags::SYNC, bits(&[0, 1]));
    assert_frame(
        &out.frame,
        &to_member(&job.members[0], &want, &[]),
        "ACK from cache",
    );
    // No member receives data copies: nothing counted.
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 0, 0]);
}

#[test]
fn stale_chunks_reuse_and_slots_outside_the_window() {
    let mut fx = Fixture::new(4);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    // An ACK for a chunk no copy holds.
    let f = send(&job, &ack(&job, 2, 0, 0), &[]);
    ingress(dp, &job, &f).expect(XDP_DROP, &[Counter::DropStale], true, "ACK, empty copy");
    // W = 2: chunks 0, 4, 8 of root 0 share slot 0, copy 0.
    first_transmission(dp, &job, 0, 0, 0, &payload(0, 4));
    let mut two_in_copy_0 = data(&job, 0, 2, 0, 4);
    two_in_copy_0.slot_version = false;
    let before = copies(dp, &job);
    for (what, repr) in [
        ("ACK of chunk 4, the copy holding 0", ack(&job, 2, 0, 4)),
        ("data of chunk 8, two reuses ahead", data(&job, 0, 8, 0, 4)),
        ("data of chunk 2 in chunk 0's copy", two_in_copy_0),
    ] {
        let f = send(&job, &repr, &payload(repr.seq, usize::from(repr.count)));
        ingress(dp, &job, &f).expect(XDP_DROP, &[Counter::DropStale], true, what);
        assert_eq!(copies(dp, &job), before, "{what}: no copy changed");
    }
    // Chunk 4 reuses the copy of chunk 0 (4 = 0 + 2W), even incomplete.
    first_transmission(dp, &job, 0, 4, 0, &payload(4, 6));
    assert_eq!(
        state(&copy_of(dp, &job, 0, 4)),
        (slot_state::PARTIAL, 4, 0, 6, 0, 0)
    );
    // Chunk 0 is now stale, data and ACKs alike.
    for (what, repr) in [
        (
            "data of the old chunk",
            data(&job, 0, 0, Flags::RETRANSMIT, 4),
        ),
        ("ACK of the old chunk", ack(&job, 1, 0, 0)),
    ] {
        let f = send(&job, &repr, &payload(0, usize::from(repr.count)));
        ingress(dp, &job, &f).expect(XDP_DROP, &[Counter::DropStale], true, what);
    }
    // Chunk 4 of root 1 uses root 1's window: another copy entirely.
    first_transmission(dp, &job, 1, 4, 0, &payload(4, 6));

    // Slots outside the root's window, or outside the group's range.
    let before = copies(dp, &job);
    let w = window(&job);
    // Root 1's window is slots W..2W.
    for (what, slot) in [
        ("the next root's window", 2 * w),
        ("the previous root's window", 0),
        ("past the group's slots", 4 * w),
        ("far past", 0x7fff_ffff),
    ] {
        let mut d = data(&job, 1, 0, 0, 4);
        d.slot = slot;
        let f = send(&job, &d, &payload(0, 4));
        ingress(dp, &job, &f).expect(XDP_DROP, &[Counter::DropBadSlot], true, what);
        let mut a = ack(&job, 2, 1, 0);
        a.slot = slot;
        let f = send(&job, &a, &[]);
        ingress(dp, &job, &f).expect(XDP_DROP, &[Counter::DropBadSlot], true, what);
    }
    assert_eq!(copies(dp, &job), before, "no copy changed");
}

#[test]
fn strangers_non_senders_and_bad_shapes_are_dropped() {
    let mut fx = Fixture::new(5);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    let bytes = payload(0, 8);
    let good = data(&job, 0, 0, 0, bytes.len());
    let with = |edit: &dyn Fn(&mut Repr)| {
        let mut r = good;
        edit(&mut r);
        r
    };
    let before = copies(dp, &job);

    // Data from rank 2, a member but not a sender.
    let from2 = with(&|r| {
        r.rank = 2;
        r.root = 2;
        r.slot = 2 * window(&job);
    });
    ingress(dp, &job, &send(&job, &from2, &bytes)).expect(
        XDP_DROP,
        &[Counter::DropNotSender],
        true,
        "data from a non-sender",
    );

    // Not members: a rank outside the group, another member's address.
    let mut cases: Vec<(&str, Vec<u8>, Counter)> = Vec::new();
    let outside = with(&|r| r.rank = 4);
    cases.push((
        "data from rank 4 of 4",
        frame::from_member(&member(4), SWITCH_IP, &outside, &bytes),
        Counter::DropNotMember,
    ));
    let impostor = MemberSpec {
        udp_port: 6001,
        ..member(0)
    };
    cases.push((
        "data from rank 0 with rank 1's port",
        frame::from_member(&impostor, SWITCH_IP, &good, &bytes),
        Counter::DropNotMember,
    ));
    let a = ack(&job, 2, 0, 0);
    let impostor = MemberSpec {
        ip: Ipv4Addr::new(10, 78, 0, 99),
        ..member(2)
    };
    cases.push((
        "ACK from rank 2 with another address",
        frame::from_member(&impostor, SWITCH_IP, &a, &[]),
        Counter::DropNotMember,
    ));
    let stranger_ack = ack(&job, 7, 0, 0);
    cases.push((
        "ACK from rank 7 of 4",
        frame::from_member(&member(7), SWITCH_IP, &stranger_ack, &[]),
        Counter::DropNotMember,
    ));
    cases.push((
        "ACK from the root itself",
        send(&job, &ack(&job, 0, 0, 0), &[]),
        Counter::DropNotMember,
    ));

    // Bad shapes.
    let shapes: [(&str, Repr); 7] = [
        ("dtype int32", with(&|r| r.dtype = DType::I32)),
        ("op max", with(&|r| r.op = Op::Max)),
        ("fan-in 5", with(&|r| r.fan_in = 5)),
        ("root 4 of 4", with(&|r| r.root = 4)),
        ("data naming another root", with(&|r| r.root = 1)),
        ("count 0", with(&|r| r.count = 0)),
        ("count past elems_per_packet", with(&|r| r.count = 65)),
    ];
    for (what, r) in shapes {
        let n = if r.dtype == DType::I32 {
            usize::from(r.count) * 4
        } else {
            usize::from(r.count)
        };
        cases.push((what, send(&job, &r, &payload(0, n)), Counter::DropBadShape));
    }
    let mut ack_with_count = ack(&job, 1, 0, 0);
    ack_with_count.count = 2;
    cases.push((
        "ACK with a payload",
        send(&job, &ack_with_count, &[1, 2]),
        Counter::DropBadShape,
    ));

    // Lengths: UDP and IPv4 must end exactly after the payload.
    let full = send(&job, &good, &bytes);
    let mut padded = full.clone();
    padded.extend_from_slice(&[0xee; 4]);
    set_lengths(&mut padded, 4);
    cases.push(("4 bytes past the payload", padded, Counter::DropBadShape));
    let mut short = full.clone();
    set_lengths(&mut short, -4);
    cases.push((
        "UDP and IPv4 end inside the payload",
        short,
        Counter::DropBadShape,
    ));
    let mut ack_padded = send(&job, &a, &[]);
    ack_padded.extend_from_slice(&[0xee; 2]);
    set_lengths(&mut ack_padded, 2);
    cases.push((
        "ACK with 2 bytes of payload",
        ack_padded,
        Counter::DropBadShape,
    ));
    cases.push((
        "payload cut",
        full[..full.len() - 1].to_vec(),
        Counter::DropTruncated,
    ));

    for (what, f, counter) in cases {
        ingress(dp, &job, &f).expect(XDP_DROP, &[counter], true, what);
    }
    assert_eq!(copies(dp, &job), before, "no dropped packet touched a copy");

    // Not for this program or this group: counted before the group's block.
    let mut unknown = good;
    unknown.job = job.id + 50;
    ingress(dp, &job, &send(&job, &unknown, &bytes)).expect(
        XDP_DROP,
        &[Counter::DropUnknownJob],
        false,
        "unknown group",
    );
    let agg = Repr {
        kind: Kind::AggData,
        dtype: DType::I32,
        count: 2,
        ..good
    };
    ingress(dp, &job, &send(&job, &agg, &[0; 8])).expect(
        XDP_DROP,
        &[Counter::DropUnsupportedKind],
        false,
        "aggregation data to a group",
    );
    assert_eq!(copies(dp, &job), before);
}

/// Grows (`by` > 0) or shrinks the IPv4 and UDP lengths of `f` by `by`
/// bytes and recomputes both checksums over what they delimit.
fn set_lengths(f: &mut [u8], by: i32) {
    let get = |f: &[u8], at: usize| i32::from(u16::from_be_bytes([f[at], f[at + 1]]));
    let ip_total = u16::try_from(get(f, IP_AT + 2) + by).unwrap();
    let udp_len = u16::try_from(get(f, UDP_AT + 4) + by).unwrap();
    f[IP_AT + 2..IP_AT + 4].copy_from_slice(&ip_total.to_be_bytes());
    f[IP_AT + 10..IP_AT + 12].fill(0);
    let c = checksum::ipv4(&f[IP_AT..UDP_AT]);
    f[IP_AT + 10..IP_AT + 12].copy_from_slice(&c.to_be_bytes());
    f[UDP_AT + 4..UDP_AT + 6].copy_from_slice(&udp_len.to_be_bytes());
    f[UDP_AT + UDP_CSUM..UDP_AT + UDP_CSUM + 2].fill(0);
    let end = (UDP_AT + usize::from(udp_len)).min(f.len());
    let src: [u8; 4] = f[IP_AT + 12..IP_AT + 16].try_into().unwrap();
    let dst: [u8; 4] = f[IP_AT + 16..IP_AT + 20].try_into().unwrap();
    let c = checksum::udp_ipv4(src, dst, &f[UDP_AT..end]);
    f[UDP_AT + UDP_CSUM..UDP_AT + UDP_CSUM + 2].copy_from_slice(&c.to_be_bytes());
}

/// Anycast data from `sender` with flow label `label` (the slot field).
fn anycast_data(job: &JobSpec, sender: u8, label: u32, bytes: &[u8]) -> Repr {
    Repr {
        slot: label & !SLOT_VERSION_BIT,
        slot_version: label & SLOT_VERSION_BIT != 0,
        ..data(job, sender, label, 0, bytes.len())
    }
}

/// Where the switch should send anycast flow `label` of `sender`.
fn expected_pick(job: &JobSpec, sender: u8, label: u32, up: u64) -> Option<u8> {
    let m = &job.members[usize::from(sender)];
    let key = anycast::flow_key(m.ip.octets(), m.udp_port.to_be_bytes(), label);
    anycast::pick(key, up)
}

/// Sends flow `label` and checks it reaches the member
/// [`anycast::pick`] chooses among `up`, through that member's port;
/// returns the pick.
fn anycast_to_pick(dp: &mut Dataplane, job: &JobSpec, label: u32, up: u64) -> u8 {
    let bytes = payload(label, 20);
    let repr = anycast_data(job, 0, label, &bytes);
    let f = send(job, &repr, &bytes);
    let what = format!("anycast flow {label:#x}");
    let out = ingress(dp, job, &f).expect(XDP_REDIRECT, &[Counter::AnycastDelivered], true, &what);
    let pick = expected_pick(job, 0, label, up).expect("a member is up");
    let sent = Repr {
        bitmap: 1 << pick,
        ..repr
    };
    let s = &job.members[0];
    // Only the bitmap changed: it still comes from the sender.
    assert_frame(
        &out.frame,
        &build(endpoint(s), switch(s.port_mac), &sent, &bytes),
        &what,
    );
    let m = &job.members[usize::from(pick)];
    let got = egress(dp, job, &out.frame, m.ifindex).expect(
        XDP_PASS,
        &[Counter::McastCopies],
        true,
        &format!("{what} at its member's port"),
    );
    let to = Endpoint {
        mac: m.port_mac,
        ..endpoint(s)
    };
    assert_frame(
        &got.frame,
        &build(to, endpoint(m), &sent, &bytes),
        &format!("{what} addressed to rank {pick}"),
    );
    // Any other member's port drops it.
    for other in job.members.iter().filter(|o| o.rank != pick) {
        egress(dp, job, &out.frame, other.ifindex).expect(
            XDP_DROP,
            &[Counter::McastSkipped],
            true,
            &format!("{what} at rank {}'s port", other.rank),
        );
    }
    pick
}

#[test]
fn anycast_goes_to_the_member_pick_chooses() {
    let mut fx = Fixture::new(6);
    let job = fx.install(ANYCAST);
    let dp = &mut *fx.dp;
    let up = bits(&[1, 2, 3]);
    let mut hits = [0u64; 4];
    for label in (0..24).chain([SLOT_VERSION_BIT, SLOT_VERSION_BIT | 5, u32::MAX]) {
        hits[usize::from(anycast_to_pick(dp, &job, label, up))] += 1;
    }
    assert_eq!(hits[0], 0, "the sender is not a receiver");
    assert!(
        hits[1..].iter().all(|h| *h > 0),
        "flows spread over every receiver: {hits:?}"
    );
    assert_eq!(dp.member_packets(job.id).unwrap(), hits);
    // An anycast group takes no acknowledgements.
    let a = Repr {
        kind: Kind::McastAck,
        rank: 1,
        count: 0,
        ..anycast_data(&job, 0, 1, &[])
    };
    ingress(dp, &job, &send(&job, &a, &[])).expect(
        XDP_DROP,
        &[Counter::DropUnsupportedKind],
        true,
        "ACK to an anycast group",
    );
    // A receiver that is not a sender may not send.
    let from1 = Repr {
        rank: 1,
        root: 1,
        ..anycast_data(&job, 0, 1, &[7])
    };
    ingress(dp, &job, &send(&job, &from1, &[7])).expect(
        XDP_DROP,
        &[Counter::DropNotSender],
        true,
        "anycast data from a non-sender",
    );
}

#[test]
fn anycast_never_picks_a_member_that_is_down() {
    let mut fx = Fixture::new(7);
    let job = fx.install(Shape {
        down: bits(&[2]),
        ..ANYCAST
    });
    let dp = &mut *fx.dp;
    let dump = dp.dump().unwrap();
    let entry = dump.jobs.iter().find(|(id, _)| *id == job.id).unwrap().1;
    assert_eq!(entry.all_ranks, bits(&[1, 3]), "rank 2 is down");
    let mut moved = 0;
    for label in 0..32 {
        let pick = anycast_to_pick(dp, &job, label, bits(&[1, 3]));
        assert_ne!(pick, 2);
        if expected_pick(&job, 0, label, bits(&[1, 2, 3])) == Some(2) {
            moved += 1;
        }
    }
    assert!(moved > 0, "some flows would have gone to rank 2 were it up");
    assert_eq!(dp.member_packets(job.id).unwrap()[2], 0);
}

#[test]
fn anycast_with_every_member_down_drops() {
    let mut fx = Fixture::new(8);
    let job = fx.install(Shape {
        down: bits(&[1, 2, 3]),
        ..ANYCAST
    });
    let dp = &mut *fx.dp;
    for label in [0, 1, 99] {
        let bytes = payload(label, 3);
        let f = send(&job, &anycast_data(&job, 0, label, &bytes), &bytes);
        ingress(dp, &job, &f).expect(
            XDP_DROP,
            &[Counter::DropNoMemberUp],
            true,
            "every member down",
        );
    }
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 0, 0, 0]);
}

#[test]
fn member_packets_count_delivered_copies_and_start_at_zero() {
    let mut fx = Fixture::new(9);
    let job = fx.install(MULTICAST);
    let dp = &mut *fx.dp;
    // Chunks 0..3 of root 0, each to every port; chunk 1 retransmitted to
    // rank 3 only.
    let mut resend = Vec::new();
    for seq in 0..3 {
        let bytes = payload(seq, 5);
        let f = first_transmission(dp, &job, 0, seq, 0, &bytes);
        for m in &job.members {
            egress(dp, &job, &f, m.ifindex);
        }
        if seq == 1 {
            ack_consumed(dp, &job, 1, 0, 1);
            ack_consumed(dp, &job, 2, 0, 1);
            let re = data(&job, 0, 1, Flags::RETRANSMIT, 5);
            resend = ingress(dp, &job, &send(&job, &re, &bytes))
                .expect(XDP_REDIRECT, &[Counter::McastResent], true, "resend")
                .frame;
        }
    }
    for m in &job.members {
        egress(dp, &job, &resend, m.ifindex);
    }
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 3, 3, 4]);
    // Counting is per group: the same counters block reused starts at zero.
    dp.remove_job(job.id).unwrap();
    fx.installed.clear();
    assert!(fx.dp.member_packets(job.id).is_err(), "removed");
    fx.dp.install_job(&job).unwrap();
    fx.installed.push(job.id);
    assert_eq!(fx.dp.member_packets(job.id).unwrap(), [0, 0, 0, 0]);
}

#[test]
fn groups_and_jobs_are_validated_and_all_ranks_set() {
    let mut fx = Fixture::new(10);
    let before = fx.dp.dump().unwrap();
    let refused: Vec<(&str, JobSpec)> = {
        let mut list = Vec::new();
        let mut bad = |what: &'static str, shape: Shape, edit: &dyn Fn(&mut JobSpec)| {
            let mut spec = fx.spec(shape);
            edit(&mut spec);
            list.push((what, spec));
        };
        bad("dtype int32", MULTICAST, &|j| j.dtype = DType::I32);
        bad("op max", ANYCAST, &|j| j.op = Op::Max);
        bad("elems 0", MULTICAST, &|j| j.elems_per_packet = 0);
        bad("elems 1441", ANYCAST, &|j| j.elems_per_packet = 1441);
        bad(
            "one member",
            Shape {
                fan_in: 1,
                senders: 1,
                ..MULTICAST
            },
            &|_| {},
        );
        bad("slots not a multiple", MULTICAST, &|j| j.slot_count = 7);
        bad("no slots", MULTICAST, &|j| j.slot_count = 0);
        bad(
            "no sender",
            Shape {
                senders: 0,
                ..MULTICAST
            },
            &|_| {},
        );
        bad(
            "anycast without sender",
            Shape {
                senders: 0,
                ..ANYCAST
            },
            &|_| {},
        );
        bad(
            "multicast member down",
            Shape {
                down: 0b100,
                ..MULTICAST
            },
            &|_| {},
        );
        bad("allreduce of bytes", MULTICAST, &|j| {
            j.mode = Mode::Allreduce;
        });
        bad("reduce with a sender", MULTICAST, &|j| {
            j.mode = Mode::Reduce;
            j.dtype = DType::I32;
        });
        bad("allreduce with a member down", ANYCAST, &|j| {
            j.mode = Mode::Allreduce;
            j.dtype = DType::I64;
            j.slot_count = 4;
            j.members.iter_mut().for_each(|m| m.sender = false);
            j.members[1].down = true;
        });
        list
    };
    let expected = [
        "dtype must be Bytes and op Sum",
        "dtype must be Bytes and op Sum",
        "elems_per_packet 0",
        "elems_per_packet 1441",
        "at least 2 members",
        "non-zero multiple",
        "non-zero multiple",
        "at least one sender",
        "at least one sender",
        "only anycast members can be marked down",
        "dtype Bytes is for multicast and anycast groups",
        "apply to multicast and anycast groups only",
        "apply to multicast and anycast groups only",
    ];
    for ((what, spec), want) in refused.iter().zip(expected) {
        let err = fx.dp.install_job(spec).expect_err(what).to_string();
        assert!(err.contains(want), "{what}: {err}");
    }
    assert_eq!(
        fx.dp.dump().unwrap(),
        before,
        "refused groups leave nothing"
    );

    // Accepted: all_ranks is every member (multicast), the receivers that
    // are up (anycast, no slots needed).
    let mc = fx.install(Shape {
        fan_in: 5,
        senders: 0b1,
        ..MULTICAST
    });
    let any = fx.install(Shape {
        fan_in: 6,
        senders: bits(&[0, 4]),
        down: bits(&[3]),
        ..ANYCAST
    });
    let any2 = fx.install(Shape {
        senders: bits(&[1]),
        elems: 1440,
        ..ANYCAST
    });
    let dump = fx.dp.dump().unwrap();
    let all = |id: u32| dump.jobs.iter().find(|(j, _)| *j == id).unwrap().1;
    assert_eq!(all(mc.id).all_ranks, 0b11111);
    assert_eq!(all(mc.id).slot_count, 10);
    assert_eq!(all(any.id).all_ranks, bits(&[1, 2, 5]));
    assert_eq!(all(any.id).slot_count, 0);
    assert_eq!(all(any2.id).all_ranks, bits(&[0, 2, 3]));
    let flags: Vec<u8> = dump
        .members
        .iter()
        .filter(|((j, _), _)| *j == any.id)
        .map(|(_, m)| m.flags)
        .collect();
    assert_eq!(flags, [1, 0, 0, 2, 1, 0], "sender 0x01, down 0x02");
}

#[test]
fn egress_leaves_alone_what_is_not_a_copy_of_the_group() {
    let mut fx = Fixture::new(11);
    let job = fx.install(MULTICAST);
    let any = fx.install(ANYCAST);
    let dp = &mut *fx.dp;
    let bytes = payload(0, 12);
    let broadcast = first_transmission(dp, &job, 0, 0, 0, &bytes);
    let m1 = &job.members[1];
    // A copy of a group that is not installed.
    let mut f = broadcast.clone();
    f[frame::XINA + 4..frame::XINA + 8].copy_from_slice(&(job.id + 50).to_be_bytes());
    egress(dp, &job, &f, m1.ifindex).expect(
        XDP_DROP,
        &[Counter::EgressNotMember],
        false,
        "unknown group",
    );
    // A sender's data as it arrives (to the switch's port) is no multicast
    // copy: not touched.
    let raw = send(&job, &data(&job, 0, 0, 0, bytes.len()), &bytes);
    let out = egress(dp, &job, &raw, m1.ifindex).expect(
        XDP_PASS,
        &[Counter::Passed],
        false,
        "data to the switch",
    );
    assert_eq!(out.frame, raw);
    // An aggregation result naming a group.
    let mut result = broadcast.clone();
    result[frame::XINA + 2] = Kind::AggResult as u8;
    egress(dp, &job, &result, m1.ifindex).expect(
        XDP_DROP,
        &[Counter::DropUnsupportedKind],
        false,
        "a result of a group",
    );
    // An acknowledgement in an anycast group.
    let a = reply(&anycast_data(&any, 0, 3, &[]), 0, bits(&[1]));
    let f = to_member(&any.members[1], &a, &[]);
    egress(dp, &any, &f, any.members[1].ifindex).expect(
        XDP_DROP,
        &[Counter::DropUnsupportedKind],
        true,
        "ACK of an anycast group",
    );
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 0, 0, 0]);
}

/// A pin directory of this test's own, removed when dropped (also when the
/// test fails).
struct Pins(xina::pin::PinDir);

impl Drop for Pins {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = xina::pin::remove(&self.0);
        }
    }
}

#[test]
fn member_packets_are_pinned_and_survive_open_and_upgrade() {
    use xina::pin;
    pin::ensure_bpffs(std::path::Path::new(pin::DEFAULT_ROOT)).expect("bpffs");
    let name = format!("t-grp-{}", xina_testbed::netns::unique_token());
    let pins = Pins(pin::PinDir::new(pin::DEFAULT_ROOT, &name).unwrap());
    let mut dp = Dataplane::load_pinned(
        LoadOptions {
            slot_pool: 16,
            debug: false,
            ..LoadOptions::default()
        },
        &pins.0,
    )
    .expect("load pinned");
    assert!(pins.0.map("MEMBER_PACKETS").exists(), "the map is pinned");
    let job = JobSpec {
        id: 1,
        op: Op::Sum,
        dtype: DType::Bytes,
        mode: Mode::Multicast,
        elems_per_packet: 100,
        slot_base: 0,
        slot_count: 4,
        members: (0..2)
            .map(|r| MemberSpec {
                sender: r == 0,
                ..member(r)
            })
            .collect(),
    };
    dp.install_job(&job).unwrap();
    let bytes = payload(0, 10);
    let f = first_transmission(&mut dp, &job, 0, 0, 0, &bytes);
    for _ in 0..3 {
        egress(&mut dp, &job, &f, job.members[1].ifindex).expect(
            XDP_PASS,
            &[Counter::McastCopies],
            true,
            "copy to rank 1",
        );
    }
    assert_eq!(dp.member_packets(job.id).unwrap(), [0, 3]);
    // Another process's view: the same map through its pin.
    let opened = Dataplane::open(&pins.0).expect("open");
    assert_eq!(
        opened.job(job.id),
        Some(&job),
        "the group, senders included"
    );
    assert_eq!(opened.member_packets(job.id).unwrap(), [0, 3]);
    drop(opened);
    // New programs, the same maps: the counts stay.
    Dataplane::upgrade(&pins.0, false).expect("upgrade");
    let opened = Dataplane::open(&pins.0).expect("open after upgrade");
    assert_eq!(opened.member_packets(job.id).unwrap(), [0, 3]);
    // The old programs still count into the shared map.
    egress(&mut dp, &job, &f, job.members[1].ifindex).expect(
        XDP_PASS,
        &[Counter::McastCopies],
        true,
        "copy to rank 1 after the upgrade",
    );
    assert_eq!(opened.member_packets(job.id).unwrap(), [0, 4]);
    drop(opened);
    dp.destroy().expect("remove the pins");
    assert!(!pins.0.exists());
}

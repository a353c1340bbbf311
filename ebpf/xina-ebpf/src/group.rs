//! The group paths: multicast with acknowledgement aggregation, and anycast.
//!
//! `xina_switch` tail-calls `xina_group` for every packet of kind
//! `McastData` or `McastAck`; it admits the packet (group installed, sender
//! is the member registered for its rank, shape and lengths) and then:
//!
//! - multicast data from root `r`, chunk `s`: the slot copy of `s` in `r`'s
//!   window records which receivers acknowledged it. A first transmission
//!   resets the copy and is broadcast to every port with `bitmap` = the
//!   receivers; a retransmission of a chunk still missing receivers is
//!   broadcast with `MISSING` and `bitmap` = the missing ones; a
//!   retransmission of a chunk every receiver acknowledged becomes an
//!   acknowledgement from the slot (`FROM_CACHE`) back to the root.
//! - an acknowledgement from receiver `q`: its bit is set in the copy; the
//!   last one becomes the aggregated acknowledgement, to the root, or to
//!   every member for a `SYNC` chunk; a repeated one is answered from the
//!   slot (chunk complete) or with a missing-receiver report (not yet).
//! - anycast data: sent on to the member its flow hashes to among those up
//!   ([`xina_proto::anycast::pick`]), unchanged but for `bitmap`.
//!
//! The multicast state machine of one copy (W = slots per window, so a copy
//! holds chunks `s`, `s + 2W`, ... of one root; R = the root's receivers):
//!
//! | copy holds               | packet                 | effect              | outcome          |
//! |--------------------------|------------------------|---------------------|------------------|
//! | nothing, or `s - 2W`     | data `s`               | reset to `s`        | `mcast_replicated` |
//! | `s`, partial             | data `s`               | none                | `mcast_resent`   |
//! | `s`, complete            | data `s`               | none                | `ack_from_cache` |
//! | anything else            | data `s`               | none                | `drop_stale`     |
//! | `s`, `q` not in          | ACK `s` from `q`       | add `q`             | `acks_consumed`  |
//! | `s`, `q` not in          | ACK `s`, bitmap now R  | add `q`, complete   | `acks_completed` |
//! | `s`, complete, `q` in    | ACK `s` from `q`       | none                | `ack_from_cache` |
//! | `s`, partial, `q` in     | ACK `s` from `q`       | none                | `missing_report` |
//! | not `s` of root `r`      | ACK `s`                | none                | `drop_stale`     |
//!
//! Every step runs under the copy's spin lock like the aggregation step
//! (`crate::slot`): the lock is taken after every check and every map
//! lookup, the step calls no helper, and the packet is rewritten and
//! redirected after the unlock.
//!
//! The egress half ([`egress`]) handles each port's copy: data for a
//! receiver in `bitmap` is addressed to it (and counted in
//! `MEMBER_PACKETS`); the root's copy of a retransmission becomes its
//! missing-receiver report; acknowledgements go to the root, to the member
//! that sent the acknowledgement answered, or to everyone with `SYNC`.

use aya_ebpf::{
    bindings::{
        BPF_F_BROADCAST,
        xdp_action::{XDP_DROP, XDP_PASS},
    },
    helpers::{bpf_redirect, bpf_spin_lock, bpf_spin_unlock},
    programs::XdpContext,
};
use xina_proto::{
    Flags, Kind, MAX_RANKS, XINA_UDP_PORT, anycast, checksum,
    counters::Counter,
    header::{SLOT_VERSION_BIT, field},
    maps::{
        Job, MEMBER_PACKETS_PER_JOB, Member, MemberKey, NO_PORT_INDEX, Slot, member_flags, mode,
        slot_state,
    },
    net::{IPV4_CSUM, IPV4_DST, IPV4_SRC, IPV4_TOTAL_LEN, UDP_CSUM, UDP_LEN, UDP_SPORT},
};

use crate::{
    egress::address,
    error::{Error, Verdict},
    maps::{JOBS, MEMBER_PACKETS, MEMBERS, PORTS, SLOTS, Tally},
    packet::{self, IP, PAYLOAD, UDP, XINA},
    switch::strip_payload,
};

/// The ingress half, run by `xina_group` for multicast and anycast kinds.
pub fn try_group(ctx: &XdpContext, tally: &mut Tally) -> Result<Verdict, Verdict> {
    packet::parse(ctx, packet::Direction::ToSwitch)?;
    let kind = packet::u8_at(ctx, XINA + field::KIND)?;
    let job_id = packet::be32_at(ctx, XINA + field::JOB.start)?;
    // SAFETY: read-only access to a map value.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::UnknownJob)?;
    // Multicast kinds to an aggregation job are not handled, like any
    // kind the job cannot take (before the job's block counts the packet).
    if !mode::is_group(job.mode) {
        return Err(Error::UnsupportedKind.into());
    }
    tally.enter_job(u32::from(job.counters));

    // The sender must be the registered member for the rank it claims.
    let rank = packet::u8_at(ctx, XINA + field::RANK)?;
    if rank >= job.fan_in || usize::from(rank) >= MAX_RANKS {
        return Err(Error::NotMember.into());
    }
    // SAFETY: read-only access to a map value.
    let member = *unsafe {
        MEMBERS.get(MemberKey {
            job: job_id,
            rank: u32::from(rank),
        })
    }
    .ok_or(Error::NotMember)?;
    let src_ip = packet::get::<4>(ctx, IP + IPV4_SRC)?;
    let src_port = packet::get::<2>(ctx, UDP + UDP_SPORT)?;
    if src_ip != member.ip || src_port != member.port {
        return Err(Error::NotMember.into());
    }

    let root = packet::u8_at(ctx, XINA + field::ROOT)?;
    let count = packet::be16_at(ctx, XINA + field::COUNT.start)?;
    if packet::u8_at(ctx, XINA + field::DTYPE)? != job.dtype
        || packet::u8_at(ctx, XINA + field::OP)? != job.op
        || packet::u8_at(ctx, XINA + field::FAN_IN)? != job.fan_in
        || root >= job.fan_in
    {
        return Err(Error::BadShape.into());
    }
    let slot_field = packet::be32_at(ctx, XINA + field::SLOT.start)?;
    let seq = packet::be32_at(ctx, XINA + field::SEQ.start)?;

    if kind == Kind::McastData as u8 {
        if member.flags & member_flags::SENDER == 0 {
            return Err(Error::NotSender.into());
        }
        if root != rank || count == 0 || count > job.elems {
            return Err(Error::BadShape.into());
        }
        exact_length(ctx, PAYLOAD + usize::from(count))?;
        if job.mode == mode::ANYCAST {
            return anycast_data(ctx, job_id, &job, src_ip, src_port, slot_field);
        }
        return multicast_data(ctx, &job, &member, root, seq, slot_field, count);
    }
    if kind != Kind::McastAck as u8 || job.mode != mode::MULTICAST {
        return Err(Error::UnsupportedKind.into());
    }
    // A root does not acknowledge its own chunk.
    if root == rank {
        return Err(Error::NotMember.into());
    }
    if count != 0 {
        return Err(Error::BadShape.into());
    }
    exact_length(ctx, PAYLOAD)?;
    multicast_ack(ctx, job_id, &job, &member, root, seq, slot_field)
}

/// The frame must hold `end` bytes, and the IPv4 and UDP lengths must be
/// exactly those of the headers and the announced payload.
#[inline(always)]
fn exact_length(ctx: &XdpContext, end: usize) -> Result<(), Error> {
    let end = packet::payload_end(end)?;
    if ctx.data() + end > ctx.data_end() {
        return Err(Error::Truncated);
    }
    let udp_len = usize::from(packet::be16_at(ctx, UDP + UDP_LEN)?);
    let ip_len = usize::from(packet::be16_at(ctx, IP + IPV4_TOTAL_LEN)?);
    if udp_len != end - UDP || ip_len != end - IP {
        return Err(Error::BadShape);
    }
    Ok(())
}

/// The slot copy a chunk of `root` uses, which must lie in the root's
/// window, and the distance between two chunks that copy holds (2W).
#[inline(always)]
fn copy_of(job: &Job, root: u8, slot_field: u32) -> Result<(*mut Slot, u32), Error> {
    // No division by zero (and no panic path) on a corrupt entry: 0 slots.
    let window = job
        .slot_count
        .checked_div(u32::from(job.fan_in))
        .unwrap_or(0);
    let first = window.wrapping_mul(u32::from(root));
    let slot = slot_field & !SLOT_VERSION_BIT;
    if window == 0 || slot < first || slot - first >= window {
        return Err(Error::BadSlot);
    }
    let version = u32::from(slot_field & SLOT_VERSION_BIT != 0);
    let index = (job.slot_base + slot) * 2 + version;
    let copy = SLOTS.get_ptr_mut(index).ok_or(Error::BadSlot)?;
    Ok((copy, window.wrapping_mul(2)))
}

/// What a data packet did to its copy.
enum DataStep {
    /// A first transmission: the copy now holds the chunk.
    Replicate,
    /// A retransmission; these receivers have not acknowledged.
    Resend {
        missing: u64,
    },
    /// A retransmission of a chunk every receiver acknowledged.
    Cached {
        bitmap: u64,
        sync: u8,
    },
    Stale,
}

/// What an acknowledgement did to its copy.
enum AckStep {
    Consumed,
    /// The last receiver acknowledged; `sync` is the chunk's `SYNC` bit.
    Completed {
        sync: u8,
    },
    /// A repeat: the chunk is complete.
    Cached {
        bitmap: u64,
        sync: u8,
    },
    /// A repeat: these receivers still miss.
    Missing {
        missing: u64,
    },
    Stale,
}

/// The data step; no helper calls allowed in here (the lock is held).
#[inline(always)]
fn data_step(
    s: &mut Slot,
    root: u32,
    seq: u32,
    reuse: u32,
    receivers: u64,
    count: u32,
    flags: u8,
) -> DataStep {
    if s.state != slot_state::EMPTY && s.seq == seq && s.root == root {
        if s.state == slot_state::COMPLETE {
            return DataStep::Cached {
                bitmap: s.bitmap,
                sync: s.flags as u8 & Flags::SYNC,
            };
        }
        return DataStep::Resend {
            missing: receivers & !s.bitmap,
        };
    }
    if s.state != slot_state::EMPTY && seq != s.seq.wrapping_add(reuse) {
        return DataStep::Stale;
    }
    // The root sends chunk s + 2W to this copy only once it has the
    // aggregated acknowledgement of s + W, so every receiver had s + W and,
    // before it, s: nobody needs the copy's old chunk any more.
    s.state = slot_state::PARTIAL;
    s.seq = seq;
    s.bitmap = 0;
    s.flags = u32::from(flags & Flags::SYNC);
    s.root = root;
    s.count = count;
    DataStep::Replicate
}

/// The acknowledgement step; no helper calls allowed in here.
#[inline(always)]
fn ack_step(s: &mut Slot, root: u32, seq: u32, bit: u64, receivers: u64) -> AckStep {
    if s.state == slot_state::EMPTY || s.seq != seq || s.root != root {
        return AckStep::Stale;
    }
    let sync = s.flags as u8 & Flags::SYNC;
    if s.bitmap & bit != 0 {
        if s.state == slot_state::COMPLETE {
            return AckStep::Cached {
                bitmap: s.bitmap,
                sync,
            };
        }
        return AckStep::Missing {
            missing: receivers & !s.bitmap,
        };
    }
    s.bitmap |= bit;
    if s.bitmap != receivers {
        return AckStep::Consumed;
    }
    s.state = slot_state::COMPLETE;
    AckStep::Completed { sync }
}

#[inline(always)]
fn multicast_data(
    ctx: &XdpContext,
    job: &Job,
    sender: &Member,
    root: u8,
    seq: u32,
    slot_field: u32,
    count: u16,
) -> Result<Verdict, Verdict> {
    let (copy, reuse) = copy_of(job, root, slot_field)?;
    let receivers = job.all_ranks & !(1u64 << (root & 63));
    let flags = packet::u8_at(ctx, XINA + field::FLAGS)?;
    // SAFETY: `copy` is a SLOTS value; its lock field is the kernel's
    // `struct bpf_spin_lock`.
    let lock = unsafe { &raw mut (*copy).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    let step = data_step(
        // SAFETY: we hold the copy's lock, so no other CPU touches it.
        unsafe { &mut *copy },
        u32::from(root),
        seq,
        reuse,
        receivers,
        u32::from(count),
        flags,
    );
    // SAFETY: the lock is held by this program.
    unsafe { bpf_spin_unlock(lock) };
    match step {
        DataStep::Replicate => {
            replicate(ctx, flags & !Flags::MISSING, receivers)?;
            Ok(Verdict::new(Counter::McastReplicated, broadcast()?))
        }
        DataStep::Resend { missing } => {
            replicate(ctx, flags | Flags::MISSING, missing)?;
            Ok(Verdict::new(Counter::McastResent, broadcast()?))
        }
        DataStep::Cached { bitmap, sync } => {
            make_ack(ctx, Flags::FROM_CACHE | sync, bitmap)?;
            Ok(Verdict::new(Counter::AckFromCache, reply(ctx, sender)?))
        }
        DataStep::Stale => Err(Error::Stale.into()),
    }
}

#[inline(always)]
fn multicast_ack(
    ctx: &XdpContext,
    job_id: u32,
    job: &Job,
    receiver: &Member,
    root: u8,
    seq: u32,
    slot_field: u32,
) -> Result<Verdict, Verdict> {
    let (copy, _) = copy_of(job, root, slot_field)?;
    let receivers = job.all_ranks & !(1u64 << (root & 63));
    let bit = 1u64 << (receiver.rank & 63);
    // SAFETY: as in `multicast_data`.
    let lock = unsafe { &raw mut (*copy).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    // SAFETY: we hold the copy's lock.
    let step = ack_step(unsafe { &mut *copy }, u32::from(root), seq, bit, receivers);
    // SAFETY: the lock is held by this program.
    unsafe { bpf_spin_unlock(lock) };
    match step {
        AckStep::Consumed => Ok(Verdict::new(Counter::AcksConsumed, XDP_DROP)),
        AckStep::Completed { sync } => {
            make_ack(ctx, sync, receivers)?;
            if sync != 0 {
                // Every member: the root as its acknowledgement, the
                // receivers as the chunk's completion.
                from_switch(ctx)?;
                return Ok(Verdict::new(Counter::AcksCompleted, broadcast()?));
            }
            // SAFETY: read-only access to a map value.
            let root_member = *unsafe {
                MEMBERS.get(MemberKey {
                    job: job_id,
                    rank: u32::from(root),
                })
            }
            .ok_or(Error::Internal)?;
            Ok(Verdict::new(
                Counter::AcksCompleted,
                reply(ctx, &root_member)?,
            ))
        }
        AckStep::Cached { bitmap, sync } => {
            make_ack(ctx, Flags::FROM_CACHE | sync, bitmap)?;
            Ok(Verdict::new(Counter::AckFromCache, reply(ctx, receiver)?))
        }
        AckStep::Missing { missing } => {
            make_ack(ctx, Flags::MISSING, missing)?;
            Ok(Verdict::new(Counter::MissingReport, reply(ctx, receiver)?))
        }
        AckStep::Stale => Err(Error::Stale.into()),
    }
}

#[inline(always)]
fn anycast_data(
    ctx: &XdpContext,
    job_id: u32,
    job: &Job,
    src_ip: [u8; 4],
    src_port: [u8; 2],
    slot_field: u32,
) -> Result<Verdict, Verdict> {
    let key = anycast::flow_key(src_ip, src_port, slot_field);
    let pick = anycast::pick(key, job.all_ranks).ok_or(Error::NoMemberUp)?;
    // SAFETY: read-only access to a map value.
    let target = *unsafe {
        MEMBERS.get(MemberKey {
            job: job_id,
            rank: u32::from(pick),
        })
    }
    .ok_or(Error::Internal)?;
    let acc = set_bitmap(ctx, 0, 1u64 << (pick & 63))?;
    let csum = packet::be16_at(ctx, UDP + UDP_CSUM)?;
    packet::set_be16(ctx, UDP + UDP_CSUM, checksum::apply_udp(csum, acc))?;
    // The egress program of the member's port addresses the copy.
    Ok(Verdict::new(Counter::AnycastDelivered, to_port(&target)?))
}

/// Makes data a copy for receivers: from the switch, with these flags and
/// `bitmap`; the UDP checksum follows every change.
#[inline(always)]
fn replicate(ctx: &XdpContext, flags: u8, bitmap: u64) -> Result<(), Error> {
    let mut acc = from_switch(ctx)?;
    let word0 = packet::be32_at(ctx, XINA)?;
    let new0 = (word0 & 0xffff_ff00) | u32::from(flags);
    packet::set_be32(ctx, XINA, new0)?;
    acc = checksum::replace32(acc, word0, new0);
    acc = set_bitmap(ctx, acc, bitmap)?;
    let csum = packet::be16_at(ctx, UDP + UDP_CSUM)?;
    packet::set_be16(ctx, UDP + UDP_CSUM, checksum::apply_udp(csum, acc))
}

/// Writes `bitmap` into the header; returns `acc` with the change recorded.
#[inline(always)]
fn set_bitmap(ctx: &XdpContext, acc: u64, bitmap: u64) -> Result<u64, Error> {
    let hi = packet::be32_at(ctx, XINA + field::BITMAP.start)?;
    let lo = packet::be32_at(ctx, XINA + field::BITMAP.start + 4)?;
    let (new_hi, new_lo) = ((bitmap >> 32) as u32, bitmap as u32);
    packet::set_be32(ctx, XINA + field::BITMAP.start, new_hi)?;
    packet::set_be32(ctx, XINA + field::BITMAP.start + 4, new_lo)?;
    Ok(checksum::replace32(
        checksum::replace32(acc, hi, new_hi),
        lo,
        new_lo,
    ))
}

/// The packet now comes from the switch: its source address becomes the
/// address it was sent to (the switch's), its source port the xina port.
/// Fixes the IPv4 checksum; returns the UDP checksum's adjustment.
#[inline(always)]
fn from_switch(ctx: &XdpContext) -> Result<u64, Error> {
    let src = packet::be32_at(ctx, IP + IPV4_SRC)?;
    let dst = packet::be32_at(ctx, IP + IPV4_DST)?;
    packet::set_be32(ctx, IP + IPV4_SRC, dst)?;
    let ip_acc = checksum::replace32(0, src, dst);
    let ip_csum = packet::be16_at(ctx, IP + IPV4_CSUM)?;
    packet::set_be16(ctx, IP + IPV4_CSUM, checksum::apply(ip_csum, ip_acc))?;
    let sport = packet::be16_at(ctx, UDP + UDP_SPORT)?;
    packet::set_be16(ctx, UDP + UDP_SPORT, XINA_UDP_PORT)?;
    Ok(checksum::replace16(ip_acc, sport, XINA_UDP_PORT))
}

/// Makes the packet an acknowledgement from the switch: kind `McastAck`,
/// these flags and `bitmap`, no payload (and no UDP checksum).
#[inline(always)]
fn make_ack(ctx: &XdpContext, flags: u8, bitmap: u64) -> Result<(), Error> {
    let word0 = packet::be32_at(ctx, XINA)?;
    let new0 = (word0 & 0xffff_0000) | (u32::from(Kind::McastAck as u8) << 8) | u32::from(flags);
    packet::set_be32(ctx, XINA, new0)?;
    set_bitmap(ctx, 0, bitmap)?;
    strip_payload(ctx)
}

/// Sends the packet from the switch to `member`, addressed here (the
/// egress program of the member's port addresses it again, the same way).
#[inline(always)]
fn reply(ctx: &XdpContext, member: &Member) -> Result<u32, Error> {
    from_switch(ctx)?;
    address(ctx, member)?;
    to_port(member)
}

/// Redirects the packet to `member`'s port, through its `PORTS` entry (see
/// the cache reply in `crate::switch` for why not `bpf_redirect`), or
/// straight to its interface when it has none (test runs).
#[inline(always)]
fn to_port(member: &Member) -> Result<u32, Error> {
    if member.port_index == NO_PORT_INDEX {
        // SAFETY: a plain helper call with an interface index.
        return Ok((unsafe { bpf_redirect(member.ifindex, 0) }) as u32);
    }
    PORTS
        .redirect(member.port_index, 0)
        .map_err(|_| Error::Redirect)
}

/// A copy to every port; the egress program keeps those for members.
#[inline(always)]
fn broadcast() -> Result<u32, Error> {
    PORTS
        .redirect(0, u64::from(BPF_F_BROADCAST))
        .map_err(|_| Error::Redirect)
}

/// The egress half: `member` sits behind the port this copy leaves by.
#[inline(always)]
pub fn egress(ctx: &XdpContext, kind: u8, job: &Job, member: &Member) -> Result<Verdict, Verdict> {
    let flags = Flags(packet::u8_at(ctx, XINA + field::FLAGS)?);
    let root = u32::from(packet::u8_at(ctx, XINA + field::ROOT)?);
    let rank = u32::from(packet::u8_at(ctx, XINA + field::RANK)?);
    let hi = packet::be32_at(ctx, XINA + field::BITMAP.start)?;
    let lo = packet::be32_at(ctx, XINA + field::BITMAP.start + 4)?;
    let bitmap = (u64::from(hi) << 32) | u64::from(lo);
    let skipped = Verdict::new(Counter::McastSkipped, XDP_DROP);
    if kind == Kind::McastAck as u8 {
        if job.mode != mode::MULTICAST {
            return Err(Error::UnsupportedKind.into());
        }
        let to_member = flags.contains(Flags::SYNC) || member.rank == root || member.rank == rank;
        if !to_member {
            return Ok(skipped);
        }
        address(ctx, member)?;
        return Ok(Verdict::new(Counter::AcksSent, XDP_PASS));
    }
    if job.mode == mode::MULTICAST && member.rank == root {
        // The root's copy of a retransmission tells it who is missing.
        if !flags.contains(Flags::MISSING) {
            return Ok(skipped);
        }
        make_ack(ctx, flags.0, bitmap)?;
        address(ctx, member)?;
        return Ok(Verdict::new(Counter::AcksSent, XDP_PASS));
    }
    if bitmap & (1u64 << (member.rank & 63)) == 0 {
        return Ok(skipped);
    }
    address(ctx, member)?;
    count_copy(job, member.rank);
    Ok(Verdict::new(Counter::McastCopies, XDP_PASS))
}

/// One more data copy delivered to `rank` of the group.
#[inline(always)]
fn count_copy(job: &Job, rank: u32) {
    let index = u32::from(job.counters) * MEMBER_PACKETS_PER_JOB + (rank & 63);
    if let Some(p) = MEMBER_PACKETS.get_ptr_mut(index) {
        // SAFETY: `p` is a value of an array map, shared by every CPU: the
        // add is one atomic instruction (its result unused, so it is the
        // plain atomic add every BPF CPU version has).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                p, 1,
            );
        }
    }
}

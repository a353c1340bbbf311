//! The ingress path: admission of a contribution, then the slot step, then
//! what happens to the packet.

use aya_ebpf::{
    bindings::{BPF_F_BROADCAST, xdp_action::XDP_DROP},
    helpers::bpf_redirect,
    programs::XdpContext,
};
use aya_log_ebpf::debug;
use xina_proto::{
    DType, Flags, Kind, MAX_RANKS, XINA_UDP_PORT, checksum,
    counters::Counter,
    header::{SLOT_VERSION_BIT, field},
    maps::MemberKey,
    net::{ETH_DST, ETH_SRC, IPV4_DST, IPV4_SRC, UDP_CSUM, UDP_DPORT, UDP_SPORT},
};

use crate::{
    error::{Error, Verdict},
    maps::{JOBS, MEMBERS, PORTS, SLOTS, XINA_DEBUG},
    packet::{self, IP, PAYLOAD, UDP, XINA},
    slot::{self, Contribution, Outcome},
};

pub fn try_switch(ctx: &XdpContext) -> Result<Verdict, Verdict> {
    packet::parse(ctx, packet::Direction::ToSwitch)?;
    if packet::u8_at(ctx, XINA + field::KIND)? != Kind::AggData as u8 {
        return Err(Error::UnsupportedKind.into());
    }
    let job_id = packet::be32_at(ctx, XINA + field::JOB.start)?;
    // SAFETY: the value is only read, and a job's entry is replaced by the
    // control plane as a whole, never while its traffic is expected.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::UnknownJob)?;

    // The sender must be the registered member for the rank it claims: its
    // source address and port must be that member's.
    let rank = packet::u8_at(ctx, XINA + field::RANK)?;
    if rank >= job.fan_in || usize::from(rank) >= MAX_RANKS {
        return Err(Error::NotMember.into());
    }
    let key = MemberKey {
        job: job_id,
        rank: u32::from(rank),
    };
    // SAFETY: read-only access to a map value.
    let member = *unsafe { MEMBERS.get(key) }.ok_or(Error::NotMember)?;
    let src_ip = packet::get::<4>(ctx, IP + IPV4_SRC)?;
    let src_port = packet::get::<2>(ctx, UDP + UDP_SPORT)?;
    if src_ip != member.ip || src_port != member.port {
        return Err(Error::NotMember.into());
    }

    let count = packet::be16_at(ctx, XINA + field::COUNT.start)?;
    if packet::u8_at(ctx, XINA + field::DTYPE)? != job.dtype
        || job.dtype != DType::I32 as u8
        || packet::u8_at(ctx, XINA + field::OP)? != job.op
        || packet::u8_at(ctx, XINA + field::FAN_IN)? != job.fan_in
        || count == 0
        || count > job.elems
    {
        return Err(Error::BadShape.into());
    }
    let payload_end = PAYLOAD + 4 * usize::from(count);
    if ctx.data() + payload_end > ctx.data_end() {
        return Err(Error::Truncated.into());
    }

    let slot_field = packet::be32_at(ctx, XINA + field::SLOT.start)?;
    let slot = slot_field & !SLOT_VERSION_BIT;
    if slot >= job.slot_count {
        return Err(Error::BadSlot.into());
    }
    let version = u32::from(slot_field & SLOT_VERSION_BIT != 0);
    let index = (job.slot_base + slot) * 2 + version;
    let copy = SLOTS.get_ptr_mut(index).ok_or(Error::BadSlot)?;

    let seq = packet::be32_at(ctx, XINA + field::SEQ.start)?;
    let c = Contribution {
        seq,
        count: u32::from(count),
        rank_bit: 1u64 << rank,
        all_ranks: job.all_ranks,
    };
    let payload = ctx.data() + PAYLOAD;
    // SAFETY: `copy` is a SLOTS value; the payload range was checked above.
    let outcome = unsafe { slot::contribute(copy, payload, ctx.data_end(), &c) };
    match outcome {
        Outcome::Consumed => {
            crate::maps::count(Counter::Contributions);
            Ok(Verdict::new(Counter::Consumed, XDP_DROP))
        }
        Outcome::Completed(r) => {
            crate::maps::count(Counter::Contributions);
            if XINA_DEBUG.load() != 0 {
                debug!(
                    ctx,
                    "job {} seq {} complete, bitmap {:x}", job_id, seq, r.bitmap
                );
            }
            make_result(ctx, &r, 0)?;
            // Every port gets a copy; `xina_egress` keeps those with a member.
            let action = PORTS
                .redirect(0, u64::from(BPF_F_BROADCAST))
                .map_err(|_| Error::Redirect)?;
            Ok(Verdict::new(Counter::Completed, action))
        }
        Outcome::FromCache(r) => {
            if XINA_DEBUG.load() != 0 {
                debug!(
                    ctx,
                    "job {} seq {} rank {} answered from cache", job_id, seq, rank
                );
            }
            make_result(ctx, &r, Flags::FROM_CACHE)?;
            // Back to the sender, who sits behind the ingress port.
            let dst_mac = packet::get::<6>(ctx, ETH_DST)?;
            let src_mac = packet::get::<6>(ctx, ETH_SRC)?;
            packet::put(ctx, ETH_DST, src_mac)?;
            packet::put(ctx, ETH_SRC, dst_mac)?;
            // SAFETY: a plain helper call with an interface index.
            let action = unsafe { bpf_redirect(member.ifindex, 0) };
            Ok(Verdict::new(Counter::ReplyFromCache, action as u32))
        }
        Outcome::Duplicate => Err(Error::Duplicate.into()),
        Outcome::Stale => Err(Error::Stale.into()),
        Outcome::BadShape => Err(Error::BadShape.into()),
    }
}

/// Turns the contribution into a result: kind, flags and bitmap, addresses
/// and ports swapped (the sender becomes the destination, the switch's
/// address the source), UDP checksum adjusted for everything that changed.
/// Swapping addresses and ports leaves both checksums unchanged.
#[inline(always)]
fn make_result(ctx: &XdpContext, r: &slot::Result, extra_flags: u8) -> Result<(), Error> {
    let mut csum = r.csum;

    let word0 = packet::be32_at(ctx, XINA)?;
    let flags = u32::from(r.flags | extra_flags);
    let new0 = (word0 & 0xffff_0000) | (u32::from(Kind::AggResult as u8) << 8) | flags;
    packet::set_be32(ctx, XINA, new0)?;
    csum = checksum::replace32(csum, word0, new0);

    let hi = packet::be32_at(ctx, XINA + field::BITMAP.start)?;
    let lo = packet::be32_at(ctx, XINA + field::BITMAP.start + 4)?;
    let (new_hi, new_lo) = ((r.bitmap >> 32) as u32, r.bitmap as u32);
    packet::set_be32(ctx, XINA + field::BITMAP.start, new_hi)?;
    packet::set_be32(ctx, XINA + field::BITMAP.start + 4, new_lo)?;
    csum = checksum::replace32(csum, hi, new_hi);
    csum = checksum::replace32(csum, lo, new_lo);

    let src_ip = packet::get::<4>(ctx, IP + IPV4_SRC)?;
    let dst_ip = packet::get::<4>(ctx, IP + IPV4_DST)?;
    packet::put(ctx, IP + IPV4_SRC, dst_ip)?;
    packet::put(ctx, IP + IPV4_DST, src_ip)?;
    let sport = packet::be16_at(ctx, UDP + UDP_SPORT)?;
    packet::set_be16(ctx, UDP + UDP_SPORT, XINA_UDP_PORT)?;
    packet::set_be16(ctx, UDP + UDP_DPORT, sport)?;

    let old = packet::be16_at(ctx, UDP + UDP_CSUM)?;
    packet::set_be16(ctx, UDP + UDP_CSUM, checksum::apply_udp(old, csum))
}

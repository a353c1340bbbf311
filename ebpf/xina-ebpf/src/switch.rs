//! The ingress path: admission of a contribution, then the slot step, then
//! what happens to the packet.

use aya_ebpf::{
    bindings::{BPF_F_BROADCAST, xdp_action::XDP_DROP},
    helpers::{bpf_redirect, bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use aya_log_ebpf::debug;
use xina_proto::{
    DType, Flags, Kind, MAX_PAYLOAD, MAX_RANKS, XINA_UDP_PORT, checksum,
    counters::Counter,
    header::{SLOT_VERSION_BIT, field},
    maps::{MemberKey, NO_PORT_INDEX, mode, programs},
    net::{
        ETH_DST, ETH_SRC, IPV4_CSUM, IPV4_DST, IPV4_SRC, IPV4_TOTAL_LEN, UDP_CSUM, UDP_DPORT,
        UDP_LEN, UDP_SPORT,
    },
};

use crate::{
    error::{Error, Verdict},
    maps::{
        AGGREGATE, JOBS, MEMBERS, NARROW_LEN_MASK, PORTS, Pending, SCRATCH, SLOTS, Tally,
        XINA_DEBUG,
    },
    packet::{self, IP, PAYLOAD, UDP, XINA},
    slot::{self, Combine, Contribution, Elem, Outcome},
};

pub fn try_switch(ctx: &XdpContext, tally: &mut Tally) -> Result<Verdict, Verdict> {
    packet::parse(ctx, packet::Direction::ToSwitch)?;
    let kind = packet::u8_at(ctx, XINA + field::KIND)?;
    if kind == Kind::McastData as u8 || kind == Kind::McastAck as u8 {
        // SAFETY: a tail call with this program's own context; on success
        // it does not return.
        unsafe { AGGREGATE.tail_call(ctx, programs::GROUP_INDEX) };
        // Only reached when the group program is missing from the array.
        return Err(Error::Internal.into());
    }
    if kind != Kind::AggData as u8 {
        return Err(Error::UnsupportedKind.into());
    }
    let job_id = packet::be32_at(ctx, XINA + field::JOB.start)?;
    // SAFETY: the value is only read, and a job's entry is replaced by the
    // control plane as a whole, never while its traffic is expected.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::UnknownJob)?;
    // A group's slots hold acknowledgements, not sums.
    if mode::is_group(job.mode) {
        return Err(Error::UnsupportedKind.into());
    }
    tally.enter_job(u32::from(job.counters));

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
    let root = packet::u8_at(ctx, XINA + field::ROOT)?;
    if packet::u8_at(ctx, XINA + field::DTYPE)? != job.dtype
        || packet::u8_at(ctx, XINA + field::OP)? != job.op
        || packet::u8_at(ctx, XINA + field::FAN_IN)? != job.fan_in
        || count == 0
        || count > job.elems
        || root >= job.fan_in
    {
        return Err(Error::BadShape.into());
    }
    let size = if job.dtype == DType::I64 as u8 { 8 } else { 4 };
    let payload_end = packet::payload_end(PAYLOAD + size * usize::from(count))?;
    // A narrow frame lies in the linear part; only a longer (wide,
    // multi-buffer) one needs the length of its fragments too, a helper call
    // the narrow path need not pay.
    if ctx.data() + payload_end > ctx.data_end() {
        // SAFETY: a plain helper call on this program's context.
        let frame_len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as usize;
        if payload_end > frame_len {
            return Err(Error::Truncated.into());
        }
    }
    // The datagram must be exactly the header and the announced payload:
    // bytes outside it (Ethernet padding, or lengths that lie) are never
    // combined, and a result never carries them.
    let udp_len = usize::from(packet::be16_at(ctx, UDP + UDP_LEN)?);
    let ip_len = usize::from(packet::be16_at(ctx, IP + IPV4_TOTAL_LEN)?);
    if udp_len != payload_end - UDP || ip_len != payload_end - IP {
        return Err(Error::BadShape.into());
    }

    let slot_field = packet::be32_at(ctx, XINA + field::SLOT.start)?;
    let slot = slot_field & !SLOT_VERSION_BIT;
    if slot >= job.slot_count {
        return Err(Error::BadSlot.into());
    }
    let version = u32::from(slot_field & SLOT_VERSION_BIT != 0);
    let index = (job.slot_base + slot) * 2 + version;

    let seq = packet::be32_at(ctx, XINA + field::SEQ.start)?;
    let pending = Pending {
        copy: index,
        seq,
        count: u32::from(count),
        rank: u32::from(rank),
        root: u32::from(root),
        reuse: job.slot_count.wrapping_mul(2),
        all_ranks: job.all_ranks,
        job: job_id,
        job_counters: u32::from(job.counters),
        ingress_port: tally.port_index,
        ifindex: member.ifindex,
        mode: u32::from(job.mode),
        port_index: member.port_index,
        unit_base: job.unit_base,
        blocks: job.blocks,
        job_copy: slot * 2 + version,
    };
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return Err(Error::Internal.into());
    };
    // SAFETY: this CPU's scratch entry; the tail-called program reads it
    // before anything else runs on this CPU.
    unsafe { (*scratch).pending = pending };
    let kind = if job.dtype == DType::I64 as u8 { 3 } else { 0 } + u32::from(job.op);
    let narrow = if job.dtype == DType::I64 as u8 {
        DType::I64.narrow_elems()
    } else {
        DType::I32.narrow_elems()
    };
    let variant = if usize::from(job.elems) > narrow {
        // The wide path (see `wide`).
        programs::WIDE_BASE + kind
    } else {
        let class = match job.elems {
            0..=64 => 0,
            65..=128 => 1,
            129..=256 => 2,
            _ => 3,
        };
        4 * kind + class
    };
    // SAFETY: a tail call with this program's own context; on success it
    // does not return.
    unsafe { AGGREGATE.tail_call(ctx, variant) };
    // Only reached when the aggregation program for this type and op is
    // missing from the program array.
    Err(Error::Internal.into())
}

/// The second half of the ingress path, one program per element type, op
/// and size class `N` (tail-called from `xina_switch`, so that each is
/// verified on its own): stage the payload, run the slot step, deliver.
#[inline(always)]
pub fn aggregate<E: Elem, C: Combine, const N: usize>(
    ctx: &XdpContext,
    tally: &mut Tally,
) -> Result<Verdict, Verdict> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(Error::Internal)?;
    // SAFETY: this CPU's scratch entry, written by `xina_switch` just before
    // the tail call; nothing else runs on this CPU meanwhile.
    let scratch = unsafe { &mut *scratch };
    let p = scratch.pending;
    *tally = Tally::port_index(p.ingress_port);
    tally.set_job(p.job_counters);
    let len = p.count as usize * E::SIZE;
    if len == 0 || len > MAX_PAYLOAD {
        return Err(Error::BadShape.into());
    }
    // The whole payload is staged before the slot is touched, so a short
    // frame cannot leave a chunk half combined.
    slot::clear::<E, N>(&mut scratch.input, p.count as usize);
    // SAFETY: `input` has room for MAX_PAYLOAD >= len bytes.
    let rc = unsafe {
        bpf_xdp_load_bytes(
            ctx.ctx,
            PAYLOAD as u32,
            scratch.input.as_mut_ptr().cast(),
            packet::helper_len::<NARROW_LEN_MASK>(len),
        )
    };
    if rc != 0 {
        return Err(Error::Truncated.into());
    }
    let copy = SLOTS.get_ptr_mut(p.copy).ok_or(Error::BadSlot)?;
    let c = Contribution {
        seq: p.seq,
        count: p.count,
        rank_bit: 1u64 << (p.rank & 63),
        all_ranks: p.all_ranks,
        root: p.root,
        reuse: p.reuse,
    };
    // SAFETY: `copy` is a SLOTS value.
    let outcome = unsafe {
        slot::contribute::<E, C, N>(
            copy,
            &scratch.input,
            &mut scratch.output,
            &c,
            &raw mut scratch.plan,
        )
    };
    if let Outcome::Completed(_) | Outcome::FromCache(_) = outcome {
        // SAFETY: `output` holds MAX_PAYLOAD >= len bytes; the frame has the
        // `len` payload bytes (staged from it above).
        let rc = unsafe {
            bpf_xdp_store_bytes(
                ctx.ctx,
                PAYLOAD as u32,
                scratch.output.as_mut_ptr().cast(),
                packet::helper_len::<NARROW_LEN_MASK>(len),
            )
        };
        if rc != 0 {
            return Err(Error::Truncated.into());
        }
    }
    match outcome {
        Outcome::Consumed => {
            tally.count(Counter::Contributions);
            Ok(Verdict::new(Counter::Consumed, XDP_DROP))
        }
        Outcome::Completed(r) => {
            tally.count(Counter::Contributions);
            if XINA_DEBUG.load() != 0 {
                debug!(
                    ctx,
                    "job {} seq {} complete, bitmap {:x}", p.job, p.seq, r.bitmap
                );
            }
            make_result(ctx, &r, 0)?;
            // Every port gets a copy; `xina_egress` keeps those with a member
            // and turns the copies for non-root members into notices.
            let action = PORTS
                .redirect(0, u64::from(BPF_F_BROADCAST))
                .map_err(|_| Error::Redirect)?;
            Ok(Verdict::new(Counter::Completed, action))
        }
        Outcome::FromCache(r) => {
            if XINA_DEBUG.load() != 0 {
                debug!(
                    ctx,
                    "job {} seq {} rank {} answered from cache", p.job, p.seq, p.rank
                );
            }
            make_result(ctx, &r, Flags::FROM_CACHE)?;
            if p.mode != u32::from(mode::ALLREDUCE) && p.rank != r.root {
                make_notice(ctx)?;
            }
            let action = reply_to_sender(ctx, &p)?;
            Ok(Verdict::new(Counter::ReplyFromCache, action))
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
pub fn make_result(ctx: &XdpContext, r: &slot::Result, extra_flags: u8) -> Result<(), Error> {
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

/// Sends a reply from a slot back to the contribution's sender, who sits
/// behind the ingress port: MACs swapped, then through the port's devmap
/// entry, like the broadcast copies. The kernel batches a NAPI cycle's
/// redirects to one device and runs the egress program of the batch's first
/// frame on all of them, so a plain `bpf_redirect` mixed with broadcast
/// copies would send copies out unaddressed (or run the egress program on
/// this reply). The egress program addresses it to the same member. A
/// redirect to one devmap entry also carries multi-buffer frames (a
/// broadcast does not).
#[inline(always)]
pub fn reply_to_sender(ctx: &XdpContext, p: &Pending) -> Result<u32, Error> {
    let dst_mac = packet::get::<6>(ctx, ETH_DST)?;
    let src_mac = packet::get::<6>(ctx, ETH_SRC)?;
    packet::put(ctx, ETH_DST, src_mac)?;
    packet::put(ctx, ETH_SRC, dst_mac)?;
    if p.port_index == NO_PORT_INDEX {
        // SAFETY: a plain helper call with an interface index.
        Ok((unsafe { bpf_redirect(p.ifindex, 0) }) as u32)
    } else {
        PORTS.redirect(p.port_index, 0).map_err(|_| Error::Redirect)
    }
}

/// Turns a result into a completion notice: the payload is cut off, the
/// element count set to 0 and the `NOTICE` flag set. The IPv4 lengths and
/// checksum are fixed; the UDP checksum is dropped (0: none, legal in IPv4),
/// since recomputing it would mean summing the payload that was removed.
#[inline(always)]
pub fn make_notice(ctx: &XdpContext) -> Result<(), Error> {
    let flags = packet::u8_at(ctx, XINA + field::FLAGS)?;
    packet::put(ctx, XINA + field::FLAGS, [flags | Flags::NOTICE])?;
    strip_payload(ctx)
}

/// Cuts the frame after the xina header: element count 0, IPv4 and UDP
/// lengths of the header alone (IPv4 checksum fixed), no UDP checksum (0).
/// Notices and the acknowledgements the switch makes are such frames.
#[inline(always)]
pub fn strip_payload(ctx: &XdpContext) -> Result<(), Error> {
    packet::set_be16(ctx, XINA + field::COUNT.start, 0)?;
    packet::set_be16(ctx, UDP + UDP_CSUM, 0)?;
    packet::set_be16(ctx, UDP + UDP_LEN, (PAYLOAD - UDP) as u16)?;
    let total = packet::be16_at(ctx, IP + IPV4_TOTAL_LEN)?;
    let new_total = (PAYLOAD - IP) as u16;
    packet::set_be16(ctx, IP + IPV4_TOTAL_LEN, new_total)?;
    let csum = packet::be16_at(ctx, IP + IPV4_CSUM)?;
    let acc = checksum::replace16(0, total, new_total);
    packet::set_be16(ctx, IP + IPV4_CSUM, checksum::apply(csum, acc))?;
    // Everything after the xina header goes, whatever the header announced
    // and whatever follows the datagram. `black_box` keeps the compiler from
    // using this length to drop the bounds checks above, which the verifier
    // needs (it cannot relate this number to the frame's pointers).
    let frame = core::hint::black_box(ctx.data_end() - ctx.data());
    let cut = i32::try_from(frame.saturating_sub(PAYLOAD)).map_err(|_| Error::Truncated)?;
    // SAFETY: shrinking the frame to its headers; `cut` bytes follow them.
    let rc = unsafe { aya_ebpf::helpers::bpf_xdp_adjust_tail(ctx.ctx.cast(), -cut) };
    if rc != 0 {
        return Err(Error::Truncated);
    }
    Ok(())
}

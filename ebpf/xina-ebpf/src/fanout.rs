//! The wide path's fan-out: a tc program on every switch port's ingress
//! (TCX) that sends a completed wide result to every member of its job.
//!
//! The wide aggregation program ([`crate::wide`]) passes the frame that
//! completed a chunk to the kernel with a [`FanoutMeta`] in its XDP
//! metadata; the kernel makes it an skb, and this program sees it first.
//! For each member it rewrites the frame's addresses (MACs, destination IP
//! and UDP port, checksums fixed incrementally) and clones it to the
//! member's port with `bpf_clone_redirect`: the clones share the payload,
//! only the headers the rewrite touches are copied. The original is then
//! dropped. A frame without the switch's key in its metadata is not a
//! result of this switch and goes on unchanged, as everything else does.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use xina_proto::{
    MAX_RANKS,
    counters::Counter,
    maps::{FanoutMeta, Member, MemberKey, NO_PORT_INDEX},
    net::{ETH_DST, ETH_SRC, IPV4_CSUM, IPV4_DST, UDP_CSUM, UDP_DPORT},
};

use crate::{
    error::{Error, Verdict},
    maps::{JOBS, MEMBERS, Tally, XINA_FANOUT_KEY},
    packet::{IP, UDP},
};

pub fn fanout(ctx: &TcContext) -> i32 {
    // SAFETY: the program's own context.
    let (meta, data) = unsafe {
        (
            (*ctx.skb.skb).data_meta as usize,
            (*ctx.skb.skb).data as usize,
        )
    };
    if meta + size_of::<FanoutMeta>() > data {
        return TC_ACT_OK;
    }
    // SAFETY: the metadata area holds a `FanoutMeta` (checked above).
    let mark = unsafe { *(meta as *const FanoutMeta) };
    let key = XINA_FANOUT_KEY.load();
    if key == 0 || mark.key != key {
        return TC_ACT_OK;
    }
    if let Err(e) = send(ctx, mark.job) {
        Tally::port_index(NO_PORT_INDEX).count(Verdict::from(e).counter);
    }
    TC_ACT_SHOT
}

/// One addressed clone per member of `job`.
#[inline(always)]
fn send(ctx: &TcContext, job_id: u32) -> Result<(), Error> {
    // SAFETY: read-only access to a map value.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::EgressNotMember)?;
    for rank in 0..MAX_RANKS as u32 {
        if rank >= u32::from(job.fan_in) {
            break;
        }
        // SAFETY: read-only access to a map value.
        let Some(member) = (unsafe { MEMBERS.get(MemberKey { job: job_id, rank }) }).copied()
        else {
            continue;
        };
        let mut tally = Tally::port_index(member.port_index);
        tally.set_job(u32::from(job.counters));
        address(ctx, &member)?;
        if ctx.clone_redirect(member.ifindex, 0).is_err() {
            tally.count(Counter::DropRedirect);
            continue;
        }
        tally.count(Counter::ResultsSent);
    }
    Ok(())
}

/// Addresses the frame to `member`: its MAC from its switch port's, its IP
/// address and UDP port, with the IPv4 and UDP checksums adjusted.
#[inline(always)]
fn address(ctx: &TcContext, member: &Member) -> Result<(), Error> {
    let io = |_| Error::Truncated;
    ctx.store(ETH_DST, &member.mac, 0).map_err(io)?;
    ctx.store(ETH_SRC, &member.port_mac, 0).map_err(io)?;
    let old_ip: u32 = ctx.load(IP + IPV4_DST).map_err(io)?;
    let new_ip = u32::from_ne_bytes(member.ip);
    if old_ip != new_ip {
        ctx.l4_csum_replace(
            UDP + UDP_CSUM,
            u64::from(old_ip),
            u64::from(new_ip),
            u64::from(BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0) | 4,
        )
        .map_err(io)?;
        ctx.l3_csum_replace(IP + IPV4_CSUM, u64::from(old_ip), u64::from(new_ip), 4)
            .map_err(io)?;
        ctx.store(IP + IPV4_DST, &new_ip, 0).map_err(io)?;
    }
    let old_port: u16 = ctx.load(UDP + UDP_DPORT).map_err(io)?;
    let new_port = u16::from_ne_bytes(member.port);
    if old_port != new_port {
        ctx.l4_csum_replace(
            UDP + UDP_CSUM,
            u64::from(old_port),
            u64::from(new_port),
            u64::from(BPF_F_MARK_MANGLED_0) | 2,
        )
        .map_err(io)?;
        ctx.store(UDP + UDP_DPORT, &new_port, 0).map_err(io)?;
    }
    Ok(())
}

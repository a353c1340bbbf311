//! The egress path: one copy per port of what the switch broadcast or
//! redirected, addressed to the job's or group's member behind that port,
//! turned into a notice or report, or dropped.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use xina_proto::{
    Kind, XINA_UDP_PORT, checksum,
    counters::Counter,
    header::field,
    maps::{Job, Member, PortKey, mode},
    net::{ETH_DST, ETH_SRC, IPV4_CSUM, IPV4_DST, UDP_CSUM, UDP_DPORT, UDP_SPORT},
};

use crate::{
    error::{Error, Verdict},
    group,
    maps::{JOBS, PORT_MEMBERS, Tally},
    packet::{self, IP, UDP, XINA},
    switch::make_notice,
};

pub fn try_egress(ctx: &XdpContext, ifindex: u32, tally: &mut Tally) -> Result<Verdict, Verdict> {
    packet::parse(ctx, packet::Direction::Egress)?;
    let kind = packet::u8_at(ctx, XINA + field::KIND)?;
    // Only anycast copies leave with the sender's source port; anything
    // else addressed to the switch's port (a contribution) is not ours.
    let from_switch = packet::be16_at(ctx, UDP + UDP_SPORT)? == XINA_UDP_PORT;
    if !from_switch && kind != Kind::McastData as u8 {
        return Err(Verdict::pass());
    }
    let is_result = kind == Kind::AggResult as u8;
    if !is_result && kind != Kind::McastData as u8 && kind != Kind::McastAck as u8 {
        return Err(Error::UnsupportedKind.into());
    }
    let job_id = packet::be32_at(ctx, XINA + field::JOB.start)?;
    // SAFETY: read-only access to a map value.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::EgressNotMember)?;
    if !from_switch && job.mode != mode::ANYCAST {
        return Err(Verdict::pass());
    }
    // Results belong to aggregation jobs, multicast kinds to groups.
    if is_result == mode::is_group(job.mode) {
        return Err(Error::UnsupportedKind.into());
    }
    tally.set_job(u32::from(job.counters));
    // SAFETY: read-only access to a map value.
    let member = *unsafe {
        PORT_MEMBERS.get(PortKey {
            job: job_id,
            ifindex,
        })
    }
    .ok_or(Error::EgressNotMember)?;
    if is_result {
        result(ctx, &job, &member)
    } else {
        group::egress(ctx, kind, &job, &member)
    }
}

/// An aggregation result: the full result for the chunk's root (every
/// member in allreduce), a notice for the others.
#[inline(always)]
fn result(ctx: &XdpContext, job: &Job, member: &Member) -> Result<Verdict, Verdict> {
    let root = packet::u8_at(ctx, XINA + field::ROOT)?;
    let counter = if job.mode != mode::ALLREDUCE && member.rank != u32::from(root) {
        make_notice(ctx)?;
        Counter::NoticesSent
    } else {
        Counter::ResultsSent
    };
    address(ctx, member)?;
    Ok(Verdict::new(counter, XDP_PASS))
}

/// Addresses the frame to `member`: its MAC from the switch port's MAC, its
/// IPv4 address and UDP port as the destination, both checksums adjusted
/// (a UDP checksum of 0, none, stays 0).
#[inline(always)]
pub fn address(ctx: &XdpContext, member: &Member) -> Result<(), Error> {
    packet::put(ctx, ETH_DST, member.mac)?;
    packet::put(ctx, ETH_SRC, member.port_mac)?;

    let old_ip = packet::be32_at(ctx, IP + IPV4_DST)?;
    let new_ip = u32::from_be_bytes(member.ip);
    packet::set_be32(ctx, IP + IPV4_DST, new_ip)?;
    let ip_csum = packet::be16_at(ctx, IP + IPV4_CSUM)?;
    let ip_acc = checksum::replace32(0, old_ip, new_ip);
    packet::set_be16(ctx, IP + IPV4_CSUM, checksum::apply(ip_csum, ip_acc))?;

    let old_port = packet::be16_at(ctx, UDP + UDP_DPORT)?;
    let new_port = u16::from_be_bytes(member.port);
    packet::set_be16(ctx, UDP + UDP_DPORT, new_port)?;
    // The UDP checksum covers the pseudo-header's destination address too.
    let udp_acc = checksum::replace16(ip_acc, old_port, new_port);
    let udp_csum = packet::be16_at(ctx, UDP + UDP_CSUM)?;
    packet::set_be16(ctx, UDP + UDP_CSUM, checksum::apply_udp(udp_csum, udp_acc))
}

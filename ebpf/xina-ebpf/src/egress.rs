//! The egress path: one broadcast result copy per port, addressed to the
//! job's member behind that port or dropped.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use xina_proto::{
    Kind, checksum,
    counters::Counter,
    header::field,
    maps::{PortKey, mode},
    net::{ETH_DST, ETH_SRC, IPV4_CSUM, IPV4_DST, UDP_CSUM, UDP_DPORT},
};

use crate::{
    error::{Error, Verdict},
    maps::{JOBS, PORT_MEMBERS, Tally},
    packet::{self, IP, UDP, XINA},
    switch::make_notice,
};

pub fn try_egress(ctx: &XdpContext, ifindex: u32, tally: &mut Tally) -> Result<Verdict, Verdict> {
    packet::parse(ctx, packet::Direction::FromSwitch)?;
    if packet::u8_at(ctx, XINA + field::KIND)? != Kind::AggResult as u8 {
        return Err(Error::UnsupportedKind.into());
    }
    let job_id = packet::be32_at(ctx, XINA + field::JOB.start)?;
    // SAFETY: read-only access to a map value.
    let job = *unsafe { JOBS.get(job_id) }.ok_or(Error::EgressNotMember)?;
    tally.set_job(u32::from(job.counters));
    // SAFETY: read-only access to a map value.
    let member = *unsafe {
        PORT_MEMBERS.get(PortKey {
            job: job_id,
            ifindex,
        })
    }
    .ok_or(Error::EgressNotMember)?;
    let root = packet::u8_at(ctx, XINA + field::ROOT)?;
    let counter = if job.mode != mode::ALLREDUCE && member.rank != u32::from(root) {
        make_notice(ctx)?;
        Counter::NoticesSent
    } else {
        Counter::ResultsSent
    };

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
    packet::set_be16(ctx, UDP + UDP_CSUM, checksum::apply_udp(udp_csum, udp_acc))?;

    Ok(Verdict::new(counter, XDP_PASS))
}

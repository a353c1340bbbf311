//! The xina switch dataplane.
//!
//! - [`xina_switch`]: the ingress XDP program on every switch port. It parses
//!   Ethernet / IPv4 / UDP / xina, lets everything that is not xina through
//!   unchanged, and aggregates contributions into the job's slots. The packet
//!   that completes a chunk becomes the result and is broadcast to every port
//!   through the `PORTS` devmap.
//! - [`xina_egress`]: the devmap egress program, run once per port copy of a
//!   broadcast result. It keeps the copy only if the job has a member behind
//!   that port, and addresses it to that member.
//! - [`xina_egress_test`]: the same egress logic as a plain XDP program, for
//!   `BPF_PROG_TEST_RUN` (which cannot run devmap programs).
//!
//! How a job's group is selected when jobs share ports: the broadcast reaches
//! every port in `PORTS`; the egress program looks up `(job, egress ifindex)`
//! in `PORT_MEMBERS` and drops the copy when the job has no member there. A
//! job's group is therefore the set of ports its members sit behind, and each
//! port carries at most one member per job.
#![no_std]
#![no_main]

mod egress;
mod error;
mod maps;
mod packet;
mod slot;
mod switch;

use aya_ebpf::{macros::xdp, programs::XdpContext};

use crate::error::Verdict;

/// Ingress program of every switch port.
#[xdp]
pub fn xina_switch(ctx: XdpContext) -> u32 {
    maps::count(xina_proto::counters::Counter::RxPackets);
    switch::try_switch(&ctx)
        .unwrap_or_else(Verdict::from)
        .finish()
}

/// Devmap egress program: addresses a result copy to the job's member on this port.
#[xdp(map = "devmap")]
pub fn xina_egress(ctx: XdpContext) -> u32 {
    // SAFETY: `ctx.ctx` is the kernel-provided context of a devmap program,
    // which has `egress_ifindex` set.
    let ifindex = unsafe { (*ctx.ctx).egress_ifindex };
    egress::try_egress(&ctx, ifindex)
        .unwrap_or_else(Verdict::from)
        .finish()
}

/// [`xina_egress`] for `BPF_PROG_TEST_RUN`: the egress ifindex comes from the
/// `TEST_EGRESS_IFINDEX` map instead of the context.
#[xdp]
pub fn xina_egress_test(ctx: XdpContext) -> u32 {
    let ifindex = maps::TEST_EGRESS_IFINDEX.get(0).copied().unwrap_or(0);
    egress::try_egress(&ctx, ifindex)
        .unwrap_or_else(Verdict::from)
        .finish()
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

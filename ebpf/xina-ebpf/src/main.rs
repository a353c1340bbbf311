//! The xina switch dataplane.
//!
//! - [`xina_switch`]: the ingress XDP program on every switch port. It parses
//!   Ethernet / IPv4 / UDP / xina, lets everything that is not xina through
//!   unchanged, admits contributions (job, member, shape, slot range) and
//!   tail-calls the aggregation program of the job's element type and op;
//!   multicast and anycast packets it tail-calls [`xina_group`] with.
//! - [`xina_group`]: multicast and anycast groups (see [`group`]): admits
//!   the packet (group, member, sender, shape, lengths, window), runs the
//!   acknowledgement step on the chunk's slot copy, and replicates data to
//!   every port, answers from the slot, reports missing receivers, delivers
//!   the aggregated acknowledgement, or sends anycast data to the member its
//!   flow hashes to.
//! - `xina_agg_{i32,i64}_{sum,max,min}_{64,128,256,360}`: combine the contribution into its
//!   slot; the packet that completes a chunk becomes the result and is
//!   broadcast to every port through the `PORTS` devmap. One program per type
//!   and op keeps each within the verifier's budget (every element loop of up
//!   to 360 iterations is walked by the verifier).
//! - [`xina_egress`]: the devmap egress program, run once per port copy of a
//!   broadcast result. It keeps the copy only if the job has a member behind
//!   that port, and addresses it to that member. For groups it keeps a data
//!   copy for the receivers in its bitmap (counting it in `MEMBER_PACKETS`),
//!   turns the root's copy of a selective retransmission into the root's
//!   missing-receiver report, and passes acknowledgements to the members
//!   they are for.
//! - [`xina_egress_test`]: the same egress logic as a plain XDP program, for
//!   `BPF_PROG_TEST_RUN` (which cannot run devmap programs).
//! - [`xina_drop`]: `XDP_DROP`, the cost baseline for benchmarks.
//! - [`xina_lossy_egress`], [`xina_lossy_ingress`]: the testbed's lossy link
//!   (tc), not part of the switch.
//!
//! How a job's group is selected when jobs share ports: the broadcast reaches
//! every port in `PORTS`; the egress program looks up `(job, egress ifindex)`
//! in `PORT_MEMBERS` and drops the copy when the job has no member there. A
//! job's group is therefore the set of ports its members sit behind, and each
//! port carries at most one member per job.
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd`: the per-member packet counters are
// shared by every CPU and need an atomic add; the eBPF build is pinned to a
// nightly toolchain.
#![feature(core_intrinsics, asm_experimental_arch)]
#![expect(internal_features, reason = "core_intrinsics, for atomic_xadd")]

mod egress;
mod error;
mod fanout;
mod group;
mod lossy;
mod maps;
mod packet;
mod slot;
mod switch;
mod wide;

use aya_ebpf::{
    bindings::xdp_action::XDP_DROP,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use xina_proto::counters::Counter;

use crate::{error::Verdict, maps::Tally};

/// Ingress program of every switch port.
#[xdp(frags)]
pub fn xina_switch(ctx: XdpContext) -> u32 {
    let mut tally = Tally::ifindex(ctx.ingress_ifindex() as u32);
    tally.count(Counter::RxPackets);
    switch::try_switch(&ctx, &mut tally)
        .unwrap_or_else(Verdict::from)
        .finish(&tally)
}

/// The multicast and anycast paths, tail-called by `xina_switch` for
/// packets of kind `McastData` and `McastAck` (see [`group`]).
#[xdp(frags)]
pub fn xina_group(ctx: XdpContext) -> u32 {
    // `xina_switch` counted the frame as received, switch-wide and on its
    // port; this program counts its outcome.
    let mut tally = Tally::ifindex(ctx.ingress_ifindex() as u32);
    group::try_group(&ctx, &mut tally)
        .unwrap_or_else(Verdict::from)
        .finish(&tally)
}

/// Declares the aggregation programs `xina_switch` tail-calls, one per
/// element type, op and size class, so the verifier checks each on its own.
macro_rules! aggregate_programs {
    ($($name:ident: $elem:ty, $op:ty, $n:literal;)*) => {$(
        #[xdp(frags)]
        pub fn $name(ctx: XdpContext) -> u32 {
            // The port and job indexes arrive in the scratch entry.
            let mut tally = Tally::port_index(xina_proto::maps::NO_PORT_INDEX);
            switch::aggregate::<$elem, $op, $n>(&ctx, &mut tally)
                .unwrap_or_else(Verdict::from)
                .finish(&tally)
        }
    )*};
}

// The order must match `xina_proto::maps::programs::AGGREGATE`: index
// `4 × (3 × dtype + op) + class`, classes of 64, 128, 256 and 360 elements
// per packet (an `int64` packet holds at most 180).
aggregate_programs! {
    xina_agg_i32_sum_64: slot::I32, slot::Sum, 64;
    xina_agg_i32_sum_128: slot::I32, slot::Sum, 128;
    xina_agg_i32_sum_256: slot::I32, slot::Sum, 256;
    xina_agg_i32_sum_360: slot::I32, slot::Sum, 360;
    xina_agg_i32_max_64: slot::I32, slot::Max, 64;
    xina_agg_i32_max_128: slot::I32, slot::Max, 128;
    xina_agg_i32_max_256: slot::I32, slot::Max, 256;
    xina_agg_i32_max_360: slot::I32, slot::Max, 360;
    xina_agg_i32_min_64: slot::I32, slot::Min, 64;
    xina_agg_i32_min_128: slot::I32, slot::Min, 128;
    xina_agg_i32_min_256: slot::I32, slot::Min, 256;
    xina_agg_i32_min_360: slot::I32, slot::Min, 360;
    xina_agg_i64_sum_64: slot::I64, slot::Sum, 64;
    xina_agg_i64_sum_128: slot::I64, slot::Sum, 128;
    xina_agg_i64_sum_256: slot::I64, slot::Sum, 256;
    xina_agg_i64_sum_360: slot::I64, slot::Sum, 360;
    xina_agg_i64_max_64: slot::I64, slot::Max, 64;
    xina_agg_i64_max_128: slot::I64, slot::Max, 128;
    xina_agg_i64_max_256: slot::I64, slot::Max, 256;
    xina_agg_i64_max_360: slot::I64, slot::Max, 360;
    xina_agg_i64_min_64: slot::I64, slot::Min, 64;
    xina_agg_i64_min_128: slot::I64, slot::Min, 128;
    xina_agg_i64_min_256: slot::I64, slot::Min, 256;
    xina_agg_i64_min_360: slot::I64, slot::Min, 360;
}

/// Declares the wide aggregation programs (see [`wide`]), one per element
/// type and op.
macro_rules! wide_programs {
    ($($name:ident: $elem:ty, $op:ty, $step:literal;)*) => {$(
        #[xdp(frags)]
        pub fn $name(ctx: XdpContext) -> u32 {
            let mut tally = Tally::port_index(xina_proto::maps::NO_PORT_INDEX);
            wide::aggregate::<$elem, $op, $step>(&ctx, &mut tally)
                .unwrap_or_else(Verdict::from)
                .finish(&tally)
        }
    )*};
}

// The order must match `xina_proto::maps::programs::WIDE`: `3 × dtype + op`.
wide_programs! {
    xina_wide_i32_sum: slot::I32, slot::Sum, 128;
    xina_wide_i32_max: slot::I32, slot::Max, 128;
    xina_wide_i32_min: slot::I32, slot::Min, 128;
    xina_wide_i64_sum: slot::I64, slot::Sum, 32;
    xina_wide_i64_max: slot::I64, slot::Max, 32;
    xina_wide_i64_min: slot::I64, slot::Min, 32;
}

/// TCX ingress program of every switch port: clones a completed wide
/// result (marked by the wide path in its XDP metadata) to every member of
/// its job; everything else goes on unchanged (see [`fanout`]).
#[classifier]
pub fn xina_fanout(ctx: TcContext) -> i32 {
    fanout::fanout(&ctx)
}

/// Devmap egress program: addresses a result copy to the job's member on
/// this port, as a full result or as a completion notice.
#[xdp(frags, map = "devmap")]
pub fn xina_egress(ctx: XdpContext) -> u32 {
    // SAFETY: `ctx.ctx` is the kernel-provided context of a devmap program,
    // which has `egress_ifindex` set.
    let ifindex = unsafe { (*ctx.ctx).egress_ifindex };
    let mut tally = Tally::ifindex(ifindex);
    egress::try_egress(&ctx, ifindex, &mut tally)
        .unwrap_or_else(Verdict::from)
        .finish(&tally)
}

/// [`xina_egress`] for `BPF_PROG_TEST_RUN`: the egress ifindex comes from the
/// `TEST_EGRESS_IFINDEX` map instead of the context.
#[xdp(frags)]
pub fn xina_egress_test(ctx: XdpContext) -> u32 {
    let ifindex = maps::TEST_EGRESS_IFINDEX.get(0).copied().unwrap_or(0);
    let mut tally = Tally::ifindex(ifindex);
    egress::try_egress(&ctx, ifindex, &mut tally)
        .unwrap_or_else(Verdict::from)
        .finish(&tally)
}

/// Drops everything: the baseline `xina-testbed bench switch` measures the
/// switch's paths against, over the same frames in the same run.
#[xdp(frags)]
pub fn xina_drop(_ctx: XdpContext) -> u32 {
    XDP_DROP
}

/// The testbed's lossy link on an interface's egress.
#[classifier]
pub fn xina_lossy_egress(ctx: TcContext) -> i32 {
    lossy::lossy(&ctx, xina_proto::lossy::direction::EGRESS)
}

/// The testbed's lossy link on an interface's ingress.
#[classifier]
pub fn xina_lossy_ingress(ctx: TcContext) -> i32 {
    lossy::lossy(&ctx, xina_proto::lossy::direction::INGRESS)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

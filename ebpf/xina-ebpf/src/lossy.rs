//! The testbed's lossy link (see `xina_proto::lossy`): a tc program on an
//! interface's egress or ingress that drops, duplicates or delays a
//! configured fraction of frames, with counters of what it did.
//!
//! - drop: `TC_ACT_SHOT`;
//! - duplicate: `bpf_clone_redirect` to the same hook, the copy marked so it
//!   passes untouched when it meets the program again;
//! - delay (egress only): `skb->priority` set to a slow HTB class the testbed
//!   installs, so frames queued behind it overtake it — reordering.
//!
//! The program sees packets, not wire frames: a packet that segmentation
//! offload (GSO/TSO) will cut, or that GRO merged, is dropped whole, and is
//! counted as its `gso_segs` frames. The testbed's per-frame model turns
//! those offloads off so that every packet is one frame.

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, TC_ACT_OK, TC_ACT_SHOT},
    btf_maps::{HashMap, PerCpuHashMap},
    helpers::bpf_get_prandom_u32,
    macros::btf_map,
    programs::TcContext,
};
use xina_proto::{
    XINA_UDP_PORT,
    lossy::{DUPLICATE_MARK, LinkConfig, LinkCounters, LinkKey, PPM, counter, direction},
    net::{
        ETH_HLEN, ETH_P_IPV4, ETH_TYPE, IPPROTO_UDP, IPV4_PROTO, IPV4_VIHL, UDP_DPORT, UDP_SPORT,
    },
};

/// What to do, by interface and direction (written by the testbed).
#[btf_map]
pub static LOSSY_CONFIG: HashMap<LinkKey, LinkConfig, 256> = HashMap::new();

/// What was done, by interface and direction (entries made by the testbed).
#[btf_map]
pub static LOSSY_COUNTERS: PerCpuHashMap<LinkKey, LinkCounters, 256> = PerCpuHashMap::new();

/// Whether the frame is UDP to or from the xina port.
fn is_xina(ctx: &TcContext) -> bool {
    let Ok(ethertype) = ctx.load::<[u8; 2]>(ETH_TYPE) else {
        return false;
    };
    if u16::from_be_bytes(ethertype) != ETH_P_IPV4 {
        return false;
    }
    let (Ok(vihl), Ok(proto)) = (
        ctx.load::<u8>(ETH_HLEN + IPV4_VIHL),
        ctx.load::<u8>(ETH_HLEN + IPV4_PROTO),
    ) else {
        return false;
    };
    if proto != IPPROTO_UDP {
        return false;
    }
    let udp = ETH_HLEN + usize::from(vihl & 0x0f) * 4;
    let port = |at: usize| {
        ctx.load::<[u8; 2]>(udp + at)
            .map(u16::from_be_bytes)
            .unwrap_or(0)
    };
    port(UDP_SPORT) == XINA_UDP_PORT || port(UDP_DPORT) == XINA_UDP_PORT
}

/// True with probability `ppm` parts per million.
fn chance(ppm: u32) -> bool {
    // SAFETY: a helper without arguments.
    ppm != 0 && unsafe { bpf_get_prandom_u32() } % PPM < ppm
}

pub fn lossy(ctx: &TcContext, dir: u32) -> i32 {
    // SAFETY: `ctx.skb.skb` is the kernel's context of this tc program.
    let skb = unsafe { &mut *ctx.skb.skb };
    if skb.mark == DUPLICATE_MARK {
        return TC_ACT_OK as i32;
    }
    let key = LinkKey {
        ifindex: skb.ifindex,
        direction: dir,
    };
    // SAFETY: read-only access to a map value.
    let Some(config) = (unsafe { LOSSY_CONFIG.get(key) }).copied() else {
        return TC_ACT_OK as i32;
    };
    if config.xina_only != 0 && !is_xina(ctx) {
        return TC_ACT_OK as i32;
    }
    let counters = LOSSY_COUNTERS.get_ptr_mut(key);
    let add = |i: usize, n: u64| {
        if let Some(c) = counters {
            // SAFETY: this CPU's value; `i` is below `counter::COUNT`.
            unsafe { (*c)[i] += n };
        }
    };
    let count = |i: usize| add(i, 1);
    // A packet that segmentation offload built (or GRO merged) stands for
    // `gso_segs` frames on a wire; any other packet for one.
    let frames = u64::from(skb.gso_segs.max(1));
    count(counter::SEEN);
    add(counter::FRAMES, frames);
    if chance(config.drop_ppm) {
        count(counter::DROPPED);
        add(counter::FRAMES_DROPPED, frames);
        return TC_ACT_SHOT as i32;
    }
    if chance(config.duplicate_ppm) {
        let mark = skb.mark;
        skb.mark = DUPLICATE_MARK;
        let flags = if dir == direction::INGRESS {
            u64::from(BPF_F_INGRESS)
        } else {
            0
        };
        if ctx.clone_redirect(key.ifindex, flags).is_ok() {
            count(counter::DUPLICATED);
        }
        skb.mark = mark;
    }
    if dir == direction::EGRESS && chance(config.delay_ppm) {
        skb.priority = config.delay_priority;
        count(counter::DELAYED);
    }
    TC_ACT_OK as i32
}

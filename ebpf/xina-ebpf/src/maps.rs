//! The dataplane's maps. Names, key and value types come from
//! `xina_proto::maps`; userspace reaches them only through `xina::Dataplane`.

use aya_ebpf::{
    Global,
    btf_maps::{Array, DevMap, HashMap, PerCpuArray},
    macros::btf_map,
};
use xina_proto::{
    counters::Counter,
    maps::{
        DEFAULT_SLOT_POOL, Job, MAX_JOBS, MAX_MEMBERS, MAX_PORTS, Member, MemberKey, PortKey, Slot,
    },
};

/// Installed jobs by id.
#[btf_map]
pub static JOBS: HashMap<u32, Job, { MAX_JOBS as usize }> = HashMap::new();

/// Members by `(job, rank)`.
#[btf_map]
pub static MEMBERS: HashMap<MemberKey, Member, { MAX_MEMBERS as usize }> = HashMap::new();

/// Members by `(job, switch port ifindex)`.
#[btf_map]
pub static PORT_MEMBERS: HashMap<PortKey, Member, { MAX_MEMBERS as usize }> = HashMap::new();

/// The aggregator slot pool: copy `v` of slot `s` is entry `2 * s + v`.
/// Userspace sizes it at load time.
#[btf_map]
pub static SLOTS: Array<Slot, { 2 * DEFAULT_SLOT_POOL as usize }> = Array::new();

/// The switch ports, each entry carrying the egress program.
#[btf_map]
pub static PORTS: DevMap<{ MAX_PORTS as usize }> = DevMap::new();

/// Per-CPU counters indexed by [`Counter`].
#[btf_map]
pub static COUNTERS: PerCpuArray<u64, { Counter::COUNT }> = PerCpuArray::new();

/// The egress ifindex seen by `xina_egress_test`.
#[btf_map]
pub static TEST_EGRESS_IFINDEX: Array<u32, 1> = Array::new();

/// Non-zero: log chunk completions and cache replies through aya-log. Set by
/// the loader; off by default because logging costs on the hot path.
#[unsafe(no_mangle)]
pub static XINA_DEBUG: Global<u8> = Global::new(0);

/// Adds one to counter `c` on this CPU.
#[inline(always)]
pub fn count(c: Counter) {
    if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: a per-CPU array entry is only touched by programs running
        // on this CPU, and XDP programs do not preempt each other on one CPU.
        unsafe { *p += 1 };
    }
}

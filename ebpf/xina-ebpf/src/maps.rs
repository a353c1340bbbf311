//! The dataplane's maps. Names, key and value types come from
//! `xina_proto::maps`; userspace reaches them only through `xina::Dataplane`.

use aya_ebpf::{
    Global,
    btf_maps::{Array, DevMap, HashMap, PerCpuArray, PerCpuHashMap, ProgramArray},
    macros::btf_map,
};
use xina_proto::{
    MAX_PAYLOAD,
    counters::Counter,
    maps::{
        CounterBlock, DEFAULT_SLOT_POOL, Job, MAX_JOBS, MAX_MEMBERS, MAX_PORTS, Member, MemberKey,
        PortKey, Slot,
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

/// Counters of each installed job (entries made by the control plane).
#[btf_map]
pub static JOB_COUNTERS: PerCpuHashMap<u32, CounterBlock, { MAX_JOBS as usize }> =
    PerCpuHashMap::new();

/// Counters of each switch port by ifindex (entries made by the control plane).
#[btf_map]
pub static PORT_COUNTERS: PerCpuHashMap<u32, CounterBlock, { MAX_PORTS as usize }> =
    PerCpuHashMap::new();

/// The aggregation programs, by `4 × (3 × dtype + op) + size class` (see
/// `xina_switch` and `xina_proto::maps::programs::AGGREGATE`).
#[btf_map]
pub static AGGREGATE: ProgramArray<24> = ProgramArray::new();

/// A contribution that passed admission, handed from `xina_switch` to the
/// aggregation program it tail-calls (per CPU: nothing runs in between).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    /// Index of the slot copy in `SLOTS`.
    pub copy: u32,
    pub seq: u32,
    pub count: u32,
    pub rank: u32,
    pub root: u32,
    pub reuse: u32,
    pub all_ranks: u64,
    pub job: u32,
    /// The sender's switch port.
    pub ifindex: u32,
    pub mode: u32,
    /// The sender's port in `PORTS`, or `NO_PORT_INDEX`.
    pub port_index: u32,
}

/// Per-CPU scratch of the ingress path: the admitted contribution, and its
/// payload staged in (`input`) and the result staged out (`output`) around
/// the slot's critical section, where packet access helpers cannot run.
#[repr(C)]
pub struct Scratch {
    pub pending: Pending,
    pub input: [u32; MAX_PAYLOAD / 4],
    pub output: [u32; MAX_PAYLOAD / 4],
}

/// This CPU's [`Scratch`].
#[btf_map]
pub static SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// The egress ifindex seen by `xina_egress_test`.
#[btf_map]
pub static TEST_EGRESS_IFINDEX: Array<u32, 1> = Array::new();

/// Non-zero: log chunk completions and cache replies through aya-log. Set by
/// the loader; off by default because logging costs on the hot path.
#[unsafe(no_mangle)]
pub static XINA_DEBUG: Global<u8> = Global::new(0);

/// Where a packet's counters go: the switch-wide array, its port's block
/// and, once the packet's job is known, the job's block. All per CPU: an
/// entry is only touched by programs running on this CPU, and XDP programs
/// do not preempt each other on one CPU.
pub struct Tally {
    port: Option<*mut CounterBlock>,
    job: Option<*mut CounterBlock>,
}

impl Tally {
    /// Counters of the port with this ifindex (0 in test runs: none).
    #[inline(always)]
    pub fn port(ifindex: u32) -> Self {
        Self {
            port: PORT_COUNTERS.get_ptr_mut(ifindex),
            job: None,
        }
    }

    /// From now on, also count into job `job`'s block.
    #[inline(always)]
    pub fn set_job(&mut self, job: u32) {
        self.job = JOB_COUNTERS.get_ptr_mut(job);
    }

    /// On ingress, once the frame's job is known: count the frame as
    /// received in the job's block too (the switch-wide and port blocks
    /// counted it on arrival), so the job's outcomes add up to its
    /// `rx_packets` like the switch-wide ones do.
    #[inline(always)]
    pub fn enter_job(&mut self, job: u32) {
        self.set_job(job);
        if let Some(block) = self.job {
            // SAFETY: this CPU's value (see the type's docs).
            unsafe { (*block)[Counter::RxPackets as usize] += 1 };
        }
    }

    /// Adds one to counter `c`.
    #[inline(always)]
    pub fn count(&self, c: Counter) {
        let i = c as usize;
        if let Some(p) = COUNTERS.get_ptr_mut(c as u32) {
            // SAFETY: a per-CPU value of this CPU (see the type's docs).
            unsafe { *p += 1 };
        }
        if let Some(block) = self.port {
            // SAFETY: as above; `i` is below `Counter::COUNT`.
            unsafe { (*block)[i] += 1 };
        }
        if let Some(block) = self.job {
            // SAFETY: as above.
            unsafe { (*block)[i] += 1 };
        }
    }
}

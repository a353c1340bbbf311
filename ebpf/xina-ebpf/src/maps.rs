//! The dataplane's maps. Names, key and value types come from
//! `xina_proto::maps`; userspace reaches them only through `xina::Dataplane`.

use aya_ebpf::{
    Global,
    btf_maps::{Array, DevMap, HashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
};
use xina_proto::{
    MAX_FRAME_PAYLOAD, MAX_PAYLOAD,
    counters::Counter,
    maps::{
        CounterBlock, DEFAULT_SLOT_POOL, DEFAULT_UNITS, Job, MAX_JOBS, MAX_MEMBERS, MAX_PORTS,
        MEMBER_PACKETS_PER_JOB, Member, MemberKey, NO_PORT_INDEX, PortKey, Slot, Unit, programs,
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

/// Counters of each installed job, at the job's `counters` index. Arrays,
/// not hash maps: the verifier inlines their lookups, and the dense indexes
/// travel to the tail-called programs in [`Pending`].
#[btf_map]
pub static JOB_COUNTERS: PerCpuArray<CounterBlock, { MAX_JOBS as usize }> = PerCpuArray::new();

/// Counters of each switch port, at its `PORTS` index.
#[btf_map]
pub static PORT_COUNTERS: PerCpuArray<CounterBlock, { MAX_PORTS as usize }> = PerCpuArray::new();

/// A switch port's `PORTS` index by ifindex.
#[btf_map]
pub static PORT_INDEX: HashMap<u32, u32, { MAX_PORTS as usize }> = HashMap::new();

/// The programs `xina_switch` tail-calls: the aggregation programs, by
/// `4 × (3 × dtype + op) + size class` (see `xina_switch` and
/// `xina_proto::maps::programs::AGGREGATE`), then the group program at
/// `programs::GROUP_INDEX`.
#[btf_map]
pub static AGGREGATE: ProgramArray<{ programs::TAIL_CALLS as usize }> = ProgramArray::new();

/// Data copies delivered to each member of a group, at `Job::counters × 64 +
/// rank`. Shared by every CPU (not per CPU, so userspace reads one number
/// per member): the egress program adds with an atomic instruction.
#[btf_map]
pub static MEMBER_PACKETS: Array<u64, { (MAX_JOBS * MEMBER_PACKETS_PER_JOB) as usize }> =
    Array::new();

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
    /// The job's `JOB_COUNTERS` index.
    pub job_counters: u32,
    /// The ingress port's `PORTS` index, or `NO_PORT_INDEX`.
    pub ingress_port: u32,
    /// The sender's switch port.
    pub ifindex: u32,
    pub mode: u32,
    /// The sender's port in `PORTS`, or `NO_PORT_INDEX`.
    pub port_index: u32,
    /// Wide jobs: the job's first unit in `UNITS` and blocks per chunk.
    pub unit_base: u32,
    pub blocks: u32,
    /// Wide jobs: the copy's index within the job (`2 × slot + version`).
    pub job_copy: u32,
}

/// Per-CPU scratch of the ingress path: the admitted contribution, and its
/// payload staged in (`input`) and the result staged out (`output`) around
/// the slot's critical section, where packet access helpers cannot run.
#[repr(C)]
pub struct Scratch {
    pub pending: Pending,
    /// The slot step's plan, handed through map memory so that the
    /// verifier does not walk the element loops once per decision
    /// (`slot::step`).
    pub plan: u32,
    pub input: [u32; MAX_PAYLOAD / 4],
    pub output: [u32; MAX_PAYLOAD / 4],
    /// Room for the lengths the verifier sees (`packet::helper_len`).
    pub _room: [u8; NARROW_LEN_MASK + 1 - MAX_PAYLOAD],
}

/// The lengths the narrow path hands `bpf_xdp_load_bytes` and
/// `bpf_xdp_store_bytes` lie in `1..=NARROW_LEN_MASK + 1` for the verifier
/// (`packet::helper_len`).
pub const NARROW_LEN_MASK: usize = 2047;

/// The same for the wide path.
pub const WIDE_LEN_MASK: usize = 65535;

/// This CPU's [`Scratch`].
#[btf_map]
pub static SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// The wide path's memory: each wide job's partials (one per CPU and slot
/// copy; a complete chunk's result stays in its completer's), in units of
/// one block (see `xina_proto::frame`).
/// Userspace sizes it at load time.
#[btf_map]
pub static UNITS: Array<Unit, { DEFAULT_UNITS as usize }> = Array::new();

/// The wide path's staged payload, one entry per CPU (indexed by
/// `bpf_get_smp_processor_id`; a per-CPU array cannot hold 64 KB values).
/// The buffer sits 2,112 bytes into the value (the loops' accumulators
/// just before it): copies into a buffer at a page-aligned offset ran
/// several times slower (4 KiB aliasing with the packet's pages).
#[repr(C)]
pub struct WideScratch {
    pub _align: [u64; 260],
    pub acc: LoopAcc,
    pub input: WideBuf,
    /// Room for the lengths the verifier sees (`packet::helper_len`).
    pub _room: [u8; WIDE_LEN_MASK + 1 - MAX_FRAME_PAYLOAD],
}

/// What the wide path's element loops accumulate across their steps.
///
/// It lives in the map value, not on the stack: the verifier tracks the
/// values of stack slots but not those of map memory, so a flag or a
/// checksum kept here leaves the caller of `bpf_loop` in the same state
/// whatever the callback found, and the callback is verified once per
/// call site rather than once per combination of values
/// (`ebpf/README.md`, "Verifier budget").
#[repr(C)]
pub struct LoopAcc {
    /// Non-zero once a value saturated.
    pub over: u64,
    /// The result loop's int32 sums ORed through `Elem::excess`: whether
    /// one must be clamped.
    pub excess: u64,
    /// Non-zero if a unit was missing (a control-plane fault).
    pub failed: u64,
    /// Checksum adjustment from the staged payload to what replaced it.
    pub csum: u64,
}

/// A wide payload as 32-bit words in wire (big-endian) order.
pub type WideBuf = [u32; MAX_FRAME_PAYLOAD / 4];

/// Entries of `WIDE_SCRATCH` in the object; userspace sets the number of
/// possible CPUs at load.
pub const MAX_CPUS: u32 = 64;

#[btf_map]
pub static WIDE_SCRATCH: Array<WideScratch, { MAX_CPUS as usize }> = Array::new();

/// CPUs the dataplane may run on (the kernel's possible CPUs), set by the
/// loader: the number of partials each wide slot copy has.
#[unsafe(no_mangle)]
pub static XINA_CPUS: Global<u32> = Global::new(1);

/// The secret the wide path writes into a completed frame's XDP metadata
/// and the fan-out program checks (random per load, set by the loader).
#[unsafe(no_mangle)]
pub static XINA_FANOUT_KEY: Global<u32> = Global::new(0);

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
    /// The port's `PORTS` index, or `NO_PORT_INDEX`.
    pub port_index: u32,
    port: Option<*mut CounterBlock>,
    job: Option<*mut CounterBlock>,
}

impl Tally {
    /// Counters of the port with this ifindex (none if it is not a switch
    /// port, as in test runs).
    #[inline(always)]
    pub fn ifindex(ifindex: u32) -> Self {
        // SAFETY: read-only access to a map value.
        let index = unsafe { PORT_INDEX.get(ifindex) }
            .copied()
            .unwrap_or(NO_PORT_INDEX);
        Self::port_index(index)
    }

    /// Counters of the port at this `PORTS` index.
    #[inline(always)]
    pub fn port_index(index: u32) -> Self {
        Self {
            port_index: index,
            port: PORT_COUNTERS.get_ptr_mut(index),
            job: None,
        }
    }

    /// From now on, also count into the job block at `index`.
    #[inline(always)]
    pub fn set_job(&mut self, index: u32) {
        self.job = JOB_COUNTERS.get_ptr_mut(index);
    }

    /// On ingress, once the frame's job is known: count the frame as
    /// received in the job's block too (the switch-wide and port blocks
    /// counted it on arrival), so the job's outcomes add up to its
    /// `rx_packets` like the switch-wide ones do.
    #[inline(always)]
    pub fn enter_job(&mut self, index: u32) {
        self.set_job(index);
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

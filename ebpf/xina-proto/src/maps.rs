//! Keys and values of the dataplane's maps, and the maps' names.
//!
//! Every type here is `#[repr(C)]` with explicit padding and a size assertion,
//! so the kernel and userspace agree byte for byte. Addresses and ports are
//! stored in network order, exactly as they appear in packets.

use crate::MAX_ELEMS;

/// Map names as they appear in the eBPF object.
pub mod names {
    /// `HashMap<u32, Job>`: installed jobs by id.
    pub const JOBS: &str = "JOBS";
    /// `HashMap<MemberKey, Member>`: a job's members by rank.
    pub const MEMBERS: &str = "MEMBERS";
    /// `HashMap<PortKey, Member>`: a job's member behind a switch port.
    pub const PORT_MEMBERS: &str = "PORT_MEMBERS";
    /// `Array<Slot>`: the aggregator slot pool, two copies per slot.
    pub const SLOTS: &str = "SLOTS";
    /// `DevMap`: the switch's ports, each with the egress program.
    pub const PORTS: &str = "PORTS";
    /// `PerCpuArray<u64>`: counters indexed by [`crate::counters::Counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// `PerCpuArray<CounterBlock>`: counters of each installed job, at the
    /// job's `Job::counters` index.
    pub const JOB_COUNTERS: &str = "JOB_COUNTERS";
    /// `PerCpuArray<CounterBlock>`: counters of each port, at its `PORTS` index.
    pub const PORT_COUNTERS: &str = "PORT_COUNTERS";
    /// `HashMap<u32, u32>`: a port's `PORTS` index by its ifindex.
    pub const PORT_INDEX: &str = "PORT_INDEX";
    /// `ProgramArray`: the programs `xina_switch` tail-calls: the
    /// aggregation programs ([`super::programs::AGGREGATE`]) and, at
    /// [`super::programs::GROUP_INDEX`], the group program
    /// ([`super::programs::GROUP`]).
    pub const AGGREGATE: &str = "AGGREGATE";
    /// `PerCpuArray<Scratch>` with one entry: the ingress path's per-CPU
    /// hand-off from `xina_switch` to the aggregation program it tail-calls
    /// (private to the programs; pinned so an upgraded switch shares it).
    pub const SCRATCH: &str = "SCRATCH";
    /// `Array<u64>`: data copies delivered to each member of a multicast or
    /// anycast group, at index `Job::counters × 64 + rank` (not per CPU: the
    /// egress program adds atomically).
    pub const MEMBER_PACKETS: &str = "MEMBER_PACKETS";
    /// `Array<Unit>`: the wide path's accumulators and results, in
    /// [`crate::frame::UNIT_BYTES`]-byte units; a wide job owns the range
    /// `Job::unit_base ..` of [`crate::frame::wide_units`] units.
    pub const UNITS: &str = "UNITS";
    /// `Array<WideScratch>` with one entry per CPU: the wide path's staged
    /// payload (a per-CPU array cannot hold 64 KB values).
    pub const WIDE_SCRATCH: &str = "WIDE_SCRATCH";
    /// `Array<u32>` with one entry: the egress ifindex the test entry point
    /// of the egress program pretends to run on.
    pub const TEST_EGRESS_IFINDEX: &str = "TEST_EGRESS_IFINDEX";
}

/// Program names in the eBPF object.
pub mod programs {
    /// Ingress XDP program attached to every switch port.
    pub const SWITCH: &str = "xina_switch";
    /// Devmap egress program that addresses each result copy to its member.
    pub const EGRESS: &str = "xina_egress";
    /// Plain XDP wrapper of the egress logic for `BPF_PROG_TEST_RUN`, which
    /// cannot run devmap programs.
    pub const EGRESS_TEST: &str = "xina_egress_test";
    /// `XDP_DROP` and nothing else: the baseline of `xina-testbed bench switch`.
    pub const DROP: &str = "xina_drop";
    /// The aggregation programs `xina_switch` tail-calls, at index
    /// `4 × (3 × dtype + op) + class` of the `AGGREGATE` program array, where
    /// the size class is the job's elements per packet rounded up to 64,
    /// 128, 256 or 360 (each program's loops run that many times).
    pub const AGGREGATE: [&str; 24] = [
        "xina_agg_i32_sum_64",
        "xina_agg_i32_sum_128",
        "xina_agg_i32_sum_256",
        "xina_agg_i32_sum_360",
        "xina_agg_i32_max_64",
        "xina_agg_i32_max_128",
        "xina_agg_i32_max_256",
        "xina_agg_i32_max_360",
        "xina_agg_i32_min_64",
        "xina_agg_i32_min_128",
        "xina_agg_i32_min_256",
        "xina_agg_i32_min_360",
        "xina_agg_i64_sum_64",
        "xina_agg_i64_sum_128",
        "xina_agg_i64_sum_256",
        "xina_agg_i64_sum_360",
        "xina_agg_i64_max_64",
        "xina_agg_i64_max_128",
        "xina_agg_i64_max_256",
        "xina_agg_i64_max_360",
        "xina_agg_i64_min_64",
        "xina_agg_i64_min_128",
        "xina_agg_i64_min_256",
        "xina_agg_i64_min_360",
    ];
    /// The wide-path aggregation programs, at `WIDE_BASE + 3 × dtype + op`
    /// of the `AGGREGATE` array: jobs with more elements per packet than
    /// the narrow path takes (see [`crate::frame`]).
    pub const WIDE: [&str; 6] = [
        "xina_wide_i32_sum",
        "xina_wide_i32_max",
        "xina_wide_i32_min",
        "xina_wide_i64_sum",
        "xina_wide_i64_max",
        "xina_wide_i64_min",
    ];
    /// Index of the first [`WIDE`] program in the `AGGREGATE` array, after
    /// the group program.
    pub const WIDE_BASE: u32 = GROUP_INDEX + 1;
    /// The tc (TCX ingress) program on every switch port that fans a wide
    /// result out: the wide path passes the completed frame to the kernel
    /// marked in its XDP metadata, and this program clones it to every
    /// member's port, addressing each copy.
    pub const FANOUT: &str = "xina_fanout";
    /// The program `xina_switch` tail-calls for multicast and anycast packets
    /// ([`crate::Kind::McastData`], [`crate::Kind::McastAck`]): replication,
    /// acknowledgement aggregation and anycast delivery.
    pub const GROUP: &str = "xina_group";
    /// Index of [`GROUP`] in the `AGGREGATE` program array, after the
    /// aggregation programs.
    pub const GROUP_INDEX: u32 = AGGREGATE.len() as u32;
    /// Entries of the `AGGREGATE` program array.
    pub const TAIL_CALLS: u32 = WIDE_BASE + WIDE.len() as u32;
}

/// Capacity of the `PORTS` devmap: most ports one switch can have.
pub const MAX_PORTS: u32 = 64;
/// Capacity of the `JOBS` map: concurrent jobs (tenants) one switch holds.
pub const MAX_JOBS: u32 = 4096;
/// Capacity of the `MEMBERS` and `PORT_MEMBERS` maps.
pub const MAX_MEMBERS: u32 = 64 * 1024;
/// Default number of slots in the pool (each has two copies in `SLOTS`).
pub const DEFAULT_SLOT_POOL: u32 = 4096;

/// Result delivery modes of a job.
pub mod mode {
    /// The result goes to every member.
    pub const ALLREDUCE: u8 = 0;
    /// The result goes to the chunk's root (the header's `root` rank, the
    /// same for every chunk of a call); every other member gets a completion
    /// notice without payload.
    pub const REDUCE: u8 = 1;
    /// Like [`REDUCE`], but each chunk names its own root (its owner), so the
    /// result is scattered over the ranks.
    pub const REDUCE_SCATTER: u8 = 2;
    /// A multicast group: a sender's chunk goes to every other member, whose
    /// acknowledgements the switch aggregates in the sender's slot window.
    pub const MULTICAST: u8 = 3;
    /// An anycast group: each packet goes to one member that is up, chosen by
    /// [`crate::anycast::pick`] from the sender's flow.
    pub const ANYCAST: u8 = 4;

    /// Whether `mode` is a group (multicast or anycast) rather than an
    /// aggregation job.
    pub const fn is_group(mode: u8) -> bool {
        mode == MULTICAST || mode == ANYCAST
    }
}

/// Bits of `Member::flags`.
pub mod member_flags {
    /// Groups: the member may send data to the group.
    pub const SENDER: u8 = 0x01;
    /// Anycast: the member is marked down and receives nothing new (its bit
    /// is also cleared from the group's `Job::all_ranks`).
    pub const DOWN: u8 = 0x02;
}

/// Entries of the per-member packet counters (`MEMBER_PACKETS`) per job.
pub const MEMBER_PACKETS_PER_JOB: u32 = crate::MAX_RANKS as u32;

/// One counter of each kind, indexed by [`crate::counters::Counter`]: the
/// value of the per-job and per-port counter maps.
pub type CounterBlock = [u64; crate::counters::Counter::COUNT];

/// An installed job (tenant), or a multicast or anycast group.
///
/// For a group, `dtype` is [`crate::DType::Bytes`], `op` is 0, `elems` the
/// most payload bytes per packet, and `all_ranks` the members that receive:
/// every member for multicast, the members that are up for anycast. A
/// multicast group's slot range is split into `fan_in` equal windows, one per
/// rank, `slot_count / fan_in` slots each; a sender's chunks use its window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Job {
    /// Number of ranks; ranks are `0..fan_in`.
    pub fan_in: u8,
    /// [`crate::Op`] as its wire value.
    pub op: u8,
    /// [`crate::DType`] as its wire value.
    pub dtype: u8,
    /// One of [`mode`].
    pub mode: u8,
    /// Most elements per packet (the last chunk of a buffer may carry fewer).
    pub elems: u16,
    /// Index of the job's block in `JOB_COUNTERS` (below [`MAX_JOBS`]).
    pub counters: u16,
    /// First slot of the job's private range in the pool.
    pub slot_base: u32,
    /// Number of slots in the range; packets index `0..slot_count`.
    pub slot_count: u32,
    /// Bitmap with one bit per rank: the chunk is complete when the slot's
    /// bitmap equals it.
    pub all_ranks: u64,
    /// Wide jobs: the first of the job's units in `UNITS` (0 otherwise).
    pub unit_base: u32,
    /// Wide jobs: blocks per chunk, `frame::blocks(elems)` (0 otherwise).
    pub blocks: u32,
}

/// Key of `MEMBERS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemberKey {
    pub job: u32,
    pub rank: u32,
}

/// Key of `PORT_MEMBERS`: which member of `job` sits behind port `ifindex`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortKey {
    pub job: u32,
    pub ifindex: u32,
}

/// Where a member of a job lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// IPv4 address, network order.
    pub ip: [u8; 4],
    /// UDP port, network order.
    pub port: [u8; 2],
    /// The member's MAC address.
    pub mac: [u8; 6],
    /// MAC address of the switch port the member is attached to (the source
    /// MAC of frames sent to it).
    pub port_mac: [u8; 6],
    /// [`member_flags`] bits (groups only; 0 in aggregation jobs).
    pub flags: u8,
    pub _pad: u8,
    /// Interface index of that switch port.
    pub ifindex: u32,
    /// The member's rank.
    pub rank: u32,
    /// Index of that switch port in the `PORTS` devmap, or [`NO_PORT_INDEX`].
    pub port_index: u32,
}

/// `Member::port_index` of a member whose port is not in the `PORTS` devmap
/// (only in test runs, which attach nothing).
pub const NO_PORT_INDEX: u32 = u32::MAX;

/// The kernel's `struct bpf_spin_lock`. The verifier finds the lock of a map
/// value by this exact BTF type name, hence the C-style name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct bpf_spin_lock {
    pub val: u32,
}

/// Slot states.
pub mod slot_state {
    /// Never used since the pool was created or the job installed.
    pub const EMPTY: u32 = 0;
    /// Some ranks have contributed to `seq`.
    pub const PARTIAL: u32 = 1;
    /// Every rank has contributed; `values` holds the result of `seq`.
    pub const COMPLETE: u32 = 2;
    /// Wide path: every rank's contribution has landed and one CPU is
    /// writing the result; repeats are duplicates until it is `COMPLETE`.
    pub const COMPLETING: u32 = 3;
}

/// One copy of an aggregator slot. A multicast group uses the same copies
/// for acknowledgements: `seq` and `root` name the chunk and its sender,
/// `bitmap` holds the receivers that acknowledged it, `flags` its
/// [`crate::Flags::SYNC`] bit, `state` is `PARTIAL` until every receiver has
/// acknowledged and `COMPLETE` after; `values` are unused.
/// A slot has two copies (selected by the
/// header's version bit): while chunk `s + W` accumulates in one, the other
/// still holds the result of chunk `s` for ranks that retransmit.
///
/// Values are kept as `i64` whatever the job's element type: `int32` sums
/// accumulate without overflow (64 ranks of `int32` cannot overflow an
/// `i64`) and are clamped once, when the chunk completes, so the result does
/// not depend on the order contributions arrive in.
///
/// Memory: 2,928 bytes per copy, 5,856 bytes per slot.
///
/// A wide job's copies keep only the state here: their partial sums and
/// results live in the job's units of `UNITS` (see [`crate::frame`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Serialises contributions from different CPUs to this copy.
    pub lock: bpf_spin_lock,
    /// One of [`slot_state`].
    pub state: u32,
    /// Chunk sequence number held.
    pub seq: u32,
    /// Number of elements of the chunk.
    pub count: u32,
    /// Ranks that have contributed.
    pub bitmap: u64,
    /// [`crate::Flags`] bits of the result (overflow).
    pub flags: u32,
    /// The chunk's root rank (reduce, reduce-scatter).
    pub root: u32,
    /// Wide path: ranks whose contribution has been combined into a
    /// partial (`bitmap` holds those admitted; the chunk completes when
    /// this one is full).
    pub landed: u64,
    /// Wide path: CPUs whose partial holds part of this chunk; once it is
    /// complete, only the CPU whose partial holds the result.
    pub cpus: u64,
    /// Running combination, host byte order (narrow path only).
    pub values: [i64; MAX_ELEMS],
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            lock: bpf_spin_lock::default(),
            state: slot_state::EMPTY,
            seq: 0,
            count: 0,
            bitmap: 0,
            flags: 0,
            root: 0,
            landed: 0,
            cpus: 0,
            values: [0; MAX_ELEMS],
        }
    }
}

const _: () = {
    assert!(size_of::<Job>() == 32);
    assert!(size_of::<Unit>() == crate::frame::UNIT_BYTES);
    assert!(size_of::<MemberKey>() == 8);
    assert!(size_of::<PortKey>() == 8);
    assert!(size_of::<Member>() == 32);
    assert!(size_of::<bpf_spin_lock>() == 4);
    assert!(size_of::<Slot>() == 48 + 8 * MAX_ELEMS);
};

/// One unit of the wide path's memory: the 64-bit partials of one block,
/// or one block's result in wire order.
pub type Unit = [u64; crate::frame::BLOCK_ELEMS];

/// Default number of units in `UNITS` (32 MiB): room for four jobs of
/// 64 KB frames with 8 slots on two CPUs.
pub const DEFAULT_UNITS: u32 = 32 * 1024;

/// The fan-out mark the wide path leaves in a completed frame's XDP
/// metadata, read by the tc fan-out program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FanoutMeta {
    /// The switch's secret fan-out key (random per load): a frame whose
    /// metadata does not carry it is not a result of this switch.
    pub key: u32,
    /// The job whose result it is.
    pub job: u32,
}

#[cfg(feature = "user")]
mod pod {
    use super::{Job, Member, MemberKey, PortKey, Slot};

    // SAFETY: each type is `#[repr(C)]`, `Copy`, has no padding (checked by
    // the size assertions above) and every bit pattern is a valid value.
    unsafe impl aya::Pod for Job {}
    // SAFETY: as above.
    unsafe impl aya::Pod for MemberKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PortKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Member {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Slot {}
}

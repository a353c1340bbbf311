//! The testbed's lossy link: a tc program that drops, duplicates and delays
//! a configurable fraction of the frames crossing an interface, standing in
//! for `netem` (which this kernel lacks). Types shared with userspace.

/// Map names.
pub mod names {
    /// `HashMap<LinkKey, LinkConfig>`: what to do on each interface and direction.
    pub const CONFIG: &str = "LOSSY_CONFIG";
    /// `PerCpuHashMap<LinkKey, LinkCounters>`: what was done.
    pub const COUNTERS: &str = "LOSSY_COUNTERS";
}

/// The tc programs' names, for egress and for ingress.
pub const PROGRAMS: [&str; 2] = ["xina_lossy_egress", "xina_lossy_ingress"];

/// Mark put on a duplicate so the program lets it through untouched when
/// it passes the same hook again.
pub const DUPLICATE_MARK: u32 = 0x78_69_6e_61;

/// Rates are in parts per million.
pub const PPM: u32 = 1_000_000;

/// Direction of a hook.
pub mod direction {
    pub const EGRESS: u32 = 0;
    pub const INGRESS: u32 = 1;
}

/// Key of both maps: an interface and a direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkKey {
    pub ifindex: u32,
    /// One of [`direction`].
    pub direction: u32,
}

/// What the lossy link does to the frames it sees.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkConfig {
    /// Probability of dropping a frame, parts per million.
    pub drop_ppm: u32,
    /// Probability of sending a frame twice.
    pub duplicate_ppm: u32,
    /// Probability of delaying a frame (egress only: it is queued in a slow
    /// class, `delay_priority`, so frames behind it overtake it).
    pub delay_ppm: u32,
    /// `skb->priority` that selects the slow class (an HTB class id).
    pub delay_priority: u32,
    /// Non-zero: only frames to or from the xina UDP port are affected.
    pub xina_only: u32,
    pub _pad: u32,
}

/// Indices into [`LinkCounters`].
pub mod counter {
    pub const SEEN: usize = 0;
    pub const DROPPED: usize = 1;
    pub const DUPLICATED: usize = 2;
    pub const DELAYED: usize = 3;
    /// Wire frames in the packets seen: a segmentation-offload (GSO or
    /// GRO) packet counts its segments, any other packet one.
    pub const FRAMES: usize = 4;
    /// Wire frames in the packets dropped.
    pub const FRAMES_DROPPED: usize = 5;
    /// Number of counters.
    pub const COUNT: usize = 6;
}

/// Per-CPU counters of one interface and direction, by [`counter`] index.
pub type LinkCounters = [u64; counter::COUNT];

const _: () = {
    assert!(size_of::<LinkKey>() == 8);
    assert!(size_of::<LinkConfig>() == 24);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]`, `Copy`, no padding (size assertions above), any
    // bit pattern is valid.
    unsafe impl aya::Pod for super::LinkKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LinkConfig {}
}

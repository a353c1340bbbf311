//! The xina wire format and the types shared by everything that speaks it.
//!
//! This crate is the single source of truth for the protocol: the XDP dataplane
//! (`xina-ebpf`), the control plane (`xina`), the worker library (`xina-host`)
//! and the testbed all import their offsets, constants and map layouts from
//! here. It is `no_std` so the eBPF programs can use it; the `user` feature adds
//! `aya::Pod` implementations for the map types.
//!
//! - [`header`]: the xina header carried after UDP on [`XINA_UDP_PORT`].
//! - [`frame`]: where headers and payload sit, and how big a frame may be.
//! - [`net`]: the Ethernet / IPv4 / UDP offsets the dataplane parses.
//! - [`checksum`]: incremental Internet checksum arithmetic (RFC 1624).
//! - [`maps`]: map keys and values crossing the kernel/user boundary.
//! - [`counters`]: the dataplane's counter indices and their names.
//! - [`anycast`]: how the switch picks an anycast group's member for a flow.
//! - [`lossy`]: the testbed's fault-injecting tc program (maps and config).
#![no_std]

pub mod anycast;
pub mod checksum;
pub mod counters;
pub mod frame;
pub mod header;
pub mod lossy;
pub mod maps;
pub mod net;

pub use header::{DType, Error, Flags, Kind, Op, Packet, Repr};

/// The UDP destination port that marks a datagram as xina traffic.
///
/// Workers send contributions to the switch on this port and the switch sends
/// results from it.
pub const XINA_UDP_PORT: u16 = 19_860;

/// The first byte of every xina header (`'X'`).
pub const MAGIC: u8 = 0x58;

/// The header version this crate speaks.
pub const VERSION: u8 = 1;

/// Most ranks a job can have: the width of the rank bitmap.
pub const MAX_RANKS: usize = 64;

/// The IP MTU of the narrow path and of groups: a standard Ethernet
/// payload. Wide jobs take bigger frames (see [`frame`]).
pub const MTU: usize = 1500;

/// Most payload bytes in one packet of the narrow path or of a group: the
/// MTU less the IPv4, UDP and xina headers (1,440 bytes).
pub const MAX_PAYLOAD: usize = MTU - net::IPV4_HLEN - net::UDP_HLEN - header::HEADER_LEN;

/// Most elements one narrow packet carries (`int32`: 360; `int64` carries
/// [`DType::narrow_elems`] = 180), and the capacity of one aggregator slot.
pub const MAX_ELEMS: usize = MAX_PAYLOAD / 4;

/// Most payload bytes in one packet at all (the wide path).
pub use frame::MAX_FRAME_PAYLOAD;

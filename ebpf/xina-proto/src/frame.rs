//! The geometry of an xina frame, defined once for the kernel, the control
//! plane, the host library, the tests and the P4 twin's checks.
//!
//! ```text
//! | Ethernet 14 | IPv4 20 | UDP 8 | xina 32 | payload: count × element size |
//! ^ 0           ^ 14      ^ 34    ^ 42      ^ 74 (PAYLOAD)
//! ```
//!
//! A job's packets carry at most `elems_per_packet` elements, fixed when the
//! job is installed and bounded by two things:
//!
//! - the MTU of every member's switch port: the IP packet is
//!   [`ip_len`] = 60 + payload bytes, and must fit it;
//! - the dataplane path. Up to [`DType::narrow_elems`] (360 `int32`, 180
//!   `int64`: one 1,500-byte frame) a job runs on the *narrow* path, which
//!   holds its partial sums in the slot itself and broadcasts a result
//!   through the devmap. Above that, up to [`DType::max_elems`] (16,128
//!   `int32`, 8,064 `int64`: 64,512 payload bytes) it runs on the *wide*
//!   path, which accumulates in [`BLOCK_ELEMS`]-element blocks of its own
//!   memory (sized by the job's frame, see [`wide_units`]) and hands the
//!   completed result to the tc fan-out program, which clones it to every
//!   member (a devmap broadcast cannot carry a multi-buffer frame).

use crate::{
    DType, MAX_PAYLOAD,
    header::HEADER_LEN,
    net::{ETH_HLEN, IPV4_HLEN, UDP_HLEN, XINA_OFFSET},
};

/// Offset of the payload in a frame (from the Ethernet header).
pub const PAYLOAD: usize = XINA_OFFSET + HEADER_LEN;

/// Bytes an IP packet adds to its payload: IPv4, UDP and xina headers.
pub const IP_OVERHEAD: usize = IPV4_HLEN + UDP_HLEN + HEADER_LEN;

/// Elements one block of the wide path holds: the unit of its loops and of
/// its memory.
pub const BLOCK_ELEMS: usize = 128;

/// Bytes of one wide-path memory unit: [`BLOCK_ELEMS`] 64-bit accumulators
/// (the partial sums of one block, or one block's result in wire order).
pub const UNIT_BYTES: usize = 8 * BLOCK_ELEMS;

/// Most payload bytes of a wide frame: 63 blocks of `int64` (126 of
/// `int32`), so that the IP packet (64,572 bytes) fits a 65,000-byte MTU and
/// IPv4's 16-bit length.
pub const MAX_FRAME_PAYLOAD: usize = 63 * UNIT_BYTES;

/// Most blocks of one wide frame (`int32`).
pub const MAX_BLOCKS: usize = MAX_FRAME_PAYLOAD / (4 * BLOCK_ELEMS);

/// The IP packet length of a frame with `elems` elements of `dtype`.
pub const fn ip_len(dtype: DType, elems: usize) -> usize {
    IP_OVERHEAD + elems * dtype.size()
}

/// The Ethernet frame length of a frame with `elems` elements of `dtype`.
pub const fn frame_len(dtype: DType, elems: usize) -> usize {
    ETH_HLEN + ip_len(dtype, elems)
}

/// Most elements of `dtype` per packet on a port of this IP MTU (0 if not
/// even the headers fit), within [`DType::max_elems`].
pub const fn elems_for_mtu(dtype: DType, mtu: usize) -> usize {
    if mtu < IP_OVERHEAD {
        return 0;
    }
    let fit = (mtu - IP_OVERHEAD) / dtype.size();
    let max = dtype.max_elems();
    if fit < max { fit } else { max }
}

/// Whether a job of `dtype` with `elems` elements per packet runs on the
/// wide path.
pub const fn is_wide(dtype: DType, elems: usize) -> bool {
    elems > dtype.narrow_elems()
}

/// Blocks one chunk of `elems` elements spans on the wide path.
pub const fn blocks(elems: usize) -> usize {
    elems.div_ceil(BLOCK_ELEMS)
}

/// Wide-path memory units a job needs: for each of its `2 × slots` slot
/// copies, one partial of `blocks(elems)` units per CPU that runs the
/// dataplane. Once a chunk is complete, the partial of the CPU that
/// completed it holds its result (the sums, clamped when read out).
pub const fn wide_units(elems: usize, slots: u32, cpus: u32) -> u64 {
    2 * slots as u64 * cpus as u64 * blocks(elems) as u64
}

/// The first unit of `cpu`'s partial of slot copy `copy` (0..2 × slots,
/// `2 × slot + version`) of a job whose units start at `base` and whose
/// chunks span `blocks` blocks, on a dataplane of `cpus` CPUs.
pub const fn unit_of(base: u32, copy: u32, cpu: u32, cpus: u32, blocks: u32) -> u32 {
    base + (copy * cpus + cpu) * blocks
}

const _: () = {
    assert!(PAYLOAD == 74);
    assert!(IP_OVERHEAD + MAX_FRAME_PAYLOAD <= 65_000);
    assert!(MAX_FRAME_PAYLOAD.is_multiple_of(4 * BLOCK_ELEMS));
    assert!(MAX_PAYLOAD == 1500 - IP_OVERHEAD);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_mtu() {
        assert_eq!(elems_for_mtu(DType::I32, 1500), 360);
        assert_eq!(elems_for_mtu(DType::I64, 1500), 180);
        assert_eq!(elems_for_mtu(DType::I32, 9000), 2235);
        assert_eq!(elems_for_mtu(DType::I32, 65_000), 16_128);
        assert_eq!(elems_for_mtu(DType::I64, 65_000), 8_064);
        assert_eq!(elems_for_mtu(DType::I32, 59), 0);
        assert_eq!(ip_len(DType::I32, 16_128), 64_572);
        assert_eq!(frame_len(DType::I32, 360), 1514);
    }

    #[test]
    fn paths_and_memory() {
        assert!(!is_wide(DType::I32, 360));
        assert!(is_wide(DType::I32, 361));
        assert!(is_wide(DType::I64, 181));
        assert_eq!(blocks(1), 1);
        assert_eq!(blocks(128), 1);
        assert_eq!(blocks(129), 2);
        assert_eq!(blocks(16_128), MAX_BLOCKS);
        // 8 slots of 64 KB frames on 2 CPUs: 16 copies × 2 partials × 126.
        assert_eq!(wide_units(16_128, 8, 2), 4_032);
        assert_eq!(unit_of(100, 0, 0, 2, 4), 100);
        assert_eq!(unit_of(100, 0, 1, 2, 4), 104);
        assert_eq!(unit_of(100, 1, 0, 2, 4), 108);
        // The last partial of the last copy ends where the job's units do.
        assert_eq!(
            u64::from(unit_of(0, 15, 1, 2, 126)) + 126,
            wide_units(16_128, 8, 2)
        );
    }
}

//! Internet checksum arithmetic: full computation (RFC 1071) and incremental
//! update (RFC 1624), shared by the dataplane and the tests that check it.
//!
//! Values are the numbers the bytes spell in network order (a 32-bit field
//! `[0x0a, 0x00, 0x00, 0x01]` is `0x0a00_0001`). A field replaced by the
//! dataplane is recorded with [`replace16`] / [`replace32`] into a `u64`
//! accumulator, and [`apply`] folds the accumulator into the old checksum:
//! `HC' = ~(~HC + ~m + m')`.

/// Adds the replacement of 16-bit `old` by `new` to `acc`.
#[inline(always)]
pub const fn replace16(acc: u64, old: u16, new: u16) -> u64 {
    acc + (!old) as u64 + new as u64
}

/// Adds the replacement of 32-bit `old` by `new` (both 16-bit aligned) to `acc`.
#[inline(always)]
pub const fn replace32(acc: u64, old: u32, new: u32) -> u64 {
    acc + (!old) as u64 + new as u64
}

/// Folds a `u64` ones'-complement accumulator to 16 bits (not complemented).
#[inline(always)]
pub const fn fold(mut acc: u64) -> u16 {
    // Four rounds always suffice for a 64-bit accumulator; a fixed count keeps
    // the eBPF verifier happy.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// The checksum field after the replacements recorded in `acc`.
#[inline(always)]
pub const fn apply(csum: u16, acc: u64) -> u16 {
    !fold((!csum) as u64 + acc)
}

/// Like [`apply`] for a UDP checksum: 0 means "no checksum" on the wire, so a
/// field without a checksum stays 0 and a computed 0 is sent as `0xffff`.
#[inline(always)]
pub const fn apply_udp(csum: u16, acc: u64) -> u16 {
    if csum == 0 {
        return 0;
    }
    match apply(csum, acc) {
        0 => 0xffff,
        c => c,
    }
}

/// Ones'-complement sum of `bytes` as big-endian 16-bit words (an odd last
/// byte is padded with zero), added to `acc`.
pub fn sum(mut acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// The IPv4 header checksum of `header` (whose checksum field must be zero,
/// or the result is 0 when it is already correct).
pub fn ipv4(header: &[u8]) -> u16 {
    !fold(sum(0, header))
}

/// The UDP checksum over the IPv4 pseudo-header and `udp` (header with a zero
/// checksum field, and payload). Returns `0xffff` for a computed 0.
pub fn udp_ipv4(src: [u8; 4], dst: [u8; 4], udp: &[u8]) -> u16 {
    let mut acc = sum(0, &src);
    acc = sum(acc, &dst);
    acc += u64::from(crate::net::IPPROTO_UDP);
    acc += udp.len() as u64;
    acc = sum(acc, udp);
    match !fold(acc) {
        0 => 0xffff,
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ipv4_header_example() {
        // A header from RFC 1071-style worked examples: checksum 0xb861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4(&h), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(ipv4(&h), 0);
    }

    proptest! {
        /// Replacing 32-bit words and updating incrementally gives the same
        /// checksum as recomputing it.
        #[test]
        fn incremental_matches_full(
            mut data in proptest::collection::vec(any::<u8>(), 4..64),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u32>()), 1..8),
        ) {
            let len = data.len() & !1;
            data.truncate(len);
            let before = !fold(sum(0, &data));
            let mut acc = 0;
            for (at, new) in edits {
                let at = at.index(len / 2 - 1) * 2;
                if at + 4 > len { continue; }
                let old = u32::from_be_bytes(data[at..at + 4].try_into().unwrap());
                data[at..at + 4].copy_from_slice(&new.to_be_bytes());
                acc = replace32(acc, old, new);
            }
            let full = !fold(sum(0, &data));
            let inc = apply(before, acc);
            // 0x0000 and 0xffff are the same number in ones' complement.
            prop_assert!(inc == full || (inc ^ full) == 0xffff, "inc {inc:#x} full {full:#x}");
        }
    }
}

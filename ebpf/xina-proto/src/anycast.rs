//! Anycast member selection: rendezvous (highest random weight) hashing.
//!
//! Every member that is up gets a weight `mix(flow, rank)`; the flow goes to
//! the member with the highest weight. A flow therefore sticks to its member
//! while the set of members that are up stays the same, and when a member goes
//! down only its own flows move (each to its second-highest member); the
//! others keep theirs. The switch and the tests share this code, so a test
//! can predict where a flow lands.
//!
//! The flow key is the sender's IPv4 address and UDP source port (network
//! order, as in the packet) and the 32-bit flow label the sender puts in the
//! header's slot field.

/// The 64-bit flow key of a packet.
#[inline(always)]
pub const fn flow_key(src_ip: [u8; 4], src_port: [u8; 2], label: u32) -> u64 {
    let ip = u32::from_be_bytes(src_ip) as u64;
    let port = u16::from_be_bytes(src_port) as u64;
    (ip << 32 | port << 16) ^ mix(label as u64)
}

/// A 64-bit finaliser (the one of SplitMix64): every input bit affects every
/// output bit, so nearby keys get unrelated weights.
#[inline(always)]
pub const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rank among the bits of `up` that a flow goes to, or `None` when no
/// bit is set.
#[inline(always)]
pub fn pick(key: u64, up: u64) -> Option<u8> {
    let mut best: Option<(u64, u8)> = None;
    let mut rank = 0u8;
    while rank < 64 {
        if up & (1u64 << rank) != 0 {
            let w = mix(key ^ mix(u64::from(rank) + 1));
            best = match best {
                Some((top, _)) if top >= w => best,
                _ => Some((w, rank)),
            };
        }
        rank += 1;
    }
    best.map(|(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(up: u64, flows: u32) -> [u32; 64] {
        let mut hits = [0u32; 64];
        for label in 0..flows {
            let key = flow_key([10, 0, 0, 1], [0x4d, 0x94], label);
            hits[usize::from(pick(key, up).unwrap())] += 1;
        }
        hits
    }

    #[test]
    fn no_member_up_picks_none() {
        assert_eq!(pick(42, 0), None);
    }

    #[test]
    fn flows_spread_evenly_and_only_over_members_that_are_up() {
        let up = 0b1011_0100;
        let hits = spread(up, 10_000);
        for (rank, &n) in hits.iter().enumerate() {
            if up & (1 << rank) == 0 {
                assert_eq!(n, 0, "rank {rank} is down");
            } else {
                assert!((2_250..=2_750).contains(&n), "rank {rank}: {n} of 10000");
            }
        }
    }

    #[test]
    fn a_member_going_down_moves_only_its_own_flows() {
        for label in 0..2_000 {
            let key = flow_key([10, 0, 0, 9], [0x12, 0x34], label);
            let before = pick(key, 0b1111).unwrap();
            let after = pick(key, 0b1011).unwrap();
            if before == 2 {
                assert_ne!(after, 2);
            } else {
                assert_eq!(before, after, "flow {label} moved");
            }
        }
    }
}

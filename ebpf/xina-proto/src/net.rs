//! Offsets and constants of the headers below xina: Ethernet II, IPv4, UDP.
//!
//! The dataplane parses only untagged Ethernet II frames carrying IPv4; the
//! offsets here are relative to the start of each header.

/// Ethernet II header length.
pub const ETH_HLEN: usize = 14;
/// Offset of the destination MAC in the Ethernet header.
pub const ETH_DST: usize = 0;
/// Offset of the source MAC in the Ethernet header.
pub const ETH_SRC: usize = 6;
/// Offset of the `EtherType` in the Ethernet header.
pub const ETH_TYPE: usize = 12;
/// `EtherType` of IPv4.
pub const ETH_P_IPV4: u16 = 0x0800;

/// Length of an IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// Offset of the version / IHL byte.
pub const IPV4_VIHL: usize = 0;
/// Offset of the total length field.
pub const IPV4_TOTAL_LEN: usize = 2;
/// Offset of the flags / fragment offset field.
pub const IPV4_FRAG: usize = 6;
/// Offset of the TTL byte.
pub const IPV4_TTL: usize = 8;
/// Offset of the protocol byte.
pub const IPV4_PROTO: usize = 9;
/// Offset of the header checksum.
pub const IPV4_CSUM: usize = 10;
/// Offset of the source address.
pub const IPV4_SRC: usize = 12;
/// Offset of the destination address.
pub const IPV4_DST: usize = 16;
/// Mask of the "more fragments" bit and the fragment offset: non-zero means a fragment.
pub const IPV4_FRAG_MASK: u16 = 0x3fff;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// UDP header length.
pub const UDP_HLEN: usize = 8;
/// Offset of the source port.
pub const UDP_SPORT: usize = 0;
/// Offset of the destination port.
pub const UDP_DPORT: usize = 2;
/// Offset of the length field.
pub const UDP_LEN: usize = 4;
/// Offset of the checksum.
pub const UDP_CSUM: usize = 6;

/// Offset of the xina header in a frame whose IPv4 header has no options.
pub const XINA_OFFSET: usize = ETH_HLEN + IPV4_HLEN + UDP_HLEN;

//! Building and reading whole xina frames (Ethernet / IPv4 / UDP / xina), for
//! dataplane test runs and test vectors.

use std::net::Ipv4Addr;

use xina_proto::{
    DType, Packet, Repr, checksum,
    header::HEADER_LEN,
    net::{
        ETH_DST, ETH_HLEN, ETH_P_IPV4, ETH_SRC, ETH_TYPE, IPPROTO_UDP, IPV4_CSUM, IPV4_DST,
        IPV4_HLEN, IPV4_SRC, IPV4_TOTAL_LEN, UDP_CSUM, UDP_DPORT, UDP_HLEN, UDP_LEN, UDP_SPORT,
        XINA_OFFSET,
    },
};

/// One endpoint of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// Builds a frame from `src` to `dst` carrying `repr` and `payload` (raw
/// payload bytes, big-endian elements), with correct IPv4 and UDP checksums.
///
/// # Panics
/// If the datagram would exceed 65,535 bytes.
pub fn build(src: Endpoint, dst: Endpoint, repr: &Repr, payload: &[u8]) -> Vec<u8> {
    let xina_len = HEADER_LEN + payload.len();
    let udp_len = UDP_HLEN + xina_len;
    let ip_len = IPV4_HLEN + udp_len;
    let mut f = vec![0u8; ETH_HLEN + ip_len];
    f[ETH_DST..ETH_DST + 6].copy_from_slice(&dst.mac);
    f[ETH_SRC..ETH_SRC + 6].copy_from_slice(&src.mac);
    f[ETH_TYPE..ETH_TYPE + 2].copy_from_slice(&ETH_P_IPV4.to_be_bytes());

    let ip = &mut f[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(
        &u16::try_from(ip_len)
            .expect("datagram too large")
            .to_be_bytes(),
    );
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    ip[IPV4_SRC..IPV4_SRC + 4].copy_from_slice(&src.ip.octets());
    ip[IPV4_DST..IPV4_DST + 4].copy_from_slice(&dst.ip.octets());
    let csum = checksum::ipv4(ip);
    ip[IPV4_CSUM..IPV4_CSUM + 2].copy_from_slice(&csum.to_be_bytes());

    let udp = &mut f[ETH_HLEN + IPV4_HLEN..];
    udp[UDP_SPORT..UDP_SPORT + 2].copy_from_slice(&src.port.to_be_bytes());
    udp[UDP_DPORT..UDP_DPORT + 2].copy_from_slice(&dst.port.to_be_bytes());
    udp[UDP_LEN..UDP_LEN + 2]
        .copy_from_slice(&u16::try_from(udp_len).expect("checked").to_be_bytes());
    repr.emit(&mut Packet::new_unchecked(
        &mut udp[UDP_HLEN..UDP_HLEN + HEADER_LEN],
    ));
    udp[UDP_HLEN + HEADER_LEN..].copy_from_slice(payload);
    let csum = checksum::udp_ipv4(src.ip.octets(), dst.ip.octets(), udp);
    udp[UDP_CSUM..UDP_CSUM + 2].copy_from_slice(&csum.to_be_bytes());
    f
}

/// A frame from `member` to the switch's address `switch_ip`, as it arrives
/// on the member's switch port: the member's MAC, address and UDP port to the
/// port's MAC and the xina UDP port.
pub fn from_member(
    member: &crate::MemberSpec,
    switch_ip: Ipv4Addr,
    repr: &Repr,
    payload: &[u8],
) -> Vec<u8> {
    build(
        Endpoint {
            mac: member.mac,
            ip: member.ip,
            port: member.udp_port,
        },
        Endpoint {
            mac: member.port_mac,
            ip: switch_ip,
            port: xina_proto::XINA_UDP_PORT,
        },
        repr,
        payload,
    )
}

/// Big-endian bytes of `values`.
pub fn i32_payload(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// Big-endian bytes of `values`, for an `I64` payload.
pub fn i64_payload(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// A frame taken apart again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub src: Endpoint,
    pub dst: Endpoint,
    pub repr: Repr,
    /// The elements of an `I32` payload (empty for other element types).
    pub values: Vec<i32>,
    /// Every element of the payload, whatever its type, widened to `i64`.
    pub elems: Vec<i64>,
    /// The UDP checksum field as sent (0: none).
    pub udp_checksum: u16,
    /// Whether the IPv4 total length covers exactly the rest of the frame and
    /// the UDP length exactly the rest of the datagram.
    pub lengths_ok: bool,
    /// Whether the IPv4 header checksum verifies.
    pub ip_checksum_ok: bool,
    /// Whether the UDP checksum verifies (or is absent).
    pub udp_checksum_ok: bool,
}

/// Parses a frame built like [`build`]'s (IPv4 without options, `I32` or
/// `I64` payload). Returns `None` if it is not one.
pub fn parse(f: &[u8]) -> Option<Parsed> {
    let ip = f.get(ETH_HLEN..ETH_HLEN + IPV4_HLEN)?;
    if f.get(ETH_TYPE..ETH_TYPE + 2)? != ETH_P_IPV4.to_be_bytes() || ip[0] != 0x45 {
        return None;
    }
    let udp = f.get(ETH_HLEN + IPV4_HLEN..)?;
    let packet = Packet::new_checked(udp.get(UDP_HLEN..)?).ok()?;
    let repr = Repr::parse(&packet).ok()?;
    let count = usize::from(repr.count);
    let elems: Vec<i64> = match repr.dtype {
        DType::I32 => (0..count).map(|i| i64::from(packet.i32_at(i))).collect(),
        DType::I64 => (0..count).map(|i| packet.i64_at(i)).collect(),
        DType::Bytes => packet.payload().iter().map(|&b| i64::from(b)).collect(),
    };
    let values = match repr.dtype {
        DType::I32 => (0..count).map(|i| packet.i32_at(i)).collect(),
        DType::I64 | DType::Bytes => Vec::new(),
    };
    let be16 = |b: &[u8], at: usize| usize::from(u16::from_be_bytes([b[at], b[at + 1]]));
    let lengths_ok =
        be16(ip, IPV4_TOTAL_LEN) == f.len() - ETH_HLEN && be16(udp, UDP_LEN) == udp.len();
    let mac = |at: usize| <[u8; 6]>::try_from(&f[at..at + 6]).expect("6 bytes");
    let ip4 = |at: usize| Ipv4Addr::from(<[u8; 4]>::try_from(&ip[at..at + 4]).expect("4 bytes"));
    let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
    let stored = port(UDP_CSUM);
    let udp_checksum_ok = stored == 0 || {
        let mut zeroed = udp.to_vec();
        zeroed[UDP_CSUM..UDP_CSUM + 2].fill(0);
        checksum::udp_ipv4(
            ip[IPV4_SRC..IPV4_SRC + 4].try_into().ok()?,
            ip[IPV4_DST..IPV4_DST + 4].try_into().ok()?,
            &zeroed,
        ) == stored
    };
    Some(Parsed {
        src: Endpoint {
            mac: mac(ETH_SRC),
            ip: ip4(IPV4_SRC),
            port: port(UDP_SPORT),
        },
        dst: Endpoint {
            mac: mac(ETH_DST),
            ip: ip4(IPV4_DST),
            port: port(UDP_DPORT),
        },
        repr,
        values,
        elems,
        udp_checksum: stored,
        lengths_ok,
        ip_checksum_ok: checksum::ipv4(ip) == 0,
        udp_checksum_ok,
    })
}

/// Offset of the xina header in frames built by [`build`].
pub const XINA: usize = XINA_OFFSET;

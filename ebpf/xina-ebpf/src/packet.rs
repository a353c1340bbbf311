//! Bounds-checked access to the frame, and the Ethernet / IPv4 / UDP / xina
//! parse shared by the ingress and egress programs.

use aya_ebpf::programs::XdpContext;
use xina_proto::{
    MAGIC, MAX_FRAME_PAYLOAD, VERSION, XINA_UDP_PORT,
    header::{HEADER_LEN, field},
    net::{
        ETH_HLEN, ETH_P_IPV4, ETH_TYPE, IPPROTO_UDP, IPV4_FRAG, IPV4_FRAG_MASK, IPV4_HLEN,
        IPV4_PROTO, IPV4_VIHL, UDP_DPORT, UDP_SPORT, XINA_OFFSET,
    },
};

use crate::error::{Error, Verdict};

/// Offset of the IPv4 header.
pub const IP: usize = ETH_HLEN;
/// Offset of the UDP header of an xina frame (IPv4 without options).
pub const UDP: usize = ETH_HLEN + IPV4_HLEN;
/// Offset of the xina header.
pub const XINA: usize = XINA_OFFSET;
/// Offset of the payload.
pub const PAYLOAD: usize = XINA_OFFSET + HEADER_LEN;

/// `end`, the end of an xina payload computed from a header's count,
/// checked to lie within the largest frame, as a value the verifier knows
/// to be bounded. Older verifiers (6.1) refuse pointer arithmetic with an
/// offset whose bounds they cannot see, and do not carry a bound learnt
/// from a comparison over to a copy the compiler spilled before it; so the
/// value is also masked to 16 bits, which bounds the very register that is
/// used. The mask is hidden from the compiler (which knows the comparison
/// makes it a no-op and would drop it).
#[inline(always)]
pub fn payload_end(end: usize) -> Result<usize, Error> {
    if end > PAYLOAD + MAX_FRAME_PAYLOAD {
        return Err(Error::BadShape);
    }
    Ok(end & crate::slot::opaque(0xffff) as usize)
}

/// `len`, which the caller has checked to be at least 1, as the length
/// argument of `bpf_xdp_load_bytes` / `bpf_xdp_store_bytes`: 6.1's helpers
/// take no length the verifier cannot prove to be non-zero, and a check the
/// compiler made on a copy it spilled does not count. Recomputed so that the
/// register passed carries the bounds `1..=MASK + 1` (`MASK + 1` a power of
/// two at least the largest `len`); the buffer must have room for `MASK + 1`
/// bytes in its map value.
#[inline(always)]
pub fn helper_len<const MASK: usize>(len: usize) -> u32 {
    ((len.wrapping_sub(1) & crate::slot::opaque(MASK as i64) as usize) + 1) as u32
}

/// A pointer to `N` bytes at `offset`, after checking they lie in the frame.
#[inline(always)]
pub fn bytes<const N: usize>(ctx: &XdpContext, offset: usize) -> Result<*mut [u8; N], Error> {
    let start = ctx.data();
    if start + offset + N > ctx.data_end() {
        return Err(Error::Truncated);
    }
    Ok((start + offset) as *mut [u8; N])
}

#[inline(always)]
pub fn u8_at(ctx: &XdpContext, offset: usize) -> Result<u8, Error> {
    // SAFETY: `bytes` checked that the byte lies inside the frame.
    Ok(unsafe { *bytes::<1>(ctx, offset)? }[0])
}

#[inline(always)]
pub fn be16_at(ctx: &XdpContext, offset: usize) -> Result<u16, Error> {
    // SAFETY: `bytes` checked that both bytes lie inside the frame.
    Ok(u16::from_be_bytes(unsafe { *bytes::<2>(ctx, offset)? }))
}

#[inline(always)]
pub fn be32_at(ctx: &XdpContext, offset: usize) -> Result<u32, Error> {
    // SAFETY: `bytes` checked that the four bytes lie inside the frame.
    Ok(u32::from_be_bytes(unsafe { *bytes::<4>(ctx, offset)? }))
}

#[inline(always)]
pub fn set_be16(ctx: &XdpContext, offset: usize, v: u16) -> Result<(), Error> {
    // SAFETY: `bytes` checked that both bytes lie inside the frame.
    unsafe { *bytes::<2>(ctx, offset)? = v.to_be_bytes() };
    Ok(())
}

#[inline(always)]
pub fn set_be32(ctx: &XdpContext, offset: usize, v: u32) -> Result<(), Error> {
    // SAFETY: `bytes` checked that the four bytes lie inside the frame.
    unsafe { *bytes::<4>(ctx, offset)? = v.to_be_bytes() };
    Ok(())
}

/// Copies `N` bytes from `offset` in the frame.
#[inline(always)]
pub fn get<const N: usize>(ctx: &XdpContext, offset: usize) -> Result<[u8; N], Error> {
    // SAFETY: `bytes` checked that the range lies inside the frame.
    Ok(unsafe { *bytes::<N>(ctx, offset)? })
}

/// Writes `N` bytes at `offset` in the frame.
#[inline(always)]
pub fn put<const N: usize>(ctx: &XdpContext, offset: usize, v: [u8; N]) -> Result<(), Error> {
    // SAFETY: `bytes` checked that the range lies inside the frame.
    unsafe { *bytes::<N>(ctx, offset)? = v };
    Ok(())
}

/// Which UDP port marks a frame as xina traffic.
#[derive(Clone, Copy)]
pub enum Direction {
    /// Towards the switch: the destination port is [`XINA_UDP_PORT`].
    ToSwitch,
    /// Leaving the switch (egress): either port is [`XINA_UDP_PORT`]. An
    /// anycast copy keeps its sender's source port and still has the
    /// switch's port as its destination until the egress program addresses
    /// it; everything else the switch sends comes from its port.
    Egress,
}

/// Finds the xina header: `Ok(())` when the frame is an xina datagram whose
/// header is present with the right magic and version, `Err(Verdict::pass())`
/// for anything that is not xina traffic, and a drop verdict for xina
/// traffic that cannot be handled (fragments, IP options, bad header).
#[inline(always)]
pub fn parse(ctx: &XdpContext, direction: Direction) -> Result<(), Verdict> {
    if be16_at(ctx, ETH_TYPE).map_err(|_| Verdict::pass())? != ETH_P_IPV4 {
        return Err(Verdict::pass());
    }
    let vihl = u8_at(ctx, IP + IPV4_VIHL).map_err(|_| Verdict::pass())?;
    if vihl >> 4 != 4 || vihl & 0x0f < 5 {
        return Err(Verdict::pass());
    }
    if u8_at(ctx, IP + IPV4_PROTO).map_err(|_| Verdict::pass())? != IPPROTO_UDP {
        return Err(Verdict::pass());
    }
    let frag = be16_at(ctx, IP + IPV4_FRAG).map_err(|_| Verdict::pass())?;
    // A non-first fragment has no UDP header: it cannot be recognised.
    if frag & 0x1fff != 0 {
        return Err(Verdict::pass());
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    let port = |field: usize| {
        be16_at(ctx, IP + ihl + field)
            .map(|p| p == XINA_UDP_PORT)
            .map_err(|_| Verdict::pass())
    };
    let xina = match direction {
        Direction::ToSwitch => port(UDP_DPORT)?,
        Direction::Egress => port(UDP_SPORT)? || port(UDP_DPORT)?,
    };
    if !xina {
        return Err(Verdict::pass());
    }
    // From here on the datagram is addressed to xina.
    if frag & IPV4_FRAG_MASK != 0 {
        return Err(Error::Fragment.into());
    }
    if ihl != IPV4_HLEN {
        return Err(Error::BadHeader.into());
    }
    let magic = u8_at(ctx, XINA + field::MAGIC)?;
    let version = u8_at(ctx, XINA + field::VERSION)?;
    // The whole header must be present before any field is trusted.
    bytes::<HEADER_LEN>(ctx, XINA)?;
    if magic != MAGIC || version != VERSION {
        return Err(Error::BadHeader.into());
    }
    Ok(())
}

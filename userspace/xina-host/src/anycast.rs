//! Anycast: datagrams to a group that the switch hands to one member each,
//! chosen by the flow (see `xina_proto::anycast`). No reliability: an
//! anycast datagram is a plain UDP datagram with a xina header, and the
//! member that gets it answers the sender directly (the switch keeps the
//! sender's address as the source).

use std::io;
use std::net::{SocketAddrV4, UdpSocket};

use xina_proto::header::{HEADER_LEN, SLOT_VERSION_BIT};
use xina_proto::{DType, Flags, Kind, MAX_PAYLOAD, Op, Packet, Repr};

/// The header of an anycast datagram from `rank` of `group`, flow `flow`.
const fn header(group: u32, rank: u8, fan_in: u8, flow: u32, len: u16) -> Repr {
    Repr {
        kind: Kind::McastData,
        flags: Flags(0),
        job: group,
        rank,
        fan_in,
        op: Op::Sum,
        dtype: DType::Bytes,
        seq: 0,
        // The flow label rides in the slot field, all 32 bits of it.
        slot: flow & !SLOT_VERSION_BIT,
        slot_version: flow & SLOT_VERSION_BIT != 0,
        count: len,
        exponent: 0,
        root: rank,
        bitmap: 0,
    }
}

/// A group member that sends anycast datagrams through the switch.
#[derive(Debug)]
pub struct AnycastSender {
    socket: UdpSocket,
    group: u32,
    rank: u8,
    fan_in: u8,
    switch: SocketAddrV4,
    buf: Vec<u8>,
}

impl AnycastSender {
    /// Binds `bind` (the address the switch knows this sender by).
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn new(
        group: u32,
        rank: u8,
        fan_in: u8,
        bind: SocketAddrV4,
        switch: SocketAddrV4,
    ) -> io::Result<Self> {
        Ok(Self {
            socket: UdpSocket::bind(bind)?,
            group,
            rank,
            fan_in,
            switch,
            buf: vec![0; HEADER_LEN + MAX_PAYLOAD],
        })
    }

    /// Sends `payload` (at most 1,440 bytes) on flow `flow`: every datagram
    /// of one flow goes to the same member while the members that are up
    /// stay the same.
    ///
    /// # Errors
    /// An oversized payload, or the socket's error.
    pub fn send(&mut self, flow: u32, payload: &[u8]) -> io::Result<()> {
        let len = u16::try_from(payload.len())
            .ok()
            .filter(|&l| usize::from(l) <= MAX_PAYLOAD)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} bytes do not fit one packet ({MAX_PAYLOAD})",
                        payload.len()
                    ),
                )
            })?;
        let repr = header(self.group, self.rank, self.fan_in, flow, len);
        let total = repr.buffer_len();
        let mut packet = Packet::new_unchecked(&mut self.buf[..total]);
        repr.emit(&mut packet);
        packet.payload_mut().copy_from_slice(payload);
        self.socket.send_to(&self.buf[..total], self.switch)?;
        Ok(())
    }

    /// The socket, to read what members answer.
    pub const fn socket(&self) -> &UdpSocket {
        &self.socket
    }
}

/// An anycast datagram as a member receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received<'a> {
    pub group: u32,
    /// The sender's rank.
    pub sender: u8,
    /// The sender's flow label.
    pub flow: u32,
    pub payload: &'a [u8],
}

/// Parses a datagram a member received; `None` if it is not anycast data.
pub fn parse(datagram: &[u8]) -> Option<Received<'_>> {
    let packet = Packet::new_checked(datagram).ok()?;
    let repr = Repr::parse(&packet).ok()?;
    if repr.kind != Kind::McastData || repr.dtype != DType::Bytes {
        return None;
    }
    let flow = repr.slot
        | if repr.slot_version {
            SLOT_VERSION_BIT
        } else {
            0
        };
    Some(Received {
        group: repr.job,
        sender: repr.rank,
        flow,
        payload: &datagram[HEADER_LEN..repr.buffer_len()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_round_trips_with_all_32_bits_of_its_flow() {
        let repr = header(9, 3, 5, 0x8000_0001, 4);
        let mut buf = vec![0; repr.buffer_len()];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut packet);
        packet.payload_mut().copy_from_slice(b"ping");
        let got = parse(&buf).unwrap();
        assert_eq!(
            got,
            Received {
                group: 9,
                sender: 3,
                flow: 0x8000_0001,
                payload: b"ping",
            }
        );
        buf[2] = Kind::AggData as u8;
        assert_eq!(parse(&buf), None);
    }
}

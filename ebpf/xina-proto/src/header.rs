//! The xina header, carried right after the UDP header.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +---------------+---------------+---------------+---------------+
//! |     magic     |    version    |     kind      |     flags     |  0
//! +---------------+---------------+---------------+---------------+
//! |                            job id                             |  4
//! +---------------+---------------+---------------+---------------+
//! |     rank      |    fan-in     |      op       |     dtype     |  8
//! +---------------+---------------+---------------+---------------+
//! |                        sequence number                        | 12
//! +---------------+---------------+---------------+---------------+
//! |V|                         slot index                          | 16
//! +---------------+---------------+---------------+---------------+
//! |         element count         |   exponent    |     root      | 20
//! +---------------+---------------+---------------+---------------+
//! |                                                               | 24
//! +                     rank bitmap (64 bits)                     +
//! |                                                               | 28
//! +---------------+---------------+---------------+---------------+
//! |         payload: `count` elements of `dtype`, big-endian  ...   32
//! ```
//!
//! All multi-byte fields are big-endian (network order), the payload too.
//!
//! - `kind`: what the packet is ([`Kind`]).
//! - `flags`: [`Flags`] bits (retransmission, overflow, result from cache).
//! - `job id`: the tenant; the switch only touches the slots of this job.
//! - `rank`: the sender's rank within the job (0-based, below `fan-in`).
//! - `fan-in`: how many ranks contribute to each chunk.
//! - `op`, `dtype`: how elements are combined ([`Op`]) and their type ([`DType`]).
//! - `sequence number`: the chunk this packet belongs to.
//! - `V` + `slot index`: the aggregator slot (relative to the job's slot range)
//!   and which of its two copies (the version, or shadow, bit) holds the chunk.
//! - `element count`: number of payload elements.
//! - `exponent`: the power-of-two scale of fixed-point floats (signed).
//! - `root`: the rank that receives this chunk's result in the reduce and
//!   reduce-scatter delivery modes (every rank of a chunk must name the same
//!   root); ignored for allreduce.
//! - `rank bitmap`: in a result, the ranks that contributed.
//!
//! Multicast groups reuse the layout (`job id` is the group id, `dtype` is
//! [`DType::Bytes`] and `count` the payload length in bytes, `op` is 0):
//!
//! - data ([`Kind::McastData`]) from the sender: `rank` = `root` = the
//!   sender, `seq` and `V + slot` name the chunk and its acknowledgement slot
//!   (within the sender's window); `bitmap` is ignored. On the copies the
//!   switch sends, `bitmap` holds the receivers this copy is for.
//! - acknowledgements ([`Kind::McastAck`], no payload) from a receiver:
//!   `rank` = the receiver, `root`, `seq` and `V + slot` copied from the data.
//!   From the switch: `bitmap` = the receivers that acknowledged, or with
//!   [`Flags::MISSING`] the ones that have not.
//! - anycast data: `V + slot` carries the sender's flow label instead of a
//!   slot; the switch hashes it with the source address and port.

use core::fmt;

use crate::{MAGIC, MAX_PAYLOAD, VERSION, frame::MAX_FRAME_PAYLOAD};

/// Byte ranges and offsets of the header fields, relative to the header start.
pub mod field {
    /// A byte range within the header.
    pub type Field = core::ops::Range<usize>;

    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const KIND: usize = 2;
    pub const FLAGS: usize = 3;
    pub const JOB: Field = 4..8;
    pub const RANK: usize = 8;
    pub const FAN_IN: usize = 9;
    pub const OP: usize = 10;
    pub const DTYPE: usize = 11;
    pub const SEQ: Field = 12..16;
    pub const SLOT: Field = 16..20;
    pub const COUNT: Field = 20..22;
    pub const EXPONENT: usize = 22;
    pub const ROOT: usize = 23;
    pub const BITMAP: Field = 24..32;
    /// Where the payload starts.
    pub const PAYLOAD: usize = 32;
}

/// Length of the xina header in bytes.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// The bit of the slot field that selects the slot's copy (the shadow bit).
pub const SLOT_VERSION_BIT: u32 = 1 << 31;

/// What a packet is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A worker's contribution to a chunk.
    AggData = 1,
    /// The switch's aggregated result of a chunk.
    AggResult = 2,
    /// A group sender's chunk, for the group's other members (multicast) or
    /// for one of them (anycast). The payload is bytes ([`DType::Bytes`]).
    McastData = 3,
    /// A receiver's acknowledgement of a multicast chunk, and the switch's
    /// aggregated acknowledgement, completion or missing-receiver report.
    McastAck = 4,
    /// Control messages (reserved).
    Control = 5,
}

impl Kind {
    /// The kind with this wire value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::AggData,
            2 => Self::AggResult,
            3 => Self::McastData,
            4 => Self::McastAck,
            5 => Self::Control,
            _ => return None,
        })
    }
}

/// How the elements of a chunk are combined.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum = 0,
    Max = 1,
    Min = 2,
}

impl Op {
    /// The operation with this wire value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Sum,
            1 => Self::Max,
            2 => Self::Min,
            _ => return None,
        })
    }
}

/// The type of the payload elements.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit two's complement integers (also fixed-point floats).
    I32 = 0,
    /// 64-bit two's complement integers.
    I64 = 1,
    /// Opaque bytes: the payload of multicast and anycast data, never
    /// combined (`count` is the payload length in bytes).
    Bytes = 2,
}

impl DType {
    /// The element type with this wire value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::I32,
            1 => Self::I64,
            2 => Self::Bytes,
            _ => return None,
        })
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            Self::I32 => 4,
            Self::I64 => 8,
            Self::Bytes => 1,
        }
    }

    /// Most elements of this type in one packet: [`MAX_FRAME_PAYLOAD`]
    /// bytes of `int32` or `int64` (the wide path, see [`crate::frame`]);
    /// [`MAX_PAYLOAD`] bytes of group data.
    pub const fn max_elems(self) -> usize {
        match self {
            Self::I32 | Self::I64 => MAX_FRAME_PAYLOAD / self.size(),
            Self::Bytes => MAX_PAYLOAD,
        }
    }

    /// Most elements of this type the narrow path takes: one 1,500-byte
    /// frame ([`MAX_PAYLOAD`] bytes: 360 `int32`, 180 `int64`).
    pub const fn narrow_elems(self) -> usize {
        MAX_PAYLOAD / self.size()
    }
}

/// Bits of the `flags` byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// The sender has sent this contribution before.
    pub const RETRANSMIT: u8 = 0x01;
    /// An integer sum saturated in this result.
    pub const OVERFLOW: u8 = 0x02;
    /// The switch answered from the slot's stored result (a retransmission
    /// whose result had already been sent).
    pub const FROM_CACHE: u8 = 0x04;
    /// A completion notice: the chunk is complete but its result went to the
    /// chunk's root (reduce, reduce-scatter), so no payload follows and the
    /// element count is 0.
    pub const NOTICE: u8 = 0x08;
    /// Multicast: on data the switch sends to receivers, this copy is a
    /// selective retransmission (`bitmap` = the receivers it goes to); on an
    /// acknowledgement from the switch, a missing-receiver report (`bitmap`
    /// = the receivers that have not acknowledged the chunk).
    pub const MISSING: u8 = 0x10;
    /// Multicast: set by the sender on the last window of chunks of a call.
    /// The switch sends the completion of such a chunk to every member, not
    /// only to the sender, so receivers learn that their acknowledgements
    /// arrived before they return.
    pub const SYNC: u8 = 0x20;

    /// Whether every bit of `bits` is set.
    pub const fn contains(self, bits: u8) -> bool {
        self.0 & bits == bits
    }
}

/// Why a buffer is not a valid xina packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header plus the payload it announces.
    Truncated { needed: usize, got: usize },
    /// The first byte is not [`MAGIC`].
    BadMagic(u8),
    /// The version is not [`VERSION`].
    BadVersion(u8),
    /// The kind byte names no [`Kind`].
    UnknownKind(u8),
    /// The op byte names no [`Op`].
    UnknownOp(u8),
    /// The dtype byte names no [`DType`].
    UnknownDType(u8),
    /// The payload would exceed [`DType::max_elems`].
    TooManyElements(u16),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { needed, got } => {
                write!(f, "truncated xina packet: need {needed} bytes, got {got}")
            }
            Self::BadMagic(m) => write!(f, "bad xina magic {m:#04x} (expected {MAGIC:#04x})"),
            Self::BadVersion(v) => write!(f, "unsupported xina version {v} (expected {VERSION})"),
            Self::UnknownKind(k) => write!(f, "unknown xina packet kind {k}"),
            Self::UnknownOp(o) => write!(f, "unknown xina op {o}"),
            Self::UnknownDType(d) => write!(f, "unknown xina element type {d}"),
            Self::TooManyElements(n) => {
                write!(
                    f,
                    "{n} elements do not fit one packet ({MAX_FRAME_PAYLOAD} payload bytes, {MAX_PAYLOAD} for group data)"
                )
            }
        }
    }
}

impl core::error::Error for Error {}

/// A read/write view of a xina header and its payload, in place.
///
/// Accessors never panic on a packet built with [`Packet::new_checked`]; with
/// [`Packet::new_unchecked`] they panic if the buffer is shorter than the
/// field they touch.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

macro_rules! be_get {
    ($ty:ty, $data:expr, $range:expr) => {{
        let mut raw = [0u8; core::mem::size_of::<$ty>()];
        raw.copy_from_slice(&$data[$range]);
        <$ty>::from_be_bytes(raw)
    }};
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer, checking that it holds the header and the payload the
    /// header announces (`count` elements of `dtype`).
    ///
    /// # Errors
    /// [`Error::Truncated`], [`Error::UnknownDType`] or [`Error::TooManyElements`].
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the header and the announced payload.
    ///
    /// # Errors
    /// [`Error::Truncated`], [`Error::UnknownDType`] or [`Error::TooManyElements`].
    pub fn check_len(&self) -> Result<(), Error> {
        let got = self.buffer.as_ref().len();
        if got < HEADER_LEN {
            return Err(Error::Truncated {
                needed: HEADER_LEN,
                got,
            });
        }
        let needed = HEADER_LEN + self.payload_len()?;
        if got < needed {
            return Err(Error::Truncated { needed, got });
        }
        Ok(())
    }

    /// Payload length in bytes announced by `count` and `dtype`.
    ///
    /// # Errors
    /// [`Error::UnknownDType`] or [`Error::TooManyElements`].
    pub fn payload_len(&self) -> Result<usize, Error> {
        let dtype = DType::from_u8(self.dtype()).ok_or(Error::UnknownDType(self.dtype()))?;
        let count = self.count();
        if usize::from(count) > dtype.max_elems() {
            return Err(Error::TooManyElements(count));
        }
        Ok(usize::from(count) * dtype.size())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn data(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn magic(&self) -> u8 {
        self.data()[field::MAGIC]
    }
    pub fn version(&self) -> u8 {
        self.data()[field::VERSION]
    }
    /// Raw kind byte; see [`Kind::from_u8`].
    pub fn kind(&self) -> u8 {
        self.data()[field::KIND]
    }
    pub fn flags(&self) -> Flags {
        Flags(self.data()[field::FLAGS])
    }
    pub fn job(&self) -> u32 {
        be_get!(u32, self.data(), field::JOB)
    }
    pub fn rank(&self) -> u8 {
        self.data()[field::RANK]
    }
    pub fn fan_in(&self) -> u8 {
        self.data()[field::FAN_IN]
    }
    /// Raw op byte; see [`Op::from_u8`].
    pub fn op(&self) -> u8 {
        self.data()[field::OP]
    }
    /// Raw dtype byte; see [`DType::from_u8`].
    pub fn dtype(&self) -> u8 {
        self.data()[field::DTYPE]
    }
    pub fn seq(&self) -> u32 {
        be_get!(u32, self.data(), field::SEQ)
    }
    /// The slot index, without the version bit.
    pub fn slot(&self) -> u32 {
        be_get!(u32, self.data(), field::SLOT) & !SLOT_VERSION_BIT
    }
    /// The version (shadow) bit of the slot field.
    pub fn slot_version(&self) -> bool {
        be_get!(u32, self.data(), field::SLOT) & SLOT_VERSION_BIT != 0
    }
    pub fn count(&self) -> u16 {
        be_get!(u16, self.data(), field::COUNT)
    }
    pub fn exponent(&self) -> i8 {
        i8::from_be_bytes([self.data()[field::EXPONENT]])
    }
    pub fn bitmap(&self) -> u64 {
        be_get!(u64, self.data(), field::BITMAP)
    }
    pub fn root(&self) -> u8 {
        self.data()[field::ROOT]
    }

    /// The payload bytes announced by the header.
    ///
    /// # Panics
    /// If the packet was not checked and the buffer is shorter than announced.
    pub fn payload(&self) -> &[u8] {
        let len = self.payload_len().unwrap_or(0);
        &self.data()[HEADER_LEN..HEADER_LEN + len]
    }

    /// Element `i` of an `I64` payload.
    ///
    /// # Panics
    /// If `i` is not below the element count.
    pub fn i64_at(&self, i: usize) -> i64 {
        assert!(i < usize::from(self.count()), "element {i} out of range");
        let at = HEADER_LEN + 8 * i;
        be_get!(i64, self.data(), at..at + 8)
    }

    /// Element `i` of an `I32` payload.
    ///
    /// # Panics
    /// If `i` is not below the element count.
    pub fn i32_at(&self, i: usize) -> i32 {
        assert!(i < usize::from(self.count()), "element {i} out of range");
        let at = HEADER_LEN + 4 * i;
        be_get!(i32, self.data(), at..at + 4)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn data_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    pub fn set_magic(&mut self, v: u8) {
        self.data_mut()[field::MAGIC] = v;
    }
    pub fn set_version(&mut self, v: u8) {
        self.data_mut()[field::VERSION] = v;
    }
    pub fn set_kind(&mut self, v: Kind) {
        self.data_mut()[field::KIND] = v as u8;
    }
    pub fn set_flags(&mut self, v: Flags) {
        self.data_mut()[field::FLAGS] = v.0;
    }
    pub fn set_job(&mut self, v: u32) {
        self.data_mut()[field::JOB].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_rank(&mut self, v: u8) {
        self.data_mut()[field::RANK] = v;
    }
    pub fn set_fan_in(&mut self, v: u8) {
        self.data_mut()[field::FAN_IN] = v;
    }
    pub fn set_op(&mut self, v: Op) {
        self.data_mut()[field::OP] = v as u8;
    }
    pub fn set_dtype(&mut self, v: DType) {
        self.data_mut()[field::DTYPE] = v as u8;
    }
    pub fn set_seq(&mut self, v: u32) {
        self.data_mut()[field::SEQ].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the slot index (its top bit must be clear) and the version bit.
    ///
    /// # Panics
    /// If `index` uses the version bit.
    pub fn set_slot(&mut self, index: u32, version: bool) {
        assert!(
            index & SLOT_VERSION_BIT == 0,
            "slot index {index} too large"
        );
        let v = index | if version { SLOT_VERSION_BIT } else { 0 };
        self.data_mut()[field::SLOT].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_count(&mut self, v: u16) {
        self.data_mut()[field::COUNT].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_exponent(&mut self, v: i8) {
        self.data_mut()[field::EXPONENT] = v.to_be_bytes()[0];
    }
    pub fn set_bitmap(&mut self, v: u64) {
        self.data_mut()[field::BITMAP].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_root(&mut self, v: u8) {
        self.data_mut()[field::ROOT] = v;
    }

    /// Sets element `i` of an `I64` payload.
    ///
    /// # Panics
    /// If the buffer does not reach element `i`.
    pub fn set_i64_at(&mut self, i: usize, v: i64) {
        let at = HEADER_LEN + 8 * i;
        self.data_mut()[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets element `i` of an `I32` payload.
    ///
    /// # Panics
    /// If the buffer does not reach element `i`.
    pub fn set_i32_at(&mut self, i: usize, v: i32) {
        let at = HEADER_LEN + 4 * i;
        self.data_mut()[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// The payload bytes announced by the header, mutably.
    ///
    /// # Panics
    /// If the packet was not checked and the buffer is shorter than announced.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.payload_len().unwrap_or(0);
        &mut self.data_mut()[HEADER_LEN..HEADER_LEN + len]
    }
}

/// A parsed xina header, independent of any buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub kind: Kind,
    pub flags: Flags,
    pub job: u32,
    pub rank: u8,
    pub fan_in: u8,
    pub op: Op,
    pub dtype: DType,
    pub seq: u32,
    /// Slot index relative to the job's slot range (below 2^31).
    pub slot: u32,
    /// Which copy of the slot holds this chunk.
    pub slot_version: bool,
    pub count: u16,
    pub exponent: i8,
    /// Destination rank for reduce and reduce-scatter.
    pub root: u8,
    pub bitmap: u64,
}

impl Repr {
    /// Parses and validates the header of a length-checked packet.
    ///
    /// # Errors
    /// Any [`Error`] but `Truncated`, which [`Packet::new_checked`] reports.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self, Error> {
        if packet.magic() != MAGIC {
            return Err(Error::BadMagic(packet.magic()));
        }
        if packet.version() != VERSION {
            return Err(Error::BadVersion(packet.version()));
        }
        let kind = Kind::from_u8(packet.kind()).ok_or(Error::UnknownKind(packet.kind()))?;
        let op = Op::from_u8(packet.op()).ok_or(Error::UnknownOp(packet.op()))?;
        let dtype = DType::from_u8(packet.dtype()).ok_or(Error::UnknownDType(packet.dtype()))?;
        if usize::from(packet.count()) > dtype.max_elems() {
            return Err(Error::TooManyElements(packet.count()));
        }
        Ok(Self {
            kind,
            flags: packet.flags(),
            job: packet.job(),
            rank: packet.rank(),
            fan_in: packet.fan_in(),
            op,
            dtype,
            seq: packet.seq(),
            slot: packet.slot(),
            slot_version: packet.slot_version(),
            count: packet.count(),
            exponent: packet.exponent(),
            root: packet.root(),
            bitmap: packet.bitmap(),
        })
    }

    /// Length of the payload this header announces.
    pub const fn payload_len(&self) -> usize {
        self.count as usize * self.dtype.size()
    }

    /// Length of header plus payload.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    /// Writes the header (not the payload) into `packet`.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] or `slot` uses the version bit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_kind(self.kind);
        packet.set_flags(self.flags);
        packet.set_job(self.job);
        packet.set_rank(self.rank);
        packet.set_fan_in(self.fan_in);
        packet.set_op(self.op);
        packet.set_dtype(self.dtype);
        packet.set_seq(self.seq);
        packet.set_slot(self.slot, self.slot_version);
        packet.set_count(self.count);
        packet.set_exponent(self.exponent);
        packet.set_root(self.root);
        packet.set_bitmap(self.bitmap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_PAYLOAD;
    use proptest::prelude::*;

    fn sample() -> Repr {
        Repr {
            kind: Kind::AggData,
            flags: Flags(Flags::RETRANSMIT),
            job: 0x0102_0304,
            rank: 5,
            fan_in: 8,
            op: Op::Sum,
            dtype: DType::I32,
            seq: 0xa0b0_c0d0,
            slot: 0x0011_2233,
            slot_version: true,
            count: 3,
            exponent: -7,
            root: 0x42,
            bitmap: 0x8000_0000_0000_0021,
        }
    }

    #[test]
    fn every_field_is_at_its_documented_offset() {
        let mut buf = [0u8; HEADER_LEN + 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        sample().emit(&mut p);
        p.set_i32_at(0, -2);
        let expected: [u8; HEADER_LEN] = [
            0x58, 0x01, 0x01, 0x01, // magic, version, kind, flags
            0x01, 0x02, 0x03, 0x04, // job
            0x05, 0x08, 0x00, 0x00, // rank, fan-in, op, dtype
            0xa0, 0xb0, 0xc0, 0xd0, // seq
            0x80, 0x11, 0x22, 0x33, // V + slot
            0x00, 0x03, 0xf9, 0x42, // count, exponent, root
            0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x21, // bitmap
        ];
        assert_eq!(&buf[..HEADER_LEN], &expected);
        assert_eq!(&buf[HEADER_LEN..HEADER_LEN + 4], &[0xff, 0xff, 0xff, 0xfe]);
    }

    #[test]
    fn short_buffers_are_rejected() {
        let mut buf = [0u8; HEADER_LEN + 12];
        sample().emit(&mut Packet::new_unchecked(&mut buf[..]));
        for len in 0..HEADER_LEN + 12 {
            let err = Packet::new_checked(&buf[..len]).unwrap_err();
            let needed = if len < HEADER_LEN {
                HEADER_LEN
            } else {
                HEADER_LEN + 12
            };
            assert_eq!(err, Error::Truncated { needed, got: len });
        }
        assert!(Packet::new_checked(&buf[..]).is_ok());
    }

    #[test]
    fn invalid_header_values_are_rejected() {
        let mut buf = [0u8; HEADER_LEN + 12];
        sample().emit(&mut Packet::new_unchecked(&mut buf[..]));
        let cases: [(usize, u8, Error); 5] = [
            (field::MAGIC, 0x59, Error::BadMagic(0x59)),
            (field::VERSION, 2, Error::BadVersion(2)),
            (field::KIND, 9, Error::UnknownKind(9)),
            (field::OP, 3, Error::UnknownOp(3)),
            (field::DTYPE, 7, Error::UnknownDType(7)),
        ];
        for (at, value, err) in cases {
            let mut bad = buf;
            bad[at] = value;
            let got = Packet::new_checked(&bad[..]).and_then(|p| Repr::parse(&p));
            assert_eq!(got, Err(err), "byte {at} = {value}");
        }
        let mut big = buf;
        big[field::COUNT].copy_from_slice(&16_129u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&big[..]).unwrap_err(),
            Error::TooManyElements(16_129)
        );
        big[field::DTYPE] = DType::I64 as u8;
        big[field::COUNT].copy_from_slice(&8_065u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&big[..]).unwrap_err(),
            Error::TooManyElements(8_065)
        );
        // Group data stays within one 1,500-byte frame.
        big[field::DTYPE] = DType::Bytes as u8;
        big[field::COUNT].copy_from_slice(&1_441u16.to_be_bytes());
        assert_eq!(
            Packet::new_checked(&big[..]).unwrap_err(),
            Error::TooManyElements(1_441)
        );
    }

    fn any_repr() -> impl Strategy<Value = Repr> {
        (
            (
                1u8..=5,
                any::<u8>(),
                any::<u32>(),
                any::<u8>(),
                any::<u8>(),
                0u8..3,
                0u8..2,
            ),
            (
                any::<u32>(),
                0u32..SLOT_VERSION_BIT,
                any::<bool>(),
                0u16..=180,
                any::<i8>(),
            ),
            (any::<u8>(), any::<u64>()),
        )
            .prop_map(
                |((k, fl, job, rank, fan_in, op, dt), (seq, slot, v, count, e), (root, bm))| Repr {
                    kind: Kind::from_u8(k).unwrap(),
                    flags: Flags(fl),
                    job,
                    rank,
                    fan_in,
                    op: Op::from_u8(op).unwrap(),
                    dtype: DType::from_u8(dt).unwrap(),
                    seq,
                    slot,
                    slot_version: v,
                    count,
                    exponent: e,
                    root,
                    bitmap: bm,
                },
            )
    }

    proptest! {
        #[test]
        fn repr_round_trips(repr in any_repr()) {
            let mut buf = [0u8; HEADER_LEN + MAX_PAYLOAD];
            let mut p = Packet::new_unchecked(&mut buf[..repr.buffer_len()]);
            repr.emit(&mut p);
            let p = Packet::new_checked(&buf[..repr.buffer_len()]).unwrap();
            prop_assert_eq!(Repr::parse(&p).unwrap(), repr);
            prop_assert_eq!(p.payload().len(), repr.payload_len());
        }

        #[test]
        fn i32_elements_round_trip(values in proptest::collection::vec(any::<i32>(), 0..=360)) {
            let mut repr = sample();
            repr.count = u16::try_from(values.len()).unwrap();
            let mut buf = [0u8; HEADER_LEN + MAX_PAYLOAD];
            let mut p = Packet::new_unchecked(&mut buf[..repr.buffer_len()]);
            repr.emit(&mut p);
            for (i, v) in values.iter().enumerate() {
                p.set_i32_at(i, *v);
            }
            let p = Packet::new_checked(&buf[..repr.buffer_len()]).unwrap();
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(p.i32_at(i), *v);
            }
        }

        #[test]
        fn i64_elements_round_trip(values in proptest::collection::vec(any::<i64>(), 0..=180)) {
            let mut repr = sample();
            repr.dtype = DType::I64;
            repr.count = u16::try_from(values.len()).unwrap();
            let mut buf = [0u8; HEADER_LEN + MAX_PAYLOAD];
            let mut p = Packet::new_unchecked(&mut buf[..repr.buffer_len()]);
            repr.emit(&mut p);
            for (i, v) in values.iter().enumerate() {
                p.set_i64_at(i, *v);
            }
            let p = Packet::new_checked(&buf[..repr.buffer_len()]).unwrap();
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(p.i64_at(i), *v);
            }
        }
    }
}

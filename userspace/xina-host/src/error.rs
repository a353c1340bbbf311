//! The errors of the worker library.

use std::fmt;
use std::io;
use std::net::SocketAddrV4;
use std::ops::Range;
use std::time::Duration;

use xina_proto::DType;

use crate::engine::{MAX_WINDOW, Mode};

/// The name of an element type in messages.
pub(crate) const fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bytes => "bytes",
    }
}

/// Why a collective could not be started or did not complete.
///
/// A collective that fails never yields a result: the caller gets one of these
/// instead, and the contents of its buffer are unspecified (chunks whose
/// results arrived hold sums, the others still hold the inputs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The fan-in is outside `1..=64` (the width of the rank bitmap).
    #[error("job {job}: fan-in {fan_in} is out of range 1..=64")]
    InvalidFanIn { job: u32, fan_in: u8 },

    /// The rank is not below the fan-in.
    #[error("job {job}: rank {rank} is not a member (fan-in {fan_in}, ranks 0..{fan_in})")]
    RankOutOfRange { job: u32, rank: u8, fan_in: u8 },

    /// The elements per packet are outside `1..=MAX_ELEMS`.
    #[error(
        "job {job}: {elems_per_packet} elements per packet is out of range 1..={} for {}",
        dtype.max_elems(),
        dtype_name(*dtype)
    )]
    InvalidElemsPerPacket {
        job: u32,
        elems_per_packet: u16,
        dtype: DType,
    },

    /// The call's element type is not the job's.
    #[error("job {job} carries {} elements; {call} is not supported on it", dtype_name(*job_dtype))]
    WrongType {
        job: u32,
        job_dtype: DType,
        /// What was called (`"allreduce of int64"`).
        call: String,
    },

    /// The collective needs another delivery mode than the job's.
    #[error(
        "job {job} is installed in {mode} mode; {collective} needs a job in {} mode",
        needed.name()
    )]
    WrongMode {
        job: u32,
        mode: Mode,
        needed: Mode,
        collective: &'static str,
    },

    /// A reduce's root is not a rank of the job.
    #[error("job {job}: root {root} is not a rank (fan-in {fan_in}, ranks 0..{fan_in})")]
    RootOutOfRange { job: u32, root: u8, fan_in: u8 },

    /// A reduce-scatter's buffer does not split into `fan_in` equal parts.
    #[error(
        "job {job}: reduce-scatter of {len} elements: the length must be a multiple of the \
         fan-in {fan_in}"
    )]
    LengthNotDivisible { job: u32, len: usize, fan_in: u8 },

    /// An out-of-place call's input and output differ in length.
    #[error("job {job}: an allreduce from {input} elements into {output}: the lengths must match")]
    LengthMismatch {
        job: u32,
        input: usize,
        output: usize,
    },

    /// The call check found that the ranks did not all make the same call
    /// (collective, root and length). The ranks' chunk numbers are out of
    /// step from here on: reinstall the job.
    #[error(
        "job {job}, rank {rank}: the ranks did not all make the same call (this rank: {collective} \
         of {len} elements{root}); the job's chunk numbering is now out of step, reinstall it",
        root = root.map_or(String::new(), |r| format!(" to root {r}"))
    )]
    CallMismatch {
        job: u32,
        rank: u8,
        collective: &'static str,
        root: Option<u8>,
        len: usize,
    },

    /// A float input is NaN or infinite on at least one rank (every rank
    /// fails alike), so no fixed-point scale can carry it.
    #[error("job {job}, rank {rank}: a float input is NaN or infinite on at least one rank")]
    NonFinite { job: u32, rank: u8 },

    /// The window (the job's number of aggregator slots) is outside
    /// `1..=MAX_WINDOW`.
    #[error("job {job}: a window of {slots} slots is out of range 1..={MAX_WINDOW}")]
    InvalidWindow { job: u32, slots: u32 },

    /// A [`Config`](crate::Config) value is unusable.
    #[error("invalid xina-host config: {problem}")]
    InvalidConfig { problem: &'static str },

    /// No new result arrived for the configured give-up time: a peer is gone,
    /// the switch is unreachable, or the job is not installed on it. (The
    /// switch sends nothing for a chunk that is not complete, so it cannot
    /// tell which ranks are missing.)
    #[error(
        "job {job}, rank {rank}: no new result for {waited:?} \
         ({completed} of {total} chunks completed); {outstanding}{}",
        if *received == 0 {
            format!(
                "; nothing at all came back during the call: a rank may be gone, the switch \
                 unreachable, or job {job} not installed on it (or this rank's address not \
                 registered for it)"
            )
        } else {
            String::new()
        }
    )]
    GaveUp {
        job: u32,
        rank: u8,
        /// How long the engine waited without progress.
        waited: Duration,
        /// Chunks of this call whose results had arrived.
        completed: usize,
        /// Chunks of this call.
        total: usize,
        /// The sequence numbers sent but still without a result.
        outstanding: SeqList,
        /// Datagrams received during the call, whatever they were.
        received: u64,
    },

    /// An integer sum saturated in the switch: the result would be wrong, so
    /// none is returned. Every rank sees the same overflow.
    #[error(
        "job {job}, rank {rank}: sum overflowed in chunk seq {seq} \
         (elements {}..{}); {chunks} chunk(s) overflowed in this call",
        elements.start,
        elements.end
    )]
    Overflow {
        job: u32,
        rank: u8,
        /// The first chunk whose result carried the overflow flag.
        seq: u32,
        /// The buffer elements that chunk covers.
        elements: Range<usize>,
        /// How many chunks of the call overflowed.
        chunks: usize,
    },

    /// A multicast group's parameters are out of range.
    #[error("group {group}: {problem}")]
    InvalidGroup { group: u32, problem: String },

    /// A broadcast or allgather stopped moving for the configured give-up
    /// time; the details name the receivers the switch reported missing, or
    /// the silent root.
    #[error("{0}")]
    GroupStalled(Box<GroupStall>),

    /// The worker's socket could not be bound.
    #[error("cannot bind the xina worker socket to {addr}")]
    Bind {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },

    /// A socket operation failed.
    #[error("job {job}, rank {rank}: {action} failed")]
    Io {
        job: u32,
        rank: u8,
        /// What the worker was doing (`"send to the switch"`, ...).
        action: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A list of sequence numbers, truncated to its first [`SeqList::SHOWN`]
/// entries for display.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqList {
    /// The first sequence numbers, in sending order (at most [`SeqList::SHOWN`]).
    pub first: Vec<u32>,
    /// How many there are in total.
    pub total: usize,
}

impl SeqList {
    /// How many sequence numbers an error names.
    pub const SHOWN: usize = 16;

    /// Keeps the first [`SeqList::SHOWN`] of `seqs` and counts them all.
    pub fn new(seqs: impl IntoIterator<Item = u32>) -> Self {
        let mut list = Self::default();
        for seq in seqs {
            if list.first.len() < Self::SHOWN {
                list.first.push(seq);
            }
            list.total += 1;
        }
        list
    }
}

impl fmt::Display for SeqList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.total == 0 {
            return f.write_str("no chunk outstanding");
        }
        write!(f, "{} chunk(s) outstanding: seq ", self.total)?;
        for (i, seq) in self.first.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{seq}")?;
        }
        let hidden = self.total - self.first.len();
        if hidden > 0 {
            write!(f, " and {hidden} more")?;
        }
        Ok(())
    }
}

/// What is known about a multicast call that stopped moving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStall {
    pub group: u32,
    pub rank: u8,
    /// `"broadcast"` or `"allgather"`.
    pub collective: &'static str,
    /// The sender whose chunks did not complete.
    pub root: u8,
    pub waited: Duration,
    /// How far the stream got, in words.
    pub progress: String,
    /// The receivers the switch last reported as not having acknowledged a
    /// chunk (empty when no report came).
    pub missing: Vec<u8>,
    /// What the engine knows about the cause.
    pub reason: &'static str,
    /// The chunks not done.
    pub open: SeqList,
}

impl fmt::Display for GroupStall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "group {}, rank {}: {} from root {} made no progress for {:?} ({}); {}",
            self.group,
            self.rank,
            self.collective,
            self.root,
            self.waited,
            self.progress,
            self.reason
        )?;
        if !self.missing.is_empty() {
            f.write_str(": receiver(s) ")?;
            for (i, r) in self.missing.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{r}")?;
            }
            f.write_str(" have not acknowledged")?;
        }
        write!(f, "; {}", self.open)
    }
}

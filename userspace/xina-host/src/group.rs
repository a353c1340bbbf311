//! Reliable broadcast and allgather through a multicast group: the sans-IO
//! engine.
//!
//! A group is installed on the switch like a job (see the operator's guide in
//! the README). A sender's chunk goes to the switch once; the switch copies it
//! to every other member, collects the members' acknowledgements in the
//! chunk's slot and sends the sender one acknowledgement when all have it.
//!
//! ```text
//!  root                         switch                        receivers q1, q2
//!   | data s ----------------------> | -- copy ----------------> q1   (stores, acks)
//!   |                                | -- copy ------x           q2   (lost)
//!   |                                | <--------------- ack s --- q1   (bitmap {q1})
//!   |  (timeout)                     |
//!   | data s, RETRANSMIT ----------> | -- copy to q2 only ------> q2   (selective)
//!   | <------- report: MISSING {q2}  |
//!   |                                | <--------------- ack s --- q2   (bitmap full)
//!   | <----------------- ack s {q1,q2}  (SYNC chunks: to q1 and q2 too)
//! ```
//!
//! The sender keeps a window of `W` chunks in flight: chunk `s` uses slot
//! `rank × W + s mod W`, copy `(s / W) mod 2`, and goes out only once chunk
//! `s − W` is acknowledged, so a slot copy is reused only after everything it
//! held is done. Timeouts follow RFC 6298 ([`RttEstimator`]) with doubling.
//! Within those `W`, the sender's congestion window ([`crate::congestion`],
//! the workers' own, fed with the round trip from a chunk's first copy to
//! the switch's acknowledgement that every receiver has it) bounds how many
//! chunks are open, so a multicast sender does not queue its whole window
//! in front of a slow link either; `Config::queue_target: None` keeps all
//! `W` open.
//!
//! A receiver writes each chunk in place and acknowledges every data packet,
//! duplicates and chunks of earlier calls included (its earlier
//! acknowledgement may be the one that was lost). It must not return before
//! its acknowledgements have arrived, or a lost last acknowledgement would
//! leave the sender retransmitting to a receiver that has left: the sender
//! marks the last window of a call's chunks `SYNC`, the switch sends their
//! completion to every member, and a receiver returns once it holds every
//! chunk and knows, for each `SYNC` chunk, that the switch has its
//! acknowledgement (the completion, or a report that does not list it). A
//! `SYNC` chunk without either gets its acknowledgement re-sent on timeout;
//! the switch answers a repeated one with the completion or with a report.
//! That `SYNC` chunks suffice follows from the window: chunk `s + W` is sent
//! only after chunk `s` completed.
//!
//! Every member makes the same group calls in the same order with the same
//! lengths, as with MPI. Sequence numbers run on per sender from call to
//! call. Data of a sender's next call that arrives before this member has
//! started it is kept (up to [`STASH_LIMIT`] datagrams) and replayed then.
//!
//! Failure: when nothing moves for [`Config::give_up`] the call fails with
//! [`Error::GroupStalled`], which names the receivers the switch reported
//! missing, or the silent root.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use xina_proto::{
    DType, Flags, Kind, MAX_PAYLOAD, MAX_RANKS, Op, Packet, Repr,
    header::{HEADER_LEN, SLOT_VERSION_BIT},
};

use crate::congestion::{Sample, Window};
use crate::engine::{Config, MAX_WINDOW, RttEstimator, Stats};
use crate::error::{Error, GroupStall, SeqList};

/// How many chunks after an open one must complete before the open one is
/// retransmitted without waiting for its timeout.
pub const REORDER_CHUNKS: u32 = 3;

/// Most future datagrams a member keeps for calls it has not started.
pub const STASH_LIMIT: usize = 8192;

/// A member's view of its multicast group, as installed on the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupParams {
    /// The group id (it shares the switch's job id space).
    pub group: u32,
    /// This member's rank, below `fan_in`.
    pub rank: u8,
    /// The number of members (2..=64).
    pub fan_in: u8,
    /// Most payload bytes per packet (1..=1440): the group's
    /// `bytes_per_packet`.
    pub bytes_per_packet: u16,
    /// Each sender's window: the group's slots per rank.
    pub window: u32,
    /// The switch's xina address.
    pub switch: SocketAddrV4,
}

impl GroupParams {
    /// Checks the ranges above.
    ///
    /// # Errors
    /// [`Error::InvalidGroup`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |problem: String| {
            Err(Error::InvalidGroup {
                group: self.group,
                problem,
            })
        };
        if !(2..=MAX_RANKS).contains(&usize::from(self.fan_in)) {
            return bad(format!("{} members is out of range 2..=64", self.fan_in));
        }
        if self.rank >= self.fan_in {
            return bad(format!(
                "rank {} is not a member (ranks 0..{})",
                self.rank, self.fan_in
            ));
        }
        if self.bytes_per_packet == 0 || usize::from(self.bytes_per_packet) > MAX_PAYLOAD {
            return bad(format!(
                "{} bytes per packet is out of range 1..={MAX_PAYLOAD}",
                self.bytes_per_packet
            ));
        }
        let slots = u64::from(self.window) * u64::from(self.fan_in);
        if self.window == 0 || self.window > MAX_WINDOW || slots >= u64::from(SLOT_VERSION_BIT) {
            return bad(format!(
                "a window of {} slots per rank is out of range 1..={MAX_WINDOW}",
                self.window
            ));
        }
        Ok(())
    }

    /// The slot index and version bit of chunk `seq` from `root`.
    const fn slot(&self, root: u8, seq: u32) -> (u32, bool) {
        let w = self.window;
        (root as u32 * w + seq % w, (seq / w) % 2 == 1)
    }

    /// The ranks that receive `root`'s chunks.
    const fn receivers(&self, root: u8) -> u64 {
        let all = if self.fan_in as usize >= 64 {
            u64::MAX
        } else {
            (1u64 << self.fan_in) - 1
        };
        all & !(1u64 << root)
    }
}

/// A collective over a multicast group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupCollective {
    /// `root`'s buffer ends up in every member's buffer.
    Broadcast { root: u8 },
    /// The buffer holds `fan_in` equal parts; rank `r` contributes part `r`
    /// and every member ends up with all parts.
    Allgather,
}

impl GroupCollective {
    /// The collective's name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Broadcast { .. } => "broadcast",
            Self::Allgather => "allgather",
        }
    }
}

/// What a member keeps from call to call.
#[derive(Clone, Debug)]
pub struct GroupState {
    /// The next sequence number of each sender.
    pub next: [u64; MAX_RANKS],
    /// Round trips measured so far.
    pub rtt: RttEstimator,
    /// The congestion window of this member's own chunks.
    pub window: Window,
    /// Datagrams of calls not started yet.
    pub stash: Vec<Vec<u8>>,
}

impl Default for GroupState {
    fn default() -> Self {
        Self {
            next: [0; MAX_RANKS],
            rtt: RttEstimator::new(),
            window: Window::new(),
            stash: Vec::new(),
        }
    }
}

/// Per-chunk states.
mod chunk {
    /// Sender: not sent yet. Receiver: not received yet.
    pub const WAITING: u8 = 0;
    /// Sender: sent, not acknowledged by every receiver. Receiver: held,
    /// acknowledgement not known to have arrived (only tracked for `SYNC`
    /// chunks; others go straight to `DONE`).
    pub const OPEN: u8 = 1;
    /// Sender: every receiver acknowledged. Receiver: held and, for a `SYNC`
    /// chunk, known acknowledged.
    pub const DONE: u8 = 2;
}

/// The chunks one sender sends in this call.
#[derive(Debug)]
struct Stream {
    root: u8,
    /// Sequence number of chunk 0.
    base: u64,
    /// Byte range of the buffer the stream carries.
    offset: usize,
    len: usize,
    chunks: u32,
    /// Chunks from here on are `SYNC`.
    sync_from: u32,
    state: Vec<u8>,
    /// Transmissions (sender) or acknowledgement re-sends (receiver).
    tries: Vec<u8>,
    /// When the chunk (or its acknowledgement) last went out.
    sent_at: Vec<Option<Instant>>,
    /// The chunk's armed timer; a popped timer that differs is stale.
    deadline: Vec<Option<Instant>>,
    /// Sender: next chunk never sent.
    next: u32,
    /// Sender: chunks below this one have been looked at for early
    /// retransmission.
    early_from: u32,
    /// Chunks in state `DONE`.
    done: u32,
    /// Receiver: chunks held.
    held: u32,
    /// The last missing-receiver report: (sequence number, missing ranks).
    report: Option<(u32, u64)>,
    /// Receiver: the last chunk received, whose acknowledgement a probe
    /// repeats.
    last_held: Option<u32>,
    /// Receiver: the armed probe and the interval to the next one.
    probe: Option<Instant>,
    probe_every: Duration,
}

impl Stream {
    fn new(root: u8, base: u64, offset: usize, len: usize, bpp: usize, window: u32) -> Self {
        let chunks = u32::try_from(len.div_ceil(bpp)).expect("a call has fewer than 2^32 chunks");
        let n = chunks as usize;
        Self {
            root,
            base,
            offset,
            len,
            chunks,
            sync_from: chunks.saturating_sub(window),
            state: vec![chunk::WAITING; n],
            tries: vec![0; n],
            sent_at: vec![None; n],
            deadline: vec![None; n],
            next: 0,
            early_from: 0,
            done: 0,
            held: 0,
            report: None,
            last_held: None,
            probe: None,
            probe_every: Duration::ZERO,
        }
    }

    /// The chunk index of wire sequence number `seq`, as a signed distance
    /// from chunk 0 (negative: an earlier call).
    fn index(&self, seq: u32) -> i64 {
        i64::from(seq.wrapping_sub(self.base as u32) as i32)
    }

    fn seq(&self, i: u32) -> u32 {
        (self.base + u64::from(i)) as u32
    }

    /// Byte range of chunk `i` in the buffer.
    fn bytes(&self, i: u32, bpp: usize) -> std::ops::Range<usize> {
        let start = i as usize * bpp;
        self.offset + start..self.offset + (start + bpp).min(self.len)
    }

    fn complete(&self) -> bool {
        self.done == self.chunks
    }
}

/// The timeout after `doublings` unanswered sends: the estimate's, doubled
/// that many times, at most `max_rto`.
fn backoff(rtt: &RttEstimator, config: &Config, doublings: u8) -> Duration {
    rtt.rto(config)
        .saturating_mul(1 << u32::from(doublings).min(16))
        .min(config.max_rto)
}

/// A member's header for chunk `seq` of `root`'s stream (its slot and copy
/// follow from them).
fn header(p: &GroupParams, kind: Kind, flags: u8, root: u8, seq: u32, count: u16) -> Repr {
    let (slot, slot_version) = p.slot(root, seq);
    Repr {
        kind,
        flags: Flags(flags),
        job: p.group,
        rank: p.rank,
        fan_in: p.fan_in,
        op: Op::Sum,
        dtype: DType::Bytes,
        seq,
        slot,
        slot_version,
        count,
        exponent: 0,
        root,
        bitmap: 0,
    }
}

/// A timer: when, which stream, which chunk (or [`PROBE`]).
type Timer = Reverse<(Instant, usize, u32)>;

/// The chunk index of a receiver's probe timer. A receiver that waits for
/// data without progress repeats the acknowledgement of the last chunk it
/// received; if that chunk is not complete the switch answers with a
/// report, so the receiver learns which receivers hold up the sender's
/// window instead of blaming the sender.
const PROBE: u32 = u32::MAX;

/// One broadcast or allgather of one member.
#[derive(Debug)]
pub struct GroupEngine<'d> {
    params: GroupParams,
    config: Config,
    collective: GroupCollective,
    buf: &'d mut [u8],
    streams: Vec<Stream>,
    /// The stream of each sender in this call.
    by_root: [Option<usize>; MAX_RANKS],
    /// This member's own stream (it is a sender in this call).
    own: Option<usize>,
    /// Sequence numbers the next call of each sender starts at.
    next: [u64; MAX_RANKS],
    rtt: RttEstimator,
    /// How many of its own chunks this member may have open.
    congestion: Window,
    /// Whether the window, not the slots or the data, last held a new
    /// chunk back (the window grows only then).
    limited: bool,
    /// Acknowledgements to send: (root, wire sequence number).
    acks: VecDeque<(u8, u32)>,
    /// Own chunks due for retransmission.
    resend: VecDeque<u32>,
    timers: BinaryHeap<Timer>,
    stash: Vec<Vec<u8>>,
    stats: Stats,
    started: Instant,
    last_progress: Instant,
    outcome: Option<Result<Stats, Error>>,
}

impl<'d> GroupEngine<'d> {
    /// Starts `collective` over `buf` (the root's data or the receiver's
    /// destination for a broadcast; the `fan_in` parts for an allgather).
    ///
    /// # Errors
    /// [`Error::InvalidGroup`], [`Error::InvalidConfig`],
    /// [`Error::RootOutOfRange`] or [`Error::LengthNotDivisible`]; nothing
    /// is sent then, and `state` is left as it was. Otherwise the engine
    /// takes `state` over until [`into_state`](Self::into_state).
    pub fn new(
        params: GroupParams,
        config: Config,
        collective: GroupCollective,
        buf: &'d mut [u8],
        state: &mut GroupState,
        now: Instant,
    ) -> Result<Self, Error> {
        params.validate()?;
        config.validate()?;
        let bpp = usize::from(params.bytes_per_packet);
        let mut next = state.next;
        let mut streams = Vec::new();
        let mut add = |root: u8, offset: usize, len: usize| {
            let r = usize::from(root);
            let stream = Stream::new(root, next[r], offset, len, bpp, params.window);
            next[r] += u64::from(stream.chunks);
            streams.push(stream);
        };
        match collective {
            GroupCollective::Broadcast { root } => {
                if root >= params.fan_in {
                    return Err(Error::RootOutOfRange {
                        job: params.group,
                        root,
                        fan_in: params.fan_in,
                    });
                }
                add(root, 0, buf.len());
            }
            GroupCollective::Allgather => {
                let n = usize::from(params.fan_in);
                if !buf.len().is_multiple_of(n) {
                    return Err(Error::LengthNotDivisible {
                        job: params.group,
                        len: buf.len(),
                        fan_in: params.fan_in,
                    });
                }
                let part = buf.len() / n;
                for root in 0..params.fan_in {
                    add(root, usize::from(root) * part, part);
                }
            }
        }
        let state = std::mem::take(state);
        let mut by_root = [None; MAX_RANKS];
        for (i, s) in streams.iter().enumerate() {
            by_root[usize::from(s.root)] = Some(i);
        }
        let own = by_root[usize::from(params.rank)];
        let chunks = streams.iter().map(|s| u64::from(s.chunks)).sum();
        let mut engine = Self {
            params,
            config,
            collective,
            buf,
            streams,
            by_root,
            own,
            next,
            rtt: state.rtt,
            congestion: state.window,
            limited: false,
            acks: VecDeque::new(),
            resend: VecDeque::new(),
            timers: BinaryHeap::new(),
            stash: Vec::new(),
            stats: Stats {
                chunks,
                ..Stats::default()
            },
            started: now,
            last_progress: now,
            outcome: None,
        };
        for si in 0..engine.streams.len() {
            if Some(si) != engine.own && engine.streams[si].chunks > 0 {
                let every = engine.rtt.rto(&config).saturating_mul(4);
                engine.arm_probe(si, now, every);
            }
        }
        for datagram in state.stash {
            engine.handle_packet(now, &datagram);
        }
        engine.check_done(now);
        Ok(engine)
    }

    /// What the next call needs: sequence numbers, round trips, and the
    /// datagrams of calls not started yet.
    pub fn into_state(self) -> GroupState {
        GroupState {
            next: self.next,
            rtt: self.rtt,
            window: self.congestion,
            stash: self.stash,
        }
    }

    /// The collective this engine runs.
    pub const fn collective(&self) -> GroupCollective {
        self.collective
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            window: u32::try_from(self.window_limit()).unwrap_or(u32::MAX),
            ..self.stats
        }
    }

    /// How many of its own chunks this member may have open now.
    pub fn window_limit(&self) -> usize {
        if self.config.queue_target.is_some() {
            self.congestion.limit(self.params.window)
        } else {
            self.params.window as usize
        }
    }

    /// The outcome, once: `Some` when the call completed or failed.
    pub fn take_outcome(&mut self) -> Option<Result<Stats, Error>> {
        self.outcome.take()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.outcome.is_some() || self.finished() {
            return None;
        }
        let give_up = self.last_progress + self.config.give_up;
        Some(match self.timers.peek() {
            Some(Reverse((t, _, _))) => (*t).min(give_up),
            None => give_up,
        })
    }

    fn finished(&self) -> bool {
        self.streams.iter().all(Stream::complete)
    }

    /// Writes the next datagram into `buf` (at least [`HEADER_LEN`] +
    /// `bytes_per_packet` bytes); `None` when nothing is due.
    ///
    /// # Panics
    /// If `buf` is too short.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if self.outcome.is_some() {
            return None;
        }
        if let Some((root, seq)) = self.acks.pop_front() {
            return Some(self.write_ack(root, seq, buf));
        }
        let own = self.own?;
        let due = loop {
            match self.resend.pop_front() {
                // Acknowledged while it waited: nothing to resend.
                Some(i) if self.streams[own].state[i as usize] == chunk::DONE => {}
                other => break other,
            }
        };
        let chunk = if let Some(i) = due {
            self.stats.retransmissions += 1;
            i
        } else {
            let s = &self.streams[own];
            let w = self.params.window;
            let i = s.next;
            if i >= s.chunks || (i >= w && s.state[(i - w) as usize] != chunk::DONE) {
                self.limited = false;
                return None;
            }
            // Chunks sent and not acknowledged: every chunk below `next`
            // that is not done.
            let open = (s.next - s.done) as usize;
            if open >= self.window_limit() {
                self.limited = true;
                return None;
            }
            self.streams[own].next += 1;
            let open = u32::try_from(open + 1).unwrap_or(u32::MAX);
            self.stats.max_open = self.stats.max_open.max(open);
            i
        };
        Some(self.write_data(own, chunk, now, buf))
    }

    fn write_data(&mut self, own: usize, i: u32, now: Instant, buf: &mut [u8]) -> usize {
        let p = self.params;
        let bpp = usize::from(p.bytes_per_packet);
        let s = &mut self.streams[own];
        let seq = s.seq(i);
        let range = s.bytes(i, bpp);
        let idx = i as usize;
        let mut flags = 0;
        if s.tries[idx] > 0 {
            flags |= Flags::RETRANSMIT;
        }
        if i >= s.sync_from {
            flags |= Flags::SYNC;
        }
        s.tries[idx] = s.tries[idx].saturating_add(1);
        s.sent_at[idx] = Some(now);
        s.state[idx] = chunk::OPEN;
        let rto = backoff(&self.rtt, &self.config, s.tries[idx] - 1);
        s.deadline[idx] = Some(now + rto);
        self.timers.push(Reverse((now + rto, own, i)));
        let count = u16::try_from(range.len()).expect("at most bytes_per_packet");
        let repr = header(&p, Kind::McastData, flags, p.rank, seq, count);
        let len = repr.buffer_len();
        let mut packet = Packet::new_unchecked(&mut buf[..len]);
        repr.emit(&mut packet);
        packet.payload_mut().copy_from_slice(&self.buf[range]);
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        len
    }

    fn write_ack(&mut self, root: u8, seq: u32, buf: &mut [u8]) -> usize {
        let repr = header(&self.params, Kind::McastAck, 0, root, seq, 0);
        repr.emit(&mut Packet::new_unchecked(&mut buf[..HEADER_LEN]));
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += HEADER_LEN as u64;
        HEADER_LEN
    }

    /// Takes a datagram from the switch.
    pub fn handle_packet(&mut self, now: Instant, datagram: &[u8]) {
        self.stats.packets_received += 1;
        self.stats.bytes_received += datagram.len() as u64;
        if self.outcome.is_some() {
            return;
        }
        let Some(repr) = Packet::new_checked(datagram)
            .ok()
            .and_then(|p| Repr::parse(&p).ok())
        else {
            self.stats.ignored += 1;
            return;
        };
        let p = self.params;
        if repr.job != p.group
            || repr.fan_in != p.fan_in
            || repr.dtype != DType::Bytes
            || repr.root >= p.fan_in
        {
            self.stats.ignored += 1;
            return;
        }
        match repr.kind {
            Kind::McastData if repr.root != p.rank && repr.rank == repr.root => {
                let payload = &datagram[HEADER_LEN..repr.buffer_len()];
                self.on_data(now, &repr, payload, datagram);
            }
            Kind::McastAck => self.on_ack(now, &repr),
            _ => self.stats.ignored += 1,
        }
        self.check_done(now);
    }

    fn on_data(&mut self, now: Instant, repr: &Repr, payload: &[u8], datagram: &[u8]) {
        let root = repr.root;
        let Some(si) = self.by_root[usize::from(root)] else {
            // A sender that has no part in this call: its next call, or a
            // retransmission from an earlier one.
            let ahead = repr.seq.wrapping_sub(self.next[usize::from(root)] as u32) as i32;
            if ahead >= 0 {
                self.keep(datagram);
            } else {
                self.acks.push_back((root, repr.seq));
            }
            return;
        };
        let bpp = usize::from(self.params.bytes_per_packet);
        let s = &mut self.streams[si];
        let d = s.index(repr.seq);
        if d < 0 {
            self.acks.push_back((root, repr.seq));
            self.stats.duplicates += 1;
            return;
        }
        if d >= i64::from(s.chunks) {
            // The sender has started its next call, so every chunk of this
            // one is acknowledged by every receiver, this one included.
            if s.held == s.chunks {
                for i in s.sync_from..s.chunks {
                    if s.state[i as usize] != chunk::DONE {
                        s.state[i as usize] = chunk::DONE;
                        s.done += 1;
                    }
                }
                self.last_progress = now;
            }
            self.keep(datagram);
            return;
        }
        let i = d as u32;
        let range = s.bytes(i, bpp);
        if payload.len() != range.len()
            || (repr.slot, repr.slot_version) != self.params.slot(root, repr.seq)
        {
            self.stats.ignored += 1;
            return;
        }
        let idx = i as usize;
        if s.state[idx] == chunk::WAITING {
            self.buf[range].copy_from_slice(payload);
            s.held += 1;
            s.last_held = Some(repr.seq);
            self.last_progress = now;
            if i >= s.sync_from {
                s.state[idx] = chunk::OPEN;
                s.sent_at[idx] = Some(now);
                let t = now + self.rtt.rto(&self.config);
                s.deadline[idx] = Some(t);
                self.timers.push(Reverse((t, si, i)));
            } else {
                s.state[idx] = chunk::DONE;
                s.done += 1;
            }
        } else {
            self.stats.duplicates += 1;
        }
        self.acks.push_back((root, repr.seq));
    }

    fn on_ack(&mut self, now: Instant, repr: &Repr) {
        let p = self.params;
        let Some(si) = self.by_root[usize::from(repr.root)] else {
            self.stats.ignored += 1;
            return;
        };
        let receivers = p.receivers(repr.root);
        let mine = repr.root == p.rank;
        let s = &mut self.streams[si];
        let d = s.index(repr.seq);
        if d < 0 || d >= i64::from(s.chunks) {
            self.stats.ignored += 1;
            return;
        }
        let i = d as u32;
        let idx = i as usize;
        if repr.flags.contains(Flags::MISSING) {
            s.report = Some((repr.seq, repr.bitmap & receivers));
            // A receiver's report that does not list it: its
            // acknowledgement is in, which is all it waits for.
            if !mine && repr.bitmap & (1 << p.rank) == 0 && s.state[idx] == chunk::OPEN {
                s.state[idx] = chunk::DONE;
                s.done += 1;
                self.last_progress = now;
            }
            return;
        }
        if repr.bitmap & receivers != receivers {
            self.stats.ignored += 1;
            return;
        }
        if s.state[idx] != chunk::OPEN {
            self.stats.duplicates += 1;
            return;
        }
        s.state[idx] = chunk::DONE;
        s.done += 1;
        self.last_progress = now;
        if repr.flags.contains(Flags::FROM_CACHE) {
            self.stats.from_cache += 1;
        }
        if mine
            && s.tries[idx] == 1
            && let Some(sent) = s.sent_at[idx]
        {
            let rtt = now.saturating_duration_since(sent);
            let bytes = s.bytes(i, usize::from(p.bytes_per_packet)).len();
            self.rtt.sample(rtt);
            if let Some(queue_target) = self.config.queue_target {
                let srtt = self.rtt.smoothed().unwrap_or(rtt);
                let before = self.congestion.decreases();
                let sample = Sample { rtt, srtt, bytes };
                self.congestion
                    .on_result(now, sample, self.limited, p.window, queue_target);
                self.stats.window_decreases += self.congestion.decreases() - before;
            }
        }
        if mine {
            self.retransmit_early(si, i);
        }
    }

    /// Chunk `acked` of this member's own stream is done: a chunk sent
    /// [`REORDER_CHUNKS`] or more before it and still open after its first
    /// transmission is taken as lost and goes again now, without waiting for
    /// its timeout (like TCP's duplicate-acknowledgement threshold: every
    /// receiver handles a sender's chunks in order, so a later chunk
    /// completing means an earlier one's data or acknowledgement went
    /// missing). Each chunk is looked at once.
    fn retransmit_early(&mut self, si: usize, acked: u32) {
        let s = &mut self.streams[si];
        let Some(end) = acked.checked_sub(REORDER_CHUNKS - 1) else {
            return;
        };
        for i in s.early_from..end {
            let idx = i as usize;
            if s.state[idx] == chunk::OPEN && s.tries[idx] == 1 && s.deadline[idx].is_some() {
                // Cancels its timer; re-armed when it goes out again.
                s.deadline[idx] = None;
                self.resend.push_back(i);
            }
        }
        s.early_from = s.early_from.max(end);
    }

    fn arm_probe(&mut self, si: usize, now: Instant, every: Duration) {
        let s = &mut self.streams[si];
        s.probe_every = every.min(self.config.max_rto);
        let t = now + s.probe_every;
        s.probe = Some(t);
        self.timers.push(Reverse((t, si, PROBE)));
    }

    /// A receiver's probe timer fired: repeat the last acknowledgement if
    /// nothing arrived for a whole interval, and back off.
    fn on_probe(&mut self, si: usize, t: Instant, now: Instant) {
        let s = &self.streams[si];
        if s.probe != Some(t) || s.held == s.chunks {
            return;
        }
        let quiet = now.saturating_duration_since(self.last_progress) >= s.probe_every;
        let every = if quiet {
            if let Some(seq) = s.last_held {
                self.acks.push_back((s.root, seq));
            }
            s.probe_every.saturating_mul(2)
        } else {
            s.probe_every
        };
        self.arm_probe(si, now, every);
    }

    /// Keeps a datagram of a call not started yet.
    fn keep(&mut self, datagram: &[u8]) {
        if self.stash.len() < STASH_LIMIT {
            self.stash.push(datagram.to_vec());
        } else {
            self.stats.ignored += 1;
        }
    }

    /// Runs what is due at `now`: retransmissions, repeated
    /// acknowledgements of `SYNC` chunks, and giving up.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.outcome.is_some() {
            return;
        }
        let mut fired = false;
        while let Some(&Reverse((t, si, i))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if i == PROBE {
                self.on_probe(si, t, now);
                continue;
            }
            let s = &mut self.streams[si];
            let idx = i as usize;
            // A timer re-armed or cancelled since is stale.
            if s.state[idx] != chunk::OPEN || s.deadline[idx] != Some(t) {
                continue;
            }
            fired = true;
            s.deadline[idx] = None;
            if Some(si) == self.own {
                // Re-armed when the chunk goes out again.
                self.resend.push_back(i);
                // A second timeout of a chunk with nothing acknowledged
                // for a whole timeout is a stall: a queue that overflowed.
                let waited = now.saturating_duration_since(self.last_progress);
                if self.config.queue_target.is_some()
                    && s.tries[idx] > 1
                    && waited >= self.rtt.rto(&self.config)
                {
                    let srtt = self.rtt.smoothed().unwrap_or(self.config.initial_rto);
                    let before = self.congestion.decreases();
                    self.congestion.on_stall(now, srtt);
                    self.stats.window_decreases += self.congestion.decreases() - before;
                }
            } else {
                let seq = s.seq(i);
                s.tries[idx] = s.tries[idx].saturating_add(1);
                s.sent_at[idx] = Some(now);
                let rto = backoff(&self.rtt, &self.config, s.tries[idx]);
                s.deadline[idx] = Some(now + rto);
                self.timers.push(Reverse((now + rto, si, i)));
                let root = s.root;
                self.acks.push_back((root, seq));
            }
        }
        if fired {
            self.stats.timeouts += 1;
        }
        let waited = now.saturating_duration_since(self.last_progress);
        if waited >= self.config.give_up {
            self.outcome = Some(Err(self.stalled(waited)));
        }
    }

    /// The error of a call that stopped moving: the first stream that is
    /// not complete, and what is known about why.
    fn stalled(&self, waited: Duration) -> Error {
        let p = self.params;
        let s = self
            .streams
            .iter()
            .find(|s| !s.complete())
            .expect("a stalled call has an incomplete stream");
        let open: Vec<u32> = (0..s.chunks)
            .filter(|&i| s.state[i as usize] != chunk::DONE)
            .map(|i| s.seq(i))
            .collect();
        let missing = s
            .report
            .map(|(_, bits)| (0..64u8).filter(|r| bits & (1 << r) != 0).collect())
            .unwrap_or_default();
        let (progress, reason) = if s.root == p.rank {
            (
                format!(
                    "{} of {} chunks acknowledged by every receiver",
                    s.done, s.chunks
                ),
                if s.report.is_some() {
                    "the switch reports receivers missing"
                } else if self.stats.packets_received == 0 {
                    "nothing came back: the switch may be unreachable, or the group not installed \
                     on it (or this rank not registered as a sender)"
                } else {
                    "no acknowledgement and no report came back for these chunks"
                },
            )
        } else if s.held < s.chunks {
            (
                format!("{} of {} chunks received", s.held, s.chunks),
                if s.report.is_some() {
                    "the root's window is held up: the switch reports receivers missing"
                } else {
                    "the root may be gone or the switch unreachable"
                },
            )
        } else {
            (
                format!(
                    "all {} chunks received, {} of the last {} not known acknowledged",
                    s.chunks,
                    s.chunks - s.done,
                    s.chunks - s.sync_from
                ),
                if s.report.is_some() {
                    "the switch reports receivers missing"
                } else {
                    "neither completion nor report came back"
                },
            )
        };
        Error::GroupStalled(Box::new(GroupStall {
            group: p.group,
            rank: p.rank,
            collective: self.collective.name(),
            root: s.root,
            waited,
            progress,
            missing,
            reason,
            open: SeqList::new(open),
        }))
    }

    fn check_done(&mut self, now: Instant) {
        if self.outcome.is_none() && self.finished() {
            self.stats.elapsed = now.saturating_duration_since(self.started);
            self.outcome = Some(Ok(self.stats()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn params(rank: u8) -> GroupParams {
        GroupParams {
            group: 4,
            rank,
            fan_in: 3,
            bytes_per_packet: 10,
            window: 8,
            switch: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1),
        }
    }

    /// The switch's aggregated acknowledgement of `seq` from root 0.
    fn complete(seq: u32) -> Vec<u8> {
        let (slot, slot_version) = params(0).slot(0, seq);
        let repr = Repr {
            kind: Kind::McastAck,
            flags: Flags::default(),
            job: 4,
            rank: 1,
            fan_in: 3,
            op: Op::Sum,
            dtype: DType::Bytes,
            seq,
            slot,
            slot_version,
            count: 0,
            exponent: 0,
            root: 0,
            bitmap: 0b110,
        };
        let mut buf = vec![0; HEADER_LEN];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        buf
    }

    fn sent(engine: &mut GroupEngine<'_>, now: Instant) -> Vec<(u32, Flags)> {
        let mut buf = [0u8; 2048];
        let mut out = Vec::new();
        while let Some(len) = engine.poll_transmit(now, &mut buf) {
            let p = Packet::new_checked(&buf[..len]).unwrap();
            out.push((p.seq(), p.flags()));
        }
        out
    }

    #[test]
    fn a_chunk_three_behind_completed_ones_goes_again_before_its_timeout() {
        let now = Instant::now();
        let mut data = vec![7u8; 200];
        // Every slot open: the window is not what this is about.
        let config = Config {
            queue_target: None,
            ..Config::default()
        };
        let mut root = GroupEngine::new(
            params(0),
            config,
            GroupCollective::Broadcast { root: 0 },
            &mut data,
            &mut GroupState::default(),
            now,
        )
        .unwrap();
        let first: Vec<u32> = sent(&mut root, now).iter().map(|s| s.0).collect();
        assert_eq!(first, (0..8).collect::<Vec<_>>(), "a window of 8");
        // Chunks 1 and 2 complete: not yet enough to give chunk 0 up, and
        // chunk 8 (in chunk 0's slot) waits for it.
        for seq in [1, 2] {
            root.handle_packet(now, &complete(seq));
        }
        assert_eq!(sent(&mut root, now), []);
        // The third chunk after it completes: chunk 0 goes again at once.
        root.handle_packet(now, &complete(3));
        assert_eq!(sent(&mut root, now), [(0, Flags(Flags::RETRANSMIT))]);
        assert_eq!(root.stats().retransmissions, 1);
        // Only once: more completions do not resend it again.
        root.handle_packet(now, &complete(4));
        assert_eq!(sent(&mut root, now), []);
        // Once it completes, the chunks waiting for its slot and the
        // following ones go out.
        root.handle_packet(now, &complete(0));
        let next: Vec<u32> = sent(&mut root, now).iter().map(|s| s.0).collect();
        assert_eq!(next, [8, 9, 10, 11, 12]);
        assert!(root.poll_timeout().unwrap() > now);
    }
}

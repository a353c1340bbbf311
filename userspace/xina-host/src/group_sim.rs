//! Multicast groups in simulation: the switch's group semantics in plain
//! Rust and a cluster of [`GroupEngine`]s over the seeded lossy [`Network`].
//!
//! - [`GroupSwitchModel`]: replication, acknowledgement aggregation,
//!   selective retransmission and reports, as the XDP dataplane implements
//!   them (the reference its tests are written against).
//! - [`GroupCluster`]: `fan_in` members, the model and the network in one
//!   discrete-event loop; member state and the switch's slots persist from
//!   call to call.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use xina_proto::header::HEADER_LEN;
use xina_proto::{Flags, Kind, MAX_RANKS, Packet, Repr};

use crate::engine::{Config, MAX_DATAGRAM_LEN, Stats};
use crate::error::Error;
use crate::group::{GroupCollective, GroupEngine, GroupParams, GroupState};
use crate::sim::{Endpoint, LinkConfig, Network, Stalled};

/// What the group switch model has done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSwitchStats {
    /// First transmissions replicated to every receiver.
    pub replicated: u64,
    /// Retransmissions replicated to the missing receivers only.
    pub resent: u64,
    /// Acknowledgements recorded that did not complete their chunk.
    pub acks_consumed: u64,
    /// Chunks whose last acknowledgement arrived.
    pub acks_completed: u64,
    /// Retransmissions and repeated acknowledgements answered from a
    /// complete slot.
    pub from_cache: u64,
    /// Missing-receiver reports sent (to a sender or a receiver).
    pub reports: u64,
    /// Datagrams for a chunk the slot no longer (or not yet) holds.
    pub stale: u64,
    /// Data copies sent to each rank.
    pub copies_to: [u64; MAX_RANKS],
}

impl Default for GroupSwitchStats {
    fn default() -> Self {
        Self {
            replicated: 0,
            resent: 0,
            acks_consumed: 0,
            acks_completed: 0,
            from_cache: 0,
            reports: 0,
            stale: 0,
            copies_to: [0; MAX_RANKS],
        }
    }
}

/// One slot copy's acknowledgement state.
#[derive(Clone, Copy, Debug)]
struct AckSlot {
    seq: u32,
    root: u8,
    acked: u64,
    complete: bool,
    sync: bool,
}

/// The switch's multicast-group semantics for one group.
#[derive(Clone, Debug)]
pub struct GroupSwitchModel {
    group: u32,
    fan_in: u8,
    window: u32,
    copies: HashMap<(u32, bool), AckSlot>,
    stats: GroupSwitchStats,
}

impl GroupSwitchModel {
    /// A group of `fan_in` members, every one a sender, `window` slots per rank.
    pub fn new(group: u32, fan_in: u8, window: u32) -> Self {
        Self {
            group,
            fan_in,
            window,
            copies: HashMap::new(),
            stats: GroupSwitchStats::default(),
        }
    }

    /// What the model has done so far.
    pub const fn stats(&self) -> &GroupSwitchStats {
        &self.stats
    }

    fn receivers(&self, root: u8) -> u64 {
        let all = if usize::from(self.fan_in) >= MAX_RANKS {
            u64::MAX
        } else {
            (1 << self.fan_in) - 1
        };
        all & !(1 << root)
    }

    /// Takes a datagram from a member and returns the datagrams the switch
    /// sends, each with the rank it goes to.
    pub fn handle(&mut self, datagram: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let Some(repr) = Packet::new_checked(datagram)
            .ok()
            .and_then(|p| Repr::parse(&p).ok())
        else {
            return Vec::new();
        };
        if repr.job != self.group || repr.rank >= self.fan_in || repr.root >= self.fan_in {
            return Vec::new();
        }
        let w = self.window;
        let in_window = repr.slot / w == u32::from(repr.root);
        if !in_window {
            return Vec::new();
        }
        let key = (repr.slot, repr.slot_version);
        let receivers = self.receivers(repr.root);
        match repr.kind {
            Kind::McastData if repr.rank == repr.root => {
                let held = self.copies.get(&key).copied();
                match held {
                    Some(c) if c.seq == repr.seq && c.root == repr.root => {
                        if c.complete {
                            self.stats.from_cache += 1;
                            let ack = ack(&repr, Flags::FROM_CACHE | sync_bit(c.sync), c.acked);
                            vec![(repr.root, ack)]
                        } else {
                            self.stats.resent += 1;
                            let missing = receivers & !c.acked;
                            let mut out = self.copies_of(datagram, &repr, missing, Flags::MISSING);
                            out.push((repr.root, ack(&repr, Flags::MISSING, missing)));
                            self.stats.reports += 1;
                            out
                        }
                    }
                    // Only the copy's next chunk, `seq + 2W`, takes it over.
                    Some(c) if c.seq.wrapping_add(2 * w) != repr.seq => {
                        self.stats.stale += 1;
                        Vec::new()
                    }
                    _ => {
                        self.copies.insert(
                            key,
                            AckSlot {
                                seq: repr.seq,
                                root: repr.root,
                                acked: 0,
                                complete: false,
                                sync: repr.flags.contains(Flags::SYNC),
                            },
                        );
                        self.stats.replicated += 1;
                        self.copies_of(datagram, &repr, receivers, 0)
                    }
                }
            }
            Kind::McastAck if repr.rank != repr.root => {
                let Some(c) = self.copies.get_mut(&key) else {
                    self.stats.stale += 1;
                    return Vec::new();
                };
                if c.seq != repr.seq || c.root != repr.root {
                    self.stats.stale += 1;
                    return Vec::new();
                }
                let bit = 1 << repr.rank;
                if c.acked & bit != 0 {
                    if c.complete {
                        self.stats.from_cache += 1;
                        let flags = Flags::FROM_CACHE | sync_bit(c.sync);
                        return vec![(repr.rank, ack(&repr, flags, c.acked))];
                    }
                    self.stats.reports += 1;
                    let missing = receivers & !c.acked;
                    return vec![(repr.rank, ack(&repr, Flags::MISSING, missing))];
                }
                c.acked |= bit;
                if c.acked != receivers {
                    self.stats.acks_consumed += 1;
                    return Vec::new();
                }
                c.complete = true;
                self.stats.acks_completed += 1;
                let done = ack(&repr, sync_bit(c.sync), c.acked);
                if c.sync {
                    (0..self.fan_in).map(|r| (r, done.clone())).collect()
                } else {
                    vec![(repr.root, done)]
                }
            }
            _ => Vec::new(),
        }
    }

    /// The copies of a data packet for the ranks in `to`.
    fn copies_of(
        &mut self,
        datagram: &[u8],
        repr: &Repr,
        to: u64,
        flags: u8,
    ) -> Vec<(u8, Vec<u8>)> {
        let mut copy = datagram[..repr.buffer_len()].to_vec();
        let mut packet = Packet::new_unchecked(&mut copy[..]);
        packet.set_bitmap(to);
        packet.set_flags(Flags(repr.flags.0 & !Flags::MISSING | flags));
        (0..self.fan_in)
            .filter(|r| to & (1 << r) != 0)
            .map(|r| {
                self.stats.copies_to[usize::from(r)] += 1;
                (r, copy.clone())
            })
            .collect()
    }
}

const fn sync_bit(sync: bool) -> u8 {
    if sync { Flags::SYNC } else { 0 }
}

/// An acknowledgement from the switch answering `to`.
fn ack(to: &Repr, flags: u8, bitmap: u64) -> Vec<u8> {
    let repr = Repr {
        kind: Kind::McastAck,
        flags: Flags(flags),
        count: 0,
        bitmap,
        ..*to
    };
    let mut buf = vec![0; HEADER_LEN];
    repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
    buf
}

/// The setup of a [`GroupCluster`].
#[derive(Clone, Debug)]
pub struct GroupClusterConfig {
    pub group: u32,
    pub fan_in: u8,
    pub bytes_per_packet: u16,
    pub window: u32,
    pub engine: Config,
    pub link: LinkConfig,
    pub seed: u64,
    /// Ranks that never run (bit per rank).
    pub dead: u64,
    /// Ranks that stop answering after this many datagrams received.
    pub dies_after: Option<(u8, u64)>,
    /// Most simulated time per call.
    pub time_limit: Duration,
}

impl GroupClusterConfig {
    /// A perfect network and the default engine config.
    pub fn new(fan_in: u8, bytes_per_packet: u16, window: u32) -> Self {
        Self {
            group: 7,
            fan_in,
            bytes_per_packet,
            window,
            engine: Config::default(),
            link: LinkConfig::perfect(),
            seed: 0,
            dead: 0,
            dies_after: None,
            time_limit: Duration::from_secs(600),
        }
    }

    fn params(&self, rank: u8) -> GroupParams {
        GroupParams {
            group: self.group,
            rank,
            fan_in: self.fan_in,
            bytes_per_packet: self.bytes_per_packet,
            window: self.window,
            switch: std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0),
        }
    }
}

/// What one call of every member gave.
#[derive(Debug)]
pub struct GroupRound {
    /// Each rank's outcome (`None` for a dead rank).
    pub outcomes: Vec<Option<Result<Stats, Error>>>,
    /// Simulated time until the last outcome.
    pub elapsed: Duration,
}

/// Group members, the switch model and a lossy network in simulated time.
#[derive(Debug)]
pub struct GroupCluster {
    config: GroupClusterConfig,
    switch: GroupSwitchModel,
    net: Network,
    states: Vec<GroupState>,
    received: Vec<u64>,
    now: Instant,
}

impl GroupCluster {
    pub fn new(config: GroupClusterConfig) -> Self {
        let net = Network::new(config.link, config.seed);
        Self {
            switch: GroupSwitchModel::new(config.group, config.fan_in, config.window),
            states: (0..config.fan_in).map(|_| GroupState::default()).collect(),
            received: vec![0; usize::from(config.fan_in)],
            net,
            config,
            now: Instant::now(),
        }
    }

    /// The switch model.
    pub const fn switch(&self) -> &GroupSwitchModel {
        &self.switch
    }

    /// What member `rank` carries from call to call (round trips, window).
    pub fn state(&self, rank: u8) -> &GroupState {
        &self.states[usize::from(rank)]
    }

    /// The network.
    pub const fn network(&self) -> &Network {
        &self.net
    }

    /// Runs `collective` on every live member, `bufs[r]` being rank `r`'s buffer.
    ///
    /// # Errors
    /// [`Stalled`] if the loop ran out of events or simulated time.
    pub fn run(
        &mut self,
        collective: GroupCollective,
        bufs: &mut [Vec<u8>],
    ) -> Result<GroupRound, Stalled> {
        let ranks = usize::from(self.config.fan_in);
        assert_eq!(bufs.len(), ranks, "one buffer per rank");
        let start = self.now;
        let limit = start + self.config.time_limit;
        let live = |r: usize| self.config.dead & (1 << r) == 0;
        let mut engines: Vec<Option<GroupEngine<'_>>> = Vec::with_capacity(ranks);
        for ((r, buf), rank) in bufs.iter_mut().enumerate().zip(0u8..) {
            engines.push(if live(r) {
                Some(
                    GroupEngine::new(
                        self.config.params(rank),
                        self.config.engine,
                        collective,
                        buf,
                        &mut self.states[r],
                        start,
                    )
                    .expect("a valid call"),
                )
            } else {
                None
            });
        }
        let mut outcomes: Vec<Option<Result<Stats, Error>>> = (0..ranks).map(|_| None).collect();
        let mut buf = vec![0; MAX_DATAGRAM_LEN];
        let mut events = 0u64;
        loop {
            events += 1;
            let now = self.now;
            for (engine, rank) in engines.iter_mut().zip(0u8..) {
                let Some(engine) = engine else { continue };
                if engine.poll_timeout().is_some_and(|t| t <= now) {
                    engine.handle_timeout(now);
                }
                while let Some(len) = engine.poll_transmit(now, &mut buf) {
                    self.net.send(
                        now,
                        Endpoint::Rank(rank),
                        Endpoint::Switch,
                        buf[..len].to_vec(),
                    );
                }
            }
            let mut arrived = false;
            while let Some((to, datagram)) = self.net.pop_arrived(now) {
                arrived = true;
                match to {
                    Endpoint::Switch => {
                        for (rank, out) in self.switch.handle(&datagram) {
                            self.net
                                .send(now, Endpoint::Switch, Endpoint::Rank(rank), out);
                        }
                    }
                    Endpoint::Rank(rank) => {
                        let r = usize::from(rank);
                        self.received[r] += 1;
                        let dead = self
                            .config
                            .dies_after
                            .is_some_and(|(d, n)| d == rank && self.received[r] > n);
                        if dead {
                            engines[r] = None;
                        } else if let Some(engine) = engines[r].as_mut() {
                            engine.handle_packet(now, &datagram);
                        }
                    }
                }
            }
            for r in 0..ranks {
                if let Some(engine) = engines[r].as_mut()
                    && let Some(outcome) = engine.take_outcome()
                {
                    outcomes[r] = Some(outcome);
                    let engine = engines[r].take().expect("just used");
                    self.states[r] = engine.into_state();
                }
            }
            let pending: Vec<u8> = (0..self.config.fan_in)
                .filter(|&r| engines[usize::from(r)].is_some())
                .collect();
            if pending.is_empty() {
                return Ok(GroupRound {
                    outcomes,
                    elapsed: now - start,
                });
            }
            if arrived {
                continue;
            }
            let next = engines
                .iter()
                .flatten()
                .filter_map(GroupEngine::poll_timeout)
                .chain(self.net.next_arrival())
                .min();
            let stalled = |reason| Stalled {
                reason,
                elapsed: now - start,
                events,
                pending: pending.clone(),
            };
            match next {
                None => return Err(stalled("nothing left to happen")),
                Some(t) if t > limit => return Err(stalled("time limit")),
                Some(t) => self.now = t.max(now),
            }
        }
    }
}

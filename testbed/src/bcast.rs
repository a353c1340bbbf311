//! Host-based broadcast (and allgather) baselines over TCP: what xina's
//! multicast groups are measured against (`xina-testbed bench bcast`).
//!
//! Every rank holds one TCP connection to every other rank (a full mesh, set
//! up once by [`MeshRank::connect`]); a broadcast uses the connections its
//! [`Algorithm`] needs and leaves the rest idle:
//!
//! ```text
//!   unicast, root 0        tree (binomial), root 0               once, root 0
//!
//!    ┌──── 0 ────┐              0                                   0
//!    │   ╱   ╲   │          ╱   │   ╲     round 0: 0→1              │
//!    1  2     3  4         1    2    4    round 1: 0→2, 1→3         1
//!                         ╱ ╲   │         round 2: 0→4, 1→5, 2→6,
//!                        3   5  6                  3→7
//!                        │
//!                        7
//! ```
//!
//! - [`Algorithm::Unicast`]: the root sends the whole buffer to every other
//!   rank, over one connection each, all at once: one thread, non-blocking
//!   sockets, every turn writes to each connection what its socket takes.
//! - [`Algorithm::Tree`]: a binomial tree. With `v = (rank - root) mod n`,
//!   in round `k` every `v < 2^k` (which has the data) sends to `v + 2^k`.
//!   So `v > 0` receives from `v - 2^⌊log2 v⌋` and sends to `v + 2^j` for
//!   every `j > ⌊log2 v⌋` with `v + 2^j < n`; the root sends to every
//!   `2^j < n`. Forwarding is *pipelined*, not round by round: a rank
//!   forwards each byte range to all its children as soon as it has read
//!   it from its parent (at the granularity of what one `read` returns), and
//!   feeds its children concurrently. The tree's depth, `⌈log2 n⌉`, is then
//!   paid once per read, not once per buffer.
//! - [`Algorithm::Once`]: the root sends the buffer to one rank,
//!   `(root + 1) mod n`; the others take no part. This is the time a network
//!   multicast could at best reach: the buffer crossing the wire once.
//!
//! [`MeshRank::allgather_ring`] is a ring allgather over the same mesh (each
//! rank sends to the next and receives from the previous, pipelined), the
//! host-based counterpart of every rank broadcasting its part at once.
//!
//! In every algorithm a rank reads from at most one parent and writes to
//! its children in one thread on non-blocking sockets, sleeping in `poll(2)`
//! only when nothing can move; Nagle's algorithm is off (`TCP_NODELAY`). A
//! receiver records the [`Instant`] its last byte arrived
//! ([`Completion::received`]), which is what a benchmark takes the slowest
//! of. A peer that closes its connection fails the call at once with
//! [`Error::Closed`]; one that neither sends nor takes data for the
//! configured timeout fails it with [`Error::Stalled`]. After a failed call
//! the mesh's byte streams are out of step and it must not be used again.
//!
//! Connections are matched to ranks by a 4-byte hello (the connecting
//! rank's number, little-endian) that the accepting rank checks against the
//! peer's address.

use std::{
    io::{self, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use crate::ring::total_retrans;

/// The TCP port every rank's mesh listener uses (each in its own namespace).
pub const BCAST_PORT: u16 = 5101;

/// How long a rank waits between attempts to connect to a peer that is not
/// listening yet, or to accept a peer that has not connected yet.
const CONNECT_RETRY: Duration = Duration::from_millis(10);

/// A host-based broadcast algorithm over the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The root sends the whole buffer to every rank, concurrently.
    Unicast,
    /// A binomial tree, forwarding pipelined.
    Tree,
    /// The root sends the buffer to `(root + 1) mod n` only.
    Once,
}

/// Whom a rank receives from and sends to in one broadcast.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    /// The rank this one receives the buffer from; `None` for the root and
    /// for ranks that take no part.
    pub parent: Option<usize>,
    /// The ranks this one sends the buffer to.
    pub children: Vec<usize>,
}

impl Algorithm {
    /// `rank`'s role in a broadcast from `root` among `n` ranks.
    ///
    /// # Panics
    /// If `root` or `rank` is not below `n`.
    pub fn role(self, n: usize, root: usize, rank: usize) -> Role {
        assert!(root < n && rank < n, "root {root}, rank {rank} of {n}");
        let v = (rank + n - root) % n;
        let actual = |w: usize| (w + root) % n;
        match self {
            Self::Unicast if v == 0 => Role {
                parent: None,
                children: (1..n).map(actual).collect(),
            },
            Self::Unicast => Role {
                parent: Some(root),
                children: Vec::new(),
            },
            Self::Once => match v {
                0 if n > 1 => Role {
                    parent: None,
                    children: vec![actual(1)],
                },
                1 => Role {
                    parent: Some(root),
                    children: Vec::new(),
                },
                _ => Role::default(),
            },
            Self::Tree => {
                // Rounds before the one in which `v` receives (none for the
                // root): its children are `v + 2^j` for the later rounds.
                let (parent, first_round) = if v == 0 {
                    (None, 0)
                } else {
                    let k = v.ilog2();
                    (Some(actual(v - (1 << k))), k + 1)
                };
                let children = (first_round..usize::BITS)
                    .map_while(|j| v.checked_add(1 << j).filter(|&c| c < n))
                    .map(actual)
                    .collect();
                Role { parent, children }
            }
        }
    }

    /// The name used in tables and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unicast => "unicast",
            Self::Tree => "tree",
            Self::Once => "once",
        }
    }
}

/// Why a broadcast or the mesh's set-up failed. Every variant names the
/// rank that saw it and, where there is one, the peer involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("mesh of {n} ranks: rank {rank} is out of range")]
    BadRank { rank: usize, n: usize },
    #[error("rank {rank}: listening on {addr}")]
    Listen {
        rank: usize,
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("rank {rank}: connecting to rank {peer} ({addr}) for {waited:?}")]
    Connect {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        waited: Duration,
        #[source]
        source: io::Error,
    },
    #[error("rank {rank}: ranks {missing:?} did not connect within {waited:?}")]
    NoConnection {
        rank: usize,
        missing: Vec<usize>,
        waited: Duration,
    },
    #[error("rank {rank}: a connection from {got} said it is rank {claimed}, {why}")]
    BadHello {
        rank: usize,
        got: SocketAddr,
        claimed: u32,
        why: &'static str,
    },
    #[error("rank {rank}: {action} (from {from})")]
    Hello {
        rank: usize,
        from: SocketAddr,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("rank {rank}: {action} (rank {peer}, {addr})")]
    Io {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("rank {rank}: rank {peer} ({addr}) closed the connection after {done} of {len} bytes")]
    Closed {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        done: usize,
        len: usize,
    },
    #[error("rank {rank}: {what} rank {peer} ({addr}) for {waited:?}, after {done} of {len} bytes")]
    Stalled {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        /// "no data from" or "no room towards".
        what: &'static str,
        waited: Duration,
        done: usize,
        len: usize,
    },
}

/// What one rank's part of a broadcast did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// When this rank's last byte arrived; `None` when it received nothing
    /// (the root, a rank that takes no part, or an empty buffer).
    pub received: Option<Instant>,
    /// Payload bytes this rank sent, over all its children.
    pub bytes_sent: u64,
    /// Segments TCP retransmitted on this rank's sending connections during
    /// the call (`tcpi_total_retrans` of `TCP_INFO`, before and after).
    pub retransmits: u64,
}

/// One rank of a full mesh of TCP connections.
#[derive(Debug)]
pub struct MeshRank {
    rank: usize,
    /// By rank; `None` at this rank's own index.
    peers: Vec<Option<Peer>>,
    timeout: Duration,
}

#[derive(Debug)]
struct Peer {
    rank: usize,
    addr: SocketAddrV4,
    stream: TcpStream,
}

impl Peer {
    fn io_error(&self, rank: usize, action: &'static str) -> impl FnOnce(io::Error) -> Error {
        let (peer, addr) = (self.rank, self.addr);
        move |source| Error::Io {
            rank,
            peer,
            addr,
            action,
            source,
        }
    }
}

impl MeshRank {
    /// Binds rank `rank`'s listener at `addrs[rank]`; call it in the rank's
    /// network namespace, before the other ranks call [`MeshRank::connect`]
    /// (or soon enough: connecting retries until the timeout).
    ///
    /// # Errors
    /// [`Error::BadRank`], [`Error::Listen`].
    pub fn listen(rank: usize, addrs: &[SocketAddrV4]) -> Result<TcpListener, Error> {
        let addr = *addrs.get(rank).ok_or(Error::BadRank {
            rank,
            n: addrs.len(),
        })?;
        TcpListener::bind(addr).map_err(|source| Error::Listen { rank, addr, source })
    }

    /// Connects rank `rank` of the mesh of `addrs` (rank `i` listens at
    /// `addrs[i]`) to every other rank: it connects to each lower rank
    /// (retrying while that one is not listening) and accepts each higher
    /// rank on `listener`. Setting up takes at most about `timeout`, which
    /// is also how long a broadcast waits for a peer that does not move.
    ///
    /// # Errors
    /// [`Error::BadRank`], [`Error::Connect`], [`Error::NoConnection`],
    /// [`Error::BadHello`], [`Error::Hello`], [`Error::Io`].
    pub fn connect(
        rank: usize,
        addrs: &[SocketAddrV4],
        listener: &TcpListener,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let n = addrs.len();
        if rank >= n {
            return Err(Error::BadRank { rank, n });
        }
        let mut peers: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
        for (peer, slot) in peers.iter_mut().enumerate().take(rank) {
            *slot = Some(connect_to(rank, peer, addrs, timeout)?);
        }
        for peer in accept_from_higher(rank, addrs, listener, timeout)? {
            let at = peer.rank;
            peers[at] = Some(peer);
        }
        for peer in peers.iter().flatten() {
            peer.stream
                .set_nodelay(true)
                .map_err(peer.io_error(rank, "setting TCP_NODELAY"))?;
            peer.stream
                .set_nonblocking(true)
                .map_err(peer.io_error(rank, "making the socket non-blocking"))?;
        }
        Ok(Self {
            rank,
            peers,
            timeout,
        })
    }

    /// This rank's number.
    pub const fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the mesh.
    pub fn ranks(&self) -> usize {
        self.peers.len()
    }

    /// Takes part in a broadcast of `data` from `root` by `algorithm`: the
    /// root's `data` is sent, every receiver's `data` is overwritten with
    /// it. Every rank must call it with the same algorithm, root and length,
    /// in the same order of calls. Returns when this rank has received
    /// everything and passed everything on to its children (the children may
    /// not have read it yet).
    ///
    /// # Errors
    /// [`Error::BadRank`] for a root out of range, [`Error::Closed`] when a
    /// peer closes its connection, [`Error::Stalled`] when one does not move
    /// for the timeout, [`Error::Io`] on any other socket error.
    pub fn broadcast(
        &mut self,
        algorithm: Algorithm,
        root: usize,
        data: &mut [u8],
    ) -> Result<Completion, Error> {
        let (rank, n, len) = (self.rank, self.ranks(), data.len());
        if root >= n {
            return Err(Error::BadRank { rank: root, n });
        }
        let role = algorithm.role(n, root, rank);
        let peer = |r: usize| {
            self.peers[r]
                .as_ref()
                .expect("a role names other ranks only")
        };
        let parent = role.parent.map(peer);
        let children: Vec<&Peer> = role.children.iter().map(|&c| peer(c)).collect();
        let retrans = |children: &[&Peer]| -> Result<u64, Error> {
            children.iter().try_fold(0u64, |sum, c| {
                let r = total_retrans(&c.stream).map_err(c.io_error(rank, "reading TCP_INFO"))?;
                Ok(sum + u64::from(r))
            })
        };
        let retrans_before = retrans(&children)?;

        // Bytes held (read from the parent, or all of them at the root) and
        // bytes sent to each child.
        let mut held = if parent.is_some() { 0 } else { len };
        let mut sent = vec![0usize; children.len()];
        let mut received = None;
        let mut want_write = vec![false; children.len()];
        let mut last_progress = Instant::now();
        loop {
            if held == len && sent.iter().all(|&s| s == len) {
                break;
            }
            let mut progress = false;
            let mut want_read = false;
            if let Some(p) = parent.filter(|_| held < len) {
                match (&p.stream).read(&mut data[held..]) {
                    Ok(0) => return Err(closed(rank, p, held, len)),
                    Ok(k) => {
                        held += k;
                        if held == len {
                            received = Some(Instant::now());
                        }
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_read = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(closed_or_io(e, rank, p, "receiving", held, len)),
                }
            }
            for (i, c) in children.iter().enumerate() {
                want_write[i] = false;
                if sent[i] == held {
                    continue;
                }
                match (&c.stream).write(&data[sent[i]..held]) {
                    Ok(0) => return Err(closed(rank, c, sent[i], len)),
                    Ok(k) => {
                        sent[i] += k;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_write[i] = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(closed_or_io(e, rank, c, "sending", sent[i], len)),
                }
            }
            if progress {
                last_progress = Instant::now();
                continue;
            }
            let waited = last_progress.elapsed();
            if waited >= self.timeout {
                // Waiting for data is what holds a broadcast up; a full send
                // buffer only follows from a child that stopped reading.
                let (p, what, done) = match (
                    parent.filter(|_| want_read),
                    want_write.iter().position(|&w| w),
                ) {
                    (Some(p), _) => (p, "no data from", held),
                    (None, Some(i)) => (children[i], "no room towards", sent[i]),
                    // Nothing to wait for cannot stall; the loop ends above.
                    (None, None) => break,
                };
                return Err(Error::Stalled {
                    rank,
                    peer: p.rank,
                    addr: p.addr,
                    what,
                    waited,
                    done,
                    len,
                });
            }
            let reading = parent.filter(|_| want_read);
            let writing = children
                .iter()
                .zip(&want_write)
                .filter_map(|(c, &w)| w.then_some(*c));
            wait(reading, writing, self.timeout - waited).map_err(|source| Error::Io {
                rank,
                peer: rank,
                addr: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
                action: "poll",
                source,
            })?;
        }
        let retrans_after = retrans(&children)?;
        Ok(Completion {
            received,
            bytes_sent: sent.iter().map(|&s| s as u64).sum(),
            retransmits: retrans_after.saturating_sub(retrans_before),
        })
    }

    /// Ring allgather of `data` in place: rank `i` of `n` contributes part
    /// `i`, bytes `i·len/n .. (i+1)·len/n` (parts differ by at most a byte;
    /// some are empty when `len < n`), and every rank ends with every part.
    /// Every rank must call it with the same length.
    ///
    /// Over the mesh's connections to the next rank (`rank + 1 mod n`, it
    /// sends) and the previous one (it receives), in `n - 1` steps: in step
    /// `s` a rank sends part `rank - s` and receives part `rank - s - 1`
    /// (mod `n`). What it sends in step `s ≥ 1` is what it received in step
    /// `s - 1`, so its send stream is its own part followed by its receive
    /// stream, and bytes go on as soon as they have arrived (pipelined, as
    /// [`crate::ring`]). [`Completion::received`] is when the last part's
    /// last byte arrived.
    ///
    /// # Errors
    /// As [`MeshRank::broadcast`].
    pub fn allgather_ring(&mut self, data: &mut [u8]) -> Result<Completion, Error> {
        let (rank, n, len) = (self.rank, self.ranks(), data.len());
        if n == 1 {
            return Ok(Completion {
                received: None,
                bytes_sent: 0,
                retransmits: 0,
            });
        }
        let part = |p: usize| p * len / n..(p + 1) * len / n;
        let back = |k: usize| (rank + n - k % n) % n;
        // Buffer ranges in stream order: what is received, step by step,
        // and what is sent (own part, then what was received).
        let recv_parts: Vec<_> = (1..n).map(|k| part(back(k))).collect();
        let send_parts: Vec<_> = std::iter::once(part(rank))
            .chain(recv_parts[..n - 2].iter().cloned())
            .collect();
        let total =
            |parts: &[std::ops::Range<usize>]| parts.iter().map(ExactSizeIterator::len).sum();
        let (recv_total, send_total): (usize, usize) = (total(&recv_parts), total(&send_parts));
        let own = part(rank).len();
        let next = self.peers[(rank + 1) % n].as_ref().expect("n > 1");
        let prev = self.peers[back(1)].as_ref().expect("n > 1");
        let retrans_before =
            total_retrans(&next.stream).map_err(next.io_error(rank, "reading TCP_INFO"))?;
        let (mut recvd, mut sent) = (0usize, 0usize);
        let mut received = None;
        let mut last_progress = Instant::now();
        while recvd < recv_total || sent < send_total {
            let mut progress = false;
            let mut want_read = false;
            if recvd < recv_total {
                let (at, room) = locate(&recv_parts, recvd);
                match (&prev.stream).read(&mut data[at..at + room]) {
                    Ok(0) => return Err(closed(rank, prev, recvd, recv_total)),
                    Ok(k) => {
                        recvd += k;
                        if recvd == recv_total {
                            received = Some(Instant::now());
                        }
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_read = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(closed_or_io(e, rank, prev, "receiving", recvd, recv_total));
                    }
                }
            }
            let mut want_write = false;
            // Own part at once; the rest as it arrives.
            let limit = (own + recvd).min(send_total);
            if sent < limit {
                let (at, left) = locate(&send_parts, sent);
                let k = left.min(limit - sent);
                match (&next.stream).write(&data[at..at + k]) {
                    Ok(0) => return Err(closed(rank, next, sent, send_total)),
                    Ok(k) => {
                        sent += k;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_write = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(closed_or_io(e, rank, next, "sending", sent, send_total));
                    }
                }
            }
            if progress {
                last_progress = Instant::now();
                continue;
            }
            let waited = last_progress.elapsed();
            if waited >= self.timeout {
                let (p, what, done, of) = if want_read || !want_write {
                    (prev, "no data from", recvd, recv_total)
                } else {
                    (next, "no room towards", sent, send_total)
                };
                return Err(Error::Stalled {
                    rank,
                    peer: p.rank,
                    addr: p.addr,
                    what,
                    waited,
                    done,
                    len: of,
                });
            }
            wait(
                want_read.then_some(prev),
                want_write.then_some(next).into_iter(),
                self.timeout - waited,
            )
            .map_err(prev.io_error(rank, "poll"))?;
        }
        let retrans_after =
            total_retrans(&next.stream).map_err(next.io_error(rank, "reading TCP_INFO"))?;
        Ok(Completion {
            received,
            bytes_sent: sent as u64,
            retransmits: u64::from(retrans_after.wrapping_sub(retrans_before)),
        })
    }
}

fn closed(rank: usize, peer: &Peer, done: usize, len: usize) -> Error {
    Error::Closed {
        rank,
        peer: peer.rank,
        addr: peer.addr,
        done,
        len,
    }
}

/// A reset or broken connection is the peer going away; anything else is an
/// I/O error.
fn closed_or_io(
    e: io::Error,
    rank: usize,
    peer: &Peer,
    action: &'static str,
    done: usize,
    len: usize,
) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => closed(rank, peer, done, len),
        _ => peer.io_error(rank, action)(e),
    }
}

/// Sleeps until `reading` has data, a socket of `writing` has room, a
/// socket has an error, or `timeout` passes.
fn wait<'a>(
    reading: Option<&Peer>,
    writing: impl Iterator<Item = &'a Peer>,
    timeout: Duration,
) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = reading
        .map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .into_iter()
        .chain(writing.map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        }))
        .collect();
    let ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX);
    let count = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `fds` is a valid array of `count` `pollfd`s that outlives the
    // call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Connects to `peer` and says who this is.
fn connect_to(
    rank: usize,
    peer: usize,
    addrs: &[SocketAddrV4],
    timeout: Duration,
) -> Result<Peer, Error> {
    let addr = addrs[peer];
    let started = Instant::now();
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let attempt = if left.is_zero() {
            Err(io::Error::from(io::ErrorKind::TimedOut))
        } else {
            TcpStream::connect_timeout(&SocketAddr::V4(addr), left)
        };
        match attempt {
            Ok(mut stream) => {
                let hello = u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes();
                stream.write_all(&hello).map_err(|source| Error::Io {
                    rank,
                    peer,
                    addr,
                    action: "sending the hello",
                    source,
                })?;
                return Ok(Peer {
                    rank: peer,
                    addr,
                    stream,
                });
            }
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionRefused
                    && started.elapsed() + CONNECT_RETRY < timeout =>
            {
                std::thread::sleep(CONNECT_RETRY);
            }
            Err(source) => {
                return Err(Error::Connect {
                    rank,
                    peer,
                    addr,
                    waited: started.elapsed(),
                    source,
                });
            }
        }
    }
}

/// Accepts one connection from every rank above `rank`, each identified by
/// its hello and checked against its address.
fn accept_from_higher(
    rank: usize,
    addrs: &[SocketAddrV4],
    listener: &TcpListener,
    timeout: Duration,
) -> Result<Vec<Peer>, Error> {
    let n = addrs.len();
    let mut peers: Vec<Peer> = Vec::with_capacity(n - rank - 1);
    let listen_addr = addrs[rank];
    listener.set_nonblocking(true).map_err(|source| Error::Io {
        rank,
        peer: rank,
        addr: listen_addr,
        action: "making the listener non-blocking",
        source,
    })?;
    let started = Instant::now();
    while peers.len() < n - rank - 1 {
        match listener.accept() {
            Ok((stream, from)) => {
                peers.push(hello_from(rank, addrs, &peers, stream, from, timeout)?);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if started.elapsed() >= timeout {
                    return Err(Error::NoConnection {
                        rank,
                        missing: (rank + 1..n)
                            .filter(|r| peers.iter().all(|p| p.rank != *r))
                            .collect(),
                        waited: started.elapsed(),
                    });
                }
                std::thread::sleep(CONNECT_RETRY);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(Error::Io {
                    rank,
                    peer: rank,
                    addr: listen_addr,
                    action: "accepting",
                    source,
                });
            }
        }
    }
    Ok(peers)
}

/// Reads and checks the hello of a connection `stream` accepted from `from`.
fn hello_from(
    rank: usize,
    addrs: &[SocketAddrV4],
    accepted: &[Peer],
    mut stream: TcpStream,
    from: SocketAddr,
    timeout: Duration,
) -> Result<Peer, Error> {
    let hello_error = |action| {
        move |source| Error::Hello {
            rank,
            from,
            action,
            source,
        }
    };
    stream
        .set_nonblocking(false)
        .map_err(hello_error("setting up the accepted socket"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(hello_error("setting the hello's timeout"))?;
    let mut hello = [0u8; 4];
    stream
        .read_exact(&mut hello)
        .map_err(hello_error("reading the hello"))?;
    stream
        .set_read_timeout(None)
        .map_err(hello_error("clearing the hello's timeout"))?;
    let claimed = u32::from_le_bytes(hello);
    let bad = |why| Error::BadHello {
        rank,
        got: from,
        claimed,
        why,
    };
    let peer = usize::try_from(claimed).map_err(|_| bad("out of range"))?;
    let Some(&addr) = addrs.get(peer).filter(|_| peer > rank) else {
        return Err(bad("not a rank that connects to this one"));
    };
    if accepted.iter().any(|p| p.rank == peer) {
        return Err(bad("which has already connected"));
    }
    if from.ip() != std::net::IpAddr::V4(*addr.ip()) {
        return Err(bad("but that rank's address is another"));
    }
    Ok(Peer {
        rank: peer,
        addr,
        stream,
    })
}

/// Where stream offset `off` lies in the buffer, for a stream made of
/// `parts` in order (`off` below their total): the buffer offset and the
/// bytes left in that part.
fn locate(parts: &[std::ops::Range<usize>], mut off: usize) -> (usize, usize) {
    for p in parts {
        if off < p.len() {
            return (p.start + off, p.len() - off);
        }
        off -= p.len();
    }
    unreachable!("stream offset beyond its parts")
}

/// The addresses of a mesh whose rank `i` listens on `ips[i]`:[`BCAST_PORT`].
pub fn mesh_addrs(ips: impl IntoIterator<Item = Ipv4Addr>) -> Vec<SocketAddrV4> {
    ips.into_iter()
        .map(|ip| SocketAddrV4::new(ip, BCAST_PORT))
        .collect()
}

/// `len` pseudo-random bytes drawn from `seed`: the same for the same
/// arguments, so a receiver's copy can be checked against a fresh one.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    use rand::{Rng as _, SeedableRng as _};
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut bytes[..]);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Algorithm; 3] = [Algorithm::Unicast, Algorithm::Tree, Algorithm::Once];

    /// Every role of every algorithm fits together: a rank's parent lists it
    /// as a child and nobody else does, every rank but the root has a parent
    /// (`once`: only the one receiver), and following parents reaches the
    /// root without a cycle.
    #[test]
    fn roles_form_a_tree_rooted_at_the_root() {
        for algorithm in ALL {
            for n in 1..=17usize {
                for root in 0..n {
                    let roles: Vec<Role> = (0..n).map(|r| algorithm.role(n, root, r)).collect();
                    assert_eq!(roles[root].parent, None, "{algorithm:?} n {n} root {root}");
                    for (r, role) in roles.iter().enumerate() {
                        let parents: Vec<usize> =
                            (0..n).filter(|&p| roles[p].children.contains(&r)).collect();
                        assert_eq!(
                            parents,
                            role.parent.into_iter().collect::<Vec<_>>(),
                            "{algorithm:?} n {n} root {root} rank {r}"
                        );
                        let takes_part = match algorithm {
                            Algorithm::Once => r == (root + 1) % n,
                            _ => true,
                        };
                        assert_eq!(role.parent.is_some(), r != root && takes_part);
                        let mut at = r;
                        for _ in 0..n {
                            match roles[at].parent {
                                Some(p) => at = p,
                                None => break,
                            }
                        }
                        assert!(
                            roles[at].parent.is_none() && (at == root || !takes_part),
                            "{algorithm:?} n {n} root {root}: rank {r} does not reach the root"
                        );
                    }
                }
            }
        }
    }

    /// The binomial tree's shape: the root's children are `root + 2^j`,
    /// rank `v` (relative to the root) is as many hops from the root as `v`
    /// has one bits, and receives in round `⌊log2 v⌋` (so the last round is
    /// `⌈log2 n⌉ - 1`).
    #[test]
    fn tree_is_binomial() {
        assert_eq!(Algorithm::Tree.role(8, 0, 0).children, vec![1, 2, 4]);
        assert_eq!(Algorithm::Tree.role(8, 0, 1).children, vec![3, 5]);
        assert_eq!(Algorithm::Tree.role(8, 0, 3).children, vec![7]);
        assert_eq!(Algorithm::Tree.role(8, 0, 6).parent, Some(2));
        assert_eq!(Algorithm::Tree.role(8, 5, 5).children, vec![6, 7, 1]);
        assert_eq!(Algorithm::Tree.role(8, 5, 0).parent, Some(6));
        for n in 1..=33usize {
            for root in [0, n / 2, n - 1] {
                for v in 1..n {
                    let mut r = (v + root) % n;
                    let mut hops = 0;
                    while let Some(p) = Algorithm::Tree.role(n, root, r).parent {
                        r = p;
                        hops += 1;
                    }
                    assert_eq!(hops, v.count_ones(), "n {n} root {root} v {v}");
                    // Its parent had the data before round ⌊log2 v⌋: the
                    // parent is below 2^⌊log2 v⌋ (relative to the root).
                    let parent = Algorithm::Tree
                        .role(n, root, (v + root) % n)
                        .parent
                        .unwrap();
                    assert!(
                        (parent + n - root) % n < 1 << v.ilog2(),
                        "n {n} root {root} v {v}"
                    );
                }
            }
        }
    }

    /// Runs `f(rank, mesh)` on every rank of an `n`-rank mesh over
    /// loopback (no namespaces needed), each in its own thread; returns what
    /// each returned, by rank.
    fn on_loopback<T: Send>(n: usize, f: impl Fn(usize, MeshRank) -> T + Sync) -> Vec<T> {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<SocketAddrV4> = listeners
            .iter()
            .map(|l| match l.local_addr().unwrap() {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(a) => panic!("{a}"),
            })
            .collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = listeners
                .iter()
                .enumerate()
                .map(|(rank, listener)| {
                    let (addrs, f) = (&addrs, &f);
                    scope.spawn(move || {
                        f(
                            rank,
                            MeshRank::connect(rank, addrs, listener, Duration::from_secs(10))
                                .unwrap(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Ring allgathers over loopback: every rank ends with every rank's
    /// part, at lengths below, at and above the rank count, call after call.
    #[test]
    fn loopback_allgathers_are_exact() {
        for n in 1..=5usize {
            let lengths = [0usize, 1, 3, n, 7, 4099, 300_001];
            let errors: Vec<String> = on_loopback(n, |rank, mut mesh| {
                let mut errors = Vec::new();
                for &len in &lengths {
                    let full = payload(len as u64, len);
                    let mine = rank * len / n..(rank + 1) * len / n;
                    let mut data: Vec<u8> = full.iter().map(|b| !b).collect();
                    let others = len - mine.len();
                    data[mine.clone()].copy_from_slice(&full[mine]);
                    let done = mesh.allgather_ring(&mut data).unwrap();
                    if data != full || done.received.is_some() != (others > 0) {
                        errors.push(format!("n {n} len {len} rank {rank}"));
                    }
                }
                errors
            })
            .into_iter()
            .flatten()
            .collect();
            assert!(errors.is_empty(), "{errors:?}");
        }
    }

    /// Whole broadcasts over loopback (no namespaces needed): every receiver
    /// gets exactly the root's bytes, for every algorithm, root and rank
    /// count, at odd and empty lengths, call after call on the same mesh.
    #[test]
    fn loopback_broadcasts_are_exact() {
        for n in 1..=5usize {
            let lengths = [0usize, 1, 7, 4099, 300_001];
            let errors: Vec<String> = on_loopback(n, |rank, mut mesh| {
                let mut errors = Vec::new();
                for algorithm in ALL {
                    for root in 0..n {
                        for &len in &lengths {
                            let want = payload((root * 1000 + len) as u64, len);
                            let other: Vec<u8> = want.iter().map(|b| !b).collect();
                            let mut data = if rank == root {
                                want.clone()
                            } else {
                                other.clone()
                            };
                            let done = mesh.broadcast(algorithm, root, &mut data).unwrap();
                            let receives = rank != root
                                && (algorithm != Algorithm::Once || rank == (root + 1) % n);
                            let ok = if receives {
                                data == want && done.received.is_some() == (len > 0)
                            } else {
                                // The root keeps its bytes; a bystander's are untouched.
                                data == *if rank == root { &want } else { &other }
                                    && done.received.is_none()
                            };
                            if !ok {
                                errors.push(format!(
                                    "{algorithm:?} n {n} root {root} len {len} rank {rank}"
                                ));
                            }
                        }
                    }
                }
                errors
            })
            .into_iter()
            .flatten()
            .collect();
            assert!(errors.is_empty(), "{errors:?}");
        }
    }
}

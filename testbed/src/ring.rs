//! A host-based ring allreduce over TCP: the baseline xina is measured
//! against (`xina-testbed bench allreduce`).
//!
//! ```text
//!   rank 0 ──TCP──▶ rank 1 ──TCP──▶ rank 2 ── ... ──▶ rank n-1
//!     ▲                                                  │
//!     └──────────────────────────TCP─────────────────────┘
//! ```
//!
//! Each rank holds one connection to the next rank (it sends there) and one
//! from the previous rank (it receives from there). The buffer of `len`
//! elements is cut into `n` chunks, chunk `c` being elements
//! `c·len/n .. (c+1)·len/n` (so any length works, chunks differ by at most
//! one element and some are empty when `len < n`). The classic algorithm
//! takes `2(n-1)` steps, each moving one chunk to the next rank:
//!
//! - reduce-scatter, steps `s = 0 .. n-2`: send chunk `(r - s) mod n`,
//!   receive chunk `(r - s - 1) mod n` and add it into the buffer; after it
//!   rank `r` holds the complete sum of chunk `(r + 1) mod n`;
//! - allgather, steps `s = n-1 .. 2n-3` (`t = s - (n-1)`): send chunk
//!   `(r + 1 - t) mod n`, receive chunk `(r - t) mod n` and overwrite it.
//!
//! The chunk a rank sends in step `s ≥ 1` is the one it received (and
//! reduced) in step `s - 1`. So the whole send stream of a rank is its first
//! chunk followed by its receive stream lagging one step behind, and it is
//! pipelined at element granularity: bytes of step `s` go out as soon as the
//! same bytes of step `s - 1` have arrived and been added, not when the whole
//! step is done (NCCL's ring pipelines in slices for the same reason).
//! Sending and receiving overlap in one thread: both sockets are
//! non-blocking, every turn writes whatever may and can be written and reads
//! whatever has arrived, and the thread sleeps in `poll(2)` only when neither
//! side can move. Writes are as large as the socket takes; Nagle's algorithm
//! is off (`TCP_NODELAY`).
//!
//! Buffers of at most [`WHOLE_MAX_BYTES`] take another schedule, bound by
//! latency rather than bandwidth: in `n - 1` steps every rank sends the
//! whole buffer it received in the previous step (its own in the first),
//! and adds each buffer it receives into its own. Every contribution then
//! passes every rank once, in `n - 1` hops instead of `2(n-1)`, for
//! `(n-1)·len` elements sent instead of about `2(n-1)·len/n`. Allreduces of
//! at most [`SPIN_MAX_BYTES`] also spin briefly before sleeping in
//! `poll(2)`.
//!
//! A peer that closes its connection (a killed process) fails the call at
//! once with [`Error::Closed`]; a peer that neither sends nor takes data
//! fails it after the configured timeout with [`Error::Stalled`]. Both name
//! the peer.
//!
//! Elements travel in the host's byte order: every rank runs on this machine.

use std::{
    io::{self, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

/// The TCP port every rank listens on (each in its own namespace).
pub const RING_PORT: u16 = 5100;

/// Bytes the receive side stages before adding them into the buffer.
const STAGE_BYTES: usize = 1 << 20;

/// Allreduces of at most this many bytes are latency-bound: a rank that
/// cannot move checks its sockets again for up to [`SPIN`], yielding the CPU
/// in between, before it sleeps in `poll(2)` (as MPI libraries spin in their
/// progress loop). Larger ones sleep at once: their waits are for bandwidth,
/// and spinning would take CPU time from the ranks that move the data.
const SPIN_MAX_BYTES: usize = 64 << 10;

/// Allreduces of at most this many bytes send whole buffers around the ring
/// (`n - 1` hops; see the module docs) instead of reduce-scatter then
/// allgather (`2(n-1)` hops of `len/n`).
pub const WHOLE_MAX_BYTES: usize = 4 << 10;

/// How long a latency-bound rank spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// How long a rank waits between attempts to connect to a peer that is not
/// listening yet.
const CONNECT_RETRY: Duration = Duration::from_millis(10);

/// Why a ring allreduce or its set-up failed. Every variant names the rank
/// that saw it and the peer involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ring of {n} ranks: rank {rank} is out of range")]
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
    #[error("rank {rank}: rank {peer} ({addr}) did not connect within {waited:?}")]
    NoConnection {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        waited: Duration,
    },
    #[error("rank {rank}: a connection from {got}, expected rank {peer} ({addr})")]
    WrongPeer {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        got: SocketAddr,
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
    #[error("rank {rank}: rank {peer} ({addr}) closed the connection in step {step} of {steps}")]
    Closed {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        step: usize,
        steps: usize,
    },
    #[error("rank {rank}: {what} rank {peer} ({addr}) for {waited:?}, in step {step} of {steps}")]
    Stalled {
        rank: usize,
        peer: usize,
        addr: SocketAddrV4,
        /// "no data from" or "no room towards".
        what: &'static str,
        waited: Duration,
        step: usize,
        steps: usize,
    },
}

/// What one [`RingRank::allreduce_i32`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Payload bytes sent to the next rank.
    pub bytes_sent: u64,
    /// Segments TCP retransmitted on the connection to the next rank since
    /// the previous call ended (or the ring connected): `tcpi_total_retrans`
    /// of `TCP_INFO`, read once at the end of each call, since every read
    /// takes the socket's lock (two per call made an 8-byte allreduce at 2
    /// ranks about a quarter slower).
    pub retransmits: u64,
    pub elapsed: Duration,
}

/// One rank of a ring, connected to its neighbours.
#[derive(Debug)]
pub struct RingRank {
    rank: usize,
    n: usize,
    /// Connection to rank `(rank + 1) mod n` (we send).
    next: Option<Peer>,
    /// Connection from rank `(rank - 1) mod n` (we receive).
    prev: Option<Peer>,
    timeout: Duration,
    /// Staged received bytes of a reduce-scatter step, as whole elements.
    stage: Vec<i32>,
    /// `tcpi_total_retrans` of `next` at the end of the last call.
    retrans_seen: u32,
}

#[derive(Debug)]
struct Peer {
    rank: usize,
    addr: SocketAddrV4,
    stream: TcpStream,
}

impl Peer {
    fn io_error(&self, rank: usize, action: &'static str) -> impl FnOnce(io::Error) -> Error {
        io_error(rank, self.rank, self.addr, action)
    }
}

/// Makes an [`Error::Io`] of `rank`'s `action` towards `peer`.
fn io_error(
    rank: usize,
    peer: usize,
    addr: SocketAddrV4,
    action: &'static str,
) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io {
        rank,
        peer,
        addr,
        action,
        source,
    }
}

impl RingRank {
    /// Binds rank `rank`'s listener at `addrs[rank]`; call it in the rank's
    /// network namespace, before any rank calls [`RingRank::connect`] (or
    /// soon enough: connecting retries until the timeout).
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

    /// Connects rank `rank` of the ring of `addrs` (rank `i` listens at
    /// `addrs[i]`) to its neighbours: connects to the next rank, retrying
    /// while it is not listening, and accepts the previous rank's connection
    /// on `listener`. Each takes at most `timeout`, which is also how long an
    /// allreduce waits for a peer that does not move before it fails.
    ///
    /// # Errors
    /// [`Error::BadRank`], [`Error::Connect`], [`Error::NoConnection`],
    /// [`Error::WrongPeer`], [`Error::Io`].
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
        let (next, prev) = if n == 1 {
            (None, None)
        } else {
            let next = connect_to(rank, (rank + 1) % n, addrs, timeout)?;
            let prev = accept_from(rank, (rank + n - 1) % n, addrs, listener, timeout)?;
            (Some(next), Some(prev))
        };
        for peer in next.iter().chain(&prev) {
            peer.stream
                .set_nodelay(true)
                .map_err(peer.io_error(rank, "setting TCP_NODELAY"))?;
            peer.stream
                .set_nonblocking(true)
                .map_err(peer.io_error(rank, "making the socket non-blocking"))?;
        }
        let retrans_seen = next
            .as_ref()
            .map(|p| total_retrans(&p.stream).map_err(p.io_error(rank, "reading TCP_INFO")))
            .transpose()?
            .unwrap_or(0);
        Ok(Self {
            rank,
            n,
            next,
            prev,
            timeout,
            stage: vec![0; STAGE_BYTES / 4],
            retrans_seen,
        })
    }

    /// This rank's number.
    pub const fn rank(&self) -> usize {
        self.rank
    }

    /// Replaces `data` with the element-wise (wrapping) sum of every rank's
    /// `data`. Every rank must call it with the same length.
    ///
    /// # Errors
    /// [`Error::Closed`] when a neighbour closes its connection,
    /// [`Error::Stalled`] when one does not move for the timeout,
    /// [`Error::Io`] on any other socket error.
    pub fn allreduce_i32(&mut self, data: &mut [i32]) -> Result<RingStats, Error> {
        let started = Instant::now();
        let (Some(next), Some(prev)) = (&self.next, &self.prev) else {
            return Ok(RingStats::default());
        };
        if size_of_val(data) <= WHOLE_MAX_BYTES {
            let bytes_sent = allreduce_whole(self.rank, self.n, self.timeout, next, prev, data)?;
            return self.stats(bytes_sent, started);
        }
        let plan = Plan {
            rank: self.rank,
            n: self.n,
            len: data.len(),
        };
        let steps = plan.steps();
        let mut send = Cursor::default();
        let mut recv = Cursor::default();
        // Bytes staged in `self.stage` beyond `recv.off` (a partial element).
        let mut carry = 0usize;
        let mut bytes_sent = 0u64;
        let mut last_progress = Instant::now();
        let spin = if size_of_val(data) <= SPIN_MAX_BYTES {
            SPIN
        } else {
            Duration::ZERO
        };
        loop {
            send.skip_empty(steps, |s| plan.send_bytes(s));
            recv.skip_empty(steps, |s| plan.recv_bytes(s));
            if send.step == steps && recv.step == steps {
                break;
            }
            let mut progress = false;

            // Send what the receive side has made ready.
            let sendable = if send.step == steps {
                0
            } else {
                let limit = if send.step == 0 || recv.step >= send.step {
                    plan.send_bytes(send.step)
                } else {
                    // recv.step == send.step - 1: the same chunk, in progress.
                    recv.off
                };
                limit - send.off
            };
            let mut want_write = false;
            if sendable > 0 {
                let start = plan.chunk_start(plan.send_chunk(send.step)) * 4 + send.off;
                match (&next.stream).write(&bytes(data)[start..start + sendable]) {
                    Ok(0) => {
                        return Err(Error::Closed {
                            rank: self.rank,
                            peer: next.rank,
                            addr: next.addr,
                            step: send.step,
                            steps,
                        });
                    }
                    Ok(k) => {
                        send.advance(k, plan.send_bytes(send.step));
                        bytes_sent += k as u64;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_write = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(closed_or_io(
                            e, self.rank, next, "sending", send.step, steps,
                        ));
                    }
                }
            }

            // Receive: add into the buffer (reduce-scatter) or copy (allgather).
            let mut want_read = false;
            if recv.step < steps {
                let total = plan.recv_bytes(recv.step);
                let chunk = plan.recv_chunk(recv.step);
                let reduce = recv.step < self.n - 1;
                let got = if reduce {
                    let room = (total - recv.off - carry).min(STAGE_BYTES - carry);
                    (&prev.stream).read(&mut bytes_mut(&mut self.stage)[carry..carry + room])
                } else {
                    let start = plan.chunk_start(chunk) * 4 + recv.off;
                    (&prev.stream).read(&mut bytes_mut(data)[start..start + total - recv.off])
                };
                match got {
                    Ok(0) => {
                        return Err(Error::Closed {
                            rank: self.rank,
                            peer: prev.rank,
                            addr: prev.addr,
                            step: recv.step,
                            steps,
                        });
                    }
                    Ok(k) if reduce => {
                        let staged = carry + k;
                        let whole = staged / 4;
                        let first = plan.chunk_start(chunk) + recv.off / 4;
                        for (d, s) in data[first..first + whole].iter_mut().zip(&self.stage) {
                            *d = d.wrapping_add(*s);
                        }
                        carry = staged % 4;
                        if carry > 0 {
                            bytes_mut(&mut self.stage).copy_within(whole * 4..staged, 0);
                        }
                        recv.advance(whole * 4, total);
                        progress = true;
                    }
                    Ok(k) => {
                        recv.advance(k, total);
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_read = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(closed_or_io(
                            e,
                            self.rank,
                            prev,
                            "receiving",
                            recv.step,
                            steps,
                        ));
                    }
                }
            }

            if progress {
                last_progress = Instant::now();
                continue;
            }
            let waited = last_progress.elapsed();
            if waited >= self.timeout {
                // Waiting to receive is what holds a ring up; a full send
                // buffer only follows from a peer that stopped reading.
                let (peer, what, step) = if want_read {
                    (prev, "no data from", recv.step)
                } else {
                    (next, "no room towards", send.step)
                };
                return Err(Error::Stalled {
                    rank: self.rank,
                    peer: peer.rank,
                    addr: peer.addr,
                    what,
                    waited,
                    step,
                    steps,
                });
            }
            wait(
                next,
                want_write,
                prev,
                want_read,
                spin,
                self.timeout - waited,
            )
            .map_err(prev.io_error(self.rank, "poll"))?;
        }
        self.stats(bytes_sent, started)
    }

    /// A finished call's stats; reads the retransmissions since the last.
    fn stats(&mut self, bytes_sent: u64, started: Instant) -> Result<RingStats, Error> {
        let retransmits = match &self.next {
            Some(next) => {
                let now = total_retrans(&next.stream)
                    .map_err(next.io_error(self.rank, "reading TCP_INFO"))?;
                let since = now.wrapping_sub(self.retrans_seen);
                self.retrans_seen = now;
                u64::from(since)
            }
            None => 0,
        };
        Ok(RingStats {
            bytes_sent,
            retransmits,
            elapsed: started.elapsed(),
        })
    }
}

/// The whole-buffer schedule for small buffers (module docs): `n - 1`
/// steps, each sending the buffer received in the previous step (the
/// rank's own first) and adding the one received into `data`. Returns the
/// bytes sent.
fn allreduce_whole(
    rank: usize,
    n: usize,
    timeout: Duration,
    next: &Peer,
    prev: &Peer,
    data: &mut [i32],
) -> Result<u64, Error> {
    let len = size_of_val(data);
    let steps = n - 1;
    let mut out = bytes(data).to_vec();
    let mut inbound = vec![0u8; len];
    let mut bytes_sent = 0u64;
    let mut last_progress = Instant::now();
    for step in 0..steps {
        let (mut sent, mut got) = (0usize, 0usize);
        while sent < len || got < len {
            let (mut progress, mut want_write, mut want_read) = (false, false, false);
            if sent < len {
                match (&next.stream).write(&out[sent..]) {
                    Ok(0) => return Err(closed(rank, next, step, steps)),
                    Ok(k) => {
                        sent += k;
                        bytes_sent += k as u64;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_write = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(closed_or_io(e, rank, next, "sending", step, steps)),
                }
            }
            if got < len {
                match (&prev.stream).read(&mut inbound[got..]) {
                    Ok(0) => return Err(closed(rank, prev, step, steps)),
                    Ok(k) => {
                        got += k;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want_read = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(closed_or_io(e, rank, prev, "receiving", step, steps)),
                }
            }
            if progress {
                last_progress = Instant::now();
                continue;
            }
            let waited = last_progress.elapsed();
            if waited >= timeout {
                let (peer, what) = if want_read {
                    (prev, "no data from")
                } else {
                    (next, "no room towards")
                };
                return Err(Error::Stalled {
                    rank,
                    peer: peer.rank,
                    addr: peer.addr,
                    what,
                    waited,
                    step,
                    steps,
                });
            }
            wait(next, want_write, prev, want_read, SPIN, timeout - waited)
                .map_err(prev.io_error(rank, "poll"))?;
        }
        for (d, b) in data.iter_mut().zip(inbound.chunks_exact(4)) {
            *d = d.wrapping_add(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        }
        std::mem::swap(&mut out, &mut inbound);
    }
    Ok(bytes_sent)
}

fn closed(rank: usize, peer: &Peer, step: usize, steps: usize) -> Error {
    Error::Closed {
        rank,
        peer: peer.rank,
        addr: peer.addr,
        step,
        steps,
    }
}

/// Which chunk moves in which step, for one rank.
#[derive(Clone, Copy, Debug)]
struct Plan {
    rank: usize,
    n: usize,
    len: usize,
}

impl Plan {
    const fn steps(self) -> usize {
        2 * (self.n - 1)
    }

    /// `(rank + k) mod n` for a signed `k` with `|k| < 2n`.
    const fn chunk(self, k: isize) -> usize {
        let n = self.n as isize;
        ((self.rank as isize + k + 2 * n) % n) as usize
    }

    const fn send_chunk(self, step: usize) -> usize {
        if step < self.n - 1 {
            self.chunk(-(step as isize))
        } else {
            self.chunk(1 - (step - (self.n - 1)) as isize)
        }
    }

    const fn recv_chunk(self, step: usize) -> usize {
        if step < self.n - 1 {
            self.chunk(-(step as isize) - 1)
        } else {
            self.chunk(-((step - (self.n - 1)) as isize))
        }
    }

    /// First element of chunk `c`.
    const fn chunk_start(self, c: usize) -> usize {
        c * self.len / self.n
    }

    const fn chunk_bytes(self, c: usize) -> usize {
        (self.chunk_start(c + 1) - self.chunk_start(c)) * 4
    }

    const fn send_bytes(self, step: usize) -> usize {
        self.chunk_bytes(self.send_chunk(step))
    }

    const fn recv_bytes(self, step: usize) -> usize {
        self.chunk_bytes(self.recv_chunk(step))
    }
}

/// A position in a send or receive stream: step, and bytes done in it.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    step: usize,
    off: usize,
}

impl Cursor {
    fn advance(&mut self, k: usize, total: usize) {
        self.off += k;
        if self.off == total {
            self.step += 1;
            self.off = 0;
        }
    }

    /// Steps over steps whose chunk is empty (both ends agree on them).
    fn skip_empty(&mut self, steps: usize, bytes: impl Fn(usize) -> usize) {
        while self.step < steps && self.off == 0 && bytes(self.step) == 0 {
            self.step += 1;
        }
    }
}

fn bytes(data: &[i32]) -> &[u8] {
    // SAFETY: `i32` has no padding and every byte of it is initialised; `u8`
    // has alignment 1; the length covers exactly the same memory.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), size_of_val(data)) }
}

fn bytes_mut(data: &mut [i32]) -> &mut [u8] {
    // SAFETY: as in `bytes`; also, every byte pattern is a valid `i32`, so
    // whatever is written through the view leaves valid elements.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), size_of_val(data)) }
}

/// A reset or broken connection is the peer going away; anything else is an
/// I/O error.
fn closed_or_io(
    e: io::Error,
    rank: usize,
    peer: &Peer,
    action: &'static str,
    step: usize,
    steps: usize,
) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => Error::Closed {
            rank,
            peer: peer.rank,
            addr: peer.addr,
            step,
            steps,
        },
        _ => peer.io_error(rank, action)(e),
    }
}

/// Waits until a wanted direction can move, a socket has an error, or
/// `timeout` passes: for up to `spin` by checking without sleeping and
/// yielding the CPU in between, then asleep in `poll(2)`.
fn wait(
    next: &Peer,
    want_write: bool,
    prev: &Peer,
    want_read: bool,
    spin: Duration,
    timeout: Duration,
) -> io::Result<()> {
    let mut fds = [
        libc::pollfd {
            fd: next.stream.as_raw_fd(),
            events: if want_write { libc::POLLOUT } else { 0 },
            revents: 0,
        },
        libc::pollfd {
            fd: prev.stream.as_raw_fd(),
            events: if want_read { libc::POLLIN } else { 0 },
            revents: 0,
        },
    ];
    let spin_until = Instant::now() + spin;
    loop {
        let ms = if Instant::now() < spin_until {
            0
        } else {
            i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX)
        };
        // SAFETY: `fds` is a valid array of two `pollfd`s that outlives the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if rc != 0 || ms != 0 {
            return Ok(());
        }
        std::thread::yield_now();
    }
}

/// `tcpi_total_retrans` of a connection.
pub(crate) fn total_retrans(stream: &TcpStream) -> io::Result<u32> {
    // SAFETY: `tcp_info` is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes and `len` is a valid
    // `socklen_t` the kernel updates.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.tcpi_total_retrans)
}

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
            Ok(stream) => {
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

fn accept_from(
    rank: usize,
    peer: usize,
    addrs: &[SocketAddrV4],
    listener: &TcpListener,
    timeout: Duration,
) -> Result<Peer, Error> {
    let addr = addrs[peer];
    let io_error = |action| io_error(rank, peer, addr, action);
    listener
        .set_nonblocking(true)
        .map_err(io_error("making the listener non-blocking"))?;
    let started = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                if from.ip() != std::net::IpAddr::V4(*addr.ip()) {
                    return Err(Error::WrongPeer {
                        rank,
                        peer,
                        addr,
                        got: from,
                    });
                }
                stream
                    .set_nonblocking(false)
                    .map_err(io_error("setting up the accepted socket"))?;
                return Ok(Peer {
                    rank: peer,
                    addr,
                    stream,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if started.elapsed() >= timeout {
                    return Err(Error::NoConnection {
                        rank,
                        peer,
                        addr,
                        waited: started.elapsed(),
                    });
                }
                std::thread::sleep(CONNECT_RETRY);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error("accepting")(e)),
        }
    }
}

/// The addresses of a ring whose rank `i` listens on `ips[i]`:[`RING_PORT`].
pub fn ring_addrs(ips: impl IntoIterator<Item = Ipv4Addr>) -> Vec<SocketAddrV4> {
    ips.into_iter()
        .map(|ip| SocketAddrV4::new(ip, RING_PORT))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates the ring's chunk schedule on plain vectors: every rank ends
    /// with the full sum, for lengths below, at and above the rank count.
    #[test]
    fn schedule_computes_the_sum() {
        for n in 1..=6usize {
            for len in [0, 1, 2, 5, 6, 7, 13, 64] {
                let mut bufs: Vec<Vec<i32>> = (0..n)
                    .map(|r| (0..len).map(|i| (r * 100 + i) as i32).collect())
                    .collect();
                let expected: Vec<i32> = (0..len)
                    .map(|i| (0..n).map(|r| (r * 100 + i) as i32).sum())
                    .collect();
                for step in 0..2 * n.saturating_sub(1) {
                    let sent: Vec<Vec<i32>> = (0..n)
                        .map(|r| {
                            let p = Plan { rank: r, n, len };
                            let c = p.send_chunk(step);
                            bufs[r][p.chunk_start(c)..p.chunk_start(c + 1)].to_vec()
                        })
                        .collect();
                    for r in 0..n {
                        let p = Plan { rank: r, n, len };
                        let c = p.recv_chunk(step);
                        let from = &sent[(r + n - 1) % n];
                        assert_eq!(from.len() * 4, p.recv_bytes(step), "n {n} len {len}");
                        let dst = &mut bufs[r][p.chunk_start(c)..p.chunk_start(c + 1)];
                        for (d, s) in dst.iter_mut().zip(from) {
                            if step < n - 1 {
                                *d += s;
                            } else {
                                *d = *s;
                            }
                        }
                    }
                }
                for (r, b) in bufs.iter().enumerate() {
                    assert_eq!(b, &expected, "n {n} len {len} rank {r}");
                }
            }
        }
    }

    /// What a rank sends in step `s ≥ 1` is what it received in step `s-1`:
    /// the premise of pipelining the send stream behind the receive stream.
    #[test]
    fn each_step_forwards_the_previous_steps_chunk() {
        for n in 2..=8 {
            for rank in 0..n {
                let p = Plan { rank, n, len: 100 };
                for s in 1..p.steps() {
                    assert_eq!(
                        p.send_chunk(s),
                        p.recv_chunk(s - 1),
                        "n {n} rank {rank} step {s}"
                    );
                }
            }
        }
    }
}

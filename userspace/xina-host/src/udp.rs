//! The blocking UDP driver: a [`Worker`] runs the [`Allreduce`] engine over one
//! UDP socket.
//!
//! Each turn of the loop sends every datagram the engine allows (new chunks up
//! to the window, retransmissions), waits until a datagram arrives or the
//! engine's next deadline comes (never more than [`MAX_WAIT`]), reads what has
//! arrived, and fires the deadline if it has passed. The socket is
//! non-blocking; waiting is a `ppoll(2)`. Datagrams go through the private
//! `Socket` type one at a time (`sendto`/`recvfrom`); batching with
//! `sendmmsg`/`recvmmsg` fits there without touching the loop's logic.
//!
//! Results are accepted from any source address: the switch may rewrite
//! addresses as it replicates a result, and the engine checks job, kind,
//! sequence number, element count and slot of everything it takes.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::engine::{Allreduce, Config, MAX_DATAGRAM_LEN, Member, RttEstimator, Stats};
use crate::error::Error;

/// The longest the driver sleeps in one wait, whatever the engine's deadline.
pub const MAX_WAIT: Duration = Duration::from_millis(100);

/// The socket buffer size the worker asks for (the kernel caps it at
/// `net.core.rmem_max` / `wmem_max`): a 4 MiB receive buffer holds the results
/// of a window of about 4000 full chunks.
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Most datagrams read in one go before the engine gets to send again.
const RECV_BURST: usize = 256;

/// How long one wait for send buffer space lasts.
const SEND_WAIT: Duration = Duration::from_millis(10);

/// A worker's job: its [`Member`] description and where the switch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobParams {
    /// The job (tenant) id installed on the switch.
    pub job: u32,
    /// This worker's rank, below `fan_in`.
    pub rank: u8,
    /// How many ranks contribute to every chunk (1..=64).
    pub fan_in: u8,
    /// Elements per packet (1..=256); the same on every rank.
    pub elems_per_packet: u16,
    /// The job's aggregator slots: the window
    /// (1..=[`MAX_WINDOW`](crate::engine::MAX_WINDOW)).
    pub slots: u32,
    /// The switch's xina address (port [`xina_proto::XINA_UDP_PORT`] on a
    /// real switch).
    pub switch: SocketAddrV4,
}

impl JobParams {
    /// The engine's view of these parameters.
    pub const fn member(&self) -> Member {
        Member {
            job: self.job,
            rank: self.rank,
            fan_in: self.fan_in,
            elems_per_packet: self.elems_per_packet,
            slots: self.slots,
        }
    }
}

/// A worker of one job, with its socket: runs collectives over UDP, blocking
/// the calling thread until each completes or fails.
///
/// The worker numbers its chunks continuously across calls (see the
/// [crate docs](crate#sequence-continuity)): every rank of the job must make
/// the same calls with the same buffer lengths in the same order.
#[derive(Debug)]
pub struct Worker {
    params: JobParams,
    config: Config,
    socket: Socket,
    next_chunk: u64,
    rtt: RttEstimator,
    tx: Vec<u8>,
    rx: Vec<u8>,
}

impl Worker {
    /// Validates the parameters and binds a UDP socket to `bind`
    /// (port 0 picks a free port).
    ///
    /// # Errors
    /// The errors of [`Member::validate`] and [`Config::validate`],
    /// [`Error::Bind`], or [`Error::Io`] if the socket cannot be set up.
    pub fn new(params: JobParams, bind: SocketAddrV4, config: Config) -> Result<Self, Error> {
        params.member().validate()?;
        config.validate()?;
        let socket = UdpSocket::bind(bind).map_err(|source| Error::Bind { addr: bind, source })?;
        let io_error = |action| {
            move |source| Error::Io {
                job: params.job,
                rank: params.rank,
                action,
                source,
            }
        };
        socket
            .set_nonblocking(true)
            .map_err(io_error("making the socket non-blocking"))?;
        let socket = Socket {
            inner: socket,
            switch: params.switch,
        };
        socket.grow_buffers();
        log::debug!(
            "job {}, rank {}: worker bound to {:?}, switch {}",
            params.job,
            params.rank,
            socket.inner.local_addr(),
            params.switch
        );
        Ok(Self {
            params,
            config,
            socket,
            next_chunk: 0,
            rtt: RttEstimator::new(),
            tx: vec![0; MAX_DATAGRAM_LEN],
            // Room for more than a valid datagram: an oversized one is seen
            // whole (and ignored) rather than silently truncated.
            rx: vec![0; 2 * MAX_DATAGRAM_LEN],
        })
    }

    /// The parameters the worker was created with.
    pub const fn params(&self) -> &JobParams {
        &self.params
    }

    /// The address the worker's socket is bound to (the address the switch
    /// must know this rank by).
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddrV4, Error> {
        match self.socket.inner.local_addr() {
            Ok(SocketAddr::V4(addr)) => Ok(addr),
            Ok(SocketAddr::V6(_)) => Err(self.io_error(
                "reading the local address",
                io::Error::new(io::ErrorKind::Unsupported, "the socket is not IPv4"),
            )),
            Err(source) => Err(self.io_error("reading the local address", source)),
        }
    }

    /// The chunk number the next collective starts at (its sequence number
    /// modulo 2^32).
    pub const fn next_chunk(&self) -> u64 {
        self.next_chunk
    }

    /// The round-trip estimate carried from call to call.
    pub const fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// Sum-allreduces `data` over the job's ranks, in place: on success every
    /// element holds the sum of that element over all ranks.
    ///
    /// The chunk numbering advances past this call whatever its outcome.
    ///
    /// # Errors
    /// [`Error::GaveUp`] when no result arrived for `give_up`,
    /// [`Error::Overflow`] when a sum saturated, [`Error::Io`] when the socket
    /// fails. On error the contents of `data` are unspecified.
    pub fn allreduce_i32(&mut self, data: &mut [i32]) -> Result<Stats, Error> {
        let mut engine = Allreduce::new(
            self.params.member(),
            self.config,
            self.next_chunk,
            data,
            Instant::now(),
        )?
        .with_rtt(self.rtt);
        self.next_chunk = engine.next_chunk();
        let outcome = self.drive(&mut engine);
        self.rtt = *engine.rtt();
        match &outcome {
            Ok(stats) => log::debug!(
                "job {}, rank {}: allreduce of {} chunks in {:?}: {stats:?}",
                self.params.job,
                self.params.rank,
                stats.chunks,
                stats.elapsed
            ),
            Err(error) => log::debug!("{error}; {:?}", engine.stats()),
        }
        outcome
    }

    /// Runs the engine to its outcome.
    fn drive(&mut self, engine: &mut Allreduce<'_>) -> Result<Stats, Error> {
        loop {
            let now = Instant::now();
            while let Some(len) = engine.poll_transmit(now, &mut self.tx) {
                self.socket
                    .send(&self.tx[..len], self.config.give_up)
                    .map_err(|source| self.io_error("sending to the switch", source))?;
            }
            if let Some(outcome) = engine.take_outcome() {
                return outcome;
            }

            let deadline = engine.poll_timeout().unwrap_or(now);
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(MAX_WAIT);
            if !wait.is_zero() {
                self.socket
                    .wait(libc::POLLIN, wait)
                    .map_err(|source| self.io_error("waiting for results", source))?;
            }
            for _ in 0..RECV_BURST {
                let received = self
                    .socket
                    .recv(&mut self.rx)
                    .map_err(|source| self.io_error("receiving from the switch", source))?;
                let Some(len) = received else { break };
                engine.handle_packet(Instant::now(), &self.rx[..len]);
            }

            let now = Instant::now();
            if engine.poll_timeout().is_some_and(|t| t <= now) {
                engine.handle_timeout(now);
            }
        }
    }

    fn io_error(&self, action: &'static str, source: io::Error) -> Error {
        Error::Io {
            job: self.params.job,
            rank: self.params.rank,
            action,
            source,
        }
    }
}

/// The worker's UDP socket, one datagram per system call.
#[derive(Debug)]
struct Socket {
    inner: UdpSocket,
    switch: SocketAddrV4,
}

impl Socket {
    /// Asks for [`SOCKET_BUFFER_BYTES`] of send and receive buffer; a refusal
    /// is logged, not fatal.
    fn grow_buffers(&self) {
        let bytes = libc::c_int::try_from(SOCKET_BUFFER_BYTES).unwrap_or(libc::c_int::MAX);
        for (option, name) in [
            (libc::SO_RCVBUF, "SO_RCVBUF"),
            (libc::SO_SNDBUF, "SO_SNDBUF"),
        ] {
            let len = libc::socklen_t::try_from(size_of::<libc::c_int>())
                .expect("the size of a c_int fits a socklen_t");
            // SAFETY: the descriptor is open for as long as `self.inner` lives;
            // the option value points to a live c_int and `len` is its size.
            let rc = unsafe {
                libc::setsockopt(
                    self.inner.as_raw_fd(),
                    libc::SOL_SOCKET,
                    option,
                    (&raw const bytes).cast(),
                    len,
                )
            };
            if rc != 0 {
                log::debug!("setting {name} to {bytes}: {}", io::Error::last_os_error());
            }
        }
    }

    /// Sends one datagram to the switch, waiting for buffer space for up to
    /// `limit`. A datagram the kernel drops (`ENOBUFS`, an ICMP error left
    /// from an earlier send) counts as sent: to the engine it is a loss.
    fn send(&self, datagram: &[u8], limit: Duration) -> io::Result<()> {
        let started = Instant::now();
        loop {
            match self.inner.send_to(datagram, self.switch) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if started.elapsed() >= limit {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no send buffer space for {limit:?}"),
                        ));
                    }
                    self.wait(libc::POLLOUT, SEND_WAIT)?;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        || e.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    log::trace!("datagram to {} dropped by the kernel: {e}", self.switch);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one datagram if one is waiting.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match self.inner.recv_from(buf) {
                Ok((len, _from)) => return Ok(Some(len)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                // An ICMP error from an earlier send; the engine's timers
                // deal with the loss.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until the socket is ready for `events` or `timeout` has passed.
    fn wait(&self, events: libc::c_short, timeout: Duration) -> io::Result<()> {
        let mut fd = libc::pollfd {
            fd: self.inner.as_raw_fd(),
            events,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            // Below 10^9: fits an i32, hence a c_long on every target.
            tv_nsec: libc::c_long::from(i32::try_from(timeout.subsec_nanos()).unwrap_or(0)),
        };
        // SAFETY: `fd` and `ts` are live locals for the whole call, the count
        // of pollfds is 1, and a null signal mask means "leave it unchanged".
        let rc = unsafe { libc::ppoll(&raw mut fd, 1, &raw const ts, std::ptr::null()) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}

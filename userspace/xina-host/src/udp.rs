//! The blocking UDP driver: a [`Worker`] runs the [`Engine`] over one UDP
//! socket.
//!
//! Each turn of the loop sends every datagram the engine allows (new chunks up
//! to the window, retransmissions), waits until a datagram arrives or the
//! engine's next deadline comes (never more than [`MAX_WAIT`]), reads what has
//! arrived, and fires the deadline if it has passed. The socket is
//! non-blocking; waiting is a `ppoll(2)`.
//!
//! # Batched system calls
//!
//! Datagrams are small (at most [`MAX_DATAGRAM_LEN`] bytes) and many, so the
//! driver pays per datagram, not per byte. The private `Socket` type moves up
//! to 64 datagrams per system call and, where the kernel allows, lets one
//! trip through the network stack carry a run of them:
//!
//! - **Sending.** The engine writes the datagrams it has ready into a queue of
//!   64 buffers, and one `sendmmsg(2)` offers the whole queue to the kernel.
//!   If the kernel takes only the first messages (its send buffer is full),
//!   the others stay queued, in the order the engine wrote them, ahead of
//!   anything the engine writes later; the driver waits for buffer space and
//!   offers them again. Nothing queued is dropped by the driver while the
//!   call runs; a message the kernel refuses outright (`ENOBUFS`, an ICMP
//!   error left from an earlier send) counts as sent, and the engine's timers
//!   treat its datagrams as lost. The engine stamps each datagram with the
//!   time it wrote it, a few microseconds before the batch goes out.
//! - **Segmentation offload.** Consecutive queued datagrams of the same length
//!   (full chunks, in practice) go as one message with a `UDP_SEGMENT`
//!   control message (UDP GSO, Linux 4.18): the kernel builds one large
//!   packet, routes it once, and cuts it into datagrams of that length just
//!   before the device, each with its own IPv4 and UDP header and checksum.
//!   A device without transmit checksum offload (such as the testbed's
//!   worker veths) has no UDP segmentation feature either, so the kernel cuts
//!   in software before the frame reaches the device: the switch receives
//!   ordinary datagrams, one frame each, with complete checksums. A run is
//!   at most 64 datagrams and 65,507 bytes (one IPv4 datagram). If the kernel
//!   lacks `UDP_SEGMENT`, or refuses a segmented send (`EIO` on an `IPsec`
//!   route, `EINVAL` when a datagram would not fit the route's MTU), the
//!   worker falls back to one datagram per message for the rest of its life.
//! - **Receiving.** One `recvmmsg(2)` with `MSG_DONTWAIT` reads up to 64
//!   datagrams, and each goes to the engine with the time of that read. Reading
//!   stops when the socket is drained or after 256 datagrams per turn, so that
//!   the engine gets to send again.
//!
//! Batching the system calls alone hardly shortens a run on the 2-core
//! testbed: it cuts the calls per datagram about fourfold, but the kernel's
//! own per-datagram work (routing, building and queueing each packet, the
//! switch's XDP program, delivering the results) dominates. Segmentation
//! removes most of that work on the sending side: there it cut the time of a
//! 4-worker allreduce by about a quarter.
//!
//! The 64 send and 64 receive buffers are allocated once per [`Worker`]. The
//! message headers that point into them are built on the stack for each call,
//! so a `Worker` holds no raw pointers and stays `Send`.
//!
//! Results are accepted from any source address: the switch may rewrite
//! addresses as it replicates a result, and the engine checks job, kind,
//! sequence number, element count and slot of everything it takes.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::call::{Scalar, Step, StepData, StepOutcome};
use crate::congestion::Window;
use crate::engine::{
    Collective, Config, Element, Engine, MAX_DATAGRAM_LEN, Member, Mode, RttEstimator, Stats,
    datagram_len,
};
use crate::error::Error;
use crate::group::{GroupCollective, GroupEngine, GroupParams, GroupState};
use xina_proto::{DType, Op};

/// The longest the driver sleeps in one wait, whatever the engine's deadline.
pub const MAX_WAIT: Duration = Duration::from_millis(100);

/// The socket buffer size the worker asks for (the kernel caps it at
/// `net.core.rmem_max` / `wmem_max`): a 4 MiB receive buffer holds the results
/// of a window of about 4000 full chunks.
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Most datagrams read in one go before the engine gets to send again.
const RECV_BURST: usize = 256;

/// Most datagrams one `sendmmsg(2)` or `recvmmsg(2)` moves: enough to make the
/// cost of the call small against the cost of the datagrams, few enough that
/// the buffers (about 94 KiB each way) stay in the cache.
const BATCH: usize = 64;

/// Most datagrams in one segmented (GSO) send: `UDP_MAX_SEGMENTS` of the
/// kernels that introduced `UDP_SEGMENT` (later ones allow more).
const GSO_MAX_SEGMENTS: usize = 64;

/// Most payload bytes of one segmented send: it is built as one IPv4
/// datagram before it is cut.
const GSO_MAX_PAYLOAD: usize =
    u16::MAX as usize - xina_proto::net::IPV4_HLEN - xina_proto::net::UDP_HLEN;

/// The longest datagram of a group (its payloads are narrow).
const GROUP_DATAGRAM_LEN: usize = xina_proto::header::HEADER_LEN + xina_proto::MAX_PAYLOAD;

/// The data of a `UDP_SEGMENT` control message: the segment length.
type GsoSize = u16;

/// `CMSG_SPACE` of a [`GsoSize`]: the control buffer of one segmented send.
// SAFETY: `CMSG_SPACE` only computes with its argument.
const GSO_CMSG_SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<GsoSize>() as u32) } as usize;

/// `CMSG_LEN` of a [`GsoSize`]: the `cmsg_len` of a `UDP_SEGMENT` message.
// SAFETY: `CMSG_LEN` only computes with its argument.
const GSO_CMSG_LEN: usize = unsafe { libc::CMSG_LEN(size_of::<GsoSize>() as u32) } as usize;

/// The error of a send that found no buffer space for `limit`.
pub(crate) fn no_buffer_space(limit: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no send buffer space for {limit:?}"),
    )
}

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
    /// Elements per packet (1 to 360 int32 or 180 int64); the same on every
    /// rank.
    pub elems_per_packet: u16,
    /// The job's aggregator slots: the window
    /// (1..=[`MAX_WINDOW`](crate::engine::MAX_WINDOW)).
    pub slots: u32,
    /// The job's operation, as installed on the switch.
    pub op: Op,
    /// The job's element type, as installed on the switch.
    pub dtype: DType,
    /// The job's delivery mode, as installed on the switch.
    pub mode: Mode,
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
            op: self.op,
            dtype: self.dtype,
            mode: self.mode,
        }
    }
}

/// What a worker keeps from call to call, whatever drives its socket.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) params: JobParams,
    pub(crate) config: Config,
    pub(crate) next_chunk: u64,
    pub(crate) rtt: RttEstimator,
    pub(crate) window: Window,
    /// The congestion window over time, while tracing.
    pub(crate) trace: Option<Vec<(Instant, u32)>>,
    pub(crate) tx: TxQueue,
    pub(crate) rx: RxBatch,
}

impl Core {
    /// Validates the parameters (before binding, so that bad parameters
    /// are reported as such whatever the address) and binds a non-blocking
    /// UDP socket.
    pub(crate) fn bind(
        params: JobParams,
        bind: SocketAddrV4,
        config: Config,
    ) -> Result<(Self, Socket), Error> {
        params.member().validate()?;
        config.validate()?;
        let socket = UdpSocket::bind(bind).map_err(|source| Error::Bind { addr: bind, source })?;
        Self::on_socket(params, socket, config)
    }

    /// Validates the parameters and takes `socket`, bound already, making
    /// it non-blocking.
    pub(crate) fn on_socket(
        params: JobParams,
        socket: UdpSocket,
        config: Config,
    ) -> Result<(Self, Socket), Error> {
        params.member().validate()?;
        config.validate()?;
        let core = Self {
            params,
            config,
            next_chunk: 0,
            rtt: RttEstimator::new(),
            window: Window::new(),
            trace: None,
            tx: TxQueue::new(datagram_len(params.dtype, params.elems_per_packet)),
            rx: RxBatch::new(datagram_len(params.dtype, params.elems_per_packet)),
        };
        socket
            .set_nonblocking(true)
            .map_err(|e| core.io_error("making the socket non-blocking", e))?;
        let socket = Socket::new(socket, params.switch);
        log::debug!(
            "job {}, rank {}: worker bound to {:?}, switch {}, UDP GSO {}",
            params.job,
            params.rank,
            socket.inner.local_addr(),
            params.switch,
            if socket.gso { "on" } else { "off" }
        );
        Ok((core, socket))
    }

    /// The engine of one step, starting where the previous call ended.
    pub(crate) fn engine<'d, T: Element>(
        &mut self,
        collective: Collective,
        data: &'d mut [T],
        tolerate_overflow: bool,
    ) -> Result<Engine<'d, T>, Error> {
        let engine = Engine::new(
            self.params.member(),
            self.config,
            collective,
            self.next_chunk,
            data,
            Instant::now(),
        )?
        .with_rtt(self.rtt)
        .with_window(self.window);
        let engine = if self.trace.is_some() {
            engine.trace_window()
        } else {
            engine
        };
        self.next_chunk = engine.next_chunk();
        Ok(if tolerate_overflow {
            engine.tolerate_overflow()
        } else {
            engine
        })
    }

    /// Keeps what the next call needs from a finished engine and logs the
    /// outcome.
    pub(crate) fn finish<T: Element>(
        &mut self,
        engine: &Engine<'_, T>,
        outcome: Result<Stats, Error>,
    ) -> Result<StepOutcome, Error> {
        self.rtt = *engine.rtt();
        self.window = *engine.window();
        if let Some(trace) = &mut self.trace {
            trace.extend_from_slice(engine.window_trace());
        }
        if !self.tx.is_empty() {
            // Only a failed send leaves datagrams queued; they carry chunks of
            // this call, which no later call may send.
            log::debug!(
                "job {}, rank {}: {} queued datagrams of the failed call discarded",
                self.params.job,
                self.params.rank,
                self.tx.len()
            );
            self.tx.clear();
        }
        match &outcome {
            Ok(stats) => log::debug!(
                "job {}, rank {}: {}: {stats}",
                self.params.job,
                self.params.rank,
                engine.collective().name()
            ),
            Err(error) => log::debug!("{error}; {}", engine.stats()),
        }
        outcome.map(|stats| StepOutcome {
            stats,
            overflowed: engine.overflowed(),
        })
    }

    pub(crate) fn io_error(&self, action: &'static str, source: io::Error) -> Error {
        Error::Io {
            job: self.params.job,
            rank: self.params.rank,
            action,
            source,
        }
    }
}

/// Runs `$run` (an expression over `$collective`, `$data`, `$tolerate` that
/// yields the step's `Result<StepOutcome, Error>`, `.await`ed or not) for
/// every step of `$plan`, then finishes the plan.
macro_rules! run_plan {
    ($plan:expr, |$collective:ident, $data:ident, $tolerate:ident| $run:expr) => {{
        let mut plan = $plan;
        while let Some(Step {
            collective: $collective,
            data,
            tolerate_overflow: $tolerate,
        }) = plan.next()
        {
            let outcome = match data {
                StepData::I32($data) => $run,
                StepData::I64($data) => $run,
            };
            plan.feed(outcome);
        }
        plan.finish()
    }};
}
pub(crate) use run_plan;

/// A worker of one job, with its socket: runs collectives over UDP, blocking
/// the calling thread until each completes or fails.
///
/// The worker numbers its chunks continuously across calls (see the
/// [crate docs](crate#sequence-continuity)): every rank of the job must make
/// the same calls with the same buffer lengths in the same order.
#[derive(Debug)]
pub struct Worker {
    core: Core,
    socket: Socket,
}

impl Worker {
    /// Validates the parameters and binds a UDP socket to `bind`
    /// (port 0 picks a free port).
    ///
    /// # Errors
    /// The errors of [`Member::validate`] and [`Config::validate`],
    /// [`Error::Bind`], or [`Error::Io`] if the socket cannot be set up.
    pub fn new(params: JobParams, bind: SocketAddrV4, config: Config) -> Result<Self, Error> {
        let (core, socket) = Core::bind(params, bind, config)?;
        Ok(Self { core, socket })
    }

    /// As [`Self::new`], on a UDP socket bound already: its address is the
    /// one the switch knows this rank by. Ranks that must tell the switch
    /// their addresses before the job exists (a job service allocating it)
    /// bind first, gather the addresses, then make their workers.
    ///
    /// # Errors
    /// As [`Self::new`], but for [`Error::Bind`].
    pub fn with_socket(
        params: JobParams,
        socket: UdpSocket,
        config: Config,
    ) -> Result<Self, Error> {
        let (core, socket) = Core::on_socket(params, socket, config)?;
        Ok(Self { core, socket })
    }

    /// The parameters the worker was created with.
    pub const fn params(&self) -> &JobParams {
        &self.core.params
    }

    /// Sends runs of full chunks as one segmented send (UDP GSO), or not.
    /// On by default where the kernel has `UDP_SEGMENT`; returns whether it
    /// is on now. Off, every datagram is its own packet from the socket on,
    /// at the cost of more work per datagram in the kernel: a tc program
    /// (or anything else before the device) sees one frame per packet,
    /// where a segmented send reaches it as one packet of many frames.
    pub fn set_segmentation_offload(&mut self, on: bool) -> bool {
        self.socket.set_segmentation_offload(on)
    }

    /// The address the worker's socket is bound to (the address the switch
    /// must know this rank by).
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddrV4, Error> {
        self.socket.local_addr(&self.core)
    }

    /// The chunk number the next collective starts at (its sequence number
    /// modulo 2^32).
    pub const fn next_chunk(&self) -> u64 {
        self.core.next_chunk
    }

    /// The round-trip estimate carried from call to call.
    pub const fn rtt(&self) -> &RttEstimator {
        &self.core.rtt
    }

    /// The congestion window carried from call to call.
    pub const fn window(&self) -> &Window {
        &self.core.window
    }

    /// Starts (or stops) recording the congestion window's limit over the
    /// following calls: at each call's start and at every change.
    pub fn trace_window(&mut self, on: bool) {
        self.core.trace = on.then(Vec::new);
    }

    /// What was recorded since tracing started or was last taken.
    pub fn take_window_trace(&mut self) -> Vec<(Instant, u32)> {
        self.core
            .trace
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Combines `data` over the job's ranks with the job's operation, in
    /// place: on success every element holds the combination of that element
    /// over all ranks. Needs a job in allreduce mode.
    ///
    /// The chunk numbering advances past this call whatever its outcome.
    ///
    /// # Errors
    /// [`Error::GaveUp`] when no result arrived for `give_up`,
    /// [`Error::Overflow`] when an integer sum saturated,
    /// [`Error::CallMismatch`] when the ranks did not make the same call,
    /// [`Error::Io`] when the socket fails; argument errors (wrong type or
    /// mode for the job) before anything is sent. On error the contents of
    /// `data` are unspecified.
    pub fn allreduce<S: Scalar>(&mut self, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::Allreduce, data)
    }

    /// [`allreduce`](Self::allreduce) of integers, out of place: `input`
    /// is sent and left as it was, the results land in `output`. Saves the
    /// copy an in-place call needs when the input must survive (MPI's
    /// send and receive buffers; an overflowing sum redone elsewhere).
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce), and [`Error::LengthMismatch`]
    /// when the buffers differ in length.
    pub fn allreduce_from<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<Stats, Error> {
        if input.len() != output.len() {
            return Err(Error::LengthMismatch {
                job: self.core.params.job,
                input: input.len(),
                output: output.len(),
            });
        }
        let mut engine = self
            .core
            .engine(Collective::Allreduce, output, false)?
            .with_input(input);
        let outcome = self.drive(&mut engine);
        self.core.finish(&engine, outcome).map(|o| o.stats)
    }

    /// [`allreduce`](Self::allreduce) of int32s.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    pub fn allreduce_i32(&mut self, data: &mut [i32]) -> Result<Stats, Error> {
        self.allreduce(data)
    }

    /// Combines `data` over the job's ranks into rank `root`'s buffer; the
    /// other ranks' buffers are left as they were. Needs a job in reduce
    /// mode.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce), and [`Error::RootOutOfRange`].
    pub fn reduce<S: Scalar>(&mut self, root: u8, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::Reduce { root }, data)
    }

    /// Cuts `data` into `fan_in` equal parts and combines part `r` over the
    /// ranks into rank `r`'s buffer, in place; the other parts are left as
    /// they were. Needs a job in reduce-scatter mode.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce), and [`Error::LengthNotDivisible`].
    pub fn reduce_scatter<S: Scalar>(&mut self, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::ReduceScatter, data)
    }

    /// Returns once every rank has called it (in any job mode).
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    pub fn barrier(&mut self) -> Result<Stats, Error> {
        match self.core.params.dtype {
            // A group's member cannot take part in a barrier: the engine
            // refuses the type (`Error::WrongType`).
            DType::I32 | DType::Bytes => self.call::<i32>(Collective::Barrier, &mut []),
            DType::I64 => self.call::<i64>(Collective::Barrier, &mut []),
        }
    }

    /// Runs `collective` over `data`.
    ///
    /// # Errors
    /// As [`allreduce`](Self::allreduce).
    pub fn call<S: Scalar>(
        &mut self,
        collective: Collective,
        data: &mut [S],
    ) -> Result<Stats, Error> {
        let member = self.core.params.member();
        let plan = S::plan(&member, &self.core.config, collective, data)?;
        run_plan!(plan, |collective, data, tolerate| self
            .run(collective, data, tolerate))
    }

    /// One engine run.
    fn run<T: Element>(
        &mut self,
        collective: Collective,
        data: &mut [T],
        tolerate_overflow: bool,
    ) -> Result<StepOutcome, Error> {
        let mut engine = self.core.engine(collective, data, tolerate_overflow)?;
        let outcome = self.drive(&mut engine);
        self.core.finish(&engine, outcome)
    }

    /// Runs the engine to its outcome.
    fn drive<T: Element>(&mut self, engine: &mut Engine<'_, T>) -> Result<Stats, Error> {
        let (job, rank) = (self.core.params.job, self.core.params.rank);
        let core = &mut self.core;
        drive(
            &mut self.socket,
            &mut core.tx,
            &mut core.rx,
            core.config.give_up,
            engine,
            |action, source| Error::Io {
                job,
                rank,
                action,
                source,
            },
        )
    }
}

/// What a driver needs from a sans-IO engine: the allreduce [`Engine`] and
/// the multicast [`GroupEngine`] alike.
pub(crate) trait SansIo {
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize>;
    fn handle_packet(&mut self, now: Instant, datagram: &[u8]);
    fn poll_timeout(&self) -> Option<Instant>;
    fn handle_timeout(&mut self, now: Instant);
    fn take_outcome(&mut self) -> Option<Result<Stats, Error>>;
}

/// Implements [`SansIo`] by the engine's methods of the same names.
macro_rules! sans_io {
    ($($ty:ty $(where $t:ident: $bound:path)?),*) => {$(
        impl<$($t: $bound)?> SansIo for $ty {
            fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
                Self::poll_transmit(self, now, buf)
            }
            fn handle_packet(&mut self, now: Instant, datagram: &[u8]) {
                Self::handle_packet(self, now, datagram);
            }
            fn poll_timeout(&self) -> Option<Instant> {
                Self::poll_timeout(self)
            }
            fn handle_timeout(&mut self, now: Instant) {
                Self::handle_timeout(self, now);
            }
            fn take_outcome(&mut self) -> Option<Result<Stats, Error>> {
                Self::take_outcome(self)
            }
        }
    )*};
}
sans_io!(Engine<'_, T> where T: Element, GroupEngine<'_>);

/// Runs `engine` over the blocking socket to its outcome: everything the
/// engine allows goes out a batch at a time, then the driver waits for
/// datagrams until the engine's next deadline.
fn drive<E: SansIo>(
    socket: &mut Socket,
    tx: &mut TxQueue,
    rx: &mut RxBatch,
    give_up: Duration,
    engine: &mut E,
    io_error: impl Fn(&'static str, io::Error) -> Error,
) -> Result<Stats, Error> {
    loop {
        // What the kernel does not take stays queued for the next batch.
        loop {
            tx.fill(|buf| engine.poll_transmit(Instant::now(), buf));
            if tx.is_empty() {
                break;
            }
            socket
                .send_batch(tx, give_up)
                .map_err(|source| io_error("sending to the switch", source))?;
        }
        if let Some(outcome) = engine.take_outcome() {
            return outcome;
        }

        let now = Instant::now();
        let deadline = engine.poll_timeout().unwrap_or(now);
        let wait = deadline.saturating_duration_since(now).min(MAX_WAIT);
        if !wait.is_zero() {
            socket
                .wait(libc::POLLIN, wait)
                .map_err(|source| io_error("waiting for the switch", source))?;
        }
        socket
            .receive_into(engine, rx)
            .map_err(|source| io_error("receiving from the switch", source))?;

        let now = Instant::now();
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
    }
}

/// A member of one multicast group, with its socket: runs broadcasts and
/// allgathers over UDP, blocking the calling thread until each completes or
/// fails. See [`crate::group`] for the protocol.
#[derive(Debug)]
pub struct GroupWorker {
    core: GroupCore,
    socket: Socket,
}

/// What a group member keeps from call to call, whatever drives its socket.
#[derive(Debug)]
pub(crate) struct GroupCore {
    pub(crate) params: GroupParams,
    pub(crate) config: Config,
    state: GroupState,
    pub(crate) tx: TxQueue,
    pub(crate) rx: RxBatch,
}

impl GroupCore {
    pub(crate) fn new(params: GroupParams, config: Config) -> Self {
        Self {
            params,
            config,
            state: GroupState::default(),
            tx: TxQueue::new(GROUP_DATAGRAM_LEN),
            rx: RxBatch::new(GROUP_DATAGRAM_LEN),
        }
    }

    /// The engine of one call, starting where the previous call ended; a
    /// call refused before it starts changes nothing.
    pub(crate) fn engine<'d>(
        &mut self,
        collective: GroupCollective,
        data: &'d mut [u8],
    ) -> Result<GroupEngine<'d>, Error> {
        GroupEngine::new(
            self.params,
            self.config,
            collective,
            data,
            &mut self.state,
            Instant::now(),
        )
    }

    /// Keeps what the next call needs from a finished engine.
    pub(crate) fn finish(&mut self, engine: GroupEngine<'_>) {
        // A failed send leaves datagrams of this call queued; no later call
        // may send them.
        self.tx.clear();
        self.state = engine.into_state();
    }

    pub(crate) fn io_error(&self) -> impl Fn(&'static str, io::Error) -> Error + use<> {
        let params = self.params;
        move |action, source| group_io_error(&params, action, source)
    }
}

impl GroupWorker {
    /// Validates the parameters and binds a UDP socket to `bind` (port 0
    /// picks a free port).
    ///
    /// # Errors
    /// [`Error::InvalidGroup`], [`Error::InvalidConfig`], [`Error::Bind`],
    /// or [`Error::Io`] if the socket cannot be set up.
    pub fn new(params: GroupParams, bind: SocketAddrV4, config: Config) -> Result<Self, Error> {
        let socket = bind_group_socket(&params, bind, &config)?;
        Ok(Self {
            core: GroupCore::new(params, config),
            socket,
        })
    }

    /// As [`Self::new`], on a UDP socket bound already (see
    /// [`Worker::with_socket`]).
    ///
    /// # Errors
    /// As [`Self::new`], but for [`Error::Bind`].
    pub fn with_socket(
        params: GroupParams,
        socket: UdpSocket,
        config: Config,
    ) -> Result<Self, Error> {
        let socket = group_socket(&params, socket, &config)?;
        Ok(Self {
            core: GroupCore::new(params, config),
            socket,
        })
    }

    /// The parameters the worker was created with.
    pub const fn params(&self) -> &GroupParams {
        &self.core.params
    }

    /// Sends runs of full chunks as one segmented send (UDP GSO), or not.
    /// On by default where the kernel has `UDP_SEGMENT`; returns whether it
    /// is on now. Off, every datagram is its own packet from the socket on,
    /// at the cost of more work per datagram in the kernel: a tc program
    /// (or anything else before the device) sees one frame per packet,
    /// where a segmented send reaches it as one packet of many frames.
    pub fn set_segmentation_offload(&mut self, on: bool) -> bool {
        self.socket.set_segmentation_offload(on)
    }

    /// The address the worker's socket is bound to (the address the switch
    /// must know this rank by).
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddrV4, Error> {
        self.socket.local_addr_or(self.core.io_error())
    }

    /// Copies `root`'s `data` into every member's `data` (the same length on
    /// every member).
    ///
    /// # Errors
    /// [`Error::GroupStalled`] when nothing moved for `give_up` (naming the
    /// receivers the switch reports missing, or the silent root),
    /// [`Error::RootOutOfRange`], [`Error::Io`].
    pub fn broadcast(&mut self, root: u8, data: &mut [u8]) -> Result<Stats, Error> {
        self.run(GroupCollective::Broadcast { root }, data)
    }

    /// Every member's part `rank` of `data` (`fan_in` equal parts) ends up in
    /// every member's `data`.
    ///
    /// # Errors
    /// As [`broadcast`](Self::broadcast), and [`Error::LengthNotDivisible`].
    pub fn allgather(&mut self, data: &mut [u8]) -> Result<Stats, Error> {
        self.run(GroupCollective::Allgather, data)
    }

    fn run(&mut self, collective: GroupCollective, data: &mut [u8]) -> Result<Stats, Error> {
        let core = &mut self.core;
        let mut engine = core.engine(collective, data)?;
        let io_error = core.io_error();
        let outcome = drive(
            &mut self.socket,
            &mut core.tx,
            &mut core.rx,
            core.config.give_up,
            &mut engine,
            io_error,
        );
        core.finish(engine);
        outcome
    }
}

/// Validates a group member's parameters and binds its socket.
pub(crate) fn bind_group_socket(
    params: &GroupParams,
    bind: SocketAddrV4,
    config: &Config,
) -> Result<Socket, Error> {
    params.validate()?;
    config.validate()?;
    let socket = UdpSocket::bind(bind).map_err(|source| Error::Bind { addr: bind, source })?;
    group_socket(params, socket, config)
}

/// Validates a group member's parameters and takes `socket`, bound
/// already, making it non-blocking.
pub(crate) fn group_socket(
    params: &GroupParams,
    socket: UdpSocket,
    config: &Config,
) -> Result<Socket, Error> {
    params.validate()?;
    config.validate()?;
    socket
        .set_nonblocking(true)
        .map_err(|e| group_io_error(params, "making the socket non-blocking", e))?;
    Ok(Socket::new(socket, params.switch))
}

/// An [`Error::Io`] of a group member (the group id in the job field).
pub(crate) fn group_io_error(
    params: &GroupParams,
    action: &'static str,
    source: io::Error,
) -> Error {
    Error::Io {
        job: params.group,
        rank: params.rank,
        action,
        source,
    }
}

/// Datagrams written by the engine and not yet taken by the kernel, oldest
/// first: a ring of [`BATCH`] buffers of the job's longest datagram (at
/// most [`MAX_DATAGRAM_LEN`] bytes).
pub(crate) struct TxQueue {
    bytes: Box<[u8]>,
    /// Bytes of each buffer.
    stride: usize,
    /// The length of the datagram in each buffer.
    lens: [usize; BATCH],
    /// The buffer of the oldest queued datagram.
    head: usize,
    /// How many datagrams are queued.
    len: usize,
}

impl TxQueue {
    /// A queue of buffers of `stride` bytes (at most [`MAX_DATAGRAM_LEN`]).
    pub(crate) fn new(stride: usize) -> Self {
        let stride = stride.clamp(1, MAX_DATAGRAM_LEN);
        Self {
            bytes: vec![0; BATCH * stride].into_boxed_slice(),
            stride,
            lens: [0; BATCH],
            head: 0,
            len: 0,
        }
    }

    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    pub(crate) const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues datagrams behind those already queued, until the queue is full
    /// or `write` (which writes one datagram into the buffer it is given and
    /// returns its length) has nothing more.
    pub(crate) fn fill(&mut self, mut write: impl FnMut(&mut [u8]) -> Option<usize>) {
        while self.len < BATCH {
            let slot = (self.head + self.len) % BATCH;
            let buf = &mut self.bytes[slot * self.stride..][..self.stride];
            let Some(len) = write(buf) else { break };
            self.lens[slot] = len;
            self.len += 1;
        }
    }

    /// The `i`-th queued datagram, oldest first.
    fn get(&self, i: usize) -> &[u8] {
        debug_assert!(i < self.len, "datagram {i} of {}", self.len);
        let slot = (self.head + i) % BATCH;
        &self.bytes[slot * self.stride..][..self.lens[slot]]
    }

    /// How many queued datagrams, from the `first`, go out in one message:
    /// one without GSO; with GSO, the run of datagrams as long as the
    /// `first` (the kernel cuts a segmented send into equal parts), up to
    /// [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_PAYLOAD`] bytes. 0 if `first` is
    /// past the queue.
    fn message_len(&self, first: usize, gso: bool) -> usize {
        if first >= self.len {
            return 0;
        }
        if !gso {
            return 1;
        }
        let len = self.get(first).len();
        let most = (GSO_MAX_PAYLOAD / len.max(1)).clamp(1, GSO_MAX_SEGMENTS);
        (first..self.len)
            .take(most)
            .take_while(|&i| self.get(i).len() == len)
            .count()
    }

    /// Forgets the `n` oldest datagrams (the kernel took them).
    fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = (self.head + n) % BATCH;
        self.len -= n;
    }

    pub(crate) const fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxQueue")
            .field("queued", &self.len)
            .finish_non_exhaustive()
    }
}

/// The buffers one `recvmmsg(2)` fills: [`BATCH`] of the job's longest
/// datagram.
///
/// No datagram the engine accepts is longer, and the engine reads only the
/// header and the payload the header announces, so a longer datagram cut to
/// this size gets the same verdict as it would whole.
pub(crate) struct RxBatch {
    bytes: Box<[u8]>,
    /// Bytes of each buffer.
    stride: usize,
    /// The length of the datagram read into each buffer.
    lens: [usize; BATCH],
}

impl RxBatch {
    /// Buffers of `stride` bytes (at most [`MAX_DATAGRAM_LEN`]).
    pub(crate) fn new(stride: usize) -> Self {
        let stride = stride.clamp(1, MAX_DATAGRAM_LEN);
        Self {
            bytes: vec![0; BATCH * stride].into_boxed_slice(),
            stride,
            lens: [0; BATCH],
        }
    }

    /// The first `count` datagrams of the last read.
    fn datagrams(&self, count: usize) -> impl Iterator<Item = &[u8]> {
        self.bytes
            .chunks_exact(self.stride)
            .zip(&self.lens)
            .take(count)
            .map(|(buf, &len)| &buf[..len])
    }
}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBatch").finish_non_exhaustive()
    }
}

/// The control buffer of one segmented send, aligned for a `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct GsoControl([u8; GSO_CMSG_SPACE]);

const _: () = assert!(align_of::<libc::cmsghdr>() <= align_of::<GsoControl>());

/// The worker's UDP socket, up to [`BATCH`] datagrams per system call.
#[derive(Debug)]
pub(crate) struct Socket {
    inner: UdpSocket,
    switch: SocketAddrV4,
    /// Whether runs of equal datagrams go out as one segmented (GSO) send.
    gso: bool,
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.as_raw_fd()
    }
}

impl Socket {
    /// Wraps a non-blocking socket that sends to `switch`: grows its buffers
    /// and finds out whether the kernel knows `UDP_SEGMENT`.
    pub(crate) fn new(inner: UdpSocket, switch: SocketAddrV4) -> Self {
        let mut socket = Self {
            inner,
            switch,
            gso: false,
        };
        socket.grow_buffers();
        socket.gso = socket.probe_gso();
        socket
    }

    /// Turns segmented sends off, or on again if the kernel has them;
    /// returns whether they are on.
    pub(crate) fn set_segmentation_offload(&mut self, on: bool) -> bool {
        self.gso = on && self.probe_gso();
        self.gso
    }

    /// Whether the kernel knows the `UDP_SEGMENT` socket option (Linux 4.18),
    /// hence the control message of the same name.
    fn probe_gso(&self) -> bool {
        let mut value: libc::c_int = 0;
        let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>())
            .expect("the size of a c_int fits a socklen_t");
        // SAFETY: the descriptor is open for as long as `self.inner` lives;
        // the value points to a live c_int and `len` to its size, which the
        // kernel writes no more than.
        let rc = unsafe {
            libc::getsockopt(
                self.inner.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                (&raw mut value).cast(),
                &raw mut len,
            )
        };
        if rc != 0 {
            log::debug!("no UDP GSO: {}", io::Error::last_os_error());
        }
        rc == 0
    }

    /// Asks for [`SOCKET_BUFFER_BYTES`] of send and receive buffer, past
    /// `net.core.rmem_max` / `wmem_max` where the process may (`CAP_NET_ADMIN`:
    /// the `FORCE` options), else up to them; a refusal is logged, not fatal.
    /// A window of 64 KB results needs more than the kernel's default cap.
    fn grow_buffers(&self) {
        let bytes = libc::c_int::try_from(SOCKET_BUFFER_BYTES).unwrap_or(libc::c_int::MAX);
        let set = |option: libc::c_int| {
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
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        for (force, plain, name) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, "SO_RCVBUF"),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, "SO_SNDBUF"),
        ] {
            if set(force).is_err()
                && let Err(e) = set(plain)
            {
                log::debug!("setting {name} to {bytes}: {e}");
            }
        }
    }

    /// Offers the queued datagrams to the kernel in one `sendmmsg(2)` and
    /// removes from the queue those it took, at least one; the others stay
    /// queued in order. Waits for buffer space for up to `limit` when the
    /// kernel takes none. A message the kernel drops (`ENOBUFS`, an ICMP
    /// error left from an earlier send) counts as sent: to the engine its
    /// datagrams are lost. Turns GSO off for good when the kernel refuses a
    /// segmented send.
    fn send_batch(&mut self, queue: &mut TxQueue, limit: Duration) -> io::Result<()> {
        let started = Instant::now();
        loop {
            match self.try_send_batch(queue) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if started.elapsed() >= limit {
                        return Err(no_buffer_space(limit));
                    }
                    self.wait(libc::POLLOUT, SEND_WAIT)?;
                }
                other => return other,
            }
        }
    }

    /// [`send_batch`](Self::send_batch) without waiting: `WouldBlock` when
    /// the kernel takes nothing.
    pub(crate) fn try_send_batch(&mut self, queue: &mut TxQueue) -> io::Result<()> {
        loop {
            match self.sendmmsg(queue) {
                Ok(sent) => {
                    queue.consume(sent);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        || e.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    log::trace!("datagram to {} dropped by the kernel: {e}", self.switch);
                    queue.consume(queue.message_len(0, self.gso));
                    return Ok(());
                }
                // The first message failed whole, so nothing was sent: the
                // same datagrams go again, one per message.
                Err(e)
                    if queue.message_len(0, self.gso) > 1
                        && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) =>
                {
                    log::debug!("UDP GSO to {} refused, turned off: {e}", self.switch);
                    self.gso = false;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One `sendmmsg(2)` of the queued datagrams, oldest first, to the switch,
    /// a message per datagram or (with GSO) per run of equal datagrams;
    /// returns how many datagrams the kernel took (the first ones, at least
    /// one).
    fn sendmmsg(&self, queue: &TxQueue) -> io::Result<usize> {
        let count = queue.len();
        if count == 0 {
            return Ok(0);
        }
        let ip = self.switch.ip().octets();
        let addr = libc::sockaddr_in {
            sin_family: libc::sa_family_t::try_from(libc::AF_INET)
                .expect("AF_INET fits a sa_family_t"),
            sin_port: self.switch.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(ip),
            },
            sin_zero: [0; 8],
        };
        let addr_len = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>())
            .expect("the size of a sockaddr_in fits a socklen_t");
        let mut iovecs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        for (i, iovec) in iovecs.iter_mut().enumerate().take(count) {
            let datagram = queue.get(i);
            // The kernel only reads through this pointer (the cast to `*mut`
            // is what the C type asks for).
            iovec.iov_base = datagram.as_ptr().cast_mut().cast();
            iovec.iov_len = datagram.len();
        }
        // One pointer for all headers: a new borrow of the array per header
        // would invalidate the pointers taken before it.
        let iovecs = iovecs.as_mut_ptr();
        let mut controls = [GsoControl([0; GSO_CMSG_SPACE]); BATCH];
        // SAFETY: `mmsghdr` is a C struct of integers and raw pointers (and,
        // on some targets, private padding integers), for all of which zero
        // is a valid value: null pointers and zero lengths.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        // Datagrams per message.
        let mut sizes = [0; BATCH];
        let mut messages = 0;
        let mut first = 0;
        while first < count {
            let size = queue.message_len(first, self.gso);
            let hdr = &mut headers[messages].msg_hdr;
            hdr.msg_name = (&raw const addr).cast_mut().cast();
            hdr.msg_namelen = addr_len;
            // In bounds: `first < count <= BATCH`.
            hdr.msg_iov = iovecs.wrapping_add(first);
            hdr.msg_iovlen = size;
            if size > 1 {
                let segment = GsoSize::try_from(queue.get(first).len())
                    .expect("a datagram's length fits a u16");
                hdr.msg_control = (&raw mut controls[messages]).cast();
                hdr.msg_controllen = GSO_CMSG_SPACE;
                // SAFETY: `msg_control` points to a live, zeroed buffer of
                // `msg_controllen` = `CMSG_SPACE(size_of::<GsoSize>())` bytes,
                // aligned for a `cmsghdr` (`GsoControl` is 8-aligned), so
                // `CMSG_FIRSTHDR` returns a pointer to a `cmsghdr` at its
                // start, not null, and `CMSG_DATA` of it is followed by room
                // for a `GsoSize` within the buffer (written unaligned).
                unsafe {
                    let cmsg = libc::CMSG_FIRSTHDR(&raw const *hdr);
                    (*cmsg).cmsg_level = libc::SOL_UDP;
                    (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                    (*cmsg).cmsg_len = GSO_CMSG_LEN;
                    libc::CMSG_DATA(cmsg)
                        .cast::<GsoSize>()
                        .write_unaligned(segment);
                }
            }
            sizes[messages] = size;
            messages += 1;
            first += size;
        }
        let vlen = libc::c_uint::try_from(messages).expect("a batch fits a c_uint");
        // SAFETY: the descriptor is open for as long as `self.inner` lives.
        // The first `messages` headers each point to `addr` with its size,
        // to their own `size` consecutive live iovecs (all within the first
        // `count`), and, when `size > 1`, to their own control buffer with
        // its size; every iovec points into a queued datagram and has its
        // length. `queue`, `addr`, `iovecs`, `controls` and `headers` all
        // outlive the call, and the kernel writes only the headers'
        // `msg_len` fields.
        let rc = unsafe { libc::sendmmsg(self.inner.as_raw_fd(), headers.as_mut_ptr(), vlen, 0) };
        match usize::try_from(rc) {
            Ok(sent) => Ok(sizes[..sent.min(messages)].iter().sum()),
            Err(_) => Err(io::Error::last_os_error()),
        }
    }

    /// Gives the engine what has arrived: batches until the socket is drained
    /// or [`RECV_BURST`] datagrams were read.
    pub(crate) fn receive_into<E: SansIo>(
        &self,
        engine: &mut E,
        rx: &mut RxBatch,
    ) -> io::Result<usize> {
        let mut received = 0;
        while received < RECV_BURST {
            let count = self.recv_batch(rx)?;
            let now = Instant::now();
            for datagram in rx.datagrams(count) {
                engine.handle_packet(now, datagram);
            }
            received += count;
            if count < BATCH {
                // The socket is drained.
                break;
            }
        }
        Ok(received)
    }

    /// The address the socket is bound to.
    pub(crate) fn local_addr(&self, core: &Core) -> Result<SocketAddrV4, Error> {
        self.local_addr_or(|action, source| core.io_error(action, source))
    }

    /// The address the socket is bound to, failures made errors by `error`.
    pub(crate) fn local_addr_or(
        &self,
        error: impl Fn(&'static str, io::Error) -> Error,
    ) -> Result<SocketAddrV4, Error> {
        match self.inner.local_addr() {
            Ok(SocketAddr::V4(addr)) => Ok(addr),
            Ok(SocketAddr::V6(_)) => Err(error(
                "reading the local address",
                io::Error::new(io::ErrorKind::Unsupported, "the socket is not IPv4"),
            )),
            Err(source) => Err(error("reading the local address", source)),
        }
    }

    /// Reads into `batch` the datagrams waiting, up to [`BATCH`], in one
    /// `recvmmsg(2)`; returns how many (0 when none is waiting).
    fn recv_batch(&self, batch: &mut RxBatch) -> io::Result<usize> {
        let mut iovecs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        // SAFETY: as in `sendmmsg`, zero is a valid `mmsghdr`. A null
        // `msg_name` asks the kernel not to report the source address.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for ((iovec, header), buf) in iovecs
            .iter_mut()
            .zip(&mut headers)
            .zip(batch.bytes.chunks_exact_mut(batch.stride))
        {
            iovec.iov_base = buf.as_mut_ptr().cast();
            iovec.iov_len = buf.len();
            header.msg_hdr.msg_iov = &raw mut *iovec;
            header.msg_hdr.msg_iovlen = 1;
        }
        let vlen = libc::c_uint::try_from(BATCH).expect("a batch fits a c_uint");
        loop {
            // SAFETY: the descriptor is open for as long as `self.inner`
            // lives. Each of the `BATCH` headers points to one live iovec,
            // and each iovec to its own `stride`-byte buffer of
            // `batch.bytes` with that length, so the kernel writes only into
            // those buffers and into the headers' `msg_len` and `msg_flags`.
            // All of them outlive the call, and nothing else touches
            // `batch.bytes` during it. A null timeout means none.
            let rc = unsafe {
                libc::recvmmsg(
                    self.inner.as_raw_fd(),
                    headers.as_mut_ptr(),
                    vlen,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            let Ok(count) = usize::try_from(rc) else {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(0),
                    // Interrupted, or an ICMP error from an earlier send (the
                    // engine's timers deal with that loss): read again.
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => continue,
                    _ => return Err(e),
                }
            };
            for (len, header) in batch.lens.iter_mut().zip(&headers).take(count) {
                if header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    log::trace!("a datagram longer than {} bytes was cut", batch.stride);
                }
                *len =
                    usize::try_from(header.msg_len).map_or(batch.stride, |n| n.min(batch.stride));
            }
            return Ok(count);
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use super::{BATCH, GROUP_DATAGRAM_LEN, GSO_MAX_PAYLOAD, MAX_DATAGRAM_LEN, Socket, TxQueue};

    /// A full datagram of one 1,500-byte frame (1,472 bytes).
    const NARROW: usize = GROUP_DATAGRAM_LEN;

    /// Queues one datagram per entry of `lens`, of that length, filled with
    /// its index.
    fn queue_of(lens: &[usize]) -> TxQueue {
        let mut queue = TxQueue::new(lens.iter().copied().max().unwrap_or(1).max(NARROW));
        let mut next = 0;
        queue.fill(|buf| {
            let &len = lens.get(next)?;
            buf[..len].fill(u8::try_from(next).unwrap());
            next += 1;
            Some(len)
        });
        assert_eq!(next, lens.len(), "at most BATCH datagrams");
        queue
    }

    /// The lengths of the messages the queue would go out in.
    fn messages(queue: &TxQueue, gso: bool) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut first = 0;
        while first < queue.len() {
            let size = queue.message_len(first, gso);
            sizes.push(size);
            first += size;
        }
        assert_eq!(queue.message_len(first, gso), 0);
        sizes
    }

    #[test]
    fn segmented_sends_are_runs_of_equal_datagrams_within_the_kernels_limits() {
        // Full 1,472-byte datagrams: 44 fit one IPv4 datagram.
        let queue = queue_of(&[NARROW; BATCH]);
        assert_eq!(GSO_MAX_PAYLOAD / NARROW, 44);
        assert_eq!(messages(&queue, true), [44, BATCH - 44]);
        assert_eq!(messages(&queue, false), [1; BATCH]);
        // Chunks of 256 elements (1,056 bytes): 62.
        assert_eq!(messages(&queue_of(&[1056; BATCH]), true), [62, 2]);
        // Small datagrams: at most 64 segments.
        assert_eq!(messages(&queue_of(&[40; BATCH]), true), [BATCH]);
        // A run ends where the length changes.
        let queue = queue_of(&[1056, 1056, 1056, 100, 1056, 1056, 36]);
        assert_eq!(messages(&queue, true), [3, 1, 2, 1]);
    }

    /// Sends `lens.len()` datagrams through a [`Socket`] to a plain socket on
    /// loopback and checks that each arrives on its own, whole and in order;
    /// returns whether the socket still uses GSO. `prepare` gets the sending
    /// socket first.
    fn send_and_check(lens: &[usize], prepare: impl FnOnce(&mut Socket)) -> bool {
        let receiver = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let SocketAddr::V4(to) = receiver.local_addr().unwrap() else {
            unreachable!()
        };
        // Room for a whole batch of segments in the receive queue.
        Socket::new(receiver.try_clone().unwrap(), to);
        receiver
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let inner = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        inner.set_nonblocking(true).unwrap();
        let mut socket = Socket::new(inner, to);
        prepare(&mut socket);
        let mut queue = queue_of(lens);
        while !queue.is_empty() {
            socket
                .send_batch(&mut queue, Duration::from_secs(5))
                .unwrap();
        }
        let mut buf = vec![0; 2 * GSO_MAX_PAYLOAD];
        for (i, &len) in lens.iter().enumerate() {
            let got = receiver.recv(&mut buf).unwrap();
            assert_eq!(got, len, "datagram {i}");
            assert!(
                buf[..got].iter().all(|&b| usize::from(b) == i),
                "datagram {i} holds another's bytes"
            );
        }
        receiver.set_nonblocking(true).unwrap();
        assert!(receiver.recv(&mut buf).is_err(), "a datagram too many");
        socket.gso
    }

    #[test]
    fn a_batch_arrives_as_separate_whole_datagrams_in_order() {
        let mut lens = vec![NARROW; BATCH];
        lens[50] = 100;
        lens[63] = 36;
        let gso = send_and_check(&lens, |_| ());
        println!("UDP GSO {}", if gso { "used" } else { "unavailable" });
        send_and_check(&[1056, 1056, 1056, 500, 1056, 1056, 36], |_| ());
        send_and_check(&[40], |_| ());
    }

    #[test]
    fn wide_datagrams_go_whole_one_per_message() {
        // 64 KB frames: one datagram is as big as a segmented send may be.
        assert_eq!(GSO_MAX_PAYLOAD / MAX_DATAGRAM_LEN, 1);
        let mut lens = vec![MAX_DATAGRAM_LEN; 12];
        lens[5] = 8_960;
        lens[11] = 36;
        assert_eq!(messages(&queue_of(&lens), true), [1; 12]);
        send_and_check(&lens, |_| ());
        // 9000-byte frames: seven to a segmented send.
        assert_eq!(messages(&queue_of(&[8_972; 20]), true), [7, 7, 6]);
        send_and_check(&[8_972; 20], |_| ());
    }

    #[test]
    fn segmentation_offload_turned_off_stays_off_and_comes_back_on_request() {
        let mut probed = false;
        let gso = send_and_check(&[8_972; 20], |socket| {
            probed = socket.gso;
            assert!(!socket.set_segmentation_offload(false));
        });
        assert!(!gso, "a full batch went out segmented after all");
        let gso = send_and_check(&[8_972; 20], |socket| {
            socket.set_segmentation_offload(false);
            assert_eq!(socket.set_segmentation_offload(true), probed);
        });
        assert_eq!(gso, probed);
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn a_refused_segmented_send_goes_again_unsegmented() {
        // Linux refuses GSO (EINVAL) on a socket that sends without UDP
        // checksums: `SO_NO_CHECK`, 11 on these architectures (the libc crate
        // does not name it for Linux).
        const SO_NO_CHECK: libc::c_int = 11;
        let mut had_gso = false;
        let lens = [NARROW; 10];
        let gso = send_and_check(&lens, |socket| {
            had_gso = socket.gso;
            let on: libc::c_int = 1;
            // SAFETY: the descriptor is open while `socket` lives; the value
            // points to a live c_int and the length is its size.
            let rc = unsafe {
                libc::setsockopt(
                    socket.inner.as_raw_fd(),
                    libc::SOL_SOCKET,
                    SO_NO_CHECK,
                    (&raw const on).cast(),
                    libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap(),
                )
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        });
        assert!(!gso, "GSO is off after the kernel refused it");
        if !had_gso {
            println!("UDP GSO unavailable: nothing to fall back from");
        }
    }

    /// Queues datagrams `from..` (each a single byte holding its number, to
    /// the length of its number modulo 7 plus 1) until the queue is full or
    /// `until` is reached; returns where it stopped.
    fn queue_numbered(queue: &mut TxQueue, from: u8, until: u8) -> u8 {
        let mut next = from;
        queue.fill(|buf| {
            assert_eq!(buf.len(), NARROW);
            if next == until {
                return None;
            }
            let len = usize::from(next % 7) + 1;
            buf[..len].fill(next);
            next += 1;
            Some(len)
        });
        next
    }

    fn queued(queue: &TxQueue) -> Vec<u8> {
        (0..queue.len())
            .map(|i| {
                let datagram = queue.get(i);
                assert_eq!(datagram.len(), usize::from(datagram[0] % 7) + 1);
                assert!(datagram.iter().all(|&b| b == datagram[0]));
                datagram[0]
            })
            .collect()
    }

    #[test]
    fn partial_sends_keep_the_rest_queued_in_order_across_the_ring_boundary() {
        let mut queue = TxQueue::new(NARROW);
        let batch = u8::try_from(BATCH).unwrap();
        // A full queue: the writer is not asked for more than fits.
        let next = queue_numbered(&mut queue, 0, 200);
        assert_eq!(next, batch);
        assert_eq!(queued(&queue), (0..batch).collect::<Vec<_>>());

        // The kernel takes 40: 24 stay at the front, and the 40 new ones
        // wrap around the end of the ring behind them.
        queue.consume(40);
        let next = queue_numbered(&mut queue, next, 200);
        assert_eq!(next, batch + 40);
        assert_eq!(queued(&queue), (40..batch + 40).collect::<Vec<_>>());

        // Then it takes 10, and the writer has only 5 more; then the kernel
        // takes everything.
        queue.consume(10);
        let next = queue_numbered(&mut queue, next, batch + 45);
        assert_eq!(next, batch + 45);
        assert_eq!(queued(&queue), (50..batch + 45).collect::<Vec<_>>());
        queue.consume(BATCH);
        assert!(queue.is_empty());
        let next = queue_numbered(&mut queue, next, 200);
        assert_eq!(queued(&queue), (batch + 45..next).collect::<Vec<_>>());
        assert_eq!(queue.len(), BATCH);

        queue.clear();
        assert!(queue.is_empty());
        assert_eq!(queue_numbered(&mut queue, 7, 9), 9);
        assert_eq!(queued(&queue), [7, 8]);
    }
}

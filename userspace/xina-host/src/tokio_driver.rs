//! The tokio driver: an [`AsyncWorker`] runs the same [`Engine`] and the same
//! plans as the blocking [`Worker`](crate::Worker), over the same batched
//! socket, but waits by awaiting readiness and deadlines instead of blocking
//! a thread.
//!
//! It needs a tokio runtime with I/O and time enabled (`enable_io`,
//! `enable_time`, as `#[tokio::main]` gives). One call at a time per worker:
//! the methods take `&mut self`.

use std::io;
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use xina_proto::DType;

use crate::call::{Scalar, Step, StepData, StepOutcome};
use crate::engine::{Collective, Config, Element, Engine, RttEstimator, Stats};
use crate::error::Error;
use crate::group::{GroupCollective, GroupParams};
use crate::udp::{
    Core, GroupCore, JobParams, MAX_WAIT, RxBatch, SansIo, Socket, TxQueue, bind_group_socket,
    group_io_error, no_buffer_space, run_plan,
};

/// A worker of one job driven by tokio; see [`Worker`](crate::Worker) for
/// the meaning of every call, which is the same here.
#[derive(Debug)]
pub struct AsyncWorker {
    core: Core,
    socket: AsyncFd<Socket>,
}

impl AsyncWorker {
    /// Validates the parameters and binds a UDP socket to `bind`, registered
    /// with the current tokio runtime.
    ///
    /// # Errors
    /// As [`Worker::new`](crate::Worker::new); [`Error::Io`] if there is no
    /// runtime with I/O enabled.
    pub fn new(params: JobParams, bind: SocketAddrV4, config: Config) -> Result<Self, Error> {
        let (core, socket) = Core::bind(params, bind, config)?;
        // SAFETY: `Socket` owns its `UdpSocket`, whose descriptor stays open
        // and unchanged until the socket is dropped, with the `AsyncFd`.
        let socket = unsafe { AsyncFd::register(socket) }
            .map_err(|e| core.io_error("registering the socket with tokio", e.into()))?;
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
        self.socket.get_mut().set_segmentation_offload(on)
    }

    /// The address the worker's socket is bound to.
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddrV4, Error> {
        self.socket.get_ref().local_addr(&self.core)
    }

    /// The chunk number the next collective starts at.
    pub const fn next_chunk(&self) -> u64 {
        self.core.next_chunk
    }

    /// The round-trip estimate carried from call to call.
    pub const fn rtt(&self) -> &RttEstimator {
        &self.core.rtt
    }

    /// The congestion window carried from call to call.
    pub const fn window(&self) -> &crate::congestion::Window {
        &self.core.window
    }

    /// See [`Worker::allreduce`](crate::Worker::allreduce).
    ///
    /// # Errors
    /// As there.
    pub async fn allreduce<S: Scalar>(&mut self, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::Allreduce, data).await
    }

    /// See [`Worker::reduce`](crate::Worker::reduce).
    ///
    /// # Errors
    /// As there.
    pub async fn reduce<S: Scalar>(&mut self, root: u8, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::Reduce { root }, data).await
    }

    /// See [`Worker::reduce_scatter`](crate::Worker::reduce_scatter).
    ///
    /// # Errors
    /// As there.
    pub async fn reduce_scatter<S: Scalar>(&mut self, data: &mut [S]) -> Result<Stats, Error> {
        self.call(Collective::ReduceScatter, data).await
    }

    /// See [`Worker::barrier`](crate::Worker::barrier).
    ///
    /// # Errors
    /// As there.
    pub async fn barrier(&mut self) -> Result<Stats, Error> {
        match self.core.params.dtype {
            // A group's member cannot take part in a barrier: the engine
            // refuses the type (`Error::WrongType`).
            DType::I32 | DType::Bytes => self.call::<i32>(Collective::Barrier, &mut []).await,
            DType::I64 => self.call::<i64>(Collective::Barrier, &mut []).await,
        }
    }

    /// See [`Worker::call`](crate::Worker::call).
    ///
    /// # Errors
    /// As there.
    pub async fn call<S: Scalar>(
        &mut self,
        collective: Collective,
        data: &mut [S],
    ) -> Result<Stats, Error> {
        let member = self.core.params.member();
        let plan = S::plan(&member, &self.core.config, collective, data)?;
        run_plan!(plan, |collective, data, tolerate| self
            .run(collective, data, tolerate)
            .await)
    }

    async fn run<T: Element>(
        &mut self,
        collective: Collective,
        data: &mut [T],
        tolerate_overflow: bool,
    ) -> Result<StepOutcome, Error> {
        let mut engine = self.core.engine(collective, data, tolerate_overflow)?;
        let outcome = self.drive(&mut engine).await;
        self.core.finish(&engine, outcome)
    }

    async fn drive<T: Element>(&mut self, engine: &mut Engine<'_, T>) -> Result<Stats, Error> {
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
        .await
    }
}

/// Runs `engine` over the tokio-registered socket to its outcome (the async
/// twin of the blocking driver in [`crate::udp`]).
async fn drive<E: SansIo>(
    socket: &mut AsyncFd<Socket>,
    tx: &mut TxQueue,
    rx: &mut RxBatch,
    give_up: Duration,
    engine: &mut E,
    io_error: impl Fn(&'static str, io::Error) -> Error,
) -> Result<Stats, Error> {
    loop {
        let send_started = Instant::now();
        loop {
            tx.fill(|buf| engine.poll_transmit(Instant::now(), buf));
            if tx.is_empty() {
                break;
            }
            let sent =
                tokio::time::timeout(give_up.saturating_sub(send_started.elapsed()), async {
                    loop {
                        let mut guard = socket.writable_mut().await?;
                        match guard.try_io(|s| s.get_mut().try_send_batch(tx)) {
                            Ok(result) => return result,
                            Err(_would_block) => {}
                        }
                    }
                })
                .await;
            match sent {
                Ok(result) => result.map_err(|source| io_error("sending to the switch", source))?,
                Err(_elapsed) => {
                    return Err(io_error("sending to the switch", no_buffer_space(give_up)));
                }
            }
        }
        if let Some(outcome) = engine.take_outcome() {
            return outcome;
        }

        let now = Instant::now();
        let deadline = engine.poll_timeout().unwrap_or(now).min(now + MAX_WAIT);
        let received = tokio::time::timeout_at(deadline.into(), async {
            loop {
                let mut guard = socket.readable_mut().await?;
                match guard.try_io(|s| {
                    let n = s.get_ref().receive_into(engine, rx)?;
                    if n == 0 {
                        Err(io::ErrorKind::WouldBlock.into())
                    } else {
                        Ok(n)
                    }
                }) {
                    Ok(result) => return result,
                    Err(_would_block) => {}
                }
            }
        })
        .await;
        if let Ok(result) = received {
            result.map_err(|source| io_error("receiving from the switch", source))?;
        }

        let now = Instant::now();
        if engine.poll_timeout().is_some_and(|t| t <= now) {
            engine.handle_timeout(now);
        }
    }
}

/// A member of one multicast group driven by tokio; see
/// [`GroupWorker`](crate::GroupWorker) for the meaning of every call, which
/// is the same here.
#[derive(Debug)]
pub struct AsyncGroupWorker {
    core: GroupCore,
    socket: AsyncFd<Socket>,
}

impl AsyncGroupWorker {
    /// Validates the parameters and binds a UDP socket to `bind`, registered
    /// with the current tokio runtime.
    ///
    /// # Errors
    /// As [`GroupWorker::new`](crate::GroupWorker::new); [`Error::Io`] if
    /// there is no runtime with I/O enabled.
    pub fn new(params: GroupParams, bind: SocketAddrV4, config: Config) -> Result<Self, Error> {
        let socket = bind_group_socket(&params, bind, &config)?;
        // SAFETY: as in `AsyncWorker::new`.
        let socket = unsafe { AsyncFd::register(socket) }
            .map_err(|e| group_io_error(&params, "registering the socket with tokio", e.into()))?;
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
        self.socket.get_mut().set_segmentation_offload(on)
    }

    /// The address the worker's socket is bound to.
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot tell.
    pub fn local_addr(&self) -> Result<SocketAddrV4, Error> {
        self.socket.get_ref().local_addr_or(self.core.io_error())
    }

    /// See [`GroupWorker::broadcast`](crate::GroupWorker::broadcast).
    ///
    /// # Errors
    /// As there.
    pub async fn broadcast(&mut self, root: u8, data: &mut [u8]) -> Result<Stats, Error> {
        self.run(GroupCollective::Broadcast { root }, data).await
    }

    /// See [`GroupWorker::allgather`](crate::GroupWorker::allgather).
    ///
    /// # Errors
    /// As there.
    pub async fn allgather(&mut self, data: &mut [u8]) -> Result<Stats, Error> {
        self.run(GroupCollective::Allgather, data).await
    }

    async fn run(&mut self, collective: GroupCollective, data: &mut [u8]) -> Result<Stats, Error> {
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
        )
        .await;
        core.finish(engine);
        outcome
    }
}

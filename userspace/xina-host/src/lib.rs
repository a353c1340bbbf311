//! The xina worker library: collectives over an xina aggregation switch.
//!
//! A worker sends its buffer to the switch in chunks of `E` elements, one
//! chunk per UDP datagram; the switch combines each chunk over the job's
//! `fan_in` ranks in one of the job's `W` aggregator slots and sends the
//! result back — to every rank (allreduce), or to the chunk's root with a
//! payload-less notice to the others (reduce, reduce-scatter). This crate is
//! everything on the worker's side of that exchange: chunking, a window of
//! outstanding chunks bounded by the slots, timeouts with backoff,
//! retransmission, duplicate suppression, reassembly in place, and errors
//! that say which sequence numbers are missing.
//!
//! # Collectives
//!
//! | call | job mode | result |
//! |---|---|---|
//! | [`Worker::allreduce`] | allreduce | every rank's buffer holds the combination |
//! | [`Worker::reduce`] | reduce | the root's buffer holds it; the others' are unchanged |
//! | [`Worker::reduce_scatter`] | reduce-scatter | the buffer is cut into `fan_in` equal parts; rank `r`'s part `r` holds its combination, the rest is unchanged |
//! | [`Worker::barrier`] | any | returns once every rank has called it |
//!
//! The operation (sum, max, min), the element type and the delivery mode are
//! the job's, fixed when the control plane installs it ([`JobParams`] must
//! say the same); a call the job cannot carry fails before anything is sent
//! ([`Error::WrongType`], [`Error::WrongMode`]). Buffers are `i32`, `i64`
//! (on int64 jobs) or `f32` (on int32 jobs, as fixed point with a scale the
//! ranks agree on through the switch, within a documented error bound; max
//! and min are exact: see [`float`]). Every call starts with a *call check*
//! that makes ranks which called different collectives or lengths fail with
//! [`Error::CallMismatch`] instead of combining unrelated data (see
//! [`engine`]).
//!
//! # Engine and drivers
//!
//! The protocol lives in a sans-IO state machine, [`Engine`]: it takes
//! events (a datagram arrived, a deadline passed, each with the current
//! time) and produces actions (a datagram to send, the next deadline, the
//! outcome). It never touches a socket or a clock. A call of any element type
//! is a [`call::Plan`] of one or more engine runs (floats take several), so
//! the same code runs
//!
//! - over UDP in [`Worker`] (module [`udp`]), a blocking driver that batches
//!   system calls (`sendmmsg`/`recvmmsg`, UDP GSO);
//! - over the same batched socket in [`AsyncWorker`], whose methods are
//!   `async` and wait on tokio's reactor and timers instead of blocking;
//! - against [`sim::SwitchModel`] over the deterministic lossy network of
//!   [`sim`], with simulated time, in tests.
//!
//! # Sequence continuity
//!
//! Every chunk a worker sends has a chunk number that keeps growing over the
//! worker's life: a collective starts where the previous one ended
//! ([`Engine::next_chunk`]), whether that one succeeded or not. The
//! sequence number on the wire is the chunk number `c` modulo 2^32; the slot
//! is `c % W` and the slot copy `(c / W) % 2`, which is `seq % W` and
//! `(seq / W) % 2` until the sequence number first wraps (the switch takes
//! both from the header and never recomputes them). A slot copy accepts only
//! the chunk it holds or the one `2W` after it and drops anything else as
//! stale, so a worker that restarted its numbering at 0 would have its
//! chunks dropped.
//!
//! All ranks of a job must therefore call the same collectives in the same
//! order with the same buffer lengths, as in MPI: then their chunk numbers
//! agree chunk for chunk. A [`Worker`] keeps the count for you; do not create a
//! new `Worker` for an existing job in the middle of a run, and after a failed
//! collective other than an overflow (which every rank sees alike), treat the
//! job as broken and reinstall it.
//!
//! # Example
//!
//! ```no_run
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use xina_host::{Config, JobParams, Mode, Worker};
//! use xina_proto::{DType, Op};
//!
//! let params = JobParams {
//!     job: 7,
//!     rank: 0,
//!     fan_in: 4,
//!     elems_per_packet: 256,
//!     slots: 64,
//!     op: Op::Sum,
//!     dtype: DType::I32,
//!     mode: Mode::Allreduce,
//!     switch: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), xina_proto::XINA_UDP_PORT),
//! };
//! let bind = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), xina_proto::XINA_UDP_PORT);
//! let mut worker = Worker::new(params, bind, Config::default())?;
//! let mut gradients = vec![0.5f32; 1 << 20];
//! let stats = worker.allreduce(&mut gradients)?;
//! println!("{stats}");
//! worker.barrier()?;
//! # Ok::<(), xina_host::Error>(())
//! ```

pub mod anycast;
pub mod call;
pub mod congestion;
pub mod engine;
mod error;
pub mod float;
pub mod group;
pub mod group_sim;
pub mod sim;
mod tokio_driver;
pub mod udp;

pub use call::Scalar;
pub use congestion::Window;
pub use engine::{Collective, Config, Element, Engine, Member, Mode, RttEstimator, Stats};
pub use error::{Error, GroupStall, SeqList};
pub use group::{GroupCollective, GroupEngine, GroupParams};
pub use tokio_driver::{AsyncGroupWorker, AsyncWorker};
pub use udp::{GroupWorker, JobParams, Worker};

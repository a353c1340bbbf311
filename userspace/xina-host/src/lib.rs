//! The xina worker library: collectives over an xina aggregation switch.
//!
//! A worker sends its buffer to the switch in chunks of `E` int32 elements,
//! one chunk per UDP datagram; the switch sums each chunk over the job's
//! `fan_in` ranks in one of the job's `W` aggregator slots and sends the sum
//! back to every rank. This crate is everything on the worker's side of that
//! exchange: chunking, a window of outstanding chunks bounded by the slots,
//! timeouts with backoff, retransmission, duplicate suppression, reassembly in
//! place, and errors that say which sequence numbers are missing.
//!
//! # Engine and driver
//!
//! The protocol lives in a sans-IO state machine, [`engine::Allreduce`]: it
//! takes events (a datagram arrived, a deadline passed, each with the current
//! time) and produces actions (a datagram to send, the next deadline, the
//! outcome). It never touches a socket or a clock, so the same code runs
//!
//! - over UDP sockets in [`Worker`] (module [`udp`]), a blocking driver: one
//!   socket, as many datagrams as the window allows, then a bounded wait for
//!   results or the next deadline;
//! - against [`sim::SwitchModel`] over the deterministic lossy network of
//!   [`sim`], with simulated time, in tests;
//! - and later over batched sockets or `AF_XDP`, by writing another driver.
//!
//! # Sequence continuity
//!
//! Every chunk a worker sends has a chunk number that keeps growing over the
//! worker's life: a collective starts where the previous one ended
//! ([`Allreduce::next_chunk`]), whether that one succeeded or not. The
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
//! use xina_host::{Config, JobParams, Worker};
//!
//! let params = JobParams {
//!     job: 7,
//!     rank: 0,
//!     fan_in: 4,
//!     elems_per_packet: 256,
//!     slots: 64,
//!     switch: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), xina_proto::XINA_UDP_PORT),
//! };
//! let bind = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), xina_proto::XINA_UDP_PORT);
//! let mut worker = Worker::new(params, bind, Config::default())?;
//! let mut gradients = vec![1i32; 1 << 20];
//! let stats = worker.allreduce_i32(&mut gradients)?;
//! println!("{} retransmissions", stats.retransmissions);
//! # Ok::<(), xina_host::Error>(())
//! ```

pub mod engine;
mod error;
pub mod sim;
pub mod udp;

pub use engine::{Allreduce, Config, Member, RttEstimator, Stats};
pub use error::{Error, SeqList};
pub use udp::{JobParams, Worker};

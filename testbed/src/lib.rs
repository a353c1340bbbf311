//! xina-testbed: network-namespace topologies on one machine, and the
//! scenarios and demos that run xina on them.
//!
//! - [`netns`]: RAII network namespaces, commands and threads inside them,
//!   and cleanup on Ctrl-C.
//! - [`topology`]: the star topology (one switch, N workers).
//! - [`scenario`]: the allreduce scenario behind the demo and the tests.
//! - [`ethtool`]: the interface offload toggles the topology needs.
//! - [`bench`]: `bench switch`, the switch's in-kernel cost per packet and
//!   path against an `XDP_DROP` baseline, and end-to-end packet rates.
//! - [`lossy`]: a lossy link (drops, duplicates, reordering) on a veth.
//! - [`ring`]: a host-based ring allreduce over TCP, the baseline of
//!   [`allreduce_bench`] (`bench allreduce`), which compares xina with it.
//! - [`group`]: a multicast group of every worker on a star, for broadcast
//!   and allgather scenarios.
//! - [`bcast`]: host-based broadcasts over TCP (root-to-all unicast, a
//!   binomial tree, one root-to-one transfer), the baselines of
//!   [`bcast_bench`] (`bench bcast`), which compares xina with them.
//! - [`plain`]: the plain star (no XDP) the baselines run on.
//! - [`mpi`]: Open MPI's collectives across a star's namespaces, the
//!   benches' third column when `mpirun` is installed.
//! - [`mpi_bench`]: `bench mpi`, one MPI program with Open MPI's own
//!   collectives and through xina's PMPI library, in one run.
//! - [`pmpi`]: the xina PMPI library and its check program, built with
//!   `mpicc` and run across a star's namespaces.

pub mod allreduce_bench;
pub mod bcast;
pub mod bcast_bench;
pub mod bench;
pub mod ethtool;
pub mod group;
pub mod lossy;
pub mod mpi;
pub mod mpi_bench;
pub mod netns;
pub mod plain;
pub mod plot;
pub mod pmpi;
pub mod ring;
pub mod scenario;
pub mod shape;
pub mod share_bench;
pub mod topology;

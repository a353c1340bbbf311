//! The xina switch control plane: loads the XDP dataplane onto a host's
//! ports, installs jobs from configuration files and reads counters.
//!
//! - [`dataplane::Dataplane`]: the loaded programs and maps, with domain verbs.
//! - [`config`]: the switch/job TOML file, validated whole before anything is
//!   installed.
//! - [`switch::start`]: a whole switch from a [`config::Config`];
//!   [`switch::start_pinned`] the same, pinned so it outlives the process.
//! - [`control`]: the operations of the `xina` command on a pinned switch
//!   (up, down, jobs with slot allocation, status, stats): the programmatic
//!   API of the control plane.
//! - [`pin`]: where a switch lives in bpffs, and removing it.
//! - [`stats`]: counter tables.
//! - [`frame`]: whole frames for test runs.
//! - [`netdev`]: interface lookups in the caller's network namespace.
//! - [`p4`]: the P4 twin's control-plane state, and the shared test vectors.
//! - [`service`]: the job service (`xina serve`): jobs on request, with
//!   tenants' quotas and leases, over an HTTP JSON API.
//! - [`verifier`]: each program's verified instructions against the budget.

pub mod config;
pub mod control;
pub mod dataplane;
pub mod frame;
pub mod metrics;
pub mod netdev;
pub mod p4;
pub mod pin;
pub mod service;
pub mod stats;
pub mod switch;
pub mod verifier;

pub use dataplane::{Counters, Dataplane, JobSpec, LoadOptions, MemberSpec};

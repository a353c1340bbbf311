//! The xina switch control plane: loads the XDP dataplane onto a host's
//! ports, installs jobs from configuration files and reads counters.
//!
//! - [`dataplane::Dataplane`]: the loaded programs and maps, with domain verbs.
//! - [`config`]: the switch/job TOML file, validated whole before anything is
//!   installed.
//! - [`netdev`]: interface lookups in the caller's network namespace.

pub mod config;
pub mod dataplane;
pub mod frame;
pub mod netdev;

pub use dataplane::{Counters, Dataplane, JobSpec, LoadOptions, MemberSpec};

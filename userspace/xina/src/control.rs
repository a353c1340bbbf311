//! The control plane's operations on a pinned switch, as the `xina`
//! command, the testbed and tests use them: bring a switch up and down,
//! add and remove jobs (with slot allocation), read its status and stats.
//!
//! Every operation opens the switch from its pins ([`open`]), so any
//! process can run it at any time, also while another one has exited or
//! crashed: the dataplane keeps forwarding without any process. There is no
//! daemon to talk to and so no socket API; the Rust functions here are the
//! programmatic API. Concurrent commands on one switch are serialised by a
//! `flock` on its pin directory ([`crate::pin::PinDir::lock`]).
//!
//! Network namespaces: [`open`], [`down`], [`status`] and [`stats`] work
//! from any namespace (ports are named by their link pins); [`up`] and
//! [`add_job`] look interfaces up (indexes, MACs, MTUs, neighbours) and must
//! run on a thread inside the switch's namespace (the `xina` command enters
//! it with `--netns`).

use std::{collections::BTreeMap, fs::File, net::Ipv4Addr};

use serde::Serialize;
use xina_proto::frame;

use crate::{
    config::{Config, ConfigError, JobFile, Mac, XdpModeName, overlap},
    dataplane::{self, Dataplane, JobSpec, Mode},
    netdev,
    pin::{self, PinDir},
    switch::{self, StartError},
};

/// A switch opened from its pins, locked against other `xina` commands
/// until dropped.
#[derive(Debug)]
pub struct Switch {
    pub dp: Dataplane,
    _lock: File,
}

/// Opens switch `dir` and locks it.
///
/// # Errors
/// No switch there, or its pins cannot be read.
pub fn open(dir: &PinDir) -> Result<Switch, dataplane::Error> {
    if !dir.exists() {
        return Err(dataplane::Error::NotUp {
            dir: dir.path().to_owned(),
        });
    }
    let lock = dir.lock().map_err(|source| dataplane::Error::Pin {
        what: format!("locking {}", dir.path().display()),
        source,
    })?;
    Ok(Switch {
        dp: Dataplane::open(dir)?,
        _lock: lock,
    })
}

/// Brings switch `dir` up as `config` says (its jobs included), pinned, so
/// it runs on after this process exits; `mode` overrides the file's
/// `xdp_mode`. Mounts bpffs when needed. Must run in the switch's network
/// namespace.
///
/// # Errors
/// Already up, bad config, attach or install failures: then nothing of it
/// stays attached or pinned.
pub fn up(
    config: &Config,
    dir: &PinDir,
    mode: Option<XdpModeName>,
) -> Result<Dataplane, StartError> {
    let root = dir.path().parent().unwrap_or(dir.path());
    pin::ensure_bpffs(root).map_err(|source| {
        StartError::Dataplane(Box::new(dataplane::Error::Pin {
            what: "preparing bpffs".to_owned(),
            source,
        }))
    })?;
    let mut config = config.clone();
    if let Some(mode) = mode {
        config.switch.xdp_mode = mode;
    }
    switch::start_pinned(&config, dir)
}

/// Takes switch `dir` down: detaches every port and removes every pin.
///
/// # Errors
/// No switch there; a pin that cannot be removed.
pub fn down(dir: &PinDir) -> Result<pin::Removed, dataplane::Error> {
    if !dir.exists() {
        return Err(dataplane::Error::NotUp {
            dir: dir.path().to_owned(),
        });
    }
    let _lock = dir.lock();
    pin::remove(dir).map_err(|source| dataplane::Error::Pin {
        what: format!("removing {}", dir.path().display()),
        source,
    })
}

/// Why a job could not be added.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The job is valid, but no free range of the slot pool is large
    /// enough now (the error names the file's slots field).
    #[error(transparent)]
    PoolExhausted(ConfigError),
    #[error(transparent)]
    Dataplane(#[from] dataplane::Error),
}

/// First-fit slot allocation: the lowest base at which `count` slots fit
/// in a pool of `pool` slots, between the `used` ranges (`(base, count)`,
/// in any order, not overlapping).
pub fn allocate_slots(used: &[(u32, u32)], pool: u32, count: u32) -> Option<u32> {
    if count == 0 {
        return None;
    }
    let mut ranges: Vec<(u64, u64)> = used
        .iter()
        .map(|&(b, c)| (u64::from(b), u64::from(b) + u64::from(c)))
        .collect();
    ranges.sort_unstable();
    let mut base = 0u64;
    for (b, e) in ranges {
        if b >= base + u64::from(count) {
            break;
        }
        base = base.max(e);
    }
    (base + u64::from(count) <= u64::from(pool)).then(|| u32::try_from(base).expect("below pool"))
}

/// The largest free range of the pool, in slots.
pub fn largest_free(used: &[(u32, u32)], pool: u32) -> u32 {
    let mut ranges: Vec<(u32, u32)> = used.iter().map(|&(b, c)| (b, b + c)).collect();
    ranges.sort_unstable();
    let mut best = 0;
    let mut at = 0;
    for (b, e) in ranges {
        best = best.max(b.saturating_sub(at));
        at = at.max(e);
    }
    best.max(pool.saturating_sub(at))
}

/// Installs the job of `file` on `dp`: checks it against the switch (its
/// ports, pool, MTUs and installed jobs), allocates its slots (first fit,
/// unless the file gives `slot_base`), resolves omitted MACs from the
/// neighbour table, and installs it all or nothing. Runs in the switch's
/// network namespace.
///
/// # Errors
/// The first problem, naming the file's field.
pub fn add_job(dp: &mut Dataplane, file: &JobFile) -> Result<JobSpec, JobError> {
    let bad = |field: &str, message: String| {
        JobError::Invalid(ConfigError {
            field: field.to_owned(),
            message,
        })
    };
    if dp.job(file.id).is_some() {
        return Err(bad("id", format!("job {} is already installed", file.id)));
    }
    if file.id == 0 {
        return Err(bad("id", "0 (job ids start at 1)".to_owned()));
    }
    file.check_keys("")?;
    let used: Vec<(u32, u32)> = dp.jobs().map(|j| (j.slot_base, j.slot_count)).collect();
    let pool = dp.slot_pool();
    let count = file.slots();
    let slot_base = match file.slot_base {
        Some(base) => {
            if let Some(other) = dp
                .jobs()
                .find(|o| overlap((base, count), (o.slot_base, o.slot_count)))
            {
                return Err(bad(
                    "slot_base",
                    format!(
                        "slots {base}..{} overlap job {}'s slots {}..{}",
                        u64::from(base) + u64::from(count),
                        other.id,
                        other.slot_base,
                        other.slot_base + other.slot_count
                    ),
                ));
            }
            base
        }
        // Nothing to allocate, or more than the pool: `check` says which.
        None if count == 0 || count > pool => 0,
        None => allocate_slots(&used, pool, count).ok_or_else(|| {
            JobError::PoolExhausted(ConfigError {
                field: file.slots_field().to_owned(),
                message: format!(
                    "{count} slots wanted, but the pool is exhausted: its largest free range is {} of {pool} slots (`xina job rm` frees some)",
                    largest_free(&used, pool)
                ),
            })
        })?,
    };
    let ports: Vec<String> = dp.ports().iter().map(|p| p.name.clone()).collect();
    let job = file.check(slot_base, &ports, pool, netdev::neighbour)?;
    check_mtu("", &job)?;
    let spec = job.resolve("", |name| {
        let ifindex = dp.ports().iter().find(|p| p.name == name)?.ifindex;
        Some((ifindex, netdev::mac(name).ok()?))
    })?;
    dp.install_job(&spec)?;
    Ok(spec)
}

/// Checks that the job's packets fit the MTU of every member's switch port
/// (read from the interface, in this thread's network namespace): a frame
/// of `elems_per_packet` elements (a group's `bytes_per_packet`) is an IP
/// packet of [`frame::ip_len`] bytes. Field names in errors start with
/// `prefix` (`jobs[2].` in a switch file).
///
/// # Errors
/// The first port whose MTU is too small, naming it, its MTU and the
/// packet size; an interface whose MTU cannot be read.
pub fn check_mtu(prefix: &str, job: &crate::config::Job) -> Result<(), ConfigError> {
    let bytes = frame::ip_len(job.dtype, usize::from(job.elems_per_packet));
    let (field, unit) = if job.mode.is_group() {
        ("bytes_per_packet", "bytes")
    } else {
        ("elems_per_packet", "elements")
    };
    for (m, member) in job.members.iter().enumerate() {
        let mtu = netdev::mtu(&member.interface).map_err(|e| ConfigError {
            field: format!("{prefix}members[{m}].interface"),
            message: format!("{e}"),
        })?;
        if bytes > usize::try_from(mtu).unwrap_or(usize::MAX) {
            return Err(ConfigError {
                field: format!("{prefix}{field}"),
                message: format!(
                    "{} {unit} make {bytes}-byte IP packets, more than the {mtu}-byte MTU of {} (members[{m}]); \
                     at this MTU a packet takes at most {} {unit}",
                    job.elems_per_packet,
                    member.interface,
                    frame::elems_for_mtu(job.dtype, usize::try_from(mtu).unwrap_or(0))
                ),
            });
        }
    }
    Ok(())
}

/// Marks member `rank` of anycast group `job` down (it receives nothing new)
/// or up again; see [`Dataplane::set_member_down`]. Whether that changed
/// anything (`false`: the member already was so).
///
/// # Errors
/// No such job, not an anycast group, not a member (each naming the job
/// and the rank), or a map failure.
pub fn set_member_down(
    dp: &mut Dataplane,
    job: u32,
    rank: u8,
    down: bool,
) -> Result<bool, dataplane::Error> {
    let was = dp
        .job(job)
        .and_then(|j| j.members.get(usize::from(rank)))
        .map(|m| m.down);
    dp.set_member_down(job, rank, down)?;
    Ok(was != Some(down))
}

/// A member as `xina job show --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct MemberView {
    pub rank: u8,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub mac: String,
    pub interface: String,
    pub ifindex: u32,
    /// Groups: the member may send to the group.
    pub sender: bool,
    /// Anycast groups: the member is down (receives nothing new).
    pub down: bool,
    /// Groups: data copies the switch delivered to the member since the
    /// group was installed (`null` for a job).
    pub copies: Option<u64>,
}

/// A job as `xina job ls/show --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub id: u32,
    pub op: &'static str,
    pub dtype: &'static str,
    pub mode: &'static str,
    pub fan_in: usize,
    pub elems_per_packet: u16,
    pub slot_base: u32,
    pub slot_count: u32,
    pub members: Vec<MemberView>,
    /// Groups: the most payload bytes per packet (`null` for a job).
    pub bytes_per_packet: Option<u16>,
    /// Multicast groups: chunks in flight per sender, each sender's share
    /// of the slots (`null` otherwise).
    pub window: Option<u32>,
}

impl JobView {
    /// The view of `job` on `dp` (interface names from its ports).
    pub fn new(dp: &Dataplane, job: &JobSpec) -> Self {
        let copies = if job.mode.is_group() {
            // A switch whose counters cannot be read shows none.
            dp.member_packets(job.id).ok()
        } else {
            None
        };
        Self {
            id: job.id,
            op: match job.op {
                xina_proto::Op::Sum => "sum",
                xina_proto::Op::Max => "max",
                xina_proto::Op::Min => "min",
            },
            dtype: match job.dtype {
                xina_proto::DType::I32 => "i32",
                xina_proto::DType::I64 => "i64",
                xina_proto::DType::Bytes => "bytes",
            },
            mode: job.mode.name(),
            fan_in: job.members.len(),
            elems_per_packet: job.elems_per_packet,
            slot_base: job.slot_base,
            slot_count: job.slot_count,
            members: job
                .members
                .iter()
                .map(|m| MemberView {
                    copies: copies
                        .as_ref()
                        .and_then(|c| c.get(usize::from(m.rank)).copied()),
                    rank: m.rank,
                    ip: m.ip,
                    port: m.udp_port,
                    mac: Mac(m.mac).to_string(),
                    interface: port_name(dp, m.ifindex),
                    ifindex: m.ifindex,
                    sender: m.sender,
                    down: m.down,
                })
                .collect(),
            bytes_per_packet: job.mode.is_group().then_some(job.elems_per_packet),
            window: match (job.mode, u32::try_from(job.members.len())) {
                (Mode::Multicast, Ok(n)) if n > 0 => Some(job.slot_count / n),
                _ => None,
            },
        }
    }
}

fn port_name(dp: &Dataplane, ifindex: u32) -> String {
    dp.ports()
        .iter()
        .find(|p| p.ifindex == ifindex)
        .map_or_else(|| format!("ifindex {ifindex}"), |p| p.name.clone())
}

/// A port as `xina switch status --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct PortView {
    pub name: String,
    pub ifindex: u32,
    pub index: u32,
    pub mode: &'static str,
    /// The XDP `bpf_link`'s id and the id of the program it runs.
    pub link_id: Option<u32>,
    pub prog_id: Option<u32>,
}

/// `xina switch status --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub name: String,
    pub pin_dir: String,
    pub slot_pool: u32,
    pub slots_used: u32,
    pub ports: Vec<PortView>,
    /// Pinned programs by name: their kernel ids.
    pub programs: BTreeMap<&'static str, u32>,
    pub jobs: Vec<u32>,
}

/// The status of switch `dp` (opened from `dir`).
pub fn status(dp: &Dataplane, dir: &PinDir) -> Status {
    let ports = dp
        .ports()
        .iter()
        .map(|p| {
            let info = p
                .link_pin()
                .and_then(|path| aya::programs::links::PinnedLink::from_pin(path).ok())
                .and_then(|l| aya::programs::links::FdLink::from(l).info().ok());
            PortView {
                name: p.name.clone(),
                ifindex: p.ifindex,
                index: p.index,
                mode: pin::mode_name(p.mode),
                link_id: info.as_ref().map(aya::programs::links::LinkInfo::id),
                prog_id: info
                    .as_ref()
                    .map(aya::programs::links::LinkInfo::program_id),
            }
        })
        .collect();
    let programs = dataplane::pinned_program_ids(dir);
    Status {
        name: dir.name().to_owned(),
        pin_dir: dir.path().display().to_string(),
        slot_pool: dp.slot_pool(),
        slots_used: dp.jobs().map(|j| j.slot_count).sum(),
        ports,
        programs,
        jobs: dp.jobs().map(|j| j.id).collect(),
    }
}

/// Counters of one job or port.
#[derive(Clone, Debug, Serialize)]
pub struct Block {
    /// Job id or interface name.
    pub name: String,
    pub counters: BTreeMap<&'static str, u64>,
}

/// `xina stats --json`: every counter, summed over CPUs.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub switch: BTreeMap<&'static str, u64>,
    pub jobs: Vec<Block>,
    pub ports: Vec<Block>,
}

/// Reads every counter of `dp`.
///
/// # Errors
/// When a counter map cannot be read.
pub fn stats(dp: &Dataplane) -> Result<Stats, dataplane::Error> {
    let jobs = dp
        .jobs()
        .map(|j| {
            Ok(Block {
                name: j.id.to_string(),
                counters: dp.job_counters(j.id)?.to_map(),
            })
        })
        .collect::<Result<_, dataplane::Error>>()?;
    let ports = dp
        .ports()
        .iter()
        .map(|p| {
            Ok(Block {
                name: p.name.clone(),
                counters: dp.port_counters(p.ifindex)?.to_map(),
            })
        })
        .collect::<Result<_, dataplane::Error>>()?;
    Ok(Stats {
        switch: dp.counters()?.to_map(),
        jobs,
        ports,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{allocate_slots, largest_free};

    #[derive(Clone, Debug)]
    enum Step {
        Add(u32),
        /// Removes the installed job at this index (modulo their number).
        Remove(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u32..40).prop_map(Step::Add),
            any::<usize>().prop_map(Step::Remove),
        ]
    }

    proptest! {
        /// Random add/remove sequences never give two jobs overlapping
        /// slots, never place one outside the pool, refuse only when no
        /// free range is large enough, and leak nothing: once every job is
        /// removed the whole pool can be allocated again.
        #[test]
        fn allocation_never_overlaps_or_leaks(
            pool in 1u32..200,
            steps in proptest::collection::vec(step(), 1..80),
        ) {
            let mut jobs: Vec<(u32, u32)> = Vec::new();
            for s in steps {
                match s {
                    Step::Add(count) => match allocate_slots(&jobs, pool, count) {
                        Some(base) => {
                            prop_assert!(base + count <= pool);
                            for &(b, c) in &jobs {
                                prop_assert!(base + count <= b || b + c <= base,
                                    "{base}+{count} overlaps {b}+{c}");
                            }
                            jobs.push((base, count));
                        }
                        None => prop_assert!(largest_free(&jobs, pool) < count),
                    },
                    Step::Remove(i) if !jobs.is_empty() => {
                        let i = i % jobs.len();
                        jobs.swap_remove(i);
                    }
                    Step::Remove(_) => {}
                }
                let used: u32 = jobs.iter().map(|j| j.1).sum();
                prop_assert!(largest_free(&jobs, pool) <= pool - used);
            }
            jobs.clear();
            prop_assert_eq!(allocate_slots(&jobs, pool, pool), Some(0));
        }
    }

    #[test]
    fn first_fit_examples() {
        assert_eq!(allocate_slots(&[], 10, 10), Some(0));
        assert_eq!(allocate_slots(&[], 10, 11), None);
        assert_eq!(allocate_slots(&[], 10, 0), None);
        assert_eq!(allocate_slots(&[(0, 4), (6, 4)], 10, 2), Some(4));
        assert_eq!(allocate_slots(&[(6, 4), (0, 4)], 10, 3), None);
        assert_eq!(allocate_slots(&[(2, 2)], 10, 2), Some(0));
        assert_eq!(largest_free(&[(2, 2), (6, 1)], 10), 3);
        assert_eq!(largest_free(&[], 7), 7);
    }
}

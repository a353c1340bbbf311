//! [`Dataplane`]: the loaded XDP programs and their maps, behind domain verbs.
//!
//! Nothing outside this module names a map or a program; everything goes
//! through `Dataplane::attach`, `install_job` (aggregation jobs, and
//! multicast and anycast groups), `remove_job`, `counters`,
//! `member_packets`, `slot`, and the `test_run_*` methods that push one frame through a
//! program with `BPF_PROG_TEST_RUN` (no interface needed).
//!
//! A dataplane is either private to its process ([`Dataplane::load`]: ports
//! detach when it is dropped) or pinned under a [`PinDir`]
//! ([`Dataplane::load_pinned`], reopened by any process with
//! [`Dataplane::open`], programs replaced by [`Dataplane::upgrade`]); see
//! [`crate::pin`] for what is pinned.
//!
//! Network-namespace note: attaching and filling the `PORTS` devmap resolve
//! interface indexes in the network namespace of the calling thread. Call
//! [`Dataplane::attach`] from a thread inside the switch's namespace.

use std::{collections::BTreeMap, net::Ipv4Addr, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, DevMap, HashMap, MapData, PerCpuArray, PerCpuValues, ProgramArray},
    programs::{
        LinkOrder, ProgramError, ProgramFd, SchedClassifier, TcAttachType, TestRun, TestRunOptions,
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions},
        xdp::{XdpLink, XdpLinkId},
    },
};
use xina_proto::{
    DType, MAX_RANKS, Op,
    counters::Counter,
    frame,
    maps::{
        CounterBlock, DEFAULT_SLOT_POOL, DEFAULT_UNITS, Job, MAX_JOBS, MAX_PORTS,
        MEMBER_PACKETS_PER_JOB, Member, MemberKey, NO_PORT_INDEX, PortKey, Slot, member_flags,
        mode, names, programs,
    },
};

use crate::{
    pin::{self, PinDir},
    verifier::{self, ProgramLoad},
};

/// The eBPF object built by `build.rs`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xina"));

/// The eBPF object holding every xina program (the switch's and the
/// testbed's lossy link), for loaders other than [`Dataplane`].
pub fn ebpf_object() -> &'static [u8] {
    EBPF_OBJECT
}

/// Why a dataplane operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the eBPF object")]
    Load(#[source] aya::EbpfError),
    #[error(
        "the kernel ({kernel}) refused program {name}: {verdict} [{errno}]. {} Nothing was \
         attached. xina is tested on Linux 6.1, 6.12 and 6.18 (README, \"Requirements\"); \
         `xina switch check` shows what the verifier makes of every program.",
        match log {
            Some(p) => format!("The verifier's log is in {}.", p.display()),
            None => "The verifier's log could not be saved.".to_owned(),
        }
    )]
    Refused {
        name: &'static str,
        kernel: String,
        errno: String,
        /// The verifier's reason, from the end of its log.
        verdict: String,
        log: Option<PathBuf>,
    },
    #[error("program {name}: {what}")]
    Program {
        name: &'static str,
        what: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {name}: {what}")]
    Map {
        name: &'static str,
        what: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("adding port {ifname} to the broadcast map")]
    Port {
        ifname: String,
        #[source]
        source: aya::maps::xdp::XdpMapError,
    },
    #[error("map {0} is missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("program {0} is missing from the eBPF object")]
    MissingProgram(&'static str),
    #[error("interface {0} does not exist in this network namespace")]
    UnknownInterface(String),
    #[error("interface {0} is already a port of this switch")]
    AlreadyAttached(String),
    #[error("this switch already has {MAX_PORTS} ports")]
    TooManyPorts,
    #[error("attaching to {ifname} ({mode:?} mode)")]
    Attach {
        ifname: String,
        mode: XdpMode,
        #[source]
        source: ProgramError,
    },
    #[error(
        "interface {0} already has an XDP program (another xina switch, or another tool: \
         `ip link show {0}`, `xina switch status`); xina does not replace it"
    )]
    Busy(String),
    #[error("job {job}: {what}")]
    Job { job: u32, what: String },
    #[error("job {0} is already installed")]
    JobExists(u32),
    #[error("job {0} is not installed")]
    NoSuchJob(u32),
    #[error("program {0} is not loaded by this process (the switch was opened from its pins)")]
    NotLoadedHere(&'static str),
    #[error("a switch is already up at {} (`xina switch down` removes it)", dir.display())]
    AlreadyUp { dir: PathBuf },
    #[error("no switch is up at {} (`xina switch up` starts one)", dir.display())]
    NotUp { dir: PathBuf },
    #[error("{what}")]
    Pin {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("test run of {name}")]
    TestRun {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
}

/// Options fixed when the dataplane is loaded.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Number of aggregator slots in the pool (each has two copies).
    pub slot_pool: u32,
    /// Units of the wide path's memory ([`xina_proto::frame::UNIT_BYTES`]
    /// each): what wide jobs' partials and results are allocated from.
    pub units: u32,
    /// Log chunk completions and cache replies from the dataplane (costly).
    pub debug: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            slot_pool: DEFAULT_SLOT_POOL,
            units: DEFAULT_UNITS,
            debug: false,
        }
    }
}

/// The kernel's possible CPUs: how many partials a wide slot copy has.
fn possible_cpus() -> Result<u32, Error> {
    let n = aya::util::nr_cpus().map_err(|(what, source)| Error::Pin {
        what: format!("reading the possible CPUs ({what})"),
        source,
    })?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Units of `UNITS` a wide job of `elems` elements per packet and `slots`
/// slots needs on this machine ([`frame::wide_units`] with the possible
/// CPUs): what a switch's `units` must at least be for it.
///
/// # Errors
/// When the possible CPUs cannot be read.
pub fn wide_units_here(elems: u16, slots: u32) -> Result<u64, Error> {
    Ok(frame::wide_units(
        usize::from(elems),
        slots,
        possible_cpus()?,
    ))
}

/// A random non-zero fan-out key (see `xina_proto::maps::FanoutMeta`).
fn fanout_key() -> u32 {
    let mut key = [0u8; 4];
    loop {
        // SAFETY: `key` is a writable buffer of 4 bytes.
        let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
        let k = u32::from_ne_bytes(key);
        if n == 4 && k != 0 {
            return k;
        }
    }
}

/// A member of a job, resolved to what the dataplane stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    pub rank: u8,
    pub ip: Ipv4Addr,
    pub udp_port: u16,
    pub mac: [u8; 6],
    /// Interface index of the switch port the member sits behind.
    pub ifindex: u32,
    /// MAC address of that switch port.
    pub port_mac: [u8; 6],
    /// Groups: the member may send data to the group.
    pub sender: bool,
    /// Anycast groups: the member is marked down and receives nothing new.
    pub down: bool,
}

/// Where a job's results go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every member gets every chunk's result.
    #[default]
    Allreduce,
    /// The chunk's root (named in the header) gets the result; the others a
    /// completion notice.
    Reduce,
    /// Like `Reduce`, with each chunk naming its own root (its owner).
    ReduceScatter,
    /// A multicast group: a sender's chunks go to every other member, which
    /// acknowledge them through the switch.
    Multicast,
    /// An anycast group: each packet goes to one member that is up.
    Anycast,
}

impl Mode {
    /// The value stored in the dataplane's job entry.
    pub const fn wire(self) -> u8 {
        match self {
            Self::Allreduce => mode::ALLREDUCE,
            Self::Reduce => mode::REDUCE,
            Self::ReduceScatter => mode::REDUCE_SCATTER,
            Self::Multicast => mode::MULTICAST,
            Self::Anycast => mode::ANYCAST,
        }
    }

    /// The mode with this stored value.
    pub const fn from_wire(v: u8) -> Option<Self> {
        Some(match v {
            mode::ALLREDUCE => Self::Allreduce,
            mode::REDUCE => Self::Reduce,
            mode::REDUCE_SCATTER => Self::ReduceScatter,
            mode::MULTICAST => Self::Multicast,
            mode::ANYCAST => Self::Anycast,
            _ => return None,
        })
    }

    /// The name used in job files and by `xina job`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Reduce => "reduce",
            Self::ReduceScatter => "reduce-scatter",
            Self::Multicast => "multicast",
            Self::Anycast => "anycast",
        }
    }

    /// Whether this is a group (multicast or anycast), not an aggregation job.
    pub const fn is_group(self) -> bool {
        matches!(self, Self::Multicast | Self::Anycast)
    }
}

/// A job, resolved to what the dataplane stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub id: u32,
    pub op: Op,
    pub dtype: DType,
    pub mode: Mode,
    pub elems_per_packet: u16,
    pub slot_base: u32,
    pub slot_count: u32,
    /// Members, one per rank `0..members.len()`.
    pub members: Vec<MemberSpec>,
}

impl JobSpec {
    /// Whether the job runs on the wide path: more elements per packet than
    /// one 1,500-byte frame holds (see [`xina_proto::frame`]).
    pub fn is_wide(&self) -> bool {
        !self.mode.is_group() && frame::is_wide(self.dtype, usize::from(self.elems_per_packet))
    }

    /// The job entry's `all_ranks`: the ranks whose bits complete a chunk
    /// (every member) for an aggregation job and a multicast group, where a
    /// chunk from rank `r` goes to every member but `r`; for an anycast
    /// group, the members packets may go to: those that are neither senders
    /// nor marked down.
    pub fn all_ranks(&self) -> u64 {
        let bits = |keep: &dyn Fn(&MemberSpec) -> bool| {
            self.members
                .iter()
                .filter(|m| keep(m))
                .fold(0u64, |acc, m| acc | 1u64 << (m.rank & 63))
        };
        match self.mode {
            Mode::Anycast => bits(&|m| !m.sender && !m.down),
            _ => bits(&|_| true),
        }
    }
}

/// The rules a group (or an aggregation job) obeys beyond the common ones:
/// groups carry bytes, summed never, and name their senders; aggregation
/// jobs carry numbers and have no senders or members marked down.
fn check_group(job: &JobSpec) -> Result<(), String> {
    let senders = job.members.iter().filter(|m| m.sender).count();
    if !job.mode.is_group() {
        if job.dtype == DType::Bytes {
            return Err(format!(
                "{} jobs combine numbers: dtype Bytes is for multicast and anycast groups",
                job.mode.name()
            ));
        }
        if let Some(m) = job.members.iter().find(|m| m.sender || m.down) {
            return Err(format!(
                "rank {}: sender and down apply to multicast and anycast groups only",
                m.rank
            ));
        }
        return Ok(());
    }
    let mode = job.mode.name();
    if job.dtype != DType::Bytes || job.op != Op::Sum {
        return Err(format!(
            "a {mode} group carries bytes: dtype must be Bytes and op Sum (got {:?}, {:?})",
            job.dtype, job.op
        ));
    }
    if senders == 0 {
        return Err(format!("a {mode} group needs at least one sender"));
    }
    if job.mode == Mode::Multicast {
        let fan_in = job.members.len();
        if fan_in < 2 {
            return Err(format!(
                "a multicast group needs at least 2 members (got {fan_in})"
            ));
        }
        let fan_in = u32::try_from(fan_in).expect("checked: at most 64 members");
        if job.slot_count == 0 || !job.slot_count.is_multiple_of(fan_in) {
            return Err(format!(
                "{} slots: a multicast group needs a non-zero multiple of its {fan_in} \
                 members (one window per member)",
                job.slot_count
            ));
        }
        if let Some(m) = job.members.iter().find(|m| m.down) {
            return Err(format!(
                "rank {}: only anycast members can be marked down",
                m.rank
            ));
        }
    }
    Ok(())
}

/// One port the switch is attached to.
#[derive(Debug)]
pub struct Port {
    pub name: String,
    pub ifindex: u32,
    pub mode: XdpMode,
    /// Its index in the `PORTS` devmap and the `PORT_COUNTERS` array.
    pub index: u32,
    link: PortLink,
    /// What keeps the fan-out program on the port's TCX ingress.
    fanout: FanoutLink,
}

impl Port {
    /// Where the port's link is pinned, on a pinned switch.
    pub fn link_pin(&self) -> Option<&std::path::Path> {
        match &self.link {
            PortLink::Pinned(p) if !p.as_os_str().is_empty() => Some(p),
            _ => None,
        }
    }
}

/// What keeps a port's XDP program attached.
#[derive(Debug)]
enum PortLink {
    /// A link owned by this process's program: dropping the dataplane
    /// detaches it.
    Owned(XdpLinkId),
    /// A link pinned at this path: it stays attached without any process.
    Pinned(PathBuf),
}

/// What keeps a port's fan-out program attached: a TCX link (Linux 6.6 and
/// later), or a filter of the port's clsact qdisc, which needs no link to
/// stay (older kernels; chosen by trying TCX first).
#[derive(Debug)]
enum FanoutLink {
    Owned(SchedClassifierLinkId),
    /// Pinned at this path (empty: not found when the switch was opened).
    Pinned(PathBuf),
    /// A clsact filter of a pinned switch, on the named port: it stays
    /// without any process, and is removed by the program's name.
    Clsact(String),
}

/// The priority of the fan-out program's filter on a clsact qdisc (older
/// kernels): fixed, so that it is found and replaced as one.
const FANOUT_TC_PRIORITY: u16 = 1;

/// Counters summed over CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters(pub [u64; Counter::COUNT]);

impl Default for Counters {
    fn default() -> Self {
        Self([0; Counter::COUNT])
    }
}

impl Counters {
    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }

    /// Sums per-CPU counter blocks.
    fn from_per_cpu(values: &PerCpuValues<CounterBlock>) -> Self {
        let mut out = Self::default();
        for block in values.iter() {
            for (o, v) in out.0.iter_mut().zip(block) {
                *o += v;
            }
        }
        out
    }

    /// Counters that changed since `before`.
    pub fn delta(&self, before: &Self) -> Self {
        let mut d = Self::default();
        for c in Counter::ALL {
            d.0[c as usize] = self.get(c).wrapping_sub(before.get(c));
        }
        d
    }

    /// Name → value, for printing and JSON.
    pub fn to_map(&self) -> BTreeMap<&'static str, u64> {
        Counter::ALL
            .iter()
            .map(|c| (c.name(), self.get(*c)))
            .collect()
    }
}

/// The contents of the dataplane's tables ([`Dataplane::dump`]), sorted by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    pub jobs: Vec<(u32, Job)>,
    /// By (job, rank).
    pub members: Vec<((u32, u32), Member)>,
    /// By (job, ifindex).
    pub port_members: Vec<((u32, u32), Member)>,
    /// ifindex → `PORTS` index.
    pub port_index: Vec<(u32, u32)>,
    /// Every slot copy.
    pub slots: Vec<Slot>,
}

/// The kernel's `enum xdp_action` values, as [`TestOutput::action`] holds them.
pub mod xdp_action {
    pub const ABORTED: u32 = 0;
    pub const DROP: u32 = 1;
    pub const PASS: u32 = 2;
    pub const TX: u32 = 3;
    pub const REDIRECT: u32 = 4;
}

/// The outcome of one `BPF_PROG_TEST_RUN`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestOutput {
    /// The XDP action the program returned.
    pub action: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
    /// The XDP metadata it left in front of the frame (the wide path's
    /// fan-out mark on a completed result; empty otherwise).
    pub meta: Vec<u8>,
}

/// Reader of the dataplane's aya-log records (see [`Dataplane::take_logger`]).
pub type Logger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The loaded xina dataplane.
///
/// Either loaded by this process ([`Dataplane::load`]: the programs detach
/// when it is dropped; or [`Dataplane::load_pinned`]: maps, programs and
/// links are pinned and outlive the process), or opened from the pins a
/// switch left ([`Dataplane::open`]): the same maps, so the same jobs,
/// slots and counters, without loading anything.
pub struct Dataplane {
    /// The loaded programs; `None` when opened from pins.
    programs: Option<Ebpf>,
    maps: Maps,
    ports: Vec<Port>,
    jobs: BTreeMap<u32, JobSpec>,
    /// Each installed job's block in `JOB_COUNTERS`.
    job_counters: BTreeMap<u32, u16>,
    /// Each installed wide job's first unit in `UNITS`.
    job_units: BTreeMap<u32, u32>,
    slot_pool: u32,
    /// Units in `UNITS`.
    units: u32,
    /// Possible CPUs: partials per wide slot copy.
    cpus: u32,
    logger: Option<Logger>,
    /// Where the switch is pinned, if it is.
    pins: Option<PinDir>,
    /// What the verifier made of each program, when this process loaded
    /// them (empty when opened from pins).
    verification: Vec<ProgramLoad>,
}

/// The dataplane's maps by name.
type Maps = BTreeMap<String, aya::maps::Map>;

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("ports", &self.ports)
            .field("jobs", &self.jobs.keys())
            .field("slot_pool", &self.slot_pool)
            .field("pins", &self.pins)
            .finish_non_exhaustive()
    }
}

impl Dataplane {
    /// Loads the programs and creates the maps; attaches nothing. Ports
    /// attached later are detached when the dataplane is dropped.
    ///
    /// # Errors
    /// When the kernel refuses the object (no BPF rights, verifier).
    pub fn load(opts: LoadOptions) -> Result<Self, Error> {
        let cpus = possible_cpus()?;
        let ebpf = EbpfLoader::new()
            .map_max_entries(names::SLOTS, 2 * opts.slot_pool)
            .map_max_entries(names::UNITS, opts.units.max(1))
            .map_max_entries(names::WIDE_SCRATCH, cpus)
            .override_global("XINA_DEBUG", &u8::from(opts.debug), true)
            .override_global("XINA_CPUS", &cpus, true)
            .override_global("XINA_FANOUT_KEY", &fanout_key(), true)
            .load(EBPF_OBJECT)
            .map_err(Error::Load)?;
        let (programs, mut maps, verification) = load_programs(ebpf)?;
        // Without the logger the dataplane's log records are simply not read.
        let logger = if opts.debug {
            let id = match maps.get(pin::LOGS) {
                Some(aya::maps::Map::RingBuf(m)) => m.info().ok().map(|i| i.id()),
                _ => None,
            };
            id.and_then(logger_for_map)
        } else {
            None
        };
        let mut programs = Some(programs);
        set_aggregate(&mut programs, &mut maps)?;
        Ok(Self {
            programs,
            maps,
            ports: Vec::new(),
            jobs: BTreeMap::new(),
            job_counters: BTreeMap::new(),
            job_units: BTreeMap::new(),
            slot_pool: opts.slot_pool,
            units: opts.units.max(1),
            cpus,
            logger,
            pins: None,
            verification,
        })
    }

    /// What the verifier made of each program this process loaded: the
    /// processed instructions and load time of every program, in load
    /// order (empty for a dataplane opened from its pins).
    pub fn verification(&self) -> verifier::Report {
        verifier::Report::new(self.verification.clone())
    }

    /// Replaces the programs of the switch pinned under `dir` with this
    /// build's, keeping every map: jobs, members, slots (with chunks in
    /// flight) and counters stay as they are. The new programs are loaded
    /// against the pinned maps; then, each step atomic, the `AGGREGATE`
    /// entries, each port's `PORTS` entry (egress program) and each port's
    /// link (`BPF_LINK_UPDATE`) are switched over, and the program pins
    /// replaced. A packet runs to completion on whichever programs it met,
    /// possibly a mix of old and new, so the two builds must agree on every
    /// map's layout and on the per-CPU scratch hand-off (the same
    /// `xina-proto`): nothing checks that beyond the kernel's verifier.
    ///
    /// # Errors
    /// No switch at `dir`; load failures (then nothing changed); a failure
    /// midway (then some ports run the new programs: run it again).
    pub fn upgrade(dir: &PinDir, debug: bool) -> Result<Upgrade, Error> {
        let old = Self::open(dir)?;
        let before = pinned_program_ids(dir);
        let map_paths: Vec<(&'static str, PathBuf)> = pin::MAPS
            .into_iter()
            .chain([pin::LOGS])
            .map(|n| (n, dir.map(n)))
            .collect();
        let debug = u8::from(debug);
        let key = fanout_key();
        let mut loader = EbpfLoader::new();
        // A new fan-out key: results the old programs marked with the old
        // one while the programs are switched over are dropped by the new
        // fan-out program, and recovered by the workers' retransmissions
        // (answered from the slots).
        loader
            .map_max_entries(names::SLOTS, 2 * old.slot_pool)
            .map_max_entries(names::UNITS, old.units)
            .map_max_entries(names::WIDE_SCRATCH, old.cpus)
            .override_global("XINA_DEBUG", &debug, true)
            .override_global("XINA_CPUS", &old.cpus, true)
            .override_global("XINA_FANOUT_KEY", &key, true);
        for (name, path) in &map_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let ebpf = loader.load(EBPF_OBJECT).map_err(Error::Load)?;
        let (programs, mut maps, _) = load_programs(ebpf)?;
        let mut programs = Some(programs);
        set_aggregate(&mut programs, &mut maps)?;
        let egress_fd = program_fd(&mut programs, programs::EGRESS)?;
        for port in &old.ports {
            let mut devmap: DevMap<&mut MapData> = map_mut(&mut maps, names::PORTS)?;
            devmap
                .set(port.index, port.ifindex, Some(&egress_fd), 0)
                .map_err(|source| Error::Port {
                    ifname: port.name.clone(),
                    source,
                })?;
            let Some(path) = port.link_pin() else {
                continue;
            };
            let relink = |e: String| Error::Pin {
                what: format!("{}: replacing the program of {}", port.name, path.display()),
                source: std::io::Error::other(e),
            };
            let link = PinnedLink::from_pin(path).map_err(|e| relink(e.to_string()))?;
            let link = XdpLink::try_from(FdLink::from(link)).map_err(|e| relink(e.to_string()))?;
            let prog = xdp_mut(&mut programs, programs::SWITCH)?;
            let id = prog
                .attach_to_link(link)
                .map_err(|e| relink(e.to_string()))?;
            // Closing our descriptor leaves the link to its pin.
            drop(prog.take_link(id).map_err(|e| relink(e.to_string()))?);
            let tc_path = dir.tc_link(&port.name, port.ifindex);
            if !tc_path.exists() {
                // A kernel without TCX: the fan-out program is a clsact
                // filter, replaced by a new one (results the old one would
                // have fanned out meanwhile are recovered by retransmission,
                // as with the new fan-out key).
                attach_fanout_clsact(&mut programs, &port.name, true)?;
                continue;
            }
            let link = PinnedLink::from_pin(&tc_path).map_err(|e| relink(e.to_string()))?;
            let link = SchedClassifierLink::try_from(FdLink::from(link))
                .map_err(|e| relink(e.to_string()))?;
            let prog = tc_mut(&mut programs)?;
            let id = prog
                .attach_to_link(link)
                .map_err(|e| relink(e.to_string()))?;
            drop(prog.take_link(id).map_err(|e| relink(e.to_string()))?);
        }
        for name in pin::PROGRAMS {
            let path = dir.prog(name);
            let _ = std::fs::remove_file(&path);
            xdp_mut(&mut programs, name)?
                .pin(&path)
                .map_err(|e| Error::Pin {
                    what: format!("pinning program {name} at {}", path.display()),
                    source: std::io::Error::other(e),
                })?;
        }
        Ok(Upgrade {
            before,
            after: pinned_program_ids(dir),
            ports: old.ports.iter().map(|p| p.name.clone()).collect(),
        })
    }

    /// Loads the dataplane like [`Self::load`] and pins its maps and its
    /// switch and egress programs under `dir`; ports attached later are
    /// pinned links. The switch then lives without any process until
    /// [`Self::destroy`] (or [`crate::pin::remove`]) removes the pins.
    ///
    /// # Errors
    /// [`Error::AlreadyUp`] when `dir` exists; load and pin failures (then
    /// nothing stays pinned).
    pub fn load_pinned(opts: LoadOptions, dir: &PinDir) -> Result<Self, Error> {
        // Creating the directory claims the name: of two concurrent `up`s
        // one gets `AlreadyUp` and never touches the other's pins.
        if let Some(root) = dir.path().parent() {
            std::fs::create_dir_all(root).map_err(|source| Error::Pin {
                what: format!("creating {}", root.display()),
                source,
            })?;
        }
        match std::fs::create_dir(dir.path()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::AlreadyUp {
                    dir: dir.path().to_owned(),
                });
            }
            Err(source) => {
                return Err(Error::Pin {
                    what: format!("creating {}", dir.path().display()),
                    source,
                });
            }
        }
        let loaded = Self::load(opts);
        let mut dp = match loaded {
            Ok(dp) => dp,
            Err(e) => {
                let _ = std::fs::remove_dir(dir.path());
                return Err(e);
            }
        };
        let pinned = dp.pin_to(dir);
        if let Err(e) = pinned {
            if let Err(rm) = pin::remove(dir) {
                log::warn!("removing {}: {rm}", dir.path().display());
            }
            return Err(e);
        }
        dp.pins = Some(dir.clone());
        Ok(dp)
    }

    fn pin_to(&mut self, dir: &PinDir) -> Result<(), Error> {
        let io = |what: String| move |source| Error::Pin { what, source };
        for sub in [dir.maps(), dir.links(), dir.progs()] {
            std::fs::create_dir_all(&sub).map_err(io(format!("creating {}", sub.display())))?;
        }
        for name in pin::MAPS.into_iter().chain([pin::LOGS]) {
            let map = self.maps.get(name).ok_or(Error::MissingMap(name))?;
            let path = dir.map(name);
            map.pin(&path).map_err(|e| Error::Pin {
                what: format!("pinning map {name} at {}", path.display()),
                source: std::io::Error::other(e),
            })?;
        }
        for name in pin::PROGRAMS {
            let path = dir.prog(name);
            xdp_mut(&mut self.programs, name)?
                .pin(&path)
                .map_err(|e| Error::Pin {
                    what: format!("pinning program {name} at {}", path.display()),
                    source: std::io::Error::other(e),
                })?;
        }
        Ok(())
    }

    /// Opens the switch pinned under `dir`: its maps, its ports (from the
    /// `PORT_INDEX` map and the pinned links) and its jobs (from the `JOBS`
    /// and `MEMBERS` maps). Loads nothing: the `test_run_*` methods and
    /// [`Self::attach`] are not available on the result; dropping it leaves
    /// the switch as it is.
    ///
    /// # Errors
    /// [`Error::NotUp`] when `dir` does not exist; a pin or map entry that
    /// cannot be read.
    pub fn open(dir: &PinDir) -> Result<Self, Error> {
        if !dir.exists() {
            return Err(Error::NotUp {
                dir: dir.path().to_owned(),
            });
        }
        let mut maps = Maps::new();
        let (mut slot_pool, mut units, mut cpus) = (0, 0, 0);
        for name in pin::MAPS {
            let path = dir.map(name);
            let data = MapData::from_pin(&path).map_err(|source| Error::Map {
                name,
                what: format!("opening pin {}", path.display()),
                source,
            })?;
            if [names::SLOTS, names::UNITS, names::WIDE_SCRATCH].contains(&name) {
                let info = data.info().map_err(|source| Error::Map {
                    name,
                    what: "info".to_owned(),
                    source,
                })?;
                match name {
                    names::SLOTS => slot_pool = info.max_entries() / 2,
                    names::UNITS => units = info.max_entries(),
                    _ => cpus = info.max_entries(),
                }
            }
            let map = aya::maps::Map::from_map_data(data).map_err(|source| Error::Map {
                name,
                what: "type".to_owned(),
                source,
            })?;
            maps.insert(name.to_owned(), map);
        }
        let mut dp = Self {
            programs: None,
            maps,
            ports: Vec::new(),
            jobs: BTreeMap::new(),
            job_counters: BTreeMap::new(),
            job_units: BTreeMap::new(),
            slot_pool,
            units,
            cpus,
            logger: None,
            pins: Some(dir.clone()),
            verification: Vec::new(),
        };
        dp.read_ports(dir)?;
        dp.read_jobs()?;
        Ok(dp)
    }

    fn read_ports(&mut self, dir: &PinDir) -> Result<(), Error> {
        let links = dir.link_pins().map_err(|source| Error::Pin {
            what: format!("listing {}", dir.links().display()),
            source,
        })?;
        let by_ifindex: HashMap<&MapData, u32, u32> = map_ref(&self.maps, names::PORT_INDEX)?;
        for item in &by_ifindex {
            let (ifindex, index) = item.map_err(|source| Error::Map {
                name: names::PORT_INDEX,
                what: "iterating".to_owned(),
                source,
            })?;
            // The link pin names the port; without one (a half-removed
            // switch), ask this thread's network namespace.
            let (name, mode, path) = match links.iter().find(|l| l.ifindex == ifindex) {
                Some(l) => (l.ifname.clone(), l.mode, l.path.clone()),
                None => (
                    crate::netdev::name(ifindex).unwrap_or_else(|| format!("ifindex {ifindex}")),
                    XdpMode::default(),
                    PathBuf::new(),
                ),
            };
            let tc_path = dir.tc_link(&name, ifindex);
            // Without a TCX link pin, the fan-out program is a clsact filter
            // (or missing, which detaching tolerates).
            let fanout = if tc_path.exists() {
                FanoutLink::Pinned(tc_path)
            } else {
                FanoutLink::Clsact(name.clone())
            };
            self.ports.push(Port {
                name,
                ifindex,
                mode,
                index,
                link: PortLink::Pinned(path),
                fanout,
            });
        }
        self.ports.sort_by_key(|p| p.index);
        Ok(())
    }

    fn read_jobs(&mut self) -> Result<(), Error> {
        let jobs: HashMap<&MapData, u32, Job> = map_ref(&self.maps, names::JOBS)?;
        let members: HashMap<&MapData, MemberKey, Member> = map_ref(&self.maps, names::MEMBERS)?;
        let mut out = Vec::new();
        for item in &jobs {
            let (id, job) = item.map_err(|source| Error::Map {
                name: names::JOBS,
                what: "iterating".to_owned(),
                source,
            })?;
            let bad = |what: String| Error::Job { job: id, what };
            let op = Op::from_u8(job.op).ok_or_else(|| bad(format!("pinned op {}", job.op)))?;
            let dtype = DType::from_u8(job.dtype)
                .ok_or_else(|| bad(format!("pinned dtype {}", job.dtype)))?;
            let mode = Mode::from_wire(job.mode)
                .ok_or_else(|| bad(format!("pinned mode {}", job.mode)))?;
            let mut specs = Vec::with_capacity(usize::from(job.fan_in));
            for rank in 0..u32::from(job.fan_in) {
                let m = members
                    .get(&MemberKey { job: id, rank }, 0)
                    .map_err(|source| Error::Map {
                        name: names::MEMBERS,
                        what: format!("job {id} rank {rank}"),
                        source,
                    })?;
                specs.push(MemberSpec {
                    rank: u8::try_from(rank).expect("fan_in is a u8"),
                    ip: Ipv4Addr::from(m.ip),
                    udp_port: u16::from_be_bytes(m.port),
                    mac: m.mac,
                    ifindex: m.ifindex,
                    port_mac: m.port_mac,
                    sender: m.flags & member_flags::SENDER != 0,
                    down: m.flags & member_flags::DOWN != 0,
                });
            }
            out.push((
                JobSpec {
                    id,
                    op,
                    dtype,
                    mode,
                    elems_per_packet: job.elems,
                    slot_base: job.slot_base,
                    slot_count: job.slot_count,
                    members: specs,
                },
                job.counters,
                job.unit_base,
            ));
        }
        for (spec, counters, unit_base) in out {
            self.job_counters.insert(spec.id, counters);
            if spec.is_wide() {
                self.job_units.insert(spec.id, unit_base);
            }
            self.jobs.insert(spec.id, spec);
        }
        Ok(())
    }

    /// A reader of the log records of the switch pinned under `dir`, for a
    /// process other than the one that brought it up (records appear only
    /// when the switch runs with `debug`). One reader at a time: records
    /// are consumed.
    ///
    /// # Errors
    /// No switch there, or its log map cannot be opened.
    pub fn open_logger(dir: &PinDir) -> Result<Logger, Error> {
        let path = dir.map(pin::LOGS);
        let data = MapData::from_pin(&path).map_err(|source| Error::Map {
            name: pin::LOGS,
            what: format!("opening pin {}", path.display()),
            source,
        })?;
        let id = data
            .info()
            .map_err(|source| Error::Map {
                name: pin::LOGS,
                what: "info".to_owned(),
                source,
            })?
            .id();
        logger_for_map(id).ok_or(Error::MissingMap(pin::LOGS))
    }

    /// Where this switch is pinned, if it is.
    pub fn pins(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    /// Detaches every port and removes the switch's pins: nothing of it
    /// stays in the kernel once this process lets go of it.
    ///
    /// # Errors
    /// When a pin cannot be removed (the rest are still removed).
    pub fn destroy(mut self) -> Result<(), Error> {
        self.detach_all();
        match self.pins.take() {
            Some(dir) => pin::remove(&dir).map(drop).map_err(|source| Error::Pin {
                what: format!("removing {}", dir.path().display()),
                source,
            }),
            None => Ok(()),
        }
    }

    /// The reader of the dataplane's log records, when loaded with `debug`.
    /// Whoever takes it must call its `flush` when its descriptor is readable.
    pub fn take_logger(&mut self) -> Option<Logger> {
        self.logger.take()
    }

    /// Number of slots in the pool.
    pub fn slot_pool(&self) -> u32 {
        self.slot_pool
    }

    /// The attached ports.
    pub fn ports(&self) -> &[Port] {
        &self.ports
    }

    /// The installed jobs.
    pub fn jobs(&self) -> impl Iterator<Item = &JobSpec> {
        self.jobs.values()
    }

    /// Installed job `id`.
    pub fn job(&self, id: u32) -> Option<&JobSpec> {
        self.jobs.get(&id)
    }

    /// Makes `ifname` a switch port: attaches the ingress program and adds
    /// the port, with the egress program, to the broadcast devmap. On a
    /// pinned dataplane the link is pinned too.
    ///
    /// # Errors
    /// Unknown interface, already attached, too many ports, attach failure.
    pub fn attach(&mut self, ifname: &str, mode: XdpMode) -> Result<&Port, Error> {
        if self.ports.iter().any(|p| p.name == ifname) {
            return Err(Error::AlreadyAttached(ifname.to_owned()));
        }
        // The lowest free devmap index.
        let index = (0u32..MAX_PORTS)
            .find(|i| self.ports.iter().all(|p| p.index != *i))
            .ok_or(Error::TooManyPorts)?;
        let ifindex = crate::netdev::ifindex(ifname)
            .ok_or_else(|| Error::UnknownInterface(ifname.to_owned()))?;
        let egress_fd = program_fd(&mut self.programs, programs::EGRESS)?;
        let mut ports: DevMap<&mut MapData> = map_mut(&mut self.maps, names::PORTS)?;
        ports
            .set(index, ifindex, Some(&egress_fd), 0)
            .map_err(|source| Error::Port {
                ifname: ifname.to_owned(),
                source,
            })?;
        self.reset_counter_block(names::PORT_COUNTERS, index)?;
        {
            let mut by_ifindex: HashMap<&mut MapData, u32, u32> =
                map_mut(&mut self.maps, names::PORT_INDEX)?;
            by_ifindex
                .insert(ifindex, index, 0)
                .map_err(|source| Error::Map {
                    name: names::PORT_INDEX,
                    what: format!("adding {ifname}"),
                    source,
                })?;
        }
        let attached = self.attach_link(ifname, ifindex, mode);
        let link = match attached {
            Ok(link) => link,
            Err(e) => {
                // Leave the maps as they were: the port does not exist.
                self.clear_port_slot(index, ifindex);
                return Err(e);
            }
        };
        let fanout = match self.attach_fanout(ifname, ifindex) {
            Ok(f) => f,
            Err(e) => {
                self.detach_port(ifname, link, None);
                self.clear_port_slot(index, ifindex);
                return Err(e);
            }
        };
        self.ports.push(Port {
            name: ifname.to_owned(),
            ifindex,
            mode,
            index,
            link,
            fanout,
        });
        Ok(self.ports.last().expect("just pushed"))
    }

    fn attach_link(
        &mut self,
        ifname: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<PortLink, Error> {
        let prog = xdp_mut(&mut self.programs, programs::SWITCH)?;
        let id = prog.attach_to_if_index(ifindex, mode).map_err(|source| {
            let busy = matches!(&source, ProgramError::SyscallError(e)
                    if matches!(e.io_error.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)));
            if busy {
                Error::Busy(ifname.to_owned())
            } else {
                Error::Attach {
                    ifname: ifname.to_owned(),
                    mode,
                    source,
                }
            }
        })?;
        let Some(dir) = &self.pins else {
            return Ok(PortLink::Owned(id));
        };
        let path = dir.link(ifname, ifindex, mode);
        let pinned = prog
            .take_link(id)
            .map_err(|source| Error::Attach {
                ifname: ifname.to_owned(),
                mode,
                source,
            })
            .and_then(|link| {
                FdLink::try_from(link).map_err(|e| Error::Pin {
                    what: format!("{ifname}: the XDP attachment is not a bpf_link ({e})"),
                    source: std::io::Error::other(e),
                })
            })
            .and_then(|link| {
                link.pin(&path).map_err(|e| Error::Pin {
                    what: format!("pinning the link of {ifname} at {}", path.display()),
                    source: std::io::Error::other(e),
                })
            });
        // On error the link was dropped, which detached it.
        pinned.map(|_| PortLink::Pinned(path))
    }

    /// Attaches the fan-out program to the port's TCX ingress (pinned on a
    /// pinned switch).
    fn attach_fanout(&mut self, ifname: &str, ifindex: u32) -> Result<FanoutLink, Error> {
        let err = |source| Error::Program {
            name: programs::FANOUT,
            what: "attach (TCX ingress)",
            source,
        };
        let pins = self.pins.clone();
        let prog = tc_mut(&mut self.programs)?;
        // TCX where the kernel has it (6.6 and later): a link, pinned with
        // the switch. Probed by trying, not by the kernel's version.
        let tcx = prog.attach_with_options(
            ifname,
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        );
        let id = match tcx {
            Ok(id) => id,
            Err(tcx_error) => {
                log::debug!("{ifname}: no TCX ({tcx_error}); attaching through clsact");
                return attach_fanout_clsact(&mut self.programs, ifname, pins.is_some());
            }
        };
        let Some(dir) = pins else {
            return Ok(FanoutLink::Owned(id));
        };
        let path = dir.tc_link(ifname, ifindex);
        let link = prog.take_link(id).map_err(err)?;
        let link = FdLink::try_from(link).map_err(|e| Error::Pin {
            what: format!("{ifname}: the TCX attachment is not a bpf_link ({e})"),
            source: std::io::Error::other(e),
        })?;
        link.pin(&path).map_err(|e| Error::Pin {
            what: format!("pinning the fan-out link of {ifname} at {}", path.display()),
            source: std::io::Error::other(e),
        })?;
        Ok(FanoutLink::Pinned(path))
    }

    /// Detaches a port's programs (the XDP link, and the fan-out link if
    /// there is one).
    fn detach_port(&mut self, name: &str, link: PortLink, fanout: Option<FanoutLink>) {
        match link {
            PortLink::Owned(id) => {
                if let Ok(prog) = xdp_mut(&mut self.programs, programs::SWITCH)
                    && let Err(e) = prog.detach(id)
                {
                    log::warn!("detaching from {name}: {e}");
                }
            }
            PortLink::Pinned(path) => {
                if let Err(e) = pin::unpin_link(&path) {
                    log::warn!("detaching from {name}: {e}");
                }
            }
        }
        match fanout {
            None => {}
            Some(FanoutLink::Owned(id)) => {
                if let Ok(prog) = tc_mut(&mut self.programs)
                    && let Err(e) = prog.detach(id)
                {
                    log::warn!("detaching the fan-out program from {name}: {e}");
                }
            }
            Some(FanoutLink::Pinned(path)) => {
                if !path.as_os_str().is_empty()
                    && let Err(e) = pin::unpin_link(&path)
                {
                    log::warn!("detaching the fan-out program from {name}: {e}");
                }
            }
            Some(FanoutLink::Clsact(ifname)) => {
                if let Err(e) = pin::detach_fanout_filter(&ifname) {
                    log::warn!("detaching the fan-out program from {name}: {e}");
                }
            }
        }
    }

    fn clear_port_slot(&mut self, index: u32, ifindex: u32) {
        if let Ok(mut ports) = map_mut::<DevMap<&mut MapData>>(&mut self.maps, names::PORTS) {
            // An entry with ifindex 0 is what an unused devmap slot holds;
            // the broadcast skips it.
            let _ = ports.set(index, 0, None, 0);
        }
        if let Ok(mut by_ifindex) =
            map_mut::<HashMap<&mut MapData, u32, u32>>(&mut self.maps, names::PORT_INDEX)
        {
            let _ = by_ifindex.remove(&ifindex);
        }
    }

    /// Detaches every port (removing pinned links). Also done on drop of a
    /// dataplane that is not pinned.
    pub fn detach_all(&mut self) {
        let ports = std::mem::take(&mut self.ports);
        for port in ports.into_iter().rev() {
            self.detach_port(&port.name, port.link, Some(port.fanout));
            self.clear_port_slot(port.index, port.ifindex);
        }
    }

    /// Zeroes the counter block at `index` of the per-job or per-port array.
    fn reset_counter_block(&mut self, name: &'static str, index: u32) -> Result<(), Error> {
        let invalid = |what: String| Error::Map {
            name,
            what,
            source: aya::maps::MapError::InvalidName {
                name: name.to_owned(),
            },
        };
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| invalid(format!("{what}: {e}")))?;
        let zero = PerCpuValues::try_from(vec![[0u64; Counter::COUNT]; cpus])
            .map_err(|e| invalid(format!("per-CPU values: {e}")))?;
        let mut map: PerCpuArray<&mut MapData, CounterBlock> = map_mut(&mut self.maps, name)?;
        map.set(index, zero, 0).map_err(|source| Error::Map {
            name,
            what: format!("entry {index}"),
            source,
        })
    }

    fn counter_block(&self, name: &'static str, index: u32) -> Result<Counters, Error> {
        let map: PerCpuArray<&MapData, CounterBlock> = map_ref(&self.maps, name)?;
        let values = map.get(&index, 0).map_err(|source| Error::Map {
            name,
            what: format!("reading entry {index}"),
            source,
        })?;
        Ok(Counters::from_per_cpu(&values))
    }

    /// Where job `id`'s counters are in the `JOB_COUNTERS` array, for tools
    /// that read the per-CPU values themselves.
    pub fn job_counter_index(&self, id: u32) -> Option<u32> {
        self.job_counters.get(&id).map(|i| u32::from(*i))
    }

    /// The `PORTS` (and `PORT_COUNTERS`) index of the port with this ifindex.
    pub fn port_index(&self, ifindex: u32) -> Option<u32> {
        self.ports
            .iter()
            .find(|p| p.ifindex == ifindex)
            .map(|p| p.index)
    }

    /// The counters of installed job `id`, summed over CPUs.
    ///
    /// # Errors
    /// [`Error::NoSuchJob`], or when the map cannot be read.
    pub fn job_counters(&self, id: u32) -> Result<Counters, Error> {
        let index = *self.job_counters.get(&id).ok_or(Error::NoSuchJob(id))?;
        self.counter_block(names::JOB_COUNTERS, u32::from(index))
    }

    /// The counters of the port with this ifindex, summed over CPUs: what it
    /// received (ingress) and the result copies that left through it (egress).
    ///
    /// # Errors
    /// When the port is not attached or the map cannot be read.
    pub fn port_counters(&self, ifindex: u32) -> Result<Counters, Error> {
        let index = self
            .port_index(ifindex)
            .ok_or_else(|| Error::UnknownInterface(format!("ifindex {ifindex}")))?;
        self.counter_block(names::PORT_COUNTERS, index)
    }

    /// Installs a job or a group: its slots are cleared, its counters and
    /// per-member packet counters zeroed, its members and then the job
    /// entry written. On any error nothing of the job remains.
    ///
    /// A multicast or anycast group ([`Mode::is_group`]) has dtype `Bytes`,
    /// op `Sum`, 1..=1440 payload bytes per packet and at least one member
    /// with `sender`; a multicast group at least 2 members and a non-zero
    /// multiple of its member count as slots (one window per member); an
    /// anycast group may have no slots, and members marked `down` (only
    /// anycast members may be). An aggregation job has neither `Bytes` nor
    /// `sender` or `down` members. `Job::all_ranks` is [`JobSpec::all_ranks`].
    ///
    /// # Errors
    /// Job already installed, invalid shape, slot range outside the pool or
    /// overlapping another job, map update failures.
    pub fn install_job(&mut self, job: &JobSpec) -> Result<(), Error> {
        self.check_job(job)?;
        // The lowest counter block no installed job uses.
        let mut used: Vec<u16> = self.job_counters.values().copied().collect();
        used.sort_unstable();
        let counters = (0usize..)
            .zip(&used)
            .find(|(i, u)| *i != usize::from(**u))
            .map_or(used.len(), |(i, _)| i);
        let counters = u16::try_from(counters)
            .ok()
            .filter(|c| u32::from(*c) < MAX_JOBS)
            .ok_or(Error::Job {
                job: job.id,
                what: format!("{MAX_JOBS} jobs are installed already"),
            })?;
        let unit_base = if job.is_wide() {
            self.allocate_units(job)?
        } else {
            0
        };
        let res = self.write_job(job, counters, unit_base);
        if res.is_err() {
            self.erase_job(job);
        } else {
            self.job_counters.insert(job.id, counters);
            if job.is_wide() {
                self.job_units.insert(job.id, unit_base);
            }
            self.jobs.insert(job.id, job.clone());
        }
        res
    }

    /// Units of `UNITS` a wide job needs ([`xina_proto::frame::wide_units`]).
    pub fn units_needed(&self, job: &JobSpec) -> u64 {
        frame::wide_units(usize::from(job.elems_per_packet), job.slot_count, self.cpus)
    }

    /// Units in the wide path's pool, and CPUs (partials per slot copy).
    pub fn unit_pool(&self) -> (u32, u32) {
        (self.units, self.cpus)
    }

    /// The unit ranges wide jobs hold, as `(start, end)`, sorted.
    fn used_units(&self) -> Vec<(u64, u64)> {
        let mut used: Vec<(u64, u64)> = self
            .job_units
            .iter()
            .filter_map(|(id, base)| {
                let other = self.jobs.get(id)?;
                Some((
                    u64::from(*base),
                    u64::from(*base) + self.units_needed(other),
                ))
            })
            .collect();
        used.sort_unstable();
        used
    }

    /// The largest free range of the wide path's pool, in units: the most
    /// a new wide job may need.
    pub fn largest_free_units(&self) -> u64 {
        let (mut best, mut at) = (0, 0);
        for (b, e) in self.used_units() {
            best = best.max(b.saturating_sub(at));
            at = at.max(e);
        }
        best.max(u64::from(self.units).saturating_sub(at))
    }

    /// The first unit of a free range for `job` (first fit).
    fn allocate_units(&self, job: &JobSpec) -> Result<u32, Error> {
        let need = self.units_needed(job);
        let mut at = 0u64;
        for (b, e) in self.used_units() {
            if b >= at + need {
                break;
            }
            at = at.max(e);
        }
        if at + need > u64::from(self.units) {
            return Err(Error::Job {
                job: job.id,
                what: format!(
                    "{need} units of wide-path memory wanted ({} slots of {} elements on {} CPUs), \
                     but the switch's pool of {} units has no free range that large \
                     (`units` in the switch file's [switch] section sets it)",
                    job.slot_count, job.elems_per_packet, self.cpus, self.units
                ),
            });
        }
        Ok(u32::try_from(at).expect("below the pool size"))
    }

    fn check_job(&self, job: &JobSpec) -> Result<(), Error> {
        let bad = |what: String| Error::Job { job: job.id, what };
        if self.jobs.contains_key(&job.id) {
            return Err(Error::JobExists(job.id));
        }
        let fan_in = job.members.len();
        if fan_in == 0 || fan_in > MAX_RANKS {
            return Err(bad(format!("{fan_in} members (must be 1..={MAX_RANKS})")));
        }
        for (i, m) in job.members.iter().enumerate() {
            if usize::from(m.rank) != i {
                return Err(bad(format!(
                    "member {i} has rank {} (ranks must be 0..{fan_in} in order)",
                    m.rank
                )));
            }
            if m.ifindex == 0 {
                return Err(bad(format!("rank {}: no switch port (ifindex 0)", m.rank)));
            }
            if let Some(other) = job.members[..i].iter().find(|o| o.ifindex == m.ifindex) {
                return Err(bad(format!(
                    "ranks {} and {} sit behind the same switch port (one member per port and job)",
                    other.rank, m.rank
                )));
            }
        }
        let max = job.dtype.max_elems();
        if job.elems_per_packet == 0 || usize::from(job.elems_per_packet) > max {
            return Err(bad(format!(
                "elems_per_packet {} (must be 1..={max} for {:?})",
                job.elems_per_packet, job.dtype
            )));
        }
        check_group(job).map_err(bad)?;
        if job.is_wide() && job.mode != Mode::Allreduce {
            return Err(bad(format!(
                "elems_per_packet {} is above the {} of one 1,500-byte frame: only allreduce \
                 jobs take bigger frames (the wide path has no reduce or reduce-scatter delivery)",
                job.elems_per_packet,
                job.dtype.narrow_elems()
            )));
        }
        let end = u64::from(job.slot_base) + u64::from(job.slot_count);
        // An anycast group needs no slots.
        let slots_needed = job.mode != Mode::Anycast;
        if (slots_needed && job.slot_count == 0) || end > u64::from(self.slot_pool) {
            return Err(bad(format!(
                "slots {}..{end} do not fit the pool of {} slots",
                job.slot_base, self.slot_pool
            )));
        }
        // An empty range (an anycast group's) overlaps nothing.
        let others = self
            .jobs
            .values()
            .filter(|o| job.slot_count != 0 && o.slot_count != 0);
        for other in others {
            let other_end = other.slot_base + other.slot_count;
            if u64::from(job.slot_base) < u64::from(other_end) && u64::from(other.slot_base) < end {
                return Err(bad(format!(
                    "slots {}..{end} overlap job {}'s slots {}..{other_end}",
                    job.slot_base, other.id, other.slot_base
                )));
            }
        }
        Ok(())
    }

    fn write_job(&mut self, job: &JobSpec, counters: u16, unit_base: u32) -> Result<(), Error> {
        let map_err =
            |name: &'static str, what: String| move |source| Error::Map { name, what, source };
        {
            let mut slots: Array<&mut MapData, Slot> = map_mut(&mut self.maps, names::SLOTS)?;
            let empty = Slot::default();
            for i in 2 * job.slot_base..2 * (job.slot_base + job.slot_count) {
                slots
                    .set(i, empty, 0)
                    .map_err(map_err(names::SLOTS, format!("clearing slot copy {i}")))?;
            }
        }
        {
            let mut members: HashMap<&mut MapData, MemberKey, Member> =
                map_mut(&mut self.maps, names::MEMBERS)?;
            for m in &job.members {
                let key = MemberKey {
                    job: job.id,
                    rank: u32::from(m.rank),
                };
                members
                    .insert(key, member_value(m, &self.ports), 0)
                    .map_err(map_err(
                        names::MEMBERS,
                        format!("job {} rank {}", job.id, m.rank),
                    ))?;
            }
        }
        {
            let mut by_port: HashMap<&mut MapData, PortKey, Member> =
                map_mut(&mut self.maps, names::PORT_MEMBERS)?;
            for m in &job.members {
                let key = PortKey {
                    job: job.id,
                    ifindex: m.ifindex,
                };
                by_port
                    .insert(key, member_value(m, &self.ports), 0)
                    .map_err(map_err(
                        names::PORT_MEMBERS,
                        format!("job {} rank {}", job.id, m.rank),
                    ))?;
            }
        }
        let fan_in = u8::try_from(job.members.len()).expect("checked: at most 64 members");
        let value = Job {
            fan_in,
            op: job.op as u8,
            dtype: job.dtype as u8,
            mode: job.mode.wire(),
            elems: job.elems_per_packet,
            counters,
            slot_base: job.slot_base,
            slot_count: job.slot_count,
            all_ranks: job.all_ranks(),
            unit_base,
            blocks: if job.is_wide() {
                u32::try_from(frame::blocks(usize::from(job.elems_per_packet)))
                    .expect("at most MAX_BLOCKS")
            } else {
                0
            },
        };
        self.reset_counter_block(names::JOB_COUNTERS, u32::from(counters))?;
        self.reset_member_packets(counters)?;
        // The job entry goes last: until it exists, no packet reaches the slots.
        let mut jobs: HashMap<&mut MapData, u32, Job> = map_mut(&mut self.maps, names::JOBS)?;
        jobs.insert(job.id, value, 0)
            .map_err(map_err(names::JOBS, format!("job {}", job.id)))
    }

    /// Removes whatever the dataplane holds of `job` (ignoring absent entries).
    fn erase_job(&mut self, job: &JobSpec) {
        if let Ok(mut jobs) =
            map_mut::<HashMap<&mut MapData, u32, Job>>(&mut self.maps, names::JOBS)
        {
            let _ = jobs.remove(&job.id);
        }
        if let Ok(mut members) =
            map_mut::<HashMap<&mut MapData, MemberKey, Member>>(&mut self.maps, names::MEMBERS)
        {
            for m in &job.members {
                let _ = members.remove(&MemberKey {
                    job: job.id,
                    rank: u32::from(m.rank),
                });
            }
        }
        if let Ok(mut by_port) =
            map_mut::<HashMap<&mut MapData, PortKey, Member>>(&mut self.maps, names::PORT_MEMBERS)
        {
            for m in &job.members {
                let _ = by_port.remove(&PortKey {
                    job: job.id,
                    ifindex: m.ifindex,
                });
            }
        }
    }

    /// Removes an installed job; its traffic is dropped as an unknown job.
    ///
    /// # Errors
    /// [`Error::NoSuchJob`].
    pub fn remove_job(&mut self, id: u32) -> Result<(), Error> {
        let job = self.jobs.remove(&id).ok_or(Error::NoSuchJob(id))?;
        let counters = self.job_counters.remove(&id);
        self.job_units.remove(&id);
        self.erase_job(&job);
        // The job's traffic is gone; leave the block clean for the next
        // job that gets it (install zeroes it too).
        if let Some(counters) = counters
            && let Err(e) = self.reset_member_packets(counters)
        {
            log::warn!("job {id}: clearing its member packet counters: {e}");
        }
        Ok(())
    }

    /// Zeroes the `MEMBER_PACKETS` entries of the job block `counters`.
    fn reset_member_packets(&mut self, counters: u16) -> Result<(), Error> {
        let mut map: Array<&mut MapData, u64> = map_mut(&mut self.maps, names::MEMBER_PACKETS)?;
        let first = u32::from(counters) * MEMBER_PACKETS_PER_JOB;
        for index in first..first + MEMBER_PACKETS_PER_JOB {
            map.set(index, 0, 0).map_err(|source| Error::Map {
                name: names::MEMBER_PACKETS,
                what: format!("clearing entry {index}"),
                source,
            })?;
        }
        Ok(())
    }

    /// The data copies the switch delivered to each member of group `job`
    /// (multicast copies and anycast packets), one entry per rank
    /// `0..fan_in`, since the group was installed. All zero for an
    /// aggregation job, which gets no such copies.
    ///
    /// # Errors
    /// [`Error::NoSuchJob`], or when the map cannot be read.
    pub fn member_packets(&self, job: u32) -> Result<Vec<u64>, Error> {
        let spec = self.jobs.get(&job).ok_or(Error::NoSuchJob(job))?;
        let counters = *self.job_counters.get(&job).ok_or(Error::NoSuchJob(job))?;
        let map: Array<&MapData, u64> = map_ref(&self.maps, names::MEMBER_PACKETS)?;
        let first = u32::from(counters) * MEMBER_PACKETS_PER_JOB;
        (first..)
            .take(spec.members.len())
            .map(|index| {
                map.get(&index, 0).map_err(|source| Error::Map {
                    name: names::MEMBER_PACKETS,
                    what: format!("job {job}: reading entry {index}"),
                    source,
                })
            })
            .collect()
    }

    /// The counters, summed over CPUs.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn counters(&self) -> Result<Counters, Error> {
        let map: PerCpuArray<&MapData, u64> = map_ref(&self.maps, names::COUNTERS)?;
        let mut out = Counters::default();
        for c in Counter::ALL {
            let values = map.get(&(c as u32), 0).map_err(|source| Error::Map {
                name: names::COUNTERS,
                what: format!("reading {}", c.name()),
                source,
            })?;
            out.0[c as usize] = values.iter().sum();
        }
        Ok(out)
    }

    /// Every entry of the job, member, port and slot maps, for tests that
    /// check an operation left the dataplane as it was (and for debugging).
    ///
    /// # Errors
    /// When a map cannot be read.
    pub fn dump(&self) -> Result<Dump, Error> {
        fn entries<K: aya::Pod + Ord + Copy, V: aya::Pod>(
            maps: &Maps,
            name: &'static str,
        ) -> Result<Vec<(K, V)>, Error> {
            let map: HashMap<&MapData, K, V> = map_ref(maps, name)?;
            let mut out = map
                .iter()
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| Error::Map {
                    name,
                    what: "iterating".to_owned(),
                    source,
                })?;
            out.sort_by_key(|a| a.0);
            Ok(out)
        }
        let key = |k: MemberKey| (k.job, k.rank);
        let port_key = |k: PortKey| (k.job, k.ifindex);
        let members: HashMap<&MapData, MemberKey, Member> = map_ref(&self.maps, names::MEMBERS)?;
        let port_members: HashMap<&MapData, PortKey, Member> =
            map_ref(&self.maps, names::PORT_MEMBERS)?;
        let read_err = |name| {
            move |source| Error::Map {
                name,
                what: "iterating".to_owned(),
                source,
            }
        };
        let mut member_list = members
            .iter()
            .map(|r| r.map(|(k, v)| (key(k), v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_err(names::MEMBERS))?;
        member_list.sort_by_key(|e| e.0);
        let mut port_member_list = port_members
            .iter()
            .map(|r| r.map(|(k, v)| (port_key(k), v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_err(names::PORT_MEMBERS))?;
        port_member_list.sort_by_key(|e| e.0);
        let slots: Array<&MapData, Slot> = map_ref(&self.maps, names::SLOTS)?;
        let slots = slots
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_err(names::SLOTS))?;
        Ok(Dump {
            jobs: entries(&self.maps, names::JOBS)?,
            members: member_list,
            port_members: port_member_list,
            port_index: entries(&self.maps, names::PORT_INDEX)?,
            slots,
        })
    }

    /// Copy `version` of slot `slot` of the pool (absolute index).
    ///
    /// # Errors
    /// When the index is outside the pool.
    pub fn slot(&self, slot: u32, version: bool) -> Result<Slot, Error> {
        let map: Array<&MapData, Slot> = map_ref(&self.maps, names::SLOTS)?;
        let index = 2 * slot + u32::from(version);
        map.get(&index, 0).map_err(|source| Error::Map {
            name: names::SLOTS,
            what: format!("reading slot {slot} copy {}", u32::from(version)),
            source,
        })
    }

    /// Runs the ingress program once on `frame`, as if it arrived on
    /// interface `ingress_ifindex` (which must exist in this namespace; 0 for
    /// none), changing slots and counters like a real packet.
    ///
    /// # Errors
    /// When the kernel refuses the test run.
    pub fn test_run_switch(
        &mut self,
        frame: &[u8],
        ingress_ifindex: u32,
    ) -> Result<TestOutput, Error> {
        run(
            xdp_mut(&mut self.programs, programs::SWITCH)?,
            programs::SWITCH,
            frame,
            ingress_ifindex,
        )
    }

    /// Runs the `XDP_DROP` baseline program on `frame` `repeat` times; the
    /// kernel reports the mean duration of one run.
    ///
    /// # Errors
    /// When the kernel refuses the test run.
    pub fn test_run_drop(
        &mut self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(TestOutput, std::time::Duration), Error> {
        run_timed(
            xdp_mut(&mut self.programs, programs::DROP)?,
            programs::DROP,
            frame,
            0,
            repeat,
        )
    }

    /// Like [`Self::test_run_switch`], `repeat` times, with the kernel's mean
    /// duration of one run (for benchmarks: the frame's path must not change
    /// from one run to the next, or the mean mixes paths).
    ///
    /// # Errors
    /// When the kernel refuses the test run.
    pub fn test_run_switch_timed(
        &mut self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(TestOutput, std::time::Duration), Error> {
        run_timed(
            xdp_mut(&mut self.programs, programs::SWITCH)?,
            programs::SWITCH,
            frame,
            0,
            repeat,
        )
    }

    /// Runs the egress logic once on `frame` as if the copy left through
    /// interface `egress_ifindex`.
    ///
    /// # Errors
    /// When the kernel refuses the test run.
    pub fn test_run_egress(
        &mut self,
        frame: &[u8],
        egress_ifindex: u32,
    ) -> Result<TestOutput, Error> {
        {
            let mut m: Array<&mut MapData, u32> =
                map_mut(&mut self.maps, names::TEST_EGRESS_IFINDEX)?;
            m.set(0, egress_ifindex, 0).map_err(|source| Error::Map {
                name: names::TEST_EGRESS_IFINDEX,
                what: "set".to_owned(),
                source,
            })?;
        }
        run(
            xdp_mut(&mut self.programs, programs::EGRESS_TEST)?,
            programs::EGRESS_TEST,
            frame,
            0,
        )
    }

    /// Marks member `rank` of anycast group `job` down (`down`: its bit
    /// leaves the group's `all_ranks`, so no new packet is sent to it, and
    /// its `MEMBERS` and `PORT_MEMBERS` entries get the DOWN flag) or up
    /// again. The entries are read, changed and written back in an order
    /// that keeps the bit set only while the flags say up: the job entry
    /// first when going down, last when going up. Marking a member as it
    /// already is changes nothing.
    ///
    /// # Errors
    /// [`Error::NoSuchJob`]; [`Error::Job`] when `job` is not an anycast
    /// group or `rank` not one of its members; map failures (then the
    /// entries written so far stay written: run it again).
    pub fn set_member_down(&mut self, job: u32, rank: u8, down: bool) -> Result<(), Error> {
        let spec = self.jobs.get(&job).ok_or(Error::NoSuchJob(job))?;
        let bad = |what: String| Error::Job { job, what };
        if spec.mode != Mode::Anycast {
            return Err(bad(format!(
                "rank {rank}: only members of anycast groups go down or up (mode {})",
                spec.mode.name()
            )));
        }
        let n = spec.members.len();
        let ifindex = spec
            .members
            .get(usize::from(rank))
            .ok_or_else(|| bad(format!("rank {rank} is not a member (ranks 0..{n})")))?
            .ifindex;
        let key = MemberKey {
            job,
            rank: u32::from(rank),
        };
        let port_key = PortKey { job, ifindex };
        let what = |name: &str| format!("job {job} rank {rank}: {name}");
        let read = |name: &'static str| {
            move |source| Error::Map {
                name,
                what: what("reading"),
                source,
            }
        };
        let write = |name: &'static str| {
            move |source| Error::Map {
                name,
                what: what("writing"),
                source,
            }
        };
        let mut job_value = {
            let jobs: HashMap<&MapData, u32, Job> = map_ref(&self.maps, names::JOBS)?;
            jobs.get(&job, 0).map_err(read(names::JOBS))?
        };
        // The receivers that are up, as installing the changed spec would
        // compute them (a sender never receives, up or down).
        let mut changed = spec.clone();
        changed.members[usize::from(rank)].down = down;
        job_value.all_ranks = changed.all_ranks();
        let flag = |mut m: Member| {
            if down {
                m.flags |= member_flags::DOWN;
            } else {
                m.flags &= !member_flags::DOWN;
            }
            m
        };
        let write_job = |maps: &mut Maps| -> Result<(), Error> {
            let mut jobs: HashMap<&mut MapData, u32, Job> = map_mut(maps, names::JOBS)?;
            jobs.insert(job, job_value, 0).map_err(write(names::JOBS))
        };
        if down {
            write_job(&mut self.maps)?;
        }
        {
            let mut members: HashMap<&mut MapData, MemberKey, Member> =
                map_mut(&mut self.maps, names::MEMBERS)?;
            let m = members.get(&key, 0).map_err(read(names::MEMBERS))?;
            members
                .insert(key, flag(m), 0)
                .map_err(write(names::MEMBERS))?;
        }
        {
            let mut by_port: HashMap<&mut MapData, PortKey, Member> =
                map_mut(&mut self.maps, names::PORT_MEMBERS)?;
            let m = by_port
                .get(&port_key, 0)
                .map_err(read(names::PORT_MEMBERS))?;
            by_port
                .insert(port_key, flag(m), 0)
                .map_err(write(names::PORT_MEMBERS))?;
        }
        if !down {
            write_job(&mut self.maps)?;
        }
        if let Some(m) = self
            .jobs
            .get_mut(&job)
            .and_then(|j| j.members.get_mut(usize::from(rank)))
        {
            m.down = down;
        }
        Ok(())
    }
}

impl Drop for Dataplane {
    /// Detaches the ports of a dataplane that is not pinned; a pinned one
    /// stays as it is.
    fn drop(&mut self) {
        if self.pins.is_none() {
            self.detach_all();
        }
    }
}

/// A log reader on the aya-log ring buffer with kernel id `map_id`, found
/// through a loaded program that uses it (aya-log opens it by program).
fn logger_for_map(map_id: u32) -> Option<Logger> {
    let prog = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| {
            p.map_ids()
                .ok()
                .flatten()
                .is_some_and(|ids| ids.contains(&map_id))
        })?;
    aya_log::EbpfLogger::init_from_id(prog.id()).ok()
}

/// Loads every program of `ebpf` and takes its maps out of it; what the
/// verifier made of each program.
fn load_programs(ebpf: Ebpf) -> Result<(Ebpf, Maps, Vec<ProgramLoad>), Error> {
    let names = [
        programs::SWITCH,
        programs::EGRESS,
        programs::EGRESS_TEST,
        programs::DROP,
        programs::GROUP,
    ];
    let mut ebpf = Some(ebpf);
    let mut loads = Vec::new();
    for name in names
        .into_iter()
        .chain(programs::AGGREGATE)
        .chain(programs::WIDE)
    {
        let started = std::time::Instant::now();
        let prog = xdp_mut(&mut ebpf, name)?;
        prog.load().map_err(|e| refused(name, e))?;
        let load_time = started.elapsed();
        let insns = prog
            .info()
            .ok()
            .and_then(|i| i.verified_instruction_count());
        log::debug!("{name}: loaded in {load_time:?}, {insns:?} instructions verified");
        loads.push(ProgramLoad {
            name,
            insns,
            load_time,
        });
    }
    let started = std::time::Instant::now();
    let prog = tc_mut(&mut ebpf)?;
    prog.load().map_err(|e| refused(programs::FANOUT, e))?;
    loads.push(ProgramLoad {
        name: programs::FANOUT,
        insns: prog
            .info()
            .ok()
            .and_then(|i| i.verified_instruction_count()),
        load_time: started.elapsed(),
    });
    let mut ebpf = ebpf.expect("set above");
    let map_names: Vec<String> = ebpf.maps().map(|(n, _)| n.to_owned()).collect();
    let maps = map_names
        .into_iter()
        .filter_map(|name| ebpf.take_map(&name).map(|m| (name, m)))
        .collect();
    Ok((ebpf, maps, loads))
}

/// The error of a program the kernel did not load: a refusal by the
/// verifier becomes [`Error::Refused`], its log saved to a file rather than
/// carried in the message.
fn refused(name: &'static str, source: ProgramError) -> Error {
    match source {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            Error::Refused {
                name,
                kernel: verifier::kernel_release(),
                errno: io_error.to_string(),
                verdict: verifier::verdict(&log),
                log: verifier::save_log(name, &log),
            }
        }
        source => Error::Program {
            name,
            what: "load",
            source,
        },
    }
}

/// Points the `AGGREGATE` program array at the loaded aggregation
/// programs and the group program, by index: what `xina_switch` tail-calls.
fn set_aggregate(programs: &mut Option<Ebpf>, maps: &mut Maps) -> Result<(), Error> {
    let group = [(programs::GROUP_INDEX, programs::GROUP)];
    let wide = (programs::WIDE_BASE..).zip(programs::WIDE);
    for (index, name) in (0u32..).zip(programs::AGGREGATE).chain(group).chain(wide) {
        let fd = program_fd(programs, name)?;
        let mut array: ProgramArray<&mut MapData> = map_mut(maps, names::AGGREGATE)?;
        array.set(index, &fd, 0).map_err(|source| Error::Map {
            name: names::AGGREGATE,
            what: format!("entry {index} ({name})"),
            source,
        })?;
    }
    Ok(())
}

/// The kernel ids of the programs pinned under `dir`, by name.
pub fn pinned_program_ids(dir: &PinDir) -> BTreeMap<&'static str, u32> {
    pin::PROGRAMS
        .iter()
        .filter_map(|name| {
            let info = aya::programs::ProgramInfo::from_pin(dir.prog(name)).ok()?;
            Some((*name, info.id()))
        })
        .collect()
}

/// What [`Dataplane::upgrade`] replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// Pinned program ids before and after.
    pub before: BTreeMap<&'static str, u32>,
    pub after: BTreeMap<&'static str, u32>,
    /// The ports now running the new switch program.
    pub ports: Vec<String>,
}

/// The fan-out program as a direct-action filter of the port's clsact
/// qdisc (added if missing), for kernels without TCX. A pinned switch's
/// filter outlives this process (the qdisc holds the program).
fn attach_fanout_clsact(
    ebpf: &mut Option<Ebpf>,
    ifname: &str,
    pinned: bool,
) -> Result<FanoutLink, Error> {
    let err = |what, source| Error::Program {
        name: programs::FANOUT,
        what,
        source,
    };
    match aya::programs::tc::qdisc_add_clsact(ifname) {
        Ok(()) | Err(aya::programs::tc::TcError::AlreadyAttached) => {}
        Err(e) => {
            return Err(err(
                "adding a clsact qdisc",
                ProgramError::IOError(std::io::Error::other(e)),
            ));
        }
    }
    // A filter left by a switch that was not brought down cleanly.
    let _ = pin::detach_fanout_filter(ifname);
    let prog = tc_mut(ebpf)?;
    let id = prog
        .attach_with_options(
            ifname,
            TcAttachType::Ingress,
            TcAttachOptions::Netlink(NlOptions {
                priority: FANOUT_TC_PRIORITY,
                ..NlOptions::default()
            }),
        )
        .map_err(|e| err("attach (clsact ingress)", e))?;
    if !pinned {
        return Ok(FanoutLink::Owned(id));
    }
    let link = prog
        .take_link(id)
        .map_err(|e| err("attach (clsact ingress)", e))?;
    // Dropping the link would remove the filter; the switch keeps it.
    std::mem::forget(link);
    Ok(FanoutLink::Clsact(ifname.to_owned()))
}

/// A clone of the descriptor of loaded program `name`.
fn program_fd(ebpf: &mut Option<Ebpf>, name: &'static str) -> Result<ProgramFd, Error> {
    let fd = xdp_mut(ebpf, name)?.fd().map_err(|source| Error::Program {
        name,
        what: "fd",
        source,
    })?;
    fd.try_clone().map_err(|e| Error::Program {
        name,
        what: "fd",
        source: ProgramError::IOError(e),
    })
}

fn member_value(m: &MemberSpec, ports: &[Port]) -> Member {
    let port_index = ports
        .iter()
        .find(|p| p.ifindex == m.ifindex)
        .map_or(NO_PORT_INDEX, |p| p.index);
    Member {
        ip: m.ip.octets(),
        port: m.udp_port.to_be_bytes(),
        mac: m.mac,
        port_mac: m.port_mac,
        flags: if m.sender { member_flags::SENDER } else { 0 }
            | if m.down { member_flags::DOWN } else { 0 },
        _pad: 0,
        ifindex: m.ifindex,
        rank: u32::from(m.rank),
        port_index,
    }
}

fn run(
    prog: &mut Xdp,
    name: &'static str,
    frame: &[u8],
    ingress_ifindex: u32,
) -> Result<TestOutput, Error> {
    run_timed(prog, name, frame, ingress_ifindex, 1).map(|(out, _)| out)
}

fn run_timed(
    prog: &mut Xdp,
    name: &'static str,
    frame: &[u8],
    ingress_ifindex: u32,
    repeat: u32,
) -> Result<(TestOutput, std::time::Duration), Error> {
    // `struct xdp_md`: data, data_end, data_meta, ingress_ifindex,
    // rx_queue_index, egress_ifindex. The kernel wants data_end = frame length.
    let mut ctx = [0u8; 24];
    let len = u32::try_from(frame.len()).expect("frames are small");
    ctx[4..8].copy_from_slice(&len.to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    // Room for a frame that grows (it does not today), and for metadata.
    let mut out = vec![0u8; frame.len() + 256];
    let mut ctx_out = [0u8; 24];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    opts.ctx_in = Some(&ctx);
    opts.ctx_out = Some(&mut ctx_out);
    opts.repeat = repeat.max(1);
    let result = prog
        .test_run(opts)
        .map_err(|source| Error::TestRun { name, source })?;
    out.truncate(result.data_size_out as usize);
    // The output starts with the metadata the program left; `ctx_out.data`
    // is its length.
    let meta_len = u32::from_ne_bytes(ctx_out[0..4].try_into().expect("4 bytes")) as usize;
    let frame = out.split_off(meta_len.min(out.len()));
    Ok((
        TestOutput {
            action: result.return_value,
            frame,
            meta: out,
        },
        result.duration,
    ))
}

/// The fan-out program.
fn tc_mut(ebpf: &mut Option<Ebpf>) -> Result<&mut SchedClassifier, Error> {
    let name = programs::FANOUT;
    ebpf.as_mut()
        .ok_or(Error::NotLoadedHere(name))?
        .program_mut(name)
        .ok_or(Error::MissingProgram(name))?
        .try_into()
        .map_err(|source| Error::Program {
            name,
            what: "type",
            source,
        })
}

fn xdp_mut<'a>(ebpf: &'a mut Option<Ebpf>, name: &'static str) -> Result<&'a mut Xdp, Error> {
    ebpf.as_mut()
        .ok_or(Error::NotLoadedHere(name))?
        .program_mut(name)
        .ok_or(Error::MissingProgram(name))?
        .try_into()
        .map_err(|source| Error::Program {
            name,
            what: "not an XDP program",
            source,
        })
}

fn map_mut<'a, T>(maps: &'a mut Maps, name: &'static str) -> Result<T, Error>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = maps.get_mut(name).ok_or(Error::MissingMap(name))?;
    T::try_from(map).map_err(|source| Error::Map {
        name,
        what: "type".to_owned(),
        source,
    })
}

fn map_ref<'a, T>(maps: &'a Maps, name: &'static str) -> Result<T, Error>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = maps.get(name).ok_or(Error::MissingMap(name))?;
    T::try_from(map).map_err(|source| Error::Map {
        name,
        what: "type".to_owned(),
        source,
    })
}

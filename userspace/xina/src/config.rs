//! The switch configuration file (TOML): ports, slot pool, jobs and groups.
//!
//! ```toml
//! [switch]
//! ports = ["sp0", "sp1", "sp2"] # interfaces that become switch ports
//! slot_pool = 4096            # aggregator slots (2 x 2,928 bytes each)
//! units = 32768               # wide-path memory in 1 KiB units (jobs above 360 i32 per packet)
//! xdp_mode = "auto"           # auto | native | generic
//!
//! [[jobs]]
//! id = 7
//! op = "sum"                  # sum | max | min
//! dtype = "i32"               # i32 | i64
//! mode = "allreduce"          # allreduce | reduce | reduce-scatter
//! elems_per_packet = 256      # 1..=16128 (i32), 1..=8064 (i64), within every member port's MTU;
//!                             # above 360 / 180 (the wide path): allreduce only
//! slot_base = 0               # the job's private slot range in the pool
//! slot_count = 64             # = the workers' window of chunks in flight
//!
//! [[jobs.members]]
//! rank = 0
//! ip = "10.77.0.1"
//! port = 5000                 # the worker's UDP port
//! mac = "02:00:00:00:00:01"
//! interface = "sp0"           # the switch port the worker sits behind
//!
//! [[jobs]]                    # a group: same id space and slot pool as jobs
//! id = 8
//! mode = "multicast"          # multicast | anycast
//! bytes_per_packet = 1440     # most payload bytes per packet: 1..=1440 (the default)
//! window = 4                  # multicast: chunks in flight per sender; takes window x members slots
//! slot_base = 64              # multicast: where those slots start (anycast groups use none)
//!
//! [[jobs.members]]
//! rank = 0
//! ip = "10.77.0.1"
//! port = 6000
//! mac = "02:00:00:00:00:01"
//! interface = "sp0"
//! sender = true               # groups: the member may send to the group
//! # down = true               # anycast: the member receives nothing new
//! ```
//!
//! [`Config::parse`] checks the whole file before anything touches the
//! dataplane and names the offending field in its error; [`Config::resolve`]
//! then looks the interfaces up.

use std::{collections::HashSet, fmt, net::Ipv4Addr};

use serde::Deserialize;
use xina_proto::{DType, MAX_RANKS, Op, maps::MAX_PORTS};

use crate::dataplane::{JobSpec, MemberSpec, Mode};

/// Largest slot pool accepted: 262,144 slots are 553 MB of kernel memory.
pub const MAX_SLOT_POOL: u32 = 1 << 18;

/// A configuration error, naming the field (`jobs[0].members[2].mac`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

/// How XDP is attached to the ports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpModeName {
    /// Native where the driver supports it, generic otherwise.
    #[default]
    Auto,
    Native,
    Generic,
}

/// The `[switch]` section.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    pub ports: Vec<String>,
    #[serde(default = "default_slot_pool")]
    pub slot_pool: u32,
    /// Units (1 KiB) of the wide path's memory.
    #[serde(default = "default_units")]
    pub units: u32,
    #[serde(default)]
    pub xdp_mode: XdpModeName,
    /// Log chunk completions from the dataplane (slow; for debugging).
    #[serde(default)]
    pub debug: bool,
}

fn default_slot_pool() -> u32 {
    xina_proto::maps::DEFAULT_SLOT_POOL
}

fn default_units() -> u32 {
    xina_proto::maps::DEFAULT_UNITS
}

/// Most units of wide-path memory a switch may have (1 GiB).
pub const MAX_UNITS: u32 = 1 << 20;

/// A checked job or group of a configuration (a `[[jobs]]` entry) or of a
/// job file, with every default filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: u32,
    /// [`Op::Sum`] for groups.
    pub op: Op,
    /// [`DType::Bytes`] for groups.
    pub dtype: DType,
    pub mode: Mode,
    /// Elements per packet; for groups the most payload bytes per packet.
    pub elems_per_packet: u16,
    pub slot_base: u32,
    /// Slots taken from the pool: window × members for a multicast group,
    /// 0 for an anycast group.
    pub slot_count: u32,
    pub members: Vec<Member>,
}

impl Job {
    /// A multicast group's window: chunks in flight per sender.
    pub fn window(&self) -> Option<u32> {
        let n = u32::try_from(self.members.len()).ok().filter(|n| *n > 0)?;
        (self.mode == Mode::Multicast).then(|| self.slot_count / n)
    }
}

/// `op = "sum" | "max" | "min"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpName {
    #[default]
    Sum,
    Max,
    Min,
}

impl From<OpName> for Op {
    fn from(o: OpName) -> Self {
        match o {
            OpName::Sum => Self::Sum,
            OpName::Max => Self::Max,
            OpName::Min => Self::Min,
        }
    }
}

/// `dtype = "i32" | "i64"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeName {
    #[default]
    I32,
    I64,
}

impl From<DTypeName> for DType {
    fn from(d: DTypeName) -> Self {
        match d {
            DTypeName::I32 => Self::I32,
            DTypeName::I64 => Self::I64,
        }
    }
}

/// `mode = "allreduce" | "reduce" | "reduce-scatter" | "multicast" | "anycast"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeName {
    #[default]
    Allreduce,
    Reduce,
    ReduceScatter,
    Multicast,
    Anycast,
}

impl From<ModeName> for Mode {
    fn from(m: ModeName) -> Self {
        match m {
            ModeName::Allreduce => Self::Allreduce,
            ModeName::Reduce => Self::Reduce,
            ModeName::ReduceScatter => Self::ReduceScatter,
            ModeName::Multicast => Self::Multicast,
            ModeName::Anycast => Self::Anycast,
        }
    }
}

/// A member of a checked [`Job`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub rank: u8,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub mac: String,
    pub interface: String,
    /// Groups: the member may send to the group.
    pub sender: bool,
    /// Anycast groups: the member is down and receives nothing new.
    pub down: bool,
}

/// A whole, checked configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub switch: Switch,
    pub jobs: Vec<Job>,
}

/// The file as written, before [`Config::parse`] checks it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    switch: Switch,
    /// In the job file format, with the slot range and MACs given.
    #[serde(default)]
    jobs: Vec<JobFile>,
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut out {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Whether slot ranges `a` and `b` (`(base, count)`) share a slot; an
/// empty range shares none.
pub fn overlap(a: (u32, u32), b: (u32, u32)) -> bool {
    let end = |(base, count): (u32, u32)| u64::from(base) + u64::from(count);
    a.1 > 0 && b.1 > 0 && u64::from(a.0) < end(b) && u64::from(b.0) < end(a)
}

impl Config {
    /// Parses and checks a configuration file's text.
    ///
    /// # Errors
    /// The first problem found, naming its field.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        let sw = file.switch;
        check_switch(&sw)?;
        let mut ids = HashSet::new();
        let mut jobs: Vec<Job> = Vec::with_capacity(file.jobs.len());
        for (j, entry) in file.jobs.iter().enumerate() {
            let prefix = format!("jobs[{j}].");
            if !ids.insert(entry.id) {
                return Err(err(
                    format!("{prefix}id"),
                    format!("job {} is defined twice", entry.id),
                ));
            }
            let slot_base = match (entry.mode, entry.slot_base) {
                (ModeName::Anycast, _) | (_, Some(_)) => entry.slot_base.unwrap_or(0),
                (_, None) => {
                    return Err(err(
                        format!("{prefix}slot_base"),
                        "missing (a job in the switch file gives its slot range)",
                    ));
                }
            };
            let job = entry.check_at(&prefix, slot_base, &sw.ports, sw.slot_pool, None)?;
            let end = u64::from(job.slot_base) + u64::from(job.slot_count);
            for (k, other) in jobs.iter().enumerate() {
                if overlap(
                    (job.slot_base, job.slot_count),
                    (other.slot_base, other.slot_count),
                ) {
                    return Err(err(
                        format!("{prefix}slot_base"),
                        format!(
                            "slots {}..{end} overlap jobs[{k}] (job {}) slots {}..{}",
                            job.slot_base,
                            other.id,
                            other.slot_base,
                            other.slot_base + other.slot_count
                        ),
                    ));
                }
            }
            jobs.push(job);
        }
        Ok(Self { switch: sw, jobs })
    }

    /// Turns the jobs into dataplane specs, looking up each member's switch
    /// port with `lookup(name) -> (ifindex, mac)`.
    ///
    /// # Errors
    /// An interface that `lookup` cannot find.
    pub fn resolve(
        &self,
        mut lookup: impl FnMut(&str) -> Option<(u32, [u8; 6])>,
    ) -> Result<Vec<JobSpec>, ConfigError> {
        self.jobs
            .iter()
            .enumerate()
            .map(|(j, job)| job.resolve(&format!("jobs[{j}]."), &mut lookup))
            .collect()
    }
}

fn check_switch(sw: &Switch) -> Result<(), ConfigError> {
    if sw.ports.is_empty() {
        return Err(err(
            "switch.ports",
            "no ports: list the interfaces that form the switch",
        ));
    }
    if sw.ports.len() > MAX_PORTS as usize {
        return Err(err(
            "switch.ports",
            format!("{} ports (at most {MAX_PORTS})", sw.ports.len()),
        ));
    }
    let mut seen = HashSet::new();
    for (i, p) in sw.ports.iter().enumerate() {
        if p.is_empty() || p.len() >= libc::IFNAMSIZ || p.contains(['/', ' ']) {
            return Err(err(
                format!("switch.ports[{i}]"),
                format!("{p:?} is not an interface name"),
            ));
        }
        if !seen.insert(p) {
            return Err(err(
                format!("switch.ports[{i}]"),
                format!("port {p} is listed twice"),
            ));
        }
    }
    if sw.slot_pool == 0 || sw.slot_pool > MAX_SLOT_POOL {
        return Err(err(
            "switch.slot_pool",
            format!("{} (must be 1..={MAX_SLOT_POOL})", sw.slot_pool),
        ));
    }
    if sw.units == 0 || sw.units > MAX_UNITS {
        return Err(err(
            "switch.units",
            format!("{} (must be 1..={MAX_UNITS})", sw.units),
        ));
    }
    Ok(())
}

impl Job {
    /// This (checked) job as a dataplane spec, looking up each member's
    /// switch port with `lookup(name) -> (ifindex, mac)`; `prefix` starts
    /// the field name in errors.
    ///
    /// # Errors
    /// An interface that `lookup` cannot find.
    pub fn resolve(
        &self,
        prefix: &str,
        mut lookup: impl FnMut(&str) -> Option<(u32, [u8; 6])>,
    ) -> Result<JobSpec, ConfigError> {
        let job = self;
        let mut members = Vec::with_capacity(job.members.len());
        for (m, member) in job.members.iter().enumerate() {
            let (ifindex, port_mac) = lookup(&member.interface).ok_or_else(|| {
                err(
                    format!("{prefix}members[{m}].interface"),
                    format!("interface {} does not exist", member.interface),
                )
            })?;
            members.push(MemberSpec {
                rank: member.rank,
                ip: member.ip,
                udp_port: member.port,
                mac: parse_mac(&member.mac).expect("checked by parse"),
                ifindex,
                port_mac,
                sender: member.sender,
                down: member.down,
            });
        }
        members.sort_by_key(|m| m.rank);
        Ok(JobSpec {
            id: job.id,
            op: job.op,
            dtype: job.dtype,
            mode: job.mode,
            elems_per_packet: job.elems_per_packet,
            slot_base: job.slot_base,
            slot_count: job.slot_count,
            members,
        })
    }
}

/// Maps a TOML parse error to a [`ConfigError`] naming the line and key.
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim().to_owned();
    let field = e.span().map_or_else(
        || "file".to_owned(),
        |span| {
            // toml points at the offending value; name its key too.
            let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
            let line_no = text[..start].matches('\n').count() + 1;
            let line = text[start..].lines().next().unwrap_or("");
            match line.split_once('=') {
                Some((key, _)) => format!("line {line_no} ({})", key.trim()),
                None => format!("line {line_no}"),
            }
        },
    );
    err(field, message)
}

/// A job file, as `xina job add FILE` reads it: one job or group, whose
/// slot range the control plane allocates (unless `slot_base` pins it) and
/// whose members' MACs may be left to the neighbour table. The switch
/// file's `[[jobs]]` entries have the same keys.
///
/// ```toml
/// id = 7
/// op = "sum"                  # sum | max | min
/// dtype = "i32"               # i32 | i64
/// mode = "allreduce"          # allreduce | reduce | reduce-scatter
/// elems_per_packet = 256      # 1..=16128 (i32), 1..=8064 (i64), and within every member port's MTU
/// slot_count = 64             # slots to allocate = the workers' window
/// # slot_base = 128           # optional: this exact range instead of the first free one
///
/// [[members]]
/// rank = 0
/// ip = "10.77.0.1"
/// port = 5000                 # the worker's UDP port
/// mac = "02:00:00:00:00:01"   # optional: looked up in the neighbour table when omitted
/// interface = "sp0"           # the switch port the worker sits behind
/// ```
///
/// A group has `mode = "multicast"` or `"anycast"`, `bytes_per_packet`
/// (1..=1440, default 1440) instead of `op`, `dtype` and
/// `elems_per_packet`, and members with `sender = true` (may send) and, in
/// an anycast group, `down = true` (receives nothing new). A multicast group
/// has `window` (chunks in flight per sender) instead of `slot_count` and
/// takes window × members slots; an anycast group takes no slots.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub id: u32,
    pub op: Option<OpName>,
    pub dtype: Option<DTypeName>,
    #[serde(default)]
    pub mode: ModeName,
    pub elems_per_packet: Option<u16>,
    pub bytes_per_packet: Option<u16>,
    pub window: Option<u32>,
    pub slot_count: Option<u32>,
    pub slot_base: Option<u32>,
    pub members: Vec<JobMember>,
}

/// A `[[members]]` entry of a [`JobFile`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobMember {
    pub rank: u8,
    pub ip: Ipv4Addr,
    pub port: u16,
    #[serde(default)]
    pub mac: Option<String>,
    pub interface: String,
    pub sender: Option<bool>,
    pub down: Option<bool>,
}

/// The shape of an entry, from its mode-dependent keys.
struct Shape {
    op: Op,
    dtype: DType,
    mode: Mode,
    elems_per_packet: u16,
}

/// Where a member's omitted MAC comes from: the neighbour table (job
/// files), or nowhere (the switch file).
type Neighbour<'a> = Option<&'a mut dyn FnMut(Ipv4Addr, &str) -> Option<[u8; 6]>>;

impl JobFile {
    /// Parses a job file's text (syntax and field types only: the job is
    /// checked against a switch by [`Self::check`]).
    ///
    /// # Errors
    /// The first problem found, naming its line and key.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| toml_error(text, &e))
    }

    /// How many slots the entry takes from the pool: `slot_count` for a
    /// job, window × members for a multicast group, none for an anycast
    /// group (0 where the key is missing: [`Self::check`] says so).
    pub fn slots(&self) -> u32 {
        match self.mode {
            ModeName::Multicast => {
                let n = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
                self.window.unwrap_or(0).saturating_mul(n)
            }
            ModeName::Anycast => 0,
            _ => self.slot_count.unwrap_or(0),
        }
    }

    /// The key that sets [`Self::slots`]: `window` for a multicast group,
    /// `slot_count` otherwise.
    pub fn slots_field(&self) -> &'static str {
        if self.mode == ModeName::Multicast {
            "window"
        } else {
            "slot_count"
        }
    }

    /// Checks the keys that depend on the mode: which of them a job or a
    /// group may have, and those it must have (no slot or member checks;
    /// [`Self::check`] does them all).
    ///
    /// # Errors
    /// The first problem found; `prefix` starts the field name.
    pub fn check_keys(&self, prefix: &str) -> Result<(), ConfigError> {
        self.shape(prefix).map(drop)
    }

    fn shape(&self, prefix: &str) -> Result<Shape, ConfigError> {
        let at = |f: &str| format!("{prefix}{f}");
        let mode = Mode::from(self.mode);
        let name = mode.name();
        if !mode.is_group() {
            let dtype = DType::from(self.dtype.unwrap_or_default());
            let not_here = |f: &str, hint: &str| {
                err(
                    at(f),
                    format!(
                        "only for groups (mode multicast or anycast), not for a job (mode {name}){hint}"
                    ),
                )
            };
            if self.bytes_per_packet.is_some() {
                return Err(not_here("bytes_per_packet", ", which has elems_per_packet"));
            }
            if self.window.is_some() {
                return Err(not_here("window", ", which has slot_count"));
            }
            for (m, member) in self.members.iter().enumerate() {
                if member.sender.is_some() {
                    return Err(not_here(&format!("members[{m}].sender"), ""));
                }
                if member.down.is_some() {
                    return Err(not_here(&format!("members[{m}].down"), ""));
                }
            }
            let elems = self.elems_per_packet.ok_or_else(|| {
                err(
                    at("elems_per_packet"),
                    "missing (a job needs elements per packet)",
                )
            })?;
            let max = dtype.max_elems();
            if elems == 0 || usize::from(elems) > max {
                return Err(err(
                    at("elems_per_packet"),
                    format!(
                        "{elems} (must be 1..={max} for {dtype:?}: {} payload bytes; the ports' MTUs may allow fewer)",
                        xina_proto::MAX_FRAME_PAYLOAD
                    ),
                ));
            }
            if xina_proto::frame::is_wide(dtype, usize::from(elems)) && mode != Mode::Allreduce {
                return Err(err(
                    at("elems_per_packet"),
                    format!(
                        "{elems}: above {} {dtype:?} per packet (one 1,500-byte frame) only allreduce \
                         jobs are supported; a {} job must stay within it",
                        dtype.narrow_elems(),
                        mode.name()
                    ),
                ));
            }
            match self.slot_count {
                None => {
                    return Err(err(
                        at("slot_count"),
                        "missing (a job needs slots: the workers' window)",
                    ));
                }
                Some(0) => return Err(err(at("slot_count"), "0 (a job needs at least one slot)")),
                Some(_) => {}
            }
            return Ok(Shape {
                op: self.op.unwrap_or_default().into(),
                dtype,
                mode,
                elems_per_packet: elems,
            });
        }
        let not_for_groups = |f: &str, why: &str| err(at(f), format!("not for groups ({why})"));
        if self.op.is_some() {
            return Err(not_for_groups(
                "op",
                "a group forwards bytes, it combines nothing",
            ));
        }
        if self.dtype.is_some() {
            return Err(not_for_groups("dtype", "a group carries bytes"));
        }
        if self.elems_per_packet.is_some() {
            return Err(not_for_groups(
                "elems_per_packet",
                "a group has bytes_per_packet",
            ));
        }
        if self.slot_count.is_some() {
            return Err(not_for_groups(
                "slot_count",
                "a multicast group has window and takes window x members slots; \
                 an anycast group takes none",
            ));
        }
        let max = DType::Bytes.max_elems();
        let bytes = self
            .bytes_per_packet
            .unwrap_or(u16::try_from(max).expect("a payload fits a 1500-byte MTU"));
        if bytes == 0 || usize::from(bytes) > max {
            return Err(err(
                at("bytes_per_packet"),
                format!("{bytes} (must be 1..={max}, so a packet fits a 1500-byte MTU)"),
            ));
        }
        if mode == Mode::Multicast {
            match self.window {
                None => {
                    return Err(err(
                        at("window"),
                        "missing (a multicast group needs its window: chunks in flight per sender)",
                    ));
                }
                Some(0) => {
                    return Err(err(at("window"), "0 (a sender needs at least one slot)"));
                }
                Some(_) => {}
            }
            if let Some(m) = self.members.iter().position(|m| m.down.is_some()) {
                return Err(err(
                    at(&format!("members[{m}].down")),
                    "only for anycast group members (every multicast member receives)",
                ));
            }
        } else {
            if self.window.is_some() {
                return Err(err(
                    at("window"),
                    "only for multicast groups (an anycast group takes no slots)",
                ));
            }
            if self.slot_base.is_some() {
                return Err(err(
                    at("slot_base"),
                    "not for anycast groups (they take no slots)",
                ));
            }
        }
        Ok(Shape {
            op: Op::Sum,
            dtype: DType::Bytes,
            mode,
            elems_per_packet: bytes,
        })
    }

    /// The job or group with slot range starting at `slot_base` (ignored
    /// for an anycast group, which has none) and each member's MAC given or
    /// found by `neighbour(ip, interface)`, checked against a switch with
    /// `ports` and a pool of `slot_pool` slots. Field names in errors are
    /// the file's (`members[1].rank`).
    ///
    /// # Errors
    /// The first problem found.
    pub fn check(
        &self,
        slot_base: u32,
        ports: &[String],
        slot_pool: u32,
        mut neighbour: impl FnMut(Ipv4Addr, &str) -> Option<[u8; 6]>,
    ) -> Result<Job, ConfigError> {
        self.check_at("", slot_base, ports, slot_pool, Some(&mut neighbour))
    }

    /// [`Self::check`] with field names starting with `prefix`; without
    /// `neighbour`, every member must give its MAC.
    fn check_at(
        &self,
        prefix: &str,
        slot_base: u32,
        ports: &[String],
        slot_pool: u32,
        mut neighbour: Neighbour<'_>,
    ) -> Result<Job, ConfigError> {
        let shape = self.shape(prefix)?;
        let mut members = Vec::with_capacity(self.members.len());
        for (m, member) in self.members.iter().enumerate() {
            let at = format!("{prefix}members[{m}].mac");
            let mac = match (&member.mac, neighbour.as_mut()) {
                (Some(mac), _) => mac.clone(),
                (None, _) if !ports.contains(&member.interface) => String::new(),
                (None, None) => {
                    return Err(err(
                        at,
                        "missing (the switch file gives every member's MAC)",
                    ));
                }
                (None, Some(neighbour)) => Mac(neighbour(member.ip, &member.interface)
                    .ok_or_else(|| {
                        err(
                            at,
                            format!(
                                "omitted, and {} has no entry in the neighbour table of {} \
                                 (give the MAC, or let the switch host reach the worker first)",
                                member.ip, member.interface
                            ),
                        )
                    })?)
                .to_string(),
            };
            members.push(Member {
                rank: member.rank,
                ip: member.ip,
                port: member.port,
                mac,
                interface: member.interface.clone(),
                sender: member.sender.unwrap_or(false),
                down: member.down.unwrap_or(false),
            });
        }
        let job = Job {
            id: self.id,
            op: shape.op,
            dtype: shape.dtype,
            mode: shape.mode,
            elems_per_packet: shape.elems_per_packet,
            slot_base: if shape.mode == Mode::Anycast {
                0
            } else {
                slot_base
            },
            slot_count: self.slots(),
            members,
        };
        check_job(prefix, &job, self.slots_field(), ports, slot_pool)?;
        Ok(job)
    }
}

/// Checks one job's slot range and members against the switch's ports and
/// pool; `prefix` starts every field name (`jobs[0].`), `slots_field`
/// names the key that set the slot count.
fn check_job(
    prefix: &str,
    job: &Job,
    slots_field: &str,
    switch_ports: &[String],
    slot_pool: u32,
) -> Result<(), ConfigError> {
    let at = |f: &str| format!("{prefix}{f}");
    let end = u64::from(job.slot_base) + u64::from(job.slot_count);
    if end > u64::from(slot_pool) {
        let what = match job.window() {
            Some(w) => format!("{w} x {} members take slots", job.members.len()),
            None => "slots".to_owned(),
        };
        return Err(err(
            at(slots_field),
            format!(
                "{what} {}..{end} do not fit the pool of {slot_pool} slots",
                job.slot_base
            ),
        ));
    }
    let n = job.members.len();
    if n == 0 || n > MAX_RANKS {
        return Err(err(
            at("members"),
            format!("{n} members (must be 1..={MAX_RANKS}: the rank bitmap has 64 bits)"),
        ));
    }
    let mut ranks = HashSet::new();
    let mut addrs = HashSet::new();
    let mut ports = HashSet::new();
    for (m, member) in job.members.iter().enumerate() {
        let at = |f: &str| format!("{prefix}members[{m}].{f}");
        if usize::from(member.rank) >= n {
            return Err(err(
                at("rank"),
                format!(
                    "rank {} outside 0..{n} (ranks number the members)",
                    member.rank
                ),
            ));
        }
        if !ranks.insert(member.rank) {
            return Err(err(at("rank"), format!("duplicate rank {}", member.rank)));
        }
        if parse_mac(&member.mac).is_none() {
            return Err(err(
                at("mac"),
                format!("{:?} is not a MAC address (aa:bb:cc:dd:ee:ff)", member.mac),
            ));
        }
        if member.ip.is_unspecified() || member.ip.is_broadcast() || member.ip.is_multicast() {
            return Err(err(
                at("ip"),
                format!("{} is not a unicast address", member.ip),
            ));
        }
        if member.port == 0 {
            return Err(err(at("port"), "0 is not a UDP port a worker can use"));
        }
        if !addrs.insert((member.ip, member.port)) {
            return Err(err(
                at("port"),
                format!("{}:{} is used by another member", member.ip, member.port),
            ));
        }
        if !switch_ports.contains(&member.interface) {
            return Err(err(
                at("interface"),
                format!("{} is not a port of this switch", member.interface),
            ));
        }
        if !ports.insert(&member.interface) {
            return Err(err(
                at("interface"),
                format!(
                    "{} already has a member of this job (one member per port and job)",
                    member.interface
                ),
            ));
        }
    }
    if job.mode.is_group() {
        let name = if job.mode == Mode::Multicast {
            "a multicast"
        } else {
            "an anycast"
        };
        if job.mode == Mode::Multicast && n < 2 {
            return Err(err(
                at("members"),
                format!("{n} member ({name} group needs at least 2: a sender and a receiver)"),
            ));
        }
        if !job.members.iter().any(|m| m.sender) {
            return Err(err(
                at("members"),
                format!("no sender ({name} group needs a member with sender = true)"),
            ));
        }
        // In a multicast group senders receive each other's chunks; in an
        // anycast group they never receive.
        if job.mode == Mode::Anycast && !job.members.iter().any(|m| !m.sender && !m.down) {
            return Err(err(
                at("members"),
                "no receiver: every member is a sender or down (an anycast group needs a member \
                 that is up and not a sender; senders never receive)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[switch]
ports = ["sp0", "sp1"]
slot_pool = 128

[[jobs]]
id = 7
elems_per_packet = 256
slot_base = 0
slot_count = 64

[[jobs.members]]
rank = 1
ip = "10.77.0.2"
port = 5000
mac = "02:00:00:00:00:02"
interface = "sp1"

[[jobs.members]]
rank = 0
ip = "10.77.0.1"
port = 5000
mac = "02:00:00:00:00:01"
interface = "sp0"
"#;

    #[test]
    fn good_file_parses_and_resolves() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.switch.xdp_mode, XdpModeName::Auto);
        let jobs = c
            .resolve(|name| Some((if name == "sp0" { 10 } else { 11 }, [2, 0, 0, 0, 0xee, 0])))
            .unwrap();
        assert_eq!(jobs[0].members[0].rank, 0, "members are sorted by rank");
        assert_eq!(jobs[0].members[0].ifindex, 10);
        assert_eq!(jobs[0].members[1].mac, [2, 0, 0, 0, 0, 2]);
        let e = c.resolve(|_| None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "jobs[0].members[0].interface: interface sp1 does not exist"
        );
    }

    /// Each broken file is rejected with a message naming the field.
    #[test]
    fn bad_files_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "ports = [\"sp0\", \"sp1\"]",
                "ports = []",
                "switch.ports: no ports",
            ),
            (
                "ports = [\"sp0\", \"sp1\"]",
                "ports = [\"sp0\", \"sp0\"]",
                "switch.ports[1]: port sp0 is listed twice",
            ),
            (
                "ports = [\"sp0\", \"sp1\"]",
                "ports = [\"sp0\", \"a-very-long-interface\"]",
                "switch.ports[1]:",
            ),
            ("slot_pool = 128", "slot_pool = 0", "switch.slot_pool: 0"),
            (
                "slot_count = 64",
                "slot_count = 200",
                "jobs[0].slot_count: slots 0..200 do not fit the pool of 128",
            ),
            ("slot_count = 64", "slot_count = 0", "jobs[0].slot_count: 0"),
            (
                "elems_per_packet = 256",
                "elems_per_packet = 16129",
                "jobs[0].elems_per_packet: 16129 (must be 1..=16128 for I32",
            ),
            (
                "elems_per_packet = 256",
                "elems_per_packet = 361\nmode = \"reduce\"",
                "jobs[0].elems_per_packet: 361: above 360 I32 per packet (one 1,500-byte frame) only allreduce",
            ),
            (
                "elems_per_packet = 256",
                "elems_per_packet = 0",
                "jobs[0].elems_per_packet: 0",
            ),
            (
                "rank = 1",
                "rank = 0",
                "jobs[0].members[1].rank: duplicate rank 0",
            ),
            (
                "rank = 1",
                "rank = 2",
                "jobs[0].members[0].rank: rank 2 outside 0..2",
            ),
            (
                "mac = \"02:00:00:00:00:02\"",
                "mac = \"02:00:00:00:00\"",
                "jobs[0].members[0].mac:",
            ),
            (
                "interface = \"sp1\"",
                "interface = \"sp9\"",
                "jobs[0].members[0].interface: sp9 is not a port of this switch",
            ),
            (
                "interface = \"sp1\"",
                "interface = \"sp0\"",
                "jobs[0].members[1].interface: sp0 already has a member",
            ),
            (
                "ip = \"10.77.0.2\"",
                "ip = \"10.77.0.1\"",
                "jobs[0].members[1].port: 10.77.0.1:5000 is used by another member",
            ),
            (
                "ip = \"10.77.0.2\"",
                "ip = \"10.77.0\"",
                "line 14 (ip): invalid IPv4 address",
            ),
            (
                "id = 7",
                "id = 7\nop = \"avg\"",
                "(op): unknown variant `avg`, expected one of `sum`, `max`, `min`",
            ),
            (
                "id = 7",
                "id = 7\nmode = \"gather\"",
                "(mode): unknown variant `gather`, expected one of `allreduce`, `reduce`, `reduce-scatter`",
            ),
            (
                "id = 7",
                "id = 7\ndtype = \"f16\"",
                "(dtype): unknown variant `f16`",
            ),
            (
                "elems_per_packet = 256",
                "elems_per_packet = 8065\ndtype = \"i64\"",
                "jobs[0].elems_per_packet: 8065 (must be 1..=8064 for I64",
            ),
            ("id = 7", "id = 7\ncolour = 3", "unknown field `colour`"),
            (
                "port = 5000\nmac = \"02:00:00:00:00:02\"",
                "port = 0\nmac = \"02:00:00:00:00:02\"",
                "jobs[0].members[0].port: 0",
            ),
            (
                "elems_per_packet = 256\n",
                "",
                "jobs[0].elems_per_packet: missing (a job needs elements per packet)",
            ),
            (
                "slot_count = 64\n",
                "",
                "jobs[0].slot_count: missing (a job needs slots",
            ),
            (
                "slot_base = 0\n",
                "",
                "jobs[0].slot_base: missing (a job in the switch file gives its slot range)",
            ),
            (
                "mac = \"02:00:00:00:00:02\"\n",
                "",
                "jobs[0].members[0].mac: missing (the switch file gives every member's MAC)",
            ),
            (
                "elems_per_packet = 256",
                "elems_per_packet = 256\nbytes_per_packet = 100",
                "jobs[0].bytes_per_packet: only for groups (mode multicast or anycast), \
                 not for a job (mode allreduce), which has elems_per_packet",
            ),
            (
                "slot_count = 64",
                "slot_count = 64\nwindow = 4\nmode = \"reduce\"",
                "jobs[0].window: only for groups (mode multicast or anycast), not for a job (mode reduce), which has slot_count",
            ),
            (
                "port = 5000\nmac = \"02:00:00:00:00:02\"",
                "port = 5000\nsender = true\nmac = \"02:00:00:00:00:02\"",
                "jobs[0].members[0].sender: only for groups",
            ),
            (
                "port = 5000\nmac = \"02:00:00:00:00:01\"",
                "port = 5000\ndown = false\nmac = \"02:00:00:00:00:01\"",
                "jobs[0].members[1].down: only for groups",
            ),
        ];
        for (from, to, want) in cases {
            assert!(GOOD.contains(from), "case {from:?} does not apply");
            let text = GOOD.replacen(from, to, 1);
            let e = Config::parse(&text).expect_err(to).to_string();
            assert!(e.contains(want), "{to:?}: got {e:?}, want {want:?}");
        }
    }

    /// A job, a multicast group over three ports and an anycast group
    /// whose rank 1 is down.
    const GROUPS: &str = r#"
[switch]
ports = ["sp0", "sp1", "sp2"]
slot_pool = 128

[[jobs]]
id = 7
elems_per_packet = 256
slot_base = 0
slot_count = 64

[[jobs.members]]
rank = 0
ip = "10.77.0.1"
port = 5000
mac = "02:00:00:00:00:01"
interface = "sp0"

[[jobs]]
id = 8
mode = "multicast"
bytes_per_packet = 1000
window = 4
slot_base = 64

[[jobs.members]]
rank = 0
ip = "10.77.0.1"
port = 6000
mac = "02:00:00:00:00:01"
interface = "sp0"
sender = true

[[jobs.members]]
rank = 1
ip = "10.77.0.2"
port = 6001
mac = "02:00:00:00:00:02"
interface = "sp1"

[[jobs.members]]
rank = 2
ip = "10.77.0.3"
port = 6002
mac = "02:00:00:00:00:03"
interface = "sp2"

[[jobs]]
id = 9
mode = "anycast"

[[jobs.members]]
rank = 0
ip = "10.77.0.1"
port = 7000
mac = "02:00:00:00:00:01"
interface = "sp0"
sender = true

[[jobs.members]]
rank = 1
ip = "10.77.0.2"
port = 7001
mac = "02:00:00:00:00:02"
interface = "sp1"
down = true

[[jobs.members]]
rank = 2
ip = "10.77.0.3"
port = 7002
mac = "02:00:00:00:00:03"
interface = "sp2"
"#;

    #[test]
    fn groups_parse_and_resolve() {
        let c = Config::parse(GROUPS).unwrap();
        let (job, mcast, anycast) = (&c.jobs[0], &c.jobs[1], &c.jobs[2]);
        assert_eq!((job.mode, job.window()), (Mode::Allreduce, None));
        assert_eq!(mcast.mode, Mode::Multicast);
        assert_eq!((mcast.op, mcast.dtype), (Op::Sum, DType::Bytes));
        assert_eq!(mcast.elems_per_packet, 1000, "bytes_per_packet");
        assert_eq!((mcast.slot_base, mcast.slot_count), (64, 12), "4 x 3 slots");
        assert_eq!(mcast.window(), Some(4));
        let flags = |j: &Job| -> Vec<(bool, bool)> {
            j.members.iter().map(|m| (m.sender, m.down)).collect()
        };
        assert_eq!(
            flags(mcast),
            [(true, false), (false, false), (false, false)]
        );
        assert_eq!(anycast.mode, Mode::Anycast);
        assert_eq!(anycast.elems_per_packet, 1440, "the default");
        assert_eq!((anycast.slot_base, anycast.slot_count), (0, 0));
        assert_eq!(anycast.window(), None);
        assert_eq!(
            flags(anycast),
            [(true, false), (false, true), (false, false)]
        );
        let specs = c.resolve(|_| Some((10, [2, 0, 0, 0, 0xee, 0]))).unwrap();
        assert_eq!(specs[1].mode, Mode::Multicast);
        assert_eq!(specs[1].dtype, DType::Bytes);
        assert_eq!(specs[1].elems_per_packet, 1000);
        assert_eq!(specs[1].slot_count, 12);
        assert!(specs[2].members[0].sender && !specs[2].members[0].down);
        assert!(!specs[2].members[1].sender && specs[2].members[1].down);
        // A group that fills the pool exactly fits; the anycast group's
        // empty range overlaps nothing.
        Config::parse(&GROUPS.replacen("window = 4", "window = 21", 1)).unwrap();
    }

    /// Each broken group is rejected with a message naming the field; the
    /// edits are applied in order.
    #[test]
    fn bad_groups_name_the_field() {
        const MCAST_1_2: &str = "[[jobs.members]]\nrank = 1\nip = \"10.77.0.2\"\nport = 6001\nmac = \"02:00:00:00:00:02\"\ninterface = \"sp1\"\n\n[[jobs.members]]\nrank = 2\nip = \"10.77.0.3\"\nport = 6002\nmac = \"02:00:00:00:00:03\"\ninterface = \"sp2\"\n";
        const MC: &str = "mode = \"multicast\"";
        const AC: &str = "mode = \"anycast\"";
        let sender = |port: u16| {
            format!(
                "port = {port}\nmac = \"02:00:00:00:00:01\"\ninterface = \"sp0\"\nsender = true"
            )
        };
        let without_sender = |port: u16| sender(port).replace("\nsender = true", "");
        let cases: Vec<(Vec<(String, String)>, &str)> = vec![
            (
                vec![(MC.into(), format!("{MC}\nop = \"sum\""))],
                "jobs[1].op: not for groups (a group forwards bytes, it combines nothing)",
            ),
            (
                vec![(AC.into(), format!("{AC}\ndtype = \"i32\""))],
                "jobs[2].dtype: not for groups (a group carries bytes)",
            ),
            (
                vec![(MC.into(), format!("{MC}\nelems_per_packet = 100"))],
                "jobs[1].elems_per_packet: not for groups (a group has bytes_per_packet)",
            ),
            (
                vec![(MC.into(), format!("{MC}\nslot_count = 12"))],
                "jobs[1].slot_count: not for groups (a multicast group has window",
            ),
            (
                vec![(AC.into(), format!("{AC}\nslot_count = 1"))],
                "jobs[2].slot_count: not for groups",
            ),
            (
                vec![(
                    "bytes_per_packet = 1000".into(),
                    "bytes_per_packet = 0".into(),
                )],
                "jobs[1].bytes_per_packet: 0 (must be 1..=1440, so a packet fits a 1500-byte MTU)",
            ),
            (
                vec![(
                    "bytes_per_packet = 1000".into(),
                    "bytes_per_packet = 1441".into(),
                )],
                "jobs[1].bytes_per_packet: 1441 (must be 1..=1440",
            ),
            (
                vec![(AC.into(), format!("{AC}\nbytes_per_packet = 2000"))],
                "jobs[2].bytes_per_packet: 2000 (must be 1..=1440",
            ),
            (
                vec![("window = 4\n".into(), String::new())],
                "jobs[1].window: missing (a multicast group needs its window",
            ),
            (
                vec![("window = 4".into(), "window = 0".into())],
                "jobs[1].window: 0 (a sender needs at least one slot)",
            ),
            (
                vec![("window = 4".into(), "window = 22".into())],
                "jobs[1].window: 22 x 3 members take slots 64..130 do not fit the pool of 128 slots",
            ),
            (
                vec![("slot_base = 64\n".into(), String::new())],
                "jobs[1].slot_base: missing (a job in the switch file gives its slot range)",
            ),
            (
                vec![("slot_base = 64".into(), "slot_base = 60".into())],
                "jobs[1].slot_base: slots 60..72 overlap jobs[0] (job 7) slots 0..64",
            ),
            (
                vec![(AC.into(), format!("{AC}\nwindow = 2"))],
                "jobs[2].window: only for multicast groups (an anycast group takes no slots)",
            ),
            (
                vec![(AC.into(), format!("{AC}\nslot_base = 100"))],
                "jobs[2].slot_base: not for anycast groups (they take no slots)",
            ),
            (
                vec![("port = 6001".into(), "port = 6001\ndown = true".into())],
                "jobs[1].members[1].down: only for anycast group members",
            ),
            (
                vec![(sender(6000), without_sender(6000))],
                "jobs[1].members: no sender (a multicast group needs a member with sender = true)",
            ),
            (
                vec![(MCAST_1_2.into(), String::new())],
                "jobs[1].members: 1 member (a multicast group needs at least 2",
            ),
            (
                vec![(sender(7000), without_sender(7000))],
                "jobs[2].members: no sender (an anycast group needs a member with sender = true)",
            ),
            (
                // Rank 1 is down already; rank 0 is up but sends.
                vec![("port = 7002".into(), "port = 7002\ndown = true".into())],
                "jobs[2].members: no receiver: every member is a sender or down",
            ),
            (
                vec![("port = 7001".into(), "port = 7001\nsender = \"yes\"".into())],
                "(sender): invalid type: string \"yes\", expected a boolean",
            ),
            (
                vec![("id = 8".into(), "id = 7".into())],
                "jobs[1].id: job 7 is defined twice",
            ),
            (
                vec![(AC.into(), "mode = \"broadcast\"".into())],
                "expected one of `allreduce`, `reduce`, `reduce-scatter`, `multicast`, `anycast`",
            ),
            (
                vec![(
                    "ip = \"10.77.0.3\"\nport = 6002".into(),
                    "ip = \"10.77.0.2\"\nport = 6001".into(),
                )],
                "jobs[1].members[2].port: 10.77.0.2:6001 is used by another member",
            ),
        ];
        for (edits, want) in &cases {
            let mut text = GROUPS.to_owned();
            for (from, to) in edits {
                assert!(text.contains(from.as_str()), "case {want:?}: no {from:?}");
                text = text.replacen(from.as_str(), to, 1);
            }
            let e = Config::parse(&text).expect_err(want).to_string();
            assert!(e.contains(want), "got {e:?}, want {want:?}");
        }
    }

    /// A group's job file: the slots to allocate, the key that sets them,
    /// and the checked group.
    #[test]
    fn group_job_files() {
        let ports = ["sp0".to_owned(), "sp1".to_owned()];
        let mcast = JobFile::parse(
            "id = 3\nmode = \"multicast\"\nwindow = 5\n\
             [[members]]\nrank = 0\nip = \"10.77.0.1\"\nport = 6000\ninterface = \"sp0\"\nsender = true\n\
             [[members]]\nrank = 1\nip = \"10.77.0.2\"\nport = 6000\nmac = \"02:00:00:00:00:02\"\ninterface = \"sp1\"\nsender = true\n",
        )
        .unwrap();
        assert_eq!((mcast.slots(), mcast.slots_field()), (10, "window"));
        let job = mcast
            .check(20, &ports, 64, |_, _| Some([2, 0, 0, 0, 0, 1]))
            .unwrap();
        assert_eq!(
            (job.slot_base, job.slot_count, job.window()),
            (20, 10, Some(5))
        );
        assert_eq!(
            job.members[0].mac, "02:00:00:00:00:01",
            "from the neighbour table"
        );
        assert!(job.members.iter().all(|m| m.sender && !m.down));
        let e = mcast.check(60, &ports, 64, |_, _| None).unwrap_err();
        assert_eq!(e.field, "members[0].mac");
        let e = mcast
            .check(60, &ports, 64, |_, _| Some([2, 0, 0, 0, 0, 1]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "window: 5 x 2 members take slots 60..70 do not fit the pool of 64 slots"
        );

        let anycast = JobFile::parse(
            "id = 4\nmode = \"anycast\"\nbytes_per_packet = 64\n\
             [[members]]\nrank = 0\nip = \"10.77.0.1\"\nport = 6000\nmac = \"02:00:00:00:00:01\"\ninterface = \"sp0\"\nsender = true\ndown = true\n\
             [[members]]\nrank = 1\nip = \"10.77.0.2\"\nport = 6000\nmac = \"02:00:00:00:00:02\"\ninterface = \"sp1\"\n",
        )
        .unwrap();
        assert_eq!((anycast.slots(), anycast.slots_field()), (0, "slot_count"));
        let job = anycast.check(0, &ports, 64, |_, _| None).unwrap();
        assert_eq!((job.slot_base, job.slot_count), (0, 0));
        assert_eq!((job.dtype, job.elems_per_packet), (DType::Bytes, 64));
        assert!(job.members[0].sender && job.members[0].down);
        // The keys alone, before any slot is allocated.
        assert_eq!(
            JobFile::parse("id = 5\nmode = \"anycast\"\nwindow = 1\nmembers = []\n")
                .unwrap()
                .check_keys("")
                .unwrap_err()
                .field,
            "window"
        );
        // One member, up and a sender, is not enough for anycast: senders
        // never receive.
        let one = JobFile::parse(
            "id = 6\nmode = \"anycast\"\n[[members]]\nrank = 0\nip = \"10.77.0.1\"\nport = 6000\nmac = \"02:00:00:00:00:01\"\ninterface = \"sp0\"\nsender = true\n",
        )
        .unwrap();
        let e = one.check(0, &ports, 64, |_, _| None).unwrap_err();
        assert_eq!(e.field, "members");
        assert!(e.message.starts_with("no receiver"), "{e:?}");
    }

    #[test]
    fn empty_ranges_overlap_nothing() {
        assert!(overlap((0, 4), (3, 1)));
        assert!(!overlap((0, 4), (4, 1)));
        assert!(!overlap((0, 4), (2, 0)));
        assert!(!overlap((2, 0), (0, 4)));
    }

    #[test]
    fn overlapping_jobs_and_duplicate_ids_are_rejected() {
        let second = GOOD.split("[[jobs]]").nth(1).unwrap();
        let two = format!("{GOOD}\n[[jobs]]{}", second.replace("id = 7", "id = 8"));
        let e = Config::parse(&two).unwrap_err().to_string();
        assert!(
            e.starts_with("jobs[1].slot_base: slots 0..64 overlap jobs[0] (job 7)"),
            "{e}"
        );
        let moved = {
            let (a, b) = two.split_at(two.rfind("slot_base = 0").unwrap());
            format!("{a}{}", b.replacen("slot_base = 0", "slot_base = 64", 1))
        };
        Config::parse(&moved).unwrap();
        let dup = moved.replace("id = 8", "id = 7");
        assert_eq!(
            Config::parse(&dup).unwrap_err().to_string(),
            "jobs[1].id: job 7 is defined twice"
        );
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(
            parse_mac("02:0a:FF:00:10:99"),
            Some([2, 10, 255, 0, 16, 0x99])
        );
        for bad in [
            "",
            "02:0a:ff:00:10",
            "02:0a:ff:00:10:99:00",
            "2:0a:ff:00:10:99",
            "zz:0a:ff:00:10:99",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
        assert_eq!(
            Mac([2, 10, 255, 0, 16, 0x99]).to_string(),
            "02:0a:ff:00:10:99"
        );
    }
}

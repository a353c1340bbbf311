//! The switch configuration file (TOML): ports, slot pool and jobs.
//!
//! ```toml
//! [switch]
//! ports = ["sp0", "sp1"]      # interfaces that become switch ports
//! slot_pool = 4096            # aggregator slots (2 x 1,056 bytes each)
//! xdp_mode = "auto"           # auto | native | generic
//!
//! [[jobs]]
//! id = 7
//! op = "sum"                  # sum | max | min
//! dtype = "i32"               # i32 | i64
//! mode = "allreduce"          # allreduce | reduce | reduce-scatter
//! elems_per_packet = 256      # elements per packet: 1..=360 (i32), 1..=180 (i64)
//! slot_base = 0               # the job's private slot range in the pool
//! slot_count = 64             # = the workers' window of chunks in flight
//!
//! [[jobs.members]]
//! rank = 0
//! ip = "10.77.0.1"
//! port = 5000                 # the worker's UDP port
//! mac = "02:00:00:00:00:01"
//! interface = "sp0"           # the switch port the worker sits behind
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
    #[serde(default)]
    pub xdp_mode: XdpModeName,
    /// Log chunk completions from the dataplane (slow; for debugging).
    #[serde(default)]
    pub debug: bool,
}

fn default_slot_pool() -> u32 {
    xina_proto::maps::DEFAULT_SLOT_POOL
}

/// A `[[jobs]]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub id: u32,
    #[serde(default)]
    pub op: OpName,
    #[serde(default)]
    pub dtype: DTypeName,
    #[serde(default)]
    pub mode: ModeName,
    pub elems_per_packet: u16,
    pub slot_base: u32,
    pub slot_count: u32,
    pub members: Vec<Member>,
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

/// `mode = "allreduce" | "reduce" | "reduce-scatter"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeName {
    #[default]
    Allreduce,
    Reduce,
    ReduceScatter,
}

impl From<ModeName> for Mode {
    fn from(m: ModeName) -> Self {
        match m {
            ModeName::Allreduce => Self::Allreduce,
            ModeName::Reduce => Self::Reduce,
            ModeName::ReduceScatter => Self::ReduceScatter,
        }
    }
}

/// A `[[jobs.members]]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub rank: u8,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub mac: String,
    pub interface: String,
}

/// A whole, checked configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub switch: Switch,
    #[serde(default)]
    pub jobs: Vec<Job>,
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

impl Config {
    /// Parses and checks a configuration file's text.
    ///
    /// # Errors
    /// The first problem found, naming its field.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let sw = &self.switch;
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
        let mut ids = HashSet::new();
        for (j, job) in self.jobs.iter().enumerate() {
            let at = |f: &str| format!("jobs[{j}].{f}");
            if !ids.insert(job.id) {
                return Err(err(at("id"), format!("job {} is defined twice", job.id)));
            }
            check_job(&format!("jobs[{j}]."), job, &sw.ports, sw.slot_pool)?;
            let end = u64::from(job.slot_base) + u64::from(job.slot_count);
            for (k, other) in self.jobs[..j].iter().enumerate() {
                let other_end = u64::from(other.slot_base) + u64::from(other.slot_count);
                if u64::from(job.slot_base) < other_end && u64::from(other.slot_base) < end {
                    return Err(err(
                        at("slot_base"),
                        format!(
                            "slots {}..{end} overlap jobs[{k}] (job {}) slots {}..{other_end}",
                            job.slot_base, other.id, other.slot_base
                        ),
                    ));
                }
            }
        }
        Ok(())
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
                sender: false,
                down: false,
            });
        }
        members.sort_by_key(|m| m.rank);
        Ok(JobSpec {
            id: job.id,
            op: job.op.into(),
            dtype: job.dtype.into(),
            mode: job.mode.into(),
            elems_per_packet: job.elems_per_packet,
            slot_base: job.slot_base,
            slot_count: job.slot_count,
            members,
        })
    }
}

/// Maps a TOML parse error to a [`ConfigError`] naming the line and key.
fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
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

/// A job file, as `xina job add FILE` reads it: one job, whose slot range
/// the control plane allocates (unless `slot_base` pins it) and whose
/// members' MACs may be left to the neighbour table.
///
/// ```toml
/// id = 7
/// op = "sum"                  # sum | max | min
/// dtype = "i32"               # i32 | i64
/// mode = "allreduce"          # allreduce | reduce | reduce-scatter
/// elems_per_packet = 256      # 1..=360 (i32), 1..=180 (i64), and within every member port's MTU
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
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub id: u32,
    #[serde(default)]
    pub op: OpName,
    #[serde(default)]
    pub dtype: DTypeName,
    #[serde(default)]
    pub mode: ModeName,
    pub elems_per_packet: u16,
    pub slot_count: u32,
    #[serde(default)]
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
}

impl JobFile {
    /// Parses a job file's text (syntax and field types only: the job is
    /// checked against a switch by [`Self::check`]).
    ///
    /// # Errors
    /// The first problem found, naming its line and key.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| toml_error(text, &e))
    }

    /// The job with slot range `slot_base..slot_base + slot_count` and each
    /// member's MAC given or found by `neighbour(ip, interface)`, checked
    /// against a switch with `ports` and a pool of `slot_pool` slots. Field
    /// names in errors are the file's (`members[1].rank`).
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
        let mut members = Vec::with_capacity(self.members.len());
        for (m, member) in self.members.iter().enumerate() {
            let mac = match &member.mac {
                Some(mac) => mac.clone(),
                None if !ports.contains(&member.interface) => String::new(),
                None => Mac(neighbour(member.ip, &member.interface).ok_or_else(|| {
                    err(
                        format!("members[{m}].mac"),
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
            });
        }
        let job = Job {
            id: self.id,
            op: self.op,
            dtype: self.dtype,
            mode: self.mode,
            elems_per_packet: self.elems_per_packet,
            slot_base,
            slot_count: self.slot_count,
            members,
        };
        check_job("", &job, ports, slot_pool)?;
        Ok(job)
    }
}

/// Checks one job's shape, slot range and members against the switch's
/// ports and pool; `prefix` starts every field name (`jobs[0].`).
fn check_job(
    prefix: &str,
    job: &Job,
    switch_ports: &[String],
    slot_pool: u32,
) -> Result<(), ConfigError> {
    let at = |f: &str| format!("{prefix}{f}");
    let max = DType::from(job.dtype).max_elems();
    if job.elems_per_packet == 0 || usize::from(job.elems_per_packet) > max {
        return Err(err(
            at("elems_per_packet"),
            format!(
                "{} (must be 1..={max} for {:?}, so a packet fits a 1500-byte MTU)",
                job.elems_per_packet, job.dtype
            ),
        ));
    }
    if job.slot_count == 0 {
        return Err(err(at("slot_count"), "0 (a job needs at least one slot)"));
    }
    let end = u64::from(job.slot_base) + u64::from(job.slot_count);
    if end > u64::from(slot_pool) {
        return Err(err(
            at("slot_count"),
            format!(
                "slots {}..{end} do not fit the pool of {slot_pool} slots",
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
                "elems_per_packet = 361",
                "jobs[0].elems_per_packet: 361",
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
                "elems_per_packet = 200\ndtype = \"i64\"",
                "jobs[0].elems_per_packet: 200 (must be 1..=180 for I64",
            ),
            ("id = 7", "id = 7\ncolour = 3", "unknown field `colour`"),
            (
                "port = 5000\nmac = \"02:00:00:00:00:02\"",
                "port = 0\nmac = \"02:00:00:00:00:02\"",
                "jobs[0].members[0].port: 0",
            ),
        ];
        for (from, to, want) in cases {
            assert!(GOOD.contains(from), "case {from:?} does not apply");
            let text = GOOD.replacen(from, to, 1);
            let e = Config::parse(&text).expect_err(to).to_string();
            assert!(e.contains(want), "{to:?}: got {e:?}, want {want:?}");
        }
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

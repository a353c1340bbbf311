//! The P4 backend: the control-plane state of the P4 twin of the dataplane
//! (`p4/xina.p4`) for the jobs of a switch configuration file, the same file
//! the XDP control plane reads.
//!
//! [`Program::build`] turns a checked [`Config`] into table entries,
//! multicast groups and register initialisation; [`Program::cli`] renders
//! them as `BMv2` `simple_switch_CLI` commands and [`Program::p4runtime`] as
//! P4Runtime-style JSON (`table_entries`, `multicast_group_entries`,
//! `register_entries`). Switch ports are numbered by their position in
//! `switch.ports`; the P4 program needs each port's MAC address (the source
//! of the frames it sends to the port's members), which XDP reads from the
//! interface.
//!
//! The sizes below mirror `p4/config.p4` (checked by `tests/p4_header.rs`).

pub mod vectors;

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::{Value, json};
use xina_proto::{MAX_RANKS, maps::MAX_JOBS};

use crate::config::{Config, ConfigError, Mac};

/// Aggregator lanes: most elements per packet (`ELEMS` in `p4/config.p4`).
pub const ELEMS: u16 = 32;
/// Slots in the P4 program's pool (`SLOT_POOL` in `p4/config.p4`).
pub const SLOT_POOL: u32 = 1024;
/// The port that stands for the host's own stack (`CPU_PORT`).
pub const CPU_PORT: u16 = 64;
/// Most switch ports (`MAX_PORTS`).
pub const MAX_PORTS: usize = 64;

/// Registers of `bitmap.p4`, one per field of `xina_proto::maps::Slot`.
pub const SLOT_REGISTERS: [&str; 6] = [
    "XinaIngress.bitmap.slot_state",
    "XinaIngress.bitmap.slot_seq",
    "XinaIngress.bitmap.slot_count",
    "XinaIngress.bitmap.slot_root",
    "XinaIngress.bitmap.slot_bitmap",
    "XinaIngress.result_flags.slot_flags",
];

/// The switch-wide counter arrays of the ingress and egress pipelines, which
/// a reader sums (see `p4/counters.p4`).
pub const SWITCH_COUNTERS: [&str; 2] = [
    "XinaIngress.counters.switch_counters",
    "XinaEgress.counters.switch_counters",
];

const JOBS_TABLE: &str = "XinaIngress.admission.jobs";
const JOB_ACTION: &str = "XinaIngress.admission.job";
const MEMBERS_TABLE: &str = "XinaIngress.admission.members";
const MEMBER_ACTION: &str = "XinaIngress.admission.member";
const PORT_MEMBERS_TABLE: &str = "XinaEgress.egress.port_members";
const ADDRESS_ACTION: &str = "XinaEgress.egress.address";

/// The register of lane `i`'s values (`aggregator.p4`).
pub fn lane_register(i: u16) -> String {
    format!("XinaIngress.lane_{i}.values")
}

/// A value in a match key or an action parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    Int(u128),
    Mac([u8; 6]),
    Ipv4(std::net::Ipv4Addr),
}

impl Param {
    /// As `simple_switch_CLI` reads it.
    fn cli(&self) -> String {
        match self {
            Self::Int(v) => v.to_string(),
            Self::Mac(m) => Mac(*m).to_string(),
            Self::Ipv4(a) => a.to_string(),
        }
    }

    /// As P4Runtime-style JSON: numbers, MACs and addresses in their usual
    /// text forms.
    fn json(&self) -> Value {
        match self {
            Self::Int(v) => u64::try_from(*v).map_or_else(|_| json!(v.to_string()), |v| json!(v)),
            Self::Mac(_) | Self::Ipv4(_) => json!(self.cli()),
        }
    }
}

/// One table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    pub table: &'static str,
    /// Exact-match key fields, in key order.
    pub keys: Vec<(&'static str, Param)>,
    pub action: &'static str,
    /// Action parameters, in declaration order.
    pub params: Vec<(&'static str, Param)>,
}

/// One multicast group of the packet replication engine: a job's member
/// ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MulticastGroup {
    pub id: u16,
    /// The replication id of every copy (the job's dense index).
    pub rid: u16,
    pub ports: Vec<u16>,
}

/// Zeroes `register[start..end]` (a job's slot copies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterReset {
    pub register: String,
    pub start: u32,
    pub end: u32,
}

/// Why a configuration cannot be installed on the P4 dataplane.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum P4Error {
    #[error("{0}")]
    Config(#[from] ConfigError),
}

fn err(field: impl Into<String>, message: impl Into<String>) -> P4Error {
    P4Error::Config(ConfigError {
        field: field.into(),
        message: message.into(),
    })
}

/// The P4 control-plane state of a configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    pub tables: Vec<TableEntry>,
    pub groups: Vec<MulticastGroup>,
    pub registers: Vec<RegisterReset>,
}

impl Program {
    /// The state for every job of `config`, with `port_macs` giving the MAC
    /// address of each switch port by name.
    ///
    /// # Errors
    /// A job the P4 program cannot hold (more elements per packet than
    /// lanes, slots beyond its pool) or a port without a MAC address, naming
    /// the field.
    pub fn build(config: &Config, port_macs: &BTreeMap<String, [u8; 6]>) -> Result<Self, P4Error> {
        let ports = &config.switch.ports;
        if ports.len() > MAX_PORTS {
            return Err(err(
                "switch.ports",
                format!("{} ports (the P4 program has {MAX_PORTS})", ports.len()),
            ));
        }
        let mut macs = Vec::with_capacity(ports.len());
        for (i, p) in ports.iter().enumerate() {
            let mac = port_macs.get(p).ok_or_else(|| {
                err(
                    format!("switch.ports[{i}]"),
                    format!("no MAC address for port {p} (give --port-mac {p}=aa:bb:cc:dd:ee:ff)"),
                )
            })?;
            macs.push(*mac);
        }
        if config.jobs.len() > MAX_JOBS as usize {
            return Err(err(
                "jobs",
                format!("{} jobs (at most {MAX_JOBS})", config.jobs.len()),
            ));
        }
        let mut out = Self::default();
        for (j, job) in config.jobs.iter().enumerate() {
            let at = |f: &str| format!("jobs[{j}].{f}");
            if job.mode.is_group() {
                return Err(err(
                    at("mode"),
                    format!(
                        "{} groups are not in the P4 program (only aggregation jobs)",
                        job.mode.name()
                    ),
                ));
            }
            if job.elems_per_packet > ELEMS {
                return Err(err(
                    at("elems_per_packet"),
                    format!(
                        "{} (the P4 program has {ELEMS} aggregator lanes; see p4/README.md)",
                        job.elems_per_packet
                    ),
                ));
            }
            let end = u64::from(job.slot_base) + u64::from(job.slot_count);
            if end > u64::from(SLOT_POOL) {
                return Err(err(
                    at("slot_count"),
                    format!(
                        "slots {}..{end} do not fit the P4 program's pool of {SLOT_POOL} slots",
                        job.slot_base
                    ),
                ));
            }
            let index = u16::try_from(j).expect("at most MAX_JOBS jobs");
            let fan_in = job.members.len();
            debug_assert!(fan_in <= MAX_RANKS, "checked by Config::parse");
            let all_ranks: u64 = if fan_in == 64 {
                u64::MAX
            } else {
                (1 << fan_in) - 1
            };
            let group = index + 1;
            let int = |v: u64| Param::Int(u128::from(v));
            out.tables.push(TableEntry {
                table: JOBS_TABLE,
                keys: vec![("hdr.xina.job", int(job.id.into()))],
                action: JOB_ACTION,
                params: vec![
                    ("counters", int(index.into())),
                    ("fan_in", int(fan_in as u64)),
                    ("op", int(job.op as u64)),
                    ("dtype", int(job.dtype as u64)),
                    ("mode", int(job.mode.wire().into())),
                    ("elems", int(job.elems_per_packet.into())),
                    ("slot_base", int(job.slot_base.into())),
                    ("slot_count", int(job.slot_count.into())),
                    ("reuse", int(u64::from(job.slot_count) * 2)),
                    ("all_ranks", int(all_ranks)),
                    ("mcast_grp", int(group.into())),
                ],
            });
            let mut members: Vec<_> = job.members.iter().collect();
            members.sort_by_key(|m| m.rank);
            let mut group_ports = Vec::with_capacity(fan_in);
            for m in members {
                let port = ports
                    .iter()
                    .position(|p| *p == m.interface)
                    .expect("checked by Config::parse");
                let port16 = u16::try_from(port).expect("at most MAX_PORTS");
                group_ports.push(port16);
                out.tables.push(TableEntry {
                    table: MEMBERS_TABLE,
                    keys: vec![
                        ("hdr.xina.job", int(job.id.into())),
                        ("hdr.xina.rank", int(m.rank.into())),
                    ],
                    action: MEMBER_ACTION,
                    params: vec![("ip", Param::Ipv4(m.ip)), ("udp_port", int(m.port.into()))],
                });
                out.tables.push(TableEntry {
                    table: PORT_MEMBERS_TABLE,
                    keys: vec![
                        ("hdr.xina.job", int(job.id.into())),
                        ("standard_metadata.egress_port", int(port16.into())),
                    ],
                    action: ADDRESS_ACTION,
                    params: vec![
                        (
                            "mac",
                            Param::Mac(
                                crate::config::parse_mac(&m.mac).expect("checked by Config::parse"),
                            ),
                        ),
                        ("switch_mac", Param::Mac(macs[port])),
                        ("ip", Param::Ipv4(m.ip)),
                        ("udp_port", int(m.port.into())),
                        ("rank", int(m.rank.into())),
                    ],
                });
            }
            out.groups.push(MulticastGroup {
                id: group,
                rid: index,
                ports: group_ports,
            });
            // The job's slot copies start empty, as `Dataplane::install_job`
            // clears them in XDP.
            let (start, end) = (job.slot_base * 2, (job.slot_base + job.slot_count) * 2);
            let registers = SLOT_REGISTERS
                .iter()
                .map(|r| (*r).to_owned())
                .chain((0..ELEMS).map(lane_register));
            for register in registers {
                out.registers.push(RegisterReset {
                    register,
                    start,
                    end,
                });
            }
        }
        Ok(out)
    }

    /// The state as `simple_switch_CLI` commands, one per line, for a switch
    /// freshly started with `p4/xina.p4` (multicast node handles are those a
    /// fresh switch hands out: 0, 1, 2, ...).
    pub fn cli(&self) -> String {
        let mut s = String::new();
        for t in &self.tables {
            let keys: Vec<_> = t.keys.iter().map(|(_, v)| v.cli()).collect();
            let params: Vec<_> = t.params.iter().map(|(_, v)| v.cli()).collect();
            let _ = writeln!(
                s,
                "table_add {} {} {} => {}",
                t.table,
                t.action,
                keys.join(" "),
                params.join(" ")
            );
        }
        for (handle, g) in self.groups.iter().enumerate() {
            let ports: Vec<_> = g.ports.iter().map(u16::to_string).collect();
            let _ = writeln!(s, "mc_mgrp_create {}", g.id);
            let _ = writeln!(s, "mc_node_create {} {}", g.rid, ports.join(" "));
            let _ = writeln!(s, "mc_node_associate {} {handle}", g.id);
        }
        for r in &self.registers {
            for i in r.start..r.end {
                let _ = writeln!(s, "register_write {} {i} 0", r.register);
            }
        }
        s
    }

    /// The state as P4Runtime-style JSON: `table_entries` (exact matches and
    /// action parameters by name), `multicast_group_entries` (replicas with
    /// egress port and instance) and `register_entries` (index ranges to
    /// zero).
    pub fn p4runtime(&self) -> Value {
        let tables: Vec<Value> = self
            .tables
            .iter()
            .map(|t| {
                let keys: serde_json::Map<String, Value> = t
                    .keys
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), json!({ "exact": v.json() })))
                    .collect();
                let params: serde_json::Map<String, Value> = t
                    .params
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.json()))
                    .collect();
                json!({
                    "table_name": t.table,
                    "match": keys,
                    "action_name": t.action,
                    "action_params": params,
                })
            })
            .collect();
        let groups: Vec<Value> = self
            .groups
            .iter()
            .map(|g| {
                let replicas: Vec<Value> = g
                    .ports
                    .iter()
                    .map(|p| json!({ "egress_port": p, "instance": g.rid }))
                    .collect();
                json!({ "multicast_group_id": g.id, "replicas": replicas })
            })
            .collect();
        let registers: Vec<Value> = self
            .registers
            .iter()
            .map(|r| {
                json!({
                    "register_name": r.register,
                    "index": { "start": r.start, "end": r.end },
                    "data": 0,
                })
            })
            .collect();
        json!({
            "program": "p4/xina.p4",
            "table_entries": tables,
            "multicast_group_entries": groups,
            "register_entries": registers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[switch]
ports = ["sp0", "sp1", "sp2"]
slot_pool = 64

[[jobs]]
id = 7
mode = "reduce"
elems_per_packet = 4
slot_base = 10
slot_count = 2

[[jobs.members]]
rank = 1
ip = "10.77.0.2"
port = 5001
mac = "02:77:00:00:00:02"
interface = "sp2"

[[jobs.members]]
rank = 0
ip = "10.77.0.1"
port = 5000
mac = "02:77:00:00:00:01"
interface = "sp0"
"#;

    fn macs() -> BTreeMap<String, [u8; 6]> {
        (0..3u8)
            .map(|i| (format!("sp{i}"), [2, 0x5a, 0, 0, 0, i]))
            .collect()
    }

    #[test]
    fn a_job_becomes_entries_a_group_and_cleared_slots() {
        let config = Config::parse(CONFIG).unwrap();
        let p = Program::build(&config, &macs()).unwrap();
        let cli = p.cli();
        let lines: Vec<&str> = cli.lines().collect();
        assert_eq!(
            lines[0],
            "table_add XinaIngress.admission.jobs XinaIngress.admission.job 7 => \
             0 2 0 0 1 4 10 2 4 3 1"
        );
        assert_eq!(
            lines[1],
            "table_add XinaIngress.admission.members XinaIngress.admission.member 7 0 => \
             10.77.0.1 5000"
        );
        assert_eq!(
            lines[4],
            "table_add XinaEgress.egress.port_members XinaEgress.egress.address 7 2 => \
             02:77:00:00:00:02 02:5a:00:00:00:02 10.77.0.2 5001 1"
        );
        assert_eq!(
            &lines[5..8],
            [
                "mc_mgrp_create 1",
                "mc_node_create 0 0 2",
                "mc_node_associate 1 0"
            ]
        );
        // Slots 10..12 are copies 20..24 of each of 6 slot and 32 lane registers.
        assert_eq!(lines.len(), 8 + 4 * (6 + 32));
        assert!(cli.contains("register_write XinaIngress.bitmap.slot_state 20 0\n"));
        assert!(cli.contains("register_write XinaIngress.lane_31.values 23 0\n"));
        assert!(
            !cli.contains(" 24 0\n"),
            "only the job's copies are cleared"
        );

        let j = p.p4runtime();
        assert_eq!(j["table_entries"][0]["match"]["hdr.xina.job"]["exact"], 7);
        assert_eq!(j["table_entries"][0]["action_params"]["all_ranks"], 3);
        assert_eq!(
            j["table_entries"][1]["action_params"]["ip"],
            json!("10.77.0.1")
        );
        assert_eq!(
            j["multicast_group_entries"][0],
            json!({"multicast_group_id": 1, "replicas": [
                {"egress_port": 0, "instance": 0}, {"egress_port": 2, "instance": 0}]})
        );
        assert_eq!(
            j["register_entries"][0],
            json!({"register_name": "XinaIngress.bitmap.slot_state",
                   "index": {"start": 20, "end": 24}, "data": 0})
        );
    }

    #[test]
    fn what_the_p4_program_cannot_hold_is_refused_naming_the_field() {
        let config = Config::parse(CONFIG).unwrap();
        let mut no_mac = macs();
        no_mac.remove("sp1");
        assert_eq!(
            Program::build(&config, &no_mac).unwrap_err().to_string(),
            "switch.ports[1]: no MAC address for port sp1 \
             (give --port-mac sp1=aa:bb:cc:dd:ee:ff)"
        );
        let wide = Config::parse(&CONFIG.replace("elems_per_packet = 4", "elems_per_packet = 33"))
            .unwrap();
        let e = Program::build(&wide, &macs()).unwrap_err().to_string();
        assert!(
            e.starts_with("jobs[0].elems_per_packet: 33 (the P4 program has 32"),
            "{e}"
        );
        let far = CONFIG
            .replace("slot_pool = 64", "slot_pool = 4096")
            .replace("slot_base = 10", "slot_base = 1023");
        let e = Program::build(&Config::parse(&far).unwrap(), &macs())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("jobs[0].slot_count: slots 1023..1025 do not fit"),
            "{e}"
        );
        let group = CONFIG
            .replace(
                "mode = \"reduce\"\nelems_per_packet = 4",
                "mode = \"multicast\"",
            )
            .replace("slot_count = 2", "window = 1")
            .replace("port = 5000", "port = 5000\nsender = true");
        let e = Program::build(&Config::parse(&group).unwrap(), &macs())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "jobs[0].mode: multicast groups are not in the P4 program (only aggregation jobs)"
        );
    }
}

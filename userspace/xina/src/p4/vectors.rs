//! Shared test vectors: the same frames through the XDP dataplane (under
//! `BPF_PROG_TEST_RUN`, `tests/p4_vectors.rs`) and the P4 one (`BMv2`,
//! `p4/run_vectors.py`), with the same expected frames and counters.
//!
//! A vector file (`p4/vectors/*.json`) names a switch configuration (the
//! TOML job file both control planes read), the MAC address of each port and
//! a list of steps. Each step sends one frame, described by its header
//! fields and payload values, and lists what must come out — results and
//! notices by the member they go to, with their hand-computed values, bitmap
//! and flags, or `"pass"` for a frame handed to the host unchanged — and
//! every switch-wide counter that must change (all others must not).
//! [`load`] turns a file into concrete frames; the expected frames are built
//! from the expectation and the protocol (ebpf/README.md), never recorded
//! from a dataplane.
//!
//! ```json
//! { "about": "...", "config": "switch.toml", "switch_ip": "10.77.0.254",
//!   "port_macs": { "sp0": "02:5a:00:00:00:01" },
//!   "only": { "backend": "xdp", "why": "..." },            // optional
//!   "steps": [ {
//!     "about": "rank 2 completes chunk 0",
//!     "send": { "job": 7, "rank": 2, "seq": 0, "values": [1, 2] },
//!     "expect": [ { "result": { "to": 0, "bitmap": 7, "values": [3, 4] } }, "pass" ],
//!     "counters": { "rx_packets": 1, "contributions": 1, "completed": 1 },
//!     "xdp_counters": { "egress_not_member": 1 }               // optional
//!   } ] }
//! ```
//!
//! `send` fills every header field from the job (fan-in, op, dtype, slot
//! `seq mod W`, version `(seq / W) mod 2`, count = the values, root 0,
//! bitmap `1 << rank`) and sends from the rank's member (rank 0's if the
//! rank has none) on its port; any field can be overridden, and the frame
//! can be damaged (see [`Send`]). `xdp_counters` are counted by XDP only:
//! XDP broadcasts a result to every port and counts `egress_not_member` for
//! ports without a member of the job, where P4 multicasts to the job's ports.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use serde_json::{Value, json};
use xina_proto::{
    DType, Flags, Kind, Repr, XINA_UDP_PORT, checksum,
    counters::Counter,
    header::{HEADER_LEN, field},
    net::{
        ETH_HLEN, ETH_TYPE, IPV4_CSUM, IPV4_FRAG, IPV4_HLEN, IPV4_PROTO, IPV4_TOTAL_LEN, IPV4_VIHL,
        UDP_CSUM, UDP_DPORT, UDP_HLEN, UDP_LEN, XINA_OFFSET,
    },
};

use crate::config::{Config, Member, parse_mac};
use crate::frame::{self, Endpoint};

/// A vector file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorFile {
    pub about: String,
    /// The switch configuration, relative to the vector file.
    pub config: PathBuf,
    pub switch_ip: Ipv4Addr,
    pub port_macs: BTreeMap<String, String>,
    #[serde(default)]
    pub only: Option<Only>,
    pub steps: Vec<Step>,
}

/// A vector that exercises a documented difference between the dataplanes.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Only {
    /// `xdp` or `p4`.
    pub backend: String,
    pub why: String,
}

/// One frame in, what must come out.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub about: String,
    pub send: Send,
    #[serde(default)]
    pub expect: Vec<Expect>,
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    #[serde(default)]
    pub xdp_counters: BTreeMap<String, u64>,
}

/// The frame a step sends: a contribution from `rank` of `job`, with any
/// field overridden and optional damage.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Send {
    pub job: u32,
    pub rank: u8,
    #[serde(default)]
    pub seq: u32,
    /// Payload elements, encoded as the job's element type.
    #[serde(default)]
    pub values: Vec<i64>,
    /// Ingress port (default: the member's interface).
    pub port: Option<String>,
    // Header fields (raw wire values).
    pub magic: Option<u8>,
    pub version: Option<u8>,
    pub kind: Option<u8>,
    pub flags: Option<u8>,
    pub fan_in: Option<u8>,
    pub op: Option<u8>,
    pub dtype: Option<u8>,
    pub slot: Option<u32>,
    pub slot_version: Option<bool>,
    pub count: Option<u16>,
    pub exponent: Option<i8>,
    pub root: Option<u8>,
    pub bitmap: Option<u64>,
    // Lower layers.
    pub src_ip: Option<Ipv4Addr>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    pub ethertype: Option<u16>,
    pub protocol: Option<u8>,
    /// The IPv4 flags / fragment offset field.
    pub frag: Option<u16>,
    /// Words of IPv4 options (NOPs) inserted after the IPv4 header.
    pub ip_options: Option<u8>,
    pub udp_len: Option<u16>,
    pub ip_len: Option<u16>,
    /// Bytes cut from the end of the frame (checksums and lengths unchanged).
    pub cut: Option<usize>,
    /// Zero bytes appended after the datagram (like Ethernet padding).
    pub pad: Option<usize>,
}

/// One frame that must come out.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    /// The result, to the member of rank `to` on its port.
    Result(Delivery),
    /// A completion notice (no payload), to the member of rank `to`.
    Notice(Delivery),
    /// The frame, unchanged, to the host's own stack.
    Pass,
}

/// An expected result or notice.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    pub to: u8,
    /// The whole flags byte.
    #[serde(default)]
    pub flags: u8,
    pub bitmap: u64,
    /// The result's elements (none for a notice).
    #[serde(default)]
    pub values: Vec<i64>,
}

/// Where a frame comes out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Port {
    /// A switch port, by its name in `switch.ports`.
    Switch(String),
    /// The host's own stack (`XDP_PASS`; the P4 program's `CPU_PORT`).
    Host,
}

/// A frame that comes out of a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Output {
    pub port: Port,
    pub frame: Vec<u8>,
}

/// A step with concrete frames.
#[derive(Clone, Debug)]
pub struct ConcreteStep {
    pub about: String,
    pub in_port: String,
    pub frame: Vec<u8>,
    /// Sorted.
    pub outputs: Vec<Output>,
    /// Every switch-wide counter's expected change on both dataplanes.
    pub counters: [u64; Counter::COUNT],
    /// Added on XDP only.
    pub xdp_counters: [u64; Counter::COUNT],
}

/// A vector file with concrete frames.
#[derive(Clone, Debug)]
pub struct Vector {
    pub name: String,
    pub about: String,
    pub only: Option<Only>,
    pub config: Config,
    pub switch_ip: Ipv4Addr,
    pub port_macs: BTreeMap<String, [u8; 6]>,
    pub steps: Vec<ConcreteStep>,
}

impl Vector {
    /// Whether `backend` (`xdp` or `p4`) runs this vector.
    pub fn runs_on(&self, backend: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.backend == backend)
    }

    /// The ifindex the XDP test runs give port `name` (no interface exists).
    pub fn fake_ifindex(&self, name: &str) -> Option<u32> {
        let i = self.config.switch.ports.iter().position(|p| p == name)?;
        Some(100 + u32::try_from(i).ok()?)
    }

    /// The P4 port number of `port`.
    pub fn p4_port(&self, port: &Port) -> Option<u16> {
        match port {
            Port::Host => Some(super::CPU_PORT),
            Port::Switch(name) => {
                let i = self.config.switch.ports.iter().position(|p| p == name)?;
                u16::try_from(i).ok()
            }
        }
    }

    /// The vector as the `BMv2` runner reads it: control-plane commands,
    /// frames as hex, ports as P4 port numbers, counters by name.
    ///
    /// # Errors
    /// When the configuration does not fit the P4 program.
    pub fn to_p4_json(&self) -> Result<Value, super::P4Error> {
        let only = self
            .only
            .as_ref()
            .map(|o| json!({"backend": o.backend, "why": o.why}));
        if !self.runs_on("p4") {
            return Ok(json!({ "name": self.name, "about": self.about, "only": only }));
        }
        let program = super::Program::build(&self.config, &self.port_macs)?;
        let ports: Vec<Value> = self
            .config
            .switch
            .ports
            .iter()
            .enumerate()
            .map(|(i, name)| json!({ "name": name, "port": i }))
            .collect();
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| {
                let outputs: Vec<Value> = s
                    .outputs
                    .iter()
                    .map(|o| {
                        json!({
                            "port": self.p4_port(&o.port).expect("checked in load"),
                            "frame": hex(&o.frame),
                        })
                    })
                    .collect();
                let counters: BTreeMap<&str, u64> = Counter::ALL
                    .iter()
                    .map(|c| (c.name(), s.counters[*c as usize]))
                    .collect();
                json!({
                    "about": s.about,
                    "in_port": self.p4_port(&Port::Switch(s.in_port.clone())),
                    "frame": hex(&s.frame),
                    "outputs": outputs,
                    "counters": counters,
                })
            })
            .collect();
        Ok(json!({
            "name": self.name,
            "about": self.about,
            "only": only,
            "ports": ports,
            "cpu_port": super::CPU_PORT,
            "commands": program.cli(),
            "counter_arrays": super::SWITCH_COUNTERS,
            "counter_names": Counter::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "steps": steps,
        }))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A vector file that cannot be used, naming the file and the place.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {what}")]
pub struct VectorError {
    pub file: String,
    pub what: String,
}

/// Every `*.json` vector in `dir`, sorted by name.
///
/// # Errors
/// The first file that cannot be read or used.
pub fn load_dir(dir: &Path) -> Result<Vec<Vector>, VectorError> {
    let bad = |what: String| VectorError {
        file: dir.display().to_string(),
        what,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| bad(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(bad("no *.json vectors".to_owned()));
    }
    paths.iter().map(|p| load(p)).collect()
}

/// Reads a vector file and builds its frames.
///
/// # Errors
/// A file that cannot be read or parsed, a configuration that does not
/// check, or a step that names a job, rank, port or counter that does not
/// exist.
pub fn load(path: &Path) -> Result<Vector, VectorError> {
    let file = path.display().to_string();
    let bad = |what: String| VectorError {
        file: file.clone(),
        what,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: VectorFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let config_path = path.parent().unwrap_or(Path::new(".")).join(&v.config);
    let config_text = std::fs::read_to_string(&config_path)
        .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
    let config =
        Config::parse(&config_text).map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
    if let Some(o) = &v.only
        && o.backend != "xdp"
        && o.backend != "p4"
    {
        return Err(bad(format!(
            "only.backend: {:?} (must be \"xdp\" or \"p4\")",
            o.backend
        )));
    }
    let mut port_macs = BTreeMap::new();
    for p in &config.switch.ports {
        let mac = v
            .port_macs
            .get(p)
            .and_then(|m| parse_mac(m))
            .ok_or_else(|| bad(format!("port_macs.{p}: missing or not a MAC address")))?;
        port_macs.insert(p.clone(), mac);
    }
    let ctx = Ctx {
        config: &config,
        switch_ip: v.switch_ip,
        port_macs: &port_macs,
    };
    let mut steps = Vec::with_capacity(v.steps.len());
    for (i, s) in v.steps.iter().enumerate() {
        steps.push(
            ctx.step(s)
                .map_err(|what| bad(format!("steps[{i}] ({}): {what}", s.about)))?,
        );
    }
    let name = path
        .file_stem()
        .map_or_else(|| file.clone(), |s| s.to_string_lossy().into_owned());
    Ok(Vector {
        name,
        about: v.about,
        only: v.only,
        config,
        switch_ip: v.switch_ip,
        port_macs,
        steps,
    })
}

struct Ctx<'a> {
    config: &'a Config,
    switch_ip: Ipv4Addr,
    port_macs: &'a BTreeMap<String, [u8; 6]>,
}

impl Ctx<'_> {
    fn job(&self, id: u32) -> Result<&crate::config::Job, String> {
        self.config
            .jobs
            .iter()
            .find(|j| j.id == id)
            .ok_or_else(|| format!("job {id} is not in the configuration"))
    }

    fn member(job: &crate::config::Job, rank: u8) -> Result<&Member, String> {
        job.members
            .iter()
            .find(|m| m.rank == rank)
            .ok_or_else(|| format!("job {}: no member of rank {rank}", job.id))
    }

    fn endpoint(m: &Member) -> Endpoint {
        Endpoint {
            mac: parse_mac(&m.mac).expect("checked by Config::parse"),
            ip: m.ip,
            port: m.port,
        }
    }

    fn counters(names: &BTreeMap<String, u64>) -> Result<[u64; Counter::COUNT], String> {
        let mut out = [0; Counter::COUNT];
        for (name, v) in names {
            let c = Counter::ALL
                .iter()
                .find(|c| c.name() == name)
                .ok_or_else(|| format!("no counter named {name:?}"))?;
            out[*c as usize] = *v;
        }
        Ok(out)
    }

    fn step(&self, s: &Step) -> Result<ConcreteStep, String> {
        let send = &s.send;
        // A job the configuration lacks (the unknown-job case) is sent with
        // the first job's shape.
        let job = match self.job(send.job) {
            Ok(j) => j,
            Err(_) => self
                .config
                .jobs
                .first()
                .ok_or("the configuration has no job")?,
        };
        let member = Self::member(job, send.rank).or_else(|_| Self::member(job, 0))?;
        let dtype = job.dtype;
        let slots = job.slot_count;
        let repr = Repr {
            kind: Kind::AggData,
            flags: Flags::default(),
            job: send.job,
            rank: send.rank,
            fan_in: u8::try_from(job.members.len()).expect("at most 64"),
            op: job.op,
            dtype,
            seq: send.seq,
            slot: send.slot.unwrap_or(send.seq % slots),
            slot_version: send.slot_version.unwrap_or((send.seq / slots) % 2 == 1),
            count: u16::try_from(send.values.len()).map_err(|_| "too many values")?,
            exponent: send.exponent.unwrap_or(0),
            root: send.root.unwrap_or(0),
            bitmap: send.bitmap.unwrap_or(1u64 << (send.rank & 63)),
        };
        let payload = encode(dtype, &send.values)?;
        let mut src = Self::endpoint(member);
        src.ip = send.src_ip.unwrap_or(src.ip);
        src.port = send.src_port.unwrap_or(src.port);
        let in_port = send
            .port
            .clone()
            .unwrap_or_else(|| member.interface.clone());
        let port_mac = *self
            .port_macs
            .get(&in_port)
            .ok_or_else(|| format!("port {in_port} is not a switch port"))?;
        let dst = Endpoint {
            mac: port_mac,
            ip: self.switch_ip,
            port: XINA_UDP_PORT,
        };
        let mut f = frame::build(src, dst, &repr, &payload);
        damage(&mut f, send);

        let mut outputs = Vec::with_capacity(s.expect.len());
        for e in &s.expect {
            outputs.push(match e {
                Expect::Pass => Output {
                    port: Port::Host,
                    frame: f.clone(),
                },
                Expect::Result(d) | Expect::Notice(d) => {
                    let notice = matches!(e, Expect::Notice(_));
                    self.delivery(job, &repr, d, notice, send.pad.unwrap_or(0))?
                }
            });
        }
        outputs.sort();
        Ok(ConcreteStep {
            about: s.about.clone(),
            in_port,
            frame: f,
            outputs,
            counters: Self::counters(&s.counters)?,
            xdp_counters: Self::counters(&s.xdp_counters)?,
        })
    }

    /// The frame a member gets: the contribution's header with the result's
    /// kind, flags, bitmap and values, from the switch's port to the member
    /// (ebpf/README.md, "Delivery").
    fn delivery(
        &self,
        job: &crate::config::Job,
        sent: &Repr,
        d: &Delivery,
        notice: bool,
        pad: usize,
    ) -> Result<Output, String> {
        let to = Self::member(job, d.to)?;
        let port_mac = self.port_macs[&to.interface];
        let mut repr = *sent;
        repr.kind = Kind::AggResult;
        repr.flags = Flags(d.flags);
        repr.bitmap = d.bitmap;
        let src = Endpoint {
            mac: port_mac,
            ip: self.switch_ip,
            port: XINA_UDP_PORT,
        };
        let mut f = if notice {
            if !d.values.is_empty() {
                return Err("a notice carries no values".to_owned());
            }
            repr.count = 0;
            let mut f = frame::build(src, Self::endpoint(to), &repr, &[]);
            f[ETH_HLEN + IPV4_HLEN + UDP_CSUM..][..2].fill(0);
            f
        } else {
            if d.values.len() != usize::from(sent.count) {
                return Err(format!(
                    "the result has {} values, the contribution {}",
                    d.values.len(),
                    sent.count
                ));
            }
            frame::build(
                src,
                Self::endpoint(to),
                &repr,
                &encode(sent.dtype, &d.values)?,
            )
        };
        if !notice {
            f.resize(f.len() + pad, 0);
        }
        Ok(Output {
            port: Port::Switch(to.interface.clone()),
            frame: f,
        })
    }
}

/// Big-endian elements of `dtype`.
fn encode(dtype: DType, values: &[i64]) -> Result<Vec<u8>, String> {
    match dtype {
        DType::Bytes => Err("the P4 vectors carry no multicast payload".into()),
        DType::I64 => Ok(frame::i64_payload(values)),
        DType::I32 => {
            let v: Result<Vec<i32>, _> = values.iter().map(|v| i32::try_from(*v)).collect();
            Ok(frame::i32_payload(
                &v.map_err(|_| "an int32 value out of range")?,
            ))
        }
    }
}

/// Applies a step's overrides of raw fields and its damage to a built frame,
/// keeping the checksums right unless the frame is cut.
fn damage(f: &mut Vec<u8>, s: &Send) {
    let x = XINA_OFFSET;
    let set8 = |f: &mut Vec<u8>, at: usize, v: Option<u8>| {
        if let Some(v) = v {
            f[at] = v;
        }
    };
    let set16 = |f: &mut Vec<u8>, at: usize, v: Option<u16>| {
        if let Some(v) = v {
            f[at..at + 2].copy_from_slice(&v.to_be_bytes());
        }
    };
    set8(f, x + field::MAGIC, s.magic);
    set8(f, x + field::VERSION, s.version);
    set8(f, x + field::KIND, s.kind);
    set8(f, x + field::FLAGS, s.flags);
    set8(f, x + field::FAN_IN, s.fan_in);
    set8(f, x + field::OP, s.op);
    set8(f, x + field::DTYPE, s.dtype);
    set16(f, x + field::COUNT.start, s.count);
    set16(f, ETH_TYPE, s.ethertype);
    set8(f, ETH_HLEN + IPV4_PROTO, s.protocol);
    set16(f, ETH_HLEN + IPV4_FRAG, s.frag);
    let udp = ETH_HLEN + IPV4_HLEN;
    set16(f, udp + UDP_DPORT, s.dst_port);
    set16(f, udp + UDP_LEN, s.udp_len);
    set16(f, ETH_HLEN + IPV4_TOTAL_LEN, s.ip_len);
    if let Some(words) = s.ip_options {
        let n = 4 * usize::from(words);
        let at = ETH_HLEN + IPV4_HLEN;
        f.splice(at..at, std::iter::repeat_n(1u8, n)); // NOP options
        f[ETH_HLEN + IPV4_VIHL] = 0x45 + words;
        let total = u16::from_be_bytes([f[ETH_HLEN + 2], f[ETH_HLEN + 3]]);
        let total = total + u16::from(words) * 4;
        f[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&total.to_be_bytes());
    }
    refresh_checksums(f);
    if let Some(n) = s.pad {
        f.resize(f.len() + n, 0);
    }
    if let Some(n) = s.cut {
        f.truncate(f.len().saturating_sub(n));
    }
}

/// Recomputes the IPv4 header checksum, and the UDP checksum over the
/// datagram the UDP length announces (as far as the frame holds it).
fn refresh_checksums(f: &mut [u8]) {
    if f.len() < ETH_HLEN + IPV4_HLEN {
        return;
    }
    let ihl = usize::from(f[ETH_HLEN + IPV4_VIHL] & 0x0f) * 4;
    let ip_end = ETH_HLEN + ihl;
    if ihl < IPV4_HLEN || f.len() < ip_end + UDP_HLEN {
        return;
    }
    f[ETH_HLEN + IPV4_CSUM..][..2].fill(0);
    let c = checksum::ipv4(&f[ETH_HLEN..ip_end]);
    f[ETH_HLEN + IPV4_CSUM..][..2].copy_from_slice(&c.to_be_bytes());
    let udp_len = usize::from(u16::from_be_bytes([
        f[ip_end + UDP_LEN],
        f[ip_end + UDP_LEN + 1],
    ]));
    let end = (ip_end + udp_len).clamp(ip_end + UDP_HLEN, f.len());
    f[ip_end + UDP_CSUM..][..2].fill(0);
    let src: [u8; 4] = f[ETH_HLEN + 12..ETH_HLEN + 16].try_into().expect("4 bytes");
    let dst: [u8; 4] = f[ETH_HLEN + 16..ETH_HLEN + 20].try_into().expect("4 bytes");
    let c = checksum::udp_ipv4(src, dst, &f[ip_end..end]);
    f[ip_end + UDP_CSUM..][..2].copy_from_slice(&c.to_be_bytes());
}

const _: () = assert!(XINA_OFFSET + HEADER_LEN == ETH_HLEN + IPV4_HLEN + UDP_HLEN + HEADER_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector in the repository loads, and its expectations are
    /// consistent with the counters it claims.
    #[test]
    fn the_repository_vectors_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../p4/vectors");
        let vectors = load_dir(&dir).unwrap();
        assert!(vectors.len() >= 4, "{} vector files", vectors.len());
        for v in &vectors {
            for s in &v.steps {
                let results = s.counters[Counter::ResultsSent as usize]
                    + s.counters[Counter::NoticesSent as usize];
                let delivered = s.outputs.iter().filter(|o| o.port != Port::Host).count();
                assert_eq!(
                    results, delivered as u64,
                    "{}: {}: results_sent + notices_sent = frames delivered",
                    v.name, s.about
                );
            }
        }
    }

    #[test]
    fn a_damaged_frame_keeps_valid_checksums_unless_cut() {
        let mut f = vec![0u8; 14 + 20 + 8 + 32];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 3] = 60;
        f[14 + 9] = 17;
        f[34 + 5] = 40;
        damage(
            &mut f,
            &Send {
                ip_options: Some(2),
                ..Send::default()
            },
        );
        assert_eq!(f.len(), 14 + 28 + 8 + 32);
        assert_eq!(f[14], 0x47);
        assert_eq!(checksum::ipv4(&f[14..42]), 0, "IPv4 checksum verifies");
    }
}

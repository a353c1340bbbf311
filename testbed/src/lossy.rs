//! A lossy link on a veth: the `xina_lossy_{egress,ingress}` tc programs
//! (see `ebpf/xina-ebpf/src/lossy.rs`) attached with TCX, standing in for
//! `netem`, which this kernel does not have.
//!
//! Drops and duplicates work in both directions. Delays (reordering) work on
//! egress only: a delayed frame is queued in a slow HTB class that this
//! module installs on the interface, so frames behind it overtake it. Frames
//! an XDP program redirects into a veth skip that veth's qdisc, so to disturb
//! the switch's results put the ingress side of the lossy link on the worker.

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuHashMap, PerCpuValues},
    programs::{SchedClassifier, TcAttachType},
};
use xina_proto::lossy::{LinkConfig, LinkCounters, LinkKey, PROGRAMS, counter, direction, names};

use crate::{
    ethtool,
    netns::{self, NetNs},
    topology::Star,
};

/// HTB class of delayed frames: `1:2`, as `skb->priority`.
pub const DELAY_PRIORITY: u32 = 0x0001_0002;

/// Bucket of the slow class. HTB only holds a frame back once the class's
/// token bucket is empty, so the bucket is small.
const SLOW_BURST: [&str; 4] = ["burst", "1600b", "cburst", "1600b"];

/// Why a lossy link could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the lossy link's programs")]
    Load(#[source] aya::EbpfError),
    #[error("lossy link program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("lossy link map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("counting CPUs: {0}")]
    Cpus(String),
    #[error(transparent)]
    NetNs(#[from] netns::Error),
    #[error("interface {0} does not exist in its namespace")]
    NoInterface(String),
    #[error(transparent)]
    Ethtool(#[from] ethtool::Error),
}

/// What a loss rate applies to, where offloads batch frames into packets.
///
/// The lossy link's programs run on packets before the kernel segments them
/// (tc egress comes before GSO) and after GRO merged them (tc ingress), so
/// with offloads on, one pick drops up to 64 KB of TCP segments or a whole
/// UDP GSO send at once: fewer, larger losses than a wire that drops frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LossModel {
    /// Each wire frame is lost with the rate's probability: the links'
    /// segmentation and receive offloads are off ([`per_frame`]), xina's
    /// workers send without UDP GSO, and where TCP still hands the device
    /// GSO packets (it always does) the drop sits behind the veth that cuts
    /// them, so every packet at the hooks is one frame ([`Counts::frames`]
    /// equals [`Counts::seen`]).
    #[default]
    Frame,
    /// Offloads as the topology sets them: a packet of many frames is kept
    /// or dropped whole.
    Batch,
}

impl LossModel {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Frame => "frame",
            Self::Batch => "batch",
        }
    }
}

/// Turns off what batches frames into packets on `star`'s links: TSO and
/// GSO on every worker interface and switch port, so a veth cuts the GSO
/// packets TCP builds into frames before its peer sees them, and GRO on the
/// switch ports and, unless the star runs the XDP switch (`xdp`: its
/// redirects into a worker's veth need GRO on there), on the worker
/// interfaces. GRO does not merge xina's UDP datagrams, whose sockets do not
/// ask for it. What is left to the caller: telling xina's workers not to
/// segment ([`xina_host::Worker::set_segmentation_offload`]), and dropping
/// TCP's frames after the cut (on the switch port's ingress, not the
/// worker's egress, where they are still one packet).
///
/// Call it before any TCP connection is made on the star: a connection
/// keeps the offloads it found when it was set up.
///
/// # Errors
/// When a namespace cannot be entered or an ioctl fails.
pub fn per_frame(star: &Star, xdp: bool) -> Result<(), Error> {
    let off = |iface: &str, gro: bool| -> Result<(), ethtool::Error> {
        ethtool::set_tso(iface, false)?;
        ethtool::set_gso(iface, false)?;
        if gro {
            ethtool::set_gro(iface, false)?;
        }
        Ok(())
    };
    for w in star.workers() {
        w.ns().run(|| off(&w.iface, !xdp))??;
    }
    for port in star.ports() {
        star.switch().run(|| off(&port.name, true))??;
    }
    Ok(())
}

/// What a lossy link did in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Packets the hook saw.
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
    /// Wire frames in the packets seen (a GSO or GRO packet counts its
    /// segments): equal to `seen` when every packet was one frame.
    pub frames: u64,
    /// Wire frames in the packets dropped.
    pub frames_dropped: u64,
}

impl Counts {
    /// What both readings add up to.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            seen: self.seen + other.seen,
            dropped: self.dropped + other.dropped,
            duplicated: self.duplicated + other.duplicated,
            delayed: self.delayed + other.delayed,
            frames: self.frames + other.frames,
            frames_dropped: self.frames_dropped + other.frames_dropped,
        }
    }

    /// What happened since the reading `before`.
    #[must_use]
    pub fn since(self, before: Self) -> Self {
        Self {
            seen: self.seen - before.seen,
            dropped: self.dropped - before.dropped,
            duplicated: self.duplicated - before.duplicated,
            delayed: self.delayed - before.delayed,
            frames: self.frames - before.frames,
            frames_dropped: self.frames_dropped - before.frames_dropped,
        }
    }
}

/// A lossy link attached to one interface; detached when dropped.
pub struct LossyLink {
    ebpf: Ebpf,
    ifindex: u32,
    /// Which directions have a hook, by [`direction`] index.
    hooked: [bool; 2],
}

impl std::fmt::Debug for LossyLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossyLink")
            .field("ifindex", &self.ifindex)
            .finish_non_exhaustive()
    }
}

impl LossyLink {
    /// Attaches a lossy link to `iface` in `ns`, disturbing frames leaving it
    /// as `egress` says and frames arriving on it as `ingress` says (delays
    /// are ignored on ingress).
    ///
    /// Delayed frames leave at `slow_rate` (a `tc` rate such as `"20mbit"`):
    /// they queue once the delayed traffic exceeds it, and frames behind them
    /// overtake them. Choose it below the delayed share of the traffic (a
    /// 1 KB frame takes 0.4 ms at 20 Mbit/s); a delayed frame is lost if the
    /// slow queue overflows (`tc -s class show` counts those, the lossy
    /// link's counters do not).
    ///
    /// # Errors
    /// When the programs cannot be loaded or attached, or `tc` fails.
    pub fn attach(
        ns: &NetNs,
        iface: &str,
        egress: LinkConfig,
        ingress: LinkConfig,
        slow_rate: &str,
    ) -> Result<Self, Error> {
        Self::attach_hooks(ns, iface, [Some(egress), Some(ingress)], slow_rate)
    }

    /// Attaches only the ingress half of a lossy link to `iface` in `ns`:
    /// frames arriving on it are disturbed as `ingress` says, frames leaving
    /// it are not seen (their [`counts`](Self::counts) stay zero).
    ///
    /// # Errors
    /// As [`attach`](Self::attach).
    pub fn attach_ingress(ns: &NetNs, iface: &str, ingress: LinkConfig) -> Result<Self, Error> {
        Self::attach_hooks(ns, iface, [None, Some(ingress)], "1mbit")
    }

    /// The hooks of `configs` (by [`direction`] index) that are `Some`.
    fn attach_hooks(
        ns: &NetNs,
        iface: &str,
        configs: [Option<LinkConfig>; 2],
        slow_rate: &str,
    ) -> Result<Self, Error> {
        let [egress, ingress] = configs;
        let egress = egress.map(|e| LinkConfig {
            delay_priority: DELAY_PRIORITY,
            ..e
        });
        if egress.is_some_and(|e| e.delay_ppm != 0) {
            // The slow class that delayed frames queue in; everything else
            // goes through the fast default class.
            ns.exec(&[
                "tc", "qdisc", "add", "dev", iface, "root", "handle", "1:", "htb", "default", "1",
            ])?;
            ns.exec(&[
                "tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:1", "htb",
                "rate", "100gbit",
            ])?;
            let mut slow = vec![
                "tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:2", "htb",
            ];
            slow.extend(["rate", slow_rate]);
            slow.extend(SLOW_BURST);
            ns.exec(&slow)?;
        }
        ns.run(|| {
            let ifindex =
                netns::if_index(iface).map_err(|_| Error::NoInterface(iface.to_owned()))?;
            // Only the lossy programs and their maps are used; keep the
            // switch's slot pool from taking memory.
            let mut ebpf = EbpfLoader::new()
                .map_max_entries(xina_proto::maps::names::SLOTS, 1)
                .load(xina::dataplane::ebpf_object())
                .map_err(Error::Load)?;
            let configured = [(direction::EGRESS, egress), (direction::INGRESS, ingress)]
                .into_iter()
                .filter_map(|(dir, config)| Some((dir, config?)));
            for (dir, config) in configured {
                let key = LinkKey {
                    ifindex,
                    direction: dir,
                };
                let mut configs: HashMap<&mut MapData, LinkKey, LinkConfig> =
                    map(&mut ebpf, names::CONFIG)?;
                configs
                    .insert(key, config, 0)
                    .map_err(|source| Error::Map {
                        name: names::CONFIG,
                        source,
                    })?;
                let cpus = aya::util::nr_cpus()
                    .map_err(|(what, e)| Error::Cpus(format!("{what}: {e}")))?;
                let zero = PerCpuValues::try_from(vec![[0u64; counter::COUNT]; cpus])
                    .map_err(|e| Error::Cpus(e.to_string()))?;
                let mut counters: PerCpuHashMap<&mut MapData, LinkKey, LinkCounters> =
                    map(&mut ebpf, names::COUNTERS)?;
                counters.insert(key, zero, 0).map_err(|source| Error::Map {
                    name: names::COUNTERS,
                    source,
                })?;
            }
            let hooked = [egress.is_some(), ingress.is_some()];
            for ((name, hook), _) in PROGRAMS
                .into_iter()
                .zip([TcAttachType::Egress, TcAttachType::Ingress])
                .zip(hooked)
                .filter(|(_, on)| *on)
            {
                let program: &mut SchedClassifier = ebpf
                    .program_mut(name)
                    .ok_or(Error::Program {
                        name,
                        source: aya::programs::ProgramError::NotLoaded,
                    })?
                    .try_into()
                    .map_err(|source| Error::Program { name, source })?;
                program
                    .load()
                    .map_err(|source| Error::Program { name, source })?;
                program
                    .attach(iface, hook)
                    .map_err(|source| Error::Program { name, source })?;
            }
            Ok(Self {
                ebpf,
                ifindex,
                hooked,
            })
        })?
    }

    /// What the link did in direction `dir` ([`direction::EGRESS`] or
    /// [`direction::INGRESS`]), summed over CPUs.
    ///
    /// # Errors
    /// When the counters cannot be read.
    pub fn counts(&self, dir: u32) -> Result<Counts, Error> {
        if !self.hooked.get(dir as usize).copied().unwrap_or(false) {
            return Ok(Counts::default());
        }
        let map = self.ebpf.map(names::COUNTERS).ok_or(Error::Map {
            name: names::COUNTERS,
            source: aya::maps::MapError::InvalidName {
                name: names::COUNTERS.to_owned(),
            },
        })?;
        let counters: PerCpuHashMap<&MapData, LinkKey, LinkCounters> = PerCpuHashMap::try_from(map)
            .map_err(|source| Error::Map {
                name: names::COUNTERS,
                source,
            })?;
        let values = counters
            .get(
                &LinkKey {
                    ifindex: self.ifindex,
                    direction: dir,
                },
                0,
            )
            .map_err(|source| Error::Map {
                name: names::COUNTERS,
                source,
            })?;
        let sum = |i: usize| values.iter().map(|v| v[i]).sum();
        Ok(Counts {
            seen: sum(counter::SEEN),
            dropped: sum(counter::DROPPED),
            duplicated: sum(counter::DUPLICATED),
            delayed: sum(counter::DELAYED),
            frames: sum(counter::FRAMES),
            frames_dropped: sum(counter::FRAMES_DROPPED),
        })
    }
}

fn map<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, Error>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf.map_mut(name).ok_or(Error::Map {
        name,
        source: aya::maps::MapError::InvalidName {
            name: name.to_owned(),
        },
    })?;
    T::try_from(m).map_err(|source| Error::Map { name, source })
}

/// A symmetric configuration: the same rates for every frame (or only xina
/// frames), in parts per million.
pub fn rates(drop_ppm: u32, duplicate_ppm: u32, delay_ppm: u32, xina_only: bool) -> LinkConfig {
    LinkConfig {
        drop_ppm,
        duplicate_ppm,
        delay_ppm,
        delay_priority: DELAY_PRIORITY,
        xina_only: u32::from(xina_only),
        _pad: 0,
    }
}

/// Lossy links dropping `loss` percent of all frames, both directions, on
/// every worker link of `star`; none at 0.
///
/// By default on the worker's interface, egress and ingress. With
/// `after_cut`, the worker-to-switch direction is dropped on the switch
/// port's ingress instead: on a star whose offloads [`per_frame`]
/// turned off, that is where TCP's GSO packets arrive cut into frames.
pub fn on_star(star: &Star, loss: f64, after_cut: bool) -> Result<Vec<LossyLink>, Error> {
    if loss == 0.0 {
        return Ok(Vec::new());
    }
    // Percent to parts per million (the benches validate it below 100%).
    let drop_ppm = (loss * 10_000.0).round() as u32;
    let config = rates(drop_ppm, 0, 0, false);
    let mut links = Vec::with_capacity(2 * star.workers().len());
    for (w, port) in star.workers().iter().zip(star.ports()) {
        if after_cut {
            links.push(LossyLink::attach_ingress(w.ns(), &w.iface, config)?);
            links.push(LossyLink::attach_ingress(
                star.switch(),
                &port.name,
                config,
            )?);
        } else {
            links.push(LossyLink::attach(
                w.ns(),
                &w.iface,
                config,
                config,
                "1mbit",
            )?);
        }
    }
    Ok(links)
}

/// What all lossy links saw and dropped so far, both directions.
pub fn total(links: &[LossyLink]) -> Result<Counts, Error> {
    let mut sum = Counts::default();
    for link in links {
        for dir in [direction::EGRESS, direction::INGRESS] {
            sum = sum.plus(link.counts(dir)?);
        }
    }
    Ok(sum)
}

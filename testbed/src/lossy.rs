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

use crate::netns::{self, NetNs};

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
}

/// What a lossy link did in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub seen: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
}

/// A lossy link attached to one interface; detached when dropped.
pub struct LossyLink {
    ebpf: Ebpf,
    ifindex: u32,
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
        let egress = LinkConfig {
            delay_priority: DELAY_PRIORITY,
            ..egress
        };
        if egress.delay_ppm != 0 {
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
            for (dir, config) in [(direction::EGRESS, egress), (direction::INGRESS, ingress)] {
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
            for (name, hook) in PROGRAMS
                .into_iter()
                .zip([TcAttachType::Egress, TcAttachType::Ingress])
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
            Ok(Self { ebpf, ifindex })
        })?
    }

    /// What the link did in direction `dir` ([`direction::EGRESS`] or
    /// [`direction::INGRESS`]), summed over CPUs.
    ///
    /// # Errors
    /// When the counters cannot be read.
    pub fn counts(&self, dir: u32) -> Result<Counts, Error> {
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

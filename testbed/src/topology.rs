//! Testbed topologies built from network namespaces and veth pairs.
//!
//! [`Star`] is the one topology so far: a switch namespace whose veth ports face one
//! worker namespace each.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;

use crate::ethtool;

/// Fails the build at a named step when a unit test asks for it; nothing otherwise.
macro_rules! checkpoint {
    ($step:literal, $token:expr) => {
        #[cfg(test)]
        tests::checkpoint($step, $token)?;
    };
}
use crate::netns::{self, MAX_IFNAME_LEN, NetNs, RootLink};

/// Network of the worker addresses; every star reuses it inside its own namespaces.
pub const SUBNET: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);

/// Prefix length of [`SUBNET`].
pub const PREFIX_LEN: u8 = 24;

/// The switch's service address: the destination of every packet a worker sends to
/// the switch. No interface carries it; each worker resolves it to its own switch
/// port's MAC through a permanent neighbour entry.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);

/// The switch host's own address, on the bridge of its ports: where a job
/// service (`xina serve`) listens. Workers and the switch namespace know
/// each other's MACs through permanent neighbour entries.
pub const CONTROL_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 253);

/// Most workers a [`Star`] takes: host numbers 1 to 252 of the /24 (253 is the
/// control address, 254 the service address, 255 broadcast).
pub const MAX_WORKERS: usize = 252;

/// Most TX and RX queues a [`Star`]'s veths take (see [`StarOptions::queues`]).
pub const MAX_QUEUES: u32 = 64;

/// Address of worker `rank`: `10.77.0.(rank + 1)`.
///
/// # Panics
/// If `rank >= MAX_WORKERS`.
pub fn worker_ip(rank: usize) -> Ipv4Addr {
    assert!(rank < MAX_WORKERS, "worker rank {rank} out of range");
    let [a, b, c, _] = SUBNET.octets();
    Ipv4Addr::new(a, b, c, host_byte(rank))
}

fn host_byte(rank: usize) -> u8 {
    u8::try_from(rank + 1).expect("rank below MAX_WORKERS")
}

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The six bytes, first byte first.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// MAC of switch port `rank`: `02:78:73:00:00:(rank + 1)`, locally administered
    /// (`x`, `s` in the second and third bytes).
    fn switch_port(rank: usize) -> Self {
        Self([0x02, b'x', b's', 0, 0, host_byte(rank)])
    }

    /// MAC of the switch namespace's bridge, which carries [`CONTROL_IP`]:
    /// `02:78:62:00:00:00` (`x`, `b`).
    const fn bridge() -> Self {
        Self([0x02, b'x', b'b', 0, 0, 0])
    }

    /// MAC of worker `rank`'s interface: `02:78:77:00:00:(rank + 1)` (`x`, `w`).
    fn worker(rank: usize) -> Self {
        Self([0x02, b'x', b'w', 0, 0, host_byte(rank)])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// Errors of building or tearing down a topology.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Creating, configuring or deleting a namespace or link failed.
    #[error(transparent)]
    NetNs(#[from] netns::Error),
    /// An ethtool request failed.
    #[error(transparent)]
    Ethtool(#[from] ethtool::Error),
    /// The worker count is out of range.
    #[error("a star needs 1 to {MAX_WORKERS} workers, not {n}")]
    WorkerCount {
        /// The requested count.
        n: usize,
    },
    /// The queue count is out of range.
    #[error("a star's veths take 1 to {MAX_QUEUES} queues, not {n}")]
    QueueCount {
        /// The requested count.
        n: u32,
    },
    /// The MTU is out of range.
    #[error("a star's veths take an MTU of 68 to {MAX_MTU}, not {mtu}")]
    Mtu {
        /// The requested MTU.
        mtu: u32,
    },
    /// A generated interface name does not fit `IFNAMSIZ`.
    #[error("interface name {name:?} is longer than {MAX_IFNAME_LEN} bytes")]
    NameTooLong {
        /// The name.
        name: String,
    },
    /// An interface was not found where it was just moved.
    #[error("namespace {ns}: interface {iface} not found: {source}")]
    NoInterface {
        /// Namespace name.
        ns: String,
        /// Interface name.
        iface: String,
        /// The error of `if_nametoindex`.
        #[source]
        source: io::Error,
    },
    /// Writing a sysctl inside a namespace failed.
    #[error("namespace {ns}: cannot write {path}: {source}")]
    Sysctl {
        /// Namespace name.
        ns: String,
        /// The `/proc/sys` file.
        path: &'static str,
        /// The error of the write.
        #[source]
        source: io::Error,
    },
    /// A failure injected by a unit test.
    #[cfg(test)]
    #[error("star {token}: injected failure at {step}")]
    Injected {
        /// The star's token.
        token: String,
        /// Where the build failed.
        step: &'static str,
    },
    /// Some namespaces could not be deleted.
    #[error("teardown: {} namespaces not deleted: {}", errors.len(), join(errors))]
    Teardown {
        /// One error per namespace that could not be deleted.
        errors: Vec<netns::Error>,
    },
}

fn join(errors: &[netns::Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One switch port: the switch-side end of a worker's veth pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchPort {
    /// Interface name in the switch namespace.
    pub name: String,
    /// Interface index, unique across the star's namespaces.
    pub ifindex: u32,
    /// Its MAC, distinct per port.
    pub mac: MacAddr,
    /// Rank of the worker on the other end.
    pub worker: usize,
}

/// One worker: a namespace with one veth whose peer is a switch port.
#[derive(Debug)]
pub struct Worker {
    ns: NetNs,
    /// Rank of the worker, its index in [`Star::workers`].
    pub rank: usize,
    /// Interface name in the worker namespace.
    pub iface: String,
    /// Interface index, unique across the star's namespaces.
    pub ifindex: u32,
    /// MAC of the interface.
    pub mac: MacAddr,
    /// IPv4 address, in [`SUBNET`].
    pub ip: Ipv4Addr,
    /// Index of the switch port this worker is attached to, in [`Star::ports`].
    pub port: usize,
}

impl Worker {
    /// The worker's namespace.
    pub fn ns(&self) -> &NetNs {
        &self.ns
    }
}

/// How to build a [`Star`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StarOptions {
    /// Number of workers, 1 to [`MAX_WORKERS`].
    pub workers: usize,
    /// TX and RX queues of each veth, both ends (1 to [`MAX_QUEUES`]; `ip link
    /// add ... numtxqueues N numrxqueues N`).
    ///
    /// A veth has as many queues as it was created with (`ethtool -l` shows
    /// them as the pre-set maximum and the current count of RX and TX, no
    /// combined channels); each RX queue has its own NAPI instance, so a port
    /// can run its XDP program on several CPUs at once. Which queue a frame
    /// arrives on is the TX queue the sender's stack picked: with no XPS map
    /// that is a hash of the flow, so the frames of one UDP socket all use one
    /// queue. The queue's NAPI is scheduled on the CPU that sends (it runs
    /// in the softirq at the end of the send, or in that CPU's `ksoftirqd`),
    /// so XDP for a frame sent by a thread pinned to CPU `k` runs on CPU `k`
    /// (the testbed's `concurrency` test measures this). Frames redirected
    /// into a veth (`ndo_xdp_xmit`, the switch's results) go instead to the
    /// RX queue `cpu % queues` of the peer, `cpu` being the CPU that
    /// redirects.
    pub queues: u32,
    /// The MTU of every veth, both ends (68 to [`MAX_MTU`]; 1500 by
    /// default). Above about 3,500 bytes a frame reaches the switch's XDP
    /// program as a multi-buffer frame (its programs are frags-capable).
    pub mtu: u32,
}

/// The largest veth MTU a star takes: room for the biggest xina frame
/// (`xina_proto::frame::MAX_FRAME_PAYLOAD` plus headers).
pub const MAX_MTU: u32 = 65_000;

impl StarOptions {
    /// `workers` workers, one queue per veth, MTU 1500 (what [`Star::build`]
    /// makes).
    pub const fn new(workers: usize) -> Self {
        Self {
            workers,
            queues: 1,
            mtu: 1500,
        }
    }

    /// The same with every veth at MTU `mtu`.
    pub const fn with_mtu(self, mtu: u32) -> Self {
        Self { mtu, ..self }
    }
}

/// A switch namespace with one veth port per worker namespace.
///
/// ```text
///                       switch namespace  xina-TOKEN-sw
///   +------------------------------------------------------------------+
///   |  xsTOKEN-0          xsTOKEN-1                 xsTOKEN-(n-1)      |
///   |  02:78:73:00:00:01  02:78:73:00:00:02   ...   02:78:73:00:00:n   |
///   |  (no address)                                                    |
///   +-----+------------------+--------------------------+-------------+
///         | veth             | veth                     | veth
///   +-----+-----------+ +----+------------+       +-----+-------------+
///   | xwTOKEN-0       | | xwTOKEN-1       |  ...  | xwTOKEN-(n-1)     |
///   | 10.77.0.1/24    | | 10.77.0.2/24    |       | 10.77.0.n/24      |
///   | 02:78:77:0:0:01 | | 02:78:77:0:0:02 |       | 02:78:77:0:0:n    |
///   +-----------------+ +-----------------+       +-------------------+
///     xina-TOKEN-w0       xina-TOKEN-w1             xina-TOKEN-w(n-1)
/// ```
///
/// - Veth pairs are created in the root namespace and then moved, so every interface
///   of the star has an ifindex no other namespace of the star uses.
/// - Every veth has [`StarOptions::queues`] TX and RX queues, both ends.
/// - Switch ports are up, with no address, enslaved to a bridge `xbTOKEN`; XDP
///   programs attach there. What XDP passes (anything not xina) is bridged, so
///   workers also reach each other directly, over the same links (for
///   host-based baselines). The bridge carries [`CONTROL_IP`] (a job service
///   listens there) with permanent neighbour entries for every worker.
/// - Each worker interface is up, has `10.77.0.(rank+1)/24`, TX checksum offload off
///   and GRO on (see [`crate::ethtool`]), and permanent neighbour entries: the service
///   address [`SERVICE_IP`] maps to the MAC of the worker's own switch port,
///   [`CONTROL_IP`] to the bridge's, every other worker's address to that
///   worker's MAC. Workers therefore never send ARP.
/// - Every namespace has `lo` up and IPv6 disabled, so no router solicitations or
///   MLD reports reach the switch ports.
///
/// Dropping the star deletes all its namespaces, which removes the veths; this also
/// happens while unwinding from a panic. [`Star::teardown`] does the same and reports
/// failures. Interfaces and namespaces carry a [`netns::unique_token`], so stars built
/// concurrently by threads or processes do not collide.
#[derive(Debug)]
pub struct Star {
    token: String,
    // Declared before `switch` so they are dropped first.
    workers: Vec<Worker>,
    switch: NetNs,
    ports: Vec<SwitchPort>,
    queues: u32,
}

impl Star {
    /// Builds a star with `n_workers` workers (1 to [`MAX_WORKERS`]) and one
    /// queue per veth.
    ///
    /// On any failure everything created so far is deleted before the error returns.
    pub fn build(n_workers: usize) -> Result<Self, Error> {
        Self::build_with(StarOptions::new(n_workers))
    }

    /// Builds a star as `options` say.
    ///
    /// On any failure everything created so far is deleted before the error returns.
    pub fn build_with(options: StarOptions) -> Result<Self, Error> {
        let StarOptions {
            workers: n_workers,
            queues,
            mtu,
        } = options;
        if !(68..=MAX_MTU).contains(&mtu) {
            return Err(Error::Mtu { mtu });
        }
        let mtu_arg = mtu.to_string();
        if n_workers == 0 || n_workers > MAX_WORKERS {
            return Err(Error::WorkerCount { n: n_workers });
        }
        if queues == 0 || queues > MAX_QUEUES {
            return Err(Error::QueueCount { n: queues });
        }
        let queues_arg = queues.to_string();
        let token = netns::unique_token();
        let port_names: Vec<String> = (0..n_workers).map(|i| format!("xs{token}-{i}")).collect();
        let worker_names: Vec<String> = (0..n_workers).map(|i| format!("xw{token}-{i}")).collect();
        if let Some(name) = port_names
            .iter()
            .chain(&worker_names)
            .find(|name| name.len() > MAX_IFNAME_LEN)
        {
            return Err(Error::NameTooLong { name: name.clone() });
        }

        let switch = NetNs::create(format!("xina-{token}-sw"))?;
        prepare_namespace(&switch)?;
        let mut worker_nss = Vec::with_capacity(n_workers);
        for i in 0..n_workers {
            let ns = NetNs::create(format!("xina-{token}-w{i}"))?;
            prepare_namespace(&ns)?;
            worker_nss.push(ns);
        }
        checkpoint!("namespaces", &token);

        // Veth pairs: created in the root namespace, then moved.
        for (i, ns) in worker_nss.iter().enumerate() {
            let (port, iface) = (&port_names[i], &worker_names[i]);
            let (port_mac, worker_mac) = (
                MacAddr::switch_port(i).to_string(),
                MacAddr::worker(i).to_string(),
            );
            let port_link = RootLink::create(
                port,
                &[
                    "link",
                    "add",
                    port,
                    "address",
                    &port_mac,
                    "mtu",
                    &mtu_arg,
                    "numtxqueues",
                    &queues_arg,
                    "numrxqueues",
                    &queues_arg,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    iface,
                    "address",
                    &worker_mac,
                    "mtu",
                    &mtu_arg,
                    "numtxqueues",
                    &queues_arg,
                    "numrxqueues",
                    &queues_arg,
                ],
            )?;
            if i + 1 == n_workers {
                checkpoint!("veth created", &token);
            }
            let iface_link = RootLink::adopt(iface);
            port_link.move_to(&switch)?;
            if i + 1 == n_workers {
                checkpoint!("port moved", &token);
            }
            iface_link.move_to(ns)?;
        }

        // Switch ports: up, no address, bridged, so that traffic that is not
        // xina (which the XDP program passes to the kernel) is switched
        // between workers like on any Ethernet switch.
        let bridge = format!("xb{token}");
        let bridge_mac = MacAddr::bridge().to_string();
        switch.ip(&[
            "link",
            "add",
            "name",
            &bridge,
            "address",
            &bridge_mac,
            "type",
            "bridge",
        ])?;
        for port in &port_names {
            switch.ip(&["link", "set", "dev", port, "master", &bridge])?;
            switch.ip(&["link", "set", "dev", port, "up"])?;
        }
        switch.ip(&["link", "set", "dev", &bridge, "up"])?;
        switch.ip(&[
            "addr",
            "add",
            &format!("{CONTROL_IP}/{PREFIX_LEN}"),
            "dev",
            &bridge,
        ])?;
        for j in 0..n_workers {
            add_neighbour(
                &switch,
                &bridge,
                worker_ip(j),
                &MacAddr::worker(j).to_string(),
            )?;
        }
        let port_indexes = if_indexes(&switch, &port_names)?;

        // Workers: address, offloads, up, then neighbours (an admin-down flushes them).
        let mut workers = Vec::with_capacity(n_workers);
        for (i, ns) in worker_nss.into_iter().enumerate() {
            let iface = &worker_names[i];
            let ip = worker_ip(i);
            ns.ip(&["addr", "add", &format!("{ip}/{PREFIX_LEN}"), "dev", iface])?;
            ns.run(|| -> Result<(), ethtool::Error> {
                ethtool::set_tx_checksum(iface, false)?;
                ethtool::set_gro(iface, true)
            })??;
            ns.ip(&["link", "set", "dev", iface, "up"])?;
            let service_mac = MacAddr::switch_port(i).to_string();
            add_neighbour(&ns, iface, SERVICE_IP, &service_mac)?;
            add_neighbour(&ns, iface, CONTROL_IP, &bridge_mac)?;
            for j in (0..n_workers).filter(|&j| j != i) {
                add_neighbour(&ns, iface, worker_ip(j), &MacAddr::worker(j).to_string())?;
            }
            let ifindex = if_indexes(&ns, std::slice::from_ref(iface))?[0];
            if i + 1 == n_workers {
                checkpoint!("worker configured", &token);
            }
            workers.push(Worker {
                ns,
                rank: i,
                iface: iface.clone(),
                ifindex,
                mac: MacAddr::worker(i),
                ip,
                port: i,
            });
        }

        let ports = port_names
            .into_iter()
            .zip(port_indexes)
            .enumerate()
            .map(|(i, (name, ifindex))| SwitchPort {
                name,
                ifindex,
                mac: MacAddr::switch_port(i),
                worker: i,
            })
            .collect();
        let star = Self {
            token,
            workers,
            switch,
            ports,
            queues,
        };
        log::info!("built star {}", star.token);
        Ok(star)
    }

    /// The unique token in every name of this star.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// TX and RX queues of each veth ([`StarOptions::queues`]).
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The switch namespace.
    pub fn switch(&self) -> &NetNs {
        &self.switch
    }

    /// The switch ports; port `i` faces worker `i`.
    pub fn ports(&self) -> &[SwitchPort] {
        &self.ports
    }

    /// Switch port `i`.
    ///
    /// # Panics
    /// If `i` is not below the number of workers.
    pub fn port(&self, i: usize) -> &SwitchPort {
        &self.ports[i]
    }

    /// The workers, by rank.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// Worker `rank`.
    ///
    /// # Panics
    /// If `rank` is not below the number of workers.
    pub fn worker(&self, rank: usize) -> &Worker {
        &self.workers[rank]
    }

    /// The namespace of worker `rank`.
    ///
    /// # Panics
    /// If `rank` is not below the number of workers.
    pub fn worker_ns(&self, rank: usize) -> &NetNs {
        self.workers[rank].ns()
    }

    /// The switch host's own address, [`CONTROL_IP`], on its ports' bridge.
    pub fn control_ip(&self) -> Ipv4Addr {
        CONTROL_IP
    }

    /// The switch's service address, [`SERVICE_IP`].
    pub fn service_ip(&self) -> Ipv4Addr {
        SERVICE_IP
    }

    /// Makes the switch ports accept XDP redirects again, after XDP programs
    /// were attached to them.
    ///
    /// A veth only takes frames redirected by XDP (`ndo_xdp_xmit`) while its
    /// peer runs an XDP program or has GRO enabled, and the kernel records
    /// that as an `xdp_features` flag on the port. Attaching an XDP program to
    /// a switch port recomputes the port's flags and, on Linux 6.18, leaves
    /// `NDO_XMIT` off even though the worker end has GRO on, so every redirect
    /// to the port fails with `EOPNOTSUPP`. Toggling GRO on the (up) worker
    /// end sets the flag on its peer again. Call this after the switch is
    /// attached; it is harmless to call more than once.
    ///
    /// # Errors
    /// When a worker namespace cannot be entered or the ioctl fails.
    pub fn refresh_redirect_targets(&self) -> Result<(), Error> {
        for w in &self.workers {
            w.ns.run(|| -> Result<(), ethtool::Error> {
                ethtool::set_gro(&w.iface, false)?;
                ethtool::set_gro(&w.iface, true)
            })??;
        }
        Ok(())
    }

    /// The switch ports that have an XDP program attached, as `ip -d link
    /// show` lists them in the switch namespace.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn ports_with_xdp(&self) -> Result<Vec<String>, Error> {
        let links = self.switch.ip(&["-d", "link", "show"])?;
        Ok(self
            .ports
            .iter()
            .filter(|p| {
                links
                    .lines()
                    .any(|l| l.contains(&format!(" {}@", p.name)) && l.contains(" xdp"))
            })
            .map(|p| p.name.clone())
            .collect())
    }

    /// Names of all the star's namespaces, switch first.
    pub fn namespaces(&self) -> Vec<&str> {
        std::iter::once(self.switch.name())
            .chain(self.workers.iter().map(|w| w.ns.name()))
            .collect()
    }

    /// Deletes every namespace of the star (and so every veth), reporting failures.
    ///
    /// Dropping the star does the same but only logs failures.
    pub fn teardown(self) -> Result<(), Error> {
        let Self {
            token,
            workers,
            switch,
            ports: _,
            queues: _,
        } = self;
        let errors: Vec<netns::Error> = workers
            .into_iter()
            .map(|w| w.ns)
            .chain(std::iter::once(switch))
            .filter_map(|ns| ns.delete().err())
            .collect();
        if errors.is_empty() {
            log::info!("tore down star {token}");
            Ok(())
        } else {
            Err(Error::Teardown { errors })
        }
    }
}

impl fmt::Display for Star {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "star {}: switch namespace {}, service address {}, {} queue(s) per veth",
            self.token,
            self.switch.name(),
            SERVICE_IP,
            self.queues
        )?;
        for (port, worker) in self.ports.iter().zip(&self.workers) {
            writeln!(
                f,
                "  port {:<15} #{:<4} {}  <->  {:<15} #{:<4} {}  {:<15} in {}",
                port.name,
                port.ifindex,
                port.mac,
                worker.iface,
                worker.ifindex,
                worker.mac,
                worker.ip,
                worker.ns.name()
            )?;
        }
        Ok(())
    }
}

/// Brings `lo` up and disables IPv6 in a fresh namespace (before any veth moves in,
/// so moved interfaces take the namespace's default).
fn prepare_namespace(ns: &NetNs) -> Result<(), Error> {
    ns.ip(&["link", "set", "dev", "lo", "up"])?;
    ns.run(|| -> Result<(), Error> {
        for path in [
            "/proc/sys/net/ipv6/conf/all/disable_ipv6",
            "/proc/sys/net/ipv6/conf/default/disable_ipv6",
        ] {
            // Network sysctls act on the writing thread's namespace.
            match std::fs::write(path, "1") {
                // A kernel without IPv6 has nothing to disable.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::Sysctl {
                        ns: ns.name().to_owned(),
                        path,
                        source,
                    });
                }
                Ok(()) => {}
            }
        }
        Ok(())
    })?
}

/// Looks up interface indexes inside `ns`.
fn if_indexes(ns: &NetNs, names: &[String]) -> Result<Vec<u32>, Error> {
    ns.run(|| {
        names
            .iter()
            .map(|name| {
                netns::if_index(name).map_err(|source| Error::NoInterface {
                    ns: ns.name().to_owned(),
                    iface: name.clone(),
                    source,
                })
            })
            .collect()
    })?
}

fn add_neighbour(ns: &NetNs, iface: &str, ip: Ipv4Addr, mac: &str) -> Result<(), Error> {
    ns.ip(&[
        "neigh",
        "replace",
        &ip.to_string(),
        "lladdr",
        mac,
        "dev",
        iface,
        "nud",
        "permanent",
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Build failures at each step leave nothing behind. Needs root.

    use std::cell::Cell;

    use super::*;

    thread_local! {
        static FAIL_AT: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    pub(super) fn checkpoint(step: &'static str, token: &str) -> Result<(), Error> {
        if FAIL_AT.get() == Some(step) {
            return Err(Error::Injected {
                token: token.to_owned(),
                step,
            });
        }
        Ok(())
    }

    #[test]
    fn failed_build_leaves_nothing() {
        for step in [
            "namespaces",
            "veth created",
            "port moved",
            "worker configured",
        ] {
            FAIL_AT.set(Some(step));
            let result = Star::build(2);
            FAIL_AT.set(None);
            let token = match result {
                Err(Error::Injected { token, step: at }) if at == step => token,
                other => panic!("{step}: expected the injected failure, got {other:?}"),
            };
            let namespaces = netns::ip(&["netns", "list"]).unwrap();
            assert!(!namespaces.contains(&token), "{step}: {namespaces}");
            let links = netns::ip(&["-o", "link", "show"]).unwrap();
            assert!(!links.contains(&token), "{step}: {links}");
        }
    }

    #[test]
    fn worker_count_is_checked() {
        assert!(matches!(Star::build(0), Err(Error::WorkerCount { n: 0 })));
        assert!(matches!(
            Star::build(MAX_WORKERS + 1),
            Err(Error::WorkerCount { .. })
        ));
    }

    #[test]
    fn queue_count_is_checked() {
        for n in [0, MAX_QUEUES + 1] {
            let options = StarOptions {
                mtu: 1500,
                queues: n,
                ..StarOptions::new(2)
            };
            assert!(
                matches!(Star::build_with(options), Err(Error::QueueCount { n: m }) if m == n),
                "{n} queues"
            );
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(worker_ip(0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(worker_ip(MAX_WORKERS - 1), Ipv4Addr::new(10, 77, 0, 252));
        assert_eq!(MacAddr::switch_port(2).to_string(), "02:78:73:00:00:03");
        assert_eq!(MacAddr::worker(0).to_string(), "02:78:77:00:00:01");
    }
}

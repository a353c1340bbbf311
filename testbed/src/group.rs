//! Multicast groups on a star: the XDP switch with one group of every
//! worker, lossy links if asked, and a [`GroupWorker`] per rank, kept from
//! call to call so that broadcasts and allgathers can follow each other.

use std::net::SocketAddrV4;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use xina::{Counters, Dataplane, JobSpec, MemberSpec, dataplane::Mode};
use xina_host::{Config, GroupParams, GroupWorker, Stats};
use xina_proto::{DType, Op, XINA_UDP_PORT};

use crate::lossy::LossyLink;
use crate::scenario::{self, Loss};
use crate::topology::Star;

/// The group's id on the switch.
pub const GROUP_ID: u32 = 60;
/// The UDP port group members bind in their namespaces.
pub const MEMBER_PORT: u16 = 5100;

/// The group and its members.
#[derive(Clone, Copy, Debug)]
pub struct GroupSpec {
    /// Slots per rank: each sender's window.
    pub window: u32,
    /// Most payload bytes per packet.
    pub bytes_per_packet: u16,
    /// The members' give-up time.
    pub give_up: Duration,
    /// Loss on every worker link, both directions.
    pub loss: Option<Loss>,
}

impl Default for GroupSpec {
    fn default() -> Self {
        Self {
            window: 128,
            bytes_per_packet: 1440,
            give_up: Duration::from_secs(5),
            loss: None,
        }
    }
}

/// The switch config of a star with no job: ports and a pool large enough
/// for a group of every worker.
pub(crate) fn switch_config(star: &Star, spec: &GroupSpec) -> String {
    let ports: Vec<String> = star
        .ports()
        .iter()
        .map(|p| format!("{:?}", p.name))
        .collect();
    let need = spec.window * star.workers().len() as u32;
    let pool = need.max(xina_proto::maps::DEFAULT_SLOT_POOL);
    format!(
        "[switch]\nports = [{}]\nslot_pool = {pool}\n",
        ports.join(", ")
    )
}

/// The group of every worker of `star`, each a sender.
pub fn group_spec(star: &Star, spec: &GroupSpec) -> JobSpec {
    let members = star
        .workers()
        .iter()
        .map(|w| {
            let port = star.port(w.port);
            MemberSpec {
                rank: u8::try_from(w.rank).expect("at most 64 workers"),
                ip: w.ip,
                udp_port: MEMBER_PORT,
                mac: w.mac.0,
                ifindex: port.ifindex,
                port_mac: port.mac.0,
                sender: true,
                down: false,
            }
        })
        .collect::<Vec<_>>();
    JobSpec {
        id: GROUP_ID,
        op: Op::Sum,
        dtype: DType::Bytes,
        mode: Mode::Multicast,
        elems_per_packet: spec.bytes_per_packet,
        slot_base: 0,
        slot_count: spec.window * members.len() as u32,
        members,
    }
}

/// What one collective call did on every rank.
#[derive(Debug)]
pub struct CallOutcome {
    /// Each rank's buffer after the call.
    pub bufs: Vec<Vec<u8>>,
    /// Each rank's outcome (the error as text).
    pub results: Vec<Result<Stats, String>>,
    /// When the ranks passed the start barrier (the latest of them).
    pub start: Instant,
    /// When each rank's call returned.
    pub finish: Vec<Instant>,
}

impl CallOutcome {
    /// From the start to the slowest receiver's return: the broadcast's
    /// time, which does not include the root waiting for the last
    /// acknowledgements.
    pub fn received_by_all(&self, root: u8) -> Duration {
        self.finish
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != usize::from(root))
            .map(|(_, f)| f.saturating_duration_since(self.start))
            .max()
            .unwrap_or_default()
    }

    /// From the start to the slowest rank's return.
    pub fn elapsed(&self) -> Duration {
        self.finish
            .iter()
            .map(|f| f.saturating_duration_since(self.start))
            .max()
            .unwrap_or_default()
    }
}

/// A switch with one group over a star, and its members.
pub struct GroupRig<'s> {
    star: &'s Star,
    dp: Dataplane,
    links: Vec<LossyLink>,
    /// `None` for a rank whose member was handed to a [`Victim`] process.
    workers: Vec<Option<GroupWorker>>,
    spec: GroupSpec,
}

/// A receiver run as its own process (`xina-testbed group-member`) and
/// killed with `SIGKILL` once the switch has delivered it `after_copies`
/// data copies.
#[derive(Clone, Debug)]
pub struct Victim {
    pub rank: usize,
    pub after_copies: u64,
    /// The `xina-testbed` executable.
    pub exe: std::path::PathBuf,
}

impl<'s> GroupRig<'s> {
    /// Brings the switch up on `star`, installs the group, attaches the
    /// lossy links and binds every member.
    ///
    /// # Errors
    /// When any of it fails; what was set up is undone by dropping.
    pub fn start(star: &'s Star, spec: &GroupSpec) -> anyhow::Result<Self> {
        let mut dp = scenario::start_switch(star, &switch_config(star, spec))?;
        dp.install_job(&group_spec(star, spec))
            .context("installing the group")?;
        let links = match spec.loss {
            Some(loss) => scenario::attach_lossy_links(star, loss)?,
            None => Vec::new(),
        };
        let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
        let fan_in = u8::try_from(star.workers().len()).expect("at most 64 workers");
        let config = Config {
            give_up: spec.give_up,
            ..Config::default()
        };
        let workers = star
            .workers()
            .iter()
            .map(|w| {
                let params = GroupParams {
                    group: GROUP_ID,
                    rank: u8::try_from(w.rank).expect("at most 64 workers"),
                    fan_in,
                    bytes_per_packet: spec.bytes_per_packet,
                    window: spec.window,
                    switch,
                };
                let bind = SocketAddrV4::new(w.ip, MEMBER_PORT);
                // The socket belongs to the namespace it is made in, whatever
                // thread uses it later.
                w.ns()
                    .run(|| GroupWorker::new(params, bind, config))
                    .with_context(|| format!("entering worker {}'s namespace", w.rank))?
                    .with_context(|| format!("binding rank {}", w.rank))
                    .map(Some)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            star,
            dp,
            links,
            workers,
            spec: *spec,
        })
    }

    /// The dataplane.
    pub const fn dataplane(&self) -> &Dataplane {
        &self.dp
    }

    /// The group's counters.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn counters(&self) -> anyhow::Result<Counters> {
        Ok(self.dp.job_counters(GROUP_ID)?)
    }

    /// Data copies the switch delivered to each rank so far.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn copies(&self) -> anyhow::Result<Vec<u64>> {
        Ok(self.dp.member_packets(GROUP_ID)?)
    }

    /// Frames the lossy links dropped so far, all links and both directions.
    ///
    /// # Errors
    /// When a link's counters cannot be read.
    pub fn dropped(&self) -> anyhow::Result<u64> {
        Ok(crate::lossy::total(&self.links)?.dropped)
    }

    /// Broadcasts `data` from `root` to every other rank.
    pub fn broadcast(&mut self, root: u8, data: &[u8]) -> CallOutcome {
        let bufs = self.broadcast_buffers(root, data);
        self.call(bufs, &move |w, buf| w.broadcast(root, buf), None)
    }

    fn broadcast_buffers(&self, root: u8, data: &[u8]) -> Vec<Vec<u8>> {
        (0..self.workers.len())
            .map(|r| {
                if r == usize::from(root) {
                    data.to_vec()
                } else {
                    vec![0; data.len()]
                }
            })
            .collect()
    }

    /// Broadcasts `data` from `root` while `victim` receives as its own
    /// process, killed midway; returns the others' outcomes and what
    /// happened to the victim. The victim's rank stays dead in this rig.
    ///
    /// # Errors
    /// When the process cannot be started or is not killed as planned.
    pub fn broadcast_with_victim(
        &mut self,
        root: u8,
        data: &[u8],
        victim: &Victim,
    ) -> anyhow::Result<(CallOutcome, String)> {
        if victim.rank == usize::from(root) || victim.rank >= self.workers.len() {
            bail!(
                "rank {} cannot be the victim of a broadcast from {root}",
                victim.rank
            );
        }
        // Its socket goes, so the process can bind the same address.
        self.workers[victim.rank] = None;
        let bufs = self.broadcast_buffers(root, data);
        let mut fate = None;
        let outcome = self.call(
            bufs,
            &move |w, buf| w.broadcast(root, buf),
            Some((victim, root, data.len(), &mut fate)),
        );
        let fate = fate.unwrap_or_else(|| Err(anyhow::anyhow!("the victim was not run")))?;
        Ok((outcome, fate))
    }

    /// Allgathers: rank `r` starts with part `r` of `data` in place.
    ///
    /// # Errors
    /// When `data` does not split into one part per rank.
    pub fn allgather(&mut self, data: &[u8]) -> anyhow::Result<CallOutcome> {
        let n = self.workers.len();
        if !data.len().is_multiple_of(n) {
            bail!("{} bytes do not split into {n} parts", data.len());
        }
        let part = data.len() / n;
        let bufs = (0..n)
            .map(|r| {
                let mut buf = vec![0; data.len()];
                buf[r * part..(r + 1) * part].copy_from_slice(&data[r * part..(r + 1) * part]);
                buf
            })
            .collect();
        Ok(self.call(bufs, &|w, buf| w.allgather(buf), None))
    }

    /// Runs `op` on every member at once, from a common start.
    fn call(
        &mut self,
        mut bufs: Vec<Vec<u8>>,
        op: &MemberCall,
        victim: Option<VictimRun<'_>>,
    ) -> CallOutcome {
        let ranks = self.workers.len();
        let running = self.workers.iter().filter(|w| w.is_some()).count();
        let barrier = Barrier::new(running + usize::from(victim.is_some()));
        let barrier = &barrier;
        let star = self.star;
        let dp = &self.dp;
        let spec = self.spec;
        let out: Vec<(Result<Stats, String>, Instant, Instant)> = std::thread::scope(|scope| {
            let victim_thread = victim.map(|(v, root, len, fate)| {
                scope.spawn(move || {
                    *fate = Some(run_victim(star, dp, &spec, v, root, len, || {
                        barrier.wait();
                    }));
                })
            });
            let handles: Vec<_> = self
                .workers
                .iter_mut()
                .zip(bufs.iter_mut())
                .map(|(w, buf)| {
                    w.as_mut().map(|w| {
                        scope.spawn(move || {
                            barrier.wait();
                            let start = Instant::now();
                            let r = op(w, buf).map_err(|e| e.to_string());
                            (r, start, Instant::now())
                        })
                    })
                })
                .collect();
            let out = handles
                .into_iter()
                .map(|h| match h {
                    Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    None => {
                        let now = Instant::now();
                        (Err("not running in this process".to_owned()), now, now)
                    }
                })
                .collect();
            if let Some(t) = victim_thread {
                t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
            out
        });
        debug_assert_eq!(out.len(), ranks);
        let start = out.iter().map(|o| o.1).max().unwrap_or_else(Instant::now);
        CallOutcome {
            bufs,
            results: out.iter().map(|o| o.0.clone()).collect(),
            start,
            finish: out.iter().map(|o| o.2).collect(),
        }
    }

    /// The star the rig runs on.
    pub const fn star(&self) -> &Star {
        self.star
    }
}

/// One member's part of a collective call.
type MemberCall = dyn Fn(&mut GroupWorker, &mut [u8]) -> Result<Stats, xina_host::Error> + Sync;

/// The victim, the root, the length, and where its fate goes.
type VictimRun<'a> = (
    &'a Victim,
    u8,
    usize,
    &'a mut Option<anyhow::Result<String>>,
);

/// Runs the victim's process, passes the start barrier once it is ready,
/// and kills it when the switch has delivered it `after_copies` copies.
fn run_victim(
    star: &Star,
    dp: &Dataplane,
    spec: &GroupSpec,
    victim: &Victim,
    root: u8,
    len: usize,
    ready: impl FnOnce(),
) -> anyhow::Result<String> {
    let w = star.worker(victim.rank);
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", w.ns().name()])
        .arg(&victim.exe)
        .args([
            "group-member",
            "--rank",
            &victim.rank.to_string(),
            "--fan-in",
            &star.workers().len().to_string(),
            "--bytes-per-packet",
            &spec.bytes_per_packet.to_string(),
            "--window",
            &spec.window.to_string(),
            "--root",
            &root.to_string(),
            "--len",
            &len.to_string(),
            "--switch",
            &switch.to_string(),
            "--bind",
            &SocketAddrV4::new(w.ip, MEMBER_PORT).to_string(),
        ]);
    let copies = || Ok(dp.member_packets(GROUP_ID)?[victim.rank]);
    scenario::kill_when(
        cmd,
        &format!("rank {}", victim.rank),
        ready,
        copies,
        (victim.after_copies, "copies had arrived"),
        spec.give_up * 4,
    )
}

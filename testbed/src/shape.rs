//! Shaped links, for the link-bound regime of the benchmarks: every worker
//! link limited to the same rate in both directions, as in a cluster where
//! each worker has a NIC of its own, so that links and not the shared CPUs
//! bound a run.
//!
//! A token bucket (`tbf`) is the root qdisc of both ends of every worker's
//! veth: the worker's interface shapes what it sends, the switch port (or,
//! on a plain star, the bridge port) what the worker receives. A qdisc only
//! sees skbs: frames an XDP program redirects into a veth (`XDP_REDIRECT`
//! through a devmap: the narrow path's results and the wide path's replies
//! from a slot) bypass it. The wide path's results leave through the tc
//! fan-out program's clones (`bpf_clone_redirect` to a port's egress),
//! which do pass it, so the link-bound regime measures xina with frames
//! above 1,500 bytes only.
//!
//! The bucket holds two 64 KB frames (a GSO skb larger than the bucket
//! would be cut into MTU-sized segments by `tbf`), and the queue behind it
//! 50 ms of traffic (at least 4 MiB), so a window of 64 KB datagrams waits
//! rather than being dropped. [`link_bytes`] reads what each qdisc sent, so
//! that a benchmark can show the rate held.

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::{netns::NetNs, topology::Star};

/// The highest rate [`shape`] takes, Mbit/s (above it the shared CPUs, not
/// the links, bound every run on this kind of machine).
pub const MAX_RATE_MBIT: u32 = 100_000;

/// Bytes of the token bucket: two of the largest frames.
const BURST_BYTES: u64 = 2 * 65_536;

/// Checks a rate for runs at link MTUs `frames`, naming the problem.
///
/// # Errors
/// When the rate is out of range, or a frame is 1,500 bytes (the narrow
/// path's results leave the switch by XDP redirect, which bypasses the
/// shaper).
pub fn check_rate(mbit: u32, mut frames: impl Iterator<Item = u32>) -> anyhow::Result<()> {
    ensure!(
        (1..=MAX_RATE_MBIT).contains(&mbit),
        "rate: {mbit} Mbit/s (must be 1..={MAX_RATE_MBIT})"
    );
    ensure!(
        frames.all(|f| f > 1500),
        "rate: needs frames above 1500 (at 1500 xina's results leave the switch by XDP \
         redirect, which bypasses the shaper)"
    );
    Ok(())
}

/// Bytes sent through the shaper of one worker link so far, each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkBytes {
    /// By the worker (its interface's qdisc).
    pub from_worker: u64,
    /// To the worker (the qdisc of the port on the other end).
    pub to_worker: u64,
}

/// Shapes both directions of every worker link of `star` to `mbit` Mbit/s.
///
/// # Errors
/// When the rate is out of range or `tc` fails (the error names the
/// interface).
pub fn shape(star: &Star, mbit: u32) -> anyhow::Result<()> {
    ensure!(
        (1..=MAX_RATE_MBIT).contains(&mbit),
        "rate: {mbit} Mbit/s (must be 1..={MAX_RATE_MBIT})"
    );
    let bytes_per_s = u64::from(mbit) * 1_000_000 / 8;
    let limit = (bytes_per_s / 20).max(4 << 20);
    let (rate, burst, limit) = (
        format!("{mbit}mbit"),
        BURST_BYTES.to_string(),
        limit.to_string(),
    );
    let args = |dev: &str| {
        [
            "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", &burst,
            "limit", &limit,
        ]
        .map(str::to_owned)
    };
    for (w, port) in links(star) {
        w.ns()
            .exec(&args(&w.iface))
            .with_context(|| format!("shaping {} (worker {})", w.iface, w.rank))?;
        port.0
            .exec(&args(port.1))
            .with_context(|| format!("shaping {} (worker {}'s port)", port.1, w.rank))?;
    }
    log::info!(
        "star {}: every worker link shaped to {mbit} Mbit/s",
        star.token()
    );
    Ok(())
}

/// What the shapers of `star` have sent so far, per worker link in rank
/// order.
///
/// # Errors
/// When `tc` fails or its output has no `tbf` root qdisc.
pub fn link_bytes(star: &Star) -> anyhow::Result<Vec<LinkBytes>> {
    links(star)
        .map(|(w, (ns, port))| {
            Ok(LinkBytes {
                from_worker: sent(w.ns(), &w.iface)?,
                to_worker: sent(ns, port)?,
            })
        })
        .collect()
}

/// The highest rate any one link direction carried between `before` and
/// `after`, taken `seconds` apart, in Mbit/s.
pub fn busiest_mbit(before: &[LinkBytes], after: &[LinkBytes], seconds: f64) -> f64 {
    before
        .iter()
        .zip(after)
        .flat_map(|(b, a)| {
            [
                a.from_worker.saturating_sub(b.from_worker),
                a.to_worker.saturating_sub(b.to_worker),
            ]
        })
        .map(|bytes| bytes as f64 * 8.0 / seconds / 1e6)
        .fold(0.0, f64::max)
}

/// Every worker with the namespace and name of the port on the other end
/// of its link.
fn links(star: &Star) -> impl Iterator<Item = (&crate::topology::Worker, (&NetNs, &str))> {
    star.workers()
        .iter()
        .map(|w| (w, (star.switch(), star.port(w.port).name.as_str())))
}

/// Bytes the root `tbf` of `dev` in `ns` has sent (`tc -s -j qdisc show`).
fn sent(ns: &NetNs, dev: &str) -> anyhow::Result<u64> {
    let out = ns
        .exec(&["tc", "-s", "-j", "qdisc", "show", "dev", dev])
        .with_context(|| format!("reading the qdisc of {dev}"))?;
    let qdiscs: Value =
        serde_json::from_str(&out).with_context(|| format!("parsing tc's output for {dev}"))?;
    qdiscs
        .as_array()
        .into_iter()
        .flatten()
        .find(|q| q["kind"] == "tbf" && q["root"] == true)
        .and_then(|q| q["bytes"].as_u64())
        .with_context(|| format!("{dev} has no tbf root qdisc with a byte count: {out}"))
}

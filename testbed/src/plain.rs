//! The plain star: the topology the host-based baselines run on.
//!
//! A [`Star`] built with the same [`StarOptions`] as the one the XDP switch
//! runs on (the same namespaces, veths, bridge, addresses and neighbour
//! entries), but with no XDP program attached anywhere, and with the worker
//! interfaces' TX checksum offload back on (the XDP star turns it off
//! because an XDP forwarder cannot complete a partial checksum; without it
//! the veth also loses TCP segmentation offload).
//!
//! Why the baselines need their own star: a veth whose peer runs an XDP
//! program cannot take GSO packets, so on the XDP star every TCP segment of
//! up to 64 KB is cut to 1,500-byte frames before it enters the veth and
//! each one is bridged on its own. A cluster that runs MPI instead of xina
//! has no XDP on the path, so the baselines, and Open MPI
//! ([`crate::mpi`]), are measured where TCP keeps its 64 KB segments. Both
//! stars exist for the whole sweep of a worker count, so the benches still
//! interleave implementations repetition by repetition.

use std::io;

use crate::{
    ethtool,
    netns::NetNs,
    topology::{self, Star, StarOptions},
};

/// What the benches' `path` field says of an implementation that crosses
/// the XDP switch's ports.
pub const XDP_PATH: &str = "xdp switch";

/// What the benches' `path` field says of an implementation that runs on a
/// plain star.
pub const PLAIN_PATH: &str = "plain star";

/// Builds a plain star as `options` say: a [`Star`] on which nothing
/// attaches XDP, with TX checksum offload (and so TSO) on every worker
/// interface, and TCP's slow start after idle off in every worker
/// namespace.
///
/// On any failure everything created so far is deleted before the error
/// returns (the star is dropped).
///
/// # Errors
/// When the star cannot be built or an offload cannot be set.
pub fn build(options: StarOptions) -> Result<Star, topology::Error> {
    let star = Star::build_with(options)?;
    for w in star.workers() {
        w.ns().run(|| ethtool::set_tx_checksum(&w.iface, true))??;
        // The baselines' TCP connections idle between repetitions while the
        // other implementations run; by default TCP then starts again from
        // its initial window (a cold 64 MiB Open MPI allreduce at 8 workers:
        // 686 ms, 612 with this off), which a cluster tuned for collectives
        // turns off.
        // Network sysctls act on the writing thread's namespace.
        let path = "/proc/sys/net/ipv4/tcp_slow_start_after_idle";
        w.ns()
            .run(|| std::fs::write(path, "0"))?
            .map_err(|source| topology::Error::Sysctl {
                ns: w.ns().name().to_owned(),
                path,
                source,
            })?;
    }
    log::info!(
        "star {} is plain: no XDP, TX offloads on, no slow start after idle",
        star.token()
    );
    Ok(star)
}

/// TCP segments retransmitted so far in `ns` (`RetransSegs` of
/// `/proc/net/snmp`, a counter of the whole namespace).
///
/// # Errors
/// When the namespace cannot be entered or the file not read or parsed.
pub fn tcp_retrans_segs(ns: &NetNs) -> io::Result<u64> {
    let text = ns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/snmp"))
        .map_err(io::Error::other)??;
    parse_retrans_segs(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: no Tcp RetransSegs in /proc/net/snmp", ns.name()),
        )
    })
}

/// `RetransSegs` of the `Tcp:` lines (a header line of names, then one of
/// values).
fn parse_retrans_segs(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "RetransSegs")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// [`tcp_retrans_segs`] summed over every worker namespace of `star`.
///
/// # Errors
/// As [`tcp_retrans_segs`].
pub fn star_retrans_segs(star: &Star) -> io::Result<u64> {
    star.workers()
        .iter()
        .map(|w| tcp_retrans_segs(w.ns()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrans_segs_is_found_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\n\
                    Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(parse_retrans_segs(snmp), Some(17));
        assert_eq!(parse_retrans_segs("Udp: InDatagrams\nUdp: 5\n"), None);
    }
}

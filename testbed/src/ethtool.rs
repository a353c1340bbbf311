//! Offload switches through the legacy `SIOCETHTOOL` ioctl (no `ethtool` binary needed).
//!
//! Every function acts on the network namespace of the calling thread: call them
//! inside [`NetNs::run`](crate::netns::NetNs::run) for an interface of a namespace.
//!
//! Two switches matter to the testbed's veth interfaces:
//! - TX checksum offload off, so the kernel writes complete UDP checksums instead of
//!   leaving a partial checksum for "hardware" that an XDP program forwarding the frame
//!   cannot complete;
//! - GRO on, because a veth only accepts frames that XDP redirects into its peer when
//!   the receiving end has GRO enabled or an XDP program attached (Linux >= 5.13).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ETHTOOL_GTXCSUM`: get TX checksum offload.
const ETHTOOL_GTXCSUM: u32 = 0x16;
/// `ETHTOOL_STXCSUM`: set TX checksum offload.
const ETHTOOL_STXCSUM: u32 = 0x17;
/// `ETHTOOL_STSO`: set TCP segmentation offload.
const ETHTOOL_STSO: u32 = 0x1f;
/// `ETHTOOL_SGSO`: set generic segmentation offload.
const ETHTOOL_SGSO: u32 = 0x24;
/// `ETHTOOL_GGRO`: get generic receive offload.
const ETHTOOL_GGRO: u32 = 0x2b;
/// `ETHTOOL_SGRO`: set generic receive offload.
const ETHTOOL_SGRO: u32 = 0x2c;

/// `struct ethtool_value` from `<linux/ethtool.h>`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// An ethtool request that failed.
#[derive(Debug, thiserror::Error)]
#[error("{iface}: ethtool {op}: {source}")]
pub struct Error {
    /// Interface name.
    pub iface: String,
    /// The operation, e.g. `set tx-checksumming`.
    pub op: &'static str,
    /// The error of the socket or the ioctl.
    #[source]
    pub source: io::Error,
}

/// Sends one `ethtool_value` command for `iface`; returns the `data` the kernel wrote back.
fn value_ioctl(iface: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name must be 1 to 15 bytes without NUL",
        ));
    }
    // SAFETY: socket takes no pointers; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, valid descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };

    let mut value = EthtoolValue { cmd, data };
    // SAFETY: `ifreq` is plain old data (bytes, integers, a raw pointer) for which all
    // zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in request.ifr_name.iter_mut().zip(name) {
        *dst = src.cast_signed();
    }
    request.ifr_ifru.ifru_data = (&raw mut value).cast();
    // SAFETY: `request` names the interface (NUL-terminated: zeroed tail) and points at
    // `value`, a valid `ethtool_value` that outlives the call; the kernel reads and
    // writes only those two objects.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &raw mut request) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data)
}

fn get(iface: &str, cmd: u32, op: &'static str) -> Result<bool, Error> {
    value_ioctl(iface, cmd, 0)
        .map(|data| data != 0)
        .map_err(|source| Error {
            iface: iface.to_owned(),
            op,
            source,
        })
}

fn set(iface: &str, cmd: u32, on: bool, op: &'static str) -> Result<(), Error> {
    value_ioctl(iface, cmd, u32::from(on))
        .map(drop)
        .map_err(|source| Error {
            iface: iface.to_owned(),
            op,
            source,
        })
}

/// Whether TX checksum offload (`tx-checksumming` in `ethtool -k`) is on.
pub fn tx_checksum(iface: &str) -> Result<bool, Error> {
    get(iface, ETHTOOL_GTXCSUM, "get tx-checksumming")
}

/// Turns TX checksum offload on or off (`ethtool -K IFACE tx on|off`).
///
/// Turning it off also turns off the offloads that depend on it, such as TSO.
pub fn set_tx_checksum(iface: &str, on: bool) -> Result<(), Error> {
    set(iface, ETHTOOL_STXCSUM, on, "set tx-checksumming")
}

/// Whether generic receive offload is on.
pub fn gro(iface: &str) -> Result<bool, Error> {
    get(iface, ETHTOOL_GGRO, "get generic-receive-offload")
}

/// Turns generic receive offload on or off (`ethtool -K IFACE gro on|off`).
pub fn set_gro(iface: &str, on: bool) -> Result<(), Error> {
    set(iface, ETHTOOL_SGRO, on, "set generic-receive-offload")
}

/// Turns TCP segmentation offload on or off (`ethtool -K IFACE tso on|off`).
pub fn set_tso(iface: &str, on: bool) -> Result<(), Error> {
    set(iface, ETHTOOL_STSO, on, "set tcp-segmentation-offload")
}

/// Turns generic segmentation offload on or off (`ethtool -K IFACE gso on|off`).
///
/// With TSO and GSO off, TCP sockets routed through the interface build one
/// packet per segment; UDP sockets that ask for segmentation themselves
/// (`UDP_SEGMENT`) still hand the interface's queue packets of many frames,
/// which the kernel cuts later, in software.
pub fn set_gso(iface: &str, on: bool) -> Result<(), Error> {
    set(iface, ETHTOOL_SGSO, on, "set generic-segmentation-offload")
}

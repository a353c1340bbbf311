//! Interface lookups in the calling thread's network namespace.

use std::{ffi::CString, io, mem::MaybeUninit};

/// The index of interface `name`, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// The name of the interface with index `ifindex`, if it exists.
pub fn name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes the call may write.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let c = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(c.to_string_lossy().into_owned())
}

/// The MAC address the neighbour (ARP) table holds for `ip` on interface
/// `ifname`, in the calling process's network namespace.
pub fn neighbour(ip: std::net::Ipv4Addr, ifname: &str) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    parse_arp(&table, ip, ifname)
}

/// Finds a complete entry (flag 0x2) in `/proc/net/arp` text.
fn parse_arp(table: &str, ip: std::net::Ipv4Addr, ifname: &str) -> Option<[u8; 6]> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, _hw_type, flags, mac, _mask, dev] = f[..] else {
            return None;
        };
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        (addr.parse() == Ok(ip) && dev == ifname && flags & 0x2 != 0)
            .then(|| crate::config::parse_mac(mac))
            .flatten()
    })
}

/// The MTU of interface `name`.
///
/// # Errors
/// When the interface does not exist.
pub fn mtu(name: &str) -> io::Result<u32> {
    let mut req = ifreq(name)?;
    ioctl(libc::SIOCGIFMTU, &mut req, name)?;
    // SAFETY: after a successful SIOCGIFMTU the union holds `ifru_mtu`.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(u32::try_from(mtu).unwrap_or(0))
}

/// An `ifreq` naming `name`.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} is too long"),
        ));
    }
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { MaybeUninit::zeroed().assume_init() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

/// Runs interface ioctl `request` on `req` through a throwaway socket.
fn ioctl(request: libc::c_ulong, req: &mut libc::ifreq, name: &str) -> io::Result<()> {
    // SAFETY: plain socket creation; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the interface ioctls read `ifr_name` and write the union of a
    // properly sized `ifreq` that outlives the call.
    let rc = unsafe { libc::ioctl(fd, request, std::ptr::from_mut(req)) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(io::Error::new(
            err.kind(),
            format!("interface {name}: {err}"),
        ));
    }
    Ok(())
}

/// The MAC address of interface `name`.
///
/// # Errors
/// When the name is too long, the interface does not exist or has no
/// Ethernet address.
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    let mut req = ifreq(name)?;
    ioctl(libc::SIOCGIFHWADDR, &mut req, name)?;
    // SAFETY: after a successful SIOCGIFHWADDR the union holds `ifru_hwaddr`.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut out = [0u8; 6];
    for (o, d) in out.iter_mut().zip(data.iter()) {
        *o = *d as u8;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn arp_table_lines() {
        let t = "IP address       HW type     Flags       HW address            Mask     Device\n\
                 10.0.0.2         0x1         0x2         02:00:00:00:00:02     *        sp0\n\
                 10.0.0.3         0x1         0x0         00:00:00:00:00:00     *        sp1\n";
        let ip = |s: &str| s.parse().unwrap();
        assert_eq!(
            super::parse_arp(t, ip("10.0.0.2"), "sp0"),
            Some([2, 0, 0, 0, 0, 2])
        );
        assert_eq!(super::parse_arp(t, ip("10.0.0.2"), "sp1"), None);
        assert_eq!(
            super::parse_arp(t, ip("10.0.0.3"), "sp1"),
            None,
            "incomplete"
        );
    }

    #[test]
    fn loopback_exists_and_unknown_does_not() {
        assert_eq!(super::ifindex("lo"), Some(1));
        assert_eq!(super::ifindex("xina-nope0"), None);
        assert_eq!(super::mac("lo").unwrap(), [0; 6]);
        assert!(super::mac("xina-nope0").is_err());
    }
}

//! Interface lookups in the calling thread's network namespace.

use std::{ffi::CString, io, mem::MaybeUninit};

/// The index of interface `name`, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// The MAC address of interface `name`.
///
/// # Errors
/// When the name is too long, the interface does not exist or has no
/// Ethernet address.
pub fn mac(name: &str) -> io::Result<[u8; 6]> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} is too long"),
        ));
    }
    // SAFETY: plain socket creation; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { MaybeUninit::zeroed().assume_init() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR reads `ifr_name` and writes `ifr_hwaddr` of a
    // properly sized `ifreq` that outlives the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(io::Error::new(
            err.kind(),
            format!("interface {name}: {err}"),
        ));
    }
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
    fn loopback_exists_and_unknown_does_not() {
        assert_eq!(super::ifindex("lo"), Some(1));
        assert_eq!(super::ifindex("xina-nope0"), None);
        assert_eq!(super::mac("lo").unwrap(), [0; 6]);
        assert!(super::mac("xina-nope0").is_err());
    }
}

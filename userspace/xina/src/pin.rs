//! Where a switch lives in bpffs, and the pins' life cycle.
//!
//! A switch named `NAME` is pinned under `ROOT/NAME/` (`ROOT` defaults to
//! [`DEFAULT_ROOT`]):
//!
//! ```text
//! /sys/fs/bpf/xina/NAME/
//! ├── maps/JOBS, MEMBERS, PORT_MEMBERS, SLOTS, PORTS, COUNTERS,
//! │        JOB_COUNTERS, PORT_COUNTERS, PORT_INDEX, AGGREGATE, SCRATCH,
//! │        MEMBER_PACKETS, UNITS, WIDE_SCRATCH, AYA_LOGS
//! ├── progs/xina_switch, xina_egress
//! └── links/IFNAME:IFINDEX:MODE   one XDP bpf_link per port (MODE: native | generic)
//!     links/IFNAME:IFINDEX:tc     and the fan-out program's TCX link
//! ```
//!
//! Everything the control plane needs after a restart is in these pins: the
//! jobs, their slot ranges and counter blocks are entries of `JOBS`, the
//! members of `MEMBERS`, the ports of `PORT_INDEX` and `links/`. There is no
//! side file. The pinned `AGGREGATE` program array keeps its tail-call
//! entries (the kernel clears a program array when its last user reference
//! goes away, and a pin is one); the `PORTS` devmap entries hold the egress
//! program; the pinned links hold the switch program on each port.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use aya::programs::{XdpMode, links::PinnedLink};
use xina_proto::maps::{names, programs};

/// Where bpffs is normally mounted.
pub const BPFFS: &str = "/sys/fs/bpf";
/// The default directory of xina's switches, one subdirectory each.
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/xina";
/// The default switch name.
pub const DEFAULT_SWITCH: &str = "xina0";
/// `statfs` magic of a bpffs mount.
const BPF_FS_MAGIC: libc::__fsword_t = 0xcafe_4a11;

/// The maps that are pinned (the others are private to the programs, which
/// hold them: the test-run egress ifindex, globals). `SCRATCH` is private
/// too, but pinned so that after `xina switch upgrade` old and new programs
/// hand contributions over through the same per-CPU scratch.
pub const MAPS: [&str; 14] = [
    names::JOBS,
    names::MEMBERS,
    names::PORT_MEMBERS,
    names::SLOTS,
    names::PORTS,
    names::COUNTERS,
    names::JOB_COUNTERS,
    names::PORT_COUNTERS,
    names::PORT_INDEX,
    names::AGGREGATE,
    names::SCRATCH,
    names::MEMBER_PACKETS,
    names::UNITS,
    names::WIDE_SCRATCH,
];

/// aya-log's ring buffer of the dataplane's log records, pinned too, so a
/// restarted daemon reads them (`maps/AYA_LOGS`).
pub const LOGS: &str = "AYA_LOGS";

/// The programs that are pinned (the aggregation programs and the group
/// program are held by the pinned `AGGREGATE` array).
pub const PROGRAMS: [&str; 2] = [programs::SWITCH, programs::EGRESS];

/// A switch's pin directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinDir {
    name: String,
    path: PathBuf,
}

/// A pinned port link, as found in `links/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkPin {
    pub ifname: String,
    pub ifindex: u32,
    pub mode: XdpMode,
    pub path: PathBuf,
}

impl PinDir {
    /// The directory of switch `name` under `root`.
    ///
    /// # Errors
    /// A name that is empty, longer than 64 bytes, or has characters other
    /// than ASCII letters, digits, `-`, `_` and `.` (or is `.`/`..`).
    pub fn new(root: impl Into<PathBuf>, name: &str) -> Result<Self, String> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !ok {
            return Err(format!(
                "switch name {name:?}: use 1 to 64 of A-Z a-z 0-9 - _ ."
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            path: root.into().join(name),
        })
    }

    /// The switch's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ROOT/NAME`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether anything is pinned there.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    pub fn maps(&self) -> PathBuf {
        self.path.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }

    pub fn progs(&self) -> PathBuf {
        self.path.join("progs")
    }

    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs().join(name)
    }

    pub fn links(&self) -> PathBuf {
        self.path.join("links")
    }

    /// The pin of the link of `ifname` (index `ifindex`): `IFNAME:IFINDEX:MODE`
    /// (`:` cannot occur in interface names). The name and index are kept
    /// so that any process, in any network namespace, can say which port
    /// it is.
    pub fn link(&self, ifname: &str, ifindex: u32, mode: XdpMode) -> PathBuf {
        self.links()
            .join(format!("{ifname}:{ifindex}:{}", mode_name(mode)))
    }

    /// The pin of the fan-out program's TCX link on `ifname`:
    /// `IFNAME:IFINDEX:tc`, beside the port's XDP link.
    pub fn tc_link(&self, ifname: &str, ifindex: u32) -> PathBuf {
        self.links().join(format!("{ifname}:{ifindex}:tc"))
    }

    /// The pinned XDP links, sorted by interface name.
    ///
    /// # Errors
    /// When `links/` cannot be read.
    pub fn link_pins(&self) -> io::Result<Vec<LinkPin>> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(self.links()) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in dir {
            let entry = entry?;
            let file = entry.file_name().to_string_lossy().into_owned();
            let mut parts = file.split(':');
            let (Some(ifname), Some(ifindex), Some(mode), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let mode = match mode {
                "native" => XdpMode::Driver,
                "generic" => XdpMode::Skb,
                _ => continue,
            };
            let Ok(ifindex) = ifindex.parse() else {
                continue;
            };
            out.push(LinkPin {
                ifname: ifname.to_owned(),
                ifindex,
                mode,
                path: entry.path(),
            });
        }
        out.sort_by(|a, b| a.ifname.cmp(&b.ifname));
        Ok(out)
    }

    /// Takes an exclusive lock on the switch directory until the returned
    /// file is dropped, so two `xina` commands do not change one switch at
    /// the same time.
    ///
    /// # Errors
    /// When the directory cannot be opened or locked.
    pub fn lock(&self) -> io::Result<File> {
        let f = File::open(&self.path)?;
        // SAFETY: flock on a descriptor we own; it is released when `f` closes.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    /// The switches pinned under `root`, by name.
    ///
    /// # Errors
    /// When `root` exists but cannot be read.
    pub fn list(root: &Path) -> io::Result<Vec<Self>> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(root) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in dir {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Ok(p) = Self::new(root, &name) {
                out.push(p);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// How `xina` names an XDP mode: `native` (driver) or `generic` (skb).
pub fn mode_name(mode: XdpMode) -> &'static str {
    match mode {
        XdpMode::Skb => "generic",
        _ => "native",
    }
}

/// Removes the link pinned at `path`: the port is detached as soon as no
/// process holds the link any more.
///
/// # Errors
/// When the pin cannot be opened or removed.
pub fn unpin_link(path: &Path) -> io::Result<()> {
    let link = PinnedLink::from_pin(path).map_err(io::Error::other)?;
    drop(link.unpin()?);
    Ok(())
}

/// Removes the fan-out program's filter from the clsact qdisc of `ifname`
/// (in this thread's network namespace), if it has one: the fan-out
/// attachment of a switch on a kernel without TCX, which has no link to
/// unpin. Nothing to remove is no error.
pub fn detach_fanout_filter(ifname: &str) -> io::Result<()> {
    use aya::programs::{TcAttachType, tc};
    match tc::qdisc_detach_program(ifname, TcAttachType::Ingress, programs::FANOUT) {
        Ok(()) => Ok(()),
        Err(tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::other(e)),
    }
}

/// What [`remove`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Interfaces whose link was unpinned.
    pub links: Vec<String>,
}

/// Removes switch `dir`: unpins every link (detaching the ports), then
/// every map and program pin, then the directory. Works on a partly
/// pinned switch too (after a failed `up`).
///
/// # Errors
/// The first failure; whatever could be removed is.
pub fn remove(dir: &PinDir) -> io::Result<Removed> {
    let mut removed = Removed::default();
    let mut first_error = None;
    for link in dir.link_pins()? {
        // Not an error for the removal: the port may be gone already.
        if !dir.tc_link(&link.ifname, link.ifindex).exists()
            && let Err(e) = detach_fanout_filter(&link.ifname)
        {
            log::warn!("removing the fan-out filter of {}: {e}", link.ifname);
        }
        match unpin_link(&link.path) {
            Ok(()) => removed.links.push(link.ifname),
            Err(e) => {
                first_error.get_or_insert(io::Error::new(
                    e.kind(),
                    format!("unpinning {}: {e}", link.path.display()),
                ));
            }
        }
    }
    if let Err(e) = std::fs::remove_dir_all(dir.path())
        && e.kind() != io::ErrorKind::NotFound
    {
        first_error.get_or_insert(io::Error::new(
            e.kind(),
            format!("removing {}: {e}", dir.path().display()),
        ));
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

/// Makes sure `root` is on a bpffs, mounting one at [`BPFFS`] when `root`
/// lies under it and nothing is mounted there; creates `root`.
///
/// # Errors
/// When `root` is not on a bpffs and cannot be, or cannot be created.
pub fn ensure_bpffs(root: &Path) -> io::Result<()> {
    let bpffs = Path::new(BPFFS);
    if root.starts_with(bpffs) && !is_bpffs(bpffs)? {
        let src = c"bpf";
        let target = c"/sys/fs/bpf";
        // SAFETY: NUL-terminated static strings; no mount data.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mounting bpffs at {BPFFS}: {e}"),
            ));
        }
        log::info!("mounted bpffs at {BPFFS}");
    }
    std::fs::create_dir_all(root)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", root.display())))?;
    if !is_bpffs(root)? {
        return Err(io::Error::other(format!(
            "{} is not on a bpffs (mount -t bpf bpf DIR)",
            root.display()
        )));
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `statfs` is plain old data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` outlives the call.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::NotFound {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(st.f_type == BPF_FS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        let d = PinDir::new("/sys/fs/bpf/xina", "sw-1.a").unwrap();
        assert_eq!(
            d.map("JOBS"),
            Path::new("/sys/fs/bpf/xina/sw-1.a/maps/JOBS")
        );
        assert_eq!(
            d.link("eth0.100", 7, XdpMode::Skb),
            Path::new("/sys/fs/bpf/xina/sw-1.a/links/eth0.100:7:generic")
        );
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(PinDir::new("/r", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bpffs_is_recognised() {
        assert!(!is_bpffs(Path::new("/proc")).unwrap());
        assert!(!is_bpffs(Path::new("/nonexistent/xina")).unwrap());
    }
}

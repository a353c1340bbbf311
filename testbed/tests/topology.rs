//! Namespace and star-topology tests with real interfaces and traffic.
//!
//! They need root (`CAP_NET_ADMIN` and `CAP_SYS_ADMIN`) and iproute2; `ethtool` is
//! used to cross-check the offload settings. Each test builds its own uniquely named
//! namespaces, so the tests run in parallel threads and alongside other test
//! processes. Every wait is bounded.
//!
//! ```text
//!              switch namespace (no addresses)
//!     +-------------------------------------------+
//!     |  port 0         port 1         port 2     |
//!     +----+--------------+--------------+--------+
//!          | veth         | veth         | veth
//!     +----+-----+   +----+-----+   +----+-----+
//!     | worker 0 |   | worker 1 |   | worker 2 |
//!     | 10.77.0.1|   | 10.77.0.2|   | 10.77.0.3|
//!     +----------+   +----------+   +----------+
//!     worker -> 10.77.0.254 (service address) = MAC of its own switch port
//! ```

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader};
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{self, AssertUnwindSafe};
use std::process::{Child, Command, Stdio};
use std::sync::{Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use xina_testbed::ethtool;
use xina_testbed::netns::{self, NetNs};
use xina_testbed::topology::{MacAddr, SERVICE_IP, Star};

/// UDP port used by the traffic tests.
const PORT: u16 = 19_860;

/// How long a test waits for a frame or a child process.
const TIMEOUT: Duration = Duration::from_secs(10);

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the namespace tests need root");
}

/// Namespaces currently listed by `ip netns list`.
fn listed_namespaces() -> BTreeSet<String> {
    netns::ip(&["netns", "list"])
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Interface names in the root namespace that contain `token`.
fn root_links_with(token: &str) -> Vec<String> {
    netns::ip(&["-o", "link", "show"])
        .unwrap()
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .filter(|name| name.contains(token))
        .map(str::to_owned)
        .collect()
}

/// Asserts that nothing of the star with `token` and namespaces `names` is left.
fn assert_gone(token: &str, names: &[String]) {
    let listed = listed_namespaces();
    for name in names {
        assert!(!listed.contains(name), "namespace {name} is left");
        assert!(
            !netns::registered_namespaces().contains(name),
            "namespace {name} is still registered"
        );
    }
    assert!(!listed.iter().any(|n| n.contains(token)), "{listed:?}");
    let links = root_links_with(token);
    assert!(links.is_empty(), "root namespace links left: {links:?}");
}

fn owned_names(star: &Star) -> Vec<String> {
    star.namespaces().into_iter().map(str::to_owned).collect()
}

// ---------------------------------------------------------------------------
// NetNs
// ---------------------------------------------------------------------------

/// `run` and `spawn` execute in the namespace, and not on the caller's thread;
/// `exec` reports failures with the command and its standard error.
#[test]
fn netns_run_spawn_exec() {
    require_root();
    let ns = NetNs::create_unique("xina-test").unwrap();
    assert!(listed_namespaces().contains(ns.name()));

    let ns_inode = std::fs::metadata(ns.path()).unwrap();
    let own_ns = || std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let before = own_ns();
    let inside = ns.run(own_ns).unwrap();
    assert_eq!(
        inside.to_string_lossy(),
        format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&ns_inode))
    );
    assert_ne!(inside, before);
    assert_eq!(own_ns(), before, "run moved the caller's thread");

    // A fresh namespace holds only `lo`.
    assert_eq!(ns.run(|| netns::if_index("lo").unwrap()).unwrap(), 1);
    let links = ns.exec(&["ip", "-o", "link", "show"]).unwrap();
    assert_eq!(links.lines().count(), 1, "{links}");

    // `run` can borrow from the caller.
    let name = String::from("lo");
    assert!(ns.run(|| netns::if_index(&name).is_ok()).unwrap());

    let handle = ns.spawn(own_ns).unwrap();
    assert_eq!(handle.join().unwrap(), inside);

    let err = ns
        .exec(&["sh", "-c", "echo something broke >&2; exit 3"])
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, netns::Error::Failed { .. }), "{message}");
    assert!(message.contains("something broke"), "{message}");
    assert!(message.contains("netns exec"), "{message}");

    let err = netns::ip(&["link", "show", "dev", "xina-no-such-if"]).unwrap_err();
    assert!(err.to_string().contains("xina-no-such-if"), "{err}");

    // A second namespace with the same name is refused and the first is untouched.
    assert!(NetNs::create(ns.name()).is_err());
    assert!(listed_namespaces().contains(ns.name()));

    let name = ns.name().to_owned();
    ns.delete().unwrap();
    assert!(!listed_namespaces().contains(&name));
}

/// A panic inside `run` reaches the caller with its payload, and dropping the guard
/// during the unwind deletes the namespace.
#[test]
fn netns_panic_in_run_propagates_and_cleans_up() {
    require_root();
    let mut name = String::new();
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        let ns = NetNs::create_unique("xina-test").unwrap();
        name = ns.name().to_owned();
        ns.run(|| panic!("boom in namespace")).unwrap();
    }));
    let payload = result.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom in namespace"));
    assert!(!name.is_empty());
    assert!(!listed_namespaces().contains(&name));
}

// ---------------------------------------------------------------------------
// Star: wiring
// ---------------------------------------------------------------------------

/// Every interface sits in its namespace with the right address, MAC, neighbours
/// and offloads; nothing of the star is in the root namespace.
#[test]
fn star_of_three_is_wired() {
    require_root();
    let star = Star::build(3).unwrap();
    println!("{star}");
    let names = owned_names(&star);
    let token = star.token().to_owned();
    assert_eq!(names.len(), 4);
    let listed = listed_namespaces();
    for name in &names {
        assert!(listed.contains(name), "{name} not in {listed:?}");
    }
    assert!(root_links_with(&token).is_empty());
    assert_eq!(star.service_ip(), SERVICE_IP);

    let mut ifindexes = BTreeSet::new();
    let mut macs = BTreeSet::new();
    for (i, port) in star.ports().iter().enumerate() {
        assert_eq!(port.worker, i);
        let link = star
            .switch()
            .ip(&["-o", "link", "show", "dev", &port.name])
            .unwrap();
        assert!(
            link.starts_with(&format!("{}: {}@", port.ifindex, port.name)),
            "{link}"
        );
        assert!(link.contains(&format!("link/ether {}", port.mac)), "{link}");
        assert!(link.contains(",UP,LOWER_UP>"), "{link}");
        let addrs = star
            .switch()
            .ip(&["-o", "addr", "show", "dev", &port.name])
            .unwrap();
        assert!(
            addrs.trim().is_empty(),
            "switch port has addresses: {addrs}"
        );
        assert!(ifindexes.insert(port.ifindex));
        assert!(macs.insert(port.mac));
    }

    for (i, worker) in star.workers().iter().enumerate() {
        assert_eq!((worker.rank, worker.port), (i, i));
        assert_eq!(
            worker.ip,
            Ipv4Addr::new(10, 77, 0, u8::try_from(i + 1).unwrap())
        );
        let ns = star.worker_ns(i);
        assert_eq!(ns.name(), worker.ns().name());

        let link = ns
            .ip(&["-o", "link", "show", "dev", &worker.iface])
            .unwrap();
        assert!(
            link.starts_with(&format!("{}: {}@", worker.ifindex, worker.iface)),
            "{link}"
        );
        assert!(
            link.contains(&format!("link/ether {}", worker.mac)),
            "{link}"
        );
        assert!(link.contains(",UP,LOWER_UP>"), "{link}");
        let lo = ns.ip(&["-o", "link", "show", "dev", "lo"]).unwrap();
        assert!(lo.contains(",UP,"), "{lo}");

        let v4 = ns
            .ip(&["-o", "-4", "addr", "show", "dev", &worker.iface])
            .unwrap();
        assert!(v4.contains(&format!("inet {}/24", worker.ip)), "{v4}");
        let v6 = ns.ip(&["-o", "-6", "addr", "show"]).unwrap();
        assert!(v6.trim().is_empty(), "IPv6 addresses: {v6}");
        // The other end of the pair is in the switch namespace, not here.
        let peer = &star.port(worker.port).name;
        assert!(ns.ip(&["link", "show", "dev", peer]).is_err());
        assert!(ifindexes.insert(worker.ifindex));
        assert!(macs.insert(worker.mac));

        let neighbours = ns.ip(&["neigh", "show", "dev", &worker.iface]).unwrap();
        let service = format!("{SERVICE_IP} lladdr {} PERMANENT", star.port(i).mac);
        assert!(neighbours.contains(&service), "{neighbours}");
        for other in star.workers().iter().filter(|w| w.rank != i) {
            let entry = format!("{} lladdr {} PERMANENT", other.ip, other.mac);
            assert!(neighbours.contains(&entry), "{neighbours}");
        }

        let features = ns.exec(&["ethtool", "-k", &worker.iface]).unwrap();
        assert!(features.contains("\ntx-checksumming: off"), "{features}");
        assert!(
            features.contains("\ngeneric-receive-offload: on"),
            "{features}"
        );
        let (tx, gro) = ns
            .run(|| {
                (
                    ethtool::tx_checksum(&worker.iface).unwrap(),
                    ethtool::gro(&worker.iface).unwrap(),
                )
            })
            .unwrap();
        assert!(!tx && gro);
    }

    // The switch ports keep the veth defaults.
    let port = &star.port(0).name;
    let tx = star
        .switch()
        .run(|| ethtool::tx_checksum(port).unwrap())
        .unwrap();
    assert!(tx, "switch port tx checksumming should be untouched");

    star.teardown().unwrap();
    assert_gone(&token, &names);
}

/// The offload setters change what `ethtool -k` reports.
#[test]
fn ethtool_ioctls_toggle_features() {
    require_root();
    let star = Star::build(1).unwrap();
    let worker = star.worker(0);
    let ns = worker.ns();
    let iface = worker.iface.as_str();
    ns.run(|| {
        ethtool::set_tx_checksum(iface, true).unwrap();
        ethtool::set_gro(iface, false).unwrap();
    })
    .unwrap();
    let features = ns.exec(&["ethtool", "-k", iface]).unwrap();
    assert!(features.contains("\ntx-checksumming: on"), "{features}");
    assert!(
        features.contains("\ngeneric-receive-offload: off"),
        "{features}"
    );
    let err = ns
        .run(|| ethtool::gro("xina-no-such"))
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("xina-no-such"), "{err}");
}

// ---------------------------------------------------------------------------
// Star: traffic
// ---------------------------------------------------------------------------

/// `PACKET_OUTGOING` from `<linux/if_packet.h>`.
const PACKET_OUTGOING: u8 = 4;

/// Opens an `AF_PACKET` socket on `ifindex` in the calling thread's namespace.
fn packet_socket(ifindex: u32) -> io::Result<OwnedFd> {
    let protocol = u16::try_from(libc::ETH_P_ALL).unwrap().to_be();
    // SAFETY: socket takes no pointers; the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(protocol),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap();
    addr.sll_protocol = protocol;
    addr.sll_ifindex = i32::try_from(ifindex).unwrap();
    let len = u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap();
    // SAFETY: `addr` is a valid sockaddr_ll of `len` bytes for the duration of the call.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    let len = u32::try_from(size_of::<libc::timeval>()).unwrap();
    // SAFETY: `timeout` is a valid timeval of `len` bytes for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Receives incoming frames until one satisfies `wanted` or `TIMEOUT` passes.
fn capture(fd: &OwnedFd, wanted: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = vec![0u8; 2048];
    while Instant::now() < deadline {
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap();
        // SAFETY: `buf` is writable for `buf.len()` bytes and `from` for `from_len`
        // bytes; both outlive the call.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &raw mut from_len,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            let err = io::Error::last_os_error();
            assert!(
                matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ),
                "recvfrom: {err}"
            );
            continue;
        };
        if from.sll_pkttype != PACKET_OUTGOING && wanted(&buf[..n]) {
            return Some(buf[..n].to_vec());
        }
    }
    None
}

/// Sums 16-bit big-endian words in one's complement arithmetic.
fn ones_complement_sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for pair in &mut chunks {
        acc += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// A parsed Ethernet / IPv4 / UDP frame.
struct UdpFrame<'a> {
    dst_mac: MacAddr,
    src_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    dst_port: u16,
    udp: &'a [u8],
    payload: &'a [u8],
}

fn parse_udp(frame: &[u8]) -> Option<UdpFrame<'_>> {
    let mac = |at: usize| MacAddr(frame[at..at + 6].try_into().unwrap());
    if frame.len() < 14 + 20 + 8 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[9] != 17 || ip.len() < ihl + 8 {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([ip[ihl + 4], ip[ihl + 5]]));
    let udp = ip.get(ihl..ihl + udp_len)?;
    Some(UdpFrame {
        dst_mac: mac(0),
        src_mac: mac(6),
        src_ip: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst_ip: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        dst_port: u16::from_be_bytes([udp[2], udp[3]]),
        udp,
        payload: &udp[8..],
    })
}

/// Whether the UDP checksum is present and complete (pseudo-header included).
fn udp_checksum_ok(frame: &UdpFrame<'_>) -> bool {
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&frame.src_ip.octets());
    pseudo.extend_from_slice(&frame.dst_ip.octets());
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&u16::try_from(frame.udp.len()).unwrap().to_be_bytes());
    let field = u16::from_be_bytes([frame.udp[6], frame.udp[7]]);
    field != 0 && ones_complement_sum(ones_complement_sum(0, &pseudo), frame.udp) == 0xffff
}

/// A datagram from worker `i` to the service address arrives at switch port `i`
/// (and only there), addressed to that port's MAC, with a complete UDP checksum.
#[test]
fn udp_to_service_address_reaches_own_switch_port() {
    require_root();
    let star = Star::build(3).unwrap();
    // Sockets stay in the namespace they were created in.
    let ports: Vec<u32> = star.ports().iter().map(|p| p.ifindex).collect();
    let sockets: Vec<OwnedFd> = star
        .switch()
        .run(|| {
            ports
                .iter()
                .map(|&i| packet_socket(i))
                .collect::<io::Result<_>>()
        })
        .unwrap()
        .unwrap();

    for rank in [0, 1] {
        let worker = star.worker(rank);
        let payload = format!("hello from worker {rank}, padded to be odd-length!");
        worker
            .ns()
            .run(|| -> io::Result<()> {
                let socket = UdpSocket::bind((worker.ip, 0))?;
                socket.send_to(payload.as_bytes(), (SERVICE_IP, PORT))?;
                Ok(())
            })
            .unwrap()
            .unwrap();

        let ours = |frame: &[u8]| {
            parse_udp(frame).is_some_and(|f| f.dst_port == PORT && f.payload == payload.as_bytes())
        };
        let frame = capture(&sockets[rank], ours)
            .unwrap_or_else(|| panic!("no datagram from worker {rank} on its switch port"));
        let udp = parse_udp(&frame).unwrap();
        assert_eq!(udp.dst_mac, star.port(rank).mac);
        assert_eq!(udp.src_mac, worker.mac);
        assert_eq!(udp.src_ip, worker.ip);
        assert_eq!(udp.dst_ip, SERVICE_IP);
        assert!(udp_checksum_ok(&udp), "UDP checksum is not complete");
    }
    // Nothing reached the port of the worker that sent nothing.
    let any_udp = |frame: &[u8]| parse_udp(frame).is_some_and(|f| f.dst_port == PORT);
    assert!(
        capture_briefly(&sockets[2], any_udp).is_none(),
        "port 2 saw a datagram"
    );

    let (token, names) = (star.token().to_owned(), owned_names(&star));
    drop(sockets);
    drop(star);
    assert_gone(&token, &names);
}

/// Like [`capture`] but gives up after half a second.
fn capture_briefly(fd: &OwnedFd, wanted: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut buf = vec![0u8; 2048];
    while Instant::now() < deadline {
        // SAFETY: `buf` is writable for `buf.len()` bytes for the duration of the call.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if let Ok(n) = usize::try_from(n)
            && wanted(&buf[..n])
        {
            return Some(buf[..n].to_vec());
        }
    }
    None
}

// ---------------------------------------------------------------------------
// Star: cleanup
// ---------------------------------------------------------------------------

/// Dropping a star removes its namespaces and leaves no veth in the root namespace.
#[test]
fn drop_removes_everything() {
    require_root();
    let star = Star::build(2).unwrap();
    let (token, names) = (star.token().to_owned(), owned_names(&star));
    let listed = listed_namespaces();
    assert!(names.iter().all(|n| listed.contains(n)));
    for name in &names {
        assert!(netns::registered_namespaces().contains(name));
    }
    drop(star);
    assert_gone(&token, &names);
}

/// A panic inside a namespace closure while the star is alive still tears it down.
#[test]
fn panic_while_alive_cleans_up() {
    require_root();
    let mut seen = None;
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        let star = Star::build(2).unwrap();
        seen = Some((star.token().to_owned(), owned_names(&star)));
        star.worker_ns(1)
            .run(|| panic!("worker closure failed"))
            .unwrap();
    }));
    assert!(result.is_err());
    let (token, names) = seen.expect("the star was built");
    assert_gone(&token, &names);
}

/// Stars built at the same time from several threads get distinct names and all work.
#[test]
fn concurrent_stars_do_not_collide() {
    require_root();
    const THREADS: usize = 3;
    let barrier = Barrier::new(THREADS);
    let built: Vec<(String, Vec<String>, u32)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let star = Star::build(2).unwrap();
                    // All stars are alive at once here.
                    barrier.wait();
                    let listed = listed_namespaces();
                    assert!(star.namespaces().iter().all(|n| listed.contains(*n)));
                    let port = star.port(1);
                    let index = star
                        .switch()
                        .run(|| netns::if_index(&port.name).unwrap())
                        .unwrap();
                    assert_eq!(index, port.ifindex);
                    let seen = (
                        star.token().to_owned(),
                        owned_names(&star),
                        star.worker(0).ifindex,
                    );
                    barrier.wait();
                    star.teardown().unwrap();
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let tokens: BTreeSet<&str> = built.iter().map(|(t, ..)| t.as_str()).collect();
    assert_eq!(tokens.len(), THREADS);
    let all: BTreeSet<&String> = built.iter().flat_map(|(_, n, _)| n).collect();
    assert_eq!(all.len(), THREADS * 3);
    for (token, names, _) in &built {
        assert_gone(token, names);
    }
}

// ---------------------------------------------------------------------------
// Signal cleanup
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "XINA_TEST_SIGNAL_CHILD";
const CHILD_MARK: &str = "XINA-STAR";

/// Helper for [`sigterm_deletes_everything`]: when started by it, builds a star,
/// prints its names, and waits to be killed. Otherwise does nothing.
#[test]
fn signal_cleanup_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    netns::install_signal_cleanup().unwrap();
    netns::install_signal_cleanup().unwrap();
    let star = Star::build(2).unwrap();
    println!(
        "{CHILD_MARK} {} {}",
        star.token(),
        star.namespaces().join(" ")
    );
    // The parent sends SIGTERM now; give up eventually so nothing hangs.
    thread::sleep(3 * TIMEOUT);
    panic!("no signal arrived");
}

/// Stops the child and deletes what it built if the test fails midway.
struct ChildGuard {
    child: Child,
    names: Vec<String>,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first, so the child's own handler deletes its star.
            if let Ok(pid) = i32::try_from(self.child.id()) {
                // SAFETY: kill takes no pointers; `pid` is our child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for name in &self.names {
            let _ = netns::ip(&["netns", "del", name]);
        }
    }
}

/// SIGTERM to a process holding a star deletes the star and exits with status 130.
#[test]
fn sigterm_deletes_everything() {
    require_root();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "signal_cleanup_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = ChildGuard {
        child,
        names: Vec::new(),
    };

    let stdout = guard.child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test NAME ... " before the child's own output.
            if let Some((_, rest)) = line.split_once(CHILD_MARK) {
                let _ = tx.send(rest.to_owned());
            }
        }
    });
    let line = rx
        .recv_timeout(TIMEOUT)
        .expect("the child printed its star");
    let mut words = line.split_whitespace().map(str::to_owned);
    let token = words.next().unwrap();
    guard.names = words.collect();
    assert_eq!(guard.names.len(), 3);
    let listed = listed_namespaces();
    assert!(guard.names.iter().all(|n| listed.contains(n)));

    let pid = i32::try_from(guard.child.id()).unwrap();
    // SAFETY: kill takes no pointers; `pid` is our child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = guard.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the child did not exit");
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(netns::SIGNAL_EXIT_STATUS));
    assert_gone(&token, &guard.names);
}

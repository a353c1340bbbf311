//! The lossy link drops, duplicates and reorders what it is told to, and
//! counts it (root needed).
//!
//! ```text
//!   a (10.99.0.1) ── veth ── b (10.99.0.2)
//!   lossy link on a's end: egress = a → b, ingress = b → a
//! ```

use std::{
    collections::HashSet,
    io::{Read as _, Write as _},
    net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use xina_proto::{
    XINA_UDP_PORT,
    lossy::{LinkConfig, direction},
};
use xina_testbed::{
    lossy::{self, LossModel, LossyLink, rates},
    netns::{self, NetNs},
    plain,
    topology::{Star, StarOptions},
};

const FRAMES: u32 = 20_000;
/// The test's datagrams are tiny (46-byte frames): delayed ones must queue
/// at this rate for frames behind them to overtake them.
const SLOW: &str = "100kbit";

struct Pair {
    a: NetNs,
    b: NetNs,
    a_if: String,
}

/// A veth between two fresh namespaces, made in the root namespace and
/// moved; deleting the namespaces deletes it.
fn pair() -> Pair {
    let a = NetNs::create_unique("xl").unwrap();
    let b = NetNs::create_unique("xl").unwrap();
    let t = netns::unique_token();
    let (a_if, b_if) = (format!("xla{t}"), format!("xlb{t}"));
    netns::ip(&["link", "add", &a_if, "type", "veth", "peer", "name", &b_if]).unwrap();
    let moved = netns::ip(&["link", "set", &a_if, "netns", a.name()])
        .and_then(|_| netns::ip(&["link", "set", &b_if, "netns", b.name()]));
    if let Err(e) = moved {
        let _ = netns::ip(&["link", "del", &a_if]);
        panic!("moving the veth: {e}");
    }
    for (ns, dev, addr, peer, peer_dev) in [
        (&a, &a_if, "10.99.0.1/24", "10.99.0.2", &b_if),
        (&b, &b_if, "10.99.0.2/24", "10.99.0.1", &a_if),
    ] {
        ns.ip(&["addr", "add", addr, "dev", dev]).unwrap();
        ns.ip(&["link", "set", dev, "up"]).unwrap();
        // Static neighbours: no ARP frames for the lossy link to see.
        let mac = peer_mac(if std::ptr::eq(ns, &a) { &b } else { &a }, peer_dev);
        ns.ip(&[
            "neigh",
            "add",
            peer,
            "lladdr",
            &mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ])
        .unwrap();
    }
    Pair { a, b, a_if }
}

fn peer_mac(ns: &NetNs, dev: &str) -> String {
    let out = ns.ip(&["-br", "link", "show", "dev", dev]).unwrap();
    out.split_whitespace()
        .nth(2)
        .expect("a MAC address")
        .to_owned()
}

/// Sends `FRAMES` numbered datagrams from `from` to `to`'s xina port and
/// returns the numbers received, in arrival order.
fn transfer(from: &NetNs, from_ip: &str, to: &NetNs, to_ip: &str) -> Vec<u32> {
    let rx = to
        .run(|| UdpSocket::bind((to_ip, XINA_UDP_PORT)))
        .unwrap()
        .unwrap();
    // A receive buffer that holds the whole transfer, so the only losses
    // are the link's even when the receiving thread is not scheduled for a
    // while (root may exceed rmem_max with SO_RCVBUFFORCE).
    let size: libc::c_int = 32 << 20;
    // SAFETY: a valid socket and a pointer to a c_int of the given length.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&rx),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE");
    // Long enough for the slow class to drain the delayed frames.
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(n) = rx.recv(&mut buf) {
            assert_eq!(n, 4);
            got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
            assert!(Instant::now() < deadline, "receiver ran too long");
        }
        got
    });
    from.run(|| {
        let tx = UdpSocket::bind((from_ip, 0)).unwrap();
        for i in 0..FRAMES {
            tx.send_to(&i.to_be_bytes(), (to_ip, XINA_UDP_PORT))
                .unwrap();
            if i % 64 == 0 {
                // Stay below the socket buffers: the only losses should be ours.
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    })
    .unwrap();
    receiver.join().unwrap()
}

/// How a transfer went, from the receiver's side.
fn tally(got: &[u32]) -> (usize, usize, usize) {
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    let mut reordered = 0;
    let mut highest = None;
    for &i in got {
        if !seen.insert(i) {
            duplicates += 1;
        }
        match highest {
            Some(h) if i < h => reordered += 1,
            _ => highest = Some(i),
        }
    }
    (seen.len(), duplicates, reordered)
}

/// Within `tol` of `want` (absolute, as fractions of FRAMES).
fn near(count: u64, want: f64, tol: f64) -> bool {
    let frac = count as f64 / f64::from(FRAMES);
    (frac - want).abs() <= tol
}

#[test]
fn egress_drops_duplicates_and_reorders_what_it_counts() {
    let p = pair();
    let link = LossyLink::attach(
        &p.a,
        &p.a_if,
        rates(100_000, 50_000, 20_000, true),
        LinkConfig::default(),
        SLOW,
    )
    .unwrap();
    let got = transfer(&p.a, "10.99.0.1", &p.b, "10.99.0.2");
    let (unique, duplicates, reordered) = tally(&got);
    let c = link.counts(direction::EGRESS).unwrap();
    println!(
        "{}",
        p.a.exec(&["tc", "-s", "class", "show", "dev", &p.a_if])
            .unwrap()
    );
    println!(
        "{}",
        p.a.exec(&["tc", "-s", "qdisc", "show", "dev", &p.a_if])
            .unwrap()
    );
    println!(
        "egress: {c:?}; receiver: {unique} unique, {duplicates} duplicates, {reordered} out of order"
    );
    assert_eq!(c.seen, u64::from(FRAMES));
    assert_eq!(
        u64::from(FRAMES) - c.dropped,
        unique as u64,
        "every loss is the link's"
    );
    assert_eq!(
        c.duplicated, duplicates as u64,
        "every duplicate is the link's"
    );
    assert!(near(c.dropped, 0.10, 0.02), "dropped {}", c.dropped);
    assert!(
        near(c.duplicated, 0.045, 0.015),
        "duplicated {}",
        c.duplicated
    );
    assert!(
        c.delayed > 0 && reordered > 0,
        "delayed {} reordered {reordered}",
        c.delayed
    );
}

#[test]
fn ingress_drops_and_duplicates_the_other_direction() {
    let p = pair();
    let link = LossyLink::attach(
        &p.a,
        &p.a_if,
        LinkConfig::default(),
        rates(200_000, 100_000, 0, true),
        SLOW,
    )
    .unwrap();
    let got = transfer(&p.b, "10.99.0.2", &p.a, "10.99.0.1");
    let (unique, duplicates, _) = tally(&got);
    let c = link.counts(direction::INGRESS).unwrap();
    println!("ingress: {c:?}; receiver: {unique} unique, {duplicates} duplicates");
    assert_eq!(c.seen, u64::from(FRAMES));
    assert_eq!(u64::from(FRAMES) - c.dropped, unique as u64);
    assert_eq!(c.duplicated, duplicates as u64);
    assert!(near(c.dropped, 0.20, 0.02), "dropped {}", c.dropped);
    assert!(
        near(c.duplicated, 0.08, 0.02),
        "duplicated {}",
        c.duplicated
    );
    // Nothing was configured for the other direction.
    assert_eq!(link.counts(direction::EGRESS).unwrap().dropped, 0);
}

#[test]
fn other_traffic_is_left_alone_when_only_xina_is_disturbed() {
    let p = pair();
    let link = LossyLink::attach(
        &p.a,
        &p.a_if,
        rates(1_000_000, 0, 0, true),
        LinkConfig::default(),
        SLOW,
    )
    .unwrap();
    let rx =
        p.b.run(|| UdpSocket::bind(("10.99.0.2", 7000)))
            .unwrap()
            .unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    p.a.run(|| {
        UdpSocket::bind(("10.99.0.1", 0))
            .unwrap()
            .send_to(b"ping", ("10.99.0.2", 7000))
            .unwrap()
    })
    .unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(rx.recv(&mut buf).expect("non-xina datagram arrives"), 4);
    assert_eq!(link.counts(direction::EGRESS).unwrap().seen, 0);
}

/// Sends `bytes` over TCP from worker 0 to worker 1 of `star` and waits
/// until worker 1 has read them all.
fn tcp_transfer(star: &Star, bytes: usize) {
    let to = SocketAddrV4::new(star.worker(1).ip, 7_100);
    let listener = star
        .worker(1)
        .ns()
        .run(|| TcpListener::bind(to))
        .unwrap()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        got.len()
    });
    let mut conn = star
        .worker(0)
        .ns()
        .run(|| TcpStream::connect_timeout(&to.into(), Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    let block = vec![0x5a_u8; 1 << 20];
    for _ in 0..bytes / block.len() {
        conn.write_all(&block).unwrap();
    }
    drop(conn);
    assert_eq!(reader.join().unwrap(), bytes);
}

/// On a plain star (no XDP, TCP's offloads on) the lossy link sees TCP's
/// GSO packets whole unless the per-frame model turned the offloads off and
/// put the drop behind the veth that cuts them: then every packet it sees
/// is one frame, each dropped with the configured rate, both directions.
#[test]
fn per_frame_loss_sees_each_tcp_frame_alone_where_batch_loss_sees_packets() {
    const BYTES: usize = 48 << 20;
    const MTU: u32 = 9000;
    for model in [LossModel::Frame, LossModel::Batch] {
        let star = plain::build(StarOptions::new(2).with_mtu(MTU)).unwrap();
        let per_frame = model == LossModel::Frame;
        if per_frame {
            lossy::per_frame(&star, false).unwrap();
        }
        let links = lossy::on_star(&star, 2.0, per_frame).unwrap();
        tcp_transfer(&star, BYTES);
        let c = lossy::total(&links).unwrap();
        println!("{model:?}: {c:?}");
        // At least one frame per MSS of data went from 0 to 1.
        let least = (BYTES / (MTU as usize - 52)) as u64;
        assert!(c.frames >= least, "{model:?}: {} frames", c.frames);
        if per_frame {
            assert_eq!(c.frames, c.seen, "a packet of several frames");
            assert_eq!(c.frames_dropped, c.dropped);
            let rate = c.dropped as f64 / c.seen as f64;
            assert!((0.015..0.025).contains(&rate), "dropped {rate}");
        } else {
            assert!(
                c.frames > 2 * c.seen,
                "{model:?}: TCP's packets were not batches: {} frames in {}",
                c.frames,
                c.seen
            );
        }
        drop(links);
        star.teardown().unwrap();
    }
}

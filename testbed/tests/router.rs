//! The switch host stays an ordinary router for everything that is not
//! xina (root needed).
//!
//! ```text
//!  w0: 10.1.0.2/24 ── a0 (10.1.0.1) [switch, ip_forward, xina_switch on a0 and a1] a1 (10.2.0.1) ── w1: 10.2.0.2/24
//! ```
//!
//! UDP and TCP from w0 to w1 are routed by the switch's kernel (the XDP
//! program passes them) while the dataplane is attached.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use xina::{Dataplane, LoadOptions};
use xina_proto::counters::Counter;
use xina_testbed::netns::{self, NetNs};

/// A veth pair made in the root namespace, deleted on drop if still there.
struct RootVeth(String);

impl Drop for RootVeth {
    fn drop(&mut self) {
        // Gone already once an end was moved and its namespace deleted.
        let _ = netns::ip(&["link", "del", &self.0]);
    }
}

fn veth(name: &str, peer: &str, a: &NetNs, b: &NetNs) -> RootVeth {
    netns::ip(&["link", "add", name, "type", "veth", "peer", "name", peer]).unwrap();
    let guard = RootVeth(name.to_owned());
    netns::ip(&["link", "set", name, "netns", a.name()]).unwrap();
    netns::ip(&["link", "set", peer, "netns", b.name()]).unwrap();
    guard
}

#[test]
fn non_xina_traffic_is_routed_while_the_switch_is_attached() {
    let sw = NetNs::create_unique("xr").unwrap();
    let w0 = NetNs::create_unique("xr").unwrap();
    let w1 = NetNs::create_unique("xr").unwrap();
    let t = netns::unique_token();
    let (a0, b0, a1, b1) = (
        format!("xa{t}"),
        format!("xb{t}"),
        format!("xc{t}"),
        format!("xd{t}"),
    );
    let _l0 = veth(&a0, &b0, &sw, &w0);
    let _l1 = veth(&a1, &b1, &sw, &w1);
    for (ns, dev, addr, gw) in [
        (&w0, &b0, "10.1.0.2/24", "10.1.0.1"),
        (&w1, &b1, "10.2.0.2/24", "10.2.0.1"),
    ] {
        ns.ip(&["addr", "add", addr, "dev", dev]).unwrap();
        ns.ip(&["link", "set", dev, "up"]).unwrap();
        ns.ip(&["link", "set", "lo", "up"]).unwrap();
        ns.ip(&["route", "add", "default", "via", gw]).unwrap();
    }
    sw.ip(&["addr", "add", "10.1.0.1/24", "dev", &a0]).unwrap();
    sw.ip(&["addr", "add", "10.2.0.1/24", "dev", &a1]).unwrap();
    sw.ip(&["link", "set", &a0, "up"]).unwrap();
    sw.ip(&["link", "set", &a1, "up"]).unwrap();
    sw.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .unwrap();

    let mut dp = sw
        .run(|| {
            let mut dp = Dataplane::load(LoadOptions::default())?;
            dp.attach(&a0, aya::programs::XdpMode::Driver)?;
            dp.attach(&a1, aya::programs::XdpMode::Driver)?;
            Ok::<_, xina::dataplane::Error>(dp)
        })
        .unwrap()
        .unwrap();
    let before = dp.counters().unwrap();

    // Servers in w1: a UDP echo and a TCP echo, each answering once.
    let udp = w1
        .run(|| UdpSocket::bind("10.2.0.2:7000"))
        .unwrap()
        .unwrap();
    let tcp = w1
        .run(|| TcpListener::bind("10.2.0.2:7001"))
        .unwrap()
        .unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let servers = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (n, from) = udp.recv_from(&mut buf).expect("udp datagram");
        udp.send_to(&buf[..n], from).unwrap();
        tcp.set_nonblocking(false).unwrap();
        let (mut s, _) = tcp.accept().expect("tcp connection");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = s.read(&mut buf).unwrap();
        s.write_all(&buf[..n]).unwrap();
    });

    let (udp_reply, tcp_reply) = w0
        .run(|| {
            let s = UdpSocket::bind("10.1.0.2:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.send_to(b"hello over udp", "10.2.0.2:7000").unwrap();
            let mut buf = [0u8; 64];
            let n = s.recv(&mut buf).expect("udp echo");
            let udp_reply = buf[..n].to_vec();
            let to = SocketAddrV4::new("10.2.0.2".parse().unwrap(), 7001).into();
            let mut t =
                TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("tcp connect");
            t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            t.write_all(b"hello over tcp").unwrap();
            let n = t.read(&mut buf).unwrap();
            (udp_reply, buf[..n].to_vec())
        })
        .unwrap();
    servers.join().unwrap();
    assert_eq!(udp_reply, b"hello over udp");
    assert_eq!(tcp_reply, b"hello over tcp");

    let d = dp.counters().unwrap().delta(&before);
    assert!(
        d.get(Counter::Passed) >= 4,
        "the switch saw the traffic and passed it: {d:?}"
    );
    assert_eq!(
        d.get(Counter::Passed),
        d.get(Counter::RxPackets),
        "nothing else happened to it"
    );
    dp.detach_all();
}

/// In the star, workers reach each other over TCP through the switch's
/// bridge — the same links xina uses — while the dataplane is attached.
#[test]
fn star_workers_reach_each_other_through_the_switch() {
    use xina_testbed::{
        scenario::{AllreduceSpec, star_config, start_switch},
        topology::Star,
    };
    let star = Star::build(2).unwrap();
    let spec = AllreduceSpec {
        workers: 2,
        ..Default::default()
    };
    let dp = start_switch(&star, &star_config(&star, &spec)).unwrap();
    let before = dp.counters().unwrap();
    let (w0, w1) = (star.worker(0), star.worker(1));
    let listener = w1
        .ns()
        .run(|| TcpListener::bind((w1.ip, 7002)))
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("tcp connection");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        s.write_all(&buf[..n]).unwrap();
    });
    let to = SocketAddrV4::new(w1.ip, 7002).into();
    let reply = w0
        .ns()
        .run(|| {
            let mut t =
                TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("tcp connect");
            t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            t.write_all(b"worker to worker").unwrap();
            let mut buf = [0u8; 64];
            let n = t.read(&mut buf).unwrap();
            buf[..n].to_vec()
        })
        .unwrap();
    server.join().unwrap();
    assert_eq!(reply, b"worker to worker");
    let d = dp.counters().unwrap().delta(&before);
    assert!(
        d.get(Counter::Passed) >= 4,
        "the XDP program saw the TCP segments and passed them: {d:?}"
    );
    assert_eq!(d.get(Counter::Passed), d.get(Counter::RxPackets));
}

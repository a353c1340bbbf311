//! Shaped links (root needed): what the benchmarks' link-bound regime
//! relies on. Every worker link gets a token bucket at the given rate on
//! both ends, traffic through it is counted, and it does not pass faster.

use std::{
    net::{SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use xina_testbed::{
    plain,
    shape::{self, LinkBytes},
    topology::StarOptions,
};

const RATE_MBIT: u32 = 200;
const DATAGRAMS: usize = 200;
const DATAGRAM_BYTES: usize = 8000;

#[test]
fn every_link_is_shaped_both_ways_and_holds_its_rate() {
    let star = plain::build(StarOptions::new(2).with_mtu(9000)).expect("plain star");
    assert!(
        shape::shape(&star, 0)
            .unwrap_err()
            .to_string()
            .starts_with("rate: 0"),
        "a rate of 0 is refused"
    );
    shape::shape(&star, RATE_MBIT).expect("shaping");
    for w in star.workers() {
        let port = &star.port(w.port).name;
        for (ns, dev) in [(w.ns(), w.iface.as_str()), (star.switch(), port.as_str())] {
            let out = ns.exec(&["tc", "-j", "qdisc", "show", "dev", dev]).unwrap();
            let qdiscs: serde_json::Value = serde_json::from_str(&out).unwrap();
            let root = qdiscs
                .as_array()
                .unwrap()
                .iter()
                .find(|q| q["root"] == true)
                .unwrap_or_else(|| panic!("{dev}: no root qdisc: {out}"));
            assert_eq!(root["kind"], "tbf", "{dev}: {out}");
            assert_eq!(
                root["options"]["rate"].as_u64(),
                Some(u64::from(RATE_MBIT) * 1_000_000 / 8),
                "{dev}: the rate in bytes per second: {out}"
            );
        }
    }

    // Worker 0 sends to worker 1 across the bridge: out through worker 0's
    // shaper, in through the shaper of worker 1's port.
    let to = SocketAddrV4::new(star.worker(1).ip, 7001);
    let receiver = star
        .worker_ns(1)
        .run(|| UdpSocket::bind(to))
        .unwrap()
        .expect("bind the receiver");
    receiver
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let sender = star
        .worker_ns(0)
        .run(|| UdpSocket::bind(SocketAddrV4::new(star.worker(0).ip, 0)))
        .unwrap()
        .expect("bind the sender");
    let before = shape::link_bytes(&star).unwrap();
    let started = Instant::now();
    let (received, last) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut buf = vec![0u8; DATAGRAM_BYTES];
            let mut n = 0;
            let mut last = Instant::now();
            while n < DATAGRAMS && receiver.recv(&mut buf).is_ok() {
                n += 1;
                last = Instant::now();
            }
            (n, last)
        });
        let datagram = vec![7u8; DATAGRAM_BYTES];
        for _ in 0..DATAGRAMS {
            sender.send_to(&datagram, to).expect("send");
        }
        reader.join().unwrap()
    });
    let after = shape::link_bytes(&star).unwrap();
    let sent = (DATAGRAMS * DATAGRAM_BYTES) as u64;
    let grew = |f: fn(&LinkBytes) -> u64, rank: usize| f(&after[rank]) - f(&before[rank]);
    assert!(
        grew(|l| l.from_worker, 0) >= sent,
        "worker 0's shaper counted {} of {sent} bytes",
        grew(|l| l.from_worker, 0)
    );
    // Worker 1's socket may drop some when its reader falls behind; what
    // the links carried is what counts here.
    assert!(received > 0, "nothing arrived");
    // The queue behind the bucket holds the burst: nothing dropped there.
    assert!(
        grew(|l| l.to_worker, 1) >= sent,
        "worker 1's port counted {} of {sent} bytes",
        grew(|l| l.to_worker, 1)
    );
    // No faster than the rate, give or take the bucket (two 64 KB frames)
    // and the headers: unshaped, a veth carries this in a few milliseconds.
    let seconds = last.duration_since(started).as_secs_f64();
    let busiest = shape::busiest_mbit(&before, &after, seconds);
    assert!(
        busiest <= f64::from(RATE_MBIT) * 1.25,
        "{busiest:.0} Mbit/s through a {RATE_MBIT} Mbit/s shaper ({seconds:.3} s)"
    );
    star.teardown().unwrap();
}

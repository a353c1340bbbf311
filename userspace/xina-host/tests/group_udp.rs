//! The group drivers (blocking and tokio) on loopback, against a switch
//! thread running [`GroupSwitchModel`] with loss in both directions. Every
//! wait is bounded: members give up on their own and the switch thread stops
//! when dropped or after two minutes.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xina_host::group_sim::{GroupSwitchModel, GroupSwitchStats};
use xina_host::sim::SplitMix64;
use xina_host::{AsyncGroupWorker, Config, Error, GroupParams, GroupWorker};

const GROUP: u32 = 11;
const WINDOW: u32 = 32;
const BPP: u16 = 1000;

fn localhost(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

struct TestSwitch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<GroupSwitchStats>>,
}

impl TestSwitch {
    fn start(socket: UdpSocket, members: Vec<SocketAddrV4>, loss: f64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let fan_in = u8::try_from(members.len()).unwrap();
            let mut model = GroupSwitchModel::new(GROUP, fan_in, WINDOW);
            let mut rng = SplitMix64::new(0x6a11);
            socket
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut buf = [0; 4096];
            let end = Instant::now() + Duration::from_secs(120);
            while !stopped.load(Ordering::Relaxed) && Instant::now() < end {
                let len = match socket.recv_from(&mut buf) {
                    Ok((len, _)) => len,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => panic!("switch socket: {e}"),
                };
                if rng.chance(loss) {
                    continue;
                }
                for (rank, out) in model.handle(&buf[..len]) {
                    if !rng.chance(loss) {
                        // A full receive buffer drops, like a lossy link.
                        let _ = socket.send_to(&out, members[usize::from(rank)]);
                    }
                }
            }
            *model.stats()
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> GroupSwitchStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TestSwitch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn params(rank: u8, fan_in: u8, switch: SocketAddrV4) -> GroupParams {
    GroupParams {
        group: GROUP,
        rank,
        fan_in,
        bytes_per_packet: BPP,
        window: WINDOW,
        switch,
    }
}

fn config() -> Config {
    Config {
        give_up: Duration::from_secs(10),
        ..Config::default()
    }
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

#[test]
fn blocking_members_broadcast_and_allgather_exactly_over_a_lossy_switch() {
    let fan_in = 4u8;
    let switch_socket = UdpSocket::bind(localhost(0)).unwrap();
    let switch = match switch_socket.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
    };
    let workers: Vec<GroupWorker> = (0..fan_in)
        .map(|r| GroupWorker::new(params(r, fan_in, switch), localhost(0), config()).unwrap())
        .collect();
    let addrs = workers.iter().map(|w| w.local_addr().unwrap()).collect();
    let test_switch = TestSwitch::start(switch_socket, addrs, 0.01);
    let len = 300_000;
    let threads: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            std::thread::spawn(move || {
                let rank = w.params().rank;
                let mut out = Vec::new();
                for call in 0..3u64 {
                    let root = (call % 4) as u8;
                    let mut buf = if rank == root {
                        bytes(len, call)
                    } else {
                        vec![0; len]
                    };
                    w.broadcast(root, &mut buf).unwrap();
                    out.push(buf);
                }
                let part = len / 4;
                let mut buf = vec![0; len];
                let mine = usize::from(rank) * part..(usize::from(rank) + 1) * part;
                buf[mine.clone()].copy_from_slice(&bytes(len, 99)[mine]);
                w.allgather(&mut buf).unwrap();
                out.push(buf);
                out
            })
        })
        .collect();
    for t in threads {
        let out = t.join().unwrap();
        for (call, buf) in out.iter().take(3).enumerate() {
            assert!(*buf == bytes(len, call as u64), "broadcast {call} differs");
        }
        assert!(out[3] == bytes(len, 99), "allgather differs");
    }
    let stats = test_switch.stop();
    assert!(stats.replicated > 0);
}

#[test]
fn async_members_broadcast_exactly() {
    let fan_in = 3u8;
    let switch_socket = UdpSocket::bind(localhost(0)).unwrap();
    let switch = match switch_socket.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut workers: Vec<AsyncGroupWorker> = (0..fan_in)
            .map(|r| {
                AsyncGroupWorker::new(params(r, fan_in, switch), localhost(0), config()).unwrap()
            })
            .collect();
        let addrs = workers.iter().map(|w| w.local_addr().unwrap()).collect();
        let test_switch = TestSwitch::start(switch_socket, addrs, 0.01);
        let len = 50_001;
        let data = bytes(len, 5);
        let mut bufs: Vec<Vec<u8>> = (0..fan_in)
            .map(|r| if r == 1 { data.clone() } else { vec![0; len] })
            .collect();
        let futures = workers
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(w, b)| w.broadcast(1, b));
        let results = futures_join(futures.collect()).await;
        for r in results {
            r.unwrap();
        }
        for (rank, b) in bufs.iter().enumerate() {
            assert!(*b == data, "rank {rank} differs");
        }
        test_switch.stop();
    });
}

/// Polls every future on this task until all are done.
async fn futures_join<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn without_a_switch_the_root_gives_up_saying_nothing_came_back() {
    let nowhere = UdpSocket::bind(localhost(0)).unwrap();
    let switch = match nowhere.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!("bound to IPv4"),
    };
    let config = Config {
        give_up: Duration::from_millis(300),
        ..Config::default()
    };
    let mut w = GroupWorker::new(params(0, 2, switch), localhost(0), config).unwrap();
    let mut buf = vec![7; 5_000];
    let started = Instant::now();
    let err = w.broadcast(0, &mut buf).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    match &err {
        Error::GroupStalled(stall) => {
            let text = stall.to_string();
            assert!(
                text.contains("group 11, rank 0: broadcast from root 0"),
                "{text}"
            );
            assert!(text.contains("nothing came back"), "{text}");
        }
        other => panic!("{other}"),
    }
    // Bad parameters are refused before anything is sent.
    let bad = GroupWorker::new(
        GroupParams {
            bytes_per_packet: 0,
            ..params(0, 2, switch)
        },
        localhost(0),
        Config::default(),
    )
    .unwrap_err();
    assert!(
        bad.to_string()
            .contains("0 bytes per packet is out of range"),
        "{bad}"
    );
    let bad_root = w.broadcast(2, &mut buf).unwrap_err();
    assert!(
        matches!(bad_root, Error::RootOutOfRange { root: 2, .. }),
        "{bad_root}"
    );
}

//! The UDP driver on loopback, against a switch thread running
//! [`SwitchModel`].
//!
//! ```text
//!  worker 0 ─┐                         ┌─▶ worker 0
//!  worker 1 ─┼─▶ 127.0.0.1:<switch> ───┼─▶ worker 1      (results to every
//!  worker 2 ─┘   SwitchModel, lossy    └─▶ worker 2       member's address)
//! ```
//!
//! Every wait is bounded: workers give up on their own, the switch thread stops
//! when dropped or after two minutes, and results are collected with a
//! timeout, so a bug fails the test instead of hanging it.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xina_host::sim::{Destination, SplitMix64, SwitchModel, SwitchStats};
use xina_host::{AsyncWorker, Config, Error, JobParams, Mode, Stats, Worker};
use xina_proto::{DType, Op};

const JOB: u32 = 3;
const HANG_GUARD: Duration = Duration::from_secs(90);

fn localhost(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
}

/// A switch thread on loopback; stops when dropped.
struct TestSwitch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<SwitchStats>>,
}

impl TestSwitch {
    /// Serves `socket` with a [`SwitchModel`] holding one job whose rank `r`
    /// lives at `members[r]`, dropping each datagram in or out with
    /// probability `loss`.
    fn start(socket: UdpSocket, slots: u32, members: Vec<SocketAddrV4>, loss: f64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut model = SwitchModel::new();
            model.add_job(JOB, u8::try_from(members.len()).unwrap(), slots);
            let mut rng = SplitMix64::new(0x5717c4);
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
                let Some(reply) = model.handle(&buf[..len]) else {
                    continue;
                };
                let targets = match reply.to {
                    Destination::AllMembers => members.clone(),
                    Destination::Rank(rank) => vec![members[usize::from(rank)]],
                };
                for target in targets {
                    if !rng.chance(loss) {
                        socket.send_to(&reply.datagram, target).unwrap();
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

    fn stop(mut self) -> SwitchStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the switch thread ran")
    }
}

impl Drop for TestSwitch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn params(
    rank: u8,
    fan_in: u8,
    elems_per_packet: u16,
    slots: u32,
    switch: SocketAddrV4,
) -> JobParams {
    JobParams {
        job: JOB,
        rank,
        fan_in,
        elems_per_packet,
        slots,
        op: Op::Sum,
        dtype: DType::I32,
        mode: Mode::Allreduce,
        switch,
    }
}

fn data(rank: u8, len: usize, call: u64) -> Vec<i32> {
    let mut rng = SplitMix64::new(u64::from(rank) << 32 | call);
    (0..len)
        .map(|_| i32::try_from(rng.up_to(2_000_000)).unwrap() - 1_000_000)
        .collect()
}

type CallResult = Result<(Stats, Vec<i32>), Error>;

/// Runs `lens.len()` allreduces on every worker, each in its own thread;
/// returns the results in the order of `workers`.
fn run(workers: Vec<Worker>, lens: &[usize]) -> Vec<Vec<CallResult>> {
    let (tx, rx) = mpsc::channel();
    let count = workers.len();
    for (index, mut worker) in workers.into_iter().enumerate() {
        let tx = tx.clone();
        let lens = lens.to_vec();
        std::thread::spawn(move || {
            let rank = worker.params().rank;
            let results: Vec<CallResult> = lens
                .iter()
                .zip(0..)
                .map(|(&len, call)| {
                    let mut buffer = data(rank, len, call);
                    worker
                        .allreduce_i32(&mut buffer)
                        .map(|stats| (stats, buffer))
                })
                .collect();
            tx.send((index, results)).unwrap();
        });
    }
    let mut all: Vec<Option<Vec<CallResult>>> = (0..count).map(|_| None).collect();
    for _ in 0..count {
        let (index, results) = rx.recv_timeout(HANG_GUARD).expect("every worker returns");
        all[index] = Some(results);
    }
    all.into_iter().map(Option::unwrap).collect()
}

fn expected(fan_in: u8, len: usize, call: u64) -> Vec<i32> {
    let mut sum = vec![0; len];
    for rank in 0..fan_in {
        for (s, x) in sum.iter_mut().zip(data(rank, len, call)) {
            *s += x;
        }
    }
    sum
}

/// Workers bound to free loopback ports, and a switch serving them.
fn setup(
    fan_in: u8,
    elems: u16,
    slots: u32,
    config: Config,
    loss: f64,
) -> (Vec<Worker>, TestSwitch) {
    let socket = UdpSocket::bind(localhost(0)).unwrap();
    let std::net::SocketAddr::V4(switch) = socket.local_addr().unwrap() else {
        unreachable!()
    };
    let workers: Vec<Worker> = (0..fan_in)
        .map(|rank| {
            Worker::new(
                params(rank, fan_in, elems, slots, switch),
                localhost(0),
                config,
            )
            .unwrap()
        })
        .collect();
    let members = workers.iter().map(|w| w.local_addr().unwrap()).collect();
    (workers, TestSwitch::start(socket, slots, members, loss))
}

fn check_exact(results: &[Vec<CallResult>], fan_in: u8, lens: &[usize]) -> Vec<Stats> {
    let mut stats = Vec::new();
    for (call, &len) in lens.iter().enumerate() {
        let want = expected(fan_in, len, call as u64);
        for (rank, per_rank) in results.iter().enumerate() {
            let (s, got) = per_rank[call]
                .as_ref()
                .unwrap_or_else(|e| panic!("call {call}, rank {rank}: {e}"));
            assert!(*got == want, "call {call}, rank {rank}: wrong sums");
            // The call check and the data, E = 256.
            assert_eq!(s.chunks, 1 + len.div_ceil(256) as u64);
            stats.push(*s);
        }
    }
    stats
}

#[test]
fn three_workers_reduce_100_000_elements_exactly_over_loopback() {
    let (workers, switch) = setup(3, 256, 32, Config::default(), 0.0);
    let lens = [100_000, 33_333, 0, 1];
    let results = run(workers, &lens);
    let stats = check_exact(&results, 3, &lens);
    for s in &stats {
        assert!(
            s.packets_sent >= s.chunks && s.packets_received >= s.chunks,
            "{s:?}"
        );
    }
    let switch = switch.stop();
    // 391 + 131 + 0 + 1 data chunks and 4 checks, each completed once.
    assert_eq!(switch.completed, 527);
}

#[test]
fn a_window_wider_than_a_send_batch_reduces_exactly() {
    // 300 chunks in flight per worker: each turn sends several `sendmmsg`
    // batches of 64 and drains results in several `recvmmsg` batches. The
    // switch socket's default receive buffer overflows at this window, so
    // some chunks also go through retransmission.
    let (workers, switch) = setup(2, 256, 300, Config::default(), 0.0);
    let lens = [200_000, 77_777];
    let results = run(workers, &lens);
    let stats = check_exact(&results, 2, &lens);
    let switch = switch.stop();
    assert_eq!(switch.completed, 782 + 304 + 2);
    println!("{stats:?}; {switch:?}");
}

#[test]
fn a_lossy_switch_is_recovered_from() {
    let config = Config {
        give_up: Duration::from_secs(10),
        ..Config::default()
    };
    let (workers, switch) = setup(3, 256, 8, config, 0.03);
    let lens = [20_000, 5_000];
    let results = run(workers, &lens);
    let stats = check_exact(&results, 3, &lens);
    let retransmissions: u64 = stats.iter().map(|s| s.retransmissions).sum();
    let from_cache: u64 = stats.iter().map(|s| s.from_cache).sum();
    assert!(retransmissions > 0, "3% loss must cost retransmissions");
    let switch = switch.stop();
    assert_eq!(switch.completed, 79 + 20 + 2);
    println!("{retransmissions} retransmissions, {from_cache} results from cache; {switch:?}");
}

#[test]
fn without_a_switch_the_worker_gives_up_naming_the_outstanding_seqs() {
    // A socket that never answers: datagrams to it are silently swallowed.
    let black_hole = UdpSocket::bind(localhost(0)).unwrap();
    let std::net::SocketAddr::V4(switch) = black_hole.local_addr().unwrap() else {
        unreachable!()
    };
    let give_up = Duration::from_millis(300);
    let config = Config {
        give_up,
        ..Config::default()
    };
    let worker = Worker::new(params(1, 2, 100, 4, switch), localhost(0), config).unwrap();
    let started = Instant::now();
    let results = run(vec![worker], &[1000, 50]);
    let elapsed = started.elapsed();
    assert!(elapsed >= 2 * give_up, "gave up early: {elapsed:?}");
    let [calls] = &results[..] else {
        unreachable!()
    };
    // The check and 10 data chunks, the check and 1; as many open as the
    // congestion window allows, the initial 4 (one timeout with nothing
    // coming back is not yet a stall that shrinks it; the next came with
    // the give-up).
    for (call, first_seq, chunks, open) in [(0, 0, 11, 4), (1, 11, 2, 2)] {
        match &calls[call] {
            Err(Error::GaveUp {
                job: JOB,
                rank: 1,
                completed: 0,
                total,
                outstanding,
                ..
            }) => {
                assert_eq!(*total, chunks);
                let want: Vec<u32> = (first_seq..first_seq + open).collect();
                assert_eq!(outstanding.first, want);
                let message = calls[call].as_ref().unwrap_err().to_string();
                assert!(
                    message.ends_with(
                        "nothing at all came back during the call: a rank may be gone, the \
                         switch unreachable, or job 3 not installed on it (or this rank's \
                         address not registered for it)"
                    ),
                    "{message}"
                );
            }
            other => panic!("call {call}: {other:?}"),
        }
    }
}

#[test]
fn invalid_parameters_and_addresses_are_rejected() {
    let switch = localhost(1);
    let cases = [
        params(0, 0, 8, 1, switch),
        params(0, 65, 8, 1, switch),
        params(3, 3, 8, 1, switch),
        params(0, 3, 0, 1, switch),
        params(0, 3, 16_129, 1, switch),
        params(0, 3, 8, 0, switch),
    ];
    for p in cases {
        let error = Worker::new(p, localhost(0), Config::default()).expect_err("invalid");
        assert!(
            matches!(
                error,
                Error::InvalidFanIn { .. }
                    | Error::RankOutOfRange { .. }
                    | Error::InvalidElemsPerPacket { .. }
                    | Error::InvalidWindow { .. }
            ),
            "{error}"
        );
    }
    // 192.0.2.0/24 is reserved for documentation: no host has it.
    let bind = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 0);
    let error = Worker::new(params(0, 3, 8, 1, switch), bind, Config::default()).unwrap_err();
    assert!(matches!(error, Error::Bind { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "cannot bind the xina worker socket to 192.0.2.1:0"
    );
}

#[test]
fn the_async_worker_reduces_floats_and_integers_like_the_blocking_one() {
    let (workers, switch) = setup(3, 256, 16, Config::default(), 0.01);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let params: Vec<JobParams> = workers.iter().map(|w| *w.params()).collect();
    let addrs: Vec<SocketAddrV4> = workers.iter().map(|w| w.local_addr().unwrap()).collect();
    // The switch knows the members by these addresses: rebind them async.
    drop(workers);
    let floats = |rank: u8| -> Vec<f32> {
        let mut rng = SplitMix64::new(u64::from(rank) + 99);
        (0..10_000)
            .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
            .collect()
    };
    let outcomes = runtime.block_on(async {
        let mut tasks = Vec::new();
        for (p, addr) in params.into_iter().zip(addrs) {
            tasks.push(async move {
                let mut worker = AsyncWorker::new(p, addr, Config::default())?;
                let mut ints = data(p.rank, 5_000, 0);
                worker.allreduce(&mut ints).await?;
                let mut values = floats(p.rank);
                let stats = worker.allreduce(&mut values).await?;
                worker.barrier().await?;
                Ok::<_, Error>((ints, values, stats))
            });
        }
        tokio::time::timeout(HANG_GUARD, futures_join_all(tasks)).await
    });
    let outcomes = outcomes.expect("the async workers return");
    let exact: Vec<f64> = (0..10_000)
        .map(|i| (0..3).map(|r| f64::from(floats(r)[i])).sum())
        .collect();
    let bound = xina_host::float::sum_error_bound(1.0, 3);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (ints, values, stats) = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(ints, expected(3, 5_000, 0), "rank {rank}");
        for (got, want) in values.iter().zip(&exact) {
            let err = (f64::from(*got) - want).abs();
            assert!(
                err <= bound + want.abs() * f64::from(f32::EPSILON),
                "rank {rank}: {got} vs {want}"
            );
        }
        assert_eq!(stats.rescaled, 0, "the safe scale never overflows");
    }
    switch.stop();
}

/// Runs the futures concurrently on the current task and returns their
/// outputs in order.
async fn futures_join_all<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let mut handles = Vec::new();
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            for f in futures {
                handles.push(tokio::task::spawn_local(f));
            }
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.expect("the task ran"));
            }
            out
        })
        .await
}

#[test]
fn an_out_of_place_allreduce_leaves_its_input_and_fills_its_output() {
    let (workers, switch) = setup(3, 256, 16, Config::default(), 0.0);
    let len = 10_007;
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut worker| {
            std::thread::spawn(move || {
                let rank = worker.params().rank;
                let input = data(rank, len, 0);
                let mut output = vec![-1; len];
                let stats = worker.allreduce_from(&input, &mut output);
                // A length mismatch is refused before anything is sent.
                let short = worker.allreduce_from(&input, &mut output[1..]);
                (rank, input, output, stats, short)
            })
        })
        .collect();
    let want = expected(3, len, 0);
    for h in handles {
        let (rank, input, output, stats, short) = h.join().unwrap();
        stats.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert!(output == want, "rank {rank}: wrong sums");
        assert!(
            input == data(rank, len, 0),
            "rank {rank}: its input changed"
        );
        assert!(
            matches!(short, Err(Error::LengthMismatch { .. })),
            "rank {rank}: {short:?}"
        );
    }
    assert_eq!(switch.stop().completed, 1 + len.div_ceil(256) as u64);
}

//! The C ABI driven from Rust, as a C program would: every collective and
//! element type against the switch model relayed over loopback UDP, and
//! what a careless caller can hand it (null, misaligned, mismatched, out of
//! range) answered with a status and a message, never a crash.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use xina_c::*;
use xina_host::Mode;
use xina_host::sim::{Destination, JobConfig, SwitchModel};
use xina_proto::{DType, Op, Packet, Repr};

/// The switch model behind a loopback socket: learns each rank's address
/// from its contributions and sends results where the model says.
struct FakeSwitch {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeSwitch {
    fn start(job: u32, config: JobConfig) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let SocketAddr::V4(addr) = socket.local_addr().unwrap() else {
            unreachable!()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let mut model = SwitchModel::new();
            model.add_job_with(job, config);
            let mut ranks: BTreeMap<u8, SocketAddr> = BTreeMap::new();
            let mut buf = vec![0u8; 65_536];
            while !stopped.load(Ordering::Relaxed) {
                let Ok((len, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let datagram = &buf[..len];
                if let Some(repr) = Packet::new_checked(datagram)
                    .ok()
                    .and_then(|p| Repr::parse(&p).ok())
                {
                    ranks.insert(repr.rank, from);
                }
                let Some(reply) = model.handle(datagram) else {
                    continue;
                };
                match reply.to {
                    Destination::AllMembers => {
                        for (&rank, to) in &ranks {
                            let copy = model.copy_for(rank, &reply.datagram);
                            let _ = socket.send_to(&copy, to);
                        }
                    }
                    Destination::Rank(rank) => {
                        if let Some(to) = ranks.get(&rank) {
                            let _ = socket.send_to(&reply.datagram, to);
                        }
                    }
                }
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeSwitch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(xina_last_error()) }
        .to_string_lossy()
        .into_owned()
}

const FAN_IN: u8 = 4;
const EPP: u16 = 16;
const SLOTS: u32 = 8;

fn params(
    job: u32,
    rank: u8,
    elem_type: XinaType,
    op: XinaOp,
    mode: XinaMode,
    switch: &CStr,
) -> XinaJobParams {
    XinaJobParams {
        job,
        rank,
        fan_in: FAN_IN,
        elems_per_packet: EPP,
        slots: SLOTS,
        op: op as u32,
        elem_type: elem_type as u32,
        mode: mode as u32,
        switch_addr: switch.as_ptr(),
        bind_addr: c"127.0.0.1:0".as_ptr(),
        give_up_ms: 3_000,
    }
}

fn new_worker(p: &XinaJobParams) -> *mut XinaWorker {
    let mut w = ptr::null_mut();
    // SAFETY: valid params with NUL-terminated strings, a valid out pointer.
    let status = unsafe { xina_worker_new(p, &raw mut w) };
    assert_eq!(status, XinaStatus::Ok, "{}", last_error());
    assert!(!w.is_null());
    w
}

/// A handle that crosses to a rank's thread (each is used by one thread).
struct Handle(*mut XinaWorker);
// SAFETY: a worker handle is used by one thread at a time; it moves.
unsafe impl Send for Handle {}

/// Runs `each(rank, worker)` on every rank of a job on its own thread and
/// frees the handles.
fn on_ranks<T: Send + 'static>(
    job: u32,
    elem_type: XinaType,
    op: XinaOp,
    mode: XinaMode,
    each: impl Fn(u8, *mut XinaWorker) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let config = JobConfig {
        fan_in: FAN_IN,
        slots: SLOTS,
        elems_per_packet: EPP,
        op: match op {
            XinaOp::Sum => Op::Sum,
            XinaOp::Max => Op::Max,
            XinaOp::Min => Op::Min,
        },
        dtype: if elem_type == XinaType::Int64 {
            DType::I64
        } else {
            DType::I32
        },
        mode: match mode {
            XinaMode::Allreduce => Mode::Allreduce,
            XinaMode::Reduce => Mode::Reduce,
            XinaMode::ReduceScatter => Mode::ReduceScatter,
        },
    };
    let switch = FakeSwitch::start(job, config);
    let addr = CString::new(switch.addr.to_string()).unwrap();
    let each = Arc::new(each);
    let threads: Vec<_> = (0..FAN_IN)
        .map(|rank| {
            let w = Handle(new_worker(&params(job, rank, elem_type, op, mode, &addr)));
            let each = Arc::clone(&each);
            thread::spawn(move || {
                let w = w;
                let out = each(rank, w.0);
                // SAFETY: this thread's handle, freed once.
                unsafe { xina_worker_free(w.0) };
                out
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// `len` values of rank `rank`, small enough that no sum saturates.
fn input(rank: u8, len: usize) -> Vec<i64> {
    (0..len as i64)
        .map(|i| (i * 7 + i64::from(rank) * 13) % 101 - 50)
        .collect()
}

#[test]
fn allreduce_of_every_type_and_op_matches_the_host_computation() {
    // 37 elements: three chunks of 16, the last one short.
    let len = 37;
    for (job, (elem_type, op)) in [
        (XinaType::Int32, XinaOp::Sum),
        (XinaType::Int32, XinaOp::Max),
        (XinaType::Int64, XinaOp::Sum),
        (XinaType::Int64, XinaOp::Min),
        (XinaType::Float32, XinaOp::Sum),
        (XinaType::Float32, XinaOp::Max),
    ]
    .into_iter()
    .enumerate()
    {
        let inputs: Vec<Vec<i64>> = (0..FAN_IN).map(|r| input(r, len)).collect();
        let want: Vec<i64> = (0..len)
            .map(|i| {
                let column = inputs.iter().map(|v| v[i]);
                match op {
                    XinaOp::Sum => column.sum(),
                    XinaOp::Max => column.max().unwrap(),
                    XinaOp::Min => column.min().unwrap(),
                }
            })
            .collect();
        let got = on_ranks(
            100 + job as u32,
            elem_type,
            op,
            XinaMode::Allreduce,
            move |rank, w| {
                let mine = input(rank, len);
                // SAFETY: each buffer holds `len` elements of the type named.
                let (status, out): (XinaStatus, Vec<i64>) = unsafe {
                    match elem_type {
                        XinaType::Int32 => {
                            let mut d: Vec<i32> = mine.iter().map(|&v| v as i32).collect();
                            let s = xina_allreduce(w, d.as_mut_ptr().cast(), len, elem_type as u32);
                            (s, d.into_iter().map(i64::from).collect())
                        }
                        XinaType::Int64 => {
                            let mut d = mine.clone();
                            let s = xina_allreduce(w, d.as_mut_ptr().cast(), len, elem_type as u32);
                            (s, d)
                        }
                        XinaType::Float32 => {
                            let mut d: Vec<f32> = mine.iter().map(|&v| v as f32).collect();
                            let s = xina_allreduce(w, d.as_mut_ptr().cast(), len, elem_type as u32);
                            (s, d.into_iter().map(|v| v.round() as i64).collect())
                        }
                    }
                };
                let mut last = XinaStats::default();
                // SAFETY: a live handle and a valid out pointer.
                let s = unsafe { xina_worker_stats(w, &raw mut last, ptr::null_mut()) };
                assert_eq!(s, XinaStatus::Ok);
                (status, last_error(), out, last)
            },
        );
        for (rank, (status, message, out, last)) in got.into_iter().enumerate() {
            let case = format!("{elem_type:?} {op:?}, rank {rank}");
            assert_eq!(status, XinaStatus::Ok, "{case}: {message}");
            assert_eq!(out, want, "{case}");
            assert_eq!(last.calls, 1, "{case}");
            assert!(last.chunks >= 3, "{case}: {last:?}");
        }
    }
}

#[test]
fn reduce_reduce_scatter_and_barrier_deliver_what_each_rank_is_owed() {
    let len = 40; // 10 per rank for reduce-scatter
    let want: Vec<i64> = (0..len)
        .map(|i| (0..FAN_IN).map(|r| input(r, len)[i]).sum())
        .collect();
    let root = 2;
    let got = on_ranks(
        200,
        XinaType::Int32,
        XinaOp::Sum,
        XinaMode::Reduce,
        move |rank, w| {
            let mut d: Vec<i32> = input(rank, len).iter().map(|&v| v as i32).collect();
            // SAFETY: `len` int32 elements.
            let s = unsafe { xina_reduce(w, root, d.as_mut_ptr().cast(), len, 0) };
            // SAFETY: a live handle.
            let b = unsafe { xina_barrier(w) };
            (s, b, last_error(), d)
        },
    );
    for (rank, (s, b, message, d)) in got.into_iter().enumerate() {
        assert_eq!(
            (s, b),
            (XinaStatus::Ok, XinaStatus::Ok),
            "rank {rank}: {message}"
        );
        if rank == usize::from(root) {
            assert_eq!(d.iter().map(|&v| i64::from(v)).collect::<Vec<_>>(), want);
        }
    }
    let got = on_ranks(
        201,
        XinaType::Int64,
        XinaOp::Sum,
        XinaMode::ReduceScatter,
        move |rank, w| {
            let mut d = input(rank, len);
            // SAFETY: `len` int64 elements.
            let s = unsafe { xina_reduce_scatter(w, d.as_mut_ptr().cast(), len, 1) };
            (s, last_error(), d)
        },
    );
    let part = len / usize::from(FAN_IN);
    for (rank, (s, message, d)) in got.into_iter().enumerate() {
        assert_eq!(s, XinaStatus::Ok, "rank {rank}: {message}");
        let mine = rank * part..(rank + 1) * part;
        assert_eq!(d[mine.clone()], want[mine], "rank {rank}");
    }
}

#[test]
fn careless_arguments_get_a_status_and_a_message_naming_them() {
    let switch = FakeSwitch::start(300, JobConfig::sum_i32(FAN_IN, SLOTS));
    let addr = CString::new(switch.addr.to_string()).unwrap();
    let good = params(
        300,
        0,
        XinaType::Int32,
        XinaOp::Sum,
        XinaMode::Allreduce,
        &addr,
    );
    let mut out = ptr::null_mut();
    // SAFETY: every pointer below is null or valid; that is the point.
    unsafe {
        assert_eq!(
            xina_worker_new(ptr::null(), &raw mut out),
            XinaStatus::NullPointer
        );
        assert!(last_error().contains("params"), "{}", last_error());
        assert_eq!(
            xina_worker_new(&good, ptr::null_mut()),
            XinaStatus::NullPointer
        );
        assert!(last_error().contains("out"));
        for (field, p) in [
            (
                "elem_type",
                XinaJobParams {
                    elem_type: 7,
                    ..good
                },
            ),
            ("op", XinaJobParams { op: 3, ..good }),
            ("mode", XinaJobParams { mode: 9, ..good }),
            (
                "switch_addr",
                XinaJobParams {
                    switch_addr: c"not an address".as_ptr(),
                    ..good
                },
            ),
            (
                "bind_addr",
                XinaJobParams {
                    bind_addr: c"1.2.3.4".as_ptr(),
                    ..good
                },
            ),
        ] {
            assert_eq!(
                xina_worker_new(&p, &raw mut out),
                XinaStatus::InvalidArgument,
                "{field}"
            );
            assert!(last_error().contains(field), "{field}: {}", last_error());
        }
        let p = XinaJobParams {
            switch_addr: ptr::null(),
            ..good
        };
        assert_eq!(xina_worker_new(&p, &raw mut out), XinaStatus::NullPointer);
        // The library's own checks of the member, named in its words.
        let p = XinaJobParams {
            rank: FAN_IN,
            ..good
        };
        assert_eq!(
            xina_worker_new(&p, &raw mut out),
            XinaStatus::InvalidArgument
        );
        assert!(last_error().contains("rank"), "{}", last_error());
        assert!(out.is_null(), "nothing made on failure");

        let w = new_worker(&good);
        let mut data = [0i32; 8];
        assert_eq!(
            xina_allreduce(ptr::null_mut(), data.as_mut_ptr().cast(), 8, 0),
            XinaStatus::NullPointer
        );
        assert_eq!(
            xina_allreduce(w, ptr::null_mut(), 8, 0),
            XinaStatus::NullPointer
        );
        assert!(last_error().contains("data"));
        // Misaligned int32 data.
        let base: *mut c_void = data.as_mut_ptr().cast();
        let odd = base.cast::<u8>().add(1).cast::<c_void>();
        assert_eq!(xina_allreduce(w, odd, 4, 0), XinaStatus::InvalidArgument);
        assert!(last_error().contains("aligned"), "{}", last_error());
        // Data of another type than the job carries.
        assert_eq!(xina_allreduce(w, base, 4, 1), XinaStatus::InvalidArgument);
        assert!(last_error().contains("int64"), "{}", last_error());
        assert_eq!(xina_allreduce(w, base, 4, 42), XinaStatus::InvalidArgument);
        // A reduce on an allreduce job: refused before anything is sent.
        assert_eq!(xina_reduce(w, 0, base, 8, 0), XinaStatus::InvalidArgument);
        assert!(last_error().contains("allreduce"), "{}", last_error());
        // A count that no memory holds.
        assert_eq!(
            xina_allreduce(w, base, usize::MAX / 2, 0),
            XinaStatus::InvalidArgument
        );
        // The local address: too small a buffer, then one that fits.
        let mut buf = [0 as c_char; 8];
        assert_eq!(
            xina_worker_local_addr(w, buf.as_mut_ptr(), buf.len()),
            XinaStatus::InvalidArgument
        );
        let mut buf = [0 as c_char; 32];
        assert_eq!(
            xina_worker_local_addr(w, buf.as_mut_ptr(), buf.len()),
            XinaStatus::Ok
        );
        let local = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(local.starts_with("127.0.0.1:"), "{local}");
        assert_eq!(last_error(), "", "a success clears the message");
        assert_eq!(
            xina_worker_stats(ptr::null(), ptr::null_mut(), ptr::null_mut()),
            XinaStatus::NullPointer
        );
        xina_worker_free(w);
        xina_worker_free(ptr::null_mut());

        let name = CStr::from_ptr(xina_status_name(XinaStatus::GaveUp as u32));
        assert_eq!(name.to_str().unwrap(), "gave up");
        let name = CStr::from_ptr(xina_status_name(1000));
        assert_eq!(name.to_str().unwrap(), "unknown status");
    }
}

#[test]
fn a_missing_peer_is_an_error_naming_the_job_not_a_hang() {
    let switch = FakeSwitch::start(400, JobConfig::sum_i32(FAN_IN, SLOTS));
    let addr = CString::new(switch.addr.to_string()).unwrap();
    let p = XinaJobParams {
        give_up_ms: 300,
        ..params(
            400,
            1,
            XinaType::Int32,
            XinaOp::Sum,
            XinaMode::Allreduce,
            &addr,
        )
    };
    let w = new_worker(&p);
    let mut data = [1i32; 20];
    // SAFETY: a live handle and 20 int32.
    let status = unsafe { xina_allreduce(w, data.as_mut_ptr().cast(), 20, 0) };
    assert_eq!(status, XinaStatus::GaveUp);
    let message = last_error();
    assert!(
        message.contains("job 400") && message.contains("rank 1"),
        "{message}"
    );
    // SAFETY: the handle, freed once.
    unsafe { xina_worker_free(w) };
}

#[test]
fn group_members_refuse_bad_parameters_and_buffers() {
    let good = XinaGroupParams {
        group: 7,
        rank: 0,
        fan_in: 2,
        bytes_per_packet: 1024,
        window: 8,
        switch_addr: c"127.0.0.1:9".as_ptr(),
        bind_addr: c"127.0.0.1:0".as_ptr(),
        give_up_ms: 200,
    };
    let mut g = ptr::null_mut();
    // SAFETY: every pointer is null or valid.
    unsafe {
        assert_eq!(
            xina_group_new(ptr::null(), &raw mut g),
            XinaStatus::NullPointer
        );
        let p = XinaGroupParams { fan_in: 1, ..good };
        assert_eq!(xina_group_new(&p, &raw mut g), XinaStatus::InvalidArgument);
        assert!(g.is_null());
        assert_eq!(
            xina_group_new(&good, &raw mut g),
            XinaStatus::Ok,
            "{}",
            last_error()
        );
        let mut data = [0u8; 10];
        assert_eq!(
            xina_broadcast(g, 0, ptr::null_mut(), 10),
            XinaStatus::NullPointer
        );
        assert_eq!(
            xina_broadcast(g, 5, data.as_mut_ptr().cast(), 10),
            XinaStatus::InvalidArgument
        );
        assert!(last_error().contains("root"), "{}", last_error());
        // 11 bytes do not split in 2 parts.
        let mut odd = [0u8; 11];
        assert_eq!(
            xina_allgather(g, odd.as_mut_ptr().cast(), 11),
            XinaStatus::InvalidArgument
        );
        // Nobody answers: the sender names the receiver it waited for.
        assert_eq!(
            xina_broadcast(g, 0, data.as_mut_ptr().cast(), 10),
            XinaStatus::GroupStalled
        );
        let mut total = XinaStats::default();
        assert_eq!(
            xina_group_stats(g, ptr::null_mut(), &raw mut total),
            XinaStatus::Ok
        );
        assert_eq!(total.calls, 0, "failed calls are not counted");
        xina_group_free(g);
    }
}

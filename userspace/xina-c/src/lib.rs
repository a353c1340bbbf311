//! The xina worker library for C programs: a C ABI over [`xina_host`]'s
//! blocking [`Worker`] and [`GroupWorker`], and the header `include/xina.h`
//! that cbindgen generates from this file.
//!
//! Conventions, for every function:
//!
//! - It returns an [`XinaStatus`]; on anything but `XINA_STATUS_OK`,
//!   [`xina_last_error`] holds a message naming what failed (the field, the
//!   environment variable, the job and rank, the missing peers). The message
//!   belongs to the calling thread and lasts until its next call into the
//!   library.
//! - Enumerations cross the boundary as `uint32_t` and are checked: a value
//!   that is not one of [`XinaType`], [`XinaOp`] or [`XinaMode`] is
//!   `XINA_STATUS_INVALID_ARGUMENT`, never undefined behaviour.
//! - A null handle, output pointer or string is `XINA_STATUS_NULL_POINTER`.
//!   A data pointer may be null only with a length of 0; it must be aligned
//!   for its element type (checked) and point to that many elements (the
//!   caller's promise: C gives no way to check it).
//! - A handle is used by one thread at a time; the library keeps no other
//!   state between calls. A panic inside the library (a bug) is caught and
//!   returned as `XINA_STATUS_INTERNAL`.
//!
//! The collectives' semantics, errors and limits are the Rust library's:
//! see `xina_host` and the README's "The worker library". Jobs and groups
//! can come from the job service (`xina serve`) through [`service`]'s
//! leases, and members can be made on sockets bound before the job existed.

mod group;
mod service;

pub use group::{
    xina_allgather, xina_broadcast, xina_group_free, xina_group_new, xina_group_stats,
};
pub use service::{
    XinaLease, xina_group_adopt, xina_lease_free, xina_lease_group_params, xina_lease_job_params,
    xina_lease_new, xina_service_switch, xina_worker_adopt,
};

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use xina_host::{Config, Error, GroupWorker, JobParams, Mode, Scalar, Stats, Worker};
use xina_proto::{DType, Op};

/// What a call returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XinaStatus {
    /// It did what it was asked.
    Ok = 0,
    /// A handle, output or string pointer it needs was null.
    NullPointer = 1,
    /// An argument, a parameter or an environment variable was invalid, or
    /// the call does not fit the job (type, mode, root, length); nothing was
    /// sent.
    InvalidArgument = 2,
    /// No result came for the give-up time: a peer or the switch is gone.
    GaveUp = 3,
    /// An integer sum saturated (the data holds the saturated sums).
    Overflow = 4,
    /// The ranks did not make the same call.
    CallMismatch = 5,
    /// A float input was NaN or infinite.
    NonFinite = 6,
    /// The socket could not be bound or failed.
    Io = 7,
    /// A group call stopped moving: receivers missing or a silent root.
    GroupStalled = 8,
    /// The library failed inside (a bug); do not use the handle again.
    Internal = 9,
    /// The job service could not be reached, or refused the request (the
    /// message has its reason and the field it names).
    Refused = 10,
}

/// Element types. A float32 job is an int32 job on the switch (floats go
/// as fixed point); its members pass `XINA_TYPE_FLOAT32` data.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XinaType {
    Int32 = 0,
    Int64 = 1,
    Float32 = 2,
}

impl XinaType {
    /// The element type a job of this type carries on the switch.
    const fn on_the_switch(self) -> DType {
        match self {
            Self::Int64 => DType::I64,
            Self::Int32 | Self::Float32 => DType::I32,
        }
    }
}

/// How a job combines its elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XinaOp {
    Sum = 0,
    Max = 1,
    Min = 2,
}

/// Who gets a job's results: every rank, a chunk's root, or each rank its
/// own share.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XinaMode {
    Allreduce = 0,
    Reduce = 1,
    ReduceScatter = 2,
}

/// A job's member, as the switch's job file installs it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XinaJobParams {
    pub job: u32,
    /// This member's rank, below `fan_in`.
    pub rank: u8,
    /// Ranks in the job, 2 to 64.
    pub fan_in: u8,
    /// Elements per packet (the job's).
    pub elems_per_packet: u16,
    /// The job's slots: the most chunks a rank has in flight.
    pub slots: u32,
    /// An [`XinaOp`].
    pub op: u32,
    /// An [`XinaType`]: the job's element type on the switch. A float32
    /// job is an int32 job: `XINA_TYPE_INT32` and `XINA_TYPE_FLOAT32` make
    /// the same member, which takes int32 and float32 buffers alike.
    pub elem_type: u32,
    /// An [`XinaMode`].
    pub mode: u32,
    /// The switch's service address, `"a.b.c.d:port"`.
    pub switch_addr: *const c_char,
    /// The address to bind, `"a.b.c.d:port"` (the one the job file names
    /// for this rank); null: any address, a free port.
    pub bind_addr: *const c_char,
    /// How long a call waits without progress before it fails; 0: the
    /// library's default (5 s).
    pub give_up_ms: u32,
}

/// A multicast group's member.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XinaGroupParams {
    pub group: u32,
    /// This member's rank, below `fan_in`.
    pub rank: u8,
    /// Members, 2 to 64.
    pub fan_in: u8,
    /// Payload bytes per packet (the group's).
    pub bytes_per_packet: u16,
    /// The group's slots per sender.
    pub window: u32,
    /// The switch's service address, `"a.b.c.d:port"`.
    pub switch_addr: *const c_char,
    /// The address to bind; null: any address, a free port.
    pub bind_addr: *const c_char,
    /// As in [`XinaJobParams`].
    pub give_up_ms: u32,
}

/// Counters of one call, or summed over a handle's calls.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XinaStats {
    /// Calls these counters cover.
    pub calls: u64,
    pub chunks: u64,
    pub packets_sent: u64,
    pub bytes_sent: u64,
    pub packets_received: u64,
    pub bytes_received: u64,
    /// Chunks sent again (after a timeout, at once, or as probes).
    pub retransmissions: u64,
    pub timeouts: u64,
    /// Results the switch answered from a slot.
    pub from_cache: u64,
    /// The congestion window at the end, in chunks.
    pub window: u32,
    /// Time inside the calls, nanoseconds.
    pub elapsed_ns: u64,
}

impl XinaStats {
    fn add(&mut self, s: &Stats) {
        self.calls += 1;
        self.chunks += s.chunks;
        self.packets_sent += s.packets_sent;
        self.bytes_sent += s.bytes_sent;
        self.packets_received += s.packets_received;
        self.bytes_received += s.bytes_received;
        self.retransmissions += s.retransmissions;
        self.timeouts += s.timeouts;
        self.from_cache += s.from_cache;
        self.window = s.window;
        self.elapsed_ns += u64::try_from(s.elapsed.as_nanos()).unwrap_or(u64::MAX);
    }

    fn of(s: &Stats) -> Self {
        let mut one = Self::default();
        one.add(s);
        one
    }
}

/// A job member: a socket and what it carries from call to call.
#[derive(Debug)]
pub struct XinaWorker {
    worker: Worker,
    last: XinaStats,
    total: XinaStats,
}

/// A multicast group member.
#[derive(Debug)]
pub struct XinaGroup {
    member: GroupWorker,
    last: XinaStats,
    total: XinaStats,
}

impl XinaWorker {
    fn of(worker: Worker) -> Self {
        Self {
            worker,
            last: XinaStats::default(),
            total: XinaStats::default(),
        }
    }
}

impl XinaGroup {
    fn of(member: GroupWorker) -> Self {
        Self {
            member,
            last: XinaStats::default(),
            total: XinaStats::default(),
        }
    }
}

/// Hands `handle` to the caller through `out`.
///
/// # Safety
/// `out` is not null and valid for a write.
unsafe fn hand_out<T>(handle: T, out: *mut *mut T) {
    // SAFETY: the caller's promise.
    unsafe { *out = Box::into_raw(Box::new(handle)) };
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Why a call failed, before it becomes a status and a message.
struct Failure(XinaStatus, String);

type Outcome = Result<(), Failure>;

fn invalid(message: impl Into<String>) -> Failure {
    Failure(XinaStatus::InvalidArgument, message.into())
}

fn null(what: &str) -> Failure {
    Failure(XinaStatus::NullPointer, format!("{what} is null"))
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::GaveUp { .. } => XinaStatus::GaveUp,
            Error::Overflow { .. } => XinaStatus::Overflow,
            Error::CallMismatch { .. } => XinaStatus::CallMismatch,
            Error::NonFinite { .. } => XinaStatus::NonFinite,
            Error::Bind { .. } | Error::Io { .. } => XinaStatus::Io,
            Error::GroupStalled(_) => XinaStatus::GroupStalled,
            _ => XinaStatus::InvalidArgument,
        };
        Self(status, e.to_string())
    }
}

/// Runs `body`, records its message for [`xina_last_error`] and turns its
/// outcome (or a panic) into a status.
fn run(body: impl FnOnce() -> Outcome) -> XinaStatus {
    let (status, message) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => (XinaStatus::Ok, String::new()),
        Ok(Err(Failure(status, message))) => (status, message),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            (XinaStatus::Internal, format!("internal error: {what}"))
        }
    };
    // A message with a NUL in it keeps what comes before.
    let message = CString::new(message).unwrap_or_else(|e| {
        let end = e.nul_position();
        CString::new(&e.into_vec()[..end]).unwrap_or_default()
    });
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    status
}

/// # Safety
/// `p` is null or points to a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: not null, and NUL-terminated by the caller's promise.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| invalid(format!("{what}: not UTF-8")))
}

fn address(s: &str, what: &str) -> Result<SocketAddrV4, Failure> {
    s.parse()
        .map_err(|_| invalid(format!("{what}: {s:?} is not an IPv4 address and port")))
}

fn elem_type(v: u32, what: &str) -> Result<XinaType, Failure> {
    match v {
        0 => Ok(XinaType::Int32),
        1 => Ok(XinaType::Int64),
        2 => Ok(XinaType::Float32),
        _ => Err(invalid(format!(
            "{what}: {v} is not an element type (0 int32, 1 int64, 2 float32)"
        ))),
    }
}

fn op(v: u32) -> Result<Op, Failure> {
    Op::from_u8(u8::try_from(v).unwrap_or(u8::MAX))
        .ok_or_else(|| invalid(format!("op: {v} is not an operation (0 sum, 1 max, 2 min)")))
}

fn mode(v: u32) -> Result<Mode, Failure> {
    match v {
        0 => Ok(Mode::Allreduce),
        1 => Ok(Mode::Reduce),
        2 => Ok(Mode::ReduceScatter),
        _ => Err(invalid(format!(
            "mode: {v} is not a mode (0 allreduce, 1 reduce, 2 reduce-scatter)"
        ))),
    }
}

fn config(give_up_ms: u32) -> Config {
    let mut config = Config::default();
    if give_up_ms > 0 {
        config.give_up = Duration::from_millis(u64::from(give_up_ms));
    }
    config
}

const ANY: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);

/// The values of a job member, checked.
struct Job {
    params: JobParams,
    bind: SocketAddrV4,
    give_up_ms: u32,
}

fn job_from(p: &XinaJobParams) -> Result<Job, Failure> {
    let elem_type = elem_type(p.elem_type, "elem_type")?;
    // SAFETY: the caller's promise for the params' strings.
    let switch =
        unsafe { text(p.switch_addr, "switch_addr") }?.ok_or_else(|| null("switch_addr"))?;
    // SAFETY: as above.
    let bind = unsafe { text(p.bind_addr, "bind_addr") }?;
    Ok(Job {
        params: JobParams {
            job: p.job,
            rank: p.rank,
            fan_in: p.fan_in,
            elems_per_packet: p.elems_per_packet,
            slots: p.slots,
            op: op(p.op)?,
            dtype: elem_type.on_the_switch(),
            mode: mode(p.mode)?,
            switch: address(switch, "switch_addr")?,
        },
        bind: bind.map_or(Ok(ANY), |b| address(b, "bind_addr"))?,
        give_up_ms: p.give_up_ms,
    })
}

/// Reads an environment variable; `None` when unset.
fn env(name: &str) -> Result<Option<String>, Failure> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(invalid(format!("{name}: not UTF-8"))),
    }
}

fn env_number<T: std::str::FromStr>(name: &str, default: Option<T>) -> Result<T, Failure> {
    match env(name)? {
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| invalid(format!("{name}: {v:?} is not a number in range"))),
        None => default.ok_or_else(|| invalid(format!("{name}: not set"))),
    }
}

fn job_from_env() -> Result<Job, Failure> {
    let elem_type = match env("XINA_TYPE")?.as_deref().map(str::trim) {
        None | Some("int32") => XinaType::Int32,
        Some("int64") => XinaType::Int64,
        Some("float32") => XinaType::Float32,
        Some(other) => {
            return Err(invalid(format!(
                "XINA_TYPE: {other:?} (must be int32, int64 or float32)"
            )));
        }
    };
    let op = match env("XINA_OP")?.as_deref().map(str::trim) {
        None | Some("sum") => Op::Sum,
        Some("max") => Op::Max,
        Some("min") => Op::Min,
        Some(other) => {
            return Err(invalid(format!(
                "XINA_OP: {other:?} (must be sum, max or min)"
            )));
        }
    };
    let mode = match env("XINA_MODE")?.as_deref().map(str::trim) {
        None | Some("allreduce") => Mode::Allreduce,
        Some("reduce") => Mode::Reduce,
        Some("reduce-scatter") => Mode::ReduceScatter,
        Some(other) => {
            return Err(invalid(format!(
                "XINA_MODE: {other:?} (must be allreduce, reduce or reduce-scatter)"
            )));
        }
    };
    let switch = env("XINA_SWITCH")?.ok_or_else(|| invalid("XINA_SWITCH: not set"))?;
    let bind = env("XINA_BIND")?;
    Ok(Job {
        params: JobParams {
            job: env_number("XINA_JOB", None)?,
            rank: env_number("XINA_RANK", None)?,
            fan_in: env_number("XINA_FAN_IN", None)?,
            elems_per_packet: env_number("XINA_ELEMS_PER_PACKET", None)?,
            slots: env_number("XINA_SLOTS", None)?,
            op,
            dtype: elem_type.on_the_switch(),
            mode,
            switch: address(switch.trim(), "XINA_SWITCH")?,
        },
        bind: bind.map_or(Ok(ANY), |b| address(b.trim(), "XINA_BIND"))?,
        give_up_ms: env_number("XINA_GIVE_UP_MS", Some(0))?,
    })
}

/// # Safety
/// `out` is null or valid for a write of a pointer.
unsafe fn new_worker(job: Result<Job, Failure>, out: *mut *mut XinaWorker) -> Outcome {
    if out.is_null() {
        return Err(null("out"));
    }
    let job = job?;
    let worker = Worker::new(job.params, job.bind, config(job.give_up_ms))?;
    // SAFETY: `out` is not null and valid for a write (the caller's promise).
    unsafe { hand_out(XinaWorker::of(worker), out) };
    Ok(())
}

/// Creates a job member from `params` and binds its socket; `*out` is the
/// handle, for [`xina_worker_free`].
///
/// # Safety
/// `params` is null or points to an [`XinaJobParams`] whose strings are null
/// or NUL-terminated; `out` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_new(
    params: *const XinaJobParams,
    out: *mut *mut XinaWorker,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a valid XinaJobParams (the caller's promise).
        let params = unsafe { params.as_ref() }.ok_or_else(|| null("params"))?;
        // SAFETY: the caller's promise for `out`.
        unsafe { new_worker(job_from(params), out) }
    })
}

/// Creates a job member from the environment: `XINA_JOB`, `XINA_RANK`,
/// `XINA_FAN_IN`, `XINA_ELEMS_PER_PACKET`, `XINA_SLOTS`, `XINA_SWITCH`
/// (`a.b.c.d:port`) required; `XINA_TYPE` (`int32`, `int64`, `float32`),
/// `XINA_OP` (`sum`, `max`, `min`), `XINA_MODE` (`allreduce`, `reduce`,
/// `reduce-scatter`), `XINA_BIND`, `XINA_GIVE_UP_MS` optional. A bad value's
/// error names its variable.
///
/// # Safety
/// `out` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_from_env(out: *mut *mut XinaWorker) -> XinaStatus {
    // SAFETY: the caller's promise for `out`.
    run(|| unsafe { new_worker(job_from_env(), out) })
}

/// Closes the member's socket and frees the handle. Null is ignored.
///
/// # Safety
/// `worker` is null or a handle from [`xina_worker_new`] or
/// [`xina_worker_from_env`] not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_free(worker: *mut XinaWorker) {
    if !worker.is_null() {
        // SAFETY: a live handle made by Box::into_raw (the caller's promise).
        drop(unsafe { Box::from_raw(worker) });
    }
}

/// # Safety
/// `worker` is null or a live handle not used by another thread.
unsafe fn worker_mut<'a>(worker: *mut XinaWorker) -> Result<&'a mut XinaWorker, Failure> {
    // SAFETY: null or a live, unshared handle (the caller's promise).
    unsafe { worker.as_mut() }.ok_or_else(|| null("worker"))
}

/// `count` elements of `T` at `data` as a slice.
///
/// # Safety
/// `data` is null (with `count` 0) or points to `count` elements of `T`,
/// writable and not used elsewhere during the call.
unsafe fn elements<'a, T>(data: *mut c_void, count: usize) -> Result<&'a mut [T], Failure> {
    if checked::<T>(data, count, "data")? {
        // SAFETY: aligned, not null, `count` elements (the caller's promise).
        Ok(unsafe { std::slice::from_raw_parts_mut(data.cast::<T>(), count) })
    } else {
        Ok(&mut [])
    }
}

/// As [`elements`], read only.
///
/// # Safety
/// `data` is null (with `count` 0) or points to `count` elements of `T`
/// that nothing writes during the call.
unsafe fn elements_in<'a, T>(data: *const c_void, count: usize) -> Result<&'a [T], Failure> {
    if checked::<T>(data, count, "input")? {
        // SAFETY: aligned, not null, `count` elements (the caller's promise).
        Ok(unsafe { std::slice::from_raw_parts(data.cast::<T>(), count) })
    } else {
        Ok(&[])
    }
}

/// Whether `count` elements of `T` at `data` make a slice (`false`: an
/// empty one); the error names `what`.
fn checked<T>(data: *const c_void, count: usize, what: &str) -> Result<bool, Failure> {
    if count == 0 {
        return Ok(false);
    }
    if data.is_null() {
        return Err(null(what));
    }
    if !(data as usize).is_multiple_of(align_of::<T>()) {
        return Err(invalid(format!(
            "{what}: not aligned to {} bytes for its elements",
            align_of::<T>()
        )));
    }
    if count
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(format!(
            "count: {count} elements do not fit memory"
        )));
    }
    Ok(true)
}

/// What a collective does with a slice of one element type.
trait Call {
    fn call<S: Scalar>(&self, worker: &mut Worker, data: &mut [S]) -> Result<Stats, Error>;
}

/// Runs `what` on `count` elements of type `elem_type` at `data`.
///
/// # Safety
/// As [`elements`], and `worker` as [`worker_mut`].
unsafe fn collective(
    worker: *mut XinaWorker,
    data: *mut c_void,
    count: usize,
    elem_type: u32,
    what: &impl Call,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise.
        let w = unsafe { worker_mut(worker) }?;
        // The job refuses data of another type than it carries, naming
        // both (float32 rides on int32 jobs).
        let t = self::elem_type(elem_type, "elem_type")?;
        // SAFETY: the caller's promise for `data` and `count`.
        let stats = unsafe {
            match t {
                XinaType::Int32 => what.call(&mut w.worker, elements::<i32>(data, count)?),
                XinaType::Int64 => what.call(&mut w.worker, elements::<i64>(data, count)?),
                XinaType::Float32 => what.call(&mut w.worker, elements::<f32>(data, count)?),
            }
        };
        record(&mut w.last, &mut w.total, stats)
    })
}

fn record(last: &mut XinaStats, total: &mut XinaStats, stats: Result<Stats, Error>) -> Outcome {
    let stats = stats?;
    *last = XinaStats::of(&stats);
    total.add(&stats);
    Ok(())
}

struct Allreduce;
impl Call for Allreduce {
    fn call<S: Scalar>(&self, worker: &mut Worker, data: &mut [S]) -> Result<Stats, Error> {
        worker.allreduce(data)
    }
}

struct Reduce(u8);
impl Call for Reduce {
    fn call<S: Scalar>(&self, worker: &mut Worker, data: &mut [S]) -> Result<Stats, Error> {
        worker.reduce(self.0, data)
    }
}

struct ReduceScatter;
impl Call for ReduceScatter {
    fn call<S: Scalar>(&self, worker: &mut Worker, data: &mut [S]) -> Result<Stats, Error> {
        worker.reduce_scatter(data)
    }
}

/// Combines `count` elements at `data` over the job's ranks with the job's
/// operation, in place: every rank gets the result. The job's mode must be
/// allreduce. On error the data is unspecified.
///
/// # Safety
/// `worker` is null or a live handle used by no other thread; `data` is null
/// (with `count` 0) or points to `count` writable elements of `elem_type`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_allreduce(
    worker: *mut XinaWorker,
    data: *mut c_void,
    count: usize,
    elem_type: u32,
) -> XinaStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { collective(worker, data, count, elem_type, &Allreduce) }
}

/// [`xina_allreduce`] out of place: `count` elements at `input` are sent
/// and left as they were, the results land at `output` (the two must not
/// overlap). int32 and int64 go straight from `input`; float32 is copied
/// to `output` first (its fixed-point conversion needs a buffer anyway).
///
/// # Safety
/// As [`xina_allreduce`]; `input` is null (with `count` 0) or points to
/// `count` readable elements of `elem_type` that nothing writes during the
/// call, disjoint from `output`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_allreduce_from(
    worker: *mut XinaWorker,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    elem_type: u32,
) -> XinaStatus {
    /// # Safety
    /// As the function's.
    unsafe fn from<T: xina_host::Element>(
        w: &mut XinaWorker,
        input: *const c_void,
        output: *mut c_void,
        count: usize,
    ) -> Outcome {
        // SAFETY: the caller's promise; null and alignment are checked.
        let (input, output) = unsafe {
            (
                elements_in::<T>(input, count)?,
                elements::<T>(output, count)?,
            )
        };
        let stats = w.worker.allreduce_from(input, output);
        record(&mut w.last, &mut w.total, stats)
    }
    run(|| {
        // SAFETY: the caller's promise.
        let w = unsafe { worker_mut(worker) }?;
        // SAFETY: the caller's promise for the buffers.
        unsafe {
            match self::elem_type(elem_type, "elem_type")? {
                XinaType::Int32 => from::<i32>(w, input, output, count),
                XinaType::Int64 => from::<i64>(w, input, output, count),
                XinaType::Float32 => {
                    let src = elements_in::<f32>(input, count)?;
                    let dst = elements::<f32>(output, count)?;
                    dst.copy_from_slice(src);
                    record(&mut w.last, &mut w.total, w.worker.allreduce(dst))
                }
            }
        }
    })
}

/// Like [`xina_allreduce`] on a reduce job: only `root` gets the result
/// (the others' data is unspecified afterwards).
///
/// # Safety
/// As [`xina_allreduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_reduce(
    worker: *mut XinaWorker,
    root: u8,
    data: *mut c_void,
    count: usize,
    elem_type: u32,
) -> XinaStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { collective(worker, data, count, elem_type, &Reduce(root)) }
}

/// Like [`xina_allreduce`] on a reduce-scatter job: `count` (a multiple of
/// the ranks) is cut in `fan_in` equal parts and rank `r` gets part `r`'s
/// result in place.
///
/// # Safety
/// As [`xina_allreduce`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_reduce_scatter(
    worker: *mut XinaWorker,
    data: *mut c_void,
    count: usize,
    elem_type: u32,
) -> XinaStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { collective(worker, data, count, elem_type, &ReduceScatter) }
}

/// Returns once every rank of the job has called it.
///
/// # Safety
/// `worker` is null or a live handle used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_barrier(worker: *mut XinaWorker) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise.
        let w = unsafe { worker_mut(worker) }?;
        let stats = w.worker.barrier();
        record(&mut w.last, &mut w.total, stats)
    })
}

/// Copies the counters of the member's last successful call into `*last`
/// and their sums over its calls into `*total`; either may be null.
///
/// # Safety
/// `worker` is null or a live handle; `last` and `total` are null or valid
/// for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_stats(
    worker: *const XinaWorker,
    last: *mut XinaStats,
    total: *mut XinaStats,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a live handle (the caller's promise).
        let w = unsafe { worker.as_ref() }.ok_or_else(|| null("worker"))?;
        // SAFETY: null or valid for writes (the caller's promise).
        unsafe { write_stats(w.last, w.total, last, total) };
        Ok(())
    })
}

/// # Safety
/// `last` and `total` are null or valid for a write.
unsafe fn write_stats(
    from_last: XinaStats,
    from_total: XinaStats,
    last: *mut XinaStats,
    total: *mut XinaStats,
) {
    // SAFETY: null or valid for a write (the caller's promise).
    if let Some(l) = unsafe { last.as_mut() } {
        *l = from_last;
    }
    // SAFETY: as above.
    if let Some(t) = unsafe { total.as_mut() } {
        *t = from_total;
    }
}

/// Writes the address the member's socket is bound to (the one the switch
/// must know this rank by), `"a.b.c.d:port"` and a NUL, into `buf` of
/// `len` bytes; `XINA_STATUS_INVALID_ARGUMENT` if it does not fit.
///
/// # Safety
/// `worker` is null or a live handle; `buf` is null or valid for `len`
/// bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_local_addr(
    worker: *const XinaWorker,
    buf: *mut c_char,
    len: usize,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a live handle (the caller's promise).
        let w = unsafe { worker.as_ref() }.ok_or_else(|| null("worker"))?;
        let addr = w.worker.local_addr()?.to_string();
        // SAFETY: the caller's promise for `buf` and `len`.
        unsafe { copy_out(&addr, buf, len) }
    })
}

/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
unsafe fn copy_out(s: &str, buf: *mut c_char, len: usize) -> Outcome {
    if buf.is_null() {
        return Err(null("buf"));
    }
    if s.len() >= len {
        return Err(invalid(format!(
            "len: {len} bytes cannot hold {s:?} and its NUL"
        )));
    }
    // SAFETY: `buf` holds `len > s.len()` bytes (the caller's promise).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// The message of this thread's last call into the library: empty if it
/// succeeded. Valid until the thread's next call; never null.
#[unsafe(no_mangle)]
pub extern "C" fn xina_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// A status's name (`"ok"`, `"gave up"`, ...), for messages; never null.
#[unsafe(no_mangle)]
pub extern "C" fn xina_status_name(status: u32) -> *const c_char {
    let name: &'static CStr = match status {
        0 => c"ok",
        1 => c"null pointer",
        2 => c"invalid argument",
        3 => c"gave up",
        4 => c"overflow",
        5 => c"call mismatch",
        6 => c"non-finite float",
        7 => c"socket error",
        8 => c"group stalled",
        9 => c"internal error",
        10 => c"refused by the job service",
        _ => c"unknown status",
    };
    name.as_ptr()
}

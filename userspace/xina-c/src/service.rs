//! The job service's client (`xina serve`, API v1): ask it for a job or a
//! group, keep the lease renewed on a thread of the library's, release it;
//! and members made on sockets the caller bound before the job existed.

use std::ffi::{CString, c_char};
use std::net::UdpSocket;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;
use xina_host::{GroupWorker, Worker};

use super::{
    Failure, XinaGroup, XinaGroupParams, XinaJobParams, XinaStatus, XinaWorker, config, copy_out,
    hand_out, invalid, job_from, null, run, text,
};

/// How long one request to the service may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn refused(message: String) -> Failure {
    Failure(XinaStatus::Refused, message)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .build()
        .into()
}

/// One request; its JSON answer on a 2xx status, else the service's
/// message (with the field it names) as a refusal.
fn request(method: &str, url: &str, token: &str, body: Option<&str>) -> Result<Value, Failure> {
    let auth = format!("Bearer {token}");
    let agent = agent();
    let sent = match method {
        "GET" => agent.get(url).header("Authorization", &auth).call(),
        "DELETE" => agent.delete(url).header("Authorization", &auth).call(),
        _ => {
            let r = agent
                .post(url)
                .header("Authorization", &auth)
                .header("Content-Type", "application/json");
            r.send(body.unwrap_or("{}"))
        }
    };
    let mut resp = sent.map_err(|e| refused(format!("the job service at {url}: {e}")))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| refused(format!("the job service at {url}: reading its answer: {e}")))?;
    let value: Value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text)
            .map_err(|e| refused(format!("the job service at {url}: not JSON ({e}): {text}")))?
    };
    if (200..300).contains(&status) {
        return Ok(value);
    }
    let error = &value["error"];
    let message = error["message"].as_str().unwrap_or(&text);
    Err(refused(match error["field"].as_str() {
        Some(field) => format!("the job service refused ({status}): {field}: {message}"),
        None => format!("the job service refused ({status}): {message}"),
    }))
}

/// # Safety
/// `p` is null or NUL-terminated.
unsafe fn required<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: the caller's promise.
    unsafe { text(p, what) }?.ok_or_else(|| null(what))
}

fn base(url: &str) -> String {
    url.trim_end_matches('/').to_owned()
}

/// Asks the job service at `url` (`http://a.b.c.d:port`) with `token` for
/// the switch's address (where members send), and writes it,
/// `"a.b.c.d:port"` and a NUL, into `buf` of `len` bytes.
/// `XINA_STATUS_REFUSED` when the service cannot be reached or refuses.
///
/// # Safety
/// `url` and `token` are null or NUL-terminated; `buf` is null or valid for
/// `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_service_switch(
    url: *const c_char,
    token: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise for the strings.
        let (url, token) = unsafe { (required(url, "url")?, required(token, "token")?) };
        let info = request("GET", &format!("{}/v1/switch", base(url)), token, None)?;
        let addr = info["switch_addr"].as_str().ok_or_else(|| {
            refused(format!(
                "the job service at {url}: no switch_addr in {info}"
            ))
        })?;
        // SAFETY: the caller's promise for `buf` and `len`.
        unsafe { copy_out(addr, buf, len) }
    })
}

/// A job or group leased from the job service, renewed by a thread of the
/// library's until [`xina_lease_free`].
#[derive(Debug)]
pub struct XinaLease {
    url: String,
    token: String,
    id: u32,
    job: Value,
    switch_addr: CString,
    /// Why the last renewal failed, if it did.
    renewal: Arc<Mutex<Option<String>>>,
    stop: Option<(Sender<()>, JoinHandle<()>)>,
}

impl XinaLease {
    /// Stops the renewal thread and waits for it.
    fn stop_renewing(&mut self) {
        if let Some((stop, thread)) = self.stop.take() {
            // A thread that ended already has dropped its receiver.
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

impl Drop for XinaLease {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

/// Asks the job service at `url` with `token` for a job or group:
/// `request` is the JSON body of `POST /v1/jobs` (`{"mode": ..., "members":
/// [{"ip", "port", "mac"}, ...]}`, see the README's "The job service").
/// `*out` is the lease, renewed every third of its length until
/// [`xina_lease_free`]. `XINA_STATUS_REFUSED` with the service's message
/// (naming the field) when it cannot be reached or refuses.
///
/// # Safety
/// `url`, `token` and `request` are null or NUL-terminated; `out` is null or
/// valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_lease_new(
    url: *const c_char,
    token: *const c_char,
    request_json: *const c_char,
    out: *mut *mut XinaLease,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise for the strings.
        let (url, token, body) = unsafe {
            (
                required(url, "url")?,
                required(token, "token")?,
                required(request_json, "request")?,
            )
        };
        if out.is_null() {
            return Err(null("out"));
        }
        let url = base(url);
        let created = request("POST", &format!("{url}/v1/jobs"), token, Some(body))?;
        let malformed = || {
            refused(format!(
                "the job service at {url}: unexpected answer {created}"
            ))
        };
        let job = created["job"].clone();
        let id = job["id"]
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(malformed)?;
        let lease_secs = created["lease_secs"].as_u64().ok_or_else(malformed)?;
        let switch_addr = created["switch_addr"]
            .as_str()
            .and_then(|s| CString::new(s).ok())
            .ok_or_else(malformed)?;
        let renewal = Arc::new(Mutex::new(None));
        let (stop, stopped) = mpsc::channel::<()>();
        let every = Duration::from_millis(lease_secs.saturating_mul(1000) / 3)
            .max(Duration::from_millis(100));
        let (renew_url, renew_token, record) = (
            format!("{url}/v1/jobs/{id}/renew"),
            token.to_owned(),
            Arc::clone(&renewal),
        );
        let thread = std::thread::Builder::new()
            .name(format!("xina-lease-{id}"))
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let outcome = request("POST", &renew_url, &renew_token, Some("{}"));
                    let mut last = record
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    *last = outcome.err().map(|Failure(_, m)| m);
                }
            })
            .map_err(|e| {
                Failure(
                    XinaStatus::Internal,
                    format!("starting the renewal thread: {e}"),
                )
            })?;
        let lease = Box::new(XinaLease {
            url,
            token: token.to_owned(),
            id,
            job,
            switch_addr,
            renewal,
            stop: Some((stop, thread)),
        });
        // SAFETY: not null and valid for a write (the caller's promise).
        unsafe { *out = Box::into_raw(lease) };
        Ok(())
    })
}

/// # Safety
/// `lease` is null or a live lease.
unsafe fn lease_ref<'a>(lease: *const XinaLease) -> Result<&'a XinaLease, Failure> {
    // SAFETY: the caller's promise.
    unsafe { lease.as_ref() }.ok_or_else(|| null("lease"))
}

fn number<T: TryFrom<u64>>(job: &Value, key: &str) -> Result<T, Failure> {
    job[key]
        .as_u64()
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| invalid(format!("the leased job has no {key} in range: {job}")))
}

/// Fills `*out` with the leased job's parameters for a member: `rank` 0,
/// `bind_addr` null, `give_up_ms` 0 (the caller sets its own), and
/// `switch_addr` the service's answer, owned by the lease.
/// `XINA_STATUS_INVALID_ARGUMENT` for a group.
///
/// # Safety
/// `lease` is null or a live lease; `out` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_lease_job_params(
    lease: *const XinaLease,
    out: *mut XinaJobParams,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise.
        let l = unsafe { lease_ref(lease) }?;
        // SAFETY: the caller's promise.
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        let job = &l.job;
        let mode = match job["mode"].as_str() {
            Some("allreduce") => 0,
            Some("reduce") => 1,
            Some("reduce-scatter") => 2,
            other => return Err(invalid(format!("lease {}: a {other:?}, not a job", l.id))),
        };
        *out = XinaJobParams {
            job: l.id,
            rank: 0,
            fan_in: number(job, "fan_in")?,
            elems_per_packet: number(job, "elems_per_packet")?,
            slots: number(job, "slot_count")?,
            op: match job["op"].as_str() {
                Some("max") => 1,
                Some("min") => 2,
                _ => 0,
            },
            elem_type: u32::from(job["dtype"].as_str() == Some("i64")),
            mode,
            switch_addr: l.switch_addr.as_ptr(),
            bind_addr: std::ptr::null(),
            give_up_ms: 0,
        };
        Ok(())
    })
}

/// As [`xina_lease_job_params`], for a leased multicast group.
///
/// # Safety
/// As [`xina_lease_job_params`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_lease_group_params(
    lease: *const XinaLease,
    out: *mut XinaGroupParams,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller's promise.
        let l = unsafe { lease_ref(lease) }?;
        // SAFETY: the caller's promise.
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        let job = &l.job;
        if job["mode"].as_str() != Some("multicast") {
            return Err(invalid(format!("lease {}: not a multicast group", l.id)));
        }
        *out = XinaGroupParams {
            group: l.id,
            rank: 0,
            fan_in: number(job, "fan_in")?,
            bytes_per_packet: number(job, "bytes_per_packet")?,
            window: number(job, "window")?,
            switch_addr: l.switch_addr.as_ptr(),
            bind_addr: std::ptr::null(),
            give_up_ms: 0,
        };
        Ok(())
    })
}

/// Stops renewing the lease, asks the service to remove the job
/// (`DELETE`), and frees the lease. Null is ignored. The status says
/// whether the removal (or, before it, the last renewal) failed; the lease
/// is freed either way.
///
/// # Safety
/// `lease` is null or a lease from [`xina_lease_new`] not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_lease_free(lease: *mut XinaLease) -> XinaStatus {
    if lease.is_null() {
        return XinaStatus::Ok;
    }
    // SAFETY: a live lease made by Box::into_raw (the caller's promise).
    let mut l = unsafe { Box::from_raw(lease) };
    run(move || {
        l.stop_renewing();
        let url = format!("{}/v1/jobs/{}", l.url, l.id);
        let removed = request("DELETE", &url, &l.token, None).map(drop);
        let renewal = l
            .renewal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match (removed, renewal) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(m)) => Err(refused(format!("renewing lease {}: {m}", l.id))),
            (Ok(()), None) => Ok(()),
        }
    })
}

/// # Safety
/// `fd` is a UDP socket the caller owns and gives up.
unsafe fn adopt_socket(fd: i32) -> Result<UdpSocket, Failure> {
    if fd < 0 {
        return Err(invalid(format!("fd: {fd} is not a descriptor")));
    }
    // SAFETY: an open descriptor the caller hands over (its promise).
    let socket = UdpSocket::from(unsafe { OwnedFd::from_raw_fd(fd) });
    match socket.local_addr() {
        Ok(std::net::SocketAddr::V4(_)) => Ok(socket),
        Ok(other) => Err(invalid(format!(
            "fd: bound to {other}, not an IPv4 address"
        ))),
        Err(e) => Err(invalid(format!("fd: not a bound UDP socket ({e})"))),
    }
}

/// As [`super::xina_worker_new`], on the UDP socket `fd`, bound already to
/// the address the job names for this rank (`bind_addr` is ignored): ranks
/// bind first, tell the job service their addresses, then make their
/// members. The member owns `fd` from then on, also when this fails.
///
/// # Safety
/// As [`super::xina_worker_new`]; `fd` is an open UDP socket the caller
/// gives up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_worker_adopt(
    params: *const XinaJobParams,
    fd: i32,
    out: *mut *mut XinaWorker,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller gives `fd` up.
        let socket = unsafe { adopt_socket(fd) }?;
        // SAFETY: null or a valid XinaJobParams (the caller's promise).
        let p = unsafe { params.as_ref() }.ok_or_else(|| null("params"))?;
        if out.is_null() {
            return Err(null("out"));
        }
        let job = job_from(p)?;
        let worker = Worker::with_socket(job.params, socket, config(job.give_up_ms))?;
        // SAFETY: not null and valid for a write (the caller's promise).
        unsafe { hand_out(XinaWorker::of(worker), out) };
        Ok(())
    })
}

/// As [`xina_worker_adopt`], for a multicast group member.
///
/// # Safety
/// As [`super::xina_group_new`]; `fd` as in [`xina_worker_adopt`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_group_adopt(
    params: *const XinaGroupParams,
    fd: i32,
    out: *mut *mut XinaGroup,
) -> XinaStatus {
    run(|| {
        // SAFETY: the caller gives `fd` up.
        let socket = unsafe { adopt_socket(fd) }?;
        // SAFETY: null or a valid XinaGroupParams (the caller's promise).
        let p = unsafe { params.as_ref() }.ok_or_else(|| null("params"))?;
        if out.is_null() {
            return Err(null("out"));
        }
        let (params, give_up_ms) = super::group::group_from(p)?;
        let member = GroupWorker::with_socket(params, socket, config(give_up_ms))?;
        // SAFETY: not null and valid for a write (the caller's promise).
        unsafe { hand_out(XinaGroup::of(member), out) };
        Ok(())
    })
}

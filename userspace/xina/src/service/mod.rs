//! The job service behind `xina serve`: tenants' launchers (the MPI
//! interposition library, a batch scheduler, a script) ask it over HTTP for
//! jobs and groups on a pinned switch, within quotas, under leases. It runs
//! in the switch's network namespace and uses the control plane's
//! operations ([`control::add_job`], [`Dataplane::remove_job`]) as the
//! `xina job` command does, so its jobs show in `xina job ls` like any other.
//!
//! # API, version 1
//!
//! Every request but `GET /metrics` carries `Authorization: Bearer TOKEN`,
//! a tenant's token from the service file. Bodies are JSON. An error is
//! `{"error": {"field": "members[1].ip", "message": "..."}}` (`field` is
//! `null` where no field is at fault) with status 400 (bad request), 401
//! (no or unknown token), 404 (no such job of this tenant), 429 (the
//! tenant's quota), 503 (the switch is down or out of slots, ids or
//! wide-path memory).
//!
//! - `GET /v1/switch`: `{"api", "switch_addr", "lease_secs", "tenant":
//!   {"name", "jobs", "max_jobs", "slots", "max_slots"}, "slot_pool",
//!   "slots_free", "ports": [{"name", "mtu"}]}`.
//! - `POST /v1/jobs` with `{"mode", "op", "dtype", "elems_per_packet",
//!   "bytes_per_packet", "slots", "window", "members": [{"ip", "port",
//!   "mac", "sender"}]}` (only `members` is required; a member's rank is its
//!   index; the switch port of each member comes from the service file's
//!   `[[hosts]]`): 201 with `{"job": JOB, "lease_secs", "switch_addr"}`,
//!   where `JOB` is as `xina job show --json` prints it. Defaults: mode
//!   `allreduce`, op `sum`, dtype `i32`, `elems_per_packet` the most the
//!   members' ports' MTU allows (within one 1,500-byte frame unless the
//!   mode is allreduce, and within the wide-path memory left), 32 slots;
//!   groups: `bytes_per_packet` 1,440, window 16.
//! - `GET /v1/jobs`: `{"jobs": [{"job": JOB, "expires_in_ms"}]}`, this
//!   tenant's.
//! - `GET /v1/jobs/{id}`: `{"job": JOB, "expires_in_ms"}`.
//! - `POST /v1/jobs/{id}/renew`: `{"id", "lease_secs"}`; a lease not
//!   renewed within `lease_secs` ends, and its job is removed.
//! - `DELETE /v1/jobs/{id}`: 204; the job is removed.
//! - `GET /metrics`: the switch's families (as `xina exporter`) and the
//!   service's: `xina_service_tenants`, `xina_service_leases`,
//!   `xina_service_tenant_jobs`, `xina_service_tenant_slots`,
//!   `xina_service_leases_expired_total`, `xina_service_requests_refused_total`.
//!
//! The service keeps its leases in memory: at start it removes the jobs in
//! its id range that an earlier run left (their leases are unknown), and
//! at a clean stop it removes every job it leased.

mod api;
mod config;

use std::{
    collections::BTreeMap,
    net::SocketAddrV4,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, StatusCode, header};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter as Total, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::Serialize;
use xina_proto::{DType, MAX_RANKS, frame};

pub use self::{
    api::{ApiError, JobRequest, MemberRequest, RunError, router, run},
    config::{HostEntry, MIN_TOKEN_LEN, ServiceConfig, ServiceFile, TenantEntry},
};
use crate::{
    Dataplane,
    config::{ConfigError, JobFile, JobMember, ModeName},
    control::{self, JobError, JobView},
    dataplane, metrics, netdev,
    pin::PinDir,
};

/// The API's version, the first segment of every path but `/metrics`.
pub const API: &str = "v1";

/// Slots of a job whose request gives none.
pub const DEFAULT_SLOTS: u32 = 32;

/// Window of a multicast group whose request gives none.
pub const DEFAULT_WINDOW: u32 = 16;

/// `201` of `POST /v1/jobs`.
#[derive(Clone, Debug, Serialize)]
pub struct Created {
    pub job: JobView,
    pub lease_secs: u64,
    pub switch_addr: SocketAddrV4,
}

/// A leased job as `GET /v1/jobs` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct Leased {
    pub job: JobView,
    pub expires_in_ms: u64,
}

/// `GET /v1/jobs`.
#[derive(Clone, Debug, Serialize)]
pub struct Leases {
    pub jobs: Vec<Leased>,
}

/// `POST /v1/jobs/{id}/renew`.
#[derive(Clone, Debug, Serialize)]
pub struct Renewed {
    pub id: u32,
    pub lease_secs: u64,
}

/// A tenant's usage and quota.
#[derive(Clone, Debug, Serialize)]
pub struct TenantView {
    pub name: String,
    pub jobs: u32,
    pub max_jobs: u32,
    pub slots: u32,
    pub max_slots: u32,
}

/// A switch port as `GET /v1/switch` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PortInfo {
    pub name: String,
    pub mtu: Option<u32>,
}

/// `GET /v1/switch`.
#[derive(Clone, Debug, Serialize)]
pub struct SwitchInfo {
    pub api: &'static str,
    pub switch_addr: SocketAddrV4,
    pub lease_secs: u64,
    pub tenant: TenantView,
    pub slot_pool: u32,
    pub slots_free: u32,
    pub ports: Vec<PortInfo>,
}

#[derive(Clone, Debug)]
struct Lease {
    tenant: usize,
    slots: u32,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Book {
    leases: BTreeMap<u32, Lease>,
    expired: u64,
    /// Refused requests by status code.
    refused: BTreeMap<u16, u64>,
}

/// Why the service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Dataplane(#[from] dataplane::Error),
}

/// The job service of one pinned switch.
#[derive(Debug)]
pub struct Service {
    config: ServiceConfig,
    dir: PinDir,
    book: Mutex<Book>,
}

impl Service {
    /// The service of switch `dir` (which must be up); removes the jobs in
    /// the service's id range that an earlier run left, returning their ids.
    /// Runs in the switch's network namespace.
    ///
    /// # Errors
    /// The switch is not up; a `[[hosts]]` port is not one of its ports.
    pub fn new(config: ServiceConfig, dir: PinDir) -> Result<(Self, Vec<u32>), StartError> {
        let mut sw = control::open(&dir)?;
        for (i, h) in config.file.hosts.iter().enumerate() {
            if !sw.dp.ports().iter().any(|p| p.name == h.port) {
                let ports: Vec<&str> = sw.dp.ports().iter().map(|p| p.name.as_str()).collect();
                return Err(ConfigError {
                    field: format!("hosts[{i}].port"),
                    message: format!(
                        "{} is not a port of switch {} (its ports: {})",
                        h.port,
                        dir.name(),
                        ports.join(", ")
                    ),
                }
                .into());
            }
        }
        let [first, last] = config.file.job_ids;
        let stale: Vec<u32> = sw
            .dp
            .jobs()
            .map(|j| j.id)
            .filter(|id| (first..=last).contains(id))
            .collect();
        for &id in &stale {
            sw.dp.remove_job(id)?;
        }
        drop(sw);
        Ok((
            Self {
                config,
                dir,
                book: Mutex::new(Book::default()),
            },
            stale,
        ))
    }

    /// The checked service file.
    pub const fn config(&self) -> &ServiceConfig {
        &self.config
    }

    fn lease_len(&self) -> Duration {
        Duration::from_secs(self.config.file.lease_secs)
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic while holding the book leaves it consistent (every
        // change is one insert or remove), so a poisoned lock is usable.
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn open(&self) -> Result<control::Switch, ApiError> {
        control::open(&self.dir).map_err(|e| ApiError::switch(&e))
    }

    /// Counts a refused request by its status, for `/metrics`.
    pub fn refused(&self, status: StatusCode) {
        *self.book().refused.entry(status.as_u16()).or_default() += 1;
    }

    /// The tenant `headers` authenticate.
    ///
    /// # Errors
    /// 401 when there is no token or it is no tenant's.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<usize, ApiError> {
        let unauthorized = |m: &str| ApiError::field(StatusCode::UNAUTHORIZED, "authorization", m);
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing (send `Authorization: Bearer TOKEN`)"))?;
        value
            .to_str()
            .ok()
            .and_then(|v| self.config.tenant(v))
            .ok_or_else(|| unauthorized("not a token of this service"))
    }

    fn usage(book: &Book, tenant: usize) -> (u32, u32) {
        book.leases
            .values()
            .filter(|l| l.tenant == tenant)
            .fold((0, 0), |(j, s), l| (j + 1, s + l.slots))
    }

    /// `GET /v1/switch`.
    ///
    /// # Errors
    /// 503 when the switch is down.
    pub fn switch_info(&self, tenant: usize) -> Result<SwitchInfo, ApiError> {
        let sw = self.open()?;
        let t = &self.config.file.tenants[tenant];
        let (jobs, slots) = Self::usage(&self.book(), tenant);
        let pool = sw.dp.slot_pool();
        let used: u32 = sw.dp.jobs().map(|j| j.slot_count).sum();
        Ok(SwitchInfo {
            api: API,
            switch_addr: self.config.file.switch_addr,
            lease_secs: self.config.file.lease_secs,
            tenant: TenantView {
                name: t.name.clone(),
                jobs,
                max_jobs: t.max_jobs,
                slots,
                max_slots: t.max_slots,
            },
            slot_pool: pool,
            slots_free: pool.saturating_sub(used),
            ports: sw
                .dp
                .ports()
                .iter()
                .map(|p| PortInfo {
                    name: p.name.clone(),
                    mtu: netdev::mtu(&p.name).ok(),
                })
                .collect(),
        })
    }

    /// `POST /v1/jobs`: installs the job `req` asks for and leases it to
    /// `tenant`.
    ///
    /// # Errors
    /// 400 naming the field, 429 over the tenant's quota, 503 when the
    /// switch is down or has no room.
    pub fn create(&self, tenant: usize, req: &JobRequest) -> Result<Created, ApiError> {
        let bad = |field: String, m: String| ApiError::field(StatusCode::BAD_REQUEST, field, m);
        if req.members.is_empty() {
            return Err(bad("members".into(), "empty (a job needs members)".into()));
        }
        if req.members.len() > MAX_RANKS {
            return Err(bad(
                "members".into(),
                format!(
                    "{} members, more than a job takes ({MAX_RANKS})",
                    req.members.len()
                ),
            ));
        }
        let mut ports = Vec::with_capacity(req.members.len());
        for (i, m) in req.members.iter().enumerate() {
            let port = self.config.port_for(m.ip).ok_or_else(|| {
                bad(
                    format!("members[{i}].ip"),
                    format!(
                        "{}: behind no port of this switch (the service's [[hosts]])",
                        m.ip
                    ),
                )
            })?;
            ports.push(port.to_owned());
        }
        let mut sw = self.open()?;
        let mut book = self.book();
        let now = Instant::now();
        Self::expire_in(&mut book, &mut sw.dp, now);
        let t = &self.config.file.tenants[tenant];
        let (jobs, slots) = Self::usage(&book, tenant);
        if jobs >= t.max_jobs {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                None,
                format!(
                    "tenant {} holds {jobs} jobs, its quota (DELETE one, or let its lease end)",
                    t.name
                ),
            ));
        }
        let [first, last] = self.config.file.job_ids;
        let id = (first..=last)
            .find(|id| sw.dp.job(*id).is_none() && !book.leases.contains_key(id))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    format!("every job id of the service ({first}..={last}) is taken"),
                )
            })?;
        let file = Self::job_file(&sw.dp, id, req, &ports)?;
        let wanted = file.slots();
        if slots.saturating_add(wanted) > t.max_slots {
            return Err(ApiError::field(
                StatusCode::TOO_MANY_REQUESTS,
                request_field(file.slots_field()),
                format!(
                    "{wanted} slots would make tenant {}'s {} more than its quota of {}",
                    t.name, slots, t.max_slots
                ),
            ));
        }
        let spec = control::add_job(&mut sw.dp, &file).map_err(|e| match e {
            JobError::Invalid(e) => bad(request_field(&e.field), e.message),
            JobError::PoolExhausted(e) => ApiError::field(
                StatusCode::SERVICE_UNAVAILABLE,
                request_field(&e.field),
                e.message,
            ),
            JobError::Dataplane(e) => ApiError::switch(&e),
        })?;
        book.leases.insert(
            id,
            Lease {
                tenant,
                slots: spec.slot_count,
                expires: now + self.lease_len(),
            },
        );
        log::info!(
            "job {id} ({}, {} members, {} per packet, {} slots) leased to {}",
            spec.mode.name(),
            spec.members.len(),
            spec.elems_per_packet,
            spec.slot_count,
            t.name
        );
        Ok(Created {
            job: JobView::new(&sw.dp, &spec),
            lease_secs: self.config.file.lease_secs,
            switch_addr: self.config.file.switch_addr,
        })
    }

    /// The job file of request `req` as job `id`, its defaults filled in
    /// from the switch (`ports`: each member's switch port).
    fn job_file(
        dp: &Dataplane,
        id: u32,
        req: &JobRequest,
        ports: &[String],
    ) -> Result<JobFile, ApiError> {
        let group = matches!(req.mode, ModeName::Multicast | ModeName::Anycast);
        let (mut elems, mut slot_count, mut window) = (req.elems_per_packet, req.slots, req.window);
        if group {
            if req.slots.is_some() {
                return Err(ApiError::field(
                    StatusCode::BAD_REQUEST,
                    "slots",
                    "not for groups (a multicast group has window and takes window x members slots)",
                ));
            }
            if req.mode == ModeName::Multicast {
                window = window.or(Some(DEFAULT_WINDOW));
            }
        } else {
            let slots = slot_count.unwrap_or(DEFAULT_SLOTS);
            slot_count = Some(slots);
            if elems.is_none() {
                elems = Some(Self::default_elems(dp, req, ports, slots)?);
            }
        }
        let members = req
            .members
            .iter()
            .zip(ports)
            .enumerate()
            .map(|(rank, (m, port))| JobMember {
                rank: u8::try_from(rank).expect("at most MAX_RANKS members"),
                ip: m.ip,
                port: m.port,
                mac: m.mac.clone(),
                interface: port.clone(),
                sender: m.sender,
                down: None,
            })
            .collect();
        Ok(JobFile {
            id,
            op: req.op,
            dtype: req.dtype,
            mode: req.mode,
            elems_per_packet: elems,
            bytes_per_packet: req.bytes_per_packet,
            window,
            slot_count,
            slot_base: None,
            members,
        })
    }

    /// The most elements per packet that every member's port MTU allows,
    /// within one 1,500-byte frame unless the job is an allreduce, and
    /// within the wide-path memory left.
    fn default_elems(
        dp: &Dataplane,
        req: &JobRequest,
        ports: &[String],
        slots: u32,
    ) -> Result<u16, ApiError> {
        let dtype = DType::from(req.dtype.unwrap_or_default());
        let mut mtu = u32::MAX;
        for (i, port) in ports.iter().enumerate() {
            let m = netdev::mtu(port).map_err(|e| {
                ApiError::field(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("members[{i}].ip"),
                    format!("its switch port {port}: {e}"),
                )
            })?;
            mtu = mtu.min(m);
        }
        let fit = frame::elems_for_mtu(dtype, usize::try_from(mtu).unwrap_or(usize::MAX));
        let narrow = fit.min(dtype.narrow_elems());
        let (_, cpus) = dp.unit_pool();
        let wide_fits = frame::wide_units(fit, slots, cpus) <= dp.largest_free_units();
        let elems = if req.mode == ModeName::Allreduce && wide_fits {
            fit
        } else {
            narrow
        };
        u16::try_from(elems).ok().filter(|e| *e > 0).ok_or_else(|| {
            ApiError::field(
                StatusCode::BAD_REQUEST,
                "elems_per_packet",
                format!("the members' ports' MTU ({mtu}) leaves no room for an element"),
            )
        })
    }

    /// `GET /v1/jobs`.
    ///
    /// # Errors
    /// 503 when the switch is down.
    pub fn list(&self, tenant: usize) -> Result<Leases, ApiError> {
        let sw = self.open()?;
        let book = self.book();
        let now = Instant::now();
        let jobs = book
            .leases
            .iter()
            .filter(|(_, l)| l.tenant == tenant)
            .filter_map(|(id, l)| Self::leased(&sw.dp, *id, l, now))
            .collect();
        Ok(Leases { jobs })
    }

    fn leased(dp: &Dataplane, id: u32, lease: &Lease, now: Instant) -> Option<Leased> {
        let spec = dp.job(id)?;
        Some(Leased {
            job: JobView::new(dp, spec),
            expires_in_ms: u64::try_from(lease.expires.saturating_duration_since(now).as_millis())
                .unwrap_or(u64::MAX),
        })
    }

    /// `GET /v1/jobs/{id}`.
    ///
    /// # Errors
    /// 404 when `tenant` leases no job `id`; 503 when the switch is down.
    pub fn show(&self, tenant: usize, id: u32) -> Result<Leased, ApiError> {
        let sw = self.open()?;
        let book = self.book();
        book.leases
            .get(&id)
            .filter(|l| l.tenant == tenant)
            .and_then(|l| Self::leased(&sw.dp, id, l, Instant::now()))
            .ok_or_else(|| ApiError::not_found(id))
    }

    /// `POST /v1/jobs/{id}/renew`.
    ///
    /// # Errors
    /// 404 when `tenant` leases no job `id` (also when its lease ended).
    pub fn renew(&self, tenant: usize, id: u32) -> Result<Renewed, ApiError> {
        let mut book = self.book();
        let now = Instant::now();
        let lease = book
            .leases
            .get_mut(&id)
            .filter(|l| l.tenant == tenant && l.expires > now)
            .ok_or_else(|| ApiError::not_found(id))?;
        lease.expires = now + self.lease_len();
        Ok(Renewed {
            id,
            lease_secs: self.config.file.lease_secs,
        })
    }

    /// `DELETE /v1/jobs/{id}`.
    ///
    /// # Errors
    /// 404 when `tenant` leases no job `id`; 503 when the switch is down.
    pub fn release(&self, tenant: usize, id: u32) -> Result<(), ApiError> {
        let mut sw = self.open()?;
        let mut book = self.book();
        if book.leases.get(&id).is_none_or(|l| l.tenant != tenant) {
            return Err(ApiError::not_found(id));
        }
        book.leases.remove(&id);
        if sw.dp.job(id).is_some() {
            sw.dp.remove_job(id).map_err(|e| ApiError::switch(&e))?;
        }
        log::info!(
            "job {id} released by {}",
            self.config.file.tenants[tenant].name
        );
        Ok(())
    }

    /// Removes the jobs whose leases ended by `now`; their ids.
    ///
    /// # Errors
    /// The switch cannot be opened (the leases stay until it can).
    pub fn expire(&self, now: Instant) -> Result<Vec<u32>, dataplane::Error> {
        if !self.book().leases.values().any(|l| l.expires <= now) {
            return Ok(Vec::new());
        }
        let mut sw = control::open(&self.dir)?;
        let mut book = self.book();
        Ok(Self::expire_in(&mut book, &mut sw.dp, now))
    }

    fn expire_in(book: &mut Book, dp: &mut Dataplane, now: Instant) -> Vec<u32> {
        let ended: Vec<u32> = book
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for &id in &ended {
            book.leases.remove(&id);
            book.expired += 1;
            if dp.job(id).is_some()
                && let Err(e) = dp.remove_job(id)
            {
                log::error!("job {id}: its lease ended, but removing it failed: {e}");
                continue;
            }
            log::info!("job {id}: lease ended, removed");
        }
        ended
    }

    /// Removes every leased job (a clean stop); their ids.
    ///
    /// # Errors
    /// The switch cannot be opened.
    pub fn release_all(&self) -> Result<Vec<u32>, dataplane::Error> {
        let mut sw = control::open(&self.dir)?;
        let mut book = self.book();
        let ids: Vec<u32> = book.leases.keys().copied().collect();
        for &id in &ids {
            if sw.dp.job(id).is_some() {
                sw.dp.remove_job(id)?;
            }
            book.leases.remove(&id);
        }
        Ok(ids)
    }

    /// `GET /metrics`: the switch's families and the service's.
    ///
    /// # Errors
    /// 503 when the switch is down or its counters cannot be read.
    pub fn metrics(&self) -> Result<String, ApiError> {
        let sw = self.open()?;
        let stats = control::stats(&sw.dp).map_err(|e| ApiError::switch(&e))?;
        let mut registry = Registry::default();
        metrics::register(
            &mut registry,
            self.dir.name(),
            &stats,
            metrics::Table::of(&sw.dp),
            false,
        );
        drop(sw);
        let book = self.book();
        let tenants = &self.config.file.tenants;
        let gauge = |v: usize| {
            let g = Gauge::<i64>::default();
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
            g
        };
        registry.register(
            "xina_service_tenants",
            "Tenants the job service knows",
            gauge(tenants.len()),
        );
        registry.register(
            "xina_service_leases",
            "Jobs and groups the job service has leased",
            gauge(book.leases.len()),
        );
        let jobs = Family::<TenantLabel, Gauge>::default();
        let slots = Family::<TenantLabel, Gauge>::default();
        for (i, t) in tenants.iter().enumerate() {
            let (j, s) = Self::usage(&book, i);
            let label = TenantLabel {
                tenant: t.name.clone(),
            };
            jobs.get_or_create(&label).set(i64::from(j));
            slots.get_or_create(&label).set(i64::from(s));
        }
        registry.register(
            "xina_service_tenant_jobs",
            "Jobs and groups a tenant holds",
            jobs,
        );
        registry.register(
            "xina_service_tenant_slots",
            "Aggregator slots a tenant's jobs and groups hold",
            slots,
        );
        let expired = Total::<u64>::default();
        expired.inc_by(book.expired);
        registry.register(
            "xina_service_leases_expired",
            "Leases that ended without renewal, their jobs removed",
            expired,
        );
        let refused = Family::<StatusLabel, Total>::default();
        for (code, n) in &book.refused {
            refused
                .get_or_create(&StatusLabel {
                    status: code.to_string(),
                })
                .inc_by(*n);
        }
        registry.register(
            "xina_service_requests_refused",
            "Requests the job service refused, by HTTP status",
            refused,
        );
        Ok(metrics::encode_text(&registry))
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

/// A job file's field as the request names it.
fn request_field(field: &str) -> String {
    if field == "slot_count" {
        "slots".to_owned()
    } else if let Some(member) = field.strip_suffix(".interface") {
        format!("{member}.ip")
    } else {
        field.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_file_fields_map_to_the_request() {
        assert_eq!(request_field("slot_count"), "slots");
        assert_eq!(request_field("members[3].interface"), "members[3].ip");
        assert_eq!(request_field("members[3].mac"), "members[3].mac");
        assert_eq!(request_field("window"), "window");
    }
}

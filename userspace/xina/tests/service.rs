//! The job service (`xina serve`) on a pinned switch, with real traffic
//! (root): tenants create jobs over HTTP from the workers' namespaces, the
//! workers allreduce through them exactly, quotas and the pool refuse with
//! the field named, a lease that is not renewed gives its slots back, a
//! stop removes what the service leased, and a restart removes what a
//! killed service left.
//!
//! ```text
//!   worker 0 ─┐                      switch namespace: XDP on the ports,
//!   worker 1 ─┼─ ports ── bridge ──  `xina serve` on the bridge's
//!   worker 2 ─┘   10.77.0.253        address, port chosen by the kernel
//! ```

mod pinned;

use std::{
    net::SocketAddrV4,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use pinned::{Guard, Serve, Xina, installed};
use serde_json::{Value, json};
use xina_host::{JobParams, Worker};
use xina_testbed::{scenario::worker_data, topology::Star};

const TOKEN_A: &str = "tenant-a-secret-0001";
const TOKEN_B: &str = "tenant-b-secret-0002";
const LEASE_SECS: u64 = 2;

/// A client of the API in worker 0's namespace.
struct Client<'a> {
    star: &'a Star,
    base: String,
}

impl Client<'_> {
    /// `METHOD path` with `token` (and a JSON body): the status and the body
    /// (`null` when empty).
    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let (method, token) = (method.to_owned(), token.map(str::to_owned));
        self.star
            .worker_ns(0)
            .run(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(20)))
                    .build()
                    .into();
                let auth = token.map(|t| format!("Bearer {t}"));
                let mut resp = match (method.as_str(), body) {
                    ("GET", _) => {
                        let mut r = agent.get(&url);
                        if let Some(a) = &auth {
                            r = r.header("Authorization", a);
                        }
                        r.call()
                    }
                    ("DELETE", _) => {
                        let mut r = agent.delete(&url);
                        if let Some(a) = &auth {
                            r = r.header("Authorization", a);
                        }
                        r.call()
                    }
                    (_, body) => {
                        let mut r = agent.post(&url);
                        if let Some(a) = &auth {
                            r = r.header("Authorization", a);
                        }
                        match body {
                            Some(b) => r.send_json(b),
                            None => r.send_empty(),
                        }
                    }
                }
                .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
                let status = resp.status().as_u16();
                let text = resp.body_mut().read_to_string().unwrap();
                let value = if text.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_str(&text).unwrap_or(Value::String(text))
                };
                (status, value)
            })
            .unwrap()
    }

    fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None)
    }

    fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(token), Some(body))
    }

    fn metrics(&self) -> String {
        match self.call("GET", "/metrics", None, None) {
            (200, Value::String(text)) => text,
            other => panic!("/metrics: {other:?}"),
        }
    }
}

/// The request for a job of `ranks` workers of `star`.
fn request(star: &Star, ranks: usize, extra: &Value) -> Value {
    let members: Vec<Value> = (0..ranks)
        .map(|r| {
            let w = star.worker(r);
            json!({"ip": w.ip.to_string(), "port": 5000, "mac": w.mac.to_string()})
        })
        .collect();
    let mut req = json!({ "members": members });
    if let (Some(req), Some(extra)) = (req.as_object_mut(), extra.as_object()) {
        req.extend(extra.clone());
    }
    req
}

fn field(body: &Value) -> &str {
    body["error"]["field"].as_str().unwrap_or("null")
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

/// Every rank of job `job` (as the service returned it) allreduces
/// `elements` int32 through the switch; each must get the exact sums.
fn allreduce_through(star: &Star, job: &Value, switch_addr: &str, ranks: usize) {
    const ELEMENTS: usize = 50_001;
    let switch: SocketAddrV4 = switch_addr.parse().unwrap();
    let params = |rank: usize| JobParams {
        job: u32::try_from(job["id"].as_u64().unwrap()).unwrap(),
        rank: u8::try_from(rank).unwrap(),
        fan_in: u8::try_from(job["fan_in"].as_u64().unwrap()).unwrap(),
        elems_per_packet: u16::try_from(job["elems_per_packet"].as_u64().unwrap()).unwrap(),
        slots: u32::try_from(job["slot_count"].as_u64().unwrap()).unwrap(),
        op: xina_proto::Op::Sum,
        dtype: xina_proto::DType::I32,
        mode: xina_host::Mode::Allreduce,
        switch,
    };
    let sums: Vec<i32> = (0..ELEMENTS)
        .map(|i| (0..ranks).map(|r| worker_data(3, r, ELEMENTS)[i]).sum())
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                let params = params(r);
                s.spawn(move || {
                    star.worker_ns(r)
                        .run(|| {
                            let bind = SocketAddrV4::new(star.worker(r).ip, 5000);
                            let mut w = Worker::new(params, bind, xina_host::Config::default())
                                .map_err(|e| format!("rank {r}: {e}"))?;
                            let mut data = worker_data(3, r, ELEMENTS);
                            w.allreduce_i32(&mut data)
                                .map_err(|e| format!("rank {r}: {e}"))?;
                            Ok::<_, String>(data)
                        })
                        .unwrap()
                })
            })
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            let got = h.join().unwrap().unwrap();
            assert!(got == sums, "rank {r}: wrong sums");
        }
    });
}

#[test]
fn tenants_get_jobs_within_quotas_and_leases_give_slots_back() {
    let star = Star::build(3).unwrap();
    let mut guard = Guard::new("t-svc-");
    let name = guard.pins.name().to_owned();
    let xina = Xina {
        ns: star.switch().name(),
        name: &name,
    };
    let switch_file = guard.switch_file(&star, 64);
    xina.ok(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
    star.refresh_redirect_targets().unwrap();

    let service = xina_testbed::pmpi::service_text(
        &star,
        LEASE_SECS,
        &format!(
            "[[tenants]]\nname = \"a\"\ntoken = \"{TOKEN_A}\"\nmax_jobs = 2\nmax_slots = 48\n\
             [[tenants]]\nname = \"b\"\ntoken = \"{TOKEN_B}\"\n"
        ),
    );
    // A file naming a port the switch lacks is refused whole, naming it.
    let wrong = guard.file(&service.replace(&star.port(1).name, "nosuchport"));
    let out = xina.fails(&["serve", "-c", wrong.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hosts[1].port") && err.contains("nosuchport"),
        "{err}"
    );

    let service_file = guard.file(&service);
    let serve = Serve::start(&xina, &service_file);
    let api = Client {
        star: &star,
        base: format!("http://{}", serve.addr),
    };

    // Who is asking.
    let (status, body) = api.call("GET", "/v1/switch", None, None);
    assert_eq!((status, field(&body)), (401, "authorization"), "{body}");
    let (status, body) = api.get("/v1/switch", "not-a-token-of-anyone");
    assert_eq!(status, 401, "{body}");
    let (status, info) = api.get("/v1/switch", TOKEN_A);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["tenant"]["name"], "a");
    assert_eq!(info["slots_free"], 64);
    let switch_addr = info["switch_addr"].as_str().unwrap().to_owned();

    // Bad requests name their field and install nothing.
    let (status, body) = api.post(
        "/v1/jobs",
        TOKEN_A,
        json!({"members": [{"ip": "10.77.0.1"}]}),
    );
    assert_eq!((status, field(&body)), (400, "members[0].port"), "{body}");
    let mut off_switch = request(&star, 3, &json!({}));
    off_switch["members"][1]["ip"] = json!("192.0.2.7");
    let (status, body) = api.post("/v1/jobs", TOKEN_A, off_switch);
    assert_eq!((status, field(&body)), (400, "members[1].ip"), "{body}");
    let (status, body) = api.post(
        "/v1/jobs",
        TOKEN_A,
        request(&star, 3, &json!({"elems_per_packet": 9000})),
    );
    assert_eq!((status, field(&body)), (400, "elems_per_packet"), "{body}");
    assert!(installed(&xina).is_empty());

    // A job with the defaults, through which the workers allreduce.
    let (status, created) = api.post("/v1/jobs", TOKEN_A, request(&star, 3, &json!({})));
    assert_eq!(status, 201, "{created}");
    let job = &created["job"];
    assert_eq!(job["fan_in"], 3);
    assert_eq!(job["slot_count"], service_default_slots());
    assert_eq!(created["lease_secs"], LEASE_SECS);
    let first = job["id"].as_u64().unwrap();
    assert!((100..=199).contains(&first));
    assert_eq!(installed(&xina), vec![first]);
    // As a launcher would, renew a's leases while the job runs.
    let renewing = Mutex::new(vec![first]);
    let stop = AtomicBool::new(false);
    let second = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                for id in renewing.lock().unwrap().clone() {
                    let (status, body) =
                        api.post(&format!("/v1/jobs/{id}/renew"), TOKEN_A, json!({}));
                    assert_eq!(status, 200, "renew {id}: {body}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let _stop = StopOnDrop(&stop);
        tenant_a_while_renewed(&star, &api, &xina, &created, &switch_addr, &renewing)
    });

    // Releasing gives the slots back.
    let (status, body) = api.call("DELETE", &format!("/v1/jobs/{second}"), Some(TOKEN_A), None);
    assert_eq!(status, 204, "{body}");
    let (_, info) = api.get("/v1/switch", TOKEN_A);
    assert_eq!(info["slots_free"], 32, "{info}");
    assert_eq!(info["tenant"]["jobs"], 1, "{info}");

    // A stop removes what the service leased.
    assert!(serve.stop(), "xina serve failed to stop cleanly");
    assert!(installed(&xina).is_empty());

    // A killed service leaves its jobs; the next run removes them.
    let serve = Serve::start(&xina, &service_file);
    let api = Client {
        star: &star,
        base: format!("http://{}", serve.addr),
    };
    let (status, body) = api.post("/v1/jobs", TOKEN_B, request(&star, 3, &json!({})));
    assert_eq!(status, 201, "{body}");
    drop(serve);
    assert_eq!(installed(&xina).len(), 1);
    let serve = Serve::start(&xina, &service_file);
    assert!(installed(&xina).is_empty());
    assert!(serve.stop());

    xina.ok(&["switch", "down"]);
    star.teardown().unwrap();
}

/// What tenant a does while its jobs are renewed: allreduce through the
/// first, meet its quotas and the pool, see b's lease lapse; the id of
/// its second job.
fn tenant_a_while_renewed(
    star: &Star,
    api: &Client<'_>,
    xina: &Xina<'_>,
    created: &Value,
    switch_addr: &str,
    renewing: &Mutex<Vec<u64>>,
) -> u64 {
    let first = created["job"]["id"].as_u64().unwrap();
    allreduce_through(star, &created["job"], switch_addr, 3);

    // Quotas: tenant a holds 32 of its 48 slots.
    let (status, body) = api.post("/v1/jobs", TOKEN_A, request(star, 2, &json!({"slots": 17})));
    assert_eq!((status, field(&body)), (429, "slots"), "{body}");
    let (status, second) = api.post(
        "/v1/jobs",
        TOKEN_A,
        request(star, 2, &json!({"slots": 16, "op": "max"})),
    );
    assert_eq!(status, 201, "{second}");
    let second = second["job"]["id"].as_u64().unwrap();
    renewing.lock().unwrap().push(second);
    let (status, body) = api.post("/v1/jobs", TOKEN_A, request(star, 2, &json!({"slots": 1})));
    assert_eq!(status, 429, "{body}");
    // The pool: 48 of 64 slots are taken.
    let (status, body) = api.post("/v1/jobs", TOKEN_B, request(star, 2, &json!({"slots": 17})));
    assert_eq!((status, field(&body)), (503, "slots"), "{body}");

    // Tenant b cannot see, renew or remove a's jobs.
    for (method, path) in [
        ("GET", format!("/v1/jobs/{first}")),
        ("POST", format!("/v1/jobs/{first}/renew")),
        ("DELETE", format!("/v1/jobs/{first}")),
    ] {
        let (status, body) = api.call(method, &path, Some(TOKEN_B), None);
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let (_, listed) = api.get("/v1/jobs", TOKEN_B);
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 0, "{listed}");

    // A lease not renewed ends: b's job goes, a's (renewed) stay.
    let (status, body) = api.post("/v1/jobs", TOKEN_B, request(star, 2, &json!({"slots": 8})));
    assert_eq!(status, 201, "{body}");
    let lapsed = body["job"]["id"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(LEASE_SECS * 2));
    let mut now = installed(xina);
    now.sort_unstable();
    assert_eq!(now, vec![first, second], "job {lapsed} should have lapsed");
    let text = api.metrics();
    assert_eq!(metric(&text, "xina_service_leases_expired_total"), 1.0);
    assert_eq!(
        metric(&text, r#"xina_service_tenant_jobs{tenant="a"}"#),
        2.0
    );
    assert_eq!(
        metric(&text, r#"xina_service_tenant_slots{tenant="a"}"#),
        48.0
    );
    assert_eq!(
        metric(&text, r#"xina_service_tenant_jobs{tenant="b"}"#),
        0.0
    );
    assert!(
        metric(
            &text,
            r#"xina_service_requests_refused_total{status="429"}"#
        ) >= 2.0
    );
    assert!(text.contains("# HELP xina_service_leases "), "{text}");
    assert!(text.contains("xina_slots_free"), "{text}");
    second
}

/// Sets the flag when dropped, also while unwinding.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn service_default_slots() -> u32 {
    xina::service::DEFAULT_SLOTS
}

//! A pinned switch's whole life through the `xina` command, with real
//! traffic (root): up → add jobs → allreduce while the control plane is
//! killed and restarted → the results are exact → remove a job (its slots
//! come back, its traffic is dropped and counted) → down (nothing left
//! attached or pinned).
//!
//! ```text
//!   worker 0 ─┐                       switch namespace, driven by
//!   worker 1 ─┼─ port 0..2 ── XDP ──  `xina -n NS -s NAME ...` processes
//!   worker 2 ─┘                       that each exit (or are killed)
//! ```

use std::{
    net::SocketAddrV4,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;
use xina::pin::{self, PinDir};
use xina_host::{JobParams, Worker};
use xina_proto::XINA_UDP_PORT;
use xina_testbed::{netns::unique_token, scenario::worker_data, topology::Star};

const XINA: &str = env!("CARGO_BIN_EXE_xina");

/// The switch's pins and the test's files, removed on drop (the pins with
/// whatever they hold, detaching the ports), also when the test fails.
struct Guard {
    pins: PinDir,
    files: Vec<PathBuf>,
}

impl Guard {
    fn file(&mut self, text: &str) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "xina-lifecycle-{}-{}.toml",
            self.pins.name(),
            self.files.len()
        ));
        std::fs::write(&path, text).unwrap();
        self.files.push(path.clone());
        path
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.pins.exists() {
            let _ = pin::remove(&self.pins);
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

struct Xina<'a> {
    ns: &'a str,
    name: &'a str,
}

impl Xina<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(XINA);
        c.args(["-n", self.ns, "-s", self.name]).args(args);
        c
    }

    /// Runs `xina ARGS`, which must succeed; its standard output.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().unwrap();
        assert!(
            out.status.success(),
            "xina {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> Output {
        let out = self.command(args).output().unwrap();
        assert!(!out.status.success(), "xina {args:?} succeeded");
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// A long-running `xina` process (a control plane to kill).
    fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

fn counter(stats: &Value, scope: &str, name: &str, counter: &str) -> u64 {
    let block = match scope {
        "switch" => &stats["switch"],
        _ => stats[scope]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .map(|b| &b["counters"])
            .unwrap_or_else(|| panic!("no {scope} {name} in {stats}")),
    };
    block[counter].as_u64().unwrap()
}

fn job_file(star: &Star, id: u32, ranks: usize, slots: u32, omit_mac: Option<usize>) -> String {
    let mut t = format!("id = {id}\nelems_per_packet = 256\nslot_count = {slots}\n");
    for r in 0..ranks {
        let w = star.worker(r);
        t.push_str(&format!(
            "\n[[members]]\nrank = {r}\nip = \"{}\"\nport = 5000\ninterface = \"{}\"\n",
            w.ip,
            star.port(r).name
        ));
        if omit_mac != Some(r) {
            t.push_str(&format!("mac = \"{}\"\n", w.mac));
        }
    }
    t
}

#[test]
fn a_pinned_switch_outlives_its_control_plane() {
    const ELEMENTS: usize = 6_000_000;
    const SLOTS: u32 = 32;
    let star = Star::build(3).unwrap();
    let name = format!("t-life-{}", unique_token());
    let mut guard = Guard {
        pins: PinDir::new(pin::DEFAULT_ROOT, &name).unwrap(),
        files: Vec::new(),
    };
    let xina = Xina {
        ns: star.switch().name(),
        name: &name,
    };
    let ports: Vec<String> = star
        .ports()
        .iter()
        .map(|p| format!("{:?}", p.name))
        .collect();
    let switch_file = guard.file(&format!(
        "[switch]\nports = [{}]\nslot_pool = 64\n",
        ports.join(", ")
    ));
    // Up: the command attaches, pins and exits.
    let up = xina.ok(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
    assert!(up.contains(&format!("switch {name} is up")), "{up}");
    star.refresh_redirect_targets().unwrap();
    let out = xina.fails(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a switch is already up"),
        "{out:?}"
    );
    // Rank 2's MAC comes from the switch's neighbour table.
    let w2 = star.worker(2);
    star.switch()
        .ip(&[
            "neigh",
            "replace",
            &w2.ip.to_string(),
            "lladdr",
            &w2.mac.to_string(),
            "dev",
            &star.port(2).name,
            "nud",
            "permanent",
        ])
        .unwrap();
    let job1 = guard.file(&job_file(&star, 1, 3, SLOTS, Some(2)));
    let job2 = guard.file(&job_file(&star, 2, 2, 16, None));
    let j1 = xina.json(&["job", "add", job1.to_str().unwrap(), "--json"]);
    assert_eq!(
        (j1["slot_base"].as_u64(), j1["slot_count"].as_u64()),
        (Some(0), Some(32))
    );
    assert_eq!(j1["members"][2]["mac"], w2.mac.to_string());
    let j2 = xina.json(&["job", "add", job2.to_str().unwrap(), "--json"]);
    assert_eq!(j2["slot_base"].as_u64(), Some(32), "no overlap with job 1");

    // A long-running control plane, killed below while traffic flows.
    let mut watcher = xina.spawn(&["stats", "--watch", "0.2"]);
    let data: Vec<Vec<i32>> = (0..3).map(|r| worker_data(7, r, ELEMENTS)).collect();
    let expected: Vec<i32> = (0..ELEMENTS)
        .map(|i| data.iter().map(|d| d[i]).sum())
        .collect();
    // Workers whose allreduce has returned.
    let finished = AtomicUsize::new(0);
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let (results, mid) = std::thread::scope(|s| {
        let handles: Vec<_> = data
            .into_iter()
            .enumerate()
            .map(|(rank, mut buf)| {
                let worker = star.worker(rank);
                let finished = &finished;
                s.spawn(move || {
                    worker
                        .ns()
                        .run(move || {
                            let params = JobParams {
                                job: 1,
                                rank: u8::try_from(rank).unwrap(),
                                fan_in: 3,
                                elems_per_packet: 256,
                                slots: SLOTS,
                                switch,
                            };
                            let bind = SocketAddrV4::new(worker.ip, 5000);
                            let mut w = Worker::new(params, bind, xina_host::Config::default())?;
                            let r = w.allreduce_i32(&mut buf).map(|_| buf);
                            finished.fetch_add(1, Ordering::SeqCst);
                            r
                        })
                        .unwrap()
                })
            })
            .collect();
        // Mid-traffic: once chunks complete, kill the control plane, run
        // new commands (each a fresh process reading the pins) and start
        // another long-running one.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mid = loop {
            let stats = xina.json(&["stats", "--json"]);
            let completed = counter(&stats, "jobs", "1", "completed");
            if completed > 0 || Instant::now() > deadline {
                break completed;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        watcher.kill().unwrap();
        watcher.wait().unwrap();
        let ls = xina.json(&["job", "ls", "--json"]);
        let ids: Vec<u64> = ls
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [1, 2]);
        let status = xina.json(&["switch", "status", "--json"]);
        assert_eq!(status["ports"].as_array().unwrap().len(), 3);
        assert!(status["ports"][0]["prog_id"].as_u64().unwrap() > 0);
        let mut watcher = xina.spawn(&["stats", "--watch", "0.2"]);
        let after = counter(&xina.json(&["stats", "--json"]), "jobs", "1", "completed");
        let finished_early = finished.load(Ordering::SeqCst) > 0;
        watcher.kill().unwrap();
        watcher.wait().unwrap();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (results, (mid, after, finished_early))
    });
    let chunks = u64::try_from(ELEMENTS.div_ceil(256)).unwrap();
    let (mid, after, finished_early) = mid;
    assert!(
        mid > 0 && after < chunks && !finished_early,
        "the control plane restarted mid-traffic: {mid} then {after} of {chunks} chunks done"
    );
    for (rank, r) in results.into_iter().enumerate() {
        let buf = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert!(buf == expected, "rank {rank}: wrong sum");
    }
    let stats = xina.json(&["stats", "--json"]);
    assert_eq!(counter(&stats, "jobs", "1", "completed"), chunks);

    // Remove job 1: its slots come back and its traffic is dropped, counted.
    let rm = xina.ok(&["job", "rm", "1"]);
    assert!(rm.contains("job 1 removed: slots 0..32 are free"), "{rm}");
    let unknown_before = counter(&stats, "switch", "", "drop_unknown_job");
    let late = star
        .worker(0)
        .ns()
        .run(|| {
            let params = JobParams {
                job: 1,
                rank: 0,
                fan_in: 3,
                elems_per_packet: 256,
                slots: SLOTS,
                switch,
            };
            let config = xina_host::Config {
                give_up: Duration::from_millis(300),
                ..Default::default()
            };
            let mut w = Worker::new(params, SocketAddrV4::new(star.worker(0).ip, 5000), config)?;
            w.allreduce_i32(&mut [1, 2, 3])
        })
        .unwrap();
    assert!(late.is_err(), "a removed job's allreduce cannot complete");
    let stats = xina.json(&["stats", "--json"]);
    assert!(counter(&stats, "switch", "", "drop_unknown_job") > unknown_before);
    let status = xina.json(&["switch", "status", "--json"]);
    assert_eq!(status["slots_used"].as_u64(), Some(16));
    let job3 = guard.file(&job_file(&star, 3, 3, SLOTS, None));
    let j3 = xina.json(&["job", "add", job3.to_str().unwrap(), "--json"]);
    assert_eq!(
        j3["slot_base"].as_u64(),
        Some(0),
        "job 1's slots were reused"
    );
    let out = xina.fails(&["job", "show", "1"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "xina: job 1 is not installed"
    );

    // Down: nothing attached, nothing pinned.
    let down = xina.ok(&["switch", "down"]);
    assert!(down.contains("is down: detached from"), "{down}");
    assert_eq!(star.ports_with_xdp().unwrap(), Vec::<String>::new());
    assert!(!guard.pins.exists());
    let out = xina.fails(&["job", "ls"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no switch is up"));
    drop(guard);
    star.teardown().unwrap();
}

//! A pinned switch's whole life through the `xina` command, with real
//! traffic (root): up → add jobs → allreduce while the control plane is
//! killed and restarted and the programs upgraded → the results are exact → remove a job (its slots
//! come back, its traffic is dropped and counted) → down (nothing left
//! attached or pinned).
//!
//! ```text
//!   worker 0 ─┐                       switch namespace, driven by
//!   worker 1 ─┼─ port 0..2 ── XDP ──  `xina -n NS -s NAME ...` processes
//!   worker 2 ─┘                       that each exit (or are killed)
//! ```

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddrV4, TcpStream},
    process::Stdio,
    sync::{
        Barrier,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::Value;
use xina_host::{JobParams, Worker};
use xina_proto::XINA_UDP_PORT;
use xina_testbed::{scenario::worker_data, topology::Star};

mod pinned;

use pinned::{Guard, Xina};

/// Starts `xina exporter` on a free port of the switch namespace's
/// loopback, fetches `/metrics` once, and stops it.
fn scrape(star: &Star, xina: &Xina<'_>) -> String {
    let mut exporter = xina
        .command(&["exporter", "--listen", "127.0.0.1:0", "--per-job"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(exporter.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let body = star
        .switch()
        .run(move || {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        })
        .unwrap();
    exporter.kill().unwrap();
    exporter.wait().unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    body
}

/// Rounds of allreduce that the workers agree to go on with or stop.
struct Rounds {
    barrier: Barrier,
    /// Set by the test: finish after the current round.
    stop: AtomicBool,
    /// Set by a worker whose round failed: everyone stops.
    failed: AtomicBool,
    /// The leader's decision after each round.
    go_on: AtomicBool,
    /// Rounds every worker has finished.
    done: AtomicUsize,
}

impl Rounds {
    /// One worker's rounds, each checked against `expected`; how many.
    fn run(
        &self,
        worker: Result<Worker, String>,
        data: &[i32],
        expected: &[i32],
    ) -> Result<usize, String> {
        let mut worker = worker;
        let mut n = 0;
        loop {
            let round = worker.as_mut().map_err(|e| e.clone()).and_then(|w| {
                let mut buf = data.to_vec();
                w.allreduce_i32(&mut buf).map_err(|e| e.to_string())?;
                if buf == expected {
                    Ok(())
                } else {
                    Err(format!("round {n}: wrong sum"))
                }
            });
            if round.is_err() {
                self.failed.store(true, Ordering::SeqCst);
            }
            if self.barrier.wait().is_leader() {
                let go_on =
                    !self.stop.load(Ordering::SeqCst) && !self.failed.load(Ordering::SeqCst);
                self.go_on.store(go_on, Ordering::SeqCst);
                self.done.fetch_add(1, Ordering::SeqCst);
            }
            self.barrier.wait();
            round?;
            n += 1;
            if !self.go_on.load(Ordering::SeqCst) {
                return Ok(n);
            }
        }
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
    const ELEMENTS: usize = 1_000_000;
    const SLOTS: u32 = 32;
    let star = Star::build(3).unwrap();
    let mut guard = Guard::new("t-life-");
    let name = guard.pins.name().to_owned();
    let xina = Xina {
        ns: star.switch().name(),
        name: &name,
    };
    let switch_file = guard.switch_file(&star, 64);
    // Up: the command attaches, pins and exits.
    let up = xina.ok(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
    assert!(up.contains(&format!("switch {name} is up")), "{up}");
    star.refresh_redirect_targets().unwrap();
    let listed = xina.json(&["switch", "ls", "--json"]);
    let me = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not in {listed}"));
    assert_eq!(me["ports"].as_array().unwrap().len(), 3);
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
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    // The workers allreduce round after round, each round checked, until
    // the control-plane work below is done; between rounds they agree
    // (through a barrier) on whether to go on.
    let rounds = Rounds {
        barrier: Barrier::new(3),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        go_on: AtomicBool::new(true),
        done: AtomicUsize::new(0),
    };
    let (results, upgraded_at) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let worker = star.worker(rank);
                let (rounds, data, expected) = (&rounds, &data[rank], &expected);
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
                                op: xina_proto::Op::Sum,
                                dtype: xina_proto::DType::I32,
                                mode: xina_host::Mode::Allreduce,
                                switch,
                            };
                            let bind = SocketAddrV4::new(worker.ip, 5000);
                            let w = Worker::new(params, bind, xina_host::Config::default());
                            rounds.run(w.map_err(|e| e.to_string()), data, expected)
                        })
                        .unwrap()
                })
            })
            .collect();
        let wait_rounds = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(120);
            while rounds.done.load(Ordering::SeqCst) < n
                && !rounds.failed.load(Ordering::SeqCst)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        wait_rounds(1);
        // Mid-traffic: kill the control plane, run new commands (each a
        // fresh process reading the pins), upgrade the programs, start
        // another long-running one.
        watcher.kill().unwrap();
        watcher.wait().unwrap();
        let stats = xina.json(&["stats", "--json"]);
        assert!(counter(&stats, "jobs", "1", "completed") > 0);
        // Prometheus scrapes the same counters.
        let metrics = scrape(&star, &xina);
        let line = format!("xina_job_chunks_completed_total{{switch=\"{name}\",job=\"1\"}} ");
        let value: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in {metrics}"))
            .parse()
            .unwrap();
        assert!(value > 0, "{metrics}");
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
        let old_prog = status["ports"][0]["prog_id"].as_u64().unwrap();
        assert!(old_prog > 0);
        // Upgrade the programs under the running allreduce.
        let up = xina.ok(&["switch", "upgrade"]);
        assert!(up.contains("upgraded"), "{up}");
        let upgraded_at = rounds.done.load(Ordering::SeqCst);
        let status = xina.json(&["switch", "status", "--json"]);
        for p in status["ports"].as_array().unwrap() {
            let prog = p["prog_id"].as_u64().unwrap();
            assert!(
                prog != old_prog && prog > 0,
                "{p} still runs program {old_prog}"
            );
        }
        assert_eq!(
            status["programs"]["xina_switch"].as_u64(),
            status["ports"][0]["prog_id"].as_u64()
        );
        let mut watcher = xina.spawn(&["stats", "--watch", "0.2"]);
        // At least one whole round on the new programs alone.
        wait_rounds(upgraded_at + 2);
        watcher.kill().unwrap();
        watcher.wait().unwrap();
        rounds.stop.store(true, Ordering::SeqCst);
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (results, upgraded_at)
    });
    let mut done = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        done.push(r.unwrap_or_else(|e| panic!("rank {rank}: {e}")));
    }
    assert!(
        done.iter().all(|d| *d == done[0]),
        "rounds per rank: {done:?}"
    );
    assert!(
        done[0] >= upgraded_at + 2,
        "{} rounds, upgraded after {upgraded_at}",
        done[0]
    );
    // Each round: the call check's chunk and the data's.
    let chunks = u64::try_from((1 + ELEMENTS.div_ceil(256)) * done[0]).unwrap();
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
                op: xina_proto::Op::Sum,
                dtype: xina_proto::DType::I32,
                mode: xina_host::Mode::Allreduce,
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
    // A bad job file: one line naming the file, the field and the value.
    let bad = guard.file(&job_file(&star, 4, 3, 8, None).replacen("rank = 1", "rank = 0", 1));
    let out = xina.fails(&["job", "add", bad.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "xina: {}: members[1].rank: duplicate rank 0\n",
            bad.display()
        )
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

/// With `debug = true`, the dataplane's log records reach `xina daemon`'s
/// log (at debug level), also when the daemon starts after `switch up`
/// has exited.
#[test]
fn the_daemon_forwards_dataplane_logs() {
    let star = Star::build(1).unwrap();
    let mut guard = Guard::new("t-log-");
    let name = guard.pins.name().to_owned();
    let xina = Xina {
        ns: star.switch().name(),
        name: &name,
    };
    let switch_file = guard.file(&format!(
        "[switch]\nports = [{:?}]\nslot_pool = 16\ndebug = true\n",
        star.port(0).name
    ));
    xina.ok(&["switch", "up", "-c", switch_file.to_str().unwrap()]);
    star.refresh_redirect_targets().unwrap();
    let job = guard.file(&job_file(&star, 9, 1, 4, None));
    xina.ok(&["job", "add", job.to_str().unwrap()]);
    let mut daemon = xina
        .command(&["daemon"])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = daemon.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The daemon is reading once it says it runs.
    let running = rx.recv_timeout(Duration::from_secs(20));
    let switch = SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT);
    let w = star.worker(0);
    let mut data = vec![5i32; 600];
    let sum = w
        .ns()
        .run(|| {
            let params = JobParams {
                job: 9,
                rank: 0,
                fan_in: 1,
                elems_per_packet: 256,
                slots: 4,
                op: xina_proto::Op::Sum,
                dtype: xina_proto::DType::I32,
                mode: xina_host::Mode::Allreduce,
                switch,
            };
            let mut worker = Worker::new(
                params,
                SocketAddrV4::new(w.ip, 5000),
                xina_host::Config::default(),
            )?;
            worker.allreduce_i32(&mut data)
        })
        .unwrap();
    let mut lines = vec![format!("{running:?}")];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !lines.iter().any(|l| l.contains("job 9 seq 2 complete")) {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            lines.push(l);
        }
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    sum.unwrap();
    assert!(data.iter().all(|v| *v == 5));
    for seq in 0..3 {
        let want = format!("job 9 seq {seq} complete");
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&want) && l.contains("DEBUG")),
            "{want:?} not in the daemon's log: {lines:#?}"
        );
    }
    xina.ok(&["switch", "down"]);
    drop(guard);
    star.teardown().unwrap();
}

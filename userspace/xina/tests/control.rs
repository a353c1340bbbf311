//! The control plane's API against a pinned switch in a namespace (root):
//! bad job and switch files are rejected with their specific message and
//! leave the dataplane exactly as it was; removed jobs give their slots back.
//!
//! ```text
//!   worker 0 ── port 0 ┐
//!   worker 1 ── port 1 ├─ switch namespace: switch A on ports 0-2
//!   worker 2 ── port 2 ┘                    (port 3 free, for switch files)
//!   worker 3 ── port 3
//! ```

use std::fmt::Write as _;

use xina::{
    Dataplane,
    config::{Config, JobFile},
    control,
    pin::{self, PinDir},
};
use xina_testbed::{netns::unique_token, topology::Star};

/// A pin directory with a unique switch name, removed (with whatever is
/// pinned in it, detaching its ports) on drop, also when a test fails.
struct Pins(PinDir);

impl Pins {
    fn new() -> Self {
        Self(PinDir::new(pin::DEFAULT_ROOT, &format!("t-ctl-{}", unique_token())).unwrap())
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = pin::remove(&self.0);
        }
    }
}

fn switch_file(star: &Star, ports: &[usize]) -> String {
    let names: Vec<String> = ports
        .iter()
        .map(|&i| format!("{:?}", star.port(i).name))
        .collect();
    format!("[switch]\nports = [{}]\nslot_pool = 64\n", names.join(", "))
}

/// A valid job file over workers 0..3, the job id and slots given.
fn job_file(star: &Star, id: u32, slot_count: u32) -> String {
    let mut t = format!("id = {id}\nelems_per_packet = 64\nslot_count = {slot_count}\n");
    for r in 0..3 {
        let w = star.worker(r);
        let _ = write!(
            t,
            "\n[[members]]\nrank = {r}\nip = \"{}\"\nport = 5000\nmac = \"{}\"\ninterface = \"{}\"\n",
            w.ip,
            w.mac,
            star.port(r).name
        );
    }
    t
}

fn add(star: &Star, dp: &mut Dataplane, text: &str) -> Result<xina::JobSpec, String> {
    let file = JobFile::parse(text).map_err(|e| e.to_string())?;
    star.switch()
        .run(|| control::add_job(dp, &file).map_err(|e| e.to_string()))
        .unwrap()
}

#[test]
fn bad_job_files_are_rejected_and_change_nothing() {
    let star = Star::build(4).unwrap();
    let pins = Pins::new();
    let config = Config::parse(&switch_file(&star, &[0, 1, 2])).unwrap();
    let mut dp = star
        .switch()
        .run(|| control::up(&config, &pins.0, None))
        .unwrap()
        .unwrap();
    let good = job_file(&star, 2, 16);
    let first = add(&star, &mut dp, &job_file(&star, 1, 16)).unwrap();
    assert_eq!((first.slot_base, first.slot_count), (0, 16));
    // Port 2 gets a small MTU, for the MTU case.
    let p2 = &star.port(2).name;
    star.switch()
        .ip(&["link", "set", p2, "mtu", "1000"])
        .unwrap();

    let w1 = star.worker(1);
    let mac1 = format!("mac = \"{}\"\n", w1.mac);
    let ip1 = format!("ip = \"{}\"", w1.ip);
    let sixty_five: String = {
        let mut t = "id = 2\nelems_per_packet = 64\nslot_count = 4\n".to_owned();
        for r in 0..65 {
            let _ = write!(
                t,
                "[[members]]\nrank = {r}\nip = \"10.1.{}.{}\"\nport = 5000\nmac = \"02:00:00:00:00:01\"\ninterface = \"{}\"\n",
                r / 200,
                r % 200 + 1,
                star.port(r % 3).name
            );
        }
        t
    };
    let p0 = format!("interface = \"{}\"", star.port(0).name);
    let p1 = format!("interface = \"{}\"", star.port(1).name);
    let cases: Vec<(String, &str)> = vec![
        (
            good.replacen("rank = 1", "rank = 0", 1),
            "members[1].rank: duplicate rank 0",
        ),
        (
            good.replacen("rank = 2", "rank = 3", 1),
            "members[2].rank: rank 3 outside 0..3",
        ),
        (
            good.replacen(&p1, "interface = \"nope0\"", 1),
            "members[1].interface: nope0 is not a port of this switch",
        ),
        (
            sixty_five,
            "members: 65 members (must be 1..=64: the rank bitmap has 64 bits)",
        ),
        (
            good.replacen("elems_per_packet = 64", "elems_per_packet = 361", 1),
            "elems_per_packet: 361 (must be 1..=360 for I32",
        ),
        (
            good.replacen("elems_per_packet = 64", "elems_per_packet = 0", 1),
            "elems_per_packet: 0 (must be 1..=360",
        ),
        (
            good.replacen("elems_per_packet = 64", "elems_per_packet = 300", 1),
            "elems_per_packet: 300 elements make 1260-byte IP packets, more than the 1000-byte MTU of",
        ),
        (
            good.replacen(
                "elems_per_packet = 64",
                "elems_per_packet = 200\ndtype = \"i64\"",
                1,
            ),
            "elems_per_packet: 200 (must be 1..=180 for I64",
        ),
        (
            good.replacen("slot_count = 16", "slot_count = 60", 1),
            "slot_count: 60 slots wanted, but the pool is exhausted: its largest free range is 48 of 64 slots",
        ),
        (
            good.replacen("slot_count = 16", "slot_count = 0", 1),
            "slot_count: 0 (a job needs at least one slot)",
        ),
        (
            good.replacen("slot_count = 16", "slot_count = 16\nslot_base = 8", 1),
            "slot_base: slots 8..24 overlap job 1's slots 0..16",
        ),
        (
            good.replacen("slot_count = 16", "slot_count = 16\nslot_base = 60", 1),
            "slot_count: slots 60..76 do not fit the pool of 64 slots",
        ),
        (
            good.replacen("id = 2", "id = 1", 1),
            "id: job 1 is already installed",
        ),
        (
            good.replacen("id = 2", "id = 0", 1),
            "id: 0 (job ids start at 1)",
        ),
        (
            good.replacen(&mac1, "mac = \"02:00:00:00:01\"\n", 1),
            "members[1].mac: \"02:00:00:00:01\" is not a MAC address",
        ),
        (
            good.replacen(&mac1, "", 1),
            "members[1].mac: omitted, and 10.77.0.2 has no entry in the neighbour table of",
        ),
        (
            good.replacen(&ip1, "ip = \"255.255.255.255\"", 1),
            "members[1].ip: 255.255.255.255 is not a unicast address",
        ),
        (
            good.replacen("port = 5000", "port = 0", 1),
            "members[0].port: 0 is not a UDP port a worker can use",
        ),
        (
            good.replacen(&ip1, &format!("ip = \"{}\"", star.worker(0).ip), 1),
            "members[1].port: 10.77.0.1:5000 is used by another member",
        ),
        (
            good.replacen(&p1, &p0, 1),
            "already has a member of this job (one member per port and job)",
        ),
        (
            good.replacen("id = 2", "id = 2\nop = \"avg\"", 1),
            "line 2 (op): unknown variant `avg`, expected one of `sum`, `max`, `min`",
        ),
        (
            good.replacen("id = 2", "id = 2\nmode = \"gather\"", 1),
            "(mode): unknown variant `gather`",
        ),
        (
            good.replacen("id = 2", "id = 2\ncolour = 3", 1),
            "unknown field `colour`",
        ),
        (
            good.replacen("elems_per_packet = 64\n", "", 1),
            "elems_per_packet: missing (a job needs elements per packet)",
        ),
        (
            good.replacen(&ip1, "ip = \"10.77.0\"", 1),
            "(ip): invalid IPv4 address",
        ),
        (
            "id = 2\nelems_per_packet = 64\nslot_count = 4\nmembers = []\n".to_owned(),
            "members: 0 members (must be 1..=64",
        ),
    ];
    assert!(cases.len() >= 20);
    for (text, want) in &cases {
        assert_ne!(text, &good, "case {want:?} does not apply");
        let before = dp.dump().unwrap();
        let e = add(&star, &mut dp, text).expect_err(want);
        assert!(e.contains(want), "got {e:?}, want {want:?}");
        assert_eq!(dp.dump().unwrap(), before, "{want}: the dataplane changed");
        assert_eq!(dp.jobs().map(|j| j.id).collect::<Vec<_>>(), [1]);
    }
    // The same job, valid, goes in after all that, in the next free range.
    let second = add(&star, &mut dp, &good).unwrap();
    assert_eq!((second.slot_base, second.slot_count), (16, 16));
    // A second process sees both jobs, with their counter blocks.
    let reopened = control::open(&pins.0).unwrap();
    let ids: Vec<u32> = reopened.dp.jobs().map(|j| j.id).collect();
    assert_eq!(ids, [1, 2]);
    assert_eq!(reopened.dp.job(2), dp.job(2));
    // Opened from this (root) namespace, the ports still carry their names.
    let names: Vec<&str> = reopened
        .dp
        .ports()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let want: Vec<&str> = (0..3).map(|i| star.port(i).name.as_str()).collect();
    assert_eq!(names, want);
    assert_eq!(
        reopened.dp.job_counter_index(2),
        dp.job_counter_index(2),
        "counter blocks are found again"
    );
    drop(reopened);
    // Removing job 1 gives its slots back: a job as large as the free
    // space below job 2 fits there.
    dp.remove_job(1).unwrap();
    let dump = dp.dump().unwrap();
    assert!(dump.jobs.iter().all(|(id, _)| *id != 1));
    assert!(dump.members.iter().all(|((job, _), _)| *job != 1));
    assert!(dump.port_members.iter().all(|((job, _), _)| *job != 1));
    let third = add(&star, &mut dp, &job_file(&star, 3, 16)).unwrap();
    assert_eq!(third.slot_base, 0, "job 1's slots were returned");
    let fourth = add(&star, &mut dp, &job_file(&star, 4, 32)).unwrap();
    assert_eq!(fourth.slot_base, 32);
    let e = add(&star, &mut dp, &job_file(&star, 5, 1)).unwrap_err();
    assert!(e.contains("largest free range is 0 of 64"), "{e}");
    drop(dp);
    control::down(&pins.0).unwrap();
    star.teardown().unwrap();
}

#[test]
fn bad_switch_files_are_rejected_and_change_nothing() {
    let star = Star::build(4).unwrap();
    let pins = Pins::new();
    let running = Config::parse(&switch_file(&star, &[0, 1, 2])).unwrap();
    let dp = star
        .switch()
        .run(|| control::up(&running, &pins.0, None))
        .unwrap()
        .unwrap();
    let attached = star.ports_with_xdp().unwrap();
    assert_eq!(attached.len(), 3);
    let free = star.port(3).name.clone();
    let busy = star.port(0).name.clone();
    let good = switch_file(&star, &[3]);
    let ports_line = format!("ports = [{free:?}]");
    let job = format!(
        "\n[[jobs]]\nid = 1\nelems_per_packet = 64\nslot_base = 0\nslot_count = 8\n\n[[jobs.members]]\nrank = 0\nip = \"10.77.0.4\"\nport = 5000\nmac = \"02:00:00:00:00:04\"\ninterface = {free:?}\n"
    );
    let cases: Vec<(String, &str)> = vec![
        (
            good.replacen(&ports_line, &format!("ports = [{free:?}, \"nope0\"]"), 1),
            "port nope0: interface nope0 does not exist in this network namespace",
        ),
        (
            good.replacen(&ports_line, &format!("ports = [{free:?}, {busy:?}]"), 1),
            "already has an XDP program (another xina switch",
        ),
        (
            good.replacen(&ports_line, "ports = []", 1),
            "switch.ports: no ports",
        ),
        (
            good.replacen(&ports_line, &format!("ports = [{free:?}, {free:?}]"), 1),
            "switch.ports[1]: port",
        ),
        (
            good.replacen("slot_pool = 64", "slot_pool = 0", 1),
            "switch.slot_pool: 0 (must be 1..=262144)",
        ),
        (
            good.replacen("slot_pool = 64", "slot_pool = 64\nxdp_mode = \"turbo\"", 1),
            "(xdp_mode): unknown variant `turbo`",
        ),
        (
            good.replacen("slot_pool = 64", "slot_pool = 64\ncolour = 1", 1),
            "unknown field `colour`",
        ),
        (
            format!(
                "{good}{}",
                job.replacen(&format!("interface = {free:?}"), "interface = \"nope1\"", 1)
            ),
            "jobs[0].members[0].interface: nope1 is not a port of this switch",
        ),
        (
            format!(
                "{good}{}",
                job.replacen("slot_count = 8", "slot_count = 80", 1)
            ),
            "jobs[0].slot_count: slots 0..80 do not fit the pool of 64 slots",
        ),
    ];
    for (text, want) in &cases {
        let before = dp.dump().unwrap();
        let other = Pins::new();
        let e = match Config::parse(text) {
            Err(e) => e.to_string(),
            Ok(c) => {
                let r = star
                    .switch()
                    .run(|| control::up(&c, &other.0, None).map(drop))
                    .unwrap();
                let e = r.expect_err(want);
                format!("{:#}", anyhow::Error::from(e))
            }
        };
        assert!(e.contains(want), "got {e:?}, want {want:?}");
        assert!(
            !other.0.exists(),
            "{want}: pins left at {}",
            other.0.path().display()
        );
        assert_eq!(
            star.ports_with_xdp().unwrap(),
            attached,
            "{want}: attachments changed"
        );
        assert_eq!(
            dp.dump().unwrap(),
            before,
            "{want}: the running switch changed"
        );
    }
    // Bringing the running switch up again is refused, and says why.
    let e = star
        .switch()
        .run(|| control::up(&running, &pins.0, None).map(drop))
        .unwrap()
        .unwrap_err();
    let e = format!("{:#}", anyhow::Error::from(e));
    assert!(
        e.contains("a switch is already up at /sys/fs/bpf/xina/t-ctl-"),
        "{e}"
    );
    assert_eq!(star.ports_with_xdp().unwrap(), attached);
    drop(dp);
    let removed = control::down(&pins.0).unwrap();
    assert_eq!(removed.links.len(), 3);
    assert_eq!(star.ports_with_xdp().unwrap(), Vec::<String>::new());
    assert!(!pins.0.exists());
    star.teardown().unwrap();
}

/// Random job adds and removes on a real switch, each through a freshly
/// opened handle (the allocator rebuilt from the pinned `JOBS` map, as
/// after a control-plane restart): installed ranges never overlap, stay in
/// the pool, and a refusal means no free range was large enough.
#[test]
fn random_adds_and_removes_on_pinned_maps_never_overlap_or_leak() {
    use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

    let star = Star::build(3).unwrap();
    let pins = Pins::new();
    let config = Config::parse(&switch_file(&star, &[0, 1, 2])).unwrap();
    drop(
        star.switch()
            .run(|| control::up(&config, &pins.0, None))
            .unwrap()
            .unwrap(),
    );
    let mut rng = StdRng::seed_from_u64(5);
    let mut next_id = 1;
    let (mut added, mut refused) = (0, 0);
    for _ in 0..60 {
        let mut sw = control::open(&pins.0).unwrap();
        let ids: Vec<u32> = sw.dp.jobs().map(|j| j.id).collect();
        if !ids.is_empty() && rng.random_bool(0.4) {
            sw.dp
                .remove_job(ids[rng.random_range(0..ids.len())])
                .unwrap();
        } else {
            let count = rng.random_range(1..=24);
            let used: Vec<(u32, u32)> = sw.dp.jobs().map(|j| (j.slot_base, j.slot_count)).collect();
            match add(&star, &mut sw.dp, &job_file(&star, next_id, count)) {
                Ok(_) => added += 1,
                Err(e) => {
                    assert!(e.contains("the pool is exhausted"), "{e}");
                    assert!(control::largest_free(&used, 64) < count, "{e}");
                    refused += 1;
                }
            }
            next_id += 1;
        }
        let jobs = sw.dp.dump().unwrap().jobs;
        for (i, (a, ja)) in jobs.iter().enumerate() {
            assert!(ja.slot_base + ja.slot_count <= 64);
            for (b, jb) in &jobs[i + 1..] {
                assert!(
                    ja.slot_base + ja.slot_count <= jb.slot_base
                        || jb.slot_base + jb.slot_count <= ja.slot_base,
                    "jobs {a} and {b} overlap"
                );
            }
        }
    }
    assert!(
        added > 10 && refused > 0,
        "{added} added, {refused} refused"
    );
    // Nothing leaked: with every job removed, the whole pool is one range.
    let mut sw = control::open(&pins.0).unwrap();
    let ids: Vec<u32> = sw.dp.jobs().map(|j| j.id).collect();
    for id in ids {
        sw.dp.remove_job(id).unwrap();
    }
    let all = add(&star, &mut sw.dp, &job_file(&star, next_id, 64)).unwrap();
    assert_eq!((all.slot_base, all.slot_count), (0, 64));
    drop(sw);
    control::down(&pins.0).unwrap();
    star.teardown().unwrap();
}

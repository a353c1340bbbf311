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
            good.replacen("elems_per_packet = 64", "elems_per_packet = 16129", 1),
            "elems_per_packet: 16129 (must be 1..=16128 for I32",
        ),
        (
            good.replacen("elems_per_packet = 64", "elems_per_packet = 0", 1),
            "elems_per_packet: 0 (must be 1..=16128",
        ),
        (
            good.replacen("elems_per_packet = 64", "elems_per_packet = 300", 1),
            "elems_per_packet: 300 elements make 1260-byte IP packets, more than the 1000-byte MTU of",
        ),
        (
            good.replacen(
                "elems_per_packet = 64",
                "elems_per_packet = 8065\ndtype = \"i64\"",
                1,
            ),
            "elems_per_packet: 8065 (must be 1..=8064 for I64",
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
        (
            group_file(
                &star,
                2,
                "mode = \"multicast\"\nbytes_per_packet = 1000\nwindow = 2",
                ["sender = true", "", ""],
            ),
            "bytes_per_packet: 1000 bytes make 1060-byte IP packets, more than the 1000-byte MTU of",
        ),
        (
            group_file(
                &star,
                2,
                "mode = \"anycast\"\nwindow = 2",
                ["sender = true", "", ""],
            ),
            "window: only for multicast groups (an anycast group takes no slots)",
        ),
        (
            group_file(
                &star,
                2,
                "mode = \"anycast\"\nslot_base = 8",
                ["sender = true", "", ""],
            ),
            "slot_base: not for anycast groups (they take no slots)",
        ),
        (
            group_file(&star, 2, "mode = \"multicast\"\nwindow = 2", ["", "", ""]),
            "members: no sender (a multicast group needs a member with sender = true)",
        ),
        (
            group_file(
                &star,
                2,
                "mode = \"multicast\"\nwindow = 2\nslot_base = 10",
                ["sender = true", "", ""],
            ),
            "slot_base: slots 10..16 overlap job 1's slots 0..16",
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

/// A job file removed on drop, also when a test fails.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("xina-control-{name}-{}.toml", unique_token()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A group's job file over workers 0..3: `head` gives the mode-dependent
/// keys, `flags[rank]` the member's extra lines (`sender = true`, ...).
fn group_file(star: &Star, id: u32, head: &str, flags: [&str; 3]) -> String {
    let mut t = format!("id = {id}\n{head}\n");
    for (r, extra) in flags.iter().enumerate() {
        let w = star.worker(r);
        let _ = write!(
            t,
            "\n[[members]]\nrank = {r}\nip = \"{}\"\nport = 6000\nmac = \"{}\"\ninterface = \"{}\"\n{extra}\n",
            w.ip,
            w.mac,
            star.port(r).name
        );
    }
    t
}

/// Runs `xina -n SWITCH-NS -s NAME ARGS`: (success, stdout, stderr).
fn xina(star: &Star, pins: &Pins, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xina"))
        .args(["-n", star.switch().name(), "-s", pins.0.name()])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Flags of member `rank` of `job` in `MEMBERS`, and in `PORT_MEMBERS`
/// under the member's port, which must agree.
fn member_flags(dump: &xina::dataplane::Dump, job: u32, rank: u32) -> u8 {
    let m = dump
        .members
        .iter()
        .find(|(k, _)| *k == (job, rank))
        .unwrap_or_else(|| panic!("no MEMBERS entry for job {job} rank {rank}"))
        .1;
    let by_port = dump
        .port_members
        .iter()
        .find(|(k, _)| *k == (job, m.ifindex))
        .unwrap_or_else(|| panic!("no PORT_MEMBERS entry for job {job} rank {rank}"))
        .1;
    assert_eq!(by_port, m, "job {job} rank {rank}: PORT_MEMBERS differs");
    m.flags
}

fn job_entry(dump: &xina::dataplane::Dump, job: u32) -> xina_proto::maps::Job {
    dump.jobs
        .iter()
        .find(|(id, _)| *id == job)
        .unwrap_or_else(|| panic!("no JOBS entry for job {job}"))
        .1
}

/// A switch over workers 0..3 (pool 64) with job 1 on slots 0..16, and
/// the `xina` command run against it.
struct GroupSwitch {
    // Dropped in this order: the handle, the pins, the namespaces.
    dp: Dataplane,
    pins: Pins,
    star: Star,
    files: Vec<TempFile>,
}

impl GroupSwitch {
    fn new() -> Self {
        let star = Star::build(3).unwrap();
        let pins = Pins::new();
        let config = Config::parse(&switch_file(&star, &[0, 1, 2])).unwrap();
        let dp = star
            .switch()
            .run(|| control::up(&config, &pins.0, None))
            .unwrap()
            .unwrap();
        let mut sw = Self {
            dp,
            pins,
            star,
            files: Vec::new(),
        };
        let job = sw.file("job", &job_file(&sw.star, 1, 16));
        sw.ok(&["job", "add", &job]);
        sw
    }

    /// A job file with this text; its path.
    fn file(&mut self, name: &str, text: &str) -> String {
        let f = TempFile::new(name, text);
        let path = f.path().to_owned();
        self.files.push(f);
        path
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = xina(&self.star, &self.pins, args);
        assert!(ok, "xina {args:?}: {err}");
        out
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// Runs each `xina ARGS` that must fail with `want` in its message and
    /// leave the maps as they were.
    fn refused(&self, refusals: &[(&[&str], &str)]) {
        for (args, want) in refusals {
            let before = self.dp.dump().unwrap();
            let (ok, _, err) = xina(&self.star, &self.pins, args);
            assert!(!ok, "xina {args:?} succeeded");
            assert!(err.contains(want), "xina {args:?}: {err:?}, want {want:?}");
            assert_eq!(
                self.dp.dump().unwrap(),
                before,
                "xina {args:?} changed the maps"
            );
        }
    }

    /// After `job rm ID` (printing `said`), only job 1 is left in the maps.
    fn remove(&self, id: &str, said: &str) {
        assert_eq!(self.ok(&["job", "rm", id]).trim(), said);
        let dump = self.dp.dump().unwrap();
        assert_eq!(dump.jobs.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1]);
        assert!(dump.members.iter().all(|((job, _), _)| *job == 1));
        assert!(dump.port_members.iter().all(|((job, _), _)| *job == 1));
    }

    fn finish(self) {
        let Self {
            dp,
            pins,
            star,
            files,
        } = self;
        drop((dp, files));
        control::down(&pins.0).unwrap();
        star.teardown().unwrap();
    }
}

/// A multicast group through the `xina` command on a pinned switch:
/// installed from a job file next to a job (the entries the dataplane
/// reads: mode, type, bytes per packet, window x members slots after the
/// job's, member flags, every member a receiver), listed and shown with
/// its shape, refused `job down`, and its slots freed by `job rm`.
#[test]
fn a_multicast_group_is_installed_shown_and_removed() {
    use xina_proto::maps::{member_flags::SENDER, mode};

    let mut sw = GroupSwitch::new();
    let mcast = sw.file(
        "mcast",
        &group_file(
            &sw.star,
            2,
            "mode = \"multicast\"\nbytes_per_packet = 1000\nwindow = 4",
            ["sender = true", "", "sender = true"],
        ),
    );
    let m = sw.json(&["job", "add", &mcast, "--json"]);
    assert_eq!(m["mode"], "multicast");
    assert_eq!(m["dtype"], "bytes");
    assert_eq!(m["bytes_per_packet"], 1000);
    assert_eq!(m["elems_per_packet"], 1000);
    assert_eq!(m["window"], 4);
    assert_eq!(
        (m["slot_base"].as_u64(), m["slot_count"].as_u64()),
        (Some(16), Some(12)),
        "window 4 x 3 members, after job 1's 16 slots"
    );
    let senders: Vec<bool> = (0..3)
        .map(|r| m["members"][r]["sender"].as_bool().unwrap())
        .collect();
    assert_eq!(senders, [true, false, true]);

    let dump = sw.dp.dump().unwrap();
    let j = job_entry(&dump, 2);
    assert_eq!(
        (j.mode, j.dtype, j.op, j.elems, j.fan_in),
        (mode::MULTICAST, xina_proto::DType::Bytes as u8, 0, 1000, 3)
    );
    assert_eq!((j.slot_base, j.slot_count, j.all_ranks), (16, 12, 0b111));
    let flags: Vec<u8> = (0..3).map(|r| member_flags(&dump, 2, r)).collect();
    assert_eq!(flags, [SENDER, 0, SENDER]);
    let job = job_entry(&dump, 1);
    assert!(!xina::config::overlap(
        (job.slot_base, job.slot_count),
        (j.slot_base, j.slot_count)
    ));

    // Listed with its shape; a job's group fields are null.
    let ls = sw.json(&["job", "ls", "--json"]);
    let ids: Vec<u64> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2]);
    assert!(ls[0]["bytes_per_packet"].is_null() && ls[0]["window"].is_null());
    assert_eq!(ls[0]["members"][0]["sender"], false);
    let table = sw.ok(&["job", "ls"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("multicast") && l.contains("1000") && l.contains("16..28")),
        "{table}"
    );
    let show = sw.ok(&["job", "show", "2"]);
    assert!(
        show.contains(
            "job 2: multicast group, 3 ranks, 1000 bytes per packet, window 4, slots 16..28"
        ),
        "{show}"
    );
    assert!(
        show.lines()
            .filter(|l| l.trim_end().ends_with("sender"))
            .count()
            == 2,
        "{show}"
    );

    sw.refused(&[
        (
            &["job", "down", "2", "1"],
            "xina: job 2: rank 1: only members of anycast groups go down or up (mode multicast)",
        ),
        (
            &["job", "up", "1", "0"],
            "xina: job 1: rank 0: only members of anycast groups go down or up (mode allreduce)",
        ),
        (&["job", "up", "9", "0"], "xina: job 9 is not installed"),
    ]);
    // A group too large for the free slots names its window.
    let big = sw.file(
        "big",
        &group_file(
            &sw.star,
            4,
            "mode = \"multicast\"\nwindow = 13",
            ["sender = true", "", ""],
        ),
    );
    sw.refused(&[(
        &["job", "add", &big],
        "window: 39 slots wanted, but the pool is exhausted: its largest free range is 36 of 64 slots",
    )]);

    // Removing the group frees its slots and entries.
    sw.remove("2", "job 2 removed: slots 16..28 are free");
    let mut opened = control::open(&sw.pins.0).unwrap();
    let rest = add(&sw.star, &mut opened.dp, &job_file(&sw.star, 5, 48)).unwrap();
    assert_eq!(
        (rest.slot_base, rest.slot_count),
        (16, 48),
        "the group's slots were returned"
    );
    drop(opened);
    sw.finish();
}

/// An anycast group through the `xina` command on a pinned switch:
/// installed from a job file with a member down (no slots; the receivers
/// are the members that are up), then members taken down and up, with
/// the receivers and the flags of `MEMBERS` and `PORT_MEMBERS` checked
/// after each step; an unknown rank is refused without changing anything.
///
/// Installing an anycast group (no slots, receivers without the members
/// down) is `Dataplane::install_job`'s part of groups.
#[test]
fn anycast_members_go_down_and_up() {
    use xina_proto::maps::{member_flags::DOWN, member_flags::SENDER, mode};

    let mut sw = GroupSwitch::new();
    let anycast = sw.file(
        "anycast",
        &group_file(
            &sw.star,
            3,
            "mode = \"anycast\"",
            ["sender = true", "down = true", ""],
        ),
    );
    let a = sw.json(&["job", "add", &anycast, "--json"]);
    assert_eq!(a["mode"], "anycast");
    assert_eq!(a["bytes_per_packet"], 1440, "the default");
    assert_eq!(a["slot_count"], 0);
    assert!(a["window"].is_null());
    assert_eq!(a["members"][1]["down"], true);
    let dump = sw.dp.dump().unwrap();
    let j = job_entry(&dump, 3);
    assert_eq!(
        (j.mode, j.dtype, j.elems, j.slot_count, j.all_ranks),
        (
            mode::ANYCAST,
            xina_proto::DType::Bytes as u8,
            1440,
            0,
            0b100
        ),
        "rank 0 sends and rank 1 is down: only rank 2 receives"
    );
    let flags: Vec<u8> = (0..3).map(|r| member_flags(&dump, 3, r)).collect();
    assert_eq!(flags, [SENDER, DOWN, 0]);
    let show = sw.ok(&["job", "show", "3"]);
    assert!(
        show.contains("job 3: anycast group, 3 ranks, 1440 bytes per packet, no slots"),
        "{show}"
    );
    assert!(
        show.lines().any(|l| l.trim_end().ends_with(" down")),
        "{show}"
    );

    // Down and up: the receivers and the flags after each step.
    let steps: [(&str, &str, &str, u64, [u8; 3]); 5] = [
        ("up", "1", "job 3 rank 1 is up", 0b110, [SENDER, 0, 0]),
        (
            "down",
            "2",
            "job 3 rank 2 is down",
            0b010,
            [SENDER, 0, DOWN],
        ),
        (
            "down",
            "2",
            "job 3 rank 2 was already down",
            0b010,
            [SENDER, 0, DOWN],
        ),
        // A sender never receives, up or down.
        (
            "down",
            "0",
            "job 3 rank 0 is down",
            0b010,
            [SENDER | DOWN, 0, DOWN],
        ),
        ("up", "0", "job 3 rank 0 is up", 0b010, [SENDER, 0, DOWN]),
    ];
    for (verb, rank, said, receivers, want) in steps {
        let out = sw.ok(&["job", verb, "3", rank]);
        assert_eq!(out.trim(), said);
        let dump = sw.dp.dump().unwrap();
        assert_eq!(
            job_entry(&dump, 3).all_ranks,
            receivers,
            "after job {verb} 3 {rank}"
        );
        let flags: Vec<u8> = (0..3).map(|r| member_flags(&dump, 3, r)).collect();
        assert_eq!(flags, want, "after job {verb} 3 {rank}");
    }
    let shown = sw.json(&["job", "show", "3", "--json"]);
    let down: Vec<bool> = (0..3)
        .map(|r| shown["members"][r]["down"].as_bool().unwrap())
        .collect();
    assert_eq!(down, [false, false, true], "read back from the maps");

    sw.refused(&[
        (
            &["job", "down", "3", "3"],
            "xina: job 3: rank 3 is not a member (ranks 0..3)",
        ),
        (&["job", "down", "3", "300"], "invalid value '300'"),
    ]);
    sw.remove("3", "job 3 removed (it had no slots)");
    sw.finish();
}

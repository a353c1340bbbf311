//! The `xina` command as an operator uses it (root needed for `run`).

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use xina_testbed::{
    scenario::{AllreduceSpec, star_config},
    topology::Star,
};

const XINA: &str = env!("CARGO_BIN_EXE_xina");

fn write_config(text: &str) -> tempfile_path::TempPath {
    tempfile_path::TempPath::new(text)
}

/// A file in the target directory, removed on drop.
mod tempfile_path {
    use std::{
        path::PathBuf,
        sync::atomic::{AtomicU32, Ordering},
    };

    pub struct TempPath(pub PathBuf);

    impl TempPath {
        pub fn new(text: &str) -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
            let path = dir.join(format!(
                "xina-cli-{}-{}.toml",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, text).expect("write config");
            Self(path)
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn check_rejects_a_bad_file_with_one_line_naming_the_field() {
    let good = "[switch]\nports = [\"sp0\", \"sp1\"]\n\n[[jobs]]\nid = 1\nelems_per_packet = 64\nslot_base = 0\nslot_count = 8\n\n\
                [[jobs.members]]\nrank = 0\nip = \"10.0.0.1\"\nport = 5000\nmac = \"02:00:00:00:00:01\"\ninterface = \"sp0\"\n";
    let file = write_config(good);
    let out = Command::new(XINA)
        .args(["check", "-c"])
        .arg(&file.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("job 1: 1 ranks, 64 elements per packet, slots 0..8")
    );

    let bad = write_config(&good.replace("rank = 0", "rank = 3"));
    let out = Command::new(XINA)
        .args(["check", "-c"])
        .arg(&bad.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("jobs[0].members[0].rank: rank 3 outside 0..1"),
        "{stderr}"
    );

    let out = Command::new(XINA)
        .args(["check", "-c", "/nonexistent/xina.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading /nonexistent/xina.toml"));
}

/// `xina check` lists groups with their mode, bytes per packet and window,
/// and names a group's bad key in one line.
#[test]
fn check_shows_groups_and_names_their_bad_keys() {
    let member = |rank: u8, port: u16, extra: &str| {
        format!(
            "\n[[jobs.members]]\nrank = {rank}\nip = \"10.0.0.{}\"\nport = {port}\n\
             mac = \"02:00:00:00:00:0{}\"\ninterface = \"sp{rank}\"\n{extra}\n",
            rank + 1,
            rank + 1
        )
    };
    let text = format!(
        "[switch]\nports = [\"sp0\", \"sp1\"]\nslot_pool = 64\n\n\
         [[jobs]]\nid = 2\nmode = \"multicast\"\nbytes_per_packet = 512\nwindow = 8\nslot_base = 16\n{}{}\n\
         [[jobs]]\nid = 3\nmode = \"anycast\"\n{}{}",
        member(0, 6000, "sender = true"),
        member(1, 6000, ""),
        member(0, 7000, "sender = true"),
        member(1, 7000, ""),
    );
    let file = write_config(&text);
    let out = Command::new(XINA)
        .args(["check", "-c"])
        .arg(&file.0)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "job 2: multicast group, 2 ranks, 512 bytes per packet, window 8, slots 16..32"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("job 3: anycast group, 2 ranks, 1440 bytes per packet, no slots"),
        "{stdout}"
    );
    let bad = write_config(&text.replacen("window = 8", "window = 8\nop = \"max\"", 1));
    let out = Command::new(XINA)
        .args(["check", "-c"])
        .arg(&bad.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("jobs[0].op: not for groups (a group forwards bytes, it combines nothing)"),
        "{stderr}"
    );
}

/// `xina run` attaches to every configured port, runs until SIGTERM, prints
/// its counters and detaches from everything.
#[test]
fn run_attaches_and_detaches_cleanly() {
    let star = Star::build(2).unwrap();
    let spec = AllreduceSpec {
        workers: 2,
        ..Default::default()
    };
    let config = write_config(&star_config(&star, &spec));
    let mut child = Command::new("ip")
        .args(["netns", "exec", star.switch().name(), XINA, "run", "-c"])
        .arg(&config.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its standard error, line by line, as it comes: SIGTERM is sent once it
    // says it runs (before that, the signal is not handled yet, and would
    // end it the default way, though with nothing left attached).
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("running;")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("xina run did not start running: {}", seen.join("\n"));
            }
        }
    }
    assert_eq!(
        star.ports_with_xdp().unwrap().len(),
        2,
        "both ports attached"
    );
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process, which has not been reaped.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    seen.extend(lines.try_iter());
    let stderr = seen.join("\n");
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("job 1 installed: 2 ranks"), "{stderr}");
    assert!(stderr.contains("detached"), "{stderr}");
    assert_eq!(
        star.ports_with_xdp().unwrap(),
        Vec::<String>::new(),
        "nothing stays attached"
    );
}

/// A port that does not exist: one clear line, and nothing stays attached
/// to the ports that do.
#[test]
fn run_with_a_missing_port_attaches_nothing() {
    let star = Star::build(1).unwrap();
    let spec = AllreduceSpec {
        workers: 1,
        ..Default::default()
    };
    // The missing port comes after a real one, so a real attach is undone.
    let real = &star.port(0).name;
    let text = star_config(&star, &spec).replacen(
        &format!("ports = [\"{real}\"]"),
        &format!("ports = [\"{real}\", \"xina-nope0\"]"),
        1,
    );
    assert!(text.contains("xina-nope0"));
    let config = write_config(&text);
    let out = Command::new("ip")
        .args(["netns", "exec", star.switch().name(), XINA, "run", "-c"])
        .arg(&config.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("xina: starting the switch: port xina-nope0:"),
        "{stderr}"
    );
    assert!(
        last.contains("interface xina-nope0 does not exist"),
        "{stderr}"
    );
    assert_eq!(star.ports_with_xdp().unwrap(), Vec::<String>::new());
}

//! A pinned switch driven through the `xina` command, for the tests that
//! need one: its pins and files removed on drop, and `xina -n NS -s NAME`
//! commands.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
};

use serde_json::Value;
use xina::pin::{self, PinDir};
use xina_testbed::{netns::unique_token, topology::Star};

pub const XINA: &str = env!("CARGO_BIN_EXE_xina");

/// The switch's pins and the test's files, removed on drop (the pins with
/// whatever they hold, detaching the ports), also when the test fails.
pub struct Guard {
    pub pins: PinDir,
    files: Vec<PathBuf>,
}

impl Guard {
    /// A guard for a switch named `prefix` and a unique token.
    pub fn new(prefix: &str) -> Self {
        Self {
            pins: PinDir::new(pin::DEFAULT_ROOT, &format!("{prefix}{}", unique_token())).unwrap(),
            files: Vec::new(),
        }
    }

    /// A switch file with every port of `star` and a pool of `slot_pool`
    /// slots, no jobs.
    pub fn switch_file(&mut self, star: &Star, slot_pool: u32) -> PathBuf {
        let ports: Vec<String> = star
            .ports()
            .iter()
            .map(|p| format!("{:?}", p.name))
            .collect();
        self.file(&format!(
            "[switch]\nports = [{}]\nslot_pool = {slot_pool}\n",
            ports.join(", ")
        ))
    }

    pub fn file(&mut self, text: &str) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "xina-test-{}-{}.toml",
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

pub struct Xina<'a> {
    pub ns: &'a str,
    pub name: &'a str,
}

impl Xina<'_> {
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(XINA);
        c.args(["-n", self.ns, "-s", self.name]).args(args);
        c
    }

    /// Runs `xina ARGS`, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().unwrap();
        assert!(
            out.status.success(),
            "xina {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn fails(&self, args: &[&str]) -> Output {
        let out = self.command(args).output().unwrap();
        assert!(!out.status.success(), "xina {args:?} succeeded");
        out
    }

    pub fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// A long-running `xina` process (a control plane to kill).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

/// The ids of the jobs installed on the switch.
pub fn installed(xina: &Xina<'_>) -> Vec<u64> {
    xina.json(&["job", "ls", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect()
}

/// `xina serve`, killed on drop if still running.
pub struct Serve {
    child: Child,
    pub addr: String,
}

impl Serve {
    pub fn start(xina: &Xina<'_>, file: &std::path::Path) -> Self {
        let mut child = xina
            .command(&["serve", "-c", file.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .trim()
            .to_owned();
        Self { child, addr }
    }

    /// Sends SIGTERM and waits; whether the process exited successfully.
    pub fn stop(mut self) -> bool {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(i32::try_from(self.child.id()).unwrap(), libc::SIGTERM) };
        self.child.wait().unwrap().success()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

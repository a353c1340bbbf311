//! Open MPI as a column of the benches, when `mpirun` and `mpicc` are
//! installed (Debian `openmpi-bin libopenmpi-dev`).
//!
//! [`MpiProgram::build`] compiles the testbed's own benchmark program,
//! `testbed/mpi/xina_mpi_bench.c` (embedded here), with `mpicc -O2` into a
//! fresh temporary directory. [`MpiJob::start`] launches it with one rank in
//! each worker namespace of a star, and keeps it running for the sweep of
//! that star: rank 0 reads one command per line from `mpirun`'s standard
//! input and answers each with one line (see the C file), so the benches
//! interleave Open MPI's repetitions with the other implementations'.
//!
//! # How `mpirun` spans the namespaces
//!
//! `mpirun` itself runs in worker 0's namespace (`ip netns exec`), so that
//! its out-of-band TCP reaches every daemon over the star. Every namespace
//! is a "host" of a host file (one slot each, mapped by node), and the rsh
//! launch agent is a script of ours that runs the daemon (`orted`) of host
//! `NS` under `ip netns exec NS sh -c ...`, as `ssh` would run it on a
//! remote machine. Each daemon, and `mpirun`, gets its own `TMPDIR` under
//! the temporary directory, so their session directories do not race. The
//! flags ([`mpirun_args`]):
//!
//! - `--mca btl tcp,self --mca pml ob1`: TCP between ranks, never shared
//!   memory (the ranks share a host but not a network);
//! - `--mca btl_tcp_if_include` and `oob_tcp_if_include` set to the star's
//!   subnet;
//! - `--mca plm_rsh_no_tree_spawn 1`: `mpirun` launches every daemon;
//! - `--bind-to none`, and `--mca mpi_yield_when_idle 1` when the ranks
//!   outnumber the CPUs (Open MPI otherwise spins in its progress loop and
//!   starves the rank it waits for);
//! - `--allow-run-as-root`: the testbed runs as root.
//!
//! Each collective's result is checked inside the C program, after its
//! clock stops; a wrong result aborts the job, which this module reports as
//! an error with the program's message.

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read, Write as _},
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, RecvTimeoutError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::{
    netns, plain,
    topology::{PREFIX_LEN, SUBNET, Star},
};

/// The benchmark program's source.
pub const SOURCE: &str = include_str!("../mpi/xina_mpi_bench.c");

/// The prefix of every line the program answers with.
const ANSWER_PREFIX: &str = "xina-mpi ";

/// How long `mpirun` may take to start every rank.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a job may take to end after its input closes, before it is
/// killed.
const END_TIMEOUT: Duration = Duration::from_secs(10);

/// Lines of the job's standard error kept for error messages.
const STDERR_LINES: usize = 20;

/// Whether `mpirun` and `mpicc` are on the `PATH`: the benches add Open
/// MPI's column exactly then.
pub fn available() -> bool {
    ["mpirun", "mpicc"]
        .iter()
        .all(|p| find_program(p).is_some())
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The benchmark program, compiled in a temporary directory that is
/// removed when this is dropped.
#[derive(Debug)]
pub struct MpiProgram {
    dir: PathBuf,
    binary: PathBuf,
}

impl MpiProgram {
    /// What a bench that `wanted` Open MPI measures it with: the program,
    /// built, when Open MPI is installed (`progress` hears which); `None`
    /// when it was not wanted or is not installed, and the bench leaves
    /// its `what` (column, rows) out.
    ///
    /// # Errors
    /// As [`Self::build`].
    pub fn for_bench(
        wanted: bool,
        what: &str,
        progress: &mut impl FnMut(&str),
    ) -> anyhow::Result<Option<Self>> {
        if !wanted {
            return Ok(None);
        }
        if !available() {
            progress(&format!(
                "mpirun or mpicc not installed: no Open MPI {what}"
            ));
            return Ok(None);
        }
        progress("compiling the Open MPI benchmark program");
        Self::build().map(Some)
    }

    /// Writes [`SOURCE`] to a fresh temporary directory and compiles it
    /// with `mpicc -O2`.
    ///
    /// # Errors
    /// When the directory cannot be made or `mpicc` fails (with its
    /// messages).
    pub fn build() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("xina-mpi-{}", netns::unique_token()));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let program = Self {
            binary: dir.join("xina_mpi_bench"),
            dir,
        };
        let source = program.dir.join("xina_mpi_bench.c");
        fs::write(&source, SOURCE).with_context(|| format!("writing {}", source.display()))?;
        let args: [&std::ffi::OsStr; 4] = [
            "-O2".as_ref(),
            "-o".as_ref(),
            program.binary.as_os_str(),
            source.as_os_str(),
        ];
        netns::run_command("mpicc", &args).context("compiling the MPI benchmark program")?;
        log::info!("compiled {}", program.binary.display());
        Ok(program)
    }

    /// The compiled program.
    pub fn binary(&self) -> &Path {
        &self.binary
    }
}

impl Drop for MpiProgram {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            log::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// One collective's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// Every sample the program timed (see the C file for what one is).
    pub samples: Vec<Duration>,
    /// TCP segments retransmitted in the star's worker namespaces while it
    /// ran (namespace counters: nothing else sends there meanwhile).
    pub retransmits: u64,
}

/// The benchmark program running on a star, one rank per worker
/// namespace, waiting for commands. Dropping it ends the job (and kills it
/// if it does not end).
#[derive(Debug)]
pub struct MpiJob<'a> {
    star: &'a Star,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    dir: PathBuf,
    timeout: Duration,
}

/// The arguments of `mpirun` for `ranks` ranks with the host file `hosts`
/// and the launch agent `agent`, on a machine of `cpus` CPUs.
pub fn mpirun_args(ranks: usize, cpus: usize, hosts: &Path, agent: &Path) -> Vec<OsString> {
    let subnet = format!("{SUBNET}/{PREFIX_LEN}");
    let mut args: Vec<OsString> = [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        &ranks.to_string(),
        "--map-by",
        "node",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl_tcp_if_include",
        &subnet,
        "--mca",
        "oob_tcp_if_include",
        &subnet,
    ]
    .iter()
    .map(OsString::from)
    .collect();
    if ranks > cpus {
        args.extend(["--mca", "mpi_yield_when_idle", "1"].map(OsString::from));
    }
    args.extend([
        "--hostfile".into(),
        hosts.as_os_str().to_owned(),
        "--mca".into(),
        "plm_rsh_agent".into(),
        agent.as_os_str().to_owned(),
    ]);
    args
}

/// The rsh launch agent: `AGENT HOST COMMAND...` runs COMMAND in the
/// namespace HOST with its own temporary directory.
fn agent_script(sessions: &Path) -> String {
    format!(
        "#!/bin/sh\n\
         # Open MPI's launch agent for the testbed: HOST is a network namespace.\n\
         host=$1\n\
         shift\n\
         mkdir -p '{dir}'/\"$host\"\n\
         TMPDIR='{dir}'/\"$host\" exec ip netns exec \"$host\" sh -c \"$*\"\n",
        dir = sessions.display()
    )
}

/// `mpirun` (in worker 0's namespace) of one rank per worker of `star`,
/// its host file, launch agent and session directories under `dir` (made
/// here), each `env` pair exported to the ranks (`-x`); the program and its
/// arguments go after.
///
/// # Errors
/// When the files cannot be written.
pub fn mpirun(star: &Star, dir: &Path, env: &[(&str, &str)]) -> anyhow::Result<Command> {
    let ranks = star.workers().len();
    let sessions = dir.join("sessions");
    fs::create_dir_all(sessions.join("mpirun"))
        .with_context(|| format!("creating {}", sessions.display()))?;
    let hosts = dir.join("hosts");
    let mut host_file = String::new();
    for w in star.workers() {
        let _ = writeln!(host_file, "{} slots=1", w.ns().name());
    }
    fs::write(&hosts, host_file).with_context(|| format!("writing {}", hosts.display()))?;
    let agent = dir.join("netns-agent.sh");
    fs::write(&agent, agent_script(&sessions))
        .and_then(|()| fs::set_permissions(&agent, fs::Permissions::from_mode(0o755)))
        .with_context(|| format!("writing {}", agent.display()))?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", star.worker(0).ns().name()])
        .args(mpirun_args(ranks, cpus, &hosts, &agent))
        .env("TMPDIR", sessions.join("mpirun"));
    for (name, value) in env {
        command.arg("-x").arg(format!("{name}={value}"));
    }
    Ok(command)
}

impl<'a> MpiJob<'a> {
    /// Starts `program` with one rank per worker of `star` (rank `i` in
    /// worker `i`'s namespace) and waits until every rank is up. `timeout`
    /// bounds each command's answer.
    ///
    /// # Errors
    /// When files cannot be written, `mpirun` cannot start, or the ranks do
    /// not come up (with what `mpirun` said).
    pub fn start(program: &MpiProgram, star: &'a Star, timeout: Duration) -> anyhow::Result<Self> {
        Self::start_with(program, star, timeout, &[])
    }

    /// [`MpiJob::start`] with `args` for the program (`--corrupt-rank R`:
    /// rank R falsifies every result it gets before checking it, so that
    /// tests can see a wrong answer fail).
    ///
    /// # Errors
    /// As [`MpiJob::start`].
    pub fn start_with(
        program: &MpiProgram,
        star: &'a Star,
        timeout: Duration,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_with_env(program, star, timeout, args, &[])
    }

    /// [`MpiJob::start_with`], each `env` pair exported to every rank (the
    /// xina column of `bench mpi` preloads the PMPI library so).
    ///
    /// # Errors
    /// As [`MpiJob::start`].
    pub fn start_with_env(
        program: &MpiProgram,
        star: &'a Star,
        timeout: Duration,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = program.dir.join(format!("job-{}", star.token()));
        let mut command = mpirun(star, &dir, env)?;
        command
            .arg(program.binary())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only
        // makes one async-signal-safe system call (prctl).
        unsafe {
            command.pre_exec(|| {
                // mpirun (which `ip netns exec` becomes) gets SIGTERM when
                // the thread that started it ends, so a bench killed before
                // it could drop the job does not leave it running; mpirun
                // then stops its daemons and ranks.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        log::debug!("starting {command:?}");
        let mut child = command.spawn().context("starting mpirun")?;
        let stdout = child.stdout.take().context("mpirun's stdout")?;
        let stderr_pipe = child.stderr.take().context("mpirun's stderr")?;
        let (tx, lines) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = vec![std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                log::debug!("mpirun: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        })];
        let tail = Arc::clone(&stderr);
        readers.push(std::thread::spawn(move || keep_tail(stderr_pipe, &tail)));
        let mut job = Self {
            star,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            readers,
            dir,
            timeout,
        };
        let ranks = star.workers().len();
        let ready = job.answer("xina-mpi ready", START_TIMEOUT)?;
        ensure!(
            ready.trim() == format!("xina-mpi ready ranks={ranks}"),
            "mpirun started {ready:?}, expected {ranks} ranks"
        );
        log::info!("Open MPI job of {ranks} ranks up on star {}", star.token());
        Ok(job)
    }

    /// `reps` repetitions of `iters` int32 sum allreduces of `bytes` per
    /// rank; one sample per repetition, its time per allreduce.
    ///
    /// # Errors
    /// As [`MpiJob::command`].
    pub fn allreduce_i32(
        &mut self,
        bytes: usize,
        iters: usize,
        reps: usize,
    ) -> anyhow::Result<Answer> {
        self.command(
            &format!("allreduce int32 {bytes} {iters} {reps}"),
            "allreduce int32",
            reps,
        )
    }

    /// As [`MpiJob::allreduce_i32`], over `float` (sums of small integers,
    /// exact in any order, so checked exactly too).
    ///
    /// # Errors
    /// As [`MpiJob::command`].
    pub fn allreduce_f32(
        &mut self,
        bytes: usize,
        iters: usize,
        reps: usize,
    ) -> anyhow::Result<Answer> {
        self.command(
            &format!("allreduce float {bytes} {iters} {reps}"),
            "allreduce float",
            reps,
        )
    }

    /// `iters · reps` broadcasts of `bytes`, each a sample, the root
    /// rotating over the ranks.
    ///
    /// # Errors
    /// As [`MpiJob::command`].
    pub fn bcast(&mut self, bytes: usize, iters: usize, reps: usize) -> anyhow::Result<Answer> {
        self.command(
            &format!("bcast {bytes} {iters} {reps}"),
            "bcast bytes",
            iters * reps,
        )
    }

    /// Sends `line`, reads the answer that starts with `xina-mpi WHAT` and
    /// its `count` samples.
    ///
    /// # Errors
    /// When the job ended (a wrong result aborts it: the error carries the
    /// program's message), did not answer within the timeout, or answered
    /// something else.
    fn command(&mut self, line: &str, what: &str, count: usize) -> anyhow::Result<Answer> {
        let before = plain::star_retrans_segs(self.star).context("reading TCP counters")?;
        let stdin = self
            .stdin
            .as_mut()
            .context("the MPI job's input is closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("Open MPI: sending {line:?}: {}", self.stderr_tail()))?;
        let answer = self
            .answer(&format!("{ANSWER_PREFIX}{what} "), self.timeout)
            .with_context(|| format!("Open MPI: {line}"))?;
        let after = plain::star_retrans_segs(self.star).context("reading TCP counters")?;
        let samples = parse_samples(&answer)
            .with_context(|| format!("Open MPI: {line}: cannot read {answer:?}"))?;
        ensure!(
            samples.len() == count,
            "Open MPI: {line}: {} samples, expected {count}",
            samples.len()
        );
        Ok(Answer {
            samples,
            retransmits: after.saturating_sub(before),
        })
    }

    /// The next line that starts with `prefix`, within `timeout`.
    fn answer(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(line) => log::info!("mpirun: {line}"),
                Err(RecvTimeoutError::Timeout) => {
                    bail!("no answer within {timeout:?}: {}", self.stderr_tail())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .child
                        .wait()
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    // The stderr reader may still be draining the pipe.
                    std::thread::sleep(Duration::from_millis(100));
                    bail!("mpirun ended ({status}): {}", self.stderr_tail())
                }
            }
        }
    }

    fn stderr_tail(&self) -> String {
        let lines = self
            .stderr
            .lock()
            .map(|l| l.join(" | "))
            .unwrap_or_default();
        if lines.is_empty() {
            "nothing on stderr".to_owned()
        } else {
            lines
        }
    }
}

impl Drop for MpiJob<'_> {
    fn drop(&mut self) {
        // End of input: rank 0 tells every rank to finalize.
        drop(self.stdin.take());
        let deadline = Instant::now() + END_TIMEOUT;
        let mut ended = false;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                ended = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !ended {
            log::warn!("the MPI job did not end within {END_TIMEOUT:?}; stopping mpirun");
            stop(&mut self.child);
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            log::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// Stops `mpirun`: SIGTERM first (it then stops its daemons and ranks),
/// SIGKILL after [`END_TIMEOUT`].
pub(crate) fn stop(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill takes no pointers; `pid` is our child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + END_TIMEOUT;
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Keeps the last [`STDERR_LINES`] lines of `pipe` in `tail`.
fn keep_tail(pipe: impl Read, tail: &Mutex<Vec<String>>) {
    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
        log::debug!("mpirun stderr: {line}");
        if let Ok(mut t) = tail.lock() {
            if t.len() == STDERR_LINES {
                t.remove(0);
            }
            t.push(line);
        }
    }
}

/// The `samples_ns=` list of an answer line.
fn parse_samples(line: &str) -> Option<Vec<Duration>> {
    let list = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("samples_ns="))?;
    list.split(',')
        .map(|s| s.parse::<u64>().ok().map(Duration::from_nanos))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_from_the_answer() {
        let line = "xina-mpi allreduce int32 ranks=2 bytes=8 iters=20 reps=3 \
                    median_ns=20 samples_ns=10,20,30";
        assert_eq!(
            parse_samples(line),
            Some(vec![
                Duration::from_nanos(10),
                Duration::from_nanos(20),
                Duration::from_nanos(30)
            ])
        );
        assert_eq!(parse_samples("xina-mpi ready ranks=2"), None);
        assert_eq!(parse_samples("xina-mpi bcast samples_ns=1,x"), None);
    }

    #[test]
    fn yield_only_when_oversubscribed() {
        let args = |ranks, cpus| {
            mpirun_args(ranks, cpus, Path::new("/h"), Path::new("/a"))
                .iter()
                .any(|a| a == "mpi_yield_when_idle")
        };
        assert!(args(8, 2));
        assert!(!args(2, 2));
    }
}

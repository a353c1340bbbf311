//! The xina PMPI library (`userspace/xina-mpi/xina_mpi.c`) under test:
//! [`Pmpi::build`] compiles it against `libxina_c` with `mpicc`, and the
//! testbed's check program (`testbed/mpi/xina_mpi_check.c`) with it;
//! [`MpiRun`] runs a program to its end with one rank per worker namespace
//! of a star (as [`crate::mpi`] launches its bench program), the library
//! preloaded into every rank; [`service_text`] is the job service's file
//! for a star.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, RecvTimeoutError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{mpi, netns, topology::Star};

/// The PMPI library's source.
pub const LIBRARY_SOURCE: &str = include_str!("../../userspace/xina-mpi/xina_mpi.c");

/// The check program's source.
pub const CHECK_SOURCE: &str = include_str!("../mpi/xina_mpi_check.c");

/// The C header of `libxina_c`.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../userspace/xina-c/include")
}

/// A service file for `star`'s switch: listening on the control address
/// (a port the kernel picks), every worker's address routed to its port,
/// leases of `lease_secs`, and `tenants` (`[[tenants]]` entries).
pub fn service_text(star: &Star, lease_secs: u64, tenants: &str) -> String {
    let mut text = format!(
        "listen = \"{}:0\"\nswitch_addr = \"{}:{}\"\nlease_secs = {lease_secs}\njob_ids = [100, 199]\n",
        star.control_ip(),
        star.service_ip(),
        xina_proto::XINA_UDP_PORT
    );
    for (r, w) in star.workers().iter().enumerate() {
        let _ = write!(
            text,
            "[[hosts]]\nprefix = \"{}/32\"\nport = \"{}\"\n",
            w.ip,
            star.port(r).name
        );
    }
    text.push_str(tenants);
    text
}

/// The PMPI library and the check program, compiled in a temporary
/// directory that is removed on drop.
#[derive(Debug)]
pub struct Pmpi {
    dir: PathBuf,
    /// `libxina_mpi.so`, for `LD_PRELOAD`.
    pub library: PathBuf,
    /// The check program (an ordinary MPI program).
    pub check: PathBuf,
}

impl Pmpi {
    /// Compiles both with `mpicc`, the library linked to `libxina_c.so` in
    /// `xina_c_dir` (with that directory as its run path), as
    /// `userspace/xina-mpi/Makefile` does.
    ///
    /// # Errors
    /// When `mpicc` fails (with its messages) or files cannot be written.
    pub fn build(xina_c_dir: &Path) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("xina-pmpi-{}", netns::unique_token()));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let built = Self {
            library: dir.join("libxina_mpi.so"),
            check: dir.join("xina_mpi_check"),
            dir,
        };
        let library_source = built.dir.join("xina_mpi.c");
        let check_source = built.dir.join("xina_mpi_check.c");
        fs::write(&library_source, LIBRARY_SOURCE)
            .and_then(|()| fs::write(&check_source, CHECK_SOURCE))
            .with_context(|| format!("writing the sources into {}", built.dir.display()))?;
        let include = include_dir();
        let lib = format!("-L{}", xina_c_dir.display());
        let rpath = format!("-Wl,-rpath,{}", xina_c_dir.display());
        let inc = format!("-I{}", include.display());
        let library_args: Vec<&std::ffi::OsStr> = vec![
            "-O2".as_ref(),
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            "-o".as_ref(),
            built.library.as_os_str(),
            library_source.as_os_str(),
            inc.as_ref(),
            lib.as_ref(),
            "-lxina_c".as_ref(),
            rpath.as_ref(),
        ];
        netns::run_command("mpicc", &library_args).context("compiling the PMPI library")?;
        let check_args: [&std::ffi::OsStr; 6] = [
            "-O2".as_ref(),
            "-Wall".as_ref(),
            "-o".as_ref(),
            built.check.as_os_str(),
            check_source.as_os_str(),
            "-lm".as_ref(),
        ];
        netns::run_command("mpicc", &check_args).context("compiling the MPI check program")?;
        Ok(built)
    }
}

impl Drop for Pmpi {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            log::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// How an [`MpiRun`] ended.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

/// A program running with one rank per worker namespace of a star, until
/// it ends or is stopped on drop ([`mpi::stop`]).
#[derive(Debug)]
pub struct MpiRun {
    child: Child,
    dir: PathBuf,
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl MpiRun {
    /// Starts `program` with `args` on `star`, with `env` exported to
    /// every rank.
    ///
    /// # Errors
    /// When files cannot be written or `mpirun` cannot start.
    pub fn start(
        star: &Star,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("xina-mpirun-{}", netns::unique_token()));
        let mut command = mpi::mpirun(star, &dir, env)?;
        command
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().context("starting mpirun")?;
        let out = child.stdout.take().context("mpirun's stdout")?;
        let err = child.stderr.take().context("mpirun's stderr")?;
        let (tx, lines) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let collected = Arc::clone(&stderr);
        let readers = vec![
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }),
            std::thread::spawn(move || collect(err, &collected)),
        ];
        Ok(Self {
            child,
            dir,
            lines,
            stdout: Vec::new(),
            stderr,
            readers,
        })
    }

    /// Waits for a line of standard output that starts with `prefix`.
    ///
    /// # Errors
    /// When the program ends first or `timeout` passes (with its stderr).
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push(line.clone());
                    if line.starts_with(prefix) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("no {prefix:?} within {timeout:?}: {}", self.stderr_text())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "the program ended before {prefix:?}: {}",
                        self.stderr_text()
                    )
                }
            }
        }
    }

    /// Waits for the program to end; its status and output.
    ///
    /// # Errors
    /// When it has not ended within `timeout` (it is then killed).
    pub fn wait(mut self, timeout: Duration) -> anyhow::Result<Ended> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                bail!(
                    "the MPI program did not end within {timeout:?}: {}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        self.stdout.extend(self.lines.try_iter());
        let stderr = self.stderr.lock().map(|l| l.clone()).unwrap_or_default();
        Ok(Ended {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr,
        })
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

impl Drop for MpiRun {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            mpi::stop(&mut self.child);
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            log::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

fn collect(pipe: impl Read, into: &Mutex<Vec<String>>) {
    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
        log::debug!("mpirun stderr: {line}");
        if let Ok(mut l) = into.lock() {
            l.push(line);
        }
    }
}

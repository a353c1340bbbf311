//! Named network namespaces as RAII guards, and the process-wide cleanup registry.
//!
//! A [`NetNs`] is a namespace created with `ip netns add` (so it is bound at
//! `/run/netns/NAME` and visible to `ip netns list`) and deleted with `ip netns del`
//! when the guard is dropped. Code runs inside it on a dedicated thread: the network
//! namespace is a per-thread attribute on Linux, so entering it on the caller's thread
//! would silently move every later socket of that thread too.
//!
//! Every namespace, and every veth end that sits in the root namespace while a
//! topology is being wired, is recorded in a registry. [`install_signal_cleanup`]
//! makes Ctrl-C / `SIGTERM` / `SIGHUP` delete everything recorded and exit with
//! status 130, so an interrupted demo leaves nothing behind. Creation and deletion
//! hold the registry lock around the `ip` command, so the handler never races with
//! a half-registered resource.
//!
//! Names shared across processes must be unique: [`unique_token`] gives a short
//! token built from the process id and a per-process counter.

use std::collections::BTreeSet;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::{self, JoinHandle};

/// Path of the iproute2 `ip` binary; `ip` from `PATH` is used when it is missing.
pub const IP_BIN: &str = "/usr/sbin/ip";

/// Directory where `ip netns add` binds named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Longest interface name Linux accepts (`IFNAMSIZ` - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// Exit status of the process after the signal handler cleaned up.
pub const SIGNAL_EXIT_STATUS: i32 = 130;

/// Errors of namespace management and of the commands it runs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command could not be started at all.
    #[error("`{command}`: cannot run: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not start.
        #[source]
        source: io::Error,
    },
    /// A command ran and exited with a failure status.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to standard error, trimmed.
        stderr: String,
    },
    /// A namespace name that `ip netns` would reject or misinterpret.
    #[error("invalid namespace name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The namespace file under [`NETNS_RUN_DIR`] could not be opened.
    #[error("namespace {name}: cannot open {}: {source}", path.display())]
    Open {
        /// Namespace name.
        name: String,
        /// The file that was opened.
        path: PathBuf,
        /// The error of `open`.
        #[source]
        source: io::Error,
    },
    /// `setns(CLONE_NEWNET)` failed.
    #[error("namespace {name}: cannot enter: {source}")]
    Enter {
        /// Namespace name.
        name: String,
        /// The error of `setns`.
        #[source]
        source: io::Error,
    },
    /// The thread that runs code inside the namespace could not be started.
    #[error("namespace {name}: cannot start a thread: {source}")]
    Thread {
        /// Namespace name.
        name: String,
        /// The error of the thread builder.
        #[source]
        source: io::Error,
    },
    /// The Ctrl-C / termination handler could not be installed.
    #[error("cannot install the signal cleanup handler: {source}")]
    Signal {
        /// The error of the `ctrlc` crate.
        #[source]
        source: ctrlc::Error,
    },
}

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

fn ip_program() -> &'static str {
    if Path::new(IP_BIN).exists() {
        IP_BIN
    } else {
        "ip"
    }
}

/// Renders a command line for messages, quoting arguments that contain spaces.
fn render<S: AsRef<OsStr>>(program: &str, args: &[S]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        let arg = arg.as_ref().to_string_lossy();
        line.push(' ');
        if arg.is_empty() || arg.contains(char::is_whitespace) {
            line.push('\'');
            line.push_str(&arg);
            line.push('\'');
        } else {
            line.push_str(&arg);
        }
    }
    line
}

/// Runs `program args...` to completion; returns its standard output.
///
/// Standard input is `/dev/null`. On a failure status the error holds the command
/// line and the trimmed standard error.
pub fn run_command<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<String, Error> {
    let command = render(program, args);
    log::debug!("{command}");
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::Failed {
            command,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `ip args...` and returns its standard output.
///
/// The child inherits the network namespace of the calling thread, so this acts on
/// the root namespace unless called from inside [`NetNs::run`]; prefer
/// `ip -n NAME ...` to act on a named namespace.
pub fn ip(args: &[&str]) -> Result<String, Error> {
    run_command(ip_program(), args)
}

// ---------------------------------------------------------------------------
// Unique names
// ---------------------------------------------------------------------------

fn push_base36(out: &mut String, mut value: u32, min_width: usize) {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut buf = Vec::new();
    while value > 0 || buf.len() < min_width.max(1) {
        buf.push(DIGITS[(value % 36) as usize]);
        value /= 36;
    }
    out.extend(buf.iter().rev().map(|&d| char::from(d)));
}

/// Returns a short token that no other call in any running process returns.
///
/// The token is the process id in base 36, zero-padded to 5 characters (Linux pids
/// are below 2^22 < 36^5), followed by a per-process counter in base 36: 6 characters
/// for the first 36 tokens of a process, 7 for the next 1260. Only lowercase ASCII
/// letters and digits are used, so it fits interface names.
pub fn unique_token() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut token = String::with_capacity(8);
    push_base36(&mut token, std::process::id(), 5);
    push_base36(&mut token, n, 1);
    token
}

// ---------------------------------------------------------------------------
// Cleanup registry
// ---------------------------------------------------------------------------

/// Something the signal handler must delete.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Resource {
    /// A veth end in the root namespace (deleting one end deletes the pair).
    RootLink(String),
    /// A named namespace.
    Namespace(String),
}

static REGISTRY: Mutex<BTreeSet<Resource>> = Mutex::new(BTreeSet::new());

fn registry() -> MutexGuard<'static, BTreeSet<Resource>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Deletes everything in `set`, links first, and empties it; returns the failures.
fn delete_all(set: &mut BTreeSet<Resource>) -> Vec<Error> {
    let mut errors = Vec::new();
    // `RootLink` sorts before `Namespace`, so links go first.
    for resource in std::mem::take(set) {
        let result = match &resource {
            Resource::RootLink(name) => match ip(&["link", "del", "dev", name]) {
                // The pair may already be gone with its other end.
                Err(Error::Failed { stderr, .. }) if stderr.contains("Cannot find device") => {
                    Ok(String::new())
                }
                other => other,
            },
            Resource::Namespace(name) => ip(&["netns", "del", name]),
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    errors
}

/// Deletes every namespace and root-namespace veth this process created and has not
/// deleted yet; returns the failures.
///
/// Guards dropped afterwards notice that their resource is gone and do nothing.
/// The signal handler of [`install_signal_cleanup`] calls this.
pub fn cleanup_all() -> Vec<Error> {
    delete_all(&mut registry())
}

/// Names of the namespaces this process created and has not deleted yet.
pub fn registered_namespaces() -> Vec<String> {
    registry()
        .iter()
        .filter_map(|r| match r {
            Resource::Namespace(name) => Some(name.clone()),
            Resource::RootLink(_) => None,
        })
        .collect()
}

/// Installs a Ctrl-C / `SIGTERM` / `SIGHUP` handler that deletes every registered
/// namespace and root-namespace veth, then exits with status 130
/// ([`SIGNAL_EXIT_STATUS`]).
///
/// Idempotent: later calls return `Ok` without touching the installed handler. Fails
/// if another handler was installed through the `ctrlc` crate.
pub fn install_signal_cleanup() -> Result<(), Error> {
    static INSTALLED: Mutex<bool> = Mutex::new(false);
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if *installed {
        return Ok(());
    }
    ctrlc::set_handler(|| {
        // Keep the lock until exit so no thread creates anything after the sweep.
        let mut set = registry();
        let count = set.len();
        for e in delete_all(&mut set) {
            eprintln!("xina-testbed: cleanup: {e}");
        }
        eprintln!("xina-testbed: interrupted, deleted {count} namespaces and links");
        std::process::exit(SIGNAL_EXIT_STATUS);
    })
    .map_err(|source| Error::Signal { source })?;
    *installed = true;
    Ok(())
}

/// A veth end in the root namespace, registered for cleanup until disarmed.
///
/// Dropping an armed guard deletes the link (and with it its peer).
#[derive(Debug)]
pub(crate) struct RootLink {
    name: String,
    armed: bool,
}

impl RootLink {
    /// Runs `ip args...`, which must create the link `name` in the root namespace,
    /// and registers it, both under the registry lock.
    pub(crate) fn create(name: &str, args: &[&str]) -> Result<Self, Error> {
        let mut set = registry();
        ip(args)?;
        set.insert(Resource::RootLink(name.to_owned()));
        Ok(Self {
            name: name.to_owned(),
            armed: true,
        })
    }

    /// Registers an existing root-namespace link (such as the peer of a new veth).
    pub(crate) fn adopt(name: &str) -> Self {
        registry().insert(Resource::RootLink(name.to_owned()));
        Self {
            name: name.to_owned(),
            armed: true,
        }
    }

    /// Moves the link into `ns` and disarms the guard: the namespace owns it now.
    pub(crate) fn move_to(mut self, ns: &NetNs) -> Result<(), Error> {
        let mut set = registry();
        ip(&["link", "set", "dev", &self.name, "netns", ns.name()])?;
        set.remove(&Resource::RootLink(self.name.clone()));
        self.armed = false;
        Ok(())
    }
}

impl Drop for RootLink {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut set = registry();
        if !set.remove(&Resource::RootLink(self.name.clone())) {
            return;
        }
        match ip(&["link", "del", "dev", &self.name]) {
            Ok(_) => {}
            Err(Error::Failed { stderr, .. }) if stderr.contains("Cannot find device") => {}
            Err(e) => log::warn!("cannot delete root-namespace link {}: {e}", self.name),
        }
    }
}

// ---------------------------------------------------------------------------
// Entering a namespace
// ---------------------------------------------------------------------------

/// Moves the calling thread into the network namespace `file` refers to.
fn enter(file: &File) -> io::Result<()> {
    // SAFETY: `file` is an open descriptor for the whole call; setns only reads it and
    // changes the network namespace of the calling thread, which is the dedicated
    // thread this module spawned for that purpose.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Returns the index of interface `name` in the calling thread's network namespace.
///
/// Call it inside [`NetNs::run`] to look up an interface of that namespace.
pub fn if_index(name: &str) -> io::Result<u32> {
    let c_name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c_name` is a NUL-terminated string that lives across the call;
    // if_nametoindex does not keep the pointer.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(index)
    }
}

// ---------------------------------------------------------------------------
// NetNs
// ---------------------------------------------------------------------------

/// A named network namespace, deleted when dropped.
///
/// Created with `ip netns add`, so it is visible to `ip netns list` and usable with
/// `ip -n NAME`. Dropping it runs `ip netns del`, which removes the name; the kernel
/// destroys the namespace (and the interfaces in it, including both ends of each
/// veth) once nothing refers to it: a thread from [`NetNs::spawn`] still running, or a
/// socket created inside, keeps it alive until it ends or is closed.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    armed: bool,
}

impl NetNs {
    /// Creates the namespace `name` with `ip netns add` and registers it for signal cleanup.
    ///
    /// Fails if the name is empty, longer than 200 bytes, contains `/` or NUL, is `.`
    /// or `..`, or if the namespace already exists.
    pub fn create(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        validate_name(&name)?;
        let mut set = registry();
        ip(&["netns", "add", &name])?;
        set.insert(Resource::Namespace(name.clone()));
        drop(set);
        log::debug!("created namespace {name}");
        Ok(Self { name, armed: true })
    }

    /// Creates a namespace called `PREFIX-TOKEN` with a fresh [`unique_token`].
    pub fn create_unique(prefix: &str) -> Result<Self, Error> {
        Self::create(format!("{prefix}-{}", unique_token()))
    }

    /// The namespace name, as used by `ip netns` and `ip -n`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file, `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.name)
    }

    fn open(&self) -> Result<File, Error> {
        let path = self.path();
        File::open(&path).map_err(|source| Error::Open {
            name: self.name.clone(),
            path,
            source,
        })
    }

    fn thread_builder(&self) -> thread::Builder {
        thread::Builder::new().name(format!("netns {}", self.name))
    }

    /// Runs `f` to completion on a new thread that has entered this namespace.
    ///
    /// Sockets and interface lookups made by `f` belong to the namespace; a socket
    /// created here stays in it when returned to the caller. Commands started by `f`
    /// inherit the namespace too. A panic in `f` is resumed on the caller's thread
    /// with the original payload.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        let file = self.open()?;
        thread::scope(|scope| {
            let handle = self
                .thread_builder()
                .spawn_scoped(scope, move || enter(&file).map(|()| f()))
                .map_err(|source| Error::Thread {
                    name: self.name.clone(),
                    source,
                })?;
            match handle.join() {
                Ok(result) => result.map_err(|source| Error::Enter {
                    name: self.name.clone(),
                    source,
                }),
                Err(payload) => std::panic::resume_unwind(payload),
            }
        })
    }

    /// Starts a long-lived thread that enters this namespace and then runs `f`.
    ///
    /// Returns once the thread is inside the namespace (or failed to enter it). The
    /// thread keeps the namespace alive after this guard is dropped, until it ends.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<JoinHandle<T>, Error> {
        let file = self.open()?;
        let (entered_tx, entered_rx) = mpsc::sync_channel(1);
        let handle = self
            .thread_builder()
            .spawn(move || {
                let entered = enter(&file);
                drop(file);
                let failed = entered.is_err();
                // The receiver waits for this message, so the send cannot fail.
                let _ = entered_tx.send(entered);
                if failed {
                    // End the thread without running `f` and without the panic hook's
                    // message; the error reaches the caller through the channel.
                    std::panic::resume_unwind(Box::new("setns failed"));
                }
                f()
            })
            .map_err(|source| Error::Thread {
                name: self.name.clone(),
                source,
            })?;
        let entered = entered_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("namespace thread ended before entering")));
        match entered {
            Ok(()) => Ok(handle),
            Err(source) => {
                // The thread has ended or is about to; its result carries nothing.
                let _ = handle.join();
                Err(Error::Enter {
                    name: self.name.clone(),
                    source,
                })
            }
        }
    }

    /// Runs `ip netns exec NAME args...` and returns its standard output.
    ///
    /// On failure the error holds the command line, exit status and standard error.
    pub fn exec<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String, Error> {
        let mut full: Vec<&OsStr> = vec![
            OsStr::new("netns"),
            OsStr::new("exec"),
            OsStr::new(&self.name),
        ];
        full.extend(args.iter().map(AsRef::as_ref));
        run_command(ip_program(), &full)
    }

    /// Runs `ip -n NAME args...` and returns its standard output.
    pub fn ip(&self, args: &[&str]) -> Result<String, Error> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Deletes the namespace now, reporting a failure that dropping would only log.
    pub fn delete(mut self) -> Result<(), Error> {
        self.armed = false;
        delete_namespace(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Err(e) = delete_namespace(&self.name) {
            log::warn!("{e}");
        }
    }
}

/// Deletes a registered namespace; a no-op if [`cleanup_all`] already did.
fn delete_namespace(name: &str) -> Result<(), Error> {
    let mut set = registry();
    if !set.remove(&Resource::Namespace(name.to_owned())) {
        return Ok(());
    }
    let result = ip(&["netns", "del", name]);
    drop(set);
    log::debug!("deleted namespace {name}");
    result.map(drop)
}

fn validate_name(name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > 200 {
        "longer than 200 bytes"
    } else if name.contains(['/', '\0']) {
        "contains '/' or NUL"
    } else if name == "." || name == ".." {
        "is '.' or '..'"
    } else if name.starts_with('-') || name.contains(char::is_whitespace) {
        "starts with '-' or contains whitespace"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_short() {
        let a = unique_token();
        let b = unique_token();
        assert_ne!(a, b);
        assert!(a.len() >= 6 && a.len() <= 8, "{a}");
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
        );
        let mut pid = String::new();
        push_base36(&mut pid, std::process::id(), 5);
        assert!(a.starts_with(&pid));
    }

    #[test]
    fn base36() {
        let mut s = String::new();
        push_base36(&mut s, 0, 1);
        push_base36(&mut s, 35, 1);
        push_base36(&mut s, 36, 3);
        push_base36(&mut s, 4_194_304, 5);
        assert_eq!(s, "0z0102hwcg");
    }

    #[test]
    fn names_are_validated() {
        for bad in ["", ".", "..", "a/b", "-x", "a b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name("xina-00abc1-sw").is_ok());
    }

    #[test]
    fn render_quotes_spaces() {
        assert_eq!(render("ip", &["a", "b c", ""]), "ip a 'b c' ''");
    }
}

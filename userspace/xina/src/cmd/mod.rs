//! One module per subcommand.

pub mod check;
pub mod daemon;
pub mod job;
pub mod p4;
pub mod run;
pub mod serve;
pub mod stats;
pub mod switch;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use xina::{config::Config, pin::PinDir};

/// Options every command takes.
#[derive(Debug, clap::Args)]
pub struct Global {
    /// The switch to act on: its pins are in a directory of this name under the pin root.
    #[arg(short, long, global = true, env = "XINA_SWITCH", default_value = xina::pin::DEFAULT_SWITCH)]
    pub switch: String,
    /// The bpffs directory holding the switches.
    #[arg(long, global = true, env = "XINA_PIN_ROOT", default_value = xina::pin::DEFAULT_ROOT)]
    pub pin_root: PathBuf,
    /// Run in this named network namespace (as `ip -n`), keeping this
    /// process's view of bpffs.
    #[arg(short = 'n', long, global = true, value_name = "NAME")]
    pub netns: Option<String>,
}

impl Global {
    pub fn pin_dir(&self) -> anyhow::Result<PinDir> {
        PinDir::new(&self.pin_root, &self.switch).map_err(|e| anyhow::anyhow!("--switch: {e}"))
    }

    /// Moves this process into `--netns`. Call before starting any thread.
    pub fn enter_netns(&self) -> anyhow::Result<()> {
        let Some(name) = &self.netns else {
            return Ok(());
        };
        let path = if name.contains('/') {
            PathBuf::from(name)
        } else {
            Path::new("/run/netns").join(name)
        };
        let file = std::fs::File::open(&path)
            .with_context(|| format!("--netns {name}: opening {}", path.display()))?;
        // SAFETY: setns on a namespace descriptor we own, before any other
        // thread exists, so the whole process moves.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("--netns {name}: entering"));
        }
        Ok(())
    }
}

/// Reads and checks a configuration file.
pub fn load_config(path: &Path) -> anyhow::Result<Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Config::parse(&text).with_context(|| format!("{}", path.display()))
}

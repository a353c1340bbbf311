//! One module per subcommand.

pub mod check;
pub mod p4;
pub mod run;

use std::path::Path;

use anyhow::Context as _;
use xina::config::Config;

/// Reads and checks a configuration file.
pub fn load_config(path: &Path) -> anyhow::Result<Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Config::parse(&text).with_context(|| format!("{}", path.display()))
}

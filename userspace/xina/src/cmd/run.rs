//! `xina run`: a switch in the foreground.

use std::path::PathBuf;

use anyhow::Context as _;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The switch configuration file (TOML).
    #[arg(short, long)]
    config: PathBuf,
    /// Also write the final counters as JSON to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = super::load_config(&args.config)?;
    let mut dp = xina::switch::start(&config).context("starting the switch")?;
    for port in dp.ports() {
        log::info!(
            "port {} (ifindex {}) attached, {:?} mode",
            port.name,
            port.ifindex,
            port.mode
        );
    }
    for job in dp.jobs() {
        log::info!(
            "job {} installed: {} ranks, slots {}..{}",
            job.id,
            job.members.len(),
            job.slot_base,
            job.slot_base + job.slot_count
        );
    }
    super::daemon::serve(dp.take_logger(), None)?;
    let counters = dp.counters()?;
    print!("{}", xina::stats::table(&counters, false));
    if let Some(path) = &args.stats_json {
        std::fs::write(path, serde_json::to_string_pretty(&counters.to_map())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    dp.detach_all();
    log::info!("detached");
    Ok(())
}

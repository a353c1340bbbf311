//! `xina run`: a switch in the foreground.

use std::{os::fd::AsRawFd as _, path::PathBuf};

use anyhow::Context as _;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

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
    let logger = dp.take_logger();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        if let Some(logger) = logger {
            log::debug!("reading dataplane logs from fd {}", logger.as_raw_fd());
            // SAFETY: the logger owns its ring buffer descriptor, which stays
            // open and unchanged until the logger (moved into the AsyncFd) drops.
            let mut fd =
                unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)?;
            tokio::spawn(async move {
                while let Ok(mut guard) = fd.readable_mut().await {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        let mut term = tokio::signal::unix::signal(SignalKind::terminate())?;
        log::info!("switch running; Ctrl-C or SIGTERM stops it");
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
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

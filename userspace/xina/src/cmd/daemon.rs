//! `xina daemon` (and `xina switch up --foreground`, `xina run`): a
//! long-running companion of a switch that forwards the dataplane's log
//! records to this process's log and serves metrics, until Ctrl-C or
//! SIGTERM. The switch does not depend on it: stopping or killing it
//! changes nothing in the dataplane.

use std::{net::SocketAddr, os::fd::AsRawFd as _};

use anyhow::Context as _;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};
use xina::{Dataplane, dataplane::Logger, pin::PinDir};

use super::Global;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also serve the counters to Prometheus on this address (`GET /metrics`).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// With `--metrics`: also series per job and group (frames, completed
    /// chunks, drops by reason).
    #[arg(long, requires = "metrics")]
    pub per_job: bool,
}

pub fn run(global: &Global, args: &Args) -> anyhow::Result<()> {
    let dir = global.pin_dir()?;
    let logger = Dataplane::open_logger(&dir).with_context(|| format!("switch {}", dir.name()))?;
    serve(Some(logger), args.metrics.map(|a| (a, dir, args.per_job)))
}

/// Forwards `logger`'s records (at their level, debug for the dataplane's)
/// and serves metrics of switch `dir` on `addr` (with per-job series if
/// asked), until Ctrl-C or SIGTERM.
pub fn serve(
    logger: Option<Logger>,
    metrics: Option<(SocketAddr, PinDir, bool)>,
) -> anyhow::Result<()> {
    if let Some((addr, dir, per_job)) = metrics {
        let listener = super::stats::listen(addr)?;
        std::thread::Builder::new()
            .name("xina-metrics".to_owned())
            .spawn(move || super::stats::serve_metrics(&listener, &dir, per_job))
            .context("starting the metrics thread")?;
    }
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
        log::info!("running; Ctrl-C or SIGTERM stops this process");
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })
}

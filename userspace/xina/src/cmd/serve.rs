//! `xina serve`: the job service of a pinned switch (see
//! [`xina::service`]), until Ctrl-C or SIGTERM; then every job it leased is
//! removed.

use std::{io::Write as _, path::PathBuf, sync::Arc};

use anyhow::Context as _;
use tokio::signal::unix::SignalKind;
use xina::service::{self, Service, ServiceConfig};

use super::Global;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The service file (TOML: `listen`, `switch_addr`, `lease_secs`, `job_ids`,
    /// [[hosts]], [[tenants]]).
    #[arg(short, long, value_name = "FILE")]
    pub config: PathBuf,
}

pub fn run(global: &Global, args: &Args) -> anyhow::Result<()> {
    let path = &args.config;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config = ServiceConfig::parse(&text).with_context(|| format!("{}", path.display()))?;
    let listen = config.file.listen;
    let dir = global.pin_dir()?;
    let (service, stale) = Service::new(config, dir.clone())
        .with_context(|| format!("{}: switch {}", path.display(), dir.name()))?;
    for id in stale {
        log::warn!(
            "removed job {id}: an earlier run of the service left it, with a lease unknown now"
        );
    }
    let service = Arc::new(service);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let removed = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        log::info!(
            "job service of switch {} on http://{addr}/{}",
            dir.name(),
            service::API
        );
        // For scripts that asked for port 0.
        println!("listening on {addr}");
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        anyhow::Ok(service::run(service, listener, stop).await?)
    })?;
    log::info!("stopped; removed {} leased jobs", removed.len());
    Ok(())
}

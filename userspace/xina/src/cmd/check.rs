//! `xina check`: validate a configuration file.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The switch configuration file (TOML).
    #[arg(short, long)]
    config: PathBuf,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = super::load_config(&args.config)?;
    println!(
        "{}: ok: {} ports, {} slots, {} jobs",
        args.config.display(),
        config.switch.ports.len(),
        config.switch.slot_pool,
        config.jobs.len()
    );
    for job in &config.jobs {
        println!(
            "  job {}: {} ranks, {} elements per packet, slots {}..{}",
            job.id,
            job.members.len(),
            job.elems_per_packet,
            job.slot_base,
            job.slot_base + job.slot_count
        );
    }
    Ok(())
}

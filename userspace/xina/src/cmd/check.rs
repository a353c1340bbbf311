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
        let slots = format!(
            "slots {}..{}",
            job.slot_base,
            job.slot_base + job.slot_count
        );
        let n = job.members.len();
        match (job.mode.is_group(), job.window()) {
            (false, _) => println!(
                "  job {}: {n} ranks, {} elements per packet, {slots}",
                job.id, job.elems_per_packet
            ),
            (true, Some(w)) => println!(
                "  job {}: {} group, {n} ranks, {} bytes per packet, window {w}, {slots}",
                job.id,
                job.mode.name(),
                job.elems_per_packet
            ),
            (true, None) => println!(
                "  job {}: {} group, {n} ranks, {} bytes per packet, no slots",
                job.id,
                job.mode.name(),
                job.elems_per_packet
            ),
        }
    }
    Ok(())
}

//! `xina job add|rm|ls|show`: jobs on a running switch.

use std::path::PathBuf;

use anyhow::Context as _;
use xina::{
    config::JobFile,
    control::{self, JobView},
};

use super::Global;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Install the job of a job file (TOML), allocating its slots; all or
    /// nothing.
    Add {
        /// The job file.
        file: PathBuf,
        /// Print the installed job as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a job: its slots return to the pool, its traffic is dropped
    /// (and counted as an unknown job).
    Rm {
        /// The job id.
        id: u32,
    },
    /// List the installed jobs.
    Ls {
        /// Print JSON: an array of jobs as `job show --json` prints them.
        #[arg(long)]
        json: bool,
    },
    /// Show one job with its members.
    Show {
        /// The job id.
        id: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(global: &Global, cmd: &Command) -> anyhow::Result<()> {
    let dir = global.pin_dir()?;
    let mut sw = control::open(&dir).with_context(|| format!("switch {}", dir.name()))?;
    match cmd {
        Command::Add { file, json } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let job = JobFile::parse(&text).with_context(|| file.display().to_string())?;
            let spec =
                control::add_job(&mut sw.dp, &job).with_context(|| file.display().to_string())?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&JobView::new(&sw.dp, &spec))?
                );
            } else {
                println!(
                    "job {} installed: {} ranks, slots {}..{}",
                    spec.id,
                    spec.members.len(),
                    spec.slot_base,
                    spec.slot_base + spec.slot_count
                );
            }
        }
        Command::Rm { id } => {
            let job = sw
                .dp
                .job(*id)
                .map(|j| (j.slot_base, j.slot_count))
                .with_context(|| format!("job {id} is not installed"))?;
            sw.dp.remove_job(*id)?;
            println!(
                "job {id} removed: slots {}..{} are free",
                job.0,
                job.0 + job.1
            );
        }
        Command::Ls { json } => {
            let views: Vec<JobView> = sw.dp.jobs().map(|j| JobView::new(&sw.dp, j)).collect();
            if *json {
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else {
                println!(
                    "{:>6}  {:<4}{:<5}{:<16}{:>6}{:>7}{:>14}",
                    "id", "op", "type", "mode", "ranks", "elems", "slots"
                );
                for v in views {
                    println!(
                        "{:>6}  {:<4}{:<5}{:<16}{:>6}{:>7}{:>14}",
                        v.id,
                        v.op,
                        v.dtype,
                        v.mode,
                        v.fan_in,
                        v.elems_per_packet,
                        format!("{}..{}", v.slot_base, v.slot_base + v.slot_count)
                    );
                }
            }
        }
        Command::Show { id, json } => {
            let job = sw
                .dp
                .job(*id)
                .with_context(|| format!("job {id} is not installed"))?;
            let v = JobView::new(&sw.dp, job);
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "job {}: {} {} {}, {} ranks, {} elements per packet, slots {}..{}",
                    v.id,
                    v.op,
                    v.dtype,
                    v.mode,
                    v.fan_in,
                    v.elems_per_packet,
                    v.slot_base,
                    v.slot_base + v.slot_count
                );
                println!(
                    "{:>5}  {:<16}{:>6}  {:<18}interface",
                    "rank", "ip", "port", "mac"
                );
                for m in &v.members {
                    println!(
                        "{:>5}  {:<16}{:>6}  {:<18}{}",
                        m.rank, m.ip, m.port, m.mac, m.interface
                    );
                }
            }
        }
    }
    Ok(())
}

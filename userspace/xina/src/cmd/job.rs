//! `xina job add|rm|ls|show|down|up`: jobs and groups on a running switch.

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
    /// Mark a member of an anycast group down: it receives nothing new
    /// until `job up`.
    Down {
        /// The group's id.
        id: u32,
        /// The member's rank.
        rank: u8,
    },
    /// Mark a member of an anycast group up again: it receives again.
    Up {
        /// The group's id.
        id: u32,
        /// The member's rank.
        rank: u8,
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
                let kind = if spec.mode.is_group() {
                    format!("{} group, ", spec.mode.name())
                } else {
                    String::new()
                };
                let slots = if spec.slot_count == 0 {
                    "no slots".to_owned()
                } else {
                    format!(
                        "slots {}..{}",
                        spec.slot_base,
                        spec.slot_base + spec.slot_count
                    )
                };
                println!(
                    "job {} installed: {kind}{} ranks, {slots}",
                    spec.id,
                    spec.members.len(),
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
            if job.1 == 0 {
                println!("job {id} removed (it had no slots)");
            } else {
                println!(
                    "job {id} removed: slots {}..{} are free",
                    job.0,
                    job.0 + job.1
                );
            }
        }
        Command::Ls { json } => {
            let views: Vec<JobView> = sw.dp.jobs().map(|j| JobView::new(&sw.dp, j)).collect();
            if *json {
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else {
                println!(
                    "{:>6}  {:<4}{:<6}{:<16}{:>6}{:>7}{:>8}{:>14}{:>6}",
                    "id", "op", "type", "mode", "ranks", "elems", "window", "slots", "down"
                );
                for v in views {
                    let down = v.members.iter().filter(|m| m.down).count();
                    println!(
                        "{:>6}  {:<4}{:<6}{:<16}{:>6}{:>7}{:>8}{:>14}{:>6}",
                        v.id,
                        if v.bytes_per_packet.is_some() {
                            "-"
                        } else {
                            v.op
                        },
                        v.dtype,
                        v.mode,
                        v.fan_in,
                        v.elems_per_packet,
                        v.window.map_or_else(|| "-".to_owned(), |w| w.to_string()),
                        format!("{}..{}", v.slot_base, v.slot_base + v.slot_count),
                        down
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
                let slots = format!("slots {}..{}", v.slot_base, v.slot_base + v.slot_count);
                match (v.bytes_per_packet, v.window) {
                    (None, _) => println!(
                        "job {}: {} {} {}, {} ranks, {} elements per packet, {slots}",
                        v.id, v.op, v.dtype, v.mode, v.fan_in, v.elems_per_packet
                    ),
                    (Some(bytes), Some(w)) => println!(
                        "job {}: {} group, {} ranks, {bytes} bytes per packet, window {w}, {slots}",
                        v.id, v.mode, v.fan_in
                    ),
                    (Some(bytes), None) => println!(
                        "job {}: {} group, {} ranks, {bytes} bytes per packet, no slots",
                        v.id, v.mode, v.fan_in
                    ),
                }
                println!(
                    "{:>5}  {:<16}{:>6}  {:<18}{:<16}{:>10}  flags",
                    "rank", "ip", "port", "mac", "interface", "copies"
                );
                for m in &v.members {
                    let flags: Vec<&str> = [(m.sender, "sender"), (m.down, "down")]
                        .into_iter()
                        .filter_map(|(on, name)| on.then_some(name))
                        .collect();
                    println!(
                        "{:>5}  {:<16}{:>6}  {:<18}{:<16}{:>10}  {}",
                        m.rank,
                        m.ip,
                        m.port,
                        m.mac,
                        m.interface,
                        m.copies.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                        if flags.is_empty() {
                            "-".to_owned()
                        } else {
                            flags.join(",")
                        }
                    );
                }
            }
        }
        Command::Down { id, rank } | Command::Up { id, rank } => {
            let down = matches!(cmd, Command::Down { .. });
            let changed = control::set_member_down(&mut sw.dp, *id, *rank, down)?;
            let state = if down { "down" } else { "up" };
            if changed {
                println!("job {id} rank {rank} is {state}");
            } else {
                println!("job {id} rank {rank} was already {state}");
            }
        }
    }
    Ok(())
}

//! `xina switch up|down|status`: a pinned switch's life cycle.

use std::path::PathBuf;

use anyhow::Context as _;
use xina::{config::XdpModeName, control, pin};

use super::Global;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Attach the dataplane to the configured ports, install the file's
    /// jobs, pin everything and return: the switch runs on without any process.
    Up(UpArgs),
    /// Detach from every port and remove every pin of the switch.
    Down,
    /// Replace the running switch's programs with this build's, keeping
    /// every map: jobs, slots with chunks in flight, and counters stay (see
    /// the README's notes on upgrades).
    Upgrade {
        /// Load the new programs with dataplane logging on (slow).
        #[arg(long)]
        debug: bool,
    },
    /// Load the whole dataplane as `up` would (same map sizes and globals),
    /// attach nothing, and print each program's verified instructions
    /// against the verifier's budget. Fails when a program is refused or
    /// uses more than a quarter of the budget.
    Check(CheckArgs),
    /// List the switches pinned under the pin root, with their ports.
    Ls {
        /// Print JSON: an array of `{"name", "pin_dir", "ports"}`.
        #[arg(long)]
        json: bool,
    },
    /// Show what is attached where (with link and program ids), the slot
    /// pool and the installed jobs.
    Status {
        /// Print JSON (fields documented in the README).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// The switch configuration file (TOML).
    #[arg(short, long)]
    config: PathBuf,
    /// Force native (driver) or generic (skb) XDP instead of the file's
    /// `xdp_mode` (default auto: native where the driver supports it).
    #[arg(long, value_enum)]
    xdp_mode: Option<Mode>,
    /// Stay in the foreground afterwards, as `xina daemon` does: forward
    /// dataplane logs, serve --metrics; Ctrl-C or SIGTERM leaves the switch up.
    #[arg(long)]
    foreground: bool,
    #[command(flatten)]
    daemon: super::daemon::Args,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// A switch configuration file to load as `up` would (its slot pool,
    /// units and debug setting); the defaults without one.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Print JSON: `{"kernel", "budget", "margin", "programs": [{"name",
    /// "insns", "load_time"}]}` (load time in microseconds).
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Mode {
    Auto,
    Native,
    Generic,
}

/// One line of `xina switch ls`.
#[derive(Debug, serde::Serialize)]
struct Listed {
    name: String,
    pin_dir: String,
    /// Port names, from the link pins.
    ports: Vec<String>,
}

pub fn run(global: &Global, cmd: &Command) -> anyhow::Result<()> {
    if let Command::Check(args) = cmd {
        return check(args);
    }
    if let Command::Ls { json } = cmd {
        let dirs = pin::PinDir::list(&global.pin_root)
            .with_context(|| format!("reading {}", global.pin_root.display()))?;
        let listed: Vec<Listed> = dirs
            .iter()
            .map(|d| Listed {
                name: d.name().to_owned(),
                pin_dir: d.path().display().to_string(),
                ports: d
                    .link_pins()
                    .map(|l| l.into_iter().map(|l| l.ifname).collect())
                    .unwrap_or_default(),
            })
            .collect();
        if *json {
            println!("{}", serde_json::to_string_pretty(&listed)?);
        } else {
            for l in &listed {
                println!("{:<24}{}", l.name, l.ports.join(", "));
            }
        }
        return Ok(());
    }
    let dir = global.pin_dir()?;
    match cmd {
        Command::Up(args) => {
            let config = super::load_config(&args.config)?;
            let mode = args.xdp_mode.map(|m| match m {
                Mode::Auto => XdpModeName::Auto,
                Mode::Native => XdpModeName::Native,
                Mode::Generic => XdpModeName::Generic,
            });
            let mut dp = control::up(&config, &dir, mode)
                .with_context(|| format!("switch {}", dir.name()))?;
            for p in dp.ports() {
                println!(
                    "port {} (ifindex {}) attached, {} XDP",
                    p.name,
                    p.ifindex,
                    pin::mode_name(p.mode)
                );
            }
            for j in dp.jobs() {
                println!(
                    "job {} installed: {} ranks, slots {}..{}",
                    j.id,
                    j.members.len(),
                    j.slot_base,
                    j.slot_base + j.slot_count
                );
            }
            println!(
                "switch {} is up, pinned at {}",
                dir.name(),
                dir.path().display()
            );
            if args.foreground || args.daemon.metrics.is_some() {
                use std::io::Write as _;
                std::io::stdout().flush()?;
                let metrics = args
                    .daemon
                    .metrics
                    .map(|a| (a, dir.clone(), args.daemon.per_job));
                super::daemon::serve(dp.take_logger(), metrics)?;
            }
            Ok(())
        }
        Command::Down => {
            let removed = control::down(&dir).with_context(|| format!("switch {}", dir.name()))?;
            println!(
                "switch {} is down: detached from {}",
                dir.name(),
                if removed.links.is_empty() {
                    "no port".to_owned()
                } else {
                    removed.links.join(", ")
                }
            );
            Ok(())
        }
        Command::Upgrade { debug } => {
            let _lock = dir.lock().with_context(|| {
                format!("switch {}: locking {}", dir.name(), dir.path().display())
            })?;
            let up = xina::Dataplane::upgrade(&dir, *debug)
                .with_context(|| format!("switch {}: upgrade", dir.name()))?;
            for (name, new) in &up.after {
                let old = up
                    .before
                    .get(name)
                    .map_or_else(|| "-".to_owned(), u32::to_string);
                println!("program {name}: id {old} -> {new}");
            }
            println!(
                "switch {} upgraded; ports now on the new program: {}",
                dir.name(),
                up.ports.join(", ")
            );
            Ok(())
        }
        Command::Ls { .. } | Command::Check(_) => unreachable!("handled above"),
        Command::Status { json } => {
            let sw = control::open(&dir).with_context(|| format!("switch {}", dir.name()))?;
            let status = control::status(&sw.dp, &dir);
            if *json {
                println!("{}", serde_json::to_string_pretty(&status)?);
                return Ok(());
            }
            println!("switch {} ({})", status.name, status.pin_dir);
            println!(
                "slots: {} of {} allocated; jobs: {}",
                status.slots_used,
                status.slot_pool,
                if status.jobs.is_empty() {
                    "none".to_owned()
                } else {
                    status
                        .jobs
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
            for (name, id) in &status.programs {
                println!("program {name}: id {id}");
            }
            println!(
                "{:<16}{:>8}{:>7}{:>9}{:>9}{:>9}",
                "port", "ifindex", "index", "mode", "link", "prog"
            );
            let id = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            for p in &status.ports {
                println!(
                    "{:<16}{:>8}{:>7}{:>9}{:>9}{:>9}",
                    p.name,
                    p.ifindex,
                    p.index,
                    p.mode,
                    id(p.link_id),
                    id(p.prog_id)
                );
            }
            Ok(())
        }
    }
}

/// `xina switch check`.
fn check(args: &CheckArgs) -> anyhow::Result<()> {
    let opts = match &args.config {
        Some(path) => xina::switch::load_options(&super::load_config(path)?),
        None => xina::LoadOptions::default(),
    };
    let dp = xina::Dataplane::load(opts).context("loading the dataplane")?;
    let report = dp.verification();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    let over: Vec<String> = report
        .over_margin()
        .map(|p| format!("{} ({})", p.name, p.insns.unwrap_or_default()))
        .collect();
    if !over.is_empty() {
        anyhow::bail!(
            "a quarter of the verifier's budget of {} instructions exceeded by {}: a kernel \
             whose verifier explores more states may refuse them",
            xina::verifier::BUDGET,
            over.join(", ")
        );
    }
    Ok(())
}

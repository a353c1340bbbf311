//! `xina-testbed`: demos and scenarios on network-namespace topologies.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use xina_testbed::{netns, scenario};

#[derive(Debug, Parser)]
#[command(version, about = "xina on network namespaces: demos and scenarios")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a star (one XDP switch, N workers), allreduce random int32
    /// vectors through the switch, check the result, print a table, clean up.
    Demo(DemoArgs),
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Number of workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Elements (int32) per worker.
    #[arg(long, default_value_t = 4_000_000)]
    elements: usize,
    /// Elements per packet (1..=256).
    #[arg(long, default_value_t = 256)]
    elems_per_packet: u16,
    /// Aggregator slots of the job (the workers' window of chunks in flight).
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Seed of the random data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds a worker waits without progress before giving up.
    #[arg(long, default_value_t = 5.0)]
    give_up: f64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print the generated switch configuration.
    #[arg(long)]
    show_config: bool,
}

fn demo(args: &DemoArgs) -> anyhow::Result<bool> {
    let spec = scenario::AllreduceSpec {
        workers: args.workers,
        elements: args.elements,
        elems_per_packet: args.elems_per_packet,
        slots: args.slots,
        seed: args.seed,
        give_up: Duration::try_from_secs_f64(args.give_up).context("--give-up")?,
        absent: Vec::new(),
    };
    println!(
        "xina demo: {} workers allreduce {} int32 each through an XDP switch ({} elements/packet, {} slots)\n",
        spec.workers, spec.elements, spec.elems_per_packet, spec.slots
    );
    let report = scenario::run_allreduce(&spec)?;
    if args.show_config {
        println!("switch configuration:\n{}", report.config);
    }
    print!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nreport written to {}", path.display());
    }
    Ok(report.all_correct() && report.switch_accounting_error().is_none())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    if let Err(e) = netns::install_signal_cleanup() {
        eprintln!("xina-testbed: {e}");
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Command::Demo(args) => demo(args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("xina-testbed: the allreduce was not exact or not made in the switch");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("xina-testbed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

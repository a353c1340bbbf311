//! `xina`: the switch control plane command.

mod cmd;

use clap::{Parser, Subcommand};

/// xina: in-network aggregation on Linux hosts with XDP.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Attach the dataplane to the configured ports, install the jobs, and
    /// run until interrupted; then print the counters and detach.
    Run(cmd::run::Args),
    /// Check a configuration file without touching the dataplane.
    Check(cmd::check::Args),
    /// The P4 twin: control-plane state for a configuration, test vectors.
    #[command(subcommand)]
    P4(cmd::p4::Command),
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(&args),
        Command::Check(args) => cmd::check::run(&args),
        Command::P4(c) => cmd::p4::run(&c),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xina: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

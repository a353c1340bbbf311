//! `xina`: the switch control plane command.

mod cmd;

use clap::{Parser, Subcommand};

/// xina: in-network aggregation on Linux hosts with XDP.
///
/// A switch is brought up once (`xina switch up`) and then lives in the
/// kernel, pinned in bpffs: every other command opens it from its pins.
/// Logs go to standard error (more with the environment variable `RUST_LOG=debug`).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    global: cmd::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring a pinned switch up or down, or show its status.
    #[command(subcommand)]
    Switch(cmd::switch::Command),
    /// Add, remove, list and show jobs and groups; take anycast members down and up.
    #[command(subcommand)]
    Job(cmd::job::Command),
    /// Print per-job, per-port and switch counters (summed over CPUs).
    Stats(cmd::stats::Args),
    /// Serve the counters to Prometheus (`GET /metrics`).
    Exporter(cmd::stats::ExporterArgs),
    /// Forward a running switch's dataplane logs, and serve --metrics.
    ///
    /// Stays in the foreground until Ctrl-C or SIGTERM. Dataplane records
    /// exist only when the switch runs with `debug = true`, and show at
    /// debug level (`RUST_LOG=debug`). Stopping it leaves the switch as it is.
    Daemon(cmd::daemon::Args),
    /// Serve jobs on request: the job service of a pinned switch.
    ///
    /// Tenants (their tokens in the service file) create, renew and remove
    /// jobs and groups over an HTTP JSON API, within quotas; a job whose
    /// lease is not renewed is removed. Run it in the switch's namespace
    /// (`-n`). Stops on Ctrl-C or SIGTERM, removing every job it leased.
    Serve(cmd::serve::Args),
    /// Run an unpinned switch in the foreground (for tries and tests).
    ///
    /// Attaches the dataplane to the configured ports, installs the jobs,
    /// runs until interrupted, then prints the counters and detaches.
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
    let result = cli.global.enter_netns().and_then(|()| match &cli.command {
        Command::Switch(c) => cmd::switch::run(&cli.global, c),
        Command::Job(c) => cmd::job::run(&cli.global, c),
        Command::Stats(a) => cmd::stats::run(&cli.global, a),
        Command::Exporter(a) => cmd::stats::exporter(&cli.global, a),
        Command::Daemon(a) => cmd::daemon::run(&cli.global, a),
        Command::Serve(a) => cmd::serve::run(&cli.global, a),
        Command::Run(args) => cmd::run::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::P4(c) => cmd::p4::run(c),
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xina: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! `xina-testbed`: demos and scenarios on network-namespace topologies.

use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use xina_testbed::{
    allreduce_bench, bcast_bench, bench, lossy, mpi_bench, netns, plot, scenario, share_bench,
};

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
    /// Benchmarks (see the subcommands).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// One worker of a scenario, as its own process (the scenarios run it in
    /// a worker namespace to kill it mid-call); prints its stats.
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// One member of a multicast group receiving one broadcast, as its own
    /// process (the group scenarios kill it mid-call).
    #[command(hide = true)]
    GroupMember(GroupMemberArgs),
}

#[derive(Debug, clap::Args)]
struct GroupMemberArgs {
    #[arg(long)]
    rank: u8,
    #[arg(long)]
    fan_in: u8,
    #[arg(long)]
    bytes_per_packet: u16,
    #[arg(long)]
    window: u32,
    /// The broadcast's root.
    #[arg(long)]
    root: u8,
    /// The broadcast's length in bytes.
    #[arg(long)]
    len: usize,
    /// The switch's xina address.
    #[arg(long)]
    switch: std::net::SocketAddrV4,
    /// The address to bind (the one the switch knows this rank by).
    #[arg(long)]
    bind: std::net::SocketAddrV4,
}

fn group_member(args: &GroupMemberArgs) -> anyhow::Result<bool> {
    let params = xina_host::GroupParams {
        group: xina_testbed::group::GROUP_ID,
        rank: args.rank,
        fan_in: args.fan_in,
        bytes_per_packet: args.bytes_per_packet,
        window: args.window,
        switch: args.switch,
    };
    let mut member = xina_host::GroupWorker::new(params, args.bind, xina_host::Config::default())?;
    let mut buf = vec![0; args.len];
    // Whoever started this process waits for this line.
    println!("ready");
    std::io::stdout().flush()?;
    let stats = member.broadcast(args.root, &mut buf)?;
    // Whoever started this process may have stopped listening.
    let _ = writeln!(std::io::stdout(), "rank {}: {stats}", args.rank);
    Ok(true)
}

#[derive(Debug, clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    rank: usize,
    #[arg(long)]
    workers: usize,
    #[arg(long)]
    elements: usize,
    #[arg(long)]
    elems_per_packet: u16,
    #[arg(long)]
    slots: u32,
    #[arg(long)]
    seed: u64,
    #[arg(long = "type", value_enum, default_value_t = scenario::ElementType::Int32)]
    dtype: scenario::ElementType,
    /// The switch's xina address.
    #[arg(long)]
    switch: std::net::SocketAddrV4,
    /// The address to bind (the one the switch knows this rank by).
    #[arg(long)]
    bind: std::net::SocketAddrV4,
}

fn worker(args: &WorkerArgs) -> anyhow::Result<bool> {
    let spec = scenario::AllreduceSpec {
        workers: args.workers,
        elements: args.elements,
        elems_per_packet: args.elems_per_packet,
        slots: args.slots,
        seed: args.seed,
        dtype: args.dtype,
        ..Default::default()
    };
    let mut worker = xina_host::Worker::new(
        spec.params(args.rank, args.switch),
        args.bind,
        spec.config(),
    )?;
    let ready = || {
        // Whoever started this process waits for this line.
        println!("ready");
        std::io::Write::flush(&mut std::io::stdout())
    };
    let stats = match args.dtype {
        scenario::ElementType::Int32 => {
            let mut data = scenario::worker_data(args.seed, args.rank, args.elements);
            ready()?;
            worker.allreduce(&mut data)?
        }
        scenario::ElementType::Float32 => {
            let mut data = scenario::worker_floats(args.seed, args.rank, args.elements);
            ready()?;
            worker.allreduce(&mut data)?
        }
    };
    // Whoever started this process may have stopped listening.
    let _ = writeln!(std::io::stdout(), "rank {}: {stats}", args.rank);
    Ok(true)
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// What one packet costs the switch in the kernel, per path through the
    /// slot state machine, against a drop-only baseline (kernel test runs
    /// over streams of distinct frames; medians over rounds); then the
    /// packets per second real senders get through it in namespaces.
    Switch(BenchSwitchArgs),
    /// Allreduce through the XDP switch against a host-based ring allreduce
    /// over TCP and Open MPI (when installed), both on a plain star of the
    /// same namespaces and links without XDP, for each worker count and
    /// size, in nccl-tests' columns, with the ratios between them.
    Allreduce(BenchAllreduceArgs),
    /// Broadcast: xina's through the XDP switch; root-to-all unicast over
    /// TCP, a pipelined binomial tree over TCP, one root-to-one TCP transfer
    /// (the bound a network multicast could reach) and Open MPI (when
    /// installed) on a plain star of the same namespaces and links without
    /// XDP; for each rank count, size and loss rate, with ratios against
    /// unicast and Open MPI.
    Bcast(BenchBcastArgs),
    /// Jobs sharing one switch and every worker link: each job's goodput
    /// until the first finished and Jain's index of them, with xina's
    /// congestion control and, in the same run, with every slot open.
    Share(BenchShareArgs),
    /// One MPI benchmark program with Open MPI's own collectives (plain
    /// star) and through xina's PMPI library (XDP star, jobs from a job
    /// service), interleaved: OSU-style columns.
    Mpi(BenchMpiArgs),
}

#[derive(Debug, clap::Args)]
struct BenchShareArgs {
    /// Jobs, each with a member on every worker.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// Workers (namespaces).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Link MTU.
    #[arg(long, default_value_t = 9000)]
    frame: u32,
    /// Shape every worker link to this many Mbit/s both ways; 0: unshaped.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Bytes per worker per allreduce (units B, KiB, MiB).
    #[arg(long, default_value = "4MiB")]
    bytes: String,
    /// Allreduces per job.
    #[arg(long, default_value_t = 24)]
    calls: usize,
    /// Let one rank of the last job never call: its job fails after the
    /// give-up time, the others must not slow down.
    #[arg(long)]
    stall: bool,
    /// Also write the reports as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn bench_share(args: &BenchShareArgs) -> anyhow::Result<bool> {
    let base = share_bench::ShareSpec {
        jobs: args.jobs,
        workers: args.workers,
        frame: args.frame,
        rate_mbit: (args.rate > 0).then_some(args.rate),
        bytes: allreduce_bench::parse_size(&args.bytes).context("--bytes")?,
        calls: args.calls,
        stall: args.stall.then_some(args.jobs - 1),
        ..Default::default()
    };
    base.validate()?;
    let machine = bench::Machine::this();
    println!(
        "xina bench share: {} jobs of {} workers on one star, MTU {}, {}, {} allreduces of {} \
         each; {} CPUs, Linux {}",
        base.jobs,
        base.workers,
        base.frame,
        base.rate_mbit.map_or_else(
            || "links unshaped".to_owned(),
            |r| format!("every link {r} Mbit/s each way")
        ),
        base.calls,
        args.bytes,
        machine.cpus,
        machine.kernel
    );
    let mut reports = Vec::new();
    for queue_target in [base.queue_target, None] {
        let spec = share_bench::ShareSpec {
            queue_target,
            ..base.clone()
        };
        let report = share_bench::run(&spec)?;
        println!(
            "\n{} ({} elements/packet, {} slots per job):",
            if queue_target.is_none() {
                "every slot open (no congestion control)"
            } else {
                "congestion control (the default)"
            },
            report.elems_per_packet,
            report.slots
        );
        print!("{}", share_bench::table(&report));
        reports.push(report);
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({ "machine": machine, "reports": reports }),
        )?;
    }
    Ok(true)
}

#[derive(Debug, clap::Args)]
struct BenchBcastArgs {
    /// Rank counts (one star each).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8])]
    ranks: Vec<usize>,
    /// Buffer sizes: a list such as `4B,64KiB,1MiB,64MiB` (units B, KiB,
    /// MiB, GiB), or `MIN..MAX` stepping by `--factor`.
    #[arg(long, default_value = "4B,64KiB,1MiB,64MiB")]
    sizes: String,
    /// Each size is the previous one times this (with `MIN..MAX`).
    #[arg(long, default_value_t = 2)]
    factor: usize,
    /// Repetitions per size and implementation, after a warm-up (sizes
    /// below 1 MiB run several broadcasts per repetition).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Loss rates in percent of all frames on every worker link, both
    /// directions; e.g. `0,1`.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0f64])]
    loss: Vec<f64>,
    /// Implementations, in table order.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = bcast_bench::Impl::ALL)]
    impls: Vec<bcast_bench::Impl>,
    /// Seconds a rank waits for a peer that does not move before failing.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Also write the spec, goals and one record per measurement as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Each goal with its verdict.
fn print_goals(goals: &[bcast_bench::Goal]) {
    println!("goals:");
    for g in goals {
        let verdict = match (g.met, g.value) {
            (Some(met), Some(v)) => format!(
                "{}: {v:.2} (needs {} {})",
                if met { "MET" } else { "NOT MET" },
                if g.at_least { ">=" } else { "<=" },
                g.bound
            ),
            _ => "not judged".to_owned(),
        };
        println!("  {}\n    => {verdict}; {}", g.statement, g.detail);
    }
}

fn bench_bcast(args: &BenchBcastArgs) -> anyhow::Result<bool> {
    let spec = bcast_bench::BcastBenchSpec {
        ranks: args.ranks.clone(),
        sizes: allreduce_bench::parse_size_range(&args.sizes, args.factor).context("--sizes")?,
        reps: args.reps,
        losses: args.loss.clone(),
        impls: args.impls.clone(),
        timeout: Duration::try_from_secs_f64(args.timeout).context("--timeout")?,
        ..Default::default()
    };
    spec.validate()?;
    let machine = bench::Machine::this();
    println!(
        "xina bench bcast: {} (xina through the XDP switch, the others on a plain star), \
         {} CPUs, Linux {}",
        spec.impls
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", "),
        machine.cpus,
        machine.kernel
    );
    println!(
        "median over {} repetitions (x broadcasts per repetition below 1 MiB) after a warm-up, \
         interleaved, roots rotating; every receiver checked byte for byte\n",
        spec.reps
    );
    let records = bcast_bench::run(&spec, |line| eprintln!("  {line}"))?;
    for &loss in &spec.losses {
        for &ranks in &spec.ranks {
            println!("{ranks} ranks, loss {loss}%:");
            println!("{}", bcast_bench::table(&records, ranks, loss));
        }
    }
    println!(
        "time: per broadcast, first rank out of the barrier to the slowest receiver's last byte \
         (xina: its broadcast call's return); algbw = size/time (GB/s = 1e9 B/s; busbw = \
         algbw);\nretx: TCP retransmitted segments (xina: chunks the roots sent again; mpi: \
         the plain star's namespace counters) summed over ranks and broadcasts; x mpi, \
         x unicast = their time / time (algbw relative to theirs in the same run);\nunicast: \
         root sends to every rank, concurrently; tree: binomial, pipelined forwarding; once: \
         root to one rank (the multicast bound); mpi: Open MPI's MPI_Bcast over TCP; xina: \
         reliable broadcast through a multicast group on the XDP switch\n"
    );
    let goals = bcast_bench::judge_goals(&records);
    print_goals(&goals);
    if let Some(path) = &args.json {
        let report = bcast_bench::BcastBenchReport {
            machine,
            spec,
            goals,
            records,
        };
        write_json(path, &report)?;
    }
    Ok(true)
}

#[derive(Debug, clap::Args)]
struct BenchMpiArgs {
    /// Rank counts (two stars each).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8])]
    ranks: Vec<usize>,
    /// Sizes per rank: a list such as `4B,64KiB,64MiB`, or `MIN..MAX`
    /// stepping by `--factor`.
    #[arg(long, default_value = "8B..64MiB")]
    sizes: String,
    /// Each size is the previous one times this (with `MIN..MAX`).
    #[arg(long, default_value_t = 16)]
    factor: usize,
    /// Collectives, in table order.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [mpi_bench::Coll::Allreduce, mpi_bench::Coll::Bcast])]
    colls: Vec<mpi_bench::Coll>,
    /// MTU of every link of both stars (xina's jobs take the most elements
    /// per packet it allows).
    #[arg(long, default_value_t = 65_000)]
    frame: u32,
    /// Repetitions per size and implementation, interleaved.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where `libxina_c.so` is (default: where cargo built it with this
    /// program, `deps/` beside it).
    #[arg(long)]
    lib_dir: Option<PathBuf>,
    /// Also write the spec, goals and one record per measurement as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn bench_mpi(args: &BenchMpiArgs) -> anyhow::Result<bool> {
    let spec = mpi_bench::MpiBenchSpec {
        ranks: args.ranks.clone(),
        sizes: allreduce_bench::parse_size_range(&args.sizes, args.factor).context("--sizes")?,
        colls: args.colls.clone(),
        frame: args.frame,
        reps: args.reps,
    };
    spec.validate()?;
    let lib_dir = match &args.lib_dir {
        Some(d) => d.clone(),
        None => {
            let exe = std::env::current_exe().context("finding this program")?;
            let dir = exe
                .parent()
                .context("this program's directory")?
                .to_path_buf();
            // Cargo rebuilds the one in deps/ with this program (its
            // dependency), the one beside it only with `-p xina-c`.
            if dir.join("deps/libxina_c.so").exists() {
                dir.join("deps")
            } else {
                dir
            }
        }
    };
    anyhow::ensure!(
        lib_dir.join("libxina_c.so").exists(),
        "--lib-dir: no libxina_c.so in {} (cargo build --release -p xina-c)",
        lib_dir.display()
    );
    let machine = bench::Machine::this();
    println!(
        "xina bench mpi: one MPI program, Open MPI's own collectives (plain star) and through \
         xina's PMPI library (XDP switch), MTU {}, {} CPUs, Linux {}",
        spec.frame, machine.cpus, machine.kernel
    );
    println!(
        "{} repetitions per size and implementation, interleaved; every result checked\n",
        spec.reps
    );
    let records = mpi_bench::run(&spec, &lib_dir, |line| eprintln!("  {line}"))?;
    for &coll in &spec.colls {
        for &ranks in &spec.ranks {
            println!(
                "{}, {ranks} ranks:",
                match coll {
                    mpi_bench::Coll::Allreduce => "MPI_Allreduce (int32 sum)",
                    mpi_bench::Coll::Bcast => "MPI_Bcast (bytes)",
                }
            );
            println!("{}", mpi_bench::table(&records, coll, ranks));
        }
    }
    println!(
        "latency: allreduce, per call averaged over back-to-back calls (first rank out of a \
         barrier to the last rank done); bcast, per call to the slowest receiver, roots \
         rotating; avg/min/max over the samples; GB/s = size / avg latency (1e9 B/s); \
         x mpi = Open MPI's avg / xina's\n"
    );
    let goals = mpi_bench::judge_goals(&records);
    print_goals(&goals);
    if let Some(path) = &args.json {
        let report = mpi_bench::MpiBenchReport {
            machine,
            spec,
            goals,
            records,
        };
        write_json(path, &report)?;
    }
    Ok(true)
}

#[derive(Debug, clap::Args)]
struct BenchAllreduceArgs {
    /// Worker counts (one star each).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8])]
    workers: Vec<usize>,
    /// Bytes per worker: `MIN..MAX` (units B, KiB, MiB, GiB), stepping by
    /// `--factor`, or a list such as `8B,64MiB`.
    #[arg(long, default_value = "4B..64MiB")]
    sizes: String,
    /// Each size is the previous one times this.
    #[arg(long, default_value_t = 2)]
    factor: usize,
    /// Measured repetitions per size and implementation, after a warm-up.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Loss rates in percent of all frames on every worker link, both
    /// directions (for xina and the ring alike); e.g. `0,1`.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0f64])]
    loss: Vec<f64>,
    /// What the loss rates apply to: `frame`, each wire frame (segmentation
    /// and receive offloads off on every link, and xina's workers without
    /// UDP GSO, for the whole run), or `batch`, each packet a hook sees with
    /// offloads on (a GSO send or a TSO/GRO packet of up to 64 KiB at once).
    #[arg(long, value_enum, default_value_t = lossy::LossModel::Frame)]
    loss_model: lossy::LossModel,
    /// Link MTUs to sweep, each on its own stars (e.g. `1500,9000,65000`):
    /// above 1,500 xina's packets take the wide path.
    #[arg(long, value_delimiter = ',', default_values_t = [1500u32])]
    frame: Vec<u32>,
    /// xina's elements per packet at every frame (default: as many as the
    /// frame holds).
    #[arg(long)]
    elems_per_packet: Option<u16>,
    /// xina's aggregator slots (the workers' window; default: about 1 MiB
    /// of chunks, 4 to 64).
    #[arg(long)]
    slots: Option<u32>,
    /// xina without congestion control: every worker keeps all slots open
    /// (the behaviour before workers had a congestion window).
    #[arg(long, conflicts_with = "queue_target")]
    fixed_window: bool,
    /// xina's congestion control: the queueing (ms of round trip above the
    /// lowest) a worker's window lets build (default: the library's, 1 ms).
    #[arg(long)]
    queue_target: Option<f64>,
    /// Implementations, in table order (`mpi` only when `mpirun` and
    /// `mpicc` are installed).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = allreduce_bench::Impl::ALL)]
    impls: Vec<allreduce_bench::Impl>,
    /// The link-bound regime: shape every worker link of both stars to this
    /// many Mbit/s, both directions (tbf), e.g. `500`; needs frames above
    /// 1500 and no loss. Unshaped by default (CPU-bound on this machine).
    #[arg(long)]
    rate: Option<u32>,
    /// Also write the spec, goals and one record per measurement as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also draw PNG charts into this directory: xina's congestion window
    /// over each case's last repetition, and time against loss where
    /// several loss rates were measured.
    #[arg(long)]
    plot: Option<PathBuf>,
}

fn bench_allreduce(args: &BenchAllreduceArgs) -> anyhow::Result<bool> {
    let spec = allreduce_bench::AllreduceBenchSpec {
        workers: args.workers.clone(),
        sizes: allreduce_bench::parse_size_range(&args.sizes, args.factor).context("--sizes")?,
        reps: args.reps,
        losses: args.loss.clone(),
        frames: args.frame.clone(),
        elems_per_packet: args.elems_per_packet,
        slots: args.slots,
        queue_target: match (args.fixed_window, args.queue_target) {
            (true, _) => None,
            (false, Some(ms)) => {
                Some(Duration::try_from_secs_f64(ms / 1e3).context("--queue-target")?)
            }
            (false, None) => xina_host::Config::default().queue_target,
        },
        impls: args.impls.clone(),
        loss_model: args.loss_model,
        rate_mbit: args.rate,
        ..Default::default()
    };
    spec.validate()?;
    let machine = bench::Machine::this();
    println!(
        "xina bench allreduce: int32 sum, xina through the XDP switch vs a TCP ring and \
         Open MPI on a plain star, {} CPUs, Linux {}",
        machine.cpus, machine.kernel
    );
    match spec.rate_mbit {
        Some(rate) => println!(
            "link-bound regime: every worker link of both stars shaped to {rate} Mbit/s each way (tbf)"
        ),
        None => {
            println!("CPU-bound regime: links unshaped, every namespace on this machine's CPUs");
        }
    }
    match spec.loss_model_used() {
        Some(lossy::LossModel::Frame) => println!(
            "loss per wire frame: segmentation and receive offloads off on every link and UDP GSO \
             off in xina's workers, at every loss rate of this run"
        ),
        Some(lossy::LossModel::Batch) => println!(
            "loss per packet with offloads on: a GSO send or a TSO/GRO packet is lost whole"
        ),
        None => {}
    }
    println!(
        "median of {} repetitions after a warm-up, interleaved; every result checked exactly; \
         xina {}\n",
        spec.reps,
        spec.frames
            .iter()
            .map(|&f| format!(
                "{} elements/packet and {} slots at MTU {f}",
                spec.elems_at(f),
                spec.slots_at(f)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let records = allreduce_bench::run(&spec, |line| eprintln!("  {line}"))?;
    for &frame in &spec.frames {
        for &loss in &spec.losses {
            for &workers in &spec.workers {
                println!("{workers} workers, MTU {frame}, loss {loss}%:");
                println!("{}", allreduce_bench::table(&records, frame, workers, loss));
            }
        }
    }
    println!(
        "time: per allreduce, first rank out of the barrier to last rank done; algbw = size/time, \
         busbw = algbw*2(n-1)/n (GB/s = 1e9 B/s);\nretx: xina retransmitted chunks, ring TCP \
         retransmitted segments, mpi TCP retransmitted segments of the plain star's namespaces, \
         summed over ranks and repetitions; xina/X = X time / xina time\n"
    );
    let goals = allreduce_bench::judge_goals(&records);
    println!("goals:");
    for g in &goals {
        let verdict = match (g.met, g.ratio) {
            (Some(met), Some(r)) => format!(
                "{}: {r:.2} (needs >= {})",
                if met { "MET" } else { "NOT MET" },
                g.threshold
            ),
            _ => "not measured".to_owned(),
        };
        println!("  {}\n    => {verdict}; {}", g.statement, g.detail);
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut charts = plot::window_charts(dir, &records)?;
        charts.extend(plot::loss_charts(dir, &records)?);
        for chart in charts {
            println!("chart written to {}", chart.display());
        }
    }
    if let Some(path) = &args.json {
        let report = allreduce_bench::AllreduceBenchReport {
            machine,
            spec,
            goals,
            records,
        };
        write_json(path, &report)?;
    }
    Ok(true)
}

#[derive(Debug, clap::Args)]
struct BenchSwitchArgs {
    /// Elements per packet of the in-kernel (test run) cases.
    #[arg(long, value_delimiter = ',', default_values_t = [64u16, 256])]
    elems: Vec<u16>,
    /// More in-kernel cases: for each IP MTU, as many elements as a packet
    /// of it holds, e.g. `1500,3500,9000,65000` (above 1,500 the wide path).
    #[arg(long, value_delimiter = ',')]
    frame: Vec<usize>,
    /// Element types and ops of the in-kernel cases (a type's rows are skipped
    /// at sizes that do not fit a packet).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [bench::Variant::I32Sum, bench::Variant::I32Max, bench::Variant::I64Sum])]
    types: Vec<bench::Variant>,
    /// Rounds of the whole measurement (fresh job each); medians are reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Distinct frames per path and round.
    #[arg(long, default_value_t = 2048)]
    stream: u32,
    /// Slots of the benchmark job (default: what `bench allreduce` gives a
    /// job of each case's size, about 1 MiB of chunks, 4 to 64).
    #[arg(long)]
    slots: Option<u32>,
    /// `repeat` of the single-frame runs (duplicate, unknown job, harness).
    #[arg(long, default_value_t = 10_000)]
    repeat: u32,
    /// Workers of the end-to-end runs.
    #[arg(long, default_value_t = 4)]
    e2e_workers: usize,
    /// Elements (int32) per worker of the end-to-end runs.
    #[arg(long, default_value_t = 2_000_000)]
    e2e_elements: usize,
    /// Elements per packet of the end-to-end runs.
    #[arg(long, value_delimiter = ',', default_values_t = [64u16, 256])]
    e2e_elems: Vec<u16>,
    /// Skip the end-to-end runs.
    #[arg(long)]
    no_e2e: bool,
    /// Also write every record as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn bench_switch(args: &BenchSwitchArgs) -> anyhow::Result<bool> {
    let spec = bench::SwitchBenchSpec {
        elems: args.elems.clone(),
        frames: args.frame.clone(),
        variants: args.types.clone(),
        rounds: args.rounds,
        stream: args.stream,
        slots: args.slots,
        repeat: args.repeat,
        ..Default::default()
    };
    let machine = bench::Machine::this();
    println!(
        "xina bench switch: in-kernel cost per packet (BPF_PROG_TEST_RUN), {} CPUs, Linux {}",
        machine.cpus, machine.kernel
    );
    println!(
        "method: per path, {} distinct frames each run once (repeat=1), kernel-timed, \
         interleaved with xina_drop (XDP_DROP) over the same frames; job of fan-in 3, {}; \
         medians over {} rounds\n",
        spec.stream,
        spec.slots.map_or_else(
            || "slots as bench allreduce gives each size (about 1 MiB of chunks, 4 to 64)"
                .to_owned(),
            |s| format!("{s} slots")
        ),
        spec.rounds
    );
    let (testrun, testrun_repeat, harness_ns) =
        bench::run_switch_bench(&spec, |line| eprintln!("  {line}"))?;
    println!("{}", bench::testrun_table(&testrun));
    println!(
        "ns/pkt, drop_ns: median over rounds of the mean kernel time per frame; \
         agg_pps = 1e9/ns; ratio = agg_pps/drop_pps;\nextra_ns = ns - drop_ns, the switch's own \
         cost; completing and from_cache exclude the broadcast/redirect done after the program\n"
    );
    println!(
        "one frame run {} times (paths a repeated frame stays on; harness cost spread out):",
        spec.repeat
    );
    println!("{}", bench::repeat_table(&testrun_repeat));
    if let Some(h) = harness_ns {
        println!(
            "harness share of every repeat=1 figure (xina_drop at repeat=1 minus at repeat={}): \
             {h:.1} ns\n",
            spec.repeat
        );
    }
    let goal = bench::judge_goal(&testrun);
    let verdict = match (goal.met, goal.worst_ratio, goal.worst_path) {
        (Some(met), Some(ratio), Some(path)) => format!(
            "{}: worst ratio {ratio:.2} ({path})",
            if met { "MET" } else { "NOT MET" }
        ),
        _ => "not measured (needs i32-sum at 64 elements per packet)".to_owned(),
    };
    println!("goal: {}\n  => {verdict}\n", goal.statement);
    let element_goals = bench::judge_element_goals(&testrun);
    println!("per-element goals (largest int32 frame measured):");
    for g in &element_goals {
        let verdict = match (g.met, g.value, g.elements_per_packet) {
            (Some(met), Some(v), Some(e)) => format!(
                "{}: {v:.2} at {e} elements (needs <= {})",
                if met { "MET" } else { "NOT MET" },
                g.most
            ),
            _ => "not measured".to_owned(),
        };
        println!("  {} => {verdict}", g.statement);
    }
    println!();

    let end_to_end = if args.no_e2e {
        Vec::new()
    } else {
        let e2e = bench::EndToEndSpec {
            workers: args.e2e_workers,
            elements: args.e2e_elements,
            elems: args.e2e_elems.clone(),
            ..Default::default()
        };
        let records = bench::run_end_to_end(&e2e, &testrun, |line| eprintln!("  {line}"))?;
        println!(
            "end to end: {} workers allreduce {} int32 each through the XDP switch on veth \
             (one UDP datagram per syscall):",
            e2e.workers, e2e.elements
        );
        println!("{}", bench::end_to_end_table(&records));
        println!(
            "switch_pps = switch rx_packets / elapsed; send_pps/wkr: median worker's sent/elapsed; \
             capacity_pps: 1e9 / TestRun ns per contribution\n(int32 sum, this fan-in); ns/rx, \
             ns/copy, busy: xina_switch and xina_egress run time in place (BPF_ENABLE_STATS)"
        );
        for r in &records {
            println!(
                "  {} elements/packet: limited by {}: {}",
                r.elements_per_packet, r.limited_by, r.reading
            );
        }
        records
    };
    let all_ok = end_to_end
        .iter()
        .all(|r| r.correct && r.accounting_error.is_none());
    if let Some(path) = &args.json {
        let report = bench::SwitchBenchReport {
            machine,
            spec,
            goal,
            element_goals,
            harness_ns,
            testrun,
            testrun_repeat,
            end_to_end,
        };
        write_json(path, &report)?;
    }
    Ok(all_ok)
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Number of workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Elements per worker.
    #[arg(long, default_value_t = 4_000_000)]
    elements: usize,
    /// Element type: int32 (exact) or float32 (fixed point with an agreed
    /// scale, within the documented bound).
    #[arg(long = "type", value_enum, default_value_t = scenario::ElementType::Int32)]
    dtype: scenario::ElementType,
    /// Elements per packet (1..=360).
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
        dtype: args.dtype,
        ..Default::default()
    };
    println!(
        "xina demo: {} workers allreduce {} {} each through an XDP switch ({} elements/packet, {} slots)\n",
        spec.workers,
        spec.elements,
        match spec.dtype {
            scenario::ElementType::Int32 => "int32",
            scenario::ElementType::Float32 => "float32",
        },
        spec.elems_per_packet,
        spec.slots
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

/// Writes `value` as pretty JSON to `path` and says so.
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("\nrecords written to {}", path.display());
    Ok(())
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
        Command::Bench(BenchCommand::Switch(args)) => bench_switch(args),
        Command::Bench(BenchCommand::Allreduce(args)) => bench_allreduce(args),
        Command::Bench(BenchCommand::Bcast(args)) => bench_bcast(args),
        Command::Bench(BenchCommand::Share(args)) => bench_share(args),
        Command::Bench(BenchCommand::Mpi(args)) => bench_mpi(args),
        Command::Worker(args) => worker(args),
        Command::GroupMember(args) => group_member(args),
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

//! `xina stats` and `xina exporter`: the dataplane's counters.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use xina::{control, pin::PinDir};

use super::Global;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON: `{"switch": {...}, "jobs": [{"name", "counters"}], "ports": [...]}`.
    #[arg(long, conflicts_with = "watch")]
    json: bool,
    /// Refresh every SECONDS with rates per second, until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
}

pub fn run(global: &Global, args: &Args) -> anyhow::Result<()> {
    let dir = global.pin_dir()?;
    let read = || -> anyhow::Result<control::Stats> {
        let sw = control::open(&dir).with_context(|| format!("switch {}", dir.name()))?;
        Ok(control::stats(&sw.dp)?)
    };
    let now = read()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&now)?);
        return Ok(());
    }
    let Some(every) = args.watch else {
        print!("{}", xina::stats::blocks_table(&now, None));
        return Ok(());
    };
    anyhow::ensure!(
        every.is_finite() && every >= 0.1,
        "--watch {every}: at least 0.1 seconds"
    );
    let (mut prev, mut at) = (now, Instant::now());
    loop {
        std::thread::sleep(Duration::from_secs_f64(every));
        let now = read()?;
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        // Clear the screen and go home, like watch(1).
        print!("\x1b[2J\x1b[H");
        println!("switch {}, every {every} s", dir.name());
        print!("{}", xina::stats::blocks_table(&now, Some((&prev, secs))));
        std::io::stdout().flush()?;
        prev = now;
    }
}

#[derive(Debug, clap::Args)]
pub struct ExporterArgs {
    /// Address to serve `GET /metrics` on.
    #[arg(long, default_value = "127.0.0.1:9860")]
    listen: SocketAddr,
    /// Also series per job and group (frames, completed chunks, drops by
    /// reason).
    #[arg(long)]
    per_job: bool,
}

/// Serves the counters in the Prometheus text format until interrupted.
pub fn exporter(global: &Global, args: &ExporterArgs) -> anyhow::Result<()> {
    let dir = global.pin_dir()?;
    let listener = listen(args.listen)?;
    serve_metrics(&listener, &dir, args.per_job);
    Ok(())
}

/// Binds the metrics address.
pub fn listen(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    if let Ok(a) = listener.local_addr() {
        log::info!("serving http://{a}/metrics");
    }
    Ok(listener)
}

/// Answers `GET /metrics` with switch `dir`'s counters, reading the pinned
/// maps at every scrape (one request at a time); 503 while the switch is down.
pub fn serve_metrics(listener: &TcpListener, dir: &PinDir, per_job: bool) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new(&conn).read_line(&mut line).is_err() {
            continue;
        }
        let (status, body) = if line.starts_with("GET /metrics") {
            match control::open(dir)
                .map_err(anyhow::Error::from)
                .and_then(|sw| {
                    let table = xina::metrics::Table::of(&sw.dp);
                    let stats = control::stats(&sw.dp)?;
                    Ok(xina::metrics::exposition(
                        dir.name(),
                        &stats,
                        table,
                        per_job,
                    ))
                }) {
                Ok(body) => ("200 OK", body),
                Err(e) => ("503 Service Unavailable", format!("{e:#}\n")),
            }
        } else {
            ("404 Not Found", "only /metrics is served\n".to_owned())
        };
        let _ = write!(
            conn,
            "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    }
}

//! What the kernel's verifier made of the dataplane: each program's
//! processed instructions against the budget, and refusals that say what
//! happened without flooding the terminal with the verifier's log.
//!
//! The verifier gives up on a program after [`BUDGET`] processed
//! instructions (`BPF_COMPLEXITY_LIMIT_INSNS`), and how many it processes
//! changes with the kernel: a program near the budget on one kernel is
//! refused by the next. xina keeps every program under [`MARGIN`] of it
//! (`ebpf/README.md`, "Verifier budget"); `xina switch check` prints the
//! figures, and `tests/verifier.rs` fails a build past the margin.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

/// Instructions the verifier processes before it refuses a program (the
/// same on every kernel since 5.2).
pub const BUDGET: u32 = 1_000_000;

/// The share of [`BUDGET`] a program may use: a quarter, so that a kernel
/// whose verifier explores more states still loads it.
pub const MARGIN: u32 = BUDGET / 4;

/// How one program fared in the verifier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramLoad {
    pub name: &'static str,
    /// Instructions the verifier processed (`verified_insns` of the
    /// program's info; `None` on kernels before 5.16, which do not say).
    pub insns: Option<u32>,
    /// Wall time of the load, almost all of it the verifier's.
    #[serde(serialize_with = "micros")]
    pub load_time: Duration,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl ProgramLoad {
    /// The share of the budget used, in percent.
    pub fn share(&self) -> Option<f64> {
        self.insns.map(|n| f64::from(n) * 100.0 / f64::from(BUDGET))
    }

    /// Whether the program is past [`MARGIN`].
    pub fn over_margin(&self) -> bool {
        self.insns.is_some_and(|n| n > MARGIN)
    }
}

/// The report of a whole load: every program, and the kernel it ran on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// `uname -r`.
    pub kernel: String,
    pub budget: u32,
    pub margin: u32,
    pub programs: Vec<ProgramLoad>,
}

impl Report {
    pub fn new(programs: Vec<ProgramLoad>) -> Self {
        Self {
            kernel: kernel_release(),
            budget: BUDGET,
            margin: MARGIN,
            programs,
        }
    }

    /// The programs past [`MARGIN`].
    pub fn over_margin(&self) -> impl Iterator<Item = &ProgramLoad> {
        self.programs.iter().filter(|p| p.over_margin())
    }

    /// The most instructions any program took.
    pub fn worst(&self) -> Option<&ProgramLoad> {
        self.programs.iter().max_by_key(|p| p.insns)
    }

    /// A table: program, instructions, share of the budget, load time.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "kernel {}: verifier budget {} instructions, margin {} ({}%)",
            self.kernel,
            self.budget,
            self.margin,
            self.margin * 100 / self.budget
        );
        let _ = writeln!(
            out,
            "{:<26} {:>12} {:>7} {:>11}",
            "program", "instructions", "budget", "verified in"
        );
        for p in &self.programs {
            let (insns, share) = match (p.insns, p.share()) {
                (Some(n), Some(s)) => (n.to_string(), format!("{s:.1}%")),
                _ => ("unknown".to_owned(), "-".to_owned()),
            };
            let mark = if p.over_margin() {
                "  over the margin"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{:<26} {:>12} {:>7} {:>9.1}ms{mark}",
                p.name,
                insns,
                share,
                p.load_time.as_secs_f64() * 1e3
            );
        }
        out
    }
}

/// The running kernel's release (`uname -r`), or `unknown`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Where a refused program's verifier log is written.
pub fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xina-verifier-{name}.log"))
}

/// Writes a refused program's verifier log to [`log_path`]; the path if
/// it could be written.
pub fn save_log(name: &str, log: &str) -> Option<PathBuf> {
    let path = log_path(name);
    std::fs::write(&path, log).ok().map(|()| path)
}

/// The verifier's own verdict in a refusal log: its last lines that are not
/// statistics (the reason comes last, before the counts).
pub fn verdict(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| !l.starts_with("verification time") && !l.starts_with("stack depth"))
        .collect();
    let reason = lines
        .iter()
        .rev()
        .find(|l| !l.starts_with("processed ") && !l.starts_with("max_states_per_insn"))
        .copied()
        .unwrap_or("no log");
    let processed = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("processed "))
        .copied();
    match processed {
        Some(p) if !reason.starts_with("processed") => format!("{reason} ({p})"),
        _ => reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_names_the_reason_and_the_count() {
        let log = "0: (b7) r0 = 0\n\
                   1: (95) exit\n\
                   BPF program is too large. Processed 1000001 insn\n\
                   processed 1000001 insns (limit 1000000) max_states_per_insn 36 total_states 17903 peak_states 77739 mark_read 31\n";
        assert_eq!(
            verdict(log),
            "BPF program is too large. Processed 1000001 insn \
             (processed 1000001 insns (limit 1000000) max_states_per_insn 36 total_states 17903 \
             peak_states 77739 mark_read 31)"
        );
        let log = "291: (0f) r3 += r1\n\
                   math between pkt pointer and register with unbounded min value is not allowed\n\
                   verification time 120 usec\n\
                   stack depth 64\n\
                   processed 291 insns (limit 1000000) max_states_per_insn 0 total_states 12 peak_states 12 mark_read 5\n";
        assert_eq!(
            verdict(log),
            "math between pkt pointer and register with unbounded min value is not allowed \
             (processed 291 insns (limit 1000000) max_states_per_insn 0 total_states 12 peak_states 12 mark_read 5)"
        );
        assert_eq!(verdict(""), "no log");
    }

    #[test]
    fn the_margin_is_a_quarter_and_judged_per_program() {
        let p = |insns| ProgramLoad {
            name: "p",
            insns,
            load_time: Duration::from_millis(1),
        };
        assert!(!p(Some(MARGIN)).over_margin());
        assert!(p(Some(MARGIN + 1)).over_margin());
        assert!(!p(None).over_margin());
        let r = Report::new(vec![p(Some(10)), p(Some(MARGIN + 1)), p(None)]);
        assert_eq!(r.over_margin().count(), 1);
        assert_eq!(r.worst().and_then(|p| p.insns), Some(MARGIN + 1));
        assert!(r.table().contains("over the margin"));
    }
}

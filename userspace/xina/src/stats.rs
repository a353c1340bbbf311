//! Printing the dataplane's counters.

use std::{collections::BTreeMap, fmt::Write as _};

use xina_proto::counters::Counter;

use crate::{
    control::{Block, Stats},
    dataplane::Counters,
};

/// A two-column table of the counters that are not zero (all of them with
/// `all`), one per line.
pub fn table(counters: &Counters, all: bool) -> String {
    let mut out = String::new();
    for c in Counter::ALL {
        let v = counters.get(c);
        if all || v != 0 {
            let _ = writeln!(out, "{:<24}{v:>14}", c.name());
        }
    }
    out
}

/// The columns of [`blocks_table`]: a counter each, and `drops`, the sum of
/// every `drop_*` counter.
pub const COLUMNS: [&str; 7] = [
    "rx_packets",
    "contributions",
    "completed",
    "results_sent",
    "reply_from_cache",
    "drops",
    "egress_not_member",
];

/// The value of column `col` in a name → value counter map.
pub fn column(counters: &BTreeMap<&'static str, u64>, col: &str) -> u64 {
    if col == "drops" {
        counters
            .iter()
            .filter(|(k, _)| k.starts_with("drop_"))
            .map(|(_, v)| *v)
            .sum()
    } else {
        counters.get(col).copied().unwrap_or(0)
    }
}

/// `xina stats`: one row per job, per port and the switch total, with the
/// [`COLUMNS`]; with `before` (the previous reading, `secs` ago), rates per
/// second instead of totals.
pub fn blocks_table(now: &Stats, before: Option<(&Stats, f64)>) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<8}{:<16}", "kind", "name");
    for c in COLUMNS {
        let head = if before.is_some() {
            format!("{c}/s")
        } else {
            c.to_owned()
        };
        let _ = write!(out, "{head:>20}");
    }
    out.push('\n');
    let rows = now
        .jobs
        .iter()
        .map(|b| ("job", b))
        .chain(now.ports.iter().map(|b| ("port", b)));
    let switch = Block {
        name: "total".to_owned(),
        counters: now.switch.clone(),
    };
    for (kind, block) in rows.chain(std::iter::once(("switch", &switch))) {
        let _ = write!(out, "{kind:<8}{:<16}", block.name);
        let prev = before.and_then(|(b, secs)| {
            let list = match kind {
                "job" => &b.jobs,
                "port" => &b.ports,
                _ => return Some((b.switch.clone(), secs)),
            };
            list.iter()
                .find(|p| p.name == block.name)
                .map(|p| (p.counters.clone(), secs))
        });
        for c in COLUMNS {
            let v = column(&block.counters, c);
            match &prev {
                Some((p, secs)) => {
                    #[expect(clippy::cast_precision_loss, reason = "a rate for display")]
                    let rate = v.saturating_sub(column(p, c)) as f64 / secs.max(1e-9);
                    let _ = write!(out, "{rate:>20.1}");
                }
                None => {
                    let _ = write!(out, "{v:>20}");
                }
            }
        }
        out.push('\n');
    }
    out
}

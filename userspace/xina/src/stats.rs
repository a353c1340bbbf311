//! Printing the dataplane's counters.

use std::fmt::Write as _;

use xina_proto::counters::Counter;

use crate::dataplane::Counters;

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

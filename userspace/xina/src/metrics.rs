//! The switch's counters for Prometheus: one family per quantity, drops by
//! reason, the switch, its ports and (on request) its jobs in families of
//! their own, so that no sum counts a frame twice; gauges of the job table.
//! Encoded by `prometheus-client` (the `OpenMetrics` text format, every family with
//! `# HELP`).

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter as Total, family::Family, gauge::Gauge},
    registry::Registry,
};
use xina_proto::counters::Counter;

use crate::control::Stats;

/// Where a dataplane counter goes.
enum Quantity {
    /// Ingress frames seen (`xina_frames_total`).
    Frames,
    /// An ingress outcome that is not a drop (`outcome` label).
    Outcome(&'static str),
    /// An ingress drop (`reason` label).
    Dropped(&'static str),
    /// Contributions accepted into a slot.
    Contributions,
    /// Copies written by the egress program (`kind` label).
    Copies(&'static str),
    /// Copies the egress program did not send (`reason` label).
    Skipped(&'static str),
}

/// Every counter's place; a new counter does not compile until it has one.
const fn quantity(c: Counter) -> Quantity {
    use Quantity::{Contributions, Copies, Dropped, Frames, Outcome, Skipped};
    match c {
        Counter::RxPackets => Frames,
        Counter::Passed => Outcome("passed"),
        Counter::Consumed => Outcome("consumed"),
        Counter::Completed => Outcome("completed"),
        Counter::ReplyFromCache => Outcome("reply_from_cache"),
        Counter::McastReplicated => Outcome("mcast_replicated"),
        Counter::McastResent => Outcome("mcast_resent"),
        Counter::AcksConsumed => Outcome("ack_consumed"),
        Counter::AcksCompleted => Outcome("ack_completed"),
        Counter::AckFromCache => Outcome("ack_from_cache"),
        Counter::MissingReport => Outcome("missing_report"),
        Counter::AnycastDelivered => Outcome("anycast_delivered"),
        Counter::DropDuplicate => Dropped("duplicate"),
        Counter::DropTruncated => Dropped("truncated"),
        Counter::DropBadHeader => Dropped("bad_header"),
        Counter::DropFragment => Dropped("fragment"),
        Counter::DropUnsupportedKind => Dropped("unsupported_kind"),
        Counter::DropUnknownJob => Dropped("unknown_job"),
        Counter::DropNotMember => Dropped("not_member"),
        Counter::DropBadSlot => Dropped("bad_slot"),
        Counter::DropBadShape => Dropped("bad_shape"),
        Counter::DropStale => Dropped("stale"),
        Counter::DropRedirect => Dropped("redirect"),
        Counter::DropInternal => Dropped("internal"),
        Counter::DropNotSender => Dropped("not_sender"),
        Counter::DropNoMemberUp => Dropped("no_member_up"),
        Counter::Contributions => Contributions,
        Counter::ResultsSent => Copies("result"),
        Counter::NoticesSent => Copies("notice"),
        Counter::McastCopies => Copies("group_data"),
        Counter::AcksSent => Copies("group_ack"),
        Counter::EgressNotMember => Skipped("not_member"),
        Counter::McastSkipped => Skipped("not_addressed"),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Switch {
    switch: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwitchOutcome {
    switch: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwitchReason {
    switch: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwitchKind {
    switch: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Port {
    switch: String,
    port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortKind {
    switch: String,
    port: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Job {
    switch: String,
    job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobReason {
    switch: String,
    job: String,
    reason: String,
}

/// What the job table holds at a scrape.
#[derive(Clone, Copy, Debug, Default)]
pub struct Table {
    /// Jobs and groups installed.
    pub jobs: u64,
    /// Aggregator slots they hold.
    pub slots_used: u64,
    /// Slots of the pool.
    pub slot_pool: u64,
}

impl Table {
    /// The job table of `dp` now.
    pub fn of(dp: &crate::Dataplane) -> Self {
        Self {
            jobs: dp.jobs().count() as u64,
            slots_used: dp.jobs().map(|j| u64::from(j.slot_count)).sum(),
            slot_pool: u64::from(dp.slot_pool()),
        }
    }
}

/// The exposition of switch `name`'s counters and job table; per-job series
/// only with `per_job` (a switch with many tenants would otherwise hand
/// Prometheus a series per job and reason).
pub fn exposition(name: &str, stats: &Stats, table: Table, per_job: bool) -> String {
    let mut registry = Registry::default();
    register(&mut registry, name, stats, table, per_job);
    encode_text(&registry)
}

/// The text exposition of `registry`.
///
/// # Panics
/// Never: encoding into a `String` cannot fail.
pub fn encode_text(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).expect("encoding into a String");
    out
}

/// Registers the families of [`exposition`] in `registry`, beside others
/// (the job service's).
pub fn register(registry: &mut Registry, name: &str, stats: &Stats, table: Table, per_job: bool) {
    let switch = || name.to_owned();

    let frames = Family::<Switch, Total>::default();
    let outcomes = Family::<SwitchOutcome, Total>::default();
    let dropped = Family::<SwitchReason, Total>::default();
    let contributions = Family::<Switch, Total>::default();
    let copies = Family::<SwitchKind, Total>::default();
    let skipped = Family::<SwitchReason, Total>::default();
    for c in Counter::ALL {
        let v = stats.switch.get(c.name()).copied().unwrap_or(0);
        let s = switch();
        match quantity(c) {
            Quantity::Frames => frames.get_or_create(&Switch { switch: s }).inc_by(v),
            Quantity::Outcome(o) => outcomes
                .get_or_create(&SwitchOutcome {
                    switch: s,
                    outcome: o.to_owned(),
                })
                .inc_by(v),
            Quantity::Dropped(r) => dropped
                .get_or_create(&SwitchReason {
                    switch: s,
                    reason: r.to_owned(),
                })
                .inc_by(v),
            Quantity::Contributions => contributions.get_or_create(&Switch { switch: s }).inc_by(v),
            Quantity::Copies(k) => copies
                .get_or_create(&SwitchKind {
                    switch: s,
                    kind: k.to_owned(),
                })
                .inc_by(v),
            Quantity::Skipped(r) => skipped
                .get_or_create(&SwitchReason {
                    switch: s,
                    reason: r.to_owned(),
                })
                .inc_by(v),
        };
    }
    registry.register(
        "xina_frames",
        "Frames the switch's ingress programs saw, on every port",
        frames,
    );
    registry.register(
        "xina_frames_handled",
        "Ingress frames by what became of them, drops excepted (with xina_frames_dropped \
         they add up to xina_frames)",
        outcomes,
    );
    registry.register(
        "xina_frames_dropped",
        "Ingress frames dropped, by reason",
        dropped,
    );
    registry.register(
        "xina_contributions",
        "Contributions accepted into an aggregator slot",
        contributions,
    );
    registry.register(
        "xina_copies",
        "Copies the egress program wrote, by kind",
        copies,
    );
    registry.register(
        "xina_copies_skipped",
        "Copies the egress program did not send, by reason",
        skipped,
    );

    let port_frames = Family::<Port, Total>::default();
    let port_copies = Family::<PortKind, Total>::default();
    for b in &stats.ports {
        let get = |c: Counter| b.counters.get(c.name()).copied().unwrap_or(0);
        port_frames
            .get_or_create(&Port {
                switch: switch(),
                port: b.name.clone(),
            })
            .inc_by(get(Counter::RxPackets));
        for c in Counter::ALL {
            if let Quantity::Copies(kind) = quantity(c) {
                port_copies
                    .get_or_create(&PortKind {
                        switch: switch(),
                        port: b.name.clone(),
                        kind: kind.to_owned(),
                    })
                    .inc_by(get(c));
            }
        }
    }
    registry.register(
        "xina_port_frames",
        "Frames that arrived on the port",
        port_frames,
    );
    registry.register(
        "xina_port_copies",
        "Copies that left through the port, by kind",
        port_copies,
    );

    if per_job {
        let job_frames = Family::<Job, Total>::default();
        let job_completed = Family::<Job, Total>::default();
        let job_dropped = Family::<JobReason, Total>::default();
        for b in &stats.jobs {
            let get = |c: Counter| b.counters.get(c.name()).copied().unwrap_or(0);
            let job = || Job {
                switch: switch(),
                job: b.name.clone(),
            };
            job_frames
                .get_or_create(&job())
                .inc_by(get(Counter::RxPackets));
            job_completed
                .get_or_create(&job())
                .inc_by(get(Counter::Completed));
            for c in Counter::ALL {
                if let Quantity::Dropped(reason) = quantity(c) {
                    job_dropped
                        .get_or_create(&JobReason {
                            switch: switch(),
                            job: b.name.clone(),
                            reason: reason.to_owned(),
                        })
                        .inc_by(get(c));
                }
            }
        }
        registry.register(
            "xina_job_frames",
            "Ingress frames of the job or group",
            job_frames,
        );
        registry.register(
            "xina_job_chunks_completed",
            "Chunks of the job completed in the switch",
            job_completed,
        );
        registry.register(
            "xina_job_frames_dropped",
            "Ingress frames of the job or group dropped, by reason",
            job_dropped,
        );
    }

    let gauge = |v: u64| {
        let g = Family::<Switch, Gauge>::default();
        g.get_or_create(&Switch { switch: switch() })
            .set(i64::try_from(v).unwrap_or(i64::MAX));
        g
    };
    registry.register("xina_jobs", "Jobs and groups installed", gauge(table.jobs));
    registry.register(
        "xina_slots_used",
        "Aggregator slots held by installed jobs and groups",
        gauge(table.slots_used),
    );
    registry.register(
        "xina_slots_free",
        "Aggregator slots of the pool that no job or group holds",
        gauge(table.slot_pool.saturating_sub(table.slots_used)),
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::control::Block;

    fn stats() -> Stats {
        let mut switch = BTreeMap::new();
        for (i, c) in Counter::ALL.iter().enumerate() {
            switch.insert(c.name(), 100 + i as u64);
        }
        let block = |name: &str, rx: u64| Block {
            name: name.to_owned(),
            counters: [
                (Counter::RxPackets.name(), rx),
                (Counter::ResultsSent.name(), 7),
                (Counter::DropStale.name(), 2),
                (Counter::Completed.name(), 5),
            ]
            .into_iter()
            .collect(),
        };
        Stats {
            switch,
            jobs: vec![block("1", 40)],
            ports: vec![block("p0", 30), block("p1", 10)],
        }
    }

    fn value(text: &str, line: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {line} in\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn every_family_has_help_and_drops_come_by_reason() {
        let table = Table {
            jobs: 2,
            slots_used: 48,
            slot_pool: 256,
        };
        let text = exposition("s1", &stats(), table, false);
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = l.split_whitespace().nth(2).unwrap();
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no HELP:\n{text}"
            );
        }
        let stale = 100
            + Counter::ALL
                .iter()
                .position(|c| *c == Counter::DropStale)
                .unwrap();
        assert_eq!(
            value(
                &text,
                r#"xina_frames_dropped_total{switch="s1",reason="stale"}"#
            ),
            stale as u64
        );
        assert_eq!(
            value(&text, r#"xina_port_frames_total{switch="s1",port="p0"}"#),
            30
        );
        assert_eq!(
            value(
                &text,
                r#"xina_port_copies_total{switch="s1",port="p1",kind="result"}"#
            ),
            7
        );
        assert_eq!(value(&text, r#"xina_slots_free{switch="s1"}"#), 208);
        assert_eq!(value(&text, r#"xina_jobs{switch="s1"}"#), 2);
        // No series mixes scopes, and per-job series wait to be asked for.
        assert!(!text.contains("scope="), "{text}");
        assert!(!text.contains("xina_job_"), "{text}");
        let with_jobs = exposition("s1", &stats(), table, true);
        assert_eq!(
            value(
                &with_jobs,
                r#"xina_job_chunks_completed_total{switch="s1",job="1"}"#
            ),
            5
        );
        assert_eq!(
            value(
                &with_jobs,
                r#"xina_job_frames_dropped_total{switch="s1",job="1",reason="stale"}"#
            ),
            2
        );
    }

    #[test]
    fn outcomes_and_drops_add_up_to_the_frames() {
        // As the dataplane counts them: every ingress frame ends in one
        // outcome or one drop reason.
        let mut switch = BTreeMap::new();
        let mut total = 0;
        for (i, c) in Counter::ALL.iter().enumerate() {
            if c.is_ingress_outcome() {
                switch.insert(c.name(), i as u64);
                total += i as u64;
            }
        }
        switch.insert(Counter::RxPackets.name(), total);
        let stats = Stats {
            switch,
            jobs: Vec::new(),
            ports: Vec::new(),
        };
        let text = exposition("s", &stats, Table::default(), false);
        let sum = |prefix: &str| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(
            sum("xina_frames_handled_total{") + sum("xina_frames_dropped_total{"),
            value(&text, r#"xina_frames_total{switch="s"}"#)
        );
    }
}

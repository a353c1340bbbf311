//! The dataplane's counters: indices into the per-CPU `COUNTERS` array.
//!
//! Userspace sums each counter over CPUs. Every packet the switch's ingress
//! program sees ends in exactly one of the "outcome" counters (`Passed`,
//! `Consumed`, `Completed`, `ReplyFromCache`, the multicast and anycast
//! outcomes or one of the `Drop*` reasons; see [`Counter::is_ingress_outcome`]),
//! so their sum equals `RxPackets`.

/// Index of a counter in the `COUNTERS` map.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Frames seen by the ingress program.
    RxPackets = 0,
    /// Non-xina frames handed to the kernel unchanged.
    Passed,
    /// Contributions accepted into a slot (first or combining), duplicates excluded.
    Contributions,
    /// Contributions that were accepted and did not complete their chunk (consumed).
    Consumed,
    /// Chunks completed: the completing packet became the result.
    Completed,
    /// Result copies written by the egress program, one per receiving member.
    ResultsSent,
    /// Completion notices (no payload) written by the egress program, for
    /// members that are not the chunk's root in reduce and reduce-scatter.
    NoticesSent,
    /// Retransmitted contributions of a finished chunk, answered to the sender from the slot.
    ReplyFromCache,
    /// A rank contributed twice to a chunk still being aggregated.
    DropDuplicate,
    /// The frame was too short for the headers or the payload it announces.
    DropTruncated,
    /// UDP to the xina port, but bad magic or version.
    DropBadHeader,
    /// A fragmented IPv4 datagram on the xina port.
    DropFragment,
    /// A packet kind the switch does not handle on ingress.
    DropUnsupportedKind,
    /// The job id is not installed.
    DropUnknownJob,
    /// The rank is not a member, or the source address/port is not the rank's.
    DropNotMember,
    /// The slot index lies outside the job's slot range.
    DropBadSlot,
    /// Element count, type, op, fan-in or root disagree with the job or with
    /// the chunk in the slot.
    DropBadShape,
    /// A contribution for a chunk that is neither the one its slot copy holds
    /// nor the next one that copy may take (`seq + 2 × slots`).
    DropStale,
    /// The redirect to the job's members failed.
    DropRedirect,
    /// The aggregation program for the job's type and op is not loaded (a
    /// control-plane fault; never expected).
    DropInternal,
    /// A result copy leaving a port on which the job has no member (egress).
    EgressNotMember,
    /// Multicast: a sender's first transmission of a chunk, replicated to
    /// every receiver.
    McastReplicated,
    /// Multicast: a retransmission of a chunk some receivers have not
    /// acknowledged, replicated to those receivers only (the sender's copy
    /// becomes a missing-receiver report).
    McastResent,
    /// Multicast: an acknowledgement recorded; the chunk still misses receivers.
    AcksConsumed,
    /// Multicast: the last acknowledgement of a chunk, turned into the
    /// aggregated acknowledgement (to the sender; to every member for `SYNC`
    /// chunks).
    AcksCompleted,
    /// Multicast: a retransmitted chunk or a repeated acknowledgement of a
    /// chunk every receiver has acknowledged, answered from the slot.
    AckFromCache,
    /// Multicast: a repeated acknowledgement of a chunk other receivers have
    /// not acknowledged yet, answered with a missing-receiver report.
    MissingReport,
    /// Anycast: a packet sent on to the member its flow hashes to.
    AnycastDelivered,
    /// A group member sent data without being one of the group's senders.
    DropNotSender,
    /// Anycast: every member of the group is down.
    DropNoMemberUp,
    /// Multicast and anycast data copies addressed to a receiver (egress).
    McastCopies,
    /// Group copies not sent (egress): data for a member not in the copy's
    /// bitmap (it acknowledged the chunk, or is the chunk's sender), or an
    /// acknowledgement for neither this member nor every member.
    McastSkipped,
    /// Acknowledgements, completions and reports addressed to a member (egress).
    AcksSent,
}

impl Counter {
    /// Number of counters.
    pub const COUNT: usize = 33;

    /// Every counter, in index order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::RxPackets,
        Self::Passed,
        Self::Contributions,
        Self::Consumed,
        Self::Completed,
        Self::ResultsSent,
        Self::NoticesSent,
        Self::ReplyFromCache,
        Self::DropDuplicate,
        Self::DropTruncated,
        Self::DropBadHeader,
        Self::DropFragment,
        Self::DropUnsupportedKind,
        Self::DropUnknownJob,
        Self::DropNotMember,
        Self::DropBadSlot,
        Self::DropBadShape,
        Self::DropStale,
        Self::DropRedirect,
        Self::DropInternal,
        Self::EgressNotMember,
        Self::McastReplicated,
        Self::McastResent,
        Self::AcksConsumed,
        Self::AcksCompleted,
        Self::AckFromCache,
        Self::MissingReport,
        Self::AnycastDelivered,
        Self::DropNotSender,
        Self::DropNoMemberUp,
        Self::McastCopies,
        Self::McastSkipped,
        Self::AcksSent,
    ];

    /// A short snake-case name, for tables, JSON and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::RxPackets => "rx_packets",
            Self::Passed => "passed",
            Self::Contributions => "contributions",
            Self::Consumed => "consumed",
            Self::Completed => "completed",
            Self::ResultsSent => "results_sent",
            Self::NoticesSent => "notices_sent",
            Self::ReplyFromCache => "reply_from_cache",
            Self::DropDuplicate => "drop_duplicate",
            Self::DropTruncated => "drop_truncated",
            Self::DropBadHeader => "drop_bad_header",
            Self::DropFragment => "drop_fragment",
            Self::DropUnsupportedKind => "drop_unsupported_kind",
            Self::DropUnknownJob => "drop_unknown_job",
            Self::DropNotMember => "drop_not_member",
            Self::DropBadSlot => "drop_bad_slot",
            Self::DropBadShape => "drop_bad_shape",
            Self::DropStale => "drop_stale",
            Self::DropRedirect => "drop_redirect",
            Self::DropInternal => "drop_internal",
            Self::EgressNotMember => "egress_not_member",
            Self::McastReplicated => "mcast_replicated",
            Self::McastResent => "mcast_resent",
            Self::AcksConsumed => "acks_consumed",
            Self::AcksCompleted => "acks_completed",
            Self::AckFromCache => "ack_from_cache",
            Self::MissingReport => "missing_report",
            Self::AnycastDelivered => "anycast_delivered",
            Self::DropNotSender => "drop_not_sender",
            Self::DropNoMemberUp => "drop_no_member_up",
            Self::McastCopies => "mcast_copies",
            Self::McastSkipped => "mcast_skipped",
            Self::AcksSent => "acks_sent",
        }
    }

    /// Whether this counter is one of the ingress outcomes (see the module docs).
    pub const fn is_ingress_outcome(self) -> bool {
        !matches!(
            self,
            Self::RxPackets
                | Self::Contributions
                | Self::ResultsSent
                | Self::NoticesSent
                | Self::EgressNotMember
                | Self::McastCopies
                | Self::McastSkipped
                | Self::AcksSent
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order_and_names_are_unique() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
            for d in &Counter::ALL[..i] {
                assert_ne!(c.name(), d.name());
            }
        }
    }
}

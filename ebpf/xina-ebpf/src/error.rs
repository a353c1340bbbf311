//! What happened to a packet: the counter to bump and the XDP action to take.

use aya_ebpf::bindings::xdp_action::{XDP_DROP, XDP_PASS};
use xina_proto::counters::Counter;

use crate::maps::Tally;

/// Why a packet is dropped.
#[derive(Clone, Copy)]
pub enum Error {
    Truncated,
    BadHeader,
    Fragment,
    UnsupportedKind,
    UnknownJob,
    NotMember,
    BadSlot,
    BadShape,
    Duplicate,
    Stale,
    Redirect,
    EgressNotMember,
    Internal,
    /// Group data from a member without the `SENDER` flag.
    NotSender,
    /// Anycast data for a group whose members are all down.
    NoMemberUp,
}

/// The end of a packet's trip through a program: which counter records it
/// and which XDP action the program returns.
#[derive(Clone, Copy)]
pub struct Verdict {
    pub counter: Counter,
    pub action: u32,
}

impl Verdict {
    pub const fn new(counter: Counter, action: u32) -> Self {
        Self { counter, action }
    }

    /// Not xina: on to the kernel unchanged.
    pub const fn pass() -> Self {
        Self::new(Counter::Passed, XDP_PASS)
    }

    /// Counts the verdict and returns its action.
    #[inline(always)]
    pub fn finish(self, tally: &Tally) -> u32 {
        tally.count(self.counter);
        self.action
    }
}

impl From<Error> for Verdict {
    fn from(e: Error) -> Self {
        let counter = match e {
            Error::Truncated => Counter::DropTruncated,
            Error::BadHeader => Counter::DropBadHeader,
            Error::Fragment => Counter::DropFragment,
            Error::UnsupportedKind => Counter::DropUnsupportedKind,
            Error::UnknownJob => Counter::DropUnknownJob,
            Error::NotMember => Counter::DropNotMember,
            Error::BadSlot => Counter::DropBadSlot,
            Error::BadShape => Counter::DropBadShape,
            Error::Duplicate => Counter::DropDuplicate,
            Error::Stale => Counter::DropStale,
            Error::Redirect => Counter::DropRedirect,
            Error::EgressNotMember => Counter::EgressNotMember,
            Error::Internal => Counter::DropInternal,
            Error::NotSender => Counter::DropNotSender,
            Error::NoMemberUp => Counter::DropNoMemberUp,
        };
        Self::new(counter, XDP_DROP)
    }
}

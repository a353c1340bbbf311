//! The aggregator slot state machine, run under the slot copy's spin lock.
//!
//! Concurrency: a port's frames can be processed on several CPUs, and the
//! ranks of one job sit behind different ports, so two contributions to the
//! same slot copy can run at the same time. Every step reads and writes
//! several fields together (sequence number, bitmap, state and all
//! elements), so per-field atomics would let a reset on one CPU interleave
//! with a combine on another. A `bpf_spin_lock` per slot copy makes the whole
//! step atomic; contention is limited to ranks of one chunk arriving at the
//! same instant, and the critical section calls no helper (the verifier
//! forbids it), so counters and redirects happen after the unlock.

use aya_ebpf::helpers::{bpf_spin_lock, bpf_spin_unlock};
use xina_proto::{
    Flags, MAX_ELEMS, checksum,
    maps::{Slot, slot_state},
};

/// A contribution, as checked against its job.
pub struct Contribution {
    pub seq: u32,
    pub count: u32,
    pub rank_bit: u64,
    pub all_ranks: u64,
}

/// What the contribution did to its slot copy.
pub enum Outcome {
    /// Stored; the chunk still misses ranks.
    Consumed,
    /// It completed the chunk: the payload now holds the result.
    Completed(Result),
    /// A retransmission of a finished chunk: the payload now holds the
    /// stored result, for the sender alone.
    FromCache(Result),
    /// This rank already contributed to the unfinished chunk.
    Duplicate,
    /// The copy holds a newer chunk.
    Stale,
    /// The element count differs from the chunk's.
    BadShape,
}

/// A result written into the payload.
pub struct Result {
    pub flags: u8,
    pub bitmap: u64,
    /// Checksum adjustment for the payload bytes that changed.
    pub csum: u64,
}

/// Whether `a` is a later sequence number than `b` (RFC 1982 style).
#[inline(always)]
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// Runs one contribution on a slot copy.
///
/// # Safety
/// `slot` points to a `SLOTS` map value; `payload..end` is the frame's payload
/// range as the verifier knows it (every element access is checked against
/// `end` again).
#[inline(always)]
pub unsafe fn contribute(slot: *mut Slot, payload: usize, end: usize, c: &Contribution) -> Outcome {
    // SAFETY: `slot` is a valid map value (caller); the lock field is the
    // kernel's `struct bpf_spin_lock` layout.
    let lock = unsafe { &raw mut (*slot).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    // SAFETY: we hold the copy's lock, so no other CPU touches it.
    let outcome = unsafe { step(&mut *slot, payload, end, c) };
    // SAFETY: as above; the lock is held by this program.
    unsafe { bpf_spin_unlock(lock) };
    outcome
}

/// Loads element `i` of the payload, `None` past the frame's end.
#[inline(always)]
fn load(payload: usize, end: usize, i: usize) -> Option<u32> {
    let p = payload + 4 * i;
    if p + 4 > end {
        return None;
    }
    // SAFETY: the four bytes lie inside the frame, checked just above.
    Some(u32::from_be_bytes(unsafe { *(p as *const [u8; 4]) }))
}

/// Stores element `i` of the payload; the caller checked it with `load`.
#[inline(always)]
fn store(payload: usize, end: usize, i: usize, v: u32) {
    let p = payload + 4 * i;
    if p + 4 <= end {
        // SAFETY: the four bytes lie inside the frame, checked just above.
        unsafe { *(p as *mut [u8; 4]) = v.to_be_bytes() };
    }
}

/// The state machine proper; no helper calls allowed in here.
#[inline(always)]
fn step(s: &mut Slot, payload: usize, end: usize, c: &Contribution) -> Outcome {
    let n = c.count as usize;
    if s.state == slot_state::EMPTY || newer(c.seq, s.seq) {
        // The first contribution to this chunk initialises the copy. The
        // protocol guarantees the chunk it replaces has been delivered to
        // every rank (see `xina-host`): a rank sends seq + W only after it has
        // the result of seq, so every rank had contributed to seq and thus
        // received seq - W, the chunk this copy held.
        let mut i = 0;
        while i < MAX_ELEMS && i < n {
            let Some(v) = load(payload, end, i) else {
                return Outcome::BadShape;
            };
            s.values[i] = v as i32;
            i += 1;
        }
        s.seq = c.seq;
        s.count = c.count;
        s.bitmap = c.rank_bit;
        s.flags = 0;
        if c.rank_bit == c.all_ranks {
            s.state = slot_state::COMPLETE;
            // A job of one rank: the contribution is its own result.
            return Outcome::Completed(Result {
                flags: 0,
                bitmap: s.bitmap,
                csum: 0,
            });
        }
        s.state = slot_state::PARTIAL;
        return Outcome::Consumed;
    }
    if c.seq != s.seq {
        return Outcome::Stale;
    }
    if c.count != s.count {
        return Outcome::BadShape;
    }
    if s.bitmap & c.rank_bit != 0 {
        if s.state != slot_state::COMPLETE {
            return Outcome::Duplicate;
        }
        // A retransmission of a finished chunk: its result was lost on the
        // way to this rank. Answer from the stored result.
        let mut csum = 0;
        let mut i = 0;
        while i < MAX_ELEMS && i < n {
            let Some(old) = load(payload, end, i) else {
                return Outcome::BadShape;
            };
            let new = s.values[i] as u32;
            store(payload, end, i, new);
            csum = checksum::replace32(csum, old, new);
            i += 1;
        }
        return Outcome::FromCache(Result {
            flags: s.flags as u8,
            bitmap: s.bitmap,
            csum,
        });
    }
    let completes = s.bitmap | c.rank_bit == c.all_ranks;
    let mut overflow = false;
    let mut csum = 0;
    let mut i = 0;
    while i < MAX_ELEMS && i < n {
        let Some(v) = load(payload, end, i) else {
            return Outcome::BadShape;
        };
        let (sum, over) = s.values[i].overflowing_add(v as i32);
        let sum = if over {
            overflow = true;
            // Saturate in the direction of the true sum.
            if sum < 0 { i32::MAX } else { i32::MIN }
        } else {
            sum
        };
        s.values[i] = sum;
        if completes {
            store(payload, end, i, sum as u32);
            csum = checksum::replace32(csum, v, sum as u32);
        }
        i += 1;
    }
    s.bitmap |= c.rank_bit;
    if overflow {
        s.flags |= u32::from(Flags::OVERFLOW);
    }
    if completes {
        s.state = slot_state::COMPLETE;
        return Outcome::Completed(Result {
            flags: s.flags as u8,
            bitmap: s.bitmap,
            csum,
        });
    }
    Outcome::Consumed
}

//! The aggregator slot state machine, run under the slot copy's spin lock.
//!
//! Concurrency: a port's frames can be processed on several CPUs, and the
//! ranks of one job sit behind different ports, so two contributions to the
//! same slot copy can run at the same time. Every step reads and writes
//! several fields together (sequence number, bitmap, state, root and every
//! element), and MAX / MIN have no atomic instruction in BPF, so per-field
//! atomics would let a reset on one CPU interleave with a combine on another.
//! A `bpf_spin_lock` per slot copy makes the whole step atomic. Contention is
//! limited to ranks of one chunk arriving at the same instant, and the
//! critical section calls no helper (the verifier forbids it), so the payload
//! is staged into per-CPU scratch before the lock (`bpf_xdp_load_bytes`) and
//! written back after it (`bpf_xdp_store_bytes`), and counters and redirects
//! happen after the unlock.
//!
//! The state machine of one copy, for a contribution of chunk `s` from rank
//! `r` (W = the job's slot count, so a copy holds chunks `s`, `s + 2W`, ...):
//!
//! | copy holds             | contribution            | effect                         | outcome     |
//! |------------------------|-------------------------|--------------------------------|-------------|
//! | nothing (empty)        | any `s`                 | initialise with it             | consumed *  |
//! | chunk `s - 2W`         | `s`                     | initialise with it             | consumed *  |
//! | chunk `s`, partial     | new rank                | combine                        | consumed *  |
//! | chunk `s`, partial     | rank already in         | none                           | duplicate   |
//! | chunk `s`, complete    | rank already in         | output := stored result        | from cache  |
//! | chunk `s`              | other count or root     | none                           | bad shape   |
//! | any other chunk        | `s`                     | none                           | stale       |
//!
//! (*) `completed` instead when the contribution makes the bitmap full: the
//! values are clamped to the element type and staged as the output.
//!
//! Verifier budget: every element loop runs a constant number of times `N`
//! (the size class of the job's packets) and never branches on the element
//! count, so the verifier walks each loop once; a loop that stopped at the
//! count would make it walk the rest of the program once per possible count.

use aya_ebpf::helpers::{bpf_spin_lock, bpf_spin_unlock};
use xina_proto::{
    Flags, MAX_PAYLOAD,
    maps::{Slot, slot_state},
};

/// A staged payload, as 32-bit words in wire (big-endian) byte order. Word
/// aligned, so an element costs one load and a byte swap rather than four
/// byte loads.
pub type Buf = [u32; MAX_PAYLOAD / 4];

/// A contribution, as checked against its job.
pub struct Contribution {
    pub seq: u32,
    pub count: u32,
    pub rank_bit: u64,
    pub all_ranks: u64,
    pub root: u32,
    /// Distance between two chunks held by the same copy: twice the job's slots.
    pub reuse: u32,
}

/// What the contribution did to its slot copy.
pub enum Outcome {
    /// Stored; the chunk still misses ranks.
    Consumed,
    /// It completed the chunk: the output buffer holds the result.
    Completed(Result),
    /// A retransmission of a finished chunk: the output buffer holds the
    /// stored result, for the sender alone.
    FromCache(Result),
    /// This rank already contributed to the unfinished chunk.
    Duplicate,
    /// The copy holds a chunk this contribution does not belong to.
    Stale,
    /// The element count or root differ from the chunk's.
    BadShape,
}

/// A result staged in the output buffer.
pub struct Result {
    pub flags: u8,
    pub bitmap: u64,
    pub root: u32,
    /// Checksum adjustment from the input payload to the output payload.
    pub csum: u64,
}

impl Result {
    /// The result a slot copy holds, with the checksum adjustment of writing
    /// it out.
    #[inline(always)]
    fn of(s: &Slot, csum: u64) -> Self {
        Self {
            flags: s.flags as u8,
            bitmap: s.bitmap,
            root: s.root,
            csum,
        }
    }
}

/// An element type on the wire.
pub trait Elem {
    /// Bytes per element.
    const SIZE: usize;
    /// Elements that fit a staged payload.
    const CAP: usize = MAX_PAYLOAD / Self::SIZE;
    /// Element `i` of a staged payload (sign-extended); `i < CAP`.
    fn get(buf: &Buf, i: usize) -> i64;
    /// Stores element `i` of a staged payload; `i < CAP`.
    fn put(buf: &mut Buf, i: usize, v: i64);
    /// The checksum adjustment `~old + new` over element `i`'s 32-bit words.
    fn csum(old: &Buf, new: &Buf, i: usize) -> u64;
    /// Adds `v` to an accumulator; `true` if it saturated.
    fn add(acc: i64, v: i64) -> (i64, bool);
    /// Clamps an accumulator to the type's range; `true` if it had to.
    fn clamp(v: i64) -> (i64, bool);
    /// [`Elem::add`] without a branch (the wide path's loops run over
    /// random values, where a branch per element is mispredicted often, and
    /// a flag that is a different constant on each side of a branch splits
    /// the verifier's states at every element); non-zero if it saturated.
    fn add_lane(acc: i64, v: i64) -> (i64, u64);
    /// All ones if `v < acc`, else zero, without a branch.
    fn less_mask(acc: i64, v: i64) -> i64;
    /// A word to OR over accumulators, for [`Elem::out_of_range`].
    fn excess(acc: i64) -> u64;
    /// Whether one of the accumulators ORed into `excess` needs clamping.
    fn out_of_range(excess: u64) -> bool;
}

/// `v`, hidden from the optimiser, so that it cannot turn the arithmetic
/// that uses it back into a comparison and a branch (BPF has no
/// conditional move).
#[inline(always)]
pub fn opaque(mut v: i64) -> i64 {
    // SAFETY: a move of `v` to itself, which the optimiser cannot see into.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) v, options(pure, nomem, nostack)) };
    v
}

/// The word at byte offset `at` (a multiple of 4) as the number it spells.
#[inline(always)]
fn word(buf: &Buf, at: usize) -> u32 {
    debug_assert!(at % 4 == 0 && at + 4 <= MAX_PAYLOAD);
    // SAFETY: callers pass `at + 4 <= MAX_PAYLOAD` (element index below CAP).
    u32::from_be(unsafe { *buf.as_ptr().add(at / 4) })
}

#[inline(always)]
fn set_word(buf: &mut Buf, at: usize, v: u32) {
    debug_assert!(at % 4 == 0 && at + 4 <= MAX_PAYLOAD);
    // SAFETY: as in `word`.
    unsafe { *buf.as_mut_ptr().add(at / 4) = v.to_be() };
}

/// `int32`: accumulated in `i64` (64 ranks cannot overflow it), clamped once
/// when the chunk completes.
pub struct I32;
/// `int64`: accumulated with saturation.
pub struct I64;

impl Elem for I32 {
    const SIZE: usize = 4;

    #[inline(always)]
    fn get(buf: &Buf, i: usize) -> i64 {
        i64::from(word(buf, 4 * i) as i32)
    }

    #[inline(always)]
    fn put(buf: &mut Buf, i: usize, v: i64) {
        set_word(buf, 4 * i, v as i32 as u32);
    }

    #[inline(always)]
    fn csum(old: &Buf, new: &Buf, i: usize) -> u64 {
        u64::from(!word(old, 4 * i)) + u64::from(word(new, 4 * i))
    }

    #[inline(always)]
    fn add(acc: i64, v: i64) -> (i64, bool) {
        (acc + v, false)
    }

    #[inline(always)]
    fn clamp(v: i64) -> (i64, bool) {
        if v > i64::from(i32::MAX) {
            (i64::from(i32::MAX), true)
        } else if v < i64::from(i32::MIN) {
            (i64::from(i32::MIN), true)
        } else {
            (v, false)
        }
    }

    #[inline(always)]
    fn add_lane(acc: i64, v: i64) -> (i64, u64) {
        (acc + v, 0)
    }

    #[inline(always)]
    fn less_mask(acc: i64, v: i64) -> i64 {
        // int32 values in i64: the difference cannot overflow.
        opaque((v - acc) >> 63)
    }

    #[inline(always)]
    fn excess(acc: i64) -> u64 {
        // Below 2^32 exactly when `acc` is in int32's range.
        (acc as u64).wrapping_add(1 << 31)
    }

    #[inline(always)]
    fn out_of_range(excess: u64) -> bool {
        excess >> 32 != 0
    }
}

impl Elem for I64 {
    const SIZE: usize = 8;

    #[inline(always)]
    fn get(buf: &Buf, i: usize) -> i64 {
        ((u64::from(word(buf, 8 * i)) << 32) | u64::from(word(buf, 8 * i + 4))) as i64
    }

    #[inline(always)]
    fn put(buf: &mut Buf, i: usize, v: i64) {
        set_word(buf, 8 * i, (v >> 32) as u32);
        set_word(buf, 8 * i + 4, v as u32);
    }

    #[inline(always)]
    fn csum(old: &Buf, new: &Buf, i: usize) -> u64 {
        u64::from(!word(old, 8 * i))
            + u64::from(word(new, 8 * i))
            + u64::from(!word(old, 8 * i + 4))
            + u64::from(word(new, 8 * i + 4))
    }

    #[inline(always)]
    fn add(acc: i64, v: i64) -> (i64, bool) {
        match acc.checked_add(v) {
            Some(s) => (s, false),
            // Saturate in the direction of the true sum.
            None if v > 0 => (i64::MAX, true),
            None => (i64::MIN, true),
        }
    }

    #[inline(always)]
    fn clamp(v: i64) -> (i64, bool) {
        (v, false)
    }

    #[inline(always)]
    fn add_lane(acc: i64, v: i64) -> (i64, u64) {
        let sum = acc.wrapping_add(v);
        // All ones if the sum overflowed: both operands have the sign the
        // sum lacks.
        let mask = opaque(((acc ^ sum) & (v ^ sum)) >> 63);
        // Saturate in the direction of the true sum (the operands' sign).
        let bound = opaque(acc >> 63) ^ i64::MAX;
        (sum ^ ((sum ^ bound) & mask), mask as u64)
    }

    #[inline(always)]
    fn less_mask(acc: i64, v: i64) -> i64 {
        // The sign of `v - acc`, corrected where the difference overflows.
        let d = v.wrapping_sub(acc);
        opaque((d ^ ((v ^ acc) & (d ^ v))) >> 63)
    }

    #[inline(always)]
    fn excess(_: i64) -> u64 {
        0
    }

    #[inline(always)]
    fn out_of_range(_: u64) -> bool {
        false
    }
}

/// How elements combine.
pub trait Combine {
    /// Combines an accumulator with a new value; `true` if it saturated.
    fn combine<E: Elem>(acc: i64, v: i64) -> (i64, bool);

    /// [`Combine::combine`] without a branch (see [`Elem::add_lane`]);
    /// non-zero if it saturated.
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64);
}

pub struct Sum;
pub struct Max;
pub struct Min;

impl Combine for Sum {
    #[inline(always)]
    fn combine<E: Elem>(acc: i64, v: i64) -> (i64, bool) {
        E::add(acc, v)
    }

    #[inline(always)]
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64) {
        E::add_lane(acc, v)
    }
}

impl Combine for Max {
    #[inline(always)]
    fn combine<E: Elem>(acc: i64, v: i64) -> (i64, bool) {
        (if v > acc { v } else { acc }, false)
    }

    #[inline(always)]
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64) {
        (v ^ ((v ^ acc) & E::less_mask(acc, v)), 0)
    }
}

impl Combine for Min {
    #[inline(always)]
    fn combine<E: Elem>(acc: i64, v: i64) -> (i64, bool) {
        (if v < acc { v } else { acc }, false)
    }

    #[inline(always)]
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64) {
        (acc ^ ((acc ^ v) & E::less_mask(acc, v)), 0)
    }
}

/// Zeroes the first `N` elements of a staged payload unless the chunk's `n`
/// elements fill them: the caller stages the chunk over it, so elements past
/// `n` are 0, combine to 0 with any op, never overflow and add nothing to the
/// checksum. The loops can then run over all `N` without looking at `n`.
///
/// The stores are volatile so the compiler does not turn the loop into a
/// call to a byte-at-a-time `memset` (four instructions per byte in BPF).
#[inline(always)]
pub fn clear<E: Elem, const N: usize>(buf: &mut Buf, n: usize) {
    let words = (N.min(E::CAP) * E::SIZE) / 4;
    if n * E::SIZE / 4 >= words {
        return;
    }
    for i in 0..words {
        // SAFETY: `4 * i + 4 <= N * SIZE <= MAX_PAYLOAD`.
        unsafe { buf.as_mut_ptr().add(i).write_volatile(0) };
    }
}

/// Runs one contribution (staged in `input` over a [`clear`]ed buffer) on a
/// slot copy; a result is staged in `output`. `N` is the job's size class:
/// the loops' trip count.
///
/// # Safety
/// `slot` points to a `SLOTS` map value.
#[inline(always)]
pub unsafe fn contribute<E: Elem, C: Combine, const N: usize>(
    slot: *mut Slot,
    input: &Buf,
    output: &mut Buf,
    c: &Contribution,
) -> Outcome {
    // SAFETY: `slot` is a valid map value (caller); the lock field is the
    // kernel's `struct bpf_spin_lock` layout.
    let lock = unsafe { &raw mut (*slot).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    // SAFETY: we hold the copy's lock, so no other CPU touches it.
    let outcome = step::<E, C, N>(unsafe { &mut *slot }, input, output, c);
    // SAFETY: as above; the lock is held by this program.
    unsafe { bpf_spin_unlock(lock) };
    outcome
}

/// Stages the copy's values as the output, clamped to the element type
/// (setting the copy's overflow flag if one of the chunk's values had to be);
/// returns the checksum adjustment from `input`.
///
/// Flags live in the slot, not in a register carried through the loop: a
/// register that is 0 on one path and 1 on another would split the
/// verifier's states at every iteration.
#[inline(always)]
fn write_out<E: Elem, const N: usize>(s: &mut Slot, input: &Buf, output: &mut Buf) -> u64 {
    let mut csum = 0;
    for i in 0..N.min(E::CAP) {
        let (v, over) = E::clamp(s.values[i]);
        if over {
            s.flags |= u32::from(Flags::OVERFLOW);
        }
        s.values[i] = v;
        E::put(output, i, v);
        // Past the chunk's elements both sides are 0, and `~0 + 0` is the
        // ones'-complement zero: it changes nothing.
        csum += E::csum(input, output, i);
    }
    csum
}

/// The state machine proper; no helper calls allowed in here.
#[inline(always)]
fn step<E: Elem, C: Combine, const N: usize>(
    s: &mut Slot,
    input: &Buf,
    output: &mut Buf,
    c: &Contribution,
) -> Outcome {
    if s.state == slot_state::EMPTY || c.seq == s.seq.wrapping_add(c.reuse) {
        // The first contribution to this chunk initialises the copy. A rank
        // sends chunk s + 2W to this copy only after it has the result of
        // s + W, so every rank contributed to s + W and therefore already had
        // the result of s, the chunk this copy held.
        for i in 0..N.min(E::CAP) {
            s.values[i] = E::get(input, i);
        }
        s.seq = c.seq;
        s.count = c.count;
        s.bitmap = c.rank_bit;
        s.root = c.root;
        s.flags = 0;
        if c.rank_bit != c.all_ranks {
            s.state = slot_state::PARTIAL;
            return Outcome::Consumed;
        }
        // A job of one rank: the contribution is its own result.
        s.state = slot_state::COMPLETE;
        let csum = write_out::<E, N>(s, input, output);
        return Outcome::Completed(Result::of(s, csum));
    }
    if c.seq != s.seq {
        return Outcome::Stale;
    }
    if c.count != s.count || c.root != s.root {
        return Outcome::BadShape;
    }
    if s.bitmap & c.rank_bit != 0 {
        if s.state != slot_state::COMPLETE {
            return Outcome::Duplicate;
        }
        // A retransmission of a finished chunk: its result was lost on the
        // way to this rank. Answer from the stored result.
        let csum = write_out::<E, N>(s, input, output);
        return Outcome::FromCache(Result::of(s, csum));
    }
    for i in 0..N.min(E::CAP) {
        let (acc, over) = C::combine::<E>(s.values[i], E::get(input, i));
        if over {
            s.flags |= u32::from(Flags::OVERFLOW);
        }
        s.values[i] = acc;
    }
    s.bitmap |= c.rank_bit;
    if s.bitmap != c.all_ranks {
        return Outcome::Consumed;
    }
    s.state = slot_state::COMPLETE;
    let csum = write_out::<E, N>(s, input, output);
    Outcome::Completed(Result::of(s, csum))
}

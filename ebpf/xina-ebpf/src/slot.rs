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
    /// Clamps an accumulator to the type's range, without a branch (see
    /// [`Elem::add_lane`]); 1 if it had to, else 0.
    fn clamp_lane(v: i64) -> (i64, u64);
    /// Adds `v` to an accumulator, saturating, without a branch: the loops
    /// run over random values, where a branch per element is mispredicted
    /// often, and a branch whose arms leave different values in the loop's
    /// registers splits the verifier's states at every element (see
    /// `ebpf/README.md`, "Verifier budget"); 1 if it saturated, else 0.
    ///
    /// The flag is a bit, not a mask: the verifier forks its state on an
    /// AND with a value it knows to be 0 or -1, and a mask ORed into a flag
    /// the loop carries keeps the two forks apart until the loop ends.
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

/// A bit (`b` is 0 or 1) as a factor, hidden from the optimiser like
/// [`opaque`], so that a multiplication by it stays a multiplication and
/// does not become a branch.
#[inline(always)]
fn bit(b: u64) -> i64 {
    opaque(b as i64)
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
    fn clamp_lane(v: i64) -> (i64, u64) {
        const MAX: i64 = i32::MAX as i64;
        const MIN: i64 = i32::MIN as i64;
        // Accumulators of at most 64 int32 lie within ±2^38: no difference
        // below can overflow. Selects are multiplications by a bit rather
        // than ANDs with a mask, which the verifier forks its state on.
        // 1 where `v` is above MAX:
        let above = bit((MAX - v) as u64 >> 63);
        let v = v + (MAX - v) * above;
        // 1 where it is below MIN:
        let below = bit((v - MIN) as u64 >> 63);
        (v + (MIN - v) * below, (above | below) as u64)
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
    fn clamp_lane(v: i64) -> (i64, u64) {
        (v, 0)
    }

    #[inline(always)]
    fn add_lane(acc: i64, v: i64) -> (i64, u64) {
        let sum = acc.wrapping_add(v);
        // 1 if the sum overflowed: both operands have the sign the sum
        // lacks.
        let over = bit(((acc ^ sum) & (v ^ sum)) as u64 >> 63);
        // Saturate in the direction of the true sum (the operands' sign):
        // i64::MAX, or i64::MIN where `acc` is negative.
        let bound = i64::MAX.wrapping_add(bit(acc as u64 >> 63));
        (
            sum.wrapping_add(bound.wrapping_sub(sum).wrapping_mul(over)),
            over as u64,
        )
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
    /// Combines an accumulator with a new value without a branch (see
    /// [`Elem::add_lane`]); non-zero if it saturated.
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64);
}

pub struct Sum;
pub struct Max;
pub struct Min;

impl Combine for Sum {
    #[inline(always)]
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64) {
        E::add_lane(acc, v)
    }
}

impl Combine for Max {
    #[inline(always)]
    fn lane<E: Elem>(acc: i64, v: i64) -> (i64, u64) {
        (v ^ ((v ^ acc) & E::less_mask(acc, v)), 0)
    }
}

impl Combine for Min {
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
/// the loops' trip count. `plan` is a word of map memory (this CPU's
/// scratch) the step hands its plan through (see [`step`]).
///
/// # Safety
/// `slot` points to a `SLOTS` map value, `plan` into a map value.
#[inline(always)]
pub unsafe fn contribute<E: Elem, C: Combine, const N: usize>(
    slot: *mut Slot,
    input: &Buf,
    output: &mut Buf,
    c: &Contribution,
    plan: *mut u32,
) -> Outcome {
    // SAFETY: `slot` is a valid map value (caller); the lock field is the
    // kernel's `struct bpf_spin_lock` layout.
    let lock = unsafe { &raw mut (*slot).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    // SAFETY: we hold the copy's lock, so no other CPU touches it; `plan`
    // is map memory (caller).
    let outcome = unsafe { step::<E, C, N>(&mut *slot, input, output, c, plan) };
    // SAFETY: as above; the lock is held by this program.
    unsafe { bpf_spin_unlock(lock) };
    outcome
}

/// What the element loops do for a contribution, and what it amounts to:
/// bits of the word [`step`] hands through map memory.
mod plan {
    /// The copy's values := the contribution's.
    pub const INIT: u32 = 1 << 0;
    /// The copy's values combined with the contribution's.
    pub const COMBINE: u32 = 1 << 1;
    /// The copy's values, clamped, staged as the output.
    pub const WRITE_OUT: u32 = 1 << 2;
    /// The outcome, above the loop bits.
    pub const OUTCOME_SHIFT: u32 = 8;
    pub const CONSUMED: u32 = 1;
    pub const COMPLETED: u32 = 2;
    pub const FROM_CACHE: u32 = 3;
    pub const DUPLICATE: u32 = 4;
    pub const STALE: u32 = 5;
    pub const BAD_SHAPE: u32 = 6;
}

/// The state machine's decision: updates the copy's state fields (not its
/// values) and returns the loops to run and the outcome, as [`plan`] bits.
#[inline(always)]
fn decide(s: &mut Slot, c: &Contribution) -> u32 {
    use plan::*;
    let outcome = |o: u32| o << OUTCOME_SHIFT;
    if s.state == slot_state::EMPTY || c.seq == s.seq.wrapping_add(c.reuse) {
        // The first contribution to this chunk initialises the copy. A rank
        // sends chunk s + 2W to this copy only after it has the result of
        // s + W, so every rank contributed to s + W and therefore already had
        // the result of s, the chunk this copy held.
        s.seq = c.seq;
        s.count = c.count;
        s.bitmap = c.rank_bit;
        s.root = c.root;
        s.flags = 0;
        if c.rank_bit != c.all_ranks {
            s.state = slot_state::PARTIAL;
            return INIT | outcome(CONSUMED);
        }
        // A job of one rank: the contribution is its own result.
        s.state = slot_state::COMPLETE;
        return INIT | WRITE_OUT | outcome(COMPLETED);
    }
    if c.seq != s.seq {
        return outcome(STALE);
    }
    if c.count != s.count || c.root != s.root {
        return outcome(BAD_SHAPE);
    }
    if s.bitmap & c.rank_bit != 0 {
        if s.state != slot_state::COMPLETE {
            return outcome(DUPLICATE);
        }
        // A retransmission of a finished chunk: its result was lost on the
        // way to this rank. Answer from the stored result.
        return WRITE_OUT | outcome(FROM_CACHE);
    }
    s.bitmap |= c.rank_bit;
    if s.bitmap != c.all_ranks {
        return COMBINE | outcome(CONSUMED);
    }
    s.state = slot_state::COMPLETE;
    COMBINE | WRITE_OUT | outcome(COMPLETED)
}

/// The state machine proper; no helper calls allowed in here.
///
/// Verifier budget: [`decide`] branches a dozen ways, and had each branch
/// its own copy of the element loops (as it once did), the verifier would
/// walk a loop of up to 360 elements once per way, with constants in
/// registers that differ between ways, past a quarter of its budget. So the
/// decision goes through map memory, whose contents the verifier does not
/// track, and comes back as a value it knows nothing about: each loop
/// exists once, behind one test of that value, and is walked once or
/// twice whatever the decision (`ebpf/README.md`, "Verifier budget").
///
/// # Safety
/// `plan` points into a map value.
#[inline(always)]
unsafe fn step<E: Elem, C: Combine, const N: usize>(
    s: &mut Slot,
    input: &Buf,
    output: &mut Buf,
    c: &Contribution,
    plan: *mut u32,
) -> Outcome {
    // SAFETY: map memory (caller).
    unsafe { plan.write_volatile(decide(s, c)) };
    // The plan is read anew for every test (volatile, so that the compiler
    // neither keeps it in a register nor forwards the value stored): a
    // register tested bit by bit would carry what the verifier learnt from
    // each test into the next loop, one state per combination of bits.
    // SAFETY: as above.
    let todo = || unsafe { plan.read_volatile() };
    if todo() & plan::INIT != 0 {
        for i in 0..N.min(E::CAP) {
            s.values[i] = E::get(input, i);
        }
    }
    if todo() & plan::COMBINE != 0 {
        // Without a branch per element, as in `write_out`.
        let mut over = 0;
        for i in 0..N.min(E::CAP) {
            let (acc, o) = C::lane::<E>(s.values[i], E::get(input, i));
            over |= o;
            s.values[i] = acc;
        }
        s.flags |= overflow_flag(over);
    }
    let csum = if todo() & plan::WRITE_OUT != 0 {
        write_out::<E, N>(s, input, output)
    } else {
        0
    };
    match todo() >> plan::OUTCOME_SHIFT {
        plan::CONSUMED => Outcome::Consumed,
        plan::COMPLETED => Outcome::Completed(Result::of(s, csum)),
        plan::FROM_CACHE => Outcome::FromCache(Result::of(s, csum)),
        plan::DUPLICATE => Outcome::Duplicate,
        plan::STALE => Outcome::Stale,
        _ => Outcome::BadShape,
    }
}

/// Stages the copy's values as the output, clamped to the element type
/// (setting the copy's overflow flag if one of the chunk's values had to be);
/// returns the checksum adjustment from `input`.
///
/// The clamp has no branch: it costs no more than the branches, which
/// random data mispredicts, and the overflow flag is ORed up in a register
/// rather than set by a branch per element.
#[inline(always)]
fn write_out<E: Elem, const N: usize>(s: &mut Slot, input: &Buf, output: &mut Buf) -> u64 {
    let (mut csum, mut over) = (0, 0);
    for i in 0..N.min(E::CAP) {
        let (v, o) = E::clamp_lane(s.values[i]);
        over |= o;
        s.values[i] = v;
        E::put(output, i, v);
        // Past the chunk's elements both sides are 0, and `~0 + 0` is the
        // ones'-complement zero: it changes nothing.
        csum += E::csum(input, output, i);
    }
    s.flags |= overflow_flag(over);
    csum
}

/// The copy's overflow flag if `over`, the lanes' flags ORed up (each 0 or
/// 1), is 1; zero otherwise. Without a branch: a branch on it would split
/// the verifier's states into "overflowed" and not for the rest of the
/// step.
#[inline(always)]
fn overflow_flag(over: u64) -> u32 {
    (over as u32 & 1) * u32::from(Flags::OVERFLOW)
}

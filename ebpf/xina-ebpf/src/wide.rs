//! The wide path: aggregation of frames that carry more than the narrow path
//! takes, up to 64 KB (multi-buffer frames), for jobs whose
//! `elems_per_packet` is above `DType::narrow_elems` (see `xina_proto::frame`).
//!
//! Why it differs from the narrow path ([`crate::slot`]):
//!
//! - **No element work under a lock.** A `bpf_spin_lock` forbids every
//!   helper call, `bpf_loop` included, and a bounded loop over 16,128
//!   elements is past the verifier's budget. So each CPU accumulates into a
//!   partial of its own, and the copy's lock guards only the state: which
//!   ranks were admitted (`bitmap`), which have landed in a partial
//!   (`landed`) and which CPUs hold partials (`cpus`). The contribution that
//!   makes `landed` full merges the other CPUs' partials into its own,
//!   writes the result and marks the copy `COMPLETE`; the last one admitted
//!   does so straight away, from its staged payload, when every other rank
//!   has landed already.
//! - **Blocks.** Partials live in the job's units of `UNITS` (one block of
//!   128 elements each; the completer's partial holds the result once the
//!   chunk is complete), so a job's memory follows its frame
//!   size; the element loops are `bpf_loop` callbacks over steps of `S`
//!   elements (a divisor of the block), verified once whatever the chunk's
//!   size. `S` is per program (int64's saturating add needs more
//!   instructions per element, so fewer per step). The loops have no branch
//!   per element and never look at the chunk's count (see the note above
//!   [`init_block`], and `ebpf/README.md`).
//! - **Fan-out through tc.** A devmap broadcast cannot carry a multi-buffer
//!   frame, so the completed result is passed to the kernel with a mark in
//!   its XDP metadata, and the tc program [`crate::fanout`] on the port's
//!   ingress clones it to every member (the clones share the payload).
//!   A reply from the cache goes to one port, which the devmap can do.
//!
//! Why a partial can be read by the completing CPU without a lock: a rank's
//! bit enters `landed` (under the lock) only after its contribution has been
//! combined into its CPU's partial, and the lock orders those writes before
//! the completer's reads. A partial is written only by its own CPU (XDP runs
//! one packet at a time per CPU), and only for this chunk until the chunk is
//! complete: the next chunk of the same copy, `s + 2W`, is sent only by a rank
//! that has the result of `s + W`, hence after `s` is complete (the narrow
//! path's argument). Repeats of an admitted rank are duplicates until the
//! copy is `COMPLETE`, then answered from the completer's partial (`cpus`
//! then names that one CPU), which does not change until the copy is reused:
//! the first contribution to `s + 2W` on that CPU initialises it. By then
//! no repeat of `s` is left to answer: a rank repeats `s` only until it has
//! the result, and its repeats travel its port's queue ahead of its
//! contribution to `s + W`, without which `s + 2W` is never sent.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::{
        bpf_get_smp_processor_id, bpf_loop, bpf_spin_lock, bpf_spin_unlock, bpf_xdp_adjust_meta,
        bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    programs::XdpContext,
};
use xina_proto::{
    Flags, MAX_FRAME_PAYLOAD,
    checksum::fold,
    counters::Counter,
    frame::{BLOCK_ELEMS, unit_of},
    maps::{FanoutMeta, Slot, slot_state},
};

use crate::{
    error::{Error, Verdict},
    maps::{
        LoopAcc, MAX_CPUS, Pending, SCRATCH, SLOTS, Tally, UNITS, WIDE_LEN_MASK, WIDE_SCRATCH,
        WideBuf, XINA_CPUS, XINA_FANOUT_KEY,
    },
    packet::{self, PAYLOAD},
    slot::{self, Combine, Contribution, Elem},
    switch,
};

/// What the state step lets a contribution do.
enum Admit {
    /// The first contribution of this chunk on this CPU: its partial is
    /// initialised with it.
    Init,
    /// Combined into this CPU's partial.
    Combine,
    /// Every other rank has landed in the partials of the CPUs `holders`:
    /// this contribution completes the chunk from them and the staged
    /// payload, without landing in a partial first.
    Complete {
        holders: u64,
    },
    /// A repeat of a finished chunk: answered from the result, in the
    /// partial of the CPU `s.cpus` names.
    FromCache(slot::Result, u64),
    Duplicate,
    Stale,
    BadShape,
}

/// The state step, under the copy's lock (no helper calls).
#[inline(always)]
fn admit(s: &mut Slot, c: &Contribution, cpu_bit: u64) -> Admit {
    if s.state == slot_state::EMPTY || c.seq == s.seq.wrapping_add(c.reuse) {
        s.seq = c.seq;
        s.count = c.count;
        s.root = c.root;
        s.flags = 0;
        s.bitmap = c.rank_bit;
        if c.rank_bit == c.all_ranks {
            // A job of one rank.
            s.landed = c.rank_bit;
            s.cpus = 0;
            s.state = slot_state::COMPLETING;
            return Admit::Complete { holders: 0 };
        }
        s.landed = 0;
        s.cpus = cpu_bit;
        s.state = slot_state::PARTIAL;
        return Admit::Init;
    }
    if c.seq != s.seq {
        return Admit::Stale;
    }
    if c.count != s.count || c.root != s.root {
        return Admit::BadShape;
    }
    if s.bitmap & c.rank_bit != 0 {
        if s.state == slot_state::COMPLETE {
            return Admit::FromCache(
                slot::Result {
                    flags: s.flags as u8,
                    bitmap: s.bitmap,
                    root: s.root,
                    csum: 0,
                },
                s.cpus,
            );
        }
        return Admit::Duplicate;
    }
    s.bitmap |= c.rank_bit;
    if s.landed | c.rank_bit == c.all_ranks {
        s.landed = c.all_ranks;
        s.state = slot_state::COMPLETING;
        return Admit::Complete { holders: s.cpus };
    }
    if s.cpus & cpu_bit == 0 {
        s.cpus |= cpu_bit;
        Admit::Init
    } else {
        Admit::Combine
    }
}

/// Runs `step` on the copy under its lock.
///
/// # Safety
/// `slot` points to a `SLOTS` value; `step` calls no helper.
#[inline(always)]
unsafe fn locked<R>(slot: *mut Slot, step: impl FnOnce(&mut Slot) -> R) -> R {
    // SAFETY: a map value (caller); the lock field has the kernel's layout.
    let lock = unsafe { &raw mut (*slot).lock }.cast();
    // SAFETY: as above.
    unsafe { bpf_spin_lock(lock) };
    // SAFETY: we hold the copy's lock.
    let r = step(unsafe { &mut *slot });
    // SAFETY: held by this program.
    unsafe { bpf_spin_unlock(lock) };
    r
}

/// The context of the block loops, handed to `bpf_loop` callbacks. The
/// callbacks only read it; what they accumulate goes to `acc`, in map
/// memory (see [`LoopAcc`]).
#[repr(C)]
struct Blocks {
    /// This CPU's staged payload.
    input: *mut WideBuf,
    /// This CPU's loop accumulators.
    acc: *mut LoopAcc,
    /// First unit of the partial the loop works on (this CPU's; for a
    /// reply from the cache, the completer's, only read).
    dst: u32,
    /// Steps in the chunk (for [`merge_block`]).
    steps: u32,
    /// [`merge_block`]: the CPUs whose partials are merged into `dst`, and
    /// the first unit of CPU 0's partial and the units per partial.
    holders: u64,
    cpu0: u32,
    stride: u32,
}

/// Most steps of `S` elements of `E` in a staged payload.
const fn max_steps<E: Elem, const S: usize>() -> usize {
    MAX_FRAME_PAYLOAD / (E::SIZE * S)
}

/// Words of `E` in a step of `S` elements.
const fn step_words<E: Elem, const S: usize>() -> usize {
    S * E::SIZE / 4
}

/// The start of every callback: the loop's context, the step's first word
/// in the staged payload, its unit (relative to the first) and its element
/// within the unit; `None` past the payload's capacity, where the loop
/// stops. `S` divides [`BLOCK_ELEMS`], so a step never spans two units.
///
/// # Safety
/// `ctx` is the `Blocks` the caller passed to `bpf_loop`.
#[inline(always)]
unsafe fn step<'a, E: Elem, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> Option<(&'a Blocks, *mut u32, u32, usize)> {
    let k = k as usize;
    if k >= max_steps::<E, S>() {
        return None;
    }
    // SAFETY: as the caller promises.
    let ctx = unsafe { &*ctx.cast::<Blocks>() };
    // SAFETY: step `k` lies inside the staged payload (checked above).
    let words = unsafe { ctx.input.cast::<u32>().add(k * step_words::<E, S>()) };
    Some((
        ctx,
        words,
        (k * S / BLOCK_ELEMS) as u32,
        k * S % BLOCK_ELEMS,
    ))
}

/// This CPU's loop accumulators.
#[inline(always)]
fn acc(ctx: &Blocks) -> &mut LoopAcc {
    // SAFETY: `acc` points to this CPU's `WIDE_SCRATCH` entry, which only
    // the program running on this CPU touches, and no other reference to
    // it is live while a callback runs.
    unsafe { &mut *ctx.acc }
}

/// Element `at` of the unit `index`, or `None`.
#[inline(always)]
fn unit(index: u32, at: usize) -> Option<*mut u64> {
    // SAFETY: `at` is below BLOCK_ELEMS, the values of a unit (callers).
    UNITS
        .get_ptr_mut(index)
        .map(|u| unsafe { u.cast::<u64>().add(at) })
}

/// Element `j` of wire words `w`.
///
/// # Safety
/// Room for element `j` at `w`.
#[inline(always)]
unsafe fn get<E: Elem>(w: *const u32, j: usize) -> i64 {
    if E::SIZE == 4 {
        // SAFETY: in bounds (caller).
        i64::from(u32::from_be(unsafe { *w.add(j) }) as i32)
    } else {
        // SAFETY: as above.
        let hi = u64::from(u32::from_be(unsafe { *w.add(2 * j) }));
        // SAFETY: as above.
        let lo = u64::from(u32::from_be(unsafe { *w.add(2 * j + 1) }));
        ((hi << 32) | lo) as i64
    }
}

/// Stores `v` as element `j` of wire words `w`.
///
/// # Safety
/// Room for element `j` at `w`.
#[inline(always)]
unsafe fn set<E: Elem>(w: *mut u32, j: usize, v: i64) {
    if E::SIZE == 4 {
        // SAFETY: in bounds (caller).
        unsafe { *w.add(j) = (v as u32).to_be() };
    } else {
        // SAFETY: as above.
        unsafe {
            *w.add(2 * j) = ((v >> 32) as u32).to_be();
            *w.add(2 * j + 1) = (v as u32).to_be();
        }
    }
}

// The element loops below run over whole steps, never looking at the
// chunk's element count: `aggregate` zeroes the staged payload from the
// count to the end of its last step, and a zero combines to zero with
// every op, never overflows, and changes no checksum (`~0 + 0` is the
// ones'-complement zero). A loop that stopped at the count would make the
// verifier walk the rest of the callback once per possible stop.

/// Runs `f` for `0..S`, in groups of `U` that the compiler unrolls.
#[inline(always)]
fn lanes_by<const S: usize, const U: usize>(mut f: impl FnMut(usize)) {
    for g in 0..S / U {
        for i in 0..U {
            f(g * U + i);
        }
    }
}

/// Runs `f` for `0..S`, in groups that the compiler unrolls: unrolling
/// `int32` by 8 halves its cost; `int64`'s saturating sum needs so many
/// registers that more than 2 at a time spill past the BPF stack.
#[inline(always)]
fn lanes<E: Elem, const S: usize>(f: impl FnMut(usize)) {
    if E::SIZE == 4 {
        lanes_by::<S, 8>(f)
    } else {
        lanes_by::<S, 2>(f)
    }
}

/// As [`lanes`], in smaller groups, for the loops that keep more values
/// live (more would spill registers to the stack).
#[inline(always)]
fn lanes_narrow<E: Elem, const S: usize>(f: impl FnMut(usize)) {
    if E::SIZE == 4 {
        lanes_by::<S, RESULT_UNROLL>(f)
    } else {
        lanes_by::<S, 2>(f)
    }
}

const RESULT_UNROLL: usize = 4;

/// `bpf_loop` callback: this CPU's partial (`dst`) := the step's elements.
unsafe extern "C" fn init_block<E: Elem, const S: usize>(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, input, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.dst + u, at) else {
        acc(ctx).failed = 1;
        return 1;
    };
    lanes::<E, S>(|j| {
        // SAFETY: a step's `S` elements fit both the payload and the unit.
        unsafe { *part.add(j) = get::<E>(input, j) as u64 };
    });
    0
}

/// `bpf_loop` callback: this CPU's partial (`dst`) combined with the
/// step's elements.
unsafe extern "C" fn combine_block<E: Elem, C: Combine, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, input, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.dst + u, at) else {
        acc(ctx).failed = 1;
        return 1;
    };
    let mut over = 0;
    lanes::<E, S>(|j| {
        // SAFETY: as in `init_block`.
        unsafe {
            let p = part.add(j);
            let (acc, o) = C::lane::<E>(*p as i64, get::<E>(input, j));
            *p = acc as u64;
            over |= o;
        }
    });
    acc(ctx).over |= over;
    0
}

/// `bpf_loop` callback over every step of every CPU's partial: step
/// `k % steps` of CPU `k / steps`'s partial, if it is one of `holders`,
/// combined into partial `dst`. One loop over all of them, so that the
/// verifier walks the callback from one call site.
unsafe extern "C" fn merge_block<E: Elem, C: Combine, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let c = unsafe { &*ctx.cast::<Blocks>() };
    if c.steps == 0 {
        return 1;
    }
    let (cpu, k) = (k / u64::from(c.steps), k % u64::from(c.steps));
    if cpu >= u64::from(MAX_CPUS) {
        return 1;
    }
    if c.holders & (1u64 << cpu) == 0 {
        return 0;
    }
    let src = c.cpu0 + cpu as u32 * c.stride;
    // SAFETY: as above.
    let Some((ctx, _, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let (Some(src), Some(dst)) = (unit(src + u, at), unit(ctx.dst + u, at)) else {
        acc(ctx).failed = 1;
        return 1;
    };
    let mut over = 0;
    lanes::<E, S>(|j| {
        // SAFETY: a step's `S` elements fit a unit.
        unsafe {
            let d = dst.add(j);
            let (acc, o) = C::lane::<E>(*d as i64, *src.add(j) as i64);
            *d = acc as u64;
            over |= o;
        }
    });
    acc(ctx).over |= over;
    0
}

/// The raw wire words of element `j` of `w`, added up (for checksums).
///
/// # Safety
/// Room for element `j` at `w`.
#[inline(always)]
unsafe fn wire_sum<E: Elem>(w: *const u32, j: usize) -> u64 {
    if E::SIZE == 4 {
        // SAFETY: in bounds (caller).
        u64::from(unsafe { *w.add(j) })
    } else {
        // SAFETY: as above.
        unsafe { u64::from(*w.add(2 * j)) + u64::from(*w.add(2 * j + 1)) }
    }
}

/// [`set`], returning the sum of the wire words stored.
///
/// # Safety
/// Room for element `j` at `w`.
#[inline(always)]
unsafe fn set_sum<E: Elem>(w: *mut u32, j: usize, v: i64) -> u64 {
    // SAFETY: in bounds (caller).
    unsafe {
        set::<E>(w, j, v);
        wire_sum::<E>(w, j)
    }
}

/// The checksum adjustment (in the host-order terms of
/// `xina_proto::checksum`) of replacing words that add up to `old` by words
/// that add up to `new`, both summed as raw big-endian words: a
/// ones'-complement sum of byte-swapped words is the byte-swapped sum, so
/// the loops need no byte swap and one addition per word and side.
#[inline(always)]
fn wire_adjustment(old: u64, new: u64) -> u64 {
    let (old, new) = (fold(old).swap_bytes(), fold(new).swap_bytes());
    u64::from(!old) + u64::from(new)
}

/// Elements per step of [`clamp_block`]: few, because its loop keeps two
/// sums and a clamp per element live, and the pass is rare.
const CLAMP_STEP: usize = 8;

/// `bpf_loop` callback: rewrites the step's elements of the staged payload
/// (the result as [`result_block`] wrote it) with the sums of partial `dst`
/// clamped to the element type, adding up the checksum adjustment. Run
/// only when the result loop found a sum out of the type's range (rare:
/// that loop writes the sums as they are), as a pass of its own, so that
/// the result loop has no branch on it.
unsafe extern "C" fn clamp_block<E: Elem>(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, out, u, at)) = (unsafe { step::<E, CLAMP_STEP>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.dst + u, at) else {
        acc(ctx).failed = 1;
        return 1;
    };
    let (mut old, mut new) = (0, 0);
    lanes_by::<CLAMP_STEP, CLAMP_STEP>(|j| {
        // SAFETY: a step's elements fit the payload and the unit.
        unsafe {
            let (v, _) = E::clamp_lane(*part.add(j) as i64);
            old += wire_sum::<E>(out, j);
            new += set_sum::<E>(out, j, v);
        }
    });
    acc(ctx).csum += wire_adjustment(old, new);
    0
}

/// `bpf_loop` callback: the step's result over the staged payload, adding
/// up the checksum adjustment. The result is this CPU's partial `dst` (if
/// `PART`) combined with the staged elements (if `IN`), clamped to the
/// element type; the sums stay in the partial, and a retransmission is
/// answered by this loop again over the completer's partial (`PART`
/// without `IN`, which only reads it).
///
/// Clamping costs more than everything else an element needs, and a sum
/// seldom leaves `int32`'s range, so the loop writes the sums as they are
/// and notes in `excess` whether any left it; only then does
/// [`clamp_block`] rewrite the result from the partial, in a pass of its
/// own.
unsafe extern "C" fn result_block<
    E: Elem,
    C: Combine,
    const S: usize,
    const IN: bool,
    const PART: bool,
>(
    k: u64,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, out, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.dst + u, at) else {
        acc(ctx).failed = 1;
        return 1;
    };
    let (mut old, mut new, mut excess, mut over) = (0, 0, 0, 0);
    lanes_narrow::<E, S>(|j| {
        // SAFETY: a step's `S` elements fit the payload and the unit.
        unsafe {
            old += wire_sum::<E>(out, j);
            let p = part.add(j);
            let acc = if PART && IN {
                let (acc, o) = C::lane::<E>(*p as i64, get::<E>(out, j));
                *p = acc as u64;
                over |= o;
                acc
            } else if PART {
                *p as i64
            } else {
                let acc = get::<E>(out, j);
                *p = acc as u64;
                acc
            };
            excess |= E::excess(acc);
            new += set_sum::<E>(out, j, acc);
        }
    });
    let acc = acc(ctx);
    acc.over |= over;
    acc.excess |= excess;
    acc.csum += wire_adjustment(old, new);
    0
}

/// Runs `callback` over the chunk's `steps` steps.
#[inline(always)]
fn each_step(callback: unsafe extern "C" fn(u64, *mut c_void) -> i64, ctx: &Blocks, steps: u32) {
    // SAFETY: `callback` is a static function taking a `Blocks`, and `ctx`
    // lives across the call.
    unsafe {
        bpf_loop(
            steps,
            callback as *mut c_void,
            (ctx as *const Blocks).cast_mut().cast(),
            0,
        )
    };
}

/// Writes the result loop's sums clamped to the element type over the
/// staged payload, if one of them left its range (the chunk overflowed);
/// whether one did.
#[inline(always)]
fn clamp_result<E: Elem, const S: usize>(blocks: &Blocks) -> bool {
    if !E::out_of_range(acc(blocks).excess) {
        return false;
    }
    let per_step = (S / CLAMP_STEP) as u32;
    each_step(clamp_block::<E>, blocks, blocks.steps * per_step);
    true
}

/// Zeroes the staged payload from element `count` to the end of its last
/// step, so the loops can run over whole steps (see above). The stores are
/// volatile so the compiler does not make a byte-at-a-time `memset` of them.
#[inline(always)]
fn clear_tail<E: Elem, const S: usize>(input: *mut WideBuf, count: u32) -> Result<u32, Error> {
    let steps = count.div_ceil(S as u32);
    if steps == 0 {
        return Err(Error::BadShape);
    }
    // Opaque, so that the compiler keeps the bound check on the very value
    // the verifier must see bounded (it merged two checks into one the
    // verifier could not follow).
    let last = slot::opaque(i64::from(steps - 1)) as usize;
    if last >= max_steps::<E, S>() {
        return Err(Error::BadShape);
    }
    if count as usize % S != 0 {
        let first = last * step_words::<E, S>() / 2;
        for i in 0..step_words::<E, S>() / 2 {
            // SAFETY: the last step lies inside the buffer (checked above).
            unsafe { input.cast::<u64>().add(first + i).write_volatile(0) };
        }
    }
    Ok(steps)
}

/// The wide aggregation program for element type `E` and op `C`
/// (tail-called from `xina_switch` once the contribution is admitted).
#[inline(always)]
pub fn aggregate<E: Elem, C: Combine, const S: usize>(
    ctx: &XdpContext,
    tally: &mut Tally,
) -> Result<Verdict, Verdict> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(Error::Internal)?;
    // SAFETY: this CPU's scratch entry, written by `xina_switch` just before
    // the tail call.
    let p = unsafe { (*scratch).pending };
    *tally = Tally::port_index(p.ingress_port);
    tally.set_job(p.job_counters);
    let len = p.count as usize * E::SIZE;
    if len == 0 || len > MAX_FRAME_PAYLOAD {
        return Err(Error::BadShape.into());
    }
    let cpus = XINA_CPUS.load();
    // SAFETY: a plain helper call.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if cpu >= cpus || cpu >= MAX_CPUS {
        return Err(Error::Internal.into());
    }
    let wide = WIDE_SCRATCH.get_ptr_mut(cpu).ok_or(Error::Internal)?;
    // SAFETY: this CPU's entry (nothing else runs on it meanwhile).
    let input = unsafe { &raw mut (*wide).input };
    // SAFETY: as above.
    let loop_acc = unsafe { &raw mut (*wide).acc };
    // SAFETY: as above.
    unsafe {
        loop_acc.write(LoopAcc {
            over: 0,
            excess: 0,
            failed: 0,
            csum: 0,
        });
    }
    let steps = clear_tail::<E, S>(input, p.count)?;
    // The whole payload is staged before the copy is touched, so a short
    // frame cannot leave a chunk half combined. One helper call moves it,
    // across the frame's fragments.
    // SAFETY: `input` has room for MAX_FRAME_PAYLOAD >= len bytes.
    let rc = unsafe {
        bpf_xdp_load_bytes(
            ctx.ctx,
            PAYLOAD as u32,
            input.cast(),
            packet::helper_len::<WIDE_LEN_MASK>(len),
        )
    };
    if rc != 0 {
        return Err(Error::Truncated.into());
    }
    let copy = SLOTS.get_ptr_mut(p.copy).ok_or(Error::BadSlot)?;
    let c = Contribution {
        seq: p.seq,
        count: p.count,
        rank_bit: 1u64 << (p.rank & 63),
        all_ranks: p.all_ranks,
        root: p.root,
        reuse: p.reuse,
    };
    let cpu_bit = 1u64 << cpu;
    // SAFETY: `copy` is a SLOTS value; `admit` calls no helper.
    let admitted = unsafe { locked(copy, |s| admit(s, &c, cpu_bit)) };
    let mut blocks = Blocks {
        input,
        acc: loop_acc,
        dst: unit_of(p.unit_base, p.job_copy, cpu, cpus, p.blocks),
        steps,
        holders: 0,
        cpu0: unit_of(p.unit_base, p.job_copy, 0, cpus, p.blocks),
        stride: p.blocks,
    };
    let (staged, holders) = match admitted {
        Admit::Init => {
            each_step(init_block::<E, S>, &blocks, steps);
            (false, 0)
        }
        Admit::Combine => {
            each_step(combine_block::<E, C, S>, &blocks, steps);
            (false, 0)
        }
        Admit::Complete { holders } => (true, holders),
        Admit::FromCache(mut r, holder) => {
            // The one CPU whose partial holds the result: the index of the
            // single bit `holder`.
            let at = holder.wrapping_sub(1).count_ones();
            if holder == 0 || at >= cpus {
                return Err(Error::Internal.into());
            }
            // The completer's partial holds the sums: written out as the
            // result was (the loop only reads a partial without `IN`).
            blocks.dst = unit_of(p.unit_base, p.job_copy, at, cpus, p.blocks);
            each_step(result_block::<E, C, S, false, true>, &blocks, steps);
            clamp_result::<E, S>(&blocks);
            let acc = acc(&blocks);
            if acc.failed != 0 {
                return Err(Error::Internal.into());
            }
            r.csum = acc.csum;
            store(ctx, input, len)?;
            switch::make_result(ctx, &r, Flags::FROM_CACHE)?;
            let action = switch::reply_to_sender(ctx, &p)?;
            return Ok(Verdict::new(Counter::ReplyFromCache, action));
        }
        Admit::Duplicate => return Err(Error::Duplicate.into()),
        Admit::Stale => return Err(Error::Stale.into()),
        Admit::BadShape => return Err(Error::BadShape.into()),
    };
    if acc(&blocks).failed != 0 {
        return Err(Error::Internal.into());
    }
    tally.count(Counter::Contributions);
    let holders = if staged {
        holders
    } else {
        let over = acc(&blocks).over;
        // SAFETY: as above.
        let (done, holders) = unsafe {
            locked(copy, |s| {
                s.landed |= c.rank_bit;
                if over != 0 {
                    s.flags |= u32::from(Flags::OVERFLOW);
                }
                if s.landed == c.all_ranks {
                    s.state = slot_state::COMPLETING;
                    (true, s.cpus)
                } else {
                    (false, 0)
                }
            })
        };
        if !done {
            return Ok(Verdict::new(Counter::Consumed, XDP_DROP));
        }
        // Recorded in the copy's flags.
        acc(&blocks).over = 0;
        holders
    };
    complete::<E, C, S>(ctx, &p, copy, &mut blocks, staged, holders, cpu_bit)
}

/// Completes a chunk whose ranks have all landed, in the partials of the
/// CPUs `holders` and, if `staged`, in the staged payload (the completing
/// contribution, which landed in no partial): merges the other CPUs'
/// partials into this CPU's (`blocks.dst`), which then holds the result,
/// writes the result over the staged payload, and hands the frame to the
/// fan-out.
#[inline(always)]
fn complete<E: Elem, C: Combine, const S: usize>(
    ctx: &XdpContext,
    p: &Pending,
    copy: *mut Slot,
    blocks: &mut Blocks,
    mut staged: bool,
    mut holders: u64,
    cpu_bit: u64,
) -> Result<Verdict, Verdict> {
    let steps = blocks.steps;
    if staged && holders != 0 && holders & cpu_bit == 0 {
        // Other CPUs hold partials, this one none: start one from the
        // staged payload, to merge theirs into.
        each_step(init_block::<E, S>, blocks, steps);
        staged = false;
        holders |= cpu_bit;
    }
    blocks.holders = holders & !cpu_bit;
    if blocks.holders != 0 {
        let cpus = XINA_CPUS.load().min(MAX_CPUS);
        each_step(merge_block::<E, C, S>, blocks, cpus * steps);
    }
    acc(blocks).csum = 0;
    match (staged, holders != 0) {
        (true, true) => each_step(result_block::<E, C, S, true, true>, blocks, steps),
        (true, false) => each_step(result_block::<E, C, S, true, false>, blocks, steps),
        (false, true) => each_step(result_block::<E, C, S, false, true>, blocks, steps),
        (false, false) => return Err(Error::Internal.into()),
    }
    let clamped = clamp_result::<E, S>(blocks);
    let acc = acc(blocks);
    if acc.failed != 0 {
        return Err(Error::Internal.into());
    }
    let over = acc.over | u64::from(clamped);
    // SAFETY: `copy` is a SLOTS value; the step calls no helper.
    let mut r = unsafe {
        locked(copy, |s| {
            if over != 0 {
                s.flags |= u32::from(Flags::OVERFLOW);
            }
            s.state = slot_state::COMPLETE;
            // From now on this CPU's partial is the result.
            s.cpus = cpu_bit;
            slot::Result {
                flags: s.flags as u8,
                bitmap: s.bitmap,
                root: s.root,
                csum: 0,
            }
        })
    };
    r.csum = acc.csum;
    store(ctx, blocks.input, p.count as usize * E::SIZE)?;
    switch::make_result(ctx, &r, 0)?;
    mark_for_fanout(ctx, p.job)?;
    Ok(Verdict::new(Counter::Completed, XDP_PASS))
}

/// Writes the staged payload back into the frame (one helper call).
#[inline(always)]
fn store(ctx: &XdpContext, input: *mut WideBuf, len: usize) -> Result<(), Error> {
    if len == 0 || len > MAX_FRAME_PAYLOAD {
        return Err(Error::BadShape);
    }
    // SAFETY: `input` holds MAX_FRAME_PAYLOAD >= len bytes; the frame has
    // `len` payload bytes (staged from it).
    let rc = unsafe {
        bpf_xdp_store_bytes(
            ctx.ctx,
            PAYLOAD as u32,
            input.cast(),
            packet::helper_len::<WIDE_LEN_MASK>(len),
        )
    };
    if rc != 0 {
        return Err(Error::Truncated);
    }
    Ok(())
}

/// Puts the fan-out mark into the frame's XDP metadata: the tc program on
/// this port's ingress clones a frame so marked to the job's members.
#[inline(always)]
fn mark_for_fanout(ctx: &XdpContext, job: u32) -> Result<(), Error> {
    let size = size_of::<FanoutMeta>() as i32;
    // SAFETY: grows the metadata area in front of the frame.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -size) } != 0 {
        return Err(Error::Internal);
    }
    let meta = ctx.metadata();
    if meta + size as usize > ctx.data() {
        return Err(Error::Internal);
    }
    // SAFETY: checked to lie in the metadata area just above.
    unsafe {
        *(meta as *mut FanoutMeta) = FanoutMeta {
            key: XINA_FANOUT_KEY.load(),
            job,
        };
    }
    Ok(())
}

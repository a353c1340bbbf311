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
//!   writes the result and marks the copy `COMPLETE`.
//! - **Blocks.** Partials and results live in the job's units of `UNITS`
//!   (one block of 128 elements each), so a job's memory follows its frame
//!   size; the element loops are `bpf_loop` callbacks over steps of `S`
//!   elements (a divisor of the block), verified once whatever the chunk's
//!   size. `S` is per program: the verifier walks every element of a step,
//!   and a branchy combine (`int64` saturation) needs smaller steps.
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
//! copy is `COMPLETE`, then answered from the result units, which do not
//! change again until the copy is reused.

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
    counters::Counter,
    frame::{BLOCK_ELEMS, unit_of},
    maps::{FanoutMeta, Slot, slot_state},
};

use crate::{
    error::{Error, Verdict},
    maps::{
        MAX_CPUS, SCRATCH, SLOTS, Tally, UNITS, WIDE_SCRATCH, WideBuf, XINA_CPUS, XINA_FANOUT_KEY,
    },
    packet::PAYLOAD,
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
    /// A repeat of a finished chunk: answered from the result.
    FromCache(slot::Result),
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
            return Admit::FromCache(slot::Result {
                flags: s.flags as u8,
                bitmap: s.bitmap,
                root: s.root,
                csum: 0,
            });
        }
        return Admit::Duplicate;
    }
    s.bitmap |= c.rank_bit;
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

/// The context of the block loops, handed to `bpf_loop` callbacks.
#[repr(C)]
struct Blocks {
    /// This CPU's staged payload.
    input: *mut WideBuf,
    /// First unit read.
    src: u32,
    /// First unit written.
    dst: u32,
    /// Elements in the chunk: the loops stop there.
    n: u32,
    /// Non-zero once a value saturated or had to be clamped.
    over: u32,
    /// Non-zero if a unit was missing (a control-plane fault).
    failed: u32,
    _pad: u32,
    /// Checksum adjustment from the staged payload to what replaced it.
    csum: u64,
}

/// Most steps of `S` elements of `E` in a staged payload.
const fn max_steps<E: Elem, const S: usize>() -> usize {
    MAX_FRAME_PAYLOAD / (E::SIZE * S)
}

/// Where step `k` of `S` elements starts: the unit (relative to the first)
/// and the element within it. `S` divides [`BLOCK_ELEMS`], so a step never
/// spans two units.
const fn step_at<const S: usize>(k: usize) -> (u32, usize) {
    ((k * S / BLOCK_ELEMS) as u32, k * S % BLOCK_ELEMS)
}

/// The start of every callback: the loop's context, the step's index, its
/// unit (relative to the first) and its element within the unit; `None`
/// past the payload's capacity, where the loop stops.
///
/// # Safety
/// `ctx` is the `Blocks` the caller passed to `bpf_loop`.
#[inline(always)]
unsafe fn step<'a, E: Elem, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> Option<(&'a mut Blocks, usize, u32, usize)> {
    let k = k as usize;
    if k >= max_steps::<E, S>() {
        return None;
    }
    let (u, at) = step_at::<S>(k);
    // SAFETY: as the caller promises.
    Some((unsafe { &mut *ctx.cast::<Blocks>() }, k, u, at))
}

/// The unit at `index`, or `None`.
#[inline(always)]
fn unit(index: u32) -> Option<*mut u64> {
    UNITS.get_ptr_mut(index).map(|u| u.cast::<u64>())
}

/// Element `i` of the staged payload.
///
/// # Safety
/// `i` below the payload's capacity in elements of `E`.
#[inline(always)]
unsafe fn get<E: Elem>(input: *const u32, i: usize) -> i64 {
    if E::SIZE == 4 {
        // SAFETY: in bounds (caller).
        i64::from(u32::from_be(unsafe { *input.add(i) }) as i32)
    } else {
        // SAFETY: as above.
        let hi = u64::from(u32::from_be(unsafe { *input.add(2 * i) }));
        // SAFETY: as above.
        let lo = u64::from(u32::from_be(unsafe { *input.add(2 * i + 1) }));
        ((hi << 32) | lo) as i64
    }
}

/// Stores `v` as the wire words of element `j` at `out`, and the checksum
/// adjustment from the words it replaces.
///
/// # Safety
/// Room for element `j` at `out`.
#[inline(always)]
unsafe fn put<E: Elem>(out: *mut u32, j: usize, v: i64) -> u64 {
    if E::SIZE == 4 {
        let new = v as i32 as u32;
        // SAFETY: in bounds (caller).
        let old = u32::from_be(unsafe { *out.add(j) });
        // SAFETY: as above.
        unsafe { *out.add(j) = new.to_be() };
        u64::from(!old) + u64::from(new)
    } else {
        let (hi, lo) = ((v >> 32) as u32, v as u32);
        // SAFETY: as above.
        let (old_hi, old_lo) = unsafe {
            (
                u32::from_be(*out.add(2 * j)),
                u32::from_be(*out.add(2 * j + 1)),
            )
        };
        // SAFETY: as above.
        unsafe {
            *out.add(2 * j) = hi.to_be();
            *out.add(2 * j + 1) = lo.to_be();
        }
        u64::from(!old_hi) + u64::from(hi) + u64::from(!old_lo) + u64::from(lo)
    }
}

/// `bpf_loop` callback: this CPU's partial (`src`) := block `b` of the
/// payload.
unsafe extern "C" fn init_block<E: Elem, const S: usize>(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, k, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.src + u) else {
        ctx.failed = 1;
        return 1;
    };
    let input = ctx.input.cast::<u32>();
    for j in 0..S {
        let i = k * S + j;
        if i >= ctx.n as usize {
            return 1;
        }
        // SAFETY: `i` is below the payload's capacity (`k` checked above);
        // `at + j` below BLOCK_ELEMS.
        unsafe { *part.add(at + j) = get::<E>(input, i) as u64 };
    }
    0
}

/// `bpf_loop` callback: this CPU's partial (`src`) combined with block `b`
/// of the payload.
unsafe extern "C" fn combine_block<E: Elem, C: Combine, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, k, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(part) = unit(ctx.src + u) else {
        ctx.failed = 1;
        return 1;
    };
    let input = ctx.input.cast::<u32>();
    let mut over = 0;
    for j in 0..S {
        let i = k * S + j;
        if i >= ctx.n as usize {
            break;
        }
        // SAFETY: as in `init_block`.
        unsafe {
            let p = part.add(at + j);
            let (acc, o) = C::combine::<E>(*p as i64, get::<E>(input, i));
            *p = acc as u64;
            over |= u32::from(o);
        }
    }
    ctx.over |= over;
    0
}

/// `bpf_loop` callback: block `b` of partial `dst` combined with that of
/// partial `src` (another CPU's).
unsafe extern "C" fn merge_block<E: Elem, C: Combine, const S: usize>(
    k: u64,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, k, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let (Some(src), Some(dst)) = (unit(ctx.src + u), unit(ctx.dst + u)) else {
        ctx.failed = 1;
        return 1;
    };
    let mut over = 0;
    for j in 0..S {
        if k * S + j >= ctx.n as usize {
            break;
        }
        // SAFETY: `at + j` is below BLOCK_ELEMS, the values of a unit.
        unsafe {
            let d = dst.add(at + j);
            let (acc, o) = C::combine::<E>(*d as i64, *src.add(at + j) as i64);
            *d = acc as u64;
            over |= u32::from(o);
        }
    }
    ctx.over |= over;
    0
}

/// `bpf_loop` callback: block `b` of the result, from partial `src` clamped
/// to the element type, into the result units (`dst`) and over the staged
/// payload, in wire order; adds up the checksum adjustment.
unsafe extern "C" fn result_block<E: Elem, const S: usize>(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, k, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let (Some(part), Some(res)) = (unit(ctx.src + u), unit(ctx.dst + u)) else {
        ctx.failed = 1;
        return 1;
    };
    // SAFETY: step `k` lies inside the payload (checked above), and its
    // elements at `at..at + S` inside the unit.
    let (out, part, res) = unsafe {
        (
            ctx.input.cast::<u32>().add(k * S * E::SIZE / 4),
            part.add(at),
            res.cast::<u32>().add(at * E::SIZE / 4),
        )
    };
    let (mut over, mut csum) = (0, 0);
    for j in 0..S {
        if k * S + j >= ctx.n as usize {
            break;
        }
        // SAFETY: `out`, `part` and `res` have room for S elements.
        unsafe {
            let (v, o) = E::clamp(*part.add(j) as i64);
            over |= u32::from(o);
            csum += put::<E>(out, j, v);
            put::<E>(res, j, v);
        }
    }
    ctx.over |= over;
    ctx.csum += csum;
    0
}

/// `bpf_loop` callback: block `b` of the stored result (`src`) over the
/// staged payload; adds up the checksum adjustment.
unsafe extern "C" fn cache_block<E: Elem, const S: usize>(k: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Blocks` the caller passed to `bpf_loop`.
    let Some((ctx, k, u, at)) = (unsafe { step::<E, S>(k, ctx) }) else {
        return 1;
    };
    let Some(res) = unit(ctx.src + u) else {
        ctx.failed = 1;
        return 1;
    };
    // SAFETY: as in `result_block`.
    let (out, res) = unsafe {
        (
            ctx.input.cast::<u32>().add(k * S * E::SIZE / 4),
            res.cast::<u32>().add(at * E::SIZE / 4),
        )
    };
    let mut csum = 0;
    for j in 0..S {
        if k * S + j >= ctx.n as usize {
            break;
        }
        // SAFETY: `res` and `out` have room for S elements.
        unsafe { csum += put::<E>(out, j, get::<E>(res, j)) };
    }
    ctx.csum += csum;
    0
}

/// Runs `callback` over the chunk's `steps` steps.
#[inline(always)]
fn each_step(
    callback: unsafe extern "C" fn(u64, *mut c_void) -> i64,
    ctx: &mut Blocks,
    steps: u32,
) {
    // SAFETY: `callback` is a static function taking a `Blocks`, and `ctx`
    // lives across the call.
    unsafe {
        bpf_loop(
            steps,
            callback as *mut c_void,
            (ctx as *mut Blocks).cast(),
            0,
        )
    };
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
    // The whole payload is staged before the copy is touched, so a short
    // frame cannot leave a chunk half combined. One helper call moves it,
    // across the frame's fragments.
    // SAFETY: `input` has room for MAX_FRAME_PAYLOAD >= len bytes.
    let rc = unsafe { bpf_xdp_load_bytes(ctx.ctx, PAYLOAD as u32, input.cast(), len as u32) };
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
    let mine = unit_of(p.unit_base, p.job_copy, cpu, cpus, p.blocks);
    let result = unit_of(p.unit_base, p.job_copy, cpus, cpus, p.blocks);
    let steps = p.count.div_ceil(S as u32);
    let mut blocks = Blocks {
        input,
        src: mine,
        dst: mine,
        n: p.count,
        over: 0,
        failed: 0,
        _pad: 0,
        csum: 0,
    };
    match admitted {
        Admit::Init => each_step(init_block::<E, S>, &mut blocks, steps),
        Admit::Combine => each_step(combine_block::<E, C, S>, &mut blocks, steps),
        Admit::FromCache(mut r) => {
            blocks.src = result;
            each_step(cache_block::<E, S>, &mut blocks, steps);
            if blocks.failed != 0 {
                return Err(Error::Internal.into());
            }
            r.csum = blocks.csum;
            store(ctx, input, len)?;
            switch::make_result(ctx, &r, Flags::FROM_CACHE)?;
            let action = switch::reply_to_sender(ctx, &p)?;
            return Ok(Verdict::new(Counter::ReplyFromCache, action));
        }
        Admit::Duplicate => return Err(Error::Duplicate.into()),
        Admit::Stale => return Err(Error::Stale.into()),
        Admit::BadShape => return Err(Error::BadShape.into()),
    }
    if blocks.failed != 0 {
        return Err(Error::Internal.into());
    }
    tally.count(Counter::Contributions);
    let over = blocks.over;
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
    // Every rank has landed: merge the other CPUs' partials into ours.
    for other in 0..MAX_CPUS {
        if other >= cpus {
            break;
        }
        if other == cpu || holders & (1u64 << other) == 0 {
            continue;
        }
        blocks.src = unit_of(p.unit_base, p.job_copy, other, cpus, p.blocks);
        blocks.dst = mine;
        each_step(merge_block::<E, C, S>, &mut blocks, steps);
    }
    // `over` keeps what merging saturated (int64 sums), for the result.
    blocks.src = mine;
    blocks.dst = result;
    blocks.csum = 0;
    each_step(result_block::<E, S>, &mut blocks, steps);
    if blocks.failed != 0 {
        return Err(Error::Internal.into());
    }
    let over = blocks.over;
    // SAFETY: as above.
    let mut r = unsafe {
        locked(copy, |s| {
            if over != 0 {
                s.flags |= u32::from(Flags::OVERFLOW);
            }
            s.state = slot_state::COMPLETE;
            slot::Result {
                flags: s.flags as u8,
                bitmap: s.bitmap,
                root: s.root,
                csum: 0,
            }
        })
    };
    r.csum = blocks.csum;
    store(ctx, input, len)?;
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
    let rc = unsafe { bpf_xdp_store_bytes(ctx.ctx, PAYLOAD as u32, input.cast(), len as u32) };
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

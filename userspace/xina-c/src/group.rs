//! Multicast group members: reliable broadcast and allgather.

use std::ffi::c_void;

use xina_host::{Error, GroupParams, GroupWorker, Stats};

use super::{
    ANY, Failure, XinaGroup, XinaGroupParams, XinaStats, XinaStatus, address, config, elements,
    hand_out, null, record, run, text, write_stats,
};

/// Creates a multicast group member from `params` and binds its socket.
///
/// # Safety
/// As [`xina_worker_new`], for an [`XinaGroupParams`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_group_new(
    params: *const XinaGroupParams,
    out: *mut *mut XinaGroup,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a valid XinaGroupParams (the caller's promise).
        let p = unsafe { params.as_ref() }.ok_or_else(|| null("params"))?;
        if out.is_null() {
            return Err(null("out"));
        }
        let (params, give_up_ms) = group_from(p)?;
        // SAFETY: the caller's promise for the params' strings.
        let bind = unsafe { text(p.bind_addr, "bind_addr") }?;
        let bind = bind.map_or(Ok(ANY), |b| address(b, "bind_addr"))?;
        let member = GroupWorker::new(params, bind, config(give_up_ms))?;
        // SAFETY: not null and valid for a write (the caller's promise).
        unsafe { hand_out(XinaGroup::of(member), out) };
        Ok(())
    })
}

/// A group member's checked values, and its give-up time.
pub(crate) fn group_from(p: &XinaGroupParams) -> Result<(GroupParams, u32), Failure> {
    // SAFETY: the caller's promise for the params' strings.
    let switch =
        unsafe { text(p.switch_addr, "switch_addr") }?.ok_or_else(|| null("switch_addr"))?;
    let params = GroupParams {
        group: p.group,
        rank: p.rank,
        fan_in: p.fan_in,
        bytes_per_packet: p.bytes_per_packet,
        window: p.window,
        switch: address(switch, "switch_addr")?,
    };
    Ok((params, p.give_up_ms))
}

/// Frees a group member's handle. Null is ignored.
///
/// # Safety
/// `group` is null or a handle from [`xina_group_new`] not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_group_free(group: *mut XinaGroup) {
    if !group.is_null() {
        // SAFETY: a live handle made by Box::into_raw (the caller's promise).
        drop(unsafe { Box::from_raw(group) });
    }
}

/// # Safety
/// `group` is null or a live handle used by no other thread; `data` as
/// [`elements`] for bytes.
unsafe fn group_call(
    group: *mut XinaGroup,
    data: *mut c_void,
    len: usize,
    call: impl FnOnce(&mut GroupWorker, &mut [u8]) -> Result<Stats, Error>,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a live, unshared handle (the caller's promise).
        let g = unsafe { group.as_mut() }.ok_or_else(|| null("group"))?;
        // SAFETY: the caller's promise for `data` and `len`.
        let bytes = unsafe { elements::<u8>(data, len) }?;
        let stats = call(&mut g.member, bytes);
        record(&mut g.last, &mut g.total, stats)
    })
}

/// Broadcasts `len` bytes at `data` from `root` to every member: the root's
/// buffer is sent, every other member's is overwritten.
///
/// # Safety
/// `group` is null or a live handle used by no other thread; `data` is null
/// (with `len` 0) or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_broadcast(
    group: *mut XinaGroup,
    root: u8,
    data: *mut c_void,
    len: usize,
) -> XinaStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { group_call(group, data, len, |m, d| m.broadcast(root, d)) }
}

/// Gathers every member's part: `len` (a multiple of the members) bytes at
/// `data` in `fan_in` equal parts, member `r` sending part `r`; afterwards
/// every member holds all parts.
///
/// # Safety
/// As [`xina_broadcast`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_allgather(
    group: *mut XinaGroup,
    data: *mut c_void,
    len: usize,
) -> XinaStatus {
    // SAFETY: the caller's promise, passed on.
    unsafe { group_call(group, data, len, GroupWorker::allgather) }
}

/// As [`xina_worker_stats`], for a group member.
///
/// # Safety
/// As [`xina_worker_stats`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xina_group_stats(
    group: *const XinaGroup,
    last: *mut XinaStats,
    total: *mut XinaStats,
) -> XinaStatus {
    run(|| {
        // SAFETY: null or a live handle (the caller's promise).
        let g = unsafe { group.as_ref() }.ok_or_else(|| null("group"))?;
        // SAFETY: null or valid for writes (the caller's promise).
        unsafe { write_stats(g.last, g.total, last, total) };
        Ok(())
    })
}

//! `xina_worker_from_env`: a member from `XINA_*` variables, and a bad one
//! named. Its own test binary: it changes the process's environment, which
//! no other thread may read meanwhile.

use std::ffi::CStr;
use std::ptr;

use xina_c::{
    XinaStatus, xina_last_error, xina_worker_free, xina_worker_from_env, xina_worker_local_addr,
};

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(xina_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn set(name: &str, value: &str) {
    // SAFETY: this binary's only test runs on one thread; nothing else
    // reads the environment meanwhile.
    unsafe { std::env::set_var(name, value) };
}

#[test]
fn a_member_comes_from_the_environment_and_a_bad_variable_is_named() {
    for (name, value) in [
        ("XINA_JOB", "12"),
        ("XINA_RANK", "1"),
        ("XINA_FAN_IN", "4"),
        ("XINA_ELEMS_PER_PACKET", "256"),
        ("XINA_SLOTS", "8"),
        ("XINA_SWITCH", "127.0.0.1:9"),
        ("XINA_BIND", "127.0.0.1:0"),
        ("XINA_TYPE", "float32"),
        ("XINA_OP", "max"),
    ] {
        set(name, value);
    }
    let mut w = ptr::null_mut();
    // SAFETY: a valid out pointer.
    let status = unsafe { xina_worker_from_env(&raw mut w) };
    assert_eq!(status, XinaStatus::Ok, "{}", last_error());
    let mut buf = [0; 32];
    // SAFETY: a live handle and a 32-byte buffer.
    let status = unsafe { xina_worker_local_addr(w, buf.as_mut_ptr(), buf.len()) };
    assert_eq!(status, XinaStatus::Ok);
    // SAFETY: the handle, freed once.
    unsafe { xina_worker_free(w) };
    for (name, bad, expect) in [
        ("XINA_RANK", "four", "XINA_RANK"),
        ("XINA_FAN_IN", "300", "XINA_FAN_IN"),
        ("XINA_SWITCH", "switch:1", "XINA_SWITCH"),
        ("XINA_TYPE", "float64", "XINA_TYPE"),
        ("XINA_MODE", "gather", "XINA_MODE"),
        ("XINA_GIVE_UP_MS", "-1", "XINA_GIVE_UP_MS"),
    ] {
        let good = std::env::var(name).ok();
        set(name, bad);
        let mut w = ptr::null_mut();
        // SAFETY: a valid out pointer.
        let status = unsafe { xina_worker_from_env(&raw mut w) };
        assert_eq!(status, XinaStatus::InvalidArgument, "{name}={bad}");
        assert!(
            last_error().contains(expect),
            "{name}={bad}: {}",
            last_error()
        );
        assert!(w.is_null());
        match good {
            Some(v) => set(name, &v),
            // SAFETY: as in `set`.
            None => unsafe { std::env::remove_var(name) },
        }
    }
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var("XINA_SWITCH") };
    let mut w = ptr::null_mut();
    // SAFETY: a valid out pointer.
    let status = unsafe { xina_worker_from_env(&raw mut w) };
    assert_eq!(status, XinaStatus::InvalidArgument);
    assert!(
        last_error().contains("XINA_SWITCH: not set"),
        "{}",
        last_error()
    );
}

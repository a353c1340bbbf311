//! The C interface (`userspace/xina-c`) through the XDP switch, with real
//! traffic between network namespaces (root needed): four ranks call
//! `xina_allreduce` as a C program would, on int32 and float32 buffers of
//! one int32 sum job, and every rank gets the exact sums (the float sums
//! within the library's bound).

use std::ffi::{CStr, CString};
use std::net::SocketAddrV4;
use std::ptr;

use xina_c::{
    XinaJobParams, XinaMode, XinaOp, XinaStats, XinaStatus, XinaType, xina_allreduce,
    xina_last_error, xina_worker_free, xina_worker_new, xina_worker_stats,
};
use xina_proto::XINA_UDP_PORT;
use xina_testbed::scenario::{self, AllreduceSpec, JOB_ID, WORKER_PORT};
use xina_testbed::topology::Star;

const WORKERS: usize = 4;
const ELEMENTS: usize = 100_003;

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(xina_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// What one rank's calls returned: the int32 and float32 results.
type Outcome = Result<(Vec<i32>, Vec<f32>, XinaStats), String>;

fn rank(star: &Star, spec: &AllreduceSpec, rank: usize) -> Outcome {
    let switch =
        CString::new(SocketAddrV4::new(star.service_ip(), XINA_UDP_PORT).to_string()).unwrap();
    let bind =
        CString::new(SocketAddrV4::new(star.worker(rank).ip, WORKER_PORT).to_string()).unwrap();
    let params = XinaJobParams {
        job: JOB_ID,
        rank: u8::try_from(rank).unwrap(),
        fan_in: u8::try_from(WORKERS).unwrap(),
        elems_per_packet: spec.elems_per_packet,
        slots: spec.slots,
        op: XinaOp::Sum as u32,
        elem_type: XinaType::Int32 as u32,
        mode: XinaMode::Allreduce as u32,
        switch_addr: switch.as_ptr(),
        bind_addr: bind.as_ptr(),
        give_up_ms: 10_000,
    };
    let mut w = ptr::null_mut();
    // SAFETY: valid params with NUL-terminated strings and an out pointer.
    if unsafe { xina_worker_new(&params, &raw mut w) } != XinaStatus::Ok {
        return Err(last_error());
    }
    let mut ints = scenario::worker_data(7, rank, ELEMENTS);
    let mut floats: Vec<f32> = ints.iter().map(|&v| v as f32 / 1024.0).collect();
    let mut stats = XinaStats::default();
    // SAFETY: a live handle used by this thread only; the buffers hold
    // ELEMENTS elements of the types named; a valid stats pointer.
    let outcome = unsafe {
        if xina_allreduce(
            w,
            ints.as_mut_ptr().cast(),
            ELEMENTS,
            XinaType::Int32 as u32,
        ) != XinaStatus::Ok
        {
            Err(format!("int32: {}", last_error()))
        } else if xina_allreduce(
            w,
            floats.as_mut_ptr().cast(),
            ELEMENTS,
            XinaType::Float32 as u32,
        ) != XinaStatus::Ok
        {
            Err(format!("float32: {}", last_error()))
        } else {
            let _ = xina_worker_stats(w, ptr::null_mut(), &raw mut stats);
            Ok(())
        }
    };
    // SAFETY: the handle, freed once.
    unsafe { xina_worker_free(w) };
    outcome.map(|()| (ints, floats, stats))
}

#[test]
fn ranks_calling_the_c_interface_allreduce_exactly_through_the_switch() {
    let spec = AllreduceSpec {
        workers: WORKERS,
        elements: ELEMENTS,
        elems_per_packet: 360,
        slots: 16,
        ..Default::default()
    };
    let star = Star::build(WORKERS).expect("the star");
    let config = scenario::star_config(&star, &spec);
    let _switch = scenario::start_switch(&star, &config).expect("the switch");
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|r| {
                let (star, spec) = (&star, &spec);
                scope.spawn(move || {
                    star.worker(r)
                        .ns()
                        .run(|| rank(star, spec, r))
                        .unwrap_or_else(|e| Err(e.to_string()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let inputs: Vec<Vec<i32>> = (0..WORKERS)
        .map(|r| scenario::worker_data(7, r, ELEMENTS))
        .collect();
    let sums: Vec<i32> = (0..ELEMENTS)
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect();
    for (r, outcome) in outcomes.into_iter().enumerate() {
        let (ints, floats, stats) = outcome.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(ints == sums, "rank {r}: int32 sums differ");
        let worst = floats
            .iter()
            .zip(&sums)
            .map(|(f, &s)| (f64::from(*f) - f64::from(s) / 1024.0).abs())
            .fold(0.0, f64::max);
        // Inputs below 2^10 after scaling, 4 ranks: the fixed-point bound
        // (`xina_host::float::sum_error_bound`) is far below this, which
        // also covers rounding the exact sum to the nearest f32.
        assert!(worst < 1e-2, "rank {r}: float32 sums off by up to {worst}");
        assert_eq!(stats.calls, 2, "rank {r}");
        println!("rank {r}: {stats:?}");
    }
    star.teardown().expect("tearing the star down");
}

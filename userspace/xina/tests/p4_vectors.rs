//! The shared test vectors (`p4/vectors/*.json`) on the XDP dataplane, under
//! `BPF_PROG_TEST_RUN`. `p4/run_vectors.py` runs the same vectors on `BMv2`.
//!
//! How the XDP side is driven: each step's frame goes through `xina_switch`.
//! `XDP_DROP` is no output; `XDP_PASS` is the frame, which must be unchanged,
//! handed to the host; `XDP_REDIRECT` is either the broadcast of a completed
//! chunk — the devmap sends a copy to every switch port and runs the egress
//! program on each, modelled by running `xina_egress_test` once per port of
//! the configuration — or a reply from a slot, which goes through the egress
//! program of the sender's port. The counters tell which (`completed` or
//! `reply_from_cache`). Ports are given fake ifindexes (100 + position):
//! nothing is attached, so none has to exist. Needs root.

use std::path::Path;

use xina::{
    Dataplane, LoadOptions,
    dataplane::xdp_action::{DROP, PASS, REDIRECT},
    p4::vectors::{self, Output, Port, Vector},
};
use xina_proto::counters::Counter;

fn counters(dp: &Dataplane) -> [u64; Counter::COUNT] {
    dp.counters().expect("counters").0
}

fn run(v: &Vector) -> Result<(), String> {
    let mut dp = Dataplane::load(LoadOptions {
        slot_pool: v.config.switch.slot_pool,
        debug: false,
        ..LoadOptions::default()
    })
    .map_err(|e| format!("load (are you root?): {e}"))?;
    let jobs = v
        .config
        .resolve(|name| Some((v.fake_ifindex(name)?, v.port_macs[name])))
        .map_err(|e| e.to_string())?;
    for job in &jobs {
        dp.install_job(job).map_err(|e| e.to_string())?;
    }
    for (i, s) in v.steps.iter().enumerate() {
        let at = format!("{} step {i} ({})", v.name, s.about);
        let before = counters(&dp);
        let out = dp.test_run_switch(&s.frame, 0).map_err(|e| e.to_string())?;
        let mid = counters(&dp);
        let changed = |c: Counter| mid[c as usize] - before[c as usize];
        let mut outputs = Vec::new();
        match out.action {
            DROP => {}
            PASS => outputs.push(Output {
                port: Port::Host,
                frame: out.frame.clone(),
            }),
            REDIRECT => {
                let ports: Vec<String> = if changed(Counter::Completed) == 1 {
                    v.config.switch.ports.clone()
                } else if changed(Counter::ReplyFromCache) == 1 {
                    vec![s.in_port.clone()]
                } else {
                    return Err(format!(
                        "{at}: a redirect that is neither a result nor a reply"
                    ));
                };
                for port in ports {
                    let ifindex = v.fake_ifindex(&port).expect("a configured port");
                    let copy = dp
                        .test_run_egress(&out.frame, ifindex)
                        .map_err(|e| e.to_string())?;
                    match copy.action {
                        PASS => outputs.push(Output {
                            port: Port::Switch(port),
                            frame: copy.frame,
                        }),
                        DROP => {}
                        a => return Err(format!("{at}: egress to {port} returned action {a}")),
                    }
                }
            }
            a => return Err(format!("{at}: xina_switch returned action {a}")),
        }
        outputs.sort();
        if outputs != s.outputs {
            return Err(format!(
                "{at}: frames out differ\n  got:  {}\n  want: {}",
                describe(&outputs),
                describe(&s.outputs)
            ));
        }
        let after = counters(&dp);
        for c in Counter::ALL {
            let got = after[c as usize] - before[c as usize];
            let want = s.counters[c as usize] + s.xdp_counters[c as usize];
            if got != want {
                return Err(format!(
                    "{at}: counter {} changed by {got}, want {want}",
                    c.name()
                ));
            }
        }
    }
    Ok(())
}

fn describe(outputs: &[Output]) -> String {
    let parts: Vec<String> = outputs
        .iter()
        .map(|o| format!("{:?}: {}", o.port, vectors::hex(&o.frame)))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[test]
fn the_shared_vectors_pass_on_the_xdp_dataplane() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../p4/vectors");
    let all = vectors::load_dir(&dir).expect("vectors load");
    let mut failures = Vec::new();
    let mut ran = 0;
    for v in &all {
        if !v.runs_on("xdp") {
            continue;
        }
        ran += v.steps.len();
        if let Err(e) = run(v) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 40, "only {ran} steps ran");
}

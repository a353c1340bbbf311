//! `xina p4` as an operator uses it: entries for the P4 twin from the same
//! configuration file `xina run` reads, and clear errors for what the P4
//! program cannot hold. No root needed.

use std::{path::PathBuf, process::Command};

const XINA: &str = env!("CARGO_BIN_EXE_xina");

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../p4/vectors")
}

fn port_macs() -> Vec<String> {
    (0..4)
        .flat_map(|i| {
            [
                "--port-mac".to_owned(),
                format!("sp{i}=02:5a:00:00:00:0{}", i + 1),
            ]
        })
        .collect()
}

fn emit(config: &str, extra: &[String]) -> std::process::Output {
    Command::new(XINA)
        .args(["p4", "emit", "--config"])
        .arg(vectors_dir().join(config))
        .args(extra)
        .output()
        .expect("run xina")
}

#[test]
fn emit_writes_cli_commands_and_p4runtime_json_from_a_job_file() {
    let out = emit("switch.toml", &port_macs());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // Job 7: counters 0, 3 ranks, sum, int32, allreduce, 8 elements, slots
    // 0..2, reuse 4, all ranks 0b111, group 1.
    assert_eq!(
        text.lines().next(),
        Some(
            "table_add XinaIngress.admission.jobs XinaIngress.admission.job 7 => 0 3 0 0 0 8 0 2 4 7 1"
        )
    );
    assert!(text.contains(
        "table_add XinaEgress.egress.port_members XinaEgress.egress.address 13 3 => \
         02:77:00:00:00:04 02:5a:00:00:00:04 10.77.0.4 5003 0\n"
    ));
    assert_eq!(
        text.matches("mc_mgrp_create").count(),
        9,
        "one group per job"
    );

    let mut args = port_macs();
    args.extend(["--format".to_owned(), "json".to_owned()]);
    let out = emit("switch.toml", &args);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["multicast_group_entries"].as_array().unwrap().len(), 9);
    assert_eq!(json["table_entries"][0]["action_params"]["reuse"], 4);
}

#[test]
fn emit_names_the_field_it_cannot_use() {
    let mut macs = port_macs();
    macs.truncate(6); // sp0..sp2 only; no interface sp3 exists here
    let out = emit("switch.toml", &macs);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("switch.ports[3]: no MAC address for port sp3"),
        "{err}"
    );

    let out = emit("wide.toml", &port_macs()[..4]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("jobs[0].elems_per_packet: 64 (the P4 program has 32 aggregator lanes"),
        "{err}"
    );

    let out = emit(
        "switch.toml",
        &["--port-mac".to_owned(), "sp9=02:00:00:00:00:01".to_owned()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--port-mac sp9=02:00:00:00:00:01: sp9 is not one of switch.ports"),
        "{err}"
    );
}

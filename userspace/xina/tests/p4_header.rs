//! One source of truth for the header: the P4 program's declarations
//! (`p4/headers.p4`, `p4/types.p4`, `p4/config.p4`) are parsed and checked
//! against `xina-proto`, so the two dataplanes cannot drift apart: every
//! field of `xina_h` by name, bit offset and width (and by decoding a header
//! that `Repr::emit` wrote with the P4 layout), the header's ASCII diagram,
//! and every protocol constant, counter index and size the P4 program
//! shares with the Rust side.

use std::{collections::BTreeMap, path::PathBuf};

use xina::p4;
use xina_proto::{
    DType, Flags, Kind, MAGIC, Op, Packet, Repr, VERSION, XINA_UDP_PORT,
    counters::Counter,
    header::{HEADER_LEN, SLOT_VERSION_BIT, field},
    maps::{self, mode, slot_state},
    net::{ETH_P_IPV4, IPPROTO_UDP},
};

fn p4_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../p4")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Code without `//` comments.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `typedef bit<N> name;` declarations.
fn typedefs(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for l in code(text).lines() {
        let l = l.trim();
        if let Some(rest) = l.strip_prefix("typedef ") {
            let (ty, name) = rest
                .trim_end_matches(';')
                .split_once(char::is_whitespace)
                .unwrap();
            out.insert(
                name.trim().to_owned(),
                bit_width(ty, &BTreeMap::new()).unwrap(),
            );
        }
    }
    out
}

fn bit_width(ty: &str, typedefs: &BTreeMap<String, usize>) -> Option<usize> {
    if let Some(n) = ty.strip_prefix("bit<").and_then(|r| r.strip_suffix('>')) {
        return n.parse().ok();
    }
    typedefs.get(ty).copied()
}

/// The fields of `header NAME { ... }` as (name, width), in order.
fn header_fields(
    text: &str,
    name: &str,
    typedefs: &BTreeMap<String, usize>,
) -> Vec<(String, usize)> {
    let code = code(text);
    let start = code
        .find(&format!("header {name} {{"))
        .unwrap_or_else(|| panic!("headers.p4 declares no header {name}"));
    let body = &code[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(';')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let mut parts = d.split_whitespace();
            let ty = parts.next().unwrap();
            let field = parts.next().unwrap_or_else(|| panic!("{d:?}"));
            let width = bit_width(ty, typedefs).unwrap_or_else(|| panic!("unknown type {ty}"));
            (field.to_owned(), width)
        })
        .collect()
}

/// `const bit<N> NAME = VALUE;` declarations, and `#define NAME VALUE`.
fn constants(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in code(text).lines() {
        let l = l.trim();
        let (name, value) = if let Some(rest) = l.strip_prefix("const ") {
            let (lhs, rhs) = rest.trim_end_matches(';').split_once('=').unwrap();
            (
                lhs.split_whitespace().last().unwrap().to_owned(),
                rhs.trim().to_owned(),
            )
        } else if let Some(rest) = l.strip_prefix("#define ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            (name.to_owned(), value.to_owned())
        } else {
            continue;
        };
        let parsed = value
            .strip_prefix("0x")
            .map_or_else(|| value.parse(), |hex| u64::from_str_radix(hex, 16));
        if let Ok(v) = parsed {
            out.insert(name, v);
        }
    }
    out
}

/// Every field of the Rust header: its name (the `field` constant's, lower
/// case), bit offset and width.
fn rust_fields() -> Vec<(&'static str, usize, usize)> {
    let byte = |at: usize| (at * 8, 8);
    let range = |r: field::Field| (r.start * 8, r.len() * 8);
    // The version bit is the slot word's most significant bit.
    let slot = range(field::SLOT);
    assert_eq!(SLOT_VERSION_BIT, 1 << (slot.1 - 1));
    let rows = [
        ("magic", byte(field::MAGIC)),
        ("version", byte(field::VERSION)),
        ("kind", byte(field::KIND)),
        ("flags", byte(field::FLAGS)),
        ("job", range(field::JOB)),
        ("rank", byte(field::RANK)),
        ("fan_in", byte(field::FAN_IN)),
        ("op", byte(field::OP)),
        ("dtype", byte(field::DTYPE)),
        ("seq", range(field::SEQ)),
        ("slot_version", (slot.0, 1)),
        ("slot", (slot.0 + 1, slot.1 - 1)),
        ("count", range(field::COUNT)),
        ("exponent", byte(field::EXPONENT)),
        ("root", byte(field::ROOT)),
        ("bitmap", range(field::BITMAP)),
    ];
    rows.iter().map(|(n, (o, w))| (*n, *o, *w)).collect()
}

fn p4_layout() -> Vec<(String, usize, usize)> {
    let types = typedefs(&p4_file("types.p4"));
    let mut at = 0;
    header_fields(&p4_file("headers.p4"), "xina_h", &types)
        .into_iter()
        .map(|(name, width)| {
            let row = (name, at, width);
            at += width;
            row
        })
        .collect()
}

#[test]
fn xina_h_has_the_rust_header_fields_in_order_with_their_widths() {
    let p4 = p4_layout();
    let rust = rust_fields();
    let p4_rows: Vec<(&str, usize, usize)> =
        p4.iter().map(|(n, o, w)| (n.as_str(), *o, *w)).collect();
    assert_eq!(
        p4_rows, rust,
        "p4/headers.p4 xina_h (name, bit offset, width) differs from xina-proto"
    );
    let bits: usize = p4.iter().map(|(_, _, w)| w).sum();
    assert_eq!(bits, HEADER_LEN * 8, "xina_h is {bits} bits");
}

/// Extracts bits `[offset, offset + width)` of `bytes` (big-endian) as a number.
fn bits(bytes: &[u8], offset: usize, width: usize) -> u64 {
    (offset..offset + width).fold(0, |acc, i| {
        let bit = (bytes[i / 8] >> (7 - i % 8)) & 1;
        (acc << 1) | u64::from(bit)
    })
}

#[test]
fn a_header_written_by_xina_proto_reads_back_through_the_p4_layout() {
    let repr = Repr {
        kind: Kind::AggResult,
        flags: Flags(Flags::OVERFLOW | Flags::NOTICE),
        job: 0x0102_0304,
        rank: 5,
        fan_in: 6,
        op: Op::Min,
        dtype: DType::I64,
        seq: 0x0a0b_0c0d,
        slot: 0x1234_5678,
        slot_version: true,
        count: 0x0102,
        exponent: -3,
        root: 4,
        bitmap: 0x8000_0000_0000_0021,
    };
    let mut buf = vec![0u8; HEADER_LEN];
    repr.emit(&mut Packet::new_unchecked(&mut buf));
    let want: BTreeMap<&str, u64> = [
        ("magic", u64::from(MAGIC)),
        ("version", u64::from(VERSION)),
        ("kind", Kind::AggResult as u64),
        ("flags", u64::from(Flags::OVERFLOW | Flags::NOTICE)),
        ("job", 0x0102_0304),
        ("rank", 5),
        ("fan_in", 6),
        ("op", Op::Min as u64),
        ("dtype", DType::I64 as u64),
        ("seq", 0x0a0b_0c0d),
        ("slot_version", 1),
        ("slot", 0x1234_5678),
        ("count", 0x0102),
        ("exponent", 0xfd),
        ("root", 4),
        ("bitmap", 0x8000_0000_0000_0021),
    ]
    .into_iter()
    .collect();
    for (name, offset, width) in p4_layout() {
        let got = bits(&buf, offset, width);
        assert_eq!(
            Some(&got),
            want.get(name.as_str()),
            "field {name} read through the P4 layout"
        );
    }
}

/// The lines of the diagram: those starting with `+-` or `|`.
fn diagram(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix(prefix))
        .map(str::trim)
        .filter(|l| l.starts_with("+-") || l.starts_with('|') || l.starts_with("0 1 2"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_header_diagram_is_the_same_in_rust_and_p4() {
    let rust_src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ebpf/xina-proto/src/header.rs"),
    )
    .unwrap();
    let rust = diagram(&rust_src, "//!");
    let p4 = diagram(&p4_file("headers.p4"), "//");
    assert!(rust.len() > 15, "found the Rust diagram");
    assert_eq!(p4, rust);
}

#[test]
fn protocol_constants_counters_and_sizes_match() {
    let c = constants(&p4_file("types.p4"));
    let cfg = constants(&p4_file("config.p4"));
    let mut want: BTreeMap<String, u64> = [
        ("ETHERTYPE_IPV4", u64::from(ETH_P_IPV4)),
        ("IPPROTO_UDP", u64::from(IPPROTO_UDP)),
        ("XINA_UDP_PORT", u64::from(XINA_UDP_PORT)),
        ("XINA_MAGIC", u64::from(MAGIC)),
        ("XINA_VERSION", u64::from(VERSION)),
        ("KIND_AGG_DATA", Kind::AggData as u64),
        ("KIND_AGG_RESULT", Kind::AggResult as u64),
        ("KIND_MCAST_DATA", Kind::McastData as u64),
        ("KIND_MCAST_ACK", Kind::McastAck as u64),
        ("KIND_CONTROL", Kind::Control as u64),
        ("FLAG_RETRANSMIT", u64::from(Flags::RETRANSMIT)),
        ("FLAG_OVERFLOW", u64::from(Flags::OVERFLOW)),
        ("FLAG_FROM_CACHE", u64::from(Flags::FROM_CACHE)),
        ("FLAG_NOTICE", u64::from(Flags::NOTICE)),
        ("OP_SUM", Op::Sum as u64),
        ("OP_MAX", Op::Max as u64),
        ("OP_MIN", Op::Min as u64),
        ("DTYPE_I32", DType::I32 as u64),
        ("DTYPE_I64", DType::I64 as u64),
        ("MODE_ALLREDUCE", u64::from(mode::ALLREDUCE)),
        ("MODE_REDUCE", u64::from(mode::REDUCE)),
        ("MODE_REDUCE_SCATTER", u64::from(mode::REDUCE_SCATTER)),
        ("SLOT_EMPTY", u64::from(slot_state::EMPTY)),
        ("SLOT_PARTIAL", u64::from(slot_state::PARTIAL)),
        ("SLOT_COMPLETE", u64::from(slot_state::COMPLETE)),
        ("COUNTER_COUNT", Counter::COUNT as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for counter in Counter::ALL {
        want.insert(
            format!("COUNTER_{}", counter.name().to_uppercase()),
            counter as u64,
        );
    }
    for (name, value) in &want {
        assert_eq!(c.get(name), Some(value), "types.p4: {name}");
    }
    // No P4 counter the Rust side does not know.
    for name in c.keys().filter(|n| n.starts_with("COUNTER_")) {
        assert!(
            want.contains_key(name),
            "types.p4: {name} is not a xina-proto counter"
        );
    }

    let counters = Counter::COUNT as u64;
    let sizes = [
        ("ELEMS", u64::from(p4::ELEMS)),
        ("SLOT_POOL", u64::from(p4::SLOT_POOL)),
        ("SLOT_COPIES", 2 * u64::from(p4::SLOT_POOL)),
        ("CPU_PORT", u64::from(p4::CPU_PORT)),
        ("MAX_PORTS", u64::from(maps::MAX_PORTS)),
        ("MAX_JOBS", u64::from(maps::MAX_JOBS)),
        ("MAX_MEMBERS", u64::from(maps::MAX_MEMBERS)),
        ("JOB_COUNTER_CELLS", u64::from(maps::MAX_JOBS) * counters),
        (
            "PORT_COUNTER_CELLS",
            (u64::from(maps::MAX_PORTS) + 1) * counters,
        ),
    ];
    for (name, value) in sizes {
        assert_eq!(cfg.get(name), Some(&value), "config.p4: {name}");
    }
    assert_eq!(p4::MAX_PORTS as u64, u64::from(maps::MAX_PORTS));
    assert!(usize::from(p4::ELEMS) <= xina_proto::MAX_ELEMS);
}

// headers.p4: the headers the xina dataplane parses, in wire order.
//
// The xina header is defined once, in Rust (ebpf/xina-proto/src/header.rs);
// this file mirrors it field by field, and userspace/xina/tests/p4_header.rs
// parses the declarations below and fails if a name, width or position
// drifts from xina-proto.

#ifndef XINA_HEADERS_P4
#define XINA_HEADERS_P4

#include "types.p4"
#include "config.p4"

header ethernet_h {
    mac_addr_t dst;
    mac_addr_t src;
    bit<16>    ether_type;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      tos;
    bit<16>     total_len;
    bit<16>     identification;
    bit<16>     frag;          // 3 flag bits and the 13-bit fragment offset
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     checksum;
    ipv4_addr_t src;
    ipv4_addr_t dst;
}

// IPv4 options (ihl > 5): parsed only to find the UDP header behind them.
header ipv4_options_h {
    varbit<320> options;
}

header udp_h {
    bit<16> sport;
    bit<16> dport;
    bit<16> len;
    bit<16> checksum;
}

// The xina header, carried right after UDP on XINA_UDP_PORT.
//
//  0                   1                   2                   3
//  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
// +---------------+---------------+---------------+---------------+
// |     magic     |    version    |     kind      |     flags     |  0
// +---------------+---------------+---------------+---------------+
// |                            job id                             |  4
// +---------------+---------------+---------------+---------------+
// |     rank      |    fan-in     |      op       |     dtype     |  8
// +---------------+---------------+---------------+---------------+
// |                        sequence number                        | 12
// +---------------+---------------+---------------+---------------+
// |V|                         slot index                          | 16
// +---------------+---------------+---------------+---------------+
// |         element count         |   exponent    |     root      | 20
// +---------------+---------------+---------------+---------------+
// |                                                               | 24
// +                     rank bitmap (64 bits)                     +
// |                                                               | 28
// +---------------+---------------+---------------+---------------+
// |         payload: `count` elements of `dtype`, big-endian  ...   32
//
// Field names are xina-proto's accessor names (`Packet::job`, `::seq`, ...);
// the slot word is split into the version bit `slot_version` and `slot`.
header xina_h {
    bit<8>  magic;
    bit<8>  version;
    bit<8>  kind;
    bit<8>  flags;
    job_id_t job;
    rank_t  rank;
    bit<8>  fan_in;
    bit<8>  op;
    bit<8>  dtype;
    seq_t   seq;
    bit<1>  slot_version;
    bit<31> slot;
    bit<16> count;
    bit<8>  exponent;
    rank_t  root;
    bitmap_t bitmap;
}

// One payload element of an int32 chunk.
header elem32_h {
    bit<32> value;
}

// One payload element of an int64 chunk.
header elem64_h {
    bit<64> value;
}

struct headers_t {
    ethernet_h          ethernet;
    ipv4_h              ipv4;
    ipv4_options_h      ipv4_options;
    udp_h               udp;
    xina_h              xina;
    elem32_h[ELEMS]     i32;
    elem64_h[ELEMS]     i64;
}

#endif

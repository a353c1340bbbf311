// parser.p4: Ethernet / IPv4 / UDP / xina and the payload elements, and the
// deparser. Mirrors `packet::parse` in ebpf/xina-ebpf/src/packet.rs: what is
// not an IPv4 UDP datagram to XINA_UDP_PORT is left for the ingress control
// to pass; a parser error (a frame too short for a header) is not a drop by
// itself: v1model hands the packet to ingress with `parser_error` set, and
// the ingress control decides from how far the parser got (`meta.to_xina`,
// `meta.xina_parsed`), exactly as XDP decides from where its bounds check
// failed.

#ifndef XINA_PARSER_P4
#define XINA_PARSER_P4

#if ELEMS != 32
#error "parse_payload's masks select 1..32 elements: update them with ELEMS"
#endif

parser XinaParser(packet_in pkt,
                  out headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t std) {
    state start {
        meta.to_xina = false;
        meta.xina_parsed = false;
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    // IPv4 carrying UDP, and not a non-first fragment (which has no UDP
    // header to recognise); anything else is passed.
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.version, hdr.ipv4.protocol, hdr.ipv4.frag[12:0]) {
            (4, IPPROTO_UDP, 0): parse_ihl;
            default: accept;
        }
    }

    state parse_ihl {
        transition select(hdr.ipv4.ihl) {
            5: parse_udp;
            0 &&& 0xc: accept;      // 0..3: not a valid header
            4: accept;
            default: parse_ipv4_options;
        }
    }

    state parse_ipv4_options {
        pkt.extract(hdr.ipv4_options, ((bit<32>)hdr.ipv4.ihl - 5) * 32);
        transition parse_udp;
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dport) {
            XINA_UDP_PORT: parse_to_xina;
            default: accept;
        }
    }

    // Addressed to xina. Fragments and IP options are dropped by ingress
    // before the xina header is looked at (as in XDP), so it is not parsed.
    state parse_to_xina {
        meta.to_xina = true;
        transition select(hdr.ipv4.frag[13:13], hdr.ipv4.ihl) {
            (0, 5): parse_xina;
            default: accept;
        }
    }

    state parse_xina {
        pkt.extract(hdr.xina);
        meta.xina_parsed = true;
        meta.remaining = hdr.xina.count;
        transition select(hdr.xina.magic, hdr.xina.version) {
            (XINA_MAGIC, XINA_VERSION): parse_payload;
            default: accept;
        }
    }

    // `count` elements of `dtype`; a count of 0 or beyond the lanes is left
    // unparsed for ingress to refuse (it is outside every job's 1..elements).
    // The masks spell 1..ELEMS: 0..31 (0 taken by the first row) and 32.
    state parse_payload {
        transition select(hdr.xina.count, hdr.xina.dtype) {
            (0, _): accept;
            (0 &&& 0xffe0, DTYPE_I32): parse_i32;
            (ELEMS, DTYPE_I32): parse_i32;
            (0 &&& 0xffe0, DTYPE_I64): parse_i64;
            (ELEMS, DTYPE_I64): parse_i64;
            default: accept;
        }
    }

    state parse_i32 {
        pkt.extract(hdr.i32.next);
        meta.remaining = meta.remaining - 1;
        transition select(meta.remaining) {
            0: accept;
            default: parse_i32;
        }
    }

    state parse_i64 {
        pkt.extract(hdr.i64.next);
        meta.remaining = meta.remaining - 1;
        transition select(meta.remaining) {
            0: accept;
            default: parse_i64;
        }
    }
}

// Checksums are updated incrementally by the controls (checksum.p4), as in
// XDP: a contribution's checksums are not verified (see ebpf/README.md,
// Limits) and nothing is recomputed from scratch.
control XinaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control XinaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control XinaDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.ipv4_options);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.xina);
        pkt.emit(hdr.i32);
        pkt.emit(hdr.i64);
    }
}

#endif

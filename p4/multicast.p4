// multicast.p4: what happens to the packet after the slot step, the P4 twin
// of the end of `switch::aggregate` (ebpf/xina-ebpf/src/switch.rs).
//
//   outcome     packet                                       goes to
//   ----------  -------------------------------------------  ----------------------------
//   completed   the result (make_result)                     the job's multicast group:
//                                                            one copy per member port
//   from cache  the stored result, FROM_CACHE (make_result)  the port it came in on
//   passed      unchanged                                    CPU_PORT (the host's stack)
//   otherwise   -                                            dropped
//
// XDP broadcasts a result to every port and its egress program drops the
// copies for ports without a member of the job (`egress_not_member`); here
// the packet replication engine copies it to the job's member ports only
// (the group `xina p4 emit` creates per job), so that counter stays 0.
// Each copy is addressed to its member by the egress control (egress.p4).

#ifndef XINA_MULTICAST_P4
#define XINA_MULTICAST_P4

control Multicast(inout headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t std) {
    // switch.rs `make_result`: kind, flags and bitmap of a result; addresses
    // and ports swapped (the sender becomes the destination, the switch's
    // address the source), which leaves both checksums unchanged; the UDP
    // checksum adjusted for the rest (the lanes added the payload's share).
    action make_result(bit<8> extra_flags) {
        bit<32> word0 = hdr.xina.magic ++ hdr.xina.version ++ hdr.xina.kind ++ hdr.xina.flags;
        hdr.xina.kind = KIND_AGG_RESULT;
        hdr.xina.flags = meta.result_flags | extra_flags;
        bit<32> new0 = hdr.xina.magic ++ hdr.xina.version ++ hdr.xina.kind ++ hdr.xina.flags;
        bit<64> acc = meta.csum + csum_replace32(word0, new0)
                    + csum_replace32(hdr.xina.bitmap[63:32], meta.result_bitmap[63:32])
                    + csum_replace32(hdr.xina.bitmap[31:0], meta.result_bitmap[31:0]);
        hdr.xina.bitmap = meta.result_bitmap;

        ipv4_addr_t src = hdr.ipv4.src;
        hdr.ipv4.src = hdr.ipv4.dst;
        hdr.ipv4.dst = src;
        hdr.udp.dport = hdr.udp.sport;
        hdr.udp.sport = XINA_UDP_PORT;
        hdr.udp.checksum = csum_apply_udp(hdr.udp.checksum, acc);
    }

    apply {
        if (meta.outcome == OUTCOME_COMPLETED) {
            make_result(0);
            std.mcast_grp = meta.mcast_grp;
        } else if (meta.outcome == OUTCOME_FROM_CACHE) {
            make_result(FLAG_FROM_CACHE);
            // Back to the sender, who sits behind the ingress port; egress.p4
            // addresses it (and makes it a notice if the sender is not the
            // chunk's root in reduce and reduce-scatter).
            mac_addr_t dst = hdr.ethernet.dst;
            hdr.ethernet.dst = hdr.ethernet.src;
            hdr.ethernet.src = dst;
            std.egress_spec = std.ingress_port;
        } else if (meta.counter == COUNTER_PASSED) {
            std.egress_spec = CPU_PORT;
        } else {
            mark_to_drop(std);
        }
    }
}

#endif

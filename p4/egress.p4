// egress.p4: one result copy per member port, the P4 twin of `try_egress`
// in ebpf/xina-ebpf/src/egress.rs: keep the copy only if the job has a
// member behind this port, address it to that member (MACs, IP, UDP port,
// checksums), or turn it into a completion notice.

#ifndef XINA_EGRESS_P4
#define XINA_EGRESS_P4

// Frame length of a notice: Ethernet, IPv4, UDP and the xina header.
const bit<32> NOTICE_FRAME_LEN = 14 + 20 + 8 + 32;

// (`Egress` itself is a type name of v1model.p4, hence `EgressRewrite`; its
// instance in xina.p4 is `egress`.)
control EgressRewrite(inout headers_t hdr,
                      inout metadata_t meta,
                      inout standard_metadata_t std) {
    mac_addr_t member_mac = 0;
    mac_addr_t port_mac = 0;
    ipv4_addr_t member_ip = 0;
    bit<16> member_port = 0;
    rank_t member_rank = 0;

    // XDP's PORT_MEMBERS map: which member of a job sits behind a port.
    action address(mac_addr_t mac, mac_addr_t switch_mac, ipv4_addr_t ip,
                   bit<16> udp_port, rank_t rank) {
        member_mac = mac;
        port_mac = switch_mac;
        member_ip = ip;
        member_port = udp_port;
        member_rank = rank;
    }

    action not_member() {
        meta.counter = COUNTER_EGRESS_NOT_MEMBER;
        mark_to_drop(std);
    }

    table port_members {
        key = {
            hdr.xina.job: exact;
            std.egress_port: exact;
        }
        actions = { address; not_member; }
        default_action = not_member();
        size = MAX_MEMBERS;
    }

    // switch.rs `make_notice`: no payload, count 0, NOTICE; IPv4 length and
    // checksum fixed; the UDP checksum dropped (0: none, legal in IPv4),
    // since recomputing it would mean summing the payload that was cut.
    action make_notice() {
        hdr.xina.flags = hdr.xina.flags | FLAG_NOTICE;
        hdr.xina.count = 0;
        hdr.i32.pop_front(ELEMS);
        hdr.i64.pop_front(ELEMS);
        hdr.udp.checksum = 0;
        hdr.udp.len = 8 + 32;
        bit<16> total = hdr.ipv4.total_len;
        hdr.ipv4.total_len = 20 + 8 + 32;
        hdr.ipv4.checksum = csum_apply(hdr.ipv4.checksum,
                                       csum_replace16(total, hdr.ipv4.total_len));
        // Whatever followed the header in the frame goes too.
        truncate(NOTICE_FRAME_LEN);
    }

    apply {
        meta.counter = 0xff;
        if (meta.outcome != OUTCOME_COMPLETED && meta.outcome != OUTCOME_FROM_CACHE) {
            return;
        }
        if (port_members.apply().hit) {
            if (meta.mode != MODE_ALLREDUCE && member_rank != hdr.xina.root) {
                make_notice();
                meta.counter = COUNTER_NOTICES_SENT;
            } else {
                meta.counter = COUNTER_RESULTS_SENT;
            }
            hdr.ethernet.dst = member_mac;
            hdr.ethernet.src = port_mac;

            bit<64> ip_acc = csum_replace32(hdr.ipv4.dst, member_ip);
            hdr.ipv4.dst = member_ip;
            hdr.ipv4.checksum = csum_apply(hdr.ipv4.checksum, ip_acc);

            // The UDP checksum covers the pseudo-header's destination too.
            bit<64> udp_acc = ip_acc + csum_replace16(hdr.udp.dport, member_port);
            hdr.udp.dport = member_port;
            hdr.udp.checksum = csum_apply_udp(hdr.udp.checksum, udp_acc);
        }
    }
}

#endif

// switch.p4: admission of a contribution, the P4 twin of `try_switch` in
// ebpf/xina-ebpf/src/switch.rs. The checks run in the same order, so a frame
// that breaks several rules is counted under the same reason by both
// dataplanes:
//
//   not xina (parser stopped before XINA_UDP_PORT)       passed
//   more-fragments bit set                               drop_fragment
//   IPv4 options                                         drop_bad_header
//   xina header cut short                                drop_truncated
//   bad magic or version                                 drop_bad_header
//   kind is not aggregation data                         drop_unsupported_kind
//   job not in `jobs`                                    drop_unknown_job
//   rank >= fan-in, not in `members`, or another sender  drop_not_member
//   dtype / op / fan-in / count / root against the job   drop_bad_shape
//   payload cut short                                    drop_truncated
//   UDP or IPv4 length not header + payload              drop_bad_shape
//   slot >= the job's slot count                         drop_bad_slot
//
// A frame that passes every check is admitted: `meta.copy` names its slot
// copy and the slot step (bitmap.p4) runs.

#ifndef XINA_SWITCH_P4
#define XINA_SWITCH_P4

control Switch(inout headers_t hdr,
               inout metadata_t meta,
               in standard_metadata_t std,
               out bool admitted) {
    bool member_ok = false;

    // ------------------------------------------------------------ jobs
    // XDP's JOBS map: everything the switch needs to know about a job,
    // precomputed by the control plane (`xina p4 emit`).
    action job(bit<16> counters, bit<8> fan_in, bit<8> op, bit<8> dtype,
               bit<8> mode, bit<16> elems, bit<32> slot_base,
               bit<32> slot_count, bit<32> reuse, bitmap_t all_ranks,
               bit<16> mcast_grp) {
        meta.job_known = true;
        meta.job_counters = counters;
        meta.fan_in = fan_in;
        meta.op = op;
        meta.dtype = dtype;
        meta.mode = mode;
        meta.elems = elems;
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.reuse = reuse;
        meta.all_ranks = all_ranks;
        meta.mcast_grp = mcast_grp;
    }

    table jobs {
        key = { hdr.xina.job: exact; }
        actions = { job; NoAction; }
        default_action = NoAction();
        size = MAX_JOBS;
    }

    // ------------------------------------------------------------ members
    // XDP's MEMBERS map: the address and UDP port a rank must send from.
    action member(ipv4_addr_t ip, bit<16> udp_port) {
        member_ok = hdr.ipv4.src == ip && hdr.udp.sport == udp_port;
    }

    table members {
        key = {
            hdr.xina.job: exact;
            hdr.xina.rank: exact;
        }
        actions = { member; NoAction; }
        default_action = NoAction();
        size = MAX_MEMBERS;
    }

    action verdict(bit<8> reason) {
        meta.counter = reason;
    }

    apply {
        admitted = false;
        meta.job_known = false;
        if (!meta.to_xina) {
            verdict(COUNTER_PASSED);
            return;
        }
        if (hdr.ipv4.frag[13:13] == 1) {
            verdict(COUNTER_DROP_FRAGMENT);
            return;
        }
        if (hdr.ipv4.ihl != 5) {
            verdict(COUNTER_DROP_BAD_HEADER);
            return;
        }
        if (!meta.xina_parsed) {
            verdict(COUNTER_DROP_TRUNCATED);
            return;
        }
        if (hdr.xina.magic != XINA_MAGIC || hdr.xina.version != XINA_VERSION) {
            verdict(COUNTER_DROP_BAD_HEADER);
            return;
        }
        if (hdr.xina.kind != KIND_AGG_DATA) {
            verdict(COUNTER_DROP_UNSUPPORTED_KIND);
            return;
        }
        jobs.apply();
        if (!meta.job_known) {
            verdict(COUNTER_DROP_UNKNOWN_JOB);
            return;
        }
        if (hdr.xina.rank >= meta.fan_in) {
            verdict(COUNTER_DROP_NOT_MEMBER);
            return;
        }
        members.apply();
        if (!member_ok) {
            verdict(COUNTER_DROP_NOT_MEMBER);
            return;
        }
        if (hdr.xina.dtype != meta.dtype || hdr.xina.op != meta.op
                || hdr.xina.fan_in != meta.fan_in || hdr.xina.count == 0
                || hdr.xina.count > meta.elems || hdr.xina.root >= meta.fan_in) {
            verdict(COUNTER_DROP_BAD_SHAPE);
            return;
        }
        // The parser extracted `count` elements unless the frame ended first.
        if (std.parser_error != error.NoError) {
            verdict(COUNTER_DROP_TRUNCATED);
            return;
        }
        // The datagram must be exactly the header and the payload.
        bit<16> payload = hdr.xina.count << 2;
        if (meta.dtype == DTYPE_I64) {
            payload = hdr.xina.count << 3;
        }
        if (hdr.udp.len != 8 + 32 + payload || hdr.ipv4.total_len != 20 + 8 + 32 + payload) {
            verdict(COUNTER_DROP_BAD_SHAPE);
            return;
        }
        if ((bit<32>)hdr.xina.slot >= meta.slot_count) {
            verdict(COUNTER_DROP_BAD_SLOT);
            return;
        }
        meta.copy = ((meta.slot_base + (bit<32>)hdr.xina.slot) << 1) | (bit<32>)hdr.xina.slot_version;
        meta.rank_bit = (bitmap_t)1 << hdr.xina.rank;
        admitted = true;
    }
}

#endif

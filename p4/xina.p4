// xina.p4: the xina dataplane for the v1model architecture (BMv2
// simple_switch), the P4_16 twin of the XDP programs in ebpf/xina-ebpf.
//
//   XinaParser    parser.p4       Ethernet / IPv4 / UDP / xina / elements
//   XinaIngress
//     admission   switch.p4       jobs, members, shape: admit or drop
//     bitmap      bitmap.p4       the slot state machine
//     lane_0..31  aggregator.p4   one element per lane: init, combine, out
//     result_flags bitmap.p4      the copy's overflow flag
//     multicast   multicast.p4    result to the job's group, reply, pass
//     counters    counters.p4     switch-wide, per-job and per-port counters
//   XinaEgress
//     egress      egress.p4       address each copy to its member, or notice
//     counters    counters.p4
//   XinaDeparser  parser.p4
//
// Build: p4c-bm2-ss --std p4-16 -o xina.json p4/xina.p4 (see p4/README.md).

#include <core.p4>
#include <v1model.p4>

#include "types.p4"
#include "config.p4"
#include "headers.p4"
#include "checksum.p4"
#include "parser.p4"
#include "switch.p4"
#include "bitmap.p4"
#include "aggregator.p4"
#include "multicast.p4"
#include "egress.p4"
#include "counters.p4"

// ELEMS lanes, each with its own register (one per element, as hardware).
#define LANES(X) \
    X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  \
    X(8)  X(9)  X(10) X(11) X(12) X(13) X(14) X(15) \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) \
    X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)
#define DECLARE_LANE(i) Aggregator() lane_##i;
#define APPLY_LANE(i) lane_##i.apply(hdr.i32[i], hdr.i64[i], meta);

control XinaIngress(inout headers_t hdr,
                    inout metadata_t meta,
                    inout standard_metadata_t std) {
    Switch() admission;
    Bitmap() bitmap;
    LANES(DECLARE_LANE)
    ResultFlags() result_flags;
    Multicast() multicast;
    Counters() counters;

    apply {
        meta.outcome = OUTCOME_NONE;
        meta.lane_op = LANE_KEEP;
        meta.emit = false;
        meta.overflow = 0;
        meta.csum = 0;
        meta.contributed = false;
        bool admitted;
        admission.apply(hdr, meta, std, admitted);
        if (admitted) {
            bitmap.apply(hdr, meta);
            LANES(APPLY_LANE)
            result_flags.apply(meta);
            // The outcome counters of slot.rs's `Outcome`.
            if (meta.outcome == OUTCOME_CONSUMED) {
                meta.counter = COUNTER_CONSUMED;
                meta.contributed = true;
            } else if (meta.outcome == OUTCOME_COMPLETED) {
                meta.counter = COUNTER_COMPLETED;
                meta.contributed = true;
            } else if (meta.outcome == OUTCOME_FROM_CACHE) {
                meta.counter = COUNTER_REPLY_FROM_CACHE;
            } else if (meta.outcome == OUTCOME_DUPLICATE) {
                meta.counter = COUNTER_DROP_DUPLICATE;
            } else if (meta.outcome == OUTCOME_STALE) {
                meta.counter = COUNTER_DROP_STALE;
            } else {
                meta.counter = COUNTER_DROP_BAD_SHAPE;
            }
        }
        multicast.apply(hdr, meta, std);
        counters.apply(meta, std.ingress_port, true);
    }
}

control XinaEgress(inout headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t std) {
    EgressRewrite() egress;
    Counters() counters;

    apply {
        egress.apply(hdr, meta, std);
        counters.apply(meta, std.egress_port, false);
    }
}

V1Switch(XinaParser(),
         XinaVerifyChecksum(),
         XinaIngress(),
         XinaEgress(),
         XinaComputeChecksum(),
         XinaDeparser()) main;

// types.p4: type names and the protocol's constants.
//
// Every constant here mirrors xina-proto (ebpf/xina-proto/src): the header
// values (lib.rs, header.rs), the delivery modes and slot states (maps.rs)
// and the counter indices (counters.rs). userspace/xina/tests/p4_header.rs
// checks each `const` below against its Rust twin.

#ifndef XINA_TYPES_P4
#define XINA_TYPES_P4

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<32> job_id_t;
typedef bit<8>  rank_t;
typedef bit<32> seq_t;
typedef bit<64> bitmap_t;
typedef bit<9>  port_t;      // v1model's port width

// ---------------------------------------------------------------- protocol
const bit<16> ETHERTYPE_IPV4 = 0x0800;   // net::ETH_P_IPV4
const bit<8>  IPPROTO_UDP    = 17;       // net::IPPROTO_UDP
const bit<16> XINA_UDP_PORT  = 19860;    // XINA_UDP_PORT
const bit<8>  XINA_MAGIC     = 0x58;     // MAGIC ('X')
const bit<8>  XINA_VERSION   = 1;        // VERSION

// Kind (header.rs)
const bit<8> KIND_AGG_DATA   = 1;
const bit<8> KIND_AGG_RESULT = 2;
const bit<8> KIND_MCAST_DATA = 3;
const bit<8> KIND_MCAST_ACK  = 4;
const bit<8> KIND_CONTROL    = 5;

// Flags (header.rs)
const bit<8> FLAG_RETRANSMIT = 0x01;
const bit<8> FLAG_OVERFLOW   = 0x02;
const bit<8> FLAG_FROM_CACHE = 0x04;
const bit<8> FLAG_NOTICE     = 0x08;
const bit<8> FLAG_MISSING    = 0x10;   // multicast; not handled by this program
const bit<8> FLAG_SYNC       = 0x20;   // multicast; not handled by this program

// Op (header.rs)
const bit<8> OP_SUM = 0;
const bit<8> OP_MAX = 1;
const bit<8> OP_MIN = 2;

// DType (header.rs)
const bit<8> DTYPE_I32 = 0;
const bit<8> DTYPE_I64 = 1;
const bit<8> DTYPE_BYTES = 2;   // multicast payload; not handled by this program

// Delivery modes (maps.rs, mod mode)
const bit<8> MODE_ALLREDUCE      = 0;
const bit<8> MODE_REDUCE         = 1;
const bit<8> MODE_REDUCE_SCATTER = 2;
const bit<8> MODE_MULTICAST      = 3;   // groups: XDP only, see README.md
const bit<8> MODE_ANYCAST        = 4;

// Slot states (maps.rs, mod slot_state)
const bit<8> SLOT_EMPTY    = 0;
const bit<8> SLOT_PARTIAL  = 1;
const bit<8> SLOT_COMPLETE = 2;

// Counter indices (counters.rs, enum Counter)
const bit<8> COUNTER_RX_PACKETS            = 0;
const bit<8> COUNTER_PASSED                = 1;
const bit<8> COUNTER_CONTRIBUTIONS         = 2;
const bit<8> COUNTER_CONSUMED              = 3;
const bit<8> COUNTER_COMPLETED             = 4;
const bit<8> COUNTER_RESULTS_SENT          = 5;
const bit<8> COUNTER_NOTICES_SENT          = 6;
const bit<8> COUNTER_REPLY_FROM_CACHE      = 7;
const bit<8> COUNTER_DROP_DUPLICATE        = 8;
const bit<8> COUNTER_DROP_TRUNCATED        = 9;
const bit<8> COUNTER_DROP_BAD_HEADER       = 10;
const bit<8> COUNTER_DROP_FRAGMENT         = 11;
const bit<8> COUNTER_DROP_UNSUPPORTED_KIND = 12;
const bit<8> COUNTER_DROP_UNKNOWN_JOB      = 13;
const bit<8> COUNTER_DROP_NOT_MEMBER       = 14;
const bit<8> COUNTER_DROP_BAD_SLOT         = 15;
const bit<8> COUNTER_DROP_BAD_SHAPE        = 16;
const bit<8> COUNTER_DROP_STALE            = 17;
const bit<8> COUNTER_DROP_REDIRECT         = 18;
const bit<8> COUNTER_DROP_INTERNAL         = 19;
const bit<8> COUNTER_EGRESS_NOT_MEMBER     = 20;
// Multicast and anycast counters: the P4 program counts multicast and
// anycast kinds as unsupported, so these stay 0 on P4 (README.md).
const bit<8> COUNTER_MCAST_REPLICATED      = 21;
const bit<8> COUNTER_MCAST_RESENT          = 22;
const bit<8> COUNTER_ACKS_CONSUMED         = 23;
const bit<8> COUNTER_ACKS_COMPLETED        = 24;
const bit<8> COUNTER_ACK_FROM_CACHE        = 25;
const bit<8> COUNTER_MISSING_REPORT        = 26;
const bit<8> COUNTER_ANYCAST_DELIVERED     = 27;
const bit<8> COUNTER_DROP_NOT_SENDER       = 28;
const bit<8> COUNTER_DROP_NO_MEMBER_UP     = 29;
const bit<8> COUNTER_MCAST_COPIES          = 30;
const bit<8> COUNTER_MCAST_SKIPPED         = 31;
const bit<8> COUNTER_ACKS_SENT             = 32;
const bit<32> COUNTER_COUNT                = 33;   // Counter::COUNT

// ---------------------------------------------------------------- pipeline
// What the slot step decided for a contribution (slot.rs, enum Outcome).
typedef bit<3> outcome_t;
const outcome_t OUTCOME_NONE       = 0;   // not admitted: no slot touched
const outcome_t OUTCOME_CONSUMED   = 1;
const outcome_t OUTCOME_COMPLETED  = 2;
const outcome_t OUTCOME_FROM_CACHE = 3;
const outcome_t OUTCOME_DUPLICATE  = 4;
const outcome_t OUTCOME_STALE      = 5;
const outcome_t OUTCOME_BAD_SHAPE  = 6;

// What each aggregator lane does to its value register.
typedef bit<2> lane_op_t;
const lane_op_t LANE_KEEP    = 0;   // leave the copy alone
const lane_op_t LANE_INIT    = 1;   // value := input
const lane_op_t LANE_COMBINE = 2;   // value := value (op) input

// Carried from ingress to egress with every copy (v1model keeps user
// metadata across the packet replication engine).
struct metadata_t {
    // parser progress
    bool       to_xina;       // UDP destination port is XINA_UDP_PORT
    bool       xina_parsed;   // the whole xina header was extracted
    bit<16>    remaining;     // payload elements still to extract
    // the job (Switch.jobs)
    bool       job_known;
    bit<16>    job_counters;  // the job's block in job_counters
    bit<8>     fan_in;
    bit<8>     op;
    bit<8>     dtype;
    bit<8>     mode;
    bit<16>    elems;
    bit<32>    slot_base;
    bit<32>    slot_count;
    bit<32>    reuse;         // 2 x slot_count: distance between chunks of one copy
    bitmap_t   all_ranks;
    bit<16>    mcast_grp;
    // the contribution
    bit<32>    copy;          // (slot_base + slot) * 2 + slot_version
    bitmap_t   rank_bit;
    // the slot step
    outcome_t  outcome;
    lane_op_t  lane_op;
    bool       emit;          // lanes write the copy's values into the packet
    bit<8>     overflow;      // FLAG_OVERFLOW if a lane saturated or clamped
    bitmap_t   result_bitmap;
    bit<8>     result_flags;
    bit<64>    csum;          // UDP checksum adjustment (RFC 1624), as in XDP
    // the verdict
    bit<8>     counter;       // the outcome counter of this packet
    bool       contributed;   // also count `contributions`
}

#endif

// bitmap.p4: the slot state machine, the P4 twin of `slot::step` in
// ebpf/xina-ebpf/src/slot.rs. One register per field of xina-proto's `Slot`
// (`slot_state`, `slot_seq`, `slot_count`, `slot_root`, `slot_bitmap`,
// `slot_flags`), indexed by the slot copy: (slot_base + slot) * 2 + V.
// The element values live in the lanes (aggregator.p4).
//
// Decision table for a contribution of chunk s from rank r (W = the job's
// slot count, reuse = 2W, so a copy holds chunks s, s + 2W, ...):
//
//   copy holds          | contribution      | lanes    | outcome
//   --------------------+-------------------+----------+------------------------
//   nothing (EMPTY)     | any s             | INIT     | consumed (completed if r is every rank)
//   chunk s - 2W        | s                 | INIT     | consumed (completed if r is every rank)
//   any other chunk     | s                 | KEEP     | stale
//   chunk s             | other count, root | KEEP     | bad shape
//   chunk s, PARTIAL    | r already in      | KEEP     | duplicate
//   chunk s, COMPLETE   | r already in      | KEEP+out | from cache
//   chunk s             | a new rank        | COMBINE  | consumed, or completed when
//                       |                   |          | the bitmap becomes all_ranks
//
// Why reinitialising a copy is safe: a rank sends chunk s to a copy only
// after it has the result of s - W, so every rank contributed to s - W and
// already had the result of s - 2W, the chunk the copy held.
//
// On a Tofino each register is one RegisterAction in one stage, reached once
// per pass; the reads and writes below are written as one read and at most
// one write per register so that each maps onto one RegisterAction.

#ifndef XINA_BITMAP_P4
#define XINA_BITMAP_P4

control Bitmap(in headers_t hdr, inout metadata_t meta) {
    register<bit<8>>(SLOT_COPIES)   slot_state;
    register<seq_t>(SLOT_COPIES)    slot_seq;
    register<bit<16>>(SLOT_COPIES)  slot_count;
    register<rank_t>(SLOT_COPIES)   slot_root;
    register<bitmap_t>(SLOT_COPIES) slot_bitmap;

    apply {
        bit<8> state;
        seq_t seq;
        bit<16> count;
        rank_t root;
        bitmap_t bitmap;
        slot_state.read(state, meta.copy);
        slot_seq.read(seq, meta.copy);
        slot_count.read(count, meta.copy);
        slot_root.read(root, meta.copy);
        slot_bitmap.read(bitmap, meta.copy);

        meta.lane_op = LANE_KEEP;
        meta.emit = false;
        if (state == SLOT_EMPTY || hdr.xina.seq == seq + meta.reuse) {
            // Rows 1-2: the first contribution initialises the copy.
            meta.lane_op = LANE_INIT;
            bitmap = meta.rank_bit;
            if (bitmap == meta.all_ranks) {
                // A job of one rank: the contribution is its own result.
                state = SLOT_COMPLETE;
                meta.outcome = OUTCOME_COMPLETED;
                meta.emit = true;
            } else {
                state = SLOT_PARTIAL;
                meta.outcome = OUTCOME_CONSUMED;
            }
            slot_seq.write(meta.copy, hdr.xina.seq);
            slot_count.write(meta.copy, hdr.xina.count);
            slot_root.write(meta.copy, hdr.xina.root);
            slot_bitmap.write(meta.copy, bitmap);
            slot_state.write(meta.copy, state);
        } else if (hdr.xina.seq != seq) {
            meta.outcome = OUTCOME_STALE;
        } else if (hdr.xina.count != count || hdr.xina.root != root) {
            meta.outcome = OUTCOME_BAD_SHAPE;
        } else if ((bitmap & meta.rank_bit) != 0) {
            if (state != SLOT_COMPLETE) {
                meta.outcome = OUTCOME_DUPLICATE;
            } else {
                // A retransmission of a finished chunk: its result was lost
                // on the way to this rank. Answer from the stored result.
                meta.outcome = OUTCOME_FROM_CACHE;
                meta.emit = true;
            }
        } else {
            meta.lane_op = LANE_COMBINE;
            bitmap = bitmap | meta.rank_bit;
            if (bitmap == meta.all_ranks) {
                state = SLOT_COMPLETE;
                meta.outcome = OUTCOME_COMPLETED;
                meta.emit = true;
            } else {
                meta.outcome = OUTCOME_CONSUMED;
            }
            slot_bitmap.write(meta.copy, bitmap);
            slot_state.write(meta.copy, state);
        }
        meta.result_bitmap = bitmap;
    }
}

// The copy's result flags (`Slot::flags`): cleared when the copy is
// initialised, then OVERFLOW once any lane saturated (int64 sums) or was
// clamped (int32 sums at completion). Runs after the lanes, which report
// `meta.overflow`.
control ResultFlags(inout metadata_t meta) {
    register<bit<8>>(SLOT_COPIES) slot_flags;

    apply {
        if (meta.outcome == OUTCOME_CONSUMED || meta.outcome == OUTCOME_COMPLETED
                || meta.outcome == OUTCOME_FROM_CACHE) {
            bit<8> flags;
            slot_flags.read(flags, meta.copy);
            if (meta.lane_op == LANE_INIT) {
                flags = 0;
            }
            flags = flags | meta.overflow;
            slot_flags.write(meta.copy, flags);
            meta.result_flags = flags;
        }
    }
}

#endif

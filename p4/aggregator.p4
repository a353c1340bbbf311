// aggregator.p4: one aggregator lane, the P4 twin of the element loops of
// `slot::step` and `slot::write_out` (ebpf/xina-ebpf/src/slot.rs, the `Elem`
// and `Combine` traits). xina.p4 instantiates ELEMS lanes; lane i owns
// register `values` of element i for every slot copy, as SwitchML gives each
// element its own register so a hardware stage touches it once per pass.
//
// Values are 64-bit whatever the element type, as in XDP's `Slot::values`:
//
//   dtype  op   combine                          at completion / from cache
//   -----  ---  -------------------------------  --------------------------------
//   int32  sum  64-bit add (64 ranks of int32    clamp to int32, OVERFLOW if
//               cannot overflow it)              clamped: the result does not
//                                                depend on arrival order
//   int64  sum  saturating add towards the true  as is
//               sum, OVERFLOW if it saturated
//   any    max  the larger (signed)              as is
//   any    min  the smaller (signed)             as is
//
// Lanes past the packet's element count read 0 and emit nothing, like the
// zeroed tail of XDP's staged payload.

#ifndef XINA_AGGREGATOR_P4
#define XINA_AGGREGATOR_P4

const bit<64> I64_MAX = 64w0x7fffffffffffffff;
const bit<64> I64_MIN = 64w0x8000000000000000;
const bit<64> I32_MAX = 64w0x000000007fffffff;
const bit<64> I32_MIN = 64w0xffffffff80000000;
// The int32 range as signed 64-bit numbers, for the clamp's comparisons.
const int<64> I32_MAX_SIGNED = 2147483647;
const int<64> I32_MIN_SIGNED = -2147483648;

control Aggregator(inout elem32_h e32, inout elem64_h e64, inout metadata_t meta) {
    register<bit<64>>(SLOT_COPIES) values;

    apply {
        if (meta.lane_op == LANE_KEEP && !meta.emit) {
            return;
        }
        bit<64> input = 0;
        if (meta.dtype == DTYPE_I32 && e32.isValid()) {
            input = (bit<64>)(int<64>)(int<32>)e32.value;
        } else if (meta.dtype == DTYPE_I64 && e64.isValid()) {
            input = e64.value;
        }
        bit<64> v;
        values.read(v, meta.copy);
        if (meta.lane_op == LANE_INIT) {
            v = input;
        } else if (meta.lane_op == LANE_COMBINE) {
            if (meta.op == OP_SUM) {
                bit<64> s = v + input;
                if (meta.dtype == DTYPE_I64 && v[63:63] == input[63:63]
                        && s[63:63] != v[63:63]) {
                    // Saturate in the direction of the true sum.
                    s = (input[63:63] == 0) ? I64_MAX : I64_MIN;
                    meta.overflow = FLAG_OVERFLOW;
                }
                v = s;
            } else if (meta.op == OP_MAX) {
                if ((int<64>)input > (int<64>)v) {
                    v = input;
                }
            } else if (meta.op == OP_MIN) {
                if ((int<64>)input < (int<64>)v) {
                    v = input;
                }
            }
        }
        if (meta.emit) {
            if (meta.dtype == DTYPE_I32) {
                if ((int<64>)v > I32_MAX_SIGNED) {
                    v = I32_MAX;
                    meta.overflow = FLAG_OVERFLOW;
                } else if ((int<64>)v < I32_MIN_SIGNED) {
                    v = I32_MIN;
                    meta.overflow = FLAG_OVERFLOW;
                }
                if (e32.isValid()) {
                    meta.csum = meta.csum + csum_replace32(e32.value, v[31:0]);
                    e32.value = v[31:0];
                }
            } else if (e64.isValid()) {
                meta.csum = meta.csum + csum_replace32(e64.value[63:32], v[63:32])
                                      + csum_replace32(e64.value[31:0], v[31:0]);
                e64.value = v;
            }
        }
        values.write(meta.copy, v);
    }
}

#endif

// checksum.p4: incremental Internet checksum arithmetic (RFC 1624), the same
// functions as xina-proto's checksum.rs. The dataplane never sums a payload:
// each rewritten 32-bit word adds `~old + new` to a 64-bit accumulator, and
// the accumulator is folded into the old checksum once. So a result's
// checksum is byte for byte the one the XDP dataplane writes.

#ifndef XINA_CHECKSUM_P4
#define XINA_CHECKSUM_P4

// checksum::replace32 / replace16, without the running accumulator.
bit<64> csum_replace32(in bit<32> old, in bit<32> new) {
    return (bit<64>)(~old) + (bit<64>)new;
}

bit<64> csum_replace16(in bit<16> old, in bit<16> new) {
    return (bit<64>)(~old) + (bit<64>)new;
}

// checksum::fold: four fixed rounds fold any 64-bit accumulator to 16 bits.
bit<16> csum_fold(in bit<64> acc) {
    bit<64> a = (acc & 0xffffffff) + (acc >> 32);
    a = (a & 0xffffffff) + (a >> 32);
    a = (a & 0xffff) + (a >> 16);
    a = (a & 0xffff) + (a >> 16);
    return a[15:0];
}

// checksum::apply: the checksum field after the replacements in `acc`.
bit<16> csum_apply(in bit<16> csum, in bit<64> acc) {
    return ~csum_fold((bit<64>)(~csum) + acc);
}

// checksum::apply_udp: 0 means "no checksum" and stays 0; a computed 0 is
// sent as 0xffff.
bit<16> csum_apply_udp(in bit<16> csum, in bit<64> acc) {
    bit<16> c = csum_apply(csum, acc);
    if (csum == 0) {
        c = 0;
    } else if (c == 0) {
        c = 0xffff;
    }
    return c;
}

#endif

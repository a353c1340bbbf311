// counters.p4: the dataplane's counters, three ways as in XDP
// (ebpf/xina-proto/src/counters.rs): switch-wide (`switch_counters`, at the
// counter's index), per job (`job_counters`, at job block x 21 + index) and
// per port (`port_counters`, at port x 21 + index). XDP keeps per-CPU
// arrays that userspace sums over CPUs; here the ingress and the egress
// pipeline each own an instance (`XinaIngress.counters.*` and
// `XinaEgress.counters.*`) and a reader sums the two.

#ifndef XINA_COUNTERS_P4
#define XINA_COUNTERS_P4

control Counters(in metadata_t meta, in port_t port, in bool ingress) {
    counter(COUNTER_COUNT, CounterType.packets)      switch_counters;
    counter(JOB_COUNTER_CELLS, CounterType.packets)  job_counters;
    counter(PORT_COUNTER_CELLS, CounterType.packets) port_counters;

    action count_switch_port(bit<8> c) {
        switch_counters.count((bit<32>)c);
        port_counters.count((bit<32>)port * COUNTER_COUNT + (bit<32>)c);
    }

    action count_job(bit<8> c) {
        job_counters.count((bit<32>)meta.job_counters * COUNTER_COUNT + (bit<32>)c);
    }

    apply {
        if (meta.counter == 0xff) {
            return;
        }
        if (ingress) {
            count_switch_port(COUNTER_RX_PACKETS);
            if (meta.job_known) {
                count_job(COUNTER_RX_PACKETS);
            }
            if (meta.contributed) {
                count_switch_port(COUNTER_CONTRIBUTIONS);
                count_job(COUNTER_CONTRIBUTIONS);
            }
        }
        count_switch_port(meta.counter);
        if (meta.job_known) {
            count_job(meta.counter);
        }
    }
}

#endif

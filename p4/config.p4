// config.p4: sizes of the dataplane's tables, registers and counters, each
// with the reason for it.

#ifndef XINA_CONFIG_P4
#define XINA_CONFIG_P4

// Elements per packet (one aggregator lane each). XDP takes up to 360 int32
// (a 1500-byte MTU); a hardware pipeline has one register per element per
// stage pass, and SwitchML-style designs carry 32 to 64 elements per packet
// (recirculating for more). 32 lanes keep the BMv2 program small and fit a
// Tofino's stage budget with room to spare; jobs with more elements per
// packet are refused by `xina p4 emit`. See p4/README.md, "Differences".
#define ELEMS 32

// Aggregator slots in the pool, each with two copies (the shadow bit). XDP
// defaults to 4,096; one lane register holds 2 x SLOT_POOL 64-bit values, and
// 1,024 slots x 2 copies x 32 lanes x 8 bytes is 512 KiB of register memory,
// which a Tofino pipe holds (SwitchML uses pools of 512 to 4,096 slots).
#define SLOT_POOL 1024
#define SLOT_COPIES 2048

// Installed jobs: the `jobs` table size, as XDP's JOBS map (maps::MAX_JOBS).
#define MAX_JOBS 4096

// Members of all jobs: the `members` and `port_members` table sizes, as XDP's
// MEMBERS map (maps::MAX_MEMBERS).
#define MAX_MEMBERS 65536

// Switch ports, as XDP's PORTS devmap (maps::MAX_PORTS): ports 0..63.
#define MAX_PORTS 64

// Where frames that are not xina go: the host's own stack, as XDP_PASS hands
// them to the kernel. On BMv2 this is one more interface (`-i 64@...`).
#define CPU_PORT 64

// Counter blocks: one of COUNTER_COUNT (33) counters per job and per port.
#define JOB_COUNTER_CELLS 135168     // MAX_JOBS x 33
#define PORT_COUNTER_CELLS 2145      // (MAX_PORTS + 1) x 33: the CPU port too

#endif

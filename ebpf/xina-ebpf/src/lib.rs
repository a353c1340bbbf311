//! The xina XDP programs live in the `xina` binary target (`src/main.rs`);
//! this empty library target lets `userspace/xina` name this crate as a build
//! dependency, so cargo rebuilds the eBPF object when it changes.
#![no_std]

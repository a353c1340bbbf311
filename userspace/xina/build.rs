//! Builds the eBPF object (`ebpf/xina-ebpf`, binary `xina`) with aya-build on
//! the pinned nightly; the userspace crate embeds it from `OUT_DIR`.

use std::path::Path;

/// The toolchain the eBPF programs are built with. Later nightlies may move to
/// an LLVM that bpf-linker 0.10 cannot read.
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ebpf/xina-ebpf");
    let root = root.canonicalize()?;
    let root = root
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", root.display()))?;
    let package = aya_build::Package {
        name: "xina-ebpf",
        root_dir: root,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}

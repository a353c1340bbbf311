#!/usr/bin/env bash
# Installs what building and testing xina needs, only where it is missing:
# the pinned nightly with rust-src (the eBPF build), bpf-linker, and the
# Debian packages the testbed uses (iproute2 for ip and tc, ethtool,
# bpftool, and Open MPI for the benches' MPI column and its test). Safe to
# run again; prints what it does.
set -euo pipefail

EBPF_TOOLCHAIN=nightly-2026-05-20
BPF_LINKER_VERSION=0.10.3
export PATH="$HOME/.cargo/bin:$PATH"

say() { printf 'xina-deps: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "run as root: loading XDP programs and building network namespaces need it"
    exit 1
fi

command -v rustup >/dev/null || { say "rustup is required (https://rustup.rs)"; exit 1; }

if ! rustup run "$EBPF_TOOLCHAIN" rustc --version >/dev/null 2>&1; then
    say "installing toolchain $EBPF_TOOLCHAIN with rust-src"
    rustup toolchain install "$EBPF_TOOLCHAIN" --profile minimal --component rust-src
elif ! rustup component list --toolchain "$EBPF_TOOLCHAIN" --installed | grep -q '^rust-src'; then
    say "adding rust-src to $EBPF_TOOLCHAIN"
    rustup component add rust-src --toolchain "$EBPF_TOOLCHAIN"
fi

# The stable toolchain builds everything else; clippy and rustfmt check it.
for component in clippy rustfmt; do
    if ! rustup component list --installed | grep -q "^$component"; then
        say "adding $component"
        rustup component add "$component"
    fi
done

if ! bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
    say "installing bpf-linker $BPF_LINKER_VERSION (about two minutes)"
    cargo install bpf-linker --version "$BPF_LINKER_VERSION" --locked
fi

missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v ethtool >/dev/null || missing+=(ethtool)
command -v tc >/dev/null || missing+=(iproute2)
# The concurrency test reads per-CPU counters with bpftool.
command -v bpftool >/dev/null || missing+=(bpftool)
# Open MPI: the benches' column and the PMPI library's tests (mpirun, and
# mpicc with the headers).
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
# The C interface's header test compiles a C program (rustc links with cc too).
command -v cc >/dev/null || missing+=(gcc)
# The benches' charts (--plot) are labelled in DejaVu Sans.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test (unit, dataplane
# via BPF_PROG_TEST_RUN, and network-namespace tests with real traffic),
# then the kernel matrix (testbed/scripts/kernels.sh). Needs root. Installs
# what is missing first.
set -euo pipefail
cd "$(dirname "$0")/../.."
testbed/scripts/ensure-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --locked "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line over every test binary (cargo prints one per binary, and
# the last is often a crate's empty doc-test run).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
[ "$status" = 0 ] || exit "$status"

# The kernel matrix: the switch loaded, its verifier figures checked and
# traffic run on every kernel the README names (Debian 12's 6.1 and 6.12
# under qemu, and this machine's). XINA_KERNELS narrows it (for example
# XINA_KERNELS=running); XINA_KERNELS=none skips it.
kernels=${XINA_KERNELS:-6.1,6.12,running}
if [ "$kernels" != none ]; then
    echo "== kernel matrix ($kernels)"
    cargo build --locked --bins
    testbed/scripts/kernels.sh --kernels "$kernels" --bin-dir target/debug
fi

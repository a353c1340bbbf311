#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test (unit, dataplane
# via BPF_PROG_TEST_RUN, and network-namespace tests with real traffic).
# Needs root. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/../.."
testbed/scripts/ensure-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --locked "$@"

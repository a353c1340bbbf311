#!/usr/bin/env bash
# The demo: builds a star of network namespaces (one XDP switch, 4 workers),
# runs an int32 allreduce of 4 million elements per worker through the
# switch, checks it against the locally computed sum, prints a table and
# tears everything down. Needs root. Extra arguments go to
# `xina-testbed demo` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/../.."
testbed/scripts/ensure-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo run --locked --release -p xina-testbed -- demo "$@"

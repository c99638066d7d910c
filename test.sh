#!/usr/bin/env bash
# The project's test command (README.md). Runs every test of the default
# workspace members in the one shared build profile.
#
# Tools some tests need: fiu-run (Debian fiu-utils) for the fsync-failure
# test; libfaketime (Debian libfaketime, faketime) for the wall-clock test.
# As root, missing tools are installed; otherwise those tests fail loudly
# and say what to install.
set -euo pipefail
cd "$(dirname "$0")"
if { ! command -v fiu-run >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; } \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq fiu-utils libfaketime faketime >/dev/null
fi
# Property tests: fixed seeds, and a case count sized for two cores.
export PROPTEST_CASES="${PROPTEST_CASES:-64}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
# The lazy disk (power-loss builds) is a test-only feature: the log store's
# and state machine's power cuts on it (the disk's own unit tests are vfs's,
# in the run above). `--workspace` keeps every crate's features as in that
# run (kvnode's testing feature among them), so only the crates under the
# lazy disk recompile.
cargo test --workspace --features kvnode/lazy-disk --test node lazy_power_cut "$@" 2>&1 | tee -a "$log" || status=$?
# One closing line for the whole workspace (cargo prints one per test binary,
# and the last of those may be an empty doc-test run of a shell crate).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"

#!/usr/bin/env bash
# The project's test command (README.md). Runs every test of the default
# workspace members in the one shared build profile.
#
# Tools some tests need: fiu-run (Debian fiu-utils) for the fsync-failure
# test. As root, missing tools are installed; otherwise those tests fail
# loudly and say what to install.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v fiu-run >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq fiu-utils >/dev/null
fi
# Property tests: fixed seeds, and a case count sized for two cores.
export PROPTEST_CASES="${PROPTEST_CASES:-64}"
cargo test --workspace "$@"

#!/usr/bin/env bash
# compare-builds.sh: two or more kvnode builds, side by side on this machine
# (the before/after lines of node/kvnode/BENCHMARKS.md).
#
# For each round, for each build in turn: starts `kvnode local --nodes 3`
# (127.0.79.1) on a fresh data directory, runs cluster-load for every
# workload, stops the cluster (by PID) and removes its data. Builds
# alternate inside each round, so drift on a shared machine hits all of
# them. Prints one Markdown table: ops/s, p50 / p99 and the members' CPU
# per operation (user + system of the three member processes, from
# /proc/PID/stat, over the measured run, divided by the operations it
# acknowledged) of every build and workload (the median over the rounds),
# and each build's ops/s and CPU per operation as ratios to the first
# build's.
#
# Usage (from anywhere in a clone; no root needed):
#   deploy/bench/compare-builds.sh [--rounds N] [--seconds N] \
#       [--workloads LIST] NAME=KVNODE_BINARY NAME=KVNODE_BINARY...
#   --rounds N     rounds (default 2)
#   --seconds N    measured seconds per build, workload and round (default 8)
#   --workloads L  comma-separated from put-256x1, put-256x64, put-4k-x64,
#                  get-lin-x64, get-lin-any-x64 (default: all)
# Environment: CLUSTER_LOAD=PATH (default target/release/cluster-load, built
# when missing: `cargo build --release -p kvbench --bin cluster-load`).
set -euo pipefail

READY_WAIT_S=60     # each cluster to elect a leader and answer
STOP_WAIT_S=15      # the cluster to exit after SIGTERM before SIGKILL
HOST=127.0.79.1
PORT_BASE=28001     # client ports 28001-28003, peer +100, admin +200
FILL_OPS=20000      # puts that fill the key space before the gets
KEY_SPACE=10000

die() { echo "compare-builds: $*" >&2; exit 1; }

ROUNDS=2
SECS=8
WORKLOADS="put-256x1,put-256x64,put-4k-x64,get-lin-x64,get-lin-any-x64"
BUILDS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) [ $# -ge 2 ] || die "--rounds needs a value"; ROUNDS=$2; shift ;;
        --seconds) [ $# -ge 2 ] || die "--seconds needs a value"; SECS=$2; shift ;;
        --workloads) [ $# -ge 2 ] || die "--workloads needs a value"; WORKLOADS=$2; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *=*) BUILDS+=("$1") ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[ ${#BUILDS[@]} -ge 2 ] || die "give at least two builds as NAME=PATH (see --help)"
for b in "${BUILDS[@]}"; do [ -x "${b#*=}" ] || die "${b#*=} is not an executable"; done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOAD=${CLUSTER_LOAD:-$REPO/target/release/cluster-load}
if [ ! -x "$LOAD" ]; then
    (cd "$REPO" && cargo build --release -p kvbench --bin cluster-load)
fi

WORK=$(mktemp -d /tmp/compare-builds.XXXXXX)
# shellcheck source=deploy/bench/local-cluster.sh
. "$REPO/deploy/bench/local-cluster.sh"
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    stop_cluster
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ENDPOINTS=$(cluster_endpoints)

# cluster-load arguments of a workload.
load_args() {
    case "$1" in
        put-256x1) echo "put --clients 1 --value-size 256" ;;
        put-256x64) echo "put --clients 64 --value-size 256" ;;
        put-4k-x64) echo "put --clients 64 --value-size 4096" ;;
        get-lin-x64) echo "get --clients 64 --consistency linearizable --reads-from leader" ;;
        get-lin-any-x64) echo "get --clients 64 --consistency linearizable --reads-from any" ;;
        *) die "unknown workload $1" ;;
    esac
}

# One measured run: prints "ops_per_s p50 p99 cpu_us_per_op" from
# cluster-load's table row and the members' CPU over the run.
measure() { # workload
    local before after row
    before=$(member_cpu_ticks)
    # shellcheck disable=SC2046
    row=$(timeout $((SECS * 4 + 60)) "$LOAD" $(load_args "$1") --endpoints "$ENDPOINTS" \
        --key-space "$KEY_SPACE" --ops 100000000 --duration "${SECS}s" 2>&1 |
        awk -F'|' '/^\| (put|get) /{gsub(/[ ,]/, "", $6); gsub(/ /, "", $7); gsub(/ /, "", $9); print $6, $7, $9; exit}')
    after=$(member_cpu_ticks)
    [ -n "$row" ] || return 0
    echo "$row" | awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" -v secs="$SECS" \
        '{ ops = $1 * secs; printf "%s %s %s %.1f\n", $1, $2, $3, (ops > 0 ? ticks * 1e6 / hz / ops : 0) }'
}

RESULTS=$WORK/results.txt
: >"$RESULTS"
IFS=',' read -r -a WLS <<<"$WORKLOADS"
for w in "${WLS[@]}"; do load_args "$w" >/dev/null; done
echo "compare-builds: ${#BUILDS[@]} builds x ${#WLS[@]} workloads x $ROUNDS rounds x ${SECS} s; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq "$ROUNDS"); do
    # Rotate the order each round so no build always runs first.
    for k in $(seq 0 $((${#BUILDS[@]} - 1))); do
        b=${BUILDS[$(((k + round - 1) % ${#BUILDS[@]}))]}
        name=${b%%=*}
        start_cluster "${b#*=}"
        case "$WORKLOADS" in *get*)
            "$LOAD" put --clients 64 --value-size 256 --key-space "$KEY_SPACE" \
                --ops "$FILL_OPS" --duration 60s --endpoints "$ENDPOINTS" >/dev/null 2>&1 ;;
        esac
        for w in "${WLS[@]}"; do
            row=$(measure "$w")
            [ -n "$row" ] || die "no result for $name $w (cluster-load failed)"
            echo "$name $w $row" >>"$RESULTS"
            echo "  round $round: $name $w: $row (ops/s p50 p99 cpu-us/op)" >&2
        done
        stop_cluster
    done
done

echo
echo "#### kvnode builds side by side ($(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds x ${SECS} s, median per cell; load average after $(cut -d' ' -f1-3 /proc/loadavg))"
echo
python3 - "$RESULTS" "${BUILDS[@]}" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = [b.split('=', 1)[0] for b in sys.argv[2:]]
workloads = list(dict.fromkeys(r[1] for r in rows))
def cell(name, w):
    rs = [r for r in rows if r[0] == name and r[1] == w]
    return [statistics.median(float(r[i]) for r in rs) for i in (2, 3, 4, 5)]
head = "| workload | " + " | ".join(
    f"{n} ops/s | {n} p50 ms | {n} p99 ms | {n} CPU µs/op" for n in names)
head += " | " + " | ".join(
    f"{n} / {names[0]} ops/s | {n} / {names[0]} CPU/op" for n in names[1:]) + " |"
print(head)
print("|" + " --- |" * (1 + 4 * len(names) + 2 * (len(names) - 1)))
for w in workloads:
    cells = {n: cell(n, w) for n in names}
    line = f"| {w} | " + " | ".join(
        f"{c[0]:,.0f} | {c[1]:.2f} | {c[2]:.2f} | {c[3]:.1f}" for c in cells.values())
    base = cells[names[0]]
    line += " | " + " | ".join(
        f"{cells[n][0] / base[0]:.2f} | {cells[n][3] / base[3]:.2f}" if base[3] else
        f"{cells[n][0] / base[0]:.2f} | n/a" for n in names[1:]) + " |"
    print(line)
EOF

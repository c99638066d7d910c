#!/usr/bin/env bash
# rolling-restart.sh: a rolling restart of a three-member cluster under
# `kvctl bench put`, and what the clients saw (node/kvnode/BENCHMARKS.md,
# "Rolling restart").
#
# Starts three `kvnode run` members on 127.0.80.1 (fresh data directories
# under one temporary directory), starts `kvctl bench put` (16 clients, the
# default retry budget) for a fixed duration, and restarts each member in
# turn, the leader last: SIGTERM (a leader hands leadership over first),
# wait for the process to exit, start it again on the same directory, wait
# until it is ready and the cluster has a leader, pause, next. Then prints
# kvctl's JSON summary line: operations, failed requests, p50 / p99 / max
# latency. Stops everything it started (by PID) on any exit and removes the
# data.
#
# Usage (from anywhere in a clone; no root needed):
#   deploy/bench/rolling-restart.sh [--kvnode PATH] [--kvctl PATH] [--seconds N]
#   --kvnode PATH  the kvnode binary (default target/release/kvnode)
#   --kvctl PATH   the kvctl binary (default target/release/kvctl)
#   --seconds N    length of the load (default 40; the restarts take ~15 s)
set -euo pipefail

READY_WAIT_S=60     # a member to answer /ready, the cluster to have a leader
STOP_WAIT_S=15      # a member to exit after SIGTERM before SIGKILL
PAUSE_S=3           # between restarts
HOST=127.0.80.1
PORT_BASE=29001     # client ports 29001-29003, peer +100, admin +200
CLIENTS=16

die() { echo "rolling-restart: $*" >&2; exit 1; }

REPO=$(cd "$(dirname "$0")/../.." && pwd)
KVNODE=$REPO/target/release/kvnode
KVCTL=$REPO/target/release/kvctl
SECS=40
while [ $# -gt 0 ]; do
    case "$1" in
        --kvnode) [ $# -ge 2 ] || die "--kvnode needs a value"; KVNODE=$2; shift ;;
        --kvctl) [ $# -ge 2 ] || die "--kvctl needs a value"; KVCTL=$2; shift ;;
        --seconds) [ $# -ge 2 ] || die "--seconds needs a value"; SECS=$2; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[ -x "$KVNODE" ] || die "$KVNODE is not an executable (cargo build --release -p kvnode)"
[ -x "$KVCTL" ] || die "$KVCTL is not an executable (cargo build --release -p kvctl)"

WORK=$(mktemp -d /tmp/rolling-restart.XXXXXX)
declare -A PIDS=()
BENCH_PID=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    [ -z "$BENCH_PID" ] || kill -TERM "$BENCH_PID" 2>/dev/null || true
    for n in "${!PIDS[@]}"; do stop_member "$n"; done
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

client() { echo "$HOST:$((PORT_BASE + $1 - 1))"; }
peer() { echo "$HOST:$((PORT_BASE + 100 + $1 - 1))"; }
admin() { echo "$HOST:$((PORT_BASE + 200 + $1 - 1))"; }
INITIAL="1=$(client 1)/$(peer 1),2=$(client 2)/$(peer 2),3=$(client 3)/$(peer 3)"
ENDPOINTS="$(client 1),$(client 2),$(client 3)"

start_member() { # id
    local n=$1 bootstrap=()
    [ "$n" = 1 ] && bootstrap=(--bootstrap)
    mkdir -p "$WORK/node$n"
    "$KVNODE" run --id "$n" --data-dir "$WORK/node$n" --client-addr "$(client "$n")" \
        --peer-addr "$(peer "$n")" --admin-addr "$(admin "$n")" \
        --initial-cluster "$INITIAL" "${bootstrap[@]}" >>"$WORK/node$n.log" 2>&1 &
    PIDS[$n]=$!
}
stop_member() { # id
    local n=$1 pid=${PIDS[$1]:-}
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((STOP_WAIT_S * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "PIDS[$n]"
}
wait_ready() { # id
    local deadline=$((SECONDS + READY_WAIT_S))
    until curl -sf "http://$(admin "$1")/ready" >/dev/null 2>&1; do
        kill -0 "${PIDS[$1]}" 2>/dev/null || die "member $1 exited: $(tail -5 "$WORK/node$1.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "member $1 not ready after ${READY_WAIT_S} s"
        sleep 0.2
    done
}
leader() {
    "$KVCTL" --endpoints "$ENDPOINTS" status -o json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"] or 0)' 2>/dev/null || echo 0
}

for n in 1 2 3; do start_member "$n"; done
for n in 1 2 3; do wait_ready "$n"; done
echo "cluster ready; leader: member $(leader)"

"$KVCTL" --endpoints "$ENDPOINTS" bench put --clients "$CLIENTS" --duration "${SECS}s" \
    --key-space 1000 -o json >"$WORK/bench.json" 2>"$WORK/bench.err" &
BENCH_PID=$!
sleep "$PAUSE_S"
first=$(leader)
order=()
for n in 1 2 3; do [ "$n" = "$first" ] || order+=("$n"); done
order+=("$first")
for n in "${order[@]}"; do
    echo "restarting member $n (leader before: $(leader))"
    stop_member "$n"
    start_member "$n"
    wait_ready "$n"
    echo "member $n is back (leader now: $(leader))"
    sleep "$PAUSE_S"
done
status=0
wait "$BENCH_PID" || status=$?
BENCH_PID=""
[ "$status" = 0 ] || { cat "$WORK/bench.err" >&2; die "kvctl bench exited $status"; }
python3 - "$WORK/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_ms"]
print(f"rolling restart under bench put ({r.get('clients', '?')} clients): "
      f"{r['ops_ok']} ok, {r['errors']} failed {r.get('errors_by_kind')}, "
      f"{r['ops_per_second']:.0f} ops/s, p50 {l['p50']} ms, p99 {l['p99']} ms, max {l['max']} ms")
PY

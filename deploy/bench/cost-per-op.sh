#!/usr/bin/env bash
# cost-per-op.sh: what one acknowledged operation costs each member of a
# three-member cluster, and the load generator apart (node/kvnode/BENCHMARKS.md,
# "Cost per operation"). A measure that the machine's noise moves little:
# CPU time spent per operation, not operations per second.
#
# For each run: starts `kvnode local --nodes 3` (127.0.81.1) on a fresh data
# directory, fills the key space, then for each workload runs `cluster-load`
# for a fixed number of operations and reads, over exactly that load:
#   - each member's CPU time (user + system, every thread, from
#     /proc/PID/stat) and the load generator's (its rusage, via the shell's
#     `times`);
#   - the operations the leader acknowledged (its own request counter,
#     `raftcask_request_seconds_count{op=...}` on its admin port);
#   - context switches and system calls of the members (perf stat software
#     counters and the raw_syscalls tracepoint, attached by PID), and
#     instructions where the machine has hardware counters; a column the
#     machine cannot give reads "n/a" and the reason is printed once.
# Stops the cluster (by PID) and removes its data. With several builds,
# each run measures every build in turn (the order rotating), so drift on a
# shared machine hits all of them. Prints one Markdown table of medians over
# the runs: µs of CPU per acknowledged operation for the leader, each
# follower, their sum and the load generator, and the members' context
# switches, system calls and instructions per operation; with several
# builds, each build's members' sum as a ratio to the first build's.
#
# Usage (from anywhere in a clone; no root needed; run it inside
# `unshare -n` with `ip link set lo up` to keep it off the host's network):
#   deploy/bench/cost-per-op.sh [--runs N] [--ops N] [--workloads LIST] [NAME=KVNODE...]
#   --runs N       runs (default 3; the table is the median per cell)
#   --ops N        operations per workload and run (default 100000)
#   NAME=KVNODE    a build to measure (default: main=target/release/kvnode)
#   --workloads L  comma-separated from put-256x64, put-4k-x64, get-lin-x64,
#                  put-256x1 (default: the first three)
# Environment: CLUSTER_LOAD=PATH (default target/release/cluster-load, built
# when missing: `cargo build --release -p kvbench --bin cluster-load`).
set -euo pipefail

READY_WAIT_S=60     # the cluster to elect a leader and answer
STOP_WAIT_S=15      # the cluster to exit after SIGTERM before SIGKILL
LOAD_WAIT_S=600     # one workload's fixed number of operations to finish
HOST=127.0.81.1
PORT_BASE=30001     # client ports 30001-30003, peer +100, admin +200
FILL_OPS=20000      # puts that fill the key space before the workloads
KEY_SPACE=10000
CLIENTS=64

die() { echo "cost-per-op: $*" >&2; exit 1; }

REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILDS=()
RUNS=3
OPS=100000
WORKLOADS="put-256x64,put-4k-x64,get-lin-x64"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) [ $# -ge 2 ] || die "--runs needs a value"; RUNS=$2; shift ;;
        --ops) [ $# -ge 2 ] || die "--ops needs a value"; OPS=$2; shift ;;
        --workloads) [ $# -ge 2 ] || die "--workloads needs a value"; WORKLOADS=$2; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *=*) BUILDS+=("$1") ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[ ${#BUILDS[@]} -gt 0 ] || BUILDS=("main=$REPO/target/release/kvnode")
for b in "${BUILDS[@]}"; do
    [ -x "${b#*=}" ] || die "${b#*=} is not an executable (cargo build --release -p kvnode)"
done
LOAD=${CLUSTER_LOAD:-$REPO/target/release/cluster-load}
if [ ! -x "$LOAD" ]; then
    (cd "$REPO" && cargo build --release -p kvbench --bin cluster-load)
fi

WORK=$(mktemp -d /tmp/cost-per-op.XXXXXX)
# shellcheck source=deploy/bench/local-cluster.sh
. "$REPO/deploy/bench/local-cluster.sh"
PERF_PIDS=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    local p
    for p in "${PERF_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    stop_cluster
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ENDPOINTS=$(cluster_endpoints)

# cluster-load arguments and the leader's request-counter label of a workload.
load_args() {
    case "$1" in
        put-256x64) echo "put --clients $CLIENTS --value-size 256" ;;
        put-4k-x64) echo "put --clients $CLIENTS --value-size 4096" ;;
        get-lin-x64) echo "get --clients $CLIENTS --consistency linearizable --reads-from leader" ;;
        put-256x1) echo "put --clients 1 --value-size 256" ;;
        *) die "unknown workload $1" ;;
    esac
}
counter_op() { case "$1" in get-*) echo get ;; *) echo put ;; esac; }

# What perf can count here: software counters by PID, the syscall
# tracepoint, hardware instructions. Each missing one is said once.
PERF_EVENTS=""
PERF_NOTE=""
if command -v perf >/dev/null; then
    for ev in context-switches raw_syscalls:sys_enter instructions; do
        out=$(perf stat -x, -e "$ev" true 2>&1 >/dev/null || true)
        if grep -q "^[0-9][0-9]*,.*$ev" <<<"$out"; then
            PERF_EVENTS+="${PERF_EVENTS:+,}$ev"
        else
            PERF_NOTE+="perf cannot count $ev here ($(grep -o 'not supported\|not counted\|Permission\|No permission\|not found' <<<"$out" | head -1 || true)); "
        fi
    done
else
    PERF_NOTE="perf is not installed (Debian linux-perf): no context switches, system calls or instructions; "
fi

# Starts one `perf stat` per member, attached by PID, writing $WORK/perf-I.
perf_start() {
    PERF_PIDS=()
    [ -n "$PERF_EVENTS" ] || return 0
    local i
    for i in 1 2 3; do
        perf stat -x, -e "$PERF_EVENTS" -p "$(member_pid "$i")" -o "$WORK/perf-$i" 2>/dev/null &
        PERF_PIDS+=($!)
    done
    sleep 0.5 # perf attaches to every thread before the load starts
}

# Stops them; writes "ctx syscalls instructions" summed over the members
# ("n/a" for an event perf could not count) to $WORK/counts. Called in the
# script's own shell (not in `$(...)`): it waits for the perf processes.
perf_stop() {
    local p
    for p in "${PERF_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${PERF_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PERF_PIDS=()
    awk -F, -v have="$PERF_EVENTS" '
        /^[0-9]/ { sum[$3] += $1 }
        END {
            n = split("context-switches raw_syscalls:sys_enter instructions", ev, " ")
            for (k = 1; k <= n; k++) {
                printf "%s%s", (k > 1 ? " " : ""), (index(have, ev[k]) ? sum[ev[k]] + 0 : "n/a")
            }
            print ""
        }' "$WORK"/perf-* >"$WORK/counts" 2>/dev/null || echo "n/a n/a n/a" >"$WORK/counts"
    rm -f "$WORK"/perf-*
}

# Sets CHILDREN_CPU_S to the CPU seconds (user + system) of this shell's
# waited-for children so far, from `times`. Called in the script's own shell,
# not in `$(...)`: a subshell starts with no children of its own.
CHILDREN_CPU_S=0
children_cpu() {
    times >"$WORK/times"
    CHILDREN_CPU_S=$(awk 'NR == 2 { gsub(/s/, ""); split($1, u, "m"); split($2, s, "m")
        printf "%.6f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$WORK/times")
}

# One measured workload: appends a line to $RESULTS:
#   build run workload ops leader_us follower_us follower_us load_us ctx sys instr
measure() { # build run workload
    local name=$1 run=$2 w=$3 leader op i before_ops after_ops
    leader=$(cluster_leader)
    [ -n "$leader" ] || die "no leader before $w"
    op=$(counter_op "$w")
    local -a before after
    for i in 1 2 3; do before[i]=$(member_ticks "$i"); done
    before_ops=$(member_metric "$leader" "raftcask_request_seconds_count{op=\"$op\"}")
    local load_before load_after
    perf_start
    children_cpu
    load_before=$CHILDREN_CPU_S
    # shellcheck disable=SC2046
    timeout "$LOAD_WAIT_S" "$LOAD" $(load_args "$w") --endpoints "$ENDPOINTS" \
        --key-space "$KEY_SPACE" --ops "$OPS" --duration "${LOAD_WAIT_S}s" >"$WORK/load.out" 2>&1 ||
        die "cluster-load failed on $w: $(tail -3 "$WORK/load.out")"
    children_cpu
    load_after=$CHILDREN_CPU_S
    perf_stop
    local counts
    counts=$(cat "$WORK/counts")
    for i in 1 2 3; do after[i]=$(member_ticks "$i"); done
    after_ops=$(member_metric "$leader" "raftcask_request_seconds_count{op=\"$op\"}")
    [ "$(cluster_leader)" = "$leader" ] || die "leadership moved during $w (run $run): measure again"
    local hz ops followers=()
    hz=$(getconf CLK_TCK)
    ops=$(awk -v a="$after_ops" -v b="$before_ops" 'BEGIN { printf "%d", a - b }')
    [ "$ops" -gt 0 ] || die "the leader acknowledged no $op during $w"
    for i in 1 2 3; do [ "$i" = "$leader" ] || followers+=("$i"); done
    awk -v name="$name" -v run="$run" -v w="$w" -v ops="$ops" -v hz="$hz" \
        -v l=$((after[leader] - before[leader])) \
        -v f1=$((after[followers[0]] - before[followers[0]])) \
        -v f2=$((after[followers[1]] - before[followers[1]])) \
        -v load="$(awk -v a="$load_after" -v b="$load_before" 'BEGIN { print a - b }')" \
        -v counts="$counts" 'BEGIN {
            split(counts, c, " ")
            us = 1e6 / hz / ops
            printf "%s %s %s %d %.2f %.2f %.2f %.2f", name, run, w, ops, l * us, f1 * us, f2 * us, load * 1e6 / ops
            for (k = 1; k <= 3; k++) printf " %s", (c[k] == "n/a" ? "n/a" : sprintf("%.2f", c[k] / ops))
            print ""
        }' >>"$RESULTS"
    tail -1 "$RESULTS" | awk '{ printf "  run %s: %s %s: %s ops, CPU µs/op leader %s, followers %s + %s, load generator %s; per op: %s context switches, %s syscalls, %s instructions\n", $2, $1, $3, $4, $5, $6, $7, $8, $9, $10, $11 }' >&2
}

RESULTS=$WORK/results.txt
: >"$RESULTS"
IFS=',' read -r -a WLS <<<"$WORKLOADS"
for w in "${WLS[@]}"; do load_args "$w" >/dev/null; done
echo "cost-per-op: ${#BUILDS[@]} builds x ${#WLS[@]} workloads x $RUNS runs x $OPS ops; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
[ -z "$PERF_NOTE" ] || echo "cost-per-op: ${PERF_NOTE%; }" >&2
for run in $(seq "$RUNS"); do
    # Rotate the order each run so no build always runs first.
    for k in $(seq 0 $((${#BUILDS[@]} - 1))); do
        b=${BUILDS[$(((k + run - 1) % ${#BUILDS[@]}))]}
        start_cluster "${b#*=}"
        "$LOAD" put --clients "$CLIENTS" --value-size 256 --key-space "$KEY_SPACE" \
            --ops "$FILL_OPS" --duration 120s --endpoints "$ENDPOINTS" >/dev/null 2>&1 ||
            die "the fill load failed"
        for w in "${WLS[@]}"; do measure "${b%%=*}" "$run" "$w"; done
        stop_cluster
    done
done

echo
echo "#### Cost per acknowledged operation ($(date -u '+%Y-%m-%d %H:%M UTC'), $RUNS runs x $OPS ops, $CLIENTS clients, median per cell; load average after $(cut -d' ' -f1-3 /proc/loadavg))"
echo
python3 - "$RESULTS" "${BUILDS[@]}" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = [b.split("=", 1)[0] for b in sys.argv[2:]]
workloads = list(dict.fromkeys(r[2] for r in rows))
def med(rs, i):
    vals = [float(r[i]) for r in rs if r[i] != "n/a"]
    return statistics.median(vals) if vals else None
def total(rs):
    return statistics.median(float(r[4]) + float(r[5]) + float(r[6]) for r in rs)
def fmt(v, digits=1):
    return "n/a" if v is None else f"{v:,.{digits}f}"
ratio_head = "".join(f" {n} / {names[0]} members' sum |" for n in names[1:])
print("| build | workload | acked ops | leader CPU µs/op | follower CPU µs/op | follower CPU µs/op "
      "| members' sum µs/op | load generator µs/op | members' context switches/op "
      "| members' syscalls/op | members' instructions/op |" + ratio_head)
print("|" + " --- |" * (11 + len(names) - 1))
for w in workloads:
    base = total([r for r in rows if r[0] == names[0] and r[2] == w])
    for n in names:
        rs = [r for r in rows if r[0] == n and r[2] == w]
        if not rs:
            continue
        t = total(rs)
        ratios = "".join(f" {t / base:.2f} |" if n == m else " |" for m in names[1:])
        print(f"| {n} | {w} | {fmt(med(rs, 3), 0)} | {fmt(med(rs, 4))} | {fmt(med(rs, 5))} "
              f"| {fmt(med(rs, 6))} | **{fmt(t)}** | {fmt(med(rs, 7))} | {fmt(med(rs, 8))} "
              f"| {fmt(med(rs, 9))} | {fmt(med(rs, 10), 0)} |{ratios}")
EOF

#!/usr/bin/env bash
# compare-etcd.sh: raftcask vs etcd 3.4, side by side on this machine.
#
# Installs what is missing (Debian etcd-server, protobuf-compiler for the
# etcd-client crate's build, curl), builds kvnode and kvbench's
# etcd-compare in the release profile, starts a 3-member etcd (127.0.77.1-3,
# default durability: the WAL is fsynced before a write is acknowledged)
# and a 3-node raftcask (`kvnode local`, 127.0.78.1, which fsyncs its log
# before acknowledging too), each in its own data directories under one
# temporary directory, runs etcd-compare (put 256 B, put 4 KiB, linearizable
# get at the leader and at any member, stale/serializable get x 1, 16, 64
# clients) on three systems taking turns inside each cell (the order
# rotating from cell to cell): raftcask through its native gRPC API,
# raftcask through its etcd v3 ports (`raftcask-etcd`: the same etcd-client
# load code as etcd) and etcd; prints one table (with each system's
# members' CPU per operation, from /proc/PID/stat, and the load
# generator's own), writes an SVG, and
# stops everything it started (by PID, on any exit) and removes the data.
#
# Usage (as root, from anywhere in a clone):
#   deploy/bench/compare-etcd.sh [--quick] [--seconds N] [--clients 1,16,64]
#                                [--out DIR] [--no-build] [--keep-data]
#   --quick      client counts 1 and 64, 4 s per run (about 2 minutes of load)
#   --seconds N  measured seconds per system and cell (default 15, quick 4)
#   --clients L  client counts, comma-separated
#   --out DIR    where the table (compare-etcd.md) and the SVG
#                (compare-etcd.svg) go (default: TARGET/compare-etcd)
#   --no-build   use the binaries already in TARGET/release
#   --keep-data  leave the temporary data directory (its path is printed)
# Environment: CARGO_LOCK=FILE wraps the build in `flock FILE` (shared
# build machines); KVNODE=PATH runs another kvnode binary (A/B experiments);
# CARGO_TARGET_DIR (TARGET above; default: the clone's target/) is where
# the build goes and the binaries are taken from.
set -euo pipefail

# Bounds of the waits below.
READY_WAIT_S=60           # each cluster to elect a leader and answer
STOP_WAIT_S=15            # each process to exit after SIGTERM before SIGKILL
RUN_SLACK_S=300           # etcd-compare's own bound = its load time x 2 + this
SYSTEMS=3                 # raftcask, raftcask-etcd, etcd: each runs once per cell
ETCD_QUOTA_BYTES=8589934592 # etcd's backend size limit (default 2 GiB would fill on long runs)
ETCD_HOSTS=(127.0.77.1 127.0.77.2 127.0.77.3)
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
RAFTCASK_HOST=127.0.78.1
RAFTCASK_PORT_BASE=27001  # client ports 27001-27003, peer +100, admin +200, etcd +300
RAFTCASK_ETCD_OFFSET=300  # `kvnode local`'s etcd port = client port + this

die() { echo "compare-etcd: $*" >&2; exit 1; }

QUICK=0
SECONDS_ARG=()
CLIENTS_ARG=()
OUT=""
BUILD=1
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --seconds) [ $# -ge 2 ] || die "--seconds needs a value"; SECONDS_ARG=(--seconds "$2"); shift ;;
        --clients) [ $# -ge 2 ] || die "--clients needs a value"; CLIENTS_ARG=(--clients "$2"); shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; OUT="$2"; shift ;;
        --no-build) BUILD=0 ;;
        --keep-data) KEEP=1 ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${OUT:-$TARGET/compare-etcd}
mkdir -p "$OUT"

[ "$(id -u)" = 0 ] || die "run as root: it installs Debian packages when missing"

# --- tools -----------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
command -v etcd >/dev/null || apt_install etcd-server
command -v etcdctl >/dev/null || apt_install etcd-client
command -v curl >/dev/null || apt_install curl
if [ "$BUILD" = 1 ] && [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null; then
    apt_install protobuf-compiler
fi

if [ "$BUILD" = 1 ]; then
    BUILD_CMD=(cargo build --release -p kvnode -p kvbench --features kvbench/etcd
               --bin kvnode --bin etcd-compare)
    if [ -n "${CARGO_LOCK:-}" ]; then
        flock "$CARGO_LOCK" "${BUILD_CMD[@]}"
    else
        "${BUILD_CMD[@]}"
    fi
fi
KVNODE=${KVNODE:-$TARGET/release/kvnode}
COMPARE=$TARGET/release/etcd-compare
[ -x "$KVNODE" ] && [ -x "$COMPARE" ] || die "missing $KVNODE or $COMPARE (build without --no-build)"

# --- processes ---------------------------------------------------------------
WORK=$(mktemp -d /tmp/compare-etcd.XXXXXX)
PIDS=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq $((STOP_WAIT_S * 10))); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "compare-etcd: pid $pid ignored SIGTERM for ${STOP_WAIT_S} s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    if [ "$KEEP" = 1 ]; then
        echo "compare-etcd: data and logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

INITIAL_CLUSTER=""
for i in 0 1 2; do
    INITIAL_CLUSTER+="${INITIAL_CLUSTER:+,}m$((i + 1))=http://${ETCD_HOSTS[$i]}:$ETCD_PEER_PORT"
done
ETCD_ENDPOINTS=""
for i in 0 1 2; do
    host=${ETCD_HOSTS[$i]}
    name=m$((i + 1))
    mkdir -p "$WORK/etcd/$name"
    etcd --name "$name" --data-dir "$WORK/etcd/$name/data" \
        --listen-client-urls "http://$host:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://$host:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://$host:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://$host:$ETCD_PEER_PORT" \
        --initial-cluster "$INITIAL_CLUSTER" --initial-cluster-state new \
        --initial-cluster-token "compare-etcd-$$" \
        --quota-backend-bytes "$ETCD_QUOTA_BYTES" \
        >"$WORK/etcd/$name/etcd.log" 2>&1 &
    PIDS+=($!)
    ETCD_ENDPOINTS+="${ETCD_ENDPOINTS:+,}$host:$ETCD_CLIENT_PORT"
done

mkdir -p "$WORK/raftcask"
"$KVNODE" local --nodes 3 --dir "$WORK/raftcask" --host "$RAFTCASK_HOST" \
    --port-base "$RAFTCASK_PORT_BASE" >"$WORK/raftcask/local.log" 2>&1 &
PIDS+=($!)
RAFTCASK_ENDPOINTS=""
RAFTCASK_ETCD_ENDPOINTS=""
for i in 0 1 2; do
    RAFTCASK_ENDPOINTS+="${RAFTCASK_ENDPOINTS:+,}$RAFTCASK_HOST:$((RAFTCASK_PORT_BASE + i))"
    RAFTCASK_ETCD_ENDPOINTS+="${RAFTCASK_ETCD_ENDPOINTS:+,}$RAFTCASK_HOST:$((RAFTCASK_PORT_BASE + RAFTCASK_ETCD_OFFSET + i))"
done
ETCD_PIDS=$(IFS=,; echo "${PIDS[*]:0:3}")

wait_until() { # description, command...
    local what=$1; shift
    local deadline=$((SECONDS + READY_WAIT_S))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "$what not ready after ${READY_WAIT_S} s (logs in $WORK; rerun with --keep-data)"
        sleep 0.5
    done
}
etcd_ready() { ETCDCTL_API=3 etcdctl --endpoints "$ETCD_ENDPOINTS" endpoint health; }
raftcask_ready() {
    for i in 0 1 2; do
        curl -sf "http://$RAFTCASK_HOST:$((RAFTCASK_PORT_BASE + 200 + i))/ready" || return 1
    done
}
raftcask_etcd_ready() {
    ETCDCTL_API=3 etcdctl --endpoints "$RAFTCASK_ETCD_ENDPOINTS" endpoint health
}
wait_until "etcd" etcd_ready
wait_until "raftcask" raftcask_ready
wait_until "raftcask's etcd ports" raftcask_etcd_ready
# The members' process ids (`kvnode local` writes one pid file each), for
# the CPU per operation of the raftcask rows.
RAFTCASK_PIDS=""
for i in 1 2 3; do
    pid=$(cat "$WORK/raftcask/node$i/kvnode.pid" 2>/dev/null) || die "no pid file for raftcask member $i"
    RAFTCASK_PIDS+="${RAFTCASK_PIDS:+,}$pid"
done

# --- the run -------------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
    CELLS=10; PER_RUN=4; QUICK_ARG=(--quick)
else
    CELLS=15; PER_RUN=15; QUICK_ARG=()
fi
[ ${#SECONDS_ARG[@]} -gt 0 ] && PER_RUN=${SECONDS_ARG[1]}
[ ${#CLIENTS_ARG[@]} -gt 0 ] && CELLS=$((5 * $(tr ',' '\n' <<<"${CLIENTS_ARG[1]}" | wc -l)))
BOUND_S=$((CELLS * SYSTEMS * PER_RUN * 2 + RUN_SLACK_S))

echo "## raftcask (native and through its etcd port) vs etcd ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo
echo "- command: deploy/bench/compare-etcd.sh $([ "$QUICK" = 1 ] && echo --quick) ${SECONDS_ARG[*]} ${CLIENTS_ARG[*]}"
echo "- raftcask: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown) ($(rustc --version 2>/dev/null || echo rustc unknown)), release build"
echo "- etcd: $(etcd --version | head -1 | sed 's/etcd Version: //'), defaults (fsync before ack) + quota $ETCD_QUOTA_BYTES B"
echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)"
echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
# In the background and waited for, so SIGINT/SIGTERM run the trap at once
# (bash defers traps until a foreground child exits); cleanup stops it too.
timeout --signal=TERM --kill-after=10 "$BOUND_S" "$COMPARE" \
    --raftcask "$RAFTCASK_ENDPOINTS" --raftcask-etcd "$RAFTCASK_ETCD_ENDPOINTS" \
    --etcd "$ETCD_ENDPOINTS" --raftcask-pids "$RAFTCASK_PIDS" --etcd-pids "$ETCD_PIDS" \
    "${QUICK_ARG[@]}" "${SECONDS_ARG[@]}" "${CLIENTS_ARG[@]}" \
    --svg "$OUT/compare-etcd.svg" --markdown "$OUT/compare-etcd.md" &
PIDS+=($!)
set +e
wait "$!"
RC=$?
set -e
echo
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- etcd data on disk at the end: $(du -sh "$WORK/etcd" | cut -f1); raftcask: $(du -sh "$WORK/raftcask" | cut -f1)"
[ "$RC" = 0 ] || die "etcd-compare failed (exit $RC; 124 = over its ${BOUND_S} s bound)"
echo "- table: $OUT/compare-etcd.md, plot: $OUT/compare-etcd.svg"

# local-cluster.sh: sourced by the benchmark scripts beside it (not run on
# its own). One `kvnode local --nodes 3` cluster at a time, started on a
# fresh data directory and stopped by PID, and what /proc says of its
# members.
#
# The sourcing script sets, before calling anything here:
#   WORK          a scratch directory it owns (the data goes to $WORK/data)
#   HOST          the members' address (127.0.x.1)
#   PORT_BASE     client ports PORT_BASE..+2, peer +100, admin +200
#   READY_WAIT_S  seconds for the cluster to elect a leader and answer
#   STOP_WAIT_S   seconds for the cluster to exit after SIGTERM (then SIGKILL)
# and defines `die MESSAGE`.

CLUSTER_PID=""

# Endpoints of the three client ports, comma-separated.
cluster_endpoints() {
    echo "$HOST:$PORT_BASE,$HOST:$((PORT_BASE + 1)),$HOST:$((PORT_BASE + 2))"
}

# Starts `BINARY local --nodes 3` on a fresh $WORK/data; returns when every
# member answers /ready (a leader is known and applied has caught up).
start_cluster() { # binary
    rm -rf "$WORK/data"
    mkdir -p "$WORK/data"
    "$1" local --nodes 3 --dir "$WORK/data" --host "$HOST" --port-base "$PORT_BASE" \
        >"$WORK/local.log" 2>&1 &
    CLUSTER_PID=$!
    local deadline=$((SECONDS + READY_WAIT_S)) i
    for i in 0 1 2; do
        until curl -sf "http://$HOST:$((PORT_BASE + 200 + i))/ready" >/dev/null 2>&1; do
            kill -0 "$CLUSTER_PID" 2>/dev/null || die "kvnode local exited: $(tail -5 "$WORK/local.log")"
            [ "$SECONDS" -lt "$deadline" ] || die "cluster not ready after ${READY_WAIT_S} s"
            sleep 0.3
        done
    done
}

# Stops the cluster started last (SIGTERM, then SIGKILL after STOP_WAIT_S).
stop_cluster() {
    [ -n "$CLUSTER_PID" ] || return 0
    kill -TERM "$CLUSTER_PID" 2>/dev/null || true
    local _
    for _ in $(seq $((STOP_WAIT_S * 10))); do
        kill -0 "$CLUSTER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$CLUSTER_PID" 2>/dev/null || true
    wait "$CLUSTER_PID" 2>/dev/null || true
    CLUSTER_PID=""
}

# The process id of member I (1..3), from its pid file.
member_pid() { # member
    cat "$WORK/data/node$1/kvnode.pid" 2>/dev/null || die "no pid file of member $1"
}

# CPU clock ticks (user + system, every thread, exited ones included) member
# I has used so far.
member_ticks() { # member
    local fields
    # Fields after the command name: state is the first, utime the 12th.
    read -r -a fields < <(sed 's/^.*) //' "/proc/$(member_pid "$1")/stat")
    echo $((fields[11] + fields[12]))
}

# CPU clock ticks the three members have used so far.
member_cpu_ticks() {
    echo $(($(member_ticks 1) + $(member_ticks 2) + $(member_ticks 3)))
}

# One sample of a metric on member I's admin port (the first series whose
# line starts with NAME, labels included: `raftcask_raft_is_leader`,
# `raftcask_request_seconds_count{op="put"}`); 0 when absent. awk reads the
# whole page: stopping early would fail curl's write, and the pipeline.
member_metric() { # member name
    curl -sf "http://$HOST:$((PORT_BASE + 200 + $1 - 1))/metrics" |
        awk -v name="$2" '!found && index($0, name " ") == 1 { value = $2; found = 1 }
            END { print (found ? value : 0) }'
}

# The member (1..3) that leads now, or nothing.
cluster_leader() {
    local i
    for i in 1 2 3; do
        [ "$(member_metric "$i" raftcask_raft_is_leader)" = 1 ] && { echo "$i"; return; }
    done
}

#!/usr/bin/env bash
# End-to-end test of deploy/docker-compose.yml on this machine, as root:
#  1. starts a private docker engine (no systemd here) and imports the base
#     image made by deploy/make-base-image.sh (no registry is reachable);
#  2. builds the runtime image from host-built `kvnode` and `kvctl`
#     (deploy/Dockerfile.prebuilt);
#  3. `up -d`, waits until all three members are healthy, puts and gets
#     through the published ports with kvctl, reads a key through every
#     member's published Redis port (RESP) and etcd port (etcdctl);
#  4. kills the leader's container: writes continue; restarts it: it
#     catches up (its own replica serves every key, stale read);
#  5. `down` then `up` with the volumes kept: every key is still there and
#     the cluster id is unchanged (nobody re-bootstrapped);
#  6. a rolling restart of the three containers, one at a time (a leader
#     hands leadership over on SIGTERM), while
#     `kvctl bench put` runs: no write is reported failed;
#  7. `down -v`, stops the engine it started, removes what it left.
# It also checks that the TLS override (deploy/docker-compose.tls.yml) parses.
#
# Usage: deploy/test-compose.sh [BIN_DIR]   (default target/debug; holds kvnode and kvctl)
# Needs root; installs docker.io, docker-compose and debootstrap when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
bin_dir=$(cd "${1:-target/debug}" && pwd)
base_tar="$repo/target/deploy/bookworm-minbase.tar"
project=raftcask-compose-test
# Bounds: every wait below gives up after this many seconds.
deadline_s=120
started_at=$(date +%s)

log() { echo "== test-compose [$(($(date +%s) - started_at))s] $*"; }
fail() {
    echo "test-compose: FAILED: $*" >&2
    exit 1
}

if [ "$(id -u)" != 0 ]; then
    fail "needs root (it starts a docker engine); run as root or skip it knowingly"
fi
for exe in kvnode kvctl; do
    [ -x "$bin_dir/$exe" ] || fail "$bin_dir/$exe missing: build it first (cargo build -p kvnode -p kvctl)"
done
kvctl="$bin_dir/kvctl"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
command -v iptables >/dev/null || missing+=(iptables)
command -v etcdctl >/dev/null || missing+=(etcd-client)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi
[ -s "$base_tar" ] || bash deploy/make-base-image.sh "$base_tar"

# --- a private docker engine -------------------------------------------------
work=$(mktemp -d /tmp/raftcask-compose.XXXXXX)
export DOCKER_HOST="unix://$work/docker.sock"
dockerd_pid=
cleanup() {
    status=$?
    set +e
    [ -n "${bench_pid:-}" ] && kill "$bench_pid" 2>/dev/null
    if [ -n "$dockerd_pid" ]; then
        if [ $status != 0 ]; then
            echo "---- container logs (last 40 lines each)" >&2
            for c in node1 node2 node3; do
                echo "---- $c" >&2
                compose logs --no-color --tail 40 "$c" >&2 2>/dev/null
            done
        fi
        compose down -v -t 2 >/dev/null 2>&1
        kill "$dockerd_pid" 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
        remove_docker_chains
    fi
    # dockerd bind-mounts its data root; one killed uncleanly leaves it.
    awk -v w="$work" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf "$work"
    exit $status
}
trap cleanup EXIT
# dockerd leaves its iptables chains behind when it stops: remove exactly
# those (jumps from the built-in chains first, then the DOCKER* chains).
remove_docker_chains() {
    local table chain rule
    for table in filter nat; do
        iptables -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j DOCKER' | grep -vE '^-A DOCKER' |
            while read -r rule; do
                # shellcheck disable=SC2086
                iptables -t "$table" ${rule/-A/-D} 2>/dev/null
            done
        for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N DOCKER/ { print $2 }'); do
            iptables -t "$table" -F "$chain" 2>/dev/null
        done
        for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N DOCKER/ { print $2 }'); do
            iptables -t "$table" -X "$chain" 2>/dev/null
        done
    done
}
log "starting dockerd (data in $work)"
# --bridge=none: no default docker0 bridge; compose makes its own network.
dockerd --data-root "$work/data" --exec-root "$work/exec" -H "$DOCKER_HOST" \
    --pidfile "$work/docker.pid" --bridge=none >"$work/dockerd.log" 2>&1 &
dockerd_pid=$!
until docker info >/dev/null 2>&1; do
    kill -0 "$dockerd_pid" 2>/dev/null || { tail -n 20 "$work/dockerd.log" >&2; fail "dockerd exited"; }
    [ $(($(date +%s) - started_at)) -lt $deadline_s ] || fail "dockerd not up in ${deadline_s}s"
    sleep 0.5
done
compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose -p "$project" -f "$repo/deploy/docker-compose.yml" "$@"
    else
        docker-compose -p "$project" -f "$repo/deploy/docker-compose.yml" "$@"
    fi
}

# The TLS variant (deploy/docker-compose.tls.yml) is not run here, but it must
# parse together with the base file.
if docker compose version >/dev/null 2>&1; then
    docker compose -p "$project" -f "$repo/deploy/docker-compose.yml" \
        -f "$repo/deploy/docker-compose.tls.yml" config >/dev/null
else
    docker-compose -p "$project" -f "$repo/deploy/docker-compose.yml" \
        -f "$repo/deploy/docker-compose.tls.yml" config >/dev/null
fi || fail "deploy/docker-compose.tls.yml does not parse with docker-compose.yml"
log "the TLS override parses"

# --- images -------------------------------------------------------------------
log "importing the base image and building raftcask:latest from $bin_dir"
docker import "$base_tar" debian:bookworm-slim >/dev/null
ctx="$work/ctx"
mkdir -p "$ctx"
# Without debug info: the debug build's binaries are mostly DWARF.
for exe in kvnode kvctl; do
    strip -o "$ctx/$exe" "$bin_dir/$exe" 2>/dev/null || cp "$bin_dir/$exe" "$ctx/$exe"
done
docker build -q -f deploy/Dockerfile.prebuilt -t raftcask:latest "$ctx" >/dev/null

# --- helpers ------------------------------------------------------------------
endpoints="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
ctl() { "$kvctl" --endpoints "$endpoints" "$@"; }
# The member id serving 127.0.0.1:700N (client port N) is N.
endpoint_of() { echo "127.0.0.1:700$1"; }
wait_healthy() {
    local want="$*" since
    since=$(date +%s)
    while true; do
        local ok=0 c
        for c in $want; do
            [ "$(docker inspect -f '{{.State.Health.Status}}' "$(compose ps -q "$c")" 2>/dev/null)" = healthy ] && ok=$((ok + 1))
        done
        [ "$ok" = "$(echo "$want" | wc -w)" ] && return 0
        [ $(($(date +%s) - since)) -lt $deadline_s ] || fail "containers $want not healthy in ${deadline_s}s"
        sleep 1
    done
}
# What member N's admin port says about the leader (`/ready` names it
# whether or not the member is ready); empty when it does not answer.
leader_seen_by() {
    python3 - "$1" <<'PY' 2>/dev/null || true
import re, socket, sys
s = socket.create_connection(("127.0.0.1", 7200 + int(sys.argv[1])), timeout=3)
s.sendall(b"GET /ready HTTP/1.0\r\n\r\n")
body = b""
while chunk := s.recv(4096):
    body += chunk
m = re.search(rb"leader (\d+)", body)
print(m.group(1).decode() if m else "")
PY
}
# The leader's id once every given member names the same one (other than
# $not_leader when set: a killed leader's peers still name it for a moment).
not_leader=
leader_of() {
    local since
    since=$(date +%s)
    while true; do
        local leaders="" n
        for n in "$@"; do
            leaders+="$(leader_seen_by "$n") "
        done
        local first=${leaders%% *}
        if [ -n "$first" ] && [ "$first" != 0 ] && [ "$first" != "$not_leader" ] && [ "$(echo "$leaders" | tr ' ' '\n' | grep -v '^$' | sort -u)" = "$first" ] &&
            [ "$(echo "$leaders" | wc -w)" = $# ]; then
            echo "$first"
            return 0
        fi
        [ $(($(date +%s) - since)) -lt $deadline_s ] || fail "members $* agree on no leader in ${deadline_s}s (saw: $leaders)"
        sleep 1
    done
}
cluster_id() {
    "$kvctl" --endpoints "$(endpoint_of "$1")" status -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster_id"])'
}
# Every key k0..k(N-1) of a batch reads back with its value from member $1
# (stale read: that member's own replica), retrying until caught up.
check_keys() {
    local member=$1 prefix=$2 count=$3 since i got
    since=$(date +%s)
    for i in $(seq 0 $((count - 1))); do
        while true; do
            got=$("$kvctl" --endpoints "$(endpoint_of "$member")" get --consistency stale "$prefix$i" 2>/dev/null || true)
            [ "$got" = "value-$prefix$i" ] && break
            [ $(($(date +%s) - since)) -lt $deadline_s ] || fail "member $member: $prefix$i reads '$got', want value-$prefix$i"
            sleep 0.5
        done
    done
}
put_keys() {
    local prefix=$1 count=$2 i
    for i in $(seq 0 $((count - 1))); do
        ctl put "$prefix$i" "value-$prefix$i" >/dev/null || fail "put $prefix$i failed (exit $?)"
    done
}

# --- the scenario ---------------------------------------------------------------
log "compose up"
compose up -d --no-build
wait_healthy node1 node2 node3
leader=$(leader_of 1 2 3)
first_cluster=$(cluster_id 1)
log "healthy; leader is member $leader, cluster $first_cluster"
put_keys a 20
[ "$(ctl get a7)" = value-a7 ] || fail "get a7 through the published ports"
# The front ends' published ports: every member serves a7 (a Redis GET on
# a follower may read its own replica: retried until it caught up).
for port in 6379 6380 6381; do
    python3 - "$port" "$deadline_s" <<'PY' || fail "GET a7 through the Redis port 127.0.0.1:$port"
import socket, sys, time
port, deadline = int(sys.argv[1]), time.time() + int(sys.argv[2])
while True:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"*2\r\n$3\r\nGET\r\n$2\r\na7\r\n")
            got = s.recv(4096)
    except OSError as err:
        got = repr(err).encode()
    if got == b"$8\r\nvalue-a7\r\n":
        break
    if time.time() > deadline:
        sys.exit(f"port {port} answered {got!r}")
    time.sleep(0.5)
PY
done
for port in 2379 22379 32379; do
    got=$(ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" --command-timeout=30s get a7 --print-value-only 2>&1 || true)
    [ "$got" = value-a7 ] || fail "etcdctl get a7 through the etcd port 127.0.0.1:$port answered '$got'"
done
log "a7 reads back through every member's Redis and etcd port"
ctl status
log "inside a container: docker compose exec node1 kvctl status"
compose exec -T node1 kvctl status >/dev/null || fail "kvctl status inside node1"

log "killing the leader's container (member $leader)"
docker kill "$(compose ps -q "node$leader")" >/dev/null
rest=$(for n in 1 2 3; do [ "$n" != "$leader" ] && printf '%s ' "$n"; done)
# shellcheck disable=SC2086
new_leader=$(not_leader=$leader leader_of $rest)
log "new leader: member $new_leader; writing with member $leader down"
put_keys b 20
log "restarting member $leader; it must catch up"
compose start "node$leader" >/dev/null
wait_healthy node1 node2 node3
check_keys "$leader" a 20
check_keys "$leader" b 20

log "down (volumes kept), up again"
compose down -t 10
compose up -d --no-build
wait_healthy node1 node2 node3
leader=$(leader_of 1 2 3)
for n in 1 2 3; do
    check_keys "$n" a 20
    check_keys "$n" b 20
    [ "$(cluster_id "$n")" = "$first_cluster" ] || fail "member $n reports cluster $(cluster_id "$n"), was $first_cluster: re-bootstrapped"
done
log "every key survived down/up; cluster id unchanged"

log "rolling restart under kvctl bench put"
bench_out="$work/bench.json"
ctl bench put --clients 16 --duration 60s --key-space 1000 -o json >"$bench_out" 2>"$work/bench.err" &
bench_pid=$!
for n in 1 2 3; do
    sleep 3
    log "restarting node$n"
    compose restart -t 10 "node$n" >/dev/null
    wait_healthy node1 node2 node3
    leader_of 1 2 3 >/dev/null
done
bench_status=0
wait "$bench_pid" || bench_status=$?
if [ "$bench_status" != 0 ]; then
    cat "$work/bench.err" "$bench_out" >&2
    fail "kvctl bench exited $bench_status"
fi
bench_pid=
python3 - "$bench_out" <<'PY' || fail "bench reported failed writes"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"bench: {r['ops_ok']} ok, {r['errors']} errors {r.get('errors_by_kind')}, {r['ops_per_second']:.0f} ops/s, "
      f"p99 {r['latency_ms']['p99']} ms, max {r['latency_ms']['max']} ms")
sys.exit(0 if r["errors"] == 0 and r["ops_ok"] > 0 else 1)
PY

log "down -v"
compose down -v -t 10
log "PASSED"

#!/usr/bin/env bash
# Structural check of raftcask.yaml (no Kubernetes cluster is reachable
# here): it parses as YAML, holds the headless Service and the StatefulSet,
# every named port the probes and Services use is declared by the container,
# every KVNODE_* variable is one `kvnode run` reads, and the initial cluster
# lists one member per replica under the headless Service's names.
# Needs python3 with PyYAML (Debian python3-yaml; installed when root).
set -euo pipefail
cd "$(dirname "$0")"
py=python3
if ! "$py" -c 'import yaml' 2>/dev/null; then
    if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
        py=/usr/bin/python3
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-yaml >/dev/null
        py=/usr/bin/python3
    else
        echo "kubernetes/check.sh: FAILED: needs PyYAML (Debian python3-yaml)" >&2
        exit 1
    fi
fi
known=$(grep -o 'env = "KVNODE_[A-Z_]*"' ../../node/kvnode/src/bin/kvnode/*.rs | sed 's/.*"\(.*\)"/\1/' | sort -u)
"$py" - raftcask.yaml "$known" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
known = set(sys.argv[2].split())
kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
svc = kinds[("Service", "raftcask")]
sts = kinds[("StatefulSet", "raftcask")]
assert svc["spec"]["clusterIP"] == "None", "the member Service must be headless"
assert svc["spec"].get("publishNotReadyAddresses") is True, "members must resolve before ready"
assert sts["spec"]["serviceName"] == "raftcask"
assert sts["spec"]["podManagementPolicy"] == "Parallel"
replicas = sts["spec"]["replicas"]
pod = sts["spec"]["template"]["spec"]
(c,) = pod["containers"]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
for d in docs:
    if d["kind"] == "Service":
        for p in d["spec"]["ports"]:
            assert p["targetPort"] in ports, f"Service {d['metadata']['name']}: unknown port {p['targetPort']}"
for probe in ("livenessProbe", "readinessProbe"):
    assert c[probe]["httpGet"]["port"] in ports
env = {e["name"]: e["value"] for e in c["env"]}
for name in env:
    if name.startswith("KVNODE_"):
        assert name in known, f"{name} is not a variable kvnode run reads ({sorted(known)})"
members = env["KVNODE_INITIAL_CLUSTER"].split(",")
assert len(members) == replicas, "one initial member per replica"
for i, m in enumerate(members):
    want = f"{i + 1}=raftcask-{i}.raftcask:{ports['client']}/raftcask-{i}.raftcask:{ports['peer']}"
    assert m == want, f"member {i + 1}: {m!r}, want {want!r}"
labels = sts["spec"]["selector"]["matchLabels"]
assert all(sts["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in labels.items())
print(f"kubernetes/raftcask.yaml: {len(docs)} objects, {replicas} members, structure ok")
PY

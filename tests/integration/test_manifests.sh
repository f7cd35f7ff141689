#!/usr/bin/env bash
# Offline checks of the deployment manifests (deploy/compose.yaml, deploy/k8s/*.yaml,
# deploy/systemd/*.service):
#
#   test_manifests.sh SRC_DIR BUILD_DIR PS_SERVER PS_WORKER
#
# 1. Every Kubernetes object of deploy/k8s validates against the Kubernetes JSON schemas
#    (kubernetes-validate, pinned, --strict: unknown fields are errors) for the oldest and the
#    newest Kubernetes version checked; the TFJob (a custom resource, no schema there) is
#    checked through its replicas' pod templates, validated as PodTemplate objects, plus what
#    the training operator needs (container "tensorflow", port 2222). A broken manifest must
#    fail the validator (so this check can fail).
# 2. Consistency: StatefulSet replicas = ps addresses and each address is
#    <statefulset>-<i>.<headless service>:<containerPort>; Job completions = worker addresses,
#    each <job>-<i>.<subdomain>:port with a headless Service of that name; --checkpoint-dir
#    is where the checkpoint volume is mounted (StatefulSet, TFJob, compose); in compose every
#    service has its own task and all share one cluster.
# 3. Every TF_CONFIG: those written in the manifests, those the image's entrypoint
#    (deploy/container-entrypoint.sh --print-tf-config) builds for the StatefulSet's ordinals
#    and the indexed Job's JOB_COMPLETION_INDEX 0..N-1, and those Kubeflow's operator would
#    set for the TFJob's replicas, are parsed by our own programs: ps tasks by ps-server
#    (starts, serves on a loopback port, stops on SIGTERM with exit 0), worker tasks by
#    ps-worker (exit 2 naming the missing data directory given on purpose, not a bad spec).
#    Bad specs must be refused with exit 2 (negative controls).
# 4. systemd units: systemd-analyze verify (when systemd-analyze exists), no warning about
#    our units.
# 5. Images: no file under deploy/ names an image that is not our own (localhost/...): every
#    image: of a manifest (${VAR:-default} by its default), every FROM and *IMAGE* ARG default
#    of the Containerfile, every NAME=${..:-image} default of a script, and no registry host
#    (docker.io, gcr.io, quay.io, ...) anywhere; a copy of deploy/ with a registry image put
#    back must fail. The etcd service (compose.replicated.yaml, k8s/etcd.yaml) runs
#    localhost/psd-etcd built from the Containerfile's target etcd, and every etcd flag it
#    passes is one etcd 3.4 knows (`etcd --help` of Debian's etcd-server, when installed).
#
# Needs python3 with venv and network access to PyPI the first time (the venv is kept under
# BUILD_DIR/manifests-venv); otherwise exit 77 (skipped) saying why.
set -u
SRC=${1:?source dir}
BUILD=${2:?build dir}
PS_SERVER=${3:?ps-server}
PS_WORKER=${4:?ps-worker}
PS_SERVER=$(realpath "$PS_SERVER")
PS_WORKER=$(realpath "$PS_WORKER")
KV_VERSION=1.34.1           # kubernetes-validate on PyPI
K8S_VERSIONS="1.30.0 1.34.0" # Kubernetes versions validated against

ENTRY="$SRC/deploy/container-entrypoint.sh"
tmp=$(mktemp -d /tmp/ps-test-manifests-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
skip() {
    echo "SKIP: $*"
    exit 77
}

# ---- the validator, in a venv of its own ------------------------------------------------------
venv="$BUILD/manifests-venv"
if [ ! -x "$venv/bin/kubernetes-validate" ] ||
    ! "$venv/bin/pip" show kubernetes-validate 2>/dev/null | grep -qx "Version: $KV_VERSION"; then
    command -v python3 >/dev/null || skip "python3 not found (needed for kubernetes-validate)"
    rm -rf "$venv"
    python3 -m venv "$venv" >"$tmp/venv.log" 2>&1 ||
        skip "python3 -m venv failed (apt-get install python3-venv): $(tail -n 1 "$tmp/venv.log")"
    if ! timeout 300 "$venv/bin/pip" install --disable-pip-version-check -q \
        "kubernetes-validate==$KV_VERSION" >"$tmp/pip.log" 2>&1; then
        rm -rf "$venv"
        skip "pip install kubernetes-validate==$KV_VERSION failed (no network access to PyPI?): $(tail -n 1 "$tmp/pip.log")"
    fi
fi
PY="$venv/bin/python"
KV="$venv/bin/kubernetes-validate"

# ---- 1. schemas -------------------------------------------------------------------------------
# The TFJob's pod templates as PodTemplate objects (and the operator's requirements).
"$PY" - "$SRC/deploy/k8s/tfjob.yaml" "$tmp/tfjob-pods.yaml" <<'EOF' || fail "tfjob.yaml"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
jobs = [d for d in docs if d.get("kind") == "TFJob"]
assert len(jobs) == 1, "expected one TFJob"
job = jobs[0]
assert job["apiVersion"] == "kubeflow.org/v1", job["apiVersion"]
out = []
for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
    assert rtype in ("PS", "Worker", "Chief", "Evaluator", "Master"), rtype
    assert spec.get("restartPolicy") in ("Always", "OnFailure", "Never", "ExitCode"), rtype
    cs = spec["template"]["spec"]["containers"]
    names = [c["name"] for c in cs]
    assert "tensorflow" in names, f"{rtype}: no container named tensorflow ({names})"
    tf = cs[names.index("tensorflow")]
    ports = [(p.get("name"), p["containerPort"]) for p in tf.get("ports", [])]
    assert ("tfjob-port", 2222) in ports, f"{rtype}: no port tfjob-port 2222 ({ports})"
    assert "command" not in tf, f"{rtype}: the image's entrypoint must run unmodified"
    out.append({"apiVersion": "v1", "kind": "PodTemplate",
                "metadata": {"name": f"{job['metadata']['name']}-{rtype.lower()}"},
                "template": spec["template"]})
yaml.safe_dump_all(out, open(sys.argv[2], "w"))
print(f"tfjob.yaml: {len(out)} replica types, container tensorflow with port 2222")
EOF
manifests=("$SRC"/deploy/k8s/*.yaml "$tmp/tfjob-pods.yaml")
for v in $K8S_VERSIONS; do
    "$KV" --strict --quiet -k "$v" "${manifests[@]}" >"$tmp/kv.log" 2>&1
    rc=$?
    grep -v "Couldn't find schema for kind TFJob" "$tmp/kv.log" | grep -E "ERROR|WARN" && rc=1
    [ "$rc" -eq 0 ] || { cat "$tmp/kv.log" >&2; fail "kubernetes-validate -k $v rejected a manifest"; }
done
n=$("$KV" --strict -k "${K8S_VERSIONS##* }" "${manifests[@]}" 2>&1 | grep -c "passed for resource")
[ "$n" -ge 7 ] || fail "only $n Kubernetes objects validated, expected at least 7"
echo "kubernetes-validate $KV_VERSION --strict: $n objects pass against Kubernetes $K8S_VERSIONS"
# Negative control: a typo and a wrong type must be rejected.
sed -e 's/^  replicas: 2/  replicas: two/' -e 's/podManagementPolicy:/podManagementPolicee:/' \
    "$SRC/deploy/k8s/ps.yaml" >"$tmp/broken.yaml"
"$KV" --strict --quiet -k "${K8S_VERSIONS##* }" "$tmp/broken.yaml" >/dev/null 2>&1 &&
    fail "kubernetes-validate accepted a broken StatefulSet"

# ---- 2. consistency, and the TF_CONFIGs to check ------------------------------------------
# Writes lines "label<TAB>TF_CONFIG" or "label<TAB>@gen<TAB>TYPE<TAB>CLUSTER_JSON<TAB>N<TAB>how".
"$PY" - "$SRC" "$tmp/configs.tsv" <<'EOF' || fail "manifest consistency"
import json, os, re, sys, yaml
src, out_path = sys.argv[1], sys.argv[2]
out = []
def load(p):
    return [d for d in yaml.safe_load_all(open(os.path.join(src, p))) if d]
def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}
def arg_after(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None

# -- Kubernetes: StatefulSet + headless Service (ps), indexed Job + headless Service (workers)
k8s = load("deploy/k8s/ps.yaml") + load("deploy/k8s/workers.yaml")
svcs = {d["metadata"]["name"]: d for d in k8s if d["kind"] == "Service"}
sts = [d for d in k8s if d["kind"] == "StatefulSet"]
jobs = [d for d in k8s if d["kind"] == "Job"]
assert len(sts) == 1 and len(jobs) == 1, "expected one StatefulSet and one Job"
sts, job = sts[0], jobs[0]
sc = sts["spec"]["template"]["spec"]["containers"][0]
jc = job["spec"]["template"]["spec"]["containers"][0]
clusters = {env_of(c).get("PSD_CLUSTER_JSON") for c in (sc, jc)}
assert len(clusters) == 1 and None not in clusters, "ps and workers must share PSD_CLUSTER_JSON"
cluster_json = clusters.pop()
cluster = json.loads(cluster_json)
svc = svcs[sts["spec"]["serviceName"]]
assert svc["spec"].get("clusterIP") == "None", "the ps Service must be headless"
sel = svc["spec"]["selector"]
labels = sts["spec"]["template"]["metadata"]["labels"]
assert all(labels.get(k) == v for k, v in sel.items()), "the ps Service does not select the ps pods"
port = sc["ports"][0]["containerPort"]
assert sts["spec"]["replicas"] == len(cluster["ps"]), "StatefulSet replicas != ps addresses"
for i, a in enumerate(cluster["ps"]):
    want = f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}"
    assert a == want, f"ps address {i} is {a}, the pod's DNS name is {want}"
assert env_of(sc).get("PSD_TASK_TYPE") == "ps"
listen = env_of(sc).get("PS_LISTEN")
assert listen in (None, f"tcp://0.0.0.0:{port}"), f"PS_LISTEN {listen} is not the container port"
ckpt = arg_after(sc.get("args", []), "--checkpoint-dir")
vct = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
mounts = {m["mountPath"]: m["name"] for m in sc.get("volumeMounts", [])}
assert ckpt in mounts and mounts[ckpt] in vct, \
    f"--checkpoint-dir {ckpt} is not a volumeClaimTemplate mount ({mounts})"
for p in ("readinessProbe", "livenessProbe"):
    cmd = " ".join(sc[p]["exec"]["command"])
    assert f"/dev/tcp/127.0.0.1/{port}" in cmd, f"{p} does not check port {port}"
assert sc.get("resources", {}).get("requests"), "ps without resource requests"
# Workers: indexed Job, one completion per worker address, pod DNS names via the subdomain.
js = job["spec"]
assert js.get("completionMode") == "Indexed", "the worker Job must be Indexed"
assert js["completions"] == len(cluster["worker"]) == js.get("parallelism", 1), \
    "Job completions/parallelism != worker addresses"
sub = js["template"]["spec"].get("subdomain")
assert sub in svcs and svcs[sub]["spec"].get("clusterIP") == "None", "no headless Service for the subdomain"
for i, a in enumerate(cluster["worker"]):
    host = a.rsplit(":", 1)[0]
    assert host == f"{job['metadata']['name']}-{i}.{sub}", f"worker address {i} is {a}"
assert env_of(jc).get("PSD_TASK_TYPE") == "worker"
assert jc.get("resources", {}).get("requests"), "workers without resource requests"
out.append(f"k8s StatefulSet ps\t@gen\tps\t{cluster_json}\t{len(cluster['ps'])}\thostname")
out.append(f"k8s indexed Job\t@gen\tworker\t{cluster_json}\t{len(cluster['worker'])}\tjob-index")

# -- TFJob: what the training operator sets (its TF_CONFIG form for replicas of a TFJob)
tj = [d for d in load("deploy/k8s/tfjob.yaml") if d["kind"] == "TFJob"][0]
name, rs = tj["metadata"]["name"], tj["spec"]["tfReplicaSpecs"]
tcl = {t.lower(): [f"{name}-{t.lower()}-{i}.default.svc:2222" for i in range(s["replicas"])]
       for t, s in rs.items()}
for t, s in rs.items():
    c = s["template"]["spec"]["containers"][0]
    if t == "PS":
        ck = arg_after(c.get("args", []), "--checkpoint-dir")
        ms = {m["mountPath"] for m in c.get("volumeMounts", [])}
        assert ck in ms, f"TFJob PS --checkpoint-dir {ck} is not a mounted volume"
    for i in range(s["replicas"]):
        out.append(f"TFJob {t} {i}\t" + json.dumps(
            {"cluster": tcl, "task": {"type": t.lower(), "index": i}, "environment": "cloud"},
            separators=(",", ":")))

# -- compose: one task per service, one cluster, the checkpoint volume at --checkpoint-dir
comp = load("deploy/compose.yaml")[0]
vols = set((comp.get("volumes") or {}).keys())
seen_cluster, tasks = None, set()
for sname, s in comp["services"].items():
    tfc = s["environment"]["TF_CONFIG"]
    tc = json.loads(tfc)
    if seen_cluster is None:
        seen_cluster = tc["cluster"]
    assert tc["cluster"] == seen_cluster, f"compose {sname}: another cluster"
    task = (tc["task"]["type"], tc["task"]["index"])
    assert task not in tasks, f"compose {sname}: task {task} twice"
    tasks.add(task)
    addr = seen_cluster[task[0]][task[1]]
    assert addr.split(":")[0] == sname, f"compose {sname}: its address is {addr}"
    if task[0] == "ps":
        ck = arg_after(s.get("command", []), "--checkpoint-dir")
        mounted = {v.split(":")[1]: v.split(":")[0] for v in s.get("volumes", [])}
        assert ck in mounted and mounted[ck] in vols, \
            f"compose {sname}: --checkpoint-dir {ck} is not on a named volume ({mounted})"
    out.append(f"compose {sname}\t{tfc}")
want = {(t, i) for t, l in seen_cluster.items() for i in range(len(l))}
assert tasks == want, f"compose: tasks {sorted(tasks)} != cluster {sorted(want)}"
# -- compose.replicated.yaml (optional override): etcd, and replicas/coordinator for every task
rep = load("deploy/compose.replicated.yaml")[0]
etcd_cmd = rep["services"]["etcd"]["command"]
assert "--listen-client-urls=http://0.0.0.0:2379" in etcd_cmd, "compose etcd: not on 2379"
for sname, s in rep["services"].items():
    if sname == "etcd":
        continue
    assert sname in comp["services"], f"compose.replicated: {sname} is not a service of compose.yaml"
    env = s["environment"]
    assert env["PS_COORDINATOR"] == "http://etcd:2379", f"compose.replicated {sname}: coordinator"
    assert 2 <= int(env["PS_REPLICAS"]) <= len(seen_cluster["ps"]), \
        f"compose.replicated {sname}: replicas {env['PS_REPLICAS']} for {len(seen_cluster['ps'])} ps"
assert set(rep["services"]) - {"etcd"} == set(comp["services"]), \
    "compose.replicated: every task needs replicas and coordinator"
# -- k8s/etcd.yaml (optional): the Service named in its instructions selects the etcd pods
ek = load("deploy/k8s/etcd.yaml")
esvc = [d for d in ek if d["kind"] == "Service"][0]
ests = [d for d in ek if d["kind"] == "StatefulSet"][0]
assert esvc["metadata"]["name"] == "psd-etcd" and esvc["spec"]["ports"][0]["port"] == 2379
elabels = ests["spec"]["template"]["metadata"]["labels"]
assert all(elabels.get(k) == v for k, v in esvc["spec"]["selector"].items()), \
    "the etcd Service does not select the etcd pod"
with open(out_path, "w") as f:
    f.write("\n".join(out) + "\n")
print("manifests consistent: k8s ps/worker DNS names, replicas, volumes; TFJob; compose "
      f"({len(comp['services'])} services)")
EOF

# ---- 3. every TF_CONFIG through our own parser -------------------------------------------------
# check_tf LABEL TF_CONFIG [expect: ok|bad]
checked=0
check_tf() {
    local label=$1 tf=$2 expect=${3:-ok} type rc
    type=$(printf '%s' "$tf" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["task"]["type"])' 2>/dev/null)
    case "$type" in
    ps)
        # Stopped with SIGTERM once it serves (or exits by itself), never on a fixed clock:
        # a loaded machine may take seconds to start it. The log starts empty: "serving on"
        # left from the previous check would be read before this server even started, and
        # the SIGTERM would then reach the forked shell before its exec, which runs this
        # script's EXIT trap there (removing $tmp) and dies of it (exit 143).
        rm -f "$tmp/check.log"
        : >"$tmp/check.log"
        TF_CONFIG=$tf "$PS_SERVER" --log-format text --listen tcp://127.0.0.1:0 \
            >"$tmp/check.log" 2>&1 &
        local pid=$! waited=0
        while kill -0 "$pid" 2>/dev/null && ! grep -q "serving on" "$tmp/check.log" &&
            [ "$waited" -lt 600 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        kill -TERM "$pid" 2>/dev/null
        wait "$pid"
        rc=$?
        if [ "$expect" = ok ]; then
            [ "$rc" -eq 0 ] && grep -q "serving on" "$tmp/check.log" ||
                { cat "$tmp/check.log" >&2; fail "$label: ps-server did not serve with $tf (exit $rc)"; }
        else
            [ "$rc" -eq 2 ] && grep -q "bad cluster spec" "$tmp/check.log" ||
                { cat "$tmp/check.log" >&2; fail "$label: ps-server accepted the bad spec $tf (exit $rc)"; }
        fi
        ;;
    *)
        TF_CONFIG=$tf "$PS_WORKER" --log-format text --device cpu --data-dir "$tmp/no-data" \
            >"$tmp/check.log" 2>&1
        rc=$?
        [ "$rc" -eq 2 ] || { cat "$tmp/check.log" >&2; fail "$label: ps-worker exited $rc, expected 2"; }
        if [ "$expect" = ok ]; then
            grep -q "$tmp/no-data" "$tmp/check.log" && ! grep -q "bad cluster spec" "$tmp/check.log" ||
                { cat "$tmp/check.log" >&2; fail "$label: ps-worker refused $tf"; }
        else
            grep -q "bad cluster spec" "$tmp/check.log" ||
                { cat "$tmp/check.log" >&2; fail "$label: ps-worker accepted the bad spec $tf"; }
        fi
        ;;
    esac
    checked=$((checked + 1))
}

while IFS=$'\t' read -r label tf type cl n how; do
    [ -n "$label" ] || continue
    if [ "$tf" != "@gen" ]; then
        check_tf "$label" "$tf"
        continue
    fi
    # The entrypoint builds TF_CONFIG from PSD_CLUSTER_JSON and the pod's index.
    for ((i = 0; i < n; i++)); do
        if [ "$how" = hostname ]; then
            gen=$(env -u TF_CONFIG -u JOB_COMPLETION_INDEX -u PSD_TASK_INDEX PSD_CLUSTER_JSON="$cl" \
                PSD_TASK_TYPE="$type" HOSTNAME="psd-ps-$i" sh "$ENTRY" --print-tf-config) ||
                fail "$label: the entrypoint built no TF_CONFIG for pod psd-ps-$i"
        else
            gen=$(env -u TF_CONFIG -u PSD_TASK_INDEX PSD_CLUSTER_JSON="$cl" PSD_TASK_TYPE="$type" \
                JOB_COMPLETION_INDEX="$i" HOSTNAME="psd-worker-$i-x7k2q" sh "$ENTRY" --print-tf-config) ||
                fail "$label: the entrypoint built no TF_CONFIG for index $i"
        fi
        printf '%s' "$gen" | grep -q "\"task\":{\"type\":\"$type\",\"index\":$i}" ||
            fail "$label: index $i gave $gen"
        check_tf "$label $i" "$gen"
    done
done <"$tmp/configs.tsv"
[ "$checked" -ge 12 ] || fail "only $checked TF_CONFIGs checked"
# Negative controls: what the entrypoint and the programs must refuse.
env -u TF_CONFIG -u JOB_COMPLETION_INDEX PSD_CLUSTER_JSON='{"ps":["a:1"]}' PSD_TASK_TYPE=ps \
    HOSTNAME=nohostindex sh "$ENTRY" --print-tf-config >/dev/null 2>&1 &&
    fail "the entrypoint made a TF_CONFIG without a pod index"
check_tf "bad address" '{"cluster":{"ps":["psd-ps-0.psd-ps"]},"task":{"type":"ps","index":0}}' bad
check_tf "bad index" '{"cluster":{"ps":["a:1"],"worker":["b:2"]},"task":{"type":"worker","index":2}}' bad
check_tf "bad json" '{"cluster":{"ps":["a:1"],"worker":["b:2"]},"task":{"type":"worker","index":0}' bad
echo "$checked TF_CONFIGs parsed by ps-server/ps-worker (manifests, entrypoint for each index, TFJob); bad ones refused with exit 2"

# ---- 4. systemd units -----------------------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
    # Instances of the templates, with the executables of this build in place of the installed
    # ones (verify checks that they exist).
    for u in ps-server ps-worker; do
        sed -e "s#/usr/local/bin/ps-server#$PS_SERVER#" -e "s#/usr/local/bin/ps-worker#$PS_WORKER#" \
            "$SRC/deploy/systemd/$u@.service" >"$tmp/$u@test.service"
    done
    (cd "$tmp" && systemd-analyze verify ./ps-server@test.service ./ps-worker@test.service) \
        >"$tmp/verify.log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] || grep -q "ps-\(server\|worker\)@" "$tmp/verify.log"; then
        cat "$tmp/verify.log" >&2
        fail "systemd-analyze verify: exit $rc or warnings about the units"
    fi
    for want in "RestartPreventExitStatus=2" "Restart=on-failure" "DynamicUser=yes" \
        "ProtectSystem=strict" "NoNewPrivileges=yes" "EnvironmentFile=/etc/psd/%i.env"; do
        grep -qx "$want" "$SRC/deploy/systemd/ps-server@.service" ||
            fail "ps-server@.service lacks $want"
        grep -qx "$want" "$SRC/deploy/systemd/ps-worker@.service" ||
            fail "ps-worker@.service lacks $want"
    done
    # Negative control: a bad directive is reported.
    sed 's/^Restart=on-failure/Restart=sometimes/' "$tmp/ps-server@test.service" >"$tmp/ps-server@bad.service"
    (cd "$tmp" && systemd-analyze verify ./ps-server@bad.service) 2>&1 | grep -q "ps-server@bad" ||
        fail "systemd-analyze verify did not report a bad directive"
    echo "systemd-analyze verify: ps-server@.service and ps-worker@.service clean"
else
    echo "systemd-analyze not found: the systemd units were not verified"
fi
# ---- 5. images: our own only, and etcd 3.4's flags ----------------------------------------
cat >"$tmp/images.py" <<'EOF'
import os, re, sys, yaml
root = sys.argv[1]
REGISTRY = re.compile(r"\b(docker\.io|gcr\.io|quay\.io|ghcr\.io|registry\.k8s\.io|"
                      r"registry\.gitlab\.com|mcr\.microsoft\.com|public\.ecr\.aws|"
                      r"[a-z0-9-]+\.pkg\.dev|[a-z0-9.-]*azurecr\.io)\b")
def resolve(v):
    # ${VAR:-default} / ${VAR-default} stands for its default.
    m = re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", v.strip())
    return m.group(1) if m else v.strip()
bad, seen = [], []
def check(where, ref):
    ref = resolve(ref.strip().strip("'\""))
    seen.append(ref)
    if not ref.startswith("localhost/"):
        bad.append(f"{where}: image {ref} is not ours (localhost/...)")
def walk_yaml(where, node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "image" and isinstance(v, str):
                check(where, v)
            else:
                walk_yaml(where, v)
    elif isinstance(node, list):
        for v in node:
            walk_yaml(where, v)
for d, _, files in os.walk(root):
    for f in sorted(files):
        path = os.path.join(d, f)
        rel = os.path.relpath(path, os.path.dirname(root))
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = REGISTRY.search(line)
            if m:
                bad.append(f"{rel}:{n}: names the registry {m.group(1)}")
        if f.endswith((".yaml", ".yml")):
            for doc in yaml.safe_load_all(text):
                walk_yaml(rel, doc)
        elif f.startswith(("Containerfile", "Dockerfile")):
            args, stages = {}, set()
            for n, line in enumerate(text.splitlines(), 1):
                m = re.match(r"\s*ARG\s+([A-Za-z_]+)=(\S+)", line)
                if m:
                    args[m.group(1)] = m.group(2).strip('"')
                    if "IMAGE" in m.group(1):
                        check(f"{rel}:{n} ARG {m.group(1)}", m.group(2))
                m = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
                if m:
                    ref = re.sub(r"\$\{?([A-Za-z_]+)\}?", lambda a: args.get(a.group(1), ""),
                                 m.group(1))
                    if ref not in stages:
                        check(f"{rel}:{n} FROM", ref)
                    if m.group(2):
                        stages.add(m.group(2))
        else:
            for n, line in enumerate(text.splitlines(), 1):
                m = re.search(r"\b([A-Z_]*IMAGE[A-Z_]*)=(\$\{[A-Z_]+:?-[^}]*\})", line)
                if m:
                    check(f"{rel}:{n} {m.group(1)}", m.group(2))
print(f"{len(seen)} image references under {os.path.basename(root)}/")
if bad:
    print("\n".join(bad))
    sys.exit(1)
EOF
"$PY" "$tmp/images.py" "$SRC/deploy" >"$tmp/images.log" 2>&1 ||
    { cat "$tmp/images.log" >&2; fail "deploy/ names an image that is not ours"; }
grep -q "^[0-9]* image references" "$tmp/images.log" && [ "$(cut -d' ' -f1 "$tmp/images.log")" -ge 9 ] ||
    { cat "$tmp/images.log" >&2; fail "too few image references found under deploy/"; }
# Negative controls: a registry image back in a manifest, a Containerfile base from a registry.
for bad in "k8s/etcd.yaml|localhost/psd-etcd:latest|quay.io/coreos/etcd:v3.4.23" \
    "compose.replicated.yaml|localhost/psd-etcd:latest|etcd:3.4" \
    "Containerfile|BASE_IMAGE=localhost/debian:bookworm|BASE_IMAGE=debian:bookworm" \
    "container.sh|localhost/psd:latest|psd:latest"; do
    IFS='|' read -r f from to <<<"$bad"
    rm -rf "$tmp/deploy" && cp -r "$SRC/deploy" "$tmp/deploy" &&
        sed -i "s#$from#$to#" "$tmp/deploy/$f" && ! cmp -s "$SRC/deploy/$f" "$tmp/deploy/$f" ||
        fail "could not make the negative control for $f"
    "$PY" "$tmp/images.py" "$tmp/deploy" >"$tmp/images-bad.log" 2>&1 &&
        fail "the image check accepted $to in $f"
done
rm -rf "$tmp/deploy"
echo "images: $(head -n 1 "$tmp/images.log"), all localhost/; registry images put back are refused"
# The etcd service: our image, built from the Containerfile's target etcd; etcd 3.4's flags.
"$PY" - "$SRC" "$tmp/etcd-flags.txt" <<'EOF' || fail "the etcd service"
import os, re, sys, yaml
src, out = sys.argv[1], sys.argv[2]
load = lambda p: [d for d in yaml.safe_load_all(open(os.path.join(src, p))) if d]
cf = open(os.path.join(src, "deploy/Containerfile")).read()
assert re.search(r"^FROM\s+\S+\s+AS\s+etcd\s*$", cf, re.M), "Containerfile: no target etcd"
assert re.search(r"apt-get install[^\n]*etcd-server", cf), "Containerfile: etcd is not Debian's etcd-server"
svc = load("deploy/compose.replicated.yaml")[0]["services"]["etcd"]
assert svc["image"].endswith("localhost/psd-etcd:latest}"), f"compose etcd image {svc['image']}"
b = svc["build"]
assert b["dockerfile"] == "deploy/Containerfile" and b["target"] == "etcd" and b["context"] == "..", b
sts = [d for d in load("deploy/k8s/etcd.yaml") if d["kind"] == "StatefulSet"][0]
c = sts["spec"]["template"]["spec"]["containers"][0]
assert c["image"] == "localhost/psd-etcd:latest", f"k8s etcd image {c['image']}"
assert "command" not in c, "k8s etcd: the image's entrypoint (etcd) takes args"
sc = sts["spec"]["template"]["spec"]["securityContext"]
assert sc.get("runAsUser") == 10002 and sc.get("fsGroup") == 10002, "k8s etcd: not the image's user etcd"
assert re.search(r"--uid 10002 .*etcd", cf), "Containerfile: the etcd user is not uid 10002"
flags = set()
for where, args in (("compose", svc["command"]), ("k8s", c["args"])):
    assert all(a.startswith("--") for a in args), f"{where} etcd: not all arguments are flags: {args}"
    got = dict(a[2:].split("=", 1) for a in args)
    assert got.get("data-dir") == "/var/lib/etcd", f"{where} etcd: data-dir {got.get('data-dir')}"
    assert got.get("listen-client-urls") == "http://0.0.0.0:2379", f"{where} etcd: client port"
    flags |= set(got)
vol = [m["mountPath"] for m in c["volumeMounts"]]
assert "/var/lib/etcd" in vol, "k8s etcd: data-dir is not the volume"
assert any(v.endswith(":/var/lib/etcd") for v in svc["volumes"]), "compose etcd: data-dir is not the volume"
open(out, "w").write("\n".join(sorted(flags)) + "\n")
EOF
if [ -x /usr/bin/etcd ]; then
    /usr/bin/etcd --help >"$tmp/etcd-help.txt" 2>&1
    grep -q -- "--listen-client-urls" "$tmp/etcd-help.txt" || fail "etcd --help lists no flags"
    while read -r flag; do
        grep -q -- "^  --$flag\b" "$tmp/etcd-help.txt" ||
            fail "the etcd manifests pass --$flag, which $(/usr/bin/etcd --version | head -n 1) does not know"
    done <"$tmp/etcd-flags.txt"
    grep -q -- "^  --no-such-flag\b" "$tmp/etcd-help.txt" && fail "the etcd flag check cannot fail"
    echo "etcd service: localhost/psd-etcd (target etcd); its $(wc -l <"$tmp/etcd-flags.txt") flags known to $(/usr/bin/etcd --version | head -n 1)"
else
    echo "etcd service: localhost/psd-etcd (target etcd); /usr/bin/etcd not installed: its flags were not checked"
fi
echo "PASS"

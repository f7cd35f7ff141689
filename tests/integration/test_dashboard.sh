#!/usr/bin/env bash
# deploy/grafana/psd-dashboard.json against what the programs expose: a ps-server and a short
# ps-worker run, both with http-listen, are scraped; every metric name the dashboard's
# expressions reference must be exposed (NAME_bucket/_sum/_count: NAME a histogram exposing
# that series). Fails listing the missing ones.
# Arguments: dashboard.json ps-server ps-worker psctl
set -u
dash=$1 server=$2 worker=$3 psctl=$4
dir=$(mktemp -d /tmp/psd-dash-XXXXXX)
spid= wpid=
cleanup() {
  [ -n "$wpid" ] && kill -9 "$wpid" 2>/dev/null
  [ -n "$spid" ] && kill -9 "$spid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# N distinct free ports: every socket stays bound until all are picked (a port just closed can be
# handed out again at once).
free_ports() { python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"; }
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=5).read().decode())' "$1"; }

read -r ps_port w_port sh_port wh_port < <(free_ports 4)
spec="{\"ps\":[\"127.0.0.1:$ps_port\"],\"worker\":[\"127.0.0.1:$w_port\"]}"
python3 -c '
import sys
with open(sys.argv[1], "w") as f:
    for i in range(256):
        y = i % 2
        f.write("%d,%d,%g,%g,%g\n" % (y, 1 if y else -1, (i % 7) / 7.0, (i % 5) / 5.0, y * 0.5))
' "$dir/data.csv"
"$server" --cluster "$spec" --task ps:0 --http-listen "127.0.0.1:$sh_port" \
  --checkpoint-dir "$dir/ckpt" 2>"$dir/server.log" &
spid=$!
"$worker" --cluster "$spec" --task worker:0 --train-csv "$dir/data.csv" --test-csv "$dir/data.csv" \
  --layers 4,8,2 --batch-size 16 --steps 2000 --slow-worker 0 --slow-delay-ms 20 --log-every 5 \
  --progress off --http-listen "127.0.0.1:$wh_port" --deadline-ms 30000 >"$dir/worker.log" 2>&1 &
wpid=$!

# Scrape the worker while it trains, once it has logged a loss (log-every) and timed steps.
ok=0
for _ in $(seq 300); do
  if scrape "127.0.0.1:$wh_port" >"$dir/worker.prom" 2>/dev/null &&
     grep -q '^psd_worker_loss' "$dir/worker.prom" &&
     grep -q '^psd_worker_test_accuracy' "$dir/worker.prom" &&
     grep -q '^psd_worker_step_phase_seconds_count' "$dir/worker.prom"; then ok=1; break; fi
  sleep 0.1
done
[ $ok -eq 1 ] || { echo "FAIL: no worker metrics"; cat "$dir/worker.log"; exit 1; }
# A checkpoint, so that the server reports its age.
TF_CONFIG="{\"cluster\":$spec}" "$psctl" checkpoint >/dev/null || { echo "FAIL: psctl checkpoint"; cat "$dir/server.log"; exit 1; }
scrape "127.0.0.1:$sh_port" >"$dir/server.prom" || { echo "FAIL: server scrape"; exit 1; }
kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null; wpid=
kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; spid=

python3 - "$dash" "$dir/server.prom" "$dir/worker.prom" <<'PY'
import json, re, sys

dash = json.load(open(sys.argv[1]))
exprs = []
def walk(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                exprs.append(v)
            else:
                walk(v)
    elif isinstance(o, list):
        for v in o:
            walk(v)
walk(dash)
assert exprs, "no expressions in the dashboard"
# Metric names: identifiers outside label matchers ({...}) and quoted strings, that are not
# PromQL functions, keywords or label names in by/without.
refs = set()
for e in exprs:
    e2 = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)
    e2 = re.sub(r'\{[^}]*\}', '{}', e2)
    e2 = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', '', e2)
    e2 = re.sub(r'\[[^\]]*\]', '', e2)
    for m in re.finditer(r'[a-zA-Z_:][a-zA-Z0-9_:]*', e2):
        name, end = m.group(0), m.end()
        if e2[end:end + 1] == '(':  # a function call
            continue
        if name.startswith("psd_"):
            refs.add(name)
series, types = set(), {}
for path in sys.argv[2:]:
    for line in open(path):
        line = line.strip()
        if line.startswith("# TYPE "):
            _, _, n, t = line.split()[:4]
            types[n] = t
        elif line and not line.startswith("#"):
            series.add(re.match(r'[a-zA-Z_:][a-zA-Z0-9_:]*', line).group(0))
missing = []
for r in sorted(refs):
    if r not in series:
        missing.append(r)
        continue
    for suf in ("_bucket", "_sum", "_count"):
        base = r[:-len(suf)]
        if r.endswith(suf) and types.get(r) is None:
            want = ("histogram",) if suf == "_bucket" else ("histogram", "summary")
            if types.get(base) not in want:
                missing.append(r + " (%s is %s, not a histogram)" % (base, types.get(base)))
if not refs:
    print("FAIL: no psd_ metric referenced"); sys.exit(1)
if missing:
    print("FAIL: the dashboard references metrics nobody exposes:")
    for m in missing:
        print("  " + m)
    sys.exit(1)
print("ok   all %d metrics of the dashboard are exposed: %s" % (len(refs), " ".join(sorted(refs))))
PY

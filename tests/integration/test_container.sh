#!/usr/bin/env bash
# The container image end to end (meson test container, suite container):
#
#   test_container.sh SRC_DIR
#
# deploy/container.sh base (offline Debian base image, kept, its debootstrap tarball cached)
# and build (the image, kept as a cache for reruns), then checks the image: it runs as a
# non-root user; what it holds under /usr/local is exactly what `meson install` installs with
# the Containerfile's MESON_OPTIONS (meson introspect --installed of a fresh configuration of
# SRC_DIR: every program, psctl included, libpsclient with psclient.h and psclient.pc), plus
# the entrypoint; every program finds its shared libraries and answers --help; the
# Fashion-MNIST data is there and compilers are not; the entrypoint refuses to start without a task (exit 2) and ps-server reports a bad
# TF_CONFIG with exit 2. Then deploy/container.sh run-example: 1 ps and 2 workers as
# containers (host network, one TF_CONFIG each) train a small MLP for one epoch (the
# configuration of test_train.sh's "train" mode); worker 0's test accuracy must be >= 0.75,
# both workers exit 0 and the ps exits 0 on SIGTERM (the signal reaches the exec'd server).
# The etcd image (deploy/container.sh build --etcd: the Containerfile's target etcd, Debian's
# etcd-server) runs as etcd (uid 10002), not as root, and the psd image holds no etcd; it is
# started with its default arguments and with the etcd flags of deploy/compose.replicated.yaml
# and deploy/k8s/etcd.yaml (a fresh volume at /var/lib/etcd, its client port published on
# loopback): a key written through the v3 HTTP/JSON gateway the servers use (/v3/kv/put) reads
# back from /v3/kv/range, and /health (the Kubernetes readiness probe) answers true.
# No container or volume is left behind.
#
# Exit 77 (skipped), saying why, unless run as root with podman, runc, debootstrap and curl
# installed (deploy/setup.sh --test installs them).
set -u
SRC=${1:?source dir}
IMAGE=${PSD_IMAGE:-localhost/psd:latest}
export PSD_IMAGE=$IMAGE

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (debootstrap, rootful podman with host networking)"; exit 77; }
for t in podman runc debootstrap curl; do
    command -v "$t" >/dev/null 2>&1 ||
        { echo "SKIP: $t not installed (deploy/setup.sh --test installs podman, runc, debootstrap and curl)"; exit 77; }
done

tmp=$(mktemp -d /tmp/ps-test-container-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
CS="$SRC/deploy/container.sh"
pm() { "$CS" podman "$@"; } # podman with the runtime container.sh uses
# podman's default rlimits (taken from its own process) may exceed what this host lets a
# container set: give them explicitly, as deploy/container.sh does.
prun() { pm run --rm --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 "$@"; }

"$CS" base || fail "container.sh base"
start=$SECONDS
"$CS" build --etcd >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log" >&2; fail "container.sh build --etcd"; }
echo "images built in $((SECONDS - start)) s (cached layers are reused on reruns)"
size=$(pm image inspect --format '{{.Size}}' "$IMAGE") || fail "no image $IMAGE"
echo "image $IMAGE: $size bytes ($((size / 1048576)) MiB)"

# What is in the image, and as whom it runs.
uid=$(prun --entrypoint id "$IMAGE" -u) || fail "cannot run the image"
[ "$uid" = 10001 ] || fail "the image runs as uid $uid, not psd (10001, the uid of the Kubernetes manifests)"
# What `meson install` installs with the image's build options (a configuration of the same
# sources, nothing compiled): the image must hold exactly these under /usr/local, plus the
# entrypoint, so a new installed program cannot be left out of the image.
opts=$(sed -n 's/^ARG MESON_OPTIONS="\(.*\)"$/\1/p' "$SRC/deploy/Containerfile")
[ -n "$opts" ] || fail "no ARG MESON_OPTIONS=\"...\" line in deploy/Containerfile"
# shellcheck disable=SC2086 # the options are words
meson setup "$tmp/conf" "$SRC" $opts >"$tmp/conf.log" 2>&1 ||
    { tail -n 20 "$tmp/conf.log" >&2; fail "meson setup $opts failed"; }
meson introspect --installed "$tmp/conf" | python3 -c '
import json, sys
for path in sorted(json.load(sys.stdin).values()):
    print(path)
print("/usr/local/bin/container-entrypoint.sh")' | sort >"$tmp/expected.txt"
grep -q '^/usr/local/bin/psctl$' "$tmp/expected.txt" || fail "meson installs no psctl?"
# The image's files under /usr/local, less those of the Debian base (/usr/local/man...).
list_local='find /usr/local \( -type f -o -type l \) | sort'
prun --entrypoint sh "${PSD_BASE_IMAGE:-localhost/debian:bookworm}" -c "$list_local" \
    >"$tmp/base.txt" 2>&1 || { cat "$tmp/base.txt" >&2; fail "cannot list /usr/local in the base image"; }
prun --entrypoint sh "$IMAGE" -c "$list_local" >"$tmp/all.txt" 2>&1 ||
    { cat "$tmp/all.txt" >&2; fail "cannot list /usr/local in the image"; }
comm -13 "$tmp/base.txt" "$tmp/all.txt" >"$tmp/image.txt"
if ! diff -u "$tmp/expected.txt" "$tmp/image.txt" >"$tmp/installed.diff"; then
    cat "$tmp/installed.diff" >&2
    fail "the image's /usr/local differs from what meson install installs (- missing, + extra)"
fi
echo "the image holds the $(wc -l <"$tmp/expected.txt") files meson install installs (and the entrypoint):"
sed -n 's|^/usr/local/bin/|  |p' "$tmp/expected.txt"
mapfile -t programs < <(sed -n 's|^/usr/local/bin/||p' "$tmp/expected.txt" | grep -v '^container-entrypoint.sh$')
prun --entrypoint sh "$IMAGE" -c '
    set -e
    for p in "$@"; do
        command -v "$p"
        if ldd "$(command -v "$p")" | grep "not found"; then echo "$p: a library is missing"; exit 1; fi
        "$p" --help >/dev/null || { echo "$p --help failed"; exit 1; }
    done
    ldd /usr/local/lib/*/libpsclient.so.0 | grep "not found" && exit 1
    ls /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte*
    ! ls /usr/bin/cc /usr/bin/gcc /usr/bin/meson 2>/dev/null
    ! ls /usr/bin/etcd 2>/dev/null' sh "${programs[@]}" \
    >"$tmp/contents.log" 2>&1 ||
    { cat "$tmp/contents.log" >&2; fail "a program of the image does not run, or the data is missing, or compilers or etcd are there"; }
# Without a task the entrypoint starts nothing (exit 2); a bad spec is the server's exit 2.
prun "$IMAGE" >"$tmp/notask.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "no task" "$tmp/notask.log" || { cat "$tmp/notask.log" >&2; fail "no TF_CONFIG: exit $rc, expected 2"; }
prun -e 'TF_CONFIG={"cluster":{"ps":["nohostport"]},"task":{"type":"ps","index":0}}' \
    "$IMAGE" >"$tmp/badspec.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q 'cluster.ps\[0\]' "$tmp/badspec.log" ||
    { cat "$tmp/badspec.log" >&2; fail "bad TF_CONFIG: exit $rc, expected 2 naming cluster.ps[0]"; }

# The etcd image: Debian's etcd 3.4 as user etcd, with the manifests' flags, the v3 gateway.
ETCD_IMAGE=${PSD_ETCD_IMAGE:-localhost/psd-etcd:latest}
size=$(pm image inspect --format '{{.Size}}' "$ETCD_IMAGE") || fail "no image $ETCD_IMAGE"
echo "image $ETCD_IMAGE: $size bytes ($((size / 1048576)) MiB)"
uid=$(prun --entrypoint id "$ETCD_IMAGE" -u) || fail "cannot run $ETCD_IMAGE"
[ "$uid" = 10002 ] || fail "$ETCD_IMAGE runs as uid $uid, not etcd (10002, the uid of deploy/k8s/etcd.yaml)"
version=$(prun "$ETCD_IMAGE" --version | head -n 1)
[[ "$version" == "etcd Version: 3.4."* ]] || fail "$ETCD_IMAGE: $version, expected Debian's etcd 3.4"
# The flags of the two manifests, one line each ("" for the image's default arguments).
printf '\n' >"$tmp/etcd-args.txt"
ypy=
for p in /usr/bin/python3 python3; do
    "$p" -c 'import yaml' 2>/dev/null && { ypy=$p; break; }
done
if [ -n "$ypy" ]; then
    "$ypy" - "$SRC" >>"$tmp/etcd-args.txt" <<'EOF' || fail "cannot read the etcd flags of the manifests"
import os, sys, yaml
src = sys.argv[1]
comp = yaml.safe_load(open(os.path.join(src, "deploy/compose.replicated.yaml")))
print(" ".join(comp["services"]["etcd"]["command"]))
for d in yaml.safe_load_all(open(os.path.join(src, "deploy/k8s/etcd.yaml"))):
    if d and d["kind"] == "StatefulSet":
        print(" ".join(d["spec"]["template"]["spec"]["containers"][0]["args"]))
EOF
    [ "$(wc -l <"$tmp/etcd-args.txt")" -eq 3 ] || fail "expected the etcd flags of 2 manifests"
else
    echo "no python3 with yaml: only the etcd image's default arguments are tried"
fi
etcd_c="psd-test-etcd-$$"
etcd_cleanup() {
    pm rm -f -t 2 "$etcd_c" >/dev/null 2>&1
    pm volume rm -f "$etcd_c" >/dev/null 2>&1
}
trap 'etcd_cleanup; rm -rf "$tmp"' EXIT
while read -r -a args; do
    what="${args[*]}"
    [ -n "$what" ] || what="its default arguments"
    start=$SECONDS
    pm run -d --name "$etcd_c" --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
        -p 127.0.0.1::2379 -v "$etcd_c:/var/lib/etcd" "$ETCD_IMAGE" "${args[@]}" >/dev/null ||
        fail "cannot start $ETCD_IMAGE with $what"
    addr=$(pm port "$etcd_c" 2379/tcp | head -n 1)
    [ -n "$addr" ] || fail "etcd's client port was not published"
    value=$(printf 'psd-%s' "$$" | base64)
    ok=
    for _ in $(seq 1 60); do
        curl -s -m 2 -X POST "http://$addr/v3/kv/put" -d "{\"key\":\"Zm9v\",\"value\":\"$value\"}" \
            >"$tmp/put.json" 2>/dev/null && grep -q '"revision"' "$tmp/put.json" && { ok=1; break; }
        [ "$(pm inspect --format '{{.State.Running}}' "$etcd_c")" = true ] || break
        sleep 0.5
    done
    [ -n "$ok" ] || { pm logs "$etcd_c" 2>&1 | tail -n 15 >&2; fail "etcd with $what: no answer to /v3/kv/put"; }
    curl -s -m 5 -X POST "http://$addr/v3/kv/range" -d '{"key":"Zm9v"}' >"$tmp/range.json"
    grep -q "\"value\":\"$value\"" "$tmp/range.json" ||
        { cat "$tmp/range.json" >&2; fail "etcd with $what: /v3/kv/range did not return the value put"; }
    curl -s -m 5 "http://$addr/health" | grep -q '"health":"true"' ||
        fail "etcd with $what: /health is not true"
    echo "etcd image with $what: put and range through /v3 on $addr, healthy ($((SECONDS - start)) s)"
    etcd_cleanup
done <"$tmp/etcd-args.txt"
pm volume exists "$etcd_c" && fail "volume $etcd_c left behind"

# The example: 1 ps, 2 workers, one epoch of a small MLP.
start=$SECONDS
PSD_EXAMPLE_TIMEOUT=300 "$CS" run-example --layers 784,128,10 --epochs 1 --batch-size 64 \
    --optimizer adam --seed 3 --log-every 100 --model-name ct_mlp >"$tmp/run.out" 2>"$tmp/run.log"
rc=$?
cat "$tmp/run.log" "$tmp/run.out"
[ "$rc" -eq 0 ] || fail "run-example exited $rc"
acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' "$tmp/run.out" | tail -n 1)
[ -n "$acc" ] || fail "no test_accuracy= line from worker 0"
echo "test accuracy $acc after 1 epoch, 1 ps and 2 workers in containers ($((SECONDS - start)) s)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || fail "test accuracy $acc < 0.75"
grep -q "ps 0 exited 0 after SIGTERM" "$tmp/run.log" || fail "ps-server did not exit 0 on SIGTERM"
left=$(pm ps -a --format '{{.Names}}' | grep -c '^psd-example-' || true)
[ "$left" -eq 0 ] || fail "$left example containers left behind"
echo "PASS"

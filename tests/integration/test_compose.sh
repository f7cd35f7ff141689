#!/usr/bin/env bash
# deploy/compose.yaml run for real with podman-compose (meson test compose, suite container):
#
#   test_compose.sh SRC_DIR
#
# The image comes from deploy/container.sh base and build (cached layers: quick after
# test_container.sh). Then `podman-compose up -d` of deploy/compose.yaml as it is, under a
# project name of its own, with an override file that only adds environment settings to the
# workers (a small MLP, a bound of PSD_COMPOSE_STEPS steps per worker: PS_STEPS wins over the
# file's --epochs): the 2 ps and 2 workers find each other by service name on the compose
# network; both workers train to their step bound and exit 0 (no restart), worker 0 reports a
# test accuracy >= 0.7; `podman-compose stop` stops both servers with SIGTERM, they exit 0 and
# log their last checkpoint. `podman-compose down -v` and the exit trap remove the project's
# containers, its volume and its network; the test checks that none is left.
# Then the same with deploy/compose.replicated.yaml added (another project): replicas 2 with
# the etcd service of our own etcd image (deploy/container.sh build --etcd): both servers
# register in etcd and install a view with both live, both workers train to their bound and
# exit 0; down -v leaves nothing.
#
# Exit 77 (skipped), saying why, unless run as root with podman, runc, debootstrap and
# podman-compose installed (deploy/setup.sh --test installs them).
set -u
SRC=${1:?source dir}
IMAGE=${PSD_IMAGE:-localhost/psd:latest}
export PSD_IMAGE=$IMAGE
STEPS=${PSD_COMPOSE_STEPS:-300}

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (rootful podman, debootstrap)"; exit 77; }
for t in podman runc debootstrap podman-compose; do
    command -v "$t" >/dev/null 2>&1 ||
        { echo "SKIP: $t not installed (deploy/setup.sh --test installs it)"; exit 77; }
done

tmp=$(mktemp -d /tmp/ps-test-compose-XXXXXX)
project="psdtest$$"
CS="$SRC/deploy/container.sh"
pm() { "$CS" podman "$@"; }
# podman-compose runs podman through this, with the OCI runtime deploy/container.sh uses.
printf '#!/bin/sh\nexec "%s" podman "$@"\n' "$CS" >"$tmp/podman"
chmod +x "$tmp/podman"
files=(-f "$SRC/deploy/compose.yaml")
compose() {
    podman-compose --podman-path "$tmp/podman" -p "$project" "${files[@]}" \
        -f "$tmp/override.yaml" "$@"
}
remove_project() {
    compose down -v -t 5 >>"$tmp/down.log" 2>&1
    local c v
    for c in $(pm ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}' 2>/dev/null); do
        pm rm -f -t 2 "$c" >/dev/null 2>&1
    done
    for v in psd-checkpoints psd-etcd; do
        pm volume rm -f "${project}_$v" >/dev/null 2>&1
    done
    pm network rm -f "${project}_default" >/dev/null 2>&1
    pm pod rm -f "pod_$project" >/dev/null 2>&1
}
cleanup() {
    remove_project
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

"$CS" base || fail "container.sh base"
start=$SECONDS
"$CS" build --etcd >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log" >&2; fail "container.sh build --etcd"; }
echo "images ready in $((SECONDS - start)) s"

cat >"$tmp/override.yaml" <<EOF
services:
  worker0:
    environment:
      PS_STEPS: "$STEPS"
      PS_LAYERS: "784,128,10"
      PS_BATCH_SIZE: "64"
      PS_OPTIMIZER: adam
      PS_LOG_EVERY: "100"
  worker1:
    environment:
      PS_STEPS: "$STEPS"
      PS_LAYERS: "784,128,10"
      PS_BATCH_SIZE: "64"
      PS_OPTIMIZER: adam
      PS_LOG_EVERY: "100"
EOF

start=$SECONDS
compose up -d >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; fail "podman-compose up failed"; }
name() { pm ps -a --filter "label=io.podman.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1; }
w0=$(name worker0)
w1=$(name worker1)
ps0=$(name ps0)
ps1=$(name ps1)
[ -n "$w0" ] && [ -n "$w1" ] && [ -n "$ps0" ] && [ -n "$ps1" ] ||
    { cat "$tmp/up.log" >&2; pm ps -a >&2; fail "podman-compose up made no containers for the 4 services"; }
echo "containers: $ps0 $ps1 $w0 $w1"
# podman-compose exits 0 even when podman could not start a container: look at each one.
for c in "$ps0" "$ps1" "$w0" "$w1"; do
    started=$(pm inspect --format '{{.State.StartedAt.IsZero}}' "$c")
    [ "$started" = false ] || { tail -n 20 "$tmp/up.log" >&2; fail "$c was never started"; }
done

show_logs() {
    local c
    for c in "$ps0" "$ps1" "$w0" "$w1"; do
        echo "---- $c (last 15 lines)" >&2
        pm logs "$c" 2>&1 | tail -n 15 >&2
    done
}
rc0=$(timeout 600 "$CS" podman wait "$w0" 2>/dev/null) || rc0=timeout
rc1=$(timeout 120 "$CS" podman wait "$w1" 2>/dev/null) || rc1=timeout
train_s=$((SECONDS - start))
restarts=$(pm inspect --format '{{.RestartCount}}' "$w0" "$w1" | awk '{ s += $1 } END { print s + 0 }')
if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
    show_logs
    fail "workers exited $rc0 and $rc1, expected 0"
fi
[ "$restarts" = 0 ] || { show_logs; fail "workers were restarted $restarts time(s)"; }
pm logs "$w0" >"$tmp/w0.log" 2>&1
pm logs "$w1" >"$tmp/w1.log" 2>&1
line=$(grep 'test_accuracy=' "$tmp/w0.log" | tail -n 1)
acc=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' <<<"$line")
[ -n "$acc" ] || { show_logs; fail "no test_accuracy= line from worker 0"; }
echo "$line"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.7) }' || fail "test accuracy $acc < 0.7"
# Each worker ran its step bound: its last step log line is the bound.
for w in w0 w1; do
    last=$(grep -o '"step":[0-9]*' "$tmp/$w.log" | tail -n 1 | cut -d: -f2)
    [ "${last:-0}" -le "$STEPS" ] && [ "${last:-0}" -ge $((STEPS - 100)) ] ||
        { tail -n 5 "$tmp/$w.log" >&2; fail "$w: last logged step ${last:-none}, expected near the bound $STEPS"; }
done
echo "2 ps, 2 workers: $STEPS steps each, test accuracy $acc, trained in $train_s s"

# The servers stop cleanly on SIGTERM (the exec'd ps-server gets podman stop's signal).
compose stop -t 30 >"$tmp/stop.log" 2>&1 || { cat "$tmp/stop.log" >&2; fail "podman-compose stop failed"; }
for c in "$ps0" "$ps1"; do
    rc=$(pm inspect --format '{{.State.ExitCode}}' "$c")
    [ "$rc" = 0 ] || { show_logs; fail "$c exited $rc after SIGTERM, expected 0"; }
    pm logs "$c" 2>&1 | grep -qi checkpoint || { show_logs; fail "$c logged no checkpoint"; }
done
echo "both servers exited 0 on SIGTERM"

compose down -v -t 5 >"$tmp/down.log" 2>&1 || { cat "$tmp/down.log" >&2; fail "podman-compose down failed"; }
left=$(pm ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}')
[ -z "$left" ] || fail "containers left after down: $left"
pm volume exists "${project}_psd-checkpoints" && fail "volume ${project}_psd-checkpoints left after down -v"
# podman-compose 1.0.3's down leaves the project's network.
if pm network exists "${project}_default"; then
    pm network rm "${project}_default" >/dev/null || fail "cannot remove the network ${project}_default"
fi
echo "plain: $((SECONDS - start)) s from up to down"

# ---- replicated: compose.replicated.yaml added, the etcd service from our etcd image -------
project="psdtestr$$"
files+=(-f "$SRC/deploy/compose.replicated.yaml")
# The servers' shared admin token (they replicate with admin calls), readable by the image's user.
head -c 24 /dev/urandom | base64 >"$tmp/admin-token"
chmod 644 "$tmp/admin-token"
export PSD_ADMIN_TOKEN_FILE="$tmp/admin-token"
start=$SECONDS
compose up -d >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; fail "replicated: podman-compose up failed"; }
etcd=$(name etcd)
w0=$(name worker0)
w1=$(name worker1)
ps0=$(name ps0)
ps1=$(name ps1)
[ -n "$etcd" ] && [ -n "$w0" ] && [ -n "$w1" ] && [ -n "$ps0" ] && [ -n "$ps1" ] ||
    { cat "$tmp/up.log" >&2; pm ps -a >&2; fail "replicated: no containers for the 5 services"; }
for c in "$etcd" "$ps0" "$ps1" "$w0" "$w1"; do
    started=$(pm inspect --format '{{.State.StartedAt.IsZero}}' "$c")
    [ "$started" = false ] || { grep -B2 -A3 "Error" "$tmp/up.log" | tail -n 20 >&2; fail "replicated: $c was never started"; }
done
image=$(pm inspect --format '{{.ImageName}}' "$etcd")
[ "$image" = localhost/psd-etcd:latest ] || fail "replicated: the etcd service runs $image"
rc0=$(timeout 300 "$CS" podman wait "$w0" 2>/dev/null) || rc0=timeout
rc1=$(timeout 120 "$CS" podman wait "$w1" 2>/dev/null) || rc1=timeout
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] ||
    { show_logs; pm logs "$etcd" 2>&1 | tail -n 10 >&2; fail "replicated: workers exited $rc0 and $rc1, expected 0"; }
grep_log() { pm logs "$1" 2>&1 | grep -q "$2"; }
for c in "$ps0" "$ps1"; do
    grep_log "$c" "registered in etcd http://etcd:2379" &&
        grep_log "$c" "view epoch [0-9]*, primaries \[0 1\], live \[0 1\]" ||
        { show_logs; fail "replicated: $c did not register in etcd and see both servers live"; }
    grep_log "$c" "refused Replicate" && { show_logs; fail "replicated: $c refused replication"; }
done
acc=$(pm logs "$w0" 2>&1 | sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' | tail -n 1)
[ -n "$acc" ] || { show_logs; fail "replicated: no test_accuracy= line from worker 0"; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.7) }' || fail "replicated: test accuracy $acc < 0.7"
compose down -v -t 5 >"$tmp/down.log" 2>&1 || { cat "$tmp/down.log" >&2; fail "replicated: podman-compose down failed"; }
left=$(pm ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}')
[ -z "$left" ] || fail "replicated: containers left after down: $left"
pm volume exists "${project}_psd-etcd" && fail "volume ${project}_psd-etcd left after down -v"
if pm network exists "${project}_default"; then
    pm network rm "${project}_default" >/dev/null || fail "cannot remove the network ${project}_default"
fi
echo "replicated (replicas 2, etcd from $image): both servers registered and saw both live, test accuracy $acc; $((SECONDS - start)) s from up to down"
echo "PASS"

#!/usr/bin/env bash
# Builds and runs the psd container image with podman (deploy/Containerfile).
#
#   deploy/container.sh base          make the base image localhost/debian:bookworm offline
#                                     (debootstrap --variant=minbase + podman import); skipped
#                                     when it exists; the debootstrapped tree is kept as a
#                                     tarball in PSD_CACHE_DIR and imported from there next
#                                     time (up to 30 days old)
#   deploy/container.sh build [--etcd]
#                                     build the image (default localhost/psd:latest); --etcd
#                                     also the etcd image (default localhost/psd-etcd:latest,
#                                     the Containerfile's target etcd: Debian's etcd-server,
#                                     the coordinator of replicated servers)
#   deploy/container.sh run-example [ps-worker flags]
#                                     1 ps and 2 workers as containers (--network host), each
#                                     with its own TF_CONFIG and distinct ports; waits for them
#                                     and prints worker 0's final line (test_accuracy=...)
#   deploy/container.sh all [flags]   base, build, run-example
#   deploy/container.sh podman ARGS   podman ARGS with the OCI runtime chosen as below, and
#                                     podman's exit code (tests/integration/test_container.sh)
#
# Environment: PSD_IMAGE (image name), PSD_ETCD_IMAGE (etcd image name), PSD_BASE_IMAGE (base
# image name), PODMAN_RUNTIME (the
# OCI runtime podman uses; runc when installed, else podman's default), DEBIAN_MIRROR (for
# debootstrap and the image's apt sources, with bookworm-updates and bookworm-security; default
# the first .../debian URI of this machine's apt sources),
# PSD_EXAMPLE_TIMEOUT (seconds run-example waits, 600), PSD_EXAMPLE_HOST (127.0.0.1),
# PSD_CACHE_DIR (the base tarballs, named by suite, variant and mirrors; /var/cache/psd).
# Needs root (debootstrap; rootful podman with host networking). Exit code: 0 success, 1 a
# failure, 2 bad usage; run-example passes on worker 0's exit code when it is not 0.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${PSD_IMAGE:-localhost/psd:latest}
ETCD_IMAGE=${PSD_ETCD_IMAGE:-localhost/psd-etcd:latest}
BASE_IMAGE=${PSD_BASE_IMAGE:-localhost/debian:bookworm}

podman_cmd=(podman)
if [ -n "${PODMAN_RUNTIME:-}" ]; then
    podman_cmd+=(--runtime "$PODMAN_RUNTIME")
elif command -v runc >/dev/null 2>&1; then
    podman_cmd+=(--runtime runc)
fi
pm() { "${podman_cmd[@]}" "$@"; }

say() { echo "container: $*" >&2; }
die() {
    say "$*"
    exit 1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "$1 not found (apt-get install $2)"
}

# The lines of this machine's apt sources that are not comments.
apt_uris() {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -v '^[[:space:]]*#' || true
}

cmd_base() {
    need podman podman
    if pm image exists "$BASE_IMAGE"; then
        say "base image $BASE_IMAGE exists; not rebuilding it (podman rmi $BASE_IMAGE to redo)"
        return 0
    fi
    need debootstrap debootstrap
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
    local mirror=${DEBIAN_MIRROR:-}
    if [ -z "$mirror" ]; then
        mirror=$(apt_uris | grep -oE '(https?://[^ ]*/debian)/?( |$)' | head -n 1 | tr -d ' ' || true)
        mirror=${mirror%/}
        [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    fi
    # Point releases and security updates too (debootstrap writes bookworm main only), from
    # the same hosts as this machine's apt sources.
    local security
    security=$(apt_uris | grep -oE 'https?://[^ ]*/debian-security' | head -n 1 || true)
    [ -n "$security" ] || security=http://deb.debian.org/debian-security
    # The tarball of an earlier debootstrap with the same inputs, when not too old: an import
    # takes seconds where debootstrap takes a minute or more.
    local cache=${PSD_CACHE_DIR:-/var/cache/psd} key tarball
    key=$(printf '%s\n' bookworm minbase "$mirror" "$security" | sha256sum | cut -c1-12)
    tarball="$cache/debian-bookworm-minbase-$key.tar"
    if [ -s "$tarball" ] && [ -z "$(find "$tarball" -mtime +30)" ]; then
        pm import - "$BASE_IMAGE" <"$tarball" >/dev/null || die "podman import of $tarball failed"
        say "imported $BASE_IMAGE from $tarball"
        return 0
    fi
    local dir
    dir=$(mktemp -d /var/tmp/psd-rootfs-XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$dir' '$dir.log' '$tarball.tmp'" EXIT
    say "debootstrap --variant=minbase bookworm from $mirror"
    local t0=$SECONDS
    if ! debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1; then
        tail -n 30 "$dir.log" >&2
        die "debootstrap failed"
    fi
    rm -f "$dir.log"
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
        "$mirror" "$mirror" "$security" >"$dir/etc/apt/sources.list"
    # Leave apt lists out of the image; the build stage runs apt-get update itself.
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/archives/*.deb
    mkdir -p "$cache"
    tar -C "$dir" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball" ||
        die "cannot write $tarball"
    rm -f "$cache"/debian-bookworm-minbase-*.tar.tmp
    pm import - "$BASE_IMAGE" <"$tarball" >/dev/null || die "podman import failed"
    rm -rf "$dir"
    trap - EXIT
    say "imported $BASE_IMAGE in $((SECONDS - t0)) s (tarball kept in $tarball)"
}

cmd_build() {
    local etcd=no arg
    for arg in "$@"; do
        case "$arg" in
        --etcd) etcd=yes ;;
        *)
            say "build: unknown argument '$arg' (usage: $0 build [--etcd])"
            exit 2
            ;;
        esac
    done
    need podman podman
    pm image exists "$BASE_IMAGE" || die "no base image $BASE_IMAGE: run '$0 base' first"
    local t0=$SECONDS old
    old=$(pm image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    pm build --pull=never --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -f "$root/deploy/Containerfile" -t "$IMAGE" "$root"
    # The image this one replaces (untagged now) goes, unless a container still uses it; so do
    # the build stages of earlier builds. The newest build stage stays: the cache of the next
    # build of the same sources.
    if [ -n "$old" ] && [ "$old" != "$(pm image inspect --format '{{.Id}}' "$IMAGE")" ]; then
        pm rmi "$old" >/dev/null 2>&1 || true
    fi
    local stale
    stale=$(pm images --filter dangling=true --filter label=io.psd.stage=build \
        --format '{{.CreatedAt}} {{.ID}}' | sort -r | tail -n +2 | awk '{ print $NF }')
    [ -z "$stale" ] || pm rmi $stale >/dev/null 2>&1 || true
    local size
    size=$(pm image inspect --format '{{.Size}}' "$IMAGE")
    say "built $IMAGE in $((SECONDS - t0)) s; size $size bytes ($((size / 1048576)) MiB)"
    [ "$etcd" = yes ] || return 0
    t0=$SECONDS
    old=$(pm image inspect --format '{{.Id}}' "$ETCD_IMAGE" 2>/dev/null || true)
    pm build --pull=never --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" --target etcd \
        -f "$root/deploy/Containerfile" -t "$ETCD_IMAGE" "$root"
    if [ -n "$old" ] && [ "$old" != "$(pm image inspect --format '{{.Id}}' "$ETCD_IMAGE")" ]; then
        pm rmi "$old" >/dev/null 2>&1 || true
    fi
    size=$(pm image inspect --format '{{.Size}}' "$ETCD_IMAGE")
    say "built $ETCD_IMAGE in $((SECONDS - t0)) s; size $size bytes ($((size / 1048576)) MiB)"
}

# Free TCP ports of the host (the containers share its network).
free_ports() {
    python3 - "$1" <<'EOF' 2>/dev/null && return 0
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
for s in socks:
    print(s.getsockname()[1])
EOF
    # No python3: pick ports at random above 20000 that nothing listens on.
    local n=0 p
    while [ "$n" -lt "$1" ]; do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            n=$((n + 1))
        fi
    done
}

example_containers=()
cleanup_example() {
    local c
    for c in "${example_containers[@]}"; do
        pm rm -f -t 2 "$c" >/dev/null 2>&1 || true
    done
    example_containers=()
}

cmd_run_example() {
    need podman podman
    pm image exists "$IMAGE" || die "no image $IMAGE: run '$0 build' first"
    local host=${PSD_EXAMPLE_HOST:-127.0.0.1} limit=${PSD_EXAMPLE_TIMEOUT:-600}
    local ports
    mapfile -t ports < <(free_ports 3)
    [ "${#ports[@]}" -eq 3 ] || die "no free ports"
    local cluster="{\"ps\":[\"$host:${ports[0]}\"],\"worker\":[\"$host:${ports[1]}\",\"$host:${ports[2]}\"]}"
    tf() { echo "{\"cluster\":$cluster,\"task\":{\"type\":\"$1\",\"index\":$2}}"; }
    local tag="psd-example-$$"
    trap cleanup_example EXIT
    trap 'exit 130' INT TERM
    local run=(run -d --network host --ulimit nofile=20000:20000 --ulimit nproc=32768:32768
        -e PS_LOG_FORMAT=json)
    say "cluster $cluster"
    pm "${run[@]}" --name "$tag-ps0" -e "TF_CONFIG=$(tf ps 0)" "$IMAGE" >/dev/null
    example_containers+=("$tag-ps0")
    local i
    for i in 0 1; do
        pm "${run[@]}" --name "$tag-w$i" -e "TF_CONFIG=$(tf worker $i)" "$IMAGE" "$@" >/dev/null
        example_containers+=("$tag-w$i")
    done
    # Wait for both workers (podman wait prints the exit code), up to the limit.
    local rc0 rc1
    rc0=$(timeout "$limit" "${podman_cmd[@]}" wait "$tag-w0" 2>/dev/null) || rc0=124
    rc1=$(timeout 60 "${podman_cmd[@]}" wait "$tag-w1" 2>/dev/null) || rc1=124
    # The ps stops cleanly on SIGTERM (exit 0).
    pm stop -t 10 "$tag-ps0" >/dev/null 2>&1 || true
    local rcps
    rcps=$(pm inspect --format '{{.State.ExitCode}}' "$tag-ps0" 2>/dev/null || echo '?')
    local line
    line=$(pm logs "$tag-w0" 2>/dev/null | grep 'test_accuracy=' | tail -n 1 || true)
    if [ "$rc0" != 0 ] || [ "$rc1" != 0 ] || [ -z "$line" ]; then
        for i in ps0 w0 w1; do
            say "---- $tag-$i (last 15 lines)"
            pm logs "$tag-$i" 2>&1 | tail -n 15 >&2 || true
        done
        say "worker 0 exited $rc0, worker 1 exited $rc1, ps 0 exited $rcps"
        [ "$rc0" != 0 ] && [ "$rc0" -eq "$rc0" ] 2>/dev/null && exit "$rc0"
        exit 1
    fi
    say "workers exited 0, ps 0 exited $rcps after SIGTERM"
    echo "$line"
}

usage() {
    sed -n '2,/^set /{/^set /d;p}' "$0" | sed 's/^# \{0,1\}//'
}

sub=${1:-}
[ $# -gt 0 ] && shift
case "$sub" in
base) cmd_base ;;
build) cmd_build "$@" ;;
run-example) cmd_run_example "$@" ;;
all)
    cmd_base
    cmd_build
    cmd_run_example "$@"
    ;;
podman) pm "$@" ;;
-h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac

#!/bin/sh
# Entrypoint of the psd image: one image, any task of the cluster.
#
#   container-entrypoint.sh [ARGS...]          run the task TF_CONFIG names: ps-server for
#                                              type ps, ps-worker for worker and chief; ARGS
#                                              go to that program
#   container-entrypoint.sh PROGRAM [ARGS...]  run ps-server, ps-worker or ps-local (or sh,
#                                              bash) explicitly, with the same environment
#   container-entrypoint.sh --print-tf-config  print the TF_CONFIG the task would get; exit
#
# TF_CONFIG comes from the environment (docker/podman -e, compose, Kubeflow's TFJob). When it
# is not set and PSD_CLUSTER_JSON is (a cluster object such as {"ps":[...],"worker":[...]}),
# it is built here as {"cluster":PSD_CLUSTER_JSON,"task":{"type":PSD_TASK_TYPE,"index":I}}
# with I the first of: PSD_TASK_INDEX; JOB_COMPLETION_INDEX (a Kubernetes indexed Job's
# pod); the number ending the host name (a StatefulSet's pod ordinal, e.g. psd-ps-1 -> 1).
#
# A ps task listens on every interface at the port of its own cluster address
# (PS_LISTEN=tcp://0.0.0.0:PORT) unless PS_LISTEN or --listen say otherwise: a container's
# cluster address (a Service or pod DNS name) is often not an address it can bind.
#
# The program is exec'd (it becomes this process), so SIGTERM from `podman stop`, Kubernetes
# or systemd reaches it directly. Exit code 2: no task could be determined (nothing else is
# started); otherwise the program's own code.
set -eu

say() { echo "container-entrypoint: $*" >&2; }

# Generates TF_CONFIG from PSD_CLUSTER_JSON and the pod's index (see above).
if [ -z "${TF_CONFIG:-}" ] && [ -n "${PSD_CLUSTER_JSON:-}" ]; then
    type=${PSD_TASK_TYPE:-worker}
    index=${PSD_TASK_INDEX:-${JOB_COMPLETION_INDEX:-}}
    if [ -z "$index" ]; then
        host=${HOSTNAME:-$(hostname 2>/dev/null || true)}
        case "$host" in
        *-[0-9]*) index=${host##*-} ;;
        esac
    fi
    case "$index" in
    '' | *[!0-9]*)
        say "PSD_CLUSTER_JSON is set but no task index: set PSD_TASK_INDEX, or run as an indexed Job (JOB_COMPLETION_INDEX) or a StatefulSet pod (host name ending in -N); got '${index:-}'"
        exit 2
        ;;
    esac
    case "$type" in
    '' | *[!a-z_]*)
        say "PSD_TASK_TYPE must be ps, worker or chief, not '$type'"
        exit 2
        ;;
    esac
    TF_CONFIG="{\"cluster\":$PSD_CLUSTER_JSON,\"task\":{\"type\":\"$type\",\"index\":$index}}"
    export TF_CONFIG
fi

if [ "${1:-}" = "--print-tf-config" ]; then
    if [ -z "${TF_CONFIG:-}" ]; then
        say "no TF_CONFIG (and no PSD_CLUSTER_JSON to build one from)"
        exit 2
    fi
    printf '%s\n' "$TF_CONFIG"
    exit 0
fi

# The task's type and index: PS_TASK (type:index, as the programs' --task) wins over TF_CONFIG.
# This is a light reading to choose the program; the program itself parses and checks the
# whole spec and reports any error with its JSON path (exit 2).
flat=$(printf '%s' "${TF_CONFIG:-}" | tr '\n\r\t' '   ')
task=$(printf '%s' "$flat" | sed -n 's/.*"task"[[:space:]]*:[[:space:]]*{\([^}]*\)}.*/\1/p')
type=$(printf '%s' "$task" | sed -n 's/.*"type"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
index=$(printf '%s' "$task" | sed -n 's/.*"index"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p')
if [ -n "${PS_TASK:-}" ]; then
    type=${PS_TASK%%:*}
    index=${PS_TASK#*:}
fi

prog=
case "${1:-}" in
ps-server | ps-worker | ps-local | sh | bash)
    prog=$1
    shift
    ;;
esac
if [ -z "$prog" ]; then
    case "$type" in
    ps) prog=ps-server ;;
    worker | chief) prog=ps-worker ;;
    '')
        say "no task: set TF_CONFIG (cluster and task), or PSD_CLUSTER_JSON and PSD_TASK_TYPE, or name the program (ps-server, ps-worker, ps-local)"
        exit 2
        ;;
    *)
        say "task type '$type' has no program in this image (ps runs ps-server; worker and chief run ps-worker)"
        exit 2
        ;;
    esac
fi

if [ "$prog" = ps-server ] && [ "$type" = ps ] && [ -z "${PS_LISTEN:-}" ]; then
    listen_given=no
    for a in "$@"; do
        case "$a" in
        --listen | --listen=*) listen_given=yes ;;
        esac
    done
    ps_list=$(printf '%s' "$flat" | sed -n 's/.*"ps"[[:space:]]*:[[:space:]]*\[\([^]]*\)\].*/\1/p')
    addr=$(printf '%s' "$ps_list" | tr ',' '\n' | sed -n "$((${index:-0} + 1))p" | tr -d ' "')
    port=${addr##*:}
    case "$port" in
    '' | *[!0-9]*) ;; # leave it to ps-server, which reports the bad address
    *)
        if [ "$listen_given" = no ]; then
            PS_LISTEN="tcp://0.0.0.0:$port"
            export PS_LISTEN
        fi
        ;;
    esac
fi

exec "$prog" "$@"

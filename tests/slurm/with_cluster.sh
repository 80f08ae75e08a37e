#!/usr/bin/env bash
# with_cluster.sh [-n NODES] CMD...: run CMD with the test cluster up
# (tests/slurm/cluster.sh), and take it down afterwards if this script started it.
#
# CMD finds the cluster through DISTKERNEL_TEST_SLURM_CONF (the slurm.conf to
# use). Where no cluster can run here (not root, or no network namespaces), CMD
# runs without it and DISTKERNEL_TEST_SLURM_SKIP says why, so its cluster tests
# skip with that reason; on CI (CI set) that is a failure instead, since CI runs
# as root and must run them. The meson test of runtime/slurm/dk_slurm runs through it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=2
if [[ ${1:-} == -n ]]; then NODES=$2; shift 2; fi
(($#)) || { echo "usage: with_cluster.sh [-n NODES] CMD..." >&2; exit 2; }

why=""
if [[ $(id -u) != 0 ]]; then
    why="the Slurm test cluster needs root (network namespaces and a bridge); run as root"
elif ! unshare --net --uts true 2> /dev/null; then
    why="the Slurm test cluster needs network namespaces, and 'unshare --net --uts' fails here"
fi
if [[ -n $why ]]; then
    if [[ -n ${CI:-} ]]; then echo "with_cluster.sh: $why (required on CI)" >&2; exit 1; fi
    echo "with_cluster.sh: $why; running without it" >&2
    DISTKERNEL_TEST_SLURM_SKIP=$why exec "$@"
fi

DIR=${DISTKERNEL_SLURM_SIM_DIR:-/tmp/distkernel-slurm}
# One bring-up at a time per machine: a second caller then finds it up and reuses it.
out=$(flock "$(dirname "$DIR")" "$HERE/cluster.sh" up "$NODES")
conf=$(sed -n 's/^SLURM_CONF=//p' <<< "$out")
if [[ $(tail -n 1 <<< "$out") == started ]]; then
    trap '"$HERE/cluster.sh" down' EXIT
fi
# CMD runs in the background so that a SIGTERM (meson's timeout) or ^C reaches
# this script at once: it is passed on, and the EXIT trap still takes the
# cluster down. Only a SIGKILL leaves it up, for the next bring-up to remove.
DISTKERNEL_TEST_SLURM_CONF=$conf "$@" &
child=$!
trap 'kill -TERM "$child" 2> /dev/null' TERM INT
while :; do
    rc=0
    wait "$child" || rc=$?
    kill -0 "$child" 2> /dev/null || break
done
exit $rc

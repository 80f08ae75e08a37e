#!/usr/bin/env bash
# Run every test of distkernel on this machine: install what is needed, build,
# the C unit tests (criterion, through meson), then the end-to-end suite that
# drives the installed kernel with jupyter_client, jupyter_kernel_test and
# nbconvert; then all of it again against an AddressSanitizer +
# UndefinedBehaviorSanitizer build, which must report nothing.
#
#   scripts/test.sh              everything
#   SANITIZE=0 scripts/test.sh   skip the sanitizer pass
#   FUZZ=0 scripts/test.sh       skip fuzzing (FUZZ_SECONDS per target, default 60)
#   scripts/test.sh -k distributed   (extra arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

units() {        # BUILD
  echo "== C unit tests ($1) =="
  meson test -C "$1" --print-errorlogs
}
end_to_end() {   # BUILD PREFIX [pytest args]
  local build=$1 prefix=$2
  shift 2
  echo "== end-to-end tests ($prefix) =="
  DISTKERNEL_PREFIX=$prefix DISTKERNEL_FAKE_CUDA=$build/tests/unit \
    DISTKERNEL_FIGURES_DIR=$build/figures \
    /usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider "$@"
}
ipykernel_suite() {   # PREFIX: ipykernel's own test modules, pointed at distkernel
  echo "== ipykernel's test_message_spec, test_kernel and test_debugger against distkernel ($1) =="
  PYTHONPATH=tests/ipykernel JUPYTER_PATH="$1/share/jupyter" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider -p dk_ipykernel_plugin -rs --timeout 300 \
    --pyargs ipykernel.tests.test_message_spec ipykernel.tests.test_kernel ipykernel.tests.test_debugger
}
sigint_ignored() {   # PREFIX: the interrupt tests again, from a shell that ignores SIGINT
  # As when a script starts the notebook server in the background: every
  # process it starts, the kernel included, inherits SIGINT ignored.
  echo "== interrupt tests with SIGINT ignored by the launching shell ($1) =="
  DISTKERNEL_PREFIX=$1 /usr/bin/python3 -c \
    'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])' \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/e2e/test_interrupt.py tests/e2e/test_parity.py \
    -k "interrupt or pdb or input"
}
slurm_without_workaround() {   # BUILD PREFIX: the node-loss tests on a cluster without it
  # Slurm 22.05.8's srun, run from a host that is not a node, can hang for ever
  # once a node is lost (Slurm bug 16401). The default test cluster adds the
  # configuration workaround (tests/slurm/cluster.sh); here the node-loss tests
  # run again on a cluster of their own without it, where only distkernel's
  # own heartbeats and deadlines can end the cell.
  echo "== node-loss tests on a Slurm cluster without the srun workaround ($2) =="
  DISTKERNEL_PREFIX=$2 DISTKERNEL_FAKE_CUDA=$1/tests/unit \
    DISTKERNEL_SLURM_SIM_DIR=/tmp/distkernel-slurm-nowa DISTKERNEL_SLURM_SIM_NET=10.79.3 \
    DISTKERNEL_SLURM_SIM_BRIDGE=dkslurm3 DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND=0 \
    /usr/bin/python3 -m pytest tests/e2e/test_slurm_runs.py -q -p no:cacheprovider \
    -k "lost or cut_off"
}
figures() {      # BUILD: what the reliability tests measured, for the README
  echo "== figures ($1) =="
  for f in "$1"/figures/*.json; do
    [ -e "$f" ] && /usr/bin/python3 -c \
      'import json, sys; print(sys.argv[2] + ":", json.dumps(json.load(open(sys.argv[1]))))' \
      "$f" "$(basename "$f" .json)"
  done
  return 0
}

BUILD=build-test PREFIX=$PWD/build-test/prefix scripts/build.sh
units build-test
rm -rf build-test/figures
end_to_end build-test "$PWD/build-test/prefix" "$@"
if [ $# -eq 0 ]; then
  ipykernel_suite "$PWD/build-test/prefix"
  sigint_ignored "$PWD/build-test/prefix"
  slurm_without_workaround build-test "$PWD/build-test/prefix"
fi
figures build-test

if [ "${SANITIZE:-1}" != 0 ]; then
  echo "== the same, under AddressSanitizer + UndefinedBehaviorSanitizer =="
  reports=$(mktemp -d)
  BUILD=build-asan PREFIX=$PWD/build-asan/prefix scripts/build.sh \
    -Db_sanitize=address,undefined -Db_lundef=false
  export UBSAN_OPTIONS="print_stacktrace=1:log_path=$reports/ubsan"
  ASAN_OPTIONS="detect_leaks=1:log_path=$reports/asan" \
    LSAN_OPTIONS="suppressions=$PWD/tests/unit/lsan.supp:print_suppressions=0" units build-asan
  # The kernel and its ranks embed CPython, which is not instrumented and keeps
  # its memory until the process ends, so leak checking is for the C units.
  # Timing figures under the sanitizers mean nothing: the flood test then checks
  # that every probe is answered, not how fast, and the soak runs a quarter size.
  rm -rf build-asan/figures
  ASAN_OPTIONS="detect_leaks=0:quarantine_size_mb=16:log_path=$reports/asan" DISTKERNEL_SANITIZED=1 \
    DISTKERNEL_SOAK_SCALE=${DISTKERNEL_SOAK_SCALE:-0.25} \
    end_to_end build-asan "$PWD/build-asan/prefix" "$@"
  figures build-asan
  if compgen -G "$reports/*" > /dev/null; then
    echo "== sanitizer reports =="
    cat "$reports"/*
    echo "FAILED: the sanitizers reported the errors above" >&2
    exit 1
  fi
  echo "sanitizers: no report"
fi

if [ "${FUZZ:-1}" != 0 ]; then
  echo "== fuzzing: each libFuzzer target for ${FUZZ_SECONDS:-60} s, after its regressions =="
  FUZZ_SECONDS="${FUZZ_SECONDS:-60}" scripts/fuzz.sh
fi

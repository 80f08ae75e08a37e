#!/usr/bin/env bash
# Run every test of distkernel on this machine: install what is needed, build,
# the C unit tests (criterion, through meson), then the end-to-end suite that
# drives the installed kernel with jupyter_client, jupyter_kernel_test and nbconvert.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

BUILD=${BUILD:-build-test}
export BUILD PREFIX=${PREFIX:-$PWD/$BUILD/prefix}
scripts/build.sh

echo "== C unit tests =="
meson test -C "$BUILD" --print-errorlogs

echo "== end-to-end tests =="
export DISTKERNEL_PREFIX="$PREFIX"
/usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider -o junit_family=xunit2 "$@"

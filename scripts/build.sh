#!/usr/bin/env bash
# Build and install distkernel into PREFIX (default: ./prefix) from build dir
# BUILD (default: ./build). Extra arguments go to `meson setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PREFIX=${PREFIX:-$PWD/prefix}
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --prefix="$PREFIX" "$@"
fi
ninja -C "$BUILD"
meson install -C "$BUILD" --quiet

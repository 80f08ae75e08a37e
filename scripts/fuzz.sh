#!/usr/bin/env bash
# Fuzz the parsers that take bytes from outside the kernel: the wire decoder
# with its signature and replay checks, the connection file, the magic and
# %%distributed option parser, the rank output line assembler (with its
# UTF-8 repair), and the grouping of the ranks' stacks. See tests/fuzz/README.md.
#
# Each target is built with clang's libFuzzer plus AddressSanitizer and
# UndefinedBehaviorSanitizer straight from the project's sources (the meson/gcc
# build is not involved), then
#   1. run once on every input in tests/fuzz/regressions/<target>/ (the crash
#      inputs found before, which must stay fixed), and
#   2. fuzzed for FUZZ_SECONDS on a copy of tests/fuzz/corpus/<target>/ (the
#      committed seeds are never modified), with leak detection.
# Exits non-zero if any run crashes, leaks, times out or runs out of memory;
# the input that did it is kept under $FUZZ_BUILD/artifacts/<target>/.
#
#   scripts/fuzz.sh                          every target, 60 s each
#   FUZZ_SECONDS=10 scripts/fuzz.sh          shorter
#   FUZZ_SECONDS=0 scripts/fuzz.sh           regressions and seeds only, no fuzzing
#   scripts/fuzz.sh fuzz_wire fuzz_conn      some targets
#   FUZZ_JOBS=1 scripts/fuzz.sh              one target at a time (default: one per CPU)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${FUZZ_SECONDS:-60}
BUILD=${FUZZ_BUILD:-build-fuzz}
CC=${FUZZ_CC:-clang}
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
ALL_TARGETS=(fuzz_wire fuzz_conn fuzz_opts fuzz_lines fuzz_launchout fuzz_stacks)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

# The project's sources (and libraries) each target exercises.
sources() {
  case $1 in
    fuzz_wire)  echo "protocol/dk_wire.c" ;;
    fuzz_conn)  echo "protocol/dk_conn.c protocol/dk_wire.c" ;;
    fuzz_opts)  echo "magics/dk_magic.c distributed/dk_dist_opts.c distributed/dk_dist_opts_table.c distributed/dk_dist_opts_slurm.c distributed/dk_dist_opts_doc.c distributed/dk_rank_list.c runtime/slurm/dk_slurm_parse.c" ;;
    fuzz_lines) echo "runtime/base/dk_lines.c runtime/base/dk_utf8.c" ;;
    fuzz_launchout) echo "runtime/launch/dk_launchout.c" ;;
    fuzz_stacks) echo "runtime/stacks/dk_stacks.c runtime/stacks/dk_stacks_fold.c runtime/stacks/dk_stacks_flight.c runtime/base/dk_lost.c runtime/base/dk_utf8.c" ;;
    *) echo "unknown fuzz target '$1'; the targets are: ${ALL_TARGETS[*]}" >&2; return 1 ;;
  esac
}
libraries() {
  case $1 in
    fuzz_wire)  pkg-config --cflags --libs libczmq libzmq jansson openssl ;;
    fuzz_conn)  pkg-config --cflags --libs libczmq libzmq jansson openssl ;;
    fuzz_opts)  echo "-lm" ;;
    fuzz_lines) echo "" ;;
    fuzz_launchout) echo "" ;;
    fuzz_stacks) echo "" ;;
  esac
}

if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
     "$CC" -x c - -fsanitize=fuzzer,address,undefined -o /dev/null 2>/dev/null; then
  echo "fuzz: $CC cannot build libFuzzer targets (-fsanitize=fuzzer); on Debian install" \
       "clang and libclang-rt-dev (scripts/deps.sh does)" >&2
  exit 1
fi

mkdir -p "$BUILD"
# shellcheck disable=SC2054  # the commas are in -fsanitize=, not between elements
CFLAGS=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
        -Wall -Wextra -Wno-unused-parameter
        -Iprotocol -Imagics -Idistributed -Iruntime/base -Iruntime/slurm -Iruntime/stacks
        -Iruntime/launch -Itests/fuzz)
# The targets are built JOBS at a time; a failed build stops the run.
build_one() {
  local t=$1 src
  src=$(sources "$t") || return 1
  # shellcheck disable=SC2046,SC2086  # word splitting of the source and flag lists is wanted
  "$CC" "${CFLAGS[@]}" "tests/fuzz/$t.c" $src $(libraries "$t") -o "$BUILD/$t"
}
pids=()
for t in "${TARGETS[@]}"; do
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    wait "${pids[0]}" || { echo "fuzz: a target did not build" >&2; exit 1; }
    pids=("${pids[@]:1}")
  fi
  echo "fuzz: building $t"
  build_one "$t" & pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || { echo "fuzz: a target did not build" >&2; exit 1; }
done

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
touch "$work/start"     # artifacts newer than this are this run's

# Regressions, then fuzzing, for target $1; the log goes to $work/$1.log.
fuzz_one() {
  local t=$1 log=$work/$1.log artifacts=$BUILD/artifacts/$1/
  mkdir -p "$artifacts"
  : > "$log"
  local opts=(-timeout=10 -rss_limit_mb=2048 -detect_leaks=1 -artifact_prefix="$artifacts")
  [ -f "tests/fuzz/$t.dict" ] && opts+=(-dict="tests/fuzz/$t.dict")

  local regressions=()
  if [ -d "tests/fuzz/regressions/$t" ]; then
    while IFS= read -r -d '' f; do regressions+=("$f"); done < \
      <(find "tests/fuzz/regressions/$t" -type f ! -name '.*' ! -name '*.md' -print0 | sort -z)
  fi
  if [ ${#regressions[@]} -gt 0 ]; then
    echo "== $t: ${#regressions[@]} regression inputs ==" >> "$log"
    "$BUILD/$t" "${opts[@]}" "${regressions[@]}" >> "$log" 2>&1 || return 1
  fi

  mkdir -p "$work/corpus-$t"
  cp -R "tests/fuzz/corpus/$t/." "$work/corpus-$t/"
  echo "== $t: fuzzing for ${SECONDS_EACH}s ==" >> "$log"
  if [ "$SECONDS_EACH" -gt 0 ]; then
    "$BUILD/$t" "${opts[@]}" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
      "$work/corpus-$t" >> "$log" 2>&1 || return 1
  else
    "$BUILD/$t" "${opts[@]}" -runs=0 -print_final_stats=1 "$work/corpus-$t" >> "$log" 2>&1 ||
      return 1
  fi
}

# Run the targets, JOBS at a time, each in the background; each leaves its
# verdict in $work/<target>.status.
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzz: running $t"
  ( if fuzz_one "$t"; then echo ok; else echo FAILED; fi > "$work/$t.status" ) &
  running=$((running + 1))
done
wait

echo
printf '%-12s %-7s %14s %10s %10s %12s %8s\n' target result executions "exec/s" coverage features corpus
failed=0
for t in "${TARGETS[@]}"; do
  log=$work/$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<< "$done_line")
  status=$(cat "$work/$t.status" 2>/dev/null || echo FAILED)
  printf '%-12s %-7s %14s %10s %10s %12s %8s\n' "$t" "$status" "${execs:--}" \
    "${rate:--}" "${cov:--}" "${ft:--}" "${corp:--}"
  if [ "$status" != ok ]; then
    failed=1
    {
      echo
      echo "== $t failed; the end of its log: =="
      tail -n 60 "$log"
      find "$BUILD/artifacts/$t" -type f -newer "$work/start" | while IFS= read -r a; do
        echo "== input kept: $a; reproduce with: $BUILD/$t $a"
        echo "   (commit it to tests/fuzz/regressions/$t/ with the fix) =="
      done
    } >&2
  fi
done
if [ "$failed" != 0 ]; then
  echo "FAILED: a fuzz target crashed, leaked, timed out or ran out of memory" >&2
  exit 1
fi
echo "fuzz: no crash, leak or timeout"

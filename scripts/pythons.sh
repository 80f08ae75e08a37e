#!/usr/bin/env bash
# The Pythons the tests run distkernel in, beside the one it was built with:
# every CPython 3.10 or later that this machine has as an installation of its
# own (pyenv's here; a conda env or python.org's install is the same kind of
# thing), and for each a venv holding the kernel's needs from PyPI (IPython,
# cloudpickle: tests/pythons/lock*.txt).
#
#   scripts/pythons.sh     build the venvs this machine lacks, then print one
#                          line per Python:  VERSION BASE_PYTHON VENV_PYTHON
#   scripts/pythons.sh --uv   the same for one venv made by uv (tests/pythons/uv.txt),
#                          of the newest of those Pythons
#
# Which Pythons: DISTKERNEL_TEST_PYTHONS (python executables, space-separated)
# when set, else every ~/.pyenv/versions/3.*/bin/python3 (or PYENV_ROOT's) of
# 3.10 or later. None at all prints nothing, and the tests that need them skip.
#
# Once per machine: each venv lives outside the clone, in
#   ${XDG_CACHE_HOME:-~/.cache}/distkernel/pythons/VERSION-HASH
# where HASH is of its lock file, the base Python's path and this recipe;
# the wheels go to the folder scripts/venv.sh keeps (distkernel/wheels), so a
# second machine run downloads nothing. A venv is used only once its last
# file (.distkernel-complete) is written; two runs at once take turns (flock).
# What it costs: about 20 MB of wheels and 10 s per Python, the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/distkernel
WHEELS=$CACHE/wheels
STAMP=.distkernel-complete
PIP_ARGS=(--no-cache-dir --disable-pip-version-check --progress-bar off -q)

say() { echo "pythons: $*" >&2; }

UV=0
if [[ ${1:-} == --uv ]]; then UV=1; fi

mkdir -p "$CACHE/pythons" "$WHEELS"
exec 9> "$CACHE/pythons.lock"
flock 9

pythons=()
lines=()
if [[ -n ${DISTKERNEL_TEST_PYTHONS:-} ]]; then
  read -r -a pythons <<< "$DISTKERNEL_TEST_PYTHONS"
else
  for py in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3; do
    [[ -x $py ]] && pythons+=("$py")
  done
fi

for base in "${pythons[@]}"; do
  version=$("$base" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || {
    say "$base does not run: skipped"; continue; }
  minor=${version%.*}
  # 3.10 or later: the oldest distkernel runs on (older ones are the refusal tests').
  [[ ${minor#3.} -ge 10 ]] || continue
  lock=tests/pythons/lock.txt
  [[ $minor == 3.10 ]] && lock=tests/pythons/lock-3.10.txt
  hash=$( (cat "$lock"; echo "$base" "$RECIPE") | sha256sum | cut -c1-12)
  venv=$CACHE/pythons/$version-$hash
  if [[ ! -e $venv/$STAMP ]]; then
    say "building the venv of $base ($version) in $venv"
    rm -rf "$venv"
    "$base" -m venv "$venv"
    # Wheels only, from the shared folder first; only what is missing there is downloaded.
    "$venv/bin/python" -m pip download "${PIP_ARGS[@]}" --only-binary :all: --no-deps \
      -d "$WHEELS" --find-links "$WHEELS" -r "$lock" >&2
    "$venv/bin/python" -m pip install "${PIP_ARGS[@]}" --only-binary :all: --no-deps \
      --no-index --find-links "$WHEELS" -r "$lock" >&2
    touch "$venv/$STAMP"
  fi
  # Venvs of an older lock or recipe for this base go.
  for old in "$CACHE/pythons/$version"-*; do
    [[ $old != "$venv" && -d $old ]] && rm -rf "$old"
  done
  lines+=("$version $base $venv/bin/python")
done

if [[ $UV == 0 ]]; then
  [[ ${#lines[@]} == 0 ]] || printf '%s\n' "${lines[@]}"
  exit 0
fi
# uv itself in a venv of its own, from a wheel; then a venv by uv of the newest
# Python, with the same pinned wheels.
[[ ${#lines[@]} != 0 ]] || exit 0
read -r version base _ <<< "${lines[-1]}"
lock=tests/pythons/lock.txt
[[ $version == 3.10.* ]] && lock=tests/pythons/lock-3.10.txt
hash=$( (cat tests/pythons/uv.txt "$lock"; echo "$base" "$RECIPE") | sha256sum | cut -c1-12)
tool=$CACHE/pythons/uv-tool-$hash
venv=$CACHE/pythons/uv-$version-$hash
if [[ ! -e $venv/$STAMP ]]; then
  say "making a venv of $base with uv in $venv"
  rm -rf "$tool" "$venv"
  "$base" -m venv "$tool"
  "$tool/bin/python" -m pip download "${PIP_ARGS[@]}" --only-binary :all: --no-deps \
    -d "$WHEELS" --find-links "$WHEELS" -r tests/pythons/uv.txt >&2
  "$tool/bin/python" -m pip install "${PIP_ARGS[@]}" --no-index --find-links "$WHEELS" \
    -r tests/pythons/uv.txt >&2
  "$tool/bin/uv" venv -q --python "$base" "$venv" >&2
  VIRTUAL_ENV=$venv "$tool/bin/uv" pip install -q --no-index --find-links "$WHEELS" \
    --no-deps -r "$lock" >&2
  touch "$venv/$STAMP"
fi
for old in "$CACHE/pythons/"uv-*; do
  [[ $old != "$venv" && $old != "$tool" && -d $old ]] && rm -rf "$old"
done
echo "$version $base $venv/bin/python"

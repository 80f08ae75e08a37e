#!/usr/bin/env bash
# The test venv: today's Python stack from PyPI (ipykernel 7, IPython 9,
# JupyterLab 4, Notebook 7, torch 2, MLflow 3, Ray 2...), for the tests that
# run distkernel as users meet it in their own environment. Debian's stack
# stays the quickstart's and the Debian package's, and most of the tests run
# on it; this venv is beside it, never in it.
#
#   scripts/venv.sh          build the venv if this machine has none, print its path
#   scripts/venv.sh --lock   resolve tests/venv/requirements.txt again and write
#                            tests/venv/lock.txt (after changing a pin there)
#
# Once per machine: the venv lives outside the clone, in
#   ${XDG_CACHE_HOME:-~/.cache}/distkernel/venv-HASH
# where HASH is of tests/venv/lock.txt, the Python's version and this script's
# recipe, with the wheels it was installed from beside it (distkernel/wheels).
# Every clone and worktree of the machine shares it; a lock or a Python that
# changes makes another venv, from those wheels and what is new (only that is
# downloaded). Each build leaves the two newest venvs and removes older ones;
# the wheels folder keeps every wheel it was given (remove it to start over).
# A file written last (.distkernel-complete) marks a venv complete: one that
# a build left unfinished (interrupted, out of disk) is removed and built
# again, never used. Two runs at once take turns (flock).
#
# What it holds: a venv of /usr/bin/python3, the Python the kernel embeds
# (`distkernel install --python` takes only environments of that Python),
# without --system-site-packages, so what the tests meet is the registry's
# stack and not Debian's; it holds IPython and cloudpickle, all the kernel
# needs of an environment. Every package is the one lock.txt names, from
# wheels only: the registry's own, and for the packages it has only as source
# (SDIST_ONLY: DeepSpeed), a wheel built here once per machine with the venv's
# own torch and setuptools, kept with the others in the wheels folder (about
# 20 s; DS_BUILD_OPS=0, so no op is compiled then: DeepSpeed compiles the few
# it uses on their first use, e.g. its shared-memory collectives on CPU ranks,
# into ~/.cache/torch_extensions). Beside it, src/ipykernel-VERSION holds the tests/ folder and
# pyproject.toml of ipykernel's source distribution (its wheel ships no tests),
# which scripts/test.sh runs against distkernel.
#
# What a fresh machine pays: the registry's torch for x86_64 Linux is the CUDA
# build, so 3.4 GB is downloaded (torch 0.5 GB, its nvidia-*, cuda and triton
# wheels 2.5 GB), kept as 3.2 GiB of wheels, and the venv takes 6.8 GiB: about
# 10 GiB of disk. The build took 3 to 4 minutes on the 2-core test machines
# (the registry at about 50 MB/s; a slower link adds its time). Once the venv
# exists, a run downloads nothing and takes a fraction of a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3     # the Python the kernel embeds (meson's -Dpython default)
REQ=tests/venv/requirements.txt
LOCK=tests/venv/lock.txt
RECIPE=2                # bump when what a build does changes, so venvs are built again
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/distkernel
STAMP=.distkernel-complete
# The wheels are kept in a folder of their own rather than in pip's cache:
# the registry's responses reach these machines without caching headers, and
# pip's HTTP cache then keeps nothing.
WHEELS=$CACHE/wheels
PIP_ARGS=(--no-cache-dir --disable-pip-version-check --progress-bar off -q)
# Packages the registry has as a source distribution only (no wheel for any
# platform): resolved from their source's metadata, built into a wheel here.
SDIST_ONLY=(deepspeed)

say() { echo "venv: $*" >&2; }

# The version NAME is pinned to in FILE.
pinned() { sed -n "s/^$1==\([^ ;]*\).*/\1/p" "$2" | head -n 1; }

mkdir -p "$CACHE"
exec 9> "$CACHE/venv.lock"
flock 9

if [[ ${1:-} == --lock ]]; then
  # A throwaway venv of the same Python resolves the pins (pip's --dry-run
  # reads the packages' metadata, not their wheels) and every package it
  # would install becomes a line of the lock.
  scratch=$CACHE/lock-scratch
  rm -rf "$scratch"
  $PY -m venv "$scratch"
  "$scratch/bin/python" -m pip install "${PIP_ARGS[@]}" "pip==$(pinned pip "$REQ")"
  # The registry's metadata is enough (PEP 658): no wheel is downloaded.
  # (An SDIST_ONLY package's metadata is its setup.py's: pip runs it in a
  # build environment without torch, which DeepSpeed's allows.)
  "$scratch/bin/python" -m pip install "${PIP_ARGS[@]}" --dry-run --ignore-installed \
    --only-binary :all: --no-binary "$(IFS=,; echo "${SDIST_ONLY[*]}")" \
    --report "$scratch/report.json" -r "$REQ"
  "$scratch/bin/python" - "$scratch/report.json" "$REQ" "$LOCK" <<'EOF'
import json, sys
report, req, lock = sys.argv[1:]
pins = {}
for item in json.load(open(report))["install"]:
    meta = item["metadata"]
    if meta["name"].lower() == "pip":
        continue   # first, on a line of its own
    pins[meta["name"].lower().replace("_", "-")] = f'{meta["name"]}=={meta["version"]}'
pip = next(l.strip() for l in open(req) if l.startswith("pip=="))
with open(lock, "w") as f:
    f.write("# Every package of the test venv, as tests/venv/requirements.txt resolved\n"
            "# for /usr/bin/python3 on x86_64 Linux. Written by `scripts/venv.sh --lock`;\n"
            "# scripts/venv.sh installs exactly these.\n")
    f.write(pip + "\n")
    for name in sorted(pins):
        f.write(pins[name] + "\n")
print(f"{lock}: {len(pins) + 1} packages")
EOF
  rm -rf "$scratch"
  exit 0
fi

# A pin changed in requirements.txt but the lock was not written again: say so
# rather than build a venv without it.
stale=$($PY - "$REQ" "$LOCK" <<'EOF'
import re, sys
def pins(path):
    out = {}
    for line in open(path):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m[1].lower().replace("_", "-")] = m[2]
    return out
req, lock = pins(sys.argv[1]), pins(sys.argv[2])
print(" ".join(f"{n}=={v}" for n, v in req.items() if lock.get(n) != v))
EOF
)
if [[ -n $stale ]]; then
  say "$LOCK does not have $stale from $REQ: run scripts/venv.sh --lock"
  exit 1
fi

pyversion=$($PY -c 'import sys; print(sys.version.split()[0])')
hash=$( { cat "$LOCK"; echo "$PY $pyversion recipe $RECIPE"; } | sha256sum | cut -c1-12)
VENV=$CACHE/venv-$hash

if [[ -f $VENV/$STAMP ]]; then
  echo "$VENV"
  exit 0
fi

start=$SECONDS
rm -rf "$VENV"
n=$(grep -c '==' "$LOCK")
say "building $VENV: $n packages from $LOCK, their wheels in $WHEELS"
say "(on a fresh machine: 3.4 GB to download, torch's CUDA build most of it; 3-4 min)"
$PY -m venv "$VENV"
# Download into the folder of wheels (what it has already is not fetched
# again), then install from it alone. The SDIST_ONLY packages come after.
wheels_only=$VENV/.lock-wheels.txt
grep -v -i -E "^($(IFS='|'; echo "${SDIST_ONLY[*]}"))==" "$LOCK" > "$wheels_only"
"$VENV/bin/python" -m pip download "${PIP_ARGS[@]}" --only-binary :all: -d "$WHEELS" \
  -r "$wheels_only"
"$VENV/bin/python" -m pip install "${PIP_ARGS[@]}" --no-index --find-links "$WHEELS" \
  "pip==$(pinned pip "$LOCK")"
"$VENV/bin/python" -m pip install "${PIP_ARGS[@]}" --no-index --find-links "$WHEELS" \
  --only-binary :all: -r "$wheels_only"
rm -f "$wheels_only"
# Each SDIST_ONLY package: its wheel, built once per machine from the
# registry's source with this venv's torch and setuptools (the lock has
# them), then installed from the wheels folder like the rest.
for name in "${SDIST_ONLY[@]}"; do
  version=$(pinned "$name" "$LOCK")
  [[ -n $version ]] || continue
  if ! compgen -G "$WHEELS/${name}-${version}-*.whl" > /dev/null; then
    say "building the wheel of $name $version (the registry has its source only)"
    DS_BUILD_OPS=0 "$VENV/bin/python" -m pip wheel "${PIP_ARGS[@]}" --no-deps \
      --no-build-isolation --no-binary "$name" -w "$WHEELS" "$name==$version" >&2
  fi
  "$VENV/bin/python" -m pip install "${PIP_ARGS[@]}" --no-index --find-links "$WHEELS" \
    --only-binary :all: "$name==$version"
done
"$VENV/bin/python" -m pip check >&2

# ipykernel's own tests, from its source distribution. pip reads the sdist's
# metadata with hatchling (fetched for that, then dropped); nothing is built.
ipk=$(pinned ipykernel "$LOCK")
mkdir -p "$CACHE/sdist" "$VENV/src"
"$VENV/bin/python" -m pip download "${PIP_ARGS[@]}" --no-deps --no-binary ipykernel \
  -d "$CACHE/sdist" "ipykernel==$ipk"
tar -xzf "$CACHE/sdist/ipykernel-$ipk.tar.gz" -C "$VENV/src" \
  "ipykernel-$ipk/tests" "ipykernel-$ipk/pyproject.toml"

echo "built $(date -u +%FT%TZ) in $((SECONDS - start)) s from $LOCK" > "$VENV/$STAMP"
say "built in $((SECONDS - start)) s: $(du -sh "$VENV" | cut -f1)"

# Keep the two newest complete venvs (another branch's lock may want the
# other); remove the rest and any a build left unfinished.
for old in "$CACHE"/venv-*; do
  [[ $old == "$VENV" ]] && continue
  [[ -f $old/$STAMP ]] || { rm -rf "$old"; continue; }
done
find "$CACHE" -mindepth 2 -maxdepth 2 -path "$CACHE/venv-*/$STAMP" -printf '%T@ %h\n' |
  sort -rn | tail -n +3 | cut -d' ' -f2- | while read -r old; do rm -rf "$old"; done

echo "$VENV"

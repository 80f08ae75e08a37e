#!/usr/bin/env bash
# The GPU path of distkernel, proven on the device machine (one H200, Python 3.12
# with torch 2.11 and CUDA 13, no package registry), in one run of about 5-8 minutes:
#
#   1. env       what the machine has (driver, GPU, Python, torch, compilers, libraries)
#   2. unpack    the Debian packages of .carry/ (tests/device/prepare_carry.sh, run here
#                first) into /tmp/dk, using only the libraries the machine lacks
#   3. build     distkernel with meson against the machine's own Python, into /tmp/dk/prefix
#   4. check     distkernel-check on the GPU: --json (in place), the text table,
#                and --out-of-place (falls back to a compiler-only build of it if 3 failed)
#   5. torch     the same all-reduce timed by torch.distributed/NCCL (torch_allreduce.py),
#                and the comparison at each size (compare_bench.py)
#   6. notebook  ddp_nccl.ipynb through the real kernel with nbconvert: discovery and
#                the accelerator_type mismatch error, num_accelerators above the
#                count, no CUDA context in the kernel, %distributed_check, and a
#                one-rank NCCL DDP step; verify_notebook.py reads the result
#
# Every step runs whatever happened before it, with `set -x` tracing, its exit
# status and time recorded in summary.txt. Device tool call:
#   command: bash tests/device/gpu_check.sh     carry: [".carry"]     timeout_s: 560
# Outputs (at most 8 files, the device tool's limit) in $OUT: gpu_check.log,
# summary.txt, check.json, check.txt, torch_allreduce.json, bench.txt, ddp_nccl.out.ipynb.
# Dry runs elsewhere: DK_PYTHON=/usr/bin/python3 OUT=/tmp/out bash tests/device/gpu_check.sh
set -u -o pipefail
set -a   # every variable below reaches the steps, which run in child shells (for timeout)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpu_check_out}
DK=${DK:-/tmp/dk}
CARRY=${CARRY:-$REPO/.carry}
PY=${DK_PYTHON:-$(command -v python3)}
mkdir -p "$OUT" "$DK"
exec > >(tee "$OUT/gpu_check.log") 2>&1
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
T0=$(date +%s)
export PYTHONUNBUFFERED=1

note() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME TIMEOUT FUNCTION: run FUNCTION traced (bash -x) in a child shell with a
# time limit, and record its exit status and time. A step's failure stops nothing.
step() {
    local name=$1 limit=$2 fn=$3
    local t; t=$(date +%s)
    echo; echo "======== $name (limit ${limit}s, at +$(( t - T0 ))s) ========"
    export -f "$fn"
    timeout --kill-after=10 "$limit" bash -x -o pipefail -c "$fn"
    local rc=$?
    note "STEP $name: exit $rc in $(( $(date +%s) - t ))s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
    return $rc
}
export -f note

# ---- 1. env ------------------------------------------------------------------------
env_probe() {
    uname -a; cat /etc/os-release 2>/dev/null | head -3
    nvidia-smi || echo "nvidia-smi failed"
    nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    echo "python: $PY"; "$PY" -VV
    "$PY" - <<'PY'
import sysconfig, os, glob
inc = sysconfig.get_paths()["include"]
print("Python.h:", os.path.exists(os.path.join(inc, "Python.h")), inc)
libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
print("libpython:", ldlib, libdir, os.path.exists(os.path.join(libdir or "", ldlib or "")))
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
          "available", torch.cuda.is_available())
except Exception as e:
    print("torch import failed:", e)
for mod in ("IPython", "cloudpickle", "zmq", "nbconvert", "jupyter_client", "mesonbuild"):
    try:
        __import__(mod); print("have", mod)
    except Exception as e:
        print("no", mod, type(e).__name__)
try:
    import nvidia.nccl
    for d in nvidia.nccl.__path__:
        print("torch nccl:", glob.glob(os.path.join(d, "lib", "libnccl.so*")))
except Exception as e:
    print("no nvidia.nccl:", e)
PY
    for t in cc gcc meson ninja pkg-config pkgconf nvcc dpkg; do echo "$t: $(command -v $t)"; done
    ldconfig -p | grep -E 'libzmq|libczmq|libjansson|libcurl\.|libssl\.|libcrypto\.|libnccl|libcudart|libnvidia-ml|libpython3' || true
    ls /usr/local/cuda/lib64/libcudart* 2>/dev/null
    nproc; free -g
}
step env 60 env_probe
note "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"

# NCCL: the one torch uses, so both sides of the comparison run the same library.
TORCH_NCCL=$("$PY" -c "import nvidia.nccl, glob, os; print(sorted(glob.glob(os.path.join(nvidia.nccl.__path__[0], 'lib', 'libnccl.so*')))[-1])" 2>/dev/null || true)
if [ -n "$TORCH_NCCL" ]; then export DISTKERNEL_NCCL_LIB=$TORCH_NCCL; fi
note "NCCL library for distkernel-check: ${DISTKERNEL_NCCL_LIB:-none found, the default search}"

# ---- 2. unpack ---------------------------------------------------------------------
LIBEXTRA=$DK/libextra LIBDEV=$DK/libdev PCDIR=$DK/pc KPY=$DK/kpy-path
unpack() {
    [ -d "$CARRY/debs" ] || { echo "no $CARRY/debs: run tests/device/prepare_carry.sh here and carry .carry"; return 1; }
    rm -rf "$LIBEXTRA" "$LIBDEV" "$PCDIR" "$KPY"; mkdir -p "$LIBEXTRA" "$LIBDEV" "$PCDIR" "$KPY"
    for set in kernel client kpy; do
        mkdir -p "$DK/$set"
        for f in "$CARRY/debs/$set"/*.deb; do dpkg -x "$f" "$DK/$set" || echo "dpkg -x failed: $f"; done
    done
    # Only the libraries this machine lacks; the system's own always win.
    ldconfig -p | awk 'NR>1{print $1}' | sort -u > "$DK/system-libs.txt"
    local n=0
    { set +x; } 2>/dev/null   # one line per library is too much for the log
    for d in "$DK"/{kernel,client}/{usr/,}lib/x86_64-linux-gnu; do
        [ -d "$d" ] || continue
        for f in "$d"/lib*.so.*; do
            [ -e "$f" ] || continue
            local b; b=$(basename "$f")
            if ! grep -qx "$b" "$DK/system-libs.txt" && [ ! -e "$LIBEXTRA/$b" ]; then ln -s "$f" "$LIBEXTRA/$b"; n=$((n+1)); fi
        done
    done
    set -x
    echo "linked $n carried libraries the machine lacks:"; ls "$LIBEXTRA"
    # Link names (libczmq.so, ...) for whichever copy will be used at run time.
    for soname in libczmq.so.4 libzmq.so.5 libjansson.so.4 libcurl.so.4 libssl.so.3 libcrypto.so.3; do
        local path; path=$(ldconfig -p | awk -v n="$soname" '$1==n{print $NF; exit}')
        [ -n "$path" ] || path=$LIBEXTRA/$soname
        ln -sf "$path" "$LIBDEV/${soname%.*}"
    done
    ls -l "$LIBDEV"
    # The carried .pc files, pointed at the carried headers and LIBDEV, without
    # Requires.private (their -dev packages are not carried; shared linking needs none).
    local inc=$DK/kernel/usr/include
    for pc in "$DK"/kernel/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
        sed -e '/^Requires.private/d' -e '/^Libs.private/d' \
            -e "s#^prefix=.*#prefix=$DK/kernel/usr#" -e "s#^exec_prefix=.*#exec_prefix=$DK/kernel/usr#" \
            -e "s#^libdir=.*#libdir=$LIBDEV#" -e "s#^includedir=/usr/include#includedir=$inc#" \
            -e "s#-I/usr/include#-I$inc#g" "$pc" > "$PCDIR/$(basename "$pc")"
    done
    ls "$PCDIR"
    # IPython and friends for the kernel's Python: only what that Python cannot import.
    local dp=$DK/kpy/usr/lib/python3/dist-packages
    { set +x; } 2>/dev/null
    for entry in "$dp"/*; do
        local b; b=$(basename "$entry")
        case "$b" in *.dist-info|*.egg-info|__pycache__) continue ;; esac
        local mod=${b%.py}
        if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null; then
            ln -s "$entry" "$KPY/$b"
            for meta in "$dp/${mod}"-*.dist-info "$dp/${mod}"-*.egg-info; do [ -e "$meta" ] && ln -sf "$meta" "$KPY/"; done
        fi
    done
    set -x
    echo "for the kernel's Python:"; ls "$KPY"
}
step unpack 120 unpack
PYLIBDIR=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")' 2>/dev/null)
export LD_LIBRARY_PATH=$LIBEXTRA${PYLIBDIR:+:$PYLIBDIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- 3. build ----------------------------------------------------------------------
PREFIX=$DK/prefix
build() {
    local pkgconfig; pkgconfig=$(command -v pkg-config || command -v pkgconf || echo "$DK/kernel/usr/bin/pkgconf")
    printf "[binaries]\npkg-config = '%s'\n" "$pkgconfig" > "$DK/native.ini"
    local meson=(meson); command -v meson >/dev/null || meson=("$PY" -m mesonbuild.mesonmain)
    rm -rf "$DK/build"
    PKG_CONFIG_LIBDIR=$PCDIR PKG_CONFIG_PATH=$PCDIR PYTHONPATH=$KPY \
        "${meson[@]}" setup "$DK/build" "$REPO" --prefix="$PREFIX" -Dpython="$PY" \
        --native-file "$DK/native.ini" -Dbuildtype=release &&
    ninja -C "$DK/build" -j "$(nproc)" &&
    "${meson[@]}" install -C "$DK/build" --quiet
}
step build 300 build
CHECK=$PREFIX/bin/distkernel-check
if [ ! -x "$CHECK" ]; then
    # distkernel-check needs no Python: build it with the compiler alone.
    check_min() {
        mkdir -p "$DK/check-min"
        cc -std=c11 -O2 -D_GNU_SOURCE -I"$REPO/runtime/gpu" -I"$REPO/runtime/base" -I"$DK/kernel/usr/include" \
            "$REPO"/runtime/gpu/{check_main,dk_nccl,dk_nccl_report,dk_nccl_load,dk_dl,dk_gpu}.c \
            -L"$LIBDEV" -ljansson -ldl -lpthread -lm -o "$DK/check-min/distkernel-check"
    }
    step check-min 60 check_min && CHECK=$DK/check-min/distkernel-check
    note "distkernel-check: $CHECK"
fi

# ---- 4. distkernel-check -------------------------------------------------------------
run_check() {
    local t; t=$(date +%s%N)
    "$CHECK" --json > "$OUT/check.json"; local rc=$?
    note "distkernel-check --json: exit $rc, $(( ($(date +%s%N) - t) / 1000000 )) ms wall (process start to exit)"
    "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print('CHECK VERDICT:', r.get('verdict'), '-', r.get('summary') or r.get('reason'))" "$OUT/check.json" | tee -a "$SUMMARY"
    { echo "== distkernel-check (in place, as torch.distributed.all_reduce)"; "$CHECK"
      echo; echo "== distkernel-check --out-of-place"; "$CHECK" --out-of-place; } > "$OUT/check.txt"
    cat "$OUT/check.txt"
    return $rc
}
step check 240 run_check

# ---- 5. torch.distributed, the same all-reduce -------------------------------------
run_torch() {
    "$PY" "$REPO/tests/device/torch_allreduce.py" --json "$OUT/torch_allreduce.json" &&
    "$PY" "$REPO/tests/device/compare_bench.py" "$OUT/check.json" "$OUT/torch_allreduce.json" > "$OUT/bench.txt"
    local rc=$?
    cat "$OUT/bench.txt"; grep -E '^(AT|WHOLE)' "$OUT/bench.txt" >> "$SUMMARY"
    return $rc
}
step torch 180 run_torch

# ---- 6. the notebook through the real kernel ---------------------------------------
run_notebook() {
    [ -x "$PREFIX/bin/distkernel" ] || { echo "no kernel built"; return 1; }
    # The installed kernelspec, with the environment the kernel needs here.
    local ks=$DK/jupyter/kernels/distkernel
    mkdir -p "$ks"
    "$PY" - "$PREFIX/share/jupyter/kernels/distkernel/kernel.json" "$ks/kernel.json" <<PY
import json, sys
spec = json.load(open(sys.argv[1]))
spec["env"] = {"LD_LIBRARY_PATH": "$LD_LIBRARY_PATH", "PYTHONPATH": "$KPY",
               "DISTKERNEL_NCCL_LIB": "${DISTKERNEL_NCCL_LIB:-}", "PATH": "$PATH"}
json.dump(spec, open(sys.argv[2], "w"), indent=1)
print(json.dumps(spec, indent=1))
PY
    local client=$DK/client/usr/bin/python3.11
    env -u PYTHONPATH PYTHONNOUSERSITE=1 JUPYTER_PATH="$DK/jupyter" JUPYTER_RUNTIME_DIR="$DK/runtime" \
        JUPYTER_CONFIG_DIR="$DK/jupyter-config" "$client" -m nbconvert --to notebook --execute \
        --allow-errors --ExecutePreprocessor.kernel_name=distkernel \
        --ExecutePreprocessor.timeout=240 --output-dir "$OUT" --output ddp_nccl.out.ipynb \
        "$REPO/tests/device/ddp_nccl.ipynb"
    local rc=$?
    [ -f "$OUT/ddp_nccl.out.ipynb" ] || return $rc
    "$PY" "$REPO/tests/device/verify_notebook.py" "$OUT/ddp_nccl.out.ipynb" | tee -a "$SUMMARY"
}
step notebook 300 run_notebook

note "TOTAL: $(( $(date +%s) - T0 ))s"
echo; cat "$SUMMARY"
exit 0

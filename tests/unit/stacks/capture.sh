#!/usr/bin/env bash
# Capture the faulthandler dumps test_stacks.c reads, from Debian's Python:
#   tests/unit/stacks/capture.sh
# A stand-in torch package (its collectives wrapped by a decorator, as
# torch's c10d_logger does) lives under a dist-packages folder, and cells are
# files in a distkernel-cells folder, named as python/distkernel/_cells.py
# names them. A helper thread dumps every thread's stack with faulthandler
# while the main thread waits, as the rank will do on request. The folder
# names are then rewritten to stable ones (/usr/lib/python3/dist-packages,
# /tmp/distkernel-cells-1-fixture/), so the files do not change per capture.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg=$work/dist-packages/torch/distributed
cells=$work/distkernel-cells-1-fixture
mkdir -p "$pkg" "$cells"
: > "$work/dist-packages/torch/__init__.py"
cat > "$pkg/__init__.py" <<'PY'
from .distributed_c10d import all_reduce, barrier
PY
cat > "$pkg/c10d_logger.py" <<'PY'
import functools
def _exception_logger(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper
PY
cat > "$pkg/distributed_c10d.py" <<'PY'
import time
from .c10d_logger import _exception_logger
@_exception_logger
def all_reduce(tensor):
    time.sleep(3600)   # work.wait(): a C call, as in torch
@_exception_logger
def barrier():
    time.sleep(3600)
PY
# The issue's cell: rank 2 sleeps at line 6, the others wait at line 8.
cat > "$cells/3163812341.py" <<'PY'
import time
import torch
import torch.distributed as dist
rank = RANK
if rank == 2:
    time.sleep(3600)
x = [1.0]
dist.all_reduce(x)
PY
# A deep recursion in the cell.
cat > "$cells/2871230113.py" <<'PY'
import sys
sys.setrecursionlimit(5000)
def f(n):
    return f(n - 1) if n else __import__("time").sleep(3600)
f(998)
PY
run() {  # run CELL RANK OUT
  PYTHONPATH=$work/dist-packages /usr/bin/python3 -c '
import faulthandler, os, sys, threading, time, queue
cell, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def dump():
    time.sleep(0.5)
    with open(out, "w") as f:
        faulthandler.dump_traceback(f, all_threads=True)
    os._exit(0)
q = queue.Queue()
threading.Thread(target=q.get, name="loader", daemon=True).start()
threading.Thread(target=dump, daemon=True).start()
src = open(cell).read().replace("RANK", str(rank))
exec(compile(src, cell, "exec"), {"__name__": "__main__"})
' "$1" "$2" "$3"
}
run "$cells/3163812341.py" 0 "$work/rank0.txt"
run "$cells/3163812341.py" 2 "$work/rank2.txt"
run "$cells/2871230113.py" 0 "$work/deep.txt"
for f in rank0 rank2 deep; do
  sed -e "s|$work/dist-packages|/usr/lib/python3/dist-packages|g" \
      -e "s|$work/distkernel-cells-1-fixture|/tmp/distkernel-cells-1-fixture|g" \
      -e 's/0x[0-9a-f]\{16\}/0x00007f0000000000/' "$work/$f.txt" > "$here/$f.txt"
done

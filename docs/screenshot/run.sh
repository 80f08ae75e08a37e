#!/usr/bin/env bash
# Makes docs/distributed-cell.png, the README's screenshot: Jupyter Notebook 6
# (Debian's python3-notebook) in Chromium runs make_notebook.py's notebook on
# the kernel installed under DISTKERNEL_PREFIX (default build/prefix).
# Needs node, /usr/bin/chromium and playwright-core: PLAYWRIGHT names its
# folder, else it is npm-installed into a temporary folder. Not part of CI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
prefix=${DISTKERNEL_PREFIX:-$repo/build/prefix}
out=${1:-$repo/docs/distributed-cell.png}
work=$(mktemp -d)
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

[ -f "$prefix/share/jupyter/kernels/distkernel/kernel.json" ] ||
    { echo "no kernel under $prefix: build and install it first (scripts/build.sh)" >&2; exit 1; }
if [ -z "${PLAYWRIGHT:-}" ]; then
    (cd "$work" && npm install --silent --no-save playwright-core >/dev/null)
    PLAYWRIGHT=$work/node_modules/playwright-core
fi

mkdir "$work/nb"
/usr/bin/python3 "$here/make_notebook.py" "$work/nb/distributed-cell.ipynb"
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
root=()
[ "$(id -u)" = 0 ] && root=(--allow-root)
JUPYTER_PATH=$prefix/share/jupyter JUPYTER_CONFIG_DIR=$work/config JUPYTER_RUNTIME_DIR=$work/runtime \
    /usr/bin/python3 -m notebook --no-browser --ip=127.0.0.1 --port="$port" --port-retries=0 \
    --NotebookApp.token="$token" --notebook-dir="$work/nb" "${root[@]}" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do      # up to 30 s for the server to answer
    curl -fs "http://127.0.0.1:$port/api?token=$token" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.1
done
PLAYWRIGHT=$PLAYWRIGHT node "$here/shot.js" \
    "http://127.0.0.1:$port/notebooks/distributed-cell.ipynb?token=$token" "$out" "sum over 4 ranks"
echo "$out"

#!/usr/bin/env bash
# The main job: set up a fresh Debian 12 machine, build and install distkernel,
# and run notebooks/quickstart.ipynb headless, printing what its cells printed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
export JUPYTER_PATH="$PWD/prefix/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
out=$(mktemp -d)
/usr/bin/python3 -m jupyter nbconvert --to notebook --execute \
  --ExecutePreprocessor.kernel_name=distkernel --ExecutePreprocessor.timeout=600 \
  notebooks/quickstart.ipynb --output-dir "$out" --output quickstart.out.ipynb
/usr/bin/python3 scripts/show_outputs.py "$out/quickstart.out.ipynb"
echo "distkernel: executed notebook: $out/quickstart.out.ipynb"

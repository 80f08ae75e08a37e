#!/usr/bin/env bash
# The main job: set up a fresh Debian 12 machine, build and install distkernel,
# register it with Jupyter for this user, and run notebooks/quickstart.ipynb
# headless on the registered kernel, printing what its cells printed.
# BUILD and PREFIX are scripts/build.sh's (./build, ./prefix).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
PREFIX=${PREFIX:-$PWD/prefix}
# In the user's own Jupyter folder: `jupyter kernelspec list` shows it, and
# every notebook front end of this user offers it (installing it again, after
# a rebuild, replaces it).
"$PREFIX/bin/distkernel" install --user
out=$(mktemp -d)
/usr/bin/python3 -m jupyter nbconvert --to notebook --execute \
  --ExecutePreprocessor.kernel_name=distkernel --ExecutePreprocessor.timeout=600 \
  notebooks/quickstart.ipynb --output-dir "$out" --output quickstart.out.ipynb
/usr/bin/python3 scripts/show_outputs.py "$out/quickstart.out.ipynb"
echo "distkernel: executed notebook: $out/quickstart.out.ipynb"
name=$(/usr/bin/python3 -c 'from jupyter_client.kernelspec import KernelSpecManager
print(KernelSpecManager().get_kernel_spec("distkernel").display_name)')
echo "distkernel: registered for $(id -un) as \"$name\" (jupyter kernelspec list shows it)."
echo "distkernel: open a notebook on it: jupyter notebook, then New > $name"

#!/usr/bin/env bash
# Install what distkernel needs to build, run and be tested, from Debian 12's
# packages. Safe to run again; it installs only what is missing.
#
# Only the install needs root: as root (a fresh container, where sudo is often
# not installed) apt-get runs as it is; as another user it runs through sudo,
# and nothing else the scripts do is elevated.
set -euo pipefail
SUDO=()
if [ "$(id -u)" != 0 ]; then SUDO=(sudo); fi

PKGS=(
  # build
  meson ninja-build pkg-config gcc clang
  libzmq3-dev libczmq-dev libssl-dev libjansson-dev libcurl4-openssl-dev zlib1g-dev
  python3-dev
  # the Python the kernel embeds
  python3-ipython python3-cloudpickle python3-ipykernel python3-ipywidgets
  # the Debian package (scripts/package.sh, scripts/package_test.sh)
  dpkg-dev debhelper dh-python lintian
  # tests and the headless notebook run
  libcriterion-dev python3-pytest python3-pytest-timeout python3-pytest-xdist python3-psutil python3-zmq
  python3-jupyter-client python3-jupyter-kernel-test python3-nbclient python3-nbconvert
  python3-nbformat jupyter-nbconvert python3-tqdm python3-torch
  # what the quickstart leaves a user: `jupyter kernelspec` and a notebook
  # front end (Debian's Notebook 6) to open the kernel it registers
  jupyter-client jupyter-notebook
  # ipykernel's own test modules, run against distkernel (tests/ipykernel/)
  python3-flaky python3-debugpy python3-matplotlib
  # fuzzing (scripts/fuzz.sh): libFuzzer and the sanitizer runtimes for clang
  libclang-rt-dev
  # the browser tests (tests/browser): JupyterLab 4 and Notebook 7 in Debian's
  # chromium, driven by Playwright for Python from the test venv, which never
  # downloads a browser of its own
  chromium
  # benchmarks (bench/): the ipyparallel %%px reference
  python3-ipyparallel
  # the simulated Slurm cluster the multi-node tests run on (tests/slurm/):
  # its daemons, its client commands and a private munged; the packages' own
  # services are never started (tests/slurm/cluster.sh runs its own daemons)
  slurm-wlm slurmd slurmctld slurm-client munge
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "distkernel: installing ${missing[*]}"
  if [ ${#SUDO[@]} -gt 0 ] && ! command -v sudo > /dev/null; then
    echo "distkernel: these Debian packages are missing and installing them needs root:" >&2
    echo "  ${missing[*]}" >&2
    echo "run this script as root, or install sudo, or install them yourself with apt-get" >&2
    exit 1
  fi
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi

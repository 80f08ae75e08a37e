#!/usr/bin/env bash
# Fetch, HERE (a Debian 12 machine that reaches Debian's package archive), the
# Debian packages that tests/device/gpu_check.sh needs on the device machine,
# which has no package registry. They go to .carry/ at the repository root,
# which this script adds to .git/info/exclude; the device call then names it:
#
#   bash tests/device/prepare_carry.sh          # here, once (about 30 MiB)
#   device run: command "bash tests/device/gpu_check.sh", carry [".carry"]
#
# Three sets, each unpacked there with `dpkg -x` into a folder of its own
# (never into /), and used through LD_LIBRARY_PATH / PYTHONPATH, and only
# for what the device machine lacks:
#   .carry/debs/kernel   headers and .pc files of CZMQ, libzmq, jansson, libcurl
#                        and OpenSSL, and their shared libraries with what those
#                        need (bookworm), plus pkgconf: to build distkernel there
#                        against the device's own Python (3.12, with torch).
#   .carry/debs/kpy      IPython and its pure-Python dependencies (trixie, which
#                        supports Python 3.12; bookworm's IPython 8.5 predates it):
#                        what the kernel's embedded Python imports.
#   .carry/debs/client   Debian 12's python3.11 with nbconvert, nbclient,
#                        jupyter_client and pyzmq (bookworm): the Jupyter client
#                        that drives the kernel. It is a separate process, so its
#                        Python need not be the kernel's; the device's Python has
#                        no pyzmq and no registry to get one from.
# Packages every Ubuntu or Debian system has (libc, libstdc++, zlib, ...) are
# left out (EXCLUDE below); gpu_check.sh links only the libraries the device
# lacks, so a carried library never shadows one of the system's.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=${CARRY:-.carry}

grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude

EXCLUDE="libc6 libc-bin libgcc-s1 libstdc++6 gcc-12-base gcc-14-base libcrypt1 zlib1g libzstd1
liblzma5 libbz2-1.0 libtinfo6 libncursesw6 libselinux1 libpcre2-8-0 libsystemd0 libelogind0
libcap2 libgcrypt20 libgpg-error0 liblz4-1 libuuid1 debconf dpkg perl-base perl perl-modules-5.36
libperl5.36 tar coreutils gdb gdb-minimal openssl media-types mime-support tzdata readline-common
netbase ca-certificates sensible-utils libdb5.3 libaudit1 libaudit-common libcap-ng0 libpam0g
python3-ipykernel python3-debugpy python3-pydevd
libglib2.0-0 libnss3 libnspr4 libexpat1 libffi8 libsqlite3-0"
# For the kernel's Python: never trixie's own interpreter (3.13), nor stubs.
EXCLUDE_KPY="$EXCLUDE python3 python3-minimal python3.13 python3.13-minimal libpython3.13-minimal
libpython3.13-stdlib libpython3-stdlib libpython3.13 python3-typeshed"

# Headers only: their own dependencies are not followed.
KERNEL_DEV="libczmq-dev libzmq3-dev libjansson-dev libcurl4-openssl-dev libssl-dev"
# Followed to every dependency not in EXCLUDE.
KERNEL_RT="libczmq4 libzmq5 libjansson4 libcurl4 libssl3 pkgconf-bin"
CLIENT="python3.11 python3-nbconvert python3-nbclient python3-jupyter-client python3-nbformat
python3-zmq"
KPY="python3-ipython"

# trixie's package lists, kept apart from the system's.
TRIXIE=/tmp/distkernel-trixie-apt
TRIXIE_OPTS=(-o "Dir::Etc::SourceList=$TRIXIE/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
             -o "Dir::State::Lists=$TRIXIE/lists" -o "Dir::Cache=$TRIXIE/cache"
             -o "Dir::State::status=/nonexistent-status")
setup_trixie() {
    mkdir -p "$TRIXIE/lists/partial" "$TRIXIE/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        > "$TRIXIE/sources.list"
    apt-get -q "${TRIXIE_OPTS[@]}" update >/dev/null
}

# closure APT-CACHE-COMMAND EXCLUDED ROOT...: the packages ROOTs need, following
# Depends and Pre-Depends (the first of each set of alternatives), stopping at EXCLUDED.
closure() {
    python3 - "$@" <<'PY'
import subprocess, sys
apt, exclude, todo = sys.argv[1].split("\x1f"), set(sys.argv[2].split()), sys.argv[3:]
def deps(pkg):
    out = subprocess.run(apt + ["depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                                "--no-breaks", "--no-replaces", "--no-enhances", pkg],
                         capture_output=True, text=True).stdout
    found, in_alt = [], False
    for line in out.splitlines()[1:]:
        s = line.strip()
        kind, _, name = s.partition(":")
        if kind.lstrip("|") not in ("Depends", "PreDepends"):
            continue
        first = not in_alt
        in_alt = kind.startswith("|")
        name = name.strip()
        if first and not name.startswith("<"):
            found.append(name.split(":")[0])
    return found
seen = set()
while todo:
    p = todo.pop()
    if p not in seen and p not in exclude:
        seen.add(p)
        todo.extend(deps(p))
print("\n".join(sorted(seen)))
PY
}

download() {  # download DEST APT-GET-OPTS... -- PACKAGES...
    local dest=$1; shift
    local opts=()
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    mkdir -p "$dest"
    (cd "$dest" && apt-get -q "${opts[@]}" download "$@" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
}

if [ ! -s /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease ] &&
   ! ls /var/lib/apt/lists/*bookworm*Packages* >/dev/null 2>&1; then
    apt-get -q update >/dev/null
fi
setup_trixie

rm -rf "$CARRY/debs"
SEP=$'\x1f'
kernel_pkgs=$(closure "apt-cache" "$EXCLUDE" $KERNEL_RT)
client_pkgs=$(closure "apt-cache" "$EXCLUDE libssl3" $CLIENT)
trixie_cache=$(IFS=$SEP; echo "apt-cache${SEP}${TRIXIE_OPTS[*]}")
kpy_pkgs=$(closure "$trixie_cache" "$EXCLUDE_KPY" $KPY)

download "$CARRY/debs/kernel" -- $KERNEL_DEV $kernel_pkgs
download "$CARRY/debs/client" -- $client_pkgs
download "$CARRY/debs/kpy" "${TRIXIE_OPTS[@]}" -- $kpy_pkgs

{
    echo "# Carried for tests/device/gpu_check.sh by tests/device/prepare_carry.sh on $(date -u +%F)"
    for set in kernel client kpy; do
        echo "## $set"
        for f in "$CARRY/debs/$set"/*.deb; do
            echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(stat -c %s "$f")"
        done
    done
} > "$CARRY/MANIFEST.txt"
du -sh "$CARRY"
for set in kernel client kpy; do
    echo "$set: $(ls "$CARRY/debs/$set" | wc -l) packages, $(du -sh "$CARRY/debs/$set" | cut -f1)"
done

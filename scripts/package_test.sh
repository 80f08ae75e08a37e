#!/usr/bin/env bash
# The Debian package end to end, as CI runs it: build it (scripts/package.sh),
# install it with apt-get, run a `%%distributed num_processes=2` cell through
# the INSTALLED kernelspec (/usr/share/jupyter/kernels/distkernel, whose argv is
# /usr/bin/distkernel) with jupyter_client, purge it, and check that nothing of
# it is left. Every step that fails stops the script with a line saying which.
#
# It needs root (apt-get, as scripts/deps.sh installs things) and python3-torch
# for the gloo all_reduce. It leaves the machine as it found it, also when a
# step fails: the exit trap purges the package and any package its install
# pulled in. It refuses to run where distkernel is installed already, since
# it would remove that installation.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
SUDO=()
if [ "$(id -u)" != 0 ]; then SUDO=(sudo); fi
apt_get() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q "$@"; }
step() { echo "== package test: $* =="; }
fail() { echo "package test FAILED: $*" >&2; exit 1; }

installed() {   # dpkg has the package in any state: installed, half-configured, config-files...
  local status
  status=$(dpkg-query -W -f='${Status}' distkernel 2>/dev/null) || return 1
  [[ $status != *" not-installed" ]]
}
if installed; then
  fail "the distkernel package is installed already; this test installs and purges it, so remove it first (apt-get remove --purge distkernel)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dk-package-test.XXXXXX")
cleanup() {
  local rc=$?
  set +e
  if installed; then
    echo "package test: purging distkernel (cleanup)" >&2
    apt_get remove --purge -y distkernel > /dev/null
  fi
  local extra=""
  if [ -f "$work/pulled" ]; then extra=$(cat "$work/pulled"); fi
  if [ -n "$extra" ]; then
    echo "package test: purging what the install pulled in: $extra" >&2
    # shellcheck disable=SC2086
    apt_get remove --purge -y $extra > /dev/null
  fi
  rm -rf "$work"
  echo "package test: $((SECONDS - start)) s$([ "$rc" = 0 ] || echo ", FAILED (exit $rc)")"
}
trap cleanup EXIT

dpkg-query -W -f='${Package}\n' | sort > "$work/packages.before"
# What is under the package's directories before; what is new there after the
# purge is left over. /usr/lib/python3 is out: other Python processes on the
# machine may write their bytecode there meanwhile.
snapshot() {
  { find /usr/bin /usr/share/jupyter /usr/share/distkernel /usr/share/doc/distkernel \
      /usr/share/python3 /etc /var/lib/dpkg/info 2>/dev/null || true; } | sort
}
snapshot > "$work/files.before"

step "build"
deb=$(scripts/package.sh | tail -n1) || fail "scripts/package.sh"
[ -f "$deb" ] || fail "scripts/package.sh printed '$deb', which is not a file"
deb=$(realpath "$deb")

step "install $deb"
installed_rc=0
apt_get install -y --no-install-recommends "$deb" > "$work/install.log" 2>&1 || installed_rc=$?
# The dependencies it installed, which the cleanup purges again (on CI,
# scripts/deps.sh has installed them all, and this is empty).
dpkg-query -W -f='${Package}\n' | sort | comm -13 "$work/packages.before" - |
  { grep -vx distkernel || true; } > "$work/pulled"
[ "$installed_rc" = 0 ] || { cat "$work/install.log" >&2; fail "apt-get install $deb"; }
dpkg -L distkernel > "$work/files.listed"
for f in /usr/bin/distkernel /usr/bin/distkernel-rank /usr/bin/distkernel-agent \
    /usr/bin/distkernel-check \
    /usr/lib/x86_64-linux-gnu/distkernel/libdistkernel-kernel.so \
    /usr/lib/x86_64-linux-gnu/distkernel/libdistkernel-rank.so \
    /usr/share/jupyter/kernels/distkernel/kernel.json \
    /usr/share/distkernel/python/distkernel/__init__.py; do
  grep -qx "$f" "$work/files.listed" || fail "dpkg -L distkernel does not list $f"
  [ -e "$f" ] || fail "$f is listed but not installed"
done

step "a %%distributed num_processes=2 cell on the installed kernelspec"
# A home and Jupyter dirs of its own: no user kernelspec named distkernel, no
# JUPYTER_PATH to a dev prefix; the rank logs go under this home too.
mkdir -p "$work/home"
env -i PATH=/usr/bin:/bin HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 \
  JUPYTER_RUNTIME_DIR="$work/runtime" \
  timeout 120 /usr/bin/python3 - <<'EOF' || fail "the distributed cell on the installed kernel"
import sys
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

spec = KernelSpecManager().get_kernel_spec("distkernel")
print("kernelspec:", spec.resource_dir, spec.argv)
assert spec.resource_dir == "/usr/share/jupyter/kernels/distkernel", spec.resource_dir
assert spec.argv[0] == "/usr/bin/distkernel", spec.argv

def main():
    km, kc = start_new_kernel(kernel_name="distkernel", startup_timeout=60)
    try:
        check(kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def check(kc):
    def run(code, timeout=90):
        """The cell's stdout, and its execute_reply's status."""
        msg_id = kc.execute(code)
        out = []
        while True:
            msg = kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "stream":
                sys.stderr.write(content["text"])
            elif kind == "error":
                print("\n".join(content["traceback"]), file=sys.stderr)
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = kc.get_shell_msg(timeout=timeout)
        return "".join(out), reply["content"]["status"]

    out, status = run("import os, distkernel\n"
                      "print(os.readlink('/proc/self/exe'), distkernel.__file__)")
    print("kernel:", out.strip())
    assert status == "ok", status
    assert out.split() == ["/usr/bin/distkernel",
                           "/usr/share/distkernel/python/distkernel/__init__.py"], out

    out, status = run(
        "%%distributed num_processes=2\n"
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print('exe', os.readlink('/proc/self/exe'), 'rank', dist.get_rank(),"
        " 'of', dist.get_world_size(), 'sum', int(t.item()))\n"
        "dist.destroy_process_group()\n")
    print(out, end="")
    assert status == "ok", status
    for rank in (0, 1):
        line = f"exe /usr/bin/distkernel-rank rank {rank} of 2 sum 3"
        assert any(l.endswith(line) for l in out.splitlines()), f"no {line!r} in:\n{out}"


main()   # in a function, so that the client is gone before the interpreter ends
print("the installed kernel ran the distributed cell")
EOF

step "kernels of the installed package for two other CPython versions"
# One installed distkernel serves every CPython from 3.10 on: kernelspecs for
# the user, for venvs of two versions that are not Debian's (scripts/pythons.sh),
# each running a cell and a 2-rank cell on its own Python.
build_minor=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
others=$(scripts/pythons.sh | awk -v b="$build_minor" 'index($1, b ".") != 1 { print $1, $3 }' |
         head -n 2)
[ "$(grep -c . <<< "$others")" = 2 ] || fail "scripts/pythons.sh has fewer than two other versions"
while read -r version python; do
  env -i PATH=/usr/bin:/bin HOME="$work/home" \
    /usr/bin/distkernel install --user --name "py$version" --python "$python" ||
    fail "distkernel install --user --python $python"
  env -i PATH=/usr/bin:/bin HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 \
    JUPYTER_RUNTIME_DIR="$work/runtime" \
    timeout 120 /usr/bin/python3 - "py$version" "$version" "$python" <<'EOF' ||
import sys
from jupyter_client.manager import start_new_kernel

name, version, python = sys.argv[1:]


def main():
    km, kc = start_new_kernel(kernel_name=name, startup_timeout=60)
    try:
        for code, want in (("import sys; print(sys.version.split()[0], sys.executable)",
                            [f"{version} {python}"]),
                           ("%%distributed num_processes=2 tracking=False\n"
                            "import sys; print(sys.version.split()[0], sys.executable)",
                            [f"[rank {r}] {version} {python}" for r in (0, 1)])):
            out = []
            reply = kc.execute_interactive(code, timeout=90, output_hook=lambda m: out.append(
                m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
            lines = "".join(out).splitlines()
            assert reply["content"]["status"] == "ok", (code, lines)
            assert sorted(lines) == sorted(want), (code, lines, want)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


main()   # in a function, so that the client is gone before the interpreter ends
print(f"the installed kernel ran on Python {version}")
EOF
    fail "a kernel of the installed package for Python $version"
done <<< "$others"

step "purge"
apt_get remove --purge -y distkernel > "$work/remove.log" 2>&1 ||
  { cat "$work/remove.log" >&2; fail "apt-get remove --purge distkernel"; }
! dpkg-query -W distkernel > /dev/null 2>&1 || fail "dpkg still knows distkernel after the purge"
# Every file the package listed, and every directory of its own (/usr/bin and
# the like stay, of course).
while read -r f; do
  if [ -e "$f" ] && { [ ! -d "$f" ] || [[ $f == *distkernel* ]]; }; then
    fail "$f is left after the purge"
  fi
done < "$work/files.listed"
snapshot > "$work/files.after"
left=$(comm -13 "$work/files.before" "$work/files.after")
! grep -qi distkernel <<< "$left" || fail "left after the purge: $(grep -i distkernel <<< "$left")"
if [ -n "$left" ]; then
  echo "package test: new since the start, not distkernel's (another process on this machine?):"
  echo "$left"
fi
echo "package test: ok"

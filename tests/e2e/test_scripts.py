"""
The README's commands on a fresh Debian 12 machine: scripts/deps.sh elevates only
the installation of missing packages, through sudo, and only when it is not root
(a fresh container runs as root and has no sudo). apt-get, dpkg-query and sudo
are stand-ins here that record how they were called; nothing is installed.
"""
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

import support

DEPS = support.REPO_ROOT / "scripts" / "deps.sh"


def stand_ins(tmp_path, with_sudo):
    """A PATH holding only what deps.sh needs: dpkg-query says every package is
    missing, apt-get and sudo write their argv and uid to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("bash", "env", "id", "grep"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    scripts = {
        "dpkg-query": "exit 1\n",
        "apt-get": f'echo "apt-get uid=$(id -u) $*" >> {log}\n',
    }
    if with_sudo:
        scripts["sudo"] = f'echo "sudo uid=$(id -u) $1" >> {log}\n"$@"\n'
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/bash\n" + body)
        path.chmod(0o755)
    for p in (tmp_path, bin_dir):
        p.chmod(0o755)
    log.touch()
    log.chmod(0o666)
    return bin_dir, log


def run_deps(bin_dir, user=None):
    argv = ["/usr/bin/bash", str(DEPS)]
    if user:
        argv = ["/usr/sbin/runuser", "-u", user, "--"] + argv
    return subprocess.run(argv, env={"PATH": str(bin_dir), "HOME": "/"}, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def tmp_path():
    """A directory other users can reach (pytest's own is private to root)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dk-deps-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="runs as root and as another user")


def readable_by_others(path):
    path = pathlib.Path(path).resolve()
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


@root_only
def test_as_root_without_sudo_apt_get_runs_directly(tmp_path):
    bin_dir, log = stand_ins(tmp_path, with_sudo=False)
    r = run_deps(bin_dir)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls and all(c.startswith("apt-get uid=0 ") for c in calls), calls
    assert any(" install " in c and "python3-ipython" in c for c in calls), calls


@root_only
def test_as_a_user_only_apt_get_goes_through_sudo(tmp_path):
    if not readable_by_others(DEPS):
        pytest.skip(f"{DEPS} is not readable by other users here")
    bin_dir, log = stand_ins(tmp_path, with_sudo=True)
    r = run_deps(bin_dir, user="nobody")
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls, r.stderr
    sudo = [c for c in calls if c.startswith("sudo ")]
    apt = [c for c in calls if c.startswith("apt-get ")]
    assert len(sudo) == 2 and all(c.split()[2] in ("apt-get", "env") for c in sudo), calls
    assert len(apt) == 2, calls


@root_only
def test_as_a_user_without_sudo_the_error_says_what_to_do(tmp_path):
    if not readable_by_others(DEPS):
        pytest.skip(f"{DEPS} is not readable by other users here")
    bin_dir, log = stand_ins(tmp_path, with_sudo=False)
    r = run_deps(bin_dir, user="nobody")
    assert r.returncode != 0
    assert "needs root" in r.stderr and "python3-ipython" in r.stderr, r.stderr
    assert log.read_text() == ""


def test_the_readme_commands_do_not_start_with_sudo():
    readme = (support.REPO_ROOT / "README.md").read_text()
    blocks = readme.split("## On a fresh Debian 12 machine", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in blocks.splitlines() if line.startswith("scripts/")]
    # the two commands for a fresh machine, and the contributors' quick mode
    assert commands == ["scripts/quickstart.sh", "scripts/test.sh", "scripts/test.sh --quick"], blocks
    assert "sudo scripts/" not in readme


# The README's first command leaves the kernel in the user's Jupyter: run as
# written, on the build the other tests use (BUILD and PREFIX, which
# scripts/build.sh reads; nothing to build), in a fresh home.
@pytest.mark.alone      # it reinstalls the prefix the other tests' kernels run from
@pytest.mark.timeout(600)
def test_the_quickstart_registers_the_kernel_for_the_user(tmp_path):
    import json
    build = support.PREFIX.parent
    if not (build / "build.ninja").exists():
        pytest.skip(f"{support.PREFIX} is not a build's prefix (no {build}/build.ninja)")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "XDG_DATA_HOME")}
    env.update(HOME=str(home), BUILD=str(build), PREFIX=str(support.PREFIX))
    r = subprocess.run([str(support.REPO_ROOT / "scripts" / "quickstart.sh")], env=env,
                       capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "distkernel: executed notebook:" in r.stdout, r.stdout[-3000:]
    assert "open a notebook on it: jupyter notebook, then New > distkernel" in r.stdout, \
        r.stdout[-1000:]
    listed = subprocess.run(["/usr/bin/jupyter", "kernelspec", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    spec = json.loads(listed.stdout)["kernelspecs"]["distkernel"]
    assert spec["resource_dir"] == str(home / ".local/share/jupyter/kernels/distkernel"), spec
    assert spec["spec"]["argv"][0] == str(support.PREFIX / "bin" / "distkernel"), spec

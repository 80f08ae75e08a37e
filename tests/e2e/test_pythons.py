"""One distkernel for every CPython from 3.10 on (runtime/python/dk_pyload.h).

The Pythons are this machine's own installations of another version than the
build's (pyenv's CPython 3.10 to 3.13: real, non-venv installations as a conda
env is), each as it is where it has IPython, a venv of each with the
kernel's needs from PyPI, and one venv made by uv (scripts/pythons.sh builds
them once per machine).
For each: `distkernel install --python` finds its libpython, and the kernel
and its ranks, fresh, warm and started, run on that Python with that
environment's site-packages. Then what cannot run: a Python older than 3.10
is refused, and a kernel whose environment changed after its install still
starts and says what happened in one line.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

import support

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="distkernel install is distkernel's")

DISTKERNEL = support.PREFIX / "bin" / "distkernel"
RUN = 120           # seconds a cell may take on a busy machine (a warm run builds the template)
BUILD = "%d.%d" % sys.version_info[:2]


def pythons(*args):
    """(version, base python, venv python) for each Python scripts/pythons.sh has
    (with --uv: the one venv it makes with uv)."""
    out = subprocess.run([str(support.REPO_ROOT / "scripts" / "pythons.sh"), *args],
                         check=True, capture_output=True, text=True, timeout=900).stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


PYTHONS = pythons()
UV_VENVS = pythons("--uv")


def has_ipython(python):
    return subprocess.run([python, "-c", "import IPython, cloudpickle"],
                          capture_output=True, timeout=60).returncode == 0


# Each venv, and each installation that has IPython: the environments a
# kernel is installed for.
ENVIRONMENTS = [pytest.param(venv, version, id=f"venv-{version}")
                for version, _, venv in PYTHONS] + \
               [pytest.param(venv, version, id=f"uv-venv-{version}")
                for version, _, venv in UV_VENVS] + \
               [pytest.param(base, version, id=f"installation-{version}")
                for version, base, _ in PYTHONS if has_ipython(base)]


class Specs:
    """Kernelspecs installed into a folder of the test's, and kernels from there."""

    def __init__(self, root):
        self.prefix = root / "jupyter"
        self.kernels = self.prefix / "share" / "jupyter" / "kernels"
        self.ksm = KernelSpecManager(kernel_dirs=[str(self.kernels)])

    def install(self, name, python, check=True):
        r = subprocess.run([str(DISTKERNEL), "install", "--prefix", str(self.prefix), "--name",
                            name, "--python", str(python)], capture_output=True, text=True,
                           timeout=120)
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def start(self, name, stderr=None, **env):
        km = KernelManager(kernel_name=name, kernel_spec_manager=self.ksm)
        launch = {"env": support.kernel_env(**env)}
        if stderr is not None:
            launch["stderr"] = stderr
        return support.Kernel.launch(km, ready_timeout=60, **launch)


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return Specs(tmp_path_factory.mktemp("pythons"))


def ranks_of(r, n=2):
    """Each rank's JSON line, {rank: value}."""
    assert r.status == "ok", r.describe()
    ranks = {int(m.group(1)): json.loads(m.group(2))
             for m in re.finditer(r"^\[rank (\d+)\] (\{.*\})$", r.stdout, re.M)}
    assert sorted(ranks) == list(range(n)), r.describe()
    return ranks


# A module the warm template imports and a cold rank never would: in a rank's
# sys.modules before its cell runs only when the rank was forked from it.
WARM_MODULE = "email.mime.text"
RANK_CELL = """{magic}
import json, sys
WARM = {warm!r} in sys.modules
print(json.dumps({{'version': '%d.%d.%d' % sys.version_info[:3], 'prefix': sys.prefix,
                  'executable': sys.executable, 'warm': WARM}}))
"""


def rank_cell(magic):
    return RANK_CELL.format(magic=magic, warm=WARM_MODULE)


@pytest.mark.skipif(not PYTHONS, reason="no CPython 3.10 or later beside the build's here")
@pytest.mark.parametrize("python,version", ENVIRONMENTS)
def test_a_kernel_and_its_ranks_run_on_the_environments_own_python(specs, python, version):
    name = "env-" + re.sub(r"[^a-z0-9]", "-", python.lower())[-40:]
    r = specs.install(name, python)
    minor = version.rsplit(".", 1)[0]
    assert f"Found Python {minor}" in r.stdout, r.stdout
    lib = json.loads((specs.kernels / name / "kernel.json").read_text())["argv"][4]
    assert f"libpython{minor}.so" in lib, lib
    assert f"The kernel will load {lib}" in r.stdout, r.stdout
    k = specs.start(name, DISTKERNEL_WARM_MODULES=WARM_MODULE)
    try:
        info = support.json_value(k, "{'version': '%d.%d.%d' % __import__('sys').version_info[:3],"
                                     " 'prefix': __import__('sys').prefix,"
                                     " 'executable': __import__('sys').executable,"
                                     " 'ipython': __import__('IPython').__file__}")
        prefix = str(pathlib.Path(python).parent.parent)
        assert info["version"] == version, info
        assert info["executable"] == python, info
        assert info["prefix"] == prefix and info["ipython"].startswith(prefix), info
        # the kernel says which Python it is to the frontend
        assert k.kc.kernel_info(reply=True)["content"]["language_info"]["version"] == version

        r = k.execute("x = sum(range(10))\nx", timeout=RUN)
        assert r.status == "ok" and r.result == "45", r.describe()
        want = {"version": version, "prefix": prefix, "executable": python}

        fresh = ranks_of(k.execute(rank_cell("%%distributed num_processes=2 tracking=False "
                                             "warm=False"), timeout=RUN))
        warm = ranks_of(k.execute(rank_cell("%%distributed num_processes=2 tracking=False"),
                                  timeout=RUN))
        # (the sanitizer pass starts every rank cold: DISTKERNEL_WARM=0, conftest.py)
        warm_runs = os.environ.get("DISTKERNEL_WARM") != "0"
        for ranks, was_warm in ((fresh, False), (warm, warm_runs)):
            for rank, got in ranks.items():
                assert {key: got[key] for key in want} == want, (rank, got)
                assert got["warm"] is was_warm, (rank, got)

        r = k.execute("%distributed start num_processes=2 tracking=False", timeout=RUN)
        assert r.status == "ok", r.describe()
        try:
            started = ranks_of(k.execute(rank_cell("%%distributed"), timeout=RUN))
            for rank, got in started.items():
                assert {key: got[key] for key in want} == want, (rank, got)
        finally:
            k.execute("%distributed stop", timeout=RUN)
    finally:
        k.stop()


@pytest.mark.skipif(not [p for p in PYTHONS if not p[0].startswith(BUILD + ".")],
                    reason="no CPython beside the build's version here")
def test_a_slurm_cell_of_two_nodes_by_two_ranks_runs_on_another_version(specs, slurm_cluster,
                                                                       tmp_path):
    version, _, python = next(p for p in PYTHONS if not p[0].startswith(BUILD + "."))
    specs.install("slurm-other", python)
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    env = slurm_cluster.kernel_env(logs)
    km = KernelManager(kernel_name="slurm-other", kernel_spec_manager=specs.ksm)
    k = support.Kernel.launch(km, ready_timeout=60, env=env)
    try:
        cell = rank_cell("%%distributed num_processes=4 nodes=2 tracking=False").replace(
            "'warm': WARM", "'warm': WARM, 'node': __import__('socket').gethostname()")
        ranks = ranks_of(k.execute(cell, timeout=RUN), n=4)
        assert sorted(got["node"] for got in ranks.values()) == ["node1"] * 2 + ["node2"] * 2
        for rank, got in ranks.items():
            assert got["version"] == version and got["executable"] == python, (rank, got)
    finally:
        k.stop()


# -- what cannot run ------------------------------------------------------------------


def test_a_python_older_than_3_10_is_refused_before_anything_is_written(specs):
    old = sorted(pathlib.Path.home().glob(".pyenv/versions/3.[0-9].*/bin/python3"))
    if not old:
        pytest.skip("no CPython older than 3.10 here")
    r = specs.install("too-old", old[-1], check=False)
    assert r.returncode != 0, r.stdout
    assert re.search(r"is Python 3\.\d, older than the oldest distkernel runs on \(3\.10\)",
                     r.stderr), r.stderr
    assert not (specs.kernels / "too-old").exists()


def make_env(path, base, version):
    """A venv of BASE at PATH with the kernel's needs from scripts/pythons.sh's wheels."""
    subprocess.run([base, "-m", "venv", "--clear", str(path)], check=True, timeout=120)
    lock = "lock-3.10.txt" if version.startswith("3.10.") else "lock.txt"
    wheels = pathlib.Path.home() / ".cache" / "distkernel" / "wheels"
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", "--no-index", "--no-deps", "--find-links",
                    str(wheels), "-r", str(support.REPO_ROOT / "tests" / "pythons" / lock)],
                   check=True, timeout=300)
    return path / "bin" / "python"


def unusable(specs, name, tmp_path):
    """Start the kernel NAME; return (its one line, an execute's error content)."""
    log = open(tmp_path / f"{name}.log", "w+")
    k = specs.start(name, stderr=log)
    try:
        info = k.kc.kernel_info(reply=True, timeout=30)["content"]
        assert info["status"] == "ok" and info["language_info"]["name"] == "python", info
        r = k.execute("1 + 1", timeout=30)
        assert r.status == "error", r.describe()
        assert r.content["ename"] == "KernelEnvironmentError", r.describe()
        errors = [m for m in r.messages if m["msg_type"] == "error"]
        assert len(errors) == 1, r.describe()   # the notebook shows it in the cell
        # every other request is answered, with the same line
        assert k.kc.complete("pri", reply=True, timeout=30)["content"]["status"] == "error"
        # and the kernel still serves: again, then a shutdown
        assert k.execute("2", timeout=30).content["evalue"] == r.content["evalue"]
    finally:
        k.stop()
    log.seek(0)
    lines = [line for line in log.read().splitlines() if line.strip()]
    assert any(r.content["evalue"] in line for line in lines), lines
    assert "Traceback" not in "\n".join(lines), lines
    # jupyter kernelspec list still lists it
    assert name in specs.ksm.find_kernel_specs()
    return r.content["evalue"]


@pytest.mark.skipif(not PYTHONS, reason="no CPython 3.10 or later beside the build's here")
def test_a_kernel_whose_environment_lost_ipython_or_was_deleted_says_so(specs, tmp_path):
    version, base, _ = PYTHONS[-1]
    python = make_env(tmp_path / "changing", base, version)
    specs.install("changing", python)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "ipython"], check=True,
                   timeout=120)
    line = unusable(specs, "changing", tmp_path)
    assert f"this kernel's environment {python} lacks IPython" in line, line
    assert f"{python} -m pip install ipython" in line, line

    shutil.rmtree(tmp_path / "changing")
    line = unusable(specs, "changing", tmp_path)
    assert f"the kernel's Python environment is gone: {python}" in line, line
    assert "distkernel install --python" in line, line


@pytest.mark.skipif(len({p[0].rsplit(".", 1)[0] for p in PYTHONS}) < 2,
                    reason="fewer than two CPython versions here")
def test_a_kernel_whose_environment_moved_to_another_version_runs_on_it(specs, tmp_path):
    (old_v, old_base, _), (new_v, new_base, _) = PYTHONS[0], PYTHONS[-1]
    python = make_env(tmp_path / "upgraded", old_base, old_v)
    specs.install("upgraded", python)
    # made again at the same path from another version, as `conda install
    # python=3.13` or a `uv venv` again would
    shutil.rmtree(tmp_path / "upgraded")
    make_env(tmp_path / "upgraded", new_base, new_v)
    log = open(tmp_path / "upgraded.log", "w+")
    k = specs.start("upgraded", stderr=log)
    try:
        got = support.json_value(k, "'%d.%d.%d' % __import__('sys').version_info[:3]")
        assert got == new_v
    finally:
        k.stop()
    log.seek(0)
    text = log.read()
    new_minor = new_v.rsplit(".", 1)[0]
    assert re.search(rf"the environment of {re.escape(str(python))} changed since the kernel "
                     rf"was installed: it is Python {re.escape(new_minor)} now", text), text
    assert f"distkernel install --python {python}" in text, text


@pytest.mark.skipif(not PYTHONS, reason="no CPython 3.10 or later beside the build's here")
def test_a_kernelspec_that_names_no_library_runs_on_the_environments_own(specs):
    """kernel.json as distkernel install wrote it before --libpython: the
    kernel finds the library beside the environment's installation."""
    version, _, python = PYTHONS[0]
    specs.install("no-library", python)
    path = specs.kernels / "no-library" / "kernel.json"
    spec = json.loads(path.read_text())
    at = spec["argv"].index("--libpython")
    del spec["argv"][at:at + 2]
    path.write_text(json.dumps(spec))
    k = specs.start("no-library")
    try:
        assert support.json_value(k, "'%d.%d.%d' % __import__('sys').version_info[:3]") == version
    finally:
        k.stop()

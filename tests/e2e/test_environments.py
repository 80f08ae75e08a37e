"""A kernel per Python environment: `distkernel install --python ENV/bin/python`
(app/dk_install.h) writes a kernelspec whose kernel, and every rank it starts,
runs in that environment (runtime/python/dk_pyload.h). test_pythons.py does the
same for other CPython versions than the build's.

The environments are venvs of Debian's Python made with --system-site-packages
(so IPython, cloudpickle and torch still come from dist-packages, as in a real
venv), each holding a module of its own, `dkenv_mod`, that nothing else has:
importing it is the proof that the venv's site-packages are on sys.path. They
are installed with --prefix into a folder of the test's, and kernels are
started from there through a KernelSpecManager that looks only there.
"""
import json
import os
import re
import subprocess
import sys

import psutil
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

import support
from slurm_cluster import cluster_sh

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="distkernel install is distkernel's")

DISTKERNEL = support.PREFIX / "bin" / "distkernel"
RUN = 120           # seconds a cell may take on a busy machine (a warm run builds the template)


def make_venv(path, who, system_site_packages=True):
    """A venv of Debian's Python at PATH holding the module dkenv_mod (WHO = WHO)."""
    args = [support.PYTHON, "-m", "venv", "--without-pip"]
    if system_site_packages:
        args.append("--system-site-packages")
    subprocess.run(args + [str(path)], check=True, timeout=60)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "dkenv_mod.py").write_text(f"WHO = {who!r}\n")
    return path / "bin" / "python"


def install(*args, env=None):
    return subprocess.run([str(DISTKERNEL), "install", *args], capture_output=True, text=True,
                          timeout=90, env=env)


class Envs:
    def __init__(self, root):
        self.root = root
        self.prefix = root / "jupyter-prefix"
        self.kernels = self.prefix / "share" / "jupyter" / "kernels"
        self.ksm = KernelSpecManager(kernel_dirs=[str(self.kernels)])

    def start(self, name, **env):
        km = KernelManager(kernel_name=name, kernel_spec_manager=self.ksm)
        return support.Kernel.launch(km, env=support.kernel_env(**env))


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """Two venvs, v1 and v2, installed as the kernels env-one and env-two."""
    e = Envs(tmp_path_factory.mktemp("environments"))
    e.v1 = make_venv(e.root / "v1", "v1")
    e.v2 = make_venv(e.root / "v2", "v2")
    for name, python in (("env-one", e.v1), ("env-two", e.v2)):
        r = install("--prefix", str(e.prefix), "--name", name, "--python", str(python))
        assert r.returncode == 0, r.stderr
        assert f"Installed kernelspec {name} in {e.kernels / name}" in r.stdout, r.stdout
    return e


@pytest.fixture(scope="module")
def kernel_v1(envs):
    # The template imports the venv's own module too: a template that did not
    # start in the venv fails to import it, and the run would go cold.
    k = envs.start("env-one", DISTKERNEL_WARM_MODULES="dkenv_mod")
    yield k
    k.stop()


def where(kernel, cell, timeout=RUN):
    """Each rank's {'prefix', 'who', ...} as the cell's ranks report it."""
    r = kernel.execute(cell, timeout=timeout)
    assert r.status == "ok", r.describe()
    ranks = {int(m.group(1)): json.loads(m.group(2))
             for m in re.finditer(r"^\[rank (\d+)\] (\{.*\})$", r.stdout, re.M)}
    assert sorted(ranks) == [0, 1], r.describe()
    return ranks


FRESH = "%%distributed num_processes=2 tracking=False warm=False"
WARM_RUN = "%%distributed num_processes=2 tracking=False"
RANK_CELL = """{magic}
import json, os, sys
WARM = 'dkenv_mod' in sys.modules
import dkenv_mod
print(json.dumps({'prefix': sys.prefix, 'executable': sys.executable, 'who': dkenv_mod.WHO,
                  'warm': WARM, 'ppid': os.getppid(),
                  'path0': os.environ['PATH'].split(os.pathsep)[0]}))
"""


def cell(magic):
    return RANK_CELL.replace("{magic}", magic)


def assert_in_venv(ranks, venv, who):
    for rank, info in ranks.items():
        assert info["prefix"] == str(venv), (rank, info)
        assert info["executable"] == str(venv / "bin" / "python"), (rank, info)
        assert info["who"] == who, (rank, info)
        assert info["path0"] == str(venv / "bin"), (rank, info)


def test_install_writes_a_kernelspec_that_runs_this_kernel_in_the_venv(envs):
    d = envs.kernels / "env-one"
    spec = json.loads((d / "kernel.json").read_text())
    assert spec["argv"] == [str(DISTKERNEL.resolve()), "--python", str(envs.v1), "--libpython",
                            support.LIBPYTHON, "-f", "{connection_file}"]
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert spec["display_name"] == f"Python {version} (env-one)"
    assert spec["language"] == "python"
    assert spec["interrupt_mode"] == "message"
    # debugpy is there (Debian's, through --system-site-packages): JupyterLab 4
    # offers its debugger only for a kernelspec that says so
    assert spec["metadata"] == {"debugger": True}
    for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
        assert (d / logo).is_file(), logo


def test_the_kernel_runs_in_the_venv_and_still_sees_the_system_site_packages(envs, kernel_v1):
    venv = envs.v1.parent.parent
    got = support.json_value(kernel_v1, """{
        'prefix': __import__('sys').prefix,
        'executable': __import__('sys').executable,
        'who': __import__('dkenv_mod').WHO,
        'ipython': __import__('IPython').__file__,
        'path0': __import__('os').environ['PATH'].split(':')[0],
        'shell_python': __import__('subprocess').run(
            ['python', '-c', 'import sys; print(sys.prefix)'],
            capture_output=True, text=True).stdout.strip()}""")
    assert got["prefix"] == str(venv)
    assert got["executable"] == str(envs.v1)
    assert got["who"] == "v1"
    assert got["ipython"].startswith("/usr/lib/python3/dist-packages/"), got
    # `!pip`, `!python` and subprocesses find the venv's programs first.
    assert got["path0"] == str(venv / "bin")
    assert got["shell_python"] == str(venv)


def test_a_fresh_rank_runs_in_the_venv(envs, kernel_v1):
    ranks = where(kernel_v1, cell(FRESH))
    assert_in_venv(ranks, envs.v1.parent.parent, "v1")


def test_a_warm_rank_comes_from_a_template_that_runs_in_the_venv(envs, kernel_v1):
    ranks = where(kernel_v1, cell(WARM_RUN))
    assert_in_venv(ranks, envs.v1.parent.parent, "v1")
    templates = [p.pid for p in psutil.Process(kernel_v1.pid).children()
                 if "DISTKERNEL_TEMPLATE" in p.environ()]
    assert len(templates) == 1, templates
    for rank, info in ranks.items():
        assert info["warm"] and info["ppid"] == templates[0], (rank, info, templates)


def test_a_template_of_another_environment_is_not_reused(envs, kernel_v1):
    # The ranks' interpreter is the one DISTKERNEL_PYTHON names; pointed at
    # v2, the next warm run must come from a new template that runs as v2's
    # python. (Their imports still put the kernel's sys.path, v1's, first, as
    # every rank's do: a kernel's ranks never run in another environment than
    # the kernel's outside this test.)
    def templates():
        return [p.pid for p in psutil.Process(kernel_v1.pid).children()
                if "DISTKERNEL_TEMPLATE" in p.environ()]
    where(kernel_v1, cell(WARM_RUN))
    before = templates()
    r = kernel_v1.execute(f"import os; os.environ['DISTKERNEL_PYTHON'] = {str(envs.v2)!r}")
    assert r.status == "ok", r.describe()
    try:
        ranks = where(kernel_v1, cell(WARM_RUN))
    finally:
        kernel_v1.execute(f"os.environ['DISTKERNEL_PYTHON'] = {str(envs.v1)!r}")
    after = templates()
    assert len(after) == 1 and after != before, (before, after)
    for rank, info in ranks.items():
        assert info["prefix"] == str(envs.v2.parent.parent), info
        assert info["executable"] == str(envs.v2), info
        assert info["warm"] and info["ppid"] == after[0], (rank, info, after)


def test_started_ranks_run_in_the_venv(envs, kernel_v1):
    r = kernel_v1.execute("%distributed start num_processes=2 tracking=False", timeout=RUN)
    assert r.status == "ok", r.describe()
    try:
        ranks = where(kernel_v1, cell("%%distributed"))
    finally:
        kernel_v1.execute("%distributed stop", timeout=RUN)
    assert_in_venv(ranks, envs.v1.parent.parent, "v1")


def test_a_second_venv_runs_side_by_side_under_its_own_name(envs, kernel_v1):
    k2 = envs.start("env-two")
    try:
        ranks = where(k2, cell(FRESH))
        assert_in_venv(ranks, envs.v2.parent.parent, "v2")
        assert support.json_value(k2, "__import__('dkenv_mod').WHO") == "v2"
        assert support.json_value(kernel_v1, "__import__('dkenv_mod').WHO") == "v1"
    finally:
        k2.stop()


def test_jupyter_kernelspec_list_shows_it_and_remove_removes_it(envs):
    r = install("--prefix", str(envs.prefix), "--name", "Doomed", "--display-name", "Doomed env",
                "--python", str(envs.v1), "--env", "DK_ENV_TEST", "1")
    assert r.returncode == 0, r.stderr
    doomed = envs.kernels / "doomed"          # lower-cased, as jupyter_client does
    assert json.loads((doomed / "kernel.json").read_text())["env"] == {"DK_ENV_TEST": "1"}
    env = dict(os.environ, JUPYTER_PATH=str(envs.prefix / "share" / "jupyter"))
    jks = [support.PYTHON, "-m", "jupyter_client.kernelspecapp"]
    out = subprocess.run(jks + ["list", "--json"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    specs = json.loads(out.stdout)["kernelspecs"]
    for name in ("env-one", "env-two", "doomed"):
        assert specs[name]["resource_dir"] == str(envs.kernels / name), specs
    assert specs["doomed"]["spec"]["display_name"] == "Doomed env"
    out = subprocess.run(jks + ["remove", "-f", "doomed"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert not doomed.exists()
    assert (envs.kernels / "env-one").is_dir()


# -- refusals: exit non-zero, say what to do, write nothing -------------------------


def refused(envs, python, name):
    r = install("--prefix", str(envs.prefix), "--name", name, "--python", str(python))
    assert r.returncode != 0, r.stdout
    assert not (envs.kernels / name).exists()
    assert not [p for p in envs.kernels.iterdir() if p.name.startswith(".")], "a leftover"
    return r.stderr


def fake_python(path, version, implementation="cpython", libpython="/b/lib/libpython.so",
                freethreaded="no"):
    """A program that answers distkernel's probe as a Python would that cannot
    run a kernel: a fault injected where this machine has no such Python (a
    static build, a free-threaded one, PyPy). test_install.c checks the probe's
    parsing against real output; test_pythons.py runs the real ones."""
    path.write_text("#!/bin/sh\n"
                    "echo 'distkernel-probe 1'\n"
                    f"echo 'version {version}'\n"
                    "echo 'soabi cpython-x'\n"
                    f"echo 'prefix {path.parent}'\n"
                    f"echo 'implementation {implementation}'\n"
                    "echo 'kind installation'\n"
                    f"echo 'base {path.parent}'\n"
                    f"echo 'freethreaded {freethreaded}'\n"
                    f"echo 'libpython {libpython}'\n"
                    "echo 'missing '\n")
    path.chmod(0o755)
    return path


def test_a_static_build_is_refused_saying_how_to_get_a_shared_one(envs):
    py = fake_python(envs.root / "python3.12", "3.12", libpython="")
    err = refused(envs, py, "static")
    assert f"{py} is Python 3.12 built without a shared libpython" in err, err
    assert "--enable-shared" in err, err


def test_a_free_threaded_build_and_pypy_are_refused(envs):
    err = refused(envs, fake_python(envs.root / "python3.13t", "3.13", freethreaded="yes"), "ft")
    assert "free-threaded Python 3.13" in err and "not python3.13t" in err, err
    err = refused(envs, fake_python(envs.root / "pypy3", "3.10", implementation="pypy"), "pypy")
    assert "is pypy 3.10, not CPython" in err, err


def test_a_program_that_is_not_a_python_is_refused(envs):
    script = envs.root / "not-python"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    assert f"{script} is not a Python" in refused(envs, script, "not-python")
    assert f"{envs.root / 'nowhere'} is not a Python" in refused(envs, envs.root / "nowhere",
                                                                 "nowhere")


def test_an_environment_without_ipython_or_cloudpickle_is_refused_listing_them(envs):
    bare = make_venv(envs.root / "bare", "bare", system_site_packages=False)
    err = refused(envs, bare, "bare")
    assert "lacks what the kernel needs: IPython cloudpickle" in err, err
    assert "pip install ipython cloudpickle" in err and "--system-site-packages" in err, err


# -- Slurm: ranks on the simulated cluster's nodes (tests/e2e/slurm_cluster.py) ------
#
# The simulated nodes share this host's filesystem (each is a mount namespace
# that is a slave of the host's), so the venv under the test's folder is at the
# same path on them, as on a cluster whose home folders are shared. To take it
# away from one node, a tmpfs is mounted over the venv inside that node's mount
# namespace only.

SLURM_CELL = cell("%%distributed num_processes=2 nodes=2 tracking=False").replace(
    "import json, os, sys", "import json, os, sys, socket\nprint('node', socket.gethostname())")


@pytest.fixture(scope="module")
def slurm_kernel_v1(envs, slurm_cluster, tmp_path_factory):
    logs = tmp_path_factory.mktemp("slurm-logs")
    logs.chmod(0o700)
    env = slurm_cluster.kernel_env(logs)
    km = KernelManager(kernel_name="env-one", kernel_spec_manager=envs.ksm)
    k = support.Kernel.launch(km, env=env)
    yield k
    k.stop()


def test_a_slurm_rank_runs_in_the_venv_on_its_node(envs, slurm_kernel_v1):
    r = slurm_kernel_v1.execute(SLURM_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "node node1" in r.stdout and "node node2" in r.stdout, r.describe()
    ranks = {int(m.group(1)): json.loads(m.group(2))
             for m in re.finditer(r"^\[rank (\d+)\] (\{.*\})$", r.stdout, re.M)}
    assert sorted(ranks) == [0, 1], r.describe()
    assert_in_venv(ranks, envs.v1.parent.parent, "v1")


def test_a_slurm_node_without_the_environment_is_named_with_the_path(envs, slurm_cluster,
                                                                     slurm_kernel_v1):
    venv = envs.v1.parent.parent
    cluster_sh("exec", "node2", "mount", "-t", "tmpfs", "tmpfs", str(venv),
               env=slurm_cluster.sh_env)
    try:
        r = slurm_kernel_v1.execute(SLURM_CELL, timeout=RUN)
    finally:
        cluster_sh("exec", "node2", "umount", str(venv), env=slurm_cluster.sh_env)
    # The rank on node2 says why in the cell, before Python would have failed
    # obscurely (no encodings module); the run ends as a failed start.
    assert r.status == "error", r.describe()
    assert f"[rank 1] distkernel-rank: the kernel's Python environment is not on node node2: " \
           f"{envs.v1}: No such file or directory" in r.stderr, r.describe()
    assert "rank 1: exited with code 1 during start-up" in r.content["evalue"], r.describe()

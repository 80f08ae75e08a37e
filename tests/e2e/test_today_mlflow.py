"""A real MLflow 3 server, as a user of today's stack meets it (issue 34, item 4):
the kernel installed for the test venv (scripts/venv.sh: MLflow, IPython 9 and
torch 2 from PyPI), with `mlflow` in its environment and no
MLFLOW_TRACKING_URI, starts `mlflow server` itself; the ranks of a cell log
metrics with `mlflow.log_metric` into the run the kernel made for the cell,
which ends FINISHED, or FAILED when a rank fails. tests/mlflow_server.py's
stand-in stays for injecting faults (test_mlflow.py); what MLflow itself
records is checked here against MLflow.

Skipped where the venv is not built (scripts/test.sh builds it and passes its
path in DISTKERNEL_TEST_VENV), and in the sanitizer pass: the C paths it takes
are test_mlflow.py's.
"""
import json
import os
import re
import subprocess
import urllib.request

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

import support

VENV = os.environ.get("DISTKERNEL_TEST_VENV", "")

pytestmark = [
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="%%distributed is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]

# The kernel's first run starts the server (MLflow 3 takes 10-30 s to answer
# on 2 busy cores) and each rank imports mlflow.
RUN = 240
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LINK = re.compile(r"(http://127\.0\.0\.1:\d+)/#/experiments/(\d+)/runs/([0-9a-f]{32})")

LOGGING_CELL = """%%distributed num_processes=2
import os, mlflow
rank = int(os.environ["RANK"])
for step in range(3):
    mlflow.log_metric(f"loss_rank{rank}", 1.0 / (1 + step + rank), step=step)
rank
"""
# Each rank's mlflow has the run active (log_metric started it) and ends it
# FINISHED at its exit (atexit, as MLflow does): the kernel's own final
# status, written after every rank exited, must be the one that stays.
FAILING_CELL = """%%distributed num_processes=2
import os, mlflow
mlflow.log_metric("before_failing", 1.0)
if os.environ["RANK"] == "1":
    raise ValueError("rank 1 fails on purpose")
"""
SLEEPING_CELL = """%%distributed num_processes=2{opts}
import os, time, mlflow
mlflow.log_metric("started", 1.0)
print(f"READY pid={{os.getpid()}} run={{os.environ['TORCHELASTIC_RUN_ID']}}", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def today(tmp_path_factory):
    """The kernelspec `distkernel install --python VENV/bin/python` writes, as a user runs it."""
    prefix = tmp_path_factory.mktemp("today-kernels")
    subprocess.run([str(support.PREFIX / "bin" / "distkernel"), "install", "--prefix",
                    str(prefix), "--name", "distkernel-today", "--python",
                    f"{VENV}/bin/python"], check=True, capture_output=True, timeout=120)
    return KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])


@pytest.fixture(scope="module")
def kernel(today, tmp_path_factory):
    """One kernel for the module: the MLflow server it starts at its first run
    (10-30 s) serves every test's runs, as it serves a notebook's."""
    root = tmp_path_factory.mktemp("today-mlflow")
    notebook = root / "notebook"          # the store, mlflow.db, goes beside the notebook
    notebook.mkdir(mode=0o700)
    km = KernelManager(kernel_name="distkernel-today", kernel_spec_manager=today)
    k = support.Kernel.launch(km, env=support.kernel_env(DISTKERNEL_LOG_DIR=root / "logs"),
                              cwd=str(notebook))
    yield k
    k.stop()


def all_text(r):
    """Everything the cell showed, streams and displays, as one text."""
    parts = [r.stdout, r.stderr]
    for m in r.of_type("display_data") + r.of_type("update_display_data"):
        parts.append(m["content"]["data"].get("text/plain", ""))
    return "\n".join(parts)


def get(server, endpoint, **query):
    q = "&".join(f"{k}={v}" for k, v in query.items())
    with NO_PROXY.open(f"{server}/api/2.0/mlflow/{endpoint}?{q}", timeout=30) as resp:
        return json.loads(resp.read())


def the_run(r):
    """(server, run) of the MLflow run the cell links to, as MLflow has it."""
    found = LINK.findall(all_text(r))
    assert found, f"no MLflow link in the cell:\n{r.describe()}"
    server, _, run_id = found[-1]
    return server, get(server, "runs/get", run_id=run_id)["run"]


def test_ranks_log_into_the_run_the_kernel_made_on_the_server_it_started(kernel):
    r = kernel.execute(LOGGING_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    server, run = the_run(r)
    assert run["info"]["status"] == "FINISHED", run["info"]
    # every rank's metric, every step, in the one run
    for rank in (0, 1):
        history = get(server, "metrics/get-history", run_id=run["info"]["run_id"],
                      metric_key=f"loss_rank{rank}")["metrics"]
        assert sorted(m["step"] for m in history) == [0, 1, 2], history
    params = {p["key"]: p["value"] for p in run["data"].get("params", [])}
    assert params.get("world_size") == "2" and params.get("num_processes") == "2", params
    # The link is said once by the kernel; MLflow 3's own "View run ... at"
    # lines (two a rank at every run's end) are not in the cell.
    text = all_text(r)
    assert "View run" not in text and "View experiment" not in text, r.describe()
    # a second cell is a second run on the same server
    r2 = kernel.execute(LOGGING_CELL, timeout=RUN)
    assert r2.status == "ok", r2.describe()
    server2, run2 = the_run(r2)
    assert server2 == server and run2["info"]["run_id"] != run["info"]["run_id"]


def test_a_failing_rank_ends_the_run_failed(kernel):
    r = kernel.execute(FAILING_CELL, timeout=RUN)
    assert r.status == "error", r.describe()
    _, run = the_run(r)
    assert run["info"]["status"] == "FAILED", run["info"]


def test_a_run_active_in_the_notebook_is_the_cells_runs_parent(kernel):
    """The notebook's own mlflow (MLflow 3's default store is mlflow.db in the
    notebook's folder, the store of the server the kernel starts) has a run
    open: the cell's run is its child, and the parent is the same run on the
    server."""
    r = kernel.execute("import mlflow\n_parent = mlflow.start_run(run_name='notebook')\n"
                       "print('parent', _parent.info.run_id)\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    parent = re.search(r"parent ([0-9a-f]{32})", r.stdout).group(1)
    r = kernel.execute(LOGGING_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    server, run = the_run(r)
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    assert tags.get("mlflow.parentRunId") == parent, tags
    assert get(server, "runs/get", run_id=parent)["run"]["info"]["run_name"] == "notebook"
    kernel.execute("mlflow.end_run()")


def test_an_interrupt_ends_the_run_killed(kernel):
    msg_id = kernel.start_execute(SLEEPING_CELL.format(opts=""))
    support.wait_announced(kernel, msg_id, timeout=RUN)
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=60)
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
    _, run = the_run(r)
    assert run["info"]["status"] == "KILLED", run["info"]


def test_a_timeout_ends_the_run_killed(kernel):
    r = kernel.execute(SLEEPING_CELL.format(opts=" timeout=8"), timeout=RUN)
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    _, run = the_run(r)
    assert run["info"]["status"] == "KILLED", run["info"]

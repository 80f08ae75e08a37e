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
# On CI the server starts beside the other suites' kernels, ranks, Ray and
# torch: MLflow 3 then takes over a minute to answer, and its first lookups
# over 2 s. The kernel's defaults are for a user's machine.
SLOW_MACHINE = {"DISTKERNEL_MLFLOW_START_TIMEOUT": "300", "DISTKERNEL_MLFLOW_TIMEOUT": "15"}
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LINK = re.compile(r"(http://127\.0\.0\.1:\d+)/#/experiments/(\d+)/runs/([0-9a-f]{32})")

LOGGING_CELL = """%%distributed num_processes=2
import os, mlflow
rank = int(os.environ["RANK"])
print(f"LOG LINE of rank {rank}", flush=True)
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
    k = support.Kernel.launch(km, env=support.kernel_env(DISTKERNEL_LOG_DIR=root / "logs",
                                                         **SLOW_MACHINE),
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


def artifact(server, run_id, path):
    """The bytes of the run's artifact PATH, as MLflow's UI fetches them."""
    with NO_PROXY.open(f"{server}/get-artifact?path={path}&run_uuid={run_id}",
                       timeout=60) as resp:
        return resp.read()


def artifacts(server, run_id, path=""):
    """The run's artifacts under PATH: {path: size}."""
    listed = get(server, "artifacts/list", run_id=run_id, path=path).get("files", [])
    return {f["path"]: f.get("file_size") for f in listed}


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
    # every rank's log went with the run, each a file of its own at this size;
    # no stacks.txt for a run that finished
    run_id = run["info"]["run_id"]
    assert set(artifacts(server, run_id, "logs")) == {"logs/rank-0.log", "logs/rank-1.log"}
    assert "stacks.txt" not in artifacts(server, run_id)
    for rank in (0, 1):
        assert f"LOG LINE of rank {rank}" in artifact(server, run_id,
                                                      f"logs/rank-{rank}.log").decode()
    # The link is said once by the kernel; MLflow 3's own "View run ... at"
    # lines (two a rank at every run's end) are not in the cell.
    text = all_text(r)
    assert "View run" not in text and "View experiment" not in text, r.describe()
    # a second cell is a second run on the same server
    r2 = kernel.execute(LOGGING_CELL, timeout=RUN)
    assert r2.status == "ok", r2.describe()
    server2, run2 = the_run(r2)
    assert server2 == server and run2["info"]["run_id"] != run["info"]["run_id"]


def test_a_failing_rank_ends_the_run_failed_with_its_error(kernel):
    r = kernel.execute(FAILING_CELL, timeout=RUN)
    assert r.status == "error", r.describe()
    server, run = the_run(r)
    assert run["info"]["status"] == "FAILED", run["info"]
    # The error the cell showed goes with the run, uncoloured.
    error = artifact(server, run["info"]["run_id"], "error.txt").decode()
    assert "ValueError: rank 1 fails on purpose" in error and "\033" not in error, error
    assert "rank 1: raised ValueError" in error, error


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
    server, run = the_run(r)
    assert run["info"]["status"] == "KILLED", run["info"]
    # where the ranks were goes with the run that did not finish
    stacks = artifact(server, run["info"]["run_id"], "stacks.txt").decode()
    assert "time.sleep" in stacks or "cell line 5" in stacks, stacks[:2000]


def test_a_timeout_ends_the_run_killed(kernel):
    r = kernel.execute(SLEEPING_CELL.format(opts=" timeout=8"), timeout=RUN)
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    _, run = the_run(r)
    assert run["info"]["status"] == "KILLED", run["info"]


# 12 ranks, rank 7 failing: above 8 ranks the logs go as one archive and a
# listing, with rank 0's and the root cause's logs as files of their own.
MANY_CELL = """%%distributed num_processes=12
import os
rank = int(os.environ["RANK"])
print(f"LOG LINE of rank {rank}", flush=True)
if rank == 7:
    raise RuntimeError("rank 7 fails on purpose")
"""


def test_above_eight_ranks_the_logs_go_as_one_archive_and_a_listing(kernel, tmp_path):
    import tarfile

    r = kernel.execute(MANY_CELL, timeout=RUN)
    assert r.status == "error", r.describe()
    server, run = the_run(r)
    run_id = run["info"]["run_id"]
    assert set(artifacts(server, run_id, "logs")) == {
        "logs/rank-0.log", "logs/rank-7.log", "logs/index.txt", "logs/ranks.tar.gz"}
    assert "LOG LINE of rank 7" in artifact(server, run_id, "logs/rank-7.log").decode()
    index = artifact(server, run_id, "logs/index.txt").decode().splitlines()
    lines = [line for line in index if line.startswith("rank ")]
    assert len(lines) == 12, index
    assert "failed (root cause)" in lines[7] and "whole" in lines[7], lines[7]
    archive = tmp_path / "ranks.tar.gz"
    archive.write_bytes(artifact(server, run_id, "logs/ranks.tar.gz"))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert {f"rank-{i}.log" for i in range(12)} <= set(names), names
        # ranks 0-6 finished before rank 7 failed; 8-11 were ended, maybe before a word
        assert b"LOG LINE of rank 6" in tar.extractfile("rank-6.log").read()


# restarts=1, rank 1 failing in the first attempt only.
RESTARTED_CELL = """%%distributed num_processes=2 restarts=1
import os
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"LOG LINE of rank {os.environ['RANK']} in attempt {attempt}", flush=True)
if os.environ["RANK"] == "1" and attempt == 0:
    raise ValueError("rank 1 fails in the first attempt")
attempt
"""


def test_a_failed_attempts_logs_go_with_the_run_beside_the_last_ones(kernel):
    r = kernel.execute(RESTARTED_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    server, run = the_run(r)
    run_id = run["info"]["run_id"]
    assert run["info"]["status"] == "FINISHED", run["info"]
    # The last attempt's logs where a run without restarts has them ...
    assert set(artifacts(server, run_id, "logs")) == {"logs/rank-0.log", "logs/rank-1.log"}
    assert "in attempt 1" in artifact(server, run_id, "logs/rank-1.log").decode()
    # ... and the failed one's under attempt-1/, its root cause among them.
    assert set(artifacts(server, run_id, "attempt-1/logs")) == {
        "attempt-1/logs/rank-0.log", "attempt-1/logs/rank-1.log"}
    failed = artifact(server, run_id, "attempt-1/logs/rank-1.log").decode()
    assert "LOG LINE of rank 1 in attempt 0" in failed, failed
    error = artifact(server, run_id, "attempt-1/error.txt").decode()
    assert "ValueError: rank 1 fails in the first attempt" in error, error
    assert "error.txt" not in artifacts(server, run_id), "the run finished"


# Last in the module: it stops the server the module's kernel started.
DYING_CELL = """%%distributed num_processes=2
import os, time
print(f"STARTED rank {os.environ['RANK']}", flush=True)
print(f"READY pid={os.getpid()} run={os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
while not os.path.exists({go!r}):
    time.sleep(0.05)
print(f"GOES ON rank {os.environ['RANK']}", flush=True)
"""


def test_a_server_that_dies_mid_run_costs_one_warning_and_no_log(kernel, tmp_path):
    import psutil

    go = tmp_path / "go"
    msg_id = kernel.start_execute(DYING_CELL.replace("{go!r}", repr(str(go))))
    support.wait_announced(kernel, msg_id, timeout=RUN)
    # the server's whole tree: `mlflow server` and the workers that serve its port
    def is_server(p):
        words = " ".join(p.cmdline())
        return "mlflow" in words and "server" in words

    tops = [p for p in support.descendants(kernel.pid) if is_server(p)]
    assert tops, "the kernel's own MLflow server is not among its processes"
    servers = {p.pid: p for t in tops for p in [t, *t.children(recursive=True)]}.values()
    for p in servers:
        p.kill()
    psutil.wait_procs(list(servers), timeout=30)
    go.touch()
    r = kernel.finish(msg_id, timeout=RUN)
    assert r.status == "ok", r.describe()
    warnings = [line for line in r.stderr.splitlines() if line.startswith("MLflow")]
    assert len(warnings) == 1, r.stderr
    assert "(FINISHED) was not recorded" in warnings[0], warnings[0]
    logs = re.search(r"which are in (\S+)", warnings[0]).group(1)
    # nothing in the log folder is lost
    for rank in (0, 1):
        text = open(os.path.join(logs, f"rank-{rank}.log")).read()
        assert f"STARTED rank {rank}" in text and f"GOES ON rank {rank}" in text, text
    # and the kernel goes on serving
    r = kernel.execute("21 * 2", timeout=60)
    assert r.status == "ok" and "42" in str(r.of_type("execute_result")), r.describe()

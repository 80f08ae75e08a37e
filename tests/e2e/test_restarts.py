"""restarts=K: a run whose rank fails starts every rank again, up to K times,
as torchrun's --max-restarts (issue 36, item 3).

Ranks here fail by their attempt: TORCHELASTIC_RESTART_COUNT tells a rank
which attempt it is in, as torchrun's workers learn it, and every attempt
of one run has the same TORCHELASTIC_RUN_ID. What is checked is what a user
relies on: the cell's value is the last attempt's; each failed attempt's
error is in the cell, with its logs; the status says "attempt 2 of 3"; the
MLflow run is one, tagged with its attempts; an interrupt and the timeout
are not restarted; started ranks refuse the option; the decorator takes it.
The training that resumes from its checkpoint is test_today_checkpoint.py's
and the notebook's (torch 2); across Slurm nodes, test_slurm_runs.py's.
"""
import json
import pathlib
import re
import sys
import threading
import time

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

pytestmark = [
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="%%distributed is distkernel's"),
]

RUN = 180

FAIL_FIRST = (
    "import os, sys\n"
    "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
    "if os.environ['RANK'] == '1' and attempt < {fails}:\n"
    "    {how}\n"
    "(attempt, os.environ['TORCHELASTIC_MAX_RESTARTS'], os.environ['TORCHELASTIC_RUN_ID'])\n")


def cell(options, fails, how="raise ValueError(f'rank one fails in attempt {attempt}')"):
    return f"%%distributed num_processes=2 {options}\n" + FAIL_FIRST.format(fails=fails, how=how)


def values(r):
    """{rank: (attempt, max_restarts, run_id)} from the cell's value."""
    out = {}
    for line in r.result.splitlines():
        rank, _, value = line.partition(": ")
        out[int(rank.split()[1])] = eval(value)
    return out


def last_status(r):
    return support.status_displays(r)[-1]["content"]["data"]["text/plain"]


def test_a_failed_attempt_is_restarted_and_the_last_gives_the_value(kernel):
    r = kernel.execute(cell("restarts=2", fails=2), timeout=RUN)
    assert r.status == "ok", r.describe()
    got = values(r)
    assert [got[0][0], got[1][0]] == [2, 2], r.describe()     # the third attempt's value
    assert got[0][1] == "2" and got[0][2] == got[1][2], r.describe()
    err = r.stderr
    # Each failed attempt: its error (the root cause's) and its logs, then the next.
    assert err.count("[distkernel] attempt 1 of 3 failed; its logs: ") == 1, err
    assert err.count("[distkernel] attempt 2 of 3 failed; its logs: ") == 1, err
    assert "rank one fails in attempt 0" in err and "rank one fails in attempt 1" in err, err
    assert "starting every rank again: attempt 2 of 3" in err, err
    assert "starting every rank again: attempt 3 of 3" in err, err
    # Each failed attempt's folder keeps its error, as the cell showed it, uncoloured.
    for n, folder in enumerate(re.findall(r"failed; its logs: (\S+)", err)):
        error = (pathlib.Path(folder) / "error.txt").read_text()
        assert f"rank one fails in attempt {n}" in error and "\033" not in error, error
    status = last_status(r)
    assert status.startswith("distributed: 2 CPU ranks · attempt 3 of 3 · "), status
    assert status.splitlines()[0].endswith("· finished"), status
    # Each attempt its own log folder; the status names the last.
    logs = pathlib.Path(re.search(r"logs: (\S+)", status).group(1))
    assert logs.name.endswith("-attempt-3"), status
    assert (logs / "rank-1.log").exists()
    # One MLflow link for the three attempts.
    links = [m for m in r.of_type("display_data")
             if "mlflow" in json.dumps(m["content"]["data"]).lower()]
    assert len(links) <= 1, links
    assert support.wait_no_descendants(kernel.pid, timeout=5) == []


def test_restarts_used_up_is_the_last_failure_saying_so(kernel):
    r = kernel.execute(cell("restarts=1", fails=5), timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ValueError", r.describe()
    assert "[attempt 2 of 2; no restart left]" in r.content["evalue"], r.describe()
    assert "rank one fails in attempt 1" in "\n".join(r.content["traceback"]), r.describe()
    assert r.stderr.count("failed; its logs:") == 1, r.stderr
    assert support.wait_no_descendants(kernel.pid, timeout=5) == []


def test_a_killed_rank_is_restarted_as_torchrun_does(kernel):
    r = kernel.execute(cell("restarts=1", fails=1, how="os.kill(os.getpid(), 9)"), timeout=RUN)
    assert r.status == "ok", r.describe()
    assert values(r)[1][0] == 1, r.describe()
    assert "SIGKILL" in r.stderr, r.stderr


def test_without_restarts_nothing_is_restarted(kernel):
    r = kernel.execute(cell("", fails=1), timeout=RUN)
    assert r.status == "error", r.describe()
    assert "[attempt" not in r.content["evalue"], r.describe()
    assert "starting every rank again" not in r.stderr
    assert "attempt" not in last_status(r).splitlines()[0]


def test_the_timeout_is_not_restarted(kernel):
    r = kernel.execute("%%distributed num_processes=2 restarts=3 timeout=3\n"
                       "import time\ntime.sleep(60)\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "TimeoutError", r.describe()
    assert "a timeout or an interrupt is not restarted" in r.content["evalue"], r.describe()
    assert "starting every rank again" not in r.stderr, r.stderr


@pytest.mark.timeout(RUN)
def test_an_interrupt_is_not_restarted(fresh_kernel):
    k = fresh_kernel
    result = {}

    def run():
        result["r"] = k.execute("%%distributed num_processes=2 restarts=3\n" + support.ANNOUNCE +
                                "import time\ntime.sleep(120)\n", timeout=RUN)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 90
    while not list(support.descendants(k.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)      # the ranks are in the cell
    k.km.interrupt_kernel()
    t.join(RUN)
    r = result["r"]
    assert r.status == "error", r.describe()
    assert "starting every rank again" not in r.stderr, r.stderr
    assert support.wait_no_descendants(k.pid, timeout=10) == []


@pytest.mark.parametrize("bad", ["-1", "101", "two", "'1'", "1.5"])
def test_a_bad_count_is_refused_before_anything_starts(kernel, bad):
    r = kernel.execute(f"%%distributed num_processes=2 restarts={bad}\n1\n", timeout=30)
    assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
    assert "restarts must be a whole number from 0 to 100" in r.content["evalue"], r.describe()
    assert support.status_displays(r) == []


def test_started_ranks_refuse_restarts(kernel):
    r = kernel.execute("%distributed start num_processes=2 restarts=1", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "started ranks (`%distributed start`) stay" in r.content["evalue"], r.describe()
    r = kernel.execute("%distributed start num_processes=2", timeout=RUN)
    assert r.status == "ok", r.describe()
    try:
        r = kernel.execute("%%distributed restarts=1\n1\n", timeout=RUN)
        assert r.status == "error", r.describe()
        assert "restarts=" in r.content["evalue"], r.describe()
    finally:
        kernel.execute("%distributed stop", timeout=RUN)


def test_the_decorator_takes_restarts(kernel):
    r = kernel.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2, restarts=1)\n"
        "def attempt_of_each():\n"
        "    import os\n"
        "    n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "    if os.environ['RANK'] == '0' and n == 0:\n"
        "        raise RuntimeError('first attempt fails')\n"
        "    return n\n"
        "attempt_of_each.distributed()\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "[1, 1]", r.describe()
    assert "attempt 1 of 2 failed" in r.stderr, r.stderr


@pytest.mark.timeout(RUN)
def test_one_mlflow_run_holds_every_attempt(kernelspec_installed, tmp_path):
    with MlflowTestServer() as srv:
        k = support.Kernel.start(env=support.kernel_env(MLFLOW_TRACKING_URI=srv.url),
                                 cwd=str(tmp_path))
        try:
            r = k.execute(cell("restarts=1", fails=1), timeout=RUN)
            assert r.status == "ok", r.describe()
        finally:
            k.stop()
        runs = srv.runs()
        assert len(runs) == 1, runs
        run_id = runs[0]["info"]["run_id"]
        tags = srv.tags(run_id)
        assert tags["distkernel.attempt"] == "2 of 2", tags
        assert tags["distkernel.attempt.1"].startswith("ValueError: [rank 1] rank one fails "
                                                       "in attempt 0"), tags
        assert runs[0]["info"]["status"] == "FINISHED", runs[0]["info"]
        # Every rank of both attempts logged into the one run.
        assert values(r)[0][2] == values(r)[1][2]

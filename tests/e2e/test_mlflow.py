"""Every distributed run is an MLflow run, end to end through jupyter_client against
tests/mlflow_server.py (MLflow itself cannot be installed here): the experiment is
found or created once; the run's tags, parent and parameters; the run handed to the
ranks; the final status the kernel writes last; bearer and basic auth, and no
credential in any output; the link in the cell and on the decorator's result; the
options and environment variables that choose where the run goes; a tracking server
that is down, slow or failing; no tracking at all; and the tracking server the kernel
starts itself when `mlflow` is installed (a stand-in `mlflow` command here).

Ranks do little and import no torch, 2 per run (num_processes=2): the machine may
have 2 cores.
"""
import base64
import json
import os
import re
import signal
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

import support
from support import ANNOUNCE, NoReply, rank_lines

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 90           # seconds a cell with 2 small ranks may take on a busy machine
BOUNDED = 15       # seconds a cell may take when the tracking server misbehaves
NOTEBOOK = "/home/e2e/notebooks/train.ipynb"
USER = "e2e-user"
OK_CELL = "%%distributed num_processes=2\nimport os\nint(os.environ['RANK'])\n"
OK_RESULT = "rank 0: 0\nrank 1: 1"
SECRET_TOKEN = "tok-5ecret-d1stk3rnel"
SECRET_PASSWORD = "pa55-5ecret-d1stk3rnel"

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- helpers --------------------------------------------------------------------------

def rest(srv, endpoint, body):
    """POST BODY to the tracking server's REST API (no auth: servers here that require
    it are not used with this)."""
    req = urllib.request.Request(f"{srv.url}/api/2.0/mlflow/{endpoint}",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with NO_PROXY.open(req, timeout=10) as resp:
        return json.loads(resp.read())


def run_ids(srv):
    return {r["info"]["run_id"] for r in srv.runs()}


def run_tracked(kernel, srv, code, timeout=RUN):
    """Execute CODE; return (execution, the one run it created)."""
    before = run_ids(srv)
    r = kernel.execute(code, timeout=timeout)
    new = [run for run in srv.runs() if run["info"]["run_id"] not in before]
    assert len(new) == 1, f"{len(new)} runs were created by the cell:\n{r.describe()}"
    return r, new[0]


def run_url(srv_url, run):
    return f"{srv_url}/#/experiments/{run['info']['experiment_id']}/runs/{run['info']['run_id']}"


def tags_of(run):
    return {t["key"]: t["value"] for t in run["data"]["tags"]}


def params_of(run):
    return {p["key"]: p["value"] for p in run["data"]["params"]}


def mlflow_lines(text):
    return [line for line in text.splitlines() if "mlflow" in line.lower()]


def link_displays(execution):
    return [m for m in execution.of_type("display_data")
            if "MLflow" in m["content"]["data"].get("text/plain", "")
            and not m["content"]["data"]["text/plain"].startswith("distributed:")]


def rank_post(endpoint, body_expr, headers="{}"):
    """Rank code that POSTs BODY_EXPR (Python source) to ENDPOINT of the run's server."""
    return textwrap.dedent(f"""\
        import json as _json, os as _os, time as _time, urllib.request as _ur
        _req = _ur.Request(_os.environ["MLFLOW_TRACKING_URI"] + "/api/2.0/mlflow/{endpoint}",
                           data=_json.dumps({body_expr}).encode(), method="POST",
                           headers=dict({{"Content-Type": "application/json"}}, **{headers}))
        _ur.build_opener(_ur.ProxyHandler({{}})).open(_req, timeout=10).read()
        """)


class Tracked:
    """A kernel started with ENV (stderr to a file, cwd CWD) for one test."""

    def __init__(self, tmp_path, env, cwd=None):
        self.stderr_path = tmp_path / "kernel-stderr.log"
        self.stopped = False
        with open(self.stderr_path, "w") as err:
            self.kernel = support.Kernel.start(env=env, stderr=err, cwd=str(cwd or tmp_path))

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def stop(self):
        if not self.stopped:
            self.stopped = True
            self.kernel.stop()

    def __enter__(self):
        return self.kernel

    def __exit__(self, *exc):
        self.stop()


def assert_no_secret(tracked, *secrets):
    """Stop TRACKED's kernel; no SECRET in any iopub message it sent or in its stderr."""
    sent = support.all_iopub(tracked.kernel)
    everything = json.dumps([{"header": m["header"], "content": m["content"],
                              "metadata": m["metadata"]} for m in sent], default=str)
    tracked.stop()
    stderr_text = tracked.stderr()
    for s in secrets:
        assert s not in everything, f"{s!r} appears in an iopub message"
        assert s not in stderr_text, f"{s!r} appears in the kernel's stderr:\n{stderr_text[-3000:]}"


# -- fixtures -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    with MlflowTestServer() as s:
        yield s


@pytest.fixture(scope="module")
def tracked(kernelspec_installed, srv, tmp_path_factory):
    """One kernel for the tests that leave it usable, tracking into SRV."""
    t = Tracked(tmp_path_factory.mktemp("tracked"),
                support.kernel_env(MLFLOW_TRACKING_URI=srv.url, JPY_SESSION_NAME=NOTEBOOK,
                                   USER=USER))
    yield t.kernel
    t.stop()


@pytest.fixture
def server():
    """A tracking server of the test's own."""
    with MlflowTestServer() as s:
        yield s


# -- the experiment -------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_experiment_is_created_once_and_reused_across_cells(kernelspec_installed, server,
                                                            tmp_path):
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, JPY_SESSION_NAME=NOTEBOOK)
    with Tracked(tmp_path, env) as k:
        r1, run1 = run_tracked(k, server, OK_CELL)
        assert r1.status == "ok", r1.describe()
        lookups = server.requests("experiments/get-by-name")
        creates = server.requests("experiments/create")
        assert [q["query"] for q in lookups] == [{"experiment_name": "train"}]
        assert lookups[0]["status"] == 404
        assert [q["body"] for q in creates] == [{"name": "train"}]
        assert lookups[0]["time"] < creates[0]["time"]
        server.reset()
        r2, run2 = run_tracked(k, server, OK_CELL)
        assert r2.status == "ok", r2.describe()
        assert server.requests("experiments/create") == [], "the second cell created it again"
    named = [e for e in server.experiments() if e["name"] == "train"]
    assert len(named) == 1
    assert run1["info"]["experiment_id"] == run2["info"]["experiment_id"] == \
        named[0]["experiment_id"]


@pytest.mark.timeout(120)
def test_a_second_kernel_finds_the_experiment_without_creating_it(kernelspec_installed, server,
                                                                  tmp_path):
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, JPY_SESSION_NAME=NOTEBOOK)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Tracked(tmp_path / "a", env) as k:
        _, first = run_tracked(k, server, OK_CELL)
    server.reset()
    with Tracked(tmp_path / "b", env) as k:
        r, second = run_tracked(k, server, OK_CELL)
        assert r.status == "ok", r.describe()
    lookups = server.requests("experiments/get-by-name")
    assert [q["status"] for q in lookups] == [200], lookups
    assert server.requests("experiments/create") == []
    assert second["info"]["experiment_id"] == first["info"]["experiment_id"]


@pytest.mark.timeout(120)
def test_experiment_created_concurrently_is_not_an_error(kernelspec_installed, server, tmp_path):
    # The lookup says "absent" while another client creates it: our create meets
    # RESOURCE_ALREADY_EXISTS, and the run goes into the other client's experiment.
    server.set_race(1)
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, MLFLOW_EXPERIMENT_NAME="raced")
    with Tracked(tmp_path, env) as k:
        r, run = run_tracked(k, server, OK_CELL)
    assert r.status == "ok", r.describe()
    assert mlflow_lines(r.stderr) == [], r.describe()
    assert [q["status"] for q in server.requests("experiments/create")] == [400]
    raced = [e for e in server.experiments() if e["name"] == "raced"]
    assert len(raced) == 1 and run["info"]["experiment_id"] == raced[0]["experiment_id"]


# -- the run's tags, parent and parameters --------------------------------------------

@pytest.mark.timeout(120)
def test_run_tags_name_source_and_user(tracked, srv):
    r, run = run_tracked(tracked, srv, OK_CELL)
    assert r.status == "ok", r.describe()
    tags = tags_of(run)
    assert tags["mlflow.runName"] == run["info"]["run_name"] and tags["mlflow.runName"]
    assert tags["mlflow.source.type"] == "NOTEBOOK"
    assert tags["mlflow.source.name"] == NOTEBOOK
    assert tags["mlflow.user"] == USER
    assert "mlflow.parentRunId" not in tags, "a parent without any active run"


@pytest.mark.timeout(120)
def test_parent_run_from_mlflow_run_id_in_the_kernel_env(kernelspec_installed, server, tmp_path):
    exp = rest(server, "experiments/create", {"name": "parents"})["experiment_id"]
    parent = rest(server, "runs/create", {"experiment_id": exp, "run_name": "outer",
                                          "start_time": int(time.time() * 1000)})
    parent_id = parent["run"]["info"]["run_id"]
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, MLFLOW_RUN_ID=parent_id)
    with Tracked(tmp_path, env) as k:
        r, run = run_tracked(k, server, "%%distributed num_processes=2\nimport os\n"
                                        "print(os.environ['MLFLOW_RUN_ID'])\n")
    assert r.status == "ok", r.describe()
    assert run["info"]["run_id"] != parent_id
    assert tags_of(run).get("mlflow.parentRunId") == parent_id
    # The ranks log into the child, not into the kernel's own MLFLOW_RUN_ID.
    assert {rank: lines for rank, lines in rank_lines(r.stdout).items()} == \
        {0: [run["info"]["run_id"]], 1: [run["info"]["run_id"]]}, r.describe()


@pytest.mark.timeout(120)
def test_parent_run_from_the_notebooks_active_mlflow_run(tracked, srv):
    parent_id = "0123456789abcdef0123456789abcdef"
    r = tracked.execute(textwrap.dedent(f"""\
        import sys, types
        _fake_mlflow = types.ModuleType("mlflow")
        class _Info:
            run_id = "{parent_id}"
        class _Run:
            info = _Info()
        _fake_mlflow.active_run = lambda: _Run()
        sys.modules["mlflow"] = _fake_mlflow
        """))
    assert r.status == "ok", r.describe()
    try:
        r, run = run_tracked(tracked, srv, OK_CELL)
    finally:
        tracked.execute("import sys\nsys.modules.pop('mlflow', None)\n")
    assert r.status == "ok", r.describe()
    assert tags_of(run).get("mlflow.parentRunId") == parent_id


@pytest.mark.timeout(120)
def test_parameters_are_logged_in_one_batch(tracked, srv):
    srv.reset()
    r, run = run_tracked(tracked, srv,
                         "%%distributed num_processes=2 timeout=60 output=rank0\n"
                         "import os\nint(os.environ['RANK'])\n")
    assert r.status == "ok", r.describe()
    rid = run["info"]["run_id"]
    batches = [q for q in srv.requests("runs/log-batch") if q["body"]["run_id"] == rid]
    assert len(batches) == 1, batches
    assert srv.requests("runs/log-parameter") == []
    sent = {p["key"]: p["value"] for p in batches[0]["body"]["params"]}
    assert sent == params_of(run)
    assert sent["world_size"] == "2"
    assert sent["device"] == "cpu"
    assert sent["num_processes"] == "2"
    assert float(sent["timeout"]) == 60
    assert sent["output"] == "rank0"


@pytest.mark.timeout(120)
def test_an_output_list_is_logged_as_written(tracked, srv):
    srv.reset()
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2 output=1,0-1\n1\n")
    assert r.status == "ok", r.describe()
    assert params_of(run)["output"] == "1,0-1"


# -- the ranks and the run ------------------------------------------------------------

@pytest.mark.timeout(120)
def test_ranks_see_the_run_id_tracking_uri_and_experiment(tracked, srv):
    r, run = run_tracked(tracked, srv,
                         "%%distributed num_processes=2\nimport os\n"
                         "print(os.environ['MLFLOW_RUN_ID'])\n"
                         "print(os.environ['MLFLOW_TRACKING_URI'])\n"
                         "print(os.environ['MLFLOW_EXPERIMENT_ID'])\n")
    assert r.status == "ok", r.describe()
    want = [run["info"]["run_id"], srv.url, run["info"]["experiment_id"]]
    assert rank_lines(r.stdout) == {0: want, 1: want}, r.describe()


@pytest.mark.timeout(120)
def test_metric_a_rank_logs_lands_in_the_run(tracked, srv):
    body = ('{"run_id": _os.environ["MLFLOW_RUN_ID"], "key": "loss", '
            '"value": 0.25 + int(_os.environ["RANK"]), "timestamp": int(_time.time() * 1000), '
            '"step": int(_os.environ["RANK"])}')
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2\n" +
                         rank_post("runs/log-metric", body))
    assert r.status == "ok", r.describe()
    got = sorted((m["step"], m["value"]) for m in run["data"]["metrics"] if m["key"] == "loss")
    assert got == [(0, 0.25), (1, 1.25)], run["data"]["metrics"]


@pytest.mark.timeout(180)
def test_each_cell_on_started_ranks_is_a_run_of_its_own_tagged_with_their_id(tracked, srv):
    before = run_ids(srv)
    r = tracked.execute("%distributed start num_processes=2", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert run_ids(srv) == before, "starting the ranks created an MLflow run"
    pool_id = re.search(r"\(([0-9a-f]{16})\)", r.stdout).group(1)
    try:
        seen = []
        for _ in range(2):
            r, run = run_tracked(tracked, srv, "%%distributed\nimport os\n"
                                               "print(os.environ['MLFLOW_RUN_ID'])\n")
            assert r.status == "ok", r.describe()
            run_id = run["info"]["run_id"]
            assert tags_of(run)["distkernel.pool"] == pool_id, tags_of(run)
            assert rank_lines(r.stdout) == {0: [run_id], 1: [run_id]}, r.describe()
            assert statuses(srv.run(run_id)) == ["RUNNING", "FINISHED"]
            seen.append(run_id)
        assert seen[0] != seen[1]
        # A cell without tracking does not log into the last cell's run.
        r = tracked.execute("%%distributed tracking=False\nimport os\n"
                            "print(os.environ.get('MLFLOW_RUN_ID', 'no run'))\n", timeout=RUN)
        assert rank_lines(r.stdout) == {0: ["no run"], 1: ["no run"]}, r.describe()
    finally:
        tracked.execute("%distributed stop", timeout=RUN)


# -- the final status -----------------------------------------------------------------

def statuses(run):
    return [h["status"] for h in run["status_history"]]


@pytest.mark.timeout(120)
def test_final_status_finished_on_success(tracked, srv):
    r, run = run_tracked(tracked, srv, OK_CELL)
    assert r.status == "ok", r.describe()
    run = srv.run(run["info"]["run_id"])
    assert statuses(run) == ["RUNNING", "FINISHED"]
    assert run["info"]["end_time"] >= run["info"]["start_time"]


@pytest.mark.timeout(120)
def test_final_status_failed_when_a_rank_raises(tracked, srv):
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2\nimport os\n"
                                       "if os.environ['RANK'] == '1':\n"
                                       "    raise ValueError('rank one fails')\n")
    assert r.status == "error", r.describe()
    run = srv.run(run["info"]["run_id"])
    assert statuses(run) == ["RUNNING", "FAILED"]
    assert run["info"]["end_time"] >= run["info"]["start_time"]


@pytest.mark.timeout(120)
def test_final_status_killed_on_interrupt(tracked, srv):
    before = run_ids(srv)
    msg_id = tracked.start_execute("%%distributed num_processes=2\n" + ANNOUNCE +
                                   "import time\ntime.sleep(60)\n")
    support.wait_announced(tracked, msg_id, timeout=RUN)
    tracked.km.interrupt_kernel()
    try:
        r = tracked.finish(msg_id, timeout=20)
    except NoReply:
        tracked.restart_now()
        pytest.fail("the cell still ran 20 s after the interrupt")
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
    (run,) = [x for x in srv.runs() if x["info"]["run_id"] not in before]
    assert statuses(run) == ["RUNNING", "KILLED"]
    assert run["info"]["end_time"] >= run["info"]["start_time"]


@pytest.mark.timeout(120)
def test_final_status_killed_on_timeout(tracked, srv):
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2 timeout=2\n"
                                       "import time\ntime.sleep(60)\n")
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    assert statuses(srv.run(run["info"]["run_id"])) == ["RUNNING", "KILLED"]


@pytest.mark.timeout(120)
def test_final_status_is_written_after_every_rank_exited(tracked, srv):
    # Each rank's "MLflow client" writes FINISHED at its exit (atexit, as MLflow's
    # does), and rank 0 also just before it raises: the kernel's FAILED must win.
    body = ('{"run_id": _os.environ["MLFLOW_RUN_ID"], "status": "FINISHED", '
            '"end_time": int(_time.time() * 1000)}')
    headers = '{"X-Rank": _os.environ["RANK"]}'
    code = ("%%distributed num_processes=2\n"
            "import atexit, os, time\n"
            "def _client_says_finished():\n"
            + textwrap.indent(rank_post("runs/update", body, headers), "    ") +
            "atexit.register(_client_says_finished)\n"
            "if os.environ['RANK'] == '0':\n"
            "    time.sleep(0.5)\n"
            "    _client_says_finished()\n"
            "    raise RuntimeError('rank 0 fails after its client said FINISHED')\n")
    srv.reset()
    r, run = run_tracked(tracked, srv, code)
    assert r.status == "error", r.describe()
    run = srv.run(run["info"]["run_id"])
    assert statuses(run)[-1] == "FAILED", run["status_history"]
    assert run["info"]["status"] == "FAILED"
    updates = srv.requests("runs/update")
    by_ranks = [q for q in updates if "x-rank" in q["headers"]]
    by_kernel = [q for q in updates if "x-rank" not in q["headers"]]
    assert [q["body"]["status"] for q in by_kernel] == ["FAILED"], updates
    assert [q["headers"]["x-rank"] for q in by_ranks].count("0") == 2, \
        f"rank 0 did not write FINISHED before raising and at exit: {by_ranks}"
    assert updates[-1] == by_kernel[0], updates
    assert all(q["time"] <= by_kernel[0]["time"] for q in by_ranks)


# -- credentials ----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_bearer_token_is_sent(kernelspec_installed, tmp_path):
    with MlflowTestServer(token=SECRET_TOKEN) as server:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url,
                                 MLFLOW_TRACKING_TOKEN=SECRET_TOKEN)
        t = Tracked(tmp_path, env)
        try:
            r, run = run_tracked(t.kernel, server, OK_CELL)
            assert r.status == "ok", r.describe()
            assert statuses(server.run(run["info"]["run_id"])) == ["RUNNING", "FINISHED"]
            reqs = server.requests()
            assert reqs and all(q["headers"].get("authorization") == f"Bearer {SECRET_TOKEN}"
                                for q in reqs), [q["headers"] for q in reqs]
            assert all(q["status"] in (200, 404) for q in reqs)
            assert_no_secret(t, SECRET_TOKEN)
        finally:
            t.stop()


@pytest.mark.timeout(120)
def test_basic_auth_is_sent(kernelspec_installed, tmp_path):
    with MlflowTestServer(username="alice", password=SECRET_PASSWORD) as server:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, MLFLOW_TRACKING_USERNAME="alice",
                                 MLFLOW_TRACKING_PASSWORD=SECRET_PASSWORD)
        want = "Basic " + base64.b64encode(f"alice:{SECRET_PASSWORD}".encode()).decode()
        t = Tracked(tmp_path, env)
        try:
            r, run = run_tracked(t.kernel, server, OK_CELL)
            assert r.status == "ok", r.describe()
            assert statuses(server.run(run["info"]["run_id"])) == ["RUNNING", "FINISHED"]
            reqs = server.requests()
            assert reqs and all(q["headers"].get("authorization") == want for q in reqs), \
                [q["headers"] for q in reqs]
            assert_no_secret(t, SECRET_PASSWORD, want.split()[1])
        finally:
            t.stop()


@pytest.mark.timeout(120)
def test_credentials_in_the_uri_are_sent_and_never_shown(kernelspec_installed, tmp_path):
    with MlflowTestServer(username="alice", password=SECRET_PASSWORD) as server:
        uri = server.url.replace("http://", f"http://alice:{SECRET_PASSWORD}@")
        want = "Basic " + base64.b64encode(f"alice:{SECRET_PASSWORD}".encode()).decode()
        t = Tracked(tmp_path, support.kernel_env(MLFLOW_TRACKING_URI=uri))
        try:
            r, run = run_tracked(t.kernel, server, OK_CELL)
            assert r.status == "ok", r.describe()
            assert statuses(server.run(run["info"]["run_id"])) == ["RUNNING", "FINISHED"]
            reqs = server.requests()
            assert reqs and all(q["headers"].get("authorization") == want for q in reqs), \
                [q["headers"] for q in reqs]
            (link,) = link_displays(r)
            assert run_url(server.url, run) in link["content"]["data"]["text/plain"]
            stored = json.dumps({"experiments": server.experiments(), "runs": server.runs()})
            assert SECRET_PASSWORD not in stored, "the password was recorded in the run"
            assert_no_secret(t, SECRET_PASSWORD, want.split()[1])
        finally:
            t.stop()


@pytest.mark.timeout(120)
def test_credentials_never_appear_in_warnings(kernelspec_installed, tmp_path):
    # A server that is down (credentials in the URI) and one that rejects the token.
    uri = f"http://alice:{SECRET_PASSWORD}@127.0.0.1:{support.closed_port()}"
    env = support.kernel_env(MLFLOW_TRACKING_URI=uri, MLFLOW_TRACKING_TOKEN=SECRET_TOKEN,
                             DISTKERNEL_MLFLOW_TIMEOUT=1)
    t = Tracked(tmp_path, env)
    try:
        r = t.kernel.execute(OK_CELL, timeout=RUN)
        assert r.status == "ok" and r.result == OK_RESULT, r.describe()
        assert len(mlflow_lines(r.stderr)) == 1, r.describe()
        assert_no_secret(t, SECRET_PASSWORD, SECRET_TOKEN)
    finally:
        t.stop()


@pytest.mark.timeout(120)
def test_rejected_token_gives_one_warning_without_the_token(kernelspec_installed, tmp_path):
    with MlflowTestServer(token="the-right-one") as server:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url,
                                 MLFLOW_TRACKING_TOKEN=SECRET_TOKEN, DISTKERNEL_MLFLOW_TIMEOUT=1)
        t = Tracked(tmp_path, env)
        try:
            r = t.kernel.execute(OK_CELL, timeout=RUN)
            assert r.status == "ok" and r.result == OK_RESULT, r.describe()
            assert len(mlflow_lines(r.stderr)) == 1, r.describe()
            assert server.requests() and \
                all(q["status"] == 401 for q in server.requests()), server.requests()
            assert_no_secret(t, SECRET_TOKEN)
        finally:
            t.stop()


# -- the link -------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_cell_shows_the_run_link(tracked, srv):
    r, run = run_tracked(tracked, srv, OK_CELL)
    assert r.status == "ok", r.describe()
    url = run_url(srv.url, run)
    links = link_displays(r)
    assert len(links) == 1, r.describe()
    data = links[0]["content"]["data"]
    assert url in data["text/plain"], data
    assert re.search(r'<a [^>]*href="' + re.escape(url) + '"', data["text/html"]), data


@pytest.mark.timeout(120)
def test_decorator_result_has_the_run_url(tracked, srv):
    r, run = run_tracked(tracked, srv, textwrap.dedent("""\
        from distkernel import distributed

        @distributed(num_processes=2)
        def which_run():
            import os
            return os.environ["MLFLOW_RUN_ID"]

        _res = which_run.distributed()
        print(_res.run_url)
        print(list(_res))
        """))
    assert r.status == "ok", r.describe()
    url = run_url(srv.url, run)
    lines = r.stdout.splitlines()
    assert url in lines, r.describe()
    assert repr([run["info"]["run_id"]] * 2) in lines, r.describe()
    links = link_displays(r)
    assert len(links) == 1 and url in links[0]["content"]["data"]["text/plain"], r.describe()
    assert tags_of(run)["distkernel.kind"] == "function"


# -- options --------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_experiment_option_names_the_experiment(tracked, srv):
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2 experiment=e2e-option-exp\n"
                                       "import os\nint(os.environ['RANK'])\n")
    assert r.status == "ok", r.describe()
    (exp,) = [e for e in srv.experiments() if e["name"] == "e2e-option-exp"]
    assert run["info"]["experiment_id"] == exp["experiment_id"]


@pytest.mark.timeout(120)
def test_run_name_option_names_the_run(tracked, srv):
    r, run = run_tracked(tracked, srv, "%%distributed num_processes=2 run_name=e2e-named-run\n"
                                       "import os\nint(os.environ['RANK'])\n")
    assert r.status == "ok", r.describe()
    assert run["info"]["run_name"] == "e2e-named-run"
    assert tags_of(run)["mlflow.runName"] == "e2e-named-run"
    (link,) = link_displays(r)
    assert "e2e-named-run" in link["content"]["data"]["text/plain"]


@pytest.mark.timeout(120)
def test_decorator_options_name_the_experiment_and_run(tracked, srv):
    r, run = run_tracked(tracked, srv, textwrap.dedent("""\
        from distkernel import distributed

        @distributed(num_processes=2, experiment="e2e decorator exp", run_name="e2e dec run")
        def rank():
            import os
            return int(os.environ["RANK"])

        rank.distributed()
        """))
    assert r.status == "ok", r.describe()
    assert run["info"]["run_name"] == "e2e dec run"
    (exp,) = [e for e in srv.experiments() if e["name"] == "e2e decorator exp"]
    assert run["info"]["experiment_id"] == exp["experiment_id"]


@pytest.mark.timeout(120)
def test_tracking_false_makes_no_request(tracked, srv):
    srv.reset()
    before = run_ids(srv)
    r = tracked.execute("%%distributed num_processes=2 tracking=False\nimport os\n"
                        "print(os.environ.get('MLFLOW_RUN_ID'))\nint(os.environ['RANK'])\n",
                        timeout=RUN)
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    assert srv.requests() == []
    assert run_ids(srv) == before
    assert link_displays(r) == [] and mlflow_lines(r.stderr) == [], r.describe()
    assert rank_lines(r.stdout) == {0: ["None"], 1: ["None"]}, r.describe()


@pytest.mark.timeout(120)
def test_decorator_tracking_false_gives_no_run_url(tracked, srv):
    srv.reset()
    r = tracked.execute(textwrap.dedent("""\
        from distkernel import distributed

        @distributed(num_processes=2, tracking=False)
        def rank():
            import os
            return int(os.environ["RANK"])

        _res = rank.distributed()
        print(_res.run_url, list(_res))
        """), timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.stdout.strip() == "None [0, 1]", r.describe()
    assert srv.requests() == []


@pytest.mark.timeout(120)
def test_mlflow_experiment_name_env_names_the_experiment(kernelspec_installed, server, tmp_path):
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url,
                             MLFLOW_EXPERIMENT_NAME="e2e-env-exp", JPY_SESSION_NAME=NOTEBOOK)
    with Tracked(tmp_path, env) as k:
        r, run = run_tracked(k, server, OK_CELL)
    assert r.status == "ok", r.describe()
    (exp,) = [e for e in server.experiments() if e["name"] == "e2e-env-exp"]
    assert run["info"]["experiment_id"] == exp["experiment_id"]
    assert not [e for e in server.experiments() if e["name"] == "train"]


@pytest.mark.timeout(120)
def test_mlflow_experiment_id_env_names_the_experiment(kernelspec_installed, server, tmp_path):
    exp_id = rest(server, "experiments/create", {"name": "by-id"})["experiment_id"]
    server.reset()
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, MLFLOW_EXPERIMENT_ID=exp_id,
                             JPY_SESSION_NAME=NOTEBOOK)
    with Tracked(tmp_path, env) as k:
        r, run = run_tracked(k, server, OK_CELL)
    assert r.status == "ok", r.describe()
    assert run["info"]["experiment_id"] == exp_id
    assert server.requests("experiments/get-by-name") == []
    assert server.requests("experiments/create") == []


# -- a tracking server that misbehaves ------------------------------------------------

def assert_one_warning_and_bounded(r, elapsed):
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    warnings = mlflow_lines(r.stderr)
    assert len(warnings) == 1, r.describe()
    assert elapsed < BOUNDED, f"the cell took {elapsed:.1f} s"
    return warnings[0]


def timed(kernel, code):
    t0 = time.monotonic()
    r = kernel.execute(code, timeout=RUN)
    return r, time.monotonic() - t0


@pytest.mark.timeout(120)
def test_server_down_costs_one_warning_and_bounded_time(kernelspec_installed, tmp_path):
    env = support.kernel_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{support.closed_port()}",
                             DISTKERNEL_MLFLOW_TIMEOUT=1)
    with Tracked(tmp_path, env) as k:
        r, elapsed = timed(k, OK_CELL)
        assert_one_warning_and_bounded(r, elapsed)
        assert link_displays(r) == []


@pytest.mark.timeout(120)
def test_slow_server_costs_one_warning_and_bounded_time(kernelspec_installed, tmp_path):
    with MlflowTestServer(delay=4) as server:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
        with Tracked(tmp_path, env) as k:
            r, elapsed = timed(k, OK_CELL)
            assert_one_warning_and_bounded(r, elapsed)


@pytest.mark.timeout(120)
def test_server_answering_500_costs_one_warning_and_bounded_time(kernelspec_installed, server,
                                                                 tmp_path):
    server.set_fail(1000)
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
    with Tracked(tmp_path, env) as k:
        r, elapsed = timed(k, OK_CELL)
    assert_one_warning_and_bounded(r, elapsed)
    first = server.requests()[0]["path"]
    assert len(server.requests(first)) >= 2, "a 500 was not retried"
    assert server.runs() == []


@pytest.mark.timeout(120)
def test_one_500_is_retried_without_a_warning(kernelspec_installed, server, tmp_path):
    server.set_fail(1)
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
    with Tracked(tmp_path, env) as k:
        r, run = run_tracked(k, server, OK_CELL)
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    assert mlflow_lines(r.stderr) == [], r.describe()
    assert statuses(server.run(run["info"]["run_id"])) == ["RUNNING", "FINISHED"]


@pytest.mark.timeout(120)
def test_server_slow_at_the_end_costs_one_warning_and_bounded_time(kernelspec_installed, server,
                                                                   tmp_path):
    # The run is created; then, while the ranks run, the server turns slow, so the
    # final status cannot be written in time.
    env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
    slow_down = ('import json, os, urllib.request as ur\n'
                 'if os.environ["RANK"] == "0":\n'
                 '    ur.build_opener(ur.ProxyHandler({})).open(ur.Request(\n'
                 '        os.environ["MLFLOW_TRACKING_URI"] + "/_test/config",\n'
                 '        data=json.dumps({"delay": 4}).encode(), method="POST"), timeout=10)\n')
    with Tracked(tmp_path, env) as k:
        r, elapsed = timed(k, "%%distributed num_processes=2\n" + slow_down +
                           "int(os.environ['RANK'])\n")
    warning = assert_one_warning_and_bounded(r, elapsed)
    assert "FINISHED" in warning, warning
    assert len(server.runs()) == 1


@pytest.mark.timeout(120)
def test_interrupt_while_waiting_on_a_slow_server_ends_the_cell(kernelspec_installed, tmp_path):
    with MlflowTestServer(delay=4) as server:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
        with Tracked(tmp_path, env) as k:
            msg_id = k.start_execute("%%distributed num_processes=2\nimport time\n"
                                     "time.sleep(60)\n")
            k.wait_running(msg_id, settle=0.3)
            t0 = time.monotonic()
            k.km.interrupt_kernel()
            try:
                r = k.finish(msg_id, timeout=BOUNDED)
            except NoReply:
                pytest.fail(f"the cell still ran {BOUNDED} s after the interrupt")
            assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
            assert time.monotonic() - t0 < BOUNDED
            r = k.execute("1 + 1")
            assert r.status == "ok" and r.result == "2", r.describe()


# -- no tracking URI ------------------------------------------------------------------

def path_without_mlflow():
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.access(os.path.join(d, "mlflow"), os.X_OK)]
    return os.pathsep.join(dirs)


@pytest.mark.timeout(120)
def test_no_tracking_uri_and_no_mlflow_says_so_once(kernelspec_installed, tmp_path):
    env = support.kernel_env(PATH=path_without_mlflow())
    with Tracked(tmp_path, env) as k:
        code = OK_CELL.replace("import os\n", "import os\nprint(os.environ.get('MLFLOW_RUN_ID'))\n")
        r1 = k.execute(code, timeout=RUN)
        r2 = k.execute(code, timeout=RUN)
    for r in (r1, r2):
        assert r.status == "ok" and r.result == OK_RESULT, r.describe()
        assert rank_lines(r.stdout) == {0: ["None"], 1: ["None"]}, r.describe()
        assert link_displays(r) == [], r.describe()
    (line,) = mlflow_lines(r1.stderr)
    assert "off" in line and "MLFLOW_TRACKING_URI" in line, line
    assert mlflow_lines(r2.stderr) == [], "the second cell said it again:\n" + r2.describe()


# -- the embedded server --------------------------------------------------------------

# Stands in for `mlflow server ...`: like MLflow's, it runs the actual server as a
# child process (MLflow runs gunicorn/uvicorn) and records what it was given.
FAKE_MLFLOW = """\
#!/usr/bin/python3
import argparse, json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("command")
ap.add_argument("--backend-store-uri", required=True)
ap.add_argument("--host", required=True)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--workers", required=True)
a = ap.parse_args()
child = subprocess.Popen(["/usr/bin/python3", {server!r}, "--port", str(a.port)],
                         stdout=subprocess.DEVNULL)
with open(os.path.join(here, "started.jsonl"), "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                        "server_pid": child.pid}}) + "\\n")
sys.exit(child.wait())
"""


def fake_mlflow(tmp_path, script=None):
    """A directory holding an `mlflow` command (FAKE_MLFLOW unless SCRIPT), and the
    PATH for a kernel that finds it and no other."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mlflow"
    fake.write_text(script or FAKE_MLFLOW.format(
        server=str(support.REPO_ROOT / "tests" / "mlflow_server.py")))
    fake.chmod(0o755)
    return bin_dir, f"{bin_dir}{os.pathsep}{path_without_mlflow()}"


def started_servers(bin_dir):
    path = bin_dir / "started.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(120)
def test_embedded_server_is_started_used_and_stopped(kernelspec_installed, tmp_path):
    bin_dir, path = fake_mlflow(tmp_path)
    notebook_dir = tmp_path / "notebooks"
    notebook_dir.mkdir()
    t = Tracked(tmp_path, support.kernel_env(PATH=path), cwd=notebook_dir)
    try:
        k = t.kernel
        r1 = k.execute(OK_CELL, timeout=RUN)
        assert r1.status == "ok" and r1.result == OK_RESULT, r1.describe()
        started = started_servers(bin_dir)
        assert len(started) == 1, started
        argv = started[0]["argv"]
        assert argv[0] == "server", argv
        opts = dict(zip(argv[1::2], argv[2::2]))
        assert opts["--backend-store-uri"] == \
            f"sqlite:///{os.path.realpath(notebook_dir)}/mlflow.db", argv
        assert opts["--host"] == "127.0.0.1", argv
        assert opts["--workers"] == "1", argv   # one user: one worker, half the start time
        url = f"http://127.0.0.1:{opts['--port']}"
        embedded = MlflowTestServer()
        embedded.url = url   # a client of the server the kernel started
        (run,) = embedded.runs()
        (link,) = link_displays(r1)
        assert run_url(url, run) in link["content"]["data"]["text/plain"], link
        assert statuses(run) == ["RUNNING", "FINISHED"]
        assert mlflow_lines(r1.stderr) == [], r1.describe()
        r2 = k.execute(OK_CELL, timeout=RUN)
        assert r2.status == "ok", r2.describe()
        assert len(started_servers(bin_dir)) == 1, "a second server was started"
        assert len(embedded.runs()) == 2
        pids = [started[0]["pid"], started[0]["server_pid"]]
        assert support.wait_gone(pids, timeout=0) == pids, "the server is not running"
    finally:
        t.stop()
    left = support.wait_gone(pids, timeout=10)
    assert left == [], f"the tracking server outlived the kernel: {left}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_embedded_server_does_not_outlive_a_kernel_ended_by_signal(kernelspec_installed, tmp_path,
                                                                   sig):
    # `mlflow server` runs the actual server (gunicorn/uvicorn) as its child, as the
    # stand-in does: that one too must go when the kernel is killed or terminated.
    bin_dir, path = fake_mlflow(tmp_path)
    t = Tracked(tmp_path, support.kernel_env(PATH=path))
    pids = []
    try:
        r = t.kernel.execute(OK_CELL, timeout=RUN)
        assert r.status == "ok", r.describe()
        (started,) = started_servers(bin_dir)
        pids = [started["pid"], started["server_pid"]]
        os.kill(t.kernel.pid, sig)
        t.kernel.process.wait(10)
        left = support.wait_gone(pids, timeout=5)
        assert left == [], (f"the tracking server outlived the kernel ended by {sig.name}: "
                            f"{support.describe_processes([psutil.Process(p) for p in left])}")
    finally:
        t.stop()
        for pid in support.wait_gone(pids, timeout=0):
            os.kill(pid, signal.SIGKILL)   # do not leave it to the next tests


@pytest.mark.timeout(120)
def test_embedded_server_that_cannot_start_says_so_once(kernelspec_installed, tmp_path):
    _, path = fake_mlflow(tmp_path, "#!/bin/sh\necho 'no such command' >&2\nexit 1\n")
    with Tracked(tmp_path, support.kernel_env(PATH=path)) as k:
        r1 = k.execute(OK_CELL, timeout=RUN)
        r2 = k.execute(OK_CELL, timeout=RUN)
    for r in (r1, r2):
        assert r.status == "ok" and r.result == OK_RESULT, r.describe()
        assert link_displays(r) == [], r.describe()
    (line,) = mlflow_lines(r1.stderr)
    assert "off" in line, line
    assert mlflow_lines(r2.stderr) == [], "the second cell said it again:\n" + r2.describe()

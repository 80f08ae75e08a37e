"""
The tracking server is trusted only as far as it is checked (issue 21, items 1, 2
and 7), end to end through jupyter_client against tests/mlflow_server.py:

  - ids a server answers that are not what MLflow issues (run ids: 32 lowercase
    hex digits; experiment ids: decimal digits) are refused with one warning, the
    cell still runs, and no link is shown; whatever the kernel does place in its
    HTML is escaped;
  - the server the kernel starts itself (a stand-in `mlflow` here) is used only
    once its listening socket is seen to belong to that server's processes: a
    second user who binds the port first gets no request (root makes that user;
    skipped otherwise);
  - that server's store, mlflow.db, is the user's alone (0600).

Ranks do little and import no torch, 2 per run.
"""
import html.parser
import json
import os
import subprocess
import sys
import time

import pytest

import support
import users

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 90
OK_CELL = "%%distributed num_processes=2{opts}\nimport os\nint(os.environ['RANK'])\n"
OK_RESULT = "rank 0: 0\nrank 1: 1"
HOSTILE = '"><img src=x onerror=alert(1)>'


def link_displays(execution):
    return [m for m in execution.of_type("display_data")
            if "MLflow run" in m["content"]["data"].get("text/plain", "")]


def html_of(messages):
    return [m["content"]["data"]["text/html"] for m in messages
            if "text/html" in m["content"].get("data", {})]


class Markup(html.parser.HTMLParser):
    """The tags and attributes of a fragment, as a browser would see them."""

    def __init__(self, text):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


# -- ids from the server --------------------------------------------------------------

@pytest.fixture(scope="module")
def srv():
    with MlflowTestServer() as s:
        yield s


@pytest.fixture(scope="module")
def tracked(kernelspec_installed, srv, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("trust")
    k = support.Kernel.start(env=support.kernel_env(MLFLOW_TRACKING_URI=srv.url),
                             cwd=str(cwd))
    yield k
    k.stop()


@pytest.fixture
def honest(srv):
    yield srv
    srv.configure(run_id=None, experiment_id=None)


def test_a_run_id_that_is_not_mlflows_gets_a_warning_and_no_link(tracked, honest):
    honest.configure(run_id=HOSTILE)
    r = tracked.execute(OK_CELL.format(opts=""), timeout=RUN)
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    assert link_displays(r) == [], r.describe()
    assert "run id that is not MLflow's" in r.stderr, r.describe()
    assert not any("<img" in h for h in html_of(r.outputs)), r.describe()
    assert HOSTILE not in json.dumps([m["content"] for m in r.outputs]), r.describe()


def test_an_experiment_id_that_is_not_mlflows_gets_a_warning_and_no_link(tracked, honest):
    honest.configure(experiment_id="1" + HOSTILE)
    r = tracked.execute(OK_CELL.format(opts=" experiment=e2e-hostile-exp"), timeout=RUN)
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    assert link_displays(r) == [], r.describe()
    assert "experiment id that is not MLflow's" in r.stderr, r.describe()
    assert not honest.requests("runs/create") or all(
        q["body"].get("experiment_id") != "1" + HOSTILE for q in honest.requests("runs/create"))


def test_the_link_is_one_anchor_whatever_the_run_name(tracked, honest):
    r = tracked.execute(OK_CELL.format(opts=" run_name=a<b>&'x'"), timeout=RUN)
    assert r.status == "ok", r.describe()
    (link,) = html_of(link_displays(r))
    tags = Markup(link).tags
    assert [t for t, _ in tags] == ["a"], link
    assert tags[0][1]["href"].startswith(honest.url + "/#/experiments/"), link
    assert "a&lt;b&gt;&amp;&#39;x&#39;" in link, link


# -- the server the kernel starts: the port race --------------------------------------

# Stands in for `mlflow server`, slowed as MLflow is by its imports: it records its
# arguments, then listens only once told to (a file "go" beside it), so that the
# race is won by the other user every time rather than by luck. It opens its store
# as MLflow's SQLite does (created 0644 under umask 022 when absent).
SLOW_MLFLOW = """\
#!/usr/bin/python3
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
argv = sys.argv[1:]
with open(os.path.join(here, "started.jsonl"), "a") as f:
    f.write(json.dumps({{"argv": argv, "pid": os.getpid()}}) + "\\n")
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
    time.sleep(0.02)
store = argv[argv.index("--backend-store-uri") + 1][len("sqlite:///"):]
os.umask(0o022)
os.close(os.open(store, os.O_RDWR | os.O_CREAT, 0o644))   # as SQLite opens it
os.execv("/usr/bin/python3", ["/usr/bin/python3", {server!r}, "--port",
                              argv[argv.index("--port") + 1]])
"""

# The other user's server: answers anything with 200, records what it was sent.
IMPOSTOR = """\
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, log = int(sys.argv[1]), sys.argv[2]
class H(BaseHTTPRequestHandler):
    def answer(self):
        with open(log, "a") as f:
            f.write(self.command + " " + self.path + "\\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")
    do_GET = do_POST = answer
    def log_message(self, *a):
        pass
srv = HTTPServer(("127.0.0.1", port), H)
print("listening", flush=True)
srv.serve_forever()
"""


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def stand_in_bin(victim):
    """A folder of VICTIM's holding the slow stand-in `mlflow`."""
    bin_dir = users.private_dir(victim, prefix="dk-mlflow-bin-")
    fake = bin_dir / "mlflow"
    fake.write_text(SLOW_MLFLOW.format(server=str(support.REPO_ROOT / "tests" /
                                                  "mlflow_server.py")))
    fake.chmod(0o755)
    os.chown(fake, victim.uid, victim.gid)
    return bin_dir


def started_port(bin_dir):
    path = bin_dir / "started.jsonl"
    if not path.exists() or not path.read_text().strip():
        return None
    argv = json.loads(path.read_text().splitlines()[0])["argv"]
    return int(argv[argv.index("--port") + 1])


@pytest.mark.timeout(120)
def test_a_port_taken_by_another_user_gets_no_request_and_a_clear_warning():
    victim, attacker = users.pair()
    bin_dir = stand_in_bin(victim)
    notebooks = users.private_dir(victim, prefix="dk-nb-")
    log = attacker.home / "impostor-requests.log"
    log.unlink(missing_ok=True)
    k = users.start_kernel(victim, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    impostor = None
    try:
        k.execute(f"import os; os.chdir({str(notebooks)!r})", timeout=30)
        msg_id = k.start_execute(OK_CELL.format(opts=""))
        port = wait_for("`mlflow server` started", lambda: started_port(bin_dir), 60)
        impostor = users.popen_as(attacker, ["/usr/bin/python3", "-c", IMPOSTOR, str(port),
                                             str(log)], stdout=subprocess.PIPE, text=True)
        assert impostor.stdout.readline().strip() == "listening"
        (bin_dir / "go").write_text("")   # the real server may listen now: too late
        r = k.finish(msg_id, timeout=RUN)
    finally:
        if impostor:
            impostor.kill()
            impostor.wait()
        users.stop_kernel(k)
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    sent = log.read_text() if log.exists() else ""
    assert sent == "", f"the other user's server received the kernel's requests:\n{sent}"
    assert link_displays(r) == [], r.describe()
    warning = [line for line in r.stderr.splitlines() if "MLflow" in line]
    assert len(warning) == 1, r.describe()
    assert f"127.0.0.1:{port}" in warning[0] and attacker.name in warning[0], warning[0]


# -- the server the kernel starts: its store ------------------------------------------

def store_kernel(tmp_path, notebooks):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mlflow"
    fake.write_text(SLOW_MLFLOW.format(server=str(support.REPO_ROOT / "tests" /
                                                  "mlflow_server.py")))
    fake.chmod(0o755)
    (bin_dir / "go").write_text("")
    k = support.Kernel.start(env=support.kernel_env(PATH=f"{bin_dir}:/usr/bin:/bin"),
                             cwd=str(notebooks))
    return k, bin_dir


@pytest.mark.timeout(120)
def test_the_store_is_the_users_alone(kernelspec_installed, tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir(mode=0o755)
    k, _ = store_kernel(tmp_path, notebooks)
    try:
        r = k.execute(OK_CELL.format(opts=""), timeout=RUN)
    finally:
        k.stop()
    assert r.status == "ok" and len(link_displays(r)) == 1, r.describe()
    mode = (notebooks / "mlflow.db").stat().st_mode & 0o777
    assert mode == 0o600, f"mlflow.db is {mode:o}"


@pytest.mark.timeout(120)
def test_no_store_in_a_folder_others_can_write(kernelspec_installed, tmp_path):
    notebooks = tmp_path / "shared"
    notebooks.mkdir()
    notebooks.chmod(0o777)
    k, bin_dir = store_kernel(tmp_path, notebooks)
    try:
        r = k.execute(OK_CELL.format(opts=""), timeout=RUN)
    finally:
        k.stop()
    assert r.status == "ok" and r.result == OK_RESULT, r.describe()
    assert link_displays(r) == [], r.describe()
    assert not (bin_dir / "started.jsonl").exists(), "the server was started"
    assert not (notebooks / "mlflow.db").exists()
    (line,) = [line for line in r.stderr.splitlines() if "MLflow" in line]
    assert "mlflow.db" in line and str(notebooks) in line, line

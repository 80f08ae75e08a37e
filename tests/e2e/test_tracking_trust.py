"""
The tracking server is trusted only as far as it is checked (issue 21), end to end
through jupyter_client against tests/mlflow_server.py:

  - ids a server answers that are not what MLflow issues (run ids: 32 lowercase
    hex digits; experiment ids: decimal digits) are refused with one warning, the
    cell still runs, and no link is shown; whatever the kernel does place in its
    HTML is escaped.

Ranks do little and import no torch, 2 per run.
"""
import html.parser
import json
import sys

import pytest

import support

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


"""Who a run's Ray cluster trusts (issue 21, item 5), against the stand-in `ray`
(tests/e2e/fake_ray.py): the head's address a worker joins is the one rank 0
signed, never one a stranger wrote into the rendezvous store; where the
installed Ray has token authentication, every node and the driver get a token
of the run; an older Ray is said to be open.

One kernel for the module; each test points the stand-in at a log of its own.
"""
import ast
import json
import re

import pytest

import support
import users
from test_platform import RUN, RayNode, starts_and_stops

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="ray_launch and ray_init are distkernel's")

FORGED = "10.66.6.6:6379"


@pytest.fixture(scope="module")
def ray_node(tmp_path_factory):
    node = RayNode(tmp_path_factory.mktemp("ray-trust"))
    yield node
    node.stop()


def run_with(node, tmp_path, code, **env):
    """CODE in the kernel with the stand-in's variables ENV set for this run
    only and a log of its own; (reply, what the stand-in recorded)."""
    log = tmp_path / "ray.jsonl"
    env = {"FAKE_RAY_LOG": str(log), **env}
    k = node.kernel
    r = k.execute(f"import os\n_saved = {{n: os.environ.get(n) for n in {list(env)!r}}}\n"
                  f"os.environ.update({env!r})")
    assert r.status == "ok", r.describe()
    try:
        r = k.execute(code, timeout=RUN)
    finally:
        k.execute("for _n, _v in _saved.items():\n"
                  "    os.environ.pop(_n, None) if _v is None else os.environ.update({_n: _v})")
    recs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return r, recs


LAUNCH = ("from databricks.air import ray_launch\n"
          "@ray_launch(num_processes=2, tracking=False)\n"
          "def drive():\n"
          "    import os\n"
          "    return (os.environ['RAY_ADDRESS'], os.environ.get('RAY_AUTH_MODE'),\n"
          "            os.environ.get('RAY_AUTH_TOKEN'))\n"
          "drive.distributed()")


@pytest.mark.timeout(RUN)
def test_workers_refuse_a_head_address_a_stranger_wrote_into_the_store(ray_node, tmp_path):
    _, attacker = users.pair()
    r, recs = run_with(ray_node, tmp_path, LAUNCH, FAKE_RAY_FORGE=FORGED,
                       FAKE_RAY_FORGE_AS=attacker.name)
    assert r.status == "error", r.describe()
    head, workers, stops = starts_and_stops(recs)
    assert not any(f"--address={FORGED}" in w["argv"] for w in workers), recs
    assert "is not signed with the run's key" in r.describe(), r.describe()
    assert FORGED in r.describe(), r.describe()
    # rank 0 started its head, and stops it
    assert len(head) == 1 and [s["rank"] for s in stops] == ["0"], recs


@pytest.mark.timeout(RUN)
def test_every_ray_node_and_the_driver_get_a_token_of_the_run(ray_node, tmp_path):
    r, recs = run_with(ray_node, tmp_path, LAUNCH)
    assert r.status == "ok", r.describe()
    head, workers, _ = starts_and_stops(recs)
    assert len(head) == 1 and len(workers) == 1, recs
    tokens = {x["RAY_AUTH_TOKEN"] for x in head + workers}
    assert [x["RAY_AUTH_MODE"] for x in head + workers] == ["token", "token"], recs
    assert len(tokens) == 1 and re.fullmatch(r"[0-9a-f]{64}", tokens.pop()), recs
    token = head[0]["RAY_AUTH_TOKEN"]
    assert not any(token in " ".join(x["argv"]) for x in recs), recs   # not in any ps
    assert ast.literal_eval(r.result) == (workers[0]["argv"][1].split("=", 1)[1], "token", token), \
        r.describe()
    assert "has no authentication" not in r.stderr, r.describe()


@pytest.mark.timeout(RUN)
def test_a_ray_without_token_authentication_is_said_to_be_open(ray_node, tmp_path):
    r, recs = run_with(ray_node, tmp_path, LAUNCH, FAKE_RAY_VERSION="2.9.3")
    assert r.status == "ok", r.describe()
    head, workers, _ = starts_and_stops(recs)
    assert all(x["RAY_AUTH_MODE"] is None for x in head + workers), recs
    said = [line for line in r.stderr.splitlines() if "has no authentication" in line]
    assert len(said) == 1 and said[0].startswith("[rank 0] distkernel: this Ray (2.9)"), \
        r.describe()
    assert "anyone who reaches this cluster's ports can run code in it as you" in said[0]

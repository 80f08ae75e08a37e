"""A real Ray cluster, as a user of today's stack meets it (issue 34, item 5):
the kernel installed for the test venv (scripts/venv.sh: Ray 2 from PyPI),
whose ranks find that venv's `ray` first on PATH (the kernel puts the bin
folder of its --python first, as an activated venv has it). `ray_launch` over
4 CPU ranks and `ray_init` over 2 on this node; test_slurm_ray.py does the
same over 2 Slurm nodes.

What is checked against Ray itself: the driver's `ray.cluster_resources()`
holds every rank's Ray node and its share of the CPUs; a stranger's
`ray.init(address=...)` without the run's token is refused by the cluster;
`ray stop` runs on every rank after a normal end, a failing driver and an
interrupt, and no Ray process is left. To see each rank's `ray stop`, the
ranks' PATH starts with a folder whose `ray` notes its rank and command and
then runs the venv's `ray` (RecordedRay). tests/e2e/fake_ray.py's stand-in
stays for injecting faults (test_platform.py, test_ray_trust.py).

`ray stop` stops every Ray process of its user on its host, and the
simulated Slurm nodes share this host's processes: this file and
test_slurm_ray.py run in one pytest-xdist group (conftest.py's SLURM_GROUP).
Skipped where the venv is not built, and in the sanitizer pass (the C paths
are those of any run).
"""
import os
import time

import psutil
import pytest
from jupyter_client import KernelManager

import support
from test_today_mlflow import today  # noqa: F401 -- the venv's kernelspec, a fixture

VENV = os.environ.get("DISTKERNEL_TEST_VENV", "")
SLURM_GROUP = True      # conftest.py: with the Slurm tests (see above)

pytestmark = [
    # Run after the parallel part, one at a time (scripts/test.sh): Ray's own
    # start-up timeouts (the GCS's RPCs, a node's registration) fail its
    # `ray start` on 2 cores that 4 test workers keep busy, as on one CI run.
    pytest.mark.alone,
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="ray_launch is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]

# Four Ray nodes on 2 busy CPUs: the head takes 10-20 s, each other node
# 5-10 s, joining a few at a time (_ray.py's _started_before).
RUN = 300
GONE_WITHIN = 60

# A stranger on the cluster's network: another process without the run's
# token (RAY_AUTH_* left out of its environment) calls ray.init(address=...).
# The same uid is the harder case: it could read the token in /proc of the
# ranks, but nothing else lets it in, so it proves the cluster asks for the
# token, not for a uid.
STRANGER = """
def stranger():
    import os, subprocess, sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    code = ("import os, ray\\n"
            "ray.init(address=os.environ['RAY_ADDRESS'], log_to_driver=False)\\n"
            "print('STRANGER JOINED', ray.cluster_resources())\\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, (p.stdout + p.stderr)[-3000:]
"""

LAUNCH = """from databricks.air import ray_launch
""" + STRANGER + """
@ray_launch(num_processes=4, tracking=False@OPTS@)
def drive():
    import os, ray
    ray.init(log_to_driver=False)
    alive = [n for n in ray.nodes() if n["Alive"]]
    return {"cpus": ray.cluster_resources().get("CPU"), "nodes": len(alive),
            "hosts": sorted({n["NodeManagerAddress"] for n in alive}),
            "mode": os.environ.get("RAY_AUTH_MODE"), "stranger": stranger()}
_got = drive.distributed()
print("RESULT", repr(_got))
"""

# The paths that end a cluster badly need a driver and one other rank: 2
# ranks prove them, and start in half the time of 4 on 2 busy cores.
INIT_FAILING = """%%distributed num_processes=2 tracking=False
from distkernel import ray_init
with ray_init() as cluster:
    if cluster.is_driver:
        import ray
        ray.init(log_to_driver=False)
        assert ray.cluster_resources()["CPU"] >= 2
        raise ValueError("the driver fails on purpose")
"""

INIT_SLEEPING = """%%distributed num_processes=2 tracking=False
import os, time
from distkernel import ray_init
with ray_init() as cluster:
    if cluster.is_driver:
        import ray
        ray.init(log_to_driver=False)
        print(f"READY pid={os.getpid()} run={os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
        time.sleep(240)
"""


def ray_processes():
    """Ray's processes on this host, of any run: its daemons by name (the
    raylet, the GCS), its Python processes by the package they run (the
    agents, the monitors, `ray start`), its workers by their title
    ("ray::IDLE"). Zombies are gone already."""
    found = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if (p.info["name"] in ("raylet", "gcs_server") or "site-packages/ray/" in cmd
                    or cmd.startswith("ray::") or cmd.startswith(f"{VENV}/bin/ray ")):
                found.append(f"{p.pid} {cmd[:160]}")
        except psutil.Error:
            continue
    return found


def wait_no_ray(timeout=GONE_WITHIN):
    """[] once no Ray process is left, or what is still there at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = ray_processes()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


class RecordedRay:
    """A folder whose `ray` appends "RANK COMMAND" to a log, then runs the
    venv's `ray` with the same arguments; first on the ranks' PATH."""

    def __init__(self, root):
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "calls"
        ray = self.bin / "ray"
        ray.write_text(f'#!/bin/sh\necho "${{RANK:-?}} $1" >> {self.log}\n'
                       f'exec {VENV}/bin/ray "$@"\n')
        ray.chmod(0o755)

    def calls(self):
        return self.log.read_text().split("\n")[:-1] if self.log.exists() else []

    def ranks_that_ran(self, command):
        return sorted(line.split()[0] for line in self.calls() if line.split()[1:2] == [command])


@pytest.fixture(scope="module")
def kernel(today, tmp_path_factory):
    left = ray_processes()
    assert not left, "Ray processes were running before the test:\n" + "\n".join(left)
    root = tmp_path_factory.mktemp("today-ray")
    km = KernelManager(kernel_name="distkernel-today", kernel_spec_manager=today)
    k = support.Kernel.launch(km, env=support.kernel_env(DISTKERNEL_LOG_DIR=root / "logs"))
    yield k
    k.stop()


@pytest.fixture
def recorded(kernel, tmp_path):
    """RecordedRay first on the ranks' PATH for one test: the kernel's PATH
    (the venv's bin first) is what its ranks get."""
    rec = RecordedRay(tmp_path)
    r = kernel.execute(f"import os\n_path = os.environ['PATH']\n"
                       f"os.environ['PATH'] = {str(rec.bin)!r} + os.pathsep + _path")
    assert r.status == "ok", r.describe()
    yield rec
    kernel.execute("os.environ['PATH'] = _path")


def assert_stopped_everywhere(rec, r, world=4):
    # a rank whose Ray node missed Ray's start-up deadline starts it again
    # (_ray._run_ray); each runs `ray stop` once
    assert sorted(set(rec.ranks_that_ran("start"))) == [str(i) for i in range(world)], (
        rec.calls(), r.describe())
    assert rec.ranks_that_ran("stop") == [str(i) for i in range(world)], (rec.calls(),
                                                                           r.describe())
    left = wait_no_ray()
    assert not left, "Ray processes left after the run:\n" + "\n".join(left)


def the_result(r):
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.describe()
    import ast
    return ast.literal_eval(line[len("RESULT "):])


@pytest.mark.timeout(RUN + GONE_WITHIN + 60)
def test_ray_launch_on_four_cpu_ranks_makes_one_cluster_that_refuses_strangers(kernel,
                                                                               recorded):
    r = kernel.execute(LAUNCH.replace("@OPTS@", ""), timeout=RUN)
    assert r.status == "ok", r.describe()
    got = the_result(r)
    # every rank's Ray node, each with its share of this node's CPUs
    share = max(1, len(os.sched_getaffinity(0)) // 4)
    assert got["nodes"] == 4 and got["cpus"] == 4 * share, got
    rc, out = got["stranger"]
    assert rc != 0 and "STRANGER JOINED" not in out, out
    assert "AuthenticationError" in out and "InvalidAuthToken" in out, out
    assert got["mode"] == "token", got
    # One line from distkernel, none of Ray's start banners (one a rank).
    assert "Ray cluster of 4 nodes at 127.0.0.1:" in r.stdout, r.stdout
    assert "Ray runtime started" not in r.stdout and "Next steps" not in r.stdout, r.stdout
    assert_stopped_everywhere(recorded, r)


@pytest.mark.timeout(RUN + GONE_WITHIN + 60)
def test_ray_init_with_a_failing_driver_stops_ray_on_every_rank(kernel, recorded):
    r = kernel.execute(INIT_FAILING, timeout=RUN)
    assert r.status == "error", r.describe()
    assert "the driver fails on purpose" in r.describe(), r.describe()
    assert_stopped_everywhere(recorded, r, world=2)


@pytest.mark.timeout(RUN + GONE_WITHIN + 60)
def test_an_interrupt_while_the_driver_runs_stops_ray_on_every_rank(kernel, recorded):
    msg_id = kernel.start_execute(INIT_SLEEPING)
    support.wait_announced(kernel, msg_id, world=1, timeout=RUN)
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=120)
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert_stopped_everywhere(recorded, r, world=2)

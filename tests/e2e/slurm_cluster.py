"""
The simulated Slurm cluster for the end-to-end tests of the Slurm launcher.

`slurm_cluster` brings tests/slurm/cluster.sh's cluster up on first use and
down at the end of the session, when it was the one that started it (a cluster
already up, e.g. brought up by scripts/test.sh for the whole run or under
tests/slurm/with_cluster.sh, is reused and left up). Only the tests that ask
for it pay for it. The Slurm test files are split over two such clusters, A and
B (GROUP_B_FILES below), so that two pytest-xdist workers run them side by side. It skips, with the reason,
only where the cluster cannot run at all (not root, no network namespaces), and
never on CI, which runs as root: there it fails instead.

The fixture's object gives the client environment (`env`, with SLURM_CONF) for
a kernel or a command, and fault injection: `kill(node)` crashes a node (every
process in it SIGKILLed, its network gone), `start(node)` boots it again.
`slurm_mem_cluster` is a second, smaller one (2 nodes, no GPUs) where memory
is a consumable resource (SelectTypeParameters=CR_CPU_Memory, DefMemPerCPU
unset, as many sites have it), in its own folder, network and bridge
(DISTKERNEL_SLURM_SIM_MEM_DIR, _MEM_NET, _MEM_BRIDGE; defaults
/tmp/distkernel-slurm-mem, 10.79.2, dkslurm2), brought up and down the same way.
`srun_workaround` says whether the cluster has the workaround for Slurm bug
16401 (an srun that hangs after a node loss); DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND=0
brings one up without it, as a site whose login host is no node of the cluster.
"""
import os
import pathlib
import subprocess
import time

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "slurm"
CLUSTER = SCRIPTS / "cluster.sh"


def unavailable():
    """Why the cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces and a bridge)"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True)
    if probe.returncode != 0:
        return ("the Slurm test cluster needs network namespaces, and 'unshare --net --uts' "
                f"fails here: {probe.stderr.decode(errors='replace').strip()}")
    return None


def cluster_sh(*args, env=None, timeout=120):
    """Run cluster.sh ARGS; its stdout, or an AssertionError with what it said."""
    run = subprocess.run([str(CLUSTER), *args], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert run.returncode == 0, f"cluster.sh {' '.join(args)} failed:\n{run.stderr}{run.stdout}"
    return run.stdout


class SlurmCluster:
    def __init__(self, nodes, conf, env, started, up_s, srun_workaround=True):
        self.nodes = nodes
        self.srun_workaround = srun_workaround
        self.conf = conf
        self.env = env            # os.environ plus SLURM_CONF, for a client of the cluster
        self.started = started    # True: this session brought it up (and takes it down)
        self.up_s = up_s          # seconds the bring-up took

    def node_names(self):
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def run(self, *argv, timeout=60):
        """A Slurm command (sinfo, squeue, ...) against the cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    sh_env = None                 # cluster.sh's environment (which cluster); None: ours

    def kill(self, node):
        cluster_sh("kill", node, env=self.sh_env)

    def start(self, node, timeout=60):
        """Boot NODE again and wait until it runs a step: slurmctld may call a
        rebooted node idle a moment before its slurmd takes step launches
        ("Communication connection failure"), and the next test must not be
        the one to find out."""
        cluster_sh("start", node, env=self.sh_env)
        deadline = time.monotonic() + timeout
        self.wait_state(node, {"idle"}, timeout=timeout)
        while time.monotonic() < deadline:
            try:
                if self.run("srun", "-w", node, "-N1", "-n1", "true", timeout=30).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)

    def boot(self, node):
        """Boot NODE again, without waiting for it to take steps (see start)."""
        cluster_sh("start", node, env=self.sh_env)

    def cut(self, node):
        """Cut NODE off the network (no FIN, no RST): its processes run on, unheard."""
        self.exec(node, "ip", "link", "set", "eth0", "down")

    def reconnect(self, node, timeout=60):
        """Put NODE back on the network and wait until it is idle. Cut off for
        longer than SlurmdTimeout, slurmctld has set it DOWN and would take it
        back only at its next ping of down nodes (up to a minute here): a site's
        admin resumes such a node, and so does this, so that the next test
        does not wait for it in the queue."""
        self.exec(node, "ip", "link", "set", "eth0", "up")
        if self.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip().startswith("down"):
            self.run("scontrol", "update", f"nodename={node}", "state=resume")
        return self.wait_state(node, {"idle"}, timeout=timeout)

    def kernel_env(self, log_dir):
        """The environment of a kernel started from a kernelspec of its own
        (not the fixtures' kernel): the cluster's Slurm, none of its default
        Slurm options, its logs in LOG_DIR, no tracking."""
        env = {k: v for k, v in self.env.items()
               if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_"))
               and k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
        env.update(SLURM_CONF=self.conf, DISTKERNEL_LOG_DIR=str(log_dir), MLFLOW_TRACKING_URI="")
        return env

    def exec(self, node, *argv):
        """Run ARGV inside NODE of this cluster (not of another one beside it)."""
        return cluster_sh("exec", node, *argv, env=self.sh_env)

    def pids(self, node):
        return [int(p) for p in cluster_sh("pids", node, env=self.sh_env).split()]

    def wait_state(self, node, states, timeout=60):
        """Wait until sinfo shows NODE in one of STATES; the last state seen."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
            if state in states:
                break
            time.sleep(0.1)
        return state


# What conftest.py's templates_for_the_file sets for a module's kernels.
TEMPLATE_VARS = ("DISTKERNEL_WARM", "DISTKERNEL_WARM_TORCH")


def bring_up(nodes=2, env=None):
    start = time.monotonic()
    out = cluster_sh("up", str(nodes), env=env)
    up_s = time.monotonic() - start
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # Not how the templates are built: a module may set that while the cluster
    # comes up (conftest.py's templates_for_the_file), and the cluster outlives
    # the module.
    client_env = {k: v for k, v in (env or os.environ).items() if k not in TEMPLATE_VARS}
    client_env["SLURM_CONF"] = values["SLURM_CONF"]
    cluster = SlurmCluster(nodes, values["SLURM_CONF"], client_env,
                           out.splitlines()[-1] == "started", up_s,
                           values.get("DISTKERNEL_SLURM_SIM_SRUN_WORKAROUND", "1") == "1")
    cluster.login_addr = values["DISTKERNEL_SLURM_SIM_LOGIN_ADDR"]  # this host, to the nodes
    cluster.sh_env = env
    return cluster


def session_cluster(env=None, nodes=2):
    """Bring a cluster of NODES up for the session (or skip, or fail on CI, saying
    why), yield it, and take it down if this session started it."""
    why = unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI runs as root and must run the Slurm tests", pytrace=False)
        pytest.skip(why)
    cluster = bring_up(nodes, env=env)
    yield cluster
    if cluster.started:
        cluster_sh("down", env=env)
        left = subprocess.run([str(CLUSTER), "leftovers"], capture_output=True, text=True,
                              env=env)
        assert left.returncode == 0, f"the test cluster left this behind:\n{left.stdout}"


# The Slurm tests are the longest group of the suite, and tests of one cluster
# cannot run side by side (some crash its nodes, most want all its CPUs). So
# they are split over two clusters of the same shape, A (the default one, which
# scripts/test.sh brings up for the whole run) and B, and pytest-xdist runs the
# two groups on two workers at once (conftest.py). The files of group B, so
# that each group takes about as long in both of scripts/test.sh's passes
# (test_slurm_runs.py alone is most of group A):
GROUP_B_FILES = {"test_slurm_pool.py", "test_slurm_gpus.py", "test_slurm_env.py",
                 "test_slurm_folders.py", "test_environments.py", "test_slurm_warm.py",
                 "test_slurm_flood.py",
                 # Real Ray: `ray stop` stops every Ray process on the host, the
                 # simulated nodes' too, so the one-node file (SLURM_GROUP) runs
                 # here, in turn with the Slurm one
                 "test_slurm_ray.py", "test_today_ray.py"}


def group_of(path):
    """The xdist group of the Slurm tests in the file at PATH."""
    return "slurm-b" if pathlib.Path(str(path)).name in GROUP_B_FILES else "slurm-a"


def cluster_b_env():
    """Cluster B's environment for cluster.sh: A's folder, network and bridge
    (the DISTKERNEL_SLURM_SIM_* variables or their defaults), each moved aside,
    so that whoever gives A a place of its own gives B one too."""
    a_dir = os.environ.get("DISTKERNEL_SLURM_SIM_DIR", "/tmp/distkernel-slurm")
    a_net = os.environ.get("DISTKERNEL_SLURM_SIM_NET", "10.79.0").split(".")
    b_net = ".".join(a_net[:2] + [str((int(a_net[2]) + 40) % 256)])
    a_bridge = os.environ.get("DISTKERNEL_SLURM_SIM_BRIDGE", "dkslurm0")
    return dict(os.environ,
                DISTKERNEL_SLURM_SIM_DIR=os.environ.get("DISTKERNEL_SLURM_SIM_B_DIR", a_dir + "-b"),
                DISTKERNEL_SLURM_SIM_NET=os.environ.get("DISTKERNEL_SLURM_SIM_B_NET", b_net),
                # cluster.sh takes bridge names of at most 9 characters
                DISTKERNEL_SLURM_SIM_BRIDGE=os.environ.get("DISTKERNEL_SLURM_SIM_B_BRIDGE",
                                                           a_bridge[:8] + "b"))


@pytest.fixture(scope="session")
def slurm_cluster_a():
    yield from session_cluster()


@pytest.fixture(scope="session")
def slurm_cluster_b():
    # DISTKERNEL_SLURM_SIM_ONE_CLUSTER=1: B is A (one cluster, tests in turn).
    if os.environ.get("DISTKERNEL_SLURM_SIM_ONE_CLUSTER") == "1":
        yield from session_cluster()
    else:
        yield from session_cluster(cluster_b_env())


@pytest.fixture(scope="module")
def slurm_cluster(request):
    """The cluster of this module's group (above)."""
    return request.getfixturevalue(
        "slurm_cluster_b" if group_of(request.path) == "slurm-b" else "slurm_cluster_a")


@pytest.fixture(scope="session")
def slurm_mem_cluster():
    env = dict(os.environ,
               DISTKERNEL_SLURM_SIM_DIR=os.environ.get("DISTKERNEL_SLURM_SIM_MEM_DIR",
                                                       "/tmp/distkernel-slurm-mem"),
               DISTKERNEL_SLURM_SIM_NET=os.environ.get("DISTKERNEL_SLURM_SIM_MEM_NET", "10.79.2"),
               DISTKERNEL_SLURM_SIM_BRIDGE=os.environ.get("DISTKERNEL_SLURM_SIM_MEM_BRIDGE",
                                                          "dkslurm2"),
               DISTKERNEL_SLURM_SIM_SELECT="CR_CPU_Memory", DISTKERNEL_SLURM_SIM_GPUS="0")
    yield from session_cluster(env)


SCALE_NODES = 16
SCALE_CPUS = 16


@pytest.fixture(scope="session")
def slurm_scale_cluster():
    """16 nodes of 16 CPUs, no GPUs: room for a 256-rank run (tests/e2e/test_slurm_scale.py),
    in its own folder, network and bridge (DISTKERNEL_SLURM_SIM_SCALE_DIR, _SCALE_NET,
    _SCALE_BRIDGE; defaults /tmp/distkernel-slurm-scale, 10.79.3, dkslurm3). Its tests
    run alone (they use every CPU of the machine), so it is up only while they run."""
    env = dict(os.environ,
               DISTKERNEL_SLURM_SIM_DIR=os.environ.get("DISTKERNEL_SLURM_SIM_SCALE_DIR",
                                                       "/tmp/distkernel-slurm-scale"),
               DISTKERNEL_SLURM_SIM_NET=os.environ.get("DISTKERNEL_SLURM_SIM_SCALE_NET",
                                                       "10.79.3"),
               DISTKERNEL_SLURM_SIM_BRIDGE=os.environ.get("DISTKERNEL_SLURM_SIM_SCALE_BRIDGE",
                                                          "dkslurm3"),
               DISTKERNEL_SLURM_SIM_CPUS=str(SCALE_CPUS), DISTKERNEL_SLURM_SIM_GPUS="0")
    yield from session_cluster(env, nodes=SCALE_NODES)

"""
Fixtures for the end-to-end tests: where the installed kernel is, a kernel shared by
the tests of a module, a fresh kernel for tests that end it, and raw sockets on it.

The kernel under test is the one `meson install` put under DISTKERNEL_PREFIX (default
./prefix of this checkout, scripts/build.sh's); JUPYTER_PATH is pointed there for the whole session, subprocesses
(nbconvert, jupyter execute) included.
"""
import os
import random
import socket

import pytest
import zmq
from jupyter_client.connect import LocalPortCache

import support

if support.KERNEL_NAME == "distkernel":
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        p for p in [str(support.JUPYTER_DATA), os.environ.get("JUPYTER_PATH", "")] if p)


# The kernels' ports. jupyter_client picks a port by binding port 0 and
# closing it, and the kernel binds it a moment later; any process that binds
# or connects in between may get the same port from the system's ephemeral
# range (32768-60999 here). With four workers starting kernels, ranks, gloo
# and back channels at once, one did: "cannot bind the hb channel ... Address
# already in use", a kernel dead at start. So each worker hands out ports of
# a band of its own below that range (and below the 20000-32767 of the
# ranks' MASTER_PORT): no ephemeral port and no other worker's kernel can
# take them. A process outside xdist (a single pytest, the SIGINT-ignored
# stage beside other suites) takes the last band, at random.
PORT_BAND = 1000


def _port_band():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < 8:
        return 10000 + int(worker[2:]) * PORT_BAND, False
    return 10000 + 8 * PORT_BAND, True


def _find_port_in_band(self, ip):
    """LocalPortCache.find_available_port, from this process's band: the next
    free port after the last one given (a port just given back may still be
    in TIME_WAIT), starting at a random place (another test run beside this
    one has the same bands), or at a random place each time in the shared band."""
    low, shared = _port_band()
    if shared or not hasattr(self, "_dk_next"):
        self._dk_next = random.randrange(PORT_BAND)
    first = self._dk_next
    for i in range(PORT_BAND):
        port = low + (first + i) % PORT_BAND
        if port in self.currently_used_ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((ip, port))
            except OSError:
                continue
        self._dk_next = (first + i + 1) % PORT_BAND
        self.currently_used_ports.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{low + PORT_BAND - 1} for a kernel")


LocalPortCache.find_available_port = _find_port_in_band


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "soak: the long soak of one kernel (test_soak.py); -m 'not soak' leaves it out")
    config.addinivalue_line(
        "markers", "alone: needs the machine to itself (it measures time or CPU, or floods the "
        "kernel); scripts/test.sh runs these after the parallel part, one at a time")
    config.addinivalue_line(
        "markers", "quick: part of `scripts/test.sh --quick`, the contributors' few minutes")


SLURM_FIXTURES = {"slurm_cluster", "slurm_mem_cluster", "slurm_cluster_a", "slurm_cluster_b"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's `--dist loadgroup` (scripts/test.sh), keep each file on
    one worker, so that its module-scoped kernel is started once and its tests run
    in their order, and put the tests of each simulated Slurm cluster on one
    worker: they share the cluster, and some of them crash a node
    (slurm_cluster.py splits them over two clusters). The Slurm tests go first,
    since theirs are the longest groups and the others fill the remaining
    workers around them; then the soak, the longest single test (1-2 min),
    so that it does not start last and run on alone. A file with
    SLURM_GROUP = True joins the Slurm group of its name without a cluster
    (test_today_ray.py: `ray stop` stops every Ray process on the host, the
    simulated nodes' included, so it must not run beside test_slurm_ray.py)."""
    def slurm(item):
        return (bool(SLURM_FIXTURES & set(getattr(item, "fixturenames", ())))
                or getattr(getattr(item, "module", None), "SLURM_GROUP", False))

    for item in items:
        group = slurm_group_of(item.path) if slurm(item) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    # stable: file order is kept within each
    items.sort(key=lambda item: (not slurm(item), item.get_closest_marker("soak") is None))


# Every first run of a kernel builds a warm-start template that imports torch
# (and on Slurm, every run does, on each of its nodes): 2-3 s of CPU each, half
# of the CPU that the end-to-end tests used (process accounting), for cells
# most of which never import torch. So the files run as users do, with torch
# in their templates, only where that is what they test or their cells use
# torch (TORCH_FILES). In the others' kernels:
# - by default, the templates import no torch (DISTKERNEL_WARM_TORCH=0): every
#   run still forks its ranks from a template, on this node and on the Slurm
#   nodes, and a cell that uses torch imports it in its ranks, as a cold rank
#   does;
# - with DISTKERNEL_E2E_COLD=1 (scripts/test.sh's sanitizer pass), the ranks
#   start cold (DISTKERNEL_WARM=0) in every file but TEMPLATE_FILES: the
#   templates' C paths (the fork server, its socket, started ranks, the
#   agents' templates) and the cells that use torch most.
TEMPLATE_FILES = {"test_warm.py", "test_slurm_warm.py", "test_soak.py", "test_pool.py",
                  "test_distributed.py", "test_stacks.py", "test_stall.py"}
TORCH_FILES = TEMPLATE_FILES | {"test_distributed_failures.py", "test_faults.py",
                                "test_today_data.py", "test_today_checkpoint.py",
                                "test_platform.py", "test_ray_trust.py", "test_slurm_gpus.py"}


@pytest.fixture(scope="module", autouse=True)
def templates_for_the_file(request):
    name = request.path.name
    if os.environ.get("DISTKERNEL_E2E_COLD") == "1":
        setting = None if name in TEMPLATE_FILES else ("DISTKERNEL_WARM", "0")
    else:
        setting = None if name in TORCH_FILES else ("DISTKERNEL_WARM_TORCH", "0")
    if setting is None:
        yield
        return
    var, value = setting
    before = os.environ.get(var)
    os.environ[var] = value   # every kernel this module starts inherits it
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = before


@pytest.fixture(scope="session", autouse=True)
def kernelspec_installed():
    """Fail every test with one clear message when there is no kernel to test."""
    if support.KERNEL_NAME != "distkernel":
        return None
    spec = support.KERNELSPEC_DIR / "kernel.json"
    if not spec.is_file():
        pytest.fail(
            f"no distkernel kernelspec at {spec}.\n"
            f"Build and install the kernel first:\n"
            f"  meson setup build --prefix={support.PREFIX} && ninja -C build && meson install -C build\n"
            f"or point DISTKERNEL_PREFIX at the prefix you installed into.",
            pytrace=False)
    return spec


@pytest.fixture(scope="module")
def kernel(kernelspec_installed):
    """One kernel for all the tests of a module that leave it usable."""
    k = support.Kernel.start()
    yield k
    k.stop()


@pytest.fixture
def fresh_kernel(kernelspec_installed):
    """A kernel of its own, for tests that interrupt, restart or end it."""
    k = support.Kernel.start()
    yield k
    k.kc.stop_channels()
    try:
        k.km.shutdown_kernel(now=True)
    except Exception:
        pass


@pytest.fixture
def raw_shell(kernel):
    ch = support.RawChannel(kernel.connection_info(), "shell")
    yield ch
    ch.close()


@pytest.fixture
def raw_control(kernel):
    ch = support.RawChannel(kernel.connection_info(), "control")
    yield ch
    ch.close()


@pytest.fixture
def heartbeat(kernel):
    """A REQ socket on the kernel's heartbeat port."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.linger = 0
    sock.connect(support.endpoint(kernel.connection_info(), "hb"))
    yield sock
    sock.close(0)
    ctx.term()


# The simulated Slurm cluster (tests/slurm/), for the tests that ask for it.
from slurm_cluster import (slurm_cluster, slurm_cluster_a, slurm_cluster_b,  # noqa: E402,F401
                           slurm_mem_cluster, slurm_scale_cluster)
from slurm_cluster import group_of as slurm_group_of  # noqa: E402

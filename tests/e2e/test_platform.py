"""The rest of the managed platform's surface, end to end: GPUType and
AcceleratorType, the old option names under databricks.air and serverless_gpu,
ray_launch and ray_init against a stand-in `ray` (tests/e2e/fake_ray.py, which
records every command, its environment and the order), the storage modules,
and %%distributed? listing it all. Each name is used in the kernel and in ranks.

Ray cannot be installed here: the stand-in proves the order of starts and
stops, RAY_ADDRESS in the driver, and `ray stop` on every rank after a failing
driver and after an interrupt; nothing here runs against a real Ray cluster.
"""
import json
import os
import sys
import time

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="the platform's surface is distkernel's")

RUN = 180  # seconds: ranks importing torch on a busy 2-core machine
FAKE_RAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_ray.py")


def warnings_in(r, word):
    return [line for line in (r.stderr + r.stdout).splitlines()
            if "FutureWarning" in line and word in line]


# -- GPUType and AcceleratorType -----------------------------------------------------

@pytest.mark.timeout(60)
def test_gpu_types_are_strings_with_the_platforms_members(kernel):
    r = kernel.execute(
        "from serverless_gpu import GPUType\n"
        "from databricks.air import AcceleratorType\n"
        "print(([m.value for m in GPUType], [m.value for m in AcceleratorType],\n"
        " GPUType.H100 == 'H100', f'{AcceleratorType.GPU_8xH100}', str(GPUType.A10),\n"
        " isinstance(GPUType.B300, str), GPUType('h100') is GPUType.H100))")
    assert r.status == "ok", r.describe()
    assert r.stdout == ("(['A10', 'H100', 'B300'], ['GPU_1xA10', 'GPU_1xH100', 'GPU_8xH100', "
                        "'GPU_8xB300'], True, 'GPU_8xH100', 'A10', True, True)\n"), r.describe()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code,known", [
    ("from serverless_gpu import GPUType\nGPUType.H200", "A10, H100, B300"),
    ("from serverless_gpu import GPUType\nGPUType('Z9')", "A10, H100, B300"),
    ("from databricks.air import AcceleratorType\nAcceleratorType.GPU_8xH200",
     "GPU_1xA10, GPU_1xH100, GPU_8xH100, GPU_8xB300"),
])
def test_an_unknown_member_is_an_error_listing_the_known_ones(kernel, code, known):
    r = kernel.execute(code)
    assert r.status == "error", r.describe()
    assert known in r.content["evalue"], r.describe()


@pytest.mark.timeout(60)
def test_the_magic_knows_the_same_types_as_the_enums(fake_node):
    """The C side judges strings against its own copy of the members."""
    r = fake_node.execute(
        "%%distributed accelerator_type=GPU_2xZ100 tracking=False\n1")
    assert r.status == "error", r.describe()
    lists = fake_node.execute(
        "from serverless_gpu import GPUType\nfrom databricks.air import AcceleratorType\n"
        "print(', '.join(AcceleratorType)); print(', '.join(GPUType))")
    accelerators, gpus = lists.stdout.splitlines()
    evalue = r.content["evalue"]
    assert f"accelerator_type {accelerators}; gpu_type {gpus}" in evalue, evalue
    assert "2 × NVIDIA H200 (H200)" in evalue, evalue


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    """A kernel on a modelled node of 2 NVIDIA H200 (tests/unit/fake_cuda.c)."""
    built = os.path.abspath(os.environ.get("DISTKERNEL_FAKE_CUDA", ""))
    assert os.environ.get("DISTKERNEL_FAKE_CUDA"), (
        "DISTKERNEL_FAKE_CUDA must name the folder holding the fake CUDA libraries "
        "(BUILD/tests/unit); scripts/test.sh sets it")
    libs = tmp_path_factory.mktemp("fake-cuda")
    for name, source in {"libnvidia-ml.so.1": "libfake_nvml.so",
                         "libcudart.so.13": "libfake_cudart.so",
                         "libnccl.so.2": "libfake_nccl.so"}.items():
        os.symlink(os.path.join(built, source), libs / name)
    env = support.kernel_env(LD_LIBRARY_PATH=str(libs), FAKE_GPUS="2",
                             FAKE_GPU_NAME="NVIDIA H200", CUDA_VISIBLE_DEVICES=None,
                             DISTKERNEL_CUDART_LIB=str(libs / "libcudart.so.13"),
                             DISTKERNEL_NCCL_LIB=str(libs / "libnccl.so.2"))
    k = support.Kernel.start(env=env)
    yield k
    k.stop()


GPU_FUNCTION = (
    "def where():\n"
    "    import os\n"
    "    from serverless_gpu import GPUType\n"
    "    from databricks.air import AcceleratorType\n"
    "    return (int(os.environ['LOCAL_RANK']), GPUType.H100 == 'H100',\n"
    "            AcceleratorType.GPU_8xH100.value)\n")


@pytest.mark.timeout(RUN)
@pytest.mark.parametrize("package,option", [
    ("serverless_gpu", "gpus=2, gpu_type=GPUType.H100"),
    ("databricks.air", "accelerator_type=AcceleratorType.GPU_1xH100"),
])
def test_a_platform_type_runs_on_an_h200_node_with_a_notice(fake_node, package, option):
    enum = "GPUType" if package == "serverless_gpu" else "AcceleratorType"
    r = fake_node.execute(
        f"from {package} import distributed, {enum}\n"
        f"@distributed({option}, tracking=False)\n" + GPU_FUNCTION +
        "where.distributed()", timeout=RUN)
    assert r.status == "ok", r.describe()
    ranks = 2 if package == "serverless_gpu" else 1
    assert r.result == repr([(i, True, 'GPU_8xH100') for i in range(ranks)]), r.describe()
    notices = [line for line in r.stderr.splitlines() if "managed platform's H100" in line]
    assert len(notices) == 1, r.stderr
    assert "2 × NVIDIA H200 (H200)" in notices[0], notices
    assert not warnings_in(r, "deprecated"), r.stderr


@pytest.mark.timeout(RUN)
def test_the_magic_takes_a_platform_type_on_an_h200_node(fake_node):
    r = fake_node.execute("%%distributed accelerator_type=AcceleratorType.GPU_1xH100 "
                          "tracking=False\n"
                          "import os\nos.environ['WORLD_SIZE']", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: '1'", r.describe()
    assert "accelerator_type=GPU_1xH100 is the managed platform's H100" in r.stderr, r.stderr


@pytest.mark.timeout(RUN)
def test_the_nodes_own_model_runs_without_a_notice(fake_node):
    r = fake_node.execute("%%distributed accelerator_type=GPU_2xH200 tracking=False\n7",
                          timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "managed platform" not in r.stderr, r.stderr


# -- old option names -----------------------------------------------------------------

@pytest.mark.timeout(60)
def test_old_names_under_databricks_air_warn_once_per_call_site(fresh_kernel):
    k = fresh_kernel
    define = ("from databricks.air import distributed, AcceleratorType\n"
              "def make():\n"
              "    @distributed(gpus=2, gpu_type='H100')\n"
              "    def f():\n"
              "        return 1\n"
              "    return f\n")
    r = k.execute(define + "make(); make()")
    assert r.status == "ok", r.describe()
    gpus, gpu_type = warnings_in(r, "gpus="), warnings_in(r, "gpu_type=")
    assert len(gpus) == 1 and "num_accelerators=" in gpus[0], r.stderr
    assert len(gpu_type) == 1 and "accelerator_type=" in gpu_type[0], r.stderr
    assert "version 7" in gpus[0], gpus
    # The same line again says nothing; another line says it again.
    again = k.execute("make()")
    assert not warnings_in(again, "deprecated"), again.stderr
    other = k.execute("from databricks.air import distributed\n"
                      "@distributed(gpus=2)\n"
                      "def g():\n"
                      "    return 1\n")
    assert len(warnings_in(other, "gpus=")) == 1, other.stderr


@pytest.mark.timeout(60)
def test_old_names_under_serverless_gpu_are_its_names_and_do_not_warn(kernel):
    r = kernel.execute("from serverless_gpu import distributed, GPUType\n"
                       "@distributed(gpus=2, gpu_type=GPUType.H100)\n"
                       "def f():\n"
                       "    return 1\n"
                       "f.distributed()")
    # No GPU here: the run is refused, and nothing on the way calls the names deprecated.
    assert r.status == "error" and "num_processes" in r.content["evalue"], r.describe()
    assert "FutureWarning" not in r.stderr and "deprecated" not in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_the_warning_is_a_python_future_warning_that_filters_control(kernel):
    r = kernel.execute("import warnings\n"
                       "from databricks.air import distributed\n"
                       "with warnings.catch_warnings():\n"
                       "    warnings.simplefilter('error')\n"
                       "    try:\n"
                       "        distributed(gpus=1)\n"
                       "    except FutureWarning as w:\n"
                       "        caught = str(w)\n"
                       "caught")
    assert r.status == "ok", r.describe()
    assert "use num_accelerators=" in r.result, r.describe()


# -- data modules --------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("package", ["serverless_gpu", "databricks.air"])
def test_the_storage_names_are_distkernels(kernel, package):
    # The dataset needs torch (Debian's 1.13 here); the writer and reader need
    # torch 2's distributed checkpoint, which test_today_checkpoint.py uses.
    r = kernel.execute(f"from {package}.data import UCVolumeDataset\n"
                       "from distkernel.data import VolumeDataset\n"
                       "UCVolumeDataset is VolumeDataset")
    assert r.status == "ok" and r.result == "True", r.describe()
    r = kernel.execute(f"import {package}.data as data\nsorted(data.__all__)")
    assert r.result == "['UCVolumeDataset', 'UCVolumeReader', 'UCVolumeWriter']", r.describe()
    r = kernel.execute(f"import {package}.data as data\ndata.UCVolumeTable")
    assert r.status == "error" and r.content["ename"] == "AttributeError", r.describe()
    assert "UCVolumeDataset, UCVolumeWriter, UCVolumeReader" in r.content["evalue"], r.describe()


@pytest.mark.timeout(60)
def test_the_checkpoint_names_on_an_old_torch_say_what_they_need(kernel):
    r = kernel.execute("import torch\ntorch.__version__")
    if not r.result.startswith("'1."):
        pytest.skip("the kernel's torch has the distributed checkpoint")
    r = kernel.execute("from databricks.air.data import UCVolumeReader")
    assert r.status == "error" and r.content["ename"] == "ImportError", r.describe()
    assert "torch 2.4 or later" in r.content["evalue"], r.describe()
    after = kernel.execute("from serverless_gpu import distributed\n'still here'")
    assert after.status == "ok", after.describe()


# -- every name in ranks --------------------------------------------------------------

@pytest.mark.timeout(RUN)
def test_every_name_imports_in_ranks(kernel):
    r = kernel.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2, tracking=False)\n"
        "def names():\n"
        "    from serverless_gpu import GPUType, ray_init, distributed\n"
        "    from serverless_gpu.ray import ray_launch\n"
        "    from databricks.air import AcceleratorType, ray_init, ray_launch, distributed\n"
        "    from databricks.air.ray import ray_launch\n"
        "    from databricks.air.data import UCVolumeDataset\n"
        "    data = UCVolumeDataset.__name__\n"
        "    return (GPUType.B300.value, AcceleratorType('gpu_1xa10').value, ray_launch.__name__,\n"
        "            ray_init.__name__, data)\n"
        "print(names.distributed())", timeout=RUN)
    assert r.status == "ok", r.describe()
    one = "('B300', 'GPU_1xA10', 'ray_launch', 'ray_init', 'VolumeDataset')"
    assert r.stdout.endswith(f"[{one}, {one}]\n"), r.describe()


# -- ray_launch and ray_init ----------------------------------------------------------

class RayNode:
    """A kernel whose ranks find the stand-in `ray` first on PATH; `records()`
    reads what it was asked, in order."""

    def __init__(self, tmp_path, **extra):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        os.symlink(FAKE_RAY, bin_dir / "ray")
        self.log = tmp_path / "ray.jsonl"
        env = support.kernel_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                 FAKE_RAY_LOG=str(self.log), **extra)
        self.kernel = support.Kernel.start(env=env)

    def records(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def wait_records(self, predicate, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = self.records()
            if predicate(recs):
                return recs
            time.sleep(0.1)
        return self.records()

    def stop(self):
        self.kernel.stop()


@pytest.fixture
def ray_node(tmp_path):
    node = RayNode(tmp_path)
    yield node
    node.stop()


DRIVER = (
    "def log_driver():\n"
    "    import json, os, time\n"
    "    entry = {'event': 'driver', 'rank': os.environ['RANK'],\n"
    "             'RAY_ADDRESS': os.environ.get('RAY_ADDRESS'), 'time': time.time()}\n"
    "    with open(os.environ['FAKE_RAY_LOG'], 'a') as f:\n"
    "        f.write(json.dumps(entry) + '\\n')\n")


def starts_and_stops(recs):
    head = [r for r in recs if r["event"] == "start" and "--head" in r["argv"]]
    workers = [r for r in recs if r["event"] == "start" and "--head" not in r["argv"]]
    stops = [r for r in recs if r["event"] == "stop"]
    return head, workers, stops


def assert_one_cluster_in_order(recs, world=2):
    """Head first, then every other rank joining it; the driver after every
    start; every rank's `ray stop` after the driver."""
    head, workers, stops = starts_and_stops(recs)
    assert len(head) == 1 and head[0]["rank"] == "0", recs
    address = next(a.split("=", 1)[1] for a in head[0]["argv"] if a.startswith("--port="))
    assert sorted(w["rank"] for w in workers) == [str(r) for r in range(1, world)], recs
    for w in workers:
        assert w["argv"][1].startswith("--address=") and w["argv"][1].endswith(":" + address), w
        assert w["time"] >= head[0]["time"], recs
    assert sorted(s["rank"] for s in stops) == [str(r) for r in range(world)], recs
    last_start = max(r["time"] for r in head + workers)
    assert all(s["time"] >= last_start for s in stops), recs
    return head[0], workers, stops


@pytest.mark.timeout(RUN)
@pytest.mark.parametrize("module", ["serverless_gpu.ray", "databricks.air.ray"])
def test_ray_launch_runs_the_driver_on_rank_0_of_a_cluster_of_the_ranks(ray_node, module):
    k = ray_node.kernel
    r = k.execute(
        f"from {module} import ray_launch\n" + DRIVER +
        "@ray_launch(num_processes=2, tracking=False)\n"
        "def drive(x):\n"
        "    import os\n"
        "    log_driver()\n"
        "    print('driver on rank', os.environ['RANK'])\n"
        "    return (x, os.environ['RANK'], os.environ['RAY_ADDRESS'])\n"
        "drive.distributed(41)", timeout=RUN)
    assert r.status == "ok", r.describe()
    recs = ray_node.records()
    head, workers, stops = assert_one_cluster_in_order(recs)
    port = next(a.split("=", 1)[1] for a in head["argv"] if a.startswith("--port="))
    assert r.result == f"(41, '0', '127.0.0.1:{port}')", r.describe()
    drivers = [x for x in recs if x["event"] == "driver"]
    assert len(drivers) == 1 and drivers[0]["RAY_ADDRESS"] == f"127.0.0.1:{port}", recs
    assert drivers[0]["time"] >= max(w["time"] for w in workers), recs
    assert all(s["time"] >= drivers[0]["time"] for s in stops), recs
    assert "[rank 0] driver on rank 0" in r.stdout, r.stdout
    assert "Ray cluster of 2 nodes at 127.0.0.1:" in r.stdout, r.stdout
    # CPU ranks: each Ray node is told it has no GPU.
    assert all("--num-gpus=0" in x["argv"] for x in [head, *workers]), recs


@pytest.mark.timeout(RUN)
def test_ray_stop_runs_on_every_rank_after_a_failing_driver(ray_node):
    k = ray_node.kernel
    r = k.execute(
        "from databricks.air import ray_launch\n"
        "@ray_launch(num_processes=2, tracking=False)\n"
        "def drive():\n"
        "    raise ValueError('the driver broke')\n"
        "drive.distributed()", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "the driver broke" in r.content["evalue"], r.describe()
    # The root cause starts at the user's function, not in distkernel's Ray code.
    assert not any("_ray.py" in line for line in r.content["traceback"]), r.describe()
    assert any("in drive" in line for line in r.content["traceback"]), r.describe()
    recs = ray_node.wait_records(lambda recs: len(starts_and_stops(recs)[2]) >= 2)
    assert_one_cluster_in_order(recs)


@pytest.mark.timeout(RUN)
def test_ray_stop_runs_on_every_rank_after_an_interrupt(tmp_path):
    # A `ray stop` that takes 1 s, as real ones take a few: it must finish even
    # though the kernel is ending the ranks meanwhile.
    node = RayNode(tmp_path, FAKE_RAY_STOP_SLEEP="1")
    try:
        k = node.kernel
        msg_id = k.start_execute(
            "from serverless_gpu.ray import ray_launch\n" + DRIVER +
            "@ray_launch(num_processes=2, tracking=False)\n"
            "def drive():\n"
            "    import time\n"
            "    log_driver()\n"
            "    time.sleep(600)\n"
            "drive.distributed()")
        recs = node.wait_records(lambda recs: any(x["event"] == "driver" for x in recs),
                                 timeout=RUN - 30)
        assert any(x["event"] == "driver" for x in recs), recs
        k.km.interrupt_kernel()
        r = k.finish(msg_id, timeout=60)
        assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
        recs = node.wait_records(
            lambda recs: len([x for x in recs if x["event"] == "stopped"]) >= 2)
        assert_one_cluster_in_order(recs)
        stopped = sorted(x["rank"] for x in recs if x["event"] == "stopped")
        assert stopped == ["0", "1"], recs
        # `ray stop` ran in a session of its own, out of reach of the ranks' ending.
        for stop in starts_and_stops(recs)[2]:
            assert stop["sid"] == stop["pid"], stop
        after = k.execute("'alive'")
        assert after.status == "ok", after.describe()
    finally:
        node.stop()


@pytest.mark.timeout(RUN)
def test_ray_stop_runs_on_every_rank_after_the_timeout(ray_node):
    k = ray_node.kernel
    r = k.execute(
        "from serverless_gpu.ray import ray_launch\n" + DRIVER +
        "@ray_launch(num_processes=2, tracking=False, timeout=20)\n"
        "def drive():\n"
        "    import time\n"
        "    log_driver()\n"
        "    time.sleep(600)\n"
        "drive.distributed()", timeout=RUN)
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    recs = ray_node.wait_records(lambda recs: len(starts_and_stops(recs)[2]) >= 2)
    assert_one_cluster_in_order(recs)
    # The timeout came while the driver ran (20 s leaves a busy machine time to start).
    assert any(x["event"] == "driver" for x in recs), recs


@pytest.mark.timeout(RUN)
def test_ray_stop_runs_for_a_rank_killed_before_it_could(ray_node):
    # Rank 1 dies by SIGKILL once it has joined: it never runs its own
    # `ray stop`, so its watcher must. Rank 0, the driver, is ended by the
    # kernel and stops its node itself.
    k = ray_node.kernel
    r = k.execute(
        "%%distributed num_processes=2 tracking=False\n"
        "import os, signal, time\n"
        "from databricks.air import ray_init\n"
        "with ray_init() as cluster:\n"
        "    if not cluster.is_driver:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    time.sleep(600)\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "rank 1" in r.content["evalue"] and "SIGKILL" in r.content["evalue"], r.describe()
    recs = ray_node.wait_records(lambda recs: len(starts_and_stops(recs)[2]) >= 2)
    assert_one_cluster_in_order(recs)
    stops = {x["rank"]: x for x in starts_and_stops(recs)[2]}
    # Out of reach of the signals to the rank's group: a session of its own.
    assert stops["1"]["sid"] == stops["1"]["pgid"], stops


@pytest.mark.timeout(RUN)
@pytest.mark.parametrize("which", ["head", "worker"])
def test_a_failing_ray_start_fails_the_run_and_every_started_node_is_stopped(tmp_path, which):
    node = RayNode(tmp_path, FAKE_RAY_FAIL=which)
    try:
        r = node.kernel.execute(
            "from databricks.air import ray_launch\n"
            "@ray_launch(num_processes=2, tracking=False)\n"
            "def drive():\n"
            "    return 'driver ran'\n"
            "drive.distributed()", timeout=RUN)
        assert r.status == "error", r.describe()
        failing = "0" if which == "head" else "1"
        assert f"failed with exit code 1 on rank {failing}" in r.content["evalue"], r.describe()
        assert "start failed (FAKE_RAY_FAIL)" in r.stdout + r.stderr, r.describe()
        head, workers, stops = starts_and_stops(node.wait_records(
            lambda recs: len(starts_and_stops(recs)[2]) >= (1 if which == "head" else 2)))
        started = sorted(x["rank"] for x in head + workers)
        assert sorted(x["rank"] for x in stops) == started, (started, stops)
        assert started == (["0"] if which == "head" else ["0", "1"]), started
    finally:
        node.stop()


@pytest.mark.timeout(RUN)
def test_ray_launch_on_gpus_gives_each_ray_node_its_ranks_gpu(tmp_path):
    built = os.path.abspath(os.environ["DISTKERNEL_FAKE_CUDA"])
    libs = tmp_path / "libs"
    libs.mkdir()
    os.symlink(os.path.join(built, "libfake_nvml.so"), libs / "libnvidia-ml.so.1")
    node = RayNode(tmp_path, LD_LIBRARY_PATH=str(libs), FAKE_GPUS="2",
                   FAKE_GPU_NAME="NVIDIA H200", CUDA_VISIBLE_DEVICES=None)
    try:
        r = node.kernel.execute(
            "from serverless_gpu import GPUType\n"
            "from serverless_gpu.ray import ray_launch\n"
            "@ray_launch(gpus=2, gpu_type=GPUType.H100, tracking=False)\n"
            "def drive():\n"
            "    return 'driver ran'\n"
            "drive.distributed()", timeout=RUN)
        assert r.status == "ok" and r.result == "'driver ran'", r.describe()
        head, workers, _ = assert_one_cluster_in_order(node.records())
        for x in [head, *workers]:
            assert "--num-gpus=1" in x["argv"], x
            assert x["CUDA_VISIBLE_DEVICES"] == x["rank"], x
        assert "managed platform's H100" in r.stderr, r.stderr
    finally:
        node.stop()


@pytest.mark.timeout(RUN)
def test_ray_launch_is_an_mlflow_run_like_distributed(tmp_path):
    with MlflowTestServer() as server:
        node = RayNode(tmp_path, MLFLOW_TRACKING_URI=server.url)
        try:
            r = node.kernel.execute(
                "from databricks.air.ray import ray_launch\n"
                "@ray_launch(num_processes=2)\n"
                "def drive():\n"
                "    import os\n"
                "    return os.environ['MLFLOW_RUN_ID']\n"
                "drive.distributed()", timeout=RUN)
            assert r.status == "ok", r.describe()
            runs = server.runs()
            assert len(runs) == 1, runs
            assert r.result == repr(runs[0]["info"]["run_id"]), r.describe()
            assert runs[0]["info"]["status"] == "FINISHED", runs
        finally:
            node.stop()


@pytest.mark.timeout(RUN)
def test_ray_init_in_a_distributed_cell(ray_node):
    k = ray_node.kernel
    r = k.execute(
        "%%distributed num_processes=2 tracking=False\n"
        "import os\n"
        "from databricks.air import ray_init\n"
        "with ray_init() as cluster:\n"
        "    role = 'driver' if cluster.is_driver else 'worker'\n"
        "    seen = os.environ['RAY_ADDRESS'] == cluster.address\n"
        "(role, seen)", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: ('driver', True)\nrank 1: ('worker', True)", r.describe()
    assert_one_cluster_in_order(ray_node.records())


@pytest.mark.timeout(RUN)
def test_ray_init_shares_the_rendezvous_with_a_process_group_and_runs_twice(ray_node):
    """MASTER_PORT is served once: a second ray_init reuses the first one's
    store, and a process group started after them joins it; a third ray_init
    uses that group's store."""
    k = ray_node.kernel
    r = k.execute(
        "%%distributed num_processes=2 tracking=False\n"
        "import torch, torch.distributed as dist\n"
        "from serverless_gpu import ray_init\n"
        "addresses = set()\n"
        "for _ in range(2):\n"
        "    with ray_init() as cluster:\n"
        "        addresses.add(cluster.address)\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "with ray_init() as cluster:\n"
        "    addresses.add(cluster.address)\n"
        "(int(t.item()), len(addresses))", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: (2, 3)\nrank 1: (2, 3)", r.describe()
    head, workers, stops = starts_and_stops(ray_node.records())
    assert len(head) == 3 and len(workers) == 3 and len(stops) == 6, ray_node.records()


@pytest.mark.timeout(60)
def test_ray_init_outside_a_run_says_where_it_belongs(kernel):
    r = kernel.execute("from serverless_gpu import ray_init\nray_init()")
    assert r.status == "error", r.describe()
    assert "@distributed" in r.content["evalue"], r.describe()


@pytest.mark.timeout(60)
def test_ray_launch_without_ray_is_an_error_before_anything_starts(kernel, tmp_path):
    sentinel = tmp_path / "rank-ran"
    with support.ChildWatcher(kernel.pid) as watcher:
        r = kernel.execute(
            "import os\n"
            "os.environ['PATH'], saved = '/nonexistent', os.environ['PATH']\n"
            "try:\n"
            "    from databricks.air import ray_launch\n"
            "    @ray_launch(num_processes=2)\n"
            "    def drive():\n"
            f"        open({str(sentinel)!r}, 'w').close()\n"
            "    drive.distributed()\n"
            "finally:\n"
            "    os.environ['PATH'] = saved\n")
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "RayNotInstalled", r.describe()
    assert "`ray` command is not on this kernel's PATH" in r.content["evalue"], r.describe()
    assert not sentinel.exists()
    assert watcher.seen == set(), watcher.seen
    assert not support.status_displays(r), r.describe()


# -- %%distributed? -------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_the_magics_help_lists_the_compatible_surface(kernel):
    r = kernel.execute("%%distributed?")
    page = r.content["payload"][0]["data"]["text/plain"]
    for name in ("serverless_gpu", "databricks.air", "GPUType", "AcceleratorType", "ray_launch",
                 "ray_init", "UCVolumeDataset", "FutureWarning", "get_local_rank", "H200"):
        assert name in page, f"{name} not in %%distributed?:\n{page}"

"""
GPU ranks on a Slurm cluster: the simulated one of tests/slurm/ (2 nodes, each
with 2 "GPUs": GRES gpu on device files with no driver behind), through a real
kernel that runs where there is no GPU (a login node).

The run is planned against the cluster's GPUs (sinfo's GRES), never the kernel
host's: salloc asks --gpus-per-node, the node count follows from the GPUs when
nodes= is not given, and every rank of a node sees the node's GPUs of the job
(Slurm's CUDA_VISIBLE_DEVICES), LOCAL_RANK's being its own, as on one node.
The ranks bind it through the fake libcudart (tests/unit/fake_cuda.c), which
reports as many devices as Slurm made visible. CPU ranks ask for no GPU.
"""
import os
import sys

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from test_slurm_runs import rank_processes, start, still_serves, wait_clean  # noqa: E402

GPUS_PER_NODE = 2      # tests/slurm/cluster.sh's default, GRES gpu:h200:2


@pytest.fixture(scope="module")
def fake_cudart():
    built = os.environ.get("DISTKERNEL_FAKE_CUDA")
    assert built, ("DISTKERNEL_FAKE_CUDA must name the folder holding the fake CUDA libraries "
                   "(BUILD/tests/unit); scripts/test.sh sets it")
    path = os.path.join(os.path.abspath(built), "libfake_cudart.so")
    assert os.path.exists(path), f"{path} is missing: build the unit tests first"
    return path


@pytest.fixture
def kernel(slurm_cluster, tmp_path, fake_cudart):
    # No GPU on the kernel's host: no NVML of any kind is found here.
    k = start(tmp_path, slurm_cluster, FAKE_CUDART=fake_cudart, CUDA_VISIBLE_DEVICES="")
    yield k
    k.stop()
    assert wait_clean(slurm_cluster) == [], "left behind after the test"


# Each rank: the GPUs Slurm made visible, LOCAL_RANK's among them bound through
# libcudart (which counts the visible ones), and, on rank 0, what the job asked.
# All ranks meet first (gloo): a node's ranks must run side by side, not one
# step waiting for the other's GPUs.
GPU_BODY = """
import ctypes, os, socket, subprocess
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
os.environ["FAKE_GPUS"] = str(len(visible.split(",")) if visible else 0)
cudart = ctypes.CDLL(os.environ["FAKE_CUDART"])
local = int(os.environ["LOCAL_RANK"])
bound = cudart.cudaSetDevice(local)
gpu = visible.split(",")[local] if bound == 0 else None
if os.environ["RANK"] == "0":
    job = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]],
                         capture_output=True, text=True).stdout
    print("job asked", [w for w in job.split() if w.startswith("TresPerNode=")], flush=True)
(socket.gethostname(), int(os.environ["RANK"]), local, visible, bound, gpu)
"""


def parse_results(text):
    """'rank R: (...)' lines into tuples."""
    import ast
    return [ast.literal_eval(line.split(": ", 1)[1]) for line in text.splitlines()]


def assert_each_rank_on_its_own_gpu(results):
    assert len(results) == 4, results
    for host, rank, local, visible, bound, gpu in results:
        assert host == f"node{rank // 2 + 1}" and local == rank % 2, results
        assert visible == "0,1", f"rank {rank} sees {visible!r}, not its node's 2 GPUs"
        assert bound == 0, f"rank {rank}: cudaSetDevice(LOCAL_RANK={local}) failed ({bound})"
    gpus = sorted((host, gpu) for host, _, _, _, _, gpu in results)
    assert gpus == [("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")], results


def statuses(r):
    return [m["content"]["data"]["text/plain"] for m in r.of_type("display_data",
                                                                  "update_display_data")
            if "distributed:" in m["content"]["data"]["text/plain"]]


@pytest.mark.timeout(300)
def test_gpu_ranks_take_as_many_nodes_as_the_gpus_need_each_rank_on_its_own(kernel):
    r = kernel.execute("%%distributed num_accelerators=4 launcher=slurm timeout=60" + GPU_BODY,
                       timeout=240)
    assert r.status == "ok", r.describe()
    assert_each_rank_on_its_own_gpu(parse_results(r.result))
    assert "[rank 0] job asked ['TresPerNode=gres:gpu:2']" in r.stdout, r.stdout
    shown = statuses(r)
    assert any("asking Slurm for 2 nodes with 2 GPUs each" in s for s in shown), shown
    assert "distributed: 4 GPU ranks on 2 nodes" in shown[-1], shown[-1]
    assert "GiB" not in shown[-1], "the status read this host's GPU memory for srun's pids"


@pytest.mark.timeout(300)
def test_the_decorator_with_gpus_and_remote_true_runs_on_the_nodes_gpus(kernel):
    code = ("from distkernel import distributed\n"
            "@distributed(gpus=4, remote=True, timeout=60)\n"
            "def where():\n"
            + "".join("    " + line + "\n" for line in GPU_BODY.strip().splitlines()[:-1])
            + "    return " + GPU_BODY.strip().splitlines()[-1] + "\n"
            "res = where.distributed()\n"
            "print('results', res)\n")
    r = kernel.execute(code, timeout=240)
    assert r.status == "ok", r.describe()
    line = [l for l in r.stdout.splitlines() if l.startswith("results ")]
    assert line, r.describe()
    import ast
    assert_each_rank_on_its_own_gpu(ast.literal_eval(line[0][len("results "):]))


@pytest.mark.timeout(300)
def test_a_gpu_model_the_nodes_have_is_asked_for_by_its_gres_type(kernel):
    r = kernel.execute("%%distributed num_accelerators=4 launcher=slurm gpu_type=H200 timeout=60"
                       + GPU_BODY, timeout=240)
    assert r.status == "ok", r.describe()
    assert_each_rank_on_its_own_gpu(parse_results(r.result))
    assert "[rank 0] job asked ['TresPerNode=gres:gpu:h200:2']" in r.stdout, r.stdout
    assert "distkernel:" not in r.stderr, r.stderr     # no notice: the model was found


@pytest.mark.timeout(300)
def test_a_platform_gpu_type_the_nodes_lack_runs_on_theirs_and_says_so(kernel):
    r = kernel.execute("%%distributed num_accelerators=4 launcher=slurm gpu_type=H100 timeout=60"
                       + GPU_BODY, timeout=240)
    assert r.status == "ok", r.describe()
    assert ("gpu_type=H100 is the managed platform's H100; the nodes of the default partition "
            "have h200 GPUs (GRES gpu:h200:2), so the run uses those") in r.stderr, r.stderr
    assert "[rank 0] job asked ['TresPerNode=gres:gpu:2']" in r.stdout, r.stdout


@pytest.mark.timeout(120)
def test_another_gpu_model_the_nodes_lack_is_a_clear_error(kernel, slurm_cluster):
    r = kernel.execute("%%distributed num_accelerators=4 launcher=slurm gpu_type=A100\n1\n",
                       timeout=60)
    assert r.status == "error", r.describe()
    assert ("gpu_type=A100 asks for A100 GPUs, but the nodes of the default partition have "
            "h200 (GRES gpu:h200:2)") in r.content["evalue"], r.describe()
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(120)
def test_gpus_that_do_not_fit_the_nodes_are_a_clear_error_before_anything_starts(
        kernel, slurm_cluster):
    r = kernel.execute("%%distributed num_accelerators=3 launcher=slurm\n1\n", timeout=60)
    assert r.status == "error", r.describe()
    assert ("num_accelerators=3 does not fill whole nodes: each node of the default partition "
            "has 2 GPUs (gpu:h200:2), so without nodes= give a multiple of 2 (2, 4)"
            in r.content["evalue"]), r.describe()
    r = kernel.execute("%%distributed num_accelerators=4 nodes=1 launcher=slurm\n1\n",
                       timeout=60)
    assert r.status == "error", r.describe()
    assert ("num_accelerators=4 over nodes=1 asks 4 GPUs of each node, but a node of the "
            "default partition has 2 (gpu:h200:2); give nodes=2" in r.content["evalue"]), r.describe()
    r = kernel.execute("%%distributed num_accelerators=4 launcher=slurm partition=nope\n1\n",
                       timeout=60)
    assert r.status == "error", r.describe()
    assert "Slurm has no partition 'nope'" in r.content["evalue"], r.describe()
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(120)
def test_gpus_per_node_over_what_distkernel_nodes_gives_name_the_variable(slurm_cluster,
                                                                          tmp_path, fake_cudart):
    # The site's default of one node; the user wrote no nodes=.
    k = start(tmp_path, slurm_cluster, FAKE_CUDART=fake_cudart, CUDA_VISIBLE_DEVICES="",
              DISTKERNEL_NODES="1")
    try:
        r = k.execute("%%distributed num_accelerators=4 launcher=slurm\n1\n", timeout=60)
        assert r.status == "error", r.describe()
        evalue = r.content["evalue"]
        assert ("num_accelerators=4 over nodes=1 (the default from DISTKERNEL_NODES=1) asks 4 "
                "GPUs of each node, but a node of the default partition has 2" in evalue), evalue
        assert ("give nodes= in the cell (it wins over DISTKERNEL_NODES), or change "
                "DISTKERNEL_NODES" in evalue and "nodes=2" in evalue), evalue
        assert "No rank was started" in evalue, evalue
        assert wait_clean(slurm_cluster) == []
        still_serves(k)
    finally:
        k.stop()


@pytest.mark.timeout(300)
def test_cpu_ranks_ask_for_no_gpu(kernel):
    r = kernel.execute("%%distributed num_processes=4 nodes=2 timeout=60" + GPU_BODY,
                       timeout=240)
    assert r.status == "ok", r.describe()
    assert "[rank 0] job asked []" in r.stdout, r.stdout
    for host, rank, local, visible, bound, gpu in parse_results(r.result):
        assert visible == "" and gpu is None, r.result


@pytest.mark.timeout(300)
def test_inside_a_gpu_allocation_gpu_and_cpu_ranks_run_on_its_nodes(slurm_cluster, tmp_path,
                                                                    fake_cudart):
    got = slurm_cluster.run("salloc", "-N2", "--ntasks-per-node=2", "--gpus-per-node=2",
                            "--no-shell", "--job-name=batch-with-gpus")
    assert got.returncode == 0, got.stderr
    job = got.stderr.split("Granted job allocation ")[1].split()[0]
    try:
        k = start(tmp_path, slurm_cluster, SLURM_JOB_ID=job, SLURM_JOB_NODELIST="node[1-2]",
                  FAKE_CUDART=fake_cudart, CUDA_VISIBLE_DEVICES="")
        try:
            # GPUs counted on the allocation's nodes; nodes inferred.
            r = k.execute("%%distributed num_accelerators=4 launcher=slurm timeout=60" + GPU_BODY,
                          timeout=240)
            assert r.status == "ok", r.describe()
            assert_each_rank_on_its_own_gpu(parse_results(r.result))
            # CPU ranks take none of the job's GPUs: a step that asked none
            # would hold its node's GPUs and the node's second rank would wait.
            r = k.execute("%%distributed num_processes=4 nodes=2 timeout=60" + GPU_BODY,
                          timeout=240)
            assert r.status == "ok", r.describe()
            assert [v for _, _, _, v, _, _ in parse_results(r.result)] == [""] * 4, r.result
            assert wait_clean(slurm_cluster) == []
        finally:
            k.stop()
        assert rank_processes(slurm_cluster) == []
    finally:
        slurm_cluster.run("scancel", job)

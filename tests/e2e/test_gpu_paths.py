"""The GPU paths of the kernel, checked on this machine.

Without a GPU: %distributed_check and check=True say so in one line, and the
kernel keeps working. With a model of a GPU node (tests/unit/fake_cuda.c built
as libnvidia-ml, libcudart and libnccl, found through DISTKERNEL_FAKE_CUDA, the
folder they were built in): discovery names the node's GPUs, asking for others
or for more is an error before anything starts, and %distributed_check runs
the real check program against the model and renders its report. The real
GPU run is tests/device/gpu_check.sh, on the device machine.
"""

import os

import pytest

import support

FAKE_LIBS = {"libnvidia-ml.so.1": "libfake_nvml.so", "libcudart.so.13": "libfake_cudart.so",
             "libnccl.so.2": "libfake_nccl.so"}


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    built = os.path.abspath(os.environ.get("DISTKERNEL_FAKE_CUDA", ""))
    assert os.environ.get("DISTKERNEL_FAKE_CUDA"), ("DISTKERNEL_FAKE_CUDA must name the folder holding the fake CUDA libraries "
                   "(BUILD/tests/unit); scripts/test.sh sets it")
    libs = tmp_path_factory.mktemp("fake-cuda")
    for name, source in FAKE_LIBS.items():
        path = os.path.join(built, source)
        assert os.path.exists(path), f"{path} is missing: build the unit tests first"
        os.symlink(path, libs / name)
    env = support.kernel_env(LD_LIBRARY_PATH=str(libs), FAKE_GPUS="2", CUDA_VISIBLE_DEVICES=None,
                             DISTKERNEL_CUDART_LIB=str(libs / "libcudart.so.13"),
                             DISTKERNEL_NCCL_LIB=str(libs / "libnccl.so.2"))
    k = support.Kernel.start(env=env)
    yield k
    k.stop()


@pytest.mark.timeout(60)
def test_distributed_check_without_a_gpu_says_so_in_one_line(kernel):
    r = kernel.execute("%distributed_check", timeout=60)
    assert r.status == "ok", r.describe()
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, r.stdout
    assert "no NVIDIA driver" in lines[0]


@pytest.mark.timeout(60)
def test_distributed_check_is_listed_and_documented(kernel):
    r = kernel.execute("%lsmagic")
    assert "%distributed_check" in r.result
    r = kernel.execute("%distributed_check?")
    page = r.content["payload"][0]["data"]["text/plain"]
    assert "nccl-tests" in page and "check=True" in page


@pytest.mark.timeout(120)
def test_check_option_on_cpu_ranks_says_there_is_nothing_to_check(kernel):
    r = kernel.execute("%%distributed num_processes=2 tracking=False check=True\n7", timeout=120)
    assert r.status == "ok", r.describe()
    assert "no GPU to check" in r.stderr
    assert "rank 1: 7" in r.result


@pytest.mark.timeout(60)
def test_discovery_names_the_gpus_when_more_are_asked_for(fake_node):
    r = fake_node.execute("%%distributed num_accelerators=4 tracking=False\n1", timeout=60)
    assert r.status == "error"
    assert "num_accelerators=4" in r.content["evalue"]
    assert "2 × NVIDIA H100 80GB HBM3" in r.content["evalue"]


@pytest.mark.timeout(60)
def test_an_accelerator_type_the_node_lacks_is_an_error_naming_what_it_has(fake_node):
    # A100 is not a type of the managed platform's fleet, whose types run on
    # whatever the node has (test_platform.py): it is a requirement.
    r = fake_node.execute("%%distributed accelerator_type=GPU_2xA100 tracking=False\n1",
                          timeout=60)
    assert r.status == "error"
    evalue = r.content["evalue"]
    assert "A100" in evalue and "NVIDIA H100 80GB HBM3" in evalue and "(H100)" in evalue


@pytest.mark.timeout(60)
def test_distributed_check_reports_every_gpu_and_the_bandwidth_table(fake_node):
    r = fake_node.execute("%distributed_check --max-bytes 1M --warmup 0 --iters 2", timeout=60)
    assert r.status == "ok", r.describe()
    out = r.stdout
    assert "NVIDIA H100 80GB HBM3" in out
    assert "busbw" in out.lower() or "bus bandwidth" in out.lower(), out
    assert "1 MiB" in out or "1048576" in out, out


@pytest.mark.timeout(60)
def test_kernel_holds_no_cuda_library_after_discovery_and_check(fake_node):
    fake_node.execute("%%distributed num_accelerators=4 tracking=False\n1", timeout=60)
    fake_node.execute("%distributed_check --max-bytes 1K --warmup 0 --iters 1", timeout=60)
    with open(f"/proc/{fake_node.pid}/maps") as f:
        maps = f.read()
    assert "libcudart" not in maps and "libnccl" not in maps

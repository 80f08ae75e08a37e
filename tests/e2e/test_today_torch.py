"""torch 2 as a user of today's stack meets it (issue 34, item 6): the kernel
installed for the test venv (scripts/venv.sh: torch 2 from PyPI) runs DDP and
FSDP2 (`fully_shard`) on CPU ranks with gloo, in a `%%distributed` cell and
through the decorator, and `torch.compile` in a rank. The notebooks in
notebooks/ (ddp, fsdp, deepspeed) are executed headless with nbconvert, as a
user runs them, and what their cells printed and returned is checked: each
proves that its ranks trained as one process (their parameters match a model
trained in the kernel on the whole batch), which ranks that did not
synchronise their gradients cannot do.

Skipped where the venv is not built (scripts/test.sh builds it and passes its
path in DISTKERNEL_TEST_VENV), and in the sanitizer pass: the C paths are
test_distributed.py's.
"""
import math
import pathlib
import re
import shutil
import subprocess

import nbformat
import pytest

import support
from today import NAME, RUN, VENV, kernels, launch, needs_venv, tracking  # noqa: F401

pytestmark = needs_venv


@pytest.fixture(scope="module")
def kernel(kernels, tracking, tmp_path_factory):
    """One kernel for the module's cells."""
    root = tmp_path_factory.mktemp("today-torch")
    k = launch(kernels, root, tracking)
    yield k
    k.stop()


def run_notebook(kernels, tracking, name, tmp_path):
    """notebooks/NAME executed headless by the venv's nbconvert on the venv's
    kernel, as a user runs it: the executed notebook."""
    # nbconvert runs the kernel in the notebook's folder: a copy's, so that
    # nothing the run writes lands in the repository
    src = tmp_path / "in" / name
    src.parent.mkdir()
    shutil.copy(support.REPO_ROOT / "notebooks" / name, src)
    env = support.kernel_env(JUPYTER_PATH=kernels, DISTKERNEL_LOG_DIR=tmp_path / "logs",
                             MLFLOW_TRACKING_URI=tracking)
    res = subprocess.run([f"{VENV}/bin/python", "-m", "jupyter", "nbconvert", "--to", "notebook",
                          "--execute", f"--ExecutePreprocessor.kernel_name={NAME}",
                          f"--ExecutePreprocessor.timeout={RUN}", str(src),
                          "--output-dir", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3 * RUN)
    assert res.returncode == 0, res.stderr[-4000:]
    return nbformat.read(str(tmp_path / name), as_version=4)


def text_of(cell):
    """What a code cell showed: its streams and the text of its displays and result."""
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif "data" in o:
            parts.append(o["data"].get("text/plain", ""))
    return "".join(parts)


def code_cells(nb):
    cells = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == [], errors
    return cells


def rank_values(text):
    """{rank: text} of the `rank N: VALUE` lines with which a cell shows its ranks' values."""
    return {int(m[1]): m[2] for m in re.finditer(r"^rank (\d+): (.+)$", text, re.M)}


def test_the_ddp_notebook_trains_two_ranks_as_one_process(kernels, tracking, tmp_path):
    nb = run_notebook(kernels, tracking, "ddp.ipynb", tmp_path)
    reference, setup, cell, check, decorator = [text_of(c) for c in code_cells(nb)]
    assert re.search(r"one process: loss [\d.]+ after 20 steps, 1153 parameters", reference)
    # each rank trained on its own half: its loss differs, its parameters do not
    losses = re.findall(r"\[rank (\d)\] loss on my half of the batch: ([\d.]+)", cell)
    assert sorted(r for r, _ in losses) == ["0", "1"] and losses[0][1] != losses[1][1], cell
    diffs = rank_values(cell)
    assert sorted(diffs) == [0, 1] and all(float(d) < 1e-4 for d in diffs.values()), cell
    assert "2 ranks trained as one process" in check, check
    assert "decorator: ranks [0, 1] trained as one process" in decorator, decorator


def test_the_fsdp_notebook_shards_the_parameters_and_trains_as_one_process(kernels, tracking,
                                                                           tmp_path):
    nb = run_notebook(kernels, tracking, "fsdp.ipynb", tmp_path)
    reference, setup, cell, check, decorator = [text_of(c) for c in code_cells(nb)]
    # Every parameter is a DTensor of which each rank holds its slice of dim 0
    # (rank 1 none of a 1-row one)...
    held = {(m[1], m[2]): m[4] for m in re.finditer(
        r"\[rank (\d)\] (\S+): \(([\d, ]+)\) held as \(([\d, ]*)\)", cell)}
    assert held[("0", "0.weight")] == held[("1", "0.weight")] == "32, 16", cell
    assert held[("0", "2.weight")] == "1, 64" and held[("1", "2.weight")] == "0, 64", cell
    # ... and the model gathered whole after training is the one process's.
    diffs = rank_values(cell)
    assert sorted(diffs) == [0, 1] and all(float(d) < 1e-4 for d in diffs.values()), cell
    assert "2 ranks trained as one process" in check, check
    assert "the ranks held [609, 544] of 1153 parameters" in decorator, decorator


def test_the_resume_notebook_survives_a_killed_rank_and_reshards(kernels, tracking, tmp_path):
    """notebooks/resume.ipynb (issue 36): FSDP2 on 4 ranks reading a folder of
    1,000 files through UCVolumeDataset (2 workers each), a DCP checkpoint
    every 5 steps through UCVolumeWriter; a rank SIGKILLed at step 12 with
    restarts=1 goes on from step 10 with the uninterrupted run's losses, and
    2 ranks load what 4 saved. The notebook checks the numbers itself; this
    checks that it said so, and what the cells showed of the restart."""
    nb = run_notebook(kernels, tracking, "resume.ipynb", tmp_path)
    volume, setup, reference, resumed, check, two, resharded = [text_of(c)
                                                                for c in code_cells(nb)]
    assert "1000 files in" in volume, volume
    assert re.search(r"rank 3: from step 0: 20 steps, last loss [\d.]+, model [0-9a-f]{16}",
                     reference), reference
    assert "[distkernel] attempt 1 of 2 failed; its logs: " in resumed, resumed
    assert "rank 2" in resumed and "SIGKILL" in resumed, resumed
    assert "[distkernel] starting every rank again: attempt 2 of 2" in resumed, resumed
    assert "attempt 2 of 2 · " in resumed and "finished" in resumed, resumed
    assert re.search(r"\[rank 0\] attempt 2: resumed from step 10", resumed), resumed
    assert re.search(r"rank 1: from step 10: 10 steps", resumed), resumed
    assert "attempt 2 went on from step 10: steps 10 to 19 had the losses of the " \
           "uninterrupted run" in check, check
    assert "loaded step 20 of " in two and "2 ranks hold the model 4 ranks saved" in resharded


def test_the_deepspeed_notebook_runs_zero_stage_2_on_cpu_ranks(kernels, tracking, tmp_path):
    """DeepSpeed from the registry (its wheel built by scripts/venv.sh) with
    its CPU accelerator over gloo: no oneCCL nor GPU needed."""
    found = list(pathlib.Path(VENV).glob("lib/python3*/site-packages/deepspeed-*.dist-info"))
    assert found, (f"{VENV} has no deepspeed: it was built from an older tests/venv/lock.txt; "
                   "scripts/venv.sh builds the lock's venv and prints its path")
    nb = run_notebook(kernels, tracking, "deepspeed.ipynb", tmp_path)
    reference, cell, check = [text_of(c) for c in code_cells(nb)]
    assert re.search(r"one process: loss [\d.]+ after 20 steps, 1153 parameters", reference)
    # ZeRO stage 2: each rank keeps AdamW's state for its half (1153 padded to 1156)
    held = re.findall(r"\[rank (\d)\] ZeRO stage 2: this rank holds AdamW's state of (\d+) of "
                      r"1153 parameters; loss on my share [\d.]+", cell)
    assert sorted(held) == [("0", "578"), ("1", "578")], cell
    diffs = rank_values(cell)
    assert sorted(diffs) == [0, 1] and all(float(d) < 1e-4 for d in diffs.values()), cell
    assert "2 ranks trained as one process" in check, check


COMPILE_CELL = """%%distributed num_processes=2
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")

@torch.compile
def step(x):
    return torch.sin(x) * 2 + torch.cos(x) ** 2

x = torch.linspace(0, 1, 64) + dist.get_rank()
y = step(x)
dist.all_reduce(y)
from torch._dynamo.utils import counters
graphs = counters["stats"]["unique_graphs"]
built = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
print(f"graphs: {graphs}, by inductor: {built}, cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']}")
dist.destroy_process_group()
round(y.sum().item(), 3)
"""


def test_torch_compile_runs_in_a_rank(kernel):
    r = kernel.execute(COMPILE_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    # each rank compiled the function: dynamo captured one graph and inductor
    # built its code (or loaded it from its cache); eager would count none...
    assert sorted(re.findall(r"\[rank (\d)\] graphs: 1, by inductor: 1, cache: /", r.stdout)) \
        == ["0", "1"], r.describe()
    # ... and its values are eager torch's, summed over the ranks
    want = sum(2 * math.sin(v) + math.cos(v) ** 2
               for k in range(64) for v in (k / 63, k / 63 + 1))
    values = rank_values(r.result or "")
    assert sorted(values) == [0, 1], r.describe()
    assert all(abs(float(v) - want) < 1e-2 for v in values.values()), (values, want)

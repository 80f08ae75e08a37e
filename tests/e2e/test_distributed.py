"""%%distributed and @distributed, end to end on CPU ranks (gloo): the magic's help,
the reference DDP example through the magic and through each decorator import,
results, the rank environment, notebook state reaching the ranks, output relay
(labels, stderr, C-level writes, order, output=rank0 and lists, log files, tqdm bars, live
streaming) and two kernels running distributed cells at once.

Failure paths and bad options are in test_distributed_failures.py. Every run here
uses 2 ranks (num_processes=2): the machine the suite runs on may have 2 cores;
output= lists take 4, printing a line each, so that some ranks are left out.
"""
import os
import sys
import time

import pytest

import support
from support import rank_lines

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 120  # seconds a cell that starts ranks importing torch may take on a busy machine

# The platform's reference example, adapted to CPU ranks: the model and the helpers
# live in an ordinary cell, as in the notebooks users bring.
MODEL_CELL = '''\
import os
import torch
import torch.nn as nn
import torch.distributed as dist

class SimpleMLP(nn.Module):
    def __init__(self, input_dim=10, hidden_dim=64, output_dim=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden_dim, hidden_dim), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x):
        return self.net(x)

def setup():
    dist.init_process_group("gloo")
    return int(os.environ["LOCAL_RANK"])

def cleanup():
    dist.destroy_process_group()
'''

TRAIN_BODY = '''\
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
local_rank = setup()
torch.manual_seed(0)
dataset = TensorDataset(torch.randn(512, 10), torch.randn(512, 1))
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
model = DDP(SimpleMLP())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.MSELoss()
for epoch in range(num_epochs):
    sampler.set_epoch(epoch)
    model.train()
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"epoch {epoch} loss {total:.4f}")
'''

DDP_MAGIC_CELL = ("%%distributed num_processes=2 result=ddp_ranks\n"
                  "num_epochs, batch_size = 2, 32\n" + TRAIN_BODY + "dist.get_rank()\n")


def indent(text, by="    "):
    return "".join(by + line if line.strip() else line for line in text.splitlines(True))


def decorated_train_cell(import_line):
    return (f"{import_line}\n\n"
            "@distributed(num_processes=2)\n"
            "def run_train(num_epochs, batch_size):\n"
            + indent(TRAIN_BODY)
            + "    rank = dist.get_rank()\n"
            "    cleanup()\n"
            "    return rank\n\n"
            "train_results = run_train.distributed(num_epochs=2, batch_size=32)\n"
            "print('is a list:', isinstance(train_results, list), 'len', len(train_results))\n"
            "list(train_results)\n")


@pytest.fixture(scope="module")
def model_defined(kernel):
    r = kernel.execute(MODEL_CELL, timeout=RUN)
    assert r.status == "ok", r.describe()
    return kernel


@pytest.fixture(scope="module")
def ddp_run(model_defined):
    """The DDP example through the magic, run once for the tests that read it."""
    r = model_defined.execute(DDP_MAGIC_CELL, timeout=RUN)
    return r


def simple_cell_works(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os\nint(os.environ['RANK'])",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: 0\nrank 1: 1", r.describe()


# -- the magic's presence and help -------------------------------------------------

@pytest.mark.timeout(60)
def test_lsmagic_lists_the_distributed_cell_magic(kernel):
    r = kernel.execute("%lsmagic")
    assert r.status == "ok", r.describe()
    cell_part = r.result.split("Available cell magics:", 1)[-1]
    assert "%%distributed" in cell_part, r.result


@pytest.mark.timeout(60)
def test_distributed_help_pages_the_doc_with_every_option(kernel):
    r = kernel.execute("%%distributed?")
    assert r.status == "ok", r.describe()
    pages = [p for p in r.content.get("payload", []) if p.get("source") == "page"]
    assert pages, r.describe()
    text = pages[0]["data"]["text/plain"]
    for option in ("num_accelerators", "accelerator_type", "num_processes", "timeout",
                   "output", "result", "gpus", "gpu_type"):
        assert option in text, f"{option} not documented in:\n{text}"


# -- the DDP example through the magic ----------------------------------------------

@pytest.mark.timeout(300)
def test_ddp_example_via_magic_succeeds(ddp_run):
    assert ddp_run.status == "ok", ddp_run.describe()


@pytest.mark.timeout(300)
def test_ddp_example_via_magic_results_come_back_by_rank(ddp_run):
    assert ddp_run.status == "ok", ddp_run.describe()
    assert ddp_run.result == "rank 0: 0\nrank 1: 1", ddp_run.describe()


@pytest.mark.timeout(300)
def test_ddp_example_via_magic_output_is_labelled_by_rank(ddp_run):
    lines = rank_lines(ddp_run.stdout)
    for rank in (0, 1):
        epochs = [line for line in lines.get(rank, []) if line.startswith("epoch ")]
        assert [e.split()[1] for e in epochs] == ["0", "1"], ddp_run.stdout
        assert all(float(e.split()[3]) > 0 for e in epochs), ddp_run.stdout


@pytest.mark.timeout(300)
def test_result_option_stores_the_list_of_rank_values(ddp_run, kernel):
    assert ddp_run.status == "ok", ddp_run.describe()
    assert support.json_value(kernel, "ddp_ranks") == [0, 1]


# -- the decorator, under each of its import names ---------------------------------

DECORATOR_IMPORTS = [
    "from distkernel import distributed",
    "from serverless_gpu import distributed",
    "from databricks.air import distributed",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("import_line", DECORATOR_IMPORTS, ids=["distkernel", "serverless_gpu",
                                                                "databricks.air"])
def test_ddp_example_via_decorator_returns_one_entry_per_rank(model_defined, import_line):
    kernel = model_defined
    r = kernel.execute(decorated_train_cell(import_line), timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "[0, 1]", r.describe()
    assert "is a list: True len 2" in r.stdout, r.stdout
    lines = rank_lines(r.stdout)
    for rank in (0, 1):
        assert [x.split()[1] for x in lines.get(rank, []) if x.startswith("epoch ")] == ["0", "1"], \
            r.stdout


@pytest.mark.timeout(120)
def test_decorator_passes_arguments_and_returns_values(kernel):
    r = kernel.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2)\n"
        "def scaled(x, *, factor):\n"
        "    import os\n"
        "    return (int(os.environ['RANK']) + x) * factor\n"
        "scaled.distributed(10, factor=3)", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "[30, 33]", r.describe()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option,old", [("gpus=2", "gpus"), ('gpu_type="H100"', "gpu_type")])
def test_decorator_old_option_names_warn_deprecated(kernel, option, old):
    # Under databricks.air; under serverless_gpu they are its names (test_platform.py).
    r = kernel.execute(
        "from databricks.air import distributed\n"
        f"@distributed({option})\n"
        "def f():\n"
        "    return 1\n"
        "f.distributed()")
    # No GPU here, so the call fails; the deprecation must be said first regardless.
    warned = [line for line in (r.stderr + r.stdout).splitlines()
              if "FutureWarning" in line or "deprecated" in line.lower()]
    assert any(old in line for line in warned), (
        f"no deprecation line for {old}=; stderr was {r.stderr!r}\n{r.describe()}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option,old", [("gpus=2", "gpus"), ("gpu_type=H100", "gpu_type")])
def test_magic_old_option_names_warn_deprecated(kernel, option, old):
    r = kernel.execute(f"%%distributed {option}\n1")
    warned = [line for line in (r.stderr + r.stdout).splitlines()
              if "FutureWarning" in line or "deprecated" in line.lower()]
    assert any(old in line for line in warned), (
        f"no deprecation line for {old}=; stderr was {r.stderr!r}\n{r.describe()}")


@pytest.mark.timeout(60)
def test_gpus_on_a_machine_without_gpu_is_an_error_that_mentions_num_processes(kernel):
    r = kernel.execute(
        "from serverless_gpu import distributed\n"
        "@distributed(gpus=2)\n"
        "def f():\n"
        "    return 1\n"
        "f.distributed()")
    assert r.status == "error", r.describe()
    assert "num_processes" in r.content["evalue"], r.describe()
    assert not support.status_displays(r), r.describe()


@pytest.mark.timeout(120)
def test_real_databricks_namespace_package_keeps_working(fresh_kernel, tmp_path):
    sdk = tmp_path / "databricks" / "sdk"
    sdk.mkdir(parents=True)
    (sdk / "__init__.py").write_text("WHO = 'the real databricks-sdk'\n")
    k = fresh_kernel
    r = k.execute(
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import databricks.sdk\n"
        "print(databricks.sdk.WHO)\n"
        "from databricks.air import distributed\n"
        "@distributed(num_processes=2)\n"
        "def who():\n"
        "    import os\n"
        "    return int(os.environ['RANK'])\n"
        "print(who.distributed())\n"
        "import databricks.sdk as again\n"
        "print(again.WHO)\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.stdout.count("the real databricks-sdk") == 2, r.stdout
    assert "[0, 1]" in r.stdout, r.stdout


# -- the rank environment -----------------------------------------------------------

ENV_NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "DK_E2E_FROM_NOTEBOOK"]

ENV_CELL = ("%%distributed num_processes=2 result=rank_env\n"
            "import os\n"
            f"{{name: os.environ.get(name) for name in {ENV_NAMES!r}}}\n")


@pytest.fixture
def rank_env(kernel):
    """The ranks' environment, with OMP_NUM_THREADS unset in the kernel and one
    variable set with os.environ in an earlier cell."""
    setup = kernel.execute("import os\n"
                           "_saved_omp = os.environ.pop('OMP_NUM_THREADS', None)\n"
                           "os.environ['DK_E2E_FROM_NOTEBOOK'] = 'set in an earlier cell'")
    assert setup.status == "ok", setup.describe()
    try:
        r = kernel.execute(ENV_CELL, timeout=RUN)
        assert r.status == "ok", r.describe()
        yield support.json_value(kernel, "rank_env")
    finally:
        kernel.execute("import os\n"
                       "os.environ.pop('DK_E2E_FROM_NOTEBOOK', None)\n"
                       "if _saved_omp is not None: os.environ['OMP_NUM_THREADS'] = _saved_omp")


@pytest.mark.timeout(120)
def test_ranks_get_their_rank_numbers(rank_env):
    assert [e["RANK"] for e in rank_env] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in rank_env] == ["0", "1"]
    assert [e["GROUP_RANK"] for e in rank_env] == ["0", "0"]


@pytest.mark.timeout(120)
def test_ranks_get_the_world_size(rank_env):
    assert [e["WORLD_SIZE"] for e in rank_env] == ["2", "2"]
    assert [e["LOCAL_WORLD_SIZE"] for e in rank_env] == ["2", "2"]


@pytest.mark.timeout(120)
def test_ranks_share_master_addr_port_and_run_id(rank_env):
    r0, r1 = rank_env
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert r0[name] and r0[name] == r1[name], (name, rank_env)
    assert 0 < int(r0["MASTER_PORT"]) < 65536


@pytest.mark.timeout(120)
def test_ranks_get_omp_num_threads_1_when_unset(rank_env):
    assert [e["OMP_NUM_THREADS"] for e in rank_env] == ["1", "1"]


@pytest.mark.timeout(120)
def test_variable_set_with_os_environ_in_an_earlier_cell_reaches_ranks(rank_env):
    assert [e["DK_E2E_FROM_NOTEBOOK"] for e in rank_env] == ["set in an earlier cell"] * 2


@pytest.mark.timeout(120)
def test_omp_num_threads_set_in_the_kernel_is_kept(kernel):
    r = kernel.execute("import os\n"
                       "_saved_omp2 = os.environ.get('OMP_NUM_THREADS')\n"
                       "os.environ['OMP_NUM_THREADS'] = '3'")
    assert r.status == "ok", r.describe()
    try:
        r = kernel.execute("%%distributed num_processes=2\nimport os\nos.environ['OMP_NUM_THREADS']",
                           timeout=RUN)
        assert r.status == "ok", r.describe()
        assert r.result == "rank 0: '3'\nrank 1: '3'", r.describe()
    finally:
        kernel.execute("import os\n"
                       "if _saved_omp2 is None: os.environ.pop('OMP_NUM_THREADS', None)\n"
                       "else: os.environ['OMP_NUM_THREADS'] = _saved_omp2")


# -- notebook state -----------------------------------------------------------------

@pytest.mark.timeout(120)
def test_function_class_and_constant_from_earlier_cells_reach_ranks(kernel):
    for cell in ("def e2e_double(x):\n    return 2 * x",
                 "class E2EPoint:\n"
                 "    def __init__(self, x, y):\n"
                 "        self.x, self.y = x, y\n"
                 "    def norm1(self):\n"
                 "        return abs(self.x) + abs(self.y)",
                 "E2E_SCALE = 7"):
        assert kernel.execute(cell).status == "ok"
    r = kernel.execute("%%distributed num_processes=2 result=state_seen\n"
                       "import os\n"
                       "rank = int(os.environ['RANK'])\n"
                       "[e2e_double(E2E_SCALE), E2EPoint(rank, -3).norm1(), type(E2EPoint(0, 0)).__name__]",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    assert support.json_value(kernel, "state_seen") == [[14, 3, "E2EPoint"], [14, 4, "E2EPoint"]]


@pytest.mark.timeout(120)
def test_module_imported_in_the_notebook_is_usable_in_ranks(kernel):
    assert kernel.execute("import textwrap as e2e_tw").status == "ok"
    r = kernel.execute("%%distributed num_processes=2\ne2e_tw.shorten('alpha beta gamma delta', width=12)",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: 'alpha [...]'\nrank 1: 'alpha [...]'", r.describe()


@pytest.mark.timeout(120)
def test_module_from_a_notebook_sys_path_entry_is_importable_in_ranks(kernel, tmp_path):
    (tmp_path / "dk_e2e_helpermod.py").write_text("def greet(n):\n    return f'hello {n}'\n")
    r = kernel.execute(f"import sys\nsys.path.append({str(tmp_path)!r})\nimport dk_e2e_helpermod")
    assert r.status == "ok", r.describe()
    r = kernel.execute("%%distributed num_processes=2\nimport os\n"
                       "dk_e2e_helpermod.greet(os.environ['RANK'])", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: 'hello 0'\nrank 1: 'hello 1'", r.describe()


# -- output -------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_rank_stdout_is_labelled_with_the_rank(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os\nprint('hello from', os.environ['RANK'])",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "[rank 0] hello from 0" in r.stdout.splitlines(), r.stdout
    assert "[rank 1] hello from 1" in r.stdout.splitlines(), r.stdout


@pytest.mark.timeout(120)
def test_rank_stderr_arrives_as_stderr_labelled(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os, sys\n"
                       "print('problem on', os.environ['RANK'], file=sys.stderr)", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "[rank 0] problem on 0" in r.stderr.splitlines(), r.describe()
    assert "[rank 1] problem on 1" in r.stderr.splitlines(), r.describe()
    assert "problem on" not in r.stdout, r.describe()


@pytest.mark.timeout(120)
def test_c_level_output_of_ranks_arrives(kernel):
    r = kernel.execute("%%distributed num_processes=2\n"
                       "import os, subprocess\n"
                       "rank = os.environ['RANK']\n"
                       "os.write(1, f'fd one {rank}\\n'.encode())\n"
                       "os.write(2, f'fd two {rank}\\n'.encode())\n"
                       "subprocess.run(['echo', f'echo child {rank}'], check=True)\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    out, err = r.stdout.splitlines(), r.stderr.splitlines()
    for rank in (0, 1):
        assert f"[rank {rank}] fd one {rank}" in out, r.describe()
        assert f"[rank {rank}] echo child {rank}" in out, r.describe()
        assert f"[rank {rank}] fd two {rank}" in err, r.describe()


@pytest.mark.timeout(180)
def test_per_rank_order_is_kept_for_2000_lines(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os\nrank = os.environ['RANK']\n"
                       "for i in range(2000):\n    print(f'seq {rank} {i}')", timeout=RUN)
    assert r.status == "ok", r.describe()
    lines = rank_lines(r.stdout)
    for rank in (0, 1):
        got = [int(x.split()[2]) for x in lines.get(rank, []) if x.startswith(f"seq {rank} ")]
        assert got == list(range(2000)), (
            f"rank {rank}: {len(got)} lines; first out of order at "
            f"{next((i for i, v in enumerate(got) if v != i), None)}")


@pytest.mark.timeout(120)
def test_output_rank0_shows_only_rank_0(kernel):
    r = kernel.execute("%%distributed num_processes=2 output=rank0\nimport os, sys\n"
                       "rank = os.environ['RANK']\n"
                       "print('out of', rank)\nprint('err of', rank, file=sys.stderr)", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "[rank 0] out of 0" in r.stdout.splitlines(), r.describe()
    assert "[rank 0] err of 0" in r.stderr.splitlines(), r.describe()
    assert "rank 1" not in r.stdout and "rank 1" not in r.stderr, r.describe()
    assert "of 1" not in r.stdout + r.stderr, r.describe()


OUTPUT_CELL = ("%%distributed num_processes=4 output={output}\nimport os, sys\n"
               "rank = os.environ['RANK']\n"
               "print('out of', rank)\nprint('err of', rank, file=sys.stderr)\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("output,shown", [("1,3", [1, 3]), ("2-3,2", [2, 3]), ("local0", [0])],
                         ids=["list", "range", "local0"])
def test_output_list_shows_only_its_ranks_and_the_logs_keep_every_rank(kernel, output, shown):
    r = kernel.execute(OUTPUT_CELL.format(output=output), timeout=RUN)
    assert r.status == "ok", r.describe()
    assert rank_lines(r.stdout) == {rank: [f"out of {rank}"] for rank in shown}, r.describe()
    assert rank_lines(r.stderr) == {rank: [f"err of {rank}"] for rank in shown}, r.describe()
    logs = support.log_dir(r)
    assert logs is not None, f"no 'logs: PATH' in the status display\n{r.describe()}"
    for rank in range(4):
        text = (logs / f"rank-{rank}.log").read_text()
        assert f"out of {rank}" in text.splitlines(), text[-500:]
        assert f"err of {rank}" in text.splitlines(), text[-500:]


@pytest.mark.timeout(120)
def test_decorator_output_takes_a_python_list_of_ranks(kernel):
    r = kernel.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2, output=[1])\n"
        "def f():\n"
        "    import os\n"
        "    print('out of', os.environ['RANK'])\n"
        "f.distributed()", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert rank_lines(r.stdout) == {1: ["out of 1"]}, r.describe()


LOG_CELL = ("%%distributed num_processes=2{opts}\nimport os, sys\nrank = os.environ['RANK']\n"
            "for i in range(300):\n    print(f'log line {{rank}} {{i}}')\n"
            "print(f'log err {{rank}}', file=sys.stderr)\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("opts", ["", " output=rank0"], ids=["output_all", "output_rank0"])
def test_log_files_hold_each_ranks_full_output(kernel, opts):
    r = kernel.execute(LOG_CELL.format(opts=opts), timeout=RUN)
    assert r.status == "ok", r.describe()
    logs = support.log_dir(r)
    assert logs is not None, f"no 'logs: PATH' in the status display\n{r.describe()}"
    assert logs.is_dir(), logs
    for rank in (0, 1):
        path = logs / f"rank-{rank}.log"
        assert path.is_file(), f"{path} missing; {sorted(p.name for p in logs.iterdir())}"
        text = path.read_text()
        got = [line for line in text.splitlines() if line.startswith(f"log line {rank} ")]
        assert got == [f"log line {rank} {i}" for i in range(300)], text[:500]
        assert f"log err {rank}" in text.splitlines(), text[-500:]


@pytest.mark.timeout(120)
def test_status_display_updates_in_place_and_ends_finished(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport time\ntime.sleep(1.5)", timeout=RUN)
    assert r.status == "ok", r.describe()
    shown = support.status_displays(r)
    assert shown and shown[0]["msg_type"] == "display_data", r.describe()
    ids = {m["content"]["transient"]["display_id"] for m in shown}
    assert len(ids) == 1, ids
    assert all(m["msg_type"] == "update_display_data" for m in shown[1:]), r.describe()
    final = shown[-1]["content"]["data"]["text/plain"]
    assert "rank 0" in final and "rank 1" in final, final


@pytest.mark.timeout(120)
def test_output_streams_while_the_cell_runs(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport time\n"
                       "print('first line')\ntime.sleep(3)\nprint('second line')", timeout=RUN)
    assert r.status == "ok", r.describe()

    def arrival(text):
        for m in r.of_type("stream"):
            if text in m["content"]["text"]:
                return m["received_at"]
        raise AssertionError(f"{text!r} never arrived\n{r.describe()}")

    idle = r.messages[-1]["received_at"]
    for rank in (0, 1):
        first = arrival(f"[rank {rank}] first line")
        second = arrival(f"[rank {rank}] second line")
        assert first < idle
        assert second - first > 2.0, (
            f"rank {rank}: the first line arrived only {second - first:.2f} s before the second,"
            " so it was held back instead of streamed")


@pytest.mark.timeout(120)
def test_tqdm_bars_in_ranks_render_as_one_live_display_per_rank(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport time\nfrom tqdm import tqdm\n"
                       "for _ in tqdm(range(50)):\n    time.sleep(0.04)", timeout=RUN)
    assert r.status == "ok", r.describe()
    for m in r.of_type("stream"):
        bar_lines = [x for x in m["content"]["text"].splitlines() if "%|" in x]
        assert len(bar_lines) <= 3, f"a stream message holds {len(bar_lines)} bar lines"
    total_stream_bars = sum("%|" in x for m in r.of_type("stream")
                            for x in m["content"]["text"].splitlines())
    assert total_stream_bars <= 4, f"{total_stream_bars} bar lines printed as text"
    bars = {}  # rank -> [(display_id, text), ...]
    for m in r.of_type("display_data", "update_display_data"):
        text = m["content"]["data"].get("text/plain", "")
        found = support.RANK_LINE.match(text)
        if found and "%|" in text:
            bars.setdefault(int(found.group(1)), []).append(
                (m["content"].get("transient", {}).get("display_id"), m["msg_type"], text))
    assert set(bars) == {0, 1}, r.describe()
    ids = {rank: {i for i, _, _ in shown} for rank, shown in bars.items()}
    assert None not in ids[0] | ids[1], bars
    assert not ids[0] & ids[1], f"ranks 0 and 1 share a display: {ids}"
    for rank, shown in bars.items():
        assert shown[0][1] == "display_data", shown[0]
        assert any(t == "update_display_data" for _, t, _ in shown), shown
        assert "100%" in shown[-1][2], f"rank {rank} ends at {shown[-1][2]!r}"


# -- two kernels at once ------------------------------------------------------------

CONCURRENT_CELL = '''\
%%distributed num_processes=2 result=concurrent_result
import os, time, pathlib, torch, torch.distributed as dist
dist.init_process_group("gloo")
meeting = pathlib.Path({meeting!r})
(meeting / "{who}-{{}}".format(os.environ["RANK"])).touch()
deadline = time.monotonic() + 90
while len(list(meeting.iterdir())) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
both = len(list(meeting.iterdir())) >= 4
t = torch.ones(1)
dist.all_reduce(t)
dist.barrier()
[int(os.environ["MASTER_PORT"]), t.item(), both]
'''


@pytest.mark.timeout(300)
def test_two_kernels_run_distributed_cells_at_the_same_time(kernel, fresh_kernel, tmp_path):
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    ids = {}
    for who, k in (("a", kernel), ("b", fresh_kernel)):
        ids[who] = k.start_execute(CONCURRENT_CELL.format(meeting=str(meeting), who=who))
    results = {}
    for who, k in (("a", kernel), ("b", fresh_kernel)):
        r = k.finish(ids[who], timeout=RUN * 2)
        assert r.status == "ok", f"kernel {who}: {r.describe()}"
        results[who] = support.json_value(k, "concurrent_result")
    for who, per_rank in results.items():
        assert [v[1] for v in per_rank] == [2.0, 2.0], results
        assert all(v[2] for v in per_rank), f"kernel {who}'s ranks never met the other's: {results}"
        assert per_rank[0][0] == per_rank[1][0], results
    assert results["a"][0][0] != results["b"][0][0], f"both jobs used one MASTER_PORT: {results}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_log_folders_of_exited_kernels_are_pruned_to_the_newest_ten(kernelspec_installed,
                                                                    tmp_path):
    """A kernel's first run removes the log folders of kernels that have exited,
    beyond the newest ten and older than a day; a live kernel's folder and the
    newest ten stay."""
    root = tmp_path / "logs"
    day = 24 * 3600
    now = time.time()
    dead = []
    for i in range(13):   # pids above pid_max: certainly not running
        d = root / f"kernel-{99000000 + i}" / "run-0001-abc"
        d.mkdir(parents=True)
        (d / "rank-0.log").write_text("old\n")
        age = now - (2 + i) * day
        os.utime(d.parent, (age, age))
        dead.append(d.parent)
    young = root / "kernel-99000100"
    young.mkdir()
    live = root / f"kernel-{os.getpid()}"
    (live / "run-0001-x").mkdir(parents=True)
    os.utime(live, (now - 30 * day, now - 30 * day))
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_LOG_DIR=root))
    try:
        r = k.execute("%%distributed num_processes=2 tracking=False\n1", timeout=RUN)
        assert r.status == "ok", r.describe()
    finally:
        k.stop()
    left = sorted(p.name for p in root.iterdir())
    # the young one is among the newest ten dead folders, so nine old ones stay
    assert [d.name for d in dead[:9]] == [n for n in left if n in {d.name for d in dead}], left
    assert young.is_dir() and live.is_dir(), left
    ours = [n for n in left if n not in {d.name for d in dead} | {young.name, live.name}]
    assert len(ours) == 1 and ours[0].startswith("kernel-"), left

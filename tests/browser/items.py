"""The items every frontend is checked on (JupyterLab 4, Notebook 7, and
JupyterLab started with SIGINT ignored): each types its cells into the open
notebook, runs them and checks what the page shows. The distributed ones
leave a screenshot. Cells say tracking=False: a kernel starts its `mlflow
server` at its first tracked run (10-30 s on 2 cores), which only
test_jupyterlab.py's MLflow test pays for.
"""

LIVE = """%%distributed num_processes=2 tracking=False
import os, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank}", flush=True)
while not os.path.exists("go"):   # the test makes it once the browser showed the line above
    time.sleep(0.05)
print(f"rank {rank} went on")
rank * 10"""


def a_cell(nb):
    """An ordinary cell: its output, its value and Out's prompt."""
    cell = nb.run("distkernel_answer = 41\nprint('hello from', 'distkernel')\ndistkernel_answer + 1")
    nb.wait_done(cell)
    assert nb.outputs(cell) == ["hello from distkernel\n", "42"], nb.outputs(cell)
    prompt = cell.locator(".jp-OutputArea-executeResult .jp-OutputArea-prompt").inner_text()
    assert prompt.strip() in ("[1]:", "Out[1]:"), prompt


def live_output_under_one_status_block(nb, notebooks):
    """Each rank's lines show, labelled, while the cell runs (the ranks wait
    for a file the test makes only once the page showed them), under one
    status block that is then updated in place to say the run finished."""
    go = notebooks / "go"
    go.unlink(missing_ok=True)
    cell = nb.run(LIVE)
    for rank in (0, 1):
        nb.wait_output(cell, f"[rank {rank}] hello from rank {rank}")
    assert nb.running(cell)
    status = nb.status_blocks(cell)
    assert len(status) == 1 and "rank 0 running · rank 1 running" in status[0], nb.outputs(cell)
    assert nb.outputs(cell)[0] == status[0], "the status block is above the ranks' output"
    nb.shot("01-live-labelled-output", cell)
    go.touch()
    nb.wait_done(cell)
    # The same block, updated in place: still one, first, now finished.
    status = nb.status_blocks(cell)
    assert len(status) == 1, nb.outputs(cell)
    assert status[0].startswith("distributed: 2 CPU ranks") and "· finished" in status[0], status
    assert "rank 0 done · rank 1 done" in status[0] and "logs: " in status[0], status
    assert nb.outputs(cell)[0] == status[0]
    text = nb.output(cell)
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} went on" in text, text
    assert "rank 0: 0\nrank 1: 10" in nb.outputs(cell)[-1], nb.outputs(cell)
    nb.shot("02-status-block-in-place", cell)


FAILING = """%%distributed num_processes=2 tracking=False
import os
if os.environ["RANK"] == "1":
    raise ValueError("rank 1 fails on purpose")"""


def a_failing_rank_is_the_cells_error(nb):
    cell = nb.run(FAILING)
    nb.wait_done(cell)
    status = nb.status_blocks(cell)
    assert len(status) == 1 and "· failed" in status[0] and "rank 1 failed" in status[0], status
    error = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    text = error.inner_text()
    assert text.startswith("ValueError: [rank 1] rank 1 fails on purpose"), text
    assert "Rank 1 failed first (root cause)" in text and "line 4, in <module>" in text, text
    assert "rank 1: raised ValueError: rank 1 fails on purpose" in text, text
    nb.shot("05-error", cell)


SLEEPING = """%%distributed num_processes=2 tracking=False
import os, time
print("sleeping", flush=True)
time.sleep(600)"""


def interrupt_ends_a_distributed_cell(nb, shot="06-interrupt"):
    """The toolbar's interrupt (the server's interrupt request) ends every
    rank of a running cell, whose error says so."""
    cell = nb.run(SLEEPING)
    nb.wait_output(cell, "[rank 1] sleeping")
    nb.wait_output(cell, "[rank 0] sleeping")
    nb.interrupt()
    nb.wait_done(cell, timeout=60)
    text = nb.output(cell)
    assert "KeyboardInterrupt: interrupted: every rank was ended" in text, text
    assert "ended by distkernel (interrupted)" in text, text
    status = nb.status_blocks(cell)
    assert len(status) == 1 and "· interrupted" in status[0], status
    nb.shot(shot, cell)


def interrupt_ends_an_ordinary_cell(nb):
    cell = nb.run("import time\nprint('waiting', flush=True)\ntime.sleep(600)")
    nb.wait_output(cell, "waiting")
    nb.interrupt()
    nb.wait_done(cell, timeout=60)
    assert "KeyboardInterrupt" in nb.output(cell), nb.output(cell)
    nb.wait_idle()


def input_asks_in_the_page(nb):
    cell = nb.run("name = input('your name? ')\nprint('hello', name)")
    box = cell.locator(".jp-Stdin-input")
    box.fill("Ada")
    box.press("Enter")
    nb.wait_done(cell)
    assert "hello Ada" in nb.output(cell), nb.output(cell)


def restart_forgets_names_and_runs_ranks_again(nb):
    nb.restart()
    cell = nb.run("distkernel_answer")
    nb.wait_done(cell)
    assert "NameError" in nb.output(cell), nb.output(cell)
    cell = nb.run("%%distributed num_processes=2 tracking=False\nprint('after the restart')")
    nb.wait_done(cell)
    assert "[rank 1] after the restart" in nb.output(cell), nb.output(cell)

"""JupyterLab 4 in chromium, on the kernel installed for the test venv
(issue 34, item 3): a new notebook from the launcher, a cell, a
`%%distributed` cell's live labelled output under its status block, tqdm, the
MLflow link to a real run, an error, interrupt, restart, `input()`,
completion and the debugger panel. Each test types its cells into one notebook
on one server, as a user works down a notebook; the distributed items leave
a screenshot (lab-*.png, with the cell's output as lab-*.txt).

Only the MLflow test tracks its run: a kernel starts its `mlflow server` at
its first tracked run (10-30 s on 2 cores), so the others say tracking=False.
"""
import json
import re

import pytest

import items
import jupyter_ui

REASON = jupyter_ui.why_not()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON)

LINK = re.compile(r"^(http://127\.0\.0\.1:\d+)/#/experiments/(\d+)/runs/([0-9a-f]{32})$")


@pytest.fixture(scope="module")
def lab(tmp_path_factory, jupyter_path):
    server = jupyter_ui.Server("lab", tmp_path_factory.mktemp("lab"), jupyter_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nb(lab, context, shots):
    """A new notebook on distkernel, made from the launcher's card."""
    page = context.new_page()
    page.goto(lab.url_for("lab"))
    page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{jupyter_ui.DISPLAY_NAME}"]').click()
    notebook = jupyter_ui.Notebook(page, "lab", shots)
    notebook.wait_idle()
    yield notebook
    page.close()


@pytest.mark.timeout(120)
def test_a_new_notebook_from_the_launcher_runs_on_distkernel(lab, nb):
    assert nb.kernel_name() == jupyter_ui.DISPLAY_NAME
    sessions = lab.sessions()
    assert [s["kernel"]["name"] for s in sessions] == [jupyter_ui.KERNEL], sessions
    # The kernel picker offers it by the same name.
    nb.page.locator(".jp-NotebookPanel-toolbar .jp-KernelName").click()
    dialog = nb.page.locator(".jp-Dialog")
    assert jupyter_ui.DISPLAY_NAME in dialog.inner_text()
    dialog.locator("button.jp-mod-reject").click()
    dialog.wait_for(state="detached")


@pytest.mark.timeout(120)
def test_a_cell_prints_and_shows_its_value(nb):
    items.a_cell(nb)


@pytest.mark.timeout(180)
def test_a_distributed_cell_shows_each_ranks_lines_live_under_one_status_block(lab, nb):
    items.live_output_under_one_status_block(nb, lab.notebooks)


TQDM = """%%distributed num_processes=2 tracking=False
import os, time
from tqdm import tqdm
for step in tqdm(range(40), mininterval=0):
    time.sleep(0.01)
print("trained")"""


@pytest.mark.timeout(180)
def test_tqdm_bars_are_drawn_in_place_one_per_rank(nb):
    cell = nb.run(TQDM)
    nb.wait_done(cell)
    bars = [line for line in nb.output(cell).splitlines() if "|" in line and "it/s" in line]
    assert len(bars) == 2, nb.output(cell)
    for rank in (0, 1):
        assert any(b.startswith(f"[rank {rank}] 100%|") and "40/40" in b for b in bars), bars
        assert f"[rank {rank}] trained" in nb.output(cell)
    nb.shot("03-tqdm", cell)


MLFLOW = """%%distributed num_processes=2
import os
int(os.environ["RANK"])"""


def get(server, endpoint, **query):
    q = "&".join(f"{k}={v}" for k, v in query.items())
    with jupyter_ui.NO_PROXY.open(f"{server}/api/2.0/mlflow/{endpoint}?{q}", timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.timeout(240)
def test_the_cell_links_its_mlflow_run_on_the_server_the_kernel_started(nb):
    cell = nb.run(MLFLOW)
    nb.wait_done(cell, timeout=200)        # the kernel's first tracked run starts `mlflow server`
    link = cell.locator(".jp-OutputArea-output a", has_text="distributed-2xcpu")
    assert link.count() == 1, nb.output(cell)
    assert "MLflow run" in nb.output(cell)
    found = LINK.match(link.get_attribute("href"))
    assert found, link.get_attribute("href")
    server, _, run_id = found.groups()
    run = get(server, "runs/get", run_id=run_id)["run"]
    assert run["info"]["status"] == "FINISHED", run["info"]
    assert run["info"]["run_name"] == link.inner_text(), run["info"]
    params = {p["key"]: p["value"] for p in run["data"].get("params", [])}
    assert params.get("world_size") == "2", params
    nb.shot("04-mlflow-link", cell)


@pytest.mark.timeout(180)
def test_a_failing_rank_is_the_cells_error(nb):
    items.a_failing_rank_is_the_cells_error(nb)


@pytest.mark.timeout(180)
def test_interrupt_ends_a_distributed_cell_and_an_ordinary_one(nb):
    items.interrupt_ends_a_distributed_cell(nb)
    items.interrupt_ends_an_ordinary_cell(nb)


@pytest.mark.timeout(120)
def test_input_asks_in_the_page_and_the_cell_gets_the_answer(nb):
    items.input_asks_in_the_page(nb)


@pytest.mark.timeout(120)
def test_tab_completes_names_the_kernel_knows(nb):
    cell = nb.run("distkernel_other = 1")
    nb.wait_done(cell)
    cell = nb.type_into_last_cell("distkernel_")
    completer = nb.page.locator(".jp-Completer")
    choices = completer.locator(".jp-Completer-item")
    for attempt in (1, 2):
        # Tab completes where JupyterLab's completer has marked the editor
        # (its key binding's selector); elsewhere it indents. On 2 busy cores
        # a Tab has at times shown no completer at all here, where the same
        # steps by hand show it: the second Tab is a user's second try.
        cell.locator(".jp-mod-completer-enabled:not(.jp-mod-at-line-beginning)").wait_for()
        nb.page.keyboard.press("Tab")
        try:
            choices.first.wait_for(timeout=30_000 * attempt)
            break
        except Exception:
            if attempt == 2:
                raise
            nb.page.keyboard.press("Escape")
            cell.locator(".cm-content").click()
            nb.page.keyboard.press("End")
    values = [i.get_attribute("data-value") for i in choices.all()]
    assert "distkernel_answer" in values and "distkernel_other" in values, values
    completer.locator('.jp-Completer-item[data-value="distkernel_answer"]').click()
    assert cell.locator(".cm-content").inner_text() == "distkernel_answer"
    nb.page.keyboard.press("Shift+Enter")
    nb.wait_done(cell)
    assert nb.outputs(cell) == ["41"], nb.outputs(cell)


DEBUGGED = """def add(a, b):
    total = a + b
    return total

print("sum", add(40, 2))"""


@pytest.mark.timeout(180)
def test_a_breakpoint_in_a_cell_stops_there_and_the_panel_shows_the_variables(nb):
    page = nb.page
    bug = page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton")
    try:
        page.wait_for_selector(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton:not(.disabled)",
                               timeout=30_000)
    except Exception as e:
        # JupyterLab 4 offers it from the kernelspec's metadata.debugger
        raise AssertionError(f"no debugger offered: {bug.get_attribute('title')!r}") from e
    bug.click()
    page.wait_for_selector('.jp-DebuggerBugButton[aria-pressed="true"]')
    cell = nb.type_into_last_cell(DEBUGGED)
    # The breakpoint gutter's first element is a spacer: nth(2) is line 2.
    cell.locator(".cm-gutters .cm-breakpoint-gutter .cm-gutterElement").nth(2).click()
    page.locator(".jp-DebuggerBreakpoints .jp-DebuggerBreakpoint").first.wait_for()
    page.keyboard.press("Shift+Enter")
    frame = page.locator(".jp-DebuggerCallstackFrame").first
    frame.wait_for()
    assert frame.locator(".jp-DebuggerCallstackFrame-name").inner_text() == "add"
    assert frame.locator(".jp-DebuggerCallstackFrame-location").inner_text().endswith(":2")
    variables = page.locator(".jp-DebuggerVariables")
    page.wait_for_function(
        "(el) => /a\\s*:?\\s*40/.test(el.innerText) && /b\\s*:?\\s*2/.test(el.innerText)",
        arg=variables.element_handle())
    assert nb.running(cell)
    # The call stack's Continue (F9)
    page.locator('jp-button[data-command="debugger:continue"]').click()
    nb.wait_done(cell)
    assert nb.output(cell).strip() == "sum 42", nb.output(cell)
    bug.click()
    page.wait_for_selector('.jp-DebuggerBugButton[aria-pressed="false"]')


@pytest.mark.timeout(180)
def test_restart_forgets_the_notebooks_names_and_runs_ranks_again(nb):
    items.restart_forgets_names_and_runs_ranks_again(nb)

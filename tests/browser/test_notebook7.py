"""Notebook 7 in chromium, on the kernel installed for the test venv (issue
34, item 3): a new notebook from the file browser's New menu (it opens in a
tab of its own), a cell, a `%%distributed` cell's live labelled output under
its status block, an error, interrupt, `input()` and restart. Notebook 7 is
built from JupyterLab's components, so the items are test_jupyterlab.py's
(items.py); the screenshots are notebook7-*.png.
"""
import pytest

import items
import jupyter_ui

REASON = jupyter_ui.why_not()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON)


@pytest.fixture(scope="module")
def server(tmp_path_factory, jupyter_path):
    s = jupyter_ui.Server("notebook", tmp_path_factory.mktemp("notebook7"), jupyter_path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tree(server, context):
    """The file browser, with its New menu open."""
    page = context.new_page()
    page.goto(server.url_for("tree"))
    page.locator('[data-jp-item-name="new-dropdown"] .lm-MenuBar-item').click()
    yield page
    page.close()


@pytest.fixture(scope="module")
def nb(tree, context, shots):
    """A new notebook on distkernel, picked in the New menu."""
    with context.expect_page() as opened:
        tree.locator(".lm-Menu-item", has_text=jupyter_ui.DISPLAY_NAME).click()
    page = opened.value
    notebook = jupyter_ui.Notebook(page, "notebook7", shots)
    notebook.wait_idle()
    yield notebook
    page.close()


@pytest.mark.timeout(120)
def test_a_new_notebook_from_the_new_menu_runs_on_distkernel(server, nb):
    assert nb.page.url.startswith(f"{server.url}/notebooks/Untitled"), nb.page.url
    assert nb.kernel_name() == jupyter_ui.DISPLAY_NAME
    sessions = server.sessions()
    assert [s["kernel"]["name"] for s in sessions] == [jupyter_ui.KERNEL], sessions


@pytest.mark.timeout(120)
def test_a_cell_prints_and_shows_its_value(nb):
    items.a_cell(nb)


@pytest.mark.timeout(180)
def test_a_distributed_cell_shows_each_ranks_lines_live_under_one_status_block(server, nb):
    items.live_output_under_one_status_block(nb, server.notebooks)


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


@pytest.mark.timeout(180)
def test_restart_forgets_the_notebooks_names_and_runs_ranks_again(nb):
    items.restart_forgets_names_and_runs_ranks_again(nb)

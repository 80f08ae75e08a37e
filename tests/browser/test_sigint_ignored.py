"""Interrupt from JupyterLab on a server started with SIGINT ignored (issue
34, item 3), as a script that starts `jupyter lab` in the background does:
the server and every kernel it starts inherit SIG_IGN for SIGINT, and the
toolbar's interrupt must still end a running cell, ordinary or distributed.
Screenshot: lab-sigint-ignored-06-interrupt.png.
"""
import pytest

import items
import jupyter_ui

REASON = jupyter_ui.why_not()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON)


@pytest.fixture(scope="module")
def server(tmp_path_factory, jupyter_path):
    s = jupyter_ui.Server("lab", tmp_path_factory.mktemp("sigint-ignored"), jupyter_path,
                          sigint_ignored=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def nb(server, context, shots):
    page = context.new_page()
    page.goto(server.url_for("lab"))
    page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{jupyter_ui.DISPLAY_NAME}"]').click()
    notebook = jupyter_ui.Notebook(page, "lab-sigint-ignored", shots)
    notebook.wait_idle()
    yield notebook
    page.close()


@pytest.mark.timeout(180)
def test_interrupt_ends_cells_on_a_server_that_ignores_sigint(server, nb):
    assert server.sigint_ignored(), "the server was meant to start with SIGINT ignored"
    items.interrupt_ends_an_ordinary_cell(nb)
    items.interrupt_ends_a_distributed_cell(nb)

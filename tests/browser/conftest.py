"""Fixtures of the browser tests: one chromium for the session, the kernelspec
`distkernel install --python VENV/bin/python` writes, one Jupyter server per
variant (a module each), and the folder the screenshots go to.

Run by the test venv's python: `$VENV/bin/python -m pytest tests/browser`
with DISTKERNEL_TEST_VENV=$VENV and DISTKERNEL_PREFIX (the built kernel);
DISTKERNEL_BROWSER_SHOTS names the screenshots' folder (default: the session's
temporary folder, printed at the end).
"""
import os
import pathlib

import pytest

import jupyter_ui


@pytest.fixture(scope="session")
def shots(tmp_path_factory):
    where = os.environ.get("DISTKERNEL_BROWSER_SHOTS")
    path = pathlib.Path(where) if where else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    yield path
    print(f"\nbrowser screenshots: {path}")


@pytest.fixture(scope="session")
def jupyter_path(tmp_path_factory):
    return jupyter_ui.install_kernel(tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        # As root (CI) Playwright starts chromium with --no-sandbox, its default
        # (chromium_sandbox=False); as a user, too.
        b = p.chromium.launch(executable_path=str(jupyter_ui.CHROMIUM))
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 960})
    ctx.set_default_timeout(60_000)
    yield ctx
    ctx.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.call_report = report


@pytest.fixture(autouse=True)
def shot_on_failure(request, shots):
    """A failed test leaves the page it failed on: failed-TEST.png."""
    yield
    report = getattr(request.node, "call_report", None)
    nb = request.node.funcargs.get("nb")
    if report is not None and report.failed and nb is not None:
        try:
            nb.page.screenshot(path=str(shots / f"failed-{request.node.name}.png"))
        except Exception as e:   # the page itself may be what failed
            print(f"no screenshot of the failure: {e}")

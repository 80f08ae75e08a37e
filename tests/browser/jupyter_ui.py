"""
What the browser tests share: a Jupyter server started as a user starts one
(`jupyter lab` or `jupyter notebook` from the test venv, in the background, on
a loopback port with a token), and a notebook page driven through Debian's
chromium by Playwright for Python.

The server finds the kernel that `distkernel install --python VENV/bin/python`
wrote through JUPYTER_PATH, as a user's does once they ran it; its state
(config, runtime files, JupyterLab's settings and workspaces, IPython's
profile, the ranks' logs) lives in the test's temporary folder.

Everything waits for a condition (the server's /api/status answering, a
cell's output showing a text, the cell's prompt getting its number), never
for a fixed time.
"""
import json
import os
import pathlib
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

VENV = pathlib.Path(os.environ.get("DISTKERNEL_TEST_VENV", "") or "/nonexistent-venv")
PREFIX = pathlib.Path(os.environ.get("DISTKERNEL_PREFIX",
                                     pathlib.Path(__file__).resolve().parents[2] / "prefix")).resolve()
CHROMIUM = pathlib.Path(os.environ.get("DISTKERNEL_CHROMIUM", "/usr/bin/chromium"))
KERNEL = "distkernel"
# What `distkernel install --name distkernel` names it: the venv's Python
# (this python's version) and the venv's folder.
DISPLAY_NAME = f"distkernel (Python {sys.version_info[0]}.{sys.version_info[1]}, {VENV.name})"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# Playwright's own browsers are never used nor fetched: the suite runs
# Debian's chromium (executable_path), and these keep any install step from
# downloading one.
os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
os.environ.setdefault("PLAYWRIGHT_BROWSERS_PATH", "/nonexistent-playwright-browsers")


def why_not():
    """Why the browser tests cannot run here, or "" when they can."""
    if not os.environ.get("DISTKERNEL_TEST_VENV"):
        return "no test venv of today's stack (scripts/venv.sh; scripts/test.sh sets DISTKERNEL_TEST_VENV)"
    if pathlib.Path(sys.prefix).resolve() != VENV.resolve():
        return f"run by the test venv's python ({VENV}/bin/python -m pytest tests/browser)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no {CHROMIUM}: install Debian's chromium (scripts/deps.sh)"
    if not (PREFIX / "bin" / "distkernel").exists():
        return f"no kernel built under {PREFIX} (set DISTKERNEL_PREFIX)"
    return ""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def install_kernel(where):
    """The kernelspec a user gets from `distkernel install --python VENV/bin/python`,
    under WHERE; returns the JUPYTER_PATH entry that holds it."""
    subprocess.run([str(PREFIX / "bin" / "distkernel"), "install", "--prefix", str(where),
                    "--name", KERNEL, "--python", str(VENV / "bin" / "python")],
                   check=True, capture_output=True, timeout=120)
    spec = json.loads((where / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json").read_text())
    assert spec["display_name"] == DISPLAY_NAME, spec
    return where / "share" / "jupyter"


# Started with SIGINT ignored, as a script that starts the server in the
# background does (`nohup`-less `jupyter lab &` from a non-interactive shell):
# the server, and every kernel it starts, inherits SIG_IGN for SIGINT.
SIGINT_IGNORED = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "os.execv(sys.argv[1], sys.argv[1:])")


class Server:
    """`jupyter APP` (lab or notebook) from the test venv, started in the background."""

    def __init__(self, app, root, jupyter_path, sigint_ignored=False):
        self.app = app
        self.root = root
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        work = root / ".server"
        notebooks = root / "notebooks"        # the server's root_dir: the kernels' cwd
        notebooks.mkdir(mode=0o700)
        logs = root / "logs"
        logs.mkdir(mode=0o700)
        self.notebooks = notebooks
        settings = work / "settings"
        # No news toast over the notebook, and no request to the outside.
        self._setting(settings, "apputils-extension", "notification",
                      {"fetchNews": "false", "checkForUpdates": False})
        # JupyterLab drops completions that take over 1 s; a kernel's first
        # one (IPython's jedi warming up) takes that long on 2 busy cores, for
        # ipykernel too. The tests check what is completed, not how fast.
        self._setting(settings, "completer-extension", "manager", {"providerTimeout": 20000})
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MLFLOW_", "DISTKERNEL_MLFLOW_", "JUPYTER", "JPY_"))}
        env.update(JUPYTER_PATH=str(jupyter_path), JUPYTER_CONFIG_DIR=str(work / "config"),
                   JUPYTER_DATA_DIR=str(work / "data"), JUPYTER_RUNTIME_DIR=str(work / "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"),
                   IPYTHONDIR=str(work / "ipython"), DISTKERNEL_LOG_DIR=str(logs),
                   # the test command runs this beside other suites: MLflow 3's
                   # server then takes over a minute to answer
                   DISTKERNEL_MLFLOW_START_TIMEOUT="300", DISTKERNEL_MLFLOW_TIMEOUT="15")
        argv = [str(VENV / "bin" / "jupyter"), app, "--no-browser", "--ip=127.0.0.1",
                f"--port={self.port}", "--port-retries=0",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={notebooks}"]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        if sigint_ignored:
            argv = [sys.executable, "-c", SIGINT_IGNORED] + argv
        self.log_path = work / "server.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=str(notebooks))
        try:
            self._wait_up(timeout=90)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _setting(settings, extension, plugin, values):
        folder = settings / "@jupyterlab" / extension
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))

    def api(self, path, method="GET"):
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with NO_PROXY.open(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def sessions(self, timeout=60):
        """The server's sessions, once it lists one: a page names its kernel
        as soon as it asked for it, before the server has made the session."""
        deadline = time.monotonic() + timeout
        while not (listed := self.api("sessions")) and time.monotonic() < deadline:
            time.sleep(0.2)
        return listed

    def _wait_up(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`jupyter {self.app}` exited ({self.proc.returncode}):\n"
                                   + self.log_text())
            try:
                self.api("status")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"`jupyter {self.app}` did not answer within {timeout} s:\n"
                                       + self.log_text())
                time.sleep(0.1)

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def sigint_ignored(self):
        """Whether the server process ignores SIGINT."""
        return sigint_ignored(self.proc.pid)

    def url_for(self, path):
        return f"{self.url}/{path}?token={self.token}"

    def stop(self):
        """Shut the server down as `jupyter server stop` does (its kernels with it),
        then check that nothing it started is left."""
        import psutil
        try:
            left = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            left = []
        if self.proc.poll() is None:
            try:
                self.api("shutdown", method="POST")
            except OSError:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        _, alive = psutil.wait_procs(left, timeout=30)
        for p in alive:
            p.kill()
        assert not alive, f"left behind by `jupyter {self.app}`: " + ", ".join(
            f"{p.pid}" for p in alive)


def sigint_ignored(pid):
    """Whether process PID ignores SIGINT (SigIgn in its /proc status)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


PROMPT_DONE = re.compile(r"^\[\d+\]:")


class Notebook:
    """A notebook open in a page of JupyterLab 4 or Notebook 7 (the same cells and
    toolbar: Notebook 7 is built from JupyterLab's components)."""

    def __init__(self, page, frontend, shots):
        self.page = page
        self.frontend = frontend
        self.shots = shots

    # -- cells --

    def cells(self):
        return self.page.locator(".jp-Notebook .jp-Cell")

    def type_into_last_cell(self, code):
        """Type CODE into the last (empty) cell, as a paste: CodeMirror indents
        nothing itself. The cell's locator, fixed to its index."""
        cell = self.cells().nth(self.cells().count() - 1)
        cell.locator(".cm-content").click()
        if cell.locator(".cm-content").inner_text().strip():
            # what a test that failed left there
            self.page.keyboard.press("Control+a")
            self.page.keyboard.press("Delete")
        self.page.keyboard.insert_text(code)
        return cell

    def run(self, code):
        """Type CODE into the last cell and run it with Shift+Enter (which
        adds the next empty cell); the cell's locator, fixed to its index.

        JupyterLab, just after it opened a notebook on a new kernel, now and
        then takes the Shift+Enter (the next cell appears) without sending
        the cell: its prompt stays "[ ]:" and the kernel idle, having been
        asked nothing. A cell still unsent after 15 s is run again, in place
        (Ctrl+Enter): it cannot have run, so it does not run twice."""
        cell = self.type_into_last_cell(code)
        self.page.keyboard.press("Shift+Enter")
        if not self._sent(cell, 15):
            cell.locator(".jp-InputArea-editor").click()
            self.page.keyboard.press("Control+Enter")
            assert self._sent(cell, 30), "JupyterLab did not send the cell, twice"
        return cell

    def _sent(self, cell, timeout):
        """Whether the cell's prompt leaves "[ ]:" (queued, running or done)
        within TIMEOUT seconds."""
        try:
            self.page.wait_for_function(
                "(el) => el.querySelector('.jp-InputArea-prompt').innerText.trim() != '[ ]:'",
                arg=cell.element_handle(), timeout=timeout * 1000)
            return True
        except Exception:
            return False

    def wait_done(self, cell, timeout=120):
        """Until the cell's prompt has its execution count (the reply came)."""
        self.page.wait_for_function(
            "([el, re]) => new RegExp(re).test(el.querySelector('.jp-InputArea-prompt').innerText)",
            arg=[cell.element_handle(), PROMPT_DONE.pattern], timeout=timeout * 1000)

    def running(self, cell):
        return "*" in cell.locator(".jp-InputArea-prompt").inner_text()

    def wait_output(self, cell, text, timeout=120):
        """Until the cell's output shows TEXT."""
        try:
            self.page.wait_for_function(
                "([el, t]) => { const o = el.querySelector('.jp-OutputArea');"
                " return o && o.innerText.includes(t); }",
                arg=[cell.element_handle(), text], timeout=timeout * 1000)
        except Exception as e:
            raise AssertionError(f"{text!r} not in the cell's output within {timeout} s; it shows:\n"
                                 + self.output(cell)) from e

    def output(self, cell):
        return cell.locator(".jp-OutputArea").inner_text()

    def outputs(self, cell):
        """The texts of the cell's outputs, one each, in order."""
        return cell.locator(".jp-OutputArea-output").all_inner_texts()

    def status_blocks(self, cell):
        return [t for t in self.outputs(cell) if t.startswith("distributed:")]

    def wait_idle(self, timeout=60):
        """Until the toolbar names distkernel and says the kernel is idle."""
        self.page.wait_for_function(
            "(name) => { const n = document.querySelector('.jp-NotebookPanel-toolbar .jp-KernelName');"
            " const s = document.querySelector('.jp-Notebook-ExecutionIndicator');"
            " return n && n.innerText.trim() == name && s && s.dataset.status == 'idle'; }",
            arg=DISPLAY_NAME, timeout=timeout * 1000)

    # -- the toolbar --

    def toolbar(self, command):
        return self.page.locator(f'.jp-NotebookPanel-toolbar jp-button[data-command="{command}"]')

    def interrupt(self):
        self.toolbar("notebook:interrupt-kernel").click()

    def restart(self):
        self.toolbar("notebook:restart-kernel").click()
        dialog = self.page.locator(".jp-Dialog")
        dialog.locator("button.jp-mod-accept").click()
        dialog.wait_for(state="detached")

    def kernel_name(self):
        return self.page.locator(".jp-NotebookPanel-toolbar .jp-KernelName").inner_text().strip()

    # -- what the test saw --

    def shot(self, name, cell):
        """A screenshot of the page with CELL in view, and the cell's output
        beside it as text: FRONTEND-NAME.png and .txt in the shots folder."""
        cell.scroll_into_view_if_needed()
        base = self.shots / f"{self.frontend}-{name}"
        self.page.screenshot(path=str(base.with_suffix(".png")))
        base.with_suffix(".txt").write_text(self.output(cell))

"""One job in a rank: a cell (with the notebook names it uses) or a function
(with its arguments), pickled with cloudpickle, unpickled and run in the
rank's __main__ (run_job), and what goes back: its value pickled
(pickle_value), or its error as the cell shows it (error_payload).

Before it runs, a job brings the rank what the notebook has and the rank may
not: the kernel's sys.path and the notebook folder's modules (_rankpath.py),
the cells' sources for tracebacks, and the cell's own variables (its MLflow
run's, _CellEnv).
"""

import ast
import linecache
import os
import sys
import traceback

import cloudpickle

from distkernel._rankpath import SentModules, use_kernel_sys_path

CELL_FILE = "<distributed-cell>"


def _prime_linecache(sources):
    """The notebook's cell sources, for tracebacks and inspect.getsource here
    even where the kernel's cell files cannot be read (mtime None: linecache
    keeps them when the file is missing)."""
    for filename, text in sources.items():
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def _run_cell(code, namespace, filename=CELL_FILE, line_offset=0):
    """Run CODE, the body of a cell whose first line is LINE_OFFSET lines into
    FILENAME (the cell's own file), so its lines are the notebook's."""
    if filename not in linecache.cache:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    if line_offset:
        ast.increment_lineno(tree, line_offset)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def error_payload(exc):
    """EXC as the ERROR frame's payload: JSON with its name, text and traceback."""
    import json
    # Drop distkernel's own frames before the user's code (the rank's modules',
    # and _ray.py's around a ray_launch driver): the user's code starts at the
    # cell or function.
    tb = exc.__traceback__
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while tb is not None and tb.tb_next is not None and \
            os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    return json.dumps({"ename": type(exc).__name__, "evalue": str(exc),
                       "traceback": [line.rstrip("\n") for line in lines]}).encode()


def run_job(box, main_ns, keep_globals=False):
    """Run one job (a pickled cell or function, the one item of BOX, which is
    emptied so that its bytes are freed while the job runs) in MAIN_NS; its
    value. KEEP_GLOBALS (started ranks): a notebook function runs with MAIN_NS
    as its globals, as a cell does, so it sees and sets what earlier cells and
    calls left there."""
    job = cloudpickle.loads(box.pop())
    use_kernel_sys_path(job.get("sys_path", []))
    SentModules.add(job.get("modules", {}))
    _prime_linecache(job.get("sources", {}))
    _CellEnv.apply(job.get("env", {}))
    _tracking_through_door()
    _let_go_of_earlier_runs()
    if job["kind"] == "cell":
        for name, blob in job["names"].items():
            main_ns[name] = cloudpickle.loads(blob)
        return _run_cell(job["code"], main_ns, job.get("filename", CELL_FILE),
                         job.get("line_offset", 0))
    if "job" in job:
        job = cloudpickle.loads(job["job"])
    fn = job["fn"]
    if keep_globals:
        fn = _in_namespace(fn, main_ns)
    return fn(*job["args"], **job["kwargs"])


def _in_namespace(fn, main_ns):
    """FN, if the notebook defined it, rebuilt on MAIN_NS: the names it was sent
    with go there first (as a cell's notebook names do)."""
    import types

    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return fn
    for name, value in fn.__globals__.items():
        if not name.startswith("__"):
            main_ns[name] = value
    new = types.FunctionType(fn.__code__, main_ns, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    return new


def pickle_value(value):
    try:
        return cloudpickle.dumps(value, protocol=5)
    except Exception as exc:
        return cloudpickle.dumps(_Unpicklable(repr(value), f"{type(exc).__name__}: {exc}"))


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _tracking_through_door():
    """A tracking server on the kernel host's loopback (the one the kernel
    started, or a user's on 127.0.0.1), reached from this node: there
    127.0.0.1 is this node's own. The node's agent keeps a door to it on this
    node's 127.0.0.1 for this user's processes only (dk_tunnel.h) and says
    its port in DISTKERNEL_TRACKING_PORT; MLFLOW_TRACKING_URI is pointed at
    that port, the rest of it (scheme, credentials, path) as it was."""
    port = os.environ.get("DISTKERNEL_TRACKING_PORT", "")
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not port.isdigit() or not uri:
        return
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return
    if parts.scheme not in ("http", "https") or host not in _LOOPBACK_HOSTS:
        return
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"{'127.0.0.1' if host == '::1' else host}:{port}"
    os.environ["MLFLOW_TRACKING_URI"] = urlunsplit(parts._replace(netloc=netloc))


def _let_go_of_earlier_runs():
    """On started ranks, each cell has an MLflow run of its own
    (MLFLOW_RUN_ID), which the kernel made and ends. A cell's
    `mlflow.log_metric` makes that run MLflow's active run in the process,
    and MLflow keeps it active: the next cell's metrics would go to the
    earlier cell's run. Runs left active by earlier cells are let go here,
    without a word to the server: the kernel has written their final status,
    which `mlflow.end_run()` would overwrite with FINISHED."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    stack_var = getattr(fluent, "_active_run_stack", None)
    if stack_var is None:
        return
    try:
        stack = stack_var.get()
        want = os.environ.get("MLFLOW_RUN_ID")
        stack[:] = [run for run in stack if run.info.run_id == want]
    except Exception:   # another MLflow's insides: leave them as they are
        pass


class _CellEnv:
    """The variables a cell's job sets (its MLflow run's) hold for that cell
    only: on started ranks, each cell first puts back what the ranks started
    with, so that a cell without tracking does not log into the last cell's
    run."""

    _saved = {}     # name -> the value at start (None: unset)

    @classmethod
    def apply(cls, env):
        for name, value in cls._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, value in env.items():
            cls._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value


class _Unpicklable:
    """Stands in for a rank's value that could not be pickled."""

    def __init__(self, text, why):
        self.text, self.why = text, why

    def __repr__(self):
        return f"{self.text}  (not picklable: {self.why})"

"""The user-facing distributed API: `from distkernel import distributed`.

The same object is what `from serverless_gpu import distributed` and
`from databricks.air import distributed` give inside the kernel, so notebooks
written for the managed platform run unchanged:

    @distributed(num_accelerators=8)        # or gpus=8, gpu_type="H100"
    def train(epochs, batch_size): ...
    results = train.distributed(epochs=3, batch_size=1)   # one entry per rank
"""

import functools
import os


class DistributedError(RuntimeError):
    """A rank failed. `rank_traceback` holds the root cause's traceback and a
    summary of every rank's fate."""

    def __init__(self, ename, evalue, traceback_lines):
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue
        self.rank_traceback = list(traceback_lines)

    def __str__(self):
        return "\n".join([f"{self.ename}: {self.evalue}", *self.rank_traceback])


class DistributedResult(list):
    """The value of every rank, in rank order. `log_dir` holds rank-N.log files;
    `run_url` is the run's MLflow page (None when tracking is off)."""

    log_dir = None
    run_url = None


def _option_text(options):
    parts = []
    options = dict(options)
    # remote=True: the ranks run on a cluster's nodes, which Slurm allocates.
    if options.pop("remote", None) and options.get("launcher") is None:
        options["launcher"] = "slurm"
    for name, value in options.items():
        if value is None and name != "timeout":
            continue
        if isinstance(value, bool) or value is None:
            text = repr(value)
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = repr(str(value))
        parts.append(f"{name}={text}")
    return " ".join(parts)


def _function_payload(fn, args, kwargs):
    import cloudpickle

    import sys

    from distkernel import _cells

    job = {"kind": "function", "fn": fn, "args": args, "kwargs": kwargs}
    try:
        sources = {}
        blob = _cells.dumps_with_sources(job, sources)
        # The rank puts the sources of the notebook's cells in linecache first.
        # sys.path comes first, outside the pickled job: unpickling the
        # function may import the notebook's own modules.
        return cloudpickle.dumps({"kind": "function", "job": blob, "sources": sources,
                                  "sys_path": list(sys.path)}, protocol=5)
    except Exception as exc:
        culprit = _find_unsendable(fn, args, kwargs)
        raise TypeError(
            f"{culprit} cannot be sent to the ranks ({type(exc).__name__}: {exc}). "
            "Create or load it inside the function instead.") from None


def _find_unsendable(fn, args, kwargs):
    import cloudpickle

    def sendable(value):
        try:
            cloudpickle.dumps(value)
            return True
        except Exception:
            return False

    for i, value in enumerate(args):
        if not sendable(value):
            return f"argument {i}"
    for name, value in kwargs.items():
        if not sendable(value):
            return f"argument {name!r}"
    globals_ = getattr(fn, "__globals__", {})
    for name in getattr(getattr(fn, "__code__", None), "co_names", ()):
        if name in globals_ and not sendable(globals_[name]):
            return f"the notebook variable {name!r}"
    return f"the function {getattr(fn, '__name__', fn)!r}"


class DistributedFunction:
    """A function that runs as N ranks with `.distributed(...)`; calling it
    directly runs it here, once."""

    def __init__(self, fn, options):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._options = dict(options)

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def distributed(self, *args, **kwargs):
        try:
            import _distkernel
        except ImportError:
            raise RuntimeError("distributed functions run inside the distkernel Jupyter kernel; "
                               "select the 'distkernel' kernel for this notebook") from None
        import cloudpickle

        try:
            payload = _function_payload(self._fn, args, kwargs)
            results, log_dir, run_url = _distkernel.run_job(_option_text(self._options), payload)
        except BaseException as exc:
            _show_without_internal_frames(exc)
            raise
        out = DistributedResult(
            cloudpickle.loads(blob) if blob is not None else None for blob in results)
        out.log_dir = log_dir
        out.run_url = run_url or None
        return out


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _show_without_internal_frames(exc):
    """What the notebook shows for an error of a .distributed() call: a first
    line that says what happened (Notebook 6 shows only the traceback list),
    then the user's own frames; distkernel's are left out, they only say how
    the error reached the cell. IPython renders an exception through its
    _render_traceback_ when it has one, as it does for ipyparallel's."""
    def render():
        tb = _user_frames(exc.__traceback__)
        summary = str(exc).split("\n", 1)[0]
        headline = f"\x1b[0;31m{type(exc).__name__}\x1b[0m: {summary}"
        try:
            from IPython import get_ipython
            shell = get_ipython()
            stb = shell.InteractiveTB.structured_traceback(type(exc), exc, tb)
        except Exception:
            import traceback
            stb = [line.rstrip("\n") for line in traceback.format_exception(type(exc), exc, tb)]
        return [headline, *stb]

    try:
        exc._render_traceback_ = render
    except AttributeError:
        pass


def _user_frames(tb):
    """The traceback TB without the frames of distkernel's own modules."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    for this, after in zip(kept, kept[1:] + [None]):
        this.tb_next = after
    return kept[0] if kept else None


def distributed(fn=None, **options):
    """Make FN runnable as torch.distributed ranks: `FN.distributed(*args)`.

    Options (as for %%distributed): num_accelerators (gpus), accelerator_type
    (gpu_type), num_processes, timeout (seconds, default 10800; None for none),
    output ("all" or "rank0"), check, log_cap (the most each rank's log keeps:
    bytes, or "64M", "2G"). Use as @distributed or @distributed(...).
    """
    if fn is not None and callable(fn):
        return DistributedFunction(fn, options)

    def wrap(f):
        return DistributedFunction(f, options)
    return wrap


def get_global_rank():
    return int(os.environ.get("RANK", "0"))


def get_local_rank():
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_local_world_size():
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def get_node_rank():
    return int(os.environ.get("GROUP_RANK", "0"))

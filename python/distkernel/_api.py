"""The user-facing distributed API: `from distkernel import distributed`.

`from serverless_gpu import distributed` and `from databricks.air import
distributed` give the same decorator inside the kernel, so notebooks written for
the managed platform run unchanged:

    @distributed(num_accelerators=8)        # or gpus=8, gpu_type="H100"
    def train(epochs, batch_size): ...
    results = train.distributed(epochs=3, batch_size=1)   # one entry per rank

They differ where the platform's two packages differ: under databricks.air (and
distkernel) the old names gpus= and gpu_type= work and raise a FutureWarning
naming the new ones, once per line that uses them; under serverless_gpu they
are the names. `ray_launch` is the same decorator with Ray on the ranks
(distkernel/_ray.py).
"""

import functools
import os
import sys
import warnings


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
        if name == "output" and isinstance(value, (list, tuple, range, set, frozenset)):
            # output=[0, 8] or range(8): the magic's list of ranks, "0,8"
            text = repr(",".join(str(int(r)) for r in sorted(value)))
        elif isinstance(value, bool) or value is None:
            text = repr(value)
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = repr(str(value))
        parts.append(f"{name}={text}")
    return " ".join(parts)


def _function_payload(fn, args, kwargs, runner=None):
    """The job for the ranks: FN(*ARGS, **KWARGS), or RUNNER(FN, ARGS, KWARGS,
    *extra) when RUNNER is a (function, extra) pair that wraps the call."""
    import cloudpickle

    from distkernel import _cells

    if runner is None:
        job = {"kind": "function", "fn": fn, "args": args, "kwargs": kwargs}
    else:
        job = {"kind": "function", "fn": runner[0], "args": (fn, args, kwargs, *runner[1]),
               "kwargs": {}}
    try:
        sources, imports = {}, set()
        blob = _cells.dumps_with_sources(job, sources, imports)
        # The rank puts the sources of the notebook's cells in linecache first.
        # sys.path comes first, outside the pickled job: unpickling the
        # function may import the notebook's own modules.
        return cloudpickle.dumps({"kind": "function", "job": blob, "sources": sources,
                                  "sys_path": list(sys.path), "imports": sorted(imports)},
                                 protocol=5)
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
        results, log_dir, run_url = self._run(args, kwargs, None)
        out = DistributedResult(results)
        out.log_dir = log_dir
        out.run_url = run_url or None
        return out

    def _run(self, args, kwargs, runner):
        try:
            import _distkernel
        except ImportError:
            raise RuntimeError("distributed functions run inside the distkernel Jupyter kernel; "
                               "select the 'distkernel' kernel for this notebook") from None
        import cloudpickle

        try:
            payload = _function_payload(self._fn, args, kwargs, runner)
            results, log_dir, run_url = _distkernel.run_job(_option_text(self._options), payload)
        except BaseException as exc:
            _show_without_internal_frames(exc)
            raise
        values = [cloudpickle.loads(blob) if blob is not None else None for blob in results]
        return values, log_dir, run_url


class RayLaunchFunction(DistributedFunction):
    """A function that runs as the Ray driver on rank 0 of N ranks, the other
    ranks being the Ray cluster's workers: `.distributed(...)` returns the
    driver's value."""

    def distributed(self, *args, **kwargs):
        from distkernel import _ray

        try:
            _ray.ray_command()   # before anything starts
        except _ray.RayNotInstalled as exc:
            _show_without_internal_frames(exc)
            raise
        gpu = self._options.get("num_processes") is None
        values, _, _ = self._run(args, kwargs, (_ray.run_as_driver, (gpu,)))
        return values[0]


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


_OLD_NAMES = {"gpus": "num_accelerators", "gpu_type": "accelerator_type"}
_warned_sites = set()


def _warn_old_names(options, package, depth):
    """A FutureWarning for each old option name in OPTIONS, at the caller DEPTH
    frames up, once per line (a cell's lines included: every cell is a file of
    its own, so two cells' line 2 are two lines)."""
    frame = sys._getframe(depth + 1)
    for old, new in _OLD_NAMES.items():
        if old not in options:
            continue
        site = (frame.f_code.co_filename, frame.f_lineno, old)
        if site in _warned_sites:
            continue
        _warned_sites.add(site)
        hint = " (an AcceleratorType such as GPU_8xH100)" if old == "gpu_type" else ""
        warnings.warn_explicit(
            f"{old}= is deprecated ({package} removes it in the platform's environment "
            f"version 7); use {new}={hint} instead", FutureWarning, frame.f_code.co_filename,
            frame.f_lineno, module=frame.f_globals.get("__name__"),
            module_globals=frame.f_globals)


def _decorator(kind, package, deprecates_old_names):
    def decorator(fn=None, **options):
        if deprecates_old_names:
            _warn_old_names(options, package, 1)
        if fn is not None and callable(fn):
            return kind(fn, options)

        def wrap(f):
            return kind(f, options)
        return wrap
    return decorator


distributed = _decorator(DistributedFunction, "databricks.air", True)
distributed.__name__ = distributed.__qualname__ = "distributed"
distributed.__doc__ = """Make FN runnable as torch.distributed ranks: `FN.distributed(*args)`.

    Options (as for %%distributed): num_accelerators (gpus), accelerator_type
    (gpu_type; an AcceleratorType or GPUType, or its string), num_processes,
    timeout (seconds, default 10800; None for none), output ("all", "rank0",
    "local0", or ranks: "0,8,16-31", [0, 8], range(4)), check, log_cap (the most each rank's log keeps: bytes, or "64M", "2G"),
    experiment, run_name, tracking. Use as @distributed or @distributed(...).
    gpus= and gpu_type= raise a FutureWarning, as under databricks.air.
    """

# serverless_gpu's: gpus= and gpu_type= are its names, not deprecated there.
serverless_distributed = _decorator(DistributedFunction, "serverless_gpu", False)
serverless_distributed.__name__ = serverless_distributed.__qualname__ = "distributed"
serverless_distributed.__doc__ = distributed.__doc__.replace(
    "gpus= and gpu_type= raise a FutureWarning, as under databricks.air.",
    "gpus= and gpu_type= are serverless_gpu's names for num_accelerators and accelerator_type.")

_RAY_DOC = """Make FN the Ray driver of a Ray cluster on N ranks: `FN.distributed(*args)`
    returns FN's value. Every rank joins a torch rendezvous; rank 0 runs
    `ray start --head`, sets RAY_ADDRESS and runs FN; the others run
    `ray start --address=...` and wait for it; every rank runs `ray stop` at
    the end, however the run ends. Options as for @distributed. Needs the
    `ray` command on PATH, checked before anything starts."""

ray_launch = _decorator(RayLaunchFunction, "databricks.air", True)
ray_launch.__name__ = ray_launch.__qualname__ = "ray_launch"
ray_launch.__doc__ = _RAY_DOC
serverless_ray_launch = _decorator(RayLaunchFunction, "serverless_gpu", False)
serverless_ray_launch.__name__ = serverless_ray_launch.__qualname__ = "ray_launch"
serverless_ray_launch.__doc__ = _RAY_DOC


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

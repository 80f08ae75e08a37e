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
    for name, value in options.items():
        if name == "remote":
            warnings.warn("remote= has no effect: distkernel runs the ranks on this node",
                          FutureWarning, stacklevel=4)
            continue
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

    job = {"kind": "function", "fn": fn, "args": args, "kwargs": kwargs}
    try:
        return cloudpickle.dumps(job, protocol=5)
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

        payload = _function_payload(self._fn, args, kwargs)
        results, log_dir, run_url = _distkernel.run_job(_option_text(self._options), payload)
        out = DistributedResult(
            cloudpickle.loads(blob) if blob is not None else None for blob in results)
        out.log_dir = log_dir
        out.run_url = run_url or None
        return out


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

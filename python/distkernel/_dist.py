"""The kernel side of %%distributed in Python: what only Python can do.

The C side (distributed/dk_distributed.c and dk_dist_*.c) parses options, checks devices, runs the
ranks and relays their output; it calls here to pickle what the cell needs
before any rank starts, and to turn the ranks' pickled values into the cell's
result.
"""

import ast
import linecache
import os
import sys

import cloudpickle
from IPython.core.interactiveshell import InteractiveShell

from distkernel._api import DistributedError
from distkernel._results import results_text
from distkernel._iopub import dumps  # noqa: F401  (used by the C side)

# Names IPython keeps in the namespace for itself; never sent.
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_i", "_ii",
                  "_iii", "_ih", "_oh", "_dh"}




# Names through which code imports what no import statement shows.
_DYNAMIC_IMPORTS = {"__import__", "import_module", "exec", "eval", "run_path", "run_module",
                    "get_ipython"}


def _read_cell(code):
    """One walk of the cell's syntax tree: the names it reads (the notebook
    values to send), and the top-level names of the modules its own code
    imports ("." for a relative import, "<dynamic>" where it may import by
    other means)."""
    used, imports = set(), set()
    for node in ast.walk(ast.parse(code, "<distributed-cell>")):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, (ast.Load, ast.Del)):
                used.add(node.id)
            if node.id in _DYNAMIC_IMPORTS:
                imports.add("<dynamic>")
        elif isinstance(node, ast.Import):
            imports.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.add("." if node.level else (node.module or "").split(".")[0])
        elif isinstance(node, ast.Attribute) and node.attr in _DYNAMIC_IMPORTS:
            imports.add("<dynamic>")
    return used, imports


# What never imports a warm module (torch, or what the user named): the
# standard library, and what the ranks have imported before the cell runs.
_NEVER_WARM = set(getattr(sys, "stdlib_module_names", ())) | {"__main__", "builtins",
                                                             "cloudpickle", "IPython"}


def agent_warm_modules(payload, modules):
    """The warm modules (MODULES, comma-separated) a fresh run's node
    templates import, and why when that is none: a run whose code, with
    everything it sends, imports only the standard library and names no warm
    module does not wait for torch's import on every node (seconds a node);
    its ranks fork from a template that imported nothing. A run the payload
    cannot tell about (no "imports") gets them all. Returns (modules, why)."""
    import pickle
    import re

    names = [m.strip() for m in modules.split(",") if m.strip()]
    if not names:
        return modules, ""
    job = pickle.loads(payload)
    imports = job.get("imports")
    if imports is None:
        return modules, ""
    outside = sorted(set(imports) - _NEVER_WARM)
    if outside:
        return modules, ""
    text = job.get("code", "")
    for name in names:
        if re.search(r"\b%s\b" % re.escape(name.split(".")[0]), text):
            return modules, ""
    return "", (f"the nodes' templates imported none of the warm modules ({', '.join(names)}): "
                "the run's code imports only the standard library and names none of them")


def prepare_cell(code):
    """The payload for a %%distributed cell: its code and the notebook's values
    of the names it reads, each pickled on its own so that one that cannot be
    sent is named before any rank starts."""
    import sys

    shell = InteractiveShell.instance()
    ns = shell.user_ns
    hidden = shell.user_ns_hidden
    try:
        wanted, imports = _read_cell(code)
    except SyntaxError as exc:
        raise SyntaxError(f"the cell is not valid Python: {exc.msg} (line {exc.lineno})") from None
    from distkernel import _cells

    filename, line_offset = _cells.body_location(code)
    sources = {filename: "".join(linecache.getlines(filename))}
    names = {}
    for name in sorted(wanted):
        if name not in ns or name in _IPYTHON_NAMES or (name in hidden and ns[name] is hidden[name]):
            continue
        if name.startswith("_i") and name[2:].isdigit() or name.startswith("_") and name[1:].isdigit():
            continue
        try:
            names[name] = _cells.dumps_with_sources(ns[name], sources, imports)
        except Exception as exc:
            raise TypeError(
                f"the notebook variable {name!r} cannot be sent to the ranks "
                f"({type(exc).__name__}: {exc}). Create or load it inside the cell instead."
            ) from None
    return cloudpickle.dumps({"kind": "cell", "code": code, "names": names,
                              "filename": filename, "line_offset": line_offset,
                              "sources": sources, "sys_path": list(sys.path),
                              "imports": sorted(imports)}, protocol=5)


def finish_cell(results, result_name):
    """Unpickle every rank's value; store the list under RESULT_NAME if given;
    return the cell's result bundle, or None when every value is None."""
    values = [cloudpickle.loads(blob) if blob is not None else None for blob in results]
    shell = InteractiveShell.instance()
    if result_name:
        shell.user_ns[result_name] = values
    if all(v is None for v in values):
        return None
    texts = [shell.display_formatter.format(value)[0].get("text/plain", repr(value))
             for value in values]
    return {"text/plain": results_text(texts, result_name)}


def active_mlflow_run():
    """The run id of the notebook's active MLflow run, if it has one: a
    distributed run becomes its child. MLFLOW_RUN_ID set in the kernel counts,
    as MLflow's client resumes that run."""
    import os
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        try:
            run = mlflow.active_run()
            if run is not None:
                return run.info.run_id
        except Exception:
            pass
    return os.environ.get("MLFLOW_RUN_ID") or None


WHERE_HEADING = "Where the ranks were:"


def _where_the_ranks_were(traceback_lines):
    """The lines that say where the ranks were when the run was ended (the
    heading, a line per group, the stacks file), or []."""
    if WHERE_HEADING not in traceback_lines:
        return []
    at = traceback_lines.index(WHERE_HEADING)
    end = at + 1
    while end < len(traceback_lines) and traceback_lines[end]:
        end += 1
    return traceback_lines[at:end]


def raise_error(ename, evalue, traceback_lines):
    """Raise the outcome of a failed run inside the notebook's Python. A
    KeyboardInterrupt or TimeoutError says where the ranks were after its
    message, as the cell's error does (DistributedError has every line)."""
    if ename in ("KeyboardInterrupt", "TimeoutError"):
        where = _where_the_ranks_were(list(traceback_lines))
        exc = (KeyboardInterrupt if ename == "KeyboardInterrupt" else TimeoutError)(
            "\n".join([evalue, *where]))
        exc.rank_traceback = list(traceback_lines)
        raise exc
    raise DistributedError(ename, evalue, traceback_lines)


def with_env(payload, env):
    """PAYLOAD, plus environment variables each rank sets before running it
    (a round's MLflow run on started ranks, MLflow's secrets for ranks on
    Slurm's nodes, an attempt's TORCHELASTIC_* under restarts=), over those it
    has. The outer layer is a plain dict (the user's values are pickled inside
    it), so loading it here runs none of the user's code."""
    import pickle

    if not env:
        return payload
    job = pickle.loads(payload)
    job["env"] = {**job.get("env", {}), **env}
    return cloudpickle.dumps(job, protocol=5)


# The most source a run on other nodes carries of the notebook folder's modules.
LOCAL_MODULES_CAP = 16 << 20


def local_modules(root=None, cap=LOCAL_MODULES_CAP):
    """The notebook folder's own modules, as {name: (filename, source bytes,
    is_package)}, for ranks on nodes that do not share the folder (no shared
    filesystem is assumed on a cluster): every module the kernel has imported
    from the folder (ROOT, the working directory: '' on sys.path), packages and
    their imported submodules included, and every other *.py file directly in
    it, which a cell may import for the first time. Past CAP bytes the rest is
    left out, and the returned list of names left out says so."""
    root = os.path.realpath(root or os.getcwd())
    found, left_out, total = {}, [], 0

    def add(name, path, is_pkg):
        nonlocal total
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError:
            return
        if total + len(source) > cap:
            left_out.append(name)
            return
        total += len(source)
        found[name] = (path, source, is_pkg)

    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(path, str) or not path.endswith(".py"):
            continue
        parts = name.split(".")
        is_pkg = os.path.basename(path) == "__init__.py"
        expected = os.path.join(root, *parts, "__init__.py") if is_pkg \
            else os.path.join(root, *parts) + ".py"
        if os.path.realpath(path) == expected:
            add(name, path, is_pkg)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        stem, ext = os.path.splitext(entry)
        if ext == ".py" and stem.isidentifier() and stem not in found:
            path = os.path.join(root, entry)
            if os.path.isfile(path):
                add(stem, path, False)
    return found, left_out


def with_local_modules(payload):
    """PAYLOAD for ranks on other nodes: plus the notebook folder's modules
    (local_modules), which a rank imports from when its node has no such
    folder. Says on stderr what did not fit."""
    import pickle

    modules, left_out = local_modules()
    if left_out:
        print(f"[distkernel] the notebook folder's modules past {LOCAL_MODULES_CAP >> 20} MiB "
              f"were not sent to the nodes: {', '.join(left_out)}; ranks import them only "
              "where the folder is shared", file=sys.stderr)
    if not modules:
        return payload
    job = pickle.loads(payload)
    job["modules"] = modules
    return cloudpickle.dumps(job, protocol=5)


def _is_package_folder(folder):
    """Whether pip installs into FOLDER: its mtime then says when a package
    came or went. Any other folder on sys.path ('' and the working directory
    among them) changes with every file written there, a notebook's autosave
    too, and must not rebuild the template."""
    if os.path.basename(folder) in ("site-packages", "dist-packages"):
        return True
    try:
        with os.scandir(folder) as entries:
            return any(e.name.endswith((".dist-info", ".egg-info", ".pth")) for e in entries)
    except OSError:
        return False


def _module_file(name):
    """The file NAME would be imported from, found without importing it (for
    a dotted name whose parent is not imported yet, the top package's)."""
    import importlib.util

    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        name = name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return getattr(spec, "origin", None)


def warm_fingerprint(modules):
    """What a warm-start template is built from, as a digest: the kernel's
    environment, working directory and sys.path, the modules it imports, the
    state of the installed packages (the mtime of each package folder on
    sys.path, which changes when pip adds or removes a package there) and of
    the warm modules' own files (edited in place, they change no folder)."""
    import hashlib

    h = hashlib.sha256()

    def add(*parts):
        for part in parts:
            h.update(repr(part).encode("utf-8", "surrogateescape"))
            h.update(b"\0")

    # The environment the kernel runs in (distkernel install --python) is in
    # DISTKERNEL_PYTHON and sys.path already; named here too, since a template
    # of another environment must never serve this one.
    add("python", sys.executable, sys.prefix)
    add("env", sorted(os.environb.items()), "cwd", os.getcwd(), "path", list(sys.path),
        "modules", modules)
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        if not _is_package_folder(folder):
            continue
        try:
            add(folder, os.stat(folder).st_mtime_ns)
        except OSError:
            add(folder, None)
    for name in modules.split(","):
        name = name.strip()
        origin = _module_file(name) if name else None
        try:
            add(name, origin, os.stat(origin).st_mtime_ns if origin else None)
        except OSError:
            add(name, origin, None)
    return h.hexdigest()

"""Where a rank runs and what it imports from.

A rank runs in the kernel's folder where its node has one it may use, and
imports as the notebook does: the kernel's sys.path first, then its own
(use_kernel_sys_path). On another node than the kernel's, only folders and
sys.path entries that the node's other users cannot change are used
(NodeFolders), and the notebook folder's modules come in the job, imported
from memory (SentModules). A warm-start template settles the same way before
it imports its modules (settle_template).
"""

import os
import sys

from distkernel._rankio import Notes

# Whether this process runs in the kernel's folder: '' (and any relative
# entry) on sys.path names that folder only there.
_IN_KERNEL_FOLDER = True


def enter_kernel_folder():
    """A rank's start: into the kernel's folder where it may
    (_enter_kernel_folder), which its sys.path then follows."""
    global _IN_KERNEL_FOLDER
    _IN_KERNEL_FOLDER = _enter_kernel_folder()


def settle_template():
    """A warm-start template's start. Each rank says in its own log what its
    distkernel-rank left out; the template only keeps from naming those paths
    again. A node agent's template, on another node than the kernel's
    (runtime/agent/agent_main.c), imports only from what its ranks may
    (NodeFolders), and not from relative entries ('' would be /)."""
    global _IN_KERNEL_FOLDER
    take_path_notes(say=False)
    if os.environ.pop("DISTKERNEL_CWD", None) is not None:
        NodeFolders.remote = True
        _IN_KERNEL_FOLDER = False


def _enter_kernel_folder():
    """A rank started by its node's agent starts where srun started the agent,
    in a folder every node has (`--chdir=/`), not in the kernel's, which need
    not exist on its node (no shared filesystem is assumed; slurmstepd would
    say so on the agent's stderr and start it in /tmp). It goes to the kernel's folder
    (DISTKERNEL_CWD) where its node has it, as a local rank runs there, and
    otherwise to the user's home; but only to a folder its node's other users
    cannot write (NodeFolders): a path that is not shared (/tmp/proj) may
    have been made on this node by someone else, with a torch.py in it. With
    neither, it stays in `/`, which every node has and only root can write,
    rather than /tmp, which every user can, and says so in its log. A rank
    that is not in the kernel's folder leaves '' (the notebook folder, on the
    kernel's sys.path) off its own: the folder's modules come in the payload
    (SentModules), and a stray file in the home must not shadow a package.
    Whether it is in the kernel's folder."""
    folder = os.environ.pop("DISTKERNEL_CWD", None)
    if folder is None:
        return True         # started here, in the kernel's folder
    NodeFolders.remote = True
    home = os.path.expanduser("~")
    for place in (folder, home):
        fd = NodeFolders.open(place)
        if fd is None:
            continue
        try:
            os.fchdir(fd)   # the folder that was checked, whatever its path names now
        except OSError:
            continue
        finally:
            os.close(fd)
        os.environ["PWD"] = place
        if place != folder and folder in NodeFolders.refused:
            Notes.say(f"running in {place}, not in the kernel's folder {folder}")
        return place == folder
    os.chdir("/")
    os.environ["PWD"] = "/"
    Notes.say(f"running in /: neither the kernel's folder {folder} nor the home {home} can "
              f"be used on this node; not in /tmp, which every user of the node can write")
    return False


class NodeFolders:
    """What a rank on another node than the kernel's may run in and import
    from: a folder or sys.path entry its node's other users cannot change,
    checked by distkernel-rank's built-in _distkernel_rankpath
    (runtime/rank/dk_rankpath.h, dk_logdir's check for code: the user's or root's,
    writable by nobody else, through parents nobody else can rename). A
    refused one is left out, and said once in the rank's log (Notes); one
    that is not there is left out silently, as the kernel's folder on a node
    that does not share it always was. A plain python3 under an agent (the
    runtime's own tests) has no checker: it enters no folder and leaves the
    rest of sys.path as it is."""

    remote = False      # this rank runs on another node (DISTKERNEL_CWD was set)
    refused = set()

    @classmethod
    def _checker(cls):
        try:
            import _distkernel_rankpath
        except ImportError:
            return None
        return _distkernel_rankpath

    @classmethod
    def open(cls, path, what="folder not entered"):
        """A descriptor on PATH if this rank may use it (the caller closes),
        else None; WHAT says what a refusal means, in the log."""
        check = cls._checker()
        if check is None:
            cls._refuse(path, f"{what}: {path} cannot be checked: this rank is not "
                              f"distkernel-rank")
            return None
        try:
            return check.open(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            cls._refuse(path, f"{what}: {exc.strerror or exc}")
            return None

    @classmethod
    def usable(cls, entry):
        """Whether sys.path entry ENTRY may stay on this rank's sys.path."""
        if entry == "" or cls._checker() is None:
            return True     # '': the working directory, checked as it was entered
        fd = cls.open(entry, "left off sys.path")
        if fd is None:
            return False
        os.close(fd)
        return True

    @classmethod
    def _refuse(cls, path, why):
        if path not in cls.refused:
            cls.refused.add(path)
            Notes.say(why)


def take_path_notes(say):
    """What distkernel-rank left out of the Python variables it started with
    on another node (runtime/rank/dk_rankpyenv.h): each path is marked
    refused, so that the kernel's sys.path, which holds a PYTHONPATH entry
    too, does not name it again (NodeFolders); with SAY, each reason goes
    to the rank's log. A template takes them without a word: each rank it
    forks says its own."""
    for line in os.environ.pop("DISTKERNEL_PATH_NOTES", "").splitlines():
        path, tab, why = line.partition("\t")
        if tab:
            NodeFolders.refused.add(path)
            if say:
                Notes.say(why)


def use_kernel_sys_path(kernel_path):
    """Import as the notebook does: the kernel's sys.path, in its order ('' first,
    the working directory, which the rank shares with the kernel), then what
    only the rank has. '' (and any relative entry, which would name a folder
    under another) stays off where the rank is not in the kernel's folder
    (_enter_kernel_folder); on another node, so does every entry the node's
    other users could have put code in (NodeFolders), the rank's own
    included."""
    if not _IN_KERNEL_FOLDER:
        kernel_path = [p for p in kernel_path if os.path.isabs(p)]
    path = list(kernel_path) + [p for p in sys.path if p not in kernel_path]
    if NodeFolders.remote:
        path = [p for p in path if NodeFolders.usable(p)]
    sys.path[:] = path


class SentModules:
    """The notebook folder's modules as the kernel sent them (a run on other
    nodes, which need not share the folder: _dist.with_local_modules), imported
    from memory. It comes last on sys.meta_path: where the folder is there
    (one node, a shared filesystem), its files are found first, as for a local
    run. A package's submodules come here too (its __path__ is empty)."""

    _modules = {}
    _installed = False

    @classmethod
    def add(cls, modules):
        if not modules:
            return
        cls._modules.update(modules)
        if not cls._installed:
            sys.meta_path.append(cls())
            cls._installed = True

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        sent = self._modules.get(name)
        if sent is None:
            return None
        filename, _, is_pkg = sent
        spec = importlib.machinery.ModuleSpec(name, self, origin=filename, is_package=is_pkg)
        spec.has_location = True
        if is_pkg:
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        filename, source, _ = self._modules[module.__name__]
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, name):
        """For tracebacks (linecache asks the module's loader when the file is
        not on this node)."""
        sent = self._modules.get(name)
        return sent[1].decode("utf-8", "replace") if sent else None

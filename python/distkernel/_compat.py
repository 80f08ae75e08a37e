"""`serverless_gpu` and `databricks.air` inside the kernel and its ranks.

Notebooks written for the managed platform import its decorator from one of
these; here they resolve to distkernel's. A finder at the *end* of sys.meta_path
provides them only when nothing real does: an installed `databricks` namespace
package (databricks-sdk) keeps working, and gains `databricks.air` only if it
lacks one.
"""

import importlib.abc
import importlib.machinery
import sys

_EXPORTS = ("distributed", "DistributedError", "get_global_rank", "get_local_rank",
            "get_world_size", "get_local_world_size", "get_node_rank")


class _Loader(importlib.abc.Loader):
    def __init__(self, package):
        self.package = package

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if self.package:
            module.__path__ = []
            return
        import distkernel
        for name in _EXPORTS:
            setattr(module, name, getattr(distkernel, name))
        module.__all__ = list(_EXPORTS)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("serverless_gpu", "databricks.air"):
            return importlib.machinery.ModuleSpec(name, _Loader(False))
        if name == "databricks":
            return importlib.machinery.ModuleSpec(name, _Loader(True), is_package=True)
        return None


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())

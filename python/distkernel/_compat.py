"""`serverless_gpu` and `databricks.air` inside the kernel and its ranks.

Notebooks written for the managed platform import from one of these; here they
resolve to distkernel's. A finder at the *end* of sys.meta_path provides them
only when nothing real does: an installed `databricks` namespace package
(databricks-sdk) keeps working, and gains `databricks.air` only if it lacks one;
the submodules below are provided only under a package this finder made.

    serverless_gpu          distributed (gpus=, gpu_type= are its names), GPUType,
                            ray_init, DistributedError, get_*_rank/size
    serverless_gpu.ray      ray_launch, ray_init
    databricks.air          distributed (gpus=, gpu_type= warn), AcceleratorType,
                            ray_launch, ray_init, DistributedError, get_*_rank/size
    databricks.air.ray      ray_launch, ray_init
    *.data                  UCVolumeDataset (distkernel.data), UCVolumeWriter and
                            UCVolumeReader (distkernel.checkpoint), over a folder
                            rather than the platform's Unity Catalog volume

A `.data` module gives its names when they are first used (PEP 562): the
dataset needs torch, the writer and reader torch 2's distributed checkpoint,
and a notebook that uses one need not have what the other needs; a name whose
module cannot be imported raises that module's ImportError, which says what
is missing.
"""

import importlib.abc
import importlib.machinery
import sys

_HELPERS = ("DistributedError", "get_global_rank", "get_local_rank", "get_world_size",
            "get_local_world_size", "get_node_rank")


def _exports(name):
    """The names module NAME provides, or None for a namespace package."""
    from distkernel import _api, _platform, _ray

    helpers = {h: getattr(_api, h) for h in _HELPERS}
    if name == "serverless_gpu":
        return {"distributed": _api.serverless_distributed, "GPUType": _platform.GPUType,
                "ray_init": _ray.ray_init, **helpers}
    if name == "serverless_gpu.ray":
        return {"ray_launch": _api.serverless_ray_launch, "ray_init": _ray.ray_init}
    if name == "databricks.air":
        return {"distributed": _api.distributed, "AcceleratorType": _platform.AcceleratorType,
                "ray_launch": _api.ray_launch, "ray_init": _ray.ray_init, **helpers}
    if name == "databricks.air.ray":
        return {"ray_launch": _api.ray_launch, "ray_init": _ray.ray_init}
    return None


# The platform's storage names, and the distkernel module and name each is.
_DATA = {"UCVolumeDataset": ("distkernel.data", "VolumeDataset"),
         "UCVolumeWriter": ("distkernel.checkpoint", "VolumeWriter"),
         "UCVolumeReader": ("distkernel.checkpoint", "VolumeReader")}


def _data_attr(name):
    """A `.data` module's NAME, imported when first asked for."""
    if name not in _DATA:
        raise AttributeError(f"module has no attribute {name!r}; the platform's storage names "
                             f"are {', '.join(_DATA)}")
    import importlib

    module, attr = _DATA[name]
    return getattr(importlib.import_module(module), attr)


_PACKAGES = ("serverless_gpu", "databricks.air")
_SUBMODULES = ("serverless_gpu.ray", "serverless_gpu.data", "databricks.air.ray",
               "databricks.air.data")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        if name.endswith(".data"):
            module.__getattr__ = _data_attr
            module.__all__ = list(_DATA)
            return
        if name == "databricks" or name in _PACKAGES:
            module.__path__ = []
        exports = _exports(name)
        if exports is not None:
            for key, value in exports.items():
                setattr(module, key, value)
            module.__all__ = list(exports)


def _ours(name):
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return isinstance(getattr(spec, "loader", None), _Loader)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in _PACKAGES or name == "databricks":
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        if name in _SUBMODULES and _ours(name.rpartition(".")[0]):
            return importlib.machinery.ModuleSpec(name, _Loader())
        return None


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())

"""The managed platform's GPU types (its storage names are distkernel.data's
and distkernel.checkpoint's, given by _compat).

`GPUType` (serverless_gpu) and `AcceleratorType` (databricks.air) are string
enums: a member is equal to its value and works wherever a string does, as
`gpu_type=` / `accelerator_type=` of the decorator or in a %%distributed line.
They name machines of the platform's fleet; here the node is given, so a type
the node lacks runs on the node's GPUs with a notice (distributed/dk_dist_plan.h).
The member lists are also in distributed/dk_dist_opts_doc.c, which judges the strings.
"""

import enum


class _TypeMeta(enum.EnumMeta):
    """Enum lookups that fail say which members exist."""

    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"{cls.__name__} has no member {name!r}; the known ones are "
                             f"{', '.join(m.name for m in cls)}")


class _PlatformType(str, enum.Enum, metaclass=_TypeMeta):
    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            for member in cls:
                if member.value.upper() == value.upper():
                    return member
        raise ValueError(f"{value!r} is not a {cls.__name__}; the known ones are "
                         f"{', '.join(m.value for m in cls)}")


class GPUType(_PlatformType):
    """The GPU models of the platform's serverless GPU fleet (serverless_gpu)."""

    A10 = "A10"
    H100 = "H100"
    B300 = "B300"


class AcceleratorType(_PlatformType):
    """The platform's accelerators, GPU_<count>x<model> (databricks.air)."""

    GPU_1xA10 = "GPU_1xA10"
    GPU_1xH100 = "GPU_1xH100"
    GPU_8xH100 = "GPU_8xH100"
    GPU_8xB300 = "GPU_8xB300"

"""distkernel: the Python side of the distkernel Jupyter kernel.

The kernel itself is a C program (the `distkernel` binary); this package holds
the glue that runs cells through IPython inside it, and the distributed API:

    from distkernel import distributed
"""

from distkernel._api import (  # noqa: F401
    DistributedError,
    DistributedResult,
    distributed,
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_world_size,
    ray_launch,
)
from distkernel._platform import AcceleratorType, GPUType  # noqa: F401
from distkernel._ray import ray_init  # noqa: F401

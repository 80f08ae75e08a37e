"""distkernel: the Python side of the distkernel Jupyter kernel.

The kernel itself is a C program (the `distkernel` binary); this package holds
the glue that runs cells through IPython inside it. It is importable only inside
the kernel, which puts it on sys.path.
"""

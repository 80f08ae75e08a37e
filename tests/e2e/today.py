"""The kernel of today's stack, as the test_today_* files use it: distkernel
installed for the test venv (scripts/venv.sh: IPython 9, torch 2, MLflow 3)
with `distkernel install --python VENV/bin/python`, as a user installs it.

A file imports what it needs; pytest takes the imported fixtures as the
module's own (so each module installs and starts its own, module-scoped):

    from today import NAME, RUN, VENV, kernels, launch, needs_venv, tracking  # noqa: F401
    pytestmark = needs_venv
"""
import os
import subprocess
import sys

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

VENV = os.environ.get("DISTKERNEL_TEST_VENV", "")
NAME = "distkernel-today"
# Ranks import torch (2 s warm, 10 s and more on 2 busy cores); a first
# torch.compile on a machine builds inductor's C++ runtime (about a minute).
RUN = 300

# Skipped where the venv is not built (scripts/test.sh builds it and passes
# its path in DISTKERNEL_TEST_VENV), and for other kernels than distkernel.
needs_venv = [
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="%%distributed is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]


@pytest.fixture(scope="module")
def tracking():
    """MLFLOW_TRACKING_URI for the module's kernels: the stand-in server, which
    answers at once. Without a URI each kernel would start a real `mlflow
    server` (the venv has MLflow), up to a minute on 2 busy cores, which
    test_today_mlflow.py tests."""
    with MlflowTestServer() as srv:
        yield srv.url


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """The Jupyter folder (for JUPYTER_PATH) of the kernelspec `distkernel
    install --python VENV/bin/python` writes."""
    prefix = tmp_path_factory.mktemp("today-kernels")
    subprocess.run([str(support.PREFIX / "bin" / "distkernel"), "install", "--prefix",
                    str(prefix), "--name", NAME, "--python", f"{VENV}/bin/python"],
                   check=True, capture_output=True, timeout=120)
    return prefix / "share" / "jupyter"


def launch(kernels, root, tracking, **env):
    """The venv's kernel in folder ROOT (its logs in ROOT/logs), tracking into
    TRACKING, with ENV added to the kernel's environment."""
    specs = KernelSpecManager(kernel_dirs=[str(kernels / "kernels")])
    km = KernelManager(kernel_name=NAME, kernel_spec_manager=specs)
    return support.Kernel.launch(km, env=support.kernel_env(DISTKERNEL_LOG_DIR=root / "logs",
                                                            MLFLOW_TRACKING_URI=tracking, **env),
                                 cwd=str(root))

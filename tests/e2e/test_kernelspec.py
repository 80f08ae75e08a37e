"""`meson install` puts a kernelspec where jupyter finds it, as xeus kernels do."""
import json
import os
import subprocess

import pytest

import support

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="checks distkernel's own installation")


@pytest.mark.timeout(10)
def test_kernelspec_runs_the_installed_binary_by_absolute_path(kernelspec_installed):
    spec = json.loads(kernelspec_installed.read_text())
    argv = spec["argv"]
    assert os.path.isabs(argv[0]), argv
    assert os.access(argv[0], os.X_OK), f"{argv[0]} is not an executable"
    assert argv[1:] == ["-f", "{connection_file}"]


@pytest.mark.timeout(10)
def test_kernelspec_declares_python_and_message_interrupts(kernelspec_installed):
    spec = json.loads(kernelspec_installed.read_text())
    assert spec["language"] == "python"
    assert spec["interrupt_mode"] == "message"
    assert spec["display_name"]
    # JupyterLab 4 offers its debugger only for a kernelspec that says so
    assert spec["metadata"]["debugger"] is True


@pytest.mark.timeout(10)
def test_kernelspec_has_logos(kernelspec_installed):
    d = kernelspec_installed.parent
    assert (d / "logo-32x32.png").is_file()
    assert (d / "logo-64x64.png").is_file()


@pytest.mark.timeout(30)
def test_jupyter_kernelspec_list_finds_distkernel_under_the_prefix(kernelspec_installed):
    env = dict(os.environ, JUPYTER_PATH=str(support.JUPYTER_DATA))
    out = subprocess.run([support.PYTHON, "-m", "jupyter_client.kernelspecapp", "list", "--json"],
                         env=env, capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    specs = json.loads(out.stdout)["kernelspecs"]
    assert "distkernel" in specs
    assert specs["distkernel"]["resource_dir"] == str(support.KERNELSPEC_DIR)

"""Headless notebooks: `jupyter nbconvert --execute` and `jupyter execute` run notebooks
on distkernel, the quickstart notebook included."""
import os
import subprocess

import nbformat
import pytest

import support

QUICKSTART = support.REPO_ROOT / "notebooks" / "quickstart.ipynb"


def small_notebook(path, marker):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('hello from the notebook')"),
        nbformat.v4.new_code_cell(
            "from IPython.display import HTML, display\ndisplay(HTML('<b>bold cell</b>'))"),
        nbformat.v4.new_code_cell("x = 21"),
        nbformat.v4.new_code_cell("x * 2"),
        nbformat.v4.new_code_cell(f"open({str(marker)!r}, 'w').write('executed')"),
    ]
    nbformat.write(nb, str(path))
    return path


def run(args, cwd, timeout=120):
    return subprocess.run([support.PYTHON, "-m", "jupyter"] + args, cwd=cwd, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=timeout)


def nbconvert_execute(notebook, out_dir):
    return run(["nbconvert", "--to", "notebook", "--execute",
                f"--ExecutePreprocessor.kernel_name={support.KERNEL_NAME}",
                str(notebook), "--output-dir", str(out_dir)], cwd=out_dir)


def outputs(cell):
    return cell.get("outputs", [])


@pytest.mark.timeout(180)
def test_nbconvert_executes_a_notebook_and_saves_its_outputs(tmp_path):
    nb_path = small_notebook(tmp_path / "small.ipynb", tmp_path / "marker")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    res = nbconvert_execute(nb_path, out_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    nb = nbformat.read(str(out_dir / "small.ipynb"), as_version=4)
    printed, displayed, assigned, result, _ = nb.cells
    assert outputs(printed) == [nbformat.v4.new_output(
        "stream", name="stdout", text="hello from the notebook\n")]
    (disp,) = outputs(displayed)
    assert disp["output_type"] == "display_data"
    assert disp["data"]["text/html"] == "<b>bold cell</b>"
    assert outputs(assigned) == []
    (res_out,) = outputs(result)
    assert res_out["output_type"] == "execute_result"
    assert res_out["data"]["text/plain"] == "42"
    assert [c.execution_count for c in nb.cells] == [1, 2, 3, 4, 5]
    assert (tmp_path / "marker").read_text() == "executed"


@pytest.mark.timeout(180)
def test_nbconvert_fails_on_a_cell_that_raises(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('notebook error 99')")]
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, str(path))
    res = nbconvert_execute(path, tmp_path)
    assert res.returncode != 0
    assert "notebook error 99" in res.stderr


@pytest.mark.timeout(180)
def test_jupyter_execute_runs_a_notebook(tmp_path):
    marker = tmp_path / "marker"
    nb_path = small_notebook(tmp_path / "small.ipynb", marker)
    res = run(["execute", f"--kernel_name={support.KERNEL_NAME}", str(nb_path)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert marker.read_text() == "executed"


@pytest.mark.timeout(300)
def test_nbconvert_executes_the_quickstart_notebook(tmp_path):
    assert QUICKSTART.is_file(), f"{QUICKSTART} is missing"
    res = nbconvert_execute(QUICKSTART, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    nb = nbformat.read(str(tmp_path / QUICKSTART.name), as_version=4)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells, "the quickstart notebook has no code cells"
    assert all(c.execution_count is not None for c in code_cells)
    errors = [o for c in code_cells for o in outputs(c) if o["output_type"] == "error"]
    assert errors == []
    assert any(outputs(c) for c in code_cells), "the quickstart printed nothing"

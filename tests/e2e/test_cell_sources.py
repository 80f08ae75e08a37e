"""Cell sources as files, as a Python kernel makes them: every cell is compiled
under `<private dir>/<murmur2 of its source>.py` and its source is written
there, so tracebacks show source lines and `inspect.getsource` works, in the
kernel and in the ranks of %%distributed and @distributed (which get the
sources in their payload, so they need not read the kernel's files).

The file name's hash is checked against the hashSeed/tmpFilePrefix that
debugInfo advertises in test_debugger.py; here, the directory's safety: private
to the user, a planted symlink never followed, removed at shutdown.
"""
import os
import stat

import pytest

import support

RUN = 120  # seconds a cell that starts ranks may take on a busy machine

NOTEBOOK_FUNCTION = '''\
def notebook_function():
    x = 1
    raise ValueError("raised on the notebook's own line")
'''

distributed_only = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                      reason="%%distributed is distkernel's")


def traceback_text(r):
    return "\n".join(r.content.get("traceback", []))


def cell_file(kernel, name):
    r = kernel.execute(f"print({name}.__code__.co_filename)")
    assert r.status == "ok", r.describe()
    return r.stdout.strip()


def test_a_cell_is_compiled_as_a_file_holding_its_source(kernel):
    r = kernel.execute(NOTEBOOK_FUNCTION)
    assert r.status == "ok", r.describe()
    path = cell_file(kernel, "notebook_function")
    name = os.path.basename(path)
    assert name.endswith(".py") and name[:-3].isdigit(), path
    with open(path, encoding="utf-8") as f:
        assert f.read() == NOTEBOOK_FUNCTION


def test_the_cell_directory_is_private_to_the_user(kernel):
    kernel.execute(NOTEBOOK_FUNCTION)
    directory = os.path.dirname(cell_file(kernel, "notebook_function"))
    st = os.lstat(directory)
    assert stat.S_ISDIR(st.st_mode)
    assert st.st_uid == os.getuid()
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


@distributed_only
def test_a_rank_traceback_shows_the_source_line_of_a_notebook_function(kernel):
    kernel.execute(NOTEBOOK_FUNCTION)
    r = kernel.execute("%%distributed num_processes=2\nnotebook_function()", timeout=RUN)
    assert r.status == "error", r.describe()
    text = traceback_text(r)
    assert 'raise ValueError("raised on the notebook\'s own line")' in text, text
    assert cell_file(kernel, "notebook_function") in text, text


@distributed_only
def test_ranks_show_source_lines_without_the_kernels_cell_files(kernel):
    """On another node the ranks cannot read the kernel's files: the payload
    carries the sources. Here the file is deleted before the run."""
    kernel.execute(NOTEBOOK_FUNCTION.replace("notebook_function", "elsewhere"))
    os.remove(cell_file(kernel, "elsewhere"))
    r = kernel.execute("%%distributed num_processes=2\n"
                       "import inspect\n"
                       "print(inspect.getsource(elsewhere).splitlines()[0])\n"
                       "elsewhere()", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "] def elsewhere():" in r.stdout, r.describe()  # the first rank to print
    assert 'raise ValueError("raised on the notebook\'s own line")' in traceback_text(r)


@distributed_only
def test_a_distributed_cell_runs_under_its_own_file_and_line_numbers(kernel):
    code = "%%distributed num_processes=2\nx = 1\nraise KeyError('line three of the cell')"
    r = kernel.execute(code, timeout=RUN)
    assert r.status == "error", r.describe()
    text = traceback_text(r)
    assert "line 3, in <module>" in text, text
    assert "raise KeyError('line three of the cell')" in text, text
    path = next(line.split('"')[1] for line in text.splitlines()
                if "line 3, in <module>" in line)
    with open(path, encoding="utf-8") as f:
        assert f.read() == code


@distributed_only
def test_getsource_of_a_notebook_function_in_a_distributed_cell(kernel):
    kernel.execute("def shown(a):\n    return a + 1\n")
    r = kernel.execute("%%distributed num_processes=2\nimport inspect\n"
                       "print(repr(inspect.getsource(shown)))", timeout=RUN)
    assert r.status == "ok", r.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] 'def shown(a):\\n    return a + 1\\n'" in r.stdout, r.stdout


@distributed_only
def test_getsource_of_a_notebook_function_in_a_distributed_function(kernel):
    r = kernel.execute(
        "from distkernel import distributed\n"
        "def helper(a):\n    return a * 2\n"
        "@distributed(num_processes=2)\n"
        "def run():\n"
        "    import inspect\n"
        "    return inspect.getsource(helper), inspect.getsource(run)\n"
        "sources = run.distributed()\n"
        "print(repr(sources[1][0]))\n"
        "print(sources[1][1].splitlines()[1])\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.stdout.splitlines() == ["'def helper(a):\\n    return a * 2\\n'", "def run():"], \
        r.describe()


@distributed_only
def test_a_rank_traceback_through_a_distributed_function_has_no_distkernel_frames(kernel):
    r = kernel.execute(
        NOTEBOOK_FUNCTION +
        "from distkernel import distributed\n"
        "@distributed(num_processes=2)\n"
        "def run():\n"
        "    notebook_function()\n"
        "run.distributed()\n", timeout=RUN)
    assert r.status == "error", r.describe()
    text = traceback_text(r)
    rank_part = text[text.index("failed first (root cause)"):]
    assert 'raise ValueError("raised on the notebook\'s own line")' in rank_part, text
    assert "    notebook_function()" in rank_part, text
    assert "distkernel/_" not in rank_part, text
    assert "DistributedFunction.distributed" not in text, text   # hidden from IPython


def test_the_cell_directory_goes_at_shutdown(fresh_kernel):
    fresh_kernel.execute(NOTEBOOK_FUNCTION)
    directory = os.path.dirname(cell_file(fresh_kernel, "notebook_function"))
    assert os.path.isdir(directory)
    fresh_kernel.kc.stop_channels()
    fresh_kernel.km.shutdown_kernel(now=False)
    assert not os.path.exists(directory)


def test_a_symlink_planted_where_a_cell_file_goes_is_not_followed(kernel, tmp_path):
    from ipykernel.compiler import murmur2_x86   # an independent murmur2
    msg = kernel.kc.session.msg("debug_request", {"type": "request", "seq": 1,
                                                  "command": "debugInfo", "arguments": {}})
    kernel.kc.control_channel.send(msg)
    info = kernel.reply(msg["header"]["msg_id"], channel="control")["content"]["body"]
    code = "def planted_here():\n    return 'the cell ran'\nprint(planted_here())\n"
    path = f"{info['tmpFilePrefix']}{murmur2_x86(code, info['hashSeed'])}.py"
    target = tmp_path / "victim.txt"
    target.write_text("untouched")
    os.symlink(target, path)
    r = kernel.execute(code)
    assert r.status == "ok" and r.stdout == "the cell ran\n", r.describe()
    assert target.read_text() == "untouched"
    st = os.lstat(path)      # the link was replaced by the cell's own file
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
    with open(path, encoding="utf-8") as f:
        assert f.read() == code

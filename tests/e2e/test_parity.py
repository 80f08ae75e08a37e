"""
Where users notice whether distkernel behaves like ipykernel: imports next to the
notebook, output of child processes, interrupts whatever the kernel inherited,
pdb, stop_on_error, connect_request, and what a distributed error looks like.

Each test is the row of a table of differences that a user found against
ipykernel 6.17; DISTKERNEL_E2E_KERNEL=python3 runs them against ipykernel.
"""
import contextlib
import json
import os
import signal
import textwrap
import time

import re

import pytest

import support

ANSI = re.compile(r"\x1b\[[0-9;]*m")

RUN = 120  # a cell that starts torch ranks, on a busy 2-core machine
DISTRIBUTED = support.KERNEL_NAME == "distkernel"
needs_distkernel = pytest.mark.skipif(not DISTRIBUTED, reason="%%distributed is distkernel's")


def ok(r):
    assert r.status == "ok", r.describe()
    return r


# ---- sys.path: modules next to the notebook -----------------------------------

@pytest.fixture
def notebook_dir(tmp_path):
    """A directory holding a notebook's own module, and another one to %cd into."""
    here = tmp_path / "project"
    there = tmp_path / "elsewhere"
    here.mkdir()
    there.mkdir()
    (here / "mymod.py").write_text("WHERE = 'project'\ndef double(x):\n    return 2 * x\n")
    (there / "othermod.py").write_text("WHERE = 'elsewhere'\n")
    return here, there


@pytest.fixture
def kernel_in(notebook_dir):
    """A kernel started the way a notebook server starts one: in the notebook's
    directory."""
    k = support.Kernel.start(cwd=str(notebook_dir[0]))
    yield k
    k.stop()


def test_a_module_next_to_the_notebook_imports(kernel_in):
    r = ok(kernel_in.execute("import sys, mymod\n(sys.path[0], mymod.WHERE)"))
    assert r.result == "('', 'project')"


def test_cd_moves_where_imports_look(kernel_in, notebook_dir):
    ok(kernel_in.execute(f"%cd {notebook_dir[1]}"))
    r = ok(kernel_in.execute("import othermod\nothermod.WHERE"))
    assert r.result == "'elsewhere'"


@needs_distkernel
def test_ranks_of_a_cell_import_the_notebooks_module(kernel_in):
    r = ok(kernel_in.execute("%%distributed num_processes=2\nimport mymod\nmymod.double(21)",
                             timeout=RUN))
    assert r.result == "rank 0: 42\nrank 1: 42"


@needs_distkernel
def test_ranks_of_a_decorated_function_import_the_notebooks_module(kernel_in):
    r = ok(kernel_in.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2)\n"
        "def f():\n"
        "    import mymod, sys\n"
        "    return (mymod.WHERE, sys.path[0])\n"
        "f.distributed()", timeout=RUN))
    assert r.result == "[('project', ''), ('project', '')]"


@needs_distkernel
def test_ranks_follow_cd_and_the_kernels_sys_path(kernel_in, notebook_dir, tmp_path):
    extra = tmp_path / "libs"
    extra.mkdir()
    (extra / "extramod.py").write_text("VALUE = 7\n")
    ok(kernel_in.execute(f"%cd {notebook_dir[1]}\nimport sys\nsys.path.append({str(extra)!r})"))
    r = ok(kernel_in.execute("%%distributed num_processes=2\nimport othermod, extramod\n"
                             "(othermod.WHERE, extramod.VALUE)", timeout=RUN))
    assert r.result == "rank 0: ('elsewhere', 7)\nrank 1: ('elsewhere', 7)"


# ---- output of child processes -------------------------------------------------

@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_children_print_into_the_cell_in_order(fresh_kernel, tmp_path, method):
    # spawn and forkserver children import the cell's module by path: the
    # function must live in a file, as it must under ipykernel.
    mod = tmp_path / "childmod.py"
    mod.write_text(textwrap.dedent("""\
        import sys
        def child(i):
            print(f"child {i} out")
            print(f"child {i} err", file=sys.stderr)
        """))
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "import multiprocessing as mp, childmod\n"
            f"ctx = mp.get_context({method!r})\n"
            "print('before', flush=True)\n"
            "for i in range(3):\n"
            "    p = ctx.Process(target=childmod.child, args=(i,))\n"
            "    p.start(); p.join()\n"
            "print('after')\n")
    r = ok(fresh_kernel.execute(code, timeout=60))
    assert r.stdout == "before\nchild 0 out\nchild 1 out\nchild 2 out\nafter\n", r.describe()
    assert r.stderr == "child 0 err\nchild 1 err\nchild 2 err\n", r.describe()
    later = ok(fresh_kernel.execute("print('next cell')"))
    assert later.stdout == "next cell\n", later.describe()


def test_os_fork_child_output_is_not_lost_when_it_exits_at_once(fresh_kernel):
    # os._exit skips every flush: what the child printed must already be out.
    r = ok(fresh_kernel.execute(
        "import os, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('from the child')\n"
        "    sys.stderr.write('child stderr\\n')\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('parent done')\n"))
    assert r.stdout == "from the child\nparent done\n", r.describe()
    assert r.stderr == "child stderr\n", r.describe()


def test_a_child_that_outlives_its_cell_never_writes_into_a_later_cell(fresh_kernel):
    k = fresh_kernel
    first = ok(k.execute(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(1.5)\n"
        "    print('late from the child', flush=True)\n"
        "    os.system('echo late from its subprocess')\n"
        "    os._exit(0)\n"
        "'forked'"))
    assert first.result == "'forked'"
    second = ok(k.execute("import time\ntime.sleep(4)\nprint('cell two')", timeout=30))
    assert second.stdout == "cell two\n", second.describe()
    late = "".join(m["content"]["text"] for m in k.iopub_for(first.msg_id)
                   if m["msg_type"] == "stream")
    assert late == "late from the child\nlate from its subprocess\n", k.iopub_for(first.msg_id)


def test_display_in_a_forked_child_shows_its_text(fresh_kernel):
    r = ok(fresh_kernel.execute(
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    display({'shown': 'by the child'})\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "'parent'"))
    assert "{'shown': 'by the child'}" in r.stdout, r.describe()
    assert r.result == "'parent'"


def test_dataloader_workers_print_into_the_cell(fresh_kernel):
    r = ok(fresh_kernel.execute(
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i):\n"
        "        print(f'item {i} in a worker', flush=True)\n"
        "        return i\n"
        "sorted(int(b) for b in DataLoader(D(), num_workers=2, batch_size=None))",
        timeout=RUN))
    assert r.result == "[0, 1, 2, 3]", r.describe()
    assert sorted(r.stdout.splitlines()) == [f"item {i} in a worker" for i in range(4)], r.describe()


def test_the_kernel_process_is_the_master_process(fresh_kernel):
    r = ok(fresh_kernel.execute(
        "import os, sys\n"
        "here = sys.stdout._is_master_process()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('child master:', sys.stdout._is_master_process())\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "here"))
    assert r.result == "True" and "child master: False" in r.stdout, r.describe()


# ---- interrupts, whatever the kernel inherited ---------------------------------

@contextlib.contextmanager
def sigint_ignored_and_blocked():
    """What a server started in the background by a script passes on: SIGINT
    ignored (and, from some launchers, blocked). Both survive exec."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGQUIT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGQUIT})
        signal.signal(signal.SIGINT, old)


@pytest.fixture
def kernel_started_with_sigint_ignored():
    with sigint_ignored_and_blocked():
        k = support.Kernel.start()
    yield k
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=True)


def interrupt_running_ranks(k):
    """Start two ranks that sleep, interrupt once one of them has printed, and
    return the cell's Execution."""
    code = "%%distributed num_processes=2\nimport time\nprint('up', flush=True)\ntime.sleep(120)"
    msg_id = k.start_execute(code)
    k.wait_iopub(lambda m: m["parent_header"].get("msg_id") == msg_id
                 and m["msg_type"] == "stream" and "up" in m["content"]["text"], timeout=RUN)
    k.km.interrupt_kernel()
    return k.finish(msg_id, timeout=RUN)


def interrupt_running(kernel, code, timeout=RUN, settle=1.0):
    msg_id = kernel.start_execute(code)
    kernel.wait_running(msg_id, settle=settle, timeout=timeout)
    started = time.monotonic()
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=timeout)
    return r, time.monotonic() - started


def test_interrupt_works_when_the_kernel_inherited_sigint_ignored(
        kernel_started_with_sigint_ignored):
    k = kernel_started_with_sigint_ignored
    r, took = interrupt_running(k, "import time\ntime.sleep(60)")
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert took < 30
    ok(k.execute("1 + 1"))


@needs_distkernel
def test_interrupt_ends_ranks_when_the_kernel_inherited_sigint_ignored(
        kernel_started_with_sigint_ignored):
    r = interrupt_running_ranks(kernel_started_with_sigint_ignored)
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()


def signal_state_of(text):
    fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    return int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)


def test_processes_the_kernel_starts_get_default_signals(kernel_started_with_sigint_ignored):
    r = ok(kernel_started_with_sigint_ignored.execute(
        "import subprocess\n"
        "print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)"))
    ignored, blocked = signal_state_of(r.stdout)
    assert ignored == 0 and blocked == 0, (hex(ignored), hex(blocked))


@needs_distkernel
def test_ranks_and_their_children_get_default_signals(kernel_started_with_sigint_ignored):
    k = kernel_started_with_sigint_ignored
    ok(k.execute("%%distributed num_processes=2 result=statuses\nimport subprocess\n"
                 "subprocess.run(['cat', '/proc/self/status'], capture_output=True,"
                 " text=True).stdout\n", timeout=RUN))
    got = ok(k.execute("[tuple(int(l.split(':')[1], 16) for l in s.splitlines()"
                       " if l.startswith(('SigIgn', 'SigBlk'))) for s in statuses]"))
    assert got.result == "[(0, 0), (0, 0)]", got.describe()


# ---- pdb, breakpoint(), input() and getpass ------------------------------------

@pytest.mark.parametrize("waiting", [
    "import pdb; pdb.set_trace()",
    "breakpoint()",
    "input('your name? ')",
    "import getpass; getpass.getpass()",
])
def test_interrupt_ends_a_cell_waiting_for_input_and_queued_cells_run(fresh_kernel, waiting):
    k = fresh_kernel
    first = k.start_execute(waiting, allow_stdin=True)
    second = k.start_execute("3 + 4")
    k.stdin_request(timeout=30)
    time.sleep(0.5)
    k.km.interrupt_kernel()
    r1 = k.finish(first, timeout=30)
    assert r1.status in ("ok", "error"), r1.describe()
    if r1.status == "error":
        assert r1.content["ename"] == "KeyboardInterrupt", r1.describe()
    r2 = k.finish(second, timeout=30)
    if r1.status == "ok":
        assert r2.status == "ok" and r2.result == "7", r2.describe()
    else:
        assert r2.status == "aborted", r2.describe()
    ok(k.execute("'still serving'"))


# ---- stop_on_error and connect_request -------------------------------------------

def test_stop_on_error_aborts_only_queued_executes(fresh_kernel):
    k = fresh_kernel
    failing = k.start_execute("import time; time.sleep(1); raise ValueError('first')")
    queued = {
        "kernel_info_request": k.send("kernel_info_request"),
        "inspect_request": k.send("inspect_request",
                                  {"code": "len", "cursor_pos": 3, "detail_level": 0}),
        "comm_info_request": k.send("comm_info_request", {}),
        "complete_request": k.send("complete_request", {"code": "pri", "cursor_pos": 3}),
        "is_complete_request": k.send("is_complete_request", {"code": "x = 1"}),
    }
    cell = k.start_execute("'should not run'")
    assert k.finish(failing).status == "error"
    for msg_type, msg_id in queued.items():
        reply = k.reply(msg_id)
        status = reply["content"]["status"]
        assert status == ("complete" if msg_type == "is_complete_request" else "ok"), (
            msg_type, reply["content"])
        k.iopub_until_idle(msg_id)
    r = k.finish(cell)
    assert r.status == "aborted", r.describe()
    ok(k.execute("'runs again'"))


def test_connect_request_gets_the_ports(kernel):
    msg_id = kernel.send("connect_request")
    reply = kernel.reply(msg_id)
    assert reply["msg_type"] == "connect_reply"
    info = kernel.connection_info()
    content = reply["content"]
    assert content["status"] == "ok"
    for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
        assert content[name] == info[name], (name, content)
    kernel.iopub_until_idle(msg_id)


# ---- what a distributed error looks like --------------------------------------

@needs_distkernel
def test_a_failed_distributed_call_shows_no_internal_frames_and_starts_with_the_cause(kernel):
    ok(kernel.execute("def helper(x):\n    raise ValueError(f'bad value {x}')\n"))
    r = kernel.execute(
        "from distkernel import distributed\n"
        "@distributed(num_processes=2)\n"
        "def f():\n"
        "    return helper(1)\n"
        "f.distributed()", timeout=RUN)
    assert r.status == "error", r.describe()
    (error,) = r.of_type("error")
    tb = error["content"]["traceback"]
    text = ANSI.sub("", "\n".join(tb))
    for internal in ("_api.py", "_dist.py", "distkernel/_", "run_job", "raise_error"):
        assert internal not in text, text
    assert "DistributedError" in tb[0] and "bad value 1" in tb[0], tb[:3]
    assert "f.distributed()" in text, text            # the user's own line stays


@needs_distkernel
def test_an_unsendable_argument_error_shows_no_internal_frames(kernel):
    r = kernel.execute(
        "import threading\nfrom distkernel import distributed\n"
        "@distributed(num_processes=2)\n"
        "def g(lock):\n"
        "    return 1\n"
        "g.distributed(threading.Lock())", timeout=RUN)
    assert r.status == "error", r.describe()
    tb = r.of_type("error")[0]["content"]["traceback"]
    assert "_api.py" not in "\n".join(tb), tb
    assert "TypeError" in tb[0] and "argument 0" in tb[0], tb[:3]


@needs_distkernel
def test_an_interrupted_distributed_cell_says_so_in_its_first_traceback_line(fresh_kernel):
    r = interrupt_running_ranks(fresh_kernel)
    tb = r.of_type("error")[0]["content"]["traceback"]
    assert "KeyboardInterrupt" in tb[0] and "interrupted" in tb[0], tb


@needs_distkernel
def test_a_failed_distributed_cell_names_the_root_cause_in_its_first_line(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os\n"
                       "if os.environ['RANK'] == '1':\n    raise KeyError('missing on one')\n",
                       timeout=RUN)
    tb = r.of_type("error")[0]["content"]["traceback"]
    assert "KeyError" in tb[0] and "missing on one" in tb[0] and "rank 1" in tb[0], tb

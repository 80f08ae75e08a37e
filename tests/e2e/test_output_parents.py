"""
Where the kernel's output goes, as ipykernel 7 decides it and users of today's
stack meet it: the request a thread's output belongs to, the running request as
the kernel object gives it (ipywidgets' Output widget captures by its msg_id),
the comms that the `comm` package makes (ipywidgets 8 makes its comms there),
and a cell whose value fails to show.

ipykernel's own suite (7's test_kernel, run against distkernel in the test
venv) checks these too; here they run against Debian's stack, which is where
most of the tests run. Against Debian's ipykernel 6.17
(DISTKERNEL_E2E_KERNEL=python3) the first, third and last fail: that is the
older behaviour.
"""
import os
import textwrap

import support


def ok(r):
    assert r.status == "ok", r.describe()
    return r


def stdout_of(kernel, msg_id):
    return "".join(m["content"]["text"] for m in kernel.iopub_for(msg_id)
                   if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")


THREAD = textwrap.dedent("""\
    import threading
    from IPython.display import display
    parent = get_ipython().get_parent()
    go, done = threading.Event(), threading.Event()

    def work():
        {how}
        go.wait(10)
        print("from the thread")
        display("shown by the thread")
        done.set()

    t = threading.Thread(target=work)
    t.start()
    """)


def test_a_thread_given_its_cell_prints_there_while_a_later_cell_runs(fresh_kernel):
    """get_ipython().set_thread_parent(parent): the thread's output goes to the
    cell that started it, not to whichever cell runs when it prints."""
    first = ok(fresh_kernel.execute(THREAD.format(
        how="get_ipython().set_thread_parent(parent)")))
    later = ok(fresh_kernel.execute("go.set(); done.wait(10); t.join(10); print('later')"))
    assert later.stdout == "later\n"
    fresh_kernel.wait_iopub(lambda m: m["msg_type"] == "display_data"
                            and m["parent_header"].get("msg_id") == first.msg_id)
    assert stdout_of(fresh_kernel, first.msg_id) == "from the thread\n"


def test_a_thread_without_a_parent_prints_into_the_running_cell(fresh_kernel):
    """The default, as in ipykernel 6 and 7: a plain thread's output goes to
    the cell running when it prints."""
    ok(fresh_kernel.execute(THREAD.format(how="pass")))
    later = ok(fresh_kernel.execute("go.set(); done.wait(10); t.join(10)"))
    assert later.stdout == "from the thread\n"
    assert [m["content"]["data"]["text/plain"] for m in later.of_type("display_data")] == \
        ["'shown by the thread'"]


def test_the_kernel_object_gives_the_running_request_as_a_message(kernel):
    """ipywidgets' Output widget reads get_ipython().kernel.get_parent()
    ["header"]["msg_id"] to capture a cell's output: the message, not its header."""
    r = ok(kernel.execute("p = get_ipython().kernel.get_parent()\n"
                          "print(p['header']['msg_id'], p['header']['msg_type'])"))
    assert r.stdout.split() == [r.msg_id, "execute_request"]
    r = ok(kernel.execute("print(get_ipython().get_parent()['header']['msg_id'])"))
    assert r.stdout.strip() == r.msg_id


def test_a_cell_whose_value_fails_to_show_fails(kernel):
    """A repr that raises: the traceback is shown and the cell's reply is an
    error, so "run all" stops there (ipykernel 7; 6.17 answered ok)."""
    r = kernel.execute("class Bad:\n    def __repr__(self):\n        1 / 0\nBad()")
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ZeroDivisionError"
    assert [m["content"]["ename"] for m in r.of_type("error")] == ["ZeroDivisionError"]


def test_a_comm_made_through_the_comm_package_reaches_the_frontend(tmp_path, kernelspec_installed):
    """ipywidgets 8 makes its comms with comm.create_comm, whose default
    sends nothing: where the `comm` package is installed, the kernel's comms
    must be what it makes. Debian's stack has no `comm`, so a stand-in of its
    two functions is put on the kernel's path."""
    (tmp_path / "comm.py").write_text(
        "def create_comm(*args, **kwargs):\n    raise RuntimeError('the default comm')\n"
        "def get_comm_manager():\n    raise RuntimeError('the default manager')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    k = support.Kernel.start(env=env)
    try:
        r = ok(k.execute("import comm\n"
                         "c = comm.create_comm(target_name='dk-test', data={'a': 1})\n"
                         "comm.get_comm_manager().get_comm(c.comm_id) is c"))
        assert r.result == "True"
        opened = [m["content"] for m in r.of_type("comm_open")]
        assert [(o["target_name"], o["data"]) for o in opened] == [("dk-test", {"a": 1})]
    finally:
        k.stop()

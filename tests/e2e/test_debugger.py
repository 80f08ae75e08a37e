"""The Jupyter debugger: debug_request/debug_reply on control, debug_event on
IOPub, with debugpy, as JupyterLab drives it: initialize, attach, dumpCell +
setBreakpoints in a cell, a stop at the breakpoint with control still
answering, stackTrace/scopes/variables, richInspectVariables, copyToGlobals,
continue, disconnect. The debugger costs nothing until a frontend attaches,
and its adapter process ends with the kernel.
"""
import os
import signal
import subprocess
import time

import pytest

import support

pytestmark = pytest.mark.skipif(
    subprocess.run([support.PYTHON, "-c", "import debugpy"], capture_output=True).returncode,
    reason="debugpy is not installed")

CELL = "def add(a, b):\n    c = a + b\n    return c\n\nadd(2, 3)\n"


class Debug:
    """A DAP session over a kernel's control channel."""

    def __init__(self, kernel):
        self.k = kernel
        self.seq = 0
        self.seen = set()    # stopped events already waited for

    def __call__(self, command, arguments=None, timeout=30):
        self.seq += 1
        msg = self.k.kc.session.msg("debug_request", {
            "type": "request", "seq": self.seq, "command": command,
            "arguments": arguments or {}})
        self.k.kc.control_channel.send(msg)
        reply = self.k.reply(msg["header"]["msg_id"], channel="control", timeout=timeout)
        assert reply["msg_type"] == "debug_reply"
        return reply["content"]

    def start(self):
        assert self("initialize", {"clientID": "test", "adapterID": "", "pathFormat": "path",
                                   "linesStartAt1": True, "columnsStartAt1": True})["success"]
        assert self("attach")["success"]

    def stop_in(self, code, line):
        """Set a breakpoint at LINE of the cell CODE, run it, wait for the stop."""
        source = self("dumpCell", {"code": code})["body"]["sourcePath"]
        r = self("setBreakpoints", {"breakpoints": [{"line": line}], "source": {"path": source},
                                    "sourceModified": False})
        assert r["success"] and r["body"]["breakpoints"][0]["verified"], r
        assert self("configurationDone")["success"]
        msg_id = self.k.start_execute(code)
        event = self.k.wait_iopub(lambda m: m["msg_type"] == "debug_event"
                                  and m["content"].get("event") == "stopped"
                                  and m["header"]["msg_id"] not in self.seen, timeout=30)
        self.seen.add(event["header"]["msg_id"])
        return source, msg_id, event["content"]["body"]


def adapters():
    """pids of running debugpy adapters."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return {int(line.split()[0]) for line in out.splitlines()
            if "debugpy/adapter" in line and "--for-server" in line}


def wait_gone(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pids & adapters():
            return True
        time.sleep(0.1)
    return False


def test_kernel_info_says_the_kernel_has_a_debugger(kernel):
    """Both ways: the field of protocol 5.3, and supported_features (JEP 92),
    which ipykernel 7 sends and JupyterLab 4 reads."""
    msg_id = kernel.kc.kernel_info()
    content = kernel.reply(msg_id)["content"]
    assert content["debugger"] is True
    assert content["supported_features"] == ["debugger"]


def test_a_started_kernel_has_not_imported_the_debugger(fresh_kernel):
    """Nor IPython's terminal (prompt_toolkit), which importing IPython before
    the kernel defers it would pull in (+5 MiB idle RSS)."""
    r = fresh_kernel.execute(
        "import sys, threading\n"
        "print(sorted(m for m in sys.modules if 'debugpy' in m or 'pydevd' in m\n"
        "             or m == 'distkernel._debugger' or m == 'prompt_toolkit'))\n"
        "print([t.name for t in threading.enumerate() if 'debug' in t.name.lower()])")
    assert r.stdout.split("\n")[:2] == ["[]", "[]"], r.describe()


def test_debug_info_names_cell_files_as_the_kernel_does(kernel):
    """JupyterLab computes a cell's file name itself from debugInfo."""
    from ipykernel.compiler import murmur2_x86   # an independent murmur2
    info = Debug(kernel)("debugInfo")["body"]
    assert info["hashMethod"] == "Murmur2" and info["tmpFileSuffix"] == ".py"
    code = "def named_by_hash():\n    return 'é'\n"
    expected = f"{info['tmpFilePrefix']}{murmur2_x86(code, info['hashSeed'])}.py"
    assert Debug(kernel)("dumpCell", {"code": code})["body"]["sourcePath"] == expected
    kernel.execute(code)
    assert kernel.execute("print(named_by_hash.__code__.co_filename)").stdout.strip() == expected
    # Every tail length of murmur2's 4-byte blocks, and multi-byte UTF-8.
    for other in ["", "a", "ab", "abc", "abcd", "abcde", "ü", "日本語", "🐍\n" * 7, "x = 1\n" * 999]:
        path = Debug(kernel)("dumpCell", {"code": other})["body"]["sourcePath"]
        assert path == f"{info['tmpFilePrefix']}{murmur2_x86(other, info['hashSeed'])}.py", other
        with open(path, encoding="utf-8") as f:
            assert f.read() == other


def test_a_debug_request_before_initialize_is_refused_and_the_kernel_goes_on(kernel):
    r = Debug(kernel)("stackTrace", {"threadId": 1})
    assert r["success"] is False and "initialize" in r["message"], r
    assert kernel.execute("print(6 * 7)").stdout == "42\n"


def test_a_debug_session_stops_in_a_cell_and_inspects_it(fresh_kernel):
    k = fresh_kernel
    debug = Debug(k)
    debug.start()
    source, msg_id, stopped = debug.stop_in(CELL, 2)
    assert stopped["reason"] == "breakpoint"
    thread = stopped["threadId"]

    # Control answers while the main thread waits inside the debugger.
    info_id = k.kc.session.msg("kernel_info_request")
    k.kc.control_channel.send(info_id)
    assert k.reply(info_id["header"]["msg_id"], channel="control", timeout=5)["content"]["debugger"]
    assert thread in debug("debugInfo")["body"]["stoppedThreads"]

    frames = debug("stackTrace", {"threadId": thread})["body"]["stackFrames"]
    assert (frames[0]["name"], frames[0]["line"], frames[0]["source"]["path"]) == \
        ("add", 2, source)
    assert all(f["source"]["path"] == source for f in frames), frames   # no frames of ours
    scopes = debug("scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
    local_ref = next(s["variablesReference"] for s in scopes if s["name"] == "Locals")
    local = {v["name"]: v["value"]
             for v in debug("variables", {"variablesReference": local_ref})["body"]["variables"]}
    assert local == {"a": "2", "b": "3"}
    rich = debug("richInspectVariables", {"variableName": "b", "frameId": frames[0]["id"]})
    assert rich["body"]["data"] == {"text/plain": "3"}
    assert debug("copyToGlobals", {"srcVariableName": "a", "dstVariableName": "copied_a",
                                   "srcFrameId": frames[0]["id"]})["success"]

    assert debug("continue", {"threadId": thread})["success"]
    done = k.finish(msg_id)
    assert done.status == "ok" and done.result == "5", done.describe()
    assert debug("disconnect", {"restart": False, "terminateDebuggee": True})["success"]
    assert k.execute("print(copied_a * 10)").stdout == "20\n"


def test_variables_outside_a_breakpoint(kernel):
    debug = Debug(kernel)
    debug.start()
    try:
        kernel.execute("greeting = 'hello'")
        names = [v["name"] for v in debug("inspectVariables")["body"]["variables"]]
        assert "greeting" in names and "In" not in names and "get_ipython" not in names
        rich = debug("richInspectVariables", {"variableName": "greeting"})
        assert rich["body"]["data"] == {"text/plain": "'hello'"}
    finally:
        debug("disconnect", {"restart": False, "terminateDebuggee": True})


def test_the_debugger_attaches_again_after_a_disconnect(fresh_kernel):
    debug = Debug(fresh_kernel)
    for _ in range(2):
        debug.start()
        _, msg_id, stopped = debug.stop_in("x = 1\ny = x + 1\n", 2)
        assert debug("continue", {"threadId": stopped["threadId"]})["success"]
        assert fresh_kernel.finish(msg_id).status == "ok"
        assert debug("disconnect", {"restart": False, "terminateDebuggee": True})["success"]


def test_interrupt_while_stopped_at_a_breakpoint_is_answered(fresh_kernel):
    k = fresh_kernel
    debug = Debug(k)
    debug.start()
    _, msg_id, stopped = debug.stop_in(CELL, 2)
    msg = k.kc.session.msg("interrupt_request")
    k.kc.control_channel.send(msg)
    assert k.reply(msg["header"]["msg_id"], channel="control", timeout=5)["content"]["status"] == "ok"
    done = k.finish(msg_id, timeout=30)
    assert done.content["ename"] == "KeyboardInterrupt", done.describe()
    assert debug("debugInfo")["body"]["stoppedThreads"] == []
    r = debug("continue", {"threadId": stopped["threadId"]}, timeout=5)   # nothing to continue
    assert r["success"] is False and "no thread is stopped" in r["message"], r
    assert k.execute("print('still here')").stdout == "still here\n"


def test_the_adapter_ends_with_the_kernel(fresh_kernel):
    before = adapters()
    Debug(fresh_kernel).start()
    ours = adapters() - before
    assert ours, "no debugpy adapter process appeared"
    fresh_kernel.kc.stop_channels()
    fresh_kernel.km.shutdown_kernel(now=False)
    assert wait_gone(ours), f"debugpy adapter {ours} outlived the kernel"


def test_the_adapter_ends_with_a_killed_kernel(fresh_kernel):
    before = adapters()
    Debug(fresh_kernel).start()
    ours = adapters() - before
    assert ours, "no debugpy adapter process appeared"
    os.kill(fresh_kernel.pid, signal.SIGKILL)
    assert wait_gone(ours), f"debugpy adapter {ours} outlived the kernel"


def test_control_answers_while_a_debug_request_waits_for_the_gil(kernel):
    """A cell in a long C call holds the GIL; a debug request must wait for
    it, but kernel_info on control must not wait behind the debug request."""
    msg_id = kernel.start_execute("total = sum(range(3 * 10**8))")
    kernel.wait_running(msg_id)
    debug = kernel.kc.session.msg("debug_request", {"type": "request", "seq": 1,
                                                    "command": "debugInfo", "arguments": {}})
    kernel.kc.control_channel.send(debug)
    info = kernel.kc.session.msg("kernel_info_request")
    kernel.kc.control_channel.send(info)
    kernel.reply(info["header"]["msg_id"], channel="control", timeout=30)
    assert not kernel.replied(debug["header"]["msg_id"], "control"), \
        "the debug reply came first: the cell did not hold the GIL long enough to tell"
    assert kernel.reply(debug["header"]["msg_id"], channel="control", timeout=60)["content"][
        "success"]
    assert kernel.finish(msg_id, timeout=60).status == "ok"


def test_debug_requests_sent_together_are_busy_then_idle_each_in_turn(kernel):
    """As ipykernel 7 answers control requests: one at a time, each its busy,
    its reply and its idle before the next one's busy, so a frontend that pairs
    them (JupyterLab's status) never sees two at once."""
    ids = []
    for seq in range(3):
        msg = kernel.kc.session.msg("debug_request", {"type": "request", "seq": 100 + seq,
                                                      "command": "debugInfo", "arguments": {}})
        kernel.kc.control_channel.send(msg)
        ids.append(msg["header"]["msg_id"])
    for msg_id in ids:
        assert kernel.reply(msg_id, channel="control")["content"]["success"]
        kernel.wait_iopub(lambda m, i=msg_id: m["msg_type"] == "status"
                          and m["parent_header"].get("msg_id") == i
                          and m["content"]["execution_state"] == "idle")
    states = sorted(((m["received_at"], ids.index(i), m["content"]["execution_state"])
                     for i in ids for m in kernel.iopub_for(i) if m["msg_type"] == "status"))
    assert [(n, state) for _, n, state in states] == \
        [(n, state) for n in range(3) for state in ("busy", "idle")]


def test_a_breakpoint_in_a_cell_with_leading_empty_lines_stops_on_its_line(fresh_kernel):
    """IPython drops a cell's leading empty lines before compiling it; while
    debugging it must not, or every line moves against the cell shown."""
    debug = Debug(fresh_kernel)
    debug.start()
    code = "\n\n" + CELL
    _, msg_id, stopped = debug.stop_in(code, 4)           # c = a + b
    frame = debug("stackTrace", {"threadId": stopped["threadId"]})["body"]["stackFrames"][0]
    scopes = debug("scopes", {"frameId": frame["id"]})["body"]["scopes"]
    ref = next(s["variablesReference"] for s in scopes if s["name"] == "Locals")
    names = {v["name"] for v in debug("variables", {"variablesReference": ref})["body"]["variables"]}
    assert (frame["line"], names) == (4, {"a", "b"})     # before c exists
    assert debug("continue", {"threadId": stopped["threadId"]})["success"]
    assert fresh_kernel.finish(msg_id).status == "ok"

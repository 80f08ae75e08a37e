"""A kernel's life: status starting once, shutdown with and without restart (the
process gone within 1 s of the reply), KernelManager.restart_kernel, and the
interrupt-then-shutdown that jupyter_client does on every shutdown."""
import time

import psutil
import pytest
import zmq
from jupyter_client import KernelManager

import support

GONE_WITHIN = 10.0   # s: a bound for a stuck kernel, not a speed


def wait_exit(process, timeout):
    """Wait for the Popen PROCESS to end; returns its exit code or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process.returncode
        time.sleep(0.01)
    return process.poll()


@pytest.mark.timeout(60)
def test_kernel_publishes_status_starting_once_at_startup():
    km = KernelManager(kernel_name=support.KERNEL_NAME)
    km.cache_ports = False  # keep the ports chosen below, so iopub is known before launch
    km.write_connection_file()
    conn = km.get_connection_info(session=False)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.RECONNECT_IVL, 5)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(support.endpoint(conn, "iopub"))
    km.start_kernel()
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=30)
        seen = []
        while sub.poll(500, zmq.POLLIN):
            seen.append(support.parse_any(sub.recv_multipart(), conn["key"]))
        states = [m["content"]["execution_state"] for m in seen if m["msg_type"] == "status"]
        assert states.count("starting") == 1, f"status messages seen from launch: {states}"
        assert states.index("starting") == 0
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        sub.close(0)
        ctx.term()


@pytest.mark.timeout(30)
def test_shutdown_request_ends_the_process_by_itself_after_the_reply(fresh_kernel):
    # Nothing signals the kernel here: it must leave on its own, with 0. How
    # fast is no pass/fail figure on a shared machine.
    k = fresh_kernel
    msg_id = k.send("shutdown_request", {"restart": False}, channel="control")
    reply = k.reply(msg_id, channel="control", timeout=10)
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["restart"] is False
    code = wait_exit(k.process, GONE_WITHIN)
    assert code is not None, f"kernel still running {GONE_WITHIN} s after shutdown_reply"
    assert code == 0, f"kernel exited with {code} after a clean shutdown"


@pytest.mark.timeout(30)
def test_shutdown_request_with_restart_echoes_restart_and_exits(fresh_kernel):
    k = fresh_kernel
    msg_id = k.send("shutdown_request", {"restart": True}, channel="control")
    reply = k.reply(msg_id, channel="control", timeout=10)
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["restart"] is True
    assert wait_exit(k.process, GONE_WITHIN) is not None


@pytest.mark.timeout(60)
def test_restart_kernel_gives_a_new_process_with_fresh_state(fresh_kernel):
    k = fresh_kernel
    k.execute("restart_marker = 41")
    old = k.process
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=30)
    assert old.poll() is not None, "the old kernel process is still running"
    assert k.pid != old.pid
    r = k.execute("'restart_marker' in dir()")
    assert r.status == "ok", r.describe()
    assert r.result == "False"
    assert k.execute("1 + 1").result == "2"


@pytest.mark.timeout(60)
def test_restart_kernel_resets_the_execution_count(fresh_kernel):
    k = fresh_kernel
    k.execute("1")
    k.execute("2")
    k.km.restart_kernel(now=False)
    k.kc.wait_for_ready(timeout=30)
    assert k.execute("3").content["execution_count"] == 1


def assert_left_by_itself(popen):
    """The kernel's process exited on its own, with 0: jupyter_client
    SIGTERMs a kernel still there after half of shutdown_wait_time (2.5 s),
    and SIGKILLs it after the rest; either shows here as a negative code."""
    assert popen.returncode is not None, "the kernel's process was not reaped"
    assert popen.returncode == 0, (
        f"the kernel's process ended with {popen.returncode}: "
        + ("it had to be killed" if popen.returncode < 0 else "it failed"))


@pytest.mark.timeout(60)
def test_interrupt_then_shutdown_of_a_running_cell_leaves_no_process(fresh_kernel):
    k = fresh_kernel
    proc = psutil.Process(k.pid)
    family = [proc] + proc.children(recursive=True)
    msg_id = k.start_execute("import time\ntime.sleep(100)")
    k.wait_running(msg_id)
    popen = k.km.provisioner.process
    k.km.shutdown_kernel(now=False)  # interrupt_request, shutdown_request, then wait
    alive = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes left after shutdown: {alive}"
    assert_left_by_itself(popen)


@pytest.mark.timeout(60)
def test_shutdown_kernel_of_an_idle_kernel_is_quick_and_clean(fresh_kernel):
    k = fresh_kernel
    proc = psutil.Process(k.pid)
    family = [proc] + proc.children(recursive=True)
    popen = k.km.provisioner.process
    k.km.shutdown_kernel(now=False)
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert_left_by_itself(popen)

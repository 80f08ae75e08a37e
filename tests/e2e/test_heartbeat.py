"""The heartbeat echoes while a cell computes with the GIL held, so a frontend does not
declare a busy kernel dead."""

import pytest
import zmq


def ping(sock, payload, timeout):
    sock.send(payload)
    if not sock.poll(int(timeout * 1000), zmq.POLLIN):
        return None
    return sock.recv()


@pytest.mark.timeout(30)
def test_heartbeat_echoes_when_idle(kernel, heartbeat):
    assert ping(heartbeat, b"ping-idle", 1.0) == b"ping-idle"


@pytest.mark.timeout(60)
def test_heartbeat_echoes_while_a_cell_holds_the_gil(kernel, heartbeat):
    # sum(range(N)) runs entirely in C without releasing the GIL; size it to ~3 s here.
    calib = kernel.execute(
        "import time\nt = time.perf_counter()\nsum(range(10**7))\ntime.perf_counter() - t")
    per_1e7 = float(calib.result)
    n = int(3.0 / per_1e7 * 10**7)
    msg_id = kernel.start_execute(f"sum(range({n}))")
    kernel.wait_running(msg_id, settle=0.5)
    echo = ping(heartbeat, b"ping-busy", 1.0)
    still_running = not kernel.replied(msg_id)
    r = kernel.finish(msg_id, timeout=30)
    assert r.status == "ok"
    assert still_running, "the cell ended before the ping; the test proved nothing"
    assert echo == b"ping-busy", "no heartbeat echo within 1 s (cell busy for ~3 s)"


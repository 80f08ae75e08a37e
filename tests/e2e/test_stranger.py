"""Issue 11, findings 3, 5 and 6: what a stranger on the same machine can do to a
kernel without its key, and connection files the spec allows.

- Finding 3: a raw subscriber on IOPub that never reads must not hold back what
  a real frontend receives (test_stuck_subscriber_*).
- Finding 5: the soft descriptor limit is raised to the hard one at start; 1,100
  half-open TCP connections neither make the kernel spin nor stop cells and
  `%%distributed` from running; a run that cannot have its descriptors is
  refused up front with the numbers.
- Finding 6: hmac-sha512, a missing scheme (hmac-sha256) and an empty key work
  end to end with jupyter_client; `ip` "localhost" and "::1" bind.

The kernels of finding 6 are started here by hand (`distkernel -f FILE`), since
jupyter_client always writes "signature_scheme" and a numeric ip. Where a test
is about one user against another, the stranger runs as `dkattacker` against
`dkvictim`'s kernel (tests/e2e/users.py; skipped unless root).

Figures (delays, CPU time) go to stranger.json in DISTKERNEL_FIGURES_DIR when set;
timings are asserted only generously (a noisy 2-core machine).
"""
import json
import os
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import psutil
import pytest
import zmq
from jupyter_client import BlockingKernelClient

import support
import users

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="these are distkernel's fixes")

FIGURES = {}


def record(name, value):
    FIGURES[name] = value
    out = os.environ.get("DISTKERNEL_FIGURES_DIR")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / "stranger.json").write_text(json.dumps(FIGURES, indent=2))


def free_ports(n, family=socket.AF_INET, host="127.0.0.1"):
    socks = []
    for _ in range(n):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind((host, 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class HandKernel:
    """`distkernel -f FILE` started here, with a BlockingKernelClient on it."""

    def __init__(self, conn, drop=(), client_ipv6=False, preexec_fn=None, client_scheme=None):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="dk-stranger-"))
        self.conn = dict(conn)
        written = {k: v for k, v in self.conn.items() if k not in drop}
        self.path = self.dir / "kernel.json"
        self.path.write_text(json.dumps(written))
        self.log_path = self.dir / "kernel.log"
        self.log = open(self.log_path, "wb")
        binary = json.loads((support.KERNELSPEC_DIR / "kernel.json").read_text())["argv"][0]
        self.proc = subprocess.Popen([binary, "-f", str(self.path)], stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        import zmq.asyncio
        self.ctx = zmq.asyncio.Context()
        if client_ipv6:
            self.ctx.setsockopt(zmq.IPV6, 1)
        self.kc = BlockingKernelClient(context=self.ctx)
        info = dict(self.conn)
        if client_scheme is not None:
            info["signature_scheme"] = client_scheme
        self.kc.load_connection_info(info)
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=30)
        except Exception:
            self.stop()
            raise

    def execute(self, code, timeout=60):
        out = []
        reply = self.kc.execute_interactive(
            code, timeout=timeout,
            output_hook=lambda m: out.append(m["content"].get("text", ""))
            if m["msg_type"] == "stream" else None)
        return reply["content"], "".join(out)

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        try:
            self.kc.shutdown()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.kc.stop_channels()
        self.ctx.destroy(linger=0)
        self.log.close()


def conn_info(ip="127.0.0.1", key=None, scheme="hmac-sha256", family=socket.AF_INET,
              bind_host="127.0.0.1"):
    shell, iopub, stdin, control, hb = free_ports(5, family, bind_host)
    return {"shell_port": shell, "iopub_port": iopub, "stdin_port": stdin,
            "control_port": control, "hb_port": hb, "ip": ip,
            "key": str(uuid.uuid4()) if key is None else key, "transport": "tcp",
            "signature_scheme": scheme, "kernel_name": "distkernel"}


# ---------------------------------------------------------------------------
# Finding 6: connection files the spec allows


def test_hmac_sha512_works_end_to_end():
    k = HandKernel(conn_info(scheme="hmac-sha512"))
    try:
        content, out = k.execute("print(6 * 7)")
        assert content["status"] == "ok"
        assert out == "42\n"
        # The kernel's own replies verify with SHA-512 (the client checks each one).
        assert k.kc.session.signature_scheme == "hmac-sha512"
    finally:
        k.stop()


def test_a_missing_scheme_means_hmac_sha256():
    k = HandKernel(conn_info(), drop=("signature_scheme",), client_scheme="hmac-sha256")
    try:
        content, out = k.execute("print('sha256 by default')")
        assert content["status"] == "ok" and out == "sha256 by default\n"
    finally:
        k.stop()


def test_an_empty_key_works_with_a_warning_in_the_log():
    k = HandKernel(conn_info(key=""))
    try:
        content, out = k.execute("print('unsigned')")
        assert content["status"] == "ok" and out == "unsigned\n"
        log = k.log_text()
        assert "key is empty" in log and "not signed" in log, log
    finally:
        k.stop()


def test_ip_localhost_binds_and_works():
    k = HandKernel(conn_info(ip="localhost"))
    try:
        content, out = k.execute("print('via localhost')")
        assert content["status"] == "ok" and out == "via localhost\n"
    finally:
        k.stop()


def _ipv6_loopback_available():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback_available(), reason="this machine has no ::1")
def test_ip_ipv6_loopback_binds_and_works():
    # jupyter_client connects to "tcp://::1:PORT"; its ZeroMQ sockets need IPv6 on.
    k = HandKernel(conn_info(ip="::1", family=socket.AF_INET6, bind_host="::1"),
                   client_ipv6=True)
    try:
        content, out = k.execute("print('via ::1')")
        assert content["status"] == "ok" and out == "via ::1\n"
        # Bound to ::1 and nothing else.
        laddrs = {c.laddr.ip for c in psutil.Process(k.proc.pid).connections("tcp")
                  if c.status == psutil.CONN_LISTEN}
        assert laddrs == {"::1"}, laddrs
    finally:
        k.stop()


def test_an_unbindable_ip_is_not_blamed_on_another_kernel():
    info = conn_info(ip="192.0.2.1")   # TEST-NET-1: not an address of this machine
    path = pathlib.Path(tempfile.mkdtemp(prefix="dk-stranger-")) / "kernel.json"
    path.write_text(json.dumps(info))
    binary = json.loads((support.KERNELSPEC_DIR / "kernel.json").read_text())["argv"][0]
    r = subprocess.run([binary, "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "another kernel" not in r.stderr, r.stderr
    assert "not an address of this machine" in r.stderr, r.stderr

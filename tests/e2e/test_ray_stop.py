"""A rank's `ray stop` runs once, wherever the kernel's signals land
(python/distkernel/_ray.py: RayCluster._stop_ray, _ray_stop, _Deferred,
_Watcher).

When a Ray driver fails, the kernel ends the other ranks with SIGINT just as
their wait for the driver ends, then SIGTERM and SIGKILL 2 s apart. An
interrupt can land in _ray_stop before it defers SIGINT and SIGTERM:
`ray stop` must still run (a rank that skips it leaves Ray's daemons on its
node), once, and the interrupt must still reach the rank after it. Signals
that come while `ray stop` runs wait for it. A rank killed before it could
run its own has its watcher run it. `ray` is a script that logs its calls.
"""
import os
import signal
import sys
import threading

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "python"))

from distkernel import _ray  # noqa: E402


@pytest.fixture
def ray_log(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    ray = tmp_path / "ray"
    ray.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    ray.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def started_cluster():
    """A rank's cluster after its `ray start`, without a store, a run or a
    watcher."""
    cluster = object.__new__(_ray.RayCluster)
    cluster._started = True
    cluster._ray_stopped = []
    cluster._watcher = None
    return cluster


def interrupt_at(monkeypatch, how):
    """KeyboardInterrupt from signal.signal: before SIGINT and SIGTERM are
    deferred ("hold", as if SIGINT landed first), or once they are acted on
    again ("let go", as if it had waited for `ray stop`)."""
    real = signal.signal
    fired = []

    def set_handler(sig, handler):
        deferring = getattr(handler, "__self__", None).__class__ is _ray._Deferred
        if how == "hold" and deferring and not fired:
            fired.append(sig)
            raise KeyboardInterrupt
        old = real(sig, handler)
        if how == "let go" and not deferring and sig == signal.SIGTERM and not fired:
            fired.append(sig)
            raise KeyboardInterrupt
        return old

    monkeypatch.setattr(_ray.signal, "signal", set_handler)
    return fired


@pytest.mark.parametrize("how", ["hold", "let go"])
def test_an_interrupt_anywhere_in_ray_stop_runs_it_once_and_still_reaches_the_rank(
        ray_log, monkeypatch, how):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    fired = interrupt_at(monkeypatch, how)
    cluster = started_cluster()
    with pytest.raises(KeyboardInterrupt):
        cluster._stop_ray()
    assert fired, "the interrupt was not injected"
    assert calls(ray_log) == ["stop"]
    # the rank's own handlers are back
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    cluster._stop_ray()     # once: a later stop (the end of the rank) runs nothing
    assert calls(ray_log) == ["stop"]


def test_without_an_interrupt_ray_stop_runs_once(ray_log):
    cluster = started_cluster()
    cluster._stop_ray()
    cluster._stop_ray()
    assert calls(ray_log) == ["stop"]


def test_a_rank_that_never_ran_ray_start_runs_no_ray_stop(ray_log):
    cluster = started_cluster()
    cluster._started = False
    cluster._stop_ray()
    assert calls(ray_log) == []


@pytest.fixture
def ray_signalling(tmp_path, monkeypatch):
    """`ray stop` that sends SIG to its parent, the rank, before it logs."""
    log = tmp_path / "calls"

    def make(sig):
        ray = tmp_path / "ray"
        # a moment between the signal and the log: a handler run at once
        # would see no call logged yet
        ray.write_text(f'#!/bin/sh\nkill -{sig} $PPID\nsleep 0.3\necho "$*" >> {log}\n')
        ray.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        return log
    return make


def test_an_interrupt_while_ray_stop_runs_waits_for_it_then_reaches_the_rank(ray_signalling):
    log = ray_signalling("INT")
    cluster = started_cluster()
    with pytest.raises(KeyboardInterrupt):
        cluster._stop_ray()
    assert calls(log) == ["stop"]
    cluster._stop_ray()
    assert calls(log) == ["stop"]


def test_a_sigterm_while_ray_stop_runs_waits_for_it(ray_signalling, monkeypatch):
    # The rank's SIGTERM disposition (here a recorder, not the default that
    # would end the test) takes effect once `ray stop` is done.
    # A rank has threads besides its main one (its back channel's, its
    # flusher's), which a signal to the process may reach: one here too.
    log = ray_signalling("TERM")
    seen = []
    old = signal.signal(signal.SIGTERM, lambda *_: seen.append(calls(log)))
    done = threading.Event()
    other = threading.Thread(target=done.wait, args=(60,))
    other.start()
    try:
        started_cluster()._stop_ray()
    finally:
        done.set()
        other.join()
        signal.signal(signal.SIGTERM, old)
    assert seen == [["stop"]], "SIGTERM was not held until `ray stop` had run"


def test_a_watcher_runs_ray_stop_for_a_rank_gone_before_its_own(ray_log):
    watcher = _ray._Watcher()
    assert calls(ray_log) == []
    os.close(watcher._write_end)    # what the rank's death does to the pipe
    watcher._proc.wait(timeout=30)
    assert calls(ray_log) == ["stop"]
    # in a session of its own: the signals to the rank's group miss it
    assert watcher._proc.pid != os.getpgrp()


def test_a_watcher_told_that_the_rank_stopped_runs_nothing(ray_log):
    watcher = _ray._Watcher()
    watcher.stopped()
    assert watcher._proc.returncode == 0
    assert calls(ray_log) == []


@pytest.fixture
def ray_failing_first(tmp_path, monkeypatch):
    """`ray` that fails its first call saying SAID, then works; logs each call."""
    log = tmp_path / "calls"

    def make(said):
        ray = tmp_path / "ray"
        ray.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                       f'[ "$(wc -l < {log})" -gt 1 ] && exit 0\n'
                       f'echo "{said}"\nexit 1\n')
        ray.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        return log
    return make


def test_a_ray_start_that_missed_rays_start_up_deadline_is_tried_again(ray_failing_first,
                                                                       capsys):
    # What Ray 2.60 says when a node's agents did not come up within its fixed
    # 15 s (4 raylets starting at once on 2 busy CPUs did).
    log = ray_failing_first("Exception: The current node timed out during startup. This "
                            "could happen because some of the raylet failed to startup")
    ports = iter(["6001", "6002"])
    argv = _ray._run_ray(lambda: ["start", "--head", f"--port={next(ports)}"], tries=3)
    assert calls(log) == ["start --head --port=6001", "start --head --port=6002"]
    assert argv == ["start", "--head", "--port=6002"]
    assert "trying again (2 of 3)" in capsys.readouterr().err


def test_a_ray_start_that_failed_otherwise_fails_at_once_with_its_output(ray_failing_first,
                                                                         capsys):
    log = ray_failing_first("ConnectionError: could not reach the GCS")
    with pytest.raises(RuntimeError, match=r"failed with exit code 1 .*\(try 1 of 3\)"):
        _ray._run_ray(["start", "--address=10.0.0.1:6379"], tries=3)
    assert calls(log) == ["start --address=10.0.0.1:6379"]
    assert "could not reach the GCS" in capsys.readouterr().out
